/* Fault injection: every allocation and every transfer of a realistic
 * workload is made to fail, one run per fault point, and each run checks
 * that the failing call answered the right code, that no other call was
 * affected, that the statistics match what the workload holds, that the
 * data the model knows is intact, and that nothing leaked. Then device
 * loss, and real exhaustion of a small device.
 *
 * The workload runs on the cpu (device 0), a "fault" device (1: no host
 * view for DEVICE memory, asynchronous queue, core host shadow for maps)
 * and a "fault-map" device (2: synchronous transfers run on the core's
 * threads, native map/unmap). Its steps run one after the other (an
 * asynchronous step issues, then waits), so that the backend sees the same
 * sequence of calls in every run: the dry run records after which step
 * each allocation and transfer happens, and a fault run must fail exactly
 * that step.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fault_backend.h"
#include "test_util.h" /* Criterion, or its stand-in under TSan */

#define KiB 1024u
#define MAX_STEPS 96
#define MAX_SIZE (48 * KiB)

enum { A, P, H, Z, B, Q, W, NSLOTS };

typedef enum {
  SWEEP_NONE = 0,     /* the dry run */
  SWEEP_ALLOC_ONCE,   /* the nth allocation fails, the retry succeeds */
  SWEEP_ALLOC_STICKY, /* every allocation from the nth fails, for one call */
  SWEEP_XFER_RUN,     /* the nth transfer fails when it runs */
  SWEEP_XFER_SUBMIT   /* the nth transfer is refused when submitted */
} sweep_kind;

static const char *const sweep_names[] = {"none", "alloc-once", "alloc-sticky", "xfer-run",
                                          "xfer-submit"};

typedef struct slot {
  um_buffer *b;
  size_t size;
  unsigned char expect[MAX_SIZE];
  unsigned char known[MAX_SIZE];
} slot;

typedef struct step_rec {
  const char *name;
  uint64_t allocs, xfers; /* backend counts once the step had finished */
} step_rec;

typedef struct run {
  sweep_kind kind;
  uint64_t nth;
  int fault_status;
  um_manager *m;
  um_device *cpu, *fd, *fm;
  slot s[NSLOTS];
  int step;
  uint64_t injected_before;
  int hit_step;
  bool hit_alloc_step;
  step_rec rec[MAX_STEPS];
  unsigned char out[MAX_SIZE], out2[MAX_SIZE];
  unsigned char wrap_mem[4 * KiB];
} run;

static unsigned char pat[4][MAX_SIZE];
static step_rec dry[MAX_STEPS];
static int dry_steps;
static uint64_t dry_allocs, dry_xfers;

static void make_patterns(void) {
  for (int k = 0; k < 4; k++)
    for (size_t i = 0; i < MAX_SIZE; i++)
      pat[k][i] = (unsigned char)((i * (7 + 2 * k) + 13 * k + (i >> 8)) & 0xff);
}

/* ------------------------------------------------------------------------ */
/* The model: what each live buffer must hold, byte by byte, where known. */

static void model_set(run *r, int s, size_t off, const unsigned char *src, size_t n) {
  memcpy(r->s[s].expect + off, src, n);
  memset(r->s[s].known + off, 1, n);
}

static void model_fill(run *r, int s, size_t off, int v, size_t n) {
  memset(r->s[s].expect + off, v, n);
  memset(r->s[s].known + off, 1, n);
}

static void model_unknown(run *r, int s, size_t off, size_t n) { memset(r->s[s].known + off, 0, n); }

static void model_copy(run *r, int d, size_t doff, int s, size_t soff, size_t n) {
  memmove(r->s[d].expect + doff, r->s[s].expect + soff, n);
  memmove(r->s[d].known + doff, r->s[s].known + soff, n);
}

static void model_check(run *r, int s, size_t off, const unsigned char *got, size_t n, const char *what) {
  for (size_t i = 0; i < n; i++)
    if (r->s[s].known[off + i])
      cr_assert_eq(got[i], r->s[s].expect[off + i],
                   "%s fault %llu: %s: byte %zu is 0x%02x, expected 0x%02x", sweep_names[r->kind],
                   (unsigned long long)r->nth, what, off + i, got[i], r->s[s].expect[off + i]);
}

static bool live(run *r, int s) { return r->s[s].b != NULL; }

/* ------------------------------------------------------------------------ */
/* Steps */

static void check_stats(run *r) {
  um_stats s;
  uint64_t n = 0, bytes = 0;
  for (int i = 0; i < NSLOTS; i++)
    if (live(r, i)) {
      n++;
      bytes += r->s[i].size;
    }
  cr_assert_eq(um_stats_get(r->m, NULL, &s), UM_OK);
  cr_assert_eq(s.active_buffers, n, "step %d: active_buffers", r->step);
  cr_assert_eq(s.bytes_in_use, bytes, "step %d: bytes_in_use", r->step);
  for (int d = 1; d <= 2; d++) {
    um_device *dev = um_device_get(r->m, d);
    cr_assert_eq(um_stats_get(r->m, dev, &s), UM_OK);
    cr_assert_eq(s.bytes_reserved, fault_device_live_bytes(dev),
                 "step %d: device %d: bytes_reserved %llu, the backend holds %llu", r->step, d,
                 (unsigned long long)s.bytes_reserved,
                 (unsigned long long)fault_device_live_bytes(dev));
  }
}

static void begin(run *r) {
  fault_counts c;
  fault_counts_get(&c);
  r->injected_before = c.injected_allocs + c.injected_xfers;
}

static int expected_status(const run *r, bool alloc_step) {
  switch (r->kind) {
  case SWEEP_ALLOC_STICKY: return alloc_step ? UM_ENOMEM : UM_OK;
  case SWEEP_XFER_RUN:
  case SWEEP_XFER_SUBMIT: return r->fault_status;
  default: return UM_OK;
  }
}

/* End of a step: the planned fault makes it answer the expected code, and
 * every other step must succeed. */
static bool end(run *r, const char *name, int st, bool alloc_step) {
  fault_counts c;
  int i = r->step;
  fault_counts_get(&c);
  cr_assert_lt(i, MAX_STEPS);
  if (r->kind == SWEEP_NONE) {
    cr_assert_eq(st, UM_OK, "dry run: step %d (%s): %s %s", i, name, um_err_name(st), um_last_error());
    r->rec[i].name = name;
    r->rec[i].allocs = c.allocs;
    r->rec[i].xfers = c.xfers;
  } else if (c.injected_allocs + c.injected_xfers > r->injected_before) {
    int want = expected_status(r, alloc_step);
    cr_assert_eq(st, want, "%s fault %llu: step %d (%s) answered %s, expected %s", sweep_names[r->kind],
                 (unsigned long long)r->nth, i, name, um_err_name(st), um_err_name(want));
    cr_assert_eq(r->hit_step, -1, "%s fault %llu: a second step (%d, %s) was hit", sweep_names[r->kind],
                 (unsigned long long)r->nth, i, name);
    r->hit_step = i;
    r->hit_alloc_step = alloc_step;
    fault_disarm();
  } else {
    cr_assert_eq(st, UM_OK, "%s fault %llu: step %d (%s) was affected: %s %s", sweep_names[r->kind],
                 (unsigned long long)r->nth, i, name, um_err_name(st), um_last_error());
  }
  r->step++;
  check_stats(r);
  return st == UM_OK;
}

static int finish(int st, um_event *e) {
  if (st == UM_OK && e != NULL) {
    st = um_event_wait(e);
    um_event_release(e);
  }
  return st;
}

static void alloc_step(run *r, int s, um_device *d, um_location loc, unsigned flags, const char *name) {
  um_buffer *b = NULL;
  int st;
  begin(r);
  st = um_alloc(r->m, d, r->s[s].size, loc, flags, &b);
  if (st == UM_OK) {
    r->s[s].b = b;
    model_unknown(r, s, 0, r->s[s].size);
    if (flags & UM_ALLOC_ZERO)
      model_fill(r, s, 0, 0, r->s[s].size);
  } else {
    cr_assert_null(b);
  }
  end(r, name, st, true);
}

static void release_step(run *r, int s, const char *name) {
  int st;
  if (!live(r, s))
    return;
  begin(r);
  st = um_release(r->s[s].b);
  r->s[s].b = NULL;
  end(r, name, st, false);
}

static void h2d_step(run *r, int s, size_t off, const unsigned char *src, size_t n, bool async,
                     const char *name) {
  um_event *e = NULL;
  int st;
  if (!live(r, s))
    return;
  begin(r);
  st = um_copy_from_host(r->s[s].b, off, src, n, async ? &e : NULL);
  st = finish(st, e);
  if (st == UM_OK)
    model_set(r, s, off, src, n);
  else
    model_unknown(r, s, off, n);
  end(r, name, st, false);
}

static void d2h_step(run *r, int s, size_t off, size_t n, bool async, const char *name) {
  um_event *e = NULL;
  int st;
  if (!live(r, s))
    return;
  memset(r->out, 0xEE, n);
  begin(r);
  st = um_copy_to_host(r->s[s].b, off, r->out, n, async ? &e : NULL);
  st = finish(st, e);
  if (st == UM_OK)
    model_check(r, s, off, r->out, n, name);
  end(r, name, st, false);
}

static void copy_step(run *r, int d, size_t doff, int s, size_t soff, size_t n, bool async,
                      const char *name) {
  um_event *e = NULL;
  int st;
  if (!live(r, d) || !live(r, s))
    return;
  begin(r);
  st = um_copy(r->s[d].b, doff, r->s[s].b, soff, n, async ? &e : NULL);
  st = finish(st, e);
  if (st == UM_OK)
    model_copy(r, d, doff, s, soff, n);
  else
    model_unknown(r, d, doff, n);
  end(r, name, st, false);
}

static void fill_step(run *r, int s, size_t off, int v, size_t n, bool async, const char *name) {
  um_event *e = NULL;
  int st;
  if (!live(r, s))
    return;
  begin(r);
  st = um_fill(r->s[s].b, off, v, n, async ? &e : NULL);
  st = finish(st, e);
  if (st == UM_OK)
    model_fill(r, s, off, v, n);
  else
    model_unknown(r, s, off, n);
  end(r, name, st, false);
}

/* Map for writing, write src, unmap: two steps. */
static void map_write_steps(run *r, int s, um_map_mode mode, size_t off, const unsigned char *src, size_t n,
                            const char *map_name, const char *unmap_name) {
  void *p = NULL;
  int st;
  if (!live(r, s))
    return;
  begin(r);
  st = um_map(r->s[s].b, mode, off, n, &p);
  if (st == UM_OK && mode != UM_MAP_WRITE_DISCARD)
    model_check(r, s, off, p, n, map_name);
  if (!end(r, map_name, st, false))
    return;
  memcpy(p, src, n);
  begin(r);
  st = um_unmap(r->s[s].b, p);
  if (st == UM_OK)
    model_set(r, s, off, src, n);
  else
    model_unknown(r, s, off, n);
  end(r, unmap_name, st, false);
}

static void map_read_steps(run *r, int s, size_t off, size_t n, const char *map_name,
                           const char *unmap_name) {
  void *p = NULL;
  int st;
  if (!live(r, s))
    return;
  begin(r);
  st = um_map(r->s[s].b, UM_MAP_READ, off, n, &p);
  if (st == UM_OK)
    model_check(r, s, off, p, n, map_name);
  if (!end(r, map_name, st, false))
    return;
  begin(r);
  end(r, unmap_name, um_unmap(r->s[s].b, p), false);
}

/* Four copies in one batch, in every direction; the batch's status is
 * the first failure among them. */
static void batch_step(run *r) {
  static unsigned char z_then[MAX_SIZE], z_then_known[MAX_SIZE];
  um_copy_op ops[4];
  um_event *e = NULL;
  int st;
  if (!live(r, A) || !live(r, Z) || !live(r, B) || !live(r, H))
    return;
  memset(ops, 0, sizeof(ops));
  ops[0] = (um_copy_op){.dst = r->s[A].b, .dst_off = 0, .host_src = pat[2], .bytes = 2 * KiB};
  ops[1] = (um_copy_op){.host_dst = r->out2, .src = r->s[Z].b, .src_off = 0, .bytes = 4 * KiB};
  ops[2] = (um_copy_op){.dst = r->s[Z].b, .dst_off = 0, .src = r->s[A].b, .src_off = 0, .bytes = 1 * KiB};
  ops[3] = (um_copy_op){.dst = r->s[B].b, .dst_off = 0, .src = r->s[H].b, .src_off = 0, .bytes = 4 * KiB};
  memset(r->out2, 0xEE, 4 * KiB);
  begin(r);
  st = um_copy_batch(r->m, ops, 4, &e);
  st = finish(st, e);
  if (st == UM_OK) {
    /* Operations on one buffer take effect in the order issued. */
    model_set(r, A, 0, pat[2], 2 * KiB);
    memcpy(z_then, r->s[Z].expect, 4 * KiB);
    memcpy(z_then_known, r->s[Z].known, 4 * KiB);
    model_copy(r, Z, 0, A, 0, 1 * KiB);
    model_copy(r, B, 0, H, 0, 4 * KiB);
    for (size_t i = 0; i < 4 * KiB; i++)
      if (z_then_known[i])
        cr_assert_eq(r->out2[i], z_then[i], "batch: byte %zu read from Z", i);
  } else {
    model_unknown(r, A, 0, 2 * KiB);
    model_unknown(r, Z, 0, 1 * KiB);
    model_unknown(r, B, 0, 4 * KiB);
  }
  end(r, "batch: h2d A, d2h Z, Z<-A, B<-H", st, false);
}

/* Two asynchronous operations in flight on the fault device's queue. */
static void two_in_flight_step(run *r) {
  um_event *e1 = NULL, *e2 = NULL;
  int s1, s2;
  if (!live(r, A))
    return;
  begin(r);
  s1 = um_copy_from_host(r->s[A].b, 0, pat[3], 4 * KiB, &e1);
  s2 = um_fill(r->s[A].b, 4 * KiB, 0x77, 4 * KiB, &e2);
  s1 = finish(s1, e1);
  s2 = finish(s2, e2);
  if (s1 == UM_OK)
    model_set(r, A, 0, pat[3], 4 * KiB);
  else
    model_unknown(r, A, 0, 4 * KiB);
  if (s2 == UM_OK)
    model_fill(r, A, 4 * KiB, 0x77, 4 * KiB);
  else
    model_unknown(r, A, 4 * KiB, 4 * KiB);
  end(r, "two in flight: h2d A + fill A", s1 != UM_OK ? s1 : s2, false);
}

/* Release A while a pipelined copy into it is in flight: the block goes
 * back once the copy finished. */
static void release_in_flight_step(run *r) {
  um_event *e = NULL;
  int st;
  if (!live(r, A))
    return;
  begin(r);
  st = um_copy_from_host(r->s[A].b, 8 * KiB, pat[0], 40 * KiB, &e);
  cr_assert_eq(um_release(r->s[A].b), UM_OK);
  r->s[A].b = NULL;
  st = finish(st, e);
  /* synchronize drains the manager, so the deferred recycling is done */
  cr_assert_eq(um_device_synchronize(r->fd), UM_OK);
  end(r, "release A with a copy in flight", st, false);
}

static void trim_step(run *r) {
  begin(r);
  end(r, "trim", um_pool_trim(r->m, 0), false);
}

static void wrap_step(run *r) {
  um_buffer *b = NULL;
  int st;
  begin(r);
  st = um_wrap_host(r->m, r->wrap_mem, sizeof(r->wrap_mem), UM_WRAP_READONLY, &b);
  if (st == UM_OK) {
    r->s[W].b = b;
    model_set(r, W, 0, r->wrap_mem, sizeof(r->wrap_mem));
  }
  end(r, "wrap W read-only", st, true);
}

/* Read every live buffer back with faults paused, and compare. */
static void checkpoint(run *r, const char *where) {
  static unsigned char tmp[MAX_SIZE];
  fault_pause(true);
  for (int s = 0; s < NSLOTS; s++) {
    if (!live(r, s))
      continue;
    cr_assert_eq(um_copy_to_host(r->s[s].b, 0, tmp, r->s[s].size, NULL), UM_OK, "%s: read back slot %d: %s",
                 where, s, um_last_error());
    model_check(r, s, 0, tmp, r->s[s].size, where);
  }
  fault_pause(false);
}

static void workload(run *r) {
  alloc_step(r, A, r->fd, UM_DEVICE, 0, "alloc A (fault, device)");
  alloc_step(r, P, r->fd, UM_PINNED, 0, "alloc P (fault, pinned)");
  alloc_step(r, H, r->cpu, UM_HOST, 0, "alloc H (cpu, host)");
  alloc_step(r, Z, r->fd, UM_DEVICE, UM_ALLOC_ZERO, "alloc Z (fault, device, zeroed)");
  alloc_step(r, B, r->fm, UM_DEVICE, 0, "alloc B (fault-map, device)");
  alloc_step(r, Q, r->fm, UM_PINNED, 0, "alloc Q (fault-map, pinned)");
  wrap_step(r);

  h2d_step(r, A, 0, pat[0], 48 * KiB, false, "h2d A 48K blocking (pipelined)");
  h2d_step(r, A, 100, pat[1], 1000, true, "h2d A 1000 async (native)");
  d2h_step(r, A, 0, 48 * KiB, true, "d2h A 48K async (pipelined)");
  fill_step(r, A, 10, 0x5A, 5000, true, "fill A async (native)");
  copy_step(r, H, 0, A, 0, 48 * KiB, false, "H <- A 48K blocking (pipelined)");
  copy_step(r, P, 0, A, 4 * KiB, 8 * KiB, true, "P <- A async (pinned d2h)");
  fill_step(r, P, 0, 0x33, 100, false, "fill P blocking (host view)");
  copy_step(r, A, 20 * KiB, P, 0, 8 * KiB, true, "A <- P async (pinned h2d)");
  copy_step(r, Z, 0, A, 40 * KiB, 4 * KiB, true, "Z <- A async (device-local)");
  copy_step(r, B, 0, A, 0, 20 * KiB, false, "B <- A blocking (staged between devices)");
  copy_step(r, A, 44 * KiB, B, 16 * KiB, 4 * KiB, true, "A <- B async (staged on a worker)");
  copy_step(r, B, 4 * KiB, W, 0, 4 * KiB, true, "B <- W async (h2d on a worker)");
  d2h_step(r, Z, 0, 4 * KiB, false, "d2h Z blocking (direct)");
  map_write_steps(r, A, UM_MAP_READ_WRITE, 1000, pat[2], 2000, "map A read-write (shadow fetch)",
                  "unmap A (write back)");
  map_read_steps(r, B, 0, 20 * KiB, "map B read (native)", "unmap B read");
  map_write_steps(r, B, UM_MAP_WRITE_DISCARD, 0, pat[3], 4 * KiB, "map B write-discard (native)",
                  "unmap B (write back)");
  map_write_steps(r, Q, UM_MAP_WRITE, 0, pat[1], 4 * KiB, "map Q write (host view)", "unmap Q");
  checkpoint(r, "checkpoint 1");

  batch_step(r);
  release_step(r, Z, "release Z");
  trim_step(r);
  alloc_step(r, Z, r->fd, UM_DEVICE, UM_ALLOC_ZERO, "alloc Z again (zeroed)");
  d2h_step(r, Z, 0, 4 * KiB, true, "d2h Z async (native)");
  release_step(r, P, "release P");
  alloc_step(r, P, r->fd, UM_PINNED, 0, "alloc P again (pool hit)");
  two_in_flight_step(r);
  checkpoint(r, "checkpoint 2");

  release_in_flight_step(r);
  release_step(r, P, "release P");
  release_step(r, H, "release H");
  release_step(r, Z, "release Z");
  release_step(r, B, "release B");
  release_step(r, Q, "release Q");
  release_step(r, W, "release W");
  trim_step(r);
}

static const size_t slot_sizes[NSLOTS] = {48 * KiB, 8 * KiB, 48 * KiB, 4 * KiB, 20 * KiB, 4 * KiB, 4 * KiB};

static void options(um_options *o, int debug) {
  um_options_init(o);
  snprintf(o->backends, sizeof(o->backends), "cpu");
  o->enable_pooling = 1;
  o->trim_interval_ms = 0; /* no timer: the backend sees the same calls every run */
  o->trim_on_pressure = 1;
  o->scrub = 0;
  o->debug = debug;
  o->max_concurrent_transfers = 2;
  o->use_pinned_staging = 1;
  o->staging_chunk_bytes = 16 * KiB;
  o->pinned_pool_bytes = 64 * KiB;
  o->log_level = UM_LOG_ERROR;
}

/* One run of the workload with one planned fault; returns the faults the
 * backend injected. */
static uint64_t do_run(sweep_kind kind, uint64_t nth, int status, int debug) {
  run *r = calloc(1, sizeof(*r));
  um_options o;
  um_stats s;
  fault_counts c;
  uint64_t injected;
  cr_assert_not_null(r);
  r->kind = kind;
  r->nth = nth;
  r->fault_status = status;
  r->hit_step = -1;
  for (int i = 0; i < NSLOTS; i++)
    r->s[i].size = slot_sizes[i];
  memcpy(r->wrap_mem, pat[2] + 123, sizeof(r->wrap_mem));
  options(&o, debug);
  fault_configure(1, 256u << 20);
  fault_reset();
  cr_assert_eq(fault_manager_create(&o, &r->m), UM_OK, "%s", um_last_error());
  r->cpu = um_device_get(r->m, 0);
  r->fd = um_device_get(r->m, 1);
  r->fm = um_device_get(r->m, 2);
  switch (kind) {
  case SWEEP_NONE: break;
  case SWEEP_ALLOC_ONCE: fault_fail_alloc(nth, false); break;
  case SWEEP_ALLOC_STICKY: fault_fail_alloc(nth, true); break;
  case SWEEP_XFER_RUN: fault_fail_xfer(nth, false, status, false); break;
  case SWEEP_XFER_SUBMIT: fault_fail_xfer(nth, false, status, true); break;
  }

  workload(r);

  /* Everything was released and trimmed: nothing in use, nothing idle. */
  cr_assert_eq(um_stats_get(r->m, NULL, &s), UM_OK);
  cr_assert_eq(s.active_buffers, 0);
  cr_assert_eq(s.bytes_in_use, 0);
  cr_assert_eq(s.bytes_pooled, 0);
  cr_assert_eq(s.oom_retries,
               (kind == SWEEP_ALLOC_ONCE || kind == SWEEP_ALLOC_STICKY) && r->hit_alloc_step ? 1u : 0u,
               "%s fault %llu: oom_retries %llu", sweep_names[kind], (unsigned long long)nth,
               (unsigned long long)s.oom_retries);
  fault_counts_get(&c);
  injected = c.injected_allocs + c.injected_xfers;
  if (kind == SWEEP_NONE) {
    memcpy(dry, r->rec, sizeof(dry));
    dry_steps = r->step;
    dry_allocs = c.allocs;
    dry_xfers = c.xfers;
  } else {
    /* The fault landed, in the step the dry run says it belongs to. */
    bool allocs = kind == SWEEP_ALLOC_ONCE || kind == SWEEP_ALLOC_STICKY;
    int want = 0;
    while (want < dry_steps && (allocs ? dry[want].allocs : dry[want].xfers) < nth)
      want++;
    cr_assert_geq(r->hit_step, 0, "%s fault %llu was never reached", sweep_names[kind],
                  (unsigned long long)nth);
    cr_assert_eq(r->hit_step, want, "%s fault %llu hit step %d (%s), the dry run has it in step %d (%s)",
                 sweep_names[kind], (unsigned long long)nth, r->hit_step, dry[r->hit_step].name, want,
                 dry[want].name);
    if (kind != SWEEP_ALLOC_STICKY)
      cr_assert_eq(injected, 1);
  }
  cr_assert_eq(um_manager_destroy(r->m), UM_OK, "%s fault %llu: destroy: %s", sweep_names[kind],
               (unsigned long long)nth, um_last_error());
  fault_counts_get(&c);
  cr_assert_eq(c.live_blocks, 0, "%s fault %llu: %llu blocks leaked", sweep_names[kind],
               (unsigned long long)nth, (unsigned long long)c.live_blocks);
  cr_assert_eq(c.leaked_at_close, 0);
  free(r);
  return injected;
}

static void dry_run(int debug) {
  make_patterns();
  do_run(SWEEP_NONE, 0, UM_OK, debug);
  cr_assert_gt(dry_allocs, 5);
  cr_assert_gt(dry_xfers, 20);
}

/* Sweep one kind of fault over every point of the workload. */
static void sweep(sweep_kind kind, int status, int debug) {
  bool allocs = kind == SWEEP_ALLOC_ONCE || kind == SWEEP_ALLOC_STICKY;
  uint64_t points, injected = 0;
  dry_run(debug);
  points = allocs ? dry_allocs : dry_xfers;
  for (uint64_t n = 1; n <= points; n++)
    injected += do_run(kind, n, status, debug);
  printf("faults: %s%s: %llu %s failures injected over %llu runs (%d steps), all handled\n",
         sweep_names[kind], debug ? " (debug)" : "", (unsigned long long)injected, allocs ? "alloc" : "copy",
         (unsigned long long)points, dry_steps);
  fflush(stdout);
}

Test(faults, dry_run_succeeds) {
  dry_run(0);
  printf("faults: workload of %d steps makes %llu allocations and %llu transfers on the fault devices\n",
         dry_steps, (unsigned long long)dry_allocs, (unsigned long long)dry_xfers);
  for (int i = 0; i < dry_steps; i++)
    printf("faults: step %2d: %-44s allocations %2llu, transfers %2llu\n", i + 1, dry[i].name,
           (unsigned long long)(dry[i].allocs - (i ? dry[i - 1].allocs : 0)),
           (unsigned long long)(dry[i].xfers - (i ? dry[i - 1].xfers : 0)));
  fflush(stdout);
}

Test(faults, every_allocation_fails_once) { sweep(SWEEP_ALLOC_ONCE, UM_ENOMEM, 0); }
Test(faults, every_allocation_fails_for_good) { sweep(SWEEP_ALLOC_STICKY, UM_ENOMEM, 0); }
Test(faults, every_transfer_fails_when_run) { sweep(SWEEP_XFER_RUN, UM_EBACKEND, 0); }
Test(faults, every_transfer_is_refused_at_submit) { sweep(SWEEP_XFER_SUBMIT, UM_ENODEV, 0); }

/* The same with the debug quarantine: released blocks are held back and
 * poisoned, so the workload takes other blocks and paths. */
Test(faults, debug_every_allocation_fails_once) { sweep(SWEEP_ALLOC_ONCE, UM_ENOMEM, 1); }
Test(faults, debug_every_allocation_fails_for_good) { sweep(SWEEP_ALLOC_STICKY, UM_ENOMEM, 1); }
Test(faults, debug_every_transfer_fails_when_run) { sweep(SWEEP_XFER_RUN, UM_EBACKEND, 1); }
Test(faults, debug_every_transfer_is_refused_at_submit) { sweep(SWEEP_XFER_SUBMIT, UM_ENODEV, 1); }

/* ------------------------------------------------------------------------ */
/* Device loss */

static um_manager *lost_setup(um_device **fd, um_device **fm) {
  um_options o;
  um_manager *m;
  options(&o, 0);
  fault_configure(1, 256u << 20);
  fault_reset();
  cr_assert_eq(fault_manager_create(&o, &m), UM_OK);
  *fd = um_device_get(m, 1);
  *fm = um_device_get(m, 2);
  return m;
}

Test(faults, device_lost_fails_every_later_operation_cleanly) {
  static unsigned char src[48 * KiB], back[48 * KiB];
  um_device *fd, *fm;
  um_manager *m = lost_setup(&fd, &fm);
  um_device *cpu = um_device_get(m, 0);
  um_buffer *a, *p, *h, *b, *x = NULL;
  um_event *ev[8];
  uint64_t fr, tot;
  void *ptr = NULL;
  um_stats s;
  fault_counts c;
  int st;
  make_patterns();
  cr_assert_eq(um_alloc(m, fd, sizeof(src), UM_DEVICE, 0, &a), UM_OK);
  cr_assert_eq(um_alloc(m, fd, 4 * KiB, UM_PINNED, 0, &p), UM_OK);
  cr_assert_eq(um_alloc(m, cpu, sizeof(src), UM_HOST, 0, &h), UM_OK);
  cr_assert_eq(um_alloc(m, fm, sizeof(src), UM_DEVICE, 0, &b), UM_OK);
  cr_assert_eq(um_copy_from_host(b, 0, pat[0], sizeof(src), NULL), UM_OK);
  /* Operations queued on the device when it goes: each either finished
   * before, or fails with UM_ENODEV. */
  for (int i = 0; i < 8; i++)
    cr_assert_eq(um_fill(a, (size_t)i * 4 * KiB, i, 4 * KiB, &ev[i]), UM_OK);
  cr_assert_eq(fault_lose(fd), UM_OK);
  for (int i = 0; i < 8; i++) {
    st = um_event_wait(ev[i]);
    cr_assert(st == UM_OK || st == UM_ENODEV, "queued fill %d: %s", i, um_err_name(st));
    um_event_release(ev[i]);
  }
  /* Every later operation on the lost device fails, with a code. */
  cr_assert_eq(um_alloc(m, fd, 100, UM_DEVICE, UM_ALLOC_UNPOOLED, &x), UM_ENODEV);
  cr_assert_eq(um_alloc(m, fd, 100, UM_PINNED, 0, &x), UM_ENODEV);
  cr_assert_null(x);
  cr_assert_eq(um_copy_from_host(a, 0, src, 100, NULL), UM_ENODEV);
  cr_assert_eq(um_copy_from_host(a, 0, src, sizeof(src), NULL), UM_ENODEV, "pipelined");
  cr_assert_eq(um_copy_to_host(a, 0, back, 100, NULL), UM_ENODEV);
  cr_assert_eq(um_copy_to_host(a, 0, back, 100, &ev[0]), UM_OK);
  cr_assert_eq(um_event_wait(ev[0]), UM_ENODEV, "the failure surfaces through the event");
  um_event_release(ev[0]);
  cr_assert_eq(um_fill(a, 0, 1, 10, NULL), UM_ENODEV);
  cr_assert_eq(um_copy(h, 0, a, 0, 1000, NULL), UM_ENODEV);
  cr_assert_eq(um_copy(a, 0, b, 0, 1000, NULL), UM_ENODEV, "staged into the lost device");
  cr_assert_eq(um_copy(b, 0, a, 0, 1000, NULL), UM_ENODEV, "staged from the lost device");
  cr_assert_eq(um_map(a, UM_MAP_READ, 0, 100, &ptr), UM_ENODEV);
  cr_assert_null(ptr);
  cr_assert_eq(um_device_memory(fd, &fr, &tot), UM_ENODEV);
  cr_assert_eq(um_device_synchronize(fd), UM_ENODEV);
  {
    um_copy_op ops[2] = {{.dst = a, .host_src = src, .bytes = 64}, {.dst = h, .host_src = src, .bytes = 64}};
    cr_assert_eq(um_copy_batch(m, ops, 2, NULL), UM_ENODEV);
  }
  /* Pinned memory is host memory: it still reads and writes. */
  cr_assert_eq(um_copy_from_host(p, 0, pat[1], 4 * KiB, NULL), UM_OK);
  cr_assert_eq(um_copy_to_host(p, 0, back, 4 * KiB, NULL), UM_OK);
  cr_assert_arr_eq(back, pat[1], 4 * KiB);
  /* The other devices are not affected. */
  cr_assert_eq(um_copy(h, 0, b, 0, sizeof(src), NULL), UM_OK);
  cr_assert_eq(um_copy_to_host(h, 0, back, sizeof(back), NULL), UM_OK);
  cr_assert_arr_eq(back, pat[0], sizeof(back));
  cr_assert_eq(um_device_synchronize(fm), UM_OK);
  /* Everything can still be released and the manager destroyed. */
  cr_assert_eq(um_release(a), UM_OK);
  cr_assert_eq(um_release(p), UM_OK);
  cr_assert_eq(um_release(h), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_stats_get(m, NULL, &s), UM_OK);
  cr_assert_eq(s.active_buffers, 0);
  cr_assert_eq(s.bytes_in_use, 0);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
  fault_counts_get(&c);
  cr_assert_eq(c.live_blocks, 0);
  cr_assert_eq(c.leaked_at_close, 0);
  printf("faults: device lost: 16 later operations failed cleanly, other devices unaffected\n");
  fflush(stdout);
}

Test(faults, device_lost_with_buffers_never_released) {
  um_device *fd, *fm;
  um_manager *m = lost_setup(&fd, &fm);
  um_buffer *a, *b;
  um_event *e;
  fault_counts c;
  cr_assert_eq(um_alloc(m, fd, 64 * KiB, UM_DEVICE, 0, &a), UM_OK);
  cr_assert_eq(um_alloc(m, fd, 64 * KiB, UM_PINNED, 0, &b), UM_OK);
  cr_assert_eq(um_fill(a, 0, 7, 64 * KiB, &e), UM_OK);
  cr_assert_eq(fault_lose(fd), UM_OK);
  um_event_release(e); /* never waited for */
  cr_assert_eq(um_manager_destroy(m), UM_ELEAK);
  fault_counts_get(&c);
  cr_assert_eq(c.live_blocks, 0, "destroy frees the lost device's blocks");
  cr_assert_eq(c.leaked_at_close, 0);
}

/* ------------------------------------------------------------------------ */
/* Real exhaustion of a small device: trim and retry, then UM_ENOMEM. */

static int oom_calls;
static um_manager *oom_manager;
static um_buffer *oom_victim;

/* The application's last resort: free something and ask for a retry. */
static int free_victim(void *ctx, um_device *d, size_t bytes) {
  (void)ctx, (void)d, (void)bytes;
  oom_calls++;
  if (oom_victim == NULL)
    return 0;
  cr_assert_eq(um_release(oom_victim), UM_OK);
  oom_victim = NULL;
  cr_assert_eq(um_pool_trim(oom_manager, 0), UM_OK);
  return 1;
}

Test(faults, small_device_trims_retries_then_reports_enomem) {
  um_options o;
  um_manager *m;
  um_device *fd;
  um_buffer *x, *y, *z = NULL;
  um_stats s;
  options(&o, 0);
  fault_configure(1, 256 * KiB);
  fault_reset();
  cr_assert_eq(fault_manager_create(&o, &m), UM_OK);
  fault_configure(1, 256u << 20);
  fd = um_device_get(m, 1);
  cr_assert_eq(um_alloc(m, fd, 128 * KiB, UM_DEVICE, 0, &x), UM_OK);
  cr_assert_eq(um_release(x), UM_OK); /* idle in the pool */
  cr_assert_eq(um_alloc(m, fd, 192 * KiB, UM_DEVICE, 0, &y), UM_OK);
  cr_assert_eq(um_stats_get(m, fd, &s), UM_OK);
  cr_assert_eq(s.oom_retries, 1, "the first try found the device full");
  cr_assert_eq(s.trims, 1);
  cr_assert_eq(s.bytes_trimmed, 128 * KiB);
  cr_assert_eq(s.bytes_reserved, 192 * KiB);
  /* Nothing idle to give back: UM_ENOMEM, and nothing changed. */
  cr_assert_eq(um_alloc(m, fd, 128 * KiB, UM_DEVICE, 0, &z), UM_ENOMEM);
  cr_assert_null(z);
  cr_assert_eq(um_stats_get(m, fd, &s), UM_OK);
  cr_assert_eq(s.oom_retries, 2);
  cr_assert_eq(s.active_buffers, 1);
  cr_assert_eq(s.bytes_in_use, 192 * KiB);
  cr_assert_eq(s.bytes_reserved, fault_device_live_bytes(fd));
  cr_assert_eq(um_release(y), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

Test(faults, oom_callback_frees_memory_and_the_retry_succeeds) {
  um_options o;
  um_device *fd;
  um_buffer *z = NULL;
  um_stats s;
  options(&o, 0);
  o.on_oom = free_victim;
  fault_configure(1, 256 * KiB);
  fault_reset();
  cr_assert_eq(fault_manager_create(&o, &oom_manager), UM_OK);
  fault_configure(1, 256u << 20);
  fd = um_device_get(oom_manager, 1);
  cr_assert_eq(um_alloc(oom_manager, fd, 192 * KiB, UM_DEVICE, 0, &oom_victim), UM_OK);
  cr_assert_eq(um_alloc(oom_manager, fd, 128 * KiB, UM_DEVICE, 0, &z), UM_OK);
  cr_assert_eq(oom_calls, 1);
  cr_assert_eq(um_stats_get(oom_manager, fd, &s), UM_OK);
  cr_assert_eq(s.oom_retries, 2, "one retry after the trim, one after the callback");
  cr_assert_eq(s.active_buffers, 1);
  cr_assert_eq(s.bytes_in_use, 128 * KiB);
  /* The callback declines: UM_ENOMEM. */
  cr_assert_eq(um_alloc(oom_manager, fd, 192 * KiB, UM_DEVICE, 0, &oom_victim), UM_ENOMEM);
  cr_assert_eq(oom_calls, 2);
  cr_assert_eq(um_release(z), UM_OK);
  cr_assert_eq(um_manager_destroy(oom_manager), UM_OK);
}

/* A write-back that fails at um_unmap loses the mapped writes, and says
 * so; afterwards a map and a copy see the same bytes (the device's). */
Test(faults, failed_write_back_leaves_map_and_copy_agreeing) {
  static unsigned char back[4 * KiB];
  um_options o;
  um_manager *m;
  um_buffer *a;
  fault_counts c;
  void *p;
  make_patterns();
  options(&o, 0);
  fault_configure(1, 256u << 20);
  fault_reset();
  cr_assert_eq(fault_manager_create(&o, &m), UM_OK);
  cr_assert_eq(um_alloc(m, um_device_get(m, 1), 4 * KiB, UM_DEVICE, 0, &a), UM_OK);
  cr_assert_eq(um_copy_from_host(a, 0, pat[0], 4 * KiB, NULL), UM_OK);
  cr_assert_eq(um_map(a, UM_MAP_READ_WRITE, 0, 4 * KiB, &p), UM_OK);
  memset(p, 0x5C, 100);
  fault_counts_get(&c);
  fault_fail_xfer(c.xfers + 1, false, UM_EBACKEND, false);
  cr_assert_eq(um_unmap(a, p), UM_EBACKEND);
  cr_assert_eq(um_buffer_valid(a), UM_VALID_DEVICE);
  cr_assert_eq(um_copy_to_host(a, 0, back, sizeof(back), NULL), UM_OK);
  cr_assert_arr_eq(back, pat[0], sizeof(back), "the device kept its bytes");
  cr_assert_eq(um_map(a, UM_MAP_READ, 0, 4 * KiB, &p), UM_OK);
  cr_assert_arr_eq(p, back, sizeof(back), "a map shows what a copy reads");
  cr_assert_eq(um_unmap(a, p), UM_OK);
  cr_assert_eq(um_release(a), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}
