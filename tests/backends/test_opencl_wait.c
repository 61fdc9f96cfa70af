/* Low-latency waits on an OpenCL device (um_options.wait_spin_ns): blocking
 * copies, maps, synchronize and event waits that poll the command's status
 * before sleeping return the exact bytes; with the option at 0 none of
 * them polls. Polls are counted through the test build's hook
 * (UM__TP_WAIT_POLL), chained to opencl_util.h's worker watch. */
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

/* Every kind of blocking call on a DEVICE block (no host view: each one is
 * a command on the device's queue): copies both ways, small and chunked,
 * a device-local copy, a fill, a read and a write mapping, synchronize,
 * and a wait on an asynchronous copy. Checks every byte. */
static void blocking_calls(ou_env *e) {
  const size_t n = (1u << 20) + 4099u;
  unsigned char *src = ub_malloc(n), *back = ub_malloc(n), *p = NULL;
  um_buffer *a = ub_alloc(e->m, e->dev[0], n, UM_DEVICE);
  um_buffer *b = ub_alloc(e->m, e->dev[0], n, UM_DEVICE);
  um_event *ev;
  ub_pattern(src, n, 17);
  cr_assert_eq(um_copy_from_host(a, 0, src, 4096, NULL), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_copy_to_host(a, 0, back, 4096, NULL), UM_OK, "%s", um_last_error());
  ub_assert_bytes(back, src, 4096, "4 KiB round trip");
  cr_assert_eq(um_copy_from_host(a, 0, src, n, NULL), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_copy(b, 0, a, 0, n, NULL), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_fill(b, 100, 0xc3, 5000, NULL), UM_OK, "%s", um_last_error());
  memset(src + 100, 0xc3, 5000);
  cr_assert_eq(um_copy_to_host(b, 0, back, n, NULL), UM_OK, "%s", um_last_error());
  ub_assert_bytes(back, src, n, "device copy and fill");
  cr_assert_eq(um_map(b, UM_MAP_READ_WRITE, 64, 8192, (void **)&p), UM_OK, "%s", um_last_error());
  ub_assert_bytes(p, src + 64, 8192, "read-write mapping");
  for (size_t i = 0; i < 8192; i++)
    p[i] = (unsigned char)~p[i];
  cr_assert_eq(um_unmap(b, p), UM_OK, "%s", um_last_error());
  for (size_t i = 64; i < 64 + 8192; i++)
    src[i] = (unsigned char)~src[i];
  ub_pattern(back, n, 99); /* whatever was there */
  cr_assert_eq(um_copy_to_host(b, 0, back, n, &ev), UM_OK, "%s", um_last_error());
  ub_wait(ev, UM_OK);
  ub_assert_bytes(back, src, n, "after the mapping was written");
  cr_assert_eq(um_copy_from_host(a, 0, src, n, &ev), UM_OK);
  cr_assert_eq(um_device_synchronize(e->dev[0]), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_event_query(ev), UM_OK, "synchronize returned before the copy finished");
  um_event_release(ev);
  cr_assert_eq(um_release(a), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  free(src);
  free(back);
}

OU_TEST_1_AND_2(opencl_wait, spinning_blocking_calls_are_exact) {
  ou_env e = spin_open(50000);
  blocking_calls(&e);
  cr_assert_gt(atomic_load(&polls), 0, "nothing polled with wait_spin_ns 50 us");
  ou_close(&e);
}

/* The default never polls: every wait goes straight to the driver's or the
 * core's sleep. */
OU_TEST_1_AND_2(opencl_wait, spin_zero_never_polls) {
  ou_env e = spin_open(0);
  blocking_calls(&e);
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

/* Many asynchronous copies: a wait on each with
 * the spin on, interleaved with blocking reads of the same buffers (the
 * blocking read waits for the copy before it, op.c). */
OU_TEST_1_AND_2(opencl_wait, event_waits_with_spin) {
  enum { ROUNDS = 200 };
  ou_env e = spin_open(200000);
  unsigned char src[4096 + 3], back[sizeof(src)];
  um_buffer *b = ub_alloc(e.m, e.dev[0], sizeof(src), UM_DEVICE);
  for (int i = 0; i < ROUNDS; i++) {
    um_event *w, *r;
    ub_pattern(src, sizeof(src), (unsigned)i);
    cr_assert_eq(um_copy_from_host(b, 0, src, sizeof(src), &w), UM_OK);
    if (i % 2 == 0) {
      cr_assert_eq(um_copy_to_host(b, 0, back, sizeof(back), &r), UM_OK);
      ub_wait(r, UM_OK);
      cr_assert_eq(um_event_query(w), UM_OK, "the read finished before the write it follows");
      ub_wait(w, UM_OK);
    } else {
      ub_wait(w, UM_OK);
      cr_assert_eq(um_copy_to_host(b, 0, back, sizeof(back), NULL), UM_OK);
    }
    ub_assert_bytes(back, src, sizeof(src), "round %d", i);
  }
  cr_assert_eq(um_release(b), UM_OK);
  ou_close(&e);
}
