/* Ordering when a single-queue device refuses an operation.
 *
 * On a single-queue device (OpenCL's: one in-order queue per device) an
 * operation that follows earlier ones on that queue records nothing to
 * wait for: the queue orders them. When the queue refuses it, it fails,
 * but it is its buffer's last operation, and the next one takes its
 * completion for that of everything before it: failing at once would let
 * an operation that the queue does not order (here a peer copy, run by the
 * other device) overtake the transfers still queued. So a refused
 * operation fails behind a queue mark (or, when the mark is refused too,
 * after the backend's synchronize), a refused quiet member of a batch in
 * its turn in the batch's run, and the members of a run whose mark is
 * refused once the device is done with them.
 *
 * The "fault-queue" devices (tests/fault_backend.c) are single-queue; a
 * device's queue is held (fault_hold) so that the earlier transfers are
 * still queued, deterministically, while the later operations are issued.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "fault_backend.h"
#include "test_util.h" /* Criterion, or its stand-in under TSan */

#define N 32

static unsigned char pat_a[N], pat_b[N], pat_c[N];

/* A manager over two fault-queue devices, q[0] and q[1], with q[1] reading
 * q[0]'s memory by peer copies. */
static um_manager *setup(um_device **q) {
  um_options o;
  um_manager *m = NULL;
  fault_test_options(&o);
  fault_configure(2, 256u << 20);
  fault_reset();
  cr_assert_eq(fault_manager_create_queue(&o, &m), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_device_count(m), 3);
  q[0] = um_device_get(m, 1);
  q[1] = um_device_get(m, 2);
  cr_assert(fault_is_device(q[0]) && fault_is_device(q[1]));
  cr_assert_eq(um_peer_enable(q[1], q[0]), UM_OK, "%s", um_last_error());
  for (int i = 0; i < N; i++) {
    pat_a[i] = (unsigned char)(0x40 + i);
    pat_b[i] = (unsigned char)(0x80 + i);
    pat_c[i] = (unsigned char)(0xc0 + i);
  }
  return m;
}

static void teardown(um_manager *m) {
  FAULT_ASSERT_DESTROYED_CLEAN(m);
}

/* The kth transfer the fault backends see from now on (counted from 1) is
 * refused at submission, and every later one too when sticky. */
static void refuse_submission(uint64_t k, bool sticky) {
  fault_counts c;
  fault_counts_get(&c);
  fault_fail_xfer(c.xfers + k, sticky, UM_EBACKEND, true);
}

/* Transfers submitted to the fault backends so far: an operation started
 * on the issuing thread is counted before its call returns. */
static uint64_t submitted(void) {
  fault_counts c;
  fault_counts_get(&c);
  return c.xfers;
}

static uint64_t synchronizes(void) {
  fault_counts c;
  fault_counts_get(&c);
  return c.synchronizes;
}

static um_buffer *buffer_with(um_manager *m, um_device *d, const unsigned char *bytes) {
  um_buffer *b = NULL;
  cr_assert_eq(um_alloc(m, d, N, UM_DEVICE, 0, &b), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_copy_from_host(b, 0, bytes, N, NULL), UM_OK, "%s", um_last_error());
  return b;
}

static void assert_holds(um_buffer *b, const unsigned char *want, const char *what) {
  unsigned char now[N];
  cr_assert_eq(um_copy_to_host(b, 0, now, N, NULL), UM_OK, "%s", um_last_error());
  cr_assert_arr_eq(now, want, N, "%s", what);
}

/* A call made on another thread, so that the test sees whether it returns
 * while the device's queue is held. */
typedef struct call {
  int (*fn)(struct call *);
  um_manager *m;
  um_buffer *b;
  unsigned char host[N];
  um_event *ev;
  atomic_int st;
  atomic_bool returned;
  pthread_t t;
} call;

static void *call_main(void *arg) {
  call *c = arg;
  atomic_store(&c->st, c->fn(c));
  atomic_store(&c->returned, true);
  return NULL;
}

static void call_start(call *c) {
  atomic_init(&c->returned, false);
  cr_assert_eq(pthread_create(&c->t, NULL, call_main, c), 0);
}

/* Until the call returned or a backend's synchronize was entered since
 * sync0 (a poll with an upper bound, not a timing assumption: either event
 * decides). Returns whether the call returned. */
static bool returned_or_synchronizing(call *c, uint64_t sync0) {
  struct timespec tick = {0, 1000000L};
  for (int i = 0; i < 20000; i++) {
    if (atomic_load(&c->returned))
      return true;
    if (synchronizes() > sync0)
      return false;
    nanosleep(&tick, NULL);
  }
  cr_assert_fail("neither returned nor synchronizing after 20 s");
  return false;
}

/* Gap 1: a start refused with nothing recorded to wait for. */
Test(fault_queue, refused_write_fails_behind_the_write_queued_before_it) {
  um_device *q[2];
  um_manager *m = setup(q);
  um_buffer *a = buffer_with(m, q[0], pat_c), *c = buffer_with(m, q[1], pat_c);
  um_event *write, *refused, *peer;
  uint64_t n0;

  cr_assert_eq(fault_hold(q[0], true), UM_OK);
  cr_assert_eq(um_copy_from_host(a, 0, pat_a, N, &write), UM_OK);
  refuse_submission(1, false);
  /* Queued behind the write by the queue alone: nothing recorded. */
  cr_assert_eq(um_copy_from_host(a, 0, pat_b, N, &refused), UM_OK);
  cr_assert_eq(um_event_query(refused), UM_EAGAIN,
               "the refused write failed while the write before it was still queued");
  /* Run by q[1], which does not order q[0]'s queue: it follows the refused
   * write, and so the write before it, by waiting for them. */
  n0 = submitted();
  cr_assert_eq(um_copy(c, 0, a, 0, N, &peer), UM_OK);
  cr_assert_eq(submitted(), n0, "the peer copy started while a write to its source was queued");
  cr_assert_eq(um_event_query(peer), UM_EAGAIN);
  cr_assert_eq(fault_hold(q[0], false), UM_OK);

  cr_assert_eq(um_event_wait(peer), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_event_wait(refused), UM_EBACKEND);
  cr_assert(strstr(um_last_error(), "fails by plan") != NULL, "%s", um_last_error());
  cr_assert_eq(um_event_wait(write), UM_OK);
  assert_holds(c, pat_a, "the peer copy read the source before the write queued ahead of it");
  assert_holds(a, pat_a, "the refused write moved nothing");
  cr_assert_eq(um_event_release(write), UM_OK);
  cr_assert_eq(um_event_release(refused), UM_OK);
  cr_assert_eq(um_event_release(peer), UM_OK);
  cr_assert_eq(um_release(a), UM_OK);
  cr_assert_eq(um_release(c), UM_OK);
  teardown(m);
}

static int write_b_async(call *c) {
  int st = um_copy_from_host(c->b, 0, pat_b, N, &c->ev);
  return st;
}

/* Gap 1 when the queue refuses the mark too: the refused write fails once
 * the backend's synchronize says the queue is empty. */
Test(fault_queue, refused_write_whose_mark_is_refused_fails_after_synchronize) {
  um_device *q[2];
  um_manager *m = setup(q);
  um_buffer *a = buffer_with(m, q[0], pat_c);
  um_event *write;
  call w = {.fn = write_b_async, .b = a};
  uint64_t sync0;

  cr_assert_eq(fault_hold(q[0], true), UM_OK);
  cr_assert_eq(um_copy_from_host(a, 0, pat_a, N, &write), UM_OK);
  refuse_submission(1, true); /* the write, then its mark */
  sync0 = synchronizes();
  call_start(&w);
  cr_assert_not(returned_or_synchronizing(&w, sync0),
                "the refused write failed while the write before it was still queued");
  fault_disarm();
  cr_assert_eq(fault_hold(q[0], false), UM_OK);
  cr_assert_eq(pthread_join(w.t, NULL), 0);
  cr_assert_eq(atomic_load(&w.st), UM_OK);
  cr_assert_eq(um_event_query(write), UM_OK, "the refused write failed before the write queued ahead of it");
  cr_assert_eq(um_event_wait(w.ev), UM_EBACKEND);
  assert_holds(a, pat_a, "the refused write moved nothing");
  cr_assert_eq(um_event_release(write), UM_OK);
  cr_assert_eq(um_event_release(w.ev), UM_OK);
  cr_assert_eq(um_release(a), UM_OK);
  teardown(m);
}

/* Gap 2: a quiet member of a batch refused by the queue. */
Test(fault_queue, refused_batch_member_fails_behind_the_members_before_it) {
  um_device *q[2];
  um_manager *m = setup(q);
  um_buffer *a = buffer_with(m, q[0], pat_c), *c = buffer_with(m, q[1], pat_c);
  um_copy_op ops[2];
  um_event *batch, *peer;
  uint64_t n0;

  memset(ops, 0, sizeof(ops));
  ops[0] = (um_copy_op){.dst = a, .host_src = pat_a, .bytes = N};
  ops[1] = (um_copy_op){.dst = a, .host_src = pat_b, .bytes = N};
  cr_assert_eq(fault_hold(q[0], true), UM_OK);
  refuse_submission(2, false); /* the second member */
  cr_assert_eq(um_copy_batch(m, ops, 2, &batch), UM_OK, "%s", um_last_error());
  n0 = submitted();
  cr_assert_eq(um_copy(c, 0, a, 0, N, &peer), UM_OK);
  cr_assert_eq(submitted(), n0, "the peer copy started while the batch's first write to its source was queued");
  cr_assert_eq(um_event_query(peer), UM_EAGAIN);
  cr_assert_eq(um_event_query(batch), UM_EAGAIN);
  cr_assert_eq(fault_hold(q[0], false), UM_OK);

  cr_assert_eq(um_event_wait(peer), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_event_wait(batch), UM_EBACKEND);
  assert_holds(c, pat_a, "the peer copy read the source before the batch's first write");
  assert_holds(a, pat_a, "the refused member moved nothing");
  cr_assert_eq(um_event_release(batch), UM_OK);
  cr_assert_eq(um_event_release(peer), UM_OK);
  cr_assert_eq(um_release(a), UM_OK);
  cr_assert_eq(um_release(c), UM_OK);
  teardown(m);
}

static int read_a_in_blocking_batch(call *c) {
  um_copy_op op = {.src = c->b, .host_dst = c->host, .bytes = N};
  return um_copy_batch(c->m, &op, 1, NULL);
}

/* Gap 3: the mark at the end of a blocking batch refused. The batch fails,
 * but returns only once the device is done writing the caller's memory. */
Test(fault_queue, blocking_batch_whose_mark_is_refused_returns_after_its_transfers) {
  um_device *q[2];
  um_manager *m = setup(q);
  um_buffer *a = buffer_with(m, q[0], pat_a);
  call r = {.fn = read_a_in_blocking_batch, .m = m, .b = a};
  unsigned char zero[N];
  uint64_t sync0;

  memset(r.host, 0, N);
  memset(zero, 0, N);
  cr_assert_eq(fault_hold(q[0], true), UM_OK);
  refuse_submission(2, false); /* the member goes, its run's mark is refused */
  sync0 = synchronizes();
  call_start(&r);
  cr_assert_not(returned_or_synchronizing(&r, sync0),
                "the blocking batch returned while its read was still queued");
  cr_assert_arr_eq(r.host, zero, N);
  cr_assert_eq(fault_hold(q[0], false), UM_OK);
  cr_assert_eq(pthread_join(r.t, NULL), 0);
  cr_assert_eq(atomic_load(&r.st), UM_EBACKEND);
  cr_assert_arr_eq(r.host, pat_a, N, "the read had not written the caller's memory when the batch returned");
  cr_assert_eq(um_release(a), UM_OK);
  teardown(m);
}

/* A quiet transfer's failure belongs to the run it was queued in. Here the
 * run's member fails on a device lost while it was queued, and the run's
 * mark fails by itself (a planned failure): the run fails. Once the device
 * is back, a later batch must not be handed the old failure by its own
 * mark (the fuzzer found a batch answering UM_ENODEV inputs after the
 * device that failed it had been restored). */
Test(fault_queue, a_failed_mark_takes_its_runs_quiet_failure_with_it) {
  um_device *q[2];
  um_manager *m = setup(q);
  um_buffer *a = buffer_with(m, q[0], pat_a);
  um_copy_op op = {.dst = a, .host_src = pat_b, .bytes = N};
  um_event *batch;
  fault_counts c;

  cr_assert_eq(fault_hold(q[0], true), UM_OK);
  fault_counts_get(&c);
  fault_fail_xfer(c.xfers + 2, false, UM_EBACKEND, false); /* the member is 1, its mark 2 */
  cr_assert_eq(um_copy_batch(m, &op, 1, &batch), UM_OK, "%s", um_last_error());
  cr_assert_eq(fault_lose(q[0]), UM_OK); /* the member fails when it runs */
  cr_assert_eq(fault_hold(q[0], false), UM_OK);
  cr_assert_neq(um_event_wait(batch), UM_OK);
  cr_assert_eq(um_event_release(batch), UM_OK);

  cr_assert_eq(fault_restore(q[0]), UM_OK);
  fault_disarm();
  op.host_src = pat_c;
  cr_assert_eq(um_copy_batch(m, &op, 1, NULL), UM_OK, "%s", um_last_error());
  assert_holds(a, pat_c, "the later batch wrote");
  cr_assert_eq(um_device_synchronize(q[0]), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_release(a), UM_OK);
  teardown(m);
}
