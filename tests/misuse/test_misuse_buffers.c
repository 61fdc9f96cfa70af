/* Misuse of buffer handles (SPEC section 5): every call on a released
 * buffer answers UM_ESTATE (getters 0/NULL), for every kind of buffer and
 * device; a released handle that the pool handed to a new allocation is
 * that allocation (the contract's limit, checked as such); a buffer of
 * another manager is UM_EINVAL wherever it meets this manager's buffers or
 * devices; a handle of another kind, or NULL, is UM_EINVAL in every
 * position. Every refused call leaves both managers' statistics as they
 * were and writes no out-parameter.
 *
 * Devices: 0 the cpu, 1 a "fault" device (device memory with no host view,
 * copies queued natively), 2 a "fault-map" device (no host view, mapped by
 * the backend), from tests/support/fault_backend.c. Each test runs in its own
 * process under a timeout. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fault_backend.h"
#include "misuse_util.h"

static um_manager *m;
static um_device *cpu, *fdev, *fmap;

static void quiet(void *ctx, um_log_level level, const char *msg) { (void)ctx, (void)level, (void)msg; }

static um_manager *fault_manager(int debug) {
  um_options o;
  um_manager *mm = NULL;
  ut_options(&o);
  o.debug = debug;
  o.log = quiet;
  fault_configure(1, 256u << 20);
  cr_assert_eq(fault_manager_create(&o, &mm), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_device_count(mm), 3);
  return mm;
}

static void start(int debug) {
  m = fault_manager(debug);
  cpu = um_device_get(m, 0);
  fdev = um_device_get(m, 1);
  fmap = um_device_get(m, 2);
}

static void setup(void) { start(0); }
static void setup_debug(void) { start(1); }

static void teardown(void) {
  fault_counts c;
  mu_gate_open();
  cr_assert_eq(um_manager_destroy(m), UM_OK, "%s", um_last_error());
  fault_counts_get(&c);
  cr_assert_eq(c.live_blocks, 0);
}

TestSuite(buffers, .init = setup, .fini = teardown, .timeout = 60);
TestSuite(buffers_debug, .init = setup_debug, .fini = teardown, .timeout = 60);

static um_buffer *alloc_on(um_manager *mm, um_device *d, size_t n, um_location loc, unsigned flags) {
  um_buffer *b = NULL;
  cr_assert_eq(um_alloc(mm, d, n, loc, flags, &b), UM_OK, "%s", um_last_error());
  return b;
}

static int count_chunk(void *user, um_buffer *chunk, size_t off, size_t n) {
  (void)chunk, (void)off, (void)n;
  (*(int *)user)++;
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Released buffers: every call, blocking and with an event. */

static void expect_stale_buffer(um_buffer *dead, um_buffer *live) {
  unsigned char host[64], keep[64];
  unsigned char *live_before = mu_malloc(64), *live_after = mu_malloc(64);
  void *p = MU_SENTINEL;
  um_event *e = MU_SENTINEL;
  um_copy_op ops[2];
  int calls = 0;
  memset(host, 7, sizeof(host));
  memcpy(keep, host, sizeof(host));
  cr_assert_eq(um_copy_to_host(live, 0, live_before, 64, NULL), UM_OK);

  MU_FAILS(m, UM_ESTATE, um_release(dead));
  MU_FAILS(m, UM_ESTATE, um_copy_from_host(dead, 0, host, 16, NULL));
  MU_FAILS(m, UM_ESTATE, um_copy_from_host(dead, 0, host, 16, &e));
  MU_FAILS(m, UM_ESTATE, um_copy_to_host(dead, 0, host, 16, NULL));
  MU_FAILS(m, UM_ESTATE, um_copy_to_host(dead, 0, host, 16, &e));
  MU_FAILS(m, UM_ESTATE, um_copy(dead, 0, live, 0, 16, NULL));
  MU_FAILS(m, UM_ESTATE, um_copy(live, 0, dead, 0, 16, &e));
  MU_FAILS(m, UM_ESTATE, um_copy(dead, 0, dead, 32, 16, NULL));
  MU_FAILS(m, UM_ESTATE, um_fill(dead, 0, 1, 16, NULL));
  MU_FAILS(m, UM_ESTATE, um_fill(dead, 0, 1, 16, &e));
  for (int mode = UM_MAP_READ; mode <= UM_MAP_WRITE_DISCARD; mode++)
    MU_FAILS(m, UM_ESTATE, um_map(dead, (um_map_mode)mode, 0, 16, &p));
  MU_FAILS(m, UM_ESTATE, um_unmap(dead, host));
  MU_FAILS(m, UM_ESTATE, um_unmap(dead, NULL));
  /* Batches: a good op first, then the stale one; nothing may run. */
  ops[0] = (um_copy_op){.dst = live, .host_src = host, .bytes = 16};
  ops[1] = (um_copy_op){.dst = dead, .host_src = host, .bytes = 16};
  MU_FAILS(m, UM_ESTATE, um_copy_batch(m, ops, 2, NULL));
  ops[1] = (um_copy_op){.host_dst = host, .src = dead, .bytes = 16};
  MU_FAILS(m, UM_ESTATE, um_copy_batch(m, ops, 2, &e));
  ops[1] = (um_copy_op){.dst = live, .dst_off = 16, .src = dead, .bytes = 16};
  MU_FAILS(m, UM_ESTATE, um_copy_batch(m, ops, 2, NULL));
  ops[1] = (um_copy_op){.dst = dead, .src = live, .bytes = 16};
  MU_FAILS(m, UM_ESTATE, um_copy_batch(m, &ops[1], 1, &e));
  MU_FAILS(m, UM_ESTATE, um_stream(dead, 0, 16, cpu, 8, count_chunk, NULL, &calls));
  MU_FAILS(m, UM_ESTATE, um_stream(dead, 0, 16, fdev, 8, count_chunk, NULL, &calls));
  cr_assert_eq(calls, 0, "um_stream called its function on a released buffer");
  MU_QUIET(m, cr_assert_eq(um_buffer_size(dead), 0));
  MU_QUIET(m, cr_assert_null(um_buffer_device(dead)));
  MU_QUIET(m, cr_assert_eq(um_buffer_location(dead), UM_HOST));
  MU_QUIET(m, cr_assert_eq(um_buffer_valid(dead), 0));
  MU_QUIET(m, cr_assert_null(um_buffer_host_ptr(dead)));
  cr_assert_eq(p, MU_SENTINEL);
  cr_assert_eq(e, MU_SENTINEL);
  cr_assert_arr_eq(host, keep, sizeof(host), "a refused call wrote host memory");
  cr_assert_eq(um_copy_to_host(live, 0, live_after, 64, NULL), UM_OK);
  cr_assert_arr_eq(live_after, live_before, 64, "a refused call wrote the live buffer");
  free(live_before);
  free(live_after);
}

static void released_case(um_device *d, um_location loc, unsigned flags) {
  um_buffer *live = alloc_on(m, cpu, 64, UM_HOST, UM_ALLOC_ZERO);
  um_buffer *dead = alloc_on(m, d, 4096, loc, flags);
  cr_assert_eq(um_fill(dead, 0, 0x3c, 4096, NULL), UM_OK); /* touched */
  cr_assert_eq(um_release(dead), UM_OK);
  expect_stale_buffer(dead, live);
  cr_assert_eq(um_release(live), UM_OK);
}

Test(buffers, released_host_pooled) { released_case(cpu, UM_HOST, 0); }
Test(buffers, released_host_unpooled) { released_case(cpu, UM_DEVICE, UM_ALLOC_UNPOOLED); }
Test(buffers, released_unified) { released_case(cpu, UM_UNIFIED, 0); }
Test(buffers, released_device_native_queue) { released_case(fdev, UM_DEVICE, 0); }
Test(buffers, released_pinned) { released_case(fdev, UM_PINNED, 0); }
Test(buffers, released_device_mapped_backend) { released_case(fmap, UM_DEVICE, 0); }

Test(buffers, released_wrap) {
  unsigned char *mem = mu_malloc(4096);
  um_buffer *live = alloc_on(m, cpu, 64, UM_HOST, 0), *dead = NULL;
  cr_assert_eq(um_wrap_host(m, mem, 4096, 0, &dead), UM_OK);
  cr_assert_eq(um_release(dead), UM_OK);
  free(mem); /* the caller's memory may go at once */
  expect_stale_buffer(dead, live);
  cr_assert_eq(um_release(live), UM_OK);
}

Test(buffers, released_file) {
  char path[] = "/tmp/unimem-misuse-XXXXXX";
  unsigned char page[4096];
  int fd = mkstemp(path);
  um_buffer *live = alloc_on(m, cpu, 64, UM_HOST, 0), *dead = NULL;
  cr_assert_geq(fd, 0, "mkstemp: %s", strerror(errno));
  memset(page, 0x61, sizeof(page));
  cr_assert_eq(write(fd, page, sizeof(page)), (ssize_t)sizeof(page));
  close(fd);
  cr_assert_eq(um_map_file(m, path, UM_MAP_READ_WRITE, &dead), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_release(dead), UM_OK);
  unlink(path);
  expect_stale_buffer(dead, live);
  cr_assert_eq(um_release(live), UM_OK);
}

/* Released while mapped (the release ends the mapping) on each kind of
 * mapping: a pointer, a host shadow, the backend's own map. */
Test(buffers, released_while_mapped) {
  um_device *devs[] = {cpu, fdev, fmap};
  um_buffer *live = alloc_on(m, cpu, 64, UM_HOST, 0);
  for (int i = 0; i < 3; i++) {
    um_buffer *dead = alloc_on(m, devs[i], 4096, UM_DEVICE, 0);
    void *p = NULL;
    cr_assert_eq(um_map(dead, UM_MAP_READ_WRITE, 0, 4096, &p), UM_OK);
    cr_assert_eq(um_release(dead), UM_OK);
    MU_FAILS(m, UM_ESTATE, um_unmap(dead, p));
    expect_stale_buffer(dead, live);
  }
  cr_assert_eq(um_release(live), UM_OK);
}

/* Released with its operations held in flight: the handle is stale at
 * once, while the block waits for them. */
Test(buffers, released_with_operations_in_flight) {
  um_buffer *live = alloc_on(m, cpu, 64, UM_HOST, 0);
  um_buffer *dead = alloc_on(m, cpu, MU_WORKER_BYTES, UM_HOST, 0);
  um_event *e = NULL;
  mu_gate_close(m);
  cr_assert_eq(um_fill(dead, 0, 0x19, MU_WORKER_BYTES, &e), UM_OK);
  mu_gate_wait_entered(1);
  cr_assert_eq(um_release(dead), UM_OK);
  expect_stale_buffer(dead, live);
  mu_gate_open();
  cr_assert_eq(um_event_wait(e), UM_OK);
  cr_assert_eq(um_event_release(e), UM_OK);
  cr_assert_eq(um_release(live), UM_OK);
}

/* ------------------------------------------------------------------------ */
/* Released, then the handle handed to a new allocation. The contract
 * (unimem.h, um_release): a released handle answers UM_ESTATE "until its
 * block is handed to a new allocation"; from then on it IS the new buffer,
 * and a caller who keeps the old pointer aliases the new owner (the debug
 * option closes that hole: buffers_debug below). What the library still
 * guarantees: ranges are checked against the new owner's size, so the old
 * owner's larger writes are refused instead of running past it. */

static void expect_larger_access_refused(um_buffer *stale, size_t old_size) {
  unsigned char *host = mu_malloc(old_size);
  void *p = MU_SENTINEL;
  memset(host, 0x77, old_size);
  MU_FAILS(m, UM_ERANGE, um_copy_from_host(stale, 0, host, old_size, NULL));
  MU_FAILS(m, UM_ERANGE, um_copy_to_host(stale, 0, host, old_size, NULL));
  MU_FAILS(m, UM_ERANGE, um_fill(stale, 0, 0x77, old_size, NULL));
  MU_FAILS(m, UM_ERANGE, um_map(stale, UM_MAP_WRITE, 0, old_size, &p));
  cr_assert_eq(p, MU_SENTINEL);
  cr_assert(ut_all_bytes(host, old_size, 0x77));
  free(host);
}

Test(buffers, pooled_handle_reused_smaller) {
  um_buffer *a = alloc_on(m, cpu, 4096, UM_HOST, 0), *b;
  cr_assert_eq(um_release(a), UM_OK);
  b = alloc_on(m, cpu, 4000, UM_HOST, UM_ALLOC_ZERO);
  cr_assert_eq(b, a, "the pool hands the same block and handle back");
  cr_assert_eq(um_buffer_size(a), 4000, "the old pointer is the new buffer");
  expect_larger_access_refused(a, 4096);
  cr_assert(ut_all_bytes(um_buffer_host_ptr(b), 4000, 0), "the new owner's bytes changed");
  cr_assert_eq(um_release(b), UM_OK);
  MU_FAILS(m, UM_ESTATE, um_release(a));
}

Test(buffers, device_handle_reused_smaller) {
  um_buffer *a = alloc_on(m, fdev, 8192, UM_DEVICE, 0), *b;
  unsigned char back[8000];
  cr_assert_eq(um_release(a), UM_OK);
  b = alloc_on(m, fdev, 8000, UM_DEVICE, UM_ALLOC_ZERO);
  cr_assert_eq(b, a);
  expect_larger_access_refused(a, 8192);
  cr_assert_eq(um_copy_to_host(b, 0, back, sizeof(back), NULL), UM_OK);
  cr_assert(ut_all_bytes(back, sizeof(back), 0));
  cr_assert_eq(um_release(b), UM_OK);
}

/* An unpooled block goes back to the device; its handle waits for any new
 * allocation, of any size, on any device. */
Test(buffers, unpooled_handle_reused_elsewhere) {
  um_buffer *a = alloc_on(m, fdev, 8192, UM_DEVICE, UM_ALLOC_UNPOOLED), *b;
  cr_assert_eq(um_release(a), UM_OK);
  b = alloc_on(m, cpu, 100, UM_HOST, UM_ALLOC_UNPOOLED | UM_ALLOC_ZERO);
  cr_assert_eq(b, a);
  cr_assert_eq(um_buffer_device(a), cpu, "the old pointer is the new buffer, on its device");
  expect_larger_access_refused(a, 8192);
  cr_assert(ut_all_bytes(um_buffer_host_ptr(b), 100, 0));
  cr_assert_eq(um_release(b), UM_OK);
}

/* With the debug option a released handle stays stale after its size was
 * allocated again, and the new buffer is untouched by the stale calls. */
Test(buffers_debug, released_then_smaller_allocation) {
  um_device *devs[] = {cpu, fdev, fmap};
  um_buffer *live = alloc_on(m, cpu, 64, UM_HOST, 0);
  for (int i = 0; i < 3; i++) {
    um_buffer *a = alloc_on(m, devs[i], 4096, UM_DEVICE, 0), *b;
    unsigned char back[4000];
    cr_assert_eq(um_release(a), UM_OK);
    b = alloc_on(m, devs[i], 4000, UM_DEVICE, 0);
    cr_assert_neq(b, a, "device %d: a quarantined handle was handed out", i);
    cr_assert_eq(um_fill(b, 0, 0x2d, 4000, NULL), UM_OK);
    expect_stale_buffer(a, live);
    cr_assert_eq(um_copy_to_host(b, 0, back, sizeof(back), NULL), UM_OK);
    cr_assert(ut_all_bytes(back, sizeof(back), 0x2d), "device %d: stale calls reached the new buffer", i);
    cr_assert_eq(um_release(b), UM_OK);
  }
  cr_assert_eq(um_release(live), UM_OK);
}

/* ------------------------------------------------------------------------ */
/* Buffers of another manager */

Test(buffers, copy_between_managers) {
  um_manager *m2 = fault_manager(0);
  um_device *d2[] = {um_device_get(m2, 0), um_device_get(m2, 1), um_device_get(m2, 2)};
  um_device *d1[] = {cpu, fdev, fmap};
  for (int i = 0; i < 3; i++) {
    for (int j = 0; j < 3; j++) {
      um_buffer *a = alloc_on(m, d1[i], 256, UM_DEVICE, 0);
      um_buffer *b = alloc_on(m2, d2[j], 256, UM_DEVICE, 0);
      um_event *e = MU_SENTINEL;
      MU_FAILS2(m, m2, UM_EINVAL, um_copy(a, 0, b, 0, 64, NULL));
      MU_FAILS2(m, m2, UM_EINVAL, um_copy(b, 0, a, 0, 64, NULL));
      MU_FAILS2(m, m2, UM_EINVAL, um_copy(a, 0, b, 0, 64, &e));
      MU_FAILS2(m, m2, UM_EINVAL, um_copy(b, 0, a, 0, 64, &e));
      cr_assert_eq(e, MU_SENTINEL);
      cr_assert_eq(um_release(a), UM_OK);
      cr_assert_eq(um_release(b), UM_OK);
    }
  }
  cr_assert_eq(um_manager_destroy(m2), UM_OK);
}

Test(buffers, batch_with_mixed_managers) {
  um_manager *m2 = fault_manager(0);
  um_buffer *a = alloc_on(m, fdev, 256, UM_DEVICE, UM_ALLOC_ZERO);
  um_buffer *h = alloc_on(m, cpu, 256, UM_HOST, UM_ALLOC_ZERO);
  um_buffer *b = alloc_on(m2, um_device_get(m2, 1), 256, UM_DEVICE, UM_ALLOC_ZERO);
  unsigned char src[256], back[256];
  um_copy_op ops[2];
  um_event *e = MU_SENTINEL;
  memset(src, 0x4e, sizeof(src));
  ops[0] = (um_copy_op){.dst = h, .host_src = src, .bytes = 256}; /* good: must not run */
  ops[1] = (um_copy_op){.dst = b, .host_src = src, .bytes = 256};
  MU_FAILS2(m, m2, UM_EINVAL, um_copy_batch(m, ops, 2, NULL));
  ops[1] = (um_copy_op){.dst = a, .src = b, .bytes = 256};
  MU_FAILS2(m, m2, UM_EINVAL, um_copy_batch(m, ops, 2, &e));
  ops[1] = (um_copy_op){.dst = b, .src = a, .bytes = 256};
  MU_FAILS2(m, m2, UM_EINVAL, um_copy_batch(m, ops, 2, NULL));
  ops[1] = (um_copy_op){.host_dst = back, .src = b, .bytes = 256};
  MU_FAILS2(m, m2, UM_EINVAL, um_copy_batch(m, ops, 2, &e));
  /* every op of m2 handed to m, and every op of m handed to m2 */
  ops[1] = (um_copy_op){.dst = b, .host_src = src, .bytes = 256};
  MU_FAILS2(m, m2, UM_EINVAL, um_copy_batch(m, &ops[1], 1, NULL));
  MU_FAILS2(m, m2, UM_EINVAL, um_copy_batch(m2, &ops[0], 1, &e));
  cr_assert_eq(e, MU_SENTINEL);
  cr_assert(ut_all_bytes(um_buffer_host_ptr(h), 256, 0), "the good op of a refused batch ran");
  cr_assert_eq(um_copy_to_host(b, 0, back, sizeof(back), NULL), UM_OK);
  cr_assert(ut_all_bytes(back, sizeof(back), 0), "a refused batch wrote the other manager's buffer");
  cr_assert_eq(um_release(a), UM_OK);
  cr_assert_eq(um_release(h), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_manager_destroy(m2), UM_OK);
}

Test(buffers, stream_across_managers) {
  um_manager *m2 = fault_manager(0);
  um_buffer *a = alloc_on(m, cpu, 4096, UM_HOST, 0);
  um_buffer *b = alloc_on(m2, um_device_get(m2, 0), 4096, UM_HOST, 0);
  int calls = 0;
  MU_FAILS2(m, m2, UM_EINVAL, um_stream(a, 0, 4096, um_device_get(m2, 1), 1024, count_chunk, NULL, &calls));
  MU_FAILS2(m, m2, UM_EINVAL, um_stream(a, 0, 4096, um_device_get(m2, 0), 1024, count_chunk, NULL, &calls));
  MU_FAILS2(m, m2, UM_EINVAL, um_stream(b, 0, 4096, fdev, 1024, count_chunk, NULL, &calls));
  cr_assert_eq(calls, 0);
  cr_assert_eq(um_release(a), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_manager_destroy(m2), UM_OK);
}

/* ------------------------------------------------------------------------ */
/* Handles of another kind where a buffer is expected: UM_EINVAL. */

static void expect_not_a_buffer(void *p) {
  um_buffer *x = p;
  um_buffer *live = alloc_on(m, cpu, 64, UM_HOST, UM_ALLOC_ZERO);
  unsigned char host[64];
  void *mp = MU_SENTINEL;
  um_event *e = MU_SENTINEL;
  um_copy_op op;
  int calls = 0;
  memset(host, 9, sizeof(host));
  MU_FAILS(m, UM_EINVAL, um_release(x));
  MU_FAILS(m, UM_EINVAL, um_copy_from_host(x, 0, host, 16, NULL));
  MU_FAILS(m, UM_EINVAL, um_copy_from_host(x, 0, host, 16, &e));
  MU_FAILS(m, UM_EINVAL, um_copy_to_host(x, 0, host, 16, NULL));
  MU_FAILS(m, UM_EINVAL, um_copy(x, 0, live, 0, 16, NULL));
  MU_FAILS(m, UM_EINVAL, um_copy(live, 0, x, 0, 16, &e));
  MU_FAILS(m, UM_EINVAL, um_fill(x, 0, 0, 16, NULL));
  MU_FAILS(m, UM_EINVAL, um_map(x, UM_MAP_READ, 0, 16, &mp));
  MU_FAILS(m, UM_EINVAL, um_unmap(x, host));
  op = (um_copy_op){.dst = x, .host_src = host, .bytes = 16};
  MU_FAILS(m, UM_EINVAL, um_copy_batch(m, &op, 1, NULL));
  op = (um_copy_op){.dst = live, .src = x, .bytes = 16};
  MU_FAILS(m, UM_EINVAL, um_copy_batch(m, &op, 1, &e));
  MU_FAILS(m, UM_EINVAL, um_stream(x, 0, 16, cpu, 8, count_chunk, NULL, &calls));
  MU_QUIET(m, cr_assert_eq(um_buffer_size(x), 0));
  MU_QUIET(m, cr_assert_null(um_buffer_device(x)));
  MU_QUIET(m, cr_assert_eq(um_buffer_location(x), UM_HOST));
  MU_QUIET(m, cr_assert_eq(um_buffer_valid(x), 0));
  MU_QUIET(m, cr_assert_null(um_buffer_host_ptr(x)));
  cr_assert_eq(calls, 0);
  cr_assert_eq(mp, MU_SENTINEL);
  cr_assert_eq(e, MU_SENTINEL);
  cr_assert(ut_all_bytes(host, sizeof(host), 9));
  cr_assert(ut_all_bytes(um_buffer_host_ptr(live), 64, 0));
  cr_assert_eq(um_release(live), UM_OK);
}

Test(buffers, device_handle_as_buffer) {
  um_device *devs[] = {cpu, fdev, fmap};
  for (int i = 0; i < 3; i++) {
    um_device_info info;
    expect_not_a_buffer(devs[i]);
    cr_assert_eq(um_device_info_get(devs[i], &info), UM_OK);
    cr_assert_eq(info.index, i);
  }
}

Test(buffers, event_handle_as_buffer) {
  um_buffer *b = alloc_on(m, cpu, 64, UM_HOST, 0);
  um_event *e = NULL;
  cr_assert_eq(um_fill(b, 0, 1, 64, &e), UM_OK);
  expect_not_a_buffer(e);
  cr_assert_eq(um_event_wait(e), UM_OK);
  cr_assert_eq(um_event_release(e), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
}

Test(buffers, manager_handle_as_buffer) {
  expect_not_a_buffer(m);
  cr_assert_eq(um_device_count(m), 3);
}

Test(buffers, zeroed_memory_as_buffer) {
  uint64_t zero[64] = {0};
  expect_not_a_buffer(zero);
  cr_assert(ut_all_bytes(zero, sizeof(zero), 0), "a call wrote into a pointer that is no buffer");
}

/* ------------------------------------------------------------------------ */
/* NULL in each position */

Test(buffers, null_in_each_position) {
  um_buffer *b = alloc_on(m, fdev, 64, UM_DEVICE, 0);
  unsigned char host[64];
  void *p = MU_SENTINEL;
  um_event *e = MU_SENTINEL;
  um_copy_op op = {.dst = b, .host_src = host, .bytes = 16};
  int calls = 0;
  memset(host, 1, sizeof(host));
  MU_FAILS(m, UM_EINVAL, um_release(NULL));
  MU_FAILS(m, UM_EINVAL, um_copy_from_host(NULL, 0, host, 16, &e));
  MU_FAILS(m, UM_EINVAL, um_copy_from_host(b, 0, NULL, 16, &e));
  MU_FAILS(m, UM_EINVAL, um_copy_to_host(NULL, 0, host, 16, &e));
  MU_FAILS(m, UM_EINVAL, um_copy_to_host(b, 0, NULL, 16, &e));
  MU_FAILS(m, UM_EINVAL, um_copy(NULL, 0, b, 0, 16, &e));
  MU_FAILS(m, UM_EINVAL, um_copy(b, 0, NULL, 0, 16, &e));
  MU_FAILS(m, UM_EINVAL, um_copy(NULL, 0, NULL, 0, 16, NULL));
  MU_FAILS(m, UM_EINVAL, um_fill(NULL, 0, 0, 16, &e));
  MU_FAILS(m, UM_EINVAL, um_map(NULL, UM_MAP_READ, 0, 16, &p));
  MU_FAILS(m, UM_EINVAL, um_map(b, UM_MAP_READ, 0, 16, NULL));
  MU_FAILS(m, UM_EINVAL, um_unmap(NULL, host));
  MU_FAILS(m, UM_EINVAL, um_copy_batch(NULL, &op, 1, &e));
  MU_FAILS(m, UM_EINVAL, um_copy_batch(m, NULL, 1, &e));
  op = (um_copy_op){.host_src = host, .bytes = 16}; /* no destination */
  MU_FAILS(m, UM_EINVAL, um_copy_batch(m, &op, 1, &e));
  op = (um_copy_op){.dst = b, .bytes = 16}; /* no source */
  MU_FAILS(m, UM_EINVAL, um_copy_batch(m, &op, 1, &e));
  MU_FAILS(m, UM_EINVAL, um_stream(NULL, 0, 16, cpu, 8, count_chunk, NULL, &calls));
  MU_FAILS(m, UM_EINVAL, um_stream(b, 0, 16, NULL, 8, count_chunk, NULL, &calls));
  MU_FAILS(m, UM_EINVAL, um_stream(b, 0, 16, cpu, 8, NULL, NULL, &calls));
  MU_QUIET(m, cr_assert_eq(um_buffer_size(NULL), 0));
  MU_QUIET(m, cr_assert_null(um_buffer_device(NULL)));
  MU_QUIET(m, cr_assert_eq(um_buffer_location(NULL), UM_HOST));
  MU_QUIET(m, cr_assert_eq(um_buffer_valid(NULL), 0));
  MU_QUIET(m, cr_assert_null(um_buffer_host_ptr(NULL)));
  cr_assert_eq(calls, 0);
  cr_assert_eq(p, MU_SENTINEL);
  cr_assert_eq(e, MU_SENTINEL);
  cr_assert_eq(um_release(b), UM_OK);
}

/* The pointer of another buffer's mapping: UM_EINVAL, both stay mapped. */
Test(buffers, unmap_with_another_buffers_pointer) {
  um_device *devs[] = {cpu, fdev, fmap};
  for (int i = 0; i < 3; i++) {
    um_buffer *a = alloc_on(m, devs[i], 4096, UM_DEVICE, 0), *b = alloc_on(m, devs[i], 4096, UM_DEVICE, 0);
    void *pa = NULL, *pb = NULL;
    cr_assert_eq(um_map(a, UM_MAP_READ_WRITE, 0, 4096, &pa), UM_OK);
    cr_assert_eq(um_map(b, UM_MAP_READ, 0, 4096, &pb), UM_OK);
    MU_FAILS(m, UM_EINVAL, um_unmap(a, pb));
    MU_FAILS(m, UM_EINVAL, um_unmap(b, pa));
    cr_assert_eq(um_unmap(a, pa), UM_OK, "device %d: the refused unmap ended a's mapping", i);
    cr_assert_eq(um_unmap(b, pb), UM_OK, "device %d: the refused unmap ended b's mapping", i);
    cr_assert_eq(um_release(a), UM_OK);
    cr_assert_eq(um_release(b), UM_OK);
  }
}

/* Two threads release the same buffer at once: exactly one release takes
 * (UM_OK), the other answers UM_ESTATE, and the buffer is counted once. */
typedef struct racer {
  pthread_t t;
  um_buffer *b;
  pthread_barrier_t *start;
  int status;
} racer;

static void *release_racer(void *arg) {
  racer *r = arg;
  pthread_barrier_wait(r->start);
  r->status = um_release(r->b);
  return NULL;
}

Test(buffers, double_release_from_two_threads) {
  enum { ROUNDS = 200 };
  pthread_barrier_t start;
  um_device *devs[] = {cpu, fdev, fmap};
  um_stats s;
  cr_assert_eq(pthread_barrier_init(&start, NULL, 2), 0);
  for (int i = 0; i < ROUNDS; i++) {
    um_buffer *b = alloc_on(m, devs[i % 3], 64 + (size_t)i, UM_DEVICE, 0);
    racer r[2] = {{.b = b, .start = &start, .status = 1}, {.b = b, .start = &start, .status = 1}};
    if (i % 2)
      cr_assert_eq(um_fill(b, 0, i, 64, NULL), UM_OK); /* touched: the slower release path */
    for (int k = 0; k < 2; k++)
      cr_assert_eq(pthread_create(&r[k].t, NULL, release_racer, &r[k]), 0);
    for (int k = 0; k < 2; k++)
      pthread_join(r[k].t, NULL);
    cr_assert((r[0].status == UM_OK && r[1].status == UM_ESTATE) || (r[0].status == UM_ESTATE && r[1].status == UM_OK),
              "round %d: the releases answered %s and %s", i, um_err_name(r[0].status), um_err_name(r[1].status));
  }
  pthread_barrier_destroy(&start);
  s = ut_stats(m, NULL);
  cr_assert_eq(s.active_buffers, 0);
  cr_assert_eq(s.releases, ROUNDS);
  cr_assert_eq(s.bytes_in_use, 0);
}
