/* What only the files of the operation layer share: op.c (issue),
 * complete.c (completion), tokens.c (native tokens), brackets.c, held.c and
 * group.c are the steps of one operation's life, split by job, and they
 * call one another here. The small helpers that the issue and completion
 * paths run on every operation are static inline, as they were inside one
 * file: splitting the file must not add a call to a copy. The rest is
 * declared with the file that defines it.
 */
#ifndef UNIMEM_OP_INTERNAL_H
#define UNIMEM_OP_INTERNAL_H

#include <stdio.h>
#include <string.h>

#include "ops.h"

/* ------------------------------------------------------------------------ */
/* Inline helpers */

static inline um_event *op_of(um__work *w) {
  return (um_event *)(void *)((char *)w - offsetof(um_event, work));
}

static inline void engine_push_op(um_event *op, void (*fn)(um__work *), bool first) {
  op->work.fn = fn;
  um__engine_push(op->m, &op->work, first);
}

/* A failure this thread just saw (its um_last_error()) becomes op's text,
 * unless the path wrote one. */
static inline void keep_error_text(um_event *op) {
  if (op->error_text[0] == '\0')
    snprintf(op->error_text, sizeof(op->error_text), "%s", um_last_error());
}

/* A network transfer's attachment goes, once (types.h: um__op_net). */
static inline void drop_attached(um_event *op) {
  if (op->kind != UM__OP_NET)
    return;
  void (*drop)(um_event *) = op->net.drop;
  op->net.drop = NULL;
  if (drop != NULL)
    drop(op);
}

/* Whether a report from d on this thread is finished here, without waking
 * a worker: the driver allows it in its callbacks, or this thread is one
 * of the backend's own. */
static inline bool finish_here(const um_device *d) { return um__dev_callbacks_reenter(d) || um__completes_inline; }

/* op goes to an in-order queue of its device (queued_q, from its plan) and
 * dep is queued there already, so the queue runs op after dep without a
 * token. */
static inline bool queued_before(um_event *dep, const um_event *op) {
  return op->queued_q >= 0 && atomic_load_explicit(&dep->queued_on, memory_order_acquire) == op->native_dev &&
         dep->queued_q == op->queued_q;
}

/* Under dep->lock: dep's token for a wait list, with one more owner, or
 * NULL when dep has finished or has not stored its token yet. The
 * operation's own share is put only after um__finish_op_locked took the token
 * under this lock, so a token seen here with dep not done is alive. */
static inline void *token_borrow_locked(um_event *dep) {
  void *native;
  if (atomic_load_explicit(&dep->state, memory_order_acquire) == UM__EV_DONE ||
      (native = atomic_load_explicit(&dep->native, memory_order_acquire)) == NULL)
    return NULL;
  um__atomic_add_relaxed(&dep->native_refs, 1);
  return native;
}

/* Buffers of an operation */

/* The buffers op touches: dst, and src when it is another buffer. */
static inline int op_buffers(const um_event *op, um_buffer **bufs) {
  int n = 0;
  if (op->dst)
    bufs[n++] = op->dst;
  if (op->src && op->src != op->dst)
    bufs[n++] = op->src;
  return n;
}

static inline void lock_buffers(um_buffer **bufs, int n) {
  if (n == 2 && (uintptr_t)bufs[1] < (uintptr_t)bufs[0]) {
    um_buffer *t = bufs[0];
    bufs[0] = bufs[1];
    bufs[1] = t;
  }
  for (int i = 0; i < n; i++)
    pthread_mutex_lock(&bufs[i]->lock);
}

static inline void unlock_buffers(um_buffer **bufs, int n) {
  for (int i = n - 1; i >= 0; i--)
    pthread_mutex_unlock(&bufs[i]->lock);
}

/* Under the buffers' locks, or before op can be seen by another thread:
 * op follows p, unfinished, on a buffer; the node takes over a reference
 * to p. op's array has room (two for an operation, one per buffer; a run
 * reserves its own, run_reserve). */
static inline void prior_add(um_event *op, um_event *p) {
  um__prior *n;
  if (op->priors == NULL)
    op->priors = op->prior_space;
  n = &op->priors[op->npriors++];
  n->prior = p;
  n->waiter = op;
  n->next = NULL;
}

/* The operations registered to follow op (um__op_register), taken under
 * op->lock as it finishes, started once no lock is held. */
typedef struct followers {
  um_event *first[UM__MAX_DEPENDENTS];
  int n;
  um_event **more;
  int nmore;
} followers;


/* ------------------------------------------------------------------------ */
/* op.c: issue and start */

/* Under the buffers' locks: whether op may still be published (UM_ESTATE
 * when a buffer was released, handed on or mapped meanwhile). */
int um__op_check_locked(um_event *op, um_buffer **bufs, int nbufs);
/* Under the locks: op's dependencies, the buffers' unfinished last
 * operations (one reference each into deps); *all_native: every one of
 * them runs on op's device queue. */
int um__op_collect_deps(um_event *op, um_buffer **bufs, int nbufs, um_event **deps, bool *all_native);
/* Make op the buffers' last operation (their references and extra_refs
 * more taken), then drop the locks. */
void um__op_publish(um_event *op, um_buffer **bufs, int nbufs, int extra_refs);
/* op, not started, replaced old_last[0..n) as its buffers' last operation:
 * it follows those not finished (priors), the others' references go. */
void um__follow_replaced(um_event *op, um_event **old_last, int n);
/* Register op with its unfinished dependencies (consumed): true when the
 * last of them will start it, false when all had finished. */
bool um__op_register(um_event *op, um_event **deps, int ndeps);
/* Nothing to wait for: start op now (held: the caller holds a reference). */
void um__op_start_now(um_event *op, bool held);
/* The engine's task: a worker starts an operation its last dependency
 * handed over. */
void um__op_task_start(um__work *w);

/* ------------------------------------------------------------------------ */
/* complete.c: completion */

/* The operations registered to follow an operation, taken as it finishes
 * (um__finish_op_locked), started once no lock is held. */
void um__followers_start(followers *f);
/* Under op->lock: op finished with status; its followers go to f, the
 * nodes waiting for it at their gates to *waiters. Returns its token. */
void *um__finish_op_locked(um_event *op, int status, followers *f, um__prior **waiters, bool *wake);
/* op completed: the operations that waited for it at their gates, those
 * it was the last for on *ready. */
void um__gate_release(um_event *op, um__prior *waiters, um_event **ready);
/* b's last operation finished and its release was deferred: it retires,
 * on a worker when this thread must not block. */
void um__retire_where_it_may_block(um_buffer *b);
/* The engine's task: complete op with its native_status. */
void um__op_task_complete(um__work *w);
/* op was refused by its device's queue (st), what it was ordered after
 * having finished: it fails, behind what its queue still holds. */
void um__complete_refused(um_event *op, int st);

/* ------------------------------------------------------------------------ */
/* tokens.c: native tokens */

/* What um__finish_op_locked leaves in op->native (its address): the
 * operation finished, and a token stored after it is the storer's to put. */
extern char um__native_finished;
#define NATIVE_FINISHED ((void *)&um__native_finished)
/* Start op on its device's queue behind the tokens of after; the token is
 * kept. A refusal is returned (its text kept), for the caller to complete. */
int um__start_native(um_event *op, void *const *after, int nafter);
/* Queue a UM__XFER_QUEUE_MARK on queue q of d: done(arg, status) once
 * everything queued there before it has run. */
int um__queue_mark(um_device *d, int q, um__done_fn done, void *arg);

/* ------------------------------------------------------------------------ */
/* brackets.c */

/* Under op's buffers' locks, as it is published: op takes the marks of its
 * unfinished predecessors deps[0..n) that name open brackets. */
void um__marks_inherit(um_event *op, um_event *const *deps, int n);

/* ------------------------------------------------------------------------ */
/* group.c: groups and runs */

struct um__run;
/* A member of group failed: the group keeps the first failure and text. */
void um__group_record_failure(um_event *group, int status, const char *text);
/* A member finished: the group completes with its last member. */
void um__group_member_done(um_event *group, int status, const char *text);
/* A run was reported done: its copies, buffers, state, followers, group. */
void um__run_finish(struct um__run *r, um_event **ready);

#endif /* UNIMEM_OP_INTERNAL_H */
