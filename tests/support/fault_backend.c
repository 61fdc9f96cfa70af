/* The fault-injecting test backend (see fault_backend.h for what it offers).
 *
 * Device memory is ordinary heap memory the core never sees directly: a
 * DEVICE block's um__mem has no host view, only a handle to a fault_block,
 * and every byte moves through xfer/xfer_async/map. New DEVICE blocks are
 * filled with 0xA5, as real device memory holds junk, so that a missing
 * zero-fill or a read of bytes never written shows up in the tests.
 *
 * The backend also checks what the core hands it: a range outside a block,
 * a token of another device or one already released, a block mapped twice.
 * Those are bugs in the core, and the backend aborts on them so that a test
 * or the fuzzer stops right there.
 */
#include "fault_backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FAULT_MAX_DEVICES 4
#define FAULT_JUNK 0xA5

typedef struct fault_ctx fault_ctx;
typedef struct fault_dev fault_dev;

typedef struct fault_block {
  fault_dev *dev;
  um_location loc;
  size_t bytes;
  unsigned char *data;
  /* the one mapping the core may hold on it (mapped flavour) */
  unsigned char *map_buf;
  size_t map_off, map_len;
  um_map_mode map_mode;
} fault_block;

typedef struct fault_job {
  fault_dev *dev;
  um__xfer x;
  um__done_fn done; /* NULL: a quiet transfer (single-queue flavour) */
  void *arg;
  int inject; /* status to fail with when it runs; UM_OK: none */
  uint64_t seq;
  atomic_int refs; /* the token's (native_release), if any, and the queue's */
  struct fault_job *next;
} fault_job;

struct fault_dev {
  fault_ctx *ctx;
  int index;
  atomic_bool lost;
  atomic_uint_fast64_t live_bytes;
  atomic_uint_fast64_t live_blocks;
  uint64_t total;
  /* the queue of asynchronous transfers, run in order by one thread */
  pthread_mutex_t lock;
  pthread_cond_t cond;
  pthread_cond_t idle;
  fault_job *head, *tail;
  bool busy, stopping, has_thread;
  bool held; /* fault_hold: the queue starts nothing */
  /* fault_hold_report: the next report is to be kept (armed), and the
   * one kept (done non-NULL), until fault_release_report; under lock */
  bool report_armed;
  struct {
    um__done_fn done;
    void *arg;
    int status;
  } kept;
  atomic_uint_fast64_t reports; /* done calls made */
  uint64_t next_seq;
  /* fault-queue: the first failure of a quiet transfer since the last
   * queue mark, which reports it (or a synchronize, when no mark was
   * queued after it); touched by the thread that holds busy, or under
   * lock with the queue idle */
  int quiet_failure;
  pthread_t thread;
};

struct fault_ctx {
  const um__backend *be;
  int n;
  fault_dev devs[FAULT_MAX_DEVICES];
};

/* ------------------------------------------------------------------------ */
/* The plan */

static struct {
  pthread_mutex_t lock;
  int devices;
  uint64_t total;
  uint64_t allocs, xfers, injected_allocs, injected_xfers;
  uint64_t alloc_at;
  bool alloc_sticky;
  uint64_t xfer_at;
  bool xfer_sticky;
  int xfer_status;
  bool xfer_at_submit;
  bool paused;
} plan = {.lock = PTHREAD_MUTEX_INITIALIZER, .devices = 1, .total = 256u << 20};

static atomic_uint_fast64_t all_live_blocks, all_live_bytes, all_leaked_at_close, all_synchronizes;
static atomic_bool refuse_mark; /* fault_refuse_next_mark */

void fault_configure(int devices_per_backend, uint64_t total_bytes) {
  pthread_mutex_lock(&plan.lock);
  plan.devices = devices_per_backend < 1                   ? 1
                 : devices_per_backend > FAULT_MAX_DEVICES ? FAULT_MAX_DEVICES
                                                           : devices_per_backend;
  plan.total = total_bytes;
  pthread_mutex_unlock(&plan.lock);
}

void fault_reset(void) {
  pthread_mutex_lock(&plan.lock);
  plan.allocs = plan.xfers = plan.injected_allocs = plan.injected_xfers = 0;
  plan.alloc_at = plan.xfer_at = 0;
  plan.alloc_sticky = plan.xfer_sticky = plan.xfer_at_submit = plan.paused = false;
  plan.xfer_status = UM_OK;
  pthread_mutex_unlock(&plan.lock);
  atomic_store(&refuse_mark, false);
}

void fault_fail_alloc(uint64_t nth, bool sticky) {
  pthread_mutex_lock(&plan.lock);
  plan.alloc_at = nth;
  plan.alloc_sticky = sticky;
  pthread_mutex_unlock(&plan.lock);
}

void fault_fail_xfer(uint64_t nth, bool sticky, int status, bool at_submit) {
  pthread_mutex_lock(&plan.lock);
  plan.xfer_at = nth;
  plan.xfer_sticky = sticky;
  plan.xfer_status = status;
  plan.xfer_at_submit = at_submit;
  pthread_mutex_unlock(&plan.lock);
}

void fault_disarm(void) {
  pthread_mutex_lock(&plan.lock);
  plan.alloc_at = plan.xfer_at = 0;
  pthread_mutex_unlock(&plan.lock);
}

void fault_pause(bool paused) {
  pthread_mutex_lock(&plan.lock);
  plan.paused = paused;
  pthread_mutex_unlock(&plan.lock);
}

void fault_counts_get(fault_counts *out) {
  pthread_mutex_lock(&plan.lock);
  out->allocs = plan.allocs;
  out->xfers = plan.xfers;
  out->injected_allocs = plan.injected_allocs;
  out->injected_xfers = plan.injected_xfers;
  pthread_mutex_unlock(&plan.lock);
  out->live_blocks = atomic_load(&all_live_blocks);
  out->live_bytes = atomic_load(&all_live_bytes);
  out->leaked_at_close = atomic_load(&all_leaked_at_close);
  out->synchronizes = atomic_load(&all_synchronizes);
}

static bool planned(uint64_t count, uint64_t at, bool sticky) {
  return at != 0 && (count == at || (sticky && count > at));
}

/* Count one allocation; UM_ENOMEM when the plan fails it. */
static int count_alloc(void) {
  int st = UM_OK;
  pthread_mutex_lock(&plan.lock);
  if (!plan.paused) {
    plan.allocs++;
    if (planned(plan.allocs, plan.alloc_at, plan.alloc_sticky)) {
      plan.injected_allocs++;
      st = um__set_error(UM_ENOMEM, "fault: allocation %llu fails by plan",
                         (unsigned long long)plan.allocs);
    }
  }
  pthread_mutex_unlock(&plan.lock);
  return st;
}

/* Count one transfer; the status it must fail with (UM_OK: none) and
 * whether an asynchronous one is refused at submission. */
static int count_xfer(bool *at_submit) {
  int st = UM_OK;
  pthread_mutex_lock(&plan.lock);
  *at_submit = false;
  if (!plan.paused) {
    plan.xfers++;
    if (planned(plan.xfers, plan.xfer_at, plan.xfer_sticky)) {
      plan.injected_xfers++;
      st = plan.xfer_status;
      *at_submit = plan.xfer_at_submit;
      um__set_error(st, "fault: transfer %llu fails by plan", (unsigned long long)plan.xfers);
    }
  }
  pthread_mutex_unlock(&plan.lock);
  return st;
}

static int lost_error(const fault_dev *d) {
  return um__set_error(UM_ENODEV, "fault: device %d was lost", d->index);
}

static void core_bug(const char *what) {
  fprintf(stderr, "fault backend: the core broke the backend contract: %s\n", what);
  abort();
}

/* ------------------------------------------------------------------------ */
/* Moving bytes */

static fault_block *block_of(const um__mem *mem) {
  fault_block *b = mem->priv;
  if (b == NULL || (uintptr_t)b != mem->handle)
    core_bug("a block the backend never gave");
  return b;
}

static unsigned char *range(const um__mem *mem, size_t off, size_t bytes) {
  fault_block *b = block_of(mem);
  if (bytes == 0 || off > b->bytes || bytes > b->bytes - off)
    core_bug("a transfer outside its block");
  return b->data + off;
}

static int run_xfer(fault_dev *d, const um__xfer *x) {
  if (atomic_load(&d->lost))
    return lost_error(d);
  switch (x->kind) {
  case UM__XFER_H2D:
    memcpy(range(x->dst, x->dst_off, x->bytes), x->host, x->bytes);
    return UM_OK;
  case UM__XFER_D2H:
    memcpy(x->host, range(x->src, x->src_off, x->bytes), x->bytes);
    return UM_OK;
  case UM__XFER_D2D:
    memmove(range(x->dst, x->dst_off, x->bytes), range(x->src, x->src_off, x->bytes), x->bytes);
    return UM_OK;
  case UM__XFER_FILL:
    memset(range(x->dst, x->dst_off, x->bytes), x->value, x->bytes);
    return UM_OK;
  case UM__XFER_PEER: {
    fault_dev *s = x->src_bdev;
    if (s == NULL || s->ctx != d->ctx || block_of(x->src)->dev != s)
      core_bug("a peer copy from a device that is not the source's");
    if (atomic_load(&s->lost))
      return lost_error(s);
    memmove(range(x->dst, x->dst_off, x->bytes), range(x->src, x->src_off, x->bytes), x->bytes);
    return UM_OK;
  }
  case UM__XFER_QUEUE_MARK: /* its place in the queue is the whole job */
    if (d->ctx->be->single_queue)
      return UM_OK;
    break;
  case UM__XFER_MARKER:
    break;
  }
  return um__set_error(UM_ENOTSUP, "fault: transfer kind %d", (int)x->kind);
}

/* ------------------------------------------------------------------------ */
/* The queue thread of the asynchronous flavour */

static void job_unref(fault_job *j) {
  if (atomic_fetch_sub(&j->refs, 1) == 1)
    free(j);
}

/* A transfer's done, unless fault_hold_report asked for this one to be
 * kept: then its report waits for fault_release_report, while the jobs
 * behind it run and report. */
static void report(fault_dev *d, um__done_fn done, void *arg, int st) {
  bool keep;
  pthread_mutex_lock(&d->lock);
  keep = d->report_armed;
  if (keep) {
    d->report_armed = false;
    d->kept.done = done;
    d->kept.arg = arg;
    d->kept.status = st;
  }
  pthread_mutex_unlock(&d->lock);
  if (keep)
    return;
  atomic_fetch_add(&d->reports, 1);
  done(arg, st);
}

/* Run j, whoever runs it (the queue thread, or the submitting thread of
 * the inline flavour): with d->busy set, so one at a time, in order. */
static void job_run(fault_dev *d, fault_job *j) {
  int st;
  if (j->x.kind == UM__XFER_QUEUE_MARK) {
    /* The mark reports the quiet ones before it, and takes their failure
     * with it when it fails by itself: the next mark reports only what
     * was queued after this one. */
    st = j->inject != UM_OK ? j->inject : d->quiet_failure;
    d->quiet_failure = UM_OK;
  } else {
    st = j->inject != UM_OK ? j->inject : run_xfer(d, &j->x);
  }
  if (j->done != NULL)
    report(d, j->done, j->arg, st);
  else if (st != UM_OK && d->quiet_failure == UM_OK)
    d->quiet_failure = st; /* a quiet transfer: its mark reports it */
  job_unref(j);
}

/* Under d->lock, after job_run: the next job may start (inline: the
 * queue thread waits while an inline run is busy). */
static void job_finished_locked(fault_dev *d, bool inline_run) {
  d->busy = false;
  if (d->head == NULL)
    pthread_cond_broadcast(&d->idle);
  if (inline_run)
    pthread_cond_signal(&d->cond);
}

static void *queue_main(void *arg) {
  fault_dev *d = arg;
  pthread_mutex_lock(&d->lock);
  for (;;) {
    fault_job *j;
    while (d->busy || ((d->head == NULL || d->held) && !d->stopping))
      pthread_cond_wait(&d->cond, &d->lock);
    if (d->head == NULL)
      break;
    j = d->head;
    d->head = j->next;
    if (d->head == NULL)
      d->tail = NULL;
    d->busy = true;
    pthread_mutex_unlock(&d->lock);
    job_run(d, j);
    pthread_mutex_lock(&d->lock);
    job_finished_locked(d, false);
  }
  pthread_mutex_unlock(&d->lock);
  return NULL;
}

/* ------------------------------------------------------------------------ */
/* The contract */

static int open_common(const um__backend *be, const um_options *opts, void **ctx, int *count) {
  fault_ctx *c = calloc(1, sizeof(*c));
  (void)opts;
  if (c == NULL)
    return um__set_error(UM_ENOMEM, "fault: out of memory");
  pthread_mutex_lock(&plan.lock);
  c->n = plan.devices;
  for (int i = 0; i < c->n; i++)
    c->devs[i].total = plan.total;
  pthread_mutex_unlock(&plan.lock);
  c->be = be;
  for (int i = 0; i < c->n; i++) {
    fault_dev *d = &c->devs[i];
    d->ctx = c;
    d->index = i;
    atomic_init(&d->lost, false);
    atomic_init(&d->live_bytes, 0);
    atomic_init(&d->live_blocks, 0);
    pthread_mutex_init(&d->lock, NULL);
    pthread_cond_init(&d->cond, NULL);
    pthread_cond_init(&d->idle, NULL);
    if (be->xfer_async != NULL) {
      if (pthread_create(&d->thread, NULL, queue_main, d) != 0) {
        /* close() joins the threads that started */
        c->n = i + 1;
        *ctx = c;
        return um__set_error(UM_ENOMEM, "fault: cannot start a queue thread");
      }
      d->has_thread = true;
    }
  }
  *ctx = c;
  *count = c->n;
  return UM_OK;
}

static int fault_open(const um_options *opts, void **ctx, int *count) {
  return open_common(&fault_backend, opts, ctx, count);
}

static int fault_map_open(const um_options *opts, void **ctx, int *count) {
  return open_common(&fault_backend_mapped, opts, ctx, count);
}

static int fault_queue_open(const um_options *opts, void **ctx, int *count) {
  return open_common(&fault_backend_queue, opts, ctx, count);
}

static int fault_inline_open(const um_options *opts, void **ctx, int *count) {
  return open_common(&fault_backend_inline, opts, ctx, count);
}

static int fault_describe(void *ctx, int i, um__bdev_desc *out) {
  fault_ctx *c = ctx;
  memset(out, 0, sizeof(*out));
  snprintf(out->name, sizeof(out->name), "%s device %d", c->be->name, i);
  out->caps = UM_CAP_PINNED | (c->n > 1 ? UM_CAP_PEER : 0u) |
              (c->be->xfer_async != NULL ? UM_CAP_ASYNC : 0u);
  out->locations = (1u << UM_DEVICE) | (1u << UM_PINNED);
  out->total_bytes = c->devs[i].total;
  out->bdev = &c->devs[i];
  return UM_OK;
}

static void fault_close(void *ctx) {
  fault_ctx *c = ctx;
  for (int i = 0; i < c->n; i++) {
    fault_dev *d = &c->devs[i];
    uint64_t left;
    if (d->has_thread) {
      pthread_mutex_lock(&d->lock);
      d->stopping = true;
      pthread_cond_signal(&d->cond);
      pthread_mutex_unlock(&d->lock);
      pthread_join(d->thread, NULL);
    }
    left = atomic_load(&d->live_blocks);
    if (left != 0) {
      fprintf(stderr, "fault backend: %s device %d closed with %llu blocks never freed\n",
              c->be->name, i, (unsigned long long)left);
      atomic_fetch_add(&all_leaked_at_close, left);
    }
    pthread_mutex_destroy(&d->lock);
    pthread_cond_destroy(&d->cond);
    pthread_cond_destroy(&d->idle);
  }
  free(c);
}

static int fault_mem_alloc(void *bdev, um_location loc, size_t bytes, um__mem *out) {
  fault_dev *d = bdev;
  fault_block *b;
  int st = count_alloc();
  if (st != UM_OK)
    return st;
  if (atomic_load(&d->lost))
    return lost_error(d);
  if (loc != UM_DEVICE && loc != UM_PINNED)
    core_bug("an allocation at a location the device does not offer");
  if (bytes > d->total || atomic_load(&d->live_bytes) + bytes > d->total)
    return um__set_error(UM_ENOMEM, "fault: device %d is full (%llu of %llu bytes used)", d->index,
                         (unsigned long long)atomic_load(&d->live_bytes), (unsigned long long)d->total);
  b = calloc(1, sizeof(*b));
  if (b == NULL || (b->data = malloc(bytes)) == NULL) {
    free(b);
    return um__set_error(UM_ENOMEM, "fault: host memory for %zu bytes", bytes);
  }
  if (loc == UM_DEVICE)
    memset(b->data, FAULT_JUNK, bytes);
  b->dev = d;
  b->loc = loc;
  b->bytes = bytes;
  atomic_fetch_add(&d->live_bytes, bytes);
  atomic_fetch_add(&d->live_blocks, 1);
  atomic_fetch_add(&all_live_bytes, bytes);
  atomic_fetch_add(&all_live_blocks, 1);
  out->host = loc == UM_PINNED ? b->data : NULL;
  out->handle = (uintptr_t)b;
  out->priv = b;
  return UM_OK;
}

static void fault_mem_free(void *bdev, um_location loc, size_t bytes, um__mem *mem) {
  fault_dev *d = bdev;
  fault_block *b = block_of(mem);
  if (b->dev != d || b->loc != loc || b->bytes != bytes)
    core_bug("a free with another device, location or size than the allocation");
  atomic_fetch_sub(&d->live_bytes, bytes);
  atomic_fetch_sub(&d->live_blocks, 1);
  atomic_fetch_sub(&all_live_bytes, bytes);
  atomic_fetch_sub(&all_live_blocks, 1);
  free(b->map_buf);
  free(b->data);
  free(b);
  memset(mem, 0, sizeof(*mem));
}

static int fault_memory(void *bdev, uint64_t *free_bytes, uint64_t *total_bytes) {
  fault_dev *d = bdev;
  uint64_t used = atomic_load(&d->live_bytes);
  if (atomic_load(&d->lost))
    return lost_error(d);
  *free_bytes = used < d->total ? d->total - used : 0;
  *total_bytes = d->total;
  return UM_OK;
}

/* Waits for everything queued. On a single-queue flavour it also reports,
 * and clears, the failure of quiet transfers that no mark reported (their
 * mark was refused): it waited for them, and the next mark must report
 * only what was queued after it. */
static int fault_synchronize(void *bdev) {
  fault_dev *d = bdev;
  int quiet = UM_OK;
  atomic_fetch_add(&all_synchronizes, 1);
  if (d->has_thread) {
    pthread_mutex_lock(&d->lock);
    while (d->head != NULL || d->busy)
      pthread_cond_wait(&d->idle, &d->lock);
    quiet = d->quiet_failure; /* nobody runs a job: no thread touches it */
    d->quiet_failure = UM_OK;
    pthread_mutex_unlock(&d->lock);
  }
  if (atomic_load(&d->lost))
    return lost_error(d);
  return quiet == UM_OK ? UM_OK : um__set_error(quiet, "fault: a quiet transfer failed before the synchronize");
}

static int fault_xfer(void *bdev, const um__xfer *x) {
  bool at_submit;
  int st = count_xfer(&at_submit);
  if (st != UM_OK)
    return st;
  return run_xfer(bdev, x);
}

/* Queue a transfer on d (inject: the status it fails with when it runs).
 * A token (*native) when native is not NULL. here_if_idle: run it on this
 * thread instead when d's queue is idle. */
static int queue_push(fault_dev *d, const um__xfer *x, void *const *after, int nafter,
                      um__done_fn done, void *arg, void **native, int inject, bool here_if_idle) {
  fault_job *j = calloc(1, sizeof(*j));
  if (j == NULL)
    return um__set_error(UM_ENOMEM, "fault: out of memory for a transfer");
  j->dev = d;
  j->x = *x;
  j->done = done;
  j->arg = arg;
  j->inject = inject;
  atomic_init(&j->refs, native != NULL ? 2 : 1);
  if (native != NULL)
    *native = j;
  pthread_mutex_lock(&d->lock);
  j->seq = d->next_seq++;
  for (int i = 0; i < nafter; i++)
    if (((fault_job *)after[i])->seq >= j->seq)
      core_bug("a wait-list token issued after the transfer waiting for it");
  if (here_if_idle && d->head == NULL && !d->busy && !d->held) {
    /* An idle queue: the transfer runs here, now, and its done with it,
     * before the call returns (nothing is queued or running to keep its
     * place in line). */
    d->busy = true;
    pthread_mutex_unlock(&d->lock);
    job_run(d, j);
    pthread_mutex_lock(&d->lock);
    job_finished_locked(d, true);
    pthread_mutex_unlock(&d->lock);
    return UM_OK;
  }
  if (d->tail)
    d->tail->next = j;
  else
    d->head = j;
  d->tail = j;
  pthread_cond_signal(&d->cond);
  pthread_mutex_unlock(&d->lock);
  return UM_OK;
}

static int fault_xfer_async(void *bdev, const um__xfer *x, void *const *after, int nafter,
                            um__done_fn done, void *arg, void **native) {
  fault_dev *d = bdev;
  bool quiet = done == NULL && native == NULL;
  bool at_submit;
  int st;
  for (int i = 0; i < nafter; i++) {
    fault_job *a = after[i];
    if (a == NULL || a->dev != d || atomic_load(&a->refs) < 1)
      core_bug("a wait-list token of another device, or one already released");
  }
  if ((quiet || x->kind == UM__XFER_QUEUE_MARK) && !d->ctx->be->single_queue)
    core_bug("a quiet transfer or a queue mark on a backend that is not single-queue");
  if (quiet && (nafter != 0 || x->kind == UM__XFER_QUEUE_MARK))
    core_bug("a quiet transfer with a wait list, or a quiet queue mark");
  if (!quiet && (done == NULL || native == NULL))
    core_bug("an asynchronous transfer without done or token");
  if (x->kind == UM__XFER_QUEUE_MARK && atomic_exchange(&refuse_mark, false))
    return um__set_error(UM_EBACKEND, "fault: queue mark refused");
  st = count_xfer(&at_submit);
  if (st != UM_OK && at_submit)
    return st;
  if (atomic_load(&d->lost))
    return lost_error(d);
  return queue_push(d, x, after, nafter, done, arg, native, st, d->ctx->be == &fault_backend_inline);
}

/* One transfer in flight through the queue, for the synchronous xfer of
 * the single-queue flavour. */
typedef struct sync_job {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  bool done;
  int st;
} sync_job;

static void sync_job_done(void *arg, int st) {
  sync_job *s = arg;
  pthread_mutex_lock(&s->lock);
  s->done = true;
  s->st = st;
  pthread_cond_signal(&s->cond);
  pthread_mutex_unlock(&s->lock);
}

/* A synchronous transfer runs through the device's queue, behind what is
 * queued there, as a blocking call does on an in-order OpenCL queue; on
 * this thread when the queue is idle (as a driver that copies on the
 * calling thread does), which spares two thread hand-offs. */
static int fault_queue_xfer(void *bdev, const um__xfer *x) {
  fault_dev *d = bdev;
  sync_job s = {.done = false, .st = UM_OK};
  bool at_submit;
  int st = count_xfer(&at_submit);
  if (st != UM_OK)
    return st;
  if (atomic_load(&d->lost))
    return lost_error(d);
  pthread_mutex_init(&s.lock, NULL);
  pthread_cond_init(&s.cond, NULL);
  st = queue_push(d, x, NULL, 0, sync_job_done, &s, NULL, UM_OK, true);
  pthread_mutex_lock(&s.lock);
  while (st == UM_OK && !s.done)
    pthread_cond_wait(&s.cond, &s.lock);
  pthread_mutex_unlock(&s.lock);
  pthread_mutex_destroy(&s.lock);
  pthread_cond_destroy(&s.cond);
  return st != UM_OK ? st : s.st;
}

static void fault_native_release(void *bdev, void *native) {
  fault_job *j = native;
  if (j == NULL || j->dev != bdev)
    core_bug("a token released on another device");
  job_unref(j);
}

static bool map_fetches(um_map_mode mode) { return mode != UM_MAP_WRITE_DISCARD; }
static bool map_writes(um_map_mode mode) { return mode != UM_MAP_READ; }

static int fault_map(void *bdev, um__mem *mem, um_location loc, size_t off, size_t len,
                     um_map_mode mode, void **host) {
  fault_dev *d = bdev;
  fault_block *b = block_of(mem);
  unsigned char *src = range(mem, off, len);
  (void)loc;
  if (b->map_buf != NULL)
    core_bug("a block mapped twice");
  if (map_fetches(mode)) {
    bool at_submit;
    int st = count_xfer(&at_submit);
    if (st != UM_OK)
      return st;
  }
  if (atomic_load(&d->lost))
    return lost_error(d);
  b->map_buf = malloc(len);
  if (b->map_buf == NULL)
    return um__set_error(UM_ENOMEM, "fault: no host memory for a mapping");
  if (map_fetches(mode))
    memcpy(b->map_buf, src, len);
  else
    memset(b->map_buf, FAULT_JUNK, len);
  b->map_off = off;
  b->map_len = len;
  b->map_mode = mode;
  *host = b->map_buf;
  return UM_OK;
}

static int fault_unmap(void *bdev, um__mem *mem, um_location loc, void *host) {
  fault_dev *d = bdev;
  fault_block *b = block_of(mem);
  int st = UM_OK;
  (void)loc;
  if (b->map_buf == NULL || host != b->map_buf)
    core_bug("an unmap of what is not mapped");
  if (map_writes(b->map_mode)) {
    bool at_submit;
    st = count_xfer(&at_submit);
    if (st == UM_OK && atomic_load(&d->lost))
      st = lost_error(d);
    if (st == UM_OK)
      memcpy(b->data + b->map_off, b->map_buf, b->map_len);
  } else if (atomic_load(&d->lost)) {
    st = lost_error(d);
  }
  free(b->map_buf);
  b->map_buf = NULL;
  return st;
}

static bool same_ctx(void *a, void *b) {
  return ((fault_dev *)a)->ctx == ((fault_dev *)b)->ctx;
}

static int fault_peer_possible(void *a, void *b) { return a != b && same_ctx(a, b); }

static int fault_peer_enable(void *a, void *b) {
  if (!fault_peer_possible(a, b))
    return um__set_error(UM_ENOTSUP, "fault: no peer access between these devices");
  if (atomic_load(&((fault_dev *)a)->lost))
    return lost_error(a);
  if (atomic_load(&((fault_dev *)b)->lost))
    return lost_error(b);
  return UM_OK;
}

const um__backend fault_backend = {
    .name = "fault",
    .open = fault_open,
    .describe = fault_describe,
    .close = fault_close,
    .mem_alloc = fault_mem_alloc,
    .mem_free = fault_mem_free,
    .memory = fault_memory,
    .synchronize = fault_synchronize,
    .xfer = fault_xfer,
    .xfer_async = fault_xfer_async,
    .native_release = fault_native_release,
    .peer_possible = fault_peer_possible,
    .peer_enable = fault_peer_enable,
};

const um__backend fault_backend_mapped = {
    .name = "fault-map",
    .open = fault_map_open,
    .describe = fault_describe,
    .close = fault_close,
    .mem_alloc = fault_mem_alloc,
    .mem_free = fault_mem_free,
    .memory = fault_memory,
    .synchronize = fault_synchronize,
    .xfer = fault_xfer,
    .map = fault_map,
    .unmap = fault_unmap,
    .peer_possible = fault_peer_possible,
    .peer_enable = fault_peer_enable,
};

/* One in-order queue per device, as OpenCL's: asynchronous transfers, quiet
 * ones and queue marks run on it in the order of the calls, and so do the
 * synchronous ones. Its callbacks may re-enter the core (callbacks_reenter),
 * so the core completes on the thread that reports a completion. The two
 * single-queue flavours differ only in where a transfer submitted to an
 * idle queue runs (queue_push's here_if_idle). */
#define FAULT_SINGLE_QUEUE(NAME, OPEN)                                                                    \
  {                                                                                                      \
    .name = NAME, .open = OPEN, .describe = fault_describe, .close = fault_close,                        \
    .mem_alloc = fault_mem_alloc, .mem_free = fault_mem_free, .memory = fault_memory,                    \
    .synchronize = fault_synchronize, .xfer = fault_queue_xfer, .xfer_async = fault_xfer_async,          \
    .native_release = fault_native_release, .peer_possible = fault_peer_possible,                        \
    .peer_enable = fault_peer_enable, .callbacks_reenter = 1, .single_queue = 1,                         \
  }

/* "fault-queue": an idle queue's transfer waits for the queue thread. */
const um__backend fault_backend_queue = FAULT_SINGLE_QUEUE("fault-queue", fault_queue_open);

/* "fault-inline": a transfer submitted to an idle queue (nothing queued,
 * nothing running, not held) runs on the submitting thread, its done
 * inside xfer_async, as PoCL's "basic" device does; behind queued work it
 * waits its turn on the queue thread. */
const um__backend fault_backend_inline = FAULT_SINGLE_QUEUE("fault-inline", fault_inline_open);

/* ------------------------------------------------------------------------ */
/* Test controls on devices */

bool fault_is_device(const um_device *d) {
  return d != NULL && (d->be == &fault_backend || d->be == &fault_backend_mapped ||
                       d->be == &fault_backend_queue || d->be == &fault_backend_inline);
}

int fault_lose(um_device *d) {
  if (!fault_is_device(d))
    return UM_EINVAL;
  atomic_store(&((fault_dev *)d->bdev)->lost, true);
  return UM_OK;
}

int fault_restore(um_device *d) {
  if (!fault_is_device(d))
    return UM_EINVAL;
  atomic_store(&((fault_dev *)d->bdev)->lost, false);
  return UM_OK;
}

void fault_refuse_next_mark(void) { atomic_store(&refuse_mark, true); }

bool fault_mark_refused(void) { return !atomic_load(&refuse_mark); }

/* d's fault_dev when it is a device of the asynchronous flavour. */
static fault_dev *queue_dev(um_device *d) {
  return fault_is_device(d) && ((fault_dev *)d->bdev)->has_thread ? d->bdev : NULL;
}

int fault_hold(um_device *d, bool held) {
  fault_dev *fd = queue_dev(d);
  if (fd == NULL)
    return UM_EINVAL;
  pthread_mutex_lock(&fd->lock);
  fd->held = held;
  pthread_cond_signal(&fd->cond);
  pthread_mutex_unlock(&fd->lock);
  return UM_OK;
}

int fault_hold_report(um_device *d) {
  fault_dev *fd = queue_dev(d);
  if (fd == NULL)
    return UM_EINVAL;
  pthread_mutex_lock(&fd->lock);
  fd->report_armed = true;
  pthread_mutex_unlock(&fd->lock);
  return UM_OK;
}

bool fault_release_report(um_device *d) {
  fault_dev *fd = queue_dev(d);
  um__done_fn done = NULL;
  void *arg = NULL;
  int st = UM_OK;
  if (fd == NULL)
    return false;
  pthread_mutex_lock(&fd->lock);
  if (fd->kept.done != NULL) {
    done = fd->kept.done;
    arg = fd->kept.arg;
    st = fd->kept.status;
    fd->kept.done = NULL;
  }
  pthread_mutex_unlock(&fd->lock);
  if (done == NULL)
    return false;
  atomic_fetch_add(&fd->reports, 1);
  done(arg, st);
  return true;
}

uint64_t fault_reports(um_device *d) {
  fault_dev *fd = queue_dev(d);
  return fd != NULL ? atomic_load(&fd->reports) : 0;
}

uint64_t fault_device_live_bytes(const um_device *d) {
  return fault_is_device(d) ? atomic_load(&((fault_dev *)d->bdev)->live_bytes) : 0;
}

void fault_test_options(um_options *o) {
  um_options_init(o);
  snprintf(o->backends, sizeof(o->backends), "cpu");
  o->trim_interval_ms = 0;
  o->log_level = UM_LOG_ERROR;
}

int fault_manager_create(const um_options *opts, um_manager **out) {
  return fault_manager_create_with(opts, &fault_backend, out);
}

int fault_manager_create_with(const um_options *opts, const um__backend *async, um_manager **out) {
  const um__backend *const both[] = {async, &fault_backend_mapped};
  if (async != &fault_backend && async != &fault_backend_queue && async != &fault_backend_inline)
    return um__set_error(UM_EINVAL, "fault_manager_create_with: not an asynchronous fault flavour");
  return um__manager_create_ex(opts, both, 2, out);
}

int fault_manager_create_queue(const um_options *opts, um_manager **out) {
  static const um__backend *const one[] = {&fault_backend_queue};
  return um__manager_create_ex(opts, one, 1, out);
}
