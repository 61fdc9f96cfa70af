/* The program: configuration from the seed, the choice of each step, the
 * periodic checkpoints, the gated bursts, and the end of a run. */
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "model.h"

#define KiB ((size_t)1024)
#define MiB ((size_t)1024 * 1024)
#define CHECKPOINT_EVERY 64 /* steps between full verifications */

/* ------------------------------------------------------------------------ */
/* Where each program is, for a report when the process dies before a
 * check can say so (a crash, a sanitizer's report): see test_model.c. */

#define MDL_MAX_PROGRESS 16
static atomic_uint_fast64_t progress_seed[MDL_MAX_PROGRESS], progress_step[MDL_MAX_PROGRESS];
static atomic_int progress_used[MDL_MAX_PROGRESS];
static atomic_uint_fast64_t progress_ticks;

uint64_t mdl_progress_ticks(void) { return atomic_load_explicit(&progress_ticks, memory_order_relaxed); }

void mdl_progress_note(const mdl_ctx *c) {
  int t = c->thread < MDL_MAX_PROGRESS ? c->thread : MDL_MAX_PROGRESS - 1;
  atomic_store_explicit(&progress_seed[t], c->seed, memory_order_relaxed);
  atomic_store_explicit(&progress_step[t], c->step, memory_order_relaxed);
  atomic_store_explicit(&progress_used[t], 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&progress_ticks, 1, memory_order_relaxed);
}

static size_t put_u64(char *p, uint64_t v) {
  char tmp[24];
  size_t n = 0, i;
  do {
    tmp[n++] = (char)('0' + v % 10);
    v /= 10;
  } while (v != 0);
  for (i = 0; i < n; i++)
    p[i] = tmp[n - 1 - i];
  return n;
}

/* Async-signal-safe: only write(2). */
void mdl_progress_print(void) {
  for (int t = 0; t < MDL_MAX_PROGRESS; t++) {
    char line[128];
    size_t n = 0;
    if (!atomic_load_explicit(&progress_used[t], memory_order_relaxed))
      continue;
    memcpy(line + n, "model: seed ", 12), n += 12;
    n += put_u64(line + n, atomic_load_explicit(&progress_seed[t], memory_order_relaxed));
    memcpy(line + n, " thread ", 8), n += 8;
    n += put_u64(line + n, (uint64_t)t);
    memcpy(line + n, " was at op ", 11), n += 11;
    n += put_u64(line + n, atomic_load_explicit(&progress_step[t], memory_order_relaxed));
    line[n++] = '\n';
    if (write(2, line, n) < 0)
      return;
  }
}

const char *mdl_replay_hint = "";

void mdl_fail_at(const mdl_ctx *c, const char *file, int line, const char *fmt, ...) {
  char msg[1024];
  size_t n;
  va_list ap;
  n = (size_t)snprintf(msg, sizeof(msg), "%s:%d: seed %llu thread %d op %llu (%s): ", file, line,
                       (unsigned long long)c->seed, c->thread, (unsigned long long)c->step, c->what);
  if (n < sizeof(msg)) {
    va_start(ap, fmt);
    n += (size_t)vsnprintf(msg + n, sizeof(msg) - n, fmt, ap);
    va_end(ap);
  }
  if (n < sizeof(msg))
    snprintf(msg + n, sizeof(msg) - n, "\n  replay: UNIMEM_MODEL_SEED=%llu UNIMEM_MODEL_OPS=%llu %s",
             (unsigned long long)c->seed, (unsigned long long)c->step + 1, mdl_replay_hint);
  mdl_fail_hook(msg);
}

/* ------------------------------------------------------------------------ */
/* Configuration */

static uint64_t pick_u64(mdl_rng *r, const uint64_t *v, size_t n) { return v[mdl_range(r, 0, n - 1)]; }

static void pick_options(um_options *o, mdl_rng *r) {
  static const uint64_t pool_max[] = {2ull << 30, 2ull << 30, 2ull << 30, 16 << 20, 2 << 20};
  static const uint64_t chunk[] = {64 * KiB, 1 * MiB, 4 * MiB};
  o->enable_pooling = mdl_pct(r, 85);
  o->max_pool_bytes = pick_u64(r, pool_max, 5);
  o->max_pool_bytes_per_class = o->max_pool_bytes == (2ull << 30) && mdl_pct(r, 80) ? 1ull << 30
                                                                                    : o->max_pool_bytes / 2;
  o->trim_interval_ms = mdl_pct(r, 15) ? (uint32_t)mdl_range(r, 1, 20) : 0;
  o->max_concurrent_transfers = (int)mdl_range(r, 1, 4);
  o->use_pinned_staging = (int)mdl_range(r, 0, 2);
  o->staging_chunk_bytes = pick_u64(r, chunk, 3);
  o->pinned_pool_bytes = mdl_pct(r, 80) ? 64 * MiB : o->staging_chunk_bytes;
  o->enable_peer = mdl_pct(r, 70);
  o->trim_on_pressure = 1;
  o->scrub = mdl_pct(r, 15);
  o->debug = mdl_pct(r, 15);
  o->huge_pages = mdl_pct(r, 10);
  o->device_limit_bytes = 0;
  o->log_level = UM_LOG_WARN;
}

void mdl_config_pick(mdl_config *cfg, uint64_t seed, const char *backends, bool threads) {
  mdl_rng r;
  struct rlimit rl;
  memset(cfg, 0, sizeof(*cfg));
  mdl_rng_seed(&r, seed ^ 0x6d6f64656cull);
  um_options_init(&cfg->opts);
  snprintf(cfg->opts.backends, sizeof(cfg->opts.backends), "%s", backends);
  pick_options(&cfg->opts, &r);
  cfg->threads = threads;
  cfg->exact_peak = !threads;
  cfg->max_size = threads ? 1 * MiB : 4 * MiB + 3;
  cfg->area_bytes = cfg->max_size;
  cfg->nareas = threads ? 3 : 5;
  cfg->max_live_bytes = threads ? 12 * MiB : 40 * MiB;
  cfg->generous_pool = cfg->opts.max_pool_bytes == (2ull << 30) && cfg->opts.max_pool_bytes_per_class == (1ull << 30);
  cfg->mlock_limit = UINT64_MAX;
  if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
    cfg->mlock_limit = (uint64_t)rl.rlim_cur;
  /* Live cpu PINNED blocks stay within a third of the limit: idle pooled
   * ones are trimmed when a new one is refused (trim_on_pressure). */
  cfg->pinned_budget = cfg->mlock_limit == UINT64_MAX ? 64 * MiB : cfg->mlock_limit / 3;
  if (threads)
    cfg->pinned_budget /= 8;
  cfg->pinned_ok = cfg->pinned_budget >= 256 * KiB;
}

void mdl_devices_scan(mdl_ctx *c) {
  int n = um_device_count(c->m);
  MDL_CHECK(c, n >= 1 && n <= MDL_MAX_DEVS, "um_device_count says %d", n);
  c->ndevs = n;
  for (int i = 0; i < n; i++) {
    mdl_dev *d = &c->devs[i];
    d->d = um_device_get(c->m, i);
    MDL_EXPECT_ST(c, um_device_info_get(d->d, &d->info), UM_OK, "um_device_info_get");
    MDL_CHECK(c, d->info.index == i, "device %d says it is index %d", i, d->info.index);
    if (strcmp(d->info.backend, "cpu") == 0)
      d->kind = MDL_CPU;
    else if (strcmp(d->info.backend, "opencl") == 0)
      d->kind = MDL_OPENCL;
    else if (strcmp(d->info.backend, "test-discrete") == 0 || strncmp(d->info.backend, "fault", 5) == 0)
      d->kind = MDL_TEST;
    else
      d->kind = MDL_OTHER;
    d->native_map = d->d->be->map != NULL;
    MDL_CHECK(c, (i == 0) == (d->kind == MDL_CPU), "device 0 must be the cpu, and only it");
    d->nlocs = 0;
    for (int l = 0; l < UM_LOCATION_COUNT; l++)
      if ((d->info.locations & (1u << l)) && !(d->kind == MDL_CPU && l == UM_PINNED && !c->cfg.pinned_ok))
        d->locs[d->nlocs++] = (um_location)l;
    MDL_CHECK(c, d->nlocs > 0, "device %d offers no location", i);
  }
}

/* ------------------------------------------------------------------------ */
/* Steps */

typedef enum {
  ST_ALLOC, ST_WRAP, ST_RELEASE, ST_REALLOC, ST_H2B, ST_B2H, ST_COPY, ST_FILL, ST_BATCH, ST_MAP,
  ST_EVENT, ST_CANCEL, ST_TRIM, ST_BAD, ST_VERIFY, ST_SYNC, ST_REFRESH, ST_BURST, ST_MAIL,
  ST_COUNT
} step_kind;

/* Relative weights; the threaded program leaves out what only one thread
 * may do (the gate, reuse of a released handle) and adds the mailboxes. */
static const unsigned weight_single[ST_COUNT] = {
    [ST_ALLOC] = 9, [ST_WRAP] = 3,   [ST_RELEASE] = 6, [ST_REALLOC] = 2,  [ST_H2B] = 9,
    [ST_B2H] = 8,   [ST_COPY] = 10,  [ST_FILL] = 6,    [ST_BATCH] = 5,    [ST_MAP] = 5,
    [ST_EVENT] = 10, [ST_CANCEL] = 3, [ST_TRIM] = 2,   [ST_BAD] = 5,      [ST_VERIFY] = 4,
    [ST_SYNC] = 1,  [ST_REFRESH] = 2, [ST_BURST] = 2,  [ST_MAIL] = 0};
static const unsigned weight_threads[ST_COUNT] = {
    [ST_ALLOC] = 9, [ST_WRAP] = 3,   [ST_RELEASE] = 6, [ST_REALLOC] = 0,  [ST_H2B] = 9,
    [ST_B2H] = 8,   [ST_COPY] = 10,  [ST_FILL] = 6,    [ST_BATCH] = 5,    [ST_MAP] = 5,
    [ST_EVENT] = 10, [ST_CANCEL] = 3, [ST_TRIM] = 2,   [ST_BAD] = 4,      [ST_VERIFY] = 4,
    [ST_SYNC] = 1,  [ST_REFRESH] = 2, [ST_BURST] = 0,  [ST_MAIL] = 6};

static step_kind pick_step(mdl_ctx *c) {
  const unsigned *w = c->sh != NULL ? weight_threads : weight_single;
  unsigned total = 0, r;
  for (int i = 0; i < ST_COUNT; i++)
    total += w[i];
  r = (unsigned)mdl_range(&c->rng, 0, total - 1);
  for (int i = 0; i < ST_COUNT; i++) {
    if (r < w[i])
      return (step_kind)i;
    r -= w[i];
  }
  return ST_VERIFY;
}

static void run_kind(mdl_ctx *c, step_kind k) {
  switch (k) {
  case ST_ALLOC: mdl_step_alloc(c); break;
  case ST_WRAP: mdl_step_wrap(c); break;
  case ST_RELEASE: mdl_step_release(c, NULL); break;
  case ST_REALLOC: mdl_step_release_realloc(c); break;
  case ST_H2B: mdl_step_copy_from_host(c); break;
  case ST_B2H: mdl_step_copy_to_host(c); break;
  case ST_COPY: mdl_step_copy(c); break;
  case ST_FILL: mdl_step_fill(c); break;
  case ST_BATCH: mdl_step_batch(c); break;
  case ST_MAP: mdl_step_map(c); break;
  case ST_EVENT: mdl_step_event(c); break;
  case ST_CANCEL: mdl_step_cancel(c); break;
  case ST_TRIM: mdl_step_trim(c); break;
  case ST_BAD: mdl_step_bad(c); break;
  case ST_VERIFY: mdl_step_verify(c); break;
  case ST_SYNC: mdl_sync(c); break;
  case ST_REFRESH: mdl_step_refresh_area(c); break;
  case ST_MAIL: mdl_mail_step(c); break;
  default: break;
  }
}

/* Mappings are kept open for a few steps, then closed. */
static void age_mappings(mdl_ctx *c) {
  for (int i = 0; i < MDL_MAX_BUFS; i++) {
    mdl_buf *b = &c->bufs[i];
    if (b->live && b->mapped && --b->map_age <= 0)
      mdl_step_unmap(c, b);
  }
}

static int free_op_records(const mdl_ctx *c) {
  int n = 0;
  for (int i = 0; i < MDL_MAX_OPS; i++)
    n += !c->ops[i].used;
  return n;
}

/* A gated burst: the workers stop at the gate, an anchor operation holds
 * one of them (RUNNING, so never cancelable), and what follows on its
 * buffer queues behind it, where cancels succeed. Nothing in the burst may
 * wait: the steps are issued with c->no_block set. */
static void burst_anchor(mdl_ctx *c) {
  mdl_buf *b = NULL;
  um_event *e = NULL;
  mdl_op *op;
  int st;
  for (int i = 0; i < MDL_MAX_BUFS && b == NULL; i++) {
    mdl_buf *x = &c->bufs[i];
    if (x->live && !x->shared && !x->mapped && x->kind != MDL_WRAP_RO && x->host_view && x->size > 300 * KiB)
      b = x;
  }
  if (b == NULL)
    return;
  c->focus = b;
  /* a host fill above the inline limit goes to a worker */
  snprintf(c->what, sizeof(c->what), "burst anchor: um_fill(#%llu, 0, 0x5a, %zu)", (unsigned long long)b->id,
           b->size);
  op = mdl_op_new(c, MDL_FILL);
  op->dst = b, op->bytes = b->size, op->value = 0x5a;
  st = um_fill(b->h, 0, 0x5a, b->size, &e);
  mdl_issued_status(c, &op, 1, st, false, false, "um_fill (anchor)");
  mdl_event_add(c, e, &op, 1, false);
}

static void step_burst(mdl_ctx *c) {
  static const step_kind kinds[] = {ST_H2B, ST_B2H, ST_COPY, ST_FILL, ST_BATCH, ST_EVENT, ST_CANCEL,
                                    ST_RELEASE, ST_ALLOC, ST_BAD, ST_H2B, ST_COPY, ST_FILL};
  int n = (int)mdl_range(&c->rng, 2, 10);
  if (c->sh != NULL)
    return;
  while (c->nevents > MDL_MAX_EVENTS - 2 * n - 2)
    mdl_event_drop(c, 0);
  mdl_ops_collect(c);
  if (free_op_records(c) < 12 * MDL_MAX_BATCH)
    mdl_sync(c);
  mdl_gate_close();
  c->no_block = true;
  burst_anchor(c);
  for (int i = 0; i < n; i++)
    run_kind(c, kinds[mdl_range(&c->rng, 0, sizeof(kinds) / sizeof(kinds[0]) - 1)]);
  mdl_resolve_all(c); /* most candidates are still queued behind the anchor */
  c->focus = NULL;
  c->no_block = false;
  mdl_gate_open(c);
}

void mdl_one_step(mdl_ctx *c) {
  step_kind k;
  mdl_progress_note(c);
  snprintf(c->what, sizeof(c->what), "step");
  age_mappings(c);
  k = pick_step(c);
  if (k == ST_BURST)
    step_burst(c);
  else
    run_kind(c, k);
  if (c->trace)
    fprintf(stderr, "model: seed %llu thread %d op %llu: %s\n", (unsigned long long)c->seed, c->thread,
            (unsigned long long)c->step, c->what);
  snprintf(c->what, sizeof(c->what), "statistics after the step");
  mdl_check_stats(c);
}

/* Everything finishes; every buffer and host area is read back whole. */
void mdl_checkpoint(mdl_ctx *c) {
  snprintf(c->what, sizeof(c->what), "checkpoint");
  mdl_sync(c);
  for (int i = 0; i < MDL_MAX_BUFS; i++)
    if (c->bufs[i].live && !c->bufs[i].mapped)
      mdl_verify_buf(c, &c->bufs[i]);
  for (int i = 0; i < c->cfg.nareas; i++)
    mdl_verify_area(c, &c->areas[i]);
}

/* Release everything the program holds: events, mappings, buffers. */
void mdl_end_program(mdl_ctx *c) {
  snprintf(c->what, sizeof(c->what), "end of the program");
  age_mappings(c);
  mdl_resolve_all(c);
  while (c->nevents > 0) {
    if (mdl_pct(&c->rng, 50))
      mdl_event_wait(c, &c->events[0]);
    mdl_event_drop(c, 0);
  }
  for (int i = 0; i < MDL_MAX_BUFS; i++)
    if (c->bufs[i].live && !c->bufs[i].shared) {
      if (c->bufs[i].mapped && mdl_pct(&c->rng, 50))
        mdl_step_unmap(c, &c->bufs[i]);
      mdl_step_release(c, &c->bufs[i]);
    }
  mdl_sync(c);
}

/* After the single program ended: nothing is live, and a full trim leaves
 * no idle block and nothing reserved on the cpu device. */
void mdl_check_empty(mdl_ctx *c) {
  um_stats t;
  snprintf(c->what, sizeof(c->what), "empty manager");
  MDL_EXPECT_ST(c, um_pool_trim(c->m, 0), UM_OK, "um_pool_trim(0)");
  t = mdl_stats(c, -1);
  MDL_CHECK(c, t.active_buffers == 0 && t.bytes_in_use == 0 && t.bytes_pooled == 0,
            "after releasing everything and trimming: %llu buffers, %llu bytes in use, %llu pooled",
            (unsigned long long)t.active_buffers, (unsigned long long)t.bytes_in_use,
            (unsigned long long)t.bytes_pooled);
  if (!c->cfg.opts.debug) {
    um_stats s = mdl_stats(c, 0);
    MDL_CHECK(c, s.bytes_reserved == 0, "the cpu device still reserves %llu bytes with nothing live or idle",
              (unsigned long long)s.bytes_reserved);
  }
}

double mdl_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

mdl_result mdl_run_single(um_manager *m, const mdl_config *cfg, uint64_t seed, uint64_t steps, bool trace) {
  mdl_result res;
  mdl_ctx *c = calloc(1, sizeof(*c));
  double t0 = mdl_now_s();
  memset(&res, 0, sizeof(res));
  if (c == NULL)
    mdl_fail_hook("test out of memory for the model");
  mdl_gate_install();
  mdl_ctx_init(c, m, cfg, seed, 0);
  c->trace = trace;
  for (c->step = 0; c->step < steps; c->step++) {
    mdl_one_step(c);
    if (c->step % CHECKPOINT_EVERY == CHECKPOINT_EVERY - 1)
      mdl_checkpoint(c);
  }
  mdl_end_program(c);
  mdl_check_empty(c);
  res.final = mdl_stats(c, -1);
  res.steps = steps;
  res.seconds = mdl_now_s() - t0;
  res.cancels_ok = c->cancels_ok, res.cancels_busy = c->cancels_busy, res.checks = c->checks;
  mdl_gate_uninstall();
  mdl_ctx_free(c);
  free(c);
  return res;
}
