/* fork(): a child process may use unimem only through a manager it makes
 * itself (docs/design.md, "fork()"). The parent's managers are copied into the child without
 * their threads (workers, trim timer, drivers' callback threads), with
 * whatever locks other threads held at the moment of the fork, and with
 * operations in flight that nothing in the child will ever finish: any
 * call on them could hang. So every process carries a generation, moved in
 * each child first of all by the one pthread_atfork handler (core/
 * thread.c, which then runs the other layers' shares); a manager remembers
 * the one it was made under, and its entry points answer UM_ESTATE in any
 * other process instead of touching it. The vendor drivers (OpenCL, CUDA)
 * are not fork-safe either: a backend loaded before the fork declines to
 * open in the child (its open()). */
#include "base.h"

atomic_uint um__fork_generation;

void um__fork_child_note(void) { um__atomic_add_relaxed(&um__fork_generation, 1u); }

unsigned um__process_generation(void) {
  return (unsigned)um__atomic_load_relaxed(&um__fork_generation);
}
