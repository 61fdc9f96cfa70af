/* Access brackets (SPEC §8). On every profile's device (profile.h): a
 * release inside an open bracket ends it, a bracket left open at destroy
 * is ended, blocking calls inside a bracket are refused while calls with
 * an event are ordered after its end, bad brackets and native-handle calls
 * answer exact codes, and a retained buffer needs a release per reference.
 * On the cpu profile alone, the cpu device, which has no native events:
 * the wait handle is a um_event, the end takes NULL, and the ordering with
 * unimem's own operations holds without the host blocking. The caller's
 * own kernels around brackets, with native events, are
 * backends/test_opencl_kernels.c's and cuda_kernel_checks.h's. */
#include "bytes.h"
#include "profile.h"

static ut_env env;
static um_manager *m;
static um_device *cpu;

static void setup(void) {
  ut_profile_only("cpu");
  m = ut_manager();
  cpu = um_device_get(m, 0);
}

/* A skipped suite made no manager. */
static void teardown(void) {
  if (m != NULL)
    cr_assert_eq(um_manager_destroy(m), UM_OK);
  m = NULL;
}

TestSuite(access_cpu, .init = setup, .fini = teardown);

/* The profile's manager; dev is its device. */
static um_device *dev;

static void setup_profile(void) {
  env = ut_profile_open(NULL);
  m = env.m;
  dev = env.dev;
}

TestSuite(access, .init = setup_profile, .fini = teardown);

Test(access_cpu, nothing_pending_gives_no_wait) {
  um_buffer *b;
  void *wait = (void *)1;
  um_device_native nat;
  um_buffer_native bn;
  cr_assert_eq(um_alloc(m, cpu, 256, UM_HOST, 0, &b), UM_OK);
  cr_assert_eq(um_device_native_get(cpu, &nat), UM_OK);
  cr_assert_str_eq(nat.backend, "cpu");
  cr_assert_null(nat.cl_context);
  cr_assert_eq(nat.cu_device, -1);
  cr_assert_eq(um_buffer_native_get(b, &bn), UM_OK);
  cr_assert_eq(bn.host, um_buffer_host_ptr(b));
  cr_assert_null(bn.cl_mem);
  cr_assert_eq(bn.cu_ptr, 0);
  cr_assert_eq(um_access_begin(b, UM_MAP_READ_WRITE, &wait), UM_OK);
  cr_assert_null(wait);
  memset(um_buffer_host_ptr(b), 9, 256); /* the caller's own "kernel" */
  cr_assert_eq(um_access_end(b, (void *)0x1234), UM_EINVAL, "no native events on the cpu device");
  cr_assert_eq(um_access_end(b, NULL), UM_OK);
  unsigned char back[256];
  cr_assert_eq(um_copy_to_host(b, 0, back, sizeof(back), NULL), UM_OK);
  cr_assert(ut_all_bytes(back, sizeof(back), 9));
  cr_assert_eq(um_release(b), UM_OK);
}

/* An asynchronous copy into b runs on a worker; begin does not wait for
 * it: its handle is an event that completes with it. A fill issued inside
 * the bracket runs after the bracket's end. */
Test(access_cpu, wait_is_an_event_and_later_work_waits_for_the_end) {
  const size_t n = 8u << 20;
  unsigned char *src = malloc(n), *back = malloc(n);
  um_buffer *b;
  um_event *copy, *fill, *wait = NULL;
  cr_assert(src && back);
  memset(src, 0x42, n);
  cr_assert_eq(um_alloc(m, cpu, n, UM_HOST, 0, &b), UM_OK);
  cr_assert_eq(um_copy_from_host(b, 0, src, n, &copy), UM_OK);
  cr_assert_eq(um_access_begin(b, UM_MAP_READ_WRITE, (void **)&wait), UM_OK);
  if (wait != NULL) {
    cr_assert_eq(um_event_wait(wait), UM_OK);
    cr_assert_eq(um_event_query(copy), UM_OK, "the handle completes with the copy");
  }
  cr_assert_eq(um_event_wait(copy), UM_OK);
  cr_assert(ut_all_bytes(um_buffer_host_ptr(b), n, 0x42));
  cr_assert_eq(um_fill(b, 0, 0x17, n, &fill), UM_OK, "issued inside the bracket: it waits for the end");
  cr_assert_eq(um_event_query(fill), UM_EAGAIN);
  ((unsigned char *)um_buffer_host_ptr(b))[0] = 1;
  cr_assert_eq(um_access_end(b, NULL), UM_OK);
  cr_assert_eq(um_event_wait(fill), UM_OK);
  cr_assert_eq(um_copy_to_host(b, 0, back, n, NULL), UM_OK);
  cr_assert(ut_all_bytes(back, n, 0x17), "the fill ran after the caller's write");
  um_event_release(copy);
  um_event_release(fill);
  cr_assert_eq(um_release(b), UM_OK);
  free(src);
  free(back);
}

/* A release inside an open bracket ends it; the block goes back. */
Test(access, release_inside_a_bracket) {
  um_buffer *b, *again;
  void *wait = NULL;
  um_stats s;
  cr_assert_eq(um_alloc(m, dev, 1000, UM_DEVICE, 0, &b), UM_OK);
  cr_assert_eq(um_access_begin(b, UM_MAP_WRITE, &wait), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_access_end(b, NULL), UM_ESTATE, "released: the release ended it");
  cr_assert_eq(um_device_synchronize(dev), UM_OK);
  s = ut_stats(m, NULL);
  cr_assert_eq(s.active_buffers, 0);
  cr_assert_eq(s.bytes_pooled, ut_class(1000));
  cr_assert_eq(um_alloc(m, dev, 1000, UM_DEVICE, 0, &again), UM_OK);
  cr_assert_eq(again, b, "the block went back to the pool");
  cr_assert_eq(um_release(again), UM_OK);
}

/* A wrap released inside a bracket waits for the bracket's end (at once:
 * the release ends it). */
Test(access_cpu, wrap_released_inside_a_bracket) {
  char mine[128];
  um_buffer *w;
  void *wait = NULL;
  cr_assert_eq(um_wrap_host(m, mine, sizeof(mine), 0, &w), UM_OK);
  cr_assert_eq(um_access_begin(w, UM_MAP_READ, &wait), UM_OK);
  cr_assert_eq(um_release(w), UM_OK);
  cr_assert_eq(ut_stats(m, NULL).active_buffers, 0);
}

/* A bracket left open when the manager is destroyed is ended (and logged). */
Test(access, destroy_with_an_open_bracket) {
  um_buffer *b;
  void *wait = NULL;
  cr_assert_eq(um_alloc(m, dev, 64, UM_DEVICE, 0, &b), UM_OK);
  cr_assert_eq(um_access_begin(b, UM_MAP_READ, &wait), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_ELEAK, "the buffer itself leaked");
  m = NULL;
}

/* A blocking call on a buffer inside an open bracket would wait for the
 * bracket's end, which the same thread is to call: refused with
 * UM_ESTATE (copies, fills, batches, maps), while calls with an event are
 * ordered after the bracket; after the end, blocking calls work again. */
Test(access, blocking_calls_inside_a_bracket_are_refused) {
  um_buffer *b, *other;
  um_event *e;
  unsigned char in[128], back[128];
  void *wait = NULL, *p;
  um_copy_op op;
  memset(in, 0x3C, sizeof(in));
  cr_assert_eq(um_alloc(m, dev, sizeof(in), UM_DEVICE, UM_ALLOC_ZERO, &b), UM_OK);
  cr_assert_eq(um_alloc(m, dev, sizeof(in), UM_DEVICE, UM_ALLOC_ZERO, &other), UM_OK);
  cr_assert_eq(um_access_begin(b, UM_MAP_READ_WRITE, &wait), UM_OK);
  cr_assert_eq(um_copy_to_host(b, 0, back, sizeof(back), NULL), UM_ESTATE);
  cr_assert(strstr(um_last_error(), "open um_access_begin bracket") != NULL, "%s", um_last_error());
  cr_assert_eq(um_copy_from_host(b, 0, in, sizeof(in), NULL), UM_ESTATE);
  cr_assert_eq(um_fill(b, 0, 1, sizeof(in), NULL), UM_ESTATE);
  cr_assert_eq(um_copy(other, 0, b, 0, sizeof(in), NULL), UM_ESTATE, "the source in a bracket");
  op = (um_copy_op){.dst = other, .src = b, .bytes = sizeof(in)};
  cr_assert_eq(um_copy_batch(m, &op, 1, NULL), UM_ESTATE);
  cr_assert_eq(um_map(b, UM_MAP_READ, 0, sizeof(in), &p), UM_ESTATE);
  /* With an event: issued, ordered after the bracket. */
  cr_assert_eq(um_copy_from_host(b, 0, in, sizeof(in), &e), UM_OK);
  cr_assert_eq(um_event_query(e), UM_EAGAIN, "ran inside the bracket");
  if (um_buffer_host_ptr(b) != NULL) /* the caller's "kernel", where the buffer has a host view */
    memset(um_buffer_host_ptr(b), 0x11, sizeof(in));
  cr_assert_eq(um_access_end(b, NULL), UM_OK);
  cr_assert_eq(um_event_wait(e), UM_OK);
  cr_assert_eq(um_event_release(e), UM_OK);
  cr_assert_eq(um_copy_to_host(b, 0, back, sizeof(back), NULL), UM_OK);
  cr_assert_arr_eq(back, in, sizeof(in), "the copy ran after the caller's work");
  cr_assert_eq(um_copy_batch(m, &op, 1, NULL), UM_OK);
  cr_assert_eq(um_release(other), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
}

/* Bad input: exact codes, statistics unchanged (each backend's own bad done
 * events: test_opencl_kernels bad_brackets, cuda_kernel_checks.h). */
Test(access, bad_brackets_and_handles) {
  um_buffer *x = ub_alloc(m, dev, 4096, UM_DEVICE), *gone = ub_alloc(m, dev, 64, UM_DEVICE);
  um_buffer_native bn;
  um_device_native dn;
  void *wait = NULL, *mapped = NULL;
  ut_snapshot before;
  cr_assert_eq(um_release(gone), UM_OK);
  before = ut_snap(m);
  cr_assert_eq(um_access_begin(NULL, UM_MAP_READ, &wait), UM_EINVAL);
  cr_assert_eq(um_access_begin(x, UM_MAP_READ, NULL), UM_EINVAL);
  cr_assert_eq(um_access_begin(x, (um_map_mode)9, &wait), UM_EINVAL);
  cr_assert_eq(um_access_begin(gone, UM_MAP_READ, &wait), UM_ESTATE);
  cr_assert_eq(um_access_end(x, NULL), UM_ESTATE, "no bracket open");
  cr_assert_eq(um_access_end(NULL, NULL), UM_EINVAL);
  cr_assert_eq(um_access_end(gone, NULL), UM_ESTATE);
  cr_assert_eq(um_access_begin(x, UM_MAP_WRITE, &wait), UM_OK);
  cr_assert_eq(um_access_begin(x, UM_MAP_WRITE, &wait), UM_ESTATE, "opened twice");
  cr_assert_eq(um_map(x, UM_MAP_READ, 0, 16, &mapped), UM_ESTATE, "mapped inside a bracket");
  cr_assert_eq(um_access_end(x, NULL), UM_OK);
  cr_assert_eq(um_access_end(x, NULL), UM_ESTATE, "ended twice");
  cr_assert_eq(um_buffer_native_get(gone, &bn), UM_ESTATE);
  cr_assert_eq(um_buffer_native_get(NULL, &bn), UM_EINVAL);
  cr_assert_eq(um_buffer_native_get(x, NULL), UM_EINVAL);
  cr_assert_eq(um_device_native_get(NULL, &dn), UM_EINVAL);
  cr_assert_eq(um_device_native_get(dev, NULL), UM_EINVAL);
  cr_assert_eq(um_device_native_get((um_device *)(void *)x, &dn), UM_EINVAL);
  cr_assert_eq(um_buffer_retain(gone), UM_ESTATE);
  cr_assert_eq(um_buffer_retain(NULL), UM_EINVAL);
  ut_assert_unchanged(m, before);
  cr_assert_eq(um_release(x), UM_OK);
}

/* A buffer retained twice needs three releases. */
Test(access, retain) {
  um_buffer *x = ub_alloc(m, dev, 64, UM_DEVICE);
  uint64_t active = ut_stats(m, NULL).active_buffers;
  cr_assert_eq(um_buffer_retain(x), UM_OK);
  cr_assert_eq(um_buffer_retain(x), UM_OK);
  cr_assert_eq(um_release(x), UM_OK);
  cr_assert_eq(um_release(x), UM_OK);
  cr_assert_eq(um_buffer_size(x), 64, "still live");
  cr_assert_eq(ut_stats(m, NULL).active_buffers, active);
  cr_assert_eq(um_release(x), UM_OK);
  cr_assert_eq(um_release(x), UM_ESTATE);
  cr_assert_eq(ut_stats(m, NULL).active_buffers, active - 1);
}
