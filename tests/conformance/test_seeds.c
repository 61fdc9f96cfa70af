/* The seeds' three memory tests ("Testing Strategy"), ported to C. */
#include "test_util.h" /* Criterion, or its stand-in under TSan */
#include <stdio.h>
#include <string.h>

#include "unimem.h"

static um_manager *m;
static um_device *cpu;

static void setup(void) {
  um_options o;
  um_options_init(&o);
  snprintf(o.backends, sizeof(o.backends), "cpu");
  cr_assert_eq(um_manager_create(&o, &m), UM_OK);
  cpu = um_device_get(m, 0);
  cr_assert_not_null(cpu);
}

static void teardown(void) { cr_assert_eq(um_manager_destroy(m), UM_OK); }

TestSuite(seeds, .init = setup, .fini = teardown);

/* Allocate_ReturnsValidBuffer */
Test(seeds, allocate_returns_valid_buffer) {
  um_buffer *b = NULL;
  cr_assert_eq(um_alloc_array(m, cpu, 1000, sizeof(float), UM_DEVICE, 0, &b), UM_OK);
  cr_assert_not_null(b);
  cr_assert_eq(um_buffer_size(b), 1000 * sizeof(float));
  cr_assert_eq(um_buffer_device(b), cpu);
  cr_assert_eq(um_buffer_location(b), UM_DEVICE);
  cr_assert_eq(um_release(b), UM_OK);
}

/* ReturnToPool_BufferCanBeReused: the same handle over the same block. */
Test(seeds, return_to_pool_buffer_can_be_reused) {
  um_buffer *b1 = NULL, *b2 = NULL;
  void *p1;
  cr_assert_eq(um_alloc_array(m, cpu, 1000, sizeof(float), UM_DEVICE, 0, &b1), UM_OK);
  p1 = um_buffer_host_ptr(b1);
  cr_assert_eq(um_release(b1), UM_OK);
  cr_assert_eq(um_alloc_array(m, cpu, 1000, sizeof(float), UM_DEVICE, 0, &b2), UM_OK);
  cr_assert_eq(b2, b1);
  cr_assert_eq(um_buffer_host_ptr(b2), p1);
  cr_assert_eq(um_release(b2), UM_OK);
}

/* Transfer_CopiesDataCorrectly */
Test(seeds, transfer_copies_data_correctly) {
  float src[1000], dst[1000];
  um_buffer *b = NULL;
  for (int i = 0; i < 1000; i++)
    src[i] = (float)i;
  memset(dst, 0, sizeof(dst));
  cr_assert_eq(um_alloc_array(m, cpu, 1000, sizeof(float), UM_DEVICE, 0, &b), UM_OK);
  cr_assert_eq(um_copy_from_host(b, 0, src, sizeof(src), NULL), UM_OK);
  cr_assert_eq(um_copy_to_host(b, 0, dst, sizeof(dst), NULL), UM_OK);
  cr_assert_arr_eq(dst, src, sizeof(src));
  cr_assert_eq(um_release(b), UM_OK);
}
