/* um_copy_batch on every profile's devices (profile.h; it was the OpenCL
 * test, whose one-device and two-device runs are the pocl and pocl2
 * profiles): mixed batches against a model (batch_model.h) over the first
 * and the last device of the profile, device, pinned and host buffers, in
 * every direction, with and without an event; and 1000 small copies each
 * way. On PoCL's "basic" device (pocl-basic) commands and their callbacks
 * run on the submitting thread. */
#include "batch_model.h"
#include "bytes.h"
#include "profile.h"

static void mixed(ut_env *e, uint64_t seed, bool with_event) {
  bm_model *bm = calloc(1, sizeof(*bm));
  um_device *last = e->dev_of[e->ndev - 1];
  uint64_t rng = seed;
  cr_assert_not_null(bm);
  bm->nslots = 6;
  bm->b[0] = ub_alloc(e->m, e->dev, BM_SLOT_BYTES, UM_DEVICE);
  bm->b[1] = ub_alloc(e->m, e->dev, BM_SLOT_BYTES, UM_DEVICE);
  bm->b[2] = ub_alloc(e->m, last, BM_SLOT_BYTES, UM_DEVICE);
  bm->b[3] = ub_alloc(e->m, last, BM_SLOT_BYTES, UM_DEVICE);
  bm->b[4] = ub_alloc(e->m, e->dev, BM_SLOT_BYTES, UM_PINNED);
  bm->b[5] = ub_alloc(e->m, um_device_get(e->m, 0), BM_SLOT_BYTES, UM_HOST);
  bm_init(bm, seed);
  bm_generate(bm, &rng, 160);
  if (with_event) {
    um_event *ev;
    cr_assert_eq(um_copy_batch(e->m, bm->ops, (size_t)bm->nops, &ev), UM_OK, "%s", um_last_error());
    ub_wait(ev, UM_OK);
  } else {
    cr_assert_eq(um_copy_batch(e->m, bm->ops, (size_t)bm->nops, NULL), UM_OK, "%s", um_last_error());
  }
  bm_check(bm, "mixed batch");
  for (int i = 0; i < bm->nslots; i++)
    cr_assert_eq(um_release(bm->b[i]), UM_OK);
  bm_free(bm);
  free(bm);
}

/* Copies that wait for another device's run or a host copy are started by
 * workers while this thread still queues runs: several threads submit
 * (on PoCL's basic device too: the backend's submit lock). */
Test(copy_batch, mixed_batches) {
  ut_env e = ut_profile_open(NULL);
  for (uint64_t seed = 1; seed <= 6; seed++)
    mixed(&e, seed, seed % 2 == 1);
  ut_profile_close(&e);
}

/* 1000 x 4 KiB into one buffer (the benchmark's batch) then read back in a
 * second batch of 1000: one run each, and the statistics count 1000 copies
 * each way. */
Test(copy_batch, thousand_small_copies) {
  ut_env e = ut_profile_open(NULL);
  const size_t seg = 4096, n = 1000;
  um_buffer *b = ub_alloc(e.m, e.dev_of[e.ndev - 1], seg * n, UM_DEVICE);
  unsigned char *src = ub_malloc(seg * n), *dst = calloc(1, seg * n);
  um_copy_op *ops = calloc(n, sizeof(*ops));
  um_stats before, after;
  cr_assert(dst != NULL && ops != NULL);
  ub_pattern(src, seg * n, 9);
  for (size_t k = 0; k < n; k++)
    ops[k] = (um_copy_op){.dst = b, .dst_off = k * seg, .host_src = src + k * seg, .bytes = seg};
  cr_assert_eq(um_stats_get(e.m, NULL, &before), UM_OK);
  cr_assert_eq(um_copy_batch(e.m, ops, n, NULL), UM_OK, "%s", um_last_error());
  for (size_t k = 0; k < n; k++)
    ops[k] = (um_copy_op){.host_dst = dst + (n - 1 - k) * seg, .src = b, .src_off = k * seg, .bytes = seg};
  cr_assert_eq(um_copy_batch(e.m, ops, n, NULL), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_stats_get(e.m, NULL, &after), UM_OK);
  for (size_t k = 0; k < n; k++)
    ub_assert_bytes(dst + (n - 1 - k) * seg, src + k * seg, seg, "segment %zu", k);
  cr_assert_eq(after.bytes_h2d - before.bytes_h2d, seg * n);
  cr_assert_eq(after.bytes_d2h - before.bytes_d2h, seg * n);
  cr_assert_eq(after.xfer_direct - before.xfer_direct, 2 * n);
  cr_assert_eq(um_release(b), UM_OK);
  free(src), free(dst), free(ops);
  ut_profile_close(&e);
}
