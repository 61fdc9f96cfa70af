/* unimem_dlpack.h — the DLPack exchange structures, for readers of the
 * tensors um_dlpack_export makes and writers of those um_dlpack_import
 * takes (unimem.h declares both functions; this header is optional).
 *
 * DLPack (the array exchange format of NumPy, PyTorch, CuPy, JAX...) is
 * defined by its published C layout, which has not changed since v0.6 for
 * the legacy tensor and since v1.0 for the versioned one. Debian ships only
 * dlpack.h 0.6, so unimem writes the layout out itself here, under names of
 * its own (um_dl_*, UM_DL_*): this header can be included together with
 * any dlpack.h without a clash, and a pointer converts with a cast:
 *
 *     DLManagedTensor *t = (DLManagedTensor *)legacy;            // v0.6+
 *     DLManagedTensorVersioned *v = (DLManagedTensorVersioned *)versioned;
 *
 * tests/conformance/test_dlpack.c pins every offset and size below to the published
 * ABI (LP64: x86-64, AArch64).
 */
#ifndef UNIMEM_DLPACK_H
#define UNIMEM_DLPACK_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The DLPack version unimem's versioned tensors carry; a versioned tensor
 * of another major version cannot be read (um_dlpack_import: UM_ENOTSUP). */
#define UM_DL_MAJOR_VERSION 1
#define UM_DL_MINOR_VERSION 0

/* DLPackVersion (8 bytes). */
typedef struct um_dl_version {
  uint32_t major;
  uint32_t minor;
} um_dl_version;

/* DLDeviceType values (a C enum in dlpack.h: 4 bytes). */
enum {
  UM_DL_CPU = 1,           /* kDLCPU: host memory */
  UM_DL_CUDA = 2,          /* kDLCUDA: CUDA device memory (a CUdeviceptr) */
  UM_DL_CUDA_HOST = 3,     /* kDLCUDAHost: page-locked host memory (cudaMallocHost) */
  UM_DL_OPENCL = 4,        /* kDLOpenCL: data is a cl_mem */
  UM_DL_VULKAN = 7,        /* kDLVulkan */
  UM_DL_METAL = 8,         /* kDLMetal */
  UM_DL_VPI = 9,           /* kDLVPI */
  UM_DL_ROCM = 10,         /* kDLROCM */
  UM_DL_ROCM_HOST = 11,    /* kDLROCMHost */
  UM_DL_EXT_DEV = 12,      /* kDLExtDev */
  UM_DL_CUDA_MANAGED = 13, /* kDLCUDAManaged: cudaMallocManaged memory */
  UM_DL_ONEAPI = 14,       /* kDLOneAPI */
  UM_DL_WEBGPU = 15,       /* kDLWebGPU */
  UM_DL_HEXAGON = 16       /* kDLHexagon */
};

/* DLDataTypeCode values (the code byte of um_dl_dtype). */
enum {
  UM_DL_INT = 0,
  UM_DL_UINT = 1,
  UM_DL_FLOAT = 2,
  UM_DL_OPAQUE_HANDLE = 3,
  UM_DL_BFLOAT = 4,
  UM_DL_COMPLEX = 5,
  UM_DL_BOOL = 6
};

/* DLDevice (8 bytes). */
typedef struct um_dl_device {
  int32_t device_type; /* UM_DL_* device type */
  int32_t device_id;   /* the device's ordinal within its type */
} um_dl_device;

/* DLDataType (4 bytes): an element is bits * lanes bits. */
typedef struct um_dl_dtype {
  uint8_t code;   /* UM_DL_INT, UM_DL_UINT, UM_DL_FLOAT, ... */
  uint8_t bits;   /* bits of one lane */
  uint16_t lanes; /* 1 for scalars */
} um_dl_dtype;

/* DLTensor (48 bytes). The first element lies at (char *)data + byte_offset
 * for host memory; for an OpenCL tensor data is the cl_mem and byte_offset
 * the offset inside it. strides counts elements; NULL means C-contiguous. */
typedef struct um_dl_tensor {
  void *data;
  um_dl_device device;
  int32_t ndim;
  um_dl_dtype dtype;
  int64_t *shape;   /* ndim entries */
  int64_t *strides; /* ndim entries, or NULL */
  uint64_t byte_offset;
} um_dl_tensor;

/* DLManagedTensor (64 bytes): the legacy tensor ("dltensor" capsules). The
 * consumer calls deleter(self) once when done; deleter may be NULL. */
typedef struct um_dl_managed_tensor {
  um_dl_tensor dl_tensor;
  void *manager_ctx;
  void (*deleter)(struct um_dl_managed_tensor *self);
} um_dl_managed_tensor;

/* Bits of um_dl_managed_tensor_versioned.flags. */
#define UM_DL_FLAG_READ_ONLY (UINT64_C(1) << 0) /* the consumer must not write */
#define UM_DL_FLAG_IS_COPIED (UINT64_C(1) << 1) /* the producer made a copy for it */
#define UM_DL_FLAG_IS_SUBBYTE_TYPE_PADDED (UINT64_C(1) << 2) /* v1.1: sub-byte elements padded */

/* DLManagedTensorVersioned (80 bytes): the v1.x tensor ("dltensor_versioned"
 * capsules). */
typedef struct um_dl_managed_tensor_versioned {
  um_dl_version version;
  void *manager_ctx;
  void (*deleter)(struct um_dl_managed_tensor_versioned *self);
  uint64_t flags; /* UM_DL_FLAG_* */
  um_dl_tensor dl_tensor;
} um_dl_managed_tensor_versioned;

#ifdef __cplusplus
}
#endif
#endif /* UNIMEM_DLPACK_H */
