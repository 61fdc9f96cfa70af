/* Brackets on the cpu device, which has no native events (SPEC §8): the
 * wait handle is a um_event, the end takes NULL, and the ordering with
 * unimem's own operations holds without the host blocking. */
#include "test_util.h"

static um_manager *m;
static um_device *cpu;

static void setup(void) {
  m = ut_manager();
  cpu = um_device_get(m, 0);
}

static void teardown(void) { cr_assert_eq(um_manager_destroy(m), UM_OK); }

TestSuite(access, .init = setup, .fini = teardown);

Test(access, nothing_pending_gives_no_wait) {
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
Test(access, wait_is_an_event_and_later_work_waits_for_the_end) {
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
  cr_assert_eq(um_alloc(m, cpu, 1000, UM_HOST, 0, &b), UM_OK);
  cr_assert_eq(um_access_begin(b, UM_MAP_WRITE, &wait), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_access_end(b, NULL), UM_ESTATE, "released: the release ended it");
  cr_assert_eq(um_device_synchronize(cpu), UM_OK);
  s = ut_stats(m, NULL);
  cr_assert_eq(s.active_buffers, 0);
  cr_assert_eq(s.bytes_pooled, ut_class(1000));
  cr_assert_eq(um_alloc(m, cpu, 1000, UM_HOST, 0, &again), UM_OK);
  cr_assert_eq(again, b, "the block went back to the pool");
  cr_assert_eq(um_release(again), UM_OK);
}

/* A wrap released inside a bracket waits for the bracket's end (at once:
 * the release ends it). */
Test(access, wrap_released_inside_a_bracket) {
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
  um_manager *m2 = ut_manager();
  um_buffer *b;
  void *wait = NULL;
  cr_assert_eq(um_alloc(m2, um_device_get(m2, 0), 64, UM_HOST, 0, &b), UM_OK);
  cr_assert_eq(um_access_begin(b, UM_MAP_READ, &wait), UM_OK);
  cr_assert_eq(um_manager_destroy(m2), UM_ELEAK, "the buffer itself leaked");
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
  cr_assert_eq(um_alloc(m, cpu, sizeof(in), UM_HOST, UM_ALLOC_ZERO, &b), UM_OK);
  cr_assert_eq(um_alloc(m, cpu, sizeof(in), UM_HOST, UM_ALLOC_ZERO, &other), UM_OK);
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
  memset(um_buffer_host_ptr(b), 0x11, sizeof(in)); /* the caller's "kernel" */
  cr_assert_eq(um_access_end(b, NULL), UM_OK);
  cr_assert_eq(um_event_wait(e), UM_OK);
  cr_assert_eq(um_event_release(e), UM_OK);
  cr_assert_eq(um_copy_to_host(b, 0, back, sizeof(back), NULL), UM_OK);
  cr_assert_arr_eq(back, in, sizeof(in), "the copy ran after the caller's work");
  cr_assert_eq(um_copy_batch(m, &op, 1, NULL), UM_OK);
  cr_assert_eq(um_release(other), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
}
