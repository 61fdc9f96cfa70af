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
#include "testhook.h"

enum { TASK_START = 1, TASK_COMPLETE = 2 };

uint64_t um__now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ------------------------------------------------------------------------ */
/* Event objects: made in slabs, reused through the manager's free list,
 * freed with the manager. A handle the caller released keeps pointing at
 * readable memory that answers UM_ESTATE (until the object serves another
 * operation, as a stale buffer handle does until its block is reused). */

static um_event *event_slab_grow(um_manager *m) {
  um__event_slab *slab = calloc(1, sizeof(*slab));
  if (slab == NULL)
    return NULL;
  for (int i = 0; i < UM__EVENT_SLAB; i++) {
    um_event *e = &slab->ev[i];
    e->magic = UM__EVENT_MAGIC;
    e->m = m;
    pthread_mutex_init(&e->lock, NULL);
    pthread_cond_init(&e->cond, NULL);
    atomic_init(&e->refs, 0);
    atomic_init(&e->caller_holds, false);
    atomic_init(&e->state, UM__EV_DONE);
    if (i > 0)
      slab->ev[i].free_next = &slab->ev[i - 1];
  }
  slab->next = m->event_slabs;
  m->event_slabs = slab;
  /* ev[0] is returned; the rest form the free list (called under the lock,
   * with the list empty). */
  m->event_free = &slab->ev[UM__EVENT_SLAB - 1];
  slab->ev[1].free_next = NULL;
  return &slab->ev[0];
}

um_event *um__event_new(um_manager *m, um__op_kind kind) {
  um_event *e;
  pthread_mutex_lock(&m->event_lock);
  e = m->event_free;
  if (e != NULL)
    m->event_free = e->free_next;
  else
    e = event_slab_grow(m);
  pthread_mutex_unlock(&m->event_lock);
  if (e == NULL)
    return NULL;
  e->free_next = NULL;
  memset((char *)e + offsetof(um_event, refs), 0, sizeof(*e) - offsetof(um_event, refs));
  atomic_init(&e->refs, 1);
  atomic_init(&e->caller_holds, false);
  atomic_init(&e->state, UM__EV_QUEUED);
  atomic_init(&e->deps_pending, 0);
  atomic_init(&e->group_first_error, UM_OK);
  atomic_init(&e->native_refs, 0);
  e->kind = kind;
  return e;
}

void um__event_ref(um_event *e) { um__atomic_add_relaxed(&e->refs, 1); }

/* Take a reference unless the object is on the free list (refs == 0). */
static bool event_ref_if_used(um_event *e) {
  int r = um__atomic_load_relaxed(&e->refs);
  while (r > 0)
    if (atomic_compare_exchange_weak_explicit(&e->refs, &r, r + 1, memory_order_acquire,
                                              memory_order_relaxed))
      return true;
  return false;
}

void um__event_unref(um_event *e) {
  um_manager *m = e->m;
  if (um__atomic_sub_acq_rel(&e->refs, 1) != 1)
    return;
  pthread_mutex_lock(&m->event_lock);
  e->free_next = m->event_free;
  m->event_free = e;
  pthread_mutex_unlock(&m->event_lock);
}

/* Manager destroy: free every event object; report those the caller never
 * released (their handles die with the manager). */
void um__events_free_all(um_manager *m) {
  int unreleased = 0;
  while (m->event_slabs != NULL) {
    um__event_slab *slab = m->event_slabs;
    m->event_slabs = slab->next;
    for (int i = 0; i < UM__EVENT_SLAB; i++) {
      unreleased += atomic_load_explicit(&slab->ev[i].caller_holds, memory_order_relaxed);
      pthread_mutex_destroy(&slab->ev[i].lock);
      pthread_cond_destroy(&slab->ev[i].cond);
    }
    free(slab);
  }
  m->event_free = NULL;
  if (unreleased > 0)
    um__log(&m->opts, UM_LOG_WARN,
            "%d event(s) were never released with um_event_release; their handles are invalid now",
            unreleased);
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
  bool canceled;
  pthread_mutex_lock(&op->lock);
  canceled = op->canceled;
  if (!canceled)
    atomic_store_explicit(&op->state, UM__EV_RUNNING, memory_order_release);
  pthread_mutex_unlock(&op->lock);
  if (canceled) {
    um__op_complete(op, UM_ECANCELED);
    return;
  }
  UM__TEST_POINT(UM__TP_WORKER_RUN, op);
  run_started(op);
  UM__TEST_POINT(UM__TP_WORKER_DONE, op);
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

/* An operation finished: the completing thread's last touch of the
 * manager. um_manager_destroy frees the manager once inflight reads 0 under
 * the engine's lock (um__engine_drain), and a completion may run on a
 * driver's own thread, which nobody joins: so the count leaves 1 only under
 * that lock, and the thread that takes it to 0 is done with the manager
 * once it unlocks. Above 1 no drain can finish, so a CAS suffices. */
static void inflight_done(um_manager *m) {
  um__engine *en = &m->engine;
  int n = um__atomic_load_relaxed(&en->inflight);
  while (n > 1)
    if (atomic_compare_exchange_weak_explicit(&en->inflight, &n, n - 1, memory_order_acq_rel,
                                              memory_order_relaxed))
      return;
  pthread_mutex_lock(&en->lock);
  UM__TEST_POINT(UM__TP_INFLIGHT_DONE, m);
  if (um__atomic_sub_acq_rel(&en->inflight, 1) == 1)
    pthread_cond_broadcast(&en->drained);
  pthread_mutex_unlock(&en->lock);
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

/* Drop one owner of op's token; the last one releases it. */
static void token_put(um_event *op, um_device *ndev, void *native) {
  if (um__atomic_sub_acq_rel(&op->native_refs, 1) == 1 && ndev->be->native_release)
    ndev->be->native_release(ndev->bdev, native);
}

/* Under dep->lock: dep's token for a wait list, with one more owner, or
 * NULL when dep has finished or has not stored its token yet. */
static void *token_borrow_locked(um_event *dep) {
  if (atomic_load_explicit(&dep->state, memory_order_acquire) == UM__EV_DONE || dep->native == NULL)
    return NULL;
  um__atomic_add_relaxed(&dep->native_refs, 1);
  return dep->native;
}

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
  if (native != NULL)
    token_put(op, ndev, native);

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

  /* The engine's reference goes first: dropping the last one puts the
   * object on the manager's free list, which must not outlive the count. */
  um_manager *m = op->m;
  um__event_unref(op);
  inflight_done(m);
}

/* ------------------------------------------------------------------------ */
/* Starting */

/* Keep a started operation's token, or release it when the operation has
 * finished already. Until then op->native is NULL, which a later issuer
 * treats as "not started yet" and orders by registration instead. */
static void keep_native(um_event *op, void *native) {
  bool done;
  pthread_mutex_lock(&op->lock);
  done = atomic_load_explicit(&op->state, memory_order_acquire) == UM__EV_DONE;
  if (!done) {
    atomic_store_explicit(&op->native_refs, 1, memory_order_relaxed);
    op->native = native;
  }
  pthread_mutex_unlock(&op->lock);
  if (done && op->native_dev->be->native_release)
    op->native_dev->be->native_release(op->native_dev->bdev, native);
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

/* ------------------------------------------------------------------------ */
/* Issuing: the steps of um__op_issue */

/* The buffers op touches: dst, and src when it is another buffer. */
static int op_buffers(const um_event *op, um_buffer **bufs) {
  int n = 0;
  if (op->dst)
    bufs[n++] = op->dst;
  if (op->src && op->src != op->dst)
    bufs[n++] = op->src;
  return n;
}

/* Under the buffers' locks: whether op may still be published. The API
 * checked its arguments without the locks; a buffer released meanwhile, or
 * released and its descriptor handed to a new (maybe smaller) allocation,
 * shows here as a state or generation change: UM_ESTATE, never a write past
 * the end of someone else's block. */
static int op_check_locked(um_event *op, um_buffer **bufs, int nbufs) {
  for (int i = 0; i < nbufs; i++) {
    um_buffer *b = bufs[i];
    uint32_t gen = b == op->dst ? op->dst_gen : op->src_gen;
    /* touched before the state check, both seq_cst, against um_release's
     * state CAS then touched load: a release that misses touched comes
     * after this check in the total order, so the check sees RELEASED. */
    atomic_store(&b->touched, true);
    if (atomic_load(&b->state) != UM__BUF_LIVE || b->gen != gen)
      return um__set_error(UM_ESTATE, "buffer %p was released", (void *)b);
    if (b->mapped)
      return um__set_error(UM_ESTATE, "buffer %p is mapped: unmap it first", (void *)b);
  }
  return UM_OK;
}

/* Under the locks: op's dependencies are the buffers' unfinished last
 * operations (one reference each into deps). *all_native stays true when
 * every one of them runs on op's device queue. */
static int op_collect_deps(um_event *op, um_buffer **bufs, int nbufs, um_event **deps,
                           bool *all_native) {
  int ndeps = 0;
  *all_native = true;
  for (int i = 0; i < nbufs; i++) {
    um_event *last = bufs[i]->last;
    if (last != NULL &&
        atomic_load_explicit(&last->state, memory_order_acquire) != UM__EV_DONE &&
        (ndeps == 0 || deps[0] != last)) {
      um__event_ref(last);
      deps[ndeps++] = last;
      if (op->native_dev == NULL || last->native_dev != op->native_dev)
        *all_native = false;
    }
    bufs[i]->pending++;
  }
  /* A destination without a host view now has its current data on the
   * device only (its host shadow, if any, is stale). */
  if (op->dst != NULL && op->dst->mem.host == NULL)
    op->dst->valid = UM_VALID_DEVICE;
  return ndeps;
}

/* Fast path of a blocking operation with nothing before it: nobody else
 * can see it, so it is not published as the buffers' last operation; it
 * runs on this thread. Called with the locks dropped. */
static int op_run_unpublished(um_event *op) {
  int st;
  atomic_store_explicit(&op->state, UM__EV_RUNNING, memory_order_relaxed);
  um__atomic_add_relaxed(&op->m->engine.inflight, 1);
  um__event_ref(op); /* um__op_complete drops the engine's reference */
  um__op_complete(op, um__op_run(op));
  st = op->status;
  um__event_unref(op);
  return st;
}

/* Make op the buffers' last operation, then drop the locks and the
 * references the buffers held on their previous last operations. */
static void op_publish(um_event *op, um_buffer **bufs, int nbufs) {
  um_event *old_last[2] = {NULL, NULL};
  for (int i = 0; i < nbufs; i++) {
    old_last[i] = bufs[i]->last;
    um__event_ref(op);
    bufs[i]->last = op;
  }
  unlock_buffers(bufs, nbufs);
  for (int i = 0; i < nbufs; i++)
    if (old_last[i])
      um__event_unref(old_last[i]);
  um__atomic_add_relaxed(&op->m->engine.inflight, 1);
}

/* Start op on its device's queue behind deps (all on that queue), their
 * tokens in its wait list. No lock is held across the backend's call: a
 * driver may run an earlier command's completion on this very thread
 * (PoCL's basic device does), and that completion takes the locks of its
 * operation and buffers. The tokens are borrowed instead (token_borrow_locked),
 * so a dependency finishing meanwhile cannot release them. Returns false,
 * doing nothing, when a dependency has no token yet (its own start is in
 * flight on another thread): op is then ordered by registration. Consumes
 * the references in deps when it returns true. */
static bool op_start_after_tokens(um_event *op, um_event **deps, int ndeps) {
  void *after[2], *native = NULL;
  um_event *owner[2];
  int nafter = 0, st = UM_OK;
  bool missing = false;
  for (int i = 0; i < ndeps; i++) {
    void *tok;
    pthread_mutex_lock(&deps[i]->lock);
    tok = token_borrow_locked(deps[i]);
    if (tok != NULL) {
      after[nafter] = tok;
      owner[nafter++] = deps[i];
    } else if (atomic_load_explicit(&deps[i]->state, memory_order_acquire) != UM__EV_DONE) {
      missing = true;
    }
    pthread_mutex_unlock(&deps[i]->lock);
  }
  if (!missing) {
    UM__TEST_POINT(UM__TP_NATIVE_START, op);
    atomic_store_explicit(&op->state, UM__EV_RUNNING, memory_order_release);
    starting_native = op;
    st = um__op_start_native(op, after, nafter, native_done, &native);
    starting_native = NULL;
  }
  for (int i = 0; i < nafter; i++)
    token_put(owner[i], owner[i]->native_dev, after[i]);
  if (missing)
    return false;
  if (st == UM_OK) {
    keep_native(op, native);
    if (op->complete_deferred)
      um__op_complete(op, op->native_status);
  } else {
    um__op_complete(op, st);
  }
  for (int i = 0; i < ndeps; i++)
    um__event_unref(deps[i]);
  return true;
}

/* Register op with every unfinished dependency; the last one to complete
 * hands it to a worker. Returns true when a dependency will start it, false
 * when all had finished (the caller starts it). Consumes deps' references. */
static bool op_register(um_event *op, um_event **deps, int ndeps) {
  /* The extra count is a guard so that a dependency completing during
   * registration cannot start op early. */
  atomic_store(&op->deps_pending, 1);
  for (int i = 0; i < ndeps; i++) {
    um_event *d = deps[i];
    bool full = false;
    pthread_mutex_lock(&d->lock);
    if (atomic_load_explicit(&d->state, memory_order_acquire) != UM__EV_DONE) {
      /* At most one follower per buffer the operation is last on (two
       * buffers), so the array cannot fill; if it ever did, waiting here
       * keeps the order at the cost of blocking. */
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
  return um__atomic_sub_acq_rel(&op->deps_pending, 1) != 1;
}

/* Nothing to wait for: start op now, on its device's queue, on this thread
 * (blocking, or small enough), or on a worker. */
static void op_start_now(um_event *op) {
  if (op->native_dev != NULL) {
    atomic_store_explicit(&op->state, UM__EV_RUNNING, memory_order_release);
    run_started(op);
  } else if (op->blocking || um__op_runs_inline(op)) {
    atomic_store_explicit(&op->state, UM__EV_RUNNING, memory_order_release);
    um__op_complete(op, um__op_run(op));
  } else {
    engine_push(op->m, op, TASK_START);
  }
}

/* Takes over the caller's reference to op, issued or not. */
int um__op_issue(um_event *op, um_event **done) {
  um_buffer *bufs[2];
  um_event *deps[2];
  int nbufs = op_buffers(op, bufs), ndeps, st;
  bool all_native;

  op->blocking = done == NULL;
  UM__TEST_POINT(UM__TP_OP_CHECKED, op);
  lock_buffers(bufs, nbufs);
  if ((st = op_check_locked(op, bufs, nbufs)) != UM_OK) {
    unlock_buffers(bufs, nbufs);
    um__event_unref(op); /* never published: the caller's only reference */
    return st;
  }
  um__op_plan(op);
  ndeps = op_collect_deps(op, bufs, nbufs, deps, &all_native);
  if (op->blocking && ndeps == 0) {
    unlock_buffers(bufs, nbufs);
    return op_run_unpublished(op);
  }
  op_publish(op, bufs, nbufs);
  um__event_ref(op); /* the issuing reference: the caller's event, or ours
                        until the wait below */
  if (ndeps > 0 && op->blocking) {
    /* The caller waits anyway: wait here, then run on this thread. */
    for (int i = 0; i < ndeps; i++) {
      um__event_wait_internal(deps[i]);
      um__event_unref(deps[i]);
    }
    op_start_now(op);
  } else if (ndeps > 0 && all_native && op_start_after_tokens(op, deps, ndeps)) {
    /* started on the device queue, behind its dependencies */
  } else if (ndeps > 0 && op_register(op, deps, ndeps)) {
    /* the last dependency to finish starts it */
  } else {
    op_start_now(op);
  }
  if (done == NULL) {
    st = um__event_wait_internal(op);
    um__event_unref(op); /* the issuing reference */
    return st;
  }
  atomic_store_explicit(&op->caller_holds, true, memory_order_relaxed);
  *done = op;
  return UM_OK;
}

/* ------------------------------------------------------------------------ */
/* Public event API */

/* A public call's event: UM_EINVAL when e is not an event at all, UM_ESTATE
 * when the caller already released it (the object may since serve another
 * operation; then the call acts on that one, as a stale buffer handle does). */
static int check_event(const um_event *e) {
  if (e == NULL || e->magic != UM__EVENT_MAGIC)
    return um__set_error(UM_EINVAL, "not an event");
  if (!atomic_load_explicit(&e->caller_holds, memory_order_acquire))
    return um__set_error(UM_ESTATE, "event %p was released", (const void *)e);
  UM__CHECK_PROCESS(e->m);
  return UM_OK;
}

int um_event_wait(um_event *e) {
  int st = check_event(e);
  if (st != UM_OK)
    return st;
  /* Hold the object for the wait: another thread may release the handle
   * meanwhile (a misuse, but not one that may reach freed memory). */
  if (!event_ref_if_used(e))
    return um__set_error(UM_ESTATE, "event %p was released", (void *)e);
  st = um__event_wait_internal(e);
  um__event_unref(e);
  return st;
}

int um_event_query(um_event *e) {
  int st = check_event(e);
  if (st != UM_OK)
    return st;
  pthread_mutex_lock(&e->lock);
  st = atomic_load_explicit(&e->state, memory_order_acquire) != UM__EV_DONE ? UM_EAGAIN : e->status;
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

int um_event_release(um_event *e) {
  bool held = true;
  if (e == NULL || e->magic != UM__EVENT_MAGIC)
    return um__set_error(UM_EINVAL, "not an event");
  UM__CHECK_PROCESS(e->m);
  if (!atomic_compare_exchange_strong_explicit(&e->caller_holds, &held, false, memory_order_acq_rel,
                                               memory_order_acquire))
    return um__set_error(UM_ESTATE, "event %p was released already", (void *)e);
  um__event_unref(e);
  return UM_OK;
}
