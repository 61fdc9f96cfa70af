/* Every kind of blocking call on DEVICE buffers of one device, each
 * checked byte for byte: the body of the wait tests, public API only.
 * conformance/test_wait_spin.c runs it on every profile's device with and
 * without wait_spin_ns; backends/test_opencl_wait.c counts the polls the
 * same calls make on OpenCL (through the test build's hook). */
#ifndef UNIMEM_TEST_BLOCKING_CALLS_H
#define UNIMEM_TEST_BLOCKING_CALLS_H

#include "bytes.h"

/* Copies both ways, small and chunked (1 MiB and an odd tail), a
 * device-local copy, a fill, a read-write mapping, a wait on an
 * asynchronous read and synchronize behind an asynchronous write. On a
 * device with no host view each one is a command on the device's queue. */
static UT_UNUSED void bc_blocking_calls(um_manager *m, um_device *d) {
  const size_t n = (1u << 20) + 4099u;
  unsigned char *src = ub_malloc(n), *back = ub_malloc(n), *p = NULL;
  um_buffer *a = ub_alloc(m, d, n, UM_DEVICE);
  um_buffer *b = ub_alloc(m, d, n, UM_DEVICE);
  um_event *ev;
  ub_pattern(src, n, 17);
  cr_assert_eq(um_copy_from_host(a, 0, src, 4096, NULL), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_copy_to_host(a, 0, back, 4096, NULL), UM_OK, "%s", um_last_error());
  ub_assert_bytes(back, src, 4096, "4 KiB round trip");
  cr_assert_eq(um_copy_from_host(a, 0, src, n, NULL), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_copy(b, 0, a, 0, n, NULL), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_fill(b, 100, 0xc3, 5000, NULL), UM_OK, "%s", um_last_error());
  memset(src + 100, 0xc3, 5000);
  cr_assert_eq(um_copy_to_host(b, 0, back, n, NULL), UM_OK, "%s", um_last_error());
  ub_assert_bytes(back, src, n, "device copy and fill");
  cr_assert_eq(um_map(b, UM_MAP_READ_WRITE, 64, 8192, (void **)&p), UM_OK, "%s", um_last_error());
  ub_assert_bytes(p, src + 64, 8192, "read-write mapping");
  for (size_t i = 0; i < 8192; i++)
    p[i] = (unsigned char)~p[i];
  cr_assert_eq(um_unmap(b, p), UM_OK, "%s", um_last_error());
  for (size_t i = 64; i < 64 + 8192; i++)
    src[i] = (unsigned char)~src[i];
  ub_pattern(back, n, 99); /* whatever was there */
  cr_assert_eq(um_copy_to_host(b, 0, back, n, &ev), UM_OK, "%s", um_last_error());
  ub_wait(ev, UM_OK);
  ub_assert_bytes(back, src, n, "after the mapping was written");
  cr_assert_eq(um_copy_from_host(a, 0, src, n, &ev), UM_OK);
  cr_assert_eq(um_device_synchronize(d), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_event_query(ev), UM_OK, "synchronize returned before the copy finished");
  um_event_release(ev);
  cr_assert_eq(um_release(a), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  free(src);
  free(back);
}

#endif /* UNIMEM_TEST_BLOCKING_CALLS_H */
