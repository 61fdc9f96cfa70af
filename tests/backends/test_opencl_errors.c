/* Errors of the OpenCL driver and device surface as the right codes: an
 * allocation larger than CL_DEVICE_MAX_MEM_ALLOC_SIZE, a device out of
 * memory (device_limit_bytes: PoCL itself never reports it) with the
 * pool's trim-and-retry freeing idle blocks, locations the device cannot
 * give. */
#include "opencl_util.h"

#define MiB (1024u * 1024u)

static um_options limited(uint64_t limit) {
  um_options o;
  ou_options(&o);
  o.device_limit_bytes = limit;
  return o;
}

/* More than the device allows in one allocation: UM_ENOMEM after the pool
 * was trimmed and the allocation retried once, with the driver's limit
 * named in um_last_error. */
OU_TEST_1_AND_2(opencl_errors, allocation_above_the_device_maximum) {
  ou_env e = ou_open(NULL, 1);
  um_device_info info;
  um_buffer *b = NULL;
  um_stats before, after;
  cr_assert_eq(um_device_info_get(e.dev[0], &info), UM_OK);
  before = ut_stats(e.m, e.dev[0]);
  /* The global memory is at least the largest single allocation. */
  cr_assert_eq(um_alloc(e.m, e.dev[0], (size_t)info.total_bytes + 1, UM_DEVICE, 0, &b), UM_ENOMEM);
  cr_assert_null(b);
  cr_assert(strstr(um_last_error(), "CL_DEVICE_MAX_MEM_ALLOC_SIZE") != NULL, "last error: %s", um_last_error());
  after = ut_stats(e.m, e.dev[0]);
  cr_assert_eq(after.oom_retries - before.oom_retries, 1);
  cr_assert_eq(after.allocations, before.allocations);
  cr_assert_eq(after.device_allocs, before.device_allocs);
  cr_assert_eq(after.bytes_reserved, before.bytes_reserved);
  /* PINNED is bounded by the same driver limit */
  cr_assert_eq(um_alloc(e.m, e.dev[0], (size_t)info.total_bytes + 1, UM_PINNED, 0, &b), UM_ENOMEM);
  /* and the device still works */
  b = ub_alloc(e.m, e.dev[0], 4096, UM_DEVICE);
  cr_assert_eq(um_release(b), UM_OK);
  ou_close(&e);
}

/* device_limit_bytes = 8 MiB. A released 4 MiB block idles in the pool;
 * asking for 6 MiB more passes the limit, so the pool releases its idle
 * blocks and the retry succeeds. */
OU_TEST_1_AND_2(opencl_errors, pressure_releases_pooled_blocks_and_retries) {
  um_options o = limited(8 * MiB);
  ou_env e = ou_open(&o, 1);
  um_buffer *a = NULL, *b = NULL, *c = NULL;
  um_stats s0, s1, s2;
  uint64_t free_bytes = 0, total = 0;
  cr_assert_eq(um_device_memory(e.dev[0], &free_bytes, &total), UM_OK);
  cr_assert_eq(total, 8 * MiB);
  cr_assert_eq(free_bytes, 8 * MiB);

  a = ub_alloc(e.m, e.dev[0], 4 * MiB, UM_DEVICE);
  cr_assert_eq(um_release(a), UM_OK);
  s0 = ut_stats(e.m, e.dev[0]);
  cr_assert_eq(s0.bytes_pooled, 4 * MiB, "the block idles in the pool");
  cr_assert_eq(s0.bytes_reserved, 4 * MiB);

  cr_assert_eq(um_alloc(e.m, e.dev[0], 6 * MiB, UM_DEVICE, 0, &b), UM_OK, "%s", um_last_error());
  s1 = ut_stats(e.m, e.dev[0]);
  cr_assert_eq(s1.oom_retries - s0.oom_retries, 1, "one trim-and-retry");
  cr_assert_eq(s1.trims - s0.trims, 1, "the idle block was trimmed");
  cr_assert_eq(s1.bytes_trimmed - s0.bytes_trimmed, 4 * MiB);
  cr_assert_eq(s1.bytes_pooled, 0);
  cr_assert_eq(s1.device_frees - s0.device_frees, 1);
  cr_assert_eq(s1.bytes_reserved, 6 * MiB);
  cr_assert_eq(um_device_memory(e.dev[0], &free_bytes, &total), UM_OK);
  cr_assert_eq(free_bytes, 2 * MiB);

  /* With 6 MiB live and nothing idle, 4 MiB more cannot be had. */
  cr_assert_eq(um_alloc(e.m, e.dev[0], 4 * MiB, UM_DEVICE, 0, &c), UM_ENOMEM);
  cr_assert(strstr(um_last_error(), "device_limit_bytes") != NULL, "last error: %s", um_last_error());
  s2 = ut_stats(e.m, e.dev[0]);
  cr_assert_eq(s2.oom_retries - s1.oom_retries, 1);
  cr_assert_eq(s2.trims, s1.trims, "nothing was idle to trim");
  cr_assert_eq(s2.bytes_reserved, 6 * MiB);
  cr_assert_eq(s2.active_buffers, 1);

  /* The live buffer works, and once released the 4 MiB fits again. */
  {
    unsigned char *p = ub_malloc(6 * MiB), *q;
    ub_pattern(p, 6 * MiB, 1);
    cr_assert_eq(um_copy_from_host(b, 0, p, 6 * MiB, NULL), UM_OK);
    q = ub_read_all(b);
    ub_assert_bytes(q, p, 6 * MiB, "the buffer allocated under pressure");
    free(p);
    free(q);
  }
  cr_assert_eq(um_release(b), UM_OK);
  c = ub_alloc(e.m, e.dev[0], 4 * MiB, UM_DEVICE);
  cr_assert_eq(um_release(c), UM_OK);
  ou_close(&e);
}

/* trim_on_pressure = 0: the allocation fails at once and the idle block
 * stays pooled. */
OU_TEST_1_AND_2(opencl_errors, no_trim_without_trim_on_pressure) {
  um_options o = limited(8 * MiB);
  ou_env e;
  um_buffer *a = NULL, *b = NULL;
  um_stats s0, s1;
  o.trim_on_pressure = 0;
  e = ou_open(&o, 1);
  a = ub_alloc(e.m, e.dev[0], 4 * MiB, UM_DEVICE);
  cr_assert_eq(um_release(a), UM_OK);
  s0 = ut_stats(e.m, e.dev[0]);
  cr_assert_eq(um_alloc(e.m, e.dev[0], 6 * MiB, UM_DEVICE, 0, &b), UM_ENOMEM);
  s1 = ut_stats(e.m, e.dev[0]);
  cr_assert_eq(s1.oom_retries, s0.oom_retries);
  cr_assert_eq(s1.bytes_pooled, 4 * MiB);
  /* an explicit trim makes room */
  cr_assert_eq(um_pool_trim(e.m, 0), UM_OK);
  b = ub_alloc(e.m, e.dev[0], 6 * MiB, UM_DEVICE);
  cr_assert_eq(um_release(b), UM_OK);
  ou_close(&e);
}

/* The application's on_oom callback frees memory and asks for one more
 * try after the pool's own trim did not help. */
static um_buffer *oom_victim;
static int oom_calls;
static int free_victim(void *ctx, um_device *d, size_t bytes) {
  (void)ctx;
  (void)d;
  (void)bytes;
  oom_calls++;
  if (oom_victim == NULL)
    return 0;
  um_release(oom_victim);
  oom_victim = NULL;
  return 1;
}

OU_TEST_1_AND_2(opencl_errors, on_oom_callback_gets_a_last_try) {
  um_options o = limited(8 * MiB);
  ou_env e;
  um_buffer *b = NULL;
  um_stats s0, s1;
  o.on_oom = free_victim;
  o.enable_pooling = 0; /* the victim's block goes back to the device */
  e = ou_open(&o, 1);
  oom_victim = ub_alloc(e.m, e.dev[0], 5 * MiB, UM_DEVICE);
  s0 = ut_stats(e.m, e.dev[0]);
  cr_assert_eq(um_alloc(e.m, e.dev[0], 5 * MiB, UM_DEVICE, 0, &b), UM_OK, "%s", um_last_error());
  s1 = ut_stats(e.m, e.dev[0]);
  cr_assert_eq(oom_calls, 1);
  cr_assert_eq(s1.oom_retries - s0.oom_retries, 2, "the pool's retry and the callback's");
  cr_assert_eq(um_release(b), UM_OK);
  ou_close(&e);
}

/* Locations: HOST is every device's (SPEC §5): pageable host memory from
 * the host, with a host view, accounted to the OpenCL device; UNIFIED needs
 * fine-grained SVM. */
OU_TEST_1_AND_2(opencl_errors, host_location_is_host_memory_of_the_device) {
  ou_env e = ou_open(NULL, 1);
  um_buffer *b = NULL;
  um_device_info info;
  um_stats before, after, cpu_before, cpu_after;
  unsigned char back[4096];
  cr_assert_eq(um_device_info_get(e.dev[0], &info), UM_OK);
  cr_assert_neq(info.locations & (1u << UM_HOST), 0u);
  before = ut_stats(e.m, e.dev[0]);
  cpu_before = ut_stats(e.m, um_device_get(e.m, 0));
  cr_assert_eq(um_alloc(e.m, e.dev[0], 4096, UM_HOST, 0, &b), UM_OK);
  cr_assert_not_null(um_buffer_host_ptr(b), "a host view");
  cr_assert_eq(um_buffer_device(b), e.dev[0]);
  memset(um_buffer_host_ptr(b), 0x3C, 4096);
  cr_assert_eq(um_copy_to_host(b, 0, back, sizeof(back), NULL), UM_OK);
  cr_assert(ut_all_bytes(back, sizeof(back), 0x3C));
  after = ut_stats(e.m, e.dev[0]);
  cpu_after = ut_stats(e.m, um_device_get(e.m, 0));
  cr_assert_eq(after.allocations, before.allocations + 1);
  cr_assert_eq(after.bytes_reserved, before.bytes_reserved + ut_class(4096), "accounted to the device");
  cr_assert_eq(cpu_after.bytes_reserved, cpu_before.bytes_reserved, "not to the cpu device");
  cr_assert_eq(um_release(b), UM_OK);
  ou_close(&e);
}

OU_TEST_1_AND_2(opencl_errors, unified_without_svm_is_not_supported) {
  ou_env e = ou_open(NULL, 1);
  um_buffer *b = NULL;
  um_device_info info;
  int tested = 0;
  for (int i = 0; i < e.ndev; i++) {
    cr_assert_eq(um_device_info_get(e.dev[i], &info), UM_OK);
    if (info.locations & (1u << UM_UNIFIED)) {
      cr_assert(info.caps & UM_CAP_UNIFIED);
      continue;
    }
    cr_assert_eq(info.caps & UM_CAP_UNIFIED, 0u);
    cr_assert_eq(um_alloc(e.m, e.dev[i], 4096, UM_UNIFIED, 0, &b), UM_ENOTSUP);
    cr_assert_null(b);
    tested++;
  }
  ou_close(&e);
  if (tested == 0)
    cr_skip_test("SKIPPED: every OpenCL device here offers fine-grained SVM (UM_UNIFIED); "
                 "the UM_ENOTSUP answer needs a device without it");
}

/* Errors of the copy API on OpenCL buffers leave the buffers as they were. */
OU_TEST_1_AND_2(opencl_errors, bad_ranges_change_nothing) {
  ou_env e = ou_open(NULL, 1);
  um_buffer *b = ub_alloc(e.m, e.dev[0], 1000, UM_DEVICE), *c = ub_alloc(e.m, e.dev[0], 10, UM_DEVICE);
  unsigned char src[1000], *got;
  ub_pattern(src, sizeof(src), 7);
  cr_assert_eq(um_copy_from_host(b, 0, src, 1000, NULL), UM_OK);
  cr_assert_eq(um_copy_from_host(b, 1, src, 1000, NULL), UM_ERANGE);
  cr_assert_eq(um_copy_to_host(b, 999, src, 2, NULL), UM_ERANGE);
  cr_assert_eq(um_copy(c, 0, b, 0, 11, NULL), UM_ERANGE);
  cr_assert_eq(um_fill(b, 1000, 0, 1, NULL), UM_ERANGE);
  cr_assert_eq(um_copy(c, 0, b, 0, 0, NULL), UM_EINVAL);
  got = ub_read_all(b);
  ub_assert_bytes(got, src, 1000, "after refused operations");
  free(got);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_release(c), UM_OK);
  cr_assert_eq(um_release(b), UM_ESTATE);
  ou_close(&e);
}
