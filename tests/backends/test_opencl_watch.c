/* Completions of many small asynchronous commands on OpenCL (the OpenCL
 * backend's watch list, opencl/watch.c: one completion callback armed at a time
 * per device, each report covering every watched command that has ended).
 * Whatever command the callback was armed on, and whichever thread ran it
 * (PoCL's, or the issuing thread when the command had ended already: the
 * basic device's variant), every event is reported exactly once, with its
 * own status, and not before the commands it follows on its buffer:
 *  - 2000 copies waited for in reverse order;
 *  - events released before their copies ran, then a synchronize;
 *  - four threads issuing and reading back at once;
 *  - batches (whose queue marks hold an event reference of their own)
 *    between single copies;
 *  - large copies (a callback each) between small ones (one callback for
 *    many), waited for in the order of a double-buffered pipeline;
 *  - four threads' copies into one buffer, each range read back on the
 *    caller's queue as soon as its event is done;
 *  - events the caller released: unimem's reference kept for the
 *    device's next walk (released after its reports), at most 1024 at a
 *    time, released by a free of the device's memory and by the close,
 *    each exactly once; a close waits for a walk still releasing. */
#include <CL/cl.h>
#include <pthread.h>

#include "opencl_util.h"

#define SMALL 4096u
#define COUNT 2000

/* 2000 writes of 4 KiB into one buffer, each with an event, waited for last
 * first: once the last is done, every earlier one is (each follows the
 * one before it on the buffer), and the bytes are all there. */
OU_TEST_1_AND_2(opencl_watch, copies_waited_in_reverse) {
  ou_env e = ou_open(NULL, 1);
  size_t n = (size_t)COUNT * SMALL;
  unsigned char *src = ub_malloc(n), *back;
  um_event **ev = ub_malloc(COUNT * sizeof(*ev));
  um_buffer *b = ub_alloc(e.m, e.dev[0], n, UM_DEVICE);
  um_stats before = ut_stats(e.m, e.dev[0]), after;
  ub_pattern(src, n, 5);
  for (int i = 0; i < COUNT; i++)
    cr_assert_eq(um_copy_from_host(b, (size_t)i * SMALL, src + (size_t)i * SMALL, SMALL, &ev[i]), UM_OK, "copy %d: %s",
                 i, um_last_error());
  cr_assert_eq(um_event_wait(ev[COUNT - 1]), UM_OK, "%s", um_last_error());
  for (int i = 0; i < COUNT; i++)
    cr_assert_eq(um_event_query(ev[i]), UM_OK, "copy %d is reported done once the last one is", i);
  for (int i = COUNT - 1; i >= 0; i--)
    ub_wait(ev[i], UM_OK);
  after = ut_stats(e.m, e.dev[0]);
  cr_assert_eq(after.bytes_h2d - before.bytes_h2d, (uint64_t)n);
  back = ub_read_all(b);
  ub_assert_bytes(back, src, n, "2000 watched copies");
  um_release(b);
  free(back), free(ev), free(src);
  ou_close(&e);
}

/* Events released at once, before their copies ran: nobody waits for any
 * of them, and the device's synchronize still sees every copy done. */
OU_TEST_1_AND_2(opencl_watch, events_released_before_their_copies_ran) {
  ou_env e = ou_open(NULL, 1);
  size_t n = (size_t)COUNT * SMALL;
  unsigned char *src = ub_malloc(n), *back;
  um_buffer *b = ub_alloc(e.m, e.dev[0], n, UM_DEVICE);
  ub_pattern(src, n, 9);
  for (int i = 0; i < COUNT; i++) {
    um_event *ev = NULL;
    cr_assert_eq(um_copy_from_host(b, (size_t)i * SMALL, src + (size_t)i * SMALL, SMALL, &ev), UM_OK, "copy %d: %s",
                 i, um_last_error());
    cr_assert_eq(um_event_release(ev), UM_OK);
  }
  cr_assert_eq(um_device_synchronize(e.dev[0]), UM_OK, "%s", um_last_error());
  back = ub_read_all(b);
  ub_assert_bytes(back, src, n, "copies whose events were released at once");
  /* The buffer is idle: its release pools the block at once. */
  cr_assert_eq(um_release(b), UM_OK);
  free(back), free(src);
  ou_close(&e);
}

typedef struct issuer_arg {
  um_manager *m;
  um_device *d;
  unsigned seed;
  int ok;
} issuer_arg;

/* One thread's round trips on a buffer of its own: 250 writes with events
 * and 250 reads with events behind them, every other event released
 * unwaited, the rest waited for in an order of their own. */
static void *issuer(void *p) {
  issuer_arg *a = p;
  enum { K = 250 };
  size_t n = (size_t)K * SMALL;
  unsigned char *src = malloc(n), *back = calloc(1, n);
  um_event *w[K], *r[K];
  um_buffer *b = NULL;
  a->ok = 0;
  if (src == NULL || back == NULL || um_alloc(a->m, a->d, n, UM_DEVICE, 0, &b) != UM_OK)
    goto out;
  ub_pattern(src, n, a->seed);
  for (int i = 0; i < K; i++)
    if (um_copy_from_host(b, (size_t)i * SMALL, src + (size_t)i * SMALL, SMALL, &w[i]) != UM_OK)
      goto out;
  for (int i = 0; i < K; i++)
    if (um_copy_to_host(b, (size_t)i * SMALL, back + (size_t)i * SMALL, SMALL, &r[i]) != UM_OK)
      goto out;
  a->ok = 1;
  for (int i = 0; i < K; i++) {
    int k = (int)((unsigned)(i * 97 + (int)a->seed) % K);
    if (i % 2 == 0 && um_event_wait(r[k]) != UM_OK)
      a->ok = 0;
  }
  for (int i = 0; i < K; i++) {
    if (um_event_wait(w[i]) != UM_OK)
      a->ok = 0;
    um_event_release(w[i]);
  }
  for (int i = 0; i < K; i++) {
    if (um_event_wait(r[i]) != UM_OK)
      a->ok = 0;
    um_event_release(r[i]);
  }
  if (memcmp(back, src, n) != 0)
    a->ok = 0;
out:
  if (b != NULL)
    um_release(b);
  free(src), free(back);
  return NULL;
}

OU_TEST_1_AND_2(opencl_watch, four_threads_at_once) {
  ou_env e = ou_open(NULL, 1);
  pthread_t t[4];
  issuer_arg a[4];
  for (int i = 0; i < 4; i++) {
    a[i] = (issuer_arg){e.m, e.dev[i % e.ndev], 40u + (unsigned)i, 0};
    cr_assert_eq(pthread_create(&t[i], NULL, issuer, &a[i]), 0);
  }
  for (int i = 0; i < 4; i++) {
    pthread_join(t[i], NULL);
    cr_assert(a[i].ok, "thread %d saw a failed operation or wrong bytes", i);
  }
  ou_close(&e);
}

/* Batches between single copies with events: a batch's copies go out with
 * no event of their own and one queue mark behind them, whose event the
 * backend holds a reference on itself (the core does not keep the mark's
 * token); the single copies' events are the core's. All on one queue,
 * reported through one list. */
OU_TEST_1_AND_2(opencl_watch, batches_between_single_copies) {
  enum { ROUNDS = 20, PER = 50 };
  ou_env e = ou_open(NULL, 1);
  size_t n = (size_t)ROUNDS * (PER + 1) * SMALL;
  unsigned char *src = ub_malloc(n), *back;
  um_buffer *b = ub_alloc(e.m, e.dev[0], n, UM_DEVICE);
  um_copy_op ops[PER];
  um_event *single[ROUNDS], *batch[ROUNDS];
  size_t off = 0;
  ub_pattern(src, n, 13);
  for (int r = 0; r < ROUNDS; r++) {
    for (int i = 0; i < PER; i++, off += SMALL)
      ops[i] = (um_copy_op){.dst = b, .dst_off = off, .host_src = src + off, .bytes = SMALL};
    cr_assert_eq(um_copy_batch(e.m, ops, PER, &batch[r]), UM_OK, "batch %d: %s", r, um_last_error());
    cr_assert_eq(um_copy_from_host(b, off, src + off, SMALL, &single[r]), UM_OK, "%s", um_last_error());
    off += SMALL;
  }
  for (int r = ROUNDS - 1; r >= 0; r--) {
    ub_wait(single[r], UM_OK);
    ub_wait(batch[r], UM_OK);
  }
  back = ub_read_all(b);
  ub_assert_bytes(back, src, n, "batches and single copies");
  um_release(b);
  free(back), free(src);
  ou_close(&e);
}

/* Large copies (64 KiB and more: a callback of their own) between small
 * ones (the lazy callback): a pipeline that issues copy k + 1 before it
 * waits for copy k, into two halves of a buffer, then reads both back. */
OU_TEST_1_AND_2(opencl_watch, large_copies_between_small_ones) {
  enum { ROUNDS = 24, BIG = 256 * 1024 };
  ou_env e = ou_open(NULL, 1);
  size_t n = (size_t)ROUNDS * (BIG + SMALL);
  unsigned char *src = ub_malloc(n), *back;
  um_buffer *b = ub_alloc(e.m, e.dev[0], n, UM_DEVICE);
  um_event *big[ROUNDS], *small[ROUNDS];
  size_t off = 0;
  ub_pattern(src, n, 21);
  for (int r = 0; r < ROUNDS; r++) {
    cr_assert_eq(um_copy_from_host(b, off, src + off, BIG, &big[r]), UM_OK, "%s", um_last_error());
    off += BIG;
    cr_assert_eq(um_copy_from_host(b, off, src + off, SMALL, &small[r]), UM_OK, "%s", um_last_error());
    off += SMALL;
    if (r > 0) {
      ub_wait(big[r - 1], UM_OK);
      ub_wait(small[r - 1], UM_OK);
    }
  }
  ub_wait(small[ROUNDS - 1], UM_OK);
  cr_assert_eq(um_event_query(big[ROUNDS - 1]), UM_OK, "the large copy before the last small one is done");
  ub_wait(big[ROUNDS - 1], UM_OK);
  back = ub_read_all(b);
  ub_assert_bytes(back, src, n, "large and small copies");
  um_release(b);
  free(back), free(src);
  ou_close(&e);
}

/* An event reported done means its bytes are in the buffer, as another
 * queue sees them: four threads put small copies into their own quarters
 * of one buffer (one device queue, the threads racing for its order lock:
 * entries listed with it and without it mixed, the walks reporting the
 * entries before a completed one without asking the driver), wait for
 * their events in an order of their own, and read each range back on the
 * caller's queue (um_device_native), which nothing orders behind unimem's
 * copies. A report that came before its command ran reads stale bytes. */
/* 32 KiB: under WATCH_OWN_BYTES (the lazy callback's kind), and long
 * enough on PoCL that a report ahead of its command would be seen. */
enum { SEEN_PER = 200, SEEN_BYTES = 32 * 1024 };

typedef struct seen_arg {
  um_buffer *b;
  cl_command_queue q;
  cl_mem mem;
  size_t base; /* the thread's quarter */
  unsigned seed;
  int bad;     /* ranges read back wrong, or failed calls */
} seen_arg;

static void *seen_writer(void *p) {
  seen_arg *a = p;
  size_t n = (size_t)SEEN_PER * SEEN_BYTES;
  unsigned char *src = malloc(n), *back = malloc(SEEN_BYTES);
  um_event **ev = calloc(SEEN_PER, sizeof(*ev));
  if (src == NULL || back == NULL || ev == NULL) {
    a->bad = -1;
    goto out;
  }
  ub_pattern(src, n, a->seed);
  for (int i = 0; i < SEEN_PER; i++)
    if (um_copy_from_host(a->b, a->base + (size_t)i * SEEN_BYTES, src + (size_t)i * SEEN_BYTES, SEEN_BYTES, &ev[i]) != UM_OK)
      a->bad++;
  for (int j = 0; j < SEEN_PER; j++) {
    int i = (int)(((unsigned)j * 151u + a->seed) % SEEN_PER);
    if (ev[i] == NULL || um_event_wait(ev[i]) != UM_OK) {
      a->bad++;
      continue;
    }
    if (clEnqueueReadBuffer(a->q, a->mem, CL_TRUE, a->base + (size_t)i * SEEN_BYTES, SEEN_BYTES, back, 0, NULL, NULL) !=
            CL_SUCCESS ||
        memcmp(back, src + (size_t)i * SEEN_BYTES, SEEN_BYTES) != 0)
      a->bad++;
  }
  for (int i = 0; i < SEEN_PER; i++)
    if (ev[i] != NULL)
      um_event_release(ev[i]);
out:
  free(src), free(back), free(ev);
  return NULL;
}

OU_TEST_1_AND_2(opencl_watch, done_events_bytes_seen_from_another_queue) {
  const char *kind = getenv("UNIMEM_TEST_POCL_DEVICE");
  if (kind != NULL && strcmp(kind, "basic") == 0)
    cr_skip_test("SKIP: PoCL's basic device runs commands inside the submitting call; the caller's reads on "
                 "another queue, submitted by four threads outside unimem's submit lock, deadlock in PoCL 3.1 "
                 "(opencl/devices.c: submit_lock)");
  ou_env e = ou_open(NULL, 1);
  size_t quarter = (size_t)SEEN_PER * SEEN_BYTES;
  um_buffer *b = ub_alloc(e.m, e.dev[0], 4 * quarter, UM_DEVICE);
  um_device_native nat;
  um_buffer_native bn;
  pthread_t t[4];
  seen_arg a[4];
  cr_assert_eq(um_device_native_get(e.dev[0], &nat), UM_OK);
  cr_assert_eq(um_buffer_native_get(b, &bn), UM_OK);
  cr_assert_not_null(nat.cl_queue);
  cr_assert_not_null(bn.cl_mem);
  for (int r = 0; r < 3; r++) {
    for (int i = 0; i < 4; i++) {
      a[i] = (seen_arg){b, (cl_command_queue)nat.cl_queue, (cl_mem)bn.cl_mem, bn.offset + (size_t)i * quarter,
                        (unsigned)(60 + 4 * r + i), 0};
      cr_assert_eq(pthread_create(&t[i], NULL, seen_writer, &a[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
      pthread_join(t[i], NULL);
      cr_assert_eq(a[i].bad, 0, "round %d, thread %d: %d ranges read back wrong after their events were done", r, i,
                   a[i].bad);
    }
  }
  um_release(b);
  ou_close(&e);
}

/* ------------------------------------------------------------------------ */
/* Released events: unimem's last reference on a finished copy's cl_event,
 * put on the caller's thread, is left to the device's next walk (on the
 * driver's callback thread, after the walk's reports), at most 1024 of
 * them per device; freeing device memory and closing the device release
 * them too (opencl/transfers.c, um__ocl_native_release). Seen at the test point where the backend releases
 * its reference; the test holds a reference of its own on each event, so
 * that no two of them share an address. */

#define KEPT_MAX 1024

static struct {
  pthread_mutex_t lock;
  cl_event ev[8192];
  int n;
  cl_event slow;   /* its release, on a thread other than test, sleeps */
  pthread_t test;
  int slow_entered, slow_done; /* that release went into the hook's sleep, came out */
  int on_test;                 /* releases on the test's thread */
} released = {PTHREAD_MUTEX_INITIALIZER, {0}, 0, NULL, 0, 0, 0, 0};

static void released_hook(um__test_point point, void *arg) {
  bool slow;
  if (point != UM__TP_TOKEN_RELEASED)
    return;
  pthread_mutex_lock(&released.lock);
  if (released.n < (int)(sizeof(released.ev) / sizeof(released.ev[0])))
    released.ev[released.n++] = arg;
  slow = arg == released.slow && !pthread_equal(pthread_self(), released.test);
  released.slow_entered |= slow;
  released.on_test += pthread_equal(pthread_self(), released.test) != 0;
  pthread_mutex_unlock(&released.lock);
  if (slow) {
    struct timespec t = {0, 200 * 1000 * 1000};
    nanosleep(&t, NULL);
    pthread_mutex_lock(&released.lock);
    released.slow_done = 1;
    pthread_mutex_unlock(&released.lock);
  }
}

static void released_watch(void) {
  pthread_mutex_lock(&released.lock);
  released.n = 0;
  released.slow = NULL;
  released.slow_entered = released.slow_done = released.on_test = 0;
  released.test = pthread_self();
  pthread_mutex_unlock(&released.lock);
  atomic_store(&um__test_hook, released_hook);
}

/* How many times unimem released its reference on ev so far. */
static int released_times(cl_event ev) {
  int k = 0;
  pthread_mutex_lock(&released.lock);
  for (int i = 0; i < released.n; i++)
    k += released.ev[i] == ev;
  pthread_mutex_unlock(&released.lock);
  return k;
}

/* The same, once it has reached want or after five seconds: a walk
 * releases the events it took after the reports a wait returns on. */
static int released_times_reach(cl_event ev, int want) {
  int k = 0;
  for (int i = 0; i < 5000 && (k = released_times(ev)) < want; i++) {
    struct timespec ms = {0, 1000000};
    nanosleep(&ms, NULL);
  }
  return k;
}

/* Wait for ev, then for the operation's end to be through the core (its
 * own share of the token put: a wait returns once the copy is done, and
 * the walk that reported it puts that share just after), so that the
 * release that follows puts unimem's last reference. */
static void wait_all_through(um_event *ev, um_device *d) {
  if (ev != NULL)
    cr_assert_eq(um_event_wait(ev), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_device_synchronize(d), UM_OK, "%s", um_last_error());
}

/* A copy of 4 KiB into b at off with an event; its cl_event, retained for
 * the test. */
static um_event *copy_seen(um_buffer *b, size_t off, const unsigned char *src, cl_event *cl) {
  um_event *ev;
  void *native = NULL;
  cr_assert_eq(um_copy_from_host(b, off, src, SMALL, &ev), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_event_native(ev, &native), UM_OK, "%s", um_last_error());
  cr_assert_not_null(native);
  *cl = (cl_event)native;
  cr_assert_eq(clRetainEvent(*cl), CL_SUCCESS);
  return ev;
}

/* A copy with an event (its cl_event retained for the test), waited for
 * through the core and released: its event is kept for the next walk. */
static void copy_kept(um_buffer *b, size_t off, const unsigned char *src, cl_event *cl, um_device *d) {
  um_event *ev = copy_seen(b, off, src, cl);
  wait_all_through(ev, d);
  um_event_release(ev);
}

OU_TEST_1_AND_2(opencl_watch, released_event_goes_with_the_next_walk) {
  ou_env e = ou_open(NULL, 1);
  unsigned char src[SMALL];
  um_buffer *b = ub_alloc(e.m, e.dev[0], 2 * SMALL, UM_DEVICE);
  cl_event first, second;
  um_event *ev;
  released_watch();
  ub_pattern(src, SMALL, 21);
  ev = copy_seen(b, 0, src, &first);
  wait_all_through(ev, e.dev[0]);
  cr_assert_eq(released_times(first), 0, "released while the caller still holds the event");
  um_event_release(ev);
  cr_assert_eq(released_times(first), 0, "a released event is kept until the device's next walk");
  ev = copy_seen(b, SMALL, src, &second);
  cr_assert_eq(um_event_wait(ev), UM_OK, "%s", um_last_error());
  cr_assert_eq(released_times_reach(first, 1), 1, "the walk that reported the next copy released the kept event");
  wait_all_through(NULL, e.dev[0]);
  um_event_release(ev);
  cr_assert_eq(released_times(second), 0, "the second event is kept");
  um_release(b);
  ou_close(&e);
  cr_assert_eq(released_times(second), 1, "the device's close released the event it kept");
  cr_assert_eq(released_times(first), 1, "released once");
  atomic_store(&um__test_hook, NULL);
  clReleaseEvent(first);
  clReleaseEvent(second);
}

/* 2100 finished copies' events released in a row with no walk between
 * them: at most 1024 are kept at a time (the 1025th release takes the
 * 1024 with it, on the releasing thread), and the close releases the
 * rest; each once. */
OU_TEST_1_AND_2(opencl_watch, released_events_kept_at_most_1024) {
  enum { N = 2100 };
  ou_env e = ou_open(NULL, 1);
  unsigned char *src = ub_malloc((size_t)N * SMALL);
  um_buffer *b = ub_alloc(e.m, e.dev[0], (size_t)N * SMALL, UM_DEVICE);
  um_event **ev = ub_malloc(N * sizeof(*ev));
  cl_event *cl = ub_malloc(N * sizeof(*cl));
  int kept = 0, stay = N % (KEPT_MAX + 1), on_test;
  released_watch();
  ub_pattern(src, (size_t)N * SMALL, 22);
  for (int i = 0; i < N; i++)
    ev[i] = copy_seen(b, (size_t)i * SMALL, src + (size_t)i * SMALL, &cl[i]);
  for (int i = 0; i < N; i++)
    cr_assert_eq(um_event_wait(ev[i]), UM_OK, "copy %d: %s", i, um_last_error());
  wait_all_through(NULL, e.dev[0]);
  for (int i = 0; i < N; i++) {
    cr_assert_eq(released_times(cl[i]), 0, "event %d released while the caller holds it", i);
    um_event_release(ev[i]);
  }
  for (int i = 0; i < N; i++) {
    int times = released_times(cl[i]);
    cr_assert_eq(times, i < N - stay ? 1 : 0, "event %d of %d released in a row: released %d times", i, N, times);
    kept += times == 0;
  }
  pthread_mutex_lock(&released.lock);
  on_test = released.on_test;
  pthread_mutex_unlock(&released.lock);
  cr_assert_eq(kept, stay);
  cr_assert_eq(on_test, N - stay, "the full lists went with the releases that found them full, on the releasing thread");
  um_release(b);
  ou_close(&e);
  for (int i = 0; i < N; i++)
    cr_assert_eq(released_times(cl[i]), 1, "event %d: released %d times by the close", i, released_times(cl[i]));
  atomic_store(&um__test_hook, NULL);
  for (int i = 0; i < N; i++)
    clReleaseEvent(cl[i]);
  free(cl), free(ev), free(src);
}

/* The manager destroyed while a walk still releases the events it took
 * (its reports done): the close waits for it. The second copy is held
 * behind a user event of the test's (an access bracket ended with it), so
 * that its callback is armed before it runs and its walk runs on PoCL's
 * thread, where the walk's release of the kept event sleeps 200 ms in
 * the test point. */
OU_TEST_1_AND_2(opencl_watch, close_waits_for_a_walk_releasing) {
  if (strcmp(ou_pocl_kind(), "basic") == 0)
    cr_skip_test("SKIP: PoCL's basic device runs the held copy inside clSetUserEventStatus, on the test's thread: "
                 "there is no walk on another thread to race (and PoCL 3.1 deadlocks on its own event lock when "
                 "the bracket's join completes its user event inside that call)");
  ou_env e = ou_open(NULL, 1);
  unsigned char src[SMALL];
  um_buffer *b = ub_alloc(e.m, e.dev[0], 2 * SMALL, UM_DEVICE);
  um_device_native nat;
  cl_event first, second, hold;
  cl_int err;
  void *wait = NULL;
  int entered, done;
  um_event *ev;
  released_watch();
  ub_pattern(src, SMALL, 24);
  copy_kept(b, 0, src, &first, e.dev[0]);
  pthread_mutex_lock(&released.lock);
  released.slow = first;
  pthread_mutex_unlock(&released.lock);
  cr_assert_eq(um_device_native_get(e.dev[0], &nat), UM_OK);
  hold = clCreateUserEvent((cl_context)nat.cl_context, &err);
  cr_assert_eq(err, CL_SUCCESS);
  cr_assert_eq(um_access_begin(b, UM_MAP_READ_WRITE, &wait), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_access_end(b, hold), UM_OK, "%s", um_last_error());
  ev = copy_seen(b, SMALL, src, &second);
  cr_assert_eq(um_event_query(ev), UM_EAGAIN, "the copy waits for the test's user event");
  cr_assert_eq(clSetUserEventStatus(hold, CL_COMPLETE), CL_SUCCESS);
  ub_wait(ev, UM_OK);
  um_release(b);
  ou_close(&e);
  pthread_mutex_lock(&released.lock);
  entered = released.slow_entered;
  done = released.slow_done;
  pthread_mutex_unlock(&released.lock);
  cr_assert(entered, "the walk of the held copy did not release the kept event on PoCL's thread");
  cr_assert(!entered || done, "the close returned while a walk was still releasing the events it took");
  cr_assert_eq(released_times(first), 1, "the kept event was released once");
  cr_assert_eq(released_times(second), 1, "the close released the second event");
  atomic_store(&um__test_hook, NULL);
  clReleaseEvent(hold);
  clReleaseEvent(first);
  clReleaseEvent(second);
}

/* Device memory freed (a trim) releases the kept events first: nothing of
 * unimem's outlives the memory its commands used. */
OU_TEST_1_AND_2(opencl_watch, memory_freed_releases_kept_events) {
  ou_env e = ou_open(NULL, 1);
  unsigned char src[SMALL];
  um_buffer *b = ub_alloc(e.m, e.dev[0], SMALL, UM_DEVICE);
  cl_event cl;
  released_watch();
  ub_pattern(src, SMALL, 23);
  copy_kept(b, 0, src, &cl, e.dev[0]);
  cr_assert_eq(released_times(cl), 0, "kept until a walk");
  um_release(b);
  cr_assert_eq(um_pool_trim(e.m, 0), UM_OK, "%s", um_last_error());
  cr_assert_eq(released_times(cl), 1, "the trim's free released the kept event");
  ou_close(&e);
  cr_assert_eq(released_times(cl), 1, "released once");
  atomic_store(&um__test_hook, NULL);
  clReleaseEvent(cl);
}
