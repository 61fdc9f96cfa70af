/* The transfer engine: the copy and fill API, and the choice of a path per
 * operation.
 *
 * Paths, in the order they are considered:
 *  - both ends have a host view (host memory, pinned, unified, cpu device):
 *    memcpy on the host;
 *  - fill: memset on the host view, or the device's fill;
 *  - host -> device memory: from the same device's pinned memory, one
 *    direct DMA; from pageable memory larger than one staging chunk,
 *    pipelined through two pinned chunks (the host copy of chunk k+1
 *    overlaps the DMA of chunk k); otherwise one direct call;
 *  - device memory -> host: the mirror image;
 *  - device memory -> device memory: same device, a device-local copy;
 *    two devices with peer access enabled, a peer copy; otherwise staged
 *    through a host bounce chunk (the fallback that always works).
 * Paths that are a single backend call run natively when the backend can
 * queue them (xfer_async); the others run on the issuing thread (blocking
 * calls, small host copies) or on a worker.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

typedef enum {
  PATH_MEMCPY = 0,
  PATH_FILL_HOST,
  PATH_FILL_DEVICE,
  PATH_H2D,
  PATH_D2H,
  PATH_LOCAL,
  PATH_PEER,
  PATH_H2D_PIPELINED,
  PATH_D2H_PIPELINED,
  PATH_STAGED,
  PATH_OVERLAP
} um__path;

/* Host copies up to this size run on the issuing thread even when an event
 * was asked for: handing 256 KiB to a worker costs a thread wake-up
 * (~5-20 us), as much as the copy itself at ~10 GB/s. */
#define INLINE_HOST_BYTES (256u * 1024u)

static char *host_view(um_buffer *b, size_t off) {
  return b->mem.host ? (char *)b->mem.host + off : NULL;
}

/* use_pinned_staging 1 leaves out devices whose memory is host memory: for
 * them the chunks add a second copy of every byte (on PoCL, 64 MiB from
 * pageable memory ran at 42% of the direct call); 2 forces them in. */
static bool can_pipeline(const um_device *d, size_t bytes) {
  const um_options *o = &d->m->opts;
  return (o->use_pinned_staging == 2 || (o->use_pinned_staging == 1 && !d->host_memory)) &&
         d->be->xfer_async != NULL && (d->info.locations & (1u << UM_PINNED)) &&
         bytes > o->staging_chunk_bytes;
}

/* b's memory is page-locked for device d: a PINNED block of d, or a
 * UM_WRAP_PIN wrap registered with d's backend. A copy between it and d's
 * memory is one direct DMA, with no staging. */
static bool dma_ready(const um_buffer *b, const um_device *d) {
  return b != NULL && ((b->loc == UM_PINNED && b->dev == d) || um__wrap_registered(b, d));
}

void um__op_plan(um_event *op) {
  um_manager *m = op->m;
  const char *src_host;
  char *dst_host;
  op->native_dev = NULL;
  if (op->kind == UM__OP_FILL) {
    if (op->dst->mem.host != NULL) {
      op->path = PATH_FILL_HOST;
    } else {
      op->path = PATH_FILL_DEVICE;
      if (op->dst->dev->be->xfer_async)
        op->native_dev = op->dst->dev;
    }
    return;
  }
  src_host = op->host_src ? (const char *)op->host_src : host_view(op->src, op->src_off);
  dst_host = op->host_dst ? (char *)op->host_dst : host_view(op->dst, op->dst_off);
  if (src_host && dst_host) {
    op->path = PATH_MEMCPY;
  } else if (src_host) {
    um_device *d = op->dst->dev;
    bool pinned = dma_ready(op->src, d);
    op->path = (!pinned && can_pipeline(d, op->bytes)) ? PATH_H2D_PIPELINED : PATH_H2D;
    if (op->path == PATH_H2D && d->be->xfer_async)
      op->native_dev = d;
  } else if (dst_host) {
    um_device *d = op->src->dev;
    bool pinned = dma_ready(op->dst, d);
    op->path = (!pinned && can_pipeline(d, op->bytes)) ? PATH_D2H_PIPELINED : PATH_D2H;
    if (op->path == PATH_D2H && d->be->xfer_async)
      op->native_dev = d;
  } else if (op->src == op->dst && op->src_off < op->dst_off + op->bytes &&
             op->dst_off < op->src_off + op->bytes) {
    /* Overlapping ranges of one device buffer: device copy engines (and
     * clEnqueueCopyBuffer, cuMemcpyDtoD) refuse or corrupt them. */
    op->path = PATH_OVERLAP;
  } else if (op->src->dev == op->dst->dev) {
    op->path = PATH_LOCAL;
    if (op->dst->dev->be->xfer_async)
      op->native_dev = op->dst->dev;
  } else if (op->src->dev->be == op->dst->dev->be &&
             um_peer_enabled(op->dst->dev, op->src->dev) == 1) {
    op->path = PATH_PEER;
    if (op->dst->dev->be->xfer_async)
      op->native_dev = op->dst->dev;
  } else {
    op->path = PATH_STAGED;
  }
  (void)m;
}

bool um__op_runs_inline(const um_event *op) {
  return (op->path == PATH_MEMCPY || op->path == PATH_FILL_HOST) && op->bytes <= INLINE_HOST_BYTES;
}

/* The single backend transfer of a one-call path, and the device it runs
 * on. */
static um_device *single_xfer(const um_event *op, um__xfer *x) {
  memset(x, 0, sizeof(*x));
  x->bytes = op->bytes;
  switch ((um__path)op->path) {
  case PATH_FILL_DEVICE:
    x->kind = UM__XFER_FILL;
    x->dst = &op->dst->mem;
    x->dst_loc = op->dst->loc;
    x->dst_off = op->dst_off;
    x->value = op->value;
    return op->dst->dev;
  case PATH_H2D:
    x->kind = UM__XFER_H2D;
    x->dst = &op->dst->mem;
    x->dst_loc = op->dst->loc;
    x->dst_off = op->dst_off;
    x->host = op->host_src ? (void *)op->host_src : host_view(op->src, op->src_off);
    x->host_pinned = dma_ready(op->src, op->dst->dev);
    return op->dst->dev;
  case PATH_D2H:
    x->kind = UM__XFER_D2H;
    x->src = &op->src->mem;
    x->src_loc = op->src->loc;
    x->src_off = op->src_off;
    x->host = op->host_dst ? op->host_dst : host_view(op->dst, op->dst_off);
    x->host_pinned = dma_ready(op->dst, op->src->dev);
    return op->src->dev;
  case PATH_LOCAL:
  case PATH_PEER:
    x->kind = op->path == PATH_LOCAL ? UM__XFER_D2D : UM__XFER_PEER;
    x->dst = &op->dst->mem;
    x->dst_loc = op->dst->loc;
    x->dst_off = op->dst_off;
    x->src = &op->src->mem;
    x->src_loc = op->src->loc;
    x->src_off = op->src_off;
    x->src_bdev = op->src->dev->bdev;
    return op->dst->dev;
  default:
    return NULL;
  }
}

int um__op_start_native(um_event *op, void *const *after, int nafter, um__done_fn done,
                        void **native) {
  um__xfer x;
  um_device *d = single_xfer(op, &x);
  return d->be->xfer_async(d->bdev, &x, after, nafter, done, op, native);
}

/* ------------------------------------------------------------------------ */
/* Pinned staging chunks, kept per device up to pinned_pool_bytes. */

static int staging_get(um_device *d, um__mem *out) {
  size_t chunk = d->m->opts.staging_chunk_bytes;
  int st;
  pthread_mutex_lock(&d->staging_lock);
  if (d->staging_count > 0) {
    um__mem *c = d->staging_free[--d->staging_count];
    pthread_mutex_unlock(&d->staging_lock);
    *out = *c;
    free(c);
    return UM_OK;
  }
  pthread_mutex_unlock(&d->staging_lock);
  st = um__block_alloc(d, UM_PINNED, chunk, out);
  return st;
}

static void staging_put(um_device *d, um__mem *mem) {
  size_t chunk = d->m->opts.staging_chunk_bytes;
  uint64_t cap = d->m->opts.pinned_pool_bytes / chunk;
  um__mem *c;
  if (cap > sizeof(d->staging_free) / sizeof(d->staging_free[0]))
    cap = sizeof(d->staging_free) / sizeof(d->staging_free[0]);
  pthread_mutex_lock(&d->staging_lock);
  if ((uint64_t)d->staging_count < cap && (c = malloc(sizeof(*c))) != NULL) {
    *c = *mem;
    d->staging_free[d->staging_count++] = c;
    pthread_mutex_unlock(&d->staging_lock);
    return;
  }
  pthread_mutex_unlock(&d->staging_lock);
  um__block_free(d, UM_PINNED, chunk, mem);
}

void um__staging_release_all(um_device *d) {
  size_t chunk = d->m->opts.staging_chunk_bytes;
  pthread_mutex_lock(&d->staging_lock);
  while (d->staging_count > 0) {
    um__mem *c = d->staging_free[--d->staging_count];
    um__block_free(d, UM_PINNED, chunk, c);
    free(c);
  }
  pthread_mutex_unlock(&d->staging_lock);
}

/* Completion of one staged chunk's DMA. */
typedef struct chunk_wait {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  bool busy;
  int status;
  void *token;
} chunk_wait;

static void chunk_done(void *arg, int status) {
  chunk_wait *w = arg;
  pthread_mutex_lock(&w->lock);
  w->busy = false;
  w->status = status;
  pthread_cond_signal(&w->cond);
  pthread_mutex_unlock(&w->lock);
}

static int chunk_finish(um_device *d, chunk_wait *w) {
  int st;
  pthread_mutex_lock(&w->lock);
  while (w->busy)
    pthread_cond_wait(&w->cond, &w->lock);
  st = w->status;
  pthread_mutex_unlock(&w->lock);
  if (w->token != NULL && d->be->native_release)
    d->be->native_release(d->bdev, w->token);
  w->token = NULL;
  return st;
}

static int chunk_start(um_device *d, chunk_wait *w, const um__xfer *x) {
  int st;
  w->busy = true;
  w->status = UM_OK;
  st = d->be->xfer_async(d->bdev, x, NULL, 0, chunk_done, w, &w->token);
  if (st != UM_OK) {
    w->busy = false;
    w->token = NULL;
  }
  return st;
}

/* Pageable host <-> device memory through two pinned chunks. to_device
 * selects the direction; host is the pageable side. */
static int run_pipelined(um_event *op, bool to_device) {
  um_device *d = to_device ? op->dst->dev : op->src->dev;
  um_buffer *dev_buf = to_device ? op->dst : op->src;
  size_t dev_off = to_device ? op->dst_off : op->src_off;
  char *host = to_device ? (char *)(op->host_src ? op->host_src : host_view(op->src, op->src_off))
                         : (op->host_dst ? (char *)op->host_dst : host_view(op->dst, op->dst_off));
  size_t chunk = d->m->opts.staging_chunk_bytes;
  um__mem stage[2];
  chunk_wait w[2];
  size_t prev_off = 0, prev_n = 0;
  int st = UM_OK, got = 0;

  for (got = 0; got < 2; got++)
    if (staging_get(d, &stage[got]) != UM_OK)
      break;
  if (got < 2) {
    /* No pinned memory to stage through: one direct call still works. */
    um__xfer x;
    for (int i = 0; i < got; i++)
      staging_put(d, &stage[i]);
    memset(&x, 0, sizeof(x));
    x.kind = to_device ? UM__XFER_H2D : UM__XFER_D2H;
    if (to_device) {
      x.dst = &dev_buf->mem, x.dst_loc = dev_buf->loc, x.dst_off = dev_off;
    } else {
      x.src = &dev_buf->mem, x.src_loc = dev_buf->loc, x.src_off = dev_off;
    }
    x.host = host;
    x.bytes = op->bytes;
    return d->be->xfer(d->bdev, &x);
  }
  for (int i = 0; i < 2; i++) {
    pthread_mutex_init(&w[i].lock, NULL);
    pthread_cond_init(&w[i].cond, NULL);
    w[i].busy = false;
    w[i].status = UM_OK;
    w[i].token = NULL;
  }

  for (size_t off = 0, k = 0; off < op->bytes && st == UM_OK; k++) {
    int s = (int)(k & 1);
    size_t n = op->bytes - off < chunk ? op->bytes - off : chunk;
    um__xfer x;
    memset(&x, 0, sizeof(x));
    x.bytes = n;
    x.host = stage[s].host;
    x.host_pinned = 1;
    if (to_device) {
      /* Wait for this chunk's previous DMA before overwriting it; the
       * other chunk's DMA runs meanwhile. */
      if (w[s].token != NULL && (st = chunk_finish(d, &w[s])) != UM_OK)
        break;
      memcpy(stage[s].host, host + off, n);
      x.kind = UM__XFER_H2D;
      x.dst = &dev_buf->mem, x.dst_loc = dev_buf->loc, x.dst_off = dev_off + off;
      st = chunk_start(d, &w[s], &x);
    } else {
      x.kind = UM__XFER_D2H;
      x.src = &dev_buf->mem, x.src_loc = dev_buf->loc, x.src_off = dev_off + off;
      st = chunk_start(d, &w[s], &x);
      /* While chunk k arrives, copy chunk k-1 out of the other stage. */
      if (st == UM_OK && k > 0) {
        st = chunk_finish(d, &w[s ^ 1]);
        if (st == UM_OK)
          memcpy(host + prev_off, stage[s ^ 1].host, prev_n);
      }
      prev_off = off;
      prev_n = n;
    }
    off += n;
  }
  for (int i = 0; i < 2; i++) {
    bool had = w[i].token != NULL || w[i].busy;
    int fst = had ? chunk_finish(d, &w[i]) : UM_OK;
    if (st == UM_OK && fst != UM_OK)
      st = fst;
  }
  if (!to_device && st == UM_OK && prev_n > 0) {
    /* The last chunk went to the stage of the last iteration. */
    size_t nchunks = (op->bytes + chunk - 1) / chunk;
    memcpy(host + prev_off, stage[(nchunks - 1) & 1].host, prev_n);
  }
  for (int i = 0; i < 2; i++) {
    pthread_mutex_destroy(&w[i].lock);
    pthread_cond_destroy(&w[i].cond);
    staging_put(d, &stage[i]);
  }
  return st;
}

/* Device memory on one device to device memory on another without peer
 * access: through a host bounce chunk, pinned for the source when it can be. */
static int run_staged(um_event *op) {
  um_device *sd = op->src->dev, *dd = op->dst->dev;
  size_t chunk = op->m->opts.staging_chunk_bytes;
  um__mem stage;
  bool pinned = (sd->info.locations & (1u << UM_PINNED)) && staging_get(sd, &stage) == UM_OK;
  char *bounce = pinned ? stage.host : malloc(chunk);
  int st = UM_OK;
  if (bounce == NULL)
    return um__set_error(UM_ENOMEM, "staged copy: no bounce buffer");
  for (size_t off = 0; off < op->bytes && st == UM_OK;) {
    size_t n = op->bytes - off < chunk ? op->bytes - off : chunk;
    um__xfer x;
    memset(&x, 0, sizeof(x));
    x.kind = UM__XFER_D2H;
    x.src = &op->src->mem, x.src_loc = op->src->loc, x.src_off = op->src_off + off;
    x.host = bounce, x.host_pinned = pinned, x.bytes = n;
    st = sd->be->xfer(sd->bdev, &x);
    if (st != UM_OK)
      break;
    memset(&x, 0, sizeof(x));
    x.kind = UM__XFER_H2D;
    x.dst = &op->dst->mem, x.dst_loc = op->dst->loc, x.dst_off = op->dst_off + off;
    x.host = bounce, x.bytes = n;
    st = dd->be->xfer(dd->bdev, &x);
    off += n;
  }
  if (pinned)
    staging_put(sd, &stage);
  else
    free(bounce);
  return st;
}

/* memmove semantics within one device buffer: the whole source range goes
 * to the host first, then back to its destination. */
static int run_overlap(um_event *op) {
  um_device *d = op->dst->dev;
  um__xfer x;
  char *tmp = malloc(op->bytes);
  int st;
  if (tmp == NULL)
    return um__set_error(UM_ENOMEM, "overlapping copy: no memory for %zu bytes", op->bytes);
  memset(&x, 0, sizeof(x));
  x.kind = UM__XFER_D2H;
  x.src = &op->src->mem, x.src_loc = op->src->loc, x.src_off = op->src_off;
  x.host = tmp, x.bytes = op->bytes;
  st = d->be->xfer(d->bdev, &x);
  if (st == UM_OK) {
    memset(&x, 0, sizeof(x));
    x.kind = UM__XFER_H2D;
    x.dst = &op->dst->mem, x.dst_loc = op->dst->loc, x.dst_off = op->dst_off;
    x.host = tmp, x.bytes = op->bytes;
    st = d->be->xfer(d->bdev, &x);
  }
  free(tmp);
  return st;
}

int um__op_run(um_event *op) {
  um__xfer x;
  um_device *d;
  switch ((um__path)op->path) {
  case PATH_MEMCPY: {
    const char *src = op->host_src ? (const char *)op->host_src : host_view(op->src, op->src_off);
    char *dst = op->host_dst ? (char *)op->host_dst : host_view(op->dst, op->dst_off);
    memmove(dst, src, op->bytes); /* one buffer may be both ends */
    return UM_OK;
  }
  case PATH_FILL_HOST:
    memset(host_view(op->dst, op->dst_off), op->value, op->bytes);
    return UM_OK;
  case PATH_H2D_PIPELINED:
    return run_pipelined(op, true);
  case PATH_D2H_PIPELINED:
    return run_pipelined(op, false);
  case PATH_STAGED:
    return run_staged(op);
  case PATH_OVERLAP:
    return run_overlap(op);
  default:
    d = single_xfer(op, &x);
    return d->be->xfer(d->bdev, &x);
  }
}

/* Bytes are counted by what physically moved: into device memory from host
 * memory is host-to-device whether the host side was a pointer, a pinned
 * buffer or a buffer of the cpu device; between two devices is peer
 * traffic whether it went directly or through a host bounce. */
void um__op_account(const um_event *op) {
  um_device *d;
  if (op->kind == UM__OP_FILL) {
    UM__STAT_ADD(op->dst->dev, fills, 1);
    return;
  }
  switch ((um__path)op->path) {
  case PATH_H2D:
  case PATH_H2D_PIPELINED:
    d = op->dst->dev;
    UM__STAT_ADD(d, bytes_h2d, op->bytes);
    break;
  case PATH_D2H:
  case PATH_D2H_PIPELINED:
    d = op->src->dev;
    UM__STAT_ADD(d, bytes_d2h, op->bytes);
    break;
  case PATH_LOCAL:
  case PATH_OVERLAP:
    d = op->dst->dev;
    UM__STAT_ADD(d, bytes_d2d, op->bytes);
    break;
  case PATH_PEER:
  case PATH_STAGED:
    d = op->dst->dev;
    UM__STAT_ADD(d, bytes_peer, op->bytes);
    break;
  default: /* PATH_MEMCPY: both ends are host-addressable */
    if (op->host_src != NULL) {
      d = op->dst->dev;
      UM__STAT_ADD(d, bytes_h2d, op->bytes);
    } else if (op->host_dst != NULL) {
      d = op->src->dev;
      UM__STAT_ADD(d, bytes_d2h, op->bytes);
    } else if (op->src->dev != op->dst->dev && op->src->dev->index == 0) {
      d = op->dst->dev;
      UM__STAT_ADD(d, bytes_h2d, op->bytes);
    } else if (op->src->dev != op->dst->dev && op->dst->dev->index == 0) {
      d = op->src->dev;
      UM__STAT_ADD(d, bytes_d2h, op->bytes);
    } else if (op->src->dev == op->dst->dev) {
      d = op->dst->dev;
      UM__STAT_ADD(d, bytes_d2d, op->bytes);
    } else {
      d = op->dst->dev;
      UM__STAT_ADD(d, bytes_peer, op->bytes);
    }
    break;
  }
  switch ((um__path)op->path) {
  case PATH_MEMCPY:
    if (op->src && op->dst && op->src->dev == op->dst->dev)
      UM__STAT_ADD(d, xfer_local, 1);
    else
      UM__STAT_ADD(d, xfer_direct, 1);
    break;
  case PATH_LOCAL: UM__STAT_ADD(d, xfer_local, 1); break;
  case PATH_PEER: UM__STAT_ADD(d, xfer_peer, 1); break;
  case PATH_H2D_PIPELINED:
  case PATH_D2H_PIPELINED: UM__STAT_ADD(d, xfer_pipelined, 1); break;
  case PATH_STAGED:
  case PATH_OVERLAP: UM__STAT_ADD(d, xfer_staged, 1); break;
  default: UM__STAT_ADD(d, xfer_direct, 1); break;
  }
}

/* ------------------------------------------------------------------------ */
/* Public API */

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
static int copy_common(um_manager *m, um_buffer *dst, size_t dst_off, um_buffer *src, size_t src_off,
                       const void *host_src, void *host_dst, size_t bytes, um_event *group,
                       um_event **done) {
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
  if (m == NULL)
    m = dst ? dst->m : src->m;
  if ((dst && dst->m != m) || (src && src->m != m))
    return um__set_error(UM_EINVAL, "buffers belong to different managers");
  UM__CHECK_PROCESS(m);
  if (dst && (st = check_range(dst, dst_off, bytes)) != UM_OK)
    return st;
  if (src && (st = check_range(src, src_off, bytes)) != UM_OK)
    return st;
  if (dst && (st = check_writable(dst)) != UM_OK)
    return st;
  op = um__event_new(m, UM__OP_COPY);
  if (op == NULL)
    return um__set_error(UM_ENOMEM, "out of memory for an operation");
  op->dst = dst, op->dst_off = dst_off, op->dst_gen = dst_gen;
  op->src = src, op->src_off = src_off, op->src_gen = src_gen;
  op->host_src = host_src, op->host_dst = host_dst;
  op->bytes = bytes;
  op->group = group;
  return um__op_issue(op, done);
}

int um_copy_from_host(um_buffer *dst, size_t dst_off, const void *src, size_t bytes, um_event **done) {
  if (dst == NULL || src == NULL)
    return um__set_error(UM_EINVAL, "um_copy_from_host: NULL argument");
  return copy_common(NULL, dst, dst_off, NULL, 0, src, NULL, bytes, NULL, done);
}

int um_copy_to_host(um_buffer *src, size_t src_off, void *dst, size_t bytes, um_event **done) {
  if (dst == NULL || src == NULL)
    return um__set_error(UM_EINVAL, "um_copy_to_host: NULL argument");
  return copy_common(NULL, NULL, 0, src, src_off, NULL, dst, bytes, NULL, done);
}

int um_copy(um_buffer *dst, size_t dst_off, um_buffer *src, size_t src_off, size_t bytes, um_event **done) {
  if (dst == NULL || src == NULL)
    return um__set_error(UM_EINVAL, "um_copy: NULL argument");
  return copy_common(NULL, dst, dst_off, src, src_off, NULL, NULL, bytes, NULL, done);
}

int um_fill(um_buffer *dst, size_t off, int byte, size_t bytes, um_event **done) {
  um_event *op;
  uint32_t gen = 0;
  int st;
  if (dst == NULL)
    return um__set_error(UM_EINVAL, "um_fill: NULL buffer");
  if ((st = um__buffer_check_owner(dst, &gen)) != UM_OK)
    return st;
  UM__CHECK_PROCESS(dst->m);
  if (bytes == 0)
    return um__set_error(UM_EINVAL, "fill of zero bytes");
  if ((st = check_range(dst, off, bytes)) != UM_OK || (st = check_writable(dst)) != UM_OK)
    return st;
  op = um__event_new(dst->m, UM__OP_FILL);
  if (op == NULL)
    return um__set_error(UM_ENOMEM, "out of memory for an operation");
  op->dst = dst, op->dst_off = off, op->dst_gen = gen, op->bytes = bytes;
  op->value = (unsigned char)byte;
  return um__op_issue(op, done);
}

/* A mapped buffer refuses operations (um__op_issue says so too); checked
 * here as well so that a batch is refused before any of its ops is issued. */
static int check_unmapped(um_buffer *b) {
  bool mapped;
  pthread_mutex_lock(&b->lock);
  mapped = b->mapped;
  pthread_mutex_unlock(&b->lock);
  if (mapped)
    return um__set_error(UM_ESTATE, "buffer %p is mapped: unmap it first", (void *)b);
  return UM_OK;
}

static int check_op(um_manager *m, const um_copy_op *o) {
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
  if (o->dst && (st = check_unmapped(o->dst)) != UM_OK)
    return st;
  if (o->src && (st = check_unmapped(o->src)) != UM_OK)
    return st;
  return UM_OK;
}

int um_copy_batch(um_manager *m, const um_copy_op *ops, size_t n, um_event **done) {
  um_event *group;
  int st;
  if (m == NULL || (ops == NULL && n > 0))
    return um__set_error(UM_EINVAL, "um_copy_batch: NULL argument");
  if (n == 0)
    return um__set_error(UM_EINVAL, "um_copy_batch: empty batch");
  UM__CHECK_PROCESS(m);
  for (size_t i = 0; i < n; i++)
    if ((st = check_op(m, &ops[i])) != UM_OK)
      return st;
  group = um__event_new(m, UM__OP_GROUP);
  if (group == NULL)
    return um__set_error(UM_ENOMEM, "out of memory for a batch");
  atomic_store(&group->deps_pending, 1); /* guard until every op is issued */
  atomic_store_explicit(&group->state, UM__EV_RUNNING, memory_order_release);
  um__atomic_add_relaxed(&m->engine.inflight, 1);
  um__event_ref(group); /* this function's reference */
  for (size_t i = 0; i < n; i++) {
    const um_copy_op *o = &ops[i];
    um_event *member = NULL;
    um__atomic_add_relaxed(&group->deps_pending, 1);
    st = copy_common(m, o->dst, o->dst_off, o->src, o->src_off, o->host_src, o->host_dst, o->bytes,
                     group, &member);
    if (st != UM_OK) {
      /* Not issued (a buffer released meanwhile): record, keep going. */
      int expected = UM_OK;
      atomic_compare_exchange_strong(&group->group_first_error, &expected, st);
      um__atomic_sub_relaxed(&group->deps_pending, 1);
      continue;
    }
    um_event_release(member);
  }
  if (um__atomic_sub_acq_rel(&group->deps_pending, 1) == 1)
    um__op_complete(group, atomic_load(&group->group_first_error));
  if (done == NULL) {
    st = um__event_wait_internal(group);
    um__event_unref(group);
    return st;
  }
  atomic_store_explicit(&group->caller_holds, true, memory_order_relaxed);
  *done = group;
  return UM_OK;
}
