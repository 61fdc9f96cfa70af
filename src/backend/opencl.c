/* The OpenCL backend: every device of every OpenCL platform.
 *
 * The vendor library (normally the ICD loader, libOpenCL.so.1) is loaded at
 * run time, once per process (base/vendor_lib.c), so that unimem neither
 * links against OpenCL nor needs it installed to run. <CL/cl.h> is included for its types and
 * constants only; every call goes through the `ocl` table of entry points.
 *
 * Layout of the state:
 * - one cl_context per platform, holding all of that platform's devices, so
 *   that buffers of one device can be copied to another of the same platform
 *   with clEnqueueCopyBuffer (this backend's "peer access"); only the
 *   platforms UNIMEM_OPENCL_PLATFORM names, where it is set;
 * - one in-order command queue per device (OpenCL queues may be used from
 *   several threads at once), so every operation issued on a device runs in
 *   issue order even without after[] tokens; and a second one for the
 *   caller's own commands (um_device_native_get), so that a caller's kernel
 *   waiting for a gate never holds up unimem's copies;
 * - adopted devices (um_device_adopt_opencl): the caller's context and
 *   queue, retained; the caller's queue is the caller queue, and unimem
 *   makes its own in that context;
 * - no count of the bytes held: the core keeps it (um_device's
 *   limited_bytes), for device_limit_bytes and because OpenCL has no
 *   standard free-memory query.
 *
 * Blocks by location:
 * - UM_DEVICE:  clCreateBuffer(CL_MEM_READ_WRITE); host = NULL;
 *               handle = the cl_mem.
 * - UM_PINNED:  clCreateBuffer(CL_MEM_ALLOC_HOST_PTR), mapped for its whole
 *               life; host = the mapped pointer; handle = the cl_mem.
 * - UM_UNIFIED: clSVMAlloc with fine-grained buffer SVM, where the device has
 *               it; host = handle = the SVM pointer.
 * The core reaches PINNED and UNIFIED blocks through their host pointer, so
 * transfers and map() only ever see DEVICE blocks.
 */
#define CL_TARGET_OPENCL_VERSION 300

#include <CL/cl.h>
#include <stddef.h>
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "atomic.h"
#include "testhook.h"

/* cl_khr_icd's "no platform installed" answer, from cl_ext.h. */
#ifndef CL_PLATFORM_NOT_FOUND_KHR
#define CL_PLATFORM_NOT_FOUND_KHR -1001
#endif

#define OCL_DEFAULT_LIBRARY "libOpenCL.so.1"
#define OCL_LIBRARY_ENV "UNIMEM_OPENCL_LIBRARY"
/* Only platforms whose CL_PLATFORM_NAME contains this text are opened. */
#define OCL_PLATFORM_ENV "UNIMEM_OPENCL_PLATFORM"
/* settle(): how long after a spinning wait saw a command end a blocking
 * call on a CPU device leaves the driver's threads before it submits. */
#define OCL_SETTLE_NS 5000u

/* ------------------------------------------------------------------------ */
/* Entry points                                                              */

typedef void(CL_CALLBACK *ocl_event_notify_fn)(cl_event event,
                                               cl_int event_command_status,
                                               void *user_data);

/* XX(return type, name, parameter list). Without these the backend cannot
 * work at all: their absence makes open() answer UM_ENODEV. Everything here
 * is OpenCL 1.2 or older. */
#define OCL_REQUIRED_ENTRY_POINTS(XX)                                          \
  XX(cl_int, clGetPlatformIDs, (cl_uint, cl_platform_id *, cl_uint *))         \
  XX(cl_int, clGetPlatformInfo,                                                \
     (cl_platform_id, cl_platform_info, size_t, void *, size_t *))             \
  XX(cl_int, clGetDeviceIDs,                                                   \
     (cl_platform_id, cl_device_type, cl_uint, cl_device_id *, cl_uint *))     \
  XX(cl_int, clGetDeviceInfo,                                                  \
     (cl_device_id, cl_device_info, size_t, void *, size_t *))                 \
  XX(cl_context, clCreateContext,                                              \
     (const cl_context_properties *, cl_uint, const cl_device_id *,            \
      void(CL_CALLBACK *)(const char *, const void *, size_t, void *),         \
      void *, cl_int *))                                                       \
  XX(cl_int, clReleaseContext, (cl_context))                                   \
  XX(cl_int, clReleaseCommandQueue, (cl_command_queue))                        \
  XX(cl_mem, clCreateBuffer,                                                   \
     (cl_context, cl_mem_flags, size_t, void *, cl_int *))                     \
  XX(cl_int, clReleaseMemObject, (cl_mem))                                     \
  XX(cl_int, clEnqueueReadBuffer,                                              \
     (cl_command_queue, cl_mem, cl_bool, size_t, size_t, void *, cl_uint,      \
      const cl_event *, cl_event *))                                           \
  XX(cl_int, clEnqueueWriteBuffer,                                             \
     (cl_command_queue, cl_mem, cl_bool, size_t, size_t, const void *,         \
      cl_uint, const cl_event *, cl_event *))                                  \
  XX(cl_int, clEnqueueCopyBuffer,                                              \
     (cl_command_queue, cl_mem, cl_mem, size_t, size_t, size_t, cl_uint,       \
      const cl_event *, cl_event *))                                           \
  XX(cl_int, clEnqueueFillBuffer,                                              \
     (cl_command_queue, cl_mem, const void *, size_t, size_t, size_t,          \
      cl_uint, const cl_event *, cl_event *))                                  \
  XX(void *, clEnqueueMapBuffer,                                               \
     (cl_command_queue, cl_mem, cl_bool, cl_map_flags, size_t, size_t,         \
      cl_uint, const cl_event *, cl_event *, cl_int *))                        \
  XX(cl_int, clEnqueueUnmapMemObject,                                          \
     (cl_command_queue, cl_mem, void *, cl_uint, const cl_event *,             \
      cl_event *))                                                             \
  XX(cl_int, clEnqueueMigrateMemObjects,                                       \
     (cl_command_queue, cl_uint, const cl_mem *, cl_mem_migration_flags,       \
      cl_uint, const cl_event *, cl_event *))                                  \
  XX(cl_int, clFlush, (cl_command_queue))                                      \
  XX(cl_int, clFinish, (cl_command_queue))                                     \
  XX(cl_int, clWaitForEvents, (cl_uint, const cl_event *))                     \
  XX(cl_int, clGetEventInfo,                                                   \
     (cl_event, cl_event_info, size_t, void *, size_t *))                      \
  XX(cl_int, clRetainEvent, (cl_event))                                        \
  XX(cl_int, clReleaseEvent, (cl_event))                                       \
  XX(cl_int, clSetEventCallback,                                               \
     (cl_event, cl_int, ocl_event_notify_fn, void *))                          \
  XX(cl_int, clEnqueueMarkerWithWaitList,                                      \
     (cl_command_queue, cl_uint, const cl_event *, cl_event *))                \
  XX(cl_event, clCreateUserEvent, (cl_context, cl_int *))                      \
  XX(cl_int, clSetUserEventStatus, (cl_event, cl_int))                         \
  XX(cl_int, clRetainContext, (cl_context))                                    \
  XX(cl_int, clRetainCommandQueue, (cl_command_queue))                         \
  XX(cl_int, clGetContextInfo,                                                 \
     (cl_context, cl_context_info, size_t, void *, size_t *))                  \
  XX(cl_int, clGetCommandQueueInfo,                                            \
     (cl_command_queue, cl_command_queue_info, size_t, void *, size_t *))

/* Entry points that may be missing. Queue creation needs one of the two
 * (the 2.0 call is preferred, the 1.x one is what 1.2 drivers have); the SVM
 * pair only gates UM_UNIFIED; the memory-object pair, imports of the
 * caller's cl_mem (DLPack). */
#define OCL_OPTIONAL_ENTRY_POINTS(XX)                                          \
  XX(cl_command_queue, clCreateCommandQueueWithProperties,                     \
     (cl_context, cl_device_id, const cl_queue_properties *, cl_int *))        \
  XX(cl_command_queue, clCreateCommandQueue,                                   \
     (cl_context, cl_device_id, cl_command_queue_properties, cl_int *))        \
  XX(void *, clSVMAlloc, (cl_context, cl_svm_mem_flags, size_t, cl_uint))      \
  XX(void, clSVMFree, (cl_context, void *))                                    \
  XX(cl_int, clGetMemObjectInfo,                                               \
     (cl_mem, cl_mem_info, size_t, void *, size_t *))                          \
  XX(cl_mem, clCreateSubBuffer,                                                \
     (cl_mem, cl_mem_flags, cl_buffer_create_type, const void *, cl_int *))

/* The loaded library: filled once by ocl_lib's load, read-only afterwards. */
typedef struct ocl_api {
#define OCL_ENTRY_MEMBER_(ret, name, params) ret(CL_API_CALL *name) params;
  OCL_REQUIRED_ENTRY_POINTS(OCL_ENTRY_MEMBER_)
  OCL_OPTIONAL_ENTRY_POINTS(OCL_ENTRY_MEMBER_)
#undef OCL_ENTRY_MEMBER_
} ocl_api;

static ocl_api ocl;

static const um__vendor_entry ocl_entries[] = {
#define OCL_REQUIRED_(ret, name, params) {#name, offsetof(ocl_api, name), true},
#define OCL_OPTIONAL_(ret, name, params) {#name, offsetof(ocl_api, name), false},
    OCL_REQUIRED_ENTRY_POINTS(OCL_REQUIRED_) OCL_OPTIONAL_ENTRY_POINTS(OCL_OPTIONAL_)
#undef OCL_REQUIRED_
#undef OCL_OPTIONAL_
};

/* The optional entry points that go in pairs. */
static int ocl_loaded(um__vendor_lib *lib) {
  if (ocl.clCreateCommandQueueWithProperties == NULL && ocl.clCreateCommandQueue == NULL) {
    snprintf(lib->failure, sizeof(lib->failure),
             "clCreateCommandQueueWithProperties and clCreateCommandQueue missing in %s", lib->path);
    return -1;
  }
  /* UNIFIED needs both halves of the pair. */
  if (ocl.clSVMAlloc == NULL || ocl.clSVMFree == NULL) {
    ocl.clSVMAlloc = NULL;
    ocl.clSVMFree = NULL;
  }
  return 0;
}

static const char *const ocl_names[] = {OCL_DEFAULT_LIBRARY, NULL};

/* The library is never unloaded: vendor drivers keep threads and atexit
 * handlers that do not survive dlclose (the ICD loader does the same). */
static um__vendor_lib ocl_lib = UM__VENDOR_LIB_INIT("opencl", OCL_LIBRARY_ENV, ocl_names, ocl_entries, &ocl, ocl_loaded);

/* ------------------------------------------------------------------------ */
/* Errors                                                                    */

#define OCL_ERROR_NAMES(XX)                                                    \
  XX(CL_DEVICE_NOT_FOUND)                                                      \
  XX(CL_DEVICE_NOT_AVAILABLE)                                                  \
  XX(CL_COMPILER_NOT_AVAILABLE)                                                \
  XX(CL_MEM_OBJECT_ALLOCATION_FAILURE)                                         \
  XX(CL_OUT_OF_RESOURCES)                                                      \
  XX(CL_OUT_OF_HOST_MEMORY)                                                    \
  XX(CL_PROFILING_INFO_NOT_AVAILABLE)                                          \
  XX(CL_MEM_COPY_OVERLAP)                                                      \
  XX(CL_IMAGE_FORMAT_MISMATCH)                                                 \
  XX(CL_IMAGE_FORMAT_NOT_SUPPORTED)                                            \
  XX(CL_BUILD_PROGRAM_FAILURE)                                                 \
  XX(CL_MAP_FAILURE)                                                           \
  XX(CL_MISALIGNED_SUB_BUFFER_OFFSET)                                          \
  XX(CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST)                             \
  XX(CL_INVALID_VALUE)                                                         \
  XX(CL_INVALID_DEVICE_TYPE)                                                   \
  XX(CL_INVALID_PLATFORM)                                                      \
  XX(CL_INVALID_DEVICE)                                                        \
  XX(CL_INVALID_CONTEXT)                                                       \
  XX(CL_INVALID_QUEUE_PROPERTIES)                                              \
  XX(CL_INVALID_COMMAND_QUEUE)                                                 \
  XX(CL_INVALID_HOST_PTR)                                                      \
  XX(CL_INVALID_MEM_OBJECT)                                                    \
  XX(CL_INVALID_EVENT_WAIT_LIST)                                               \
  XX(CL_INVALID_EVENT)                                                         \
  XX(CL_INVALID_OPERATION)                                                     \
  XX(CL_INVALID_BUFFER_SIZE)                                                   \
  XX(CL_INVALID_PROPERTY)                                                      \
  XX(CL_PLATFORM_NOT_FOUND_KHR)

static const char *ocl_error_name(cl_int err) {
  switch (err) {
#define OCL_ERROR_NAME_CASE_(name)                                             \
  case name:                                                                   \
    return #name;
    OCL_ERROR_NAMES(OCL_ERROR_NAME_CASE_)
#undef OCL_ERROR_NAME_CASE_
  default:
    return "CL error";
  }
}

/* The one place where OpenCL status codes become UM_E* codes. Records
 * "CL_NAME (code) in call" for um_last_error() and returns the code. */
static int translate_cl_error(cl_int err, const char *call) {
  int status;
  if (err == CL_SUCCESS)
    return UM_OK;
  switch (err) {
  case CL_MEM_OBJECT_ALLOCATION_FAILURE:
  case CL_OUT_OF_RESOURCES:
  case CL_OUT_OF_HOST_MEMORY:
  case CL_INVALID_BUFFER_SIZE:
    status = UM_ENOMEM;
    break;
  case CL_DEVICE_NOT_AVAILABLE:
  case CL_DEVICE_NOT_FOUND:
  case CL_PLATFORM_NOT_FOUND_KHR:
    status = UM_ENODEV;
    break;
  case CL_INVALID_VALUE:
  case CL_INVALID_HOST_PTR:
  case CL_INVALID_MEM_OBJECT:
  case CL_INVALID_EVENT_WAIT_LIST:
  case CL_INVALID_EVENT:
  case CL_MEM_COPY_OVERLAP:
  case CL_MISALIGNED_SUB_BUFFER_OFFSET:
    status = UM_EINVAL;
    break;
  default:
    status = UM_EBACKEND;
    break;
  }
  return um__set_error(status, "%s (%d) in %s", ocl_error_name(err), (int)err,
                       call);
}

/* ------------------------------------------------------------------------ */
/* State                                                                     */

/* Tokens released on a thread that reports nothing, kept for the device's
 * next walk to release (ocl_native_release). */
#define OCL_RELEASE_LATER 1024

typedef struct ocl_device {
  cl_platform_id platform;
  cl_device_id id;
  cl_context context; /* shared by every device of the platform; not owned */
  cl_command_queue queue;        /* unimem's */
  cl_command_queue caller_queue; /* the caller's (um_device_native) */
  int context_devices; /* devices in context: peers exist when > 1 */
  int fine_grain_svm;  /* UM_UNIFIED can be given */
  int host_memory;     /* a CPU device, or one sharing the host's memory */
  uint64_t total_bytes;     /* reported: global memory, capped by the limit */
  uint64_t limit_bytes;     /* device_limit_bytes, 0 for none */
  uint64_t max_alloc_bytes; /* CL_DEVICE_MAX_MEM_ALLOC_SIZE */
  uint32_t spin_ns;         /* wait_spin_ns: blocking calls poll first */
  /* With spin_ns, on a CPU device with driver threads: how long a
   * blocking call leaves the driver after a spinning wait saw a command
   * end (settle), and when one last did (um__spin_clock_ns). */
  uint32_t settle_ns;
  _Atomic uint64_t spun_end_ns;
  /* The driver runs each command inside the call that submits it (PoCL's
   * basic device): calls that submit take submit_lock (below). */
  int runs_inline;
  /* Watched transfers, oldest first, not reported yet (the watch list,
   * below); the newest of them with no callback of its own; whether the
   * lazy callback is armed (0 or 1); walks running. */
  atomic_bool watch_locked; /* watch_lock() */
  struct transfer_completion *watch_head, *watch_tail, *watch_unarmed;
  int watch_lazy;
  int watch_walking; /* a walk runs (one at a time) */
  int watch_again;   /* a callback fired during it: it goes round again */
  /* Commands put on the list without the order lock (order_begin), and
   * the lock: a watched command is enqueued and listed in one hold. */
  atomic_uint watch_unordered;
  atomic_bool order_held; /* the order lock: only ever tried, never waited for */
  /* Events whose last reference was put on a thread that does not report
   * completions, for the next walk to release (ocl_native_release); under
   * watch_lock. */
  int nlater;
  cl_event later[OCL_RELEASE_LATER];
  /* Walks that took kept events and release them after their reports: the
   * device is not destroyed before they are done. */
  atomic_int walk_tails;
  char name[128];
} ocl_device;

/* Per-manager state. */
typedef struct ocl_state {
  ocl_device **devices;
  int device_count;
  int device_capacity;
  cl_context *contexts; /* one per platform that has devices */
  int context_count;
} ocl_state;

/* ------------------------------------------------------------------------ */
/* Helpers                                                                   */

/* Wait for one command: CL_SUCCESS, or why it failed (its own execution
 * status where it says one, else the wait's error). */
static cl_int wait_command_status(cl_event event) {
  cl_int err = ocl.clWaitForEvents(1, &event);
  cl_int execution_status = CL_COMPLETE;
  if (err == CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST) {
    /* The command itself failed: its status says why. */
    if (ocl.clGetEventInfo(event, CL_EVENT_COMMAND_EXECUTION_STATUS,
                           sizeof(execution_status), &execution_status,
                           NULL) == CL_SUCCESS &&
        execution_status < 0)
      err = execution_status;
  }
  return err;
}

/* Wait for one command and return its execution status as UM_* code. */
static int wait_for_command(cl_event event, const char *call) {
  return translate_cl_error(wait_command_status(event), call);
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

static void submit_begin(const ocl_device *dev) {
  if (dev->runs_inline) {
    UM__TEST_POINT(UM__TP_SUBMIT_INLINE, dev);
    pthread_mutex_lock(&submit_lock);
  }
}

static void submit_end(const ocl_device *dev) {
  if (dev->runs_inline)
    pthread_mutex_unlock(&submit_lock);
}

/* Whether a command has left the queue's hands: complete, or failed (a
 * negative status). A failed query counts as ended too: the wait that
 * follows reports the error. */
static int command_ended(void *event) {
  cl_int execution_status = CL_QUEUED;
  if (ocl.clGetEventInfo((cl_event)event, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof(execution_status),
                         &execution_status, NULL) != CL_SUCCESS)
    return 1;
  return execution_status <= CL_COMPLETE;
}

/* wait_for_command for a blocking call of dev: with wait_spin_ns, the
 * command's status is polled for that long first, so that the caller
 * returns as soon as it completes instead of after the driver's wake-up of
 * a sleeping thread (PoCL's blocking 4 KiB read sleeps about 30 us of its
 * 50). The queue is flushed first: a command nobody flushed may never
 * start, and only clWaitForEvents flushes by itself. */
static int wait_for_own_command(ocl_device *dev, cl_event event, const char *call) {
  if (dev->spin_ns != 0) {
    submit_begin(dev);
    ocl.clFlush(dev->queue);
    submit_end(dev);
    if (um__spin_until(dev->spin_ns, command_ended, event) != 0 && dev->settle_ns != 0) {
      atomic_store_explicit(&dev->spun_end_ns, um__spin_clock_ns(), memory_order_relaxed);
      UM__TEST_POINT(UM__TP_SPUN_END, dev);
    }
  }
  return wait_for_command(event, call);
}

/* Before a blocking call with wait_spin_ns submits its command: on a CPU
 * device whose commands run on the driver's threads (PoCL's pthread
 * device), those threads share the CPUs with the caller and are still
 * finishing a command for a few microseconds after its status reads
 * complete. A command submitted in that window waited for the driver
 * thread's next wake-up: back-to-back blocking 4 KiB reads with the spin
 * took 63-70 us each on PoCL, against 16-20 us when 3-5 us passed between
 * one read's end and the next (bench_wait --gap-us), and 25-30 us for the
 * driver's own sleeping blocking read. So such a call waits, spinning,
 * until settle_ns have passed since a spinning wait of the device last saw
 * a command end (back to back: 21-25 us, docs/benchmarks.md). Calls that
 * slept, and calls made later than that, do not wait. */
static void settle(ocl_device *dev) {
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
  cl_int err = ocl.clGetDeviceInfo(id, param, 0, NULL, &size);
  if (err != CL_SUCCESS)
    return translate_cl_error(err, "clGetDeviceInfo");
  text = malloc(size + 1);
  if (text == NULL)
    return um__set_error(UM_ENOMEM, "opencl: out of host memory");
  err = ocl.clGetDeviceInfo(id, param, size, text, NULL);
  if (err != CL_SUCCESS) {
    free(text);
    return translate_cl_error(err, "clGetDeviceInfo");
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
static int platform_version(cl_platform_id platform, int *major,
                            int *minor) {
  char version[128];
  cl_int err = ocl.clGetPlatformInfo(platform, CL_PLATFORM_VERSION,
                                     sizeof(version), version, NULL);
  if (err != CL_SUCCESS)
    return translate_cl_error(err, "clGetPlatformInfo");
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
  if (platform_major >= 2 && ocl.clCreateCommandQueueWithProperties != NULL)
    return ocl.clCreateCommandQueueWithProperties(context, id, NULL, err);
  if (ocl.clCreateCommandQueue != NULL)
    return ocl.clCreateCommandQueue(context, id, 0, err);
  return ocl.clCreateCommandQueueWithProperties(context, id, NULL, err);
}

/* An in-order queue on dev, into *queue. */
static int make_queue(ocl_device *dev, int platform_major, cl_command_queue *queue) {
  cl_int err = CL_SUCCESS;
  *queue = create_queue(dev->context, dev->id, platform_major, &err);
  if (*queue == NULL || err != CL_SUCCESS) {
    *queue = NULL;
    return translate_cl_error(err != CL_SUCCESS ? err : CL_OUT_OF_RESOURCES,
                              "clCreateCommandQueue");
  }
  return UM_OK;
}

static int append_device(ocl_state *state, ocl_device *dev) {
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

static int append_context(ocl_state *state, cl_context context) {
  cl_context *grown = realloc(
      state->contexts, ((size_t)state->context_count + 1) * sizeof(*grown));
  if (grown == NULL)
    return um__set_error(UM_ENOMEM, "opencl: out of host memory");
  state->contexts = grown;
  state->contexts[state->context_count++] = context;
  return UM_OK;
}

static void release_later(ocl_device *dev);

static void destroy_device(ocl_device *dev) {
  while (atomic_load_explicit(&dev->walk_tails, memory_order_acquire) != 0)
    sched_yield();
  release_later(dev);
  if (dev->caller_queue != NULL)
    ocl.clReleaseCommandQueue(dev->caller_queue);
  if (dev->queue != NULL) {
    ocl.clFinish(dev->queue);
    ocl.clReleaseCommandQueue(dev->queue);
  }
  free(dev);
}

/* Whether dev is PoCL's basic device (submit_lock). PoCL names it after its
 * driver: "basic-<cpu>" up to PoCL 4, "cpu-minimal-<cpu>" from PoCL 5. */
static int runs_commands_inline(const ocl_device *dev) {
  char platform[128];
  if (ocl.clGetPlatformInfo(dev->platform, CL_PLATFORM_NAME, sizeof(platform), platform, NULL) !=
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
  err = ocl.clGetDeviceInfo(dev->id, CL_DEVICE_GLOBAL_MEM_SIZE, sizeof(global_mem), &global_mem, NULL);
  if (err == CL_SUCCESS)
    err = ocl.clGetDeviceInfo(dev->id, CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof(max_alloc), &max_alloc, NULL);
  if (err == CL_SUCCESS)
    err = ocl.clGetDeviceInfo(dev->id, CL_DEVICE_PLATFORM, sizeof(dev->platform), &dev->platform, NULL);
  if (err != CL_SUCCESS)
    return translate_cl_error(err, "clGetDeviceInfo");
  dev->limit_bytes = opts != NULL ? opts->device_limit_bytes : 0;
  dev->spin_ns = opts != NULL ? opts->wait_spin_ns : 0;
  dev->total_bytes = global_mem;
  if (dev->limit_bytes != 0 && dev->limit_bytes < dev->total_bytes)
    dev->total_bytes = dev->limit_bytes;
  dev->max_alloc_bytes = max_alloc;
  /* A CPU device's "device memory" is host memory, and so is an integrated
   * GPU's (CL_DEVICE_HOST_UNIFIED_MEMORY, deprecated in 2.0 but answered by
   * every driver): reading pageable memory costs them nothing extra. A
   * failed query leaves the device counted as discrete. */
  if (ocl.clGetDeviceInfo(dev->id, CL_DEVICE_TYPE, sizeof(type), &type, NULL) != CL_SUCCESS)
    type = 0;
  if (ocl.clGetDeviceInfo(dev->id, CL_DEVICE_HOST_UNIFIED_MEMORY, sizeof(unified), &unified, NULL) !=
      CL_SUCCESS)
    unified = CL_FALSE;
  dev->host_memory = (type & CL_DEVICE_TYPE_CPU) != 0 || unified == CL_TRUE;
  dev->runs_inline = runs_commands_inline(dev);
  if (dev->spin_ns != 0 && (type & CL_DEVICE_TYPE_CPU) != 0 && !dev->runs_inline) {
    dev->settle_ns = OCL_SETTLE_NS;
    UM__TEST_POINT(UM__TP_SETTLE_TIME, &dev->settle_ns);
  }
  /* Devices before 2.0 reject the query (CL_INVALID_VALUE): no SVM. */
  if (platform_major >= 2 && ocl.clSVMAlloc != NULL &&
      ocl.clGetDeviceInfo(dev->id, CL_DEVICE_SVM_CAPABILITIES, sizeof(svm), &svm, NULL) == CL_SUCCESS)
    dev->fine_grain_svm = (svm & CL_DEVICE_SVM_FINE_GRAIN_BUFFER) != 0;
  return UM_OK;
}

/* Describe one device and give it its queue, and the caller's: caller_queue
 * (retained here; an adopted device's), or a new one. */
static int open_device(cl_device_id id, cl_context context, int context_devices, int platform_major,
                       const um_options *opts, cl_command_queue caller_queue, ocl_device **out) {
  int status;
  ocl_device *dev = calloc(1, sizeof(*dev));
  if (dev == NULL)
    return um__set_error(UM_ENOMEM, "opencl: out of host memory");
  dev->id = id;
  dev->context = context;
  dev->context_devices = context_devices;
  atomic_init(&dev->watch_locked, false);
  atomic_init(&dev->walk_tails, 0);
  atomic_init(&dev->order_held, false);
  atomic_init(&dev->watch_unordered, 0);
  if (caller_queue != NULL && ocl.clRetainCommandQueue(caller_queue) == CL_SUCCESS)
    dev->caller_queue = caller_queue;
  if ((status = query_device(dev, platform_major, opts)) != UM_OK ||
      (status = make_queue(dev, platform_major, &dev->queue)) != UM_OK ||
      (dev->caller_queue == NULL &&
       (status = make_queue(dev, platform_major, &dev->caller_queue)) != UM_OK)) {
    destroy_device(dev);
    return status;
  }
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

  status = platform_version(platform, &major, &minor);
  if (status != UM_OK)
    return status;
  /* Fill, migration and CL_MAP_WRITE_INVALIDATE_REGION are 1.2. */
  if (major < 1 || (major == 1 && minor < 2))
    return um__set_error(UM_ENOTSUP, "opencl: platform version %d.%d is "
                                     "older than 1.2",
                         major, minor);

  err = ocl.clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, 0, NULL, &count);
  if (err == CL_DEVICE_NOT_FOUND || (err == CL_SUCCESS && count == 0))
    return UM_OK;
  if (err != CL_SUCCESS)
    return translate_cl_error(err, "clGetDeviceIDs");
  ids = malloc(count * sizeof(*ids));
  if (ids == NULL)
    return um__set_error(UM_ENOMEM, "opencl: out of host memory");
  err = ocl.clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, count, ids, &count);
  if (err != CL_SUCCESS) {
    status = translate_cl_error(err, "clGetDeviceIDs");
    goto fail;
  }

  context = ocl.clCreateContext(properties, count, ids, NULL, NULL, &err);
  if (context == NULL || err != CL_SUCCESS) {
    context = NULL;
    status = translate_cl_error(err != CL_SUCCESS ? err : CL_OUT_OF_RESOURCES,
                                "clCreateContext");
    goto fail;
  }

  for (i = 0; i < count; i++) {
    ocl_device *dev = NULL;
    status = open_device(ids[i], context, (int)count, major, opts, NULL, &dev);
    if (status != UM_OK)
      goto fail;
    status = append_device(state, dev);
    if (status != UM_OK) {
      destroy_device(dev);
      goto fail;
    }
  }

  status = append_context(state, context);
  if (status != UM_OK)
    goto fail;
  free(ids);
  return UM_OK;

fail:
  while (state->device_count > first_device)
    destroy_device(state->devices[--state->device_count]);
  if (context != NULL)
    ocl.clReleaseContext(context);
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
  if (ocl.clGetPlatformInfo(platform, CL_PLATFORM_NAME, cap, name, NULL) != CL_SUCCESS) {
    snprintf(name, cap, "unnamed");
    return 0;
  }
  name[cap - 1] = '\0';
  return strstr(name, want) != NULL;
}

/* ------------------------------------------------------------------------ */
/* Open, describe, close                                                     */

static void ocl_close(void *ctx);

static int ocl_open(const um_options *opts, void **ctx, int *count) {
  cl_uint platform_count = 0, i;
  cl_platform_id *platforms = NULL;
  ocl_state *state = NULL;
  const char *want;
  cl_int err;
  int status;

  status = um__vendor_lib_load(&ocl_lib, UM_ENODEV);
  if (status != UM_OK)
    return status;

  state = calloc(1, sizeof(*state));
  if (state == NULL)
    return um__set_error(UM_ENOMEM, "opencl: out of host memory");

  err = ocl.clGetPlatformIDs(0, NULL, &platform_count);
  /* The ICD loader answers CL_PLATFORM_NOT_FOUND_KHR when no driver is
   * installed: that is "no devices here", not a failure. */
  if (err == CL_PLATFORM_NOT_FOUND_KHR)
    goto done;
  if (err != CL_SUCCESS) {
    status = translate_cl_error(err, "clGetPlatformIDs");
    goto fail;
  }
  if (platform_count == 0)
    goto done;
  platforms = malloc(platform_count * sizeof(*platforms));
  if (platforms == NULL) {
    status = um__set_error(UM_ENOMEM, "opencl: out of host memory");
    goto fail;
  }
  err = ocl.clGetPlatformIDs(platform_count, platforms, &platform_count);
  if (err != CL_SUCCESS) {
    status = translate_cl_error(err, "clGetPlatformIDs");
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
  ocl_close(state);
  return status;
}

static int ocl_describe(void *ctx, int i, um__bdev_desc *out) {
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
  out->bdev = dev;
  return UM_OK;
}

static void ocl_close(void *ctx) {
  ocl_state *state = ctx;
  int i;
  if (state == NULL)
    return;
  /* Queues first: each holds a reference on its context. */
  for (i = 0; i < state->device_count; i++)
    destroy_device(state->devices[i]);
  for (i = 0; i < state->context_count; i++)
    ocl.clReleaseContext(state->contexts[i]);
  free(state->devices);
  free(state->contexts);
  free(state);
}

/* ------------------------------------------------------------------------ */
/* Memory                                                                    */

/* clCreateBuffer without a host pointer; a NULL answer without a code is
 * counted as a lack of memory. */
static int create_buffer(ocl_device *dev, cl_mem_flags flags, size_t bytes,
                         cl_mem *out) {
  cl_int err = CL_SUCCESS;
  cl_mem mem = ocl.clCreateBuffer(dev->context, flags, bytes, NULL, &err);
  if (mem == NULL && err == CL_SUCCESS)
    err = CL_MEM_OBJECT_ALLOCATION_FAILURE;
  if (err != CL_SUCCESS)
    return translate_cl_error(err, "clCreateBuffer");
  *out = mem;
  return UM_OK;
}

/* The one cleanup path of the cl_mem allocators: the block goes out in
 * *out (host: its mapped view, or NULL), or its buffer is released when
 * status says the allocation failed. */
static int block_finish(cl_mem mem, void *host, int status, um__mem *out) {
  if (status != UM_OK) {
    ocl.clReleaseMemObject(mem);
    return status;
  }
  out->host = host;
  out->handle = (uintptr_t)mem;
  out->priv = NULL;
  return UM_OK;
}

static int alloc_device_block(ocl_device *dev, size_t bytes, um__mem *out) {
  cl_mem mem = NULL;
  cl_event migrated = NULL;
  cl_int err;
  int status = create_buffer(dev, CL_MEM_READ_WRITE, bytes, &mem);
  if (status != UM_OK)
    return status;
  /* Drivers commit buffer memory lazily, at the first command that uses it,
   * so an out-of-memory device would only fail a later copy. Migrating the
   * (undefined) contents to this device commits the memory now, where the
   * core can still answer UM_ENOMEM by trimming its pool and retrying. In a
   * context of several devices it also places the buffer on this one. */
  submit_begin(dev);
  err = ocl.clEnqueueMigrateMemObjects(dev->queue, 1, &mem,
                                       CL_MIGRATE_MEM_OBJECT_CONTENT_UNDEFINED,
                                       0, NULL, &migrated);
  submit_end(dev);
  if (err != CL_SUCCESS) {
    status = translate_cl_error(err, "clEnqueueMigrateMemObjects");
  } else {
    status = wait_for_command(migrated, "clEnqueueMigrateMemObjects");
    ocl.clReleaseEvent(migrated);
  }
  return block_finish(mem, NULL, status, out);
}

static int alloc_pinned_block(ocl_device *dev, size_t bytes, um__mem *out) {
  cl_mem mem = NULL;
  cl_int err = CL_SUCCESS;
  void *host;
  int status = create_buffer(dev, CL_MEM_READ_WRITE | CL_MEM_ALLOC_HOST_PTR,
                             bytes, &mem);
  if (status != UM_OK)
    return status;
  /* Mapped for the block's whole life: the mapping is the page-locked host
   * view that the core reads and writes, and hands to other buffers'
   * transfers as their DMA-able host pointer. */
  submit_begin(dev);
  host = ocl.clEnqueueMapBuffer(dev->queue, mem, CL_TRUE,
                                CL_MAP_READ | CL_MAP_WRITE, 0, bytes, 0, NULL,
                                NULL, &err);
  submit_end(dev);
  if (host == NULL || err != CL_SUCCESS)
    status = translate_cl_error(err != CL_SUCCESS ? err : CL_MAP_FAILURE,
                                "clEnqueueMapBuffer");
  return block_finish(mem, host, status, out);
}

static int alloc_unified_block(ocl_device *dev, size_t bytes, um__mem *out) {
  void *svm = ocl.clSVMAlloc(dev->context,
                             CL_MEM_READ_WRITE | CL_MEM_SVM_FINE_GRAIN_BUFFER,
                             bytes, 0);
  /* clSVMAlloc reports no reason; a NULL with valid arguments is a lack of
   * memory. */
  if (svm == NULL)
    return um__set_error(UM_ENOMEM,
                         "opencl: clSVMAlloc of %zu bytes failed on %s", bytes,
                         dev->name);
  out->host = svm;
  out->handle = (uintptr_t)svm;
  out->priv = NULL;
  return UM_OK;
}

static int ocl_mem_alloc(void *bdev, um_location loc, size_t bytes,
                         um__mem *out) {
  ocl_device *dev = bdev;
  int status;

  if (loc != UM_DEVICE && loc != UM_PINNED && loc != UM_UNIFIED)
    return um__set_error(UM_ENOTSUP,
                         "opencl: %s gives DEVICE, PINNED and UNIFIED memory "
                         "only",
                         dev->name);
  if (loc == UM_UNIFIED && !dev->fine_grain_svm)
    return um__set_error(UM_ENOTSUP,
                         "opencl: %s has no fine-grained buffer SVM for "
                         "UNIFIED memory",
                         dev->name);
  if ((uint64_t)bytes > dev->max_alloc_bytes)
    return um__set_error(UM_ENOMEM,
                         "opencl: %zu bytes exceed CL_DEVICE_MAX_MEM_ALLOC_SIZE"
                         " (%llu bytes) of %s",
                         bytes, (unsigned long long)dev->max_alloc_bytes,
                         dev->name);
  switch (loc) {
  case UM_DEVICE:
    status = alloc_device_block(dev, bytes, out);
    break;
  case UM_PINNED:
    status = alloc_pinned_block(dev, bytes, out);
    break;
  default:
    status = alloc_unified_block(dev, bytes, out);
    break;
  }
  return status;
}

static void ocl_mem_free(void *bdev, um_location loc, size_t bytes,
                         um__mem *mem) {
  ocl_device *dev = bdev;
  (void)bytes;
  /* Nothing of ours outlives the memory: not even a finished command's
   * event, which a driver may let hold its buffers. */
  release_later(dev);
  switch (loc) {
  case UM_DEVICE:
    ocl.clReleaseMemObject((cl_mem)mem->handle);
    break;
  case UM_PINNED:
    /* The release waits for the unmap: OpenCL deletes a memory object only
     * once the commands that use it have finished. */
    submit_begin(dev);
    ocl.clEnqueueUnmapMemObject(dev->queue, (cl_mem)mem->handle, mem->host, 0,
                                NULL, NULL);
    submit_end(dev);
    ocl.clReleaseMemObject((cl_mem)mem->handle);
    break;
  case UM_UNIFIED:
    ocl.clSVMFree(dev->context, mem->host);
    break;
  default:
    break;
  }
  mem->host = NULL;
  mem->handle = 0;
}

/* OpenCL has no standard free-memory query (cl_amd_device_attribute_query
 * and the like are vendor extensions): the answer is the whole device, and
 * the core takes off what this process holds there (um_device_memory);
 * other processes' use is not seen. */
static int ocl_memory(void *bdev, uint64_t *free_bytes, uint64_t *total_bytes) {
  ocl_device *dev = bdev;
  if (free_bytes != NULL)
    *free_bytes = dev->total_bytes;
  if (total_bytes != NULL)
    *total_bytes = dev->total_bytes;
  return UM_OK;
}

static int ocl_synchronize(void *bdev) {
  ocl_device *dev = bdev;
  cl_event marker = NULL;
  cl_int err;
  int status;
  if (dev->spin_ns == 0)
    return translate_cl_error(ocl.clFinish(dev->queue), "clFinish");
  /* A marker with an empty wait list completes after everything queued
   * before it (clFinish's meaning), and can be polled. */
  settle(dev);
  submit_begin(dev);
  err = ocl.clEnqueueMarkerWithWaitList(dev->queue, 0, NULL, &marker);
  submit_end(dev);
  if (err != CL_SUCCESS)
    return translate_cl_error(err, "clEnqueueMarkerWithWaitList");
  status = wait_for_own_command(dev, marker, "clFinish");
  ocl.clReleaseEvent(marker);
  return status;
}

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

/* Enqueue x on dev's queue after wait_list, returning its event. Read and
 * write take the blocking flag; copy and fill have none (the caller waits on
 * the event). */
static int enqueue_transfer(ocl_device *dev, const um__xfer *x,
                            cl_bool blocking, cl_uint wait_count,
                            const cl_event *wait_list, cl_event *event) {
  cl_int err;
  const char *call;
  submit_begin(dev);
  switch (x->kind) {
  case UM__XFER_H2D:
    call = "clEnqueueWriteBuffer";
    err = ocl.clEnqueueWriteBuffer(dev->queue, (cl_mem)x->dst->handle,
                                   blocking, x->dst_off, x->bytes, x->host,
                                   wait_count, wait_list, event);
    break;
  case UM__XFER_D2H:
    call = "clEnqueueReadBuffer";
    err = ocl.clEnqueueReadBuffer(dev->queue, (cl_mem)x->src->handle, blocking,
                                  x->src_off, x->bytes, x->host, wait_count,
                                  wait_list, event);
    break;
  case UM__XFER_FILL:
    call = "clEnqueueFillBuffer";
    err = ocl.clEnqueueFillBuffer(dev->queue, (cl_mem)x->dst->handle,
                                  &x->value, 1, x->dst_off, x->bytes,
                                  wait_count, wait_list, event);
    break;
  case UM__XFER_QUEUE_MARK: /* an empty wait list: after everything queued */
    call = "clEnqueueMarkerWithWaitList";
    err = ocl.clEnqueueMarkerWithWaitList(dev->queue, 0, NULL, event);
    break;
  default: /* D2D, and PEER: one context holds both devices' buffers */
    call = "clEnqueueCopyBuffer";
    err = ocl.clEnqueueCopyBuffer(dev->queue, (cl_mem)x->src->handle,
                                  (cl_mem)x->dst->handle, x->src_off,
                                  x->dst_off, x->bytes, wait_count, wait_list,
                                  event);
    break;
  }
  submit_end(dev);
  return translate_cl_error(err, call);
}

static const char *transfer_call_name(um__xfer_kind kind) {
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

static int ocl_xfer(void *bdev, const um__xfer *x) {
  ocl_device *dev = bdev;
  cl_event event = NULL;
  int status = check_transfer(dev, x);
  if (status != UM_OK)
    return status;
  /* Reads and writes take the blocking flag: the very call an application
   * would make, so a blocking copy costs what the raw call does (unless
   * the caller asked to spin: the driver's own blocking wait sleeps). */
  if ((x->kind == UM__XFER_H2D || x->kind == UM__XFER_D2H) && dev->spin_ns == 0)
    return enqueue_transfer(dev, x, CL_TRUE, 0, NULL, NULL);
  /* Copies and fills have no such flag: a wait on this command's own event,
   * rather than clFinish, so that a blocking copy does not wait for other
   * threads' work queued behind it. */
  settle(dev);
  status = enqueue_transfer(dev, x, CL_FALSE, 0, NULL, &event);
  if (status != UM_OK)
    return status;
  status = wait_for_own_command(dev, event, transfer_call_name(x->kind));
  ocl.clReleaseEvent(event);
  return status;
}

/* What a watched transfer's completion needs: in the caller's done_space
 * where it gives one, else allocated (and freed when reported). */
typedef struct transfer_completion {
  um__done_fn done;
  void *arg;
  struct ocl_device *dev;           /* whose watch list it is on */
  cl_event event;                   /* the command's */
  struct transfer_completion *next; /* in the device's watch list */
  cl_int status;                    /* once ended: its execution status (set by
                                       the callback or the walk) */
  unsigned char kind;               /* um__xfer_kind, for the error's text */
  unsigned char allocated;
  unsigned char retained; /* holds a reference of its own on event (the
                             caller does not keep the token until done) */
  unsigned char armed;    /* a callback of its own is registered on event:
                             WATCH_OWN, or WATCH_LAZY (it covers the small
                             commands before it); under watch_lock */
  unsigned char ordered;  /* enqueued and put on the list in one hold of
                             the device's order lock, with no unordered
                             entry put on the list meanwhile: the entries
                             before it on the list were enqueued before it
                             (set by watch_add) */
  atomic_uchar fired;     /* its callback ran, status is set (set under
                             watch_lock) */
} transfer_completion;

enum { WATCH_OWN = 1, WATCH_LAZY = 2 };

/* Commands that move this much or more, and queue marks (each stands for a
 * run of copies), get a callback of their own: a report that waited for
 * the next callback could come a whole large command late (a double-
 * buffered pipeline would wait for the next buffer's transfer), and a
 * callback is a small part of such a command's time. */
#define WATCH_OWN_BYTES (64u * 1024u)

_Static_assert(sizeof(transfer_completion) <= UM__DONE_SPACE, "a completion fits the core's done_space");

static transfer_completion *completion_new(ocl_device *dev, const um__xfer *x, um__done_fn done, void *arg) {
  transfer_completion *c = x->done_space;
  if (c == NULL && (c = malloc(sizeof(*c))) == NULL)
    return NULL;
  c->done = done;
  c->arg = arg;
  c->dev = dev;
  c->event = NULL;
  c->next = NULL;
  c->kind = (unsigned char)x->kind;
  c->allocated = x->done_space == NULL;
  c->retained = 0;
  c->armed = 0;
  atomic_init(&c->fired, 0);
  return c;
}

static void completion_free(transfer_completion *c) {
  if (c->allocated)
    free(c);
}

/* ------------------------------------------------------------------------ */
/* The watch list: completions reported with one callback for many commands
 *
 * A callback per command costs its registration on the issuing thread
 * (clSetEventCallback allocates and takes the event's lock) and its
 * dispatch on the driver's thread, about as much again as unimem's own
 * work for a small copy. The device's queue is in order, so the completion
 * of a command says that those before it have completed too. Each watched
 * command goes on the device's list. Large ones (WATCH_OWN_BYTES) get a
 * callback of their own; of the small ones, only one at a time gets a
 * callback, the lazy one, on the newest small command when it is armed.
 * A callback marks its entry fired and walks the list; one walk runs at a
 * time per device (a callback that finds one running leaves its entry to
 * it and asks it to go round again, so no fired entry is missed by a walk
 * that had taken the list before the entry fired). A walk reports:
 *  - every fired entry;
 *  - the small entries before the last fired entry that is ordered (its
 *    place on the list is its place in the queue) and completed well:
 *    complete too, without asking the driver, since the queue ran them
 *    first (a failed command fails the in-order queue's later ones, or
 *    leaves the queue in the state the specification leaves undefined);
 *  - the small entries after it that the driver says have ended, each
 *    with its own status, up to the first still running (the queue runs
 *    them in order: the later ones are left for the next callback).
 * Then it arms the lazy callback again on the newest small entry left, if
 * any. A small command's report may so come later than its completion, by
 * at most the small commands queued while the lazy callback before it was
 * armed (a waiter's wait_spin_ns spin sees the device's own state through
 * token_query).
 *
 * Entries keep their event alive until reported: through the caller's
 * token (um__xfer.token_held: the core's operations keep theirs until
 * done), else with a reference of their own. An entry with a callback is
 * reported only once its callback has run, never by a walk that finds it
 * complete first: the driver may still be about to call the callback, and
 * the report may release the event's last reference. */

/* The watch list's lock (watch_locked): held for a few dozen instructions
 * at a time (an entry put on the list, the list taken or put back, an
 * entry marked fired), never across a driver call, so a spin; a thread
 * that finds the holder preempted yields its CPU to it. */
static void watch_lock(ocl_device *dev) {
  int spins = 0;
  while (atomic_exchange_explicit(&dev->watch_locked, true, memory_order_acquire))
    while (atomic_load_explicit(&dev->watch_locked, memory_order_relaxed)) {
      if (++spins < 64)
        um__cpu_pause();
      else
        sched_yield();
    }
}

static void watch_unlock(ocl_device *dev) {
  atomic_store_explicit(&dev->watch_locked, false, memory_order_release);
}

/* The entry whose callback this thread is registering: a driver that calls
 * the callback inside clSetEventCallback (the command completed already)
 * marks it fired, and the registering thread walks once the call returned
 * (not inside the driver's call, which may hold the event's lock). */
static _Thread_local transfer_completion *arming;
static _Thread_local int armed_fired;

/* Set while this thread reports a walk's entries (watch_report). */
static _Thread_local int reporting;

/* Under watch_lock: take the events kept for the next walk into out. */
static int take_later_locked(ocl_device *dev, cl_event *out) {
  int n = dev->nlater;
  memcpy(out, dev->later, (size_t)n * sizeof(out[0]));
  dev->nlater = 0;
  return n;
}

/* unimem's last reference on a token's event. */
static void release_token(cl_event ev) {
  UM__TEST_POINT(UM__TP_TOKEN_RELEASED, ev);
  ocl.clReleaseEvent(ev);
}

static void release_events(const cl_event *ev, int n) {
  for (int i = 0; i < n; i++)
    release_token(ev[i]);
}

static void watch_walk_locked(ocl_device *dev);

/* Under watch_lock: become the device's walker, or leave the walk to the
 * one running (it goes round again). */
static void watch_walk_or_hand_over(ocl_device *dev) {
  if (dev->watch_walking) {
    dev->watch_again = 1;
    watch_unlock(dev);
    return; /* nothing of ours runs after this unlock */
  }
  dev->watch_walking = 1;
  watch_walk_locked(dev);
}

static void CL_CALLBACK on_watch_fired(cl_event event, cl_int execution_status, void *user_data) {
  transfer_completion *c = user_data;
  ocl_device *dev = c->dev;
  (void)event;
  watch_lock(dev);
  c->status = execution_status;
  atomic_store_explicit(&c->fired, 1, memory_order_release);
  if (arming == c) {
    armed_fired = 1;
    watch_unlock(dev);
    return;
  }
  watch_walk_or_hand_over(dev);
}

/* Register the callback on c's command. Returns 0 when it is armed (the
 * callback reports later), 1 when c is fired already: its callback ran
 * inside the registration, or none could be registered (the command was
 * waited for here: its report cannot be lost). The caller walks then. */
static int watch_arm(ocl_device *dev, transfer_completion *c) {
  cl_int err;
  arming = c;
  armed_fired = 0;
  err = ocl.clSetEventCallback(c->event, CL_COMPLETE, on_watch_fired, c);
  arming = NULL;
  if (err != CL_SUCCESS) {
    cl_int st = wait_command_status(c->event);
    watch_lock(dev);
    c->status = st;
    atomic_store_explicit(&c->fired, 1, memory_order_release);
    watch_unlock(dev);
    return 1;
  }
  return armed_fired;
}

/* Whether c's command has ended (complete, or failed), with its status. */
static int watch_ended(transfer_completion *c) {
  cl_int st = CL_QUEUED;
  if (ocl.clGetEventInfo(c->event, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof(st), &st, NULL) != CL_SUCCESS ||
      st > CL_COMPLETE)
    return 0; /* left for the callback armed on it or behind it */
  c->status = st;
  return 1;
}

/* Report the entries of ready, in order. done comes last for each, and
 * after the last nothing of ours runs but a walk's tail, which
 * destroy_device waits for (walk_tails): once it returns, the core may
 * close the backend. */
static void watch_report(transfer_completion *ready) {
  while (ready != NULL) {
    transfer_completion *c = ready;
    um__done_fn done = c->done;
    void *arg = c->arg;
    int status = c->status < 0 ? translate_cl_error(c->status, transfer_call_name((um__xfer_kind)c->kind)) : UM_OK;
    ready = c->next; /* the core's space may go with done */
    if (c->retained)
      ocl.clReleaseEvent(c->event);
    completion_free(c);
    done(arg, status);
  }
}

/* The last entry of list that fired, is ordered and completed well: the
 * small entries before it have completed. */
static transfer_completion *watch_last_sure(transfer_completion *list) {
  transfer_completion *sure = NULL;
  for (transfer_completion *c = list; c != NULL; c = c->next)
    if (c->armed && c->ordered && atomic_load_explicit(&c->fired, memory_order_acquire) &&
        c->status == CL_COMPLETE)
      sure = c;
  return sure;
}

/* Whether the walk reports c now (with its status set): when it has a
 * callback of its own, once that fired; else when the sure entry after it
 * vouches for it; else when the driver says it ended. The driver is asked
 * until one entry is still running (*running set): the queue runs the
 * later ones after it. */
static int watch_reportable(transfer_completion *c, int before_sure, int *running) {
  if (c->armed)
    return atomic_load_explicit(&c->fired, memory_order_acquire);
  if (before_sure) {
    c->status = CL_COMPLETE;
    return 1;
  }
  if (*running)
    return 0;
  *running = !watch_ended(c);
  return !*running;
}

/* Called with watch_lock held, as the device's walker; returns with it
 * dropped. Takes the reportable entries off the list (the comment above),
 * going round again while callbacks fired meanwhile, arms the lazy
 * callback again on the newest small entry left, then reports. The events
 * kept for it (ocl_native_release) it takes at the start and releases
 * after its reports, counted in walk_tails until then: the core may
 * close the backend once the last report returned, and destroy_device
 * waits for such a tail. */
static void watch_walk_locked(ocl_device *dev) {
  transfer_completion *ready = NULL, **ready_end = &ready;
  cl_event later[OCL_RELEASE_LATER];
  int nlater = take_later_locked(dev, later);
  if (nlater > 0) /* before any report: the device outlives this walk */
    atomic_fetch_add_explicit(&dev->walk_tails, 1, memory_order_relaxed);
  for (;;) {
    transfer_completion *list = dev->watch_head, *rest = NULL, *rest_last = NULL, *rest_unarmed = NULL;
    transfer_completion *arm = NULL, *sure;
    int fired_lazy = 0, running = 0, before_sure;
    dev->watch_again = 0;
    dev->watch_head = dev->watch_tail = dev->watch_unarmed = NULL;
    watch_unlock(dev);
    sure = watch_last_sure(list);
    before_sure = sure != NULL;
    while (list != NULL) {
      transfer_completion *c = list;
      list = c->next;
      c->next = NULL;
      if (c == sure)
        before_sure = 0;
      if (watch_reportable(c, before_sure, &running)) {
        fired_lazy += c->armed == WATCH_LAZY;
        *ready_end = c;
        ready_end = &c->next;
        continue;
      }
      if (rest_last != NULL)
        rest_last->next = c;
      else
        rest = c;
      rest_last = c;
      if (!c->armed)
        rest_unarmed = c;
    }
    watch_lock(dev);
    if (rest != NULL) { /* older than what was added meanwhile */
      rest_last->next = dev->watch_head;
      if (dev->watch_head == NULL)
        dev->watch_tail = rest_last;
      dev->watch_head = rest;
      if (dev->watch_unarmed == NULL)
        dev->watch_unarmed = rest_unarmed;
    }
    dev->watch_lazy -= fired_lazy;
    if (dev->watch_again)
      continue;
    if (dev->watch_lazy == 0 && dev->watch_unarmed != NULL) {
      arm = dev->watch_unarmed; /* it covers the small entries before it */
      arm->armed = WATCH_LAZY;
      dev->watch_lazy = 1;
      dev->watch_unarmed = NULL;
    }
    if (arm != NULL) {
      watch_unlock(dev);
      watch_arm(dev, arm); /* fired already: it is on the list, marked */
      watch_lock(dev);
      if (dev->watch_again || atomic_load_explicit(&arm->fired, memory_order_relaxed))
        continue;
    }
    break;
  }
  dev->watch_walking = 0;
  watch_unlock(dev);
  reporting++;
  watch_report(ready);
  reporting--;
  if (nlater > 0) { /* after the reports, which it would delay */
    release_events(later, nlater);
    atomic_fetch_sub_explicit(&dev->walk_tails, 1, memory_order_release); /* the last touch of dev */
  }
}

/* The order lock of a device (order_held): a watched command is enqueued
 * and put on the list in one hold of it, so that the list's order is the
 * queue's (the walk relies on it to report the small entries before a
 * completed one unasked). Only ever tried, so no thread ever waits for it: a thread
 * that issues from inside a driver's callback might otherwise wait for a
 * thread that holds it and waits for the driver. A command enqueued
 * without it is not ordered, nor is one whose hold saw such a command put
 * on the list (watch_unordered moved): its place on the list may not be
 * its place in the queue. */
static int order_begin(ocl_device *dev, unsigned *unordered0) {
  if (atomic_load_explicit(&dev->order_held, memory_order_relaxed) ||
      atomic_exchange_explicit(&dev->order_held, true, memory_order_acquire))
    return 0;
  *unordered0 = atomic_load_explicit(&dev->watch_unordered, memory_order_relaxed);
  return 1;
}

static void order_end(ocl_device *dev, int held) {
  if (held)
    atomic_store_explicit(&dev->order_held, false, memory_order_release);
}

/* Watch c's command (c->event), enqueued under the order lock when held
 * (with watch_unordered at unordered0 then): put it on the list, drop the
 * order lock, submit it, and register a callback on it when it is large,
 * or small with no lazy callback armed and no walk to arm one. */
static void watch_add(ocl_device *dev, transfer_completion *c, int own, int held, unsigned unordered0) {
  int arm = 1;
  watch_lock(dev);
  if (held) {
    c->ordered = atomic_load_explicit(&dev->watch_unordered, memory_order_relaxed) == unordered0;
  } else {
    c->ordered = 0;
    um__atomic_add_relaxed(&dev->watch_unordered, 1);
  }
  if (dev->watch_tail != NULL)
    dev->watch_tail->next = c;
  else
    dev->watch_head = c;
  dev->watch_tail = c;
  if (own) {
    c->armed = WATCH_OWN;
  } else if (dev->watch_lazy == 0 && !dev->watch_walking) {
    c->armed = WATCH_LAZY;
    dev->watch_lazy = 1;
    dev->watch_unarmed = NULL;
  } else {
    dev->watch_unarmed = c;
    arm = 0;
  }
  watch_unlock(dev);
  order_end(dev, held);
  /* Commands may sit in the queue until flushed; nobody may ever wait on
   * this one, so submit it now. A failing flush leaves the command queued,
   * and its callback still runs when the queue is finished. */
  submit_begin(dev);
  ocl.clFlush(dev->queue);
  submit_end(dev);
  if (arm && watch_arm(dev, c)) {
    watch_lock(dev);
    watch_walk_or_hand_over(dev);
  }
}

/* after[] lists longer than this take one malloc. */
#define OCL_INLINE_WAIT_LIST 16

/* The wait list of x: the tokens of after[] that are not this device's own
 * queue's, then x->wait[] (a MARKER's gate or caller's event). Tokens are
 * this backend's cl_events; copy them rather than reinterpret the void *
 * array as a cl_event array. A command of this device's own queue needs no
 * wait-list entry: the queue is in order, and its commands were enqueued
 * before this one. Leaving them out matters: PoCL tracks every wait-list
 * entry as a dependency, which cost about 0.5 us per queued 4 KiB write. */
static cl_uint build_wait_list(ocl_device *dev, const um__xfer *x, void *const *after, int nafter,
                               cl_event *list) {
  cl_uint waits = 0;
  for (int i = 0; i < nafter; i++) {
    cl_command_queue queue = NULL;
    cl_event token = (cl_event)after[i];
    if (ocl.clGetEventInfo(token, CL_EVENT_COMMAND_QUEUE, sizeof(queue), &queue, NULL) == CL_SUCCESS &&
        queue == dev->queue)
      continue;
    list[waits++] = token;
  }
  for (int i = 0; i < 2; i++)
    if (x->wait[i] != NULL)
      list[waits++] = (cl_event)x->wait[i];
  return waits;
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
  ocl.clSetUserEventStatus(j->user, status == UM_OK ? CL_COMPLETE : CL_INVALID_OPERATION);
  ocl.clReleaseEvent(j->user); /* the join's reference */
  um__done_fn done = j->done;
  void *arg = j->arg;
  free(j);
  done(arg, status); /* last: the core may close the backend after it */
}

static void CL_CALLBACK on_join_token(cl_event event, cl_int execution_status, void *user_data) {
  int status = execution_status < 0 ? translate_cl_error(execution_status, "a marker's token") : UM_OK;
  ocl.clReleaseEvent(event); /* the reference ocl_join took */
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
  j->user = ocl.clCreateUserEvent(dev->context, &err);
  if (j->user == NULL || err != CL_SUCCESS) {
    free(j);
    return translate_cl_error(err != CL_SUCCESS ? err : CL_OUT_OF_RESOURCES, "clCreateUserEvent");
  }
  ocl.clRetainEvent(j->user); /* one for the join, one for the caller's token */
  atomic_init(&j->left, n + 1);
  atomic_init(&j->status, UM_OK);
  j->done = done;
  j->arg = arg;
  *native = j->user;
  for (int i = 0; i < n; i++) {
    ocl.clRetainEvent(tokens[i]);
    if ((err = ocl.clSetEventCallback(tokens[i], CL_COMPLETE, on_join_token, j)) != CL_SUCCESS) {
      ocl.clReleaseEvent(tokens[i]);
      join_arrive(j, translate_cl_error(err, "clSetEventCallback"));
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
  return enqueue_transfer(dev, x, CL_FALSE, 0, NULL, NULL);
}

static int ocl_xfer_async(void *bdev, const um__xfer *x, void *const *after, int nafter,
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

  if (done == NULL || native == NULL || nafter < 0 || (nafter > 0 && after == NULL))
    return um__set_error(UM_EINVAL, "opencl: bad asynchronous transfer");
  if ((status = check_transfer(dev, x)) != UM_OK)
    return status;
  completion = completion_new(dev, x, done, arg);
  if (nafter + 2 > OCL_INLINE_WAIT_LIST)
    wait_list = malloc((size_t)(nafter + 2) * sizeof(*wait_list));
  if (completion == NULL || wait_list == NULL) {
    status = um__set_error(UM_ENOMEM, "opencl: out of host memory");
    goto fail;
  }
  waits = build_wait_list(dev, x, after, nafter, wait_list);
  held = order_begin(dev, &unordered0);
  status = enqueue_transfer(dev, x, CL_FALSE, waits, waits > 0 ? wait_list : NULL, &event);
  if (status != UM_OK) {
    order_end(dev, held);
    goto fail;
  }
  completion->event = event;
  if (!x->token_held) { /* the caller may release the token before done */
    ocl.clRetainEvent(event);
    completion->retained = 1;
  }
  watch_add(dev, completion, x->kind == UM__XFER_QUEUE_MARK || x->bytes >= WATCH_OWN_BYTES, held, unordered0);
  if (wait_list != inline_wait_list)
    free(wait_list);
  *native = event;
  return UM_OK;

fail:
  if (wait_list != inline_wait_list)
    free(wait_list);
  if (completion != NULL)
    completion_free(completion);
  return status;
}

/* Release the events dev keeps for its next walk. */
static void release_later(ocl_device *dev) {
  cl_event out[OCL_RELEASE_LATER];
  int n;
  watch_lock(dev);
  n = take_later_locked(dev, out);
  watch_unlock(dev);
  release_events(out, n);
}

/* A token's last reference. The last reference of a finished command's
 * event frees it, which on PoCL takes the event's, its queue's, its
 * context's and the event allocator's locks, which enqueues and the
 * driver's worker threads take too. A raw program releases its reference
 * at issue and leaves that free to the driver's threads; unimem keeps a
 * token until the caller releases the event (um_event_native), so the
 * free fell on the thread that issues and waits, in a row of releases
 * after the waits (bench_transfer --split on a contended machine: the
 * per-copy event added +0.46-0.51 us over raw with those frees, -0.09 to
 * -0.34 us without them). So an event
 * released on a thread that is not reporting a walk is kept, up to
 * OCL_RELEASE_LATER of them per device, for the device's next walk to
 * release on the driver's callback thread, after its reports; when the
 * list is full the releasing thread releases them all. A free of the
 * device's memory (ocl_mem_free), a foreign block's release and the
 * device's close release the list first. A program that stops issuing
 * keeps at most that many finished events per device until one of
 * those. */
static void ocl_native_release(void *bdev, void *native) {
  ocl_device *dev = bdev;
  int kept;
  if (native == NULL)
    return;
  if (!reporting) {
    watch_lock(dev);
    kept = dev->nlater < OCL_RELEASE_LATER;
    if (kept)
      dev->later[dev->nlater++] = (cl_event)native;
    watch_unlock(dev);
    if (kept)
      return;
    release_later(dev); /* full: this release takes the list */
  }
  release_token((cl_event)native);
}

/* ------------------------------------------------------------------------ */
/* Map                                                                       */

static int ocl_map(void *bdev, um__mem *mem, um_location loc, size_t off,
                   size_t len, um_map_mode mode, void **host) {
  ocl_device *dev = bdev;
  cl_map_flags flags;
  cl_event done = NULL;
  cl_int err;
  void *mapped;

  if (loc != UM_DEVICE || mem == NULL || mem->host != NULL || host == NULL)
    return um__set_error(UM_EINVAL, "opencl: map is for DEVICE blocks, which "
                                    "have no host view");
  switch (mode) {
  case UM_MAP_READ:
    flags = CL_MAP_READ;
    break;
  case UM_MAP_WRITE:
    flags = CL_MAP_WRITE;
    break;
  case UM_MAP_READ_WRITE:
    flags = CL_MAP_READ | CL_MAP_WRITE;
    break;
  case UM_MAP_WRITE_DISCARD:
    flags = CL_MAP_WRITE_INVALIDATE_REGION;
    break;
  default:
    return um__set_error(UM_EINVAL, "opencl: unknown map mode %d", (int)mode);
  }
  /* Blocking unless the caller asked to spin (wait_for_own_command). */
  settle(dev);
  submit_begin(dev);
  mapped = ocl.clEnqueueMapBuffer(dev->queue, (cl_mem)mem->handle, dev->spin_ns == 0 ? CL_TRUE : CL_FALSE,
                                  flags, off, len, 0, NULL, dev->spin_ns == 0 ? NULL : &done, &err);
  submit_end(dev);
  if (err != CL_SUCCESS || mapped == NULL)
    return translate_cl_error(err != CL_SUCCESS ? err : CL_MAP_FAILURE,
                              "clEnqueueMapBuffer");
  if (done != NULL) {
    int status = wait_for_own_command(dev, done, "clEnqueueMapBuffer");
    ocl.clReleaseEvent(done);
    if (status != UM_OK) {
      /* The pointer was handed out all the same: give it back. */
      submit_begin(dev);
      ocl.clEnqueueUnmapMemObject(dev->queue, (cl_mem)mem->handle, mapped, 0, NULL, NULL);
      submit_end(dev);
      return status;
    }
  }
  *host = mapped;
  return UM_OK;
}

static int ocl_unmap(void *bdev, um__mem *mem, um_location loc, void *host) {
  ocl_device *dev = bdev;
  cl_event unmapped = NULL;
  int status;
  cl_int err;

  if (loc != UM_DEVICE || mem == NULL || host == NULL)
    return um__set_error(UM_EINVAL, "opencl: unmap of a block that was not "
                                    "mapped by map()");
  settle(dev);
  submit_begin(dev);
  err = ocl.clEnqueueUnmapMemObject(dev->queue, (cl_mem)mem->handle, host, 0,
                                    NULL, &unmapped);
  submit_end(dev);
  if (err != CL_SUCCESS)
    return translate_cl_error(err, "clEnqueueUnmapMemObject");
  /* Written data reaches the device only when the unmap has run. */
  status = wait_for_own_command(dev, unmapped, "clEnqueueUnmapMemObject");
  ocl.clReleaseEvent(unmapped);
  return status;
}

/* ------------------------------------------------------------------------ */
/* Peers                                                                     */

/* Devices that share a context can use each other's buffers in commands:
 * that is all "peer access" means to OpenCL, and it needs no enabling. */
static int ocl_peer_possible(void *a, void *b) {
  const ocl_device *da = a, *db = b;
  return da != NULL && db != NULL && da->context == db->context;
}

/* Events of one context may stand in any of its queues' wait lists. */
static int ocl_tokens_shared(void *a, void *b) { return ocl_peer_possible(a, b); }

static int ocl_peer_enable(void *a, void *b) {
  if (ocl_peer_possible(a, b))
    return UM_OK;
  return um__set_error(UM_ENOTSUP,
                       "opencl: devices of different platforms share no "
                       "context");
}

/* ------------------------------------------------------------------------ */
/* The caller's own commands (SPEC §8)                                       */

static void ocl_device_native(void *bdev, um_device_native *out) {
  ocl_device *dev = bdev;
  out->cl_platform = dev->platform;
  out->cl_device = dev->id;
  out->cl_context = dev->context;
  out->cl_queue = dev->caller_queue;
}

static void ocl_mem_native(void *bdev, const um__mem *mem, um_location loc, um_buffer_native *out) {
  (void)bdev;
  if (loc == UM_UNIFIED)
    out->svm = mem->host;
  else
    out->cl_mem = (void *)mem->handle;
}

/* A cl_mem of the caller's (a DLPack import) as a DEVICE block: a buffer of
 * this device's context holding [offset, offset + bytes); a sub-buffer over
 * that range when offset > 0 (priv holds it, for foreign_release). */
static int ocl_foreign_wrap(void *bdev, um_location loc, uintptr_t handle, uint64_t offset,
                            size_t bytes, um__mem *out) {
  ocl_device *dev = bdev;
  cl_mem mem = (cl_mem)handle, sub;
  cl_mem_object_type type = 0;
  cl_context context = NULL;
  size_t size = 0;
  cl_buffer_region region;
  cl_int err;
  if (loc != UM_DEVICE || ocl.clGetMemObjectInfo == NULL || ocl.clCreateSubBuffer == NULL)
    return um__set_error(UM_ENOTSUP, "opencl: %s cannot wrap a cl_mem of the caller's", dev->name);
  if ((err = ocl.clGetMemObjectInfo(mem, CL_MEM_TYPE, sizeof(type), &type, NULL)) != CL_SUCCESS ||
      (err = ocl.clGetMemObjectInfo(mem, CL_MEM_CONTEXT, sizeof(context), &context, NULL)) != CL_SUCCESS ||
      (err = ocl.clGetMemObjectInfo(mem, CL_MEM_SIZE, sizeof(size), &size, NULL)) != CL_SUCCESS)
    return translate_cl_error(err, "clGetMemObjectInfo");
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
  region.origin = (size_t)offset;
  region.size = bytes;
  sub = ocl.clCreateSubBuffer(mem, 0, CL_BUFFER_CREATE_TYPE_REGION, &region, &err);
  if (sub == NULL || err != CL_SUCCESS)
    return err == CL_MISALIGNED_SUB_BUFFER_OFFSET
               ? um__set_error(UM_ENOTSUP, "opencl: %s cannot start a sub-buffer at offset %llu (alignment)",
                               dev->name, (unsigned long long)offset)
               : translate_cl_error(err != CL_SUCCESS ? err : CL_OUT_OF_RESOURCES, "clCreateSubBuffer");
  out->handle = (uintptr_t)sub;
  out->priv = sub;
  return UM_OK;
}

static void ocl_foreign_release(void *bdev, um__mem *mem) {
  release_later(bdev);
  if (mem->priv != NULL)
    ocl.clReleaseMemObject((cl_mem)mem->priv);
}

static void *ocl_token_native(void *bdev, void *token) {
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
  cl_int err = ocl.clGetEventInfo(native, CL_EVENT_COMMAND_TYPE, sizeof(type), &type, NULL);
  if (err == CL_SUCCESS)
    err = ocl.clGetEventInfo(native, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof(status), &status, NULL);
  if (err != CL_SUCCESS)
    return um__set_error(UM_EINVAL, "opencl: the done event is not a cl_event (clGetEventInfo: %s)",
                         ocl_error_name(err));
  if (type < CL_COMMAND_NDRANGE_KERNEL || type > 0xFFFF || status > CL_QUEUED)
    return um__set_error(UM_EINVAL, "opencl: the done event is not a cl_event (command type 0x%x, status %d)",
                         (unsigned)type, (int)status);
  return UM_OK;
}

static int ocl_token_adopt(void *bdev, void *native, void **token) {
  ocl_device *dev = bdev;
  cl_context context = NULL;
  cl_int err;
  int st = check_event_object((cl_event)native);
  if (st != UM_OK)
    return st;
  err = ocl.clGetEventInfo((cl_event)native, CL_EVENT_CONTEXT, sizeof(context), &context, NULL);
  if (err != CL_SUCCESS)
    return translate_cl_error(err, "clGetEventInfo");
  if (context != dev->context)
    return um__set_error(UM_EINVAL, "opencl: the event belongs to another context than %s's", dev->name);
  if ((err = ocl.clRetainEvent((cl_event)native)) != CL_SUCCESS)
    return translate_cl_error(err, "clRetainEvent");
  *token = native;
  return UM_OK;
}

/* A user event with two references: gate_open drops the opener's. */
static int ocl_gate_new(void *bdev, void **token) {
  ocl_device *dev = bdev;
  cl_int err = CL_SUCCESS;
  cl_event gate = ocl.clCreateUserEvent(dev->context, &err);
  if (gate == NULL || err != CL_SUCCESS)
    return translate_cl_error(err != CL_SUCCESS ? err : CL_OUT_OF_RESOURCES, "clCreateUserEvent");
  ocl.clRetainEvent(gate);
  *token = gate;
  return UM_OK;
}

static void ocl_gate_open(void *bdev, void *token, int status) {
  (void)bdev;
  /* A negative status fails the commands waiting for the gate. */
  ocl.clSetUserEventStatus((cl_event)token, status == UM_OK ? CL_COMPLETE : CL_INVALID_OPERATION);
  ocl.clReleaseEvent((cl_event)token);
}

static int ocl_caller_marker(void *bdev, void **token) {
  ocl_device *dev = bdev;
  cl_event marker = NULL;
  cl_int err;
  submit_begin(dev);
  err = ocl.clEnqueueMarkerWithWaitList(dev->caller_queue, 0, NULL, &marker);
  if (err == CL_SUCCESS)
    ocl.clFlush(dev->caller_queue);
  submit_end(dev);
  if (err != CL_SUCCESS)
    return translate_cl_error(err, "clEnqueueMarkerWithWaitList");
  *token = marker;
  return UM_OK;
}

static int ocl_token_query(void *bdev, void *token) {
  cl_int execution_status = CL_QUEUED;
  (void)bdev;
  if (ocl.clGetEventInfo((cl_event)token, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof(execution_status),
                         &execution_status, NULL) != CL_SUCCESS)
    return 0; /* not known: the waiter goes by the core's own state */
  return execution_status <= CL_COMPLETE;
}

static int ocl_token_wait(void *bdev, void *token) {
  (void)bdev;
  return wait_for_command((cl_event)token, "clWaitForEvents");
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
  cl_int err = ocl.clGetCommandQueueInfo(queue, CL_QUEUE_CONTEXT, sizeof(qctx), &qctx, NULL);
  if (err == CL_SUCCESS)
    err = ocl.clGetCommandQueueInfo(queue, CL_QUEUE_DEVICE, sizeof(qdev), &qdev, NULL);
  if (err == CL_SUCCESS)
    err = ocl.clGetContextInfo(context, CL_CONTEXT_DEVICES, sizeof(ids), ids, &size);
  if (err != CL_SUCCESS)
    return translate_cl_error(err, "clGetContextInfo");
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

static int ocl_adopt(const um_options *opts, void **ctx, void *context, void *device, void *queue,
                     um__bdev_desc *out) {
  ocl_state *state = *ctx;
  ocl_device *dev = NULL;
  cl_platform_id platform = NULL;
  int ndevices = 0, major = 0, minor = 0, status;
  if ((status = um__vendor_lib_load(&ocl_lib, UM_ENOTSUP)) != UM_OK)
    return status;
  if ((status = check_adopted(context, device, queue, &ndevices)) != UM_OK)
    return status;
  if (ocl.clGetDeviceInfo(device, CL_DEVICE_PLATFORM, sizeof(platform), &platform, NULL) != CL_SUCCESS ||
      (status = platform_version(platform, &major, &minor)) != UM_OK)
    return status != UM_OK ? status : um__set_error(UM_EINVAL, "opencl: not a device");
  if (state == NULL && (*ctx = state = calloc(1, sizeof(*state))) == NULL)
    return um__set_error(UM_ENOMEM, "opencl: out of host memory");
  if ((status = open_device(device, context, ndevices, major, opts, queue, &dev)) != UM_OK)
    return status;
  /* The context is retained once per adoption: close releases each. */
  if ((status = append_device(state, dev)) != UM_OK ||
      (ocl.clRetainContext(context) == CL_SUCCESS &&
       (status = append_context(state, context)) != UM_OK)) {
    if (state->device_count > 0 && state->devices[state->device_count - 1] == dev)
      state->device_count--;
    destroy_device(dev);
    return status;
  }
  return ocl_describe(state, state->device_count - 1, out);
}

const um__backend um__backend_opencl = {
    .name = "opencl",
    .open = ocl_open,
    .describe = ocl_describe,
    .close = ocl_close,
    .mem_alloc = ocl_mem_alloc,
    .mem_free = ocl_mem_free,
    .host_register = NULL,
    .host_unregister = NULL,
    .memory = ocl_memory,
    .synchronize = ocl_synchronize,
    .xfer = ocl_xfer,
    .xfer_async = ocl_xfer_async,
    .native_release = ocl_native_release,
    .map = ocl_map,
    .unmap = ocl_unmap,
    .peer_possible = ocl_peer_possible,
    .peer_enable = ocl_peer_enable,
    .tokens_shared = ocl_tokens_shared,
    .device_native = ocl_device_native,
    .mem_native = ocl_mem_native,
    .token_native = ocl_token_native,
    .foreign_wrap = ocl_foreign_wrap,
    .foreign_release = ocl_foreign_release,
    .token_adopt = ocl_token_adopt,
    .gate_new = ocl_gate_new,
    .gate_open = ocl_gate_open,
    .caller_marker = ocl_caller_marker,
    .token_wait = ocl_token_wait,
    .token_query = ocl_token_query,
    .adopt = ocl_adopt,
    /* Event callbacks may make non-blocking OpenCL calls (OpenCL 1.2,
     * 5.9 "clSetEventCallback"); native_release and mem_free are such. */
    .callbacks_reenter = 1,
    /* One in-order queue per device carries every transfer (the caller's
     * commands go on the caller queue). */
    .single_queue = 1,
};
