/* um_device_synchronize: a device's queues, after every operation the
 * manager tracks (ops of all devices together). */
#include <stdlib.h>

#include "ops.h"

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
    int state;
    pthread_mutex_lock(&b->lock);
    /* A descriptor idle in the pool, or without memory, has nothing in
     * flight, and a new owner may be resetting it without the lock: its
     * fields are read only once it is live (a release store) or released. */
    state = atomic_load_explicit(&b->state, memory_order_acquire);
    if (state != UM__BUF_LIVE && state != UM__BUF_RELEASED) {
      pthread_mutex_unlock(&b->lock);
      continue;
    }
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
  if (um__process_changed(m))
    return um__manager_check_process(m);
  /* Operations of every device are tracked together; waiting for all of
   * them is what a caller of synchronize wants from a memory manager
   * (copies between devices involve both). */
  if ((um__atomic_load_relaxed(&m->brackets_open) != 0 || !um__engine_drain_unless_bracket(m)) &&
      (st = synchronize_around_brackets(d)) != UM_OK)
    return st;
  st = um__dev_synchronize(d);
  return st;
}
