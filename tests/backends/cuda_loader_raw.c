/* The cuda backend through its backend.h table, without the core.
 *
 * The driver is loaded once per process, so each case runs in a process of
 * its own: `cuda_loader_raw CASE`. UNIMEM_CUDA_LIBRARY picks the driver:
 *
 *   nolib        (UNIMEM_CUDA_LIBRARY unset or a missing file) open answers
 *                UM_ENODEV naming the library
 *   missing      libfakecuda_missing.so: UM_ENODEV naming cuMemAlloc_v2
 *   stub         the toolkit's stubs/libcuda.so: every entry point resolves,
 *                cuInit refuses, UM_ENODEV naming cuInit
 *   nodevice     libfakecuda_full.so, cuInit says CUDA_ERROR_NO_DEVICE:
 *                UM_OK with no device and the reason recorded
 *   full         libfakecuda_full.so: describe, every location, blocking and
 *                asynchronous H2D/D2H/D2D/FILL byte-checked, memory figures,
 *                host registration, four threads at once, nothing leaked
 *   full_threaded  the same with the fake's streams running on their own
 *                threads and slow copies, so completions come late and
 *                tokens are released before their transfer finished
 *   limit        device_limit_bytes: the total described (the core counts)
 *   errors       driver failures become the right UM_E* code and text
 *   nomanaged    a device without managed memory offers no UNIFIED
 *   asyncalloc   UNIMEM_CUDA_ASYNC_ALLOC=1: stream-ordered allocation
 *   peer         two fake devices: peer access and peer copies
 *   real         the real driver (UNIMEM_CUDA_LIBRARY unset); skips without
 *                a GPU
 *
 * Exit status 0 pass, 1 fail, 77 skip (with the reason printed).
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"

#define EXIT_SKIP 77
#define MIB ((size_t)1 << 20)

/* What the cases call: um__backend_cuda itself, or on the fake the same
 * operations each preceded by dropping the thread's current context. */
static const um__backend *backend = &um__backend_cuda;

/* From libfakecuda_full.so; NULL on a real driver. */
static long (*fake_count)(const char *what);
static void (*fake_forget_current)(void);
static const void *(*fake_current_context)(void);

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: CHECK(%s) failed; um_last_error: %s\n",         \
              __FILE__, __LINE__, #cond, um_last_error());                     \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

#define CHECK_STATUS(expr, want)                                               \
  do {                                                                         \
    int got_ = (expr);                                                         \
    if (got_ != (want)) {                                                      \
      fprintf(stderr, "%s:%d: %s = %s, want %s; um_last_error: %s\n",         \
              __FILE__, __LINE__, #expr, um_err_name(got_),                    \
              um_err_name(want), um_last_error());                             \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

#define CHECK_TEXT(needle)                                                     \
  do {                                                                         \
    if (strstr(um_last_error(), (needle)) == NULL) {                           \
      fprintf(stderr, "%s:%d: um_last_error \"%s\" lacks \"%s\"\n", __FILE__, \
              __LINE__, um_last_error(), (needle));                            \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

static void skip(const char *reason) {
  printf("SKIP: %s\n", reason);
  exit(EXIT_SKIP);
}

static void set_env(const char *name, const char *value) {
  CHECK(setenv(name, value, 1) == 0);
}

/* Every operation called with no current context, as from a thread that
 * never touched CUDA: the backend must set the device's context itself,
 * and give the thread its own (none) back before returning. */
#define FORGETFUL(call)                                                        \
  do {                                                                         \
    fake_forget_current();                                                     \
    call;                                                                      \
    if (fake_current_context() != NULL) {                                      \
      fprintf(stderr, "%s:%d: %s left a context current\n", __FILE__,         \
              __LINE__, #call);                                                \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

static int forgetful_open(const um_options *opts, void **ctx, int *count) {
  int status;
  FORGETFUL(status = um__backend_cuda.open(opts, ctx, count));
  return status;
}
static int forgetful_describe(void *ctx, int i, um__bdev_desc *out) {
  int status;
  FORGETFUL(status = um__backend_cuda.describe(ctx, i, out));
  return status;
}
static void forgetful_close(void *ctx) {
  FORGETFUL(um__backend_cuda.close(ctx));
}
static int forgetful_mem_alloc(void *bdev, um_location loc, size_t bytes,
                               um__mem *out) {
  int status;
  FORGETFUL(status = um__backend_cuda.mem_alloc(bdev, loc, bytes, out));
  return status;
}
static void forgetful_mem_free(void *bdev, um_location loc, size_t bytes,
                               um__mem *mem) {
  FORGETFUL(um__backend_cuda.mem_free(bdev, loc, bytes, mem));
}
static int forgetful_host_register(void *bdev, void *host, size_t bytes,
                                   um__mem *out) {
  int status;
  FORGETFUL(status = um__backend_cuda.host_register(bdev, host, bytes, out));
  return status;
}
static void forgetful_host_unregister(void *bdev, um__mem *mem) {
  FORGETFUL(um__backend_cuda.host_unregister(bdev, mem));
}
static int forgetful_memory(void *bdev, uint64_t *free_bytes,
                            uint64_t *total_bytes) {
  int status;
  FORGETFUL(status = um__backend_cuda.memory(bdev, free_bytes, total_bytes));
  return status;
}
static int forgetful_synchronize(void *bdev) {
  int status;
  FORGETFUL(status = um__backend_cuda.synchronize(bdev));
  return status;
}
static int forgetful_xfer(void *bdev, const um__xfer *x) {
  int status;
  FORGETFUL(status = um__backend_cuda.xfer(bdev, x));
  return status;
}
static int forgetful_xfer_async(void *bdev, const um__xfer *x,
                                void *const *after, int nafter,
                                um__done_fn done, void *arg, void **native) {
  int status;
  FORGETFUL(status = um__backend_cuda.xfer_async(bdev, x, after, nafter, done,
                                                 arg, native));
  return status;
}
static void forgetful_native_release(void *bdev, void *native) {
  FORGETFUL(um__backend_cuda.native_release(bdev, native));
}
static int forgetful_peer_possible(void *a, void *b) {
  int status;
  FORGETFUL(status = um__backend_cuda.peer_possible(a, b));
  return status;
}
static int forgetful_peer_enable(void *a, void *b) {
  int status;
  FORGETFUL(status = um__backend_cuda.peer_enable(a, b));
  return status;
}

static const um__backend forgetful_backend = {
    .name = "cuda",
    .open = forgetful_open,
    .describe = forgetful_describe,
    .close = forgetful_close,
    .mem_alloc = forgetful_mem_alloc,
    .mem_free = forgetful_mem_free,
    .host_register = forgetful_host_register,
    .host_unregister = forgetful_host_unregister,
    .memory = forgetful_memory,
    .synchronize = forgetful_synchronize,
    .xfer = forgetful_xfer,
    .xfer_async = forgetful_xfer_async,
    .native_release = forgetful_native_release,
    .peer_possible = forgetful_peer_possible,
    .peer_enable = forgetful_peer_enable,
};

/* The fake's own counters exist only in the fake: cases that need them
 * skip on anything else. */
static void require_fake(void) {
  const char *path = getenv("UNIMEM_CUDA_LIBRARY");
  void *library;
  if (path == NULL || path[0] == '\0')
    skip("UNIMEM_CUDA_LIBRARY must name libfakecuda_full.so for this case");
  library = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (library == NULL)
    skip("UNIMEM_CUDA_LIBRARY cannot be loaded");
  {
    /* POSIX: a dlsym() address converts to a function pointer. */
    void *address = dlsym(library, "fake_cuda_count");
    memcpy(&fake_count, &address, sizeof(fake_count));
    address = dlsym(library, "fake_cuda_forget_current");
    memcpy(&fake_forget_current, &address, sizeof(fake_forget_current));
    address = dlsym(library, "fake_cuda_current_context");
    memcpy(&fake_current_context, &address, sizeof(fake_current_context));
  }
  if (fake_count == NULL || fake_forget_current == NULL ||
      fake_current_context == NULL)
    skip("UNIMEM_CUDA_LIBRARY is not libfakecuda_full.so");
  backend = &forgetful_backend;
}

/* ------------------------------------------------------------------------ */
/* Completions of asynchronous transfers                                     */

typedef struct completion {
  pthread_mutex_t lock;
  pthread_cond_t finished;
  int calls;
  int status;
} completion;

static void completion_init(completion *c) {
  pthread_mutex_init(&c->lock, NULL);
  pthread_cond_init(&c->finished, NULL);
  c->calls = 0;
  c->status = 1; /* not a UM_* code */
}

static void completion_destroy(completion *c) {
  pthread_mutex_destroy(&c->lock);
  pthread_cond_destroy(&c->finished);
}

/* The um__done_fn: records, as the core's does, and nothing else. */
static void on_done(void *arg, int status) {
  completion *c = arg;
  pthread_mutex_lock(&c->lock);
  c->calls++;
  c->status = status;
  pthread_cond_broadcast(&c->finished);
  pthread_mutex_unlock(&c->lock);
}

/* The transfer's status once done was called; fails after 10 s. */
static int completion_wait(completion *c) {
  struct timespec deadline;
  int status;
  clock_gettime(CLOCK_REALTIME, &deadline);
  deadline.tv_sec += 10;
  pthread_mutex_lock(&c->lock);
  while (c->calls == 0)
    if (pthread_cond_timedwait(&c->finished, &c->lock, &deadline) ==
        ETIMEDOUT)
      break;
  CHECK(c->calls == 1);
  status = c->status;
  pthread_mutex_unlock(&c->lock);
  return status;
}

/* ------------------------------------------------------------------------ */
/* Transfers                                                                 */

static um__xfer h2d(um__mem *dst, size_t dst_off, const void *host,
                    size_t bytes, int host_pinned) {
  um__xfer x = {0};
  x.kind = UM__XFER_H2D;
  x.dst = dst;
  x.dst_loc = UM_DEVICE;
  x.dst_off = dst_off;
  x.host = (void *)host;
  x.host_pinned = host_pinned;
  x.bytes = bytes;
  return x;
}

static um__xfer d2h(void *host, um__mem *src, size_t src_off, size_t bytes) {
  um__xfer x = {0};
  x.kind = UM__XFER_D2H;
  x.src = src;
  x.src_loc = UM_DEVICE;
  x.src_off = src_off;
  x.host = host;
  x.bytes = bytes;
  return x;
}

static um__xfer d2d(um__mem *dst, size_t dst_off, um__mem *src,
                    size_t src_off, size_t bytes) {
  um__xfer x = {0};
  x.kind = UM__XFER_D2D;
  x.dst = dst;
  x.dst_loc = UM_DEVICE;
  x.dst_off = dst_off;
  x.src = src;
  x.src_loc = UM_DEVICE;
  x.src_off = src_off;
  x.bytes = bytes;
  return x;
}

static um__xfer fill(um__mem *dst, size_t dst_off, unsigned char value,
                     size_t bytes) {
  um__xfer x = {0};
  x.kind = UM__XFER_FILL;
  x.dst = dst;
  x.dst_loc = UM_DEVICE;
  x.dst_off = dst_off;
  x.value = value;
  x.bytes = bytes;
  return x;
}

static void pattern(unsigned char *p, size_t bytes, unsigned seed) {
  for (size_t i = 0; i < bytes; i++)
    p[i] = (unsigned char)((i * 131u + seed * 7u + (i >> 8)) & 0xFF);
}

static int matches_pattern(const unsigned char *p, size_t bytes,
                           size_t pattern_off, unsigned seed) {
  unsigned char *want = malloc(pattern_off + bytes);
  int same;
  CHECK(want != NULL);
  pattern(want, pattern_off + bytes, seed);
  same = memcmp(p, want + pattern_off, bytes) == 0;
  free(want);
  return same;
}

static int all_bytes(const unsigned char *p, size_t bytes, unsigned char v) {
  for (size_t i = 0; i < bytes; i++)
    if (p[i] != v)
      return 0;
  return 1;
}

/* One asynchronous transfer: issue after the given tokens. */
static void *issue_async(void *bdev, um__xfer x, void *const *after,
                         int nafter, completion *c) {
  void *native = NULL;
  CHECK_STATUS(backend->xfer_async(bdev, &x, after, nafter, on_done, c,
                                   &native),
               UM_OK);
  CHECK(native != NULL);
  return native;
}

/* Everything a device offers, byte-checked. Safe to run on several threads
 * at once on one device: it uses only its own blocks. */
static void exercise_device(void *bdev, unsigned locations, unsigned seed) {
  const size_t n = MIB + 13; /* odd: no alignment luck */
  um__mem a = {0}, b = {0}, pinned = {0}, unified = {0}, registered = {0};
  unsigned char *src = malloc(n), *dst = malloc(n), *dst2 = malloc(n);
  unsigned char *user = malloc(n);
  completion done[5];
  void *tokens[5];
  um__xfer x;
  int i;

  CHECK(src != NULL && dst != NULL && dst2 != NULL && user != NULL);
  pattern(src, n, seed);

  CHECK_STATUS(backend->mem_alloc(bdev, UM_DEVICE, n, &a), UM_OK);
  CHECK_STATUS(backend->mem_alloc(bdev, UM_DEVICE, n, &b), UM_OK);
  CHECK(a.host == NULL && a.handle != 0);
  CHECK(b.host == NULL && b.handle != 0 && b.handle != a.handle);
  CHECK_STATUS(backend->mem_alloc(bdev, UM_PINNED, n, &pinned), UM_OK);
  CHECK(pinned.host != NULL);
  CHECK_STATUS(backend->mem_alloc(bdev, UM_HOST, n, &unified), UM_ENOTSUP);

  /* Blocking round trip from pageable memory. */
  x = h2d(&a, 0, src, n, 0);
  CHECK_STATUS(backend->xfer(bdev, &x), UM_OK);
  memset(dst, 0, n);
  x = d2h(dst, &a, 0, n);
  CHECK_STATUS(backend->xfer(bdev, &x), UM_OK);
  CHECK(memcmp(dst, src, n) == 0);

  /* D2D at offsets, then a fill inside it. */
  x = d2d(&b, 3, &a, 7, n - 10);
  CHECK_STATUS(backend->xfer(bdev, &x), UM_OK);
  x = fill(&b, 100, 0x5C, 5000);
  CHECK_STATUS(backend->xfer(bdev, &x), UM_OK);
  x = d2h(dst, &b, 3, n - 10);
  CHECK_STATUS(backend->xfer(bdev, &x), UM_OK);
  CHECK(matches_pattern(dst, 97, 7, seed));
  CHECK(all_bytes(dst + 97, 5000, 0x5C));
  CHECK(matches_pattern(dst + 5097, n - 10 - 5097, 7 + 5097, seed));

  /* Direct DMA from and to this device's PINNED memory. */
  pattern(pinned.host, n, seed + 1);
  x = h2d(&a, 0, pinned.host, n, 1);
  CHECK_STATUS(backend->xfer(bdev, &x), UM_OK);
  memset(pinned.host, 0, n);
  x = d2h(pinned.host, &a, 0, n);
  CHECK_STATUS(backend->xfer(bdev, &x), UM_OK);
  CHECK(matches_pattern(pinned.host, n, 0, seed + 1));

  /* UNIFIED: the host writes, the device reads through its handle. */
  if (locations & (1u << UM_UNIFIED)) {
    CHECK_STATUS(backend->mem_alloc(bdev, UM_UNIFIED, n, &unified), UM_OK);
    CHECK(unified.host != NULL && unified.handle == (uintptr_t)unified.host);
    pattern(unified.host, n, seed + 2);
    CHECK_STATUS(backend->synchronize(bdev), UM_OK);
    x = d2d(&a, 0, &unified, 0, n);
    CHECK_STATUS(backend->xfer(bdev, &x), UM_OK);
    x = d2h(dst, &a, 0, n);
    CHECK_STATUS(backend->xfer(bdev, &x), UM_OK);
    CHECK(matches_pattern(dst, n, 0, seed + 2));
    backend->mem_free(bdev, UM_UNIFIED, n, &unified);
  } else {
    CHECK_STATUS(backend->mem_alloc(bdev, UM_UNIFIED, n, &unified),
                 UM_ENOTSUP);
  }

  /* Caller memory registered for DMA. */
  pattern(user, n, seed + 3);
  CHECK_STATUS(backend->host_register(bdev, user, n, &registered), UM_OK);
  CHECK(registered.host == user);
  x = h2d(&b, 0, user, n, 1);
  CHECK_STATUS(backend->xfer(bdev, &x), UM_OK);
  backend->host_unregister(bdev, &registered);
  x = d2h(dst, &b, 0, n);
  CHECK_STATUS(backend->xfer(bdev, &x), UM_OK);
  CHECK(matches_pattern(dst, n, 0, seed + 3));

  /* An asynchronous chain across the three streams, ordered only by the
   * tokens: upload to a; copy a to b; fill a; download b; download a. */
  for (i = 0; i < 5; i++)
    completion_init(&done[i]);
  pattern(src, n, seed + 4);
  memset(dst, 0, n);
  memset(dst2, 0, n);
  tokens[0] = issue_async(bdev, h2d(&a, 0, src, n, 0), NULL, 0, &done[0]);
  tokens[1] = issue_async(bdev, d2d(&b, 0, &a, 0, n), &tokens[0], 1, &done[1]);
  tokens[2] = issue_async(bdev, fill(&a, 1, 0xE7, n - 2), &tokens[1], 1,
                          &done[2]);
  tokens[3] = issue_async(bdev, d2h(dst, &b, 0, n), &tokens[1], 1, &done[3]);
  {
    void *const after[2] = {tokens[2], tokens[3]};
    tokens[4] = issue_async(bdev, d2h(dst2, &a, 0, n), after, 2, &done[4]);
  }
  /* Release some tokens at once, while their transfers may still run, and
   * the rest after waiting. */
  backend->native_release(bdev, tokens[0]);
  backend->native_release(bdev, tokens[2]);
  for (i = 0; i < 5; i++)
    CHECK_STATUS(completion_wait(&done[i]), UM_OK);
  backend->native_release(bdev, tokens[1]);
  backend->native_release(bdev, tokens[3]);
  backend->native_release(bdev, tokens[4]);
  CHECK(memcmp(dst, src, n) == 0);
  CHECK(dst2[0] == src[0] && dst2[n - 1] == src[n - 1]);
  CHECK(all_bytes(dst2 + 1, n - 2, 0xE7));
  for (i = 0; i < 5; i++)
    completion_destroy(&done[i]);

  CHECK_STATUS(backend->synchronize(bdev), UM_OK);
  backend->mem_free(bdev, UM_DEVICE, n, &a);
  backend->mem_free(bdev, UM_DEVICE, n, &b);
  backend->mem_free(bdev, UM_PINNED, n, &pinned);
  free(src);
  free(dst);
  free(dst2);
  free(user);
}

typedef struct exercise_job {
  void *bdev;
  unsigned locations;
  unsigned seed;
} exercise_job;

static void *exercise_thread(void *arg) {
  const exercise_job *job = arg;
  exercise_device(job->bdev, job->locations, job->seed);
  return NULL;
}

/* ------------------------------------------------------------------------ */
/* Opening                                                                   */

typedef struct opened {
  void *ctx;
  int count;
  um__bdev_desc desc[4];
} opened;

static void open_backend(const um_options *opts, opened *o) {
  int i;
  memset(o, 0, sizeof(*o));
  CHECK_STATUS(backend->open(opts, &o->ctx, &o->count), UM_OK);
  CHECK(o->count >= 0);
  for (i = 0; i < o->count && i < 4; i++)
    CHECK_STATUS(backend->describe(o->ctx, i, &o->desc[i]), UM_OK);
}

static void default_options(um_options *opts) {
  memset(opts, 0, sizeof(*opts));
  opts->log_level = UM_LOG_WARN;
}

/* After close: the fake holds nothing unimem made, and no callback called
 * into the driver. */
static void check_fake_released(void) {
  CHECK(fake_count("allocations") == 0);
  CHECK(fake_count("streams") == 0);
  CHECK(fake_count("events") == 0);
  CHECK(fake_count("context_retains") == 0);
  CHECK(fake_count("calls_in_callbacks") == 0);
}

/* ------------------------------------------------------------------------ */
/* Cases                                                                     */

static int case_nolib(void) {
  const char *path = getenv("UNIMEM_CUDA_LIBRARY");
  void *ctx = NULL;
  int count = -1;
  um_options opts;

  if (path == NULL || path[0] == '\0') {
    path = "/nonexistent/libcuda.so.1";
    set_env("UNIMEM_CUDA_LIBRARY", path);
  }
  default_options(&opts);
  CHECK_STATUS(backend->open(&opts, &ctx, &count), UM_ENODEV);
  CHECK_TEXT(path);
  CHECK(count == -1 && ctx == NULL);
  /* The verdict is remembered, not retried. */
  CHECK_STATUS(backend->open(&opts, &ctx, &count), UM_ENODEV);
  CHECK_TEXT(path);
  return 0;
}

static int case_missing(void) {
  const char *path = getenv("UNIMEM_CUDA_LIBRARY");
  void *ctx = NULL;
  int count = -1;
  um_options opts;

  if (path == NULL || strstr(path, "missing") == NULL)
    skip("UNIMEM_CUDA_LIBRARY must name libfakecuda_missing.so");
  default_options(&opts);
  CHECK_STATUS(backend->open(&opts, &ctx, &count), UM_ENODEV);
  CHECK_TEXT("entry point cuMemAlloc_v2 missing");
  CHECK_TEXT(path);
  return 0;
}

static int case_stub(void) {
  const char *path = getenv("UNIMEM_CUDA_LIBRARY");
  void *ctx = NULL;
  int count = -1;
  um_options opts;

  if (path == NULL || strstr(path, "stubs") == NULL)
    skip("UNIMEM_CUDA_LIBRARY must name the toolkit's stubs/libcuda.so");
  default_options(&opts);
  CHECK_STATUS(backend->open(&opts, &ctx, &count), UM_ENODEV);
  CHECK_TEXT("cuInit");
  return 0;
}

static int case_nodevice(void) {
  opened o;
  um_options opts;

  require_fake();
  set_env("FAKE_CUDA_NO_DEVICE", "1");
  default_options(&opts);
  open_backend(&opts, &o);
  CHECK(o.count == 0);
  CHECK_TEXT("CUDA_ERROR_NO_DEVICE");
  backend->close(o.ctx);
  return 0;
}

static int case_full(int threaded) {
  enum { THREADS = 4 };
  opened o;
  um_options opts;
  uint64_t free_bytes = 0, total_bytes = 0;
  um__mem block;
  pthread_t threads[THREADS];
  exercise_job jobs[THREADS];
  int i;

  require_fake();
  if (threaded) {
    set_env("FAKE_CUDA_STREAM_THREADS", "1");
    set_env("FAKE_CUDA_OP_DELAY_US", "300");
  }
  default_options(&opts);
  open_backend(&opts, &o);
  CHECK(o.count == 1);
  CHECK(strcmp(o.desc[0].name, "Fake CUDA Device 0") == 0);
  CHECK(o.desc[0].caps == (UM_CAP_PINNED | UM_CAP_ASYNC | UM_CAP_UNIFIED));
  CHECK(o.desc[0].locations ==
        ((1u << UM_DEVICE) | (1u << UM_PINNED) | (1u << UM_UNIFIED)));
  CHECK(o.desc[0].total_bytes == 256 * MIB);
  CHECK(o.desc[0].bdev != NULL);
  CHECK_STATUS(backend->describe(o.ctx, 1, &o.desc[1]), UM_EINVAL);

  /* memory(): the fake's figures, exact. */
  CHECK_STATUS(backend->memory(o.desc[0].bdev, &free_bytes, &total_bytes),
               UM_OK);
  CHECK(total_bytes == 256 * MIB && free_bytes == 256 * MIB);
  CHECK_STATUS(backend->mem_alloc(o.desc[0].bdev, UM_DEVICE, 3 * MIB, &block),
               UM_OK);
  CHECK_STATUS(backend->memory(o.desc[0].bdev, &free_bytes, &total_bytes),
               UM_OK);
  CHECK(total_bytes == 256 * MIB && free_bytes == 253 * MIB);
  backend->mem_free(o.desc[0].bdev, UM_DEVICE, 3 * MIB, &block);

  exercise_device(o.desc[0].bdev, o.desc[0].locations, 1);

  /* Threads that never set a context: the backend must, on every call. */
  for (i = 0; i < THREADS; i++) {
    jobs[i].bdev = o.desc[0].bdev;
    jobs[i].locations = o.desc[0].locations;
    jobs[i].seed = 10u + (unsigned)i;
    CHECK(pthread_create(&threads[i], NULL, exercise_thread, &jobs[i]) == 0);
  }
  for (i = 0; i < THREADS; i++)
    CHECK(pthread_join(threads[i], NULL) == 0);

  /* Transfers are reported by the backend's stream watchers, not by stream
   * callbacks (a callback holds its stream until it ran on the host). */
  CHECK(fake_count("callbacks_run") == 0);
  backend->close(o.ctx);
  check_fake_released();
  return 0;
}

/* device_limit_bytes: the device is described with the limit as its
 * total; the core (block.c) counts the bytes and refuses past the limit,
 * not the backend (test_fakecuda_api). */
static int case_limit(void) {
  opened o;
  um_options opts;
  um__mem device_a;
  void *bdev;

  require_fake();
  default_options(&opts);
  opts.device_limit_bytes = 4 * MIB;
  open_backend(&opts, &o);
  bdev = o.desc[0].bdev;
  CHECK(o.desc[0].total_bytes == 4 * MIB);
  CHECK_STATUS(backend->mem_alloc(bdev, UM_DEVICE, 5 * MIB, &device_a), UM_OK);
  backend->mem_free(bdev, UM_DEVICE, 5 * MIB, &device_a);
  backend->close(o.ctx);
  check_fake_released();
  return 0;
}

static int case_errors(void) {
  opened o;
  um_options opts;
  um__mem a, b, untouched;
  unsigned char host[4096];
  completion done;
  void *native = &untouched;
  void *bdev;
  long events_before;
  um__xfer x;

  require_fake();
  set_env("FAKE_CUDA_TOTAL_MEM", "8388608");
  /* Late completions: a failed xfer_async must still leave nothing queued
   * that reads the caller's memory. */
  set_env("FAKE_CUDA_STREAM_THREADS", "1");
  set_env("FAKE_CUDA_OP_DELAY_US", "2000");
  default_options(&opts);
  open_backend(&opts, &o);
  bdev = o.desc[0].bdev;
  memset(host, 0x11, sizeof(host));

  /* The driver's out-of-memory. */
  CHECK_STATUS(backend->mem_alloc(bdev, UM_DEVICE, 16 * MIB, &a), UM_ENOMEM);
  CHECK_TEXT("cuMemAlloc_v2");
  CHECK_TEXT("CUDA_ERROR_OUT_OF_MEMORY");
  CHECK_STATUS(backend->mem_alloc(bdev, UM_DEVICE, 4096, &a), UM_OK);
  CHECK_STATUS(backend->mem_alloc(bdev, UM_DEVICE, 4096, &b), UM_OK);

  /* Each class of driver code. */
  set_env("FAKE_CUDA_FAIL", "cuMemHostAlloc");
  set_env("FAKE_CUDA_FAIL_CODE", "1"); /* CUDA_ERROR_INVALID_VALUE */
  CHECK_STATUS(backend->mem_alloc(bdev, UM_PINNED, 4096, &untouched),
               UM_EINVAL);
  CHECK_TEXT("cuMemHostAlloc failed: CUDA_ERROR_INVALID_VALUE");
  set_env("FAKE_CUDA_FAIL", "cuMemAllocManaged");
  set_env("FAKE_CUDA_FAIL_CODE", "801"); /* CUDA_ERROR_NOT_SUPPORTED */
  CHECK_STATUS(backend->mem_alloc(bdev, UM_UNIFIED, 4096, &untouched),
               UM_ENOTSUP);
  CHECK_TEXT("CUDA_ERROR_NOT_SUPPORTED");
  set_env("FAKE_CUDA_FAIL", "cuMemGetInfo_v2");
  set_env("FAKE_CUDA_FAIL_CODE", "101"); /* CUDA_ERROR_INVALID_DEVICE */
  CHECK_STATUS(backend->memory(bdev, NULL, NULL), UM_ENODEV);
  CHECK_TEXT("cuMemGetInfo_v2");
  set_env("FAKE_CUDA_FAIL", "cuCtxSynchronize");
  set_env("FAKE_CUDA_FAIL_CODE", "12345"); /* no name known */
  CHECK_STATUS(backend->synchronize(bdev), UM_EBACKEND);
  CHECK_TEXT("CUresult 12345");
  unsetenv("FAKE_CUDA_FAIL_CODE");

  /* A copy the driver refuses, blocking and asynchronous: the async one
   * neither calls done nor touches *native. */
  set_env("FAKE_CUDA_FAIL", "cuMemcpyHtoDAsync_v2");
  x = h2d(&a, 0, host, sizeof(host), 0);
  CHECK_STATUS(backend->xfer(bdev, &x), UM_EBACKEND);
  CHECK_TEXT("cuMemcpyHtoDAsync_v2 failed: CUDA_ERROR_UNKNOWN");
  completion_init(&done);
  events_before = fake_count("events");
  CHECK_STATUS(backend->xfer_async(bdev, &x, NULL, 0, on_done, &done, &native),
               UM_EBACKEND);
  CHECK(native == &untouched);
  /* Failing after the copy was queued: nothing leaks either. */
  set_env("FAKE_CUDA_FAIL", "cuEventRecord");
  CHECK_STATUS(backend->xfer_async(bdev, &x, NULL, 0, on_done, &done, &native),
               UM_EBACKEND);
  CHECK_TEXT("cuEventRecord");
  CHECK(native == &untouched);
  CHECK(fake_count("queued_ops") == 0);
  CHECK_STATUS(backend->synchronize(bdev), UM_OK);
  CHECK(done.calls == 0);
  /* The two failed transfers' event: one, kept as the device's spare (the
   * second took the first's), and destroyed at close (check_fake_released);
   * a leak per failure would make two. */
  CHECK(fake_count("events") - events_before <= 1);
  unsetenv("FAKE_CUDA_FAIL");
  completion_destroy(&done);

  /* A fault on the device: the transfer is accepted, and its completion
   * carries the failure. */
  set_env("FAKE_CUDA_DEVICE_FAULT", "cuMemcpyDtoDAsync_v2");
  completion_init(&done);
  native = issue_async(bdev, d2d(&b, 0, &a, 0, 4096), NULL, 0, &done);
  CHECK_STATUS(completion_wait(&done), UM_EBACKEND);
  backend->native_release(bdev, native);
  completion_destroy(&done);
  unsetenv("FAKE_CUDA_DEVICE_FAULT");

  backend->mem_free(bdev, UM_DEVICE, 4096, &a);
  backend->mem_free(bdev, UM_DEVICE, 4096, &b);
  backend->close(o.ctx);
  check_fake_released();
  return 0;
}

static int case_nomanaged(void) {
  opened o;
  um_options opts;
  um__mem block;

  require_fake();
  set_env("FAKE_CUDA_NO_MANAGED", "1");
  default_options(&opts);
  open_backend(&opts, &o);
  CHECK(o.count == 1);
  CHECK(!(o.desc[0].caps & UM_CAP_UNIFIED));
  CHECK(o.desc[0].locations == ((1u << UM_DEVICE) | (1u << UM_PINNED)));
  CHECK_STATUS(backend->mem_alloc(o.desc[0].bdev, UM_UNIFIED, 64, &block),
               UM_ENOTSUP);
  exercise_device(o.desc[0].bdev, o.desc[0].locations, 3);
  backend->close(o.ctx);
  check_fake_released();
  return 0;
}

static int case_asyncalloc(void) {
  opened o;
  um_options opts;

  require_fake();
  set_env("UNIMEM_CUDA_ASYNC_ALLOC", "1");
  set_env("FAKE_CUDA_STREAM_THREADS", "1");
  default_options(&opts);
  open_backend(&opts, &o);
  exercise_device(o.desc[0].bdev, o.desc[0].locations, 4);
  /* Two DEVICE blocks per exercise, both stream-ordered. */
  CHECK(fake_count("stream_ordered_allocs") == 2);
  CHECK(fake_count("pool_release_threshold_max") == 1);
  backend->close(o.ctx);
  check_fake_released();
  return 0;
}

static int case_peer(void) {
  const size_t n = 64 * 1024 + 5;
  opened o;
  um_options opts;
  um__mem on0, on1;
  unsigned char *src = malloc(n), *dst = malloc(n);
  completion done;
  void *native;
  um__xfer x = {0};

  CHECK(src != NULL && dst != NULL);
  require_fake();
  set_env("FAKE_CUDA_DEVICE_COUNT", "2");
  default_options(&opts);
  open_backend(&opts, &o);
  CHECK(o.count == 2);
  CHECK(o.desc[0].caps & UM_CAP_PEER);
  CHECK(o.desc[1].caps & UM_CAP_PEER);
  CHECK(strcmp(o.desc[1].name, "Fake CUDA Device 1") == 0);
  CHECK(backend->peer_possible(o.desc[0].bdev, o.desc[1].bdev) == 1);
  CHECK_STATUS(backend->peer_enable(o.desc[0].bdev, o.desc[1].bdev), UM_OK);
  /* Already enabled is success. */
  CHECK_STATUS(backend->peer_enable(o.desc[0].bdev, o.desc[1].bdev), UM_OK);

  CHECK_STATUS(backend->mem_alloc(o.desc[0].bdev, UM_DEVICE, n, &on0), UM_OK);
  CHECK_STATUS(backend->mem_alloc(o.desc[1].bdev, UM_DEVICE, n, &on1), UM_OK);
  pattern(src, n, 9);
  x = h2d(&on1, 0, src, n, 0);
  CHECK_STATUS(backend->xfer(o.desc[1].bdev, &x), UM_OK);

  /* Device 1 -> device 0, called on the destination's device. */
  memset(&x, 0, sizeof(x));
  x.kind = UM__XFER_PEER;
  x.dst = &on0;
  x.dst_loc = UM_DEVICE;
  x.src = &on1;
  x.src_loc = UM_DEVICE;
  x.bytes = n;
  x.src_bdev = o.desc[1].bdev;
  CHECK_STATUS(backend->xfer(o.desc[0].bdev, &x), UM_OK);
  memset(dst, 0, n);
  {
    um__xfer back = d2h(dst, &on0, 0, n);
    CHECK_STATUS(backend->xfer(o.desc[0].bdev, &back), UM_OK);
  }
  CHECK(memcmp(dst, src, n) == 0);

  /* And asynchronously, at offsets. */
  completion_init(&done);
  x.dst_off = 11;
  x.src_off = 0;
  x.bytes = n - 11;
  native = issue_async(o.desc[0].bdev, x, NULL, 0, &done);
  CHECK_STATUS(completion_wait(&done), UM_OK);
  backend->native_release(o.desc[0].bdev, native);
  completion_destroy(&done);
  {
    um__xfer back = d2h(dst, &on0, 11, n - 11);
    CHECK_STATUS(backend->xfer(o.desc[0].bdev, &back), UM_OK);
  }
  CHECK(memcmp(dst, src, n - 11) == 0);

  backend->mem_free(o.desc[0].bdev, UM_DEVICE, n, &on0);
  backend->mem_free(o.desc[1].bdev, UM_DEVICE, n, &on1);
  backend->close(o.ctx);
  check_fake_released();
  free(src);
  free(dst);
  return 0;
}

/* The real driver: everything the fake cases check that a GPU can show. */
static int case_real(void) {
  opened o;
  um_options opts;
  uint64_t free_bytes = 0, total_bytes = 0;
  char reason[600];
  int i;

  default_options(&opts);
  memset(&o, 0, sizeof(o));
  i = backend->open(&opts, &o.ctx, &o.count);
  if (i == UM_ENODEV) {
    snprintf(reason, sizeof(reason), "no CUDA driver: %s", um_last_error());
    skip(reason);
  }
  CHECK_STATUS(i, UM_OK);
  if (o.count == 0) {
    snprintf(reason, sizeof(reason), "no CUDA device: %s", um_last_error());
    skip(reason);
  }
  for (i = 0; i < o.count && i < 4; i++) {
    CHECK_STATUS(backend->describe(o.ctx, i, &o.desc[i]), UM_OK);
    printf("cuda device %d: %s, %llu bytes, caps 0x%x, locations 0x%x\n", i,
           o.desc[i].name, (unsigned long long)o.desc[i].total_bytes,
           o.desc[i].caps, o.desc[i].locations);
    CHECK(o.desc[i].total_bytes > 0);
    CHECK(!(o.desc[i].locations & (1u << UM_HOST)));
    CHECK_STATUS(backend->memory(o.desc[i].bdev, &free_bytes, &total_bytes),
                 UM_OK);
    CHECK(free_bytes <= total_bytes && total_bytes > 0);
    exercise_device(o.desc[i].bdev, o.desc[i].locations, (unsigned)i);
  }
  backend->close(o.ctx);
  return 0;
}

int main(int argc, char **argv) {
  const char *name = argc > 1 ? argv[1] : "";

  if (strcmp(name, "nolib") == 0)
    return case_nolib();
  if (strcmp(name, "missing") == 0)
    return case_missing();
  if (strcmp(name, "stub") == 0)
    return case_stub();
  if (strcmp(name, "nodevice") == 0)
    return case_nodevice();
  if (strcmp(name, "full") == 0)
    return case_full(0);
  if (strcmp(name, "full_threaded") == 0)
    return case_full(1);
  if (strcmp(name, "limit") == 0)
    return case_limit();
  if (strcmp(name, "errors") == 0)
    return case_errors();
  if (strcmp(name, "nomanaged") == 0)
    return case_nomanaged();
  if (strcmp(name, "asyncalloc") == 0)
    return case_asyncalloc();
  if (strcmp(name, "peer") == 0)
    return case_peer();
  if (strcmp(name, "real") == 0)
    return case_real();
  fprintf(stderr,
          "usage: %s nolib|missing|stub|nodevice|full|full_threaded|limit|"
          "errors|nomanaged|asyncalloc|peer|real\n",
          argv[0]);
  return 2;
}
