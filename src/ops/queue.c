/* Queues of the caller's: um_queue_use makes a queue of the caller's the
 * one that this thread's copies, fills and brackets of a device's buffers
 * go to (stream-ordered work, as a CUDA stream orders the caller's own).
 * An upload, the caller's kernel and a download issued on that queue need
 * no event between them: the queue runs them in order, and an operation's
 * dependency that is queued there already is left out of its wait list
 * (queued_before). Operations on other queues, and on host threads, still
 * follow a buffer's earlier operations through tokens and registration, as
 * on unimem's own queues.
 *
 * Each thread keeps a few entries (device serial, queue index): planning
 * an operation looks its device up there (um__queue_current), one load of
 * the count when the thread uses none.
 */
#include "op_internal.h"

#define THREAD_QUEUES 8

typedef struct thread_queue {
  uint64_t serial; /* the device's (um_device.serial) */
  int q;           /* its backend's queue index (queue_adopt) */
} thread_queue;

static _Thread_local thread_queue current[THREAD_QUEUES];
static _Thread_local int ncurrent;

int um__queue_current(const um_device *d) {
  for (int i = 0; i < ncurrent; i++)
    if (current[i].serial == d->serial)
      return current[i].q;
  return -1;
}

bool um__op_queued_before(um_event *dep, const um_event *op) { return queued_before(dep, op); }

static void forget(const um_device *d) {
  for (int i = 0; i < ncurrent; i++)
    if (current[i].serial == d->serial) {
      current[i] = current[--ncurrent];
      return;
    }
}

int um_queue_use(um_device *d, void *native_queue) {
  int q, st;
  if (!um__device_ok(d))
    return um__set_error(UM_EINVAL, "um_queue_use: not a device");
  if (um__process_changed(d->m))
    return um__manager_check_process(d->m);
  if (native_queue == NULL) {
    forget(d);
    return UM_OK;
  }
  if ((st = um__dev_queue_adopt(d, native_queue, &q)) != UM_OK)
    return st;
  forget(d);
  if (ncurrent == THREAD_QUEUES)
    return um__set_error(UM_ENOMEM, "um_queue_use: a thread uses queues of the caller's on at most %d devices",
                         THREAD_QUEUES);
  current[ncurrent++] = (thread_queue){.serial = d->serial, .q = q};
  return UM_OK;
}
