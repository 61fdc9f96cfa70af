/* Your own CUDA kernels on unimem memory (the guide's interop pattern):
 *
 *   pinned input --copy--> x --kernel: x = 2x + 1--> x --copy--> y
 *     --kernel: y = 3y--> y --copy--> pinned output
 *
 * Every step returns at once. unimem's copies and the kernels are ordered
 * through CUDA events: um_access_begin hands out the event the first
 * kernel on a buffer must wait for, and um_access_end takes the event
 * recorded after the last one. The only host wait is the last copy's.
 *
 * The kernel is PTX written for this example, compiled by the driver
 * (cuModuleLoadData). Like unimem, the example opens the driver with
 * dlopen -- the one unimem uses: UNIMEM_CUDA_LIBRARY, else libcuda.so.1 --
 * so it builds without libcuda and says "skipped" (exit 77) on a machine
 * without an NVIDIA GPU. */
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>

#include "unimem.h"

#define N 100000 /* ints */
#define SKIPPED 77

#define CHECK(call)                                                            \
  do {                                                                         \
    int st_ = (call);                                                          \
    if (st_ != UM_OK) {                                                        \
      fprintf(stderr, "%s failed: %s (%s)\n", #call, um_err_name(st_),        \
              um_last_error());                                                \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

#define CU(call)                                                               \
  do {                                                                         \
    CUresult r_ = (call);                                                      \
    if (r_ != CUDA_SUCCESS) {                                                  \
      fprintf(stderr, "%s failed: CUresult %d\n", #call, (int)r_);            \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

/* x[i] = a * x[i] + b for i < n, one thread per element. */
static const char axpb_ptx[] =
    ".version 7.0\n"
    ".target sm_50\n"
    ".address_size 64\n"
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
    "}\n";

/* The driver calls the example makes itself. */
static struct {
  __typeof__(cuCtxSetCurrent) *cuCtxSetCurrent;
  __typeof__(cuModuleLoadData) *cuModuleLoadData;
  __typeof__(cuModuleGetFunction) *cuModuleGetFunction;
  __typeof__(cuModuleUnload) *cuModuleUnload;
  __typeof__(cuLaunchKernel) *cuLaunchKernel;
  __typeof__(cuStreamWaitEvent) *cuStreamWaitEvent;
  __typeof__(cuEventCreate) *cuEventCreate;
  __typeof__(cuEventRecord) *cuEventRecord;
  __typeof__(cuEventDestroy_v2) *cuEventDestroy_v2;
} cu;

static void load(void *lib, const char *name, void *slot) {
  void *address = dlsym(lib, name);
  if (address == NULL) {
    fprintf(stderr, "the CUDA driver lacks %s\n", name);
    exit(1);
  }
  memcpy(slot, &address, sizeof(address)); /* POSIX: it is a function */
}

static void load_driver(void) {
  const char *path = getenv("UNIMEM_CUDA_LIBRARY");
  void *lib = dlopen(path != NULL && path[0] != '\0' ? path : "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    fprintf(stderr, "dlopen: %s\n", dlerror());
    exit(1);
  }
  load(lib, "cuCtxSetCurrent", &cu.cuCtxSetCurrent);
  load(lib, "cuModuleLoadData", &cu.cuModuleLoadData);
  load(lib, "cuModuleGetFunction", &cu.cuModuleGetFunction);
  load(lib, "cuModuleUnload", &cu.cuModuleUnload);
  load(lib, "cuLaunchKernel", &cu.cuLaunchKernel);
  load(lib, "cuStreamWaitEvent", &cu.cuStreamWaitEvent);
  load(lib, "cuEventCreate", &cu.cuEventCreate);
  load(lib, "cuEventRecord", &cu.cuEventRecord);
  load(lib, "cuEventDestroy_v2", &cu.cuEventDestroy_v2);
}

/* The manager's log line that says why there is no CUDA device. */
static char cuda_log[512];

static void keep_cuda_line(void *ctx, um_log_level level, const char *msg) {
  (void)ctx;
  (void)level;
  if (strstr(msg, "cuda") != NULL)
    snprintf(cuda_log, sizeof(cuda_log), "%s", msg);
}

/* The first CUDA device of m, or NULL. */
static um_device *first_cuda_device(um_manager *m) {
  for (int i = 0; i < um_device_count(m); i++) {
    um_device_info info;
    CHECK(um_device_info_get(um_device_get(m, i), &info));
    if (strcmp(info.backend, "cuda") == 0)
      return um_device_get(m, i);
  }
  return NULL;
}

/* x = a * x + b on the device's caller stream, inside a bracket: the
 * kernel waits for what unimem still has pending on x, and unimem's later
 * operations on x wait for the kernel (done is recorded after it; unimem
 * captures it, so it may be recorded again for the next step). */
static void axpb(um_buffer *x, CUfunction f, CUstream stream, CUevent done, int a, int b) {
  um_buffer_native native;
  void *wait = NULL;
  unsigned n = (unsigned)(um_buffer_size(x) / sizeof(int));
  CHECK(um_buffer_native_get(x, &native));
  CUdeviceptr ptr = (CUdeviceptr)native.cu_ptr;
  void *params[] = {&ptr, &a, &b, &n};

  CHECK(um_access_begin(x, UM_MAP_READ_WRITE, &wait));
  if (wait != NULL)
    CU(cu.cuStreamWaitEvent(stream, (CUevent)wait, 0));
  CU(cu.cuLaunchKernel(f, (n + 255) / 256, 1, 1, 256, 1, 1, 0, stream, params, NULL));
  CU(cu.cuEventRecord(done, stream));
  CHECK(um_access_end(x, done));
}

int main(void) {
  um_options opts;
  um_manager *m;
  um_device *gpu;
  um_device_info info;
  um_device_native nat;
  um_buffer *in, *out, *x, *y;
  um_event *ev[3];
  CUmodule module;
  CUfunction f;
  CUevent done;
  int *host_in, *host_out;

  um_options_init(&opts);
  opts.log = keep_cuda_line;
  opts.log_level = UM_LOG_INFO;
  CHECK(um_manager_create(&opts, &m));
  if ((gpu = first_cuda_device(m)) == NULL) {
    printf("skipped: no CUDA device (%s)\n", cuda_log[0] ? cuda_log : "the cuda backend is not built");
    CHECK(um_manager_destroy(m));
    return SKIPPED;
  }
  load_driver();
  CHECK(um_device_info_get(gpu, &info));
  CHECK(um_device_native_get(gpu, &nat));
  CU(cu.cuCtxSetCurrent((CUcontext)nat.cu_context)); /* unimem's primary context */
  CU(cu.cuModuleLoadData(&module, axpb_ptx));
  CU(cu.cuModuleGetFunction(&f, module, "axpb"));
  CU(cu.cuEventCreate(&done, CU_EVENT_DISABLE_TIMING));

  /* Pinned host buffers: copies from and to them are single DMAs that
   * return at once. */
  CHECK(um_alloc_array(m, gpu, N, sizeof(int), UM_PINNED, 0, &in));
  CHECK(um_alloc_array(m, gpu, N, sizeof(int), UM_PINNED, 0, &out));
  CHECK(um_alloc_array(m, gpu, N, sizeof(int), UM_DEVICE, 0, &x));
  CHECK(um_alloc_array(m, gpu, N, sizeof(int), UM_DEVICE, 0, &y));
  host_in = um_buffer_host_ptr(in);
  host_out = um_buffer_host_ptr(out);
  for (int i = 0; i < N; i++)
    host_in[i] = i;

  CHECK(um_copy(x, 0, in, 0, N * sizeof(int), &ev[0]));
  axpb(x, f, (CUstream)nat.cu_stream, done, 2, 1);
  CHECK(um_copy(y, 0, x, 0, N * sizeof(int), &ev[1]));
  axpb(y, f, (CUstream)nat.cu_stream, done, 3, 0);
  CHECK(um_copy(out, 0, y, 0, N * sizeof(int), &ev[2]));
  CHECK(um_event_wait(ev[2])); /* the only wait */

  for (int i = 0; i < N; i++)
    if (host_out[i] != 3 * (2 * i + 1)) {
      fprintf(stderr, "out[%d] = %d, expected %d\n", i, host_out[i], 3 * (2 * i + 1));
      return 1;
    }
  printf("%d elements through copy, kernel, copy, kernel, copy on %s: all correct\n", N, info.name);
  for (int i = 0; i < 3; i++)
    CHECK(um_event_release(ev[i]));
  CHECK(um_release(in));
  CHECK(um_release(out));
  CHECK(um_release(x));
  CHECK(um_release(y));
  CU(cu.cuEventDestroy_v2(done));
  CU(cu.cuModuleUnload(module));
  CHECK(um_manager_destroy(m));
  return 0;
}
