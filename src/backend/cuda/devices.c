/* CUDA devices: their contexts made current around calls, and opening,
 * describing, releasing and closing them. */
#include "cuda_private.h"

/* Every call makes the device's context current on the calling thread
 * (calls come from any thread; the current context is per thread), and
 * gives the thread its previous context back before returning: the
 * application may use CUDA on the same thread, and its current context --
 * for the runtime, its current device -- must not change under it. */
int um__cuda_enter_context(const cuda_device *d, CUcontext *previous) {
  CUresult result = cu->cuCtxGetCurrent(previous);
  if (result != CUDA_SUCCESS)
    return um__cuda_status(result, "cuCtxGetCurrent");
  if (*previous == d->context)
    return UM_OK;
  result = cu->cuCtxSetCurrent(d->context);
  return result == CUDA_SUCCESS ? UM_OK
                                : um__cuda_status(result, "cuCtxSetCurrent");
}

void um__cuda_leave_context(const cuda_device *d, CUcontext previous) {
  if (previous != d->context)
    cu->cuCtxSetCurrent(previous);
}

int um__cuda_leave_with(const cuda_device *d, CUcontext previous, CUresult result, const char *what) {
  um__cuda_leave_context(d, previous);
  return result == CUDA_SUCCESS ? UM_OK : um__cuda_status(result, what);
}




/* Undo open_device() however far it got: the one cleanup path. Waits for
 * the device's work first so that destroying the streams loses nothing. */
static void release_device(cuda_device *d) {
  CUcontext previous = NULL;

  for (int i = 0; i < WATCH_ALL; i++)
    um__cuda_watch_stop(&d->watch[i]);
  if (d->context != NULL && um__cuda_enter_context(d, &previous) == UM_OK) {
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
    um__cuda_release_interop(d);
    if (d->interop_ready) {
      d->gates_closed = 0; /* every gate was opened: the context is idle */
      um__cuda_free_held(d);
    }
    for (int i = 0; i < d->spare_count; i++)
      cu->cuEventDestroy_v2(d->spare[i]);
    d->spare_count = 0;
    um__cuda_leave_context(d, previous);
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
      um__cuda_gate_kernel_load(d) != UM_OK)
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
  atomic_init(&d->nadopted, 0);
  for (int i = 0; i < WATCH_ALL; i++) {
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
    int status = um__cuda_status(result, call);
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

int um__cuda_open(const um_options *opts, void **ctx, int *count) {
  cuda_backend_state *state;
  int device_count = 0;
  int opened = 0;
  int status;
  int i, j;
  CUresult result;

  if (ctx == NULL || count == NULL)
    return um__set_error(UM_EINVAL, "cuda: open without ctx or count");
  status = um__vendor_lib_load(&um__cuda_driver_lib, UM_ENODEV);
  if (status != UM_OK)
    return status;
  if (!um__cuda_driver_no_devices) {
    result = cu->cuDeviceGetCount(&device_count);
    if (result != CUDA_SUCCESS)
      return um__cuda_status(result, "cuDeviceGetCount");
  }
  if (device_count == 0) {
    /* The reason stays in um_last_error(); the manager logs it. */
    um__set_error(UM_OK, "%s",
                  um__cuda_driver_no_devices ? um__cuda_driver_no_device_reason : "cuda: the driver reports no device");
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

int um__cuda_describe(void *ctx, int i, um__bdev_desc *out) {
  cuda_backend_state *state = ctx;
  cuda_device *d;

  if (state == NULL || out == NULL || i < 0 || i >= state->count)
    return um__set_error(UM_EINVAL, "cuda: no device %d to describe", i);
  d = &state->devices[i];
  memset(out, 0, sizeof(*out));
  snprintf(out->name, sizeof(out->name), "%s", d->name);
  out->caps = d->caps;
  out->locations = d->locations;
  out->carve_locations = d->locations;
  out->carve_align = 512; /* cuMemAlloc's own alignment is 256 */
  out->total_bytes = d->real_total_bytes;
  if (d->limit_bytes != 0 && d->limit_bytes < out->total_bytes)
    out->total_bytes = d->limit_bytes;
  out->bdev = d;
  return UM_OK;
}

void um__cuda_close(void *ctx) {
  cuda_backend_state *state = ctx;
  int i;

  if (state == NULL)
    return;
  for (i = 0; i < state->count; i++)
    release_device(&state->devices[i]);
  free(state);
}

