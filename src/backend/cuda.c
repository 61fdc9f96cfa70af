/* The cuda backend: NVIDIA GPUs through the CUDA driver API, loaded at run
 * time.
 *
 * libcuda.so.1 is dlopen()ed once per process (base/vendor_lib.c;
 * UNIMEM_CUDA_LIBRARY names
 * another file, e.g. a test double) and every entry point is fetched by the
 * symbol the driver exports. cuda.h maps most API names onto versioned ABI
 * symbols (cuMemAlloc -> cuMemAlloc_v2), so the table below spells out the
 * exported names; the function types come from cuda.h's own prototypes, so a
 * signature can never drift from the header. Nothing here links libcuda.
 *
 * Per device: its primary context (shared with the application and the CUDA
 * runtime, so unimem memory works with their kernels) and three non-blocking
 * streams -- h2d, d2h and local (D2D, FILL, PEER) -- so that uploads,
 * downloads and on-device work overlap; a fourth stream for the caller's
 * own kernels (um_device_native's cu_stream), and lanes: private streams
 * for the interop work that joins unimem's order with the caller's
 * (markers, captured caller events, gates; see "The caller's own device
 * work" below). Every call makes the device's
 * context current for its duration (enter_context / leave_context): calls
 * come from any thread, and the current context is per thread.
 *
 * Memory: DEVICE = cuMemAlloc, PINNED = cuMemHostAlloc (portable, mapped),
 * UNIFIED = cuMemAllocManaged where the device has managed memory. HOST
 * belongs to the cpu backend. Unified virtual addressing (every 64-bit
 * Linux device) makes a pinned or managed block's host pointer also its
 * device address, so every block's handle is a CUdeviceptr.
 */
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>

#include "backend.h"
#include "atomic.h"
#include "testhook.h"

#if defined(__CUDA_API_PER_THREAD_DEFAULT_STREAM)
#error "the cuda backend uses explicit streams; build without per-thread default stream"
#endif

/* ------------------------------------------------------------------------ */
/* Driver entry points                                                       */

/* REQUIRED(symbol) / OPTIONAL(symbol), by the exact name libcuda exports.
 * A missing required one makes the backend unavailable; a missing optional
 * one disables its feature (error names, stream-ordered allocation, gates
 * through stream memory operations -- v2, CUDA 11.7 -- or through the gate
 * kernel). */
#define CUDA_ENTRY_POINTS(REQUIRED, OPTIONAL)                                  \
  REQUIRED(cuInit)                                                             \
  REQUIRED(cuDeviceGetCount)                                                   \
  REQUIRED(cuDeviceGet)                                                        \
  REQUIRED(cuDeviceGetName)                                                    \
  REQUIRED(cuDeviceTotalMem_v2)                                                \
  REQUIRED(cuDeviceGetAttribute)                                               \
  REQUIRED(cuDeviceCanAccessPeer)                                              \
  REQUIRED(cuDevicePrimaryCtxRetain)                                           \
  REQUIRED(cuDevicePrimaryCtxRelease_v2)                                       \
  REQUIRED(cuCtxGetCurrent)                                                    \
  REQUIRED(cuCtxSetCurrent)                                                    \
  REQUIRED(cuCtxSynchronize)                                                   \
  REQUIRED(cuCtxEnablePeerAccess)                                              \
  REQUIRED(cuMemGetInfo_v2)                                                    \
  REQUIRED(cuMemAlloc_v2)                                                      \
  REQUIRED(cuMemFree_v2)                                                       \
  REQUIRED(cuMemHostAlloc)                                                     \
  REQUIRED(cuMemFreeHost)                                                      \
  REQUIRED(cuMemAllocManaged)                                                  \
  REQUIRED(cuMemHostRegister_v2)                                               \
  REQUIRED(cuMemHostUnregister)                                                \
  REQUIRED(cuStreamCreate)                                                     \
  REQUIRED(cuStreamDestroy_v2)                                                 \
  REQUIRED(cuStreamSynchronize)                                                \
  REQUIRED(cuStreamQuery)                                                      \
  REQUIRED(cuStreamWaitEvent)                                                  \
  REQUIRED(cuStreamAddCallback)                                                \
  REQUIRED(cuEventCreate)                                                      \
  REQUIRED(cuEventRecord)                                                      \
  REQUIRED(cuEventQuery)                                                       \
  REQUIRED(cuEventSynchronize)                                                 \
  REQUIRED(cuEventDestroy_v2)                                                  \
  REQUIRED(cuMemHostGetDevicePointer_v2)                                       \
  REQUIRED(cuMemcpyHtoDAsync_v2)                                               \
  REQUIRED(cuMemcpyDtoHAsync_v2)                                               \
  REQUIRED(cuMemcpyDtoDAsync_v2)                                               \
  REQUIRED(cuMemcpyPeerAsync)                                                  \
  REQUIRED(cuMemsetD8Async)                                                    \
  OPTIONAL(cuGetErrorName)                                                     \
  OPTIONAL(cuGetErrorString)                                                   \
  OPTIONAL(cuMemAllocAsync)                                                    \
  OPTIONAL(cuMemFreeAsync)                                                     \
  OPTIONAL(cuDeviceGetDefaultMemPool)                                          \
  OPTIONAL(cuMemPoolSetAttribute)                                              \
  OPTIONAL(cuMemPoolTrimTo)                                                    \
  OPTIONAL(cuStreamWaitValue32_v2)                                             \
  OPTIONAL(cuModuleLoadData)                                                   \
  OPTIONAL(cuModuleGetFunction)                                                \
  OPTIONAL(cuModuleUnload)                                                     \
  OPTIONAL(cuLaunchKernel)                                                     \
  OPTIONAL(cuCtxGetFlags)

/* One pointer per entry point, typed by cuda.h's prototype of that symbol. */
typedef struct cuda_driver_api {
#define CUDA_API_FIELD_(symbol) __typeof__(symbol) *symbol;
  CUDA_ENTRY_POINTS(CUDA_API_FIELD_, CUDA_API_FIELD_)
#undef CUDA_API_FIELD_
} cuda_driver_api;

static const um__vendor_entry cuda_entry_points[] = {
#define CUDA_REQUIRED_(symbol) {#symbol, offsetof(cuda_driver_api, symbol), true},
#define CUDA_OPTIONAL_(symbol) {#symbol, offsetof(cuda_driver_api, symbol), false},
    CUDA_ENTRY_POINTS(CUDA_REQUIRED_, CUDA_OPTIONAL_)
#undef CUDA_REQUIRED_
#undef CUDA_OPTIONAL_
};

/* The entry points, filled once by driver_lib's load (read-only after),
 * and what cuInit said where it found no device. */
static cuda_driver_api driver_api;
static int driver_no_devices;         /* cuInit answered CUDA_ERROR_NO_DEVICE */
static char driver_no_device_reason[512];

/* cu->cuMemAlloc_v2(...) reads as the driver call it is. */
static const cuda_driver_api *const cu = &driver_api;

/* The one translation of a CUresult into a UM_E* code. With call != NULL it
 * also records the driver's error name for um_last_error(). Stream
 * callbacks pass call == NULL: they run on a driver thread where no CUDA
 * call is allowed, cuGetErrorName included. */
static int cuda_status(CUresult result, const char *call) {
  int status;
  const char *name = NULL;
  const char *text = NULL;

  switch (result) {
  case CUDA_SUCCESS:
    return UM_OK;
  case CUDA_ERROR_OUT_OF_MEMORY:
    status = UM_ENOMEM;
    break;
  case CUDA_ERROR_INVALID_VALUE:
    status = UM_EINVAL;
    break;
  case CUDA_ERROR_NO_DEVICE:
  case CUDA_ERROR_INVALID_DEVICE:
    status = UM_ENODEV;
    break;
  case CUDA_ERROR_NOT_SUPPORTED:
  case CUDA_ERROR_PEER_ACCESS_UNSUPPORTED:
  case CUDA_ERROR_TOO_MANY_PEERS: /* this pair cannot have peer access */
    status = UM_ENOTSUP;
    break;
  default:
    status = UM_EBACKEND;
    break;
  }
  if (call == NULL)
    return status;
  if (cu->cuGetErrorName == NULL || cu->cuGetErrorName(result, &name) != CUDA_SUCCESS)
    name = NULL;
  if (cu->cuGetErrorString == NULL ||
      cu->cuGetErrorString(result, &text) != CUDA_SUCCESS)
    text = NULL;
  if (name != NULL)
    return um__set_error(status, "cuda: %s failed: %s (%s)", call, name,
                         text != NULL ? text : "no description");
  return um__set_error(status, "cuda: %s failed: CUresult %d", call,
                       (int)result);
}

/* cuInit is per process, so it belongs to the one-time load. A machine
 * with the driver but no GPU is not an error: the backend offers zero
 * devices. A driver that cannot initialise (stub library, version
 * mismatch) gives no usable device either, so it reads as ENODEV. */
static int driver_init(um__vendor_lib *lib) {
  CUresult result = cu->cuInit(0);
  const char *text;
  if (result == CUDA_SUCCESS)
    return 0;
  cuda_status(result, "cuInit");
  if (result == CUDA_ERROR_NO_DEVICE) {
    driver_no_devices = 1;
    snprintf(driver_no_device_reason, sizeof(driver_no_device_reason), "%s (driver %s)", um_last_error(),
             lib->path);
    return 0;
  }
  /* The loader's message starts with "cuda: " already. */
  text = um_last_error();
  if (strncmp(text, "cuda: ", 6) == 0)
    text += 6;
  snprintf(lib->failure, sizeof(lib->failure), "%s (driver %s%s)", text, lib->path,
           result == CUDA_ERROR_STUB_LIBRARY ? ": the toolkit's stub library, not a driver" : "");
  return -1;
}

static const char *const driver_names[] = {"libcuda.so.1", NULL};

/* libcuda stays loaded for the process: the driver keeps threads that do
 * not survive dlclose. */
static um__vendor_lib driver_lib =
    UM__VENDOR_LIB_INIT("cuda", "UNIMEM_CUDA_LIBRARY", driver_names, cuda_entry_points, &driver_api, driver_init);

/* ------------------------------------------------------------------------ */
/* Devices                                                                   */

struct cuda_backend_state;
struct cuda_gate_slab;
struct cuda_gate_word;
struct cuda_device;
struct cuda_token;

/* The thread that reports the transfers of one of unimem's copy streams
 * (WATCH_H2D, WATCH_D2H, WATCH_LOCAL: one each, so that a long copy on one
 * stream does not hold back the reports of another's). A transfer records
 * its token's event and joins the queue, in the order of the stream; the
 * thread waits for each event asleep (watch_wait: the event is a
 * blocking-sync one; polling with cuEventQuery, as wait_spin_ns asks of
 * waiters, made a batch slower on an H100: the queries take the driver's
 * locks that the issuing thread needs), calls done and drops its
 * owner's reference. Not a stream callback: a callback (cuStreamAddCallback,
 * cuLaunchHostFunc) holds its stream until it has run on the driver's
 * thread, so every small copy behind another waited for a round trip
 * through the host -- 35 us per 4 KiB copy of a batch on an H100, against
 * 2.6 us for the copies alone. Started at the first transfer of its stream;
 * stopped when the device is released (every transfer has finished by
 * then). */
typedef struct cuda_watch {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  struct cuda_token *head, *tail;
  struct cuda_device *d;
  pthread_t thread;
  int ready;   /* lock and cond initialised */
  int running; /* thread started */
  int stop;
  /* Set by a push or a stop: what a watcher spinning for its next token
   * (wait_spin_ns) polls without the lock. */
  atomic_int poke;
} cuda_watch;

enum { WATCH_H2D, WATCH_D2H, WATCH_LOCAL, WATCH_COUNT };

#define CUDA_SPARE_EVENTS 32 /* per device */

typedef struct cuda_device {
  struct cuda_backend_state *owner;
  int ordinal;
  CUdevice device;
  CUcontext context; /* the primary context, retained while open */
  CUstream h2d_stream;
  CUstream d2h_stream;
  CUstream local_stream; /* D2D, FILL, PEER, stream-ordered allocation */
  CUstream caller_stream; /* the caller's (um_device_native): unimem queues
                             nothing on it but caller_marker's record */
  CUmemoryPool mem_pool; /* stream-ordered allocation only */
  int managed_memory;
  int stream_ordered_alloc;
  unsigned caps;
  unsigned locations;
  uint64_t real_total_bytes;
  uint64_t limit_bytes; /* opts->device_limit_bytes (0: none): the total
                           described; the core counts the bytes */
  uint32_t spin_ns;     /* opts->wait_spin_ns: blocking calls poll first */
  int driver_sleeps;    /* the context's scheduling is CU_CTX_SCHED_BLOCKING_SYNC:
                           the driver's own waits sleep (cuda_xfer) */
  char name[128];
  /* Interop (SPEC §8), under interop_lock: the lanes, the gates' host
   * words, and the gate kernel where gates spin in one. */
  pthread_mutex_t interop_lock;
  int interop_ready; /* interop_lock initialised */
  CUstream *lanes;
  int lane_count, lane_cap, lane_next;
  struct cuda_gate_slab *gate_slabs;
  struct cuda_gate_word *free_words;
  int gate_kernel; /* 1: gates spin in a kernel (no stream memory operations,
                      or UNIMEM_CUDA_GATE_KERNEL=1) */
  /* Gates queued and not opened yet, and the frees held meanwhile
   * (hold_free). */
  int gates_closed;
  struct cuda_held_free *held_frees;
  CUmodule gate_module;
  CUfunction gate_function;
  cuda_watch watch[WATCH_COUNT];
  /* Transfers' events, kept for reuse (cuEventCreate and cuEventDestroy
   * per small copy cost more than the copy's own call), under spare_lock. */
  pthread_mutex_t spare_lock;
  int spare_ready; /* spare_lock initialised */
  int spare_count;
  CUevent spare[CUDA_SPARE_EVENTS];
} cuda_device;

typedef struct cuda_backend_state {
  um_options opts; /* a copy, for logging */
  int count;
  cuda_device devices[];
} cuda_backend_state;

/* Every call makes the device's context current on the calling thread
 * (calls come from any thread; the current context is per thread), and
 * gives the thread its previous context back before returning: the
 * application may use CUDA on the same thread, and its current context --
 * for the runtime, its current device -- must not change under it. */
static int enter_context(const cuda_device *d, CUcontext *previous) {
  CUresult result = cu->cuCtxGetCurrent(previous);
  if (result != CUDA_SUCCESS)
    return cuda_status(result, "cuCtxGetCurrent");
  if (*previous == d->context)
    return UM_OK;
  result = cu->cuCtxSetCurrent(d->context);
  return result == CUDA_SUCCESS ? UM_OK
                                : cuda_status(result, "cuCtxSetCurrent");
}

static void leave_context(const cuda_device *d, CUcontext previous) {
  if (previous != d->context)
    cu->cuCtxSetCurrent(previous);
}

static void release_interop(cuda_device *d);

static void watch_stop(cuda_watch *w);

static void free_held(cuda_device *d);

/* Undo open_device() however far it got: the one cleanup path. Waits for
 * the device's work first so that destroying the streams loses nothing. */
static void release_device(cuda_device *d) {
  CUcontext previous = NULL;

  for (int i = 0; i < WATCH_COUNT; i++)
    watch_stop(&d->watch[i]);
  if (d->context != NULL && enter_context(d, &previous) == UM_OK) {
    cu->cuCtxSynchronize();
    /* Give the memory pool's cached blocks back to the device: the primary
     * context may outlive this manager. */
    if (d->stream_ordered_alloc && cu->cuMemPoolTrimTo != NULL)
      cu->cuMemPoolTrimTo(d->mem_pool, 0);
    if (d->h2d_stream != NULL)
      cu->cuStreamDestroy_v2(d->h2d_stream);
    if (d->d2h_stream != NULL)
      cu->cuStreamDestroy_v2(d->d2h_stream);
    if (d->local_stream != NULL)
      cu->cuStreamDestroy_v2(d->local_stream);
    if (d->caller_stream != NULL)
      cu->cuStreamDestroy_v2(d->caller_stream);
    release_interop(d);
    if (d->interop_ready) {
      d->gates_closed = 0; /* every gate was opened: the context is idle */
      free_held(d);
    }
    for (int i = 0; i < d->spare_count; i++)
      cu->cuEventDestroy_v2(d->spare[i]);
    d->spare_count = 0;
    leave_context(d, previous);
  }
  if (d->spare_ready)
    pthread_mutex_destroy(&d->spare_lock);
  d->spare_ready = 0;
  if (d->context != NULL)
    cu->cuDevicePrimaryCtxRelease_v2(d->device);
  if (d->interop_ready)
    pthread_mutex_destroy(&d->interop_lock);
  d->interop_ready = 0;
  d->h2d_stream = d->d2h_stream = d->local_stream = d->caller_stream = NULL;
  d->context = NULL;
}

static int env_flag(const char *name) {
  const char *value = getenv(name);
  return value != NULL && strtol(value, NULL, 10) != 0;
}

/* Stream-ordered allocation (UNIMEM_CUDA_ASYNC_ALLOC=1, where the driver and
 * the device support memory pools): DEVICE blocks come from the device's
 * default memory pool through cuMemAllocAsync on the local stream and go
 * back through cuMemFreeAsync. The pool's release threshold is raised to
 * the maximum so freed memory stays cached in the driver instead of being
 * unmapped at the next synchronisation: a miss in unimem's own pool then
 * costs a pool lookup in the driver, not a page-table update. Because the
 * other streams do not follow the local stream's order, mem_alloc waits for
 * the local stream before handing the block out. The cost: memory cached in
 * the driver's pool shows as used in cuMemGetInfo. Returns 1 when in use. */
static int enable_stream_ordered_alloc(cuda_device *d) {
  int supported = 0;
  cuuint64_t threshold = UINT64_MAX;

  if (cu->cuMemAllocAsync == NULL || cu->cuMemFreeAsync == NULL ||
      cu->cuDeviceGetDefaultMemPool == NULL || cu->cuMemPoolSetAttribute == NULL)
    return 0;
  if (cu->cuDeviceGetAttribute(&supported,
                              CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED,
                              d->device) != CUDA_SUCCESS ||
      !supported)
    return 0;
  if (cu->cuDeviceGetDefaultMemPool(&d->mem_pool, d->device) != CUDA_SUCCESS ||
      cu->cuMemPoolSetAttribute(d->mem_pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                               &threshold) != CUDA_SUCCESS)
    return 0;
  return 1;
}

/* Name, memory and attributes of d->device; *call names a failing call. */
static CUresult query_device(cuda_device *d, int ordinal, const char **call) {
  size_t total = 0;
  CUresult result;

  *call = "cuDeviceGet";
  result = cu->cuDeviceGet(&d->device, ordinal);
  if (result != CUDA_SUCCESS)
    return result;
  *call = "cuDeviceGetName";
  result = cu->cuDeviceGetName(d->name, (int)sizeof(d->name), d->device);
  if (result != CUDA_SUCCESS)
    return result;
  d->name[sizeof(d->name) - 1] = '\0';
  *call = "cuDeviceTotalMem_v2";
  result = cu->cuDeviceTotalMem_v2(&total, d->device);
  if (result != CUDA_SUCCESS)
    return result;
  d->real_total_bytes = total;
  *call = "cuDeviceGetAttribute";
  return cu->cuDeviceGetAttribute(&d->managed_memory, CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY, d->device);
}

static int gate_kernel_load(cuda_device *d);

/* Retain the primary context and make the streams in it, giving the thread
 * its current context back. */
static CUresult create_streams(cuda_device *d, const char **call) {
  CUcontext previous = NULL;
  CUresult result;

  *call = "cuDevicePrimaryCtxRetain";
  result = cu->cuDevicePrimaryCtxRetain(&d->context, d->device);
  if (result != CUDA_SUCCESS) {
    d->context = NULL;
    return result;
  }
  *call = "cuCtxGetCurrent";
  result = cu->cuCtxGetCurrent(&previous);
  if (result != CUDA_SUCCESS)
    return result;
  *call = "cuCtxSetCurrent";
  result = cu->cuCtxSetCurrent(d->context);
  if (result != CUDA_SUCCESS)
    return result;
  /* Non-blocking: the legacy default stream, which the application may use,
   * must not serialise unimem's transfers, nor the caller's stream. */
  *call = "cuStreamCreate";
  result = cu->cuStreamCreate(&d->h2d_stream, CU_STREAM_NON_BLOCKING);
  if (result == CUDA_SUCCESS)
    result = cu->cuStreamCreate(&d->d2h_stream, CU_STREAM_NON_BLOCKING);
  if (result == CUDA_SUCCESS)
    result = cu->cuStreamCreate(&d->local_stream, CU_STREAM_NON_BLOCKING);
  if (result == CUDA_SUCCESS)
    result = cu->cuStreamCreate(&d->caller_stream, CU_STREAM_NON_BLOCKING);
  /* How the driver's own waits wait: the primary context's scheduling is
   * the application's to set. Spin and yield (and auto, one of the two)
   * poll already; only blocking sync sleeps. */
  if (result == CUDA_SUCCESS) {
    unsigned flags = 0;
    d->driver_sleeps = cu->cuCtxGetFlags != NULL && cu->cuCtxGetFlags(&flags) == CUDA_SUCCESS &&
                       (flags & CU_CTX_SCHED_MASK) == CU_CTX_SCHED_BLOCKING_SYNC;
  }
  /* Gates that spin in a kernel (UNIMEM_CUDA_GATE_KERNEL=1, or a driver
   * without stream memory operations): the module now, while nothing is in
   * flight. Where that fails, the first gate says why. */
  if (result == CUDA_SUCCESS && (d->gate_kernel || cu->cuStreamWaitValue32_v2 == NULL) &&
      gate_kernel_load(d) != UM_OK)
    um__log(&d->owner->opts, UM_LOG_INFO, "cuda device %d: the gate kernel: %s", d->ordinal, um_last_error());
  cu->cuCtxSetCurrent(previous);
  return result;
}

static int open_device(cuda_backend_state *state, int ordinal,
                       int want_stream_ordered_alloc) {
  cuda_device *d = &state->devices[ordinal];
  const char *call = NULL;
  CUresult result;

  d->owner = state;
  d->ordinal = ordinal;
  d->limit_bytes = state->opts.device_limit_bytes;
  d->spin_ns = state->opts.wait_spin_ns;
  if (pthread_mutex_init(&d->interop_lock, NULL) != 0)
    return um__set_error(UM_ENOMEM, "cuda device %d: no mutex", ordinal);
  d->interop_ready = 1;
  d->gate_kernel = env_flag("UNIMEM_CUDA_GATE_KERNEL");
  for (int i = 0; i < WATCH_COUNT; i++) {
    cuda_watch *w = &d->watch[i];
    w->d = d;
    atomic_init(&w->poke, 0);
    if (pthread_mutex_init(&w->lock, NULL) != 0)
      return um__set_error(UM_ENOMEM, "cuda device %d: no mutex", ordinal);
    if (pthread_cond_init(&w->cond, NULL) != 0) {
      pthread_mutex_destroy(&w->lock);
      return um__set_error(UM_ENOMEM, "cuda device %d: no condition variable", ordinal);
    }
    w->ready = 1;
  }
  if (pthread_mutex_init(&d->spare_lock, NULL) != 0)
    return um__set_error(UM_ENOMEM, "cuda device %d: no mutex", ordinal);
  d->spare_ready = 1;

  result = query_device(d, ordinal, &call);
  if (result == CUDA_SUCCESS)
    result = create_streams(d, &call);
  if (result != CUDA_SUCCESS) {
    int status = cuda_status(result, call);
    release_device(d);
    return status;
  }

  if (want_stream_ordered_alloc) {
    d->stream_ordered_alloc = enable_stream_ordered_alloc(d);
    um__log(&state->opts, UM_LOG_INFO,
            "cuda device %d: stream-ordered allocation %s", ordinal,
            d->stream_ordered_alloc ? "on" : "not supported, using cuMemAlloc");
  }

  d->caps = UM_CAP_PINNED | UM_CAP_ASYNC;
  d->locations = (1u << UM_DEVICE) | (1u << UM_PINNED);
  if (d->managed_memory) {
    d->caps |= UM_CAP_UNIFIED;
    d->locations |= 1u << UM_UNIFIED;
  }
  return UM_OK;
}

static int cuda_open(const um_options *opts, void **ctx, int *count) {
  cuda_backend_state *state;
  int device_count = 0;
  int opened = 0;
  int status;
  int i, j;
  CUresult result;

  if (ctx == NULL || count == NULL)
    return um__set_error(UM_EINVAL, "cuda: open without ctx or count");
  status = um__vendor_lib_load(&driver_lib, UM_ENODEV);
  if (status != UM_OK)
    return status;
  if (!driver_no_devices) {
    result = cu->cuDeviceGetCount(&device_count);
    if (result != CUDA_SUCCESS)
      return cuda_status(result, "cuDeviceGetCount");
  }
  if (device_count == 0) {
    /* The reason stays in um_last_error(); the manager logs it. */
    um__set_error(UM_OK, "%s",
                  driver_no_devices ? driver_no_device_reason : "cuda: the driver reports no device");
    *ctx = NULL;
    *count = 0;
    return UM_OK;
  }

  state = calloc(1, sizeof(*state) + (size_t)device_count * sizeof(cuda_device));
  if (state == NULL)
    return um__set_error(UM_ENOMEM, "cuda: no memory for %d devices",
                         device_count);
  if (opts != NULL)
    state->opts = *opts;
  state->count = device_count;
  for (opened = 0; opened < device_count; opened++) {
    status = open_device(state, opened, env_flag("UNIMEM_CUDA_ASYNC_ALLOC"));
    if (status != UM_OK)
      goto fail;
  }

  /* UM_CAP_PEER: the device can reach at least one other device. */
  for (i = 0; i < device_count; i++) {
    for (j = 0; j < device_count; j++) {
      int can_access = 0;
      if (i == j)
        continue;
      result = cu->cuDeviceCanAccessPeer(&can_access, state->devices[i].device,
                                        state->devices[j].device);
      if (result == CUDA_SUCCESS && can_access) {
        state->devices[i].caps |= UM_CAP_PEER;
        break;
      }
    }
  }

  *ctx = state;
  *count = device_count;
  return UM_OK;

fail:
  for (i = 0; i < opened; i++)
    release_device(&state->devices[i]);
  free(state);
  return status;
}

static int cuda_describe(void *ctx, int i, um__bdev_desc *out) {
  cuda_backend_state *state = ctx;
  cuda_device *d;

  if (state == NULL || out == NULL || i < 0 || i >= state->count)
    return um__set_error(UM_EINVAL, "cuda: no device %d to describe", i);
  d = &state->devices[i];
  memset(out, 0, sizeof(*out));
  snprintf(out->name, sizeof(out->name), "%s", d->name);
  out->caps = d->caps;
  out->locations = d->locations;
  out->total_bytes = d->real_total_bytes;
  if (d->limit_bytes != 0 && d->limit_bytes < out->total_bytes)
    out->total_bytes = d->limit_bytes;
  out->bdev = d;
  return UM_OK;
}

static void cuda_close(void *ctx) {
  cuda_backend_state *state = ctx;
  int i;

  if (state == NULL)
    return;
  for (i = 0; i < state->count; i++)
    release_device(&state->devices[i]);
  free(state);
}

/* ------------------------------------------------------------------------ */
/* Memory                                                                    */

static int cuda_mem_alloc(void *bdev, um_location loc, size_t bytes,
                          um__mem *out) {
  cuda_device *d = bdev;
  CUdeviceptr address = 0;
  void *host = NULL;
  CUcontext previous = NULL;
  const char *call;
  CUresult result;
  int status;

  if ((unsigned)loc >= UM_LOCATION_COUNT || !(d->locations & (1u << loc)))
    return um__set_error(UM_ENOTSUP,
                         "cuda device %d (%s) cannot allocate location %d",
                         d->ordinal, d->name, (int)loc);
  status = enter_context(d, &previous);
  if (status != UM_OK)
    return status;

  switch (loc) {
  case UM_DEVICE:
    if (d->stream_ordered_alloc) {
      call = "cuMemAllocAsync";
      result = cu->cuMemAllocAsync(&address, bytes, d->local_stream);
      if (result == CUDA_SUCCESS) {
        call = "cuStreamSynchronize";
        result = cu->cuStreamSynchronize(d->local_stream);
        if (result != CUDA_SUCCESS)
          cu->cuMemFreeAsync(address, d->local_stream);
      }
    } else {
      call = "cuMemAlloc_v2";
      result = cu->cuMemAlloc_v2(&address, bytes);
    }
    break;
  case UM_PINNED:
    call = "cuMemHostAlloc";
    result = cu->cuMemHostAlloc(&host, bytes,
                               CU_MEMHOSTALLOC_PORTABLE |
                                   CU_MEMHOSTALLOC_DEVICEMAP);
    address = (CUdeviceptr)(uintptr_t)host;
    break;
  case UM_UNIFIED:
    call = "cuMemAllocManaged";
    result = cu->cuMemAllocManaged(&address, bytes, CU_MEM_ATTACH_GLOBAL);
    host = (void *)(uintptr_t)address;
    break;
  default: /* UM_HOST: excluded by locations above */
    leave_context(d, previous);
    return um__set_error(UM_ENOTSUP, "cuda: location %d", (int)loc);
  }
  leave_context(d, previous);
  if (result != CUDA_SUCCESS)
    return cuda_status(result, call);
  out->host = host;
  out->handle = (uintptr_t)address;
  out->priv = NULL;
  return UM_OK;
}

/* A free held while a gate was closed (hold_free). */
typedef struct cuda_held_free {
  um_location loc;
  size_t bytes;
  um__mem mem;
  struct cuda_held_free *next;
} cuda_held_free;

/* cuMemFree and cuMemFreeHost wait for the device's work ("may perform
 * implicit synchronization", and do), and a lane waiting at a closed gate
 * is work that waits for the host: for the gate's operation, which the
 * core runs on one of its workers once the operations it follows are
 * reported. A free on a worker or a watcher could then wait for itself.
 * While a gate of d is closed, its frees are held instead, and made when
 * the last gate opens (or at close). True when the free was held. */
static int hold_free(cuda_device *d, um_location loc, size_t bytes, const um__mem *mem) {
  cuda_held_free *h;
  int held = 0;
  /* cuMemFreeAsync waits for nothing, and HOST memory is never ours. */
  if (!d->interop_ready || (loc == UM_DEVICE && d->stream_ordered_alloc) || loc == UM_HOST)
    return 0;
  pthread_mutex_lock(&d->interop_lock);
  if (d->gates_closed > 0 && (h = malloc(sizeof(*h))) != NULL) {
    *h = (cuda_held_free){.loc = loc, .bytes = bytes, .mem = *mem, .next = d->held_frees};
    d->held_frees = h;
    held = 1;
  }
  pthread_mutex_unlock(&d->interop_lock);
  return held;
}

static void cuda_mem_free(void *bdev, um_location loc, size_t bytes, um__mem *mem);

/* Make the frees held on d, while no gate of d is closed; those left when
 * one closes again go back to wait for it. */
static void free_held(cuda_device *d) {
  for (;;) {
    cuda_held_free *h = NULL;
    pthread_mutex_lock(&d->interop_lock);
    if (d->gates_closed == 0 && (h = d->held_frees) != NULL)
      d->held_frees = h->next;
    pthread_mutex_unlock(&d->interop_lock);
    if (h == NULL)
      return;
    cuda_mem_free(d, h->loc, h->bytes, &h->mem);
    free(h);
  }
}

static void cuda_mem_free(void *bdev, um_location loc, size_t bytes,
                          um__mem *mem) {
  cuda_device *d = bdev;
  CUcontext previous = NULL;
  const char *call = NULL;
  CUresult result = CUDA_SUCCESS;
  int status;

  if (hold_free(d, loc, bytes, mem))
    return;
  status = enter_context(d, &previous);

  if (status == UM_OK) {
    switch (loc) {
    case UM_DEVICE:
      /* The core frees a block only once its transfers finished, so the
       * stream-ordered free needs no wait on the other streams. */
      if (d->stream_ordered_alloc) {
        call = "cuMemFreeAsync";
        result = cu->cuMemFreeAsync((CUdeviceptr)mem->handle, d->local_stream);
      } else {
        call = "cuMemFree_v2";
        result = cu->cuMemFree_v2((CUdeviceptr)mem->handle);
      }
      break;
    case UM_PINNED:
      call = "cuMemFreeHost";
      result = cu->cuMemFreeHost(mem->host);
      break;
    case UM_UNIFIED:
      call = "cuMemFree_v2";
      result = cu->cuMemFree_v2((CUdeviceptr)mem->handle);
      break;
    default: /* UM_HOST: never allocated here */
      break;
    }
    leave_context(d, previous);
    if (result != CUDA_SUCCESS)
      status = cuda_status(result, call);
  }
  /* A free cannot fail from the caller's view: the log says it did. */
  if (status != UM_OK)
    um__log(&d->owner->opts, UM_LOG_WARN, "freeing %zu bytes: %s", bytes,
            um_last_error());
}

static int cuda_host_register(void *bdev, void *host, size_t bytes,
                              um__mem *out) {
  cuda_device *d = bdev;
  CUcontext previous = NULL;
  CUresult result;
  int status = enter_context(d, &previous);

  if (status != UM_OK)
    return status;
  /* Portable: any context may DMA from it, as from PINNED blocks. */
  result = cu->cuMemHostRegister_v2(host, bytes, CU_MEMHOSTREGISTER_PORTABLE);
  leave_context(d, previous);
  if (result != CUDA_SUCCESS)
    return cuda_status(result, "cuMemHostRegister_v2");
  out->host = host;
  out->handle = (uintptr_t)host;
  out->priv = NULL;
  return UM_OK;
}

static void cuda_host_unregister(void *bdev, um__mem *mem) {
  cuda_device *d = bdev;
  CUcontext previous = NULL;
  CUresult result;
  int status = enter_context(d, &previous);

  if (status == UM_OK) {
    result = cu->cuMemHostUnregister(mem->host);
    leave_context(d, previous);
    if (result != CUDA_SUCCESS)
      status = cuda_status(result, "cuMemHostUnregister");
  }
  if (status != UM_OK)
    um__log(&d->owner->opts, UM_LOG_WARN, "unregistering host memory: %s",
            um_last_error());
}

static int cuda_memory(void *bdev, uint64_t *free_bytes,
                       uint64_t *total_bytes) {
  cuda_device *d = bdev;
  size_t free_now = 0, total_now = 0;
  uint64_t free_out, total_out;
  CUcontext previous = NULL;
  CUresult result;
  int status = enter_context(d, &previous);

  if (status != UM_OK)
    return status;
  result = cu->cuMemGetInfo_v2(&free_now, &total_now);
  leave_context(d, previous);
  if (result != CUDA_SUCCESS)
    return cuda_status(result, "cuMemGetInfo_v2");
  free_out = free_now;
  total_out = total_now;
  /* device_limit_bytes: the core caps these figures (um_device_memory). */
  if (free_bytes != NULL)
    *free_bytes = free_out;
  if (total_bytes != NULL)
    *total_bytes = total_out;
  return UM_OK;
}

static int cuda_synchronize(void *bdev) {
  cuda_device *d = bdev;
  CUcontext previous = NULL;
  CUresult result;
  int status = enter_context(d, &previous);

  if (status != UM_OK)
    return status;
  result = cu->cuCtxSynchronize();
  leave_context(d, previous);
  return result == CUDA_SUCCESS ? UM_OK
                                : cuda_status(result, "cuCtxSynchronize");
}

/* ------------------------------------------------------------------------ */
/* Transfers                                                                 */

static CUdeviceptr device_address(const um__mem *mem, size_t offset) {
  return (CUdeviceptr)mem->handle + (CUdeviceptr)offset;
}

/* Uploads, downloads and on-device work each have a stream, so a download
 * never waits behind an unrelated upload: the core's queues (queue_of), one
 * watcher each. */
static int cuda_queue_of(um__xfer_kind kind) {
  switch (kind) {
  case UM__XFER_H2D:
    return WATCH_H2D;
  case UM__XFER_D2H:
    return WATCH_D2H;
  default:
    return WATCH_LOCAL;
  }
}

static CUstream queue_stream(const cuda_device *d, int q) {
  return q == WATCH_H2D ? d->h2d_stream : q == WATCH_D2H ? d->d2h_stream : d->local_stream;
}

static CUstream stream_for(const cuda_device *d, um__xfer_kind kind) {
  return queue_stream(d, cuda_queue_of(kind));
}

/* Queue x on stream; the device's context is current. Pageable host memory
 * makes the driver copy through its own staging buffer before returning,
 * which is correct, only slower: the core stages pageable copies through
 * PINNED chunks itself when it cares. */
static int issue_xfer(cuda_device *d, const um__xfer *x, CUstream stream) {
  const cuda_device *src_device;
  const char *call;
  CUresult result;

  switch (x->kind) {
  case UM__XFER_H2D:
    call = "cuMemcpyHtoDAsync_v2";
    result = cu->cuMemcpyHtoDAsync_v2(device_address(x->dst, x->dst_off),
                                     x->host, x->bytes, stream);
    break;
  case UM__XFER_D2H:
    call = "cuMemcpyDtoHAsync_v2";
    result = cu->cuMemcpyDtoHAsync_v2(
        x->host, device_address(x->src, x->src_off), x->bytes, stream);
    break;
  case UM__XFER_D2D:
    call = "cuMemcpyDtoDAsync_v2";
    result = cu->cuMemcpyDtoDAsync_v2(device_address(x->dst, x->dst_off),
                                     device_address(x->src, x->src_off),
                                     x->bytes, stream);
    break;
  case UM__XFER_FILL:
    call = "cuMemsetD8Async";
    result = cu->cuMemsetD8Async(device_address(x->dst, x->dst_off), x->value,
                                x->bytes, stream);
    break;
  case UM__XFER_PEER:
    src_device = x->src_bdev;
    if (src_device == NULL)
      return um__set_error(UM_EINVAL, "cuda: peer copy without source device");
    call = "cuMemcpyPeerAsync";
    result = cu->cuMemcpyPeerAsync(
        device_address(x->dst, x->dst_off), d->context,
        device_address(x->src, x->src_off), src_device->context, x->bytes,
        stream);
    break;
  default:
    return um__set_error(UM_EINVAL, "cuda: unknown transfer kind %d",
                         (int)x->kind);
  }
  return result == CUDA_SUCCESS ? UM_OK : cuda_status(result, call);
}

/* Whether a stream has nothing left to run (any answer but NOT_READY ends
 * the spin: the synchronize that follows reports a failure). */
static int stream_idle(void *stream) { return cu->cuStreamQuery((CUstream)stream) != CUDA_ERROR_NOT_READY; }

static int cuda_xfer(void *bdev, const um__xfer *x) {
  cuda_device *d = bdev;
  CUstream stream = stream_for(d, x->kind);
  CUcontext previous = NULL;
  CUresult result;
  int status = enter_context(d, &previous);

  if (status != UM_OK)
    return status;
  status = issue_xfer(d, x, stream);
  if (status == UM_OK) {
    /* With wait_spin_ns, poll the stream first, where the driver's own
     * cuStreamSynchronize would sleep: how it waits is the context's
     * scheduling flag, the application's (the primary context is shared).
     * Under spin, yield or auto it polls already, and polling on top of it
     * with cuStreamQuery only took the driver's lock from it: 0.3-0.4 us
     * more per blocking 4 KiB copy on an H200. */
    if (d->driver_sleeps)
      um__spin_until(d->spin_ns, stream_idle, stream);
    result = cu->cuStreamSynchronize(stream);
    if (result != CUDA_SUCCESS)
      status = cuda_status(result, "cuStreamSynchronize");
  }
  leave_context(d, previous);
  return status;
}

/* ------------------------------------------------------------------------ */
/* Tokens                                                                    */

/* A gate's host word (below): page-locked, mapped for the device. */
typedef struct cuda_gate_word {
  uint32_t *host;
  CUdeviceptr device;
  struct cuda_gate_word *next_free;
} cuda_gate_word;

/* Every token the core holds -- of a transfer, a marker, a gate, a captured
 * caller's event, a caller marker -- is one of these, and its event was
 * recorded before the token left the backend: cuStreamWaitEvent captures an
 * event's state at the time of the call, and an event never recorded reads
 * as "nothing to wait for". Owners: the core's handle (until
 * native_release), and for transfers and markers the stream callback (until
 * it ran), for gates the opener (until gate_open); the last one frees it. */
typedef struct cuda_token {
  CUevent finished;
  um__done_fn done; /* transfers and markers */
  void *arg;
  atomic_int owners;
  cuda_device *gate_dev; /* gates: the device whose word it holds */
  cuda_gate_word *gate;
  uint32_t gate_value; /* gates: what gate_open writes into the word */
  struct cuda_token *next; /* in a watch queue */
  /* Transfers only (NULL for every other token): the device whose watcher,
   * not a stream callback, reports it, and whose spares take its event
   * from the last owner (the watcher may still wait on the event after
   * native_release). */
  cuda_device *dev;
  CUstream stream; /* transfers: where the event was recorded */
  atomic_int reported; /* transfers: done() was called, by the watcher or by
                          a spinning waiter (cuda_token_reap), whichever
                          set this first */
} cuda_token;

static void gate_word_put(cuda_device *d, cuda_gate_word *word);

/* A transfer's event: a spare one, or a new blocking-sync one (its watcher
 * sleeps in cuEventSynchronize); the context is current. Recording a
 * blocking-sync event costs the issuing thread 1.5-1.8 us more per copy
 * than a plain one on an H200, but nothing cheaper lets the watcher sleep:
 * making a stream of its own wait for a plain event on the device
 * (cuStreamWaitEvent) and sleeping behind that put a device-side wait into
 * a hardware queue the streams share (one of CUDA_DEVICE_MAX_CONNECTIONS,
 * which runs its streams' work in submission order): work queued after it
 * on any stream of that queue waited for the transfer, and a wait queued
 * before the watcher's (a gate, the caller's cuStreamWaitValue32) held the
 * watcher's report back until it opened. On an H100 with one connection
 * test_cuda_kernels_gpu hung that way; test_fakecuda_kernels'
 * a_report_never_waits_behind_a_shared_queue models it. */
static CUresult spare_event_get(cuda_device *d, CUevent *out) {
  pthread_mutex_lock(&d->spare_lock);
  if (d->spare_count > 0) {
    *out = d->spare[--d->spare_count];
    pthread_mutex_unlock(&d->spare_lock);
    return CUDA_SUCCESS;
  }
  pthread_mutex_unlock(&d->spare_lock);
  return cu->cuEventCreate(out, CU_EVENT_DISABLE_TIMING | CU_EVENT_BLOCKING_SYNC);
}

/* A transfer's event no owner refers to any more (its last record has
 * completed: the watcher waited for it, or a failed transfer synchronised
 * its stream); the context is current. */
static void spare_event_put(cuda_device *d, CUevent event) {
  pthread_mutex_lock(&d->spare_lock);
  if (d->spare_count < CUDA_SPARE_EVENTS) {
    d->spare[d->spare_count++] = event;
    event = NULL;
  }
  pthread_mutex_unlock(&d->spare_lock);
  if (event != NULL)
    cu->cuEventDestroy_v2(event);
}

/* Drop one owner; the last frees the token. A transfer's last owner
 * is the watcher or native_release, both with the context current, never a
 * driver thread. */
static void token_drop(cuda_token *token) {
  if (um__atomic_sub_acq_rel(&token->owners, 1) != 1)
    return;
  /* Never a gate in a stream callback (gates have no callback), where the
   * lock below would be a wait on a driver thread. */
  if (token->gate != NULL)
    gate_word_put(token->gate_dev, token->gate);
  if (token->dev != NULL)
    spare_event_put(token->dev, token->finished);
  free(token);
}

/* A token with a fresh event; the device's context is current. */
static int token_create(int owners, cuda_token **out) {
  cuda_token *token = calloc(1, sizeof(*token));
  CUresult result;

  if (token == NULL)
    return um__set_error(UM_ENOMEM, "cuda: no memory for a token");
  result = cu->cuEventCreate(&token->finished, CU_EVENT_DISABLE_TIMING);
  if (result != CUDA_SUCCESS) {
    free(token);
    return cuda_status(result, "cuEventCreate");
  }
  atomic_init(&token->owners, owners);
  *out = token;
  return UM_OK;
}

/* A transfer's token, reported by the watcher of stream, with a spare
 * event; the context is current. */
static int transfer_token_create(cuda_device *d, CUstream stream, cuda_token **out) {
  cuda_token *token = calloc(1, sizeof(*token));
  CUresult result;

  if (token == NULL)
    return um__set_error(UM_ENOMEM, "cuda: no memory for a token");
  result = spare_event_get(d, &token->finished);
  if (result != CUDA_SUCCESS) {
    free(token);
    return cuda_status(result, "cuEventCreate");
  }
  atomic_init(&token->owners, 2);
  token->dev = d;
  token->stream = stream;
  *out = token;
  return UM_OK;
}

/* A token that never left the backend; the context is current. */
static void token_discard(cuda_token *token) {
  if (token->dev != NULL)
    spare_event_put(token->dev, token->finished);
  else
    cu->cuEventDestroy_v2(token->finished);
  free(token);
}

/* Make stream wait for the tokens (NULL entries skipped). */
static int wait_tokens(CUstream stream, void *const *tokens, int n) {
  for (int i = 0; i < n; i++) {
    const cuda_token *before = tokens[i];
    CUresult result;
    /* A transfer recorded on this stream is behind the stream's order
     * already. */
    if (before == NULL || before->stream == stream)
      continue;
    result = cu->cuStreamWaitEvent(stream, before->finished, CU_EVENT_WAIT_DEFAULT);
    if (result != CUDA_SUCCESS)
      return cuda_status(result, "cuStreamWaitEvent");
  }
  return UM_OK;
}

/* Runs on a driver thread once a marker's lane reached it, or failed:
 * unlike cuLaunchHostFunc, a stream callback still runs after a device
 * error and receives it, so the core's event always completes. No CUDA
 * call is allowed here. (A marker's lane holds nothing else, so the
 * callback holding the lane costs nothing; transfers have watchers.) */
static void CUDA_CB marker_finished(CUstream stream, CUresult result, void *user) {
  cuda_token *token = user;
  (void)stream;
  token->done(token->arg, cuda_status(result, NULL));
  token_drop(token);
}

/* Record a marker's event on its lane, then have its done called after it
 * (a stream callback). */
static int record_and_call_back(cuda_token *token, CUstream lane) {
  CUresult result = cu->cuEventRecord(token->finished, lane);
  if (result != CUDA_SUCCESS)
    return cuda_status(result, "cuEventRecord");
  result = cu->cuStreamAddCallback(lane, marker_finished, token, 0);
  return result == CUDA_SUCCESS ? UM_OK : cuda_status(result, "cuStreamAddCallback");
}

/* Wait for a transfer's event, asleep (it is a blocking-sync event); the
 * driver's answer for it. A transfer a spinning waiter reported already
 * (cuda_token_reap saw its event complete) is not waited for: the answer
 * would go unused. The wait is the host's alone: nothing is queued on the
 * device for it (see spare_event_get). */
static CUresult watch_wait(const cuda_token *token) {
  if (atomic_load_explicit(&token->reported, memory_order_acquire) != 0)
    return CUDA_SUCCESS;
  return cu->cuEventSynchronize(token->finished);
}

static int watch_poked(void *arg) {
  cuda_watch *w = arg;
  return atomic_load_explicit(&w->poke, memory_order_relaxed);
}

static void *watch_main(void *arg) {
  cuda_watch *w = arg;
  cuda_device *d = w->d;

  /* Set once: the thread is unimem's and runs nothing else. It is no
   * stream callback, so the CUDA calls of a completion are allowed on it:
   * the core finishes the operations it reports right here rather than
   * waking a worker for each (one thread switch less per copy). */
  cu->cuCtxSetCurrent(d->context);
  um__thread_completes_inline();
  pthread_mutex_lock(&w->lock);
  for (;;) {
    cuda_token *token;
    CUresult result;
    int spun = 0;
    /* With wait_spin_ns the watcher first spins for the next token, once
     * per empty queue, then sleeps: a copy issued within the budget then
     * costs its issuer no futex wake (pthread_cond_signal with no waiter
     * makes no system call), nor the watcher a thread switch. */
    while (w->head == NULL && !w->stop) {
      if (d->spin_ns != 0 && !spun) {
        spun = 1;
        atomic_store_explicit(&w->poke, 0, memory_order_relaxed);
        pthread_mutex_unlock(&w->lock);
        um__spin_until(d->spin_ns, watch_poked, w);
        pthread_mutex_lock(&w->lock);
        continue;
      }
      UM__TEST_POINT(UM__TP_CUDA_WATCH_SLEEP, w);
      pthread_cond_wait(&w->cond, &w->lock);
    }
    if ((token = w->head) == NULL)
      break; /* stopped, and nothing left */
    if ((w->head = token->next) == NULL)
      w->tail = NULL;
    pthread_mutex_unlock(&w->lock);
    result = watch_wait(token);
    if (atomic_exchange(&token->reported, 1) == 0)
      token->done(token->arg, cuda_status(result, NULL));
    token_drop(token);
    pthread_mutex_lock(&w->lock);
  }
  pthread_mutex_unlock(&w->lock);
  return NULL;
}

/* Hand a recorded token to its watcher (started at its first). */
static int watch_push(cuda_watch *w, cuda_token *token) {
  int wake;

  pthread_mutex_lock(&w->lock);
  if (!w->running) {
    int err = pthread_create(&w->thread, NULL, watch_main, w);
    if (err != 0) {
      pthread_mutex_unlock(&w->lock);
      return um__set_error(UM_ENOMEM, "cuda device %d: no thread to watch a stream (%s)", w->d->ordinal,
                           strerror(err));
    }
    w->running = 1;
  }
  token->next = NULL;
  wake = w->head == NULL;
  if (w->tail != NULL)
    w->tail->next = token;
  else
    w->head = token;
  w->tail = token;
  atomic_store_explicit(&w->poke, 1, memory_order_relaxed);
  pthread_mutex_unlock(&w->lock);
  if (wake)
    pthread_cond_signal(&w->cond);
  return UM_OK;
}

static void watch_stop(cuda_watch *w) {
  if (!w->ready)
    return;
  pthread_mutex_lock(&w->lock);
  w->stop = 1;
  atomic_store_explicit(&w->poke, 1, memory_order_relaxed);
  pthread_mutex_unlock(&w->lock);
  pthread_cond_signal(&w->cond);
  if (w->running)
    pthread_join(w->thread, NULL);
  w->running = 0;
  pthread_cond_destroy(&w->cond);
  pthread_mutex_destroy(&w->lock);
  w->ready = 0;
}

static int start_marker(cuda_device *d, const um__xfer *x, void *const *after,
                        int nafter, um__done_fn done, void *arg, void **native);

/* A quiet transfer (a batch's run, op.c): queued on its kind's stream with
 * no event and no report; the queue mark the core queues behind the run
 * reports it, and a failure of it shows there (the driver's errors on a
 * stream are the context's, and stick). */
static int start_quiet(cuda_device *d, const um__xfer *x, int nafter) {
  CUcontext previous = NULL;
  int status;
  if (nafter != 0 || x->kind == UM__XFER_QUEUE_MARK)
    return um__set_error(UM_EINVAL, "cuda: a quiet transfer waits for nothing and moves something");
  if ((status = enter_context(d, &previous)) != UM_OK)
    return status;
  status = issue_xfer(d, x, stream_for(d, x->kind));
  leave_context(d, previous);
  return status;
}

static int cuda_xfer_async(void *bdev, const um__xfer *x, void *const *after,
                           int nafter, um__done_fn done, void *arg,
                           void **native) {
  cuda_device *d = bdev;
  CUstream stream;
  cuda_token *token = NULL;
  CUcontext previous = NULL;
  CUresult result;
  int issued = 0;
  int status;
  int q;

  if (x->kind == UM__XFER_MARKER)
    return start_marker(d, x, after, nafter, done, arg, native);
  if (done == NULL && native == NULL)
    return start_quiet(d, x, nafter);
  /* A queue mark: an event recorded on its queue's stream, reported by
   * that stream's watcher once everything queued there before it ran. */
  q = x->kind == UM__XFER_QUEUE_MARK ? x->queue : cuda_queue_of(x->kind);
  if (q < 0 || q >= WATCH_COUNT)
    return um__set_error(UM_EINVAL, "cuda: no queue %d", q);
  stream = queue_stream(d, q);
  status = enter_context(d, &previous);
  if (status != UM_OK)
    return status;
  status = wait_tokens(stream, after, nafter);
  if (status == UM_OK)
    status = transfer_token_create(d, stream, &token);
  if (status != UM_OK)
    goto fail;
  token->done = done;
  token->arg = arg;
  if (x->kind != UM__XFER_QUEUE_MARK) {
    status = issue_xfer(d, x, stream);
    if (status != UM_OK)
      goto fail;
    issued = 1;
  }
  result = cu->cuEventRecord(token->finished, stream);
  status = result == CUDA_SUCCESS ? watch_push(&d->watch[q], token) : cuda_status(result, "cuEventRecord");
  if (status != UM_OK)
    goto fail;
  leave_context(d, previous);
  *native = token;
  return UM_OK;

fail:
  /* On failure the caller may reuse its memory at once, so a transfer that
   * was queued must finish first. The sync's own result would only hide the
   * first failure. */
  if (issued)
    cu->cuStreamSynchronize(stream);
  if (token != NULL)
    token_discard(token);
  leave_context(d, previous);
  return status;
}

static void cuda_native_release(void *bdev, void *native) {
  cuda_device *d = bdev;
  cuda_token *token = native;
  CUcontext previous = NULL;

  if (token == NULL)
    return;
  /* cuEventDestroy on a pending event returns at once and the driver frees
   * it when it completes, so releasing before a marker's callback ran is
   * safe. A transfer's event stays until its watcher is done with it. */
  if (enter_context(d, &previous) == UM_OK) {
    if (token->dev == NULL)
      cu->cuEventDestroy_v2(token->finished);
    token_drop(token);
    leave_context(d, previous);
  } else {
    token_drop(token);
  }
}

/* ------------------------------------------------------------------------ */
/* Peers                                                                     */

/* cuStreamWaitEvent takes an event of any device or context. */
static int cuda_tokens_shared(void *a, void *b) {
  (void)a, (void)b;
  return 1;
}

static int cuda_peer_possible(void *a, void *b) {
  const cuda_device *from = a, *to = b;
  int can_access = 0;

  if (cu->cuDeviceCanAccessPeer(&can_access, from->device, to->device) !=
      CUDA_SUCCESS)
    return 0;
  return can_access != 0;
}

static int cuda_peer_enable(void *a, void *b) {
  cuda_device *from = a;
  const cuda_device *to = b;
  CUcontext previous = NULL;
  CUresult result;
  int status;

  if (!cuda_peer_possible(a, b))
    return um__set_error(UM_ENOTSUP,
                         "cuda device %d cannot access device %d's memory",
                         from->ordinal, to->ordinal);
  status = enter_context(from, &previous);
  if (status != UM_OK)
    return status;
  result = cu->cuCtxEnablePeerAccess(to->context, 0);
  leave_context(from, previous);
  if (result == CUDA_SUCCESS || result == CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED)
    return UM_OK;
  return cuda_status(result, "cuCtxEnablePeerAccess");
}

/* ------------------------------------------------------------------------ */
/* The caller's own device work (SPEC §8)                                    */

static void cuda_device_native(void *bdev, um_device_native *out) {
  const cuda_device *d = bdev;
  out->cu_device = d->ordinal;
  out->cu_context = d->context;
  out->cu_stream = d->caller_stream;
}

/* DEVICE and UNIFIED blocks are CUdeviceptrs; a PINNED block is host
 * memory mapped for the device (CU_MEMHOSTALLOC_DEVICEMAP), whose device
 * address the driver gives (the host address itself under unified
 * addressing, which is also what is left when the driver cannot say). */
static void cuda_mem_native(void *bdev, const um__mem *mem, um_location loc, um_buffer_native *out) {
  cuda_device *d = bdev;
  CUdeviceptr address = (CUdeviceptr)mem->handle;
  CUcontext previous = NULL;

  if (loc == UM_PINNED && enter_context(d, &previous) == UM_OK) {
    CUdeviceptr mapped = 0;
    if (cu->cuMemHostGetDevicePointer_v2(&mapped, mem->host, 0) == CUDA_SUCCESS)
      address = mapped;
    leave_context(d, previous);
  }
  out->cu_ptr = (uint64_t)address;
  out->offset = 0;
}

static void *cuda_token_native(void *bdev, void *token) {
  (void)bdev;
  return ((cuda_token *)token)->finished;
}

static int cuda_token_query(void *bdev, void *token) {
  cuda_device *d = bdev;
  CUcontext previous = NULL;
  CUresult result;
  if (enter_context(d, &previous) != UM_OK)
    return 0; /* not known: the waiter goes by the core's own state */
  result = cu->cuEventQuery(((cuda_token *)token)->finished);
  leave_context(d, previous);
  /* CUDA_ERROR_NOT_READY: still running; any other answer means the work
   * ended, and done() reports how. */
  return result != CUDA_ERROR_NOT_READY;
}

/* A spinning waiter's look at a token (token_reap): a transfer whose event
 * has completed is reported here unless its watcher got there first; the
 * watcher, awake later, then only drops its share. The waiter borrows the
 * core's share of the token meanwhile, so the token and its event live. */
static int cuda_token_reap(void *bdev, void *token_) {
  cuda_device *d = bdev;
  cuda_token *token = token_;
  CUcontext previous = NULL;
  CUresult result;
  if (enter_context(d, &previous) != UM_OK)
    return 0; /* not known: the waiter goes by the core's own state */
  result = cu->cuEventQuery(token->finished);
  if (result != CUDA_ERROR_NOT_READY && token->dev != NULL && atomic_exchange(&token->reported, 1) == 0)
    token->done(token->arg, cuda_status(result, NULL));
  leave_context(d, previous);
  return result != CUDA_ERROR_NOT_READY;
}

static int cuda_token_wait(void *bdev, void *token) {
  cuda_device *d = bdev;
  CUcontext previous = NULL;
  CUresult result;
  int status = enter_context(d, &previous);

  if (status != UM_OK)
    return status;
  result = cu->cuEventSynchronize(((cuda_token *)token)->finished);
  leave_context(d, previous);
  return result == CUDA_SUCCESS ? UM_OK : cuda_status(result, "cuEventSynchronize");
}

/* Lanes: private streams for the interop work that waits on tokens --
 * markers, captures of the caller's events, gates. One stream shared by all
 * of them would order each item after every earlier one, and an earlier
 * item may wait for a gate that opens only once a later item completed (a
 * bracket whose wait is a gate behind an operation that waits for another
 * bracket, which the caller ends later, on a stream of its own): a
 * deadlock. So an item takes a lane on which everything queued before has
 * completed (cuStreamQuery: CUDA_SUCCESS), and a new lane is made only when
 * every lane is busy: an item then waits for the tokens it names and for
 * nothing else. Lanes live until close. Called with interop_lock held (so
 * that nobody else queues on the lane meanwhile) and the context current. */
static int lane_take(cuda_device *d, CUstream *out) {
  CUstream lane = NULL;
  CUresult result;

  for (int i = 0; i < d->lane_count; i++) {
    int k = (d->lane_next + i) % d->lane_count;
    if (cu->cuStreamQuery(d->lanes[k]) == CUDA_SUCCESS) {
      d->lane_next = (k + 1) % d->lane_count;
      *out = d->lanes[k];
      return UM_OK;
    }
  }
  if (d->lane_count == d->lane_cap) {
    int cap = d->lane_cap > 0 ? 2 * d->lane_cap : 4;
    CUstream *lanes = realloc(d->lanes, (size_t)cap * sizeof(*lanes));
    if (lanes == NULL)
      return um__set_error(UM_ENOMEM, "cuda: no memory for %d lanes", cap);
    d->lanes = lanes;
    d->lane_cap = cap;
  }
  result = cu->cuStreamCreate(&lane, CU_STREAM_NON_BLOCKING);
  if (result != CUDA_SUCCESS)
    return cuda_status(result, "cuStreamCreate");
  d->lanes[d->lane_count++] = lane;
  *out = lane;
  return UM_OK;
}

/* The shape every lane item shares: a token of `owners` owners, queued by
 * `queue` under interop_lock (see lane_take), then handed out in *out, or
 * discarded when queueing failed. Called with the context current. */
typedef int (*lane_queue_fn)(cuda_device *d, cuda_token *token, const void *arg);

static int lane_item_new(cuda_device *d, int owners, lane_queue_fn queue, const void *arg, void **out) {
  cuda_token *token = NULL;
  int status = token_create(owners, &token);

  if (status != UM_OK)
    return status;
  pthread_mutex_lock(&d->interop_lock);
  status = queue(d, token, arg);
  pthread_mutex_unlock(&d->interop_lock);
  if (status != UM_OK)
    token_discard(token);
  else
    *out = token;
  return status;
}

/* UM__XFER_MARKER: done once the tokens of after[] and x->wait[] are. It
 * waits for exactly those on a lane of its own: the only ordering it adds
 * is "after its tokens", and since every token's event was recorded before
 * the token was handed out (the core never gives a marker a token of an
 * operation not yet queued), nothing it waits for is queued after it.
 * unimem's copy streams are not touched: the tokens may stand for the
 * caller's work on other streams. The core's references on x->wait[] may go
 * as soon as this returns: cuStreamWaitEvent captured them. */
typedef struct marker_args {
  const um__xfer *x;
  void *const *after;
  int nafter;
  um__done_fn done;
  void *arg;
} marker_args;

static int queue_marker(cuda_device *d, cuda_token *token, const void *arg) {
  const marker_args *a = arg;
  CUstream lane = NULL;
  int status;

  token->done = a->done;
  token->arg = a->arg;
  status = lane_take(d, &lane);
  if (status == UM_OK)
    status = wait_tokens(lane, a->after, a->nafter);
  if (status == UM_OK)
    status = wait_tokens(lane, a->x->wait, 2);
  if (status == UM_OK)
    status = record_and_call_back(token, lane);
  return status;
}

static int start_marker(cuda_device *d, const um__xfer *x, void *const *after,
                        int nafter, um__done_fn done, void *arg, void **native) {
  marker_args a = {x, after, nafter, done, arg};
  CUcontext previous = NULL;
  int status = enter_context(d, &previous);

  if (status != UM_OK)
    return status;
  status = lane_item_new(d, 2, queue_marker, &a, native);
  leave_context(d, previous);
  return status;
}

/* The caller's done event, captured: a lane waits for it and records a
 * token's own event. CUDA events are not reference-counted, so this is how
 * unimem stops referring to the caller's event when um_access_end returns:
 * the caller must have recorded it before the call and keep it until the
 * call returns, and may destroy or record it again afterwards. An event of
 * another context or device is fine: CUDA waits across devices. A handle
 * the driver does not know answers UM_EINVAL (cuEventQuery says neither
 * done nor pending); one whose work is done already (or that was never
 * recorded: an empty set of work) needs no wait. */
typedef struct capture_args {
  CUevent caller;
  int pending;
} capture_args;

static int queue_capture(cuda_device *d, cuda_token *captured, const void *arg) {
  const capture_args *a = arg;
  CUstream lane = NULL;
  CUresult result;
  int status = lane_take(d, &lane);

  if (status == UM_OK && a->pending &&
      (result = cu->cuStreamWaitEvent(lane, a->caller, CU_EVENT_WAIT_DEFAULT)) != CUDA_SUCCESS)
    status = cuda_status(result, "cuStreamWaitEvent");
  if (status == UM_OK && (result = cu->cuEventRecord(captured->finished, lane)) != CUDA_SUCCESS)
    status = cuda_status(result, "cuEventRecord");
  return status;
}

static int cuda_token_adopt(void *bdev, void *native, void **token) {
  cuda_device *d = bdev;
  capture_args a = {native, 0};
  CUcontext previous = NULL;
  CUresult result;
  int status = enter_context(d, &previous);

  if (status != UM_OK)
    return status;
  result = cu->cuEventQuery(a.caller);
  a.pending = result == CUDA_ERROR_NOT_READY;
  if (result != CUDA_SUCCESS && !a.pending) {
    cuda_status(result, "cuEventQuery");
    status = um__set_error(UM_EINVAL, "cuda: the done event is not a live CUevent (%s)", um_last_error());
  }
  if (status == UM_OK)
    status = lane_item_new(d, 1, queue_capture, &a, token);
  leave_context(d, previous);
  return status;
}

/* An event recorded on the caller's stream after what the caller queued
 * there so far. */
static int cuda_caller_marker(void *bdev, void **token) {
  cuda_device *d = bdev;
  cuda_token *marker = NULL;
  CUcontext previous = NULL;
  CUresult result;
  int status = enter_context(d, &previous);

  if (status != UM_OK)
    return status;
  status = token_create(1, &marker);
  if (status == UM_OK && (result = cu->cuEventRecord(marker->finished, d->caller_stream)) != CUDA_SUCCESS) {
    status = cuda_status(result, "cuEventRecord");
    token_discard(marker);
  }
  if (status == UM_OK)
    *token = marker;
  leave_context(d, previous);
  return status;
}

/* ------------------------------------------------------------------------ */
/* Gates                                                                     */

/* A gate is a token the host completes (gate_open), so that device work can
 * wait for work that runs on host threads. A lane waits on a page-locked
 * host word until it reaches the gate's value (cuStreamWaitValue32, cyclic
 * >=), then records the gate's event; gate_open writes the value. Each
 * gate on a word waits for the word's current value plus one, so words are
 * reused without a reset (a late wait of an earlier gate on the same word
 * still passes), and a word goes back to the free list only once both
 * owners are gone, gate_open's included: after its value was written.
 *
 * The driver cannot see this order (cuStreamWaitValue32's warning): a lane
 * blocked on a word must not hold up work that the word's writer waits
 * for. Nothing is queued behind the wait on its lane but the gate's record
 * (lanes, above); what the gate's opener waits for is on other streams.
 * Streams share the GPU's hardware queues (CUDA_DEVICE_MAX_CONNECTIONS, 8
 * by default). With one connection every stream's work runs in submission
 * order, so a gate blocks all device work queued after it, the caller's
 * too: what the opener waits for must be queued before the gate (seen on
 * an H100: the caller's kernel queued after the gate, whose event ends
 * the bracket the gated copy waits for, never ran; docs/guide.md states
 * it). scripts/gpu_check.sh runs the interop tests again with one
 * connection; the checks that queue such work after a gate skip there.
 *
 * Without stream memory operations (a driver older than their v2 entry
 * point, or one that answers CUDA_ERROR_NOT_SUPPORTED), and with
 * UNIMEM_CUDA_GATE_KERNEL=1, the lane runs a one-thread kernel that spins
 * on the same word through the device's mapping of it instead: the same
 * order, at the cost of a resident thread while the gate is closed. */

#define CUDA_GATE_SLAB_WORDS 1024 /* one 4 KiB page-locked page */

typedef struct cuda_gate_slab {
  struct cuda_gate_slab *next;
  void *host; /* cuMemHostAlloc: CUDA_GATE_SLAB_WORDS words */
  cuda_gate_word words[CUDA_GATE_SLAB_WORDS];
} cuda_gate_slab;

/* Spins until (int)(*word - value) >= 0; volatile loads go to the host
 * memory every time. */
static const char gate_ptx[] =
    ".version 6.0\n"
    ".target sm_50\n"
    ".address_size 64\n"
    "\n"
    ".visible .entry unimem_gate_wait(.param .u64 word, .param .u32 value)\n"
    "{\n"
    "  .reg .pred %p;\n"
    "  .reg .b32 %r<3>;\n"
    "  .reg .b64 %rd<2>;\n"
    "  ld.param.u64 %rd0, [word];\n"
    "  cvta.to.global.u64 %rd1, %rd0;\n"
    "  ld.param.u32 %r0, [value];\n"
    "SPIN:\n"
    "  ld.volatile.global.u32 %r1, [%rd1];\n"
    "  sub.s32 %r2, %r1, %r0;\n"
    "  setp.lt.s32 %p, %r2, 0;\n"
    "  @%p bra SPIN;\n"
    "  ret;\n"
    "}\n";

/* A new slab of words onto the free list; interop_lock held, context
 * current. */
static int gate_slab_new(cuda_device *d) {
  cuda_gate_slab *slab = calloc(1, sizeof(*slab));
  CUdeviceptr base = 0;
  CUresult result;

  if (slab == NULL)
    return um__set_error(UM_ENOMEM, "cuda: no memory for gate words");
  result = cu->cuMemHostAlloc(&slab->host, CUDA_GATE_SLAB_WORDS * sizeof(uint32_t),
                              CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP);
  if (result != CUDA_SUCCESS) {
    free(slab);
    return cuda_status(result, "cuMemHostAlloc (gate words)");
  }
  result = cu->cuMemHostGetDevicePointer_v2(&base, slab->host, 0);
  if (result != CUDA_SUCCESS) {
    cu->cuMemFreeHost(slab->host);
    free(slab);
    return cuda_status(result, "cuMemHostGetDevicePointer");
  }
  for (int i = 0; i < CUDA_GATE_SLAB_WORDS; i++) {
    slab->words[i].host = (uint32_t *)slab->host + i;
    slab->words[i].device = base + (CUdeviceptr)i * sizeof(uint32_t);
    slab->words[i].next_free = i + 1 < CUDA_GATE_SLAB_WORDS ? &slab->words[i + 1] : d->free_words;
  }
  d->free_words = &slab->words[0];
  slab->next = d->gate_slabs;
  d->gate_slabs = slab;
  return UM_OK;
}

static void gate_word_put(cuda_device *d, cuda_gate_word *word) {
  pthread_mutex_lock(&d->interop_lock);
  word->next_free = d->free_words;
  d->free_words = word;
  pthread_mutex_unlock(&d->interop_lock);
}

/* Load the gate kernel's module; the context is current. Loading a module
 * may wait for the work the context has in flight, so it is done where
 * nothing can be waiting for a gate: when the device is opened (or, for a
 * driver that answers CUDA_ERROR_NOT_SUPPORTED only at the first gate, at
 * that first gate). */
static int gate_kernel_load(cuda_device *d) {
  CUresult result;

  if (d->gate_function != NULL)
    return UM_OK;
  if (cu->cuModuleLoadData == NULL || cu->cuModuleGetFunction == NULL || cu->cuModuleUnload == NULL ||
      cu->cuLaunchKernel == NULL)
    return um__set_error(UM_ENOTSUP, "cuda device %d: the driver has neither stream memory operations nor "
                                     "kernel launches: device work cannot wait for host work",
                         d->ordinal);
  result = cu->cuModuleLoadData(&d->gate_module, gate_ptx);
  if (result != CUDA_SUCCESS) {
    d->gate_module = NULL;
    return cuda_status(result, "cuModuleLoadData (gate kernel)");
  }
  result = cu->cuModuleGetFunction(&d->gate_function, d->gate_module, "unimem_gate_wait");
  if (result != CUDA_SUCCESS) {
    cu->cuModuleUnload(d->gate_module);
    d->gate_module = NULL;
    d->gate_function = NULL;
    return cuda_status(result, "cuModuleGetFunction (gate kernel)");
  }
  return UM_OK;
}

/* Queue the gate kernel on lane; interop_lock held, context current. */
static int gate_kernel_launch(cuda_device *d, CUstream lane, const cuda_gate_word *word, uint32_t value) {
  CUdeviceptr address = word->device;
  void *params[2] = {&address, &value};
  CUresult result;
  int status = gate_kernel_load(d);

  if (status != UM_OK)
    return status;
  result = cu->cuLaunchKernel(d->gate_function, 1, 1, 1, 1, 1, 1, 0, lane, params, NULL);
  return result == CUDA_SUCCESS ? UM_OK : cuda_status(result, "cuLaunchKernel (gate kernel)");
}

/* Make lane wait until word reaches value; interop_lock held. */
static int gate_wait(cuda_device *d, CUstream lane, const cuda_gate_word *word, uint32_t value) {
  if (!d->gate_kernel && cu->cuStreamWaitValue32_v2 != NULL) {
    CUresult result = cu->cuStreamWaitValue32_v2(lane, word->device, value, CU_STREAM_WAIT_VALUE_GEQ);
    if (result != CUDA_ERROR_NOT_SUPPORTED)
      return result == CUDA_SUCCESS ? UM_OK : cuda_status(result, "cuStreamWaitValue32");
  }
  if (!d->gate_kernel)
    um__log(&d->owner->opts, UM_LOG_INFO,
            "cuda device %d: no stream memory operations: gates spin in a kernel", d->ordinal);
  d->gate_kernel = 1;
  return gate_kernel_launch(d, lane, word, value);
}

/* Take a word and queue the gate's wait and record on a lane; interop_lock
 * held. On failure after the wait was queued, the word is written so that
 * the lane does not stay blocked. */
static int gate_queue(cuda_device *d, cuda_token *gate, const void *unused) {
  (void)unused;
  CUstream lane = NULL;
  cuda_gate_word *word;
  CUresult result;
  int status = d->free_words != NULL ? UM_OK : gate_slab_new(d);

  if (status != UM_OK)
    return status;
  word = d->free_words;
  if ((status = lane_take(d, &lane)) != UM_OK)
    return status;
  gate->gate_value = __atomic_load_n(word->host, __ATOMIC_ACQUIRE) + 1;
  if ((status = gate_wait(d, lane, word, gate->gate_value)) != UM_OK)
    return status;
  d->free_words = word->next_free;
  result = cu->cuEventRecord(gate->finished, lane);
  if (result != CUDA_SUCCESS) {
    __atomic_store_n(word->host, gate->gate_value, __ATOMIC_RELEASE);
    word->next_free = d->free_words;
    d->free_words = word;
    return cuda_status(result, "cuEventRecord");
  }
  gate->gate_dev = d;
  gate->gate = word;
  d->gates_closed++;
  return UM_OK;
}

static int cuda_gate_new(void *bdev, void **token) {
  cuda_device *d = bdev;
  CUcontext previous = NULL;
  int status = enter_context(d, &previous);

  if (status != UM_OK)
    return status;
  status = lane_item_new(d, 2 /* the opener's and the caller's */, gate_queue, NULL, token);
  leave_context(d, previous);
  return status;
}

/* A CUDA event carries no failure: a gate opened with one still opens, and
 * the core's own event of the operation reports it. */
static void cuda_gate_open(void *bdev, void *token, int status) {
  cuda_token *gate = token;
  cuda_device *d = gate->gate_dev;
  int last;
  (void)bdev;
  (void)status;
  __atomic_store_n(gate->gate->host, gate->gate_value, __ATOMIC_RELEASE);
  pthread_mutex_lock(&d->interop_lock);
  last = --d->gates_closed == 0 && d->held_frees != NULL;
  pthread_mutex_unlock(&d->interop_lock);
  token_drop(gate); /* the opener's */
  if (last)
    free_held(d);
}

/* close: every gate was opened and every lane has finished (the context was
 * synchronised); the context is current. */
static void release_interop(cuda_device *d) {
  for (int i = 0; i < d->lane_count; i++)
    cu->cuStreamDestroy_v2(d->lanes[i]);
  free(d->lanes);
  d->lanes = NULL;
  d->lane_count = d->lane_cap = 0;
  if (d->gate_module != NULL)
    cu->cuModuleUnload(d->gate_module);
  d->gate_module = NULL;
  d->gate_function = NULL;
  while (d->gate_slabs != NULL) {
    cuda_gate_slab *slab = d->gate_slabs;
    d->gate_slabs = slab->next;
    cu->cuMemFreeHost(slab->host);
    free(slab);
  }
  d->free_words = NULL;
}

const um__backend um__backend_cuda = {
    .name = "cuda",
    .open = cuda_open,
    .describe = cuda_describe,
    .close = cuda_close,
    .mem_alloc = cuda_mem_alloc,
    .mem_free = cuda_mem_free,
    .host_register = cuda_host_register,
    .host_unregister = cuda_host_unregister,
    .memory = cuda_memory,
    .synchronize = cuda_synchronize,
    .xfer = cuda_xfer,
    .xfer_async = cuda_xfer_async,
    .native_release = cuda_native_release,
    .map = NULL,
    .unmap = NULL,
    .peer_possible = cuda_peer_possible,
    .peer_enable = cuda_peer_enable,
    .tokens_shared = cuda_tokens_shared,
    .device_native = cuda_device_native,
    .mem_native = cuda_mem_native,
    .token_native = cuda_token_native,
    .token_adopt = cuda_token_adopt,
    .gate_new = cuda_gate_new,
    .gate_open = cuda_gate_open,
    .caller_marker = cuda_caller_marker,
    .token_wait = cuda_token_wait,
    .token_query = cuda_token_query,
    .token_reap = cuda_token_reap,
    .adopt = NULL, /* SPEC §8 adopts OpenCL contexts only */
    /* No CUDA call is allowed in a stream callback. */
    .callbacks_reenter = 0,
    .queue_of = cuda_queue_of,
};
