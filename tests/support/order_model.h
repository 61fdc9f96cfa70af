/* A model of mixed asynchronous operations on two buffers, for the
 * ordering tests (conformance/test_async.c on every profile,
 * backends/test_opencl_ordering.c on OpenCL's queues): writes, fills,
 * copies (within a buffer, between buffers and devices) and reads are
 * issued with events and applied to the model in the same order; at the
 * end the bytes of both buffers, and those every read saw, must equal the
 * model's. Public API only. */
#ifndef UNIMEM_TEST_ORDER_MODEL_H
#define UNIMEM_TEST_ORDER_MODEL_H

#include "bytes.h"

#define OM_BYTES (256u * 1024u + 77u) /* each buffer */
#define OM_MAX_OPS 64

typedef struct om_model {
  unsigned char *bytes[2]; /* the two buffers' expected contents */
  unsigned char *reads[OM_MAX_OPS];  /* what each read got */
  unsigned char *expect[OM_MAX_OPS]; /* and what it should have got */
  size_t read_len[OM_MAX_OPS];
  int nreads;
  unsigned char *sources[OM_MAX_OPS]; /* host sources of asynchronous writes */
  int nsources;
  um_event *ev[OM_MAX_OPS];
  int nev;
} om_model;

/* The model starts from zeros, and so do the buffers (a device buffer's
 * first bytes are whatever the driver left there). */
static UT_UNUSED void om_init(om_model *md, um_buffer *b0, um_buffer *b1) {
  memset(md, 0, sizeof(*md));
  for (int i = 0; i < 2; i++) {
    md->bytes[i] = ub_malloc(OM_BYTES);
    memset(md->bytes[i], 0, OM_BYTES);
  }
  cr_assert_eq(um_fill(b0, 0, 0, OM_BYTES, NULL), UM_OK);
  cr_assert_eq(um_fill(b1, 0, 0, OM_BYTES, NULL), UM_OK);
}

static UT_UNUSED void om_keep(om_model *md, um_event *e) {
  cr_assert_lt(md->nev, OM_MAX_OPS);
  md->ev[md->nev++] = e;
}

static UT_UNUSED void om_write(om_model *md, um_buffer *b, int which, size_t off, size_t len, unsigned seed) {
  unsigned char *src = ub_malloc(len); /* freed at the end: async source */
  um_event *e = NULL;
  ub_pattern(src, len, seed);
  memcpy(md->bytes[which] + off, src, len);
  cr_assert_eq(um_copy_from_host(b, off, src, len, &e), UM_OK, "%s", um_last_error());
  om_keep(md, e);
  cr_assert_lt(md->nsources, OM_MAX_OPS);
  md->sources[md->nsources++] = src;
}

static UT_UNUSED void om_fill(om_model *md, um_buffer *b, int which, size_t off, size_t len, int value) {
  um_event *e = NULL;
  memset(md->bytes[which] + off, value, len);
  cr_assert_eq(um_fill(b, off, value, len, &e), UM_OK, "%s", um_last_error());
  om_keep(md, e);
}

static UT_UNUSED void om_copy(om_model *md, um_buffer *dst, int dw, size_t doff, um_buffer *src, int sw, size_t soff,
                    size_t len) {
  um_event *e = NULL;
  memmove(md->bytes[dw] + doff, md->bytes[sw] + soff, len);
  cr_assert_eq(um_copy(dst, doff, src, soff, len, &e), UM_OK, "%s", um_last_error());
  om_keep(md, e);
}

static UT_UNUSED void om_read(om_model *md, um_buffer *b, int which, size_t off, size_t len) {
  unsigned char *dst = ub_malloc(len), *want = ub_malloc(len);
  um_event *e = NULL;
  memset(dst, 0xEE, len);
  memcpy(want, md->bytes[which] + off, len);
  cr_assert_eq(um_copy_to_host(b, off, dst, len, &e), UM_OK, "%s", um_last_error());
  om_keep(md, e);
  cr_assert_lt(md->nreads, OM_MAX_OPS);
  md->reads[md->nreads] = dst;
  md->expect[md->nreads] = want;
  md->read_len[md->nreads++] = len;
}

/* Wait for everything, then compare what every read saw (the model's
 * bytes at its place in the order) and both buffers. */
static UT_UNUSED void om_check(om_model *md, um_buffer *b0, um_buffer *b1) {
  for (int i = 0; i < md->nev; i++)
    ub_wait(md->ev[i], UM_OK);
  for (int i = 0; i < md->nreads; i++)
    ub_assert_bytes(md->reads[i], md->expect[i], md->read_len[i], "read %d", i);
  {
    unsigned char *got = ub_read_all(b0);
    ub_assert_bytes(got, md->bytes[0], OM_BYTES, "buffer 0 at the end");
    free(got);
  }
  if (b1 != NULL) {
    unsigned char *got = ub_read_all(b1);
    ub_assert_bytes(got, md->bytes[1], OM_BYTES, "buffer 1 at the end");
    free(got);
  }
}

static UT_UNUSED void om_free(om_model *md) {
  for (int i = 0; i < md->nreads; i++) {
    free(md->reads[i]);
    free(md->expect[i]);
  }
  for (int i = 0; i < md->nsources; i++)
    free(md->sources[i]);
  free(md->bytes[0]);
  free(md->bytes[1]);
}

/* om_check, om_free, and both buffers released. */
static UT_UNUSED void om_finish(om_model *md, um_buffer *b0, um_buffer *b1) {
  om_check(md, b0, b1);
  om_free(md);
  cr_assert_eq(um_release(b0), UM_OK);
  cr_assert_eq(um_release(b1), UM_OK);
}

#endif /* UNIMEM_TEST_ORDER_MODEL_H */
