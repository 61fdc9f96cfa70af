/* Paths: how an operation runs. One table entry per way of moving data,
 * each with its plan (whether it takes the operation, and on which device's
 * queue), its run (to completion on the calling thread), its start_native
 * (on a device queue, without waiting) and its account (the statistics),
 * called by the operation layer (op.c), which knows none of them. A new
 * kind of operation is a new entry here.
 *
 * Copies and fills are offered to the entries in this order:
 *  - fill: memset on the host view, or the device's fill;
 *  - both ends have a host view (host memory, pinned, unified, the cpu
 *    device): memcpy on the host;
 *  - host -> device memory: from pageable memory larger than one staging
 *    chunk, pipelined through two pinned chunks (staged.c); otherwise one
 *    direct call (from the same device's pinned memory, or a wrap pinned
 *    for that device, one DMA);
 *  - device memory -> host: the mirror image;
 *  - device memory -> device memory: overlapping ranges of one buffer
 *    through the host (staged.c); same device, a device-local copy; two
 *    devices with peer access enabled, a peer copy; otherwise staged
 *    through a host bounce chunk (staged.c), the fallback that always works.
 * Paths that are a single backend call run natively when the backend can
 * queue them (xfer_async).
 */
#include <string.h>

#include "ops.h"

/* Host copies up to this size run on the issuing thread even when an event
 * was asked for: handing them to a worker costs a thread wake-up, as much
 * as the copy itself (docs/design.md, Decisions: "Small host copies"). */
#define INLINE_HOST_BYTES (256u * 1024u)

/* The device's queue runs op when its backend queues transfers. */
static bool native_on(um_event *op, um_device *d) {
  op->native_dev = um__dev_has_async(d) ? d : NULL;
  return true;
}

/* ------------------------------------------------------------------------ */
/* Single backend calls: one um__xfer, on one device */

/* The transfer goes to op's queue: the backend's own for its kind, or the
 * caller's (um_queue_use). */
static um_device *xfer_of(const um_event *op, um__xfer *x) {
  um_device *d = op->path->xfer(op, x);
  x->queue = op->queued_q;
  return d;
}

static int run_single(um_event *op) {
  um__xfer x;
  um_device *d = xfer_of(op, &x);
  return um__dev_xfer(d, &x);
}

static int start_single(um_event *op, void *const *after, int nafter, um__done_fn done, void **native) {
  um__xfer x;
  um_device *d = xfer_of(op, &x);
  if (done != NULL) {
    x.done_space = op->done_space; /* op lives until its completion */
    x.token_held = 1;              /* op_finish puts it (tokens.c's keep_native) */
  }
  return um__dev_xfer_async(d, &x, after, nafter, done, op, native);
}

/* The device-side ends of a copy between two blocks. */
static void xfer_blocks(const um_event *op, um__xfer *x, um__xfer_kind kind) {
  memset(x, 0, sizeof(*x));
  x->kind = kind;
  x->bytes = op->bytes;
  x->dst = &op->dst->mem, x->dst_loc = op->dst->loc, x->dst_off = op->copy.dst_off;
  x->src = &op->src->mem, x->src_loc = op->src->loc, x->src_off = op->copy.src_off;
  x->src_bdev = op->src->dev->bdev;
}

static um_device *xfer_fill(const um_event *op, um__xfer *x) {
  um__xfer_host(x, UM__XFER_FILL, op->dst, op->copy.dst_off, NULL, op->bytes);
  x->value = op->copy.value;
  return op->dst->dev;
}

static um_device *xfer_h2d(const um_event *op, um__xfer *x) {
  um__xfer_host(x, UM__XFER_H2D, op->dst, op->copy.dst_off, um__path_host_src(op), op->bytes);
  x->host_pinned = um__path_dma_ready(op->src, op->dst->dev);
  return op->dst->dev;
}

static um_device *xfer_d2h(const um_event *op, um__xfer *x) {
  um__xfer_host(x, UM__XFER_D2H, op->src, op->copy.src_off, um__path_host_dst(op), op->bytes);
  x->host_pinned = um__path_dma_ready(op->dst, op->src->dev);
  return op->src->dev;
}

static um_device *xfer_local(const um_event *op, um__xfer *x) {
  xfer_blocks(op, x, UM__XFER_D2D);
  return op->dst->dev;
}

static um_device *xfer_peer(const um_event *op, um__xfer *x) {
  xfer_blocks(op, x, UM__XFER_PEER);
  return op->dst->dev;
}

/* ------------------------------------------------------------------------ */
/* Fills */

static void tally_fill(um_device *d, uint64_t n, uint64_t bytes) {
  (void)bytes;
  UM__STAT_ADD(d, fills, n);
}

static void account_fill(const um_event *op) { tally_fill(op->dst->dev, 1, op->bytes); }

static bool plan_fill_host(um_event *op) { return op->kind == UM__OP_FILL && op->dst->mem.host != NULL; }

static int run_fill_host(um_event *op) {
  memset((char *)op->dst->mem.host + op->copy.dst_off, op->copy.value, op->bytes);
  return UM_OK;
}

static bool plan_fill_device(um_event *op) {
  return op->kind == UM__OP_FILL && native_on(op, op->dst->dev);
}

const um__path um__path_fill_host = {.name = "fill-host", .plan = plan_fill_host, .run = run_fill_host,
                                     .account = account_fill, .inline_bytes = INLINE_HOST_BYTES};
const um__path um__path_fill_device = {.name = "fill-device", .plan = plan_fill_device, .run = run_single,
                                       .start_native = start_single, .account = account_fill,
                                       .account_queued = tally_fill, .xfer = xfer_fill, .queued = true,
                                       .caller_queue = true,
                                       .kind = UM__XFER_FILL};

/* ------------------------------------------------------------------------ */
/* memcpy: both ends host-addressable */

static bool plan_memcpy(um_event *op) {
  return op->kind == UM__OP_COPY && um__path_host_src(op) != NULL && um__path_host_dst(op) != NULL;
}

static int run_memcpy(um_event *op) {
  memmove(um__path_host_dst(op), um__path_host_src(op), op->bytes); /* one buffer may be both ends */
  return UM_OK;
}

/* Bytes are counted by what physically moved: into device memory from host
 * memory is host-to-device whether the host side was a pointer, a pinned
 * buffer or a buffer of the cpu device; between two devices is peer
 * traffic. */
static void account_memcpy(const um_event *op) {
  um_device *src = op->src ? op->src->dev : NULL, *dst = op->dst ? op->dst->dev : NULL, *d;
  if (op->copy.host_src != NULL) {
    UM__STAT_ADD(d = dst, bytes_h2d, op->bytes);
  } else if (op->copy.host_dst != NULL) {
    UM__STAT_ADD(d = src, bytes_d2h, op->bytes);
  } else if (src == dst) {
    UM__STAT_ADD(d = dst, bytes_d2d, op->bytes);
  } else if (src->index == 0) {
    UM__STAT_ADD(d = dst, bytes_h2d, op->bytes);
  } else if (dst->index == 0) {
    UM__STAT_ADD(d = src, bytes_d2h, op->bytes);
  } else {
    UM__STAT_ADD(d = dst, bytes_peer, op->bytes);
  }
  if (src != NULL && src == dst)
    UM__STAT_ADD(d, xfer_local, 1);
  else
    UM__STAT_ADD(d, xfer_direct, 1);
}

const um__path um__path_memcpy = {.name = "memcpy", .plan = plan_memcpy, .run = run_memcpy,
                                  .account = account_memcpy, .inline_bytes = INLINE_HOST_BYTES};

/* ------------------------------------------------------------------------ */
/* Direct host <-> device, device-local and peer copies */

/* Each counts n transfers of bytes in all on d, the device whose queue ran
 * them (a batch's run counts its copies at once, group.c); the account of one
 * operation is the same with n = 1. */
#define TALLY(name, bytes_field, xfer_field)                                                      \
  static void name(um_device *d, uint64_t n, uint64_t bytes) {                                    \
    UM__STAT_ADD(d, bytes_field, bytes);                                                          \
    UM__STAT_ADD(d, xfer_field, n);                                                               \
  }
TALLY(tally_h2d, bytes_h2d, xfer_direct)
TALLY(tally_d2h, bytes_d2h, xfer_direct)
TALLY(tally_local, bytes_d2d, xfer_local)
TALLY(tally_peer, bytes_peer, xfer_peer)

static void account_h2d(const um_event *op) { tally_h2d(op->dst->dev, 1, op->bytes); }
static void account_d2h(const um_event *op) { tally_d2h(op->src->dev, 1, op->bytes); }
static void account_local(const um_event *op) { tally_local(op->dst->dev, 1, op->bytes); }
static void account_peer(const um_event *op) { tally_peer(op->dst->dev, 1, op->bytes); }

/* Called after memcpy and the pipelined paths declined: one end is a
 * device block. */
static bool plan_h2d(um_event *op) { return um__path_host_src(op) != NULL && native_on(op, op->dst->dev); }

static bool plan_d2h(um_event *op) { return um__path_host_dst(op) != NULL && native_on(op, op->src->dev); }

static bool plan_local(um_event *op) {
  return op->src->dev == op->dst->dev && native_on(op, op->dst->dev);
}

static bool plan_peer(um_event *op) {
  return um__dev_same_backend(op->src->dev, op->dst->dev) && um_peer_enabled(op->dst->dev, op->src->dev) == 1 &&
         native_on(op, op->dst->dev);
}

/* One backend call each: queued on the device's queue when it has one. */
#define SINGLE_CALL(n, p, a, t, x, k)                                                              \
  {.name = n, .plan = p, .run = run_single, .start_native = start_single, .account = a,             \
   .account_queued = t, .xfer = x, .queued = true, .caller_queue = true, .kind = k}
const um__path um__path_h2d = SINGLE_CALL("h2d", plan_h2d, account_h2d, tally_h2d, xfer_h2d, UM__XFER_H2D);
const um__path um__path_d2h = SINGLE_CALL("d2h", plan_d2h, account_d2h, tally_d2h, xfer_d2h, UM__XFER_D2H);
const um__path um__path_local =
    SINGLE_CALL("local", plan_local, account_local, tally_local, xfer_local, UM__XFER_D2D);
const um__path um__path_peer = SINGLE_CALL("peer", plan_peer, account_peer, tally_peer, xfer_peer, UM__XFER_PEER);

/* ------------------------------------------------------------------------ */
/* The table and the plan */

/* Copies are offered to the copy entries, every other kind to the others
 * (each of which takes its one kind; the brackets' and the net's are added
 * by their layers, um__path_add), so that a small copy's plan does not
 * ask six entries that never take it. */
static const um__path *other_paths[8] = {&um__path_fill_host, &um__path_fill_device};
static size_t other_count = 2;
static const um__path *const copy_paths[] = {
    &um__path_memcpy, &um__path_h2d_pipelined, &um__path_h2d, &um__path_d2h_pipelined,
    &um__path_d2h, &um__path_overlap, &um__path_local,
    &um__path_peer, &um__path_staged, /* takes every copy left */
};

/* The in-order queue of op's device that its path goes to: the thread's
 * queue of the caller's for the device (um_queue_use), where it has one
 * and the path may go there; else the device's one queue (single_queue),
 * or its backend's queue for the path's kind of transfer (queue_of); -1
 * for none, and for an operation that is no command of such a queue (a
 * bracket on unimem's queues: the caller's kernel runs on another queue
 * and needs its predecessor's token in its wait list). */
static int queue_of(const um_event *op) {
  const um_device *d = op->native_dev;
  int q;
  if (d == NULL)
    return -1;
  if (op->path->caller_queue && (q = um__queue_current(d)) >= 0)
    return q;
  if (!op->path->queued)
    return -1;
  return um__dev_queue_of(d, op->path->kind);
}

void um__path_plan(um_event *op) {
  const um__path *const *table = op->kind == UM__OP_COPY ? copy_paths : other_paths;
  size_t n = op->kind == UM__OP_COPY ? sizeof(copy_paths) / sizeof(copy_paths[0]) : other_count;
  op->native_dev = NULL;
  op->queued_q = -1;
  for (size_t i = 0; i < n; i++) {
    if (table[i]->plan(op)) {
      op->path = table[i];
      op->queued_q = queue_of(op);
      return;
    }
  }
}

/* At load time only (a constructor of the layer above), before any thread
 * plans: the table needs no lock. */
void um__path_add(const um__path *p) {
  if (other_count < sizeof(other_paths) / sizeof(other_paths[0]))
    other_paths[other_count++] = p;
}

bool um__path_runs_inline(const um_event *op) { return op->bytes <= op->path->inline_bytes; }
