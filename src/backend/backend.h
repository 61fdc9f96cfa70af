/* The backend contract.
 *
 * A backend turns one vendor API (the host itself, OpenCL, the CUDA driver,
 * a test-only fault injector) into devices the core can allocate on and
 * move data with. The core never includes a vendor header; every vendor
 * call lives behind this table. Adding a backend (Metal, Level Zero) is
 * adding one file that fills a um__backend and one line in the table of
 * manager.c.
 *
 * Threading: every operation below may be called from any thread, several at
 * once, on the same device. A backend serialises what its vendor API needs
 * serialised.
 *
 * Errors: an operation returns UM_OK or a negative UM_E* code. A backend
 * turns its vendor's codes into UM_E* in exactly one function and records
 * the vendor's own text with um__set_error() before returning, so that
 * um_last_error() shows it.
 */
#ifndef UNIMEM_BACKEND_H
#define UNIMEM_BACKEND_H

#ifndef UM__SEES_BACKEND
#error "backend.h: this folder may not include it (src/README.md)"
#endif

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base.h"
#include "unimem.h"

/* One block of memory given by a backend. The core keeps it in a buffer or
 * in the pool and hands it back verbatim to the operations below. */
typedef struct um__mem {
  void *host;       /* host-addressable view of the whole block, or NULL when
                       the memory can only be reached through transfers */
  uintptr_t handle; /* the backend's handle (cl_mem, CUdeviceptr, ...) */
  void *priv;       /* the backend's own bookkeeping, opaque to the core */
  void *carved;     /* the core's, never the backend's: the extent of a block
                       carved from a segment (mem/segment.c), NULL for a
                       block of its own from mem_alloc */
} um__mem;

/* What a transfer does. The device whose xfer is called is the one named in
 * the comment; offsets are bytes from the start of the block. */
typedef enum {
  UM__XFER_H2D,  /* host -> dst block (called on dst's device) */
  UM__XFER_D2H,  /* src block -> host (called on src's device) */
  UM__XFER_D2D,  /* src block -> dst block, same device (called on it) */
  UM__XFER_FILL, /* value -> dst block (called on dst's device) */
  UM__XFER_PEER, /* src block on src_bdev -> dst block (called on dst's
                    device; only after peer_enable(dst dev, src dev)) */
  UM__XFER_MARKER, /* nothing moves: done once the transfers of after[] and
                      the tokens of wait[] are (xfer_async only; backends
                      with interop, below) */
  UM__XFER_QUEUE_MARK /* nothing moves: done once everything queued on this
                         device's queue x->queue before it is (xfer_async
                         only; single_queue and queue_of backends, below) */
} um__xfer_kind;

typedef struct um__xfer {
  um__xfer_kind kind;
  um__mem *dst;          /* H2D, D2D, FILL, PEER */
  um_location dst_loc;
  size_t dst_off;
  um__mem *src;          /* D2H, D2D, PEER */
  um_location src_loc;
  size_t src_off;
  void *host;            /* H2D: source; D2H: destination */
  int host_pinned;       /* host lies in page-locked memory this device may
                            DMA from (a PINNED block of this device) */
  size_t bytes;          /* > 0; ranges are checked by the core */
  unsigned char value;   /* FILL */
  void *src_bdev;        /* PEER: the device owning src */
  void *wait[2];         /* MARKER: tokens of this device's backend (a gate,
                            an adopted caller's event), or NULL */
  int queue;             /* the queue it goes to: QUEUE_MARK's (queue_of; 0
                            on a single_queue backend); for every kind, a
                            queue of the caller's that queue_adopt gave;
                            any other value: the backend's own queue for
                            the kind */
  void *done_space;      /* xfer_async: NULL, or UM__DONE_SPACE bytes of the
                            caller's, aligned for pointers and untouched by
                            it until done has been called: the backend may
                            keep there what its completion needs instead of
                            allocating it (done may free the space: read
                            it before calling done) */
  int token_held;        /* xfer_async: 1 when the caller keeps *native
                            (does not native_release it) until done has
                            been called, so the backend may rely on the
                            token's reference until then instead of taking
                            one of its own */
  int ride;              /* QUEUE_MARK on a queue of the caller's with no
                            wait[] and no after[], on a backend with
                            queue_kick: it may enqueue nothing and give no
                            token (*native NULL); done comes once a later
                            command of that queue has completed, or a
                            queue_kick's */
} um__xfer;

#define UM__DONE_SPACE 64

/* UM_HOST blocks never reach a backend except the cpu's: the core serves
 * UM_HOST on every device with device 0's memory (ordinary pageable host
 * memory, accounted to the device it was asked of). */

/* Completion of an asynchronous transfer: called exactly once, from any
 * thread (a driver thread included), possibly before xfer_async returns.
 * The core's callback only records the outcome and hands follow-up work to
 * its own threads: it makes no backend call, unless the backend says its
 * callbacks may (um__backend.callbacks_reenter). */
typedef void (*um__done_fn)(void *arg, int status);

/* Description of one device, filled by describe(). */
typedef struct um__bdev_desc {
  char name[128];
  unsigned caps;         /* UM_CAP_* */
  unsigned locations;    /* 1u << loc for each location it can allocate */
  uint64_t total_bytes;
  void *bdev;            /* the backend's device state, passed back below */
  int host_memory;       /* 1: the device's memory is host memory (an OpenCL
                            CPU device, an integrated GPU), so it moves
                            pageable host memory as fast as pinned, and
                            staging through pinned chunks only adds a copy */
  unsigned carve_locations; /* 1u << loc where mem_carve works (0: nowhere) */
  size_t carve_align;       /* a power of two: carved blocks start at
                               multiples of it from their segment's start */
  unsigned discard_locations; /* 1u << loc where mem_discard works */
} um__bdev_desc;

typedef struct um__backend {
  const char *name; /* "cpu", "opencl", "cuda": also the UNIMEM_BACKENDS key */

  /* Load the vendor library (once per process, pthread_once) and open every
   * device for one manager. *ctx receives the backend's per-manager state,
   * *count the number of devices (0 is a valid answer: "none here").
   * Returns UM_OK; UM_ENODEV when the vendor library or a needed entry point
   * is missing (with the reason in um_last_error(); the manager logs it and
   * goes on without this backend); other codes for real failures. */
  int (*open)(const um_options *opts, void **ctx, int *count);
  /* Describe device i (0 <= i < count) of an opened ctx. */
  int (*describe)(void *ctx, int i, um__bdev_desc *out);
  /* Close what open() made. Called once every block was freed and every
   * transfer finished. */
  void (*close)(void *ctx);

  /* Allocate bytes (> 0) at loc, which the device's locations include.
   * Fills *out. Returns UM_ENOMEM when the device is out of memory (the
   * core then trims its pool and retries), UM_ENOTSUP, UM_EBACKEND. */
  int (*mem_alloc)(void *bdev, um_location loc, size_t bytes, um__mem *out);
  /* Free a block from mem_alloc. Never fails from the caller's view. */
  void (*mem_free)(void *bdev, um_location loc, size_t bytes, um__mem *mem);
  /* Optional (NULL, or a location outside um__bdev_desc.carve_locations:
   * pooled blocks stay blocks of their own). A block over [off, off +
   * bytes) of seg, a block from mem_alloc at loc (a segment that the core
   * splits among blocks, mem/segment.c): a sub-buffer, or seg's pointers
   * moved by off. off is a multiple of carve_align. Fills *out as
   * mem_alloc does (host: seg's host view + off, or NULL). The core gives
   * every carved block back with mem_uncarve before it frees seg. */
  int (*mem_carve)(void *bdev, um_location loc, const um__mem *seg, size_t off, size_t bytes, um__mem *out);
  void (*mem_uncarve)(void *bdev, um_location loc, um__mem *mem);
  /* Optional (NULL, or a location outside discard_locations: segments stay
   * whole). Give the physical memory behind [off, off + len) of segment
   * seg back to the system, keeping the addresses: the range reads as
   * zeros, or as whatever the memory holds, once it is used again, and
   * costs nothing until then (host: madvise(MADV_DONTNEED)). off and len
   * are multiples of the page size, and seg's host view starts at a page. */
  void (*mem_discard)(void *bdev, um_location loc, const um__mem *seg, size_t off, size_t len);

  /* Optional (NULL: not offered). Register caller memory for UM_WRAP_PIN:
   * page-lock it and make it DMA-able. *out->host must be host. */
  int (*host_register)(void *bdev, void *host, size_t bytes, um__mem *out);
  void (*host_unregister)(void *bdev, um__mem *mem);

  /* Free and total memory of the device now. */
  int (*memory)(void *bdev, uint64_t *free_bytes, uint64_t *total_bytes);
  /* Wait for all work the backend has queued on the device. */
  int (*synchronize)(void *bdev);

  /* Run a transfer and return when it has finished. */
  int (*xfer)(void *bdev, const um__xfer *x);

  /* Optional (NULL: the core runs xfer() on its own threads).
   * Start a transfer without waiting for it. It runs after every transfer
   * in after[0..nafter) (tokens this device returned earlier, not yet
   * released). On UM_OK, *native receives a token for later after[] lists,
   * valid until native_release, and done(arg, status) will be called once
   * the transfer finishes. On failure, done is never called and *native is
   * untouched.
   * Quiet transfers (single_queue and queue_of backends only): done and
   * native both NULL: the transfer is queued with no token and no report;
   * the core follows it with a UM__XFER_QUEUE_MARK on its queue, whose
   * report covers it. */
  int (*xfer_async)(void *bdev, const um__xfer *x, void *const *after,
                    int nafter, um__done_fn done, void *arg, void **native);
  void (*native_release)(void *bdev, void *native);

  /* Optional (NULL: the core keeps a host shadow and moves data with xfer).
   * Map [off, off + len) of a block that has no host view; the pointer
   * returned is valid until unmap. mode follows um_map_mode: read modes
   * fetch the device's data. unmap after a writing mode makes the device
   * copy current. Both block until done. */
  int (*map)(void *bdev, um__mem *mem, um_location loc, size_t off, size_t len,
             um_map_mode mode, void **host);
  int (*unmap)(void *bdev, um__mem *mem, um_location loc, void *host);

  /* Optional (NULL: no peer access). Whether device a can access device b's
   * memory directly (1 or 0), and enable it (UM_OK, UM_ENOTSUP). Only asked
   * for two different devices of this backend in one manager. */
  int (*peer_possible)(void *a, void *b);
  int (*peer_enable)(void *a, void *b);

  /* Optional (NULL: a device's after[] lists hold its own tokens only).
   * Whether device a's xfer_async may wait for tokens of device b (another
   * device of this backend), so that an operation on a that follows one on
   * b starts on a's queue behind it, with no host thread in between: 1 or
   * 0. The token is still released through b (native_release). */
  int (*tokens_shared)(void *a, void *b);

  /* The caller's own device work (um_access_begin). All optional: a device without
   * them answers the interop calls with what the core can say itself.
   *
   * device_native, mem_native: the native handles of the device, and of a
   * block at loc (the core fills backend[] and, for blocks, host). */
  void (*device_native)(void *bdev, um_device_native *out);
  void (*mem_native)(void *bdev, const um__mem *mem, um_location loc, um_buffer_native *out);
  /* The caller's view (cl_event, CUevent) of a token of this device, valid
   * as long as the token. */
  void *(*token_native)(void *bdev, void *token);
  /* A token over the caller's native event, holding it until
   * native_release. UM_EINVAL when it is not an event this device can wait
   * for (another context). */
  int (*token_adopt)(void *bdev, void *native, void **token);
  /* A token that completes when gate_open is called, with two owners: the
   * opener's (dropped by gate_open) and the caller's (native_release). Lets
   * device work wait for work that runs on host threads. */
  int (*gate_new)(void *bdev, void **token);
  void (*gate_open)(void *bdev, void *token, int status);
  /* A token that completes after every command queued so far on the queue
   * device_native gives the caller (cl_queue, cu_stream). */
  int (*caller_marker)(void *bdev, void **token);
  /* Optional (NULL: transfers go to the backend's own queues only). An
   * in-order queue of the caller's on this device (a cl_command_queue of
   * its context and device, a CUstream of its context) as one more queue
   * that transfers go to (um__xfer.queue = *q, never one of queue_of's or
   * 0), retained until close; the same native queue gives the same q.
   * UM_EINVAL (not such a queue), UM_ENOTSUP (an out-of-order queue),
   * UM_ENOMEM (the device takes no more). */
  int (*queue_adopt)(void *bdev, void *native, int *q);
  /* Optional (NULL: a QUEUE_MARK always enqueues a command). The riders
   * (um__xfer.ride) waiting on the device's queues get a command that
   * carries them: once it has completed, so have they. Cheap when there
   * are none; callable from any thread, a driver's callback included. */
  void (*queue_kick)(void *bdev);
  /* With queue_kick: a token (owned by the caller) that completes once
   * everything queued so far on queue q has; the riders there complete
   * with it. For a rider that a command of another queue must wait for. */
  int (*queue_mark_now)(void *bdev, int q, void **token);
  /* Block until the token completes; its status. */
  int (*token_wait)(void *bdev, void *token);
  /* Optional (NULL: a waiter polls only the core's own state). Whether the
   * token's work has ended on the device: 1 finished or failed, 0 not yet
   * or not known. Never blocks: a waiter's spin calls it
   * (um_options.wait_spin_ns) to see a completion the driver has not
   * reported through done() yet. */
  int (*token_query)(void *bdev, void *token);
  /* Optional (NULL: token_query alone). token_query's answer, and where the
   * work has ended but the backend's own reporting thread (a stream's
   * watcher) has not reported it yet, the report made right here: done()
   * runs on the calling thread, which the core has marked as completing
   * inline (um__thread_completes_inline_set), with no lock of the backend
   * held. Exactly one of this call and the backend's thread reports a
   * token. A spinning waiter calls it, so that it need not wait for the
   * reporting thread to wake from the driver's blocking wait. */
  int (*token_reap)(void *bdev, void *token);
  /* Adopt the caller's own context, device and queue as one more device:
   * open() and describe() for it. *ctx is the backend's per-manager state,
   * NULL when the manager did not open the backend (adopt makes it; close
   * frees it). The context and queue are retained until close. */
  int (*adopt)(const um_options *opts, void **ctx, void *context, void *device, void *queue,
               um__bdev_desc *out);

  /* Optional (NULL: memory another owner holds is taken as the caller
   * describes it). A block over native memory the caller owns (a DLPack
   * import) at loc: handle is the native object (a cl_mem); [offset, offset
   * + bytes) the range to wrap. Checks that it is memory of this device's
   * context holding the range, and fills *out as mem_alloc does for loc
   * (for offset > 0 a block of its own over the range, which
   * foreign_release gives back; the caller's object itself is never
   * released). UM_EINVAL (another context, not a buffer), UM_ERANGE (the
   * range is past the end), UM_ENOTSUP (an offset the device cannot start
   * a block at). */
  int (*foreign_wrap)(void *bdev, um_location loc, uintptr_t handle, uint64_t offset, size_t bytes,
                      um__mem *out);
  void (*foreign_release)(void *bdev, um__mem *mem);

  /* 1 when the driver lets its completion callbacks call this backend's
   * non-blocking operations (native_release, mem_free, xfer_async without
   * waiting): the core then finishes an operation inside done() instead of
   * waking one of its threads for it, which costs a thread switch per
   * operation. OpenCL allows non-blocking calls in event callbacks; CUDA
   * forbids every call in a stream callback (0). A backend whose done()
   * calls also come from threads of its own (CUDA's stream watchers) marks
   * those threads with um__thread_completes_inline. */
  int callbacks_reenter;
  /* 1 when the driver commits a block's memory only at the first command
   * that uses it (OpenCL), so mem_alloc cannot see the device run out: the
   * core then refuses a DEVICE or UNIFIED block that would take the bytes
   * it holds on the device past the device's total_bytes, as it does past
   * device_limit_bytes, and an out-of-memory the driver meets later fails
   * the first operation on the block (UM_ENOMEM). */
  int commits_lazily;
  /* 1 when every xfer_async of a device runs on one in-order queue, in the
   * order of the calls: a transfer started after another on the same device
   * runs after it with no token in after[] (and quiet transfers, with
   * UM__XFER_QUEUE_MARK, are available). */
  int single_queue;
  /* Optional (NULL: none, unless single_queue). For a backend that is not
   * single_queue but keeps an in-order queue per kind of transfer on each
   * device (CUDA: a stream for uploads, one for downloads, one for work on
   * the device): the queue, 0 <= q < UM__MAX_QUEUES, that xfer and
   * xfer_async use for a transfer of kind. Transfers of one queue run in
   * the order of the calls, with no token in after[]; quiet transfers and
   * UM__XFER_QUEUE_MARK (x->queue) are available. */
  int (*queue_of)(um__xfer_kind kind);
} um__backend;

#define UM__MAX_QUEUES 8

/* The backends this build knows, for the manager's table. Each is defined
 * in src/backend/. */
extern const um__backend um__backend_cpu;
#ifdef UNIMEM_HAVE_OPENCL
extern const um__backend um__backend_opencl;
#endif
#ifdef UNIMEM_HAVE_CUDA
extern const um__backend um__backend_cuda;
#endif

#endif /* UNIMEM_BACKEND_H */
