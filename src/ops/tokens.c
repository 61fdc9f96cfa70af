/* Native tokens: an operation started on its device's queue, the token
 * the backend gives back for it, kept without a lock and put by its last
 * owner, and the driver's report of its end (native_done), finished right
 * there where the backend allows it. Apart from op.c and complete.c
 * because the same token is touched by both, and by waiters (event.c) and
 * brackets (held.c), under a protocol of its own (keep_native).
 */
#include "op_internal.h"

/* The operation this thread is starting natively (set around the
 * backend's xfer_async), so that native_done can tell a completion reported
 * inside that call: it is finished once the call returned. */
static _Thread_local um_event *starting_native;

/* A native operation finished, on a driver thread (or inside xfer_async on
 * the issuing thread). Finishing it right here where the backend allows
 * saves a worker wake-up per operation (docs/design.md, Decisions:
 * "Completions inside the driver's callback"). */
static void native_done(void *arg, int status) {
  um_event *op = arg;
  op->native_status = status;
  if (!finish_here(op->native_dev))
    engine_push_op(op, um__op_task_complete, true); /* completions first */
  else if (starting_native == op)
    op->complete_deferred = true;
  else
    um__op_complete(op, status);
}

/* What um__finish_op_locked leaves in op->native: the operation finished, and
 * a token stored after it is the storer's to put. */
char um__native_finished;

/* Keep a started operation's token, or put it when the operation has
 * finished already. Until then op->native is NULL, which a later issuer
 * treats as "not started yet" and orders by registration instead. No lock:
 * the owners are counted before the token is published; op->native goes
 * from NULL to the token here, or to NATIVE_FINISHED in um__finish_op_locked,
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
int um__start_native(um_event *op, void *const *after, int nafter) {
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
  if (atomic_load_explicit(&op->rides, memory_order_relaxed) == 1)
    atomic_store(&op->rides, 2); /* its token protocol is set up: um__rider_token may give it one */
  if (op->complete_deferred)
    um__op_complete(op, op->native_status);
  return UM_OK;
}

/* Queue a UM__XFER_QUEUE_MARK on queue q of d: done(arg, status) once
 * everything queued there before it has run. The mark's token is not
 * kept. */
int um__queue_mark(um_device *d, int q, um__done_fn done, void *arg) {
  um__xfer x;
  void *token = NULL;
  int st;
  memset(&x, 0, sizeof(x));
  x.kind = UM__XFER_QUEUE_MARK;
  x.queue = q;
  st = um__dev_xfer_async(d, &x, NULL, 0, done, arg, &token);
  if (st == UM_OK)
    um__dev_native_release(d, token); /* done may have run already */
  return st;
}

/* dep, a bracket's end riding on its queue with no token (core/riders.c),
 * gets one now: a marker queued behind it there. An operation of another
 * queue can then wait for it in its wait list and be queued at once,
 * rather than registered and queued only once dep has completed (behind
 * whatever the caller queued meanwhile). The token is the operation's own
 * share, kept as keep_native keeps one; an operation that finished
 * meanwhile takes none. Without a token (the backend could not queue a
 * marker), dep is followed by registration, and a kick. */
void um__rider_token(um_event *dep) {
  void *tok = NULL, *expected = NULL;
  if (atomic_load(&dep->rides) != 2 || atomic_load_explicit(&dep->native, memory_order_acquire) != NULL ||
      atomic_load_explicit(&dep->state, memory_order_acquire) == UM__EV_DONE)
    return;
  if (um__dev_queue_mark_now(dep->native_dev, dep->queued_q, &tok) != UM_OK || tok == NULL)
    return;
  if (!atomic_compare_exchange_strong_explicit(&dep->native, &expected, tok, memory_order_acq_rel,
                                               memory_order_acquire))
    um__dev_native_release(dep->native_dev, tok); /* finished, or given one by another thread */
}
