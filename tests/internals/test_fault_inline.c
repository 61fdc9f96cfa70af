/* The "fault-inline" test backend: a single in-order queue per device
 * whose idle queue runs a transfer, and its completion, on the submitting
 * thread inside the core's call (as PoCL's "basic" device does), and whose
 * busy or held queue runs it later on the queue thread. The fuzzer drives
 * the core through it (tests/reliability/fuzz/fuzz_api.c, c1 bits 3-4);
 * these tests pin down what the flavour itself promises, and that the core
 * finishes an operation whose completion arrives inside its own start. */
#include <stdio.h>
#include <string.h>

#include "fault_backend.h"
#include "test_util.h" /* Criterion, or its stand-in under TSan */

#define N 64

static um_manager *setup(um_device **d) {
  um_options o;
  um_manager *m = NULL;
  fault_test_options(&o);
  fault_configure(1, 64u << 20);
  fault_reset();
  cr_assert_eq(fault_manager_create_with(&o, &fault_backend_inline, &m), UM_OK, "%s", um_last_error());
  /* the cpu, the inline device, the mapped device */
  cr_assert_eq(um_device_count(m), 3);
  *d = um_device_get(m, 1);
  cr_assert(fault_is_device(*d));
  return m;
}

static void teardown(um_manager *m) {
  FAULT_ASSERT_DESTROYED_CLEAN(m);
}

static void fill(unsigned char *p, unsigned char base) {
  for (int i = 0; i < N; i++)
    p[i] = (unsigned char)(base + i);
}

Test(fault_inline, an_idle_queue_finishes_the_copy_before_the_call_returns) {
  um_device *d;
  um_manager *m = setup(&d);
  um_buffer *b = NULL;
  um_event *ev = NULL;
  unsigned char in[N], out[N];
  fill(in, 0x30);
  cr_assert_eq(um_alloc(m, d, N, UM_DEVICE, 0, &b), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_copy_from_host(b, 0, in, N, &ev), UM_OK, "%s", um_last_error());
  /* ran and completed inside the call: no thread was needed */
  cr_assert_eq(um_event_query(ev), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_event_release(ev), UM_OK);
  memset(out, 0, sizeof(out));
  cr_assert_eq(um_copy_to_host(b, 0, out, N, &ev), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_event_query(ev), UM_OK, "%s", um_last_error());
  cr_assert_arr_eq(out, in, N);
  cr_assert_eq(um_event_release(ev), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  teardown(m);
}

Test(fault_inline, a_held_queue_runs_later_in_order_then_inline_again) {
  um_device *d;
  um_manager *m = setup(&d);
  um_buffer *b = NULL;
  um_event *e1 = NULL, *e2 = NULL, *e3 = NULL;
  unsigned char a[N], c[N], z[N], out[N];
  fill(a, 0x10);
  fill(c, 0x90);
  fill(z, 0xd0);
  cr_assert_eq(um_alloc(m, d, N, UM_DEVICE, 0, &b), UM_OK, "%s", um_last_error());
  cr_assert_eq(fault_hold(d, true), UM_OK);
  cr_assert_eq(um_copy_from_host(b, 0, a, N, &e1), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_copy_from_host(b, 0, c, N, &e2), UM_OK, "%s", um_last_error());
  /* both queued behind the hold: nothing ran on this thread */
  cr_assert_eq(um_event_query(e1), UM_EAGAIN);
  cr_assert_eq(um_event_query(e2), UM_EAGAIN);
  cr_assert_eq(fault_hold(d, false), UM_OK);
  cr_assert_eq(um_event_wait(e2), UM_OK, "%s", um_last_error());
  /* in order: the queue ran the first before the second */
  cr_assert_eq(um_event_query(e1), UM_OK);
  memset(out, 0, sizeof(out));
  cr_assert_eq(um_copy_to_host(b, 0, out, N, NULL), UM_OK, "%s", um_last_error());
  cr_assert_arr_eq(out, c, N, "the later write is the one that stays");
  /* idle again: the next copy runs inline. Idle once the queue thread has
   * let go of its last job: it reports a job's completion (which wakes the
   * blocking copy above) before it clears its busy flag, so without this
   * synchronize the copy could find the queue still busy and be queued
   * (seen in 3 of 200 runs on a loaded machine). */
  cr_assert_eq(um_device_synchronize(d), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_copy_from_host(b, 0, z, N, &e3), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_event_query(e3), UM_OK);
  cr_assert_eq(um_copy_to_host(b, 0, out, N, NULL), UM_OK, "%s", um_last_error());
  cr_assert_arr_eq(out, z, N);
  um_event_release(e1);
  um_event_release(e2);
  um_event_release(e3);
  cr_assert_eq(um_release(b), UM_OK);
  teardown(m);
}

Test(fault_inline, a_batch_and_its_queue_mark_complete_inline) {
  um_device *d;
  um_manager *m = setup(&d);
  um_buffer *b[4];
  um_copy_op ops[8];
  um_event *ev = NULL;
  unsigned char in[8][N], out[N];
  for (int i = 0; i < 4; i++)
    cr_assert_eq(um_alloc(m, d, 2 * N, UM_DEVICE, 0, &b[i]), UM_OK, "%s", um_last_error());
  memset(ops, 0, sizeof(ops));
  for (int k = 0; k < 8; k++) {
    fill(in[k], (unsigned char)(16 * k));
    ops[k].dst = b[k % 4];
    ops[k].dst_off = (size_t)(k / 4) * N;
    ops[k].host_src = in[k];
    ops[k].bytes = N;
  }
  cr_assert_eq(um_copy_batch(m, ops, 8, &ev), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_event_query(ev), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_event_release(ev), UM_OK);
  for (int k = 0; k < 8; k++) {
    cr_assert_eq(um_copy_to_host(b[k % 4], (size_t)(k / 4) * N, out, N, NULL), UM_OK, "%s", um_last_error());
    cr_assert_arr_eq(out, in[k], N, "copy %d of the batch", k);
  }
  for (int i = 0; i < 4; i++)
    cr_assert_eq(um_release(b[i]), UM_OK);
  teardown(m);
}

Test(fault_inline, a_failure_reported_inside_the_start_fails_the_operation) {
  um_device *d;
  um_manager *m = setup(&d);
  um_buffer *b = NULL;
  um_event *ev = NULL;
  unsigned char in[N];
  fault_counts c;
  fill(in, 0x50);
  cr_assert_eq(um_alloc(m, d, N, UM_DEVICE, 0, &b), UM_OK, "%s", um_last_error());
  fault_counts_get(&c);
  fault_fail_xfer(c.xfers + 1, false, UM_EBACKEND, false); /* fails when it runs */
  cr_assert_eq(um_copy_from_host(b, 0, in, N, &ev), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_event_query(ev), UM_EBACKEND);
  cr_assert_eq(um_event_wait(ev), UM_EBACKEND);
  cr_assert_eq(um_event_release(ev), UM_OK);
  /* the next one works */
  cr_assert_eq(um_copy_from_host(b, 0, in, N, NULL), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_release(b), UM_OK);
  teardown(m);
}

Test(fault_inline, only_an_asynchronous_flavour_may_stand_first) {
  um_options o;
  um_manager *m = NULL;
  um_options_init(&o);
  snprintf(o.backends, sizeof(o.backends), "cpu");
  cr_assert_eq(fault_manager_create_with(&o, &fault_backend_mapped, &m), UM_EINVAL);
  cr_assert_null(m);
  cr_assert_eq(fault_manager_create_with(&o, &fault_backend_queue, &m), UM_OK, "%s", um_last_error());
  teardown(m);
}
