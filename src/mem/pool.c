/* The pool: idle blocks per (device, location), one bin per size class.
 *
 * In front of the bins sit the thread caches (tcache.h): one idle block per
 * (thread, device, location, class), reached without a lock. The two files
 * are one layer: a cache's block moves to its bin with um__pool_put_reserved,
 * and making room in a full pool frees the bins' oldest blocks, and moves
 * the caches' blocks to the bins when the bins hold none older than the
 * block going idle (claim_with_room). Trims
 * (trim.c) sit above both.
 *
 * Verbs: put (a block goes idle in its bin), take (a block leaves its bin
 * for a new owner), free (an idle block goes back to its device and its
 * descriptor to the husks).
 *
 * Invariants (checked by tests/internals/test_pool_basic.c, test_pool_fast.c and
 * the stress test, test_pool_stress.c):
 * - a block is in at most one bin or one cache slot, and only while its
 *   descriptor is IDLE;
 * - bin->idle_bytes is the sum of the capacities in the bin;
 * - the manager's bytes_pooled is the sum over all bins (the stats add the
 *   blocks in caches), and never less than what the bins hold: it grows
 *   before a block is visible in a bin and shrinks after one left;
 * - budget: pool_claimed = sum over bins of (idle_bytes + reserved_bytes),
 *   and pool_claimed <= max_pool_bytes; per bin, idle_bytes +
 *   reserved_bytes <= max_pool_bytes_per_class. A block in a cache slot is
 *   covered by its slot's reserved budget, so idle bytes in bins and caches
 *   together never exceed either limit.
 * - a bin is sorted on idle_key, newest at the head: allocations take the
 *   newest (warm in caches and TLBs), trims the oldest.
 * Lock order: m->trimming, then m->tcache_lock, then a bin's lock, then
 * m->trim_lock. A bin's lock is never held while another bin's is taken,
 * and never while calling the backend (a device free can be slow). */
#include <string.h>

#include "tcache.h"
#include "list.h"
#include "testhook.h"

void um__pool_init(um__pool *p, um_device *dev, um_location loc) {
  p->dev = dev;
  p->loc = loc;
  for (int i = 0; i < UM__CLASS_COUNT; i++) {
    pthread_mutex_init(&p->bins[i].lock, NULL);
    p->bins[i].head = p->bins[i].tail = NULL;
    p->bins[i].idle_bytes = 0;
    p->bins[i].reserved_bytes = 0;
  }
  for (size_t w = 0; w < sizeof(p->nonempty) / sizeof(p->nonempty[0]); w++)
    atomic_init(&p->nonempty[w], 0);
  um__seg_init(p);
}

/* ------------------------------------------------------------------------ */
/* Budget, idle bytes and order */

static bool claim(um_manager *m, uint64_t bytes) {
  /* The segments' free bytes are idle memory too (segment.c). */
  uint64_t max = m->opts.max_pool_bytes, seg = (uint64_t)um__atomic_load_relaxed(&m->seg_free);
  max -= seg < max ? seg : max;
  uint_fast64_t cur = um__atomic_load_relaxed(&m->pool_claimed);
  do {
    if (bytes > max || cur > max - bytes)
      return false;
  } while (!atomic_compare_exchange_weak_explicit(&m->pool_claimed, &cur, cur + bytes,
                                                  memory_order_relaxed, memory_order_relaxed));
  return true;
}

static void unclaim(um_manager *m, uint64_t bytes) { um__atomic_sub_relaxed(&m->pool_claimed, bytes); }

/* Returns the manager's pooled bytes before the addition. */
static uint64_t pooled_add(um_device *d, uint64_t bytes) {
  um__atomic_add_relaxed(&d->stats.bytes_pooled, bytes);
  return (uint64_t)um__atomic_add_relaxed(&d->m->bytes_pooled, bytes);
}

static void pooled_sub(um_device *d, uint64_t bytes) {
  um__atomic_sub_relaxed(&d->stats.bytes_pooled, bytes);
  um__atomic_sub_relaxed(&d->m->bytes_pooled, bytes);
}

uint64_t um__idle_key_next(um_manager *m) {
  um__tcache *tc = um__tcache_last;
  uint64_t k;
  if (tc != NULL && atomic_load_explicit(&tc->m, memory_order_relaxed) == m) {
    k = um__tcache_key(tc, m);
    um__atomic_max_relaxed(&m->idle_clock, k);
    return k;
  }
  return (uint64_t)um__atomic_add_relaxed(&m->idle_clock, 1) + 1;
}

/* Wake the trim timer (trim.c); called when the pool goes from empty to
 * not empty, so a release pays for the lock only on that transition. */
void um__pool_notify_idle(um_manager *m) {
  if (!um__atomic_load_acquire(&m->trim_running))
    return;
  pthread_mutex_lock(&m->trim_lock);
  pthread_cond_signal(&m->trim_cond);
  pthread_mutex_unlock(&m->trim_lock);
}

/* ------------------------------------------------------------------------ */
/* Bins. Sorted on idle_key, newest at the head: a block from a thread
 * cache keeps its key, so it can go in behind newer ones. */

static void mark(um__pool *p, int cls, bool nonempty) {
  atomic_uint_fast64_t *w = &p->nonempty[cls / 64];
  uint64_t bit = (uint64_t)1 << (cls % 64);
  if (nonempty)
    atomic_fetch_or_explicit(w, bit, memory_order_relaxed);
  else
    atomic_fetch_and_explicit(w, ~bit, memory_order_relaxed);
}

/* for (each class cls whose bin of p holds a block, as far as the bitmap
 * knows: the body confirms under the bin's lock). No break inside. */
#define FOR_NONEMPTY_BINS(p, cls)                                                                  \
  for (size_t w_ = 0; w_ < sizeof((p)->nonempty) / sizeof((p)->nonempty[0]); w_++)                \
    for (uint64_t bits_ = um__atomic_load_relaxed(&(p)->nonempty[w_]); bits_ != 0;                 \
         bits_ &= bits_ - 1)                                                                       \
      for (int cls = (int)(w_ * 64) + __builtin_ctzll(bits_), once_ = 1; once_; once_ = 0)

static void bin_insert(um__pool *p, um__bin *bin, um_buffer *b) {
  um_buffer *after = NULL, *at = bin->head;
  while (at != NULL && at->idle_key > b->idle_key) {
    after = at;
    at = at->pool_next;
  }
  b->pool_prev = after;
  b->pool_next = at;
  if (after)
    after->pool_next = b;
  else
    bin->head = b;
  if (at)
    at->pool_prev = b;
  else
    bin->tail = b;
  if (bin->idle_bytes == 0)
    mark(p, b->cls, true);
  bin->idle_bytes += b->capacity;
}

static void bin_unlink(um__pool *p, um__bin *bin, um_buffer *b) {
  if (b->pool_next == NULL)
    bin->tail = b->pool_prev;
  UM__LIST_UNLINK(bin->head, b, pool_prev, pool_next);
  b->pool_prev = b->pool_next = NULL;
  bin->idle_bytes -= b->capacity;
  if (bin->idle_bytes == 0)
    mark(p, b->cls, false);
}

/* A block in no bin and holding no budget goes back to its device, its
 * descriptor to the husks; one that was idle (pooled) counts as trimmed.
 * The counts move in this order: bytes_reserved down, bytes_trimmed up,
 * trims up; a reader that waits for trims to move (the trim timer's test)
 * then finds the others moved too (each count is an atomic add, a full
 * barrier on x86). */
static void free_to_device(um_buffer *b, bool was_idle) {
  um_device *d = b->dev;
  /* A carved block goes back to its segment, still held: the segments
   * count what they give back themselves (segment.c). */
  bool counted = was_idle && b->mem.carved == NULL;
  um__block_free(d, b->loc, b->capacity, &b->mem);
  if (counted) {
    um__trimmed(d, b->capacity);
    UM__STAT_ADD(d, trims, 1);
  }
  um__descriptor_put(b->m, b);
}

/* An idle block just unlinked from its bin goes back to its device. Called
 * with no lock held. */
static void free_unlinked(um_buffer *b, bool trimmed) {
  pooled_sub(b->dev, b->capacity);
  unclaim(b->m, b->capacity);
  free_to_device(b, trimmed);
}

void um__pool_destroy(um__pool *p) {
  for (int i = 0; i < UM__CLASS_COUNT; i++) {
    um__bin *bin = &p->bins[i];
    while (bin->tail) {
      um_buffer *b = bin->tail;
      bin_unlink(p, bin, b);
      free_unlinked(b, false);
    }
    pthread_mutex_destroy(&bin->lock);
  }
  um__seg_destroy(p);
}

um_buffer *um__pool_take(um__pool *p, int cls) {
  um__bin *bin = &p->bins[cls];
  um_buffer *b;
  if (!(um__atomic_load_relaxed(&p->nonempty[cls / 64]) & ((uint64_t)1 << (cls % 64))))
    return NULL; /* a miss needs no lock */
  pthread_mutex_lock(&bin->lock);
  b = bin->head;
  if (b != NULL)
    bin_unlink(p, bin, b);
  pthread_mutex_unlock(&bin->lock);
  if (b != NULL) {
    pooled_sub(p->dev, b->capacity);
    unclaim(p->dev->m, b->capacity);
  }
  return b;
}

/* The oldest idle block in the bins of the manager (or one device) with an
 * idle_key below max_key, unlinked; NULL when there is none. Linear in the
 * number of non-empty bins, which is fine for a trim (rare, and it frees
 * memory, which costs far more). */
static um__bin *oldest_bin(um_manager *m, um_device *only, um__pool **pool, uint64_t *key) {
  um__bin *best = NULL;
  *key = UINT64_MAX;
  for (int di = 0; di < um__ndevices(m); di++) {
    um_device *d = m->devices[di];
    if (only != NULL && d != only)
      continue;
    for (int l = 0; l < UM_LOCATION_COUNT; l++) {
      um__pool *p = &d->pools[l];
      FOR_NONEMPTY_BINS(p, c) {
        um__bin *bin = &p->bins[c];
        uint64_t k;
        pthread_mutex_lock(&bin->lock);
        k = bin->tail ? bin->tail->idle_key : UINT64_MAX;
        pthread_mutex_unlock(&bin->lock);
        if (k < *key) {
          *key = k;
          best = bin;
          *pool = p;
        }
      }
    }
  }
  return best;
}

static um_buffer *take_oldest(um_manager *m, um_device *only, uint64_t max_key) {
  for (;;) {
    um__pool *p = NULL;
    uint64_t key;
    um__bin *bin = oldest_bin(m, only, &p, &key);
    um_buffer *b;
    if (bin == NULL || key >= max_key)
      return NULL;
    pthread_mutex_lock(&bin->lock);
    b = bin->tail;
    if (b != NULL && b->idle_key == key) {
      bin_unlink(p, bin, b);
      pthread_mutex_unlock(&bin->lock);
      return b;
    }
    pthread_mutex_unlock(&bin->lock); /* raced with a taker: look again */
  }
}

/* Claim budget for a block going idle with idle_key key, making room by
 * freeing idle blocks older than it, oldest first: first those in the
 * bins; only when the bins hold none older, the thread caches' blocks move
 * to the bins (keeping their order) and the oldest of all goes. A cache
 * slot holds its thread's most recent block of its class, so the caches
 * rarely hold the oldest, and a pool at its limit does not flush every
 * thread's cache (and send every thread down the slow path) on each
 * release. false when only newer blocks, or empty slots of thread caches,
 * hold the budget (the owners are then asked to give theirs back). */
static bool claim_with_room(um_manager *m, uint64_t cap, uint64_t key) {
  bool flushed = false;
  while (!claim(m, cap)) {
    um_buffer *old = take_oldest(m, NULL, key);
    if (old != NULL) {
      free_unlinked(old, true);
      continue;
    }
    if (flushed) {
      um__atomic_add_relaxed(&m->flush_epoch, 1u);
      return false;
    }
    flushed = true;
    um__tcache_flush_all(m, NULL);
  }
  return true;
}

/* Under the bin's lock, with the budget claimed: make room in the class by
 * freeing its blocks older than b; false when b does not fit (b is the
 * oldest, or thread caches' empty slots hold the class's budget). */
static bool class_room_locked(um__pool *p, um__bin *bin, um_buffer *b) {
  uint64_t max = b->m->opts.max_pool_bytes_per_class;
  while (bin->idle_bytes + bin->reserved_bytes + b->capacity > max && bin->tail &&
         bin->tail->idle_key < b->idle_key) {
    um_buffer *old = bin->tail;
    bin_unlink(p, bin, old);
    pthread_mutex_unlock(&bin->lock);
    free_unlinked(old, true);
    pthread_mutex_lock(&bin->lock);
  }
  return bin->idle_bytes + bin->reserved_bytes + b->capacity <= max;
}

/* Keep b idle in its bin, within both limits, or free it. */
static void put_block(um__pool *p, um_buffer *b, bool was_idle) {
  um_manager *m = b->m;
  um__bin *bin = &p->bins[b->cls];
  uint64_t cap = b->capacity, pooled_before;

  if (um__seg_direct(b) || cap > m->opts.max_pool_bytes || cap > m->opts.max_pool_bytes_per_class ||
      !claim_with_room(m, cap, b->idle_key)) {
    free_to_device(b, was_idle);
    return;
  }
  b->idle_since_ns = um__now_ns();
  atomic_store_explicit(&b->state, UM__BUF_IDLE, memory_order_release);
  pthread_mutex_lock(&bin->lock);
  if (!class_room_locked(p, bin, b)) {
    bool slots_hold = bin->reserved_bytes != 0;
    pthread_mutex_unlock(&bin->lock);
    unclaim(m, cap);
    if (slots_hold)
      um__atomic_add_relaxed(&m->flush_epoch, 1u);
    free_to_device(b, was_idle);
    return;
  }
  /* Counted before b can be seen in the bin: a taker subtracts only after
   * it found b there, so the figure never goes below zero. */
  pooled_before = pooled_add(p->dev, cap);
  bin_insert(p, bin, b);
  pthread_mutex_unlock(&bin->lock);
  /* b may be taken and reused as soon as the lock is released */
  UM__TEST_POINT(UM__TP_POOL_PUT, b);
  if (pooled_before == 0)
    um__pool_notify_idle(m);
}

void um__pool_put(um__pool *p, um_buffer *b) {
  b->idle_key = um__idle_key_next(b->m);
  put_block(p, b, false);
}

void um__pool_put_aged(um__pool *p, um_buffer *b) { put_block(p, b, true); }

/* ------------------------------------------------------------------------ */
/* Thread-cache slots */

bool um__pool_reserve(um__pool *p, int cls) {
  um_manager *m = p->dev->m;
  um__bin *bin = &p->bins[cls];
  uint64_t cap = um__class_size(cls);
  bool ok;
  if (cap > m->opts.max_pool_bytes_per_class || !claim(m, cap))
    return false;
  pthread_mutex_lock(&bin->lock);
  ok = bin->idle_bytes + bin->reserved_bytes + cap <= m->opts.max_pool_bytes_per_class;
  if (ok)
    bin->reserved_bytes += cap;
  pthread_mutex_unlock(&bin->lock);
  if (!ok) {
    unclaim(m, cap);
    return false;
  }
  atomic_fetch_add(&m->reserve_seq, 1u);
  if (atomic_load(&m->trim_asleep))
    um__pool_notify_idle(m);
  return true;
}

void um__pool_unreserve(um__pool *p, int cls) {
  um__bin *bin = &p->bins[cls];
  uint64_t cap = um__class_size(cls);
  pthread_mutex_lock(&bin->lock);
  bin->reserved_bytes -= cap;
  pthread_mutex_unlock(&bin->lock);
  unclaim(p->dev->m, cap);
}

void um__pool_put_reserved(um__pool *p, um_buffer *b) {
  um__bin *bin = &p->bins[b->cls];
  /* Its time in the cache is unknown: for the timer it is idle from now
   * (freed one interval after this move at the earliest); its idle_key
   * keeps its place in the order. */
  uint64_t cap = b->capacity, pooled_before;
  if (um__seg_direct(b)) { /* the slot's budget is its class's; the block goes to its extent (mem.h) */
    um__pool_unreserve(p, b->cls);
    free_to_device(b, false);
    return;
  }
  b->idle_since_ns = um__now_ns();
  pthread_mutex_lock(&bin->lock);
  bin->reserved_bytes -= cap;
  pooled_before = pooled_add(p->dev, cap); /* before b is visible */
  bin_insert(p, bin, b);
  pthread_mutex_unlock(&bin->lock);
  /* b may be taken and reused as soon as the lock is released */
  UM__TEST_POINT(UM__TP_POOL_PUT, b);
  if (pooled_before == 0)
    um__pool_notify_idle(p->dev->m);
}

/* ------------------------------------------------------------------------ */
/* Freeing idle blocks (trim.c decides when) */

/* Free p's blocks idle since before cutoff_ns; trimmed: counted as trims. */
static uint64_t free_idle_of(um__pool *p, uint64_t cutoff_ns, bool trimmed) {
  uint64_t freed = 0;
  /* Order does not matter when everything that qualifies goes. */
  FOR_NONEMPTY_BINS(p, c) {
    um__bin *bin = &p->bins[c];
    um_buffer *out = NULL;
    pthread_mutex_lock(&bin->lock);
    for (um_buffer *b = bin->tail, *prev; b != NULL; b = prev) {
      prev = b->pool_prev;
      if (b->idle_since_ns < cutoff_ns) {
        bin_unlink(p, bin, b);
        b->pool_next = out;
        out = b;
      }
    }
    pthread_mutex_unlock(&bin->lock);
    while (out != NULL) {
      um_buffer *next = out->pool_next;
      out->pool_next = NULL;
      freed += out->capacity;
      free_unlinked(out, trimmed);
      out = next;
    }
  }
  return freed;
}

uint64_t um__pool_free_idle(um_device *d, uint64_t cutoff_ns) {
  uint64_t freed = 0;
  for (int l = 0; l < UM_LOCATION_COUNT; l++)
    freed += free_idle_of(&d->pools[l], cutoff_ns, true);
  return freed;
}

uint64_t um__pool_return_idle(um__pool *p) { return free_idle_of(p, UINT64_MAX, false); }

uint64_t um__pool_free_oldest(um_manager *m, um_device *dev, uint64_t keep) {
  uint64_t freed = 0;
  for (;;) {
    uint64_t pooled = dev ? um__atomic_load_relaxed(&dev->stats.bytes_pooled)
                          : um__atomic_load_relaxed(&m->bytes_pooled);
    um_buffer *b;
    if (pooled <= keep || (b = take_oldest(m, dev, UINT64_MAX)) == NULL)
      return freed;
    freed += b->capacity;
    free_unlinked(b, true);
  }
}

void um__pool_largest(um__pool *p, uint64_t *largest) {
  for (int w = (int)(sizeof(p->nonempty) / sizeof(p->nonempty[0])) - 1; w >= 0; w--) {
    uint64_t bits = um__atomic_load_relaxed(&p->nonempty[w]);
    while (bits != 0) {
      int c = w * 64 + 63 - __builtin_clzll(bits);
      um__bin *bin = &p->bins[c];
      bool any;
      pthread_mutex_lock(&bin->lock);
      any = bin->head != NULL;
      pthread_mutex_unlock(&bin->lock);
      if (any) {
        uint64_t sz = um__class_size(c);
        if (sz > *largest)
          *largest = sz;
        return;
      }
      bits &= ~((uint64_t)1 << (c % 64));
    }
  }
}
