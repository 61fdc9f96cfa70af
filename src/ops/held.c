/* Held operations: a bracket (access.c) is published on its buffer at
 * um_access_begin, like any other operation, so later ones wait for it,
 * but started only at um_access_end; a gate is an operation on no buffer
 * started once others have finished; and a bracket borrows the token of
 * the operation it follows. Apart from op.c because only the brackets of
 * interop/ take these steps, in this order.
 */
#include "op_internal.h"

/* ------------------------------------------------------------------------ */
/* Held operations (a bracket: access.c): published now, started later */

int um__op_hold(um_event *op, um_event **dep) {
  um_buffer *bufs[2];
  um_event *deps[2];
  int nbufs = op_buffers(op, bufs), ndeps, st;
  bool all_native;
  UM__TEST_POINT(UM__TP_HOLD_CHECKED, op);
  lock_buffers(bufs, nbufs);
  if ((st = um__op_check_locked(op, bufs, nbufs)) != UM_OK) {
    unlock_buffers(bufs, nbufs);
    drop_attached(op);
    um__bracket_close(op); /* never published: its slot goes at once */
    um__event_unref(op);
    return st;
  }
  um__path_plan(op);
  ndeps = um__op_collect_deps(op, bufs, nbufs, deps, &all_native);
  um__op_publish(op, bufs, nbufs, 0);
  for (int i = 1; i < ndeps; i++) /* one buffer: at most one */
    um__event_unref(deps[i]);
  *dep = ndeps > 0 ? deps[0] : NULL;
  return UM_OK;
}

/* op starts once the n operations of after (references, consumed) have
 * finished: now when n is 0 or all have. */
static void start_after(um_event *op, um_event **after, int n) {
  if (n > 0 && um__op_register(op, after, n))
    return; /* it starts when the last of them finishes */
  um__op_start_now(op, false);
}

void um__op_start_held(um_event *op, um_event *after) { start_after(op, &after, after != NULL); }

void um__op_issue_after(um_event *op, um_event **after, int n) {
  um__engine_op_begin(op->m);
  start_after(op, after, n);
}

void *um__op_token_borrow(um_event *dep, um_device *d) {
  void *tok = NULL;
  pthread_mutex_lock(&dep->lock);
  if (dep->native_dev == d)
    tok = token_borrow_locked(dep);
  pthread_mutex_unlock(&dep->lock);
  return tok;
}

/* A bracket's end rides on its queue's next command (core/riders.c): once
 * the backend has it listed, a follower already registered behind op, a
 * thread already waiting on it, or any wait under way gets it a command
 * at once. A registration or a wait that comes later kicks for itself
 * (op.c, event.c): each side looks under op's lock after its own step. */
void um__rider_added(um_event *op) {
  bool waited;
  pthread_mutex_lock(&op->lock);
  waited = op->ndependents > 0 || op->nmore_dependents > 0 || op->cond_waiters > 0 || op->prior_waiters != NULL;
  pthread_mutex_unlock(&op->lock);
  if (waited || um__riders_waited(op->m))
    um__dev_kick_riders(op->native_dev);
}
