/* Devices: lookup, description, memory figures; the check that a manager
 * belongs to this process. */
#include <stdlib.h>
#include <string.h>

#include "device.h"

int um__manager_check_process(const um_manager *m) {
  if (m->fork_gen != um__process_generation())
    return um__set_error(UM_ESTATE,
                         "manager %p was made in another process (before fork()): a child process "
                         "must make its own manager",
                         (const void *)m);
  return UM_OK;
}


int um_device_count(const um_manager *m) {
  if (!um__manager_ok(m))
    return um__set_error(UM_EINVAL, "um_device_count: NULL or not a manager");
  return um__ndevices(m);
}

um_device *um_device_get(um_manager *m, int index) {
  if (!um__manager_ok(m) || index < 0 || index >= um__ndevices(m))
    return NULL;
  return m->devices[index];
}

int um_device_info_get(const um_device *d, um_device_info *out) {
  if (!um__device_ok(d) || out == NULL)
    return um__set_error(UM_EINVAL, "um_device_info_get: NULL argument or not a device");
  *out = d->info;
  return UM_OK;
}

bool um__device_limited(const um_device *d) {
#ifdef UNIMEM_HAVE_OPENCL
  if (d->be == &um__backend_opencl)
    return true;
#endif
#ifdef UNIMEM_HAVE_CUDA
  if (d->be == &um__backend_cuda)
    return true;
#endif
  (void)d;
  return false;
}

uint64_t um__device_limit_bytes(const um_device *d) {
  uint64_t limit = d->m->opts.device_limit_bytes, total = d->info.total_bytes;
  if (d->be->commits_lazily && total != 0 && (limit == 0 || total < limit))
    limit = total;
  return limit;
}

/* The figures under device_limit_bytes, with what this process holds
 * (block.c's count) taken off where the backend cannot see it (OpenCL has
 * no free-memory query). */
static void limit_figures(const um_device *d, uint64_t *f, uint64_t *t) {
  uint64_t limit = um__device_limit_bytes(d);
  uint64_t held = um__atomic_load_relaxed(&d->limited_bytes);
  if (!um__device_limited(d))
    return;
  if (limit != 0 && *t > limit)
    *t = limit;
  if (*f > *t - (held < *t ? held : *t))
    *f = *t - (held < *t ? held : *t);
}

int um_device_memory(um_device *d, uint64_t *free_bytes, uint64_t *total_bytes) {
  uint64_t f = 0, t = 0;
  int st;
  if (!um__device_ok(d) || (free_bytes == NULL && total_bytes == NULL))
    return um__set_error(UM_EINVAL, "um_device_memory: NULL argument or not a device");
  if (um__process_changed(d->m))
    return um__manager_check_process(d->m);
  st = um__dev_memory(d, &f, &t);
  if (st != UM_OK)
    return st;
  limit_figures(d, &f, &t);
  if (free_bytes)
    *free_bytes = f;
  if (total_bytes)
    *total_bytes = t;
  return UM_OK;
}
