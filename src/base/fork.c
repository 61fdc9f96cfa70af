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
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "base.h"

atomic_uint um__fork_generation;

void um__fork_child_note(void) { um__atomic_add_relaxed(&um__fork_generation, 1u); }

unsigned um__process_generation(void) {
  return (unsigned)um__atomic_load_relaxed(&um__fork_generation);
}

/* UCX's memory hooks (libucm) replace mmap, munmap and madvise in every
 * library of a process that has loaded UCX, and their handlers take UCX's
 * registration-cache lock. A parent's net thread may hold that lock at the
 * moment of a fork: in the child, which has only the forking thread, the
 * first unmap then waits forever (a segment reserved for a new manager's
 * pool unmaps its alignment edges at once). A child has no net of its own
 * (um_net_create answers UM_ENOTSUP there), hence no registration cache
 * that the kernel's calls would leave stale. */
static bool in_fork_child(void) { return um__process_generation() != 0; }

void *um__os_mmap(void *addr, size_t len, int prot, int flags, int fd, long off) {
  if (in_fork_child())
    return (void *)syscall(SYS_mmap, addr, len, prot, flags, fd, off);
  return mmap(addr, len, prot, flags, fd, (off_t)off);
}

int um__os_munmap(void *addr, size_t len) {
  if (in_fork_child())
    return (int)syscall(SYS_munmap, addr, len);
  return munmap(addr, len);
}

int um__os_madvise(void *addr, size_t len, int advice) {
  if (in_fork_child())
    return (int)syscall(SYS_madvise, addr, len, advice);
  return madvise(addr, len, advice);
}
