/* Helpers of the misuse suite (tests/misuse/test_misuse_*.c, test_opencl_misuse.c):
 * "this call is refused with exactly this code and changes nothing", a gate
 * that holds the manager's workers so an operation stays in flight for as
 * long as a test needs, a log that keeps its lines, and the heap in use
 * (to tell that a destroyed manager left nothing behind).
 *
 * Every test of the suite runs in its own process (Criterion forks one per
 * test) under a timeout, so a crash or a hang fails that test alone. */
#ifndef UNIMEM_MISUSE_UTIL_H
#define UNIMEM_MISUSE_UTIL_H

#include <malloc.h>
#include <pthread.h>
#include <time.h>

#include "test_util.h"
#include "testing.h"
#include "testhook.h"

#if UT_ASAN_ON
#include <sanitizer/allocator_interface.h>
#endif

/* Fork tests cannot run under ThreadSanitizer: it kills a child of a
 * multithreaded process that starts a thread (its die_after_fork), and a
 * new manager starts its workers. */
#ifdef UT_TSAN
#define MU_SKIP_FORK_UNDER_TSAN()                                              \
  cr_skip_test("ThreadSanitizer cannot start threads in the child of a "       \
               "multithreaded process; the other builds run this test")
#else
#define MU_SKIP_FORK_UNDER_TSAN() ((void)0)
#endif

/* A pointer no call may write through: out-parameters keep it on failure. */
#define MU_SENTINEL ((void *)(uintptr_t)0x5e5e5e5eu)

/* Bytes above which a host copy or fill with an event runs on a worker
 * thread (transfer.c runs up to 256 KiB inline on the issuing thread). */
#define MU_WORKER_BYTES ((size_t)1 << 20)

/* The call answers exactly `code`, leaves a um_last_error() text, and
 * manager mm is as it was (every statistics field, in total and per
 * device). */
#define MU_FAILS(mm, code, call)                                               \
  do {                                                                         \
    ut_snapshot mu_before_ = ut_snap(mm);                                      \
    int mu_st_ = (call);                                                       \
    cr_assert_eq(mu_st_, (code), "%s returned %s, expected %s (%s)", #call,    \
                 um_err_name(mu_st_), um_err_name(code), um_last_error());     \
    cr_assert_neq(um_last_error()[0], '\0', "%s: no um_last_error text",       \
                  #call);                                                      \
    ut_assert_unchanged(mm, mu_before_);                                       \
  } while (0)

/* The same with two managers: neither changes. */
#define MU_FAILS2(ma, mb, code, call)                                          \
  do {                                                                         \
    ut_snapshot mu_before_a_ = ut_snap(ma), mu_before_b_ = ut_snap(mb);        \
    int mu_st_ = (call);                                                       \
    cr_assert_eq(mu_st_, (code), "%s returned %s, expected %s (%s)", #call,    \
                 um_err_name(mu_st_), um_err_name(code), um_last_error());     \
    ut_assert_unchanged(ma, mu_before_a_);                                     \
    ut_assert_unchanged(mb, mu_before_b_);                                     \
  } while (0)

/* A statement with no status to check (um_event_release, a getter) leaves
 * manager mm as it was. */
#define MU_QUIET(mm, stmt)                                                     \
  do {                                                                         \
    ut_snapshot mu_before_ = ut_snap(mm);                                      \
    stmt;                                                                      \
    ut_assert_unchanged(mm, mu_before_);                                       \
  } while (0)

static UT_UNUSED void *mu_malloc(size_t n) {
  void *p = malloc(n);
  cr_assert_not_null(p);
  return p;
}

/* ------------------------------------------------------------------------ */
/* The gate, on the test build's worker hook (src/testhook.h): once closed
 * on a manager, it holds every operation a worker of that manager starts
 * until the test opens it (other managers' workers pass). An operation held
 * there is RUNNING and does not finish, so the figures it would move stay
 * put. A gate left closed opens by itself after MU_GATE_SECONDS, so that a
 * broken library fails the test instead of hanging it (the suites' own
 * timeouts are longer). */

#define MU_GATE_SECONDS 20

typedef struct mu_gate {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  um_manager *held; /* the manager whose workers wait */
  int entered;      /* operations that reached the gate */
  int open;
} mu_gate;

static UT_UNUSED mu_gate mu_gate_state = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, NULL, 0, 0};

static UT_UNUSED void mu_deadline(struct timespec *ts, int seconds) {
  clock_gettime(CLOCK_REALTIME, ts);
  ts->tv_sec += seconds;
}

static UT_UNUSED void mu_gate_hook(um__test_point point, void *arg) {
  mu_gate *g = &mu_gate_state;
  const um_event *op = arg;
  struct timespec deadline;
  if (point != UM__TP_WORKER_RUN)
    return;
  mu_deadline(&deadline, MU_GATE_SECONDS);
  pthread_mutex_lock(&g->lock);
  if (op->m == g->held) {
    g->entered++;
    pthread_cond_broadcast(&g->cond);
    while (!g->open)
      if (pthread_cond_timedwait(&g->cond, &g->lock, &deadline) != 0)
        g->open = 1; /* latched: the operations behind pass at once */
  }
  pthread_mutex_unlock(&g->lock);
}

/* Close the gate on mm's workers (before issuing what it should hold). */
static UT_UNUSED void mu_gate_close(um_manager *mm) {
  mu_gate *g = &mu_gate_state;
  pthread_mutex_lock(&g->lock);
  g->held = mm;
  g->entered = 0;
  g->open = 0;
  pthread_mutex_unlock(&g->lock);
  atomic_store(&um__test_hook, mu_gate_hook);
}

/* Wait until n operations are held at the gate. */
static UT_UNUSED void mu_gate_wait_entered(int n) {
  mu_gate *g = &mu_gate_state;
  struct timespec deadline;
  int entered;
  mu_deadline(&deadline, 60);
  pthread_mutex_lock(&g->lock);
  while (g->entered < n)
    if (pthread_cond_timedwait(&g->cond, &g->lock, &deadline) != 0)
      break;
  entered = g->entered;
  pthread_mutex_unlock(&g->lock);
  cr_assert_geq(entered, n, "only %d operation(s) reached the gate, expected %d", entered, n);
}

static UT_UNUSED void mu_gate_open(void) {
  mu_gate *g = &mu_gate_state;
  pthread_mutex_lock(&g->lock);
  g->open = 1;
  pthread_cond_broadcast(&g->cond);
  pthread_mutex_unlock(&g->lock);
}

/* ------------------------------------------------------------------------ */
/* A log that keeps its lines (the leak report). */

#define MU_LOG_LINES 32

typedef struct mu_log {
  pthread_mutex_t lock;
  int count;      /* lines at UM_LOG_ERROR */
  char line[MU_LOG_LINES][320];
} mu_log;

static UT_UNUSED mu_log mu_log_state = {PTHREAD_MUTEX_INITIALIZER, 0, {{0}}};

static UT_UNUSED void mu_log_fn(void *ctx, um_log_level level, const char *msg) {
  mu_log *l = ctx;
  if (level != UM_LOG_ERROR)
    return;
  pthread_mutex_lock(&l->lock);
  if (l->count < MU_LOG_LINES)
    snprintf(l->line[l->count], sizeof(l->line[0]), "%s", msg);
  l->count++;
  pthread_mutex_unlock(&l->lock);
}

static UT_UNUSED void mu_log_reset(void) {
  pthread_mutex_lock(&mu_log_state.lock);
  mu_log_state.count = 0;
  memset(mu_log_state.line, 0, sizeof(mu_log_state.line));
  pthread_mutex_unlock(&mu_log_state.lock);
}

/* Lines at UM_LOG_ERROR that contain every one of the given texts. */
static UT_UNUSED int mu_log_matching(const char *a, const char *b) {
  int n = 0;
  pthread_mutex_lock(&mu_log_state.lock);
  for (int i = 0; i < mu_log_state.count && i < MU_LOG_LINES; i++)
    if (strstr(mu_log_state.line[i], a) != NULL && (b == NULL || strstr(mu_log_state.line[i], b) != NULL))
      n++;
  pthread_mutex_unlock(&mu_log_state.lock);
  return n;
}

/* ------------------------------------------------------------------------ */
/* Heap bytes in use now: the sanitizer allocator's count under ASan, else
 * glibc's (every arena). Freed chunks that glibc keeps in a thread's cache
 * count as in use, so compare figures with a margin far below what a real
 * leak of the objects in question would add. */
static UT_UNUSED size_t mu_heap_in_use(void) {
#if UT_ASAN_ON
  return __sanitizer_get_current_allocated_bytes();
#else
  struct mallinfo2 mi = mallinfo2();
  return mi.uordblks + mi.hblkhd;
#endif
}

#endif /* UNIMEM_MISUSE_UTIL_H */
