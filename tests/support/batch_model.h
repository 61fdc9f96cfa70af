/* Mixed batches against a model: a seeded generator of um_copy_batch ops
 * over a set of buffers (any devices and locations) in every direction
 * (host -> buffer, buffer -> host, buffer -> buffer on one device or two,
 * one buffer onto itself with overlapping ranges), with runs of
 * consecutive ops that go the same way. Each op is applied to a host
 * mirror of its buffers as it is generated, in batch order, which is what
 * the batch must produce: ops on one buffer take effect in their order in
 * the batch. Every op that writes host memory has host memory of its own
 * (ops on different buffers are not ordered with each other).
 *
 * Used by the batch tests on the fault backend and on OpenCL. */
#ifndef UNIMEM_TEST_BATCH_MODEL_H
#define UNIMEM_TEST_BATCH_MODEL_H

#include "test_util.h"

#define BM_MAX_SLOTS 8
#define BM_SLOT_BYTES (64u * 1024u)
#define BM_MAX_OPS 256
#define BM_OUT_BYTES (BM_MAX_OPS * 8u * 1024u)

typedef struct bm_model {
  int nslots;
  um_buffer *b[BM_MAX_SLOTS];
  unsigned char mirror[BM_MAX_SLOTS][BM_SLOT_BYTES];
  unsigned char host[BM_SLOT_BYTES]; /* every host source */
  unsigned char *out;                /* BM_OUT_BYTES: every host destination */
  unsigned char *out_want;
  size_t out_used;
  um_copy_op ops[BM_MAX_OPS];
  int nops;
} bm_model;

/* The buffers' first contents (through blocking copies) and the mirrors. */
static UT_UNUSED void bm_init(bm_model *bm, uint64_t seed) {
  bm->out = calloc(1, BM_OUT_BYTES);
  bm->out_want = calloc(1, BM_OUT_BYTES);
  cr_assert(bm->out != NULL && bm->out_want != NULL);
  bm->out_used = 0;
  bm->nops = 0;
  ut_pattern(bm->host, sizeof(bm->host), seed);
  for (int i = 0; i < bm->nslots; i++) {
    ut_pattern(bm->mirror[i], BM_SLOT_BYTES, seed * 31 + (uint64_t)i + 1);
    cr_assert_eq(um_copy_from_host(bm->b[i], 0, bm->mirror[i], BM_SLOT_BYTES, NULL), UM_OK, "%s",
                 um_last_error());
  }
}

static UT_UNUSED void bm_free(bm_model *bm) {
  free(bm->out);
  free(bm->out_want);
}

static UT_UNUSED int bm_slot_of(const bm_model *bm, const um_buffer *b) {
  for (int i = 0; i < bm->nslots; i++)
    if (bm->b[i] == b)
      return i;
  cr_assert_fail("a buffer outside the model");
  return -1;
}

/* Append op and apply it to the mirrors. */
static UT_UNUSED void bm_add(bm_model *bm, um_copy_op op) {
  unsigned char *src, *dst;
  cr_assert_lt(bm->nops, BM_MAX_OPS);
  src = op.src ? bm->mirror[bm_slot_of(bm, op.src)] + op.src_off : (unsigned char *)op.host_src;
  if (op.host_dst != NULL)
    dst = bm->out_want + ((unsigned char *)op.host_dst - bm->out);
  else
    dst = bm->mirror[bm_slot_of(bm, op.dst)] + op.dst_off;
  memmove(dst, src, op.bytes);
  bm->ops[bm->nops++] = op;
}

/* Host memory of its own for an op writing bytes to the host. */
static UT_UNUSED unsigned char *bm_out(bm_model *bm, size_t bytes) {
  unsigned char *p = bm->out + bm->out_used;
  cr_assert_leq(bm->out_used + bytes, BM_OUT_BYTES);
  bm->out_used += bytes;
  return p;
}

/* n random ops: a third of them in runs of up to 8 that go the same way. */
static UT_UNUSED void bm_generate(bm_model *bm, uint64_t *rng, int n) {
  while (bm->nops < n) {
    int kind = (int)ut_range(rng, 0, 3); /* 0 h2d, 1 d2h, 2 d2d */
    size_t bytes = ut_range(rng, 0, 1) ? 4096 : ut_range(rng, 1, 6000);
    int run = ut_range(rng, 0, 2) == 0 ? (int)ut_range(rng, 2, 8) : 1;
    um_buffer *a = bm->b[ut_range(rng, 0, (size_t)bm->nslots - 1)];
    um_buffer *c = bm->b[ut_range(rng, 0, (size_t)bm->nslots - 1)];
    for (int k = 0; k < run && bm->nops < n; k++) {
      um_copy_op op;
      memset(&op, 0, sizeof(op));
      op.bytes = bytes;
      if (kind == 0) {
        op.dst = a, op.dst_off = ut_range(rng, 0, BM_SLOT_BYTES - bytes);
        op.host_src = bm->host + ut_range(rng, 0, BM_SLOT_BYTES - bytes);
      } else if (kind == 1) {
        op.src = a, op.src_off = ut_range(rng, 0, BM_SLOT_BYTES - bytes);
        op.host_dst = bm_out(bm, bytes);
      } else {
        op.src = a, op.src_off = ut_range(rng, 0, BM_SLOT_BYTES - bytes);
        op.dst = c, op.dst_off = ut_range(rng, 0, BM_SLOT_BYTES - bytes);
      }
      bm_add(bm, op);
    }
  }
}

/* After the batch: every buffer as its mirror, every host output as the
 * model wrote it. */
static UT_UNUSED void bm_check(bm_model *bm, const char *where) {
  unsigned char *got = malloc(BM_SLOT_BYTES);
  cr_assert_not_null(got);
  for (int i = 0; i < bm->nslots; i++) {
    cr_assert_eq(um_copy_to_host(bm->b[i], 0, got, BM_SLOT_BYTES, NULL), UM_OK, "%s", um_last_error());
    for (size_t k = 0; k < BM_SLOT_BYTES; k++)
      if (got[k] != bm->mirror[i][k])
        cr_assert_fail("%s: buffer %d byte %zu is %u, the model says %u", where, i, k, got[k],
                       bm->mirror[i][k]);
  }
  for (size_t k = 0; k < bm->out_used; k++)
    if (bm->out[k] != bm->out_want[k])
      cr_assert_fail("%s: host output byte %zu is %u, the model says %u", where, k, bm->out[k],
                     bm->out_want[k]);
  free(got);
}

#endif /* UNIMEM_TEST_BATCH_MODEL_H */
