/* The paths that take several backend calls, run on a host thread (a
 * worker, or the caller's when it blocks): pageable host memory through
 * two pinned chunks, device to device through a host bounce chunk, and an
 * overlapping copy within one device buffer. Entries of path.c's table. */
#include <stdlib.h>
#include <string.h>

#include "ops.h"

/* use_pinned_staging 1 leaves out devices whose memory is host memory: for
 * them the chunks add a second copy of every byte (docs/design.md,
 * Decisions: "Pageable copies go direct"); 2 forces them in. */
static bool can_pipeline(const um_device *d, size_t bytes) {
  const um_options *o = &d->m->opts;
  return (o->use_pinned_staging == 2 || (o->use_pinned_staging == 1 && !d->host_memory)) &&
         um__dev_has_async(d) && (d->info.locations & (1u << UM_PINNED)) &&
         bytes > o->staging_chunk_bytes;
}

/* ------------------------------------------------------------------------ */
/* One chunk's DMA in flight */

typedef struct chunk_wait {
  um__chunk_latch latch;
  void *token;
} chunk_wait;

/* Wait for the chunk's DMA, if one was started; its status. */
static int chunk_finish(um_device *d, chunk_wait *w) {
  int st;
  if (w->token == NULL && !w->latch.busy)
    return UM_OK;
  st = um__chunk_latch_wait(&w->latch);
  if (w->token != NULL)
    um__dev_native_release(d, w->token);
  w->token = NULL;
  return st;
}

static int chunk_start(um_device *d, chunk_wait *w, const um__xfer *x) {
  int st;
  w->latch.busy = true;
  w->latch.status = UM_OK;
  st = um__dev_xfer_async(d, x, NULL, 0, um__chunk_latch_done, &w->latch, &w->token);
  if (st != UM_OK) {
    w->latch.busy = false;
    w->token = NULL;
  }
  return st;
}

/* ------------------------------------------------------------------------ */
/* Pageable host <-> device memory through two pinned chunks: the host copy
 * of chunk k+1 overlaps the DMA of chunk k. */

typedef struct pipe {
  um_device *d;
  um_buffer *buf; /* the device side */
  size_t off;     /* in buf */
  char *host;     /* the pageable side */
  size_t bytes, chunk;
  um__mem stage[2];
  chunk_wait w[2];
} pipe;

/* Both stages, or false (what was taken went back). */
static bool pipe_open(pipe *p) {
  int got;
  for (got = 0; got < 2; got++)
    if (um__staging_get(p->d, &p->stage[got]) != UM_OK)
      break;
  if (got < 2) {
    for (int i = 0; i < got; i++)
      um__staging_put(p->d, &p->stage[i]);
    return false;
  }
  for (int i = 0; i < 2; i++) {
    um__chunk_latch_init(&p->w[i].latch);
    p->w[i].token = NULL;
  }
  return true;
}

/* Wait for both chunks; st, or the first failure among them. */
static int pipe_close(pipe *p, int st) {
  for (int i = 0; i < 2; i++) {
    int fst = chunk_finish(p->d, &p->w[i]);
    if (st == UM_OK && fst != UM_OK)
      st = fst;
  }
  for (int i = 0; i < 2; i++) {
    um__chunk_latch_destroy(&p->w[i].latch);
    um__staging_put(p->d, &p->stage[i]);
  }
  return st;
}

static int pipe_to_device(pipe *p) {
  int st = UM_OK;
  for (size_t off = 0, k = 0; off < p->bytes && st == UM_OK; k++) {
    int s = (int)(k & 1);
    size_t n = p->bytes - off < p->chunk ? p->bytes - off : p->chunk;
    um__xfer x;
    /* Wait for this chunk's previous DMA before overwriting it; the other
     * chunk's DMA runs meanwhile. */
    if ((st = chunk_finish(p->d, &p->w[s])) != UM_OK)
      break;
    memcpy(p->stage[s].host, p->host + off, n);
    um__xfer_host(&x, UM__XFER_H2D, p->buf, p->off + off, p->stage[s].host, n);
    x.host_pinned = 1;
    st = chunk_start(p->d, &p->w[s], &x);
    off += n;
  }
  return st;
}

static int pipe_from_device(pipe *p) {
  size_t prev_off = 0, prev_n = 0, k = 0;
  int st = UM_OK;
  for (size_t off = 0; off < p->bytes && st == UM_OK; k++) {
    int s = (int)(k & 1);
    size_t n = p->bytes - off < p->chunk ? p->bytes - off : p->chunk;
    um__xfer x;
    um__xfer_host(&x, UM__XFER_D2H, p->buf, p->off + off, p->stage[s].host, n);
    x.host_pinned = 1;
    st = chunk_start(p->d, &p->w[s], &x);
    /* While chunk k arrives, copy chunk k-1 out of the other stage. */
    if (st == UM_OK && k > 0 && (st = chunk_finish(p->d, &p->w[s ^ 1])) == UM_OK)
      memcpy(p->host + prev_off, p->stage[s ^ 1].host, prev_n);
    prev_off = off;
    prev_n = n;
    off += n;
  }
  /* The last chunk went to the stage of the last iteration. */
  if (st == UM_OK && prev_n > 0 && (st = chunk_finish(p->d, &p->w[(k - 1) & 1])) == UM_OK)
    memcpy(p->host + prev_off, p->stage[(k - 1) & 1].host, prev_n);
  return st;
}

static int run_pipelined(um_event *op, bool to_device) {
  pipe p;
  um__xfer x;
  int st;
  memset(&p, 0, sizeof(p));
  p.buf = to_device ? op->dst : op->src;
  p.d = p.buf->dev;
  p.off = to_device ? op->copy.dst_off : op->copy.src_off;
  p.host = to_device ? um__path_host_src(op) : um__path_host_dst(op);
  p.bytes = op->bytes;
  p.chunk = p.d->m->opts.staging_chunk_bytes;
  if (!pipe_open(&p)) {
    /* No pinned memory to stage through: one direct call still works. */
    um__xfer_host(&x, to_device ? UM__XFER_H2D : UM__XFER_D2H, p.buf, p.off, p.host, p.bytes);
    return um__dev_xfer(p.d, &x);
  }
  st = to_device ? pipe_to_device(&p) : pipe_from_device(&p);
  return pipe_close(&p, st);
}

static int run_h2d_pipelined(um_event *op) { return run_pipelined(op, true); }
static int run_d2h_pipelined(um_event *op) { return run_pipelined(op, false); }

static bool plan_h2d_pipelined(um_event *op) {
  return op->kind == UM__OP_COPY && um__path_host_src(op) != NULL && um__path_host_dst(op) == NULL &&
         !um__path_dma_ready(op->src, op->dst->dev) && can_pipeline(op->dst->dev, op->bytes);
}

static bool plan_d2h_pipelined(um_event *op) {
  return op->kind == UM__OP_COPY && um__path_host_dst(op) != NULL && um__path_host_src(op) == NULL &&
         !um__path_dma_ready(op->dst, op->src->dev) && can_pipeline(op->src->dev, op->bytes);
}

UM__PATH_ACCOUNT(account_h2d_pipelined, dst, bytes_h2d, xfer_pipelined)
UM__PATH_ACCOUNT(account_d2h_pipelined, src, bytes_d2h, xfer_pipelined)

const um__path um__path_h2d_pipelined = {.name = "h2d-pipelined", .plan = plan_h2d_pipelined,
                                         .run = run_h2d_pipelined, .account = account_h2d_pipelined};
const um__path um__path_d2h_pipelined = {.name = "d2h-pipelined", .plan = plan_d2h_pipelined,
                                         .run = run_d2h_pipelined, .account = account_d2h_pipelined};

/* ------------------------------------------------------------------------ */
/* Device memory on one device to device memory on another without peer
 * access: through a host bounce chunk, pinned for the source when it can
 * be. Takes every copy no other path took. */

static int run_staged(um_event *op) {
  um_device *sd = op->src->dev, *dd = op->dst->dev;
  size_t chunk = op->m->opts.staging_chunk_bytes;
  um__mem stage;
  bool pinned = (sd->info.locations & (1u << UM_PINNED)) && um__staging_get(sd, &stage) == UM_OK;
  char *bounce = pinned ? stage.host : malloc(chunk);
  int st = UM_OK;
  if (bounce == NULL)
    return um__set_error(UM_ENOMEM, "staged copy: no bounce buffer");
  for (size_t off = 0; off < op->bytes && st == UM_OK;) {
    size_t n = op->bytes - off < chunk ? op->bytes - off : chunk;
    um__xfer x;
    um__xfer_host(&x, UM__XFER_D2H, op->src, op->copy.src_off + off, bounce, n);
    x.host_pinned = pinned;
    if ((st = um__dev_xfer(sd, &x)) != UM_OK)
      break;
    um__xfer_host(&x, UM__XFER_H2D, op->dst, op->copy.dst_off + off, bounce, n);
    st = um__dev_xfer(dd, &x);
    off += n;
  }
  if (pinned)
    um__staging_put(sd, &stage);
  else
    free(bounce);
  return st;
}

static bool plan_staged(um_event *op) { return op->kind == UM__OP_COPY; }

UM__PATH_ACCOUNT(account_staged, dst, bytes_peer, xfer_staged)

const um__path um__path_staged = {.name = "staged", .plan = plan_staged, .run = run_staged,
                                  .account = account_staged};

/* ------------------------------------------------------------------------ */
/* Overlapping ranges of one device buffer: device copy engines (and
 * clEnqueueCopyBuffer, cuMemcpyDtoD) refuse or corrupt them. memmove
 * semantics: the whole source range goes to the host first, then back to
 * its destination. */

static int run_overlap(um_event *op) {
  um_device *d = op->dst->dev;
  um__xfer x;
  char *tmp = malloc(op->bytes);
  int st;
  if (tmp == NULL)
    return um__set_error(UM_ENOMEM, "overlapping copy: no memory for %zu bytes", op->bytes);
  um__xfer_host(&x, UM__XFER_D2H, op->src, op->copy.src_off, tmp, op->bytes);
  st = um__dev_xfer(d, &x);
  if (st == UM_OK) {
    um__xfer_host(&x, UM__XFER_H2D, op->dst, op->copy.dst_off, tmp, op->bytes);
    st = um__dev_xfer(d, &x);
  }
  free(tmp);
  return st;
}

static bool plan_overlap(um_event *op) {
  return op->kind == UM__OP_COPY && op->src == op->dst && op->copy.src_off < op->copy.dst_off + op->bytes &&
         op->copy.dst_off < op->copy.src_off + op->bytes;
}

UM__PATH_ACCOUNT(account_overlap, dst, bytes_d2d, xfer_staged)

const um__path um__path_overlap = {.name = "overlap", .plan = plan_overlap, .run = run_overlap,
                                   .account = account_overlap};
