/* CUDA blocks (DEVICE, PINNED, UNIFIED, registered host memory), frees held
 * until the device is idle, the memory query, synchronize, and peers. */
#include "cuda_private.h"

/* ------------------------------------------------------------------------ */
/* Memory                                                                    */

int um__cuda_mem_alloc(void *bdev, um_location loc, size_t bytes,
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
  status = um__cuda_enter_context(d, &previous);
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
    um__cuda_leave_context(d, previous);
    return um__set_error(UM_ENOTSUP, "cuda: location %d", (int)loc);
  }
  um__cuda_leave_context(d, previous);
  if (result != CUDA_SUCCESS)
    return um__cuda_status(result, call);
  out->host = host;
  out->handle = (uintptr_t)address;
  out->priv = NULL;
  return UM_OK;
}

/* A carved block is the segment's pointers moved by off: a CUdeviceptr is
 * an address, and so is a pinned or managed block's host view. */
int um__cuda_mem_carve(void *bdev, um_location loc, const um__mem *seg, size_t off, size_t bytes, um__mem *out) {
  (void)bdev;
  (void)loc;
  (void)bytes;
  out->host = seg->host != NULL ? (char *)seg->host + off : NULL;
  out->handle = seg->handle + off;
  out->priv = NULL;
  return UM_OK;
}

void um__cuda_mem_uncarve(void *bdev, um_location loc, um__mem *mem) {
  (void)bdev;
  (void)loc;
  mem->host = NULL;
  mem->handle = 0;
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


/* Make the frees held on d, while no gate of d is closed; those left when
 * one closes again go back to wait for it. */
void um__cuda_free_held(cuda_device *d) {
  for (;;) {
    cuda_held_free *h = NULL;
    pthread_mutex_lock(&d->interop_lock);
    if (d->gates_closed == 0 && (h = d->held_frees) != NULL)
      d->held_frees = h->next;
    pthread_mutex_unlock(&d->interop_lock);
    if (h == NULL)
      return;
    um__cuda_mem_free(d, h->loc, h->bytes, &h->mem);
    free(h);
  }
}

void um__cuda_mem_free(void *bdev, um_location loc, size_t bytes,
                          um__mem *mem) {
  cuda_device *d = bdev;
  CUcontext previous = NULL;
  const char *call = NULL;
  CUresult result = CUDA_SUCCESS;
  int status;

  if (hold_free(d, loc, bytes, mem))
    return;
  status = um__cuda_enter_context(d, &previous);

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
    um__cuda_leave_context(d, previous);
    if (result != CUDA_SUCCESS)
      status = um__cuda_status(result, call);
  }
  /* A free cannot fail from the caller's view: the log says it did. */
  if (status != UM_OK)
    um__log(&d->owner->opts, UM_LOG_WARN, "freeing %zu bytes: %s", bytes,
            um_last_error());
}

int um__cuda_host_register(void *bdev, void *host, size_t bytes,
                              um__mem *out) {
  CUcontext previous = NULL;
  int status = um__cuda_enter_context(bdev, &previous);
  if (status != UM_OK)
    return status;
  /* Portable: any context may DMA from it, as from PINNED blocks. */
  status = um__cuda_leave_with(bdev, previous, cu->cuMemHostRegister_v2(host, bytes, CU_MEMHOSTREGISTER_PORTABLE),
                               "cuMemHostRegister_v2");
  if (status != UM_OK)
    return status;
  out->host = host;
  out->handle = (uintptr_t)host;
  out->priv = NULL;
  return UM_OK;
}

void um__cuda_host_unregister(void *bdev, um__mem *mem) {
  cuda_device *d = bdev;
  CUcontext previous = NULL;
  int status = um__cuda_enter_context(d, &previous);
  if (status == UM_OK)
    status = um__cuda_leave_with(d, previous, cu->cuMemHostUnregister(mem->host), "cuMemHostUnregister");
  if (status != UM_OK)
    um__log(&d->owner->opts, UM_LOG_WARN, "unregistering host memory: %s",
            um_last_error());
}

int um__cuda_memory(void *bdev, uint64_t *free_bytes,
                       uint64_t *total_bytes) {
  cuda_device *d = bdev;
  size_t free_now = 0, total_now = 0;
  uint64_t free_out, total_out;
  CUcontext previous = NULL;
  int status = um__cuda_enter_context(d, &previous);
  if (status != UM_OK)
    return status;
  status = um__cuda_leave_with(d, previous, cu->cuMemGetInfo_v2(&free_now, &total_now), "cuMemGetInfo_v2");
  if (status != UM_OK)
    return status;
  free_out = free_now;
  total_out = total_now;
  /* device_limit_bytes: the core caps these figures (um_device_memory). */
  if (free_bytes != NULL)
    *free_bytes = free_out;
  if (total_bytes != NULL)
    *total_bytes = total_out;
  return UM_OK;
}

int um__cuda_synchronize(void *bdev) {
  CUcontext previous = NULL;
  int status = um__cuda_enter_context(bdev, &previous);
  if (status != UM_OK)
    return status;
  return um__cuda_leave_with(bdev, previous, cu->cuCtxSynchronize(), "cuCtxSynchronize");
}

/* ------------------------------------------------------------------------ */
/* Peers                                                                     */

/* cuStreamWaitEvent takes an event of any device or context. */
int um__cuda_tokens_shared(void *a, void *b) {
  (void)a, (void)b;
  return 1;
}

int um__cuda_peer_possible(void *a, void *b) {
  const cuda_device *from = a, *to = b;
  int can_access = 0;

  if (cu->cuDeviceCanAccessPeer(&can_access, from->device, to->device) !=
      CUDA_SUCCESS)
    return 0;
  return can_access != 0;
}

int um__cuda_peer_enable(void *a, void *b) {
  cuda_device *from = a;
  const cuda_device *to = b;
  CUcontext previous = NULL;
  CUresult result;
  int status;

  if (!um__cuda_peer_possible(a, b))
    return um__set_error(UM_ENOTSUP,
                         "cuda device %d cannot access device %d's memory",
                         from->ordinal, to->ordinal);
  status = um__cuda_enter_context(from, &previous);
  if (status != UM_OK)
    return status;
  result = cu->cuCtxEnablePeerAccess(to->context, 0);
  um__cuda_leave_context(from, previous);
  if (result == CUDA_SUCCESS || result == CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED)
    return UM_OK;
  return um__cuda_status(result, "cuCtxEnablePeerAccess");
}

