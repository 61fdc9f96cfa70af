/* A stand-in for libcuda.so.1, for tests on machines without a GPU.
 *
 * It exports, by the driver's own ABI names, the subset of the CUDA driver
 * API that src/backend/cuda/ loads, and emulates it on host memory:
 * device memory is malloc()ed, copies are memcpy. Including cuda.h makes
 * the compiler hold every definition here to the real prototype and to the
 * real exported name (cuMemAlloc is defined as cuMemAlloc_v2, and so on).
 *
 * It is strict where the real driver is strict, so that the backend's
 * mistakes show: calls without a current context, a stream used under
 * another context, device ranges outside any allocation, double frees, and
 * any driver call made from inside a stream callback (counted, answered
 * CUDA_ERROR_NOT_PERMITTED) all fail. Events: recording one on a stream of
 * another context fails, an unknown or destroyed event answers
 * CUDA_ERROR_INVALID_HANDLE, and a wait on an event that was never recorded
 * (which the real driver silently treats as done) is counted. Memory: two
 * operations of different streams that run at the same time over the same
 * bytes, one of them writing, and memory freed while an operation uses it,
 * are counted as races (fake_cuda_count("races")): an ordering bug shows
 * even where the bytes happen to come out right.
 *
 * Kernels: a PTX image is read for its .entry names and parameter lists,
 * each of which must be a kernel of fake_kernels.c's registry (C functions
 * with the same parameters), so the same PTX runs here and on a GPU.
 *
 * Streams run their work inside the issuing call, until an operation would
 * have to wait (an event not complete yet, a cuStreamWaitValue32 on a word
 * the host has not written, the gate kernel): from then on the stream has a
 * thread of its own, as a GPU would, and runs its queue in order.
 *
 * Environment, read at cuInit unless noted:
 *   FAKE_CUDA_NO_DEVICE=1       cuInit answers CUDA_ERROR_NO_DEVICE
 *   FAKE_CUDA_DEVICE_COUNT=n    devices (1..4, default 1), peers of each other
 *   FAKE_CUDA_TOTAL_MEM=bytes   memory per device (default 256 MiB)
 *   FAKE_CUDA_NO_MANAGED=1      no managed memory
 *   FAKE_CUDA_NO_MEMOPS=1       cuStreamWaitValue32 answers
 *                               CUDA_ERROR_NOT_SUPPORTED, as where stream
 *                               memory operations are off
 *   FAKE_CUDA_STREAM_THREADS=1  each stream runs its work on its own thread,
 *                               as a GPU would, instead of inside the call
 *   FAKE_CUDA_OP_DELAY_US=n     each copy, fill or kernel takes n more
 *                               microseconds
 *   FAKE_CUDA_CONNECTIONS=1     every stream of a context on one hardware
 *                               queue, as CUDA_DEVICE_MAX_CONNECTIONS=1
 *                               makes it on a GPU: a device-side wait that
 *                               is not met when it is queued (an event not
 *                               complete, a cuStreamWaitValue32 on a word
 *                               not written, the gate kernel) holds every
 *                               operation queued after it, on any stream of
 *                               the context, until it has run
 *   FAKE_CUDA_FAIL=symbol       (read per call) that entry point answers
 *                               FAKE_CUDA_FAIL_CODE (default 999, UNKNOWN)
 *   FAKE_CUDA_DEVICE_FAULT=symbol (read per call) copies issued through that
 *                               entry point fail on the "device": the stream
 *                               turns to CUDA_ERROR_LAUNCH_FAILED
 *
 * Build once as libfakecuda_full.so, and once with -DFAKE_CUDA_OMIT_MEMALLOC
 * (no cuMemAlloc_v2) as libfakecuda_missing.so. fake_cuda_count() lets a
 * test check that everything it made was given back, and
 * fake_cuda_forget_current() that the backend sets its context itself.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda.h>

#include "fake_kernels.h"

#define FAKE_MAX_DEVICES 4

/* ------------------------------------------------------------------------ */
/* State                                                                     */

struct CUctx_st {
  int ordinal;
  int retains;                          /* primary context refcount */
  int peer_enabled[FAKE_MAX_DEVICES];   /* this context may reach device i */
};

struct CUevent_st {
  struct CUctx_st *ctx; /* the context current at cuEventCreate */
  uint64_t recorded;    /* generation of the last cuEventRecord */
  uint64_t completed;   /* generation the stream has reached */
  unsigned flags;       /* cuEventCreate's */
  CUresult error;       /* the recording stream's failure, once reached:
                           cuEventSynchronize and cuEventQuery answer it,
                           as the driver answers a device fault */
  int refs;             /* the handle, and each queued op naming it */
  struct CUevent_st *next_live; /* live handles (not destroyed) */
};

struct CUfunc_st {
  struct CUmod_st *module;
  const fake_kernel *kernel;
};

struct CUmod_st {
  struct CUctx_st *ctx;
  int nfuncs;
  struct CUfunc_st funcs[FAKE_MODULE_MAX_ENTRIES];
  struct CUmod_st *next;
};

typedef enum {
  OP_COPY,
  OP_SET,
  OP_RECORD,
  OP_WAIT,
  OP_WAIT_VALUE,
  OP_KERNEL,
  OP_CALLBACK,
  OP_FREE
} fake_op_kind;

typedef struct fake_op {
  fake_op_kind kind;
  void *dst;
  const void *src;
  size_t bytes;
  unsigned char value;
  int device_fault;
  struct CUevent_st *event;
  uint64_t generation;
  CUstreamCallback callback;
  void *user;
  CUdeviceptr address;  /* OP_FREE */
  const uint32_t *word; /* OP_WAIT_VALUE: wait for word, as wait_flags say */
  uint32_t wait_value;
  unsigned wait_flags;
  fake_launch launch; /* OP_KERNEL */
  struct fake_op *next;
  /* FAKE_CUDA_CONNECTIONS=1: the order of submission over every stream,
   * and, for a wait not met when queued, its place in held_waits. */
  uint64_t seq;
  const struct CUctx_st *ctx;
  int held;
  struct fake_op *held_next;
} fake_op;

/* Memory an operation is using right now, for the race check. */
typedef struct fake_active {
  fake_range range;
  const struct CUstream_st *stream;
  const char *what;
  struct fake_active *next;
} fake_active;

struct CUstream_st {
  struct CUctx_st *ctx;
  fake_op *head, *tail; /* queued work, head running (threaded mode) */
  CUresult error;       /* sticky, as after a device fault */
  int threaded;
  int inline_running; /* operations running inside issuing calls: queued
                         ones start after them, as submitted later */
  int stopping;
  pthread_t worker;
  struct CUstream_st *next;
};

struct CUmemPoolHandle_st {
  int ordinal;
  cuuint64_t release_threshold;
};

typedef enum { MEM_DEVICE, MEM_HOST, MEM_MANAGED, MEM_REGISTERED } fake_mem_kind;

typedef struct fake_alloc {
  uintptr_t base;
  size_t bytes;
  fake_mem_kind kind;
  int ordinal;
  struct fake_alloc *next;
} fake_alloc;

/* One lock and one condition for everything: a fake need not scale. */
static pthread_mutex_t fake_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t fake_changed = PTHREAD_COND_INITIALIZER;

static int initialized;
static int device_count = 1;
static size_t total_memory = (size_t)256 << 20;
static int managed_memory = 1;
static int stream_threads;
static struct CUctx_st contexts[FAKE_MAX_DEVICES];
static struct CUmemPoolHandle_st pools[FAKE_MAX_DEVICES];
static size_t device_used[FAKE_MAX_DEVICES];
static int memops = 1;
static fake_alloc *allocations;
static struct CUstream_st *streams;
static struct CUevent_st *live_event_list;
static struct CUmod_st *modules;
static fake_active *active;
static int host_waits_held; /* fake_cuda_hold_host_waits */
static int one_queue;          /* FAKE_CUDA_CONNECTIONS=1 */
static uint64_t submit_seq;    /* one_queue: operations queued so far */
static fake_op *held_waits;    /* one_queue: waits not met, queued, not run */

static _Thread_local struct CUctx_st *current_context;
static _Thread_local int in_callback;
/* The calling thread's share of host_waits ("host_waits_here"): a test
 * that asks whether issuing work waited for the device must not count the
 * waits of the library's own threads (its stream watchers). */
static _Thread_local long host_waits_here;

static atomic_long live_streams, live_events, stream_ordered_allocs,
    calls_in_callbacks, callbacks_run, live_modules, kernels_run, races,
    unrecorded_waits, host_waits, wait_values, host_allocs, kernels_waiting, event_records, blocking_records,
    spinning_waits, stream_queries, stream_waits;

/* ------------------------------------------------------------------------ */
/* Helpers                                                                   */

static long env_long(const char *name, long fallback) {
  const char *value = getenv(name);
  return value != NULL && value[0] != '\0' ? strtol(value, NULL, 0) : fallback;
}

static int env_names(const char *name, const char *symbol) {
  const char *value = getenv(name);
  return value != NULL && strcmp(value, symbol) == 0;
}

/* Every entry point starts here: no driver call from a callback, nothing
 * before cuInit, and the injected failure. */
static CUresult enter(const char *symbol) {
  if (in_callback) {
    atomic_fetch_add(&calls_in_callbacks, 1);
    fprintf(stderr, "fake_cuda: %s called from a stream callback\n", symbol);
    return CUDA_ERROR_NOT_PERMITTED;
  }
  if (!initialized && strcmp(symbol, "cuInit") != 0)
    return CUDA_ERROR_NOT_INITIALIZED;
  if (env_names("FAKE_CUDA_FAIL", symbol))
    return (CUresult)env_long("FAKE_CUDA_FAIL_CODE", CUDA_ERROR_UNKNOWN);
  return CUDA_SUCCESS;
}

#define ENTER(symbol)                                                          \
  do {                                                                         \
    CUresult entered_ = enter(symbol);                                         \
    if (entered_ != CUDA_SUCCESS)                                              \
      return entered_;                                                         \
  } while (0)

#define NEED_CONTEXT()                                                         \
  do {                                                                         \
    if (current_context == NULL || current_context->retains <= 0)              \
      return CUDA_ERROR_INVALID_CONTEXT;                                       \
  } while (0)

static int valid_device(CUdevice dev) { return dev >= 0 && dev < device_count; }

static int valid_context(const struct CUctx_st *ctx) {
  return ctx != NULL && ctx >= contexts && ctx < contexts + device_count &&
         ctx->retains > 0;
}

/* The stream exists and belongs to the current context. Called locked. */
static CUresult check_stream(const struct CUstream_st *stream) {
  const struct CUstream_st *s;
  for (s = streams; s != NULL; s = s->next)
    if (s == stream)
      return s->ctx == current_context ? CUDA_SUCCESS
                                       : CUDA_ERROR_INVALID_CONTEXT;
  return CUDA_ERROR_INVALID_HANDLE;
}

/* [address, address + bytes) lies in memory the device can reach. */
static int device_range(CUdeviceptr address, size_t bytes) {
  const fake_alloc *a;
  int ok = 0;
  pthread_mutex_lock(&fake_lock);
  for (a = allocations; a != NULL; a = a->next)
    if (address >= a->base && bytes <= a->bytes &&
        address - a->base <= a->bytes - bytes) {
      ok = 1;
      break;
    }
  pthread_mutex_unlock(&fake_lock);
  return ok;
}

static void *track(size_t bytes, fake_mem_kind kind, void *existing) {
  fake_alloc *a = malloc(sizeof(*a));
  void *memory = existing != NULL ? existing : malloc(bytes);
  if (a == NULL || memory == NULL) {
    free(a);
    if (existing == NULL)
      free(memory);
    return NULL;
  }
  /* Fresh device memory is not zero on a GPU either. */
  if (existing == NULL)
    memset(memory, 0xA5, bytes);
  a->base = (uintptr_t)memory;
  a->bytes = bytes;
  a->kind = kind;
  a->ordinal = current_context != NULL ? current_context->ordinal : 0;
  pthread_mutex_lock(&fake_lock);
  a->next = allocations;
  allocations = a;
  if (kind == MEM_DEVICE || kind == MEM_MANAGED)
    device_used[a->ordinal] += bytes;
  pthread_mutex_unlock(&fake_lock);
  return memory;
}

static int overlap(const fake_range *a, const fake_range *b) {
  return a->bytes > 0 && b->bytes > 0 && a->base < b->base + b->bytes && b->base < a->base + a->bytes;
}

/* Called locked: count a race with the operations running now. */
static void race_locked(const char *what, const char *other) {
  atomic_fetch_add(&races, 1);
  fprintf(stderr, "fake_cuda: race: %s while %s runs on another stream over the same bytes\n", what,
          other);
}

/* An operation of stream starts using ranges (nodes: its storage, one per
 * range): a race with every running operation of another stream that uses
 * the same bytes, either of them writing. */
static void activate(const struct CUstream_st *stream, const fake_range *ranges, int n, const char *what,
                     fake_active *nodes) {
  pthread_mutex_lock(&fake_lock);
  for (int i = 0; i < n; i++) {
    for (const fake_active *a = active; a != NULL; a = a->next)
      if (a->stream != stream && (a->range.write || ranges[i].write) && overlap(&a->range, &ranges[i]))
        race_locked(what, a->what);
    nodes[i] = (fake_active){ranges[i], stream, what, active};
    active = &nodes[i];
  }
  pthread_mutex_unlock(&fake_lock);
}

static void deactivate(fake_active *nodes, int n) {
  pthread_mutex_lock(&fake_lock);
  for (int i = 0; i < n; i++)
    for (fake_active **link = &active; *link != NULL; link = &(*link)->next)
      if (*link == &nodes[i]) {
        *link = nodes[i].next;
        break;
      }
  pthread_mutex_unlock(&fake_lock);
}

/* Forget the allocation starting at base whose kind is in kinds (bit
 * mask); free its memory unless registered. 0 when there is none. Memory
 * that an operation is still using is a race (a use after free). */
static int untrack(uintptr_t base, unsigned kinds) {
  fake_alloc **link, *a = NULL;
  pthread_mutex_lock(&fake_lock);
  for (link = &allocations; *link != NULL; link = &(*link)->next)
    if ((*link)->base == base && (kinds & (1u << (*link)->kind))) {
      fake_range whole;
      a = *link;
      *link = a->next;
      if (a->kind == MEM_DEVICE || a->kind == MEM_MANAGED)
        device_used[a->ordinal] -= a->bytes;
      whole = (fake_range){a->base, a->bytes, 1};
      for (const fake_active *r = active; r != NULL; r = r->next)
        if (overlap(&r->range, &whole))
          race_locked("a free", r->what);
      break;
    }
  pthread_mutex_unlock(&fake_lock);
  if (a == NULL)
    return 0;
  if (a->kind != MEM_REGISTERED)
    free((void *)a->base);
  free(a);
  return 1;
}

static int reserve_check(size_t bytes) {
  size_t used;
  pthread_mutex_lock(&fake_lock);
  used = device_used[current_context->ordinal];
  pthread_mutex_unlock(&fake_lock);
  return bytes <= total_memory - used;
}

/* ------------------------------------------------------------------------ */
/* Streams                                                                   */

static void event_drop_locked(struct CUevent_st *event) {
  if (--event->refs == 0) {
    free(event);
    atomic_fetch_sub(&live_events, 1);
  }
}

/* Called locked: event is a handle cuEventCreate gave and cuEventDestroy
 * has not taken back. Only the pointer is compared: a stale or garbage
 * handle is never read. */
static int event_live_locked(const struct CUevent_st *event) {
  for (const struct CUevent_st *e = live_event_list; e != NULL; e = e->next_live)
    if (e == event)
      return 1;
  return 0;
}

/* Called locked: whether cuStreamWaitValue32's condition holds. */
static int wait_value_met(const fake_op *op) {
  uint32_t now = __atomic_load_n(op->word, __ATOMIC_ACQUIRE);
  switch (op->wait_flags) {
  case CU_STREAM_WAIT_VALUE_EQ:
    return now == op->wait_value;
  case CU_STREAM_WAIT_VALUE_AND:
    return (now & op->wait_value) != 0;
  default: /* CU_STREAM_WAIT_VALUE_GEQ, cyclic */
    return (int32_t)(now - op->wait_value) >= 0;
  }
}

/* Called locked: whether a wait of op's context queued before op is still
 * held (FAKE_CUDA_CONNECTIONS=1; never otherwise). */
static int held_in_queue(const fake_op *op) {
  for (const fake_op *w = held_waits; w != NULL; w = w->held_next)
    if (w != op && w->ctx == op->ctx && w->seq < op->seq)
      return 1;
  return 0;
}

/* Called locked: the operation would have to wait to run now, for what it
 * waits for itself. */
static int would_block_itself(const fake_op *op) {
  switch (op->kind) {
  case OP_WAIT:
    return op->event->completed < op->generation;
  case OP_WAIT_VALUE:
    return !wait_value_met(op);
  case OP_KERNEL:
    return op->launch.kernel->ready != NULL && !op->launch.kernel->ready(&op->launch);
  default:
    return 0;
  }
}

/* Called locked: the operation would have to wait to run now. */
static int would_block(const fake_op *op) { return would_block_itself(op) || held_in_queue(op); }

/* Called locked, after op has run: it holds nothing any more. */
static void unhold_locked(fake_op *op) {
  fake_op **p = &held_waits;
  if (!op->held)
    return;
  while (*p != op)
    p = &(*p)->held_next;
  *p = op->held_next;
  op->held = 0;
}

static void pause_us(long us) {
  struct timespec pause = {us / 1000000, (us % 1000000) * 1000};
  nanosleep(&pause, NULL);
}

static void op_delay(void) {
  long delay_us = env_long("FAKE_CUDA_OP_DELAY_US", 0);
  if (delay_us > 0)
    pause_us(delay_us);
}

static void fault_locked(struct CUstream_st *stream, CUresult error) {
  if (stream->error == CUDA_SUCCESS)
    stream->error = error;
}

/* A copy or a fill: its bytes are in use for the whole (delayed) run. */
static void run_transfer(struct CUstream_st *stream, fake_op *op, CUresult error) {
  fake_range ranges[2] = {{(uintptr_t)op->dst, op->bytes, 1}, {(uintptr_t)op->src, op->bytes, 0}};
  fake_active nodes[2];
  int n = op->kind == OP_COPY ? 2 : 1;
  activate(stream, ranges, n, op->kind == OP_COPY ? "a copy" : "a fill", nodes);
  op_delay();
  if (error != CUDA_SUCCESS) {
    /* a failed stream runs nothing more */
  } else if (op->device_fault) {
    pthread_mutex_lock(&fake_lock);
    fault_locked(stream, CUDA_ERROR_LAUNCH_FAILED);
    pthread_mutex_unlock(&fake_lock);
  } else if (op->kind == OP_COPY) {
    memmove(op->dst, op->src, op->bytes);
  } else {
    memset(op->dst, op->value, op->bytes);
  }
  deactivate(nodes, n);
}

/* A kernel: checks that its memory is the device's (else the stream
 * faults, as on a GPU), and uses that memory from the start, through the
 * wait of a kernel that is not ready yet (the gate kernel, spin_fill), to
 * the end of its run. */
static void run_kernel(struct CUstream_st *stream, fake_op *op, CUresult error) {
  const fake_kernel *k = op->launch.kernel;
  fake_range ranges[FAKE_KERNEL_MAX_RANGES];
  fake_active nodes[FAKE_KERNEL_MAX_RANGES];
  int n = k->ranges(&op->launch, ranges);
  for (int i = 0; i < n && error == CUDA_SUCCESS; i++)
    if (ranges[i].bytes > 0 && !device_range(ranges[i].base, ranges[i].bytes)) {
      fprintf(stderr, "fake_cuda: kernel %s: parameter memory outside the device's\n", k->name);
      error = CUDA_ERROR_ILLEGAL_ADDRESS;
      pthread_mutex_lock(&fake_lock);
      fault_locked(stream, error);
      pthread_mutex_unlock(&fake_lock);
    }
  activate(stream, ranges, n, k->name, nodes);
  if (error == CUDA_SUCCESS && k->ready != NULL && !k->ready(&op->launch)) {
    atomic_fetch_add(&kernels_waiting, 1);
    while (!k->ready(&op->launch))
      pause_us(50);
    atomic_fetch_sub(&kernels_waiting, 1);
  }
  op_delay();
  if (error == CUDA_SUCCESS)
    k->run(&op->launch);
  deactivate(nodes, n);
  atomic_fetch_add(&kernels_run, 1);
}

static void run_op(struct CUstream_st *stream, fake_op *op) {
  CUresult error;

  pthread_mutex_lock(&fake_lock);
  error = stream->error;
  pthread_mutex_unlock(&fake_lock);
  switch (op->kind) {
  case OP_COPY:
  case OP_SET:
    run_transfer(stream, op, error);
    break;
  case OP_KERNEL:
    run_kernel(stream, op, error);
    break;
  case OP_RECORD:
    pthread_mutex_lock(&fake_lock);
    if (op->event->completed < op->generation) {
      op->event->completed = op->generation;
      if (error != CUDA_SUCCESS)
        op->event->error = error;
    }
    event_drop_locked(op->event);
    pthread_cond_broadcast(&fake_changed);
    pthread_mutex_unlock(&fake_lock);
    break;
  case OP_WAIT:
    pthread_mutex_lock(&fake_lock);
    while (op->event->completed < op->generation)
      pthread_cond_wait(&fake_changed, &fake_lock);
    event_drop_locked(op->event);
    pthread_mutex_unlock(&fake_lock);
    break;
  case OP_WAIT_VALUE:
    /* The host writes the word without a driver call: poll it. */
    while (!wait_value_met(op))
      pause_us(50);
    break;
  case OP_CALLBACK:
    in_callback = 1;
    op->callback(stream, error, op->user);
    in_callback = 0;
    atomic_fetch_add(&callbacks_run, 1);
    break;
  case OP_FREE:
    untrack((uintptr_t)op->address, 1u << MEM_DEVICE);
    break;
  }
}

static void *stream_worker(void *arg) {
  struct CUstream_st *stream = arg;
  pthread_mutex_lock(&fake_lock);
  for (;;) {
    fake_op *op;
    while ((stream->head == NULL && !stream->stopping) || stream->inline_running > 0 ||
           (stream->head != NULL && held_in_queue(stream->head)))
      pthread_cond_wait(&fake_changed, &fake_lock);
    if (stream->head == NULL)
      break;
    op = stream->head;
    pthread_mutex_unlock(&fake_lock);
    run_op(stream, op);
    pthread_mutex_lock(&fake_lock);
    unhold_locked(op);
    stream->head = op->next;
    if (stream->head == NULL)
      stream->tail = NULL;
    free(op);
    pthread_cond_broadcast(&fake_changed);
  }
  pthread_mutex_unlock(&fake_lock);
  return NULL;
}

/* Queue op on stream: run now, inside the call, unless the stream has a
 * thread already or op would have to wait; then the stream gets a thread of
 * its own (for good) and op goes to the end of its queue. */
static CUresult enqueue(struct CUstream_st *stream, const fake_op *model) {
  fake_op *op = malloc(sizeof(*op));
  if (op == NULL)
    return CUDA_ERROR_OUT_OF_MEMORY;
  *op = *model;
  op->next = NULL;
  pthread_mutex_lock(&fake_lock);
  op->ctx = stream->ctx;
  op->seq = ++submit_seq;
  if (one_queue && would_block_itself(op)) {
    op->held = 1;
    op->held_next = held_waits;
    held_waits = op;
  }
  if (!stream->threaded && !would_block(op)) {
    stream->inline_running++;
    pthread_mutex_unlock(&fake_lock);
    run_op(stream, op);
    free(op);
    pthread_mutex_lock(&fake_lock);
    stream->inline_running--;
    pthread_cond_broadcast(&fake_changed);
    pthread_mutex_unlock(&fake_lock);
    return CUDA_SUCCESS;
  }
  if (!stream->threaded) {
    if (pthread_create(&stream->worker, NULL, stream_worker, stream) != 0) {
      unhold_locked(op);
      pthread_mutex_unlock(&fake_lock);
      free(op);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    stream->threaded = 1;
  }
  if (stream->tail != NULL)
    stream->tail->next = op;
  else
    stream->head = op;
  stream->tail = op;
  pthread_cond_broadcast(&fake_changed);
  pthread_mutex_unlock(&fake_lock);
  return CUDA_SUCCESS;
}

static CUresult stream_usable(CUstream stream) {
  CUresult result;
  NEED_CONTEXT();
  pthread_mutex_lock(&fake_lock);
  result = check_stream(stream);
  pthread_mutex_unlock(&fake_lock);
  return result;
}

static CUresult enqueue_copy(const char *symbol, void *dst, const void *src,
                             size_t bytes, CUstream stream) {
  fake_op op = {0};
  CUresult result = stream_usable(stream);
  if (result != CUDA_SUCCESS)
    return result;
  op.kind = OP_COPY;
  op.dst = dst;
  op.src = src;
  op.bytes = bytes;
  op.device_fault = env_names("FAKE_CUDA_DEVICE_FAULT", symbol);
  return enqueue(stream, &op);
}

/* ------------------------------------------------------------------------ */
/* Initialisation, errors, devices                                           */

CUresult CUDAAPI cuInit(unsigned int Flags) {
  long count;
  ENTER("cuInit");
  if (Flags != 0)
    return CUDA_ERROR_INVALID_VALUE;
  if (env_long("FAKE_CUDA_NO_DEVICE", 0))
    return CUDA_ERROR_NO_DEVICE;
  count = env_long("FAKE_CUDA_DEVICE_COUNT", 1);
  device_count = count < 1 ? 1 : count > FAKE_MAX_DEVICES ? FAKE_MAX_DEVICES
                                                          : (int)count;
  total_memory = (size_t)env_long("FAKE_CUDA_TOTAL_MEM", (long)total_memory);
  managed_memory = !env_long("FAKE_CUDA_NO_MANAGED", 0);
  memops = !env_long("FAKE_CUDA_NO_MEMOPS", 0);
  stream_threads = (int)env_long("FAKE_CUDA_STREAM_THREADS", 0) != 0;
  one_queue = env_long("FAKE_CUDA_CONNECTIONS", 0) == 1;
  for (int i = 0; i < FAKE_MAX_DEVICES; i++) {
    contexts[i].ordinal = i;
    pools[i].ordinal = i;
  }
  initialized = 1;
  return CUDA_SUCCESS;
}

static const struct {
  CUresult code;
  const char *name;
  const char *text;
} error_table[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED",
     "initialization error"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE",
     "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE",
     "invalid device ordinal"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT",
     "invalid device context"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE",
     "invalid resource handle"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED",
     "operation not supported"},
    {CUDA_ERROR_NOT_PERMITTED, "CUDA_ERROR_NOT_PERMITTED",
     "operation not permitted"},
    {CUDA_ERROR_LAUNCH_FAILED, "CUDA_ERROR_LAUNCH_FAILED",
     "unspecified launch failure"},
    {CUDA_ERROR_PEER_ACCESS_UNSUPPORTED, "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED",
     "peer access is not supported between these two devices"},
    {CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED,
     "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED",
     "peer access is already enabled"},
    {CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
     "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
     "part or all of the requested memory range is already mapped"},
    {CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED,
     "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
     "pointer does not correspond to a registered memory region"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {CUDA_ERROR_INVALID_PTX, "CUDA_ERROR_INVALID_PTX", "a PTX JIT compilation failed"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS",
     "an illegal memory access was encountered"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

static CUresult error_lookup(CUresult error, const char **name,
                             const char **text) {
  for (size_t i = 0; i < sizeof(error_table) / sizeof(error_table[0]); i++)
    if (error_table[i].code == error) {
      if (name != NULL)
        *name = error_table[i].name;
      if (text != NULL)
        *text = error_table[i].text;
      return CUDA_SUCCESS;
    }
  return CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuGetErrorName(CUresult error, const char **pStr) {
  if (in_callback)
    return enter("cuGetErrorName");
  if (pStr == NULL)
    return CUDA_ERROR_INVALID_VALUE;
  *pStr = NULL;
  return error_lookup(error, pStr, NULL);
}

CUresult CUDAAPI cuGetErrorString(CUresult error, const char **pStr) {
  if (in_callback)
    return enter("cuGetErrorString");
  if (pStr == NULL)
    return CUDA_ERROR_INVALID_VALUE;
  *pStr = NULL;
  return error_lookup(error, NULL, pStr);
}

CUresult CUDAAPI cuDeviceGetCount(int *count) {
  ENTER("cuDeviceGetCount");
  if (count == NULL)
    return CUDA_ERROR_INVALID_VALUE;
  *count = device_count;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGet(CUdevice *device, int ordinal) {
  ENTER("cuDeviceGet");
  if (device == NULL)
    return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(ordinal))
    return CUDA_ERROR_INVALID_DEVICE;
  *device = ordinal;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetName(char *name, int len, CUdevice dev) {
  ENTER("cuDeviceGetName");
  if (name == NULL || len <= 0)
    return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev))
    return CUDA_ERROR_INVALID_DEVICE;
  snprintf(name, (size_t)len, "Fake CUDA Device %d", dev);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
  ENTER("cuDeviceTotalMem_v2");
  if (bytes == NULL)
    return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev))
    return CUDA_ERROR_INVALID_DEVICE;
  *bytes = total_memory;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib,
                                      CUdevice dev) {
  ENTER("cuDeviceGetAttribute");
  if (pi == NULL)
    return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev))
    return CUDA_ERROR_INVALID_DEVICE;
  switch (attrib) {
  case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY:
    *pi = managed_memory;
    break;
  case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED:
  case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
    *pi = 1;
    break;
  default:
    *pi = 0;
    break;
  }
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceCanAccessPeer(int *canAccessPeer, CUdevice dev,
                                       CUdevice peerDev) {
  ENTER("cuDeviceCanAccessPeer");
  if (canAccessPeer == NULL)
    return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev) || !valid_device(peerDev))
    return CUDA_ERROR_INVALID_DEVICE;
  *canAccessPeer = dev != peerDev;
  return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------------ */
/* Contexts                                                                  */

CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
  ENTER("cuDevicePrimaryCtxRetain");
  if (pctx == NULL)
    return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev))
    return CUDA_ERROR_INVALID_DEVICE;
  pthread_mutex_lock(&fake_lock);
  contexts[dev].retains++;
  pthread_mutex_unlock(&fake_lock);
  *pctx = &contexts[dev];
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  CUresult result = CUDA_SUCCESS;
  ENTER("cuDevicePrimaryCtxRelease_v2");
  if (!valid_device(dev))
    return CUDA_ERROR_INVALID_DEVICE;
  pthread_mutex_lock(&fake_lock);
  if (contexts[dev].retains <= 0)
    result = CUDA_ERROR_INVALID_CONTEXT;
  else if (--contexts[dev].retains == 0)
    memset(contexts[dev].peer_enabled, 0, sizeof(contexts[dev].peer_enabled));
  pthread_mutex_unlock(&fake_lock);
  return result;
}

CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx) {
  ENTER("cuCtxSetCurrent");
  if (ctx != NULL && !valid_context(ctx))
    return CUDA_ERROR_INVALID_CONTEXT;
  current_context = ctx;
  return CUDA_SUCCESS;
}

/* The scheduling flags of every context: FAKE_CUDA_CTX_FLAGS, else 0
 * (CU_CTX_SCHED_AUTO, the driver's default). */
CUresult CUDAAPI cuCtxGetFlags(unsigned int *flags) {
  ENTER("cuCtxGetFlags");
  NEED_CONTEXT();
  if (flags == NULL)
    return CUDA_ERROR_INVALID_VALUE;
  *flags = (unsigned)env_long("FAKE_CUDA_CTX_FLAGS", 0);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamGetCtx(CUstream hStream, CUcontext *pctx) {
  CUresult result;
  ENTER("cuStreamGetCtx");
  if (pctx == NULL)
    return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&fake_lock);
  result = check_stream(hStream);
  if (result == CUDA_SUCCESS)
    *pctx = hStream->ctx;
  pthread_mutex_unlock(&fake_lock);
  return result;
}

CUresult CUDAAPI cuCtxGetCurrent(CUcontext *pctx) {
  ENTER("cuCtxGetCurrent");
  if (pctx == NULL)
    return CUDA_ERROR_INVALID_VALUE;
  *pctx = current_context;
  return CUDA_SUCCESS;
}

/* Under fake_lock: wait until no stream of the current context has work
 * queued or running. */
static void context_idle_locked(void) {
  const struct CUstream_st *s;
  int busy;
  do {
    busy = 0;
    for (s = streams; s != NULL; s = s->next)
      if (s->ctx == current_context && (s->head != NULL || s->inline_running > 0))
        busy = 1;
    if (busy)
      pthread_cond_wait(&fake_changed, &fake_lock);
  } while (busy);
}

/* Wait until the current context's streams are idle (the implicit
 * synchronization of a free). */
static void context_idle(void) {
  pthread_mutex_lock(&fake_lock);
  context_idle_locked();
  pthread_mutex_unlock(&fake_lock);
}

CUresult CUDAAPI cuCtxSynchronize(void) {
  const struct CUstream_st *s;
  CUresult result = CUDA_SUCCESS;
  ENTER("cuCtxSynchronize");
  NEED_CONTEXT();
  atomic_fetch_add(&host_waits, 1);
  host_waits_here++;
  pthread_mutex_lock(&fake_lock);
  context_idle_locked();
  for (s = streams; s != NULL; s = s->next)
    if (s->ctx == current_context && s->error != CUDA_SUCCESS)
      result = s->error;
  pthread_mutex_unlock(&fake_lock);
  return result;
}

CUresult CUDAAPI cuCtxEnablePeerAccess(CUcontext peerContext,
                                       unsigned int Flags) {
  CUresult result = CUDA_SUCCESS;
  ENTER("cuCtxEnablePeerAccess");
  NEED_CONTEXT();
  if (Flags != 0 || !valid_context(peerContext))
    return CUDA_ERROR_INVALID_VALUE;
  if (peerContext == current_context)
    return CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
  pthread_mutex_lock(&fake_lock);
  if (current_context->peer_enabled[peerContext->ordinal])
    result = CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
  else
    current_context->peer_enabled[peerContext->ordinal] = 1;
  pthread_mutex_unlock(&fake_lock);
  return result;
}

/* ------------------------------------------------------------------------ */
/* Memory                                                                    */

CUresult CUDAAPI cuMemGetInfo_v2(size_t *free, size_t *total) {
  ENTER("cuMemGetInfo_v2");
  NEED_CONTEXT();
  if (free == NULL || total == NULL)
    return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&fake_lock);
  *free = total_memory - device_used[current_context->ordinal];
  pthread_mutex_unlock(&fake_lock);
  *total = total_memory;
  return CUDA_SUCCESS;
}

#ifndef FAKE_CUDA_OMIT_MEMALLOC
CUresult CUDAAPI cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) {
  void *memory;
  ENTER("cuMemAlloc_v2");
  NEED_CONTEXT();
  if (dptr == NULL || bytesize == 0)
    return CUDA_ERROR_INVALID_VALUE;
  if (!reserve_check(bytesize))
    return CUDA_ERROR_OUT_OF_MEMORY;
  memory = track(bytesize, MEM_DEVICE, NULL);
  if (memory == NULL)
    return CUDA_ERROR_OUT_OF_MEMORY;
  *dptr = (CUdeviceptr)(uintptr_t)memory;
  return CUDA_SUCCESS;
}
#endif

/* Like the driver's, a free of memory from cuMemAlloc (and of page-locked
 * memory, cuMemFreeHost) waits for the device's work first (the driver
 * documents that it "may perform implicit synchronization", and does): a
 * caller that frees on a thread the device's work waits for deadlocks here
 * as it would on a GPU. */
CUresult CUDAAPI cuMemFree_v2(CUdeviceptr dptr) {
  ENTER("cuMemFree_v2");
  NEED_CONTEXT();
  context_idle();
  return untrack((uintptr_t)dptr, (1u << MEM_DEVICE) | (1u << MEM_MANAGED))
             ? CUDA_SUCCESS
             : CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuMemHostAlloc(void **pp, size_t bytesize,
                                unsigned int Flags) {
  void *memory;
  ENTER("cuMemHostAlloc");
  NEED_CONTEXT();
  if (pp == NULL || bytesize == 0 ||
      (Flags & ~(unsigned)(CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP |
                           CU_MEMHOSTALLOC_WRITECOMBINED)) != 0)
    return CUDA_ERROR_INVALID_VALUE;
  memory = track(bytesize, MEM_HOST, NULL);
  if (memory == NULL)
    return CUDA_ERROR_OUT_OF_MEMORY;
  atomic_fetch_add(&host_allocs, 1);
  *pp = memory;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemFreeHost(void *p) {
  ENTER("cuMemFreeHost");
  NEED_CONTEXT();
  context_idle(); /* as cuMemFree_v2 */
  return untrack((uintptr_t)p, 1u << MEM_HOST) ? CUDA_SUCCESS
                                               : CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize,
                                   unsigned int flags) {
  void *memory;
  ENTER("cuMemAllocManaged");
  NEED_CONTEXT();
  if (!managed_memory)
    return CUDA_ERROR_NOT_SUPPORTED;
  if (dptr == NULL || bytesize == 0 ||
      (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST))
    return CUDA_ERROR_INVALID_VALUE;
  if (!reserve_check(bytesize))
    return CUDA_ERROR_OUT_OF_MEMORY;
  memory = track(bytesize, MEM_MANAGED, NULL);
  if (memory == NULL)
    return CUDA_ERROR_OUT_OF_MEMORY;
  *dptr = (CUdeviceptr)(uintptr_t)memory;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemHostRegister_v2(void *p, size_t bytesize,
                                      unsigned int Flags) {
  ENTER("cuMemHostRegister_v2");
  NEED_CONTEXT();
  if (p == NULL || bytesize == 0)
    return CUDA_ERROR_INVALID_VALUE;
  (void)Flags;
  if (device_range((CUdeviceptr)(uintptr_t)p, 1))
    return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
  return track(bytesize, MEM_REGISTERED, p) != NULL ? CUDA_SUCCESS
                                                    : CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult CUDAAPI cuMemHostUnregister(void *p) {
  ENTER("cuMemHostUnregister");
  NEED_CONTEXT();
  return untrack((uintptr_t)p, 1u << MEM_REGISTERED)
             ? CUDA_SUCCESS
             : CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
}

CUresult CUDAAPI cuDeviceGetDefaultMemPool(CUmemoryPool *pool_out,
                                           CUdevice dev) {
  ENTER("cuDeviceGetDefaultMemPool");
  if (pool_out == NULL)
    return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev))
    return CUDA_ERROR_INVALID_DEVICE;
  *pool_out = &pools[dev];
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemPoolSetAttribute(CUmemoryPool pool,
                                       CUmemPool_attribute attr, void *value) {
  ENTER("cuMemPoolSetAttribute");
  if (pool == NULL || value == NULL)
    return CUDA_ERROR_INVALID_VALUE;
  if (attr == CU_MEMPOOL_ATTR_RELEASE_THRESHOLD)
    memcpy(&pool->release_threshold, value, sizeof(cuuint64_t));
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep) {
  ENTER("cuMemPoolTrimTo");
  (void)minBytesToKeep;
  return pool != NULL ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize,
                                 CUstream hStream) {
  void *memory;
  CUresult result;
  ENTER("cuMemAllocAsync");
  result = stream_usable(hStream);
  if (result != CUDA_SUCCESS)
    return result;
  if (dptr == NULL || bytesize == 0)
    return CUDA_ERROR_INVALID_VALUE;
  if (!reserve_check(bytesize))
    return CUDA_ERROR_OUT_OF_MEMORY;
  memory = track(bytesize, MEM_DEVICE, NULL);
  if (memory == NULL)
    return CUDA_ERROR_OUT_OF_MEMORY;
  atomic_fetch_add(&stream_ordered_allocs, 1);
  *dptr = (CUdeviceptr)(uintptr_t)memory;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) {
  fake_op op = {0};
  CUresult result;
  ENTER("cuMemFreeAsync");
  result = stream_usable(hStream);
  if (result != CUDA_SUCCESS)
    return result;
  if (!device_range(dptr, 1))
    return CUDA_ERROR_INVALID_VALUE;
  op.kind = OP_FREE;
  op.address = dptr;
  return enqueue(hStream, &op);
}

/* ------------------------------------------------------------------------ */
/* Streams and events                                                        */

CUresult CUDAAPI cuStreamCreate(CUstream *phStream, unsigned int Flags) {
  struct CUstream_st *stream;
  ENTER("cuStreamCreate");
  NEED_CONTEXT();
  if (phStream == NULL || (Flags & ~(unsigned)CU_STREAM_NON_BLOCKING) != 0)
    return CUDA_ERROR_INVALID_VALUE;
  stream = calloc(1, sizeof(*stream));
  if (stream == NULL)
    return CUDA_ERROR_OUT_OF_MEMORY;
  stream->ctx = current_context;
  stream->threaded = stream_threads;
  if (stream->threaded &&
      pthread_create(&stream->worker, NULL, stream_worker, stream) != 0) {
    free(stream);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  pthread_mutex_lock(&fake_lock);
  stream->next = streams;
  streams = stream;
  pthread_mutex_unlock(&fake_lock);
  atomic_fetch_add(&live_streams, 1);
  *phStream = stream;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamDestroy_v2(CUstream hStream) {
  struct CUstream_st **link;
  CUresult result;
  int threaded;
  ENTER("cuStreamDestroy_v2");
  result = stream_usable(hStream);
  if (result != CUDA_SUCCESS)
    return result;
  pthread_mutex_lock(&fake_lock);
  for (link = &streams; *link != hStream; link = &(*link)->next)
    ;
  *link = hStream->next;
  hStream->stopping = 1;
  threaded = hStream->threaded;
  pthread_cond_broadcast(&fake_changed);
  pthread_mutex_unlock(&fake_lock);
  /* The real driver lets queued work finish after destroy returns; the
   * worker drains the queue before it stops. */
  if (threaded)
    pthread_join(hStream->worker, NULL);
  free(hStream);
  atomic_fetch_sub(&live_streams, 1);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamSynchronize(CUstream hStream) {
  CUresult result;
  ENTER("cuStreamSynchronize");
  result = stream_usable(hStream);
  if (result != CUDA_SUCCESS)
    return result;
  atomic_fetch_add(&host_waits, 1);
  host_waits_here++;
  pthread_mutex_lock(&fake_lock);
  while (hStream->head != NULL || hStream->inline_running > 0)
    pthread_cond_wait(&fake_changed, &fake_lock);
  result = hStream->error;
  pthread_mutex_unlock(&fake_lock);
  return result;
}

CUresult CUDAAPI cuEventCreate(CUevent *phEvent, unsigned int Flags) {
  struct CUevent_st *event;
  ENTER("cuEventCreate");
  NEED_CONTEXT();
  if (phEvent == NULL ||
      (Flags & ~(unsigned)(CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING)) != 0)
    return CUDA_ERROR_INVALID_VALUE;
  event = calloc(1, sizeof(*event));
  if (event == NULL)
    return CUDA_ERROR_OUT_OF_MEMORY;
  event->refs = 1;
  event->flags = Flags;
  event->ctx = current_context;
  pthread_mutex_lock(&fake_lock);
  event->next_live = live_event_list;
  live_event_list = event;
  pthread_mutex_unlock(&fake_lock);
  atomic_fetch_add(&live_events, 1);
  *phEvent = event;
  return CUDA_SUCCESS;
}

/* The handle is gone at once; the event itself lives on while queued
 * operations name it, as in the real driver. */
CUresult CUDAAPI cuEventDestroy_v2(CUevent hEvent) {
  struct CUevent_st **link;
  ENTER("cuEventDestroy_v2");
  pthread_mutex_lock(&fake_lock);
  for (link = &live_event_list; *link != NULL && *link != hEvent; link = &(*link)->next_live)
    ;
  if (*link == NULL) {
    pthread_mutex_unlock(&fake_lock);
    return CUDA_ERROR_INVALID_HANDLE;
  }
  *link = hEvent->next_live;
  event_drop_locked(hEvent);
  pthread_mutex_unlock(&fake_lock);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuEventQuery(CUevent hEvent) {
  CUresult result = CUDA_SUCCESS;
  ENTER("cuEventQuery");
  pthread_mutex_lock(&fake_lock);
  if (!event_live_locked(hEvent))
    result = CUDA_ERROR_INVALID_HANDLE;
  else if (hEvent->completed < hEvent->recorded)
    result = CUDA_ERROR_NOT_READY;
  else
    result = hEvent->error;
  pthread_mutex_unlock(&fake_lock);
  return result;
}

CUresult CUDAAPI cuEventSynchronize(CUevent hEvent) {
  uint64_t target;
  CUresult result;
  ENTER("cuEventSynchronize");
  pthread_mutex_lock(&fake_lock);
  if (!event_live_locked(hEvent)) {
    pthread_mutex_unlock(&fake_lock);
    return CUDA_ERROR_INVALID_HANDLE;
  }
  atomic_fetch_add(&host_waits, 1);
  host_waits_here++;
  target = hEvent->recorded;
  /* The driver sleeps here only on a blocking-sync event: on any other it
   * spins (or yields) on a CPU under the context's default scheduling
   * (CU_CTX_SCHED_AUTO, whenever the GPUs are fewer than the CPUs). */
  if (hEvent->completed < target && !(hEvent->flags & CU_EVENT_BLOCKING_SYNC))
    atomic_fetch_add(&spinning_waits, 1);
  hEvent->refs++; /* a destroy meanwhile must not free it under us */
  while (hEvent->completed < target || host_waits_held)
    pthread_cond_wait(&fake_changed, &fake_lock);
  result = hEvent->error;
  event_drop_locked(hEvent);
  pthread_mutex_unlock(&fake_lock);
  return result;
}

CUresult CUDAAPI cuEventRecord(CUevent hEvent, CUstream hStream) {
  fake_op op = {0};
  CUresult result;
  ENTER("cuEventRecord");
  result = stream_usable(hStream);
  if (result != CUDA_SUCCESS)
    return result;
  op.kind = OP_RECORD;
  op.event = hEvent;
  pthread_mutex_lock(&fake_lock);
  if (!event_live_locked(hEvent) || hEvent->ctx != hStream->ctx) {
    pthread_mutex_unlock(&fake_lock);
    return CUDA_ERROR_INVALID_HANDLE; /* as the driver: same context only */
  }
  op.generation = ++hEvent->recorded;
  hEvent->refs++;
  if (hEvent->flags & CU_EVENT_BLOCKING_SYNC)
    atomic_fetch_add(&blocking_records, 1);
  pthread_mutex_unlock(&fake_lock);
  atomic_fetch_add(&event_records, 1);
  return enqueue(hStream, &op);
}

CUresult CUDAAPI cuStreamWaitEvent(CUstream hStream, CUevent hEvent,
                                   unsigned int Flags) {
  fake_op op = {0};
  CUresult result;
  ENTER("cuStreamWaitEvent");
  result = stream_usable(hStream);
  if (result != CUDA_SUCCESS)
    return result;
  if (Flags != 0)
    return CUDA_ERROR_INVALID_VALUE;
  op.kind = OP_WAIT;
  op.event = hEvent;
  atomic_fetch_add(&stream_waits, 1);
  pthread_mutex_lock(&fake_lock);
  /* An event of another context or device may be waited for. */
  if (!event_live_locked(hEvent)) {
    pthread_mutex_unlock(&fake_lock);
    return CUDA_ERROR_INVALID_HANDLE;
  }
  if (hEvent->recorded == 0) {
    /* The driver takes it as an empty set of work: never what was meant. */
    atomic_fetch_add(&unrecorded_waits, 1);
    fprintf(stderr, "fake_cuda: cuStreamWaitEvent on an event that was never recorded\n");
  }
  op.generation = hEvent->recorded;
  hEvent->refs++;
  pthread_mutex_unlock(&fake_lock);
  return enqueue(hStream, &op);
}

CUresult CUDAAPI cuStreamAddCallback(CUstream hStream,
                                     CUstreamCallback callback, void *userData,
                                     unsigned int flags) {
  fake_op op = {0};
  CUresult result;
  ENTER("cuStreamAddCallback");
  result = stream_usable(hStream);
  if (result != CUDA_SUCCESS)
    return result;
  if (callback == NULL || flags != 0)
    return CUDA_ERROR_INVALID_VALUE;
  op.kind = OP_CALLBACK;
  op.callback = callback;
  op.user = userData;
  return enqueue(hStream, &op);
}

CUresult CUDAAPI cuStreamQuery(CUstream hStream) {
  CUresult result;
  ENTER("cuStreamQuery");
  atomic_fetch_add(&stream_queries, 1);
  result = stream_usable(hStream);
  if (result != CUDA_SUCCESS)
    return result;
  pthread_mutex_lock(&fake_lock);
  if (hStream->error != CUDA_SUCCESS)
    result = hStream->error;
  else if (hStream->head != NULL || hStream->inline_running > 0)
    result = CUDA_ERROR_NOT_READY;
  pthread_mutex_unlock(&fake_lock);
  return result;
}

/* Page-locked host memory is mapped for the device at the same address
 * (unified addressing), as on every 64-bit Linux GPU. */
CUresult CUDAAPI cuMemHostGetDevicePointer_v2(CUdeviceptr *pdptr, void *p, unsigned int Flags) {
  const fake_alloc *a;
  uintptr_t at = (uintptr_t)p;
  int found = 0;
  ENTER("cuMemHostGetDevicePointer_v2");
  NEED_CONTEXT();
  if (pdptr == NULL || Flags != 0)
    return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&fake_lock);
  for (a = allocations; a != NULL; a = a->next)
    if ((a->kind == MEM_HOST || a->kind == MEM_REGISTERED) && at >= a->base && at - a->base < a->bytes)
      found = 1;
  pthread_mutex_unlock(&fake_lock);
  if (!found)
    return CUDA_ERROR_INVALID_VALUE;
  *pdptr = (CUdeviceptr)at;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamWaitValue32_v2(CUstream stream, CUdeviceptr addr, cuuint32_t value,
                                        unsigned int flags) {
  fake_op op = {0};
  const fake_alloc *a;
  int host = 0;
  CUresult result;
  ENTER("cuStreamWaitValue32_v2");
  result = stream_usable(stream);
  if (result != CUDA_SUCCESS)
    return result;
  if (!memops || flags == CU_STREAM_WAIT_VALUE_NOR)
    return CUDA_ERROR_NOT_SUPPORTED;
  if ((flags & ~(unsigned)CU_STREAM_WAIT_VALUE_FLUSH) > CU_STREAM_WAIT_VALUE_AND || addr % 4 != 0)
    return CUDA_ERROR_INVALID_VALUE;
  /* Host memory the device can reach (not managed memory, which the driver
   * refuses), or device memory. */
  pthread_mutex_lock(&fake_lock);
  for (a = allocations; a != NULL; a = a->next)
    if (a->kind != MEM_MANAGED && addr >= a->base && addr - a->base + 4 <= a->bytes)
      host = 1;
  pthread_mutex_unlock(&fake_lock);
  if (!host)
    return CUDA_ERROR_INVALID_VALUE;
  op.kind = OP_WAIT_VALUE;
  op.word = (const uint32_t *)(uintptr_t)addr;
  op.wait_value = value;
  op.wait_flags = flags & ~(unsigned)CU_STREAM_WAIT_VALUE_FLUSH;
  atomic_fetch_add(&wait_values, 1);
  return enqueue(stream, &op);
}

/* ------------------------------------------------------------------------ */
/* Modules and kernels                                                       */

CUresult CUDAAPI cuModuleLoadData(CUmodule *module, const void *image) {
  const fake_kernel *entries[FAKE_MODULE_MAX_ENTRIES];
  struct CUmod_st *mod;
  char why[160];
  int n;
  ENTER("cuModuleLoadData");
  NEED_CONTEXT();
  if (module == NULL || image == NULL)
    return CUDA_ERROR_INVALID_VALUE;
  n = fake_ptx_entries(image, entries, FAKE_MODULE_MAX_ENTRIES, why, sizeof(why));
  if (n == 0) {
    fprintf(stderr, "fake_cuda: cuModuleLoadData: %s\n", why);
    return CUDA_ERROR_INVALID_PTX;
  }
  if ((mod = calloc(1, sizeof(*mod))) == NULL)
    return CUDA_ERROR_OUT_OF_MEMORY;
  mod->ctx = current_context;
  mod->nfuncs = n;
  for (int i = 0; i < n; i++)
    mod->funcs[i] = (struct CUfunc_st){mod, entries[i]};
  pthread_mutex_lock(&fake_lock);
  mod->next = modules;
  modules = mod;
  pthread_mutex_unlock(&fake_lock);
  atomic_fetch_add(&live_modules, 1);
  *module = mod;
  return CUDA_SUCCESS;
}

/* Called locked: mod is a loaded module. */
static int module_live_locked(const struct CUmod_st *mod) {
  for (const struct CUmod_st *m = modules; m != NULL; m = m->next)
    if (m == mod)
      return 1;
  return 0;
}

CUresult CUDAAPI cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name) {
  CUresult result = CUDA_ERROR_NOT_FOUND;
  ENTER("cuModuleGetFunction");
  if (hfunc == NULL || name == NULL)
    return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&fake_lock);
  if (!module_live_locked(hmod))
    result = CUDA_ERROR_INVALID_HANDLE;
  else
    for (int i = 0; i < hmod->nfuncs; i++)
      if (strcmp(hmod->funcs[i].kernel->name, name) == 0) {
        *hfunc = &hmod->funcs[i];
        result = CUDA_SUCCESS;
      }
  pthread_mutex_unlock(&fake_lock);
  return result;
}

CUresult CUDAAPI cuModuleUnload(CUmodule hmod) {
  struct CUmod_st **link;
  ENTER("cuModuleUnload");
  pthread_mutex_lock(&fake_lock);
  for (link = &modules; *link != NULL && *link != hmod; link = &(*link)->next)
    ;
  if (*link == NULL) {
    pthread_mutex_unlock(&fake_lock);
    return CUDA_ERROR_INVALID_HANDLE;
  }
  *link = hmod->next;
  pthread_mutex_unlock(&fake_lock);
  free(hmod);
  atomic_fetch_sub(&live_modules, 1);
  return CUDA_SUCCESS;
}

/* Called locked: f is a function of a loaded module of the current
 * context. */
static CUresult function_usable_locked(const struct CUfunc_st *f) {
  for (const struct CUmod_st *m = modules; m != NULL; m = m->next)
    for (int i = 0; i < m->nfuncs; i++)
      if (&m->funcs[i] == f)
        return m->ctx == current_context ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
  return CUDA_ERROR_INVALID_HANDLE;
}

CUresult CUDAAPI cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                                unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                                void **kernelParams, void **extra) {
  fake_op op = {0};
  CUresult result;
  ENTER("cuLaunchKernel");
  result = stream_usable(hStream);
  if (result != CUDA_SUCCESS)
    return result;
  if (gridDimX == 0 || gridDimY == 0 || gridDimZ == 0 || blockDimX == 0 || blockDimY == 0 ||
      blockDimZ == 0 || blockDimX * blockDimY * blockDimZ > 1024 || sharedMemBytes > 48 * 1024 ||
      kernelParams == NULL || extra != NULL)
    return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&fake_lock);
  result = function_usable_locked(f);
  pthread_mutex_unlock(&fake_lock);
  if (result != CUDA_SUCCESS)
    return result;
  op.kind = OP_KERNEL;
  op.launch.kernel = f->kernel;
  op.launch.threads = (size_t)gridDimX * blockDimX;
  fake_launch_args(&op.launch, kernelParams);
  return enqueue(hStream, &op);
}

/* ------------------------------------------------------------------------ */
/* Copies and fills                                                          */

CUresult CUDAAPI cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice,
                                      const void *srcHost, size_t ByteCount,
                                      CUstream hStream) {
  ENTER("cuMemcpyHtoDAsync_v2");
  if (srcHost == NULL || !device_range(dstDevice, ByteCount))
    return CUDA_ERROR_INVALID_VALUE;
  return enqueue_copy("cuMemcpyHtoDAsync_v2", (void *)(uintptr_t)dstDevice,
                      srcHost, ByteCount, hStream);
}

CUresult CUDAAPI cuMemcpyDtoHAsync_v2(void *dstHost, CUdeviceptr srcDevice,
                                      size_t ByteCount, CUstream hStream) {
  ENTER("cuMemcpyDtoHAsync_v2");
  if (dstHost == NULL || !device_range(srcDevice, ByteCount))
    return CUDA_ERROR_INVALID_VALUE;
  return enqueue_copy("cuMemcpyDtoHAsync_v2", dstHost,
                      (const void *)(uintptr_t)srcDevice, ByteCount, hStream);
}

CUresult CUDAAPI cuMemcpyDtoDAsync_v2(CUdeviceptr dstDevice,
                                      CUdeviceptr srcDevice, size_t ByteCount,
                                      CUstream hStream) {
  ENTER("cuMemcpyDtoDAsync_v2");
  if (!device_range(dstDevice, ByteCount) ||
      !device_range(srcDevice, ByteCount))
    return CUDA_ERROR_INVALID_VALUE;
  return enqueue_copy("cuMemcpyDtoDAsync_v2", (void *)(uintptr_t)dstDevice,
                      (const void *)(uintptr_t)srcDevice, ByteCount, hStream);
}

CUresult CUDAAPI cuMemcpyPeerAsync(CUdeviceptr dstDevice, CUcontext dstContext,
                                   CUdeviceptr srcDevice, CUcontext srcContext,
                                   size_t ByteCount, CUstream hStream) {
  ENTER("cuMemcpyPeerAsync");
  if (!valid_context(dstContext) || !valid_context(srcContext))
    return CUDA_ERROR_INVALID_CONTEXT;
  if (!device_range(dstDevice, ByteCount) ||
      !device_range(srcDevice, ByteCount))
    return CUDA_ERROR_INVALID_VALUE;
  return enqueue_copy("cuMemcpyPeerAsync", (void *)(uintptr_t)dstDevice,
                      (const void *)(uintptr_t)srcDevice, ByteCount, hStream);
}

CUresult CUDAAPI cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc,
                                 size_t N, CUstream hStream) {
  fake_op op = {0};
  CUresult result;
  ENTER("cuMemsetD8Async");
  if (!device_range(dstDevice, N))
    return CUDA_ERROR_INVALID_VALUE;
  result = stream_usable(hStream);
  if (result != CUDA_SUCCESS)
    return result;
  op.kind = OP_SET;
  op.dst = (void *)(uintptr_t)dstDevice;
  op.bytes = N;
  op.value = uc;
  op.device_fault = env_names("FAKE_CUDA_DEVICE_FAULT", "cuMemsetD8Async");
  return enqueue(hStream, &op);
}

/* Synchronous copies and the driver version: not used by the backend, but
 * by bench/bench_cuda.c for the raw figures it compares unimem against, so
 * that its smoke run can go through the fake. A synchronous copy waits for
 * nothing here: the fake has no legacy default stream with work on it. */

CUresult CUDAAPI cuDriverGetVersion(int *driverVersion) {
  if (in_callback)
    return enter("cuDriverGetVersion");
  if (driverVersion == NULL)
    return CUDA_ERROR_INVALID_VALUE;
  *driverVersion = CUDA_VERSION; /* the header the fake was built against */
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost,
                                 size_t ByteCount) {
  ENTER("cuMemcpyHtoD_v2");
  NEED_CONTEXT();
  if (srcHost == NULL || !device_range(dstDevice, ByteCount))
    return CUDA_ERROR_INVALID_VALUE;
  memmove((void *)(uintptr_t)dstDevice, srcHost, ByteCount);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice,
                                 size_t ByteCount) {
  ENTER("cuMemcpyDtoH_v2");
  NEED_CONTEXT();
  if (dstHost == NULL || !device_range(srcDevice, ByteCount))
    return CUDA_ERROR_INVALID_VALUE;
  memmove(dstHost, (const void *)(uintptr_t)srcDevice, ByteCount);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemcpyDtoD_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice,
                                 size_t ByteCount) {
  ENTER("cuMemcpyDtoD_v2");
  NEED_CONTEXT();
  if (!device_range(dstDevice, ByteCount) ||
      !device_range(srcDevice, ByteCount))
    return CUDA_ERROR_INVALID_VALUE;
  memmove((void *)(uintptr_t)dstDevice, (const void *)(uintptr_t)srcDevice,
          ByteCount);
  return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------------ */
/* For tests: how many of a kind of object are alive, or happened.           */

/* Drop the calling thread's current context, as a thread that never used
 * CUDA would have it: the backend must set its own before each call. */
void fake_cuda_forget_current(void);
void fake_cuda_forget_current(void) { current_context = NULL; }

/* The calling thread's current context, to check that the backend gives
 * the thread back the context it had. */
const void *fake_cuda_current_context(void);
const void *fake_cuda_current_context(void) { return current_context; }

/* While on, cuEventSynchronize does not return, even for an event that has
 * completed: a thread asleep in it (a stream's watcher) stays asleep until
 * the test turns it off. cuEventQuery answers as ever. */
void fake_cuda_hold_host_waits(int on);
void fake_cuda_hold_host_waits(int on) {
  pthread_mutex_lock(&fake_lock);
  host_waits_held = on;
  pthread_cond_broadcast(&fake_changed);
  pthread_mutex_unlock(&fake_lock);
}

long fake_cuda_count(const char *what);
long fake_cuda_count(const char *what) {
  long n = 0;
  const fake_alloc *a;

  if (strcmp(what, "streams") == 0)
    return atomic_load(&live_streams);
  if (strcmp(what, "events") == 0)
    return atomic_load(&live_events);
  if (strcmp(what, "stream_ordered_allocs") == 0)
    return atomic_load(&stream_ordered_allocs);
  if (strcmp(what, "calls_in_callbacks") == 0)
    return atomic_load(&calls_in_callbacks);
  if (strcmp(what, "callbacks_run") == 0)
    return atomic_load(&callbacks_run);
  if (strcmp(what, "modules") == 0)
    return atomic_load(&live_modules);
  if (strcmp(what, "kernels_run") == 0)
    return atomic_load(&kernels_run);
  if (strcmp(what, "kernels_waiting") == 0)
    return atomic_load(&kernels_waiting);
  if (strcmp(what, "races") == 0)
    return atomic_load(&races);
  if (strcmp(what, "unrecorded_waits") == 0)
    return atomic_load(&unrecorded_waits);
  if (strcmp(what, "host_waits") == 0)
    return atomic_load(&host_waits);
  if (strcmp(what, "host_waits_here") == 0)
    return host_waits_here;
  if (strcmp(what, "wait_values") == 0)
    return atomic_load(&wait_values);
  if (strcmp(what, "host_allocs") == 0)
    return atomic_load(&host_allocs);
  if (strcmp(what, "event_records") == 0) /* cuEventRecord calls, never reset */
    return atomic_load(&event_records);
  if (strcmp(what, "blocking_records") == 0) /* those of blocking-sync events */
    return atomic_load(&blocking_records);
  if (strcmp(what, "spinning_waits") == 0) /* cuEventSynchronize that waited on a plain event */
    return atomic_load(&spinning_waits);
  if (strcmp(what, "stream_queries") == 0) /* cuStreamQuery calls */
    return atomic_load(&stream_queries);
  if (strcmp(what, "stream_waits") == 0) /* cuStreamWaitEvent calls */
    return atomic_load(&stream_waits);
  pthread_mutex_lock(&fake_lock);
  if (strcmp(what, "context_retains") == 0) {
    for (int i = 0; i < FAKE_MAX_DEVICES; i++)
      n += contexts[i].retains;
  } else if (strcmp(what, "allocations") == 0) {
    for (a = allocations; a != NULL; a = a->next)
      n++;
  } else if (strcmp(what, "queued_ops") == 0) {
    const struct CUstream_st *stream;
    const fake_op *op;
    for (stream = streams; stream != NULL; stream = stream->next)
      for (op = stream->head; op != NULL; op = op->next)
        n++;
  } else if (strcmp(what, "pool_release_threshold_max") == 0) {
    n = pools[0].release_threshold == UINT64_MAX;
  } else {
    n = -1;
  }
  pthread_mutex_unlock(&fake_lock);
  return n;
}
