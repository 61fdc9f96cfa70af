/* um_event_cancel on OpenCL: an operation queued behind a long one on the
 * same buffer can be canceled (UM_OK; waiting answers UM_ECANCELED; its
 * bytes never land), and what was issued after it still runs, in order.
 * An operation that started or finished answers UM_EBUSY.
 *
 * The long operation is a pipelined copy (staging forced, small chunks): a
 * worker runs it, and the worker gate holds it RUNNING, so the operations
 * issued behind it are reliably QUEUED when the test cancels them. */
#include "opencl_util.h"

#define N (512u * 1024u + 3u)

static ou_env open_staged(void) {
  um_options o;
  ou_options(&o);
  o.use_pinned_staging = 2;
  o.staging_chunk_bytes = 16 * 1024;
  return ou_open(&o, 1);
}

OU_TEST_1_AND_2(opencl_cancel, queued_behind_a_running_copy) {
  ou_env e = open_staged();
  um_buffer *b = ub_alloc(e.m, e.dev[0], N, UM_DEVICE);
  unsigned char *first = ub_malloc(N), *second = ub_malloc(N), *want = ub_malloc(N), *got;
  um_event *long_op = NULL, *victim = NULL, *fill_victim = NULL, *after = NULL;
  um_stats before, done;

  ub_pattern(first, N, 1);
  ub_pattern(second, N, 2);
  cr_assert_eq(um_fill(b, 0, 0, N, NULL), UM_OK);
  ou_gate_install(e.m, 0);
  cr_assert_eq(um_copy_from_host(b, 0, first, N, &long_op), UM_OK);
  ou_gate_wait_entered(1);
  cr_assert_eq(ou_event_state(long_op), UM__EV_RUNNING);

  cr_assert_eq(um_copy_from_host(b, 100, second, 1000, &victim), UM_OK);
  cr_assert_eq(um_fill(b, 5000, 0xCC, 777, &fill_victim), UM_OK);
  cr_assert_eq(um_fill(b, 20000, 0xDD, 10, &after), UM_OK);
  cr_assert_eq(ou_event_state(victim), UM__EV_QUEUED);
  cr_assert_eq(ou_event_state(fill_victim), UM__EV_QUEUED);
  cr_assert_eq(um_event_query(victim), UM_EAGAIN);

  cr_assert_eq(um_event_cancel(victim), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_event_cancel(fill_victim), UM_OK);
  cr_assert_eq(um_event_cancel(victim), UM_EBUSY, "a second cancel");
  cr_assert_eq(um_event_cancel(long_op), UM_EBUSY, "the running copy cannot be canceled");

  before = ut_stats(e.m, e.dev[0]);
  ou_gate_open();
  ub_wait(long_op, UM_OK);
  cr_assert_eq(um_event_wait(victim), UM_ECANCELED);
  cr_assert_eq(um_event_query(victim), UM_ECANCELED);
  cr_assert_eq(um_event_wait(fill_victim), UM_ECANCELED);
  cr_assert_eq(um_event_wait(after), UM_OK);
  cr_assert_eq(um_event_cancel(after), UM_EBUSY, "a finished operation");
  cr_assert_eq(um_event_wait(after), UM_OK, "and it stays done");
  um_event_release(after);
  done = ut_stats(e.m, e.dev[0]);
  /* canceled operations count nothing: the long copy and one fill ran */
  cr_assert_eq(done.fills - before.fills, 1);
  cr_assert_eq(done.bytes_h2d - before.bytes_h2d, N);
  cr_assert_eq(done.xfer_pipelined - before.xfer_pipelined, 1);
  cr_assert_eq(done.xfer_direct - before.xfer_direct, 0);

  memcpy(want, first, N);
  memset(want + 20000, 0xDD, 10);
  got = ub_read_all(b);
  ub_assert_bytes(got, want, N, "the canceled operations left no bytes");
  um_event_release(victim);
  um_event_release(fill_victim);
  free(got);
  free(first);
  free(second);
  free(want);
  cr_assert_eq(um_release(b), UM_OK);
  ou_close(&e);
}

/* A canceled copy between two buffers frees both of them for what follows,
 * and releasing a buffer whose queued operation was canceled is safe. */
OU_TEST_1_AND_2(opencl_cancel, canceled_copy_and_release) {
  ou_env e = open_staged();
  um_buffer *a = ub_alloc(e.m, e.dev[0], N, UM_DEVICE), *b = ub_alloc(e.m, e.dev[0], N, UM_DEVICE);
  unsigned char *src = ub_malloc(N), *got;
  um_event *long_op = NULL, *copy = NULL, *read_b = NULL;
  unsigned char *b_bytes = ub_malloc(N);
  ub_pattern(src, N, 3);
  cr_assert_eq(um_fill(b, 0, 0x11, N, NULL), UM_OK);
  ou_gate_install(e.m, 0);
  cr_assert_eq(um_copy_from_host(a, 0, src, N, &long_op), UM_OK);
  ou_gate_wait_entered(1);
  cr_assert_eq(um_copy(b, 0, a, 0, N, &copy), UM_OK);
  cr_assert_eq(um_copy_to_host(b, 0, b_bytes, N, &read_b), UM_OK);
  cr_assert_eq(ou_event_state(copy), UM__EV_QUEUED);
  cr_assert_eq(um_event_cancel(copy), UM_OK);
  cr_assert_eq(um_release(b), UM_OK, "release with queued operations is deferred");
  ou_gate_open();
  ub_wait(long_op, UM_OK);
  cr_assert_eq(um_event_wait(copy), UM_ECANCELED);
  um_event_release(copy);
  ub_wait(read_b, UM_OK);
  for (size_t i = 0; i < N; i++)
    cr_assert_eq(b_bytes[i], 0x11, "byte %zu: the canceled copy reached b", i);
  got = ub_read_all(a);
  ub_assert_bytes(got, src, N, "a holds the long copy");
  free(got);
  free(src);
  free(b_bytes);
  cr_assert_eq(um_release(a), UM_OK);
  ou_close(&e);
}

/* Native operations start at issue: they are never cancelable. */
OU_TEST_1_AND_2(opencl_cancel, native_operations_are_busy_at_once) {
  ou_env e = ou_open(NULL, 1);
  um_buffer *b = ub_alloc(e.m, e.dev[0], N, UM_DEVICE);
  unsigned char *src = ub_malloc(N);
  um_event *w = NULL, *f = NULL;
  ub_pattern(src, N, 4);
  cr_assert_eq(um_copy_from_host(b, 0, src, N, &w), UM_OK);
  cr_assert_eq(um_fill(b, 0, 1, 10, &f), UM_OK);
  cr_assert_eq(um_event_cancel(w), UM_EBUSY);
  cr_assert_eq(um_event_cancel(f), UM_EBUSY);
  ub_wait(w, UM_OK);
  ub_wait(f, UM_OK);
  free(src);
  cr_assert_eq(um_release(b), UM_OK);
  ou_close(&e);
}

/* Cancel races with completion from another thread: every operation ends
 * either canceled (its bytes absent) or done (its bytes present). */
OU_TEST_1_AND_2(opencl_cancel, cancel_races_with_completion) {
  ou_env e = open_staged();
  um_buffer *b = ub_alloc(e.m, e.dev[0], N, UM_DEVICE);
  unsigned char *src = ub_malloc(N), *got;
  enum { K = 16 };
  um_event *ev[K];
  unsigned char value[K];
  int last_done = -1;
  ub_pattern(src, N, 5);
  cr_assert_eq(um_copy_from_host(b, 0, src, N, &ev[0]), UM_OK); /* pipelined: worker */
  value[0] = 0;
  for (int i = 1; i < K; i++) {
    value[i] = (unsigned char)(0x40 + i);
    cr_assert_eq(um_fill(b, 64, value[i], 64, &ev[i]), UM_OK);
  }
  for (int i = K - 1; i >= 1; i -= 2) {
    int st = um_event_cancel(ev[i]);
    cr_assert(st == UM_OK || st == UM_EBUSY, "cancel: %s", um_err_name(st));
  }
  for (int i = 0; i < K; i++) {
    int st = um_event_wait(ev[i]);
    cr_assert(st == UM_OK || st == UM_ECANCELED, "operation %d: %s", i, um_err_name(st));
    if (st == UM_OK && i > 0)
      last_done = i;
    um_event_release(ev[i]);
  }
  got = ub_read_all(b);
  if (last_done > 0)
    for (size_t i = 64; i < 128; i++)
      cr_assert_eq(got[i], value[last_done], "the last fill that ran wins");
  else
    ub_assert_bytes(got + 64, src + 64, 64, "no fill ran");
  free(got);
  free(src);
  cr_assert_eq(um_release(b), UM_OK);
  ou_close(&e);
}
