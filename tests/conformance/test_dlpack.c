/* DLPack (SPEC §9). On every profile's device (profile.h): each location
 * exports as the tensor unimem.h describes (device type and ordinal; data
 * the host view, the CUdeviceptr, or the cl_mem with its byte_offset) and
 * imports back over the same memory; versioned tensors carry their version
 * and flags; a tensor keeps its buffer alive after the caller's release;
 * deleters run exactly once, from several threads too; an export waits for
 * what was issued before it; the leak report names tensors never deleted
 * and an import never released gives its tensor back at destroy; bad
 * arguments and unknown ordinals answer exact codes. On the cpu profile
 * alone (their answers do not depend on a device): the structures pinned
 * to the published ABI, read-only wraps, a device without a DLPack type,
 * tensors of host memory from a producer, and every bad tensor.
 * backends/test_opencl_dlpack.c checks cl_mem tensors through the test's
 * own OpenCL calls. */
#include <pthread.h>
#include <stddef.h>

#include "bytes.h"
#include "profile.h"
#include "unimem_dlpack.h"

static void cpu_profile_only(void) { ut_profile_only("cpu"); }

TestSuite(dlpack_layout, .init = cpu_profile_only);
TestSuite(dlpack_host, .init = cpu_profile_only);
TestSuite(dlpack_import, .init = cpu_profile_only);

/* ------------------------------------------------------------------------ */
/* The layout: offsets and sizes of DLPack's published ABI (LP64). */

Test(dlpack_layout, structures_match_the_published_abi) {
  cr_assert_eq(sizeof(void *), 8, "the pinned numbers are LP64's");
  cr_assert_eq(sizeof(um_dl_version), 8);
  cr_assert_eq(offsetof(um_dl_version, major), 0);
  cr_assert_eq(offsetof(um_dl_version, minor), 4);
  cr_assert_eq(sizeof(um_dl_device), 8);
  cr_assert_eq(offsetof(um_dl_device, device_type), 0);
  cr_assert_eq(offsetof(um_dl_device, device_id), 4);
  cr_assert_eq(sizeof(um_dl_dtype), 4);
  cr_assert_eq(offsetof(um_dl_dtype, code), 0);
  cr_assert_eq(offsetof(um_dl_dtype, bits), 1);
  cr_assert_eq(offsetof(um_dl_dtype, lanes), 2);
  cr_assert_eq(sizeof(um_dl_tensor), 48);
  cr_assert_eq(offsetof(um_dl_tensor, data), 0);
  cr_assert_eq(offsetof(um_dl_tensor, device), 8);
  cr_assert_eq(offsetof(um_dl_tensor, ndim), 16);
  cr_assert_eq(offsetof(um_dl_tensor, dtype), 20);
  cr_assert_eq(offsetof(um_dl_tensor, shape), 24);
  cr_assert_eq(offsetof(um_dl_tensor, strides), 32);
  cr_assert_eq(offsetof(um_dl_tensor, byte_offset), 40);
  cr_assert_eq(sizeof(um_dl_managed_tensor), 64);
  cr_assert_eq(offsetof(um_dl_managed_tensor, dl_tensor), 0);
  cr_assert_eq(offsetof(um_dl_managed_tensor, manager_ctx), 48);
  cr_assert_eq(offsetof(um_dl_managed_tensor, deleter), 56);
  cr_assert_eq(sizeof(um_dl_managed_tensor_versioned), 80);
  cr_assert_eq(offsetof(um_dl_managed_tensor_versioned, version), 0);
  cr_assert_eq(offsetof(um_dl_managed_tensor_versioned, manager_ctx), 8);
  cr_assert_eq(offsetof(um_dl_managed_tensor_versioned, deleter), 16);
  cr_assert_eq(offsetof(um_dl_managed_tensor_versioned, flags), 24);
  cr_assert_eq(offsetof(um_dl_managed_tensor_versioned, dl_tensor), 32);
}

Test(dlpack_layout, constants_match_the_published_values) {
  cr_assert_eq(UM_DL_CPU, 1);
  cr_assert_eq(UM_DL_CUDA, 2);
  cr_assert_eq(UM_DL_CUDA_HOST, 3);
  cr_assert_eq(UM_DL_OPENCL, 4);
  cr_assert_eq(UM_DL_VULKAN, 7);
  cr_assert_eq(UM_DL_METAL, 8);
  cr_assert_eq(UM_DL_ROCM, 10);
  cr_assert_eq(UM_DL_CUDA_MANAGED, 13);
  cr_assert_eq(UM_DL_ONEAPI, 14);
  cr_assert_eq(UM_DL_INT, 0);
  cr_assert_eq(UM_DL_UINT, 1);
  cr_assert_eq(UM_DL_FLOAT, 2);
  cr_assert_eq(UM_DL_BFLOAT, 4);
  cr_assert_eq(UM_DL_COMPLEX, 5);
  cr_assert_eq(UM_DL_BOOL, 6);
  cr_assert_eq(UM_DL_FLAG_READ_ONLY, 1);
  cr_assert_eq(UM_DL_FLAG_IS_COPIED, 2);
  cr_assert_eq(UM_DL_FLAG_IS_SUBBYTE_TYPE_PADDED, 4);
  cr_assert_eq(UM_DL_MAJOR_VERSION, 1);
}

/* ------------------------------------------------------------------------ */
/* cpu profile: host memory */

/* A read-only wrap: versioned tensors say so, a legacy one cannot. */
Test(dlpack_host, read_only_wrap) {
  um_manager *m = ut_manager();
  static const char text[] = "read only bytes";
  um_buffer *b = NULL;
  int64_t shape[1] = {sizeof(text)};
  um_dl_managed_tensor_versioned *v = NULL;
  void *t = NULL;
  cr_assert_eq(um_wrap_host(m, (void *)text, sizeof(text), UM_WRAP_READONLY, &b), UM_OK);
  cr_assert_eq(um_dlpack_export(b, 0, 1, shape, NULL, UM_DL_UINT, 8, 1, 0, &t), UM_ESTATE);
  cr_assert_eq(um_dlpack_export(b, 0, 1, shape, NULL, UM_DL_UINT, 8, 1, UM_DLPACK_VERSIONED, (void **)&v), UM_OK);
  cr_assert_eq(v->flags, UM_DL_FLAG_READ_ONLY);
  cr_assert_str_eq(v->dl_tensor.data, text);
  v->deleter(v);
  um_release(b);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* A device with no host view and no DLPack device type. */
Test(dlpack_host, device_memory_without_a_dlpack_type_is_not_supported) {
  um_manager *m = ut_manager_disc();
  um_buffer *b = NULL;
  int64_t shape[1] = {16};
  int32_t type, id;
  void *t = NULL;
  cr_assert_eq(um_alloc(m, um_device_get(m, 1), 16, UM_DEVICE, 0, &b), UM_OK);
  cr_assert_eq(um_dlpack_export(b, 0, 1, shape, NULL, UM_DL_UINT, 8, 1, 0, &t), UM_ENOTSUP);
  cr_assert_eq(um_dlpack_device(b, &type, &id), UM_ENOTSUP);
  um_release(b);
  /* HOST memory of that device is host memory: CPU. */
  cr_assert_eq(um_alloc(m, um_device_get(m, 1), 16, UM_HOST, 0, &b), UM_OK);
  cr_assert_eq(um_dlpack_device(b, &type, &id), UM_OK);
  cr_assert_eq(type, UM_DL_CPU);
  cr_assert_eq(um_dlpack_export(b, 0, 1, shape, NULL, UM_DL_UINT, 8, 1, 0, &t), UM_OK);
  ((um_dl_managed_tensor *)t)->deleter(t);
  um_release(b);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* ------------------------------------------------------------------------ */
/* Import */

typedef struct producer {
  um_dl_managed_tensor legacy;
  um_dl_managed_tensor_versioned versioned;
  int64_t shape[3];
  int64_t strides[3];
  int deleted;
} producer;

static void producer_delete(um_dl_managed_tensor *self) { ((producer *)self->manager_ctx)->deleted++; }
static void producer_delete_v(um_dl_managed_tensor_versioned *self) {
  ((producer *)self->manager_ctx)->deleted++;
}

/* A C-contiguous float32 tensor of 4 x 8 over data. */
static void producer_init(producer *p, void *data) {
  memset(p, 0, sizeof(*p));
  p->shape[0] = 4, p->shape[1] = 8;
  um_dl_tensor t = {data, {UM_DL_CPU, 0}, 2, {UM_DL_FLOAT, 32, 1}, p->shape, NULL, 0};
  p->legacy.dl_tensor = t;
  p->legacy.manager_ctx = p;
  p->legacy.deleter = producer_delete;
  p->versioned.version.major = 1;
  p->versioned.version.minor = 1;
  p->versioned.dl_tensor = t;
  p->versioned.manager_ctx = p;
  p->versioned.deleter = producer_delete_v;
}

Test(dlpack_import, legacy_tensor_becomes_a_host_wrap_zero_copy) {
  um_manager *m = ut_manager();
  float data[40];
  producer p;
  um_buffer *b = NULL;
  for (int i = 0; i < 40; i++)
    data[i] = (float)i;
  producer_init(&p, data);
  p.legacy.dl_tensor.byte_offset = 8 * sizeof(float);
  cr_assert_eq(um_dlpack_import(m, &p.legacy, 0, &b), UM_OK);
  cr_assert_eq(um_buffer_size(b), 32 * sizeof(float));
  cr_assert_eq(um_buffer_host_ptr(b), (void *)&data[8]);
  cr_assert_eq(um_buffer_device(b), um_device_get(m, 0));
  cr_assert_eq(um_buffer_location(b), UM_HOST);
  float v = 99.0f;
  cr_assert_eq(um_copy_from_host(b, 4, &v, sizeof(v), NULL), UM_OK);
  cr_assert_eq(data[9], 99.0f, "the producer's memory itself");
  cr_assert_eq(p.deleted, 0);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(p.deleted, 1, "exactly once, at the release");
  cr_assert_eq(um_manager_destroy(m), UM_OK);
  cr_assert_eq(p.deleted, 1);
}

Test(dlpack_import, versioned_read_only_tensor_makes_a_read_only_wrap) {
  um_manager *m = ut_manager();
  float data[32] = {0};
  producer p;
  um_buffer *b = NULL;
  void *host = NULL;
  float v = 1.0f;
  producer_init(&p, data);
  p.versioned.flags = UM_DL_FLAG_READ_ONLY;
  cr_assert_eq(um_dlpack_import(m, &p.versioned, UM_DLPACK_VERSIONED, &b), UM_OK);
  cr_assert_eq(um_copy_from_host(b, 0, &v, sizeof(v), NULL), UM_ESTATE);
  cr_assert_eq(um_map(b, UM_MAP_WRITE, 0, 4, &host), UM_ESTATE);
  cr_assert_eq(um_copy_to_host(b, 0, &v, sizeof(v), NULL), UM_OK);
  cr_assert_eq(v, 0.0f);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(p.deleted, 1);
  /* UM_DLPACK_READONLY asks the same of a writable tensor. */
  p.deleted = 0;
  cr_assert_eq(um_dlpack_import(m, &p.legacy, UM_DLPACK_READONLY, &b), UM_OK);
  cr_assert_eq(um_fill(b, 0, 1, 4, NULL), UM_ESTATE);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(p.deleted, 1);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* The deleter runs after the operations issued on the buffer. */
Test(dlpack_import, deleter_runs_after_pending_operations) {
  um_manager *m = ut_manager();
  static unsigned char data[4 << 20];
  static unsigned char out[4 << 20];
  int64_t shape[1] = {sizeof(data)};
  producer p;
  um_buffer *b = NULL;
  um_event *e = NULL;
  producer_init(&p, data);
  p.legacy.dl_tensor.ndim = 1;
  p.legacy.dl_tensor.shape = shape;
  p.legacy.dl_tensor.dtype.bits = 8;
  memset(data, 0x33, sizeof(data));
  cr_assert_eq(um_dlpack_import(m, &p.legacy, 0, &b), UM_OK);
  cr_assert_eq(um_copy_to_host(b, 0, out, sizeof(out), &e), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(p.deleted, 1);
  cr_assert_eq(um_event_query(e), UM_OK, "the copy finished before the memory went back");
  cr_assert_eq(out[sizeof(out) - 1], 0x33);
  um_event_release(e);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

Test(dlpack_import, strides_of_size_one_dimensions_are_ignored) {
  um_manager *m = ut_manager();
  float data[32];
  producer p;
  um_buffer *b = NULL;
  producer_init(&p, data);
  p.shape[0] = 1, p.shape[1] = 32;
  p.strides[0] = 12345, p.strides[1] = 1;
  p.legacy.dl_tensor.strides = p.strides;
  cr_assert_eq(um_dlpack_import(m, &p.legacy, 0, &b), UM_OK);
  cr_assert_eq(um_buffer_size(b), 128);
  um_release(b);
  /* A null deleter is allowed. */
  p.legacy.deleter = NULL;
  cr_assert_eq(um_dlpack_import(m, &p.legacy, 0, &b), UM_OK);
  um_release(b);
  cr_assert_eq(p.deleted, 1);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* Every bad tensor of host memory: the exact code, the tensor untouched,
 * nothing counted. */
Test(dlpack_import, bad_tensors_answer_exact_codes) {
  um_manager *m = ut_manager();
  float data[32];
  producer p;
  um_buffer *b = (um_buffer *)0x1;
  ut_snapshot before = ut_snap(m);
#define IMPORT_FAILS(code, tensor, flags)                                                          \
  do {                                                                                             \
    cr_assert_eq(um_dlpack_import(m, (tensor), (flags), &b), (code), "%s", um_last_error());       \
    cr_assert_eq(p.deleted, 0);                                                                    \
    producer_init(&p, data);                                                                       \
  } while (0)
  producer_init(&p, data);
  cr_assert_eq(um_dlpack_import(NULL, &p.legacy, 0, &b), UM_EINVAL);
  cr_assert_eq(um_dlpack_import(m, NULL, 0, &b), UM_EINVAL);
  cr_assert_eq(um_dlpack_import(m, &p.legacy, 0, NULL), UM_EINVAL);
  IMPORT_FAILS(UM_EINVAL, &p.legacy, 1u << 5);
  IMPORT_FAILS(UM_EINVAL, &p.legacy, UM_DLPACK_COPIED);
  p.legacy.dl_tensor.data = NULL;
  IMPORT_FAILS(UM_EINVAL, &p.legacy, 0);
  p.legacy.dl_tensor.shape = NULL;
  IMPORT_FAILS(UM_EINVAL, &p.legacy, 0);
  p.legacy.dl_tensor.ndim = -1;
  IMPORT_FAILS(UM_EINVAL, &p.legacy, 0);
  p.shape[1] = -8;
  IMPORT_FAILS(UM_EINVAL, &p.legacy, 0);
  p.shape[1] = 0;
  IMPORT_FAILS(UM_EINVAL, &p.legacy, 0);
  p.legacy.dl_tensor.dtype.bits = 0;
  IMPORT_FAILS(UM_EINVAL, &p.legacy, 0);
  p.legacy.dl_tensor.dtype.lanes = 0;
  IMPORT_FAILS(UM_EINVAL, &p.legacy, 0);
  p.legacy.dl_tensor.dtype.bits = 4;
  IMPORT_FAILS(UM_ENOTSUP, &p.legacy, 0);
  p.strides[0] = 1, p.strides[1] = 4; /* Fortran order */
  p.legacy.dl_tensor.strides = p.strides;
  IMPORT_FAILS(UM_ENOTSUP, &p.legacy, 0);
  p.strides[0] = 16, p.strides[1] = 2; /* every other element */
  p.legacy.dl_tensor.strides = p.strides;
  IMPORT_FAILS(UM_ENOTSUP, &p.legacy, 0);
  p.versioned.version.major = 2;
  IMPORT_FAILS(UM_ENOTSUP, &p.versioned, UM_DLPACK_VERSIONED);
  p.versioned.version.major = 0;
  IMPORT_FAILS(UM_ENOTSUP, &p.versioned, UM_DLPACK_VERSIONED);
  p.legacy.dl_tensor.device.device_type = UM_DL_VULKAN;
  IMPORT_FAILS(UM_ENOTSUP, &p.legacy, 0);
  p.legacy.dl_tensor.device.device_type = 999;
  IMPORT_FAILS(UM_ENOTSUP, &p.legacy, 0);
  /* device types the manager has no device of: dlpack.unknown_ordinals_answer_enodev */
  p.shape[0] = INT64_MAX, p.shape[1] = 4;
  IMPORT_FAILS(UM_EOVERFLOW, &p.legacy, 0);
  p.shape[0] = (int64_t)1 << 61, p.shape[1] = 1;
  IMPORT_FAILS(UM_EOVERFLOW, &p.legacy, 0);
  p.legacy.dl_tensor.byte_offset = UINT64_MAX - 8;
  IMPORT_FAILS(UM_EOVERFLOW, &p.legacy, 0);
#undef IMPORT_FAILS
  cr_assert_eq(b, (um_buffer *)0x1, "out untouched");
  ut_assert_unchanged(m, before);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* ------------------------------------------------------------------------ */
/* Every profile: tensors of the profile's devices */

/* Where a tensor of b at off points, as unimem.h says (um_dlpack_device
 * and um_dlpack_export): st UM_ENOTSUP where there is no DLPack type. k is
 * the device's ordinal among the manager's devices of its backend. */
typedef struct place {
  int st;
  int32_t type, id;
  void *data;
  uint64_t byte_offset;
} place;

static place host_place(um_buffer *b, size_t off) {
  char *h = um_buffer_host_ptr(b);
  place p = {h != NULL ? UM_OK : UM_ENOTSUP, UM_DL_CPU, 0, h != NULL ? h + off : NULL, 0};
  return p;
}

static place expected_place(um_buffer *b, size_t off, int k) {
  um_device_info info;
  um_device_native dn;
  um_buffer_native bn;
  um_location loc = um_buffer_location(b);
  place p = {UM_OK, 0, 0, NULL, 0};
  cr_assert_eq(um_device_info_get(um_buffer_device(b), &info), UM_OK);
  cr_assert_eq(um_device_native_get(um_buffer_device(b), &dn), UM_OK);
  cr_assert_eq(um_buffer_native_get(b, &bn), UM_OK);
  if (loc == UM_HOST || strcmp(info.backend, "cpu") == 0)
    return host_place(b, off);
  if (strcmp(info.backend, "cuda") == 0) {
    if (loc == UM_PINNED) {
      p = host_place(b, off);
      p.type = UM_DL_CUDA_HOST;
    } else {
      p.type = loc == UM_UNIFIED ? UM_DL_CUDA_MANAGED : UM_DL_CUDA;
      p.data = (void *)(uintptr_t)(bn.cu_ptr + bn.offset + off);
    }
    p.id = dn.cu_device;
    return p;
  }
  if (strcmp(info.backend, "opencl") == 0 && loc == UM_DEVICE) {
    p.type = UM_DL_OPENCL;
    p.id = k;
    p.data = bn.cl_mem;
    p.byte_offset = bn.offset + off;
    return p;
  }
  /* OpenCL's PINNED and UNIFIED memory, and any other backend's */
  return host_place(b, off);
}

/* Whether the tensor's data is host memory the test may touch. */
static int host_type(int32_t type) { return type == UM_DL_CPU || type == UM_DL_CUDA_HOST; }

/* The location of the profile's device that exports: DEVICE, or HOST where
 * DEVICE memory has no DLPack type (the fault backend's). */
static um_location exportable(ut_env *e) {
  um_buffer *b = ub_alloc(e->m, e->dev, 64, UM_DEVICE);
  int32_t type, id;
  int st = um_dlpack_device(b, &type, &id);
  cr_assert(st == UM_OK || st == UM_ENOTSUP, "%s", um_err_name(st));
  cr_assert_eq(um_release(b), UM_OK);
  return st == UM_OK ? UM_DEVICE : UM_HOST;
}

static int64_t active(um_manager *m) { return (int64_t)ut_stats(m, NULL).active_buffers; }

/* Every location of every device of the profile: the type and ordinal, the
 * legacy tensor's fields, writes through a tensor of host memory, and the
 * tensor imported back: the same bytes, the same memory (a fill through the
 * import is read through the original, released meanwhile), the deleter
 * the import's last release. */
static void export_one(ut_env *e, int k, um_location loc) {
  const size_t n = 4096, off = 1024;
  um_buffer *b = ub_alloc_pattern(e->m, e->dev_of[k], n, loc, (unsigned)(k * 4 + loc)), *w = NULL;
  unsigned char want[2048], got[2048], byte = 0;
  int64_t shape[2] = {16, 32};
  um_dl_managed_tensor *t = NULL;
  int32_t type = -1, id = -1;
  int64_t live = active(e->m);
  place p = expected_place(b, off, k);
  cr_assert_eq(um_dlpack_device(b, &type, &id), p.st, "device %d location %d", k, (int)loc);
  if (p.st == UM_ENOTSUP) {
    cr_assert_eq(um_dlpack_export(b, 0, 1, shape, NULL, UM_DL_UINT, 8, 1, 0, (void **)&t), UM_ENOTSUP);
    cr_assert_eq(um_release(b), UM_OK);
    return;
  }
  cr_assert_eq(type, p.type, "device %d location %d", k, (int)loc);
  cr_assert_eq(id, p.id);
  cr_assert_eq(um_dlpack_export(b, off, 2, shape, NULL, UM_DL_FLOAT, 32, 1, 0, (void **)&t), UM_OK, "%s",
               um_last_error());
  cr_assert_eq(t->dl_tensor.data, p.data);
  cr_assert_eq(t->dl_tensor.byte_offset, p.byte_offset);
  cr_assert_eq(t->dl_tensor.device.device_type, p.type);
  cr_assert_eq(t->dl_tensor.device.device_id, p.id);
  cr_assert_eq(t->dl_tensor.ndim, 2);
  cr_assert_eq(t->dl_tensor.shape[0], 16);
  cr_assert_eq(t->dl_tensor.shape[1], 32);
  cr_assert_null(t->dl_tensor.strides);
  cr_assert_eq(t->dl_tensor.dtype.code, UM_DL_FLOAT);
  cr_assert_eq(t->dl_tensor.dtype.bits, 32);
  cr_assert_eq(t->dl_tensor.dtype.lanes, 1);
  cr_assert_not_null(t->deleter);
  {
    unsigned char all[4096];
    ub_pattern(all, n, (unsigned)(k * 4 + loc));
    memcpy(want, all + off, sizeof(want));
  }
  if (host_type(p.type)) { /* writes through the tensor are the buffer's bytes */
    float back = 0;
    ((float *)t->dl_tensor.data)[0] = 2.5f;
    memcpy(want, &(float){2.5f}, sizeof(float));
    cr_assert_eq(um_copy_to_host(b, off, &back, sizeof(back), NULL), UM_OK);
    cr_assert_eq(back, 2.5f);
  }
  cr_assert_eq(um_dlpack_import(e->m, t, 0, &w), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_buffer_size(w), sizeof(want));
  if (host_type(p.type)) {
    cr_assert_eq(um_buffer_device(w), um_device_get(e->m, 0), "host memory imports on device 0");
    cr_assert_eq(um_buffer_location(w), UM_HOST);
    cr_assert_eq(um_buffer_host_ptr(w), p.data);
  } else {
    cr_assert_eq(um_buffer_device(w), e->dev_of[k]);
    cr_assert_eq(um_buffer_location(w), p.type == UM_DL_CUDA_MANAGED ? UM_UNIFIED : UM_DEVICE);
  }
  cr_assert_eq(um_copy_to_host(w, 0, got, sizeof(got), NULL), UM_OK, "%s", um_last_error());
  ub_assert_bytes(got, want, sizeof(want), "the import's bytes, device %d location %d", k, (int)loc);
  cr_assert_eq(um_release(b), UM_OK); /* the import's tensor holds it */
  cr_assert_eq(active(e->m), live + 1);
  cr_assert_eq(um_fill(w, 100, 0xee, 1, NULL), UM_OK);
  cr_assert_eq(um_copy_to_host(b, off + 100, &byte, 1, NULL), UM_OK, "%s", um_last_error());
  cr_assert_eq(byte, 0xee, "the import is the original's memory");
  cr_assert_eq(active(e->m), live + 1);
  cr_assert_eq(um_release(w), UM_OK); /* runs the deleter: b goes too */
  cr_assert_eq(active(e->m), live - 1);
  cr_assert_eq(um_release(b), UM_ESTATE);
}

Test(dlpack, every_location_exports_and_imports_back) {
  ut_env e = ut_profile_open(NULL);
  int tried = 0;
  for (int k = 0; k < e.ndev; k++) {
    um_device_info info;
    cr_assert_eq(um_device_info_get(e.dev_of[k], &info), UM_OK);
    for (int loc = 0; loc < UM_LOCATION_COUNT; loc++)
      if (info.locations & (1u << loc)) {
        export_one(&e, k, (um_location)loc);
        tried++;
      }
  }
  cr_assert_geq(tried, 2, "every device has HOST and DEVICE");
  cr_assert_eq(active(e.m), 0);
  ut_profile_close(&e);
}

Test(dlpack, versioned_tensor_carries_version_and_flags) {
  ut_env e = ut_profile_open(NULL);
  um_buffer *b = ub_alloc_pattern(e.m, e.dev, 64, exportable(&e), 1);
  int64_t shape[1] = {8}, strides[1] = {2};
  um_dl_managed_tensor_versioned *v = NULL;
  place p = expected_place(b, 0, 0);
  cr_assert_eq(um_dlpack_export(b, 0, 1, shape, strides, UM_DL_INT, 16, 1,
                                UM_DLPACK_VERSIONED | UM_DLPACK_READONLY | UM_DLPACK_COPIED, (void **)&v),
               UM_OK);
  cr_assert_eq(v->version.major, 1);
  cr_assert_eq(v->version.minor, 0);
  cr_assert_eq(v->flags, UM_DL_FLAG_READ_ONLY | UM_DL_FLAG_IS_COPIED);
  cr_assert_eq(v->dl_tensor.data, p.data);
  cr_assert_eq(v->dl_tensor.device.device_type, p.type);
  cr_assert_eq(v->dl_tensor.strides[0], 2);
  cr_assert_eq(v->manager_ctx, (void *)v);
  v->deleter(v);
  cr_assert_eq(um_release(b), UM_OK);
  ut_profile_close(&e);
}

/* Released while a tensor holds it: the buffer stays live (its memory, its
 * size, the statistics), and the deleter is the last release. */
Test(dlpack, buffer_released_while_a_tensor_holds_it_stays_alive) {
  ut_env e = ut_profile_open(NULL);
  um_buffer *b = ub_alloc_pattern(e.m, e.dev, 256, exportable(&e), 2);
  int64_t shape[1] = {256};
  um_dl_managed_tensor *t = NULL;
  unsigned char want[256], byte = 0;
  ub_pattern(want, sizeof(want), 2);
  cr_assert_eq(um_dlpack_export(b, 0, 1, shape, NULL, UM_DL_UINT, 8, 1, 0, (void **)&t), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(active(e.m), 1);
  cr_assert_eq(um_buffer_size(b), 256, "still live for the tensor");
  cr_assert_eq(um_copy_to_host(b, 255, &byte, 1, NULL), UM_OK, "%s", um_last_error());
  cr_assert_eq(byte, want[255]);
  if (host_type(t->dl_tensor.device.device_type))
    cr_assert_eq(((unsigned char *)t->dl_tensor.data)[255], want[255]);
  t->deleter(t);
  cr_assert_eq(active(e.m), 0);
  cr_assert_eq(um_release(b), UM_ESTATE, "the deleter's release was the last");
  ut_profile_close(&e);
}

Test(dlpack, two_tensors_need_both_deleters) {
  ut_env e = ut_profile_open(NULL);
  um_buffer *b = ub_alloc_pattern(e.m, e.dev, 64, exportable(&e), 3);
  int64_t shape[1] = {64};
  um_dl_managed_tensor *t1 = NULL, *t2 = NULL;
  cr_assert_eq(um_dlpack_export(b, 0, 1, shape, NULL, UM_DL_UINT, 8, 1, 0, (void **)&t1), UM_OK);
  cr_assert_eq(um_dlpack_export(b, 0, 1, shape, NULL, UM_DL_UINT, 8, 1, 0, (void **)&t2), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  t1->deleter(t1);
  cr_assert_eq(active(e.m), 1);
  t2->deleter(t2);
  cr_assert_eq(active(e.m), 0);
  ut_profile_close(&e);
}

/* The export returns once what was issued on the buffer before has
 * finished. */
Test(dlpack, export_waits_for_pending_operations) {
  ut_env e = ut_profile_open(NULL);
  static unsigned char src[1 << 20];
  um_buffer *b = ub_alloc(e.m, e.dev, sizeof(src), exportable(&e));
  int64_t shape[1] = {sizeof(src)};
  um_dl_managed_tensor *t = NULL;
  um_event *ev = NULL;
  unsigned char byte = 0;
  memset(src, 0x5a, sizeof(src));
  cr_assert_eq(um_copy_from_host(b, 0, src, sizeof(src), &ev), UM_OK);
  cr_assert_eq(um_dlpack_export(b, 0, 1, shape, NULL, UM_DL_UINT, 8, 1, 0, (void **)&t), UM_OK);
  cr_assert_eq(um_event_query(ev), UM_OK, "done before the export returned");
  if (host_type(t->dl_tensor.device.device_type))
    cr_assert_eq(((unsigned char *)t->dl_tensor.data)[sizeof(src) - 1], 0x5a);
  cr_assert_eq(um_copy_to_host(b, sizeof(src) - 1, &byte, 1, NULL), UM_OK);
  cr_assert_eq(byte, 0x5a);
  um_event_release(ev);
  t->deleter(t);
  cr_assert_eq(um_release(b), UM_OK);
  ut_profile_close(&e);
}

Test(dlpack, bad_arguments_answer_exact_codes) {
  ut_env e = ut_profile_open(NULL);
  um_buffer *b = ub_alloc_pattern(e.m, e.dev, 64, exportable(&e), 4), *gone = NULL;
  int64_t shape[1] = {64}, neg[1] = {-1}, big[2] = {INT64_MAX, 4}, strides_neg[1] = {-1};
  int64_t wide[1] = {9};
  void *t = (void *)0x1, *host = NULL, *wait = NULL;
  int32_t type, id;
  cr_assert_eq(um_dlpack_export(NULL, 0, 1, shape, NULL, 1, 8, 1, 0, &t), UM_EINVAL);
  cr_assert_eq(um_dlpack_export((um_buffer *)e.m, 0, 1, shape, NULL, 1, 8, 1, 0, &t), UM_EINVAL);
  cr_assert_eq(um_dlpack_export(b, 0, 1, shape, NULL, 1, 8, 1, 0, NULL), UM_EINVAL);
  cr_assert_eq(um_dlpack_export(b, 0, 1, NULL, NULL, 1, 8, 1, 0, &t), UM_EINVAL);
  cr_assert_eq(um_dlpack_export(b, 0, 1, shape, NULL, 1, 8, 1, 1u << 7, &t), UM_EINVAL);
  cr_assert_eq(um_dlpack_export(b, 0, 1, shape, NULL, 1, 8, 1, UM_DLPACK_READONLY, &t), UM_EINVAL);
  cr_assert_eq(um_dlpack_export(b, 0, 1, shape, NULL, 1, 8, 1, UM_DLPACK_COPIED, &t), UM_EINVAL);
  cr_assert_eq(um_dlpack_export(b, 0, -1, shape, NULL, 1, 8, 1, 0, &t), UM_EINVAL);
  cr_assert_eq(um_dlpack_export(b, 0, 65, shape, NULL, 1, 8, 1, 0, &t), UM_EINVAL);
  cr_assert_eq(um_dlpack_export(b, 0, 1, neg, NULL, 1, 8, 1, 0, &t), UM_EINVAL);
  cr_assert_eq(um_dlpack_export(b, 0, 1, shape, strides_neg, 1, 8, 1, 0, &t), UM_EINVAL);
  cr_assert_eq(um_dlpack_export(b, 0, 1, shape, NULL, 1, 0, 1, 0, &t), UM_EINVAL);
  cr_assert_eq(um_dlpack_export(b, 0, 1, shape, NULL, 1, 8, 0, 0, &t), UM_EINVAL);
  cr_assert_eq(um_dlpack_export(b, 0, 1, shape, NULL, 1, 4, 1, 0, &t), UM_EINVAL);
  cr_assert_eq(um_dlpack_export(b, 65, 0, NULL, NULL, 1, 8, 1, 0, &t), UM_ERANGE);
  cr_assert_eq(um_dlpack_export(b, 1, 1, shape, NULL, 1, 8, 1, 0, &t), UM_ERANGE);
  cr_assert_eq(um_dlpack_export(b, 0, 1, wide, NULL, 1, 64, 1, 0, &t), UM_ERANGE);
  cr_assert_eq(um_dlpack_export(b, 0, 2, big, NULL, 1, 8, 1, 0, &t), UM_EOVERFLOW);
  cr_assert_eq(um_dlpack_device(b, NULL, &id), UM_EINVAL);
  cr_assert_eq(t, (void *)0x1, "out untouched on failure");
  cr_assert_eq(um_buffer_retain(b), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  /* Mapped, in a bracket, released. */
  cr_assert_eq(um_map(b, UM_MAP_READ, 0, 64, &host), UM_OK);
  cr_assert_eq(um_dlpack_export(b, 0, 1, shape, NULL, 1, 8, 1, 0, &t), UM_ESTATE);
  cr_assert_eq(um_unmap(b, host), UM_OK);
  cr_assert_eq(um_access_begin(b, UM_MAP_READ_WRITE, &wait), UM_OK);
  cr_assert_eq(um_dlpack_export(b, 0, 1, shape, NULL, 1, 8, 1, 0, &t), UM_ESTATE);
  cr_assert_eq(um_access_end(b, NULL), UM_OK);
  cr_assert_eq(um_alloc(e.m, e.dev, 32, UM_HOST, UM_ALLOC_UNPOOLED, &gone), UM_OK);
  cr_assert_eq(um_release(gone), UM_OK);
  cr_assert_eq(um_dlpack_export(gone, 0, 0, NULL, NULL, 1, 8, 1, 0, &t), UM_ESTATE);
  cr_assert_eq(um_dlpack_device(gone, &type, &id), UM_ESTATE);
  cr_assert_eq(t, (void *)0x1);
  cr_assert_eq(active(e.m), 1, "no failed export kept a reference");
  cr_assert_eq(um_release(b), UM_OK);
  ut_profile_close(&e);
}

/* A tensor naming a device the manager lacks: UM_ENODEV for each device
 * type served, at the first ordinal past the manager's devices of its
 * backend (0 where there are none) and at -1; the tensor untouched. */
static int backend_devices(um_manager *m, const char *backend) {
  int n = 0;
  for (int i = 0; i < um_device_count(m); i++) {
    um_device_info info;
    cr_assert_eq(um_device_info_get(um_device_get(m, i), &info), UM_OK);
    n += strcmp(info.backend, backend) == 0;
  }
  return n;
}

typedef struct counted {
  um_dl_managed_tensor t;
  um_dl_managed_tensor_versioned v;
  um_dl_managed_tensor_versioned *inner_v;
  int64_t shape[1];
  int deleted;
} counted;

static void counted_delete(um_dl_managed_tensor *self) { ((counted *)self->manager_ctx)->deleted++; }
static void counted_delete_v(um_dl_managed_tensor_versioned *self) { ((counted *)self->manager_ctx)->deleted++; }

Test(dlpack, unknown_ordinals_answer_enodev) {
  static const struct {
    int32_t type;
    const char *backend;
  } served[] = {{UM_DL_CUDA, "cuda"}, {UM_DL_CUDA_MANAGED, "cuda"}, {UM_DL_OPENCL, "opencl"}};
  ut_env e = ut_profile_open(NULL);
  unsigned char data[64];
  um_buffer *b = (um_buffer *)0x1;
  ut_snapshot before = ut_snap(e.m);
  for (size_t i = 0; i < sizeof(served) / sizeof(served[0]); i++) {
    int32_t ids[2] = {backend_devices(e.m, served[i].backend), -1};
    for (int j = 0; j < 2; j++) {
      counted c = {.shape = {64}};
      um_dl_tensor t = {data, {served[i].type, ids[j]}, 1, {UM_DL_UINT, 8, 1}, c.shape, NULL, 0};
      c.t = (um_dl_managed_tensor){t, &c, counted_delete};
      cr_assert_eq(um_dlpack_import(e.m, &c.t, 0, &b), UM_ENODEV, "type %d ordinal %d: %s", (int)served[i].type,
                   (int)ids[j], um_last_error());
      cr_assert_eq(c.deleted, 0);
    }
  }
  cr_assert_eq(b, (um_buffer *)0x1, "out untouched");
  ut_assert_unchanged(e.m, before);
  ut_profile_close(&e);
}

/* ------------------------------------------------------------------------ */
/* Every profile: the leak report and destroy */

static char leak_line[1024];
static void capture_leak(void *ctx, um_log_level level, const char *msg) {
  (void)ctx;
  if (level == UM_LOG_ERROR && strstr(msg, "was never released") != NULL)
    snprintf(leak_line, sizeof(leak_line), "%s", msg);
}

static ut_env leak_open(void) {
  um_options o;
  ut_profile_options(&o);
  o.log = capture_leak;
  o.log_level = UM_LOG_ERROR;
  return ut_profile_open(&o);
}

Test(dlpack, deleter_never_run_is_a_leak_naming_the_tensor) {
  ut_env e = leak_open();
  um_buffer *b = ub_alloc(e.m, e.dev, 100, exportable(&e));
  int64_t shape[1] = {100};
  um_dl_managed_tensor *t = NULL;
  cr_assert_eq(um_dlpack_export(b, 0, 1, shape, NULL, UM_DL_UINT, 8, 1, 0, (void **)&t), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_manager_destroy(e.m), UM_ELEAK);
  cr_assert_not_null(strstr(leak_line, " of 100 bytes "), "%s", leak_line);
  cr_assert_not_null(strstr(leak_line, "held by 1 DLPack tensor(s) never deleted"), "%s", leak_line);
  free(t->manager_ctx); /* the tensor's own block: the caller's after destroy (unimem.h) */
}

Test(dlpack, retained_buffer_left_at_destroy_is_freed_and_reported) {
  ut_env e = leak_open();
  um_buffer *b = NULL;
  cr_assert_eq(um_alloc(e.m, e.dev, 1 << 20, UM_DEVICE, UM_ALLOC_UNPOOLED, &b), UM_OK);
  cr_assert_eq(um_buffer_retain(b), UM_OK);
  cr_assert_eq(um_buffer_retain(b), UM_OK);
  cr_assert_eq(um_manager_destroy(e.m), UM_ELEAK); /* LeakSanitizer / valgrind: the block is freed */
  cr_assert_not_null(strstr(leak_line, "retained 2 more time(s)"), "%s", leak_line);
}

/* An import never released gives its tensor back at destroy: the producer
 * here is a versioned tensor of the profile's device (an export, passed on
 * under a deleter that counts, the export's own never run). */
Test(dlpack, import_never_released_runs_the_deleter_at_destroy) {
  ut_env e = ut_profile_open(NULL);
  um_buffer *b = ub_alloc_pattern(e.m, e.dev, 4096, exportable(&e), 5), *w = NULL;
  int64_t shape[1] = {4096};
  counted c = {.deleted = 0};
  cr_assert_eq(um_dlpack_export(b, 0, 1, shape, NULL, UM_DL_UINT, 8, 1, UM_DLPACK_VERSIONED, (void **)&c.inner_v),
               UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  c.v = *c.inner_v;
  c.v.manager_ctx = &c;
  c.v.deleter = counted_delete_v;
  cr_assert_eq(um_dlpack_import(e.m, &c.v, UM_DLPACK_VERSIONED, &w), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_fill(w, 0, 1, 4096, NULL), UM_OK);
  cr_assert_eq(c.deleted, 0);
  cr_assert_eq(um_manager_destroy(e.m), UM_ELEAK);
  cr_assert_eq(c.deleted, 1);
  free(c.inner_v->manager_ctx); /* the export's block, its deleter never run */
}

/* Deleters from many threads at once: the buffer released exactly once. */
static void *delete_all(void *arg) {
  um_dl_managed_tensor **ts = arg;
  for (int i = 0; i < 64; i++)
    ts[i]->deleter(ts[i]);
  return NULL;
}

Test(dlpack, deleters_on_several_threads) {
  ut_env e = ut_profile_open(NULL);
  um_buffer *b = ub_alloc_pattern(e.m, e.dev, 64, exportable(&e), 6);
  um_dl_managed_tensor *ts[4][64];
  int64_t shape[1] = {64};
  pthread_t th[4];
  uint64_t releases = ut_stats(e.m, NULL).releases;
  for (int k = 0; k < 4; k++)
    for (int i = 0; i < 64; i++)
      cr_assert_eq(um_dlpack_export(b, 0, 1, shape, NULL, UM_DL_UINT, 8, 1, 0, (void **)&ts[k][i]), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  for (int k = 0; k < 4; k++)
    cr_assert_eq(pthread_create(&th[k], NULL, delete_all, ts[k]), 0);
  for (int k = 0; k < 4; k++)
    pthread_join(th[k], NULL);
  cr_assert_eq(active(e.m), 0);
  cr_assert_eq(ut_stats(e.m, NULL).releases - releases, 1);
  ut_profile_close(&e);
}
