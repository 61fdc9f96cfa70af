/* The pool: size classes waste under 25%, a released block comes back to
 * the next fitting request, UNPOOLED and enable_pooling=0 bypass it, the
 * limits hold and evict oldest first, trims (explicit and on the timer)
 * free oldest first and are counted, and a reused block holds none of its
 * previous owner's data when asked (UM_ALLOC_ZERO, scrub). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "test_util.h"
#include "testing.h"
#include "testhook.h"

static um_manager *make(void (*tweak)(um_options *)) {
  um_options o;
  um_manager *m = NULL;
  ut_options(&o);
  if (tweak)
    tweak(&o);
  cr_assert_eq(um_manager_create(&o, &m), UM_OK, "%s", um_last_error());
  return m;
}

static um_buffer *alloc(um_manager *m, size_t n, um_location loc, unsigned flags) {
  um_buffer *b = NULL;
  int st = um_alloc(m, um_device_get(m, 0), n, loc, flags, &b);
  cr_assert_eq(st, UM_OK, "alloc %zu: %s (%s)", n, um_err_name(st), um_last_error());
  return b;
}

/* ------------------------------------------------------------------------ */
/* Size classes */

static void check_class(size_t n) {
  int cls = um__size_class_of(n);
  size_t cap = um__class_size(cls);
  cr_assert(cls >= 0 && cls < UM__CLASS_COUNT, "class of %zu is %d", n, cls);
  cr_assert_geq(cap, n, "class of %zu holds only %zu", n, cap);
  /* waste strictly below a quarter of the request */
  cr_assert_lt((cap - n) * 4, n, "%zu wastes %zu bytes", n, cap - n);
  if (cls > 0)
    cr_assert_lt(um__class_size(cls - 1), n, "%zu could use the smaller class %zu", n,
                 um__class_size(cls - 1));
}

Test(pool, class_waste_below_25_percent) {
  for (size_t n = 1; n <= 1000000; n++)
    check_class(n);
  /* around every power of two up to 2^62 */
  for (int k = 20; k <= 62; k++) {
    size_t p = (size_t)1 << k;
    check_class(p - 1);
    check_class(p);
    check_class(p + 1);
    check_class(p + p / 4);
    check_class(p + p / 4 + 1);
    check_class(p + p / 2 + 12345);
  }
  check_class((size_t)1e9);
  check_class((size_t)3e12 + 7);
}

Test(pool, classes_exact_then_four_per_doubling) {
  for (size_t n = 1; n <= 8; n++)
    cr_assert_eq(um__class_size(um__size_class_of(n)), n);
  cr_assert_eq(um__class_size(um__size_class_of(9)), 10);
  cr_assert_eq(um__class_size(um__size_class_of(11)), 12);
  cr_assert_eq(um__class_size(um__size_class_of(15)), 16);
  cr_assert_eq(um__class_size(um__size_class_of(17)), 20);
  cr_assert_eq(um__class_size(um__size_class_of(1 << 20)), 1 << 20);
  cr_assert_eq(um__class_size(um__size_class_of((1 << 20) + 1)), (1 << 20) + (1 << 18));
  /* every class a request can reach (um_alloc refuses more than 2^62) */
  for (int c = 1; c <= um__size_class_of((size_t)1 << 62); c++) {
    cr_assert_gt(um__class_size(c), um__class_size(c - 1), "classes grow");
    cr_assert_eq(um__size_class_of(um__class_size(c)), c, "a class size is its own class");
  }
}

/* The allocation reserves exactly the class size. */
Test(pool, reserved_is_class_size) {
  um_manager *m = make(NULL);
  const size_t sizes[] = {1, 9, 100, 1000, 4097, 100000, 1000001, 3u << 20};
  uint64_t total = 0;
  um_buffer *b[8];
  for (int i = 0; i < 8; i++) {
    b[i] = alloc(m, sizes[i], UM_HOST, 0);
    total += ut_class(sizes[i]);
    cr_assert_eq(ut_stats(m, NULL).bytes_reserved, total, "after %zu", sizes[i]);
  }
  for (int i = 0; i < 8; i++)
    cr_assert_eq(um_release(b[i]), UM_OK);
  cr_assert_eq(ut_stats(m, NULL).bytes_pooled, total);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* ------------------------------------------------------------------------ */
/* Reuse */

/* The seeds' ReturnToPool_BufferCanBeReused, per location, and for any
 * size of the same class. */
Test(pool, same_block_back) {
  um_manager *m = make(NULL);
  for (int loc = 0; loc < UM_LOCATION_COUNT; loc++) {
    um_buffer *a = alloc(m, 1000, (um_location)loc, 0), *b;
    void *p = um_buffer_host_ptr(a);
    um_stats s0 = ut_stats(m, NULL), s1;
    cr_assert_eq(um_release(a), UM_OK);
    b = alloc(m, 1000, (um_location)loc, 0);
    cr_assert_eq(b, a, "location %d: same handle", loc);
    cr_assert_eq(um_buffer_host_ptr(b), p, "location %d: same memory", loc);
    cr_assert_eq(um_buffer_size(b), 1000);
    cr_assert_eq(um_buffer_location(b), (um_location)loc);
    cr_assert_eq(um_release(b), UM_OK);
    b = alloc(m, 1010, (um_location)loc, 0); /* same class (1024) */
    cr_assert_eq(b, a);
    cr_assert_eq(um_buffer_size(b), 1010);
    s1 = ut_stats(m, NULL);
    cr_assert_eq(s1.pool_hits - s0.pool_hits, 2);
    cr_assert_eq(s1.device_allocs, s0.device_allocs);
    cr_assert_eq(um_release(b), UM_OK);
  }
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* Another class or another location is another pool. */
Test(pool, other_class_or_location_misses) {
  um_manager *m = make(NULL);
  um_buffer *a = alloc(m, 1000, UM_HOST, 0), *b;
  um_stats s;
  cr_assert_eq(um_release(a), UM_OK);
  b = alloc(m, 1025, UM_HOST, 0); /* class 1280 */
  cr_assert_neq(b, a);
  cr_assert_eq(um_release(b), UM_OK);
  b = alloc(m, 1000, UM_DEVICE, 0);
  cr_assert_neq(b, a);
  s = ut_stats(m, NULL);
  cr_assert_eq(s.pool_hits, 0);
  cr_assert_eq(s.pool_misses, 3);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

Test(pool, unpooled_never_pooled) {
  um_manager *m = make(NULL);
  um_buffer *a = alloc(m, 4096, UM_HOST, UM_ALLOC_UNPOOLED), *b;
  um_stats s;
  s = ut_stats(m, NULL);
  cr_assert_eq(s.bytes_reserved, 4096);
  cr_assert_eq(s.pool_hits + s.pool_misses, 0, "unpooled allocations are not pool lookups");
  cr_assert_eq(um_release(a), UM_OK);
  s = ut_stats(m, NULL);
  cr_assert_eq(s.bytes_pooled, 0);
  cr_assert_eq(s.bytes_reserved, 0);
  cr_assert_eq(s.device_frees, 1);
  /* a pooled request of the same size finds nothing */
  b = alloc(m, 4096, UM_HOST, 0);
  s = ut_stats(m, NULL);
  cr_assert_eq(s.pool_hits, 0);
  cr_assert_eq(s.pool_misses, 1);
  cr_assert_eq(um_release(b), UM_OK);
  /* and an unpooled request never takes a pooled block */
  a = alloc(m, 4096, UM_HOST, UM_ALLOC_UNPOOLED);
  s = ut_stats(m, NULL);
  cr_assert_eq(s.pool_hits, 0);
  cr_assert_eq(s.bytes_pooled, 4096);
  cr_assert_eq(s.device_allocs, 3);
  cr_assert_eq(um_release(a), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

static void no_pooling(um_options *o) { o->enable_pooling = 0; }

Test(pool, pooling_disabled) {
  um_manager *m = make(no_pooling);
  um_buffer *a;
  um_stats s;
  for (int i = 0; i < 10; i++) {
    a = alloc(m, 1000, (um_location)(i % UM_LOCATION_COUNT), 0);
    cr_assert_eq(ut_stats(m, NULL).bytes_reserved, 1000, "exact size, no class rounding");
    cr_assert_eq(um_release(a), UM_OK);
    s = ut_stats(m, NULL);
    cr_assert_eq(s.bytes_pooled, 0);
    cr_assert_eq(s.bytes_reserved, 0);
  }
  s = ut_stats(m, NULL);
  cr_assert_eq(s.pool_hits, 0);
  cr_assert_eq(s.pool_misses, 0);
  cr_assert_eq(s.device_allocs, 10);
  cr_assert_eq(s.device_frees, 10);
  cr_assert_eq(s.allocations, 10);
  cr_assert_eq(um_pool_trim(m, 0), UM_OK);
  cr_assert_eq(ut_stats(m, NULL).trims, 0);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* ------------------------------------------------------------------------ */
/* Limits */

static void per_class_2k(um_options *o) { o->max_pool_bytes_per_class = 2048; }

Test(pool, per_class_limit_evicts_oldest) {
  um_manager *m = make(per_class_2k);
  um_buffer *a = alloc(m, 1000, UM_HOST, 0), *b = alloc(m, 1000, UM_HOST, 0), *c = alloc(m, 1000, UM_HOST, 0);
  um_buffer *big, *x, *y, *z;
  um_stats s;
  cr_assert_eq(um_release(a), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(ut_stats(m, NULL).bytes_pooled, 2048);
  cr_assert_eq(um_release(c), UM_OK); /* the class is full: a (oldest) goes */
  s = ut_stats(m, NULL);
  cr_assert_eq(s.bytes_pooled, 2048);
  cr_assert_eq(s.device_frees, 1);
  cr_assert_eq(s.trims, 1);
  cr_assert_eq(s.bytes_trimmed, 1024);
  /* which blocks stayed: b and c come back (in either order), then the
   * pool is empty */
  x = alloc(m, 1000, UM_HOST, 0);
  y = alloc(m, 1000, UM_HOST, 0);
  s = ut_stats(m, NULL);
  cr_assert_eq(s.pool_hits, 2);
  cr_assert((x == b && y == c) || (x == c && y == b), "the survivors are b and c");
  z = alloc(m, 1000, UM_HOST, 0);
  cr_assert_eq(ut_stats(m, NULL).pool_misses, 4, "a's block was evicted");
  /* a block larger than the per-class limit is never kept */
  big = alloc(m, 4096, UM_HOST, 0);
  cr_assert_eq(um_release(big), UM_OK);
  s = ut_stats(m, NULL);
  cr_assert_eq(s.bytes_pooled, 0);
  cr_assert_eq(s.device_frees, 2);
  cr_assert_eq(um_release(x), UM_OK);
  cr_assert_eq(um_release(y), UM_OK);
  cr_assert_eq(um_release(z), UM_OK);
  cr_assert_leq(ut_stats(m, NULL).bytes_pooled, 2048);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

static void total_4k(um_options *o) { o->max_pool_bytes = 4096; }

Test(pool, total_limit_evicts_oldest) {
  um_manager *m = make(total_4k);
  /* classes 1024, 1280, 1536, 1792 */
  um_buffer *a = alloc(m, 1024, UM_HOST, 0), *b = alloc(m, 1280, UM_HOST, 0);
  um_buffer *c = alloc(m, 1536, UM_DEVICE, 0), *d = alloc(m, 1792, UM_HOST, 0);
  um_buffer *x;
  um_stats s;
  cr_assert_eq(um_release(a), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_release(c), UM_OK);
  cr_assert_eq(ut_stats(m, NULL).bytes_pooled, 1024 + 1280 + 1536);
  /* 3840 + 1792 > 4096: the oldest (a, then b) make room */
  cr_assert_eq(um_release(d), UM_OK);
  s = ut_stats(m, NULL);
  cr_assert_eq(s.bytes_pooled, 1536 + 1792);
  cr_assert_leq(s.bytes_pooled, 4096);
  cr_assert_eq(s.trims, 2);
  cr_assert_eq(s.bytes_trimmed, 1024 + 1280);
  cr_assert_eq(s.largest_pooled_block, 1792);
  /* c and d are still there, a and b not */
  x = alloc(m, 1536, UM_DEVICE, 0);
  cr_assert_eq(x, c);
  cr_assert_eq(um_release(x), UM_OK);
  x = alloc(m, 1792, UM_HOST, 0);
  cr_assert_eq(x, d);
  cr_assert_eq(um_release(x), UM_OK);
  s = ut_stats(m, NULL);
  cr_assert_eq(s.pool_hits, 2);
  x = alloc(m, 1024, UM_HOST, 0);
  cr_assert_eq(ut_stats(m, NULL).pool_misses, s.pool_misses + 1, "a's block was evicted");
  cr_assert_eq(um_release(x), UM_OK);
  x = alloc(m, 1280, UM_HOST, 0);
  cr_assert_eq(ut_stats(m, NULL).pool_misses, s.pool_misses + 2, "b's block was evicted");
  cr_assert_eq(um_release(x), UM_OK);
  cr_assert_leq(ut_stats(m, NULL).bytes_pooled, 4096);
  /* a block larger than the whole pool is never kept */
  x = alloc(m, 5000, UM_HOST, 0);
  s = ut_stats(m, NULL);
  cr_assert_eq(um_release(x), UM_OK);
  cr_assert_eq(ut_stats(m, NULL).device_frees, s.device_frees + 1);
  cr_assert_leq(ut_stats(m, NULL).bytes_pooled, 4096);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* Under churn of random sizes, the pool never holds more than its limit. */
static void total_64k(um_options *o) {
  o->max_pool_bytes = 64 * 1024;
  o->max_pool_bytes_per_class = 16 * 1024;
}

Test(pool, limits_hold_under_churn) {
  um_manager *m = make(total_64k);
  um_buffer *live[32] = {0};
  uint64_t rng = 77;
  for (int i = 0; i < 5000; i++) {
    int k = (int)(ut_rand(&rng) % 32);
    um_stats s;
    if (live[k] != NULL) {
      cr_assert_eq(um_release(live[k]), UM_OK);
      live[k] = NULL;
    } else {
      live[k] = alloc(m, ut_range(&rng, 1, 20000), (um_location)(ut_rand(&rng) % 2), 0);
    }
    s = ut_stats(m, NULL);
    cr_assert_leq(s.bytes_pooled, 64 * 1024, "step %d", i);
    cr_assert_leq(s.largest_pooled_block, 16 * 1024);
  }
  for (int k = 0; k < 32; k++)
    if (live[k] != NULL)
      cr_assert_eq(um_release(live[k]), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* ------------------------------------------------------------------------ */
/* Trims */

Test(pool, trim_oldest_first) {
  um_manager *m = make(NULL);
  um_buffer *a = alloc(m, 1024, UM_HOST, 0), *b = alloc(m, 2048, UM_PINNED, 0);
  um_buffer *c = alloc(m, 3072, UM_DEVICE, 0), *x;
  um_stats s;
  cr_assert_eq(um_release(a), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_release(c), UM_OK);
  cr_assert_eq(ut_stats(m, NULL).bytes_pooled, 6144);
  cr_assert_eq(um_pool_trim(m, 6144), UM_OK); /* nothing to do */
  cr_assert_eq(ut_stats(m, NULL).trims, 0);
  cr_assert_eq(um_pool_trim(m, 5200), UM_OK); /* a alone is enough */
  s = ut_stats(m, NULL);
  cr_assert_eq(s.trims, 1);
  cr_assert_eq(s.bytes_trimmed, 1024);
  cr_assert_eq(s.bytes_pooled, 5120);
  cr_assert_eq(s.device_frees, 1);
  x = alloc(m, 2048, UM_PINNED, 0);
  cr_assert_eq(x, b, "b survived the trim");
  cr_assert_eq(um_release(x), UM_OK); /* b is now the newest */
  cr_assert_eq(um_pool_trim(m, 2048), UM_OK); /* c (older than b now) goes */
  s = ut_stats(m, NULL);
  cr_assert_eq(s.trims, 2);
  cr_assert_eq(s.bytes_trimmed, 1024 + 3072);
  cr_assert_eq(s.bytes_pooled, 2048);
  x = alloc(m, 2048, UM_PINNED, 0);
  cr_assert_eq(x, b);
  cr_assert_eq(um_release(x), UM_OK);
  cr_assert_eq(um_pool_trim(m, 0), UM_OK);
  s = ut_stats(m, NULL);
  cr_assert_eq(s.trims, 3);
  cr_assert_eq(s.bytes_trimmed, 6144);
  cr_assert_eq(s.bytes_pooled, 0);
  cr_assert_eq(s.bytes_reserved, 0);
  cr_assert_eq(s.device_frees, s.device_allocs);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

static void timer_50ms(um_options *o) { o->trim_interval_ms = 50; }

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

Test(pool, trim_timer) {
  um_manager *m = make(timer_50ms);
  um_buffer *a = alloc(m, 100000, UM_HOST, 0);
  um_stats s;
  cr_assert_eq(um_release(a), UM_OK);
  /* idle for 50 ms, noticed within a timer period or two; 2 s is the
   * generous bound */
  for (int waited = 0; waited < 2000; waited += 10) {
    s = ut_stats(m, NULL);
    if (s.trims == 1)
      break;
    sleep_ms(10);
  }
  s = ut_stats(m, NULL);
  cr_assert_eq(s.trims, 1, "the timer did not trim an idle block within 2 s");
  cr_assert_eq(s.bytes_trimmed, ut_class(100000));
  cr_assert_eq(s.bytes_pooled, 0);
  cr_assert_eq(s.bytes_reserved, 0);
  /* the timer goes on working after the pool was empty */
  a = alloc(m, 100000, UM_HOST, 0);
  cr_assert_eq(um_release(a), UM_OK);
  for (int waited = 0; waited < 2000 && ut_stats(m, NULL).trims < 2; waited += 10)
    sleep_ms(10);
  cr_assert_eq(ut_stats(m, NULL).trims, 2);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* A trim's counts move after its block is freed: a thread that sees trims
 * move finds the block's bytes gone from bytes_reserved and counted in
 * bytes_trimmed. The test point holds the trimming thread inside the
 * backend's free for 100 ms while this one watches the counts (CI once
 * caught trim_timer's reading in that window, when trims was counted
 * first). */
static void hold_block_free(um__test_point point, void *arg) {
  (void)arg;
  if (point == UM__TP_BLOCK_FREE)
    sleep_ms(100);
}

static int trim_status = -1;

static void *trim_all(void *arg) {
  trim_status = um_pool_trim(arg, 0); /* checked by the test's thread */
  return NULL;
}

Test(pool, trim_counts_follow_the_free) {
  um_manager *m = make(NULL);
  um_buffer *a = alloc(m, 100000, UM_HOST, 0);
  uint64_t reserved0;
  pthread_t t;
  um_stats s;
  cr_assert_eq(um_release(a), UM_OK);
  s = ut_stats(m, NULL);
  reserved0 = s.bytes_reserved;
  cr_assert_eq(reserved0, ut_class(100000));
  atomic_store(&um__test_hook, hold_block_free);
  cr_assert_eq(pthread_create(&t, NULL, trim_all, m), 0);
  for (int waited = 0; waited < 2000; waited += 1) {
    s = ut_stats(m, NULL);
    if (s.trims == 1)
      break;
    cr_assert_eq(s.bytes_reserved, reserved0, "bytes left bytes_reserved before the block was freed");
    sleep_ms(1);
  }
  /* Read at once, while the trimming thread may still be in the free. */
  cr_assert_eq(s.trims, 1, "no trim within 2 s");
  cr_assert_eq(s.bytes_reserved, 0, "a trim counted with its block's bytes still reserved");
  cr_assert_eq(s.bytes_trimmed, ut_class(100000));
  pthread_join(t, NULL);
  atomic_store(&um__test_hook, NULL);
  cr_assert_eq(trim_status, UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* ------------------------------------------------------------------------ */
/* A reused block and the previous owner's data */

Test(pool, reuse_keeps_data_without_zero) {
  um_manager *m = make(NULL);
  um_buffer *a = alloc(m, 4000, UM_HOST, 0), *b;
  cr_assert_eq(um_fill(a, 0, 0xff, 4000, NULL), UM_OK);
  cr_assert_eq(um_release(a), UM_OK);
  b = alloc(m, 4000, UM_HOST, 0);
  cr_assert_eq(b, a);
  /* no scrub, no UM_ALLOC_ZERO: the block is handed over as it is */
  cr_assert(ut_all_bytes(um_buffer_host_ptr(b), 4000, 0xff));
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

Test(pool, alloc_zero_on_reused_block) {
  um_manager *m = make(NULL);
  for (int loc = 0; loc < UM_LOCATION_COUNT; loc++) {
    um_buffer *a = alloc(m, 5000, (um_location)loc, 0), *b;
    unsigned char back[5000];
    cr_assert_eq(um_fill(a, 0, 0xff, 5000, NULL), UM_OK);
    cr_assert_eq(um_release(a), UM_OK);
    b = alloc(m, 4500, (um_location)loc, UM_ALLOC_ZERO); /* same class, 5120 */
    cr_assert_eq(b, a);
    cr_assert_eq(um_copy_to_host(b, 0, back, 4500, NULL), UM_OK);
    cr_assert(ut_all_bytes(back, 4500, 0), "location %d: reused block not zeroed", loc);
    cr_assert_eq(um_release(b), UM_OK);
  }
  cr_assert_eq(ut_stats(m, NULL).pool_hits, UM_LOCATION_COUNT);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* The same on a device with no host view: the zeroing runs on the device. */
Test(pool, alloc_zero_on_reused_discrete_block) {
  um_manager *m = ut_manager_disc();
  um_device *disc = um_device_get(m, 1);
  um_buffer *a, *b;
  unsigned char back[3000];
  cr_assert_eq(um_alloc(m, disc, 3000, UM_DEVICE, 0, &a), UM_OK);
  cr_assert_eq(um_fill(a, 0, 0xee, 3000, NULL), UM_OK);
  cr_assert_eq(um_release(a), UM_OK);
  cr_assert_eq(um_alloc(m, disc, 3000, UM_DEVICE, UM_ALLOC_ZERO, &b), UM_OK);
  cr_assert_eq(b, a);
  cr_assert_eq(um_copy_to_host(b, 0, back, 3000, NULL), UM_OK);
  cr_assert(ut_all_bytes(back, 3000, 0));
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

static void scrub_on(um_options *o) { o->scrub = 1; }

Test(pool, scrub_zeroes_reused_blocks) {
  um_manager *m = make(scrub_on);
  for (int i = 0; i < 3; i++) {
    um_buffer *a = alloc(m, 7000, UM_DEVICE, 0);
    cr_assert(ut_all_bytes(um_buffer_host_ptr(a), 7000, 0), "round %d: block not scrubbed", i);
    cr_assert_eq(um_fill(a, 0, 0x5a, 7000, NULL), UM_OK);
    cr_assert_eq(um_release(a), UM_OK);
  }
  cr_assert_eq(ut_stats(m, NULL).pool_hits, 2);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}
