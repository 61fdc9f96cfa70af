/* Files as HOST buffers: mmap, zero-copy, with no int-sized limits. */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core.h"

int um_map_file(um_manager *m, const char *path, um_map_mode mode, um_buffer **out) {
  int fd, flags, prot, st;
  struct stat sb;
  void *p;
  um_buffer *b;
  um_device *d;
  if (!um__manager_ok(m) || path == NULL || out == NULL)
    return um__set_error(UM_EINVAL, "um_map_file: NULL argument or not a manager");
  if ((unsigned)mode > UM_MAP_WRITE_DISCARD)
    return um__set_error(UM_EINVAL, "um_map_file: unknown mode %d", (int)mode);
  if (um__process_changed(m))
    return um__manager_check_process(m);
  flags = mode == UM_MAP_READ ? O_RDONLY : O_RDWR;
  prot = mode == UM_MAP_READ ? PROT_READ : PROT_READ | PROT_WRITE;
  /* Only a regular file can be mapped. Checked before opening, since
   * opening a FIFO with no writer blocks and opening a device node can
   * have effects; and again on the descriptor (fstat below), since the path
   * may change in between: O_NONBLOCK keeps that open from blocking, and
   * O_NOCTTY from taking a terminal. */
  if (stat(path, &sb) == 0 && !S_ISREG(sb.st_mode))
    return um__set_error(UM_EINVAL, "um_map_file: %s is not a regular file", path);
  fd = open(path, flags | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0)
    return um__set_error(UM_ENODEV, "um_map_file: cannot open %s: %s", path, strerror(errno));
  if (fstat(fd, &sb) != 0) {
    st = um__set_error(UM_ENODEV, "um_map_file: cannot stat %s: %s", path, strerror(errno));
    goto fail_fd;
  }
  if (!S_ISREG(sb.st_mode) || sb.st_size == 0) {
    st = um__set_error(UM_EINVAL, "um_map_file: %s is empty or not a regular file", path);
    goto fail_fd;
  }
  if ((uint64_t)sb.st_size > SIZE_MAX) {
    st = um__set_error(UM_EOVERFLOW, "um_map_file: %s is larger than the address space", path);
    goto fail_fd;
  }
  p = um__os_mmap(NULL, (size_t)sb.st_size, prot, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    st = um__set_error(errno == ENOMEM ? UM_ENOMEM : UM_EINVAL, "um_map_file: mmap of %s: %s", path,
                       strerror(errno));
    goto fail_fd;
  }
  close(fd); /* the mapping keeps the file open */
  b = um__descriptor_get(m);
  if (b == NULL) {
    um__os_munmap(p, (size_t)sb.st_size);
    return um__set_error(UM_ENOMEM, "um_map_file: out of memory for a descriptor");
  }
  d = m->devices[0];
  b->dev = d;
  b->loc = UM_HOST;
  b->kind = UM__KIND_FILE;
  b->capacity = (size_t)sb.st_size;
  b->cls = -1;
  b->slot = UM__NO_SLOT;
  b->mem.host = p;
  b->mem.handle = (uintptr_t)p;
  b->mem.priv = NULL;
  um__buffer_init_live(b, (size_t)sb.st_size, NULL, 0);
  b->readonly = mode == UM_MAP_READ;
  UM__STAT_ADD(d, allocations, 1);
  um__stat_in_use_add(d, b->size);
  atomic_store_explicit(&b->state, UM__BUF_LIVE, memory_order_release);
  *out = b;
  return UM_OK;

fail_fd:
  close(fd);
  return st;
}
