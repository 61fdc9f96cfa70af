/* Devices: lookup, description, memory figures, synchronisation. */
#include <string.h>

#include "internal.h"

int um_device_count(const um_manager *m) {
  if (m == NULL)
    return um__set_error(UM_EINVAL, "um_device_count: NULL manager");
  return um__ndevices(m);
}

um_device *um_device_get(um_manager *m, int index) {
  if (m == NULL || index < 0 || index >= um__ndevices(m))
    return NULL;
  return m->devices[index];
}

int um_device_info_get(const um_device *d, um_device_info *out) {
  if (!um__device_ok(d) || out == NULL)
    return um__set_error(UM_EINVAL, "um_device_info_get: NULL argument or not a device");
  *out = d->info;
  return UM_OK;
}

int um_device_memory(um_device *d, uint64_t *free_bytes, uint64_t *total_bytes) {
  uint64_t f = 0, t = 0;
  int st;
  if (!um__device_ok(d) || (free_bytes == NULL && total_bytes == NULL))
    return um__set_error(UM_EINVAL, "um_device_memory: NULL argument or not a device");
  UM__CHECK_PROCESS(d->m);
  st = d->be->memory(d->bdev, &f, &t);
  if (st != UM_OK)
    return st;
  if (free_bytes)
    *free_bytes = f;
  if (total_bytes)
    *total_bytes = t;
  return UM_OK;
}

int um_device_synchronize(um_device *d) {
  um_manager *m;
  int st;
  if (!um__device_ok(d))
    return um__set_error(UM_EINVAL, "um_device_synchronize: not a device");
  m = d->m;
  UM__CHECK_PROCESS(m);
  /* Operations of every device are tracked together; waiting for all of
   * them is what a caller of synchronize wants from a memory manager
   * (copies between devices involve both). */
  um__engine_drain(m);
  st = d->be->synchronize(d->bdev);
  return st;
}
