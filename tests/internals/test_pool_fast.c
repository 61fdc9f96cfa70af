/* The pool's fast path: per-thread caches in front of the bins (tcache.h).
 *
 * What must hold: a block released on a thread comes back to that thread;
 * a block released on another thread serves that thread; a thread's exit
 * and a manager's destroy give cached blocks back (no leak, no crash, in
 * either order); trims, the trim timer and memory pressure reach blocks
 * cached by any thread; the limits count cached blocks; statistics stay
 * exact on one thread. Pressure runs on a test-only backend ("tiny") whose
 * one device has 1 MiB of memory. */
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "test_util.h" /* Criterion, or its stand-in under TSan */
#include "testing.h"
#include "tcache.h"
#include "testhook.h"

#define KiB ((size_t)1024)
#define MiB (1024 * KiB)

static um_manager *make(void (*tweak)(um_options *)) {
  um_options o;
  um_manager *m = NULL;
  ut_options(&o);
  if (tweak != NULL)
    tweak(&o);
  cr_assert_eq(um_manager_create(&o, &m), UM_OK, "%s", um_last_error());
  return m;
}

static um_stats stats(um_manager *m, um_device *d) {
  um_stats s;
  cr_assert_eq(um_stats_get(m, d, &s), UM_OK);
  return s;
}

static um_buffer *alloc_on(um_manager *m, int dev, size_t n, um_location loc, unsigned flags) {
  um_buffer *b = NULL;
  int st = um_alloc(m, um_device_get(m, dev), n, loc, flags, &b);
  cr_assert_eq(st, UM_OK, "alloc %zu: %s (%s)", n, um_err_name(st), um_last_error());
  return b;
}

static um_buffer *alloc(um_manager *m, size_t n) { return alloc_on(m, 0, n, UM_HOST, 0); }

static uint64_t cls_size(size_t n) { return um__class_size(um__size_class_of(n)); }

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* Run fn(arg) on a new thread and wait for it. */
static void on_thread(void *(*fn)(void *), void *arg) {
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, fn, arg), 0);
  cr_assert_eq(pthread_join(t, NULL), 0);
}

/* A two-party handshake, for threads that must stay alive while the main
 * thread acts. */
typedef struct gate {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  int step;
} gate;

static void gate_init(gate *g) {
  pthread_mutex_init(&g->lock, NULL);
  pthread_cond_init(&g->cond, NULL);
  g->step = 0;
}

static void gate_set(gate *g, int step) {
  pthread_mutex_lock(&g->lock);
  g->step = step;
  pthread_cond_broadcast(&g->cond);
  pthread_mutex_unlock(&g->lock);
}

static void gate_wait(gate *g, int step) {
  pthread_mutex_lock(&g->lock);
  while (g->step < step)
    pthread_cond_wait(&g->cond, &g->lock);
  pthread_mutex_unlock(&g->lock);
}

/* ------------------------------------------------------------------------ */
/* One thread */

Test(fast, same_block_back_on_the_same_thread) {
  um_manager *m = make(NULL);
  um_buffer *a = alloc(m, 1000), *b;
  void *p = um_buffer_host_ptr(a);
  for (int i = 0; i < 100; i++) {
    cr_assert_eq(um_release(a), UM_OK);
    b = alloc(m, 1000 + (size_t)(i % 24)); /* all of class 1024 */
    cr_assert_eq(b, a);
    cr_assert_eq(um_buffer_host_ptr(b), p);
    cr_assert_eq(um_buffer_size(b), 1000 + (size_t)(i % 24));
  }
  um_stats s = stats(m, NULL);
  cr_assert_eq(s.pool_hits, 100);
  cr_assert_eq(s.pool_misses, 1);
  cr_assert_eq(s.allocations, 101);
  cr_assert_eq(s.releases, 100);
  cr_assert_eq(s.active_buffers, 1);
  cr_assert_eq(s.bytes_in_use, 1000 + 99 % 24);
  cr_assert_eq(s.bytes_pooled, 0);
  cr_assert_eq(s.device_allocs, 1);
  cr_assert_eq(um_release(a), UM_OK);
  s = stats(m, NULL);
  cr_assert_eq(s.bytes_pooled, 1024);
  cr_assert_eq(s.largest_pooled_block, 1024);
  cr_assert_eq(s.active_buffers, 0);
  cr_assert_eq(s.bytes_in_use, 0);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* Stats after a known sequence that uses the cache slot and the bin of one
 * class, and a second class: every figure exact, per device and in all. */
Test(fast, exact_stats_on_one_thread) {
  um_manager *m = make(NULL);
  um_device *cpu = um_device_get(m, 0);
  um_buffer *a = alloc(m, 1000), *b = alloc(m, 3000), *c, *d, *e;
  um_stats s = stats(m, cpu);
  cr_assert_eq(s.peak_bytes_in_use, 4000);
  cr_assert_eq(s.bytes_reserved, 1024 + 3072);
  cr_assert_eq(um_release(a), UM_OK); /* a in the slot of class 1024 */
  c = alloc(m, 500);                  /* class 512: a miss */
  s = stats(m, cpu);
  cr_assert_eq(s.bytes_in_use, 3500);
  cr_assert_eq(s.peak_bytes_in_use, 4000);
  cr_assert_eq(s.bytes_pooled, 1024);
  d = alloc(m, 1000); /* a, from the slot */
  cr_assert_eq(d, a);
  e = alloc(m, 1000); /* a miss: a new 1024 block */
  s = stats(m, cpu);
  cr_assert_eq(s.bytes_in_use, 5500);
  cr_assert_eq(s.peak_bytes_in_use, 5500);
  cr_assert_eq(s.pool_hits, 1);
  cr_assert_eq(s.pool_misses, 4);
  cr_assert_eq(s.bytes_pooled, 0);
  cr_assert_eq(um_release(d), UM_OK); /* d (= a) into the slot */
  cr_assert_eq(um_release(e), UM_OK); /* e into the slot, d to the bin */
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_release(c), UM_OK);
  s = stats(m, cpu);
  cr_assert_eq(s.active_buffers, 0);
  cr_assert_eq(s.bytes_in_use, 0);
  cr_assert_eq(s.bytes_pooled, 1024 + 1024 + 3072 + 512);
  cr_assert_eq(s.bytes_reserved, s.bytes_pooled);
  cr_assert_eq(s.largest_pooled_block, 3072);
  cr_assert_float_eq(s.fragmentation, 1.0 - 3072.0 / 5632.0, 1e-12);
  cr_assert_float_eq(s.hit_rate, 1.0 / 5.0, 1e-12);
  cr_assert_eq(s.allocations, 5);
  cr_assert_eq(s.releases, 5);
  cr_assert_eq(s.peak_bytes_in_use, 5500);
  /* the newest comes back first: e from the slot, then d from the bin */
  cr_assert_eq(alloc(m, 1000), e);
  cr_assert_eq(alloc(m, 1000), d);
  s = stats(m, NULL);
  cr_assert_eq(s.pool_hits, 3);
  cr_assert_eq(s.bytes_pooled, 3072 + 512);
  cr_assert_eq(s.peak_bytes_in_use, 5500);
  cr_assert_eq(um_release(d), UM_OK);
  cr_assert_eq(um_release(e), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* A cache's reads and flushes visit only the slot groups its thread has
 * used (tcache.c, for_each_used), and the owner's own flush forgets them:
 * blocks cached in classes from 64 bytes to 1 MiB, at two locations, are
 * all counted and all trimmed, and so are those cached again after the
 * flush, at other sizes. */
Test(fast, stats_and_trims_see_every_class_used) {
  um_manager *m = make(NULL);
  const um_location locs[2] = {UM_HOST, UM_UNIFIED};
  uint64_t trimmed = 0;
  for (int round = 0; round < 2; round++) {
    uint64_t want = 0;
    um_buffer *b[2][15];
    um_stats s;
    for (int l = 0; l < 2; l++)
      for (int k = 0; k < 15; k++) {
        size_t n = ((size_t)64 << k) + (size_t)round * 40; /* round 1: the next class up */
        b[l][k] = alloc_on(m, 0, n, locs[l], 0);
        want += cls_size(n);
      }
    for (int l = 0; l < 2; l++)
      for (int k = 0; k < 15; k++)
        cr_assert_eq(um_release(b[l][k]), UM_OK);
    s = stats(m, NULL);
    cr_assert_eq(s.bytes_pooled, want, "round %d: %llu pooled, %llu cached", round,
                 (unsigned long long)s.bytes_pooled, (unsigned long long)want);
    cr_assert_eq(s.largest_pooled_block, cls_size(((size_t)64 << 14) + (size_t)round * 40));
    cr_assert_eq(stats(m, um_device_get(m, 0)).bytes_pooled, want);
    cr_assert_eq(um_pool_trim(m, 0), UM_OK);
    s = stats(m, NULL);
    cr_assert_eq(s.bytes_pooled, 0, "round %d", round);
    trimmed += want;
    cr_assert_eq(s.bytes_trimmed, trimmed, "round %d", round);
  }
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* A buffer with an operation on it takes the locked release path; its
 * block is cached all the same. UM_ALLOC_ZERO and scrub hold on cache
 * hits. */
Test(fast, touched_buffers_and_zeroing) {
  um_manager *m = make(NULL);
  um_buffer *a = alloc(m, 5000), *b;
  unsigned char back[5000];
  cr_assert_eq(um_fill(a, 0, 0xab, 5000, NULL), UM_OK);
  cr_assert_eq(um_release(a), UM_OK);
  b = alloc_on(m, 0, 5000, UM_HOST, UM_ALLOC_ZERO);
  cr_assert_eq(b, a);
  cr_assert_eq(um_copy_to_host(b, 0, back, sizeof(back), NULL), UM_OK);
  for (size_t i = 0; i < sizeof(back); i++)
    cr_assert_eq(back[i], 0, "byte %zu", i);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_release(b), UM_ESTATE, "a cached block's stale handle is released");
  cr_assert_eq(um_buffer_size(b), 0);
  cr_assert_eq(stats(m, NULL).pool_hits, 1);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* A block that comes back from this thread's slot after its last owner's
 * operation, mapping or bracket starts as a new allocation does: the
 * release that put it in the slot cleaned its descriptor (the hit sets
 * only generation, size and site). Then a mapping and a bracket work on
 * it as on a new buffer. */
Test(fast, a_hit_after_operations_mappings_and_brackets_starts_clean) {
  um_manager *m = make(NULL);
  um_buffer *a = alloc(m, 5000), *b;
  void *host, *wait;
  for (int round = 0; round < 3; round++) {
    if (round == 0) {
      cr_assert_eq(um_fill(a, 0, 0x5a, 5000, NULL), UM_OK);
    } else if (round == 1) {
      cr_assert_eq(um_map(a, UM_MAP_WRITE, 0, 100, &host), UM_OK); /* left mapped */
    } else {
      cr_assert_eq(um_access_begin(a, UM_MAP_READ_WRITE, &wait), UM_OK); /* left open */
    }
    cr_assert(atomic_load(&a->touched), "round %d", round);
    cr_assert_eq(um_release(a), UM_OK);
    b = alloc(m, 4900 + (size_t)round); /* the class of 5000 */
    cr_assert_eq(b, a, "round %d: a hit in the slot", round);
    cr_assert_eq(b->valid, UM_VALID_HOST | UM_VALID_DEVICE, "round %d", round);
    cr_assert(!b->mapped && !b->map_native && !b->map_busy, "round %d", round);
    cr_assert_null(b->map_ptr, "round %d", round);
    cr_assert_eq(b->map_off + b->map_len, 0, "round %d", round);
    cr_assert_null(b->last, "round %d", round);
    cr_assert_eq(b->pending, 0, "round %d", round);
    cr_assert(!b->release_deferred, "round %d", round);
    cr_assert_eq(b->access_state, 0, "round %d", round);
    cr_assert_null(b->access_op, "round %d", round);
    cr_assert(!atomic_load(&b->touched), "round %d", round);
    cr_assert_eq(atomic_load(&b->holds), 0, "round %d", round);
    cr_assert_eq(um_buffer_size(b), 4900 + (size_t)round);
    a = b;
  }
  cr_assert_eq(um_map(a, UM_MAP_READ_WRITE, 0, 4902, &host), UM_OK);
  cr_assert_eq(um_unmap(a, host), UM_OK);
  cr_assert_eq(um_access_begin(a, UM_MAP_READ_WRITE, &wait), UM_OK);
  cr_assert_eq(um_access_end(a, NULL), UM_OK);
  cr_assert_eq(um_release(a), UM_OK);
  cr_assert_eq(stats(m, NULL).pool_hits, 3);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

static void scrub_on(um_options *o) { o->scrub = 1; }

Test(fast, scrub_on_cache_hits) {
  um_manager *m = make(scrub_on);
  for (int i = 0; i < 5; i++) {
    um_buffer *a = alloc(m, 2000);
    unsigned char *p = um_buffer_host_ptr(a);
    for (int k = 0; k < 2000; k++)
      cr_assert_eq(p[k], 0, "round %d byte %d", i, k);
    memset(p, 0x77, 2000);
    cr_assert_eq(um_release(a), UM_OK);
  }
  cr_assert_eq(stats(m, NULL).pool_hits, 4);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* ------------------------------------------------------------------------ */
/* Several threads */

typedef struct job {
  um_manager *m;
  um_buffer *buf;
  um_buffer *got;
  size_t n;
  gate g;
} job;

/* Release the buffer handed over, then allocate the same size. */
static void *release_then_alloc(void *arg) {
  job *j = arg;
  cr_assert_eq(um_release(j->buf), UM_OK);
  cr_assert_eq(um_alloc(j->m, um_device_get(j->m, 0), j->n, UM_HOST, 0, &j->got), UM_OK);
  cr_assert_eq(um_release(j->got), UM_OK);
  return NULL;
}

Test(fast, cross_thread_release_serves_the_releasing_thread) {
  um_manager *m = make(NULL);
  job j = {.m = m, .n = 70000};
  um_stats s;
  j.buf = alloc(m, j.n);
  on_thread(release_then_alloc, &j);
  cr_assert_eq(j.got, j.buf, "the releasing thread's next allocation gets the block");
  /* that thread ended: its cached block went back to the bins */
  s = stats(m, NULL);
  cr_assert_eq(s.pool_hits, 1);
  cr_assert_eq(s.pool_misses, 1);
  cr_assert_eq(s.allocations, 2);
  cr_assert_eq(s.releases, 2);
  cr_assert_eq(s.active_buffers, 0);
  cr_assert_eq(s.bytes_in_use, 0);
  cr_assert_eq(s.bytes_pooled, cls_size(j.n));
  cr_assert_eq(alloc(m, j.n), j.buf);
  cr_assert_eq(um_release(j.buf), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

static const size_t exit_sizes[] = {100, 5000, 70000, 3 * MiB};

static void *fill_cache_and_exit(void *arg) {
  um_manager *m = arg;
  for (int i = 0; i < 4; i++) {
    um_buffer *b = NULL;
    cr_assert_eq(um_alloc(m, um_device_get(m, 0), exit_sizes[i], UM_HOST, 0, &b), UM_OK);
    cr_assert_eq(um_release(b), UM_OK);
  }
  return NULL;
}

Test(fast, thread_exit_gives_the_cache_back) {
  um_manager *m = make(NULL);
  uint64_t total = 0;
  um_stats s;
  on_thread(fill_cache_and_exit, m);
  for (int i = 0; i < 4; i++)
    total += cls_size(exit_sizes[i]);
  s = stats(m, NULL);
  cr_assert_eq(s.bytes_pooled, total);
  cr_assert_eq(s.bytes_reserved, total);
  cr_assert_eq(s.allocations, 4);
  cr_assert_eq(s.releases, 4);
  cr_assert_eq(s.active_buffers, 0);
  cr_assert_eq(s.peak_bytes_in_use, 3 * MiB);
  cr_assert_null(m->tcaches, "the exited thread's cache is gone");
  for (int i = 0; i < 4; i++) {
    um_buffer *b = alloc(m, exit_sizes[i]);
    cr_assert_eq(um_release(b), UM_OK);
  }
  s = stats(m, NULL);
  cr_assert_eq(s.pool_hits, 4);
  cr_assert_eq(s.device_allocs, 4);
  cr_assert_eq(s.bytes_pooled, total);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* Peaks of a thread that keeps growing (tcache.h, um__tcache_count_in):
 * its new highs reach the peaks in runs, at its next release, or when it
 * leaves; never a lock per allocation, and never a missed peak of its own. */
#define GROW_BLOCKS 200
#define GROW_BYTES 1000

typedef struct grower {
  um_manager *m;
  um_buffer *b[GROW_BLOCKS];
  int turn_down; /* release one block before handing the rest over */
  gate g;
} grower;

static void *grow_and_hand_over(void *arg) {
  grower *w = arg;
  for (int i = 0; i < GROW_BLOCKS; i++)
    w->b[i] = alloc(w->m, GROW_BYTES);
  if (w->turn_down) {
    cr_assert_eq(um_release(w->b[GROW_BLOCKS - 1]), UM_OK);
    w->b[GROW_BLOCKS - 1] = NULL;
  }
  gate_set(&w->g, 1);
  gate_wait(&w->g, 2); /* stays alive while another thread releases */
  return NULL;
}

/* The main thread releases every block the grower allocated, while the
 * grower is still alive, then the grower exits; returns the peak. */
static uint64_t grow_elsewhere(int turn_down) {
  grower w = {.m = make(NULL), .turn_down = turn_down};
  pthread_t t;
  um_stats s;
  gate_init(&w.g);
  cr_assert_eq(pthread_create(&t, NULL, grow_and_hand_over, &w), 0);
  gate_wait(&w.g, 1);
  for (int i = 0; i < GROW_BLOCKS; i++)
    if (w.b[i] != NULL)
      cr_assert_eq(um_release(w.b[i]), UM_OK);
  gate_set(&w.g, 2);
  cr_assert_eq(pthread_join(t, NULL), 0);
  s = stats(w.m, NULL);
  cr_assert_eq(s.bytes_in_use, 0);
  cr_assert_eq(s.active_buffers, 0);
  cr_assert_eq(um_manager_destroy(w.m), UM_OK);
  return s.peak_bytes_in_use;
}

/* The grower turned down once (its own release) before another thread
 * released the rest: the peak is exact. */
Test(fast, peak_of_a_growing_thread_at_its_turn) {
  cr_assert_eq(grow_elsewhere(1), (uint64_t)GROW_BLOCKS * GROW_BYTES);
}

/* Every block is released by another thread: the peak may be short by
 * what the grower allocated since its highs were last carried, less than a
 * sixteenth of its high and than UM__TCACHE_HIGH_BATCH blocks. */
Test(fast, peak_of_a_growing_thread_released_elsewhere) {
  uint64_t high = (uint64_t)GROW_BLOCKS * GROW_BYTES, peak = grow_elsewhere(0);
  cr_assert_leq(peak, high);
  cr_assert_gt(peak, high - high / 16, "peak %llu of %llu", (unsigned long long)peak,
               (unsigned long long)high);
  cr_assert_gt(peak, high - (uint64_t)UM__TCACHE_HIGH_BATCH * GROW_BYTES);
}

/* A growing thread's level is its high until it turns down: a stats read
 * in between shows it, on one thread exactly. */
Test(fast, peak_read_while_a_thread_grows) {
  um_manager *m = make(NULL);
  um_buffer *b[GROW_BLOCKS];
  for (int i = 0; i < GROW_BLOCKS; i++) {
    b[i] = alloc(m, GROW_BYTES);
    if (i % 37 == 0)
      cr_assert_eq(stats(m, um_device_get(m, 0)).peak_bytes_in_use, (uint64_t)(i + 1) * GROW_BYTES);
  }
  for (int i = 0; i < GROW_BLOCKS; i++)
    cr_assert_eq(um_release(b[i]), UM_OK);
  cr_assert_eq(stats(m, NULL).peak_bytes_in_use, (uint64_t)GROW_BLOCKS * GROW_BYTES);
  cr_assert_eq(stats(m, um_device_get(m, 0)).peak_bytes_in_use, (uint64_t)GROW_BLOCKS * GROW_BYTES);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* The manager goes while another thread still has blocks cached for it;
 * that thread then uses a new manager (perhaps at the same address) and
 * exits. Under ASan this also shows that nothing leaks. */
static void *outlive_manager(void *arg) {
  job *j = arg;
  um_manager *m2 = NULL;
  um_buffer *b = NULL;
  um_options o;
  cr_assert_eq(um_alloc(j->m, um_device_get(j->m, 0), 4000, UM_HOST, 0, &b), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_alloc(j->m, um_device_get(j->m, 0), 2 * MiB, UM_PINNED, 0, &b), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  gate_set(&j->g, 1); /* cached: destroy it */
  gate_wait(&j->g, 2);
  ut_options(&o);
  cr_assert_eq(um_manager_create(&o, &m2), UM_OK);
  cr_assert_eq(um_alloc(m2, um_device_get(m2, 0), 4000, UM_HOST, 0, &b), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  j->m = m2;
  return NULL; /* exits with a block cached for m2 */
}

Test(fast, manager_destroyed_while_another_thread_caches_blocks) {
  job j = {.m = make(NULL)};
  pthread_t t;
  um_stats s;
  gate_init(&j.g);
  cr_assert_eq(pthread_create(&t, NULL, outlive_manager, &j), 0);
  gate_wait(&j.g, 1);
  s = stats(j.m, NULL);
  cr_assert_eq(s.bytes_pooled, 4096 + 2 * MiB);
  cr_assert_eq(um_manager_destroy(j.m), UM_OK);
  gate_set(&j.g, 2);
  cr_assert_eq(pthread_join(t, NULL), 0);
  s = stats(j.m, NULL); /* m2, whose cached block came back at the exit */
  cr_assert_eq(s.bytes_pooled, 4096);
  cr_assert_eq(s.device_allocs, 1);
  um_buffer *b = alloc(j.m, 4000);
  cr_assert_eq(stats(j.m, NULL).pool_hits, 1);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_manager_destroy(j.m), UM_OK);
}

/* The same thread uses two managers at once, then one goes. */
Test(fast, two_managers_on_one_thread) {
  um_manager *m1 = make(NULL), *m2 = make(NULL);
  um_buffer *a = alloc(m1, 1000), *b = alloc(m2, 1000);
  cr_assert_eq(um_release(a), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(alloc(m1, 1000), a);
  cr_assert_eq(alloc(m2, 1000), b);
  cr_assert_eq(um_release(a), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_manager_destroy(m1), UM_OK);
  cr_assert_eq(alloc(m2, 1000), b);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(stats(m2, NULL).pool_hits, 2);
  m1 = make(NULL); /* maybe at m1's old address: a fresh cache all the same */
  a = alloc(m1, 1000);
  cr_assert_eq(stats(m1, NULL).pool_misses, 1);
  cr_assert_eq(um_release(a), UM_OK);
  cr_assert_eq(um_manager_destroy(m1), UM_OK);
  cr_assert_eq(um_manager_destroy(m2), UM_OK);
}

/* A thread caches a block and waits, alive, while the main thread acts. */
typedef struct holder {
  um_manager *m;
  int dev;
  size_t n;
  um_location loc;
  um_buffer *buf;
  gate g;
} holder;

static void *cache_and_wait(void *arg) {
  holder *h = arg;
  um_buffer *b = NULL;
  cr_assert_eq(um_alloc(h->m, um_device_get(h->m, h->dev), h->n, h->loc, 0, &b), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  h->buf = b;
  gate_set(&h->g, 1);
  gate_wait(&h->g, 2);
  return NULL;
}

static void start_holder(holder *h, pthread_t *t) {
  gate_init(&h->g);
  cr_assert_eq(pthread_create(t, NULL, cache_and_wait, h), 0);
  gate_wait(&h->g, 1);
}

static void stop_holder(holder *h, pthread_t t) {
  gate_set(&h->g, 2);
  cr_assert_eq(pthread_join(t, NULL), 0);
}

Test(fast, trim_reaches_every_threads_cache) {
  um_manager *m = make(NULL);
  holder h = {.m = m, .n = 300000, .loc = UM_UNIFIED};
  pthread_t t;
  um_buffer *mine = alloc(m, 1000);
  um_stats s;
  start_holder(&h, &t);
  cr_assert_eq(um_release(mine), UM_OK);
  s = stats(m, NULL);
  cr_assert_eq(s.bytes_pooled, 1024 + cls_size(h.n));
  /* oldest first: the other thread's block went idle first */
  cr_assert_eq(um_pool_trim(m, 1024), UM_OK);
  s = stats(m, NULL);
  cr_assert_eq(s.trims, 1);
  cr_assert_eq(s.bytes_trimmed, cls_size(h.n));
  cr_assert_eq(s.bytes_pooled, 1024);
  cr_assert_eq(um_pool_trim(m, 0), UM_OK);
  s = stats(m, NULL);
  cr_assert_eq(s.trims, 2);
  cr_assert_eq(s.bytes_pooled, 0);
  cr_assert_eq(s.bytes_reserved, 0);
  cr_assert_eq(s.device_frees, 2);
  cr_assert_eq(atomic_load(&m->pool_claimed) <= 1024 + cls_size(h.n), true);
  stop_holder(&h, t);
  /* the empty slots' budget came back when their owners saw the request */
  cr_assert_eq(atomic_load(&m->pool_claimed), 0);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

static void timer_50ms(um_options *o) { o->trim_interval_ms = 50; }

Test(fast, trim_timer_reaches_another_threads_cache) {
  um_manager *m = make(timer_50ms);
  holder h = {.m = m, .n = 100000, .loc = UM_HOST};
  pthread_t t;
  start_holder(&h, &t);
  for (int waited = 0; waited < 3000 && stats(m, NULL).trims < 1; waited += 10)
    sleep_ms(10);
  um_stats s = stats(m, NULL);
  cr_assert_eq(s.trims, 1, "the timer did not reach the other thread's block within 3 s");
  cr_assert_eq(s.bytes_trimmed, cls_size(h.n));
  cr_assert_eq(s.bytes_pooled, 0);
  cr_assert_eq(s.bytes_reserved, 0);
  stop_holder(&h, t);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* ------------------------------------------------------------------------ */
/* Limits */

static void tight(um_options *o) {
  o->max_pool_bytes = 16 * KiB;
  o->max_pool_bytes_per_class = 8 * KiB;
}

static void check_budget(um_manager *m) {
  um_stats s = stats(m, NULL);
  uint64_t claimed = 0;
  cr_assert_leq(s.bytes_pooled, 16 * KiB);
  cr_assert_leq(atomic_load(&m->pool_claimed), 16 * KiB);
  for (int l = 0; l < UM_LOCATION_COUNT; l++)
    for (int c = 0; c < UM__CLASS_COUNT; c++) {
      um__bin *bin = &m->devices[0]->pools[l].bins[c];
      pthread_mutex_lock(&bin->lock);
      cr_assert_leq(bin->idle_bytes + bin->reserved_bytes, 8 * KiB, "class %d", c);
      claimed += bin->idle_bytes + bin->reserved_bytes;
      pthread_mutex_unlock(&bin->lock);
    }
  cr_assert_eq(claimed, atomic_load(&m->pool_claimed));
}

typedef struct churn_arg {
  um_manager *m;
  uint64_t seed;
} churn_arg;

static uint64_t next_rand(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

static void *churn(void *arg) {
  churn_arg *c = arg;
  um_buffer *live[8] = {0};
  for (int i = 0; i < 3000; i++) {
    int k = (int)(next_rand(&c->seed) % 8);
    if (live[k]) {
      cr_assert_eq(um_release(live[k]), UM_OK);
      live[k] = NULL;
    } else {
      size_t n = 1 + next_rand(&c->seed) % (6 * KiB);
      cr_assert_eq(um_alloc(c->m, um_device_get(c->m, 0), n, UM_HOST, 0, &live[k]), UM_OK);
    }
  }
  for (int k = 0; k < 8; k++)
    if (live[k])
      cr_assert_eq(um_release(live[k]), UM_OK);
  return NULL;
}

/* Takes racing flushes (tcache.h, "Taking without a locked instruction"):
 * two threads take and put their slots' blocks as fast as they can, each
 * block signed by its taker and checked on the way back, while this thread
 * flushes every cache (um_pool_trim) again and again. A block taken twice
 * shows as a signature overwritten by the other thread, or as a state
 * other than live; under TSan, a missing order shows as a race. Run with
 * the membarrier take where the kernel has it, and with the CAS take. */
#define RACE_TAKES 200000
#define RACE_TRIMS 50000

typedef struct racer {
  um_manager *m;
  unsigned char sig;
  atomic_int *stop;
  atomic_long taken;
  long bad;
} racer;

static void *race_takes(void *arg) {
  racer *r = arg;
  while (!atomic_load(r->stop)) {
    for (int i = 0; i < 64; i++) {
      um_buffer *b = NULL;
      unsigned char *p;
      if (um_alloc(r->m, um_device_get(r->m, 0), 1000, UM_HOST, 0, &b) != UM_OK) {
        r->bad++;
        continue;
      }
      p = um_buffer_host_ptr(b);
      memset(p, r->sig, 1000);
      for (int k = 0; k < 1000; k += 97)
        r->bad += p[k] != r->sig;
      r->bad += atomic_load(&b->state) != UM__BUF_LIVE;
      atomic_fetch_add(&r->taken, 1);
      r->bad += um_release(b) != UM_OK;
    }
  }
  return NULL;
}

static void no_asym(um__test_point point, void *arg) {
  if (point == UM__TP_TCACHE_NEW)
    ((um__tcache *)arg)->asym = false;
}

static void takes_race_flushes(bool cas_only) {
  um_manager *m = make(NULL);
  atomic_int stop = 0;
  racer r[2] = {{m, 0x5A, &stop, 0, 0}, {m, 0xA5, &stop, 0, 0}};
  atomic_init(&r[0].taken, 0);
  atomic_init(&r[1].taken, 0);
  pthread_t t[2];
  um_stats s;
  if (cas_only)
    atomic_store(&um__test_hook, no_asym);
  for (int i = 0; i < 2; i++)
    cr_assert_eq(pthread_create(&t[i], NULL, race_takes, &r[i]), 0);
  /* until each taker took RACE_TAKES blocks, and at least RACE_TRIMS
   * trims ran (a minute at most: the check below then says which). */
  for (long i = 0, t0 = (long)time(NULL);
       (atomic_load(&r[0].taken) < RACE_TAKES || atomic_load(&r[1].taken) < RACE_TAKES || i < RACE_TRIMS) &&
       (long)time(NULL) - t0 < 60;
       i++) {
    cr_assert_eq(um_pool_trim(m, i % 3 == 0 ? 0 : 1024), UM_OK);
    if (i % 64 == 0)
      sched_yield(); /* on two CPUs, let the takers run */
  }
  atomic_store(&stop, 1);
  for (int i = 0; i < 2; i++)
    cr_assert_eq(pthread_join(t[i], NULL), 0);
  atomic_store(&um__test_hook, NULL);
  for (int i = 0; i < 2; i++) {
    cr_assert_eq(r[i].bad, 0, "thread %d: %ld bad checks", i, r[i].bad);
    cr_assert_geq(atomic_load(&r[i].taken), RACE_TAKES);
  }
  s = stats(m, NULL);
  cr_assert_eq(s.active_buffers, 0);
  cr_assert_eq(s.allocations, (uint64_t)(atomic_load(&r[0].taken) + atomic_load(&r[1].taken)));
  cr_assert_eq(s.bytes_in_use, 0);
  cr_assert_eq(um_pool_trim(m, 0), UM_OK);
  s = stats(m, NULL);
  cr_assert_eq(s.bytes_pooled, 0);
  cr_assert_eq(s.device_allocs, s.device_frees);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

Test(fast, takes_race_flushes, .timeout = 120) { takes_race_flushes(false); }

Test(fast, cas_takes_race_flushes, .timeout = 120) { takes_race_flushes(true); }

static void total_8k(um_options *o) { o->max_pool_bytes = 8 * KiB; }

/* Whether b sits in a slot of one of m's thread caches. */
static bool in_a_slot(um_manager *m, um_buffer *b) {
  bool found = false;
  pthread_mutex_lock(&m->tcache_lock);
  for (um__tcache *tc = m->tcaches; tc != NULL; tc = tc->m_next)
    for (size_t i = 0; i < (size_t)tc->ndevices * UM_LOCATION_COUNT * UM__TCACHE_CLASSES; i++)
      found |= atomic_load(&tc->slots[i]) == (uintptr_t)b;
  pthread_mutex_unlock(&m->tcache_lock);
  return found;
}

/* A release into a pool at its limit makes room from the bins' oldest
 * blocks while they are older than it: another thread's cached block stays
 * in its slot, and no flush is asked of every thread (which would send
 * them all down the slow path on every such release). */
Test(fast, full_pool_evicts_from_the_bins_before_the_caches) {
  um_manager *m = make(total_8k);
  holder h = {.m = m, .n = 1000, .loc = UM_HOST};
  pthread_t t;
  um_buffer *a1 = alloc(m, 2000), *a2 = alloc(m, 2000), *a3 = alloc(m, 2000), *d = alloc(m, 4000);
  unsigned epoch;
  um_stats s;
  start_holder(&h, &t); /* h's 1 KiB block: idle first, in h's slot */
  cr_assert_eq(um_release(a1), UM_OK); /* this thread's 2 KiB slot */
  cr_assert_eq(um_release(a2), UM_OK); /* slot; a1 to the bin */
  cr_assert_eq(um_release(a3), UM_OK); /* slot; a2 to the bin */
  s = stats(m, NULL);
  cr_assert_eq(s.bytes_pooled, 1 * KiB + 6 * KiB);
  epoch = atomic_load(&m->flush_epoch);
  /* 4 KiB more: 11 KiB > 8 KiB; a1 and a2 (oldest in the bins) go. */
  cr_assert_eq(um_release(d), UM_OK);
  s = stats(m, NULL);
  cr_assert_eq(atomic_load(&m->flush_epoch), epoch, "a flush of every cache was asked");
  cr_assert_eq(s.bytes_pooled, 1 * KiB + 2 * KiB + 4 * KiB);
  cr_assert_eq(s.device_frees, 2);
  cr_assert_eq(atomic_load(&m->pool_claimed), 7 * KiB);
  cr_assert(in_a_slot(m, h.buf), "the other thread's cached block left its slot");
  stop_holder(&h, t);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

Test(fast, limits_count_cached_blocks) {
  um_manager *m = make(tight);
  um_buffer *b[6];
  /* six 4 KiB blocks: at most two fit in the class, cached or not */
  for (int i = 0; i < 6; i++)
    b[i] = alloc(m, 4 * KiB);
  for (int i = 0; i < 6; i++) {
    cr_assert_eq(um_release(b[i]), UM_OK);
    check_budget(m);
  }
  um_stats s = stats(m, NULL);
  cr_assert_eq(s.bytes_pooled, 8 * KiB);
  cr_assert_eq(s.device_frees, 4);
  /* the two newest stayed */
  cr_assert_eq(alloc(m, 4 * KiB), b[5]);
  cr_assert_eq(alloc(m, 4 * KiB), b[4]);
  cr_assert_eq(um_release(b[4]), UM_OK);
  cr_assert_eq(um_release(b[5]), UM_OK);
  /* threads churning under the limits; checked again once they are done */
  {
    pthread_t t[3];
    churn_arg a[3];
    for (int i = 0; i < 3; i++) {
      a[i].m = m;
      a[i].seed = 1234567u + (uint64_t)i * 7919u;
      cr_assert_eq(pthread_create(&t[i], NULL, churn, &a[i]), 0);
    }
    for (int i = 0; i < 3; i++)
      cr_assert_eq(pthread_join(t[i], NULL), 0);
  }
  check_budget(m);
  s = stats(m, NULL);
  cr_assert_eq(s.active_buffers, 0);
  cr_assert_eq(s.bytes_reserved, s.bytes_pooled);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* Budget held by another thread's empty slot comes back once that thread
 * sees the flush request. */
static void total_4k(um_options *o) { o->max_pool_bytes = 4 * KiB; }

static void *hold_slot_budget(void *arg) {
  holder *h = arg;
  um_buffer *b = NULL;
  um_device *cpu = um_device_get(h->m, 0);
  cr_assert_eq(um_alloc(h->m, cpu, 4 * KiB, UM_HOST, 0, &b), UM_OK);
  cr_assert_eq(um_release(b), UM_OK); /* cached: the slot holds the budget */
  cr_assert_eq(um_alloc(h->m, cpu, 4 * KiB, UM_HOST, 0, &b), UM_OK); /* slot empty, budget kept */
  h->buf = b;
  gate_set(&h->g, 1);
  gate_wait(&h->g, 2);
  cr_assert_eq(um_release(b), UM_OK); /* sees the request: gives the budget back first */
  gate_set(&h->g, 3);
  gate_wait(&h->g, 4);
  return NULL;
}

Test(fast, empty_slots_give_their_budget_back) {
  um_manager *m = make(total_4k);
  holder h = {.m = m};
  pthread_t t;
  um_buffer *mine = alloc(m, 4 * KiB);
  um_stats s;
  gate_init(&h.g);
  cr_assert_eq(pthread_create(&t, NULL, hold_slot_budget, &h), 0);
  gate_wait(&h.g, 1);
  cr_assert_eq(atomic_load(&m->pool_claimed), 4 * KiB);
  cr_assert_eq(um_release(mine), UM_OK); /* no budget left: freed */
  s = stats(m, NULL);
  cr_assert_eq(s.bytes_pooled, 0);
  cr_assert_eq(s.device_frees, 1);
  gate_set(&h.g, 2);
  gate_wait(&h.g, 3);
  /* the other thread gave its budget back and cached its block again */
  s = stats(m, NULL);
  cr_assert_eq(s.bytes_pooled, 4 * KiB);
  cr_assert_eq(atomic_load(&m->pool_claimed), 4 * KiB);
  gate_set(&h.g, 4);
  cr_assert_eq(pthread_join(t, NULL), 0);
  cr_assert_eq(alloc(m, 4 * KiB), h.buf);
  cr_assert_eq(um_release(h.buf), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* ------------------------------------------------------------------------ */
/* Pressure: a test-only backend with one device of 1 MiB. */

#define TINY_LIMIT MiB

static atomic_uint_fast64_t tiny_used;

static int tiny_open(const um_options *o, void **ctx, int *count) {
  (void)o;
  atomic_store(&tiny_used, 0);
  *ctx = &tiny_used;
  *count = 1;
  return UM_OK;
}

static int tiny_describe(void *ctx, int i, um__bdev_desc *out) {
  (void)i;
  memset(out, 0, sizeof(*out));
  snprintf(out->name, sizeof(out->name), "tiny test device");
  out->locations = (1u << UM_HOST) | (1u << UM_DEVICE);
  out->total_bytes = TINY_LIMIT;
  out->bdev = ctx;
  return UM_OK;
}

static void tiny_close(void *ctx) { (void)ctx; }

static int tiny_alloc(void *bdev, um_location loc, size_t bytes, um__mem *out) {
  uint_fast64_t used = atomic_load(&tiny_used);
  (void)bdev;
  (void)loc;
  do {
    if (bytes > TINY_LIMIT - used)
      return um__set_error(UM_ENOMEM, "tiny: %zu bytes do not fit (%llu in use)", bytes,
                           (unsigned long long)used);
  } while (!atomic_compare_exchange_weak(&tiny_used, &used, used + bytes));
  out->host = malloc(bytes);
  cr_assert_not_null(out->host);
  out->handle = (uintptr_t)out->host;
  return UM_OK;
}

static void tiny_free(void *bdev, um_location loc, size_t bytes, um__mem *mem) {
  (void)bdev;
  (void)loc;
  free(mem->host);
  mem->host = NULL;
  atomic_fetch_sub(&tiny_used, bytes);
}

static int tiny_memory(void *bdev, uint64_t *free_bytes, uint64_t *total_bytes) {
  (void)bdev;
  *total_bytes = TINY_LIMIT;
  *free_bytes = TINY_LIMIT - atomic_load(&tiny_used);
  return UM_OK;
}

static int tiny_synchronize(void *bdev) {
  (void)bdev;
  return UM_OK;
}

/* Its blocks are host memory: the cpu backend's transfers serve as they
 * are. */
static int tiny_xfer(void *bdev, const um__xfer *x) { return um__backend_cpu.xfer(bdev, x); }

static const um__backend tiny_backend = {
    .name = "tiny",
    .open = tiny_open,
    .describe = tiny_describe,
    .close = tiny_close,
    .mem_alloc = tiny_alloc,
    .mem_free = tiny_free,
    .memory = tiny_memory,
    .synchronize = tiny_synchronize,
    .xfer = tiny_xfer,
};

typedef struct oom_log {
  int calls;
  um_buffer *to_release;
} oom_log;

static oom_log the_oom_log;

static int on_oom(void *ctx, um_device *d, size_t bytes) {
  oom_log *l = ctx;
  (void)d;
  (void)bytes;
  l->calls++;
  if (l->to_release == NULL)
    return 0;
  cr_assert_eq(um_release(l->to_release), UM_OK); /* to the pool: the retry trims it */
  l->to_release = NULL;
  return 1;
}

static um_manager *make_tiny(int trim_on_pressure) {
  const um__backend *extra[] = {&tiny_backend};
  um_options o;
  um_manager *m = NULL;
  ut_options(&o);
  o.trim_on_pressure = trim_on_pressure;
  o.on_oom = on_oom;
  o.oom_ctx = &the_oom_log;
  memset(&the_oom_log, 0, sizeof(the_oom_log));
  cr_assert_eq(um__manager_create_ex(&o, extra, 1, &m), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_device_count(m), 2);
  return m;
}

Test(pressure, trim_reaches_another_threads_cache_then_retries) {
  um_manager *m = make_tiny(1);
  um_device *tiny = um_device_get(m, 1);
  holder h = {.m = m, .dev = 1, .n = 640 * KiB, .loc = UM_DEVICE};
  pthread_t t;
  um_buffer *mine;
  um_stats s;
  start_holder(&h, &t); /* 640 KiB idle in the other thread's cache */
  s = stats(m, tiny);
  cr_assert_eq(s.bytes_pooled, 640 * KiB);
  mine = alloc_on(m, 1, 512 * KiB, UM_DEVICE, 0); /* 640 + 512 > 1024 */
  s = stats(m, tiny);
  cr_assert_eq(s.oom_retries, 1);
  cr_assert_eq(s.trims, 1);
  cr_assert_eq(s.bytes_trimmed, 640 * KiB);
  cr_assert_eq(s.bytes_pooled, 0);
  cr_assert_eq(s.bytes_reserved, 512 * KiB);
  cr_assert_eq(s.pool_misses, 2);
  cr_assert_eq(the_oom_log.calls, 0);
  cr_assert_eq(stats(m, um_device_get(m, 0)).oom_retries, 0, "only the tiny device was under pressure");
  stop_holder(&h, t);
  cr_assert_eq(um_release(mine), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
  cr_assert_eq(atomic_load(&tiny_used), 0);
}

Test(pressure, callback_frees_memory_then_one_more_retry) {
  um_manager *m = make_tiny(1);
  um_device *tiny = um_device_get(m, 1);
  um_buffer *big = alloc_on(m, 1, 768 * KiB, UM_DEVICE, 0), *b = NULL;
  um_stats s;
  /* nothing idle to trim, the callback declines: UM_ENOMEM */
  cr_assert_eq(um_alloc(m, tiny, 512 * KiB, UM_DEVICE, 0, &b), UM_ENOMEM);
  cr_assert_null(b);
  s = stats(m, tiny);
  cr_assert_eq(s.oom_retries, 1);
  cr_assert_eq(the_oom_log.calls, 1);
  cr_assert_eq(s.active_buffers, 1);
  /* now the callback releases big: the retry trims it and succeeds */
  the_oom_log.to_release = big;
  b = alloc_on(m, 1, 512 * KiB, UM_DEVICE, 0);
  s = stats(m, tiny);
  cr_assert_eq(the_oom_log.calls, 2);
  cr_assert_eq(s.oom_retries, 3);
  cr_assert_eq(s.trims, 1);
  cr_assert_eq(s.bytes_trimmed, 768 * KiB);
  cr_assert_eq(s.bytes_reserved, 512 * KiB);
  cr_assert_eq(s.active_buffers, 1);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

Test(pressure, without_trim_on_pressure_the_cache_is_kept) {
  um_manager *m = make_tiny(0);
  um_device *tiny = um_device_get(m, 1);
  um_buffer *a = alloc_on(m, 1, 640 * KiB, UM_DEVICE, 0), *b = NULL;
  cr_assert_eq(um_release(a), UM_OK);
  cr_assert_eq(um_alloc(m, tiny, 512 * KiB, UM_DEVICE, 0, &b), UM_ENOMEM);
  um_stats s = stats(m, tiny);
  cr_assert_eq(s.oom_retries, 0);
  cr_assert_eq(s.bytes_pooled, 640 * KiB);
  cr_assert_eq(the_oom_log.calls, 1);
  cr_assert_eq(alloc_on(m, 1, 640 * KiB, UM_DEVICE, 0), a, "the cached block is still there");
  cr_assert_eq(um_release(a), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* ------------------------------------------------------------------------ */
/* The sole thread's release (tcache.h, "A release without a locked
 * instruction"): plain on the manager's first thread, until another thread
 * releases or touches one of its buffers, which waits for a release in
 * progress on the sole thread before it looks at the buffer. */

static int bias_of(um_manager *m) { return atomic_load(&m->bias); }

/* Skips where the process-wide barrier is refused (valgrind, some seccomp
 * profiles): managers are then never biased. */
static um_manager *make_biased(void) {
  um_manager *m = make(NULL);
  um_buffer *b = alloc(m, 1000); /* the first cache: this thread's */
  cr_assert_eq(um_release(b), UM_OK);
  if (bias_of(m) != UM__BIAS_SOLE) {
    cr_assert_eq(bias_of(m), UM__BIAS_SHARED);
    cr_assert_eq(um_manager_destroy(m), UM_OK);
    cr_skip_test("membarrier(PRIVATE_EXPEDITED) is refused here: managers are not biased to a thread");
  }
  return m;
}

typedef struct other_release {
  um_buffer *b;
  int status;
} other_release;

static void *release_elsewhere(void *arg) {
  other_release *r = arg;
  r->status = um_release(r->b);
  return NULL;
}

Test(sole, biased_to_its_first_thread_until_another_releases) {
  um_manager *m = make_biased();
  um_buffer *a = alloc(m, 1000), *b = alloc(m, 1000), *c = alloc(m, 3000);
  other_release r = {b, -1};
  cr_assert_eq(um_release(a), UM_OK);
  cr_assert_eq(um_release(a), UM_ESTATE, "a second release on the sole thread");
  cr_assert_eq(bias_of(m), UM__BIAS_SOLE);
  on_thread(release_elsewhere, &r);
  cr_assert_eq(r.status, UM_OK);
  cr_assert_eq(bias_of(m), UM__BIAS_SHARED);
  cr_assert_null(atomic_load(&m->sole_tc));
  cr_assert_eq(um_release(c), UM_OK);
  cr_assert_eq(um_release(c), UM_ESTATE);
  cr_assert_eq(um_release(b), UM_ESTATE);
  um_stats s = stats(m, NULL);
  cr_assert_eq(s.releases, 4);
  cr_assert_eq(s.active_buffers, 0);
  cr_assert_eq(s.bytes_in_use, 0);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* A release on another thread, and another thread's first operation on the
 * buffer, while the sole thread is inside its release of it, between its
 * load of the state (LIVE) and its store: the hook holds it there for
 * 50 ms once the other thread was let go. Without the revocation's wait
 * for the section, the other thread would find the buffer LIVE: its
 * release would succeed too, or its fill would run on a released block. */
typedef struct racer_in_section {
  um_buffer *b;
  bool fill; /* um_fill instead of um_release */
  gate g;
  int status;
} racer_in_section;

static racer_in_section *the_section_racer;

static void hold_the_section(um__test_point point, void *arg) {
  racer_in_section *r = the_section_racer;
  if (point != UM__TP_SOLE_RELEASE || r == NULL || arg != r->b)
    return;
  gate_set(&r->g, 1);
  sleep_ms(50);
}

static void *race_the_section(void *arg) {
  racer_in_section *r = arg;
  gate_wait(&r->g, 1);
  r->status = r->fill ? um_fill(r->b, 0, 0x5A, 64, NULL) : um_release(r->b);
  return NULL;
}

static void section_race(bool fill) {
  um_manager *m = make_biased();
  um_buffer *b = alloc(m, 1000);
  racer_in_section r = {.b = b, .fill = fill, .status = -1};
  pthread_t t;
  gate_init(&r.g);
  the_section_racer = &r;
  atomic_store(&um__test_hook, hold_the_section);
  cr_assert_eq(pthread_create(&t, NULL, race_the_section, &r), 0);
  cr_assert_eq(um_release(b), UM_OK, "the sole thread's release, first in");
  cr_assert_eq(pthread_join(t, NULL), 0);
  atomic_store(&um__test_hook, NULL);
  the_section_racer = NULL;
  cr_assert_eq(r.status, UM_ESTATE, "the other thread's %s answered %s", fill ? "fill" : "release",
               um_err_name(r.status));
  cr_assert_eq(bias_of(m), UM__BIAS_SHARED);
  um_stats s = stats(m, NULL);
  cr_assert_eq(s.releases, 2);
  cr_assert_eq(s.active_buffers, 0);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

Test(sole, a_release_racing_the_sole_threads_waits_for_its_section) { section_race(false); }

Test(sole, an_operation_racing_the_sole_threads_release_finds_it_released) { section_race(true); }

/* The sole thread, back from another manager's work (its last cache is the
 * other manager's), keeps its bias on both. */
Test(sole, kept_across_two_managers_on_one_thread) {
  um_manager *m1 = make_biased(), *m2 = make(NULL);
  um_buffer *a = alloc(m1, 1000), *b = alloc(m2, 1000);
  cr_assert_eq(bias_of(m2), UM__BIAS_SOLE);
  cr_assert_eq(um_release(a), UM_OK);
  cr_assert_eq(um_release(a), UM_ESTATE);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(bias_of(m1), UM__BIAS_SOLE);
  cr_assert_eq(bias_of(m2), UM__BIAS_SOLE);
  cr_assert_eq(alloc(m1, 1000), a, "the block came back through the sole thread's slot");
  cr_assert_eq(um_release(a), UM_OK);
  cr_assert_eq(um_manager_destroy(m1), UM_OK);
  cr_assert_eq(um_manager_destroy(m2), UM_OK);
}

/* The sole thread's exit ends the bias (its cache is freed, and memory
 * handed out later must not pass for it). */
typedef struct first_thread {
  um_manager *m;
  um_buffer *b;
} first_thread;

static void *allocate_first(void *arg) {
  first_thread *f = arg;
  f->b = alloc(f->m, 1000);
  return NULL;
}

Test(sole, ended_by_the_sole_threads_exit) {
  first_thread f = {make(NULL), NULL};
  on_thread(allocate_first, &f);
  cr_assert_eq(bias_of(f.m), UM__BIAS_SHARED);
  cr_assert_null(atomic_load(&f.m->sole_tc));
  cr_assert_eq(um_release(f.b), UM_OK);
  cr_assert_eq(um_release(f.b), UM_ESTATE);
  cr_assert_eq(um_manager_destroy(f.m), UM_OK);
}

/* The same race without a hook, many times: each round a fresh manager
 * biased to this thread, one buffer, and another thread releasing it as
 * this one does, within a few hundred nanoseconds of each other (the delay
 * moves from round to round). Exactly one release succeeds every time, it
 * is counted once, and the other thread's release revoked the bias. (The
 * sole thread's section lasts nanoseconds and the revocation's barrier
 * microseconds, so this rarely lands inside the section: the hooked tests
 * above hold it there; this one runs the paths at full speed.) */
typedef struct revocation_racer {
  um_buffer *_Atomic b;
  atomic_int round, done;
  int status;
} revocation_racer;

static void *race_revocations(void *arg) {
  revocation_racer *r = arg;
  for (int seen = 0;;) {
    int k;
    for (long spins = 0; (k = atomic_load(&r->round)) == seen; spins++)
      if (spins > 100000)
        sched_yield(); /* between rounds: the manager is being made */
    if (k < 0)
      return NULL;
    seen = k;
    r->status = um_release(atomic_load(&r->b));
    atomic_store(&r->done, k);
  }
}

Test(sole, racing_releases_at_the_revocation, .timeout = 120) {
  enum { ROUNDS = 400 };
  revocation_racer r = {.status = -1};
  pthread_t t;
  int both = 0, none = 0;
  um_manager *m = make_biased(); /* skips where managers are not biased */
  cr_assert_eq(um_manager_destroy(m), UM_OK);
  atomic_init(&r.round, 0);
  atomic_init(&r.done, 0);
  cr_assert_eq(pthread_create(&t, NULL, race_revocations, &r), 0);
  for (int k = 1; k <= ROUNDS; k++) {
    um_buffer *b;
    int mine;
    m = make(NULL);
    b = alloc(m, 1000);
    cr_assert_eq(bias_of(m), UM__BIAS_SOLE);
    atomic_store(&r.b, b);
    atomic_store(&r.round, k);
    for (volatile int spin = 0; spin < (k * 37) % 400; spin++)
      ;
    mine = um_release(b);
    while (atomic_load(&r.done) != k)
      sched_yield();
    both += mine == UM_OK && r.status == UM_OK;
    none += mine != UM_OK && r.status != UM_OK;
    cr_assert(mine == UM_OK || mine == UM_ESTATE, "round %d: %s", k, um_err_name(mine));
    cr_assert(r.status == UM_OK || r.status == UM_ESTATE, "round %d: %s", k, um_err_name(r.status));
    cr_assert_eq(stats(m, NULL).releases, 1, "round %d", k);
    cr_assert_eq(bias_of(m), UM__BIAS_SHARED);
    cr_assert_eq(um_manager_destroy(m), UM_OK);
  }
  atomic_store(&r.round, -1);
  cr_assert_eq(pthread_join(t, NULL), 0);
  cr_assert_eq(both, 0, "%d of %d rounds: both releases succeeded", both, ROUNDS);
  cr_assert_eq(none, 0, "%d of %d rounds: neither release succeeded", none, ROUNDS);
}
