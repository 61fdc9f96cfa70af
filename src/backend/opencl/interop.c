/* The caller's side of OpenCL: native handles, foreign cl_mems, the caller's
 * events as tokens, gates and caller markers, and adopting the caller's
 * context, device and queue. */
#include "opencl_private.h"

/* ------------------------------------------------------------------------ */
/* The caller's own commands (um_access_*)                                  */

void um__ocl_device_native(void *bdev, um_device_native *out) {
  ocl_device *dev = bdev;
  out->cl_platform = dev->platform;
  out->cl_device = dev->id;
  out->cl_context = dev->context;
  out->cl_queue = dev->caller_queue;
}

void um__ocl_mem_native(void *bdev, const um__mem *mem, um_location loc, um_buffer_native *out) {
  (void)bdev;
  if (loc == UM_UNIFIED)
    out->svm = mem->host;
  else
    out->cl_mem = (void *)mem->handle;
}

/* A cl_mem of the caller's (a DLPack import) as a DEVICE block: a buffer of
 * this device's context holding [offset, offset + bytes); a sub-buffer over
 * that range when offset > 0 (priv holds it, for foreign_release). */
int um__ocl_foreign_wrap(void *bdev, um_location loc, uintptr_t handle, uint64_t offset,
                            size_t bytes, um__mem *out) {
  ocl_device *dev = bdev;
  cl_mem mem = (cl_mem)handle, sub;
  cl_mem_object_type type = 0;
  cl_context context = NULL;
  size_t size = 0;
  cl_buffer_region region;
  cl_int err;
  if (loc != UM_DEVICE || um__ocl.clGetMemObjectInfo == NULL || um__ocl.clCreateSubBuffer == NULL)
    return um__set_error(UM_ENOTSUP, "opencl: %s cannot wrap a cl_mem of the caller's", dev->name);
  if ((err = um__ocl.clGetMemObjectInfo(mem, CL_MEM_TYPE, sizeof(type), &type, NULL)) != CL_SUCCESS ||
      (err = um__ocl.clGetMemObjectInfo(mem, CL_MEM_CONTEXT, sizeof(context), &context, NULL)) != CL_SUCCESS ||
      (err = um__ocl.clGetMemObjectInfo(mem, CL_MEM_SIZE, sizeof(size), &size, NULL)) != CL_SUCCESS)
    return um__ocl_translate_cl_error(err, "clGetMemObjectInfo");
  if (type != CL_MEM_OBJECT_BUFFER || context != dev->context)
    return um__set_error(UM_EINVAL, "opencl: the cl_mem is %s of %s's context", type != CL_MEM_OBJECT_BUFFER ?
                         "not a buffer" : "not", dev->name);
  if (offset > size || bytes > size - offset)
    return um__set_error(UM_ERANGE, "opencl: %llu bytes at offset %llu are past the end of the %zu-byte cl_mem",
                         (unsigned long long)bytes, (unsigned long long)offset, size);
  memset(out, 0, sizeof(*out));
  out->handle = handle;
  if (offset == 0)
    return UM_OK;
  /* OpenCL makes no sub-buffer of a sub-buffer (a block carved from a
   * segment is one): the region is taken of its parent, at its offset. */
  {
    cl_mem parent = NULL;
    size_t base = 0;
    if (um__ocl.clGetMemObjectInfo(mem, CL_MEM_ASSOCIATED_MEMOBJECT, sizeof(parent), &parent, NULL) == CL_SUCCESS &&
        parent != NULL &&
        um__ocl.clGetMemObjectInfo(mem, CL_MEM_OFFSET, sizeof(base), &base, NULL) == CL_SUCCESS) {
      mem = parent;
      offset += base;
    }
  }
  region.origin = (size_t)offset;
  region.size = bytes;
  sub = um__ocl.clCreateSubBuffer(mem, 0, CL_BUFFER_CREATE_TYPE_REGION, &region, &err);
  if (sub == NULL || err != CL_SUCCESS)
    return err == CL_MISALIGNED_SUB_BUFFER_OFFSET
               ? um__set_error(UM_ENOTSUP, "opencl: %s cannot start a sub-buffer at offset %llu (alignment)",
                               dev->name, (unsigned long long)offset)
               : um__ocl_translate_cl_error(err != CL_SUCCESS ? err : CL_OUT_OF_RESOURCES, "clCreateSubBuffer");
  out->handle = (uintptr_t)sub;
  out->priv = sub;
  return UM_OK;
}

void um__ocl_foreign_release(void *bdev, um__mem *mem) {
  um__ocl_release_later(bdev);
  if (mem->priv != NULL)
    um__ocl.clReleaseMemObject((cl_mem)mem->priv);
}

void *um__ocl_token_native(void *bdev, void *token) {
  (void)bdev;
  return token; /* tokens are cl_events */
}

/* Whether native is a cl_event, as far as the driver tells: PoCL's getters
 * check no object's kind, so another object (a cl_mem, a queue) answers
 * clGetEventInfo with its own fields; those are no command type (every
 * one, extensions' too, lies in 0x11F0..0xFFFF) or no execution status. */
static int check_event_object(cl_event native) {
  cl_command_type type = 0;
  cl_int status = 0;
  cl_int err = um__ocl.clGetEventInfo(native, CL_EVENT_COMMAND_TYPE, sizeof(type), &type, NULL);
  if (err == CL_SUCCESS)
    err = um__ocl.clGetEventInfo(native, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof(status), &status, NULL);
  if (err != CL_SUCCESS)
    return um__set_error(UM_EINVAL, "opencl: the done event is not a cl_event (clGetEventInfo: %s)",
                         um__ocl_error_name(err));
  if (type < CL_COMMAND_NDRANGE_KERNEL || type > 0xFFFF || status > CL_QUEUED)
    return um__set_error(UM_EINVAL, "opencl: the done event is not a cl_event (command type 0x%x, status %d)",
                         (unsigned)type, (int)status);
  return UM_OK;
}

int um__ocl_token_adopt(void *bdev, void *native, void **token) {
  ocl_device *dev = bdev;
  cl_context context = NULL;
  cl_int err;
  int st = check_event_object((cl_event)native);
  if (st != UM_OK)
    return st;
  err = um__ocl.clGetEventInfo((cl_event)native, CL_EVENT_CONTEXT, sizeof(context), &context, NULL);
  if (err != CL_SUCCESS)
    return um__ocl_translate_cl_error(err, "clGetEventInfo");
  if (context != dev->context)
    return um__set_error(UM_EINVAL, "opencl: the event belongs to another context than %s's", dev->name);
  if ((err = um__ocl.clRetainEvent((cl_event)native)) != CL_SUCCESS)
    return um__ocl_translate_cl_error(err, "clRetainEvent");
  *token = native;
  return UM_OK;
}

/* A user event with two references: gate_open drops the opener's. */
int um__ocl_gate_new(void *bdev, void **token) {
  ocl_device *dev = bdev;
  cl_int err = CL_SUCCESS;
  cl_event gate = um__ocl.clCreateUserEvent(dev->context, &err);
  if (gate == NULL || err != CL_SUCCESS)
    return um__ocl_translate_cl_error(err != CL_SUCCESS ? err : CL_OUT_OF_RESOURCES, "clCreateUserEvent");
  um__ocl.clRetainEvent(gate);
  *token = gate;
  return UM_OK;
}

void um__ocl_gate_open(void *bdev, void *token, int status) {
  (void)bdev;
  /* A negative status fails the commands waiting for the gate. */
  um__ocl.clSetUserEventStatus((cl_event)token, status == UM_OK ? CL_COMPLETE : CL_INVALID_OPERATION);
  um__ocl.clReleaseEvent((cl_event)token);
}

int um__ocl_caller_marker(void *bdev, void **token) {
  ocl_device *dev = bdev;
  cl_event marker = NULL;
  cl_int err;
  um__ocl_submit_begin(dev);
  err = um__ocl.clEnqueueMarkerWithWaitList(dev->caller_queue, 0, NULL, &marker);
  if (err == CL_SUCCESS)
    um__ocl.clFlush(dev->caller_queue);
  um__ocl_submit_end(dev);
  if (err != CL_SUCCESS)
    return um__ocl_translate_cl_error(err, "clEnqueueMarkerWithWaitList");
  *token = marker;
  return UM_OK;
}

int um__ocl_token_query(void *bdev, void *token) {
  cl_int execution_status = CL_QUEUED;
  (void)bdev;
  if (um__ocl.clGetEventInfo((cl_event)token, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof(execution_status),
                         &execution_status, NULL) != CL_SUCCESS)
    return 0; /* not known: the waiter goes by the core's own state */
  return execution_status <= CL_COMPLETE;
}

int um__ocl_token_wait(void *bdev, void *token) {
  (void)bdev;
  return um__ocl_wait_for_command((cl_event)token, "clWaitForEvents");
}

/* ------------------------------------------------------------------------ */
/* Adopting the caller's context, device and queue                          */

/* The queue belongs to the context and the device; the context holds the
 * device. Fills *ndevices (the context's, for peer access). */
static int check_adopted(cl_context context, cl_device_id id, cl_command_queue queue, int *ndevices) {
  cl_context qctx = NULL;
  cl_device_id qdev = NULL, ids[64];
  cl_uint n = 0;
  size_t size = 0;
  cl_int err = um__ocl.clGetCommandQueueInfo(queue, CL_QUEUE_CONTEXT, sizeof(qctx), &qctx, NULL);
  if (err == CL_SUCCESS)
    err = um__ocl.clGetCommandQueueInfo(queue, CL_QUEUE_DEVICE, sizeof(qdev), &qdev, NULL);
  if (err == CL_SUCCESS)
    err = um__ocl.clGetContextInfo(context, CL_CONTEXT_DEVICES, sizeof(ids), ids, &size);
  if (err != CL_SUCCESS)
    return um__ocl_translate_cl_error(err, "clGetContextInfo");
  n = (cl_uint)(size / sizeof(ids[0]));
  if (qctx != context || qdev != id)
    return um__set_error(UM_EINVAL, "opencl: the queue belongs to another context or device");
  for (cl_uint i = 0; i < n; i++)
    if (ids[i] == id) {
      *ndevices = (int)n;
      return UM_OK;
    }
  return um__set_error(UM_EINVAL, "opencl: the device is not in the context");
}

int um__ocl_adopt(const um_options *opts, void **ctx, void *context, void *device, void *queue,
                     um__bdev_desc *out) {
  ocl_state *state = *ctx;
  ocl_device *dev = NULL;
  cl_platform_id platform = NULL;
  int ndevices = 0, major = 0, minor = 0, status;
  if ((status = um__vendor_lib_load(&um__ocl_lib, UM_ENOTSUP)) != UM_OK)
    return status;
  if ((status = check_adopted(context, device, queue, &ndevices)) != UM_OK)
    return status;
  if (um__ocl.clGetDeviceInfo(device, CL_DEVICE_PLATFORM, sizeof(platform), &platform, NULL) != CL_SUCCESS ||
      (status = um__ocl_platform_version(platform, &major, &minor)) != UM_OK)
    return status != UM_OK ? status : um__set_error(UM_EINVAL, "opencl: not a device");
  if (state == NULL && (*ctx = state = calloc(1, sizeof(*state))) == NULL)
    return um__set_error(UM_ENOMEM, "opencl: out of host memory");
  if ((status = um__ocl_open_device(device, context, ndevices, major, opts, queue, &dev)) != UM_OK)
    return status;
  /* The context is retained once per adoption: close releases each. */
  if ((status = um__ocl_append_device(state, dev)) != UM_OK ||
      (um__ocl.clRetainContext(context) == CL_SUCCESS &&
       (status = um__ocl_append_context(state, context)) != UM_OK)) {
    if (state->device_count > 0 && state->devices[state->device_count - 1] == dev)
      state->device_count--;
    um__ocl_destroy_device(dev);
    return status;
  }
  return um__ocl_describe(state, state->device_count - 1, out);
}


/* The caller's queue: of dev's context and device, in order. */
static int check_queue(ocl_device *dev, cl_command_queue queue) {
  cl_context context = NULL;
  cl_device_id id = NULL;
  cl_command_queue_properties props = 0;
  if (queue == NULL ||
      um__ocl.clGetCommandQueueInfo(queue, CL_QUEUE_CONTEXT, sizeof(context), &context, NULL) != CL_SUCCESS ||
      um__ocl.clGetCommandQueueInfo(queue, CL_QUEUE_DEVICE, sizeof(id), &id, NULL) != CL_SUCCESS ||
      um__ocl.clGetCommandQueueInfo(queue, CL_QUEUE_PROPERTIES, sizeof(props), &props, NULL) != CL_SUCCESS)
    return um__set_error(UM_EINVAL, "opencl: %p is not a command queue", (void *)queue);
  if (context != dev->context || id != dev->id)
    return um__set_error(UM_EINVAL, "opencl: queue %p is of another %s than device %s", (void *)queue,
                         context != dev->context ? "context" : "device", dev->name);
  if (props & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE)
    return um__set_error(UM_ENOTSUP, "opencl: queue %p runs out of order: unimem orders its work by the queue",
                         (void *)queue);
  return UM_OK;
}

int um__ocl_queue_adopt(void *bdev, void *native, int *q) {
  ocl_device *dev = bdev;
  cl_command_queue queue = native;
  int st = check_queue(dev, queue), n;
  if (st != UM_OK)
    return st;
  if (queue == dev->queue) {
    *q = 0;
    return UM_OK;
  }
  pthread_mutex_lock(&dev->queues_lock);
  n = atomic_load_explicit(&dev->nqueues, memory_order_relaxed);
  for (int i = 1; i < n; i++)
    if (dev->watch[i].queue == queue) {
      *q = i;
      pthread_mutex_unlock(&dev->queues_lock);
      return UM_OK;
    }
  if (n == OCL_QUEUES) {
    pthread_mutex_unlock(&dev->queues_lock);
    return um__set_error(UM_ENOMEM, "opencl: device %s takes at most %d queues of the caller's", dev->name,
                         OCL_QUEUES - 1);
  }
  um__ocl.clRetainCommandQueue(queue);
  dev->watch[n].queue = queue;
  atomic_store_explicit(&dev->nqueues, n + 1, memory_order_release);
  pthread_mutex_unlock(&dev->queues_lock);
  *q = n;
  return UM_OK;
}
