/* OpenCL devices: waiting for commands, submitting on devices that run them
 * inline, and opening, describing and closing the platforms' devices. */
#include "opencl_private.h"

/* ------------------------------------------------------------------------ */
/* Helpers                                                                   */

/* Wait for one command: CL_SUCCESS, or why it failed (its own execution
 * status where it says one, else the wait's error). */
cl_int um__ocl_wait_command_status(cl_event event) {
  cl_int err = um__ocl.clWaitForEvents(1, &event);
  cl_int execution_status = CL_COMPLETE;
  if (err == CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST) {
    /* The command itself failed: its status says why. */
    if (um__ocl.clGetEventInfo(event, CL_EVENT_COMMAND_EXECUTION_STATUS,
                           sizeof(execution_status), &execution_status,
                           NULL) == CL_SUCCESS &&
        execution_status < 0)
      err = execution_status;
  }
  return err;
}

/* Wait for one command and return its execution status as UM_* code. */
int um__ocl_wait_for_command(cl_event event, const char *call) {
  return um__ocl_translate_cl_error(um__ocl_wait_command_status(event), call);
}

/* Submitting on a device that runs commands inline.
 *
 * PoCL's basic device ("cpu-minimal" from PoCL 5) has no thread of its own:
 * a command runs inside the clEnqueue* call that submits it, on the
 * caller's thread, or, when it must wait for a command still running on
 * another thread, inside the call that finishes that one. PoCL 3.1 gets
 * that second case wrong twice: pocl_broadcast holds the waiting command's
 * event lock while pocl_basic_notify runs it, and running it takes that
 * lock again (one thread blocked on a mutex it owns); and a blocking read
 * or write so submitted returns before its command ran (pocl_basic_join
 * runs only what is ready). The model test found both (tests/test_model.c,
 * 4 threads on one device: 2 runs in 6 hung, others read stale bytes). On
 * such a device every call that may submit or run commands is made under
 * submit_lock: the command before it then always finished inside an earlier
 * call, and each one runs at once, in its own call. It costs no
 * parallelism the device had: it ran one command at a time anyway.
 *
 * One lock for every such device of the process: managers and adopted
 * devices may share a cl_device_id (PoCL runs a device's commands from one
 * list), and a peer copy's wait list names the other device's command.
 * Recursive: a command's completion callback runs inside the call that
 * submitted it, and callbacks may submit (callbacks_reenter). A command
 * that waits for a user event (a gate) is not covered: opening the gate
 * runs it inside clSetUserEventStatus, which still deadlocks on PoCL 3.1. */
static pthread_mutex_t submit_lock = PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP;

void um__ocl_submit_begin(const ocl_device *dev) {
  if (dev->runs_inline) {
    UM__TEST_POINT(UM__TP_SUBMIT_INLINE, dev);
    pthread_mutex_lock(&submit_lock);
  }
}

void um__ocl_submit_end(const ocl_device *dev) {
  if (dev->runs_inline)
    pthread_mutex_unlock(&submit_lock);
}

/* Whether a command has left the queue's hands: complete, or failed (a
 * negative status). A failed query counts as ended too: the wait that
 * follows reports the error. */
static int command_ended(void *event) {
  cl_int execution_status = CL_QUEUED;
  if (um__ocl.clGetEventInfo((cl_event)event, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof(execution_status),
                         &execution_status, NULL) != CL_SUCCESS)
    return 1;
  return execution_status <= CL_COMPLETE;
}

/* um__ocl_wait_for_command for a blocking call of dev: with wait_spin_ns, the
 * command's status is polled for that long first, so that the caller
 * returns as soon as it completes instead of after the driver's wake-up of
 * a sleeping thread (most of a blocking small read on PoCL). The queue is flushed first: a command nobody flushed may never
 * start, and only clWaitForEvents flushes by itself. */
int um__ocl_wait_for_own_command(ocl_device *dev, cl_event event, const char *call) {
  if (dev->spin_ns != 0) {
    um__ocl_submit_begin(dev);
    um__ocl.clFlush(dev->queue);
    um__ocl_submit_end(dev);
    if (um__spin_until(dev->spin_ns, command_ended, event) != 0 && dev->settle_ns != 0) {
      atomic_store_explicit(&dev->spun_end_ns, um__spin_clock_ns(), memory_order_relaxed);
      UM__TEST_POINT(UM__TP_SPUN_END, dev);
    }
  }
  return um__ocl_wait_for_command(event, call);
}

/* Before a blocking call with wait_spin_ns submits its command: on a CPU
 * device whose commands run on the driver's threads (PoCL's pthread
 * device), those threads share the CPUs with the caller and are still
 * finishing a command for a few microseconds after its status reads
 * complete. A command submitted in that window waited for the driver
 * thread's next wake-up, three times as long as one submitted a few
 * microseconds later (docs/design.md, Decisions: the
 * settle after a spun end). So such a call waits, spinning, until settle_ns have passed
 * since a spinning wait of the device last saw a command end. Calls that
 * slept, and calls made later than that, do not wait. */
void um__ocl_settle(ocl_device *dev) {
  uint64_t end, until;
  if (dev->settle_ns == 0)
    return;
  end = atomic_load_explicit(&dev->spun_end_ns, memory_order_relaxed);
  until = end + dev->settle_ns;
  if (end == 0 || um__spin_clock_ns() >= until)
    return;
  UM__TEST_POINT(UM__TP_SETTLE, dev);
  um__spin_to(until);
}

/* A string device property, truncated to fit out (the query itself fails
 * with CL_INVALID_VALUE on a too-small buffer, so ask for the size first). */
static int query_device_string(cl_device_id id, cl_device_info param,
                               char *out, size_t cap) {
  size_t size = 0;
  char *text;
  cl_int err = um__ocl.clGetDeviceInfo(id, param, 0, NULL, &size);
  if (err != CL_SUCCESS)
    return um__ocl_translate_cl_error(err, "clGetDeviceInfo");
  text = malloc(size + 1);
  if (text == NULL)
    return um__set_error(UM_ENOMEM, "opencl: out of host memory");
  err = um__ocl.clGetDeviceInfo(id, param, size, text, NULL);
  if (err != CL_SUCCESS) {
    free(text);
    return um__ocl_translate_cl_error(err, "clGetDeviceInfo");
  }
  text[size] = '\0';
  snprintf(out, cap, "%s", text);
  free(text);
  return UM_OK;
}

static void trim_trailing_spaces(char *s) {
  size_t n = strlen(s);
  while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t'))
    s[--n] = '\0';
}

/* "OpenCL <major>.<minor> <vendor text>", as the specification fixes it. */
int um__ocl_platform_version(cl_platform_id platform, int *major,
                            int *minor) {
  char version[128];
  cl_int err = um__ocl.clGetPlatformInfo(platform, CL_PLATFORM_VERSION,
                                     sizeof(version), version, NULL);
  if (err != CL_SUCCESS)
    return um__ocl_translate_cl_error(err, "clGetPlatformInfo");
  version[sizeof(version) - 1] = '\0';
  if (sscanf(version, "OpenCL %d.%d", major, minor) != 2)
    return um__set_error(UM_EBACKEND, "opencl: unreadable platform version "
                                      "\"%s\"",
                         version);
  return UM_OK;
}

static cl_command_queue create_queue(cl_context context, cl_device_id id,
                                     int platform_major, cl_int *err) {
  /* In-order (no properties): issue order is execution order. The 2.0 entry
   * point is only dispatched by 2.0+ platforms. */
  if (platform_major >= 2 && um__ocl.clCreateCommandQueueWithProperties != NULL)
    return um__ocl.clCreateCommandQueueWithProperties(context, id, NULL, err);
  if (um__ocl.clCreateCommandQueue != NULL)
    return um__ocl.clCreateCommandQueue(context, id, 0, err);
  return um__ocl.clCreateCommandQueueWithProperties(context, id, NULL, err);
}

/* An in-order queue on dev, into *queue. */
static int make_queue(ocl_device *dev, int platform_major, cl_command_queue *queue) {
  cl_int err = CL_SUCCESS;
  *queue = create_queue(dev->context, dev->id, platform_major, &err);
  if (*queue == NULL || err != CL_SUCCESS) {
    *queue = NULL;
    return um__ocl_translate_cl_error(err != CL_SUCCESS ? err : CL_OUT_OF_RESOURCES,
                              "clCreateCommandQueue");
  }
  return UM_OK;
}

int um__ocl_append_device(ocl_state *state, ocl_device *dev) {
  if (state->device_count == state->device_capacity) {
    int capacity = state->device_capacity ? state->device_capacity * 2 : 4;
    ocl_device **grown =
        realloc(state->devices, (size_t)capacity * sizeof(*grown));
    if (grown == NULL)
      return um__set_error(UM_ENOMEM, "opencl: out of host memory");
    state->devices = grown;
    state->device_capacity = capacity;
  }
  state->devices[state->device_count++] = dev;
  return UM_OK;
}

int um__ocl_append_context(ocl_state *state, cl_context context) {
  cl_context *grown = realloc(
      state->contexts, ((size_t)state->context_count + 1) * sizeof(*grown));
  if (grown == NULL)
    return um__set_error(UM_ENOMEM, "opencl: out of host memory");
  state->contexts = grown;
  state->contexts[state->context_count++] = context;
  return UM_OK;
}


void um__ocl_destroy_device(ocl_device *dev) {
  while (atomic_load_explicit(&dev->walk_tails, memory_order_acquire) != 0)
    sched_yield();
  um__ocl_release_later(dev);
  for (int q = 1; q < atomic_load(&dev->nqueues); q++) {
    um__ocl.clFinish(dev->watch[q].queue);
    um__ocl.clReleaseCommandQueue(dev->watch[q].queue);
  }
  pthread_mutex_destroy(&dev->queues_lock);
  if (dev->caller_queue != NULL)
    um__ocl.clReleaseCommandQueue(dev->caller_queue);
  if (dev->queue != NULL) {
    um__ocl.clFinish(dev->queue);
    um__ocl.clReleaseCommandQueue(dev->queue);
  }
  free(dev);
}

/* Whether dev is PoCL's basic device (submit_lock). PoCL names it after its
 * driver: "basic-<cpu>" up to PoCL 4, "cpu-minimal-<cpu>" from PoCL 5. */
static int runs_commands_inline(const ocl_device *dev) {
  char platform[128];
  if (um__ocl.clGetPlatformInfo(dev->platform, CL_PLATFORM_NAME, sizeof(platform), platform, NULL) !=
          CL_SUCCESS ||
      strstr(platform, "Portable Computing Language") == NULL)
    return 0;
  return strncmp(dev->name, "basic", 5) == 0 || strncmp(dev->name, "cpu-minimal", 11) == 0;
}

/* dev's properties: name, memory, whether its memory is host memory, SVM. */
static int query_device(ocl_device *dev, int platform_major, const um_options *opts) {
  cl_ulong global_mem = 0, max_alloc = 0;
  cl_device_svm_capabilities svm = 0;
  cl_device_type type = 0;
  cl_bool unified = CL_FALSE;
  cl_int err;
  int status = query_device_string(dev->id, CL_DEVICE_NAME, dev->name, sizeof(dev->name));
  if (status != UM_OK)
    return status;
  trim_trailing_spaces(dev->name);
  err = um__ocl.clGetDeviceInfo(dev->id, CL_DEVICE_GLOBAL_MEM_SIZE, sizeof(global_mem), &global_mem, NULL);
  if (err == CL_SUCCESS)
    err = um__ocl.clGetDeviceInfo(dev->id, CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof(max_alloc), &max_alloc, NULL);
  if (err == CL_SUCCESS)
    err = um__ocl.clGetDeviceInfo(dev->id, CL_DEVICE_PLATFORM, sizeof(dev->platform), &dev->platform, NULL);
  if (err != CL_SUCCESS)
    return um__ocl_translate_cl_error(err, "clGetDeviceInfo");
  dev->limit_bytes = opts != NULL ? opts->device_limit_bytes : 0;
  dev->spin_ns = opts != NULL ? opts->wait_spin_ns : 0;
  dev->total_bytes = global_mem;
  if (dev->limit_bytes != 0 && dev->limit_bytes < dev->total_bytes)
    dev->total_bytes = dev->limit_bytes;
  dev->max_alloc_bytes = max_alloc;
  {
    cl_uint bits = 0;
    if (um__ocl.clGetDeviceInfo(dev->id, CL_DEVICE_MEM_BASE_ADDR_ALIGN, sizeof(bits), &bits, NULL) != CL_SUCCESS)
      bits = 0;
    /* In bits; at least 256 bytes, and a power of two. */
    dev->base_align = 256;
    while (dev->base_align < bits / 8u)
      dev->base_align <<= 1;
  }
  /* A CPU device's "device memory" is host memory, and so is an integrated
   * GPU's (CL_DEVICE_HOST_UNIFIED_MEMORY, deprecated in 2.0 but answered by
   * every driver): reading pageable memory costs them nothing extra. A
   * failed query leaves the device counted as discrete. */
  if (um__ocl.clGetDeviceInfo(dev->id, CL_DEVICE_TYPE, sizeof(type), &type, NULL) != CL_SUCCESS)
    type = 0;
  if (um__ocl.clGetDeviceInfo(dev->id, CL_DEVICE_HOST_UNIFIED_MEMORY, sizeof(unified), &unified, NULL) !=
      CL_SUCCESS)
    unified = CL_FALSE;
  dev->host_memory = (type & CL_DEVICE_TYPE_CPU) != 0 || unified == CL_TRUE;
  dev->runs_inline = runs_commands_inline(dev);
  if (dev->spin_ns != 0 && (type & CL_DEVICE_TYPE_CPU) != 0 && !dev->runs_inline) {
    dev->settle_ns = OCL_SETTLE_NS;
    UM__TEST_POINT(UM__TP_SETTLE_TIME, &dev->settle_ns);
  }
  /* Devices before 2.0 reject the query (CL_INVALID_VALUE): no SVM. */
  if (platform_major >= 2 && um__ocl.clSVMAlloc != NULL &&
      um__ocl.clGetDeviceInfo(dev->id, CL_DEVICE_SVM_CAPABILITIES, sizeof(svm), &svm, NULL) == CL_SUCCESS)
    dev->fine_grain_svm = (svm & CL_DEVICE_SVM_FINE_GRAIN_BUFFER) != 0;
  return UM_OK;
}

/* Describe one device and give it its queue, and the caller's: caller_queue
 * (retained here; an adopted device's), or a new one. */
int um__ocl_open_device(cl_device_id id, cl_context context, int context_devices, int platform_major,
                       const um_options *opts, cl_command_queue caller_queue, ocl_device **out) {
  int status;
  ocl_device *dev = calloc(1, sizeof(*dev));
  if (dev == NULL)
    return um__set_error(UM_ENOMEM, "opencl: out of host memory");
  dev->id = id;
  dev->context = context;
  dev->context_devices = context_devices;
  atomic_init(&dev->walk_tails, 0);
  atomic_init(&dev->later_locked, false);
  atomic_init(&dev->nqueues, 1);
  pthread_mutex_init(&dev->queues_lock, NULL);
  for (int q = 0; q < OCL_QUEUES; q++) {
    dev->watch[q].dev = dev;
    atomic_init(&dev->watch[q].locked, false);
    atomic_init(&dev->watch[q].order_held, false);
    atomic_init(&dev->watch[q].unordered, 0);
    atomic_init(&dev->watch[q].seq, 0);
    atomic_init(&dev->watch[q].vouched, 0);
    atomic_init(&dev->watch[q].nriders, 0);
    dev->watch[q].kicked = 0;
  }
  if (caller_queue != NULL && um__ocl.clRetainCommandQueue(caller_queue) == CL_SUCCESS)
    dev->caller_queue = caller_queue;
  if ((status = query_device(dev, platform_major, opts)) != UM_OK ||
      (status = make_queue(dev, platform_major, &dev->queue)) != UM_OK ||
      (dev->caller_queue == NULL &&
       (status = make_queue(dev, platform_major, &dev->caller_queue)) != UM_OK)) {
    um__ocl_destroy_device(dev);
    return status;
  }
  dev->watch[0].queue = dev->queue;
  *out = dev;
  return UM_OK;
}

/* One context for all of the platform's devices, then one queue each. On
 * failure nothing of this platform stays in state. */
static int open_platform(ocl_state *state, cl_platform_id platform,
                         const um_options *opts) {
  cl_uint count = 0, i;
  cl_device_id *ids = NULL;
  cl_context context = NULL;
  cl_int err;
  int major = 0, minor = 0, status;
  int first_device = state->device_count;
  cl_context_properties properties[] = {
      CL_CONTEXT_PLATFORM, (cl_context_properties)platform, 0};

  status = um__ocl_platform_version(platform, &major, &minor);
  if (status != UM_OK)
    return status;
  /* Fill, migration and CL_MAP_WRITE_INVALIDATE_REGION are 1.2. */
  if (major < 1 || (major == 1 && minor < 2))
    return um__set_error(UM_ENOTSUP, "opencl: platform version %d.%d is "
                                     "older than 1.2",
                         major, minor);

  err = um__ocl.clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, 0, NULL, &count);
  if (err == CL_DEVICE_NOT_FOUND || (err == CL_SUCCESS && count == 0))
    return UM_OK;
  if (err != CL_SUCCESS)
    return um__ocl_translate_cl_error(err, "clGetDeviceIDs");
  ids = malloc(count * sizeof(*ids));
  if (ids == NULL)
    return um__set_error(UM_ENOMEM, "opencl: out of host memory");
  err = um__ocl.clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, count, ids, &count);
  if (err != CL_SUCCESS) {
    status = um__ocl_translate_cl_error(err, "clGetDeviceIDs");
    goto fail;
  }

  context = um__ocl.clCreateContext(properties, count, ids, NULL, NULL, &err);
  if (context == NULL || err != CL_SUCCESS) {
    context = NULL;
    status = um__ocl_translate_cl_error(err != CL_SUCCESS ? err : CL_OUT_OF_RESOURCES,
                                "clCreateContext");
    goto fail;
  }

  for (i = 0; i < count; i++) {
    ocl_device *dev = NULL;
    status = um__ocl_open_device(ids[i], context, (int)count, major, opts, NULL, &dev);
    if (status != UM_OK)
      goto fail;
    status = um__ocl_append_device(state, dev);
    if (status != UM_OK) {
      um__ocl_destroy_device(dev);
      goto fail;
    }
  }

  status = um__ocl_append_context(state, context);
  if (status != UM_OK)
    goto fail;
  free(ids);
  return UM_OK;

fail:
  while (state->device_count > first_device)
    um__ocl_destroy_device(state->devices[--state->device_count]);
  if (context != NULL)
    um__ocl.clReleaseContext(context);
  free(ids);
  return status;
}

/* Whether platform is one that UNIMEM_OPENCL_PLATFORM (want) names: its
 * CL_PLATFORM_NAME contains want. Each platform gets a context of its own,
 * and events, buffers and peer copies never cross contexts: a machine with
 * PoCL beside a GPU's platform gives every chain between the two a host
 * thread's staged copy. Choosing one platform keeps a manager within one
 * context, and spares it the context of a platform it does not use
 * (NVIDIA's takes hundreds of milliseconds to create and to release). */
static int platform_named(cl_platform_id platform, const char *want, char *name, size_t cap) {
  if (um__ocl.clGetPlatformInfo(platform, CL_PLATFORM_NAME, cap, name, NULL) != CL_SUCCESS) {
    snprintf(name, cap, "unnamed");
    return 0;
  }
  name[cap - 1] = '\0';
  return strstr(name, want) != NULL;
}

/* ------------------------------------------------------------------------ */
/* Open, describe, close                                                     */


int um__ocl_open(const um_options *opts, void **ctx, int *count) {
  cl_uint platform_count = 0, i;
  cl_platform_id *platforms = NULL;
  ocl_state *state = NULL;
  const char *want;
  cl_int err;
  int status;

  status = um__vendor_lib_load(&um__ocl_lib, UM_ENODEV);
  if (status != UM_OK)
    return status;

  state = calloc(1, sizeof(*state));
  if (state == NULL)
    return um__set_error(UM_ENOMEM, "opencl: out of host memory");

  err = um__ocl.clGetPlatformIDs(0, NULL, &platform_count);
  /* The ICD loader answers CL_PLATFORM_NOT_FOUND_KHR when no driver is
   * installed: that is "no devices here", not a failure. */
  if (err == CL_PLATFORM_NOT_FOUND_KHR)
    goto done;
  if (err != CL_SUCCESS) {
    status = um__ocl_translate_cl_error(err, "clGetPlatformIDs");
    goto fail;
  }
  if (platform_count == 0)
    goto done;
  platforms = malloc(platform_count * sizeof(*platforms));
  if (platforms == NULL) {
    status = um__set_error(UM_ENOMEM, "opencl: out of host memory");
    goto fail;
  }
  err = um__ocl.clGetPlatformIDs(platform_count, platforms, &platform_count);
  if (err != CL_SUCCESS) {
    status = um__ocl_translate_cl_error(err, "clGetPlatformIDs");
    goto fail;
  }

  /* A platform that cannot be opened is skipped, as the ICD loader skips a
   * vendor that fails: the others still work. Read at every open, so that
   * managers of one process may choose differently. */
  want = getenv(OCL_PLATFORM_ENV);
  for (i = 0; i < platform_count; i++) {
    char name[128];
    if (want != NULL && want[0] != '\0' && !platform_named(platforms[i], want, name, sizeof(name))) {
      um__log(opts, UM_LOG_INFO, "opencl: platform %u (%s) skipped: " OCL_PLATFORM_ENV "=\"%s\"", (unsigned)i,
              name, want);
      continue;
    }
    status = open_platform(state, platforms[i], opts);
    if (status == UM_ENOMEM)
      goto fail;
    if (status != UM_OK)
      um__log(opts, UM_LOG_WARN, "opencl: platform %u skipped: %s",
              (unsigned)i, um_last_error());
  }

done:
  free(platforms);
  *ctx = state;
  *count = state->device_count;
  return UM_OK;

fail:
  free(platforms);
  um__ocl_close(state);
  return status;
}

int um__ocl_describe(void *ctx, int i, um__bdev_desc *out) {
  ocl_state *state = ctx;
  ocl_device *dev;
  if (state == NULL || out == NULL || i < 0 || i >= state->device_count)
    return um__set_error(UM_EINVAL, "opencl: no device %d", i);
  dev = state->devices[i];
  memset(out, 0, sizeof(*out));
  snprintf(out->name, sizeof(out->name), "%s", dev->name);
  out->caps = UM_CAP_PINNED | UM_CAP_ASYNC;
  out->locations = (1u << UM_DEVICE) | (1u << UM_PINNED);
  if (dev->fine_grain_svm) {
    out->caps |= UM_CAP_UNIFIED;
    out->locations |= 1u << UM_UNIFIED;
  }
  if (dev->context_devices > 1)
    out->caps |= UM_CAP_PEER;
  out->total_bytes = dev->total_bytes;
  out->host_memory = dev->host_memory;
  /* DEVICE and PINNED blocks are sub-buffers of a segment's cl_mem, which
   * needs clCreateSubBuffer (OpenCL 1.1); UNIFIED ones are pointers into
   * its SVM allocation. */
  if (um__ocl.clCreateSubBuffer != NULL)
    out->carve_locations = (1u << UM_DEVICE) | (1u << UM_PINNED);
  if (dev->fine_grain_svm)
    out->carve_locations |= 1u << UM_UNIFIED;
  out->carve_align = dev->base_align;
  out->bdev = dev;
  return UM_OK;
}

void um__ocl_close(void *ctx) {
  ocl_state *state = ctx;
  int i;
  if (state == NULL)
    return;
  /* Queues first: each holds a reference on its context. */
  for (i = 0; i < state->device_count; i++)
    um__ocl_destroy_device(state->devices[i]);
  for (i = 0; i < state->context_count; i++)
    um__ocl.clReleaseContext(state->contexts[i]);
  free(state->devices);
  free(state->contexts);
  free(state);
}

