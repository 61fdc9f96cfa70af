/* An error of the OpenCL driver surfaces as the right code: an allocation
 * larger than CL_DEVICE_MAX_MEM_ALLOC_SIZE, or than the device's memory
 * (which the driver would only see at the first command). What every backend answers
 * alike (bad ranges, locations the device cannot give, HOST memory of the
 * device, memory pressure under device_limit_bytes with the pool's
 * trim-and-retry and on_oom) is conformance/test_errors.c's, on the pocl
 * profiles among the others. */
#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>

#include "opencl_util.h"

/* More than the device's memory: UM_ENOMEM from the core before the
 * driver is asked (the driver commits a buffer only at its first command),
 * after the pool was trimmed and the allocation retried once. More than the
 * driver allows in one allocation: UM_ENOMEM with the driver's limit named
 * in um_last_error. */
OU_TEST_1_AND_2(opencl_errors, allocation_above_the_device_maximum) {
  ou_env e = ou_open(NULL, 1);
  um_device_info info;
  um_buffer *b = NULL;
  um_stats before, after;
  cl_ulong max_alloc = 0;
  um_device_native nat;
  cr_assert_eq(um_device_info_get(e.dev[0], &info), UM_OK);
  before = ut_stats(e.m, e.dev[0]);
  cr_assert_eq(um_alloc(e.m, e.dev[0], (size_t)info.total_bytes + 1, UM_DEVICE, 0, &b), UM_ENOMEM);
  cr_assert_null(b);
  cr_assert(strstr(um_last_error(), "the device's memory size") != NULL, "last error: %s", um_last_error());
  after = ut_stats(e.m, e.dev[0]);
  cr_assert_eq(after.oom_retries - before.oom_retries, 1);
  cr_assert_eq(after.allocations, before.allocations);
  cr_assert_eq(after.device_allocs, before.device_allocs);
  cr_assert_eq(after.bytes_reserved, before.bytes_reserved);
  cr_assert_eq(um_device_native_get(e.dev[0], &nat), UM_OK);
  cr_assert_eq(clGetDeviceInfo((cl_device_id)nat.cl_device, CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof(max_alloc),
                               &max_alloc, NULL),
               CL_SUCCESS);
  if (max_alloc < info.total_bytes) {
    cr_assert_eq(um_alloc(e.m, e.dev[0], (size_t)max_alloc + 1, UM_DEVICE, 0, &b), UM_ENOMEM);
    cr_assert(strstr(um_last_error(), "CL_DEVICE_MAX_MEM_ALLOC_SIZE") != NULL, "last error: %s", um_last_error());
  }
  /* PINNED is bounded by the same driver limit */
  cr_assert_eq(um_alloc(e.m, e.dev[0], (size_t)info.total_bytes + 1, UM_PINNED, 0, &b), UM_ENOMEM);
  /* and the device still works */
  b = ub_alloc(e.m, e.dev[0], 4096, UM_DEVICE);
  cr_assert_eq(um_release(b), UM_OK);
  ou_close(&e);
}
