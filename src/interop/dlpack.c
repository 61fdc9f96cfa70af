/* DLPack: a buffer's memory as a tensor another framework reads
 * and writes in place, and a tensor of another framework as a buffer.
 *
 * Export: one malloc'd block holds the managed tensor (either kind), its
 * shape and strides, and the buffer, which it keeps live with one
 * um_buffer_retain until the consumer calls the deleter.
 *
 * Import: the tensor's memory becomes a foreign wrap (um__wrap_foreign) on
 * the device it names; the wrap's on_return gives back what the backend
 * made for it (an OpenCL sub-buffer) and then calls the producer's
 * deleter, once, when the buffer is released and its operations finished.
 *
 * Devices are matched by backend and ordinal: DLPack's CUDA ordinal is the
 * CUDA device's own (um_device_native.cu_device); for OpenCL, which has no
 * global ordinal, it is the position among the manager's OpenCL devices.
 */
#include <stdlib.h>

#include "interop.h"
#include "unimem_dlpack.h"

#define MAX_EXPORT_NDIM 64

static const char *backend_of(const um_device *d) { return um__dev_backend_name(d); }

static bool is_backend(const um_device *d, const char *name) { return strcmp(backend_of(d), name) == 0; }

/* d's position among m's devices of its backend (DLPack's OpenCL ordinal). */
static int32_t ordinal_in_backend(const um_device *d) {
  int32_t n = 0;
  for (int i = 0; i < d->index; i++)
    n += um__dev_same_backend(d->m->devices[i], d);
  return n;
}

/* ------------------------------------------------------------------------ */
/* Where a buffer's memory is, as DLPack names it */

typedef struct dl_place {
  int32_t type, id;
  void *data;
  uint64_t byte_offset;
} dl_place;

static int place_host(um_buffer *b, size_t offset, dl_place *p) {
  if (b->mem.host == NULL)
    return um__set_error(UM_ENOTSUP, "dlpack: buffer %p on %s has no host view to export", (void *)b,
                         b->dev->info.name);
  p->type = UM_DL_CPU;
  p->id = 0;
  p->data = (char *)b->mem.host + offset;
  return UM_OK;
}

static int place_cuda(um_buffer *b, size_t offset, dl_place *p) {
  um_device_native dn;
  um_buffer_native bn;
  int st;
  if ((st = um_device_native_get(b->dev, &dn)) != UM_OK || (st = um_buffer_native_get(b, &bn)) != UM_OK)
    return st;
  if (dn.cu_device < 0 || (b->loc != UM_PINNED && bn.cu_ptr == 0))
    return um__set_error(UM_ENOTSUP, "dlpack: the CUDA backend gives no native handles for %s",
                         b->dev->info.name);
  p->id = dn.cu_device;
  if (b->loc == UM_PINNED) {
    p->type = UM_DL_CUDA_HOST;
    p->data = (char *)b->mem.host + offset;
    return UM_OK;
  }
  p->type = b->loc == UM_UNIFIED ? UM_DL_CUDA_MANAGED : UM_DL_CUDA;
  p->data = (void *)(uintptr_t)(bn.cu_ptr + bn.offset + offset);
  return UM_OK;
}

static int place_opencl(um_buffer *b, size_t offset, dl_place *p) {
  um_buffer_native bn;
  int st;
  if (b->loc != UM_DEVICE) /* PINNED (mapped for life), UNIFIED (fine-grained SVM) */
    return place_host(b, offset, p);
  if ((st = um_buffer_native_get(b, &bn)) != UM_OK)
    return st;
  if (bn.cl_mem == NULL)
    return um__set_error(UM_ENOTSUP, "dlpack: %s gives no cl_mem for buffer %p", b->dev->info.name, (void *)b);
  p->type = UM_DL_OPENCL;
  p->id = ordinal_in_backend(b->dev);
  p->data = bn.cl_mem;
  p->byte_offset = (uint64_t)bn.offset + offset;
  return UM_OK;
}

/* b is live. HOST blocks are device 0's memory on every device. */
static int place_of(um_buffer *b, size_t offset, dl_place *p) {
  memset(p, 0, sizeof(*p));
  if (b->loc == UM_HOST || is_backend(b->dev, "cpu"))
    return place_host(b, offset, p);
  if (is_backend(b->dev, "cuda"))
    return place_cuda(b, offset, p);
  if (is_backend(b->dev, "opencl"))
    return place_opencl(b, offset, p);
  return place_host(b, offset, p);
}

int um_dlpack_device(um_buffer *b, int32_t *device_type, int32_t *device_id) {
  dl_place p;
  int st = um__buffer_check_live(b);
  if (st != UM_OK)
    return st;
  if (device_type == NULL || device_id == NULL)
    return um__set_error(UM_EINVAL, "um_dlpack_device: NULL argument");
  if (um__process_changed(b->m))
    return um__manager_check_process(b->m);
  if ((st = place_of(b, 0, &p)) != UM_OK)
    return st;
  *device_type = p.type;
  *device_id = p.id;
  return UM_OK;
}

/* ------------------------------------------------------------------------ */
/* Export */

typedef struct export_block {
  union { /* first: the tensor the consumer holds is the block itself */
    um_dl_managed_tensor legacy;
    um_dl_managed_tensor_versioned versioned;
  } t;
  um_buffer *b;
  int64_t dims[]; /* shape[ndim], then strides[ndim] when given */
} export_block;

static void export_delete(export_block *x) {
  um_buffer *b = x->b;
  atomic_fetch_sub_explicit(&b->dlpack_tensors, 1, memory_order_relaxed);
  free(x);
  um_release(b);
}

static void delete_legacy(um_dl_managed_tensor *self) { export_delete(self->manager_ctx); }

static void delete_versioned(um_dl_managed_tensor_versioned *self) { export_delete(self->manager_ctx); }

static int check_export_args(int ndim, const int64_t *shape, const int64_t *strides, uint8_t bits,
                             uint16_t lanes, unsigned flags, void **out) {
  const unsigned known = UM_DLPACK_VERSIONED | UM_DLPACK_READONLY | UM_DLPACK_COPIED;
  if (out == NULL || (ndim > 0 && shape == NULL))
    return um__set_error(UM_EINVAL, "um_dlpack_export: NULL %s", out == NULL ? "out" : "shape");
  if (flags & ~known)
    return um__set_error(UM_EINVAL, "um_dlpack_export: unknown flags 0x%x", flags);
  if ((flags & (UM_DLPACK_READONLY | UM_DLPACK_COPIED)) && !(flags & UM_DLPACK_VERSIONED))
    return um__set_error(UM_EINVAL, "um_dlpack_export: a legacy tensor carries no flags (add UM_DLPACK_VERSIONED)");
  if (ndim < 0 || ndim > MAX_EXPORT_NDIM)
    return um__set_error(UM_EINVAL, "um_dlpack_export: ndim %d is not in 0..%d", ndim, MAX_EXPORT_NDIM);
  if (bits == 0 || lanes == 0 || ((unsigned)bits * lanes) % 8 != 0)
    return um__set_error(UM_EINVAL, "um_dlpack_export: elements of %u x %u bits are not whole bytes", bits, lanes);
  for (int i = 0; i < ndim; i++)
    if (shape[i] < 0 || (strides != NULL && strides[i] < 0))
      return um__set_error(UM_EINVAL, "um_dlpack_export: dimension %d has a negative %s", i,
                           shape[i] < 0 ? "size" : "stride");
  return UM_OK;
}

/* Bytes from the first element to the end of the last one. */
static int export_extent(int ndim, const int64_t *shape, const int64_t *strides, uint64_t elem, uint64_t *extent) {
  uint64_t last = 0, count = 1; /* last: element index of the last element */
  for (int i = ndim - 1; i >= 0; i--) {
    uint64_t dim = (uint64_t)shape[i], stride = strides != NULL ? (uint64_t)strides[i] : count, step;
    if (dim == 0) {
      *extent = 0;
      return UM_OK;
    }
    if (__builtin_mul_overflow(dim - 1, stride, &step) || __builtin_add_overflow(last, step, &last) ||
        __builtin_mul_overflow(count, dim, &count))
      return um__set_error(UM_EOVERFLOW, "um_dlpack_export: the tensor's extent overflows");
  }
  if (__builtin_add_overflow(last, 1, &last) || __builtin_mul_overflow(last, elem, extent))
    return um__set_error(UM_EOVERFLOW, "um_dlpack_export: the tensor's extent overflows");
  return UM_OK;
}

/* b may be exported now: not mapped, no bracket open on it or before its
 * operations (the wait for them would wait for the bracket), readable as
 * the kind asked. */
static int check_export_state(um_buffer *b, unsigned flags) {
  int st = UM_OK;
  if (b->readonly && !(flags & UM_DLPACK_VERSIONED))
    return um__set_error(UM_ESTATE, "um_dlpack_export: buffer %p is read-only; a legacy tensor cannot say so "
                         "(export it with UM_DLPACK_VERSIONED)", (void *)b);
  pthread_mutex_lock(&b->lock);
  if (b->mapped)
    st = um__set_error(UM_ESTATE, "um_dlpack_export: buffer %p is mapped", (void *)b);
  else if (um__buffer_waits_bracket_locked(b, false))
    st = um__op_bracket_error(b);
  pthread_mutex_unlock(&b->lock);
  return st;
}

static void fill_tensor(export_block *x, const dl_place *p, int ndim, const int64_t *shape,
                        const int64_t *strides, um_dl_dtype dtype, unsigned flags) {
  um_dl_tensor *t = flags & UM_DLPACK_VERSIONED ? &x->t.versioned.dl_tensor : &x->t.legacy.dl_tensor;
  t->data = p->data;
  t->device.device_type = p->type;
  t->device.device_id = p->id;
  t->ndim = ndim;
  t->dtype = dtype;
  t->shape = ndim > 0 ? memcpy(x->dims, shape, (size_t)ndim * sizeof(int64_t)) : NULL;
  t->strides = strides != NULL && ndim > 0 ? memcpy(x->dims + ndim, strides, (size_t)ndim * sizeof(int64_t)) : NULL;
  t->byte_offset = p->byte_offset;
  if (flags & UM_DLPACK_VERSIONED) {
    x->t.versioned.version.major = UM_DL_MAJOR_VERSION;
    x->t.versioned.version.minor = UM_DL_MINOR_VERSION;
    x->t.versioned.manager_ctx = x;
    x->t.versioned.deleter = delete_versioned;
    x->t.versioned.flags = ((flags & UM_DLPACK_READONLY) || x->b->readonly ? UM_DL_FLAG_READ_ONLY : 0) |
                           (flags & UM_DLPACK_COPIED ? UM_DL_FLAG_IS_COPIED : 0);
  } else {
    x->t.legacy.manager_ctx = x;
    x->t.legacy.deleter = delete_legacy;
  }
}

int um_dlpack_export(um_buffer *b, size_t offset, int ndim, const int64_t *shape, const int64_t *strides,
                     uint8_t dtype_code, uint8_t dtype_bits, uint16_t dtype_lanes, unsigned flags, void **out) {
  um_dl_dtype dtype = {dtype_code, dtype_bits, dtype_lanes};
  uint64_t extent = 0;
  export_block *x;
  dl_place p;
  int st = um__buffer_check_live(b);
  if (st != UM_OK || (st = check_export_args(ndim, shape, strides, dtype_bits, dtype_lanes, flags, out)) != UM_OK)
    return st;
  if (um__process_changed(b->m))
    return um__manager_check_process(b->m);
  if ((st = export_extent(ndim, shape, strides, (uint64_t)dtype_bits * dtype_lanes / 8, &extent)) != UM_OK)
    return st;
  if (offset > b->size || extent > b->size - offset)
    return um__set_error(UM_ERANGE, "um_dlpack_export: %llu bytes at offset %zu are past the end of the %zu-byte "
                         "buffer", (unsigned long long)extent, offset, b->size);
  if ((st = check_export_state(b, flags)) != UM_OK || (st = place_of(b, offset, &p)) != UM_OK)
    return st;
  if ((x = calloc(1, sizeof(*x) + 2 * (size_t)ndim * sizeof(int64_t))) == NULL)
    return um__set_error(UM_ENOMEM, "um_dlpack_export: out of memory for a tensor");
  if ((st = um_buffer_retain(b)) != UM_OK) {
    free(x);
    return st;
  }
  atomic_fetch_add_explicit(&b->dlpack_tensors, 1, memory_order_relaxed);
  x->b = b;
  fill_tensor(x, &p, ndim, shape, strides, dtype, flags);
  um__buffer_wait_idle(b); /* the consumer reads what was issued before */
  *out = x;
  return UM_OK;
}

/* ------------------------------------------------------------------------ */
/* Import */

typedef struct import_record {
  void *tensor;
  bool versioned;
  um_device *dev;
  um__mem mem; /* what foreign_wrap made, for foreign_release */
  bool wrapped_by_backend;
} import_record;

/* The buffer's memory went back: the backend's part, then the producer's. */
static void import_return(void *ctx) {
  import_record *r = ctx;
  if (r->wrapped_by_backend)
    um__dev_foreign_release(r->dev, &r->mem);
  if (r->versioned) {
    um_dl_managed_tensor_versioned *t = r->tensor;
    if (t->deleter != NULL)
      t->deleter(t);
  } else {
    um_dl_managed_tensor *t = r->tensor;
    if (t->deleter != NULL)
      t->deleter(t);
  }
  free(r);
}

/* The tensor's size in bytes: C-contiguous, at least one element (the
 * stride of a dimension of size 1 says nothing and is not checked). */
static int import_bytes(const um_dl_tensor *t, size_t *bytes) {
  uint64_t count = 1, total, elem_bits = (uint64_t)t->dtype.bits * t->dtype.lanes;
  if (t->ndim < 0 || (t->ndim > 0 && t->shape == NULL))
    return um__set_error(UM_EINVAL, "um_dlpack_import: ndim %d with %s shape", t->ndim, t->shape ? "a" : "no");
  if (elem_bits == 0)
    return um__set_error(UM_EINVAL, "um_dlpack_import: elements of zero bits");
  if (elem_bits % 8 != 0)
    return um__set_error(UM_ENOTSUP, "um_dlpack_import: elements of %llu bits are not whole bytes",
                         (unsigned long long)elem_bits);
  for (int i = t->ndim - 1; i >= 0; i--) {
    if (t->shape[i] < 0)
      return um__set_error(UM_EINVAL, "um_dlpack_import: dimension %d is negative", i);
    if (t->shape[i] == 0)
      return um__set_error(UM_EINVAL, "um_dlpack_import: the tensor has no elements");
    if (t->strides != NULL && t->shape[i] != 1 && (uint64_t)t->strides[i] != count)
      return um__set_error(UM_ENOTSUP, "um_dlpack_import: dimension %d has stride %lld, not %llu: the tensor is "
                           "not C-contiguous", i, (long long)t->strides[i], (unsigned long long)count);
    if (__builtin_mul_overflow(count, (uint64_t)t->shape[i], &count))
      return um__set_error(UM_EOVERFLOW, "um_dlpack_import: the element count overflows");
  }
  /* um_alloc's bound: no memory comes near 2^62 bytes. */
  if (__builtin_mul_overflow(count, elem_bits / 8, &total) || total > ((uint64_t)1 << 62) || total > SIZE_MAX)
    return um__set_error(UM_EOVERFLOW, "um_dlpack_import: the size overflows (or exceeds 2^62 bytes)");
  *bytes = (size_t)total;
  return UM_OK;
}

/* m's device of the given backend and DLPack ordinal, or NULL. */
static um_device *device_by_ordinal(um_manager *m, const char *backend, int32_t id) {
  for (int i = 0; i < um__ndevices(m); i++) {
    um_device *d = m->devices[i];
    um_device_native dn;
    if (!is_backend(d, backend))
      continue;
    if (strcmp(backend, "cuda") != 0) {
      if (ordinal_in_backend(d) == id)
        return d;
    } else if (um_device_native_get(d, &dn) == UM_OK && dn.cu_device >= 0 && dn.cu_device == id) {
      return d;
    }
  }
  return NULL;
}

/* The device and location the tensor's memory belongs to. */
static int import_target(um_manager *m, const um_dl_device *dev, um_device **d, um_location *loc) {
  const char *backend;
  switch (dev->device_type) {
  case UM_DL_CPU:
  case UM_DL_CUDA_HOST: /* page-locked host memory: host memory */
    *d = m->devices[0];
    *loc = UM_HOST;
    return UM_OK;
  case UM_DL_CUDA: *loc = UM_DEVICE, backend = "cuda"; break;
  case UM_DL_CUDA_MANAGED: *loc = UM_UNIFIED, backend = "cuda"; break;
  case UM_DL_OPENCL: *loc = UM_DEVICE, backend = "opencl"; break;
  default:
    return um__set_error(UM_ENOTSUP, "um_dlpack_import: DLPack device type %d is not one unimem serves",
                         (int)dev->device_type);
  }
  if ((*d = device_by_ordinal(m, backend, dev->device_id)) == NULL)
    return um__set_error(UM_ENODEV, "um_dlpack_import: the manager has no %s device %d", backend,
                         (int)dev->device_id);
  return UM_OK;
}

/* The memory as d's backend knows it. */
static int import_mem(import_record *r, um_location loc, const um_dl_tensor *t, size_t bytes) {
  um_device *d = r->dev;
  uintptr_t at;
  memset(&r->mem, 0, sizeof(r->mem));
  if (is_backend(d, "opencl")) {
    int st = um__dev_foreign_wrap(d, loc, (uintptr_t)t->data, t->byte_offset, bytes, &r->mem);
    r->wrapped_by_backend = st == UM_OK;
    return st;
  }
  if (__builtin_add_overflow((uintptr_t)t->data, t->byte_offset, &at) || at > UINTPTR_MAX - bytes)
    return um__set_error(UM_EOVERFLOW, "um_dlpack_import: data + byte_offset + size overflows");
  r->mem.handle = at;
  if (loc != UM_DEVICE) /* host memory, or CUDA managed memory */
    r->mem.host = (void *)at;
  return UM_OK;
}

/* The tensor of either kind: its DLTensor, its read-only flag. */
static int import_view(void *tensor, unsigned flags, um_dl_tensor **t, bool *readonly) {
  if (flags & ~(unsigned)(UM_DLPACK_VERSIONED | UM_DLPACK_READONLY))
    return um__set_error(UM_EINVAL, "um_dlpack_import: unknown flags 0x%x", flags);
  *readonly = (flags & UM_DLPACK_READONLY) != 0;
  if (flags & UM_DLPACK_VERSIONED) {
    um_dl_managed_tensor_versioned *v = tensor;
    if (v->version.major != UM_DL_MAJOR_VERSION)
      return um__set_error(UM_ENOTSUP, "um_dlpack_import: DLPack version %u.%u (unimem reads %d.x)",
                           v->version.major, v->version.minor, UM_DL_MAJOR_VERSION);
    *readonly = *readonly || (v->flags & UM_DL_FLAG_READ_ONLY);
    *t = &v->dl_tensor;
  } else {
    *t = &((um_dl_managed_tensor *)tensor)->dl_tensor;
  }
  if ((*t)->data == NULL)
    return um__set_error(UM_EINVAL, "um_dlpack_import: the tensor's data is NULL");
  return UM_OK;
}

int um_dlpack_import(um_manager *m, void *tensor, unsigned flags, um_buffer **out) {
  import_record *r;
  um_location loc = UM_HOST;
  um_dl_tensor *t = NULL;
  bool readonly = false;
  size_t bytes = 0;
  int st;
  if (!um__manager_ok(m) || tensor == NULL || out == NULL)
    return um__set_error(UM_EINVAL, "um_dlpack_import: NULL argument or not a manager");
  if (um__process_changed(m))
    return um__manager_check_process(m);
  if ((r = calloc(1, sizeof(*r))) == NULL)
    return um__set_error(UM_ENOMEM, "um_dlpack_import: out of memory");
  r->tensor = tensor;
  r->versioned = (flags & UM_DLPACK_VERSIONED) != 0;
  if ((st = import_view(tensor, flags, &t, &readonly)) != UM_OK || (st = import_bytes(t, &bytes)) != UM_OK ||
      (st = import_target(m, &t->device, &r->dev, &loc)) != UM_OK || (st = import_mem(r, loc, t, bytes)) != UM_OK)
    goto fail;
  if ((st = um__wrap_foreign(m, r->dev, loc, &r->mem, bytes, import_return, r, out)) != UM_OK)
    goto fail;
  (*out)->readonly = readonly;
  return UM_OK;

fail:
  if (r->wrapped_by_backend)
    um__dev_foreign_release(r->dev, &r->mem);
  free(r);
  return st;
}
