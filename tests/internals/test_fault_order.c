/* Ordering on a buffer when the backend refuses an operation.
 *
 * An operation refused by the device queue at submission fails, but it
 * must not finish before the operations it was queued behind: it is its
 * buffer's last operation, and the operations issued after it take its
 * completion for that of everything before it. The "fault" device's queue
 * is held (fault_hold) so that the earlier operations are still queued,
 * deterministically, while the later ones are issued.
 *
 * Found by the fuzzer (tests/reliability/fuzz/corpus/
 * crash_write_overtakes_read_after_refused_submit): a d2h queued, an h2d
 * queued behind it and refused, then a blocking h2d that ran at once on
 * the caller's thread and overwrote the bytes the queued d2h was to read.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "fault_backend.h"
#include "test_util.h" /* Criterion, or its stand-in under TSan */

#define N 32

static unsigned char pat_a[N], pat_b[N], pat_c[N];

static um_manager *setup(um_device **fd) {
  um_options o;
  um_manager *m = NULL;
  fault_test_options(&o);
  fault_configure(1, 256u << 20);
  fault_reset();
  cr_assert_eq(fault_manager_create(&o, &m), UM_OK, "%s", um_last_error());
  *fd = um_device_get(m, 1);
  cr_assert(fault_is_device(*fd));
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

/* The next transfer the fault backend sees is refused at submission. */
static void refuse_next_submission(void) {
  fault_counts c;
  fault_counts_get(&c);
  fault_fail_xfer(c.xfers + 1, false, UM_EBACKEND, true);
}

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

typedef struct writer {
  um_buffer *b;
  const unsigned char *src;
  atomic_int st;
  atomic_bool done;
} writer;

static void *blocking_write(void *arg) {
  writer *w = arg;
  atomic_store(&w->st, um_copy_from_host(w->b, 0, w->src, N, NULL));
  atomic_store(&w->done, true);
  return NULL;
}

/* The fuzzer's case: the refused write may fail, but the blocking write
 * after it must wait for the read queued before it. */
Test(fault_order, refused_write_does_not_let_a_blocking_write_overtake_a_queued_read) {
  um_device *fd;
  um_manager *m = setup(&fd);
  unsigned char back[N], now[N];
  um_buffer *a;
  um_event *read, *refused;
  writer w = {.src = pat_c};
  pthread_t t;

  cr_assert_eq(um_alloc(m, fd, N, UM_DEVICE, 0, &a), UM_OK);
  cr_assert_eq(um_copy_from_host(a, 0, pat_a, N, NULL), UM_OK);
  memset(back, 0, sizeof(back));

  cr_assert_eq(fault_hold(fd, true), UM_OK);
  cr_assert_eq(um_copy_to_host(a, 0, back, N, &read), UM_OK);
  refuse_next_submission();
  /* Queued behind the read's token, refused by the device queue: the
   * issue succeeds, the failure comes through the event. */
  cr_assert_eq(um_copy_from_host(a, 0, pat_b, N, &refused), UM_OK);
  cr_assert_eq(um_event_query(read), UM_EAGAIN);
  cr_assert_eq(um_event_query(refused), UM_EAGAIN,
               "the refused write finished before the read queued ahead of it");
  cr_assert_eq(um_event_cancel(refused), UM_EBUSY, "it was submitted: not cancelable");

  w.b = a;
  cr_assert_eq(pthread_create(&t, NULL, blocking_write, &w), 0);
  sleep_ms(100);
  cr_assert_not(atomic_load(&w.done), "the blocking write ran while the read was still queued");
  cr_assert_eq(um_event_query(refused), UM_EAGAIN);

  cr_assert_eq(fault_hold(fd, false), UM_OK);
  cr_assert_eq(pthread_join(t, NULL), 0);
  cr_assert_eq(atomic_load(&w.st), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_event_wait(read), UM_OK);
  cr_assert_arr_eq(back, pat_a, N, "the read saw bytes written after it");
  cr_assert_eq(um_event_wait(refused), UM_EBACKEND);
  cr_assert(strstr(um_last_error(), "fails by plan") != NULL, "%s", um_last_error());
  cr_assert_eq(um_event_query(refused), UM_EBACKEND);
  cr_assert_eq(um_event_release(read), UM_OK);
  cr_assert_eq(um_event_release(refused), UM_OK);

  cr_assert_eq(um_copy_to_host(a, 0, now, N, NULL), UM_OK);
  cr_assert_arr_eq(now, pat_c, N);
  cr_assert_eq(um_release(a), UM_OK);
  teardown(m);
}

/* Asynchronous operations after the refused one wait for it (it has no
 * token: they follow it by registration) and so for the read before it;
 * the refused write moved nothing. */
Test(fault_order, operations_after_a_refused_write_follow_the_read_before_it) {
  um_device *fd;
  um_manager *m = setup(&fd);
  unsigned char back[N], back2[N], now[N], want[N];
  um_buffer *a, *b;
  um_event *read, *refused, *fill, *copy, *read2;

  cr_assert_eq(um_alloc(m, fd, N, UM_DEVICE, 0, &a), UM_OK);
  cr_assert_eq(um_alloc(m, fd, N, UM_DEVICE, 0, &b), UM_OK);
  cr_assert_eq(um_copy_from_host(a, 0, pat_a, N, NULL), UM_OK);
  cr_assert_eq(um_copy_from_host(b, 0, pat_c, N, NULL), UM_OK);

  cr_assert_eq(fault_hold(fd, true), UM_OK);
  cr_assert_eq(um_copy_to_host(a, 0, back, N, &read), UM_OK);
  refuse_next_submission();
  cr_assert_eq(um_copy_from_host(a, 0, pat_b, N, &refused), UM_OK);
  cr_assert_eq(um_fill(a, 0, 0x11, N / 2, &fill), UM_OK);
  cr_assert_eq(um_copy(a, N / 2, b, N / 2, N / 2, &copy), UM_OK); /* device-local */
  cr_assert_eq(um_copy_to_host(a, 0, back2, N, &read2), UM_OK);
  cr_assert_eq(um_event_query(refused), UM_EAGAIN);
  cr_assert_eq(um_event_query(fill), UM_EAGAIN);
  cr_assert_eq(um_event_query(copy), UM_EAGAIN);
  cr_assert_eq(um_event_query(read2), UM_EAGAIN);
  cr_assert_eq(fault_hold(fd, false), UM_OK);

  cr_assert_eq(um_event_wait(read2), UM_OK);
  cr_assert_eq(um_event_wait(copy), UM_OK);
  cr_assert_eq(um_event_wait(fill), UM_OK);
  cr_assert_eq(um_event_wait(refused), UM_EBACKEND);
  cr_assert_eq(um_event_wait(read), UM_OK);
  cr_assert_arr_eq(back, pat_a, N);
  memset(want, 0x11, N / 2);
  memcpy(want + N / 2, pat_c + N / 2, N / 2);
  cr_assert_arr_eq(back2, want, N);
  cr_assert_eq(um_copy_to_host(a, 0, now, N, NULL), UM_OK);
  cr_assert_arr_eq(now, want, N);
  um_event *all[] = {read, refused, fill, copy, read2};
  for (int i = 0; i < 5; i++)
    cr_assert_eq(um_event_release(all[i]), UM_OK);
  cr_assert_eq(um_release(a), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  teardown(m);
}

/* ------------------------------------------------------------------------ */
/* Reports out of order
 *
 * A device may report a later operation before the one it follows (OpenCL
 * calls its callbacks on any of its threads; CUDA's copy streams have a
 * watcher each). fault_hold_report keeps one report back while the
 * transfers behind it run and report: the operations behind it on its
 * buffer must not count as done before it does. Found by CI under TSan on
 * PoCL (test_opencl_wait's event_waits_with_spin: a read done, the write
 * before it not). */

static um_manager *setup_with(const um__backend *be, um_device **fd) {
  um_options o;
  um_manager *m = NULL;
  fault_test_options(&o);
  fault_configure(1, 256u << 20);
  fault_reset();
  cr_assert_eq(fault_manager_create_with(&o, be, &m), UM_OK, "%s", um_last_error());
  *fd = um_device_get(m, 1);
  cr_assert(fault_is_device(*fd));
  return m;
}

/* Wait (10 s at most) until d has made n reports. */
static void await_reports(um_device *d, uint64_t n) {
  for (int i = 0; i < 10000 && fault_reports(d) < n; i++)
    sleep_ms(1);
  cr_assert_eq(fault_reports(d), n, "the device made %llu reports, not %llu",
               (unsigned long long)fault_reports(d), (unsigned long long)n);
}

static void read_behind_a_late_write(const um__backend *be) {
  um_device *fd;
  um_manager *m = setup_with(be, &fd);
  unsigned char back[N];
  um_buffer *a;
  um_event *w, *r;
  uint64_t reports;

  cr_assert_eq(um_alloc(m, fd, N, UM_DEVICE, 0, &a), UM_OK);
  memset(back, 0, sizeof(back));
  cr_assert_eq(fault_hold_report(fd), UM_OK);
  reports = fault_reports(fd);
  cr_assert_eq(um_copy_from_host(a, 0, pat_a, N, &w), UM_OK);
  cr_assert_eq(um_copy_to_host(a, 0, back, N, &r), UM_OK);
  await_reports(fd, reports + 1); /* the read's; the write's is kept */
  cr_assert_arr_eq(back, pat_a, N, "the read ran, after the write");
  cr_assert_eq(um_event_query(r), UM_EAGAIN, "the read counts as done before the write it follows");
  cr_assert_eq(um_event_query(w), UM_EAGAIN);
  cr_assert(fault_release_report(fd));
  cr_assert_eq(um_event_wait(r), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_event_query(w), UM_OK, "the read is done, the write before it is not");
  cr_assert_eq(um_event_release(w), UM_OK);
  cr_assert_eq(um_event_release(r), UM_OK);
  cr_assert_eq(um_release(a), UM_OK);
  teardown(m);
}

Test(fault_order, a_read_reported_first_waits_for_the_write_before_it_on_a_single_queue) {
  read_behind_a_late_write(&fault_backend_queue);
}

Test(fault_order, a_read_reported_first_waits_for_the_write_before_it_behind_its_token) {
  read_behind_a_late_write(&fault_backend);
}

/* A batch whose copies follow, on the device's queue, writes still queued
 * (eight buffers: the run follows eight operations), one of which reports
 * last: the batch is done after it. */
Test(fault_order, a_batch_reported_first_waits_for_the_writes_before_it) {
  enum { B = 8 };
  um_device *fd;
  um_manager *m = setup_with(&fault_backend_queue, &fd);
  unsigned char back[B][N];
  um_buffer *buf[B];
  um_event *w[B], *batch;
  um_copy_op ops[B];
  uint64_t reports;

  for (int i = 0; i < B; i++)
    cr_assert_eq(um_alloc(m, fd, N, UM_DEVICE, 0, &buf[i]), UM_OK);
  memset(back, 0, sizeof(back));
  memset(ops, 0, sizeof(ops));
  cr_assert_eq(fault_hold(fd, true), UM_OK); /* the writes stay queued */
  cr_assert_eq(fault_hold_report(fd), UM_OK);
  reports = fault_reports(fd);
  for (int i = 0; i < B; i++) {
    cr_assert_eq(um_copy_from_host(buf[i], 0, i % 2 ? pat_b : pat_c, N, &w[i]), UM_OK);
    ops[i].src = buf[i];
    ops[i].host_dst = back[i];
    ops[i].bytes = N;
  }
  cr_assert_eq(um_copy_batch(m, ops, B, &batch), UM_OK, "%s", um_last_error());
  cr_assert_eq(fault_hold(fd, false), UM_OK);
  await_reports(fd, reports + B); /* writes 1..7 and the run's mark */
  for (int i = 0; i < B; i++)
    cr_assert_arr_eq(back[i], i % 2 ? pat_b : pat_c, N, "copy %d", i);
  cr_assert_eq(um_event_query(w[0]), UM_EAGAIN);
  for (int i = 1; i < B; i++)
    cr_assert_eq(um_event_query(w[i]), UM_OK, "write %d", i);
  cr_assert_eq(um_event_query(batch), UM_EAGAIN, "the batch counts as done before a write it follows");
  cr_assert(fault_release_report(fd));
  cr_assert_eq(um_event_wait(batch), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_event_query(w[0]), UM_OK);
  for (int i = 0; i < B; i++) {
    cr_assert_eq(um_event_release(w[i]), UM_OK);
    cr_assert_eq(um_release(buf[i]), UM_OK);
  }
  cr_assert_eq(um_event_release(batch), UM_OK);
  teardown(m);
}

typedef struct reader {
  um_buffer *b;
  unsigned char *dst;
  atomic_int st;
  atomic_bool done;
} reader;

static void *blocking_read(void *arg) {
  reader *r = arg;
  atomic_store(&r->st, um_copy_to_host(r->b, 0, r->dst, N, NULL));
  atomic_store(&r->done, true);
  return NULL;
}

/* A blocking read runs on the issuing thread behind the write its queue
 * orders (no event of its own): it returns once the write is reported. */
Test(fault_order, a_blocking_read_returns_after_the_write_before_it_is_reported) {
  um_device *fd;
  um_manager *m = setup_with(&fault_backend_queue, &fd);
  unsigned char back[N];
  um_buffer *a;
  um_event *w;
  reader rd = {.dst = back};
  pthread_t t;
  uint64_t reports;

  cr_assert_eq(um_alloc(m, fd, N, UM_DEVICE, 0, &a), UM_OK);
  memset(back, 0, sizeof(back));
  rd.b = a;
  cr_assert_eq(fault_hold_report(fd), UM_OK);
  reports = fault_reports(fd);
  cr_assert_eq(um_copy_from_host(a, 0, pat_b, N, &w), UM_OK);
  cr_assert_eq(pthread_create(&t, NULL, blocking_read, &rd), 0);
  await_reports(fd, reports + 1); /* the read's */
  sleep_ms(50);
  cr_assert_not(atomic_load(&rd.done), "the blocking read returned before the write it follows was reported");
  cr_assert_eq(um_event_query(w), UM_EAGAIN);
  cr_assert(fault_release_report(fd));
  cr_assert_eq(pthread_join(t, NULL), 0);
  cr_assert_eq(atomic_load(&rd.st), UM_OK);
  cr_assert_arr_eq(back, pat_b, N);
  cr_assert_eq(um_event_query(w), UM_OK);
  cr_assert_eq(um_event_release(w), UM_OK);
  cr_assert_eq(um_release(a), UM_OK);
  teardown(m);
}
