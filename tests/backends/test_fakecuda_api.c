/* The CUDA backend through the whole library, on the fake driver: devices
 * and their description, locations, memory figures, device_limit_bytes and
 * the driver's own out-of-memory (trim and retry), UM_WRAP_PIN registration
 * with the driver, stream-ordered allocation, the leak report, and the
 * manager without a usable driver (one log line saying why). Transfers are
 * in test_fakecuda_xfer.c. */
#include <stdlib.h>
#include <string.h>

#define UT_SKIP_MAIN /* support/skip_main.c: every test skipped exits 77 */
#include "fakecuda_util.h"

TestSuite(fakecuda_api, .timeout = 120);

/* ------------------------------------------------------------------------ */
/* Devices */

Test(fakecuda_api, devices_follow_the_cpu_and_the_other_backends) {
  um_options o;
  um_manager *m;
  int first, n;
  fc_env(UM_FAKE_CUDA_FULL);
  fc_set("FAKE_CUDA_DEVICE_COUNT", "2");
  cac_options(&o, ""); /* every backend this build has */
  m = fc_manager(&o);
  n = um_device_count(m);
  cr_assert_str_eq(cac_info(um_device_get(m, 0)).backend, "cpu");
  first = cac_cuda_index(m, 0);
  cr_assert_eq(cac_cuda_count(m), 2);
  cr_assert_eq(first, n - 2, "the CUDA devices come last, after the cpu and OpenCL ones");
  for (int i = 0; i < 2; i++) {
    um_device *d = um_device_get(m, first + i);
    um_device_info info = cac_info(d);
    char want[64];
    snprintf(want, sizeof(want), "Fake CUDA Device %d", i);
    cr_assert_str_eq(info.name, want);
    cr_assert_str_eq(info.backend, "cuda");
    cr_assert_eq(info.index, first + i);
    cr_assert_eq(info.caps, UM_CAP_PINNED | UM_CAP_UNIFIED | UM_CAP_PEER | UM_CAP_ASYNC);
    cr_assert_eq(info.locations, (1u << UM_HOST) | (1u << UM_DEVICE) | (1u << UM_PINNED) | (1u << UM_UNIFIED));
    cr_assert_eq(info.total_bytes, 256 * CAC_MiB);
    cac_check_device(d, 1);
    /* No peer access to the cpu or to another backend's devices. */
    for (int j = 0; j < first; j++) {
      cr_assert_eq(um_peer_possible(d, um_device_get(m, j)), 0);
      cr_assert_eq(um_peer_enabled(d, um_device_get(m, j)), 0);
    }
  }
  /* enable_peer: both directions enabled at creation. */
  cr_assert_eq(um_peer_enabled(um_device_get(m, first), um_device_get(m, first + 1)), 1);
  cr_assert_eq(um_peer_enabled(um_device_get(m, first + 1), um_device_get(m, first)), 1);
  fc_destroy(m, UM_OK);
}

Test(fakecuda_api, one_device_has_no_peer_capability) {
  um_manager *m;
  um_device *d;
  fc_env(UM_FAKE_CUDA_FULL);
  m = fc_default();
  cr_assert_eq(um_device_count(m), 2);
  d = fc_dev(m, 0);
  cr_assert_eq(cac_info(d).index, 1);
  cr_assert_eq(cac_info(d).caps, UM_CAP_PINNED | UM_CAP_UNIFIED | UM_CAP_ASYNC);
  cac_check_device(d, 1);
  fc_destroy(m, UM_OK);
}

Test(fakecuda_api, device_without_managed_memory_offers_no_unified) {
  um_manager *m;
  um_device *d;
  um_buffer *b = NULL;
  fc_env(UM_FAKE_CUDA_FULL);
  fc_set("FAKE_CUDA_NO_MANAGED", "1");
  m = fc_default();
  d = fc_dev(m, 0);
  cr_assert_eq(cac_info(d).caps, UM_CAP_PINNED | UM_CAP_ASYNC);
  cr_assert_eq(cac_info(d).locations, (1u << UM_HOST) | (1u << UM_DEVICE) | (1u << UM_PINNED));
  cr_assert_eq(um_alloc(m, d, 4096, UM_UNIFIED, 0, &b), UM_ENOTSUP);
  cr_assert_null(b);
  cac_check_locations(m, d);
  fc_destroy(m, UM_OK);
}

Test(fakecuda_api, every_location) {
  um_manager *m;
  um_device *d;
  long before;
  fc_env(UM_FAKE_CUDA_FULL);
  m = fc_default();
  d = fc_dev(m, 0);
  before = fc_count("allocations");
  cac_check_locations(m, d);
  /* One block per location stays idle in the pool. */
  cr_assert_eq(fc_count("allocations") - before, 3);
  CAC_OK(um_pool_trim(m, 0));
  cr_assert_eq(fc_count("allocations"), before);
  fc_destroy(m, UM_OK);
}

/* ------------------------------------------------------------------------ */
/* Memory figures, limits, out of memory */

Test(fakecuda_api, memory_figures_come_from_the_driver) {
  um_manager *m;
  um_device *d;
  uint64_t free_bytes = 0, total_bytes = 0;
  um_buffer *u;
  fc_env(UM_FAKE_CUDA_FULL);
  fc_set("FAKE_CUDA_TOTAL_MEM", "67108864");
  m = fc_default();
  d = fc_dev(m, 0);
  cr_assert_eq(cac_info(d).total_bytes, 64 * CAC_MiB);
  CAC_OK(um_device_memory(d, &free_bytes, &total_bytes));
  cr_assert_eq(total_bytes, 64 * CAC_MiB);
  cr_assert_eq(free_bytes, 64 * CAC_MiB);
  cac_check_memory(m, d, 1);
  /* Managed memory counts as device memory; pinned memory does not. */
  u = cac_alloc(m, d, CAC_MiB, UM_UNIFIED, UM_ALLOC_UNPOOLED);
  CAC_OK(um_device_memory(d, &free_bytes, NULL));
  cr_assert_eq(free_bytes, 63 * CAC_MiB);
  CAC_OK(um_release(u));
  u = cac_alloc(m, d, CAC_MiB, UM_PINNED, UM_ALLOC_UNPOOLED);
  CAC_OK(um_device_memory(d, &free_bytes, NULL));
  cr_assert_eq(free_bytes, 64 * CAC_MiB);
  CAC_OK(um_release(u));
  cr_assert_eq(um_device_memory(d, NULL, NULL), UM_EINVAL);
  fc_destroy(m, UM_OK);
}

Test(fakecuda_api, device_limit_bytes_then_enomem) {
  um_options o;
  um_manager *m;
  fc_env(UM_FAKE_CUDA_FULL);
  cac_options(&o, "cpu,cuda");
  o.device_limit_bytes = 4 * CAC_MiB;
  m = fc_manager(&o);
  cac_check_limit(m, fc_dev(m, 0));
  /* The cpu is not capped. */
  cr_assert(cac_info(um_device_get(m, 0)).total_bytes > 4 * CAC_MiB);
  fc_destroy(m, UM_OK);
}

/* The driver's own CUDA_ERROR_OUT_OF_MEMORY: the pool gives its idle
 * blocks back and the allocation is retried once. */
Test(fakecuda_api, driver_out_of_memory_trims_and_retries) {
  um_manager *m;
  um_device *d;
  um_buffer *a, *b, *c = NULL;
  um_stats s0, s1;
  fc_env(UM_FAKE_CUDA_FULL);
  fc_set("FAKE_CUDA_TOTAL_MEM", "8388608");
  m = fc_default();
  d = fc_dev(m, 0);
  s0 = ut_stats(m, d);
  a = cac_alloc(m, d, 4 * CAC_MiB, UM_DEVICE, 0);
  CAC_OK(um_release(a));
  b = cac_alloc(m, d, 6 * CAC_MiB, UM_DEVICE, 0);
  s1 = ut_stats(m, d);
  cr_assert_eq(CAC_DELTA(s1, s0, oom_retries), 1);
  cr_assert_eq(CAC_DELTA(s1, s0, trims), 1);
  cr_assert_eq(CAC_DELTA(s1, s0, bytes_trimmed), 4 * CAC_MiB);
  cr_assert_eq(CAC_DELTA(s1, s0, device_allocs), 2);
  cr_assert_eq(CAC_DELTA(s1, s0, device_frees), 1);
  cr_assert_eq(um_alloc(m, d, 6 * CAC_MiB, UM_DEVICE, 0, &c), UM_ENOMEM);
  cr_assert_null(c);
  cr_assert(strstr(um_last_error(), "CUDA_ERROR_OUT_OF_MEMORY") != NULL, "%s", um_last_error());
  cr_assert(strstr(um_last_error(), "cuMemAlloc") != NULL, "%s", um_last_error());
  s0 = ut_stats(m, d);
  cr_assert_eq(CAC_DELTA(s0, s1, oom_retries), 1);
  cr_assert_eq(CAC_DELTA(s0, s1, allocations), 0);
  cr_assert_eq(s0.active_buffers, 1);
  cr_assert_eq(s0.bytes_in_use, 6 * CAC_MiB);
  CAC_OK(um_release(b));
  fc_destroy(m, UM_OK);
}

/* ------------------------------------------------------------------------ */
/* UM_WRAP_PIN: cuMemHostRegister */

Test(fakecuda_api, wrap_pin_registers_with_the_driver) {
  um_manager *m;
  um_device *d;
  long before;
  unsigned char *host = aligned_alloc(4096, 8192);
  um_buffer *w;
  fc_env(UM_FAKE_CUDA_FULL);
  fc_set("FAKE_CUDA_DEVICE_COUNT", "2");
  m = fc_default();
  d = fc_dev(m, 0);
  cac_check_wrap_pin(m, d);

  /* One registration for the backend (portable to both of its devices),
   * gone with the wrap. */
  cr_assert_not_null(host);
  before = fc_count("allocations");
  CAC_OK(um_wrap_host(m, host, 8192, UM_WRAP_PIN, &w));
  cr_assert_eq(fc_count("allocations"), before + 1);
  CAC_OK(um_release(w));
  cr_assert_eq(fc_count("allocations"), before);
  /* Without the flag, nothing is registered. */
  CAC_OK(um_wrap_host(m, host, 8192, 0, &w));
  cr_assert_eq(fc_count("allocations"), before);
  CAC_OK(um_release(w));
  free(host);
  fc_destroy(m, UM_OK);
}

Test(fakecuda_api, wrap_pin_registration_ends_with_a_deferred_release) {
  um_options o;
  um_manager *m;
  um_device *d;
  long before;
  const size_t n = 256 * CAC_KiB;
  unsigned char *host = aligned_alloc(4096, n), *back = cac_xmalloc(n);
  um_buffer *w, *dev;
  um_event *e1, *e2;
  fc_env(UM_FAKE_CUDA_FULL);
  fc_set("FAKE_CUDA_STREAM_THREADS", "1");
  fc_set("FAKE_CUDA_OP_DELAY_US", "20000");
  cac_options(&o, "cpu,cuda");
  m = fc_manager(&o);
  d = fc_dev(m, 0);
  cr_assert_not_null(host);
  ut_pattern(host, n, 5);
  dev = cac_alloc(m, d, n, UM_DEVICE, 0);
  CAC_OK(um_copy_to_host(dev, 0, back, n, NULL)); /* makes the staging chunks */
  before = fc_count("allocations");
  CAC_OK(um_wrap_host(m, host, n, UM_WRAP_PIN, &w));
  CAC_OK(um_copy(dev, 0, w, 0, n, &e1));
  CAC_OK(um_copy_to_host(dev, 0, back, n, &e2));
  /* Released while its copy may still run: the registration must outlive
   * the copy and end when the buffer is recycled. */
  CAC_OK(um_release(w));
  cac_wait_release(e1, UM_OK);
  cac_wait_release(e2, UM_OK);
  cr_assert_arr_eq(back, host, n);
  CAC_OK(um_device_synchronize(d));
  cr_assert_eq(fc_count("allocations"), before);
  CAC_OK(um_release(dev));
  free(host);
  free(back);
  fc_destroy(m, UM_OK);
}

/* A range the driver has pinned already (here: inside a PINNED block) is
 * refused by cuMemHostRegister: the wrap is made all the same, page-locked
 * by the cpu, one log line says why, and its copies take the staging. */
Test(fakecuda_api, wrap_pin_of_driver_pinned_memory_still_wraps) {
  um_manager *m;
  um_device *d;
  const size_t n = 4 * CAC_CHUNK;
  um_buffer *pin, *w, *dev;
  um_stats s0, s1;
  unsigned char *back = cac_xmalloc(n);
  fc_env(UM_FAKE_CUDA_FULL);
  m = fc_default();
  d = fc_dev(m, 0);
  pin = cac_alloc(m, d, n, UM_PINNED, 0);
  dev = cac_alloc(m, d, n, UM_DEVICE, 0);
  ut_pattern(um_buffer_host_ptr(pin), n, 8);
  CAC_OK(um_wrap_host(m, um_buffer_host_ptr(pin), n, UM_WRAP_PIN, &w));
  cr_assert_eq(cac_log_count("did not register"), 1);
  cr_assert(strstr(cac_log_find("did not register"), "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED") != NULL,
            "%s", cac_log_find("did not register"));
  s0 = ut_stats(m, NULL);
  CAC_OK(um_copy(dev, 0, w, 0, n, NULL));
  s1 = ut_stats(m, NULL);
  cr_assert_eq(CAC_DELTA(s1, s0, xfer_pipelined), 1);
  CAC_OK(um_copy_to_host(dev, 0, back, n, NULL));
  cr_assert_arr_eq(back, um_buffer_host_ptr(pin), n);
  CAC_OK(um_release(w));
  CAC_OK(um_release(dev));
  CAC_OK(um_release(pin));
  free(back);
  fc_destroy(m, UM_OK);
}

/* ------------------------------------------------------------------------ */
/* Stream-ordered allocation behind the same pool */

Test(fakecuda_api, stream_ordered_allocation) {
  um_manager *m;
  um_device *d;
  um_buffer *a, *b, *u;
  long base;
  fc_env(UM_FAKE_CUDA_FULL);
  fc_set("UNIMEM_CUDA_ASYNC_ALLOC", "1");
  m = fc_default();
  d = fc_dev(m, 0);
  cr_assert_eq(cac_log_count("stream-ordered allocation on"), 1);
  cr_assert_eq(fc_count("pool_release_threshold_max"), 1);
  base = fc_count("allocations");
  cr_assert_eq(fc_count("stream_ordered_allocs"), 0);

  a = cac_alloc(m, d, CAC_MiB, UM_DEVICE, 0);
  cr_assert_eq(fc_count("stream_ordered_allocs"), 1);
  CAC_OK(um_release(a));
  b = cac_alloc(m, d, CAC_MiB, UM_DEVICE, 0);
  cr_assert_eq(b, a, "a pool hit, not a driver allocation");
  cr_assert_eq(fc_count("stream_ordered_allocs"), 1);
  u = cac_alloc(m, d, 3000, UM_DEVICE, UM_ALLOC_UNPOOLED);
  cr_assert_eq(fc_count("stream_ordered_allocs"), 2);
  /* PINNED and UNIFIED do not come from the stream-ordered pool. */
  CAC_OK(um_release(cac_alloc(m, d, 4096, UM_PINNED, UM_ALLOC_UNPOOLED)));
  cr_assert_eq(fc_count("stream_ordered_allocs"), 2);
  CAC_OK(um_release(u));
  CAC_OK(um_release(b));
  cac_check_round_trips(m, d, UM_DEVICE, 1);
  cac_check_strategies(m, d, 0);
  CAC_OK(um_pool_trim(m, 0));
  CAC_OK(um_device_synchronize(d));
  cr_assert_eq(fc_count("allocations"), base + 2, "only the two staging chunks are left");
  fc_destroy(m, UM_OK);
}

/* ------------------------------------------------------------------------ */
/* Leaks */

Test(fakecuda_api, leaked_buffers_are_reported_and_freed) {
  um_manager *m;
  um_device *d;
  um_buffer *a, *b, *c;
  unsigned char host[64] = {0};
  fc_env(UM_FAKE_CUDA_FULL);
  m = fc_default();
  d = fc_dev(m, 0);
  a = cac_alloc(m, d, 5000, UM_DEVICE, 0);
  b = cac_alloc(m, d, 6000, UM_PINNED, UM_ALLOC_UNPOOLED);
  c = cac_alloc(m, d, 7000, UM_UNIFIED, 0);
  CAC_OK(um_copy_from_host(a, 0, host, sizeof(host), NULL));
  (void)b;
  (void)c;
  fc_destroy(m, UM_ELEAK);
  cr_assert_eq(cac_log_count("leak: buffer"), 3);
  cr_assert(strstr(cac_log_find("5000 bytes"), "(device) on device 1 (Fake CUDA Device 0)") != NULL, "%s",
            cac_log_find("5000 bytes"));
}

/* ------------------------------------------------------------------------ */
/* Without a usable driver: the cpu (and OpenCL) only, one log line why */

static void expect_one_cuda_line(um_manager *m, const char *needle) {
  int cuda_lines = cac_log_count("cuda");
  if (cuda_lines != 1)
    cac_log_dump();
  cr_assert_eq(cuda_lines, 1, "one log line about the cuda backend");
  cr_assert(strstr(cac_log_find("cuda"), needle) != NULL, "\"%s\" lacks \"%s\"", cac_log_find("cuda"),
            needle);
  for (int i = 0; i < cac_captured.n; i++)
    if (strstr(cac_captured.line[i], "cuda") != NULL)
      cr_assert_eq(cac_captured.level[i], UM_LOG_INFO, "not a warning: the machine simply has no GPU");
  cr_assert_eq(cac_cuda_count(m), 0);
}

Test(fakecuda_api, no_driver_library) {
  um_options o;
  um_manager *m;
  um_buffer *b;
  fc_env("/nonexistent/libcuda.so.1");
  cac_options(&o, "cpu,cuda");
  m = fc_manager(&o);
  cr_assert_eq(um_device_count(m), 1);
  expect_one_cuda_line(m, "backend cuda skipped");
  cr_assert(strstr(cac_log_find("cuda"), "/nonexistent/libcuda.so.1") != NULL, "%s", cac_log_find("cuda"));
  /* Everything else works. */
  b = cac_alloc(m, um_device_get(m, 0), 4096, UM_PINNED, 0);
  CAC_OK(um_release(b));
  fc_destroy(m, UM_OK);

  /* With every backend: the cpu and whatever OpenCL offers, no CUDA. */
  cac_captured.n = 0;
  cac_options(&o, "");
  m = fc_manager(&o);
  expect_one_cuda_line(m, "/nonexistent/libcuda.so.1");
  fc_destroy(m, UM_OK);
}

Test(fakecuda_api, driver_missing_an_entry_point) {
  um_options o;
  um_manager *m;
  fc_env(UM_FAKE_CUDA_MISSING);
  cac_options(&o, "cpu,cuda");
  m = fc_manager(&o);
  cr_assert_eq(um_device_count(m), 1);
  expect_one_cuda_line(m, "entry point cuMemAlloc_v2 missing");
  fc_destroy(m, UM_OK);
}

Test(fakecuda_api, driver_without_a_gpu) {
  um_options o;
  um_manager *m;
  fc_env(UM_FAKE_CUDA_FULL);
  fc_set("FAKE_CUDA_NO_DEVICE", "1");
  cac_options(&o, "cpu,cuda");
  m = fc_manager(&o);
  cr_assert_eq(um_device_count(m), 1);
  expect_one_cuda_line(m, "CUDA_ERROR_NO_DEVICE");
  cr_assert(strstr(cac_log_find("cuda"), "backend cuda: no devices") != NULL, "%s", cac_log_find("cuda"));
  fc_destroy(m, UM_OK);
}

Test(fakecuda_api, cuda_left_out_of_the_backend_list) {
  um_options o;
  um_manager *m;
  fc_env(UM_FAKE_CUDA_FULL);
  cac_options(&o, "cpu");
  m = fc_manager(&o);
  cr_assert_eq(um_device_count(m), 1);
  cr_assert_eq(cac_log_count("cuda"), 0);
  fc_destroy(m, UM_OK);
}

/* ------------------------------------------------------------------------ */
/* Mapping a DEVICE buffer (no host view: a host copy kept by the core) */

Test(fakecuda_api, map_device_memory) {
  um_manager *m;
  um_device *d;
  um_buffer *b;
  unsigned char src[6000], back[6000];
  void *p;
  fc_env(UM_FAKE_CUDA_FULL);
  m = fc_default();
  d = fc_dev(m, 0);
  b = cac_alloc(m, d, sizeof(src), UM_DEVICE, 0);
  ut_pattern(src, sizeof(src), 3);
  CAC_OK(um_copy_from_host(b, 0, src, sizeof(src), NULL));
  CAC_OK(um_map(b, UM_MAP_READ, 100, 200, &p));
  cr_assert_arr_eq(p, src + 100, 200);
  cr_assert_eq(um_buffer_valid(b), UM_VALID_HOST | UM_VALID_DEVICE);
  CAC_OK(um_unmap(b, p));
  CAC_OK(um_map(b, UM_MAP_WRITE, 1000, 10, &p));
  cr_assert_eq(um_buffer_valid(b), UM_VALID_HOST);
  memset(p, 0xEE, 10);
  CAC_OK(um_unmap(b, p));
  cr_assert_eq(um_buffer_valid(b), UM_VALID_HOST | UM_VALID_DEVICE);
  CAC_OK(um_copy_to_host(b, 0, back, sizeof(back), NULL));
  memset(src + 1000, 0xEE, 10);
  cr_assert_arr_eq(back, src, sizeof(src));
  CAC_OK(um_fill(b, 0, 1, 16, NULL));
  cr_assert_eq(um_buffer_valid(b), UM_VALID_DEVICE, "a fill leaves the host copy stale");
  CAC_OK(um_release(b));
  fc_destroy(m, UM_OK);
}
