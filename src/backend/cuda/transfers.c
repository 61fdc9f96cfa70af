/* CUDA transfers on the copy streams, their tokens (events), and the
 * watcher threads that report them. */
#include "cuda_private.h"

/* ------------------------------------------------------------------------ */
/* Transfers                                                                 */

static CUdeviceptr device_address(const um__mem *mem, size_t offset) {
  return (CUdeviceptr)mem->handle + (CUdeviceptr)offset;
}

/* Uploads, downloads and on-device work each have a stream, so a download
 * never waits behind an unrelated upload: the core's queues (queue_of), one
 * watcher each. */
int um__cuda_queue_of(um__xfer_kind kind) {
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
  if (q >= WATCH_COUNT)
    return d->adopted[q - WATCH_COUNT];
  return q == WATCH_H2D ? d->h2d_stream : q == WATCH_D2H ? d->d2h_stream : d->local_stream;
}

/* The queue x goes to: a caller's stream it names (x->queue), a queue
 * mark's queue, else the stream of its kind; -1 for none. */
static int queue_for(const cuda_device *d, const um__xfer *x) {
  int q = x->queue;
  if (q >= WATCH_COUNT)
    return q < WATCH_COUNT + atomic_load_explicit(&d->nadopted, memory_order_acquire) ? q : -1;
  if (x->kind == UM__XFER_QUEUE_MARK)
    return q >= 0 && q < WATCH_COUNT ? q : -1;
  return um__cuda_queue_of(x->kind);
}

static CUstream stream_for(const cuda_device *d, um__xfer_kind kind) {
  return queue_stream(d, um__cuda_queue_of(kind));
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
  return result == CUDA_SUCCESS ? UM_OK : um__cuda_status(result, call);
}

/* Whether a stream has nothing left to run (any answer but NOT_READY ends
 * the spin: the synchronize that follows reports a failure). */
static int stream_idle(void *stream) { return cu->cuStreamQuery((CUstream)stream) != CUDA_ERROR_NOT_READY; }

int um__cuda_xfer(void *bdev, const um__xfer *x) {
  cuda_device *d = bdev;
  int q = queue_for(d, x);
  CUstream stream = q >= 0 ? queue_stream(d, q) : stream_for(d, x->kind);
  CUcontext previous = NULL;
  CUresult result;
  int status = um__cuda_enter_context(d, &previous);

  if (status != UM_OK)
    return status;
  status = issue_xfer(d, x, stream);
  if (status == UM_OK) {
    /* With wait_spin_ns, poll the stream first, where the driver's own
     * cuStreamSynchronize would sleep: how it waits is the context's
     * scheduling flag, the application's (the primary context is shared).
     * Under spin, yield or auto it polls already, and polling on top of it
     * with cuStreamQuery only took the driver's lock from it (docs/design.md,
     * Decisions: "CUDA: a watcher thread per copy stream"). */
    if (d->driver_sleeps)
      um__spin_until(d->spin_ns, stream_idle, stream);
    result = cu->cuStreamSynchronize(stream);
    if (result != CUDA_SUCCESS)
      status = um__cuda_status(result, "cuStreamSynchronize");
  }
  um__cuda_leave_context(d, previous);
  return status;
}

/* ------------------------------------------------------------------------ */
/* Tokens                                                                    */


/* A transfer's event: a spare one, or a new blocking-sync one (its watcher
 * sleeps in cuEventSynchronize); the context is current. Recording a
 * blocking-sync event costs the issuing thread more than a plain one
 * (docs/design.md, Decisions: "CUDA: a watcher thread per copy stream"),
 * but nothing cheaper lets the watcher sleep:
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
void um__cuda_token_drop(cuda_token *token) {
  if (um__atomic_sub_acq_rel(&token->owners, 1) != 1)
    return;
  /* Never a gate in a stream callback (gates have no callback), where the
   * lock below would be a wait on a driver thread. */
  if (token->gate != NULL)
    um__cuda_gate_word_put(token->gate_dev, token->gate);
  if (token->dev != NULL)
    spare_event_put(token->dev, token->finished);
  free(token);
}

/* A token with a fresh event; the device's context is current. */
int um__cuda_token_create(int owners, cuda_token **out) {
  cuda_token *token = calloc(1, sizeof(*token));
  CUresult result;

  if (token == NULL)
    return um__set_error(UM_ENOMEM, "cuda: no memory for a token");
  result = cu->cuEventCreate(&token->finished, CU_EVENT_DISABLE_TIMING);
  if (result != CUDA_SUCCESS) {
    free(token);
    return um__cuda_status(result, "cuEventCreate");
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
    return um__cuda_status(result, "cuEventCreate");
  }
  atomic_init(&token->owners, 2);
  token->dev = d;
  token->stream = stream;
  *out = token;
  return UM_OK;
}

/* A token that never left the backend; the context is current. */
void um__cuda_token_discard(cuda_token *token) {
  if (token->dev != NULL)
    spare_event_put(token->dev, token->finished);
  else
    cu->cuEventDestroy_v2(token->finished);
  free(token);
}

/* Make stream wait for the tokens (NULL entries skipped). */
int um__cuda_wait_tokens(CUstream stream, void *const *tokens, int n) {
  for (int i = 0; i < n; i++) {
    const cuda_token *before = tokens[i];
    CUresult result;
    /* A transfer recorded on this stream is behind the stream's order
     * already. */
    if (before == NULL || before->stream == stream)
      continue;
    result = cu->cuStreamWaitEvent(stream, before->finished, CU_EVENT_WAIT_DEFAULT);
    if (result != CUDA_SUCCESS)
      return um__cuda_status(result, "cuStreamWaitEvent");
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
  token->done(token->arg, um__cuda_status(result, NULL));
  um__cuda_token_drop(token);
}

/* Record a marker's event on its lane, then have its done called after it
 * (a stream callback). */
int um__cuda_record_and_call_back(cuda_token *token, CUstream lane) {
  CUresult result = cu->cuEventRecord(token->finished, lane);
  if (result != CUDA_SUCCESS)
    return um__cuda_status(result, "cuEventRecord");
  result = cu->cuStreamAddCallback(lane, marker_finished, token, 0);
  return result == CUDA_SUCCESS ? UM_OK : um__cuda_status(result, "cuStreamAddCallback");
}

/* Wait for a transfer's event, asleep (it is a blocking-sync event); the
 * driver's answer for it. A transfer a spinning waiter reported already
 * (um__cuda_token_reap saw its event complete) is not waited for: the answer
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
      token->done(token->arg, um__cuda_status(result, NULL));
    um__cuda_token_drop(token);
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

void um__cuda_watch_stop(cuda_watch *w) {
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

/* A quiet transfer (a batch's run, op.c): queued on its kind's stream with
 * no event and no report; the queue mark the core queues behind the run
 * reports it, and a failure of it shows there (the driver's errors on a
 * stream are the context's, and stick). */
static int start_quiet(cuda_device *d, const um__xfer *x, int nafter) {
  CUcontext previous = NULL;
  int status, q;
  if (nafter != 0 || x->kind == UM__XFER_QUEUE_MARK)
    return um__set_error(UM_EINVAL, "cuda: a quiet transfer waits for nothing and moves something");
  if ((status = um__cuda_enter_context(d, &previous)) != UM_OK)
    return status;
  q = queue_for(d, x);
  status = q >= 0 ? issue_xfer(d, x, queue_stream(d, q)) : um__set_error(UM_EINVAL, "cuda: no queue %d", x->queue);
  um__cuda_leave_context(d, previous);
  return status;
}

int um__cuda_xfer_async(void *bdev, const um__xfer *x, void *const *after,
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
    return um__cuda_start_marker(d, x, after, nafter, done, arg, native);
  if (done == NULL && native == NULL)
    return start_quiet(d, x, nafter);
  /* A queue mark: an event recorded on its queue's stream, reported by
   * that stream's watcher once everything queued there before it ran. */
  if ((q = queue_for(d, x)) < 0)
    return um__set_error(UM_EINVAL, "cuda: no queue %d", x->queue);
  stream = queue_stream(d, q);
  status = um__cuda_enter_context(d, &previous);
  if (status != UM_OK)
    return status;
  status = um__cuda_wait_tokens(stream, after, nafter);
  if (status == UM_OK && x->kind == UM__XFER_QUEUE_MARK) /* a bracket's, on the caller's stream */
    status = um__cuda_wait_tokens(stream, x->wait, 2);
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
  status = result == CUDA_SUCCESS ? watch_push(&d->watch[q], token) : um__cuda_status(result, "cuEventRecord");
  if (status != UM_OK)
    goto fail;
  um__cuda_leave_context(d, previous);
  *native = token;
  return UM_OK;

fail:
  /* On failure the caller may reuse its memory at once, so a transfer that
   * was queued must finish first. The sync's own result would only hide the
   * first failure. */
  if (issued)
    cu->cuStreamSynchronize(stream);
  if (token != NULL)
    um__cuda_token_discard(token);
  um__cuda_leave_context(d, previous);
  return status;
}

void um__cuda_native_release(void *bdev, void *native) {
  cuda_device *d = bdev;
  cuda_token *token = native;
  CUcontext previous = NULL;

  if (token == NULL)
    return;
  /* cuEventDestroy on a pending event returns at once and the driver frees
   * it when it completes, so releasing before a marker's callback ran is
   * safe. A transfer's event stays until its watcher is done with it. */
  if (um__cuda_enter_context(d, &previous) == UM_OK) {
    if (token->dev == NULL)
      cu->cuEventDestroy_v2(token->finished);
    um__cuda_token_drop(token);
    um__cuda_leave_context(d, previous);
  } else {
    um__cuda_token_drop(token);
  }
}

