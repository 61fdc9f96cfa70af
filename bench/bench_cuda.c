/* unimem on an NVIDIA GPU against the CUDA driver's own calls, in one run:
 *
 *  - allocation: a pool hit (um_alloc + um_release of DEVICE memory)
 *    against cuMemAlloc + cuMemFree, and against cuMemAllocAsync +
 *    cuMemFreeAsync on a stream (with the driver's pool told to keep its
 *    memory, its best case, and a stream synchronisation, so that the
 *    memory is as ready as a pool hit's), at 1 KiB, 64 KiB, 1 MiB, 10 MiB,
 *    100 MiB and 1 GiB (--quick: 1 and 10 MiB; a size that does not fit the
 *    GPU's memory four times over is left out, with a note): the seeds
 *    claim 11x, 44x and 352x over cuMemAlloc at 1, 10 and 100 MiB;
 *  - host <-> device bandwidth: unimem from its PINNED memory against
 *    cuMemcpyHtoD / cuMemcpyDtoH from cuMemHostAlloc memory (target: at
 *    least 90% of the raw call); unimem from pageable memory (pipelined
 *    through pinned staging chunks above one chunk) against the raw call
 *    from the same pageable memory and against unimem's pinned figure
 *    (target: at least 80% of pinned); and a UM_WRAP_PIN wrap of pageable
 *    memory (registered with the driver);
 *  - device-local copies against cuMemcpyDtoD;
 *  - small copies of 4 KiB, host memory pinned on both sides: 1000 of them
 *    host -> device at 1000 distinct offsets through one um_copy_batch,
 *    against 1000 cuMemcpyHtoDAsync on one stream and one
 *    cuStreamSynchronize; one copy with an event (um_copy with done, then
 *    um_event_wait), against cuMemcpyHtoDAsync + cuEventRecord +
 *    cuEventSynchronize (the time unimem adds per copy); a blocking round
 *    trip (host -> device -> host) against cuMemcpyHtoD + cuMemcpyDtoH.
 *
 * Every figure is the median of samples that alternate between the sides,
 * so that every side sees the same machine; a sample of a fast operation
 * repeats it and divides. Bandwidth is bytes moved / time (GB = 1e9 B).
 *
 *   bench_cuda [--quick] [--small] [--json FILE]
 *
 * --small runs the small operations alone (a few seconds: cheap to repeat,
 * and to run again with UNIMEM_WAIT_SPIN_NS set).
 *
 * The report's rows: table "alloc" (unimem_pool_hit_ns, cumemalloc_free_ns,
 * cumemallocasync_free_ns per pair, and the ratios), table "copies"
 * (direction, memory, unimem_ns and raw_ns per copy, and in GB/s), table
 * "small" (copies per operation, unimem_ns and raw_ns per operation: a
 * whole batch, one copy with its event, one round trip; the same per copy;
 * ratio = raw_ns / unimem_ns, above 1 when unimem is faster; and the calls
 * of each side in words). The facts include wait_spin_ns, unimem's option
 * for how long a waiting thread polls before it sleeps.
 *
 * The driver is libcuda.so.1, or the file UNIMEM_CUDA_LIBRARY names, for
 * both sides (the test suite's smoke run points it at the fake driver,
 * whose figures mean nothing). The raw side loads the driver itself and
 * declares the few entry points it calls by their exported (ABI) names, so
 * that this program builds without cuda.h. Exit status: 0 measured, 77 no
 * driver or no GPU (the reason is printed), 1 a failure.
 *
 * Built as the `unimem bench cuda` subcommand with -DUM_BENCH_NO_MAIN
 * (entry point um_bench_cuda_main). */
#include <dlfcn.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdatomic.h>
#include <time.h>

#include "bench_util.h"
#include "report.h"
#include "unimem.h"

#define LEN(a) (sizeof(a) / sizeof((a)[0]))
#define KiB ((size_t)1024)
#define MiB (1024 * KiB)
#define EXIT_NO_GPU BENCH_SKIPPED

int um_bench_cuda_main(int argc, char **argv, bench_report *rep);

/* ------------------------------------------------------------------------ */
/* The driver's entry points, by their exported names                         */

typedef int CUresult; /* 0 is CUDA_SUCCESS */
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUmemPoolHandle_st *CUmemoryPool;
typedef void (*bc_stream_callback)(CUstream stream, CUresult status, void *user);

enum {
  BC_CUDA_ERROR_NO_DEVICE = 100,
  BC_MEMHOSTALLOC_PORTABLE = 0x01,
  BC_STREAM_NON_BLOCKING = 0x1,
  BC_EVENT_BLOCKING_SYNC = 0x1,
  BC_EVENT_DISABLE_TIMING = 0x2,
  BC_MEMPOOL_ATTR_RELEASE_THRESHOLD = 4
};

/* REQUIRED / OPTIONAL (symbol, return, arguments). */
#define BC_ENTRY_POINTS(R, O)                                                  \
  R(cuInit, (unsigned flags))                                                  \
  R(cuDriverGetVersion, (int *version))                                        \
  R(cuDeviceGetCount, (int *count))                                            \
  R(cuDeviceGet, (CUdevice * device, int ordinal))                             \
  R(cuDeviceGetName, (char *name, int len, CUdevice device))                   \
  R(cuDeviceTotalMem_v2, (size_t * bytes, CUdevice device))                    \
  R(cuDevicePrimaryCtxRetain, (CUcontext * ctx, CUdevice device))              \
  R(cuDevicePrimaryCtxRelease_v2, (CUdevice device))                           \
  R(cuCtxSetCurrent, (CUcontext ctx))                                          \
  R(cuCtxSynchronize, (void))                                                  \
  R(cuMemAlloc_v2, (CUdeviceptr * dptr, size_t bytes))                         \
  R(cuMemFree_v2, (CUdeviceptr dptr))                                          \
  R(cuMemHostAlloc, (void **p, size_t bytes, unsigned flags))                  \
  R(cuMemFreeHost, (void *p))                                                  \
  R(cuMemcpyHtoD_v2, (CUdeviceptr dst, const void *src, size_t bytes))         \
  R(cuMemcpyDtoH_v2, (void *dst, CUdeviceptr src, size_t bytes))               \
  R(cuMemcpyDtoD_v2, (CUdeviceptr dst, CUdeviceptr src, size_t bytes))         \
  R(cuMemcpyHtoDAsync_v2,                                                      \
    (CUdeviceptr dst, const void *src, size_t bytes, CUstream stream))         \
  R(cuStreamCreate, (CUstream * stream, unsigned flags))                       \
  R(cuStreamSynchronize, (CUstream stream))                                    \
  R(cuStreamDestroy_v2, (CUstream stream))                                     \
  R(cuEventCreate, (CUevent * event, unsigned flags))                          \
  R(cuEventRecord, (CUevent event, CUstream stream))                           \
  R(cuEventSynchronize, (CUevent event))                                       \
  R(cuEventDestroy_v2, (CUevent event))                                        \
  O(cuGetErrorName, (CUresult error, const char **name))                       \
  O(cuMemAllocAsync, (CUdeviceptr * dptr, size_t bytes, CUstream stream))      \
  O(cuMemFreeAsync, (CUdeviceptr dptr, CUstream stream))                       \
  O(cuDeviceGetDefaultMemPool, (CUmemoryPool * pool, CUdevice device))         \
  O(cuMemPoolSetAttribute, (CUmemoryPool pool, int attr, void *value))         \
  O(cuMemPoolTrimTo, (CUmemoryPool pool, size_t keep))                         \
  O(cuStreamAddCallback, (CUstream stream, bc_stream_callback cb, void *user, unsigned flags))

typedef struct bc_driver {
#define BC_FIELD_(symbol, args) CUresult (*symbol) args;
  BC_ENTRY_POINTS(BC_FIELD_, BC_FIELD_)
#undef BC_FIELD_
  void *library;
  const char *path;
} bc_driver;

static bc_driver cu;

/* The driver's name for an error code, or its number. */
static const char *cu_error(CUresult r) {
  static char text[64];
  const char *name = NULL;
  if (cu.cuGetErrorName != NULL && cu.cuGetErrorName(r, &name) == 0 && name != NULL)
    return name;
  snprintf(text, sizeof(text), "CUresult %d", r);
  return text;
}

#define CU_CHECK(call)                                                         \
  do {                                                                         \
    CUresult r_ = (call);                                                      \
    if (r_ != 0) {                                                             \
      fprintf(stderr, "bench_cuda: %s failed: %s\n", #call, cu_error(r_));     \
      return 1;                                                                \
    }                                                                          \
  } while (0)

#define UM_CHECK(call)                                                         \
  do {                                                                         \
    int st_ = (call);                                                          \
    if (st_ != UM_OK) {                                                        \
      fprintf(stderr, "bench_cuda: %s failed: %s: %s\n", #call,                \
              um_err_name(st_), um_last_error());                              \
      return 1;                                                                \
    }                                                                          \
  } while (0)

/* Load the driver: 0, or EXIT_NO_GPU with the reason in why. */
static int driver_load(char *why, size_t cap) {
  const char *path = getenv("UNIMEM_CUDA_LIBRARY");
  void *sym;
  if (path == NULL || path[0] == '\0')
    path = "libcuda.so.1";
  cu.path = path;
  cu.library = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (cu.library == NULL) {
    const char *e = dlerror();
    snprintf(why, cap, "no CUDA driver: %s", e != NULL ? e : path);
    return EXIT_NO_GPU;
  }
#define BC_LOAD_(symbol, args, required)                                       \
  sym = dlsym(cu.library, #symbol);                                            \
  if (sym == NULL && (required)) {                                             \
    snprintf(why, cap, "%s has no %s", path, #symbol);                         \
    return EXIT_NO_GPU;                                                        \
  }                                                                            \
  memcpy(&cu.symbol, &sym, sizeof(sym));
#define BC_REQUIRED_(symbol, args) BC_LOAD_(symbol, args, 1)
#define BC_OPTIONAL_(symbol, args) BC_LOAD_(symbol, args, 0)
  BC_ENTRY_POINTS(BC_REQUIRED_, BC_OPTIONAL_)
#undef BC_REQUIRED_
#undef BC_OPTIONAL_
#undef BC_LOAD_
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Timing                                                                    */

/* One side of a comparison: run(ctx, iters) performs iters operations and
 * returns 0, or nonzero on a failure. */
typedef int (*bc_run_fn)(void *ctx, int iters);
typedef struct bc_side {
  bc_run_fn run; /* NULL: not measured */
  void *ctx;
  double ns; /* median per operation, < 0 when not measured */
} bc_side;

#define BC_MAX_SAMPLES 31
#define BC_MAX_SIDES 4

typedef struct bc_plan {
  int samples;
  double sample_ns; /* a sample repeats an operation until about this long */
} bc_plan;

/* Median ns per operation of each side. Each side is warmed up once, then
 * gets its repetition count (doubling until a sample takes plan's time);
 * the samples of the sides alternate. */
static int measure(const bc_plan *plan, bc_side *sides, int nsides) {
  double t[BC_MAX_SIDES][BC_MAX_SAMPLES];
  int iters[BC_MAX_SIDES];
  for (int s = 0; s < nsides; s++) {
    sides[s].ns = -1;
    iters[s] = 1;
    if (sides[s].run == NULL)
      continue;
    if (sides[s].run(sides[s].ctx, 1) != 0)
      return 1;
    for (;;) {
      double t0 = bench_now_ns();
      if (sides[s].run(sides[s].ctx, iters[s]) != 0)
        return 1;
      if (bench_now_ns() - t0 >= plan->sample_ns || iters[s] >= (1 << 20))
        break;
      iters[s] *= 2;
    }
  }
  for (int k = 0; k < plan->samples; k++) {
    for (int s = 0; s < nsides; s++) {
      double t0;
      if (sides[s].run == NULL)
        continue;
      t0 = bench_now_ns();
      if (sides[s].run(sides[s].ctx, iters[s]) != 0)
        return 1;
      t[s][k] = (bench_now_ns() - t0) / iters[s];
    }
  }
  for (int s = 0; s < nsides; s++)
    if (sides[s].run != NULL)
      sides[s].ns = bench_median(t[s], plan->samples);
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Allocation                                                                */

/* A pool hit, cuMemAlloc + cuMemFree, or cuMemAllocAsync + cuMemFreeAsync
 * and a stream synchronisation. */
typedef enum { ALLOC_POOL_HIT, ALLOC_CUMEMALLOC, ALLOC_CUMEMALLOCASYNC } alloc_kind;

typedef struct alloc_ctx {
  alloc_kind kind;
  um_manager *m;
  um_device *dev;
  size_t bytes;
  CUstream stream;
} alloc_ctx;

/* One allocation and its release: 0, or 1 on a failure. */
static int alloc_once(const alloc_ctx *c) {
  CUdeviceptr d;
  um_buffer *b;
  switch (c->kind) {
  case ALLOC_POOL_HIT:
    return um_alloc(c->m, c->dev, c->bytes, UM_DEVICE, 0, &b) != UM_OK || um_release(b) != UM_OK;
  case ALLOC_CUMEMALLOC:
    return cu.cuMemAlloc_v2(&d, c->bytes) != 0 || cu.cuMemFree_v2(d) != 0;
  default:
    return cu.cuMemAllocAsync(&d, c->bytes, c->stream) != 0 || cu.cuMemFreeAsync(d, c->stream) != 0 ||
           cu.cuStreamSynchronize(c->stream) != 0;
  }
}

static int run_alloc(void *p, int iters) {
  for (int i = 0; i < iters; i++)
    if (alloc_once(p) != 0)
      return 1;
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Copies                                                                    */

typedef enum { RAW_H2D, RAW_D2H, RAW_D2D, UM_COPY, UM_FROM_HOST, UM_TO_HOST } copy_kind;

typedef struct copy_ctx {
  copy_kind kind;
  size_t bytes;
  CUdeviceptr dptr, dptr2;
  void *host;
  um_buffer *dst, *src;
} copy_ctx;

static int run_copy(void *p, int iters) {
  copy_ctx *c = p;
  for (int i = 0; i < iters; i++) {
    int bad;
    switch (c->kind) {
    case RAW_H2D:
      bad = cu.cuMemcpyHtoD_v2(c->dptr, c->host, c->bytes) != 0;
      break;
    case RAW_D2H:
      bad = cu.cuMemcpyDtoH_v2(c->host, c->dptr, c->bytes) != 0;
      break;
    case RAW_D2D:
      /* Device to device returns before the copy ends: wait for it, as
       * unimem's blocking copy does. */
      bad = cu.cuMemcpyDtoD_v2(c->dptr2, c->dptr, c->bytes) != 0 || cu.cuCtxSynchronize() != 0;
      break;
    case UM_COPY:
      bad = um_copy(c->dst, 0, c->src, 0, c->bytes, NULL) != UM_OK;
      break;
    case UM_FROM_HOST:
      bad = um_copy_from_host(c->dst, 0, c->host, c->bytes, NULL) != UM_OK;
      break;
    default:
      bad = um_copy_to_host(c->src, 0, c->host, c->bytes, NULL) != UM_OK;
      break;
    }
    if (bad)
      return 1;
  }
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Small copies                                                              */

#define SMALL_BYTES (4 * KiB)
#define SMALL_OPS 1000
#define PHASE_BLOCKS 15 /* the phases of a copy with an event: blocks per side */
#define PHASE_OPS 200   /* and copies per block */

/* The small-copy cases, host memory pinned on both sides (the raw side's
 * from cuMemHostAlloc, unimem's a PINNED buffer). */
/* SMALL_EVENT_H2D's raw side waits as the context's default scheduling
 * does (CU_CTX_SCHED_AUTO spins while the GPUs are fewer than the CPUs);
 * SMALL_EVENT_SLEEP_H2D's raw side waits on a blocking-sync event, which
 * sleeps in the driver until the GPU's interrupt: the peer of unimem's
 * default wait, which burns no CPU either (um_options.wait_spin_ns 0). */
/* SMALL_EVENT_CALLBACK_H2D's raw side is the peer SPEC's per-operation
 * target names: the copy, its event and a completion callback
 * (cuStreamAddCallback, run on the driver's thread), waited for until the
 * callback has run; unimem's completion (its event done, the buffers'
 * order moved on) is what the callback stands for. */
typedef enum {
  SMALL_BATCH_H2D,
  SMALL_EVENT_H2D,
  SMALL_EVENT_SLEEP_H2D,
  SMALL_EVENT_CALLBACK_H2D,
  SMALL_EVENTS_H2D,
  SMALL_ROUND_TRIP
} small_kind;

typedef struct small_case {
  small_kind kind;
  const char *name;
  int copies; /* per operation */
  const char *unimem_calls, *raw_calls;
  const char *peer; /* copies with an event: the target's reading of raw */
} small_case;

static const small_case small_cases[] = {
    {SMALL_BATCH_H2D, "batch 1000 x 4 KiB h2d", SMALL_OPS, "one um_copy_batch of 1000 ops, PINNED -> DEVICE",
     "1000 cuMemcpyHtoDAsync_v2 on one stream + cuStreamSynchronize", NULL},
    {SMALL_EVENT_H2D, "4 KiB h2d + event", 1, "um_copy with an event + um_event_wait + um_event_release",
     "cuMemcpyHtoDAsync_v2 + cuEventRecord + cuEventSynchronize", "cuEventRecord + cuEventSynchronize"},
    {SMALL_EVENT_SLEEP_H2D, "4 KiB h2d + event, sleep", 1, "um_copy with an event + um_event_wait + um_event_release",
     "cuMemcpyHtoDAsync_v2 + cuEventRecord + cuEventSynchronize, blocking-sync event",
     "a blocking-sync cuEventSynchronize (it sleeps, as unimem's default wait does)"},
    {SMALL_EVENT_CALLBACK_H2D, "4 KiB h2d + event, callback", 1,
     "um_copy with an event + um_event_wait + um_event_release",
     "cuMemcpyHtoDAsync_v2 + cuEventRecord + cuStreamAddCallback + cuEventSynchronize, then until the callback ran",
     "cuEventRecord + a completion callback (SPEC's peer)"},
    {SMALL_EVENTS_H2D, "1000 x 4 KiB h2d, events", SMALL_OPS,
     "1000 um_copy with an event each, then um_event_wait + um_event_release of each",
     "1000 cuMemcpyHtoDAsync_v2 + cuEventRecord on one stream, then cuEventSynchronize of each", NULL},
    {SMALL_ROUND_TRIP, "4 KiB round trip", 2, "blocking um_copy h2d, then d2h", "cuMemcpyHtoD_v2 + cuMemcpyDtoH_v2", NULL},
};

/* The memory of the small copies: SMALL_OPS copies' worth on each side. */
typedef struct small_buffers {
  CUdeviceptr dptr;
  unsigned char *host; /* cuMemHostAlloc memory */
  CUstream stream;
  CUevent event;       /* recorded after each copy of SMALL_EVENT_H2D */
  CUevent sleep_event; /* SMALL_EVENT_SLEEP_H2D's: CU_EVENT_BLOCKING_SYNC */
  CUevent *events;     /* SMALL_EVENTS_H2D's: SMALL_OPS of them, */
  um_event **um_events; /* and unimem's */
  um_manager *m;
  um_buffer *dev, *pin;
  um_copy_op *ops; /* pin -> dev at SMALL_OPS distinct offsets */
} small_buffers;

typedef struct small_ctx {
  small_kind kind;
  const small_buffers *x;
  bool unimem; /* the side: unimem's calls, or the driver's */
} small_ctx;

/* SMALL_EVENT_CALLBACK_H2D's: set by the callback, cleared by its waiter. */
static atomic_int small_called;

static void small_callback(CUstream stream, CUresult status, void *user) {
  (void)stream;
  (void)status;
  (void)user;
  atomic_store_explicit(&small_called, 1, memory_order_release);
}

static int small_raw_once(const small_ctx *c) {
  const small_buffers *x = c->x;
  switch (c->kind) {
  case SMALL_BATCH_H2D:
    for (size_t k = 0; k < SMALL_OPS; k++)
      if (cu.cuMemcpyHtoDAsync_v2(x->dptr + k * SMALL_BYTES, x->host + k * SMALL_BYTES, SMALL_BYTES, x->stream) != 0)
        return 1;
    return cu.cuStreamSynchronize(x->stream) != 0;
  case SMALL_EVENT_H2D:
  case SMALL_EVENT_SLEEP_H2D: {
    CUevent ev = c->kind == SMALL_EVENT_H2D ? x->event : x->sleep_event;
    return cu.cuMemcpyHtoDAsync_v2(x->dptr, x->host, SMALL_BYTES, x->stream) != 0 ||
           cu.cuEventRecord(ev, x->stream) != 0 || cu.cuEventSynchronize(ev) != 0;
  }
  case SMALL_EVENTS_H2D:
    for (size_t k = 0; k < SMALL_OPS; k++)
      if (cu.cuMemcpyHtoDAsync_v2(x->dptr + k * SMALL_BYTES, x->host + k * SMALL_BYTES, SMALL_BYTES, x->stream) != 0 ||
          cu.cuEventRecord(x->events[k], x->stream) != 0)
        return 1;
    for (size_t k = 0; k < SMALL_OPS; k++)
      if (cu.cuEventSynchronize(x->events[k]) != 0)
        return 1;
    return 0;
  case SMALL_EVENT_CALLBACK_H2D:
    if (cu.cuMemcpyHtoDAsync_v2(x->dptr, x->host, SMALL_BYTES, x->stream) != 0 ||
        cu.cuEventRecord(x->event, x->stream) != 0 ||
        cu.cuStreamAddCallback(x->stream, small_callback, NULL, 0) != 0 || cu.cuEventSynchronize(x->event) != 0)
      return 1;
    while (atomic_load_explicit(&small_called, memory_order_acquire) == 0)
      ;
    atomic_store_explicit(&small_called, 0, memory_order_relaxed);
    return 0;
  default:
    return cu.cuMemcpyHtoD_v2(x->dptr, x->host, SMALL_BYTES) != 0 ||
           cu.cuMemcpyDtoH_v2(x->host, x->dptr, SMALL_BYTES) != 0;
  }
}

static int small_unimem_once(const small_ctx *c) {
  const small_buffers *x = c->x;
  um_event *done;
  int st;
  switch (c->kind) {
  case SMALL_BATCH_H2D:
    return um_copy_batch(x->m, x->ops, SMALL_OPS, NULL) != UM_OK;
  case SMALL_EVENTS_H2D: {
    size_t issued = 0;
    int bad = 0;
    for (; issued < SMALL_OPS; issued++)
      if (um_copy(x->dev, issued * SMALL_BYTES, x->pin, issued * SMALL_BYTES, SMALL_BYTES, &x->um_events[issued]) !=
          UM_OK)
        break;
    bad = issued < SMALL_OPS;
    for (size_t k = 0; k < issued; k++) {
      bad |= um_event_wait(x->um_events[k]) != UM_OK;
      bad |= um_event_release(x->um_events[k]) != UM_OK;
    }
    return bad;
  }
  case SMALL_EVENT_H2D:
  case SMALL_EVENT_SLEEP_H2D:
  case SMALL_EVENT_CALLBACK_H2D:
    if (um_copy(x->dev, 0, x->pin, 0, SMALL_BYTES, &done) != UM_OK)
      return 1;
    st = um_event_wait(done);
    return (um_event_release(done) != UM_OK) | (st != UM_OK);
  default:
    return um_copy(x->dev, 0, x->pin, 0, SMALL_BYTES, NULL) != UM_OK ||
           um_copy(x->pin, 0, x->dev, 0, SMALL_BYTES, NULL) != UM_OK;
  }
}

static int run_small(void *p, int iters) {
  const small_ctx *c = p;
  for (int i = 0; i < iters; i++)
    if ((c->unimem ? small_unimem_once(c) : small_raw_once(c)) != 0)
      return 1;
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Results                                                                   */

typedef struct results {
  char gpu[256];
  int driver_version;
  int devices;
  uint64_t total_bytes;
  size_t staging_chunk;
  uint32_t wait_spin_ns;
  char notes[6][512];
  int nnotes;
} results;

static bool in_table(const bench_row *row, const char *table) {
  return strcmp(bench_get_text(row, "table"), table) == 0;
}

/* Whether the report has rows of table (--small leaves two without). */
static bool has_table(const bench_report *rep, const char *table) {
  for (int i = 0; i < rep->nrows; i++)
    if (in_table(&rep->rows[i], table))
      return true;
  return false;
}

static void print_alloc(const bench_report *rep) {
  static const double seeds_claim[] = {11, 44, 352};
  printf("\nAllocate + free DEVICE memory, median ns per pair\n");
  printf("%-9s %14s %16s %8s %22s %8s %12s\n", "size", "unimem pool", "cuMemAlloc+Free", "ratio",
         "cuMemAllocAsync+Free", "ratio", "seeds claim");
  for (int i = 0; i < rep->nrows; i++) {
    const bench_row *a = &rep->rows[i];
    double pool, raw, async;
    size_t bytes;
    char size[32];
    /* Only this table's rows have its figures (a missing one reads -1). */
    if (!in_table(a, "alloc"))
      continue;
    pool = bench_get(a, "unimem_pool_hit_ns");
    raw = bench_get(a, "cumemalloc_free_ns");
    async = bench_get(a, "cumemallocasync_free_ns");
    bytes = (size_t)bench_get(a, "bytes");
    bench_size_text(size, sizeof(size), bytes);
    printf("%-9s %14.0f %16.0f %7.1fx", size, pool, raw, raw / pool);
    if (async > 0)
      printf(" %22.0f %7.1fx", async, async / pool);
    else
      printf(" %22s %8s", "n/a", "");
    if (bytes == MiB || bytes == 10 * MiB || bytes == 100 * MiB)
      printf(" %11.0fx", seeds_claim[bytes == MiB ? 0 : bytes == 10 * MiB ? 1 : 2]);
    printf("\n");
  }
}

static void print_copies(const bench_report *rep) {
  printf("\nCopies, GB/s (median); raw = the driver's own blocking call on the same memory kind\n");
  printf("%-5s %-9s %-9s %10s %12s %11s\n", "dir", "memory", "size", "raw GB/s", "unimem GB/s", "unimem/raw");
  for (int i = 0; i < rep->nrows; i++) {
    const bench_row *b = &rep->rows[i];
    char size[32];
    if (!in_table(b, "copies"))
      continue;
    bench_size_text(size, sizeof(size), (size_t)bench_get(b, "bytes"));
    printf("%-5s %-9s %-9s ", bench_get_text(b, "direction"), bench_get_text(b, "memory"), size);
    if (bench_get(b, "raw_gbps") > 0)
      printf("%10.2f ", bench_get(b, "raw_gbps"));
    else
      printf("%10s ", "-");
    printf("%12.2f ", bench_get(b, "unimem_gbps"));
    if (bench_get(b, "raw_gbps") > 0)
      printf("%10.0f%%", 100.0 * bench_get(b, "unimem_over_raw"));
    printf("\n");
  }
}

static void print_small(const bench_report *rep) {
  printf("\nSmall copies of 4 KiB, pinned host memory, median ns per operation (a whole batch, one copy\n"
         "with its event, one round trip); ratio = raw / unimem (above 1: unimem faster)\n");
  printf("%-28s %6s %12s %12s %7s %12s %12s %12s\n", "operation", "copies", "unimem ns", "raw ns", "ratio",
         "unimem/copy", "raw/copy", "added/copy");
  for (int i = 0; i < rep->nrows; i++) {
    const bench_row *b = &rep->rows[i];
    double um_ns = bench_get(b, "unimem_ns"), raw_ns = bench_get(b, "raw_ns"), copies = bench_get(b, "copies");
    if (!in_table(b, "small"))
      continue;
    printf("%-28s %6.0f %12.0f %12.0f %7.2f %12.0f %12.0f %+12.0f\n", bench_get_text(b, "name"), copies, um_ns,
           raw_ns, raw_ns / um_ns, um_ns / copies, raw_ns / copies, (um_ns - raw_ns) / copies);
  }
  for (int i = 0; i < rep->nrows; i++)
    if (in_table(&rep->rows[i], "small"))
      printf("  %s: unimem %s; raw %s\n", bench_get_text(&rep->rows[i], "name"),
             bench_get_text(&rep->rows[i], "unimem_calls"), bench_get_text(&rep->rows[i], "raw_calls"));
  for (int i = 0; i < rep->nrows; i++) {
    const bench_row *b = &rep->rows[i];
    if (!in_table(b, "phases"))
      continue;
    printf("  %s, phases (ns, median of %d blocks of %d): issue unimem %.0f raw %.0f (%+.0f); "
           "wait unimem %.0f raw %.0f (%+.0f)\n", bench_get_text(b, "name"), PHASE_BLOCKS, PHASE_OPS,
           bench_get(b, "unimem_issue_ns"), bench_get(b, "raw_issue_ns"),
           bench_get(b, "unimem_issue_ns") - bench_get(b, "raw_issue_ns"), bench_get(b, "unimem_wait_ns"),
           bench_get(b, "raw_wait_ns"), bench_get(b, "unimem_wait_ns") - bench_get(b, "raw_wait_ns"));
    printf("  %s, raw with a blocking-sync event: issue %.0f ns, wait %.0f ns\n", bench_get_text(b, "name"),
           bench_get(b, "raw_blocking_issue_ns"), bench_get(b, "raw_blocking_wait_ns"));
  }
}

/* SPEC's targets for small copies, set for OpenCL, read against the CUDA
 * driver's calls: a batch at >= 0.9x the raw asynchronous copies, and a
 * copy with an event adding <= 0.3 us. */
static void print_small_targets(const bench_report *rep) {
  const bench_row *batch = bench_find_row(rep, "small", "name", small_cases[0].name);
  if (batch != NULL) {
    double ratio = bench_get(batch, "ratio");
    printf("  batch 1000 x 4 KiB    unimem %.2fx cuMemcpyHtoDAsync loop (target >= 0.9x): %s\n", ratio,
           ratio >= 0.9 ? "met" : "MISSED");
  }
  for (size_t i = 0; i < LEN(small_cases); i++) {
    const bench_row *event = bench_find_row(rep, "small", "name", small_cases[i].name);
    double added;
    if (small_cases[i].peer == NULL || event == NULL)
      continue;
    added = (bench_get(event, "unimem_ns") - bench_get(event, "raw_ns")) / 1e3;
    printf("  4 KiB copy + event    unimem adds %+.2f us over %s (target <= 0.3 us): %s\n", added, small_cases[i].peer,
           added <= 0.3 ? "met" : "MISSED");
  }
}

/* Pinned copies at >= 90% of the driver's; pageable ones at >= 80% of
 * unimem's pinned copies of the same direction and size. */
static void print_targets(const bench_report *rep, size_t staging_chunk) {
  printf("\nTargets (at each size):\n");
  for (int i = 0; i < rep->nrows; i++) {
    const bench_row *b = &rep->rows[i], *pinned;
    const char *what, *memory;
    double um_ns, raw_ns;
    size_t bytes;
    char size[32], name[64];
    if (!in_table(b, "copies"))
      continue;
    what = bench_get_text(b, "direction");
    memory = bench_get_text(b, "memory");
    um_ns = bench_get(b, "unimem_ns");
    raw_ns = bench_get(b, "raw_ns");
    bytes = (size_t)bench_get(b, "bytes");
    bench_size_text(size, sizeof(size), bytes);
    if (!strcmp(memory, "pinned") && raw_ns > 0)
      printf("  %s %-8s pinned   unimem %5.1f%% of cuMemcpy%s (target >= 90%%): %s\n", what, size,
             100.0 * raw_ns / um_ns, !strcmp(what, "h2d") ? "HtoD" : "DtoH", raw_ns / um_ns >= 0.90 ? "met" : "MISSED");
    snprintf(name, sizeof(name), "%s pinned %s", what, size);
    if (!strcmp(memory, "pageable") && (pinned = bench_find_row(rep, "copies", "name", name)) != NULL) {
      double pinned_ns = bench_get(pinned, "unimem_ns");
      printf("  %s %-8s pageable unimem %5.1f%% of unimem pinned%s (target >= 80%%): %s\n", what, size,
             100.0 * pinned_ns / um_ns, bytes > staging_chunk ? ", staged" : ", one call",
             pinned_ns / um_ns >= 0.80 ? "met" : "MISSED");
    }
  }
}

static void print_results(const results *r, const bench_report *rep, bool quick) {
  printf("\nGPU: %s (%d CUDA device%s, %.1f GiB), driver API %d.%d (cuDriverGetVersion %d)\n", r->gpu,
         r->devices, r->devices == 1 ? "" : "s", (double)r->total_bytes / (double)(1u << 30),
         r->driver_version / 1000, (r->driver_version % 1000) / 10, r->driver_version);
  printf("driver library: %s%s\n", cu.path, quick ? "; --quick: few samples" : "");
  for (int i = 0; i < r->nnotes; i++)
    printf("note: %s\n", r->notes[i]);
  if (has_table(rep, "alloc"))
    print_alloc(rep);
  if (has_table(rep, "copies"))
    print_copies(rep);
  print_small(rep);
  print_targets(rep, r->staging_chunk);
  print_small_targets(rep);
}

static void record_run(const results *r, bool quick, bench_report *rep) {
  bench_set_bool(&rep->facts, "quick", quick);
  bench_set_text(&rep->facts, "device", r->gpu);
  bench_set(&rep->facts, "driver_version", r->driver_version);
  bench_set(&rep->facts, "devices", r->devices);
  bench_set(&rep->facts, "total_bytes", (double)r->total_bytes);
  bench_set_text(&rep->facts, "driver_library", cu.path);
  bench_set(&rep->facts, "staging_chunk_bytes", (double)r->staging_chunk);
  bench_set(&rep->facts, "wait_spin_ns", r->wait_spin_ns);
}

/* ------------------------------------------------------------------------ */
/* The run                                                                   */

typedef struct bench {
  bc_plan plan;
  bool quick;
  bool small_only; /* --small: the small-operation table alone */
  um_manager *m;
  um_device *dev; /* unimem's device for CUDA ordinal 0 */
  CUdevice cudev;
  CUcontext ctx;
  CUstream stream;
  bool async_alloc;
  CUmemoryPool pool; /* the driver's default pool, when async_alloc */
  results r;
  bench_report *rep;
} bench;

static void note(results *r, const char *fmt, const char *detail) {
  if (r->nnotes < (int)LEN(r->notes))
    snprintf(r->notes[r->nnotes++], sizeof(r->notes[0]), fmt, detail);
}

static int bench_alloc(bench *b, size_t bytes) {
  alloc_ctx c[3];
  bc_side sides[3];
  for (int k = 0; k < 3; k++) {
    c[k] = (alloc_ctx){.kind = (alloc_kind)k, .m = b->m, .dev = b->dev, .bytes = bytes, .stream = b->stream};
    sides[k] = (bc_side){k < 2 || b->async_alloc ? run_alloc : NULL, &c[k], 0};
  }
  char name[48], size[32];
  bench_row *row;
  if (measure(&b->plan, sides, 3) != 0) {
    fprintf(stderr, "bench_cuda: allocation of %zu bytes failed: %s\n", bytes, um_last_error());
    return 1;
  }
  bench_size_text(size, sizeof(size), bytes);
  snprintf(name, sizeof(name), "alloc+free %s", size);
  row = bench_add_row(b->rep, "alloc", name);
  bench_set(row, "bytes", (double)bytes);
  bench_set(row, "unimem_pool_hit_ns", sides[0].ns);
  bench_set(row, "cumemalloc_free_ns", sides[1].ns);
  bench_set(row, "ratio_cumemalloc", sides[1].ns / sides[0].ns);
  bench_set(row, "cumemallocasync_free_ns", sides[2].ns);
  if (sides[2].ns > 0)
    bench_set(row, "ratio_cumemallocasync", sides[2].ns / sides[0].ns);
  /* Give the pools' blocks back, so that the next sizes have the memory. */
  UM_CHECK(um_pool_trim(b->m, 0));
  if (b->async_alloc && cu.cuMemPoolTrimTo != NULL)
    CU_CHECK(cu.cuMemPoolTrimTo(b->pool, 0));
  return 0;
}

static int add_bw(bench *b, const char *what, const char *memory, size_t bytes, copy_ctx *raw, copy_ctx *um) {
  bc_side sides[2] = {{raw != NULL ? run_copy : NULL, raw, 0}, {run_copy, um, 0}};
  char name[64], size[32];
  bench_row *row;
  if (measure(&b->plan, sides, 2) != 0) {
    fprintf(stderr, "bench_cuda: %s %s copy of %zu bytes failed: %s\n", what, memory, bytes, um_last_error());
    return 1;
  }
  bench_size_text(size, sizeof(size), bytes);
  snprintf(name, sizeof(name), "%s %s %s", what, memory, size);
  row = bench_add_row(b->rep, "copies", name);
  bench_set_text(row, "direction", what);
  bench_set_text(row, "memory", memory);
  bench_set(row, "bytes", (double)bytes);
  bench_set(row, "unimem_ns", sides[1].ns);
  bench_set(row, "raw_ns", sides[0].ns);
  bench_set(row, "unimem_gbps", (double)bytes / sides[1].ns);
  if (sides[0].ns > 0) {
    bench_set(row, "raw_gbps", (double)bytes / sides[0].ns);
    bench_set(row, "unimem_over_raw", sides[0].ns / sides[1].ns);
  }
  return 0;
}

/* The memory of the copies of one size: the raw side's device buffers
 * and cuMemHostAlloc memory, pageable memory (malloc, and page-aligned for
 * the UM_WRAP_PIN wrap), and unimem's device and pinned buffers. */
typedef struct copy_buffers {
  CUdeviceptr dptr, dptr2;
  void *raw_pinned;
  unsigned char *pageable, *wrapped;
  um_buffer *dev, *dev2, *pin, *wrap; /* wrap: NULL when refused */
} copy_buffers;

static int open_copy_buffers(bench *b, size_t bytes, copy_buffers *x) {
  memset(x, 0, sizeof(*x));
  if (cu.cuMemAlloc_v2(&x->dptr, bytes) != 0 || cu.cuMemAlloc_v2(&x->dptr2, bytes) != 0 ||
      cu.cuMemHostAlloc(&x->raw_pinned, bytes, BC_MEMHOSTALLOC_PORTABLE) != 0) {
    fprintf(stderr, "bench_cuda: raw buffers of %zu bytes\n", bytes);
    return 1;
  }
  x->pageable = malloc(bytes);
  x->wrapped = aligned_alloc(4096, (bytes + 4095) & ~(size_t)4095);
  if (x->pageable == NULL || x->wrapped == NULL)
    return 1;
  memset(x->pageable, 0x3C, bytes); /* touched: no page faults in the figures */
  memset(x->wrapped, 0x3C, bytes);
  memset(x->raw_pinned, 0x3C, bytes);
  if (um_alloc(b->m, b->dev, bytes, UM_DEVICE, 0, &x->dev) != UM_OK ||
      um_alloc(b->m, b->dev, bytes, UM_DEVICE, 0, &x->dev2) != UM_OK ||
      um_alloc(b->m, b->dev, bytes, UM_PINNED, 0, &x->pin) != UM_OK) {
    fprintf(stderr, "bench_cuda: unimem buffers of %zu bytes: %s\n", bytes, um_last_error());
    return 1;
  }
  memset(um_buffer_host_ptr(x->pin), 0x3C, bytes);
  if (um_wrap_host(b->m, x->wrapped, bytes, UM_WRAP_PIN, &x->wrap) != UM_OK) {
    char detail[200];
    snprintf(detail, sizeof(detail), "%zu bytes: %s", bytes, um_last_error());
    note(&b->r, "UM_WRAP_PIN refused for %s (raise ulimit -l for the wrap-pin rows)", detail);
    x->wrap = NULL;
  }
  return 0;
}

static void close_copy_buffers(bench *b, copy_buffers *x) {
  um_buffer *bufs[] = {x->wrap, x->pin, x->dev2, x->dev};
  for (size_t i = 0; i < LEN(bufs); i++)
    if (bufs[i] != NULL)
      um_release(bufs[i]);
  um_pool_trim(b->m, 0);
  free(x->wrapped);
  free(x->pageable);
  if (x->raw_pinned != NULL)
    cu.cuMemFreeHost(x->raw_pinned);
  if (x->dptr2 != 0)
    cu.cuMemFree_v2(x->dptr2);
  if (x->dptr != 0)
    cu.cuMemFree_v2(x->dptr);
}

/* The copies of one direction, host to device or back: from pinned memory
 * (the raw side's and unimem's), from pageable memory (the same malloc
 * memory for both), and through a UM_WRAP_PIN wrap (unimem alone). */
static int copies_one_way(bench *b, const copy_buffers *x, size_t bytes, bool to_device) {
  const char *what = to_device ? "h2d" : "d2h";
  copy_ctx raw = {.kind = to_device ? RAW_H2D : RAW_D2H, .bytes = bytes, .dptr = x->dptr, .host = x->raw_pinned};
  copy_ctx um = {.kind = UM_COPY, .bytes = bytes, .dst = to_device ? x->dev : x->pin, .src = to_device ? x->pin : x->dev};
  if (add_bw(b, what, "pinned", bytes, &raw, &um) != 0)
    return 1;
  raw.host = x->pageable;
  um = (copy_ctx){.kind = to_device ? UM_FROM_HOST : UM_TO_HOST, .bytes = bytes, .dst = x->dev, .src = x->dev,
                  .host = x->pageable};
  if (add_bw(b, what, "pageable", bytes, &raw, &um) != 0)
    return 1;
  if (x->wrap == NULL)
    return 0;
  um = (copy_ctx){.kind = UM_COPY, .bytes = bytes, .dst = to_device ? x->dev : x->wrap, .src = to_device ? x->wrap : x->dev};
  return add_bw(b, what, "wrap-pin", bytes, NULL, &um);
}

/* Every copy of one size. */
static int bench_copies(bench *b, size_t bytes) {
  copy_buffers x;
  int bad = open_copy_buffers(b, bytes, &x) != 0 || copies_one_way(b, &x, bytes, true) != 0 ||
            copies_one_way(b, &x, bytes, false) != 0;
  if (!bad) {
    copy_ctx raw = {.kind = RAW_D2D, .bytes = bytes, .dptr = x.dptr, .dptr2 = x.dptr2};
    copy_ctx um = {.kind = UM_COPY, .bytes = bytes, .dst = x.dev2, .src = x.dev};
    bad = add_bw(b, "d2d", "device", bytes, &raw, &um) != 0;
  }
  close_copy_buffers(b, &x);
  return bad;
}

static int open_small_buffers(bench *b, small_buffers *x) {
  size_t total = SMALL_OPS * SMALL_BYTES;
  void *host = NULL;
  memset(x, 0, sizeof(*x));
  x->m = b->m;
  x->stream = b->stream;
  if (cu.cuMemAlloc_v2(&x->dptr, total) != 0 || cu.cuMemHostAlloc(&host, total, BC_MEMHOSTALLOC_PORTABLE) != 0 ||
      cu.cuEventCreate(&x->event, BC_EVENT_DISABLE_TIMING) != 0 ||
      cu.cuEventCreate(&x->sleep_event, BC_EVENT_DISABLE_TIMING | BC_EVENT_BLOCKING_SYNC) != 0) {
    fprintf(stderr, "bench_cuda: raw buffers and event of the small copies\n");
    return 1;
  }
  x->host = host;
  x->ops = calloc(SMALL_OPS, sizeof(*x->ops));
  x->events = calloc(SMALL_OPS, sizeof(*x->events));
  x->um_events = calloc(SMALL_OPS, sizeof(*x->um_events));
  for (size_t k = 0; x->events != NULL && k < SMALL_OPS; k++)
    if (cu.cuEventCreate(&x->events[k], BC_EVENT_DISABLE_TIMING) != 0) {
      fprintf(stderr, "bench_cuda: the events of the small copies\n");
      return 1;
    }
  if (x->ops == NULL || x->events == NULL || x->um_events == NULL || um_alloc(b->m, b->dev, total, UM_DEVICE, 0, &x->dev) != UM_OK ||
      um_alloc(b->m, b->dev, total, UM_PINNED, 0, &x->pin) != UM_OK) {
    fprintf(stderr, "bench_cuda: unimem buffers of the small copies: %s\n", um_last_error());
    return 1;
  }
  memset(x->host, 0x5A, total);
  memset(um_buffer_host_ptr(x->pin), 0x5A, total);
  for (size_t k = 0; k < SMALL_OPS; k++)
    x->ops[k] = (um_copy_op){
        .dst = x->dev, .dst_off = k * SMALL_BYTES, .src = x->pin, .src_off = k * SMALL_BYTES, .bytes = SMALL_BYTES};
  return 0;
}

static void close_small_buffers(small_buffers *x) {
  if (x->pin != NULL)
    um_release(x->pin);
  if (x->dev != NULL)
    um_release(x->dev);
  free(x->ops);
  for (size_t k = 0; x->events != NULL && k < SMALL_OPS && x->events[k] != NULL; k++)
    cu.cuEventDestroy_v2(x->events[k]);
  free(x->events);
  free(x->um_events);
  if (x->event != NULL)
    cu.cuEventDestroy_v2(x->event);
  if (x->sleep_event != NULL)
    cu.cuEventDestroy_v2(x->sleep_event);
  if (x->host != NULL)
    cu.cuMemFreeHost(x->host);
  if (x->dptr != 0)
    cu.cuMemFree_v2(x->dptr);
}

static int small_row(bench *b, const small_buffers *x, const small_case *sc) {
  small_ctx raw = {sc->kind, x, false}, um = {sc->kind, x, true};
  bc_side sides[2] = {{run_small, &raw, 0}, {run_small, &um, 0}};
  bench_row *row;
  if (measure(&b->plan, sides, 2) != 0) {
    fprintf(stderr, "bench_cuda: small copies, %s, failed: %s\n", sc->name, um_last_error());
    return 1;
  }
  row = bench_add_row(b->rep, "small", sc->name);
  bench_set(row, "bytes", SMALL_BYTES);
  bench_set(row, "copies", sc->copies);
  bench_set(row, "unimem_ns", sides[1].ns);
  bench_set(row, "raw_ns", sides[0].ns);
  bench_set(row, "unimem_per_copy_ns", sides[1].ns / sc->copies);
  bench_set(row, "raw_per_copy_ns", sides[0].ns / sc->copies);
  bench_set(row, "ratio", sides[0].ns / sides[1].ns);
  bench_set_text(row, "unimem_calls", sc->unimem_calls);
  bench_set_text(row, "raw_calls", sc->raw_calls);
  return 0;
}

/* Where the time of one copy with an event goes: the issuing calls (until
 * they return) and the wait, each side's median over PHASE_BLOCKS blocks
 * of PHASE_OPS copies, the sides' blocks alternating. Timed apart from the
 * row above, so that its clock reads do not weigh on that figure. */
/* side 0: raw (a plain event), 1: unimem, 2: raw with the blocking-sync
 * event (what recording one costs the issuing thread). */
static int phase_block(const small_buffers *x, int side, double *issue_ns, double *wait_ns) {
  bool unimem = side == 1;
  CUevent ev = side == 2 ? x->sleep_event : x->event;
  double issue = 0, wait = 0;
  for (int i = 0; i < PHASE_OPS; i++) {
    double t0 = bench_now_ns(), t1;
    um_event *done = NULL;
    int bad, st = UM_OK;
    if (unimem)
      bad = um_copy(x->dev, 0, x->pin, 0, SMALL_BYTES, &done) != UM_OK;
    else
      bad = cu.cuMemcpyHtoDAsync_v2(x->dptr, x->host, SMALL_BYTES, x->stream) != 0 ||
            cu.cuEventRecord(ev, x->stream) != 0;
    t1 = bench_now_ns();
    if (bad)
      return 1;
    if (unimem) {
      st = um_event_wait(done);
      st |= um_event_release(done);
    } else {
      st = cu.cuEventSynchronize(ev) != 0;
    }
    wait += bench_now_ns() - t1;
    issue += t1 - t0;
    if (st != 0)
      return 1;
  }
  *issue_ns = issue / PHASE_OPS;
  *wait_ns = wait / PHASE_OPS;
  return 0;
}

static int phase_row(bench *b, const small_buffers *x) {
  double issue[3][PHASE_BLOCKS], wait[3][PHASE_BLOCKS];
  bench_row *row;
  for (int k = 0; k < PHASE_BLOCKS; k++)
    for (int side = 0; side < 3; side++)
      if (phase_block(x, side, &issue[side][k], &wait[side][k]) != 0) {
        fprintf(stderr, "bench_cuda: phases of a copy with an event failed: %s\n", um_last_error());
        return 1;
      }
  row = bench_add_row(b->rep, "phases", "4 KiB h2d + event");
  bench_set(row, "bytes", SMALL_BYTES);
  bench_set(row, "raw_issue_ns", bench_median(issue[0], PHASE_BLOCKS));
  bench_set(row, "raw_wait_ns", bench_median(wait[0], PHASE_BLOCKS));
  bench_set(row, "unimem_issue_ns", bench_median(issue[1], PHASE_BLOCKS));
  bench_set(row, "unimem_wait_ns", bench_median(wait[1], PHASE_BLOCKS));
  bench_set(row, "raw_blocking_issue_ns", bench_median(issue[2], PHASE_BLOCKS));
  bench_set(row, "raw_blocking_wait_ns", bench_median(wait[2], PHASE_BLOCKS));
  return 0;
}

/* The small copies' rows, one case after the other. */
static int bench_small(bench *b) {
  small_buffers x;
  int bad = open_small_buffers(b, &x) != 0;
  for (size_t i = 0; !bad && i < LEN(small_cases); i++)
    if (small_cases[i].kind != SMALL_EVENT_CALLBACK_H2D || cu.cuStreamAddCallback != NULL)
      bad = small_row(b, &x, &small_cases[i]) != 0;
  if (!bad)
    bad = phase_row(b, &x);
  close_small_buffers(&x);
  um_pool_trim(b->m, 0);
  return bad;
}

/* unimem's manager with its CUDA devices, and the device that is CUDA
 * ordinal 0 (the backend lists ordinals in order). */
static int open_unimem(bench *b, char *why, size_t cap) {
  um_options o;
  um_options_init(&o);
  snprintf(o.backends, sizeof(o.backends), "cpu,cuda");
  o.trim_interval_ms = 0;
  if (um_manager_create(&o, &b->m) != UM_OK) {
    fprintf(stderr, "bench_cuda: um_manager_create: %s\n", um_last_error());
    return 1;
  }
  for (int i = 0; i < um_device_count(b->m); i++) {
    um_device_info info;
    um_device_info_get(um_device_get(b->m, i), &info);
    if (strcmp(info.backend, "cuda") == 0) {
      b->dev = um_device_get(b->m, i);
      break;
    }
  }
  if (b->dev == NULL) {
    snprintf(why, cap, "unimem found no CUDA device (is the library built with UNIMEM_ENABLE_CUDA?)");
    return EXIT_NO_GPU;
  }
  b->r.staging_chunk = o.staging_chunk_bytes;
  b->r.wait_spin_ns = o.wait_spin_ns;
  return 0;
}

/* The driver, its first GPU, a context and a stream: 0, EXIT_NO_GPU (the
 * reason printed) or 1. */
static int open_driver(bench *b) {
  char why[600] = "";
  int count = 0, st;
  size_t total = 0;
  if ((st = driver_load(why, sizeof(why))) != 0) {
    printf("bench_cuda: skipped: %s\n", why);
    return st;
  }
  st = cu.cuInit(0);
  if (st == 0)
    st = cu.cuDeviceGetCount(&count);
  if (st == BC_CUDA_ERROR_NO_DEVICE || (st == 0 && count == 0)) {
    printf("bench_cuda: skipped: the driver (%s) reports no GPU\n", cu.path);
    return EXIT_NO_GPU;
  }
  if (st != 0) {
    printf("bench_cuda: skipped: the driver (%s) does not initialise: %s\n", cu.path, cu_error(st));
    return EXIT_NO_GPU;
  }
  b->r.devices = count;
  CU_CHECK(cu.cuDriverGetVersion(&b->r.driver_version));
  CU_CHECK(cu.cuDeviceGet(&b->cudev, 0));
  CU_CHECK(cu.cuDeviceGetName(b->r.gpu, (int)sizeof(b->r.gpu), b->cudev));
  CU_CHECK(cu.cuDeviceTotalMem_v2(&total, b->cudev));
  b->r.total_bytes = total;
  CU_CHECK(cu.cuDevicePrimaryCtxRetain(&b->ctx, b->cudev));
  CU_CHECK(cu.cuCtxSetCurrent(b->ctx));
  CU_CHECK(cu.cuStreamCreate(&b->stream, BC_STREAM_NON_BLOCKING));
  /* The driver's pool at its best: it keeps freed memory for reuse. */
  b->async_alloc = cu.cuMemAllocAsync != NULL && cu.cuMemFreeAsync != NULL &&
                   cu.cuDeviceGetDefaultMemPool != NULL && cu.cuMemPoolSetAttribute != NULL &&
                   cu.cuDeviceGetDefaultMemPool(&b->pool, b->cudev) == 0;
  if (b->async_alloc) {
    uint64_t keep = UINT64_MAX;
    b->async_alloc = cu.cuMemPoolSetAttribute(b->pool, BC_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep) == 0;
  }
  if (!b->async_alloc)
    note(&b->r, "%s", "stream-ordered allocation not available: cuMemAllocAsync column left out");
  if ((st = open_unimem(b, why, sizeof(why))) == EXIT_NO_GPU)
    printf("bench_cuda: skipped: %s\n", why);
  return st;
}

/* The sizes of sizes[0..n) that the GPU holds four times over with room to
 * spare, into out; a note names those left out. Both sides of a copy hold
 * two buffers of the size; the three sides of an allocation one block each
 * (and the driver's pool may keep its own). */
static size_t sizes_that_fit(bench *b, const char *what, const size_t *sizes, size_t n, size_t *out) {
  char left[200] = "", size[32];
  size_t nfit = 0, len = 0;
  for (size_t i = 0; i < n; i++) {
    if (4 * (uint64_t)sizes[i] + 64 * MiB <= b->r.total_bytes) {
      out[nfit++] = sizes[i];
      continue;
    }
    bench_size_text(size, sizeof(size), sizes[i]);
    if (len < sizeof(left))
      len += (size_t)snprintf(left + len, sizeof(left) - len, "%s%s", len ? ", " : "", size);
  }
  if (len > 0) {
    char text[400];
    snprintf(text, sizeof(text), "%s sizes left out (they do not fit the GPU's memory four times over): %s", what,
             left);
    note(&b->r, "%s", text);
  }
  return nfit;
}

static void progress(const char *what, size_t bytes) {
  char size[32];
  bench_size_text(size, sizeof(size), bytes);
  printf("  %s, %s ...\n", what, size);
  fflush(stdout);
}

/* The allocation rows, the copies at each size that fits, then the small
 * copies. */
static int run_sizes(bench *b) {
  static const size_t alloc_full[] = {KiB, 64 * KiB, MiB, 10 * MiB, 100 * MiB, 1024 * MiB};
  static const size_t alloc_quick[] = {MiB, 10 * MiB};
  static const size_t copy_full[] = {MiB, 16 * MiB, 256 * MiB};
  static const size_t copy_quick[] = {MiB, 8 * MiB};
  size_t sizes[LEN(alloc_full)], n;
  _Static_assert(LEN(copy_full) <= LEN(alloc_full), "sizes[] holds either list");
  if (b->small_only)
    goto small;
  n = b->quick ? sizes_that_fit(b, "allocation", alloc_quick, LEN(alloc_quick), sizes)
               : sizes_that_fit(b, "allocation", alloc_full, LEN(alloc_full), sizes);
  for (size_t i = 0; i < n; i++) {
    progress("allocation", sizes[i]);
    if (bench_alloc(b, sizes[i]) != 0)
      return 1;
  }
  n = b->quick ? sizes_that_fit(b, "copy", copy_quick, LEN(copy_quick), sizes)
               : sizes_that_fit(b, "copy", copy_full, LEN(copy_full), sizes);
  for (size_t i = 0; i < n; i++) {
    progress("copies", sizes[i]);
    if (bench_copies(b, sizes[i]) != 0)
      return 1;
  }
small:
  progress("small copies", SMALL_BYTES);
  return bench_small(b);
}

static int run(bench *b) {
  int st = open_driver(b);
  if (st != 0)
    return st;
  if (strncmp(b->r.gpu, "Fake CUDA Device", 16) == 0)
    note(&b->r, "%s", "the test suite's fake driver: copies are host memcpy, the figures say nothing about a GPU");
  printf("bench_cuda: %s, driver %d, %s%s%s\n", b->r.gpu, b->r.driver_version, cu.path, b->quick ? " (--quick)" : "",
         b->small_only ? " (--small: small operations only)" : "");
  record_run(&b->r, b->quick, b->rep);
  bench_set_bool(&b->rep->facts, "small_only", b->small_only);
  if (run_sizes(b) != 0)
    return 1;
  print_results(&b->r, b->rep, b->quick);
  return 0;
}

int um_bench_cuda_main(int argc, char **argv, bench_report *rep) {
  bench b;
  int st;

  memset(&b, 0, sizeof(b));
  b.rep = rep;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--quick") == 0) {
      b.quick = true;
    } else if (strcmp(argv[i], "--small") == 0) {
      b.small_only = true;
    } else {
      fprintf(stderr, "usage: %s [--quick] [--small] [--json FILE]\n", argv[0]);
      return strcmp(argv[i], "--help") == 0 ? 0 : 2;
    }
  }
  b.plan.samples = b.quick ? 3 : 15;
  b.plan.sample_ns = b.quick ? 2e5 : 5e6;

  st = run(&b);
  if (b.m != NULL) {
    int dst = um_manager_destroy(b.m);
    if (dst != UM_OK && st == 0) {
      fprintf(stderr, "bench_cuda: um_manager_destroy: %s\n", um_last_error());
      st = 1;
    }
  }
  if (b.stream != NULL)
    cu.cuStreamDestroy_v2(b.stream);
  if (b.ctx != NULL)
    cu.cuDevicePrimaryCtxRelease_v2(b.cudev);
  return st;
}

#ifndef UM_BENCH_NO_MAIN
int main(int argc, char **argv) { return bench_program_main(argc, argv, "cuda", um_bench_cuda_main); }
#endif
