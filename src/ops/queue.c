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
  void *native;    /* the queue, retained by the backend while d lives */
  int q;           /* its backend's queue index (queue_adopt) */
  bool on;         /* false: turned off (um_queue_use NULL), kept for reuse */
} thread_queue;

static _Thread_local thread_queue current[THREAD_QUEUES];
static _Thread_local int ncurrent;

bool um__op_queued_before(um_event *dep, const um_event *op) { return queued_before(dep, op); }

static thread_queue *entry_of(const um_device *d) {
  for (int i = 0; i < ncurrent; i++)
    if (current[i].serial == d->serial)
      return &current[i];
  return NULL;
}

int um__queue_current(const um_device *d) {
  const thread_queue *t = entry_of(d);
  return t != NULL && t->on ? t->q : -1;
}

/* Room for another device: a new entry, else one turned off (its device's
 * next um_queue_use asks the backend again). NULL when all 8 are on. */
static thread_queue *free_entry(void) {
  if (ncurrent < THREAD_QUEUES)
    return &current[ncurrent];
  for (int i = 0; i < ncurrent; i++)
    if (!current[i].on)
      return &current[i];
  return NULL;
}

/* An entry turned off keeps its queue: turning the same queue on again
 * asks the backend nothing (a loop may switch it on and off each round). */
int um_queue_use(um_device *d, void *native_queue) {
  thread_queue *t;
  int q, st;
  if (!um__device_ok(d))
    return um__set_error(UM_EINVAL, "um_queue_use: not a device");
  if (um__process_changed(d->m))
    return um__manager_check_process(d->m);
  t = entry_of(d);
  if (native_queue == NULL || (t != NULL && t->native == native_queue)) {
    if (t != NULL)
      t->on = native_queue != NULL;
    return UM_OK;
  }
  if (t == NULL && (t = free_entry()) == NULL)
    return um__set_error(UM_ENOMEM, "um_queue_use: a thread uses queues of the caller's on at most %d devices",
                         THREAD_QUEUES);
  if ((st = um__dev_queue_adopt(d, native_queue, &q)) != UM_OK)
    return st;
  if (t == &current[ncurrent])
    ncurrent++;
  *t = (thread_queue){.serial = d->serial, .native = native_queue, .q = q, .on = true};
  return UM_OK;
}

/* A manager's destroy on this thread: its devices' entries go (other
 * threads' entries of them stay until they set another device's queue on
 * a full table: free_entry takes only entries turned off). */
static void queues_forget(um_manager *m) {
  int n = um__ndevices(m);
  for (int i = 0; i < ncurrent; i++)
    for (int k = 0; k < n; k++)
      if (current[i].serial == m->devices[k]->serial)
        current[i] = (thread_queue){.serial = 0, .native = NULL, .q = -1, .on = false};
}

__attribute__((constructor)) static void register_upcalls(void) { um__upcall.ops.queues_forget = queues_forget; }
