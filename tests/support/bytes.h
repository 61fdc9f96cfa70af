/* Byte helpers of the tests that move data through the public API: byte
 * patterns, comparisons that name the first differing byte, and buffers
 * allocated, read back and waited for with every failure reported, and an
 * on_oom callback that frees a victim. */
#ifndef UNIMEM_TEST_BYTES_H
#define UNIMEM_TEST_BYTES_H

#include "test_util.h"

static UT_UNUSED unsigned char ub_byte(size_t i, unsigned seed) {
  return (unsigned char)((i * 131u + (i >> 9) * 7u + seed * 29u + 1u) & 0xffu);
}

static UT_UNUSED void ub_pattern(void *p, size_t n, unsigned seed) {
  unsigned char *b = p;
  for (size_t i = 0; i < n; i++)
    b[i] = ub_byte(i, seed);
}

/* Index of the first byte where a and b differ, or n. */
static UT_UNUSED size_t ub_mismatch(const void *a, const void *b, size_t n) {
  const unsigned char *x = a, *y = b;
  if (memcmp(x, y, n) == 0)
    return n;
  for (size_t i = 0; i < n; i++)
    if (x[i] != y[i])
      return i;
  return n;
}

#define ub_assert_bytes(got, want, n, ...)                                     \
  do {                                                                         \
    size_t n_ = (n), at_ = ub_mismatch((got), (want), n_);                     \
    if (at_ != n_) {                                                           \
      cr_log_error("first difference at byte %zu of %zu: got 0x%02x, want 0x%02x", at_, n_, \
                   ((const unsigned char *)(got))[at_], ((const unsigned char *)(want))[at_]); \
      cr_assert_fail(__VA_ARGS__);                                             \
    }                                                                          \
  } while (0)

static UT_UNUSED void *ub_malloc(size_t n) {
  void *p = malloc(n ? n : 1);
  cr_assert_not_null(p);
  return p;
}

/* The whole buffer, read back with a blocking copy. */
static UT_UNUSED unsigned char *ub_read_all(um_buffer *b) {
  size_t n = um_buffer_size(b);
  unsigned char *p = ub_malloc(n);
  cr_assert_eq(um_copy_to_host(b, 0, p, n, NULL), UM_OK, "read back: %s", um_last_error());
  return p;
}

static UT_UNUSED um_buffer *ub_alloc(um_manager *m, um_device *d, size_t n, um_location loc) {
  um_buffer *b = NULL;
  cr_assert_eq(um_alloc(m, d, n, loc, 0, &b), UM_OK, "um_alloc(%zu, loc %d): %s", n, (int)loc,
               um_last_error());
  return b;
}

/* A buffer of n bytes at loc on d holding ub_pattern(seed), copied in. */
static UT_UNUSED um_buffer *ub_alloc_pattern(um_manager *m, um_device *d, size_t n, um_location loc, unsigned seed) {
  um_buffer *b = ub_alloc(m, d, n, loc);
  unsigned char *p = ub_malloc(n);
  ub_pattern(p, n, seed);
  cr_assert_eq(um_copy_from_host(b, 0, p, n, NULL), UM_OK, "%s", um_last_error());
  free(p);
  return b;
}

static UT_UNUSED void ub_wait(um_event *e, int want) {
  int st = um_event_wait(e);
  cr_assert_eq(st, want, "event: %s, expected %s (%s)", um_err_name(st), um_err_name(want), um_last_error());
  um_event_release(e);
}

/* An on_oom callback (um_options.on_oom): releases ub_oom_victim, when
 * there is one, and asks for one more try; ub_oom_calls counts the calls. */
static UT_UNUSED um_buffer *ub_oom_victim;
static UT_UNUSED int ub_oom_calls;

static UT_UNUSED int ub_release_oom_victim(void *ctx, um_device *d, size_t bytes) {
  (void)ctx;
  (void)d;
  (void)bytes;
  ub_oom_calls++;
  if (ub_oom_victim == NULL)
    return 0;
  cr_assert_eq(um_release(ub_oom_victim), UM_OK);
  ub_oom_victim = NULL;
  return 1;
}

#endif /* UNIMEM_TEST_BYTES_H */
