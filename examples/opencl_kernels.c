/* Your own OpenCL kernels on unimem buffers (docs/guide.md, "Running your
 * kernels on unimem buffers"):
 *  1. copy data in, then x = 2x + 1 with a kernel of this program on the
 *     first OpenCL device, inside um_access_begin / um_access_end;
 *  2. um_copy to a second device (a peer copy) and x = 3x there, or again
 *     on the first device when there is only one;
 *  3. copy back and check every element;
 *  4. the same in a context and queue this program made itself, handed to
 *     unimem with um_device_adopt_opencl.
 * Nothing between the first copy and the last waits on the host: each
 * bracket orders the kernel after unimem's earlier copies, and unimem's
 * later copies after the kernel.
 *
 * Exits 77 (skipped) where there is no OpenCL device. The program links
 * libOpenCL itself; the unimem library never does. */
#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "unimem.h"

#define N 4096 /* floats per buffer */

#define CHECK(call)                                                            \
  do {                                                                         \
    int st_ = (call);                                                          \
    if (st_ != UM_OK) {                                                        \
      fprintf(stderr, "%s failed: %s (%s)\n", #call, um_err_name(st_),        \
              um_last_error());                                                \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

#define CL_CHECK(call)                                                         \
  do {                                                                         \
    cl_int err_ = (call);                                                      \
    if (err_ != CL_SUCCESS) {                                                  \
      fprintf(stderr, "%s failed: OpenCL error %d\n", #call, (int)err_);       \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

/* first: where the buffer starts inside its cl_mem, in elements
 * (um_buffer_native.offset: unimem may place a buffer inside a larger
 * block). */
static const char *source =
    "__kernel void axpb(__global float *x, ulong first, float a, float b) {\n"
    "  size_t i = first + get_global_id(0);\n"
    "  x[i] = a * x[i] + b;\n"
    "}\n";

/* The kernel, built for one device in the context unimem uses for it. */
typedef struct kernel_on {
  um_device_native nat; /* the device's context, and a queue for our commands */
  cl_program program;
  cl_kernel axpb;
} kernel_on;

static void kernel_build(kernel_on *k, um_device *d) {
  cl_device_id id;
  cl_int err;
  CHECK(um_device_native_get(d, &k->nat));
  id = (cl_device_id)k->nat.cl_device;
  k->program = clCreateProgramWithSource((cl_context)k->nat.cl_context, 1, &source, NULL, &err);
  CL_CHECK(err);
  CL_CHECK(clBuildProgram(k->program, 1, &id, "", NULL, NULL));
  k->axpb = clCreateKernel(k->program, "axpb", &err);
  CL_CHECK(err);
}

static void kernel_free(kernel_on *k) {
  clReleaseKernel(k->axpb);
  clReleaseProgram(k->program);
}

/* x = a * x + b on x's device. Returns at once: the kernel waits for what
 * unimem still has to do on x, and what unimem is asked to do on x next
 * waits for the kernel. */
static void axpb(kernel_on *k, um_buffer *x, float a, float b) {
  cl_command_queue queue = (cl_command_queue)k->nat.cl_queue;
  um_buffer_native bn;
  void *wait = NULL;
  cl_event after, done;
  cl_mem mem;
  cl_ulong first;
  size_t global = um_buffer_size(x) / sizeof(float);

  CHECK(um_buffer_native_get(x, &bn));
  mem = (cl_mem)bn.cl_mem;
  first = bn.offset / sizeof(float);
  CHECK(um_access_begin(x, UM_MAP_READ_WRITE, &wait));
  after = (cl_event)wait; /* NULL when nothing on x is pending */
  CL_CHECK(clSetKernelArg(k->axpb, 0, sizeof(mem), &mem));
  CL_CHECK(clSetKernelArg(k->axpb, 1, sizeof(first), &first));
  CL_CHECK(clSetKernelArg(k->axpb, 2, sizeof(a), &a));
  CL_CHECK(clSetKernelArg(k->axpb, 3, sizeof(b), &b));
  CL_CHECK(clEnqueueNDRangeKernel(queue, k->axpb, 1, NULL, &global, NULL, after ? 1 : 0, after ? &after : NULL,
                                  &done));
  clFlush(queue);
  CHECK(um_access_end(x, done)); /* unimem keeps a reference of its own */
  clReleaseEvent(done);
}

/* Every element i of out is (a * i + b) * c. */
static void check(const float *out, float a, float b, float c, const char *what) {
  for (int i = 0; i < N; i++)
    if (out[i] != (a * (float)i + b) * c) {
      fprintf(stderr, "%s: element %d is %g, expected %g\n", what, i, out[i], (a * (float)i + b) * c);
      exit(1);
    }
  printf("%s: %d elements checked\n", what, N);
}

/* Steps 1 to 3 on d0, and on d1 after a copy between the two (d1 may be
 * d0). */
static void chain(um_manager *m, um_device *d0, um_device *d1) {
  static float in[N], out[N];
  kernel_on k0, k1;
  um_buffer *x0, *x1;
  um_event *ev;
  um_stats before, after;

  for (int i = 0; i < N; i++)
    in[i] = (float)i;
  kernel_build(&k0, d0);
  kernel_build(&k1, d1);
  CHECK(um_alloc_array(m, d0, N, sizeof(float), UM_DEVICE, 0, &x0));
  CHECK(um_alloc_array(m, d1, N, sizeof(float), UM_DEVICE, 0, &x1));
  CHECK(um_stats_get(m, NULL, &before));

  /* Asynchronous copies: their events are released at once (the copies
   * go on), because operations on one buffer keep their order anyway. */
  CHECK(um_copy_from_host(x0, 0, in, sizeof(in), &ev));
  um_event_release(ev);
  axpb(&k0, x0, 2, 1); /* after the copy in, on the device */
  CHECK(um_copy(x1, 0, x0, 0, sizeof(in), &ev)); /* after the kernel */
  um_event_release(ev);
  axpb(&k1, x1, 3, 0);
  CHECK(um_copy_to_host(x1, 0, out, sizeof(out), NULL)); /* the one wait, for the whole chain */
  check(out, 2, 1, 3, d0 == d1 ? "chain on one device" : "chain across two devices");

  CHECK(um_stats_get(m, NULL, &after));
  printf("copies between devices: %llu peer, %llu staged; device-local: %llu\n",
         (unsigned long long)(after.xfer_peer - before.xfer_peer),
         (unsigned long long)(after.xfer_staged - before.xfer_staged),
         (unsigned long long)(after.xfer_local - before.xfer_local));
  CHECK(um_release(x0));
  CHECK(um_release(x1));
  kernel_free(&k0);
  kernel_free(&k1);
}

/* Step 4: a context and queue of this program's own. unimem allocates in
 * that context and runs its copies on a queue of its own there; our kernels
 * go on our queue, which um_device_native_get hands back. */
static void in_own_context(um_manager *m) {
  static float in[N], out[N];
  cl_platform_id platform;
  cl_device_id id;
  cl_context context;
  cl_command_queue queue;
  cl_int err;
  um_device *mine;
  um_buffer *x;
  kernel_on k;

  for (int i = 0; i < N; i++)
    in[i] = (float)i;
  CL_CHECK(clGetPlatformIDs(1, &platform, NULL));
  CL_CHECK(clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, 1, &id, NULL));
  context = clCreateContext(NULL, 1, &id, NULL, NULL, &err);
  CL_CHECK(err);
  queue = clCreateCommandQueueWithProperties(context, id, NULL, &err);
  CL_CHECK(err);
  CHECK(um_device_adopt_opencl(m, context, id, queue, &mine));
  kernel_build(&k, mine); /* k.nat.cl_queue is our queue */

  CHECK(um_alloc_array(m, mine, N, sizeof(float), UM_DEVICE, 0, &x));
  CHECK(um_copy_from_host(x, 0, in, sizeof(in), NULL));
  axpb(&k, x, 5, -1);
  CHECK(um_copy_to_host(x, 0, out, sizeof(out), NULL));
  check(out, 5, -1, 1, "adopted context");

  CHECK(um_release(x));
  kernel_free(&k);
  /* unimem holds its own references until um_manager_destroy. */
  clReleaseCommandQueue(queue);
  clReleaseContext(context);
}

/* The first n OpenCL devices of m; returns how many there are. */
static int opencl_devices(um_manager *m, um_device **out, int n) {
  int found = 0;
  for (int i = 0; i < um_device_count(m) && found < n; i++) {
    um_device_info info;
    if (um_device_info_get(um_device_get(m, i), &info) == UM_OK && strcmp(info.backend, "opencl") == 0)
      out[found++] = um_device_get(m, i);
  }
  return found;
}

int main(void) {
  um_manager *m;
  um_device *dev[2];
  int ndev;

  CHECK(um_manager_create(NULL, &m));
  ndev = opencl_devices(m, dev, 2);
  if (ndev == 0) {
    printf("SKIP: no OpenCL device here (UNIMEM_LOG_LEVEL=info says why the backend found none)\n");
    CHECK(um_manager_destroy(m));
    return 77;
  }
  chain(m, dev[0], dev[ndev - 1]);
  in_own_context(m);
  CHECK(um_manager_destroy(m));
  return 0;
}
