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
  bool destroy;   /* um_net_destroy right after the revocation */
  bool net_alloc; /* the target's buffers come from um_net_alloc */
  bool wrap;      /* the exposed buffer wraps the target's own memory */
  uint32_t target_timeout_ms;
} rev_setup;

/* ------------------------------------------------------------------------ */
/* The target */

/* Revoke b while the put streams in, as the setup says. Returns 1 when
 * the revocation said a peer may still write the memory (a wrap's
 * UM_EBUSY from um_release, or um_net_unexpose's), 0 when it said none
 * can, -1 where it cannot tell. landed: the whole put was in place before
 * the revocation (the issuer stopped), when a stopped issuer cannot be
 * held up any more. */
static int target_revoke(const rev_setup *s, um_buffer *b, bool landed) {
  int st, unexposed = -1;
  if (s->how == REV_UNEXPOSE) {
    st = um_net_unexpose(b);
    OS_CHECK(st == UM_OK || st == UM_EBUSY, "um_net_unexpose: %s", um_err_name(st));
    if (s->stop && !landed)
      OS_CHECK(st == UM_EBUSY, "um_net_unexpose with the issuer stopped: %s", um_err_name(st));
    unexposed = st == UM_EBUSY;
  }
  st = um_release(b);
  if (s->wrap) { /* the caller's memory: it is told when the peer may still write it */
    OS_CHECK(st == UM_EBUSY || st == UM_OK, "um_release of the wrap: %s", um_err_name(st));
    return st == UM_EBUSY;
  }
  OS_CHECK(st == UM_OK, "um_release: %s", um_err_name(st));
  return unexposed;
}

/* Every byte of the put is in b (the issuer writes 0xa7). */
static bool put_landed(um_buffer *b) {
  const unsigned char *p = um_buffer_host_ptr(b);
  for (size_t i = 0; i < REV_BYTES; i++)
    if (p[i] != 0xa7)
      return false;
  return true;
}

/* Once the issuer's put ended (it released its admission), the old block
 * is no longer held: a trim gives it back, leaving the new buffer's only.
 * Not when the put failed on the issuer's side without a release (its
 * endpoint failed: 'b'), which leaves the block held for good. */
static void target_held_comes_back(os_peer *p, char put_status) {
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

/* The wrapped memory: never freed (a peer may still write it), reachable
 * (not a leak to LeakSanitizer). */
static void *rev_wrap_mem;

static um_buffer *target_alloc(const rev_setup *s, os_peer *p, unsigned flags) {
  um_buffer *b = NULL;
  if (s->wrap && flags == UM_ALLOC_ZERO) {
    OS_CHECK(posix_memalign(&rev_wrap_mem, 4096, REV_BYTES) == 0, "posix_memalign");
    memset(rev_wrap_mem, 0, REV_BYTES);
    OS_OK(um_wrap_host(p->m, rev_wrap_mem, REV_BYTES, 0, &b));
  } else if (s->net_alloc && !s->destroy)
    OS_OK(um_net_alloc(p->net, REV_BYTES, flags, &b));
  else
    OS_OK(um_alloc(p->m, um_device_get(p->m, 0), REV_BYTES, UM_HOST, flags, &b));
  return b;
}

/* Wait until the put is landing (its first bytes are in), then stop the
 * issuer if asked and revoke; then the same size again (with the old block
 * back in the pool, this would be it), filled with the pattern. */
/* *held: whether the revocation gave up (the old memory was held back), 1
 * or 0, or -1 where the target cannot tell. Over shared memory the whole
 * put can land between its first byte and the revocation (the target
 * descheduled in between, on a loaded machine); then it was never revoked
 * mid-way, and the issuer's UM_OK is the right answer: *held is 0 when the
 * stopped issuer's put is all in place. */
static um_buffer *target_revoke_and_realloc(const rev_setup *s, os_peer *p, um_buffer *b, int *held) {
  volatile unsigned char *first = (volatile unsigned char *)um_buffer_host_ptr(b);
  void *old = um_buffer_host_ptr(b);
  um_buffer *again;
  bool landed = false;
  for (uint64_t end = os_now_ms() + REV_WAIT_MS; first[0] == 0;) /* no sleep: the window stays short */
    OS_CHECK(os_now_ms() < end, "no byte of the put arrived");
  if (s->stop) {
    OS_CHECK(kill(s->issuer, SIGSTOP) == 0, "SIGSTOP: %s", strerror(errno));
    os_sleep_ms(20); /* the stop takes effect */
    landed = put_landed(b);
  }
  *held = target_revoke(s, b, landed);
  if (landed && !s->wrap)
    *held = 0;
  if (s->destroy) /* the net goes while the issuer may still write */
    OS_OK(um_net_destroy(p->net));
  again = target_alloc(s, p, 0);
  /* A pooled block not held back is the one the next allocation of its
   * size gets. */
  if (*held < 0 && !s->destroy && !s->net_alloc)
    *held = um_buffer_host_ptr(again) != old;
  else if (*held == 1 && !s->destroy && !s->net_alloc && !s->wrap)
    OS_CHECK(um_buffer_host_ptr(again) != old, "um_net_unexpose said UM_EBUSY and the block was handed out again");
  os_pattern(um_buffer_host_ptr(again), REV_BYTES, REV_SEED);
  if (s->stop)
    OS_CHECK(kill(s->issuer, SIGCONT) == 0, "SIGCONT: %s", strerror(errno));
  return again;
}

static int rev_target(int idx, void *arg) {
  rev_setup *s = arg;
  int fd = s->fds[idx];
  unsigned char key[4096];
  size_t klen = sizeof(key), bad = SIZE_MAX;
  um_endpoint *ep;
  um_buffer *b, *again;
  char word = 'x', status[2];
  os_peer p;
  int held;
  int rc = os_peer_open(&p, s->target_timeout_ms);
  if (rc != 0) {
    os_send(fd, &word, 1);
    return rc;
  }
  word = 'g';
  os_send(fd, &word, 1);
  /* The target is passive: an endpoint of its own only where the net
   * stays (closing one to a stopped issuer is another matter). */
  ep = os_connect(&p, fd, !s->destroy);
  b = target_alloc(s, &p, UM_ALLOC_ZERO);
  OS_OK(um_net_expose(b, key, &klen));
  os_send(fd, key, klen);
  again = target_revoke_and_realloc(s, &p, b, &held);
  OS_CHECK(os_recv(fd, status, sizeof(status), REV_WAIT_MS) == 2, "the issuer's statuses");
  /* A while longer: whatever the old put still had to write is written. */
  for (uint64_t end = os_now_ms() + 500; os_now_ms() < end && bad == SIZE_MAX; os_sleep_ms(50))
    bad = os_pattern_diff(um_buffer_host_ptr(again), REV_BYTES, REV_SEED);
  OS_CHECK(bad == SIZE_MAX, "byte %zu of the new buffer was overwritten after the revocation", bad);
  OS_CHECK(status[0] != 'k' || held == 0, "the issuer was told UM_OK for a put into a revoked exposure (held %d)",
           held);
  OS_CHECK(status[1] == 'r', "a put issued after the revocation: %c", status[1]);
  if (!s->destroy && !s->net_alloc && !s->wrap)
    target_held_comes_back(&p, status[0]);
  os_send(fd, "q", 1);
  OS_OK(um_release(again));
  if (!s->destroy) {
    OS_OK(um_endpoint_close(ep));
    OS_OK(um_net_destroy(p.net));
  }
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
  os_peer p;
  OS_CHECK(os_recv(fd, &word, 1, REV_WAIT_MS) == 1, "no word from the target");
  if (word != 'g')
    return OS_SKIP;
  /* Shorter when the target's net goes: over shared memory nothing answers
   * the issuer's flush any more, and the timeout finds it. */
  OS_CHECK(os_peer_open(&p, s->destroy ? 3000 : 20000) == 0, "the target has UCX, the issuer has not");
  ep = os_connect(&p, fd, true);
  klen = os_recv(fd, key, sizeof(key), REV_WAIT_MS);
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
  os_send(fd, status, 2);
  OS_CHECK(os_recv(fd, &word, 1, REV_WAIT_MS) == 1 && word == 'q', "the target's last word");
  (void)um_endpoint_close(ep);
  OS_OK(um_release(src));
  os_peer_close(&p);
  return 0;
}

static void rev_run(rev_how how, bool stop, uint32_t target_timeout_ms, unsigned variant) {
  rev_setup s;
  pid_t target;
  memset(&s, 0, sizeof(s));
  cr_assert_eq(nb_pair(s.fds), 0);
  s.how = how;
  s.stop = stop;
  s.destroy = (variant & 1u) != 0;
  s.net_alloc = (variant & 2u) != 0;
  s.wrap = (variant & 4u) != 0;
  s.target_timeout_ms = target_timeout_ms;
  s.issuer = os_spawn(rev_issuer, 1, &s);
  target = os_spawn(rev_target, 0, &s);
  os_expect_peer(target, 200000, "target");
  /* The issuer's last steps close an endpoint and a net whose peer is
   * gone: each may wait out its net timeout (20 s) on a loaded machine. */
  os_expect_peer(s.issuer, 90000, "issuer");
  close(s.fds[0]);
  close(s.fds[1]);
}

#define REV_DESTROY 1u   /* um_net_destroy after the revocation */
#define REV_NET_ALLOC 2u /* buffers of um_net_alloc */
#define REV_WRAP 4u      /* the exposed buffer a um_wrap_host */

/* A net timeout shorter than the put: the revocation gives up while the
 * put is still moving. */
Test(net_revoke, release_shorter_than_the_put, .timeout = 300) { rev_run(REV_RELEASE, false, 5, 0); }
Test(net_revoke, unexpose_shorter_than_the_put, .timeout = 300) { rev_run(REV_UNEXPOSE, false, 5, 0); }

/* The issuer stopped mid-put: the revocation gives up, the issuer goes on
 * once the new buffer is in place. */
Test(net_revoke, release_issuer_stopped, .timeout = 300) { rev_run(REV_RELEASE, true, 300, 0); }
Test(net_revoke, unexpose_issuer_stopped, .timeout = 300) { rev_run(REV_UNEXPOSE, true, 300, 0); }

/* The same with the target's net destroyed before the issuer goes on: the
 * held block is kept for good, not freed with the net. */
Test(net_revoke, release_issuer_stopped_then_net_destroyed, .timeout = 300) {
  rev_run(REV_RELEASE, true, 300, REV_DESTROY);
}

/* Memory of um_net_alloc (which a shared-memory peer writes directly):
 * held too, not given back to UCX while the put may still write it. */
Test(net_revoke, net_alloc_release_issuer_stopped, .timeout = 300) {
  rev_run(REV_RELEASE, true, 300, REV_NET_ALLOC);
}
Test(net_revoke, net_alloc_unexpose_shorter_than_the_put, .timeout = 300) {
  rev_run(REV_UNEXPOSE, false, 5, REV_NET_ALLOC);
}

/* A wrap: unimem cannot keep the caller's memory, so um_release says that
 * a peer may still write it (UM_EBUSY). */
Test(net_revoke, wrap_release_issuer_stopped, .timeout = 300) { rev_run(REV_RELEASE, true, 300, REV_WRAP); }
