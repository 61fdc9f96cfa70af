/* Transfers through unimem against the raw OpenCL calls on the same device
 * and against memcpy, in one run: the seeds' transfer tables (host<->device
 * pinned and pageable, device-local, device<->device peer and staged, many
 * small copies batched or one by one, aligned and unaligned offsets).
 *
 * The raw side loads libOpenCL.so.1 itself and opens the same platform and
 * devices that unimem's OpenCL backend opens first. Every figure is the
 * median of repeated samples; a sample of a small size times a run of
 * operations and divides.
 *
 *   bench_transfer [--quick] [--small] [--count unimem|raw ROUNDS] [--json FILE]
 *
 * --small measures the small operations table alone (issue 13's targets).
 * --count runs ROUNDS x 1000 copies with an event each on one side only,
 * untimed, to count instructions under callgrind (count_events).
 *
 * Two PoCL devices are asked for (POCL_DEVICES="pthread pthread") unless
 * the environment already chose. Built as the `unimem bench transfer`
 * subcommand with -DUM_BENCH_NO_MAIN (entry point um_bench_transfer_main).
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "report.h"
#include "unimem.h"

#if defined(__has_include)
#if __has_include(<CL/cl.h>)
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#define BT_HAVE_CL_HEADER 1
#endif
#endif

#define KiB ((size_t)1024)
#define MiB (1024 * KiB)
#define BATCH_OPS 1000
#define SMALL_BYTES (4 * KiB)

/* ------------------------------------------------------------------------ */
/* Timing                                                                    */

/* One measured case: run(ctx, iters) performs iters operations and returns
 * 0, or nonzero when an operation failed. */
typedef int (*bt_run_fn)(void *ctx, int iters);

typedef struct bt_plan {
  int samples;
  int iters;
} bt_plan;

#define BT_MAX_SAMPLES 64

/* One side of a comparison: unimem, the raw call, or memcpy. */
typedef struct bt_side {
  bt_run_fn run; /* NULL: not measured */
  void *ctx;
} bt_side;

/* Median nanoseconds per operation of two sides (b may be unmeasured),
 * after one untimed warm-up sample each; out[i] < 0 when side i was not
 * measured or failed. The samples of the two alternate, so that both see
 * the same machine (the machines here are shared, and their load changes
 * by the second), and each follows the other: what runs just before a
 * sample matters (a 1 MiB write right after a 1 MiB memcpy ran 20% slower
 * on PoCL), so a third side in the rotation would always follow the same
 * one and be measured unfairly. */
static void measure_pair(bt_side a, bt_side b, bt_plan plan, double *out) {
  bt_side sides[2] = {a, b};
  double t[2][BT_MAX_SAMPLES];
  bool ok[2];
  if (plan.samples > BT_MAX_SAMPLES)
    plan.samples = BT_MAX_SAMPLES;
  for (int k = 0; k < 2; k++) {
    out[k] = -1;
    ok[k] = sides[k].run != NULL && sides[k].run(sides[k].ctx, plan.iters) == 0;
  }
  for (int s = 0; s < plan.samples; s++) {
    for (int k = 0; k < 2; k++) {
      double t0;
      if (!ok[k])
        continue;
      t0 = bench_now_ns();
      if (sides[k].run(sides[k].ctx, plan.iters) != 0) {
        ok[k] = false;
        continue;
      }
      t[k][s] = (bench_now_ns() - t0) / plan.iters;
    }
  }
  for (int k = 0; k < 2; k++)
    if (ok[k])
      out[k] = bench_median(t[k], plan.samples);
}

/* ------------------------------------------------------------------------ */
/* Raw OpenCL, loaded at run time                                            */

#ifdef BT_HAVE_CL_HEADER
#define RAW_ENTRY_POINTS(XX)                                                   \
  XX(clGetPlatformIDs)                                                         \
  XX(clGetDeviceIDs)                                                           \
  XX(clCreateContext)                                                          \
  XX(clCreateCommandQueue)                                                     \
  XX(clCreateBuffer)                                                           \
  XX(clEnqueueWriteBuffer)                                                     \
  XX(clEnqueueReadBuffer)                                                      \
  XX(clEnqueueCopyBuffer)                                                      \
  XX(clEnqueueMapBuffer)                                                       \
  XX(clEnqueueUnmapMemObject)                                                  \
  XX(clFinish)                                                                 \
  XX(clFlush)                                                                  \
  XX(clSetEventCallback)                                                       \
  XX(clWaitForEvents)                                                          \
  XX(clReleaseEvent)                                                           \
  XX(clReleaseMemObject)                                                       \
  XX(clReleaseCommandQueue)                                                    \
  XX(clReleaseContext)

typedef struct raw_cl {
#define RAW_MEMBER_(name) __typeof__(name) *name;
  RAW_ENTRY_POINTS(RAW_MEMBER_)
#undef RAW_MEMBER_
  void *lib;
  cl_context ctx;
  cl_command_queue q[2];
  int ndev;
} raw_cl;

/* The first platform that has devices, as the backend orders them; its
 * first two devices in one context, as the backend puts them. */
static int raw_open(raw_cl *r, char *why, size_t cap) {
  cl_platform_id plats[16];
  cl_uint nplat = 0;
  cl_int err;
  memset(r, 0, sizeof(*r));
  r->lib = dlopen("libOpenCL.so.1", RTLD_NOW | RTLD_LOCAL);
  if (r->lib == NULL) {
    snprintf(why, cap, "%s", dlerror());
    return -1;
  }
#define RAW_LOAD_(name)                                                        \
  {                                                                            \
    void *sym_ = dlsym(r->lib, #name);                                         \
    if (sym_ == NULL) {                                                        \
      snprintf(why, cap, "%s missing", #name);                                 \
      return -1;                                                               \
    }                                                                          \
    memcpy(&r->name, &sym_, sizeof(sym_));                                     \
  }
  RAW_ENTRY_POINTS(RAW_LOAD_)
#undef RAW_LOAD_
  if (r->clGetPlatformIDs(16, plats, &nplat) != CL_SUCCESS || nplat == 0) {
    snprintf(why, cap, "no OpenCL platform");
    return -1;
  }
  for (cl_uint p = 0; p < nplat && nplat <= 16; p++) {
    cl_device_id ids[2];
    cl_uint n = 0;
    cl_context_properties props[] = {CL_CONTEXT_PLATFORM, (cl_context_properties)plats[p], 0};
    if (r->clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, 2, ids, &n) != CL_SUCCESS || n == 0)
      continue;
    if (n > 2)
      n = 2;
    r->ctx = r->clCreateContext(props, n, ids, NULL, NULL, &err);
    if (r->ctx == NULL) {
      snprintf(why, cap, "clCreateContext failed (%d)", (int)err);
      return -1;
    }
    for (cl_uint i = 0; i < n; i++) {
      r->q[i] = r->clCreateCommandQueue(r->ctx, ids[i], 0, &err);
      if (r->q[i] == NULL) {
        snprintf(why, cap, "clCreateCommandQueue failed (%d)", (int)err);
        return -1;
      }
    }
    r->ndev = (int)n;
    return 0;
  }
  snprintf(why, cap, "no OpenCL device");
  return -1;
}

static void raw_close(raw_cl *r) {
  for (int i = 0; i < r->ndev; i++)
    r->clReleaseCommandQueue(r->q[i]);
  if (r->ctx)
    r->clReleaseContext(r->ctx);
  /* The library stays loaded: drivers keep threads that do not survive
   * dlclose. */
}

/* A device buffer with its memory committed on device i (a first write
 * places it, as the backend's migration does). */
static cl_mem raw_device_buffer(raw_cl *r, int i, size_t bytes) {
  cl_int err;
  cl_mem m = r->clCreateBuffer(r->ctx, CL_MEM_READ_WRITE, bytes, NULL, &err);
  char *zero;
  if (m == NULL)
    return NULL;
  zero = calloc(1, bytes);
  if (zero == NULL || r->clEnqueueWriteBuffer(r->q[i], m, CL_TRUE, 0, bytes, zero, 0, NULL, NULL) != CL_SUCCESS) {
    free(zero);
    r->clReleaseMemObject(m);
    return NULL;
  }
  free(zero);
  return m;
}

/* A mapped CL_MEM_ALLOC_HOST_PTR buffer: the driver's pinned memory. */
static void *raw_pinned(raw_cl *r, size_t bytes, cl_mem *out) {
  cl_int err;
  void *p;
  *out = r->clCreateBuffer(r->ctx, CL_MEM_READ_WRITE | CL_MEM_ALLOC_HOST_PTR, bytes, NULL, &err);
  if (*out == NULL)
    return NULL;
  p = r->clEnqueueMapBuffer(r->q[0], *out, CL_TRUE, CL_MAP_READ | CL_MAP_WRITE, 0, bytes, 0, NULL, NULL,
                            &err);
  if (p == NULL) {
    r->clReleaseMemObject(*out);
    *out = NULL;
  }
  return p;
}

static void raw_pinned_free(raw_cl *r, cl_mem m, void *p) {
  if (m == NULL)
    return;
  r->clEnqueueUnmapMemObject(r->q[0], m, p, 0, NULL, NULL);
  r->clFinish(r->q[0]);
  r->clReleaseMemObject(m);
}
#endif /* BT_HAVE_CL_HEADER */

/* ------------------------------------------------------------------------ */
/* Cases                                                                     */

typedef enum {
  OP_H2D,        /* host pointer -> device buffer */
  OP_H2D_ASYNC,  /* the same, issued with an event, then waited for */
  OP_D2H,        /* device buffer -> host pointer */
  OP_COPY,       /* buffer -> buffer */
  OP_BATCH,      /* BATCH_OPS x SMALL_BYTES host -> device, one batch */
  OP_LOOP,       /* the same as BATCH_OPS blocking copies */
  OP_EVENTS,     /* the same as BATCH_OPS copies with an event each (raw: a
                    native event, a callback and a flush each), all waited */
  OP_MEMCPY
} bt_op;

typedef struct bt_case {
  bt_op op;
  um_buffer *dst, *src;
  size_t dst_off, src_off, bytes;
  char *host;      /* host side of H2D/D2H and memcpy source */
  char *host2;     /* memcpy destination */
  um_manager *m;
  um_copy_op *ops; /* OP_BATCH */
} bt_case;

/* --split: when the last OP_EVENTS sample of either side had issued its
 * copies, by the clock and by the issuing thread's CPU clock (nothing is
 * read unless split_on). */
static bool split_on;
static double issued_ns, issued_cpu_ns;

static double thread_cpu_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static void note_issued(void) {
  if (!split_on)
    return;
  issued_ns = bench_now_ns();
  issued_cpu_ns = thread_cpu_ns();
}

static int run_unimem(void *vctx, int iters) {
  bt_case *c = vctx;
  for (int i = 0; i < iters; i++) {
    int st = UM_OK;
    switch (c->op) {
    case OP_H2D:
      st = um_copy_from_host(c->dst, c->dst_off, c->host, c->bytes, NULL);
      break;
    case OP_H2D_ASYNC: {
      um_event *ev = NULL;
      st = um_copy_from_host(c->dst, c->dst_off, c->host, c->bytes, &ev);
      if (st == UM_OK) {
        st = um_event_wait(ev);
        um_event_release(ev);
      }
      break;
    }
    case OP_D2H:
      st = um_copy_to_host(c->src, c->src_off, c->host, c->bytes, NULL);
      break;
    case OP_COPY:
      st = um_copy(c->dst, c->dst_off, c->src, c->src_off, c->bytes, NULL);
      break;
    case OP_BATCH:
      st = um_copy_batch(c->m, c->ops, BATCH_OPS, NULL);
      break;
    case OP_LOOP:
      for (int k = 0; k < BATCH_OPS && st == UM_OK; k++)
        st = um_copy_from_host(c->ops[k].dst, c->ops[k].dst_off, c->ops[k].host_src, c->ops[k].bytes,
                               NULL);
      break;
    case OP_EVENTS: {
      static um_event *ev[BATCH_OPS];
      int n = 0;
      for (; n < BATCH_OPS && st == UM_OK; n++)
        st = um_copy_from_host(c->ops[n].dst, c->ops[n].dst_off, c->ops[n].host_src, c->ops[n].bytes, &ev[n]);
      note_issued();
      if (st != UM_OK)
        n--;
      for (int k = 0; k < n; k++) {
        int w = um_event_wait(ev[k]);
        st = st != UM_OK ? st : w;
        um_event_release(ev[k]);
      }
      break;
    }
    case OP_MEMCPY:
      memcpy(c->host2 + c->dst_off, c->host + c->src_off, c->bytes);
      __asm__ volatile("" ::"r"(c->host2) : "memory");
      break;
    }
    if (st != UM_OK) {
      fprintf(stderr, "bench transfer: %s (%s)\n", um_err_name(st), um_last_error());
      return 1;
    }
  }
  return 0;
}

#ifdef BT_HAVE_CL_HEADER
/* The raw side's completion callbacks (OP_EVENTS): a count under a lock,
 * the least a program that learns of completions by callback does. */
static pthread_mutex_t raw_done_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t raw_done_cond = PTHREAD_COND_INITIALIZER;
static int raw_done;

static void CL_CALLBACK raw_on_complete(cl_event ev, cl_int status, void *arg) {
  (void)ev, (void)status, (void)arg;
  pthread_mutex_lock(&raw_done_lock);
  if (++raw_done == BATCH_OPS)
    pthread_cond_signal(&raw_done_cond);
  pthread_mutex_unlock(&raw_done_lock);
}

typedef struct raw_case {
  raw_cl *r;
  bt_op op;
  int q;              /* queue of the command */
  cl_mem dst, src;
  size_t dst_off, src_off, bytes;
  char *host;
  int staged;         /* OP_COPY between devices through host memory */
  char *bounce;
} raw_case;

static int run_raw(void *vctx, int iters) {
  raw_case *c = vctx;
  raw_cl *r = c->r;
  cl_command_queue q = r->q[c->q];
  for (int i = 0; i < iters; i++) {
    cl_int err = CL_SUCCESS;
    cl_event ev;
    switch (c->op) {
    case OP_H2D:
      err = r->clEnqueueWriteBuffer(q, c->dst, CL_TRUE, c->dst_off, c->bytes, c->host, 0, NULL, NULL);
      break;
    case OP_H2D_ASYNC:
      err = r->clEnqueueWriteBuffer(q, c->dst, CL_FALSE, c->dst_off, c->bytes, c->host, 0, NULL, &ev);
      if (err == CL_SUCCESS) {
        err = r->clWaitForEvents(1, &ev);
        r->clReleaseEvent(ev);
      }
      break;
    case OP_D2H:
      err = r->clEnqueueReadBuffer(q, c->src, CL_TRUE, c->src_off, c->bytes, c->host, 0, NULL, NULL);
      break;
    case OP_COPY:
      if (c->staged) {
        err = r->clEnqueueReadBuffer(r->q[0], c->src, CL_TRUE, c->src_off, c->bytes, c->bounce, 0, NULL,
                                     NULL);
        if (err == CL_SUCCESS)
          err = r->clEnqueueWriteBuffer(r->q[1], c->dst, CL_TRUE, c->dst_off, c->bytes, c->bounce, 0,
                                        NULL, NULL);
        break;
      }
      err = r->clEnqueueCopyBuffer(q, c->src, c->dst, c->src_off, c->dst_off, c->bytes, 0, NULL, &ev);
      if (err == CL_SUCCESS) {
        err = r->clWaitForEvents(1, &ev);
        r->clReleaseEvent(ev);
      }
      break;
    case OP_BATCH: /* non-blocking writes, one wait at the end */
      for (int k = 0; k < BATCH_OPS && err == CL_SUCCESS; k++)
        err = r->clEnqueueWriteBuffer(q, c->dst, CL_FALSE, (size_t)k * SMALL_BYTES, SMALL_BYTES,
                                      c->host + (size_t)k * SMALL_BYTES, 0, NULL, NULL);
      if (err == CL_SUCCESS)
        err = r->clFinish(q);
      break;
    case OP_LOOP:
      for (int k = 0; k < BATCH_OPS && err == CL_SUCCESS; k++)
        err = r->clEnqueueWriteBuffer(q, c->dst, CL_TRUE, (size_t)k * SMALL_BYTES, SMALL_BYTES,
                                      c->host + (size_t)k * SMALL_BYTES, 0, NULL, NULL);
      break;
    case OP_EVENTS: { /* an event, a callback and a flush per write */
      static cl_event evs[BATCH_OPS];
      raw_done = 0;
      for (int k = 0; k < BATCH_OPS && err == CL_SUCCESS; k++) {
        err = r->clEnqueueWriteBuffer(q, c->dst, CL_FALSE, (size_t)k * SMALL_BYTES, SMALL_BYTES,
                                      c->host + (size_t)k * SMALL_BYTES, 0, NULL, &evs[k]);
        if (err == CL_SUCCESS)
          err = r->clSetEventCallback(evs[k], CL_COMPLETE, raw_on_complete, NULL);
        if (err == CL_SUCCESS)
          err = r->clFlush(q);
      }
      note_issued();
      if (err != CL_SUCCESS)
        break;
      pthread_mutex_lock(&raw_done_lock);
      while (raw_done < BATCH_OPS)
        pthread_cond_wait(&raw_done_cond, &raw_done_lock);
      pthread_mutex_unlock(&raw_done_lock);
      for (int k = 0; k < BATCH_OPS; k++)
        r->clReleaseEvent(evs[k]);
      break;
    }
    default:
      break;
    }
    if (err != CL_SUCCESS) {
      fprintf(stderr, "bench transfer: raw OpenCL call failed (%d)\n", (int)err);
      return 1;
    }
  }
  return 0;
}

/* The raw side of a comparison, running rc. */
static bt_side raw_side(raw_case *rc) { return (bt_side){.run = run_raw, .ctx = rc}; }
#endif

/* ------------------------------------------------------------------------ */
/* Results                                                                   */

/* A run: the report its rows go to (table, name, bytes, strategy, then
 * unimem_ns, raw_ns, memcpy_ns per operation where measured). */
typedef struct bt_run {
  bench_report *rep;
  int quick;
  int small_only; /* --small: the small operations table alone */
  /* --count unimem|raw ROUNDS: ROUNDS x 1000 copies with an event each on
   * one side only, untimed, for an instruction count (callgrind) */
  const char *count_side;
  int count_rounds;
  /* --split ROUNDS: the same case on both sides, ROUNDS samples each
   * (alternated), each timed in two phases: issuing the 1000 copies, and
   * the whole sample with its waits */
  int split_rounds;
  char device[128];
  char raw_status[160];
  int failed;
} bt_run;

static bench_row *add_row(bt_run *run, const char *table, const char *name, size_t bytes) {
  bench_row *row = bench_add_row(run->rep, table, name);
  bench_set(row, "bytes", (double)bytes);
  return row;
}

/* A row of n bytes per operation named "WHAT SIZE" and the suffix. */
static bench_row *sized_row(bt_run *run, const char *table, const char *what, size_t n, const char *suffix) {
  char name[64], sz[24];
  bench_size_text(sz, sizeof(sz), n);
  snprintf(name, sizeof(name), "%s %s%s", what, sz, suffix);
  return add_row(run, table, name, n);
}

/* Time per operation as the most readable figure: latency for small
 * operations, bandwidth for large ones. */
static void figure_text(double ns, size_t bytes, char *out, size_t cap) {
  if (ns < 0)
    snprintf(out, cap, "-");
  else if (bytes >= 256 * KiB)
    snprintf(out, cap, "%.2f GB/s", (double)bytes / ns);
  else if (ns >= 1e6)
    snprintf(out, cap, "%.2f ms", ns / 1e6);
  else
    snprintf(out, cap, "%.2f us", ns / 1e3);
}

/* The strategy counters that moved between two stats snapshots. */
static void strategy_text(const um_stats *a, const um_stats *b, char *out, size_t cap) {
  struct {
    const char *name;
    uint64_t n;
  } s[] = {
      {"local", b->xfer_local - a->xfer_local},          {"peer", b->xfer_peer - a->xfer_peer},
      {"direct", b->xfer_direct - a->xfer_direct},       {"pipelined", b->xfer_pipelined - a->xfer_pipelined},
      {"staged", b->xfer_staged - a->xfer_staged},
  };
  size_t len = 0;
  out[0] = '\0';
  for (size_t i = 0; i < sizeof(s) / sizeof(s[0]); i++)
    if (s[i].n > 0 && len < cap)
      len += (size_t)snprintf(out + len, cap - len, "%s%s", len ? "+" : "", s[i].name);
  if (out[0] == '\0')
    snprintf(out, cap, "memcpy");
}

/* Measure a row: the unimem case u against the raw case, or against memcpy
 * of the same size where there is no raw case; the strategy is read from
 * the strategy counters that moved. */
static void measure_row(bt_run *run, bench_row *row, bt_case *u, bt_side raw, bt_case *mc, bt_plan plan) {
  bt_side us = {run_unimem, u}, ms = {mc ? run_unimem : NULL, mc};
  double out[2], memcpy_ns[2];
  char strategy[40];
  um_stats a, b;
  if (row == NULL)
    return;
  um_stats_get(u->m, NULL, &a);
  if (raw.run != NULL) {
    /* unimem against the raw call; memcpy alone afterwards */
    measure_pair(us, raw, plan, out);
    measure_pair(ms, (bt_side){NULL, NULL}, plan, memcpy_ns);
  } else {
    measure_pair(us, ms, plan, out);
    memcpy_ns[0] = out[1];
    out[1] = -1;
  }
  um_stats_get(u->m, NULL, &b);
  if (out[0] < 0)
    run->failed = 1;
  strategy_text(&a, &b, strategy, sizeof(strategy));
  bench_set_text(row, "strategy", strategy);
  bench_set(row, "unimem_ns", out[0]);
  bench_set(row, "raw_ns", out[1]);
  bench_set(row, "memcpy_ns", memcpy_ns[0]);
}

static bt_case memcpy_case(char *dst, const char *src, size_t dst_off, size_t src_off, size_t bytes) {
  bt_case c;
  memset(&c, 0, sizeof(c));
  c.op = OP_MEMCPY;
  c.host = (char *)src;
  c.host2 = dst;
  c.dst_off = dst_off;
  c.src_off = src_off;
  c.bytes = bytes;
  return c;
}

static bt_plan plan_for(const bt_run *run, size_t bytes) {
  bt_plan p;
  if (bytes >= 16 * MiB) {
    p.samples = run->quick ? 5 : 31;
    p.iters = 1;
  } else if (bytes >= 256 * KiB) {
    p.samples = run->quick ? 7 : 31;
    p.iters = run->quick ? 4 : 10;
  } else {
    p.samples = run->quick ? 9 : 41;
    p.iters = run->quick ? 100 : 300;
  }
  return p;
}

static const bt_side no_side = {NULL, NULL};

/* ------------------------------------------------------------------------ */
/* The tables                                                                */

typedef struct bt_env {
  um_manager *m;         /* peer enabled (the default) */
  um_manager *m_nopeer;  /* enable_peer = 0: device<->device is staged */
  um_manager *m_staging; /* use_pinned_staging = 2: always pipelined */
  um_device *d1, *d2;    /* first two OpenCL devices of m; d2 may be NULL */
  um_device *n1, *n2;    /* the same two in m_nopeer */
  um_device *s1;         /* the first in m_staging */
  char *host_a, *host_b; /* pageable, HOST_BYTES each */
#ifdef BT_HAVE_CL_HEADER
  raw_cl raw;
  int have_raw;
#endif
} bt_env;

#define HOST_BYTES (64 * MiB + 64)

/* One host<->device row. pinned: the host side is a PINNED buffer of the
 * same device (raw: a mapped CL_MEM_ALLOC_HOST_PTR buffer). */
static void host_device_row(bt_run *run, bt_env *e, um_manager *m, um_device *d, const char *label, int to_device,
                            int pinned, size_t n) {
  static const char *const what[2][2] = {{"D2H pageable", "D2H pinned"}, {"H2D pageable", "H2D pinned"}};
  bt_plan plan = plan_for(run, n);
  um_buffer *dev = NULL, *pin = NULL;
  bt_case c, mc;
  bt_side raw = no_side;
  bench_row *row = sized_row(run, "host<->device", what[to_device][pinned], n, label);
  if (row == NULL)
    return;
  if (um_alloc(m, d, n, UM_DEVICE, UM_ALLOC_ZERO, &dev) != UM_OK ||
      (pinned && um_alloc(m, d, n, UM_PINNED, UM_ALLOC_ZERO, &pin) != UM_OK)) {
    fprintf(stderr, "bench transfer: cannot allocate %s: %s\n", bench_get_text(row, "name"), um_last_error());
    run->failed = 1;
    if (dev)
      um_release(dev);
    return;
  }
  /* Pinned sides hold real data: never-written pages all map the zero
   * page, which reads faster than any real memory. */
  if (pinned)
    memcpy(um_buffer_host_ptr(pin), e->host_a, n);
  memset(&c, 0, sizeof(c));
  c.m = m;
  c.bytes = n;
  if (pinned) {
    c.op = OP_COPY;
    c.dst = to_device ? dev : pin;
    c.src = to_device ? pin : dev;
  } else {
    c.op = to_device ? OP_H2D : OP_D2H;
    c.dst = c.src = dev;
    c.host = e->host_a;
  }
  mc = to_device ? memcpy_case(e->host_b, pinned ? um_buffer_host_ptr(pin) : e->host_a, 0, 0, n)
                 : memcpy_case(pinned ? um_buffer_host_ptr(pin) : e->host_a, e->host_b, 0, 0, n);
#ifdef BT_HAVE_CL_HEADER
  raw_case rc;
  cl_mem rdev = NULL, rpin = NULL;
  void *rhost = NULL;
  if (e->have_raw) {
    rdev = raw_device_buffer(&e->raw, 0, n);
    rhost = pinned ? raw_pinned(&e->raw, n, &rpin) : e->host_a;
    if (pinned && rhost != NULL)
      memcpy(rhost, e->host_a, n);
    if (rdev != NULL && rhost != NULL) {
      rc = (raw_case){.r = &e->raw, .op = to_device ? OP_H2D : OP_D2H, .dst = rdev, .src = rdev,
                      .bytes = n, .host = rhost};
      raw = raw_side(&rc);
    }
  }
#endif
  measure_row(run, row, &c, raw, &mc, plan);
#ifdef BT_HAVE_CL_HEADER
  if (pinned && rpin != NULL)
    raw_pinned_free(&e->raw, rpin, rhost);
  if (rdev)
    e->raw.clReleaseMemObject(rdev);
#endif
  um_release(dev);
  if (pin)
    um_release(pin);
}

static void host_device_table(bt_run *run, bt_env *e, const size_t *sizes, int nsizes) {
  for (int pinned = 0; pinned <= 1; pinned++)
    for (int to_device = 1; to_device >= 0; to_device--)
      for (int i = 0; i < nsizes; i++)
        host_device_row(run, e, e->m, e->d1, "", to_device, pinned, sizes[i]);
  /* What pipelined staging costs where the device reads pageable memory at
   * full speed (an OpenCL CPU device): forced with use_pinned_staging=2. */
  for (int to_device = 1; to_device >= 0; to_device--)
    host_device_row(run, e, e->m_staging, e->s1, " (forced)", to_device, 0, sizes[nsizes - 1]);
}

/* A DEVICE to DEVICE row from device a to device b of manager m. */
static void device_row(bt_run *run, bt_env *e, const char *label, um_manager *m, um_device *a, um_device *b,
                       size_t n, int raw_staged) {
  bt_plan plan = plan_for(run, n);
  um_buffer *src = NULL, *dst = NULL;
  bt_case c, mc;
  bt_side raw = no_side;
  bench_row *row = sized_row(run, "device<->device", label, n, "");
  if (row == NULL)
    return;
  if (um_alloc(m, a, n, UM_DEVICE, UM_ALLOC_ZERO, &src) != UM_OK ||
      um_alloc(m, b, n, UM_DEVICE, UM_ALLOC_ZERO, &dst) != UM_OK) {
    fprintf(stderr, "bench transfer: cannot allocate %s: %s\n", bench_get_text(row, "name"), um_last_error());
    run->failed = 1;
    if (src)
      um_release(src);
    return;
  }
  memset(&c, 0, sizeof(c));
  c.op = OP_COPY;
  c.m = m;
  c.dst = dst;
  c.src = src;
  c.bytes = n;
  mc = memcpy_case(e->host_b, e->host_a, 0, 0, n);
#ifdef BT_HAVE_CL_HEADER
  raw_case rc;
  cl_mem rs = NULL, rd = NULL;
  if (e->have_raw && (a == b || e->raw.ndev > 1)) {
    int qa = 0, qb = a == b ? 0 : 1;
    rs = raw_device_buffer(&e->raw, qa, n);
    rd = raw_device_buffer(&e->raw, qb, n);
    if (rs != NULL && rd != NULL) {
      rc = (raw_case){.r = &e->raw, .op = OP_COPY, .q = qb, .src = rs, .dst = rd, .bytes = n,
                      .staged = raw_staged, .bounce = e->host_b};
      raw = raw_side(&rc);
    }
  }
#endif
  measure_row(run, row, &c, raw, &mc, plan);
#ifdef BT_HAVE_CL_HEADER
  if (rs)
    e->raw.clReleaseMemObject(rs);
  if (rd)
    e->raw.clReleaseMemObject(rd);
#endif
  um_release(src);
  um_release(dst);
}

static void device_table(bt_run *run, bt_env *e, const size_t *sizes, int nsizes) {
  for (int i = 0; i < nsizes; i++)
    device_row(run, e, "local", e->m, e->d1, e->d1, sizes[i], 0);
  if (e->d2 == NULL) {
    fprintf(stderr, "bench transfer: one OpenCL device only: no device<->device rows "
                    "(POCL_DEVICES=\"pthread pthread\" gives two)\n");
    return;
  }
  for (int i = 0; i < nsizes; i++)
    device_row(run, e, "peer", e->m, e->d1, e->d2, sizes[i], 0);
  for (int i = 0; i < nsizes; i++)
    device_row(run, e, "staged", e->m_nopeer, e->n1, e->n2, sizes[i], 1);
}

/* BATCH_OPS copies of SMALL_BYTES from pageable memory into one device
 * buffer: one um_copy_batch against as many blocking copies (raw: as many
 * non-blocking writes and one clFinish, against blocking writes). */
static void batch_table(bt_run *run, bt_env *e) {
  size_t total = (size_t)BATCH_OPS * SMALL_BYTES;
  um_buffer *dev = NULL;
  um_copy_op *ops = calloc(BATCH_OPS, sizeof(*ops));
  bt_plan plan;
  bt_case c[2];
  bt_side raw[2] = {no_side, no_side};
  bench_row *rows[2];
  plan.samples = run->quick ? 5 : 15;
  plan.iters = 1;
  if (ops == NULL || um_alloc(e->m, e->d1, total, UM_DEVICE, UM_ALLOC_ZERO, &dev) != UM_OK) {
    fprintf(stderr, "bench transfer: cannot set up the batch: %s\n", um_last_error());
    run->failed = 1;
    free(ops);
    return;
  }
  for (int k = 0; k < BATCH_OPS; k++) {
    ops[k].dst = dev;
    ops[k].dst_off = (size_t)k * SMALL_BYTES;
    ops[k].host_src = e->host_a + (size_t)k * SMALL_BYTES;
    ops[k].bytes = SMALL_BYTES;
  }
  rows[0] = add_row(run, "batch", "1000 x 4 KiB um_copy_batch", total);
  rows[1] = add_row(run, "batch", "1000 x 4 KiB blocking loop", total);
#ifdef BT_HAVE_CL_HEADER
  raw_case rc[2];
  cl_mem rdev = e->have_raw ? raw_device_buffer(&e->raw, 0, total) : NULL;
#endif
  for (int k = 0; k < 2; k++) {
    memset(&c[k], 0, sizeof(c[k]));
    c[k].m = e->m;
    c[k].ops = ops;
    c[k].op = k == 0 ? OP_BATCH : OP_LOOP;
#ifdef BT_HAVE_CL_HEADER
    if (rdev != NULL) {
      rc[k] = (raw_case){.r = &e->raw, .op = c[k].op, .dst = rdev, .host = e->host_a};
      raw[k] = raw_side(&rc[k]);
    }
#endif
    measure_row(run, rows[k], &c[k], raw[k], NULL, plan);
  }
#ifdef BT_HAVE_CL_HEADER
  if (rdev)
    e->raw.clReleaseMemObject(rdev);
#endif
  um_release(dev);
  free(ops);
}

/* Issue 13's two targets, measured side by side: 1000 x 4 KiB through one
 * um_copy_batch against the same raw non-blocking writes and one clFinish
 * (>= 0.9x), and 1000 x 4 KiB copies with an event each against raw writes
 * with a native event, a callback and a flush each (<= 0.3 us added per
 * copy). Each is SMALL_RUNS runs of interleaved samples; a run's figure is
 * its median, the row's the median of the runs, and the runs' ratios are
 * kept for their spread. */
#define SMALL_RUNS 3

static void small_ops_row(bt_run *run, bt_env *e, const char *name, bt_op op, um_buffer *dev, um_copy_op *ops) {
  size_t total = (size_t)BATCH_OPS * SMALL_BYTES;
  bench_row *row = add_row(run, "small operations", name, total);
  bt_plan plan = {.samples = run->quick ? 5 : 15, .iters = 1};
  bt_case c = {.op = op, .m = e->m, .ops = ops, .dst = dev};
  bt_side raw = no_side;
  double um[SMALL_RUNS], rw[SMALL_RUNS];
  char runs[160];
  size_t len = 0;
#ifdef BT_HAVE_CL_HEADER
  raw_case rc;
  cl_mem rdev = e->have_raw ? raw_device_buffer(&e->raw, 0, total) : NULL;
  if (rdev != NULL) {
    rc = (raw_case){.r = &e->raw, .op = op, .dst = rdev, .host = e->host_a};
    raw = raw_side(&rc);
  }
#endif
  runs[0] = '\0';
  for (int k = 0; k < SMALL_RUNS; k++) {
    double out[2];
    measure_pair((bt_side){run_unimem, &c}, raw, plan, out);
    um[k] = out[0], rw[k] = out[1];
    if (out[0] <= 0) {
      run->failed = 1;
      break;
    }
    if (out[1] > 0 && len < sizeof(runs))
      len += (size_t)snprintf(runs + len, sizeof(runs) - len, "%s%.2f/%+.2f", k ? " " : "", out[1] / out[0],
                              (out[0] - out[1]) / BATCH_OPS / 1e3);
  }
  bench_set_text(row, "strategy", "direct");
  bench_set(row, "unimem_ns", bench_median(um, SMALL_RUNS));
  bench_set(row, "raw_ns", raw.run != NULL ? bench_median(rw, SMALL_RUNS) : -1);
  bench_set(row, "memcpy_ns", -1);
  bench_set_text(row, "runs", runs);
#ifdef BT_HAVE_CL_HEADER
  if (rdev)
    e->raw.clReleaseMemObject(rdev);
#endif
}

/* --count: the per-copy event case on one side, nothing timed. Under
 *   valgrind --tool=callgrind bench_transfer --count unimem 6
 * (and raw), the difference of the two totals over 6000 is what unimem adds
 * per copy in instructions, on every thread, whatever the machine's load. */
static void count_events(bt_run *run, bt_env *e, um_buffer *dev, um_copy_op *ops) {
  bt_case c = {.op = OP_EVENTS, .m = e->m, .ops = ops, .dst = dev};
  if (strcmp(run->count_side, "unimem") == 0) {
    run->failed |= run_unimem(&c, run->count_rounds);
    printf("counted: %d x %d copies of %zu bytes with an event each, unimem on %s\n", run->count_rounds,
           BATCH_OPS, (size_t)SMALL_BYTES, run->device);
    return;
  }
#ifdef BT_HAVE_CL_HEADER
  if (e->have_raw) {
    cl_mem rdev = raw_device_buffer(&e->raw, 0, (size_t)BATCH_OPS * SMALL_BYTES);
    raw_case rc = {.r = &e->raw, .op = OP_EVENTS, .dst = rdev, .host = e->host_a};
    if (rdev != NULL) {
      run->failed |= run_raw(&rc, run->count_rounds);
      e->raw.clReleaseMemObject(rdev);
      printf("counted: %d x %d copies of %zu bytes with an event each, raw OpenCL\n", run->count_rounds,
             BATCH_OPS, (size_t)SMALL_BYTES);
      return;
    }
  }
#endif
  fprintf(stderr, "bench transfer: no raw OpenCL to count\n");
  run->failed = 1;
}

/* --split: where the per-copy event's added time is made. Each sample of
 * 1000 copies with an event each is timed twice: when the last copy is
 * issued, and when every event has been waited for (unimem) or every
 * callback counted (raw). Samples alternate between the sides. Printed:
 * the medians per copy of both phases, and of the issuing thread's CPU
 * time while it issued (when it is close to the issue's wall time, the
 * thread was running all along: the time is its own work). */
#define SPLIT_MAX 1000

typedef struct split_side {
  double issue[SPLIT_MAX], cpu[SPLIT_MAX], whole[SPLIT_MAX];
} split_side;

static int split_sample(split_side *sd, int k, int (*fn)(void *, int), void *ctx) {
  double c0, t0;
  int failed;
  c0 = thread_cpu_ns();
  t0 = bench_now_ns();
  failed = fn(ctx, 1);
  sd->whole[k] = (bench_now_ns() - t0) / BATCH_OPS;
  sd->issue[k] = (issued_ns - t0) / BATCH_OPS;
  sd->cpu[k] = (issued_cpu_ns - c0) / BATCH_OPS;
  return failed;
}

static void split_events(bt_run *run, bt_env *e, um_buffer *dev, um_copy_op *ops) {
#ifdef BT_HAVE_CL_HEADER
  static split_side um, raw;
  bt_case c = {.op = OP_EVENTS, .m = e->m, .ops = ops, .dst = dev};
  cl_mem rdev = e->have_raw ? raw_device_buffer(&e->raw, 0, (size_t)BATCH_OPS * SMALL_BYTES) : NULL;
  raw_case rc = {.r = &e->raw, .op = OP_EVENTS, .dst = rdev, .host = e->host_a};
  int n = run->split_rounds < SPLIT_MAX ? run->split_rounds : SPLIT_MAX;
  double mu[3], mr[3];
  if (rdev == NULL) {
    fprintf(stderr, "bench transfer: --split needs raw OpenCL (%s)\n", run->raw_status);
    run->failed = 1;
    return;
  }
  split_on = true;
  for (int k = 0; k < n && !run->failed; k++) {
    run->failed |= split_sample(&um, k, run_unimem, &c);
    run->failed |= split_sample(&raw, k, run_raw, &rc);
  }
  split_on = false;
  e->raw.clReleaseMemObject(rdev);
  if (run->failed)
    return;
  mu[0] = bench_median(um.issue, n), mu[1] = bench_median(um.cpu, n), mu[2] = bench_median(um.whole, n);
  mr[0] = bench_median(raw.issue, n), mr[1] = bench_median(raw.cpu, n), mr[2] = bench_median(raw.whole, n);
  printf("split: %d samples per side of %d x %zu-byte copies with an event each, on %s; ns per copy, medians\n", n,
         BATCH_OPS, (size_t)SMALL_BYTES, run->device);
  printf("  %-7s issue %6.0f (issuing thread's CPU %6.0f)   whole %6.0f\n", "unimem", mu[0], mu[1], mu[2]);
  printf("  %-7s issue %6.0f (issuing thread's CPU %6.0f)   whole %6.0f\n", "raw", mr[0], mr[1], mr[2]);
  printf("  %-7s issue %+6.0f (issuing thread's CPU %+6.0f)   whole %+6.0f\n", "added", mu[0] - mr[0], mu[1] - mr[1],
         mu[2] - mr[2]);
#else
  (void)e, (void)dev, (void)ops;
  fprintf(stderr, "bench transfer: --split needs the OpenCL headers at build time\n");
  run->failed = 1;
#endif
}

static void small_ops_table(bt_run *run, bt_env *e) {
  size_t total = (size_t)BATCH_OPS * SMALL_BYTES;
  um_buffer *dev = NULL;
  um_copy_op *ops = calloc(BATCH_OPS, sizeof(*ops));
  if (ops == NULL || um_alloc(e->m, e->d1, total, UM_DEVICE, UM_ALLOC_ZERO, &dev) != UM_OK) {
    fprintf(stderr, "bench transfer: cannot set up the small operations: %s\n", um_last_error());
    run->failed = 1;
    free(ops);
    return;
  }
  for (int k = 0; k < BATCH_OPS; k++)
    ops[k] = (um_copy_op){.dst = dev, .dst_off = (size_t)k * SMALL_BYTES, .host_src = e->host_a + (size_t)k * SMALL_BYTES,
                          .bytes = SMALL_BYTES};
  if (run->count_side != NULL)
    count_events(run, e, dev, ops);
  else if (run->split_rounds > 0)
    split_events(run, e, dev, ops);
  else {
    small_ops_row(run, e, "batch: 1000 x 4 KiB", OP_BATCH, dev, ops);
    small_ops_row(run, e, "per op: 1000 x 4 KiB + event", OP_EVENTS, dev, ops);
  }
  um_release(dev);
  free(ops);
}

/* The two targets of the small operations, with each run's ratio / added
 * time per operation. */
static void print_small_targets(const bt_run *run) {
  const bench_row *b = bench_find_row(run->rep, "small operations", "name", "batch: 1000 x 4 KiB");
  const bench_row *p = bench_find_row(run->rep, "small operations", "name", "per op: 1000 x 4 KiB + event");
  if (b != NULL && bench_get(b, "raw_ns") > 0) {
    double ratio = bench_get(b, "raw_ns") / bench_get(b, "unimem_ns");
    printf("  batch >= 0.9x raw non-blocking writes + clFinish: %.2fx %s (runs, ratio/added us per op: %s)\n", ratio,
           ratio >= 0.9 ? "met" : "MISSED", bench_get_text(b, "runs"));
  }
  if (p != NULL && bench_get(p, "raw_ns") > 0) {
    double added = (bench_get(p, "unimem_ns") - bench_get(p, "raw_ns")) / BATCH_OPS / 1e3;
    printf("  copy with an event <= 0.3 us over raw event + callback + flush: %+.2f us %s (runs: %s)\n", added,
           added <= 0.3 ? "met" : "MISSED", bench_get_text(p, "runs"));
  }
}

/* A host-to-device row: n bytes from host_a + hoff into a device buffer of
 * d at offset off, with op (blocking, or with an event); against the raw
 * write into a buffer of the first OpenCL device where with_raw asks for it
 * and raw OpenCL is open, and against memcpy. */
static void h2d_row(bt_run *run, bt_env *e, bench_row *row, um_device *d, bt_op op, size_t n, size_t off,
                    size_t hoff, int with_raw) {
  bt_plan plan = plan_for(run, n);
  um_buffer *dev = NULL;
  bt_case c, mc;
  bt_side raw = no_side;
  if (row == NULL || um_alloc(e->m, d, n + 64, UM_DEVICE, UM_ALLOC_ZERO, &dev) != UM_OK) {
    run->failed = 1;
    return;
  }
  c = (bt_case){.op = op, .m = e->m, .dst = dev, .dst_off = off, .host = e->host_a + hoff, .bytes = n};
  mc = memcpy_case(e->host_b, e->host_a, off, hoff, n);
#ifdef BT_HAVE_CL_HEADER
  raw_case rc;
  cl_mem rdev = with_raw && e->have_raw ? raw_device_buffer(&e->raw, 0, n + 64) : NULL;
  if (rdev != NULL) {
    rc = (raw_case){.r = &e->raw, .op = op, .dst = rdev, .dst_off = off, .host = e->host_a + hoff, .bytes = n};
    raw = raw_side(&rc);
  }
#else
  (void)with_raw;
#endif
  measure_row(run, row, &c, raw, &mc, plan);
#ifdef BT_HAVE_CL_HEADER
  if (rdev)
    e->raw.clReleaseMemObject(rdev);
#endif
  um_release(dev);
}

/* Host-to-device copies whose host and device offsets are 4 KiB aligned or
 * off by a few bytes. */
static void alignment_table(bt_run *run, bt_env *e) {
  static const size_t sizes[] = {4 * KiB, 1 * MiB};
  for (int i = 0; i < 2; i++)
    for (int unaligned = 0; unaligned <= 1; unaligned++)
      h2d_row(run, e, sized_row(run, "alignment", "H2D", sizes[i], unaligned ? " unaligned (+3/+5)" : " aligned"),
              e->d1, OP_H2D, sizes[i], unaligned ? 3 : 0, unaligned ? 5 : 0, 1);
}

/* What unimem adds to one small operation: on the OpenCL device against
 * the raw call, blocking and with an event; on the host CPU device (no
 * driver at all) against memcpy, which leaves only unimem's own work. */
static void overhead_table(bt_run *run, bt_env *e) {
  static const char *const names[] = {"4 KiB H2D blocking", "4 KiB H2D event + wait", "4 KiB host copy (cpu device)",
                                      "4 KiB host copy (cpu) event + wait"};
  um_device *cpu = um_device_get(e->m, 0);
  for (int k = 0; k < 4; k++) {
    int on_cpu = k >= 2;
    h2d_row(run, e, add_row(run, "per-operation overhead", names[k], SMALL_BYTES), on_cpu ? cpu : e->d1,
            k % 2 ? OP_H2D_ASYNC : OP_H2D, SMALL_BYTES, 0, 0, !on_cpu);
  }
}

/* ------------------------------------------------------------------------ */
/* Output                                                                    */

/* A row's figures, as the tables read them back from the report. */
typedef struct bt_figures {
  const char *table, *name, *strategy;
  size_t bytes;
  double um_ns, raw_ns, memcpy_ns; /* per operation; < 0: not measured */
} bt_figures;

static bt_figures figures_of(const bench_row *r) {
  return (bt_figures){bench_get_text(r, "table"), bench_get_text(r, "name"),       bench_get_text(r, "strategy"),
                      (size_t)bench_get(r, "bytes"), bench_get(r, "unimem_ns"), bench_get(r, "raw_ns"),
                      bench_get(r, "memcpy_ns")};
}

static void print_table(const bt_run *run) {
  const char *table = NULL;
  printf("unimem bench transfer%s: OpenCL device \"%s\"; raw OpenCL: %s\n", run->quick ? " --quick" : "",
         run->device, run->raw_status);
  printf("median per operation; GB/s = 1e9 bytes/s; ratio = raw time / unimem time "
         "(1.00 = as fast as the raw call); added = unimem time - raw time (- memcpy time\n"
         "where there is no raw call)\n");
  for (int i = 0; i < run->rep->nrows; i++) {
    bt_figures r = figures_of(&run->rep->rows[i]);
    char um[24], raw[24], mc[24], ratio[16], extra[24];
    if (table == NULL || strcmp(table, r.table) != 0) {
      table = r.table;
      printf("\n%-32s %-10s %12s %12s %12s %7s %10s\n", table, "strategy", "unimem", "raw OpenCL", "memcpy",
             "ratio", "added");
    }
    figure_text(r.um_ns, r.bytes, um, sizeof(um));
    figure_text(r.raw_ns, r.bytes, raw, sizeof(raw));
    figure_text(r.memcpy_ns, r.bytes, mc, sizeof(mc));
    snprintf(ratio, sizeof(ratio), "-");
    snprintf(extra, sizeof(extra), "-");
    if (r.um_ns > 0 && r.raw_ns > 0) {
      snprintf(ratio, sizeof(ratio), "%.2f", r.raw_ns / r.um_ns);
      snprintf(extra, sizeof(extra), "%+.2f us", (r.um_ns - r.raw_ns) / 1e3);
    } else if (r.um_ns > 0 && r.memcpy_ns > 0) {
      snprintf(extra, sizeof(extra), "%+.2f us", (r.um_ns - r.memcpy_ns) / 1e3);
    }
    printf("%-32s %-10s %12s %12s %12s %7s %10s\n", r.name, r.strategy, um, raw, mc, ratio, extra);
  }
}

/* The target of the large rows: >= 90% of the raw call at >= 1 MiB. Rows
 * whose strategy was forced against unimem's own choice are shown for what
 * they cost, not held to it. */
static void print_bandwidth_target(const bt_run *run) {
  double worst = 1e9;
  const char *worst_name = "-";
  int below = 0, total = 0;
  for (int i = 0; i < run->rep->nrows; i++) {
    bt_figures r = figures_of(&run->rep->rows[i]);
    if (r.um_ns <= 0 || r.raw_ns <= 0 || r.bytes < MiB || strcmp(r.table, "batch") == 0 ||
        strstr(r.name, "(forced)") != NULL)
      continue;
    total++;
    if (r.raw_ns / r.um_ns < 0.9)
      below++;
    if (r.raw_ns / r.um_ns < worst) {
      worst = r.raw_ns / r.um_ns;
      worst_name = r.name;
    }
  }
  if (total > 0)
    printf("  >= 1 MiB at >= 90%% of the raw call: %d of %d rows met; worst %.0f%% (%s)\n", total - below, total,
           worst * 100, worst_name);
}

/* The targets: >= 90% of the raw call at >= 1 MiB; <= 1 us added to a
 * 4 KiB operation (the per-operation table; the other 4 KiB rows are
 * listed in the tables with their own "added"); batch >= 4x the blocking
 * loop. */
static void print_targets(const bt_run *run) {
  if (run->small_only) {
    printf("\ntargets\n");
    print_small_targets(run);
    return;
  }
  bt_figures b = figures_of(bench_find_row(run->rep, "batch", "name", "1000 x 4 KiB um_copy_batch"));
  bt_figures l = figures_of(bench_find_row(run->rep, "batch", "name", "1000 x 4 KiB blocking loop"));
  printf("\ntargets\n");
  print_bandwidth_target(run);
  for (int i = 0; i < run->rep->nrows; i++) {
    bt_figures r = figures_of(&run->rep->rows[i]);
    double base = r.raw_ns > 0 ? r.raw_ns : r.memcpy_ns;
    if (strcmp(r.table, "per-operation overhead") != 0 || r.um_ns <= 0 || base <= 0)
      continue;
    printf("  <= 1 us added per operation, %s: %+.2f us %s\n", r.name, (r.um_ns - base) / 1e3,
           r.um_ns - base <= 1000 ? "met" : "MISSED");
  }
  if (b.um_ns > 0 && b.raw_ns > 0)
    printf("  (in a stream of %d queued 4 KiB writes: %+.2f us per operation over the raw calls)\n", BATCH_OPS,
           (b.um_ns - b.raw_ns) / BATCH_OPS / 1e3);
  if (b.um_ns > 0 && l.um_ns > 0)
    printf("  batch >= 4x the blocking loop: %.1fx %s\n", l.um_ns / b.um_ns, l.um_ns / b.um_ns >= 4 ? "met" : "MISSED");
  print_small_targets(run);
}

/* ------------------------------------------------------------------------ */
/* Entry point                                                               */

static um_device *nth_opencl(um_manager *m, int nth) {
  for (int i = 0; i < um_device_count(m); i++) {
    um_device *d = um_device_get(m, i);
    um_device_info info;
    if (um_device_info_get(d, &info) == UM_OK && strcmp(info.backend, "opencl") == 0 && nth-- == 0)
      return d;
  }
  return NULL;
}

/* The three managers of bt_env, and the device's name: 0, BENCH_SKIPPED
 * without an OpenCL device, 1 on a failure. */
static int open_managers(bt_env *e, bt_run *run) {
  um_options o;
  um_device_info info;
  um_options_init(&o);
  snprintf(o.backends, sizeof(o.backends), "cpu,opencl");
  if (um_manager_create(&o, &e->m) != UM_OK || (e->d1 = nth_opencl(e->m, 0)) == NULL) {
    fprintf(stderr, "bench transfer: no OpenCL device (%s): nothing to measure\n", um_last_error());
    return BENCH_SKIPPED;
  }
  e->d2 = nth_opencl(e->m, 1);
  o.enable_peer = 0;
  if (um_manager_create(&o, &e->m_nopeer) != UM_OK) {
    fprintf(stderr, "bench transfer: %s\n", um_last_error());
    return 1;
  }
  e->n1 = nth_opencl(e->m_nopeer, 0);
  e->n2 = nth_opencl(e->m_nopeer, 1);
  o.enable_peer = 1;
  o.use_pinned_staging = 2;
  if (um_manager_create(&o, &e->m_staging) != UM_OK) {
    fprintf(stderr, "bench transfer: %s\n", um_last_error());
    return 1;
  }
  e->s1 = nth_opencl(e->m_staging, 0);
  um_device_info_get(e->d1, &info);
  snprintf(run->device, sizeof(run->device), "%s", info.name);
  return 0;
}

/* The pageable host memory every case copies from and to, and the raw
 * side (where this program was built with CL/cl.h). */
static int open_host_and_raw(bt_env *e, bt_run *run) {
  e->host_a = malloc(HOST_BYTES);
  e->host_b = malloc(HOST_BYTES);
  if (e->host_a == NULL || e->host_b == NULL)
    return 1;
  for (size_t i = 0; i < HOST_BYTES; i++)
    e->host_a[i] = (char)(i * 131 + 7);
  memset(e->host_b, 0, HOST_BYTES);
#ifdef BT_HAVE_CL_HEADER
  e->have_raw = raw_open(&e->raw, run->raw_status, sizeof(run->raw_status)) == 0;
  if (e->have_raw)
    snprintf(run->raw_status, sizeof(run->raw_status), "libOpenCL.so.1, %d device(s) in one context", e->raw.ndev);
#else
  snprintf(run->raw_status, sizeof(run->raw_status), "not built (no CL/cl.h)");
#endif
  return 0;
}

static void close_env(bt_env *e) {
#ifdef BT_HAVE_CL_HEADER
  if (e->have_raw)
    raw_close(&e->raw);
#endif
  free(e->host_a);
  free(e->host_b);
  if (e->m_staging)
    um_manager_destroy(e->m_staging);
  if (e->m_nopeer)
    um_manager_destroy(e->m_nopeer);
  if (e->m)
    um_manager_destroy(e->m);
}

int um_bench_transfer_main(int argc, char **argv, bench_report *rep) {
  static const size_t sizes[] = {4 * KiB, 1 * MiB, 64 * MiB};
  bt_run run = {.rep = rep};
  bt_env e;
  int rc;

  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--small") == 0) {
      run.small_only = 1;
    } else if (strcmp(argv[i], "--quick") == 0) {
      run.quick = 1;
    } else if (strcmp(argv[i], "--count") == 0 && i + 2 < argc &&
               (strcmp(argv[i + 1], "unimem") == 0 || strcmp(argv[i + 1], "raw") == 0) &&
               atoi(argv[i + 2]) > 0) {
      run.count_side = argv[i + 1];
      run.count_rounds = atoi(argv[i + 2]);
      run.small_only = 1;
      i += 2;
    } else if (strcmp(argv[i], "--split") == 0 && i + 1 < argc && atoi(argv[i + 1]) > 0) {
      run.split_rounds = atoi(argv[i + 1]);
      run.small_only = 1;
      i++;
    } else {
      fprintf(stderr, "usage: %s [--quick] [--small] [--count unimem|raw ROUNDS] [--split ROUNDS] [--json FILE]\n",
              argv[0]);
      return 2;
    }
  }
  /* Before anything loads OpenCL: two devices for the device<->device
   * rows, unless the caller chose. */
  setenv("POCL_DEVICES", "pthread pthread", 0);
  memset(&e, 0, sizeof(e));
  if ((rc = open_managers(&e, &run)) == 0 && (rc = open_host_and_raw(&e, &run)) == 0) {
    bench_set_bool(&rep->facts, "quick", run.quick);
    bench_set_text(&rep->facts, "device", run.device);
    if (!run.small_only) {
      host_device_table(&run, &e, sizes, 3);
      device_table(&run, &e, sizes, 3);
      batch_table(&run, &e);
    }
    small_ops_table(&run, &e);
    if (!run.small_only) {
      alignment_table(&run, &e);
      overhead_table(&run, &e);
    }
    if (run.count_side == NULL && run.split_rounds == 0) {
      print_table(&run);
      print_targets(&run);
    }
    rc = run.failed ? 1 : 0;
  }
  close_env(&e);
  return rc;
}

#ifndef UM_BENCH_NO_MAIN
int main(int argc, char **argv) { return bench_program_main(argc, argv, "transfer", um_bench_transfer_main); }
#endif
