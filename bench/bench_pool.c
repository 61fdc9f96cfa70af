/* The pool against the allocators people already use, in one run:
 *
 *   hit      allocate + release the same size on one thread (1 KiB to
 *            100 MiB): unimem's pool, unimem unpooled, glibc malloc/free,
 *            jemalloc, mimalloc;
 *   touch    allocate + write every page + release (1 to 100 MiB): the
 *            same, plus unimem unpooled without huge pages (the first-touch
 *            cost with and without madvise(MADV_HUGEPAGE));
 *   seeds    the seeds' own table ("Allocate 1MB / 10MB / 100MB /
 *            Allocate+Free (100x)", without pool and with pool);
 *   threads  pool hits on two threads against one (throughput), with
 *            glibc and mimalloc beside it as the machine's own yardstick;
 *   growth   pool hits on a thread whose live bytes keep growing, and with
 *            the pool at its limit, against steady hits;
 *   trace    allocation traces replayed (bench/traces: mixed.txt, of mixed
 *            sizes and lifetimes, and the four kinds of trace_gen.c, each
 *            made from a fixed seed by --make-trace): the pool's hit rate,
 *            peak bytes reserved against peak bytes requested and both over
 *            the replay, the peak RSS each allocator's replay adds (every
 *            page touched, a process each), and time per event against the
 *            allocators, every page of every block written and calls only.
 *
 * Every figure is the median of several rounds; in a round every column
 * runs once, one after the other, so that load from other processes
 * falls on all of them alike. A round of a fast operation times a run of
 * operations sized to take a few milliseconds and divides.
 *
 * jemalloc and mimalloc are loaded at run time (libjemalloc.so.2 with
 * RTLD_DEEPBIND, libmimalloc.so.2), so that they run in this process beside
 * glibc's malloc; a missing one is reported as "not installed". jemalloc
 * uses initial-exec TLS, which a running process can only dlopen with
 * more static TLS room than glibc keeps by default: when the first dlopen
 * fails for that reason the program runs itself again (/proc/self/exe,
 * same arguments) with GLIBC_TUNABLES=glibc.rtld.optional_static_tls set,
 * once (UM_BENCH_POOL_REEXEC marks the second run). The sanitizers' runtimes
 * refuse RTLD_DEEPBIND: a sanitizer build leaves jemalloc out and says so.
 *
 *   bench_pool [--quick] [--only TABLE,...] [--json FILE] [--trace FILE]
 *              [--series FILE]
 *   bench_pool --make-trace FILE [--kind mixed|llm|training|dataframe|vectors]
 *
 * --quick: fewer rounds and shorter samples (a CI smoke run of seconds).
 * --only: run just the tables named (hit, touch, seeds, threads, growth,
 *   trace), a comma list.
 * --trace FILE: replay that trace alone (default: mixed.txt in the directory
 *   UNIMEM_TRACE_DIR names, else beside this program: the installed
 *   ../share/unimem/traces, or the build tree's ../bench/traces; and the
 *   traces of the other kinds found beside it).
 * --series FILE: the bytes requested and reserved over the first trace's
 *   replay from an empty pool, one line per point (`unimem replay` draws
 *   it).
 * --make-trace FILE: write the trace of a kind (default mixed) from its
 *   seed, and exit.
 *
 * Built as the `unimem bench pool` subcommand with -DUM_BENCH_NO_MAIN
 * (entry point um_bench_pool_main). Uses the public API only.
 */
#include <dlfcn.h>
#include <errno.h>
#include <malloc.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "report.h"
#include "trace_gen.h"
#include "unimem.h"

#define KiB ((size_t)1024)
#define MiB (1024 * KiB)
#define PAGE 4096u

/* Where the traces lie relative to the directory of this program, once
 * installed and in the build tree (CMake passes both; cmake/traces.cmake). */
#ifndef UM_BENCH_TRACE_INSTALLED
#define UM_BENCH_TRACE_INSTALLED "../share/unimem/traces"
#endif
#ifndef UM_BENCH_TRACE_BUILT
#define UM_BENCH_TRACE_BUILT "../bench/traces"
#endif
#define TRACE_FILE "mixed.txt"

/* ------------------------------------------------------------------------ */
/* Timing                                                                    */

static double bp_median(const double *v, int n) {
  double tmp[64];
  if (n <= 0)
    return -1;
  memcpy(tmp, v, (size_t)n * sizeof(*tmp));
  qsort(tmp, (size_t)n, sizeof(*tmp), bench_cmp_double);
  return n % 2 ? tmp[n / 2] : (tmp[n / 2 - 1] + tmp[n / 2]) / 2;
}

/* Keep the compiler from proving a block unused (and dropping the pair). */
static inline void bp_escape(void *p) { __asm__ volatile("" : : "r"(p) : "memory"); }

/* Write one byte in every page, and the last byte. */
static void bp_touch(void *p, size_t n) {
  volatile unsigned char *c = p;
  for (size_t i = 0; i < n; i += PAGE)
    c[i] = (unsigned char)i;
  c[n - 1] = 1;
}

/* ------------------------------------------------------------------------ */
/* The contenders                                                            */

enum { COL_POOL, COL_UNPOOLED, COL_UNPOOLED_NOHUGE, COL_GLIBC, COL_JEMALLOC, COL_MIMALLOC, NCOLS };

static const char *const col_key[NCOLS] = {"unimem_ns",  "unpooled_ns", "unpooled_nohuge_ns",
                                           "glibc_ns",   "jemalloc_ns", "mimalloc_ns"};
static const char *const col_title[NCOLS] = {"unimem", "unpooled", "no-huge", "glibc", "jemalloc", "mimalloc"};

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define BP_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define BP_SANITIZER 1
#endif
#endif

typedef void *(*bp_malloc_fn)(size_t);
typedef void (*bp_free_fn)(void *);

typedef struct bp_env {
  um_manager *m;        /* pooled, huge pages as the options say (default on) */
  um_device *cpu;
  um_manager *m_nohuge; /* huge_pages = 0, for the unpooled first-touch column */
  um_device *cpu_nohuge;
  bp_malloc_fn c_malloc[NCOLS];
  bp_free_fn c_free[NCOLS];
  char status[NCOLS][160]; /* "" when present, else why not */
  char machine[160];
  char thp[64];
  int ncores;
  int quick;
  int rounds;
  double sample_ns; /* target duration of one sample */
  bool failed;
  const char *only; /* --only: the tables to run, a comma list (NULL: all) */
  const char *series_path; /* --series: reserved and requested over the first trace's replay */
} bp_env;

/* glibc's own, through pointers the compiler cannot see through. */
static void *volatile glibc_malloc_ptr = (void *)malloc;
static void *volatile glibc_free_ptr = (void *)free;

/* Column col from library lib (its malloc and free under the names
 * given), or in e->status the reason why not. */
static void load_allocator(bp_env *e, int col, const char *lib, int flags, const char *malloc_name,
                           const char *free_name) {
  void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL | flags);
  void *m = h != NULL ? dlsym(h, malloc_name) : NULL, *f = h != NULL ? dlsym(h, free_name) : NULL;
  char missing[128];
  const char *why;
  if (m != NULL && f != NULL) {
    memcpy(&e->c_malloc[col], &m, sizeof(m));
    memcpy(&e->c_free[col], &f, sizeof(f));
    return;
  }
  snprintf(missing, sizeof(missing), "no %s/%s in %s", malloc_name, free_name, lib);
  why = h == NULL ? dlerror() : missing;
  snprintf(e->status[col], sizeof(e->status[0]), "%s",
           why && strstr(why, "No such file") ? "not installed" : why ? why : "not loadable");
}

static void load_allocators(bp_env *e) {
  e->c_malloc[COL_GLIBC] = (bp_malloc_fn)glibc_malloc_ptr;
  e->c_free[COL_GLIBC] = (bp_free_fn)glibc_free_ptr;
#ifdef BP_SANITIZER
  snprintf(e->status[COL_JEMALLOC], sizeof(e->status[0]), "left out: a sanitizer build (no RTLD_DEEPBIND)");
#else
  load_allocator(e, COL_JEMALLOC, "libjemalloc.so.2", RTLD_DEEPBIND, "malloc", "free");
#endif
  load_allocator(e, COL_MIMALLOC, "libmimalloc.so.2", 0, "mi_malloc", "mi_free");
}

/* jemalloc cannot be dlopened without more static TLS room than glibc
 * keeps: run again, once, with the room asked for. Returns only when that
 * is not needed or not possible (or jemalloc is left out). */
#ifdef BP_SANITIZER
static void reexec_for_static_tls(void) {}
#else
static void reexec_for_static_tls(void) {
  void *h;
  const char *err;
  char *cmdline = NULL, *argvv[256], tunables[512];
  size_t len = 0, cap = 0;
  int argc = 0;
  FILE *f;
  if (getenv("UM_BENCH_POOL_REEXEC") != NULL)
    return;
  h = dlopen("libjemalloc.so.2", RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
  if (h != NULL)
    return; /* stays loaded; load_allocators finds it again */
  err = dlerror();
  if (err == NULL || strstr(err, "static TLS") == NULL)
    return;
  f = fopen("/proc/self/cmdline", "rb");
  if (f == NULL)
    return;
  for (;;) {
    if (len == cap) {
      char *grown = realloc(cmdline, cap = cap ? 2 * cap : 4096);
      if (grown == NULL) {
        free(cmdline);
        fclose(f);
        return;
      }
      cmdline = grown;
    }
    size_t got = fread(cmdline + len, 1, cap - len, f);
    if (got == 0)
      break;
    len += got;
  }
  fclose(f);
  for (size_t i = 0; i < len && argc < 255; i += strlen(cmdline + i) + 1)
    argvv[argc++] = cmdline + i;
  argvv[argc] = NULL;
  if (argc == 0) {
    free(cmdline);
    return;
  }
  const char *old = getenv("GLIBC_TUNABLES");
  snprintf(tunables, sizeof(tunables), "%s%sglibc.rtld.optional_static_tls=65536", old ? old : "",
           old && *old ? ":" : "");
  setenv("GLIBC_TUNABLES", tunables, 1);
  setenv("UM_BENCH_POOL_REEXEC", "1", 1);
  fflush(stdout);
  fflush(stderr);
  execv("/proc/self/exe", argvv);
  free(cmdline); /* exec failed: go on without jemalloc */
}
#endif

static void describe_machine(bp_env *e) {
  FILE *f = fopen("/proc/cpuinfo", "r");
  char line[256];
  snprintf(e->machine, sizeof(e->machine), "unknown CPU");
  if (f != NULL) {
    while (fgets(line, sizeof(line), f)) {
      char *p = strchr(line, ':');
      if (strncmp(line, "model name", 10) == 0 && p != NULL) {
        p += 2;
        p[strcspn(p, "\n")] = '\0';
        snprintf(e->machine, sizeof(e->machine), "%s", p);
        break;
      }
    }
    fclose(f);
  }
  e->ncores = (int)sysconf(_SC_NPROCESSORS_ONLN);
  snprintf(e->thp, sizeof(e->thp), "unknown");
  f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
  if (f != NULL) {
    if (fgets(line, sizeof(line), f)) {
      char *a = strchr(line, '['), *b = a ? strchr(a, ']') : NULL;
      if (a && b) {
        *b = '\0';
        snprintf(e->thp, sizeof(e->thp), "%s", a + 1);
      }
    }
    fclose(f);
  }
}

static bool col_present(const bp_env *e, int col) { return e->status[col][0] == '\0'; }

/* ------------------------------------------------------------------------ */
/* Operations: iters times, allocate bytes (+ touch) + release. 0 or -1.    */

typedef int (*bp_op_fn)(bp_env *e, int col, size_t bytes, long iters, bool touch);

static int op_unimem(bp_env *e, int col, size_t bytes, long iters, bool touch) {
  um_manager *m = col == COL_UNPOOLED_NOHUGE ? e->m_nohuge : e->m;
  um_device *d = col == COL_UNPOOLED_NOHUGE ? e->cpu_nohuge : e->cpu;
  unsigned flags = col == COL_POOL ? 0 : UM_ALLOC_UNPOOLED;
  for (long i = 0; i < iters; i++) {
    um_buffer *b;
    if (um_alloc(m, d, bytes, UM_HOST, flags, &b) != UM_OK) {
      fprintf(stderr, "bench pool: um_alloc(%zu): %s\n", bytes, um_last_error());
      return -1;
    }
    if (touch)
      bp_touch(um_buffer_host_ptr(b), bytes);
    um_release(b);
  }
  return 0;
}

static int op_malloc(bp_env *e, int col, size_t bytes, long iters, bool touch) {
  bp_malloc_fn a = e->c_malloc[col];
  bp_free_fn f = e->c_free[col];
  for (long i = 0; i < iters; i++) {
    void *p = a(bytes);
    if (p == NULL) {
      fprintf(stderr, "bench pool: %s(%zu) failed\n", col_title[col], bytes);
      return -1;
    }
    bp_escape(p);
    if (touch)
      bp_touch(p, bytes);
    f(p);
  }
  return 0;
}

static int run_op(bp_env *e, int col, size_t bytes, long iters, bool touch) {
  return col <= COL_UNPOOLED_NOHUGE ? op_unimem(e, col, bytes, iters, touch)
                                    : op_malloc(e, col, bytes, iters, touch);
}

/* How many operations make one sample of about e->sample_ns. */
static long calibrate(bp_env *e, int col, size_t bytes, bool touch) {
  double t0, t;
  long iters = 1;
  for (;;) {
    t0 = bench_now_ns();
    if (run_op(e, col, bytes, iters, touch) != 0)
      return -1;
    t = bench_now_ns() - t0;
    if (t >= e->sample_ns / 8 || iters >= (1l << 24))
      break;
    iters *= 8;
  }
  long want = (long)(e->sample_ns / (t / (double)iters));
  return want < 1 ? 1 : want > (1l << 24) ? (1l << 24) : want;
}

/* Medians of ns per operation for each present column of cols[]; -1 for
 * the other columns. */
static void measure(bp_env *e, const int *cols, int ncols, size_t bytes, bool touch, double *out) {
  double samples[NCOLS][64];
  long iters[NCOLS];
  for (int c = 0; c < NCOLS; c++)
    out[c] = -1;
  for (int c = 0; c < ncols; c++) {
    iters[c] = col_present(e, cols[c]) ? calibrate(e, cols[c], bytes, touch) : 0;
    if (iters[c] < 0)
      e->failed = true;
  }
  for (int r = 0; r < e->rounds; r++) {
    for (int c = 0; c < ncols; c++) {
      double t0;
      if (iters[c] <= 0)
        continue;
      t0 = bench_now_ns();
      if (run_op(e, cols[c], bytes, iters[c], touch) != 0) {
        e->failed = true;
        iters[c] = 0;
        continue;
      }
      samples[c][r] = (bench_now_ns() - t0) / (double)iters[c];
    }
  }
  for (int c = 0; c < ncols; c++)
    if (iters[c] > 0)
      out[cols[c]] = bp_median(samples[c], e->rounds);
}

/* ------------------------------------------------------------------------ */
/* Report rows                                                               */

/* A row of the report: its size, then the figure of every column measured
 * (ns[c] < 0: not measured); further figures follow with bench_set. */
static bench_row *add_row(bench_report *rep, const char *table, const char *name, size_t bytes, const double *ns) {
  bench_row *r = bench_add_row(rep, table, name);
  bench_set(r, "bytes", (double)bytes);
  for (int c = 0; c < NCOLS; c++)
    bench_set(r, col_key[c], ns[c]);
  return r;
}

/* A time in ns, in a unit that keeps 3 significant digits. */
static void fmt_time(char *out, size_t cap, double ns) {
  if (ns < 0)
    snprintf(out, cap, "-");
  else if (ns < 1e3)
    snprintf(out, cap, "%.1f ns", ns);
  else if (ns < 1e6)
    snprintf(out, cap, "%.2f us", ns / 1e3);
  else if (ns < 1e9)
    snprintf(out, cap, "%.2f ms", ns / 1e6);
  else
    snprintf(out, cap, "%.2f s", ns / 1e9);
}

static double best_of_glibc_mimalloc(const double *ns) {
  double g = ns[COL_GLIBC], mi = ns[COL_MIMALLOC];
  if (g < 0)
    return mi;
  if (mi < 0)
    return g;
  return g < mi ? g : mi;
}

static void print_cols_header(const bp_env *e, const int *cols, int ncols) {
  printf("  %-9s", "size");
  for (int c = 0; c < ncols; c++)
    printf(" %11s", col_present(e, cols[c]) ? col_title[cols[c]] : "-");
  printf("\n");
}

static void print_cols(const char *name, const double *ns, const int *cols, int ncols) {
  char t[32];
  printf("  %-9s", name);
  for (int c = 0; c < ncols; c++) {
    fmt_time(t, sizeof(t), ns[cols[c]]);
    printf(" %11s", t);
  }
}

/* ------------------------------------------------------------------------ */
/* Hits while a thread grows, and with the pool at its limit                 */

/* Each sample: GW_WINDOWS windows of GW_PAIRS 1 KiB hit pairs, timed one
 * window at a time; between two windows, untimed, the case's own step:
 *   steady   nothing;
 *   growing  the thread keeps one more 2 KiB block (a bin hit): its live
 *            bytes pass its highest level before every window;
 *   at limit the thread releases one more 4 KiB block into a pool at its
 *            limit, which must make room for it.
 * A window's time less that of an empty window, per pair. Every case runs
 * on a fresh thread (its thread cache new, its highs at zero). */
#define GW_PAIRS 16
#define GW_WINDOWS 2048
#define GW_LIMIT (2 * MiB)

/* And the bin hits of a thread that grows by every allocation: windows of
 * GW_PAIRS 2 KiB allocations kept (each one a new high of the thread),
 * against the same allocations on a thread that was that high before. */
#define GW_BIN_WINDOWS 256
#define GW_BIN_BLOCKS (GW_BIN_WINDOWS * GW_PAIRS)

enum { GW_STEADY, GW_GROWING, GW_FULL, GW_BIN_STEADY, GW_BIN_GROWING, GW_CASES };
static const char *const gw_name[GW_CASES] = {"steady", "growing thread", "pool at its limit",
                                              "bin hits, steady", "bin hits, growing"};

typedef struct gw_arg {
  um_manager *m;
  int kind;
  double ns_per_pair;
  int rc;
} gw_arg;

static int gw_alloc(um_manager *m, size_t n, um_buffer **b) {
  if (um_alloc(m, um_device_get(m, 0), n, UM_HOST, 0, b) == UM_OK)
    return 0;
  fprintf(stderr, "bench pool: um_alloc(%zu): %s\n", n, um_last_error());
  return -1;
}

/* The pool at its limit: GW_WINDOWS 4 KiB blocks held live, to release one
 * between two windows, and GW_LIMIT / 4 KiB more released idle first. */
static int gw_fill_to_limit(gw_arg *a, um_buffer **held) {
  int count = GW_WINDOWS + (int)(GW_LIMIT / (4 * KiB));
  for (int i = 0; i < count; i++)
    if (gw_alloc(a->m, 4 * KiB, &held[i]) != 0)
      return -1;
  for (int i = GW_WINDOWS; i < count; i++)
    um_release(held[i]);
  return 0;
}

/* The median of GW_WINDOWS figures (sorted in place). */
static double gw_median(double *v) {
  qsort(v, GW_WINDOWS, sizeof(*v), bench_cmp_double);
  return (v[GW_WINDOWS / 2 - 1] + v[GW_WINDOWS / 2]) / 2;
}

/* The bin cases: windows of GW_PAIRS kept 2 KiB allocations. */
static int gw_bin_body(gw_arg *a, um_buffer **held, double *w, double *empty) {
  if (a->kind == GW_BIN_STEADY) { /* up to the high first */
    for (int i = 0; i < GW_BIN_BLOCKS; i++)
      if (gw_alloc(a->m, 2 * KiB, &held[i]) != 0)
        return -1;
    for (int i = 0; i < GW_BIN_BLOCKS; i++)
      um_release(held[i]);
  }
  for (int k = 0; k < GW_BIN_WINDOWS; k++) {
    double t0 = bench_now_ns(), t1, t2;
    t1 = bench_now_ns();
    for (int i = 0; i < GW_PAIRS; i++)
      if (gw_alloc(a->m, 2 * KiB, &held[k * GW_PAIRS + i]) != 0)
        return -1;
    t2 = bench_now_ns();
    empty[k] = t1 - t0;
    w[k] = t2 - t1;
  }
  for (int i = 0; i < GW_BIN_BLOCKS; i++)
    um_release(held[i]);
  return 0;
}

static void *gw_body(void *p) {
  gw_arg *a = p;
  static _Thread_local um_buffer *held[GW_BIN_BLOCKS > GW_WINDOWS + GW_LIMIT / (4 * KiB)
                                           ? GW_BIN_BLOCKS
                                           : GW_WINDOWS + GW_LIMIT / (4 * KiB)];
  static _Thread_local double w[GW_WINDOWS], empty[GW_WINDOWS];
  um_buffer *b;
  a->rc = -1;
  if (a->kind >= GW_BIN_STEADY) {
    if (gw_bin_body(a, held, w, empty) != 0)
      return NULL;
    qsort(w, GW_BIN_WINDOWS, sizeof(*w), bench_cmp_double);
    qsort(empty, GW_BIN_WINDOWS, sizeof(*empty), bench_cmp_double);
    a->ns_per_pair = (w[GW_BIN_WINDOWS / 2] - empty[GW_BIN_WINDOWS / 2]) / GW_PAIRS;
    a->rc = 0;
    return NULL;
  }
  if (a->kind == GW_FULL && gw_fill_to_limit(a, held) != 0)
    return NULL;
  for (int k = 0; k < GW_WINDOWS; k++) {
    double t0 = bench_now_ns(), t1, t2;
    t1 = bench_now_ns();
    for (int i = 0; i < GW_PAIRS; i++) {
      if (gw_alloc(a->m, 1 * KiB, &b) != 0)
        return NULL;
      bp_escape(b);
      um_release(b);
    }
    t2 = bench_now_ns();
    empty[k] = t1 - t0;
    w[k] = t2 - t1;
    if (a->kind == GW_GROWING && gw_alloc(a->m, 2 * KiB, &held[k]) != 0)
      return NULL;
    if (a->kind == GW_FULL)
      um_release(held[k]);
  }
  if (a->kind == GW_GROWING)
    for (int k = 0; k < GW_WINDOWS; k++)
      um_release(held[k]);
  a->ns_per_pair = (gw_median(w) - gw_median(empty)) / GW_PAIRS;
  a->rc = 0;
  return NULL;
}

/* The bins' 2 KiB blocks of the growing case, from a thread of their own
 * (on the measuring thread they would raise its highs beforehand). */
static void *gw_fill(void *p) {
  gw_arg *a = p;
  static um_buffer *held[GW_BIN_BLOCKS > GW_WINDOWS ? GW_BIN_BLOCKS : GW_WINDOWS];
  int n = a->kind >= GW_BIN_STEADY ? GW_BIN_BLOCKS : GW_WINDOWS;
  a->rc = 0;
  for (int i = 0; i < n; i++)
    if (gw_alloc(a->m, 2 * KiB, &held[i]) != 0) {
      a->rc = -1;
      for (int j = 0; j < i; j++)
        um_release(held[j]);
      return NULL;
    }
  for (int i = 0; i < n; i++)
    um_release(held[i]);
  return NULL;
}

static double gw_run(bp_env *e, int kind) {
  um_options o;
  um_manager *m;
  gw_arg a = {NULL, kind, -1, 0};
  pthread_t t;
  um_options_init(&o);
  snprintf(o.backends, sizeof(o.backends), "cpu");
  o.enable_pooling = 1;
  o.trim_interval_ms = 0;
  if (kind == GW_FULL)
    o.max_pool_bytes = GW_LIMIT;
  if (um_manager_create(&o, &m) != UM_OK) {
    fprintf(stderr, "bench pool: %s\n", um_last_error());
    e->failed = true;
    return -1;
  }
  a.m = m;
  /* This thread takes the manager's first cache, which biases the manager
   * to it (tcache.h, "A release without a locked instruction"), and holds
   * nothing: the case's threads then share the manager, and every case
   * times the same release (the compare-and-swap), whichever thread made
   * the first cache before. */
  {
    um_buffer *first;
    if (gw_alloc(m, 1 * KiB, &first) != 0) {
      um_manager_destroy(m);
      e->failed = true;
      return -1;
    }
    um_release(first);
    um_pool_trim(m, 0);
  }
  if (kind == GW_GROWING || kind >= GW_BIN_STEADY) {
    pthread_create(&t, NULL, gw_fill, &a);
    pthread_join(t, NULL);
  }
  if (a.rc == 0) {
    pthread_create(&t, NULL, gw_body, &a);
    pthread_join(t, NULL);
  }
  um_manager_destroy(m);
  if (a.rc != 0)
    e->failed = true;
  return a.rc == 0 ? a.ns_per_pair : -1;
}

static void grow_table(bp_env *e, bench_report *rep) {
  double ns[GW_CASES][64], med[GW_CASES];
  printf("\nPool hits (1 KiB allocate + release, ns per pair) while the thread grows, and with the pool\n"
         "at its limit (%d windows of %d pairs, each case on a fresh thread; target: within 1.2x of steady)\n",
         GW_WINDOWS, GW_PAIRS);
  for (int r = 0; r < e->rounds; r++)
    for (int k = 0; k < GW_CASES; k++)
      ns[k][r] = gw_run(e, k);
  for (int k = 0; k < GW_CASES; k++) {
    double nsr[NCOLS];
    bench_row *row;
    med[k] = bp_median(ns[k], e->rounds);
    for (int c = 0; c < NCOLS; c++)
      nsr[c] = c == COL_POOL ? med[k] : -1;
    row = add_row(rep, "growth", gw_name[k], k >= GW_BIN_STEADY ? 2 * KiB : 1 * KiB, nsr);
    int base = k >= GW_BIN_STEADY ? GW_BIN_STEADY : GW_STEADY;
    if (k == base) {
      printf("  %-18s %8.1f ns%s\n", gw_name[k], med[k], k == GW_BIN_STEADY ? " per 2 KiB allocation kept (from the bins)" : "");
      continue;
    }
    bench_set(row, "ratio_to_steady", med[k] / med[base]);
    printf("  %-18s %8.1f ns  %5.2fx steady: %s\n", gw_name[k], med[k], med[k] / med[base],
           med[k] <= 1.2 * med[base] ? "<=1.2x met" : "<=1.2x MISSED");
  }
}

/* ------------------------------------------------------------------------ */
/* Tables                                                                    */

static void hit_table(bp_env *e, bench_report *rep) {
  static const size_t sizes[] = {1 * KiB, 64 * KiB, 1 * MiB, 10 * MiB, 100 * MiB};
  static const int cols[] = {COL_POOL, COL_UNPOOLED, COL_GLIBC, COL_JEMALLOC, COL_MIMALLOC};
  const int ncols = 5;
  printf("\nPool hit: allocate + release the same size, one thread (ns per pair)\n");
  print_cols_header(e, cols, ncols);
  for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
    char name[32];
    double ns[NCOLS], best;
    bench_row *r;
    bench_size_text(name, sizeof(name), sizes[i]);
    measure(e, cols, ncols, sizes[i], false, ns);
    r = add_row(rep, "hit", name, sizes[i], ns);
    best = best_of_glibc_mimalloc(ns);
    print_cols(name, ns, cols, ncols);
    if (best > 0 && ns[COL_POOL] > 0) {
      bench_set(r, "ratio_to_best", ns[COL_POOL] / best);
      printf("   %5.3gx best of glibc/mimalloc: %s, %s\n", ns[COL_POOL] / best,
             ns[COL_POOL] <= 2 * best ? "<=2x met" : "<=2x MISSED", ns[COL_POOL] <= 50 ? "<=50 ns met" : "<=50 ns MISSED");
    } else {
      printf("\n");
    }
  }
}

static void touch_table(bp_env *e, bench_report *rep) {
  static const size_t sizes[] = {1 * MiB, 10 * MiB, 100 * MiB};
  static const int cols[] = {COL_POOL,  COL_UNPOOLED, COL_UNPOOLED_NOHUGE,
                             COL_GLIBC, COL_JEMALLOC, COL_MIMALLOC};
  const int ncols = 6;
  printf("\nAllocate + write every page + release (time per round trip)\n");
  printf("  (unpooled: fresh mmap with madvise(MADV_HUGEPAGE); no-huge: without; THP %s)\n", e->thp);
  print_cols_header(e, cols, ncols);
  for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
    char name[32];
    double ns[NCOLS];
    bench_row *r;
    bench_size_text(name, sizeof(name), sizes[i]);
    measure(e, cols, ncols, sizes[i], true, ns);
    r = add_row(rep, "touch", name, sizes[i], ns);
    print_cols(name, ns, cols, ncols);
    if (ns[COL_POOL] > 0 && ns[COL_GLIBC] > 0) {
      double x = ns[COL_GLIBC] / ns[COL_POOL];
      bench_set(r, "speedup_vs_glibc", x);
      printf("   %7.1fx glibc", x);
      if (sizes[i] == 100 * MiB)
        printf(": >=100x %s", x >= 100 ? "met" : "MISSED");
    }
    if (ns[COL_UNPOOLED] > 0 && ns[COL_UNPOOLED_NOHUGE] > 0) {
      bench_set(r, "huge_page_gain", ns[COL_UNPOOLED_NOHUGE] / ns[COL_UNPOOLED]);
      printf("; huge pages %.1fx", ns[COL_UNPOOLED_NOHUGE] / ns[COL_UNPOOLED]);
    }
    printf("\n");
  }
}

/* The seeds' table: the allocation call alone is timed (the release of each
 * buffer is not), as the seeds time AllocateAsync; then 100 allocate +
 * release pairs of 1 MiB, timed together. */
static double time_alloc_only(bp_env *e, size_t bytes, unsigned flags, int n) {
  double total = 0;
  for (int i = 0; i < n; i++) {
    um_buffer *b;
    double t0 = bench_now_ns();
    if (um_alloc(e->m, e->cpu, bytes, UM_HOST, flags, &b) != UM_OK) {
      e->failed = true;
      return -1;
    }
    total += bench_now_ns() - t0;
    um_release(b);
  }
  return total / n;
}

static double time_alloc_free_100(bp_env *e, unsigned flags) {
  double t0 = bench_now_ns();
  if (op_unimem(e, flags ? COL_UNPOOLED : COL_POOL, 1 * MiB, 100, false) != 0) {
    e->failed = true;
    return -1;
  }
  return bench_now_ns() - t0;
}

static void seeds_table(bp_env *e, bench_report *rep) {
  static const size_t sizes[] = {1 * MiB, 10 * MiB, 100 * MiB};
  static const char *const seed_row[] = {"Allocate 1MB", "Allocate 10MB", "Allocate 100MB"};
  static const char *const seed_fig[] = {"500us -> 45us, 11.1x", "2.1ms -> 48us, 43.8x",
                                         "18.3ms -> 52us, 352x"};
  double without[64], with[64];
  int n = e->quick ? 5 : 50;
  printf("\nThe seeds' table, on this machine (MB = MiB; the allocation call alone is timed)\n");
  printf("  %-22s %12s %12s %9s   %s\n", "Operation", "Without Pool", "With Pool", "Speedup",
         "(the seeds, a GPU)");
  for (int i = 0; i < 4; i++) {
    char a[32], b[32];
    double ns[NCOLS];
    bench_row *r;
    for (int k = 0; k < e->rounds; k++) {
      if (i < 3) {
        without[k] = time_alloc_only(e, sizes[i], UM_ALLOC_UNPOOLED, n);
        with[k] = time_alloc_only(e, sizes[i], 0, n);
      } else {
        without[k] = time_alloc_free_100(e, UM_ALLOC_UNPOOLED);
        with[k] = time_alloc_free_100(e, 0);
      }
    }
    for (int c = 0; c < NCOLS; c++)
      ns[c] = -1;
    ns[COL_UNPOOLED] = bp_median(without, e->rounds);
    ns[COL_POOL] = bp_median(with, e->rounds);
    r = add_row(rep, "seeds", i < 3 ? seed_row[i] : "Allocate+Free (100x)", i < 3 ? sizes[i] : MiB, ns);
    fmt_time(a, sizeof(a), ns[COL_UNPOOLED]);
    fmt_time(b, sizeof(b), ns[COL_POOL]);
    bench_set(r, "speedup", ns[COL_UNPOOLED] / ns[COL_POOL]);
    printf("  %-22s %12s %12s %8.1fx   %s\n", i < 3 ? seed_row[i] : "Allocate+Free (100x)", a, b,
           ns[COL_UNPOOLED] / ns[COL_POOL], i < 3 ? seed_fig[i] : "51ms -> 5.2ms, 9.8x");
  }
}

/* Two threads against one: each thread runs iters pairs after a start
 * barrier; throughput is all pairs over the wall time. */
typedef struct bp_thread_arg {
  bp_env *e;
  int col;
  size_t bytes;
  long iters;
  pthread_barrier_t *start;
  int rc;
  double t0, t1; /* this thread's run, measured by itself */
  double cpu_ns;  /* CPU time this thread spent in its run */
} bp_thread_arg;

static double bp_thread_cpu_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static void *thread_body(void *p) {
  bp_thread_arg *a = p;
  a->rc = run_op(a->e, a->col, a->bytes, 1, false); /* this thread's cache, warm */
  double c0;
  pthread_barrier_wait(a->start);
  c0 = bp_thread_cpu_ns();
  a->t0 = bench_now_ns();
  if (a->rc == 0)
    a->rc = run_op(a->e, a->col, a->bytes, a->iters, false);
  a->t1 = bench_now_ns();
  a->cpu_ns = bp_thread_cpu_ns() - c0;
  return NULL;
}

/* Pairs per second with nthreads threads: all pairs over the time from
 * the first thread's start to the last one's end, as the threads see them
 * (the main thread only waits: on two CPUs it would be a third runner). */
static double throughput(bp_env *e, int col, size_t bytes, long iters, int nthreads, double *cpu_per_pair) {
  pthread_t t[2];
  bp_thread_arg a[2];
  pthread_barrier_t start;
  double t0 = 0, t1 = 0, cpu = 0;
  pthread_barrier_init(&start, NULL, (unsigned)nthreads);
  for (int i = 0; i < nthreads; i++) {
    a[i] = (bp_thread_arg){e, col, bytes, iters, &start, 0, 0, 0, 0};
    pthread_create(&t[i], NULL, thread_body, &a[i]);
  }
  for (int i = 0; i < nthreads; i++)
    pthread_join(t[i], NULL);
  pthread_barrier_destroy(&start);
  for (int i = 0; i < nthreads; i++) {
    if (i == 0 || a[i].t0 < t0)
      t0 = a[i].t0;
    if (i == 0 || a[i].t1 > t1)
      t1 = a[i].t1;
    cpu += a[i].cpu_ns;
  }
  *cpu_per_pair = cpu / ((double)iters * nthreads);
  for (int i = 0; i < nthreads; i++)
    if (a[i].rc != 0)
      e->failed = true;
  return (double)iters * nthreads / ((t1 - t0) / 1e9);
}

/* One row of the threads table: column col at bytes, one thread and two. */
static void thread_row(bp_env *e, bench_report *rep, int col, size_t bytes) {
  double one[64], two[64], cpu1[64], cpu2[64], ns[NCOLS], m1, m2, c1, c2;
  char name[48], sz[32];
  bench_row *r;
  /* about 20 ms (quick: 2 ms) per thread per sample */
  long iters = calibrate(e, col, bytes, false);
  if (iters < 0) {
    e->failed = true;
    return;
  }
  iters *= e->quick ? 4 : 10;
  for (int k = 0; k < e->rounds; k++) {
    one[k] = throughput(e, col, bytes, iters, 1, &cpu1[k]);
    two[k] = throughput(e, col, bytes, iters, 2, &cpu2[k]);
  }
  m1 = bp_median(one, e->rounds);
  m2 = bp_median(two, e->rounds);
  c1 = bp_median(cpu1, e->rounds);
  c2 = bp_median(cpu2, e->rounds);
  for (int c = 0; c < NCOLS; c++)
    ns[c] = c == col ? 1e9 / m1 : -1;
  bench_size_text(sz, sizeof(sz), bytes);
  snprintf(name, sizeof(name), "%s %s", sz, col_title[col]);
  r = add_row(rep, "threads", name, bytes, ns);
  bench_set(r, "pairs_per_s_1t", m1);
  bench_set(r, "pairs_per_s_2t", m2);
  bench_set(r, "scaling", m2 / m1);
  bench_set(r, "cpu_ns_per_pair_1t", c1);
  bench_set(r, "cpu_ns_per_pair_2t", c2);
  bench_set(r, "scaling_by_cpu_time", 2 * c1 / c2);
  printf("  %-9s %-9s %11.3g %11.3g %6.2fx %9.1f %9.1f %6.2fx%s\n", sz, col_title[col], m1, m2, m2 / m1, c1, c2,
         2 * c1 / c2,
         col != COL_POOL      ? ""
         : m2 / m1 >= 1.6     ? "  >=1.6x met"
         : 2 * c1 / c2 >= 1.6 ? "  >=1.6x: wall MISSED (CPUs busy), by CPU time met"
                              : "  >=1.6x MISSED");
}

/* Wall-clock scaling needs a second CPU that nobody else uses; on a shared
 * machine it often is not there. The CPU time each thread spends per pair
 * tells the rest: equal with one thread and with two means the threads do
 * not slow each other down (no shared line, no lock), and two free CPUs
 * would give 2x. Both are printed. */
static void threads_table(bp_env *e, bench_report *rep) {
  static const size_t sizes[] = {1 * KiB, 64 * KiB};
  static const int cols[] = {COL_POOL, COL_GLIBC, COL_MIMALLOC};
  printf("\nTwo threads against one: pool hits (allocate + release)\n");
  printf("  (%d CPUs here, shared with other work; glibc and mimalloc show what the machine allows.\n"
         "   cpu ns/pair: CPU time each thread spent per pair; the same with 2 threads as with 1\n"
         "   means the threads do not contend, and 2 idle CPUs would give 2x)\n",
         e->ncores);
  printf("  %-9s %-9s %11s %11s %7s %9s %9s %7s\n", "size", "", "1T pairs/s", "2T pairs/s", "2T/1T",
         "cpu ns 1T", "cpu ns 2T", "2x cpu");
  for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
    for (size_t c = 0; c < sizeof(cols) / sizeof(cols[0]); c++)
      if (col_present(e, cols[c]))
        thread_row(e, rep, cols[c], sizes[i]);
}

/* ------------------------------------------------------------------------ */
/* The trace                                                                 */

typedef struct bp_event {
  int id;       /* allocation number */
  size_t bytes; /* 0: free */
} bp_event;

typedef struct bp_trace {
  bp_event *ev;
  int nev, nalloc; /* events; ids (one more than the highest: a recorded trace reuses them) */
  int nallocs;     /* allocation events */
  uint64_t peak_requested;
} bp_trace;

#define TRACE_SEED 20240611u
#define TRACE_ALLOCS 4000

static uint64_t trace_rand(uint64_t *s) {
  *s ^= *s >> 12;
  *s ^= *s << 25;
  *s ^= *s >> 27;
  return *s * 2685821657736338717ull;
}

/* Log-uniform in [lo, hi]. */
static size_t log_uniform(uint64_t *s, double lo, double hi) {
  double u = (double)(trace_rand(s) >> 11) / 9007199254740992.0;
  double v = lo * exp(u * log(hi / lo));
  return v < 1 ? 1 : (size_t)v;
}

/* The trace: TRACE_ALLOCS allocations whose sizes follow a mix typical of
 * compute programs (half small, a third medium, some large), each freed
 * after a lifetime counted in later allocations: mostly short, some long.
 * Every allocation is freed by the end. */
static int make_trace(const char *path) {
  uint64_t s = TRACE_SEED;
  int *free_at = malloc(sizeof(int) * TRACE_ALLOCS);
  FILE *f = fopen(path, "w");
  if (f == NULL || free_at == NULL) {
    fprintf(stderr, "bench pool: cannot write %s: %s\n", path, strerror(errno));
    free(free_at);
    if (f)
      fclose(f);
    return 1;
  }
  fprintf(f, "# unimem allocation trace: bench_pool --make-trace (seed %u, %d allocations)\n",
          TRACE_SEED, TRACE_ALLOCS);
  fprintf(f, "# a ID BYTES: allocate; f ID: free. Sizes: 50%% 16 B-4 KiB, 30%% 4-256 KiB,\n");
  fprintf(f, "# 15%% 256 KiB-4 MiB, 5%% 4-16 MiB (log-uniform); lifetime in later\n");
  fprintf(f, "# allocations: 80%% 1-16, 15%% 16-256, 5%% 256-2048.\n");
  for (int i = 0; i < TRACE_ALLOCS; i++) {
    uint64_t r = trace_rand(&s) % 100, l = trace_rand(&s) % 100;
    size_t bytes = r < 50 ? log_uniform(&s, 16, 4096)
                   : r < 80 ? log_uniform(&s, 4096, 256 * 1024)
                   : r < 95 ? log_uniform(&s, 256 * 1024, 4 << 20)
                            : log_uniform(&s, 4 << 20, 16 << 20);
    int life = l < 80 ? (int)log_uniform(&s, 1, 16) : l < 95 ? (int)log_uniform(&s, 16, 256)
                                                              : (int)log_uniform(&s, 256, 2048);
    free_at[i] = i + life;
    /* frees due before this allocation, oldest first */
    for (int j = 0; j < i; j++)
      if (free_at[j] == i)
        fprintf(f, "f %d\n", j);
    fprintf(f, "a %d %zu\n", i, bytes);
  }
  for (int t = TRACE_ALLOCS; t <= TRACE_ALLOCS + 2048; t++)
    for (int j = 0; j < TRACE_ALLOCS; j++)
      if (free_at[j] == t)
        fprintf(f, "f %d\n", j);
  free(free_at);
  return fclose(f) == 0 ? 0 : 1;
}

static int load_trace(const char *path, bp_trace *t) {
  FILE *f = fopen(path, "r");
  char line[128];
  int cap = 0;
  uint64_t live = 0;
  size_t *sizes = NULL;
  memset(t, 0, sizeof(*t));
  if (f == NULL)
    return -1;
  while (fgets(line, sizeof(line), f)) {
    int id;
    size_t bytes = 0;
    if (line[0] == '#' || line[0] == '\n')
      continue;
    if (!((line[0] == 'a' && sscanf(line + 1, "%d %zu", &id, &bytes) == 2 && bytes > 0) ||
          (line[0] == 'f' && sscanf(line + 1, "%d", &id) == 1)) ||
        id < 0 || id > 10000000) {
      fprintf(stderr, "bench pool: %s: bad line: %s", path, line);
      goto fail;
    }
    if (t->nev == cap) {
      bp_event *grown = realloc(t->ev, sizeof(*grown) * (size_t)(cap = cap ? 2 * cap : 8192));
      if (grown == NULL)
        goto fail;
      t->ev = grown;
    }
    if (id >= t->nalloc) {
      size_t *g = realloc(sizes, sizeof(*g) * (size_t)(id + 1));
      if (g == NULL)
        goto fail;
      memset(g + t->nalloc, 0, sizeof(*g) * (size_t)(id + 1 - t->nalloc));
      sizes = g;
      t->nalloc = id + 1;
    }
    if (bytes) {
      t->nallocs++;
      sizes[id] = bytes;
      live += bytes;
      if (live > t->peak_requested)
        t->peak_requested = live;
    } else {
      live -= sizes[id];
    }
    t->ev[t->nev].id = id;
    t->ev[t->nev].bytes = bytes;
    t->nev++;
  }
  fclose(f);
  free(sizes);
  return 0;
fail:
  fclose(f);
  free(sizes);
  free(t->ev);
  t->ev = NULL;
  return -2;
}

/* Bytes requested and reserved over a replay: a point every stride
 * allocations (the stride doubles when the points run out). */
#define SERIES_POINTS 1024
typedef struct bp_series {
  int n, stride, seen;
  int event[SERIES_POINTS];
  uint64_t requested[SERIES_POINTS], reserved[SERIES_POINTS];
} bp_series;

static void series_add(bp_series *sr, int event, uint64_t requested, uint64_t reserved) {
  if (sr->stride == 0)
    sr->stride = 1;
  if (sr->seen++ % sr->stride != 0)
    return;
  if (sr->n == SERIES_POINTS) { /* keep every other point */
    for (int i = 0; i < SERIES_POINTS / 2; i++) {
      sr->event[i] = sr->event[2 * i];
      sr->requested[i] = sr->requested[2 * i];
      sr->reserved[i] = sr->reserved[2 * i];
    }
    sr->n = SERIES_POINTS / 2;
    sr->stride *= 2;
  }
  sr->event[sr->n] = event;
  sr->requested[sr->n] = requested;
  sr->reserved[sr->n] = reserved;
  sr->n++;
}

/* Replay once with column col on manager m (unimem columns); slots holds
 * one pointer per allocation. touch: write every page of every block.
 * peak_reserved (untimed runs): read the pool's figures after every
 * allocation and keep the peak of bytes reserved; series (untimed, may be
 * NULL): the bytes requested and reserved over the replay. Returns the
 * time, or -1. */
static double replay(bp_env *e, um_manager *m, int col, const bp_trace *t, void **slots, bool touch,
                     uint64_t *peak_reserved, uint64_t *peak_live, bp_series *series) {
  um_device *cpu = m != NULL ? um_device_get(m, 0) : NULL;
  uint64_t requested = 0;
  double t0 = bench_now_ns();
  for (int i = 0; i < t->nev; i++) {
    const bp_event *ev = &t->ev[i];
    if (series != NULL)
      requested += ev->bytes ? ev->bytes : 0;
    if (ev->bytes) {
      void *p;
      if (col <= COL_UNPOOLED) {
        um_buffer *b;
        if (um_alloc(m, cpu, ev->bytes, UM_HOST, col == COL_POOL ? 0 : UM_ALLOC_UNPOOLED, &b) != UM_OK)
          return -1;
        slots[ev->id] = b;
        p = um_buffer_host_ptr(b);
        if (peak_reserved != NULL) {
          um_stats s;
          um_stats_get(m, cpu, &s);
          if (s.bytes_reserved > *peak_reserved)
            *peak_reserved = s.bytes_reserved;
          if (s.bytes_reserved - s.bytes_pooled > *peak_live)
            *peak_live = s.bytes_reserved - s.bytes_pooled;
          if (series != NULL)
            series_add(series, i, requested, s.bytes_reserved);
        }
      } else {
        p = e->c_malloc[col](ev->bytes);
        if (p == NULL)
          return -1;
        slots[ev->id] = p;
      }
      if (touch)
        bp_touch(p, ev->bytes);
      else
        bp_escape(p);
    } else if (col <= COL_UNPOOLED) {
      if (series != NULL)
        requested -= um_buffer_size(slots[ev->id]);
      um_release(slots[ev->id]);
    } else {
      e->c_free[col](slots[ev->id]);
    }
  }
  return bench_now_ns() - t0;
}

/* Timed replays of every column, the pool and the allocators warm (one
 * untimed replay each first): median time per event into ns. */
static void time_replays(bp_env *e, const bp_trace *t, void **slots, bool touch, double *ns) {
  static const int cols[] = {COL_POOL, COL_UNPOOLED, COL_GLIBC, COL_JEMALLOC, COL_MIMALLOC};
  const int ncols = 5;
  double samples[NCOLS][64];
  int reps = e->quick ? 1 : 5;
  for (int c = 0; c < NCOLS; c++)
    ns[c] = -1;
  for (int c = 0; c < ncols; c++)
    if (col_present(e, cols[c]) && replay(e, e->m, cols[c], t, slots, touch, NULL, NULL, NULL) < 0)
      e->failed = true;
  for (int k = 0; k < reps; k++)
    for (int c = 0; c < ncols; c++) {
      samples[c][k] = -1;
      if (col_present(e, cols[c]))
        samples[c][k] = replay(e, e->m, cols[c], t, slots, touch, NULL, NULL, NULL);
    }
  for (int c = 0; c < ncols; c++)
    if (col_present(e, cols[c]))
      ns[cols[c]] = bp_median(samples[c], reps) / (double)t->nev;
}

/* One replay on a fresh manager with a pool of at most max_pool bytes
 * (0: the default), figures read after every allocation. */
static int trace_pass(bp_env *e, const bp_trace *t, void **slots, uint64_t max_pool, double *hit_rate,
                      uint64_t *peak_reserved, uint64_t *peak_live, bp_series *series) {
  um_manager *m;
  um_options o;
  um_stats s;
  um_options_init(&o);
  snprintf(o.backends, sizeof(o.backends), "cpu");
  o.enable_pooling = 1;
  o.trim_interval_ms = 0;
  if (max_pool != 0) {
    o.max_pool_bytes = max_pool;
    o.max_pool_bytes_per_class = max_pool;
  }
  if (um_manager_create(&o, &m) != UM_OK)
    return -1;
  *peak_reserved = *peak_live = 0;
  if (replay(e, m, COL_POOL, t, slots, false, peak_reserved, peak_live, series) < 0) {
    um_manager_destroy(m);
    return -1;
  }
  um_stats_get(m, NULL, &s);
  *hit_rate = s.hit_rate;
  um_manager_destroy(m);
  return 0;
}

/* What replays from an empty pool show, with the default limits and with
 * the pool capped at half the peak request; the bytes over the default
 * replay; the peak RSS growth of each column's replay in a process of its
 * own (0: not measured). */
typedef struct trace_pool {
  uint64_t cap;
  double hit_default, hit_capped;
  uint64_t peak_default, peak_capped, live_default, live_capped;
  bp_series series;
  uint64_t rss[NCOLS];
} trace_pool;

static int trace_pool_passes(bp_env *e, const bp_trace *t, void **slots, trace_pool *p) {
  memset(p, 0, sizeof(*p));
  p->cap = t->peak_requested / 2;
  return trace_pass(e, t, slots, 0, &p->hit_default, &p->peak_default, &p->live_default, &p->series) != 0 ||
                 trace_pass(e, t, slots, p->cap, &p->hit_capped, &p->peak_capped, &p->live_capped, NULL) != 0
             ? -1
             : 0;
}

#ifndef BP_SANITIZER /* the peak-RSS children: rss_passes says why a sanitizer build has none */
/* A field of /proc/self/status in bytes (its kB), or 0. */
static uint64_t status_bytes(const char *field) {
  char line[256];
  unsigned long long kb = 0;
  size_t n = strlen(field);
  FILE *f = fopen("/proc/self/status", "r");
  if (f == NULL)
    return 0;
  while (fgets(line, sizeof(line), f))
    if (strncmp(line, field, n) == 0 && line[n] == ':' && sscanf(line + n + 1, "%llu", &kb) == 1)
      break;
  fclose(f);
  return (uint64_t)kb * 1024;
}

/* The memory an allocator keeps from earlier tables given back, so that
 * a child's replay starts from none (glibc: malloc_trim; jemalloc: a purge
 * of every arena; mimalloc: mi_collect). */
static void purge_allocator(int col) {
  void *h;
  if (col == COL_GLIBC) {
    malloc_trim(0);
  } else if (col == COL_JEMALLOC && (h = dlopen("libjemalloc.so.2", RTLD_NOW | RTLD_NOLOAD)) != NULL) {
    int (*ctl)(const char *, void *, size_t *, void *, size_t);
    void *f = dlsym(h, "mallctl");
    memcpy(&ctl, &f, sizeof(f));
    if (ctl != NULL)
      ctl("arena.4096.purge", NULL, NULL, NULL, 0); /* 4096: MALLCTL_ARENAS_ALL */
  } else if (col == COL_MIMALLOC && (h = dlopen("libmimalloc.so.2", RTLD_NOW | RTLD_NOLOAD)) != NULL) {
    void (*collect)(bool);
    void *f = dlsym(h, "mi_collect");
    memcpy(&collect, &f, sizeof(f));
    if (collect != NULL)
      collect(true);
  }
}

/* In a child: the peak resident memory that one replay of column col adds
 * (every page touched), written to fd. The column's allocator first gives
 * back what it keeps from earlier tables; unimem replays through a manager
 * of its own (default options). */
static void rss_child(bp_env *e, const bp_trace *t, void **slots, int col, int fd) {
  uint64_t base, peak = 0;
  um_manager *m = NULL;
  int ok = 1;
  unsetenv("UNIMEM_TRACE_FILE"); /* a recording would add its own memory, and its files */
  if (col == COL_POOL) {
    um_options o;
    um_options_init(&o);
    snprintf(o.backends, sizeof(o.backends), "cpu");
    o.trim_interval_ms = 0;
    ok = um_manager_create(&o, &m) == UM_OK;
  }
  purge_allocator(col);
  /* The peak so far set back to what is resident now (Linux 4.0). */
  FILE *cr = fopen("/proc/self/clear_refs", "w");
  if (cr != NULL) {
    fputs("5", cr);
    fclose(cr);
  }
  base = status_bytes("VmRSS");
  if (ok && replay(e, m, col, t, slots, true, NULL, NULL, NULL) >= 0)
    peak = status_bytes("VmHWM");
  peak = peak > base ? peak - base : 0;
  if (write(fd, &peak, sizeof(peak)) != (ssize_t)sizeof(peak))
    _exit(1);
  _exit(0);
}

#endif

/* Each column's child, bounded: one that has not answered within a minute
 * is killed and its figure left out. A sanitizer build leaves them all
 * out: its runtime's locks can be inherited held by a child that starts
 * threads (a manager does), and its allocator is not the column's. */
static void rss_passes(bp_env *e, const bp_trace *t, void **slots, trace_pool *p) {
#ifdef BP_SANITIZER
  (void)e, (void)t, (void)slots, (void)p;
#else
  static const int cols[] = {COL_POOL, COL_GLIBC, COL_JEMALLOC, COL_MIMALLOC};
  for (size_t c = 0; c < sizeof(cols) / sizeof(cols[0]); c++) {
    int fds[2], status;
    uint64_t v = 0;
    pid_t pid;
    struct pollfd pf;
    if (!col_present(e, cols[c]) || pipe(fds) != 0)
      continue;
    fflush(stdout);
    if ((pid = fork()) == 0) {
      close(fds[0]);
      rss_child(e, t, slots, cols[c], fds[1]);
    }
    close(fds[1]);
    pf.fd = fds[0];
    pf.events = POLLIN;
    if (pid > 0 && poll(&pf, 1, 60000) == 1 && read(fds[0], &v, sizeof(v)) == (ssize_t)sizeof(v))
      p->rss[cols[c]] = v;
    else if (pid > 0)
      kill(pid, SIGKILL);
    close(fds[0]);
    if (pid > 0)
      waitpid(pid, &status, 0);
  }
#endif
}

/* The series in FILE: event, bytes requested, bytes reserved (a header
 * line first), for `unimem replay --plot`. */
static void write_series(const char *path, const char *trace, const bp_series *sr) {
  FILE *f = fopen(path, "w");
  if (f == NULL) {
    fprintf(stderr, "bench pool: cannot write %s: %s\n", path, strerror(errno));
    return;
  }
  fprintf(f, "# %s: event, bytes requested, bytes reserved (from an empty pool, default options)\n", trace);
  for (int i = 0; i < sr->n; i++)
    fprintf(f, "%d %llu %llu\n", sr->event[i], (unsigned long long)sr->requested[i],
            (unsigned long long)sr->reserved[i]);
  fclose(f);
}

/* Reserved and requested at ten moments of the replay, as fractions of the
 * peak request. */
static void print_series(const bp_trace *t, const bp_series *sr) {
  double req = (double)t->peak_requested;
  if (sr->n < 10)
    return;
  printf("  over the replay (tenths of it; fractions of peak requested):\n    requested");
  for (int k = 1; k <= 10; k++)
    printf(" %5.2f", (double)sr->requested[k * (sr->n - 1) / 10] / req);
  printf("\n    reserved ");
  for (int k = 1; k <= 10; k++)
    printf(" %5.2f", (double)sr->reserved[k * (sr->n - 1) / 10] / req);
  printf("\n");
}

static void print_trace_pool(const char *path, const bp_trace *t, const trace_pool *p) {
  double req = (double)t->peak_requested;
  printf("\nTrace replay: %s\n", path);
  printf("  %d allocations, %d events; peak requested %.1f MiB\n", t->nallocs, t->nev, req / (double)MiB);
  printf("  live blocks at their peak: %.1f MiB = %.3fx the bytes asked for (size classes)\n",
         (double)p->live_default / (double)MiB, (double)p->live_default / req);
  printf("  from an empty pool: hit rate %.1f%%, peak reserved (live + idle) %.1f MiB = %.2fx peak requested\n",
         100 * p->hit_default, (double)p->peak_default / (double)MiB, (double)p->peak_default / req);
  printf("  pool capped at %.1f MiB: hit rate %.1f%%, peak reserved %.1f MiB = %.2fx (seeds: 90-95%% hits)\n",
         (double)p->cap / (double)MiB, 100 * p->hit_capped, (double)p->peak_capped / (double)MiB,
         (double)p->peak_capped / req);
  print_series(t, &p->series);
  if (p->rss[COL_POOL] != 0 || p->rss[COL_GLIBC] != 0) {
    static const int cols[] = {COL_POOL, COL_GLIBC, COL_JEMALLOC, COL_MIMALLOC};
    printf("  peak RSS growth, every page touched (a process each), over peak requested:");
    for (size_t c = 0; c < sizeof(cols) / sizeof(cols[0]); c++)
      if (p->rss[cols[c]] != 0)
        printf(" %s %.2fx", col_title[cols[c]], (double)p->rss[cols[c]] / req);
    printf("\n");
  }
}

/* The name of a trace's rows: its file's name without ".txt". */
static void trace_name(const char *path, char *out, size_t cap) {
  const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
  size_t n = strlen(base);
  if (n > 4 && strcmp(base + n - 4, ".txt") == 0)
    n -= 4;
  snprintf(out, cap, "%.*s", (int)n, base);
}

/* The two timed rows (every page touched, and the calls alone), with the
 * pool's figures, printed and recorded. */
static void trace_rows(bp_env *e, bench_report *rep, const char *path, const bp_trace *t, void **slots,
                       const trace_pool *p) {
  static const int cols[] = {COL_POOL, COL_UNPOOLED, COL_GLIBC, COL_JEMALLOC, COL_MIMALLOC};
  char names[2][96], base[64];
  double ns[2][NCOLS], req = (double)t->peak_requested;
  bench_row *r[2];
  um_manager *shared = e->m, *own = NULL;
  um_options o;
  trace_name(path, base, sizeof(base));
  snprintf(names[0], sizeof(names[0]), "%s, touched", base);
  snprintf(names[1], sizeof(names[1]), "%s, calls only", base);
  /* unimem's columns on a manager of this trace's own (e->m's options), so
   * that no earlier trace's peak is the pool's. */
  um_options_init(&o);
  snprintf(o.backends, sizeof(o.backends), "cpu");
  o.enable_pooling = 1;
  o.trim_interval_ms = 0;
  if (um_manager_create(&o, &own) == UM_OK)
    e->m = own;
  for (int i = 0; i < 2; i++) {
    time_replays(e, t, slots, i == 0, ns[i]);
    add_row(rep, "trace", names[i], 0, ns[i]);
  }
  /* Taken after both rows exist: adding one may move the others. */
  r[0] = &rep->rows[rep->nrows - 2];
  r[1] = &rep->rows[rep->nrows - 1];
  e->m = shared;
  if (own != NULL)
    um_manager_destroy(own);
  bench_set(r[0], "hit_rate", p->hit_default);
  bench_set(r[0], "peak_requested_bytes", req);
  bench_set(r[0], "peak_reserved_bytes", (double)p->peak_default);
  bench_set(r[0], "reserved_over_requested", (double)p->peak_default / req);
  bench_set(r[0], "live_capacity_over_requested", (double)p->live_default / req);
  for (int c = 0; c < NCOLS; c++)
    if (p->rss[c] != 0) {
      char key[BENCH_KEY_MAX];
      snprintf(key, sizeof(key), "rss_over_requested_%s", col_title[c]);
      bench_set(r[0], key, (double)p->rss[c] / req);
    }
  bench_set(r[1], "hit_rate_capped_pool", p->hit_capped);
  bench_set(r[1], "peak_reserved_capped_bytes", (double)p->peak_capped);
  print_trace_pool(path, t, p);
  printf("  time per event, warm (median of %d replays; touched: every page of every block written):\n",
         e->quick ? 1 : 5);
  print_cols_header(e, cols, 5);
  for (int i = 0; i < 2; i++) {
    double best = best_of_glibc_mimalloc(ns[i]);
    print_cols(names[i], ns[i], cols, 5);
    if (ns[i][COL_POOL] > 0 && best > 0) {
      bench_set(r[i], "ratio_to_best", ns[i][COL_POOL] / best);
      printf("   %.2fx the best of glibc/mimalloc", ns[i][COL_POOL] / best);
    }
    printf("\n");
  }
}

/* A loaded trace, its slots, and its RSS figures (measured before any
 * table ran). */
typedef struct trace_job {
  char path[4096];
  bp_trace t;
  void **slots;
  trace_pool p;
  int st; /* load_trace's */
} trace_job;

static int trace_load_job(trace_job *j) {
  j->st = load_trace(j->path, &j->t);
  if (j->st == 0 && (j->slots = calloc((size_t)j->t.nalloc, sizeof(*j->slots))) == NULL)
    j->st = -2;
  return j->st;
}

static void trace_table(bp_env *e, bench_report *rep, trace_job *j, bool first) {
  if (j->st != 0) {
    printf("\nTrace: cannot read %s%s (UNIMEM_TRACE_DIR names the directory of mixed.txt;\n"
           "       bench_pool --make-trace FILE writes it)\n",
           j->path, j->st == -1 ? "" : ": bad format");
    if (j->st == -2)
      e->failed = true;
    return;
  }
  if (trace_pool_passes(e, &j->t, j->slots, &j->p) != 0) {
    e->failed = true;
    return;
  }
  rss_passes(e, &j->t, j->slots, &j->p);
  if (e->series_path != NULL && first)
    write_series(e->series_path, j->path, &j->p.series);
  trace_rows(e, rep, j->path, &j->t, j->slots, &j->p);
}

/* ------------------------------------------------------------------------ */
/* The run                                                                   */

/* The default trace (see the comment at the top) into out. No path of the
 * source tree is built in: an installed or moved program finds its own. */
static void default_trace(char *out, size_t cap) {
  static const char *const beside[] = {UM_BENCH_TRACE_INSTALLED, UM_BENCH_TRACE_BUILT};
  const char *env = getenv("UNIMEM_TRACE_DIR");
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (env != NULL && env[0] != '\0') {
    snprintf(out, cap, "%s/%s", env, TRACE_FILE);
    return;
  }
  exe[n > 0 ? n : 0] = '\0';
  if (strrchr(exe, '/') != NULL)
    *strrchr(exe, '/') = '\0';
  for (size_t i = 0; i < sizeof(beside) / sizeof(beside[0]); i++) {
    char *found;
    if (snprintf(out, cap, "%s/%s/%s", exe, beside[i], TRACE_FILE) >= (int)cap || access(out, R_OK) != 0 ||
        (found = realpath(out, NULL)) == NULL)
      continue;
    snprintf(out, cap, "%s", found);
    free(found);
    return;
  }
  /* Where an installed program would find it: the message names it. */
  if (snprintf(out, cap, "%s/%s/%s", exe, beside[0], TRACE_FILE) >= (int)cap)
    snprintf(out, cap, "%s", TRACE_FILE);
}

/* Two managers of the host CPU: pooled, with huge pages as the options
 * say, and one without huge pages (the unpooled first-touch column). */
static int open_managers(bp_env *e) {
  um_options o;
  um_options_init(&o);
  snprintf(o.backends, sizeof(o.backends), "cpu");
  o.enable_pooling = 1;
  o.trim_interval_ms = 0; /* no timer thread waking in the middle */
  if (um_manager_create(&o, &e->m) != UM_OK) {
    fprintf(stderr, "bench pool: %s\n", um_last_error());
    return 1;
  }
  e->cpu = um_device_get(e->m, 0);
  if (!o.huge_pages)
    printf("note: UNIMEM_HUGE_PAGES=0: the unpooled column has no huge pages either\n");
  o.huge_pages = 0;
  if (um_manager_create(&o, &e->m_nohuge) != UM_OK) {
    fprintf(stderr, "bench pool: %s\n", um_last_error());
    um_manager_destroy(e->m);
    return 1;
  }
  e->cpu_nohuge = um_device_get(e->m_nohuge, 0);
  return 0;
}

static void record_run(const bp_env *e, bench_report *rep) {
  bench_set_bool(&rep->facts, "quick", e->quick);
  bench_set_text(&rep->facts, "device", e->machine);
  bench_set(&rep->facts, "cpus", e->ncores);
  bench_set_text(&rep->facts, "thp", e->thp);
  bench_set(&rep->facts, "rounds", e->rounds);
  for (int c = COL_GLIBC; c < NCOLS; c++)
    bench_set_text_in(&rep->facts, "allocators", col_title[c], col_present(e, c) ? "loaded" : e->status[c]);
}

static void print_run(const bp_env *e) {
  printf("unimem pool benchmark%s: %s, %d CPUs, transparent huge pages: %s\n", e->quick ? " (quick)" : "",
         e->machine, e->ncores, e->thp);
  printf("glibc malloc/free (this process); jemalloc: %s; mimalloc: %s\n",
         col_present(e, COL_JEMALLOC) ? "libjemalloc.so.2 malloc/free" : e->status[COL_JEMALLOC],
         col_present(e, COL_MIMALLOC) ? "libmimalloc.so.2 mi_malloc/mi_free" : e->status[COL_MIMALLOC]);
  printf("medians of %d rounds; the columns run in turn within each round\n", e->rounds);
  fflush(stdout);
}

/* ------------------------------------------------------------------------ */
/* What observing costs (um_tag_push, um_history_start): the pool hit and a
 * small copy on a manager of its own per mode, the modes in turn within
 * each round; ns per event (a pair is two: an allocation and a release). */

#define OBS_MODES 3
static const char *const obs_mode_names[OBS_MODES] = {"off", "tags", "history"};

/* Median ns of n allocate + release pairs of bytes (or, copy, of n 4 KiB
 * copies from the host) on m. */
static double obs_time(um_manager *m, size_t bytes, bool copy, int n, unsigned char *host) {
  um_device *cpu = um_device_get(m, 0);
  um_buffer *b = NULL;
  double t0;
  if (copy && um_alloc(m, cpu, 4096, UM_DEVICE, 0, &b) != UM_OK)
    return -1;
  t0 = bench_now_ns();
  for (int i = 0; i < n; i++) {
    if (copy) {
      if (um_copy_from_host(b, 0, host, 4096, NULL) != UM_OK)
        return -1;
    } else {
      um_buffer *x;
      if (um_alloc(m, cpu, bytes, UM_DEVICE, 0, &x) != UM_OK)
        return -1;
      um_release(x);
    }
  }
  t0 = bench_now_ns() - t0;
  if (b != NULL)
    um_release(b);
  return t0 / n;
}

static void observe_table(bp_env *e, bench_report *rep) {
  static const size_t sizes[] = {1 * KiB, 64 * KiB, 0};
  const int n = e->quick ? 2000 : 20000, rounds = e->quick ? 3 : 7;
  unsigned char host[4096];
  um_manager *m[OBS_MODES];
  memset(host, 7, sizeof(host));
  printf("\nObserving: the pool hit (allocate + release) and a 4 KiB copy from the host, per event\n");
  printf("  (tags: one um_tag_push open; history: um_history_start recording; medians of %d rounds)\n", rounds);
  printf("  %-24s %12s %12s %12s %14s\n", "", "off", "tags", "history", "history adds");
  for (int k = 0; k < OBS_MODES; k++) {
    um_options o;
    um_options_init(&o);
    snprintf(o.backends, sizeof(o.backends), "cpu");
    o.trim_interval_ms = 0;
    if (um_manager_create(&o, &m[k]) != UM_OK) {
      e->failed = true;
      for (int j = 0; j < k; j++)
        um_manager_destroy(m[j]);
      return;
    }
  }
  um_tag_push(m[1], "bench");
  um_history_start(m[2], (size_t)1 << 16); /* a ring that wraps: the steady state */
  for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
    bool copy = sizes[i] == 0;
    double samples[OBS_MODES][16], ns[OBS_MODES];
    char name[48];
    bench_row *r;
    if (copy)
      snprintf(name, sizeof(name), "4 KiB copy (1 event)");
    else {
      char sz[16];
      bench_size_text(sz, sizeof(sz), sizes[i]);
      snprintf(name, sizeof(name), "%s hit (2 events)", sz);
    }
    for (int k = 0; k < OBS_MODES; k++) /* warm: the pool holds the block */
      obs_time(m[k], sizes[i], copy, n / 10, host);
    for (int rd = 0; rd < rounds; rd++)
      for (int k = 0; k < OBS_MODES; k++)
        samples[k][rd] = obs_time(m[k], sizes[i], copy, n, host) / (copy ? 1 : 2);
    r = bench_add_row(rep, "observe", name);
    bench_set(r, "bytes", copy ? 4096.0 : (double)sizes[i]);
    printf("  %-24s", name);
    for (int k = 0; k < OBS_MODES; k++) {
      char t[24];
      ns[k] = bp_median(samples[k], rounds);
      bench_set(r, obs_mode_names[k], ns[k]);
      fmt_time(t, sizeof(t), ns[k]);
      printf(" %12s", t);
    }
    bench_set(r, "history_adds_ns", ns[2] - ns[0]);
    printf(" %+11.1f ns  %s\n", ns[2] - ns[0], ns[2] - ns[0] <= 100 ? "<=100 ns met" : "<=100 ns MISSED");
  }
  um_history_stop(m[2]);
  um_tag_pop(m[1]);
  for (int k = 0; k < OBS_MODES; k++)
    um_manager_destroy(m[k]);
}

/* Whether table name is to run (--only). */
static bool table_on(const bp_env *e, const char *name) {
  size_t n = strlen(name);
  for (const char *p = e->only; p != NULL; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL)
    if (!strncmp(p, name, n) && (p[n] == ',' || p[n] == '\0'))
      return true;
  return e->only == NULL;
}

/* Every table (or those --only names), after a warm-up (CPU clock, page
 * tables, lazy binding). */
static void run_tables(bp_env *e, bench_report *rep, trace_job *jobs, int njobs) {
  double t0 = bench_now_ns();
  while (bench_now_ns() - t0 < (e->quick ? 20e6 : 200e6))
    for (int c = COL_POOL; c < NCOLS; c++)
      if (col_present(e, c) && c != COL_UNPOOLED_NOHUGE)
        run_op(e, c, 1 * KiB, 1000, false);
  if (table_on(e, "hit"))
    hit_table(e, rep);
  if (table_on(e, "touch"))
    touch_table(e, rep);
  if (table_on(e, "seeds"))
    seeds_table(e, rep);
  if (table_on(e, "threads"))
    threads_table(e, rep);
  if (table_on(e, "growth"))
    grow_table(e, rep);
  if (table_on(e, "observe"))
    observe_table(e, rep);
  if (table_on(e, "trace"))
    for (int i = 0; i < njobs; i++)
      trace_table(e, rep, &jobs[i], i == 0);
  fflush(stdout);
}

/* The traces to replay: FILE of --trace, or mixed.txt (default_trace) and
 * the generated ones beside it (bench/trace_gen.c), those that are there. */
static int trace_jobs(const char *trace, trace_job **out) {
  static const char *const kinds[] = {"llm.txt", "training.txt", "dataframe.txt", "vectors.txt"};
  trace_job *jobs = calloc(1 + sizeof(kinds) / sizeof(kinds[0]), sizeof(*jobs));
  int n = 0;
  if (jobs == NULL)
    return -1;
  if (trace != NULL) {
    snprintf(jobs[n++].path, sizeof(jobs[0].path), "%s", trace);
  } else {
    char dir[4096];
    default_trace(jobs[n++].path, sizeof(jobs[0].path));
    snprintf(dir, sizeof(dir), "%s", jobs[0].path);
    if (strrchr(dir, '/') != NULL)
      *strrchr(dir, '/') = '\0';
    else
      snprintf(dir, sizeof(dir), ".");
    for (size_t k = 0; k < sizeof(kinds) / sizeof(kinds[0]); k++) {
      if (snprintf(jobs[n].path, sizeof(jobs[0].path), "%s/%s", dir, kinds[k]) < (int)sizeof(jobs[0].path) &&
          access(jobs[n].path, R_OK) == 0)
        n++;
    }
  }
  for (int i = 0; i < n; i++)
    trace_load_job(&jobs[i]);
  *out = jobs;
  return n;
}

static void trace_jobs_free(trace_job *jobs, int n) {
  for (int i = 0; i < n; i++) {
    free(jobs[i].slots);
    free(jobs[i].t.ev);
  }
  free(jobs);
}

static void usage(const char *argv0) {
  fprintf(stderr, "usage: %s [--quick] [--only TABLE[,TABLE...]] [--json FILE] [--trace FILE] [--series FILE]\n"
                  "       %s --make-trace FILE [--kind mixed|llm|training|dataframe|vectors]\n"
                  "  tables: hit, touch, seeds, threads, growth, observe, trace\n",
          argv0, argv0);
}

int um_bench_pool_main(int argc, char **argv, bench_report *rep) {
  const char *trace = NULL, *series = NULL;
  trace_job *jobs = NULL;
  bp_env *e;
  int quick = 0, rc, njobs;
  const char *only = NULL;
  double t_start = bench_now_ns();

  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--quick")) {
      quick = 1;
    } else if (!strcmp(argv[i], "--trace") && i + 1 < argc) {
      trace = argv[++i];
    } else if (!strcmp(argv[i], "--only") && i + 1 < argc) {
      only = argv[++i];
    } else if (!strcmp(argv[i], "--series") && i + 1 < argc) {
      series = argv[++i];
    } else if (!strcmp(argv[i], "--make-trace") && i + 1 < argc) {
      const char *kind = i + 3 < argc && !strcmp(argv[i + 2], "--kind") ? argv[i + 3] : "mixed";
      return strcmp(kind, "mixed") == 0 ? make_trace(argv[i + 1]) : um_trace_gen_write(kind, argv[i + 1]);
    } else {
      usage(argv[0]);
      return 2;
    }
  }
  reexec_for_static_tls();
  if ((njobs = trace_jobs(trace, &jobs)) < 0 || (e = calloc(1, sizeof(*e))) == NULL) {
    free(jobs);
    return 1;
  }
  e->series_path = series;
  e->quick = quick;
  e->only = only;
  e->rounds = quick ? 3 : 11;
  e->sample_ns = quick ? 0.5e6 : 2e6;
  describe_machine(e);
  load_allocators(e);
  if (open_managers(e) != 0) {
    trace_jobs_free(jobs, njobs);
    free(e);
    return 1;
  }
  record_run(e, rep);
  print_run(e);
  run_tables(e, rep, jobs, njobs);
  trace_jobs_free(jobs, njobs);
  printf("\n(%.1f s)\n", (bench_now_ns() - t_start) / 1e9);
  rc = e->failed ? 1 : 0;
  um_manager_destroy(e->m_nohuge);
  um_manager_destroy(e->m);
  free(e);
  return rc;
}

#ifndef UM_BENCH_NO_MAIN
int main(int argc, char **argv) { return bench_program_main(argc, argv, "pool", um_bench_pool_main); }
#endif
