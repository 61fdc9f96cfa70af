/* The copy and fill API: argument checks, then one operation each, issued
 * through the operation layer (op.c), which orders it and runs it on the
 * path (path.c) it plans. um_copy_batch issues a group whose event completes
 * with its members (group.c: most go in a run per device, with no operation
 * object of their own). */
#include <string.h>

#include "ops.h"

static int check_range(const um_buffer *b, size_t off, size_t bytes) {
  if (off > b->size || bytes > b->size - off)
    return um__set_error(UM_ERANGE, "range [%zu, +%zu) outside a buffer of %zu bytes", off, bytes,
                         b->size);
  return UM_OK;
}

static int check_writable(const um_buffer *b) {
  if (b->readonly)
    return um__set_error(UM_ESTATE, "buffer %p is a read-only wrap", (const void *)b);
  return UM_OK;
}

/* Build and issue one copy; exactly one of src/host_src and one of
 * dst/host_dst is set. Checks everything first. */
static int copy_common(um_buffer *dst, size_t dst_off, um_buffer *src, size_t src_off, const void *host_src,
                       void *host_dst, size_t bytes, um_event **done) {
  um_manager *m;
  um_event *op;
  uint32_t dst_gen = 0, src_gen = 0;
  int st;
  if (dst && (st = um__buffer_check_owner(dst, &dst_gen)) != UM_OK)
    return st;
  if (src && (st = um__buffer_check_owner(src, &src_gen)) != UM_OK)
    return st;
  if ((dst == NULL) == (host_dst == NULL) || (src == NULL) == (host_src == NULL))
    return um__set_error(UM_EINVAL, "copy needs exactly one source and one destination");
  if (dst == NULL && src == NULL)
    return um__set_error(UM_EINVAL, "copy between two host pointers: use memcpy");
  if (bytes == 0)
    return um__set_error(UM_EINVAL, "copy of zero bytes");
  m = dst ? dst->m : src->m;
  if ((dst && dst->m != m) || (src && src->m != m))
    return um__set_error(UM_EINVAL, "buffers belong to different managers");
  if (um__process_changed(m))
    return um__manager_check_process(m);
  if (dst && (st = check_range(dst, dst_off, bytes)) != UM_OK)
    return st;
  if (src && (st = check_range(src, src_off, bytes)) != UM_OK)
    return st;
  if (dst && (st = check_writable(dst)) != UM_OK)
    return st;
  op = um__event_new(m, UM__OP_COPY);
  if (op == NULL)
    return um__set_error(UM_ENOMEM, "out of memory for an operation");
  op->dst = dst, op->copy.dst_off = dst_off, op->dst_gen = dst_gen;
  op->src = src, op->copy.src_off = src_off, op->src_gen = src_gen;
  op->copy.host_src = host_src, op->copy.host_dst = host_dst;
  op->bytes = bytes;
  return um__op_issue(op, done);
}

int um_copy_from_host(um_buffer *dst, size_t dst_off, const void *src, size_t bytes, um_event **done) {
  if (dst == NULL || src == NULL)
    return um__set_error(UM_EINVAL, "um_copy_from_host: NULL argument");
  return copy_common(dst, dst_off, NULL, 0, src, NULL, bytes, done);
}

int um_copy_to_host(um_buffer *src, size_t src_off, void *dst, size_t bytes, um_event **done) {
  if (dst == NULL || src == NULL)
    return um__set_error(UM_EINVAL, "um_copy_to_host: NULL argument");
  return copy_common(NULL, 0, src, src_off, NULL, dst, bytes, done);
}

int um_copy(um_buffer *dst, size_t dst_off, um_buffer *src, size_t src_off, size_t bytes, um_event **done) {
  if (dst == NULL || src == NULL)
    return um__set_error(UM_EINVAL, "um_copy: NULL argument");
  return copy_common(dst, dst_off, src, src_off, NULL, NULL, bytes, done);
}

int um_fill(um_buffer *dst, size_t off, int byte, size_t bytes, um_event **done) {
  um_event *op;
  uint32_t gen = 0;
  int st;
  if (dst == NULL)
    return um__set_error(UM_EINVAL, "um_fill: NULL buffer");
  if ((st = um__buffer_check_owner(dst, &gen)) != UM_OK)
    return st;
  if (um__process_changed(dst->m))
    return um__manager_check_process(dst->m);
  if (bytes == 0)
    return um__set_error(UM_EINVAL, "fill of zero bytes");
  if ((st = check_range(dst, off, bytes)) != UM_OK || (st = check_writable(dst)) != UM_OK)
    return st;
  op = um__event_new(dst->m, UM__OP_FILL);
  if (op == NULL)
    return um__set_error(UM_ENOMEM, "out of memory for an operation");
  op->dst = dst, op->copy.dst_off = off, op->dst_gen = gen, op->bytes = bytes;
  op->copy.value = (unsigned char)byte;
  return um__op_issue(op, done);
}

/* A mapped buffer refuses operations (um__op_issue says so too); checked
 * here as well so that a batch is refused before any of its ops is issued.
 * A blocking batch also refuses a buffer inside an open bracket, or whose
 * operations wait for one, which it would wait for without end on the
 * thread that is to close it. */
static int check_unmapped(um_buffer *b, bool blocking) {
  bool mapped, bracket;
  int st = UM_OK;
  pthread_mutex_lock(&b->lock);
  mapped = b->mapped;
  bracket = blocking && um__buffer_waits_bracket_locked(b, false);
  if (mapped)
    st = um__set_error(UM_ESTATE, "buffer %p is mapped: unmap it first", (void *)b);
  else if (bracket)
    st = um__op_bracket_error(b);
  pthread_mutex_unlock(&b->lock);
  return st;
}

/* The parts of check_op that differ between two ops on the same buffers. */
static int check_op_range(const um_copy_op *o) {
  int st;
  if ((o->dst == NULL) == (o->host_dst == NULL) || (o->src == NULL) == (o->host_src == NULL) ||
      (o->dst == NULL && o->src == NULL) || o->bytes == 0)
    return UM_EINVAL; /* check_op says why */
  if (o->dst && (st = check_range(o->dst, o->dst_off, o->bytes)) != UM_OK)
    return st;
  if (o->src && (st = check_range(o->src, o->src_off, o->bytes)) != UM_OK)
    return st;
  return UM_OK;
}

static int check_op(um_manager *m, const um_copy_op *o, bool blocking) {
  int st;
  if ((o->dst == NULL) == (o->host_dst == NULL) || (o->src == NULL) == (o->host_src == NULL))
    return um__set_error(UM_EINVAL, "batch op needs exactly one source and one destination");
  if (o->dst == NULL && o->src == NULL)
    return um__set_error(UM_EINVAL, "batch op between two host pointers");
  if (o->bytes == 0)
    return um__set_error(UM_EINVAL, "batch op of zero bytes");
  if (o->dst && (st = um__buffer_check_live(o->dst)) != UM_OK)
    return st;
  if (o->src && (st = um__buffer_check_live(o->src)) != UM_OK)
    return st;
  if ((o->dst && o->dst->m != m) || (o->src && o->src->m != m))
    return um__set_error(UM_EINVAL, "batch op uses a buffer of another manager");
  if (o->dst && (st = check_range(o->dst, o->dst_off, o->bytes)) != UM_OK)
    return st;
  if (o->src && (st = check_range(o->src, o->src_off, o->bytes)) != UM_OK)
    return st;
  if (o->dst && (st = check_writable(o->dst)) != UM_OK)
    return st;
  if (o->dst && (st = check_unmapped(o->dst, blocking)) != UM_OK)
    return st;
  if (o->src && (st = check_unmapped(o->src, blocking)) != UM_OK)
    return st;
  return UM_OK;
}

int um_copy_batch(um_manager *m, const um_copy_op *ops, size_t n, um_event **done) {
  um_event *group;
  int st;
  if (!um__manager_ok(m) || (ops == NULL && n > 0))
    return um__set_error(UM_EINVAL, "um_copy_batch: NULL argument or not a manager");
  if (n == 0)
    return um__set_error(UM_EINVAL, "um_copy_batch: empty batch");
  if (um__process_changed(m))
    return um__manager_check_process(m);
  for (size_t i = 0; i < n; i++) {
    /* Consecutive ops on the same buffers (a batch filling one buffer)
     * are checked once: nothing changes them between two checks. */
    if (i > 0 && ops[i].dst == ops[i - 1].dst && ops[i].src == ops[i - 1].src &&
        (st = check_op_range(&ops[i])) == UM_OK)
      continue;
    if ((st = check_op(m, &ops[i], done == NULL)) != UM_OK)
      return st;
  }
  if ((group = um__op_group_begin(m, done == NULL)) == NULL)
    return um__set_error(UM_ENOMEM, "out of memory for a batch");
  um__op_group_copies(group, ops, n);
  return um__op_group_end(group, done);
}
