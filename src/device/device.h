/* device/: the device object, its statistics counters, peers, and the
 * check that a manager belongs to this process. */
#ifndef UNIMEM_DEVICE_H
#define UNIMEM_DEVICE_H

#ifndef UM__SEES_DEVICE
#error "device.h: this folder may not include device/ (src/README.md)"
#endif

#include "types.h"

#define UM__STAT_ADD(dev, field, v) um__atomic_add_relaxed(&(dev)->stats.field, (uint64_t)(v))
#define UM__STAT_SUB(dev, field, v) um__atomic_sub_relaxed(&(dev)->stats.field, (uint64_t)(v))

/* device.c: UM_ESTATE, with the reason, for a manager made in another
 * process (before fork()); um__process_changed is its one load and
 * compare, on every entry point. */
int um__manager_check_process(const um_manager *m);
/* Whether the device's DEVICE and UNIFIED bytes count against
 * device_limit_bytes (an OpenCL or CUDA device: block.c counts them in
 * limited_bytes). */
bool um__device_limited(const um_device *d);
static inline bool um__process_changed(const um_manager *m) {
  return __builtin_expect(m->fork_gen != um__atomic_load_relaxed(&um__fork_generation), 0);
}

#endif /* UNIMEM_DEVICE_H */
