/* A chain of the caller's own kernels between unimem copies (SPEC §8),
 * against the same chain written by hand with raw OpenCL events, in one
 * run, on the same devices, context, queues, program and buffer sizes.
 *
 * Step k of a chain of N steps: x = 3x + 1 (uint, every element) by a
 * kernel on buffer b[k % 2], then a copy of b[k % 2] into b[(k + 1) % 2].
 * "local": both buffers on the first OpenCL device (device-local copies);
 * "peer": b[0] on it and b[1] on a second device of the same context (peer
 * copies), where there is one.
 *  - unimem: the kernel on the device's caller queue (um_device_native_get)
 *    inside um_access_begin / um_access_end: its wait list is the bracket's
 *    wait handle, its event goes to um_access_end; then um_copy with an
 *    event, released at once. The only wait is on the last copy's event.
 *  - raw: the kernel on the same queue, waiting on the previous copy's
 *    cl_event; clEnqueueCopyBuffer on a second in-order queue of the
 *    destination device (unimem too copies on a queue of its own), waiting
 *    on the kernel's event; clWaitForEvents on the last copy.
 * Before timing, each side's chain runs once from known data and its result
 * is checked element by element against the recurrence computed here.
 *
 * A repetition runs one whole chain per side, the sides taking turns (and
 * turns at going first), so that both see the same machine; it times the
 * chain end to end (first command issued to the wait's return) and the
 * host time spent issuing it. Figures are medians over the repetitions, per
 * step; "spread" is the larger interquartile range of the two sides'
 * end-to-end figures. Target (SPEC §6): unimem adds at most 1 us per step.
 *
 *   bench_kernels [--quick] [--steps N] [--reps N] [--json FILE]
 *
 * The raw side loads libOpenCL.so.1 itself (as unimem does: this program
 * does not link OpenCL) and works in the contexts unimem made. Two PoCL
 * devices are asked for (POCL_DEVICES="pthread pthread") unless the
 * environment already chose. Exit status: 0 measured, 77 no OpenCL device,
 * 1 a failure (an error or a wrong result), 2 bad usage. Built as the
 * `unimem bench kernels` subcommand with -DUM_BENCH_NO_MAIN (entry point
 * um_bench_kernels_main). */
#include <stdbool.h>
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
#define TARGET_NS 1000.0 /* SPEC §6: added per step */
#define MAX_REPS 201

int um_bench_kernels_main(int argc, char **argv, bench_report *rep);

typedef struct bk_config {
  int quick, steps, reps;
} bk_config;

#ifdef BENCH_HAVE_CL
/* ------------------------------------------------------------------------ */
/* Results                                                                   */

/* A row's figures, as the table reads them back from the report (ns per
 * step; < 0: not measured). */
typedef struct bk_figures {
  const char *name;
  double um_ns, raw_ns, spread, um_issue_ns, raw_issue_ns;
} bk_figures;

static bk_figures figures_of(const bench_row *r) {
  return (bk_figures){bench_get_text(r, "name"),      bench_get(r, "unimem_ns"),
                      bench_get(r, "raw_ns"),         bench_get(r, "spread"),
                      bench_get(r, "unimem_issue_ns"), bench_get(r, "raw_issue_ns")};
}

/* "met", "noise" (over the target by less than the spread: the machine's
 * noise hides the difference) or "MISSED". */
static const char *verdict(const bk_figures *f) {
  double added = f->um_ns - f->raw_ns;
  if (added <= TARGET_NS)
    return "met";
  return f->spread >= added ? "noise" : "MISSED";
}

static void print_table(const bench_report *rep, const bk_config *c, const char *device, int ndev) {
  printf("unimem bench kernels%s: OpenCL device \"%s\"%s; %d steps per chain, %d repetitions per side\n",
         c->quick ? " --quick" : "", device, ndev > 1 ? " and a second one in its context" : " (one device)",
         c->steps, c->reps);
  printf("a step = one kernel (x = 3x + 1 on every element) + one copy of the buffer; median per step;\n"
         "ratio = raw / unimem (1.00: as fast as the chain written with raw events); added = unimem - raw;\n"
         "spread = the larger interquartile range of the two sides; issue = host time to issue one step\n\n");
  printf("%-14s %11s %11s %6s %10s %10s   %12s %10s\n", "chain", "unimem", "raw events", "ratio", "added",
         "spread", "issue unimem", "issue raw");
  for (int i = 0; i < rep->nrows; i++) {
    bk_figures f = figures_of(&rep->rows[i]);
    if (f.um_ns <= 0 || f.raw_ns <= 0)
      continue;
    printf("%-14s %8.2f us %8.2f us %6.2f %+7.2f us %7.2f us   %9.2f us %7.2f us\n", f.name, f.um_ns / 1e3,
           f.raw_ns / 1e3, f.raw_ns / f.um_ns, (f.um_ns - f.raw_ns) / 1e3, f.spread / 1e3, f.um_issue_ns / 1e3,
           f.raw_issue_ns / 1e3);
  }
  printf("\ntargets\n");
  for (int i = 0; i < rep->nrows; i++) {
    bk_figures f = figures_of(&rep->rows[i]);
    if (f.um_ns > 0 && f.raw_ns > 0)
      printf("  <= 1 us added per step, %s: %+.2f us (spread %.2f us) %s\n", f.name, (f.um_ns - f.raw_ns) / 1e3,
             f.spread / 1e3, verdict(&f));
  }
}

/* ------------------------------------------------------------------------ */
/* Raw OpenCL, loaded at run time                                            */

#define BK_ENTRY_POINTS(XX)                                                    \
  XX(clCreateProgramWithSource)                                                \
  XX(clBuildProgram)                                                           \
  XX(clCreateKernel)                                                           \
  XX(clSetKernelArg)                                                           \
  XX(clEnqueueNDRangeKernel)                                                   \
  XX(clEnqueueCopyBuffer)                                                      \
  XX(clEnqueueWriteBuffer)                                                     \
  XX(clEnqueueReadBuffer)                                                      \
  XX(clCreateBuffer)                                                           \
  XX(clCreateCommandQueue)                                                     \
  XX(clFlush)                                                                  \
  XX(clFinish)                                                                 \
  XX(clWaitForEvents)                                                          \
  XX(clReleaseEvent)                                                           \
  XX(clReleaseMemObject)                                                       \
  XX(clReleaseKernel)                                                          \
  XX(clReleaseProgram)                                                         \
  XX(clReleaseCommandQueue)

BENCH_CL_TABLE(cl, BK_ENTRY_POINTS)
BENCH_CL_LOADER(load_opencl, cl, BK_ENTRY_POINTS)

/* first: the buffer's offset inside its cl_mem, in elements. */
static const char *kernel_source =
    "__kernel void axpb(__global uint *x, ulong first, uint a, uint b) {\n"
    "  size_t i = first + get_global_id(0);\n"
    "  x[i] = a * x[i] + b;\n"
    "}\n";

#define KERNEL_A 3u
#define KERNEL_B 1u

/* One OpenCL device: its handles, the raw side's copy queue, and a kernel
 * object per side. */
typedef struct bk_dev {
  um_device *d;
  um_device_native nat;
  cl_command_queue copy_queue; /* raw side */
  cl_kernel kernel[2];         /* [0] unimem side, [1] raw side */
} bk_dev;

typedef struct bk_env {
  um_manager *m;
  bk_dev dev[2]; /* dev[1]: a second device of dev[0]'s context, if any */
  int ndev;
  cl_program program;
  char device[128];
} bk_env;

/* The first OpenCL device, and a second one of its context. */
static int find_devices(bk_env *e) {
  for (int i = 0; i < um_device_count(e->m) && e->ndev < 2; i++) {
    bk_dev *k = &e->dev[e->ndev];
    k->d = um_device_get(e->m, i);
    if (um_device_native_get(k->d, &k->nat) != UM_OK || strcmp(k->nat.backend, "opencl") != 0)
      continue;
    if (e->ndev == 0 || k->nat.cl_context == e->dev[0].nat.cl_context)
      e->ndev++;
  }
  return e->ndev;
}

/* The program for the devices found, a kernel per side and device, and the
 * raw side's copy queues. 0, or 1 with a message. */
static int build_kernels(bk_env *e) {
  cl_device_id ids[2];
  cl_int err = CL_SUCCESS;
  for (int i = 0; i < e->ndev; i++)
    ids[i] = (cl_device_id)e->dev[i].nat.cl_device;
  e->program = cl.clCreateProgramWithSource((cl_context)e->dev[0].nat.cl_context, 1, &kernel_source, NULL, &err);
  if (e->program != NULL)
    err = cl.clBuildProgram(e->program, (cl_uint)e->ndev, ids, "", NULL, NULL);
  if (e->program == NULL || err != CL_SUCCESS) {
    fprintf(stderr, "bench kernels: cannot build the kernel (%d)\n", (int)err);
    return 1;
  }
  for (int i = 0; i < e->ndev; i++) {
    bk_dev *k = &e->dev[i];
    for (int side = 0; side < 2; side++)
      if ((k->kernel[side] = cl.clCreateKernel(e->program, "axpb", &err)) == NULL) {
        fprintf(stderr, "bench kernels: clCreateKernel failed (%d)\n", (int)err);
        return 1;
      }
    k->copy_queue = cl.clCreateCommandQueue((cl_context)k->nat.cl_context, ids[i], 0, &err);
    if (k->copy_queue == NULL) {
      fprintf(stderr, "bench kernels: clCreateCommandQueue failed (%d)\n", (int)err);
      return 1;
    }
  }
  return 0;
}

/* The manager, the devices and the kernels: 0, BENCH_SKIPPED without an
 * OpenCL device (said), 1 on a failure. */
static int open_env(bk_env *e) {
  um_device_info info;
  char why[256];
  if (bench_cl_manager("kernels", &e->m) != 0)
    return 1;
  if (find_devices(e) == 0) {
    fprintf(stderr, "bench kernels: no OpenCL device (UNIMEM_LOG_LEVEL=info says why): nothing to measure\n");
    return BENCH_SKIPPED;
  }
  if (load_opencl(why, sizeof(why)) != 0) {
    fprintf(stderr, "bench kernels: cannot load OpenCL for the raw side: %s\n", why);
    return 1;
  }
  um_device_info_get(e->dev[0].d, &info);
  snprintf(e->device, sizeof(e->device), "%s", info.name);
  return build_kernels(e);
}

static void close_env(bk_env *e) {
  for (int i = 0; i < e->ndev; i++) {
    bk_dev *k = &e->dev[i];
    for (int side = 0; side < 2; side++)
      if (k->kernel[side] != NULL)
        cl.clReleaseKernel(k->kernel[side]);
    if (k->copy_queue != NULL)
      cl.clReleaseCommandQueue(k->copy_queue);
  }
  if (e->program != NULL)
    cl.clReleaseProgram(e->program);
  if (e->m != NULL)
    um_manager_destroy(e->m);
}

/* ------------------------------------------------------------------------ */
/* The chain                                                                 */

/* Two buffers of bytes on two devices (or twice the same), for each side:
 * b[0] on on[0], b[1] on on[1]. */
typedef struct bk_chain {
  bk_dev *on[2];
  size_t bytes;
  int steps;
  int queue; /* unimem on the devices' caller queues (um_queue_use), raw's
                copies on the destination's caller queue */
  um_buffer *ub[2];
  cl_mem umem[2];  /* ub[i]'s cl_mem (um_buffer_native_get) */
  size_t first[2]; /* ub[i]'s offset inside umem[i], in elements */
  cl_mem rb[2];
} bk_chain;

/* Enqueue x = 3x + 1 over the chain's buffer on device k (side's kernel)
 * after wait (may be NULL); its event in *done. */
static cl_int enqueue_axpb(const bk_chain *c, bk_dev *k, int side, cl_mem mem, size_t first, cl_event wait,
                           cl_event *done) {
  cl_kernel kernel = k->kernel[side];
  cl_ulong first64 = first;
  cl_uint a = KERNEL_A, b = KERNEL_B;
  size_t global = c->bytes / sizeof(cl_uint);
  cl_int err = cl.clSetKernelArg(kernel, 0, sizeof(mem), &mem);
  if (err == CL_SUCCESS)
    err = cl.clSetKernelArg(kernel, 1, sizeof(first64), &first64);
  if (err == CL_SUCCESS)
    err = cl.clSetKernelArg(kernel, 2, sizeof(a), &a);
  if (err == CL_SUCCESS)
    err = cl.clSetKernelArg(kernel, 3, sizeof(b), &b);
  if (err == CL_SUCCESS)
    err = cl.clEnqueueNDRangeKernel((cl_command_queue)k->nat.cl_queue, kernel, 1, NULL, &global, NULL,
                                    wait ? 1 : 0, wait ? &wait : NULL, done);
  if (err == CL_SUCCESS)
    err = cl.clFlush((cl_command_queue)k->nat.cl_queue);
  return err;
}

/* Step s through unimem: the kernel in a bracket, then um_copy. *last
 * holds the previous copy's event (released here) and receives this one's. */
static int unimem_step(const bk_chain *c, int s, um_event **last) {
  int from = s % 2, to = (s + 1) % 2;
  um_buffer *src = c->ub[from];
  void *wait = NULL;
  cl_event done = NULL;
  int st = um_access_begin(src, UM_MAP_READ_WRITE, &wait);
  if (st != UM_OK)
    return st;
  /* On the caller's queue the bracket ends behind the kernel with NULL. */
  if (enqueue_axpb(c, c->on[from], 0, c->umem[from], c->first[from], (cl_event)wait, c->queue ? NULL : &done) !=
      CL_SUCCESS) {
    um_access_end(src, NULL);
    return UM_EBACKEND;
  }
  st = um_access_end(src, done);
  if (done != NULL)
    cl.clReleaseEvent(done);
  if (*last != NULL)
    um_event_release(*last);
  *last = NULL;
  return st != UM_OK ? st : um_copy(c->ub[to], 0, src, 0, c->bytes, last);
}

/* Step s by hand: the kernel after the previous copy, the copy after the
 * kernel on the destination's copy queue. *last as for unimem_step. */
static cl_int raw_step(const bk_chain *c, int s, cl_event *last) {
  int from = s % 2, to = (s + 1) % 2;
  cl_command_queue q = c->queue ? (cl_command_queue)c->on[to]->nat.cl_queue : c->on[to]->copy_queue;
  bool one_queue = q == (cl_command_queue)c->on[from]->nat.cl_queue;
  cl_event kernel_done = NULL;
  cl_int err = enqueue_axpb(c, c->on[from], 1, c->rb[from], 0, one_queue ? NULL : *last,
                            one_queue ? NULL : &kernel_done);
  if (*last != NULL)
    cl.clReleaseEvent(*last);
  *last = NULL;
  if (err != CL_SUCCESS)
    return err;
  /* One in-order queue orders the two without an event. */
  err = cl.clEnqueueCopyBuffer(q, c->rb[from], c->rb[to], 0, 0, c->bytes, one_queue ? 0 : 1,
                               one_queue ? NULL : &kernel_done, last);
  if (kernel_done != NULL)
    cl.clReleaseEvent(kernel_done);
  return err == CL_SUCCESS ? cl.clFlush(q) : err;
}

/* The unimem side's queues for a chain: the devices' caller queues, or
 * (on = 0) unimem's own again. */
static int use_queues(const bk_chain *c, int on) {
  int st = UM_OK;
  for (int i = 0; i < 2 && st == UM_OK; i++)
    st = um_queue_use(c->on[i]->d, on ? c->on[i]->nat.cl_queue : NULL);
  return st;
}

/* One chain through one side: ns per step, end to end and to issue it.
 * 0, or 1 with a message. */
static int run_chain(const bk_chain *c, int side, double *total_ns, double *issue_ns) {
  double t0 = bench_now_ns(), t1;
  int bad = 0;
  if (side == 0) {
    um_event *last = NULL;
    int st = c->queue ? use_queues(c, 1) : UM_OK;
    for (int s = 0; s < c->steps && st == UM_OK; s++)
      st = unimem_step(c, s, &last);
    t1 = bench_now_ns();
    if (st == UM_OK)
      st = um_event_wait(last);
    if (last != NULL)
      um_event_release(last);
    if (c->queue)
      use_queues(c, 0);
    if ((bad = st != UM_OK))
      fprintf(stderr, "bench kernels: unimem chain: %s (%s)\n", um_err_name(st), um_last_error());
  } else {
    cl_event last = NULL;
    cl_int err = CL_SUCCESS;
    for (int s = 0; s < c->steps && err == CL_SUCCESS; s++)
      err = raw_step(c, s, &last);
    t1 = bench_now_ns();
    if (err == CL_SUCCESS)
      err = cl.clWaitForEvents(1, &last);
    if (last != NULL)
      cl.clReleaseEvent(last);
    if ((bad = err != CL_SUCCESS))
      fprintf(stderr, "bench kernels: raw chain: OpenCL error %d\n", (int)err);
  }
  *issue_ns = (t1 - t0) / c->steps;
  *total_ns = (bench_now_ns() - t0) / c->steps;
  return bad;
}

/* ------------------------------------------------------------------------ */
/* Cases                                                                     */

static int chain_open(bk_chain *c, bk_env *e, int peer, size_t bytes, int steps) {
  cl_int err = CL_SUCCESS;
  memset(c, 0, sizeof(*c));
  c->on[0] = &e->dev[0];
  c->on[1] = &e->dev[peer ? 1 : 0];
  c->bytes = bytes;
  c->steps = steps;
  for (int i = 0; i < 2; i++) {
    um_buffer_native bn;
    if (um_alloc(e->m, c->on[i]->d, bytes, UM_DEVICE, UM_ALLOC_ZERO, &c->ub[i]) != UM_OK ||
        um_buffer_native_get(c->ub[i], &bn) != UM_OK) {
      fprintf(stderr, "bench kernels: cannot allocate %zu bytes: %s\n", bytes, um_last_error());
      return 1;
    }
    c->umem[i] = (cl_mem)bn.cl_mem;
    c->first[i] = bn.offset / sizeof(cl_uint);
    c->rb[i] = cl.clCreateBuffer((cl_context)c->on[i]->nat.cl_context, CL_MEM_READ_WRITE, bytes, NULL, &err);
    if (c->rb[i] == NULL) {
      fprintf(stderr, "bench kernels: clCreateBuffer failed (%d)\n", (int)err);
      return 1;
    }
  }
  return 0;
}

static void chain_close(bk_chain *c) {
  for (int i = 0; i < 2; i++) {
    if (c->ub[i] != NULL)
      um_release(c->ub[i]);
    if (c->rb[i] != NULL)
      cl.clReleaseMemObject(c->rb[i]);
  }
}

/* Run one chain per side from known data (element i = i) and compare the
 * result with the recurrence: 0, or 1 with a message. Also the warm-up. */
static int check_chain(const bk_chain *c) {
  size_t n = c->bytes / sizeof(cl_uint), at = (size_t)c->steps % 2;
  cl_uint *data = malloc(c->bytes), *back = malloc(c->bytes);
  double unused[2];
  int bad = data == NULL || back == NULL;
  for (int side = 0; side < 2 && !bad; side++) {
    for (size_t i = 0; i < n; i++)
      data[i] = (cl_uint)i;
    if (side == 0)
      bad = um_copy_from_host(c->ub[0], 0, data, c->bytes, NULL) != UM_OK || run_chain(c, 0, &unused[0], &unused[1]) ||
            um_copy_to_host(c->ub[at], 0, back, c->bytes, NULL) != UM_OK;
    else
      bad = cl.clEnqueueWriteBuffer(c->on[0]->copy_queue, c->rb[0], CL_TRUE, 0, c->bytes, data, 0, NULL, NULL) ||
            run_chain(c, 1, &unused[0], &unused[1]) ||
            cl.clEnqueueReadBuffer(c->on[at]->copy_queue, c->rb[at], CL_TRUE, 0, c->bytes, back, 0, NULL, NULL);
    for (size_t i = 0; i < n && !bad; i++) {
      cl_uint v = (cl_uint)i;
      for (int s = 0; s < c->steps; s++)
        v = KERNEL_A * v + KERNEL_B;
      if (back[i] != v) {
        fprintf(stderr, "bench kernels: %s chain: element %zu is %u, expected %u\n", side ? "raw" : "unimem", i,
                (unsigned)back[i], (unsigned)v);
        bad = 1;
      }
    }
  }
  free(data);
  free(back);
  return bad;
}

/* The repetitions, sides in turn; the row's figures. 0, or 1. */
static int measure(const bk_chain *c, int reps, bench_row *row) {
  static double total[2][MAX_REPS], issue[2][MAX_REPS];
  double spread = 0;
  for (int r = 0; r < reps; r++)
    for (int k = 0; k < 2; k++) {
      int side = (r + k) % 2; /* turns at going first */
      if (run_chain(c, side, &total[side][r], &issue[side][r]) != 0)
        return 1;
    }
  for (int side = 0; side < 2; side++) {
    double iqr = bench_quantile(total[side], reps, 0.75) - bench_quantile(total[side], reps, 0.25);
    spread = iqr > spread ? iqr : spread;
  }
  bench_set(row, "unimem_ns", bench_median(total[0], reps));
  bench_set(row, "raw_ns", bench_median(total[1], reps));
  bench_set(row, "ratio", bench_get(row, "raw_ns") / bench_get(row, "unimem_ns"));
  bench_set(row, "spread", spread);
  bench_set(row, "unimem_issue_ns", bench_median(issue[0], reps));
  bench_set(row, "raw_issue_ns", bench_median(issue[1], reps));
  return 0;
}

/* One row: a chain of bytes-sized buffers, local or peer. 0, or 1. */
static int chain_row(bench_report *rep, bk_env *e, const bk_config *cfg, int peer, int queue, size_t bytes) {
  char name[48], size[24];
  bk_chain c;
  bench_row *row;
  int bad;
  bench_size_text(size, sizeof(size), bytes);
  snprintf(name, sizeof(name), "%s %s%s", peer ? "peer" : "local", size, queue ? " queue" : "");
  if ((row = bench_add_row(rep, "chain", name)) == NULL)
    return 1;
  bench_set(row, "bytes", (double)bytes);
  bench_set(row, "steps", cfg->steps);
  bench_set(row, "reps", cfg->reps);
  bad = chain_open(&c, e, peer, bytes, cfg->steps);
  c.queue = queue;
  bad = bad || check_chain(&c) || measure(&c, cfg->reps, row);
  chain_close(&c);
  return bad;
}

static int run_all(bench_report *rep, const bk_config *cfg) {
  static const size_t full[] = {4 * KiB, 64 * KiB, 1 * MiB}, quick[] = {4 * KiB, 1 * MiB};
  const size_t *sizes = cfg->quick ? quick : full;
  int nsizes = cfg->quick ? 2 : 3, bad = 0;
  bk_env e;
  memset(&e, 0, sizeof(e));
  int rc = open_env(&e);
  if (rc == 0) {
    bench_set_bool(&rep->facts, "quick", cfg->quick);
    bench_set_text(&rep->facts, "device", e.device);
    bench_set(&rep->facts, "devices", e.ndev);
    bench_set(&rep->facts, "target_added_ns", TARGET_NS);
    for (int peer = 0; peer <= 1 && !bad; peer++) {
      if (peer && e.ndev < 2) {
        fprintf(stderr, "bench kernels: one OpenCL device only: no peer rows "
                        "(POCL_DEVICES=\"pthread pthread\" gives two)\n");
        break;
      }
      for (int i = 0; i < nsizes && !bad; i++)
        for (int queue = 0; queue <= 1 && !bad; queue++)
          bad = chain_row(rep, &e, cfg, peer, queue, sizes[i]);
    }
    print_table(rep, cfg, e.device, e.ndev);
    rc = bad;
  }
  close_env(&e);
  return rc;
}
#endif /* BENCH_HAVE_CL */

/* ------------------------------------------------------------------------ */
/* Entry point                                                               */

static int parse_args(int argc, char **argv, bk_config *c) {
  const bench_count counts[] = {{"--steps", &c->steps, 64, 8, 0}, {"--reps", &c->reps, 101, 3, MAX_REPS}};
  return bench_parse_counts(argc, argv, &c->quick, counts, 2);
}

int um_bench_kernels_main(int argc, char **argv, bench_report *rep) {
  bk_config cfg = {0, 0, 0};
  int rc = parse_args(argc, argv, &cfg);
  if (rc != 0)
    return rc;
  /* Before anything loads OpenCL: two devices for the peer rows, unless
   * the caller chose. */
  setenv("POCL_DEVICES", "pthread pthread", 0);
#ifdef BENCH_HAVE_CL
  return run_all(rep, &cfg);
#else
  (void)rep;
  fprintf(stderr, "bench kernels: built without CL/cl.h: nothing to measure\n");
  return BENCH_SKIPPED;
#endif
}

#ifndef UM_BENCH_NO_MAIN
int main(int argc, char **argv) { return bench_program_main(argc, argv, "kernels", um_bench_kernels_main); }
#endif
