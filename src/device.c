/* Devices: lookup, description, memory figures, synchronisation. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

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

/* The unfinished last operations of the manager's buffers, each with a
 * reference, into *ops (*n of them, a heap array); UM_ESTATE when one of
 * d's buffers waits for an open bracket (nothing is collected then). The
 * registry only grows at its head, so its links are read without its
 * lock once the head is. */
static int collect_pending(um_device *d, um_event ***ops, size_t *n) {
  um_manager *m = d->m;
  um_buffer *head;
  size_t cap = 0;
  int st = UM_OK;
  *ops = NULL;
  *n = 0;
  pthread_mutex_lock(&m->registry_lock);
  head = m->all_buffers;
  pthread_mutex_unlock(&m->registry_lock);
  for (um_buffer *b = head; b != NULL && st == UM_OK; b = b->all_next) {
    um_event *last;
    pthread_mutex_lock(&b->lock);
    last = b->last;
    if (b->dev == d && um__buffer_waits_bracket_locked(b, false))
      st = um__op_bracket_error(b);
    else if (last == NULL || atomic_load_explicit(&last->state, memory_order_acquire) == UM__EV_DONE ||
             um__op_waits_bracket(last))
      last = NULL; /* done, or another device's and waiting for a bracket: not waited for */
    else if (*n == cap && (cap = cap ? 2 * cap : 64, *ops = realloc(*ops, cap * sizeof(**ops))) == NULL)
      st = um__set_error(UM_ENOMEM, "um_device_synchronize: out of memory");
    else
      um__event_ref(last), (*ops)[(*n)++] = last;
    pthread_mutex_unlock(&b->lock);
  }
  return st;
}

/* While a bracket is open the engine never drains (the bracket is in
 * flight until um_access_end): wait for what was issued on every buffer
 * instead, but for the operations that wait for an open bracket. */
static int synchronize_around_brackets(um_device *d) {
  um_event **ops;
  size_t n;
  int st = collect_pending(d, &ops, &n);
  for (size_t i = 0; i < n; i++) {
    if (st == UM_OK)
      (void)um__event_wait_internal(ops[i]);
    um__event_unref(ops[i]);
  }
  free(ops);
  return st;
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
  if ((um__atomic_load_relaxed(&m->brackets_open) != 0 || !um__engine_drain_unless_bracket(m)) &&
      (st = synchronize_around_brackets(d)) != UM_OK)
    return st;
  st = d->be->synchronize(d->bdev);
  return st;
}
