/* OpenCL transfers: blocking ones, watched ones (their completions),
 * markers joining tokens, and the tokens' release. */
#include "opencl_private.h"

/* ------------------------------------------------------------------------ */
/* Transfers                                                                 */

/* Transfers only see blocks without a host view (DEVICE blocks): PINNED and
 * UNIFIED blocks reach this backend as x->host. Checked because a mapped
 * PINNED cl_mem must not be the target of a transfer. */
static int check_transfer_block(const um__mem *mem, const char *role) {
  if (mem == NULL || mem->handle == 0)
    return um__set_error(UM_EINVAL, "opencl: transfer without a %s block",
                         role);
  if (mem->host != NULL)
    return um__set_error(UM_EINVAL,
                         "opencl: %s block has a host view; pass it as host",
                         role);
  return UM_OK;
}

static int check_transfer(ocl_device *dev, const um__xfer *x) {
  int status = UM_OK;
  if (x != NULL && x->kind == UM__XFER_QUEUE_MARK)
    return UM_OK; /* nothing moves */
  if (x == NULL || x->bytes == 0)
    return um__set_error(UM_EINVAL, "opencl: empty transfer");
  switch (x->kind) {
  case UM__XFER_H2D:
  case UM__XFER_FILL:
    status = check_transfer_block(x->dst, "destination");
    break;
  case UM__XFER_D2H:
    status = check_transfer_block(x->src, "source");
    break;
  case UM__XFER_D2D:
    status = check_transfer_block(x->dst, "destination");
    if (status == UM_OK)
      status = check_transfer_block(x->src, "source");
    break;
  case UM__XFER_PEER:
    status = check_transfer_block(x->dst, "destination");
    if (status == UM_OK)
      status = check_transfer_block(x->src, "source");
    if (status == UM_OK &&
        (x->src_bdev == NULL ||
         ((const ocl_device *)x->src_bdev)->context != dev->context))
      status = um__set_error(UM_EINVAL, "opencl: peer copy between devices "
                                        "of different platforms");
    break;
  default:
    status = um__set_error(UM_EINVAL, "opencl: unknown transfer kind %d",
                           (int)x->kind);
    break;
  }
  if (status == UM_OK &&
      (x->kind == UM__XFER_H2D || x->kind == UM__XFER_D2H) && x->host == NULL)
    status = um__set_error(UM_EINVAL, "opencl: transfer without host memory");
  return status;
}

/* Enqueue x on w's queue after wait_list, returning its event. Read and
 * write take the blocking flag; copy and fill have none (the caller waits on
 * the event). */
static int enqueue_transfer(ocl_watch *w, const um__xfer *x,
                            cl_bool blocking, cl_uint wait_count,
                            const cl_event *wait_list, cl_event *event) {
  ocl_device *dev = w->dev;
  cl_command_queue queue = w->queue;
  cl_int err;
  const char *call;
  um__ocl_submit_begin(dev);
  switch (x->kind) {
  case UM__XFER_H2D:
    call = "clEnqueueWriteBuffer";
    err = um__ocl.clEnqueueWriteBuffer(queue, (cl_mem)x->dst->handle,
                                   blocking, x->dst_off, x->bytes, x->host,
                                   wait_count, wait_list, event);
    break;
  case UM__XFER_D2H:
    call = "clEnqueueReadBuffer";
    err = um__ocl.clEnqueueReadBuffer(queue, (cl_mem)x->src->handle, blocking,
                                  x->src_off, x->bytes, x->host, wait_count,
                                  wait_list, event);
    break;
  case UM__XFER_FILL:
    call = "clEnqueueFillBuffer";
    err = um__ocl.clEnqueueFillBuffer(queue, (cl_mem)x->dst->handle,
                                  &x->value, 1, x->dst_off, x->bytes,
                                  wait_count, wait_list, event);
    break;
  case UM__XFER_QUEUE_MARK: /* after everything queued, and wait_list */
    call = "clEnqueueMarkerWithWaitList";
    err = um__ocl.clEnqueueMarkerWithWaitList(queue, wait_count, wait_list, event);
    break;
  default: /* D2D, and PEER: one context holds both devices' buffers */
    call = "clEnqueueCopyBuffer";
    err = um__ocl.clEnqueueCopyBuffer(queue, (cl_mem)x->src->handle,
                                  (cl_mem)x->dst->handle, x->src_off,
                                  x->dst_off, x->bytes, wait_count, wait_list,
                                  event);
    break;
  }
  um__ocl_submit_end(dev);
  return um__ocl_translate_cl_error(err, call);
}

const char *um__ocl_transfer_call_name(um__xfer_kind kind) {
  switch (kind) {
  case UM__XFER_QUEUE_MARK:
    return "clEnqueueMarkerWithWaitList";
  case UM__XFER_MARKER:
    return "clEnqueueMarkerWithWaitList";
  case UM__XFER_H2D:
    return "clEnqueueWriteBuffer";
  case UM__XFER_D2H:
    return "clEnqueueReadBuffer";
  case UM__XFER_FILL:
    return "clEnqueueFillBuffer";
  default:
    return "clEnqueueCopyBuffer";
  }
}

int um__ocl_xfer(void *bdev, const um__xfer *x) {
  ocl_device *dev = bdev;
  cl_event event = NULL;
  ocl_watch *w;
  uint64_t upto;
  int status = check_transfer(dev, x);
  if (status != UM_OK)
    return status;
  w = um__ocl_watch_of(dev, x);
  /* Reads and writes take the blocking flag: the very call an application
   * would make, so a blocking copy costs what the raw call does (unless
   * the caller asked to spin: the driver's own blocking wait sleeps). */
  /* Once it has completed, so has every entry listed before it: riders
   * included (a blocking download after the caller's kernel carries the
   * bracket's end). */
  upto = um__ocl_watch_seq(w);
  if ((x->kind == UM__XFER_H2D || x->kind == UM__XFER_D2H) && dev->spin_ns == 0) {
    status = enqueue_transfer(w, x, CL_TRUE, 0, NULL, NULL);
    if (status == UM_OK)
      um__ocl_watch_vouch(w, upto);
    um__ocl_watch_poll(w);
    return status;
  }
  /* Copies and fills have no such flag: a wait on this command's own event,
   * rather than clFinish, so that a blocking copy does not wait for other
   * threads' work queued behind it. */
  um__ocl_settle(dev);
  status = enqueue_transfer(w, x, CL_FALSE, 0, NULL, &event);
  if (status != UM_OK)
    return status;
  if (w != &dev->watch[0]) /* the wait below flushes unimem's own queue */
    um__ocl.clFlush(w->queue);
  status = um__ocl_wait_for_own_command(dev, event, um__ocl_transfer_call_name(x->kind));
  um__ocl.clReleaseEvent(event);
  if (status == UM_OK)
    um__ocl_watch_vouch(w, upto);
  um__ocl_watch_poll(w);
  return status;
}

static transfer_completion *completion_new(ocl_watch *w, const um__xfer *x, um__done_fn done, void *arg) {
  transfer_completion *c = x->done_space;
  if (c == NULL && (c = malloc(sizeof(*c))) == NULL)
    return NULL;
  c->done = done;
  c->arg = arg;
  c->watch = w;
  c->event = NULL;
  c->next = NULL;
  c->kind = (unsigned char)x->kind;
  c->allocated = x->done_space == NULL;
  c->retained = 0;
  c->armed = 0;
  c->ride = c->kick = 0;
  c->seq = 0;
  atomic_init(&c->fired, 0);
  return c;
}

void um__ocl_completion_free(transfer_completion *c) {
  if (c->allocated)
    free(c);
}

/* ------------------------------------------------------------------------ */
/* Markers: a token done once other tokens are                               */

/* A MARKER joins tokens without a queue: a user event, completed by the
 * last of the tokens' callbacks. A command on an in-order queue would add
 * an ordering edge of its own (everything queued behind it), and the
 * tokens may stand for the caller's commands on other queues. */
typedef struct ocl_join {
  atomic_int left;   /* tokens not yet complete, plus the setup's guard */
  atomic_int status; /* UM_OK or the first failure */
  cl_event user;
  um__done_fn done;
  void *arg;
} ocl_join;

static void join_arrive(ocl_join *j, int status) {
  int expected = UM_OK;
  if (status != UM_OK)
    atomic_compare_exchange_strong(&j->status, &expected, status);
  if (atomic_fetch_sub(&j->left, 1) != 1)
    return;
  status = atomic_load(&j->status);
  um__ocl.clSetUserEventStatus(j->user, status == UM_OK ? CL_COMPLETE : CL_INVALID_OPERATION);
  um__ocl.clReleaseEvent(j->user); /* the join's reference */
  um__done_fn done = j->done;
  void *arg = j->arg;
  free(j);
  done(arg, status); /* last: the core may close the backend after it */
}

static void CL_CALLBACK on_join_token(cl_event event, cl_int execution_status, void *user_data) {
  int status = execution_status < 0 ? um__ocl_translate_cl_error(execution_status, "a marker's token") : UM_OK;
  um__ocl.clReleaseEvent(event); /* the reference ocl_join took */
  join_arrive(user_data, status);
}

static int start_join(ocl_device *dev, const um__xfer *x, void *const *after, int nafter,
                    um__done_fn done, void *arg, void **native) {
  cl_event tokens[OCL_INLINE_WAIT_LIST];
  int n = 0;
  cl_int err = CL_SUCCESS;
  ocl_join *j;
  if (nafter + 2 > OCL_INLINE_WAIT_LIST)
    return um__set_error(UM_EINVAL, "opencl: a marker of more than %d tokens", OCL_INLINE_WAIT_LIST);
  for (int i = 0; i < nafter; i++)
    tokens[n++] = (cl_event)after[i];
  for (int i = 0; i < 2; i++)
    if (x->wait[i] != NULL)
      tokens[n++] = (cl_event)x->wait[i];
  if ((j = calloc(1, sizeof(*j))) == NULL)
    return um__set_error(UM_ENOMEM, "opencl: out of host memory");
  j->user = um__ocl.clCreateUserEvent(dev->context, &err);
  if (j->user == NULL || err != CL_SUCCESS) {
    free(j);
    return um__ocl_translate_cl_error(err != CL_SUCCESS ? err : CL_OUT_OF_RESOURCES, "clCreateUserEvent");
  }
  um__ocl.clRetainEvent(j->user); /* one for the join, one for the caller's token */
  atomic_init(&j->left, n + 1);
  atomic_init(&j->status, UM_OK);
  j->done = done;
  j->arg = arg;
  *native = j->user;
  for (int i = 0; i < n; i++) {
    um__ocl.clRetainEvent(tokens[i]);
    if ((err = um__ocl.clSetEventCallback(tokens[i], CL_COMPLETE, on_join_token, j)) != CL_SUCCESS) {
      um__ocl.clReleaseEvent(tokens[i]);
      join_arrive(j, um__ocl_translate_cl_error(err, "clSetEventCallback"));
    }
  }
  join_arrive(j, UM_OK); /* the guard: the join may complete from here on */
  return UM_OK;
}

/* A quiet transfer: queued with no event, no callback, no flush (the queue
 * mark that follows flushes). */
static int start_quiet(ocl_device *dev, const um__xfer *x) {
  int status = check_transfer(dev, x);
  if (status != UM_OK)
    return status;
  return enqueue_transfer(um__ocl_watch_of(dev, x), x, CL_FALSE, 0, NULL, NULL);
}

int um__ocl_xfer_async(void *bdev, const um__xfer *x, void *const *after, int nafter,
                          um__done_fn done, void *arg, void **native) {
  ocl_device *dev = bdev;
  if (x != NULL && x->kind == UM__XFER_MARKER && done != NULL && native != NULL)
    return start_join(dev, x, after, nafter, done, arg, native);
  if (x != NULL && done == NULL && native == NULL && nafter == 0)
    return start_quiet(dev, x);
  cl_event inline_wait_list[OCL_INLINE_WAIT_LIST];
  cl_event *wait_list = inline_wait_list;
  cl_event event = NULL;
  transfer_completion *completion = NULL;
  cl_uint waits;
  unsigned unordered0 = 0;
  int status, held;
  ocl_watch *w;

  if (done == NULL || native == NULL || nafter < 0 || (nafter > 0 && after == NULL))
    return um__set_error(UM_EINVAL, "opencl: bad asynchronous transfer");
  if ((status = check_transfer(dev, x)) != UM_OK)
    return status;
  w = um__ocl_watch_of(dev, x);
  completion = completion_new(w, x, done, arg);
  if (x->kind == UM__XFER_QUEUE_MARK && x->ride && nafter == 0 && x->wait[0] == NULL && x->wait[1] == NULL &&
      completion != NULL) {
    um__ocl_watch_ride(w, completion); /* nothing to enqueue */
    *native = NULL;
    return UM_OK;
  }
  if (nafter + 2 > OCL_INLINE_WAIT_LIST)
    wait_list = malloc((size_t)(nafter + 2) * sizeof(*wait_list));
  if (completion == NULL || wait_list == NULL) {
    status = um__set_error(UM_ENOMEM, "opencl: out of host memory");
    goto fail;
  }
  waits = um__ocl_build_wait_list(w, x, after, nafter, wait_list);
  held = um__ocl_order_begin(w, &unordered0);
  status = enqueue_transfer(w, x, CL_FALSE, waits, waits > 0 ? wait_list : NULL, &event);
  if (status != UM_OK) {
    um__ocl_order_end(w, held);
    goto fail;
  }
  completion->event = event;
  if (!x->token_held) { /* the caller may release the token before done */
    um__ocl.clRetainEvent(event);
    completion->retained = 1;
  }
  /* A queue mark of a run (no bytes) stands for many copies; a bracket's
   * says how much the caller's work may touch. */
  um__ocl_watch_add(w, completion, (x->kind == UM__XFER_QUEUE_MARK && x->bytes == 0) || x->bytes >= WATCH_OWN_BYTES,
                    held, unordered0);
  if (wait_list != inline_wait_list)
    free(wait_list);
  *native = event;
  return UM_OK;

fail:
  if (wait_list != inline_wait_list)
    free(wait_list);
  if (completion != NULL)
    um__ocl_completion_free(completion);
  return status;
}

/* Release the events dev keeps for its next walk. */
void um__ocl_release_later(ocl_device *dev) {
  cl_event out[OCL_RELEASE_LATER];
  int n;
  um__ocl_later_lock(dev);
  n = um__ocl_take_later_locked(dev, out);
  um__ocl_later_unlock(dev);
  um__ocl_release_events(out, n);
}

/* A token's last reference. The last reference of a finished command's
 * event frees it, which on PoCL takes the event's, its queue's, its
 * context's and the event allocator's locks, which enqueues and the
 * driver's worker threads take too. A raw program releases its reference
 * at issue and leaves that free to the driver's threads; unimem keeps a
 * token until the caller releases the event (um_event_native), so the
 * free fell on the thread that issues and waits, in a row of releases
 * after the waits (docs/design.md, Decisions: "PoCL's event frees off the
 * issuing thread"). So an event
 * released on a thread that is not um__ocl_reporting a walk is kept, up to
 * OCL_RELEASE_LATER of them per device, for the device's next walk to
 * release on the driver's callback thread, after its reports; when the
 * list is full the releasing thread releases them all. A free of the
 * device's memory (um__ocl_mem_free), a foreign block's release and the
 * device's close release the list first. A program that stops issuing
 * keeps at most that many finished events per device until one of
 * those. */
void um__ocl_native_release(void *bdev, void *native) {
  ocl_device *dev = bdev;
  int kept;
  if (native == NULL)
    return;
  if (!um__ocl_reporting) {
    um__ocl_later_lock(dev);
    kept = dev->nlater < OCL_RELEASE_LATER;
    if (kept)
      dev->later[dev->nlater++] = (cl_event)native;
    um__ocl_later_unlock(dev);
    if (kept)
      return;
    um__ocl_release_later(dev); /* full: this release takes the list */
  }
  um__ocl_release_token((cl_event)native);
}

