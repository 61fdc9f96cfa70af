/* Thread caches: the pool's fast path (tcache.c has the slow paths).
 *
 * Every thread that allocates or releases through a manager gets one cache
 * for that manager: one slot per (device, location, size class), each slot
 * holding at most one idle block, plus the thread's own share of the hot
 * statistics counters. An allocation that finds its slot full, and a
 * release that finds its slot empty, touch nothing another thread writes:
 * no lock, plain loads and stores on the slot (taking: inside a section
 * that flushes force into view, see "Taking without a locked instruction";
 * putting: one store), and counters that only their thread writes (summed
 * on read, as mimalloc's stats are). The release's state change, which
 * refuses a second release, is a compare-and-swap except on a manager's
 * sole thread (see "A release without a locked instruction"). The
 * structures are in types.h.
 *
 * A slot is a word in one of three states:
 *   0         empty, and holding none of the pool's budget;
 *   RESERVED  empty, holding the budget of one block of its class, so that
 *             a release can fill it without checking the pool's limits;
 *   pointer   an idle block (state UM__BUF_IDLE), which holds the budget,
 *             its descriptor clean (um__buffer_clean), so that a hit sets
 *             only the new owner's generation, size and site.
 * Transitions: 0 -> RESERVED (owner, after um__pool_reserve), RESERVED ->
 * pointer (owner; a plain store, since only the owner ever moves a slot out
 * of RESERVED), pointer -> RESERVED (owner takes the block: see below),
 * pointer -> pointer (owner puts a newer block in and the older one goes to
 * the bin: CAS), pointer -> 0 (anyone: CAS; takes the block and gives up
 * the budget), RESERVED -> 0 (owner only). A slot thus holds its thread's most
 * recently released block of the class, which keeps oldest-first exact
 * for one thread. So another thread (a trim, pressure, the trim timer, the
 * manager's destroy) can always take every idle block out of every cache;
 * only the budget of empty slots waits for its owner, which gives it back
 * when it sees the manager's flush epoch move (tcache_flush_own).
 *
 * Limits: a slot's budget is counted in its bin's reserved_bytes and in the
 * manager's pool_claimed, exactly as an idle block in the bin is, so that
 * max_pool_bytes and max_pool_bytes_per_class hold for blocks in caches.
 *
 * Lifetime: a cache is on its thread's list (thread-local) and on its
 * manager's list (m->tcache_lock). Whichever of the thread's exit (core/
 * thread.c's pthread key destructor) and the manager's destroy comes first moves the
 * cache's blocks back to the manager's bins and unlinks it from the
 * manager, under one process-wide lock; the manager's destroy marks the
 * cache dead (m = NULL), and the thread frees it the next time it looks
 * for a cache or when it exits. */
#ifndef UNIMEM_TCACHE_H
#define UNIMEM_TCACHE_H

#ifndef UM__SEES_MEM
#error "tcache.h: this folder may not include it (src/README.md)"
#endif

#include "mem.h"
#include "testhook.h"

/* The cache this thread used last. initial-exec: the shared library is
 * linked at start-up by every program that uses it, and the general model
 * would cost a __tls_get_addr call on every allocation. */
extern _Thread_local um__tcache *um__tcache_last __attribute__((tls_model("initial-exec")));

/* Slow path of um__tcache_of: find or make this thread's cache for m, and
 * free caches of destroyed managers. NULL when out of memory (the callers
 * then fall back to the bins and the device counters). */
um__tcache *um__tcache_find(um_manager *m);
/* The manager's flush epoch moved: give this thread's idle blocks back to
 * the bins and drop the budget of its empty slots. */
void um__tcache_flush_own(um__tcache *tc, um_manager *m);
/* The calling thread's idle blocks of (d, loc) go back to the bins, and
 * their slots' budget too (a carve that found no room: buffer.c). The
 * blocks moved. */
uint64_t um__tcache_flush_own_pool(um_manager *m, um_device *d, um_location loc);
/* bytes_in_use of d moved up outside any thread's cache: bring d's and the
 * manager's peaks up to date with the exact sum over every thread. */
void um__tcache_note_high(um_device *d);
/* This thread's new highs (tc->high_pending): bring the peaks of the
 * devices where they happened, and the manager's, up to date with the
 * exact sums over every thread. */
void um__tcache_publish_high(um__tcache *tc);
/* A released block into this thread's slot of its class, the slow way:
 * the slot was empty without budget (reserve it), or held an older block
 * (which goes to its bin); into the bin when no budget is left. */
void um__tcache_put(um__tcache *tc, um_buffer *b);
/* Move every idle block of every cache of m (of device only, when not
 * NULL) to the bins, and ask every owner to drop its empty slots' budget.
 * Returns the bytes moved. */
uint64_t um__tcache_flush_all(um_manager *m, um_device *only);
/* Manager destroy: move the caches' blocks to the bins, mark them dead. */
void um__tcache_manager_gone(um_manager *m);
/* Add the caches' counters and idle blocks to stats of d (all devices
 * when d is NULL). Called with m->tcache_lock held. */
void um__tcache_stats_add(um_manager *m, um_device *d, um_stats *s);
/* The pool's share of the end of a thread, run by core/thread.c's key
 * destructor, which sets the key (um__tcache_use_exit_key) before the first
 * manager exists (until then no cache is made). Under the lifetime lock:
 * the thread's next cache, off its list, and its manager (NULL: destroyed),
 * or NULL when none is left; the cache's blocks back to m's bins; its
 * counters and peaks into m's, unlinked from m (m NULL: neither) and freed. */
void um__tcache_use_exit_key(pthread_key_t key);
void um__tcache_lifetime_lock(void);
void um__tcache_lifetime_unlock(void);
um__tcache *um__tcache_exit_next(um_manager **m);
void um__tcache_exit_give_back(um__tcache *tc, um_manager *m);
void um__tcache_exit_leave(um__tcache *tc, um_manager *m);
/* The pool's share of a fork (core/thread.c's pthread_atfork handlers). */
void um__tcache_fork_prepare(void);
void um__tcache_fork_parent(void);
void um__tcache_fork_child(void);
/* bytes_in_use of d moved up or down on this thread (its cache's share, or
 * the device's counters when it has no cache). */
void um__stat_in_use_add(um_device *d, uint64_t bytes);
void um__stat_in_use_sub(um_device *d, uint64_t bytes);

static inline um__tcache *um__tcache_of(um_manager *m) {
  um__tcache *tc = um__tcache_last;
  if (__builtin_expect(tc != NULL && atomic_load_explicit(&tc->m, memory_order_relaxed) == m, 1))
    return tc;
  return um__tcache_find(m);
}

/* Whether tc (this thread's last cache, um__tcache_last) serves work of m
 * on d: the fast paths' test, which looks no further. */
static inline bool um__tcache_serves(const um__tcache *tc, um_manager *m, const um_device *d) {
  return tc != NULL && atomic_load_explicit(&tc->m, memory_order_relaxed) == m && d->index < tc->ndevices;
}

/* This thread's cache for work on d, or NULL: a device adopted after the
 * cache was made has no slots or counters in it. */
static inline um__tcache *um__tcache_for(um_manager *m, const um_device *d) {
  um__tcache *tc = um__tcache_of(m);
  return tc != NULL && __builtin_expect(d->index < tc->ndevices, 1) ? tc : NULL;
}

/* The index of the slot of (d, loc, cls) in every cache that has d. */
static inline uint32_t um__tcache_slot_index(const um_device *d, um_location loc, int cls) {
  return ((uint32_t)d->index * UM_LOCATION_COUNT + (uint32_t)loc) * UM__TCACHE_CLASSES + (uint32_t)cls;
}

static inline _Atomic(uintptr_t) *um__tcache_slot(um__tcache *tc, const um_device *d,
                                                 um_location loc, int cls) {
  return &tc->slots[um__tcache_slot_index(d, loc, cls)];
}

/* The idle_key of a block going idle on tc's thread. A Lamport clock: the
 * thread's own clock, kept ahead of the manager's (which the slow paths
 * move), so one thread's releases are ordered exactly without a shared
 * write on the fast path; across threads the order is approximate. */
static inline uint64_t um__tcache_key(um__tcache *tc, um_manager *m) {
  uint64_t g = (uint64_t)atomic_load_explicit(&m->idle_clock, memory_order_relaxed);
  uint64_t k = (tc->clock > g ? tc->clock : g) + 1;
  tc->clock = k;
  return k;
}

/* The release fast path's key: the thread's own clock alone (it meets the
 * manager's again at the thread's next slow path). */
static inline uint64_t um__tcache_key_fast(um__tcache *tc) { return ++tc->clock; }

/* Owner-only counter update: no other thread writes c. */
static inline void um__tcounter_add(atomic_uint_fast64_t *c, uint64_t v) {
  atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + v,
                        memory_order_relaxed);
}

/* A new high is carried into the device's and the manager's peaks at
 * once only when this thread's highs grew by a sixteenth since they were
 * last carried, or after this many new highs; otherwise at the thread's
 * next release, when its level turns down. So a thread that keeps growing
 * takes the manager's cache lock once per UM__TCACHE_HIGH_BATCH
 * allocations at most, not on every one, and its own peak is never missed:
 * until its next release its level is its high, which a stats read sums
 * anyway. Where other threads release what a thread allocates, a peak can
 * be short by what it allocated since its highs were last carried: less
 * than a sixteenth of its high and than UM__TCACHE_HIGH_BATCH blocks. */
#define UM__TCACHE_HIGH_BATCH 64

/* A buffer of bytes went live on this thread: count it; true when the
 * new highs must be carried now (um__tcache_publish_high), which the
 * caller does last, so that the allocation's fast path makes no call
 * before it returns. */
static inline bool um__tcache_count_in_defer(um__tcache *tc, um_device *d, uint64_t bytes) {
  um__tcounters *c = &tc->ctr[d->index];
  uint64_t dev_now = (uint64_t)atomic_load_explicit(&c->bytes_in_use, memory_order_relaxed) + bytes;
  int64_t grew = 0, high = 0;
  atomic_store_explicit(&c->bytes_in_use, dev_now, memory_order_relaxed);
  /* The peaks move only when this thread passes its own highest level. */
  if (__builtin_expect(tc->ndevices > 1, 0)) {
    uint64_t all_now = (uint64_t)atomic_load_explicit(&tc->in_use_total, memory_order_relaxed) + bytes;
    atomic_store_explicit(&tc->in_use_total, all_now, memory_order_relaxed);
    if ((int64_t)all_now > tc->in_use_total_high) {
      grew = (int64_t)all_now - tc->in_use_total_high;
      high = tc->in_use_total_high = (int64_t)all_now;
    }
  }
  if (__builtin_expect((int64_t)dev_now > c->in_use_high, 0)) {
    if (grew == 0) {
      grew = (int64_t)dev_now - c->in_use_high;
      high = (int64_t)dev_now;
    }
    c->in_use_high = (int64_t)dev_now;
    c->high_pending = true;
  }
  if (__builtin_expect(grew != 0, 0)) {
    tc->high_grew += grew;
    return ++tc->high_pending >= UM__TCACHE_HIGH_BATCH || tc->high_grew * 16 >= high;
  }
  return false;
}

/* A buffer of bytes went live (in) or was released (out) on this thread. */
static inline void um__tcache_count_in(um__tcache *tc, um_device *d, uint64_t bytes) {
  if (__builtin_expect(um__tcache_count_in_defer(tc, d, bytes), 0))
    um__tcache_publish_high(tc);
}

/* The levels of um__tcache_count_out go down (c: tc's counters of the
 * device). With no new high pending, that is all of it. */
static inline void um__tcache_count_out_level(um__tcache *tc, um__tcounters *c, uint64_t bytes) {
  um__tcounter_add(&c->bytes_in_use, (uint64_t)0 - bytes);
  if (__builtin_expect(tc->ndevices > 1, 0))
    um__tcounter_add(&tc->in_use_total, (uint64_t)0 - bytes);
}

static inline void um__tcache_count_out(um__tcache *tc, um_device *d, uint64_t bytes) {
  if (__builtin_expect(tc->high_pending != 0, 0))
    um__tcache_publish_high(tc); /* the level turns down: it was a peak */
  um__tcache_count_out_level(tc, &tc->ctr[d->index], bytes);
}

/* Taking without a locked instruction. The owner's take is the one slot
 * move that races with other threads (a flush moving the block to the
 * bins), and a compare-and-swap there would be the hit's largest cost. So
 * the owner takes with a plain load and store, inside a section it marks
 * with busy, and a thread that moves blocks out of caches (flush_slots,
 * under m->tcache_lock) first sets steal, then runs membarrier(PRIVATE_
 * EXPEDITED), which puts a full barrier into every running thread of the
 * process, then waits for busy to read 0. Either the owner's load of steal
 * comes after that barrier, and sees steal (it takes with a CAS instead),
 * or its store of busy comes before it, and the flush sees busy and waits
 * until the section ended (and with it the owner's slot store). This is
 * the asymmetric Dekker pattern of user-space RCU; where membarrier is not
 * to be had (tc->asym false), the owner always takes with the CAS. */
static inline um_buffer *um__tcache_take_at(um__tcache *tc, _Atomic(uintptr_t) *slot) {
  uintptr_t cur;
  if (__builtin_expect(tc->asym, 1)) {
    atomic_store_explicit(&tc->busy, 1, memory_order_relaxed);
    atomic_signal_fence(memory_order_seq_cst);
    if (__builtin_expect(!atomic_load_explicit(&tc->steal, memory_order_acquire), 1)) {
      cur = atomic_load_explicit(slot, memory_order_relaxed);
      if (cur > UM__TSLOT_RESERVED)
        atomic_store_explicit(slot, UM__TSLOT_RESERVED, memory_order_relaxed);
      atomic_store_explicit(&tc->busy, 0, memory_order_release);
      return cur > UM__TSLOT_RESERVED ? (um_buffer *)cur : NULL;
    }
    atomic_store_explicit(&tc->busy, 0, memory_order_release);
  }
  cur = atomic_load_explicit(slot, memory_order_relaxed);
  if (cur > UM__TSLOT_RESERVED &&
      atomic_compare_exchange_strong_explicit(slot, &cur, UM__TSLOT_RESERVED, memory_order_acquire,
                                              memory_order_relaxed))
    return (um_buffer *)cur;
  return NULL;
}

/* The allocation's hit: the block idle in this thread's slot of the class,
 * or NULL. */
static inline um_buffer *um__tcache_take(um__tcache *tc, um_device *d, um_location loc, int cls) {
  return um__tcache_take_at(tc, um__tcache_slot(tc, d, loc, cls));
}

/* The release's hit: an untouched pooled block into this thread's reserved,
 * empty slot of its class, with one plain store (only the owner moves a
 * slot out of RESERVED). false: the slow path must run. */
static inline bool um__tcache_put_fast(um__tcache *tc, um_buffer *b) {
  _Atomic(uintptr_t) *slot = &tc->slots[b->slot];
  if (__builtin_expect(atomic_load_explicit(slot, memory_order_relaxed) != UM__TSLOT_RESERVED, 0))
    return false;
  b->idle_key = um__tcache_key_fast(tc);
  atomic_store_explicit(&b->state, UM__BUF_IDLE, memory_order_relaxed);
  atomic_store_explicit(&tc->slot_caps[b->slot], b->capacity, memory_order_relaxed);
  atomic_store_explicit(slot, (uintptr_t)b, memory_order_release);
  return true;
}

/* A release without a locked instruction. um_release changes the
 * buffer's state from LIVE to RELEASED with a compare-and-swap, so that of
 * two threads releasing one buffer at once exactly one succeeds, and so
 * that a release and another thread's first operation on the buffer (its
 * touched store, then its state check) always see one another. On some
 * CPUs that one instruction is a third of a pool hit. While one thread
 * alone releases and touches a manager's buffers, there is nobody to race
 * with: the manager is biased to that thread (m->bias SOLE, its cache
 * m->sole_tc, the first cache made for the manager), which changes the
 * state with a plain load and store inside the section its takes use (busy
 * set). Any other thread, before it releases a buffer of the manager or
 * touches one (um__bias_leave: op.c, map.c, net.c), revokes the bias once
 * and for all (um__bias_revoke, under tcache_lock): it sets SHARED, runs
 * the process-wide barrier, then waits for busy to read 0. Either the sole
 * thread's load of bias comes after that barrier, and sees SHARED (it uses
 * the compare-and-swap from then on), or its busy store comes before it,
 * and the revoker waits until its section, with its state store, ended: a
 * release racing it then fails its compare-and-swap, an issuer sees the
 * buffer released. The same asymmetric Dekker pattern as the takes; a
 * manager is biased only where that barrier is to be had (tc->asym), and
 * a thread's exit or the manager's destroy ends the bias of its cache.
 *
 * The sole thread's state change: 1 done, 0 the buffer was not LIVE (a
 * second release), -1 the bias is gone (the caller takes the CAS). */
static inline int um__bias_release(um__tcache *tc, um_manager *m, um_buffer *b) {
  int r = -1;
  atomic_store_explicit(&tc->busy, 1, memory_order_relaxed);
  atomic_signal_fence(memory_order_seq_cst);
  if (__builtin_expect(atomic_load_explicit(&m->bias, memory_order_acquire) == UM__BIAS_SOLE, 1)) {
    r = atomic_load_explicit(&b->state, memory_order_relaxed) == UM__BUF_LIVE;
    UM__TEST_POINT(UM__TP_SOLE_RELEASE, b);
    if (r)
      atomic_store_explicit(&b->state, UM__BUF_RELEASED, memory_order_relaxed);
  }
  atomic_store_explicit(&tc->busy, 0, memory_order_release);
  return r;
}

/* Revoke m's bias: a thread other than the sole one releases or touches a
 * buffer of m (tcache.c). */
void um__bias_revoke(um_manager *m);
/* um__bias_leave's slow path: revoke unless this thread is the sole one. */
void um__bias_leave_slow(um_manager *m);

/* Before this thread touches a buffer of m (its touched store, then its
 * state check), or releases one with the compare-and-swap: no other thread
 * changes buffer states without a locked instruction from now on. */
static inline void um__bias_leave(um_manager *m) {
  if (__builtin_expect(atomic_load_explicit(&m->bias, memory_order_relaxed) != UM__BIAS_SHARED, 0))
    um__bias_leave_slow(m);
}

/* Whether tc may take or keep blocks now: slots in use, and no flush asked
 * since the thread last looked. */
static inline bool um__tcache_ready(const um__tcache *tc, um_manager *m) {
  return tc->slots_on && tc->epoch == atomic_load_explicit(&m->flush_epoch, memory_order_relaxed);
}

#endif /* UNIMEM_TCACHE_H */
