/* Low-latency waits (um_options.wait_spin_ns) seen from inside: a waiter
 * polls before it sleeps, and only then. The polls are counted through the
 * test build's hook (testhook.h: UM__TP_WAIT_POLL), never from timing: with
 * the option at 0 nothing polls at all, an idle manager never polls
 * whatever the option says, and a spinning wait still returns exact data,
 * a cancellation and a failure.
 *
 * Operations are held where needed by a gate at UM__TP_WORKER_RUN: the
 * worker that starts the first operation waits there until the test opens
 * it, so "the wait began while the operation was pending" is certain.
 * conformance/test_wait_spin.c checks the bytes of spinning waits on every
 * profile's device (batches among them), through the public API alone. */
#include <pthread.h>
#include <time.h>

#include "fault_backend.h"
#include "test_util.h"
#include "testhook.h"

#define KiB 1024u
#define MiB (1024u * KiB)

static atomic_int polls;       /* UM__TP_WAIT_POLL calls */
static atomic_bool gate_armed; /* the next worker to start an op waits */
static atomic_bool gate_held;  /* a worker waits at the gate now */
static atomic_bool gate_open;

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static void hook(um__test_point point, void *arg) {
  (void)arg;
  if (point == UM__TP_WAIT_POLL) {
    atomic_fetch_add(&polls, 1);
  } else if (point == UM__TP_WORKER_RUN) {
    bool armed = true;
    if (!atomic_compare_exchange_strong(&gate_armed, &armed, false))
      return;
    atomic_store(&gate_held, true);
    while (!atomic_load(&gate_open))
      sleep_ms(1);
  }
}

static void hooks_on(void) {
  atomic_store(&polls, 0);
  atomic_store(&gate_armed, false);
  atomic_store(&gate_held, false);
  atomic_store(&gate_open, false);
  atomic_store(&um__test_hook, hook);
}

static void hooks_off(void) { atomic_store(&um__test_hook, NULL); }

TestSuite(wait, .init = hooks_on, .fini = hooks_off);

static um_manager *spin_manager(uint32_t spin_ns) {
  um_options o;
  um_manager *m = NULL;
  ut_options(&o);
  o.wait_spin_ns = spin_ns;
  o.max_concurrent_transfers = 1;
  cr_assert_eq(um_manager_create(&o, &m), UM_OK, "%s", um_last_error());
  return m;
}

/* The first operation a worker starts from now on waits at the gate;
 * returns once a worker is there. */
static void gate_arm(void) { atomic_store(&gate_armed, true); }

static void gate_wait_held(void) {
  for (int i = 0; i < 10000 && !atomic_load(&gate_held); i++)
    sleep_ms(1);
  cr_assert(atomic_load(&gate_held), "no worker reached the gate in 10 s");
}

/* Opens the gate from another thread after the test's thread has begun to
 * wait (the delay only has to let the wait start; a late wait is still
 * correct, it just polls less). */
static void *open_later(void *arg) {
  sleep_ms((int)(intptr_t)arg);
  atomic_store(&gate_open, true);
  return NULL;
}

/* A copy too large to run inline (path.c: 256 KiB), so that it goes to a
 * worker and is held at the gate; the wait that follows sees it pending. */
static void held_copy_wait(uint32_t spin_ns, int *polls_seen) {
  const size_t n = 1 * MiB;
  um_manager *m = spin_manager(spin_ns);
  um_device *cpu = um_device_get(m, 0);
  unsigned char *src = malloc(n), *back = malloc(n);
  um_buffer *b;
  um_event *e;
  pthread_t opener;
  cr_assert(src != NULL && back != NULL);
  ut_pattern(src, n, 41);
  cr_assert_eq(um_alloc(m, cpu, n, UM_HOST, 0, &b), UM_OK);
  gate_arm();
  cr_assert_eq(um_copy_from_host(b, 0, src, n, &e), UM_OK);
  gate_wait_held();
  atomic_store(&polls, 0);
  cr_assert_eq(pthread_create(&opener, NULL, open_later, (void *)(intptr_t)50), 0);
  cr_assert_eq(um_event_query(e), UM_EAGAIN, "the copy is held at the gate");
  cr_assert_eq(um_event_wait(e), UM_OK);
  *polls_seen = atomic_load(&polls);
  pthread_join(opener, NULL);
  cr_assert_eq(um_event_query(e), UM_OK);
  cr_assert_eq(um_event_release(e), UM_OK);
  cr_assert_eq(um_copy_to_host(b, 0, back, n, NULL), UM_OK);
  cr_assert_arr_eq(back, src, n, "the bytes came back changed");
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
  free(src);
  free(back);
}

/* The default: a pending wait goes to sleep without a single poll. */
Test(wait, spin_zero_never_polls, .timeout = 60) {
  int seen = -1;
  held_copy_wait(0, &seen);
  cr_assert_eq(seen, 0, "a wait with wait_spin_ns 0 polled %d times", seen);
}

/* With a budget: the wait polls, then (the copy held 50 ms, the budget
 * 1 ms) sleeps, and the data is exact either way. */
Test(wait, spin_polls_then_sleeps, .timeout = 60) {
  int seen = -1;
  held_copy_wait(1000000, &seen);
  cr_assert_gt(seen, 0, "a wait with wait_spin_ns 1 ms never polled");
}

/* A budget longer than the operation: the wait ends inside the spin. */
Test(wait, spin_sees_completion, .timeout = 60) {
  int seen = -1;
  held_copy_wait(UM__WAIT_SPIN_MAX_NS, &seen);
  cr_assert_gt(seen, 0);
}

/* An idle manager never polls, however long the budget: spinning belongs
 * to waits only. Nor does an operation nobody waits for. */
Test(wait, idle_manager_never_polls, .timeout = 60) {
  um_manager *m = spin_manager(UM__WAIT_SPIN_MAX_NS);
  um_device *cpu = um_device_get(m, 0);
  unsigned char *src = malloc(MiB);
  um_buffer *b;
  um_event *e;
  cr_assert_not_null(src);
  ut_pattern(src, MiB, 5);
  cr_assert_eq(um_alloc(m, cpu, MiB, UM_HOST, 0, &b), UM_OK);
  cr_assert_eq(um_copy_from_host(b, 0, src, MiB, &e), UM_OK);
  while (um_event_query(e) == UM_EAGAIN)
    sleep_ms(1);
  cr_assert_eq(um_event_query(e), UM_OK);
  sleep_ms(100);
  cr_assert_eq(atomic_load(&polls), 0, "%d polls with no wait", atomic_load(&polls));
  /* a wait on a finished operation returns without polling */
  cr_assert_eq(um_event_wait(e), UM_OK);
  cr_assert_eq(atomic_load(&polls), 0);
  cr_assert_eq(um_event_release(e), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
  free(src);
}

/* A blocking copy behind a held one waits for it (op.c: a blocking
 * operation waits for its dependencies) by spinning, and both land. */
Test(wait, blocking_copy_behind_a_pending_one, .timeout = 60) {
  const size_t n = 1 * MiB;
  um_manager *m = spin_manager(1000000);
  um_device *cpu = um_device_get(m, 0);
  unsigned char *src = malloc(n), *back = malloc(n), small[4096];
  um_buffer *b;
  um_event *e;
  pthread_t opener;
  cr_assert(src != NULL && back != NULL);
  ut_pattern(src, n, 7);
  memset(small, 0x5a, sizeof(small));
  cr_assert_eq(um_alloc(m, cpu, n, UM_HOST, 0, &b), UM_OK);
  gate_arm();
  cr_assert_eq(um_copy_from_host(b, 0, src, n, &e), UM_OK);
  gate_wait_held();
  atomic_store(&polls, 0);
  cr_assert_eq(pthread_create(&opener, NULL, open_later, (void *)(intptr_t)20), 0);
  /* blocking, after the held copy on the same buffer */
  cr_assert_eq(um_copy_from_host(b, 4096, small, sizeof(small), NULL), UM_OK);
  cr_assert_gt(atomic_load(&polls), 0, "the blocking copy waited without polling");
  cr_assert_eq(um_event_query(e), UM_OK, "the blocking copy returned before the one it follows");
  pthread_join(opener, NULL);
  memcpy(src + 4096, small, sizeof(small));
  cr_assert_eq(um_copy_to_host(b, 0, back, n, NULL), UM_OK);
  cr_assert_arr_eq(back, src, n);
  cr_assert_eq(um_event_release(e), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
  free(src);
  free(back);
}

/* A canceled operation, waited for with a spin, answers UM_ECANCELED; the
 * one it was queued behind still lands, and so does the one after it. */
Test(wait, spin_and_cancel, .timeout = 60) {
  const size_t n = 1 * MiB;
  um_manager *m = spin_manager(1000000);
  um_device *cpu = um_device_get(m, 0);
  unsigned char *src = malloc(n), *back = malloc(n), small[4096];
  um_buffer *b;
  um_event *e1, *e2, *e3;
  cr_assert(src != NULL && back != NULL);
  ut_pattern(src, n, 9);
  memset(small, 0xee, sizeof(small));
  cr_assert_eq(um_alloc(m, cpu, n, UM_HOST, 0, &b), UM_OK);
  gate_arm();
  cr_assert_eq(um_copy_from_host(b, 0, src, n, &e1), UM_OK);
  gate_wait_held();
  cr_assert_eq(um_copy_from_host(b, 0, small, sizeof(small), &e2), UM_OK);
  cr_assert_eq(um_fill(b, n - 4096, 0x77, 4096, &e3), UM_OK);
  cr_assert_eq(um_event_cancel(e2), UM_OK, "%s", um_last_error());
  atomic_store(&gate_open, true);
  cr_assert_eq(um_event_wait(e2), UM_ECANCELED);
  cr_assert_eq(um_event_wait(e1), UM_OK);
  cr_assert_eq(um_event_wait(e3), UM_OK);
  memset(src + n - 4096, 0x77, 4096);
  cr_assert_eq(um_copy_to_host(b, 0, back, n, NULL), UM_OK);
  cr_assert_arr_eq(back, src, n, "the canceled copy ran, or the others did not");
  cr_assert_eq(um_event_release(e1), UM_OK);
  cr_assert_eq(um_event_release(e2), UM_OK);
  cr_assert_eq(um_event_release(e3), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
  free(src);
  free(back);
}

/* A failed transfer on a device queue (the fault backend completes them on
 * its own thread), waited for with a spin: the failure's code and text. */
Test(wait, spin_and_failed_operation, .timeout = 60) {
  um_options o;
  um_manager *m;
  um_device *fd;
  um_buffer *b;
  um_event *e;
  unsigned char src[4096], back[4096];
  ut_options(&o);
  o.wait_spin_ns = 1000000;
  fault_configure(1, 256u << 20);
  cr_assert_eq(fault_manager_create(&o, &m), UM_OK, "%s", um_last_error());
  fd = um_device_get(m, 1);
  cr_assert(fault_is_device(fd));
  memset(src, 0x42, sizeof(src));
  cr_assert_eq(um_alloc(m, fd, sizeof(src), UM_DEVICE, 0, &b), UM_OK);
  fault_reset();
  fault_fail_xfer(1, false, UM_EBACKEND, false);
  cr_assert_eq(um_copy_from_host(b, 0, src, sizeof(src), &e), UM_OK);
  cr_assert_eq(um_event_wait(e), UM_EBACKEND);
  cr_assert_neq(um_last_error()[0], '\0');
  cr_assert_eq(um_event_release(e), UM_OK);
  /* and a blocking one */
  fault_reset();
  fault_fail_xfer(1, false, UM_EBACKEND, false);
  cr_assert_eq(um_copy_from_host(b, 0, src, sizeof(src), NULL), UM_EBACKEND);
  /* the device still works afterwards, spinning */
  fault_disarm();
  cr_assert_eq(um_copy_from_host(b, 0, src, sizeof(src), &e), UM_OK);
  cr_assert_eq(um_event_wait(e), UM_OK);
  cr_assert_eq(um_event_release(e), UM_OK);
  cr_assert_eq(um_copy_to_host(b, 0, back, sizeof(back), NULL), UM_OK);
  cr_assert_arr_eq(back, src, sizeof(src));
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}
