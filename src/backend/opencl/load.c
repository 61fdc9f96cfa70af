/* The OpenCL library's entry points (loaded through base/vendor_lib.c), its
 * status codes as UM_E* codes, and the backend's table (um__backend_opencl). */
#include "opencl_private.h"

ocl_api um__ocl;

static const um__vendor_entry ocl_entries[] = {
#define OCL_REQUIRED_(ret, name, params) {#name, offsetof(ocl_api, name), true},
#define OCL_OPTIONAL_(ret, name, params) {#name, offsetof(ocl_api, name), false},
    OCL_REQUIRED_ENTRY_POINTS(OCL_REQUIRED_) OCL_OPTIONAL_ENTRY_POINTS(OCL_OPTIONAL_)
#undef OCL_REQUIRED_
#undef OCL_OPTIONAL_
};

/* The optional entry points that go in pairs. */
static int ocl_loaded(um__vendor_lib *lib) {
  if (um__ocl.clCreateCommandQueueWithProperties == NULL && um__ocl.clCreateCommandQueue == NULL) {
    snprintf(lib->failure, sizeof(lib->failure),
             "clCreateCommandQueueWithProperties and clCreateCommandQueue missing in %s", lib->path);
    return -1;
  }
  /* UNIFIED needs both halves of the pair. */
  if (um__ocl.clSVMAlloc == NULL || um__ocl.clSVMFree == NULL) {
    um__ocl.clSVMAlloc = NULL;
    um__ocl.clSVMFree = NULL;
  }
  return 0;
}

static const char *const ocl_names[] = {OCL_DEFAULT_LIBRARY, NULL};

/* The library is never unloaded: vendor drivers keep threads and atexit
 * handlers that do not survive dlclose (the ICD loader does the same). */
um__vendor_lib um__ocl_lib =
    UM__VENDOR_LIB_INIT("opencl", OCL_LIBRARY_ENV, ocl_names, ocl_entries, &um__ocl, ocl_loaded);

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

static const struct {
  cl_int code;
  const char *name;
} ocl_error_names[] = {
#define OCL_ERROR_ENTRY_(name) {name, #name},
    OCL_ERROR_NAMES(OCL_ERROR_ENTRY_)
#undef OCL_ERROR_ENTRY_
};

const char *um__ocl_error_name(cl_int err) {
  for (size_t i = 0; i < sizeof(ocl_error_names) / sizeof(ocl_error_names[0]); i++)
    if (ocl_error_names[i].code == err)
      return ocl_error_names[i].name;
  return "CL error";
}

/* The one place where OpenCL status codes become UM_E* codes. Records
 * "CL_NAME (code) in call" for um_last_error() and returns the code. */
int um__ocl_translate_cl_error(cl_int err, const char *call) {
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
  return um__set_error(status, "%s (%d) in %s", um__ocl_error_name(err), (int)err,
                       call);
}

const um__backend um__backend_opencl = {
    .name = "opencl",
    /* devices */
    .open = um__ocl_open, .describe = um__ocl_describe, .close = um__ocl_close,
    .memory = um__ocl_memory, .synchronize = um__ocl_synchronize,
    .peer_possible = um__ocl_peer_possible, .peer_enable = um__ocl_peer_enable,
    .device_native = um__ocl_device_native, .adopt = um__ocl_adopt,
    /* memory (host memory is not registered: OpenCL has no such call) */
    .mem_alloc = um__ocl_mem_alloc, .mem_free = um__ocl_mem_free,
    .mem_carve = um__ocl_mem_carve, .mem_uncarve = um__ocl_mem_uncarve, .mem_native = um__ocl_mem_native,
    .host_register = NULL, .host_unregister = NULL,
    .map = um__ocl_map, .unmap = um__ocl_unmap,
    .foreign_wrap = um__ocl_foreign_wrap, .foreign_release = um__ocl_foreign_release,
    /* transfers. One in-order queue per device carries every transfer (the
     * caller's commands go on the caller queue). */
    .xfer = um__ocl_xfer, .xfer_async = um__ocl_xfer_async,
    .single_queue = 1,
    /* Event callbacks may make non-blocking OpenCL calls (OpenCL 1.2,
     * 5.9 "clSetEventCallback"); native_release and mem_free are such. */
    .callbacks_reenter = 1,
    /* clCreateBuffer commits nothing: no round trip on a pool miss. */
    .commits_lazily = 1,
    /* tokens, gates and the caller's queue */
    .native_release = um__ocl_native_release, .tokens_shared = um__ocl_tokens_shared,
    .token_native = um__ocl_token_native, .token_adopt = um__ocl_token_adopt,
    .token_wait = um__ocl_token_wait, .token_query = um__ocl_token_query,
    .gate_new = um__ocl_gate_new, .gate_open = um__ocl_gate_open, .caller_marker = um__ocl_caller_marker,
    .queue_adopt = um__ocl_queue_adopt,
    .queue_kick = um__ocl_queue_kick,
    .queue_mark_now = um__ocl_queue_mark_now,
};
