/* um_map / um_unmap on OpenCL buffers. A DEVICE buffer has no host view:
 * mapping it goes through the backend's map (clEnqueueMapBuffer), with the
 * coherence state following buffer.c's state machine: HOST|DEVICE while
 * mapped for reading, HOST while mapped for a writing mode, DEVICE after
 * unmap. PINNED and UNIFIED buffers are host views: mapping is a pointer
 * into them and the state stays HOST|DEVICE. */
#include "opencl_util.h"

#define N (200000u + 13u)
#define BOTH (UM_VALID_HOST | UM_VALID_DEVICE)

static um_buffer *device_buffer_with(ou_env *e, unsigned seed, unsigned char *bytes) {
  um_buffer *b = ou_alloc(e->m, e->dev[0], N, UM_DEVICE);
  ou_pattern(bytes, N, seed);
  cr_assert_eq(um_copy_from_host(b, 0, bytes, N, NULL), UM_OK);
  cr_assert_eq(um_buffer_valid(b), UM_VALID_DEVICE);
  return b;
}

OU_TEST_1_AND_2(opencl_map, device_buffer_read_mapping) {
  ou_env e = ou_open(NULL, 1);
  unsigned char *bytes = ou_malloc(N);
  um_buffer *b = device_buffer_with(&e, 1, bytes);
  void *p = NULL;
  um_stats before = ut_stats(e.m, e.dev[0]), after;
  cr_assert_null(um_buffer_host_ptr(b));
  cr_assert_eq(um_map(b, UM_MAP_READ, 1001, 5000, &p), UM_OK, "%s", um_last_error());
  cr_assert_not_null(p);
  cr_assert(b->map_native, "the backend's map was used");
  cr_assert_null(b->shadow, "no host shadow for a buffer the backend maps");
  cr_assert_eq(um_buffer_valid(b), BOTH);
  ou_assert_bytes(p, bytes + 1001, 5000, "mapped for reading");
  cr_assert_eq(um_unmap(b, p), UM_OK);
  cr_assert_eq(um_buffer_valid(b), UM_VALID_DEVICE);
  after = ut_stats(e.m, e.dev[0]);
  ou_assert_strategies(before, after, 0, 0, 0, 0, 0); /* no transfer of the core's own */
  cr_assert_eq(um_release(b), UM_OK);
  free(bytes);
  ou_close(&e);
}

/* Each writing mode: HOST while mapped, DEVICE after unmap, and the device
 * holds what was written through the mapping (and only there). */
OU_TEST_1_AND_2(opencl_map, device_buffer_writing_modes) {
  static const um_map_mode modes[] = {UM_MAP_WRITE, UM_MAP_READ_WRITE, UM_MAP_WRITE_DISCARD};
  ou_env e = ou_open(NULL, 1);
  for (size_t k = 0; k < sizeof(modes) / sizeof(modes[0]); k++) {
    unsigned char *bytes = ou_malloc(N), *got;
    um_buffer *b = device_buffer_with(&e, 2 + (unsigned)k, bytes);
    size_t off = 333 + k, len = 70001;
    unsigned char *p = NULL;
    cr_assert_eq(um_map(b, modes[k], off, len, (void **)&p), UM_OK, "mode %d: %s", (int)modes[k],
                 um_last_error());
    cr_assert_eq(um_buffer_valid(b), UM_VALID_HOST, "mode %d", (int)modes[k]);
    if (modes[k] == UM_MAP_READ_WRITE)
      ou_assert_bytes(p, bytes + off, len, "read-write mapping shows the device's bytes");
    for (size_t i = 0; i < len; i++)
      p[i] = (unsigned char)(bytes[off + i] ^ 0x5A);
    cr_assert_eq(um_unmap(b, p), UM_OK);
    cr_assert_eq(um_buffer_valid(b), UM_VALID_DEVICE);
    for (size_t i = 0; i < len; i++)
      bytes[off + i] ^= 0x5A;
    got = ou_read_all(b);
    ou_assert_bytes(got, bytes, N, "after unmap of mode %d", (int)modes[k]);
    free(got);
    free(bytes);
    cr_assert_eq(um_release(b), UM_OK);
  }
  ou_close(&e);
}

/* The whole buffer, every mode in turn, and a map right after
 * asynchronous writes sees them. */
OU_TEST_1_AND_2(opencl_map, map_sees_earlier_async_operations) {
  ou_env e = ou_open(NULL, 1);
  unsigned char *bytes = ou_malloc(N), *src = ou_malloc(N), *want = ou_malloc(N);
  um_buffer *b = device_buffer_with(&e, 7, bytes);
  um_event *e1 = NULL, *e2 = NULL;
  void *p = NULL;
  ou_pattern(src, N, 8);
  memcpy(want, src, N);
  memset(want + 10, 0x77, 100);
  cr_assert_eq(um_copy_from_host(b, 0, src, N, &e1), UM_OK);
  cr_assert_eq(um_fill(b, 10, 0x77, 100, &e2), UM_OK);
  cr_assert_eq(um_map(b, UM_MAP_READ, 0, N, &p), UM_OK);
  ou_assert_bytes(p, want, N, "the mapping waits for the operations issued before it");
  cr_assert_eq(um_event_query(e1), UM_OK);
  cr_assert_eq(um_event_query(e2), UM_OK);
  um_event_release(e1);
  um_event_release(e2);
  cr_assert_eq(um_unmap(b, p), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  free(bytes);
  free(src);
  free(want);
  ou_close(&e);
}

OU_TEST_1_AND_2(opencl_map, misuse_of_a_device_mapping) {
  ou_env e = ou_open(NULL, 1);
  unsigned char *bytes = ou_malloc(N);
  um_buffer *b = device_buffer_with(&e, 9, bytes);
  void *p = NULL, *q = NULL;
  char tmp[16];
  cr_assert_eq(um_map(b, UM_MAP_READ, 0, N + 1, &p), UM_ERANGE);
  cr_assert_eq(um_map(b, UM_MAP_READ, 0, 0, &p), UM_EINVAL);
  cr_assert_eq(um_unmap(b, tmp), UM_ESTATE, "not mapped");
  cr_assert_eq(um_map(b, UM_MAP_WRITE, 16, 32, &p), UM_OK);
  cr_assert_eq(um_map(b, UM_MAP_READ, 0, 8, &q), UM_ESTATE, "already mapped");
  cr_assert_eq(um_copy_from_host(b, 0, tmp, sizeof(tmp), NULL), UM_ESTATE, "operations wait for unmap");
  cr_assert_eq(um_unmap(b, tmp), UM_EINVAL, "not the pointer um_map returned");
  cr_assert_eq(um_buffer_valid(b), UM_VALID_HOST);
  cr_assert_eq(um_unmap(b, p), UM_OK);
  cr_assert_eq(um_unmap(b, p), UM_ESTATE);
  /* releasing a mapped buffer unmaps it */
  cr_assert_eq(um_map(b, UM_MAP_READ, 0, 8, &p), UM_OK);
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
    unsigned char *host, *p = NULL, *got, *bytes = ou_malloc(N);
    if (!(info.locations & (1u << loc)))
      continue;
    tested++;
    b = ou_alloc(e.m, e.dev[0], N, (um_location)loc);
    host = um_buffer_host_ptr(b);
    cr_assert_not_null(host);
    ou_pattern(bytes, N, 10 + (unsigned)loc);
    cr_assert_eq(um_copy_from_host(b, 0, bytes, N, NULL), UM_OK);
    cr_assert_eq(um_buffer_valid(b), BOTH);
    for (int mode = UM_MAP_READ; mode <= UM_MAP_WRITE_DISCARD; mode++) {
      cr_assert_eq(um_map(b, (um_map_mode)mode, 1000, 4000, (void **)&p), UM_OK);
      cr_assert_eq(p, host + 1000, "location %d: the mapping is the host view", loc);
      cr_assert_eq(um_buffer_valid(b), BOTH);
      cr_assert_not(b->map_native);
      if (mode != UM_MAP_READ) {
        memset(p, mode, 4000);
        memset(bytes + 1000, mode, 4000);
      }
      cr_assert_eq(um_unmap(b, p), UM_OK);
      cr_assert_eq(um_buffer_valid(b), BOTH);
    }
    got = ou_read_all(b);
    ou_assert_bytes(got, bytes, N, "location %d after writes through mappings", loc);
    ou_assert_bytes(host, bytes, N, "location %d host view", loc);
    /* and a device copy out of it sees the same */
    {
      um_buffer *d = ou_alloc(e.m, e.dev[0], N, UM_DEVICE);
      unsigned char *dev_bytes;
      cr_assert_eq(um_copy(d, 0, b, 0, N, NULL), UM_OK);
      dev_bytes = ou_read_all(d);
      ou_assert_bytes(dev_bytes, bytes, N, "device copy of location %d", loc);
      free(dev_bytes);
      cr_assert_eq(um_release(d), UM_OK);
    }
    free(got);
    free(bytes);
    cr_assert_eq(um_release(b), UM_OK);
  }
  ou_close(&e);
  cr_assert_gt(tested, 0, "PINNED is always offered by the OpenCL backend");
}
