/* The caller's loop: allocate two buffers, copy the input in, run one
 * kernel of the caller's own, copy the result out, check it, release the
 * buffers; again and again, at a size that changes every iteration. Raw
 * OpenCL against unimem, pooled and unpooled, in one run, on the first
 * OpenCL device, in unimem's context, every side's commands on the
 * device's caller queue (um_device_native_get's cl_queue).
 *
 * The kernel: out[i] = 2 * in[i] + 1 over uint elements (each buffer's
 * offset inside its cl_mem, in elements, is a kernel argument). One
 * iteration of each side:
 *  - raw: clCreateBuffer in and out; clEnqueueWriteBuffer of in from a host
 *    array (non-blocking, no event); the kernel (no event); a blocking
 *    clEnqueueReadBuffer of out; the check; clReleaseMemObject of both.
 *  - unimem_pooled: um_alloc in and out (UM_DEVICE); um_copy_from_host into
 *    in with an event, released at once; um_access_begin of in (UM_MAP_READ)
 *    and of out (UM_MAP_WRITE_DISCARD); the kernel, waiting for the
 *    brackets' events, then clFlush (docs/guide.md: unimem's own queue
 *    waits for the kernel's event); um_access_end of both with the kernel's
 *    event; a blocking um_copy_to_host of out; the check; um_release of both.
 *  - unimem_unpooled: the same with UM_ALLOC_UNPOOLED.
 *  - pool_raw: um_alloc in and out (pooled); their cl_mem and offset from
 *    um_buffer_native_get; the raw side's calls on them; um_release of both.
 * The check reads every element on the host. A side is one function and
 * one line of the table `sides`.
 *
 * Two rows, two size ranges: 1-64 KiB and 4 KiB-4 MiB. Iteration i has the
 * size s_i of one seeded pseudo-random sequence, log-uniform in the range
 * and rounded down to a multiple of 4 bytes, the same for every side and
 * repetition; the host arrays are allocated once, at the largest size.
 * Before timing, each side runs a few iterations (which warms the pool)
 * with the whole output poisoned beforehand. A repetition runs the whole
 * sequence once per side, the sides taking turns, and turns at going
 * first. Figures: the median over the repetitions of the time per
 * iteration; "spread", its interquartile range; ratio = side / raw
 * (medians); pooling gain = unimem_unpooled / unimem_pooled. Targets:
 * unimem_pooled at most 1.0x raw at 1-64 KiB and 0.6x at 4 KiB-4 MiB,
 * unimem_unpooled at most 1.1x raw, a pooling gain of at least 5x at
 * 1-64 KiB; a figure that misses its target but meets it once each median
 * is moved by its spread in the target's favour is "noise". One more pass
 * per side times the phases of its iterations: where the time goes.
 *
 *   bench_loop [--quick] [--iters N] [--reps N] [--json FILE]
 *
 * Defaults: 1000 iterations per repetition, 11 repetitions (--quick: 100
 * and 3). The raw side loads libOpenCL.so.1 itself (bench_cl.h). Exit
 * status: 0 measured, 77 no OpenCL device, 1 a failure (an error or a
 * wrong result), 2 bad usage. Built as the `unimem bench loop` subcommand
 * with -DUM_BENCH_NO_MAIN (entry point um_bench_loop_main). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_cl.h"
#include "bench_util.h"
#include "report.h"
#include "unimem.h"

#define KiB ((size_t)1024)
#define MiB (1024 * KiB)
#define MAX_REPS 201
#define WARM_ITERS 16 /* per side, before timing */
#define SEED UINT64_C(0x5eed0f100b)

int um_bench_loop_main(int argc, char **argv, bench_report *rep);

typedef struct bl_config {
  int quick, iters, reps;
} bl_config;

#ifdef BENCH_HAVE_CL
/* ------------------------------------------------------------------------ */
/* The iteration's pieces                                                    */

BENCH_CL_TABLE(cl, BENCH_CL_KERNEL_CALLS)
BENCH_CL_LOADER(load_opencl, cl, BENCH_CL_KERNEL_CALLS)

/* in_first, out_first: the buffers' offsets inside their cl_mem, in
 * elements. */
static const char *kernel_source =
    "__kernel void twice_plus_one(__global const uint *in, ulong in_first, __global uint *out, ulong out_first) {\n"
    "  size_t i = get_global_id(0);\n"
    "  out[out_first + i] = 2u * in[in_first + i] + 1u;\n"
    "}\n";

/* Where an iteration's time goes, in the order of the calls. */
enum { PH_ALLOC, PH_TO_DEVICE, PH_KERNEL, PH_TO_HOST, PH_CHECK, PH_RELEASE, NPHASES };
static const char *const phase_names[NPHASES] = {"allocate", "to device", "kernel", "to host", "check", "release"};

typedef struct bl_side bl_side;

/* What one side's iterations work with. */
typedef struct bl_loop {
  const bl_side *side;
  um_manager *m;
  um_device *d;
  cl_context context;
  cl_command_queue queue; /* the device's caller queue: every command */
  cl_kernel kernel;       /* this side's own kernel object */
  const cl_uint *in;      /* the host arrays, of the largest size */
  cl_uint *out;
  double *phase_ns; /* NULL, or the sums per phase (phase_end) */
  double phase_t;   /* when the last phase ended */
} bl_loop;

/* One iteration of bytes: 0, or 1 with a message. It calls phase_end as
 * each phase ends. */
typedef int (*bl_iteration_fn)(bl_loop *l, size_t bytes);

struct bl_side {
  const char *name;
  bl_iteration_fn run;
  const char *what; /* the table's explanation */
};

static void phase_end(bl_loop *l, int phase) {
  if (l->phase_ns != NULL) {
    double t = bench_now_ns();
    l->phase_ns[phase] += t - l->phase_t;
    l->phase_t = t;
  }
}

static int cl_failed(const bl_loop *l, const char *call, cl_int err) {
  fprintf(stderr, "bench loop: %s: %s failed (OpenCL error %d)\n", l->side->name, call, (int)err);
  return 1;
}

static int um_failed(const bl_loop *l, const char *call, int st) {
  fprintf(stderr, "bench loop: %s: %s: %s (%s)\n", l->side->name, call, um_err_name(st), um_last_error());
  return 1;
}

/* Every element of the output against the input: 0, or 1 with a message. */
static int check_out(bl_loop *l, size_t bytes) {
  size_t n = bytes / sizeof(cl_uint);
  cl_uint wrong = 0;
  for (size_t i = 0; i < n; i++)
    wrong |= l->out[i] ^ (2u * l->in[i] + 1u);
  for (size_t i = 0; i < n && wrong != 0; i++)
    if (l->out[i] != 2u * l->in[i] + 1u) {
      fprintf(stderr, "bench loop: %s: %zu bytes: element %zu is %u, expected %u\n", l->side->name, bytes, i,
              (unsigned)l->out[i], 2u * (unsigned)l->in[i] + 1u);
      return 1;
    }
  phase_end(l, PH_CHECK);
  return 0;
}

/* The kernel over bytes of in into out (cl_mem and byte offset each) on
 * the caller queue, after the nwait events of wait; its event in *done
 * unless done is NULL. */
static cl_int enqueue_kernel(const bl_loop *l, cl_mem in, size_t in_off, cl_mem out, size_t out_off, size_t bytes,
                             cl_uint nwait, const cl_event *wait, cl_event *done) {
  cl_ulong first[2] = {in_off / sizeof(cl_uint), out_off / sizeof(cl_uint)};
  size_t global = bytes / sizeof(cl_uint);
  cl_int err = cl.clSetKernelArg(l->kernel, 0, sizeof(in), &in);
  if (err == CL_SUCCESS)
    err = cl.clSetKernelArg(l->kernel, 1, sizeof(first[0]), &first[0]);
  if (err == CL_SUCCESS)
    err = cl.clSetKernelArg(l->kernel, 2, sizeof(out), &out);
  if (err == CL_SUCCESS)
    err = cl.clSetKernelArg(l->kernel, 3, sizeof(first[1]), &first[1]);
  if (err == CL_SUCCESS)
    err = cl.clEnqueueNDRangeKernel(l->queue, l->kernel, 1, NULL, &global, NULL, nwait, nwait ? wait : NULL, done);
  return err;
}

/* The raw calls on in and out: the write, the kernel, the blocking read,
 * the check. 0, or 1 with a message. */
static int raw_calls(bl_loop *l, cl_mem in, size_t in_off, cl_mem out, size_t out_off, size_t bytes) {
  cl_int err = cl.clEnqueueWriteBuffer(l->queue, in, CL_FALSE, in_off, bytes, l->in, 0, NULL, NULL);
  if (err != CL_SUCCESS)
    return cl_failed(l, "clEnqueueWriteBuffer", err);
  phase_end(l, PH_TO_DEVICE);
  if ((err = enqueue_kernel(l, in, in_off, out, out_off, bytes, 0, NULL, NULL)) != CL_SUCCESS)
    return cl_failed(l, "the kernel", err);
  phase_end(l, PH_KERNEL);
  err = cl.clEnqueueReadBuffer(l->queue, out, CL_TRUE, out_off, bytes, l->out, 0, NULL, NULL);
  if (err != CL_SUCCESS)
    return cl_failed(l, "clEnqueueReadBuffer", err);
  phase_end(l, PH_TO_HOST);
  return check_out(l, bytes);
}

/* um_alloc of in and out (b[0], b[1]) with flags: 0, or 1 with a message
 * (b[] holds what was allocated). */
static int alloc_pair(bl_loop *l, size_t bytes, unsigned flags, um_buffer *b[2]) {
  int st = um_alloc(l->m, l->d, bytes, UM_DEVICE, flags, &b[0]);
  if (st == UM_OK)
    st = um_alloc(l->m, l->d, bytes, UM_DEVICE, flags, &b[1]);
  phase_end(l, PH_ALLOC);
  return st == UM_OK ? 0 : um_failed(l, "um_alloc", st);
}

/* um_release of what b[] holds: 0, or 1 with a message. */
static int release_pair(bl_loop *l, um_buffer *b[2]) {
  int st = UM_OK;
  for (int i = 0; i < 2; i++)
    if (b[i] != NULL) {
      int released = um_release(b[i]);
      st = st != UM_OK ? st : released;
    }
  phase_end(l, PH_RELEASE);
  return st == UM_OK ? 0 : um_failed(l, "um_release", st);
}

/* The kernel from b[0] into b[1] inside both buffers' brackets. 0, or 1
 * with a message. */
static int bracketed_kernel(bl_loop *l, um_buffer *b[2], size_t bytes) {
  um_buffer_native nat[2];
  void *wait_native[2] = {NULL, NULL};
  cl_event wait[2], done = NULL;
  cl_uint nwait = 0;
  cl_int err;
  int st = um_buffer_native_get(b[0], &nat[0]), ended[2];
  if (st == UM_OK)
    st = um_buffer_native_get(b[1], &nat[1]);
  if (st != UM_OK)
    return um_failed(l, "um_buffer_native_get", st);
  if ((st = um_access_begin(b[0], UM_MAP_READ, &wait_native[0])) != UM_OK)
    return um_failed(l, "um_access_begin", st);
  if ((st = um_access_begin(b[1], UM_MAP_WRITE_DISCARD, &wait_native[1])) != UM_OK) {
    um_access_end(b[0], NULL);
    return um_failed(l, "um_access_begin", st);
  }
  for (int i = 0; i < 2; i++)
    if (wait_native[i] != NULL)
      wait[nwait++] = (cl_event)wait_native[i];
  err = enqueue_kernel(l, (cl_mem)nat[0].cl_mem, nat[0].offset, (cl_mem)nat[1].cl_mem, nat[1].offset, bytes, nwait,
                       wait, &done);
  if (err == CL_SUCCESS)
    err = cl.clFlush(l->queue);
  ended[0] = um_access_end(b[0], done);
  ended[1] = um_access_end(b[1], done);
  if (done != NULL)
    cl.clReleaseEvent(done);
  phase_end(l, PH_KERNEL);
  if (err != CL_SUCCESS)
    return cl_failed(l, "the kernel", err);
  st = ended[0] != UM_OK ? ended[0] : ended[1];
  return st == UM_OK ? 0 : um_failed(l, "um_access_end", st);
}

/* ------------------------------------------------------------------------ */
/* The sides                                                                 */

static int raw_iteration(bl_loop *l, size_t bytes) {
  cl_int err[2] = {CL_SUCCESS, CL_SUCCESS};
  cl_mem in = cl.clCreateBuffer(l->context, CL_MEM_READ_WRITE, bytes, NULL, &err[0]);
  cl_mem out = cl.clCreateBuffer(l->context, CL_MEM_READ_WRITE, bytes, NULL, &err[1]);
  int bad;
  phase_end(l, PH_ALLOC);
  if (in == NULL || out == NULL)
    bad = cl_failed(l, "clCreateBuffer", err[in != NULL]);
  else
    bad = raw_calls(l, in, 0, out, 0, bytes);
  if (in != NULL)
    cl.clReleaseMemObject(in);
  if (out != NULL)
    cl.clReleaseMemObject(out);
  phase_end(l, PH_RELEASE);
  return bad;
}

static int unimem_iteration(bl_loop *l, size_t bytes, unsigned flags) {
  um_buffer *b[2] = {NULL, NULL};
  um_event *copied = NULL;
  int bad = alloc_pair(l, bytes, flags, b), st;
  if (!bad && (st = um_copy_from_host(b[0], 0, l->in, bytes, &copied)) != UM_OK)
    bad = um_failed(l, "um_copy_from_host", st);
  if (copied != NULL)
    um_event_release(copied);
  phase_end(l, PH_TO_DEVICE);
  bad = bad || bracketed_kernel(l, b, bytes);
  if (!bad && (st = um_copy_to_host(b[1], 0, l->out, bytes, NULL)) != UM_OK)
    bad = um_failed(l, "um_copy_to_host", st);
  phase_end(l, PH_TO_HOST);
  bad = bad || check_out(l, bytes);
  return release_pair(l, b) || bad;
}

static int pooled_iteration(bl_loop *l, size_t bytes) { return unimem_iteration(l, bytes, 0); }

static int unpooled_iteration(bl_loop *l, size_t bytes) { return unimem_iteration(l, bytes, UM_ALLOC_UNPOOLED); }

static int pool_raw_iteration(bl_loop *l, size_t bytes) {
  um_buffer *b[2] = {NULL, NULL};
  um_buffer_native nat[2];
  int bad = alloc_pair(l, bytes, 0, b), st = UM_OK;
  for (int i = 0; i < 2 && !bad; i++)
    if ((st = um_buffer_native_get(b[i], &nat[i])) != UM_OK)
      bad = um_failed(l, "um_buffer_native_get", st);
  phase_end(l, PH_ALLOC);
  bad = bad || raw_calls(l, (cl_mem)nat[0].cl_mem, nat[0].offset, (cl_mem)nat[1].cl_mem, nat[1].offset, bytes);
  return release_pair(l, b) || bad;
}

/* The loop on the caller's queue (um_queue_use): the brackets hand out no
 * wait handle (the upload is queued there already), the kernel takes no
 * wait list and gives no event, the brackets end with NULL behind it, and
 * the download is queued behind them. */
static int queue_iteration(bl_loop *l, size_t bytes) {
  um_buffer *b[2] = {NULL, NULL};
  um_buffer_native nat[2];
  um_event *copied = NULL;
  void *wait[2] = {NULL, NULL};
  int bad = um_queue_use(l->d, l->queue) != UM_OK ? um_failed(l, "um_queue_use", UM_EINVAL) : 0, st;
  bad = bad || alloc_pair(l, bytes, 0, b);
  if (!bad && (st = um_copy_from_host(b[0], 0, l->in, bytes, &copied)) != UM_OK)
    bad = um_failed(l, "um_copy_from_host", st);
  if (copied != NULL)
    um_event_release(copied);
  phase_end(l, PH_TO_DEVICE);
  for (int i = 0; i < 2 && !bad; i++)
    if ((st = um_buffer_native_get(b[i], &nat[i])) != UM_OK ||
        (st = um_access_begin(b[i], i == 0 ? UM_MAP_READ : UM_MAP_WRITE_DISCARD, &wait[i])) != UM_OK)
      bad = um_failed(l, "um_access_begin", st);
  if (!bad && (wait[0] != NULL || wait[1] != NULL))
    bad = um_failed(l, "um_access_begin (a wait handle on the caller's queue)", UM_ESTATE);
  if (!bad && enqueue_kernel(l, (cl_mem)nat[0].cl_mem, nat[0].offset, (cl_mem)nat[1].cl_mem, nat[1].offset, bytes,
                             0, NULL, NULL) != CL_SUCCESS)
    bad = um_failed(l, "the kernel", UM_EBACKEND);
  for (int i = 0; i < 2; i++)
    if (b[i] != NULL && (st = um_access_end(b[i], NULL)) != UM_OK && !bad)
      bad = um_failed(l, "um_access_end", st);
  phase_end(l, PH_KERNEL);
  if (!bad && (st = um_copy_to_host(b[1], 0, l->out, bytes, NULL)) != UM_OK)
    bad = um_failed(l, "um_copy_to_host", st);
  phase_end(l, PH_TO_HOST);
  bad = bad || check_out(l, bytes);
  bad = release_pair(l, b) || bad;
  um_queue_use(l->d, NULL);
  return bad;
}

/* Every side, raw first (the ratios' reference). */
static const bl_side sides[] = {
    {"raw", raw_iteration,
     "clCreateBuffer in, out; clEnqueueWriteBuffer in (non-blocking); kernel; blocking clEnqueueReadBuffer out;\n"
     "check; clReleaseMemObject in, out"},
    {"unimem_pooled", pooled_iteration,
     "um_alloc in, out; um_copy_from_host in (its event released at once); um_access_begin in (READ),\n"
     "out (WRITE_DISCARD); kernel after their events, clFlush; um_access_end in, out with the kernel's\n"
     "event; blocking um_copy_to_host out; check; um_release in, out"},
    {"unimem_unpooled", unpooled_iteration, "the same with UM_ALLOC_UNPOOLED"},
    {"unimem_queue", queue_iteration,
     "unimem_pooled's calls on the caller's queue (um_queue_use): no wait handles, the kernel with no wait\n"
     "list and no event, um_access_end in, out with NULL"},
    {"pool_raw", pool_raw_iteration,
     "um_alloc in, out (pooled), their cl_mem and offset (um_buffer_native_get); then raw's calls on them;\n"
     "um_release in, out"},
};
#define NSIDES ((int)(sizeof(sides) / sizeof(sides[0])))

static int side_index(const char *name) {
  for (int s = 0; s < NSIDES; s++)
    if (strcmp(sides[s].name, name) == 0)
      return s;
  return -1;
}

/* ------------------------------------------------------------------------ */
/* Ranges, targets, results                                                  */

typedef struct bl_range {
  const char *name;
  size_t lo, hi; /* bytes */
} bl_range;

static const bl_range ranges[] = {{"1-64 KiB", 1 * KiB, 64 * KiB}, {"4 KiB-4 MiB", 4 * KiB, 4 * MiB}};
#define NRANGES ((int)(sizeof(ranges) / sizeof(ranges[0])))

/* side / raw <= limit, or with side NULL, the pooling gain >= limit; in
 * the range of that name, or in every range (range NULL). */
typedef struct bl_target {
  const char *range, *side;
  double limit;
} bl_target;

static const bl_target targets[] = {
    {"1-64 KiB", "unimem_pooled", 1.0},
    {"4 KiB-4 MiB", "unimem_pooled", 0.6},
    {"1-64 KiB", "unimem_queue", 1.0},
    {"4 KiB-4 MiB", "unimem_queue", 0.6},
    {NULL, "unimem_unpooled", 1.1},
    {"1-64 KiB", NULL, 5.0},
};
#define NTARGETS ((int)(sizeof(targets) / sizeof(targets[0])))

/* A side's figure in a row (the key side_suffix); -1 when not there. */
static double side_figure(const bench_row *row, const char *side, const char *suffix) {
  char key[BENCH_KEY_MAX];
  snprintf(key, sizeof(key), "%s%s", side, suffix);
  return bench_get(row, key);
}

static void set_side_figure(bench_row *row, const char *side, const char *suffix, double v) {
  char key[BENCH_KEY_MAX];
  snprintf(key, sizeof(key), "%s%s", side, suffix);
  bench_set(row, key, v);
}

/* The row of a range from the repetitions' times t[side][rep]. */
static void record_row(bench_row *row, const bl_range *r, int reps, double t[][MAX_REPS]) {
  int pooled = side_index("unimem_pooled"), unpooled = side_index("unimem_unpooled");
  bench_set(row, "lo_bytes", (double)r->lo);
  bench_set(row, "hi_bytes", (double)r->hi);
  for (int s = 0; s < NSIDES; s++) {
    double spread = bench_quantile(t[s], reps, 0.75) - bench_quantile(t[s], reps, 0.25);
    set_side_figure(row, sides[s].name, "_ns", bench_median(t[s], reps));
    set_side_figure(row, sides[s].name, "_spread", spread);
    if (s > 0)
      set_side_figure(row, sides[s].name, "_ratio", side_figure(row, sides[s].name, "_ns") / bench_get(row, "raw_ns"));
  }
  bench_set(row, "pooling_gain",
            side_figure(row, sides[unpooled].name, "_ns") / side_figure(row, sides[pooled].name, "_ns"));
}

/* ------------------------------------------------------------------------ */
/* The table                                                                 */

/* A target on one row: the figure, the figure once each median is moved by
 * its spread in the target's favour, and the verdict. */
static void print_target(const bench_row *row, const bl_target *t) {
  const char *a = t->side != NULL ? t->side : "unimem_unpooled", *b = t->side != NULL ? "raw" : "unimem_pooled";
  double an = side_figure(row, a, "_ns"), as = side_figure(row, a, "_spread");
  double bn = side_figure(row, b, "_ns"), bs = side_figure(row, b, "_spread");
  double figure = an / bn, best;
  const char *verdict;
  if (an <= 0 || bn <= 0)
    return;
  if (t->side != NULL) {
    best = (an - as) / (bn + bs);
    verdict = figure <= t->limit ? "met" : best <= t->limit ? "noise" : "MISSED";
    printf("  %s, %s <= %.2fx raw: %.2fx", bench_get_text(row, "name"), t->side, t->limit, figure);
  } else {
    best = bn - bs > 0 ? (an + as) / (bn - bs) : INFINITY;
    verdict = figure >= t->limit ? "met" : best >= t->limit ? "noise" : "MISSED";
    printf("  %s, pooling gain >= %.1fx: %.2fx", bench_get_text(row, "name"), t->limit, figure);
  }
  printf(" (%.2fx within the spread) %s\n", best, verdict);
}

static void print_header(const bl_config *c, const char *device) {
  printf("unimem bench loop%s: OpenCL device \"%s\"; %d iterations per repetition, %d repetitions per side\n",
         c->quick ? " --quick" : "", device, c->iters, c->reps);
  printf("one iteration: allocate in and out; copy in host->device; kernel out[i] = 2*in[i] + 1 (uint);\n"
         "copy out device->host (blocking); check every element on the host; release in and out. Every command\n"
         "on the device's caller queue. Iteration i has the size s_i of one seeded sequence, log-uniform in\n"
         "the range (multiples of 4 bytes), the same for every side; host arrays allocated once. The sides:\n");
  for (int s = 0; s < NSIDES; s++) {
    printf("  %-16s ", sides[s].name);
    for (const char *p = sides[s].what; *p; p++)
      if (*p == '\n')
        printf("\n  %-16s ", "");
      else
        putchar(*p);
    printf("\n");
  }
  printf("median us per iteration over the repetitions; spread = their interquartile range;\n"
         "ratio = side / raw; pooling gain = unimem_unpooled / unimem_pooled\n\n");
}

static void print_table(const bench_report *rep, const bl_config *c, const char *device) {
  print_header(c, device);
  printf("%-12s %-16s %14s %11s %6s\n", "range", "side", "per iteration", "spread", "ratio");
  for (int i = 0; i < rep->nrows; i++) {
    const bench_row *row = &rep->rows[i];
    for (int s = 0; s < NSIDES; s++) {
      double ns = side_figure(row, sides[s].name, "_ns"), ratio = s ? side_figure(row, sides[s].name, "_ratio") : 1;
      if (ns > 0)
        printf("%-12s %-16s %11.2f us %8.2f us %6.2f\n", bench_get_text(row, "name"), sides[s].name, ns / 1e3,
               side_figure(row, sides[s].name, "_spread") / 1e3, ratio);
    }
    printf("%-12s %-16s %14.2fx\n", bench_get_text(row, "name"), "pooling gain", bench_get(row, "pooling_gain"));
  }
  printf("\ntargets (within the spread: the figure once each median is moved by its spread in the target's favour;\n"
         "noise: met only there)\n");
  for (int t = 0; t < NTARGETS; t++)
    for (int i = 0; i < rep->nrows; i++)
      if (targets[t].range == NULL || strcmp(targets[t].range, bench_get_text(&rep->rows[i], "name")) == 0)
        print_target(&rep->rows[i], &targets[t]);
}

/* The seeds' allocation table ("Without Pool | With Pool | Speedup", and
 * "11.2x for allocation-heavy workloads"), extended with this loop: an
 * iteration unpooled against pooled, on unimem's own queues. */
static void print_seeds_rows(const bench_report *rep) {
  printf("\nthe seeds' table, extended with this loop (the seeds claim 11.2x for allocation-heavy workloads)\n");
  printf("  %-34s %12s %12s %9s\n", "Operation", "Without Pool", "With Pool", "Speedup");
  for (int i = 0; i < rep->nrows; i++) {
    const bench_row *row = &rep->rows[i];
    char what[64];
    snprintf(what, sizeof(what), "loop iteration, %s", bench_get_text(row, "name"));
    printf("  %-34s %9.2f us %9.2f us %8.2fx\n", what, side_figure(row, "unimem_unpooled", "_ns") / 1e3,
           side_figure(row, "unimem_pooled", "_ns") / 1e3, bench_get(row, "pooling_gain"));
  }
}

/* The phases' means (us per iteration) of every side and range. */
static void print_phases(const double phases[NRANGES][NSIDES][NPHASES]) {
  printf("\nwhere the time goes: mean us per iteration in each phase, one more pass per side\n");
  printf("%-12s %-16s", "range", "side");
  for (int p = 0; p < NPHASES; p++)
    printf(" %9s", phase_names[p]);
  printf("\n");
  for (int r = 0; r < NRANGES; r++)
    for (int s = 0; s < NSIDES; s++) {
      printf("%-12s %-16s", ranges[r].name, sides[s].name);
      for (int p = 0; p < NPHASES; p++)
        printf(" %9.2f", phases[r][s][p] / 1e3);
      printf("\n");
    }
}

/* ------------------------------------------------------------------------ */
/* The device, the program, the host arrays                                  */

typedef struct bl_env {
  um_manager *m;
  um_device *d;
  um_device_native nat;
  cl_program program;
  cl_kernel kernel[NSIDES];
  cl_uint *in, *out; /* of the largest size */
  char device[128];
} bl_env;

/* The program and a kernel per side: 0, or 1 with a message. */
static int build_kernels(bl_env *e) {
  cl_device_id id = (cl_device_id)e->nat.cl_device;
  cl_int err = CL_SUCCESS;
  e->program = cl.clCreateProgramWithSource((cl_context)e->nat.cl_context, 1, &kernel_source, NULL, &err);
  if (e->program != NULL)
    err = cl.clBuildProgram(e->program, 1, &id, "", NULL, NULL);
  if (e->program == NULL || err != CL_SUCCESS) {
    fprintf(stderr, "bench loop: cannot build the kernel (%d)\n", (int)err);
    return 1;
  }
  for (int s = 0; s < NSIDES; s++)
    if ((e->kernel[s] = cl.clCreateKernel(e->program, "twice_plus_one", &err)) == NULL) {
      fprintf(stderr, "bench loop: clCreateKernel failed (%d)\n", (int)err);
      return 1;
    }
  return 0;
}

/* The host arrays, the input filled: 0, or 1 with a message. */
static int alloc_host(bl_env *e) {
  size_t largest = 0, n;
  for (int r = 0; r < NRANGES; r++)
    largest = ranges[r].hi > largest ? ranges[r].hi : largest;
  n = largest / sizeof(cl_uint);
  e->in = malloc(largest);
  e->out = malloc(largest);
  if (e->in == NULL || e->out == NULL) {
    fprintf(stderr, "bench loop: out of host memory\n");
    return 1;
  }
  for (size_t i = 0; i < n; i++)
    e->in[i] = (cl_uint)(i * 2654435761u);
  return 0;
}

/* The manager, the first OpenCL device, the kernels and the host arrays:
 * 0, BENCH_SKIPPED without an OpenCL device (said), 1 on a failure. */
static int open_env(bl_env *e) {
  char why[256];
  int rc = bench_cl_first_device("loop", &e->m, &e->d, &e->nat, e->device, sizeof(e->device));
  if (rc != 0)
    return rc;
  if (load_opencl(why, sizeof(why)) != 0) {
    fprintf(stderr, "bench loop: cannot load OpenCL for the raw side: %s\n", why);
    return 1;
  }
  return build_kernels(e) || alloc_host(e);
}

static void close_env(bl_env *e) {
  for (int s = 0; s < NSIDES; s++)
    if (e->kernel[s] != NULL)
      cl.clReleaseKernel(e->kernel[s]);
  if (e->program != NULL)
    cl.clReleaseProgram(e->program);
  if (e->m != NULL)
    um_manager_destroy(e->m);
  free(e->in);
  free(e->out);
}

/* ------------------------------------------------------------------------ */
/* Measuring                                                                 */

/* The sizes of n iterations in r: the seeded sequence, log-uniform in
 * [lo, hi], multiples of 4 bytes. NULL when out of memory (said). */
static size_t *make_sizes(const bl_range *r, int n) {
  size_t *sizes = malloc((size_t)n * sizeof(*sizes));
  uint64_t x = SEED;
  for (int i = 0; sizes != NULL && i < n; i++) {
    uint64_t z = (x += UINT64_C(0x9e3779b97f4a7c15)); /* splitmix64 */
    double u;
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    u = (double)((z ^ (z >> 31)) >> 11) / 9007199254740992.0; /* [0, 1) */
    sizes[i] = (size_t)((double)r->lo * exp(u * log((double)r->hi / (double)r->lo))) & ~(size_t)3;
    sizes[i] = sizes[i] < r->lo ? r->lo : sizes[i] > r->hi ? r->hi : sizes[i];
  }
  if (sizes == NULL)
    fprintf(stderr, "bench loop: out of host memory\n");
  return sizes;
}

/* Side s through sizes[0..n): ns per iteration in *ns; with phase_ns, the
 * sums of its phases there. The output's ends are poisoned before each
 * iteration (an even value: every result is odd). 0, or 1 with a message. */
static int run_side(bl_env *e, int s, const size_t *sizes, int n, double *phase_ns, double *ns) {
  bl_loop l = {&sides[s], e->m, e->d, (cl_context)e->nat.cl_context, (cl_command_queue)e->nat.cl_queue,
               e->kernel[s], e->in, e->out, phase_ns, 0};
  double t0 = bench_now_ns();
  for (int i = 0; i < n; i++) {
    e->out[0] = e->out[sizes[i] / sizeof(cl_uint) - 1] = 0;
    if (phase_ns != NULL)
      l.phase_t = bench_now_ns();
    if (sides[s].run(&l, sizes[i]) != 0)
      return 1;
  }
  *ns = (bench_now_ns() - t0) / n;
  return 0;
}

/* Each side's first iterations, the whole output poisoned before each. */
static int warm_up(bl_env *e, const size_t *sizes, int n) {
  double unused;
  for (int s = 0; s < NSIDES; s++)
    for (int i = 0; i < n; i++) {
      memset(e->out, 0xaa, sizes[i]);
      if (run_side(e, s, &sizes[i], 1, NULL, &unused) != 0)
        return 1;
    }
  return 0;
}

/* Range r: the warm-up, the repetitions (sides in turn, turns at going
 * first), the row; then the phases' pass, means into phases. 0, or 1. */
static int measure_range(bench_report *rep, bl_env *e, const bl_config *c, int r, double phases[NSIDES][NPHASES]) {
  static double t[NSIDES][MAX_REPS];
  size_t *sizes = make_sizes(&ranges[r], c->iters);
  bench_row *row;
  int bad = sizes == NULL || warm_up(e, sizes, c->iters < WARM_ITERS ? c->iters : WARM_ITERS);
  for (int k = 0; k < c->reps && !bad; k++)
    for (int j = 0; j < NSIDES && !bad; j++) {
      int s = (k + j) % NSIDES;
      bad = run_side(e, s, sizes, c->iters, NULL, &t[s][k]);
    }
  for (int s = 0; s < NSIDES && !bad; s++) {
    double unused;
    memset(phases[s], 0, sizeof(phases[s]));
    bad = run_side(e, s, sizes, c->iters, phases[s], &unused);
    for (int p = 0; p < NPHASES; p++)
      phases[s][p] /= c->iters;
  }
  free(sizes);
  if (bad || (row = bench_add_row(rep, "loop", ranges[r].name)) == NULL)
    return 1;
  record_row(row, &ranges[r], c->reps, t);
  return 0;
}

/* Every range's row and phases, then the tables: 0, or 1. */
static int measure_all(bench_report *rep, bl_env *e, const bl_config *c) {
  static double phases[NRANGES][NSIDES][NPHASES];
  int bad = 0;
  bench_set_bool(&rep->facts, "quick", c->quick);
  bench_set_text(&rep->facts, "device", e->device);
  bench_set(&rep->facts, "iters", c->iters);
  bench_set(&rep->facts, "reps", c->reps);
  for (int r = 0; r < NRANGES && !bad; r++)
    bad = measure_range(rep, e, c, r, phases[r]);
  print_table(rep, c, e->device);
  if (!bad) {
    print_seeds_rows(rep);
    print_phases(phases);
  }
  return bad;
}
#endif /* BENCH_HAVE_CL */

int um_bench_loop_main(int argc, char **argv, bench_report *rep) {
  bl_config c = {0, 0, 0};
  const bench_count counts[] = {{"--iters", &c.iters, 1000, 100, 0}, {"--reps", &c.reps, 11, 3, MAX_REPS}};
  int rc = bench_parse_counts(argc, argv, &c.quick, counts, 2);
#ifdef BENCH_HAVE_CL
  bl_env e;
  memset(&e, 0, sizeof(e));
  if (rc == 0 && (rc = open_env(&e)) == 0)
    rc = measure_all(rep, &e, &c);
  close_env(&e);
#else
  (void)rep;
  if (rc == 0) {
    fprintf(stderr, "bench loop: built without CL/cl.h: nothing to measure\n");
    rc = BENCH_SKIPPED;
  }
#endif
  return rc;
}

#ifndef UM_BENCH_NO_MAIN
int main(int argc, char **argv) { return bench_program_main(argc, argv, "loop", um_bench_loop_main); }
#endif
