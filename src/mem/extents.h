/* Extents: the free and used ranges of segments (large allocations of a
 * device's memory), from which blocks of any size are carved. A request
 * takes the best-fitting free extent (the smallest that fits; ties go to
 * the lower segment id, then the lower offset) and splits off what it does
 * not need; a release merges the extent with its free neighbours, so that
 * a segment whose blocks all came back is one free extent again and can be
 * given back whole.
 *
 * Every extent knows its address neighbours in its segment (prev, next),
 * so a release merges in constant time; free extents also sit in one of
 * UM__EXT_BINS size bins (two levels, as in TLSF: the power of two, then
 * four steps within it) with a bitmap of the non-empty ones, so a request
 * looks at one bin's list and, when none there fits, the next non-empty
 * bin. Sizes and offsets are multiples of the map's alignment.
 *
 * Not thread-safe: the caller holds its own lock around every call. Nodes
 * come from the map's own free list (malloc'd when it is empty, freed by
 * um__ext_destroy). */
#ifndef UNIMEM_MEM_EXTENTS_H
#define UNIMEM_MEM_EXTENTS_H

#ifndef UM__SEES_MEM
#error "extents.h: this folder may not include it (src/README.md)"
#endif

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define UM__EXT_BINS 256 /* 64 powers of two x 4 steps */

typedef struct um__extent {
  size_t off, size;
  uint64_t seg;                     /* the segment's id (the caller's) */
  void *owner;                      /* the caller's, the same for every extent of a segment */
  struct um__extent *prev, *next;   /* address neighbours in the segment, or NULL */
  struct um__extent *fprev, *fnext; /* its bin's list, while free */
  bool free;
  uint16_t bin;
} um__extent;

typedef struct um__extents {
  size_t align;      /* a power of two */
  size_t free_bytes; /* the sum of the free extents' sizes */
  size_t nfree;      /* how many free extents */
  size_t nsegments;
  uint64_t nonempty[UM__EXT_BINS / 64];
  um__extent *bins[UM__EXT_BINS];
  um__extent *spare; /* recycled nodes, through next */
} um__extents;

/* An empty map; align: a power of two, the unit of every size and offset. */
void um__ext_init(um__extents *x, size_t align);
/* Frees the map's nodes. The caller has removed its segments. */
void um__ext_destroy(um__extents *x);

/* A new segment of size bytes (a multiple of align), id seg, owner the
 * caller's pointer that every extent of it carries: one free extent [0,
 * size), returned, or NULL when out of memory for a node. The extent at
 * offset 0 stays the same node for the segment's life (a merge keeps the
 * lower node), so it is where a walk of the segment's extents starts. */
um__extent *um__ext_add_segment(um__extents *x, uint64_t seg, size_t size, void *owner);

/* The best-fitting free extent for bytes (rounded up to align), marked
 * used: exactly that size, the rest split off as a free extent after it.
 * NULL when no free extent is large enough (however many free bytes there
 * are), or bytes is 0, or out of memory for a node. */
um__extent *um__ext_alloc(um__extents *x, size_t bytes);

/* Free extent e (of at least bytes, rounded up to align) marked used as
 * um__ext_alloc would: exactly that size, the rest split off after it;
 * NULL (e unchanged) when out of memory for the rest's node. */
um__extent *um__ext_take(um__extents *x, um__extent *e, size_t bytes);

/* um__ext_alloc among the free extents that ok(ctx, e) accepts only: the
 * best fit of those, in the first bin that holds one (so not always the
 * smallest when a larger bin's would fit better). NULL when none does. */
um__extent *um__ext_alloc_if(um__extents *x, size_t bytes, bool (*ok)(void *ctx, const um__extent *e, size_t bytes),
                             void *ctx);

/* A used extent is free again, merged with its free neighbours; returns
 * the free extent it is now part of. */
um__extent *um__ext_free(um__extents *x, um__extent *e);

/* Whether e is a whole segment, free (um__ext_remove_segment may take it). */
static inline bool um__ext_whole_free(const um__extent *e) {
  return e->free && e->prev == NULL && e->next == NULL;
}

/* A whole free segment leaves the map (the caller then frees its memory). */
void um__ext_remove_segment(um__extents *x, um__extent *e);

/* The largest free extent's size (0 when none). */
size_t um__ext_largest_free(const um__extents *x);

#endif /* UNIMEM_MEM_EXTENTS_H */
