/* libunimem_torch.so: unimem as PyTorch's CUDA allocator, loaded by
 *
 *   torch.cuda.memory.CUDAPluggableAllocator(path, "unimem_torch_alloc",
 *                                            "unimem_torch_free")
 *
 * (unimem.torch.use_unimem_allocator() does it). PyTorch documents the two
 * functions as
 *
 *   void *alloc(ssize_t size, int device, cudaStream_t stream);
 *   void free(void *ptr, size_t size, int device, cudaStream_t stream);
 *
 * (its C++ side calls them through std::function<void *(size_t, int,
 * cudaStream_t)> and <void(void *, size_t, int, cudaStream_t)>: the same
 * ABI). cudaStream_t is a pointer (CUstream_st *), written void * here so
 * that the library builds without CUDA's headers.
 *
 * Blocks come from one unimem manager of the process (made at the first
 * allocation, options from the UNIMEM_* environment), on the CUDA device of
 * PyTorch's ordinal, at UM_DEVICE: pooled by unimem. A map from pointer to
 * buffer (open addressing, one mutex) finds the buffer at free.
 *
 * Stream-ordered free: PyTorch frees a block as soon as the last tensor
 * using it dies on the host, while kernels queued on `stream` may still use
 * it. The free records an event on the stream (cuEventRecord, through the
 * CUDA driver, dlopen'd: the library never links libcuda or libcudart) and
 * hands it to um_access_end before um_release: unimem gives the block to
 * the next allocation only after that event. Events are destroyed once
 * complete (checked at later frees). Where the bracket cannot take the
 * event (no CUDA interop in this build of unimem), the free waits for the
 * stream instead (cuStreamSynchronize): slower, still correct.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include <unimem.h>

#define UT_API __attribute__((visibility("default")))

typedef void *cuda_stream; /* cudaStream_t, CUstream */

UT_API void *unimem_torch_alloc(ssize_t size, int device, cuda_stream stream);
UT_API void unimem_torch_free(void *ptr, size_t size, int device, cuda_stream stream);
UT_API um_manager *unimem_torch_manager(void);
UT_API int unimem_torch_stats(um_stats *out);
UT_API size_t unimem_torch_live(void);
UT_API const char *unimem_torch_last_error(void);

/* The signatures PyTorch's CUDAPluggableAllocator calls. */
_Static_assert(__builtin_types_compatible_p(__typeof__(&unimem_torch_alloc), void *(*)(ssize_t, int, cuda_stream)),
               "alloc signature");
_Static_assert(__builtin_types_compatible_p(__typeof__(&unimem_torch_free), void (*)(void *, size_t, int, cuda_stream)),
               "free signature");

#define MAX_ORDINALS 64
#define CU_EVENT_DISABLE_TIMING 0x2
#define CUDA_SUCCESS 0
#define PENDING_EVENTS 4096

/* ---- The driver's few entry points ---------------------------------------- */

static struct {
  int (*event_create)(void **event, unsigned flags);
  int (*event_record)(void *event, cuda_stream stream);
  int (*event_query)(void *event);
  int (*event_destroy)(void *event);
  int (*stream_synchronize)(cuda_stream stream);
} cu;

static void load_driver(void) {
  const char *path = getenv("UNIMEM_CUDA_LIBRARY");
  void *lib = dlopen(path != NULL && path[0] ? path : "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  void *sym[5];
  if (lib == NULL)
    return;
  sym[0] = dlsym(lib, "cuEventCreate");
  sym[1] = dlsym(lib, "cuEventRecord");
  sym[2] = dlsym(lib, "cuEventQuery");
  sym[3] = dlsym(lib, "cuEventDestroy_v2");
  sym[4] = dlsym(lib, "cuStreamSynchronize");
  /* POSIX: a data pointer from dlsym holds the function's address. */
  memcpy(&cu.event_create, &sym[0], sizeof(void *));
  memcpy(&cu.event_record, &sym[1], sizeof(void *));
  memcpy(&cu.event_query, &sym[2], sizeof(void *));
  memcpy(&cu.event_destroy, &sym[3], sizeof(void *));
  memcpy(&cu.stream_synchronize, &sym[4], sizeof(void *));
}

/* ---- State -------------------------------------------------------------------- */

typedef struct slot {
  uintptr_t ptr; /* 0: empty; 1: deleted */
  um_buffer *b;
} slot;

static struct {
  pthread_once_t once;
  int status;
  um_manager *m;
  um_device *by_ordinal[MAX_ORDINALS];
  pthread_mutex_t lock; /* the map, the pending events */
  slot *slots;
  size_t cap, used, live; /* used counts deleted slots too */
  void *pending[PENDING_EVENTS];
  size_t npending;
} g = {.once = PTHREAD_ONCE_INIT, .lock = PTHREAD_MUTEX_INITIALIZER};

static _Thread_local char last_error[256];

static void set_error(const char *what, int st) {
  snprintf(last_error, sizeof(last_error), "%s: %s (%s)", what, um_last_error(), um_err_name(st));
}

/* The CUDA ordinal of a unimem device: its native cu_device, else its
 * position among the manager's CUDA devices (the backend opens them in
 * ordinal order). */
static void map_ordinals(void) {
  int n = um_device_count(g.m), k = 0;
  for (int i = 0; i < n; i++) {
    um_device *d = um_device_get(g.m, i);
    um_device_native nat;
    if (um_device_native_get(d, &nat) != UM_OK || strcmp(nat.backend, "cuda") != 0)
      continue;
    int ordinal = nat.cu_device >= 0 ? nat.cu_device : k;
    if (ordinal < MAX_ORDINALS)
      g.by_ordinal[ordinal] = d;
    k++;
  }
}

static void init_once(void) {
  um_options o;
  um_options_init(&o);
  load_driver();
  if ((g.status = um_manager_create(&o, &g.m)) != UM_OK) {
    set_error("um_manager_create", g.status);
    return;
  }
  map_ordinals();
}

static int ready(void) {
  pthread_once(&g.once, init_once);
  return g.status == UM_OK;
}

/* ---- The pointer map (g.lock held) ---------------------------------------------- */

static size_t hash(uintptr_t p) { return (size_t)((p >> 8) * 0x9E3779B97F4A7C15ull); }

static int map_grow(void) {
  size_t cap = g.cap ? g.cap * 2 : 1024;
  slot *old = g.slots, *s = calloc(cap, sizeof(*s));
  size_t oldcap = g.cap;
  if (s == NULL)
    return -1;
  g.slots = s, g.cap = cap, g.used = 0;
  for (size_t i = 0; i < oldcap; i++)
    if (old[i].ptr > 1) {
      size_t j = hash(old[i].ptr) & (cap - 1);
      while (s[j].ptr != 0)
        j = (j + 1) & (cap - 1);
      s[j] = old[i];
      g.used++;
    }
  free(old);
  return 0;
}

static int map_put(uintptr_t p, um_buffer *b) {
  size_t j;
  if ((g.used + 1) * 2 > g.cap && map_grow() < 0)
    return -1;
  j = hash(p) & (g.cap - 1);
  while (g.slots[j].ptr > 1)
    j = (j + 1) & (g.cap - 1);
  if (g.slots[j].ptr == 0)
    g.used++;
  g.slots[j].ptr = p;
  g.slots[j].b = b;
  g.live++;
  return 0;
}

static um_buffer *map_take(uintptr_t p) {
  if (g.cap == 0)
    return NULL;
  for (size_t j = hash(p) & (g.cap - 1); g.slots[j].ptr != 0; j = (j + 1) & (g.cap - 1))
    if (g.slots[j].ptr == p) {
      g.slots[j].ptr = 1;
      g.live--;
      return g.slots[j].b;
    }
  return NULL;
}

/* ---- Allocation -------------------------------------------------------------------- */

void *unimem_torch_alloc(ssize_t size, int device, cuda_stream stream) {
  um_buffer_native n;
  um_buffer *b = NULL;
  uintptr_t p;
  int st;
  (void)stream; /* a pooled block is free of every earlier user's work (the free's event) */
  if (size <= 0 || !ready())
    return NULL;
  if (device < 0 || device >= MAX_ORDINALS || g.by_ordinal[device] == NULL) {
    snprintf(last_error, sizeof(last_error), "no CUDA device %d in unimem's manager", device);
    return NULL;
  }
  if ((st = um_alloc(g.m, g.by_ordinal[device], (size_t)size, UM_DEVICE, 0, &b)) != UM_OK) {
    set_error("um_alloc", st);
    return NULL;
  }
  if ((st = um_buffer_native_get(b, &n)) != UM_OK || n.cu_ptr == 0) {
    snprintf(last_error, sizeof(last_error), "this build of unimem gives no CUdeviceptr for CUDA buffers");
    um_release(b);
    return NULL;
  }
  p = (uintptr_t)(n.cu_ptr + n.offset);
  pthread_mutex_lock(&g.lock);
  st = map_put(p, b);
  pthread_mutex_unlock(&g.lock);
  if (st < 0) {
    um_release(b);
    snprintf(last_error, sizeof(last_error), "out of memory for the pointer map");
    return NULL;
  }
  return (void *)p;
}

/* Destroy the events that completed (g.lock held). */
static void sweep_events(void) {
  size_t k = 0;
  for (size_t i = 0; i < g.npending; i++) {
    if (cu.event_query(g.pending[i]) == CUDA_SUCCESS)
      cu.event_destroy(g.pending[i]);
    else
      g.pending[k++] = g.pending[i];
  }
  g.npending = k;
}

/* An event recorded on stream, kept until complete; NULL when there is
 * none to be had (no driver, a full list, a driver error). */
static void *record_on(cuda_stream stream) {
  void *ev = NULL;
  if (cu.event_create == NULL || cu.event_record == NULL || cu.event_query == NULL || cu.event_destroy == NULL)
    return NULL;
  pthread_mutex_lock(&g.lock);
  sweep_events();
  if (g.npending < PENDING_EVENTS && cu.event_create(&ev, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS) {
    if (cu.event_record(ev, stream) == CUDA_SUCCESS) {
      g.pending[g.npending++] = ev;
    } else {
      cu.event_destroy(ev);
      ev = NULL;
    }
  }
  pthread_mutex_unlock(&g.lock);
  return ev;
}

void unimem_torch_free(void *ptr, size_t size, int device, cuda_stream stream) {
  um_buffer *b;
  void *wait = NULL, *ev;
  (void)size, (void)device;
  if (ptr == NULL || !ready())
    return;
  pthread_mutex_lock(&g.lock);
  b = map_take((uintptr_t)ptr);
  pthread_mutex_unlock(&g.lock);
  if (b == NULL) {
    fprintf(stderr, "unimem_torch_free: %p was not allocated by unimem_torch_alloc\n", ptr);
    return;
  }
  /* The block goes back after the stream's work on it: the bracket ends
   * behind an event recorded on the stream now. */
  if (um_access_begin(b, UM_MAP_READ_WRITE, &wait) == UM_OK) {
    ev = record_on(stream);
    if (ev == NULL || um_access_end(b, ev) != UM_OK) {
      if (cu.stream_synchronize != NULL)
        cu.stream_synchronize(stream);
      um_access_end(b, NULL);
    }
  }
  um_release(b);
}

/* ---- For unimem.torch and the tests --------------------------------------------------- */

um_manager *unimem_torch_manager(void) { return ready() ? g.m : NULL; }

int unimem_torch_stats(um_stats *out) {
  if (!ready())
    return g.status;
  return um_stats_get(g.m, NULL, out);
}

size_t unimem_torch_live(void) {
  size_t n;
  pthread_mutex_lock(&g.lock);
  n = g.live;
  pthread_mutex_unlock(&g.lock);
  return n;
}

const char *unimem_torch_last_error(void) { return last_error; }
