/* Round trips through every device of the profile (profile.h) and every
 * location it offers (DEVICE, PINNED, UNIFIED): sizes across the size
 * classes, sizes just above class boundaries, odd offsets and lengths,
 * blocking and asynchronous, with every byte checked, including the bytes
 * around the written range. */
#include "bytes.h"
#include "profile.h"

#define MAX_SIZES 96

/* Sizes sampled across the classes: every exact class up to 9 bytes, then
 * for each power of two from 16 B to 8 MiB the sizes just above the power
 * and just above the first quarter step (both class boundaries), plus
 * 16 MiB and a few odd ones in between. */
static int sample_sizes(size_t *out) {
  int n = 0;
  for (size_t s = 1; s <= 9; s++)
    out[n++] = s;
  for (int p = 4; p <= 23; p++) {
    size_t pow = (size_t)1 << p;
    out[n++] = pow + 1;
    out[n++] = pow + pow / 4 + 1;
    if (p % 5 == 0)
      out[n++] = pow + 3 * (pow / 4) - 3; /* inside the last quarter class */
  }
  out[n++] = 16u << 20;
  out[n++] = (16u << 20) - 3;
  cr_assert_leq(n, MAX_SIZES);
  return n;
}

/* The size class boundaries really are where the sizes above say. */
Test(roundtrip, sizes_straddle_class_boundaries) {
  size_t sizes[MAX_SIZES];
  int n = sample_sizes(sizes);
  for (int i = 0; i < n; i++) {
    size_t s = sizes[i];
    if (s > 9 && ((s - 1) & (s - 2)) == 0) { /* 2^p + 1 */
      cr_assert_eq(ut_class(s - 1), s - 1, "%zu ends a class", s - 1);
      cr_assert_gt(ut_class(s), s - 1, "%zu starts a class", s);
    }
  }
}

/* Source bytes for every size, made once per process: a pattern buffer
 * twice the largest size, whose slices at different offsets are different
 * byte sequences; and a buffer of 0xEE, what untouched bytes must still
 * read. (Making them once keeps the sanitizer builds fast: their
 * instrumented byte loops are slow, their memcpy and memcmp are not.) */
#define MAX_BYTES (16u << 20)
static unsigned char *pattern_bytes, *ee_bytes;

static const unsigned char *pattern_at(unsigned seed) {
  if (pattern_bytes == NULL) {
    pattern_bytes = ub_malloc(2 * (size_t)MAX_BYTES);
    ub_pattern(pattern_bytes, 2 * (size_t)MAX_BYTES, 1);
    ee_bytes = ub_malloc(MAX_BYTES);
    memset(ee_bytes, 0xEE, MAX_BYTES);
  }
  return pattern_bytes + (seed * 977u) % MAX_BYTES;
}

/* Write the whole buffer, then an odd range, and read back both ways. */
static void roundtrip_one(um_manager *m, um_device *d, um_location loc, size_t n, int async) {
  um_buffer *b = ub_alloc(m, d, n, loc);
  unsigned char *back = ub_malloc(n), *want = ub_malloc(n);
  um_event *e1 = NULL, *e2 = NULL;
  um_event **p1 = async ? &e1 : NULL, **p2 = async ? &e2 : NULL;
  unsigned seed = (unsigned)(n * 7 + (size_t)loc);
  const unsigned char *src = pattern_at(seed);

  cr_assert_leq(n, MAX_BYTES);
  cr_assert_eq(um_buffer_size(b), n);
  cr_assert_eq(um_buffer_location(b), loc);
  if (loc == UM_DEVICE && strncmp(ut_profile(), "pocl", 4) == 0)
    cr_assert_null(um_buffer_host_ptr(b), "an OpenCL DEVICE buffer has no host view");
  else if (loc != UM_DEVICE)
    cr_assert_not_null(um_buffer_host_ptr(b), "PINNED and UNIFIED buffers have a host view");

  /* whole buffer */
  memset(back, 0xEE, n);
  cr_assert_eq(um_copy_from_host(b, 0, src, n, p1), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_copy_to_host(b, 0, back, n, p2), UM_OK, "%s", um_last_error());
  if (async) {
    ub_wait(e1, UM_OK);
    ub_wait(e2, UM_OK);
  }
  ub_assert_bytes(back, src, n, "whole buffer, %zu bytes, location %d, %s", n, (int)loc,
                  async ? "async" : "blocking");
  if (loc != UM_DEVICE)
    ub_assert_bytes(um_buffer_host_ptr(b), src, n, "host view, %zu bytes", n);

  /* an odd range: [off, off + len) written with new bytes, then read back
   * from another odd offset; everything else keeps the first bytes */
  if (n >= 3) {
    size_t off = (n / 3) | 1, len = n - off - 1, roff = off + len / 2;
    const unsigned char *part = pattern_at(seed + 1);
    memcpy(want, src, n);
    memcpy(want + off, part, len);
    cr_assert_eq(um_copy_from_host(b, off, part, len, p1), UM_OK, "%s", um_last_error());
    memset(back, 0xEE, n);
    cr_assert_eq(um_copy_to_host(b, roff, back + roff, n - roff, p2), UM_OK, "%s", um_last_error());
    if (async) {
      ub_wait(e1, UM_OK);
      ub_wait(e2, UM_OK);
    }
    ub_assert_bytes(back + roff, want + roff, n - roff, "odd range read at %zu of %zu", roff, n);
    ub_assert_bytes(back, ee_bytes, roff, "the read wrote outside its range");
    free(back);
    back = ub_read_all(b);
    ub_assert_bytes(back, want, n, "after an odd write at %zu+%zu of %zu, location %d", off, len, n,
                    (int)loc);
  }
  cr_assert_eq(um_release(b), UM_OK);
  free(back);
  free(want);
}

static void roundtrip_location(um_location loc, int async) {
  ut_env e = ut_profile_open(NULL);
  size_t sizes[MAX_SIZES];
  int n = sample_sizes(sizes), tested = 0;
  for (int di = 0; di < e.ndev; di++) {
    um_device_info info;
    cr_assert_eq(um_device_info_get(e.dev_of[di], &info), UM_OK);
    if (!(info.locations & (1u << loc))) {
      fprintf(stderr, "device %d (%s) offers no location %d\n", info.index, info.name, (int)loc);
      continue;
    }
    for (int i = 0; i < n; i++)
      roundtrip_one(e.m, e.dev_of[di], loc, sizes[i], async);
    tested++;
  }
  ut_profile_close(&e);
  if (tested == 0)
    cr_skip_test("SKIPPED: no %s device here offers location %d", ut_profile(), (int)loc);
}

Test(roundtrip, device_blocking) { roundtrip_location(UM_DEVICE, 0); }
Test(roundtrip, device_async) { roundtrip_location(UM_DEVICE, 1); }
Test(roundtrip, pinned_blocking) { roundtrip_location(UM_PINNED, 0); }
Test(roundtrip, pinned_async) { roundtrip_location(UM_PINNED, 1); }
Test(roundtrip, unified_blocking) { roundtrip_location(UM_UNIFIED, 0); }
Test(roundtrip, unified_async) { roundtrip_location(UM_UNIFIED, 1); }

/* Blocks handed back by the pool keep working: the same sizes again, after
 * release, come from the pool (hits) and round-trip as well. */
Test(roundtrip, pooled_blocks_round_trip_again) {
  ut_env e = ut_profile_open(NULL);
  static const size_t sizes[] = {1, 4097, 65537, (1u << 20) + 1};
  um_stats before, after;
  for (int pass = 0; pass < 2; pass++) {
    before = ut_stats(e.m, e.dev);
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
      roundtrip_one(e.m, e.dev, UM_DEVICE, sizes[i], pass);
    after = ut_stats(e.m, e.dev);
    if (pass == 1)
      cr_assert_eq(after.pool_hits - before.pool_hits, sizeof(sizes) / sizeof(sizes[0]),
                   "the second pass reuses every block");
  }
  ut_profile_close(&e);
}

/* Copies between the locations of one device: DEVICE <-> PINNED <->
 * UNIFIED, at odd offsets. */
Test(roundtrip, between_locations_of_one_device) {
  ut_env e = ut_profile_open(NULL);
  const size_t n = 300007;
  um_location locs[3];
  int nloc = 0;
  um_device_info info;
  cr_assert_eq(um_device_info_get(e.dev, &info), UM_OK);
  for (int l = UM_DEVICE; l <= UM_UNIFIED; l++)
    if (info.locations & (1u << l))
      locs[nloc++] = (um_location)l;
  for (int a = 0; a < nloc; a++) {
    for (int b = 0; b < nloc; b++) {
      um_buffer *x = ub_alloc(e.m, e.dev, n, locs[a]), *y = ub_alloc(e.m, e.dev, n, locs[b]);
      unsigned char *src = ub_malloc(n), *back;
      ub_pattern(src, n, (unsigned)(a * 3 + b));
      cr_assert_eq(um_copy_from_host(x, 0, src, n, NULL), UM_OK);
      cr_assert_eq(um_fill(y, 0, 0x5A, n, NULL), UM_OK);
      cr_assert_eq(um_copy(y, 3, x, 5, n - 8, NULL), UM_OK, "%d -> %d: %s", (int)locs[a], (int)locs[b],
                   um_last_error());
      back = ub_read_all(y);
      for (size_t i = 0; i < 3; i++)
        cr_assert_eq(back[i], 0x5A);
      ub_assert_bytes(back + 3, src + 5, n - 8, "location %d -> %d", (int)locs[a], (int)locs[b]);
      for (size_t i = n - 5; i < n; i++)
        cr_assert_eq(back[i], 0x5A);
      cr_assert_eq(um_release(x), UM_OK);
      cr_assert_eq(um_release(y), UM_OK);
      free(src);
      free(back);
    }
  }
  ut_profile_close(&e);
}
