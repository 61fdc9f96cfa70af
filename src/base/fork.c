/* fork(): a child process may use unimem only through a manager it makes
 * itself (docs/design.md, "fork()"). The parent's managers are copied into the child without
 * their threads (workers, trim timer, drivers' callback threads), with
 * whatever locks other threads held at the moment of the fork, and with
 * operations in flight that nothing in the child will ever finish: any
 * call on them could hang. So every process carries a generation, moved in
 * each child by the pthread_atfork handler; a manager remembers the one it
 * was made under, and its entry points answer UM_ESTATE in any other
 * process instead of touching it.
 *
 * Process-wide state of other layers has handlers of its own (the thread
 * caches', tcache.c), registered after these, so that in a child they run
 * after the generation moved. The vendor drivers (OpenCL, CUDA) are not fork-safe either: a backend loaded
 * before the fork declines to open in the child (its open()). */
#include <pthread.h>

#include "base.h"

atomic_uint um__fork_generation;

static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

static void after_fork_child(void) { um__atomic_add_relaxed(&um__fork_generation, 1u); }

static void install_handlers(void) {
  /* Fails only without memory for the handler list; the manager still
   * works, and a child then risks what this file guards against. */
  if (pthread_atfork(NULL, NULL, after_fork_child) != 0)
    um__log(NULL, UM_LOG_WARN, "pthread_atfork failed: a child process of fork() must not use unimem");
}

void um__fork_init(void) { pthread_once(&fork_once, install_handlers); }

unsigned um__process_generation(void) {
  return (unsigned)um__atomic_load_relaxed(&um__fork_generation);
}
