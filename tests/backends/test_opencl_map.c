/* How the OpenCL backend maps a buffer (what um_map answers, on every
 * profile, is in conformance/test_map.c): a DEVICE buffer has no host
 * view, and mapping it goes through the backend's map
 * (clEnqueueMapBuffer), with no host shadow and no transfer of the core's
 * own; PINNED and UNIFIED buffers are host views, mapped without the
 * backend. */
#include "opencl_util.h"

#define N (200000u + 13u)
#define BOTH (UM_VALID_HOST | UM_VALID_DEVICE)

static um_buffer *device_buffer_with(ou_env *e, unsigned seed, unsigned char *bytes) {
  um_buffer *b = ub_alloc(e->m, e->dev[0], N, UM_DEVICE);
  ub_pattern(bytes, N, seed);
  cr_assert_eq(um_copy_from_host(b, 0, bytes, N, NULL), UM_OK);
  cr_assert_eq(um_buffer_valid(b), UM_VALID_DEVICE);
  return b;
}

OU_TEST_1_AND_2(opencl_map, device_buffer_read_mapping) {
  ou_env e = ou_open(NULL, 1);
  unsigned char *bytes = ub_malloc(N);
  um_buffer *b = device_buffer_with(&e, 1, bytes);
  void *p = NULL;
  um_stats before = ut_stats(e.m, e.dev[0]), after;
  cr_assert_null(um_buffer_host_ptr(b));
  cr_assert_eq(um_map(b, UM_MAP_READ, 1001, 5000, &p), UM_OK, "%s", um_last_error());
  cr_assert_not_null(p);
  cr_assert(b->map_native, "the backend's map was used");
  cr_assert_null(b->shadow, "no host shadow for a buffer the backend maps");
  cr_assert_eq(um_buffer_valid(b), BOTH);
  ub_assert_bytes(p, bytes + 1001, 5000, "mapped for reading");
  cr_assert_eq(um_unmap(b, p), UM_OK);
  cr_assert_eq(um_buffer_valid(b), UM_VALID_DEVICE);
  after = ut_stats(e.m, e.dev[0]);
  ou_assert_strategies(before, after, 0, 0, 0, 0, 0); /* no transfer of the core's own */
  cr_assert_eq(um_release(b), UM_OK);
  free(bytes);
  ou_close(&e);
}

/* PINNED and UNIFIED: the mapping is the host view itself. */
OU_TEST_1_AND_2(opencl_map, host_views_of_pinned_and_unified) {
  ou_env e = ou_open(NULL, 1);
  um_device_info info;
  int tested = 0;
  cr_assert_eq(um_device_info_get(e.dev[0], &info), UM_OK);
  for (int loc = UM_PINNED; loc <= UM_UNIFIED; loc++) {
    um_buffer *b;
    void *p = NULL;
    if (!(info.locations & (1u << loc)))
      continue;
    tested++;
    b = ub_alloc(e.m, e.dev[0], N, (um_location)loc);
    for (int mode = UM_MAP_READ; mode <= UM_MAP_WRITE_DISCARD; mode++) {
      cr_assert_eq(um_map(b, (um_map_mode)mode, 1000, 4000, &p), UM_OK);
      cr_assert_not(b->map_native, "location %d: mapped without the backend", loc);
      cr_assert_eq(um_unmap(b, p), UM_OK);
    }
    cr_assert_eq(um_release(b), UM_OK);
  }
  ou_close(&e);
  cr_assert_gt(tested, 0, "PINNED is always offered by the OpenCL backend");
}
