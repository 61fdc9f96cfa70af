/* um_net at its edges, in one process: two managers, each with its own
 * net, the first connected to the second (and to itself). Blob lengths,
 * damaged blobs, range edges and overflows, zero bytes, read-only memory
 * on either side, closed endpoints, unexposed and released targets,
 * destroyed nets, handles of the wrong kind. Run once per UCX transport. */
#include "outside.h"

#define NM_N 65536u
#define NM_BLOB 4096u

typedef struct nm {
  um_manager *a, *b;
  um_net *na, *nb;
  um_endpoint *ab; /* a -> b */
  uint8_t addr_b[NM_BLOB];
  size_t addr_b_len;
} nm;

static um_manager *nm_manager(void) {
  um_options o;
  os_options(&o);
  o.net_timeout_ms = 4000;
  return os_manager_with(&o);
}

static void nm_start(nm *t) {
  int st;
  memset(t, 0, sizeof(*t));
  t->a = nm_manager();
  t->b = nm_manager();
  st = um_net_create(t->a, &t->na);
  if (st == UM_ENOTSUP) {
    um_manager_destroy(t->a);
    um_manager_destroy(t->b);
    cr_skip_test("no UCX: %s", um_last_error());
  }
  cr_assert_eq(st, UM_OK, "%s", um_last_error());
  cr_assert_eq(um_net_create(t->b, &t->nb), UM_OK, "%s", um_last_error());
  t->addr_b_len = sizeof(t->addr_b);
  cr_assert_eq(um_net_address(t->nb, t->addr_b, &t->addr_b_len), UM_OK);
  cr_assert_eq(um_net_connect(t->na, t->addr_b, t->addr_b_len, &t->ab), UM_OK, "%s", um_last_error());
}

static void nm_end(nm *t) {
  cr_assert_eq(um_manager_destroy(t->a), UM_OK, "a: %s", um_last_error());
  cr_assert_eq(um_manager_destroy(t->b), UM_OK, "b: %s", um_last_error());
}

/* A buffer of m's host device with the pattern of seed. */
static um_buffer *nm_buffer(um_manager *m, size_t n, uint32_t seed) {
  um_buffer *x = NULL;
  cr_assert_eq(um_alloc(m, um_device_get(m, 0), n, UM_HOST, 0, &x), UM_OK);
  os_pattern(um_buffer_host_ptr(x), n, seed);
  return x;
}

/* Expose x: its key blob into key, its length returned. */
static size_t nm_expose(um_buffer *x, uint8_t *key) {
  size_t len = NM_BLOB;
  cr_assert_eq(um_net_expose(x, key, &len), UM_OK, "%s", um_last_error());
  return len;
}

static int nm_wait(void *e) { return um_event_wait((um_event *)e); }
static int nm_destroy(void *m) { return um_manager_destroy((um_manager *)m); }

/* ------------------------------------------------------------------------ */
/* Blob lengths */

Test(net_misc, address_lengths, .timeout = 120) {
  nm t;
  uint8_t blob[NM_BLOB];
  size_t len = 0;
  nm_start(&t);
  cr_assert_eq(um_net_address(t.na, NULL, &len), UM_ERANGE);
  cr_assert_gt(len, 0u, "the length needed");
  {
    size_t need = len, small = need - 1;
    cr_assert_eq(um_net_address(t.na, blob, &small), UM_ERANGE);
    cr_assert_eq(small, need, "one short: *len gets the length needed");
    small = need;
    cr_assert_eq(um_net_address(t.na, blob, &small), UM_OK);
    cr_assert_eq(small, need);
    small = sizeof(blob);
    cr_assert_eq(um_net_address(t.na, blob, &small), UM_OK);
    cr_assert_eq(small, need, "a larger capacity: the blob's length");
  }
  cr_assert_eq(um_net_address(t.na, blob, NULL), UM_EINVAL);
  cr_assert_eq(um_net_address(NULL, blob, &len), UM_EINVAL);
  nm_end(&t);
}

Test(net_misc, connect_damaged_blobs, .timeout = 120) {
  nm t;
  uint8_t bad[NM_BLOB + 1];
  um_endpoint *ep = (um_endpoint *)1;
  nm_start(&t);
  memcpy(bad, t.addr_b, t.addr_b_len);
  cr_assert_eq(um_net_connect(t.na, bad, t.addr_b_len - 1, &ep), UM_EINVAL, "one byte short");
  cr_assert_eq(um_net_connect(t.na, bad, 0, &ep), UM_EINVAL, "zero bytes");
  cr_assert_eq(um_net_connect(t.na, NULL, t.addr_b_len, &ep), UM_EINVAL, "NULL blob");
  cr_assert_eq(um_net_connect(t.na, bad, t.addr_b_len, NULL), UM_EINVAL, "NULL out");
  bad[t.addr_b_len / 2] ^= 0x40;
  cr_assert_eq(um_net_connect(t.na, bad, t.addr_b_len, &ep), UM_EINVAL, "a flipped bit");
  memset(bad, 0, sizeof(bad));
  cr_assert_eq(um_net_connect(t.na, bad, t.addr_b_len, &ep), UM_EINVAL, "zeros");
  memcpy(bad, t.addr_b, t.addr_b_len);
  bad[t.addr_b_len] = 0x5A;
  {
    int st = um_net_connect(t.na, bad, t.addr_b_len + 1, &ep);
    cr_expect_eq(st, UM_EINVAL, "an intact blob and one byte more (its length is in its header): %s",
                 um_err_name(st));
    if (st == UM_OK) {
      cr_assert_eq(um_endpoint_close(ep), UM_OK);
      ep = (um_endpoint *)1;
    }
  }
  {
    um_buffer *x = nm_buffer(t.b, NM_N, 1);
    uint8_t key[NM_BLOB];
    size_t klen = nm_expose(x, key);
    cr_assert_eq(um_net_connect(t.na, key, klen, &ep), UM_EINVAL, "a key blob as an address");
    cr_assert_eq(um_release(x), UM_OK);
  }
  cr_assert_eq(ep, (um_endpoint *)1, "out written on failure");
  nm_end(&t);
}

Test(net_misc, expose_lengths_and_twice, .timeout = 120) {
  nm t;
  um_buffer *x;
  uint8_t k1[NM_BLOB], k2[NM_BLOB];
  size_t need = 0, l1, l2;
  nm_start(&t);
  x = nm_buffer(t.b, NM_N, 2);
  cr_assert_eq(um_net_expose(x, NULL, &need), UM_ERANGE);
  cr_assert_gt(need, 0u);
  cr_assert_eq(um_net_unexpose(x), UM_ESTATE, "UM_ERANGE leaves b unexposed");
  l1 = need - 1;
  cr_assert_eq(um_net_expose(x, k1, &l1), UM_ERANGE);
  cr_assert_eq(l1, need);
  cr_assert_eq(um_net_unexpose(x), UM_ESTATE, "UM_ERANGE leaves b unexposed");
  l1 = need;
  cr_assert_eq(um_net_expose(x, k1, &l1), UM_OK);
  l2 = sizeof(k2);
  cr_assert_eq(um_net_expose(x, k2, &l2), UM_OK);
  cr_assert_eq(l1, l2, "exposing an exposed buffer gives the same blob again");
  cr_assert_eq(memcmp(k1, k2, l1), 0, "exposing an exposed buffer gives the same blob again");
  {
    size_t l3 = 1;
    cr_assert_eq(um_net_expose(x, k2, &l3), UM_ERANGE, "an exposed buffer, a small capacity");
    cr_assert_eq(um_net_unexpose(x), UM_OK, "the small capacity unexposed an exposed buffer");
  }
  cr_assert_eq(um_net_unexpose(x), UM_ESTATE, "unexpose twice");
  cr_assert_eq(um_net_expose(x, NULL, NULL), UM_EINVAL);
  cr_assert_eq(um_net_expose(NULL, k1, &l1), UM_EINVAL);
  cr_assert_eq(um_net_unexpose(NULL), UM_EINVAL);
  cr_assert_eq(um_release(x), UM_OK);
  l1 = sizeof(k1);
  cr_assert_eq(um_net_expose(x, k1, &l1), UM_ESTATE, "expose of a released buffer");
  cr_assert_eq(um_net_unexpose(x), UM_ESTATE, "unexpose of a released buffer");
  nm_end(&t);
}

Test(net_misc, expose_without_a_net, .timeout = 60) {
  um_manager *m = nm_manager();
  um_buffer *x = nm_buffer(m, NM_N, 3);
  uint8_t key[NM_BLOB];
  size_t len = sizeof(key);
  cr_assert_eq(um_net_expose(x, key, &len), UM_ESTATE, "no um_net on the manager");
  cr_assert_eq(um_net_unexpose(x), UM_ESTATE);
  cr_assert_eq(um_release(x), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* ------------------------------------------------------------------------ */
/* Put and get: arguments */

Test(net_misc, put_get_bad_arguments, .timeout = 120) {
  nm t;
  um_buffer *dst, *src, *other;
  uint8_t key[NM_BLOB], bad[NM_BLOB];
  size_t klen;
  um_event *e = NULL;
  nm_start(&t);
  dst = nm_buffer(t.b, NM_N, 4);
  src = nm_buffer(t.a, NM_N, 5);
  other = nm_buffer(t.b, NM_N, 6);
  klen = nm_expose(dst, key);
  cr_assert_eq(um_net_put(t.ab, src, 0, key, klen, 0, 0, NULL), UM_EINVAL, "zero bytes");
  cr_assert_eq(um_net_get(t.ab, src, 0, key, klen, 0, 0, NULL), UM_EINVAL, "zero bytes");
  cr_assert_eq(um_net_put(t.ab, src, 0, key, klen - 1, 0, 16, NULL), UM_EINVAL, "a key one byte short");
  cr_assert_eq(um_net_put(t.ab, src, 0, key, 0, 0, 16, NULL), UM_EINVAL, "a key of no bytes");
  cr_assert_eq(um_net_put(t.ab, src, 0, NULL, klen, 0, 16, NULL), UM_EINVAL, "NULL key");
  memcpy(bad, key, klen);
  bad[klen / 2] ^= 1;
  cr_assert_eq(um_net_put(t.ab, src, 0, bad, klen, 0, 16, NULL), UM_EINVAL, "a flipped bit");
  cr_assert_eq(um_net_get(t.ab, src, 0, bad, klen, 0, 16, NULL), UM_EINVAL, "a flipped bit");
  cr_assert_eq(um_net_put(t.ab, src, 0, t.addr_b, t.addr_b_len, 0, 16, NULL), UM_EINVAL, "an address as a key");
  cr_assert_eq(um_net_put(t.ab, other, 0, key, klen, 0, 16, NULL), UM_EINVAL, "src of another manager");
  cr_assert_eq(um_net_get(t.ab, other, 0, key, klen, 0, 16, NULL), UM_EINVAL, "dst of another manager");
  cr_assert_eq(um_net_put(NULL, src, 0, key, klen, 0, 16, NULL), UM_EINVAL);
  cr_assert_eq(um_net_put(t.ab, NULL, 0, key, klen, 0, 16, NULL), UM_EINVAL);
  cr_assert_eq(um_net_put(t.ab, src, 0, key, klen, 0, 16, &e), UM_OK, "a good put after the bad ones");
  cr_assert_eq(um_event_wait(e), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_event_release(e), UM_OK);
  cr_assert_eq(os_pattern_diff(um_buffer_host_ptr(dst), 16, 5), SIZE_MAX);
  {
    uint8_t *want = malloc(NM_N);
    os_pattern(want, NM_N, 4);
    cr_assert_eq(memcmp((uint8_t *)um_buffer_host_ptr(dst) + 16, want + 16, NM_N - 16), 0,
                 "the refused puts wrote past the good one");
    free(want);
  }
  cr_assert_eq(um_release(dst), UM_OK);
  cr_assert_eq(um_release(src), UM_OK);
  cr_assert_eq(um_release(other), UM_OK);
  nm_end(&t);
}

/* Range edges, both sides: the last byte is in range, one more is not;
 * offsets near SIZE_MAX never wrap into range. */
Test(net_misc, range_edges, .timeout = 120) {
  nm t;
  um_buffer *dst, *src, *small;
  uint8_t key[NM_BLOB];
  size_t klen;
  uint8_t *d;
  nm_start(&t);
  dst = nm_buffer(t.b, NM_N, 7);
  src = nm_buffer(t.a, NM_N, 8);
  small = nm_buffer(t.a, 16, 9);
  klen = nm_expose(dst, key);
  d = um_buffer_host_ptr(dst);
  cr_assert_eq(um_net_put(t.ab, src, 0, key, klen, NM_N - 1, 1, NULL), UM_OK, "the last byte: %s",
               um_last_error());
  cr_assert_eq(d[NM_N - 1], ((uint8_t *)um_buffer_host_ptr(src))[0]);
  cr_assert_eq(um_net_put(t.ab, src, 0, key, klen, NM_N - 1, 2, NULL), UM_ERANGE, "one past the end");
  cr_assert_eq(um_net_put(t.ab, src, 0, key, klen, NM_N, 1, NULL), UM_ERANGE, "at the end");
  cr_assert_eq(um_net_put(t.ab, src, 0, key, klen, SIZE_MAX - 1, 4, NULL), UM_ERANGE, "dst_off + bytes wraps");
  cr_assert_eq(um_net_put(t.ab, src, 0, key, klen, 4, SIZE_MAX - 2, NULL), UM_ERANGE, "bytes near SIZE_MAX");
  cr_assert_eq(um_net_put(t.ab, src, NM_N - 1, key, klen, 0, 2, NULL), UM_ERANGE, "src range past src");
  cr_assert_eq(um_net_put(t.ab, src, SIZE_MAX, key, klen, 0, 2, NULL), UM_ERANGE, "src_off + bytes wraps");
  cr_assert_eq(um_net_put(t.ab, small, 0, key, klen, 0, 32, NULL), UM_ERANGE, "a put larger than its src");
  cr_assert_eq(um_net_get(t.ab, small, 0, key, klen, 0, 32, NULL), UM_ERANGE, "a get larger than its dst");
  cr_assert_eq(um_net_get(t.ab, small, 0, key, klen, NM_N - 8, 16, NULL), UM_ERANGE, "a get past the remote end");
  cr_assert_eq(um_net_get(t.ab, small, 0, key, klen, SIZE_MAX - 4, 8, NULL), UM_ERANGE, "a get that wraps");
  cr_assert_eq(um_net_get(t.ab, small, 8, key, klen, NM_N - 8, 8, NULL), UM_OK, "the remote's last 8 bytes");
  cr_assert_eq(memcmp((uint8_t *)um_buffer_host_ptr(small) + 8, d + NM_N - 8, 8), 0);
  cr_assert_eq(um_release(dst), UM_OK);
  cr_assert_eq(um_release(src), UM_OK);
  cr_assert_eq(um_release(small), UM_OK);
  nm_end(&t);
}

/* Read-only memory: a get into a read-only wrap (UM_ESTATE), a put from
 * one (fine), a put into an exposed read-only wrap (UM_ESTATE: the key
 * says read-only), a get from it (fine). */
Test(net_misc, read_only_on_either_side, .timeout = 120) {
  nm t;
  static uint8_t ro_a[NM_N], ro_b[NM_N];
  um_buffer *wa = NULL, *wb = NULL, *dst, *tmp;
  uint8_t key[NM_BLOB], kro[NM_BLOB];
  size_t klen, kro_len;
  nm_start(&t);
  os_pattern(ro_a, NM_N, 10);
  os_pattern(ro_b, NM_N, 11);
  cr_assert_eq(um_wrap_host(t.a, ro_a, NM_N, UM_WRAP_READONLY, &wa), UM_OK);
  cr_assert_eq(um_wrap_host(t.b, ro_b, NM_N, UM_WRAP_READONLY, &wb), UM_OK);
  dst = nm_buffer(t.b, NM_N, 12);
  tmp = nm_buffer(t.a, NM_N, 13);
  klen = nm_expose(dst, key);
  kro_len = nm_expose(wb, kro);
  cr_assert_eq(um_net_get(t.ab, wa, 0, key, klen, 0, 64, NULL), UM_ESTATE, "a get into a read-only wrap");
  cr_assert_eq(os_pattern_diff(ro_a, NM_N, 10), SIZE_MAX, "the refused get wrote the read-only wrap");
  cr_assert_eq(um_net_put(t.ab, wa, 0, key, klen, 0, 64, NULL), UM_OK, "a put from a read-only wrap: %s",
               um_last_error());
  cr_assert_eq(memcmp(um_buffer_host_ptr(dst), ro_a, 64), 0);
  cr_assert_eq(um_net_put(t.ab, tmp, 0, kro, kro_len, 0, 64, NULL), UM_ESTATE, "a put into a read-only buffer");
  cr_assert_eq(os_pattern_diff(ro_b, NM_N, 11), SIZE_MAX, "the refused put wrote the read-only buffer");
  cr_assert_eq(um_net_get(t.ab, tmp, 0, kro, kro_len, 0, 64, NULL), UM_OK, "%s", um_last_error());
  cr_assert_eq(memcmp(um_buffer_host_ptr(tmp), ro_b, 64), 0);
  {
    um_event *e = NULL;
    cr_assert_eq(um_net_put(t.ab, tmp, 0, kro, kro_len, 0, 64, &e), UM_ESTATE, "async put into read-only");
    cr_assert_null(e);
  }
  cr_assert_eq(um_release(wa), UM_OK);
  cr_assert_eq(um_release(wb), UM_OK);
  cr_assert_eq(um_release(dst), UM_OK);
  cr_assert_eq(um_release(tmp), UM_OK);
  nm_end(&t);
}

/* The local buffer mapped or released: UM_ESTATE. */
Test(net_misc, local_buffer_mapped_or_released, .timeout = 120) {
  nm t;
  um_buffer *dst, *src;
  uint8_t key[NM_BLOB];
  size_t klen;
  void *p = NULL;
  nm_start(&t);
  dst = nm_buffer(t.b, NM_N, 14);
  src = nm_buffer(t.a, NM_N, 15);
  klen = nm_expose(dst, key);
  cr_assert_eq(um_map(src, UM_MAP_READ, 0, 16, &p), UM_OK);
  cr_assert_eq(um_net_put(t.ab, src, 0, key, klen, 0, 16, NULL), UM_ESTATE, "src mapped");
  cr_assert_eq(um_net_get(t.ab, src, 0, key, klen, 0, 16, NULL), UM_ESTATE, "dst mapped");
  cr_assert_eq(um_unmap(src, p), UM_OK);
  cr_assert_eq(um_release(src), UM_OK);
  cr_assert_eq(um_net_put(t.ab, src, 0, key, klen, 0, 16, NULL), UM_ESTATE, "src released");
  cr_assert_eq(um_net_get(t.ab, src, 0, key, klen, 0, 16, NULL), UM_ESTATE, "dst released");
  cr_assert_eq(os_pattern_diff(um_buffer_host_ptr(dst), NM_N, 14), SIZE_MAX);
  cr_assert_eq(um_release(dst), UM_OK);
  nm_end(&t);
}

/* ------------------------------------------------------------------------ */
/* Closed, unexposed, released, destroyed */

Test(net_misc, put_after_endpoint_close, .timeout = 120) {
  nm t;
  um_buffer *dst, *src;
  uint8_t key[NM_BLOB];
  size_t klen;
  um_event *e = NULL;
  nm_start(&t);
  dst = nm_buffer(t.b, NM_N, 16);
  src = nm_buffer(t.a, NM_N, 17);
  klen = nm_expose(dst, key);
  cr_assert_eq(um_endpoint_close(t.ab), UM_OK);
  cr_assert_eq(um_endpoint_close(t.ab), UM_ESTATE, "close twice");
  cr_assert_eq(um_net_put(t.ab, src, 0, key, klen, 0, 16, NULL), UM_ESTATE, "put on a closed endpoint");
  cr_assert_eq(um_net_get(t.ab, src, 0, key, klen, 0, 16, NULL), UM_ESTATE, "get on a closed endpoint");
  cr_assert_eq(um_net_put(t.ab, src, 0, key, klen, 0, 16, &e), UM_ESTATE);
  cr_assert_null(e);
  cr_assert_eq(os_pattern_diff(um_buffer_host_ptr(dst), NM_N, 16), SIZE_MAX);
  /* a new endpoint to the same peer works */
  cr_assert_eq(um_net_connect(t.na, t.addr_b, t.addr_b_len, &t.ab), UM_OK);
  cr_assert_eq(um_net_put(t.ab, src, 0, key, klen, 0, 16, NULL), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_release(dst), UM_OK);
  cr_assert_eq(um_release(src), UM_OK);
  nm_end(&t);
}

/* Async puts issued, then the endpoint closed at once: "operations in
 * flight on it finish first"; their events end (UM_OK, or UM_ESTATE for
 * those not started). */
Test(net_misc, close_with_puts_in_flight, .timeout = 120) {
  enum { K = 32 };
  nm t;
  um_buffer *dst, *src;
  uint8_t key[NM_BLOB];
  size_t klen;
  um_event *e[K];
  int ok = 0;
  nm_start(&t);
  dst = nm_buffer(t.b, NM_N, 18);
  src = nm_buffer(t.a, NM_N, 19);
  klen = nm_expose(dst, key);
  for (int i = 0; i < K; i++)
    cr_assert_eq(um_net_put(t.ab, src, 0, key, klen, 0, NM_N, &e[i]), UM_OK);
  cr_assert_eq(um_endpoint_close(t.ab), UM_OK, "%s", um_last_error());
  for (int i = 0; i < K; i++) {
    int st = os_bounded(nm_wait, e[i], 10000, "a put's event after the close");
    cr_assert(st == UM_OK || st == UM_ESTATE, "put %d: %s", i, um_err_name(st));
    ok += st == UM_OK;
    cr_assert_eq(um_event_release(e[i]), UM_OK);
  }
  fprintf(stderr, "[info] " "%d of %d puts finished before the close\n", ok, K);
  if (ok > 0)
    cr_assert_eq(os_pattern_diff(um_buffer_host_ptr(dst), NM_N, 19), SIZE_MAX);
  cr_assert_eq(um_release(dst), UM_OK);
  cr_assert_eq(um_release(src), UM_OK);
  nm_end(&t);
}

Test(net_misc, put_after_unexpose_and_release_of_target, .timeout = 120) {
  nm t;
  um_buffer *dst, *dst2, *src;
  uint8_t key[NM_BLOB], key2[NM_BLOB];
  size_t klen, klen2;
  nm_start(&t);
  dst = nm_buffer(t.b, NM_N, 20);
  dst2 = nm_buffer(t.b, NM_N, 21);
  src = nm_buffer(t.a, NM_N, 22);
  klen = nm_expose(dst, key);
  klen2 = nm_expose(dst2, key2);
  cr_assert_eq(um_net_put(t.ab, src, 0, key, klen, 0, 16, NULL), UM_OK);
  cr_assert_eq(um_net_unexpose(dst), UM_OK);
  os_pattern(um_buffer_host_ptr(dst), NM_N, 20);
  cr_assert_eq(um_net_put(t.ab, src, 0, key, klen, 0, 16, NULL), UM_ESTATE, "a put after the unexpose");
  cr_assert_eq(um_net_get(t.ab, src, 0, key, klen, 0, 16, NULL), UM_ESTATE, "a get after the unexpose");
  cr_assert_eq(os_pattern_diff(um_buffer_host_ptr(dst), NM_N, 20), SIZE_MAX, "a revoked key wrote");
  /* exposed again: a new blob works; the old one stays revoked */
  {
    uint8_t k3[NM_BLOB];
    size_t l3 = nm_expose(dst, k3);
    cr_assert_eq(um_net_put(t.ab, src, 0, key, klen, 0, 16, NULL), UM_ESTATE, "the old key after re-expose");
    cr_assert_eq(um_net_put(t.ab, src, 0, k3, l3, 0, 16, NULL), UM_OK, "the new key: %s", um_last_error());
  }
  cr_assert_eq(um_release(dst2), UM_OK);
  cr_assert_eq(um_net_put(t.ab, src, 0, key2, klen2, 0, 16, NULL), UM_ESTATE, "a put after the release");
  cr_assert_eq(um_release(dst), UM_OK);
  cr_assert_eq(um_release(src), UM_OK);
  nm_end(&t);
}

/* The target's manager destroyed (its net with it) while a's endpoint to
 * it is open: a's put fails (UM_EBACKEND or UM_ESTATE) within the net
 * timeout, never a hang; a's own destroy stays clean. */
static um_endpoint *nm_ep;
static um_buffer *nm_src;
static const uint8_t *nm_key;
static size_t nm_klen;

static int nm_put_call(void *arg) {
  (void)arg;
  return um_net_put(nm_ep, nm_src, 0, nm_key, nm_klen, 0, 16, NULL);
}

Test(net_misc, put_to_a_destroyed_peer, .timeout = 120) {
  nm t;
  um_buffer *dst, *src;
  uint8_t key[NM_BLOB];
  size_t klen;
  int st;
  nm_start(&t);
  dst = nm_buffer(t.b, NM_N, 23);
  src = nm_buffer(t.a, NM_N, 24);
  klen = nm_expose(dst, key);
  cr_assert_eq(um_net_put(t.ab, src, 0, key, klen, 0, 16, NULL), UM_OK);
  cr_assert_eq(um_release(dst), UM_OK);
  cr_assert_eq(um_manager_destroy(t.b), UM_OK);
  nm_ep = t.ab;
  nm_src = src;
  nm_key = key;
  nm_klen = klen;
  st = os_bounded(nm_put_call, NULL, 20000, "a put to a destroyed peer");
  cr_assert(st == UM_EBACKEND || st == UM_ESTATE, "a put to a destroyed peer: %s", um_err_name(st));
  cr_assert_eq(um_release(src), UM_OK);
  cr_assert_eq(os_bounded(nm_destroy, t.a, 20000, "destroy of a"), UM_OK);
}

Test(net_misc, destroyed_net_handles, .timeout = 120) {
  nm t;
  um_buffer *x, *y = NULL;
  uint8_t key[NM_BLOB], blob[NM_BLOB];
  size_t klen, len = sizeof(blob);
  um_endpoint *ep = NULL;
  nm_start(&t);
  x = nm_buffer(t.a, NM_N, 25);
  klen = nm_expose(x, key);
  (void)klen;
  cr_assert_eq(um_net_destroy(t.na), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_net_destroy(t.na), UM_ESTATE, "destroy twice");
  cr_assert_eq(um_net_address(t.na, blob, &len), UM_ESTATE);
  cr_assert_eq(um_net_connect(t.na, t.addr_b, t.addr_b_len, &ep), UM_ESTATE);
  cr_assert_eq(um_net_alloc(t.na, 4096, 0, &y), UM_ESTATE);
  cr_assert_eq(um_endpoint_close(t.ab), UM_ESTATE, "an endpoint of a destroyed net");
  cr_assert_eq(um_net_put(t.ab, x, 0, key, klen, 0, 16, NULL), UM_ESTATE);
  cr_assert_eq(um_net_unexpose(x), UM_ESTATE, "the destroy unexposed x");
  len = sizeof(blob);
  cr_assert_eq(um_net_expose(x, blob, &len), UM_ESTATE, "no net on the manager any more");
  cr_assert_null(ep);
  cr_assert_null(y);
  /* "One um_net per manager at a time": a new one after the destroy */
  {
    um_net *n2 = NULL;
    um_net *n3 = NULL;
    cr_assert_eq(um_net_create(t.a, &n2), UM_OK, "a second net after the first was destroyed: %s",
                 um_last_error());
    cr_assert_eq(um_net_create(t.a, &n3), UM_ESTATE, "two at a time");
    cr_assert_eq(um_net_connect(n2, t.addr_b, t.addr_b_len, &ep), UM_OK);
    len = sizeof(blob);
    cr_assert_eq(um_net_expose(x, blob, &len), UM_OK, "%s", um_last_error());
    cr_assert_eq(um_net_put(t.ab, x, 0, key, klen, 0, 16, NULL), UM_ESTATE, "the old net's endpoint");
  }
  cr_assert_eq(um_release(x), UM_OK);
  nm_end(&t);
}

Test(net_misc, net_alloc_arguments_and_busy_destroy, .timeout = 120) {
  nm t;
  um_buffer *x = NULL, *y = NULL, *src;
  uint8_t key[NM_BLOB];
  size_t klen;
  nm_start(&t);
  cr_assert_eq(um_net_alloc(t.nb, 0, 0, &x), UM_EINVAL, "zero bytes");
  cr_assert_eq(um_net_alloc(t.nb, 4096, 1u << 5, &x), UM_EINVAL, "unknown flags");
  cr_assert_eq(um_net_alloc(t.nb, 4096, 0, NULL), UM_EINVAL);
  cr_assert_eq(um_net_alloc(NULL, 4096, 0, &x), UM_EINVAL);
  cr_assert_null(x);
  cr_assert_eq(um_net_alloc(t.nb, NM_N, UM_ALLOC_ZERO | UM_ALLOC_UNPOOLED, &x), UM_OK, "%s", um_last_error());
  {
    uint8_t *h = um_buffer_host_ptr(x);
    cr_assert_not_null(h);
    for (size_t i = 0; i < NM_N; i++)
      cr_assert_eq(h[i], 0, "byte %zu of a zeroed net buffer", i);
  }
  cr_assert_eq(um_buffer_device(x), um_device_get(t.b, 0));
  cr_assert_eq(um_buffer_location(x), UM_HOST);
  /* Only sizes refused before the transport is called: on posix, a huge
   * um_net_alloc once filled /dev/shm (all the RAM) and died of SIGBUS. */
  {
    size_t phys = (size_t)sysconf(_SC_PHYS_PAGES) * (size_t)sysconf(_SC_PAGESIZE);
    cr_assert_eq(um_net_alloc(t.nb, 2 * phys, 0, &y), UM_ENOMEM, "twice the physical memory: %s", um_last_error());
    cr_assert_eq(um_net_alloc(t.nb, phys + 4096, 0, &y), UM_ENOMEM, "more than the physical memory");
    cr_assert_eq(um_net_alloc(t.nb, SIZE_MAX, 0, &y), UM_ENOMEM, "SIZE_MAX");
    cr_assert_null(y);
  }
  klen = nm_expose(x, key);
  src = nm_buffer(t.a, NM_N, 26);
  cr_assert_eq(um_net_put(t.ab, src, 0, key, klen, 0, NM_N, NULL), UM_OK, "%s", um_last_error());
  cr_assert_eq(os_pattern_diff(um_buffer_host_ptr(x), NM_N, 26), SIZE_MAX);
  cr_assert_eq(um_net_destroy(t.nb), UM_EBUSY, "a live buffer of um_net_alloc");
  cr_assert_eq(um_net_put(t.ab, src, 0, key, klen, 0, 16, NULL), UM_OK, "the busy destroy destroyed something");
  cr_assert_eq(um_net_unexpose(x), UM_OK, "the busy destroy unexposed x");
  cr_assert_eq(um_release(x), UM_OK);
  cr_assert_eq(um_net_destroy(t.nb), UM_OK);
  cr_assert_eq(um_release(src), UM_OK);
  nm_end(&t);
}

/* An endpoint to its own net: a put into an exposed buffer of the same
 * manager, and the statistics of both directions. */
Test(net_misc, loopback_to_self_and_stats, .timeout = 120) {
  nm t;
  um_endpoint *self = NULL;
  uint8_t addr[NM_BLOB], key[NM_BLOB];
  size_t alen = sizeof(addr), klen;
  um_buffer *dst, *src;
  um_stats s0, s1;
  nm_start(&t);
  cr_assert_eq(um_net_address(t.na, addr, &alen), UM_OK);
  cr_assert_eq(um_net_connect(t.na, addr, alen, &self), UM_OK, "%s", um_last_error());
  dst = nm_buffer(t.a, NM_N, 27);
  src = nm_buffer(t.a, NM_N, 28);
  klen = nm_expose(dst, key);
  cr_assert_eq(um_stats_get(t.a, NULL, &s0), UM_OK);
  cr_assert_eq(um_net_put(self, src, 0, key, klen, 0, NM_N, NULL), UM_OK, "%s", um_last_error());
  cr_assert_eq(os_pattern_diff(um_buffer_host_ptr(dst), NM_N, 28), SIZE_MAX);
  os_pattern(um_buffer_host_ptr(dst), NM_N, 29);
  cr_assert_eq(um_net_get(self, src, 0, key, klen, 0, 100, NULL), UM_OK, "%s", um_last_error());
  cr_assert_eq(os_pattern_diff(um_buffer_host_ptr(src), 100, 29), SIZE_MAX);
  cr_assert_eq(um_stats_get(t.a, NULL, &s1), UM_OK);
  cr_assert_eq(s1.bytes_net_out - s0.bytes_net_out, (uint64_t)NM_N);
  cr_assert_eq(s1.bytes_net_in - s0.bytes_net_in, 100u);
  cr_assert_eq(s1.xfer_net - s0.xfer_net, 2u);
  cr_assert_eq(um_endpoint_close(self), UM_OK);
  cr_assert_eq(um_release(dst), UM_OK);
  cr_assert_eq(um_release(src), UM_OK);
  nm_end(&t);
}

/* A put and a get of one local buffer, and a put over the same remote
 * range twice, issued back to back with events: each is "ordered after
 * the operations issued earlier" on its local buffer. */
Test(net_misc, ordering_on_the_local_buffer, .timeout = 120) {
  nm t;
  um_buffer *dst, *loc;
  uint8_t key[NM_BLOB], h[NM_N];
  size_t klen;
  um_event *e1 = NULL, *e2 = NULL, *e3 = NULL;
  nm_start(&t);
  dst = nm_buffer(t.b, NM_N, 30);
  loc = nm_buffer(t.a, NM_N, 31);
  klen = nm_expose(dst, key);
  os_pattern(h, NM_N, 32);
  cr_assert_eq(um_copy_from_host(loc, 0, h, NM_N, &e1), UM_OK);
  cr_assert_eq(um_net_put(t.ab, loc, 0, key, klen, 0, NM_N, &e2), UM_OK, "put after the copy into loc");
  cr_assert_eq(um_net_get(t.ab, loc, 0, key, klen, 0, NM_N, &e3), UM_OK, "get into loc after the put");
  cr_assert_eq(os_bounded(nm_wait, e3, 20000, "the get"), UM_OK);
  cr_assert_eq(um_event_wait(e2), UM_OK);
  cr_assert_eq(um_event_wait(e1), UM_OK);
  cr_assert_eq(os_pattern_diff(um_buffer_host_ptr(dst), NM_N, 32), SIZE_MAX, "the put sent loc's old bytes");
  cr_assert_eq(os_pattern_diff(um_buffer_host_ptr(loc), NM_N, 32), SIZE_MAX, "the get");
  um_event_release(e1);
  um_event_release(e2);
  um_event_release(e3);
  cr_assert_eq(um_release(dst), UM_OK);
  cr_assert_eq(um_release(loc), UM_OK);
  nm_end(&t);
}

/* Handles of the wrong kind: "UM_EINVAL (not an endpoint)", "(not a
 * net)", "n not a live handle of a net". */
Test(net_misc, handles_of_the_wrong_kind, .timeout = 120) {
  nm t;
  um_buffer *x, *y = NULL;
  uint8_t key[NM_BLOB], blob[NM_BLOB];
  size_t klen, len = sizeof(blob);
  nm_start(&t);
  x = nm_buffer(t.a, NM_N, 33);
  klen = nm_expose(x, key);
  cr_assert_eq(um_endpoint_close((um_endpoint *)x), UM_EINVAL, "a buffer closed as an endpoint");
  cr_assert_eq(um_endpoint_close((um_endpoint *)t.na), UM_EINVAL, "a net closed as an endpoint");
  cr_assert_eq(um_net_destroy((um_net *)x), UM_EINVAL, "a buffer destroyed as a net");
  cr_assert_eq(um_net_destroy((um_net *)t.ab), UM_EINVAL, "an endpoint destroyed as a net");
  cr_assert_eq(um_net_alloc((um_net *)x, 4096, 0, &y), UM_EINVAL, "a buffer as the net of um_net_alloc");
  cr_assert_eq(um_net_alloc((um_net *)t.ab, 4096, 0, &y), UM_EINVAL, "an endpoint as the net of um_net_alloc");
  cr_assert_eq(um_net_address((um_net *)t.ab, blob, &len), UM_EINVAL, "an endpoint's address");
  cr_assert_eq(um_net_put((um_endpoint *)t.na, x, 0, key, klen, 0, 16, NULL), UM_EINVAL, "a net as endpoint");
  cr_assert_eq(um_net_put((um_endpoint *)x, x, 0, key, klen, 0, 16, NULL), UM_EINVAL, "a buffer as endpoint");
  cr_assert_null(y);
  cr_assert_eq(um_net_unexpose(x), UM_OK, "x survived");
  cr_assert_eq(um_release(x), UM_OK);
  nm_end(&t);
}
