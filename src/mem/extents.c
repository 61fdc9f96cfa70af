/* Extents of segments: best fit, split and merge (extents.h). */
#include "extents.h"

#include <stdlib.h>

/* The bin of a size: its power of two, then which quarter of it (sizes
 * below 4 have one bin per power). Monotonic in size. */
static unsigned bin_of(size_t size) {
  unsigned fl = 63u - (unsigned)__builtin_clzll((unsigned long long)size);
  unsigned sl = fl >= 2 ? (unsigned)(size >> (fl - 2)) & 3u : 0u;
  return fl * 4u + sl;
}

static void bin_insert(um__extents *x, um__extent *e) {
  unsigned b = bin_of(e->size);
  e->bin = (uint16_t)b;
  e->free = true;
  e->fprev = NULL;
  e->fnext = x->bins[b];
  if (e->fnext != NULL)
    e->fnext->fprev = e;
  x->bins[b] = e;
  x->nonempty[b / 64] |= 1ull << (b % 64);
  x->free_bytes += e->size;
  x->nfree++;
}

static void bin_remove(um__extents *x, um__extent *e) {
  unsigned b = e->bin;
  if (e->fprev != NULL)
    e->fprev->fnext = e->fnext;
  else
    x->bins[b] = e->fnext;
  if (e->fnext != NULL)
    e->fnext->fprev = e->fprev;
  if (x->bins[b] == NULL)
    x->nonempty[b / 64] &= ~(1ull << (b % 64));
  e->fprev = e->fnext = NULL;
  e->free = false;
  x->free_bytes -= e->size;
  x->nfree--;
}

static um__extent *node_new(um__extents *x) {
  um__extent *e = x->spare;
  if (e != NULL)
    x->spare = e->next;
  else if ((e = malloc(sizeof(*e))) == NULL)
    return NULL;
  *e = (um__extent){.off = 0};
  return e;
}

static void node_put(um__extents *x, um__extent *e) {
  e->next = x->spare;
  x->spare = e;
}

void um__ext_init(um__extents *x, size_t align) {
  *x = (um__extents){.align = align != 0 ? align : 1};
}

void um__ext_destroy(um__extents *x) {
  for (unsigned b = 0; b < UM__EXT_BINS; b++)
    while (x->bins[b] != NULL) {
      um__extent *e = x->bins[b];
      bin_remove(x, e);
      free(e);
    }
  while (x->spare != NULL) {
    um__extent *e = x->spare;
    x->spare = e->next;
    free(e);
  }
}

um__extent *um__ext_add_segment(um__extents *x, uint64_t seg, size_t size, void *owner) {
  um__extent *e = node_new(x);
  if (e == NULL)
    return NULL;
  e->seg = seg;
  e->owner = owner;
  e->size = size;
  bin_insert(x, e);
  x->nsegments++;
  return e;
}

/* Whether a is a better fit than b (b may be NULL): smaller, then the lower
 * segment id, then the lower offset. */
static bool better(const um__extent *a, const um__extent *b) {
  if (b == NULL)
    return true;
  if (a->size != b->size)
    return a->size < b->size;
  if (a->seg != b->seg)
    return a->seg < b->seg;
  return a->off < b->off;
}

/* The best extent of bin b of at least bytes, or NULL. */
static um__extent *best_in(const um__extents *x, unsigned b, size_t bytes) {
  um__extent *best = NULL;
  for (um__extent *e = x->bins[b]; e != NULL; e = e->fnext)
    if (e->size >= bytes && better(e, best))
      best = e;
  return best;
}

/* The first non-empty bin after b, or UM__EXT_BINS. */
static unsigned next_bin(const um__extents *x, unsigned b) {
  for (unsigned w = (b + 1) / 64, first = (b + 1) % 64; w < UM__EXT_BINS / 64; w++, first = 0) {
    uint64_t bits = x->nonempty[w] & (~0ull << first);
    if (bits != 0)
      return w * 64 + (unsigned)__builtin_ctzll(bits);
  }
  return UM__EXT_BINS;
}

/* The best extent of bin b of at least bytes that ok accepts, or NULL. */
static um__extent *best_in_if(const um__extents *x, unsigned b, size_t bytes,
                              bool (*ok)(void *, const um__extent *, size_t), void *ctx) {
  um__extent *best = NULL;
  for (um__extent *e = x->bins[b]; e != NULL; e = e->fnext)
    if (e->size >= bytes && better(e, best) && ok(ctx, e, bytes))
      best = e;
  return best;
}

static um__extent *take(um__extents *x, um__extent *e, size_t bytes);

um__extent *um__ext_alloc(um__extents *x, size_t bytes) {
  um__extent *e;
  unsigned b;
  if (bytes == 0 || bytes > SIZE_MAX - (x->align - 1))
    return NULL;
  bytes = (bytes + x->align - 1) & ~(x->align - 1);
  b = bin_of(bytes);
  /* Smaller bins hold only smaller extents; any of a larger bin fits. */
  if ((e = best_in(x, b, bytes)) == NULL) {
    if ((b = next_bin(x, b)) == UM__EXT_BINS)
      return NULL;
    e = best_in(x, b, bytes);
  }
  return take(x, e, bytes);
}

um__extent *um__ext_alloc_if(um__extents *x, size_t bytes, bool (*ok)(void *ctx, const um__extent *e, size_t bytes),
                             void *ctx) {
  um__extent *e = NULL;
  if (bytes == 0 || bytes > SIZE_MAX - (x->align - 1))
    return NULL;
  bytes = (bytes + x->align - 1) & ~(x->align - 1);
  for (unsigned b = bin_of(bytes); e == NULL && b < UM__EXT_BINS; b = next_bin(x, b))
    if (x->bins[b] != NULL)
      e = best_in_if(x, b, bytes, ok, ctx);
  return e != NULL ? take(x, e, bytes) : NULL;
}

um__extent *um__ext_take(um__extents *x, um__extent *e, size_t bytes) {
  if (!e->free || bytes == 0 || bytes > SIZE_MAX - (x->align - 1))
    return NULL;
  bytes = (bytes + x->align - 1) & ~(x->align - 1);
  return bytes <= e->size ? take(x, e, bytes) : NULL;
}

/* Mark e (free, of at least bytes, a multiple of align) used: exactly
 * bytes, the rest split off; NULL when out of memory for the rest's node. */
static um__extent *take(um__extents *x, um__extent *e, size_t bytes) {
  um__extent *rest;
  if (e->size > bytes) {
    if ((rest = node_new(x)) == NULL)
      return NULL;
    bin_remove(x, e);
    rest->seg = e->seg;
    rest->owner = e->owner;
    rest->off = e->off + bytes;
    rest->size = e->size - bytes;
    rest->prev = e;
    rest->next = e->next;
    if (e->next != NULL)
      e->next->prev = rest;
    e->next = rest;
    e->size = bytes;
    bin_insert(x, rest);
  } else {
    bin_remove(x, e);
  }
  return e;
}

/* a absorbs its next neighbour n (both out of the bins); n's node goes. */
static void absorb_next(um__extents *x, um__extent *a, um__extent *n) {
  a->size += n->size;
  a->next = n->next;
  if (n->next != NULL)
    n->next->prev = a;
  node_put(x, n);
}

um__extent *um__ext_free(um__extents *x, um__extent *e) {
  um__extent *p = e->prev, *n = e->next;
  if (n != NULL && n->free) {
    bin_remove(x, n);
    absorb_next(x, e, n);
  }
  if (p != NULL && p->free) {
    bin_remove(x, p);
    absorb_next(x, p, e);
    e = p;
  }
  bin_insert(x, e);
  return e;
}

void um__ext_remove_segment(um__extents *x, um__extent *e) {
  bin_remove(x, e);
  x->nsegments--;
  node_put(x, e);
}

size_t um__ext_largest_free(const um__extents *x) {
  for (unsigned w = UM__EXT_BINS / 64; w-- > 0;)
    if (x->nonempty[w] != 0) {
      unsigned b = w * 64 + 63u - (unsigned)__builtin_clzll(x->nonempty[w]);
      size_t largest = 0;
      for (const um__extent *e = x->bins[b]; e != NULL; e = e->fnext)
        if (e->size > largest)
          largest = e->size;
      return largest;
    }
  return 0;
}
