/* The net's staging thread: puts from and gets into buffers with no host
 * view (an OpenCL or CUDA DEVICE buffer), through two pinned host chunks.
 *
 * UCX here has no device-memory transports, so device bytes must pass
 * through host memory. A put copies chunk k+1 from the device (a blocking
 * backend transfer on this thread) while chunk k is on the network; a get
 * receives chunk k+1 while chunk k goes to the device. Jobs run one at a
 * time: one transfer at a time already keeps both the device copy and the
 * network busy.
 *
 * Chunks are PINNED blocks of the buffer's device (staging_chunk_bytes
 * each), kept by this thread for the net's life, two per device used; a
 * device with no pinned memory stages through malloc'd chunks.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "interop.h"
#include "net.h"
#include "list.h"

#define STAGER_DEVICES 16

typedef struct stage_job {
  struct stage_job *next;
  um__net_xfer x;
  um__done_fn done;
  void *arg;
  unsigned char key[]; /* copy of x.remote.key */
} stage_job;

/* Two chunks of one device. */
typedef struct stage_pair {
  um_device *dev;
  um__mem mem[2];
  bool pinned;
  size_t bytes;
} stage_pair;

struct um__net_stager {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  stage_job *head, *tail;
  bool stop;
  pthread_t thread;
  stage_pair pairs[STAGER_DEVICES]; /* this thread's only */
  int npairs;
};

/* One chunk's network transfer. */
typedef struct chunk_net {
  um__chunk_latch latch;
  char detail[256];
} chunk_net;

/* Wait for the chunk's transfer, if one is in flight. */
static int chunk_wait(chunk_net *c) { return um__chunk_latch_wait(&c->latch); }

static int chunk_send(const stage_job *j, chunk_net *c, void *host, size_t off, size_t n) {
  um__net_rma r;
  int st;
  r.dir = j->x.dir;
  r.local = host;
  r.bytes = n;
  r.remote_addr = j->x.remote.base + j->x.remote_off + off;
  r.key = j->x.remote.key;
  r.key_len = j->x.remote.key_len;
  r.detail = c->detail;
  r.detail_cap = sizeof(c->detail);
  pthread_mutex_lock(&c->latch.lock);
  c->latch.busy = true;
  pthread_mutex_unlock(&c->latch.lock);
  st = um__net_rma_start(j->x.ep, &r, um__chunk_latch_done, &c->latch);
  if (st != UM_OK) {
    pthread_mutex_lock(&c->latch.lock);
    c->latch.busy = false;
    pthread_mutex_unlock(&c->latch.lock);
    snprintf(c->detail, sizeof(c->detail), "%s", um_last_error());
  }
  return st;
}

/* The device side of one chunk, blocking: device -> host for a put,
 * host -> device for a get. */
static int chunk_device(const stage_job *j, const stage_pair *p, int s, size_t off, size_t n) {
  um_buffer *b = j->x.buf;
  um_device *d = b->dev;
  um__xfer x;
  int st;
  memset(&x, 0, sizeof(x));
  x.host = p->mem[s].host;
  x.host_pinned = p->pinned;
  x.bytes = n;
  if (j->x.dir == UM__NET_PUT) {
    x.kind = UM__XFER_D2H;
    x.src = &b->mem, x.src_loc = b->loc, x.src_off = j->x.buf_off + off;
  } else {
    x.kind = UM__XFER_H2D;
    x.dst = &b->mem, x.dst_loc = b->loc, x.dst_off = j->x.buf_off + off;
  }
  st = um__dev_xfer(d, &x);
  if (st == UM_OK && j->x.dir == UM__NET_PUT)
    UM__STAT_ADD(d, bytes_d2h, n);
  else if (st == UM_OK)
    UM__STAT_ADD(d, bytes_h2d, n);
  return st;
}

/* This thread's chunks for device d, made on first use. */
static int stage_pair_of(um__net_stager *s, um_device *d, stage_pair **out) {
  size_t chunk = d->m->opts.staging_chunk_bytes;
  stage_pair *p;
  for (int i = 0; i < s->npairs; i++)
    if (s->pairs[i].dev == d && s->pairs[i].bytes == chunk) {
      *out = &s->pairs[i];
      return UM_OK;
    }
  if (s->npairs == STAGER_DEVICES)
    return um__set_error(UM_ENOMEM, "staging: more than %d devices", STAGER_DEVICES);
  p = &s->pairs[s->npairs];
  memset(p, 0, sizeof(*p));
  p->dev = d;
  p->bytes = chunk;
  p->pinned = (d->info.locations & (1u << UM_PINNED)) != 0 && um__block_alloc(d, UM_PINNED, chunk, &p->mem[0]) == UM_OK;
  if (p->pinned && um__block_alloc(d, UM_PINNED, chunk, &p->mem[1]) != UM_OK) {
    um__block_free(d, UM_PINNED, chunk, &p->mem[0]);
    p->pinned = false;
  }
  if (!p->pinned) {
    memset(p->mem, 0, sizeof(p->mem));
    p->mem[0].host = malloc(chunk);
    p->mem[1].host = malloc(chunk);
    if (p->mem[0].host == NULL || p->mem[1].host == NULL) {
      free(p->mem[0].host);
      free(p->mem[1].host);
      return um__set_error(UM_ENOMEM, "staging: no memory for two chunks of %zu bytes", chunk);
    }
  }
  s->npairs++;
  *out = p;
  return UM_OK;
}

static void stage_pairs_free(um__net_stager *s) {
  for (int i = 0; i < s->npairs; i++) {
    stage_pair *p = &s->pairs[i];
    for (int k = 0; k < 2; k++) {
      if (p->pinned)
        um__block_free(p->dev, UM_PINNED, p->bytes, &p->mem[k]);
      else
        free(p->mem[k].host);
    }
  }
  s->npairs = 0;
}

/* Put: chunk k+1 comes off the device while chunk k is on the network. */
static int run_put(const stage_job *j, const stage_pair *p, chunk_net c[2]) {
  size_t chunk = p->bytes;
  int st = UM_OK;
  for (size_t off = 0, k = 0; off < j->x.bytes && st == UM_OK; k++) {
    int s = (int)(k & 1);
    size_t n = j->x.bytes - off < chunk ? j->x.bytes - off : chunk;
    /* The chunk's previous put (k-2) must be out before it is refilled. */
    if ((st = chunk_wait(&c[s])) != UM_OK)
      break;
    if ((st = chunk_device(j, p, s, off, n)) != UM_OK)
      break;
    st = chunk_send(j, &c[s], p->mem[s].host, off, n);
    off += n;
  }
  return st;
}

/* Get: chunk k+1 arrives while chunk k goes to the device. */
static int run_get(const stage_job *j, const stage_pair *p, chunk_net c[2]) {
  size_t chunk = p->bytes, prev_off = 0, prev_n = 0;
  int st = UM_OK;
  for (size_t off = 0, k = 0; off <= j->x.bytes && st == UM_OK; k++) {
    int s = (int)(k & 1);
    size_t n = j->x.bytes - off < chunk ? j->x.bytes - off : chunk;
    if (n > 0)
      st = chunk_send(j, &c[s], p->mem[s].host, off, n);
    if (st == UM_OK && k > 0) {
      st = chunk_wait(&c[s ^ 1]);
      if (st == UM_OK)
        st = chunk_device(j, p, s ^ 1, prev_off, prev_n);
    }
    if (n == 0)
      break;
    prev_off = off;
    prev_n = n;
    off += n;
  }
  return st;
}

static void job_run(um__net_stager *s, stage_job *j) {
  chunk_net c[2];
  stage_pair *p = NULL;
  int st = stage_pair_of(s, j->x.buf->dev, &p);
  if (st != UM_OK) {
    if (j->x.detail != NULL)
      snprintf(j->x.detail, j->x.detail_cap, "%s", um_last_error());
    j->done(j->arg, st);
    return;
  }
  for (int i = 0; i < 2; i++) {
    um__chunk_latch_init(&c[i].latch);
    c[i].detail[0] = '\0';
  }
  st = j->x.dir == UM__NET_PUT ? run_put(j, p, c) : run_get(j, p, c);
  /* Both chunks are idle before the job reports (and before they can
   * serve another job); their texts are read only then. */
  for (int i = 0; i < 2; i++) {
    int w = chunk_wait(&c[i]);
    if (st == UM_OK)
      st = w;
  }
  if (st != UM_OK && j->x.detail != NULL)
    snprintf(j->x.detail, j->x.detail_cap, "%s",
             c[0].detail[0] ? c[0].detail : c[1].detail[0] ? c[1].detail : um_last_error());
  for (int i = 0; i < 2; i++) {
    um__chunk_latch_destroy(&c[i].latch);
  }
  j->done(j->arg, st);
}

static void *stager_main(void *arg) {
  um__net_stager *s = arg;
  pthread_mutex_lock(&s->lock);
  for (;;) {
    stage_job *j;
    while (s->head == NULL && !s->stop)
      pthread_cond_wait(&s->cond, &s->lock);
    if (s->head == NULL)
      break;
    UM__QUEUE_POP(s->head, s->tail, j, next);
    pthread_mutex_unlock(&s->lock);
    job_run(s, j);
    free(j);
    pthread_mutex_lock(&s->lock);
  }
  pthread_mutex_unlock(&s->lock);
  stage_pairs_free(s);
  return NULL;
}

int um__net_stager_start(um__net_stager **out) {
  um__net_stager *s = calloc(1, sizeof(*s));
  if (s == NULL)
    return um__set_error(UM_ENOMEM, "out of memory for the staging thread");
  pthread_mutex_init(&s->lock, NULL);
  pthread_cond_init(&s->cond, NULL);
  if (pthread_create(&s->thread, NULL, stager_main, s) != 0) {
    pthread_mutex_destroy(&s->lock);
    pthread_cond_destroy(&s->cond);
    free(s);
    return um__set_error(UM_ENOMEM, "cannot start the network staging thread");
  }
  *out = s;
  return UM_OK;
}

void um__net_stager_stop(um__net_stager *s) {
  pthread_mutex_lock(&s->lock);
  s->stop = true;
  pthread_cond_signal(&s->cond);
  pthread_mutex_unlock(&s->lock);
  pthread_join(s->thread, NULL);
  pthread_mutex_destroy(&s->lock);
  pthread_cond_destroy(&s->cond);
  free(s);
}

int um__net_stager_submit(um__net_stager *s, const um__net_xfer *x, um__done_fn done, void *arg) {
  stage_job *j = malloc(sizeof(*j) + x->remote.key_len);
  if (j == NULL)
    return um__set_error(UM_ENOMEM, "out of memory for a staged transfer");
  j->next = NULL;
  j->x = *x;
  memcpy(j->key, x->remote.key, x->remote.key_len);
  j->x.remote.key = j->key;
  j->done = done;
  j->arg = arg;
  pthread_mutex_lock(&s->lock);
  UM__QUEUE_APPEND(s->head, s->tail, j, next);
  pthread_cond_signal(&s->cond);
  pthread_mutex_unlock(&s->lock);
  return UM_OK;
}
