/* Low-latency waits on an OpenCL device (um_options.wait_spin_ns): blocking
 * copies, maps and synchronize poll the command's status before sleeping
 * (with the option at 0 none of them polls), and a blocking call right
 * after a spun end leaves the driver its settle time. Polls are counted
 * through the test build's hook (UM__TP_WAIT_POLL), chained to
 * opencl_util.h's worker watch. The bytes of spinning waits, event waits
 * among them, are checked on every profile by conformance/test_wait_spin.c. */
#include "blocking_calls.h"
#include "opencl_util.h"

static atomic_int polls, settles, spun_ends, last_point;
/* Set before a manager opens: its CPU devices' settle time instead of the
 * backend's (0: the backend's). */
static uint32_t settle_time_ns;

static void counting_hook(um__test_point point, void *arg) {
  if (point == UM__TP_WAIT_POLL)
    atomic_fetch_add(&polls, 1);
  if (point == UM__TP_SETTLE_TIME && settle_time_ns != 0)
    *(uint32_t *)arg = settle_time_ns;
  if (point == UM__TP_SPUN_END || point == UM__TP_SETTLE) {
    atomic_fetch_add(point == UM__TP_SETTLE ? &settles : &spun_ends, 1);
    atomic_store(&last_point, (int)point);
  }
  ou_worker_hook(point, arg);
}

static ou_env spin_open(uint32_t spin_ns) {
  um_options o;
  ou_env e;
  ou_options(&o);
  o.wait_spin_ns = spin_ns;
  atomic_store(&um__test_hook, counting_hook); /* as the devices open */
  e = ou_open(&o, 1);
  atomic_store(&polls, 0);
  atomic_store(&settles, 0);
  atomic_store(&um__test_hook, counting_hook); /* ou_open set its own */
  return e;
}

/* With a budget, the blocking calls on a DEVICE block (commands on the
 * device's queue) poll. */
OU_TEST_1_AND_2(opencl_wait, spinning_blocking_calls_poll) {
  ou_env e = spin_open(50000);
  bc_blocking_calls(e.m, e.dev[0]);
  cr_assert_gt(atomic_load(&polls), 0, "nothing polled with wait_spin_ns 50 us");
  ou_close(&e);
}

/* The default never polls: every wait goes straight to the driver's or the
 * core's sleep. */
OU_TEST_1_AND_2(opencl_wait, spin_zero_never_polls) {
  ou_env e = spin_open(0);
  bc_blocking_calls(e.m, e.dev[0]);
  cr_assert_eq(atomic_load(&polls), 0, "%d polls with wait_spin_ns 0", atomic_load(&polls));
  cr_assert_eq(atomic_load(&settles), 0, "%d settles with wait_spin_ns 0", atomic_load(&settles));
  ou_close(&e);
}

/* A blocking 4 KiB read polls: it is a command on the device's queue
 * whose status the backend polls before it sleeps, at least once. */
OU_TEST_1_AND_2(opencl_wait, blocking_read_polls_the_command) {
  ou_env e = spin_open(UM__WAIT_SPIN_MAX_NS);
  unsigned char src[4096], back[4096];
  um_buffer *b = ub_alloc(e.m, e.dev[0], sizeof(src), UM_DEVICE);
  ub_pattern(src, sizeof(src), 4);
  cr_assert_eq(um_copy_from_host(b, 0, src, sizeof(src), NULL), UM_OK);
  for (int i = 0; i < 100; i++) {
    int before = atomic_load(&polls);
    memset(back, 0, sizeof(back));
    cr_assert_eq(um_copy_to_host(b, 0, back, sizeof(back), NULL), UM_OK, "%s", um_last_error());
    cr_assert_gt(atomic_load(&polls), before, "round %d did not poll", i);
    ub_assert_bytes(back, src, sizeof(src), "round %d", i);
  }
  cr_assert_eq(um_release(b), UM_OK);
  ou_close(&e);
}

/* 4 KiB round trips (a blocking write, then a blocking read back) with the
 * spin on, each call pause_ns after the one before (0: back to back); the
 * settles they made. */
static int round_trips(ou_env *e, int rounds, long pause_ns) {
  unsigned char src[4096], back[4096];
  um_buffer *b = ub_alloc(e->m, e->dev[0], sizeof(src), UM_DEVICE);
  atomic_store(&settles, 0);
  atomic_store(&spun_ends, 0);
  atomic_store(&last_point, -1);
  for (int i = 0; i < 2 * rounds; i++) {
    if (pause_ns > 0)
      nanosleep(&(struct timespec){0, pause_ns}, NULL);
    if (i % 2 == 0) {
      ub_pattern(src, sizeof(src), (unsigned)i + 3);
      cr_assert_eq(um_copy_from_host(b, 0, src, sizeof(src), NULL), UM_OK, "%s", um_last_error());
    } else {
      cr_assert_eq(um_copy_to_host(b, 0, back, sizeof(back), NULL), UM_OK, "%s", um_last_error());
      ub_assert_bytes(back, src, sizeof(src), "round %d", i / 2);
    }
  }
  cr_assert_eq(um_release(b), UM_OK);
  return atomic_load(&settles);
}

/* Whether the test's PoCL devices run commands on driver threads (the
 * "pthread" device; "basic" runs them inside the submitting call, and a
 * blocking call there has nothing to settle: opencl/devices.c, um__ocl_settle). */
static int driver_threads(void) { return strcmp(ou_pocl_kind(), "pthread") == 0; }

/* Back to back, every blocking call that follows the end of another seen
 * by a spinning wait leaves the driver the settle time before it submits:
 * with a settle time of 50 ms (the test's, through the hook), far longer
 * than anything between two calls here, sanitizers included, each of
 * them waits, and the calls take that long. On PoCL's basic device
 * (commands run inside the submitting call) none waits. */
OU_TEST_1_AND_2(opencl_wait, back_to_back_blocking_calls_settle) {
  ou_env e;
  uint64_t start;
  int n, ends;
  settle_time_ns = 50000000u;
  e = spin_open(UM__WAIT_SPIN_MAX_NS);
  start = um__now_ns();
  n = round_trips(&e, 5, 0);
  ends = atomic_load(&spun_ends);
  if (driver_threads()) {
    cr_assert_eq(ends, 10, "%d of 10 spinning waits saw their command end", ends);
    cr_assert_eq(atomic_load(&last_point), UM__TP_SPUN_END);
    cr_assert_eq(n, 9, "%d settles of the 9 calls that followed a spun end", n);
    cr_assert_geq(um__now_ns() - start, 9 * 50000000ull, "the calls did not wait out the settle time");
  } else {
    cr_assert_eq(n, 0, "%d settles on a device that runs commands inline", n);
  }
  ou_close(&e);
}

/* With the backend's settle time (microseconds), a blocking call made 1 ms
 * after the last spinning wait ended submits at once. */
OU_TEST_1_AND_2(opencl_wait, blocking_calls_apart_do_not_settle) {
  ou_env e = spin_open(UM__WAIT_SPIN_MAX_NS);
  int n = round_trips(&e, 25, 1000000);
  cr_assert_eq(n, 0, "%d settles of calls 1 ms apart", n);
  if (driver_threads())
    cr_assert_eq(atomic_load(&spun_ends), 50, "%d of 50 spinning waits saw their command end",
                 atomic_load(&spun_ends));
  ou_close(&e);
}
