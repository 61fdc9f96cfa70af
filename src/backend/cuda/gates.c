/* CUDA gates: host words a tiny kernel waits on, in page-locked slabs, opened
 * by the host; and the release of the interop state. */
#include "cuda_private.h"

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
    return um__cuda_status(result, "cuMemHostAlloc (gate words)");
  }
  result = cu->cuMemHostGetDevicePointer_v2(&base, slab->host, 0);
  if (result != CUDA_SUCCESS) {
    cu->cuMemFreeHost(slab->host);
    free(slab);
    return um__cuda_status(result, "cuMemHostGetDevicePointer");
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

void um__cuda_gate_word_put(cuda_device *d, cuda_gate_word *word) {
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
int um__cuda_gate_kernel_load(cuda_device *d) {
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
    return um__cuda_status(result, "cuModuleLoadData (gate kernel)");
  }
  result = cu->cuModuleGetFunction(&d->gate_function, d->gate_module, "unimem_gate_wait");
  if (result != CUDA_SUCCESS) {
    cu->cuModuleUnload(d->gate_module);
    d->gate_module = NULL;
    d->gate_function = NULL;
    return um__cuda_status(result, "cuModuleGetFunction (gate kernel)");
  }
  return UM_OK;
}

/* Queue the gate kernel on lane; interop_lock held, context current. */
static int gate_kernel_launch(cuda_device *d, CUstream lane, const cuda_gate_word *word, uint32_t value) {
  CUdeviceptr address = word->device;
  void *params[2] = {&address, &value};
  CUresult result;
  int status = um__cuda_gate_kernel_load(d);

  if (status != UM_OK)
    return status;
  result = cu->cuLaunchKernel(d->gate_function, 1, 1, 1, 1, 1, 1, 0, lane, params, NULL);
  return result == CUDA_SUCCESS ? UM_OK : um__cuda_status(result, "cuLaunchKernel (gate kernel)");
}

/* Make lane wait until word reaches value; interop_lock held. */
static int gate_wait(cuda_device *d, CUstream lane, const cuda_gate_word *word, uint32_t value) {
  if (!d->gate_kernel && cu->cuStreamWaitValue32_v2 != NULL) {
    CUresult result = cu->cuStreamWaitValue32_v2(lane, word->device, value, CU_STREAM_WAIT_VALUE_GEQ);
    if (result != CUDA_ERROR_NOT_SUPPORTED)
      return result == CUDA_SUCCESS ? UM_OK : um__cuda_status(result, "cuStreamWaitValue32");
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
  if ((status = um__cuda_lane_take(d, &lane)) != UM_OK)
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
    return um__cuda_status(result, "cuEventRecord");
  }
  gate->gate_dev = d;
  gate->gate = word;
  d->gates_closed++;
  return UM_OK;
}

int um__cuda_gate_new(void *bdev, void **token) {
  cuda_device *d = bdev;
  CUcontext previous = NULL;
  int status = um__cuda_enter_context(d, &previous);
  if (status != UM_OK)
    return status;
  status = um__cuda_lane_item_new(d, 2 /* the opener's and the caller's */, gate_queue, NULL, token);
  um__cuda_leave_context(d, previous);
  return status;
}

/* A CUDA event carries no failure: a gate opened with one still opens, and
 * the core's own event of the operation reports it. */
void um__cuda_gate_open(void *bdev, void *token, int status) {
  cuda_token *gate = token;
  cuda_device *d = gate->gate_dev;
  int last;
  (void)bdev;
  (void)status;
  __atomic_store_n(gate->gate->host, gate->gate_value, __ATOMIC_RELEASE);
  pthread_mutex_lock(&d->interop_lock);
  last = --d->gates_closed == 0 && d->held_frees != NULL;
  pthread_mutex_unlock(&d->interop_lock);
  um__cuda_token_drop(gate); /* the opener's */
  if (last)
    um__cuda_free_held(d);
}

/* close: every gate was opened and every lane has finished (the context was
 * synchronised); the context is current. */
void um__cuda_release_interop(cuda_device *d) {
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

