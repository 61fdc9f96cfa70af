/* The pool: idle blocks per (device, location), one bin per size class.
 *
 * In front of the bins sit the thread caches (tcache.h): one idle block per
 * (thread, device, location, class), reached without a lock. Every trim
 * first moves the caches' blocks into the bins (um__tcache_flush_all), then
 * frees from the bins, oldest first.
 *
 * Invariants (checked by tests/test_pool_basic.c, test_pool_fast.c and
 * the stress test, test_pool_stress.c):
 * - a block is in at most one bin or one cache slot, and only while its
 *   descriptor is IDLE;
 * - bin->idle_bytes is the sum of the capacities in the bin;
 * - the manager's bytes_pooled is the sum over all bins (the stats add the
 *   blocks in caches);
 * - budget: pool_claimed = sum over bins of (idle_bytes + reserved_bytes),
 *   and pool_claimed <= max_pool_bytes; per bin, idle_bytes +
 *   reserved_bytes <= max_pool_bytes_per_class. A block in a cache slot is
 *   covered by its slot's reserved budget, so idle bytes in bins and caches
 *   together never exceed either limit.
 * - a bin is sorted on idle_key, newest at the head: allocations take the
 *   newest (warm in caches and TLBs), trims the oldest.
 * Lock order: m->trimming, then m->tcache_lock, then a bin's lock, then
 * m->trim_lock. A bin's
 * lock is never held while another bin's is taken, and never while calling
 * the backend (a device free can be slow). */
#include <errno.h>
#include <string.h>
#include <time.h>

#include "tcache.h"
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
}

/* ------------------------------------------------------------------------ */
/* Budget and order */

bool um__pool_claim(um_manager *m, uint64_t bytes) {
  uint64_t max = m->opts.max_pool_bytes;
  uint_fast64_t cur = um__atomic_load_relaxed(&m->pool_claimed);
  do {
    if (bytes > max || cur > max - bytes)
      return false;
  } while (!atomic_compare_exchange_weak_explicit(&m->pool_claimed, &cur, cur + bytes,
                                                  memory_order_relaxed, memory_order_relaxed));
  return true;
}

void um__pool_unclaim(um_manager *m, uint64_t bytes) {
  um__atomic_sub_relaxed(&m->pool_claimed, bytes);
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
  if (b->pool_prev)
    b->pool_prev->pool_next = b->pool_next;
  else
    bin->head = b->pool_next;
  if (b->pool_next)
    b->pool_next->pool_prev = b->pool_prev;
  else
    bin->tail = b->pool_prev;
  b->pool_prev = b->pool_next = NULL;
  bin->idle_bytes -= b->capacity;
  if (bin->idle_bytes == 0)
    mark(p, b->cls, false);
}

/* Free a block that is in no bin and holds no budget; a block that was
 * idle (pooled) counts as trimmed. */
static void free_unpooled(um_buffer *b, bool was_idle) {
  if (was_idle) {
    UM__STAT_ADD(b->dev, trims, 1);
    UM__STAT_ADD(b->dev, bytes_trimmed, b->capacity);
  }
  um__block_free(b->dev, b->loc, b->capacity, &b->mem);
  um__descriptor_put(b->m, b);
}

/* Give an idle block, just unlinked from its bin, back to its device; the
 * descriptor becomes a husk for reuse. Called with no lock held. */
static void release_block(um_buffer *b, bool trimmed) {
  um__stat_pooled_sub(b->dev, b->capacity);
  um__pool_unclaim(b->m, b->capacity);
  free_unpooled(b, trimmed);
}

void um__pool_destroy(um__pool *p) {
  for (int i = 0; i < UM__CLASS_COUNT; i++) {
    um__bin *bin = &p->bins[i];
    while (bin->tail) {
      um_buffer *b = bin->tail;
      bin_unlink(p, bin, b);
      release_block(b, false);
    }
    pthread_mutex_destroy(&bin->lock);
  }
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
    um__stat_pooled_sub(p->dev, b->capacity);
    um__pool_unclaim(p->dev->m, b->capacity);
  }
  return b;
}

/* The oldest idle block in the bins of the manager (or one device) with an
 * idle_key below max_key, unlinked; NULL when there is none. Linear in the
 * number of non-empty bins, which is fine for a trim (rare, and it frees
 * memory, which costs far more). */
static um_buffer *take_oldest(um_manager *m, um_device *only, uint64_t max_key) {
  for (;;) {
    um__pool *best_p = NULL;
    um__bin *best = NULL;
    uint64_t best_k = UINT64_MAX;
    um_buffer *b;
    for (int di = 0; di < m->ndevices; di++) {
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
          if (k < best_k) {
            best_k = k;
            best = bin;
            best_p = p;
          }
        }
      }
    }
    if (best == NULL || best_k >= max_key)
      return NULL;
    pthread_mutex_lock(&best->lock);
    b = best->tail;
    if (b != NULL && b->idle_key == best_k) {
      bin_unlink(best_p, best, b);
      pthread_mutex_unlock(&best->lock);
      return b;
    }
    pthread_mutex_unlock(&best->lock); /* raced with a taker: look again */
  }
}

/* Claim budget for a block going idle with idle_key key, making room by
 * freeing idle blocks older than it, oldest first, those in thread caches
 * included (they move to the bins first, keeping their order); false when
 * only newer blocks, or empty slots of thread caches, hold the budget (the
 * owners are then asked to give theirs back). */
static bool claim_with_room(um_manager *m, uint64_t cap, uint64_t key) {
  bool flushed = false;
  while (!um__pool_claim(m, cap)) {
    um_buffer *old;
    if (!flushed) {
      flushed = true;
      um__tcache_flush_all(m, NULL);
      continue;
    }
    old = take_oldest(m, NULL, key);
    if (old == NULL) {
      um__atomic_add_relaxed(&m->flush_epoch, 1u);
      return false;
    }
    release_block(old, true);
  }
  return true;
}

/* Keep b idle in its bin, within both limits, or free it. */
static void give_block(um__pool *p, um_buffer *b, bool was_idle) {
  um_manager *m = b->m;
  const um_options *o = &m->opts;
  um__bin *bin = &p->bins[b->cls];
  uint64_t cap = b->capacity, pooled_before;

  if (cap > o->max_pool_bytes || cap > o->max_pool_bytes_per_class ||
      !claim_with_room(m, cap, b->idle_key)) {
    free_unpooled(b, was_idle);
    return;
  }
  b->idle_since_ns = um__now_ns();
  atomic_store_explicit(&b->state, UM__BUF_IDLE, memory_order_release);
  pthread_mutex_lock(&bin->lock);
  /* Make room in the class: its blocks older than b go first. */
  while (bin->idle_bytes + bin->reserved_bytes + cap > o->max_pool_bytes_per_class && bin->tail &&
         bin->tail->idle_key < b->idle_key) {
    um_buffer *old = bin->tail;
    bin_unlink(p, bin, old);
    pthread_mutex_unlock(&bin->lock);
    release_block(old, true);
    pthread_mutex_lock(&bin->lock);
  }
  if (bin->idle_bytes + bin->reserved_bytes + cap > o->max_pool_bytes_per_class) {
    /* b is the oldest, or thread caches' empty slots hold the budget. */
    bool slots_hold = bin->reserved_bytes != 0;
    pthread_mutex_unlock(&bin->lock);
    um__pool_unclaim(m, cap);
    if (slots_hold)
      um__atomic_add_relaxed(&m->flush_epoch, 1u);
    free_unpooled(b, was_idle);
    return;
  }
  /* Counted before b can be seen in the bin: a taker subtracts only after
   * it found b there, so the figure never goes below zero. */
  pooled_before = um__stat_pooled_add(p->dev, cap);
  bin_insert(p, bin, b);
  pthread_mutex_unlock(&bin->lock);
  /* b may be taken and reused as soon as the lock is released */
  UM__TEST_POINT(UM__TP_POOL_PUT, b);
  if (pooled_before == 0)
    um__trim_thread_kick(m);
}

void um__pool_give(um__pool *p, um_buffer *b) {
  b->idle_key = um__idle_key_next(b->m);
  give_block(p, b, false);
}

void um__pool_give_idle(um__pool *p, um_buffer *b) { give_block(p, b, true); }

/* ------------------------------------------------------------------------ */
/* Thread-cache slots */

bool um__pool_reserve(um__pool *p, int cls) {
  um_manager *m = p->dev->m;
  um__bin *bin = &p->bins[cls];
  uint64_t cap = um__class_size(cls);
  bool ok;
  if (cap > m->opts.max_pool_bytes_per_class || !um__pool_claim(m, cap))
    return false;
  pthread_mutex_lock(&bin->lock);
  ok = bin->idle_bytes + bin->reserved_bytes + cap <= m->opts.max_pool_bytes_per_class;
  if (ok)
    bin->reserved_bytes += cap;
  pthread_mutex_unlock(&bin->lock);
  if (!ok) {
    um__pool_unclaim(m, cap);
    return false;
  }
  atomic_fetch_add(&m->reserve_seq, 1u);
  if (atomic_load(&m->trim_asleep))
    um__trim_thread_kick(m);
  return true;
}

void um__pool_unreserve(um__pool *p, int cls) {
  um__bin *bin = &p->bins[cls];
  uint64_t cap = um__class_size(cls);
  pthread_mutex_lock(&bin->lock);
  bin->reserved_bytes -= cap;
  pthread_mutex_unlock(&bin->lock);
  um__pool_unclaim(p->dev->m, cap);
}

void um__pool_adopt(um__pool *p, um_buffer *b) {
  um__bin *bin = &p->bins[b->cls];
  /* Its time in the cache is unknown: for the timer it is idle from now
   * (freed one interval after this move at the earliest); its idle_key
   * keeps its place in the order. */
  uint64_t cap = b->capacity, pooled_before;
  b->idle_since_ns = um__now_ns();
  pthread_mutex_lock(&bin->lock);
  bin->reserved_bytes -= cap;
  pooled_before = um__stat_pooled_add(p->dev, cap); /* before b is visible */
  bin_insert(p, bin, b);
  pthread_mutex_unlock(&bin->lock);
  /* b may be taken and reused as soon as the lock is released */
  UM__TEST_POINT(UM__TP_POOL_PUT, b);
  if (pooled_before == 0)
    um__trim_thread_kick(p->dev->m);
}

/* ------------------------------------------------------------------------ */
/* Trims */

static uint64_t pooled_of(um_manager *m, um_device *d) {
  return d ? um__atomic_load_relaxed(&d->stats.bytes_pooled)
           : um__atomic_load_relaxed(&m->bytes_pooled);
}

/* Free the blocks of d's bins that went idle before cutoff_ns (all of them
 * for UINT64_MAX): order does not matter when everything that qualifies
 * goes. */
static uint64_t free_idle_before(um_device *d, uint64_t cutoff_ns) {
  uint64_t freed = 0;
  for (int l = 0; l < UM_LOCATION_COUNT; l++) {
    um__pool *p = &d->pools[l];
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
        release_block(out, true);
        out = next;
      }
    }
  }
  return freed;
}

uint64_t um__pool_trim(um_manager *m, um_device *dev, uint64_t keep) {
  uint64_t freed = 0;
  pthread_mutex_lock(&m->trimming);
  /* The caches' blocks join the bins, in their order. */
  um__tcache_flush_all(m, dev);
  if (keep == 0) {
    for (int i = 0; i < m->ndevices; i++)
      if (dev == NULL || m->devices[i] == dev)
        freed += free_idle_before(m->devices[i], UINT64_MAX);
  } else {
    while (pooled_of(m, dev) > keep) {
      um_buffer *b = take_oldest(m, dev, UINT64_MAX);
      if (b == NULL)
        break;
      freed += b->capacity;
      release_block(b, true);
    }
  }
  pthread_mutex_unlock(&m->trimming);
  return freed;
}

uint64_t um__pool_trim_older(um_manager *m, uint64_t cutoff_ns) {
  uint64_t freed = 0;
  for (int i = 0; i < m->ndevices; i++)
    freed += free_idle_before(m->devices[i], cutoff_ns);
  return freed;
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

int um_pool_trim(um_manager *m, uint64_t keep_bytes) {
  if (m == NULL)
    return um__set_error(UM_EINVAL, "um_pool_trim: manager is NULL");
  UM__CHECK_PROCESS(m);
  /* Debug mode: the blocks of quarantined buffers are idle memory too; their
   * handles stay quarantined (quarantine.c). */
  if (m->opts.debug)
    for (int i = 0; i < m->ndevices; i++)
      um__quarantine_drop_blocks(m, m->devices[i]);
  um__pool_trim(m, NULL, keep_bytes);
  return UM_OK;
}

/* ------------------------------------------------------------------------ */
/* The trim timer: a thread that frees blocks idle for trim_interval_ms. It
 * sleeps without a deadline while the pool is empty, so an idle process
 * does not wake up for nothing.
 *
 * Thread caches: each tick first moves every cached block into the bins
 * (stamped with the time of the move), so a block idle in a cache is freed
 * between one and one and a half intervals after the tick that moved it.
 * The tick also moves the flush epoch, which makes every owner give back
 * its empty slots' budget at its next call. "Nothing is idle" is then: the
 * bins are empty and no slot was reserved since the tick (a reservation
 * while the timer sleeps wakes it: um__pool_reserve). The one block that
 * can escape a tick is one put into a slot that was already reserved while
 * the tick ran; its owner moves it to the bins (waking the timer) at its
 * next call, when it sees the new epoch. */

static void *trim_main(void *arg) {
  um_manager *m = arg;
  uint64_t interval_ns = (uint64_t)m->opts.trim_interval_ms * 1000000ull;
  unsigned seen = 0; /* the manager's first value: reservations made before
                       this thread runs must wake it */
  pthread_mutex_lock(&m->trim_lock);
  while (!m->trim_stop) {
    /* seq_cst store then load, against the reserver's increment then load
     * of trim_asleep: one of the two sees the other. */
    atomic_store(&m->trim_asleep, true);
    if (um__atomic_load_relaxed(&m->bytes_pooled) == 0 && atomic_load(&m->reserve_seq) == seen) {
      pthread_cond_wait(&m->trim_cond, &m->trim_lock);
      atomic_store(&m->trim_asleep, false);
      seen = atomic_load(&m->reserve_seq) - 1u; /* tick at least once */
      continue;
    }
    atomic_store(&m->trim_asleep, false);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t wake = (uint64_t)ts.tv_nsec + interval_ns / 2 + 1000000ull;
    ts.tv_sec += (time_t)(wake / 1000000000ull);
    ts.tv_nsec = (long)(wake % 1000000000ull);
    pthread_cond_timedwait(&m->trim_cond, &m->trim_lock, &ts);
    if (m->trim_stop)
      break;
    pthread_mutex_unlock(&m->trim_lock);
    seen = atomic_load(&m->reserve_seq);
    pthread_mutex_lock(&m->trimming);
    um__tcache_flush_all(m, NULL);
    uint64_t now = um__now_ns();
    if (now > interval_ns)
      um__pool_trim_older(m, now - interval_ns);
    pthread_mutex_unlock(&m->trimming);
    pthread_mutex_lock(&m->trim_lock);
  }
  pthread_mutex_unlock(&m->trim_lock);
  return NULL;
}

int um__trim_thread_start(um_manager *m) {
  int rc;
  m->trim_stop = false;
  if (m->opts.trim_interval_ms == 0 || !m->opts.enable_pooling)
    return UM_OK;
  rc = pthread_create(&m->trim_thread, NULL, trim_main, m);
  if (rc != 0)
    return um__set_error(UM_ENOMEM, "cannot start the trim thread: %s", strerror(rc));
  um__atomic_store_release(&m->trim_running, true);
  return UM_OK;
}

void um__trim_thread_stop(um_manager *m) {
  if (!um__atomic_load_acquire(&m->trim_running))
    return;
  pthread_mutex_lock(&m->trim_lock);
  m->trim_stop = true;
  pthread_cond_signal(&m->trim_cond);
  pthread_mutex_unlock(&m->trim_lock);
  pthread_join(m->trim_thread, NULL);
  um__atomic_store_release(&m->trim_running, false);
}

/* Wake the timer; called when the pool goes from empty to not empty, so the
 * release path pays for the lock only on that transition. */
void um__trim_thread_kick(um_manager *m) {
  if (!um__atomic_load_acquire(&m->trim_running))
    return;
  pthread_mutex_lock(&m->trim_lock);
  pthread_cond_signal(&m->trim_cond);
  pthread_mutex_unlock(&m->trim_lock);
}
