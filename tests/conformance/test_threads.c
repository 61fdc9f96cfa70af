/* Threads: two and four threads allocate, copy, verify and release at the
 * same time (fixed seeds), some buffers handed from one thread to another
 * for release; at the end nothing is live and every figure adds up. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

/* Per thread; fewer under ThreadSanitizer, which slows every memory
 * access and every copy several times over. */
#ifdef UT_TSAN
#define ITERATIONS 400
#else
#define ITERATIONS 1200
#endif

#define SLOTS 16

typedef struct shared {
  um_manager *m;
  um_device *cpu;
  /* buffers passed between threads: each holds a buffer filled with the
   * pattern of its seed, or NULL */
  pthread_mutex_t slot_lock;
  um_buffer *slot[SLOTS];
  uint64_t slot_seed[SLOTS];
  atomic_uint_fast64_t h2d, d2h, d2d, fills, allocs, pooled_allocs;
  atomic_int failures;
} shared;

typedef struct worker {
  shared *s;
  uint64_t seed;
  char error[256];
} worker;

#define CHECK(w, cond, ...)                                                    \
  do {                                                                         \
    if (!(cond)) {                                                             \
      snprintf((w)->error, sizeof((w)->error), __VA_ARGS__);                   \
      atomic_fetch_add(&(w)->s->failures, 1);                                  \
      return NULL;                                                             \
    }                                                                          \
  } while (0)

static size_t pick_size(uint64_t *rng) {
  switch (ut_rand(rng) % 8) {
  case 0: return ut_range(rng, 1, 64);
  case 1: return ut_range(rng, 300 * 1024, 1u << 20); /* worker-sized */
  default: return ut_range(rng, 65, 32 * 1024);
  }
}

/* Verify a buffer holds pattern seed over its whole size. */
static int holds_pattern(um_buffer *b, uint64_t seed, unsigned char *want, unsigned char *got) {
  size_t n = um_buffer_size(b);
  ut_pattern(want, n, seed);
  if (um_copy_to_host(b, 0, got, n, NULL) != UM_OK)
    return 0;
  return memcmp(want, got, n) == 0;
}

static void *run(void *arg) {
  worker *w = arg;
  shared *s = w->s;
  uint64_t rng = w->seed;
  unsigned char *src = malloc(1u << 20), *got = malloc(1u << 20), *want = malloc(1u << 20);
  CHECK(w, src && got && want, "out of memory");
  for (int it = 0; it < ITERATIONS; it++) {
    size_t n = pick_size(&rng);
    um_location loc = (um_location)(ut_rand(&rng) % 4 == 0 ? UM_DEVICE : ut_rand(&rng) % 2 ? UM_HOST : UM_UNIFIED);
    unsigned flags = ut_rand(&rng) % 8 == 0 ? UM_ALLOC_UNPOOLED : 0;
    uint64_t pseed = ut_rand(&rng);
    um_buffer *a = NULL, *b = NULL;
    um_event *e = NULL;
    int st;

    st = um_alloc(s->m, s->cpu, n, loc, flags, &a);
    CHECK(w, st == UM_OK, "alloc %zu: %s", n, um_err_name(st));
    atomic_fetch_add(&s->allocs, 1);
    if (!(flags & UM_ALLOC_UNPOOLED))
      atomic_fetch_add(&s->pooled_allocs, 1);
    ut_pattern(src, n, pseed);
    if (ut_rand(&rng) % 2) {
      st = um_copy_from_host(a, 0, src, n, &e);
      CHECK(w, st == UM_OK, "async copy in: %s", um_err_name(st));
      st = um_event_wait(e);
      um_event_release(e);
    } else {
      st = um_copy_from_host(a, 0, src, n, NULL);
    }
    CHECK(w, st == UM_OK, "copy in: %s", um_err_name(st));
    atomic_fetch_add(&s->h2d, n);

    /* a second buffer, a device-local copy, a fill of its tail */
    if (ut_rand(&rng) % 3 == 0) {
      st = um_alloc(s->m, s->cpu, n, UM_HOST, 0, &b);
      CHECK(w, st == UM_OK, "alloc b: %s", um_err_name(st));
      atomic_fetch_add(&s->allocs, 1);
      atomic_fetch_add(&s->pooled_allocs, 1);
      st = um_copy(b, 0, a, 0, n, NULL);
      CHECK(w, st == UM_OK, "copy: %s", um_err_name(st));
      atomic_fetch_add(&s->d2d, n);
      CHECK(w, holds_pattern(b, pseed, want, got), "copy between buffers lost data");
      atomic_fetch_add(&s->d2h, n);
      st = um_fill(b, n / 2, 0xa5, n - n / 2, NULL);
      CHECK(w, st == UM_OK, "fill: %s", um_err_name(st));
      atomic_fetch_add(&s->fills, 1);
      st = um_copy_to_host(b, n / 2, got, n - n / 2, NULL);
      CHECK(w, st == UM_OK && ut_all_bytes(got, n - n / 2, 0xa5), "fill lost");
      atomic_fetch_add(&s->d2h, n - n / 2);
      CHECK(w, um_release(b) == UM_OK, "release b");
    }

    CHECK(w, holds_pattern(a, pseed, want, got), "round trip lost data (%zu bytes)", n);
    atomic_fetch_add(&s->d2h, n);

    /* Hand a to another thread through a slot, and release what was
     * there after checking that it still holds its own pattern. */
    if (ut_rand(&rng) % 4 == 0) {
      int k = (int)(ut_rand(&rng) % SLOTS);
      uint64_t old_seed;
      um_buffer *old;
      pthread_mutex_lock(&s->slot_lock);
      old = s->slot[k];
      old_seed = s->slot_seed[k];
      s->slot[k] = a;
      s->slot_seed[k] = pseed;
      pthread_mutex_unlock(&s->slot_lock);
      if (old != NULL) {
        CHECK(w, holds_pattern(old, old_seed, want, got), "a handed-over buffer changed");
        atomic_fetch_add(&s->d2h, um_buffer_size(old));
        CHECK(w, um_release(old) == UM_OK, "release of a handed-over buffer");
      }
    } else {
      CHECK(w, um_release(a) == UM_OK, "release a");
    }
  }
  free(src);
  free(got);
  free(want);
  return NULL;
}

static void stress(int nthreads, uint64_t seed) {
  shared *s = calloc(1, sizeof(*s));
  worker w[8];
  pthread_t t[8];
  um_stats st;
  cr_assert_not_null(s);
  pthread_mutex_init(&s->slot_lock, NULL);
  s->m = ut_manager();
  s->cpu = um_device_get(s->m, 0);
  for (int i = 0; i < nthreads; i++) {
    w[i].s = s;
    w[i].seed = seed + (uint64_t)i * 0x1000193u;
    w[i].error[0] = '\0';
    cr_assert_eq(pthread_create(&t[i], NULL, run, &w[i]), 0);
  }
  for (int i = 0; i < nthreads; i++) {
    pthread_join(t[i], NULL);
    cr_expect_eq(w[i].error[0], '\0', "thread %d: %s", i, w[i].error);
  }
  cr_assert_eq(atomic_load(&s->failures), 0);
  /* release what is left in the slots */
  for (int k = 0; k < SLOTS; k++) {
    um_buffer *b = s->slot[k];
    if (b != NULL)
      cr_assert_eq(um_release(b), UM_OK);
  }
  cr_assert_eq(um_device_synchronize(s->cpu), UM_OK);
  st = ut_stats(s->m, NULL);
  cr_assert_eq(st.active_buffers, 0);
  cr_assert_eq(st.bytes_in_use, 0);
  cr_assert_eq(st.allocations, atomic_load(&s->allocs));
  cr_assert_eq(st.releases, st.allocations);
  cr_assert_eq(st.pool_hits + st.pool_misses, atomic_load(&s->pooled_allocs));
  cr_assert_gt(st.pool_hits, 0);
  cr_assert_eq(st.bytes_h2d, atomic_load(&s->h2d));
  cr_assert_eq(st.bytes_d2h, atomic_load(&s->d2h));
  cr_assert_eq(st.bytes_d2d, atomic_load(&s->d2d));
  cr_assert_eq(st.fills, atomic_load(&s->fills));
  cr_assert_leq(st.bytes_pooled, st.bytes_reserved);
  cr_assert_eq(st.device_allocs - st.device_frees > 0, st.bytes_reserved > 0);
  cr_assert_eq(um_pool_trim(s->m, 0), UM_OK);
  st = ut_stats(s->m, NULL);
  cr_assert_eq(st.bytes_pooled, 0);
  cr_assert_eq(st.bytes_reserved, 0);
  cr_assert_eq(st.device_allocs, st.device_frees);
  cr_assert_eq(um_manager_destroy(s->m), UM_OK);
  pthread_mutex_destroy(&s->slot_lock);
  free(s);
}

Test(threads, two_threads, .timeout = 240) { stress(2, 0x5eed0002); }
Test(threads, four_threads, .timeout = 240) { stress(4, 0x5eed0004); }

/* Many threads on one buffer's disjoint ranges: every write lands. */
static um_buffer *shared_buf;

static void *write_own_range(void *arg) {
  int id = (int)(intptr_t)arg;
  unsigned char chunk[4096];
  for (int i = 0; i < 64; i++) {
    memset(chunk, (id * 64 + i) & 0xff, sizeof(chunk));
    if (um_copy_from_host(shared_buf, ((size_t)id * 64 + (size_t)i) * sizeof(chunk), chunk, sizeof(chunk),
                          NULL) != UM_OK)
      return (void *)1;
  }
  return NULL;
}

Test(threads, one_buffer_disjoint_ranges) {
  um_manager *m = ut_manager();
  pthread_t t[4];
  unsigned char *back = malloc(4 * 64 * 4096);
  cr_assert_not_null(back);
  cr_assert_eq(um_alloc(m, um_device_get(m, 0), 4 * 64 * 4096, UM_DEVICE, 0, &shared_buf), UM_OK);
  for (int i = 0; i < 4; i++)
    cr_assert_eq(pthread_create(&t[i], NULL, write_own_range, (void *)(intptr_t)i), 0);
  for (int i = 0; i < 4; i++) {
    void *r;
    pthread_join(t[i], &r);
    cr_assert_null(r);
  }
  cr_assert_eq(um_copy_to_host(shared_buf, 0, back, 4 * 64 * 4096, NULL), UM_OK);
  for (int i = 0; i < 4 * 64; i++)
    cr_assert(ut_all_bytes(back + (size_t)i * 4096, 4096, (unsigned char)(i & 0xff)), "chunk %d", i);
  cr_assert_eq(um_release(shared_buf), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
  free(back);
}
