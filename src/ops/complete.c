/* The completion of an operation: the gate that reports completions in
 * the order of the buffers, then the finish (statistics, buffers, state,
 * waiters, group, followers), and the failure of an operation its queue
 * refused. Apart from op.c because it runs on whichever thread reports the
 * end (a driver's callback, a backend's watcher, a worker), never the
 * issuer's.
 *
 * A device may report a later operation before the one it follows (OpenCL
 * calls its callbacks on any of its threads; CUDA's copy streams have a
 * watcher each): the later one then waits at its gate for the earlier
 * one's report before it counts as done. A failure's text is kept in the
 * event (error_text) by the thread that saw it, for um_last_error() on the
 * thread that waits.
 */
#include <stdlib.h>
#include <string.h>

#include "op_internal.h"

static void retire_task(um__work *w) {
  um_buffer *b = (um_buffer *)(void *)((char *)w - offsetof(um_buffer, retire_work));
  um_manager *m = b->m;
  um__buffer_retire(b, NULL);
  um__engine_op_done(m); /* the last touch of m */
}

/* b's last operation finished and its release was deferred: it retires.
 * Not on a backend's reporting thread: a retire may free device memory
 * (cuMemFree waits for the whole device, whose work may wait in turn on a
 * report that thread has yet to make), unregister a pinned range, or call
 * a foreign memory's owner back. There it goes to a worker, counted as in
 * flight until done, so that a drain waits for it. */
void um__retire_where_it_may_block(um_buffer *b) {
  if (!um__completes_inline) {
    um__buffer_retire(b, NULL);
    return;
  }
  um__engine_op_begin(b->m);
  b->retire_work.fn = retire_task;
  um__engine_push(b->m, &b->retire_work, true);
}

/* op finished with status: whether it may be reported done now, every
 * operation it follows having been. Otherwise it waits, its status kept,
 * in the prior_waiters of those that have not, and the last of them to
 * complete finishes it (um__gate_release). Runs once per operation. */
static bool gate_passes(um_event *op, int status) {
  int n = op->npriors, done = 0;
  if (n == 0)
    return true;
  /* Mostly they have been reported (in order): then no count and no lock. */
  while (done < n && atomic_load_explicit(&op->priors[done].prior->state, memory_order_acquire) == UM__EV_DONE)
    um__event_unref(op->priors[done++].prior);
  op->npriors = 0;
  if (done == n)
    return true;
  op->gate_status = status;
  /* A guard, so that a prior completing meanwhile cannot let op through
   * before every node is placed. */
  atomic_store_explicit(&op->priors_pending, 1, memory_order_relaxed);
  for (int i = done; i < n; i++) {
    um__prior *node = &op->priors[i];
    um_event *p = node->prior;
    bool waits = false;
    um_device *kick = NULL;
    if (atomic_load_explicit(&p->state, memory_order_acquire) != UM__EV_DONE) {
      pthread_mutex_lock(&p->lock);
      waits = atomic_load_explicit(&p->state, memory_order_acquire) != UM__EV_DONE;
      if (waits) {
        um__atomic_add_relaxed(&op->priors_pending, 1);
        node->next = p->prior_waiters;
        p->prior_waiters = node;
        if (atomic_load(&p->rides)) /* op ran, yet the rider before it is not reported */
          kick = p->native_dev;
      }
      pthread_mutex_unlock(&p->lock);
    }
    if (!waits)
      um__event_unref(p);
    if (kick != NULL) /* devices outlive their operations */
      um__dev_kick_riders(kick);
  }
  return um__atomic_sub_acq_rel(&op->priors_pending, 1) == 1;
}

/* op completed; waiters are the nodes of the operations that waited for it
 * at their gates (taken under op->lock with its DONE state). Each drops its
 * reference to op (the caller still holds one: the engine's), and those op
 * was the last for go on *ready, to be finished by the caller. */
void um__gate_release(um_event *op, um__prior *waiters, um_event **ready) {
  while (waiters != NULL) {
    um__prior *node = waiters;
    um_event *w = node->waiter;
    waiters = node->next; /* read before w may be finished elsewhere */
    um__event_unref(op);
    if (um__atomic_sub_acq_rel(&w->priors_pending, 1) == 1) {
      w->gate_next = *ready;
      *ready = w;
    }
  }
}

static void op_finish(um_event *op, int status, um_event **ready);

/* Finish the operations a completion let through, and those they let
 * through in turn, on this thread: a loop, not a recursion, however long
 * the chain of reports that came out of order. */
static void finish_ready(um_event *ready) {
  while (ready != NULL) {
    um_event *op = ready;
    ready = op->gate_next;
    if (op->kind == UM__OP_RUN)
      um__run_finish(op->run, &ready);
    else
      op_finish(op, op->gate_status, &ready);
  }
}

/* ------------------------------------------------------------------------ */
/* Completion */

static void followers_take_locked(um_event *op, followers *f) {
  f->n = op->ndependents;
  memcpy(f->first, op->dependents, sizeof(f->first));
  f->more = op->more_dependents;
  f->nmore = op->nmore_dependents;
  op->ndependents = 0;
  op->more_dependents = NULL;
  op->nmore_dependents = 0;
}

static void follower_ready(um_event *f) {
  if (um__atomic_sub_acq_rel(&f->deps_pending, 1) == 1)
    engine_push_op(f, um__op_task_start, false);
}

void um__followers_start(followers *f) {
  for (int i = 0; i < f->n; i++)
    follower_ready(f->first[i]);
  for (int i = 0; i < f->nmore; i++)
    follower_ready(f->more[i]);
  free(f->more);
}

/* Under op->lock: op finished with status; its followers go to f, the
 * nodes waiting for it at their gates to *waiters. Returns its token. */
void *um__finish_op_locked(um_event *op, int status, followers *f, um__prior **waiters, bool *wake) {
  void *native = atomic_exchange_explicit(&op->native, NATIVE_FINISHED, memory_order_acq_rel);
  *wake = op->cond_waiters > 0; /* a broadcast with nobody to wake costs a call */
  op->status = status;
  followers_take_locked(op, f);
  *waiters = op->prior_waiters;
  op->prior_waiters = NULL;
  atomic_store_explicit(&op->state, UM__EV_DONE, memory_order_release);
  return native; /* NULL: not kept yet, keep_native puts it */
}

/* The buffers' bookkeeping and the operation's state change together,
 * under the buffers' locks: a caller woken by a wait sees the buffer idle
 * (a release pools its block at once), and um_map, which waits for the
 * buffer to be idle, sees every earlier event done. Returns op's token;
 * its followers go to f. */
static void *finish_locked(um_event *op, int status, um_buffer **bufs, int nbufs, bool *drop_last,
                           bool *retire, followers *f, um__prior **waiters, bool *wake) {
  void *native;
  for (int i = 0; i < nbufs; i++)
    um__buffer_op_finish_locked(bufs[i], op, &drop_last[i], &retire[i]);
  pthread_mutex_lock(&op->lock);
  native = um__finish_op_locked(op, status, f, waiters, wake);
  pthread_mutex_unlock(&op->lock);
  return native;
}


/* Where a finished operation counts for its tag (core/observe.c), as the
 * statistics count it (path.c's account_memcpy: by what physically
 * moved): from the caller's memory or a buffer of the cpu device into a
 * device's is host-to-device on the destination's device, the other way
 * device-to-host on the source's, within one device device-to-device,
 * between two devices peer traffic on the destination's; a fill within
 * its device; a net transfer on its buffer's. False for the other kinds. */
static bool op_direction(const um_event *op, const um_device **d, int *dir) {
  if (op->kind == UM__OP_NET) {
    *d = (op->src != NULL ? op->src : op->dst)->dev;
    *dir = op->src != NULL ? UM__DIR_NET_OUT : UM__DIR_NET_IN;
  } else if (op->kind == UM__OP_FILL) {
    *d = op->dst->dev;
    *dir = UM__DIR_D2D;
  } else if (op->kind == UM__OP_COPY) {
    const um_device *src = op->src != NULL ? op->src->dev : NULL, *dst = op->dst != NULL ? op->dst->dev : NULL;
    if (op->copy.host_src != NULL || src == NULL) {
      *d = dst;
      *dir = UM__DIR_H2D;
    } else if (op->copy.host_dst != NULL || dst == NULL) {
      *d = src;
      *dir = UM__DIR_D2H;
    } else if (src == dst) {
      *d = dst;
      *dir = UM__DIR_D2D;
    } else if (src->index == 0) {
      *d = dst;
      *dir = UM__DIR_H2D;
    } else if (dst->index == 0) {
      *d = src;
      *dir = UM__DIR_D2H;
    } else {
      *d = dst;
      *dir = UM__DIR_PEER;
    }
  } else {
    return false;
  }
  return true;
}

/* An operation issued while its manager observed: its bytes for its tag,
 * and its event into the history. */
static void observed(const um_event *op, int status) {
  static const um_history_kind kinds[] = {[UM__OP_COPY] = UM_HIST_COPY, [UM__OP_FILL] = UM_HIST_FILL,
                                          [UM__OP_ACCESS] = UM_HIST_BRACKET};
  const um_device *d = NULL;
  const um_buffer *b = op->dst != NULL ? op->dst : op->src;
  int dir = -1;
  bool counts = op_direction(op, &d, &dir);
  if (counts && status == UM_OK && op->obs_tag != 0)
    um__obs_moved(op->m, op->obs_tag, d, dir, op->bytes);
  if ((!counts && op->kind != UM__OP_ACCESS) || b == NULL || !um__hist_on(op->m))
    return;
  um_history_event e = {.kind = op->kind == UM__OP_NET ? (op->src != NULL ? UM_HIST_NET_PUT : UM_HIST_NET_GET)
                                                        : kinds[op->kind],
                        .device = d != NULL ? d->index : b->dev->index,
                        .src_device = op->src != NULL ? op->src->dev->index : -1,
                        .dst_device = op->dst != NULL ? op->dst->dev->index : -1,
                        .loc = b->loc, .status = status, .bytes = op->bytes,
                        .address = b->mem.host != NULL ? (uint64_t)(uintptr_t)b->mem.host : (uint64_t)b->mem.handle,
                        .tag = um__obs_tag_name(op->m, op->obs_tag),
                        .path = op->path != NULL ? op->path->name : NULL,
                        .begin_ns = op->obs_t0, .end_ns = um__now_ns()};
  if (op->kind == UM__OP_NET) /* the net's transfer has no destination buffer here */
    e.src_device = e.dst_device = -1;
  um__obs_event(op->m, &e);
}

/* op is done with status, and reported so: its statistics, buffers,
 * state, waiters, group and followers. The operations it lets through at
 * their gates go on *ready. */
static void op_finish(um_event *op, int status, um_event **ready) {
  um_buffer *bufs[2];
  int nbufs = op_buffers(op, bufs);
  bool drop_last[2] = {false, false}, retire[2] = {false, false};
  um_event *group = op->group;
  um_device *ndev = op->native_dev;
  um_manager *m = op->m;
  followers f;
  um__prior *waiters;
  void *native;
  bool wake;

  if (status == UM_OK && op->path != NULL)
    op->path->account(op);
  if (__builtin_expect(op->obs_t0 != 0, 0))
    observed(op, status);
  drop_attached(op);
  lock_buffers(bufs, nbufs);
  native = finish_locked(op, status, bufs, nbufs, drop_last, retire, &f, &waiters, &wake);
  unlock_buffers(bufs, nbufs);
  for (int i = 0; i < nbufs; i++) {
    if (drop_last[i])
      um__event_unref(op); /* not the last reference: the engine holds one */
    if (retire[i])
      um__retire_where_it_may_block(bufs[i]);
  }
  /* Waiters are woken after the unlock, so that they do not wake only to
   * block on the lock; the engine's reference keeps op alive meanwhile. */
  if (wake)
    pthread_cond_broadcast(&op->cond);
  if (native != NULL)
    um__event_token_put(op, ndev, native);
  um__gate_release(op, waiters, ready);
  if (group != NULL)
    um__group_member_done(group, status, op->error_text[0] != '\0' ? op->error_text : NULL);
  um__followers_start(&f);
  /* The engine's reference goes first: dropping the last one puts the
   * object on the manager's free list, which must not outlive the count. */
  um__event_unref(op);
  um__engine_op_done(m);
}

/* An operation, or a run's (kind RUN: its run's status), completed with
 * status: finished here once the gate lets it through, with what it lets
 * through in turn. */
void um__op_complete(um_event *op, int status) {
  if (!gate_passes(op, status))
    return; /* the last operation it follows to complete finishes it */
  op->gate_status = status;
  op->gate_next = NULL;
  finish_ready(op);
}

void um__op_task_complete(um__work *w) {
  um_event *op = op_of(w);
  um__op_complete(op, op->native_status);
}

/* The mark behind a refused operation ran: it fails now, with its refusal
 * (op->native_status), whatever the mark says. */
static void refused_marked(void *arg, int status) {
  um_event *op = arg;
  (void)status;
  if (finish_here(op->native_dev))
    um__op_complete(op, op->native_status);
  else
    engine_push_op(op, um__op_task_complete, true);
}

/* op was refused by its device's queue (status st) and whatever it was
 * ordered after by registration has finished: it fails. On a single-queue
 * device, operations it follows may still be queued there with nothing
 * recorded (queued_before: the queue was to order them): completed now, it
 * would let a later operation that the queue does not order (a peer copy
 * run by another device, a host path) overtake them. So it fails behind a
 * queue mark; when the mark is refused too, after the backend's
 * synchronize (which waits for everything queued on the device). */
void um__complete_refused(um_event *op, int st) {
  um_device *d = op->native_dev;
  op->native_status = st;
  if (d != NULL && um__dev_single_queue(d)) {
    if (um__queue_mark(d, op->queued_q > 0 ? op->queued_q : 0, refused_marked, op) == UM_OK)
      return;
    (void)um__dev_synchronize(d);
  }
  um__op_complete(op, st);
}
