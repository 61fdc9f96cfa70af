/* A passive target whose writer is killed (SIGKILL) in the middle of a
 * large put into it: the target survives, what it issued itself to the
 * writer fails with UM_EBACKEND (or had completed), and it destroys its
 * endpoint, net and manager cleanly, every call bounded.
 *
 * Three processes per round, all forked by this one (which never loads
 * UCX): the target T, the writer W, and this process, which kills W a few
 * milliseconds after W's put started. The round runs several times in one
 * test (a crash that shows in some runs only shows here). Every other round
 * leaves the endpoint and the net to um_manager_destroy. Run once per UCX
 * transport (tcp, posix, sysv). */
#include "outside.h"

#define PEER_BYTES (64u << 20)
#define PEER_ROUNDS 4
#define PEER_TIMEOUT_MS 1000 /* net_timeout_ms: finds the dead writer on shared memory */
#define PEER_WAIT_MS 60000
#define PEER_CALL_MS 20000 /* a call that may wait: the timeout, many times over */

typedef struct peers_setup {
  int tw[2]; /* T <-> W */
  int ct[2]; /* this process <-> T */
  int cw[2]; /* this process <-> W */
  int terr;  /* T's stderr: a file this process reads once T ended */
  int mode;  /* MODE_* */
  int round;
} peers_setup;

/* What T does while W puts, one test each: issue a get and a put of its
 * own to W; nothing at all, not even connect (W's endpoint is UCX's own on
 * T's side); or connect to W and issue nothing (its endpoint then carries
 * the acknowledgements of W's put, which a dead W never takes). Each with
 * both teardowns (round % 2). */
enum { MODE_ISSUING, MODE_PASSIVE, MODE_CONNECTED };

/* ------------------------------------------------------------------------ */
/* Helpers of a peer process */

static size_t pexpose(int fd, um_buffer *b) {
  unsigned char key[4096];
  size_t len = sizeof(key);
  OS_OK(um_net_expose(b, key, &len));
  os_send(fd, key, len);
  return len;
}

/* Calls that may wait, each on a thread of its own, bounded. */
typedef struct pcall {
  int what;
  void *h;
  char text[256]; /* um_last_error() of the call's thread */
} pcall;

enum { CALL_WAIT, CALL_CLOSE, CALL_NET_DESTROY, CALL_MANAGER_DESTROY, CALL_UNEXPOSE, CALL_RELEASE };

static int pcall_switch(pcall *c) {
  switch (c->what) {
  case CALL_WAIT: return um_event_wait(c->h);
  case CALL_CLOSE: return um_endpoint_close(c->h);
  case CALL_NET_DESTROY: return um_net_destroy(c->h);
  case CALL_MANAGER_DESTROY: return um_manager_destroy(c->h);
  case CALL_UNEXPOSE: return um_net_unexpose(c->h);
  default: return um_release(c->h);
  }
}

static int pcall_run(void *arg) {
  pcall *c = arg;
  int st = pcall_switch(c);
  snprintf(c->text, sizeof(c->text), "%s", st == UM_OK ? "" : um_last_error());
  return st;
}

/* The call's result; *text (may be NULL) receives its error text. The
 * record is leaked on a hang: the thread may still write it. */
static int pbounded_text(int what, void *h, const char *name, char *text, size_t cap) {
  pcall *c = calloc(1, sizeof(*c));
  int st = 0;
  OS_CHECK(c != NULL, "calloc");
  c->what = what;
  c->h = h;
  OS_CHECK(os_try_bounded(pcall_run, c, PEER_CALL_MS, &st) == 0, "%s did not return within %u ms (a hang)",
           name, PEER_CALL_MS);
  if (text != NULL)
    snprintf(text, cap, "%s", c->text);
  free(c);
  return st;
}

static int pbounded(int what, void *h, const char *name) { return pbounded_text(what, h, name, NULL, 0); }

/* ------------------------------------------------------------------------ */
/* The target: exposes a large buffer for W's put, and issues a get and a
 * put of its own to W, in flight when W dies. */

/* An operation T issued, in flight at the kill: it completed before, or
 * fails with UM_EBACKEND. */
static void target_op_ended(um_event *ev, const char *what) {
  char text[256];
  int st = pbounded_text(CALL_WAIT, ev, what, text, sizeof(text));
  OS_CHECK(st == UM_OK || st == UM_EBACKEND, "%s: %s", what, um_err_name(st));
  fprintf(stderr, "[pid %d] %s: %s (%s)\n", (int)getpid(), what, um_err_name(st),
          st == UM_OK ? "completed before the kill" : text);
  um_event_release(ev);
}

/* After the kill: a new operation to W fails, at issue or at its end. */
static void target_op_after(um_endpoint *ep, um_buffer *b, const unsigned char *key, size_t klen) {
  um_event *ev = NULL;
  int st = um_net_put(ep, b, 0, key, klen, 0, 4096, &ev);
  if (st == UM_OK)
    st = pbounded(CALL_WAIT, ev, "put after the kill"), um_event_release(ev);
  OS_CHECK(st == UM_EBACKEND, "put after the writer died: %s", um_err_name(st));
}

static void target_teardown(os_peer *p, um_endpoint *ep, um_buffer *const bufs[3], int round) {
  int st = pbounded(CALL_UNEXPOSE, bufs[0], "um_net_unexpose");
  /* UM_EBUSY: the writer's admitted put never finished (it died). */
  OS_CHECK(st == UM_OK || st == UM_EBUSY, "um_net_unexpose: %s", um_err_name(st));
  if (round % 2 == 0) {
    OS_CHECK((st = pbounded(CALL_CLOSE, ep, "um_endpoint_close")) == UM_OK, "um_endpoint_close: %s",
             um_err_name(st));
    for (int i = 0; i < 3; i++)
      OS_CHECK((st = pbounded(CALL_RELEASE, bufs[i], "um_release")) == UM_OK, "um_release: %s",
               um_err_name(st));
    OS_CHECK((st = pbounded(CALL_NET_DESTROY, p->net, "um_net_destroy")) == UM_OK, "um_net_destroy: %s",
             um_err_name(st));
    OS_CHECK((st = pbounded(CALL_MANAGER_DESTROY, p->m, "um_manager_destroy")) == UM_OK,
             "um_manager_destroy: %s", um_err_name(st));
  } else { /* the endpoint, the net and the buffers left to the manager */
    st = pbounded(CALL_MANAGER_DESTROY, p->m, "um_manager_destroy");
    OS_CHECK(st == UM_ELEAK, "um_manager_destroy with buffers left: %s", um_err_name(st));
  }
}

/* A target that never calls anything of the net while W puts: its
 * address and key out, then, once W was killed, the teardown. */
static int passive_target(os_peer *p, int fd, int ctl, int round) {
  unsigned char mine[4096], wkey[4096];
  size_t len = sizeof(mine);
  um_buffer *b;
  int st;
  OS_OK(um_net_address(p->net, mine, &len));
  os_send(fd, mine, len);
  (void)os_recv(fd, mine, sizeof(mine), PEER_WAIT_MS); /* W's address: not used */
  OS_OK(um_alloc(p->m, um_device_get(p->m, 0), PEER_BYTES, UM_HOST, 0, &b));
  memset(um_buffer_host_ptr(b), 0, PEER_BYTES);
  (void)pexpose(fd, b);
  (void)os_recv(fd, wkey, sizeof(wkey), PEER_WAIT_MS);
  os_send(fd, "s", 1);
  os_expect(ctl, 'k', PEER_WAIT_MS);
  st = pbounded(CALL_UNEXPOSE, b, "um_net_unexpose");
  OS_CHECK(st == UM_OK || st == UM_EBUSY, "um_net_unexpose: %s", um_err_name(st));
  OS_CHECK((st = pbounded(CALL_RELEASE, b, "um_release")) == UM_OK, "um_release: %s", um_err_name(st));
  if (round % 2 == 0)
    OS_CHECK((st = pbounded(CALL_NET_DESTROY, p->net, "um_net_destroy")) == UM_OK, "um_net_destroy: %s",
             um_err_name(st));
  OS_CHECK((st = pbounded(CALL_MANAGER_DESTROY, p->m, "um_manager_destroy")) == UM_OK,
           "um_manager_destroy: %s", um_err_name(st));
  return 0;
}

static int peers_target(int idx, void *arg) {
  peers_setup *k = arg;
  int fd = k->tw[0], ctl = k->ct[1];
  unsigned char wkey[4096];
  size_t wklen;
  um_buffer *bufs[3]; /* exposed to W, the get's destination, the put's source */
  um_event *get = NULL, *put = NULL;
  um_endpoint *ep;
  os_peer p;
  int rc;
  (void)idx;
  OS_CHECK(dup2(k->terr, 2) == 2, "dup2: %s", strerror(errno));
  if ((rc = os_peer_open(&p, PEER_TIMEOUT_MS)) != 0) {
    os_send(fd, "x", 1);
    return rc;
  }
  os_send(fd, "g", 1);
  if (k->mode == MODE_PASSIVE)
    return passive_target(&p, fd, ctl, k->round);
  ep = os_connect(&p, fd, true);
  for (int i = 0; i < 3; i++)
    OS_OK(um_alloc(p.m, um_device_get(p.m, 0), PEER_BYTES, UM_HOST, 0, &bufs[i]));
  memset(um_buffer_host_ptr(bufs[0]), 0, PEER_BYTES);
  (void)pexpose(fd, bufs[0]);
  wklen = os_recv(fd, wkey, sizeof(wkey), PEER_WAIT_MS);
  if (k->mode == MODE_ISSUING) {
    OS_OK(um_net_get(ep, bufs[1], 0, wkey, wklen, 0, PEER_BYTES, &get));
    OS_OK(um_net_put(ep, bufs[2], 0, wkey, wklen, 0, PEER_BYTES, &put));
  }
  os_send(fd, "s", 1); /* W starts its put */
  os_expect(ctl, 'k', PEER_WAIT_MS); /* W was killed */
  if (k->mode == MODE_ISSUING) {
    target_op_ended(get, "get in flight");
    target_op_ended(put, "put in flight");
    target_op_after(ep, bufs[2], wkey, wklen);
  }
  target_teardown(&p, ep, bufs, k->round);
  return 0;
}

/* ------------------------------------------------------------------------ */
/* The writer: a large put into T, then more, until killed. */

static int peers_writer(int idx, void *arg) {
  peers_setup *k = arg;
  int fd = k->tw[1], ctl = k->cw[1];
  unsigned char tkey[4096];
  size_t tklen;
  um_buffer *src, *mine;
  um_endpoint *ep;
  um_event *ev;
  char go = 0;
  os_peer p;
  (void)idx;
  OS_CHECK(os_recv(fd, &go, 1, PEER_WAIT_MS) == 1, "no word from T");
  if (go != 'g') {
    os_send(ctl, "x", 1);
    return OS_SKIP;
  }
  OS_CHECK(os_peer_open(&p, PEER_TIMEOUT_MS) == 0, "T has UCX, W has not");
  ep = os_connect(&p, fd, true);
  OS_OK(um_alloc(p.m, um_device_get(p.m, 0), PEER_BYTES, UM_HOST, 0, &src));
  OS_OK(um_alloc(p.m, um_device_get(p.m, 0), PEER_BYTES, UM_HOST, 0, &mine));
  os_pattern(um_buffer_host_ptr(src), PEER_BYTES, 0x3c);
  tklen = os_recv(fd, tkey, sizeof(tkey), PEER_WAIT_MS);
  (void)pexpose(fd, mine);
  os_expect(fd, 's', PEER_WAIT_MS);
  OS_OK(um_net_put(ep, src, 0, tkey, tklen, 0, PEER_BYTES, &ev));
  os_send(ctl, "p", 1); /* putting: kill me */
  for (;;)
    (void)um_net_put(ep, src, 0, tkey, tklen, 0, PEER_BYTES, NULL);
  return 1;
}

/* ------------------------------------------------------------------------ */

/* T's stderr, copied to this process's; whether it shows UCX's own abort
 * of a software-RMA handler after the writer died, which UCX 1.13 cannot
 * avoid over tcp (docs/guide.md, "A peer that dies mid-transfer";
 * tests/net/ucx_put_peer_killed.c shows it with UCX alone). */
static bool target_log_shows_ucx_abort(int fd) {
  static char text[1 << 16];
  ssize_t n = pread(fd, text, sizeof(text) - 1, 0);
  text[n > 0 ? n : 0] = '\0';
  fputs(text, stderr);
  return (strstr(text, "Fatal: unexpected error") != NULL || strstr(text, "Assertion `") != NULL) &&
         (strstr(text, "ucp_put_handler") != NULL || strstr(text, "ucp_atomic_req_handler") != NULL ||
          strstr(text, "ucp_request_send_state_ff") != NULL);
}

static bool over_tcp(void) {
  const char *tls = getenv("UCX_TLS");
  return tls != NULL && strncmp(tls, "tcp", 3) == 0;
}

/* One round: 0 when T passed, 1 when UCX aborted it over tcp. */
static int peers_round(int mode, int round) {
  peers_setup k;
  char path[] = "/tmp/unimem_peers_XXXXXX";
  pid_t t, w;
  size_t len = 0;
  char what = 0;
  bool ucx_abort;
  int rc;
  k.mode = mode;
  k.round = round;
  cr_assert((k.terr = mkstemp(path)) >= 0, "mkstemp: %s", strerror(errno));
  unlink(path);
  cr_assert_eq(nb_pair(k.tw), 0);
  cr_assert_eq(nb_pair(k.ct), 0);
  cr_assert_eq(nb_pair(k.cw), 0);
  t = os_spawn(peers_target, 0, &k);
  w = os_spawn(peers_writer, 0, &k);
  cr_assert_eq(nb_recv(k.cw[0], &what, 1, &len, PEER_WAIT_MS), 0, "no word from the writer");
  if (what == 'x') {
    os_reap(w, 10000);
    os_reap(t, 10000);
    cr_skip_test("no UCX here");
  }
  cr_assert_eq(what, 'p', "the writer said '%c'", what);
  os_sleep_ms(2u + 11u * (unsigned)round); /* mid-put: 64 MiB take longer */
  cr_assert_eq(kill(w, SIGKILL), 0);
  cr_assert_eq(os_reap(w, 10000), 128 + SIGKILL, "the writer died of the kill");
  cr_assert_eq(nb_send(k.ct[0], "k", 1), 0);
  rc = os_reap(t, 120000);
  ucx_abort = target_log_shows_ucx_abort(k.terr);
  close(k.terr);
  for (int i = 0; i < 2; i++) {
    close(k.tw[i]);
    close(k.ct[i]);
    close(k.cw[i]);
  }
  if (rc == 128 + SIGABRT && ucx_abort && over_tcp()) {
    fprintf(stderr, "WARN: round %d: UCX aborted the target in its software-RMA handler (UCX over tcp "
                    "cannot survive a writer killed mid-put; see above)\n",
            round);
    return 1;
  }
  cr_assert_eq(rc, 0, "round %d: the target ended with status %d (134: abort, 124: hang; its reason is above)",
               round, rc);
  return 0;
}

/* Over tcp, UCX 1.13 itself aborts the target in some rounds; those are
 * counted and the test is skipped with the count (never a silent pass);
 * any other end of the target still fails it. */
static void peers_rounds(int mode) {
  int aborted = 0;
  for (int round = 0; round < PEER_ROUNDS; round++)
    aborted += peers_round(mode, round);
  if (aborted > 0)
    cr_skip_test("UCX over tcp aborted the target in %d of %d rounds (a UCX limitation: docs/guide.md); "
                 "every other check held",
                 aborted, PEER_ROUNDS);
}

Test(net_peers, writer_killed_target_issuing, .timeout = 300) { peers_rounds(MODE_ISSUING); }

Test(net_peers, writer_killed_target_passive, .timeout = 300) { peers_rounds(MODE_PASSIVE); }

Test(net_peers, writer_killed_target_connected, .timeout = 300) { peers_rounds(MODE_CONNECTED); }

/* Criterion's own main fails a run in which a test skipped; this one exits
 * 77 (CTest: skipped) when none failed and some skipped, with the first
 * reason, so the tcp entry shows as skipped rather than passed or failed.
 * The TSan stand-in of Criterion brings its own main. */
#ifndef OS_TSAN
#include <criterion/hooks.h>

static struct criterion_global_stats peers_stats;
static char peers_skip_reason[512];

ReportHook(POST_TEST)(struct criterion_test_stats *stats) {
  if (stats->test_status == CR_STATUS_SKIPPED && stats->message != NULL && peers_skip_reason[0] == '\0')
    snprintf(peers_skip_reason, sizeof(peers_skip_reason), "%s", stats->message);
}

ReportHook(POST_ALL)(struct criterion_global_stats *stats) { peers_stats = *stats; }

int main(int argc, char *argv[]) {
  struct criterion_test_set *tests = criterion_initialize();
  int ran = criterion_handle_args(argc, argv, true);
  bool ok;
  if (ran)
    (void)criterion_run_all_tests(tests);
  criterion_finalize(tests);
  if (!ran)
    return 0;
  ok = peers_stats.tests_failed == 0 && peers_stats.tests_crashed == 0 &&
       peers_stats.tests_passed + peers_stats.tests_skipped == peers_stats.nb_tests;
  if (ok && peers_stats.tests_skipped > 0) {
    printf("SKIP: %zu of %zu tests: %s\n", peers_stats.tests_skipped, peers_stats.nb_tests, peers_skip_reason);
    return OS_SKIP;
  }
  return ok ? 0 : 1;
}
#endif
