/* The caller's own CUDA kernels on unimem buffers (SPEC §8), shared by the
 * test against the fake driver (test_fakecuda_kernels.c) and the one on a
 * real GPU (test_cuda_kernels_gpu.c). The kernels are hand-written PTX
 * (x = a * x + b, fill, add over int32), loaded with cuModuleLoadData into
 * the device's primary context; the fake driver runs the same text through
 * its registry of kernels. The test reaches the driver itself through its
 * own dlopen of the library the backend loaded (ck_load): nothing links
 * libcuda.
 *
 * Every check asserts every element. Where a step must still be pending
 * when the next one is issued (a bracket whose wait is a copy's event, or a
 * gate), the test holds its own kernel with a gate of its own -- a
 * cuStreamWaitValue32 on a page-locked word it writes later (ck_hold) --
 * instead of relying on timing. */
#ifndef UNIMEM_CUDA_KERNEL_CHECKS_H
#define UNIMEM_CUDA_KERNEL_CHECKS_H

#include <cuda.h>
#include <dlfcn.h>
#include <time.h>

#include "cuda_api_checks.h"

#define CK_N 4096        /* ints in the vectors */
#define CK_BIG (64 * 1024) /* ints: 256 KiB, more than one staging chunk */

/* ------------------------------------------------------------------------ */
/* The driver, as the test calls it                                          */

#define CK_ENTRY_POINTS(X)                                                     \
  X(cuCtxSetCurrent)                                                           \
  X(cuCtxGetCurrent)                                                           \
  X(cuModuleLoadData)                                                          \
  X(cuModuleGetFunction)                                                       \
  X(cuModuleUnload)                                                            \
  X(cuLaunchKernel)                                                            \
  X(cuStreamCreate)                                                            \
  X(cuStreamDestroy_v2)                                                        \
  X(cuStreamSynchronize)                                                       \
  X(cuStreamWaitEvent)                                                         \
  X(cuStreamWaitValue32_v2)                                                    \
  X(cuEventCreate)                                                             \
  X(cuEventDestroy_v2)                                                         \
  X(cuEventRecord)                                                             \
  X(cuEventQuery)                                                              \
  X(cuEventSynchronize)                                                        \
  X(cuMemHostAlloc)                                                            \
  X(cuMemFreeHost)                                                             \
  X(cuMemHostGetDevicePointer_v2)

typedef struct ck_driver {
#define CK_FIELD_(symbol) __typeof__(symbol) *symbol;
  CK_ENTRY_POINTS(CK_FIELD_)
#undef CK_FIELD_
} ck_driver;

static UT_UNUSED ck_driver ck;

/* The entry points of the driver library at path: the one the backend
 * loaded, so the same driver instance (dlopen gives the same handle). */
static UT_UNUSED void ck_load(const char *path) {
  void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  cr_assert_not_null(lib, "dlopen(%s): %s", path, dlerror());
#define CK_LOAD_(symbol)                                                       \
  do {                                                                         \
    void *sym_ = dlsym(lib, #symbol);                                          \
    cr_assert_not_null(sym_, "%s lacks %s", path, #symbol);                    \
    memcpy(&ck.symbol, &sym_, sizeof(sym_));                                   \
  } while (0);
  CK_ENTRY_POINTS(CK_LOAD_)
#undef CK_LOAD_
}

#define CK_CU(expr)                                                            \
  do {                                                                         \
    CUresult ck_r_ = (expr);                                                   \
    cr_assert_eq(ck_r_, CUDA_SUCCESS, "%s = CUresult %d", #expr, (int)ck_r_);  \
  } while (0)

/* ------------------------------------------------------------------------ */
/* Kernels                                                                   */

/* One thread per element: i = blockIdx.x * blockDim.x + threadIdx.x, and
 * threads past n do nothing. Written for this project; PTX ISA 7.0, which
 * every driver since CUDA 11.0 compiles for its GPU. */
static UT_UNUSED const char ck_ptx[] =
    ".version 7.0\n"
    ".target sm_50\n"
    ".address_size 64\n"
    "\n"
    "// x[i] = a * x[i] + b\n"
    ".visible .entry axpb(.param .u64 x, .param .u32 a, .param .u32 b, .param .u32 n)\n"
    "{\n"
    "  .reg .pred %p;\n"
    "  .reg .b32 %r<8>;\n"
    "  .reg .b64 %rd<4>;\n"
    "  mov.u32 %r0, %ctaid.x;\n"
    "  mov.u32 %r1, %ntid.x;\n"
    "  mov.u32 %r2, %tid.x;\n"
    "  mad.lo.u32 %r3, %r0, %r1, %r2;\n"
    "  ld.param.u32 %r4, [n];\n"
    "  setp.ge.u32 %p, %r3, %r4;\n"
    "  @%p bra DONE;\n"
    "  ld.param.u64 %rd0, [x];\n"
    "  cvta.to.global.u64 %rd1, %rd0;\n"
    "  mul.wide.u32 %rd2, %r3, 4;\n"
    "  add.u64 %rd3, %rd1, %rd2;\n"
    "  ld.global.u32 %r5, [%rd3];\n"
    "  ld.param.u32 %r6, [a];\n"
    "  ld.param.u32 %r7, [b];\n"
    "  mad.lo.u32 %r5, %r5, %r6, %r7;\n"
    "  st.global.u32 [%rd3], %r5;\n"
    "DONE:\n"
    "  ret;\n"
    "}\n"
    "\n"
    "// x[i] = v\n"
    ".visible .entry fill(.param .u64 x, .param .u32 v, .param .u32 n)\n"
    "{\n"
    "  .reg .pred %p;\n"
    "  .reg .b32 %r<6>;\n"
    "  .reg .b64 %rd<4>;\n"
    "  mov.u32 %r0, %ctaid.x;\n"
    "  mov.u32 %r1, %ntid.x;\n"
    "  mov.u32 %r2, %tid.x;\n"
    "  mad.lo.u32 %r3, %r0, %r1, %r2;\n"
    "  ld.param.u32 %r4, [n];\n"
    "  setp.ge.u32 %p, %r3, %r4;\n"
    "  @%p bra DONE;\n"
    "  ld.param.u64 %rd0, [x];\n"
    "  cvta.to.global.u64 %rd1, %rd0;\n"
    "  mul.wide.u32 %rd2, %r3, 4;\n"
    "  add.u64 %rd3, %rd1, %rd2;\n"
    "  ld.param.u32 %r5, [v];\n"
    "  st.global.u32 [%rd3], %r5;\n"
    "DONE:\n"
    "  ret;\n"
    "}\n"
    "\n"
    "// c[i] = a[i] + b[i]\n"
    ".visible .entry add(.param .u64 a, .param .u64 b, .param .u64 c, .param .u32 n)\n"
    "{\n"
    "  .reg .pred %p;\n"
    "  .reg .b32 %r<7>;\n"
    "  .reg .b64 %rd<10>;\n"
    "  mov.u32 %r0, %ctaid.x;\n"
    "  mov.u32 %r1, %ntid.x;\n"
    "  mov.u32 %r2, %tid.x;\n"
    "  mad.lo.u32 %r3, %r0, %r1, %r2;\n"
    "  ld.param.u32 %r4, [n];\n"
    "  setp.ge.u32 %p, %r3, %r4;\n"
    "  @%p bra DONE;\n"
    "  mul.wide.u32 %rd0, %r3, 4;\n"
    "  ld.param.u64 %rd1, [a];\n"
    "  cvta.to.global.u64 %rd2, %rd1;\n"
    "  add.u64 %rd3, %rd2, %rd0;\n"
    "  ld.param.u64 %rd4, [b];\n"
    "  cvta.to.global.u64 %rd5, %rd4;\n"
    "  add.u64 %rd6, %rd5, %rd0;\n"
    "  ld.param.u64 %rd7, [c];\n"
    "  cvta.to.global.u64 %rd8, %rd7;\n"
    "  add.u64 %rd9, %rd8, %rd0;\n"
    "  ld.global.u32 %r5, [%rd3];\n"
    "  ld.global.u32 %r6, [%rd6];\n"
    "  add.u32 %r5, %r5, %r6;\n"
    "  st.global.u32 [%rd9], %r5;\n"
    "DONE:\n"
    "  ret;\n"
    "}\n";

/* A CUDA device of the manager with the test's module loaded into its
 * primary context, which is current on the calling thread. */
typedef struct ck_kdev {
  um_device *d;
  um_device_native nat;
  CUmodule module;
  CUfunction axpb, fill, add;
  CUevent done; /* recorded after each kernel, reused: unimem captures it */
} ck_kdev;

static UT_UNUSED void ck_build(ck_kdev *k, um_device *d) {
  memset(k, 0, sizeof(*k));
  k->d = d;
  CAC_OK(um_device_native_get(d, &k->nat));
  cr_assert_str_eq(k->nat.backend, "cuda");
  cr_assert_not_null(k->nat.cu_context);
  cr_assert_not_null(k->nat.cu_stream);
  CK_CU(ck.cuCtxSetCurrent((CUcontext)k->nat.cu_context));
  CK_CU(ck.cuModuleLoadData(&k->module, ck_ptx));
  CK_CU(ck.cuModuleGetFunction(&k->axpb, k->module, "axpb"));
  CK_CU(ck.cuModuleGetFunction(&k->fill, k->module, "fill"));
  CK_CU(ck.cuModuleGetFunction(&k->add, k->module, "add"));
  CK_CU(ck.cuEventCreate(&k->done, CU_EVENT_DISABLE_TIMING));
}

static UT_UNUSED void ck_unbuild(ck_kdev *k) {
  CK_CU(ck.cuCtxSetCurrent((CUcontext)k->nat.cu_context));
  CK_CU(ck.cuEventDestroy_v2(k->done));
  CK_CU(ck.cuModuleUnload(k->module));
}

static UT_UNUSED CUstream ck_stream(const ck_kdev *k) { return (CUstream)k->nat.cu_stream; }

static UT_UNUSED CUdeviceptr ck_ptr(um_buffer *b) {
  um_buffer_native bn;
  CAC_OK(um_buffer_native_get(b, &bn));
  cr_assert_neq(bn.cu_ptr, 0);
  cr_assert_eq(bn.offset, 0);
  cr_assert_null(bn.cl_mem);
  return (CUdeviceptr)bn.cu_ptr;
}

static UT_UNUSED unsigned ck_blocks(unsigned n) { return (n + 255) / 256; }

static UT_UNUSED void ck_launch_axpb(const ck_kdev *k, CUstream s, CUdeviceptr x, int a, int b, unsigned n) {
  void *params[] = {&x, &a, &b, &n};
  CK_CU(ck.cuLaunchKernel(k->axpb, ck_blocks(n), 1, 1, 256, 1, 1, 0, s, params, NULL));
}

static UT_UNUSED void ck_launch_fill(const ck_kdev *k, CUstream s, CUdeviceptr x, int v, unsigned n) {
  void *params[] = {&x, &v, &n};
  CK_CU(ck.cuLaunchKernel(k->fill, ck_blocks(n), 1, 1, 256, 1, 1, 0, s, params, NULL));
}

static UT_UNUSED void ck_launch_add(const ck_kdev *k, CUstream s, CUdeviceptr a, CUdeviceptr b, CUdeviceptr c,
                                    unsigned n) {
  void *params[] = {&a, &b, &c, &n};
  CK_CU(ck.cuLaunchKernel(k->add, ck_blocks(n), 1, 1, 256, 1, 1, 0, s, params, NULL));
}

/* x = a * x + b over x's n ints inside a bracket, on stream s (the device's
 * caller stream, or one of the test's own), without a host wait: the
 * kernel waits for the bracket's event, and the bracket ends with k->done,
 * recorded after the kernel and free to be recorded again right after. */
static UT_UNUSED void ck_axpb_with(const ck_kdev *k, CUstream s, CUevent done, um_buffer *x, int a, int b) {
  void *wait = NULL;
  unsigned n = (unsigned)(um_buffer_size(x) / sizeof(int));
  CUdeviceptr p = ck_ptr(x);
  CK_CU(ck.cuCtxSetCurrent((CUcontext)k->nat.cu_context));
  CAC_OK(um_access_begin(x, UM_MAP_READ_WRITE, &wait));
  if (wait != NULL)
    CK_CU(ck.cuStreamWaitEvent(s, (CUevent)wait, 0));
  ck_launch_axpb(k, s, p, a, b, n);
  CK_CU(ck.cuEventRecord(done, s));
  CAC_OK(um_access_end(x, done));
}

static UT_UNUSED void ck_axpb(ck_kdev *k, um_buffer *x, int a, int b) {
  ck_axpb_with(k, ck_stream(k), k->done, x, a, b);
}

/* A gate of the test's own: work queued on a stream after ck_hold_wait
 * waits until ck_hold_open. */
typedef struct ck_hold {
  uint32_t *word;
  CUdeviceptr device;
} ck_hold;

static UT_UNUSED ck_hold ck_hold_new(void) {
  ck_hold h;
  void *p = NULL;
  CK_CU(ck.cuMemHostAlloc(&p, sizeof(uint32_t), CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP));
  h.word = p;
  __atomic_store_n(h.word, 0, __ATOMIC_RELEASE);
  CK_CU(ck.cuMemHostGetDevicePointer_v2(&h.device, p, 0));
  return h;
}

static UT_UNUSED void ck_hold_wait(const ck_hold *h, CUstream s) {
  CK_CU(ck.cuStreamWaitValue32_v2(s, h->device, 1, CU_STREAM_WAIT_VALUE_GEQ));
}

static UT_UNUSED void ck_hold_open(const ck_hold *h) { __atomic_store_n(h->word, 1, __ATOMIC_RELEASE); }

static UT_UNUSED void ck_hold_free(ck_hold *h) { CK_CU(ck.cuMemFreeHost(h->word)); }

static UT_UNUSED int *ck_ints(size_t n, int (*f)(size_t)) {
  int *p = (int *)cac_xmalloc(n * sizeof(int));
  for (size_t i = 0; i < n; i++)
    p[i] = f(i);
  return p;
}

static UT_UNUSED int ck_iota(size_t i) { return (int)i; }
static UT_UNUSED int ck_tens(size_t i) { return 10 * (int)i; }

/* A buffer of n ints holding f(i), copied in with a blocking copy. */
static UT_UNUSED um_buffer *ck_vector(um_manager *m, um_device *d, size_t n, int (*f)(size_t)) {
  int *v = ck_ints(n, f);
  um_buffer *b = cac_alloc(m, d, n * sizeof(int), UM_DEVICE, 0);
  CAC_OK(um_copy_from_host(b, 0, v, n * sizeof(int), NULL));
  free(v);
  return b;
}

/* The buffer's ints, downloaded with a blocking copy (free them). */
static UT_UNUSED int *ck_read(um_buffer *b) { return (int *)cac_download(b); }

/* ------------------------------------------------------------------------ */
/* Checks                                                                    */

/* The native handles of a device and of buffers of every location. */
static UT_UNUSED void ck_check_native_handles(um_manager *m, ck_kdev *k, int ordinal) {
  um_device_native cpu;
  um_buffer_native bn;
  um_buffer *b;
  CUdeviceptr mapped = 0;
  CUcontext current = NULL;
  cr_assert_eq(k->nat.cu_device, ordinal);
  cr_assert_null(k->nat.cl_context);
  cr_assert_null(k->nat.cl_queue);
  CK_CU(ck.cuCtxGetCurrent(&current));
  cr_assert_eq((void *)current, k->nat.cu_context, "the backend gave the thread its context back");
  CAC_OK(um_device_native_get(um_device_get(m, 0), &cpu));
  cr_assert_str_eq(cpu.backend, "cpu");
  cr_assert_eq(cpu.cu_device, -1);
  cr_assert_null(cpu.cu_stream);
  b = cac_alloc(m, k->d, 4096, UM_DEVICE, 0);
  CAC_OK(um_buffer_native_get(b, &bn));
  cr_assert_neq(bn.cu_ptr, 0);
  cr_assert_null(bn.host, "device memory has no host view");
  CAC_OK(um_release(b));
  b = cac_alloc(m, k->d, 4096, UM_PINNED, 0);
  CAC_OK(um_buffer_native_get(b, &bn));
  cr_assert_not_null(bn.host);
  CK_CU(ck.cuMemHostGetDevicePointer_v2(&mapped, bn.host, 0));
  cr_assert_eq(bn.cu_ptr, (uint64_t)mapped, "pinned memory: the device's address of it");
  CAC_OK(um_release(b));
  if (cac_info(k->d).locations & (1u << UM_UNIFIED)) {
    b = cac_alloc(m, k->d, 4096, UM_UNIFIED, 0);
    CAC_OK(um_buffer_native_get(b, &bn));
    cr_assert_eq(bn.cu_ptr, (uint64_t)(uintptr_t)bn.host, "managed memory: one address for both");
    CAC_OK(um_release(b));
  }
  b = cac_alloc(m, k->d, 4096, UM_HOST, 0);
  CAC_OK(um_buffer_native_get(b, &bn));
  cr_assert_not_null(bn.host);
  cr_assert_eq(bn.cu_ptr, 0, "host memory is not the device's");
  CAC_OK(um_release(b));
}

/* A kernel on the caller stream between unimem copies: c = a + b with
 * three brackets and one event, then a read-back. */
static UT_UNUSED void ck_check_vector_add(um_manager *m, ck_kdev *k) {
  um_buffer *a = ck_vector(m, k->d, CK_N, ck_iota), *b = ck_vector(m, k->d, CK_N, ck_tens);
  um_buffer *c = cac_alloc(m, k->d, CK_N * sizeof(int), UM_DEVICE, 0);
  void *wa = NULL, *wb = NULL, *wc = NULL;
  int *out;
  CAC_OK(um_access_begin(a, UM_MAP_READ, &wa));
  CAC_OK(um_access_begin(b, UM_MAP_READ, &wb));
  CAC_OK(um_access_begin(c, UM_MAP_WRITE_DISCARD, &wc));
  cr_assert(wa == NULL && wb == NULL && wc == NULL, "blocking copies finished: nothing to wait for");
  ck_launch_add(k, ck_stream(k), ck_ptr(a), ck_ptr(b), ck_ptr(c), CK_N);
  CK_CU(ck.cuEventRecord(k->done, ck_stream(k)));
  CAC_OK(um_access_end(a, k->done));
  CAC_OK(um_access_end(b, k->done));
  CAC_OK(um_access_end(c, k->done));
  cr_assert_eq(um_buffer_valid(c), UM_VALID_DEVICE, "the kernel's writes are on the device");
  out = ck_read(c);
  for (size_t i = 0; i < CK_N; i++)
    cr_assert_eq(out[i], 11 * (int)i, "c[%zu] = %d", i, out[i]);
  free(out);
  CAC_OK(um_release(a));
  CAC_OK(um_release(b));
  CAC_OK(um_release(c));
}

/* A bracket whose wait is a pending native copy's own event. The copy is
 * held (deterministically) behind an earlier bracket whose kernel waits for
 * the test's hold. x: iota -> 2x+1 -> first half overwritten with 10i ->
 * 3x. */
static UT_UNUSED void ck_check_wait_is_the_copy_event(um_manager *m, ck_kdev *k) {
  um_buffer *x = ck_vector(m, k->d, CK_N, ck_iota);
  um_buffer *p = cac_alloc(m, k->d, CK_N * sizeof(int), UM_PINNED, 0);
  int *tens = um_buffer_host_ptr(p), *out;
  ck_hold h = ck_hold_new();
  void *w1 = NULL, *w2 = NULL, *copy_event = NULL;
  um_event *ev;
  for (size_t i = 0; i < CK_N; i++)
    tens[i] = ck_tens(i);
  CAC_OK(um_access_begin(x, UM_MAP_READ_WRITE, &w1));
  cr_assert_null(w1);
  ck_hold_wait(&h, ck_stream(k));
  ck_launch_axpb(k, ck_stream(k), ck_ptr(x), 2, 1, CK_N);
  CK_CU(ck.cuEventRecord(k->done, ck_stream(k)));
  CAC_OK(um_access_end(x, k->done));
  /* From this device's pinned memory: one native copy, behind the bracket. */
  CAC_OK(um_copy(x, 0, p, 0, CK_N / 2 * sizeof(int), &ev));
  CAC_OK(um_event_native(ev, &copy_event));
  CAC_OK(um_access_begin(x, UM_MAP_READ_WRITE, &w2));
  cr_assert_eq(w2, copy_event, "the wait is the pending copy's own event");
  cr_assert_eq(ck.cuEventQuery((CUevent)w2), CUDA_ERROR_NOT_READY, "held by the test");
  CK_CU(ck.cuStreamWaitEvent(ck_stream(k), (CUevent)w2, 0));
  ck_launch_axpb(k, ck_stream(k), ck_ptr(x), 3, 0, CK_N);
  CK_CU(ck.cuEventRecord(k->done, ck_stream(k)));
  CAC_OK(um_access_end(x, k->done));
  cr_assert_eq(um_event_query(ev), UM_EAGAIN, "the copy is held behind the first kernel");
  ck_hold_open(&h);
  cac_wait_release(ev, UM_OK);
  out = ck_read(x);
  for (size_t i = 0; i < CK_N; i++)
    cr_assert_eq(out[i], i < CK_N / 2 ? 30 * (int)i : 3 * (2 * (int)i + 1), "x[%zu] = %d", i, out[i]);
  free(out);
  ck_hold_free(&h);
  CAC_OK(um_release(x));
  CAC_OK(um_release(p));
}

/* A bracket whose wait is a gate: what is pending on x is a copy that runs
 * on host threads (pageable memory larger than a staging chunk, pipelined
 * through pinned chunks), held behind a bracket the test holds. The kernel
 * must see the copy's data: x = 5 * big[i] + 7. */
static UT_UNUSED void ck_check_wait_is_a_gate(um_manager *m, ck_kdev *k) {
  um_buffer *x = ck_vector(m, k->d, CK_BIG, ck_iota);
  int *big = ck_ints(CK_BIG, ck_tens), *out;
  ck_hold h = ck_hold_new();
  void *w1 = NULL, *gate = NULL, *native = NULL;
  um_event *ev;
  CAC_OK(um_access_begin(x, UM_MAP_READ_WRITE, &w1));
  ck_hold_wait(&h, ck_stream(k));
  ck_launch_axpb(k, ck_stream(k), ck_ptr(x), 2, 1, CK_BIG);
  CK_CU(ck.cuEventRecord(k->done, ck_stream(k)));
  CAC_OK(um_access_end(x, k->done));
  CAC_OK(um_copy_from_host(x, 0, big, CK_BIG * sizeof(int), &ev));
  cr_assert_eq(um_event_native(ev, &native), UM_ENOTSUP, "the staged copy runs on host threads");
  CAC_OK(um_access_begin(x, UM_MAP_READ_WRITE, &gate));
  cr_assert_not_null(gate, "a copy is pending: the caller must wait for a gate");
  cr_assert_eq(ck.cuEventQuery((CUevent)gate), CUDA_ERROR_NOT_READY, "closed until the copy finished");
  CK_CU(ck.cuStreamWaitEvent(ck_stream(k), (CUevent)gate, 0));
  ck_launch_axpb(k, ck_stream(k), ck_ptr(x), 5, 7, CK_BIG);
  CK_CU(ck.cuEventRecord(k->done, ck_stream(k)));
  CAC_OK(um_access_end(x, k->done));
  ck_hold_open(&h);
  cac_wait_release(ev, UM_OK);
  out = ck_read(x);
  for (size_t i = 0; i < CK_BIG; i++)
    cr_assert_eq(out[i], 5 * big[i] + 7, "x[%zu] = %d", i, out[i]);
  free(out);
  free(big);
  ck_hold_free(&h);
  CAC_OK(um_release(x));
}
/* A copy's completion is reported while a device-side wait queued after
 * it, on another stream, is still closed (the test's hold on a stream of
 * its own, as a gate or the caller's cuStreamWaitValue32 would be): how
 * unimem learns that its copy ended must not queue device work behind such
 * a wait. Streams share hardware queues (all of them with
 * CUDA_DEVICE_MAX_CONNECTIONS=1 on a GPU, and FAKE_CUDA_CONNECTIONS=1 on
 * the fake), and a queue runs its work in submission order: a watcher that
 * slept behind a stream wait of its own for the copy's event got its
 * report only when the hold opened, and never where the hold's opener
 * waits for that report (test_cuda_kernels_gpu hung that way on an H100).
 * Two copies of bytes each in a row on the upload stream, long enough that
 * the stream's watcher is still waiting for the first when the hold goes
 * in, so it meets the second after it. */
static UT_UNUSED void ck_check_report_past_a_hold(um_manager *m, ck_kdev *k, size_t bytes) {
  um_buffer *pin = cac_alloc(m, k->d, 2 * bytes, UM_PINNED, 0);
  um_buffer *dev = cac_alloc(m, k->d, 2 * bytes, UM_DEVICE, 0);
  unsigned char *want = um_buffer_host_ptr(pin), *got;
  ck_hold h = ck_hold_new();
  um_event *first, *second;
  CUstream s;
  int st1 = UM_EAGAIN, st2 = UM_EAGAIN;
  ut_pattern(want, 2 * bytes, 57);
  CK_CU(ck.cuCtxSetCurrent((CUcontext)k->nat.cu_context));
  CK_CU(ck.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CAC_OK(um_copy(dev, 0, pin, 0, bytes, &first));
  CAC_OK(um_copy(dev, bytes, pin, bytes, bytes, &second));
  ck_hold_wait(&h, s);
  /* 10 s for both reports, the hold closed all along. */
  for (int ms = 0; ms < 10000 && (st1 == UM_EAGAIN || st2 == UM_EAGAIN); ms++) {
    if (st1 == UM_EAGAIN)
      st1 = um_event_query(first);
    if (st2 == UM_EAGAIN)
      st2 = um_event_query(second);
    if (st1 == UM_EAGAIN || st2 == UM_EAGAIN)
      nanosleep(&(struct timespec){0, 1000000}, NULL);
  }
  ck_hold_open(&h);
  CK_CU(ck.cuStreamSynchronize(s));
  CK_CU(ck.cuStreamDestroy_v2(s));
  ck_hold_free(&h);
  cr_assert_eq(st1, UM_OK, "the first copy: %s after 10 s behind a closed wait queued after it", um_err_name(st1));
  cr_assert_eq(st2, UM_OK, "the second copy: %s after 10 s behind a closed wait queued after it", um_err_name(st2));
  cac_wait_release(first, UM_OK);
  cac_wait_release(second, UM_OK);
  got = cac_download(dev);
  cr_assert_eq(memcmp(got, want, 2 * bytes), 0, "the copies' bytes");
  free(got);
  CAC_OK(um_release(dev));
  CAC_OK(um_release(pin));
}

/* A bracket ended with NULL: the caller waited for its kernel itself. */
static UT_UNUSED void ck_check_null_done(um_manager *m, ck_kdev *k) {
  um_buffer *x = ck_vector(m, k->d, CK_N, ck_iota);
  void *wait = NULL;
  int *out;
  CK_CU(ck.cuCtxSetCurrent((CUcontext)k->nat.cu_context));
  CAC_OK(um_access_begin(x, UM_MAP_WRITE, &wait));
  cr_assert_null(wait);
  ck_launch_axpb(k, ck_stream(k), ck_ptr(x), -1, 100, CK_N);
  CK_CU(ck.cuStreamSynchronize(ck_stream(k)));
  CAC_OK(um_access_end(x, NULL));
  out = ck_read(x);
  for (size_t i = 0; i < CK_N; i++)
    cr_assert_eq(out[i], 100 - (int)i, "x[%zu] = %d", i, out[i]);
  free(out);
  CAC_OK(um_release(x));
}

/* copy in -> x*2+1 on k0 -> copy to k1's device -> x*3 there -> copy back
 * -> x+5 on k0 -> copy out: every call returns at once (asynchronous
 * copies from and to pinned buffers, brackets); the only host wait is the
 * last event's, in ck_chain_finish. */
typedef struct ck_chain {
  um_buffer *in, *out, *x0, *x1;
  um_event *ev[4];
} ck_chain;

static UT_UNUSED void ck_chain_issue(um_manager *m, ck_kdev *k0, ck_kdev *k1, ck_chain *c) {
  size_t bytes = CK_N * sizeof(int);
  int *in;
  c->in = cac_alloc(m, k0->d, bytes, UM_PINNED, 0);
  c->out = cac_alloc(m, k0->d, bytes, UM_PINNED, 0);
  c->x0 = cac_alloc(m, k0->d, bytes, UM_DEVICE, 0);
  c->x1 = cac_alloc(m, k1->d, bytes, UM_DEVICE, 0);
  in = um_buffer_host_ptr(c->in);
  for (size_t i = 0; i < CK_N; i++)
    in[i] = (int)i;
  CAC_OK(um_copy(c->x0, 0, c->in, 0, bytes, &c->ev[0]));
  ck_axpb(k0, c->x0, 2, 1);
  CAC_OK(um_copy(c->x1, 0, c->x0, 0, bytes, &c->ev[1]));
  ck_axpb(k1, c->x1, 3, 0);
  CAC_OK(um_copy(c->x0, 0, c->x1, 0, bytes, &c->ev[2]));
  ck_axpb(k0, c->x0, 1, 5);
  CAC_OK(um_copy(c->out, 0, c->x0, 0, bytes, &c->ev[3]));
}

static UT_UNUSED void ck_chain_finish(ck_chain *c) {
  const int *out = um_buffer_host_ptr(c->out);
  CAC_OK(um_event_wait(c->ev[3]));
  for (int i = 0; i < 4; i++)
    cac_wait_release(c->ev[i], UM_OK);
  for (size_t i = 0; i < CK_N; i++)
    cr_assert_eq(out[i], (2 * (int)i + 1) * 3 + 5, "out[%zu] = %d", i, out[i]);
  CAC_OK(um_release(c->in));
  CAC_OK(um_release(c->out));
  CAC_OK(um_release(c->x0));
  CAC_OK(um_release(c->x1));
}

/* A kernel's writes are what um_map fetches afterwards. */
static UT_UNUSED void ck_check_kernel_then_map(um_manager *m, ck_kdev *k) {
  um_buffer *x = ck_vector(m, k->d, CK_N, ck_iota);
  int *p = NULL;
  CAC_OK(um_map(x, UM_MAP_READ, 0, 16, (void **)&p));
  CAC_OK(um_unmap(x, p)); /* a host copy is current now */
  ck_axpb(k, x, 7, -2);
  CAC_OK(um_map(x, UM_MAP_READ, 0, CK_N * sizeof(int), (void **)&p));
  for (size_t i = 0; i < CK_N; i++)
    cr_assert_eq(p[i], 7 * (int)i - 2, "p[%zu] = %d", i, p[i]);
  CAC_OK(um_unmap(x, p));
  CAC_OK(um_release(x));
}

/* A kernel still to write x when x is released (it waits for the test's
 * hold): x's block goes back to the pool only once the kernel finished, so
 * a new buffer of the same size cannot receive its writes. With one
 * hardware queue (CUDA_DEVICE_MAX_CONNECTIONS=1) the blocking um_fill waits
 * behind the hold, which is opened only after it: the GPU test skips it
 * there. after_event: x released with um_release_after, outside any
 * bracket, ordered after the kernel's event (recorded again right after
 * the call: it captured the event). */
static UT_UNUSED void ck_released_while_a_kernel_writes(um_manager *m, ck_kdev *k, int after_event) {
  size_t bytes = CK_N * sizeof(int);
  um_buffer *x = cac_alloc(m, k->d, bytes, UM_DEVICE, 0), *y, *p, *q;
  CUdeviceptr px = ck_ptr(x);
  ck_hold h = ck_hold_new();
  void *wait = NULL;
  int *back, v = after_event ? 55 : 77;
  if (!after_event)
    CAC_OK(um_access_begin(x, UM_MAP_WRITE_DISCARD, &wait));
  ck_hold_wait(&h, ck_stream(k));
  ck_launch_fill(k, ck_stream(k), px, v, CK_N);
  if (after_event) {
    CK_CU(ck.cuEventRecord(k->done, ck_stream(k)));
    CAC_OK(um_release_after(x, k->done));
    CK_CU(ck.cuEventRecord(k->done, ck_stream(k))); /* captured: free to record again */
    cr_assert_eq(um_release(x), UM_ESTATE, "released already");
  } else {
    CAC_OK(um_release(x)); /* ends the bracket behind the caller stream */
  }
  y = cac_alloc(m, k->d, bytes, UM_DEVICE, 0);
  cr_assert_neq(y, x, "x's block is still the kernel's");
  cr_assert_neq(ck_ptr(y), px);
  CAC_OK(um_fill(y, 0, 0x11, bytes, NULL));
  ck_hold_open(&h);
  CK_CU(ck.cuStreamSynchronize(ck_stream(k)));
  CAC_OK(um_device_synchronize(k->d));
  back = ck_read(y);
  for (size_t i = 0; i < CK_N; i++)
    cr_assert_eq((unsigned)back[i], 0x11111111u, "y[%zu] was written by x's kernel", i);
  free(back);
  /* x's block is in the pool now (with y's, once released): the next two
   * allocations take both, one of them x's, with the kernel's values. */
  CAC_OK(um_release(y));
  p = cac_alloc(m, k->d, bytes, UM_DEVICE, 0);
  q = cac_alloc(m, k->d, bytes, UM_DEVICE, 0);
  cr_assert(p == x || q == x, "the released block returned to the pool after the kernel");
  back = ck_read(x);
  for (size_t i = 0; i < CK_N; i++)
    cr_assert_eq(back[i], v, "x[%zu] = %d", i, back[i]);
  free(back);
  ck_hold_free(&h);
  CAC_OK(um_release(p));
  CAC_OK(um_release(q));
}

static UT_UNUSED void ck_check_racing_release(um_manager *m, ck_kdev *k) { ck_released_while_a_kernel_writes(m, k, 0); }
static UT_UNUSED void ck_check_release_after(um_manager *m, ck_kdev *k) { ck_released_while_a_kernel_writes(m, k, 1); }

/* Brackets over three buffers (um_access_begin_n): each has a native copy
 * pending, held behind a bracket of its own that ended with an event
 * recorded after the test's hold. One wait handle for the three (not any
 * copy's own event), not ready while the hold is closed; c = a + b behind
 * it, the three ended with the kernel's event; the kernel saw the copies.
 * Then the same buffer twice, READ and WRITE_DISCARD: one writing bracket
 * (x = 2x + 1 on c), and its device copy current. */
static UT_UNUSED void ck_check_begin_n(um_manager *m, ck_kdev *k) {
  size_t bytes = CK_N * sizeof(int);
  um_buffer *b[3], *p = cac_alloc(m, k->d, 3 * bytes, UM_PINNED, 0);
  int *src = (int *)um_buffer_host_ptr(p), *out;
  um_map_mode modes[3] = {UM_MAP_READ, UM_MAP_READ, UM_MAP_WRITE_DISCARD};
  um_map_mode twice[2] = {UM_MAP_READ, UM_MAP_WRITE_DISCARD};
  ck_hold h = ck_hold_new();
  um_event *up[3];
  void *w = NULL, *w0 = NULL;
  for (size_t j = 0; j < CK_N; j++)
    src[j] = ck_iota(j), src[CK_N + j] = ck_tens(j), src[2 * CK_N + j] = -1;
  for (int i = 0; i < 3; i++)
    b[i] = cac_alloc(m, k->d, bytes, UM_DEVICE, 0);
  ck_hold_wait(&h, ck_stream(k));
  CK_CU(ck.cuEventRecord(k->done, ck_stream(k)));
  for (int i = 0; i < 3; i++) {
    CAC_OK(um_access_begin(b[i], UM_MAP_READ, &w0));
    CAC_OK(um_access_end(b[i], k->done));
    CAC_OK(um_copy(b[i], 0, p, (size_t)i * bytes, bytes, &up[i]));
  }
  CAC_OK(um_access_begin_n(b, modes, 3, &w));
  cr_assert_not_null(w, "three copies are pending");
  for (int i = 0; i < 3; i++) {
    void *own = NULL;
    if (um_event_native(up[i], &own) == UM_OK)
      cr_assert_neq(w, own, "one handle for the three, not copy %d's", i);
  }
  cr_assert_eq(ck.cuEventQuery((CUevent)w), CUDA_ERROR_NOT_READY, "held by the test");
  CK_CU(ck.cuStreamWaitEvent(ck_stream(k), (CUevent)w, 0));
  ck_launch_add(k, ck_stream(k), ck_ptr(b[0]), ck_ptr(b[1]), ck_ptr(b[2]), CK_N);
  CK_CU(ck.cuEventRecord(k->done, ck_stream(k)));
  CAC_OK(um_access_end_n(b, 3, k->done));
  ck_hold_open(&h);
  for (int i = 0; i < 3; i++)
    cac_wait_release(up[i], UM_OK);
  um_buffer *cc[2] = {b[2], b[2]};
  CAC_OK(um_access_begin_n(cc, twice, 2, &w));
  if (w != NULL)
    CK_CU(ck.cuStreamWaitEvent(ck_stream(k), (CUevent)w, 0));
  ck_launch_axpb(k, ck_stream(k), ck_ptr(b[2]), 2, 1, CK_N);
  CK_CU(ck.cuEventRecord(k->done, ck_stream(k)));
  CAC_OK(um_access_end_n(cc, 2, k->done));
  cr_assert_eq(um_buffer_valid(b[2]), UM_VALID_DEVICE, "READ with WRITE_DISCARD writes");
  out = ck_read(b[2]);
  for (size_t i = 0; i < CK_N; i++)
    cr_assert_eq(out[i], 2 * 11 * (int)i + 1, "c[%zu] = %d", i, out[i]);
  free(out);
  ck_hold_free(&h);
  for (int i = 0; i < 3; i++)
    CAC_OK(um_release(b[i]));
  CAC_OK(um_release(p));
}

/* um_event_native: the CUevent of an operation on a device stream. */
static UT_UNUSED void ck_check_event_native(um_manager *m, ck_kdev *k) {
  um_buffer *x = cac_alloc(m, k->d, 4096, UM_DEVICE, 0), *p = cac_alloc(m, k->d, 4096, UM_PINNED, 0);
  um_buffer *h = cac_alloc(m, k->d, 4096, UM_HOST, 0);
  unsigned char src[4096] = {1};
  void *native = NULL;
  um_event *ev;
  CAC_OK(um_copy(x, 0, p, 0, 4096, &ev));
  CAC_OK(um_event_native(ev, &native));
  cr_assert_not_null(native);
  CK_CU(ck.cuEventSynchronize((CUevent)native));
  cr_assert_eq(ck.cuEventQuery((CUevent)native), CUDA_SUCCESS);
  CAC_OK(um_event_wait(ev));
  CAC_OK(um_event_native(ev, &native)); /* valid after completion, until released */
  CAC_OK(um_event_release(ev));
  cr_assert_eq(um_event_native(ev, &native), UM_ESTATE);
  CAC_OK(um_copy_from_host(h, 0, src, sizeof(src), &ev));
  cr_assert_eq(um_event_native(ev, &native), UM_ENOTSUP, "host memory: a memcpy on a host thread");
  cr_assert_eq(um_event_native(ev, NULL), UM_EINVAL);
  cr_assert_eq(um_event_native(NULL, &native), UM_EINVAL);
  CAC_OK(um_event_release(ev));
  CAC_OK(um_release(x));
  CAC_OK(um_release(p));
  CAC_OK(um_release(h));
}

/* Done events that are not live CUevents: UM_EINVAL, statistics unchanged.
 * dead_event: an event the driver no longer knows (the fake answers for it;
 * a real driver's answer to a destroyed handle is not defined). (The bad
 * input every backend answers alike: conformance/test_access.c.) */
static UT_UNUSED void ck_check_bad_done_events(um_manager *m, ck_kdev *k, void *dead_event) {
  um_buffer *x = cac_alloc(m, k->d, 4096, UM_DEVICE, 0);
  um_buffer_native bn;
  um_device_native dn;
  void *wait = NULL;
  ut_snapshot before = ut_snap(m);
  CAC_OK(um_access_begin(x, UM_MAP_WRITE, &wait));
  cr_assert_eq(um_access_end(x, dead_event), UM_EINVAL, "not a live CUevent");
  /* The fake driver knows its events: the device's other handles are none. */
  CAC_OK(um_device_native_get(k->d, &dn));
  CAC_OK(um_buffer_native_get(x, &bn));
  cr_assert_eq(um_access_end(x, dn.cu_stream), UM_EINVAL, "a CUstream as the done event");
  cr_assert_eq(um_access_end(x, (void *)(uintptr_t)bn.cu_ptr), UM_EINVAL, "a CUdeviceptr as the done event");
  CAC_OK(um_access_end(x, NULL));
  ut_assert_unchanged(m, before);
  CAC_OK(um_release(x));
}

/* The caller works on two streams: b's bracket waits for a gate (b's copy
 * from c is held behind c's bracket), and c's bracket is ended later, from
 * another stream. Nothing of unimem's may order c's end behind b's gate:
 * that gate opens only once c's bracket completed. With one hardware queue
 * (CUDA_DEVICE_MAX_CONNECTIONS=1) the hardware does: s2's kernel, queued
 * after the gate, waits behind it; the GPU test skips it there. */
static UT_UNUSED void ck_check_two_caller_streams(um_manager *m, ck_kdev *k) {
  um_buffer *c = ck_vector(m, k->d, CK_N, ck_iota);
  um_buffer *b = cac_alloc(m, k->d, CK_N * sizeof(int), UM_DEVICE, 0);
  void *wc = NULL, *wb = NULL, *native = NULL;
  CUstream s2;
  CUevent ec;
  um_event *ev;
  int *out;
  CK_CU(ck.cuCtxSetCurrent((CUcontext)k->nat.cu_context));
  CK_CU(ck.cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
  CK_CU(ck.cuEventCreate(&ec, CU_EVENT_DISABLE_TIMING));
  CAC_OK(um_access_begin(c, UM_MAP_READ_WRITE, &wc));
  cr_assert_null(wc);
  CAC_OK(um_copy(b, 0, c, 0, CK_N * sizeof(int), &ev));
  cr_assert_eq(um_event_native(ev, &native), UM_EAGAIN, "the copy waits for c's bracket, not queued yet");
  CAC_OK(um_access_begin(b, UM_MAP_READ_WRITE, &wb));
  cr_assert_not_null(wb, "b's wait is a gate behind the copy");
  CK_CU(ck.cuStreamWaitEvent(ck_stream(k), (CUevent)wb, 0));
  ck_launch_axpb(k, ck_stream(k), ck_ptr(b), 2, 1, CK_N);
  CK_CU(ck.cuEventRecord(k->done, ck_stream(k)));
  CAC_OK(um_access_end(b, k->done));
  ck_launch_axpb(k, s2, ck_ptr(c), 3, 0, CK_N);
  CK_CU(ck.cuEventRecord(ec, s2));
  CAC_OK(um_access_end(c, ec));
  cac_wait_release(ev, UM_OK);
  out = ck_read(b);
  for (size_t i = 0; i < CK_N; i++)
    cr_assert_eq(out[i], 6 * (int)i + 1, "b[%zu] = %d", i, out[i]);
  free(out);
  out = ck_read(c);
  for (size_t i = 0; i < CK_N; i++)
    cr_assert_eq(out[i], 3 * (int)i, "c[%zu] = %d", i, out[i]);
  free(out);
  CK_CU(ck.cuCtxSetCurrent((CUcontext)k->nat.cu_context));
  CK_CU(ck.cuStreamSynchronize(s2));
  CK_CU(ck.cuStreamDestroy_v2(s2));
  CK_CU(ck.cuEventDestroy_v2(ec));
  CAC_OK(um_release(b));
  CAC_OK(um_release(c));
}

/* The caller's loop on the caller's stream (um_queue_use): upload, the
 * kernel (x = 2x + 1) in a bracket with no wait handle and no done event,
 * a blocking download; the results exact, round after round. */
static UT_UNUSED void ck_check_queue_loop(um_manager *m, ck_kdev *k) {
  CUstream s = ck_stream(k);
  int *in = ck_ints(CK_N, ck_iota), *out = (int *)cac_xmalloc(CK_N * sizeof(int));
  CK_CU(ck.cuCtxSetCurrent((CUcontext)k->nat.cu_context));
  CAC_OK(um_queue_use(k->d, s));
  for (int r = 0; r < 20; r++) {
    unsigned n = 64 + (unsigned)r * 199 % (CK_N - 64);
    size_t bytes = n * sizeof(int);
    um_buffer *x = cac_alloc(m, k->d, bytes, UM_DEVICE, 0);
    um_event *up = NULL;
    void *wait = (void *)1;
    in[0] = r;
    CAC_OK(um_copy_from_host(x, 0, in, bytes, &up));
    CAC_OK(um_event_release(up));
    CAC_OK(um_access_begin(x, UM_MAP_READ_WRITE, &wait));
    cr_assert_null(wait, "round %d: the upload is on the same stream", r);
    ck_launch_axpb(k, s, ck_ptr(x), 2, 1, n);
    CAC_OK(um_access_end(x, NULL));
    memset(out, 0, bytes);
    CAC_OK(um_copy_to_host(x, 0, out, bytes, NULL));
    for (unsigned i = 0; i < n; i++)
      cr_assert_eq(out[i], 2 * in[i] + 1, "round %d, element %u: %d", r, i, out[i]);
    CAC_OK(um_release(x));
  }
  CAC_OK(um_queue_use(k->d, NULL));
  free(in);
  free(out);
}

/* A hold on the caller's stream holds unimem's upload queued there, and the
 * download of the same buffer on unimem's own stream behind it (order
 * across queues); bad streams answer their codes. */
static UT_UNUSED void ck_check_queue_order(um_manager *m, ck_kdev *k) {
  CUstream s = ck_stream(k), extra[4];
  ck_hold h;
  int *in = ck_ints(CK_N, ck_tens), *out = (int *)cac_xmalloc(CK_N * sizeof(int));
  size_t bytes = CK_N * sizeof(int);
  um_buffer *x = cac_alloc(m, k->d, bytes, UM_DEVICE, 0);
  um_event *up = NULL, *down = NULL;
  CK_CU(ck.cuCtxSetCurrent((CUcontext)k->nat.cu_context));
  h = ck_hold_new();
  ck_hold_wait(&h, s);
  CAC_OK(um_queue_use(k->d, s));
  CAC_OK(um_copy_from_host(x, 0, in, bytes, &up));
  CAC_OK(um_queue_use(k->d, NULL));
  CAC_OK(um_copy_to_host(x, 0, out, bytes, &down));
  nanosleep(&(struct timespec){0, 20000000}, NULL);
  cr_assert_eq(um_event_query(up), UM_EAGAIN, "held on the caller's stream");
  cr_assert_eq(um_event_query(down), UM_EAGAIN, "behind the upload, across streams");
  ck_hold_open(&h);
  CAC_OK(um_event_wait(up));
  CAC_OK(um_event_wait(down));
  cr_assert_arr_eq(out, in, bytes);
  CAC_OK(um_event_release(up));
  CAC_OK(um_event_release(down));
  CAC_OK(um_release(x));
  ck_hold_free(&h);
  /* Bad input: the cpu device, NULL device, a fifth stream (the caller
   * stream was the first). */
  cr_assert_eq(um_queue_use(k->d, NULL), UM_OK);
  cr_assert_eq(um_queue_use(um_device_get(m, 0), s), UM_ENOTSUP);
  cr_assert_eq(um_queue_use(NULL, s), UM_EINVAL);
  for (int i = 0; i < 4; i++)
    CK_CU(ck.cuStreamCreate(&extra[i], CU_STREAM_NON_BLOCKING));
  for (int i = 0; i < 3; i++)
    CAC_OK(um_queue_use(k->d, extra[i]));
  cr_assert_eq(um_queue_use(k->d, extra[3]), UM_ENOMEM);
  CAC_OK(um_queue_use(k->d, extra[0]));
  CAC_OK(um_queue_use(k->d, NULL));
  /* Nothing of unimem's is queued on them: the caller may destroy them. */
  for (int i = 0; i < 4; i++)
    CK_CU(ck.cuStreamDestroy_v2(extra[i]));
  free(in);
  free(out);
}

/* Threads at once, each with its own buffers and event, all on the
 * device's caller stream: x += 2 per round through two brackets and two
 * device copies, issued without waiting. No assertion runs on these
 * threads (Criterion's stop the test from the main thread only): a failure
 * is the line it happened on. */
typedef struct ck_thread_arg {
  um_manager *m;
  ck_kdev *k;
  int rounds;
  int failed;
} ck_thread_arg;

#define CK_T(cond)                                                             \
  do {                                                                         \
    if (!(cond))                                                               \
      return __LINE__;                                                         \
  } while (0)

/* x += 1 in a bracket on the caller stream, ended with done. */
static UT_UNUSED int ck_thread_step(const ck_kdev *k, CUevent done, um_buffer *x) {
  um_buffer_native bn;
  void *wait = NULL;
  CUstream s = ck_stream(k);
  int one = 1;
  unsigned n = CK_N;
  void *params[] = {&bn.cu_ptr, &one, &one, &n};
  CK_T(um_buffer_native_get(x, &bn) == UM_OK);
  CK_T(um_access_begin(x, UM_MAP_READ_WRITE, &wait) == UM_OK);
  CK_T(wait == NULL || ck.cuStreamWaitEvent(s, (CUevent)wait, 0) == CUDA_SUCCESS);
  CK_T(ck.cuLaunchKernel(k->axpb, ck_blocks(n), 1, 1, 256, 1, 1, 0, s, params, NULL) == CUDA_SUCCESS);
  CK_T(ck.cuEventRecord(done, s) == CUDA_SUCCESS);
  CK_T(um_access_end(x, done) == UM_OK);
  return 0;
}

static UT_UNUSED int ck_thread_rounds(ck_thread_arg *a, CUevent done) {
  size_t bytes = CK_N * sizeof(int);
  um_buffer *x = NULL, *y = NULL;
  int in[CK_N], out[CK_N];
  for (size_t i = 0; i < CK_N; i++)
    in[i] = (int)i;
  CK_T(um_alloc(a->m, a->k->d, bytes, UM_DEVICE, 0, &x) == UM_OK);
  CK_T(um_alloc(a->m, a->k->d, bytes, UM_DEVICE, 0, &y) == UM_OK);
  CK_T(um_copy_from_host(x, 0, in, bytes, NULL) == UM_OK);
  for (int r = 0; r < a->rounds; r++) {
    um_event *e1 = NULL, *e2 = NULL;
    int st = ck_thread_step(a->k, done, x);
    CK_T(st == 0 && um_copy(y, 0, x, 0, bytes, &e1) == UM_OK);
    st = ck_thread_step(a->k, done, y);
    CK_T(st == 0 && um_copy(x, 0, y, 0, bytes, &e2) == UM_OK);
    CK_T(um_event_release(e1) == UM_OK && um_event_release(e2) == UM_OK);
  }
  CK_T(um_copy_to_host(x, 0, out, bytes, NULL) == UM_OK);
  for (size_t i = 0; i < CK_N; i++)
    CK_T(out[i] == (int)i + 2 * a->rounds);
  CK_T(um_release(x) == UM_OK && um_release(y) == UM_OK);
  return 0;
}

static UT_UNUSED void *ck_thread_main(void *p) {
  ck_thread_arg *a = p;
  CUevent done;
  if (ck.cuCtxSetCurrent((CUcontext)a->k->nat.cu_context) != CUDA_SUCCESS ||
      ck.cuEventCreate(&done, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) {
    a->failed = __LINE__;
    return NULL;
  }
  a->failed = ck_thread_rounds(a, done);
  if (ck.cuEventDestroy_v2(done) != CUDA_SUCCESS && a->failed == 0)
    a->failed = __LINE__;
  return NULL;
}

static UT_UNUSED void ck_check_threads(um_manager *m, ck_kdev *k, int nthreads, int rounds) {
  pthread_t t[8];
  ck_thread_arg args[8];
  cr_assert(nthreads <= 8);
  for (int i = 0; i < nthreads; i++) {
    args[i] = (ck_thread_arg){m, k, rounds, 0};
    cr_assert_eq(pthread_create(&t[i], NULL, ck_thread_main, &args[i]), 0);
  }
  for (int i = 0; i < nthreads; i++) {
    pthread_join(t[i], NULL);
    cr_assert_eq(args[i].failed, 0, "thread %d failed at line %d", i, args[i].failed);
  }
}

#endif /* UNIMEM_CUDA_KERNEL_CHECKS_H */
