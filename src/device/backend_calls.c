/* The backend's calls for the layers above (device.h): where an optional
 * entry of the table is missing, the answer is decided here, once. */
#include "device.h"

int um__dev_no_async(const um_device *d) {
  return um__set_error(UM_ENOTSUP, "device %d (%s) cannot queue transfers", d->index, d->info.name);
}

static int no_interop(const um_device *d, const char *what) {
  return um__set_error(UM_ENOTSUP, "%s: device %d (%s) has no native events", what, d->index, d->info.name);
}

int um__dev_token_reap(um_device *d, void *token) {
  bool was;
  int done;
  if (d->be->token_reap == NULL)
    return um__dev_token_query(d, token);
  /* The report it may make runs here: mark the thread as completing inline. */
  was = um__thread_completes_inline_set(true);
  done = d->be->token_reap(d->bdev, token);
  um__thread_completes_inline_set(was);
  return done;
}

void *um__dev_token_native(um_device *d, void *token) {
  return d->be->token_native != NULL ? d->be->token_native(d->bdev, token) : NULL;
}

bool um__dev_has_interop(const um_device *d) {
  const um__backend *be = d->be;
  return be->xfer_async != NULL && be->token_native != NULL && be->token_adopt != NULL && be->gate_new != NULL &&
         be->gate_open != NULL && be->caller_marker != NULL;
}

int um__dev_token_adopt(um_device *d, void *native, void **token) {
  if (d->be->token_adopt == NULL)
    return no_interop(d, "adopting an event");
  return d->be->token_adopt(d->bdev, native, token);
}

int um__dev_gate_new(um_device *d, void **token) {
  if (d->be->gate_new == NULL)
    return no_interop(d, "a gate");
  return d->be->gate_new(d->bdev, token);
}

void um__dev_gate_open(um_device *d, void *token, int status) {
  if (d->be->gate_open != NULL)
    d->be->gate_open(d->bdev, token, status);
}

int um__dev_caller_marker(um_device *d, void **token) {
  if (d->be->caller_marker == NULL)
    return no_interop(d, "a marker of the caller's queue");
  return d->be->caller_marker(d->bdev, token);
}

int um__dev_queue_adopt(um_device *d, void *native, int *q) {
  if (d->be->queue_adopt == NULL)
    return um__set_error(UM_ENOTSUP, "device %d (%s) runs no work on queues of the caller's", d->index,
                         d->info.name);
  return d->be->queue_adopt(d->bdev, native, q);
}

void um__dev_device_native(um_device *d, um_device_native *out) {
  if (d->be->device_native != NULL)
    d->be->device_native(d->bdev, out);
}

void um__dev_mem_native(um_device *d, const um__mem *mem, um_location loc, um_buffer_native *out) {
  if (d->be->mem_native != NULL)
    d->be->mem_native(d->bdev, mem, loc, out);
}

int um__dev_mem_alloc(um_device *d, um_location loc, size_t bytes, um__mem *out) {
  return d->be->mem_alloc(d->bdev, loc, bytes, out);
}

void um__dev_mem_free(um_device *d, um_location loc, size_t bytes, um__mem *mem) {
  d->be->mem_free(d->bdev, loc, bytes, mem);
}

int um__dev_mem_carve(um_device *d, um_location loc, const um__mem *seg, size_t off, size_t bytes, um__mem *out) {
  return d->be->mem_carve(d->bdev, loc, seg, off, bytes, out);
}

void um__dev_mem_uncarve(um_device *d, um_location loc, um__mem *mem) { d->be->mem_uncarve(d->bdev, loc, mem); }

void um__dev_mem_discard(um_device *d, um_location loc, const um__mem *seg, size_t off, size_t len) {
  d->be->mem_discard(d->bdev, loc, seg, off, len);
}

bool um__dev_can_register(const um_device *d) { return d->be->host_register != NULL; }

int um__dev_host_register(um_device *d, void *host, size_t bytes, um__mem *out) {
  if (d->be->host_register == NULL)
    return um__set_error(UM_ENOTSUP, "pinning is not available on device %d (%s)", d->index, d->info.name);
  return d->be->host_register(d->bdev, host, bytes, out);
}

void um__dev_host_unregister(um_device *d, um__mem *mem) {
  if (d->be->host_unregister != NULL)
    d->be->host_unregister(d->bdev, mem);
}

int um__dev_memory(um_device *d, uint64_t *free_bytes, uint64_t *total_bytes) {
  return d->be->memory(d->bdev, free_bytes, total_bytes);
}

int um__dev_synchronize(um_device *d) { return d->be->synchronize(d->bdev); }

bool um__dev_has_map(const um_device *d) { return d->be->map != NULL; }

int um__dev_map(um_device *d, um__mem *mem, um_location loc, size_t off, size_t len, um_map_mode mode,
                void **host) {
  if (d->be->map == NULL)
    return um__set_error(UM_ENOTSUP, "device %d (%s) cannot map its memory", d->index, d->info.name);
  return d->be->map(d->bdev, mem, loc, off, len, mode, host);
}

int um__dev_unmap(um_device *d, um__mem *mem, um_location loc, void *host) {
  if (d->be->unmap == NULL)
    return um__set_error(UM_ENOTSUP, "device %d (%s) cannot map its memory", d->index, d->info.name);
  return d->be->unmap(d->bdev, mem, loc, host);
}

int um__dev_peer_possible(const um_device *a, const um_device *b) {
  if (a->be != b->be || a->be->peer_possible == NULL)
    return 0;
  return a->be->peer_possible(a->bdev, b->bdev) ? 1 : 0;
}

int um__dev_peer_enable(um_device *a, um_device *b) {
  if (a->be != b->be || a->be->peer_enable == NULL)
    return um__set_error(UM_ENOTSUP, "device %d (%s) has no peer access", a->index, a->info.name);
  return a->be->peer_enable(a->bdev, b->bdev);
}

int um__dev_foreign_wrap(um_device *d, um_location loc, uintptr_t handle, uint64_t offset, size_t bytes,
                         um__mem *out) {
  if (d->be->foreign_wrap == NULL)
    return um__set_error(UM_ENOTSUP, "device %d (%s) cannot wrap native memory", d->index, d->info.name);
  return d->be->foreign_wrap(d->bdev, loc, handle, offset, bytes, out);
}

void um__dev_foreign_release(um_device *d, um__mem *mem) {
  if (d->be->foreign_release != NULL)
    d->be->foreign_release(d->bdev, mem);
}

/* ------------------------------------------------------------------------ */
/* A backend as a whole */

int um__backend_open(const um__backend *be, const um_options *opts, void **ctx, int *count) {
  return be->open(opts, ctx, count);
}

int um__backend_describe(const um__backend *be, void *ctx, int i, um__bdev_desc *out) {
  return be->describe(ctx, i, out);
}

int um__backend_adopt(const um__backend *be, const um_options *opts, void **ctx, void *context, void *device,
                      void *queue, um__bdev_desc *out) {
  if (be->adopt == NULL)
    return um__set_error(UM_ENOTSUP, "backend %s cannot adopt the caller's device", be->name);
  return be->adopt(opts, ctx, context, device, queue, out);
}

void um__backend_close(const um__backend *be, void *ctx) { be->close(ctx); }

/* ------------------------------------------------------------------------ */
/* The backends this build knows */

/* In device order: the cpu first (always opened), then the others. Adding
 * one (Metal, Level Zero) is one line here and a folder in backend/. */
const um__backend *const um__backends_builtin[] = {
    &um__backend_cpu,
#ifdef UNIMEM_HAVE_OPENCL
    &um__backend_opencl,
#endif
#ifdef UNIMEM_HAVE_CUDA
    &um__backend_cuda,
#endif
    NULL};

#ifdef UNIMEM_HAVE_OPENCL
const um__backend *const um__backend_adopts_opencl = &um__backend_opencl;
#else
const um__backend *const um__backend_adopts_opencl = NULL;
#endif
