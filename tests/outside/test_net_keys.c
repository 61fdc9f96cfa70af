/* A key blob names the worker that exposed it: used through an endpoint to
 * any other peer, um_net_put / um_net_get answer UM_EINVAL on the issuing
 * side before anything is sent, and the other peer's memory is untouched.
 *
 * Three processes: an issuer A connected to two targets B and C, which
 * expose buffers of the same size (forked from one parent, their buffers
 * tend to sit at the same addresses, so a key of B's names a range that
 * exists in C too). Run once per UCX transport (tcp, posix, sysv). */
#include "outside.h"

#define KEY_BYTES (1u << 20)
#define KEY_WAIT_MS 60000

typedef struct keys_setup {
  int ab[2]; /* A <-> B */
  int ac[2]; /* A <-> C */
} keys_setup;

/* ------------------------------------------------------------------------ */
/* The targets: expose a buffer filled with the pattern of seed, hand its
 * key to A, wait for A's word, check that nothing changed. */

static int keys_target(int fd, uint32_t seed) {
  unsigned char key[4096];
  size_t klen = sizeof(key), bad;
  um_endpoint *ep;
  um_buffer *b;
  os_peer p;
  int rc = os_peer_open(&p, 20000);
  char go = 'x';
  if (rc != 0) {
    os_send(fd, &go, 1); /* A skips too */
    return rc;
  }
  go = 'g';
  os_send(fd, &go, 1);
  ep = os_connect(&p, fd, true);
  OS_OK(um_alloc(p.m, um_device_get(p.m, 0), KEY_BYTES, UM_HOST, 0, &b));
  os_pattern(um_buffer_host_ptr(b), KEY_BYTES, seed);
  OS_OK(um_net_expose(b, key, &klen));
  os_send(fd, key, klen);
  os_expect(fd, 'd', KEY_WAIT_MS); /* A is done */
  bad = os_pattern_diff(um_buffer_host_ptr(b), KEY_BYTES, seed);
  OS_CHECK(bad == SIZE_MAX, "byte %zu of the target (seed %u) was written", bad, (unsigned)seed);
  os_send(fd, "q", 1);
  OS_OK(um_endpoint_close(ep));
  OS_OK(um_release(b));
  os_peer_close(&p);
  return 0;
}

static int target_b(int idx, void *arg) {
  (void)idx;
  return keys_target(((keys_setup *)arg)->ab[1], 0xb0);
}

static int target_c(int idx, void *arg) {
  (void)idx;
  return keys_target(((keys_setup *)arg)->ac[1], 0xc0);
}

/* ------------------------------------------------------------------------ */
/* The issuer */

/* Every way of using key (of the peer behind other) through ep: refused
 * with UM_EINVAL before anything is sent, blocking or not. */
static void wrong_peer_refused(um_endpoint *ep, const unsigned char *key, size_t klen, um_buffer *src,
                               um_buffer *dst) {
  um_event *ev = NULL;
  int st;
  st = um_net_put(ep, src, 0, key, klen, 0, KEY_BYTES, NULL);
  OS_CHECK(st == UM_EINVAL, "blocking put with another peer's key: %s", um_err_name(st));
  st = um_net_put(ep, src, 0, key, klen, 4096, 4096, &ev);
  OS_CHECK(st == UM_EINVAL && ev == NULL, "put with another peer's key: %s", um_err_name(st));
  st = um_net_get(ep, dst, 0, key, klen, 0, KEY_BYTES, NULL);
  OS_CHECK(st == UM_EINVAL, "blocking get with another peer's key: %s", um_err_name(st));
  st = um_net_get(ep, dst, 0, key, klen, 0, 4096, &ev);
  OS_CHECK(st == UM_EINVAL && ev == NULL, "get with another peer's key: %s", um_err_name(st));
}

/* A garbled key stays UM_EINVAL, whichever endpoint. */
static void garbled_refused(um_endpoint *ep, const unsigned char *key, size_t klen, um_buffer *src) {
  unsigned char bad[4096];
  int st;
  for (size_t i = 0; i < klen; i += klen / 7 + 1) {
    memcpy(bad, key, klen);
    bad[i] ^= 0x5a;
    st = um_net_put(ep, src, 0, bad, klen, 0, 4096, NULL);
    OS_CHECK(st == UM_EINVAL, "put with byte %zu of the key flipped: %s", i, um_err_name(st));
  }
  st = um_net_put(ep, src, 0, key, klen - 1, 0, 4096, NULL);
  OS_CHECK(st == UM_EINVAL, "put with a truncated key: %s", um_err_name(st));
}

static int issuer_a(int idx, void *arg) {
  keys_setup *k = arg;
  unsigned char kb[4096], kc[4096];
  size_t kblen, kclen;
  um_endpoint *eb, *ec;
  um_buffer *src, *dst;
  char gb = 0, gc = 0;
  os_peer p;
  (void)idx;
  OS_CHECK(os_recv(k->ab[0], &gb, 1, KEY_WAIT_MS) == 1 && os_recv(k->ac[0], &gc, 1, KEY_WAIT_MS) == 1, "no word from the targets");
  if (gb != 'g' || gc != 'g')
    return OS_SKIP;
  OS_CHECK(os_peer_open(&p, 20000) == 0, "B and C have UCX, A has not");
  eb = os_connect(&p, k->ab[0], true);
  ec = os_connect(&p, k->ac[0], true);
  kblen = os_recv(k->ab[0], kb, sizeof(kb), KEY_WAIT_MS);
  kclen = os_recv(k->ac[0], kc, sizeof(kc), KEY_WAIT_MS);
  OS_OK(um_alloc(p.m, um_device_get(p.m, 0), KEY_BYTES, UM_HOST, 0, &src));
  OS_OK(um_alloc(p.m, um_device_get(p.m, 0), KEY_BYTES, UM_HOST, 0, &dst));
  memset(um_buffer_host_ptr(src), 0xee, KEY_BYTES);
  wrong_peer_refused(ec, kb, kblen, src, dst); /* B's key to C */
  wrong_peer_refused(eb, kc, kclen, src, dst); /* C's key to B */
  garbled_refused(eb, kb, kblen, src);
  garbled_refused(ec, kc, kclen, src);
  /* The right pairs still work (reading only: the targets check their
   * contents afterwards). */
  OS_OK(um_net_get(eb, dst, 0, kb, kblen, 0, KEY_BYTES, NULL));
  OS_CHECK(os_pattern_diff(um_buffer_host_ptr(dst), KEY_BYTES, 0xb0) == SIZE_MAX, "get from B");
  OS_OK(um_net_get(ec, dst, 0, kc, kclen, 0, KEY_BYTES, NULL));
  OS_CHECK(os_pattern_diff(um_buffer_host_ptr(dst), KEY_BYTES, 0xc0) == SIZE_MAX, "get from C");
  os_send(k->ab[0], "d", 1);
  os_send(k->ac[0], "d", 1);
  os_expect(k->ab[0], 'q', KEY_WAIT_MS);
  os_expect(k->ac[0], 'q', KEY_WAIT_MS);
  OS_OK(um_endpoint_close(eb));
  OS_OK(um_endpoint_close(ec));
  OS_OK(um_release(src));
  OS_OK(um_release(dst));
  os_peer_close(&p);
  return 0;
}

Test(net_keys, key_through_another_peers_endpoint, .timeout = 180) {
  keys_setup k;
  pid_t pa, pb, pc;
  cr_assert_eq(nb_pair(k.ab), 0);
  cr_assert_eq(nb_pair(k.ac), 0);
  pb = os_spawn(target_b, 0, &k);
  pc = os_spawn(target_c, 0, &k);
  pa = os_spawn(issuer_a, 0, &k);
  os_expect_peer(pa, 150000, "issuer A");
  os_expect_peer(pb, 30000, "target B");
  os_expect_peer(pc, 30000, "target C");
}

/* The same refusal when the issuer holds a key of its own (an endpoint to
 * B, its own buffer's key): the key is A's, the endpoint B's. */
static int own_key_issuer(int idx, void *arg) {
  keys_setup *k = arg;
  unsigned char kb[4096], ka[4096];
  size_t kblen, kalen = sizeof(ka);
  um_endpoint *eb;
  um_buffer *src, *dst, *mine;
  char gb = 0;
  os_peer p;
  (void)idx;
  OS_CHECK(os_recv(k->ab[0], &gb, 1, KEY_WAIT_MS) == 1, "no word from B");
  if (gb != 'g')
    return OS_SKIP;
  OS_CHECK(os_peer_open(&p, 20000) == 0, "B has UCX, A has not");
  eb = os_connect(&p, k->ab[0], true);
  kblen = os_recv(k->ab[0], kb, sizeof(kb), KEY_WAIT_MS);
  (void)kblen;
  OS_OK(um_alloc(p.m, um_device_get(p.m, 0), KEY_BYTES, UM_HOST, 0, &src));
  OS_OK(um_alloc(p.m, um_device_get(p.m, 0), KEY_BYTES, UM_HOST, 0, &dst));
  OS_OK(um_alloc(p.m, um_device_get(p.m, 0), KEY_BYTES, UM_HOST, 0, &mine));
  OS_OK(um_net_expose(mine, ka, &kalen));
  wrong_peer_refused(eb, ka, kalen, src, dst);
  os_send(k->ab[0], "d", 1);
  os_expect(k->ab[0], 'q', KEY_WAIT_MS);
  OS_OK(um_endpoint_close(eb));
  OS_OK(um_release(mine));
  OS_OK(um_release(src));
  OS_OK(um_release(dst));
  os_peer_close(&p);
  return 0;
}

Test(net_keys, own_key_through_a_peers_endpoint, .timeout = 180) {
  keys_setup k;
  pid_t pa, pb;
  cr_assert_eq(nb_pair(k.ab), 0);
  pb = os_spawn(target_b, 0, &k);
  pa = os_spawn(own_key_issuer, 0, &k);
  os_expect_peer(pa, 150000, "issuer A");
  os_expect_peer(pb, 30000, "target B");
}
