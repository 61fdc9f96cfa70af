/* The caller's own kernels on unimem buffers (SPEC §8), with real OpenCL C
 * compiled by PoCL, every result checked element by element:
 *  - vector add;
 *  - a chain copy -> kernel -> copy -> kernel -> copy back across two
 *    devices, issued without a single wait until the end: on the device
 *    queues alone within one context, through workers between two;
 *  - a kernel writing a buffer that is then mapped;
 *  - a kernel racing a release;
 *  - the same chain in a context and queue the test made itself
 *    (um_device_adopt_opencl);
 *  - bad input of its own (another context) with exact codes and unchanged
 *    statistics (the rest: conformance/test_access.c);
 *  - brackets over several buffers (um_access_begin_n): one wait handle for
 *    three held uploads before an SGEMM-shaped c = a * b + c, the same
 *    buffer twice, a release inside; um_release_after with a user event
 *    holding the block back from the pool (the rest:
 *    conformance/test_access_n.c).
 * The test links libOpenCL itself (the library never does). */
#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>
#include <unistd.h>

#include "opencl_util.h"

#define N 4096 /* elements of the vectors */

static const char *kernel_source =
    "__kernel void add(__global const int *a, __global const int *b, __global int *c) {\n"
    "  size_t i = get_global_id(0); c[i] = a[i] + b[i];\n"
    "}\n"
    "__kernel void axpb(__global int *x, int a, int b) {\n"
    "  size_t i = get_global_id(0); x[i] = a * x[i] + b;\n"
    "}\n"
    "__kernel void madd(__global const int *a, __global const int *b, __global int *c) {\n"
    "  size_t i = get_global_id(0); c[i] = a[i] * b[i] + c[i];\n"
    "}\n"
    "__kernel void slow_fill(__global int *x, int v, int rounds) {\n"
    "  size_t i = get_global_id(0); int acc = 0;\n"
    "  for (int r = 0; r < rounds; r++) acc += r & 1;\n"
    "  x[i] = v + (acc & 0);\n"
    "}\n";

typedef struct kdev {
  um_device *d;
  um_device_native nat;
  cl_program program;
  cl_kernel add, axpb, slow_fill, madd;
} kdev;

static void build(kdev *k, um_device *d) {
  cl_int err;
  cl_device_id id;
  memset(k, 0, sizeof(*k));
  k->d = d;
  cr_assert_eq(um_device_native_get(d, &k->nat), UM_OK);
  cr_assert_str_eq(k->nat.backend, "opencl");
  cr_assert_not_null(k->nat.cl_context);
  cr_assert_not_null(k->nat.cl_queue);
  id = (cl_device_id)k->nat.cl_device;
  k->program = clCreateProgramWithSource((cl_context)k->nat.cl_context, 1, &kernel_source, NULL, &err);
  cr_assert_eq(err, CL_SUCCESS);
  cr_assert_eq(clBuildProgram(k->program, 1, &id, "", NULL, NULL), CL_SUCCESS, "kernel build");
  k->add = clCreateKernel(k->program, "add", &err);
  cr_assert_eq(err, CL_SUCCESS);
  k->axpb = clCreateKernel(k->program, "axpb", &err);
  cr_assert_eq(err, CL_SUCCESS);
  k->slow_fill = clCreateKernel(k->program, "slow_fill", &err);
  cr_assert_eq(err, CL_SUCCESS);
  k->madd = clCreateKernel(k->program, "madd", &err);
  cr_assert_eq(err, CL_SUCCESS);
}

static void unbuild(kdev *k) {
  clReleaseKernel(k->add);
  clReleaseKernel(k->axpb);
  clReleaseKernel(k->slow_fill);
  clReleaseKernel(k->madd);
  clReleaseProgram(k->program);
}

static cl_mem mem_of(um_buffer *b) {
  um_buffer_native bn;
  cr_assert_eq(um_buffer_native_get(b, &bn), UM_OK);
  cr_assert_not_null(bn.cl_mem);
  cr_assert_eq(bn.offset, 0);
  return (cl_mem)bn.cl_mem;
}

/* In x's open bracket (wait its handle): run x = a * x + b on x's device
 * and end the bracket; no host wait. */
static void axpb_after(kdev *k, um_buffer *x, int a, int b, void *wait) {
  cl_event done = NULL;
  cl_mem mem = mem_of(x);
  size_t global = N;
  cr_assert_eq(clSetKernelArg(k->axpb, 0, sizeof(mem), &mem), CL_SUCCESS);
  cr_assert_eq(clSetKernelArg(k->axpb, 1, sizeof(a), &a), CL_SUCCESS);
  cr_assert_eq(clSetKernelArg(k->axpb, 2, sizeof(b), &b), CL_SUCCESS);
  cr_assert_eq(clEnqueueNDRangeKernel((cl_command_queue)k->nat.cl_queue, k->axpb, 1, NULL, &global, NULL,
                                      wait ? 1 : 0, wait ? (cl_event *)&wait : NULL, &done),
               CL_SUCCESS);
  clFlush((cl_command_queue)k->nat.cl_queue);
  cr_assert_eq(um_access_end(x, done), UM_OK, "%s", um_last_error());
  clReleaseEvent(done);
}

/* Run x = a * x + b on x's device inside a bracket; no host wait. */
static void axpb(kdev *k, um_buffer *x, int a, int b) {
  void *wait = NULL;
  cr_assert_eq(um_access_begin(x, UM_MAP_READ_WRITE, &wait), UM_OK, "%s", um_last_error());
  axpb_after(k, x, a, b, wait);
}

static int *ints(size_t n, int (*f)(size_t)) {
  int *p = ub_malloc(n * sizeof(int));
  for (size_t i = 0; i < n; i++)
    p[i] = f(i);
  return p;
}

static int iota(size_t i) { return (int)i; }
static int triple(size_t i) { return (int)(3 * i + 1); }

/* ------------------------------------------------------------------------ */

OU_TEST_1_AND_2(opencl_kernels, vector_add) {
  ou_env e = ou_open(NULL, 1);
  kdev k;
  int *a = ints(N, iota), *b = ints(N, triple), *c = ub_malloc(N * sizeof(int));
  um_buffer *ba, *bb, *bc;
  void *wait_a = NULL, *wait_b = NULL, *wait_c = NULL;
  cl_event waits[3], done;
  cl_mem ma, mb, mc;
  size_t global = N;
  int nw = 0;
  build(&k, e.dev[e.ndev - 1]);
  ba = ub_alloc(e.m, k.d, N * sizeof(int), UM_DEVICE);
  bb = ub_alloc(e.m, k.d, N * sizeof(int), UM_DEVICE);
  bc = ub_alloc(e.m, k.d, N * sizeof(int), UM_DEVICE);
  cr_assert_eq(um_copy_from_host(ba, 0, a, N * sizeof(int), NULL), UM_OK);
  cr_assert_eq(um_copy_from_host(bb, 0, b, N * sizeof(int), NULL), UM_OK);
  cr_assert_eq(um_access_begin(ba, UM_MAP_READ, &wait_a), UM_OK);
  cr_assert_eq(um_access_begin(bb, UM_MAP_READ, &wait_b), UM_OK);
  cr_assert_eq(um_access_begin(bc, UM_MAP_WRITE_DISCARD, &wait_c), UM_OK);
  cr_assert_null(wait_a, "blocking copies finished: nothing to wait for");
  cr_assert_null(wait_c);
  void *ws[3] = {wait_a, wait_b, wait_c};
  for (int i = 0; i < 3; i++)
    if (ws[i] != NULL)
      waits[nw++] = (cl_event)ws[i];
  ma = mem_of(ba), mb = mem_of(bb), mc = mem_of(bc);
  clSetKernelArg(k.add, 0, sizeof(ma), &ma);
  clSetKernelArg(k.add, 1, sizeof(mb), &mb);
  clSetKernelArg(k.add, 2, sizeof(mc), &mc);
  cr_assert_eq(clEnqueueNDRangeKernel((cl_command_queue)k.nat.cl_queue, k.add, 1, NULL, &global, NULL, (cl_uint)nw,
                                      nw ? waits : NULL, &done),
               CL_SUCCESS);
  cr_assert_eq(um_access_end(ba, done), UM_OK);
  cr_assert_eq(um_access_end(bb, done), UM_OK);
  cr_assert_eq(um_access_end(bc, done), UM_OK);
  clReleaseEvent(done);
  cr_assert_eq(um_buffer_valid(bc), UM_VALID_DEVICE, "the kernel's writes are on the device");
  cr_assert_eq(um_copy_to_host(bc, 0, c, N * sizeof(int), NULL), UM_OK);
  for (size_t i = 0; i < N; i++)
    cr_assert_eq(c[i], a[i] + b[i], "c[%zu]", i);
  um_release(ba), um_release(bb), um_release(bc);
  unbuild(&k);
  free(a), free(b), free(c);
  ou_close(&e);
}

/* copy in -> x*2+1 on the first device -> copy to the last device -> x*3
 * there -> copy back -> x+5 on the first -> copy out: every call returns at
 * once (asynchronous copies, brackets); the only wait is the last event. */
static void chain(ou_env *e, kdev *k0, kdev *k1) {
  int *in = ints(N, iota), *out = ub_malloc(N * sizeof(int));
  size_t bytes = N * sizeof(int);
  um_buffer *x0 = ub_alloc(e->m, k0->d, bytes, UM_DEVICE), *x1 = ub_alloc(e->m, k1->d, bytes, UM_DEVICE);
  um_event *ev[4];
  cr_assert_eq(um_copy_from_host(x0, 0, in, bytes, &ev[0]), UM_OK);
  axpb(k0, x0, 2, 1);
  cr_assert_eq(um_copy(x1, 0, x0, 0, bytes, &ev[1]), UM_OK);
  axpb(k1, x1, 3, 0);
  cr_assert_eq(um_copy(x0, 0, x1, 0, bytes, &ev[2]), UM_OK);
  axpb(k0, x0, 1, 5);
  cr_assert_eq(um_copy_to_host(x0, 0, out, bytes, &ev[3]), UM_OK);
  for (int i = 0; i < 3; i++)
    cr_assert_neq(um_event_query(ev[i]), UM_ECANCELED);
  cr_assert_eq(um_event_wait(ev[3]), UM_OK, "%s", um_last_error());
  for (int i = 0; i < 4; i++)
    um_event_release(ev[i]);
  for (size_t i = 0; i < N; i++)
    cr_assert_eq(out[i], (2 * (int)i + 1) * 3 + 5, "out[%zu] = %d", i, out[i]);
  um_release(x0), um_release(x1);
  free(in), free(out);
}

static atomic_int worker_runs;

static void count_worker_runs(um__test_point point, void *arg) {
  (void)arg;
  if (point == UM__TP_WORKER_RUN)
    atomic_fetch_add(&worker_runs, 1);
}

/* The last of e's devices in d's context (d itself when it is alone in
 * it). */
static um_device *last_in_context(const ou_env *e, um_device *d) {
  um_device_native nd, ni;
  cr_assert_eq(um_device_native_get(d, &nd), UM_OK);
  for (int i = e->ndev - 1; i >= 0; i--) {
    cr_assert_eq(um_device_native_get(e->dev[i], &ni), UM_OK);
    if (ni.cl_context == nd.cl_context)
      return e->dev[i];
  }
  return d;
}

/* ... and no host thread of unimem's in between: every step waits for the
 * one before on the device queues (wait lists across the context's
 * queues), so no worker runs an operation of the chain. That holds within
 * one context only: events and buffers never cross contexts, so the two
 * devices are the first and the last of the first device's context
 * (ou_open opens PoCL's platform alone, one context; chain_across_contexts
 * below is what happens between two). */
OU_TEST_1_AND_2(opencl_kernels, chain_across_devices_without_waiting) {
  ou_env e = ou_open(NULL, 1);
  kdev k0, k1;
  um_stats before = ut_stats(e.m, NULL), after;
  um_device *last = last_in_context(&e, e.dev[0]);
  if (e.ndev > 1 && last == e.dev[0]) {
    ou_close(&e);
    cr_skip_test("SKIPPED: %d OpenCL devices, but none shares the first one's context: a chain between "
                 "contexts goes through host threads (chain_across_contexts)",
                 e.ndev);
  }
  build(&k0, e.dev[0]);
  build(&k1, last);
  atomic_store(&worker_runs, 0);
  atomic_store(&um__test_hook, count_worker_runs);
  chain(&e, &k0, &k1);
  atomic_store(&um__test_hook, NULL);
  cr_assert_eq(atomic_load(&worker_runs), 0, "%d operations of the chain went through a worker",
               atomic_load(&worker_runs));
  after = ut_stats(e.m, NULL);
  if (e.ndev > 1)
    cr_assert_eq(after.xfer_peer - before.xfer_peer, 2, "the two copies between devices went peer to peer");
  else
    cr_assert_eq(after.xfer_local - before.xfer_local, 2);
  unbuild(&k0), unbuild(&k1);
  ou_close(&e);
}

/* The chain between two contexts: PoCL's device as the manager opened it,
 * and the same device again in a context of the test's own, adopted (what
 * a manager over two platforms has, e.g. PoCL beside NVIDIA's). Neither
 * context's events may stand in the other's wait lists nor its buffers in
 * its commands: the two copies between the devices are staged through
 * host memory by unimem's workers, and the result is still exact. */
Test(opencl_kernels, chain_across_contexts) {
  const char *kind = getenv("UNIMEM_TEST_POCL_DEVICE");
  if (kind != NULL && strcmp(kind, "basic") == 0)
    cr_skip_test("SKIP: PoCL's basic device runs a command waiting for a gate inside clSetUserEventStatus, "
                 "which deadlocks in PoCL 3.1 (opencl/devices.c: submit_lock); the staged copies open gates");
  ou_env e;
  kdev k0, k1;
  um_device_native nat;
  um_device *other = NULL;
  cl_device_id id;
  cl_context context;
  cl_command_queue queue;
  cl_int err;
  um_stats before, after;
  ou_want_devices(1);
  e = ou_open(NULL, 1);
  cr_assert_eq(um_device_native_get(e.dev[0], &nat), UM_OK);
  id = (cl_device_id)nat.cl_device;
  context = clCreateContext(NULL, 1, &id, NULL, NULL, &err);
  cr_assert_eq(err, CL_SUCCESS);
  queue = clCreateCommandQueueWithProperties(context, id, NULL, &err);
  cr_assert_eq(err, CL_SUCCESS);
  cr_assert_eq(um_device_adopt_opencl(e.m, context, id, queue, &other), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_peer_enabled(e.dev[0], other), 0, "no peer access between contexts");
  build(&k0, e.dev[0]);
  build(&k1, other);
  before = ut_stats(e.m, NULL);
  atomic_store(&worker_runs, 0);
  atomic_store(&um__test_hook, count_worker_runs);
  chain(&e, &k0, &k1);
  atomic_store(&um__test_hook, NULL);
  after = ut_stats(e.m, NULL);
  cr_assert_eq(after.xfer_staged - before.xfer_staged, 2, "the copies between the contexts were staged");
  cr_assert_eq(after.xfer_peer - before.xfer_peer, 0);
  cr_assert_geq(atomic_load(&worker_runs), 2, "the staged copies ran on workers (%d operations did)",
                atomic_load(&worker_runs));
  unbuild(&k0), unbuild(&k1);
  ou_close(&e);
  clReleaseCommandQueue(queue);
  clReleaseContext(context);
}

/* A copy already queued on unimem's queue (behind a kernel the test holds
 * with a user event) is no command of the caller's queue: the next bracket
 * on its destination hands out its token to wait for. */
OU_TEST_1_AND_2(opencl_kernels, bracket_after_a_queued_copy) {
  const char *kind = getenv("UNIMEM_TEST_POCL_DEVICE");
  if (kind != NULL && strcmp(kind, "basic") == 0)
    cr_skip_test("SKIP: PoCL's basic device runs every queue's commands on one thread in order: a kernel "
                 "held by a user event would hold the whole device");
  ou_env e = ou_open(NULL, 1);
  kdev k;
  size_t bytes = N * sizeof(int), global = N;
  int *in = ints(N, iota), *out = ub_malloc(bytes), one = 1, zero = 0;
  um_buffer *s, *x;
  um_event *copied;
  void *wait = NULL;
  cl_event hold, held_done;
  cl_int err;
  cl_mem ms;
  build(&k, e.dev[0]);
  s = ub_alloc(e.m, k.d, bytes, UM_DEVICE);
  x = ub_alloc(e.m, k.d, bytes, UM_DEVICE);
  cr_assert_eq(um_copy_from_host(s, 0, in, bytes, NULL), UM_OK);
  hold = clCreateUserEvent((cl_context)k.nat.cl_context, &err);
  cr_assert_eq(err, CL_SUCCESS);
  cr_assert_eq(um_access_begin(s, UM_MAP_READ_WRITE, &wait), UM_OK);
  cr_assert_null(wait);
  ms = mem_of(s);
  clSetKernelArg(k.axpb, 0, sizeof(ms), &ms);
  clSetKernelArg(k.axpb, 1, sizeof(one), &one);
  clSetKernelArg(k.axpb, 2, sizeof(zero), &zero);
  cr_assert_eq(clEnqueueNDRangeKernel((cl_command_queue)k.nat.cl_queue, k.axpb, 1, NULL, &global, NULL, 1, &hold,
                                      &held_done),
               CL_SUCCESS);
  clFlush((cl_command_queue)k.nat.cl_queue);
  cr_assert_eq(um_access_end(s, held_done), UM_OK);
  cr_assert_eq(um_copy(x, 0, s, 0, bytes, &copied), UM_OK);
  cr_assert_eq(um_event_query(copied), UM_EAGAIN, "the copy waits for the held kernel");
  cr_assert_eq(um_access_begin(x, UM_MAP_READ_WRITE, &wait), UM_OK);
  cr_assert_not_null(wait, "the copy into x is still queued: the kernel must wait for it");
  axpb_after(&k, x, 2, 1, wait);
  cr_assert_eq(clSetUserEventStatus(hold, CL_COMPLETE), CL_SUCCESS);
  cr_assert_eq(um_copy_to_host(x, 0, out, bytes, NULL), UM_OK);
  for (size_t i = 0; i < N; i++)
    cr_assert_eq(out[i], 2 * (int)i + 1, "out[%zu] = %d", i, out[i]);
  cr_assert_eq(um_event_wait(copied), UM_OK);
  um_event_release(copied);
  clReleaseEvent(held_done);
  clReleaseEvent(hold);
  um_release(s), um_release(x);
  unbuild(&k);
  free(in), free(out);
  ou_close(&e);
}

/* A kernel's writes are what um_map fetches afterwards. */
OU_TEST_1_AND_2(opencl_kernels, kernel_writes_then_map) {
  ou_env e = ou_open(NULL, 1);
  kdev k;
  int *in = ints(N, iota), *p = NULL;
  um_buffer *x;
  build(&k, e.dev[0]);
  x = ub_alloc(e.m, k.d, N * sizeof(int), UM_DEVICE);
  cr_assert_eq(um_copy_from_host(x, 0, in, N * sizeof(int), NULL), UM_OK);
  cr_assert_eq(um_map(x, UM_MAP_READ, 0, 16, (void **)&p), UM_OK);
  cr_assert_eq(um_unmap(x, p), UM_OK, "a host copy is current now");
  axpb(&k, x, 7, -2);
  cr_assert_eq(um_map(x, UM_MAP_READ, 0, N * sizeof(int), (void **)&p), UM_OK);
  for (size_t i = 0; i < N; i++)
    cr_assert_eq(p[i], 7 * (int)i - 2, "p[%zu]", i);
  cr_assert_eq(um_unmap(x, p), UM_OK);
  um_release(x);
  unbuild(&k);
  free(in);
  ou_close(&e);
}

/* A kernel still to write x when x is released (it waits for a user event
 * the test holds): x's block returns to the pool only once the kernel
 * finished, so a new buffer of the same size cannot receive its writes. */
OU_TEST_1_AND_2(opencl_kernels, kernel_racing_a_release) {
  const char *kind = getenv("UNIMEM_TEST_POCL_DEVICE");
  if (kind != NULL && strcmp(kind, "basic") == 0)
    cr_skip_test("SKIP: PoCL's basic device runs every queue's commands on one thread in order: a kernel "
                 "held by a user event would hold unimem's fill too");
  ou_env e = ou_open(NULL, 1);
  kdev k;
  int *back = ub_malloc(N * sizeof(int)), v = 77, rounds = 1;
  um_buffer *x, *y, *p, *q;
  void *wait = NULL;
  cl_event hold;
  cl_int err;
  cl_mem mem;
  size_t global = N;
  build(&k, e.dev[0]);
  x = ub_alloc(e.m, k.d, N * sizeof(int), UM_DEVICE);
  mem = mem_of(x);
  hold = clCreateUserEvent((cl_context)k.nat.cl_context, &err);
  cr_assert_eq(err, CL_SUCCESS);
  cr_assert_eq(um_access_begin(x, UM_MAP_WRITE_DISCARD, &wait), UM_OK);
  clSetKernelArg(k.slow_fill, 0, sizeof(mem), &mem);
  clSetKernelArg(k.slow_fill, 1, sizeof(v), &v);
  clSetKernelArg(k.slow_fill, 2, sizeof(rounds), &rounds);
  cr_assert_eq(clEnqueueNDRangeKernel((cl_command_queue)k.nat.cl_queue, k.slow_fill, 1, NULL, &global, NULL, 1,
                                      &hold, NULL),
               CL_SUCCESS);
  clFlush((cl_command_queue)k.nat.cl_queue);
  cr_assert_eq(um_release(x), UM_OK, "the release ends the bracket behind the caller's queue");
  y = ub_alloc(e.m, k.d, N * sizeof(int), UM_DEVICE);
  cr_assert_neq(y, x, "x's block is still the kernel's");
  cr_assert_eq(um_fill(y, 0, 0x11, N * sizeof(int), NULL), UM_OK);
  cr_assert_eq(clSetUserEventStatus(hold, CL_COMPLETE), CL_SUCCESS);
  cr_assert_eq(clFinish((cl_command_queue)k.nat.cl_queue), CL_SUCCESS);
  cr_assert_eq(um_device_synchronize(k.d), UM_OK);
  cr_assert_eq(um_copy_to_host(y, 0, back, N * sizeof(int), NULL), UM_OK);
  for (size_t i = 0; i < N; i++)
    cr_assert_eq((unsigned)back[i], 0x11111111u, "y[%zu] was written by x's kernel", i);
  /* Now x's block is back in the pool (with y's, once released): the next
   * two allocations take both, one of them x's, with the kernel's bytes. */
  cr_assert_eq(um_release(y), UM_OK);
  p = ub_alloc(e.m, k.d, N * sizeof(int), UM_DEVICE);
  q = ub_alloc(e.m, k.d, N * sizeof(int), UM_DEVICE);
  cr_assert(p == x || q == x, "the released block returned to the pool after the kernel");
  cr_assert_eq(um_copy_to_host(x, 0, back, N * sizeof(int), NULL), UM_OK);
  for (size_t i = 0; i < N; i++)
    cr_assert_eq(back[i], 77, "x[%zu]", i);
  um_release(p), um_release(q);
  clReleaseEvent(hold);
  unbuild(&k);
  free(back);
  ou_close(&e);
}

/* PoCL's platform (the first platform is a GPU's where the machine has one:
 * ocl-icd lists them first), or a skip. */
static cl_platform_id pocl_platform(void) {
  cl_platform_id platforms[16];
  cl_uint n = 0;
  char name[128];
  cl_int err = clGetPlatformIDs(16, platforms, &n);
  if (err != CL_SUCCESS && err != -1001 /* CL_PLATFORM_NOT_FOUND_KHR */)
    cr_assert_fail("clGetPlatformIDs: %d", (int)err);
  for (cl_uint i = 0; err == CL_SUCCESS && i < n && i < 16; i++)
    if (clGetPlatformInfo(platforms[i], CL_PLATFORM_NAME, sizeof(name), name, NULL) == CL_SUCCESS &&
        strstr(name, OU_POCL_PLATFORM) != NULL)
      return platforms[i];
  cr_skip_test("SKIPPED: no PoCL platform here (install pocl-opencl-icd)");
  return NULL;
}

/* The chain in a context and queue of the test's own: every device of
 * PoCL's platform in one context, adopted into a manager that opened no
 * OpenCL device itself. */
/* A queue's or context's reference count once the driver settled: PoCL
 * drops a finished event's references to its queue and context on its own
 * thread, after the completion callbacks that finished unimem's work ran,
 * so right after um_manager_destroy a count can still be one too high for
 * a moment. Waits up to 5 s for 1; returns the count it ended with. */
static cl_uint settled_refs(cl_command_queue q, cl_context c) {
  cl_uint refs = 0;
  for (int t = 0; t < 5000; t++) {
    cl_int err = q != NULL ? clGetCommandQueueInfo(q, CL_QUEUE_REFERENCE_COUNT, sizeof(refs), &refs, NULL)
                           : clGetContextInfo(c, CL_CONTEXT_REFERENCE_COUNT, sizeof(refs), &refs, NULL);
    cr_assert_eq(err, CL_SUCCESS);
    if (refs == 1)
      break;
    usleep(1000);
  }
  return refs;
}

OU_TEST_1_AND_2(opencl_kernels, chain_in_an_adopted_context) {
  um_options o;
  um_manager *m;
  cl_platform_id platform;
  cl_device_id ids[2];
  cl_uint n = 0;
  cl_int err;
  cl_context context;
  cl_command_queue queues[2];
  kdev k[2];
  ou_env e;
  ou_options(&o);
  snprintf(o.backends, sizeof(o.backends), "cpu"); /* OpenCL only through adoption */
  platform = pocl_platform();
  cr_assert_eq(clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, 2, ids, &n), CL_SUCCESS);
  context = clCreateContext(NULL, n, ids, NULL, NULL, &err);
  cr_assert_eq(err, CL_SUCCESS);
  cr_assert_eq(um_manager_create(&o, &m), UM_OK);
  cr_assert_eq(um_device_count(m), 1);
  {
    /* This thread's cache is made now, for one device: the adopted ones
     * come after it and must not be counted in it (a read past its
     * counters under ASan, before the fix). */
    um_buffer *early = NULL;
    cr_assert_eq(um_alloc(m, um_device_get(m, 0), 64, UM_HOST, 0, &early), UM_OK);
    cr_assert_eq(um_release(early), UM_OK);
  }
  for (cl_uint i = 0; i < n; i++) {
    um_device *d = NULL;
    um_device_info info;
    queues[i] = clCreateCommandQueueWithProperties(context, ids[i], NULL, &err);
    cr_assert_eq(err, CL_SUCCESS);
    cr_assert_eq(um_device_adopt_opencl(m, context, ids[i], queues[i], &d), UM_OK, "%s", um_last_error());
    cr_assert_eq(um_device_info_get(d, &info), UM_OK);
    cr_assert_str_eq(info.backend, "opencl");
    cr_assert_eq(info.index, (int)i + 1);
    build(&k[i], d);
    cr_assert_eq(k[i].nat.cl_context, (void *)context);
    cr_assert_eq(k[i].nat.cl_queue, (void *)queues[i], "the caller's queue is the caller queue");
  }
  cr_assert_eq(um_device_count(m), 1 + (int)n);
  if (n > 1)
    cr_assert_eq(um_peer_enabled(k[0].d, k[1].d), 1, "peer access within the adopted context");
  e.m = m;
  e.ndev = (int)n;
  chain(&e, &k[0], &k[n - 1]);
  for (cl_uint i = 0; i < n; i++)
    unbuild(&k[i]);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
  /* unimem released its references: the caller's are the last. */
  for (cl_uint i = 0; i < n; i++) {
    cr_assert_eq(settled_refs(queues[i], NULL), 1);
    clReleaseCommandQueue(queues[i]);
  }
  cr_assert_eq(settled_refs(NULL, context), 1);
  clReleaseContext(context);
}

/* Bad input of OpenCL's own: a done event of another context, a queue of
 * another context to adopt, um_release_after's bad events (another
 * context's, a cl_mem; a buffer mapped); exact codes, statistics
 * unchanged. (What every backend answers alike: conformance/test_access.c,
 * bad_brackets_and_handles.) */
OU_TEST_1_AND_2(opencl_kernels, bad_brackets) {
  ou_env e = ou_open(NULL, 1);
  um_buffer *x = ub_alloc(e.m, e.dev[0], 4096, UM_DEVICE);
  void *wait = NULL, *mapped = NULL;
  cl_int err;
  cl_device_id id;
  cl_context other;
  cl_event foreign;
  um_device_native nat;
  ut_snapshot before;
  cr_assert_eq(um_device_native_get(e.dev[0], &nat), UM_OK);
  id = (cl_device_id)nat.cl_device;
  other = clCreateContext(NULL, 1, &id, NULL, NULL, &err);
  foreign = clCreateUserEvent(other, &err);
  before = ut_snap(e.m);
  cr_assert_eq(um_access_begin(x, UM_MAP_WRITE, &wait), UM_OK);
  cr_assert_eq(um_access_end(x, foreign), UM_EINVAL, "an event of another context");
  cr_assert_eq(um_access_end(x, NULL), UM_OK);
  cr_assert_eq(um_device_adopt_opencl(e.m, NULL, id, nat.cl_queue, &(um_device *){NULL}), UM_EINVAL);
  cr_assert_eq(um_device_adopt_opencl(e.m, other, id, nat.cl_queue, &(um_device *){NULL}), UM_EINVAL,
               "a queue of another context");
  cr_assert_eq(um_release_after(x, foreign), UM_EINVAL, "an event of another context");
  cr_assert_eq(um_release_after(x, mem_of(x)), UM_EINVAL, "a cl_mem");
  cr_assert_eq(um_buffer_size(x), 4096, "still live");
  ut_assert_unchanged(e.m, before);
  cr_assert_eq(um_map(x, UM_MAP_READ, 0, 16, &mapped), UM_OK);
  cr_assert_eq(um_release_after(x, foreign), UM_EINVAL, "the event is checked first");
  clReleaseEvent(foreign);
  foreign = clCreateUserEvent((cl_context)nat.cl_context, &err);
  cr_assert_eq(um_release_after(x, foreign), UM_ESTATE, "mapped");
  cr_assert_eq(um_unmap(x, mapped), UM_OK);
  cr_assert_eq(clSetUserEventStatus(foreign, CL_COMPLETE), CL_SUCCESS);
  cr_assert_eq(um_release_after(x, foreign), UM_OK);
  clReleaseEvent(foreign);
  clReleaseContext(other);
  ou_close(&e);
}

/* um_event_native: the cl_event of an operation on a device queue. */
OU_TEST_1_AND_2(opencl_kernels, event_native) {
  ou_env e = ou_open(NULL, 1);
  unsigned char src[4096] = {1};
  um_buffer *x = ub_alloc(e.m, e.dev[0], 4096, UM_DEVICE), *h = ub_alloc(e.m, e.dev[0], 4096, UM_HOST);
  um_event *ev;
  void *native = NULL;
  cl_int status = 0;
  cr_assert_eq(um_copy_from_host(x, 0, src, sizeof(src), &ev), UM_OK);
  cr_assert_eq(um_event_native(ev, &native), UM_OK);
  cr_assert_not_null(native);
  cr_assert_eq(clWaitForEvents(1, (cl_event *)&native), CL_SUCCESS);
  cr_assert_eq(clGetEventInfo((cl_event)native, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof(status), &status, NULL),
               CL_SUCCESS);
  cr_assert_eq(status, CL_COMPLETE);
  cr_assert_eq(um_event_wait(ev), UM_OK);
  cr_assert_eq(um_event_native(ev, &native), UM_OK, "still valid after completion, until released");
  cr_assert_eq(um_event_release(ev), UM_OK);
  cr_assert_eq(um_event_native(ev, &native), UM_ESTATE);
  cr_assert_eq(um_copy_from_host(h, 0, src, sizeof(src), &ev), UM_OK);
  cr_assert_eq(um_event_native(ev, &native), UM_ENOTSUP, "host memory: a memcpy on a host thread");
  um_event_release(ev);
  um_release(x), um_release(h);
  ou_close(&e);
}

/* ------------------------------------------------------------------------ */
/* Brackets over several buffers (um_access_begin_n / um_access_end_n) and
 * um_release_after, with the caller's kernels */

static int on_basic(void) {
  const char *kind = getenv("UNIMEM_TEST_POCL_DEVICE");
  return kind != NULL && strcmp(kind, "basic") == 0;
}

#define SKIP_ON_BASIC(why)                                                                             \
  do {                                                                                                 \
    if (on_basic())                                                                                    \
      cr_skip_test("SKIP: PoCL's basic device runs every queue's commands on one thread in order: " why); \
  } while (0)

static cl_int event_status(void *ev) {
  cl_int status = 0;
  cr_assert_eq(clGetEventInfo((cl_event)ev, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof(status), &status, NULL),
               CL_SUCCESS);
  return status;
}

static cl_event user_event(const kdev *k) {
  cl_int err;
  cl_event ev = clCreateUserEvent((cl_context)k->nat.cl_context, &err);
  cr_assert_eq(err, CL_SUCCESS);
  return ev;
}

/* x's bracket ended behind hold (a user event the test sets later): what
 * is issued on x next waits for it on the device. */
static void hold_buffer(um_buffer *x, cl_event hold) {
  void *wait = NULL;
  cr_assert_eq(um_access_begin(x, UM_MAP_READ, &wait), UM_OK);
  cr_assert_eq(um_access_end(x, hold), UM_OK, "%s", um_last_error());
}

/* c = a * b + c, an SGEMM-shaped step over three buffers of one device:
 * the buffers (a = i, b = 3i + 1, c = i), the kernel's arguments set, and
 * the check of c. */
typedef struct madd_step {
  ou_env e;
  kdev k;
  int *v[3], *out;
  um_buffer *b[3];
} madd_step;

static const um_map_mode madd_modes[3] = {UM_MAP_READ, UM_MAP_READ, UM_MAP_READ_WRITE};

static void madd_open(madd_step *s) {
  s->e = ou_open(NULL, 1);
  build(&s->k, s->e.dev[s->e.ndev - 1]);
  s->v[0] = ints(N, iota), s->v[1] = ints(N, triple), s->v[2] = ints(N, iota);
  s->out = ub_malloc(N * sizeof(int));
  /* All allocated first: a new block's migration queues behind what a test
   * holds on the device's queue. */
  for (int i = 0; i < 3; i++) {
    cl_mem mem;
    s->b[i] = ub_alloc(s->e.m, s->k.d, N * sizeof(int), UM_DEVICE);
    mem = mem_of(s->b[i]);
    cr_assert_eq(clSetKernelArg(s->k.madd, (cl_uint)i, sizeof(cl_mem), &mem), CL_SUCCESS);
  }
}

/* The kernel on the caller's queue after wait (NULL: none); its event. */
static cl_event madd_run(madd_step *s, void *wait) {
  size_t global = N;
  cl_event done = NULL;
  cr_assert_eq(clEnqueueNDRangeKernel((cl_command_queue)s->k.nat.cl_queue, s->k.madd, 1, NULL, &global, NULL,
                                      wait ? 1 : 0, wait ? (cl_event *)&wait : NULL, &done),
               CL_SUCCESS);
  clFlush((cl_command_queue)s->k.nat.cl_queue);
  return done;
}

/* c read back holds a * b + c, every element; then everything goes. */
static void madd_check_close(madd_step *s) {
  cr_assert_eq(um_copy_to_host(s->b[2], 0, s->out, N * sizeof(int), NULL), UM_OK);
  for (size_t i = 0; i < N; i++)
    cr_assert_eq(s->out[i], s->v[0][i] * s->v[1][i] + s->v[2][i], "c[%zu] = %d", i, s->out[i]);
  for (int i = 0; i < 3; i++) {
    um_release(s->b[i]);
    free(s->v[i]);
  }
  free(s->out);
  unbuild(&s->k);
  ou_close(&s->e);
}

/* Each buffer with an upload still pending (held behind the test's user
 * event): one wait handle for the three, which completes only once the
 * uploads have, the kernel behind it, one end with the kernel's event. The
 * kernel saw every uploaded value. */
OU_TEST_1_AND_2(opencl_kernels, one_wait_for_three_pending_uploads) {
  SKIP_ON_BASIC("an upload held by a user event would hold the whole device");
  madd_step s;
  um_event *up[3];
  void *wait = NULL;
  cl_event hold, done;
  madd_open(&s);
  hold = user_event(&s.k);
  for (int i = 0; i < 3; i++) {
    hold_buffer(s.b[i], hold);
    cr_assert_eq(um_copy_from_host(s.b[i], 0, s.v[i], N * sizeof(int), &up[i]), UM_OK);
  }
  cr_assert_eq(um_access_begin_n(s.b, madd_modes, 3, &wait), UM_OK, "%s", um_last_error());
  cr_assert_not_null(wait, "three uploads are pending");
  for (int i = 0; i < 3; i++) {
    void *own = NULL;
    if (um_event_native(up[i], &own) == UM_OK)
      cr_assert_neq(wait, own, "one handle for the three, not upload %d's", i);
  }
  cr_assert_gt(event_status(wait), CL_COMPLETE, "the uploads are held");
  done = madd_run(&s, wait);
  cr_assert_eq(um_access_end_n(s.b, 3, done), UM_OK, "%s", um_last_error());
  cr_assert_eq(clSetUserEventStatus(hold, CL_COMPLETE), CL_SUCCESS);
  cr_assert_eq(clWaitForEvents(1, &done), CL_SUCCESS);
  for (int i = 0; i < 3; i++) {
    cr_assert_eq(um_event_wait(up[i]), UM_OK);
    um_event_release(up[i]);
  }
  clReleaseEvent(done);
  clReleaseEvent(hold);
  madd_check_close(&s);
}

/* The same three buffers with one upload pending (held behind the test's
 * user event, so that it is queued on the device with its own event): the
 * handle is that upload's own event, what um_access_begin would give; with
 * nothing pending, NULL. */
OU_TEST_1_AND_2(opencl_kernels, begin_n_with_one_or_no_pending_upload) {
  SKIP_ON_BASIC("an upload held by a user event would hold the whole device");
  madd_step s;
  um_event *up;
  void *wait = (void *)1, *own = NULL;
  cl_event hold, done;
  madd_open(&s);
  hold = user_event(&s.k);
  cr_assert_eq(um_copy_from_host(s.b[0], 0, s.v[0], N * sizeof(int), NULL), UM_OK);
  cr_assert_eq(um_copy_from_host(s.b[1], 0, s.v[1], N * sizeof(int), NULL), UM_OK);
  hold_buffer(s.b[2], hold);
  cr_assert_eq(um_copy_from_host(s.b[2], 0, s.v[2], N * sizeof(int), &up), UM_OK);
  cr_assert_eq(um_access_begin_n(s.b, madd_modes, 3, &wait), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_event_native(up, &own), UM_OK, "the upload is queued on the device");
  cr_assert_eq(wait, own, "one buffer has something pending: its own handle");
  done = madd_run(&s, wait);
  cr_assert_eq(um_access_end_n(s.b, 3, done), UM_OK);
  cr_assert_eq(clSetUserEventStatus(hold, CL_COMPLETE), CL_SUCCESS);
  cr_assert_eq(clWaitForEvents(1, &done), CL_SUCCESS);
  clReleaseEvent(done);
  clReleaseEvent(hold);
  cr_assert_eq(um_event_wait(up), UM_OK);
  um_event_release(up);
  cr_assert_eq(um_device_synchronize(s.k.d), UM_OK, "the brackets themselves finished");
  cr_assert_eq(um_access_begin_n(s.b, madd_modes, 3, &wait), UM_OK);
  cr_assert_null(wait, "nothing pending on any of them");
  cr_assert_eq(um_access_end_n(s.b, 3, NULL), UM_OK);
  madd_check_close(&s);
}

/* x listed twice, READ and WRITE_DISCARD: one READ_WRITE bracket. x had a
 * current host copy (mapped and unmapped); the kernel's writes make the
 * device copy the current one, and what is read afterwards, by a copy and
 * by a map, is the kernel's. */
OU_TEST_1_AND_2(opencl_kernels, same_buffer_twice_upgrades_the_mode) {
  ou_env e = ou_open(NULL, 1);
  kdev k;
  int *in = ints(N, iota), *out = ub_malloc(N * sizeof(int)), *p = NULL;
  um_buffer *x;
  um_map_mode modes[2] = {UM_MAP_READ, UM_MAP_WRITE_DISCARD};
  build(&k, e.dev[0]);
  x = ub_alloc(e.m, k.d, N * sizeof(int), UM_DEVICE);
  cr_assert_eq(um_copy_from_host(x, 0, in, N * sizeof(int), NULL), UM_OK);
  cr_assert_eq(um_map(x, UM_MAP_READ, 0, 16, (void **)&p), UM_OK);
  cr_assert_eq(um_unmap(x, p), UM_OK);
  um_buffer *twice[2] = {x, x};
  void *wait = NULL;
  cl_event done;
  cl_mem mem = mem_of(x);
  size_t global = N;
  int a = 5, b = 3;
  cr_assert_eq(um_access_begin_n(twice, modes, 2, &wait), UM_OK, "%s", um_last_error());
  clSetKernelArg(k.axpb, 0, sizeof(mem), &mem);
  clSetKernelArg(k.axpb, 1, sizeof(a), &a);
  clSetKernelArg(k.axpb, 2, sizeof(b), &b);
  cr_assert_eq(clEnqueueNDRangeKernel((cl_command_queue)k.nat.cl_queue, k.axpb, 1, NULL, &global, NULL,
                                      wait ? 1 : 0, wait ? (cl_event *)&wait : NULL, &done),
               CL_SUCCESS);
  cr_assert_eq(um_access_end_n(twice, 2, done), UM_OK);
  clReleaseEvent(done);
  cr_assert_eq(um_buffer_valid(x), UM_VALID_DEVICE, "the kernel's writes are on the device");
  cr_assert_eq(um_copy_to_host(x, 0, out, N * sizeof(int), NULL), UM_OK);
  for (size_t i = 0; i < N; i++)
    cr_assert_eq(out[i], 5 * (int)i + 3, "x[%zu] = %d", i, out[i]);
  cr_assert_eq(um_map(x, UM_MAP_READ, 0, N * sizeof(int), (void **)&p), UM_OK);
  for (size_t i = 0; i < N; i++)
    cr_assert_eq(p[i], 5 * (int)i + 3, "mapped x[%zu] = %d", i, p[i]);
  cr_assert_eq(um_unmap(x, p), UM_OK);
  um_release(x);
  unbuild(&k);
  free(in), free(out);
  ou_close(&e);
}

/* y of {x, y, z} released inside the open brackets; the kernels on x and z
 * are held by the test's user event. end_n skips y and ends x and z behind
 * the kernel's event: copies issued on them afterwards wait for it, and
 * read the kernel's values. */
OU_TEST_1_AND_2(opencl_kernels, release_inside_an_n_bracket) {
  SKIP_ON_BASIC("a kernel held by a user event would hold the whole device");
  ou_env e = ou_open(NULL, 1);
  kdev k;
  size_t bytes = N * sizeof(int), global = N;
  int *in = ints(N, iota), *out = ub_malloc(bytes), one = 1, two = 2;
  um_buffer *x, *y, *z;
  um_map_mode modes[3] = {UM_MAP_READ_WRITE, UM_MAP_READ, UM_MAP_READ_WRITE};
  um_event *rx, *rz;
  void *wait = NULL;
  cl_event hold, ev[2];
  cl_mem mx, mz;
  build(&k, e.dev[0]);
  x = ub_alloc(e.m, k.d, bytes, UM_DEVICE), y = ub_alloc(e.m, k.d, bytes, UM_DEVICE);
  z = ub_alloc(e.m, k.d, bytes, UM_DEVICE);
  cr_assert_eq(um_copy_from_host(x, 0, in, bytes, NULL), UM_OK);
  cr_assert_eq(um_copy_from_host(z, 0, in, bytes, NULL), UM_OK);
  um_buffer *list[3] = {x, y, z};
  hold = user_event(&k);
  cr_assert_eq(um_access_begin_n(list, modes, 3, &wait), UM_OK);
  mx = mem_of(x), mz = mem_of(z);
  clSetKernelArg(k.axpb, 0, sizeof(mx), &mx), clSetKernelArg(k.axpb, 1, sizeof(one), &one);
  clSetKernelArg(k.axpb, 2, sizeof(one), &one);
  cr_assert_eq(clEnqueueNDRangeKernel((cl_command_queue)k.nat.cl_queue, k.axpb, 1, NULL, &global, NULL, 1, &hold,
                                      &ev[0]),
               CL_SUCCESS);
  clSetKernelArg(k.axpb, 0, sizeof(mz), &mz), clSetKernelArg(k.axpb, 1, sizeof(two), &two);
  cr_assert_eq(clEnqueueNDRangeKernel((cl_command_queue)k.nat.cl_queue, k.axpb, 1, NULL, &global, NULL, 1, &ev[0],
                                      &ev[1]),
               CL_SUCCESS);
  clFlush((cl_command_queue)k.nat.cl_queue);
  cr_assert_eq(um_release(y), UM_OK, "released inside: its release ends its bracket");
  cr_assert_eq(um_access_end_n(list, 3, ev[1]), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_copy_to_host(x, 0, out, bytes, &rx), UM_OK);
  cr_assert_eq(um_copy_to_host(z, 0, out, bytes, &rz), UM_OK);
  usleep(20000);
  cr_assert_eq(um_event_query(rx), UM_EAGAIN, "ordered after the held kernels");
  cr_assert_eq(um_event_query(rz), UM_EAGAIN);
  cr_assert_eq(clSetUserEventStatus(hold, CL_COMPLETE), CL_SUCCESS);
  cr_assert_eq(um_event_wait(rz), UM_OK);
  cr_assert_eq(um_event_wait(rx), UM_OK);
  cr_assert_eq(um_copy_to_host(x, 0, out, bytes, NULL), UM_OK);
  for (size_t i = 0; i < N; i++)
    cr_assert_eq(out[i], (int)i + 1, "x[%zu] = %d", i, out[i]);
  cr_assert_eq(um_copy_to_host(z, 0, out, bytes, NULL), UM_OK);
  for (size_t i = 0; i < N; i++)
    cr_assert_eq(out[i], 2 * (int)i + 1, "z[%zu] = %d", i, out[i]);
  um_event_release(rx), um_event_release(rz);
  clReleaseEvent(ev[0]), clReleaseEvent(ev[1]), clReleaseEvent(hold);
  um_release(x), um_release(z);
  unbuild(&k);
  free(in), free(out);
  ou_close(&e);
}

/* Buffers of two devices in one list: UM_EINVAL, nothing opened. */
Test(opencl_kernels, begin_n_over_two_devices_is_refused) {
  ou_want_devices(2);
  ou_env e = ou_open(NULL, 2);
  um_buffer *x = ub_alloc(e.m, e.dev[0], 256, UM_DEVICE), *y = ub_alloc(e.m, e.dev[1], 256, UM_DEVICE);
  um_buffer *list[2] = {x, y};
  um_map_mode modes[2] = {UM_MAP_READ, UM_MAP_READ};
  void *wait = NULL;
  cr_assert_eq(um_access_begin_n(list, modes, 2, &wait), UM_EINVAL);
  cr_assert_eq(um_access_begin(x, UM_MAP_READ, &wait), UM_OK, "x is free");
  cr_assert_eq(um_access_begin(y, UM_MAP_READ, &wait), UM_OK, "y is free");
  cr_assert_eq(um_access_end(x, NULL), UM_OK);
  cr_assert_eq(um_access_end(y, NULL), UM_OK);
  um_release(x), um_release(y);
  ou_close(&e);
}

/* The native handles of b's block. */
static um_buffer_native native_of(um_buffer *b) {
  um_buffer_native bn;
  cr_assert_eq(um_buffer_native_get(b, &bn), UM_OK);
  return bn;
}

/* um_release_after with a user event not yet set: the handle is released
 * at once, but a new allocation of the same size gets another block until
 * the event is set; then (once the manager saw it) the next one is a pool
 * hit on x's block. */
OU_TEST_1_AND_2(opencl_kernels, release_after_a_user_event) {
  ou_env e = ou_open(NULL, 1);
  kdev k;
  size_t bytes = N * sizeof(int);
  um_buffer *x, *y, *z;
  um_buffer_native nx, ny, nz;
  uint64_t hits;
  cl_event ev;
  build(&k, e.dev[0]);
  x = ub_alloc(e.m, k.d, bytes, UM_DEVICE);
  nx = native_of(x);
  ev = user_event(&k);
  cr_assert_eq(um_release_after(x, ev), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_buffer_size(x), 0, "the handle is released now");
  cr_assert_eq(um_release(x), UM_ESTATE, "released already");
  cr_assert_eq(ut_stats(e.m, NULL).active_buffers, 0);
  hits = ut_stats(e.m, k.d).pool_hits;
  y = ub_alloc(e.m, k.d, bytes, UM_DEVICE);
  ny = native_of(y);
  cr_assert_neq(y, x, "x's block waits for the event");
  cr_assert(ny.cl_mem != nx.cl_mem || ny.offset != nx.offset, "another block");
  cr_assert_eq(ut_stats(e.m, k.d).pool_hits, hits, "no pool hit");
  cr_assert_eq(um_release(y), UM_OK);
  usleep(20000);
  z = ub_alloc(e.m, k.d, bytes, UM_DEVICE);
  cr_assert_eq(z, y, "the pool holds y's block only");
  cr_assert_eq(um_release(z), UM_OK);
  cr_assert_eq(clSetUserEventStatus(ev, CL_COMPLETE), CL_SUCCESS);
  cr_assert_eq(um_device_synchronize(k.d), UM_OK);
  hits = ut_stats(e.m, k.d).pool_hits;
  y = ub_alloc(e.m, k.d, bytes, UM_DEVICE);
  z = ub_alloc(e.m, k.d, bytes, UM_DEVICE);
  cr_assert(y == x || z == x, "x's block went back to the pool after the event");
  nz = native_of(y == x ? y : z);
  cr_assert(nz.cl_mem == nx.cl_mem && nz.offset == nx.offset, "the same memory");
  cr_assert_eq(ut_stats(e.m, k.d).pool_hits, hits + 2, "both pool hits");
  um_release(y), um_release(z);
  clReleaseEvent(ev);
  unbuild(&k);
  ou_close(&e);
}

/* um_release_after of a buffer inside an open bracket, whose kernel is held
 * by the test: the bracket ends behind the kernel's event (not the caller's
 * queue), and the block returns only after the kernel wrote it. */
OU_TEST_1_AND_2(opencl_kernels, release_after_ends_the_bracket_behind_the_event) {
  const size_t bytes = N * sizeof(int), global = N;
  const int v = 91, rounds = 1;
  um_buffer *x, *y, *p, *q;
  void *wait = NULL;
  cl_event hold, done;
  cl_command_queue own;
  cl_int err;
  cl_mem mem;
  kdev k;
  ou_env e;
  int *back;
  SKIP_ON_BASIC("a kernel held by a user event would hold the whole device");
  e = ou_open(NULL, 1);
  back = ub_malloc(bytes);
  build(&k, e.dev[0]);
  /* A queue of the test's own: the caller's queue is not what unimem
   * orders the end behind here. */
  own = clCreateCommandQueueWithProperties((cl_context)k.nat.cl_context, (cl_device_id)k.nat.cl_device, NULL, &err);
  cr_assert_eq(err, CL_SUCCESS);
  x = ub_alloc(e.m, k.d, bytes, UM_DEVICE);
  mem = mem_of(x);
  hold = user_event(&k);
  cr_assert_eq(um_access_begin(x, UM_MAP_WRITE_DISCARD, &wait), UM_OK);
  clSetKernelArg(k.slow_fill, 0, sizeof(mem), &mem);
  clSetKernelArg(k.slow_fill, 1, sizeof(v), &v);
  clSetKernelArg(k.slow_fill, 2, sizeof(rounds), &rounds);
  cr_assert_eq(clEnqueueNDRangeKernel(own, k.slow_fill, 1, NULL, &global, NULL, 1, &hold, &done), CL_SUCCESS);
  clFlush(own);
  cr_assert_eq(um_release_after(x, done), UM_OK, "%s", um_last_error());
  clReleaseEvent(done); /* retained by unimem as long as it needs it */
  y = ub_alloc(e.m, k.d, bytes, UM_DEVICE);
  cr_assert_neq(y, x, "x's block is still the kernel's");
  cr_assert_eq(um_fill(y, 0, 0x22, bytes, NULL), UM_OK);
  cr_assert_eq(clSetUserEventStatus(hold, CL_COMPLETE), CL_SUCCESS);
  cr_assert_eq(clFinish(own), CL_SUCCESS);
  cr_assert_eq(um_device_synchronize(k.d), UM_OK);
  cr_assert_eq(um_copy_to_host(y, 0, back, bytes, NULL), UM_OK);
  for (size_t i = 0; i < N; i++)
    cr_assert_eq((unsigned)back[i], 0x22222222u, "y[%zu] was written by x's kernel", i);
  cr_assert_eq(um_release(y), UM_OK);
  p = ub_alloc(e.m, k.d, bytes, UM_DEVICE);
  q = ub_alloc(e.m, k.d, bytes, UM_DEVICE);
  cr_assert(p == x || q == x, "the block returned to the pool after the kernel");
  cr_assert_eq(um_copy_to_host(x, 0, back, bytes, NULL), UM_OK);
  for (size_t i = 0; i < N; i++)
    cr_assert_eq(back[i], 91, "x[%zu]", i);
  um_release(p), um_release(q);
  clReleaseEvent(hold);
  clReleaseCommandQueue(own);
  unbuild(&k);
  free(back);
  ou_close(&e);
}

/* um_release_after of a buffer with a second owner (um_buffer_retain): one
 * owner goes, the buffer stays live; the last um_release then gives it
 * back, and its block still waits for the event. */
OU_TEST_1_AND_2(opencl_kernels, release_after_of_a_retained_buffer) {
  ou_env e = ou_open(NULL, 1);
  um_buffer *x = ub_alloc(e.m, e.dev[0], 8192, UM_DEVICE), *y;
  um_device_native nat;
  cl_event ev;
  cl_int err;
  cr_assert_eq(um_device_native_get(e.dev[0], &nat), UM_OK);
  ev = clCreateUserEvent((cl_context)nat.cl_context, &err);
  cr_assert_eq(err, CL_SUCCESS);
  cr_assert_eq(um_buffer_retain(x), UM_OK);
  cr_assert_eq(um_release_after(x, ev), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_buffer_size(x), 8192, "the other owner keeps it live");
  cr_assert_eq(um_release(x), UM_OK, "the last owner");
  y = ub_alloc(e.m, e.dev[0], 8192, UM_DEVICE);
  cr_assert_neq(y, x, "x's block still waits for the event");
  cr_assert_eq(um_release(y), UM_OK);
  cr_assert_eq(clSetUserEventStatus(ev, CL_COMPLETE), CL_SUCCESS);
  cr_assert_eq(um_device_synchronize(e.dev[0]), UM_OK);
  cr_assert_eq(ut_stats(e.m, NULL).active_buffers, 0);
  clReleaseEvent(ev);
  ou_close(&e);
}
