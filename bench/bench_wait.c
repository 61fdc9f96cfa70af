/* Low-latency waits (issue 13): a blocking 4 KiB device->host round trip on
 * the first OpenCL device, and the CPU a process burns while it waits.
 *
 * Round trip, per operation (medians of interleaved rounds):
 *   unimem spin 0    um_copy_to_host, blocking, wait_spin_ns 0 (default)
 *   unimem spin      the same with wait_spin_ns (--spin-ns, default 50 us)
 *   raw blocking     clEnqueueReadBuffer(CL_TRUE) on a queue of our own
 *   raw polling      clEnqueueReadBuffer(CL_FALSE) + clFlush, then a loop
 *                    on clGetEventInfo(CL_EVENT_COMMAND_EXECUTION_STATUS)
 *   StarPU           starpu_data_acquire(STARPU_R) of a 4 KiB vector whose
 *                    only valid copy is on StarPU's OpenCL worker (made so
 *                    by an acquire in STARPU_W on that worker's node), and
 *                    its release: StarPU's blocking round trip. Loaded at
 *                    run time (libstarpu-1.3.so.9) where the build found
 *                    starpu.h; StarPU is started and shut down inside each
 *                    of its rounds, so that its polling threads cost the
 *                    other contenders nothing.
 *
 * The gap (--gap-us, default 20): before each round trip every contender
 * waits, busy, until that long has passed since its previous round trip
 * returned, as a program that works on what it read before it reads
 * again. StarPU's step that makes the device's copy the only valid one
 * happens inside its gap (its median length is printed). The gap matters
 * on PoCL: a read issued within a microsecond or so of the previous one's
 * completion meets PoCL's worker still finishing that one and takes
 * 30-50 us; one issued 2-5 us after finds the worker still awake (3-20
 * us); from about 10 us on the worker sleeps and is woken (about 21 us).
 * With --gap-us 0 unimem and the raw calls go back to back, while StarPU
 * still has its step between round trips: not the same pattern.
 *
 * CPU seconds per second (getrusage(RUSAGE_SELF) over --idle-ms):
 *   idle             a manager alive, nothing pending
 *   waiting          one thread inside a blocking um_copy_to_host queued
 *                    behind a caller's OpenCL user event (um_access_end),
 *                    which is completed when the period ends
 * for wait_spin_ns 0 and the spin setting, and StarPU idle for reference.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "bench_util.h"
#include "report.h"
#include "unimem.h"

#if defined(__has_include)
#if __has_include(<CL/cl.h>)
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#define BW_HAVE_CL 1
#endif
#if __has_include(<starpu.h>)
#include <starpu.h>
#define BW_HAVE_STARPU 1
#endif
#endif

#define BW_BYTES 4096
#define BW_MAX_ROUNDS 15
#define BW_MAX_GAPS 8

typedef struct bw_args {
  int quick;
  int rounds;     /* interleaved rounds */
  int ops;        /* round trips per contender per round */
  uint32_t spin_ns;
  int idle_ms;
  int ngaps;
  double gap_ns[BW_MAX_GAPS]; /* busy wait from one round trip's return to the next's start */
} bw_args;

/* Waits, busy, until gap_ns has passed since since_ns (a bench_now_ns). */
static void gap_after(double since_ns, double gap_ns) {
  while (bench_now_ns() - since_ns < gap_ns)
    ;
}

enum { C_UM0, C_UMSPIN, C_RAW_BLOCK, C_RAW_POLL, C_STARPU, NCONT };
static const char *const cont_name[NCONT] = {"unimem spin 0", "unimem spin", "raw blocking",
                                             "raw polling", "StarPU"};
static const char *const cont_key[NCONT] = {"unimem_spin0", "unimem_spin", "raw_blocking",
                                            "raw_polling", "starpu"};

typedef struct bw_results {
  double rt_ns[BW_MAX_GAPS][NCONT][BW_MAX_ROUNDS]; /* per-round medians; < 0: not measured */
  int nrounds;
  char starpu_note[160];
  double starpu_step_ns[BW_MAX_GAPS][BW_MAX_ROUNDS]; /* median of StarPU's untimed step per round */
  double cpu_idle[2], cpu_wait[2], cpu_starpu_idle; /* CPU s per s; < 0: not measured */
} bw_results;

static double median_of_ops(double *v, int n) { return bench_median(v, n); }

static double cpu_seconds(void) {
  struct rusage u;
  getrusage(RUSAGE_SELF, &u);
  return (double)u.ru_utime.tv_sec + (double)u.ru_stime.tv_sec +
         ((double)u.ru_utime.tv_usec + (double)u.ru_stime.tv_usec) / 1e6;
}

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* ------------------------------------------------------------------------ */
/* unimem */

typedef struct bw_unimem {
  um_manager *m;
  um_device *dev;
  um_buffer *buf;
} bw_unimem;

static int unimem_open(bw_unimem *u, uint32_t spin_ns, char *why, size_t cap) {
  um_options o;
  um_options_init(&o);
  snprintf(o.backends, sizeof(o.backends), "cpu,opencl");
  o.wait_spin_ns = spin_ns;
  o.trim_interval_ms = 0;
  memset(u, 0, sizeof(*u));
  if (um_manager_create(&o, &u->m) != UM_OK) {
    snprintf(why, cap, "um_manager_create: %s", um_last_error());
    return -1;
  }
  for (int i = 1; i < um_device_count(u->m) && u->dev == NULL; i++) {
    um_device_info info;
    if (um_device_info_get(um_device_get(u->m, i), &info) == UM_OK && strcmp(info.backend, "opencl") == 0)
      u->dev = um_device_get(u->m, i);
  }
  if (u->dev == NULL) {
    snprintf(why, cap, "no OpenCL device");
    return -1;
  }
  if (um_alloc(u->m, u->dev, BW_BYTES, UM_DEVICE, 0, &u->buf) != UM_OK) {
    snprintf(why, cap, "um_alloc: %s", um_last_error());
    return -1;
  }
  return 0;
}

static void unimem_close(bw_unimem *u) {
  if (u->buf != NULL)
    um_release(u->buf);
  if (u->m != NULL)
    um_manager_destroy(u->m);
}

static double unimem_round(bw_unimem *u, int ops, double gap_ns, double *scratch) {
  char host[BW_BYTES];
  double end = bench_now_ns();
  for (int i = 0; i < ops; i++) {
    double t0;
    gap_after(end, gap_ns);
    t0 = bench_now_ns();
    if (um_copy_to_host(u->buf, 0, host, BW_BYTES, NULL) != UM_OK)
      return -1;
    end = bench_now_ns();
    scratch[i] = end - t0;
  }
  return median_of_ops(scratch, ops);
}

#ifdef BW_HAVE_CL
/* ------------------------------------------------------------------------ */
/* Raw OpenCL, loaded as the application would link it */

#define BW_CL_CALLS(XX)                                                        \
  XX(clCreateContext)                                                          \
  XX(clCreateCommandQueue)                                                     \
  XX(clCreateBuffer)                                                           \
  XX(clEnqueueReadBuffer)                                                      \
  XX(clEnqueueWriteBuffer)                                                     \
  XX(clFlush)                                                                  \
  XX(clFinish)                                                                 \
  XX(clGetEventInfo)                                                           \
  XX(clReleaseEvent)                                                           \
  XX(clCreateUserEvent)                                                        \
  XX(clSetUserEventStatus)                                                     \
  XX(clReleaseMemObject)                                                       \
  XX(clReleaseCommandQueue)                                                    \
  XX(clReleaseContext)

typedef struct bw_raw {
#define BW_MEMBER_(name) __typeof__(name) *name;
  BW_CL_CALLS(BW_MEMBER_)
#undef BW_MEMBER_
  cl_context ctx;
  cl_command_queue q;
  cl_mem mem;
} bw_raw;

/* Our own context and queue on unimem's device (the same PoCL device). */
static int raw_open(bw_raw *r, um_device *d, char *why, size_t cap) {
  um_device_native nat;
  cl_device_id id;
  cl_int err;
  char zero[BW_BYTES] = {0};
  void *lib = dlopen("libOpenCL.so.1", RTLD_NOW | RTLD_LOCAL);
  memset(r, 0, sizeof(*r));
  if (lib == NULL) {
    snprintf(why, cap, "%s", dlerror());
    return -1;
  }
#define BW_LOAD_(name)                                                         \
  {                                                                            \
    void *sym_ = dlsym(lib, #name);                                            \
    if (sym_ == NULL) {                                                        \
      snprintf(why, cap, "%s missing", #name);                                 \
      return -1;                                                               \
    }                                                                          \
    memcpy(&r->name, &sym_, sizeof(sym_));                                     \
  }
  BW_CL_CALLS(BW_LOAD_)
#undef BW_LOAD_
  if (um_device_native_get(d, &nat) != UM_OK) {
    snprintf(why, cap, "um_device_native_get: %s", um_last_error());
    return -1;
  }
  id = (cl_device_id)nat.cl_device;
  r->ctx = r->clCreateContext(NULL, 1, &id, NULL, NULL, &err);
  if (r->ctx != NULL)
    r->q = r->clCreateCommandQueue(r->ctx, id, 0, &err);
  if (r->q != NULL)
    r->mem = r->clCreateBuffer(r->ctx, CL_MEM_READ_WRITE, BW_BYTES, NULL, &err);
  if (r->mem == NULL) {
    snprintf(why, cap, "OpenCL setup failed (%d)", (int)err);
    return -1;
  }
  /* a first write places the buffer on the device */
  r->clEnqueueWriteBuffer(r->q, r->mem, CL_TRUE, 0, BW_BYTES, zero, 0, NULL, NULL);
  return 0;
}

static void raw_close(bw_raw *r) {
  if (r->mem != NULL)
    r->clReleaseMemObject(r->mem);
  if (r->q != NULL)
    r->clReleaseCommandQueue(r->q);
  if (r->ctx != NULL)
    r->clReleaseContext(r->ctx);
}

static double raw_blocking_round(bw_raw *r, int ops, double gap_ns, double *scratch) {
  char host[BW_BYTES];
  double end = bench_now_ns();
  for (int i = 0; i < ops; i++) {
    double t0;
    gap_after(end, gap_ns);
    t0 = bench_now_ns();
    if (r->clEnqueueReadBuffer(r->q, r->mem, CL_TRUE, 0, BW_BYTES, host, 0, NULL, NULL) != CL_SUCCESS)
      return -1;
    end = bench_now_ns();
    scratch[i] = end - t0;
  }
  return median_of_ops(scratch, ops);
}

static double raw_polling_round(bw_raw *r, int ops, double gap_ns, double *scratch) {
  char host[BW_BYTES];
  double end = bench_now_ns();
  for (int i = 0; i < ops; i++) {
    cl_event ev;
    cl_int st = CL_QUEUED;
    double t0;
    gap_after(end, gap_ns);
    t0 = bench_now_ns();
    if (r->clEnqueueReadBuffer(r->q, r->mem, CL_FALSE, 0, BW_BYTES, host, 0, NULL, &ev) != CL_SUCCESS)
      return -1;
    r->clFlush(r->q);
    while (st > CL_COMPLETE)
      if (r->clGetEventInfo(ev, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof(st), &st, NULL) != CL_SUCCESS)
        return -1;
    r->clReleaseEvent(ev);
    if (st < 0)
      return -1;
    end = bench_now_ns();
    scratch[i] = end - t0;
  }
  return median_of_ops(scratch, ops);
}

/* ------------------------------------------------------------------------ */
/* CPU while a thread waits on a long operation */

typedef struct bw_waiter {
  bw_unimem *u;
  int status;
} bw_waiter;

static void *waiter_main(void *arg) {
  bw_waiter *w = arg;
  char host[BW_BYTES];
  w->status = um_copy_to_host(w->u->buf, 0, host, BW_BYTES, NULL);
  return NULL;
}

/* CPU s per s of the process while one thread sits in a blocking copy
 * queued behind a user event of ours, for idle_ms; -1 when it failed. */
static double cpu_while_waiting(bw_raw *r, bw_unimem *u, int idle_ms) {
  um_device_native nat;
  cl_int err;
  cl_event gate;
  void *wait_native = NULL;
  bw_waiter w = {u, UM_OK};
  pthread_t t;
  double c0, t0, c1, t1;
  if (um_device_native_get(u->dev, &nat) != UM_OK)
    return -1;
  gate = r->clCreateUserEvent((cl_context)nat.cl_context, &err);
  if (gate == NULL)
    return -1;
  if (um_access_begin(u->buf, UM_MAP_READ_WRITE, &wait_native) != UM_OK ||
      um_access_end(u->buf, gate) != UM_OK) {
    r->clSetUserEventStatus(gate, CL_COMPLETE);
    r->clReleaseEvent(gate);
    return -1;
  }
  pthread_create(&t, NULL, waiter_main, &w);
  sleep_ms(50); /* the waiter is inside its wait */
  c0 = cpu_seconds();
  t0 = bench_now_ns();
  sleep_ms(idle_ms);
  c1 = cpu_seconds();
  t1 = bench_now_ns();
  r->clSetUserEventStatus(gate, CL_COMPLETE);
  pthread_join(t, NULL);
  r->clReleaseEvent(gate);
  return w.status == UM_OK ? (c1 - c0) / ((t1 - t0) / 1e9) : -1;
}
#endif /* BW_HAVE_CL */

static double cpu_while_idle(int idle_ms) {
  double c0 = cpu_seconds(), t0 = bench_now_ns(), c1, t1;
  sleep_ms(idle_ms);
  c1 = cpu_seconds();
  t1 = bench_now_ns();
  return (c1 - c0) / ((t1 - t0) / 1e9);
}

#ifdef BW_HAVE_STARPU
/* ------------------------------------------------------------------------ */
/* StarPU, loaded at run time */

#define BW_STARPU_CALLS(XX)                                                    \
  XX(starpu_conf_init)                                                         \
  XX(starpu_init)                                                              \
  XX(starpu_shutdown)                                                          \
  XX(starpu_worker_get_count_by_type)                                          \
  XX(starpu_worker_get_ids_by_type)                                            \
  XX(starpu_worker_get_memory_node)                                            \
  XX(starpu_vector_data_register)                                              \
  XX(starpu_data_unregister)                                                   \
  XX(starpu_data_acquire)                                                      \
  XX(starpu_data_release)                                                      \
  XX(starpu_data_acquire_on_node)                                              \
  XX(starpu_data_release_on_node)

typedef struct bw_starpu {
#define BW_MEMBER_(name) __typeof__(name) *name;
  BW_STARPU_CALLS(BW_MEMBER_)
#undef BW_MEMBER_
  int loaded;
} bw_starpu;

static int starpu_load(bw_starpu *s, char *why, size_t cap) {
  void *lib = dlopen("libstarpu-1.3.so.9", RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL)
    lib = dlopen("libstarpu-1.3.so", RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    snprintf(why, cap, "StarPU not loadable: %s", dlerror());
    return -1;
  }
#define BW_LOAD_(name)                                                         \
  {                                                                            \
    void *sym_ = dlsym(lib, #name);                                            \
    if (sym_ == NULL) {                                                        \
      snprintf(why, cap, "StarPU: %s missing", #name);                         \
      return -1;                                                               \
    }                                                                          \
    memcpy(&s->name, &sym_, sizeof(sym_));                                     \
  }
  BW_STARPU_CALLS(BW_LOAD_)
#undef BW_LOAD_
  s->loaded = 1;
  return 0;
}

/* One StarPU round: start it with one OpenCL worker and no CPU worker,
 * time ops acquire(R)+release round trips of a vector made device-only
 * before each, measure its idle CPU when asked, shut it down. Returns the
 * median, or -1 with the reason in why. */
static double starpu_round(bw_starpu *s, int ops, double gap_ns, double *scratch, double *step_ns, int idle_ms,
                           double *idle_cpu, char *why, size_t cap) {
  static char host[BW_BYTES];
  struct starpu_conf conf;
  starpu_data_handle_t h;
  int worker, node, rc;
  double end;
  s->starpu_conf_init(&conf);
  conf.ncpus = 0;
  conf.ncuda = 0;
  conf.nopencl = 1;
  if ((rc = s->starpu_init(&conf)) != 0) {
    snprintf(why, cap, "starpu_init failed (%d)", rc);
    return -1;
  }
  if (s->starpu_worker_get_count_by_type(STARPU_OPENCL_WORKER) < 1 ||
      s->starpu_worker_get_ids_by_type(STARPU_OPENCL_WORKER, &worker, 1) < 1) {
    snprintf(why, cap, "StarPU found no OpenCL worker on this device");
    s->starpu_shutdown();
    return -1;
  }
  node = (int)s->starpu_worker_get_memory_node((unsigned)worker);
  s->starpu_vector_data_register(&h, STARPU_MAIN_RAM, (uintptr_t)host, BW_BYTES, 1);
  end = bench_now_ns();
  for (int i = 0; i < ops; i++) {
    double t0;
    /* the device's copy becomes the only valid one: inside the gap */
    s->starpu_data_acquire_on_node(h, node, STARPU_W);
    s->starpu_data_release_on_node(h, node);
    scratch[i] = bench_now_ns() - end;
    gap_after(end, gap_ns);
    t0 = bench_now_ns();
    s->starpu_data_acquire(h, STARPU_R);
    s->starpu_data_release(h);
    end = bench_now_ns();
    scratch[ops + i] = end - t0;
  }
  *step_ns = median_of_ops(scratch, ops);
  if (idle_cpu != NULL)
    *idle_cpu = cpu_while_idle(idle_ms);
  s->starpu_data_unregister(h);
  s->starpu_shutdown();
  return median_of_ops(scratch + ops, ops);
}
#endif /* BW_HAVE_STARPU */

/* ------------------------------------------------------------------------ */
/* The run */

/* The gaps of --gap-us: microseconds, comma-separated. */
static int parse_gaps(const char *list, bw_args *a) {
  a->ngaps = 0;
  for (const char *p = list;;) {
    char *end;
    double us = strtod(p, &end);
    if (end == p || !(us >= 0 && us <= 1e6) || a->ngaps == BW_MAX_GAPS || (*end != ',' && *end != '\0'))
      return -1;
    a->gap_ns[a->ngaps++] = us * 1e3;
    if (*end == '\0')
      return 0;
    p = end + 1;
  }
}

static int parse_args(int argc, char **argv, bw_args *a) {
  *a = (bw_args){.quick = 0, .rounds = 5, .ops = 2000, .spin_ns = 50000, .idle_ms = 1500};
  const char *gaps = "0,2,5,10,20,50";
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--quick") == 0) {
      a->quick = 1;
      a->rounds = 3;
      a->ops = 300;
      a->idle_ms = 300;
      gaps = "0,20";
    } else if (strcmp(argv[i], "--spin-ns") == 0 && i + 1 < argc) {
      a->spin_ns = (uint32_t)strtoul(argv[++i], NULL, 10);
    } else if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc) {
      a->rounds = atoi(argv[++i]);
    } else if (strcmp(argv[i], "--gap-us") == 0 && i + 1 < argc) {
      gaps = argv[++i];
    } else {
      fprintf(stderr, "usage: %s [--quick] [--rounds N] [--spin-ns NS] [--gap-us US] [--json FILE]\n", argv[0]);
      return -1;
    }
  }
  if (a->rounds < 1 || a->rounds > BW_MAX_ROUNDS || a->spin_ns == 0 || a->spin_ns > 1000000000u ||
      parse_gaps(gaps, a) != 0) {
    fprintf(stderr, "--rounds is 1..%d, --spin-ns 1..1000000000, --gap-us a list of 1..%d values 0..1000000,"
            " comma-separated\n", BW_MAX_ROUNDS, BW_MAX_GAPS);
    return -1;
  }
  return 0;
}

static void round_trips(const bw_args *a, bw_unimem um[2], void *raw, bw_results *res) {
  double *scratch = malloc(2 * (size_t)a->ops * sizeof(double));
#ifdef BW_HAVE_STARPU
  bw_starpu sp = {0};
  int starpu_ok = starpu_load(&sp, res->starpu_note, sizeof(res->starpu_note)) == 0;
#else
  snprintf(res->starpu_note, sizeof(res->starpu_note), "not built: starpu.h was not found");
#endif
  for (int g = 0; g < BW_MAX_GAPS; g++)
    for (int r = 0; r < BW_MAX_ROUNDS; r++) {
      for (int c = 0; c < NCONT; c++)
        res->rt_ns[g][c][r] = -1;
      res->starpu_step_ns[g][r] = -1;
    }
  res->cpu_starpu_idle = -1;
  if (scratch == NULL)
    return;
  /* Each round runs every gap, each gap every contender. */
  for (int r = 0; r < a->rounds; r++) {
    for (int g = 0; g < a->ngaps; g++) {
      double gap = a->gap_ns[g], (*rt)[BW_MAX_ROUNDS] = res->rt_ns[g];
      rt[C_UM0][r] = unimem_round(&um[0], a->ops, gap, scratch);
      rt[C_UMSPIN][r] = unimem_round(&um[1], a->ops, gap, scratch);
#ifdef BW_HAVE_CL
      rt[C_RAW_BLOCK][r] = raw_blocking_round(raw, a->ops, gap, scratch);
      rt[C_RAW_POLL][r] = raw_polling_round(raw, a->ops, gap, scratch);
#else
      (void)raw;
#endif
#ifdef BW_HAVE_STARPU
      if (starpu_ok)
        rt[C_STARPU][r] =
            starpu_round(&sp, a->ops, gap, scratch, &res->starpu_step_ns[g][r], a->idle_ms,
                         r == 0 && g == 0 ? &res->cpu_starpu_idle : NULL, res->starpu_note, sizeof(res->starpu_note));
      starpu_ok = starpu_ok && rt[C_STARPU][r] >= 0;
#endif
    }
    fprintf(stderr, "  round %d/%d\n", r + 1, a->rounds);
  }
  res->nrounds = a->rounds;
  free(scratch);
}

static void cpu_table(const bw_args *a, bw_unimem um[2], void *raw, bw_results *res) {
  for (int k = 0; k < 2; k++) {
    res->cpu_idle[k] = cpu_while_idle(a->idle_ms);
#ifdef BW_HAVE_CL
    res->cpu_wait[k] = cpu_while_waiting(raw, &um[k], a->idle_ms);
#else
    (void)um;
    (void)raw;
    res->cpu_wait[k] = -1;
#endif
  }
}

/* Median and spread, in us, of per-round medians in ns (< 0: not
 * measured); the number of rounds measured. */
static int rounds_summary(const double *ns, int nrounds, double *med, double *lo, double *hi) {
  double v[BW_MAX_ROUNDS];
  int n = 0;
  for (int r = 0; r < nrounds; r++)
    if (ns[r] >= 0)
      v[n++] = ns[r] / 1e3;
  if (n == 0)
    return 0;
  *med = bench_median(v, n);
  *lo = v[0];
  *hi = v[n - 1];
  return n;
}

/* A contender's summary, only where it ran every round. */
static int summary_of(const bw_results *res, int g, int c, double *med, double *lo, double *hi) {
  return rounds_summary(res->rt_ns[g][c], res->nrounds, med, lo, hi) == res->nrounds;
}

/* One gap's table: each contender's median and spread. */
static void report_gap(const bw_args *a, const bw_results *res, int g, bench_report *rep) {
  double base = -1, med = 0, lo = 0, hi = 0;
  printf("\ngap %.1f us%s\n", a->gap_ns[g] / 1e3, a->gap_ns[g] == 0 ? " (back to back)" : "");
  printf("%-22s %10s %22s %10s\n", "", "us", "rounds", "vs spin 0");
  for (int c = 0; c < NCONT; c++) {
    bench_row *row;
    if (!summary_of(res, g, c, &med, &lo, &hi)) {
      printf("%-22s %10s   %s\n", cont_name[c], "-", c == C_STARPU ? res->starpu_note : "not measured");
      continue;
    }
    if (c == C_UM0)
      base = med;
    printf("%-22s %10.2f   [%7.2f, %7.2f] %10.2f\n", cont_name[c], med, lo, hi, base > 0 ? base / med : 0);
    row = bench_add_row(rep, "roundtrip", cont_key[c]);
    bench_set(row, "gap_us", a->gap_ns[g] / 1e3);
    bench_set(row, "us", med);
    bench_set(row, "min_us", lo);
    bench_set(row, "max_us", hi);
    if (c == C_STARPU && rounds_summary(res->starpu_step_ns[g], res->nrounds, &med, &lo, &hi) > 0) {
      printf("%-22s %10.2f   [%7.2f, %7.2f]   StarPU's untimed step, inside the gap%s\n", "  its step", med, lo,
             hi, med * 1e3 > a->gap_ns[g] ? " (longer than the gap)" : "");
      bench_set(row, "step_us", med);
    }
  }
}

/* Per gap, a peer's median over unimem spin's: > 1, unimem is faster. */
static void report_ratios(const bw_args *a, const bw_results *res) {
  static const int peers[] = {C_STARPU, C_RAW_POLL};
  printf("\n%-26s", "peer / unimem spin, gap us");
  for (int g = 0; g < a->ngaps; g++)
    printf(" %7.1f", a->gap_ns[g] / 1e3);
  printf("\n");
  for (size_t k = 0; k < sizeof(peers) / sizeof(peers[0]); k++) {
    printf("%-26s", cont_name[peers[k]]);
    for (int g = 0; g < a->ngaps; g++) {
      double um = 0, peer = 0, lo, hi;
      if (summary_of(res, g, C_UMSPIN, &um, &lo, &hi) && summary_of(res, g, peers[k], &peer, &lo, &hi))
        printf(" %7.2f", peer / um);
      else
        printf(" %7s", "-");
    }
    printf("\n");
  }
}

static void report(const bw_args *a, const bw_results *res, bench_report *rep) {
  printf("Blocking 4 KiB device->host round trip (%d interleaved rounds of %d; median of round medians,"
         " [min, max] of rounds), after a busy gap from the previous one's return\n", res->nrounds, a->ops);
  for (int g = 0; g < a->ngaps; g++)
    report_gap(a, res, g, rep);
  report_ratios(a, res);
  printf("\nCPU seconds per second (getrusage, %d ms)\n", a->idle_ms);
  printf("%-22s %12s %12s\n", "", "idle", "waiting");
  for (int k = 0; k < 2; k++) {
    bench_row *row = bench_add_row(rep, "cpu", k == 0 ? "unimem_spin0" : "unimem_spin");
    printf("%-22s %12.4f %12.4f\n", k == 0 ? "unimem spin 0" : "unimem spin", res->cpu_idle[k], res->cpu_wait[k]);
    bench_set(row, "idle", res->cpu_idle[k]);
    bench_set(row, "waiting", res->cpu_wait[k]);
  }
  if (res->cpu_starpu_idle >= 0) {
    printf("%-22s %12.4f %12s\n", "StarPU (1 OpenCL wk)", res->cpu_starpu_idle, "-");
    bench_set(bench_add_row(rep, "cpu", "starpu"), "idle", res->cpu_starpu_idle);
  }
}

int um_bench_wait_main(int argc, char **argv, bench_report *rep) {
  bw_args a;
  bw_unimem um[2];
  bw_results *res;
  char why[256] = "";
  void *raw = NULL;
  int rc = 0;
#ifdef BW_HAVE_CL
  bw_raw raw_cl;
#endif
  if (parse_args(argc, argv, &a) != 0)
    return 2;
  setenv("POCL_DEVICES", "pthread", 0);
  setenv("STARPU_SILENT", "1", 0);
  /* StarPU leaves OpenCL CPU devices (PoCL's) alone unless told. */
  setenv("STARPU_OPENCL_ON_CPUS", "1", 0);
  memset(um, 0, sizeof(um));
  if (unimem_open(&um[0], 0, why, sizeof(why)) != 0 || unimem_open(&um[1], a.spin_ns, why, sizeof(why)) != 0) {
    printf("bench wait: skipped: %s\n", why);
    unimem_close(&um[0]);
    unimem_close(&um[1]);
    return BENCH_SKIPPED;
  }
#ifdef BW_HAVE_CL
  if (raw_open(&raw_cl, um[0].dev, why, sizeof(why)) != 0) {
    printf("bench wait: raw OpenCL: %s\n", why);
    rc = 1;
  }
  raw = &raw_cl;
#endif
  res = calloc(1, sizeof(*res));
  if (rc == 0 && res != NULL) {
    bench_set_bool(&rep->facts, "quick", a.quick);
    bench_set(&rep->facts, "spin_ns", a.spin_ns);
    round_trips(&a, um, raw, res);
    cpu_table(&a, um, raw, res);
    report(&a, res, rep);
  }
#ifdef BW_HAVE_CL
  raw_close(&raw_cl);
#endif
  if (res == NULL)
    rc = 1;
  free(res);
  unimem_close(&um[0]);
  unimem_close(&um[1]);
  return rc;
}

#ifndef UM_BENCH_NO_MAIN
int main(int argc, char **argv) { return bench_program_main(argc, argv, "wait", um_bench_wait_main); }
#endif
