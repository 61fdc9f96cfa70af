/* The life of an operation: issue, ordering, start, completion, native
 * tokens. What an operation does is its path's (path.c: a table of entries
 * with plan / run / start_native / account); this file calls them and knows
 * none of them.
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
 *    started by a worker thread (event.c's engine) when the earlier one
 *    completes.
 * A native operation completes in the driver's callback where the backend
 * allows it (callbacks_reenter), else on a worker. Completions are reported
 * in the order of the buffers (the gate): a device may report a later
 * operation before the one it follows (OpenCL calls its callbacks on any of
 * its threads; CUDA's copy streams have a watcher each), and the later one
 * then waits for the earlier one's report before it counts as done. A path with host-side
 * asynchronous work (start_async: a network transfer) is started on the
 * thread that may start it and completes on whatever thread reports it
 * done; no worker blocks on it.
 *
 * A failure's text is kept in the event (error_text) by the thread that
 * saw it, for um_last_error() on the thread that waits.
 *
 * No lock of unimem is held across a backend call: a driver may run an
 * earlier command's completion on the submitting thread, and that
 * completion takes the locks of its operation and buffers.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h"
#include "testhook.h"

static void op_task_start(um__work *w);
static void op_task_complete(um__work *w);
static void run_finish(struct um__run *r, um_event **ready);

static um_event *op_of(um__work *w) {
  return (um_event *)(void *)((char *)w - offsetof(um_event, work));
}

static void engine_push_op(um_event *op, void (*fn)(um__work *), bool first) {
  op->work.fn = fn;
  um__engine_push(op->m, &op->work, first);
}

/* ------------------------------------------------------------------------ */
/* Native tokens */

/* A failure this thread just saw (its um_last_error()) becomes op's text,
 * unless the path wrote one. */
static void keep_error_text(um_event *op) {
  if (op->error_text[0] == '\0')
    snprintf(op->error_text, sizeof(op->error_text), "%s", um_last_error());
}

/* The issuer's attachment goes, once (types.h: attached). */
static void drop_attached(um_event *op) {
  void (*drop)(um_event *) = op->attached_drop;
  op->attached_drop = NULL;
  if (drop != NULL)
    drop(op);
}

/* The operation this thread is starting natively (set around the
 * backend's xfer_async), so that native_done can tell a completion reported
 * inside that call: it is finished once the call returned. */
static _Thread_local um_event *starting_native;


/* Whether a report from d on this thread is finished here, without waking
 * a worker: the driver allows it in its callbacks, or this thread is one
 * of the backend's own. */
static bool finish_here(const um_device *d) { return d->be->callbacks_reenter || um__completes_inline; }

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
static void retire_where_it_may_block(um_buffer *b) {
  if (!um__completes_inline) {
    um__buffer_retire(b, NULL);
    return;
  }
  um__engine_op_begin(b->m);
  b->retire_work.fn = retire_task;
  um__engine_push(b->m, &b->retire_work, true);
}

/* A native operation finished, on a driver thread (or inside xfer_async on
 * the issuing thread). Finishing it right here where the backend allows
 * saves a worker wake-up per operation: on PoCL, 1000 queued 4 KiB writes
 * cost 5.9 us each with the hand-off to a worker, 2.2 to 3.1 us without. */
static void native_done(void *arg, int status) {
  um_event *op = arg;
  op->native_status = status;
  if (!finish_here(op->native_dev))
    engine_push_op(op, op_task_complete, true); /* completions first */
  else if (starting_native == op)
    op->complete_deferred = true;
  else
    um__op_complete(op, status);
}

/* op goes to an in-order queue of its device (queued_q, from its plan) and
 * dep is queued there already, so the queue runs op after dep without a
 * token. */
static bool queued_before(um_event *dep, const um_event *op) {
  return op->queued_q >= 0 && atomic_load_explicit(&dep->queued_on, memory_order_acquire) == op->native_dev &&
         dep->queued_q == op->queued_q;
}

/* Under dep->lock: dep's token for a wait list, with one more owner, or
 * NULL when dep has finished or has not stored its token yet. The
 * operation's own share is put only after finish_op_locked took the token
 * under this lock, so a token seen here with dep not done is alive. */
static void *token_borrow_locked(um_event *dep) {
  void *native;
  if (atomic_load_explicit(&dep->state, memory_order_acquire) == UM__EV_DONE ||
      (native = atomic_load_explicit(&dep->native, memory_order_acquire)) == NULL)
    return NULL;
  um__atomic_add_relaxed(&dep->native_refs, 1);
  return native;
}

/* What finish_op_locked leaves in op->native: the operation finished, and
 * a token stored after it is the storer's to put. */
static char native_finished;
#define NATIVE_FINISHED ((void *)&native_finished)

/* Keep a started operation's token, or put it when the operation has
 * finished already. Until then op->native is NULL, which a later issuer
 * treats as "not started yet" and orders by registration instead. No lock:
 * the owners are counted before the token is published; op->native goes
 * from NULL to the token here, or to NATIVE_FINISHED in finish_op_locked,
 * whichever comes first (a compare-and-swap against an exchange); the
 * caller's share is handed over as um_event_release takes it (caller_holds
 * is set to false before caller_native is taken; here caller_native is
 * stored before caller_holds is read again: one of the two sees the
 * other, both sequentially consistent). */
static void keep_native(um_event *op, void *native) {
  void *expected = NULL;
  /* The caller's event keeps the token for um_event_native until it is
   * released. */
  bool caller = atomic_load(&op->caller_holds);
  atomic_store_explicit(&op->native_refs, 1 + (int)caller, memory_order_relaxed);
  if (op->queued_q >= 0)
    atomic_store_explicit(&op->queued_on, op->native_dev, memory_order_release);
  if (caller) {
    atomic_store(&op->caller_native, native);
    if (!atomic_load(&op->caller_holds)) /* released meanwhile */
      um__event_caller_native_drop(op);
  }
  if (!atomic_compare_exchange_strong_explicit(&op->native, &expected, native, memory_order_acq_rel,
                                               memory_order_acquire))
    um__event_token_put(op, op->native_dev, native); /* finished already: the operation's share */
}

/* Start op on its device's queue behind the tokens of after; the token is
 * kept. When the backend refuses it, op is not completed here: its failure's
 * text is kept and the failure returned, for the caller to complete it in
 * its turn (not before the operations it was to follow). */
static int start_native(um_event *op, void *const *after, int nafter) {
  void *native = NULL;
  int st;
  starting_native = op;
  st = op->path->start_native(op, after, nafter, native_done, &native);
  starting_native = NULL;
  if (st != UM_OK) {
    keep_error_text(op);
    return st;
  }
  keep_native(op, native);
  if (op->complete_deferred)
    um__op_complete(op, op->native_status);
  return UM_OK;
}

/* ------------------------------------------------------------------------ */
/* Buffers of an operation */

/* The buffers op touches: dst, and src when it is another buffer. */
static int op_buffers(const um_event *op, um_buffer **bufs) {
  int n = 0;
  if (op->dst)
    bufs[n++] = op->dst;
  if (op->src && op->src != op->dst)
    bufs[n++] = op->src;
  return n;
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
/* Open brackets: which operations wait for one
 *
 * A bracket (access.c) is held from um_access_begin to um_access_end: what
 * follows it, on its buffer or through other buffers' operations however
 * many, cannot finish before the caller ends it, so a blocking call whose
 * wait would pass through it is refused (um__buffer_waits_bracket_locked).
 * Each open bracket has a slot, one bit; an operation is marked when it is
 * published with the bits its unfinished predecessors carry (a bracket
 * also with its own), and it waits for an open bracket while one of its
 * bits is open. Marks are added only while some bracket is open: otherwise
 * an operation pays one relaxed load.
 *
 * A slot is free again as soon as its bracket ends, while operations
 * marked with it may still be in flight: each slot keeps the epoch at
 * which its bracket opened (a count of openings), each marked operation
 * the epoch it read when it was published (before anything else), and a
 * mark counts only when its slot opened no later than that: a later
 * bracket of the same slot cannot be one that the operation follows. The
 * last slot is shared by the brackets beyond the others: its mark counts
 * while any of them is open. */
#define SHARED_SLOT 63

static uint64_t slot_bit(int k) { return (uint64_t)1 << k; }

/* The marks of op, among marks, that name the bracket now in their slot. */
static uint64_t marks_current(const um_event *op, uint64_t marks) {
  uint64_t current = 0;
  for (; marks != 0; marks &= marks - 1) {
    int k = __builtin_ctzll(marks);
    if (atomic_load_explicit(&op->m->slot_epoch[k], memory_order_acquire) <= op->mark_epoch)
      current |= slot_bit(k);
  }
  return current;
}

void um__bracket_open(um_event *op) {
  um_manager *m = op->m;
  uint64_t open, epoch;
  int k;
  pthread_mutex_lock(&m->bracket_lock);
  open = um__atomic_load_relaxed(&m->brackets_open);
  for (k = 0; k < SHARED_SLOT && (open & slot_bit(k)); k++)
    ;
  if (k != SHARED_SLOT || m->bracket_shared++ == 0) {
    /* The slot's epoch before the counter's (release): whoever reads the
     * counter at this value or later sees it. */
    epoch = um__atomic_load_relaxed(&m->bracket_epoch) + 1;
    atomic_store_explicit(&m->slot_epoch[k], epoch, memory_order_relaxed);
    atomic_store_explicit(&m->bracket_epoch, epoch, memory_order_release);
  } else {
    epoch = um__atomic_load_relaxed(&m->slot_epoch[k]);
  }
  op->bracket_slot = k;
  op->bracket_marks = slot_bit(k);
  op->mark_epoch = epoch;
  /* Seen by every later operation on the bracket's buffer: they read it
   * under the buffer's lock, taken after the bracket is published. */
  atomic_fetch_or_explicit(&m->brackets_open, slot_bit(k), memory_order_release);
  pthread_mutex_unlock(&m->bracket_lock);
  um__engine_wake_drains(m); /* a synchronize draining stops waiting for it */
}

void um__bracket_close(um_event *op) {
  um_manager *m = op->m;
  int k = op->bracket_slot;
  pthread_mutex_lock(&m->bracket_lock);
  if (k != SHARED_SLOT || --m->bracket_shared == 0)
    atomic_fetch_and_explicit(&m->brackets_open, ~slot_bit(k), memory_order_relaxed);
  pthread_mutex_unlock(&m->bracket_lock);
}

/* Whether op, unfinished, waits for an open bracket other than those of
 * the bits in ignore. */
static bool marks_open(const um_event *op, uint64_t ignore) {
  uint64_t open = um__atomic_load_relaxed(&op->m->brackets_open) & ~ignore & op->bracket_marks;
  return open != 0 && atomic_load_explicit(&op->state, memory_order_acquire) != UM__EV_DONE &&
         marks_current(op, open) != 0;
}

bool um__op_waits_bracket(const um_event *op) { return marks_open(op, 0); }

bool um__buffer_waits_bracket_locked(const um_buffer *b, bool own_ends) {
  uint64_t own = 0;
  if (b->access_state != 0) {
    if (!own_ends || b->access_state != 2)
      return true;
    /* (A bracket of the shared slot ignores the others of that slot.) */
    own = slot_bit(b->access_op->bracket_slot);
  }
  return b->last != NULL && marks_open(b->last, own);
}

/* Under op's buffers' locks, as it is published: the marks of its
 * unfinished predecessors deps[0..n) that name open brackets. The epoch is
 * read first: a slot opened again after it cannot be one op follows. */
static void marks_inherit(um_event *op, um_event *const *deps, int n) {
  um_manager *m = op->m;
  uint64_t epoch = atomic_load_explicit(&m->bracket_epoch, memory_order_acquire);
  uint64_t open = um__atomic_load_relaxed(&m->brackets_open), marks = 0;
  for (int i = 0; i < n; i++)
    marks |= marks_current(deps[i], deps[i]->bracket_marks & open);
  if (marks != 0) {
    op->bracket_marks |= marks;
    op->mark_epoch = epoch; /* a bracket's own mark holds at it too */
  }
}

/* ------------------------------------------------------------------------ */
/* Completion order: the gate */

/* Under the buffers' locks, or before op can be seen by another thread:
 * op follows p, unfinished, on a buffer; the node takes over a reference
 * to p. op's array has room (two for an operation, one per buffer; a run
 * reserves its own, run_reserve). */
static void prior_add(um_event *op, um_event *p) {
  um__prior *n;
  if (op->priors == NULL)
    op->priors = op->prior_space;
  n = &op->priors[op->npriors++];
  n->prior = p;
  n->waiter = op;
  n->next = NULL;
}

/* op finished with status: whether it may be reported done now, every
 * operation it follows having been. Otherwise it waits, its status kept,
 * in the prior_waiters of those that have not, and the last of them to
 * complete finishes it (gate_release). Runs once per operation. */
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
    if (atomic_load_explicit(&p->state, memory_order_acquire) != UM__EV_DONE) {
      pthread_mutex_lock(&p->lock);
      waits = atomic_load_explicit(&p->state, memory_order_acquire) != UM__EV_DONE;
      if (waits) {
        um__atomic_add_relaxed(&op->priors_pending, 1);
        node->next = p->prior_waiters;
        p->prior_waiters = node;
      }
      pthread_mutex_unlock(&p->lock);
    }
    if (!waits)
      um__event_unref(p);
  }
  return um__atomic_sub_acq_rel(&op->priors_pending, 1) == 1;
}

/* op completed; waiters are the nodes of the operations that waited for it
 * at their gates (taken under op->lock with its DONE state). Each drops its
 * reference to op (the caller still holds one: the engine's), and those op
 * was the last for go on *ready, to be finished by the caller. */
static void gate_release(um_event *op, um__prior *waiters, um_event **ready) {
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
      run_finish(op->run, &ready);
    else
      op_finish(op, op->gate_status, &ready);
  }
}

/* ------------------------------------------------------------------------ */
/* Completion */

/* The operations registered to follow op (op_register), taken under
 * op->lock as it finishes, started once no lock is held. */
typedef struct followers {
  um_event *first[UM__MAX_DEPENDENTS];
  int n;
  um_event **more;
  int nmore;
} followers;

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
    engine_push_op(f, op_task_start, false);
}

static void followers_start(followers *f) {
  for (int i = 0; i < f->n; i++)
    follower_ready(f->first[i]);
  for (int i = 0; i < f->nmore; i++)
    follower_ready(f->more[i]);
  free(f->more);
}

/* Under op->lock: op finished with status; its followers go to f, the
 * nodes waiting for it at their gates to *waiters. Returns its token. */
static void *finish_op_locked(um_event *op, int status, followers *f, um__prior **waiters, bool *wake) {
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
  native = finish_op_locked(op, status, f, waiters, wake);
  pthread_mutex_unlock(&op->lock);
  return native;
}

/* A member of group failed: the group carries the first failure, with its
 * text (written before the member counts as done, read once the group is). */
static void group_record_failure(um_event *group, int status, const char *text) {
  int expected = UM_OK;
  if (atomic_compare_exchange_strong(&group->group_first_error, &expected, status))
    snprintf(group->error_text, sizeof(group->error_text), "%s", text != NULL ? text : "");
}

/* A batch member finished: the batch completes with its last member,
 * carrying the first failure. */
static void group_member_done(um_event *group, int status, const char *text) {
  if (status != UM_OK)
    group_record_failure(group, status, text);
  if (um__atomic_sub_acq_rel(&group->deps_pending, 1) == 1)
    um__op_complete(group, atomic_load(&group->group_first_error));
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
  drop_attached(op);
  lock_buffers(bufs, nbufs);
  native = finish_locked(op, status, bufs, nbufs, drop_last, retire, &f, &waiters, &wake);
  unlock_buffers(bufs, nbufs);
  for (int i = 0; i < nbufs; i++) {
    if (drop_last[i])
      um__event_unref(op); /* not the last reference: the engine holds one */
    if (retire[i])
      retire_where_it_may_block(bufs[i]);
  }
  /* Waiters are woken after the unlock, so that they do not wake only to
   * block on the lock; the engine's reference keeps op alive meanwhile. */
  if (wake)
    pthread_cond_broadcast(&op->cond);
  if (native != NULL)
    um__event_token_put(op, ndev, native);
  gate_release(op, waiters, ready);
  if (group != NULL)
    group_member_done(group, status, op->error_text[0] != '\0' ? op->error_text : NULL);
  followers_start(&f);
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

static void op_task_complete(um__work *w) {
  um_event *op = op_of(w);
  um__op_complete(op, op->native_status);
}

/* Queue a UM__XFER_QUEUE_MARK on queue q of d: done(arg, status) once
 * everything queued there before it has run. The mark's token is not
 * kept. */
static int queue_mark(um_device *d, int q, um__done_fn done, void *arg) {
  um__xfer x;
  void *token = NULL;
  int st;
  memset(&x, 0, sizeof(x));
  x.kind = UM__XFER_QUEUE_MARK;
  x.queue = q;
  st = d->be->xfer_async(d->bdev, &x, NULL, 0, done, arg, &token);
  if (st == UM_OK && d->be->native_release != NULL)
    d->be->native_release(d->bdev, token); /* done may have run already */
  return st;
}

/* The mark behind a refused operation ran: it fails now, with its refusal
 * (op->native_status), whatever the mark says. */
static void refused_marked(void *arg, int status) {
  um_event *op = arg;
  (void)status;
  if (finish_here(op->native_dev))
    um__op_complete(op, op->native_status);
  else
    engine_push_op(op, op_task_complete, true);
}

/* op was refused by its device's queue (status st) and whatever it was
 * ordered after by registration has finished: it fails. On a single-queue
 * device, operations it follows may still be queued there with nothing
 * recorded (queued_before: the queue was to order them): completed now, it
 * would let a later operation that the queue does not order (a peer copy
 * run by another device, a host path) overtake them. So it fails behind a
 * queue mark; when the mark is refused too, after the backend's
 * synchronize (which waits for everything queued on the device). */
static void complete_refused(um_event *op, int st) {
  um_device *d = op->native_dev;
  op->native_status = st;
  if (d != NULL && d->be->single_queue) {
    if (queue_mark(d, 0, refused_marked, op) == UM_OK)
      return;
    (void)d->be->synchronize(d->bdev);
  }
  um__op_complete(op, st);
}

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
    if ((st = start_native(op, NULL, 0)) != UM_OK)
      complete_refused(op, st);
    if (!held)
      um__event_unref(op);
    return;
  }
  run_host(op);
}

/* A worker starts an operation its last dependency handed over, unless it
 * was canceled meanwhile. */
static void op_task_start(um__work *w) {
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
    complete_refused(op, op->native_status);
    return;
  }
  UM__TEST_POINT(UM__TP_WORKER_RUN, op);
  run_started(op, false);
  UM__TEST_POINT(UM__TP_WORKER_DONE, op);
}

/* Nothing to wait for: start op now, on its device's queue, on this thread
 * (blocking, small enough, or an asynchronous start), or on a worker.
 * held: as for run_started. */
static void op_start_now(um_event *op, bool held) {
  if (op->native_dev != NULL || op->blocking || op->path->start_async != NULL ||
      um__path_runs_inline(op)) {
    atomic_store_explicit(&op->state, UM__EV_RUNNING, memory_order_release);
    run_started(op, held);
  } else {
    engine_push_op(op, op_task_start, false);
  }
}

/* ------------------------------------------------------------------------ */
/* Issuing: the steps of um__op_issue */

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

int um__op_bracket_error(const um_buffer *b) {
  if (b->access_state != 0)
    return um__set_error(UM_ESTATE,
                         "buffer %p is inside an open um_access_begin bracket: a blocking call would wait for "
                         "um_access_end; pass an event, or end the bracket first",
                         (const void *)b);
  return um__set_error(UM_ESTATE,
                       "buffer %p: its operations wait for an open um_access_begin bracket (of another buffer, "
                       "through the operations they follow): a blocking call would wait for that "
                       "um_access_end; pass an event, or end the bracket first",
                       (const void *)b);
}

/* Under the locks: op's dependencies are the buffers' unfinished last
 * operations (one reference each into deps). *all_native stays true when
 * every one of them runs on op's device queue. */
/* Whether an operation on device a can wait for one on device b on a's
 * queue: b is a, or the backend lets a's wait lists hold b's tokens (an
 * OpenCL context's devices; CUDA devices). */
static bool tokens_reach(um_device *a, um_device *b) {
  return b == a || (b != NULL && a->be == b->be && a->be->tokens_shared != NULL &&
                    a->be->tokens_shared(a->bdev, b->bdev) == 1);
}

static int op_collect_deps(um_event *op, um_buffer **bufs, int nbufs, um_event **deps,
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
      if (op->native_dev == NULL || !tokens_reach(op->native_dev, last->native_dev))
        *all_native = false;
    }
    bufs[i]->pending++;
  }
  if (ndeps > 0 && __builtin_expect(um__atomic_load_relaxed(&op->m->brackets_open) != 0, 0))
    marks_inherit(op, deps, ndeps);
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
static void follow_replaced(um_event *op, um_event **old_last, int n) {
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
 * operations it replaced (follow_replaced). The buffers' references, and
 * extra_refs more for the caller, are taken at once before anyone can see
 * op. */
static void op_publish(um_event *op, um_buffer **bufs, int nbufs, int extra_refs) {
  um_event *old_last[2] = {NULL, NULL};
  um__atomic_add_relaxed(&op->refs, nbufs + extra_refs);
  for (int i = 0; i < nbufs; i++) {
    old_last[i] = bufs[i]->last;
    bufs[i]->last = op;
  }
  unlock_buffers(bufs, nbufs);
  follow_replaced(op, old_last, nbufs);
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

static bool op_register(um_event *op, um_event **deps, int ndeps);

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
  if (!op_register(op, deps, ndeps))
    complete_refused(op, st); /* they finished meanwhile */
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
    st = start_native(op, after, nafter);
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
static bool op_register(um_event *op, um_event **deps, int ndeps) {
  /* The extra count is a guard so that a dependency completing during
   * registration cannot start op early. */
  atomic_store(&op->deps_pending, 1);
  for (int i = 0; i < ndeps; i++) {
    um_event *d = deps[i];
    bool full = false;
    pthread_mutex_lock(&d->lock);
    if (atomic_load_explicit(&d->state, memory_order_acquire) != UM__EV_DONE) {
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
    um__event_unref(d);
  }
  return um__atomic_sub_acq_rel(&op->deps_pending, 1) != 1;
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
    op_start_now(op, true);
  } else if (ndeps > 0 && all_native && op_start_after_tokens(op, deps, ndeps)) {
    /* started on the device queue, behind its dependencies */
  } else if (ndeps > 0 && op_register(op, deps, ndeps)) {
    /* the last dependency to finish starts it */
  } else {
    op_start_now(op, true);
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
  if ((st = op_check_locked(op, bufs, nbufs)) != UM_OK) {
    unlock_buffers(bufs, nbufs);
    drop_attached(op);
    um__event_unref(op); /* never published: the caller's only reference */
    return st;
  }
  um__path_plan(op);
  ndeps = op_collect_deps(op, bufs, nbufs, deps, &all_native);
  if (op->blocking && ndeps == 0) {
    op_priors_unpublished(op, bufs, nbufs);
    unlock_buffers(bufs, nbufs);
    return op_run_unpublished(op);
  }
  op_publish(op, bufs, nbufs, 1); /* and the issuing reference: the caller's
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

/* ------------------------------------------------------------------------ */
/* Held operations (a bracket: access.c): published now, started later */

int um__op_hold(um_event *op, um_event **dep) {
  um_buffer *bufs[2];
  um_event *deps[2];
  int nbufs = op_buffers(op, bufs), ndeps, st;
  bool all_native;
  lock_buffers(bufs, nbufs);
  if ((st = op_check_locked(op, bufs, nbufs)) != UM_OK) {
    unlock_buffers(bufs, nbufs);
    drop_attached(op);
    um__bracket_close(op); /* never published: its slot goes at once */
    um__event_unref(op);
    return st;
  }
  um__path_plan(op);
  ndeps = op_collect_deps(op, bufs, nbufs, deps, &all_native);
  op_publish(op, bufs, nbufs, 0);
  for (int i = 1; i < ndeps; i++) /* one buffer: at most one */
    um__event_unref(deps[i]);
  *dep = ndeps > 0 ? deps[0] : NULL;
  return UM_OK;
}

void um__op_start_held(um_event *op, um_event *after) {
  if (after != NULL && op_register(op, &after, 1))
    return; /* it starts when after finishes */
  op_start_now(op, false);
}

void um__op_issue_after(um_event *op, um_event *after) {
  um__engine_op_begin(op->m);
  um__op_start_held(op, after);
}

void *um__op_token_borrow(um_event *dep, um_device *d) {
  void *tok = NULL;
  pthread_mutex_lock(&dep->lock);
  if (dep->native_dev == d)
    tok = token_borrow_locked(dep);
  pthread_mutex_unlock(&dep->lock);
  return tok;
}

/* ------------------------------------------------------------------------ */
/* Groups (um_copy_batch): an operation that completes with its members */

/* Runs. A batch's copies that go to an in-order queue of a device (an
 * OpenCL device's one queue; a CUDA device's stream for their kind of
 * transfer: queue_of), with nothing to wait for but what that queue orders
 * anyway, are queued there with no event, no callback and no flush of their
 * own (on PoCL those cost more than a 4 KiB write; on CUDA an event and its
 * report cost more than the copy), and with no operation object either:
 * the queue's run, one operation of kind RUN, stands for all of them. It becomes the
 * last operation of every buffer they touch (one pending count per buffer,
 * however many copies), and completes when a queue mark behind them does:
 * the end of the group's issuing queues one mark per run. Completing 1000
 * copies is then one pass over a few buffers, not 1000 completions.
 *
 * A copy whose buffer's last operation is anything else (running on host
 * threads or another device, or another thread's open run) is issued as an
 * operation of its own, ordered as any other.
 *
 * Until its mark is queued, a run is not queued_on its device: another
 * thread's operation on one of its buffers follows it by registration, as
 * the run's copies are still being queued. Then queued_on says that every
 * copy of the run is on the queue, and a later transfer of that queue
 * follows it with no token. */
#define RUN_INLINE_BUFFERS 4
#define RUN_PATHS 4

typedef struct um__run {
  um_device *dev;
  um_event *op; /* kind RUN: the last operation of bufs; its queued_q is
                   the queue of dev that the copies go to */
  /* The buffers op is last on, one pending count each. */
  um_buffer **bufs;
  int nbufs, capbufs;
  um_buffer *inline_bufs[RUN_INLINE_BUFFERS];
  /* The copies queued, by path, for the statistics. */
  struct {
    const um__path *path;
    uint64_t n, bytes;
  } tally[RUN_PATHS];
  int ntally;
  /* Room in op->priors: its prior_space, then a heap array. */
  int cappriors;
  int status;
  um__work work; /* completing on a worker, for backends whose callbacks
                    may not re-enter */
  struct um__run *next;
} um__run;

static um__run *run_new(um_event *group, um_device *d, int q) {
  um__run *r = calloc(1, sizeof(*r));
  if (r == NULL)
    return NULL;
  if ((r->op = um__event_new(group->m, UM__OP_RUN)) == NULL) {
    free(r);
    return NULL;
  }
  r->dev = d;
  r->op->queued_q = q;
  r->bufs = r->inline_bufs;
  r->capbufs = RUN_INLINE_BUFFERS;
  r->op->run = r;
  r->op->priors = r->op->prior_space;
  r->cappriors = (int)(sizeof(r->op->prior_space) / sizeof(r->op->prior_space[0]));
  r->op->native_dev = d;
  r->op->group = group;
  r->op->detached = true;
  atomic_store_explicit(&r->op->state, UM__EV_RUNNING, memory_order_release);
  um__atomic_add_relaxed(&group->deps_pending, 1); /* the run is a member */
  um__engine_op_begin(group->m);
  r->next = group->runs;
  group->runs = r;
  return r;
}

/* The open run of group on queue q of d, or NULL. */
static um__run *open_run_on(um_event *group, const um_device *d, int q) {
  for (um__run *r = group->runs; r != NULL; r = r->next)
    if (r->dev == d && r->op->queued_q == q)
      return r;
  return NULL;
}

/* The open run of group on queue q of d, made on first use; NULL when out
 * of memory. */
static um__run *run_of(um_event *group, um_device *d, int q) {
  um__run *r = open_run_on(group, d, q);
  return r != NULL ? r : run_new(group, d, q);
}

/* An array of n elements of size bytes, room for *cap, in first or on the
 * heap: with room for two more, moved to a heap array twice as large when
 * full. NULL when out of memory (arr is unchanged). */
static void *room_for_two(void *arr, const void *first, int n, int *cap, size_t size) {
  void *grown;
  if (n + 2 <= *cap)
    return arr;
  if ((grown = malloc((size_t)*cap * 2 * size)) == NULL)
    return NULL;
  memcpy(grown, arr, (size_t)n * size);
  if (arr != first)
    free(arr);
  *cap *= 2;
  return grown;
}

/* Room for two more buffers in r->bufs, and two more priors of its
 * operation (before the run's gate only this thread reads them, so they
 * may move). */
static bool run_reserve(um__run *r) {
  um_event *op = r->op;
  um__prior *priors = room_for_two(op->priors, op->prior_space, op->npriors, &r->cappriors, sizeof(*priors));
  um_buffer **bufs;
  if (priors == NULL)
    return false;
  op->priors = priors;
  if ((bufs = room_for_two(r->bufs, r->inline_bufs, r->nbufs, &r->capbufs, sizeof(*bufs))) == NULL)
    return false;
  r->bufs = bufs;
  return true;
}

/* The tally of member's path in r, or NULL when r counts RUN_PATHS others
 * (the copy paths are fewer). */
static bool run_can_tally(um__run *r, const um__path *path) {
  for (int i = 0; i < r->ntally; i++)
    if (r->tally[i].path == path)
      return true;
  return r->ntally < RUN_PATHS;
}

static void run_tally(um__run *r, const um__path *path, uint64_t n, uint64_t bytes) {
  int i = 0;
  while (i < r->ntally && r->tally[i].path != path)
    i++;
  if (i == r->ntally) {
    r->tally[i].path = path;
    r->ntally++;
  }
  r->tally[i].n += n;
  r->tally[i].bytes += bytes;
}

/* Under the member's buffers' locks, planned: whether it may go in the run
 * of its device's queue q: a single backend call on an in-order queue
 * (queue_of), every buffer idle, or its last operation done, queued on that
 * queue, or the run itself. */
static bool run_takes(const um_event *member, um_buffer **bufs, int nbufs, int q, const um__run *open) {
  if (q < 0 || member->path->account_queued == NULL)
    return false;
  for (int i = 0; i < nbufs; i++) {
    um_event *last = bufs[i]->last;
    if (last != NULL && (open == NULL || last != open->op) &&
        atomic_load_explicit(&last->state, memory_order_acquire) != UM__EV_DONE && !queued_before(last, member))
      return false;
  }
  return true;
}

/* An op of a checked batch as member (a stack operation), with its
 * buffers' generations. They are read after the batch's check, so the
 * ranges are checked again: a buffer released since and handed to a new
 * (maybe smaller) owner is refused under its lock by its generation, and
 * must not be written past its end before that. */
static bool in_range(const um_buffer *b, size_t off, size_t bytes) {
  return b == NULL || (off <= b->size && bytes <= b->size - off);
}

static int member_describe(const um_copy_op *o, um_event *member) {
  int st;
  if ((o->dst && (st = um__buffer_check_owner(o->dst, &member->dst_gen)) != UM_OK) ||
      (o->src && (st = um__buffer_check_owner(o->src, &member->src_gen)) != UM_OK))
    return st;
  if (!in_range(o->dst, o->dst_off, o->bytes) || !in_range(o->src, o->src_off, o->bytes))
    return um__set_error(UM_ERANGE, "batch op outside a buffer released and reused since the check");
  member->kind = UM__OP_COPY;
  member->dst = o->dst, member->dst_off = o->dst_off;
  member->src = o->src, member->src_off = o->src_off;
  member->host_src = o->host_src, member->host_dst = o->host_dst;
  member->bytes = o->bytes;
  return UM_OK;
}

/* Whether p goes the way o does: the same buffers and host sides and the
 * same size, which is all a plan reads (but the offsets, when one buffer is
 * both ends: the ranges may overlap), and p's ranges hold (checked under
 * the buffers' locks, o's generations). */
static bool same_way(const um_copy_op *o, const um_copy_op *p) {
  return p->dst == o->dst && p->src == o->src && o->dst != o->src && p->bytes == o->bytes &&
         (p->host_src == NULL) == (o->host_src == NULL) && (p->host_dst == NULL) == (o->host_dst == NULL) &&
         in_range(p->dst, p->dst_off, p->bytes) && in_range(p->src, p->src_off, p->bytes);
}

/* Under the member's buffers' locks: the run's operation becomes their
 * last one (the references on the ones it replaces go to old_last[], to
 * be dropped once the locks are). */
static void run_join_locked(um__run *r, um_event *member, um_buffer **bufs, int nbufs, um_event **old_last) {
  for (int i = 0; i < nbufs; i++) {
    if (bufs[i]->last == r->op)
      continue;
    old_last[i] = bufs[i]->last;
    um__event_ref(r->op);
    bufs[i]->last = r->op;
    bufs[i]->pending++;
    r->bufs[r->nbufs++] = bufs[i];
  }
  /* As op_collect_deps: a destination without a host view has its current
   * data on the device only. */
  if (member->dst != NULL && member->dst->mem.host == NULL)
    member->dst->valid = UM_VALID_DEVICE;
}

/* Queue ops[0..k) through member, quietly: no token, no report
 * (backend.h); the run's mark reports them. How many were queued. */
static size_t run_queue_quiet(um_event *group, um_event *member, const um_copy_op *ops, size_t k) {
  size_t queued = 0;
  int st;
  for (size_t j = 0; j < k; j++) {
    if (j > 0) {
      member->dst_off = ops[j].dst_off, member->src_off = ops[j].src_off;
      member->host_src = ops[j].host_src, member->host_dst = ops[j].host_dst;
    }
    if ((st = member->path->start_native(member, NULL, 0, NULL, NULL)) != UM_OK)
      group_record_failure(group, st, um_last_error());
    else
      queued++;
  }
  return queued;
}

/* Issue member, the first of ops[0..n) (checked), and the ops after it that
 * go the same way, as copies of their device's run: true when they were
 * (queued, or failed and counted as the group's failure), *taken of them;
 * false when member must be an operation of its own. The buffers are
 * checked and the run published on them once for all of them, under their
 * locks; the copies are queued with no lock held. */
static bool segment_in_run(um_event *group, um_event *member, const um_copy_op *ops, size_t n, size_t *taken) {
  um_buffer *bufs[2];
  um_event *old_last[2] = {NULL, NULL};
  int nbufs = op_buffers(member, bufs), st, q;
  size_t k = 1, queued;
  um__run *r;
  lock_buffers(bufs, nbufs);
  if ((st = op_check_locked(member, bufs, nbufs)) != UM_OK) {
    unlock_buffers(bufs, nbufs);
    group_record_failure(group, st, um_last_error());
    *taken = 1;
    return true;
  }
  um__path_plan(member);
  q = member->queued_q;
  if (!run_takes(member, bufs, nbufs, q, open_run_on(group, member->native_dev, q)) ||
      (r = run_of(group, member->native_dev, q)) == NULL || !run_reserve(r) ||
      !run_can_tally(r, member->path)) {
    unlock_buffers(bufs, nbufs);
    return false;
  }
  run_join_locked(r, member, bufs, nbufs, old_last);
  while (k < n && same_way(&ops[0], &ops[k]))
    k++;
  unlock_buffers(bufs, nbufs);
  follow_replaced(r->op, old_last, nbufs);
  queued = run_queue_quiet(group, member, ops, k);
  run_tally(r, member->path, queued, queued * member->bytes);
  *taken = k;
  return true;
}

/* The run is done with r->status (its mark's), and reported so: the
 * copies' statistics, then its buffers, its state, waiters and followers,
 * then the group. The operations it lets through go on *ready. */
static void run_finish(um__run *r, um_event **ready) {
  um_event *op = r->op, *group = op->group;
  um_manager *m = op->m;
  um__prior *waiters;
  followers f;
  bool wake;
  if (r->status == UM_OK)
    for (int i = 0; i < r->ntally; i++)
      r->tally[i].path->account_queued(r->dev, r->tally[i].n, r->tally[i].bytes);
  for (int i = 0; i < r->nbufs; i++) {
    um_buffer *b = r->bufs[i];
    bool drop_last, retire;
    pthread_mutex_lock(&b->lock);
    um__buffer_op_finish_locked(b, op, &drop_last, &retire);
    pthread_mutex_unlock(&b->lock);
    if (drop_last)
      um__event_unref(op); /* not the last reference: the engine holds one */
    if (retire)
      retire_where_it_may_block(b);
  }
  pthread_mutex_lock(&op->lock);
  finish_op_locked(op, r->status, &f, &waiters, &wake);
  pthread_mutex_unlock(&op->lock);
  if (wake)
    pthread_cond_broadcast(&op->cond);
  if (r->bufs != r->inline_bufs)
    free(r->bufs);
  if (op->priors != op->prior_space)
    free(op->priors);
  op->priors = NULL;
  op->run = NULL;
  gate_release(op, waiters, ready);
  group_member_done(group, r->status, op->error_text[0] != '\0' ? op->error_text : NULL);
  free(r);
  followers_start(&f);
  um__event_unref(op);
  um__engine_op_done(m);
}

/* The run finished: reported done once the operations it follows are. */
static void run_complete(um__run *r) { um__op_complete(r->op, r->status); }

static void run_task(um__work *w) {
  run_complete((um__run *)(void *)((char *)w - offsetof(um__run, work)));
}

/* The run's mark finished (a driver's thread, or the issuing thread inside
 * close_runs). A failure's text is this thread's. */
static void run_marked(void *arg, int status) {
  um__run *r = arg;
  r->status = status;
  if (status != UM_OK)
    keep_error_text(r->op);
  if (finish_here(r->dev)) {
    run_complete(r);
  } else {
    r->work.fn = run_task;
    um__engine_push(r->dev->m, &r->work, true);
  }
}

/* The end of the batch's issuing: one queue mark per run. A refused mark
 * fails the run's members, but only once their transfers are done (the
 * backend's synchronize): they may still be reading or writing the
 * caller's host memory, which a blocking batch hands back when it
 * returns. */
static void close_runs(um_event *group) {
  while (group->runs != NULL) {
    um__run *r = group->runs;
    um_device *d = r->dev; /* r may be gone once the mark is queued */
    int st;
    group->runs = r->next;
    atomic_store_explicit(&r->op->queued_on, d, memory_order_release);
    if ((st = queue_mark(d, r->op->queued_q, run_marked, r)) != UM_OK) {
      (void)d->be->synchronize(d->bdev);
      r->status = st;
      keep_error_text(r->op);
      run_complete(r);
    }
  }
}

/* A member as an operation of its own, issued as any other (detached: no
 * caller event, no wait). */
static void member_issue(um_event *group, const um_event *member) {
  um_event *op = um__event_new(group->m, member->kind);
  int st;
  if (op == NULL) {
    group_record_failure(group, UM_ENOMEM, "out of memory for an operation");
    return;
  }
  op->dst = member->dst, op->dst_off = member->dst_off, op->dst_gen = member->dst_gen;
  op->src = member->src, op->src_off = member->src_off, op->src_gen = member->src_gen;
  op->host_src = member->host_src, op->host_dst = member->host_dst;
  op->bytes = member->bytes;
  op->value = member->value;
  op->group = group;
  op->detached = true;
  um__atomic_add_relaxed(&group->deps_pending, 1);
  if ((st = um__op_issue(op, NULL)) != UM_OK)
    group_member_done(group, st, um_last_error()); /* a buffer released meanwhile */
}

void um__op_group_copies(um_event *group, const um_copy_op *ops, size_t n) {
  um_event member; /* never published: a description */
  memset(&member, 0, sizeof(member));
  member.m = group->m;
  member.group = group;
  member.detached = true;
  for (size_t i = 0, taken; i < n; i += taken) {
    int st = member_describe(&ops[i], &member);
    taken = 1;
    if (st != UM_OK) /* a buffer released meanwhile: recorded, go on */
      group_record_failure(group, st, um_last_error());
    else if (!segment_in_run(group, &member, ops + i, n - i, &taken))
      member_issue(group, &member);
  }
}

um_event *um__op_group_begin(um_manager *m, bool blocking) {
  um_event *group = um__event_new(m, UM__OP_GROUP);
  if (group == NULL)
    return NULL;
  group->blocking = blocking; /* its members refuse to wait for a bracket */
  atomic_store(&group->deps_pending, 1); /* guard until every member is issued */
  atomic_store_explicit(&group->state, UM__EV_RUNNING, memory_order_release);
  um__engine_op_begin(m);
  um__event_ref(group); /* the issuing reference */
  return group;
}

int um__op_group_end(um_event *group, um_event **done) {
  int st;
  close_runs(group);
  group_member_done(group, UM_OK, NULL); /* the guard */
  if (done == NULL) {
    st = um__event_wait_result(group);
    um__event_unref(group);
    return st;
  }
  atomic_store_explicit(&group->caller_holds, true, memory_order_relaxed);
  *done = group;
  return UM_OK;
}

/* ------------------------------------------------------------------------ */
/* What the layers below call up into (mem.h, "Calls up") */

__attribute__((constructor)) static void register_upcalls(void) {
  um__upcall.ops.waits_bracket_locked = um__buffer_waits_bracket_locked;
}
