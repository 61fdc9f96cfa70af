/* Operations and events: ordering, execution, completion.
 *
 * An operation (um_event) is ordered after the earlier operations on the
 * buffers it touches. Each buffer keeps a reference to its last operation;
 * a new one depends on the last of its destination and of its source.
 * A dependency is satisfied in one of three ways:
 *  - it already finished;
 *  - both run natively on the same device: the device's queue orders them
 *    (the earlier one's token goes into the later one's wait list), so the
 *    issuing thread never blocks;
 *  - otherwise the new operation registers with the earlier one and is
 *    started by a worker thread when the earlier one completes.
 * Workers (max_concurrent_transfers of them) run what cannot run natively
 * and process native completions, because a driver's callback thread may
 * not call back into the driver.
 *
 * References on an operation: one held by the engine until it completes,
 * one by each buffer whose last operation it is, one by the caller when an
 * event was asked for.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"
#include "net.h"

enum { TASK_START = 1, TASK_COMPLETE = 2 };

uint64_t um__now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ------------------------------------------------------------------------ */
/* Event objects */

um_event *um__event_new(um_manager *m, um__op_kind kind) {
  um_event *e = calloc(1, sizeof(*e));
  if (e == NULL)
    return NULL;
  e->magic = UM__EVENT_MAGIC;
  atomic_init(&e->refs, 1);
  atomic_init(&e->state, UM__EV_QUEUED);
  atomic_init(&e->deps_pending, 0);
  atomic_init(&e->group_first_error, UM_OK);
  pthread_mutex_init(&e->lock, NULL);
  pthread_cond_init(&e->cond, NULL);
  e->m = m;
  e->kind = kind;
  return e;
}

void um__event_ref(um_event *e) { um__atomic_add_relaxed(&e->refs, 1); }

void um__event_unref(um_event *e) {
  if (um__atomic_sub_acq_rel(&e->refs, 1) != 1)
    return;
  if (e->net != NULL)
    um__net_op_free(e->net);
  pthread_mutex_destroy(&e->lock);
  pthread_cond_destroy(&e->cond);
  e->magic = 0;
  free(e);
}

/* ------------------------------------------------------------------------ */
/* Worker threads */

static void engine_push(um_manager *m, um_event *op, int task) {
  um__engine *en = &m->engine;
  pthread_mutex_lock(&en->lock);
  op->task = task;
  op->queue_next = NULL;
  if (task == TASK_COMPLETE) {
    /* Completions first: they unblock waiters and free blocks. */
    op->queue_next = en->head;
    en->head = op;
    if (en->tail == NULL)
      en->tail = op;
  } else {
    if (en->tail)
      en->tail->queue_next = op;
    else
      en->head = op;
    en->tail = op;
  }
  pthread_cond_signal(&en->cond);
  pthread_mutex_unlock(&en->lock);
}

static void run_started(um_event *op);

static void worker_start(um_event *op) {
  um__engine *en = &op->m->engine;
  bool canceled;
  int running, seen;
  pthread_mutex_lock(&op->lock);
  canceled = op->canceled;
  if (!canceled)
    atomic_store_explicit(&op->state, UM__EV_RUNNING, memory_order_release);
  pthread_mutex_unlock(&op->lock);
  if (canceled) {
    um__op_complete(op, UM_ECANCELED);
    return;
  }
  running = um__atomic_add_relaxed(&en->running, 1) + 1;
  seen = um__atomic_load_relaxed(&en->running_max);
  while (seen < running && !atomic_compare_exchange_weak_explicit(&en->running_max, &seen, running,
                                                                  memory_order_relaxed,
                                                                  memory_order_relaxed)) {
  }
  if (en->on_run != NULL)
    en->on_run(op->m, running);
  run_started(op);
  um__atomic_sub_relaxed(&en->running, 1);
}

static void *worker_main(void *arg) {
  um_manager *m = arg;
  um__engine *en = &m->engine;
  pthread_mutex_lock(&en->lock);
  for (;;) {
    um_event *op;
    while (en->head == NULL && !en->stopping)
      pthread_cond_wait(&en->cond, &en->lock);
    if (en->head == NULL)
      break; /* stopping and nothing left */
    op = en->head;
    en->head = op->queue_next;
    if (en->head == NULL)
      en->tail = NULL;
    pthread_mutex_unlock(&en->lock);
    if (op->task == TASK_COMPLETE)
      um__op_complete(op, op->native_status);
    else
      worker_start(op);
    pthread_mutex_lock(&en->lock);
  }
  pthread_mutex_unlock(&en->lock);
  return NULL;
}

int um__engine_start(um_manager *m) {
  um__engine *en = &m->engine;
  int n = m->opts.max_concurrent_transfers;
  pthread_mutex_init(&en->lock, NULL);
  pthread_cond_init(&en->cond, NULL);
  pthread_cond_init(&en->drained, NULL);
  atomic_init(&en->inflight, 0);
  atomic_init(&en->running, 0);
  atomic_init(&en->running_max, 0);
  en->on_run = NULL;
  en->head = en->tail = NULL;
  en->stopping = false;
  en->threads = calloc((size_t)n, sizeof(pthread_t));
  if (en->threads == NULL)
    return um__set_error(UM_ENOMEM, "engine: out of memory");
  for (en->nthreads = 0; en->nthreads < n; en->nthreads++) {
    if (pthread_create(&en->threads[en->nthreads], NULL, worker_main, m) != 0) {
      um__engine_stop(m);
      return um__set_error(UM_ENOMEM, "engine: cannot start worker thread");
    }
  }
  return UM_OK;
}

/* Wait until every issued operation has completed. */
void um__engine_drain(um_manager *m) {
  um__engine *en = &m->engine;
  pthread_mutex_lock(&en->lock);
  while (um__atomic_load_acquire(&en->inflight) != 0)
    pthread_cond_wait(&en->drained, &en->lock);
  pthread_mutex_unlock(&en->lock);
}

void um__engine_stop(um_manager *m) {
  um__engine *en = &m->engine;
  pthread_mutex_lock(&en->lock);
  en->stopping = true;
  pthread_cond_broadcast(&en->cond);
  pthread_mutex_unlock(&en->lock);
  for (int i = 0; i < en->nthreads; i++)
    pthread_join(en->threads[i], NULL);
  free(en->threads);
  en->threads = NULL;
  en->nthreads = 0;
  pthread_mutex_destroy(&en->lock);
  pthread_cond_destroy(&en->cond);
  pthread_cond_destroy(&en->drained);
}

static void inflight_done(um_manager *m) {
  um__engine *en = &m->engine;
  if (um__atomic_sub_acq_rel(&en->inflight, 1) == 1) {
    pthread_mutex_lock(&en->lock);
    pthread_cond_broadcast(&en->drained);
    pthread_mutex_unlock(&en->lock);
  }
}

/* ------------------------------------------------------------------------ */
/* Completion */

/* The operation this thread is starting natively (set around the
 * backend's xfer_async), so that native_done can tell a completion reported
 * inside that call: completing there would take op's lock under the locks
 * the issuer holds on earlier operations. */
static _Thread_local um_event *starting_native;

/* A native operation finished, on a driver thread (or inside xfer_async on
 * the issuing thread). Finishing it right here where the backend allows
 * saves a worker wake-up per operation: on PoCL, 1000 queued 4 KiB writes
 * cost 5.9 us each with the hand-off to a worker, 2.2 to 3.1 us without. */
static void native_done(void *arg, int status) {
  um_event *op = arg;
  op->native_status = status;
  if (!op->native_dev->be->callbacks_reenter)
    engine_push(op->m, op, TASK_COMPLETE);
  else if (starting_native == op)
    op->complete_deferred = true;
  else
    um__op_complete(op, status);
}

static void lock_buffers(um_buffer **bufs, int n);
static void unlock_buffers(um_buffer **bufs, int n);

void um__op_complete(um_event *op, int status) {
  um_buffer *bufs[2];
  int nbufs = 0;
  bool drop_last[2] = {false, false}, recycle[2] = {false, false};
  um_event *deps[UM__MAX_DEPENDENTS];
  int ndeps;
  void *native;
  um_device *ndev;
  um_event *group = op->group;

  if (status == UM_OK && op->kind != UM__OP_GROUP)
    um__op_account(op);
  /* The buffers' bookkeeping and the operation's state change together,
   * under the buffers' locks: a caller woken by a wait sees the buffer
   * idle (a release pools its block at once), and um_map, which waits for
   * the buffer to be idle, sees every earlier event done. */
  if (op->dst)
    bufs[nbufs++] = op->dst;
  if (op->src && op->src != op->dst)
    bufs[nbufs++] = op->src;
  lock_buffers(bufs, nbufs);
  for (int i = 0; i < nbufs; i++)
    um__buffer_op_finish_locked(bufs[i], op, &drop_last[i], &recycle[i]);

  pthread_mutex_lock(&op->lock);
  op->status = status;
  ndeps = op->ndependents;
  memcpy(deps, op->dependents, sizeof(deps));
  op->ndependents = 0;
  native = op->native;
  ndev = op->native_dev;
  op->native = NULL;
  atomic_store_explicit(&op->state, UM__EV_DONE, memory_order_release);
  pthread_mutex_unlock(&op->lock);
  unlock_buffers(bufs, nbufs);
  for (int i = 0; i < nbufs; i++) {
    if (drop_last[i])
      um__event_unref(op); /* not the last reference: the engine holds one */
    if (recycle[i])
      um__buffer_recycle(bufs[i]);
  }
  /* Waiters are woken after the unlock, so that they do not wake only to
   * block on the lock; the engine's reference keeps op alive meanwhile. An
   * issuer reads the token only under op's lock and only while the
   * operation is not done, so once the lock is dropped nobody else holds
   * it, and the driver call that releases it does not delay the waiters. */
  pthread_cond_broadcast(&op->cond);
  if (native != NULL && ndev->be->native_release)
    ndev->be->native_release(ndev->bdev, native);

  if (group != NULL) {
    if (status != UM_OK) {
      int expected = UM_OK;
      atomic_compare_exchange_strong(&group->group_first_error, &expected, status);
    }
    if (um__atomic_sub_acq_rel(&group->deps_pending, 1) == 1)
      um__op_complete(group, atomic_load(&group->group_first_error));
  }
  for (int i = 0; i < ndeps; i++)
    if (um__atomic_sub_acq_rel(&deps[i]->deps_pending, 1) == 1)
      engine_push(op->m, deps[i], TASK_START);

  inflight_done(op->m);
  um__event_unref(op); /* the engine's reference */
}

/* ------------------------------------------------------------------------ */
/* Starting */

/* Keep a started operation's token, or release it when the operation has
 * finished already. Until then op->native is NULL, which a later issuer
 * treats as "not started yet" and orders by registration instead. */
static void keep_native(um_event *op, void *native) {
  pthread_mutex_lock(&op->lock);
  if (atomic_load_explicit(&op->state, memory_order_acquire) == UM__EV_DONE) {
    if (op->native_dev->be->native_release)
      op->native_dev->be->native_release(op->native_dev->bdev, native);
  } else {
    op->native = native;
  }
  pthread_mutex_unlock(&op->lock);
}

/* Run an operation whose dependencies are all satisfied and whose state is
 * already RUNNING. */
static void run_started(um_event *op) {
  if (op->native_dev != NULL) {
    void *native = NULL;
    int st;
    /* The operation may complete (and lose the engine's reference, its
     * last one when the caller already released its event) before
     * xfer_async returns: hold it until the token is stored. */
    um__event_ref(op);
    starting_native = op;
    st = um__op_start_native(op, NULL, 0, native_done, &native);
    starting_native = NULL;
    if (st != UM_OK) {
      um__op_complete(op, st);
      um__event_unref(op);
      return;
    }
    keep_native(op, native);
    if (op->complete_deferred)
      um__op_complete(op, op->native_status);
    um__event_unref(op);
    return;
  }
  um__op_complete(op, um__op_run(op));
}

/* Start natively with the given earlier tokens in the wait list. The caller
 * holds the locks of the operations the tokens belong to (so that the
 * tokens stay valid), and stores *native with keep_native once it dropped
 * them: taking op's lock under theirs would order the two locks against
 * an issuer that finds op and one of them as dependencies and locks them
 * in address order (a lock-order inversion TSan reports). */
static int start_native_after(um_event *op, void *const *after, int nafter, void **native) {
  atomic_store_explicit(&op->state, UM__EV_RUNNING, memory_order_release);
  return um__op_start_native(op, after, nafter, native_done, native);
}


static int lock_order(const void *a, const void *b) {
  uintptr_t x = (uintptr_t) * (um_event *const *)a, y = (uintptr_t) * (um_event *const *)b;
  return x < y ? -1 : x > y;
}

int um__event_wait_internal(um_event *e) {
  int st;
  pthread_mutex_lock(&e->lock);
  while (atomic_load_explicit(&e->state, memory_order_acquire) != UM__EV_DONE)
    pthread_cond_wait(&e->cond, &e->lock);
  st = e->status;
  pthread_mutex_unlock(&e->lock);
  return st;
}

static void lock_buffers(um_buffer **bufs, int n) {
  if (n == 2 && (uintptr_t)bufs[1] < (uintptr_t)bufs[0]) {
    um_buffer *t = bufs[0];
    bufs[0] = bufs[1];
    bufs[1] = t;
  }
  for (int i = 0; i < n; i++)
    pthread_mutex_lock(&bufs[i]->lock);
}

static void unlock_buffers(um_buffer **bufs, int n) {
  for (int i = n - 1; i >= 0; i--)
    pthread_mutex_unlock(&bufs[i]->lock);
}

/* Takes over the caller's reference to op, issued or not. */
int um__op_issue(um_event *op, um_event **done) {
  um_manager *m = op->m;
  um_buffer *bufs[2];
  int nbufs = 0;
  um_event *deps[2];
  um_event *old_last[2] = {NULL, NULL};
  int ndeps = 0;
  bool all_native = true;
  int st = UM_OK; /* gcc -O2 cannot see that the native branch sets it */

  if (op->dst)
    bufs[nbufs++] = op->dst;
  if (op->src && op->src != op->dst)
    bufs[nbufs++] = op->src;
  op->blocking = done == NULL;

  lock_buffers(bufs, nbufs);
  for (int i = 0; i < nbufs; i++) {
    um_buffer *b = bufs[i];
    /* touched before the state check, both seq_cst, against um_release's
     * state CAS then touched load: a release that misses touched comes
     * after this check in the total order, so the check sees RELEASED. */
    atomic_store(&b->touched, true);
    if (atomic_load(&b->state) != UM__BUF_LIVE || b->mapped) {
      st = um__set_error(UM_ESTATE, b->mapped ? "buffer %p is mapped: unmap it first"
                                              : "buffer %p was released",
                         (void *)b);
      unlock_buffers(bufs, nbufs);
      um__event_unref(op); /* never published: the caller's only reference */
      return st;
    }
  }
  um__op_plan(op);
  for (int i = 0; i < nbufs; i++) {
    um_buffer *b = bufs[i];
    um_event *last = b->last;
    if (last != NULL &&
        atomic_load_explicit(&last->state, memory_order_acquire) != UM__EV_DONE &&
        (ndeps == 0 || deps[0] != last)) {
      um__event_ref(last);
      deps[ndeps++] = last;
      if (op->native_dev == NULL || last->native_dev != op->native_dev)
        all_native = false;
    }
    b->pending++;
  }
  /* A destination without a host view now has its current data on the
   * device only (its host shadow, if any, is stale). */
  if (op->dst != NULL && op->dst->mem.host == NULL)
    op->dst->valid = UM_VALID_DEVICE;

  if (op->blocking && ndeps == 0) {
    /* Fast path: nothing to wait for, nobody else can see the operation.
     * It is not published as the buffers' last operation, since it is
     * finished before this call returns. */
    unlock_buffers(bufs, nbufs);
    atomic_store_explicit(&op->state, UM__EV_RUNNING, memory_order_relaxed);
    um__atomic_add_relaxed(&m->engine.inflight, 1);
    um__event_ref(op); /* um__op_complete drops the engine's reference */
    um__op_complete(op, um__op_run(op));
    st = op->status;
    um__event_unref(op);
    return st;
  }

  for (int i = 0; i < nbufs; i++) {
    old_last[i] = bufs[i]->last;
    um__event_ref(op);
    bufs[i]->last = op;
  }
  unlock_buffers(bufs, nbufs);
  for (int i = 0; i < nbufs; i++)
    if (old_last[i])
      um__event_unref(old_last[i]);
  um__atomic_add_relaxed(&m->engine.inflight, 1);
  /* The issuing reference: becomes the caller's event, or is ours until
   * the wait below. */
  um__event_ref(op);

  if (ndeps > 0 && op->blocking) {
    /* The caller waits anyway: wait here, then run on this thread. */
    for (int i = 0; i < ndeps; i++) {
      um__event_wait_internal(deps[i]);
      um__event_unref(deps[i]);
    }
    ndeps = 0;
  } else if (ndeps > 0 && all_native) {
    /* Same device queue: order through the wait list, no blocking. Locks
     * taken in address order, held so that the tokens stay valid. */
    void *after[2];
    int nafter = 0;
    qsort(deps, (size_t)ndeps, sizeof(deps[0]), lock_order);
    for (int i = 0; i < ndeps; i++) {
      pthread_mutex_lock(&deps[i]->lock);
      if (atomic_load_explicit(&deps[i]->state, memory_order_acquire) != UM__EV_DONE &&
          deps[i]->native != NULL)
        after[nafter++] = deps[i]->native;
    }
    /* A dependency that is native-planned but not yet started (its own
     * start is in flight on another thread) has no token yet: fall back to
     * registration for that rare case. */
    bool missing = false;
    for (int i = 0; i < ndeps; i++)
      if (atomic_load_explicit(&deps[i]->state, memory_order_acquire) != UM__EV_DONE &&
          deps[i]->native == NULL)
        missing = true;
    void *native = NULL;
    if (!missing) {
      starting_native = op;
      st = start_native_after(op, after, nafter, &native);
      starting_native = NULL;
    }
    for (int i = ndeps - 1; i >= 0; i--)
      pthread_mutex_unlock(&deps[i]->lock);
    if (!missing && st == UM_OK) {
      keep_native(op, native);
      if (op->complete_deferred)
        um__op_complete(op, op->native_status);
    }
    if (!missing) {
      for (int i = 0; i < ndeps; i++)
        um__event_unref(deps[i]);
      if (st != UM_OK)
        um__op_complete(op, st);
      goto issued;
    }
    all_native = false;
  }

  if (ndeps > 0) {
    /* Register with every unfinished dependency; the last one to complete
     * hands the operation to a worker. The extra count is a guard so that
     * a dependency completing during registration cannot start it early. */
    atomic_store(&op->deps_pending, 1);
    for (int i = 0; i < ndeps; i++) {
      um_event *d = deps[i];
      bool full = false;
      pthread_mutex_lock(&d->lock);
      if (atomic_load_explicit(&d->state, memory_order_acquire) != UM__EV_DONE) {
        /* At most one follower per buffer the operation is last on (two
         * buffers), so the array cannot fill; if it ever did, waiting
         * here keeps the order at the cost of blocking. */
        if (d->ndependents < UM__MAX_DEPENDENTS) {
          d->dependents[d->ndependents++] = op;
          um__atomic_add_relaxed(&op->deps_pending, 1);
        } else {
          full = true;
        }
      }
      pthread_mutex_unlock(&d->lock);
      if (full)
        um__event_wait_internal(d);
      um__event_unref(d);
    }
    if (um__atomic_sub_acq_rel(&op->deps_pending, 1) != 1)
      goto issued; /* a dependency will start it */
  }

  /* Nothing to wait for: start now. */
  if (op->native_dev != NULL) {
    atomic_store_explicit(&op->state, UM__EV_RUNNING, memory_order_release);
    run_started(op);
  } else if (op->blocking || um__op_runs_inline(op)) {
    atomic_store_explicit(&op->state, UM__EV_RUNNING, memory_order_release);
    um__op_complete(op, um__op_run(op));
  } else {
    engine_push(m, op, TASK_START);
  }

issued:
  if (done == NULL) {
    st = um__event_wait_internal(op);
    um__event_unref(op); /* the issuing reference */
    return st;
  }
  *done = op;
  return UM_OK;
}

/* ------------------------------------------------------------------------ */
/* Public event API */

static int check_event(const um_event *e) {
  if (e == NULL || e->magic != UM__EVENT_MAGIC)
    return um__set_error(UM_EINVAL, "not an event");
  return UM_OK;
}

int um_event_wait(um_event *e) {
  int st = check_event(e);
  if (st != UM_OK)
    return st;
  return um__event_wait_internal(e);
}

int um_event_query(um_event *e) {
  int st = check_event(e);
  if (st != UM_OK)
    return st;
  if (atomic_load_explicit(&e->state, memory_order_acquire) != UM__EV_DONE)
    return UM_EAGAIN;
  pthread_mutex_lock(&e->lock);
  st = e->status;
  pthread_mutex_unlock(&e->lock);
  return st;
}

int um_event_cancel(um_event *e) {
  int st = check_event(e);
  if (st != UM_OK)
    return st;
  pthread_mutex_lock(&e->lock);
  if (e->kind != UM__OP_GROUP && !e->canceled &&
      atomic_load_explicit(&e->state, memory_order_acquire) == UM__EV_QUEUED) {
    e->canceled = true;
    st = UM_OK;
  } else {
    st = um__set_error(UM_EBUSY, "operation already started or finished");
  }
  pthread_mutex_unlock(&e->lock);
  return st;
}

void um_event_release(um_event *e) {
  if (check_event(e) != UM_OK)
    return;
  um__event_unref(e);
}
