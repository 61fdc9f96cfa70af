/* Events in the model: waits, queries, cancels and releases in random
 * order; the fate of the operations that may be canceled; and the worker
 * gate that holds the manager's workers so that operations issued behind
 * theirs stay queued (and cancelable). */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "model.h"
#include "testhook.h"

int mdl_event_expect(const mdl_event *ev) {
  if (ev->group)
    return UM_OK;
  return ev->ops[0]->fate == MDL_FATE_CANCELED ? UM_ECANCELED : UM_OK;
}

void mdl_event_add(mdl_ctx *c, um_event *e, mdl_op **ops, int nops, bool group) {
  mdl_event *ev;
  MDL_CHECK(c, e != NULL, "an asynchronous call returned UM_OK without an event");
  if (c->nevents == MDL_MAX_EVENTS) {
    /* Make room: the oldest goes, waited for first when that is allowed. */
    if (!c->no_block)
      mdl_event_wait(c, &c->events[0]);
    mdl_event_drop(c, 0);
  }
  ev = &c->events[c->nevents++];
  memset(ev, 0, sizeof(*ev));
  ev->e = e;
  ev->group = group;
  ev->nops = nops;
  for (int i = 0; i < nops; i++) {
    ev->ops[i] = ops[i];
    ops[i]->refs++;
  }
}

static mdl_op *candidate_of(mdl_event *ev) {
  return !ev->group && ev->ops[0]->fate == MDL_FATE_UNKNOWN ? ev->ops[0] : NULL;
}

/* Ask to cancel a candidate: UM_OK, it will never run; UM_EBUSY, it
 * started (or finished) and runs to its end. */
static void cancel_candidate(mdl_ctx *c, mdl_event *ev) {
  mdl_op *op = ev->ops[0];
  int st = um_event_cancel(ev->e);
  MDL_CHECK(c, st == UM_OK || st == UM_EBUSY, "um_event_cancel of a queued or running operation: %s (%s)",
            um_err_name(st), um_last_error());
  op->cancel_tried = true;
  if (st == UM_OK) {
    MDL_CHECK(c, !op->data_done, "um_event_cancel answered UM_OK for an operation known to have finished");
    op->fate = MDL_FATE_CANCELED;
    c->cancels_ok++;
  } else {
    op->fate = MDL_FATE_RUN;
    c->cancels_busy++;
  }
}

/* Decide a candidate's fate now: try to cancel it (as planned at issue),
 * or let it run. */
static void resolve_event(mdl_ctx *c, mdl_event *ev) {
  mdl_op *op = candidate_of(ev);
  if (op == NULL)
    return;
  if (op->cancel_planned)
    cancel_candidate(c, ev);
  else
    op->fate = MDL_FATE_RUN;
}

void mdl_resolve_all(mdl_ctx *c) {
  for (int i = 0; i < c->nevents; i++)
    resolve_event(c, &c->events[i]);
  mdl_log_flush(c);
  MDL_CHECK(c, c->nlog == 0, "%d operations stay unapplied after resolving every candidate", c->nlog);
}

static void event_finished(mdl_ctx *c, mdl_event *ev) {
  ev->done_known = true;
  for (int i = 0; i < ev->nops; i++)
    mdl_mark_event_done(c, ev->ops[i]);
}

void mdl_event_wait(mdl_ctx *c, mdl_event *ev) {
  int want;
  resolve_event(c, ev);
  mdl_log_flush(c);
  want = mdl_event_expect(ev);
  MDL_EXPECT_ST(c, um_event_wait(ev->e), want, "um_event_wait");
  event_finished(c, ev);
  /* and it stays so */
  MDL_EXPECT_ST(c, um_event_query(ev->e), want, "um_event_query after the wait");
}

void mdl_event_drop(mdl_ctx *c, int i) {
  mdl_event *ev = &c->events[i];
  resolve_event(c, ev);
  mdl_log_flush(c);
  um_event_release(ev->e);
  for (int j = 0; j < ev->nops; j++)
    ev->ops[j]->refs--;
  c->events[i] = c->events[--c->nevents];
}

static void event_query(mdl_ctx *c, mdl_event *ev) {
  int st = um_event_query(ev->e);
  if (st == UM_EAGAIN) {
    MDL_CHECK(c, !ev->done_known && (ev->group || !ev->ops[0]->event_done),
              "um_event_query says pending for an operation known to be finished");
    return;
  }
  /* A candidate that finished before anyone asked to cancel it ran: its
   * status is UM_OK, and a cancel asked later answers UM_EBUSY. Only the
   * event learns that it finished: what the program knows of finished
   * operations (which host areas are free) must not depend on timing, or
   * a seed would not replay. */
  MDL_EXPECT_ST(c, st, mdl_event_expect(ev), "um_event_query");
  ev->done_known = true;
}

/* A cancel whose answer is certain: groups are never cancelable, and an
 * operation that was waited for, asked once already, or canceled is busy. */
static void event_cancel(mdl_ctx *c, mdl_event *ev) {
  if (candidate_of(ev) != NULL) {
    cancel_candidate(c, ev);
    mdl_log_flush(c);
    return;
  }
  if (ev->group || ev->done_known || ev->ops[0]->cancel_tried || ev->ops[0]->event_done)
    MDL_EXPECT_ST(c, um_event_cancel(ev->e), UM_EBUSY, "um_event_cancel of a started, finished or batch operation");
}

/* After a wait: what the operation wrote reads back as the model says
 * (through a read ordered after it, so later operations count too). */
static void verify_destination(mdl_ctx *c, const mdl_op *op) {
  mdl_buf *b = mdl_buf_by_id(c, op->dst_id);
  if (b != NULL && !b->mapped)
    mdl_verify_range(c, b, op->dst_off, op->bytes);
  else if (op->kind == MDL_B2H && !mdl_area_busy(c, op->area, false))
    mdl_verify_area(c, op->area);
}

void mdl_step_event(mdl_ctx *c) {
  int i, action = (int)mdl_range(&c->rng, 0, 99);
  mdl_event *ev;
  if (c->nevents == 0)
    return;
  i = (int)mdl_range(&c->rng, 0, (size_t)c->nevents - 1);
  ev = &c->events[i];
  snprintf(c->what, sizeof(c->what), "event %d of %d (%s, %d ops), action %d", i, c->nevents,
           ev->group ? "batch" : "single", ev->nops, action);
  if (action < 35 && !c->no_block) {
    mdl_event_wait(c, ev);
    if (mdl_pct(&c->rng, 50))
      verify_destination(c, ev->ops[mdl_range(&c->rng, 0, (size_t)ev->nops - 1)]);
  }
  else if (action < 60)
    event_query(c, ev);
  else if (action < 75)
    event_cancel(c, ev);
  else
    mdl_event_drop(c, i);
}

void mdl_step_cancel(mdl_ctx *c) {
  for (int i = 0; i < c->nevents; i++)
    if (candidate_of(&c->events[i]) != NULL && mdl_pct(&c->rng, 50)) {
      snprintf(c->what, sizeof(c->what), "um_event_cancel of event %d", i);
      cancel_candidate(c, &c->events[i]);
    }
  mdl_log_flush(c);
}

/* ------------------------------------------------------------------------ */
/* The worker gate, on the test build's worker hook (src/testhook.h):
 * installed once, before any operation, and open except inside a gated
 * burst. A worker that starts an operation while it is closed waits there
 * (its operation RUNNING), so what is issued behind it on the same buffers
 * stays QUEUED. */

static struct {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  int closed;
  int timed_out;
} gate = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0};

static void gate_hook(um__test_point point, void *arg) {
  struct timespec deadline;
  (void)arg;
  if (point != UM__TP_WORKER_RUN)
    return;
  clock_gettime(CLOCK_REALTIME, &deadline);
  deadline.tv_sec += 60; /* a program that never opens it fails instead of hanging */
  pthread_mutex_lock(&gate.lock);
  while (gate.closed)
    if (pthread_cond_timedwait(&gate.cond, &gate.lock, &deadline) == ETIMEDOUT) {
      gate.timed_out = 1;
      break;
    }
  pthread_mutex_unlock(&gate.lock);
}

void mdl_gate_install(void) { atomic_store(&um__test_hook, gate_hook); }

void mdl_gate_uninstall(void) { atomic_store(&um__test_hook, (um__test_hook_fn)NULL); }

void mdl_gate_close(void) {
  pthread_mutex_lock(&gate.lock);
  gate.closed = 1;
  pthread_mutex_unlock(&gate.lock);
}

void mdl_gate_open(mdl_ctx *c) {
  int timed_out;
  pthread_mutex_lock(&gate.lock);
  gate.closed = 0;
  timed_out = gate.timed_out;
  pthread_cond_broadcast(&gate.cond);
  pthread_mutex_unlock(&gate.lock);
  MDL_CHECK(c, !timed_out, "a worker waited 60 s at the closed gate");
}
