/* The issue of an operation: check, plan, order, publish, start. What an
 * operation does is its path's (path.c: a table of entries with plan /
 * run / start_native / account); this file calls them and knows none of
 * them. Its completion is complete.c's, its native token tokens.c's, the
 * marks of open brackets brackets.c's; held operations (held.c) and a
 * batch's runs (group.c) reuse these steps. Kept apart from them because
 * this is the path every copy takes on the issuing thread.
 *
 * An operation is ordered after the earlier operations on the buffers it
 * touches. Each buffer keeps a reference to its last operation; a new one
 * depends on the last of its destination and of its source. A dependency
 * is satisfied in one of three ways:
 *  - it already finished;
 *  - both run natively on the same device: the device's queue orders them
 *    (the earlier one's token goes into the later one's wait list), so the
 *    issuing thread never blocks;
 *  - otherwise the new operation registers with the earlier one and is
 *    started by a worker thread (engine.c) when the earlier one completes.
 * A path with host-side asynchronous work (start_async: a network
 * transfer) is started on the thread that may start it and completes on
 * whatever thread reports it done; no worker blocks on it.
 *
 * No lock of unimem is held across a backend call: a driver may run an
 * earlier command's completion on the submitting thread, and that
 * completion takes the locks of its operation and buffers.
 */
#include <stdlib.h>
#include <string.h>

#include "op_internal.h"
#include "testhook.h"

/* ------------------------------------------------------------------------ */
/* Starting */

static void async_done(void *arg, int status) { um__op_complete(arg, status); }

/* Run a started operation on host threads: its path's run, to completion
 * on this thread; or its asynchronous start, which returns at once (the
 * operation completes in async_done, on the thread that reports it). */
static void run_host(um_event *op) {
  int st;
  if (op->path->start_async == NULL) {
    if ((st = op->path->run(op)) != UM_OK)
      keep_error_text(op);
    um__op_complete(op, st);
    return;
  }
  /* done may complete op, and drop the engine's reference, before
   * start_async returns. */
  um__event_ref(op);
  if ((st = op->path->start_async(op, async_done)) != UM_OK) {
    keep_error_text(op);
    um__op_complete(op, st);
  }
  um__event_unref(op);
}

/* Run an operation whose dependencies are all satisfied and whose state is
 * already RUNNING: on its device's queue, or on host threads. held: the
 * caller holds a reference to op (the issuing thread's). */
static void run_started(um_event *op, bool held) {
  if (op->native_dev != NULL) {
    /* The operation may complete (and lose the engine's reference, its
     * last one when the caller already released its event) before
     * xfer_async returns: hold it until the token is stored. */
    int st;
    if (!held)
      um__event_ref(op);
    /* Refused: nothing it depends on is unfinished, it fails (behind what
     * its queue still holds). */
    if ((st = um__start_native(op, NULL, 0)) != UM_OK)
      um__complete_refused(op, st);
    if (!held)
      um__event_unref(op);
    return;
  }
  run_host(op);
}

/* A worker starts an operation its last dependency handed over, unless it
 * was canceled meanwhile. */
void um__op_task_start(um__work *w) {
  um_event *op = op_of(w);
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
  if (op->refused) { /* its operations before it finished: it fails */
    um__complete_refused(op, op->native_status);
    return;
  }
  UM__TEST_POINT(UM__TP_WORKER_RUN, op);
  run_started(op, false);
  UM__TEST_POINT(UM__TP_WORKER_DONE, op);
}

/* Nothing to wait for: start op now, on its device's queue, on this thread
 * (blocking, small enough, or an asynchronous start), or on a worker.
 * held: as for run_started. */
void um__op_start_now(um_event *op, bool held) {
  if (op->native_dev != NULL || op->blocking || op->path->start_async != NULL ||
      um__path_runs_inline(op)) {
    atomic_store_explicit(&op->state, UM__EV_RUNNING, memory_order_release);
    run_started(op, held);
  } else {
    engine_push_op(op, um__op_task_start, false);
  }
}

/* ------------------------------------------------------------------------ */
/* Issuing: the steps of um__op_issue */

/* Under the buffers' locks: whether op may still be published. The API
 * checked its arguments without the locks; a buffer released meanwhile, or
 * released and its descriptor handed to a new (maybe smaller) allocation,
 * shows here as a state or generation change: UM_ESTATE, never a write past
 * the end of someone else's block. */
int um__op_check_locked(um_event *op, um_buffer **bufs, int nbufs) {
  for (int i = 0; i < nbufs; i++) {
    um_buffer *b = bufs[i];
    uint32_t gen = b == op->dst ? op->dst_gen : op->src_gen;
    /* touched before the state check, both seq_cst, against um_release's
     * state CAS then touched load: a release that misses touched comes
     * after this check in the total order, so the check sees RELEASED.
     * Once touched, a buffer stays so until it is reused: a release then
     * takes the lock held here (buffer.c's release_slow), so the store
     * (a full barrier) is made once per buffer, not once per operation. */
    if (!atomic_load_explicit(&b->touched, memory_order_relaxed)) {
      um__bias_leave(b->m); /* tcache.h: the sole thread's release is plain */
      atomic_store(&b->touched, true);
    }
    if (atomic_load(&b->state) != UM__BUF_LIVE || b->gen != gen)
      return um__set_error(UM_ESTATE, "buffer %p was released", (void *)b);
    if (b->mapped)
      return um__set_error(UM_ESTATE, "buffer %p is mapped: unmap it first", (void *)b);
    /* A blocking call (or a blocking batch's member) must not wait for a
     * bracket: um_access_end is the caller's to give. */
    if ((op->blocking || (op->group != NULL && op->group->blocking)) && um__buffer_waits_bracket_locked(b, false))
      return um__op_bracket_error(b);
  }
  return UM_OK;
}

/* Under the locks: op's dependencies are the buffers' unfinished last
 * operations (one reference each into deps). *all_native stays true when
 * every one of them runs on op's device queue. */
int um__op_collect_deps(um_event *op, um_buffer **bufs, int nbufs, um_event **deps,
                           bool *all_native) {
  int ndeps = 0;
  *all_native = true;
  for (int i = 0; i < nbufs; i++) {
    um_event *last = bufs[i]->last;
    /* Finished, or queued ahead on the single queue op goes to: the device
     * orders them, nothing to wait for. */
    if (last != NULL && atomic_load_explicit(&last->state, memory_order_acquire) != UM__EV_DONE &&
        !queued_before(last, op) && (ndeps == 0 || deps[0] != last)) {
      um__event_ref(last);
      deps[ndeps++] = last;
      if (op->native_dev == NULL || !um__dev_tokens_shared(op->native_dev, last->native_dev))
        *all_native = false;
    }
    bufs[i]->pending++;
  }
  if (ndeps > 0 && __builtin_expect(um__atomic_load_relaxed(&op->m->brackets_open) != 0, 0))
    um__marks_inherit(op, deps, ndeps);
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
  /* Behind operations its queue orders, whose reports may come after its
   * own: its completion waits at the gate, and so does this thread. */
  bool gated = op->npriors > 0;
  atomic_store_explicit(&op->state, UM__EV_RUNNING, memory_order_relaxed);
  um__engine_op_begin(op->m);
  um__event_ref(op); /* um__op_complete drops the engine's reference */
  run_host(op);
  /* A run failed on this thread, which has its text already. */
  st = op->path->start_async != NULL || gated ? um__event_wait_result(op) : op->status;
  um__event_unref(op);
  return st;
}

/* op (not started: nobody reads its priors before its gate) replaced
 * old_last[0..n) as its buffers' last operation: the buffers' references
 * to them are kept as op's priors where they had not finished, else
 * dropped. */
void um__follow_replaced(um_event *op, um_event **old_last, int n) {
  for (int i = 0; i < n; i++) {
    if (old_last[i] == NULL)
      continue;
    if (atomic_load_explicit(&old_last[i]->state, memory_order_acquire) != UM__EV_DONE)
      prior_add(op, old_last[i]);
    else
      um__event_unref(old_last[i]);
  }
}

/* Make op the buffers' last operation, then drop the locks; op follows the
 * operations it replaced (um__follow_replaced). The buffers' references, and
 * extra_refs more for the caller, are taken at once before anyone can see
 * op. */
void um__op_publish(um_event *op, um_buffer **bufs, int nbufs, int extra_refs) {
  um_event *old_last[2] = {NULL, NULL};
  um__atomic_add_relaxed(&op->refs, nbufs + extra_refs);
  for (int i = 0; i < nbufs; i++) {
    old_last[i] = bufs[i]->last;
    bufs[i]->last = op;
  }
  unlock_buffers(bufs, nbufs);
  um__follow_replaced(op, old_last, nbufs);
  um__engine_op_begin(op->m);
}

/* Under the locks: an operation that is not published (it runs on the
 * issuing thread) still follows the buffers' unfinished last operations. */
static void op_priors_unpublished(um_event *op, um_buffer **bufs, int nbufs) {
  for (int i = 0; i < nbufs; i++) {
    um_event *last = bufs[i]->last;
    if (last != NULL && atomic_load_explicit(&last->state, memory_order_acquire) != UM__EV_DONE) {
      um__event_ref(last);
      prior_add(op, last);
    }
  }
}


/* Borrow the tokens op must wait for: deps queued before op on its queue
 * need none (the queue orders them), finished ones none either. Returns
 * false when a dependency has no token yet; what was borrowed is in
 * after[]/owner[] either way. */
static bool borrow_dep_tokens(um_event *op, um_event **deps, int ndeps, void **after, um_event **owner,
                              int *nafter) {
  bool missing = false;
  for (int i = 0; i < ndeps; i++) {
    void *tok = NULL;
    bool in_queue;
    pthread_mutex_lock(&deps[i]->lock);
    in_queue = queued_before(deps[i], op);
    if (!in_queue)
      tok = token_borrow_locked(deps[i]);
    if (in_queue) {
      /* the queue orders them */
    } else if (tok != NULL) {
      after[*nafter] = tok;
      owner[(*nafter)++] = deps[i];
    } else if (atomic_load_explicit(&deps[i]->state, memory_order_acquire) != UM__EV_DONE) {
      missing = true;
    }
    pthread_mutex_unlock(&deps[i]->lock);
  }
  return !missing;
}

/* The queue refused op (st): op fails, but not before the operations it
 * was queued behind finished. It is its buffers' last operation, and the
 * next one takes its completion for theirs: completed now, a blocking
 * write issued next would run at once and overtake a read still queued. */
static void op_refused_after(um_event *op, um_event **deps, int ndeps, int st) {
  op->refused = true;
  op->native_status = st;
  if (!um__op_register(op, deps, ndeps))
    um__complete_refused(op, st); /* they finished meanwhile */
}

/* Start op on its device's queue behind deps (all on that queue), their
 * tokens in its wait list. The tokens are borrowed (token_borrow_locked),
 * so a dependency finishing meanwhile cannot release them, and no lock is
 * held across the backend's call. Returns false, doing nothing, when a
 * dependency has no token yet (its own start is in flight on another
 * thread): op is then ordered by registration. Consumes the references in
 * deps when it returns true. */
static bool op_start_after_tokens(um_event *op, um_event **deps, int ndeps) {
  void *after[2];
  um_event *owner[2];
  int nafter = 0, st = UM_OK;
  bool ready = borrow_dep_tokens(op, deps, ndeps, after, owner, &nafter);
  if (ready) {
    UM__TEST_POINT(UM__TP_NATIVE_START, op);
    atomic_store_explicit(&op->state, UM__EV_RUNNING, memory_order_release);
    st = um__start_native(op, after, nafter);
  }
  for (int i = 0; i < nafter; i++)
    um__event_token_put(owner[i], owner[i]->native_dev, after[i]);
  if (!ready)
    return false;
  if (st != UM_OK) {
    op_refused_after(op, deps, ndeps, st);
    return true;
  }
  for (int i = 0; i < ndeps; i++)
    um__event_unref(deps[i]);
  return true;
}

/* Under d->lock: op follows d, in d's heap array of followers. */
static bool add_more_dependent(um_event *d, um_event *op) {
  int n = d->nmore_dependents;
  /* room for 4, 8, 16...: grown when n is 0 or a power of two from 4 on */
  if (n == 0 || (n >= 4 && (n & (n - 1)) == 0)) {
    um_event **more = realloc(d->more_dependents, (size_t)(n == 0 ? 4 : 2 * n) * sizeof(*more));
    if (more == NULL)
      return false;
    d->more_dependents = more;
  }
  d->more_dependents[d->nmore_dependents++] = op;
  return true;
}

/* Register op with every unfinished dependency; the last one to complete
 * hands it to a worker. Returns true when a dependency will start it, false
 * when all had finished (the caller starts it). Consumes deps' references. */
bool um__op_register(um_event *op, um_event **deps, int ndeps) {
  /* The extra count is a guard so that a dependency completing during
   * registration cannot start op early. */
  atomic_store(&op->deps_pending, 1);
  for (int i = 0; i < ndeps; i++) {
    um_event *d = deps[i];
    bool full = false, follows = false;
    pthread_mutex_lock(&d->lock);
    if (atomic_load_explicit(&d->state, memory_order_acquire) != UM__EV_DONE) {
      follows = true;
      /* Mostly one follower per buffer the operation is last on: the
       * array, and a heap array beyond it (a batch's run is last on many
       * buffers). Out of memory, waiting here keeps the order at the cost
       * of blocking. */
      if (d->ndependents < UM__MAX_DEPENDENTS) {
        d->dependents[d->ndependents++] = op;
        um__atomic_add_relaxed(&op->deps_pending, 1);
      } else if (add_more_dependent(d, op)) {
        um__atomic_add_relaxed(&op->deps_pending, 1);
      } else {
        full = true;
      }
    }
    pthread_mutex_unlock(&d->lock);
    if (full)
      um__event_wait_internal(d);
    else if (follows && atomic_load(&d->rides)) /* no command may come to carry it (held.c) */
      um__dev_kick_riders(d->native_dev);
    um__event_unref(d);
  }
  return um__atomic_sub_acq_rel(&op->deps_pending, 1) != 1;
}

/* Riding brackets among deps get tokens (tokens.c), so that op is queued
 * behind them now. Always true. */
static bool riders_tokens(um_event **deps, int ndeps) {
  for (int i = 0; i < ndeps; i++)
    if (__builtin_expect(atomic_load_explicit(&deps[i]->rides, memory_order_relaxed) != 0, 0))
      um__rider_token(deps[i]);
  return true;
}

/* Published op starts: after its dependencies (waited for here when the
 * caller blocks anyway, through the device queue, or by registration), or
 * at once. */
static void op_start_ordered(um_event *op, um_event **deps, int ndeps, bool all_native) {
  if (ndeps > 0 && op->blocking) {
    for (int i = 0; i < ndeps; i++) {
      um__event_wait_internal(deps[i]);
      um__event_unref(deps[i]);
    }
    um__op_start_now(op, true);
  } else if (ndeps > 0 && all_native && riders_tokens(deps, ndeps) && op_start_after_tokens(op, deps, ndeps)) {
    /* started on the device queue, behind its dependencies */
  } else if (ndeps > 0 && um__op_register(op, deps, ndeps)) {
    /* the last dependency to finish starts it */
  } else {
    um__op_start_now(op, true);
  }
}

/* Takes over the caller's reference to op, issued or not. */
int um__op_issue(um_event *op, um_event **done) {
  um_buffer *bufs[2];
  um_event *deps[2];
  int nbufs = op_buffers(op, bufs), ndeps, st;
  bool all_native;

  op->blocking = done == NULL && !op->detached;
  UM__TEST_POINT(UM__TP_OP_CHECKED, op);
  lock_buffers(bufs, nbufs);
  if ((st = um__op_check_locked(op, bufs, nbufs)) != UM_OK) {
    unlock_buffers(bufs, nbufs);
    drop_attached(op);
    um__event_unref(op); /* never published: the caller's only reference */
    return st;
  }
  um__path_plan(op);
  ndeps = um__op_collect_deps(op, bufs, nbufs, deps, &all_native);
  if (op->blocking && ndeps == 0) {
    op_priors_unpublished(op, bufs, nbufs);
    unlock_buffers(bufs, nbufs);
    return op_run_unpublished(op);
  }
  um__op_publish(op, bufs, nbufs, 1); /* and the issuing reference: the caller's
                                     event, or ours until the wait below */
  if (done != NULL) /* before the start: the caller's share of the token */
    atomic_store_explicit(&op->caller_holds, true, memory_order_relaxed);
  op_start_ordered(op, deps, ndeps, all_native);
  if (op->detached) {
    um__event_unref(op); /* nobody holds it but the engine and the buffers */
    return UM_OK;
  }
  if (done == NULL) {
    st = um__event_wait_result(op);
    um__event_unref(op); /* the issuing reference */
    return st;
  }
  *done = op;
  return UM_OK;
}
