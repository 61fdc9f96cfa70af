/* um_net in one process, talking to itself over its own endpoint: the
 * exact code of every bad argument, blobs fuzzed with seeded mutations,
 * revocation, staging through a test device without host view, teardown
 * with things left open, stale handles, and the library missing. */
#include "net_util.h"

/* ------------------------------------------------------------------------ */
/* Setup: a manager, its net, an endpoint to itself. */

typedef struct api_env {
  um_manager *m;
  um_net *net;
  um_endpoint *self;
} api_env;

/* Messages of the manager's log, for the teardown reports. */
static char api_log_text[8192];

static void api_log(void *ctx, um_log_level level, const char *msg) {
  (void)ctx;
  (void)level;
  strncat(api_log_text, msg, sizeof(api_log_text) - strlen(api_log_text) - 2);
  strcat(api_log_text, "\n");
}

static int count_lines(const char *needle) {
  int n = 0;
  for (const char *p = api_log_text; (p = strstr(p, needle)) != NULL; p++)
    n++;
  return n;
}

static void api_options(um_options *o) {
  nt_options(o, NULL, 10000);
  o->log = api_log;
  o->log_level = UM_LOG_WARN;
}

static void api_open_with(api_env *e, const um_options *o, const um__backend *extra) {
  unsigned char addr[4096];
  size_t len = sizeof(addr);
  int st;
  memset(e, 0, sizeof(*e));
  if (extra != NULL)
    cr_assert_eq(um__manager_create_ex(o, &extra, 1, &e->m), UM_OK, "%s", um_last_error());
  else
    cr_assert_eq(um_manager_create(o, &e->m), UM_OK, "%s", um_last_error());
  st = um_net_create(e->m, &e->net);
  if (st == UM_ENOTSUP) {
    um_manager_destroy(e->m);
    cr_skip_test("no UCX here: %s", um_last_error());
  }
  cr_assert_eq(st, UM_OK, "um_net_create: %s", um_last_error());
  cr_assert_eq(um_net_address(e->net, addr, &len), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_net_connect(e->net, addr, len, &e->self), UM_OK, "%s", um_last_error());
}

static void api_open(api_env *e) {
  um_options o;
  api_options(&o);
  api_open_with(e, &o, NULL);
}

static void api_close(api_env *e) {
  cr_assert_eq(um_endpoint_close(e->self), UM_OK);
  cr_assert_eq(um_net_destroy(e->net), UM_OK);
  cr_assert_eq(um_manager_destroy(e->m), UM_OK);
}

static um_buffer *host_buffer(api_env *e, size_t bytes) {
  um_buffer *b = NULL;
  cr_assert_eq(um_alloc(e->m, um_device_get(e->m, 0), bytes, UM_HOST, UM_ALLOC_ZERO, &b), UM_OK);
  return b;
}

static size_t expose(um_buffer *b, unsigned char *key, size_t cap) {
  size_t len = cap;
  cr_assert_eq(um_net_expose(b, key, &len), UM_OK, "%s", um_last_error());
  return len;
}

TestSuite(net_api, .timeout = 120);

/* ------------------------------------------------------------------------ */
/* Bad arguments, exact codes */

Test(net_api, create_and_address) {
  api_env e;
  um_net *again = NULL;
  unsigned char addr[4096];
  size_t len;
  api_open(&e);
  cr_assert_eq(um_net_create(NULL, &again), UM_EINVAL);
  cr_assert_eq(um_net_create(e.m, NULL), UM_EINVAL);
  cr_assert_eq(um_net_create(e.m, &again), UM_ESTATE, "one um_net per manager");
  cr_assert_null(again);
  cr_assert_eq(um_net_address(NULL, addr, &len), UM_EINVAL);
  cr_assert_eq(um_net_address((um_net *)addr, addr, &len), UM_EINVAL);
  cr_assert_eq(um_net_address(e.net, addr, NULL), UM_EINVAL);
  len = 16;
  cr_assert_eq(um_net_address(e.net, NULL, &len), UM_EINVAL);
  /* Size query: capacity 0, then exactly what was asked for. */
  len = 0;
  cr_assert_eq(um_net_address(e.net, NULL, &len), UM_ERANGE);
  cr_assert_gt(len, 24u);
  {
    size_t need = len;
    len = need - 1;
    cr_assert_eq(um_net_address(e.net, addr, &len), UM_ERANGE);
    cr_assert_eq(len, need);
    cr_assert_eq(um_net_address(e.net, addr, &len), UM_OK);
    cr_assert_eq(len, need);
  }
  api_close(&e);
}

Test(net_api, connect_codes) {
  api_env e;
  um_endpoint *ep = NULL;
  unsigned char addr[4096], key[4096];
  size_t len = sizeof(addr), klen;
  um_buffer *b;
  api_open(&e);
  cr_assert_eq(um_net_address(e.net, addr, &len), UM_OK);
  cr_assert_eq(um_net_connect(NULL, addr, len, &ep), UM_EINVAL);
  cr_assert_eq(um_net_connect(e.net, NULL, len, &ep), UM_EINVAL);
  cr_assert_eq(um_net_connect(e.net, addr, len, NULL), UM_EINVAL);
  cr_assert_eq(um_net_connect(e.net, addr, 0, &ep), UM_EINVAL);
  cr_assert_eq(um_net_connect(e.net, addr, len - 1, &ep), UM_EINVAL, "truncated");
  cr_assert_eq(um_net_connect(e.net, addr, len + 1, &ep), UM_EINVAL, "longer than it says");
  memset(key, 0x5a, sizeof(key));
  cr_assert_eq(um_net_connect(e.net, key, 64, &ep), UM_EINVAL, "garbage");
  b = host_buffer(&e, 4096);
  klen = expose(b, key, sizeof(key));
  cr_assert_eq(um_net_connect(e.net, key, klen, &ep), UM_EINVAL, "a key blob is not an address");
  cr_assert_null(ep);
  cr_assert_eq(um_release(b), UM_OK);
  api_close(&e);
}

Test(net_api, expose_codes) {
  api_env e;
  um_manager *other;
  um_options o;
  unsigned char key[4096], key2[4096];
  size_t len, need;
  um_buffer *b, *ob, *gone;
  api_open(&e);
  b = host_buffer(&e, 8192);
  len = sizeof(key);
  cr_assert_eq(um_net_expose(NULL, key, &len), UM_EINVAL);
  cr_assert_eq(um_net_expose(b, key, NULL), UM_EINVAL);
  cr_assert_eq(um_net_expose(b, NULL, &len), UM_EINVAL);
  cr_assert_eq(um_net_expose((um_buffer *)key, key, &len), UM_EINVAL);
  /* Too small: the size comes back, and b is not left exposed. */
  len = 10;
  cr_assert_eq(um_net_expose(b, key, &len), UM_ERANGE);
  need = len;
  cr_assert_gt(need, 48u);
  cr_assert_eq(um_net_unexpose(b), UM_ESTATE);
  /* Exposing twice gives the same blob. */
  cr_assert_eq(expose(b, key, sizeof(key)), need);
  cr_assert_eq(expose(b, key2, sizeof(key2)), need);
  cr_assert_arr_eq(key, key2, need);
  cr_assert_eq(um_net_unexpose(NULL), UM_EINVAL);
  cr_assert_eq(um_net_unexpose(b), UM_OK);
  cr_assert_eq(um_net_unexpose(b), UM_ESTATE, "not exposed any more");
  /* A released buffer. */
  gone = host_buffer(&e, 4096);
  cr_assert_eq(um_release(gone), UM_OK);
  len = sizeof(key);
  cr_assert_eq(um_net_expose(gone, key, &len), UM_ESTATE);
  cr_assert_eq(um_net_unexpose(gone), UM_ESTATE);
  /* A manager without a um_net. */
  api_options(&o);
  cr_assert_eq(um_manager_create(&o, &other), UM_OK);
  cr_assert_eq(um_alloc(other, um_device_get(other, 0), 4096, UM_HOST, 0, &ob), UM_OK);
  cr_assert_eq(um_net_expose(ob, key, &len), UM_ESTATE);
  cr_assert_eq(um_net_unexpose(ob), UM_ESTATE);
  cr_assert_eq(um_release(ob), UM_OK);
  cr_assert_eq(um_manager_destroy(other), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  api_close(&e);
}

Test(net_api, put_get_codes) {
  api_env e;
  unsigned char key[4096], ro_key[4096], mem[8192];
  size_t klen, rklen;
  um_buffer *b, *src, *ro, *gone, *ob;
  um_manager *other;
  um_options o;
  um_event *ev = NULL;
  api_open(&e);
  b = host_buffer(&e, 8192);
  src = host_buffer(&e, 8192);
  klen = expose(b, key, sizeof(key));
  cr_assert_eq(um_wrap_host(e.m, mem, sizeof(mem), UM_WRAP_READONLY, &ro), UM_OK);
  rklen = expose(ro, ro_key, sizeof(ro_key));
  /* NULLs and handles that are not handles. */
  cr_assert_eq(um_net_put(NULL, src, 0, key, klen, 0, 16, NULL), UM_EINVAL);
  cr_assert_eq(um_net_put(e.self, NULL, 0, key, klen, 0, 16, NULL), UM_EINVAL);
  cr_assert_eq(um_net_put(e.self, src, 0, NULL, klen, 0, 16, NULL), UM_EINVAL);
  cr_assert_eq(um_net_put((um_endpoint *)mem, src, 0, key, klen, 0, 16, NULL), UM_EINVAL);
  cr_assert_eq(um_net_get(NULL, src, 0, key, klen, 0, 16, NULL), UM_EINVAL);
  cr_assert_eq(um_net_get(e.self, NULL, 0, key, klen, 0, 16, NULL), UM_EINVAL);
  cr_assert_eq(um_net_get(e.self, src, 0, NULL, klen, 0, 16, NULL), UM_EINVAL);
  /* Zero bytes; a blob of the wrong length. */
  cr_assert_eq(um_net_put(e.self, src, 0, key, klen, 0, 0, NULL), UM_EINVAL);
  cr_assert_eq(um_net_put(e.self, src, 0, key, klen - 1, 0, 16, NULL), UM_EINVAL);
  cr_assert_eq(um_net_get(e.self, src, 0, key, klen + 1, 0, 16, NULL), UM_EINVAL);
  /* Ranges: local, then remote against the exposed size. */
  cr_assert_eq(um_net_put(e.self, src, 8190, key, klen, 0, 16, NULL), UM_ERANGE);
  cr_assert_eq(um_net_put(e.self, src, 9000, key, klen, 0, 1, NULL), UM_ERANGE);
  cr_assert_eq(um_net_put(e.self, src, 0, key, klen, 8180, 16, NULL), UM_ERANGE);
  cr_assert_eq(um_net_put(e.self, src, 0, key, klen, 8193, 1, NULL), UM_ERANGE);
  cr_assert_eq(um_net_get(e.self, src, 0, key, klen, 1, 8192, NULL), UM_ERANGE);
  cr_assert_eq(um_net_put(e.self, src, 0, key, klen, 8176, 16, NULL), UM_OK, "last 16 bytes: in range");
  /* Read-only: the remote buffer takes no put; a read-only wrap takes no get. */
  cr_assert_eq(um_net_put(e.self, src, 0, ro_key, rklen, 0, 16, NULL), UM_ESTATE);
  cr_assert_eq(um_net_get(e.self, src, 0, ro_key, rklen, 0, 16, NULL), UM_OK);
  cr_assert_eq(um_net_get(e.self, ro, 0, key, klen, 0, 16, NULL), UM_ESTATE);
  /* A released buffer; a buffer of another manager. */
  gone = host_buffer(&e, 4096);
  cr_assert_eq(um_release(gone), UM_OK);
  cr_assert_eq(um_net_put(e.self, gone, 0, key, klen, 0, 16, NULL), UM_ESTATE);
  api_options(&o);
  cr_assert_eq(um_manager_create(&o, &other), UM_OK);
  cr_assert_eq(um_alloc(other, um_device_get(other, 0), 4096, UM_HOST, 0, &ob), UM_OK);
  cr_assert_eq(um_net_put(e.self, ob, 0, key, klen, 0, 16, NULL), UM_EINVAL);
  cr_assert_eq(um_release(ob), UM_OK);
  cr_assert_eq(um_manager_destroy(other), UM_OK);
  /* Nothing was issued by a refused call. */
  cr_assert_eq(um_net_put(e.self, src, 0, key, klen, 0, 0, &ev), UM_EINVAL);
  cr_assert_null(ev);
  cr_assert_eq(um_release(ro), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_release(src), UM_OK);
  api_close(&e);
}

Test(net_api, stale_handles) {
  api_env e;
  unsigned char key[4096], addr[4096];
  size_t klen, len = sizeof(addr);
  um_buffer *b, *src;
  um_endpoint *ep;
  api_open(&e);
  b = host_buffer(&e, 4096);
  src = host_buffer(&e, 4096);
  klen = expose(b, key, sizeof(key));
  cr_assert_eq(um_net_address(e.net, addr, &len), UM_OK);
  cr_assert_eq(um_net_connect(e.net, addr, len, &ep), UM_OK);
  cr_assert_eq(um_endpoint_close(ep), UM_OK);
  cr_assert_eq(um_endpoint_close(ep), UM_ESTATE);
  cr_assert_eq(um_endpoint_close(NULL), UM_EINVAL);
  cr_assert_eq(um_endpoint_close((um_endpoint *)key), UM_EINVAL);
  cr_assert_eq(um_net_put(ep, src, 0, key, klen, 0, 16, NULL), UM_ESTATE);
  cr_assert_eq(um_net_get(ep, src, 0, key, klen, 0, 16, NULL), UM_ESTATE);
  cr_assert_eq(um_endpoint_close(e.self), UM_OK);
  cr_assert_eq(um_net_unexpose(b), UM_OK);
  cr_assert_eq(um_net_destroy(e.net), UM_OK);
  /* Until the manager goes, the dead net's handle answers UM_ESTATE. */
  cr_assert_eq(um_net_destroy(e.net), UM_ESTATE);
  cr_assert_eq(um_net_destroy(NULL), UM_EINVAL);
  len = sizeof(addr);
  cr_assert_eq(um_net_address(e.net, addr, &len), UM_ESTATE);
  cr_assert_eq(um_net_connect(e.net, addr, len, &ep), UM_ESTATE);
  cr_assert_eq(um_net_put(e.self, src, 0, key, klen, 0, 16, NULL), UM_ESTATE);
  len = sizeof(key);
  cr_assert_eq(um_net_expose(b, key, &len), UM_ESTATE, "no live um_net on the manager");
  /* A new net on the same manager works. */
  cr_assert_eq(um_net_create(e.m, &e.net), UM_OK);
  cr_assert_eq(um_net_destroy(e.net), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_release(src), UM_OK);
  cr_assert_eq(um_manager_destroy(e.m), UM_OK);
}

Test(net_api, timeout_option) {
  um_options o;
  um_manager *m = NULL;
  um_options_init(&o);
  cr_assert_eq(o.net_timeout_ms, 10000u);
  o.net_timeout_ms = 0;
  cr_assert_eq(um_manager_create(&o, &m), UM_EINVAL);
  cr_assert_null(m);
  setenv("UNIMEM_NET_TIMEOUT_MS", "2500", 1);
  um_options_init(&o);
  unsetenv("UNIMEM_NET_TIMEOUT_MS");
  cr_assert_eq(o.net_timeout_ms, 2500u);
}

/* ------------------------------------------------------------------------ */
/* Moving data to itself, and revocation */

Test(net_api, loopback_put_get) {
  static const size_t sizes[] = {1, 4096, 65536 + 7, (1u << 20) + 1};
  api_env e;
  unsigned char key[4096];
  size_t klen;
  um_buffer *target, *src, *dst;
  api_open(&e);
  target = host_buffer(&e, 2u << 20);
  src = host_buffer(&e, 2u << 20);
  dst = host_buffer(&e, 2u << 20);
  klen = expose(target, key, sizeof(key));
  for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
    size_t n = sizes[k];
    nt_fill(um_buffer_host_ptr(src), n, (unsigned)k + 3, 0);
    cr_assert_eq(um_net_put(e.self, src, 0, key, klen, 17, n, NULL), UM_OK, "%s", um_last_error());
    cr_assert_eq(nt_mismatch((char *)um_buffer_host_ptr(target) + 17, n, (unsigned)k + 3, 0), n);
    cr_assert_eq(um_net_get(e.self, dst, 5, key, klen, 17, n, NULL), UM_OK, "%s", um_last_error());
    cr_assert_eq(nt_mismatch((char *)um_buffer_host_ptr(dst) + 5, n, (unsigned)k + 3, 0), n);
  }
  cr_assert_eq(um_release(target), UM_OK); /* unexposes it */
  cr_assert_eq(um_release(src), UM_OK);
  cr_assert_eq(um_release(dst), UM_OK);
  api_close(&e);
}

Test(net_api, unexpose_revokes) {
  api_env e;
  unsigned char key[4096], key2[4096];
  size_t klen, klen2;
  um_buffer *target, *src;
  unsigned char *mem;
  api_open(&e);
  target = host_buffer(&e, 65536);
  src = host_buffer(&e, 65536);
  mem = um_buffer_host_ptr(target);
  memset(mem, 0xAA, 65536);
  memset(um_buffer_host_ptr(src), 0x55, 65536);
  klen = expose(target, key, sizeof(key));
  cr_assert_eq(um_net_unexpose(target), UM_OK);
  cr_assert_eq(um_net_put(e.self, src, 0, key, klen, 0, 65536, NULL), UM_ESTATE);
  cr_assert(strstr(um_last_error(), "no longer exposed") != NULL, "%s", um_last_error());
  cr_assert_eq(um_net_get(e.self, src, 0, key, klen, 0, 16, NULL), UM_ESTATE);
  for (size_t i = 0; i < 65536; i++)
    cr_assert_eq(mem[i], 0xAA, "byte %zu written after unexpose", i);
  cr_assert_eq(((unsigned char *)um_buffer_host_ptr(src))[0], 0x55, "the get brought nothing");
  /* Exposed again: a new key works, the old one stays dead. */
  klen2 = expose(target, key2, sizeof(key2));
  cr_assert_neq(memcmp(key, key2, klen < klen2 ? klen : klen2), 0);
  cr_assert_eq(um_net_put(e.self, src, 0, key, klen, 0, 16, NULL), UM_ESTATE);
  cr_assert_eq(um_net_put(e.self, src, 0, key2, klen2, 0, 16, NULL), UM_OK);
  cr_assert_eq(mem[0], 0x55);
  cr_assert_eq(mem[16], 0xAA);
  /* Releasing revokes too: the block, back in the pool, is not written. */
  cr_assert_eq(um_release(target), UM_OK);
  memset(um_buffer_host_ptr(src), 0x66, 65536);
  cr_assert_eq(um_net_put(e.self, src, 0, key2, klen2, 0, 65536, NULL), UM_ESTATE);
  cr_assert_eq(mem[0], 0x55);
  cr_assert_eq(mem[16], 0xAA);
  cr_assert_eq(um_release(src), UM_OK);
  api_close(&e);
}

/* ------------------------------------------------------------------------ */
/* The operation layer: statistics, the failure's text after a wait, the
 * attachment of operations canceled or refused at issue, events reused. */

Test(net_api, stats_count_the_issuing_side) {
  enum { ROUNDS = 150 }; /* more events than one slab: objects are reused */
  api_env e;
  unsigned char key[4096];
  size_t klen;
  um_buffer *target, *src, *dst;
  um_stats before, after;
  api_open(&e);
  target = host_buffer(&e, 65536);
  src = host_buffer(&e, 65536);
  dst = host_buffer(&e, 65536);
  klen = expose(target, key, sizeof(key));
  before = ut_stats(e.m, um_device_get(e.m, 0));
  for (int i = 0; i < ROUNDS; i++) {
    um_event *ev[2];
    memset(um_buffer_host_ptr(src), i, 100);
    cr_assert_eq(um_net_put(e.self, src, 0, key, klen, 1000, 100, &ev[0]), UM_OK, "%s", um_last_error());
    cr_assert_eq(um_net_get(e.self, dst, 0, key, klen, 1000, 100, &ev[1]), UM_OK, "%s", um_last_error());
    cr_assert_eq(um_event_wait(ev[1]), UM_OK, "%s", um_last_error());
    cr_assert_eq(um_event_wait(ev[0]), UM_OK, "%s", um_last_error());
    cr_assert_eq(um_event_release(ev[0]), UM_OK);
    cr_assert_eq(um_event_release(ev[1]), UM_OK);
  }
  after = ut_stats(e.m, um_device_get(e.m, 0));
  cr_assert_eq(after.bytes_net_out - before.bytes_net_out, ROUNDS * 100u);
  cr_assert_eq(after.bytes_net_in - before.bytes_net_in, ROUNDS * 100u);
  cr_assert_eq(after.xfer_net - before.xfer_net, 2u * ROUNDS);
  cr_assert_eq(after.bytes_h2d - before.bytes_h2d, 0u, "the network is not a device copy");
  cr_assert_eq(after.xfer_direct - before.xfer_direct, 0u);
  cr_assert_eq(um_release(target), UM_OK);
  cr_assert_eq(um_release(src), UM_OK);
  cr_assert_eq(um_release(dst), UM_OK);
  api_close(&e);
}

Test(net_api, failure_text_after_wait) {
  api_env e;
  unsigned char key[4096];
  size_t klen;
  um_buffer *target, *src;
  um_event *ev;
  api_open(&e);
  target = host_buffer(&e, 4096);
  src = host_buffer(&e, 4096);
  klen = expose(target, key, sizeof(key));
  cr_assert_eq(um_net_unexpose(target), UM_OK);
  cr_assert_eq(um_net_put(e.self, src, 0, key, klen, 0, 4096, &ev), UM_OK);
  cr_assert_eq(um_release(NULL), UM_EINVAL); /* another text on this thread */
  cr_assert_eq(um_event_wait(ev), UM_ESTATE);
  cr_assert(strstr(um_last_error(), "no longer exposed") != NULL, "%s", um_last_error());
  cr_assert_eq(um_release(NULL), UM_EINVAL);
  cr_assert_eq(um_event_query(ev), UM_ESTATE);
  cr_assert(strstr(um_last_error(), "no longer exposed") != NULL, "%s", um_last_error());
  cr_assert_eq(um_event_release(ev), UM_OK);
  cr_assert_eq(um_release(target), UM_OK);
  cr_assert_eq(um_release(src), UM_OK);
  api_close(&e);
}

/* A put held behind a bracket on its buffer is canceled; a put on a mapped
 * buffer is refused under the buffer's lock. Neither leaks what it
 * attached (LeakSanitizer in ASan builds), and neither moves a byte. */
Test(net_api, canceled_and_refused_transfers) {
  api_env e;
  unsigned char key[4096];
  size_t klen;
  um_buffer *target, *src;
  um_event *ev, *wait_ev;
  void *mapped;
  api_open(&e);
  target = host_buffer(&e, 4096);
  src = host_buffer(&e, 4096);
  memset(um_buffer_host_ptr(src), 0x5A, 4096);
  klen = expose(target, key, sizeof(key));
  cr_assert_eq(um_access_begin(src, UM_MAP_READ_WRITE, (void **)&wait_ev), UM_OK);
  cr_assert_eq(um_net_put(e.self, src, 0, key, klen, 0, 4096, &ev), UM_OK);
  cr_assert_eq(um_event_query(ev), UM_EAGAIN, "held behind the bracket");
  cr_assert_eq(um_event_cancel(ev), UM_OK);
  cr_assert_eq(um_access_end(src, NULL), UM_OK);
  cr_assert_eq(um_event_wait(ev), UM_ECANCELED);
  cr_assert_eq(um_event_release(ev), UM_OK);
  cr_assert_eq(um_map(src, UM_MAP_READ, 0, 4096, &mapped), UM_OK);
  cr_assert_eq(um_net_put(e.self, src, 0, key, klen, 0, 4096, NULL), UM_ESTATE);
  cr_assert(strstr(um_last_error(), "mapped") != NULL, "%s", um_last_error());
  cr_assert_eq(um_unmap(src, mapped), UM_OK);
  cr_assert_eq(((unsigned char *)um_buffer_host_ptr(target))[0], 0, "nothing was put");
  cr_assert_eq(um_release(target), UM_OK);
  cr_assert_eq(um_release(src), UM_OK);
  api_close(&e);
}

/* ------------------------------------------------------------------------ */
/* A device with no host view (the test-discrete backend of test_util.h):
 * puts and gets go through staging chunks (malloc'd: it has no PINNED). */

Test(net_api, staging_without_host_view) {
  static const size_t sizes[] = {1, 4096, 3 * 4096 + 100, 8 * 4096};
  api_env e;
  um_options o;
  unsigned char key[4096], *host = malloc(65536), *back = malloc(65536);
  size_t klen, len;
  um_buffer *target, *dsrc, *ddst;
  um_device *disc;
  um_stats before, after;
  api_options(&o);
  o.staging_chunk_bytes = 4096;
  api_open_with(&e, &o, &ut_disc_backend);
  disc = um_device_get(e.m, 1);
  cr_assert_not_null(disc);
  target = host_buffer(&e, 65536);
  cr_assert_eq(um_alloc(e.m, disc, 65536, UM_DEVICE, 0, &dsrc), UM_OK);
  cr_assert_eq(um_alloc(e.m, disc, 65536, UM_DEVICE, 0, &ddst), UM_OK);
  cr_assert_null(um_buffer_host_ptr(dsrc));
  len = sizeof(key);
  cr_assert_eq(um_net_expose(dsrc, key, &len), UM_ENOTSUP);
  klen = expose(target, key, sizeof(key));
  for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
    size_t n = sizes[k];
    nt_fill(host, n, (unsigned)k + 9, 0);
    cr_assert_eq(um_copy_from_host(dsrc, 3, host, n, NULL), UM_OK);
    before = ut_stats(e.m, disc);
    cr_assert_eq(um_net_put(e.self, dsrc, 3, key, klen, 11, n, NULL), UM_OK, "%s", um_last_error());
    cr_assert_eq(nt_mismatch((char *)um_buffer_host_ptr(target) + 11, n, (unsigned)k + 9, 0), n);
    cr_assert_eq(um_net_get(e.self, ddst, 1, key, klen, 11, n, NULL), UM_OK, "%s", um_last_error());
    after = ut_stats(e.m, disc);
    cr_assert_eq(after.bytes_d2h - before.bytes_d2h, n, "the put's staging copies");
    cr_assert_eq(after.bytes_h2d - before.bytes_h2d, n, "the get's staging copies");
    cr_assert_eq(um_copy_to_host(ddst, 1, back, n, NULL), UM_OK);
    cr_assert_eq(nt_mismatch(back, n, (unsigned)k + 9, 0), n);
  }
  /* Refused by the target: nothing is staged into the device buffer. */
  cr_assert_eq(um_net_unexpose(target), UM_OK);
  cr_assert_eq(um_net_get(e.self, ddst, 0, key, klen, 0, 3 * 4096, NULL), UM_ESTATE);
  cr_assert_eq(um_release(target), UM_OK);
  cr_assert_eq(um_release(dsrc), UM_OK);
  cr_assert_eq(um_release(ddst), UM_OK);
  api_close(&e);
  free(host);
  free(back);
}

/* ------------------------------------------------------------------------ */
/* Closing and destroying with work in flight, and what is reported */

/* Puts issued on one buffer run one after the other; closing the endpoint
 * lets the one in flight finish and refuses the rest when they start. */
Test(net_api, close_with_operations_in_flight) {
  enum { N = 8 };
  api_env e;
  unsigned char key[4096], addr[4096];
  size_t klen, len = sizeof(addr);
  um_buffer *target, *src;
  um_endpoint *ep;
  um_event *ev[N];
  int first_refused = N;
  api_open(&e);
  target = host_buffer(&e, 4u << 20);
  src = host_buffer(&e, 4u << 20);
  klen = expose(target, key, sizeof(key));
  cr_assert_eq(um_net_address(e.net, addr, &len), UM_OK);
  cr_assert_eq(um_net_connect(e.net, addr, len, &ep), UM_OK);
  for (int i = 0; i < N; i++)
    cr_assert_eq(um_net_put(ep, src, 0, key, klen, 0, 4u << 20, &ev[i]), UM_OK);
  cr_assert_eq(um_endpoint_close(ep), UM_OK);
  for (int i = 0; i < N; i++) {
    int st = um_event_wait(ev[i]);
    cr_assert(st == UM_OK || st == UM_ESTATE, "put %d: %s", i, um_err_name(st));
    if (st == UM_ESTATE && first_refused == N)
      first_refused = i;
    cr_assert(i < first_refused || st == UM_ESTATE, "put %d ran after put %d was refused", i, first_refused);
    um_event_release(ev[i]);
  }
  cr_assert_eq(um_release(target), UM_OK);
  cr_assert_eq(um_release(src), UM_OK);
  api_close(&e);
}

Test(net_api, destroy_reports_what_was_left) {
  api_env e;
  unsigned char key[4096], addr[4096];
  size_t len = sizeof(addr);
  um_buffer *a, *b, *src;
  um_endpoint *extra;
  um_event *ev;
  api_log_text[0] = '\0';
  api_open(&e);
  a = host_buffer(&e, 1u << 20);
  b = host_buffer(&e, 4096);
  src = host_buffer(&e, 1u << 20);
  len = sizeof(key);
  cr_assert_eq(um_net_expose(b, key, &len), UM_OK);
  len = sizeof(addr);
  cr_assert_eq(um_net_address(e.net, addr, &len), UM_OK);
  cr_assert_eq(um_net_connect(e.net, addr, len, &extra), UM_OK);
  /* A put issued and not waited for: the destroy lets it finish, or fails
   * it when it starts. */
  len = expose(a, key, sizeof(key));
  cr_assert_eq(um_net_put(extra, src, 0, key, len, 0, 1u << 20, &ev), UM_OK);
  cr_assert_eq(um_net_destroy(e.net), UM_OK);
  {
    int st = um_event_wait(ev);
    cr_assert(st == UM_OK || st == UM_ESTATE, "%s", um_err_name(st));
  }
  cr_assert_eq(count_lines("was still open"), 2, "log:\n%s", api_log_text); /* self and extra */
  cr_assert_eq(count_lines("was still exposed"), 2, "log:\n%s", api_log_text);
  cr_assert_eq(um_endpoint_close(extra), UM_ESTATE);
  cr_assert_eq(um_net_unexpose(a), UM_ESTATE);
  cr_assert_eq(um_release(a), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_release(src), UM_OK);
  /* Event objects die with the manager now: released before it. */
  cr_assert_eq(um_event_release(ev), UM_OK);
  cr_assert_eq(um_manager_destroy(e.m), UM_OK);
}

Test(net_api, manager_destroys_its_net) {
  api_env e;
  unsigned char key[4096];
  um_buffer *b;
  api_log_text[0] = '\0';
  api_open(&e);
  b = host_buffer(&e, 4096);
  (void)expose(b, key, sizeof(key));
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_manager_destroy(e.m), UM_OK);
  cr_assert_eq(count_lines("was never destroyed"), 1, "log:\n%s", api_log_text);
  cr_assert_eq(count_lines("was still open"), 1, "log:\n%s", api_log_text);
  cr_assert_eq(count_lines("was still exposed"), 0, "released, so unexposed already:\n%s", api_log_text);
}

/* ------------------------------------------------------------------------ */
/* um_net_alloc: buffers whose memory UCX allocated */

#ifdef UNIMEM_HAVE_UCX
#include "ucx_api.h"

/* Registrations with UCX, counted: ucp_mem_map of the loaded library
 * through a wrapper while a test runs. */
static atomic_int mem_maps;
static ucs_status_t (*real_mem_map)(ucp_context_h, const ucp_mem_map_params_t *, ucp_mem_h *);

static ucs_status_t counting_mem_map(ucp_context_h c, const ucp_mem_map_params_t *p, ucp_mem_h *h) {
  atomic_fetch_add(&mem_maps, 1);
  return real_mem_map(c, p, h);
}
#endif

Test(net_api, alloc_codes) {
  api_env e;
  um_buffer *b = NULL;
  struct {
    uint32_t magic;
    char pad[252];
  } not_a_net = {0, {0}};
  api_open(&e);
  cr_assert_eq(um_net_alloc(NULL, 4096, 0, &b), UM_EINVAL);
  cr_assert_eq(um_net_alloc((um_net *)&not_a_net, 4096, 0, &b), UM_EINVAL);
  cr_assert_eq(um_net_alloc((um_net *)e.self, 4096, 0, &b), UM_EINVAL, "an endpoint is not a net");
  cr_assert_eq(um_net_alloc(e.net, 4096, 0, NULL), UM_EINVAL);
  cr_assert_eq(um_net_alloc(e.net, 0, 0, &b), UM_EINVAL);
  cr_assert_eq(um_net_alloc(e.net, 4096, 0x100, &b), UM_EINVAL);
  cr_assert_eq(um_net_alloc(e.net, 4096, UM_WRAP_READONLY << 8, &b), UM_EINVAL);
  cr_assert_eq(um_net_alloc(e.net, (size_t)1 << 63, 0, &b), UM_ENOMEM);
  cr_assert_null(b);
  cr_assert_eq(um_net_alloc(e.net, 4096, UM_ALLOC_UNPOOLED | UM_ALLOC_ZERO, &b), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_release(b), UM_ESTATE);
  api_close(&e);
  /* The destroyed net's handle answers UM_ESTATE until the manager goes;
   * e.m is gone too here, so use a fresh pair. */
  api_open(&e);
  cr_assert_eq(um_endpoint_close(e.self), UM_OK);
  cr_assert_eq(um_net_destroy(e.net), UM_OK);
  b = NULL;
  cr_assert_eq(um_net_alloc(e.net, 4096, 0, &b), UM_ESTATE);
  cr_assert_null(b);
  cr_assert_eq(um_manager_destroy(e.m), UM_OK);
}

/* A buffer of um_net_alloc is a HOST buffer of device 0 like any other:
 * zeroed on request, its statistics those of a wrap, copies and mappings
 * work, and its release gives the memory back. */
Test(net_api, alloc_is_a_host_buffer) {
  enum { N = (1u << 20) + 13 };
  api_env e;
  um_device *cpu;
  um_buffer *b, *other;
  um_stats s0, s1, s2, want;
  unsigned char *host, *mapped;
  api_open(&e);
  cpu = um_device_get(e.m, 0);
  s0 = ut_stats(e.m, cpu);
  cr_assert_eq(um_net_alloc(e.net, N, UM_ALLOC_ZERO, &b), UM_OK, "%s", um_last_error());
  s1 = ut_stats(e.m, cpu);
  want = s0;
  want.active_buffers += 1;
  want.bytes_in_use += N;
  want.peak_bytes_in_use = s0.peak_bytes_in_use > N ? s0.peak_bytes_in_use : N;
  want.allocations += 1;
  cr_assert_eq(ut_stats_diff(&s1, &want, "after um_net_alloc"), 0, "nothing from the device or the pool");
  cr_assert_eq(um_buffer_device(b), cpu);
  cr_assert_eq(um_buffer_location(b), UM_HOST);
  cr_assert_eq(um_buffer_size(b), (size_t)N);
  host = um_buffer_host_ptr(b);
  cr_assert_not_null(host);
  for (size_t i = 0; i < N; i++)
    cr_assert_eq(host[i], 0, "UM_ALLOC_ZERO: byte %zu", i);
  /* Copies both ways, and a mapping. */
  nt_fill(host, N, 7, 0);
  other = host_buffer(&e, N);
  cr_assert_eq(um_copy(other, 0, b, 0, N, NULL), UM_OK, "%s", um_last_error());
  cr_assert_eq(nt_mismatch(um_buffer_host_ptr(other), N, 7, 0), (size_t)N);
  nt_fill(um_buffer_host_ptr(other), N, 8, 0);
  cr_assert_eq(um_copy(b, 5, other, 0, N - 5, NULL), UM_OK, "%s", um_last_error());
  cr_assert_eq(nt_mismatch(host + 5, N - 5, 8, 0), (size_t)N - 5);
  cr_assert_eq(um_map(b, UM_MAP_READ_WRITE, 100, 4096, (void **)&mapped), UM_OK, "%s", um_last_error());
  cr_assert_eq(mapped, host + 100);
  mapped[0] = 0xab;
  cr_assert_eq(um_unmap(b, mapped), UM_OK);
  cr_assert_eq(host[100], 0xab);
  cr_assert_eq(um_release(other), UM_OK);
  s1 = ut_stats(e.m, cpu);
  cr_assert_eq(um_release(b), UM_OK);
  s2 = ut_stats(e.m, cpu);
  want = s1;
  want.active_buffers -= 1;
  want.bytes_in_use -= N;
  want.releases += 1;
  cr_assert_eq(ut_stats_diff(&s2, &want, "after um_release"), 0, "nothing to the pool or the device");
  api_close(&e);
}

/* Put and get through the net's own endpoint into and out of buffers of
 * um_net_alloc, exposed with the allocation's mapping: no registration
 * with UCX for the exposure (counted), where a buffer of um_alloc takes
 * one. */
Test(net_api, alloc_expose_put_get) {
  static const size_t sizes[] = {1, 4096, 65536 + 7, (1u << 20) + 1};
  api_env e;
  unsigned char key[4096], key2[4096];
  size_t klen, klen2;
  um_buffer *target, *src, *dst, *pooled;
  api_open(&e);
  cr_assert_eq(um_net_alloc(e.net, 2u << 20, 0, &target), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_net_alloc(e.net, 2u << 20, 0, &src), UM_OK, "%s", um_last_error());
  dst = host_buffer(&e, 2u << 20);
  pooled = host_buffer(&e, 4096);
#ifdef UNIMEM_HAVE_UCX
  real_mem_map = um__ucx.ucp_mem_map;
  atomic_store(&mem_maps, 0);
  um__ucx.ucp_mem_map = counting_mem_map;
#endif
  klen = expose(target, key, sizeof(key));
  klen2 = sizeof(key2);
  cr_assert_eq(um_net_expose(target, key2, &klen2), UM_OK);
  cr_assert_eq(klen2, klen);
  cr_assert_eq(memcmp(key, key2, klen), 0, "exposing again gives the same blob");
#ifdef UNIMEM_HAVE_UCX
  cr_assert_eq(atomic_load(&mem_maps), 0, "the allocation's own mapping, no ucp_mem_map");
  (void)expose(pooled, key2, sizeof(key2));
  cr_assert_eq(atomic_load(&mem_maps), 1, "a buffer of um_alloc is registered");
  um__ucx.ucp_mem_map = real_mem_map;
#endif
  for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
    size_t n = sizes[k];
    nt_fill(um_buffer_host_ptr(src), n, (unsigned)k + 3, 0);
    cr_assert_eq(um_net_put(e.self, src, 0, key, klen, 17, n, NULL), UM_OK, "%s", um_last_error());
    cr_assert_eq(nt_mismatch((char *)um_buffer_host_ptr(target) + 17, n, (unsigned)k + 3, 0), n);
    memset(um_buffer_host_ptr(dst), 0, n + 5);
    cr_assert_eq(um_net_get(e.self, dst, 5, key, klen, 17, n, NULL), UM_OK, "%s", um_last_error());
    cr_assert_eq(nt_mismatch((char *)um_buffer_host_ptr(dst) + 5, n, (unsigned)k + 3, 0), n);
  }
  cr_assert_eq(um_net_put(e.self, src, 0, key, klen, 1, 2u << 20, NULL), UM_ERANGE);
  /* Unexposing revokes as for any buffer; the memory stays the buffer's. */
  cr_assert_eq(um_net_unexpose(target), UM_OK);
  cr_assert_eq(um_net_put(e.self, src, 0, key, klen, 0, 16, NULL), UM_ESTATE);
  cr_assert_eq(nt_mismatch((char *)um_buffer_host_ptr(target) + 17, sizes[3], 6, 0), sizes[3]);
  klen = expose(target, key, sizeof(key));
  cr_assert_eq(um_net_put(e.self, src, 0, key, klen, 0, 16, NULL), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_release(target), UM_OK); /* unexposes, then unmaps */
  cr_assert_eq(um_net_put(e.self, src, 0, key, klen, 0, 16, NULL), UM_ESTATE);
  cr_assert_eq(um_release(src), UM_OK);
  cr_assert_eq(um_release(dst), UM_OK);
  cr_assert_eq(um_release(pooled), UM_OK);
  api_close(&e);
}

/* um_net_destroy refuses while a buffer of um_net_alloc is live, and
 * leaves everything as it was; once released, it goes. */
Test(net_api, alloc_keeps_its_net) {
  api_env e;
  unsigned char key[4096];
  size_t klen;
  um_buffer *a, *b, *src;
  api_log_text[0] = '\0';
  api_open(&e);
  cr_assert_eq(um_net_alloc(e.net, 65536, 0, &a), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_net_alloc(e.net, 4096, 0, &b), UM_OK, "%s", um_last_error());
  src = host_buffer(&e, 65536);
  klen = expose(a, key, sizeof(key));
  cr_assert_eq(um_net_destroy(e.net), UM_EBUSY);
  cr_assert(strstr(um_last_error(), "2 buffer(s) of um_net_alloc (69632 bytes)") != NULL, "%s", um_last_error());
  /* Nothing was destroyed: the endpoint, the exposure, the net work. */
  nt_fill(um_buffer_host_ptr(src), 65536, 9, 0);
  cr_assert_eq(um_net_put(e.self, src, 0, key, klen, 0, 65536, NULL), UM_OK, "%s", um_last_error());
  cr_assert_eq(nt_mismatch(um_buffer_host_ptr(a), 65536, 9, 0), 65536u);
  cr_assert_eq(um_release(a), UM_OK);
  cr_assert_eq(um_net_destroy(e.net), UM_EBUSY);
  cr_assert(strstr(um_last_error(), "1 buffer(s) of um_net_alloc (4096 bytes)") != NULL, "%s", um_last_error());
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_net_destroy(e.net), UM_OK);
  cr_assert_eq(count_lines("was still open"), 1, "log:\n%s", api_log_text);
  cr_assert_eq(count_lines("was still exposed"), 0, "log:\n%s", api_log_text);
  cr_assert_eq(um_release(src), UM_OK);
  cr_assert_eq(um_manager_destroy(e.m), UM_OK);
}

/* um_manager_destroy with buffers of um_net_alloc still live (one exposed,
 * one with a copy queued behind it): reported and released as leaks while
 * their net is still there, then the net goes. */
Test(net_api, alloc_leaked_at_manager_destroy) {
  api_env e;
  unsigned char key[4096];
  um_buffer *a, *b, *pooled;
  um_event *ev;
  api_log_text[0] = '\0';
  api_open(&e);
  cr_assert_eq(um_net_alloc(e.net, 8192, 0, &a), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_net_alloc(e.net, 1u << 20, 0, &b), UM_OK, "%s", um_last_error());
  pooled = host_buffer(&e, 1u << 20);
  (void)expose(a, key, sizeof(key));
  cr_assert_eq(um_copy(b, 0, pooled, 0, 1u << 20, &ev), UM_OK);
  cr_assert_eq(um_event_wait(ev), UM_OK);
  cr_assert_eq(um_event_release(ev), UM_OK);
  cr_assert_eq(um_release(pooled), UM_OK);
  cr_assert_eq(um_manager_destroy(e.m), UM_ELEAK);
  cr_assert(strstr(um_last_error(), "2 buffer(s) (1056768 bytes)") != NULL, "%s", um_last_error());
  cr_assert_eq(count_lines("leak: buffer"), 2, "log:\n%s", api_log_text);
  cr_assert_eq(count_lines("was never destroyed"), 1, "log:\n%s", api_log_text);
  cr_assert_eq(count_lines("was still exposed"), 0, "released before the net went:\n%s", api_log_text);
  cr_assert_eq(count_lines("still mapped at close"), 0, "log:\n%s", api_log_text);
}

/* ------------------------------------------------------------------------ */
/* Blobs fuzzed: seeded random mutations and truncations of real blobs are
 * refused with UM_EINVAL, never reach UCX, never crash. */

static uint64_t fuzz_next(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

/* A mutated copy of blob[0..len) into out; returns its length (which may
 * be longer than len: bytes appended). Never the original itself. */
static size_t mutate(const unsigned char *blob, size_t len, unsigned char *out, uint64_t *seed) {
  size_t n = len;
  memcpy(out, blob, len);
  switch (fuzz_next(seed) % 5) {
  case 0: { /* flip one to three bits */
    int flips = 1 + (int)(fuzz_next(seed) % 3);
    size_t where[3];
    for (int i = 0; i < flips; i++) {
      where[i] = fuzz_next(seed) % (len * 8);
      for (int j = 0; j < i; j++)
        if (where[j] == where[i])
          where[i] = (where[i] + 1) % (len * 8);
      out[where[i] / 8] ^= (unsigned char)(1u << (where[i] % 8));
    }
    break;
  }
  case 1: { /* one byte to another value */
    size_t i = fuzz_next(seed) % len;
    out[i] = (unsigned char)(out[i] + 1 + fuzz_next(seed) % 255);
    break;
  }
  case 2: /* truncated */
    n = fuzz_next(seed) % len;
    break;
  case 3: { /* bytes appended */
    size_t extra = 1 + fuzz_next(seed) % 64;
    for (size_t i = 0; i < extra; i++)
      out[len + i] = (unsigned char)fuzz_next(seed);
    n = len + extra;
    break;
  }
  default: { /* a run of bytes overwritten with garbage */
    size_t at = fuzz_next(seed) % len, run = 1 + fuzz_next(seed) % 32;
    bool changed = false;
    for (size_t i = at; i < len && i < at + run; i++) {
      unsigned char v = (unsigned char)fuzz_next(seed);
      changed |= v != out[i];
      out[i] = v;
    }
    if (!changed)
      out[at] ^= 1;
    break;
  }
  }
  return n;
}

Test(net_fuzz, key_and_address_blobs) {
  enum { ROUNDS = 3000 };
  api_env e;
  unsigned char key[4096], addr[4096], bad[4096 + 64];
  size_t klen, alen = sizeof(addr);
  uint64_t seed = 0x9e3779b97f4a7c15ull;
  um_buffer *target, *src;
  um_endpoint *ep;
  api_open(&e);
  target = host_buffer(&e, 4096);
  src = host_buffer(&e, 4096);
  klen = expose(target, key, sizeof(key));
  cr_assert_eq(um_net_address(e.net, addr, &alen), UM_OK);
  for (int r = 0; r < ROUNDS; r++) {
    uint64_t s0 = seed;
    size_t n = mutate(key, klen, bad, &seed);
    int st = um_net_put(e.self, src, 0, bad, n, 0, 16, NULL);
    cr_assert_eq(st, UM_EINVAL, "round %d (seed %#llx): put with a mutated key blob answered %s", r,
                 (unsigned long long)s0, um_err_name(st));
    st = um_net_get(e.self, src, 0, bad, n, 0, 16, NULL);
    cr_assert_eq(st, UM_EINVAL, "round %d: get answered %s", r, um_err_name(st));
  }
  for (int r = 0; r < ROUNDS; r++) {
    uint64_t s0 = seed;
    size_t n = mutate(addr, alen, bad, &seed);
    int st = um_net_connect(e.net, bad, n, &ep);
    cr_assert_eq(st, UM_EINVAL, "round %d (seed %#llx): connect with a mutated address answered %s", r,
                 (unsigned long long)s0, um_err_name(st));
  }
  /* The real blobs still work after all that. */
  cr_assert_eq(um_net_put(e.self, src, 0, key, klen, 0, 16, NULL), UM_OK);
  cr_assert_eq(um_release(target), UM_OK);
  cr_assert_eq(um_release(src), UM_OK);
  api_close(&e);
}

/* ------------------------------------------------------------------------ */
/* Without UCX (CTest entry test_net_api_nolib: UNIMEM_UCX_LIBRARY names a
 * file that does not exist). */

Test(nolib, create_answers_enotsup) {
  const char *lib = getenv("UNIMEM_UCX_LIBRARY");
  um_options o;
  um_manager *m;
  um_net *n = NULL;
  um_buffer *b;
  unsigned char key[256];
  size_t len = sizeof(key);
  if (lib == NULL || access(lib, F_OK) == 0)
    cr_skip_test("runs with UNIMEM_UCX_LIBRARY set to a missing file (CTest test_net_api_nolib)");
  api_options(&o);
  cr_assert_eq(um_manager_create(&o, &m), UM_OK);
  cr_assert_eq(um_net_create(m, &n), UM_ENOTSUP);
  cr_assert_null(n);
  cr_assert(strstr(um_last_error(), "UCX") != NULL, "%s", um_last_error());
#ifdef UNIMEM_HAVE_UCX
  cr_assert(strstr(um_last_error(), lib) != NULL, "the reason names the library: %s", um_last_error());
#endif
  cr_assert_eq(um_net_create(m, &n), UM_ENOTSUP, "still, and no crash, the second time");
  /* Everything else of the library works. */
  cr_assert_eq(um_alloc(m, um_device_get(m, 0), 4096, UM_HOST, 0, &b), UM_OK);
  cr_assert_eq(um_net_expose(b, key, &len), UM_ESTATE);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}
