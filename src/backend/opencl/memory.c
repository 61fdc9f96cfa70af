/* OpenCL blocks (DEVICE, PINNED, UNIFIED), the memory query, synchronize,
 * map/unmap of DEVICE blocks, and peers (devices of one context). */
#include "opencl_private.h"

/* ------------------------------------------------------------------------ */
/* Memory                                                                    */

/* clCreateBuffer without a host pointer; a NULL answer without a code is
 * counted as a lack of memory. */
static int create_buffer(ocl_device *dev, cl_mem_flags flags, size_t bytes,
                         cl_mem *out) {
  cl_int err = CL_SUCCESS;
  cl_mem mem = um__ocl.clCreateBuffer(dev->context, flags, bytes, NULL, &err);
  if (mem == NULL && err == CL_SUCCESS)
    err = CL_MEM_OBJECT_ALLOCATION_FAILURE;
  if (err != CL_SUCCESS)
    return um__ocl_translate_cl_error(err, "clCreateBuffer");
  *out = mem;
  return UM_OK;
}

/* The one cleanup path of the cl_mem allocators: the block goes out in
 * *out (host: its mapped view, or NULL), or its buffer is released when
 * status says the allocation failed. */
static int block_finish(cl_mem mem, void *host, int status, um__mem *out) {
  if (status != UM_OK) {
    um__ocl.clReleaseMemObject(mem);
    return status;
  }
  out->host = host;
  out->handle = (uintptr_t)mem;
  out->priv = NULL;
  return UM_OK;
}

/* No command commits the memory here: a migration and its wait cost a
 * round trip to the driver's threads on every pool miss, where the
 * clCreateBuffer itself costs almost nothing. The core keeps the device's
 * bytes within its size (um__backend.commits_lazily), and a commit that
 * fails later fails the block's first command with
 * CL_MEM_OBJECT_ALLOCATION_FAILURE (UM_ENOMEM). The driver places the
 * buffer on the device that first uses it. */
static int alloc_device_block(ocl_device *dev, size_t bytes, um__mem *out) {
  cl_mem mem = NULL;
  int status = create_buffer(dev, CL_MEM_READ_WRITE, bytes, &mem);
  if (status != UM_OK)
    return status;
  return block_finish(mem, NULL, UM_OK, out);
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
  um__ocl_submit_begin(dev);
  host = um__ocl.clEnqueueMapBuffer(dev->queue, mem, CL_TRUE,
                                CL_MAP_READ | CL_MAP_WRITE, 0, bytes, 0, NULL,
                                NULL, &err);
  um__ocl_submit_end(dev);
  if (host == NULL || err != CL_SUCCESS)
    status = um__ocl_translate_cl_error(err != CL_SUCCESS ? err : CL_MAP_FAILURE,
                                "clEnqueueMapBuffer");
  return block_finish(mem, host, status, out);
}

static int alloc_unified_block(ocl_device *dev, size_t bytes, um__mem *out) {
  void *svm = um__ocl.clSVMAlloc(dev->context,
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

int um__ocl_mem_alloc(void *bdev, um_location loc, size_t bytes,
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

void um__ocl_mem_free(void *bdev, um_location loc, size_t bytes,
                         um__mem *mem) {
  ocl_device *dev = bdev;
  (void)bytes;
  /* Nothing of ours outlives the memory: not even a finished command's
   * event, which a driver may let hold its buffers. */
  um__ocl_release_later(dev);
  switch (loc) {
  case UM_DEVICE:
    um__ocl.clReleaseMemObject((cl_mem)mem->handle);
    break;
  case UM_PINNED:
    /* The release waits for the unmap: OpenCL deletes a memory object only
     * once the commands that use it have finished. */
    um__ocl_submit_begin(dev);
    um__ocl.clEnqueueUnmapMemObject(dev->queue, (cl_mem)mem->handle, mem->host, 0,
                                NULL, NULL);
    um__ocl_submit_end(dev);
    um__ocl.clReleaseMemObject((cl_mem)mem->handle);
    break;
  case UM_UNIFIED:
    um__ocl.clSVMFree(dev->context, mem->host);
    break;
  default:
    break;
  }
  mem->host = NULL;
  mem->handle = 0;
}

/* A carved block: a sub-buffer of the segment's cl_mem (DEVICE, PINNED:
 * its host view is the segment's mapping moved by off), or a pointer into
 * its SVM allocation (UNIFIED). */
int um__ocl_mem_carve(void *bdev, um_location loc, const um__mem *seg, size_t off, size_t bytes,
                      um__mem *out) {
  ocl_device *dev = bdev;
  cl_buffer_region region;
  cl_int err = CL_SUCCESS;
  cl_mem sub;
  if (loc == UM_UNIFIED) {
    out->host = (char *)seg->host + off;
    out->handle = (uintptr_t)out->host;
    out->priv = NULL;
    return UM_OK;
  }
  if ((loc != UM_DEVICE && loc != UM_PINNED) || um__ocl.clCreateSubBuffer == NULL)
    return um__set_error(UM_ENOTSUP, "opencl: %s cannot carve location %d", dev->name, (int)loc);
  region.origin = off;
  region.size = bytes;
  /* Flags 0: the sub-buffer inherits the segment's. */
  sub = um__ocl.clCreateSubBuffer((cl_mem)seg->handle, 0, CL_BUFFER_CREATE_TYPE_REGION, &region, &err);
  if (sub == NULL && err == CL_SUCCESS)
    err = CL_OUT_OF_RESOURCES;
  if (err != CL_SUCCESS)
    return um__ocl_translate_cl_error(err, "clCreateSubBuffer");
  out->host = loc == UM_PINNED ? (char *)seg->host + off : NULL;
  out->handle = (uintptr_t)sub;
  out->priv = NULL;
  return UM_OK;
}

void um__ocl_mem_uncarve(void *bdev, um_location loc, um__mem *mem) {
  ocl_device *dev = bdev;
  if (loc != UM_UNIFIED) {
    um__ocl_release_later(dev); /* as um__ocl_mem_free: no event of ours holds it */
    um__ocl.clReleaseMemObject((cl_mem)mem->handle);
  }
  mem->host = NULL;
  mem->handle = 0;
}

/* OpenCL has no standard free-memory query (cl_amd_device_attribute_query
 * and the like are vendor extensions): the answer is the whole device, and
 * the core takes off what this process holds there (um_device_memory);
 * other processes' use is not seen. */
int um__ocl_memory(void *bdev, uint64_t *free_bytes, uint64_t *total_bytes) {
  ocl_device *dev = bdev;
  if (free_bytes != NULL)
    *free_bytes = dev->total_bytes;
  if (total_bytes != NULL)
    *total_bytes = dev->total_bytes;
  return UM_OK;
}

int um__ocl_synchronize(void *bdev) {
  ocl_device *dev = bdev;
  cl_event marker = NULL;
  cl_int err;
  int status;
  if (dev->spin_ns == 0)
    return um__ocl_translate_cl_error(um__ocl.clFinish(dev->queue), "clFinish");
  /* A marker with an empty wait list completes after everything queued
   * before it (clFinish's meaning), and can be polled. */
  um__ocl_settle(dev);
  um__ocl_submit_begin(dev);
  err = um__ocl.clEnqueueMarkerWithWaitList(dev->queue, 0, NULL, &marker);
  um__ocl_submit_end(dev);
  if (err != CL_SUCCESS)
    return um__ocl_translate_cl_error(err, "clEnqueueMarkerWithWaitList");
  status = um__ocl_wait_for_own_command(dev, marker, "clFinish");
  um__ocl.clReleaseEvent(marker);
  return status;
}

/* ------------------------------------------------------------------------ */
/* Map                                                                       */

int um__ocl_map(void *bdev, um__mem *mem, um_location loc, size_t off,
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
  /* Blocking unless the caller asked to spin (um__ocl_wait_for_own_command). */
  um__ocl_settle(dev);
  um__ocl_submit_begin(dev);
  mapped = um__ocl.clEnqueueMapBuffer(dev->queue, (cl_mem)mem->handle, dev->spin_ns == 0 ? CL_TRUE : CL_FALSE,
                                  flags, off, len, 0, NULL, dev->spin_ns == 0 ? NULL : &done, &err);
  um__ocl_submit_end(dev);
  if (err != CL_SUCCESS || mapped == NULL)
    return um__ocl_translate_cl_error(err != CL_SUCCESS ? err : CL_MAP_FAILURE,
                              "clEnqueueMapBuffer");
  if (done != NULL) {
    int status = um__ocl_wait_for_own_command(dev, done, "clEnqueueMapBuffer");
    um__ocl.clReleaseEvent(done);
    if (status != UM_OK) {
      /* The pointer was handed out all the same: give it back. */
      um__ocl_submit_begin(dev);
      um__ocl.clEnqueueUnmapMemObject(dev->queue, (cl_mem)mem->handle, mapped, 0, NULL, NULL);
      um__ocl_submit_end(dev);
      return status;
    }
  }
  *host = mapped;
  return UM_OK;
}

int um__ocl_unmap(void *bdev, um__mem *mem, um_location loc, void *host) {
  ocl_device *dev = bdev;
  cl_event unmapped = NULL;
  int status;
  cl_int err;

  if (loc != UM_DEVICE || mem == NULL || host == NULL)
    return um__set_error(UM_EINVAL, "opencl: unmap of a block that was not "
                                    "mapped by map()");
  um__ocl_settle(dev);
  um__ocl_submit_begin(dev);
  err = um__ocl.clEnqueueUnmapMemObject(dev->queue, (cl_mem)mem->handle, host, 0,
                                    NULL, &unmapped);
  um__ocl_submit_end(dev);
  if (err != CL_SUCCESS)
    return um__ocl_translate_cl_error(err, "clEnqueueUnmapMemObject");
  /* Written data reaches the device only when the unmap has run. */
  status = um__ocl_wait_for_own_command(dev, unmapped, "clEnqueueUnmapMemObject");
  um__ocl.clReleaseEvent(unmapped);
  return status;
}

/* ------------------------------------------------------------------------ */
/* Peers                                                                     */

/* Devices that share a context can use each other's buffers in commands:
 * that is all "peer access" means to OpenCL, and it needs no enabling. */
int um__ocl_peer_possible(void *a, void *b) {
  const ocl_device *da = a, *db = b;
  return da != NULL && db != NULL && da->context == db->context;
}

/* Events of one context may stand in any of its queues' wait lists. */
int um__ocl_tokens_shared(void *a, void *b) { return um__ocl_peer_possible(a, b); }

int um__ocl_peer_enable(void *a, void *b) {
  if (um__ocl_peer_possible(a, b))
    return UM_OK;
  return um__set_error(UM_ENOTSUP,
                       "opencl: devices of different platforms share no "
                       "context");
}

