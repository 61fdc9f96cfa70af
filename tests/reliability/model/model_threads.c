/* The threaded program: several threads, each running its own program on
 * its own buffers and host areas, all reading a few shared read-only
 * sources (so that one buffer orders operations issued by every thread),
 * handing events to each other through mailboxes (a wait and a release on
 * another thread than the issuer), and meeting at barriers where one of
 * them checks the statistics against the sum of every program's model. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"

#define MDL_MAX_THREADS 8
#define MAIL_CAP 16
#define BARRIER_EVERY 100

typedef struct mdl_mailbox {
  pthread_mutex_t lock;
  um_event *ev[MAIL_CAP];
  int n;
} mdl_mailbox;

struct mdl_shared {
  int nthreads;
  uint64_t steps;
  pthread_barrier_t barrier;
  mdl_ctx *ctx[MDL_MAX_THREADS];
  mdl_ctx *owner; /* holds the shared sources */
  mdl_mailbox mail[MDL_MAX_THREADS];
};

bool mdl_mail_post(mdl_ctx *c, um_event *e) {
  mdl_mailbox *mb;
  bool ok;
  if (c->sh == NULL || c->post_to < 0)
    return false;
  mb = &c->sh->mail[c->post_to];
  pthread_mutex_lock(&mb->lock);
  ok = mb->n < MAIL_CAP;
  if (ok)
    mb->ev[mb->n++] = e;
  pthread_mutex_unlock(&mb->lock);
  return ok;
}

/* Events another thread issued: their operations were never candidates for
 * cancel, so they succeed; waited for here or just released. */
static void take_mail(mdl_ctx *c) {
  mdl_mailbox *mb = &c->sh->mail[c->thread];
  um_event *ev[MAIL_CAP];
  int n;
  pthread_mutex_lock(&mb->lock);
  n = mb->n;
  memcpy(ev, mb->ev, (size_t)n * sizeof(ev[0]));
  mb->n = 0;
  pthread_mutex_unlock(&mb->lock);
  for (int i = 0; i < n; i++) {
    snprintf(c->what, sizeof(c->what), "event %d of %d from another thread", i, n);
    if (mdl_pct(&c->rng, 60)) {
      int q = um_event_query(ev[i]);
      MDL_CHECK(c, q == UM_EAGAIN || q == UM_OK, "um_event_query of another thread's copy: %s", um_err_name(q));
      MDL_EXPECT_ST(c, um_event_wait(ev[i]), UM_OK, "um_event_wait (another thread's copy)");
      MDL_EXPECT_ST(c, um_event_query(ev[i]), UM_OK, "um_event_query after the wait");
      MDL_EXPECT_ST(c, um_event_cancel(ev[i]), UM_EBUSY, "um_event_cancel of a finished copy");
    }
    um_event_release(ev[i]);
  }
}

void mdl_mail_step(mdl_ctx *c) {
  if (c->sh == NULL || c->sh->nthreads < 2)
    return;
  if (mdl_pct(&c->rng, 50)) {
    take_mail(c);
    return;
  }
  c->post_to = (c->thread + 1 + (int)mdl_range(&c->rng, 0, (size_t)c->sh->nthreads - 2)) % c->sh->nthreads;
  switch (mdl_range(&c->rng, 0, 2)) {
  case 0: mdl_step_fill(c); break;
  case 1: mdl_step_copy(c); break;
  default: mdl_step_copy_from_host(c); break;
  }
  c->post_to = -1;
}

/* Sum of every program's counters: the whole manager's model. */
static void sum_counts(struct mdl_shared *sh, mdl_counts *sum, int ndevs) {
  memset(sum, 0, sizeof(*sum) * (size_t)ndevs);
  for (int t = 0; t <= sh->nthreads; t++) {
    mdl_ctx *c = t < sh->nthreads ? sh->ctx[t] : sh->owner;
    for (int d = 0; d < ndevs; d++) {
      const mdl_counts *k = &c->counts[d];
      sum[d].live += k->live, sum[d].in_use += k->in_use, sum[d].allocations += k->allocations;
      sum[d].releases += k->releases, sum[d].pooled_requests += k->pooled_requests;
      sum[d].fills += k->fills, sum[d].capacity_live += k->capacity_live;
      sum[d].blocks_live += k->blocks_live;
    }
  }
}

/* Every thread stops (its candidates decided), thread 0 waits for all
 * operations and checks the figures against the sum of the models. */
static void barrier_check(mdl_ctx *c) {
  struct mdl_shared *sh = c->sh;
  mdl_resolve_all(c);
  pthread_barrier_wait(&sh->barrier);
  if (c->thread == 0) {
    mdl_counts sum[MDL_MAX_DEVS];
    snprintf(c->what, sizeof(c->what), "barrier: statistics of every thread");
    MDL_EXPECT_ST(c, um_device_synchronize(c->devs[0].d), UM_OK, "um_device_synchronize");
    sum_counts(sh, sum, c->ndevs);
    mdl_check_stats_quiet(c, sum, c->ndevs);
  }
  pthread_barrier_wait(&sh->barrier);
}

static void *thread_main(void *arg) {
  mdl_ctx *c = arg;
  for (c->step = 0; c->step < c->sh->steps; c->step++) {
    mdl_one_step(c);
    if (c->step % BARRIER_EVERY == BARRIER_EVERY - 1)
      barrier_check(c);
    else if (c->step % 64 == 63)
      mdl_checkpoint(c);
  }
  pthread_barrier_wait(&c->sh->barrier); /* nobody posts any more */
  take_mail(c);
  mdl_end_program(c);
  return NULL;
}

static void make_sources(mdl_ctx *owner) {
  for (int d = 0; d < owner->ndevs; d++)
    mdl_make_shared(owner, d);
  mdl_make_shared(owner, -1);
}

/* A thread's program sees the shared sources as read-only buffers. */
static mdl_ctx *thread_ctx(struct mdl_shared *sh, const mdl_config *cfg, uint64_t seed, int t, bool trace) {
  mdl_ctx *c = calloc(1, sizeof(*c));
  if (c == NULL)
    mdl_fail_hook("test out of memory for a thread's model");
  mdl_ctx_init(c, sh->owner->m, cfg, seed, t);
  c->sh = sh;
  c->trace = trace;
  for (int i = 0; i < MDL_MAX_BUFS; i++)
    if (sh->owner->bufs[i].live)
      c->bufs[i] = sh->owner->bufs[i];
  return c;
}

static void finish_owner(struct mdl_shared *sh) {
  mdl_ctx *o = sh->owner;
  mdl_counts sum[MDL_MAX_DEVS];
  snprintf(o->what, sizeof(o->what), "after every thread ended");
  MDL_EXPECT_ST(o, um_device_synchronize(o->devs[0].d), UM_OK, "um_device_synchronize");
  sum_counts(sh, sum, o->ndevs);
  mdl_check_stats_quiet(o, sum, o->ndevs);
  for (int i = 0; i < MDL_MAX_BUFS; i++)
    if (o->bufs[i].live) {
      mdl_verify_buf(o, &o->bufs[i]);
      o->bufs[i].shared = false;
      mdl_step_release(o, &o->bufs[i]);
    }
  /* Alone now: the owner's model takes every thread's counters, and the
   * exact checks apply again. */
  sum_counts(sh, sum, o->ndevs);
  memcpy(o->counts, sum, sizeof(sum[0]) * (size_t)o->ndevs);
  o->sh = NULL;
  mdl_sync(o);
  mdl_check_empty(o);
}

mdl_result mdl_run_threads(um_manager *m, const mdl_config *cfg, uint64_t seed, uint64_t steps, int nthreads,
                           bool trace) {
  struct mdl_shared *sh = calloc(1, sizeof(*sh));
  pthread_t tid[MDL_MAX_THREADS];
  mdl_result res;
  double t0 = mdl_now_s();
  memset(&res, 0, sizeof(res));
  if (sh == NULL || nthreads < 1 || nthreads > MDL_MAX_THREADS)
    mdl_fail_hook("bad thread count, or out of memory");
  sh->nthreads = nthreads;
  sh->steps = steps;
  sh->owner = calloc(1, sizeof(*sh->owner));
  if (sh->owner == NULL)
    mdl_fail_hook("test out of memory for the model");
  mdl_ctx_init(sh->owner, m, cfg, seed, nthreads);
  sh->owner->sh = sh;
  make_sources(sh->owner);
  pthread_barrier_init(&sh->barrier, NULL, (unsigned)nthreads);
  for (int t = 0; t < nthreads; t++) {
    pthread_mutex_init(&sh->mail[t].lock, NULL);
    sh->ctx[t] = thread_ctx(sh, cfg, seed, t, trace);
  }
  for (int t = 0; t < nthreads; t++)
    if (pthread_create(&tid[t], NULL, thread_main, sh->ctx[t]) != 0)
      mdl_fail_hook("pthread_create failed");
  for (int t = 0; t < nthreads; t++)
    pthread_join(tid[t], NULL);
  finish_owner(sh);
  res.final = mdl_stats(sh->owner, -1);
  res.steps = steps * (uint64_t)nthreads;
  res.seconds = mdl_now_s() - t0;
  for (int t = 0; t < nthreads; t++) {
    res.cancels_ok += sh->ctx[t]->cancels_ok, res.cancels_busy += sh->ctx[t]->cancels_busy;
    res.checks += sh->ctx[t]->checks;
    mdl_ctx_free(sh->ctx[t]);
    free(sh->ctx[t]);
    pthread_mutex_destroy(&sh->mail[t].lock);
  }
  pthread_barrier_destroy(&sh->barrier);
  mdl_ctx_free(sh->owner);
  free(sh->owner);
  free(sh);
  return res;
}
