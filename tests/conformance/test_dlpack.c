/* DLPack (SPEC §9) on the cpu device: the structures pinned to the
 * published ABI, export and import both ways and round trips, deleters run
 * exactly once, a buffer outliving its release while a tensor holds it,
 * the leak report naming tensors never deleted, and the exact code of
 * every bad argument and bad tensor. */
#include <pthread.h>
#include <stddef.h>

#include "test_util.h"
#include "unimem_dlpack.h"

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
/* Export */

static um_buffer *filled(um_manager *m, size_t bytes, um_location loc) {
  um_buffer *b = NULL;
  cr_assert_eq(um_alloc(m, um_device_get(m, 0), bytes, loc, 0, &b), UM_OK);
  for (size_t i = 0; i < bytes; i++)
    ((unsigned char *)um_buffer_host_ptr(b))[i] = (unsigned char)(i * 7 + 1);
  return b;
}

Test(dlpack_export, legacy_tensor_describes_the_buffer_zero_copy) {
  um_manager *m = ut_manager();
  um_buffer *b = filled(m, 4096, UM_DEVICE);
  int64_t shape[2] = {16, 32};
  um_dl_managed_tensor *t = NULL;
  int32_t type = -1, id = -1;
  cr_assert_eq(um_dlpack_export(b, 1024, 2, shape, NULL, UM_DL_FLOAT, 32, 1, 0, (void **)&t), UM_OK);
  cr_assert_eq(t->dl_tensor.data, (char *)um_buffer_host_ptr(b) + 1024);
  cr_assert_eq(t->dl_tensor.byte_offset, 0);
  cr_assert_eq(t->dl_tensor.device.device_type, UM_DL_CPU);
  cr_assert_eq(t->dl_tensor.device.device_id, 0);
  cr_assert_eq(t->dl_tensor.ndim, 2);
  cr_assert_eq(t->dl_tensor.shape[0], 16);
  cr_assert_eq(t->dl_tensor.shape[1], 32);
  cr_assert_null(t->dl_tensor.strides);
  cr_assert_eq(t->dl_tensor.dtype.code, UM_DL_FLOAT);
  cr_assert_eq(t->dl_tensor.dtype.bits, 32);
  cr_assert_eq(t->dl_tensor.dtype.lanes, 1);
  cr_assert_not_null(t->deleter);
  cr_assert_eq(um_dlpack_device(b, &type, &id), UM_OK);
  cr_assert_eq(type, UM_DL_CPU);
  cr_assert_eq(id, 0);
  /* Writes through the tensor are the buffer's bytes. */
  ((float *)t->dl_tensor.data)[0] = 2.5f;
  float back = 0;
  cr_assert_eq(um_copy_to_host(b, 1024, &back, sizeof(back), NULL), UM_OK);
  cr_assert_eq(back, 2.5f);
  t->deleter(t);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

Test(dlpack_export, versioned_tensor_carries_version_and_flags) {
  um_manager *m = ut_manager();
  um_buffer *b = filled(m, 64, UM_HOST);
  int64_t shape[1] = {8}, strides[1] = {2};
  um_dl_managed_tensor_versioned *v = NULL;
  cr_assert_eq(um_dlpack_export(b, 0, 1, shape, strides, UM_DL_INT, 16, 1,
                                UM_DLPACK_VERSIONED | UM_DLPACK_READONLY | UM_DLPACK_COPIED, (void **)&v),
               UM_OK);
  cr_assert_eq(v->version.major, 1);
  cr_assert_eq(v->version.minor, 0);
  cr_assert_eq(v->flags, UM_DL_FLAG_READ_ONLY | UM_DL_FLAG_IS_COPIED);
  cr_assert_eq(v->dl_tensor.data, um_buffer_host_ptr(b));
  cr_assert_eq(v->dl_tensor.strides[0], 2);
  cr_assert_eq(v->manager_ctx, (void *)v);
  v->deleter(v);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* Released while a tensor holds it: the memory stays, the stats say the
 * buffer is live, and the deleter is the last release. */
Test(dlpack_export, buffer_released_while_a_tensor_holds_it_stays_alive) {
  um_manager *m = ut_manager();
  um_buffer *b = filled(m, 256, UM_DEVICE);
  int64_t shape[1] = {256};
  um_dl_managed_tensor *t = NULL;
  cr_assert_eq(um_dlpack_export(b, 0, 1, shape, NULL, UM_DL_UINT, 8, 1, 0, (void **)&t), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(ut_stats(m, NULL).active_buffers, 1);
  cr_assert_eq(um_buffer_size(b), 256, "still live for the tensor");
  cr_assert_eq(((unsigned char *)t->dl_tensor.data)[255], (unsigned char)(255 * 7 + 1));
  t->deleter(t);
  cr_assert_eq(ut_stats(m, NULL).active_buffers, 0);
  cr_assert_eq(um_release(b), UM_ESTATE, "the deleter's release was the last");
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

Test(dlpack_export, two_tensors_need_both_deleters) {
  um_manager *m = ut_manager();
  um_buffer *b = filled(m, 64, UM_DEVICE);
  int64_t shape[1] = {64};
  um_dl_managed_tensor *t1 = NULL, *t2 = NULL;
  cr_assert_eq(um_dlpack_export(b, 0, 1, shape, NULL, UM_DL_UINT, 8, 1, 0, (void **)&t1), UM_OK);
  cr_assert_eq(um_dlpack_export(b, 0, 1, shape, NULL, UM_DL_UINT, 8, 1, 0, (void **)&t2), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  t1->deleter(t1);
  cr_assert_eq(ut_stats(m, NULL).active_buffers, 1);
  t2->deleter(t2);
  cr_assert_eq(ut_stats(m, NULL).active_buffers, 0);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* The export waits for what was issued on the buffer before. */
Test(dlpack_export, waits_for_pending_operations) {
  um_manager *m = ut_manager();
  um_buffer *b = NULL;
  static unsigned char src[1 << 20];
  int64_t shape[1] = {sizeof(src)};
  um_dl_managed_tensor *t = NULL;
  um_event *e = NULL;
  memset(src, 0x5a, sizeof(src));
  cr_assert_eq(um_alloc(m, um_device_get(m, 0), sizeof(src), UM_DEVICE, 0, &b), UM_OK);
  cr_assert_eq(um_copy_from_host(b, 0, src, sizeof(src), &e), UM_OK);
  cr_assert_eq(um_dlpack_export(b, 0, 1, shape, NULL, UM_DL_UINT, 8, 1, 0, (void **)&t), UM_OK);
  cr_assert_eq(um_event_query(e), UM_OK, "done before the export returned");
  cr_assert_eq(((unsigned char *)t->dl_tensor.data)[sizeof(src) - 1], 0x5a);
  um_event_release(e);
  t->deleter(t);
  um_release(b);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

Test(dlpack_export, bad_arguments_answer_exact_codes) {
  um_manager *m = ut_manager();
  um_buffer *b = filled(m, 64, UM_DEVICE), *gone = NULL;
  int64_t shape[1] = {64}, neg[1] = {-1}, big[2] = {INT64_MAX, 4}, strides_neg[1] = {-1};
  int64_t wide[1] = {9};
  void *t = (void *)0x1;
  int32_t type, id;
  cr_assert_eq(um_dlpack_export(NULL, 0, 1, shape, NULL, 1, 8, 1, 0, &t), UM_EINVAL);
  cr_assert_eq(um_dlpack_export((um_buffer *)m, 0, 1, shape, NULL, 1, 8, 1, 0, &t), UM_EINVAL);
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
  void *host = NULL, *wait = NULL;
  cr_assert_eq(um_map(b, UM_MAP_READ, 0, 64, &host), UM_OK);
  cr_assert_eq(um_dlpack_export(b, 0, 1, shape, NULL, 1, 8, 1, 0, &t), UM_ESTATE);
  cr_assert_eq(um_unmap(b, host), UM_OK);
  cr_assert_eq(um_access_begin(b, UM_MAP_READ_WRITE, &wait), UM_OK);
  cr_assert_eq(um_dlpack_export(b, 0, 1, shape, NULL, 1, 8, 1, 0, &t), UM_ESTATE);
  cr_assert_eq(um_access_end(b, NULL), UM_OK);
  cr_assert_eq(um_alloc(m, um_device_get(m, 0), 32, UM_HOST, UM_ALLOC_UNPOOLED, &gone), UM_OK);
  cr_assert_eq(um_release(gone), UM_OK);
  cr_assert_eq(um_dlpack_export(gone, 0, 0, NULL, NULL, 1, 8, 1, 0, &t), UM_ESTATE);
  cr_assert_eq(um_dlpack_device(gone, &type, &id), UM_ESTATE);
  cr_assert_eq(t, (void *)0x1);
  cr_assert_eq(ut_stats(m, NULL).active_buffers, 1, "no failed export kept a reference");
  um_release(b);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* A read-only wrap: versioned tensors say so, a legacy one cannot. */
Test(dlpack_export, read_only_wrap) {
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
Test(dlpack_export, device_memory_without_a_dlpack_type_is_not_supported) {
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
/* Leak report: a tensor whose deleter never ran */

static char leak_line[1024];
static void capture_leak(void *ctx, um_log_level level, const char *msg) {
  (void)ctx;
  if (level == UM_LOG_ERROR && strstr(msg, "was never released") != NULL)
    snprintf(leak_line, sizeof(leak_line), "%s", msg);
}

Test(dlpack_export, deleter_never_run_is_a_leak_naming_the_tensor) {
  um_options o;
  um_manager *m = NULL;
  um_buffer *b = NULL;
  int64_t shape[1] = {100};
  um_dl_managed_tensor *t = NULL;
  ut_options(&o);
  o.log = capture_leak;
  o.log_level = UM_LOG_ERROR;
  cr_assert_eq(um_manager_create(&o, &m), UM_OK);
  cr_assert_eq(um_alloc(m, um_device_get(m, 0), 100, UM_DEVICE, 0, &b), UM_OK);
  cr_assert_eq(um_dlpack_export(b, 0, 1, shape, NULL, UM_DL_UINT, 8, 1, 0, (void **)&t), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_ELEAK);
  cr_assert_not_null(strstr(leak_line, " of 100 bytes "), "%s", leak_line);
  cr_assert_not_null(strstr(leak_line, "held by 1 DLPack tensor(s) never deleted"), "%s", leak_line);
  free(t->manager_ctx); /* the tensor's own block: the caller's after destroy (unimem.h) */
}

Test(dlpack_export, retained_buffer_left_at_destroy_is_freed_and_reported) {
  um_options o;
  um_manager *m = NULL;
  um_buffer *b = NULL;
  ut_options(&o);
  o.log = capture_leak;
  o.log_level = UM_LOG_ERROR;
  cr_assert_eq(um_manager_create(&o, &m), UM_OK);
  cr_assert_eq(um_alloc(m, um_device_get(m, 0), 1 << 20, UM_DEVICE, UM_ALLOC_UNPOOLED, &b), UM_OK);
  cr_assert_eq(um_buffer_retain(b), UM_OK);
  cr_assert_eq(um_buffer_retain(b), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_ELEAK); /* LeakSanitizer / valgrind: the block is freed */
  cr_assert_not_null(strstr(leak_line, "retained 2 more time(s)"), "%s", leak_line);
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

Test(dlpack_import, buffer_never_released_runs_the_deleter_at_destroy) {
  um_manager *m = ut_manager();
  float data[32];
  producer p;
  um_buffer *b = NULL;
  producer_init(&p, data);
  cr_assert_eq(um_dlpack_import(m, &p.versioned, UM_DLPACK_VERSIONED, &b), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_ELEAK);
  cr_assert_eq(p.deleted, 1);
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

/* Every bad tensor: the exact code, the tensor untouched, nothing counted. */
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
  p.legacy.dl_tensor.device.device_type = UM_DL_CUDA; /* a cpu-only manager */
  IMPORT_FAILS(UM_ENODEV, &p.legacy, 0);
  p.legacy.dl_tensor.device.device_type = UM_DL_CUDA_MANAGED;
  IMPORT_FAILS(UM_ENODEV, &p.legacy, 0);
  p.legacy.dl_tensor.device.device_type = UM_DL_OPENCL;
  IMPORT_FAILS(UM_ENODEV, &p.legacy, 0);
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
/* Round trips */

Test(dlpack_roundtrip, export_then_import_shares_the_memory) {
  um_manager *m = ut_manager();
  um_buffer *b = filled(m, 4096, UM_DEVICE), *w = NULL;
  int64_t shape[1] = {1024};
  um_dl_managed_tensor_versioned *v = NULL;
  unsigned char byte = 0;
  cr_assert_eq(um_dlpack_export(b, 0, 1, shape, NULL, UM_DL_FLOAT, 32, 1, UM_DLPACK_VERSIONED, (void **)&v), UM_OK);
  cr_assert_eq(um_dlpack_import(m, v, UM_DLPACK_VERSIONED, &w), UM_OK);
  cr_assert_eq(um_buffer_host_ptr(w), um_buffer_host_ptr(b));
  cr_assert_eq(um_release(b), UM_OK); /* w's tensor keeps b */
  cr_assert_eq(um_fill(w, 100, 0xee, 1, NULL), UM_OK);
  cr_assert_eq(um_copy_to_host(b, 100, &byte, 1, NULL), UM_OK);
  cr_assert_eq(byte, 0xee);
  cr_assert_eq(ut_stats(m, NULL).active_buffers, 2);
  cr_assert_eq(um_release(w), UM_OK); /* runs the deleter: b goes too */
  cr_assert_eq(ut_stats(m, NULL).active_buffers, 0);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* Deleters from many threads at once: each buffer released exactly once. */
static void *delete_all(void *arg) {
  um_dl_managed_tensor **ts = arg;
  for (int i = 0; i < 64; i++)
    ts[i]->deleter(ts[i]);
  return NULL;
}

Test(dlpack_roundtrip, deleters_on_several_threads) {
  um_manager *m = ut_manager();
  um_buffer *b = filled(m, 64, UM_DEVICE);
  um_dl_managed_tensor *ts[4][64];
  int64_t shape[1] = {64};
  pthread_t th[4];
  for (int k = 0; k < 4; k++)
    for (int i = 0; i < 64; i++)
      cr_assert_eq(um_dlpack_export(b, 0, 1, shape, NULL, UM_DL_UINT, 8, 1, 0, (void **)&ts[k][i]), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  for (int k = 0; k < 4; k++)
    pthread_create(&th[k], NULL, delete_all, ts[k]);
  for (int k = 0; k < 4; k++)
    pthread_join(th[k], NULL);
  cr_assert_eq(ut_stats(m, NULL).active_buffers, 0);
  cr_assert_eq(ut_stats(m, NULL).releases, 1);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}
