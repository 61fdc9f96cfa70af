/* unimem on an NVIDIA GPU against the CUDA driver's own calls, in one run:
 *
 *  - allocation: a pool hit (um_alloc + um_release of DEVICE memory)
 *    against cuMemAlloc + cuMemFree, and against cuMemAllocAsync +
 *    cuMemFreeAsync on a stream (with the driver's pool told to keep its
 *    memory, its best case, and a stream synchronisation, so that the
 *    memory is as ready as a pool hit's), at 1, 10 and 100 MiB: the seeds
 *    claim 11x, 44x and 352x over cuMemAlloc;
 *  - host <-> device bandwidth: unimem from its PINNED memory against
 *    cuMemcpyHtoD / cuMemcpyDtoH from cuMemHostAlloc memory (target: at
 *    least 90% of the raw call); unimem from pageable memory (pipelined
 *    through pinned staging chunks above one chunk) against the raw call
 *    from the same pageable memory and against unimem's pinned figure
 *    (target: at least 80% of pinned); and a UM_WRAP_PIN wrap of pageable
 *    memory (registered with the driver);
 *  - device-local copies against cuMemcpyDtoD.
 *
 * Every figure is the median of samples that alternate between the sides,
 * so that every side sees the same machine; a sample of a fast operation
 * repeats it and divides. Bandwidth is bytes moved / time (GB = 1e9 B).
 *
 *   bench_cuda [--quick] [--json FILE]
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
#include <time.h>

#include "bench_util.h"
#include "unimem.h"

#define KiB ((size_t)1024)
#define MiB (1024 * KiB)
#define EXIT_NO_GPU 77

int um_bench_cuda_main(int argc, char **argv);

/* ------------------------------------------------------------------------ */
/* The driver's entry points, by their exported names                         */

typedef int CUresult; /* 0 is CUDA_SUCCESS */
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUmemPoolHandle_st *CUmemoryPool;

enum {
  BC_CUDA_ERROR_NO_DEVICE = 100,
  BC_MEMHOSTALLOC_PORTABLE = 0x01,
  BC_STREAM_NON_BLOCKING = 0x1,
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
  R(cuStreamCreate, (CUstream * stream, unsigned flags))                       \
  R(cuStreamSynchronize, (CUstream stream))                                    \
  R(cuStreamDestroy_v2, (CUstream stream))                                     \
  O(cuGetErrorName, (CUresult error, const char **name))                       \
  O(cuMemAllocAsync, (CUdeviceptr * dptr, size_t bytes, CUstream stream))      \
  O(cuMemFreeAsync, (CUdeviceptr dptr, CUstream stream))                       \
  O(cuDeviceGetDefaultMemPool, (CUmemoryPool * pool, CUdevice device))         \
  O(cuMemPoolSetAttribute, (CUmemoryPool pool, int attr, void *value))         \
  O(cuMemPoolTrimTo, (CUmemoryPool pool, size_t keep))

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

typedef struct alloc_ctx {
  um_manager *m;
  um_device *dev;
  size_t bytes;
  CUstream stream;
} alloc_ctx;

static int run_pool_hit(void *p, int iters) {
  alloc_ctx *c = p;
  for (int i = 0; i < iters; i++) {
    um_buffer *b;
    if (um_alloc(c->m, c->dev, c->bytes, UM_DEVICE, 0, &b) != UM_OK || um_release(b) != UM_OK)
      return 1;
  }
  return 0;
}

static int run_cumemalloc(void *p, int iters) {
  alloc_ctx *c = p;
  for (int i = 0; i < iters; i++) {
    CUdeviceptr d;
    if (cu.cuMemAlloc_v2(&d, c->bytes) != 0 || cu.cuMemFree_v2(d) != 0)
      return 1;
  }
  return 0;
}

static int run_cumemallocasync(void *p, int iters) {
  alloc_ctx *c = p;
  for (int i = 0; i < iters; i++) {
    CUdeviceptr d;
    if (cu.cuMemAllocAsync(&d, c->bytes, c->stream) != 0 || cu.cuMemFreeAsync(d, c->stream) != 0 ||
        cu.cuStreamSynchronize(c->stream) != 0)
      return 1;
  }
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
/* Results                                                                   */

typedef struct alloc_row {
  size_t bytes;
  double pool_ns, cumemalloc_ns, async_ns;
} alloc_row;

typedef struct bw_row {
  const char *what;  /* "h2d", "d2h", "d2d" */
  const char *memory; /* "pinned", "pageable", "wrap-pin", "device" */
  size_t bytes;
  double raw_ns, um_ns;
} bw_row;

#define MAX_ROWS 64

typedef struct results {
  char gpu[256];
  int driver_version;
  int devices;
  uint64_t total_bytes;
  size_t staging_chunk;
  alloc_row alloc[8];
  int nalloc;
  bw_row bw[MAX_ROWS];
  int nbw;
  char notes[4][512];
  int nnotes;
} results;

static double gbps(size_t bytes, double ns) { return ns > 0 ? (double)bytes / ns : 0; }

static void size_text(size_t bytes, char *out, size_t cap) {
  if (bytes % MiB == 0)
    snprintf(out, cap, "%zu MiB", bytes / MiB);
  else
    snprintf(out, cap, "%zu KiB", bytes / KiB);
}

/* The row of (what, memory, bytes), or NULL. */
static const bw_row *find_bw(const results *r, const char *what, const char *memory, size_t bytes) {
  for (int i = 0; i < r->nbw; i++)
    if (!strcmp(r->bw[i].what, what) && !strcmp(r->bw[i].memory, memory) && r->bw[i].bytes == bytes)
      return &r->bw[i];
  return NULL;
}

static void print_results(const results *r, bool quick) {
  static const double seeds_claim[] = {11, 44, 352};
  char size[32];
  printf("\nGPU: %s (%d CUDA device%s, %.1f GiB), driver API %d.%d (cuDriverGetVersion %d)\n", r->gpu,
         r->devices, r->devices == 1 ? "" : "s", (double)r->total_bytes / (double)(1u << 30),
         r->driver_version / 1000, (r->driver_version % 1000) / 10, r->driver_version);
  printf("driver library: %s%s\n", cu.path, quick ? "; --quick: few samples" : "");
  for (int i = 0; i < r->nnotes; i++)
    printf("note: %s\n", r->notes[i]);

  printf("\nAllocate + free DEVICE memory, median ns per pair\n");
  printf("%-9s %14s %16s %8s %22s %8s %12s\n", "size", "unimem pool", "cuMemAlloc+Free", "ratio",
         "cuMemAllocAsync+Free", "ratio", "seeds claim");
  for (int i = 0; i < r->nalloc; i++) {
    const alloc_row *a = &r->alloc[i];
    size_text(a->bytes, size, sizeof(size));
    printf("%-9s %14.0f %16.0f %7.1fx", size, a->pool_ns, a->cumemalloc_ns, a->cumemalloc_ns / a->pool_ns);
    if (a->async_ns > 0)
      printf(" %22.0f %7.1fx", a->async_ns, a->async_ns / a->pool_ns);
    else
      printf(" %22s %8s", "n/a", "");
    if (a->bytes == MiB || a->bytes == 10 * MiB || a->bytes == 100 * MiB)
      printf(" %11.0fx", seeds_claim[a->bytes == MiB ? 0 : a->bytes == 10 * MiB ? 1 : 2]);
    printf("\n");
  }

  printf("\nCopies, GB/s (median); raw = the driver's own blocking call on the same memory kind\n");
  printf("%-5s %-9s %-9s %10s %12s %11s\n", "dir", "memory", "size", "raw GB/s", "unimem GB/s",
         "unimem/raw");
  for (int i = 0; i < r->nbw; i++) {
    const bw_row *b = &r->bw[i];
    size_text(b->bytes, size, sizeof(size));
    printf("%-5s %-9s %-9s ", b->what, b->memory, size);
    if (b->raw_ns > 0)
      printf("%10.2f ", gbps(b->bytes, b->raw_ns));
    else
      printf("%10s ", "-");
    printf("%12.2f ", gbps(b->bytes, b->um_ns));
    if (b->raw_ns > 0)
      printf("%10.0f%%", 100.0 * b->raw_ns / b->um_ns);
    printf("\n");
  }

  printf("\nTargets (at each size):\n");
  for (int i = 0; i < r->nbw; i++) {
    const bw_row *b = &r->bw[i], *pinned;
    if (!strcmp(b->memory, "pinned") && b->raw_ns > 0) {
      size_text(b->bytes, size, sizeof(size));
      printf("  %s %-8s pinned   unimem %5.1f%% of cuMemcpy%s (target >= 90%%): %s\n", b->what, size,
             100.0 * b->raw_ns / b->um_ns, !strcmp(b->what, "h2d") ? "HtoD" : "DtoH",
             b->raw_ns / b->um_ns >= 0.90 ? "met" : "MISSED");
    }
    if (!strcmp(b->memory, "pageable") && (pinned = find_bw(r, b->what, "pinned", b->bytes)) != NULL) {
      size_text(b->bytes, size, sizeof(size));
      printf("  %s %-8s pageable unimem %5.1f%% of unimem pinned%s (target >= 80%%): %s\n", b->what, size,
             100.0 * pinned->um_ns / b->um_ns, b->bytes > r->staging_chunk ? ", staged" : ", one call",
             pinned->um_ns / b->um_ns >= 0.80 ? "met" : "MISSED");
    }
  }
}

static int write_json(const results *r, const char *path, bool quick) {
  FILE *f = fopen(path, "w");
  if (f == NULL) {
    perror(path);
    return 1;
  }
  fprintf(f, "{\n  \"benchmark\": \"cuda\",\n  \"quick\": %s,\n", quick ? "true" : "false");
  fprintf(f, "  \"gpu\": \"");
  for (const char *c = r->gpu; *c; c++)
    fprintf(f, *c == '"' || *c == '\\' ? "\\%c" : "%c", *c);
  fprintf(f, "\",\n  \"driver_version\": %d,\n  \"devices\": %d,\n  \"total_bytes\": %llu,\n", r->driver_version,
          r->devices, (unsigned long long)r->total_bytes);
  fprintf(f, "  \"driver_library\": \"%s\",\n  \"staging_chunk_bytes\": %zu,\n", cu.path, r->staging_chunk);
  fprintf(f, "  \"alloc\": [\n");
  for (int i = 0; i < r->nalloc; i++) {
    const alloc_row *a = &r->alloc[i];
    fprintf(f,
            "    {\"bytes\": %zu, \"unimem_pool_hit_ns\": %.1f, \"cumemalloc_free_ns\": %.1f, "
            "\"ratio_cumemalloc\": %.2f",
            a->bytes, a->pool_ns, a->cumemalloc_ns, a->cumemalloc_ns / a->pool_ns);
    if (a->async_ns > 0)
      fprintf(f, ", \"cumemallocasync_free_ns\": %.1f, \"ratio_cumemallocasync\": %.2f", a->async_ns,
              a->async_ns / a->pool_ns);
    fprintf(f, "}%s\n", i + 1 < r->nalloc ? "," : "");
  }
  fprintf(f, "  ],\n  \"copies\": [\n");
  for (int i = 0; i < r->nbw; i++) {
    const bw_row *b = &r->bw[i];
    fprintf(f, "    {\"direction\": \"%s\", \"memory\": \"%s\", \"bytes\": %zu, \"unimem_gbps\": %.3f", b->what,
            b->memory, b->bytes, gbps(b->bytes, b->um_ns));
    if (b->raw_ns > 0)
      fprintf(f, ", \"raw_gbps\": %.3f, \"unimem_over_raw\": %.3f", gbps(b->bytes, b->raw_ns), b->raw_ns / b->um_ns);
    fprintf(f, "}%s\n", i + 1 < r->nbw ? "," : "");
  }
  fprintf(f, "  ]\n}\n");
  if (fclose(f) != 0) {
    perror(path);
    return 1;
  }
  return 0;
}

/* ------------------------------------------------------------------------ */
/* The run                                                                   */

typedef struct bench {
  bc_plan plan;
  bool quick;
  um_manager *m;
  um_device *dev; /* unimem's device for CUDA ordinal 0 */
  CUdevice cudev;
  CUcontext ctx;
  CUstream stream;
  bool async_alloc;
  results r;
} bench;

static void note(results *r, const char *fmt, const char *detail) {
  if (r->nnotes < 4)
    snprintf(r->notes[r->nnotes++], sizeof(r->notes[0]), fmt, detail);
}

static int bench_alloc(bench *b, size_t bytes) {
  alloc_ctx c = {.m = b->m, .dev = b->dev, .bytes = bytes, .stream = b->stream};
  bc_side sides[3] = {
      {run_pool_hit, &c, 0},
      {run_cumemalloc, &c, 0},
      {b->async_alloc ? run_cumemallocasync : NULL, &c, 0},
  };
  alloc_row *row = &b->r.alloc[b->r.nalloc];
  if (measure(&b->plan, sides, 3) != 0) {
    fprintf(stderr, "bench_cuda: allocation of %zu bytes failed: %s\n", bytes, um_last_error());
    return 1;
  }
  row->bytes = bytes;
  row->pool_ns = sides[0].ns;
  row->cumemalloc_ns = sides[1].ns;
  row->async_ns = sides[2].ns;
  b->r.nalloc++;
  /* Give the pool's block back, so that the next sizes have the memory. */
  UM_CHECK(um_pool_trim(b->m, 0));
  return 0;
}

static int add_bw(bench *b, const char *what, const char *memory, size_t bytes, copy_ctx *raw, copy_ctx *um) {
  bc_side sides[2] = {{raw != NULL ? run_copy : NULL, raw, 0}, {run_copy, um, 0}};
  bw_row *row;
  if (b->r.nbw == MAX_ROWS)
    return 0;
  if (measure(&b->plan, sides, 2) != 0) {
    fprintf(stderr, "bench_cuda: %s %s copy of %zu bytes failed: %s\n", what, memory, bytes, um_last_error());
    return 1;
  }
  row = &b->r.bw[b->r.nbw++];
  row->what = what;
  row->memory = memory;
  row->bytes = bytes;
  row->raw_ns = sides[0].ns;
  row->um_ns = sides[1].ns;
  return 0;
}

/* Every copy of one size. */
static int bench_copies(bench *b, size_t bytes) {
  CUdeviceptr dptr = 0, dptr2 = 0;
  void *raw_pinned = NULL;
  unsigned char *pageable = NULL, *wrapped = NULL;
  um_buffer *dev = NULL, *dev2 = NULL, *pin = NULL, *wrap = NULL;
  int bad = 1;
  copy_ctx raw, um;

  if (cu.cuMemAlloc_v2(&dptr, bytes) != 0 || cu.cuMemAlloc_v2(&dptr2, bytes) != 0 ||
      cu.cuMemHostAlloc(&raw_pinned, bytes, BC_MEMHOSTALLOC_PORTABLE) != 0) {
    fprintf(stderr, "bench_cuda: raw buffers of %zu bytes\n", bytes);
    goto out;
  }
  pageable = malloc(bytes);
  wrapped = aligned_alloc(4096, (bytes + 4095) & ~(size_t)4095);
  if (pageable == NULL || wrapped == NULL)
    goto out;
  memset(pageable, 0x3C, bytes); /* touched: no page faults in the figures */
  memset(wrapped, 0x3C, bytes);
  memset(raw_pinned, 0x3C, bytes);
  if (um_alloc(b->m, b->dev, bytes, UM_DEVICE, 0, &dev) != UM_OK ||
      um_alloc(b->m, b->dev, bytes, UM_DEVICE, 0, &dev2) != UM_OK ||
      um_alloc(b->m, b->dev, bytes, UM_PINNED, 0, &pin) != UM_OK) {
    fprintf(stderr, "bench_cuda: unimem buffers of %zu bytes: %s\n", bytes, um_last_error());
    goto out;
  }
  memset(um_buffer_host_ptr(pin), 0x3C, bytes);
  if (um_wrap_host(b->m, wrapped, bytes, UM_WRAP_PIN, &wrap) != UM_OK) {
    char detail[200];
    snprintf(detail, sizeof(detail), "%zu bytes: %s", bytes, um_last_error());
    note(&b->r, "UM_WRAP_PIN refused for %s (raise ulimit -l for the wrap-pin rows)", detail);
    wrap = NULL;
  }

  /* host -> device */
  raw = (copy_ctx){.kind = RAW_H2D, .bytes = bytes, .dptr = dptr, .host = raw_pinned};
  um = (copy_ctx){.kind = UM_COPY, .bytes = bytes, .dst = dev, .src = pin};
  if (add_bw(b, "h2d", "pinned", bytes, &raw, &um) != 0)
    goto out;
  raw.host = pageable;
  um = (copy_ctx){.kind = UM_FROM_HOST, .bytes = bytes, .dst = dev, .host = pageable};
  if (add_bw(b, "h2d", "pageable", bytes, &raw, &um) != 0)
    goto out;
  if (wrap != NULL) {
    um = (copy_ctx){.kind = UM_COPY, .bytes = bytes, .dst = dev, .src = wrap};
    if (add_bw(b, "h2d", "wrap-pin", bytes, NULL, &um) != 0)
      goto out;
  }
  /* device -> host */
  raw = (copy_ctx){.kind = RAW_D2H, .bytes = bytes, .dptr = dptr, .host = raw_pinned};
  um = (copy_ctx){.kind = UM_COPY, .bytes = bytes, .dst = pin, .src = dev};
  if (add_bw(b, "d2h", "pinned", bytes, &raw, &um) != 0)
    goto out;
  raw.host = pageable;
  um = (copy_ctx){.kind = UM_TO_HOST, .bytes = bytes, .src = dev, .host = pageable};
  if (add_bw(b, "d2h", "pageable", bytes, &raw, &um) != 0)
    goto out;
  if (wrap != NULL) {
    um = (copy_ctx){.kind = UM_COPY, .bytes = bytes, .dst = wrap, .src = dev};
    if (add_bw(b, "d2h", "wrap-pin", bytes, NULL, &um) != 0)
      goto out;
  }
  /* on the device */
  raw = (copy_ctx){.kind = RAW_D2D, .bytes = bytes, .dptr = dptr, .dptr2 = dptr2};
  um = (copy_ctx){.kind = UM_COPY, .bytes = bytes, .dst = dev2, .src = dev};
  if (add_bw(b, "d2d", "device", bytes, &raw, &um) != 0)
    goto out;
  bad = 0;

out:
  if (wrap != NULL)
    um_release(wrap);
  if (pin != NULL)
    um_release(pin);
  if (dev2 != NULL)
    um_release(dev2);
  if (dev != NULL)
    um_release(dev);
  um_pool_trim(b->m, 0);
  free(wrapped);
  free(pageable);
  if (raw_pinned != NULL)
    cu.cuMemFreeHost(raw_pinned);
  if (dptr2 != 0)
    cu.cuMemFree_v2(dptr2);
  if (dptr != 0)
    cu.cuMemFree_v2(dptr);
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
  return 0;
}

static int run(bench *b, const char *json) {
  static const size_t alloc_full[] = {MiB, 10 * MiB, 100 * MiB};
  static const size_t alloc_quick[] = {MiB, 10 * MiB};
  static const size_t copy_full[] = {MiB, 16 * MiB, 256 * MiB};
  static const size_t copy_quick[] = {MiB, 8 * MiB};
  const size_t *alloc_sizes = b->quick ? alloc_quick : alloc_full;
  const size_t *copy_sizes = b->quick ? copy_quick : copy_full;
  size_t nalloc = b->quick ? 2 : 3, ncopy = b->quick ? 2 : 3;
  char why[600] = "";
  int count = 0, st;
  size_t total = 0;
  CUmemoryPool pool;

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
                   cu.cuDeviceGetDefaultMemPool(&pool, b->cudev) == 0;
  if (b->async_alloc) {
    uint64_t keep = UINT64_MAX;
    b->async_alloc = cu.cuMemPoolSetAttribute(pool, BC_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep) == 0;
  }
  if (!b->async_alloc)
    note(&b->r, "%s", "stream-ordered allocation not available: cuMemAllocAsync column left out");

  if ((st = open_unimem(b, why, sizeof(why))) != 0) {
    if (st == EXIT_NO_GPU)
      printf("bench_cuda: skipped: %s\n", why);
    return st;
  }
  if (strncmp(b->r.gpu, "Fake CUDA Device", 16) == 0)
    note(&b->r, "%s", "the test suite's fake driver: copies are host memcpy, the figures say nothing about a GPU");
  printf("bench_cuda: %s, driver %d, %s%s\n", b->r.gpu, b->r.driver_version, cu.path,
         b->quick ? " (--quick)" : "");

  for (size_t i = 0; i < nalloc; i++) {
    printf("  allocation, %zu MiB ...\n", alloc_sizes[i] / MiB);
    fflush(stdout);
    if (bench_alloc(b, alloc_sizes[i]) != 0)
      return 1;
  }
  /* The driver's pool gives its cached memory back before the copies. */
  if (b->async_alloc && cu.cuMemPoolTrimTo != NULL)
    CU_CHECK(cu.cuMemPoolTrimTo(pool, 0));
  for (size_t i = 0; i < ncopy; i++) {
    /* Both sides hold two device buffers of the size. */
    if (4 * copy_sizes[i] + 64 * MiB > total) {
      note(&b->r, "%s", "copy sizes that do not fit the GPU's memory four times over left out");
      continue;
    }
    printf("  copies, %zu MiB ...\n", copy_sizes[i] / MiB);
    fflush(stdout);
    if (bench_copies(b, copy_sizes[i]) != 0)
      return 1;
  }
  print_results(&b->r, b->quick);
  if (json != NULL && write_json(&b->r, json, b->quick) != 0)
    return 1;
  if (json != NULL)
    printf("\nJSON written to %s\n", json);
  return 0;
}

int um_bench_cuda_main(int argc, char **argv) {
  bench b;
  const char *json = NULL;
  int st;

  memset(&b, 0, sizeof(b));
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--quick") == 0) {
      b.quick = true;
    } else if (strcmp(argv[i], "--json") == 0 && i + 1 < argc) {
      json = argv[++i];
    } else {
      fprintf(stderr, "usage: %s [--quick] [--json FILE]\n", argv[0]);
      return strcmp(argv[i], "--help") == 0 ? 0 : 2;
    }
  }
  b.plan.samples = b.quick ? 3 : 15;
  b.plan.sample_ns = b.quick ? 2e5 : 5e6;

  st = run(&b, json);
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
int main(int argc, char **argv) { return um_bench_cuda_main(argc, argv); }
#endif
