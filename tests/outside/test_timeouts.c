/* Events waited, queried, canceled and released in every order, from one
 * thread and from several; operations held behind a bracket (the only way
 * a test can keep an operation from starting); blocking calls given sizes
 * no device can hold. Every wait is bounded. */
#include "outside.h"

#include <unimem_dlpack.h>

#define TO_N 4096u

static um_buffer *to_buffer(um_manager *m, uint8_t byte) {
  um_buffer *b = NULL;
  cr_assert_eq(um_alloc(m, os_device(m), TO_N, os_location(), 0, &b), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_fill(b, 0, byte, TO_N, NULL), UM_OK);
  return b;
}

static void to_expect(um_buffer *b, uint8_t byte, const char *what) {
  uint8_t h[TO_N];
  cr_assert_eq(um_copy_to_host(b, 0, h, TO_N, NULL), UM_OK);
  for (size_t i = 0; i < TO_N; i++)
    cr_assert_eq(h[i], byte, "%s: byte %zu is %u, not %u", what, i, h[i], byte);
}

/* Under ASan, a leak check now (Criterion ignores LeakSanitizer's report
 * at the test process's exit): what destroy should have freed shows here. */
extern int __lsan_do_recoverable_leak_check(void) __attribute__((weak));

static void to_no_leaks(const char *what) {
  if (__lsan_do_recoverable_leak_check != NULL)
    cr_assert_eq(__lsan_do_recoverable_leak_check(), 0, "%s: LeakSanitizer found leaks (above)", what);
}

static int to_wait(void *e) { return um_event_wait((um_event *)e); }

/* ------------------------------------------------------------------------ */
/* Cancel */

/* "Cancel an operation that has not started: UM_OK (it will not run, and
 * waiting on it answers UM_ECANCELED)". The canceled operation is held
 * behind a bracket; the wait must not wait for the bracket of an operation
 * that will not run, and query must not call it pending. */
Test(timeouts, cancel_behind_a_bracket_then_query_and_wait, .timeout = 60) {
  um_manager *m = os_manager();
  um_buffer *b = to_buffer(m, 1);
  um_event *e = NULL;
  void *w = NULL;
  int st;
  cr_assert_eq(um_access_begin(b, UM_MAP_READ_WRITE, &w), UM_OK);
  cr_assert_eq(um_fill(b, 0, 2, TO_N, &e), UM_OK);
  cr_assert_eq(um_event_cancel(e), UM_OK);
  st = um_event_query(e);
  cr_expect_eq(st, UM_ECANCELED, "query right after a successful cancel: %s", um_err_name(st));
  st = os_bounded(to_wait, e, 5000, "um_event_wait of a canceled operation, bracket still open");
  cr_assert_eq(st, UM_ECANCELED);
  cr_assert_eq(um_access_end(b, NULL), UM_OK);
  to_expect(b, 1, "the canceled fill ran");
  cr_assert_eq(um_event_release(e), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* The same, the canceled operation behind a running one (a large fill) of
 * the same buffer instead of a bracket. */
Test(timeouts, cancel_behind_a_running_fill_then_query, .timeout = 120) {
  um_manager *m = os_manager();
  const size_t big = 256u << 20;
  um_buffer *b = NULL;
  um_event *e1 = NULL, *e2 = NULL;
  int st, q;
  cr_assert_eq(um_alloc(m, os_device(m), big, os_location(), 0, &b), UM_OK);
  cr_assert_eq(um_fill(b, 0, 1, big, &e1), UM_OK);
  cr_assert_eq(um_fill(b, 0, 2, big, &e2), UM_OK);
  st = um_event_cancel(e2);
  q = um_event_query(e1);
  if (st == UM_OK && q == UM_EAGAIN) {
    /* e2 was canceled while e1 still ran: e2 is not pending */
    int q2 = um_event_query(e2);
    cr_expect_eq(q2, UM_ECANCELED, "a canceled operation queued behind a running one reads %s",
                 um_err_name(q2));
  }
  cr_assert_eq(os_bounded(to_wait, e2, 60000, "wait of the second fill"), st == UM_OK ? UM_ECANCELED : UM_OK);
  cr_assert_eq(um_event_wait(e1), UM_OK);
  cr_assert_eq(um_event_release(e1), UM_OK);
  cr_assert_eq(um_event_release(e2), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* Cancel twice, and cancel after the end: UM_EBUSY ("once it started or
 * ended"); a canceled one's second cancel is not UM_OK twice. */
Test(timeouts, cancel_twice, .timeout = 60) {
  um_manager *m = os_manager();
  um_buffer *b = to_buffer(m, 3);
  um_event *e = NULL;
  void *w = NULL;
  int st;
  cr_assert_eq(um_access_begin(b, UM_MAP_READ_WRITE, &w), UM_OK);
  cr_assert_eq(um_fill(b, 0, 4, TO_N, &e), UM_OK);
  cr_assert_eq(um_event_cancel(e), UM_OK);
  st = um_event_cancel(e);
  cr_assert(st == UM_EBUSY || st == UM_OK, "second cancel: %s", um_err_name(st));
  cr_assert_eq(um_access_end(b, NULL), UM_OK);
  cr_assert_eq(os_bounded(to_wait, e, 5000, "wait"), UM_ECANCELED);
  cr_assert_eq(um_event_cancel(e), UM_EBUSY, "cancel of an ended (canceled) operation");
  cr_assert_eq(um_event_release(e), UM_OK);
  cr_assert_eq(um_event_cancel(e), UM_ESTATE, "cancel of a released event");
  to_expect(b, 3, "the canceled fill");
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* A canceled operation in the middle of a chain: the ones after it still
 * run, in order, without its effect. */
Test(timeouts, cancel_in_the_middle_of_a_chain, .timeout = 60) {
  um_manager *m = os_manager();
  um_buffer *b = to_buffer(m, 5), *c = to_buffer(m, 6);
  um_event *e1 = NULL, *e2 = NULL, *e3 = NULL;
  void *w = NULL;
  cr_assert_eq(um_access_begin(b, UM_MAP_READ_WRITE, &w), UM_OK);
  cr_assert_eq(um_fill(b, 0, 7, TO_N, &e1), UM_OK);
  cr_assert_eq(um_fill(b, 0, 8, TO_N, &e2), UM_OK);
  cr_assert_eq(um_copy(c, 0, b, 0, TO_N, &e3), UM_OK);
  cr_assert_eq(um_event_cancel(e2), UM_OK);
  cr_assert_eq(um_access_end(b, NULL), UM_OK);
  cr_assert_eq(os_bounded(to_wait, e3, 10000, "the copy after a canceled fill"), UM_OK);
  cr_assert_eq(um_event_wait(e1), UM_OK);
  cr_assert_eq(um_event_wait(e2), UM_ECANCELED);
  to_expect(c, 7, "the copy after the canceled fill");
  cr_assert_eq(um_event_release(e1), UM_OK);
  cr_assert_eq(um_event_release(e2), UM_OK);
  cr_assert_eq(um_event_release(e3), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_release(c), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* A batch's event canceled before the batch started: none of its ops run. */
Test(timeouts, cancel_a_batch, .timeout = 60) {
  um_manager *m = os_manager();
  um_buffer *b = to_buffer(m, 9), *c = to_buffer(m, 10);
  uint8_t h[TO_N];
  um_copy_op ops[2];
  um_event *e = NULL;
  void *w = NULL;
  int st;
  memset(h, 11, sizeof(h));
  memset(ops, 0, sizeof(ops));
  ops[0].dst = c;
  ops[0].host_src = h;
  ops[0].bytes = TO_N;
  ops[1].dst = b;
  ops[1].host_src = h;
  ops[1].bytes = TO_N;
  cr_assert_eq(um_access_begin(b, UM_MAP_READ_WRITE, &w), UM_OK);
  cr_assert_eq(um_copy_batch(m, ops, 2, &e), UM_OK);
  st = um_event_cancel(e);
  cr_assert(st == UM_OK || st == UM_EBUSY, "%s", um_err_name(st));
  cr_assert_eq(um_access_end(b, NULL), UM_OK);
  if (st == UM_OK) {
    cr_assert_eq(os_bounded(to_wait, e, 5000, "wait"), UM_ECANCELED);
    to_expect(b, 9, "op 1 of a canceled batch");
    to_expect(c, 10, "op 0 of a canceled batch");
  } else {
    /* op 0 had nothing to wait for and started: the batch had started */
    cr_assert_eq(os_bounded(to_wait, e, 5000, "wait"), UM_OK);
    to_expect(b, 11, "op 1 of a batch that could not be canceled");
  }
  cr_assert_eq(um_event_release(e), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_release(c), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* ------------------------------------------------------------------------ */
/* Release orders */

/* Event released while pending, then the bracket ends: the operation goes
 * on ("The operation itself goes on"). */
Test(timeouts, release_pending_event_then_end, .timeout = 60) {
  um_manager *m = os_manager();
  um_buffer *b = to_buffer(m, 12);
  um_event *e = NULL;
  void *w = NULL;
  cr_assert_eq(um_access_begin(b, UM_MAP_READ_WRITE, &w), UM_OK);
  cr_assert_eq(um_fill(b, 0, 13, TO_N, &e), UM_OK);
  cr_assert_eq(um_event_release(e), UM_OK);
  cr_assert_eq(um_event_query(e), UM_ESTATE);
  cr_assert_eq(um_access_end(b, NULL), UM_OK);
  to_expect(b, 13, "a fill whose event was released while pending");
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* Event released while pending, the buffer released inside its bracket
 * (which ends it), then destroy: clean, no leak, no hang. */
static int to_destroy(void *m) { return um_manager_destroy((um_manager *)m); }

Test(timeouts, release_pending_event_then_buffer_then_destroy, .timeout = 60) {
  um_manager *m = os_manager();
  um_buffer *b = to_buffer(m, 14);
  um_event *e = NULL;
  void *w = NULL;
  cr_assert_eq(um_access_begin(b, UM_MAP_READ_WRITE, &w), UM_OK);
  cr_assert_eq(um_fill(b, 0, 15, TO_N, &e), UM_OK);
  cr_assert_eq(um_event_release(e), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(os_bounded(to_destroy, m, 10000, "um_manager_destroy"), UM_OK);
  to_no_leaks("release of a pending event, then of its buffer inside the bracket");
}

/* The event kept, the buffer released inside its bracket: the fill issued
 * before the release still completes (the block waits for it). */
Test(timeouts, release_buffer_inside_bracket_event_kept, .timeout = 60) {
  um_manager *m = os_manager();
  um_buffer *b = to_buffer(m, 16);
  um_event *e = NULL;
  void *w = NULL;
  cr_assert_eq(um_access_begin(b, UM_MAP_READ_WRITE, &w), UM_OK);
  cr_assert_eq(um_fill(b, 0, 17, TO_N, &e), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(os_bounded(to_wait, e, 10000, "the fill of a buffer released inside its bracket"), UM_OK);
  cr_assert_eq(um_event_release(e), UM_OK);
  cr_assert_eq(os_bounded(to_destroy, m, 10000, "um_manager_destroy"), UM_OK);
}

/* Destroy with a bracket never ended and an event never released: "Open
 * brackets at um_manager_destroy() are ended behind your queue and
 * reported"; the buffer is a leak (UM_ELEAK); destroy returns. */
Test(timeouts, destroy_with_open_bracket_and_pending_event, .timeout = 60) {
  um_manager *m = os_manager();
  um_buffer *b = to_buffer(m, 18);
  um_event *e = NULL;
  void *w = NULL;
  cr_assert_eq(um_access_begin(b, UM_MAP_READ_WRITE, &w), UM_OK);
  cr_assert_eq(um_fill(b, 0, 19, TO_N, &e), UM_OK);
  cr_assert_eq(os_bounded(to_destroy, m, 15000, "um_manager_destroy with an open bracket"), UM_ELEAK);
  to_no_leaks("destroy with an open bracket and a pending operation");
}

/* The same pieces one at a time: an open bracket alone; an event never
 * released of an operation that ended. */
Test(timeouts, destroy_with_open_bracket_only, .timeout = 60) {
  um_manager *m = os_manager();
  um_buffer *b = to_buffer(m, 18);
  void *w = NULL;
  cr_assert_eq(um_access_begin(b, UM_MAP_READ_WRITE, &w), UM_OK);
  cr_assert_eq(os_bounded(to_destroy, m, 15000, "um_manager_destroy with an open bracket"), UM_ELEAK);
  to_no_leaks("destroy with an open bracket");
}

Test(timeouts, destroy_with_event_never_released, .timeout = 60) {
  um_manager *m = os_manager();
  um_buffer *b = to_buffer(m, 18);
  um_event *e = NULL;
  cr_assert_eq(um_fill(b, 0, 19, TO_N, &e), UM_OK);
  cr_assert_eq(um_event_wait(e), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(os_bounded(to_destroy, m, 15000, "um_manager_destroy"), UM_OK);
  to_no_leaks("destroy with an event never released");
}

Test(timeouts, destroy_with_pending_event_bracket_ended_by_release, .timeout = 60) {
  um_manager *m = os_manager();
  um_buffer *b = to_buffer(m, 18);
  um_event *e = NULL;
  void *w = NULL;
  cr_assert_eq(um_access_begin(b, UM_MAP_READ_WRITE, &w), UM_OK);
  cr_assert_eq(um_fill(b, 0, 19, TO_N, &e), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(os_bounded(to_destroy, m, 15000, "um_manager_destroy"), UM_OK);
  to_no_leaks("destroy with a pending event, its buffer released inside the bracket");
}

/* ------------------------------------------------------------------------ */
/* Several threads on one event */

typedef struct to_waiter {
  um_event *e;
  atomic_int result;
  atomic_int done;
} to_waiter;

static void *to_waiter_main(void *p) {
  to_waiter *t = (to_waiter *)p;
  atomic_store(&t->result, um_event_wait(t->e));
  atomic_store(&t->done, 1);
  return NULL;
}

static int to_join_within(to_waiter *t, pthread_t th, unsigned ms) {
  uint64_t end = os_now_ms() + ms;
  while (!atomic_load(&t->done) && os_now_ms() < end)
    os_sleep_ms(1);
  if (!atomic_load(&t->done)) {
    pthread_detach(th);
    return 0;
  }
  pthread_join(th, NULL);
  return 1;
}

/* Four threads wait on one event; the bracket ends; all get UM_OK. */
Test(timeouts, four_waiters_one_event, .timeout = 60) {
  um_manager *m = os_manager();
  um_buffer *b = to_buffer(m, 20);
  um_event *e = NULL;
  void *w = NULL;
  to_waiter t[4];
  pthread_t th[4];
  cr_assert_eq(um_access_begin(b, UM_MAP_READ_WRITE, &w), UM_OK);
  cr_assert_eq(um_fill(b, 0, 21, TO_N, &e), UM_OK);
  for (int i = 0; i < 4; i++) {
    t[i].e = e;
    atomic_store(&t[i].done, 0);
    cr_assert_eq(pthread_create(&th[i], NULL, to_waiter_main, &t[i]), 0);
  }
  os_sleep_ms(50);
  cr_assert_eq(um_access_end(b, NULL), UM_OK);
  for (int i = 0; i < 4; i++) {
    cr_assert(to_join_within(&t[i], th[i], 10000), "waiter %d hangs", i);
    cr_assert_eq(atomic_load(&t[i].result), UM_OK, "waiter %d: %s", i, um_err_name(atomic_load(&t[i].result)));
  }
  cr_assert_eq(um_event_release(e), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* One thread waits; another cancels: the waiter returns UM_ECANCELED
 * without the bracket's end. */
Test(timeouts, cancel_while_another_thread_waits, .timeout = 60) {
  um_manager *m = os_manager();
  um_buffer *b = to_buffer(m, 22);
  um_event *e = NULL;
  void *w = NULL;
  to_waiter t;
  pthread_t th;
  int ok;
  cr_assert_eq(um_access_begin(b, UM_MAP_READ_WRITE, &w), UM_OK);
  cr_assert_eq(um_fill(b, 0, 23, TO_N, &e), UM_OK);
  t.e = e;
  atomic_store(&t.done, 0);
  cr_assert_eq(pthread_create(&th, NULL, to_waiter_main, &t), 0);
  os_sleep_ms(50);
  cr_assert_eq(um_event_cancel(e), UM_OK);
  ok = to_join_within(&t, th, 5000);
  cr_assert_eq(um_access_end(b, NULL), UM_OK);
  cr_assert(ok, "the waiter of a canceled operation went on waiting for the bracket");
  cr_assert_eq(atomic_load(&t.result), UM_ECANCELED);
  cr_assert_eq(um_event_release(e), UM_OK);
  to_expect(b, 22, "the canceled fill");
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* One thread waits; another releases the event (misuse, but the header
 * says a released handle "never reaches freed memory while the manager
 * lives"): the waiter returns (the status or UM_ESTATE) once the operation
 * ends, and nothing touches freed memory (ASan). */
Test(timeouts, release_while_another_thread_waits, .timeout = 60) {
  um_manager *m = os_manager();
  um_buffer *b = to_buffer(m, 24);
  um_event *e = NULL;
  void *w = NULL;
  to_waiter t;
  pthread_t th;
  int r;
  cr_assert_eq(um_access_begin(b, UM_MAP_READ_WRITE, &w), UM_OK);
  cr_assert_eq(um_fill(b, 0, 25, TO_N, &e), UM_OK);
  t.e = e;
  atomic_store(&t.done, 0);
  cr_assert_eq(pthread_create(&th, NULL, to_waiter_main, &t), 0);
  os_sleep_ms(50);
  cr_assert_eq(um_event_release(e), UM_OK);
  cr_assert_eq(um_access_end(b, NULL), UM_OK);
  cr_assert(to_join_within(&t, th, 10000), "the waiter hangs");
  r = atomic_load(&t.result);
  cr_assert(r == UM_OK || r == UM_ESTATE, "waiter: %s", um_err_name(r));
  to_expect(b, 25, "the fill");
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* Many operations, each event released at once, others waited in reverse
 * order of issue; a query storm from another thread. */
typedef struct to_storm {
  um_event **ev;
  int n;
  atomic_int stop;
} to_storm;

static void *to_storm_main(void *p) {
  to_storm *s = (to_storm *)p;
  while (!atomic_load(&s->stop))
    for (int i = 0; i < s->n; i++)
      (void)um_event_query(s->ev[i]);
  return NULL;
}

Test(timeouts, reverse_waits_and_query_storm, .timeout = 120) {
  enum { N = 200 };
  um_manager *m = os_manager();
  um_buffer *b = to_buffer(m, 0);
  um_event *ev[N];
  to_storm s;
  pthread_t th;
  void *w = NULL;
  cr_assert_eq(um_access_begin(b, UM_MAP_READ_WRITE, &w), UM_OK);
  for (int i = 0; i < N; i++)
    cr_assert_eq(um_fill(b, (size_t)i, (uint8_t)(i + 1), 1, &ev[i]), UM_OK);
  s.ev = ev;
  s.n = N;
  atomic_store(&s.stop, 0);
  cr_assert_eq(pthread_create(&th, NULL, to_storm_main, &s), 0);
  for (int i = 0; i < N; i++)
    cr_assert_eq(um_event_query(ev[i]), UM_EAGAIN, "op %d ran inside the bracket", i);
  cr_assert_eq(um_access_end(b, NULL), UM_OK);
  for (int i = N - 1; i >= 0; i--)
    cr_assert_eq(os_bounded(to_wait, ev[i], 10000, "a wait in reverse order"), UM_OK);
  atomic_store(&s.stop, 1);
  pthread_join(th, NULL);
  for (int i = 0; i < N; i++)
    cr_assert_eq(um_event_release(ev[i]), UM_OK);
  {
    uint8_t h[N];
    cr_assert_eq(um_copy_to_host(b, 0, h, N, NULL), UM_OK);
    for (int i = 0; i < N; i++)
      cr_assert_eq(h[i], (uint8_t)(i + 1), "byte %d", i);
  }
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* um_event_native of an operation held behind a bracket: UM_EAGAIN on a
 * device queue ("waits for an earlier operation and has not been queued
 * yet"), UM_ENOTSUP on host threads; never a handle of something not
 * queued. */
Test(timeouts, event_native_of_a_held_operation, .timeout = 60) {
  um_manager *m = os_manager();
  um_buffer *b = to_buffer(m, 26);
  um_event *e = NULL;
  void *w = NULL, *nat = (void *)1;
  um_device_native dn;
  int st;
  cr_assert_eq(um_device_native_get(os_device(m), &dn), UM_OK);
  cr_assert_eq(um_access_begin(b, UM_MAP_READ_WRITE, &w), UM_OK);
  cr_assert_eq(um_fill(b, 0, 27, TO_N, &e), UM_OK);
  st = um_event_native(e, &nat);
  if (strcmp(dn.backend, "cpu") == 0)
    cr_assert_eq(st, UM_ENOTSUP, "%s", um_err_name(st));
  else
    cr_assert_eq(st, UM_EAGAIN, "um_event_native of a held operation: %s", um_err_name(st));
  cr_assert_eq(nat, (void *)1);
  cr_assert_eq(um_access_end(b, NULL), UM_OK);
  cr_assert_eq(um_event_wait(e), UM_OK);
  cr_assert_eq(um_event_release(e), UM_OK);
  cr_assert_eq(um_event_native(e, &nat), UM_ESTATE);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* ------------------------------------------------------------------------ */
/* Huge sizes: each answers with a code, at once */

typedef struct to_alloc_arg {
  um_manager *m;
  um_device *d;
  size_t bytes;
  um_location loc;
  unsigned flags;
} to_alloc_arg;

static int to_alloc(void *p) {
  to_alloc_arg *a = (to_alloc_arg *)p;
  um_buffer *b = NULL;
  int st = um_alloc(a->m, a->d, a->bytes, a->loc, a->flags, &b);
  if (st == UM_OK)
    um_release(b);
  return st;
}

Test(timeouts, huge_allocations, .timeout = 120) {
  um_manager *m = os_manager();
  static const size_t sizes[] = {SIZE_MAX, SIZE_MAX / 2 + 1, (size_t)1 << 50, (size_t)1 << 44};
  for (int di = 0; di < um_device_count(m); di++)
    for (int loc = 0; loc < UM_LOCATION_COUNT; loc++)
      for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++)
        for (unsigned fl = 0; fl < 4; fl++) {
          to_alloc_arg a = {m, um_device_get(m, di), sizes[si], (um_location)loc, fl};
          int st = os_bounded(to_alloc, &a, 10000, "a huge um_alloc");
          cr_assert(st == UM_ENOMEM || st == UM_EOVERFLOW || st == UM_ENOTSUP,
                    "device %d loc %d %zu bytes flags %u: %s (%s)", di, loc, sizes[si], fl, um_err_name(st),
                    um_last_error());
        }
  {
    um_stats s;
    cr_assert_eq(um_stats_get(m, NULL, &s), UM_OK);
    cr_assert_eq(s.active_buffers, 0u);
    cr_assert_eq(s.bytes_reserved, 0u, "failed allocations left reserved bytes");
  }
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

Test(timeouts, huge_arrays_overflow, .timeout = 60) {
  um_manager *m = os_manager();
  um_buffer *b = NULL;
  cr_assert_eq(um_alloc_array(m, os_device(m), SIZE_MAX / 2 + 1, 2, UM_HOST, 0, &b), UM_EOVERFLOW);
  cr_assert_eq(um_alloc_array(m, os_device(m), SIZE_MAX, SIZE_MAX, UM_HOST, 0, &b), UM_EOVERFLOW);
  cr_assert_eq(um_alloc_array(m, os_device(m), ((size_t)1 << 32) + 1, (size_t)1 << 32, UM_DEVICE, 0, &b),
               UM_EOVERFLOW);
  cr_assert_eq(um_alloc_array(m, os_device(m), 0, 8, UM_HOST, 0, &b), UM_EINVAL, "zero elements");
  cr_assert_eq(um_alloc_array(m, os_device(m), 8, 0, UM_HOST, 0, &b), UM_EINVAL, "zero element size");
  cr_assert_null(b);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* Ranges whose off + bytes overflows size_t: UM_ERANGE, never a wrap to a
 * small range. */
Test(timeouts, ranges_that_overflow, .timeout = 60) {
  um_manager *m = os_manager();
  um_buffer *b = to_buffer(m, 28), *c = to_buffer(m, 29);
  uint8_t h[16];
  void *p = NULL;
  um_event *e = NULL;
  const size_t big = SIZE_MAX - 7;
  cr_assert_eq(um_copy_from_host(b, big, h, 16, NULL), UM_ERANGE);
  cr_assert_eq(um_copy_from_host(b, 1, h, SIZE_MAX, NULL), UM_ERANGE);
  cr_assert_eq(um_copy_from_host(b, 0, h, SIZE_MAX, &e), UM_ERANGE);
  cr_assert_null(e);
  cr_assert_eq(um_copy_to_host(b, big, h, 16, NULL), UM_ERANGE);
  cr_assert_eq(um_copy_to_host(b, 16, h, SIZE_MAX - 8, NULL), UM_ERANGE);
  cr_assert_eq(um_copy(c, 0, b, big, 16, NULL), UM_ERANGE);
  cr_assert_eq(um_copy(c, big, b, 0, 16, NULL), UM_ERANGE);
  cr_assert_eq(um_copy(c, 16, b, 16, SIZE_MAX - 8, NULL), UM_ERANGE);
  cr_assert_eq(um_fill(b, big, 0, 16, NULL), UM_ERANGE);
  cr_assert_eq(um_fill(b, 16, 0, SIZE_MAX - 8, NULL), UM_ERANGE);
  cr_assert_eq(um_map(b, UM_MAP_READ, big, 16, &p), UM_ERANGE);
  cr_assert_eq(um_map(b, UM_MAP_READ, 16, SIZE_MAX - 8, &p), UM_ERANGE);
  cr_assert_eq(um_map(b, UM_MAP_READ, TO_N, 1, &p), UM_ERANGE);
  {
    um_copy_op op;
    memset(&op, 0, sizeof(op));
    op.dst = b;
    op.dst_off = big;
    op.host_src = h;
    op.bytes = 16;
    cr_assert_eq(um_copy_batch(m, &op, 1, NULL), UM_ERANGE);
    op.dst_off = 0;
    op.dst = NULL;
    op.host_src = NULL;
    op.host_dst = h;
    op.src = b;
    op.src_off = 16;
    op.bytes = SIZE_MAX - 8;
    cr_assert_eq(um_copy_batch(m, &op, 1, NULL), UM_ERANGE);
  }
  cr_assert_eq(um_copy_batch(m, NULL, 0, NULL), UM_EINVAL, "an empty batch with no ops");
  cr_assert_eq(um_stream(b, big, 16, os_device(m), 8, NULL, NULL, NULL), UM_EINVAL, "NULL fn");
  to_expect(b, 28, "b after refused calls");
  to_expect(c, 29, "c after refused calls");
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_release(c), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

static int to_chunk_count(void *user, um_buffer *chunk, size_t off, size_t bytes) {
  (void)chunk;
  (void)off;
  *(size_t *)user += bytes;
  return 0;
}

Test(timeouts, stream_huge_ranges, .timeout = 60) {
  um_manager *m = os_manager();
  um_buffer *b = to_buffer(m, 30);
  size_t seen = 0;
  cr_assert_eq(um_stream(b, SIZE_MAX - 7, 16, os_device(m), 8, to_chunk_count, NULL, &seen), UM_ERANGE);
  cr_assert_eq(um_stream(b, 16, SIZE_MAX - 8, os_device(m), 8, to_chunk_count, NULL, &seen), UM_ERANGE);
  cr_assert_eq(seen, 0u);
  /* a chunk larger than any device: the chunk is min(chunk_bytes, bytes) */
  cr_assert_eq(um_stream(b, 0, TO_N, os_device(m), SIZE_MAX, to_chunk_count, NULL, &seen), UM_OK, "%s",
               um_last_error());
  cr_assert_eq(seen, (size_t)TO_N);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* host + bytes past the end of the address space: the size computation
 * overflows (UM_EOVERFLOW, or any refusal); a wrap that accepts it passes
 * every later range check, and a pinned one locks a wrapped-around range. */
Test(timeouts, wrap_huge_ranges, .timeout = 60) {
  um_manager *m = os_manager();
  static uint8_t mem[64];
  um_buffer *b = NULL;
  int st = um_wrap_host(m, mem, SIZE_MAX, 0, &b);
  cr_expect(st != UM_OK, "a wrap of SIZE_MAX bytes (host + bytes wraps around the address space): %s, size %zu",
            um_err_name(st), um_buffer_size(b));
  if (st == UM_OK)
    cr_assert_eq(um_release(b), UM_OK);
  b = NULL;
  st = um_wrap_host(m, mem + 1, SIZE_MAX - 64, UM_WRAP_PIN, &b);
  cr_expect(st != UM_OK, "a pinned wrap that wraps around the address space: %s", um_err_name(st));
  if (st == UM_OK)
    cr_assert_eq(um_release(b), UM_OK);
  b = NULL;

  cr_assert_eq(um_wrap_host(m, mem, 0, 0, &b), UM_EINVAL, "zero bytes");
  cr_assert_eq(um_wrap_host(m, NULL, 64, 0, &b), UM_EINVAL, "NULL host");
  cr_assert_eq(um_wrap_host(m, mem, 64, 1u << 7, &b), UM_EINVAL, "unknown flags");
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

Test(timeouts, dlpack_export_huge_shapes, .timeout = 60) {
  um_manager *m = os_manager();
  um_buffer *b = to_buffer(m, 31);
  void *t = NULL;
  int64_t s2[2] = {INT64_MAX, INT64_MAX};
  int64_t s1 = INT64_MAX;
  int64_t st1 = INT64_MAX;
  int st;
  st = um_dlpack_export(b, 0, 2, s2, NULL, UM_DL_FLOAT, 32, 1, 0, &t);
  cr_assert(st == UM_EOVERFLOW || st == UM_ENOTSUP, "%s", um_err_name(st));
  st = um_dlpack_export(b, 0, 1, &s1, NULL, UM_DL_FLOAT, 64, 4, 0, &t);
  cr_assert(st == UM_EOVERFLOW || st == UM_ENOTSUP, "%s", um_err_name(st));
  s1 = 2;
  st = um_dlpack_export(b, 0, 1, &s1, &st1, UM_DL_UINT, 8, 1, 0, &t);
  cr_assert(st == UM_EOVERFLOW || st == UM_ERANGE || st == UM_ENOTSUP, "a stride past the end: %s",
            um_err_name(st));
  s1 = TO_N;
  st = um_dlpack_export(b, SIZE_MAX - 7, 1, &s1, NULL, UM_DL_UINT, 8, 1, 0, &t);
  cr_assert(st == UM_ERANGE || st == UM_EOVERFLOW || st == UM_ENOTSUP, "an offset near SIZE_MAX: %s",
            um_err_name(st));
  s1 = TO_N + 1;
  st = um_dlpack_export(b, 0, 1, &s1, NULL, UM_DL_UINT, 8, 1, 0, &t);
  cr_assert(st == UM_ERANGE || st == UM_ENOTSUP, "one element past the end: %s", um_err_name(st));
  s1 = 1;
  st = um_dlpack_export(b, TO_N, 1, &s1, NULL, UM_DL_UINT, 8, 1, 0, &t);
  cr_assert(st == UM_ERANGE || st == UM_ENOTSUP, "an element at the end: %s", um_err_name(st));
  s1 = 0;
  st = um_dlpack_export(b, TO_N, 1, &s1, NULL, UM_DL_UINT, 8, 1, 0, &t);
  fprintf(stderr, "[info] " "no elements at offset == size: %s\n", um_err_name(st));
  if (st == UM_OK)
    ((um_dl_managed_tensor *)t)->deleter(t);
  cr_assert_null(st == UM_OK ? NULL : t);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* A copy larger than a device's limit option: UM_ENOMEM, at once. */
Test(timeouts, device_limit_respected, .timeout = 60) {
  um_options o;
  um_manager *m;
  um_buffer *b = NULL, *c = NULL;
  os_options(&o);
  o.device_limit_bytes = 1u << 20;
  m = os_manager_with(&o);
  if (os_device(m) == um_device_get(m, 0)) {
    um_manager_destroy(m);
    cr_skip_test("the limit is for non-host devices");
  }
  cr_assert_eq(um_alloc(m, os_device(m), 2u << 20, UM_DEVICE, 0, &b), UM_ENOMEM);
  cr_assert_eq(um_alloc(m, os_device(m), 768u << 10, UM_DEVICE, 0, &b), UM_OK);
  cr_assert_eq(um_alloc(m, os_device(m), 768u << 10, UM_DEVICE, 0, &c), UM_ENOMEM, "two over the limit");
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_alloc(m, os_device(m), 768u << 10, UM_DEVICE, 0, &c), UM_OK, "the pool's block again");
  cr_assert_eq(um_release(c), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* Options out of range: um_manager_create answers UM_EINVAL ("bad
 * option") and writes nothing. */
static void to_bad_option(void (*set)(um_options *), const char *what) {
  um_options o;
  um_manager *m = (um_manager *)1;
  os_options(&o);
  set(&o);
  int st = um_manager_create(&o, &m);
  if (st == UM_OK)
    um_manager_destroy(m);
  cr_assert_eq(st, UM_EINVAL, "%s: %s", what, um_err_name(st));
  cr_assert_eq(m, (um_manager *)1);
}

static void to_set_spin(um_options *o) { o->wait_spin_ns = 1000000001u; }
static void to_set_transfers(um_options *o) { o->max_concurrent_transfers = 0; }
static void to_set_transfers_neg(um_options *o) { o->max_concurrent_transfers = -3; }
static void to_set_net_timeout(um_options *o) { o->net_timeout_ms = 0; }
static void to_set_staging(um_options *o) { o->use_pinned_staging = 3; }
static void to_set_backends(um_options *o) { snprintf(o->backends, sizeof(o->backends), "cpu,nosuch"); }
static void to_set_level(um_options *o) { o->log_level = (um_log_level)9; }
static void to_set_chunk(um_options *o) { o->staging_chunk_bytes = 0; }
static void to_set_unterminated(um_options *o) { memset(o->backends, 'c', sizeof(o->backends)); }

Test(timeouts, options_out_of_range, .timeout = 60) {
  to_bad_option(to_set_spin, "wait_spin_ns past 1 s");
  to_bad_option(to_set_transfers, "max_concurrent_transfers 0");
  to_bad_option(to_set_transfers_neg, "max_concurrent_transfers -3");
  to_bad_option(to_set_net_timeout, "net_timeout_ms 0");
  to_bad_option(to_set_staging, "use_pinned_staging 3");
  to_bad_option(to_set_level, "log_level 9");
  to_bad_option(to_set_chunk, "staging_chunk_bytes 0");
}

Test(timeouts, options_backends_unknown_or_unterminated, .timeout = 60) {
  um_options o;
  um_manager *m = NULL;
  int st;
  os_options(&o);
  to_set_backends(&o);
  st = um_manager_create(&o, &m);
  cr_assert(st == UM_EINVAL || st == UM_OK, "an unknown backend: %s", um_err_name(st));
  if (st == UM_OK)
    cr_assert_eq(um_manager_destroy(m), UM_OK);
  os_options(&o);
  to_set_unterminated(&o);
  m = NULL;
  st = um_manager_create(&o, &m);
  cr_assert_eq(st, UM_EINVAL, "backends with no NUL: %s", um_err_name(st));
}
