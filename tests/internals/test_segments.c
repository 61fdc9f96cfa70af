/* Segments (mem/segment.c): blocks of any class carved side by side from
 * one segment, large blocks from a segment of their own kind, idle blocks
 * back to their extents and merged so that a larger block fits where two
 * were, host memory committed per 64 KiB granule and given back by a trim,
 * a hit for every carve from a segment the pool held, out of memory with
 * free but fragmented extents (OpenCL, plain segments under a device
 * limit), and threads carving and releasing at once (run under TSan too);
 * blocks of more than 1 MiB carved at their size and merged back at
 * release; growth past the peak that gives free memory back first. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "test_util.h"

#define KiB ((size_t)1024)
#define MiB (1024 * KiB)
#define GRANULE (64 * KiB)

static um_manager *make(const char *backends, uint64_t limit) {
  um_options o;
  um_manager *m = NULL;
  ut_options_on(&o, backends);
  o.segments = 1;
  o.device_limit_bytes = limit;
  cr_assert_eq(um_manager_create(&o, &m), UM_OK, "%s", um_last_error());
  return m;
}

static um_buffer *alloc_on(um_manager *m, int dev, size_t n, um_location loc) {
  um_buffer *b = NULL;
  int st = um_alloc(m, um_device_get(m, dev), n, loc, 0, &b);
  cr_assert_eq(st, UM_OK, "alloc %zu: %s (%s)", n, um_err_name(st), um_last_error());
  return b;
}

static char *host(um_buffer *b) { return um_buffer_host_ptr(b); }

static um_stats stats(um_manager *m, int dev) {
  um_stats s;
  cr_assert_eq(um_stats_get(m, um_device_get(m, dev), &s), UM_OK);
  return s;
}

Test(segments, blocks_of_every_class_side_by_side) {
  um_manager *m = make("cpu", 0);
  um_buffer *a = alloc_on(m, 0, 1000, UM_HOST), *b = alloc_on(m, 0, 3000, UM_HOST);
  um_buffer *c = alloc_on(m, 0, 40, UM_HOST), *d = alloc_on(m, 0, 65536, UM_HOST);
  um_stats s = stats(m, 0);
  /* Classes 1024, 3072, 40 (64 with the alignment), 65536, in address order. */
  cr_assert_eq(host(b) - host(a), 1024);
  cr_assert_eq(host(c) - host(b), 3072);
  cr_assert_eq(host(d) - host(c), 64);
  cr_assert_eq(s.segments, 1);
  cr_assert_eq(s.device_allocs, 1, "one segment for four blocks");
  cr_assert_eq(s.pool_misses, 1);
  cr_assert_eq(s.pool_hits, 3, "carved from the segment the pool held: no device call");
  /* 1024 + 3072 + 64 + 65536 bytes touch two granules. */
  cr_assert_eq(s.bytes_reserved, 2 * GRANULE);
  cr_assert_eq(s.bytes_segment_free, 2 * GRANULE - (1024 + 3072 + 40 + 65536));
  cr_assert_eq(s.bytes_pooled, s.bytes_segment_free);
  cr_assert_eq(s.free_extents, 1, "the rest of the segment");
  um_release(a);
  um_release(b);
  um_release(c);
  um_release(d);
  cr_assert_eq(um_pool_trim(m, 0), UM_OK);
  s = stats(m, 0);
  cr_assert_eq(s.segments, 0, "wholly free: given back");
  cr_assert_eq(s.bytes_reserved, 0);
  cr_assert_eq(s.bytes_pooled, 0);
  cr_assert_eq(s.device_frees, 1);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

Test(segments, freed_neighbours_merge_for_a_larger_block) {
  um_manager *m = make("cpu", 0);
  um_buffer *a = alloc_on(m, 0, 64 * KiB, UM_HOST), *b = alloc_on(m, 0, 64 * KiB, UM_HOST);
  um_buffer *c = alloc_on(m, 0, 64 * KiB, UM_HOST), *d = alloc_on(m, 0, 64 * KiB, UM_HOST);
  char *pb = host(b);
  um_stats s;
  cr_assert_eq(pb - host(a), 64 * KiB);
  cr_assert_eq(host(d) - host(c), 64 * KiB);
  um_release(b);
  um_release(c);
  /* Back to their extents, merged with each other; the granules stay. */
  cr_assert_eq(um_pool_trim(m, UINT64_MAX - 1), UM_OK);
  s = stats(m, 0);
  cr_assert_eq(s.bytes_reserved, 4 * GRANULE);
  /* A 128 KiB block: best fit is the merged hole between a and d (the rest
   * of the segment is larger), and it needs no new memory. */
  b = alloc_on(m, 0, 128 * KiB, UM_HOST);
  cr_assert_eq(host(b), pb, "placed where the two freed blocks were");
  s = stats(m, 0);
  cr_assert_eq(s.bytes_reserved, 4 * GRANULE, "no new memory committed");
  cr_assert_eq(s.device_allocs, 1);
  /* A trim gives back the memory of the free extents, not that of blocks. */
  um_release(b);
  cr_assert_eq(um_pool_trim(m, 0), UM_OK);
  s = stats(m, 0);
  cr_assert_eq(s.bytes_reserved, 2 * GRANULE, "a's and d's granules");
  cr_assert_eq(s.segments, 1);
  um_release(a);
  um_release(d);
  cr_assert_eq(um_pool_trim(m, 0), UM_OK);
  cr_assert_eq(stats(m, 0).bytes_reserved, 0);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

Test(segments, large_blocks_have_segments_of_their_own) {
  um_manager *m = make("cpu", 0);
  um_buffer *small = alloc_on(m, 0, 4096, UM_HOST), *large = alloc_on(m, 0, 4 * MiB, UM_HOST);
  um_stats s = stats(m, 0);
  cr_assert_eq(s.segments, 2, "a small and a large segment");
  cr_assert_eq(s.bytes_reserved, GRANULE + 4 * MiB);
  cr_assert_eq(s.bytes_in_use, 4096 + 4 * MiB);
  memset(host(large), 7, 4 * MiB);
  memset(host(small), 9, 4096);
  cr_assert_eq(host(large)[4 * MiB - 1], 7);
  um_release(small);
  um_release(large);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* A block of more than 1 MiB is carved at its size rounded up to the
 * 64 KiB granule (its class would be 1.25 MiB: a quarter more); released,
 * it waits in this thread's slot of its class, where the next request of
 * the class that fits takes it (a hit), and from anywhere else it goes
 * back to its extent, merged, never into a bin. */
Test(segments, large_blocks_carved_at_their_size_and_merged_at_release) {
  um_manager *m = make("cpu", 0);
  um_buffer *a = alloc_on(m, 0, MiB + 1, UM_HOST), *b = alloc_on(m, 0, 3 * MiB + 5000, UM_HOST), *c, *d;
  char *at = host(a);
  um_stats s = stats(m, 0);
  cr_assert_eq(host(b) - host(a), (ptrdiff_t)(MiB + GRANULE), "a takes 1 MiB + one granule, not its class");
  cr_assert_eq(s.bytes_reserved, MiB + GRANULE + 3 * MiB + GRANULE);
  cr_assert_eq(s.bytes_segment_free, 0, "the blocks fill the granules they touch");
  cr_assert_eq(s.pool_misses, 1);
  cr_assert_eq(s.pool_hits, 1);
  um_release(a);
  s = stats(m, 0);
  cr_assert_eq(s.bytes_segment_free, 0, "a waits in this thread's slot");
  cr_assert_eq(s.bytes_pooled, MiB + GRANULE, "counted at its capacity, not its class's");
  c = alloc_on(m, 0, 512 * KiB + GRANULE, UM_HOST); /* small kind: a segment of its own */
  d = alloc_on(m, 0, MiB + 100, UM_HOST);
  cr_assert_eq(host(d), at, "the next block of the class that fits takes a from the slot");
  cr_assert_eq(stats(m, 0).pool_hits, 2, "b carved from a's segment, d from the slot");
  cr_assert_eq(stats(m, 0).pool_misses, 2, "the large segment, and c's small one");
  /* One of the class that does not fit (1.25 MiB > a's 1 MiB + 64 KiB):
   * the slot's block goes back to its extent first (and, the pool growing
   * past its peak with it free, its memory back to the system), and the
   * new block is carved elsewhere. */
  um_release(d);
  d = alloc_on(m, 0, MiB + 256 * KiB, UM_HOST);
  cr_assert_neq(host(d), at);
  s = stats(m, 0);
  cr_assert_eq(s.bytes_pooled, s.bytes_segment_free, "no slot holds a block");
  cr_assert_eq(s.pool_misses, 2, "still no device call");
  um_release(b);
  um_release(c);
  um_release(d);
  cr_assert_eq(um_pool_trim(m, 0), UM_OK);
  cr_assert_eq(stats(m, 0).bytes_reserved, 0);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* Growing past the pool's highest with much of it free gives free memory
 * back first, so that the peak stays near what the blocks need: four
 * blocks of B = 2 MiB - 64 KiB held (7936 KiB), two of them freed (holes
 * of B apart; a trim that keeps everything moves the one this thread's
 * slot holds to its extent), then a block of 2B that fits in neither
 * commits 2B and gives back the free memory down to a sixteenth of what was
 * held (496 KiB), largest extents first, in whole 64 KiB granules: one
 * hole (1984 KiB) and 24 granules of the other (1536 KiB), 448 KiB left. */
Test(segments, growth_past_the_peak_gives_free_memory_back_first) {
  const size_t B = 2 * MiB - GRANULE;
  um_manager *m = make("cpu", 0);
  um_buffer *b[4], *big;
  um_stats s;
  uint64_t trims;
  for (int i = 0; i < 4; i++)
    b[i] = alloc_on(m, 0, B, UM_HOST);
  s = stats(m, 0);
  cr_assert_eq(s.bytes_reserved, 4 * B);
  um_release(b[0]);
  um_release(b[2]);
  cr_assert_eq(um_pool_trim(m, UINT64_MAX), UM_OK);
  s = stats(m, 0);
  cr_assert_eq(s.bytes_segment_free, 2 * B, "two holes of B, not adjacent");
  cr_assert_eq(s.free_extents, 2, "two holes (the rest of the address space holds no memory)");
  trims = s.trims;
  big = alloc_on(m, 0, 2 * B, UM_HOST);
  s = stats(m, 0);
  /* 3520 KiB of the holes go back first: the peak is 8384 KiB, not 11904. */
  cr_assert_eq(s.bytes_reserved, 8384 * KiB, "reserved %llu", (unsigned long long)s.bytes_reserved);
  cr_assert_eq(s.bytes_segment_free, 448 * KiB);
  cr_assert_eq(s.trims, trims + 1, "one discard");
  um_release(big);
  um_release(b[1]);
  um_release(b[3]);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

Test(segments, off_gives_one_device_block_per_pooled_block) {
  um_options o;
  um_manager *m = NULL;
  um_buffer *a, *b;
  um_stats s;
  ut_options(&o);
  o.segments = 0;
  cr_assert_eq(um_manager_create(&o, &m), UM_OK);
  a = alloc_on(m, 0, 1000, UM_HOST);
  b = alloc_on(m, 0, 3000, UM_HOST);
  s = stats(m, 0);
  cr_assert_eq(s.segments, 0);
  cr_assert_eq(s.device_allocs, 2);
  cr_assert_eq(s.bytes_reserved, 1024 + 3072);
  um_release(a);
  um_release(b);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* Plain segments (OpenCL DEVICE) under a device limit of 2 MiB are a
 * sixteenth of it, 128 KiB: 64 blocks of 32 KiB fill 16 of them and the
 * limit; with every other block released, 1 MiB is free in 32 extents of
 * 32 KiB, and a 64 KiB block fits in none, nor in a new segment. */
#define FRAG_BLOCKS 64
Test(segments, out_of_memory_with_free_but_fragmented_extents) {
  um_manager *m = make("cpu,opencl", 2 * MiB);
  um_buffer *b[FRAG_BLOCKS], *big = NULL;
  um_stats s;
  int st;
  if (um_device_count(m) < 2) {
    um_manager_destroy(m);
    cr_skip_test("SKIP: no OpenCL device (POCL_DEVICES unset?)");
  }
  for (int i = 0; i < FRAG_BLOCKS; i++)
    b[i] = alloc_on(m, 1, 32 * KiB, UM_DEVICE);
  s = stats(m, 1);
  cr_assert_eq(s.segments, 16, "segments of 128 KiB under a 2 MiB limit");
  cr_assert_eq(s.bytes_reserved, 2 * MiB);
  cr_assert_eq(s.bytes_segment_free, 0);
  for (int i = 1; i < FRAG_BLOCKS; i += 2)
    um_release(b[i]);
  st = um_alloc(m, um_device_get(m, 1), 64 * KiB, UM_DEVICE, 0, &big);
  cr_assert_eq(st, UM_ENOMEM, "%s", um_err_name(st));
  cr_assert_not_null(strstr(um_last_error(), "the 1048576 free bytes of its 16 segments lie in 32 extents, the "
                                             "largest 32768 bytes"),
                     "%s", um_last_error());
  /* Out of memory explains itself: what was asked, what is held, what the
   * device has (the same for an unpooled request). */
  for (int k = 0; k < 2; k++) {
    if (k == 1)
      cr_assert_eq(um_alloc(m, um_device_get(m, 1), 64 * KiB, UM_DEVICE, UM_ALLOC_UNPOOLED, &big), UM_ENOMEM);
    cr_assert_not_null(strstr(um_last_error(), ". Asked: 65536 bytes (UM_DEVICE) on device 1 ("), "%s",
                       um_last_error());
    cr_assert_not_null(strstr(um_last_error(), "). Held there: 1048576 bytes in use by 32 buffer(s), 2097152 "
                                               "reserved, 1048576 idle in the pool (32 free extent(s), the "
                                               "largest 32768 bytes); the device has 0 of 2097152 bytes free"),
                       "%s", um_last_error());
  }
  s = stats(m, 1);
  cr_assert_eq(s.bytes_reserved, 2 * MiB, "nothing new was taken");
  cr_assert_eq(s.bytes_segment_free, 1 * MiB);
  cr_assert_eq(s.free_extents, 32);
  cr_assert_eq(s.largest_free_extent, 32 * KiB);
  /* A block between two holes goes: they merge into 96 KiB and the block
   * fits. */
  um_release(b[2]);
  big = alloc_on(m, 1, 64 * KiB, UM_DEVICE);
  cr_assert_eq(stats(m, 1).bytes_reserved, 2 * MiB);
  um_release(big);
  for (int i = 0; i < FRAG_BLOCKS; i += 2)
    if (i != 2)
      um_release(b[i]);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* The outside attack's findings (tests/outside/found_segments). */

static um_manager *make_opts(const char *backends, uint64_t limit, uint64_t max_pool, unsigned trim_ms) {
  um_options o;
  um_manager *m = NULL;
  ut_options_on(&o, backends);
  o.segments = 1;
  o.device_limit_bytes = limit;
  if (max_pool != 0)
    o.max_pool_bytes = max_pool;
  o.trim_interval_ms = trim_ms;
  cr_assert_eq(um_manager_create(&o, &m), UM_OK, "%s", um_last_error());
  return m;
}

/* max_pool_bytes bounds the idle memory of the bins and the segments
 * together: 40 blocks of 16 MiB released leave 64 MiB idle, exactly on the
 * host (free memory of the virtual segment given back past the cap), at
 * most that on OpenCL (whole segments); so do 2000 blocks of 200000 bytes
 * (the bins shrink for the segments' free bytes). */
static void pool_capped_on(int dev, um_location loc) {
  um_manager *m = make_opts("cpu,opencl", 0, 64 * MiB, 0);
  static um_buffer *b[2000];
  um_stats s;
  if (dev >= um_device_count(m)) {
    um_manager_destroy(m);
    cr_skip_test("SKIP: no OpenCL device (POCL_DEVICES unset?)");
  }
  for (int i = 0; i < 40; i++)
    b[i] = alloc_on(m, dev, 16 * MiB, loc);
  for (int i = 0; i < 40; i++)
    um_release(b[i]);
  s = stats(m, dev);
  if (dev == 0)
    cr_assert_eq(s.bytes_pooled, 64 * MiB, "pooled %llu", (unsigned long long)s.bytes_pooled);
  cr_assert_leq(s.bytes_pooled, 64 * MiB, "pooled %llu", (unsigned long long)s.bytes_pooled);
  cr_assert_eq(s.bytes_reserved, s.bytes_pooled, "nothing live: what is held is idle");
  for (int i = 0; i < 2000; i++)
    b[i] = alloc_on(m, dev, 200000, loc);
  for (int i = 0; i < 2000; i++)
    um_release(b[i]);
  s = stats(m, dev);
  cr_assert_leq(s.bytes_pooled, 64 * MiB, "pooled %llu", (unsigned long long)s.bytes_pooled);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

Test(segments, max_pool_bytes_bounds_segments_host) { pool_capped_on(0, UM_HOST); }
Test(segments, max_pool_bytes_bounds_segments_opencl) { pool_capped_on(1, UM_DEVICE); }

/* The trim timer gives back idle segment memory (it slept while the bins
 * were empty): 10 blocks of 16 MiB, or 50 of 100000 bytes, released, and
 * within a few intervals nothing is held. */
static void timer_trims_on(int dev, um_location loc, size_t bytes, int n) {
  um_manager *m = make_opts("cpu,opencl", 0, 0, 50);
  um_buffer *b[64];
  um_stats s;
  int waited = 0;
  if (dev >= um_device_count(m)) {
    um_manager_destroy(m);
    cr_skip_test("SKIP: no OpenCL device (POCL_DEVICES unset?)");
  }
  for (int i = 0; i < n; i++)
    b[i] = alloc_on(m, dev, bytes, loc);
  for (int i = 0; i < n; i++)
    um_release(b[i]);
  cr_assert_gt(stats(m, dev).bytes_reserved, 0);
  do { /* bounded: 20 s, for a loaded machine */
    struct timespec ts = {0, 20 * 1000 * 1000};
    nanosleep(&ts, NULL);
    s = stats(m, dev);
  } while (s.bytes_reserved != 0 && ++waited < 1000);
  cr_assert_eq(s.bytes_reserved, 0, "after %d ms: %llu bytes still held", waited * 20,
               (unsigned long long)s.bytes_reserved);
  cr_assert_gt(s.trims, 0);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

Test(segments, trim_timer_gives_back_segments_host) { timer_trims_on(0, UM_HOST, 16 * MiB, 10); }
Test(segments, trim_timer_gives_back_segments_opencl) { timer_trims_on(1, UM_DEVICE, 16 * MiB, 10); }
Test(segments, trim_timer_gives_back_small_blocks_opencl) { timer_trims_on(1, UM_DEVICE, 100000, 50); }

/* A virtual segment's address space is no free memory: free_extents and
 * largest_free_extent count only extents that hold some, as
 * bytes_segment_free does. */
Test(segments, free_extents_count_memory_not_address_space) {
  um_manager *m = make("cpu", 0);
  um_buffer *a = alloc_on(m, 0, 64 * KiB, UM_HOST), *b = alloc_on(m, 0, 4 * MiB - GRANULE, UM_HOST);
  um_stats s = stats(m, 0);
  cr_assert_eq(s.bytes_segment_free, 0);
  cr_assert_eq(s.free_extents, 0);
  cr_assert_eq(s.largest_free_extent, 0);
  um_release(b);
  cr_assert_eq(um_pool_trim(m, UINT64_MAX), UM_OK); /* from this thread's slot to its extent */
  s = stats(m, 0);
  cr_assert_eq(s.bytes_segment_free, 4 * MiB - GRANULE);
  cr_assert_eq(s.free_extents, 1);
  cr_assert_eq(s.largest_free_extent, 4 * MiB - GRANULE);
  um_release(a);
  cr_assert_eq(um_pool_trim(m, 0), UM_OK);
  s = stats(m, 0);
  cr_assert_eq(s.free_extents, 0);
  cr_assert_eq(s.largest_free_extent, 0);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* Under a device limit of 8 MiB a segment is 512 KiB: a live 100-byte
 * block keeps 512 KiB, and 7 MiB still fit (with 2 MiB segments they did
 * not, where segments off they did). */
Test(segments, small_block_keeps_little_of_a_small_device_limit) {
  um_manager *m = make("cpu,opencl", 8 * MiB);
  um_buffer *small, *big;
  if (um_device_count(m) < 2) {
    um_manager_destroy(m);
    cr_skip_test("SKIP: no OpenCL device (POCL_DEVICES unset?)");
  }
  small = alloc_on(m, 1, 100, UM_DEVICE);
  cr_assert_eq(stats(m, 1).bytes_reserved, 512 * KiB);
  big = alloc_on(m, 1, 7 * MiB, UM_DEVICE);
  um_release(big);
  um_release(small);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* Threads carving and releasing blocks of changing sizes from the same
 * pool: every block holds its own bytes until its release, and at the end
 * a trim leaves nothing. */
#define THREADS 3
#define ROUNDS 3000

typedef struct {
  um_manager *m;
  unsigned seed;
  int id, bad;
} worker_arg;

static void *worker(void *p) {
  worker_arg *w = p;
  um_buffer *held[8] = {0};
  size_t sizes[8] = {0};
  for (int r = 0; r < ROUNDS; r++) {
    int k = (int)(rand_r(&w->seed) % 8);
    if (held[k] != NULL) {
      const unsigned char *h = (const unsigned char *)host(held[k]);
      for (size_t i = 0; i < sizes[k]; i += 509)
        w->bad += h[i] != (unsigned char)(k * 31 + w->id);
      um_release(held[k]);
      held[k] = NULL;
    } else {
      size_t n = (size_t)1 << (rand_r(&w->seed) % 22);
      n += rand_r(&w->seed) % n;
      if (um_alloc(w->m, um_device_get(w->m, 0), n, UM_HOST, 0, &held[k]) != UM_OK) {
        w->bad++;
        continue;
      }
      sizes[k] = n;
      memset(host(held[k]), (unsigned char)(k * 31 + w->id), n);
    }
  }
  for (int k = 0; k < 8; k++)
    if (held[k] != NULL)
      um_release(held[k]);
  return NULL;
}

Test(segments, threads_carve_and_release_at_once) {
  um_manager *m = make("cpu", 0);
  pthread_t t[THREADS];
  worker_arg w[THREADS];
  um_stats s;
  for (int i = 0; i < THREADS; i++) {
    w[i] = (worker_arg){.m = m, .seed = 17u + (unsigned)i * 7919u, .id = i};
    cr_assert_eq(pthread_create(&t[i], NULL, worker, &w[i]), 0);
  }
  for (int i = 0; i < THREADS; i++) {
    pthread_join(t[i], NULL);
    cr_assert_eq(w[i].bad, 0, "thread %d saw %d wrong bytes or failures", i, w[i].bad);
  }
  s = stats(m, 0);
  cr_assert_eq(s.active_buffers, 0);
  cr_assert_geq(s.hit_rate, 0.9, "hit rate %.3f", s.hit_rate);
  cr_assert_eq(um_pool_trim(m, 0), UM_OK);
  s = stats(m, 0);
  cr_assert_eq(s.bytes_reserved, 0);
  cr_assert_eq(s.segments, 0);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}
