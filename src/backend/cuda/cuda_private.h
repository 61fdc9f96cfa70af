/* What the files of backend/cuda/ share: the loaded entry points, the state, and
 * the functions one file defines for the others. */

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
 * context current for its duration (um__cuda_enter_context / um__cuda_leave_context): calls
 * come from any thread, and the current context is per thread.
 *
 * Memory: DEVICE = cuMemAlloc, PINNED = cuMemHostAlloc (portable, mapped),
 * UNIFIED = cuMemAllocManaged where the device has managed memory. HOST
 * belongs to the cpu backend. Unified virtual addressing (every 64-bit
 * Linux device) makes a pinned or managed block's host pointer also its
 * device address, so every block's handle is a CUdeviceptr.
 */
#ifndef UM_BACKEND_CUDA_PRIVATE_H
#define UM_BACKEND_CUDA_PRIVATE_H

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
  OPTIONAL(cuCtxGetFlags)                                                      \
  OPTIONAL(cuStreamGetCtx)

/* One pointer per entry point, typed by cuda.h's prototype of that symbol. */
typedef struct cuda_driver_api {
#define CUDA_API_FIELD_(symbol) __typeof__(symbol) *symbol;
  CUDA_ENTRY_POINTS(CUDA_API_FIELD_, CUDA_API_FIELD_)
#undef CUDA_API_FIELD_
} cuda_driver_api;

/* The entry points, filled once by um__cuda_driver_lib's load (load.c), read-only
 * afterwards. */
extern cuda_driver_api um__cuda_driver;

/* cu->cuMemAlloc_v2(...) reads as the driver call it is. */
__attribute__((unused)) static const cuda_driver_api *const cu = &um__cuda_driver;

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
 * through the host (docs/design.md, Decisions: "CUDA: a watcher thread per
 * copy stream"). Started at the first transfer of its stream;
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
/* Streams of the caller's that transfers may go to (um_queue_use): queue
 * WATCH_COUNT + i is adopted[i], with a watcher of its own. */
#define CUDA_CALLER_QUEUES 4
#define WATCH_ALL (WATCH_COUNT + CUDA_CALLER_QUEUES)

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
                           the driver's own waits sleep (um__cuda_xfer) */
  char name[128];
  /* Interop (um_access_*), under interop_lock: the lanes, the gates' host
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
  cuda_watch watch[WATCH_ALL];
  /* The caller's streams adopted (um__cuda_queue_adopt), nadopted of them
   * (added under interop_lock, published by nadopted, release); not
   * owned. */
  CUstream adopted[CUDA_CALLER_QUEUES];
  atomic_int nadopted;
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
                          a spinning waiter (um__cuda_token_reap), whichever
                          set this first */
} cuda_token;

/* What queues a lane item's work behind its token (interop.c, lane_item_new). */
typedef int (*lane_queue_fn)(cuda_device *d, cuda_token *token, const void *arg);

/* Shared by this folder's files. Entries of the backend table (load.c) say
 * "(table)": backend.h's um__backend says what each does. */

/* devices.c */
/* Make d's context current, the thread's previous one into *previous. */
int um__cuda_enter_context(const cuda_device *d, CUcontext *previous);
/* Give the thread back the context enter_context found current. */
void um__cuda_leave_context(const cuda_device *d, CUcontext previous);
/* After one driver call in d's context: the context back, and the call's
 * result as a status (what: the call's name, for the error text). */
int um__cuda_leave_with(const cuda_device *d, CUcontext previous, CUresult result, const char *what);
/* (table) Every device the driver reports. */
int um__cuda_open(const um_options *opts, void **ctx, int *count);
/* (table) */
int um__cuda_describe(void *ctx, int i, um__bdev_desc *out);
/* (table) */
void um__cuda_close(void *ctx);

/* gates.c */
/* Put a gate's host word back on d's free list. */
void um__cuda_gate_word_put(cuda_device *d, cuda_gate_word *word);
/* Load the gate kernel's module (at open); the context is current. */
int um__cuda_gate_kernel_load(cuda_device *d);
/* (table) */
int um__cuda_gate_new(void *bdev, void **token);
/* (table) */
void um__cuda_gate_open(void *bdev, void *token, int status);
/* At close: free the lanes, the gate slabs and the gate kernel's module. */
void um__cuda_release_interop(cuda_device *d);

/* interop.c */
/* (table) */
void um__cuda_device_native(void *bdev, um_device_native *out);
/* (table) */
void um__cuda_mem_native(void *bdev, const um__mem *mem, um_location loc, um_buffer_native *out);
/* (table) */
void *um__cuda_token_native(void *bdev, void *token);
/* (table) */
int um__cuda_token_query(void *bdev, void *token);
/* (table) A spinning waiter's look at a token: reports a completed transfer. */
int um__cuda_token_reap(void *bdev, void *token_);
/* (table) */
int um__cuda_token_wait(void *bdev, void *token);
/* A lane (private stream for interop work) with nothing left queued on it. */
int um__cuda_lane_take(cuda_device *d, CUstream *out);
/* A token of `owners` owners queued on a lane by queue, into *out. */
int um__cuda_lane_item_new(cuda_device *d, int owners, lane_queue_fn queue, const void *arg, void **out);
/* A MARKER: a token done once after[] and x's waits are. */
int um__cuda_start_marker(cuda_device *d, const um__xfer *x, void *const *after, int nafter, um__done_fn done,
                          void *arg, void **native);
/* (table) */
int um__cuda_token_adopt(void *bdev, void *native, void **token);
/* (table) A stream of the caller's as one more queue. */
int um__cuda_queue_adopt(void *bdev, void *native, int *q);
/* (table) An event recorded on the caller's stream. */
int um__cuda_caller_marker(void *bdev, void **token);

/* load.c */
/* cuInit answered CUDA_ERROR_NO_DEVICE, and what it said then. */
extern int um__cuda_driver_no_devices;
extern char um__cuda_driver_no_device_reason[512];
/* The one translation of a CUresult into a UM_E* code (call: for um_last_error()). */
int um__cuda_status(CUresult result, const char *call);
/* libcuda, loaded once for the process. */
extern um__vendor_lib um__cuda_driver_lib;

/* memory.c */
/* (table) */
int um__cuda_mem_alloc(void *bdev, um_location loc, size_t bytes, um__mem *out);
/* Make the frees held on d while a gate of d was closed. */
void um__cuda_free_held(cuda_device *d);
/* (table) */
void um__cuda_mem_free(void *bdev, um_location loc, size_t bytes, um__mem *mem);
int um__cuda_mem_carve(void *bdev, um_location loc, const um__mem *seg, size_t off, size_t bytes, um__mem *out);
void um__cuda_mem_uncarve(void *bdev, um_location loc, um__mem *mem);
/* (table) */
int um__cuda_host_register(void *bdev, void *host, size_t bytes, um__mem *out);
/* (table) */
void um__cuda_host_unregister(void *bdev, um__mem *mem);
/* (table) */
int um__cuda_memory(void *bdev, uint64_t *free_bytes, uint64_t *total_bytes);
/* (table) */
int um__cuda_synchronize(void *bdev);
/* (table) cuStreamWaitEvent takes an event of any device or context. */
int um__cuda_tokens_shared(void *a, void *b);
/* (table) */
int um__cuda_peer_possible(void *a, void *b);
/* (table) */
int um__cuda_peer_enable(void *a, void *b);

/* transfers.c */
/* The copy stream (WATCH_*) of a transfer kind. */
int um__cuda_queue_of(um__xfer_kind kind);
/* (table) */
int um__cuda_xfer(void *bdev, const um__xfer *x);
/* Drop one owner of token; the last frees it. */
void um__cuda_token_drop(cuda_token *token);
/* A token with a fresh event; the device's context is current. */
int um__cuda_token_create(int owners, cuda_token **out);
/* Free a token that never left the backend; the context is current. */
void um__cuda_token_discard(cuda_token *token);
/* Make stream wait for the tokens (NULL entries skipped). */
int um__cuda_wait_tokens(CUstream stream, void *const *tokens, int n);
/* Record a marker's event on its lane, then call its done after it. */
int um__cuda_record_and_call_back(cuda_token *token, CUstream lane);
/* Stop w's watcher thread (at release; every transfer has finished). */
void um__cuda_watch_stop(cuda_watch *w);
/* (table) */
int um__cuda_xfer_async(void *bdev, const um__xfer *x, void *const *after, int nafter, um__done_fn done, void *arg,
                    void **native);
/* (table) */
void um__cuda_native_release(void *bdev, void *native);

#endif
