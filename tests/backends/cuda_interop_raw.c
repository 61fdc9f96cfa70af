/* The cuda backend's interop operations (backend.h, SPEC §8) through its
 * table, without the core: each operation's contract checked where it is
 * deterministic, by holding the device with a gate of the test's own (a
 * cuStreamWaitValue32 on a page-locked word the test writes later).
 *
 *   interop             libfakecuda_full.so, streams running inside calls
 *   interop_threaded    the same, streams on threads of their own
 *   interop_gate_kernel UNIMEM_CUDA_GATE_KERNEL=1: gates spin in a kernel
 *   real                the real driver; skips without a GPU
 *
 * Checks: device_native and mem_native; caller_marker completes after the
 * caller stream's work; a gate holds a marker and a transfer until
 * gate_open, in either order of its two owners' releases, and its words
 * are reused; token_adopt captures the caller's event (the event is
 * destroyed at once, the token still waits for its work) and refuses a
 * handle the driver does not know; a marker waits for exactly its own
 * tokens (one held by a closed gate does not hold another); token_wait;
 * done called exactly once per marker; nothing left in the driver at close.
 * Exit status 0 pass, 1 fail, 77 skip. */
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>

#include "backend.h"

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

#define CHECK_CU(expr) CHECK((expr) == CUDA_SUCCESS)

static const um__backend *be = &um__backend_cuda;

/* The driver as the test calls it, from the library the backend loaded. */
static struct {
  __typeof__(cuCtxSetCurrent) *cuCtxSetCurrent;
  __typeof__(cuMemHostAlloc) *cuMemHostAlloc;
  __typeof__(cuMemFreeHost) *cuMemFreeHost;
  __typeof__(cuMemHostGetDevicePointer_v2) *cuMemHostGetDevicePointer_v2;
  __typeof__(cuStreamWaitValue32_v2) *cuStreamWaitValue32_v2;
  __typeof__(cuStreamSynchronize) *cuStreamSynchronize;
  __typeof__(cuEventCreate) *cuEventCreate;
  __typeof__(cuEventRecord) *cuEventRecord;
  __typeof__(cuEventQuery) *cuEventQuery;
  __typeof__(cuEventDestroy_v2) *cuEventDestroy_v2;
} drv;
static long (*fake_count)(const char *what); /* NULL on a real driver */

static void *symbol(void *lib, const char *name) {
  void *address = dlsym(lib, name);
  if (address == NULL) {
    fprintf(stderr, "the driver lacks %s\n", name);
    exit(1);
  }
  return address;
}

#define LOAD(lib, name)                                                        \
  do {                                                                         \
    void *a_ = symbol(lib, #name);                                             \
    memcpy(&drv.name, &a_, sizeof(a_));                                        \
  } while (0)

static void load_api(const char *path) {
  void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  void *count;
  CHECK(lib != NULL);
  LOAD(lib, cuCtxSetCurrent);
  LOAD(lib, cuMemHostAlloc);
  LOAD(lib, cuMemFreeHost);
  LOAD(lib, cuMemHostGetDevicePointer_v2);
  LOAD(lib, cuStreamWaitValue32_v2);
  LOAD(lib, cuStreamSynchronize);
  LOAD(lib, cuEventCreate);
  LOAD(lib, cuEventRecord);
  LOAD(lib, cuEventQuery);
  LOAD(lib, cuEventDestroy_v2);
  count = dlsym(lib, "fake_cuda_count");
  memcpy(&fake_count, &count, sizeof(count));
}

/* ------------------------------------------------------------------------ */
/* The test's hold, and completions                                          */

typedef struct hold {
  uint32_t *word;
  CUdeviceptr device;
} hold;

static hold hold_new(void) {
  hold h;
  void *p = NULL;
  CHECK_CU(drv.cuMemHostAlloc(&p, sizeof(uint32_t), CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP));
  h.word = p;
  __atomic_store_n(h.word, 0, __ATOMIC_RELEASE);
  CHECK_CU(drv.cuMemHostGetDevicePointer_v2(&h.device, p, 0));
  return h;
}

static void hold_wait(const hold *h, CUstream s) {
  CHECK_CU(drv.cuStreamWaitValue32_v2(s, h->device, 1, CU_STREAM_WAIT_VALUE_GEQ));
}

static void hold_open(const hold *h) { __atomic_store_n(h->word, 1, __ATOMIC_RELEASE); }

static void hold_free(hold *h) { CHECK_CU(drv.cuMemFreeHost(h->word)); }

typedef struct completion {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  int calls, status;
} completion;

static void on_done(void *arg, int status) {
  completion *c = arg;
  pthread_mutex_lock(&c->lock);
  c->calls++;
  c->status = status;
  pthread_cond_broadcast(&c->cond);
  pthread_mutex_unlock(&c->lock);
}

static void completion_init(completion *c) {
  pthread_mutex_init(&c->lock, NULL);
  pthread_cond_init(&c->cond, NULL);
  c->calls = 0;
  c->status = 1;
}

static int completion_calls(completion *c) {
  int n;
  pthread_mutex_lock(&c->lock);
  n = c->calls;
  pthread_mutex_unlock(&c->lock);
  return n;
}

/* Waits for the call (a lost completion hangs: CTest's timeout says so),
 * then a moment more for a second, wrong one. */
static int completion_wait(completion *c) {
  int status;
  pthread_mutex_lock(&c->lock);
  while (c->calls == 0)
    pthread_cond_wait(&c->cond, &c->lock);
  status = c->status;
  pthread_mutex_unlock(&c->lock);
  for (int i = 0; i < 100; i++)
    sched_yield();
  CHECK(completion_calls(c) == 1);
  pthread_mutex_destroy(&c->lock);
  pthread_cond_destroy(&c->cond);
  return status;
}

/* A marker over after[] and wait[]. */
static void *marker(void *bdev, void *const *after, int nafter, void *w0, void *w1, completion *c) {
  um__xfer x;
  void *token = NULL;
  memset(&x, 0, sizeof(x));
  x.kind = UM__XFER_MARKER;
  x.wait[0] = w0;
  x.wait[1] = w1;
  completion_init(c);
  CHECK_STATUS(be->xfer_async(bdev, &x, after, nafter, on_done, c, &token), UM_OK);
  CHECK(token != NULL);
  return token;
}

static int event_done(void *bdev, void *token) {
  CUresult r = drv.cuEventQuery((CUevent)be->token_native(bdev, token));
  CHECK(r == CUDA_SUCCESS || r == CUDA_ERROR_NOT_READY);
  return r == CUDA_SUCCESS;
}

/* ------------------------------------------------------------------------ */
/* Checks                                                                    */

static void check_handles(void *bdev, const um_device_native *nat) {
  um__mem dev = {0}, pin = {0};
  um_buffer_native bn;
  CUdeviceptr mapped = 0;
  CHECK(nat->cu_device == 0 && nat->cu_context != NULL && nat->cu_stream != NULL);
  CHECK_STATUS(be->mem_alloc(bdev, UM_DEVICE, 4096, &dev), UM_OK);
  memset(&bn, 0, sizeof(bn));
  be->mem_native(bdev, &dev, UM_DEVICE, &bn);
  CHECK(bn.cu_ptr == (uint64_t)dev.handle && bn.offset == 0 && bn.cl_mem == NULL);
  CHECK_STATUS(be->mem_alloc(bdev, UM_PINNED, 4096, &pin), UM_OK);
  memset(&bn, 0, sizeof(bn));
  be->mem_native(bdev, &pin, UM_PINNED, &bn);
  CHECK_CU(drv.cuMemHostGetDevicePointer_v2(&mapped, pin.host, 0));
  CHECK(bn.cu_ptr == (uint64_t)mapped);
  be->mem_free(bdev, UM_DEVICE, 4096, &dev);
  be->mem_free(bdev, UM_PINNED, 4096, &pin);
}

/* caller_marker: done after what the caller stream held. */
static void check_caller_marker(void *bdev, CUstream caller) {
  hold h = hold_new();
  void *token = NULL;
  hold_wait(&h, caller);
  CHECK_STATUS(be->caller_marker(bdev, &token), UM_OK);
  CHECK(!event_done(bdev, token));
  hold_open(&h);
  CHECK_STATUS(be->token_wait(bdev, token), UM_OK);
  CHECK(event_done(bdev, token));
  be->native_release(bdev, token);
  CHECK_CU(drv.cuStreamSynchronize(caller));
  hold_free(&h);
}

/* A gate holds a marker (in wait[]) and a transfer (in after[]) until it
 * opens; its two owners let go in either order. */
static void check_gate(void *bdev, int caller_first) {
  enum { N = 4096 };
  um__mem dev = {0}, pin = {0};
  unsigned char back[N];
  completion cm, cx;
  void *gate = NULL, *m, *t = NULL;
  um__xfer x;
  CHECK_STATUS(be->mem_alloc(bdev, UM_DEVICE, N, &dev), UM_OK);
  CHECK_STATUS(be->mem_alloc(bdev, UM_PINNED, N, &pin), UM_OK);
  memset(pin.host, 0x3C, N);
  CHECK_STATUS(be->gate_new(bdev, &gate), UM_OK);
  CHECK(!event_done(bdev, gate));
  m = marker(bdev, NULL, 0, gate, NULL, &cm);
  memset(&x, 0, sizeof(x));
  x.kind = UM__XFER_H2D;
  x.dst = &dev;
  x.dst_loc = UM_DEVICE;
  x.host = pin.host;
  x.host_pinned = 1;
  x.bytes = N;
  completion_init(&cx);
  CHECK_STATUS(be->xfer_async(bdev, &x, &gate, 1, on_done, &cx, &t), UM_OK);
  CHECK(completion_calls(&cm) == 0 && completion_calls(&cx) == 0 && !event_done(bdev, m));
  if (caller_first)
    be->native_release(bdev, gate);
  be->gate_open(bdev, gate, UM_OK);
  CHECK_STATUS(completion_wait(&cm), UM_OK);
  CHECK_STATUS(completion_wait(&cx), UM_OK);
  if (!caller_first) {
    CHECK_STATUS(be->token_wait(bdev, gate), UM_OK);
    be->native_release(bdev, gate);
  }
  memset(&x, 0, sizeof(x));
  x.kind = UM__XFER_D2H;
  x.src = &dev;
  x.src_loc = UM_DEVICE;
  x.host = back;
  x.bytes = N;
  CHECK_STATUS(be->xfer(bdev, &x), UM_OK);
  for (int i = 0; i < N; i++)
    CHECK(back[i] == 0x3C);
  be->native_release(bdev, m);
  be->native_release(bdev, t);
  be->mem_free(bdev, UM_DEVICE, N, &dev);
  be->mem_free(bdev, UM_PINNED, N, &pin);
}

/* token_adopt captures the caller's event: the caller destroys it at once,
 * and the token still stands for the held work. */
static void check_adopt(void *bdev, CUstream caller) {
  hold h = hold_new();
  CUevent e;
  void *token = NULL, *m;
  completion cm;
  CHECK_CU(drv.cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
  hold_wait(&h, caller);
  CHECK_CU(drv.cuEventRecord(e, caller));
  CHECK_STATUS(be->token_adopt(bdev, e, &token), UM_OK);
  CHECK_CU(drv.cuEventDestroy_v2(e));
  CHECK(!event_done(bdev, token));
  m = marker(bdev, NULL, 0, NULL, token, &cm);
  be->native_release(bdev, token); /* as the core does: the marker captured it */
  CHECK(completion_calls(&cm) == 0);
  hold_open(&h);
  CHECK_STATUS(completion_wait(&cm), UM_OK);
  be->native_release(bdev, m);
  /* Work already done: a token that needs no wait. */
  CHECK_CU(drv.cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
  CHECK_CU(drv.cuEventRecord(e, caller));
  CHECK_CU(drv.cuStreamSynchronize(caller));
  CHECK_STATUS(be->token_adopt(bdev, e, &token), UM_OK);
  CHECK_CU(drv.cuEventDestroy_v2(e));
  CHECK_STATUS(be->token_wait(bdev, token), UM_OK);
  be->native_release(bdev, token);
  if (fake_count != NULL) { /* a real driver's answer for a dead handle is undefined */
    CHECK_CU(drv.cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
    CHECK_CU(drv.cuEventDestroy_v2(e));
    CHECK_STATUS(be->token_adopt(bdev, e, &token), UM_EINVAL);
  }
  hold_free(&h);
}

/* A marker waits for its own tokens only: one behind a closed gate does
 * not hold a later one (lanes are not shared while busy). */
static void check_markers_independent(void *bdev) {
  completion c1, c2;
  void *gate = NULL, *m1, *m2, *m3;
  CHECK_STATUS(be->gate_new(bdev, &gate), UM_OK);
  m1 = marker(bdev, &gate, 1, NULL, NULL, &c1);
  m2 = marker(bdev, NULL, 0, NULL, NULL, &c2);
  CHECK_STATUS(completion_wait(&c2), UM_OK);
  CHECK(completion_calls(&c1) == 0);
  m3 = marker(bdev, &m1, 1, NULL, NULL, &c2);
  be->gate_open(bdev, gate, UM_OK);
  CHECK_STATUS(completion_wait(&c1), UM_OK);
  CHECK_STATUS(completion_wait(&c2), UM_OK);
  CHECK(event_done(bdev, m3));
  be->native_release(bdev, gate);
  be->native_release(bdev, m1);
  be->native_release(bdev, m2);
  be->native_release(bdev, m3);
}

/* More gates than a slab has words, one at a time: one slab. */
static void check_gate_words_reused(void *bdev) {
  long before = fake_count("host_allocs");
  for (int i = 0; i < 2100; i++) {
    void *gate = NULL;
    CHECK_STATUS(be->gate_new(bdev, &gate), UM_OK);
    be->gate_open(bdev, gate, UM_OK);
    CHECK_STATUS(be->token_wait(bdev, gate), UM_OK);
    be->native_release(bdev, gate);
  }
  CHECK(fake_count("host_allocs") - before <= 1);
}

static void check_nothing_left(void) {
  static const char *const zero[] = {"streams",   "events",           "allocations",
                                     "modules",   "context_retains",  "races",
                                     "unrecorded_waits", "calls_in_callbacks"};
  for (size_t i = 0; i < sizeof(zero) / sizeof(zero[0]); i++)
    if (fake_count(zero[i]) != 0) {
      fprintf(stderr, "after close: %s = %ld\n", zero[i], fake_count(zero[i]));
      exit(1);
    }
}

static int run(const char *library, int real) {
  um_options opts;
  um__bdev_desc desc;
  um_device_native nat;
  void *ctx = NULL;
  int count = 0, status;
  um_options_init(&opts);
  status = be->open(&opts, &ctx, &count);
  if (real && (status != UM_OK || count == 0)) {
    printf("SKIP: no NVIDIA GPU to test: %s\n", um_last_error());
    if (status == UM_OK)
      be->close(ctx);
    return 77;
  }
  CHECK_STATUS(status, UM_OK);
  CHECK(count >= 1);
  CHECK_STATUS(be->describe(ctx, 0, &desc), UM_OK);
  load_api(library);
  memset(&nat, 0, sizeof(nat));
  be->device_native(desc.bdev, &nat);
  CHECK_CU(drv.cuCtxSetCurrent((CUcontext)nat.cu_context));
  check_handles(desc.bdev, &nat);
  check_caller_marker(desc.bdev, (CUstream)nat.cu_stream);
  check_gate(desc.bdev, 0);
  check_gate(desc.bdev, 1);
  check_adopt(desc.bdev, (CUstream)nat.cu_stream);
  check_markers_independent(desc.bdev);
  if (fake_count != NULL)
    check_gate_words_reused(desc.bdev);
  CHECK_CU(drv.cuCtxSetCurrent(NULL));
  be->close(ctx);
  if (fake_count != NULL)
    check_nothing_left();
  printf("PASS: cuda interop on %s\n", desc.name);
  return 0;
}

int main(int argc, char **argv) {
  const char *name = argc > 1 ? argv[1] : "";
  const char *library = getenv("UNIMEM_CUDA_LIBRARY");
  int real = strcmp(name, "real") == 0;
  if (real) {
    unsetenv("UNIMEM_CUDA_LIBRARY");
    library = "libcuda.so.1";
  } else if (strcmp(name, "interop") != 0 && strcmp(name, "interop_threaded") != 0 &&
             strcmp(name, "interop_gate_kernel") != 0) {
    fprintf(stderr, "usage: %s interop|interop_threaded|interop_gate_kernel|real\n", argv[0]);
    return 2;
  }
  if (!real && (library == NULL || library[0] == '\0')) {
    printf("SKIP: UNIMEM_CUDA_LIBRARY must name libfakecuda_full.so\n");
    return 77;
  }
  if (strcmp(name, "interop_threaded") == 0)
    CHECK(setenv("FAKE_CUDA_STREAM_THREADS", "1", 1) == 0);
  if (strcmp(name, "interop_gate_kernel") == 0)
    CHECK(setenv("UNIMEM_CUDA_GATE_KERNEL", "1", 1) == 0);
  return run(library, real);
}
