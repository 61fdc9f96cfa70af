/* The CUDA driver's entry points (loaded through base/vendor_lib.c), CUresults
 * as UM_E* codes, and the backend's table (um__backend_cuda). */
#include "cuda_private.h"

static const um__vendor_entry cuda_entry_points[] = {
#define CUDA_REQUIRED_(symbol) {#symbol, offsetof(cuda_driver_api, symbol), true},
#define CUDA_OPTIONAL_(symbol) {#symbol, offsetof(cuda_driver_api, symbol), false},
    CUDA_ENTRY_POINTS(CUDA_REQUIRED_, CUDA_OPTIONAL_)
#undef CUDA_REQUIRED_
#undef CUDA_OPTIONAL_
};

/* The entry points, filled once by um__cuda_driver_lib's load (read-only after),
 * and what cuInit said where it found no device. */
cuda_driver_api um__cuda_driver;
int um__cuda_driver_no_devices;         /* cuInit answered CUDA_ERROR_NO_DEVICE */
char um__cuda_driver_no_device_reason[512];

/* The one translation of a CUresult into a UM_E* code. With call != NULL it
 * also records the driver's error name for um_last_error(). Stream
 * callbacks pass call == NULL: they run on a driver thread where no CUDA
 * call is allowed, cuGetErrorName included. */
int um__cuda_status(CUresult result, const char *call) {
  int status;
  const char *name = NULL;
  const char *text = NULL;

  switch (result) {
  case CUDA_SUCCESS:
    return UM_OK;
  case CUDA_ERROR_OUT_OF_MEMORY:
    status = UM_ENOMEM;
    break;
  case CUDA_ERROR_INVALID_VALUE:
    status = UM_EINVAL;
    break;
  case CUDA_ERROR_NO_DEVICE:
  case CUDA_ERROR_INVALID_DEVICE:
    status = UM_ENODEV;
    break;
  case CUDA_ERROR_NOT_SUPPORTED:
  case CUDA_ERROR_PEER_ACCESS_UNSUPPORTED:
  case CUDA_ERROR_TOO_MANY_PEERS: /* this pair cannot have peer access */
    status = UM_ENOTSUP;
    break;
  default:
    status = UM_EBACKEND;
    break;
  }
  if (call == NULL)
    return status;
  if (cu->cuGetErrorName == NULL || cu->cuGetErrorName(result, &name) != CUDA_SUCCESS)
    name = NULL;
  if (cu->cuGetErrorString == NULL ||
      cu->cuGetErrorString(result, &text) != CUDA_SUCCESS)
    text = NULL;
  if (name != NULL)
    return um__set_error(status, "cuda: %s failed: %s (%s)", call, name,
                         text != NULL ? text : "no description");
  return um__set_error(status, "cuda: %s failed: CUresult %d", call,
                       (int)result);
}

/* cuInit is per process, so it belongs to the one-time load. A machine
 * with the driver but no GPU is not an error: the backend offers zero
 * devices. A driver that cannot initialise (stub library, version
 * mismatch) gives no usable device either, so it reads as ENODEV. */
static int driver_init(um__vendor_lib *lib) {
  CUresult result = cu->cuInit(0);
  const char *text;
  if (result == CUDA_SUCCESS)
    return 0;
  um__cuda_status(result, "cuInit");
  if (result == CUDA_ERROR_NO_DEVICE) {
    um__cuda_driver_no_devices = 1;
    snprintf(um__cuda_driver_no_device_reason, sizeof(um__cuda_driver_no_device_reason), "%s (driver %s)",
             um_last_error(), lib->path);
    return 0;
  }
  /* The loader's message starts with "cuda: " already. */
  text = um_last_error();
  if (strncmp(text, "cuda: ", 6) == 0)
    text += 6;
  snprintf(lib->failure, sizeof(lib->failure), "%s (driver %s%s)", text, lib->path,
           result == CUDA_ERROR_STUB_LIBRARY ? ": the toolkit's stub library, not a driver" : "");
  return -1;
}

static const char *const driver_names[] = {"libcuda.so.1", NULL};

/* libcuda stays loaded for the process: the driver keeps threads that do
 * not survive dlclose. */
um__vendor_lib um__cuda_driver_lib =
    UM__VENDOR_LIB_INIT("cuda", "UNIMEM_CUDA_LIBRARY", driver_names, cuda_entry_points, &um__cuda_driver, driver_init);

const um__backend um__backend_cuda = {
    .name = "cuda",
    /* devices */
    .open = um__cuda_open, .describe = um__cuda_describe, .close = um__cuda_close,
    .memory = um__cuda_memory, .synchronize = um__cuda_synchronize,
    .peer_possible = um__cuda_peer_possible, .peer_enable = um__cuda_peer_enable,
    .device_native = um__cuda_device_native,
    .adopt = NULL, /* um_manager_adopt takes OpenCL contexts only */
    /* memory (no map: device memory has no host view) */
    .mem_alloc = um__cuda_mem_alloc, .mem_free = um__cuda_mem_free,
    .mem_carve = um__cuda_mem_carve, .mem_uncarve = um__cuda_mem_uncarve, .mem_native = um__cuda_mem_native,
    .host_register = um__cuda_host_register, .host_unregister = um__cuda_host_unregister,
    .map = NULL, .unmap = NULL,
    /* transfers, one stream per kind */
    .xfer = um__cuda_xfer, .xfer_async = um__cuda_xfer_async, .queue_of = um__cuda_queue_of,
    /* No CUDA call is allowed in a stream callback. */
    .callbacks_reenter = 0,
    /* tokens, gates and the caller's stream */
    .native_release = um__cuda_native_release, .tokens_shared = um__cuda_tokens_shared,
    .token_native = um__cuda_token_native, .token_adopt = um__cuda_token_adopt,
    .token_wait = um__cuda_token_wait, .token_query = um__cuda_token_query, .token_reap = um__cuda_token_reap,
    .gate_new = um__cuda_gate_new, .gate_open = um__cuda_gate_open, .caller_marker = um__cuda_caller_marker,
    .queue_adopt = um__cuda_queue_adopt,
};
