/* Groups (um_copy_batch): one operation that completes with its members,
 * most of them queued quietly in a run per device queue with no operation
 * of their own, the others issued as operations. Apart from op.c because a
 * run is a different object (one operation standing for many copies) with
 * its own issue, join and finish; it reuses op.c's check, plan and order.
 */
#include <stdlib.h>
#include <string.h>

#include "op_internal.h"

/* ------------------------------------------------------------------------ */
/* Groups (um_copy_batch): an operation that completes with its members */

/* A member of group failed: the group carries the first failure, with its
 * text (written before the member counts as done, read once the group is). */
void um__group_record_failure(um_event *group, int status, const char *text) {
  int expected = UM_OK;
  if (atomic_compare_exchange_strong(&group->batch.first_error, &expected, status))
    snprintf(group->error_text, sizeof(group->error_text), "%s", text != NULL ? text : "");
}

/* A batch member finished: the batch completes with its last member,
 * carrying the first failure. */
void um__group_member_done(um_event *group, int status, const char *text) {
  if (status != UM_OK)
    um__group_record_failure(group, status, text);
  if (um__atomic_sub_acq_rel(&group->deps_pending, 1) == 1)
    um__op_complete(group, atomic_load(&group->batch.first_error));
}

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
  r->next = group->batch.runs;
  group->batch.runs = r;
  return r;
}

/* The open run of group on queue q of d, or NULL. */
static um__run *open_run_on(um_event *group, const um_device *d, int q) {
  for (um__run *r = group->batch.runs; r != NULL; r = r->next)
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
  member->dst = o->dst, member->copy.dst_off = o->dst_off;
  member->src = o->src, member->copy.src_off = o->src_off;
  member->copy.host_src = o->host_src, member->copy.host_dst = o->host_dst;
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
  /* As um__op_collect_deps: a destination without a host view has its current
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
      member->copy.dst_off = ops[j].dst_off, member->copy.src_off = ops[j].src_off;
      member->copy.host_src = ops[j].host_src, member->copy.host_dst = ops[j].host_dst;
    }
    if ((st = member->path->start_native(member, NULL, 0, NULL, NULL)) != UM_OK)
      um__group_record_failure(group, st, um_last_error());
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
  if ((st = um__op_check_locked(member, bufs, nbufs)) != UM_OK) {
    unlock_buffers(bufs, nbufs);
    um__group_record_failure(group, st, um_last_error());
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
  um__follow_replaced(r->op, old_last, nbufs);
  queued = run_queue_quiet(group, member, ops, k);
  run_tally(r, member->path, queued, queued * member->bytes);
  *taken = k;
  return true;
}

/* The run is done with r->status (its mark's), and reported so: the
 * copies' statistics, then its buffers, its state, waiters and followers,
 * then the group. The operations it lets through go on *ready. */
void um__run_finish(um__run *r, um_event **ready) {
  um_event *op = r->op, *group = op->group;
  um_manager *m = op->m;
  um__prior *waiters;
  followers f;
  bool wake;
  if (r->status == UM_OK)
    for (int i = 0; i < r->ntally; i++) {
      const um__path *path = r->tally[i].path;
      path->account_queued(r->dev, r->tally[i].n, r->tally[i].bytes);
      if (__builtin_expect(op->obs_tag != 0, 0)) /* for the issuing thread's tag (core/observe.c) */
        um__obs_moved(m, op->obs_tag, r->dev,
                      path->kind == UM__XFER_H2D   ? UM__DIR_H2D
                      : path->kind == UM__XFER_D2H ? UM__DIR_D2H
                      : path->kind == UM__XFER_PEER ? UM__DIR_PEER
                                                    : UM__DIR_D2D,
                      r->tally[i].bytes);
    }
  for (int i = 0; i < r->nbufs; i++) {
    um_buffer *b = r->bufs[i];
    bool drop_last, retire;
    pthread_mutex_lock(&b->lock);
    um__buffer_op_finish_locked(b, op, &drop_last, &retire);
    pthread_mutex_unlock(&b->lock);
    if (drop_last)
      um__event_unref(op); /* not the last reference: the engine holds one */
    if (retire)
      um__retire_where_it_may_block(b);
  }
  pthread_mutex_lock(&op->lock);
  um__finish_op_locked(op, r->status, &f, &waiters, &wake);
  pthread_mutex_unlock(&op->lock);
  if (wake)
    pthread_cond_broadcast(&op->cond);
  if (r->bufs != r->inline_bufs)
    free(r->bufs);
  if (op->priors != op->prior_space)
    free(op->priors);
  op->priors = NULL;
  op->run = NULL;
  um__gate_release(op, waiters, ready);
  um__group_member_done(group, r->status, op->error_text[0] != '\0' ? op->error_text : NULL);
  free(r);
  um__followers_start(&f);
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
  while (group->batch.runs != NULL) {
    um__run *r = group->batch.runs;
    um_device *d = r->dev; /* r may be gone once the mark is queued */
    int st;
    group->batch.runs = r->next;
    atomic_store_explicit(&r->op->queued_on, d, memory_order_release);
    if ((st = um__queue_mark(d, r->op->queued_q, run_marked, r)) != UM_OK) {
      (void)um__dev_synchronize(d);
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
    um__group_record_failure(group, UM_ENOMEM, "out of memory for an operation");
    return;
  }
  op->dst = member->dst, op->copy.dst_off = member->copy.dst_off, op->dst_gen = member->dst_gen;
  op->src = member->src, op->copy.src_off = member->copy.src_off, op->src_gen = member->src_gen;
  op->copy.host_src = member->copy.host_src, op->copy.host_dst = member->copy.host_dst;
  op->bytes = member->bytes;
  op->copy.value = member->copy.value;
  op->group = group;
  op->detached = true;
  um__atomic_add_relaxed(&group->deps_pending, 1);
  if ((st = um__op_issue(op, NULL)) != UM_OK)
    um__group_member_done(group, st, um_last_error()); /* a buffer released meanwhile */
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
      um__group_record_failure(group, st, um_last_error());
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
  um__group_member_done(group, UM_OK, NULL); /* the guard */
  if (done == NULL) {
    st = um__event_wait_result(group);
    um__event_unref(group);
    return st;
  }
  atomic_store_explicit(&group->caller_holds, true, memory_order_relaxed);
  *done = group;
  return UM_OK;
}
