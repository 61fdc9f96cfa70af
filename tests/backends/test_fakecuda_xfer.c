/* Transfers on CUDA devices through the whole library, on the fake driver:
 * round trips of every location, blocking and with events, over sizes and
 * offsets; the strategies (direct from pinned, pipelined staging for
 * pageable memory, device-local, peer between two devices, staged when
 * peer access is off) with their counters; ordering of asynchronous
 * operations on one buffer with the fake's streams running on their own
 * threads and slow copies, so that the native waits through stream events
 * really wait; batches, streaming; driver failures at issue and device
 * faults in the middle of an operation, which fail that operation only. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define UT_SKIP_MAIN /* support/skip_main.c: every test skipped exits 77 */
#include "fakecuda_util.h"
#include "testing.h"
#include "testhook.h"

TestSuite(fakecuda_xfer, .timeout = 240);

/* The fake's streams run on their own threads, each copy taking delay_us
 * more: completions come late, from driver threads. The default options
 * of a fake manager go to o. */
static void threaded_options(um_options *o, const char *delay_us) {
  fc_env(UM_FAKE_CUDA_FULL);
  fc_set("FAKE_CUDA_STREAM_THREADS", "1");
  fc_set("FAKE_CUDA_OP_DELAY_US", delay_us);
  cac_options(o, "cpu,cuda");
}

/* A default fake manager over such streams. */
static um_manager *threaded_manager(const char *delay_us) {
  um_options o;
  threaded_options(&o, delay_us);
  return fc_manager(&o);
}

/* Such a manager whose waiters spin for spin_ns before they sleep
 * (wait_spin_ns). */
static um_manager *spinning_manager(const char *delay_us, uint32_t spin_ns) {
  um_options o;
  threaded_options(&o, delay_us);
  o.wait_spin_ns = spin_ns;
  return fc_manager(&o);
}

/* Such a manager (into *m) with `workers` workers, pooling on or off; its
 * first device. */
static um_device *threaded_device(const char *delay_us, int workers, int pooling, um_manager **m) {
  um_options o;
  threaded_options(&o, delay_us);
  o.max_concurrent_transfers = workers;
  o.enable_pooling = pooling;
  *m = fc_manager(&o);
  return fc_dev(*m, 0);
}

/* ------------------------------------------------------------------------ */
/* Round trips */

Test(fakecuda_xfer, round_trips_device_blocking) {
  um_manager *m;
  fc_env(UM_FAKE_CUDA_FULL);
  m = fc_default();
  cac_check_round_trips(m, fc_dev(m, 0), UM_DEVICE, 0);
  fc_destroy(m, UM_OK);
}

Test(fakecuda_xfer, round_trips_device_async) {
  um_manager *m;
  fc_env(UM_FAKE_CUDA_FULL);
  m = fc_default();
  cac_check_round_trips(m, fc_dev(m, 0), UM_DEVICE, 1);
  fc_destroy(m, UM_OK);
}

Test(fakecuda_xfer, round_trips_pinned_and_unified) {
  um_manager *m;
  fc_env(UM_FAKE_CUDA_FULL);
  m = fc_default();
  cac_check_round_trips(m, fc_dev(m, 0), UM_PINNED, 0);
  cac_check_round_trips(m, fc_dev(m, 0), UM_PINNED, 1);
  cac_check_round_trips(m, fc_dev(m, 0), UM_UNIFIED, 0);
  cac_check_round_trips(m, fc_dev(m, 0), UM_UNIFIED, 1);
  fc_destroy(m, UM_OK);
}

Test(fakecuda_xfer, round_trips_threaded_streams) {
  um_manager *m = threaded_manager("100");
  cac_check_round_trips(m, fc_dev(m, 0), UM_DEVICE, 1);
  cac_check_round_trips(m, fc_dev(m, 0), UM_DEVICE, 0);
  cr_assert_eq(fc_count("callbacks_run"), 0, "completions come from the stream watchers, not stream callbacks");
  fc_destroy(m, UM_OK);
}

/* ------------------------------------------------------------------------ */
/* Strategies */

Test(fakecuda_xfer, strategies_blocking) {
  um_manager *m;
  fc_env(UM_FAKE_CUDA_FULL);
  m = fc_default();
  cac_check_strategies(m, fc_dev(m, 0), 0);
  fc_destroy(m, UM_OK);
}

Test(fakecuda_xfer, strategies_async_threaded_streams) {
  um_manager *m = threaded_manager("200");
  cac_check_strategies(m, fc_dev(m, 0), 1);
  fc_destroy(m, UM_OK);
}

Test(fakecuda_xfer, pageable_copies_without_staging_are_direct) {
  um_options o;
  um_manager *m;
  um_device *d;
  const size_t n = 5 * CAC_CHUNK;
  unsigned char *src = cac_xmalloc(n), *back = cac_xmalloc(n);
  um_buffer *b;
  um_stats s0, s1;
  fc_env(UM_FAKE_CUDA_FULL);
  cac_options(&o, "cpu,cuda");
  o.use_pinned_staging = 0;
  m = fc_manager(&o);
  d = fc_dev(m, 0);
  b = cac_alloc(m, d, n, UM_DEVICE, 0);
  ut_pattern(src, n, 4);
  s0 = ut_stats(m, d);
  CAC_OK(um_copy_from_host(b, 0, src, n, NULL));
  CAC_OK(um_copy_to_host(b, 0, back, n, NULL));
  s1 = ut_stats(m, d);
  cr_assert_arr_eq(back, src, n);
  cr_assert_eq(CAC_DELTA(s1, s0, xfer_direct), 2);
  cr_assert_eq(CAC_DELTA(s1, s0, xfer_pipelined), 0);
  CAC_OK(um_release(b));
  free(src);
  free(back);
  fc_destroy(m, UM_OK);
}

Test(fakecuda_xfer, peer_copies_between_two_devices) {
  um_manager *m;
  fc_env(UM_FAKE_CUDA_FULL);
  fc_set("FAKE_CUDA_DEVICE_COUNT", "2");
  m = fc_default();
  cac_check_between(m, fc_dev(m, 0), fc_dev(m, 1), 1);
  cac_check_between(m, fc_dev(m, 1), fc_dev(m, 0), 1);
  fc_destroy(m, UM_OK);
}

Test(fakecuda_xfer, staged_copies_without_peer_access) {
  um_options o;
  um_manager *m;
  um_device *a, *b;
  fc_env(UM_FAKE_CUDA_FULL);
  fc_set("FAKE_CUDA_DEVICE_COUNT", "2");
  fc_set("FAKE_CUDA_STREAM_THREADS", "1");
  cac_options(&o, "cpu,cuda");
  o.enable_peer = 0;
  m = fc_manager(&o);
  a = fc_dev(m, 0);
  b = fc_dev(m, 1);
  cr_assert_eq(um_peer_possible(a, b), 1);
  cac_check_between(m, a, b, 0);
  cac_check_between(m, b, a, 0);
  /* Enabled later, one direction only: b reads a's memory. */
  CAC_OK(um_peer_enable(b, a));
  cr_assert_eq(um_peer_enabled(b, a), 1);
  cr_assert_eq(um_peer_enabled(a, b), 0);
  cac_check_between(m, a, b, 1);
  cac_check_between(m, b, a, 0);
  fc_destroy(m, UM_OK);
}

/* ------------------------------------------------------------------------ */
/* Ordering and asynchrony */

Test(fakecuda_xfer, ordering_inline_streams) {
  um_manager *m;
  fc_env(UM_FAKE_CUDA_FULL);
  m = fc_default();
  for (uint64_t seed = 1; seed <= 4; seed++)
    cac_check_ordering(m, fc_dev(m, 0), seed, 150);
  fc_destroy(m, UM_OK);
}

Test(fakecuda_xfer, ordering_threaded_streams) {
  um_manager *m = threaded_manager("300");
  for (uint64_t seed = 11; seed <= 13; seed++)
    cac_check_ordering(m, fc_dev(m, 0), seed, 150);
  cr_assert_eq(fc_count("callbacks_run"), 0, "completions come from the stream watchers");
  fc_destroy(m, UM_OK);
}

/* Operations issued with an event return before the device ran them (the
 * fake's copies take 200 ms each here), and a download issued right behind
 * an upload, on another stream, waits for it through a stream event: it
 * reads the uploaded bytes. */
Test(fakecuda_xfer, copies_with_events_return_at_once) {
  um_manager *m = threaded_manager("200000");
  um_device *d = fc_dev(m, 0);
  um_buffer *b = cac_alloc(m, d, 4096, UM_DEVICE, 0);
  unsigned char src[4096], back[4096];
  um_event *up, *down;
  ut_pattern(src, sizeof(src), 9);
  memset(back, 0, sizeof(back));
  CAC_OK(um_copy_from_host(b, 0, src, sizeof(src), &up));
  CAC_OK(um_copy_to_host(b, 0, back, sizeof(back), &down));
  cr_assert_eq(um_event_query(up), UM_EAGAIN);
  cr_assert_eq(um_event_query(down), UM_EAGAIN);
  cr_assert_eq(um_event_cancel(down), UM_EBUSY, "already queued on the device");
  cac_wait_release(down, UM_OK);
  cac_wait_release(up, UM_OK);
  cr_assert_arr_eq(back, src, sizeof(src));
  CAC_OK(um_release(b));
  fc_destroy(m, UM_OK);
}

/* Released with operations in flight: the block returns to the pool only
 * once they finished, and the data they moved is intact. */
Test(fakecuda_xfer, release_with_operations_in_flight) {
  um_manager *m = threaded_manager("20000");
  um_device *d = fc_dev(m, 0);
  const size_t n = 3 * CAC_CHUNK;
  unsigned char *src = cac_xmalloc(n), *back = cac_xmalloc(n);
  um_buffer *a = cac_alloc(m, d, n, UM_DEVICE, 0), *b = cac_alloc(m, d, n, UM_DEVICE, 0);
  um_event *e1, *e2, *e3;
  um_stats s;
  ut_pattern(src, n, 10);
  CAC_OK(um_copy_from_host(a, 0, src, n, &e1));
  CAC_OK(um_copy(b, 0, a, 0, n, &e2));
  CAC_OK(um_release(a));
  CAC_OK(um_copy_to_host(b, 0, back, n, &e3));
  CAC_OK(um_release(b));
  s = ut_stats(m, d);
  cr_assert_eq(s.active_buffers, 0);
  cac_wait_release(e3, UM_OK);
  cac_wait_release(e2, UM_OK);
  cac_wait_release(e1, UM_OK);
  cr_assert_arr_eq(back, src, n);
  CAC_OK(um_device_synchronize(d));
  s = ut_stats(m, d);
  cr_assert_eq(s.bytes_pooled, 2 * ut_class(n));
  free(src);
  free(back);
  fc_destroy(m, UM_OK);
}

/* Many small copies with events: the events of the copies are kept for
 * reuse, at most 32 per device, whatever the number of copies: after each
 * round of 200 copies in flight at once, the live events come back to at
 * most 32 above where they started (once the watcher has let go of the
 * last ones, which it does just after their completion was reported). */
/* A DEVICE and a PINNED buffer of bytes each on m's first device. */
static void device_and_pinned(um_manager *m, size_t bytes, um_buffer **dev, um_buffer **pin) {
  um_device *d = fc_dev(m, 0);
  *dev = cac_alloc(m, d, bytes, UM_DEVICE, 0);
  *pin = cac_alloc(m, d, bytes, UM_PINNED, 0);
}

Test(fakecuda_xfer, small_copies_reuse_a_bounded_set_of_events) {
  um_manager *m = threaded_manager("50");
  enum { N = 200, SIZE = 4096 };
  um_buffer *dev, *pin;
  um_event *ev[N];
  long base, after[3] = {0, 0, 0};
  device_and_pinned(m, (size_t)N * SIZE, &dev, &pin);
  memset(um_buffer_host_ptr(pin), 0x5A, (size_t)N * SIZE);
  base = fc_count("events");
  for (int round = 0; round < 3; round++) {
    for (int i = 0; i < N; i++)
      CAC_OK(um_copy(dev, (size_t)i * SIZE, pin, (size_t)i * SIZE, SIZE, &ev[i]));
    for (int i = 0; i < N; i++)
      cac_wait_release(ev[i], UM_OK);
    for (int tries = 0; (after[round] = fc_count("events")) - base > 32 && tries < 5000; tries++)
      nanosleep(&(struct timespec){0, 1000000}, NULL);
    cr_assert_leq(after[round] - base, 32, "round %d: %ld events kept", round, after[round] - base);
    cr_assert_geq(after[round] - base, 1, "round %d: no event kept for reuse", round);
  }
  CAC_OK(um_release(pin));
  CAC_OK(um_release(dev));
  fc_destroy(m, UM_OK);
}

/* A transfer's event is a blocking-sync one, and its watcher sleeps on it
 * in cuEventSynchronize: on the driver a cuEventSynchronize on a plain
 * event that has not completed spins under the context's default
 * scheduling (the fake counts those), and a sleep behind a device-side
 * wait of the watcher's own would share a hardware queue with the
 * caller's work (cuda/transfers.c, spare_event_get). The watchers queue nothing on
 * the device: every record is a transfer's, and no stream waits. */
Test(fakecuda_xfer, the_watchers_sleep_on_the_transfers_events) {
  um_manager *m = threaded_manager("2000");
  enum { N = 8, SIZE = 4096 };
  um_buffer *dev, *pin;
  um_event *up[N], *down[N];
  long spins, records, blocking, waits;
  device_and_pinned(m, (size_t)N * SIZE, &dev, &pin);
  spins = fc_count("spinning_waits");
  records = fc_count("event_records");
  blocking = fc_count("blocking_records");
  waits = fc_count("stream_waits");
  ut_pattern(um_buffer_host_ptr(pin), (size_t)N * SIZE, 41);
  for (int i = 0; i < N; i++)
    CAC_OK(um_copy(dev, (size_t)i * SIZE, pin, (size_t)i * SIZE, SIZE, &up[i]));
  for (int i = 0; i < N; i++)
    cac_wait_release(up[i], UM_OK);
  for (int i = 0; i < N; i++)
    CAC_OK(um_copy(pin, (size_t)i * SIZE, dev, (size_t)(N - 1 - i) * SIZE, SIZE, &down[i]));
  for (int i = 0; i < N; i++)
    cac_wait_release(down[i], UM_OK);
  cr_assert_eq(fc_count("event_records") - records, 2 * N, "%ld events recorded for %d copies",
               fc_count("event_records") - records, 2 * N);
  cr_assert_eq(fc_count("blocking_records") - blocking, 2 * N, "%ld blocking-sync events for %d copies",
               fc_count("blocking_records") - blocking, 2 * N);
  cr_assert_eq(fc_count("stream_waits") - waits, 0, "a stream was made to wait on the device");
  cr_assert_eq(fc_count("spinning_waits") - spins, 0, "a watcher waited on a plain event");
  CAC_OK(um_release(pin));
  CAC_OK(um_release(dev));
  fc_destroy(m, UM_OK);
}

/* With wait_spin_ns a stream's watcher spins for its next token before it
 * sleeps (cuda/transfers.c, watch_main): copies issued one after the other within the
 * budget find it awake, so their issuers pay no futex wake, and a manager
 * destroyed while it spins stops it at once. Without the budget it sleeps
 * after its reports. The hook counts the watchers' sleeps. */
static atomic_long watch_sleeps;

static void count_watch_sleeps(um__test_point point, void *arg) {
  (void)arg;
  if (point == UM__TP_CUDA_WATCH_SLEEP)
    atomic_fetch_add(&watch_sleeps, 1);
}

/* Sleeps of the watchers over 20 copies with an event each, each waited for
 * before the next; *destroy_s: how long the manager's destroy took. */
static long watcher_sleeps(uint32_t spin_ns, double *destroy_s) {
  enum { N = 20, SIZE = 4096 };
  um_manager *m = spinning_manager("50", spin_ns);
  um_buffer *dev, *pin;
  long sleeps;
  uint64_t start;
  device_and_pinned(m, SIZE, &dev, &pin);
  ut_pattern(um_buffer_host_ptr(pin), SIZE, 47);
  /* The first copy starts the watcher; count from its report on. */
  {
    um_event *e;
    CAC_OK(um_copy(dev, 0, pin, 0, SIZE, &e));
    cac_wait_release(e, UM_OK);
  }
  atomic_store(&watch_sleeps, 0);
  atomic_store(&um__test_hook, count_watch_sleeps);
  for (int i = 0; i < N; i++) {
    um_event *e;
    CAC_OK(um_copy(dev, 0, pin, 0, SIZE, &e));
    cac_wait_release(e, UM_OK);
  }
  sleeps = atomic_load(&watch_sleeps);
  atomic_store(&um__test_hook, NULL);
  CAC_OK(um_release(pin));
  CAC_OK(um_release(dev));
  start = um__now_ns();
  fc_destroy(m, UM_OK);
  *destroy_s = (double)(um__now_ns() - start) * 1e-9;
  return sleeps;
}

Test(fakecuda_xfer, a_spinning_watcher_stays_awake_between_copies) {
  double destroy_s = 0;
  long sleeps_spin = watcher_sleeps(1000000000u, &destroy_s); /* 1 s, the most: longer than the loop */
  long sleeps_default;
  double destroy_default_s = 0;
  cr_assert_eq(sleeps_spin, 0, "a watcher with a 1 s spin slept %ld times between 20 copies", sleeps_spin);
  /* A stop ends a watcher's spin; a missed one would wait out the rest of
   * the 1 s budget that began at the last report. */
  cr_assert_lt(destroy_s, 0.8, "the destroy waited %.2f s for a spinning watcher", destroy_s);
  sleeps_default = watcher_sleeps(0, &destroy_default_s);
  cr_assert_geq(sleeps_default, 1, "a watcher without a spin budget never slept between 20 copies");
}

/* With wait_spin_ns a blocking copy polls its stream (cuStreamQuery) before
 * the driver's cuStreamSynchronize only where that would sleep: under the
 * context's CU_CTX_SCHED_BLOCKING_SYNC. Under auto (the default), spin or
 * yield the driver polls already, and polling beside it only took its lock
 * (0.3-0.4 us more per blocking 4 KiB copy on an H200). The copies take 2
 * ms each on the fake's stream threads, so a poll finds them running. */
static long queries_of_blocking_copies(const char *ctx_flags) {
  um_manager *m;
  um_buffer *dev, *pin;
  long queries;
  um_options o;
  threaded_options(&o, "2000");
  fc_set("FAKE_CUDA_CTX_FLAGS", ctx_flags);
  o.wait_spin_ns = 200000000; /* 200 ms: longer than any copy here */
  m = fc_manager(&o);
  device_and_pinned(m, 4096, &dev, &pin);
  ut_pattern(um_buffer_host_ptr(pin), 4096, 43);
  queries = fc_count("stream_queries");
  for (int i = 0; i < 4; i++) {
    CAC_OK(um_copy(dev, 0, pin, 0, 4096, NULL));
    CAC_OK(um_copy(pin, 0, dev, 0, 4096, NULL));
  }
  queries = fc_count("stream_queries") - queries;
  CAC_OK(um_release(pin));
  CAC_OK(um_release(dev));
  fc_destroy(m, UM_OK);
  return queries;
}

Test(fakecuda_xfer, a_blocking_copy_polls_only_where_the_driver_sleeps) {
  long polls_auto = queries_of_blocking_copies("0");        /* CU_CTX_SCHED_AUTO */
  long polls_spin = queries_of_blocking_copies("1");        /* CU_CTX_SCHED_SPIN */
  long polls_blocking = queries_of_blocking_copies("4");    /* CU_CTX_SCHED_BLOCKING_SYNC */
  cr_assert_eq(polls_auto, 0, "%ld polls under auto scheduling", polls_auto);
  cr_assert_eq(polls_spin, 0, "%ld polls under spin scheduling", polls_spin);
  cr_assert_geq(polls_blocking, 8, "%ld polls for 8 copies of 2 ms under blocking sync", polls_blocking);
}

Test(fakecuda_xfer, threads_at_once) {
  um_manager *m = threaded_manager("50");
  cac_check_threads(m, fc_dev(m, 0), 4, 25);
  fc_destroy(m, UM_OK);
}

/* The end of a test that wrote src into big: big reads back as src, then
 * big and other are released, the host copies freed, m destroyed. */
static void read_back_and_close(um_manager *m, um_buffer *big, um_buffer *other, unsigned char *src,
                                unsigned char *back, size_t n) {
  CAC_OK(um_copy_to_host(big, 0, back, n, NULL));
  cr_assert_arr_eq(back, src, n);
  CAC_OK(um_release(big));
  CAC_OK(um_release(other));
  free(src);
  free(back);
  fc_destroy(m, UM_OK);
}

/* A stream's watcher finishes the operations it reports itself (cuda/transfers.c
 * marks it um__thread_completes_inline): the report of a copy needs no
 * worker. With the only worker (max_concurrent_transfers 1) held by a
 * pipelined upload of four 100 ms chunks, a 4 KiB download on the other
 * stream is done once its own 100 ms copy ran, while the upload still runs;
 * when its report went through the worker it came only after the upload. */
Test(fakecuda_xfer, the_watcher_finishes_its_copies_without_a_worker) {
  enum { SMALL = 4096 };
  const size_t n = 4 * CAC_CHUNK;
  um_manager *m;
  um_device *d;
  um_buffer *big, *small;
  um_event *up, *down;
  unsigned char *src = cac_xmalloc(n), *back = cac_xmalloc(n), got[SMALL], want[SMALL];
  long records;
  d = threaded_device("100000", 1, 1, &m);
  big = cac_alloc(m, d, n, UM_DEVICE, 0);
  small = cac_alloc(m, d, SMALL, UM_DEVICE, 0);
  ut_pattern(src, n, 41);
  ut_pattern(want, SMALL, 43);
  CAC_OK(um_copy_from_host(small, 0, want, SMALL, NULL));
  memset(got, 0, sizeof(got));

  records = fc_count("event_records");
  CAC_OK(um_copy_from_host(big, 0, src, n, &up)); /* pageable, 4 chunks: pipelined on the worker */
  /* The worker is inside it once its first chunk's event is recorded. */
  for (int tries = 0; fc_count("event_records") == records && tries < 5000; tries++)
    nanosleep(&(struct timespec){0, 1000000}, NULL);
  cr_assert_gt(fc_count("event_records"), records, "the pipelined upload never started");

  CAC_OK(um_copy_to_host(small, 0, got, SMALL, &down));
  cac_wait_release(down, UM_OK);
  cr_assert_arr_eq(got, want, SMALL);
  cr_assert_eq(um_event_query(up), UM_EAGAIN, "the download's report waited for the worker's upload");
  cac_wait_release(up, UM_OK);
  read_back_and_close(m, big, small, src, back, n);
}

/* The fail-safe of a test that holds the fake's host waits: lets them go
 * after 10 s unless the test said it is done first, and says whether it
 * had to. */
typedef struct hold_guard {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  void (*hold)(int);
  int done;      /* the test got what it waited for */
  int let_go;    /* the guard let the waits go: the test's wait hung */
} hold_guard;

static void *hold_guard_main(void *arg) {
  hold_guard *g = arg;
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += 10;
  pthread_mutex_lock(&g->lock);
  while (!g->done && pthread_cond_timedwait(&g->cond, &g->lock, &until) == 0)
    ;
  g->let_go = !g->done;
  pthread_mutex_unlock(&g->lock);
  g->hold(0);
  return NULL;
}

/* A waiter that spins (wait_spin_ns) reports an ended copy itself: with
 * every cuEventSynchronize of the fake held, the stream's watcher sleeps
 * in it after the copy ran, yet um_event_wait returns, the operation done
 * and its bytes on the device. Without the waiter's report it would sleep
 * until the guard lets the watcher go (10 s). The watcher, let go after,
 * reports nothing twice: the destroy's checks find every driver object
 * given back. */
Test(fakecuda_xfer, a_spinning_waiter_reports_the_copy_itself) {
  enum { SIZE = 4096 };
  um_manager *m;
  um_device *d;
  um_buffer *b;
  um_event *ev;
  unsigned char src[SIZE], back[SIZE];
  hold_guard g = {.lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};
  pthread_t guard;
  int st;
  m = spinning_manager("1000", 1000000000); /* the most: the copy ends inside it, even under a sanitizer */
  d = fc_dev(m, 0);
  b = cac_alloc(m, d, SIZE, UM_DEVICE, 0);
  ut_pattern(src, SIZE, 47);
  memset(back, 0, sizeof(back));
  g.hold = fc_host_waits_holder();

  g.hold(1);
  cr_assert_eq(pthread_create(&guard, NULL, hold_guard_main, &g), 0);
  CAC_OK(um_copy_from_host(b, 0, src, SIZE, &ev));
  st = um_event_wait(ev);
  pthread_mutex_lock(&g.lock);
  g.done = 1;
  pthread_cond_signal(&g.cond);
  pthread_mutex_unlock(&g.lock);
  pthread_join(guard, NULL);
  cr_assert_eq(st, UM_OK, "%s: %s", um_err_name(st), um_last_error());
  cr_assert_not(g.let_go, "the wait returned only once the watcher was let go");
  cr_assert_eq(um_event_query(ev), UM_OK);
  CAC_OK(um_event_release(ev));
  CAC_OK(um_copy_to_host(b, 0, back, SIZE, NULL));
  cr_assert_arr_eq(back, src, SIZE);
  CAC_OK(um_release(b));
  fc_destroy(m, UM_OK);
}

/* Spinning waiters and the watchers race to report the same copies: four
 * threads' copies, each reported once (a second report would complete an
 * operation twice), with every byte where it belongs. */
Test(fakecuda_xfer, spinning_waiters_and_watchers_at_once) {
  um_manager *m = spinning_manager("20", 100000);
  cac_check_threads(m, fc_dev(m, 0), 4, 25);
  fc_destroy(m, UM_OK);
}

/* A free of device memory waits for the whole device (the fake's cuMemFree
 * does, as the driver's may), and a bracket's gate is device work that
 * waits for the host. Here a bracket on b holds a gate until a pipelined
 * upload into b is done, its chunks reported by the watcher that also
 * reports the copy whose end retires a (released meanwhile, pooling off,
 * so a's memory is freed). Freed on the watcher, a's memory would wait for
 * the gate, the gate for the upload, the upload for the watcher; freed on
 * the only worker, the gate would wait for the worker. The retire leaves
 * the watcher, and the CUDA backend holds the free until the gate opens. */
static void retire_behind_a_gate(int workers) {
  enum { SMALL = 4096 };
  const size_t n = 4 * CAC_CHUNK;
  um_manager *m;
  um_device *d;
  um_buffer *a, *b, *pin;
  um_event *ea, *eb;
  void *wait = NULL;
  unsigned char *src = cac_xmalloc(n), *back = cac_xmalloc(n);
  int st = UM_EAGAIN;
  d = threaded_device("20000", workers, 0, &m); /* pooling off: a's retire frees its memory */
  a = cac_alloc(m, d, SMALL, UM_DEVICE, 0);
  pin = cac_alloc(m, d, SMALL, UM_PINNED, 0);
  b = cac_alloc(m, d, n, UM_DEVICE, 0);
  ut_pattern(src, n, 47);
  CAC_OK(um_copy(a, 0, pin, 0, SMALL, &ea));      /* the upload stream's watcher reports it */
  CAC_OK(um_copy_from_host(b, 0, src, n, &eb));   /* pipelined, its chunks behind on that stream */
  CAC_OK(um_access_begin(b, UM_MAP_READ, &wait)); /* a gate, open once the upload is done */
  cr_assert_not_null(wait, "the bracket waits for the upload");
  CAC_OK(um_release(a)); /* deferred behind ea's copy */
  um_event_release(ea);
  for (int tries = 0; st == UM_EAGAIN && tries < 10000; tries++) {
    st = um_event_query(eb);
    if (st == UM_EAGAIN)
      nanosleep(&(struct timespec){0, 1000000}, NULL);
  }
  cr_assert_eq(st, UM_OK, "%d workers: the pipelined upload did not finish in 10 s (%s): a free waits for the gate",
               workers, um_err_name(st));
  cac_wait_release(eb, UM_OK);
  CAC_OK(um_access_end(b, NULL));
  read_back_and_close(m, b, pin, src, back, n);
}

Test(fakecuda_xfer, a_free_behind_a_gate_waits_for_it) { retire_behind_a_gate(4); }
Test(fakecuda_xfer, a_free_behind_a_gate_waits_for_it_not_the_worker) { retire_behind_a_gate(1); }

/* A free waits for all of the device's work, however long: it does not
 * hold up a watcher's reports meanwhile. a is released behind an upload
 * (pooling off: its retire frees its memory) while five 100 ms downloads
 * run on the other stream; the upload after a's is reported once done,
 * with the downloads still running. */
Test(fakecuda_xfer, a_free_does_not_hold_up_the_watcher) {
  enum { SMALL = 4096, DOWNS = 5 };
  um_manager *m;
  um_device *d;
  um_buffer *a, *c, *src, *pin;
  um_event *ea, *ec, *down[DOWNS];
  unsigned char back[DOWNS][SMALL];
  d = threaded_device("100000", 4, 0, &m);
  a = cac_alloc(m, d, SMALL, UM_DEVICE, 0);
  c = cac_alloc(m, d, SMALL, UM_DEVICE, 0);
  src = cac_alloc(m, d, SMALL, UM_DEVICE, 0);
  pin = cac_alloc(m, d, SMALL, UM_PINNED, 0);
  memset(um_buffer_host_ptr(pin), 0x6B, SMALL);
  CAC_OK(um_copy(a, 0, pin, 0, SMALL, &ea));
  for (int i = 0; i < DOWNS; i++)
    CAC_OK(um_copy_to_host(src, 0, back[i], SMALL, &down[i]));
  CAC_OK(um_copy(c, 0, pin, 0, SMALL, &ec));
  CAC_OK(um_release(a)); /* retires when ea's copy is reported: cuMemFree, ~500 ms */
  um_event_release(ea);
  cac_wait_release(ec, UM_OK);
  cr_assert_eq(um_event_query(down[DOWNS - 1]), UM_EAGAIN,
               "the upload's report waited for the downloads: the watcher freed a's memory");
  for (int i = 0; i < DOWNS; i++)
    cac_wait_release(down[i], UM_OK);
  CAC_OK(um_release(c));
  CAC_OK(um_release(src));
  CAC_OK(um_release(pin));
  fc_destroy(m, UM_OK);
}

/* Four threads each queue uploads and downloads with events on buffers of
 * their own, drop every event and buffer at once, and the manager is
 * destroyed while the copies still run (5 ms each on the fake's stream
 * threads): the watchers finish them, the buffers retire on the watcher
 * threads as their last copy is reported, the destroy waits for all of it,
 * and everything made in the driver is given back. */
typedef struct inflight_thread {
  um_manager *m;
  um_device *d;
  int status;
} inflight_thread;

static void *queue_and_drop(void *arg) {
  inflight_thread *t = arg;
  enum { N = 16, SIZE = 16384 };
  um_buffer *dev = NULL, *pin = NULL;
  t->status = um_alloc(t->m, t->d, (size_t)N * SIZE, UM_DEVICE, 0, &dev);
  if (t->status == UM_OK)
    t->status = um_alloc(t->m, t->d, (size_t)N * SIZE, UM_PINNED, 0, &pin);
  for (int i = 0; i < N && t->status == UM_OK; i++) {
    um_event *up = NULL, *down = NULL;
    size_t off = (size_t)i * SIZE;
    t->status = um_copy(dev, off, pin, off, SIZE, &up);
    if (t->status == UM_OK)
      t->status = um_copy(pin, off, dev, off, SIZE, &down);
    if (up != NULL)
      um_event_release(up);
    if (down != NULL)
      um_event_release(down);
  }
  if (dev != NULL && um_release(dev) != UM_OK)
    t->status = UM_EINVAL;
  if (pin != NULL && um_release(pin) != UM_OK)
    t->status = UM_EINVAL;
  return NULL;
}

Test(fakecuda_xfer, destroy_while_the_watchers_finish_copies) {
  um_manager *m = threaded_manager("5000");
  inflight_thread t[4];
  pthread_t th[4];
  for (int i = 0; i < 4; i++) {
    t[i] = (inflight_thread){.m = m, .d = fc_dev(m, 0), .status = UM_OK};
    cr_assert_eq(pthread_create(&th[i], NULL, queue_and_drop, &t[i]), 0);
  }
  for (int i = 0; i < 4; i++) {
    pthread_join(th[i], NULL);
    cr_assert_eq(t[i].status, UM_OK, "thread %d: %s (%s)", i, um_err_name(t[i].status), um_last_error());
  }
  cr_assert_gt(fc_count("queued_ops"), 0, "the copies were to be still running at the destroy");
  fc_destroy(m, UM_OK);
}

/* ------------------------------------------------------------------------ */
/* Batches and streaming */

Test(fakecuda_xfer, batch_across_devices_and_locations) {
  um_manager *m;
  um_device *a, *b;
  const size_t n = 2 * CAC_CHUNK + 9;
  unsigned char *src = cac_xmalloc(n), *back1 = cac_xmalloc(n), *back2 = cac_xmalloc(n);
  um_buffer *x, *y, *p, *h;
  um_copy_op ops[5];
  um_event *e;
  fc_env(UM_FAKE_CUDA_FULL);
  fc_set("FAKE_CUDA_DEVICE_COUNT", "2");
  fc_set("FAKE_CUDA_STREAM_THREADS", "1");
  m = fc_default();
  a = fc_dev(m, 0);
  b = fc_dev(m, 1);
  x = cac_alloc(m, a, n, UM_DEVICE, 0);
  y = cac_alloc(m, b, n, UM_DEVICE, 0);
  p = cac_alloc(m, a, n, UM_PINNED, 0);
  h = cac_alloc(m, um_device_get(m, 0), n, UM_HOST, 0);
  ut_pattern(src, n, 17);
  ops[0] = (um_copy_op){.dst = x, .host_src = src, .bytes = n};
  ops[1] = (um_copy_op){.dst = y, .src = x, .bytes = n};
  ops[2] = (um_copy_op){.dst = p, .src = y, .bytes = n};
  ops[3] = (um_copy_op){.dst = h, .src = p, .bytes = n};
  ops[4] = (um_copy_op){.host_dst = back1, .src = y, .bytes = n};
  CAC_OK(um_copy_batch(m, ops, 5, &e));
  cac_wait_release(e, UM_OK);
  cr_assert_arr_eq(back1, src, n);
  cr_assert_arr_eq(um_buffer_host_ptr(p), src, n);
  cr_assert_arr_eq(um_buffer_host_ptr(h), src, n);
  ops[0] = (um_copy_op){.dst = x, .dst_off = 1, .src = y, .bytes = n - 1};
  ops[1] = (um_copy_op){.host_dst = back2, .src = x, .bytes = n};
  CAC_OK(um_copy_batch(m, ops, 2, NULL));
  cr_assert_eq(back2[0], src[0]);
  cr_assert_arr_eq(back2 + 1, src, n - 1);
  CAC_OK(um_release(x));
  CAC_OK(um_release(y));
  CAC_OK(um_release(p));
  CAC_OK(um_release(h));
  free(src);
  free(back1);
  free(back2);
  fc_destroy(m, UM_OK);
}

/* A batch's copies go to their kind's stream quietly, one run per stream
 * (op.c): 1000 uploads and 1000 downloads record two events in all (the
 * runs' queue marks), not one per copy; a copy whose buffer an earlier run
 * of the same batch writes on another stream follows it, and reads what it
 * wrote. (The watchers' own blocking-sync events, recorded behind a mark
 * they sleep on, are not the issuing thread's and are counted apart.) */
Test(fakecuda_xfer, batch_copies_go_in_one_run_per_stream) {
  um_manager *m = threaded_manager("0");
  um_device *d = fc_dev(m, 0);
  enum { N = 1000, SIZE = 4096 };
  um_buffer *dev = cac_alloc(m, d, (size_t)N * SIZE, UM_DEVICE, 0);
  um_buffer *dev2 = cac_alloc(m, d, (size_t)N * SIZE, UM_DEVICE, 0);
  um_buffer *pin = cac_alloc(m, d, (size_t)N * SIZE, UM_PINNED, 0);
  um_buffer *back = cac_alloc(m, d, (size_t)N * SIZE, UM_PINNED, 0);
  unsigned char *want = cac_xmalloc((size_t)N * SIZE);
  um_copy_op *ops = calloc(2 * N + 1, sizeof(*ops));
  um_stats s0, s1;
  long records;
  cr_assert_not_null(ops);
  ut_pattern(want, (size_t)N * SIZE, 29);
  memcpy(um_buffer_host_ptr(pin), want, (size_t)N * SIZE);
  CAC_OK(um_fill(dev2, 0, 0x3C, (size_t)N * SIZE, NULL));
  for (int i = 0; i < N; i++) {
    ops[i] = (um_copy_op){.dst = dev, .dst_off = (size_t)i * SIZE, .src = pin, .src_off = (size_t)i * SIZE,
                          .bytes = SIZE};
    ops[N + i] = (um_copy_op){.dst = back, .dst_off = (size_t)i * SIZE, .src = dev2,
                              .src_off = (size_t)i * SIZE, .bytes = SIZE};
  }
  s0 = ut_stats(m, d);
  records = fc_count("event_records");
  CAC_OK(um_copy_batch(m, ops, 2 * N, NULL));
  records = fc_count("event_records") - records;
  cr_assert_eq(records, 2, "%ld events recorded for two runs of %d copies", records, N);
  s1 = ut_stats(m, d);
  cr_assert_eq(s1.xfer_direct - s0.xfer_direct, 2 * N);
  cr_assert_eq(s1.bytes_h2d - s0.bytes_h2d, (uint64_t)N * SIZE);
  cr_assert_eq(s1.bytes_d2h - s0.bytes_d2h, (uint64_t)N * SIZE);
  for (size_t i = 0; i < (size_t)N * SIZE; i++)
    cr_assert_eq(((unsigned char *)um_buffer_host_ptr(back))[i], 0x3C, "byte %zu", i);

  /* Uploads into dev2, then the download of what they wrote: the download
   * follows the upload run (another stream) and sees its bytes. */
  for (int i = 0; i < N; i++)
    ops[i].dst = dev2;
  ops[N] = (um_copy_op){.dst = back, .src = dev2, .bytes = (size_t)N * SIZE};
  CAC_OK(um_copy_batch(m, ops, N + 1, NULL));
  cr_assert_arr_eq(um_buffer_host_ptr(back), want, (size_t)N * SIZE);
  CAC_OK(um_release(dev));
  CAC_OK(um_release(dev2));
  CAC_OK(um_release(pin));
  CAC_OK(um_release(back));
  free(ops);
  free(want);
  fc_destroy(m, UM_OK);
}

typedef struct stream_check {
  const unsigned char *src;
  size_t next;
  int chunks;
} stream_check;

static int stream_chunk(void *user, um_buffer *chunk, size_t offset, size_t bytes) {
  stream_check *c = user;
  unsigned char *back = malloc(bytes);
  int ok;
  if (back == NULL || offset != c->next)
    return 1;
  ok = um_copy_to_host(chunk, 0, back, bytes, NULL) == UM_OK && memcmp(back, c->src + offset, bytes) == 0;
  free(back);
  c->next += bytes;
  c->chunks++;
  return ok ? 0 : 2;
}

Test(fakecuda_xfer, stream_a_host_buffer_through_the_gpu) {
  um_manager *m = threaded_manager("100");
  um_device *d = fc_dev(m, 0);
  const size_t n = 10 * CAC_CHUNK + 5;
  um_buffer *host = cac_alloc(m, um_device_get(m, 0), n, UM_HOST, 0);
  stream_check c = {.src = um_buffer_host_ptr(host)};
  ut_pattern(um_buffer_host_ptr(host), n, 23);
  CAC_OK(um_stream(host, 0, n, d, 3 * CAC_CHUNK, stream_chunk, NULL, &c));
  cr_assert_eq(c.chunks, 4);
  cr_assert_eq(c.next, n);
  CAC_OK(um_release(host));
  fc_destroy(m, UM_OK);
}

/* ------------------------------------------------------------------------ */
/* Driver failures */

/* An entry point that fails when called: the operation answers UM_EBACKEND
 * with the driver's error name, counts nothing, and the buffer goes on. */
Test(fakecuda_xfer, driver_failure_at_issue) {
  um_manager *m;
  um_device *d;
  const size_t n = 4096, big = 3 * CAC_CHUNK;
  unsigned char src[4096], back[4096];
  unsigned char *bigsrc = cac_xmalloc(big);
  um_buffer *b, *c;
  um_stats s0, s1;
  um_event *e;
  fc_env(UM_FAKE_CUDA_FULL);
  fc_set("FAKE_CUDA_FAIL", "cuMemcpyHtoDAsync_v2");
  m = fc_default();
  d = fc_dev(m, 0);
  b = cac_alloc(m, d, big, UM_DEVICE, 0);
  c = cac_alloc(m, d, big, UM_DEVICE, 0);
  ut_pattern(src, n, 2);
  CAC_OK(um_fill(b, 0, 0x77, big, NULL));
  s0 = ut_stats(m, d);
  cr_assert_eq(um_copy_from_host(b, 0, src, n, NULL), UM_EBACKEND);
  cr_assert(strstr(um_last_error(), "cuMemcpyHtoDAsync_v2") != NULL, "%s", um_last_error());
  cr_assert(strstr(um_last_error(), "CUDA_ERROR_UNKNOWN") != NULL, "%s", um_last_error());
  CAC_OK(um_copy_from_host(b, 0, src, n, &e));
  cac_wait_release(e, UM_EBACKEND);
  CAC_OK(um_copy_from_host(b, 0, bigsrc, big, &e)); /* pipelined: its chunks fail */
  cac_wait_release(e, UM_EBACKEND);
  s1 = ut_stats(m, d);
  cr_assert_eq(CAC_DELTA(s1, s0, bytes_h2d), 0);
  cr_assert_eq(CAC_DELTA(s1, s0, xfer_direct) + CAC_DELTA(s1, s0, xfer_pipelined), 0);
  /* Everything else on the buffer works. */
  CAC_OK(um_copy(c, 0, b, 0, big, NULL));
  CAC_OK(um_copy_to_host(c, 0, back, n, NULL));
  cr_assert(ut_all_bytes(back, n, 0x77));
  CAC_OK(um_release(b));
  CAC_OK(um_release(c));
  free(bigsrc);
  fc_destroy(m, UM_OK);
}

/* A fault on the device in the middle of a copy (the stream turns to
 * CUDA_ERROR_LAUNCH_FAILED): that operation's event answers UM_EBACKEND;
 * operations on the other streams and on other buffers complete, the
 * failed copy is not counted, and the manager shuts down cleanly. */
Test(fakecuda_xfer, device_fault_fails_that_operation_only) {
  um_manager *m;
  um_device *d;
  const size_t n = 8192;
  unsigned char src[8192], back[8192], other[8192];
  um_buffer *x, *y, *z;
  um_event *e1, *e2, *e3, *e4;
  um_stats s0, s1;
  fc_env(UM_FAKE_CUDA_FULL);
  fc_set("FAKE_CUDA_STREAM_THREADS", "1");
  fc_set("FAKE_CUDA_OP_DELAY_US", "2000");
  fc_set("FAKE_CUDA_DEVICE_FAULT", "cuMemcpyDtoDAsync_v2");
  m = fc_default();
  d = fc_dev(m, 0);
  x = cac_alloc(m, d, n, UM_DEVICE, 0);
  y = cac_alloc(m, d, n, UM_DEVICE, 0);
  z = cac_alloc(m, d, n, UM_DEVICE, 0);
  ut_pattern(src, n, 6);
  ut_pattern(other, n, 7);
  CAC_OK(um_copy_from_host(x, 0, src, n, NULL));
  CAC_OK(um_copy_from_host(y, 0, other, n, NULL));
  s0 = ut_stats(m, d);
  CAC_OK(um_copy(y, 0, x, 0, n, &e1));            /* faults on the device */
  CAC_OK(um_copy_from_host(z, 0, src, n, &e2));   /* upload stream */
  CAC_OK(um_copy_to_host(x, 0, back, n, &e3));    /* download stream */
  CAC_OK(um_copy_to_host(z, 0, other, n, &e4));
  cac_wait_release(e1, UM_EBACKEND);
  cac_wait_release(e2, UM_OK);
  cac_wait_release(e3, UM_OK);
  cac_wait_release(e4, UM_OK);
  cr_assert_arr_eq(back, src, n);
  cr_assert_arr_eq(other, src, n);
  s1 = ut_stats(m, d);
  cr_assert_eq(CAC_DELTA(s1, s0, bytes_d2d), 0, "the faulted copy is not counted");
  cr_assert_eq(CAC_DELTA(s1, s0, xfer_local), 0);
  cr_assert_eq(CAC_DELTA(s1, s0, bytes_h2d), n);
  cr_assert_eq(CAC_DELTA(s1, s0, bytes_d2h), 2 * n);
  /* The same fault, blocking: the call answers it, with the driver's name
   * for it. */
  cr_assert_eq(um_copy(y, 0, x, 0, n, NULL), UM_EBACKEND);
  cr_assert(strstr(um_last_error(), "CUDA_ERROR_LAUNCH_FAILED") != NULL, "%s", um_last_error());
  /* y's later operations on other streams still run. */
  CAC_OK(um_copy_from_host(y, 0, src, n, NULL));
  CAC_OK(um_copy_to_host(y, 0, back, n, NULL));
  cr_assert_arr_eq(back, src, n);
  CAC_OK(um_release(x));
  CAC_OK(um_release(y));
  CAC_OK(um_release(z));
  fc_destroy(m, UM_OK);
}
