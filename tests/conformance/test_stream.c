/* um_stream on every profile's device (profile.h): every byte reaches the
 * device once and in order, in chunks that need not divide the length; the
 * next chunk's copy overlaps the user's function; progress; stopping; bad
 * input; a mapped file; and, where device_limit_bytes caps the device
 * (OpenCL, CUDA), a device whose memory is smaller than the source. On the
 * cpu profile alone: the discrete test device (no host view). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "profile.h"

#define KiB ((size_t)1024)
#define MiB (1024 * KiB)

static unsigned char pattern_at(size_t pos) { return (unsigned char)((pos * 2654435761u) >> 13); }

static void fill_pattern(unsigned char *p, size_t n) {
  for (size_t i = 0; i < n; i++)
    p[i] = pattern_at(i);
}

/* The profile's manager, its device capped at device_limit bytes (0: no
 * cap). With a cap, a device it does not cap (the cpu's, the fault
 * backend's) skips the test, saying so. */
static ut_env open_limited(uint64_t device_limit) {
  um_options o;
  ut_env e;
  ut_profile_options(&o);
  o.device_limit_bytes = device_limit;
  e = ut_profile_open(&o);
  if (device_limit != 0)
    ut_profile_need_cap(&e, device_limit);
  return e;
}

/* What the chunk function saw. */
typedef struct seen {
  um_manager *m;
  unsigned char *out;      /* the bytes fetched back from each chunk */
  size_t base;             /* offset of the stream in the source */
  size_t length, chunk;    /* the stream's length and chunk size */
  size_t next;             /* offset the next call must have */
  int calls;
  um_buffer *bufs[2];      /* the two chunk buffers, in order of first use */
  int stop_at;             /* call index that returns stop_status (-1: none) */
  int stop_status;
  int check_overlap;       /* wait in fn(k) for the copy of chunk k+1 */
  uint64_t moved_before;   /* bytes copied into chunks before the stream */
  int scribble;            /* fn overwrites the chunk asynchronously */
  int progress_calls;
  uint64_t last_done, last_total;
  int progress_bad;
} seen;

static uint64_t bytes_into_chunks(um_manager *mm) {
  um_stats s;
  cr_assert_eq(um_stats_get(mm, NULL, &s), UM_OK);
  return s.bytes_h2d + s.bytes_d2d + s.bytes_peer;
}

static int on_chunk(void *user, um_buffer *chunk, size_t offset, size_t bytes) {
  seen *s = user;
  size_t pos = offset - s->base;
  size_t expect = s->length - pos < s->chunk ? s->length - pos : s->chunk;
  int call = s->calls++;
  cr_assert_eq(offset, s->next, "chunk %d at offset %zu, expected %zu", call, offset, s->next);
  cr_assert_eq(bytes, expect, "chunk %d of %zu bytes, expected %zu", call, bytes, expect);
  cr_assert_geq(um_buffer_size(chunk), bytes);
  cr_assert_eq(um_buffer_location(chunk), UM_DEVICE);
  if (call < 2)
    s->bufs[call] = chunk;
  else
    cr_assert_eq(chunk, s->bufs[call & 1], "chunk %d is not in buffer %d", call, call & 1);
  if (call == 1)
    cr_assert_neq(s->bufs[0], s->bufs[1]);
  s->next = offset + bytes;

  if (s->check_overlap && pos + bytes < s->length) {
    /* The copy of the next chunk was issued before this call: it completes
     * while we wait here. Were it issued after fn returns, this would never
     * end; 30 s is a hang guard, not a timing assertion. */
    size_t next_n = s->length - (pos + bytes) < s->chunk ? s->length - (pos + bytes) : s->chunk;
    uint64_t want = s->moved_before + pos + bytes + next_n;
    struct timespec ts = {0, 1000000};
    int waited = 0;
    while (bytes_into_chunks(s->m) < want && waited < 30000) {
      nanosleep(&ts, NULL);
      waited++;
    }
    cr_assert_geq(bytes_into_chunks(s->m), want, "the copy of chunk %d did not run during fn(%d)",
                  call + 1, call);
  }

  cr_assert_eq(um_copy_to_host(chunk, 0, s->out + pos, bytes, NULL), UM_OK);
  if (s->scribble) {
    /* Asynchronous, not waited for: the next copy into this buffer must be
     * ordered after it. */
    um_event *e = NULL;
    cr_assert_eq(um_fill(chunk, 0, 0xEE, um_buffer_size(chunk), &e), UM_OK);
    um_event_release(e);
  }
  if (call == s->stop_at)
    return s->stop_status;
  return 0;
}

static void on_progress(void *user, uint64_t done, uint64_t total) {
  seen *s = user;
  if (done <= s->last_done || done > total || (s->progress_calls > 0 && total != s->last_total))
    s->progress_bad++;
  s->last_done = done;
  s->last_total = total;
  s->progress_calls++;
}

static void seen_init(seen *s, um_manager *mm, size_t base, size_t length, size_t chunk) {
  memset(s, 0, sizeof(*s));
  s->m = mm;
  s->out = malloc(length);
  cr_assert_not_null(s->out);
  memset(s->out, 0xCD, length);
  s->base = base;
  s->length = length;
  s->chunk = chunk;
  s->next = base;
  s->stop_at = -1;
}

static size_t chunks_of(size_t length, size_t chunk) { return length / chunk + (length % chunk != 0); }

/* Stream [base, base + length) of a pattern source and check everything. */
static void stream_and_check(um_manager *mm, um_device *dev, um_buffer *src, const unsigned char *ref,
                             size_t base, size_t length, size_t chunk, int overlap, int scribble) {
  seen s;
  um_stats before, after;
  size_t n = chunks_of(length, chunk < length ? chunk : length);
  seen_init(&s, mm, base, length, chunk < length ? chunk : length);
  s.check_overlap = overlap;
  s.scribble = scribble;
  s.moved_before = bytes_into_chunks(mm);
  cr_assert_eq(um_stats_get(mm, dev, &before), UM_OK);
  cr_assert_eq(um_stream(src, base, length, dev, chunk, on_chunk, on_progress, &s), UM_OK,
               "um_stream: %s", um_last_error());
  cr_assert_eq((size_t)s.calls, n);
  cr_assert_eq(s.next, base + length);
  cr_assert_eq(memcmp(s.out, ref + base, length), 0, "bytes differ");
  cr_assert_eq((size_t)s.progress_calls, n);
  cr_assert_eq(s.progress_bad, 0, "progress went backwards or past the total");
  cr_assert_eq(s.last_done, (uint64_t)length);
  cr_assert_eq(s.last_total, (uint64_t)length);
  /* The chunk buffers went back. */
  cr_assert_eq(um_stats_get(mm, dev, &after), UM_OK);
  cr_assert_eq(after.active_buffers, before.active_buffers);
  cr_assert_eq(after.bytes_in_use, before.bytes_in_use);
  free(s.out);
}

/* ------------------------------------------------------------------------ */
/* The profile's device */

Test(stream, every_byte_in_order_with_a_chunk_that_does_not_divide) {
  ut_env e = open_limited(0);
  um_manager *mm = e.m;
  um_device *dev = e.dev;
  const size_t n = 10 * MiB + 12345, chunk = 1 * MiB + 777;
  unsigned char *ref = malloc(n);
  um_buffer *src = NULL;
  cr_assert_neq(n % chunk, 0);
  fill_pattern(ref, n);
  cr_assert_eq(um_wrap_host(mm, ref, n, UM_WRAP_READONLY, &src), UM_OK);
  stream_and_check(mm, dev, src, ref, 0, n, chunk, 0, 0);
  /* an inner range, odd sizes */
  stream_and_check(mm, dev, src, ref, 4097, n - 9000, 333333, 0, 0);
  /* chunks smaller than the engine's inline threshold and larger */
  stream_and_check(mm, dev, src, ref, 1, 100000, 4099, 0, 0);
  cr_assert_eq(um_release(src), UM_OK);
  ut_profile_close(&e);
  free(ref);
}

Test(stream, next_copy_overlaps_the_chunk_function) {
  ut_env e = open_limited(0);
  um_manager *mm = e.m;
  const size_t n = 6 * MiB + 5, chunk = 1 * MiB + 3; /* > the inline threshold: a worker copies */
  unsigned char *ref = malloc(n);
  um_buffer *src = NULL;
  fill_pattern(ref, n);
  cr_assert_eq(um_alloc(mm, um_device_get(mm, 0), n, UM_HOST, 0, &src), UM_OK);
  cr_assert_eq(um_copy_from_host(src, 0, ref, n, NULL), UM_OK);
  stream_and_check(mm, e.dev, src, ref, 0, n, chunk, 1, 0);
  cr_assert_eq(um_release(src), UM_OK);
  ut_profile_close(&e);
  free(ref);
}

Test(stream, operations_fn_issues_come_before_the_next_copy) {
  ut_env e = open_limited(0);
  um_manager *mm = e.m;
  const size_t n = 5 * MiB + 99, chunk = 512 * KiB + 1;
  unsigned char *ref = malloc(n);
  um_buffer *src = NULL;
  fill_pattern(ref, n);
  cr_assert_eq(um_wrap_host(mm, ref, n, 0, &src), UM_OK);
  stream_and_check(mm, e.dev, src, ref, 0, n, chunk, 0, 1);
  cr_assert_eq(um_release(src), UM_OK);
  ut_profile_close(&e);
  free(ref);
}

Test(stream, one_chunk_when_the_chunk_is_larger_than_the_range) {
  ut_env e = open_limited(0);
  um_manager *mm = e.m;
  um_device *dev = e.dev;
  unsigned char ref[1000];
  um_buffer *src = NULL;
  seen s;
  um_stats st;
  fill_pattern(ref, sizeof(ref));
  cr_assert_eq(um_wrap_host(mm, ref, sizeof(ref), 0, &src), UM_OK);
  seen_init(&s, mm, 10, 900, 900);
  cr_assert_eq(um_stream(src, 10, 900, dev, 1 * MiB, on_chunk, on_progress, &s), UM_OK);
  cr_assert_eq(s.calls, 1);
  cr_assert_eq(s.progress_calls, 1);
  cr_assert_eq(s.last_done, 900);
  cr_assert_eq(memcmp(s.out, ref + 10, 900), 0);
  cr_assert_eq(um_buffer_size(s.bufs[0]), 0, "the chunk buffer was released");
  free(s.out);
  /* Only one buffer, of the range's size, was taken from the pool (all
   * devices: the wrap is the cpu's). */
  cr_assert_eq(um_stats_get(mm, NULL, &st), UM_OK);
  cr_assert_eq(st.allocations, 2); /* the wrap and one chunk */
  cr_assert_eq(um_release(src), UM_OK);
  ut_profile_close(&e);
}

Test(stream, progress_may_be_null_and_chunks_come_from_the_pool) {
  ut_env e = open_limited(0);
  um_manager *mm = e.m;
  um_device *dev = e.dev;
  const size_t n = 3 * MiB + 1, chunk = 1 * MiB;
  unsigned char *ref = malloc(n);
  um_buffer *src = NULL;
  um_stats a, b;
  seen s;
  fill_pattern(ref, n);
  cr_assert_eq(um_wrap_host(mm, ref, n, 0, &src), UM_OK);
  seen_init(&s, mm, 0, n, chunk);
  cr_assert_eq(um_stream(src, 0, n, dev, chunk, on_chunk, NULL, &s), UM_OK);
  cr_assert_eq(s.calls, 4);
  cr_assert_eq(memcmp(s.out, ref, n), 0);
  /* A second stream of the same chunk size takes both buffers from the pool. */
  cr_assert_eq(um_stats_get(mm, dev, &a), UM_OK);
  free(s.out);
  seen_init(&s, mm, 0, n, chunk);
  cr_assert_eq(um_stream(src, 0, n, dev, chunk, on_chunk, NULL, &s), UM_OK);
  cr_assert_eq(um_stats_get(mm, dev, &b), UM_OK);
  cr_assert_eq(b.pool_hits - a.pool_hits, 2);
  cr_assert_eq(b.pool_misses, a.pool_misses);
  free(s.out);
  cr_assert_eq(um_release(src), UM_OK);
  ut_profile_close(&e);
  free(ref);
}

Test(stream, a_nonzero_return_stops_the_stream) {
  ut_env e = open_limited(0);
  um_manager *mm = e.m;
  um_device *dev = e.dev;
  const size_t n = 4 * MiB + 3, chunk = 300 * KiB;
  unsigned char *ref = malloc(n);
  um_buffer *src = NULL;
  um_stats st;
  seen s;
  fill_pattern(ref, n);
  cr_assert_eq(um_wrap_host(mm, ref, n, 0, &src), UM_OK);
  seen_init(&s, mm, 0, n, chunk);
  s.stop_at = 3;
  s.stop_status = UM_ECANCELED;
  cr_assert_eq(um_stream(src, 0, n, dev, chunk, on_chunk, on_progress, &s), UM_ECANCELED);
  cr_assert_eq(s.calls, 4, "fn is not called after it said stop");
  cr_assert_eq(s.progress_calls, 3, "no progress for the chunk that stopped");
  cr_assert_eq(s.last_done, 3 * chunk);
  cr_assert_eq(memcmp(s.out, ref, 4 * chunk), 0);
  free(s.out);
  /* Any nonzero value comes back as it was, and nothing is left behind. */
  seen_init(&s, mm, 0, n, chunk);
  s.stop_at = 0;
  s.stop_status = 12345;
  cr_assert_eq(um_stream(src, 0, n, dev, chunk, on_chunk, on_progress, &s), 12345);
  cr_assert_eq(s.calls, 1);
  cr_assert_eq(s.progress_calls, 0);
  free(s.out);
  cr_assert_eq(um_stats_get(mm, NULL, &st), UM_OK);
  cr_assert_eq(st.active_buffers, 1); /* the source only (a wrap: the cpu's) */
  cr_assert_eq(um_release(src), UM_OK);
  ut_profile_close(&e);
  free(ref);
}

static int never_called(void *user, um_buffer *chunk, size_t offset, size_t bytes) {
  (void)user, (void)chunk, (void)offset, (void)bytes;
  cr_assert_fail("fn called on bad input");
  return 0;
}

Test(stream, bad_input) {
  ut_env e = open_limited(0);
  um_manager *mm = e.m, *other = ut_manager();
  um_device *dev = e.dev;
  unsigned char data[4096];
  um_buffer *src = NULL, *gone = NULL;
  um_stats st;
  memset(data, 1, sizeof(data));
  cr_assert_eq(um_wrap_host(mm, data, sizeof(data), 0, &src), UM_OK);
  cr_assert_eq(um_stream(NULL, 0, 16, dev, 16, never_called, NULL, NULL), UM_EINVAL);
  cr_assert_eq(um_stream(src, 0, 16, NULL, 16, never_called, NULL, NULL), UM_EINVAL);
  cr_assert_eq(um_stream(src, 0, 16, dev, 16, NULL, NULL, NULL), UM_EINVAL);
  cr_assert_eq(um_stream(src, 0, 0, dev, 16, never_called, NULL, NULL), UM_EINVAL);
  cr_assert_eq(um_stream(src, 0, 16, dev, 0, never_called, NULL, NULL), UM_EINVAL);
  cr_assert_eq(um_stream(src, 0, 16, um_device_get(other, 0), 16, never_called, NULL, NULL), UM_EINVAL);
  cr_assert_eq(um_stream(src, 0, 4097, dev, 16, never_called, NULL, NULL), UM_ERANGE);
  cr_assert_eq(um_stream(src, 4000, 97, dev, 16, never_called, NULL, NULL), UM_ERANGE);
  cr_assert_eq(um_stream(src, 4097, 1, dev, 16, never_called, NULL, NULL), UM_ERANGE);
  cr_assert_eq(um_stream(src, SIZE_MAX, 2, dev, 16, never_called, NULL, NULL), UM_ERANGE);
  cr_assert_eq(um_stream(src, 1, SIZE_MAX, dev, 16, never_called, NULL, NULL), UM_ERANGE);
  cr_assert(um_last_error()[0] != '\0', "no detail in um_last_error()");
  cr_assert_eq(um_wrap_host(mm, data, 64, 0, &gone), UM_OK);
  cr_assert_eq(um_release(gone), UM_OK);
  cr_assert_eq(um_stream(gone, 0, 16, dev, 16, never_called, NULL, NULL), UM_ESTATE);
  /* The manager is as it was (all devices: the wraps are the cpu's). */
  cr_assert_eq(um_stats_get(mm, NULL, &st), UM_OK);
  cr_assert_eq(st.active_buffers, 1);
  cr_assert_eq(st.allocations, 2);
  cr_assert_eq(um_release(src), UM_OK);
  cr_assert_eq(um_manager_destroy(other), UM_OK);
  ut_profile_close(&e);
}

/* Write ref[0..n) to a new file in a new temporary directory; dir and
 * path receive their names (dir: 256 bytes, path: 300). */
static void write_temp_file(const unsigned char *ref, size_t n, char *dir, char *path) {
  const char *tmp = getenv("TMPDIR");
  int fd;
  snprintf(dir, 256, "%s/unimem-stream-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  cr_assert_not_null(mkdtemp(dir));
  snprintf(path, 300, "%s/src.bin", dir);
  fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0644);
  cr_assert_geq(fd, 0);
  cr_assert_eq(write(fd, ref, n), (ssize_t)n);
  close(fd);
}

Test(stream, a_mapped_file) {
  ut_env e = open_limited(0);
  um_manager *mm = e.m;
  const size_t n = 7 * MiB + 31;
  unsigned char *ref = malloc(n);
  char dir[256], path[300];
  um_buffer *file = NULL;
  fill_pattern(ref, n);
  write_temp_file(ref, n, dir, path);
  cr_assert_eq(um_map_file(mm, path, UM_MAP_READ, &file), UM_OK);
  stream_and_check(mm, e.dev, file, ref, 1000, n - 1000, 2 * MiB + 1, 1, 0);
  cr_assert_eq(um_release(file), UM_OK);
  unlink(path);
  rmdir(dir);
  rmdir(dir);
  ut_profile_close(&e);
  free(ref);
}

/* ------------------------------------------------------------------------ */
/* A discrete device (test_util.h's test backend): device memory with no
 * host view, moved by the backend's blocking xfer on the core's threads,
 * as on a GPU. */

Test(stream_discrete, chunks_without_a_host_view) {
  ut_profile_only("cpu"); /* the test backend is its own */
  um_manager *mm = ut_manager_disc();
  um_device *disc = um_device_get(mm, 1);
  const size_t n = 9 * MiB + 4321, chunk = 2 * MiB + 17;
  unsigned char *ref = malloc(n);
  um_buffer *src = NULL;
  fill_pattern(ref, n);
  cr_assert_eq(um_wrap_host(mm, ref, n, UM_WRAP_READONLY, &src), UM_OK);
  stream_and_check(mm, disc, src, ref, 0, n, chunk, 1, 0);
  stream_and_check(mm, disc, src, ref, 99, n - 99 - 1, 1 * MiB + 1, 0, 1);
  cr_assert_eq(um_release(src), UM_OK);
  cr_assert_eq(um_manager_destroy(mm), UM_OK);
  free(ref);
}

/* ------------------------------------------------------------------------ */
/* A device capped at 8 MiB (device_limit_bytes: OpenCL and CUDA devices), a
 * source five times larger. */

#define LIMIT (8 * MiB)

Test(stream_limited, a_source_five_times_the_device_memory, .timeout = 120) {
  ut_env e = open_limited(LIMIT);
  um_manager *mm = e.m;
  um_device *dev = e.dev;
  const size_t n = 5 * LIMIT + 1001, chunk = 3 * MiB + 5;
  unsigned char *ref = malloc(n);
  um_buffer *src = NULL, *whole = NULL;
  fill_pattern(ref, n);
  cr_assert_eq(um_alloc(mm, um_device_get(mm, 0), n, UM_HOST, 0, &src), UM_OK);
  cr_assert_eq(um_copy_from_host(src, 0, ref, n, NULL), UM_OK);
  /* The source does not fit the device at once. */
  cr_assert_eq(um_alloc(mm, dev, n, UM_DEVICE, 0, &whole), UM_ENOMEM);
  stream_and_check(mm, dev, src, ref, 0, n, chunk, 1, 0);
  stream_and_check(mm, dev, src, ref, 12345, n - 12345 - 7, 1 * MiB + 1, 0, 1);
  cr_assert_eq(um_release(src), UM_OK);
  ut_profile_close(&e);
  free(ref);
}

Test(stream_limited, a_mapped_file_through_a_small_device, .timeout = 120) {
  ut_env e = open_limited(LIMIT);
  um_manager *mm = e.m;
  um_device *dev = e.dev;
  const size_t n = 4 * LIMIT + 77;
  unsigned char *ref = malloc(n);
  char dir[256], path[300];
  um_buffer *file = NULL;
  fill_pattern(ref, n);
  write_temp_file(ref, n, dir, path);
  cr_assert_eq(um_map_file(mm, path, UM_MAP_READ, &file), UM_OK);
  stream_and_check(mm, dev, file, ref, 0, n, 2 * MiB + 333, 0, 0);
  cr_assert_eq(um_release(file), UM_OK);
  unlink(path);
  rmdir(dir);
  rmdir(dir);
  ut_profile_close(&e);
  free(ref);
}

Test(stream_limited, chunks_too_large_for_the_device) {
  ut_env e = open_limited(LIMIT);
  um_manager *mm = e.m;
  um_device *dev = e.dev;
  const size_t n = 20 * MiB;
  unsigned char *ref = malloc(n);
  um_buffer *src = NULL;
  um_stats st;
  fill_pattern(ref, n);
  cr_assert_eq(um_wrap_host(mm, ref, n, 0, &src), UM_OK);
  /* One 5 MiB chunk fits, two do not. */
  cr_assert_eq(um_stream(src, 0, n, dev, 5 * MiB, never_called, NULL, NULL), UM_ENOMEM);
  cr_assert_eq(um_stats_get(mm, dev, &st), UM_OK);
  cr_assert_eq(st.active_buffers, 0);
  cr_assert_eq(um_release(src), UM_OK);
  ut_profile_close(&e);
  free(ref);
}
