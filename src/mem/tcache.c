/* Thread caches: lookup, creation, flushing, the end of a manager, the
 * pool's share of a thread's end and of a fork (core/thread.c runs them),
 * and the statistics they hold. The fast paths are inline in
 * tcache.h and buffer.c; the protocol of a slot is described in tcache.h. */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#if defined(__linux__)
#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "tcache.h"
#include "list.h"
#include "testhook.h"

_Thread_local um__tcache *um__tcache_last __attribute__((tls_model("initial-exec")));
/* This thread's caches, one per manager it used (owner only). */
static _Thread_local um__tcache *thread_caches;

/* Serialises a thread's exit against a manager's destroy, so that exactly
 * one of them gives a cache's blocks back to the manager, while the
 * manager still exists. Taken only on those two paths and when a thread
 * frees the caches of destroyed managers. */
static pthread_mutex_t lifetime_lock = PTHREAD_MUTEX_INITIALIZER;
/* core/thread.c's key, whose destructor ends the thread's caches: set
 * once, before the first manager exists. */
static pthread_key_t exit_key;
static atomic_bool exit_key_ok;

static void publish_locked(um__tcache *tc, um_manager *m);

void um__tcache_use_exit_key(pthread_key_t key) {
  exit_key = key;
  atomic_store(&exit_key_ok, true);
}

/* ------------------------------------------------------------------------ */
/* The process-wide barrier of a flush (tcache.h, "Taking without a locked
 * instruction"). */

#if defined(__linux__) && defined(__NR_membarrier)
static int membarrier_cmd(int cmd) { return (int)syscall(__NR_membarrier, cmd, 0, 0); }
#else
static int membarrier_cmd(int cmd) {
  (void)cmd;
  errno = ENOSYS;
  return -1;
}
#define MEMBARRIER_CMD_QUERY 0
#define MEMBARRIER_CMD_PRIVATE_EXPEDITED 0
#define MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED 0
#endif

static pthread_once_t asym_once = PTHREAD_ONCE_INIT;
static bool asym_ok;

/* Whether this kernel gives the expedited private barrier (Linux 4.14 on),
 * registered for the process. Seccomp profiles and valgrind may refuse it;
 * the caches then take with a compare-and-swap. */
static void asym_probe(void) {
  int cmds = membarrier_cmd(MEMBARRIER_CMD_QUERY);
  asym_ok = cmds > 0 && (cmds & MEMBARRIER_CMD_PRIVATE_EXPEDITED) &&
            membarrier_cmd(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0;
}

/* A full barrier in every running thread of the process; false when the
 * kernel refused (a registration lost across a fork is made again). */
static bool asym_barrier(void) {
  if (membarrier_cmd(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0)
    return true;
  return errno == EPERM && membarrier_cmd(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0 &&
         membarrier_cmd(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0;
}

/* Under m->tcache_lock: stop the owners' plain takes in every cache of m.
 * Returns false, with nothing stopped, when the barrier failed: the caches
 * with plain takes must then be left alone (their owners flush themselves
 * when the epoch moves). */
static bool steal_begin(um_manager *m) {
  bool any = false;
  for (um__tcache *tc = m->tcaches; tc != NULL; tc = tc->m_next) {
    atomic_store_explicit(&tc->steal, 1, memory_order_relaxed);
    any |= tc->asym;
  }
  if (any && !asym_barrier()) {
    for (um__tcache *tc = m->tcaches; tc != NULL; tc = tc->m_next)
      atomic_store_explicit(&tc->steal, 0, memory_order_relaxed);
    return false;
  }
  for (um__tcache *tc = m->tcaches; tc != NULL; tc = tc->m_next)
    while (atomic_load_explicit(&tc->busy, memory_order_acquire) != 0)
      sched_yield(); /* a take of a few instructions, or its thread preempted */
  return true;
}

static void steal_end(um_manager *m) {
  for (um__tcache *tc = m->tcaches; tc != NULL; tc = tc->m_next)
    atomic_store_explicit(&tc->steal, 0, memory_order_release);
}

/* ------------------------------------------------------------------------ */
/* The bias of a manager to its sole thread (tcache.h, "A release without
 * a locked instruction") */

void um__bias_revoke(um_manager *m) {
  pthread_mutex_lock(&m->tcache_lock);
  if (atomic_load_explicit(&m->bias, memory_order_relaxed) != UM__BIAS_SHARED) {
    um__tcache *sole = atomic_load_explicit(&m->sole_tc, memory_order_relaxed);
    atomic_store(&m->bias, UM__BIAS_SHARED);
    if (sole != NULL) {
      /* Made biased only where the barrier worked (create_cache); should
       * the kernel refuse it now, a pause far longer than any store buffer
       * takes to drain (a preemption drains it too) stands in for it. */
      if (!asym_barrier())
        nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
      while (atomic_load_explicit(&sole->busy, memory_order_acquire) != 0)
        sched_yield(); /* a section of a few instructions, or its thread preempted */
      atomic_store(&m->sole_tc, NULL); /* its releases skip the section now */
    }
  }
  pthread_mutex_unlock(&m->tcache_lock);
}

void um__bias_leave_slow(um_manager *m) {
  um__tcache *sole = atomic_load_explicit(&m->sole_tc, memory_order_relaxed);
  if (sole != NULL)
    for (um__tcache *tc = thread_caches; tc != NULL; tc = tc->t_next)
      if (tc == sole)
        return; /* this thread is the sole one */
  um__bias_revoke(m);
}

/* ------------------------------------------------------------------------ */

static size_t slot_count(int ndevices) {
  return (size_t)ndevices * UM_LOCATION_COUNT * UM__TCACHE_CLASSES;
}

/* The pool and class of slot i. */
static um__pool *slot_pool(um_manager *m, size_t i) {
  size_t dl = i / UM__TCACHE_CLASSES;
  return &m->devices[dl / UM_LOCATION_COUNT]->pools[dl % UM_LOCATION_COUNT];
}

static int slot_class(size_t i) { return (int)(i % UM__TCACHE_CLASSES); }

static size_t used_words(int ndevices) {
  size_t groups = (slot_count(ndevices) + UM__TCACHE_GROUP - 1) / UM__TCACHE_GROUP;
  return (groups + 63) / 64;
}

/* Owner: slot i may become other than 0 from now on. Before the slot's
 * store: a reader that sees the slot's new value may still miss the bit,
 * which is the same as reading a moment earlier. */
static void mark_used(um__tcache *tc, size_t i) {
  size_t g = i / UM__TCACHE_GROUP;
  _Atomic(uint64_t) *w = &tc->used[g / 64];
  uint64_t bit = (uint64_t)1 << (g % 64), cur = atomic_load_explicit(w, memory_order_relaxed);
  if (!(cur & bit))
    atomic_store_explicit(w, cur | bit, memory_order_release);
}

/* Calls visit(tc, m, i, arg) for the slots in [lo, hi) of the groups tc
 * has used, lowest first; the others are 0. Returns the sum of what the
 * calls returned. */
static uint64_t for_each_used(um__tcache *tc, um_manager *m, size_t lo, size_t hi,
                              uint64_t (*visit)(um__tcache *, um_manager *, size_t, void *), void *arg) {
  uint64_t sum = 0;
  size_t nwords = used_words(tc->ndevices);
  for (size_t wi = lo / UM__TCACHE_GROUP / 64; wi < nwords; wi++) {
    uint64_t bits = atomic_load_explicit(&tc->used[wi], memory_order_acquire);
    while (bits != 0) {
      size_t g = wi * 64 + (size_t)__builtin_ctzll(bits);
      size_t a = g * UM__TCACHE_GROUP, b = a + UM__TCACHE_GROUP;
      bits &= bits - 1;
      if (a >= hi)
        return sum;
      for (size_t i = a < lo ? lo : a; i < b && i < hi; i++)
        sum += visit(tc, m, i, arg);
    }
  }
  return sum;
}

/* Take slot i's idle block into its bin; when *owner (a bool), also give
 * back the budget of the slot when empty. Returns bytes moved. */
static uint64_t flush_slot(um__tcache *tc, um_manager *m, size_t i, void *owner) {
  _Atomic(uintptr_t) *slot = &tc->slots[i];
  uintptr_t cur = atomic_load_explicit(slot, memory_order_acquire);
  if (cur > UM__TSLOT_RESERVED) {
    if (!atomic_compare_exchange_strong_explicit(slot, &cur, 0, memory_order_acquire, memory_order_relaxed))
      return 0; /* its owner took it, or another flush did */
    um_buffer *b = (um_buffer *)cur;
    uint64_t bytes = b->capacity;
    um__pool_put_reserved(slot_pool(m, i), b);
    return bytes;
  }
  if (cur == UM__TSLOT_RESERVED && *(const bool *)owner) {
    atomic_store_explicit(slot, 0, memory_order_relaxed);
    um__pool_unreserve(slot_pool(m, i), slot_class(i));
  }
  return 0;
}

/* Take every idle block out of tc's slots [lo, hi) into the bins; when
 * owner, also give back the budget of empty slots, and (over all slots)
 * forget which groups were used: every slot is 0 then (only the owner
 * makes a slot other than 0). Returns bytes moved. */
static uint64_t flush_slots(um__tcache *tc, um_manager *m, size_t lo, size_t hi, bool owner) {
  uint64_t moved = for_each_used(tc, m, lo, hi, flush_slot, &owner);
  if (owner && lo == 0 && hi == slot_count(tc->ndevices))
    for (size_t wi = 0; wi < used_words(tc->ndevices); wi++)
      atomic_store_explicit(&tc->used[wi], 0, memory_order_relaxed);
  return moved;
}

/* Whether a cache of m has slots: pooling on, debug off, not recording
 * (UNIMEM_TRACE_FILE: the locked path, in order). */
static bool slots_wanted(um_manager *m) { return m->opts.enable_pooling && !m->opts.debug && m->trace == NULL; }

void um__tcache_flush_own(um__tcache *tc, um_manager *m) {
  tc->epoch = atomic_load_explicit(&m->flush_epoch, memory_order_relaxed);
  flush_slots(tc, m, 0, slot_count(tc->ndevices), true);
}

uint64_t um__tcache_flush_own_pool(um_manager *m, um_device *d, um_location loc) {
  um__tcache *tc = um__tcache_last;
  size_t lo;
  if (tc == NULL || atomic_load_explicit(&tc->m, memory_order_relaxed) != m || d->index >= tc->ndevices)
    return 0;
  lo = ((size_t)d->index * UM_LOCATION_COUNT + (size_t)loc) * UM__TCACHE_CLASSES;
  return flush_slots(tc, m, lo, lo + UM__TCACHE_CLASSES, true);
}

uint64_t um__tcache_flush_all(um_manager *m, um_device *only) {
  uint64_t moved = 0;
  bool stopped;
  pthread_mutex_lock(&m->tcache_lock);
  stopped = steal_begin(m);
  for (um__tcache *tc = m->tcaches; tc != NULL; tc = tc->m_next) {
    size_t per_dev = (size_t)UM_LOCATION_COUNT * UM__TCACHE_CLASSES;
    if ((only != NULL && only->index >= tc->ndevices) || (tc->asym && !stopped))
      continue; /* adopted after the cache was made: no slots; or see steal_begin */
    if (only != NULL)
      moved += flush_slots(tc, m, (size_t)only->index * per_dev, ((size_t)only->index + 1) * per_dev, false);
    else
      moved += flush_slots(tc, m, 0, slot_count(tc->ndevices), false);
  }
  if (stopped)
    steal_end(m);
  pthread_mutex_unlock(&m->tcache_lock);
  /* Owners give back their empty slots' budget at their next call. */
  um__atomic_add_relaxed(&m->flush_epoch, 1u);
  return moved;
}

/* Add tc's counters to the device's and unlink it from m. Called with
 * m->tcache_lock held. */
static void merge_and_unlink(um__tcache *tc, um_manager *m) {
  for (int i = 0; i < tc->ndevices; i++) {
    um_device *d = m->devices[i];
    um__tcounters *c = &tc->ctr[i];
    um__atomic_add_relaxed(&d->stats.allocations,
                           um__atomic_load_relaxed(&c->not_hits) + um__atomic_load_relaxed(&c->pool_hits));
    um__atomic_add_relaxed(&d->stats.releases, um__atomic_load_relaxed(&c->releases));
    um__atomic_add_relaxed(&d->stats.pool_hits, um__atomic_load_relaxed(&c->pool_hits));
    um__atomic_add_relaxed(&d->stats.bytes_in_use, um__atomic_load_relaxed(&c->bytes_in_use));
  }
  um__atomic_add_relaxed(&m->bytes_in_use, um__atomic_load_relaxed(&tc->in_use_total));
  if (tc->ndevices == 1)
    um__atomic_add_relaxed(&m->bytes_in_use, um__atomic_load_relaxed(&tc->ctr[0].bytes_in_use));
  UM__LIST_UNLINK(m->tcaches, tc, m_prev, m_next);
  tc->m_prev = tc->m_next = NULL;
  /* The sole thread leaves (its exit, or the manager's destroy): nobody
   * changes states without the compare-and-swap from now on, and the
   * cache's memory, freed, cannot pass for the sole cache. */
  if (atomic_load_explicit(&m->sole_tc, memory_order_relaxed) == tc) {
    atomic_store(&m->bias, UM__BIAS_SHARED);
    atomic_store(&m->sole_tc, NULL);
  }
}

static void free_cache(um__tcache *tc) {
  free(tc->slots);
  free(tc->slot_caps);
  free(tc->used);
  free(tc->ctr);
  free(tc);
}

/* A thread ends (core/thread.c), one cache at a time. */
um__tcache *um__tcache_exit_next(um_manager **m) {
  um__tcache *tc = thread_caches;
  if (tc == NULL) {
    um__tcache_last = NULL;
    return NULL;
  }
  thread_caches = tc->t_next;
  *m = atomic_load_explicit(&tc->m, memory_order_relaxed);
  return tc;
}

void um__tcache_exit_give_back(um__tcache *tc, um_manager *m) {
  flush_slots(tc, m, 0, slot_count(tc->ndevices), true);
}

void um__tcache_exit_leave(um__tcache *tc, um_manager *m) {
  if (m != NULL) {
    pthread_mutex_lock(&m->tcache_lock);
    if (tc->high_pending != 0)
      publish_locked(tc, m);
    merge_and_unlink(tc, m);
    pthread_mutex_unlock(&m->tcache_lock);
  }
  free_cache(tc);
}

void um__tcache_lifetime_lock(void) { pthread_mutex_lock(&lifetime_lock); }

void um__tcache_lifetime_unlock(void) { pthread_mutex_unlock(&lifetime_lock); }

void um__tcache_manager_gone(um_manager *m) {
  pthread_mutex_lock(&lifetime_lock);
  pthread_mutex_lock(&m->tcache_lock);
  while (m->tcaches != NULL) {
    um__tcache *tc = m->tcaches;
    /* No thread uses a manager being destroyed, so the empty slots'
     * budget can be taken back here, in the owner's place. */
    flush_slots(tc, m, 0, slot_count(tc->ndevices), true);
    if (tc->high_pending != 0)
      publish_locked(tc, m);
    merge_and_unlink(tc, m);
    atomic_store_explicit(&tc->m, NULL, memory_order_release);
  }
  pthread_mutex_unlock(&m->tcache_lock);
  pthread_mutex_unlock(&lifetime_lock);
}

/* Free this thread's caches whose manager is gone. */
static void free_dead_caches(void) {
  um__tcache **link = &thread_caches;
  pthread_mutex_lock(&lifetime_lock);
  while (*link != NULL) {
    um__tcache *tc = *link;
    if (atomic_load_explicit(&tc->m, memory_order_relaxed) == NULL) {
      *link = tc->t_next;
      if (um__tcache_last == tc)
        um__tcache_last = NULL;
      free_cache(tc);
    } else {
      link = &tc->t_next;
    }
  }
  pthread_mutex_unlock(&lifetime_lock);
}

static um__tcache *create_cache(um_manager *m) {
  um__tcache *tc;
  if (!atomic_load_explicit(&exit_key_ok, memory_order_relaxed))
    return NULL; /* without the exit hook, cached blocks could be stranded */
  /* Cache-line aligned and padded: nothing another thread writes shares a
   * line with what this thread's fast path writes. */
  tc = aligned_alloc(64, (sizeof(*tc) + 63) & ~(size_t)63);
  if (tc == NULL)
    return NULL;
  memset(tc, 0, sizeof(*tc));
  int ndevices = um__ndevices(m); /* devices adopted later bypass this cache */
  tc->ctr = aligned_alloc(64, ((size_t)ndevices * sizeof(*tc->ctr) + 63) & ~(size_t)63);
  tc->slots = aligned_alloc(64, (slot_count(ndevices) * sizeof(*tc->slots) + 63) & ~(size_t)63);
  tc->slot_caps = calloc(slot_count(ndevices), sizeof(*tc->slot_caps));
  tc->used = calloc(used_words(ndevices), sizeof(*tc->used));
  if (tc->ctr == NULL || tc->slots == NULL || tc->slot_caps == NULL || tc->used == NULL ||
      pthread_setspecific(exit_key, &thread_caches) != 0) {
    free_cache(tc);
    return NULL;
  }
  memset(tc->ctr, 0, (size_t)ndevices * sizeof(*tc->ctr));
  memset(tc->slots, 0, slot_count(ndevices) * sizeof(*tc->slots));
  tc->ndevices = ndevices;
  tc->slots_on = slots_wanted(m);
  pthread_once(&asym_once, asym_probe);
  tc->asym = asym_ok;
  UM__TEST_POINT(UM__TP_TCACHE_NEW, tc);
  tc->epoch = atomic_load_explicit(&m->flush_epoch, memory_order_relaxed);
  atomic_init(&tc->m, m);
  pthread_mutex_lock(&m->tcache_lock);
  tc->m_next = m->tcaches;
  if (m->tcaches)
    m->tcaches->m_prev = tc;
  m->tcaches = tc;
  /* The manager's first cache: biased to this thread until another one
   * releases or touches a buffer (tcache.h), where the barrier that
   * revokes the bias works. */
  if (atomic_load_explicit(&m->bias, memory_order_relaxed) == UM__BIAS_NONE) {
    if (tc->asym && asym_barrier()) {
      atomic_store(&m->sole_tc, tc);
      atomic_store(&m->bias, UM__BIAS_SOLE);
    } else {
      atomic_store(&m->bias, UM__BIAS_SHARED);
    }
  }
  pthread_mutex_unlock(&m->tcache_lock);
  tc->t_next = thread_caches;
  thread_caches = tc;
  return tc;
}

um__tcache *um__tcache_find(um_manager *m) {
  bool dead = false;
  um__tcache *tc;
  for (tc = thread_caches; tc != NULL; tc = tc->t_next) {
    um_manager *tm = atomic_load_explicit(&tc->m, memory_order_relaxed);
    if (tm == m)
      break;
    dead |= tm == NULL;
  }
  if (dead)
    free_dead_caches();
  if (tc == NULL)
    tc = create_cache(m);
  if (tc != NULL)
    um__tcache_last = tc;
  return tc;
}

void um__tcache_put(um__tcache *tc, um_buffer *b) {
  um_manager *m = b->m;
  um__pool *p = &b->dev->pools[b->loc];
  _Atomic(uintptr_t) *slot = um__tcache_slot(tc, b->dev, b->loc, b->cls);
  uintptr_t cur;
  if (tc->epoch != atomic_load_explicit(&m->flush_epoch, memory_order_relaxed))
    um__tcache_flush_own(tc, m);
  /* What a slot holds is clean (tcache.h). Under the buffer's lock: a walk
   * of every buffer (um_device_synchronize) reads the chain's fields under
   * it, and skips the IDLE ones. */
  pthread_mutex_lock(&b->lock);
  um__buffer_clean(b);
  atomic_store_explicit(&b->state, UM__BUF_IDLE, memory_order_relaxed);
  pthread_mutex_unlock(&b->lock);
  b->idle_key = um__idle_key_next(m); /* moves the manager's clock too */
  atomic_store_explicit(&tc->slot_caps[um__tcache_slot_index(b->dev, b->loc, b->cls)], b->capacity,
                        memory_order_relaxed);
  cur = atomic_load_explicit(slot, memory_order_relaxed);
  for (;;) {
    if (cur == 0) {
      if (!um__pool_reserve(p, b->cls))
        break;
      mark_used(tc, um__tcache_slot_index(b->dev, b->loc, b->cls));
      cur = UM__TSLOT_RESERVED;
    }
    if (cur == UM__TSLOT_RESERVED) {
      atomic_store_explicit(slot, (uintptr_t)b, memory_order_release);
      return;
    }
    /* The slot holds an older block: b takes its place (and its budget),
     * the older one goes to the bin. */
    if (atomic_compare_exchange_strong_explicit(slot, &cur, (uintptr_t)b, memory_order_acq_rel,
                                                memory_order_relaxed)) {
      um__pool_put_aged(p, (um_buffer *)cur);
      return;
    }
    /* another thread took the older block (cur is now 0): start over */
  }
  um__pool_put(p, b); /* no budget for a slot */
}

/* The exact sum of d's bytes_in_use over every thread. Called with
 * m->tcache_lock held: a thread's exit moves its share into the device's
 * counters under it too, so the sum sees it exactly once. */
static int64_t device_sum(um_manager *m, um_device *d) {
  int64_t total = (int64_t)um__atomic_load_relaxed(&d->stats.bytes_in_use);
  for (um__tcache *t = m->tcaches; t != NULL; t = t->m_next)
    if (d->index < t->ndevices) /* a cache made before d was adopted has none */
      total += (int64_t)um__atomic_load_relaxed(&t->ctr[d->index].bytes_in_use);
  return total;
}

/* The same for the manager's bytes_in_use over all devices. */
static int64_t manager_sum(um_manager *m) {
  int64_t total = (int64_t)um__atomic_load_relaxed(&m->bytes_in_use);
  for (um__tcache *t = m->tcaches; t != NULL; t = t->m_next)
    total += (int64_t)um__atomic_load_relaxed(t->ndevices > 1 ? &t->in_use_total : &t->ctr[0].bytes_in_use);
  return total;
}

/* Every writer of the peaks holds m->tcache_lock (readers do not): a
 * plain load and store, not a compare-and-swap loop. */
static void peak_up(atomic_uint_fast64_t *peak, int64_t total) {
  if (total > 0 && (uint64_t)total > um__atomic_load_relaxed(peak))
    atomic_store_explicit(peak, (uint64_t)total, memory_order_relaxed);
}

void um__tcache_note_high(um_device *d) {
  um_manager *m = d->m;
  pthread_mutex_lock(&m->tcache_lock);
  peak_up(&d->stats.peak_bytes_in_use, device_sum(m, d));
  peak_up(&m->peak_bytes_in_use, manager_sum(m));
  pthread_mutex_unlock(&m->tcache_lock);
}

/* Called with m->tcache_lock held, or by a cache's owner. */
static void publish_locked(um__tcache *tc, um_manager *m) {
  for (int i = 0; i < tc->ndevices; i++) {
    if (tc->ctr[i].high_pending) {
      tc->ctr[i].high_pending = false;
      peak_up(&m->devices[i]->stats.peak_bytes_in_use, device_sum(m, m->devices[i]));
    }
  }
  peak_up(&m->peak_bytes_in_use, manager_sum(m));
  tc->high_pending = 0;
  tc->high_grew = 0;
}

void um__tcache_publish_high(um__tcache *tc) {
  um_manager *m = atomic_load_explicit(&tc->m, memory_order_relaxed);
  if (m == NULL)
    return;
  pthread_mutex_lock(&m->tcache_lock);
  publish_locked(tc, m);
  pthread_mutex_unlock(&m->tcache_lock);
}

/* The bytes of slot i's idle block, largest_pooled_block of *arg too. */
static uint64_t slot_pooled(um__tcache *tc, um_manager *m, size_t i, void *arg) {
  um_stats *s = arg;
  (void)m;
  if (atomic_load_explicit(&tc->slots[i], memory_order_relaxed) <= UM__TSLOT_RESERVED)
    return 0;
  uint64_t cap = atomic_load_explicit(&tc->slot_caps[i], memory_order_relaxed);
  if (cap == 0 || cap > um__class_size(slot_class(i)))
    cap = um__class_size(slot_class(i));
  if (cap > s->largest_pooled_block)
    s->largest_pooled_block = cap;
  return cap;
}

void um__tcache_stats_add(um_manager *m, um_device *d, um_stats *s) {
  const size_t per_dev = (size_t)UM_LOCATION_COUNT * UM__TCACHE_CLASSES;
  for (um__tcache *tc = m->tcaches; tc != NULL; tc = tc->m_next) {
    for (int i = 0; i < tc->ndevices; i++) {
      um__tcounters *c = &tc->ctr[i];
      if (d != NULL && d->index != i)
        continue;
      uint64_t hits = um__atomic_load_relaxed(&c->pool_hits);
      s->allocations += um__atomic_load_relaxed(&c->not_hits) + hits;
      s->releases += um__atomic_load_relaxed(&c->releases);
      s->pool_hits += hits;
      s->bytes_in_use += um__atomic_load_relaxed(&c->bytes_in_use);
    }
    if (d == NULL)
      s->bytes_pooled += for_each_used(tc, m, 0, slot_count(tc->ndevices), slot_pooled, s);
    else if (d->index < tc->ndevices)
      s->bytes_pooled += for_each_used(tc, m, (size_t)d->index * per_dev, ((size_t)d->index + 1) * per_dev,
                                       slot_pooled, s);
  }
}

/* fork (core/thread.c, after the generation moved): the lifetime lock is
 * held across the fork, so that the child does not inherit it locked by
 * another thread; in the child, the forking thread's caches belong to the
 * parent's managers, which the child may not use: they are marked dead
 * (freed at this thread's next lookup). */
void um__tcache_fork_prepare(void) { pthread_mutex_lock(&lifetime_lock); }

void um__tcache_fork_parent(void) { pthread_mutex_unlock(&lifetime_lock); }

void um__tcache_fork_child(void) {
  for (um__tcache *tc = thread_caches; tc != NULL; tc = tc->t_next)
    atomic_store_explicit(&tc->m, NULL, memory_order_relaxed);
  um__tcache_last = NULL;
  pthread_mutex_unlock(&lifetime_lock);
}

/* ------------------------------------------------------------------------ */
/* bytes_in_use outside the hit paths */

void um__stat_in_use_add(um_device *d, uint64_t bytes) {
  um_manager *m = d->m;
  um__tcache *tc = um__tcache_for(m, d);
  if (tc != NULL) {
    um__tcache_count_in(tc, d, bytes);
    return;
  }
  um__atomic_add_relaxed(&d->stats.bytes_in_use, bytes);
  um__atomic_add_relaxed(&m->bytes_in_use, bytes);
  um__tcache_note_high(d);
}

void um__stat_in_use_sub(um_device *d, uint64_t bytes) {
  um__tcache *tc = um__tcache_for(d->m, d);
  if (tc != NULL) {
    um__tcache_count_out(tc, d, bytes);
    return;
  }
  um__atomic_sub_relaxed(&d->stats.bytes_in_use, bytes);
  um__atomic_sub_relaxed(&d->m->bytes_in_use, bytes);
}
