/* Deliberately bad calls, one fault each, with the exact code SPEC section
 * 5 gives: UM_ERANGE for ranges outside a buffer, UM_EINVAL for NULL,
 * zero sizes and unknown enums, UM_ENOTSUP for a location a device lacks,
 * UM_EOVERFLOW, UM_ESTATE for mapped, read-only and released buffers. A
 * failed call leaves the manager as it was: sometimes checked field by
 * field on a quiet manager, always on the model's contents later. */
#include <stdio.h>
#include <string.h>

#include "model.h"

typedef struct bad_quiet {
  bool on;
  um_stats before[MDL_MAX_DEVS + 1];
} bad_quiet;

static void quiet_begin(mdl_ctx *c, bad_quiet *q) {
  q->on = c->sh == NULL && !c->no_block && c->cfg.opts.trim_interval_ms == 0 && mdl_pct(&c->rng, 25);
  if (!q->on)
    return;
  mdl_sync(c);
  for (int d = -1; d < c->ndevs; d++)
    q->before[d + 1] = mdl_stats(c, d);
}

#define MDL_FIELD_SAME_(type, name, desc)                                      \
  MDL_CHECK(c, a.name == b->name, "%s: a failed call changed stats." #name " (device %d) from %.17g to %.17g", \
            c->what, d, (double)b->name, (double)a.name);

static void quiet_end(mdl_ctx *c, bad_quiet *q) {
  if (!q->on)
    return;
  for (int d = -1; d < c->ndevs; d++) {
    um_stats a = mdl_stats(c, d);
    const um_stats *b = &q->before[d + 1];
    UM_STATS_FIELDS(MDL_FIELD_SAME_)
  }
}
#undef MDL_FIELD_SAME_

/* An offset and length that do not fit a buffer of size bytes. */
static void bad_range(mdl_ctx *c, size_t size, size_t *off, size_t *len) {
  switch (mdl_range(&c->rng, 0, 3)) {
  case 0: /* runs past the end, most often by one byte */
    *len = mdl_pick_len(c, size);
    *off = size - *len + (mdl_pct(&c->rng, 50) ? 1 : mdl_range(&c->rng, 1, 64));
    break;
  case 1: /* starts at or past the end */
    *off = size + mdl_range(&c->rng, 0, 4096);
    *len = mdl_range(&c->rng, 1, 64);
    break;
  case 2: /* longer than the buffer */
    *off = 0;
    *len = size + mdl_range(&c->rng, 1, 4096);
    break;
  default: /* off + len wraps around */
    *off = SIZE_MAX - mdl_range(&c->rng, 0, 16);
    *len = mdl_range(&c->rng, 18, 64);
    break;
  }
}

/* An offset at which len bytes do not fit a buffer of size bytes. */
static size_t bad_off(mdl_ctx *c, size_t size, size_t len) {
  switch (mdl_range(&c->rng, 0, 2)) {
  case 0: return len <= size ? size - len + (mdl_pct(&c->rng, 50) ? 1 : mdl_range(&c->rng, 1, 64))
                             : mdl_range(&c->rng, 0, 64);
  case 1: return size + mdl_range(&c->rng, 0, 4096);
  default: return SIZE_MAX - mdl_range(&c->rng, 0, 16);
  }
}

static void expect(mdl_ctx *c, int st, int want, const char *call) {
  snprintf(c->what + strlen(c->what), sizeof(c->what) - strlen(c->what), " [%s]", call);
  MDL_EXPECT_ST(c, st, want, call);
}

/* ------------------------------------------------------------------------ */
/* Ranges */

static bool bad_ranges(mdl_ctx *c) {
  mdl_buf *d = mdl_pick_buf(c, true, true), *s = mdl_pick_buf(c, false, true);
  um_event *e = NULL;
  void *p = NULL;
  size_t off, len;
  if (d == NULL || s == NULL)
    return false;
  snprintf(c->what, sizeof(c->what), "bad range on #%llu / #%llu", (unsigned long long)d->id,
           (unsigned long long)s->id);
  bad_range(c, d->size, &off, &len);
  expect(c, um_copy_from_host(d->h, off, c->scratch, len, &e), UM_ERANGE, "um_copy_from_host");
  expect(c, um_fill(d->h, off, 1, len, NULL), UM_ERANGE, "um_fill");
  len = mdl_pick_len(c, s->size);
  expect(c, um_copy(d->h, bad_off(c, d->size, len), s->h, 0, len, &e), UM_ERANGE, "um_copy (dst)");
  len = mdl_pick_len(c, d->size);
  expect(c, um_copy(d->h, 0, s->h, bad_off(c, s->size, len), len, NULL), UM_ERANGE, "um_copy (src)");
  bad_range(c, s->size, &off, &len);
  expect(c, um_copy_to_host(s->h, off, c->scratch, len, NULL), UM_ERANGE, "um_copy_to_host");
  if (!s->shared)
    expect(c, um_map(s->h, UM_MAP_READ, off, len, &p), UM_ERANGE, "um_map");
  MDL_CHECK(c, e == NULL && p == NULL, "a failed call wrote its out-parameter");
  return true;
}

/* ------------------------------------------------------------------------ */
/* Zero sizes, NULL, unknown enums, unsupported locations, overflow */

static bool bad_zero(mdl_ctx *c) {
  mdl_buf *d = mdl_pick_buf(c, true, true), *s = mdl_pick_buf(c, false, true);
  um_buffer *out = NULL;
  void *p = NULL;
  if (d == NULL || s == NULL)
    return false;
  snprintf(c->what, sizeof(c->what), "zero sizes");
  expect(c, um_copy_from_host(d->h, 0, c->scratch, 0, NULL), UM_EINVAL, "um_copy_from_host(0 bytes)");
  expect(c, um_copy_to_host(s->h, 0, c->scratch, 0, NULL), UM_EINVAL, "um_copy_to_host(0 bytes)");
  expect(c, um_copy(d->h, 0, s->h, 0, 0, NULL), UM_EINVAL, "um_copy(0 bytes)");
  expect(c, um_fill(d->h, 0, 0, 0, NULL), UM_EINVAL, "um_fill(0 bytes)");
  if (!s->shared)
    expect(c, um_map(s->h, UM_MAP_READ, 0, 0, &p), UM_EINVAL, "um_map(0 bytes)");
  expect(c, um_alloc(c->m, c->devs[0].d, 0, UM_HOST, 0, &out), UM_EINVAL, "um_alloc(0 bytes)");
  expect(c, um_alloc_array(c->m, c->devs[0].d, 0, 8, UM_HOST, 0, &out), UM_EINVAL, "um_alloc_array(0 items)");
  expect(c, um_wrap_host(c->m, c->scratch, 0, 0, &out), UM_EINVAL, "um_wrap_host(0 bytes)");
  MDL_CHECK(c, out == NULL && p == NULL, "a failed call wrote its out-parameter");
  return true;
}

static bool bad_null(mdl_ctx *c) {
  mdl_buf *b = mdl_pick_buf(c, true, true);
  um_buffer *out = NULL;
  um_stats s;
  void *p = NULL;
  if (b == NULL)
    return false;
  snprintf(c->what, sizeof(c->what), "NULL arguments");
  expect(c, um_copy_from_host(NULL, 0, c->scratch, 1, NULL), UM_EINVAL, "um_copy_from_host(NULL buffer)");
  expect(c, um_copy_from_host(b->h, 0, NULL, 1, NULL), UM_EINVAL, "um_copy_from_host(NULL source)");
  expect(c, um_copy_to_host(b->h, 0, NULL, 1, NULL), UM_EINVAL, "um_copy_to_host(NULL destination)");
  expect(c, um_copy_to_host(NULL, 0, c->scratch, 1, NULL), UM_EINVAL, "um_copy_to_host(NULL buffer)");
  expect(c, um_copy(NULL, 0, b->h, 0, 1, NULL), UM_EINVAL, "um_copy(NULL dst)");
  expect(c, um_copy(b->h, 0, NULL, 0, 1, NULL), UM_EINVAL, "um_copy(NULL src)");
  expect(c, um_fill(NULL, 0, 0, 1, NULL), UM_EINVAL, "um_fill(NULL)");
  expect(c, um_map(b->h, UM_MAP_READ, 0, 1, NULL), UM_EINVAL, "um_map(NULL out)");
  expect(c, um_map(NULL, UM_MAP_READ, 0, 1, &p), UM_EINVAL, "um_map(NULL buffer)");
  expect(c, um_unmap(NULL, c->scratch), UM_EINVAL, "um_unmap(NULL)");
  expect(c, um_release(NULL), UM_EINVAL, "um_release(NULL)");
  expect(c, um_wrap_host(c->m, NULL, 16, 0, &out), UM_EINVAL, "um_wrap_host(NULL memory)");
  expect(c, um_alloc(c->m, c->devs[0].d, 16, UM_HOST, 0, NULL), UM_EINVAL, "um_alloc(NULL out)");
  expect(c, um_alloc(NULL, c->devs[0].d, 16, UM_HOST, 0, &out), UM_EINVAL, "um_alloc(NULL manager)");
  expect(c, um_alloc(c->m, NULL, 16, UM_HOST, 0, &out), UM_EINVAL, "um_alloc(NULL device)");
  expect(c, um_event_wait(NULL), UM_EINVAL, "um_event_wait(NULL)");
  expect(c, um_event_query(NULL), UM_EINVAL, "um_event_query(NULL)");
  expect(c, um_event_cancel(NULL), UM_EINVAL, "um_event_cancel(NULL)");
  um_event_release(NULL);
  expect(c, um_stats_get(NULL, NULL, &s), UM_EINVAL, "um_stats_get(NULL manager)");
  expect(c, um_stats_get(c->m, NULL, NULL), UM_EINVAL, "um_stats_get(NULL out)");
  expect(c, um_pool_trim(NULL, 0), UM_EINVAL, "um_pool_trim(NULL)");
  expect(c, um_device_synchronize(NULL), UM_EINVAL, "um_device_synchronize(NULL)");
  MDL_CHECK(c, out == NULL && p == NULL, "a failed call wrote its out-parameter");
  return true;
}

static bool bad_enums(mdl_ctx *c) {
  int dev = (int)mdl_range(&c->rng, 0, (size_t)c->ndevs - 1);
  um_device *d = c->devs[dev].d;
  mdl_buf *b = mdl_pick_buf(c, false, true);
  um_buffer *out = NULL;
  void *p = NULL;
  snprintf(c->what, sizeof(c->what), "unknown enums on device %d", dev);
  expect(c, um_alloc(c->m, d, 64, (um_location)UM_LOCATION_COUNT, 0, &out), UM_EINVAL, "um_alloc(location 4)");
  expect(c, um_alloc(c->m, d, 64, (um_location)-1, 0, &out), UM_EINVAL, "um_alloc(location -1)");
  expect(c, um_alloc(c->m, d, 64, c->devs[dev].locs[0], 1u << 5, &out), UM_EINVAL, "um_alloc(unknown flag)");
  expect(c, um_wrap_host(c->m, c->scratch, 64, 1u << 4, &out), UM_EINVAL, "um_wrap_host(unknown flag)");
  expect(c, um_alloc_array(c->m, d, SIZE_MAX / 2 + 1, 2, c->devs[dev].locs[0], 0, &out), UM_EOVERFLOW,
         "um_alloc_array(overflow)");
  if (b != NULL && !b->shared)
    expect(c, um_map(b->h, (um_map_mode)4, 0, 1, &p), UM_EINVAL, "um_map(mode 4)");
  for (int l = 0; l < UM_LOCATION_COUNT; l++)
    if (!(c->devs[dev].info.locations & (1u << l)))
      expect(c, um_alloc(c->m, d, 64, (um_location)l, 0, &out), UM_ENOTSUP, "um_alloc(location not offered)");
  MDL_CHECK(c, out == NULL && p == NULL, "a failed call wrote its out-parameter");
  return true;
}

/* ------------------------------------------------------------------------ */
/* States: mapped, read-only, released */

static mdl_buf *pick_mapped(mdl_ctx *c) {
  for (int i = 0, start = (int)mdl_range(&c->rng, 0, MDL_MAX_BUFS - 1); i < MDL_MAX_BUFS; i++) {
    mdl_buf *b = &c->bufs[(start + i) % MDL_MAX_BUFS];
    if (b->live && b->mapped)
      return b;
  }
  return NULL;
}

/* A mapped buffer refuses operations, a second mapping, and an unmap with
 * another pointer (which leaves the mapping in place). */
static bool bad_mapped(mdl_ctx *c) {
  mdl_buf *b = pick_mapped(c), *o = mdl_pick_buf(c, true, true);
  um_event *e = NULL;
  void *p = NULL;
  if (b == NULL || o == NULL)
    return false;
  snprintf(c->what, sizeof(c->what), "mapped buffer #%llu", (unsigned long long)b->id);
  if (b->kind != MDL_WRAP_RO) {
    expect(c, um_copy_from_host(b->h, 0, c->scratch, 1, &e), UM_ESTATE, "um_copy_from_host into a mapped buffer");
    expect(c, um_fill(b->h, 0, 0, 1, NULL), UM_ESTATE, "um_fill of a mapped buffer");
    expect(c, um_copy(b->h, 0, o->h, 0, 1, NULL), UM_ESTATE, "um_copy into a mapped buffer");
  }
  expect(c, um_copy_to_host(b->h, 0, c->scratch, 1, &e), UM_ESTATE, "um_copy_to_host from a mapped buffer");
  expect(c, um_copy(o->h, 0, b->h, 0, 1, &e), UM_ESTATE, "um_copy from a mapped buffer");
  expect(c, um_map(b->h, UM_MAP_READ, 0, 1, &p), UM_ESTATE, "um_map of a mapped buffer");
  expect(c, um_unmap(b->h, b->map_ptr + 1), UM_EINVAL, "um_unmap with another pointer");
  MDL_CHECK(c, e == NULL && p == NULL, "a failed call wrote its out-parameter");
  return true;
}

static bool bad_unmapped(mdl_ctx *c) {
  mdl_buf *b = mdl_pick_buf(c, false, true);
  if (b == NULL || b->shared)
    return false;
  snprintf(c->what, sizeof(c->what), "unmap of unmapped #%llu", (unsigned long long)b->id);
  expect(c, um_unmap(b->h, c->scratch), UM_ESTATE, "um_unmap of a buffer that is not mapped");
  return true;
}

static bool bad_readonly(mdl_ctx *c) {
  mdl_buf *b = NULL, *o = mdl_pick_buf(c, false, true);
  void *p = NULL;
  for (int i = 0; i < MDL_MAX_BUFS && b == NULL; i++)
    if (c->bufs[i].live && c->bufs[i].kind == MDL_WRAP_RO && !c->bufs[i].mapped)
      b = &c->bufs[i];
  if (b == NULL || o == NULL)
    return false;
  snprintf(c->what, sizeof(c->what), "read-only wrap #%llu", (unsigned long long)b->id);
  expect(c, um_copy_from_host(b->h, 0, c->scratch, 1, NULL), UM_ESTATE, "um_copy_from_host into a read-only wrap");
  expect(c, um_copy(b->h, 0, o->h, 0, 1, NULL), UM_ESTATE, "um_copy into a read-only wrap");
  expect(c, um_fill(b->h, 0, 7, b->size, NULL), UM_ESTATE, "um_fill of a read-only wrap");
  expect(c, um_map(b->h, (um_map_mode)mdl_range(&c->rng, 1, 3), 0, b->size, &p), UM_ESTATE,
         "um_map of a read-only wrap for writing");
  MDL_CHECK(c, p == NULL, "a failed call wrote its out-parameter");
  return true;
}

/* A released handle that no live buffer has taken over answers UM_ESTATE
 * everywhere (handles are never freed while the manager lives). */
static bool bad_stale(mdl_ctx *c) {
  mdl_buf *o = mdl_pick_buf(c, true, true);
  um_buffer *h = NULL;
  void *p = NULL;
  for (int i = c->nstale - 1; i >= 0 && h == NULL; i--) {
    h = c->stale[i];
    for (int j = 0; j < MDL_MAX_BUFS; j++)
      if (c->bufs[j].live && c->bufs[j].h == h)
        h = NULL;
  }
  if (h == NULL || o == NULL)
    return false;
  snprintf(c->what, sizeof(c->what), "released handle %p", (void *)h);
  expect(c, um_copy_from_host(h, 0, c->scratch, 1, NULL), UM_ESTATE, "um_copy_from_host into a released buffer");
  expect(c, um_copy_to_host(h, 0, c->scratch, 1, NULL), UM_ESTATE, "um_copy_to_host from a released buffer");
  expect(c, um_copy(o->h, 0, h, 0, 1, NULL), UM_ESTATE, "um_copy from a released buffer");
  expect(c, um_copy(h, 0, o->h, 0, 1, NULL), UM_ESTATE, "um_copy into a released buffer");
  expect(c, um_fill(h, 0, 0, 1, NULL), UM_ESTATE, "um_fill of a released buffer");
  expect(c, um_map(h, UM_MAP_READ, 0, 1, &p), UM_ESTATE, "um_map of a released buffer");
  expect(c, um_unmap(h, c->scratch), UM_ESTATE, "um_unmap of a released buffer");
  expect(c, um_release(h), UM_ESTATE, "um_release of a released buffer");
  MDL_CHECK(c, um_buffer_size(h) == 0 && um_buffer_device(h) == NULL && um_buffer_host_ptr(h) == NULL &&
                   um_buffer_valid(h) == 0,
            "the getters of a released buffer answer as if it were live");
  MDL_CHECK(c, p == NULL, "a failed call wrote its out-parameter");
  return true;
}

/* ------------------------------------------------------------------------ */
/* Batches: every op is checked before any is issued. */

static int spoil_batch_op(mdl_ctx *c, um_copy_op *o) {
  mdl_buf *ro = NULL, *mapped = pick_mapped(c);
  for (int i = 0; i < MDL_MAX_BUFS && ro == NULL; i++)
    if (c->bufs[i].live && c->bufs[i].kind == MDL_WRAP_RO)
      ro = &c->bufs[i];
  switch (mdl_range(&c->rng, 0, 6)) {
  case 0: o->bytes = 0; return UM_EINVAL;
  case 1: /* two sources (a host source op always has a buffer destination) */
    if (o->src == NULL)
      o->src = o->dst;
    o->host_src = c->scratch;
    return UM_EINVAL;
  case 2: o->dst = NULL, o->host_dst = NULL; return UM_EINVAL;
  case 3: /* host to host */
    o->dst = o->src = NULL;
    o->host_dst = c->scratch, o->host_src = c->scratch + 1;
    return UM_EINVAL;
  case 4: /* range */
    if (o->dst != NULL) {
      o->dst_off = um_buffer_size(o->dst);
      return UM_ERANGE;
    }
    o->src_off = um_buffer_size(o->src) - o->bytes + 1;
    return UM_ERANGE;
  case 5:
    if (ro == NULL)
      break;
    o->dst = ro->h, o->host_dst = NULL, o->dst_off = 0, o->bytes = 1;
    return UM_ESTATE;
  default:
    if (mapped == NULL)
      break;
    o->src = mapped->h, o->host_src = NULL, o->src_off = 0, o->bytes = 1;
    return UM_ESTATE;
  }
  o->bytes = 0;
  return UM_EINVAL;
}

static bool bad_batch(mdl_ctx *c) {
  um_copy_op ops[MDL_MAX_BATCH];
  mdl_op *mops[MDL_MAX_BATCH];
  um_event *e = NULL;
  int n = mdl_batch_fill(c, ops, mops, (int)mdl_range(&c->rng, 1, MDL_MAX_BATCH)), k, want;
  if (n == 0)
    return false;
  for (int i = 0; i < n; i++)
    mdl_op_not_issued(c, mops[i]);
  k = (int)mdl_range(&c->rng, 0, (size_t)n - 1);
  want = spoil_batch_op(c, &ops[k]);
  snprintf(c->what, sizeof(c->what), "um_copy_batch with op %d of %d spoiled", k, n);
  expect(c, um_copy_batch(c->m, ops, (size_t)n, mdl_pct(&c->rng, 50) ? NULL : &e), want, "um_copy_batch");
  expect(c, um_copy_batch(c->m, ops, 0, &e), UM_EINVAL, "um_copy_batch(0 ops)");
  expect(c, um_copy_batch(c->m, NULL, 1, &e), UM_EINVAL, "um_copy_batch(NULL ops)");
  expect(c, um_copy_batch(NULL, ops, 1, &e), UM_EINVAL, "um_copy_batch(NULL manager)");
  MDL_CHECK(c, e == NULL, "a failed um_copy_batch wrote its event");
  return true;
}

/* ------------------------------------------------------------------------ */

void mdl_step_bad(mdl_ctx *c) {
  static bool (*const cases[])(mdl_ctx *) = {bad_ranges, bad_zero,     bad_null,  bad_enums, bad_mapped,
                                             bad_unmapped, bad_readonly, bad_stale, bad_batch};
  const int ncases = (int)(sizeof(cases) / sizeof(cases[0]));
  bad_quiet q;
  quiet_begin(c, &q);
  for (int tries = 0; tries < 4; tries++)
    if (cases[mdl_range(&c->rng, 0, (size_t)ncases - 1)](c))
      break;
  quiet_end(c, &q);
}
