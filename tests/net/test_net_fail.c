/* um_net failures between forked processes: a peer killed mid-transfer
 * (SIGKILL) fails what is in flight to it with UM_EBACKEND, within the
 * timeout and never a hang; a buffer unexposed or released before a
 * remote put is not written, and the put fails with UM_ESTATE.
 *
 * CTest runs this file once per UCX transport here (tests/net.cmake). Over
 * tcp UCX reports the dead peer itself; over shared memory it cannot, and
 * the net timeout (2 s here) finds it. */
#include "net_util.h"

#define KILL_TIMEOUT_MS 2000
#define BIG (64u << 20)

/* ------------------------------------------------------------------------ */
/* A peer killed mid-stream */

typedef struct kill_setup {
  int fds[2];
  pid_t target; /* filled by the parent before the issuer is forked */
} kill_setup;

static int kill_target(int idx, void *arg) {
  kill_setup *k = arg;
  int fd = k->fds[idx];
  nt_peer p;
  um_buffer *b;
  nt_open(&p, 20000);
  (void)nt_connect(&p, fd);
  NT_OK(um_alloc(p.m, um_device_get(p.m, 0), BIG, UM_HOST, 0, &b));
  nt_send_key(fd, b);
  for (;;) /* serves puts until killed */
    pause();
  return 1;
}

static int kill_issuer(int idx, void *arg) {
  kill_setup *k = arg;
  int fd = k->fds[idx], st[3];
  unsigned char key[4096];
  size_t klen;
  nt_peer p;
  um_buffer *src, *dst;
  um_endpoint *ep;
  um_event *ev[2];
  nt_open(&p, KILL_TIMEOUT_MS);
  ep = nt_connect(&p, fd);
  klen = nt_recv(fd, key, sizeof(key));
  NT_OK(um_alloc(p.m, um_device_get(p.m, 0), BIG, UM_HOST, 0, &src));
  NT_OK(um_alloc(p.m, um_device_get(p.m, 0), BIG, UM_HOST, 0, &dst));
  NT_OK(um_net_put(ep, src, 0, key, klen, 0, 4096, NULL)); /* the target is up */
  /* In flight when the target dies: 64 MiB cannot have reached it yet. */
  NT_OK(um_net_put(ep, src, 0, key, klen, 0, BIG, &ev[0]));
  NT_OK(um_net_get(ep, dst, 0, key, klen, 0, BIG, &ev[1]));
  NT_CHECK(kill(k->target, SIGKILL) == 0, "kill: %s", strerror(errno));
  st[0] = um_event_wait(ev[0]);
  /* The waiting thread gets the text of the failure, seen on the net's
   * progress thread. */
  NT_CHECK(strstr(um_last_error(), "peer failure") != NULL || strstr(um_last_error(), "no progress") != NULL ||
               strstr(um_last_error(), "UCX") != NULL,
           "reason after the wait: %s", um_last_error());
  fprintf(stderr, "[pid %d] put in flight: %s\n", (int)getpid(), um_last_error());
  st[1] = um_event_wait(ev[1]);
  um_event_release(ev[0]);
  um_event_release(ev[1]);
  NT_CHECK(st[0] == UM_EBACKEND, "put in flight: %s", um_err_name(st[0]));
  NT_CHECK(st[1] == UM_EBACKEND, "get in flight: %s", um_err_name(st[1]));
  /* A blocking call carries UCX's text, or the timeout's. */
  st[2] = um_net_put(ep, src, 0, key, klen, 0, 4096, NULL);
  NT_CHECK(st[2] == UM_EBACKEND, "put after the failure: %s", um_err_name(st[2]));
  NT_CHECK(strstr(um_last_error(), "peer failure") != NULL || strstr(um_last_error(), "no progress") != NULL,
           "reason: %s", um_last_error());
  fprintf(stderr, "[pid %d] after the kill: %s\n", (int)getpid(), um_last_error());
  NT_OK(um_endpoint_close(ep));
  NT_OK(um_release(src));
  NT_OK(um_release(dst));
  nt_close(&p);
  return 0;
}

Test(net_fail, peer_killed_mid_transfer, .timeout = 120) {
  kill_setup k;
  pid_t issuer;
  int rc;
  cr_assert_eq(nb_pair(k.fds), 0);
  k.target = nt_spawn(kill_target, 0, &k);
  issuer = nt_spawn(kill_issuer, 1, &k);
  close(k.fds[0]);
  close(k.fds[1]);
  rc = nt_reap(issuer, 110);
  if (rc != NT_SKIP)
    cr_assert_eq(nt_reap(k.target, 10), 128 + SIGKILL, "the target died of the kill");
  else
    kill(k.target, SIGKILL), nt_reap(k.target, 10);
  if (rc == NT_SKIP)
    cr_skip_test("no UCX here");
  cr_assert_eq(rc, 0, "the issuer failed (its reason is above)");
}

/* ------------------------------------------------------------------------ */
/* Unexposed or released before the put: nothing written */

#define REV_BYTES (1u << 20)

/* Whether mem holds `head` in its first 4 KiB and 0xAA after. */
static size_t revoke_mismatch(const unsigned char *mem, unsigned char head) {
  static unsigned char want[REV_BYTES];
  memset(want, 0xAA, REV_BYTES);
  memset(want, head, 4096);
  return nt_diff(mem, want, REV_BYTES);
}

static int revoke_target(int idx, void *arg) {
  int fd = ((int *)arg)[idx];
  nt_peer p;
  um_buffer *b;
  um_endpoint *ep;
  unsigned char *mem;
  size_t bad;
  nt_open(&p, 20000);
  ep = nt_connect(&p, fd);
  NT_OK(um_alloc(p.m, um_device_get(p.m, 0), REV_BYTES, UM_HOST, 0, &b));
  mem = um_buffer_host_ptr(b);
  memset(mem, 0xAA, REV_BYTES);
  nt_send_key(fd, b);
  nt_expect(fd, '1'); /* the issuer put 0x11 into the first 4 KiB */
  bad = revoke_mismatch(mem, 0x11);
  NT_CHECK(bad == REV_BYTES, "byte %zu is %#x before the unexpose", bad, mem[bad]);
  NT_OK(um_net_unexpose(b));
  nt_signal(fd, 'u');
  nt_expect(fd, '2'); /* the issuer's put and get were refused */
  bad = revoke_mismatch(mem, 0x11);
  NT_CHECK(bad == REV_BYTES, "byte %zu is %#x after a refused put", bad, mem[bad]);
  nt_send_key(fd, b); /* exposed again: a new key */
  nt_expect(fd, '3');
  NT_CHECK(mem[0] == 0x22 && mem[4096] == 0xAA, "the new key's put landed");
  NT_OK(um_release(b)); /* revokes; the block stays mapped in the pool */
  nt_signal(fd, 'r');
  nt_expect(fd, '4');
  bad = revoke_mismatch(mem, 0x22);
  NT_CHECK(bad == REV_BYTES, "byte %zu of the released block is %#x", bad, mem[bad]);
  nt_signal(fd, 'q');
  nt_expect(fd, 'q');
  NT_OK(um_endpoint_close(ep));
  nt_close(&p);
  return 0;
}

static int revoke_issuer(int idx, void *arg) {
  int fd = ((int *)arg)[idx];
  unsigned char key[4096], key2[4096];
  size_t klen, klen2;
  nt_peer p;
  um_buffer *src;
  um_endpoint *ep;
  nt_open(&p, 20000);
  ep = nt_connect(&p, fd);
  klen = nt_recv(fd, key, sizeof(key));
  NT_OK(um_alloc(p.m, um_device_get(p.m, 0), REV_BYTES, UM_HOST, 0, &src));
  memset(um_buffer_host_ptr(src), 0x11, REV_BYTES);
  NT_OK(um_net_put(ep, src, 0, key, klen, 0, 4096, NULL));
  nt_signal(fd, '1');
  nt_expect(fd, 'u');
  memset(um_buffer_host_ptr(src), 0x55, REV_BYTES);
  NT_CHECK(um_net_put(ep, src, 0, key, klen, 0, REV_BYTES, NULL) == UM_ESTATE, "put after unexpose");
  NT_CHECK(strstr(um_last_error(), "no longer exposed") != NULL, "reason: %s", um_last_error());
  NT_CHECK(um_net_get(ep, src, 0, key, klen, 0, REV_BYTES, NULL) == UM_ESTATE, "get after unexpose");
  NT_CHECK(((unsigned char *)um_buffer_host_ptr(src))[0] == 0x55, "the refused get brought nothing");
  nt_signal(fd, '2');
  klen2 = nt_recv(fd, key2, sizeof(key2));
  NT_CHECK(um_net_put(ep, src, 0, key, klen, 0, 16, NULL) == UM_ESTATE, "the old key stays dead");
  memset(um_buffer_host_ptr(src), 0x22, REV_BYTES);
  NT_OK(um_net_put(ep, src, 0, key2, klen2, 0, 4096, NULL));
  nt_signal(fd, '3');
  nt_expect(fd, 'r');
  memset(um_buffer_host_ptr(src), 0x77, REV_BYTES);
  NT_CHECK(um_net_put(ep, src, 0, key2, klen2, 0, REV_BYTES, NULL) == UM_ESTATE, "put after release");
  nt_signal(fd, '4');
  nt_expect(fd, 'q');
  nt_signal(fd, 'q');
  NT_OK(um_endpoint_close(ep));
  NT_OK(um_release(src));
  nt_close(&p);
  return 0;
}

Test(net_fail, unexposed_or_released_before_put, .timeout = 120) {
  int fds[2];
  pid_t pids[2];
  cr_assert_eq(nb_pair(fds), 0);
  pids[0] = nt_spawn(revoke_target, 0, fds);
  pids[1] = nt_spawn(revoke_issuer, 1, fds);
  close(fds[0]);
  close(fds[1]);
  nt_reap_all(pids, 2, 110);
}

/* ------------------------------------------------------------------------ */
/* Unexposed while puts stream in: once um_net_unexpose returns, nothing
 * lands any more (a transfer admitted before it finished first). */

#define STREAM_BYTES (4u << 20)
#define STREAM_PUT (1u << 20)

static int stream_target(int idx, void *arg) {
  int fd = ((int *)arg)[idx];
  static unsigned char zero[STREAM_BYTES];
  unsigned char *snap = malloc(STREAM_BYTES);
  struct timespec pause = {0, 1000000};
  nt_peer p;
  um_buffer *b;
  um_endpoint *ep;
  unsigned char *mem;
  size_t bad;
  NT_CHECK(snap != NULL, "malloc");
  nt_open(&p, 20000);
  ep = nt_connect(&p, fd);
  NT_OK(um_alloc(p.m, um_device_get(p.m, 0), STREAM_BYTES, UM_HOST, UM_ALLOC_ZERO, &b));
  mem = um_buffer_host_ptr(b);
  nt_send_key(fd, b);
  /* Wait until puts are landing, then revoke in the middle of the stream. */
  for (int waited = 0; memcmp(mem, zero, STREAM_BYTES) == 0; waited++) {
    NT_CHECK(waited < NT_WAIT_MS, "no put arrived");
    nanosleep(&pause, NULL);
  }
  NT_OK(um_net_unexpose(b));
  memcpy(snap, mem, STREAM_BYTES);
  nt_expect(fd, 'd'); /* the issuer saw its puts refused and stopped */
  bad = nt_diff(mem, snap, STREAM_BYTES);
  NT_CHECK(bad == STREAM_BYTES, "byte %zu changed after um_net_unexpose returned", bad);
  nt_signal(fd, 'q');
  NT_OK(um_endpoint_close(ep));
  NT_OK(um_release(b));
  nt_close(&p);
  free(snap);
  return 0;
}

static int stream_issuer(int idx, void *arg) {
  int fd = ((int *)arg)[idx];
  unsigned char key[4096];
  size_t klen;
  nt_peer p;
  um_buffer *src[2];
  um_endpoint *ep;
  um_event *ev[2] = {NULL, NULL};
  int refused = 0, landed = 0;
  nt_open(&p, 20000);
  ep = nt_connect(&p, fd);
  klen = nt_recv(fd, key, sizeof(key));
  for (int s = 0; s < 2; s++)
    NT_OK(um_alloc(p.m, um_device_get(p.m, 0), STREAM_PUT, UM_HOST, 0, &src[s]));
  /* Two puts in flight at a time until the target refuses them. */
  for (unsigned i = 0; !refused; i++) {
    int s = (int)(i & 1), st;
    if (ev[s] != NULL) {
      st = um_event_wait(ev[s]);
      um_event_release(ev[s]);
      ev[s] = NULL;
      NT_CHECK(st == UM_OK || st == UM_ESTATE, "put: %s", um_err_name(st));
      refused = st == UM_ESTATE;
      landed += st == UM_OK;
      if (refused)
        break;
    }
    memset(um_buffer_host_ptr(src[s]), (int)(i % 255) + 1, STREAM_PUT);
    NT_OK(um_net_put(ep, src[s], 0, key, klen, (i % 4) * (size_t)STREAM_PUT, STREAM_PUT, &ev[s]));
  }
  for (int s = 0; s < 2; s++)
    if (ev[s] != NULL) {
      int st = um_event_wait(ev[s]);
      NT_CHECK(st == UM_OK || st == UM_ESTATE, "put: %s", um_err_name(st));
      um_event_release(ev[s]);
    }
  NT_CHECK(landed > 0, "no put landed before the revocation");
  nt_signal(fd, 'd');
  nt_expect(fd, 'q');
  NT_OK(um_endpoint_close(ep));
  for (int s = 0; s < 2; s++)
    NT_OK(um_release(src[s]));
  nt_close(&p);
  return 0;
}

Test(net_fail, unexposed_while_puts_stream_in, .timeout = 120) {
  int fds[2];
  pid_t pids[2];
  cr_assert_eq(nb_pair(fds), 0);
  pids[0] = nt_spawn(stream_target, 0, fds);
  pids[1] = nt_spawn(stream_issuer, 1, fds);
  close(fds[0]);
  close(fds[1]);
  nt_reap_all(pids, 2, 110);
}
