/* DLPack on OpenCL devices (PoCL), through the test's own OpenCL calls: an
 * exported DEVICE buffer's cl_mem read by a consumer, a cl_mem of the
 * device's context imported as a DEVICE buffer over the same memory (a
 * sub-buffer for a byte_offset), one of another context refused, and a
 * kernel on a round trip. The test links libOpenCL itself (the library
 * never does). What every backend does alike (each location's type,
 * ordinal, data and byte_offset, round trips, deleters, destroy) is
 * conformance/test_dlpack.c's, on the pocl profiles among the others. */
#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#include "opencl_util.h"
#include "unimem_dlpack.h"

#define BYTES 4096

typedef struct producer {
  um_dl_managed_tensor t;
  int64_t shape[1];
  int deleted;
} producer;

static void producer_delete(um_dl_managed_tensor *self) { ((producer *)self->manager_ctx)->deleted++; }

static void producer_init(producer *p, cl_mem mem, int32_t ordinal, uint64_t byte_offset, int64_t bytes) {
  memset(p, 0, sizeof(*p));
  p->shape[0] = bytes;
  um_dl_tensor t = {mem, {UM_DL_OPENCL, ordinal}, 1, {UM_DL_UINT, 8, 1}, p->shape, NULL, byte_offset};
  p->t.dl_tensor = t;
  p->t.manager_ctx = p;
  p->t.deleter = producer_delete;
}

/* A buffer of the device's context, filled with a pattern. */
static cl_mem cl_buffer(const um_device_native *nat, size_t bytes, unsigned seed) {
  cl_int err;
  unsigned char *host = ub_malloc(bytes);
  cl_mem mem = clCreateBuffer((cl_context)nat->cl_context, CL_MEM_READ_WRITE, bytes, NULL, &err);
  cr_assert_eq(err, CL_SUCCESS);
  ub_pattern(host, bytes, seed);
  cr_assert_eq(clEnqueueWriteBuffer((cl_command_queue)nat->cl_queue, mem, CL_TRUE, 0, bytes, host, 0, NULL, NULL),
               CL_SUCCESS);
  free(host);
  return mem;
}

static void cl_read(const um_device_native *nat, cl_mem mem, size_t off, void *out, size_t bytes) {
  cr_assert_eq(clEnqueueReadBuffer((cl_command_queue)nat->cl_queue, mem, CL_TRUE, off, bytes, out, 0, NULL, NULL),
               CL_SUCCESS);
}

/* A consumer reads an exported DEVICE buffer's current bytes through the
 * cl_mem with its own queue, before and after the buffer's release. */
OU_TEST_1_AND_2(opencl_dlpack, consumer_reads_the_exported_cl_mem) {
  ou_env e = ou_open(NULL, 1);
  unsigned char want[BYTES], got[BYTES];
  for (int k = 0; k < e.ndev; k++) {
    um_buffer *b = ub_alloc(e.m, e.dev[k], BYTES, UM_DEVICE);
    um_device_native nat;
    um_buffer_native bn;
    int64_t shape[1] = {BYTES / 4 - 64};
    um_dl_managed_tensor *t = NULL;
    cr_assert_eq(um_device_native_get(e.dev[k], &nat), UM_OK);
    cr_assert_eq(um_buffer_native_get(b, &bn), UM_OK);
    ub_pattern(want, BYTES, (unsigned)k + 3);
    cr_assert_eq(um_copy_from_host(b, 0, want, BYTES, NULL), UM_OK);
    cr_assert_eq(um_dlpack_export(b, 256, 1, shape, NULL, UM_DL_FLOAT, 32, 1, 0, (void **)&t), UM_OK);
    cr_assert_eq(t->dl_tensor.data, bn.cl_mem);
    /* The consumer reads the buffer's current bytes through the cl_mem. */
    cl_read(&nat, t->dl_tensor.data, (size_t)t->dl_tensor.byte_offset, got, BYTES - 256);
    ub_assert_bytes(got, want + 256, BYTES - 256, "tensor bytes on device %d", k);
    cr_assert_eq(um_release(b), UM_OK);
    cl_read(&nat, t->dl_tensor.data, 0, got, 16); /* still the tensor's */
    ub_assert_bytes(got, want, 16, "after the release");
    t->deleter(t);
  }
  cr_assert_eq(ut_stats(e.m, NULL).active_buffers, 0);
  ou_close(&e);
}

OU_TEST_1_AND_2(opencl_dlpack, cl_mem_imports_zero_copy) {
  ou_env e = ou_open(NULL, 1);
  for (int k = 0; k < e.ndev; k++) {
    um_device_native nat;
    unsigned char want[BYTES], got[BYTES];
    producer p;
    um_buffer *b = NULL;
    um_buffer_native bn;
    cr_assert_eq(um_device_native_get(e.dev[k], &nat), UM_OK);
    cl_mem mem = cl_buffer(&nat, BYTES, 9);
    ub_pattern(want, BYTES, 9);
    producer_init(&p, mem, k, 0, BYTES);
    cr_assert_eq(um_dlpack_import(e.m, &p.t, 0, &b), UM_OK, "%s", um_last_error());
    cr_assert_eq(um_buffer_device(b), e.dev[k]);
    cr_assert_eq(um_buffer_location(b), UM_DEVICE);
    cr_assert_eq(um_buffer_size(b), BYTES);
    cr_assert_eq(um_buffer_native_get(b, &bn), UM_OK);
    cr_assert_eq(bn.cl_mem, (void *)mem, "the producer's cl_mem itself");
    cr_assert_eq(um_copy_to_host(b, 0, got, BYTES, NULL), UM_OK);
    ub_assert_bytes(got, want, BYTES, "imported bytes");
    cr_assert_eq(um_fill(b, 100, 0xab, 50, NULL), UM_OK);
    cl_read(&nat, mem, 100, got, 50);
    for (int i = 0; i < 50; i++)
      cr_assert_eq(got[i], 0xab);
    cr_assert_eq(um_release(b), UM_OK);
    cr_assert_eq(p.deleted, 1);
    cr_assert_eq(clReleaseMemObject(mem), CL_SUCCESS);
  }
  ou_close(&e);
}

Test(opencl_dlpack, byte_offset_imports_as_a_sub_buffer) {
  ou_env e = ou_open(NULL, 1);
  um_device_native nat;
  cl_uint align_bits = 0;
  unsigned char want[BYTES], got[512];
  producer p;
  um_buffer *b = NULL;
  cr_assert_eq(um_device_native_get(e.dev[0], &nat), UM_OK);
  cr_assert_eq(clGetDeviceInfo((cl_device_id)nat.cl_device, CL_DEVICE_MEM_BASE_ADDR_ALIGN, sizeof(align_bits),
                               &align_bits, NULL), CL_SUCCESS);
  size_t align = align_bits / 8;
  cr_assert(align > 1 && align <= 1024, "alignment %zu", align);
  cl_mem mem = cl_buffer(&nat, BYTES, 4);
  ub_pattern(want, BYTES, 4);
  producer_init(&p, mem, 0, align, 512);
  cr_assert_eq(um_dlpack_import(e.m, &p.t, 0, &b), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_copy_to_host(b, 0, got, 512, NULL), UM_OK);
  ub_assert_bytes(got, want + align, 512, "bytes from the offset on");
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(p.deleted, 1);
  /* Misaligned: the device cannot start a sub-buffer there. */
  producer_init(&p, mem, 0, 3, 512);
  cr_assert_eq(um_dlpack_import(e.m, &p.t, 0, &b), UM_ENOTSUP);
  /* Past the end of the cl_mem. */
  producer_init(&p, mem, 0, 0, BYTES + 1);
  cr_assert_eq(um_dlpack_import(e.m, &p.t, 0, &b), UM_ERANGE);
  producer_init(&p, mem, 0, align, BYTES);
  cr_assert_eq(um_dlpack_import(e.m, &p.t, 0, &b), UM_ERANGE);
  producer_init(&p, mem, 0, (uint64_t)BYTES * 2, 1);
  cr_assert_eq(um_dlpack_import(e.m, &p.t, 0, &b), UM_ERANGE);
  cr_assert_eq(p.deleted, 0);
  cr_assert_eq(clReleaseMemObject(mem), CL_SUCCESS);
  cr_assert_eq(ut_stats(e.m, NULL).active_buffers, 0);
  ou_close(&e);
}

/* (Unknown ordinals: conformance/test_dlpack.c, unknown_ordinals_answer_enodev.) */
Test(opencl_dlpack, cl_mem_of_another_context_is_refused) {
  ou_env e = ou_open(NULL, 1);
  um_device_native nat;
  cl_int err;
  producer p;
  um_buffer *b = NULL;
  cr_assert_eq(um_device_native_get(e.dev[0], &nat), UM_OK);
  cl_device_id dev = (cl_device_id)nat.cl_device;
  cl_context other = clCreateContext(NULL, 1, &dev, NULL, NULL, &err);
  cr_assert_eq(err, CL_SUCCESS);
  cl_mem foreign = clCreateBuffer(other, CL_MEM_READ_WRITE, BYTES, NULL, &err);
  cr_assert_eq(err, CL_SUCCESS);
  producer_init(&p, foreign, 0, 0, BYTES);
  cr_assert_eq(um_dlpack_import(e.m, &p.t, 0, &b), UM_EINVAL, "a cl_mem of another context");
  cr_assert_eq(p.deleted, 0);
  cr_assert_eq(ut_stats(e.m, NULL).active_buffers, 0);
  clReleaseMemObject(foreign);
  clReleaseContext(other);
  ou_close(&e);
}

/* Export, import the tensor back, and compute on the import with a kernel
 * ordered through the access bracket: the original sees the result. */
Test(opencl_dlpack, round_trip_with_a_kernel) {
  static const char *src = "__kernel void inc(__global uchar *x) { x[get_global_id(0)] += 1; }\n";
  ou_env e = ou_open(NULL, 1);
  um_device_native nat;
  cl_int err;
  unsigned char want[BYTES], got[BYTES];
  int64_t shape[1] = {BYTES};
  um_dl_managed_tensor_versioned *v = NULL;
  um_buffer *b = ub_alloc(e.m, e.dev[0], BYTES, UM_DEVICE), *w = NULL;
  um_buffer_native wn;
  void *wait = NULL;
  cl_event done = NULL;
  size_t global = BYTES;
  cr_assert_eq(um_device_native_get(e.dev[0], &nat), UM_OK);
  cl_device_id dev = (cl_device_id)nat.cl_device;
  cl_program prog = clCreateProgramWithSource((cl_context)nat.cl_context, 1, &src, NULL, &err);
  cr_assert_eq(clBuildProgram(prog, 1, &dev, "", NULL, NULL), CL_SUCCESS);
  cl_kernel inc = clCreateKernel(prog, "inc", &err);
  ub_pattern(want, BYTES, 7);
  cr_assert_eq(um_copy_from_host(b, 0, want, BYTES, NULL), UM_OK);
  cr_assert_eq(um_dlpack_export(b, 0, 1, shape, NULL, UM_DL_UINT, 8, 1, UM_DLPACK_VERSIONED, (void **)&v), UM_OK);
  cr_assert_eq(um_dlpack_import(e.m, v, UM_DLPACK_VERSIONED, &w), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_release(b), UM_OK); /* w's tensor holds it */
  cr_assert_eq(um_buffer_native_get(w, &wn), UM_OK);
  cr_assert_eq(um_access_begin(w, UM_MAP_READ_WRITE, &wait), UM_OK);
  cr_assert_eq(clSetKernelArg(inc, 0, sizeof(cl_mem), &wn.cl_mem), CL_SUCCESS);
  cr_assert_eq(clEnqueueNDRangeKernel((cl_command_queue)nat.cl_queue, inc, 1, NULL, &global, NULL, wait ? 1 : 0,
                                      wait ? (cl_event *)&wait : NULL, &done), CL_SUCCESS);
  cr_assert_eq(um_access_end(w, done), UM_OK);
  clReleaseEvent(done);
  cr_assert_eq(um_copy_to_host(w, 0, got, BYTES, NULL), UM_OK);
  for (int i = 0; i < BYTES; i++)
    want[i] = (unsigned char)(want[i] + 1);
  ub_assert_bytes(got, want, BYTES, "kernel result");
  cr_assert_eq(um_release(w), UM_OK);
  cr_assert_eq(ut_stats(e.m, NULL).active_buffers, 0);
  clReleaseKernel(inc);
  clReleaseProgram(prog);
  ou_close(&e);
}

/* um_release_after of a wrap (an imported cl_mem): released as um_release
 * releases a wrap, it returns only once the event completed, and the
 * producer's deleter has run by then. Another thread sets the event. */
typedef struct setter {
  cl_event ev;
  atomic_int set;
} setter;

static void *set_later(void *p) {
  setter *s = p;
  usleep(100000);
  atomic_store(&s->set, 1);
  cr_assert_eq(clSetUserEventStatus(s->ev, CL_COMPLETE), CL_SUCCESS);
  return NULL;
}

OU_TEST_1_AND_2(opencl_dlpack, release_after_of_a_wrap_waits_for_the_event) {
  ou_env e = ou_open(NULL, 1);
  um_device_native nat;
  producer p;
  um_buffer *b = NULL;
  setter s;
  pthread_t t;
  cl_int err;
  cr_assert_eq(um_device_native_get(e.dev[0], &nat), UM_OK);
  cl_mem mem = cl_buffer(&nat, BYTES, 4);
  producer_init(&p, mem, 0, 0, BYTES);
  cr_assert_eq(um_dlpack_import(e.m, &p.t, 0, &b), UM_OK, "%s", um_last_error());
  s.ev = clCreateUserEvent((cl_context)nat.cl_context, &err);
  cr_assert_eq(err, CL_SUCCESS);
  atomic_init(&s.set, 0);
  cr_assert_eq(pthread_create(&t, NULL, set_later, &s), 0);
  cr_assert_eq(um_release_after(b, s.ev), UM_OK, "%s", um_last_error());
  cr_assert_eq(atomic_load(&s.set), 1, "returned only after the event was set");
  cr_assert_eq(p.deleted, 1, "the producer has its memory back");
  pthread_join(t, NULL);
  clReleaseEvent(s.ev);
  cr_assert_eq(clReleaseMemObject(mem), CL_SUCCESS);
  ou_close(&e);
}
