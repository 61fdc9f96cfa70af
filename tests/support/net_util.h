/* Helpers of the um_net tests: peer processes, their managers and nets,
 * exchanging blobs over net_bootstrap, patterns.
 *
 * The peers are forked children: the test process itself never loads UCX,
 * and a child reports with its exit status (0 passed, 77 skipped: no UCX
 * or no device, anything else failed, with the reason on stderr). Children
 * check with NT_CHECK, never with Criterion's asserts, and leave through
 * nt_exit, which runs LeakSanitizer's check in ASan builds and makes a
 * race ThreadSanitizer reported fail the peer in TSan builds. */
#ifndef UNIMEM_NET_UTIL_H
#define UNIMEM_NET_UTIL_H

#include <errno.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>

#include "net_bootstrap.h"
#include "test_util.h"
#include "testing.h"

#define NT_WAIT_MS 60000 /* a bootstrap message (the peer may be slow under TSan) */
#define NT_SKIP 77

#define NT_CHECK(cond, ...)                                                    \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "[pid %d] %s:%d: check failed: %s: ", (int)getpid(),     \
              __FILE__, __LINE__, #cond);                                      \
      fprintf(stderr, __VA_ARGS__);                                            \
      fprintf(stderr, " (um_last_error: %s)\n", um_last_error());             \
      nt_exit(1);                                                              \
    }                                                                          \
  } while (0)

#define NT_OK(call) NT_CHECK((call) == UM_OK, "%s", #call)

/* LeakSanitizer's check, where the build has it (weak: absent otherwise). */
extern void __lsan_do_leak_check(void) __attribute__((weak));

static UT_UNUSED void nt_exit(int rc) {
  fflush(stdout);
  fflush(stderr);
  if (rc == 0 && __lsan_do_leak_check != NULL)
    __lsan_do_leak_check();
#ifdef UT_TSAN
  /* ThreadSanitizer turns a reported race into exit status 66 at exit();
   * TSan builds run the tests without Criterion, whose exit handlers a
   * peer must not run. */
  exit(rc);
#else
  _exit(rc);
#endif
}

/* ------------------------------------------------------------------------ */
/* Peer processes */

typedef int (*nt_peer_fn)(int idx, void *arg);

static UT_UNUSED pid_t nt_spawn(nt_peer_fn fn, int idx, void *arg) {
  pid_t pid;
  fflush(stdout);
  fflush(stderr);
  pid = fork();
  cr_assert(pid >= 0, "fork: %s", strerror(errno));
  if (pid == 0) {
    /* A test killed for its timeout takes its peers along. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    nt_exit(fn(idx, arg));
  }
  return pid;
}

/* Exit status of a peer from waitpid's status: its code, 128 + signal. */
static UT_UNUSED int nt_status(int status) {
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* Exit status of a peer: its code, 128 + signal when killed, 124 when it
 * overran timeout_s (then killed). */
static UT_UNUSED int nt_reap(pid_t pid, int timeout_s) {
  struct timespec pause = {0, 10000000};
  int status;
  for (long waited = 0;; waited += 10) {
    if (waitpid(pid, &status, WNOHANG) == pid)
      return nt_status(status);
    if (waited >= (long)timeout_s * 1000) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return 124;
    }
    nanosleep(&pause, NULL);
  }
}

/* Reap every peer; skip the test when one skipped, fail when one failed.
 * Once one failed, the others (waiting for it, typically) are killed. */
static UT_UNUSED void nt_reap_all(const pid_t *pids, int n, int timeout_s) {
  struct timespec pause = {0, 10000000};
  int rc[8], left = n, skipped = 0, failed = 0;
  cr_assert(n <= 8);
  for (int i = 0; i < n; i++)
    rc[i] = -1;
  for (long waited = 0; left > 0; waited += 10) {
    for (int i = 0; i < n; i++) {
      int status;
      if (rc[i] != -1 || waitpid(pids[i], &status, WNOHANG) != pids[i])
        continue;
      rc[i] = nt_status(status);
      left--;
      if (rc[i] != 0 && rc[i] != NT_SKIP)
        failed++;
    }
    if (left > 0 && (failed > 0 || waited >= (long)timeout_s * 1000))
      for (int i = 0; i < n; i++)
        if (rc[i] == -1)
          kill(pids[i], SIGKILL);
    nanosleep(&pause, NULL);
  }
  for (int i = 0; i < n; i++) {
    if (rc[i] == NT_SKIP)
      skipped++;
    else if (rc[i] != 0)
      cr_log_error("peer %d exited with %d", i, rc[i]);
  }
  cr_assert_eq(failed, 0, "%d peer(s) failed (their reasons are above)", failed);
  for (int i = 0; i < n; i++)
    cr_assert_eq(rc[i] == NT_SKIP || rc[i] == 0, 1, "peer %d was killed: another one hung", i);
  if (skipped > 0)
    cr_skip_test("%d peer(s) skipped: UCX or the device they need is not here", skipped);
}

/* ------------------------------------------------------------------------ */
/* A peer's manager and net */

typedef struct nt_peer {
  um_manager *m;
  um_net *net;
} nt_peer;

/* Options of a peer: the cpu backend (plus backends when not NULL), the
 * given net timeout, small staging chunks so that pipelining shows. */
static UT_UNUSED void nt_options(um_options *o, const char *backends, uint32_t timeout_ms) {
  ut_options(o);
  if (backends != NULL)
    snprintf(o->backends, sizeof(o->backends), "%s", backends);
  o->net_timeout_ms = timeout_ms;
  o->staging_chunk_bytes = 256 * 1024;
}

/* Open a manager and its net; exits with NT_SKIP when UCX is missing. */
static UT_UNUSED void nt_open_opts(nt_peer *p, const um_options *o) {
  int st;
  NT_OK(um_manager_create(o, &p->m));
  st = um_net_create(p->m, &p->net);
  if (st == UM_ENOTSUP) {
    fprintf(stderr, "[pid %d] no UCX here: %s\n", (int)getpid(), um_last_error());
    um_manager_destroy(p->m);
    nt_exit(NT_SKIP);
  }
  NT_CHECK(st == UM_OK, "um_net_create: %s", um_err_name(st));
}

static UT_UNUSED void nt_open(nt_peer *p, uint32_t timeout_ms) {
  um_options o;
  nt_options(&o, NULL, timeout_ms);
  nt_open_opts(p, &o);
}

static UT_UNUSED void nt_close(nt_peer *p) {
  NT_OK(um_net_destroy(p->net));
  NT_OK(um_manager_destroy(p->m));
}

/* ------------------------------------------------------------------------ */
/* Exchanging blobs */

static UT_UNUSED void nt_send(int fd, const void *blob, size_t len) {
  NT_CHECK(nb_send(fd, blob, len) == 0, "nb_send: %s", strerror(errno));
}

static UT_UNUSED size_t nt_recv(int fd, void *buf, size_t cap) {
  size_t len = 0;
  NT_CHECK(nb_recv(fd, buf, cap, &len, NT_WAIT_MS) == 0, "nb_recv: %s", strerror(errno));
  return len;
}

/* A one-byte message: a step of a protocol between two peers. */
static UT_UNUSED void nt_signal(int fd, char what) { nt_send(fd, &what, 1); }

static UT_UNUSED void nt_expect(int fd, char what) {
  char got = 0;
  NT_CHECK(nt_recv(fd, &got, 1) == 1 && got == what, "expected message '%c', got '%c'", what, got);
}

/* Exchange addresses over fd and connect to the peer. */
static UT_UNUSED um_endpoint *nt_connect(nt_peer *p, int fd) {
  unsigned char mine[4096], theirs[4096];
  size_t len = sizeof(mine), tlen;
  um_endpoint *ep = NULL;
  NT_OK(um_net_address(p->net, mine, &len));
  nt_send(fd, mine, len);
  tlen = nt_recv(fd, theirs, sizeof(theirs));
  NT_OK(um_net_connect(p->net, theirs, tlen, &ep));
  return ep;
}

/* Expose b and send its key blob. */
static UT_UNUSED void nt_send_key(int fd, um_buffer *b) {
  unsigned char key[4096];
  size_t len = sizeof(key);
  NT_OK(um_net_expose(b, key, &len));
  nt_send(fd, key, len);
}

/* ------------------------------------------------------------------------ */
/* Patterns: byte i of pattern seed, distinct per seed and per 4 KiB page. */

static UT_UNUSED unsigned char nt_byte(unsigned seed, size_t i) {
  return (unsigned char)(seed * 131u + i * 7u + (i >> 12) * 13u + 1u);
}

static UT_UNUSED void nt_fill(void *p, size_t n, unsigned seed, size_t base) {
  unsigned char *b = p;
  for (size_t i = 0; i < n; i++)
    b[i] = nt_byte(seed, base + i);
}

/* Index of the first byte of p[0..n) that differs from want, or n. One
 * memcmp first: under ThreadSanitizer every byte read one at a time from
 * memory a peer wrote is a (suppressed, but slow) report. */
static UT_UNUSED size_t nt_diff(const void *p, const void *want, size_t n) {
  const unsigned char *a = p, *b = want;
  size_t i = 0;
  if (memcmp(p, want, n) == 0)
    return n;
  while (i < n && a[i] == b[i])
    i++;
  return i;
}

/* Index of the first byte that differs from the pattern, or n. */
static UT_UNUSED size_t nt_mismatch(const void *p, size_t n, unsigned seed, size_t base) {
  unsigned char *want = malloc(n);
  size_t i;
  NT_CHECK(want != NULL, "malloc");
  nt_fill(want, n, seed, base);
  i = nt_diff(p, want, n);
  free(want);
  return i;
}

#endif /* UNIMEM_NET_UTIL_H */
