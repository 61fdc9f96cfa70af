/* mem/: blocks and their descriptors, the pool's bins, the thread caches
 * (tcache.h), trim, the quarantine, and the calls up into the layers
 * above that they register here. */
#ifndef UNIMEM_MEM_H
#define UNIMEM_MEM_H

#ifndef UM__SEES_MEM
#error "mem.h: this folder may not include mem/ (src/README.md)"
#endif

#include "device.h"

/* ------------------------------------------------------------------------ */
/* Calls up (hooks.c). A lower layer never calls a higher one by name: the
 * higher one fills in its entries here once, at load time (a constructor
 * in the file that defines them), and a lower one calls through them. An
 * entry is NULL where its part is not linked in (a static link that uses
 * none of it), and then has nothing to do. */
typedef struct um__upcalls {
  struct {
    /* engine.c, event.c: a manager's engine, its event objects. */
    int (*engine_start)(um_manager *m);
    void (*engine_stop)(um_manager *m);
    void (*engine_drain)(um_manager *m);
    void (*events_drop_natives)(um_manager *m);
    void (*events_free_all)(um_manager *m);
    /* op.c: whether a wait for what was issued on b (b's lock held)
     * passes through an open bracket. */
    bool (*waits_bracket_locked)(const um_buffer *b, bool own_ends);
    /* queue.c: the destroying thread's queues of the caller's on m's
     * devices are forgotten (a device gone cannot be set back to NULL). */
    void (*queues_forget)(um_manager *m);
  } ops;
  struct {
    /* access.c: take b's open bracket (b's lock held), end it behind what
     * was queued; end every bracket left open. */
    um_event *(*take_locked)(um_buffer *b);
    void (*end_taken)(um_event *op);
    void (*end_all)(um_manager *m);
  } brackets;
  struct {
    /* net.c: a buffer's release revokes what it exposed; memory a peer
     * may still write is held; a buffer um_net_alloc made; the net's part
     * of a manager's destroy; held memory that peers can no longer write
     * goes back. */
    int (*buffer_released)(um_buffer *b);
    bool (*hold)(um_buffer *b);
    bool (*allocated)(const um_buffer *b);
    void (*manager_destroy)(um_manager *m);
    void (*reap)(void);
  } net;
  struct {
    /* core/observe.c: idle memory went back to d while m observes. */
    void (*trimmed)(um_device *d, uint64_t bytes);
  } obs;
} um__upcalls;
extern um__upcalls um__upcall;
/* A trim gave bytes of d back: counted, and told to an observer. */
static inline void um__trimmed(um_device *d, uint64_t bytes) {
  UM__STAT_ADD(d, bytes_trimmed, bytes);
  if (__builtin_expect(atomic_load_explicit(&d->m->observing, memory_order_relaxed) != 0, 0) &&
      um__upcall.obs.trimmed != NULL)
    um__upcall.obs.trimmed(d, bytes);
}

/* ------------------------------------------------------------------------ */
/* Descriptors */
/* A descriptor's per-owner state from the last owner's operations,
 * mappings and bracket (coherence, mapping, chain, flags) back to what a
 * new owner starts with. A block in a thread cache's slot is kept this way
 * (tcache.h): a release puts it there with this done, or without (the fast
 * path) only when no operation, mapping or bracket touched it. */
static inline void um__buffer_clean(um_buffer *b) {
  memset(&b->valid, 0, offsetof(um_buffer, access_op) + sizeof(b->access_op) - offsetof(um_buffer, valid));
  b->valid = b->mem.host ? (UM_VALID_HOST | UM_VALID_DEVICE) : UM_VALID_DEVICE;
  /* Written only when set (a wrap's, which no pool holds): a racing stale
   * handle's checks read these without the lock, and a pooled block's never
   * change. */
  if (b->readonly)
    b->readonly = false;
  if (b->pinned_wrap)
    b->pinned_wrap = false;
  atomic_store_explicit(&b->touched, false, memory_order_relaxed);
}

/* A clean descriptor (um__buffer_clean) goes to a new owner: its
 * generation, size and site; mem, dev, loc and kind are set by the caller.
 * Inline: it is on the pool hit's path. holds and dlpack_tensors are reset
 * here too, against a stale handle's retain racing the last release. */
static inline void um__buffer_go_live_clean(um_buffer *b, size_t bytes, const char *file, int line) {
  /* Only the thread making the descriptor live writes gen: no locked add. */
  atomic_store_explicit(&b->gen, atomic_load_explicit(&b->gen, memory_order_relaxed) + 1,
                        memory_order_release);
  b->size = bytes;
  atomic_store_explicit(&b->holds, 0, memory_order_relaxed);
  atomic_store_explicit(&b->dlpack_tensors, 0, memory_order_relaxed);
  b->site_file = file;
  b->site_line = line;
}

/* Reset a descriptor's per-owner state for a new owner, whatever its last
 * owner did with it. */
static inline void um__buffer_init_live(um_buffer *b, size_t bytes, const char *file, int line) {
  um__buffer_clean(b);
  um__buffer_go_live_clean(b, bytes, file, line);
}


/* ------------------------------------------------------------------------ */
/* trim.c: move the caches' blocks to the bins, then free idle blocks,
 * oldest first, until at most keep bytes stay idle in the manager (dev ==
 * NULL) or on one device; bytes freed. for_pressure: every idle block of d
 * (the quarantine's too, in debug mode) before an allocation is retried. */
uint64_t um__trim(um_manager *m, um_device *dev, uint64_t keep);
void um__trim_for_pressure(um_device *d);
int um__trim_thread_start(um_manager *m);
void um__trim_thread_stop(um_manager *m);

/* quarantine.c: debug mode keeps released buffers from reuse. Bounds: a
 * buffer leaves after this many later releases, or once the quarantined
 * blocks hold more than this many bytes (the newest always stays). Freed
 * host bytes are overwritten with UM__POISON_BYTE. */
#define UM__QUARANTINE_MAX_BUFFERS 1024u
#define UM__QUARANTINE_MAX_BYTES (64ull << 20)
#define UM__POISON_BYTE 0xDE
void um__quarantine_put(um_buffer *b);
/* Every quarantined buffer to its owner (at destroy). */
void um__quarantine_flush(um_manager *m);
/* Give the device's quarantined blocks back to it, keeping their handles
 * quarantined (pressure, um_pool_trim). */
void um__quarantine_drop_blocks(um_manager *m, um_device *d);

/* block_return.c: a released buffer's block goes back to its owner (pool,
 * device, caller, file) and the descriptor to the husks unless pooled;
 * return_borrowed: only what a wrap or a mapped file borrowed (unpin,
 * unmap), at once. */
void um__buffer_to_owner(um_buffer *b);
void um__buffer_return_borrowed(um_buffer *b);


/* ------------------------------------------------------------------------ */
/* Pool (tcache.h declares the thread caches) */

/* pool.c */
void um__pool_init(um__pool *p, um_device *dev, um_location loc);
void um__pool_destroy(um__pool *p);
/* The newest idle block of class cls, or NULL. */
um_buffer *um__pool_take(um__pool *p, int cls);
/* Put b idle in its bin, or free it when the limits say no: put stamps a
 * new idle_key; put_aged keeps b's (a block displaced from a cache slot,
 * counted as trimmed if freed); put_reserved moves a block out of a cache
 * slot with the slot's budget. */
void um__pool_put(um__pool *p, um_buffer *b);
void um__pool_put_aged(um__pool *p, um_buffer *b);
void um__pool_put_reserved(um__pool *p, um_buffer *b);
/* Thread-cache slots: hold budget for one block of class cls (false when
 * a limit says no), give it back. */
bool um__pool_reserve(um__pool *p, int cls);
void um__pool_unreserve(um__pool *p, int cls);
/* Free d's blocks idle since before cutoff_ns (all: UINT64_MAX); free the
 * oldest until at most keep bytes stay idle. Bytes freed. */
uint64_t um__pool_free_idle(um_device *d, uint64_t cutoff_ns);
uint64_t um__pool_free_oldest(um_manager *m, um_device *dev, uint64_t keep);
/* Every idle block of p's bins back to its segment, where it merges with
 * its free neighbours (not counted as trims): room for a carve. Bytes. */
uint64_t um__pool_return_idle(um__pool *p);
void um__pool_largest(um__pool *p, uint64_t *largest);
/* The next idle_key, for a block going idle on the calling thread. */
uint64_t um__idle_key_next(um_manager *m);
/* The pool went from empty to not empty: wake the trim timer. */
void um__pool_notify_idle(um_manager *m);

/* ------------------------------------------------------------------------ */
/* Segments (segment.c): where p->segs is set, pooled blocks are carved from
 * the pool's segments. */

/* Set p->segs where um_options.segments is on and the device can carve at
 * p's location; free them (every block has come back). */
void um__seg_init(um__pool *p);
void um__seg_destroy(um__pool *p);
/* A block of cap bytes from the best-fitting free extent: UM_OK, UM_ENOMEM
 * with no message when no free extent fits (or, commit false, none fits
 * without committing new memory of a virtual segment), or the backend's
 * error. */
int um__seg_carve(um__pool *p, size_t cap, bool commit, um__mem *out);
/* The size of a new segment for a block of cap bytes (0: too large); the
 * size of one that holds just that block. */
size_t um__seg_size_for(const um__pool *p, size_t cap);
size_t um__seg_exact_size(const um__pool *p, size_t cap);
/* Blocks of more than UM__SEG_SMALL bytes carved from segments are carved
 * at their size (rounded up to the granule, or the device's alignment
 * where larger) rather than their class's, which rounds up by as much as a
 * quarter. Such a block (um__seg_direct: smaller than its class) waits in
 * its thread's cache slot of the class, where an exact repeat takes it at
 * a hit's speed (a larger request of the class gives it back first:
 * buffer.c), and never in a bin: from anywhere else it goes back to its
 * extent, merged. The capacity of such a block of p for bytes; 0 when p's
 * blocks of that size keep their class (no segments, or a small block). */
#define UM__SEG_SMALL ((size_t)1 << 20)
size_t um__seg_large_cap(const um__pool *p, size_t bytes);
static inline bool um__seg_direct(const um_buffer *b) {
  return b->mem.carved != NULL && b->capacity > UM__SEG_SMALL && b->capacity != um__class_size(b->cls);
}
/* mem (bytes, from um__block_alloc) becomes a segment of p, and a block of
 * cap bytes is carved from it; on failure the memory has gone back. */
int um__seg_add_and_carve(um__pool *p, const um__mem *mem, size_t bytes, size_t cap, um__mem *out);
/* Give back p's wholly free segments, oldest first, that became so before
 * cutoff_ns, while p's segments hold more than keep bytes. Bytes freed. */
uint64_t um__seg_shed(um__pool *p, uint64_t keep, uint64_t cutoff_ns);
/* Give back the memory inside every free extent of p's virtual segments.
 * Bytes. */
uint64_t um__seg_discard(um__pool *p);
/* A trim's part: um__seg_shed, then, while more than keep bytes are held
 * and no block was carved since cutoff_ns, the memory of free extents.
 * Bytes given back. */
uint64_t um__seg_trim(um__pool *p, uint64_t keep, uint64_t cutoff_ns);
/* A new segment of bytes is about to be made: give back wholly free ones
 * that would leave the pool holding much more than its blocks need. */
void um__seg_before_grow(um__pool *p, size_t bytes);
/* A carved block of cap bytes goes back to its extent (um__block_free
 * calls this). */
void um__seg_release(um__pool *p, um__mem *mem, size_t cap);
/* segments; held_bytes: what they hold from the device (virtual ones as
 * far as committed); free_bytes: of that, what no block uses; the free
 * extents and the largest (address space, for virtual segments). */
typedef struct um__seg_stats {
  uint64_t segments, held_bytes, free_bytes, free_extents, largest_free;
} um__seg_stats;
void um__seg_stats_add(um__pool *p, um__seg_stats *out);
/* The snapshot's walk of p's segments, under their lock: seg for each
 * (key: the segment's identity), then ext for each of its extents in
 * address order, free or carved (extent: what a carved block's
 * mem.carved holds). */
typedef struct um__seg_view {
  const void *key;
  const um__mem *mem;
  size_t size, committed;
  bool virt;
} um__seg_view;
void um__seg_walk(um__pool *p, void (*seg)(void *ctx, const um__seg_view *v),
                  void (*ext)(void *ctx, const void *key, const void *extent, size_t off, size_t size,
                              bool free),
                  void *ctx);

/* ------------------------------------------------------------------------ */
/* Blocks */

/* block.c */
int um__block_alloc(um_device *d, um_location loc, size_t bytes, um__mem *mem);
/* A block from um__block_alloc goes back to the device; a carved one
 * (mem->carved) to its segment. */
void um__block_free(um_device *d, um_location loc, size_t bytes, um__mem *mem);
/* Set b's first bytes to zero (UM_ALLOC_ZERO, scrub). */
int um__block_zero(um_buffer *b, size_t bytes);
/* A descriptor for a new block: a husk, or a new one on the registry. */
um_buffer *um__descriptor_get(um_manager *m);
/* b holds no block any more: a husk until the next allocation. */
void um__descriptor_put(um_manager *m, um_buffer *b);
void um__descriptors_free_all(um_manager *m);
/* Pinned staging chunks (staging_chunk_bytes each), kept per device up to
 * pinned_pool_bytes. */
int um__staging_get(um_device *d, um__mem *out);
void um__staging_put(um_device *d, um__mem *mem);
void um__staging_free_all(um_device *d);


#endif /* UNIMEM_MEM_H */
