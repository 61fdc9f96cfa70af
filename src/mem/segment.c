/* Segments: device allocations that a pool's blocks are carved from
 * (um_options.segments). Per (device, location) where the backend can
 * carve (sub-buffers on OpenCL, pointers on CUDA and the host), a pool
 * miss takes the best-fitting free extent of the pool's segments
 * (extents.h) instead of a device allocation, and a block that leaves the
 * pool (trimmed, over a limit, returned to make room) goes back to its
 * extent, merged with its free neighbours. The bins and thread caches
 * (pool.c, tcache.h) sit in front unchanged: an exact repeat never reaches
 * this file.
 *
 * Kinds: blocks of up to UM__SEG_SMALL bytes and larger ones come from
 * segments of their own kind, as in PyTorch's caching allocator, so the
 * holes small blocks leave never keep a large one from fitting.
 *
 * Virtual segments: where the backend can give back the memory inside a
 * segment and keep its addresses (mem_discard: host memory, through
 * madvise), a segment is UM__SEG_VIRTUAL bytes of address space whose
 * memory is committed as blocks are carved from it, UM__SEG_GRANULE at a
 * time (a bitmap per segment), and given back from free extents, so one
 * segment per kind serves every size and never fragments into separate
 * allocations. What a pool holds (bytes_reserved) is then the committed
 * granules, not the address space. Elsewhere a segment is a device
 * allocation of UM__SEG_SMALL_SEGMENT bytes (small kind) or of its first
 * block's size rounded up to UM__SEG_ROUND (large), which smaller blocks
 * can be carved from later.
 *
 * Growing (buffer.c's carve_block, in this order): a free extent that
 * needs no new memory; the pool's idle blocks, then the calling thread's
 * cached blocks of the pool, back to their segments and merged, and a
 * free extent again; with virtual segments, an extent that commits new
 * memory, after giving back free memory (the largest free extents' first,
 * down to 1/32 of what is committed) when the commit would take the pool
 * past the most it has held and over 1/16 of what it holds is free: the
 * pool's peak stays near what its blocks need, and below the peak, memory
 * stays for the next carve instead of faulting in again; last, a new
 * segment, after giving back wholly free segments that would leave the
 * pool holding over 1/8 more than its blocks need (um__seg_before_grow).
 * The trim timer gives back a pool's free memory once no block was
 * carved from it for an interval.
 *
 * Lock: one per pool's segments. It is not held while the backend carves,
 * gives a carved block back, or frees a segment (clCreateSubBuffer,
 * clReleaseMemObject, munmap); it is held while memory is discarded
 * (madvise), since a carve between the choice and the call would lose the
 * data its owner writes. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "extents.h"
#include "tcache.h"

#define UM__SEG_SMALL_SEGMENT ((size_t)2 << 20)
#define UM__SEG_ROUND ((size_t)2 << 20)
#define UM__SEG_VIRTUAL ((size_t)1 << 30)
#define UM__SEG_GRANULE ((size_t)64 << 10)
#define KIND(cap) ((cap) > UM__SEG_SMALL ? 1 : 0)

typedef struct um__seg {
  um__mem mem;       /* the device block */
  size_t size;
  um__extent *first; /* the extent at offset 0 (extents.h) */
  size_t used;       /* bytes of the extents carved from it */
  int kind;          /* which map of the pool's: small or large blocks */
  bool whole_free;   /* no block carved from it */
  bool virt;         /* memory committed per granule (committed) */
  uint64_t free_since_ns; /* when it last became wholly free */
  uint64_t *committed;    /* virt: one bit per granule that may hold memory */
  size_t committed_bytes;
  struct um__seg *prev, *next;
} um__seg;

struct um__segs {
  pthread_mutex_t lock;
  um__extents x[2]; /* free and used extents of each kind's segments */
  um__seg *list;    /* every segment of the pool, newest first */
  um_device *giver; /* whose backend allocates and carves the memory */
  bool virt;        /* the giver discards at this location: virtual segments */
  uint64_t next_id; /* ids in order of creation: ties go to the older */
  /* Sums over the segments: plain ones (sizes, bytes carved), virtual
   * ones (committed granules, bytes carved), and the wholly free. */
  uint64_t plain_bytes, plain_used, committed, virt_used, whole_free_bytes, plain_whole_bytes;
  uint64_t high; /* the most that held_locked has been */
  uint64_t last_carve_ns; /* when a block was last carved */
  /* The free bytes and what a trim could give back, as added into the
   * manager's seg_free and seg_returnable (publish_locked); of the virtual
   * segments' free memory, what the last full discard left (it shares
   * granules with blocks). */
  uint64_t published_free, published_ret, residual;
};

/* What the pool holds from the device: plain segments whole, virtual ones
 * as far as committed; and of that, what no block uses. */
static uint64_t held_locked(const struct um__segs *s) { return s->plain_bytes + s->committed; }
/* What the segments hold that no block uses; pending: bytes of a block
 * just taken (counted in virt_used) that are not committed yet. */
static uint64_t free_pending_locked(const struct um__segs *s, uint64_t pending) {
  uint64_t c = s->committed + pending;
  return (s->plain_bytes - s->plain_used) + (c > s->virt_used ? c - s->virt_used : 0);
}
static uint64_t held_free_locked(const struct um__segs *s) { return free_pending_locked(s, 0); }

/* The virtual segments' committed memory that no block uses. */
static uint64_t virt_free_locked(const struct um__segs *s) {
  return s->committed > s->virt_used ? s->committed - s->virt_used : 0;
}

/* What a trim could give back now: wholly free plain segments, and the
 * virtual segments' free memory but for what the last discard left. */
static uint64_t returnable_locked(struct um__segs *s) {
  uint64_t vfree = virt_free_locked(s);
  if (s->residual > vfree)
    s->residual = vfree;
  return s->plain_whole_bytes + (vfree - s->residual);
}

/* *total moved from *mine to now; its value before. */
static uint64_t move_figure(atomic_uint_fast64_t *total, uint64_t *mine, uint64_t now) {
  uint64_t before = (uint64_t)um__atomic_load_relaxed(total);
  if (now > *mine)
    before = (uint64_t)um__atomic_add_relaxed(total, now - *mine);
  else if (now < *mine)
    um__atomic_sub_relaxed(total, *mine - now);
  *mine = now;
  return before;
}

/* The manager's figures moved to this pool's; true when nothing could be
 * trimmed before and something can now (the caller then wakes the trim
 * timer, without the lock: um__pool_notify_idle). */
static bool publish_locked(um__pool *p) {
  struct um__segs *s = p->segs;
  um_manager *m = p->dev->m;
  uint64_t ret = returnable_locked(s);
  move_figure(&m->seg_free, &s->published_free, held_free_locked(s));
  return move_figure(&m->seg_returnable, &s->published_ret, ret) == 0 && ret != 0;
}

/* The lock let go, and the timer woken when there is memory to trim. */
static void unlock_publish(um__pool *p) {
  bool wake = publish_locked(p);
  pthread_mutex_unlock(&p->segs->lock);
  if (wake)
    um__pool_notify_idle(p->dev->m);
}

void um__seg_init(um__pool *p) {
  um_device *d = p->dev;
  /* UM_HOST blocks of every device are the cpu device's (block.c);
   * device 0 is the cpu device itself, not yet in m->devices here. */
  um_device *g = p->loc == UM_HOST && d->index != 0 ? d->m->devices[0] : d;
  struct um__segs *s;
  p->segs = NULL;
  if (!d->m->opts.segments || !um__dev_can_carve(g, p->loc))
    return;
  if ((s = calloc(1, sizeof(*s))) == NULL)
    return; /* blocks of their own: slower to reuse, still correct */
  pthread_mutex_init(&s->lock, NULL);
  um__ext_init(&s->x[0], g->carve_align);
  um__ext_init(&s->x[1], g->carve_align);
  s->giver = g;
  s->virt = um__dev_can_discard(g, p->loc) && g->carve_align <= UM__SEG_GRANULE;
  p->segs = s;
}

static size_t round_up(size_t v, size_t r) { return v > SIZE_MAX - (r - 1) ? 0 : (v + r - 1) & ~(r - 1); }

/* Under device_limit_bytes, plain segments of at most a sixteenth of the
 * limit (a power of two, at least the alignment): one small live block
 * then keeps little of a small limit from the others. */
static size_t limited_piece(const um__pool *p, size_t piece) {
  uint64_t limit = p->dev->m->opts.device_limit_bytes / 16;
  size_t r = p->segs->x[0].align;
  if (p->segs->virt || limit == 0 || limit >= piece)
    return piece;
  while (r * 2 <= limit)
    r *= 2;
  return r;
}

size_t um__seg_size_for(const um__pool *p, size_t cap) {
  size_t r = limited_piece(p, UM__SEG_ROUND > p->segs->x[0].align ? UM__SEG_ROUND : p->segs->x[0].align), want;
  size_t small = limited_piece(p, UM__SEG_SMALL_SEGMENT);
  want = cap <= UM__SEG_SMALL ? (small >= cap ? small : round_up(cap, r)) : round_up(cap, r);
  if (p->segs->virt && want != 0 && want < UM__SEG_VIRTUAL)
    want = UM__SEG_VIRTUAL;
  return want;
}

size_t um__seg_exact_size(const um__pool *p, size_t cap) { return round_up(cap, p->segs->x[0].align); }

size_t um__seg_large_cap(const um__pool *p, size_t bytes) {
  size_t r;
  if (p->segs == NULL || bytes <= UM__SEG_SMALL)
    return 0;
  r = p->segs->x[1].align > UM__SEG_GRANULE ? p->segs->x[1].align : UM__SEG_GRANULE;
  return round_up(bytes, r);
}

/* ------------------------------------------------------------------------ */
/* Committed granules of virtual segments (the lock held) */

static bool granule_set(const um__seg *seg, size_t g) { return (seg->committed[g / 64] >> (g % 64)) & 1u; }

/* The bytes of [off, off + len) of seg not committed yet. */
static uint64_t uncommitted(const um__seg *seg, size_t off, size_t len) {
  uint64_t n = 0;
  if (!seg->virt)
    return 0;
  for (size_t g = off / UM__SEG_GRANULE, end = (off + len - 1) / UM__SEG_GRANULE; g <= end; g++)
    n += granule_set(seg, g) ? 0 : UM__SEG_GRANULE;
  return n;
}

/* Mark [off, off + len) committed; the bytes newly committed. */
static uint64_t commit_locked(struct um__segs *s, um__seg *seg, size_t off, size_t len) {
  uint64_t added = 0;
  for (size_t g = off / UM__SEG_GRANULE, end = (off + len - 1) / UM__SEG_GRANULE; g <= end; g++)
    if (!granule_set(seg, g)) {
      seg->committed[g / 64] |= (uint64_t)1 << (g % 64);
      added += UM__SEG_GRANULE;
    }
  seg->committed_bytes += added;
  s->committed += added;
  if (held_locked(s) > s->high)
    s->high = held_locked(s);
  return added;
}

/* Give back the committed granules wholly inside free extent e, at most
 * limit bytes of them (whole granules, from e's start); bytes. */
static uint64_t discard_extent_locked(um__pool *p, const um__extent *e, uint64_t limit) {
  struct um__segs *s = p->segs;
  um__seg *seg = e->owner;
  size_t g = (e->off + UM__SEG_GRANULE - 1) / UM__SEG_GRANULE, end = (e->off + e->size) / UM__SEG_GRANULE;
  uint64_t freed = 0;
  while (g < end && freed < limit) {
    size_t run;
    if (!granule_set(seg, g)) {
      g++;
      continue;
    }
    for (run = g; run < end && granule_set(seg, run) && freed + (run - g) * UM__SEG_GRANULE < limit; run++)
      seg->committed[run / 64] &= ~((uint64_t)1 << (run % 64));
    um__dev_mem_discard(s->giver, p->loc, &seg->mem, g * UM__SEG_GRANULE, (run - g) * UM__SEG_GRANULE);
    freed += (run - g) * UM__SEG_GRANULE;
    g = run;
  }
  seg->committed_bytes -= freed;
  s->committed -= freed;
  return freed;
}

/* Give back the memory of the free extents of p's virtual segments,
 * largest first (fewest calls), until at most keep free bytes are held
 * (pending: free_pending_locked's). */
static uint64_t discard_walk_locked(um__pool *p, uint64_t keep, uint64_t pending) {
  struct um__segs *s = p->segs;
  uint64_t freed = 0, now;
  for (unsigned b = UM__EXT_BINS; b-- > 0;)
    for (int k = 0; k < 2; k++)
      for (const um__extent *e = s->x[k].bins[b]; e != NULL; e = e->fnext) {
        if ((now = free_pending_locked(s, pending)) <= keep)
          return freed;
        if (((const um__seg *)e->owner)->virt)
          freed += discard_extent_locked(p, e, now - keep);
      }
  return freed;
}

/* discard_walk_locked, counted as one trim of the bytes it gave back. */
static uint64_t discard_locked(um__pool *p, uint64_t keep, uint64_t pending) {
  uint64_t freed = discard_walk_locked(p, keep, pending);
  if (freed != 0) {
    um__trimmed(p->dev, freed);
    UM__STAT_ADD(p->dev, trims, 1);
  }
  return freed;
}

/* Committing growth more bytes would take what the pool holds past its
 * highest so far, and free memory is more than an eighth of what it
 * holds: give back the free memory down to a sixteenth first (largest
 * extents first), so that the pool's peak stays near what its blocks
 * need, while below the peak the memory stays for the next carve. A page
 * given back and used again costs a fault and its zeroing: giving back
 * just the excess at every crossing keeps the peak lower still (1.01x on
 * bench/traces) but costs 2-5x the time per event on the traces whose
 * holes are reused at once (docs/design.md, "The segment layer"). Bytes
 * given back. */
static uint64_t discard_for_growth_locked(um__pool *p, uint64_t growth) {
  struct um__segs *s = p->segs;
  /* The block being carved counts as used already, growth bytes of it not
   * committed: without them the free memory would read too low. */
  uint64_t free = free_pending_locked(s, growth);
  if (growth == 0 || held_locked(s) + growth <= s->high || free <= (s->committed >> 3) || free < UM__SEG_GRANULE)
    return 0;
  return discard_locked(p, s->committed >> 4, growth);
}

uint64_t um__seg_discard(um__pool *p) {
  struct um__segs *s = p->segs;
  uint64_t freed;
  if (s == NULL || !s->virt)
    return 0;
  pthread_mutex_lock(&s->lock);
  freed = discard_locked(p, 0, 0);
  /* What is left shares granules with blocks: no trim can give it back. */
  s->residual = virt_free_locked(s);
  unlock_publish(p);
  UM__STAT_SUB(p->dev, bytes_reserved, freed);
  return freed;
}

/* ------------------------------------------------------------------------ */
/* Carving and giving back */

/* seg (wholly free, out of the map and the list) goes back to the device;
 * a virtual one's address space counted only as far as it was committed. */
static void free_segment(um__pool *p, um__seg *seg) {
  if (seg->virt)
    UM__STAT_ADD(p->dev, bytes_reserved, seg->size - seg->committed_bytes);
  um__block_free(p->dev, p->loc, seg->size, &seg->mem);
  free(seg->committed);
  free(seg);
}

/* A wholly free segment leaves the map and the list (the lock held). */
static void unlink_segment_locked(struct um__segs *s, um__seg *seg) {
  um__ext_remove_segment(&s->x[seg->kind], seg->first);
  if (seg->prev != NULL)
    seg->prev->next = seg->next;
  else
    s->list = seg->next;
  if (seg->next != NULL)
    seg->next->prev = seg->prev;
  if (seg->whole_free) {
    s->whole_free_bytes -= seg->size;
    if (!seg->virt)
      s->plain_whole_bytes -= seg->size;
  }
  if (seg->virt)
    s->committed -= seg->committed_bytes;
  else
    s->plain_bytes -= seg->size;
}

/* e was just taken from the map for a block of cap bytes. What the block
 * does not use of e (e is cap rounded up to the alignment) counts as free,
 * so that what a pool holds is its blocks' capacities and its free bytes,
 * exactly. */
static void taken_locked(struct um__segs *s, um__extent *e, size_t cap) {
  um__seg *seg = e->owner;
  if (seg->whole_free) {
    seg->whole_free = false;
    s->whole_free_bytes -= seg->size;
    if (!seg->virt)
      s->plain_whole_bytes -= seg->size;
  }
  seg->used += cap;
  if (seg->virt)
    s->virt_used += cap;
  else
    s->plain_used += cap;
}

/* Extent e of a block of cap bytes is free again, merged; a segment left
 * wholly free stays, for um__seg_shed to give back. */
static void give_extent(um__pool *p, um__extent *e, size_t cap) {
  struct um__segs *s = p->segs;
  um__seg *seg = e->owner;
  pthread_mutex_lock(&s->lock);
  seg->used -= cap;
  if (seg->virt)
    s->virt_used -= cap;
  else
    s->plain_used -= cap;
  e = um__ext_free(&s->x[seg->kind], e);
  if (um__ext_whole_free(e)) {
    seg->whole_free = true;
    seg->free_since_ns = um__now_ns();
    s->whole_free_bytes += seg->size;
    if (!seg->virt)
      s->plain_whole_bytes += seg->size;
  }
  unlock_publish(p);
}

/* Whether a block of bytes at the start of free extent e needs no new
 * memory (um__ext_alloc_if's test). */
static bool committed_ok(void *ctx, const um__extent *e, size_t bytes) {
  (void)ctx;
  return uncommitted(e->owner, e->off, bytes) == 0;
}

/* The backend's block over extent e, or its error (e given back). */
static int carve_extent(um__pool *p, um__extent *e, size_t cap, um__mem *out) {
  um__seg *seg = e->owner;
  int st;
  memset(out, 0, sizeof(*out));
  st = um__dev_mem_carve(p->segs->giver, p->loc, &seg->mem, e->off, cap, out);
  if (st != UM_OK) {
    give_extent(p, e, cap);
    return st;
  }
  out->carved = e;
  return UM_OK;
}

int um__seg_carve(um__pool *p, size_t cap, bool commit, um__mem *out) {
  struct um__segs *s = p->segs;
  uint64_t added = 0, discarded = 0;
  um__extent *e;
  um__seg *seg;
  pthread_mutex_lock(&s->lock);
  e = commit || !s->virt ? um__ext_alloc(&s->x[KIND(cap)], cap)
                          : um__ext_alloc_if(&s->x[KIND(cap)], cap, committed_ok, NULL);
  if (e != NULL) {
    seg = e->owner;
    s->last_carve_ns = um__now_ns();
    taken_locked(s, e, cap); /* out of the free extents before any is discarded */
    if (seg->virt) {
      discarded = discard_for_growth_locked(p, uncommitted(seg, e->off, e->size));
      added = commit_locked(s, seg, e->off, e->size);
    }
  }
  unlock_publish(p);
  if (e == NULL)
    return UM_ENOMEM; /* nothing fits (no message: the caller goes on) */
  UM__STAT_SUB(p->dev, bytes_reserved, discarded);
  UM__STAT_ADD(p->dev, bytes_reserved, added);
  return carve_extent(p, e, cap, out);
}

int um__seg_add_and_carve(um__pool *p, const um__mem *mem, size_t bytes, size_t cap, um__mem *out) {
  struct um__segs *s = p->segs;
  um__seg *seg = calloc(1, sizeof(*seg));
  uint64_t added = 0;
  um__extent *e = NULL;
  bool virt = s->virt && bytes % UM__SEG_GRANULE == 0 && mem->host != NULL &&
              (uintptr_t)mem->host % (uintptr_t)sysconf(_SC_PAGESIZE) == 0;
  if (seg != NULL && virt && (seg->committed = calloc(bytes / UM__SEG_GRANULE / 64 + 1, sizeof(uint64_t))) == NULL) {
    free(seg);
    seg = NULL;
  }
  if (seg == NULL) {
    um__mem copy = *mem;
    um__block_free(p->dev, p->loc, bytes, &copy);
    return um__set_error(UM_ENOMEM, "um_alloc: out of memory for a segment's record");
  }
  seg->mem = *mem;
  seg->size = bytes;
  seg->kind = KIND(cap);
  seg->virt = virt;
  /* A virtual segment holds no memory until blocks are carved. */
  if (virt)
    UM__STAT_SUB(p->dev, bytes_reserved, bytes);
  pthread_mutex_lock(&s->lock);
  seg->first = um__ext_add_segment(&s->x[seg->kind], ++s->next_id, bytes, seg);
  if (seg->first != NULL) {
    seg->next = s->list;
    if (s->list != NULL)
      s->list->prev = seg;
    s->list = seg;
    if (!virt)
      s->plain_bytes += bytes;
    seg->whole_free = true;
    s->whole_free_bytes += bytes;
    if (!virt)
      s->plain_whole_bytes += bytes;
    /* Carved at once, from this segment (best fit could pick an extent that
     * another thread freed meanwhile, and leave the new segment unused), and
     * under the same lock: another thread cannot take it first. */
    if ((e = um__ext_take(&s->x[seg->kind], seg->first, cap)) != NULL) {
      taken_locked(s, e, cap);
      if (virt)
        added = commit_locked(s, seg, e->off, e->size);
    }
  }
  unlock_publish(p);
  if (seg->first == NULL) {
    free_segment(p, seg);
    return um__set_error(UM_ENOMEM, "um_alloc: out of memory for a segment's extent");
  }
  if (e == NULL) { /* no node for the rest: the segment goes back */
    pthread_mutex_lock(&s->lock);
    if (um__ext_whole_free(seg->first)) /* not carved from by another thread since */
      unlink_segment_locked(s, seg);
    else
      seg = NULL;
    unlock_publish(p);
    if (seg != NULL)
      free_segment(p, seg);
    return um__set_error(UM_ENOMEM, "um_alloc: out of memory for an extent");
  }
  UM__STAT_ADD(p->dev, bytes_reserved, added);
  return carve_extent(p, e, cap, out);
}

/* The pools hold more idle memory than max_pool_bytes (the bins' and the
 * segments' together): give back the excess, from p's wholly free plain
 * segments (oldest first) or the free memory of its virtual ones (the
 * bins, which claim their room against both, shrink for the rest). */
static void over_cap(um__pool *p) {
  struct um__segs *s = p->segs;
  um_manager *m = p->dev->m;
  /* The bins' budget holds their blocks and the thread caches' slots. */
  uint64_t idle = (uint64_t)um__atomic_load_relaxed(&m->pool_claimed) +
                  (uint64_t)um__atomic_load_relaxed(&m->seg_free),
           excess, held, free, freed;
  if (idle <= m->opts.max_pool_bytes)
    return;
  excess = idle - m->opts.max_pool_bytes;
  if (!s->virt) { /* plain segments go whole */
    pthread_mutex_lock(&s->lock);
    held = held_locked(s);
    pthread_mutex_unlock(&s->lock);
    um__seg_shed(p, held > excess ? held - excess : 1, UINT64_MAX);
    return;
  }
  pthread_mutex_lock(&s->lock);
  free = held_free_locked(s);
  freed = discard_locked(p, free > excess ? free - excess : 0, 0);
  unlock_publish(p);
  UM__STAT_SUB(p->dev, bytes_reserved, freed);
}

void um__seg_release(um__pool *p, um__mem *mem, size_t cap) {
  um__extent *e = mem->carved;
  um__dev_mem_uncarve(p->segs->giver, p->loc, mem);
  memset(mem, 0, sizeof(*mem));
  give_extent(p, e, cap);
  over_cap(p);
}

/* ------------------------------------------------------------------------ */
/* Giving segments back */

uint64_t um__seg_shed(um__pool *p, uint64_t keep, uint64_t cutoff_ns) {
  struct um__segs *s = p->segs;
  um__seg *gone = NULL, *seg, *prev;
  uint64_t freed = 0;
  if (s == NULL)
    return 0;
  pthread_mutex_lock(&s->lock);
  /* Oldest first: the list is newest first. */
  for (seg = s->list; seg != NULL && seg->next != NULL; seg = seg->next)
    ;
  /* keep 0: every wholly free one, a virtual one that holds no memory too. */
  for (; seg != NULL && (keep == 0 || held_locked(s) > keep); seg = prev) {
    prev = seg->prev;
    if (!seg->whole_free || seg->free_since_ns >= cutoff_ns)
      continue;
    unlink_segment_locked(s, seg);
    seg->next = gone;
    gone = seg;
  }
  unlock_publish(p);
  while (gone != NULL) {
    uint64_t bytes;
    seg = gone;
    gone = seg->next;
    bytes = seg->virt ? seg->committed_bytes : seg->size;
    freed += bytes;
    free_segment(p, seg);
    /* After the free, as free_to_device counts (pool.c). */
    um__trimmed(p->dev, bytes);
    UM__STAT_ADD(p->dev, trims, 1);
  }
  return freed;
}

void um__seg_before_grow(um__pool *p, size_t bytes) {
  struct um__segs *s = p->segs;
  uint64_t want;
  pthread_mutex_lock(&s->lock);
  want = held_locked(s) - held_free_locked(s) + bytes; /* what the blocks need, with the new one */
  pthread_mutex_unlock(&s->lock);
  want += want >> 3;
  um__seg_shed(p, want > bytes ? want - bytes : 0, UINT64_MAX);
}

uint64_t um__seg_trim(um__pool *p, uint64_t keep, uint64_t cutoff_ns) {
  uint64_t freed = um__seg_shed(p, keep, cutoff_ns), held, last;
  if (p->segs == NULL || !p->segs->virt)
    return freed;
  pthread_mutex_lock(&p->segs->lock);
  held = held_locked(p->segs);
  last = p->segs->last_carve_ns;
  pthread_mutex_unlock(&p->segs->lock);
  /* The free memory goes back too, once no block was carved since the
   * cutoff: a pool in use keeps what it will carve again. */
  return held > keep && last < cutoff_ns ? freed + um__seg_discard(p) : freed;
}

void um__seg_destroy(um__pool *p) {
  struct um__segs *s = p->segs;
  if (s == NULL)
    return;
  /* Every block came back before (the manager's destroy frees them all),
   * so only wholly free segments are left; a leak's are freed all the same. */
  while (s->list != NULL) {
    um__seg *seg = s->list;
    s->list = seg->next;
    /* Used nodes are in no bin: freed here; the free ones go with the map. */
    for (um__extent *e = seg->first, *n; e != NULL; e = n) {
      n = e->next;
      if (!e->free)
        free(e);
    }
    free_segment(p, seg);
  }
  um__ext_destroy(&s->x[0]);
  um__ext_destroy(&s->x[1]);
  um__atomic_sub_relaxed(&p->dev->m->seg_free, s->published_free);
  um__atomic_sub_relaxed(&p->dev->m->seg_returnable, s->published_ret);
  pthread_mutex_destroy(&s->lock);
  free(s);
  p->segs = NULL;
}

/* The committed bytes of seg in [off, off + len): a virtual segment's
 * free extent holds memory only where its granules are committed. */
static size_t committed_in(const um__seg *seg, size_t off, size_t len) {
  size_t n = 0, end = off + len;
  for (size_t g = off / UM__SEG_GRANULE; g * UM__SEG_GRANULE < end;) {
    size_t lo, hi;
    if (g % 64 == 0 && seg->committed[g / 64] == 0) { /* 64 granules of nothing */
      g += 64;
      continue;
    }
    if (granule_set(seg, g)) {
      lo = g * UM__SEG_GRANULE > off ? g * UM__SEG_GRANULE : off;
      hi = (g + 1) * UM__SEG_GRANULE < end ? (g + 1) * UM__SEG_GRANULE : end;
      n += hi - lo;
    }
    g++;
  }
  return n;
}

/* The free extents of s that hold memory (a virtual segment's address
 * space alone is no free memory: bytes_segment_free counts none of it),
 * counted into *count; the most memory one of them holds. */
static size_t committed_extents_locked(const struct um__segs *s, uint64_t *count) {
  size_t largest = 0;
  for (int k = 0; k < 2; k++)
    for (unsigned b = 0; b < UM__EXT_BINS; b++)
      for (const um__extent *e = s->x[k].bins[b]; e != NULL; e = e->fnext) {
        const um__seg *seg = e->owner;
        size_t held = seg->virt ? committed_in(seg, e->off, e->size) : e->size;
        if (held == 0)
          continue;
        ++*count;
        if (held > largest)
          largest = held;
      }
  return largest;
}

void um__seg_stats_add(um__pool *p, um__seg_stats *out) {
  struct um__segs *s = p->segs;
  size_t largest;
  if (s == NULL)
    return;
  pthread_mutex_lock(&s->lock);
  out->segments += s->x[0].nsegments + s->x[1].nsegments;
  out->held_bytes += held_locked(s);
  out->free_bytes += held_free_locked(s);
  if (!s->virt) {
    out->free_extents += s->x[0].nfree + s->x[1].nfree;
    largest = um__ext_largest_free(&s->x[1]);
    if (largest == 0)
      largest = um__ext_largest_free(&s->x[0]);
  } else {
    largest = committed_extents_locked(s, &out->free_extents);
  }
  if (largest > out->largest_free)
    out->largest_free = largest;
  pthread_mutex_unlock(&s->lock);
}

void um__seg_walk(um__pool *p, void (*seg)(void *ctx, const um__seg_view *v),
                  void (*ext)(void *ctx, const void *key, const void *extent, size_t off, size_t size,
                              bool free),
                  void *ctx) {
  struct um__segs *s = p->segs;
  if (s == NULL)
    return;
  pthread_mutex_lock(&s->lock);
  for (const um__seg *g = s->list; g != NULL; g = g->next) {
    um__seg_view v = {.key = g, .mem = &g->mem, .size = g->size,
                      .committed = g->virt ? g->committed_bytes : g->size, .virt = g->virt};
    seg(ctx, &v);
    for (const um__extent *e = g->first; e != NULL; e = e->next)
      ext(ctx, g, e, e->off, e->size, e->free);
  }
  pthread_mutex_unlock(&s->lock);
}
