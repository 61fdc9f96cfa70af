/* max_concurrent_transfers on OpenCL: the engine has exactly that many
 * workers, never runs more worker-run transfers at once, and um_copy_batch
 * keeps that many in flight. The worker gate (opencl_util.h) holds each
 * started transfer until N are running at once, so "N in flight" is
 * observed exactly rather than by timing; ou_running_max() is the most
 * that ever ran at once (both through the test build's hook). */
#include "opencl_util.h"

#define CHUNK (16u * 1024u)
#define LEN (CHUNK * 8u + 5u)

static ou_env open_with(int transfers, int two_devices) {
  um_options o;
  ou_options(&o);
  o.max_concurrent_transfers = transfers;
  o.use_pinned_staging = 2; /* pageable copies run on workers */
  o.staging_chunk_bytes = CHUNK;
  o.pinned_pool_bytes = 64 * CHUNK;
  o.enable_peer = 0; /* device<->device copies are staged, on workers */
  if (two_devices)
    ou_want_two_devices();
  return ou_open(&o, two_devices ? 2 : 1);
}

Test(opencl_concurrency, workers_match_the_option) {
  ou_want_devices(1);
  for (int n = 1; n <= 5; n += 2) {
    ou_env e = open_with(n, 0);
    cr_assert_eq(e.m->engine.nthreads, n, "max_concurrent_transfers=%d", n);
    cr_assert_eq(ou_running_max(), 0);
    ou_close(&e);
  }
}

/* A batch of 4N pipelined host-to-device copies (independent buffers):
 * exactly N run at once, and every copy lands. */
static void batch_keeps_n_in_flight(int n) {
  ou_env e = open_with(n, 0);
  enum { K_MAX = 32 };
  int k = 4 * n;
  um_buffer *dst[K_MAX];
  unsigned char *src[K_MAX];
  um_copy_op ops[K_MAX];
  um_stats before, after;
  cr_assert_leq(k, K_MAX);
  memset(ops, 0, sizeof(ops));
  for (int i = 0; i < k; i++) {
    dst[i] = ub_alloc(e.m, e.dev[0], LEN, UM_DEVICE);
    src[i] = ub_malloc(LEN);
    ub_pattern(src[i], LEN, (unsigned)i);
    ops[i] = (um_copy_op){.dst = dst[i], .host_src = src[i], .bytes = LEN};
  }
  ou_gate_install(e.m, n);
  before = ut_stats(e.m, e.dev[0]);
  cr_assert_eq(um_copy_batch(e.m, ops, (size_t)k, NULL), UM_OK, "%s", um_last_error());
  after = ut_stats(e.m, e.dev[0]);
  cr_assert_eq(ou_running_max(), n, "at most and at least %d transfers ran at once", n);
  ou_assert_strategies(before, after, 0, 0, 0, (uint64_t)k, 0);
  for (int i = 0; i < k; i++) {
    unsigned char *got = ub_read_all(dst[i]);
    ub_assert_bytes(got, src[i], LEN, "copy %d of the batch", i);
    free(got);
    free(src[i]);
    cr_assert_eq(um_release(dst[i]), UM_OK);
  }
  ou_close(&e);
}

OU_TEST_1_AND_2(opencl_concurrency, batch_keeps_one_in_flight) { batch_keeps_n_in_flight(1); }
OU_TEST_1_AND_2(opencl_concurrency, batch_keeps_three_in_flight) { batch_keeps_n_in_flight(3); }
Test(opencl_concurrency, batch_keeps_four_in_flight) {
  ou_want_devices(1);
  batch_keeps_n_in_flight(4);
}

/* Staged device-to-device copies between two devices, issued one by one
 * with events: the same bound. */
Test(opencl_concurrency, staged_copies_are_bounded) {
  const int n = 2, k = 7;
  ou_env e = open_with(n, 1);
  um_buffer *a[7], *b[7];
  um_event *ev[7];
  unsigned char *bytes = ub_malloc(LEN);
  ub_pattern(bytes, LEN, 99);
  for (int i = 0; i < k; i++) {
    a[i] = ub_alloc(e.m, e.dev[0], LEN, UM_DEVICE);
    b[i] = ub_alloc(e.m, e.dev[1], LEN, UM_DEVICE);
    cr_assert_eq(um_copy_from_host(a[i], 0, bytes, CHUNK, NULL), UM_OK); /* direct: one chunk */
  }
  ou_gate_install(e.m, n);
  for (int i = 0; i < k; i++)
    cr_assert_eq(um_copy(b[i], 0, a[i], 0, CHUNK, &ev[i]), UM_OK);
  for (int i = 0; i < k; i++)
    ub_wait(ev[i], UM_OK);
  cr_assert_eq(ou_running_max(), n);
  for (int i = 0; i < k; i++) {
    unsigned char got[64];
    cr_assert_eq(um_copy_to_host(b[i], 0, got, sizeof(got), NULL), UM_OK);
    ub_assert_bytes(got, bytes, sizeof(got), "staged copy %d", i);
    cr_assert_eq(um_release(a[i]), UM_OK);
    cr_assert_eq(um_release(b[i]), UM_OK);
  }
  free(bytes);
  ou_close(&e);
}

/* Native copies do not occupy workers: a batch of 1000 small writes into
 * one device buffer is handed to the device queue at issue, and runs in
 * order (the later writes of the same range win). */
OU_TEST_1_AND_2(opencl_concurrency, native_batch_of_small_copies) {
  ou_env e = open_with(2, 0);
  enum { K = 1000, S = 4096 };
  um_buffer *dst = ub_alloc(e.m, e.dev[0], K / 2 * S, UM_DEVICE);
  unsigned char *src = ub_malloc((size_t)K * S), *want = ub_malloc(K / 2 * S), *got;
  um_copy_op *ops = calloc(K, sizeof(*ops));
  um_event *done = NULL;
  um_stats before, after;
  cr_assert_not_null(ops);
  ub_pattern(src, (size_t)K * S, 5);
  for (int i = 0; i < K; i++) {
    size_t slot = (size_t)(i % (K / 2));
    ops[i] = (um_copy_op){.dst = dst, .dst_off = slot * S, .host_src = src + (size_t)i * S, .bytes = S};
    memcpy(want + slot * S, src + (size_t)i * S, S); /* the second round overwrites the first */
  }
  before = ut_stats(e.m, e.dev[0]);
  cr_assert_eq(um_copy_batch(e.m, ops, K, &done), UM_OK);
  ub_wait(done, UM_OK);
  after = ut_stats(e.m, e.dev[0]);
  ou_assert_strategies(before, after, 0, 0, K, 0, 0);
  cr_assert_eq(after.bytes_h2d - before.bytes_h2d, (uint64_t)K * S);
  cr_assert_eq(ou_running_max(), 0, "no worker ran a native copy");
  got = ub_read_all(dst);
  ub_assert_bytes(got, want, K / 2 * S, "the batch's writes in order");
  free(got);
  free(want);
  free(src);
  free(ops);
  cr_assert_eq(um_release(dst), UM_OK);
  ou_close(&e);
}

/* Many threads issuing worker-run copies at once still see at most N
 * running. */
typedef struct thread_arg {
  um_manager *m;
  um_device *d;
  int ok;
} thread_arg;

static void *copier(void *p) {
  thread_arg *t = p;
  um_buffer *b = NULL;
  unsigned char *src = malloc(LEN), *back = malloc(LEN);
  t->ok = 0;
  if (src == NULL || back == NULL || um_alloc(t->m, t->d, LEN, UM_DEVICE, 0, &b) != UM_OK)
    goto out;
  for (int r = 0; r < 5; r++) {
    um_event *e1 = NULL, *e2 = NULL;
    ub_pattern(src, LEN, (unsigned)r + 40);
    if (um_copy_from_host(b, 0, src, LEN, &e1) != UM_OK || um_copy_to_host(b, 0, back, LEN, &e2) != UM_OK)
      goto out;
    if (um_event_wait(e1) != UM_OK || um_event_wait(e2) != UM_OK)
      goto out;
    um_event_release(e1);
    um_event_release(e2);
    if (memcmp(src, back, LEN) != 0)
      goto out;
  }
  t->ok = 1;
out:
  if (b)
    um_release(b);
  free(src);
  free(back);
  return NULL;
}

OU_TEST_1_AND_2(opencl_concurrency, threads_share_the_bound) {
  const int n = 2;
  ou_env e = open_with(n, 0);
  pthread_t th[6];
  thread_arg ta[6];
  for (int i = 0; i < 6; i++) {
    ta[i] = (thread_arg){e.m, e.dev[0], 0};
    cr_assert_eq(pthread_create(&th[i], NULL, copier, &ta[i]), 0);
  }
  for (int i = 0; i < 6; i++) {
    pthread_join(th[i], NULL);
    cr_assert(ta[i].ok, "thread %d", i);
  }
  cr_assert_leq(ou_running_max(), n);
  cr_assert_geq(ou_running_max(), 1);
  ou_close(&e);
}
