/* Valid operations: each issues one call (or a few) against the library,
 * records it in the model, and checks what can be checked at once. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"

#define KiB ((size_t)1024)
#define MiB ((size_t)1024 * 1024)

/* Lengths from 1 byte to the largest buffer, most of them small, with the
 * sizes around the library's thresholds (256 KiB: inline host copies; the
 * staging chunk) well represented. */
size_t mdl_pick_len(mdl_ctx *c, size_t max) {
  size_t r = mdl_range(&c->rng, 0, 99), hi;
  if (r < 30)
    hi = 64;
  else if (r < 55)
    hi = 16 * KiB;
  else if (r < 80)
    hi = 320 * KiB;
  else if (r < 95)
    hi = 3 * MiB / 2;
  else
    hi = c->cfg.max_size;
  if (hi > max)
    hi = max;
  return mdl_range(&c->rng, hi > 64 && r >= 30 ? hi / 8 : 1, hi);
}

/* ------------------------------------------------------------------------ */
/* Host areas */

static mdl_event *event_of(mdl_ctx *c, const mdl_op *op) {
  for (int i = 0; i < c->nevents; i++)
    for (int j = 0; j < c->events[i].nops; j++)
      if (c->events[i].ops[j] == op)
        return &c->events[i];
  return NULL;
}

/* Finish one operation that keeps a area busy: wait for its event, or
 * issue a blocking one-byte read on one of its buffers (ordered after it),
 * or, when neither exists any more, synchronize. */
static void finish_op(mdl_ctx *c, mdl_op *op) {
  mdl_event *ev = event_of(c, op);
  mdl_buf *b = mdl_buf_by_id(c, op->src_id);
  unsigned char byte;
  if (b == NULL || b->mapped)
    b = mdl_buf_by_id(c, op->dst_id);
  if (ev != NULL) {
    mdl_event_wait(c, ev);
  } else if (b != NULL && !b->mapped) {
    MDL_EXPECT_ST(c, um_copy_to_host(b->h, 0, &byte, 1, NULL), UM_OK, "um_copy_to_host (1-byte fence)");
    mdl_fence_data(c, b->id);
  } else {
    mdl_sync(c);
  }
}

bool mdl_area_ready(mdl_ctx *c, mdl_area *a, bool for_write) {
  while (mdl_area_busy(c, a, for_write)) {
    mdl_op *busy = NULL;
    if (c->no_block)
      return false;
    for (int i = 0; i < MDL_MAX_OPS && busy == NULL; i++) {
      mdl_op *p = &c->ops[i];
      if (p->used && p->area == a && !p->data_done && (for_write || p->kind == MDL_B2H))
        busy = p;
    }
    finish_op(c, busy);
  }
  return true;
}

mdl_area *mdl_pick_area(mdl_ctx *c, bool for_write) {
  int n = c->cfg.nareas, start = (int)mdl_range(&c->rng, 0, (size_t)n - 1);
  for (int i = 0; i < n; i++) {
    mdl_area *a = &c->areas[(start + i) % n];
    if (!mdl_area_busy(c, a, for_write))
      return a;
  }
  if (c->no_block)
    return NULL;
  mdl_area_ready(c, &c->areas[start], for_write);
  return &c->areas[start];
}

void mdl_step_refresh_area(mdl_ctx *c) {
  mdl_area *a = mdl_pick_area(c, true);
  size_t len, off;
  if (a == NULL)
    return;
  mdl_resolve_all(c);
  len = mdl_pick_len(c, a->cap);
  off = mdl_range(&c->rng, 0, a->cap - len);
  mdl_fill_random(&c->rng, a->data + off, len);
  memcpy(a->mem + off, a->data + off, len);
  memset(a->known + off, 1, len);
}

/* ------------------------------------------------------------------------ */
/* Issuing */

void mdl_issued_status(mdl_ctx *c, mdl_op **ops, int nops, int st, bool blocking, bool candidate,
                       const char *call) {
  if (st != UM_OK)
    for (int i = 0; i < nops; i++)
      mdl_op_not_issued(c, ops[i]);
  MDL_EXPECT_ST(c, st, UM_OK, call);
  for (int i = 0; i < nops; i++) {
    mdl_buf *dst = ops[i]->dst;
    mdl_op_issued(c, ops[i], candidate && !blocking);
    /* A destination with no host view now has its data on the device only. */
    if (dst != NULL && !dst->host_view)
      dst->valid = UM_VALID_DEVICE;
  }
  if (blocking) {
    for (int i = 0; i < nops; i++)
      mdl_mark_event_done(c, ops[i]);
  }
}

/* Blocking, or asynchronous with an event (a candidate for cancel or not);
 * inside a gated burst nothing blocks. */
static bool pick_blocking(mdl_ctx *c) { return !c->no_block && c->post_to < 0 && mdl_pct(&c->rng, 35); }

static bool pick_candidate(mdl_ctx *c, bool blocking) {
  return !blocking && c->post_to < 0 && mdl_pct(&c->rng, c->no_block ? 60 : 30);
}

/* After a single operation was issued: record its event, and after a
 * blocking one, sometimes read the destination back at once. */
static void single_done(mdl_ctx *c, mdl_op *op, int st, um_event *e, bool blocking, bool candidate,
                        const char *call) {
  mdl_buf *dst = op->dst;
  size_t off = op->dst_off, len = op->bytes;
  mdl_issued_status(c, &op, 1, st, blocking, candidate, call);
  if (!blocking) {
    if (c->post_to < 0 || !mdl_mail_post(c, e))
      mdl_event_add(c, e, &op, 1, false);
  } else if (dst != NULL && dst->live && !dst->mapped && mdl_pct(&c->rng, 50)) {
    mdl_verify_range(c, dst, off, len);
  }
}

static void pick_range(mdl_ctx *c, size_t size, size_t max_len, size_t *off, size_t *len) {
  *len = mdl_pick_len(c, size < max_len ? size : max_len);
  *off = mdl_range(&c->rng, 0, size - *len);
}

void mdl_step_copy_from_host(mdl_ctx *c) {
  mdl_buf *b = mdl_pick_buf(c, true, true);
  mdl_area *a = mdl_pick_area(c, false);
  size_t off, len, hoff;
  bool blocking = pick_blocking(c), candidate = pick_candidate(c, blocking);
  um_event *e = NULL;
  mdl_op *op;
  int st;
  if (b == NULL || a == NULL)
    return;
  pick_range(c, b->size, a->cap, &off, &len);
  hoff = mdl_range(&c->rng, 0, a->cap - len);
  snprintf(c->what, sizeof(c->what), "um_copy_from_host(#%llu, %zu, area+%zu, %zu, %s)",
           (unsigned long long)b->id, off, hoff, len, blocking ? "blocking" : "event");
  op = mdl_op_new(c, MDL_H2B);
  op->dst = b, op->area = a, op->dst_off = off, op->src_off = hoff, op->bytes = len;
  st = um_copy_from_host(b->h, off, a->mem + hoff, len, blocking ? NULL : &e);
  single_done(c, op, st, e, blocking, candidate, "um_copy_from_host");
}

void mdl_step_copy_to_host(mdl_ctx *c) {
  mdl_buf *b = mdl_pick_buf(c, false, true);
  mdl_area *a = mdl_pick_area(c, true);
  size_t off, len, hoff;
  bool blocking = pick_blocking(c), candidate = pick_candidate(c, blocking);
  um_event *e = NULL;
  mdl_op *op;
  int st;
  if (b == NULL || a == NULL)
    return;
  pick_range(c, b->size, a->cap, &off, &len);
  hoff = mdl_range(&c->rng, 0, a->cap - len);
  snprintf(c->what, sizeof(c->what), "um_copy_to_host(#%llu, %zu, area+%zu, %zu, %s)",
           (unsigned long long)b->id, off, hoff, len, blocking ? "blocking" : "event");
  op = mdl_op_new(c, MDL_B2H);
  op->src = b, op->area = a, op->src_off = off, op->dst_off = hoff, op->bytes = len;
  st = um_copy_to_host(b->h, off, a->mem + hoff, len, blocking ? NULL : &e);
  single_done(c, op, st, e, blocking, candidate, "um_copy_to_host");
  if (blocking && mdl_pct(&c->rng, 50))
    mdl_verify_area(c, a);
}

/* um_copy: within one buffer (overlapping ranges are likely), between two
 * buffers of a device, or across devices. */
void mdl_step_copy(mdl_ctx *c) {
  mdl_buf *d = mdl_pick_buf(c, true, true), *s;
  size_t len, doff, soff, max;
  bool blocking = pick_blocking(c), candidate = pick_candidate(c, blocking);
  um_event *e = NULL;
  mdl_op *op;
  int st;
  if (d == NULL)
    return;
  s = mdl_pct(&c->rng, 25) ? d : mdl_pick_buf(c, false, true);
  max = d->size < s->size ? d->size : s->size;
  len = mdl_pick_len(c, max);
  if (s == d && mdl_pct(&c->rng, 50) && len < max) {
    /* overlapping on purpose: the two ranges a few bytes apart */
    size_t shift = mdl_range(&c->rng, 1, (max - len) < 97 ? max - len : 97);
    doff = mdl_range(&c->rng, 0, max - len - shift);
    soff = doff + shift;
    if (mdl_pct(&c->rng, 50)) {
      size_t t = doff;
      doff = soff, soff = t;
    }
  } else {
    doff = mdl_range(&c->rng, 0, d->size - len);
    soff = mdl_range(&c->rng, 0, s->size - len);
  }
  snprintf(c->what, sizeof(c->what), "um_copy(#%llu+%zu <- #%llu+%zu, %zu, %s)", (unsigned long long)d->id,
           doff, (unsigned long long)s->id, soff, len, blocking ? "blocking" : "event");
  op = mdl_op_new(c, MDL_B2B);
  op->dst = d, op->src = s, op->dst_off = doff, op->src_off = soff, op->bytes = len;
  st = um_copy(d->h, doff, s->h, soff, len, blocking ? NULL : &e);
  single_done(c, op, st, e, blocking, candidate, "um_copy");
}

void mdl_step_fill(mdl_ctx *c) {
  mdl_buf *b = mdl_pick_buf(c, true, true);
  size_t off, len;
  bool blocking = pick_blocking(c), candidate = pick_candidate(c, blocking);
  unsigned char value = (unsigned char)mdl_rand(&c->rng);
  int arg = value;
  um_event *e = NULL;
  mdl_op *op;
  int st;
  if (b == NULL)
    return;
  if (mdl_pct(&c->rng, 20))
    arg = (int)value - 256 * (int)mdl_range(&c->rng, 0, 3); /* only the low byte counts */
  pick_range(c, b->size, b->size, &off, &len);
  snprintf(c->what, sizeof(c->what), "um_fill(#%llu, %zu, %d, %zu, %s)", (unsigned long long)b->id, off,
           arg, len, blocking ? "blocking" : "event");
  op = mdl_op_new(c, MDL_FILL);
  op->dst = b, op->dst_off = off, op->bytes = len, op->value = value;
  st = um_fill(b->h, off, arg, len, blocking ? NULL : &e);
  single_done(c, op, st, e, blocking, candidate, "um_fill");
}

/* ------------------------------------------------------------------------ */
/* Synchronize: everything issued has finished. */

void mdl_sync(mdl_ctx *c) {
  int dev = (int)mdl_range(&c->rng, 0, (size_t)c->ndevs - 1);
  MDL_CHECK(c, !c->no_block, "synchronize inside a gated burst");
  MDL_EXPECT_ST(c, um_device_synchronize(c->devs[dev].d), UM_OK, "um_device_synchronize");
  mdl_fence_all(c);
  mdl_resolve_all(c);
  mdl_check_wraps_gone(c, true);
  mdl_ops_collect(c);
  if (c->sh == NULL)
    mdl_check_stats_quiet(c, c->counts, c->ndevs);
}

void mdl_step_verify(mdl_ctx *c) {
  if (c->no_block)
    return;
  if (mdl_pct(&c->rng, 25)) {
    mdl_area *a = &c->areas[mdl_range(&c->rng, 0, (size_t)c->cfg.nareas - 1)];
    mdl_area_ready(c, a, false);
    mdl_verify_area(c, a);
  } else {
    mdl_buf *b = mdl_pick_buf(c, false, true);
    size_t off, len;
    if (b == NULL)
      return;
    pick_range(c, b->size, b->size, &off, &len);
    snprintf(c->what, sizeof(c->what), "verify #%llu [%zu, +%zu)", (unsigned long long)b->id, off, len);
    mdl_verify_range(c, b, off, len);
  }
}

/* ------------------------------------------------------------------------ */
/* Batches: mixed host-to-buffer, buffer-to-host and buffer-to-buffer
 * copies. The library orders them per buffer only, so within one batch a
 * host area is written by at most one member and then read by none. */

typedef struct batch_build {
  um_copy_op ops[MDL_MAX_BATCH];
  mdl_op *mops[MDL_MAX_BATCH];
  int n;
  mdl_area *written[MDL_MAX_BATCH], *read[MDL_MAX_BATCH];
  int nwritten, nread;
} batch_build;

static bool area_taken(const batch_build *bb, const mdl_area *a, bool for_write) {
  for (int i = 0; i < bb->nwritten; i++)
    if (bb->written[i] == a)
      return true;
  for (int i = 0; for_write && i < bb->nread; i++)
    if (bb->read[i] == a)
      return true;
  return false;
}

static mdl_area *batch_area(mdl_ctx *c, batch_build *bb, bool for_write) {
  int n = c->cfg.nareas, start = (int)mdl_range(&c->rng, 0, (size_t)n - 1);
  mdl_area *fallback = NULL;
  for (int i = 0; i < n; i++) {
    mdl_area *a = &c->areas[(start + i) % n];
    if (area_taken(bb, a, for_write))
      continue;
    if (!mdl_area_busy(c, a, for_write))
      return a;
    if (fallback == NULL)
      fallback = a;
  }
  if (fallback == NULL || !mdl_area_ready(c, fallback, for_write))
    return NULL;
  return fallback;
}

static bool batch_member(mdl_ctx *c, batch_build *bb) {
  int kind = (int)mdl_range(&c->rng, 0, 2);
  um_copy_op *o = &bb->ops[bb->n];
  mdl_buf *d = kind != 1 ? mdl_pick_buf(c, true, true) : NULL;
  mdl_buf *s = kind != 0 ? mdl_pick_buf(c, false, true) : NULL;
  mdl_area *a = kind == 2 ? NULL : batch_area(c, bb, kind == 1);
  size_t max = 1u << 20, len;
  mdl_op *op;
  if ((kind != 1 && d == NULL) || (kind != 0 && s == NULL) || (kind != 2 && a == NULL))
    return false;
  max = d && d->size < max ? d->size : max;
  max = s && s->size < max ? s->size : max;
  max = a && a->cap < max ? a->cap : max;
  len = mdl_pick_len(c, max);
  op = mdl_op_new(c, kind == 0 ? MDL_H2B : kind == 1 ? MDL_B2H : MDL_B2B);
  memset(o, 0, sizeof(*o));
  op->dst = d, op->src = s, op->area = a, op->bytes = o->bytes = len;
  op->dst_off = o->dst_off = mdl_range(&c->rng, 0, (d ? d->size : a->cap) - len);
  op->src_off = o->src_off = mdl_range(&c->rng, 0, (s ? s->size : a->cap) - len);
  o->dst = d ? d->h : NULL;
  o->src = s ? s->h : NULL;
  o->host_dst = d ? NULL : a->mem + o->dst_off;
  o->host_src = s ? NULL : a->mem + o->src_off;
  if (kind == 0)
    bb->read[bb->nread++] = a;
  else if (kind == 1)
    bb->written[bb->nwritten++] = a;
  bb->mops[bb->n++] = op;
  return true;
}

int mdl_batch_fill(mdl_ctx *c, um_copy_op *ops, mdl_op **mops, int want) {
  batch_build bb;
  memset(&bb, 0, sizeof(bb));
  for (int i = 0; i < want; i++)
    if (!batch_member(c, &bb))
      break;
  memcpy(ops, bb.ops, (size_t)bb.n * sizeof(ops[0]));
  memcpy(mops, bb.mops, (size_t)bb.n * sizeof(mops[0]));
  return bb.n;
}

void mdl_step_batch(mdl_ctx *c) {
  batch_build bb;
  bool blocking = pick_blocking(c);
  um_event *e = NULL;
  int st;
  memset(&bb, 0, sizeof(bb));
  bb.n = mdl_batch_fill(c, bb.ops, bb.mops, (int)mdl_range(&c->rng, 1, MDL_MAX_BATCH));
  if (bb.n == 0)
    return;
  snprintf(c->what, sizeof(c->what), "um_copy_batch(%d ops, %s)", bb.n, blocking ? "blocking" : "event");
  st = um_copy_batch(c->m, bb.ops, (size_t)bb.n, blocking ? NULL : &e);
  mdl_issued_status(c, bb.mops, bb.n, st, blocking, false, "um_copy_batch");
  if (!blocking) {
    mdl_event_add(c, e, bb.mops, bb.n, true);
    return;
  }
  if (mdl_pct(&c->rng, 50)) {
    int i = (int)mdl_range(&c->rng, 0, (size_t)bb.n - 1);
    mdl_buf *d = NULL;
    for (int j = 0; j < MDL_MAX_BUFS; j++)
      if (c->bufs[j].live && c->bufs[j].h == bb.ops[i].dst)
        d = &c->bufs[j];
    if (d != NULL)
      mdl_verify_range(c, d, bb.ops[i].dst_off, bb.ops[i].bytes);
    else if (bb.ops[i].dst == NULL)
      mdl_verify_area(c, bb.mops[i]->area);
  }
}

/* ------------------------------------------------------------------------ */
/* Trim: with nothing running, exactly the idle bytes above keep go, oldest
 * first, and the figures say so. */

/* In debug mode um_pool_trim also gives back the blocks of quarantined
 * buffers (src/trim.c): idle memory that is not pooled, so it moves
 * bytes_reserved and device_frees but not the trim figures. */
static void check_trim(mdl_ctx *c, const um_stats *b, const um_stats *a, uint64_t keep) {
  uint64_t freed = b->bytes_pooled - a->bytes_pooled;
  bool quarantine = c->cfg.opts.debug != 0;
  /* With segments, free bytes that share a segment (or, where memory is
   * given back page by page, a granule) with a live block stay held. */
  uint64_t unreturnable = c->cfg.opts.segments ? a->bytes_segment_free : 0;
  MDL_CHECK(c, a->bytes_pooled - unreturnable <= keep,
            "after um_pool_trim(%llu): bytes_pooled %llu (was %llu)", (unsigned long long)keep,
            (unsigned long long)a->bytes_pooled, (unsigned long long)b->bytes_pooled);
  /* Debug mode with segments: quarantined blocks go back to their segments,
   * whose free bytes count as pooled; what else holds is checked above. */
  if (quarantine && c->cfg.opts.segments) {
    MDL_CHECK(c, a->bytes_reserved <= b->bytes_reserved, "trim raised bytes_reserved from %llu to %llu",
              (unsigned long long)b->bytes_reserved, (unsigned long long)a->bytes_reserved);
    return;
  }
  MDL_CHECK(c, a->bytes_pooled <= b->bytes_pooled, "after um_pool_trim(%llu): bytes_pooled %llu (was %llu)",
            (unsigned long long)keep, (unsigned long long)a->bytes_pooled, (unsigned long long)b->bytes_pooled);
  MDL_CHECK(c, a->bytes_trimmed - b->bytes_trimmed == freed, "trim freed %llu idle bytes but bytes_trimmed moved by %llu",
            (unsigned long long)freed, (unsigned long long)(a->bytes_trimmed - b->bytes_trimmed));
  MDL_CHECK(c, quarantine ? b->bytes_reserved - a->bytes_reserved >= freed
                          : b->bytes_reserved - a->bytes_reserved == freed,
            "trim freed %llu idle bytes but bytes_reserved moved by %lld", (unsigned long long)freed,
            (long long)(b->bytes_reserved - a->bytes_reserved));
  /* A trim is a block or a segment back to its device, or (segments) the
   * memory inside free extents given back, which frees nothing. With
   * segments a virtual one that holds no memory (its free memory given back
   * earlier) goes back as a trim of no bytes: address space only. */
  MDL_CHECK(c, (quarantine                ? a->device_frees - b->device_frees >= a->trims - b->trims
                : c->cfg.opts.segments ? a->device_frees - b->device_frees <= a->trims - b->trims
                                       : a->device_frees - b->device_frees == a->trims - b->trims) &&
                   (freed != 0 ? a->trims != b->trims : c->cfg.opts.segments || a->trims == b->trims),
            "trim: trims moved by %llu, device_frees by %llu, %llu bytes freed (pooled %llu -> %llu, reserved "
            "%llu -> %llu, segment free %llu -> %llu)",
            (unsigned long long)(a->trims - b->trims), (unsigned long long)(a->device_frees - b->device_frees),
            (unsigned long long)freed, (unsigned long long)b->bytes_pooled, (unsigned long long)a->bytes_pooled,
            (unsigned long long)b->bytes_reserved, (unsigned long long)a->bytes_reserved,
            (unsigned long long)b->bytes_segment_free, (unsigned long long)a->bytes_segment_free);
  MDL_CHECK(c, a->bytes_in_use == b->bytes_in_use && a->active_buffers == b->active_buffers,
            "trim changed the live buffers' figures");
}

void mdl_step_trim(mdl_ctx *c) {
  size_t r = mdl_range(&c->rng, 0, 9);
  uint64_t keep = r < 4 ? 0 : r < 8 ? mdl_range(&c->rng, 1, 4u << 20) : UINT64_MAX;
  bool quiet = c->sh == NULL && !c->no_block && c->cfg.opts.trim_interval_ms == 0 && mdl_pct(&c->rng, 50);
  um_stats before, after;
  snprintf(c->what, sizeof(c->what), "um_pool_trim(%llu)%s", (unsigned long long)keep, quiet ? " quiet" : "");
  if (quiet) {
    mdl_sync(c);
    before = mdl_stats(c, -1);
  }
  MDL_EXPECT_ST(c, um_pool_trim(c->m, keep), UM_OK, "um_pool_trim");
  if (!quiet)
    return;
  after = mdl_stats(c, -1);
  check_trim(c, &before, &after, keep);
  if (keep == 0) /* segments: what shares a granule with a live block stays */
    MDL_CHECK(c, after.largest_pooled_block <= (c->cfg.opts.segments ? after.bytes_segment_free : 0),
              "largest_pooled_block %llu after trimming everything", (unsigned long long)after.largest_pooled_block);
}
