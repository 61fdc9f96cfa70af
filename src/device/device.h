/* device/: the device object, its statistics counters, peers, and the
 * check that a manager belongs to this process. */
#ifndef UNIMEM_DEVICE_H
#define UNIMEM_DEVICE_H

#ifndef UM__SEES_DEVICE
#error "device.h: this folder may not include device/ (src/README.md)"
#endif

#include "types.h"

#define UM__STAT_ADD(dev, field, v) um__atomic_add_relaxed(&(dev)->stats.field, (uint64_t)(v))
#define UM__STAT_SUB(dev, field, v) um__atomic_sub_relaxed(&(dev)->stats.field, (uint64_t)(v))

/* device.c: UM_ESTATE, with the reason, for a manager made in another
 * process (before fork()); um__process_changed is its one load and
 * compare, on every entry point. */
int um__manager_check_process(const um_manager *m);
/* Whether the device's DEVICE and UNIFIED bytes count against
 * device_limit_bytes (an OpenCL or CUDA device: block.c counts them in
 * limited_bytes). */
bool um__device_limited(const um_device *d);
/* The bytes of DEVICE and UNIFIED blocks d may hold: device_limit_bytes,
 * and at most the device's total_bytes on a backend that commits memory
 * lazily (um__backend.commits_lazily); 0: no limit. */
uint64_t um__device_limit_bytes(const um_device *d);
static inline bool um__process_changed(const um_manager *m) {
  return __builtin_expect(m->fork_gen != um__atomic_load_relaxed(&um__fork_generation), 0);
}

/* ------------------------------------------------------------------------ */
/* The backend's calls (backend_calls.c). The layers above reach a device's
 * backend only through these: each decides once what an optional entry's
 * absence means, so that no caller tests the table. The ones on a copy's
 * path (a transfer, its token's release and query) are inline: one
 * indirect call, as if the caller made it itself. */

/* The backend's name ("cpu", "opencl", "cuda"). */
static inline const char *um__dev_backend_name(const um_device *d) { return d->be->name; }
/* Whether a and b are devices of one backend. */
static inline bool um__dev_same_backend(const um_device *a, const um_device *b) { return a->be == b->be; }
/* Whether the driver's completion callbacks may call the backend again. */
static inline bool um__dev_callbacks_reenter(const um_device *d) { return d->be->callbacks_reenter != 0; }
/* Whether every transfer of d runs on one in-order queue. */
static inline bool um__dev_single_queue(const um_device *d) { return d->be->single_queue != 0; }
/* The in-order queue a transfer of kind goes to: 0 on a single queue, -1 for none. */
static inline int um__dev_queue_of(const um_device *d, um__xfer_kind kind) {
  if (d->be->single_queue)
    return 0;
  return d->be->queue_of != NULL ? d->be->queue_of(kind) : -1;
}

/* Run a transfer and return when it has finished. */
static inline int um__dev_xfer(um_device *d, const um__xfer *x) { return d->be->xfer(d->bdev, x); }
/* Whether d queues transfers (xfer_async); without it the core runs xfer on its threads. */
static inline bool um__dev_has_async(const um_device *d) { return d->be->xfer_async != NULL; }
/* UM_ENOTSUP, with the reason, for a transfer queued on a device that cannot. */
int um__dev_no_async(const um_device *d);
/* Queue a transfer behind after[] (backend.h, xfer_async); UM_ENOTSUP without it. */
static inline int um__dev_xfer_async(um_device *d, const um__xfer *x, void *const *after, int nafter,
                                     um__done_fn done, void *arg, void **native) {
  if (__builtin_expect(d->be->xfer_async == NULL, 0))
    return um__dev_no_async(d);
  return d->be->xfer_async(d->bdev, x, after, nafter, done, arg, native);
}
/* Release a token of d (nothing to do on a backend that keeps none). */
static inline void um__dev_native_release(um_device *d, void *native) {
  if (d->be->native_release != NULL)
    d->be->native_release(d->bdev, native);
}
/* Whether a's transfers may wait for tokens of b (b == a, or tokens_shared). */
static inline bool um__dev_tokens_shared(const um_device *a, const um_device *b) {
  return b == a || (b != NULL && a->be == b->be && a->be->tokens_shared != NULL &&
                    a->be->tokens_shared(a->bdev, b->bdev) == 1);
}
/* Whether d can tell if a token's work has ended (token_query). */
static inline bool um__dev_can_query(const um_device *d) { return d->be->token_query != NULL; }
/* 1 when the token's work has ended on the device; 0 not yet or not known. Never blocks. */
static inline int um__dev_token_query(um_device *d, void *token) {
  return d->be->token_query != NULL ? d->be->token_query(d->bdev, token) : 0;
}
/* token_query's answer, reporting an ended token on this thread where the
 * backend can (token_reap, run marked as completing inline). */
int um__dev_token_reap(um_device *d, void *token);
/* Whether d's tokens have a caller's view (token_native). */
static inline bool um__dev_has_native_events(const um_device *d) { return d->be->token_native != NULL; }
/* The caller's view (cl_event, CUevent) of a token of d; NULL without one. */
void *um__dev_token_native(um_device *d, void *token);
/* Whether d orders device work with the caller's (tokens, gates, adopted events, markers). */
bool um__dev_has_interop(const um_device *d);
/* A token over the caller's event (token_adopt); UM_ENOTSUP without interop. */
int um__dev_token_adopt(um_device *d, void *native, void **token);
/* A gate token (gate_new); UM_ENOTSUP without interop. */
int um__dev_gate_new(um_device *d, void **token);
/* Open a gate from um__dev_gate_new. */
void um__dev_gate_open(um_device *d, void *token, int status);
/* A token behind the caller's queue so far (caller_marker); UM_ENOTSUP without interop. */
int um__dev_caller_marker(um_device *d, void **token);
/* A queue of the caller's as one of d's queues (queue_adopt); UM_ENOTSUP without it. */
int um__dev_queue_adopt(um_device *d, void *native, int *q);
/* Whether a queue mark of d may ride on the queue's next command (queue_kick). */
static inline bool um__dev_can_ride(const um_device *d) { return d->be->queue_kick != NULL; }
/* The riders on d's queues get a command that carries them (queue_kick); nothing without it. */
static inline void um__dev_kick_riders(um_device *d) {
  if (d->be->queue_kick != NULL)
    d->be->queue_kick(d->bdev);
}
/* A token behind everything queued on d's queue q (queue_mark_now); UM_ENOTSUP without it. */
static inline int um__dev_queue_mark_now(um_device *d, int q, void **token) {
  return d->be->queue_mark_now != NULL ? d->be->queue_mark_now(d->bdev, q, token) : UM_ENOTSUP;
}
/* Fill what the backend knows of d's native handles (nothing without device_native). */
void um__dev_device_native(um_device *d, um_device_native *out);
/* Fill what the backend knows of a block's native handles (nothing without mem_native). */
void um__dev_mem_native(um_device *d, const um__mem *mem, um_location loc, um_buffer_native *out);

/* Allocate a block of d at loc. */
int um__dev_mem_alloc(um_device *d, um_location loc, size_t bytes, um__mem *out);
/* Free a block from um__dev_mem_alloc. */
void um__dev_mem_free(um_device *d, um_location loc, size_t bytes, um__mem *mem);
/* Whether d's backend carves blocks out of its blocks at loc (mem_carve),
 * at multiples of d->carve_align; carve and give back one such block. */
static inline bool um__dev_can_carve(const um_device *d, um_location loc) {
  return d->be->mem_carve != NULL && d->be->mem_uncarve != NULL && (d->carve_locations & (1u << loc)) != 0;
}
int um__dev_mem_carve(um_device *d, um_location loc, const um__mem *seg, size_t off, size_t bytes, um__mem *out);
/* Whether d gives back the memory inside its segments at loc (mem_discard). */
static inline bool um__dev_can_discard(const um_device *d, um_location loc) {
  return d->be->mem_discard != NULL && (d->discard_locations & (1u << loc)) != 0;
}
void um__dev_mem_discard(um_device *d, um_location loc, const um__mem *seg, size_t off, size_t len);
void um__dev_mem_uncarve(um_device *d, um_location loc, um__mem *mem);
/* Whether d can page-lock caller memory (host_register). */
bool um__dev_can_register(const um_device *d);
/* Page-lock caller memory for d's DMA; UM_ENOTSUP where d cannot. */
int um__dev_host_register(um_device *d, void *host, size_t bytes, um__mem *out);
/* Undo um__dev_host_register. */
void um__dev_host_unregister(um_device *d, um__mem *mem);
/* Free and total memory of d now. */
int um__dev_memory(um_device *d, uint64_t *free_bytes, uint64_t *total_bytes);
/* Wait for all work the backend queued on d. */
int um__dev_synchronize(um_device *d);

/* The backends this build knows, the cpu first, NULL-terminated; the one
 * that adopts a caller's OpenCL context (NULL: built without OpenCL). */
extern const um__backend *const um__backends_builtin[];
extern const um__backend *const um__backend_adopts_opencl;
/* Whether d maps blocks that have no host view (map); without it the core keeps a shadow. */
bool um__dev_has_map(const um_device *d);
/* Map a range of a block; UM_ENOTSUP without map. */
int um__dev_map(um_device *d, um__mem *mem, um_location loc, size_t off, size_t len, um_map_mode mode,
                void **host);
/* Undo um__dev_map; UM_ENOTSUP without map. */
int um__dev_unmap(um_device *d, um__mem *mem, um_location loc, void *host);
/* Whether a can reach b's memory directly: 0 across backends or without peer access. */
int um__dev_peer_possible(const um_device *a, const um_device *b);
/* Enable a's access to b's memory; UM_ENOTSUP without peer access. */
int um__dev_peer_enable(um_device *a, um_device *b);
/* A block over the caller's native memory (foreign_wrap); UM_ENOTSUP where d cannot wrap one. */
int um__dev_foreign_wrap(um_device *d, um_location loc, uintptr_t handle, uint64_t offset, size_t bytes,
                         um__mem *out);
/* Give back what um__dev_foreign_wrap made. */
void um__dev_foreign_release(um_device *d, um__mem *mem);

/* A backend as a whole, for the manager (backend.h). Its name. */
static inline const char *um__backend_name(const um__backend *be) { return be->name; }
/* Load the vendor library and open every device for one manager. */
int um__backend_open(const um__backend *be, const um_options *opts, void **ctx, int *count);
/* Describe device i of an opened ctx. */
int um__backend_describe(const um__backend *be, void *ctx, int i, um__bdev_desc *out);
/* Adopt the caller's context, device and queue; UM_ENOTSUP for a backend that cannot. */
int um__backend_adopt(const um__backend *be, const um_options *opts, void **ctx, void *context, void *device,
                      void *queue, um__bdev_desc *out);
/* Close what um__backend_open or um__backend_adopt made. */
void um__backend_close(const um__backend *be, void *ctx);

#endif /* UNIMEM_DEVICE_H */
