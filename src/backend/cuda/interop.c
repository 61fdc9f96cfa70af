/* The caller's side of CUDA: native handles, the caller's events as tokens,
 * lanes for interop work, markers and captures. */
#include "cuda_private.h"

/* ------------------------------------------------------------------------ */
/* The caller's own device work (um_access_*)                               */

void um__cuda_device_native(void *bdev, um_device_native *out) {
  const cuda_device *d = bdev;
  out->cu_device = d->ordinal;
  out->cu_context = d->context;
  out->cu_stream = d->caller_stream;
}

/* DEVICE and UNIFIED blocks are CUdeviceptrs; a PINNED block is host
 * memory mapped for the device (CU_MEMHOSTALLOC_DEVICEMAP), whose device
 * address the driver gives (the host address itself under unified
 * addressing, which is also what is left when the driver cannot say). */
void um__cuda_mem_native(void *bdev, const um__mem *mem, um_location loc, um_buffer_native *out) {
  cuda_device *d = bdev;
  CUdeviceptr address = (CUdeviceptr)mem->handle;
  CUcontext previous = NULL;

  if (loc == UM_PINNED && um__cuda_enter_context(d, &previous) == UM_OK) {
    CUdeviceptr mapped = 0;
    if (cu->cuMemHostGetDevicePointer_v2(&mapped, mem->host, 0) == CUDA_SUCCESS)
      address = mapped;
    um__cuda_leave_context(d, previous);
  }
  out->cu_ptr = (uint64_t)address;
  out->offset = 0;
}

void *um__cuda_token_native(void *bdev, void *token) {
  (void)bdev;
  return ((cuda_token *)token)->finished;
}

int um__cuda_token_query(void *bdev, void *token) {
  cuda_device *d = bdev;
  CUcontext previous = NULL;
  CUresult result;
  if (um__cuda_enter_context(d, &previous) != UM_OK)
    return 0; /* not known: the waiter goes by the core's own state */
  result = cu->cuEventQuery(((cuda_token *)token)->finished);
  um__cuda_leave_context(d, previous);
  /* CUDA_ERROR_NOT_READY: still running; any other answer means the work
   * ended, and done() reports how. */
  return result != CUDA_ERROR_NOT_READY;
}

/* A spinning waiter's look at a token (token_reap): a transfer whose event
 * has completed is reported here unless its watcher got there first; the
 * watcher, awake later, then only drops its share. The waiter borrows the
 * core's share of the token meanwhile, so the token and its event live. */
int um__cuda_token_reap(void *bdev, void *token_) {
  cuda_device *d = bdev;
  cuda_token *token = token_;
  CUcontext previous = NULL;
  CUresult result;
  if (um__cuda_enter_context(d, &previous) != UM_OK)
    return 0; /* not known: the waiter goes by the core's own state */
  result = cu->cuEventQuery(token->finished);
  if (result != CUDA_ERROR_NOT_READY && token->dev != NULL && atomic_exchange(&token->reported, 1) == 0)
    token->done(token->arg, um__cuda_status(result, NULL));
  um__cuda_leave_context(d, previous);
  return result != CUDA_ERROR_NOT_READY;
}

int um__cuda_token_wait(void *bdev, void *token) {
  CUcontext previous = NULL;
  int status = um__cuda_enter_context(bdev, &previous);
  if (status != UM_OK)
    return status;
  return um__cuda_leave_with(bdev, previous, cu->cuEventSynchronize(((cuda_token *)token)->finished),
                             "cuEventSynchronize");
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
int um__cuda_lane_take(cuda_device *d, CUstream *out) {
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
    return um__cuda_status(result, "cuStreamCreate");
  d->lanes[d->lane_count++] = lane;
  *out = lane;
  return UM_OK;
}

/* The shape every lane item shares: a token of `owners` owners, queued by
 * `queue` under interop_lock (see um__cuda_lane_take), then handed out in *out, or
 * discarded when queueing failed. Called with the context current. */

int um__cuda_lane_item_new(cuda_device *d, int owners, lane_queue_fn queue, const void *arg, void **out) {
  cuda_token *token = NULL;
  int status = um__cuda_token_create(owners, &token);

  if (status != UM_OK)
    return status;
  pthread_mutex_lock(&d->interop_lock);
  status = queue(d, token, arg);
  pthread_mutex_unlock(&d->interop_lock);
  if (status != UM_OK)
    um__cuda_token_discard(token);
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
  status = um__cuda_lane_take(d, &lane);
  if (status == UM_OK)
    status = um__cuda_wait_tokens(lane, a->after, a->nafter);
  if (status == UM_OK)
    status = um__cuda_wait_tokens(lane, a->x->wait, 2);
  if (status == UM_OK)
    status = um__cuda_record_and_call_back(token, lane);
  return status;
}

int um__cuda_start_marker(cuda_device *d, const um__xfer *x, void *const *after,
                        int nafter, um__done_fn done, void *arg, void **native) {
  marker_args a = {x, after, nafter, done, arg};
  CUcontext previous = NULL;
  int status = um__cuda_enter_context(d, &previous);
  if (status != UM_OK)
    return status;
  status = um__cuda_lane_item_new(d, 2, queue_marker, &a, native);
  um__cuda_leave_context(d, previous);
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
  int status = um__cuda_lane_take(d, &lane);

  if (status == UM_OK && a->pending &&
      (result = cu->cuStreamWaitEvent(lane, a->caller, CU_EVENT_WAIT_DEFAULT)) != CUDA_SUCCESS)
    status = um__cuda_status(result, "cuStreamWaitEvent");
  if (status == UM_OK && (result = cu->cuEventRecord(captured->finished, lane)) != CUDA_SUCCESS)
    status = um__cuda_status(result, "cuEventRecord");
  return status;
}

int um__cuda_token_adopt(void *bdev, void *native, void **token) {
  cuda_device *d = bdev;
  capture_args a = {native, 0};
  CUcontext previous = NULL;
  int status = um__cuda_enter_context(d, &previous);
  if (status != UM_OK)
    return status;
  CUresult result = cu->cuEventQuery(a.caller);
  a.pending = result == CUDA_ERROR_NOT_READY;
  if (result != CUDA_SUCCESS && !a.pending) {
    um__cuda_status(result, "cuEventQuery");
    status = um__set_error(UM_EINVAL, "cuda: the done event is not a live CUevent (%s)", um_last_error());
  }
  if (status == UM_OK)
    status = um__cuda_lane_item_new(d, 1, queue_capture, &a, token);
  um__cuda_leave_context(d, previous);
  return status;
}

/* An event recorded on the caller's stream after what the caller queued
 * there so far. */
int um__cuda_caller_marker(void *bdev, void **token) {
  cuda_device *d = bdev;
  cuda_token *marker = NULL;
  CUcontext previous = NULL;
  int status = um__cuda_enter_context(d, &previous);
  if (status != UM_OK)
    return status;
  status = um__cuda_token_create(1, &marker);
  CUresult result = status == UM_OK ? cu->cuEventRecord(marker->finished, d->caller_stream) : CUDA_SUCCESS;
  if (result != CUDA_SUCCESS) {
    status = um__cuda_status(result, "cuEventRecord");
    um__cuda_token_discard(marker);
  }
  if (status == UM_OK)
    *token = marker;
  um__cuda_leave_context(d, previous);
  return status;
}


/* A stream of the caller's in d's context (where the driver can say so:
 * cuStreamGetCtx), as queue WATCH_COUNT + i. CUDA streams run in order. */
int um__cuda_queue_adopt(void *bdev, void *native, int *q) {
  cuda_device *d = bdev;
  CUstream stream = native;
  CUcontext previous = NULL, ctx = NULL;
  CUresult result;
  int status, n;
  if (stream == NULL)
    return um__set_error(UM_EINVAL, "cuda: the legacy default stream (NULL) orders everything: pass a stream");
  if ((status = um__cuda_enter_context(d, &previous)) != UM_OK)
    return status;
  result = cu->cuStreamQuery(stream);
  if (result != CUDA_SUCCESS && result != CUDA_ERROR_NOT_READY) {
    um__cuda_status(result, "cuStreamQuery");
    status = um__set_error(UM_EINVAL, "cuda: %p is not a stream of this context (%s)", native, um_last_error());
  } else if (cu->cuStreamGetCtx != NULL && cu->cuStreamGetCtx(stream, &ctx) == CUDA_SUCCESS && ctx != d->context) {
    status = um__set_error(UM_EINVAL, "cuda: stream %p is of another context than device %s", native, d->name);
  }
  um__cuda_leave_context(d, previous);
  if (status != UM_OK)
    return status;
  pthread_mutex_lock(&d->interop_lock);
  n = atomic_load_explicit(&d->nadopted, memory_order_relaxed);
  for (int i = 0; i < n; i++)
    if (d->adopted[i] == stream) {
      pthread_mutex_unlock(&d->interop_lock);
      *q = WATCH_COUNT + i;
      return UM_OK;
    }
  if (n == CUDA_CALLER_QUEUES) {
    pthread_mutex_unlock(&d->interop_lock);
    return um__set_error(UM_ENOMEM, "cuda: device %s takes at most %d streams of the caller's", d->name,
                         CUDA_CALLER_QUEUES);
  }
  d->adopted[n] = stream;
  atomic_store_explicit(&d->nadopted, n + 1, memory_order_release);
  pthread_mutex_unlock(&d->interop_lock);
  *q = WATCH_COUNT + n;
  return UM_OK;
}
