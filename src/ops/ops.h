/* ops/: operations (issue, order, completion), native tokens, batches,
 * event objects and the worker engine, the copy paths, maps, streams. */
#ifndef UNIMEM_OPS_H
#define UNIMEM_OPS_H

#ifndef UM__SEES_OPS
#error "ops.h: this folder may not include ops/ (src/README.md)"
#endif

#include "core.h"

/* A transfer between host memory and [off, off + bytes) of b's block: H2D
 * and FILL write the block (dst), D2H reads it (src). */
static inline void um__xfer_host(um__xfer *x, um__xfer_kind kind, um_buffer *b, size_t off, void *host,
                                 size_t bytes) {
  memset(x, 0, sizeof(*x));
  x->kind = kind;
  x->bytes = bytes;
  x->host = host;
  if (kind == UM__XFER_D2H)
    x->src = &b->mem, x->src_loc = b->loc, x->src_off = off;
  else
    x->dst = &b->mem, x->dst_loc = b->loc, x->dst_off = off;
}


/* op.c: issue an operation filled in by the caller (kind, buffers, offsets,
 * bytes, the buffers' gen). Orders it after the buffers' earlier
 * operations, plans its path under their locks, starts it. done == NULL:
 * runs to completion and returns its status; else *done is the caller's
 * event. Takes over the caller's reference to op, issued or not. */
int um__op_issue(um_event *op, um_event **done);
/* UM_ESTATE for a blocking call on b inside an open bracket, or whose wait
 * passes through one (it would wait for um_access_end without end), with
 * the reason. */
int um__op_bracket_error(const um_buffer *b);
/* Open brackets (brackets.c): a bracket takes a slot before it is published
 * (open) and gives it back when it ends (close). Whether a wait for what
 * was issued on b (its lock held) would pass through an open bracket: b's
 * own, or one its operations follow on other buffers, however far back;
 * own_ends: b's own open bracket ends before the wait (a release), only
 * those it follows count. um__op_waits_bracket: the same for one
 * operation. Each costs one relaxed load when no bracket is open. */
void um__bracket_open(um_event *op);
void um__bracket_close(um_event *op);
bool um__buffer_waits_bracket_locked(const um_buffer *b, bool own_ends);
bool um__op_waits_bracket(const um_event *op);
/* complete.c: op finished with status (on any thread): buffers, waiters, followers. */
void um__op_complete(um_event *op, int status);
/* group.c: a group (um_copy_batch): begin it (blocking: no event asked for, so its
 * members refuse to wait for a bracket), issue its copies (checked, every
 * buffer of the group's manager; a copy that cannot be issued any more, its
 * buffer released meanwhile, counts as a failure of the group), end the
 * issuing (done as for um__op_issue). */
um_event *um__op_group_begin(um_manager *m, bool blocking);
void um__op_group_copies(um_event *group, const um_copy_op *ops, size_t n);
int um__op_group_end(um_event *group, um_event **done);
/* held.c: a held operation (a bracket): published on its buffers like any other
 * (later operations wait for it) but not started; *dep is the unfinished
 * operation it was ordered after (a reference), or NULL. start_held starts
 * it once after (a reference, consumed; NULL: now) has finished.
 * issue_after: an operation on no buffer (a gate), started once the n
 * operations of after (references, consumed; none NULL) have finished.
 * token_borrow: dep's token when it runs on d's queue and has
 * one (give it back with um__event_token_put), else NULL. */
int um__op_hold(um_event *op, um_event **dep);
void um__op_start_held(um_event *op, um_event *after);
void um__op_issue_after(um_event *op, um_event **after, int n);
void *um__op_token_borrow(um_event *dep, um_device *d);


/* path.c: one entry per way an operation runs. Entries are offered an
 * operation in table order (under its buffers' locks); the first whose
 * plan returns true runs it. plan may set op->native_dev (the device whose
 * queue runs it; start_native is then called instead of run). */
struct um__path {
  const char *name;
  bool (*plan)(um_event *op);
  /* Run to completion on the calling thread; the status. */
  int (*run)(um_event *op);
  /* Start on op->native_dev's queue after the transfers of after[] (tokens
   * of the same device), without waiting: backend.h's xfer_async contract.
   * NULL for host-thread paths. */
  int (*start_native)(um_event *op, void *const *after, int nafter, um__done_fn done, void **native);
  /* Count a finished operation's bytes and way in the statistics. */
  void (*account)(const um_event *op);
  /* Queued single-call paths: count n finished transfers of bytes in all
   * on d, the device whose queue ran them, as account counts one (a
   * batch's run, group.c). */
  void (*account_queued)(um_device *d, uint64_t n, uint64_t bytes);
  /* Single backend call paths: the transfer, and the device it runs on. */
  um_device *(*xfer)(const um_event *op, um__xfer *x);
  /* Operations of at most this many bytes run on the issuing thread even
   * when an event was asked for (host work cheaper than a hand-off). */
  size_t inline_bytes;
  /* start_native queues a command on the device's queue (not a join), a
   * transfer of this kind (what xfer fills in). */
  bool queued;
  /* Goes to the thread's queue of the caller's for its device, where the
   * thread has one (um_queue_use): the queued paths, and a bracket. */
  bool caller_queue;
  um__xfer_kind kind;
  /* Start host-side asynchronous work (no device queue) without blocking
   * the calling thread: UM_OK, then done(op, status) exactly once from any
   * thread, possibly before it returns (it then touches neither op nor its
   * attachment afterwards); or a failure (um_last_error() set), and done is
   * never called. A failure's text goes into op->error_text before done.
   * Taken instead of run when not NULL; op.c then starts the operation on
   * the issuing thread, or on a worker once its dependencies finished, and
   * no thread waits for the work itself. */
  int (*start_async)(um_event *op, um__done_fn done);
};
/* A path's account function that counts op->bytes in stats field
 * bytes_field and one transfer in xfer_field, on the device at one end of
 * the copy (src or dst). */
#define UM__PATH_ACCOUNT(name, end, bytes_field, xfer_field)                                      \
  static void name(const um_event *op) {                                                          \
    UM__STAT_ADD(op->end->dev, bytes_field, op->bytes);                                           \
    UM__STAT_ADD(op->end->dev, xfer_field, 1);                                                    \
  }
/* Choose op's path, and with it native_dev and queued_q (the in-order
 * queue of native_dev it goes to, -1 for none). */
void um__path_plan(um_event *op);
/* queue.c: the queue of the caller's that this thread's operations of
 * device d go to (um_queue_use), or -1. */
int um__queue_current(const um_device *d);
/* Whether dep is queued already on the in-order queue that op goes to. */
bool um__op_queued_before(um_event *dep, const um_event *op);
/* held.c: op, a bracket's end, rides on its queue (op->rides set before the
 * backend listed it): kick now if anything waits for it already. */
void um__rider_added(um_event *op);
/* tokens.c: dep rides on its queue with no token: give it one now, when
 * the backend can (an operation of another queue is to wait for it). */
void um__rider_token(um_event *dep);
bool um__path_runs_inline(const um_event *op);
/* The host side of a copy: its pointer, or the buffer's host view at the
 * offset; NULL when that end has no host view. Inline: every plan asks. */
static inline char *um__path_host_src(const um_event *op) {
  if (op->copy.host_src != NULL)
    return (char *)op->copy.host_src;
  return op->src->mem.host ? (char *)op->src->mem.host + op->copy.src_off : NULL;
}

static inline char *um__path_host_dst(const um_event *op) {
  if (op->copy.host_dst != NULL)
    return op->copy.host_dst;
  return op->dst->mem.host ? (char *)op->dst->mem.host + op->copy.dst_off : NULL;
}

/* b's memory is page-locked for device d: a PINNED block of d, or a
 * UM_WRAP_PIN wrap registered with d's backend. A copy between it and d's
 * memory is one direct DMA, with no staging. */
static inline bool um__path_dma_ready(const um_buffer *b, const um_device *d) {
  return b != NULL && ((b->loc == UM_PINNED && b->dev == d) || um__wrap_registered(b, d));
}
extern const um__path um__path_fill_host, um__path_fill_device, um__path_memcpy, um__path_h2d,
    um__path_d2h, um__path_local, um__path_peer;

/* staged.c: the multi-call paths of path.c's table */
extern const um__path um__path_h2d_pipelined, um__path_d2h_pipelined, um__path_staged,
    um__path_overlap;
/* The paths of the layers above (brackets, the net), added to the table
 * by their constructors. */
void um__path_add(const um__path *p);

/* event.c: event objects */
um_event *um__event_new(um_manager *m, um__op_kind kind);
void um__event_ref(um_event *e);
void um__event_unref(um_event *e);
int um__event_wait_internal(um_event *e);
/* um__event_wait_internal for a caller: on failure, um_last_error() of
 * the calling thread gets the operation's error_text (or the code's
 * meaning when it has none). */
int um__event_wait_result(um_event *e);
/* Drop one owner of e's token (e->native_refs); the last releases it. */
void um__event_token_put(um_event *e, um_device *ndev, void *native);
/* Drop the caller's share of e's token (um_event_release; tokens.c's
 * keep_native when the release came first). */
void um__event_caller_native_drop(um_event *e);
/* Destroy, before the devices close: the native tokens that events never
 * released still hold for um_event_native go back to their backends. */
void um__events_drop_natives(um_manager *m);
/* Manager destroy: free every event object. */
void um__events_free_all(um_manager *m);
/* A thread's cache goes (thread exit): its stash of event objects back to
 * the manager. */
void um__events_stash_flush(um_manager *m, um__tcache *tc);
/* engine.c: the engine. push: a worker will call w->fn(w) (first: ahead of
 * the queue). op_begin / op_done count the operations in flight; drain
 * waits until none is. op_done is the completing thread's last touch of the
 * manager. */
int um__engine_start(um_manager *m);
void um__engine_stop(um_manager *m);
void um__engine_push(um_manager *m, um__work *w, bool first);
void um__engine_op_begin(um_manager *m);
void um__engine_op_done(um_manager *m);
void um__engine_drain(um_manager *m);
/* drain_unless_bracket: as drain, but it stops once a bracket is open
 * (false then); wake_drains: a bracket opened, such drains look again. */
bool um__engine_drain_unless_bracket(um_manager *m);
void um__engine_wake_drains(um_manager *m);


#endif /* UNIMEM_OPS_H */
