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
 * 64 KiB granule (its class would be 1.25 MiB: a quarter more), and goes
 * back to its extent at release, merged, never into a bin or a thread
 * cache: the next one of another size fits where it was. */
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
  cr_assert_eq(s.bytes_segment_free, MiB + GRANULE, "a went back to its extent at once");
  cr_assert_eq(s.bytes_pooled, s.bytes_segment_free, "no bin holds it");
  c = alloc_on(m, 0, 512 * KiB + GRANULE, UM_HOST); /* small kind: a segment of its own */
  d = alloc_on(m, 0, MiB + 100, UM_HOST);
  cr_assert_eq(host(d), at, "the next large block takes a's place");
  /* d fills a's extent (1 MiB + 100 rounds up to 1 MiB + one granule);
   * c's class (640 KiB) fills the granules it touches. */
  cr_assert_eq(stats(m, 0).bytes_segment_free, 0);
  um_release(b);
  um_release(c);
  um_release(d);
  cr_assert_eq(um_pool_trim(m, 0), UM_OK);
  cr_assert_eq(stats(m, 0).bytes_reserved, 0);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* Growing past the pool's highest with much of it free gives free memory
 * back first, so that the peak stays near what the blocks need: 8 MiB
 * held, 4 MiB of it freed in two holes, then a 4 MiB block that fits in
 * neither commits 4 MiB and gives back the free memory down to a
 * sixteenth of what was held (512 KiB), largest extents first. */
Test(segments, growth_past_the_peak_gives_free_memory_back_first) {
  um_manager *m = make("cpu", 0);
  um_buffer *b[4], *big;
  um_stats s;
  for (int i = 0; i < 4; i++)
    b[i] = alloc_on(m, 0, 2 * MiB, UM_HOST);
  s = stats(m, 0);
  cr_assert_eq(s.bytes_reserved, 8 * MiB);
  um_release(b[0]);
  um_release(b[2]);
  s = stats(m, 0);
  cr_assert_eq(s.bytes_segment_free, 4 * MiB, "two 2 MiB holes, not adjacent");
  cr_assert_eq(s.free_extents, 3, "two holes and the rest of the address space");
  big = alloc_on(m, 0, 4 * MiB, UM_HOST);
  s = stats(m, 0);
  /* 3.5 MiB of the holes go back first: the peak is 8.5 MiB, not 12. */
  cr_assert_eq(s.bytes_reserved, 8 * MiB + 512 * KiB, "reserved %llu", (unsigned long long)s.bytes_reserved);
  cr_assert_eq(s.bytes_segment_free, 512 * KiB);
  cr_assert_eq(s.trims, 1, "one discard");
  cr_assert_eq(s.bytes_trimmed, 3 * MiB + 512 * KiB);
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

/* Plain segments (OpenCL DEVICE: 2 MiB for blocks up to 1 MiB) under a
 * device limit of one segment: four 512 KiB blocks fill it; with the first
 * and third released, 1 MiB is free in two extents of 512 KiB, and a 1 MiB
 * block fits in neither, nor in a new segment. */
Test(segments, out_of_memory_with_free_but_fragmented_extents) {
  um_manager *m = make("cpu,opencl", 2 * MiB);
  um_buffer *b[4], *big = NULL;
  um_stats s;
  int st;
  if (um_device_count(m) < 2) {
    um_manager_destroy(m);
    cr_skip_test("SKIP: no OpenCL device (POCL_DEVICES unset?)");
  }
  for (int i = 0; i < 4; i++)
    b[i] = alloc_on(m, 1, 512 * KiB, UM_DEVICE);
  s = stats(m, 1);
  cr_assert_eq(s.segments, 1);
  cr_assert_eq(s.bytes_reserved, 2 * MiB);
  cr_assert_eq(s.bytes_segment_free, 0);
  um_release(b[0]);
  um_release(b[2]);
  st = um_alloc(m, um_device_get(m, 1), 1 * MiB, UM_DEVICE, 0, &big);
  cr_assert_eq(st, UM_ENOMEM, "%s", um_err_name(st));
  cr_assert_not_null(strstr(um_last_error(), "the 1048576 free bytes of its 1 segments lie in 2 extents, the "
                                             "largest 524288 bytes"),
                     "%s", um_last_error());
  /* Out of memory explains itself: what was asked, what is held, what the
   * device has (the same for an unpooled request). */
  for (int k = 0; k < 2; k++) {
    if (k == 1)
      cr_assert_eq(um_alloc(m, um_device_get(m, 1), 1 * MiB, UM_DEVICE, UM_ALLOC_UNPOOLED, &big), UM_ENOMEM);
    cr_assert_not_null(strstr(um_last_error(), ". Asked: 1048576 bytes (UM_DEVICE) on device 1 ("), "%s",
                       um_last_error());
    cr_assert_not_null(strstr(um_last_error(), "). Held there: 1048576 bytes in use by 2 buffer(s), 2097152 "
                                               "reserved, 1048576 idle in the pool (2 free extent(s), the "
                                               "largest 524288 bytes); the device has 0 of 2097152 bytes free"),
                       "%s", um_last_error());
  }
  s = stats(m, 1);
  cr_assert_eq(s.bytes_reserved, 2 * MiB, "nothing new was taken");
  cr_assert_eq(s.bytes_segment_free, 1 * MiB);
  cr_assert_eq(s.free_extents, 2);
  cr_assert_eq(s.largest_free_extent, 512 * KiB);
  /* The neighbour goes: the hole is 1 MiB and the block fits. */
  um_release(b[1]);
  big = alloc_on(m, 1, 1 * MiB, UM_DEVICE);
  cr_assert_eq(stats(m, 1).bytes_reserved, 2 * MiB);
  um_release(big);
  um_release(b[3]);
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
