/* um_net_put and um_net_get as operations: two entries of the
 * path table (path.c), net-put and net-get, for operations of kind
 * UM__OP_NET. The operation layer (op.c) orders a transfer after the
 * earlier operations on its local buffer, as it orders a copy (a put after
 * a um_copy_from_host into the same buffer sends the new bytes), and
 * starts it through the entry's start_async: the seam (net.h) hands it to
 * the network and returns, so no thread of unimem waits while the bytes
 * travel; the net's progress thread (or its staging thread, for a buffer
 * without a host view) reports it done and the operation completes there.
 *
 * What a transfer needs beyond the event's own fields (the endpoint, the
 * remote range, a copy of the key bytes) is the operation's attachment:
 * made at issue, dropped by op.c when the operation completes, is
 * canceled, or is refused at issue. The endpoint stays allocated meanwhile
 * (its handle's count).
 *
 * Statistics, on the device of the local buffer, for a transfer that
 * succeeded: bytes_net_out (put) or bytes_net_in (get), and xfer_net. The
 * passive side's counters do not move: its process made no call. A buffer
 * without a host view is staged through pinned host chunks
 * (staging.c), whose device copies count in bytes_d2h / bytes_h2d as
 * the bytes crossing the device boundary.
 */
#include <stdlib.h>
#include <string.h>

#include "interop.h"
#include "net.h"

typedef struct net_op {
  um__net_xfer x;
  unsigned char key[]; /* copy of the blob's transport key (x.remote.key) */
} net_op;

/* ------------------------------------------------------------------------ */
/* The entries */

static bool plan_net_put(um_event *op) { return op->kind == UM__OP_NET && op->src != NULL; }

static bool plan_net_get(um_event *op) { return op->kind == UM__OP_NET && op->dst != NULL; }

static int start_net(um_event *op, um__done_fn done) {
  net_op *p = op->net.transfer;
  return um__net_xfer_start(&p->x, done, op);
}

UM__PATH_ACCOUNT(account_net_put, src, bytes_net_out, xfer_net)
UM__PATH_ACCOUNT(account_net_get, dst, bytes_net_in, xfer_net)

/* run is never called: start_async is set. */
const um__path um__path_net_put = {.name = "net-put",
                                   .plan = plan_net_put,
                                   .account = account_net_put,
                                   .start_async = start_net};
const um__path um__path_net_get = {.name = "net-get",
                                   .plan = plan_net_get,
                                   .account = account_net_get,
                                   .start_async = start_net};

/* ------------------------------------------------------------------------ */
/* Issuing */

static void net_op_drop(um_event *op) {
  net_op *p = op->net.transfer;
  op->net.transfer = NULL;
  um__net_endpoint_unref(p->x.ep);
  free(p);
}

static int net_issue(um__net_dir dir, um_endpoint *ep, um_buffer *b, size_t off, const void *blob,
                     size_t blob_len, size_t roff, size_t bytes, um_event **done) {
  um__net_remote rem;
  uint32_t gen = 0;
  net_op *p;
  um_event *op;
  int st;
  /* The generation before anything else of b is read: a descriptor handed
   * to a new owner meanwhile is refused under its lock (op.c). */
  if (b != NULL && (st = um__buffer_check_owner(b, &gen)) != UM_OK)
    return st;
  if ((st = um__net_transfer_check(dir, ep, b, off, blob, blob_len, roff, bytes, &rem)) != UM_OK)
    return st;
  if (um__process_changed(b->m))
    return um__manager_check_process(b->m);
  if ((p = malloc(sizeof(*p) + rem.key_len)) == NULL)
    return um__set_error(UM_ENOMEM, "out of memory for a network operation");
  if ((op = um__event_new(b->m, UM__OP_NET)) == NULL) {
    free(p);
    return um__set_error(UM_ENOMEM, "out of memory for a network operation");
  }
  memcpy(p->key, rem.key, rem.key_len);
  rem.key = p->key;
  /* The failure's text goes straight into the event (um_last_error() after
   * um_event_wait): the event outlives the transfer. */
  p->x = (um__net_xfer){.dir = dir, .ep = ep, .buf = b, .buf_off = off, .remote = rem,
                        .remote_off = roff, .bytes = bytes, .detail = op->error_text,
                        .detail_cap = sizeof(op->error_text)};
  um__net_endpoint_ref(ep);
  op->net.transfer = p;
  op->net.drop = net_op_drop;
  if (dir == UM__NET_PUT)
    op->src = b, op->src_gen = gen;
  else
    op->dst = b, op->dst_gen = gen;
  op->bytes = bytes;
  return um__op_issue(op, done);
}

int um_net_put(um_endpoint *ep, um_buffer *src, size_t src_off, const void *rkey, size_t rkey_len,
               size_t dst_off, size_t bytes, um_event **done) {
  return net_issue(UM__NET_PUT, ep, src, src_off, rkey, rkey_len, dst_off, bytes, done);
}

int um_net_get(um_endpoint *ep, um_buffer *dst, size_t dst_off, const void *rkey, size_t rkey_len,
               size_t src_off, size_t bytes, um_event **done) {
  return net_issue(UM__NET_GET, ep, dst, dst_off, rkey, rkey_len, src_off, bytes, done);
}

/* ------------------------------------------------------------------------ */
/* The paths (ops.h, um__path_add) */

__attribute__((constructor)) static void register_paths(void) {
  um__path_add(&um__path_net_put);
  um__path_add(&um__path_net_get);
}
