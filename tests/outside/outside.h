/* The outside-in suite's only helper header.
 *
 * Tests under tests/outside/ see what a client sees: the public header
 * (unimem.h), the blob-exchange helper for peer processes, and this file.
 * They link the shared library, which exports the API alone, so a test
 * here cannot reach an internal symbol; src/ is not on their include path,
 * so an internal header does not compile.
 *
 * Every wait is bounded: a call that might hang runs through os_bounded(),
 * a peer through os_reap(), so a hang fails its test instead of the run.
 *
 * The device profile comes from UNIMEM_OUTSIDE_PROFILE (set by CTest):
 *   cpu         the cpu device alone
 *   pocl        cpu + PoCL's pthread device (POCL_DEVICES=pthread)
 *   pocl-basic  cpu + PoCL's basic device
 * os_device() is the profile's accelerator (the cpu device on "cpu"). */
#ifndef UNIMEM_OUTSIDE_H
#define UNIMEM_OUTSIDE_H

#if defined(__SANITIZE_THREAD__)
#define OS_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define OS_TSAN 1
#endif
#endif
#ifdef OS_TSAN
#include "test_util_tsan.h"
#else
#include <criterion/criterion.h>
#endif

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h> /* the TSan build's Criterion stand-in has none */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <unimem.h>

#include "net_bootstrap.h"

#define OS_UNUSED __attribute__((unused))
#define OS_SKIP 77

/* ------------------------------------------------------------------------ */
/* Time */

static OS_UNUSED uint64_t os_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static OS_UNUSED void os_sleep_ms(unsigned ms) {
  struct timespec ts = {(time_t)(ms / 1000u), (long)(ms % 1000u) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
    ;
}

/* ------------------------------------------------------------------------ */
/* Device profiles */

static OS_UNUSED const char *os_profile(void) {
  const char *p = getenv("UNIMEM_OUTSIDE_PROFILE");
  return p != NULL && *p != '\0' ? p : "cpu";
}

/* Options of a manager for the profile: pooling on, no trim timer, and a
 * net timeout of net_timeout_ms (0 keeps the default). */
static OS_UNUSED void os_options(um_options *o) {
  um_options_init(o);
  if (strcmp(os_profile(), "cpu") == 0) {
    snprintf(o->backends, sizeof(o->backends), "cpu");
  } else {
    snprintf(o->backends, sizeof(o->backends), "cpu,opencl");
    setenv("POCL_DEVICES", strcmp(os_profile(), "pocl-basic") == 0 ? "basic" : "pthread", 1);
  }
  o->enable_pooling = 1;
  o->trim_interval_ms = 0;
}

static OS_UNUSED um_manager *os_manager_with(const um_options *o) {
  um_manager *m = NULL;
  int st = um_manager_create(o, &m);
  cr_assert_eq(st, UM_OK, "um_manager_create: %s: %s", um_err_name(st), um_last_error());
  if (strcmp(os_profile(), "cpu") != 0 && um_device_count(m) < 2) {
    um_manager_destroy(m);
    cr_skip_test("profile %s: no OpenCL device (is pocl-opencl-icd installed?)", os_profile());
  }
  return m;
}

static OS_UNUSED um_manager *os_manager(void) {
  um_options o;
  os_options(&o);
  return os_manager_with(&o);
}

/* The profile's accelerator: the last device (the cpu device on "cpu"). */
static OS_UNUSED um_device *os_device(um_manager *m) { return um_device_get(m, um_device_count(m) - 1); }

/* The location to allocate on the profile's accelerator. */
static OS_UNUSED um_location os_location(void) { return UM_DEVICE; }

/* ------------------------------------------------------------------------ */
/* Bounded calls: fn(arg) on a thread of its own; the test fails when it
 * has not returned within timeout_ms (the thread is left behind: the test's
 * process ends with the test). Returns fn's result. */

typedef int (*os_fn)(void *arg);

typedef struct os_call {
  os_fn fn;
  void *arg;
  int result;
  atomic_int done;
} os_call;

static void *os_call_thread(void *p) {
  os_call *c = (os_call *)p;
  c->result = c->fn(c->arg);
  atomic_store(&c->done, 1);
  return NULL;
}

/* 0 with *result set when fn returned in time; ETIMEDOUT otherwise. */
static OS_UNUSED int os_try_bounded(os_fn fn, void *arg, unsigned timeout_ms, int *result) {
  os_call *c = (os_call *)calloc(1, sizeof(*c)); /* leaked on a hang: the thread may still write */
  pthread_t t;
  uint64_t end = os_now_ms() + timeout_ms;
  cr_assert_not_null(c);
  c->fn = fn;
  c->arg = arg;
  cr_assert_eq(pthread_create(&t, NULL, os_call_thread, c), 0);
  while (!atomic_load(&c->done) && os_now_ms() < end)
    os_sleep_ms(1);
  if (!atomic_load(&c->done)) {
    pthread_detach(t);
    return ETIMEDOUT;
  }
  pthread_join(t, NULL);
  *result = c->result;
  free(c);
  return 0;
}

#define os_bounded(fn, arg, timeout_ms, what)                                  \
  __extension__({                                                              \
    int os_r_ = 0;                                                             \
    cr_assert_eq(os_try_bounded((fn), (arg), (timeout_ms), &os_r_), 0,         \
                 "%s did not return within %u ms (a hang)", (what),            \
                 (unsigned)(timeout_ms));                                      \
    os_r_;                                                                     \
  })

/* ------------------------------------------------------------------------ */
/* Peer processes: forked children that report with their exit status
 * (0 passed, 77 skipped, anything else failed, reason on stderr). A child
 * checks with OS_CHECK, never Criterion's asserts, and ends with
 * os_child_exit. */

#define OS_CHECK(cond, ...)                                                    \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "[pid %d] %s:%d: check failed: %s: ", (int)getpid(),     \
              __FILE__, __LINE__, #cond);                                      \
      fprintf(stderr, __VA_ARGS__);                                            \
      fprintf(stderr, " (um_last_error: %s)\n", um_last_error());             \
      os_child_exit(1);                                                        \
    }                                                                          \
  } while (0)

#define OS_OK(call)                                                            \
  do {                                                                         \
    int os_st_ = (call);                                                       \
    OS_CHECK(os_st_ == UM_OK, "%s: %s", #call, um_err_name(os_st_));           \
  } while (0)

extern void __lsan_do_leak_check(void) __attribute__((weak));

static OS_UNUSED void os_child_exit(int rc) {
  fflush(stdout);
  fflush(stderr);
  if (rc == 0 && __lsan_do_leak_check != NULL)
    __lsan_do_leak_check();
#ifdef OS_TSAN
  exit(rc); /* TSan turns a reported race into status 66 at exit() */
#else
  _exit(rc);
#endif
}

typedef int (*os_peer_fn)(int idx, void *arg);

static OS_UNUSED pid_t os_spawn(os_peer_fn fn, int idx, void *arg) {
  pid_t pid;
  fflush(stdout);
  fflush(stderr);
  pid = fork();
  cr_assert(pid >= 0, "fork: %s", strerror(errno));
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* a test killed for its timeout takes its peers */
    os_child_exit(fn(idx, arg));
  }
  return pid;
}

/* A child's exit status: its code, 128 + signal when killed, 124 when it
 * had not ended within timeout_ms (it is then killed). */
static OS_UNUSED int os_reap(pid_t pid, unsigned timeout_ms) {
  uint64_t end = os_now_ms() + timeout_ms;
  int status = 0;
  for (;;) {
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid)
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (r < 0)
      return -1;
    if (os_now_ms() >= end) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return 124;
    }
    os_sleep_ms(2);
  }
}

/* Reap a peer and fail the test unless it passed (a skip skips the test). */
#define os_expect_peer(pid, timeout_ms, what)                                  \
  do {                                                                         \
    int os_rc_ = os_reap((pid), (timeout_ms));                                 \
    if (os_rc_ == OS_SKIP)                                                     \
      cr_skip_test("%s skipped (no UCX or no device)", (what));                \
    cr_assert_eq(os_rc_, 0, "%s ended with status %d (124: hang)", (what),     \
                 os_rc_);                                                      \
  } while (0)

/* ------------------------------------------------------------------------ */
/* Patterns */

static OS_UNUSED void os_pattern(void *p, size_t n, uint32_t seed) {
  uint8_t *b = (uint8_t *)p;
  for (size_t i = 0; i < n; i++)
    b[i] = (uint8_t)((i * 2654435761u) >> 13 ^ seed);
}

/* Index of the first byte that differs from the pattern, or SIZE_MAX. */
static OS_UNUSED size_t os_pattern_diff(const void *p, size_t n, uint32_t seed) {
  const uint8_t *b = (const uint8_t *)p;
  for (size_t i = 0; i < n; i++)
    if (b[i] != (uint8_t)((i * 2654435761u) >> 13 ^ seed))
      return i;
  return SIZE_MAX;
}

/* ------------------------------------------------------------------------ */
/* Net peers: the helpers of a peer process (OS_CHECK, never Criterion's
 * asserts) that talks to another one over an nb_pair() socket and through
 * a net of its own. */

#define OS_NET_WAIT_MS 60000 /* os_connect's wait for the peer's address */

typedef struct os_peer {
  um_manager *m;
  um_net *net;
} os_peer;

/* A manager for the profile with a net timeout of net_timeout_ms, and its
 * net: 0, or OS_SKIP (the reason on stderr) when this build or machine has
 * no UCX. */
static OS_UNUSED int os_peer_open(os_peer *p, uint32_t net_timeout_ms) {
  um_options o;
  int st;
  os_options(&o);
  o.net_timeout_ms = net_timeout_ms;
  OS_OK(um_manager_create(&o, &p->m));
  st = um_net_create(p->m, &p->net);
  if (st == UM_ENOTSUP) {
    fprintf(stderr, "[pid %d] no UCX here: %s\n", (int)getpid(), um_last_error());
    um_manager_destroy(p->m);
    return OS_SKIP;
  }
  OS_CHECK(st == UM_OK, "um_net_create: %s", um_err_name(st));
  return 0;
}

static OS_UNUSED void os_peer_close(os_peer *p) {
  OS_OK(um_net_destroy(p->net));
  OS_OK(um_manager_destroy(p->m));
}

static OS_UNUSED void os_send(int fd, const void *blob, size_t len) {
  OS_CHECK(nb_send(fd, blob, len) == 0, "nb_send: %s", strerror(errno));
}

/* The next blob from fd (at most cap bytes), within timeout_ms: its length. */
static OS_UNUSED size_t os_recv(int fd, void *buf, size_t cap, int timeout_ms) {
  size_t len = 0;
  OS_CHECK(nb_recv(fd, buf, cap, &len, timeout_ms) == 0, "nb_recv: %s", strerror(errno));
  return len;
}

/* The next blob from fd is the one character what. */
static OS_UNUSED void os_expect(int fd, char what, int timeout_ms) {
  char got = 0;
  OS_CHECK(os_recv(fd, &got, 1, timeout_ms) == 1 && got == what, "expected '%c', got '%c'", what, got);
}

/* Exchange addresses over fd (this side's first); connect to the peer when
 * connect is set (NULL otherwise: only the peer needs an endpoint). */
static OS_UNUSED um_endpoint *os_connect(os_peer *p, int fd, bool connect) {
  unsigned char mine[4096], theirs[4096];
  size_t len = sizeof(mine), tlen;
  um_endpoint *ep = NULL;
  OS_OK(um_net_address(p->net, mine, &len));
  os_send(fd, mine, len);
  tlen = os_recv(fd, theirs, sizeof(theirs), OS_NET_WAIT_MS);
  if (connect)
    OS_OK(um_net_connect(p->net, theirs, tlen, &ep));
  return ep;
}

#endif /* UNIMEM_OUTSIDE_H */
