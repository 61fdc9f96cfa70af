/* Helpers of the OpenCL API tests (tests/backends/test_opencl_*.c): a manager over
 * the cpu and OpenCL backends with one or two PoCL devices, byte patterns,
 * strategy counters, and a gate that holds the manager's workers.
 *
 * These are PoCL's tests: they choose its device count and kind
 * (POCL_DEVICES), and the races they go after live in its threads. The
 * manager opens PoCL's platform only (UNIMEM_OPENCL_PLATFORM, ou_options),
 * whatever else the machine has: beside a GPU's platform (NVIDIA's, with
 * the GPU machine's ICD loader listing GPU platforms first) the devices
 * would sit in two contexts, every chain between them would go through
 * host threads, and each manager would also create and release the GPU's
 * context (hundreds of milliseconds on NVIDIA's driver).
 *
 * Every test that needs OpenCL skips with the reason when there is none.
 * POCL_DEVICES is read by PoCL when the library first loads, which happens
 * inside um_manager_create; every test runs in its own process (Criterion,
 * and the TSan runner of test_util_tsan.h), so setting it just before is
 * enough. Tests that need two devices ask for them; the others run twice,
 * with one device and with two (OU_TEST_1_AND_2), so the suite covers both
 * whatever the environment says. */
#ifndef UNIMEM_OPENCL_UTIL_H
#define UNIMEM_OPENCL_UTIL_H

#include <pthread.h>
#include <time.h>

#include "bytes.h"
#include "test_util.h"
#include "testing.h"
#include "testhook.h"

#define OU_MAX_DEVICES 8

typedef struct ou_env {
  um_manager *m;
  um_device *dev[OU_MAX_DEVICES]; /* the OpenCL devices, in manager order */
  int ndev;
} ou_env;

/* The last message of the manager's log that mentions opencl: the reason
 * the backend found nothing, for the skip message. */
static UT_UNUSED char ou_log_text[512];

static UT_UNUSED void ou_log(void *ctx, um_log_level level, const char *msg) {
  (void)ctx;
  if (strstr(msg, "opencl") != NULL)
    snprintf(ou_log_text, sizeof(ou_log_text), "%s", msg);
  if (level <= UM_LOG_WARN)
    fprintf(stderr, "unimem: %s\n", msg);
}

/* PoCL's platform's name (CL_PLATFORM_NAME), as UNIMEM_OPENCL_PLATFORM. */
#define OU_POCL_PLATFORM "Portable Computing Language"

/* Deterministic options: cpu and opencl, no trim timer, pooling on; PoCL's
 * platform only (UNIMEM_OPENCL_PLATFORM, read at every um_manager_create:
 * every manager of these tests is made with options from here). */
static UT_UNUSED void ou_options(um_options *o) {
  setenv("UNIMEM_OPENCL_PLATFORM", OU_POCL_PLATFORM, 1);
  ut_options(o);
  snprintf(o->backends, sizeof(o->backends), "cpu,opencl");
  o->log = ou_log;
  o->log_level = UM_LOG_INFO;
}

/* The kind of PoCL device the OpenCL tests ask for: "pthread", or what
 * UNIMEM_TEST_POCL_DEVICE names (see below). */
static UT_UNUSED const char *ou_pocl_kind(void) {
  const char *kind = getenv("UNIMEM_TEST_POCL_DEVICE");
  return kind == NULL || kind[0] == '\0' ? "pthread" : kind;
}

/* Ask PoCL for n (1 or 2) devices in one platform, before the manager
 * loads it (ou_options opens no other platform). The kind of PoCL device is
 * "pthread" (its callbacks run on its own threads), or what
 * UNIMEM_TEST_POCL_DEVICE names: CTest runs the OpenCL tests again with
 * "basic", which runs commands and their callbacks on the submitting
 * thread. */
static UT_UNUSED void ou_want_devices(int n) {
  const char *kind = ou_pocl_kind();
  char list[64];
  if (n == 1)
    snprintf(list, sizeof(list), "%s", kind);
  else
    snprintf(list, sizeof(list), "%s %s", kind, kind);
  setenv("POCL_DEVICES", list, 1);
}
static UT_UNUSED void ou_want_two_devices(void) { ou_want_devices(2); }

/* A test whose body runs once with one PoCL device (name_1dev) and once
 * with two (name_2dev), each in its own process. */
#define OU_TEST_1_AND_2(suite, name)                                           \
  static void suite##_##name##_body(void);                                     \
  Test(suite, name##_1dev) {                                                   \
    ou_want_devices(1);                                                        \
    suite##_##name##_body();                                                   \
  }                                                                            \
  Test(suite, name##_2dev) {                                                   \
    ou_want_devices(2);                                                        \
    suite##_##name##_body();                                                   \
  }                                                                            \
  static void suite##_##name##_body(void)

/* A manager with opts (NULL: ou_options) and its OpenCL devices; skips the
 * test when there are fewer than min_devices. */
static void ou_watch_workers(void);

static UT_UNUSED ou_env ou_open(const um_options *opts, int min_devices) {
  ou_env e;
  um_options o;
  memset(&e, 0, sizeof(e));
  if (opts == NULL) {
    ou_options(&o);
    opts = &o;
  }
  cr_assert_eq(um_manager_create(opts, &e.m), UM_OK, "um_manager_create: %s", um_last_error());
  ou_watch_workers();
  for (int i = 0; i < um_device_count(e.m) && e.ndev < OU_MAX_DEVICES; i++) {
    um_device_info info;
    um_device *d = um_device_get(e.m, i);
    cr_assert_eq(um_device_info_get(d, &info), UM_OK);
    if (strcmp(info.backend, "opencl") == 0)
      e.dev[e.ndev++] = d;
  }
  if (e.ndev < min_devices) {
    int n = e.ndev;
    um_manager_destroy(e.m);
    if (n == 0)
      cr_skip_test("SKIPPED: no PoCL device here (%s); install pocl-opencl-icd",
                   ou_log_text[0] ? ou_log_text : "the backend found none");
    cr_skip_test("SKIPPED: needs %d OpenCL devices in one platform, found %d "
                 "(PoCL gives two with POCL_DEVICES=\"pthread pthread\")",
                 min_devices, n);
  }
  return e;
}

static UT_UNUSED void ou_close(ou_env *e) {
  cr_assert_eq(um_manager_destroy(e->m), UM_OK, "um_manager_destroy: %s", um_last_error());
  e->m = NULL;
}

/* ------------------------------------------------------------------------ */
/* Strategy counters */

typedef struct ou_strategies {
  uint64_t local, peer, direct, pipelined, staged;
} ou_strategies;

static UT_UNUSED ou_strategies ou_strategy_delta(const um_stats *a, const um_stats *b) {
  ou_strategies s;
  s.local = b->xfer_local - a->xfer_local;
  s.peer = b->xfer_peer - a->xfer_peer;
  s.direct = b->xfer_direct - a->xfer_direct;
  s.pipelined = b->xfer_pipelined - a->xfer_pipelined;
  s.staged = b->xfer_staged - a->xfer_staged;
  return s;
}

/* Exactly the given strategy counts moved between two snapshots. */
#define ou_assert_strategies(before, after, l, p, d, pl, s)                    \
  do {                                                                         \
    ou_strategies got_ = ou_strategy_delta(&(before), &(after));               \
    cr_assert(got_.local == (l) && got_.peer == (p) && got_.direct == (d) &&   \
                  got_.pipelined == (pl) && got_.staged == (s),                \
              "strategies local/peer/direct/pipelined/staged moved by "        \
              "%llu/%llu/%llu/%llu/%llu, expected %d/%d/%d/%d/%d",             \
              (unsigned long long)got_.local, (unsigned long long)got_.peer,   \
              (unsigned long long)got_.direct,                                 \
              (unsigned long long)got_.pipelined,                              \
              (unsigned long long)got_.staged, (int)(l), (int)(p), (int)(d),   \
              (int)(pl), (int)(s));                                            \
  } while (0)

/* ------------------------------------------------------------------------ */
/* The workers, watched through the test build's hook (src/testhook.h): how
 * many run an operation at once, and at most since ou_open; and a gate:
 * once installed, the first operation a worker starts waits in it until the
 * test opens it, so that what is issued after it is reliably queued behind
 * it. */

typedef struct ou_gate {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  int running;     /* workers running an operation now */
  int running_max; /* most at once since ou_open */
  int installed;
  int entered; /* workers that reached the gate */
  int open;
  int hold_until; /* with open == 0: workers wait until this many entered */
} ou_gate;

static UT_UNUSED ou_gate ou_gate_state = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0, 0, 0, 0};

static UT_UNUSED void ou_abs_deadline(struct timespec *ts, int seconds) {
  clock_gettime(CLOCK_REALTIME, ts);
  ts->tv_sec += seconds;
}

/* Wait for the gate to open (at most 60 s, so that a broken engine fails
 * the test instead of hanging it). Called with the lock held. */
static UT_UNUSED void ou_gate_pass_locked(ou_gate *g) {
  struct timespec deadline;
  ou_abs_deadline(&deadline, 60);
  g->entered++;
  pthread_cond_broadcast(&g->cond);
  while (!g->open && (g->hold_until == 0 || g->entered < g->hold_until))
    if (pthread_cond_timedwait(&g->cond, &g->lock, &deadline) != 0)
      break;
  if (g->hold_until != 0 && g->entered >= g->hold_until)
    g->open = 1; /* latch: the rest pass */
  pthread_cond_broadcast(&g->cond);
}

static UT_UNUSED void ou_worker_hook(um__test_point point, void *arg) {
  ou_gate *g = &ou_gate_state;
  (void)arg;
  if (point != UM__TP_WORKER_RUN && point != UM__TP_WORKER_DONE)
    return;
  pthread_mutex_lock(&g->lock);
  if (point == UM__TP_WORKER_DONE) {
    g->running--;
  } else {
    if (++g->running > g->running_max)
      g->running_max = g->running;
    if (g->installed)
      ou_gate_pass_locked(g);
  }
  pthread_mutex_unlock(&g->lock);
}

/* Start watching the workers (ou_open does it). */
static UT_UNUSED void ou_watch_workers(void) {
  ou_gate *g = &ou_gate_state;
  pthread_mutex_lock(&g->lock);
  g->running = g->running_max = g->installed = 0;
  pthread_mutex_unlock(&g->lock);
  atomic_store(&um__test_hook, ou_worker_hook);
}

/* The most operations workers ran at once since ou_open. */
static UT_UNUSED int ou_running_max(void) {
  ou_gate *g = &ou_gate_state;
  int n;
  pthread_mutex_lock(&g->lock);
  n = g->running_max;
  pthread_mutex_unlock(&g->lock);
  return n;
}

/* Install the gate, closed. hold_until 0: it opens only by ou_gate_open;
 * n > 0: it opens by itself once n workers are inside at once. */
static UT_UNUSED void ou_gate_install(um_manager *m, int hold_until) {
  ou_gate *g = &ou_gate_state;
  (void)m;
  pthread_mutex_lock(&g->lock);
  g->entered = 0;
  g->open = 0;
  g->hold_until = hold_until;
  g->installed = 1;
  pthread_mutex_unlock(&g->lock);
}

/* Wait until n workers reached the gate. */
static UT_UNUSED void ou_gate_wait_entered(int n) {
  ou_gate *g = &ou_gate_state;
  struct timespec deadline;
  int entered;
  ou_abs_deadline(&deadline, 60);
  pthread_mutex_lock(&g->lock);
  while (g->entered < n)
    if (pthread_cond_timedwait(&g->cond, &g->lock, &deadline) != 0)
      break;
  entered = g->entered;
  pthread_mutex_unlock(&g->lock);
  cr_assert_geq(entered, n, "only %d worker(s) reached the gate, expected %d", entered, n);
}

static UT_UNUSED void ou_gate_open(void) {
  ou_gate *g = &ou_gate_state;
  pthread_mutex_lock(&g->lock);
  g->open = 1;
  pthread_cond_broadcast(&g->cond);
  pthread_mutex_unlock(&g->lock);
}

static UT_UNUSED int ou_event_state(um_event *e) {
  return atomic_load_explicit(&e->state, memory_order_acquire);
}

#endif /* UNIMEM_OPENCL_UTIL_H */
