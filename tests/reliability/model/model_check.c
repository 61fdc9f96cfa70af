/* Checks against the model: buffer and host-area contents, the getters,
 * and the statistics invariants. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"

/* No real figure comes near this: a counter above it wrapped around. */
#define ABSURD ((uint64_t)1 << 50)

/* ------------------------------------------------------------------------ */
/* Contents */

void mdl_compare(mdl_ctx *c, const char *what, const unsigned char *got, const unsigned char *want,
                 const unsigned char *known, size_t n, size_t base) {
  c->checks++;
  if (memcmp(got, want, n) == 0)
    return;
  for (size_t i = 0; i < n; i++)
    if (known[i] && got[i] != want[i]) {
      size_t run = 1;
      while (i + run < n && known[i + run] && got[i + run] != want[i + run])
        run++;
      mdl_fail_at(c, __FILE__, __LINE__,
                  "%s: byte %zu of [%zu, +%zu) is 0x%02x, the model says 0x%02x (%zu wrong bytes from there)",
                  what, base + i, base, n, got[i], want[i], run);
    }
}

static void describe(const mdl_ctx *c, const mdl_buf *b, char *out, size_t cap) {
  static const char *const locs[] = {"host", "device", "pinned", "unified"};
  static const char *const kinds[] = {"alloc", "wrap", "ro-wrap"};
  snprintf(out, cap, "buffer #%llu (%s, %zu bytes, dev %d %s, %s)", (unsigned long long)b->id,
           kinds[b->kind], b->size, b->dev, c->devs[b->dev].info.backend, locs[b->loc]);
}

static void expect_valid_after_read_map(mdl_buf *b) {
  if (b->map_style == MDL_MAP_SHADOW)
    b->valid |= UM_VALID_HOST;
  else if (b->map_style == MDL_MAP_NATIVE)
    b->valid = UM_VALID_HOST | UM_VALID_DEVICE;
}

/* Verify through a read-only mapping of [off, off + len). */
static void verify_by_map(mdl_ctx *c, mdl_buf *b, size_t off, size_t len, const char *what) {
  void *p = NULL;
  MDL_EXPECT_ST(c, um_map(b->h, UM_MAP_READ, off, len, &p), UM_OK, "um_map(READ) to verify");
  mdl_fence_buffer(c, b->id);
  expect_valid_after_read_map(b);
  if (b->host_view)
    MDL_CHECK(c, p == (unsigned char *)um_buffer_host_ptr(b->h) + off,
              "%s: the mapping of a buffer with a host view is not its host view", what);
  MDL_CHECK(c, um_buffer_valid(b->h) == b->valid, "%s: um_buffer_valid is %u while mapped, expected %u",
            what, um_buffer_valid(b->h), b->valid);
  mdl_compare(c, what, p, b->data + off, b->known + off, len, off);
  MDL_EXPECT_ST(c, um_unmap(b->h, p), UM_OK, "um_unmap after verifying");
  if (b->map_style == MDL_MAP_NATIVE)
    b->valid = UM_VALID_DEVICE;
}

void mdl_verify_range(mdl_ctx *c, mdl_buf *b, size_t off, size_t len) {
  char what[200];
  int how = (int)mdl_range(&c->rng, 0, 2);
  MDL_CHECK(c, b->live && !b->mapped && !c->no_block, "verify_range precondition");
  mdl_resolve_all(c);
  describe(c, b, what, sizeof(what));
  if (b->shared)
    how = 0; /* other threads use it: a mapping would collide with none, but keep it simple */
  if (how == 1) {
    verify_by_map(c, b, off, len, what);
  } else if (how == 2 && b->host_view) {
    /* A one-byte mapping waits for every operation on b; then the host
     * view is read directly. */
    void *p = NULL;
    MDL_EXPECT_ST(c, um_map(b->h, UM_MAP_READ, 0, 1, &p), UM_OK, "um_map(READ, 1 byte)");
    MDL_EXPECT_ST(c, um_unmap(b->h, p), UM_OK, "um_unmap");
    mdl_fence_buffer(c, b->id);
    mdl_compare(c, what, (unsigned char *)um_buffer_host_ptr(b->h) + off, b->data + off, b->known + off,
                len, off);
  } else {
    MDL_EXPECT_ST(c, um_copy_to_host(b->h, off, c->scratch, len, NULL), UM_OK,
                  "um_copy_to_host (blocking) to verify");
    mdl_fence_data(c, b->id);
    mdl_compare(c, what, c->scratch, b->data + off, b->known + off, len, off);
  }
  mdl_check_getters(c, b);
}

void mdl_verify_buf(mdl_ctx *c, mdl_buf *b) { mdl_verify_range(c, b, 0, b->size); }

void mdl_verify_area(mdl_ctx *c, mdl_area *a) {
  char what[64];
  mdl_resolve_all(c);
  MDL_CHECK(c, !mdl_area_busy(c, a, false), "verify_area: an operation still writes the area");
  snprintf(what, sizeof(what), "host area %d", (int)(a - c->areas));
  mdl_compare(c, what, a->mem, a->data, a->known, a->cap, 0);
}

void mdl_check_getters(mdl_ctx *c, mdl_buf *b) {
  char what[200];
  um_buffer *h = b->h;
  void *hp = um_buffer_host_ptr(h);
  describe(c, b, what, sizeof(what));
  MDL_CHECK(c, um_buffer_size(h) == b->size, "%s: um_buffer_size says %zu", what, um_buffer_size(h));
  MDL_CHECK(c, um_buffer_device(h) == c->devs[b->dev].d, "%s: um_buffer_device is another device", what);
  MDL_CHECK(c, um_buffer_location(h) == b->loc, "%s: um_buffer_location says %d", what,
            (int)um_buffer_location(h));
  if (b->kind != MDL_ALLOC)
    MDL_CHECK(c, hp == b->wrap_mem, "%s: the host view of a wrap is not the wrapped memory", what);
  else
    MDL_CHECK(c, (hp != NULL) == b->host_view, "%s: um_buffer_host_ptr is %p", what, hp);
  MDL_CHECK(c, um_buffer_valid(h) == b->valid, "%s: um_buffer_valid is %u, expected %u", what,
            um_buffer_valid(h), b->valid);
}

/* Released wraps: the library must leave their memory alone once
 * um_release returned (SPEC section 5: the owner may free it then). */
void mdl_check_wraps_gone(mdl_ctx *c, bool free_them) {
  for (int i = 0; i < c->ngone; i++) {
    mdl_wrap_gone *g = &c->gone[i];
    for (size_t j = 0; j < g->size; j++)
      MDL_CHECK(c, g->mem[j] == MDL_POISON,
                "wrap #%llu: byte %zu of its memory changed to 0x%02x after um_release returned",
                (unsigned long long)g->id, j, g->mem[j]);
    if (free_them)
      free(g->mem);
  }
  if (free_them)
    c->ngone = 0;
}

/* ------------------------------------------------------------------------ */
/* Statistics */

um_stats mdl_stats(mdl_ctx *c, int dev) {
  um_stats s;
  MDL_EXPECT_ST(c, um_stats_get(c->m, dev < 0 ? NULL : c->devs[dev].d, &s), UM_OK, "um_stats_get");
  return s;
}

/* Figures that cannot be wrong at any moment, whatever runs meanwhile. */
static void check_sane(mdl_ctx *c, const um_stats *s, const char *where) {
  MDL_CHECK(c, s->bytes_pooled < ABSURD, "%s: bytes_pooled is %llu (wrapped around)", where,
            (unsigned long long)s->bytes_pooled);
  MDL_CHECK(c, s->bytes_reserved < ABSURD, "%s: bytes_reserved is %llu (wrapped around)", where,
            (unsigned long long)s->bytes_reserved);
  MDL_CHECK(c, s->bytes_in_use < ABSURD, "%s: bytes_in_use is %llu (wrapped around)", where,
            (unsigned long long)s->bytes_in_use);
  MDL_CHECK(c, s->active_buffers < ABSURD, "%s: active_buffers is %llu (wrapped around)", where,
            (unsigned long long)s->active_buffers);
  MDL_CHECK(c, s->allocations - s->releases == s->active_buffers,
            "%s: allocations %llu - releases %llu != active_buffers %llu", where,
            (unsigned long long)s->allocations, (unsigned long long)s->releases,
            (unsigned long long)s->active_buffers);
  MDL_CHECK(c, s->hit_rate >= 0.0 && s->hit_rate <= 1.0, "%s: hit_rate %g", where, s->hit_rate);
  MDL_CHECK(c, s->fragmentation >= 0.0 && s->fragmentation <= 1.0, "%s: fragmentation %g", where,
            s->fragmentation);
  MDL_CHECK(c, s->peak_bytes_in_use >= s->bytes_in_use, "%s: peak %llu below bytes_in_use %llu", where,
            (unsigned long long)s->peak_bytes_in_use, (unsigned long long)s->bytes_in_use);
}

/* What this program's own calls decide exactly (one thread issues them). */
static void check_counted(mdl_ctx *c, const um_stats *s, const mdl_counts *k, const char *where) {
  double want_rate;
  MDL_CHECK(c, s->active_buffers == k->live, "%s: active_buffers %llu, the model has %llu live", where,
            (unsigned long long)s->active_buffers, (unsigned long long)k->live);
  MDL_CHECK(c, s->bytes_in_use == k->in_use, "%s: bytes_in_use %llu, the model says %llu", where,
            (unsigned long long)s->bytes_in_use, (unsigned long long)k->in_use);
  MDL_CHECK(c, s->allocations == k->allocations, "%s: allocations %llu, the model made %llu", where,
            (unsigned long long)s->allocations, (unsigned long long)k->allocations);
  MDL_CHECK(c, s->releases == k->releases, "%s: releases %llu, the model made %llu", where,
            (unsigned long long)s->releases, (unsigned long long)k->releases);
  MDL_CHECK(c, s->pool_hits + s->pool_misses == k->pooled_requests,
            "%s: pool_hits %llu + pool_misses %llu, the model asked the pool %llu times", where,
            (unsigned long long)s->pool_hits, (unsigned long long)s->pool_misses,
            (unsigned long long)k->pooled_requests);
  want_rate = k->pooled_requests ? (double)s->pool_hits / (double)k->pooled_requests : 0.0;
  MDL_CHECK(c, s->hit_rate == want_rate, "%s: hit_rate %.17g, hits/requests is %.17g", where, s->hit_rate,
            want_rate);
  MDL_CHECK(c, s->bytes_reserved >= s->bytes_pooled + k->capacity_live,
            "%s: bytes_reserved %llu < bytes_pooled %llu + live blocks %llu", where,
            (unsigned long long)s->bytes_reserved, (unsigned long long)s->bytes_pooled,
            (unsigned long long)k->capacity_live);
}

static void where_dev(char *out, size_t cap, int dev) {
  if (dev < 0)
    snprintf(out, cap, "stats (total)");
  else
    snprintf(out, cap, "stats (device %d)", dev);
}

void mdl_check_stats(mdl_ctx *c) {
  char where[64];
  mdl_counts total;
  um_stats t = mdl_stats(c, -1);
  memset(&total, 0, sizeof(total));
  check_sane(c, &t, "stats (total)");
  if (c->sh != NULL)
    return; /* other threads move the figures meanwhile */
  for (int d = 0; d < c->ndevs; d++) {
    um_stats s = mdl_stats(c, d);
    const mdl_counts *k = &c->counts[d];
    where_dev(where, sizeof(where), d);
    check_sane(c, &s, where);
    check_counted(c, &s, k, where);
    if (c->cfg.exact_peak)
      MDL_CHECK(c, s.peak_bytes_in_use == k->peak, "%s: peak_bytes_in_use %llu, the model's peak is %llu",
                where, (unsigned long long)s.peak_bytes_in_use, (unsigned long long)k->peak);
    total.live += k->live, total.in_use += k->in_use, total.allocations += k->allocations;
    total.releases += k->releases, total.pooled_requests += k->pooled_requests;
    total.capacity_live += k->capacity_live;
  }
  check_counted(c, &t, &total, "stats (total)");
  if (c->cfg.exact_peak)
    MDL_CHECK(c, t.peak_bytes_in_use == c->peak_total, "stats (total): peak_bytes_in_use %llu, the model's peak is %llu",
              (unsigned long long)t.peak_bytes_in_use, (unsigned long long)c->peak_total);
}

/* ------------------------------------------------------------------------ */
/* Statistics when nothing runs: after um_device_synchronize, every
 * operation and every deferred release has finished. */

/* Fields that are sums over the devices. The pool's figures move on the
 * trim timer's thread, so they are compared only when it is off. */
#define MDL_SUMMED_FIELDS(XX)                                                  \
  XX(active_buffers) XX(bytes_in_use) XX(allocations) XX(releases)             \
  XX(pool_hits) XX(pool_misses) XX(device_allocs) XX(oom_retries)              \
  XX(bytes_h2d) XX(bytes_d2h) XX(bytes_d2d) XX(bytes_peer) XX(xfer_local)      \
  XX(xfer_peer) XX(xfer_direct) XX(xfer_pipelined) XX(xfer_staged) XX(fills)
#define MDL_POOL_FIELDS(XX)                                                    \
  XX(bytes_reserved) XX(bytes_pooled) XX(device_frees) XX(trims) XX(bytes_trimmed)

/* The largest idle block comes from the bins and the pooled bytes from a
 * counter: read at two moments, they agree only when the trim timer is
 * not moving blocks meanwhile. */
static void check_pool_shape(mdl_ctx *c, const um_stats *s, const char *where) {
  double frag = s->bytes_pooled ? 1.0 - (double)s->largest_pooled_block / (double)s->bytes_pooled : 0.0;
  if (s->fragmentation == 0.0 && s->bytes_pooled != 0 && s->largest_pooled_block > s->bytes_pooled)
    frag = 0.0; /* um_stats_get clamps the one case a moving block can cause */
  MDL_CHECK(c, fabs(s->fragmentation - frag) < 1e-12, "%s: fragmentation %.17g, 1 - largest/pooled is %.17g",
            where, s->fragmentation, frag);
  if (c->cfg.opts.trim_interval_ms != 0)
    return;
  MDL_CHECK(c, s->largest_pooled_block <= s->bytes_pooled, "%s: largest_pooled_block %llu > bytes_pooled %llu",
            where, (unsigned long long)s->largest_pooled_block, (unsigned long long)s->bytes_pooled);
  MDL_CHECK(c, (s->bytes_pooled == 0) == (s->largest_pooled_block == 0),
            "%s: bytes_pooled %llu but largest_pooled_block %llu", where,
            (unsigned long long)s->bytes_pooled, (unsigned long long)s->largest_pooled_block);
}

/* Blocks held beyond the pool and the live buffers: none on the cpu
 * device; pinned staging chunks (transfer.c) on the others. */
static void check_reserved_rest(mdl_ctx *c, int d, const um_stats *s, const mdl_counts *k,
                                const char *where) {
  uint64_t rest = s->bytes_reserved - s->bytes_pooled - k->capacity_live;
  uint64_t chunk = c->cfg.opts.staging_chunk_bytes;
  if (c->cfg.opts.debug || c->cfg.opts.trim_interval_ms != 0)
    return; /* quarantined blocks, or a timer trimming between the reads */
  if (c->devs[d].kind == MDL_CPU)
    MDL_CHECK(c, rest == 0, "%s: bytes_reserved %llu, but the pool holds %llu and live buffers %llu", where,
              (unsigned long long)s->bytes_reserved, (unsigned long long)s->bytes_pooled,
              (unsigned long long)k->capacity_live);
  else
    MDL_CHECK(c, rest % chunk == 0 && rest <= 8 * chunk,
              "%s: %llu reserved bytes are neither pooled, live nor staging chunks of %llu", where,
              (unsigned long long)rest, (unsigned long long)chunk);
}

static void check_device_quiet(mdl_ctx *c, int d, const um_stats *s, const mdl_counts *k) {
  char where[64];
  where_dev(where, sizeof(where), d);
  check_sane(c, s, where);
  check_counted(c, s, k, where);
  check_pool_shape(c, s, where);
  check_reserved_rest(c, d, s, k, where);
  MDL_CHECK(c, s->fills == k->fills, "%s: fills %llu, the model ran %llu", where, (unsigned long long)s->fills,
            (unsigned long long)k->fills);
  /* Every live block is a device allocation of its own, or carved from a
   * segment that is one. */
  MDL_CHECK(c, s->device_allocs - s->device_frees >= (c->cfg.opts.segments ? s->segments : k->blocks_live),
            "%s: device_allocs %llu - device_frees %llu < %llu live %s", where,
            (unsigned long long)s->device_allocs, (unsigned long long)s->device_frees,
            (unsigned long long)(c->cfg.opts.segments ? s->segments : k->blocks_live),
            c->cfg.opts.segments ? "segments" : "blocks");
}

void mdl_check_stats_quiet(mdl_ctx *c, const mdl_counts *counts, int ndevs) {
  um_stats t = mdl_stats(c, -1), sum;
  mdl_counts total;
  uint64_t largest = 0;
  bool timer = c->cfg.opts.trim_interval_ms != 0;
  memset(&sum, 0, sizeof(sum));
  memset(&total, 0, sizeof(total));
  for (int d = 0; d < ndevs; d++) {
    um_stats s = mdl_stats(c, d);
    const mdl_counts *k = &counts[d];
    check_device_quiet(c, d, &s, k);
#define ADD_(f) sum.f += s.f;
    MDL_SUMMED_FIELDS(ADD_)
    MDL_POOL_FIELDS(ADD_)
#undef ADD_
    if (s.largest_pooled_block > largest)
      largest = s.largest_pooled_block;
    total.live += k->live, total.in_use += k->in_use, total.allocations += k->allocations;
    total.releases += k->releases, total.pooled_requests += k->pooled_requests;
    total.capacity_live += k->capacity_live;
  }
#define SAME_(f)                                                               \
  MDL_CHECK(c, t.f == sum.f, "stats: total " #f " %llu, the devices' sum %llu", (unsigned long long)t.f, \
            (unsigned long long)sum.f);
  MDL_SUMMED_FIELDS(SAME_)
  if (!timer) {
    MDL_POOL_FIELDS(SAME_)
    MDL_CHECK(c, t.largest_pooled_block == largest, "stats: total largest_pooled_block %llu, the devices' %llu",
              (unsigned long long)t.largest_pooled_block, (unsigned long long)largest);
  }
#undef SAME_
  check_sane(c, &t, "stats (total)");
  check_counted(c, &t, &total, "stats (total)");
  check_pool_shape(c, &t, "stats (total)");
}
