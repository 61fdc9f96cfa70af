/* An error of the OpenCL driver surfaces as the right code: an allocation
 * larger than CL_DEVICE_MAX_MEM_ALLOC_SIZE. What every backend answers
 * alike (bad ranges, locations the device cannot give, HOST memory of the
 * device, memory pressure under device_limit_bytes with the pool's
 * trim-and-retry and on_oom) is conformance/test_errors.c's, on the pocl
 * profiles among the others. */
#include "opencl_util.h"

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
