/* Drives the OpenCL backend's table directly, without the core: discovery,
 * every location, blocking and asynchronous transfers with byte checks,
 * ordering through after[] tokens, map/unmap, peer copies, the memory
 * limits, and a missing library.
 *
 * Exit status: 0 pass, 1 failure, 77 skipped (no OpenCL here).
 * Two devices (for the peer tests): POCL_DEVICES="pthread pthread". */
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"

#define EXIT_SKIP 77
#define MAX_DEVICES 16

static const um__backend *const backend = &um__backend_opencl;
static int failures;
static int checks;

#define CHECK(cond)                                                            \
  do {                                                                         \
    checks++;                                                                  \
    if (!(cond)) {                                                             \
      failures++;                                                              \
      fprintf(stderr, "FAIL %s:%d: %s (last error: %s)\n", __FILE__,          \
              __LINE__, #cond, um_last_error());                               \
    }                                                                          \
  } while (0)

#define CHECK_STATUS(expr, expected)                                           \
  do {                                                                         \
    int got_ = (expr);                                                         \
    checks++;                                                                  \
    if (got_ != (expected)) {                                                  \
      failures++;                                                              \
      fprintf(stderr, "FAIL %s:%d: %s = %s, expected %s (last error: %s)\n",  \
              __FILE__, __LINE__, #expr, um_err_name(got_),                    \
              um_err_name(expected), um_last_error());                         \
    }                                                                          \
  } while (0)

static um_options test_options(uint64_t device_limit_bytes) {
  um_options opts;
  memset(&opts, 0, sizeof(opts));
  opts.log_level = UM_LOG_WARN;
  opts.device_limit_bytes = device_limit_bytes;
  return opts;
}

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

/* Deterministic bytes, different per seed and position. */
static void fill_pattern(unsigned char *p, size_t n, unsigned seed) {
  size_t i;
  for (i = 0; i < n; i++)
    p[i] = (unsigned char)((i * 131u + seed * 7u + (i >> 8)) & 0xffu);
}

/* ------------------------------------------------------------------------ */
/* Asynchronous completions                                                  */

typedef struct completion {
  pthread_mutex_t lock;
  pthread_cond_t changed;
  int calls;
  int status;
  pthread_t issuer;
  int issue_returned;  /* set by the issuer once xfer_async returned */
  int called_early;    /* done ran before xfer_async returned */
  int on_issuer_thread;
} completion;

static void completion_init(completion *c) {
  pthread_mutex_init(&c->lock, NULL);
  pthread_cond_init(&c->changed, NULL);
  c->calls = 0;
  c->status = 1;
  c->issuer = pthread_self();
  c->issue_returned = 0;
  c->called_early = 0;
  c->on_issuer_thread = 0;
}

static void completion_destroy(completion *c) {
  pthread_mutex_destroy(&c->lock);
  pthread_cond_destroy(&c->changed);
}

static void on_done(void *arg, int status) {
  completion *c = arg;
  pthread_mutex_lock(&c->lock);
  c->calls++;
  c->status = status;
  c->called_early = !c->issue_returned;
  c->on_issuer_thread = pthread_equal(pthread_self(), c->issuer);
  pthread_cond_broadcast(&c->changed);
  pthread_mutex_unlock(&c->lock);
}

static void mark_issued(completion *c) {
  pthread_mutex_lock(&c->lock);
  c->issue_returned = 1;
  pthread_mutex_unlock(&c->lock);
}

/* Wait up to 10 s for done; returns its status, or UM_EAGAIN on timeout. */
static int completion_wait(completion *c) {
  struct timespec deadline;
  int status;
  clock_gettime(CLOCK_REALTIME, &deadline);
  deadline.tv_sec += 10;
  pthread_mutex_lock(&c->lock);
  while (c->calls == 0)
    if (pthread_cond_timedwait(&c->changed, &c->lock, &deadline) != 0)
      break;
  status = c->calls == 0 ? UM_EAGAIN : c->status;
  pthread_mutex_unlock(&c->lock);
  return status;
}

static int completion_calls(completion *c) {
  int calls;
  pthread_mutex_lock(&c->lock);
  calls = c->calls;
  pthread_mutex_unlock(&c->lock);
  return calls;
}

/* Statistics on where done ran, for the report. */
static int async_total, async_early, async_on_issuer;

static void note_thread(completion *c) {
  pthread_mutex_lock(&c->lock);
  async_total++;
  async_early += c->called_early;
  async_on_issuer += c->on_issuer_thread;
  pthread_mutex_unlock(&c->lock);
}

/* Issue x asynchronously; UM_OK and *token on success. */
static int issue_async(void *bdev, const um__xfer *x, void *const *after,
                       int nafter, completion *c, void **token) {
  int status;
  completion_init(c);
  status = backend->xfer_async(bdev, x, after, nafter, on_done, c, token);
  mark_issued(c);
  return status;
}

/* ------------------------------------------------------------------------ */
/* Transfers                                                                 */

static um__xfer h2d(um__mem *dst, size_t off, const void *host, size_t n,
                    int pinned) {
  um__xfer x;
  memset(&x, 0, sizeof(x));
  x.kind = UM__XFER_H2D;
  x.dst = dst;
  x.dst_loc = UM_DEVICE;
  x.dst_off = off;
  x.host = (void *)(uintptr_t)host;
  x.host_pinned = pinned;
  x.bytes = n;
  return x;
}

static um__xfer d2h(um__mem *src, size_t off, void *host, size_t n,
                    int pinned) {
  um__xfer x;
  memset(&x, 0, sizeof(x));
  x.kind = UM__XFER_D2H;
  x.src = src;
  x.src_loc = UM_DEVICE;
  x.src_off = off;
  x.host = host;
  x.host_pinned = pinned;
  x.bytes = n;
  return x;
}

static um__xfer d2d(um__mem *dst, size_t dst_off, um__mem *src, size_t src_off,
                    size_t n) {
  um__xfer x;
  memset(&x, 0, sizeof(x));
  x.kind = UM__XFER_D2D;
  x.dst = dst;
  x.dst_loc = UM_DEVICE;
  x.dst_off = dst_off;
  x.src = src;
  x.src_loc = UM_DEVICE;
  x.src_off = src_off;
  x.bytes = n;
  return x;
}

static um__xfer fill(um__mem *dst, size_t off, unsigned char value, size_t n) {
  um__xfer x;
  memset(&x, 0, sizeof(x));
  x.kind = UM__XFER_FILL;
  x.dst = dst;
  x.dst_loc = UM_DEVICE;
  x.dst_off = off;
  x.value = value;
  x.bytes = n;
  return x;
}

static um__xfer peer(um__mem *dst, um__mem *src, void *src_bdev, size_t n) {
  um__xfer x = d2d(dst, 0, src, 0, n);
  x.kind = UM__XFER_PEER;
  x.src_bdev = src_bdev;
  return x;
}

/* Read the whole block back and compare it with model. */
static int block_equals(void *bdev, um__mem *mem, const unsigned char *model,
                        size_t n) {
  unsigned char *back = malloc(n);
  um__xfer x = d2h(mem, 0, back, n, 0);
  int same;
  if (back == NULL)
    return 0;
  memset(back, 0x5a, n);
  same = backend->xfer(bdev, &x) == UM_OK && memcmp(back, model, n) == 0;
  free(back);
  return same;
}

/* ------------------------------------------------------------------------ */
/* Tests                                                                     */

/* UNIMEM_OPENCL_LIBRARY is read once per process, so each bad library is
 * tried in a child forked before this process loads OpenCL. */
static void test_missing_library(const char *library, const char *reason) {
  pid_t child;
  int wstatus = 0;
  fflush(NULL);
  child = fork();
  if (child == 0) {
    um_options opts = test_options(0);
    void *ctx = NULL;
    int count = -1;
    int status;
    setenv("UNIMEM_OPENCL_LIBRARY", library, 1);
    status = backend->open(&opts, &ctx, &count);
    printf("  UNIMEM_OPENCL_LIBRARY=%s: open() = %s (%s)\n", library,
           um_err_name(status), um_last_error());
    fflush(stdout);
    _exit(status == UM_ENODEV && strstr(um_last_error(), reason) != NULL &&
                  ctx == NULL && count == -1
              ? 0
              : 1);
  }
  CHECK(child > 0);
  if (child > 0) {
    CHECK(waitpid(child, &wstatus, 0) == child);
    CHECK(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0);
  }
}

static void test_describe(void *ctx, int count, um__bdev_desc *descs) {
  int i;
  for (i = 0; i < count; i++) {
    um__bdev_desc *d = &descs[i];
    uint64_t free_bytes = 0, total_bytes = 0;
    CHECK_STATUS(backend->describe(ctx, i, d), UM_OK);
    printf("  device %d: \"%s\" caps=%s%s%s%s locations=%s%s%s%s "
           "total=%llu MiB\n",
           i, d->name, d->caps & UM_CAP_PINNED ? "PINNED " : "",
           d->caps & UM_CAP_UNIFIED ? "UNIFIED " : "",
           d->caps & UM_CAP_PEER ? "PEER " : "",
           d->caps & UM_CAP_ASYNC ? "ASYNC" : "",
           d->locations & (1u << UM_HOST) ? "HOST " : "",
           d->locations & (1u << UM_DEVICE) ? "DEVICE " : "",
           d->locations & (1u << UM_PINNED) ? "PINNED " : "",
           d->locations & (1u << UM_UNIFIED) ? "UNIFIED" : "",
           (unsigned long long)(d->total_bytes >> 20));
    CHECK(d->name[0] != '\0');
    CHECK(d->bdev != NULL);
    CHECK((d->caps & (UM_CAP_PINNED | UM_CAP_ASYNC)) ==
          (UM_CAP_PINNED | UM_CAP_ASYNC));
    CHECK((d->locations & (1u << UM_HOST)) == 0);
    CHECK((d->locations & (1u << UM_DEVICE)) != 0);
    CHECK((d->locations & (1u << UM_PINNED)) != 0);
    CHECK(!(d->caps & UM_CAP_UNIFIED) == !(d->locations & (1u << UM_UNIFIED)));
    CHECK(d->total_bytes > 0);
    CHECK_STATUS(backend->memory(d->bdev, &free_bytes, &total_bytes), UM_OK);
    CHECK(total_bytes == d->total_bytes);
    CHECK(free_bytes == total_bytes);
  }
  CHECK_STATUS(backend->describe(ctx, count, &descs[0]), UM_EINVAL);
}

static void test_locations(const um__bdev_desc *d) {
  const size_t n = (1u << 20) + 3;
  uint64_t free0 = 0, free1 = 0, total = 0;
  um__mem mem;
  unsigned char *expect = malloc(n);
  CHECK(expect != NULL);
  if (expect == NULL)
    return;
  fill_pattern(expect, n, 3);

  CHECK_STATUS(backend->memory(d->bdev, &free0, &total), UM_OK);
  memset(&mem, 0, sizeof(mem));
  CHECK_STATUS(backend->mem_alloc(d->bdev, UM_DEVICE, n, &mem), UM_OK);
  CHECK(mem.host == NULL && mem.handle != 0);
  /* The backend does not count what it gives: the core takes the bytes
   * held off its figure (um_device_memory). */
  CHECK_STATUS(backend->memory(d->bdev, &free1, &total), UM_OK);
  CHECK(free1 == free0);
  backend->mem_free(d->bdev, UM_DEVICE, n, &mem);
  CHECK_STATUS(backend->memory(d->bdev, &free1, &total), UM_OK);
  CHECK(free1 == free0);

  memset(&mem, 0, sizeof(mem));
  CHECK_STATUS(backend->mem_alloc(d->bdev, UM_PINNED, n, &mem), UM_OK);
  CHECK(mem.host != NULL && mem.handle != 0);
  if (mem.host != NULL) {
    memcpy(mem.host, expect, n);
    CHECK(memcmp(mem.host, expect, n) == 0);
    backend->mem_free(d->bdev, UM_PINNED, n, &mem);
  }

  memset(&mem, 0, sizeof(mem));
  if (d->locations & (1u << UM_UNIFIED)) {
    CHECK_STATUS(backend->mem_alloc(d->bdev, UM_UNIFIED, n, &mem), UM_OK);
    CHECK(mem.host != NULL);
    if (mem.host != NULL) {
      memcpy(mem.host, expect, n);
      CHECK(memcmp(mem.host, expect, n) == 0);
      backend->mem_free(d->bdev, UM_UNIFIED, n, &mem);
    }
  } else {
    CHECK_STATUS(backend->mem_alloc(d->bdev, UM_UNIFIED, n, &mem),
                 UM_ENOTSUP);
    printf("  UNIFIED not offered: mem_alloc answers %s\n",
           um_last_error());
  }
  /* HOST belongs to the cpu backend. */
  CHECK_STATUS(backend->mem_alloc(d->bdev, UM_HOST, n, &mem), UM_ENOTSUP);

  /* Larger than CL_DEVICE_MAX_MEM_ALLOC_SIZE, which is at most the global
   * memory size. */
  CHECK_STATUS(backend->mem_alloc(d->bdev, UM_DEVICE,
                                  (size_t)d->total_bytes + 1, &mem),
               UM_ENOMEM);
  CHECK(strstr(um_last_error(), "CL_DEVICE_MAX_MEM_ALLOC_SIZE") != NULL);
  CHECK_STATUS(backend->mem_alloc(d->bdev, UM_PINNED, SIZE_MAX / 2, &mem),
               UM_ENOMEM);
  CHECK_STATUS(backend->memory(d->bdev, &free1, &total), UM_OK);
  CHECK(free1 == free0);
  free(expect);
}

/* Blocking transfers against a host model of the block's bytes. */
static void test_blocking(const um__bdev_desc *d) {
  const size_t n = (1u << 20) + 3;
  um__mem a, b, pinned;
  unsigned char *model_a = malloc(n), *model_b = malloc(n), *src = malloc(n);
  um__xfer x;
  memset(&a, 0, sizeof(a));
  memset(&b, 0, sizeof(b));
  memset(&pinned, 0, sizeof(pinned));
  CHECK(model_a != NULL && model_b != NULL && src != NULL);
  if (model_a == NULL || model_b == NULL || src == NULL)
    goto done;
  CHECK_STATUS(backend->mem_alloc(d->bdev, UM_DEVICE, n, &a), UM_OK);
  CHECK_STATUS(backend->mem_alloc(d->bdev, UM_DEVICE, n, &b), UM_OK);
  CHECK_STATUS(backend->mem_alloc(d->bdev, UM_PINNED, n, &pinned), UM_OK);
  if (a.handle == 0 || b.handle == 0 || pinned.host == NULL)
    goto done;

  /* whole block */
  fill_pattern(model_a, n, 1);
  x = h2d(&a, 0, model_a, n, 0);
  CHECK_STATUS(backend->xfer(d->bdev, &x), UM_OK);
  CHECK(block_equals(d->bdev, &a, model_a, n));

  /* odd offset and length */
  fill_pattern(src, n, 2);
  x = h2d(&a, 7, src, 1001, 0);
  CHECK_STATUS(backend->xfer(d->bdev, &x), UM_OK);
  memcpy(model_a + 7, src, 1001);
  CHECK(block_equals(d->bdev, &a, model_a, n));

  /* read back an odd window */
  {
    unsigned char window[4099];
    x = d2h(&a, 12345, window, sizeof(window), 0);
    CHECK_STATUS(backend->xfer(d->bdev, &x), UM_OK);
    CHECK(memcmp(window, model_a + 12345, sizeof(window)) == 0);
  }

  /* fill: odd offset, odd length, last byte included */
  x = fill(&a, 13, 0xa5, 999);
  CHECK_STATUS(backend->xfer(d->bdev, &x), UM_OK);
  memset(model_a + 13, 0xa5, 999);
  x = fill(&a, n - 3, 0x3c, 3);
  CHECK_STATUS(backend->xfer(d->bdev, &x), UM_OK);
  memset(model_a + n - 3, 0x3c, 3);
  CHECK(block_equals(d->bdev, &a, model_a, n));

  /* device to device, odd offsets, and inside one block without overlap */
  x = fill(&b, 0, 0, n);
  CHECK_STATUS(backend->xfer(d->bdev, &x), UM_OK);
  memset(model_b, 0, n);
  x = d2d(&b, 3, &a, 11, 65537);
  CHECK_STATUS(backend->xfer(d->bdev, &x), UM_OK);
  memcpy(model_b + 3, model_a + 11, 65537);
  CHECK(block_equals(d->bdev, &b, model_b, n));
  x = d2d(&a, 600001, &a, 1, 4097);
  CHECK_STATUS(backend->xfer(d->bdev, &x), UM_OK);
  memmove(model_a + 600001, model_a + 1, 4097);
  CHECK(block_equals(d->bdev, &a, model_a, n));

  /* through the pinned block's host view, as the core does */
  fill_pattern(pinned.host, n, 9);
  x = h2d(&b, 0, pinned.host, n, 1);
  CHECK_STATUS(backend->xfer(d->bdev, &x), UM_OK);
  memcpy(model_b, pinned.host, n);
  memset(pinned.host, 0, n);
  x = d2h(&b, 0, pinned.host, n, 1);
  CHECK_STATUS(backend->xfer(d->bdev, &x), UM_OK);
  CHECK(memcmp(pinned.host, model_b, n) == 0);

  /* a range past the block's end is the driver's CL_INVALID_VALUE */
  x = h2d(&a, n - 10, src, 11, 0);
  CHECK_STATUS(backend->xfer(d->bdev, &x), UM_EINVAL);
  CHECK(strstr(um_last_error(), "CL_INVALID_VALUE") != NULL);
  /* a block with a host view is not a transfer block */
  x = h2d(&pinned, 0, src, 16, 0);
  CHECK_STATUS(backend->xfer(d->bdev, &x), UM_EINVAL);

  CHECK_STATUS(backend->synchronize(d->bdev), UM_OK);

done:
  if (a.handle != 0)
    backend->mem_free(d->bdev, UM_DEVICE, n, &a);
  if (b.handle != 0)
    backend->mem_free(d->bdev, UM_DEVICE, n, &b);
  if (pinned.handle != 0)
    backend->mem_free(d->bdev, UM_PINNED, n, &pinned);
  free(model_a);
  free(model_b);
  free(src);
}

#define ORDERED_WRITES 24 /* more than the backend's inline wait list */

static void test_async(const um__bdev_desc *d) {
  const size_t n = 65536 + 5;
  um__mem a, b;
  unsigned char *model = malloc(n), *back = malloc(n);
  unsigned char *sources[ORDERED_WRITES];
  void *tokens[ORDERED_WRITES];
  completion writes[ORDERED_WRITES], c, c2;
  um__xfer x;
  void *token = NULL, *token2 = NULL;
  int i;

  memset(&a, 0, sizeof(a));
  memset(&b, 0, sizeof(b));
  memset(sources, 0, sizeof(sources));
  CHECK(model != NULL && back != NULL);
  CHECK_STATUS(backend->mem_alloc(d->bdev, UM_DEVICE, n, &a), UM_OK);
  CHECK_STATUS(backend->mem_alloc(d->bdev, UM_DEVICE, n, &b), UM_OK);
  if (model == NULL || back == NULL || a.handle == 0 || b.handle == 0)
    goto done;

  /* H2D then D2H, the read ordered after the write by its token */
  fill_pattern(model, n, 21);
  x = h2d(&a, 0, model, n, 0);
  CHECK_STATUS(issue_async(d->bdev, &x, NULL, 0, &c, &token), UM_OK);
  memset(back, 0, n);
  x = d2h(&a, 0, back, n, 0);
  CHECK_STATUS(issue_async(d->bdev, &x, &token, 1, &c2, &token2), UM_OK);
  CHECK_STATUS(completion_wait(&c2), UM_OK);
  CHECK_STATUS(completion_wait(&c), UM_OK);
  CHECK(memcmp(back, model, n) == 0);
  note_thread(&c);
  note_thread(&c2);
  backend->native_release(d->bdev, token);
  backend->native_release(d->bdev, token2);
  CHECK(completion_calls(&c) == 1 && completion_calls(&c2) == 1);
  completion_destroy(&c);
  completion_destroy(&c2);

  /* FILL and D2D at odd offsets */
  x = fill(&a, 17, 0x77, 333);
  CHECK_STATUS(issue_async(d->bdev, &x, NULL, 0, &c, &token), UM_OK);
  memset(model + 17, 0x77, 333);
  x = d2d(&b, 1, &a, 5, n - 5);
  CHECK_STATUS(issue_async(d->bdev, &x, &token, 1, &c2, &token2), UM_OK);
  CHECK_STATUS(completion_wait(&c), UM_OK);
  CHECK_STATUS(completion_wait(&c2), UM_OK);
  backend->native_release(d->bdev, token);
  backend->native_release(d->bdev, token2);
  note_thread(&c);
  note_thread(&c2);
  completion_destroy(&c);
  completion_destroy(&c2);
  CHECK(block_equals(d->bdev, &a, model, n));
  memset(back, 0, n);
  x = d2h(&b, 1, back, n - 5, 0);
  CHECK_STATUS(backend->xfer(d->bdev, &x), UM_OK);
  CHECK(memcmp(back, model + 5, n - 5) == 0);

  /* Several writes of the same range, each after the previous one, then a
   * read after all of them: it must see the last. */
  for (i = 0; i < ORDERED_WRITES; i++) {
    sources[i] = malloc(n);
    CHECK(sources[i] != NULL);
    if (sources[i] == NULL)
      goto done;
    fill_pattern(sources[i], n, 100u + (unsigned)i);
  }
  for (i = 0; i < ORDERED_WRITES; i++) {
    x = h2d(&a, 0, sources[i], n, 0);
    CHECK_STATUS(issue_async(d->bdev, &x, i > 0 ? &tokens[i - 1] : NULL,
                             i > 0 ? 1 : 0, &writes[i], &tokens[i]),
                 UM_OK);
  }
  memset(back, 0, n);
  x = d2h(&a, 0, back, n, 0);
  CHECK_STATUS(issue_async(d->bdev, &x, tokens, ORDERED_WRITES, &c, &token),
               UM_OK);
  CHECK_STATUS(completion_wait(&c), UM_OK);
  CHECK(memcmp(back, sources[ORDERED_WRITES - 1], n) == 0);
  for (i = 0; i < ORDERED_WRITES; i++) {
    CHECK_STATUS(completion_wait(&writes[i]), UM_OK);
    note_thread(&writes[i]);
    backend->native_release(d->bdev, tokens[i]);
    CHECK(completion_calls(&writes[i]) == 1);
    completion_destroy(&writes[i]);
  }
  backend->native_release(d->bdev, token);
  note_thread(&c);
  completion_destroy(&c);

  /* A transfer the driver refuses: an error code, done never called, the
   * token untouched. */
  token = (void *)&token;
  x = h2d(&a, n - 1, model, 2, 0);
  CHECK_STATUS(issue_async(d->bdev, &x, NULL, 0, &c, &token), UM_EINVAL);
  CHECK(token == (void *)&token);
  CHECK_STATUS(backend->synchronize(d->bdev), UM_OK);
  CHECK(completion_calls(&c) == 0);
  completion_destroy(&c);

  /* Release the token before the transfer is known to be done: the
   * callback must still run exactly once. */
  x = fill(&b, 0, 0x11, n);
  CHECK_STATUS(issue_async(d->bdev, &x, NULL, 0, &c, &token), UM_OK);
  backend->native_release(d->bdev, token);
  CHECK_STATUS(completion_wait(&c), UM_OK);
  CHECK_STATUS(backend->synchronize(d->bdev), UM_OK);
  CHECK(completion_calls(&c) == 1);
  completion_destroy(&c);

  /* Many at once, each token released at once: every callback exactly
   * once, and (under valgrind or ASan) no event used after its release. */
  {
    enum { BURST = 200 };
    static completion burst[BURST];
    int issued = 0, completed_once = 0;
    for (i = 0; i < BURST; i++) {
      x = fill(&b, (size_t)i * 7, (unsigned char)i, 1 + (size_t)i);
      if (issue_async(d->bdev, &x, NULL, 0, &burst[i], &token) != UM_OK)
        break;
      backend->native_release(d->bdev, token);
      issued++;
    }
    CHECK(issued == BURST);
    for (i = 0; i < issued; i++) {
      completed_once += completion_wait(&burst[i]) == UM_OK;
      note_thread(&burst[i]);
    }
    CHECK_STATUS(backend->synchronize(d->bdev), UM_OK);
    for (i = 0; i < issued; i++) {
      completed_once -= completion_calls(&burst[i]) != 1;
      completion_destroy(&burst[i]);
    }
    CHECK(completed_once == issued);
  }

done:
  for (i = 0; i < ORDERED_WRITES; i++)
    free(sources[i]);
  if (a.handle != 0)
    backend->mem_free(d->bdev, UM_DEVICE, n, &a);
  if (b.handle != 0)
    backend->mem_free(d->bdev, UM_DEVICE, n, &b);
  free(model);
  free(back);
}

static void test_map(const um__bdev_desc *d) {
  const size_t n = 8192 + 1;
  um__mem a;
  unsigned char *model = malloc(n);
  unsigned char *view = NULL;
  um__xfer x;
  size_t i;
  memset(&a, 0, sizeof(a));
  CHECK(model != NULL);
  CHECK_STATUS(backend->mem_alloc(d->bdev, UM_DEVICE, n, &a), UM_OK);
  if (model == NULL || a.handle == 0)
    goto done;
  fill_pattern(model, n, 42);
  x = h2d(&a, 0, model, n, 0);
  CHECK_STATUS(backend->xfer(d->bdev, &x), UM_OK);

  /* READ sees the device's data */
  CHECK_STATUS(backend->map(d->bdev, &a, UM_DEVICE, 5, 1000, UM_MAP_READ,
                            (void **)&view),
               UM_OK);
  if (view != NULL) {
    CHECK(memcmp(view, model + 5, 1000) == 0);
    CHECK_STATUS(backend->unmap(d->bdev, &a, UM_DEVICE, view), UM_OK);
  }

  /* READ_WRITE: modify in place */
  view = NULL;
  CHECK_STATUS(backend->map(d->bdev, &a, UM_DEVICE, 101, 300,
                            UM_MAP_READ_WRITE, (void **)&view),
               UM_OK);
  if (view != NULL) {
    CHECK(memcmp(view, model + 101, 300) == 0);
    for (i = 0; i < 300; i++)
      view[i] ^= 0xff;
    CHECK_STATUS(backend->unmap(d->bdev, &a, UM_DEVICE, view), UM_OK);
    for (i = 0; i < 300; i++)
      model[101 + i] ^= 0xff;
  }
  CHECK(block_equals(d->bdev, &a, model, n));

  /* WRITE and WRITE_DISCARD: every byte of the range written */
  view = NULL;
  CHECK_STATUS(backend->map(d->bdev, &a, UM_DEVICE, 0, 77, UM_MAP_WRITE,
                            (void **)&view),
               UM_OK);
  if (view != NULL) {
    memset(view, 0xee, 77);
    CHECK_STATUS(backend->unmap(d->bdev, &a, UM_DEVICE, view), UM_OK);
    memset(model, 0xee, 77);
  }
  view = NULL;
  CHECK_STATUS(backend->map(d->bdev, &a, UM_DEVICE, n - 513, 513,
                            UM_MAP_WRITE_DISCARD, (void **)&view),
               UM_OK);
  if (view != NULL) {
    memset(view, 0xd1, 513);
    CHECK_STATUS(backend->unmap(d->bdev, &a, UM_DEVICE, view), UM_OK);
    memset(model + n - 513, 0xd1, 513);
  }
  CHECK(block_equals(d->bdev, &a, model, n));

  CHECK_STATUS(backend->map(d->bdev, &a, UM_DEVICE, 0, 1, (um_map_mode)9,
                            (void **)&view),
               UM_EINVAL);
done:
  if (a.handle != 0)
    backend->mem_free(d->bdev, UM_DEVICE, n, &a);
  free(model);
}

static void test_peer(const um__bdev_desc *d0, const um__bdev_desc *d1) {
  const size_t n = 300007;
  um__mem a, b;
  unsigned char *model = malloc(n), *back = malloc(n);
  um__xfer x;
  completion c, c2;
  void *token = NULL, *token2 = NULL;
  memset(&a, 0, sizeof(a));
  memset(&b, 0, sizeof(b));

  CHECK(backend->peer_possible(d0->bdev, d1->bdev) == 1);
  CHECK(backend->peer_possible(d1->bdev, d0->bdev) == 1);
  CHECK_STATUS(backend->peer_enable(d1->bdev, d0->bdev), UM_OK);
  CHECK_STATUS(backend->peer_enable(d0->bdev, d1->bdev), UM_OK);
  CHECK((d0->caps & UM_CAP_PEER) && (d1->caps & UM_CAP_PEER));
  CHECK(model != NULL && back != NULL);
  CHECK_STATUS(backend->mem_alloc(d0->bdev, UM_DEVICE, n, &a), UM_OK);
  CHECK_STATUS(backend->mem_alloc(d1->bdev, UM_DEVICE, n, &b), UM_OK);
  if (model == NULL || back == NULL || a.handle == 0 || b.handle == 0)
    goto done;

  /* blocking: d0 -> d1, run on d1 */
  fill_pattern(model, n, 77);
  x = h2d(&a, 0, model, n, 0);
  CHECK_STATUS(backend->xfer(d0->bdev, &x), UM_OK);
  x = peer(&b, &a, d0->bdev, n);
  CHECK_STATUS(backend->xfer(d1->bdev, &x), UM_OK);
  CHECK(block_equals(d1->bdev, &b, model, n));

  /* asynchronous: a write on d0, then the peer copy on d1 after its token
   * (events of one context may be waited on by any of its queues) */
  fill_pattern(model, n, 78);
  x = h2d(&a, 0, model, n, 0);
  CHECK_STATUS(issue_async(d0->bdev, &x, NULL, 0, &c, &token), UM_OK);
  x = peer(&b, &a, d0->bdev, n);
  CHECK_STATUS(issue_async(d1->bdev, &x, &token, 1, &c2, &token2), UM_OK);
  CHECK_STATUS(completion_wait(&c2), UM_OK);
  CHECK_STATUS(completion_wait(&c), UM_OK);
  backend->native_release(d0->bdev, token);
  backend->native_release(d1->bdev, token2);
  completion_destroy(&c);
  completion_destroy(&c2);
  CHECK(block_equals(d1->bdev, &b, model, n));

  /* and back: d1 -> d0 */
  x = fill(&a, 0, 0, n);
  CHECK_STATUS(backend->xfer(d0->bdev, &x), UM_OK);
  x = peer(&a, &b, d1->bdev, n);
  CHECK_STATUS(backend->xfer(d0->bdev, &x), UM_OK);
  CHECK(block_equals(d0->bdev, &a, model, n));

done:
  if (a.handle != 0)
    backend->mem_free(d0->bdev, UM_DEVICE, n, &a);
  if (b.handle != 0)
    backend->mem_free(d1->bdev, UM_DEVICE, n, &b);
  free(model);
  free(back);
}

/* device_limit_bytes: the device is described with the limit as its
 * total; the core (block.c) counts the bytes and refuses past the limit,
 * not the backend (test_opencl_errors). */
static void test_device_limit(void) {
  const uint64_t limit = 1u << 20;
  um_options opts = test_options(limit);
  um__bdev_desc d;
  void *ctx = NULL;
  int count = 0;
  uint64_t free_bytes = 0, total_bytes = 0;
  um__mem a;
  memset(&a, 0, sizeof(a));

  CHECK_STATUS(backend->open(&opts, &ctx, &count), UM_OK);
  if (count < 1)
    goto done;
  CHECK_STATUS(backend->describe(ctx, 0, &d), UM_OK);
  CHECK(d.total_bytes == limit);
  CHECK_STATUS(backend->memory(d.bdev, &free_bytes, &total_bytes), UM_OK);
  CHECK(total_bytes == limit && free_bytes == limit);
  CHECK_STATUS(backend->mem_alloc(d.bdev, UM_DEVICE, 2 * limit, &a), UM_OK);
  if (a.handle != 0)
    backend->mem_free(d.bdev, UM_DEVICE, 2 * limit, &a);
done:
  if (ctx != NULL)
    backend->close(ctx);
}

/* Two threads issuing blocking and asynchronous transfers on one device. */
typedef struct thread_job {
  const um__bdev_desc *d;
  unsigned seed;
  int errors;
} thread_job;

static void *thread_round_trips(void *arg) {
  thread_job *job = arg;
  const size_t n = 4096 + 7;
  unsigned char src[4096 + 7], back[4096 + 7];
  um__mem mem;
  int i;
  memset(&mem, 0, sizeof(mem));
  if (backend->mem_alloc(job->d->bdev, UM_DEVICE, n, &mem) != UM_OK) {
    job->errors++;
    return NULL;
  }
  for (i = 0; i < 200; i++) {
    um__xfer x;
    completion c;
    void *token = NULL;
    fill_pattern(src, n, job->seed + (unsigned)i);
    x = h2d(&mem, 0, src, n, 0);
    if (i % 2 == 0) {
      if (backend->xfer(job->d->bdev, &x) != UM_OK)
        job->errors++;
    } else {
      if (issue_async(job->d->bdev, &x, NULL, 0, &c, &token) != UM_OK) {
        job->errors++;
        continue;
      }
      if (completion_wait(&c) != UM_OK)
        job->errors++;
      backend->native_release(job->d->bdev, token);
      completion_destroy(&c);
    }
    x = d2h(&mem, 0, back, n, 0);
    if (backend->xfer(job->d->bdev, &x) != UM_OK || memcmp(src, back, n) != 0)
      job->errors++;
  }
  backend->mem_free(job->d->bdev, UM_DEVICE, n, &mem);
  return NULL;
}

static void test_threads(const um__bdev_desc *d) {
  pthread_t threads[2];
  thread_job jobs[2] = {{d, 1000, 0}, {d, 2000, 0}};
  int i;
  for (i = 0; i < 2; i++)
    CHECK(pthread_create(&threads[i], NULL, thread_round_trips, &jobs[i]) ==
          0);
  for (i = 0; i < 2; i++) {
    pthread_join(threads[i], NULL);
    CHECK(jobs[i].errors == 0);
  }
}

/* Not a pass/fail criterion: the numbers behind the report. */
static void measure_4k_write(const um__bdev_desc *d) {
  enum { ROUNDS = 2000 };
  unsigned char src[4096];
  um__mem mem;
  um__xfer x;
  double t0, t1, issue = 0;
  int i;
  memset(&mem, 0, sizeof(mem));
  memset(src, 1, sizeof(src));
  if (backend->mem_alloc(d->bdev, UM_DEVICE, sizeof(src), &mem) != UM_OK)
    return;
  x = h2d(&mem, 0, src, sizeof(src), 0);
  for (i = 0; i < 100; i++)
    (void)backend->xfer(d->bdev, &x);
  t0 = now_us();
  for (i = 0; i < ROUNDS; i++)
    (void)backend->xfer(d->bdev, &x);
  t1 = now_us();
  printf("  4 KiB H2D, blocking xfer: %.1f us each\n", (t1 - t0) / ROUNDS);
  {
    static completion cs[ROUNDS];
    static void *tokens[ROUNDS];
    t0 = now_us();
    for (i = 0; i < ROUNDS; i++) {
      double s = now_us();
      if (issue_async(d->bdev, &x, NULL, 0, &cs[i], &tokens[i]) != UM_OK)
        tokens[i] = NULL;
      issue += now_us() - s;
    }
    for (i = 0; i < ROUNDS; i++)
      if (tokens[i] != NULL)
        (void)completion_wait(&cs[i]);
    t1 = now_us();
    for (i = 0; i < ROUNDS; i++) {
      if (tokens[i] != NULL)
        backend->native_release(d->bdev, tokens[i]);
      completion_destroy(&cs[i]);
    }
    printf("  4 KiB H2D, xfer_async: %.1f us to issue, %.1f us each "
           "(issue to last completion)\n",
           issue / ROUNDS, (t1 - t0) / ROUNDS);
  }
  backend->mem_free(d->bdev, UM_DEVICE, sizeof(src), &mem);

  /* what a pool miss costs: DEVICE and PINNED blocks straight from the
   * driver */
  {
    static const um_location locs[] = {UM_DEVICE, UM_PINNED};
    static const char *const loc_names[] = {"DEVICE", "PINNED"};
    int l;
    for (l = 0; l < 2; l++) {
      t0 = now_us();
      for (i = 0; i < 500; i++) {
        if (backend->mem_alloc(d->bdev, locs[l], 4096, &mem) != UM_OK)
          break;
        backend->mem_free(d->bdev, locs[l], 4096, &mem);
      }
      t1 = now_us();
      printf("  4 KiB %s mem_alloc + mem_free: %.1f us\n", loc_names[l],
             (t1 - t0) / 500);
    }
  }
}

int main(void) {
  um_options opts = test_options(0);
  um__bdev_desc descs[MAX_DEVICES];
  void *ctx = NULL;
  int count = 0, status, i;

  printf("opencl backend, raw table\n");
  test_missing_library("/nonexistent", "/nonexistent");
  test_missing_library("libm.so.6", "clGetPlatformIDs missing");

  status = backend->open(&opts, &ctx, &count);
  if (status == UM_ENODEV || (status == UM_OK && count == 0)) {
    printf("SKIP: no OpenCL device (%s)\n",
           status == UM_OK ? "no platform or device" : um_last_error());
    if (ctx != NULL)
      backend->close(ctx);
    return EXIT_SKIP;
  }
  CHECK_STATUS(status, UM_OK);
  if (status != UM_OK)
    return 1;
  if (count > MAX_DEVICES)
    count = MAX_DEVICES;
  printf("%d device(s)\n", count);
  test_describe(ctx, count, descs);

  for (i = 0; i < count; i++) {
    printf("device %d: locations, blocking, async, map, threads\n", i);
    test_locations(&descs[i]);
    test_blocking(&descs[i]);
    test_async(&descs[i]);
    test_map(&descs[i]);
    test_threads(&descs[i]);
  }

  if (count >= 2 && backend->peer_possible(descs[0].bdev, descs[1].bdev)) {
    printf("peer copies between devices 0 and 1\n");
    test_peer(&descs[0], &descs[1]);
  } else {
    printf("peer: skipped (needs two devices of one platform, e.g. "
           "POCL_DEVICES=\"pthread pthread\")\n");
  }

  printf("device limit\n");
  test_device_limit();

  printf("timing on device 0\n");
  measure_4k_write(&descs[0]);
  printf("done callbacks: %d, before xfer_async returned: %d, on the issuing "
         "thread: %d\n",
         async_total, async_early, async_on_issuer);

  backend->close(ctx);
  printf("%d checks, %d failures\n", checks, failures);
  return failures == 0 ? 0 : 1;
}
