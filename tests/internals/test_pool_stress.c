/* Threaded stress of the pool with fixed seeds (after mimalloc's
 * test-stress.c): threads allocate and release random sizes with random
 * lifetimes on several locations, hand buffers to each other to release,
 * fill some (the locked release path), trim and read the statistics while
 * the others work. Each live buffer carries its owner's signature at both
 * ends, checked before release, so a block handed to two owners at once
 * shows. At the end the pool's invariants are checked from the inside:
 * - bytes_pooled is the sum of the capacities of the idle blocks, in bins
 *   and thread caches, and each bin's idle_bytes is its own sum;
 * - every idle block is in exactly one place and its descriptor is IDLE,
 *   and no descriptor is live;
 * - the limits hold (total and per class, budget included);
 * - active_buffers and bytes_in_use are 0, allocations == releases, and
 *   the pool's hits + misses are the pooled allocations made.
 * Run under TSan by the sanitizer build. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h" /* Criterion, or its stand-in under TSan */
#include "testing.h"
#include "tcache.h"

#define NTHREADS 6
#define OPS_PER_THREAD 6000
#define LIVE_PER_THREAD 24
#define EXCHANGE_SLOTS 32

typedef struct stress {
  um_manager *m;
  uint64_t seed;
  /* buffers handed between threads */
  pthread_mutex_t lock;
  um_buffer *exchange[EXCHANGE_SLOTS];
  atomic_uint_fast64_t pooled_allocs;
  atomic_uint_fast64_t all_allocs;
} stress;

typedef struct worker {
  stress *s;
  int id;
  uint64_t rng;
} worker;

static uint64_t next_rand(uint64_t *s) {
  /* xorshift64*: fixed seeds give the same sequence of requests */
  *s ^= *s >> 12;
  *s ^= *s << 25;
  *s ^= *s >> 27;
  return *s * 2685821657736338717ull;
}

/* Mostly small, some medium, a few large: as allocation traces look. */
static size_t pick_size(uint64_t *rng) {
  uint64_t r = next_rand(rng) % 100;
  if (r < 60)
    return 1 + next_rand(rng) % 2048;
  if (r < 90)
    return 2049 + next_rand(rng) % (128 * 1024);
  if (r < 99)
    return 128 * 1024 + next_rand(rng) % (1024 * 1024);
  return (1 + next_rand(rng) % 4) << 20;
}

static const um_location locations[] = {UM_HOST, UM_DEVICE, UM_UNIFIED};

/* The signature: 8 bytes at each end (the whole buffer when shorter). */
static void sign(um_buffer *b, uint64_t sig) {
  unsigned char *p = um_buffer_host_ptr(b);
  size_t n = um_buffer_size(b);
  cr_assert_not_null(p);
  if (n < 16) {
    memset(p, (int)(sig & 0xff), n);
    return;
  }
  memcpy(p, &sig, 8);
  memcpy(p + n - 8, &sig, 8);
}

static void check_sign(um_buffer *b, uint64_t sig) {
  unsigned char *p = um_buffer_host_ptr(b);
  size_t n = um_buffer_size(b);
  uint64_t head, tail;
  cr_assert_not_null(p);
  if (n < 16) {
    for (size_t i = 0; i < n; i++)
      cr_assert_eq(p[i], (unsigned char)(sig & 0xff), "buffer %p byte %zu changed hands", (void *)b, i);
    return;
  }
  memcpy(&head, p, 8);
  memcpy(&tail, p + n - 8, 8);
  cr_assert_eq(head, sig, "buffer %p: its block was handed to someone else", (void *)b);
  cr_assert_eq(tail, sig, "buffer %p: its block was handed to someone else", (void *)b);
}

/* The signature a buffer carries: its handle and size, so it survives a
 * hand-over between threads. */
static uint64_t sig_of(um_buffer *b) {
  return (uint64_t)(uintptr_t)b * 0x9e3779b97f4a7c15ull ^ (uint64_t)um_buffer_size(b);
}

static void release_checked(um_buffer *b) {
  check_sign(b, sig_of(b));
  cr_assert_eq(um_release(b), UM_OK);
}

static void *work(void *arg) {
  worker *w = arg;
  stress *s = w->s;
  um_manager *m = s->m;
  um_device *cpu = um_device_get(m, 0);
  um_buffer *live[LIVE_PER_THREAD] = {0};
  for (int op = 0; op < OPS_PER_THREAD; op++) {
    int k = (int)(next_rand(&w->rng) % LIVE_PER_THREAD);
    uint64_t r = next_rand(&w->rng) % 1000;
    if (r < 4) {
      /* a trim while the others work */
      cr_assert_eq(um_pool_trim(m, (next_rand(&w->rng) % 4) << 20), UM_OK);
    } else if (r < 12) {
      /* While others work the figures are read piece by piece (exact
       * once they stop); the budget behind the limit is one counter. */
      um_stats st;
      cr_assert_eq(um_stats_get(m, NULL, &st), UM_OK);
      cr_assert_leq(atomic_load(&m->pool_claimed), m->opts.max_pool_bytes);
    } else if (r < 120) {
      /* hand a buffer over, or take one handed over and release it */
      pthread_mutex_lock(&s->lock);
      int x = (int)(next_rand(&w->rng) % EXCHANGE_SLOTS);
      um_buffer *theirs = s->exchange[x];
      s->exchange[x] = live[k];
      pthread_mutex_unlock(&s->lock);
      live[k] = NULL;
      if (theirs != NULL)
        release_checked(theirs);
    } else if (live[k] != NULL) {
      if (r < 170 && um_buffer_size(live[k]) > 16) {
        /* an operation on it: the locked release path later */
        size_t n = um_buffer_size(live[k]);
        cr_assert_eq(um_fill(live[k], 8, 0x5c, n - 16, NULL), UM_OK);
      }
      release_checked(live[k]);
      live[k] = NULL;
    } else {
      size_t n = pick_size(&w->rng);
      um_location loc = locations[next_rand(&w->rng) % 3];
      uint64_t f = next_rand(&w->rng) % 20;
      unsigned flags = f == 0 ? UM_ALLOC_UNPOOLED : f == 1 ? UM_ALLOC_ZERO : 0;
      um_buffer *b = NULL;
      int st = um_alloc(m, cpu, n, loc, flags, &b);
      cr_assert_eq(st, UM_OK, "thread %d op %d: alloc %zu: %s", w->id, op, n, um_last_error());
      atomic_fetch_add(&s->all_allocs, 1);
      if (!(flags & UM_ALLOC_UNPOOLED))
        atomic_fetch_add(&s->pooled_allocs, 1);
      if ((flags & UM_ALLOC_ZERO) || m->opts.scrub) {
        const unsigned char *p = um_buffer_host_ptr(b);
        cr_assert_eq(p[0], 0);
        cr_assert_eq(p[n / 2], 0);
        cr_assert_eq(p[n - 1], 0);
      }
      sign(b, sig_of(b));
      live[k] = b;
    }
  }
  for (int k = 0; k < LIVE_PER_THREAD; k++)
    if (live[k] != NULL)
      release_checked(live[k]);
  return NULL;
}

static int cmp_ptr(const void *a, const void *b) {
  uintptr_t x = *(const uintptr_t *)a, y = *(const uintptr_t *)b;
  return x < y ? -1 : x > y;
}

/* Every invariant, with no other thread running: the trim timer's ticks
 * (which move blocks between caches, bins and devices) wait on the
 * manager's trimming lock meanwhile. */
static void check_invariants(stress *s) {
  um_manager *m = s->m;
  const um_options *o = &m->opts;
  um_stats st;
  uint64_t idle_sum = 0, claimed = 0, nidle = 0, ndesc_idle = 0, cap = 4096, n = 0;
  uintptr_t *seen = malloc(cap * sizeof(*seen));
  cr_assert_not_null(seen);
  pthread_mutex_lock(&m->trimming);
  cr_assert_eq(um_stats_get(m, NULL, &st), UM_OK);

  for (int di = 0; di < m->ndevices; di++) {
    um_device *d = m->devices[di];
    for (int l = 0; l < UM_LOCATION_COUNT; l++) {
      for (int c = 0; c < UM__CLASS_COUNT; c++) {
        um__bin *bin = &d->pools[l].bins[c];
        uint64_t sum = 0, last_key = UINT64_MAX;
        bool marked = (atomic_load(&d->pools[l].nonempty[c / 64]) >> (c % 64)) & 1;
        for (um_buffer *b = bin->head; b != NULL; b = b->pool_next) {
          cr_assert_eq(atomic_load(&b->state), UM__BUF_IDLE, "a block in a bin is not idle");
          cr_assert_eq(b->cls, c);
          cr_assert_eq(b->dev, d);
          cr_assert_eq(b->loc, (um_location)l);
          cr_assert_eq(b->capacity, um__class_size(c));
          cr_assert_leq(b->idle_key, last_key, "bin %d not sorted newest first", c);
          cr_assert(b->pool_next == NULL || b->pool_next->pool_prev == b);
          last_key = b->idle_key;
          sum += b->capacity;
          if (n == cap)
            cr_assert_not_null(seen = realloc(seen, (cap *= 2) * sizeof(*seen)));
          seen[n++] = (uintptr_t)b;
          nidle++;
        }
        cr_assert_eq(bin->idle_bytes, sum, "bin %d: idle_bytes is not its blocks' sum", c);
        cr_assert_eq(marked, sum != 0, "bin %d: non-empty bit out of date", c);
        cr_assert_leq(bin->idle_bytes + bin->reserved_bytes, o->max_pool_bytes_per_class);
        idle_sum += sum;
        claimed += bin->idle_bytes + bin->reserved_bytes;
      }
    }
  }
  for (um__tcache *tc = m->tcaches; tc != NULL; tc = tc->m_next) {
    size_t nslots = (size_t)tc->ndevices * UM_LOCATION_COUNT * UM__TCACHE_CLASSES;
    for (size_t i = 0; i < nslots; i++) {
      uintptr_t v = atomic_load(&tc->slots[i]);
      if (v > UM__TSLOT_RESERVED) {
        um_buffer *b = (um_buffer *)v;
        cr_assert_eq(atomic_load(&b->state), UM__BUF_IDLE, "a cached block is not idle");
        cr_assert_eq(b->capacity, um__class_size((int)(i % UM__TCACHE_CLASSES)));
        idle_sum += b->capacity;
        if (n == cap)
          cr_assert_not_null(seen = realloc(seen, (cap *= 2) * sizeof(*seen)));
        seen[n++] = v;
        nidle++;
      }
    }
  }
  qsort(seen, n, sizeof(*seen), cmp_ptr);
  for (uint64_t i = 1; i < n; i++)
    cr_assert_neq(seen[i], seen[i - 1], "block %p is idle in two places", (void *)seen[i]);
  for (um_buffer *b = m->all_buffers; b != NULL; b = b->all_next) {
    int state = atomic_load(&b->state);
    cr_assert_neq(state, UM__BUF_LIVE, "a buffer is still live");
    cr_assert_neq(state, UM__BUF_RELEASED, "a release never finished");
    if (state == UM__BUF_IDLE) {
      ndesc_idle++;
      cr_assert_not_null(bsearch(&b, seen, n, sizeof(*seen), cmp_ptr), "idle block %p is nowhere",
                         (void *)b);
    }
  }
  free(seen);

  cr_assert_eq(ndesc_idle, nidle);
  cr_assert_eq(st.bytes_pooled, idle_sum);
  cr_assert_leq(st.bytes_pooled, o->max_pool_bytes);
  cr_assert_eq(claimed, atomic_load(&m->pool_claimed));
  cr_assert_leq(claimed, o->max_pool_bytes);
  cr_assert_eq(st.active_buffers, 0);
  cr_assert_eq(st.bytes_in_use, 0);
  cr_assert_eq(st.bytes_reserved, st.bytes_pooled, "only idle blocks hold memory");
  cr_assert_eq(st.device_allocs - st.device_frees, nidle);
  cr_assert_eq(st.allocations, atomic_load(&s->all_allocs));
  cr_assert_eq(st.releases, st.allocations);
  cr_assert_eq(st.pool_hits + st.pool_misses, atomic_load(&s->pooled_allocs));
  pthread_mutex_unlock(&m->trimming);
}

static void run(um_options *o, uint64_t seed) {
  stress s;
  pthread_t t[NTHREADS];
  worker w[NTHREADS];
  um_stats st;
  memset(&s, 0, sizeof(s));
  s.seed = seed;
  pthread_mutex_init(&s.lock, NULL);
  cr_assert_eq(um_manager_create(o, &s.m), UM_OK, "%s", um_last_error());
  for (int i = 0; i < NTHREADS; i++) {
    w[i].s = &s;
    w[i].id = i;
    w[i].rng = seed * 0x100000001b3ull + (uint64_t)i * 0x9e3779b97f4a7c15ull + 1;
    cr_assert_eq(pthread_create(&t[i], NULL, work, &w[i]), 0);
  }
  for (int i = 0; i < NTHREADS; i++)
    cr_assert_eq(pthread_join(t[i], NULL), 0);
  for (int x = 0; x < EXCHANGE_SLOTS; x++)
    if (s.exchange[x] != NULL)
      release_checked(s.exchange[x]);
  check_invariants(&s);
  /* and everything goes back on a full trim */
  cr_assert_eq(um_pool_trim(s.m, 0), UM_OK);
  cr_assert_eq(um_stats_get(s.m, NULL, &st), UM_OK);
  cr_assert_eq(st.bytes_pooled, 0);
  cr_assert_eq(st.bytes_reserved, 0);
  cr_assert_eq(st.device_allocs, st.device_frees);
  cr_assert_eq(um_manager_destroy(s.m), UM_OK);
  pthread_mutex_destroy(&s.lock);
}

Test(stress, default_limits, .timeout = 280) {
  um_options o;
  ut_options(&o);
  run(&o, 1);
}

/* Limits small enough that eviction, budget and flush requests run all the
 * time. */
Test(stress, tight_limits, .timeout = 280) {
  um_options o;
  ut_options(&o);
  o.max_pool_bytes = 3u << 20;
  o.max_pool_bytes_per_class = 384u << 10;
  run(&o, 2);
}

/* The trim timer works while the threads do. */
Test(stress, with_trim_timer, .timeout = 280) {
  um_options o;
  ut_options(&o);
  o.trim_interval_ms = 5;
  run(&o, 3);
}

/* Zeroing of every reused block, on the cache path. */
Test(stress, scrub, .timeout = 280) {
  um_options o;
  ut_options(&o);
  o.scrub = 1;
  run(&o, 4);
}
