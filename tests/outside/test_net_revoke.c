/* A revocation that gives up must not hand the memory back: a target
 * exposes a large HOST buffer, a peer streams a put into it, the target
 * revokes (um_release, or um_net_unexpose then um_release) with a net
 * timeout shorter than the put, or while the issuer is stopped (SIGSTOP),
 * and allocates the same size again. Its new buffer must never be written
 * by the old put, and the issuer must not be told UM_OK for a put whose
 * target revoked the exposure before the data was all in place.
 *
 * Two processes, run once per UCX transport (tcp, posix, sysv). */
#include "outside.h"

#define REV_BYTES (256u << 20)
#define REV_WAIT_MS 60000
#define REV_SEED 0x5eu

typedef enum { REV_RELEASE, REV_UNEXPOSE } rev_how;

typedef struct rev_setup {
  int fds[2];
  pid_t issuer;   /* set before the target is forked */
  rev_how how;
  bool stop;      /* SIGSTOP the issuer while it puts */
  uint32_t target_timeout_ms;
} rev_setup;

typedef struct rpeer {
  um_manager *m;
  um_net *net;
} rpeer;

static int rpeer_open(rpeer *p, uint32_t timeout_ms) {
  um_options o;
  int st;
  os_options(&o);
  o.net_timeout_ms = timeout_ms;
  OS_OK(um_manager_create(&o, &p->m));
  st = um_net_create(p->m, &p->net);
  if (st == UM_ENOTSUP) {
    um_manager_destroy(p->m);
    return OS_SKIP;
  }
  OS_CHECK(st == UM_OK, "um_net_create: %s", um_err_name(st));
  return 0;
}

static void rsend(int fd, const void *blob, size_t len) {
  OS_CHECK(nb_send(fd, blob, len) == 0, "nb_send: %s", strerror(errno));
}

static size_t rrecv(int fd, void *buf, size_t cap) {
  size_t len = 0;
  OS_CHECK(nb_recv(fd, buf, cap, &len, REV_WAIT_MS) == 0, "nb_recv: %s", strerror(errno));
  return len;
}

static um_endpoint *rconnect(rpeer *p, int fd) {
  unsigned char mine[4096], theirs[4096];
  size_t len = sizeof(mine), tlen;
  um_endpoint *ep = NULL;
  OS_OK(um_net_address(p->net, mine, &len));
  rsend(fd, mine, len);
  tlen = rrecv(fd, theirs, sizeof(theirs));
  OS_OK(um_net_connect(p->net, theirs, tlen, &ep));
  return ep;
}

/* ------------------------------------------------------------------------ */
/* The target */

/* Revoke b while the put streams in, as the setup says. */
static void target_revoke(const rev_setup *s, um_buffer *b) {
  int st;
  if (s->how == REV_UNEXPOSE) {
    st = um_net_unexpose(b);
    OS_CHECK(st == UM_OK || st == UM_EBUSY, "um_net_unexpose: %s", um_err_name(st));
    if (s->stop)
      OS_CHECK(st == UM_EBUSY, "um_net_unexpose with the issuer stopped: %s", um_err_name(st));
  }
  OS_OK(um_release(b));
}

/* Once the issuer's put ended (it released its admission), the old block
 * is no longer held: a trim gives it back, leaving the new buffer's only.
 * Not when the put failed on the issuer's side without a release (its
 * endpoint failed: 'b'), which leaves the block held for good. */
static void target_held_comes_back(rpeer *p, char put_status) {
  um_stats st;
  uint64_t end = os_now_ms() + 10000;
  if (put_status == 'b')
    return;
  for (;;) {
    OS_OK(um_pool_trim(p->m, 0));
    OS_OK(um_stats_get(p->m, um_device_get(p->m, 0), &st));
    if (st.bytes_reserved <= REV_BYTES)
      break;
    OS_CHECK(os_now_ms() < end, "the held block never came back: %llu bytes reserved",
             (unsigned long long)st.bytes_reserved);
    os_sleep_ms(20);
  }
}

static int rev_target(int idx, void *arg) {
  rev_setup *s = arg;
  int fd = s->fds[idx];
  unsigned char key[4096];
  size_t klen = sizeof(key), bad = SIZE_MAX;
  volatile unsigned char *first;
  um_endpoint *ep;
  um_buffer *b, *again;
  char word = 'x', status[2];
  uint64_t end;
  rpeer p;
  int rc = rpeer_open(&p, s->target_timeout_ms);
  if (rc != 0) {
    rsend(fd, &word, 1);
    return rc;
  }
  word = 'g';
  rsend(fd, &word, 1);
  ep = rconnect(&p, fd);
  OS_OK(um_alloc(p.m, um_device_get(p.m, 0), REV_BYTES, UM_HOST, UM_ALLOC_ZERO, &b));
  first = (volatile unsigned char *)um_buffer_host_ptr(b);
  OS_OK(um_net_expose(b, key, &klen));
  rsend(fd, key, klen);
  /* The put is landing: its first bytes are in. */
  for (end = os_now_ms() + REV_WAIT_MS; first[0] == 0;) {
    OS_CHECK(os_now_ms() < end, "no byte of the put arrived");
    os_sleep_ms(1);
  }
  if (s->stop)
    OS_CHECK(kill(s->issuer, SIGSTOP) == 0, "SIGSTOP: %s", strerror(errno));
  target_revoke(s, b);
  /* The same size again: with the old block back in the pool, this is it. */
  OS_OK(um_alloc(p.m, um_device_get(p.m, 0), REV_BYTES, UM_HOST, 0, &again));
  os_pattern(um_buffer_host_ptr(again), REV_BYTES, REV_SEED);
  if (s->stop)
    OS_CHECK(kill(s->issuer, SIGCONT) == 0, "SIGCONT: %s", strerror(errno));
  OS_CHECK(rrecv(fd, status, sizeof(status)) == 2, "the issuer's statuses");
  /* A while longer: whatever the old put still had to write is written. */
  for (end = os_now_ms() + 500; os_now_ms() < end && bad == SIZE_MAX; os_sleep_ms(50))
    bad = os_pattern_diff(um_buffer_host_ptr(again), REV_BYTES, REV_SEED);
  OS_CHECK(bad == SIZE_MAX, "byte %zu of the new buffer was overwritten after the revocation", bad);
  OS_CHECK(status[0] != 'k', "the issuer was told UM_OK for a put into a revoked exposure");
  OS_CHECK(status[1] == 'r', "a put issued after the revocation: %c", status[1]);
  target_held_comes_back(&p, status[0]);
  rsend(fd, "q", 1);
  OS_OK(um_endpoint_close(ep));
  OS_OK(um_release(again));
  OS_OK(um_net_destroy(p.net));
  OS_OK(um_manager_destroy(p.m));
  return 0;
}

/* ------------------------------------------------------------------------ */
/* The issuer */

static char status_char(int st) { return st == UM_OK ? 'k' : st == UM_ESTATE ? 'r' : st == UM_EBACKEND ? 'b' : '?'; }

static int rev_issuer(int idx, void *arg) {
  rev_setup *s = arg;
  int fd = s->fds[idx], st;
  unsigned char key[4096];
  size_t klen;
  um_endpoint *ep;
  um_buffer *src;
  um_event *ev;
  char word = 0, status[2];
  rpeer p;
  OS_CHECK(rrecv(fd, &word, 1) == 1, "no word from the target");
  if (word != 'g')
    return OS_SKIP;
  OS_CHECK(rpeer_open(&p, 20000) == 0, "the target has UCX, the issuer has not");
  ep = rconnect(&p, fd);
  klen = rrecv(fd, key, sizeof(key));
  OS_OK(um_alloc(p.m, um_device_get(p.m, 0), REV_BYTES, UM_HOST, 0, &src));
  memset(um_buffer_host_ptr(src), 0xa7, REV_BYTES);
  OS_OK(um_net_put(ep, src, 0, key, klen, 0, REV_BYTES, &ev));
  st = um_event_wait(ev);
  um_event_release(ev);
  fprintf(stderr, "[pid %d] the put revoked under it: %s (%s)\n", (int)getpid(), um_err_name(st),
          st == UM_OK ? "" : um_last_error());
  OS_CHECK(st == UM_OK || st == UM_ESTATE || st == UM_EBACKEND, "put: %s", um_err_name(st));
  status[0] = status_char(st);
  if (st == UM_EBACKEND) /* the endpoint is gone: nothing more to try */
    status[1] = 'r';
  else
    status[1] = status_char(um_net_put(ep, src, 0, key, klen, 0, 4096, NULL));
  rsend(fd, status, 2);
  OS_CHECK(rrecv(fd, &word, 1) == 1 && word == 'q', "the target's last word");
  (void)um_endpoint_close(ep);
  OS_OK(um_release(src));
  OS_OK(um_net_destroy(p.net));
  OS_OK(um_manager_destroy(p.m));
  return 0;
}

static void rev_run(rev_how how, bool stop, uint32_t target_timeout_ms) {
  rev_setup s;
  pid_t target;
  memset(&s, 0, sizeof(s));
  cr_assert_eq(nb_pair(s.fds), 0);
  s.how = how;
  s.stop = stop;
  s.target_timeout_ms = target_timeout_ms;
  s.issuer = os_spawn(rev_issuer, 1, &s);
  target = os_spawn(rev_target, 0, &s);
  os_expect_peer(target, 200000, "target");
  os_expect_peer(s.issuer, 30000, "issuer");
  close(s.fds[0]);
  close(s.fds[1]);
}

/* A net timeout shorter than the put: the revocation gives up while the
 * put is still moving. */
Test(net_revoke, release_shorter_than_the_put, .timeout = 300) { rev_run(REV_RELEASE, false, 5); }
Test(net_revoke, unexpose_shorter_than_the_put, .timeout = 300) { rev_run(REV_UNEXPOSE, false, 5); }

/* The issuer stopped mid-put: the revocation gives up, the issuer goes on
 * once the new buffer is in place. */
Test(net_revoke, release_issuer_stopped, .timeout = 300) { rev_run(REV_RELEASE, true, 300); }
Test(net_revoke, unexpose_issuer_stopped, .timeout = 300) { rev_run(REV_UNEXPOSE, true, 300); }
