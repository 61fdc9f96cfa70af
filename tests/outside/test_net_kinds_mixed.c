/* um_net_put and um_net_get over a loopback endpoint (a net connected to
 * itself), interleaved with every other kind of operation on the same
 * local buffers (kinds_mixed.h): a net transfer's event object is reused
 * by copies, fills, brackets and batches, and theirs by net transfers. The
 * exposed target is memory of um_net_alloc (or a HOST buffer), unexposed
 * and exposed again now and then (a revoked key answers UM_ESTATE). Run
 * once per UCX transport on the cpu profile; UNIMEM_OUTSIDE_PROFILE=pocl
 * (or pocl2, fakecuda) by hand puts device buffers on the local side. */
#include "kinds_mixed.h"

#define KN_TARGET 65536u

static bool kn_open(km_env *e, km_net *n, bool net_alloc) {
  um_options o;
  uint8_t addr[4096];
  size_t alen = sizeof(addr);
  int st;
  km_options(&o);
  o.net_timeout_ms = 20000;
  km_open(e, &o);
  memset(n, 0, sizeof(*n));
  st = um_net_create(e->m, &n->net);
  if (st == UM_ENOTSUP) {
    um_manager_destroy(e->m);
    return false;
  }
  cr_assert_eq(st, UM_OK, "um_net_create: %s", um_last_error());
  cr_assert_eq(um_net_address(n->net, addr, &alen), UM_OK);
  cr_assert_eq(um_net_connect(n->net, addr, alen, &n->ep), UM_OK, "%s", um_last_error());
  n->tlen = KN_TARGET;
  if (net_alloc)
    st = um_net_alloc(n->net, n->tlen, UM_ALLOC_ZERO, &n->t);
  else
    st = um_alloc(e->m, e->dev[0].d, n->tlen, UM_HOST, UM_ALLOC_ZERO, &n->t);
  cr_assert_eq(st, UM_OK, "target: %s", um_last_error());
  n->tmodel = calloc(1, n->tlen);
  cr_assert_not_null(n->tmodel);
  n->klen = sizeof(n->key);
  cr_assert_eq(um_net_expose(n->t, n->key, &n->klen), UM_OK, "%s", um_last_error());
  n->exposed = true;
  return true;
}

static void kn_close(km_env *e, km_net *n) {
  cr_assert_eq(um_endpoint_close(n->ep), UM_OK);
  cr_assert_eq(um_release(n->t), UM_OK);
  cr_assert_eq(um_net_destroy(n->net), UM_OK, "%s", um_last_error());
  free(n->tmodel);
  cr_assert_eq(um_manager_destroy(e->m), UM_OK, "um_manager_destroy: %s", um_last_error());
}

static void kn_single(bool net_alloc, long steps, uint64_t seed) {
  km_env e;
  km_net n;
  km_worker *w;
  if (!kn_open(&e, &n, net_alloc))
    cr_skip_test("no UCX: %s", um_last_error());
  w = km_worker_new(&e, 0, steps, seed, false);
  w->net = &n;
  cr_assert(km_standard_views(w, 1), "%s", w->fail);
  km_run_workers(&w, 1, 240000);
  km_worker_free(w);
  kn_close(&e, &n);
}

Test(net_kinds_mixed, one_worker_net_alloc_target, .timeout = 300) { kn_single(true, 1500, 0x5eed0040); }
Test(net_kinds_mixed, one_worker_host_target, .timeout = 300) { kn_single(false, 1000, 0x5eed0041); }

/* Two threads on buffers of their own; the first also puts and gets. */
Test(net_kinds_mixed, two_threads_one_of_them_on_the_net, .timeout = 300) {
  km_env e;
  km_net n;
  km_worker *w[2];
  if (!kn_open(&e, &n, true))
    cr_skip_test("no UCX: %s", um_last_error());
  for (int i = 0; i < 2; i++) {
    w[i] = km_worker_new(&e, i, 800, 0x5eed0042, true);
    cr_assert(km_standard_views(w[i], 1), "%s", w[i]->fail);
  }
  w[0]->net = &n;
  km_run_workers(w, 2, 240000);
  for (int i = 0; i < 2; i++)
    km_worker_free(w[i]);
  kn_close(&e, &n);
}
