/* Extents of segments (src/mem/extents.h): exact extents after known
 * sequences of requests and releases (split, merge, best fit and its
 * ties, a whole segment given back), out of memory with free but
 * fragmented extents, and a long random sequence checked after every step
 * against a model: the extents of each segment tile it in address order,
 * no two free ones touch, the counters add up, and every request got the
 * best fit. */
#include <stdlib.h>
#include <string.h>

#include "test_util.h"
#include "extents.h"

static um__extent *take(um__extents *x, size_t bytes, size_t want_off, size_t want_size) {
  um__extent *e = um__ext_alloc(x, bytes);
  cr_assert_not_null(e, "request of %zu bytes refused", bytes);
  cr_assert(!e->free);
  cr_assert_eq(e->off, want_off, "request of %zu: offset %zu, expected %zu", bytes, e->off, want_off);
  cr_assert_eq(e->size, want_size, "request of %zu: size %zu, expected %zu", bytes, e->size, want_size);
  return e;
}

/* Every extent of used[0..n) free again: each segment is one free extent,
 * given back; then the map goes. */
static void drain(um__extents *x, um__extent **used, int n, size_t nsegments) {
  for (int i = 0; i < n; i++)
    um__ext_free(x, used[i]);
  cr_assert_eq(x->nfree, nsegments, "every segment one free extent again");
  for (unsigned b = 0; b < UM__EXT_BINS; b++)
    while (x->bins[b] != NULL) {
      cr_assert(um__ext_whole_free(x->bins[b]));
      um__ext_remove_segment(x, x->bins[b]);
    }
  cr_assert_eq(x->nsegments, 0);
  cr_assert_eq(x->free_bytes, 0);
  um__ext_destroy(x);
}

Test(extents, split_then_merge_back_to_one_segment) {
  um__extents x;
  um__extent *a, *b, *c, *w;
  um__ext_init(&x, 256);
  cr_assert_not_null(um__ext_add_segment(&x, 1, 4096, NULL));
  cr_assert_eq(x.free_bytes, 4096);
  cr_assert_eq(x.nfree, 1);
  a = take(&x, 1000, 0, 1024); /* rounded up to the alignment */
  cr_assert_eq(x.free_bytes, 3072);
  cr_assert_eq(x.nfree, 1);
  b = take(&x, 256, 1024, 256);
  c = take(&x, 2816, 1280, 2816); /* exactly the rest: no split */
  cr_assert_eq(x.free_bytes, 0);
  cr_assert_eq(x.nfree, 0);
  cr_assert_null(um__ext_alloc(&x, 1), "a full segment");
  cr_assert_eq(a->next, b);
  cr_assert_eq(b->prev, a);
  cr_assert_eq(b->next, c);
  cr_assert_null(c->next);
  w = um__ext_free(&x, b); /* both neighbours used: no merge */
  cr_assert_eq(w, b);
  cr_assert(w->free && !um__ext_whole_free(w));
  cr_assert_eq(x.nfree, 1);
  w = um__ext_free(&x, a); /* merges with b */
  cr_assert_eq(w->off, 0);
  cr_assert_eq(w->size, 1280);
  cr_assert_eq(x.nfree, 1);
  cr_assert_eq(x.free_bytes, 1280);
  cr_assert_eq(um__ext_largest_free(&x), 1280);
  w = um__ext_free(&x, c); /* merges with the rest: the whole segment */
  cr_assert_eq(w->off, 0);
  cr_assert_eq(w->size, 4096);
  cr_assert(um__ext_whole_free(w));
  cr_assert_eq(x.nfree, 1);
  cr_assert_eq(x.free_bytes, 4096);
  um__ext_remove_segment(&x, w);
  cr_assert_eq(x.nsegments, 0);
  cr_assert_eq(x.nfree, 0);
  cr_assert_eq(x.free_bytes, 0);
  cr_assert_eq(um__ext_largest_free(&x), 0);
  cr_assert_null(um__ext_alloc(&x, 256), "no segment");
  um__ext_destroy(&x);
}

Test(extents, the_smallest_free_extent_that_fits) {
  um__extents x;
  um__extent *b, *c, *d;
  um__extent *u[16];
  int n = 0;
  um__ext_init(&x, 256);
  cr_assert_not_null(um__ext_add_segment(&x, 1, 8192, NULL));
  u[n++] = take(&x, 1024, 0, 1024);
  b = take(&x, 512, 1024, 512);
  u[n++] = take(&x, 256, 1536, 256);
  c = take(&x, 2048, 1792, 2048);
  u[n++] = take(&x, 256, 3840, 256);
  d = take(&x, 768, 4096, 768);
  u[n++] = take(&x, 256, 4864, 256); /* free after it: 3072 at 5120 */
  um__ext_free(&x, b);
  um__ext_free(&x, c);
  um__ext_free(&x, d);
  cr_assert_eq(x.nfree, 4);
  cr_assert_eq(x.free_bytes, 512 + 2048 + 768 + 3072);
  u[n++] = take(&x, 600, 4096, 768);   /* 768 fits exactly: not the 2048 or the 3072 */
  u[n++] = take(&x, 300, 1024, 512);   /* the 512 */
  u[n++] = take(&x, 1000, 1792, 1024); /* the 2048, split */
  cr_assert_eq(x.nfree, 2);
  cr_assert_eq(um__ext_largest_free(&x), 3072);
  u[n++] = take(&x, 1024, 2816, 1024); /* the 2048's rest (1024) before the 3072 */
  u[n++] = take(&x, 2000, 5120, 2048);
  cr_assert_eq(x.nfree, 1);
  cr_assert_eq(x.free_bytes, 1024);
  drain(&x, u, n, 1);
}

Test(extents, ties_go_to_the_lower_segment_then_the_lower_offset) {
  um__extents x;
  um__extent *e[3];
  um__ext_init(&x, 64);
  cr_assert_not_null(um__ext_add_segment(&x, 7, 1024, NULL));
  cr_assert_not_null(um__ext_add_segment(&x, 3, 1024, NULL));
  e[0] = take(&x, 64, 0, 64);
  cr_assert_eq(e[0]->seg, 3, "segment 3 before 7");
  /* Now segment 3 has 960 free at 64, segment 7 1024 at 0: the smaller. */
  e[1] = take(&x, 900, 64, 960);
  cr_assert_eq(e[1]->seg, 3);
  e[2] = take(&x, 128, 0, 128);
  cr_assert_eq(e[2]->seg, 7);
  cr_assert_eq(x.nsegments, 2);
  drain(&x, e, 3, 2);
}

Test(extents, out_of_memory_with_free_but_fragmented_extents) {
  um__extents x;
  um__extent *e[4];
  um__ext_init(&x, 1024);
  cr_assert_not_null(um__ext_add_segment(&x, 1, 4096, NULL));
  for (int i = 0; i < 4; i++)
    e[i] = take(&x, 1024, (size_t)i * 1024, 1024);
  um__ext_free(&x, e[0]);
  um__ext_free(&x, e[2]);
  cr_assert_eq(x.free_bytes, 2048);
  cr_assert_eq(um__ext_largest_free(&x), 1024);
  cr_assert_null(um__ext_alloc(&x, 2048), "2048 free in two extents of 1024: no extent fits");
  cr_assert_null(um__ext_alloc(&x, 1025), "rounded to 2048");
  cr_assert_eq(x.free_bytes, 2048, "a refused request changes nothing");
  cr_assert_eq(x.nfree, 2);
  cr_assert_null(um__ext_alloc(&x, 0));
  cr_assert_null(um__ext_alloc(&x, SIZE_MAX), "no overflow in the rounding");
  e[0] = take(&x, 1, 0, 1024);
  e[2] = e[3]; /* e[2] is free already */
  drain(&x, e, 3, 1);
}

/* ---- the random sequence against a model ---------------------------- */

#define SEGS 3
#define LIVE 64

typedef struct model {
  um__extents x;
  um__extent *live[LIVE];
  int nlive;
  size_t seg_size[SEGS];
} model;

static int by_seg_off(const void *a, const void *b) {
  const um__extent *p = *(um__extent *const *)a, *q = *(um__extent *const *)b;
  if (p->seg != q->seg)
    return p->seg < q->seg ? -1 : 1;
  return p->off < q->off ? -1 : p->off > q->off;
}

/* Every node, free (from the bins) and used (live), in (seg, off) order. */
static int all_extents(const model *md, um__extent **out) {
  int n = 0;
  for (unsigned b = 0; b < UM__EXT_BINS; b++) {
    cr_assert_eq((md->x.nonempty[b / 64] >> (b % 64)) & 1, md->x.bins[b] != NULL, "bitmap of bin %u", b);
    for (um__extent *e = md->x.bins[b]; e != NULL; e = e->fnext) {
      cr_assert(e->free && e->bin == b);
      out[n++] = e;
    }
  }
  for (int i = 0; i < md->nlive; i++)
    out[n++] = md->live[i];
  qsort(out, (size_t)n, sizeof(out[0]), by_seg_off);
  return n;
}

static void check(const model *md) {
  um__extent *all[2 * LIVE + 4 * SEGS];
  int n = all_extents(md, all);
  size_t free_bytes = 0, nfree = 0, largest = 0;
  for (int i = 0; i < n; i++) {
    um__extent *e = all[i];
    bool first = i == 0 || all[i - 1]->seg != e->seg, last = i == n - 1 || all[i + 1]->seg != e->seg;
    cr_assert_eq(e->off % md->x.align, 0);
    cr_assert_eq(e->size % md->x.align, 0);
    cr_assert_gt(e->size, 0);
    if (first) {
      cr_assert_eq(e->off, 0, "segment %llu starts at 0", (unsigned long long)e->seg);
      cr_assert_null(e->prev);
    } else {
      cr_assert_eq(e->prev, all[i - 1]);
      cr_assert_eq(all[i - 1]->off + all[i - 1]->size, e->off, "no gap, no overlap");
      cr_assert(!(e->free && all[i - 1]->free), "two free extents touch at %zu", e->off);
    }
    if (last) {
      cr_assert_null(e->next);
      cr_assert_eq(e->off + e->size, md->seg_size[e->seg], "segment %llu ends at its size",
                   (unsigned long long)e->seg);
    } else {
      cr_assert_eq(e->next, all[i + 1]);
    }
    if (e->free) {
      free_bytes += e->size;
      nfree++;
      if (e->size > largest)
        largest = e->size;
    }
  }
  cr_assert_eq(md->x.free_bytes, free_bytes);
  cr_assert_eq(md->x.nfree, nfree);
  cr_assert_eq(um__ext_largest_free(&md->x), largest);
}

/* What the model says a request of bytes must get: the best free extent. */
static const um__extent *expected_fit(const model *md, size_t bytes) {
  um__extent *all[2 * LIVE + 4 * SEGS];
  const um__extent *best = NULL;
  int n = all_extents(md, all);
  bytes = (bytes + md->x.align - 1) & ~(md->x.align - 1);
  for (int i = 0; i < n; i++) {
    const um__extent *e = all[i];
    bool smaller, tie_seg, tie_off;
    if (!e->free || e->size < bytes)
      continue;
    smaller = best == NULL || e->size < best->size;
    tie_seg = best != NULL && e->size == best->size && e->seg < best->seg;
    tie_off = best != NULL && e->size == best->size && e->seg == best->seg && e->off < best->off;
    if (smaller || tie_seg || tie_off)
      best = e;
  }
  return best;
}

Test(extents, a_random_sequence_keeps_every_invariant) {
  model md;
  unsigned long long r = 0x5eed0035u;
  memset(&md, 0, sizeof(md));
  um__ext_init(&md.x, 512);
  for (int s = 0; s < SEGS; s++) {
    md.seg_size[s] = (size_t)(64 + 32 * s) * 1024;
    cr_assert_not_null(um__ext_add_segment(&md.x, (uint64_t)s, md.seg_size[s], NULL));
  }
  for (int step = 0; step < 20000; step++) {
    r = r * 6364136223846793005ull + 1442695040888963407ull;
    if (md.nlive > 0 && ((r >> 33) % 100 < 45 || md.nlive == LIVE)) {
      int i = (int)((r >> 20) % (unsigned)md.nlive);
      um__ext_free(&md.x, md.live[i]);
      md.live[i] = md.live[--md.nlive];
    } else {
      /* log-uniform-ish: 1 byte to 32 KiB */
      size_t bytes = ((size_t)1 << ((r >> 40) % 16)) + (size_t)((r >> 8) % 4096);
      const um__extent *want = expected_fit(&md, bytes);
      size_t want_off = want != NULL ? want->off : 0;
      uint64_t want_seg = want != NULL ? want->seg : 0;
      um__extent *e = um__ext_alloc(&md.x, bytes);
      if (want == NULL) {
        cr_assert_null(e, "step %d: %zu bytes granted, but no free extent fits", step, bytes);
      } else {
        cr_assert_not_null(e, "step %d: %zu bytes refused, but a free extent fits", step, bytes);
        cr_assert(e->seg == want_seg && e->off == want_off, "step %d: %zu bytes at (%llu, %zu), best fit (%llu, %zu)",
                  step, bytes, (unsigned long long)e->seg, e->off, (unsigned long long)want_seg, want_off);
        cr_assert_geq(e->size, bytes);
        md.live[md.nlive++] = e;
      }
    }
    check(&md);
  }
  drain(&md.x, md.live, md.nlive, SEGS);
}
