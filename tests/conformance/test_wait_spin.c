/* Waits with and without um_options.wait_spin_ns on every profile's device
 * (profile.h): a waiter that polls before it sleeps still returns the
 * exact bytes of every kind of blocking call, of event waits interleaved
 * with blocking reads, and of batches. Whether and how often a wait polls
 * is seen only through the test build's hook: internals/test_wait.c (the
 * core, on the cpu and the fault backend) and backends/test_opencl_wait.c
 * (OpenCL's command polls and settle time) count them. */
#include "blocking_calls.h"
#include "profile.h"

/* The longest budget um_options accepts (unimem.h: at most 1 s). */
#define SPIN_MAX_NS 1000000000u

static ut_env spin_open(uint32_t spin_ns) {
  um_options o;
  ut_profile_options(&o);
  o.wait_spin_ns = spin_ns;
  return ut_profile_open(&o);
}

/* 0 is the default: every wait sleeps at once. */
Test(wait, blocking_calls_without_spin) {
  ut_env e = spin_open(0);
  bc_blocking_calls(e.m, e.dev);
  ut_profile_close(&e);
}

/* 50 us: shorter than most of the calls, so waits poll and then sleep. */
Test(wait, blocking_calls_with_spin) {
  ut_env e = spin_open(50000);
  bc_blocking_calls(e.m, e.dev);
  ut_profile_close(&e);
}

/* The longest budget: every wait here ends inside its spin. */
Test(wait, blocking_calls_with_the_longest_spin) {
  ut_env e = spin_open(SPIN_MAX_NS);
  bc_blocking_calls(e.m, e.dev);
  ut_profile_close(&e);
}

/* Many asynchronous writes, each waited for with the spin on, interleaved
 * with reads of the same buffer: an asynchronous read waits for the write
 * before it (so the write is done once the read is), a blocking one too. */
Test(wait, event_waits_with_spin) {
  enum { ROUNDS = 200 };
  ut_env e = spin_open(200000);
  unsigned char src[4096 + 3], back[sizeof(src)];
  um_buffer *b = ub_alloc(e.m, e.dev, sizeof(src), UM_DEVICE);
  for (int i = 0; i < ROUNDS; i++) {
    um_event *w, *r;
    ub_pattern(src, sizeof(src), (unsigned)i);
    cr_assert_eq(um_copy_from_host(b, 0, src, sizeof(src), &w), UM_OK);
    if (i % 2 == 0) {
      cr_assert_eq(um_copy_to_host(b, 0, back, sizeof(back), &r), UM_OK);
      ub_wait(r, UM_OK);
      cr_assert_eq(um_event_query(w), UM_OK, "the read finished before the write it follows");
      ub_wait(w, UM_OK);
    } else {
      ub_wait(w, UM_OK);
      cr_assert_eq(um_copy_to_host(b, 0, back, sizeof(back), NULL), UM_OK);
    }
    ub_assert_bytes(back, src, sizeof(src), "round %d", i);
  }
  cr_assert_eq(um_release(b), UM_OK);
  ut_profile_close(&e);
}

/* Two blocking batches of 64 copies, in and back out, with the spin on:
 * every member's bytes. */
Test(wait, batches_with_spin) {
  enum { N = 64, SEG = 8192 };
  ut_env e = spin_open(1000000);
  unsigned char *src = ub_malloc(N * SEG), *back = calloc(N, SEG);
  um_buffer *b[N];
  um_copy_op ops[N];
  cr_assert_not_null(back);
  ub_pattern(src, N * SEG, 3);
  for (int i = 0; i < N; i++) {
    b[i] = ub_alloc(e.m, e.dev_of[i % e.ndev], SEG, UM_DEVICE);
    ops[i] = (um_copy_op){.dst = b[i], .host_src = src + i * SEG, .bytes = SEG};
  }
  cr_assert_eq(um_copy_batch(e.m, ops, N, NULL), UM_OK, "%s", um_last_error());
  for (int i = 0; i < N; i++)
    ops[i] = (um_copy_op){.src = b[i], .host_dst = back + i * SEG, .bytes = SEG};
  cr_assert_eq(um_copy_batch(e.m, ops, N, NULL), UM_OK, "%s", um_last_error());
  ub_assert_bytes(back, src, N * SEG, "batches with the spin on");
  for (int i = 0; i < N; i++)
    cr_assert_eq(um_release(b[i]), UM_OK);
  free(src);
  free(back);
  ut_profile_close(&e);
}
