/* API-level checks of CUDA devices through the whole library, shared by the
 * tests against the fake driver (test_fakecuda_*.c) and against a real GPU
 * (test_cuda_gpu.c). Each check takes a manager and a CUDA device of it and
 * asserts exact bytes and exact counter deltas: figures that a real GPU
 * gives the same way as the fake. Where the fake and a GPU differ (memory
 * figures: the real driver rounds allocations up and other processes use
 * the GPU too), the check takes an `exact` flag.
 *
 * Everything is static and marked unused, so each file takes what it
 * needs. */
#ifndef UNIMEM_CUDA_API_CHECKS_H
#define UNIMEM_CUDA_API_CHECKS_H

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

/* Criterion's info lines; the TSan stand-in (test_util_tsan.h) has none. */
#ifndef cr_log_info
#define cr_log_info(...) ut_log("INFO", __VA_ARGS__)
#endif

#define CAC_KiB ((size_t)1024)
#define CAC_MiB (1024 * CAC_KiB)
/* The staging chunk the checks configure: small, so that a copy of a few
 * hundred KiB already takes the pipelined path. */
#define CAC_CHUNK (64 * CAC_KiB)

/* ------------------------------------------------------------------------ */
/* Log capture */

#define CAC_LOG_LINES 64

typedef struct cac_log {
  pthread_mutex_t lock;
  int n;
  um_log_level level[CAC_LOG_LINES];
  char line[CAC_LOG_LINES][512];
} cac_log;

static UT_UNUSED cac_log cac_captured = {.lock = PTHREAD_MUTEX_INITIALIZER};

static UT_UNUSED void cac_log_fn(void *ctx, um_log_level level, const char *msg) {
  cac_log *log = ctx;
  pthread_mutex_lock(&log->lock);
  if (log->n < CAC_LOG_LINES) {
    log->level[log->n] = level;
    snprintf(log->line[log->n], sizeof(log->line[0]), "%s", msg);
    log->n++;
  }
  pthread_mutex_unlock(&log->lock);
}

/* Lines captured so far that contain needle. */
static UT_UNUSED int cac_log_count(const char *needle) {
  int n = 0;
  pthread_mutex_lock(&cac_captured.lock);
  for (int i = 0; i < cac_captured.n; i++)
    if (strstr(cac_captured.line[i], needle) != NULL)
      n++;
  pthread_mutex_unlock(&cac_captured.lock);
  return n;
}

/* The first captured line containing needle, or "" (valid until the next
 * capture reset; lines are never rewritten). */
static UT_UNUSED const char *cac_log_find(const char *needle) {
  const char *found = "";
  pthread_mutex_lock(&cac_captured.lock);
  for (int i = 0; i < cac_captured.n; i++)
    if (strstr(cac_captured.line[i], needle) != NULL) {
      found = cac_captured.line[i];
      break;
    }
  pthread_mutex_unlock(&cac_captured.lock);
  return found;
}

static UT_UNUSED void cac_log_dump(void) {
  pthread_mutex_lock(&cac_captured.lock);
  for (int i = 0; i < cac_captured.n; i++)
    cr_log_info("log[%d] level %d: %s", i, (int)cac_captured.level[i], cac_captured.line[i]);
  pthread_mutex_unlock(&cac_captured.lock);
}

/* ------------------------------------------------------------------------ */
/* Managers and devices */

/* ut_options_on, and where the checks' exact figures depend on them: small
 * staging chunks, peer access on, every log line from INFO up captured. */
static UT_UNUSED void cac_options(um_options *o, const char *backends) {
  ut_options_on(o, backends);
  o->use_pinned_staging = 1;
  o->staging_chunk_bytes = CAC_CHUNK;
  o->pinned_pool_bytes = 8 * CAC_CHUNK;
  o->enable_peer = 1;
  o->device_limit_bytes = 0;
  o->log_level = UM_LOG_INFO;
  o->log = cac_log_fn;
  o->log_ctx = &cac_captured;
}

/* Index of the n-th CUDA device (n from 0), -1 when there is none. */
static UT_UNUSED int cac_cuda_index(um_manager *m, int n) {
  for (int i = 0; i < um_device_count(m); i++) {
    um_device_info info;
    cr_assert_eq(um_device_info_get(um_device_get(m, i), &info), UM_OK);
    if (strcmp(info.backend, "cuda") == 0 && n-- == 0)
      return i;
  }
  return -1;
}

static UT_UNUSED int cac_cuda_count(um_manager *m) {
  int n = 0;
  while (cac_cuda_index(m, n) >= 0)
    n++;
  return n;
}

static UT_UNUSED um_device_info cac_info(um_device *d) {
  um_device_info info;
  cr_assert_eq(um_device_info_get(d, &info), UM_OK);
  return info;
}

static UT_UNUSED unsigned char *cac_xmalloc(size_t n) {
  unsigned char *p = malloc(n);
  cr_assert_not_null(p, "malloc(%zu)", n);
  return p;
}

static UT_UNUSED um_buffer *cac_alloc(um_manager *m, um_device *d, size_t n, um_location loc,
                                      unsigned flags) {
  um_buffer *b = NULL;
  int st = um_alloc(m, d, n, loc, flags, &b);
  cr_assert_eq(st, UM_OK, "um_alloc(%zu, loc %d) = %s: %s", n, (int)loc, um_err_name(st),
               um_last_error());
  return b;
}

#define CAC_OK(expr)                                                           \
  do {                                                                         \
    int cac_st_ = (expr);                                                      \
    cr_assert_eq(cac_st_, UM_OK, "%s = %s: %s", #expr, um_err_name(cac_st_),   \
                 um_last_error());                                             \
  } while (0)

/* The whole buffer's bytes, downloaded. */
static UT_UNUSED unsigned char *cac_download(um_buffer *b) {
  size_t n = um_buffer_size(b);
  unsigned char *p = cac_xmalloc(n);
  CAC_OK(um_copy_to_host(b, 0, p, n, NULL));
  return p;
}

static UT_UNUSED void cac_wait_release(um_event *e, int want) {
  int st = um_event_wait(e);
  cr_assert_eq(st, want, "event: %s, expected %s", um_err_name(st), um_err_name(want));
  um_event_release(e);
}

/* Counter deltas of one device between two snapshots. */
#define CAC_DELTA(after, before, field) ((after).field - (before).field)
/* Bytes moved in any direction. Copies between a buffer with a host view
 * (PINNED, a wrap) and device memory are checked with this sum: whether
 * such bytes count as h2d/d2h or as within/between devices is the stats
 * module's choice, not the CUDA backend's. */
#define CAC_MOVED(s) ((s).bytes_h2d + (s).bytes_d2h + (s).bytes_d2d + (s).bytes_peer)

/* ------------------------------------------------------------------------ */
/* Checks */

/* A CUDA device as um_device_info and um_device_memory describe it. */
static UT_UNUSED void cac_check_device(um_device *d, int exact) {
  um_device_info info = cac_info(d);
  uint64_t free_bytes = 0, total_bytes = 0;
  cr_assert_str_eq(info.backend, "cuda");
  cr_assert(info.index > 0, "a CUDA device is never device 0");
  cr_assert(info.name[0] != '\0');
  cr_assert((info.caps & (UM_CAP_PINNED | UM_CAP_ASYNC)) == (UM_CAP_PINNED | UM_CAP_ASYNC),
            "caps 0x%x", info.caps);
  cr_assert(info.locations & (1u << UM_DEVICE));
  cr_assert(info.locations & (1u << UM_PINNED));
  cr_assert(info.locations & (1u << UM_HOST), "HOST: pageable host memory, on every device");
  cr_assert_eq((info.caps & UM_CAP_UNIFIED) != 0, (info.locations & (1u << UM_UNIFIED)) != 0);
  cr_assert(info.total_bytes > 0);
  CAC_OK(um_device_memory(d, &free_bytes, &total_bytes));
  cr_assert(free_bytes <= total_bytes, "free %llu > total %llu", (unsigned long long)free_bytes,
            (unsigned long long)total_bytes);
  if (exact)
    cr_assert_eq(total_bytes, info.total_bytes);
  else
    cr_assert(total_bytes > 0);
  CAC_OK(um_device_synchronize(d));
}

/* Every location the device offers: zeroed allocation, host view or not,
 * coherence bits, reuse of the released block. */
static UT_UNUSED void cac_check_locations(um_manager *m, um_device *d) {
  um_device_info info = cac_info(d);
  um_buffer *b = NULL, *again = NULL;
  um_stats before, after;
  const size_t n = 10000;
  unsigned char *back;

  for (int loc = UM_HOST; loc <= UM_UNIFIED; loc++) {
    if (!(info.locations & (1u << loc))) {
      cr_assert_eq(um_alloc(m, d, n, (um_location)loc, 0, &b), UM_ENOTSUP);
      continue;
    }
    before = ut_stats(m, d);
    b = cac_alloc(m, d, n, (um_location)loc, UM_ALLOC_ZERO);
    cr_assert_eq(um_buffer_size(b), n);
    cr_assert_eq(um_buffer_device(b), d);
    cr_assert_eq(um_buffer_location(b), (um_location)loc);
    if (loc == UM_DEVICE) {
      cr_assert_null(um_buffer_host_ptr(b), "DEVICE memory of a GPU has no host view");
      cr_assert_eq(um_buffer_valid(b), UM_VALID_DEVICE);
    } else {
      cr_assert_not_null(um_buffer_host_ptr(b), "location %d has a host view", loc);
      cr_assert_eq(um_buffer_valid(b), UM_VALID_HOST | UM_VALID_DEVICE);
      cr_assert(ut_all_bytes(um_buffer_host_ptr(b), n, 0));
    }
    back = cac_download(b);
    cr_assert(ut_all_bytes(back, n, 0), "UM_ALLOC_ZERO at location %d", loc);
    free(back);
    CAC_OK(um_release(b));
    again = cac_alloc(m, d, n, (um_location)loc, 0);
    cr_assert_eq(again, b, "release then allocate the same size gives back the same block");
    after = ut_stats(m, d);
    cr_assert_eq(CAC_DELTA(after, before, allocations), 2);
    cr_assert_eq(CAC_DELTA(after, before, pool_misses), 1);
    cr_assert_eq(CAC_DELTA(after, before, pool_hits), 1);
    cr_assert_eq(CAC_DELTA(after, before, device_allocs), 1);
    cr_assert_eq(CAC_DELTA(after, before, bytes_d2h), n);
    CAC_OK(um_release(again));
  }
}

/* Round trips of many sizes at many offsets into a buffer at loc, blocking
 * or with events (the copy in, the copy out and a guard check chained on
 * one buffer without waiting in between). The bytes around the range keep
 * their fill value, and the byte counters move by exactly what was copied. */
static UT_UNUSED void cac_check_round_trips(um_manager *m, um_device *d, um_location loc, int async) {
  static const size_t sizes[] = {1, 3, 4096, 65536 + 5, 300000, 2 * CAC_MiB + 17};
  static const size_t offsets[] = {0, 1, 4093};
  uint64_t in = 0, out = 0;
  um_stats before = ut_stats(m, d), after;

  for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
    for (size_t j = 0; j < sizeof(offsets) / sizeof(offsets[0]); j++) {
      size_t n = sizes[i], off = offsets[j], total = off + n + 11;
      unsigned char *src = cac_xmalloc(n), *whole = cac_xmalloc(total), *back = cac_xmalloc(n);
      um_buffer *b = cac_alloc(m, d, total, loc, 0);
      ut_pattern(src, n, i * 31 + j + 1);
      memset(back, 0, n);
      if (async) {
        um_event *e[4];
        CAC_OK(um_fill(b, 0, 0x5A, total, &e[0]));
        CAC_OK(um_copy_from_host(b, off, src, n, &e[1]));
        CAC_OK(um_copy_to_host(b, off, back, n, &e[2]));
        CAC_OK(um_copy_to_host(b, 0, whole, total, &e[3]));
        for (int k = 3; k >= 0; k--)
          cac_wait_release(e[k], UM_OK);
      } else {
        CAC_OK(um_fill(b, 0, 0x5A, total, NULL));
        CAC_OK(um_copy_from_host(b, off, src, n, NULL));
        CAC_OK(um_copy_to_host(b, off, back, n, NULL));
        CAC_OK(um_copy_to_host(b, 0, whole, total, NULL));
      }
      cr_assert_arr_eq(back, src, n, "%zu bytes at offset %zu, location %d", n, off, (int)loc);
      cr_assert(ut_all_bytes(whole, off, 0x5A), "bytes before the range changed");
      cr_assert_arr_eq(whole + off, src, n);
      cr_assert(ut_all_bytes(whole + off + n, 11, 0x5A), "bytes after the range changed");
      in += n;
      out += n + total;
      CAC_OK(um_release(b));
      free(src);
      free(whole);
      free(back);
    }
  }
  after = ut_stats(m, d);
  cr_assert_eq(CAC_DELTA(after, before, bytes_h2d), in);
  cr_assert_eq(CAC_DELTA(after, before, bytes_d2h), out);
  cr_assert_eq(CAC_DELTA(after, before, fills), 18);
}

/* The transfer strategies on one device, each with its counters (the
 * manager was made with cac_options: CAC_CHUNK staging chunks):
 * direct from the device's pinned memory, pipelined staging for pageable
 * memory larger than one chunk (both directions), one direct call for
 * pageable copies of at most a chunk, device-local copies, device fills,
 * overlapping ranges of one buffer through the host; blocking, then again
 * with events. */
static UT_UNUSED void cac_check_strategies(um_manager *m, um_device *d, int async) {
  const size_t n = 16 * CAC_CHUNK + 123; /* 17 chunks, the last one short */
  um_buffer *dev = cac_alloc(m, d, n, UM_DEVICE, 0);
  um_buffer *dev2 = cac_alloc(m, d, n, UM_DEVICE, 0);
  um_buffer *pin = cac_alloc(m, d, n, UM_PINNED, 0);
  unsigned char *src = cac_xmalloc(n), *back = cac_xmalloc(n), *want = cac_xmalloc(n);
  unsigned char *pinned = um_buffer_host_ptr(pin);
  um_stats s0, s1;
  um_event *e = NULL;
  um_event **ep = async ? &e : NULL;

#define CAC_RUN(call)                                                          \
  do {                                                                         \
    CAC_OK(call);                                                              \
    if (async)                                                                 \
      cac_wait_release(e, UM_OK);                                              \
  } while (0)

  ut_pattern(src, n, 11);
  ut_pattern(pinned, n, 12);

  /* Pinned memory of the device -> device: one direct DMA. */
  s0 = ut_stats(m, d);
  CAC_RUN(um_copy(dev, 0, pin, 0, n, ep));
  s1 = ut_stats(m, d);
  cr_assert_eq(CAC_DELTA(s1, s0, xfer_direct), 1);
  cr_assert_eq(CAC_DELTA(s1, s0, xfer_pipelined), 0);
  cr_assert_eq(CAC_MOVED(s1) - CAC_MOVED(s0), n);

  /* Device -> pinned memory of the device: one direct DMA. */
  memset(pinned, 0, n);
  CAC_RUN(um_copy(pin, 0, dev, 0, n, ep));
  ut_pattern(want, n, 12);
  cr_assert_arr_eq(pinned, want, n);
  s0 = ut_stats(m, d);
  cr_assert_eq(CAC_DELTA(s0, s1, xfer_direct), 1);
  cr_assert_eq(CAC_MOVED(s0) - CAC_MOVED(s1), n);

  /* Pageable -> device, more than a chunk: pipelined staging. */
  CAC_RUN(um_copy_from_host(dev, 0, src, n, ep));
  s1 = ut_stats(m, d);
  cr_assert_eq(CAC_DELTA(s1, s0, xfer_pipelined), 1);
  cr_assert_eq(CAC_DELTA(s1, s0, xfer_direct), 0);
  cr_assert_eq(CAC_DELTA(s1, s0, bytes_h2d), n);

  /* Device -> pageable, more than a chunk: pipelined staging. */
  memset(back, 0, n);
  CAC_RUN(um_copy_to_host(dev, 0, back, n, ep));
  cr_assert_arr_eq(back, src, n);
  s0 = ut_stats(m, d);
  cr_assert_eq(CAC_DELTA(s0, s1, xfer_pipelined), 1);
  cr_assert_eq(CAC_DELTA(s0, s1, bytes_d2h), n);

  /* Pageable copies of exactly one chunk: one direct call each way. */
  CAC_RUN(um_copy_from_host(dev, 5, src + 1000, CAC_CHUNK, ep));
  CAC_RUN(um_copy_to_host(dev, 5, back, CAC_CHUNK, ep));
  cr_assert_arr_eq(back, src + 1000, CAC_CHUNK);
  s1 = ut_stats(m, d);
  cr_assert_eq(CAC_DELTA(s1, s0, xfer_direct), 2);
  cr_assert_eq(CAC_DELTA(s1, s0, xfer_pipelined), 0);
  cr_assert_eq(CAC_DELTA(s1, s0, bytes_h2d), CAC_CHUNK);
  cr_assert_eq(CAC_DELTA(s1, s0, bytes_d2h), CAC_CHUNK);

  /* Device -> device on the same device: a device-local copy. */
  CAC_RUN(um_copy_from_host(dev, 0, src, n, ep));
  s0 = ut_stats(m, d);
  CAC_RUN(um_copy(dev2, 0, dev, 0, n, ep));
  s1 = ut_stats(m, d);
  cr_assert_eq(CAC_DELTA(s1, s0, xfer_local), 1);
  cr_assert_eq(CAC_DELTA(s1, s0, bytes_d2d), n);
  CAC_RUN(um_copy_to_host(dev2, 0, back, n, ep));
  cr_assert_arr_eq(back, src, n);

  /* Fill on the device. */
  s0 = ut_stats(m, d);
  CAC_RUN(um_fill(dev2, 100, 0xC3, 5000, ep));
  s1 = ut_stats(m, d);
  cr_assert_eq(CAC_DELTA(s1, s0, fills), 1);
  CAC_RUN(um_copy_to_host(dev2, 0, back, n, ep));
  memcpy(want, src, n);
  memset(want + 100, 0xC3, 5000);
  cr_assert_arr_eq(back, want, n);

  /* Overlapping ranges of one device buffer: through the host (memmove). */
  s0 = ut_stats(m, d);
  CAC_RUN(um_copy(dev, 1000, dev, 0, 50000, ep));
  s1 = ut_stats(m, d);
  cr_assert_eq(CAC_DELTA(s1, s0, xfer_staged), 1);
  cr_assert_eq(CAC_DELTA(s1, s0, bytes_d2d), 50000);
  CAC_RUN(um_copy_to_host(dev, 0, back, n, ep));
  memcpy(want, src, n);
  memmove(want + 1000, src, 50000);
  cr_assert_arr_eq(back, want, n);
#undef CAC_RUN

  CAC_OK(um_release(dev));
  CAC_OK(um_release(dev2));
  CAC_OK(um_release(pin));
  free(src);
  free(back);
  free(want);
}

/* Copies between two CUDA devices: the peer path when access a <- b is
 * enabled, else staged through the host. Counted on the destination. */
static UT_UNUSED void cac_check_between(um_manager *m, um_device *a, um_device *b, int expect_peer) {
  const size_t n = 5 * CAC_CHUNK + 77;
  um_buffer *x = cac_alloc(m, a, n, UM_DEVICE, 0), *y = cac_alloc(m, b, n, UM_DEVICE, 0);
  unsigned char *src = cac_xmalloc(n), *back = cac_xmalloc(n);
  um_stats s0, s1;
  um_event *e;

  cr_assert_eq(um_peer_enabled(b, a), expect_peer);
  ut_pattern(src, n, 21);
  CAC_OK(um_copy_from_host(x, 0, src, n, NULL));
  s0 = ut_stats(m, b);
  CAC_OK(um_copy(y, 0, x, 0, n, NULL));
  CAC_OK(um_copy(y, 10, x, 20, 1000, &e));
  cac_wait_release(e, UM_OK);
  s1 = ut_stats(m, b);
  cr_assert_eq(CAC_DELTA(s1, s0, bytes_peer), n + 1000);
  if (expect_peer) {
    cr_assert_eq(CAC_DELTA(s1, s0, xfer_peer), 2);
    cr_assert_eq(CAC_DELTA(s1, s0, xfer_staged), 0);
  } else {
    cr_assert_eq(CAC_DELTA(s1, s0, xfer_staged), 2);
    cr_assert_eq(CAC_DELTA(s1, s0, xfer_peer), 0);
  }
  CAC_OK(um_copy_to_host(y, 0, back, n, NULL));
  cr_assert_arr_eq(back, src, 10);
  cr_assert_arr_eq(back + 10, src + 20, 1000);
  cr_assert_arr_eq(back + 1010, src + 1010, n - 1010);
  CAC_OK(um_release(x));
  CAC_OK(um_release(y));
  free(src);
  free(back);
}

/* Operations on one buffer with events and no waiting in between happen in
 * the order issued, whichever of the device's streams (uploads, downloads,
 * on-device work) or the core's workers (pipelined copies) run them: a
 * seeded random mix of copies in (small: native, large: pipelined), fills,
 * copies between two buffers and copies out, compared with a model that
 * applies them one by one. */
static UT_UNUSED void cac_check_ordering(um_manager *m, um_device *d, uint64_t seed, int nops) {
  const size_t size = 8 * CAC_CHUNK;
  um_buffer *buf[2];
  unsigned char *model[2], *src = cac_xmalloc(size);
  unsigned char **outs = calloc((size_t)nops, sizeof(*outs));
  unsigned char **wants = calloc((size_t)nops, sizeof(*wants));
  size_t *out_n = calloc((size_t)nops, sizeof(*out_n));
  um_event **events = calloc((size_t)nops, sizeof(*events));
  uint64_t rng = seed;
  int nevents = 0;

  cr_assert(outs && wants && out_n && events);
  ut_pattern(src, size, seed);
  for (int i = 0; i < 2; i++) {
    buf[i] = cac_alloc(m, d, size, UM_DEVICE, 0);
    model[i] = cac_xmalloc(size);
    memset(model[i], 0, size);
    CAC_OK(um_fill(buf[i], 0, 0, size, NULL));
  }
  for (int k = 0; k < nops; k++) {
    int which = (int)(ut_rand(&rng) % 2), kind = (int)(ut_rand(&rng) % 4);
    /* Mostly small ranges (native on the device's streams), some larger
     * than a chunk (pipelined through the workers). */
    size_t n = ut_rand(&rng) % 4 == 0 ? ut_range(&rng, CAC_CHUNK + 1, 3 * CAC_CHUNK)
                                      : ut_range(&rng, 1, 8192);
    size_t off = ut_range(&rng, 0, size - n), off2 = ut_range(&rng, 0, size - n);
    um_event **ev = &events[nevents++];
    switch (kind) {
    case 0:
      CAC_OK(um_copy_from_host(buf[which], off, src + off2, n, ev));
      memcpy(model[which] + off, src + off2, n);
      break;
    case 1: {
      int v = (int)(ut_rand(&rng) & 0xFF);
      CAC_OK(um_fill(buf[which], off, v, n, ev));
      memset(model[which] + off, v, n);
      break;
    }
    case 2:
      CAC_OK(um_copy(buf[which], off, buf[!which], off2, n, ev));
      memcpy(model[which] + off, model[!which] + off2, n);
      break;
    default:
      outs[k] = cac_xmalloc(n);
      wants[k] = cac_xmalloc(n);
      out_n[k] = n;
      memcpy(wants[k], model[which] + off, n);
      CAC_OK(um_copy_to_host(buf[which], off, outs[k], n, ev));
      break;
    }
  }
  for (int k = 0; k < nevents; k++)
    cac_wait_release(events[k], UM_OK);
  for (int k = 0; k < nops; k++) {
    if (outs[k] == NULL)
      continue;
    cr_assert_arr_eq(outs[k], wants[k], out_n[k], "copy-out %d (seed %llu)", k,
                     (unsigned long long)seed);
    free(outs[k]);
    free(wants[k]);
  }
  for (int i = 0; i < 2; i++) {
    unsigned char *back = cac_download(buf[i]);
    cr_assert_arr_eq(back, model[i], size, "final contents of buffer %d (seed %llu)", i,
                     (unsigned long long)seed);
    free(back);
    free(model[i]);
    CAC_OK(um_release(buf[i]));
  }
  free(src);
  free(outs);
  free(wants);
  free(out_n);
  free(events);
}

/* UM_WRAP_PIN registers the range with the CUDA driver, so copies between
 * it and the device are one direct DMA even above a staging chunk; a wrap
 * without the flag goes through the pipelined staging. The counters are
 * read over all devices: a wrap belongs to device 0. */
static UT_UNUSED void cac_check_wrap_pin(um_manager *m, um_device *d) {
  const size_t n = 4 * CAC_CHUNK;
  unsigned char *pinned = aligned_alloc(4096, n), *plain = aligned_alloc(4096, n);
  um_buffer *wp = NULL, *wu = NULL, *dev = cac_alloc(m, d, n, UM_DEVICE, 0);
  um_stats s0, s1;
  um_event *e;

  cr_assert(pinned && plain);
  ut_pattern(pinned, n, 31);
  CAC_OK(um_wrap_host(m, pinned, n, UM_WRAP_PIN, &wp));
  CAC_OK(um_wrap_host(m, plain, n, 0, &wu));
  cr_assert_eq(um_buffer_host_ptr(wp), pinned);

  cr_assert_eq(cac_log_count("did not register"), 0, "%s", cac_log_find("did not register"));

  s0 = ut_stats(m, NULL);
  CAC_OK(um_copy(dev, 0, wp, 0, n, NULL));
  CAC_OK(um_copy(wu, 0, dev, 0, n, &e));
  cac_wait_release(e, UM_OK);
  s1 = ut_stats(m, NULL);
  cr_assert_arr_eq(plain, pinned, n);
  cr_assert_eq(CAC_DELTA(s1, s0, xfer_direct), 1, "the registered wrap is one DMA");
  cr_assert_eq(CAC_DELTA(s1, s0, xfer_pipelined), 1, "the plain wrap is staged");
  cr_assert_eq(CAC_MOVED(s1) - CAC_MOVED(s0), 2 * n);

  memset(pinned, 0, n);
  CAC_OK(um_copy(wp, 0, dev, 0, n, &e));
  cac_wait_release(e, UM_OK);
  cr_assert_arr_eq(pinned, plain, n);
  s0 = ut_stats(m, NULL);
  cr_assert_eq(CAC_DELTA(s0, s1, xfer_direct), 1);
  cr_assert_eq(CAC_DELTA(s0, s1, xfer_pipelined), 0);

  /* Released with nothing pending (an event's wait can return just before
   * its buffers' bookkeeping ends; synchronize waits for that too), the
   * registration ends in um_release: the range can be registered again. */
  CAC_OK(um_device_synchronize(d));
  CAC_OK(um_release(wp));
  CAC_OK(um_release(wu));
  CAC_OK(um_release(dev));
  CAC_OK(um_wrap_host(m, pinned, n, UM_WRAP_PIN, &wp));
  cr_assert_eq(cac_log_count("did not register"), 0, "%s", cac_log_find("did not register"));
  CAC_OK(um_release(wp));
  free(pinned);
  free(plain);
}

/* Memory figures move with DEVICE allocations. exact: the fake, whose
 * figures move by exactly the bytes allocated. A GPU rounds up and shares
 * its memory with other processes (ctest -j runs the GPU tests side by
 * side), whose frees can land between the two readings: there only the
 * direction is checked, and it must show in one of CAC_MEMORY_TRIES
 * allocations. */
enum { CAC_MEMORY_TRIES = 16 };

static UT_UNUSED void cac_check_memory(um_manager *m, um_device *d, int exact) {
  uint64_t free0 = 0, total0 = 0, free1 = 0, total1 = 0, free2 = 0, total2 = 0;
  const size_t n = 3 * CAC_MiB + 4096;
  int tries = 0, fell = 0;

  do {
    um_buffer *b;
    CAC_OK(um_device_memory(d, &free0, &total0));
    b = cac_alloc(m, d, n, UM_DEVICE, UM_ALLOC_UNPOOLED);
    CAC_OK(um_device_memory(d, &free1, &total1));
    CAC_OK(um_release(b));
    CAC_OK(um_device_memory(d, &free2, &total2));
    cr_assert_eq(total1, total0);
    cr_assert_eq(total2, total0);
    fell = free1 < free0;
    tries++;
  } while (!exact && !fell && tries < CAC_MEMORY_TRIES);
  if (exact) {
    cr_assert_eq(free0 - free1, n);
    cr_assert_eq(free2, free0);
  } else {
    cr_assert(fell, "free %llu after allocating %zu bytes, %llu before (in each of %d tries)",
              (unsigned long long)free1, n, (unsigned long long)free0, tries);
  }
}

/* device_limit_bytes caps the DEVICE (and UNIFIED) bytes of each GPU: the
 * figures say so, and past the limit an allocation first makes the pool
 * give its idle blocks back, then retries, then answers UM_ENOMEM. The
 * manager was made with device_limit_bytes = 4 MiB. */
static UT_UNUSED void cac_check_limit(um_manager *m, um_device *d) {
  uint64_t free_bytes = 0, total_bytes = 0;
  um_buffer *a, *b, *c = NULL;
  um_stats s0, s1;

  cr_assert_eq(cac_info(d).total_bytes, 4 * CAC_MiB);
  CAC_OK(um_device_memory(d, &free_bytes, &total_bytes));
  cr_assert_eq(total_bytes, 4 * CAC_MiB);
  cr_assert_eq(free_bytes, 4 * CAC_MiB);

  s0 = ut_stats(m, d);
  a = cac_alloc(m, d, 2 * CAC_MiB, UM_DEVICE, 0);
  CAC_OK(um_device_memory(d, &free_bytes, NULL));
  cr_assert_eq(free_bytes, 2 * CAC_MiB);
  CAC_OK(um_release(a)); /* idle in the pool, still held from the device */
  CAC_OK(um_device_memory(d, &free_bytes, NULL));
  cr_assert_eq(free_bytes, 2 * CAC_MiB);
  /* 3 MiB does not fit next to the idle 2 MiB: trim, retry, success. */
  b = cac_alloc(m, d, 3 * CAC_MiB, UM_DEVICE, 0);
  s1 = ut_stats(m, d);
  cr_assert_eq(CAC_DELTA(s1, s0, oom_retries), 1);
  cr_assert_eq(CAC_DELTA(s1, s0, trims), 1);
  cr_assert_eq(CAC_DELTA(s1, s0, bytes_trimmed), 2 * CAC_MiB);
  cr_assert_eq(s1.bytes_pooled, 0);
  /* Another 2 MiB cannot fit at all: UM_ENOMEM after the retry. */
  cr_assert_eq(um_alloc(m, d, 2 * CAC_MiB, UM_DEVICE, 0, &c), UM_ENOMEM);
  cr_assert_null(c);
  cr_assert(strstr(um_last_error(), "device_limit_bytes") != NULL, "%s", um_last_error());
  s0 = ut_stats(m, d);
  cr_assert_eq(CAC_DELTA(s0, s1, oom_retries), 1);
  cr_assert_eq(CAC_DELTA(s0, s1, allocations), 0);
  cr_assert_eq(s0.active_buffers, 1);
  /* PINNED memory is host memory: the limit does not count it. */
  c = cac_alloc(m, d, 2 * CAC_MiB, UM_PINNED, 0);
  CAC_OK(um_release(c));
  CAC_OK(um_release(b));
}

/* Several threads, each with its own buffers, round trips at once; the
 * byte counters add up exactly. */
typedef struct cac_thread_arg {
  um_manager *m;
  um_device *d;
  unsigned seed;
  int rounds;
  size_t bytes_in, bytes_out;
  int failed;
} cac_thread_arg;

static UT_UNUSED void *cac_thread_main(void *p) {
  cac_thread_arg *a = p;
  uint64_t rng = a->seed;
  for (int r = 0; r < a->rounds && !a->failed; r++) {
    size_t n = ut_range(&rng, 1, 3 * CAC_CHUNK);
    um_location loc = r % 3 == 2 ? UM_PINNED : UM_DEVICE;
    unsigned char *src = malloc(n), *back = malloc(n);
    um_buffer *b = NULL;
    um_event *e1 = NULL, *e2 = NULL;
    if (src == NULL || back == NULL || um_alloc(a->m, a->d, n, loc, 0, &b) != UM_OK) {
      a->failed = 1;
    } else {
      ut_pattern(src, n, a->seed * 1000 + (unsigned)r);
      if (um_copy_from_host(b, 0, src, n, r % 2 ? &e1 : NULL) != UM_OK ||
          um_copy_to_host(b, 0, back, n, r % 2 ? &e2 : NULL) != UM_OK)
        a->failed = 1;
      if (e1 != NULL && um_event_wait(e1) != UM_OK)
        a->failed = 1;
      if (e2 != NULL && um_event_wait(e2) != UM_OK)
        a->failed = 1;
      if (e1 != NULL)
        um_event_release(e1);
      if (e2 != NULL)
        um_event_release(e2);
      if (memcmp(src, back, n) != 0)
        a->failed = 2;
      if (um_release(b) != UM_OK)
        a->failed = 1;
      a->bytes_in += n;
      a->bytes_out += n;
    }
    free(src);
    free(back);
  }
  return NULL;
}

static UT_UNUSED void cac_check_threads(um_manager *m, um_device *d, int nthreads, int rounds) {
  pthread_t t[8];
  cac_thread_arg args[8];
  uint64_t in = 0, out = 0;
  um_stats s0 = ut_stats(m, d), s1;
  cr_assert(nthreads <= 8);
  for (int i = 0; i < nthreads; i++) {
    args[i] = (cac_thread_arg){.m = m, .d = d, .seed = 100u + (unsigned)i, .rounds = rounds};
    cr_assert_eq(pthread_create(&t[i], NULL, cac_thread_main, &args[i]), 0);
  }
  for (int i = 0; i < nthreads; i++) {
    pthread_join(t[i], NULL);
    cr_assert_eq(args[i].failed, 0, "thread %d failed (%d)", i, args[i].failed);
    in += args[i].bytes_in;
    out += args[i].bytes_out;
  }
  s1 = ut_stats(m, d);
  cr_assert_eq(CAC_DELTA(s1, s0, bytes_h2d), in);
  cr_assert_eq(CAC_DELTA(s1, s0, bytes_d2h), out);
  cr_assert_eq(s1.active_buffers, s0.active_buffers);
}

#endif /* UNIMEM_CUDA_API_CHECKS_H */
