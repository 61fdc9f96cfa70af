/* Misuse of event handles (SPEC section 5, amended "Stale events"): waiting
 * on, querying, canceling or releasing an event already released answers
 * UM_ESTATE, a pointer that is no event answers UM_EINVAL, and neither
 * touches freed memory while the manager lives. Then the events of batches,
 * cancel at every stage, events that outlive their buffers or another
 * manager, and events released by one thread while others wait on them.
 *
 * Every refused call is checked for its exact code and for leaving the
 * manager's statistics as they were. Each test runs in its own process,
 * under a timeout, so a crash or a hang fails that test alone; the suite
 * runs in the ASan+UBSan build too, where a touch of freed memory aborts. */
#include <stdlib.h>
#include <string.h>

#include "fault_backend.h"
#include "misuse_util.h"

static um_manager *m;
static um_device *cpu;

static void setup(void) {
  m = ut_manager();
  cpu = um_device_get(m, 0);
}

static void teardown(void) {
  mu_gate_open(); /* a failed test may have left it closed */
  cr_assert_eq(um_manager_destroy(m), UM_OK, "%s", um_last_error());
}

TestSuite(events, .init = setup, .fini = teardown, .timeout = 60);

static um_buffer *host_buffer(size_t n) {
  um_buffer *b = NULL;
  cr_assert_eq(um_alloc(m, cpu, n, UM_HOST, UM_ALLOC_ZERO, &b), UM_OK);
  return b;
}

/* An event whose operation finished before the call returned (a small
 * fill runs on the issuing thread). */
static um_event *finished_event(um_buffer *b) {
  um_event *e = NULL;
  cr_assert_eq(um_fill(b, 0, 0x5a, 64, &e), UM_OK);
  cr_assert_not_null(e);
  cr_assert_eq(um_event_query(e), UM_OK);
  return e;
}

/* A fill of the whole of b held at the gate (close it first): the n-th
 * operation held. */
static um_event *held_fill(um_buffer *b, int value, int nth) {
  um_event *e = NULL;
  cr_assert_geq(um_buffer_size(b), MU_WORKER_BYTES);
  cr_assert_eq(um_fill(b, 0, value, um_buffer_size(b), &e), UM_OK);
  mu_gate_wait_entered(nth);
  cr_assert_eq(um_event_query(e), UM_EAGAIN);
  return e;
}

/* Every call on a released event, releasing it again included: UM_ESTATE,
 * and nothing changes. */
static void expect_stale_event(um_event *e) {
  MU_FAILS(m, UM_ESTATE, um_event_wait(e));
  MU_FAILS(m, UM_ESTATE, um_event_query(e));
  MU_FAILS(m, UM_ESTATE, um_event_cancel(e));
  MU_FAILS(m, UM_ESTATE, um_event_release(e));
  MU_FAILS(m, UM_ESTATE, um_event_query(e));
}

/* ------------------------------------------------------------------------ */
/* Released events */

Test(events, released_after_wait) {
  um_buffer *b = host_buffer(4096);
  um_event *e = finished_event(b);
  cr_assert_eq(um_event_wait(e), UM_OK);
  cr_assert_eq(um_event_release(e), UM_OK);
  expect_stale_event(e);
  cr_assert_eq(um_release(b), UM_OK);
}

Test(events, released_without_wait) {
  um_buffer *b = host_buffer(4096);
  um_event *e = finished_event(b);
  cr_assert_eq(um_event_release(e), UM_OK);
  expect_stale_event(e);
  cr_assert_eq(um_release(b), UM_OK);
}

Test(events, released_twice_in_a_row) {
  um_buffer *b = host_buffer(4096);
  um_event *e = finished_event(b);
  cr_assert_eq(um_event_release(e), UM_OK);
  MU_FAILS(m, UM_ESTATE, um_event_release(e));
  MU_FAILS(m, UM_ESTATE, um_event_release(e));
  expect_stale_event(e);
  cr_assert_eq(um_release(b), UM_OK);
}

/* Released while its operation is still held: the handle is stale at once,
 * and the operation itself goes on to the end. */
Test(events, released_while_pending) {
  um_buffer *b = host_buffer(MU_WORKER_BYTES);
  um_event *e;
  um_stats s;
  mu_gate_close(m);
  e = held_fill(b, 0x6b, 1);
  cr_assert_eq(um_event_release(e), UM_OK);
  expect_stale_event(e);
  mu_gate_open();
  cr_assert_eq(um_device_synchronize(cpu), UM_OK);
  cr_assert(ut_all_bytes(um_buffer_host_ptr(b), MU_WORKER_BYTES, 0x6b), "the released event's fill did not run");
  s = ut_stats(m, cpu);
  cr_assert_eq(s.fills, 1);
  MU_FAILS(m, UM_ESTATE, um_event_wait(e));
  cr_assert_eq(um_release(b), UM_OK);
}

/* An event of a blocking-free batch, released: stale like any other. */
Test(events, released_batch_event) {
  um_buffer *a = host_buffer(4096), *b = host_buffer(4096);
  unsigned char src[4096];
  um_copy_op ops[2] = {{.dst = a, .host_src = src, .bytes = 4096}, {.dst = b, .src = a, .bytes = 4096}};
  um_event *e = NULL;
  ut_pattern(src, sizeof(src), 3);
  cr_assert_eq(um_copy_batch(m, ops, 2, &e), UM_OK);
  cr_assert_eq(um_event_wait(e), UM_OK);
  cr_assert_eq(um_event_release(e), UM_OK);
  expect_stale_event(e);
  cr_assert_arr_eq(um_buffer_host_ptr(b), src, sizeof(src));
  cr_assert_eq(um_release(a), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
}

/* A released event's handle may be handed to a later operation, as a
 * released buffer's handle is handed to a later allocation: the contract
 * (header, um_release) makes the stale handle answer UM_ESTATE only until
 * then. So: every released handle that no new event took answers UM_ESTATE;
 * one that a new event took is that event, live, and answers for it. */
Test(events, released_then_handles_reused) {
  enum { N = 16 };
  um_buffer *b = host_buffer(4096);
  um_event *old[N], *fresh[N];
  for (int i = 0; i < N; i++)
    old[i] = finished_event(b);
  for (int i = 0; i < N; i++)
    cr_assert_eq(um_event_release(old[i]), UM_OK);
  for (int i = 0; i < N; i++)
    fresh[i] = finished_event(b);
  for (int i = 0; i < N; i++) {
    int reused = 0;
    for (int j = 0; j < N; j++)
      reused |= old[i] == fresh[j];
    if (reused)
      cr_assert_eq(um_event_query(old[i]), UM_OK, "a reused handle answers for its new operation");
    else
      MU_FAILS(m, UM_ESTATE, um_event_query(old[i]));
  }
  for (int i = 0; i < N; i++) {
    cr_assert_eq(um_event_wait(fresh[i]), UM_OK);
    cr_assert_eq(um_event_release(fresh[i]), UM_OK);
  }
  cr_assert_eq(um_release(b), UM_OK);
}

/* ------------------------------------------------------------------------ */
/* Pointers that are no event: UM_EINVAL, and releasing one writes nothing. */

/* n: bytes at p that must stay as they are (0 for a live object of the
 * library, whose locks and counters are its own business). */
static void expect_not_an_event(void *p, size_t n) {
  unsigned char *copy = mu_malloc(n + 1);
  um_event *e = p;
  memcpy(copy, p, n);
  MU_FAILS(m, UM_EINVAL, um_event_wait(e));
  MU_FAILS(m, UM_EINVAL, um_event_query(e));
  MU_FAILS(m, UM_EINVAL, um_event_cancel(e));
  MU_FAILS(m, UM_EINVAL, um_event_release(e));
  cr_assert_arr_eq(p, copy, n, "um_event_release wrote into a pointer that is no event");
  free(copy);
}

Test(events, garbage_zeroed_memory) {
  uint64_t zero[64] = {0};
  expect_not_an_event(zero, sizeof(zero));
}

Test(events, garbage_pattern_memory) {
  unsigned char junk[512];
  memset(junk, 0xa5, sizeof(junk));
  expect_not_an_event(junk, sizeof(junk));
}

Test(events, garbage_buffer_handle) {
  um_buffer *b = host_buffer(256);
  expect_not_an_event(b, 0);
  cr_assert_eq(um_buffer_size(b), 256, "the buffer was disturbed");
  cr_assert_eq(um_fill(b, 0, 1, 256, NULL), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
}

Test(events, garbage_device_handle) {
  um_device_info info;
  expect_not_an_event(cpu, 0);
  cr_assert_eq(um_device_info_get(cpu, &info), UM_OK);
  cr_assert_eq(info.index, 0);
}

Test(events, garbage_manager_handle) {
  expect_not_an_event(m, 0);
  cr_assert_eq(um_device_count(m), 1);
}

/* ------------------------------------------------------------------------ */
/* Cancel */

Test(events, cancel_after_done) {
  um_buffer *b = host_buffer(4096);
  um_event *e = finished_event(b);
  MU_FAILS(m, UM_EBUSY, um_event_cancel(e));
  MU_FAILS(m, UM_EBUSY, um_event_cancel(e));
  cr_assert_eq(um_event_wait(e), UM_OK, "a refused cancel changed the outcome");
  cr_assert_eq(um_event_release(e), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
}

Test(events, cancel_while_running) {
  um_buffer *b = host_buffer(MU_WORKER_BYTES);
  um_event *e;
  mu_gate_close(m);
  e = held_fill(b, 0x21, 1);
  MU_FAILS(m, UM_EBUSY, um_event_cancel(e));
  mu_gate_open();
  cr_assert_eq(um_event_wait(e), UM_OK);
  cr_assert(ut_all_bytes(um_buffer_host_ptr(b), MU_WORKER_BYTES, 0x21));
  cr_assert_eq(um_event_release(e), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
}

/* Queued behind a held operation on the same buffer: the first cancel
 * takes, a second is refused, the operation never runs. */
Test(events, cancel_queued_twice) {
  um_buffer *b = host_buffer(MU_WORKER_BYTES);
  um_event *first, *second = NULL;
  um_stats s;
  mu_gate_close(m);
  first = held_fill(b, 0x31, 1);
  cr_assert_eq(um_fill(b, 0, 0x32, MU_WORKER_BYTES, &second), UM_OK);
  cr_assert_eq(um_event_query(second), UM_EAGAIN);
  cr_assert_eq(um_event_cancel(second), UM_OK);
  MU_FAILS(m, UM_EBUSY, um_event_cancel(second));
  mu_gate_open();
  cr_assert_eq(um_event_wait(first), UM_OK);
  cr_assert_eq(um_event_wait(second), UM_ECANCELED);
  cr_assert_eq(um_event_query(second), UM_ECANCELED);
  MU_FAILS(m, UM_EBUSY, um_event_cancel(second));
  cr_assert(ut_all_bytes(um_buffer_host_ptr(b), MU_WORKER_BYTES, 0x31), "the canceled fill ran");
  s = ut_stats(m, cpu);
  cr_assert_eq(s.fills, 1);
  cr_assert_eq(um_event_release(first), UM_OK);
  cr_assert_eq(um_event_release(second), UM_OK);
  expect_stale_event(second);
  cr_assert_eq(um_release(b), UM_OK);
}

/* ------------------------------------------------------------------------ */
/* Batches: the event stands for all its members, which the caller never
 * sees; it cannot be canceled (its members may have started), and it ends
 * when the last member ends. */

Test(events, batch_event_while_members_held) {
  um_buffer *a = host_buffer(MU_WORKER_BYTES), *b = host_buffer(MU_WORKER_BYTES);
  unsigned char *src = mu_malloc(MU_WORKER_BYTES), *back = mu_malloc(MU_WORKER_BYTES);
  um_copy_op ops[3];
  um_event *e = NULL;
  ut_snapshot held;
  ut_pattern(src, MU_WORKER_BYTES, 11);
  ops[0] = (um_copy_op){.dst = a, .host_src = src, .bytes = MU_WORKER_BYTES};
  ops[1] = (um_copy_op){.dst = b, .src = a, .bytes = MU_WORKER_BYTES};
  ops[2] = (um_copy_op){.host_dst = back, .src = b, .bytes = MU_WORKER_BYTES};
  mu_gate_close(m);
  cr_assert_eq(um_copy_batch(m, ops, 3, &e), UM_OK);
  mu_gate_wait_entered(1);
  held = ut_snap(m);
  cr_assert_eq(um_event_query(e), UM_EAGAIN);
  MU_FAILS(m, UM_EBUSY, um_event_cancel(e));
  ut_assert_unchanged(m, held);
  mu_gate_open();
  cr_assert_eq(um_event_wait(e), UM_OK);
  cr_assert_arr_eq(back, src, MU_WORKER_BYTES, "the batch ended before its last member");
  MU_FAILS(m, UM_EBUSY, um_event_cancel(e));
  cr_assert_eq(um_event_release(e), UM_OK);
  expect_stale_event(e);
  cr_assert_eq(um_release(a), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  free(src);
  free(back);
}

/* The batch's event released before its members ran: they still run, in
 * order, and a later operation on their buffers comes after them. */
Test(events, batch_event_released_early) {
  um_buffer *a = host_buffer(MU_WORKER_BYTES), *b = host_buffer(MU_WORKER_BYTES);
  unsigned char *src = mu_malloc(MU_WORKER_BYTES), *back = mu_malloc(MU_WORKER_BYTES);
  um_copy_op ops[2];
  um_event *e = NULL;
  ut_pattern(src, MU_WORKER_BYTES, 12);
  ops[0] = (um_copy_op){.dst = a, .host_src = src, .bytes = MU_WORKER_BYTES};
  ops[1] = (um_copy_op){.dst = b, .src = a, .bytes = MU_WORKER_BYTES};
  mu_gate_close(m);
  cr_assert_eq(um_copy_batch(m, ops, 2, &e), UM_OK);
  mu_gate_wait_entered(1);
  cr_assert_eq(um_event_release(e), UM_OK);
  expect_stale_event(e);
  mu_gate_open();
  cr_assert_eq(um_copy_to_host(b, 0, back, MU_WORKER_BYTES, NULL), UM_OK);
  cr_assert_arr_eq(back, src, MU_WORKER_BYTES);
  cr_assert_eq(um_release(a), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  free(src);
  free(back);
}

/* A member that fails (its device is lost) fails the batch's event with
 * its code; the members on other devices run all the same. */
Test(events, batch_member_failure) {
  um_manager *fm;
  um_options o;
  um_buffer *h = NULL, *d = NULL;
  unsigned char src[4096], back[4096];
  um_copy_op ops[2];
  um_event *e = NULL;
  ut_options(&o);
  cr_assert_eq(fault_manager_create(&o, &fm), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_alloc(fm, um_device_get(fm, 0), 4096, UM_HOST, UM_ALLOC_ZERO, &h), UM_OK);
  cr_assert_eq(um_alloc(fm, um_device_get(fm, 1), 4096, UM_DEVICE, 0, &d), UM_OK);
  ut_pattern(src, sizeof(src), 13);
  cr_assert_eq(fault_lose(um_device_get(fm, 1)), UM_OK);
  ops[0] = (um_copy_op){.dst = d, .host_src = src, .bytes = 4096};
  ops[1] = (um_copy_op){.dst = h, .host_src = src, .bytes = 4096};
  cr_assert_eq(um_copy_batch(fm, ops, 2, &e), UM_OK);
  cr_assert_eq(um_event_wait(e), UM_ENODEV);
  cr_assert_eq(um_event_query(e), UM_ENODEV);
  MU_FAILS(fm, UM_EBUSY, um_event_cancel(e));
  cr_assert_eq(um_copy_to_host(h, 0, back, sizeof(back), NULL), UM_OK);
  cr_assert_arr_eq(back, src, sizeof(src), "the member on the cpu did not run");
  cr_assert_eq(um_event_release(e), UM_OK);
  MU_FAILS(fm, UM_ESTATE, um_event_wait(e));
  cr_assert_eq(um_release(h), UM_OK);
  cr_assert_eq(um_release(d), UM_OK);
  cr_assert_eq(um_manager_destroy(fm), UM_OK);
}

/* ------------------------------------------------------------------------ */
/* Events that outlive what they refer to */

/* The operation's buffers were released while it was held (their release
 * is deferred): the event still answers for the operation, and the blocks
 * reach the pool once it ends. */
Test(events, used_after_its_buffers_were_released) {
  um_buffer *a = host_buffer(MU_WORKER_BYTES), *b = host_buffer(MU_WORKER_BYTES);
  um_event *e = NULL;
  um_stats s;
  cr_assert_eq(um_fill(a, 0, 0x44, MU_WORKER_BYTES, NULL), UM_OK);
  mu_gate_close(m);
  cr_assert_eq(um_copy(b, 0, a, 0, MU_WORKER_BYTES, &e), UM_OK);
  mu_gate_wait_entered(1);
  cr_assert_eq(um_release(a), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_event_query(e), UM_EAGAIN);
  MU_FAILS(m, UM_EBUSY, um_event_cancel(e));
  s = ut_stats(m, NULL);
  cr_assert_eq(s.active_buffers, 0);
  cr_assert_eq(s.bytes_pooled, 0, "a block went to the pool under a running copy");
  mu_gate_open();
  cr_assert_eq(um_event_wait(e), UM_OK);
  /* The released buffers' blocks go to the pool just after the event
   * counts as done, on the completing thread: the synchronize waits for
   * that, so that the statistics the misuse below compares hold still. */
  cr_assert_eq(um_device_synchronize(cpu), UM_OK);
  cr_assert_eq(um_event_query(e), UM_OK);
  MU_FAILS(m, UM_EBUSY, um_event_cancel(e));
  s = ut_stats(m, NULL);
  cr_assert_eq(s.bytes_pooled, 2 * ut_class(MU_WORKER_BYTES));
  /* The blocks (and handles) go to new owners; the old event is unmoved. */
  cr_assert_eq(um_alloc(m, cpu, MU_WORKER_BYTES, UM_HOST, 0, &a), UM_OK);
  cr_assert_eq(um_fill(a, 0, 0x45, 64, NULL), UM_OK);
  cr_assert_eq(um_event_wait(e), UM_OK);
  cr_assert_eq(um_event_release(e), UM_OK);
  expect_stale_event(e);
  cr_assert_eq(um_release(a), UM_OK);
}

/* An event of manager A, waited on after manager B was destroyed. */
Test(events, other_manager_destroyed) {
  um_manager *m2 = ut_manager();
  um_buffer *a = host_buffer(MU_WORKER_BYTES), *b2 = NULL;
  um_event *ea = NULL, *eb = NULL;
  ut_snapshot held;
  cr_assert_eq(um_alloc(m2, um_device_get(m2, 0), MU_WORKER_BYTES, UM_HOST, 0, &b2), UM_OK);
  mu_gate_close(m); /* only m's workers are held */
  ea = held_fill(a, 0x55, 1);
  cr_assert_eq(um_fill(b2, 0, 0x66, MU_WORKER_BYTES, &eb), UM_OK);
  cr_assert_eq(um_event_wait(eb), UM_OK);
  cr_assert_eq(um_event_release(eb), UM_OK);
  cr_assert_eq(um_release(b2), UM_OK);
  held = ut_snap(m);
  cr_assert_eq(um_manager_destroy(m2), UM_OK);
  ut_assert_unchanged(m, held);
  cr_assert_eq(um_event_query(ea), UM_EAGAIN);
  mu_gate_open();
  cr_assert_eq(um_event_wait(ea), UM_OK);
  cr_assert(ut_all_bytes(um_buffer_host_ptr(a), MU_WORKER_BYTES, 0x55));
  cr_assert_eq(um_event_release(ea), UM_OK);
  expect_stale_event(ea);
  cr_assert_eq(um_release(a), UM_OK);
}

/* ------------------------------------------------------------------------ */
/* Threads: one thread releases the event while others wait on it. A waiter
 * that was inside um_event_wait before the release may get the operation's
 * status; one that came after gets UM_ESTATE; nothing else, no crash, no
 * hang, and the handle is stale afterwards. */

typedef struct waiter {
  pthread_t t;
  um_event *e;
  pthread_mutex_t *lock;
  pthread_cond_t *cond;
  int *ready;
  int status;
} waiter;

static void *waiter_main(void *arg) {
  waiter *w = arg;
  pthread_mutex_lock(w->lock);
  (*w->ready)++;
  pthread_cond_broadcast(w->cond);
  pthread_mutex_unlock(w->lock);
  w->status = um_event_wait(w->e);
  return NULL;
}

typedef struct releaser {
  pthread_t t;
  um_event *e;
  int status;
} releaser;

static void *releaser_main(void *arg) {
  releaser *r = arg;
  r->status = um_event_release(r->e);
  return NULL;
}

Test(events, released_by_one_thread_while_others_wait) {
  enum { ROUNDS = 8, WAITERS = 3 };
  um_buffer *b = host_buffer(MU_WORKER_BYTES);
  pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
  pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
  for (int round = 0; round < ROUNDS; round++) {
    waiter w[WAITERS];
    releaser r;
    int ready = 0;
    um_event *e;
    mu_gate_close(m);
    e = held_fill(b, round, 1);
    for (int i = 0; i < WAITERS; i++) {
      w[i] = (waiter){.e = e, .lock = &lock, .cond = &cond, .ready = &ready, .status = 1};
      cr_assert_eq(pthread_create(&w[i].t, NULL, waiter_main, &w[i]), 0);
    }
    pthread_mutex_lock(&lock);
    while (ready < WAITERS)
      pthread_cond_wait(&cond, &lock);
    pthread_mutex_unlock(&lock);
    r.e = e;
    cr_assert_eq(pthread_create(&r.t, NULL, releaser_main, &r), 0);
    pthread_join(r.t, NULL);
    cr_assert_eq(r.status, UM_OK, "round %d: the release answered %s", round, um_err_name(r.status));
    mu_gate_open();
    for (int i = 0; i < WAITERS; i++) {
      pthread_join(w[i].t, NULL);
      cr_assert(w[i].status == UM_OK || w[i].status == UM_ESTATE,
                "round %d waiter %d: %s, expected UM_OK or UM_ESTATE", round, i, um_err_name(w[i].status));
    }
    MU_FAILS(m, UM_ESTATE, um_event_wait(e));
    cr_assert_eq(um_device_synchronize(cpu), UM_OK);
    cr_assert(ut_all_bytes(um_buffer_host_ptr(b), MU_WORKER_BYTES, (unsigned char)round));
  }
  cr_assert_eq(um_release(b), UM_OK);
}

/* Many threads on one stale handle at once: every one gets UM_ESTATE. */
static void *stale_waiter_main(void *arg) {
  waiter *w = arg;
  int st = UM_ESTATE;
  for (int i = 0; i < 1000 && st == UM_ESTATE; i++) {
    st = um_event_wait(w->e);
    if (st == UM_ESTATE)
      st = um_event_query(w->e);
    if (st == UM_ESTATE)
      st = um_event_cancel(w->e);
    if (st == UM_ESTATE)
      st = um_event_release(w->e);
  }
  w->status = st;
  return NULL;
}

Test(events, stale_handle_from_many_threads) {
  enum { THREADS = 4 };
  um_buffer *b = host_buffer(4096);
  um_event *e = finished_event(b);
  waiter w[THREADS];
  ut_snapshot before;
  cr_assert_eq(um_event_release(e), UM_OK);
  before = ut_snap(m);
  for (int i = 0; i < THREADS; i++) {
    w[i] = (waiter){.e = e, .status = 1};
    cr_assert_eq(pthread_create(&w[i].t, NULL, stale_waiter_main, &w[i]), 0);
  }
  for (int i = 0; i < THREADS; i++) {
    pthread_join(w[i].t, NULL);
    cr_assert_eq(w[i].status, UM_ESTATE, "thread %d: %s", i, um_err_name(w[i].status));
  }
  ut_assert_unchanged(m, before);
  cr_assert_eq(um_release(b), UM_OK);
}

/* Two threads release the same event at once: exactly one release takes
 * (UM_OK), the other answers UM_ESTATE, and the handle is stale. */
static void *event_release_racer(void *arg) {
  waiter *w = arg;
  pthread_mutex_lock(w->lock);
  (*w->ready)++;
  pthread_cond_broadcast(w->cond);
  while (*w->ready < 2)
    pthread_cond_wait(w->cond, w->lock);
  pthread_mutex_unlock(w->lock);
  w->status = um_event_release(w->e);
  return NULL;
}

Test(events, double_release_from_two_threads) {
  enum { ROUNDS = 100 };
  um_buffer *b = host_buffer(4096);
  pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
  pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
  for (int i = 0; i < ROUNDS; i++) {
    int ready = 0;
    um_event *e = finished_event(b);
    waiter w[2];
    for (int k = 0; k < 2; k++) {
      w[k] = (waiter){.e = e, .lock = &lock, .cond = &cond, .ready = &ready, .status = 1};
      cr_assert_eq(pthread_create(&w[k].t, NULL, event_release_racer, &w[k]), 0);
    }
    for (int k = 0; k < 2; k++)
      pthread_join(w[k].t, NULL);
    cr_assert((w[0].status == UM_OK && w[1].status == UM_ESTATE) || (w[0].status == UM_ESTATE && w[1].status == UM_OK),
              "round %d: the releases answered %s and %s", i, um_err_name(w[0].status), um_err_name(w[1].status));
    MU_FAILS(m, UM_ESTATE, um_event_query(e));
  }
  cr_assert_eq(um_release(b), UM_OK);
}
