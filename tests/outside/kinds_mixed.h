/* Every kind of operation on the same buffers, interleaved, against a host
 * model of every byte: the engine of test_kinds_mixed.c and
 * test_net_kinds_mixed.c (outside-in: the public header alone).
 *
 * An operation object (um_event) is recycled from a free list whatever its
 * kind: a copy's event may have been a bracket, a gate, a batch's group or
 * run, or a network transfer before. A field of one kind left behind in an
 * object that a later operation of another kind takes would show here as
 * wrong bytes, a wrong status, a wrong native event, a blocking call that
 * refuses or hangs, or a sanitizer report. So each worker issues, in a
 * seeded random order (KM_SEED, KM_STEPS override), on the same buffers of
 * every device of the profile:
 *   copies from and to host memory, buffer-to-buffer copies (one device,
 *   two devices, host <-> device, one buffer onto itself with overlapping
 *   ranges), fills, batches (good ones, and ones refused for a range, a
 *   read-only destination, a released buffer, a zero size, a malformed
 *   op), access brackets (read, write, read-write; the caller's own
 *   commands inside: host writes on the cpu device, OpenCL reads and
 *   writes on the caller's queue, CUDA copies on the caller's stream;
 *   released inside; begun twice; ended twice), maps of every mode,
 *   um_stream, um_event_native, cancels, waits, queries that give up
 *   before the work ends, events released before and after their
 *   operation ended, buffers released with work in flight and allocated
 *   again (the pool hands back the same handle), wraps released and
 *   wrapped again, and (test_net_kinds_mixed.c) um_net_put / um_net_get
 *   over a loopback endpoint;
 * and checks every status code exactly (and that um_last_error() has
 * text after a failure), every byte a copy brings back against the model,
 * and, at each synchronization point, every byte of every buffer.
 *
 * Workers: one, or several threads on one manager, each on buffers of its
 * own or on disjoint ranges of shared buffers. A worker never blocks while
 * it holds a bracket except on the bracket's own wait handle, and ends its
 * brackets oldest first, so the workload itself cannot deadlock: a hang is
 * the library's (the main thread bounds every run).
 *
 * Failure messages carry the seed, the step and the worker's last
 * operations: KM_SEED=<seed> KM_STEPS=<step+1> reproduces one. */
#ifndef KINDS_MIXED_H
#define KINDS_MIXED_H

#include "outside.h"

#include <dlfcn.h>
#include <stdarg.h>

#if defined(__has_include)
#if __has_include(<CL/cl.h>)
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#define KM_HAVE_CL_H 1
#endif
#endif

/* ------------------------------------------------------------------------ */
/* Random numbers (xorshift64*), one generator per worker */

typedef struct km_rng {
  uint64_t s;
} km_rng;

static OS_UNUSED uint64_t km_next(km_rng *r) {
  r->s ^= r->s >> 12;
  r->s ^= r->s << 25;
  r->s ^= r->s >> 27;
  return r->s * 2685821657736338717ull;
}
static OS_UNUSED size_t km_below(km_rng *r, size_t n) { return n == 0 ? 0 : (size_t)(km_next(r) % n); }
static OS_UNUSED bool km_chance(km_rng *r, unsigned pct) { return km_below(r, 100) < pct; }
static OS_UNUSED void km_fill_random(km_rng *r, uint8_t *p, size_t n) {
  uint64_t x = km_next(r);
  for (size_t i = 0; i < n; i++) {
    if ((i & 7) == 0)
      x = km_next(r);
    p[i] = (uint8_t)(x >> ((i & 7) * 8));
  }
}

static OS_UNUSED uint64_t km_env_u64(const char *name, uint64_t def) {
  const char *s = getenv(name);
  return s != NULL && *s != '\0' ? strtoull(s, NULL, 0) : def;
}

/* ------------------------------------------------------------------------ */
/* The caller's own native calls (brackets, um_event_native): OpenCL through
 * the ICD loader, CUDA through the driver unimem loaded (the fake one on
 * the fakecuda profile). Loaded with dlopen, as a client might. */

typedef enum { KM_CPU = 0, KM_OCL = 1, KM_CUDA = 2, KM_OTHER = 3 } km_bk;

#ifdef KM_HAVE_CL_H
typedef struct km_cl {
  bool ok;
  cl_int (*EnqueueWriteBuffer)(cl_command_queue, cl_mem, cl_bool, size_t, size_t, const void *, cl_uint,
                               const cl_event *, cl_event *);
  cl_int (*EnqueueReadBuffer)(cl_command_queue, cl_mem, cl_bool, size_t, size_t, void *, cl_uint,
                              const cl_event *, cl_event *);
  cl_int (*WaitForEvents)(cl_uint, const cl_event *);
  cl_int (*ReleaseEvent)(cl_event);
  cl_int (*GetEventInfo)(cl_event, cl_event_info, size_t, void *, size_t *);
  cl_command_queue (*CreateCommandQueue)(cl_context, cl_device_id, cl_command_queue_properties, cl_int *);
  cl_int (*ReleaseCommandQueue)(cl_command_queue);
  cl_int (*Finish)(cl_command_queue);
} km_cl;
static km_cl km_cl_fns;
#endif

typedef unsigned long long km_cuptr;
typedef struct km_cu {
  bool ok;
  int (*CtxSetCurrent)(void *);
  int (*StreamCreate)(void **, unsigned);
  int (*StreamDestroy)(void *);
  int (*StreamWaitEvent)(void *, void *, unsigned);
  int (*StreamSynchronize)(void *);
  int (*MemcpyHtoDAsync)(km_cuptr, const void *, size_t, void *);
  int (*MemcpyDtoHAsync)(void *, km_cuptr, size_t, void *);
  int (*EventCreate)(void **, unsigned);
  int (*EventRecord)(void *, void *);
  int (*EventSynchronize)(void *);
  int (*EventQuery)(void *);
  int (*EventDestroy)(void *);
} km_cu;
static km_cu km_cu_fns;

static OS_UNUSED void km_load_natives(void) {
#ifdef KM_HAVE_CL_H
  if (!km_cl_fns.ok) {
    void *h = dlopen("libOpenCL.so.1", RTLD_NOW);
    if (h != NULL) {
      km_cl *c = &km_cl_fns;
      *(void **)&c->EnqueueWriteBuffer = dlsym(h, "clEnqueueWriteBuffer");
      *(void **)&c->EnqueueReadBuffer = dlsym(h, "clEnqueueReadBuffer");
      *(void **)&c->WaitForEvents = dlsym(h, "clWaitForEvents");
      *(void **)&c->ReleaseEvent = dlsym(h, "clReleaseEvent");
      *(void **)&c->GetEventInfo = dlsym(h, "clGetEventInfo");
      *(void **)&c->CreateCommandQueue = dlsym(h, "clCreateCommandQueue");
      *(void **)&c->ReleaseCommandQueue = dlsym(h, "clReleaseCommandQueue");
      *(void **)&c->Finish = dlsym(h, "clFinish");
      c->ok = c->EnqueueWriteBuffer && c->EnqueueReadBuffer && c->WaitForEvents && c->ReleaseEvent &&
              c->GetEventInfo && c->CreateCommandQueue && c->ReleaseCommandQueue && c->Finish;
    }
  }
#endif
  if (!km_cu_fns.ok && getenv("UNIMEM_CUDA_LIBRARY") != NULL) {
    void *h = dlopen(getenv("UNIMEM_CUDA_LIBRARY"), RTLD_NOW);
    if (h != NULL) {
      km_cu *c = &km_cu_fns;
      *(void **)&c->CtxSetCurrent = dlsym(h, "cuCtxSetCurrent");
      *(void **)&c->StreamCreate = dlsym(h, "cuStreamCreate");
      *(void **)&c->StreamDestroy = dlsym(h, "cuStreamDestroy_v2");
      *(void **)&c->StreamWaitEvent = dlsym(h, "cuStreamWaitEvent");
      *(void **)&c->StreamSynchronize = dlsym(h, "cuStreamSynchronize");
      *(void **)&c->MemcpyHtoDAsync = dlsym(h, "cuMemcpyHtoDAsync_v2");
      *(void **)&c->MemcpyDtoHAsync = dlsym(h, "cuMemcpyDtoHAsync_v2");
      *(void **)&c->EventCreate = dlsym(h, "cuEventCreate");
      *(void **)&c->EventRecord = dlsym(h, "cuEventRecord");
      *(void **)&c->EventSynchronize = dlsym(h, "cuEventSynchronize");
      *(void **)&c->EventQuery = dlsym(h, "cuEventQuery");
      *(void **)&c->EventDestroy = dlsym(h, "cuEventDestroy_v2");
      c->ok = c->CtxSetCurrent && c->StreamCreate && c->StreamDestroy && c->StreamWaitEvent &&
              c->StreamSynchronize && c->MemcpyHtoDAsync && c->MemcpyDtoHAsync && c->EventCreate &&
              c->EventRecord && c->EventSynchronize && c->EventQuery && c->EventDestroy;
    }
  }
}

/* ------------------------------------------------------------------------ */
/* The manager of a profile: cpu, pocl, pocl2 (two PoCL pthread devices in
 * one platform), pocl-basic, fakecuda (the CUDA backend on the fake driver
 * that UNIMEM_CUDA_LIBRARY names). */

#define KM_MAXDEV 4

typedef struct km_dev {
  um_device *d;
  km_bk bk;
  um_device_info info;
  um_device_native nat;
} km_dev;

typedef struct km_env {
  um_manager *m;
  int ndev; /* dev[0] is the cpu device */
  km_dev dev[KM_MAXDEV];
} km_env;

static OS_UNUSED void km_options(um_options *o) {
  const char *p = os_profile();
  um_options_init(o);
  if (strcmp(p, "cpu") == 0) {
    snprintf(o->backends, sizeof(o->backends), "cpu");
  } else if (strcmp(p, "fakecuda") == 0) {
    snprintf(o->backends, sizeof(o->backends), "cpu,cuda");
  } else {
    snprintf(o->backends, sizeof(o->backends), "cpu,opencl");
    setenv("POCL_DEVICES",
           strcmp(p, "pocl-basic") == 0 ? "basic" : strcmp(p, "pocl2") == 0 ? "pthread pthread" : "pthread", 1);
  }
  o->enable_pooling = 1;
  o->trim_interval_ms = 0;
}

static OS_UNUSED void km_open(km_env *e, const um_options *o) {
  um_options def;
  int st, n;
  memset(e, 0, sizeof(*e));
  if (o == NULL) {
    km_options(&def);
    o = &def;
  }
  if (strcmp(os_profile(), "fakecuda") == 0 && getenv("UNIMEM_CUDA_LIBRARY") == NULL)
    cr_skip_test("profile fakecuda: UNIMEM_CUDA_LIBRARY does not name the fake driver");
  st = um_manager_create(o, &e->m);
  cr_assert_eq(st, UM_OK, "um_manager_create: %s: %s", um_err_name(st), um_last_error());
  n = um_device_count(e->m);
  if (strcmp(os_profile(), "cpu") != 0 && n < 2) {
    um_manager_destroy(e->m);
    cr_skip_test("profile %s: no accelerator device", os_profile());
  }
  if (strcmp(os_profile(), "pocl2") == 0 && n < 3) {
    um_manager_destroy(e->m);
    cr_skip_test("profile pocl2: fewer than two OpenCL devices");
  }
  e->ndev = n < KM_MAXDEV ? n : KM_MAXDEV;
  km_load_natives();
  for (int i = 0; i < e->ndev; i++) {
    km_dev *d = &e->dev[i];
    d->d = um_device_get(e->m, i);
    cr_assert_not_null(d->d);
    cr_assert_eq(um_device_info_get(d->d, &d->info), UM_OK);
    cr_assert_eq(um_device_native_get(d->d, &d->nat), UM_OK, "%s", um_last_error());
    if (strcmp(d->info.backend, "cpu") == 0)
      d->bk = KM_CPU;
#ifdef KM_HAVE_CL_H
    else if (strcmp(d->info.backend, "opencl") == 0 && km_cl_fns.ok)
      d->bk = KM_OCL;
#endif
    else if (strcmp(d->info.backend, "cuda") == 0 && km_cu_fns.ok)
      d->bk = KM_CUDA;
    else
      d->bk = KM_OTHER;
  }
}

/* ------------------------------------------------------------------------ */
/* Workers */

#define KM_MAXV 24
#define KM_LOG 40
#define KM_MAXBR 2
#define KM_MAXPEND 40

/* A range of a buffer that one worker owns, and the model of its bytes. */
typedef struct km_view {
  um_buffer *b;
  int dev; /* index in env->dev */
  um_location loc;
  size_t bsize;      /* the buffer's size */
  size_t base, len;  /* the worker's range */
  uint8_t *model;    /* len bytes */
  uint8_t *wrap_mem; /* a wrap's memory (bsize bytes), NULL otherwise */
  bool live, shared, ro, bracketable;
  unsigned taint; /* bits of open brackets its operations surely wait for */
  unsigned maybe; /* bits they may wait for (through a batch) */
} km_view;

typedef enum { KM_N_ANY = 0, KM_N_WRITE, KM_N_READ, KM_N_HOSTONLY } km_nkind;

/* An operation issued with an event, or the caller's own native commands
 * of a bracket, not yet checked. */
typedef struct km_pend {
  um_event *ev; /* NULL: released (orphan) or a native record */
  char what[64];
  uint8_t *host;   /* freed when settled */
  uint8_t *expect; /* host must equal it when settled (n bytes), or NULL */
  size_t n;
  uint8_t *host2; /* a second block to free */
  int want;       /* UM_OK or UM_ECANCELED */
  uint32_t vmask; /* views it touches */
  km_nkind nkind;
  bool host_only;  /* every buffer it touches has a host view on the cpu device */
  void *native;    /* what um_event_native gave (checked after the wait) */
  int native_dev;  /* device of the caller's native events (bracket records) */
  void *cl_ev[2];  /* the caller's cl_events to release */
  void *cu_ev;     /* the caller's CUevent to destroy */
  uint64_t seq;
} km_pend;

typedef struct km_bracket {
  int v;
  um_map_mode mode;
  void *wait;
  uint8_t *before; /* the view's model when the bracket began */
  uint8_t *write;  /* what the caller writes at [woff, woff + wn) */
  size_t woff, wn;
  unsigned bit;
  bool release_inside; /* end it by releasing the buffer */
} km_bracket;

typedef struct km_worker km_worker;

typedef struct km_net {
  um_net *net;
  um_endpoint *ep;
  um_buffer *t; /* the exposed target (host memory of device 0) */
  uint8_t *tmodel;
  size_t tlen;
  uint8_t key[4096];
  size_t klen;
  bool exposed;
  um_event *last;     /* the last net operation, not yet seen finished */
  bool unknown;       /* an orphaned net operation: wait for a sync */
  uint8_t oldkey[4096];
  size_t oldklen;
} km_net;

struct km_worker {
  km_env *env;
  int id;
  uint64_t seed;
  km_rng rng;
  km_view v[KM_MAXV];
  int nv;
  km_pend *pend;
  size_t npend, cap;
  km_bracket br[KM_MAXBR];
  int nbr;
  unsigned bits_used;
  void *queue[KM_MAXDEV]; /* the caller's queue / stream per device */
  bool own_queues;
  bool threaded; /* other workers issue on the manager too */
  bool lenient;  /* other workers bracket and map buffers this one uses */
  bool brackets, maps, streams, cancels, reallocs;
  km_net *net;
  long steps, step;
  uint64_t seq;
  char log[KM_LOG][192];
  char fail[6144];
  bool failed;
  atomic_int finished;
  /* what um_stats must say (one worker only): fills and net transfers
   * that ran, since base */
  um_stats base;
  unsigned long fills_ran, net_out, net_in, net_ran;
  /* counts, for the report */
  unsigned long n_ops, n_brackets, n_batches, n_bad_batches, n_cancel_ok, n_maps, n_streams, n_nets,
      n_native_ok, n_reallocs, n_syncs, n_orphans, n_refused;
};

static void km_log(km_worker *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void km_log(km_worker *w, const char *fmt, ...) {
  va_list ap;
  char *line = w->log[w->seq % KM_LOG];
  int k = snprintf(line, sizeof(w->log[0]), "#%llu s%ld: ", (unsigned long long)w->seq, w->step);
  va_start(ap, fmt);
  vsnprintf(line + k, sizeof(w->log[0]) - (size_t)k, fmt, ap);
  va_end(ap);
  w->seq++;
}

static void km_fail(km_worker *w, int line, const char *cond, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void km_fail(km_worker *w, int line, const char *cond, const char *fmt, ...) {
  va_list ap;
  size_t k;
  if (w->failed)
    return;
  w->failed = true;
  k = (size_t)snprintf(w->fail, sizeof(w->fail),
                       "worker %d, seed %llu, step %ld (profile %s), line %d: check failed: %s: ", w->id,
                       (unsigned long long)w->seed, w->step, os_profile(), line, cond);
  va_start(ap, fmt);
  if (k < sizeof(w->fail))
    k += (size_t)vsnprintf(w->fail + k, sizeof(w->fail) - k, fmt, ap);
  va_end(ap);
  if (k < sizeof(w->fail))
    k += (size_t)snprintf(w->fail + k, sizeof(w->fail) - k, " (um_last_error: \"%s\")\n  last operations:\n",
                          um_last_error());
  for (uint64_t i = w->seq > 16 ? w->seq - 16 : 0; i < w->seq && k < sizeof(w->fail); i++)
    k += (size_t)snprintf(w->fail + k, sizeof(w->fail) - k, "    %s\n", w->log[i % KM_LOG]);
}

#define KM_CHECK(w, cond, ...)                                                 \
  do {                                                                         \
    if (!(cond)) {                                                             \
      km_fail((w), __LINE__, #cond, __VA_ARGS__);                              \
      return false;                                                            \
    }                                                                          \
  } while (0)

/* st is one of the two codes a/b; a failure has a detail. */
#define KM_ST(w, st, a, b, what)                                               \
  do {                                                                         \
    int km_st_ = (st);                                                         \
    KM_CHECK((w), km_st_ == (a) || km_st_ == (b), "%s answered %s, expected %s%s%s", (what),          \
             um_err_name(km_st_), um_err_name(a), (a) != (b) ? " or " : "", (a) != (b) ? um_err_name(b) : ""); \
    KM_CHECK((w), km_st_ == UM_OK || km_st_ == UM_EAGAIN || um_last_error()[0] != '\0',              \
             "%s failed with %s and um_last_error() is empty", (what), um_err_name(km_st_));          \
  } while (0)

static OS_UNUSED size_t km_first_diff(const uint8_t *a, const uint8_t *b, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (a[i] != b[i])
      return i;
  return SIZE_MAX;
}

#define KM_SAME(w, got, want, n, ...)                                          \
  do {                                                                         \
    size_t km_d_ = km_first_diff((const uint8_t *)(got), (const uint8_t *)(want), (n)); \
    if (km_d_ != SIZE_MAX) {                                                   \
      char km_m_[256];                                                         \
      snprintf(km_m_, sizeof(km_m_), __VA_ARGS__);                             \
      KM_CHECK((w), km_d_ == SIZE_MAX, "%s: byte %zu of %zu is 0x%02x, the model says 0x%02x", km_m_, \
               km_d_, (size_t)(n), ((const uint8_t *)(got))[km_d_], ((const uint8_t *)(want))[km_d_]); \
    }                                                                          \
  } while (0)

static void *km_xmalloc(size_t n) {
  void *p = malloc(n == 0 ? 1 : n);
  if (p == NULL)
    abort();
  return p;
}

static uint8_t *km_dup(const uint8_t *p, size_t n) {
  uint8_t *q = km_xmalloc(n);
  memcpy(q, p, n);
  return q;
}

/* ------------------------------------------------------------------------ */
/* Views */

static km_view *km_view_of(km_worker *w, int i) { return &w->v[i]; }

static bool km_on_host(km_worker *w, const km_view *v) {
  return w->env->dev[v->dev].bk == KM_CPU || v->loc == UM_HOST;
}

/* A new buffer for view slot i (size, device, location already set),
 * filled with random bytes (or zeros) that the model takes. */
static um_buffer *km_stale; /* a released handle, until the next allocation */

static bool km_view_alloc(km_worker *w, int i, bool zero) {
  km_view *v = km_view_of(w, i);
  int st;
  km_stale = NULL; /* the pool may hand the same handle back */
  if (v->wrap_mem != NULL) {
    km_fill_random(&w->rng, v->wrap_mem, v->bsize);
    st = um_wrap_host(w->env->m, v->wrap_mem, v->bsize, v->ro ? UM_WRAP_READONLY : 0, &v->b);
    KM_ST(w, st, UM_OK, UM_OK, "um_wrap_host");
    memcpy(v->model, v->wrap_mem + v->base, v->len);
    v->live = true;
    v->taint = v->maybe = 0;
    return true;
  }
  st = um_alloc(w->env->m, w->env->dev[v->dev].d, v->bsize, v->loc, zero ? UM_ALLOC_ZERO : 0, &v->b);
  KM_ST(w, st, UM_OK, UM_OK, "um_alloc");
  v->live = true;
  v->taint = v->maybe = 0;
  if (zero) {
    memset(v->model, 0, v->len);
  } else {
    uint8_t *h = km_xmalloc(v->bsize);
    km_fill_random(&w->rng, h, v->bsize);
    st = um_copy_from_host(v->b, 0, h, v->bsize, NULL);
    KM_ST(w, st, UM_OK, UM_OK, "initial um_copy_from_host");
    memcpy(v->model, h + v->base, v->len);
    free(h);
  }
  return true;
}

/* Add a view of a buffer of its own. Returns its index, or -1 when the
 * device cannot give loc. */
static int km_add_view(km_worker *w, int dev, um_location loc, size_t bytes, int wrap) {
  km_view *v;
  int i = w->nv;
  if (i >= KM_MAXV)
    return -1;
  if (wrap == 0 && !(w->env->dev[dev].info.locations & (1u << loc)))
    return -1;
  v = &w->v[i];
  memset(v, 0, sizeof(*v));
  v->dev = wrap ? 0 : dev;
  v->loc = wrap ? UM_HOST : loc;
  v->bsize = v->len = bytes;
  v->model = km_xmalloc(bytes);
  v->ro = wrap == 2;
  if (wrap)
    v->wrap_mem = km_xmalloc(bytes);
  /* brackets: buffers of the cpu device (the wait handle is a um_event),
   * DEVICE buffers of an OpenCL or CUDA device (a native event). */
  v->bracketable = w->env->dev[v->dev].bk == KM_CPU ||
                   (v->loc == UM_DEVICE && w->env->dev[v->dev].bk != KM_OTHER);
  w->nv++;
  if (!km_view_alloc(w, i, false)) {
    w->nv--;
    return -2;
  }
  return i;
}

/* Add a view of [base, base + len) of a buffer shared with other workers. */
static OS_UNUSED int km_add_shared_view(km_worker *w, um_buffer *b, int dev, um_location loc, size_t bsize,
                                        size_t base, size_t len, const uint8_t *content) {
  km_view *v;
  int i = w->nv;
  if (i >= KM_MAXV)
    return -1;
  v = &w->v[i];
  memset(v, 0, sizeof(*v));
  v->b = b;
  v->dev = dev;
  v->loc = loc;
  v->bsize = bsize;
  v->base = base;
  v->len = len;
  v->model = km_dup(content, len);
  v->live = true;
  v->shared = true;
  v->bracketable = w->env->dev[dev].bk == KM_CPU || (loc == UM_DEVICE && w->env->dev[dev].bk != KM_OTHER);
  w->nv++;
  return i;
}

/* The standard set of views: on the cpu device a HOST and a DEVICE buffer,
 * a wrap and a read-only wrap; on each accelerator a DEVICE buffer, one of
 * an odd size, a HOST and a PINNED buffer; UNIFIED where offered. */
static OS_UNUSED bool km_standard_views(km_worker *w, size_t scale) {
  km_env *e = w->env;
  if (km_add_view(w, 0, UM_HOST, 24576 * scale, 0) < -1 || km_add_view(w, 0, UM_DEVICE, 40000 * scale, 0) < -1 ||
      km_add_view(w, 0, UM_HOST, 32768 * scale, 1) < -1 || km_add_view(w, 0, UM_HOST, 8192, 2) < -1)
    return false;
  if (e->ndev == 1 && km_add_view(w, 0, UM_PINNED, 16384, 0) < -1)
    return false;
  for (int d = 1; d < e->ndev; d++) {
    if (km_add_view(w, d, UM_DEVICE, 49152 * scale, 0) < -1 || km_add_view(w, d, UM_DEVICE, 20011 * scale, 0) < -1 ||
        km_add_view(w, d, UM_HOST, 16384, 0) < -1 || km_add_view(w, d, UM_PINNED, 16384 * scale, 0) < -1)
      return false;
    if (e->dev[d].info.locations & (1u << UM_UNIFIED)) {
      if (km_add_view(w, d, UM_UNIFIED, 12288, 0) < -1)
        return false;
    }
  }
  return true;
}

/* ------------------------------------------------------------------------ */
/* What a call must answer. Refusals: a read-only destination; a blocking
 * call whose wait passes through an open bracket of this worker (surely,
 * or maybe through a batch); in lenient mode (other workers bracket and
 * map shared buffers), UM_ESTATE is also accepted from blocking calls and
 * from calls on shared buffers. */

typedef struct km_want {
  int a, b;
} km_want;

static km_want km_expect(km_worker *w, const int *vs, int nvs, uint32_t dstmask, bool blocking) {
  km_want r = {UM_OK, UM_OK};
  unsigned taint = 0, maybe = 0;
  bool shared = false;
  for (int i = 0; i < nvs; i++) {
    km_view *v = &w->v[vs[i]];
    if ((dstmask >> i & 1u) && v->ro) {
      r.a = r.b = UM_ESTATE;
      return r;
    }
    taint |= v->taint;
    maybe |= v->maybe;
    shared |= v->shared;
  }
  if (blocking && taint) {
    r.a = r.b = UM_ESTATE;
    return r;
  }
  if (blocking && maybe)
    r.b = UM_ESTATE;
  if (w->lenient && (blocking || shared))
    r.b = UM_ESTATE;
  return r;
}

/* After an asynchronous operation on views vs was issued: each waits for
 * what the others waited for. */
static void km_join(km_worker *w, const int *vs, int nvs, bool sure) {
  unsigned t = 0, m = 0;
  for (int i = 0; i < nvs; i++) {
    t |= w->v[vs[i]].taint;
    m |= w->v[vs[i]].maybe;
  }
  for (int i = 0; i < nvs; i++) {
    if (sure)
      w->v[vs[i]].taint |= t;
    else
      w->v[vs[i]].maybe |= t;
    w->v[vs[i]].maybe |= m;
  }
}

static bool km_any_taint(km_worker *w, const int *vs, int nvs) {
  for (int i = 0; i < nvs; i++)
    if (w->v[vs[i]].taint || w->v[vs[i]].maybe)
      return true;
  return false;
}

/* ------------------------------------------------------------------------ */
/* Pending operations */

static km_pend *km_push(km_worker *w, um_event *ev, const char *what) {
  km_pend *p;
  if (w->npend == w->cap) {
    w->cap = w->cap ? w->cap * 2 : 64;
    w->pend = realloc(w->pend, w->cap * sizeof(*w->pend));
    if (w->pend == NULL)
      abort();
  }
  p = &w->pend[w->npend++];
  memset(p, 0, sizeof(*p));
  p->ev = ev;
  p->want = UM_OK;
  p->seq = w->seq;
  p->native_dev = -1;
  snprintf(p->what, sizeof(p->what), "%s", what);
  return p;
}

static void km_pend_free(km_pend *p) {
  free(p->host);
  free(p->expect);
  free(p->host2);
  p->host = p->expect = p->host2 = NULL;
}

static void km_pend_remove(km_worker *w, size_t i) {
  w->pend[i] = w->pend[--w->npend];
}

static bool km_check_native_done(km_worker *w, km_pend *p) {
  if (p->native == NULL)
    return true;
#ifdef KM_HAVE_CL_H
  {
    /* the native event of a finished operation has completed */
    bool ocl = false;
    for (int d = 1; d < w->env->ndev; d++)
      ocl |= w->env->dev[d].bk == KM_OCL;
    if (ocl) {
      cl_int es = -1;
      cl_int err = km_cl_fns.GetEventInfo((cl_event)p->native, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof(es), &es,
                                          NULL);
      KM_CHECK(w, err == CL_SUCCESS && es == CL_COMPLETE,
               "%s (#%llu) finished, but its native event says status %d (clGetEventInfo %d)", p->what,
               (unsigned long long)p->seq, es, err);
    }
  }
#endif
  for (int d = 1; d < w->env->ndev; d++) {
    if (w->env->dev[d].bk == KM_CUDA) {
      int r = km_cu_fns.EventQuery(p->native);
      KM_CHECK(w, r == 0, "%s (#%llu) finished, but cuEventQuery of its native event says %d", p->what,
               (unsigned long long)p->seq, r);
      break;
    }
  }
  return true;
}

/* Check a finished operation's results and free what it held. */
static bool km_pend_check(km_worker *w, km_pend *p) {
  if (p->expect != NULL)
    KM_SAME(w, p->host, p->expect, p->n, "%s (#%llu)", p->what, (unsigned long long)p->seq);
  km_pend_free(p);
  return true;
}

/* Wait for pending i (block) or look at it (!block); *gone when it was
 * checked and removed. */
static bool km_settle(km_worker *w, size_t i, bool block, bool *gone) {
  km_pend *p = &w->pend[i];
  int st;
  *gone = false;
  if (p->ev == NULL)
    return true; /* orphans and native records: at the next sync */
  st = block ? um_event_wait(p->ev) : um_event_query(p->ev);
  if (!block && st == UM_EAGAIN)
    return true;
  KM_CHECK(w, st == p->want, "%s of %s (#%llu) answered %s, expected %s", block ? "um_event_wait" : "um_event_query",
           p->what, (unsigned long long)p->seq, um_err_name(st), um_err_name(p->want));
  if (st != UM_OK)
    KM_CHECK(w, um_last_error()[0] != '\0', "the event of %s failed with %s but um_last_error() is empty", p->what,
             um_err_name(st));
  /* asked again: the same answer */
  st = um_event_query(p->ev);
  KM_CHECK(w, st == p->want, "um_event_query again of %s answered %s", p->what, um_err_name(st));
  if (!km_check_native_done(w, p))
    return false;
  if (w->net != NULL && w->net->last == p->ev)
    w->net->last = NULL;
  st = um_event_release(p->ev);
  KM_CHECK(w, st == UM_OK, "um_event_release of %s: %s", p->what, um_err_name(st));
  if (!w->threaded) {
    /* a released handle answers UM_ESTATE until unimem reuses the object
     * for a later operation; nothing was issued since */
    void *nat = NULL;
    KM_CHECK(w, um_event_query(p->ev) == UM_ESTATE, "um_event_query of the released event of %s", p->what);
    KM_CHECK(w, um_event_release(p->ev) == UM_ESTATE, "um_event_release twice of %s", p->what);
    KM_CHECK(w, um_event_native(p->ev, &nat) == UM_ESTATE && nat == NULL, "um_event_native of the released %s",
             p->what);
    KM_CHECK(w, um_event_cancel(p->ev) == UM_ESTATE, "um_event_cancel of the released %s", p->what);
  }
  p->ev = NULL;
  if (!km_pend_check(w, p))
    return false;
  km_pend_remove(w, i);
  *gone = true;
  return true;
}

/* Drop the caller's reference before the operation is known to be done:
 * it becomes an orphan, checked at the next sync. */
static bool km_orphan(km_worker *w, km_pend *p) {
  int st;
  if (w->net != NULL && w->net->last == p->ev) {
    w->net->last = NULL;
    w->net->unknown = true;
  }
  st = um_event_release(p->ev);
  KM_CHECK(w, st == UM_OK, "um_event_release (early) of %s: %s", p->what, um_err_name(st));
  if (!w->threaded) {
    KM_CHECK(w, um_event_wait(p->ev) == UM_ESTATE, "um_event_wait of the released event of %s", p->what);
    KM_CHECK(w, um_event_query(p->ev) == UM_ESTATE, "um_event_query of the released event of %s", p->what);
  }
  p->ev = NULL;
  p->native = NULL;
  w->n_orphans++;
  return true;
}

/* After an asynchronous call succeeded: maybe cancel it at once, maybe ask
 * its native event, maybe release it early. Returns the pending record;
 * *canceled says the operation will not run (the model must not take it). */
static bool km_after_issue(km_worker *w, um_event *ev, const char *what, bool all_host, km_nkind nk, bool tainted,
                           uint32_t vmask, km_pend **out, bool *canceled) {
  km_pend *p = km_push(w, ev, what);
  int st;
  *canceled = false;
  p->vmask = vmask;
  p->host_only = all_host;
  p->nkind = nk;
  if (w->cancels && km_chance(&w->rng, tainted ? 40 : 6)) {
    st = um_event_cancel(ev);
    KM_CHECK(w, st == UM_OK || st == UM_EBUSY, "um_event_cancel of %s: %s", what, um_err_name(st));
    if (st == UM_OK) {
      *canceled = true;
      p->want = UM_ECANCELED;
      w->n_cancel_ok++;
      KM_CHECK(w, um_event_query(ev) == UM_ECANCELED, "um_event_query right after a cancel of %s", what);
      KM_CHECK(w, um_event_cancel(ev) == UM_EBUSY, "a second um_event_cancel of %s", what);
    }
    km_log(w, "  cancel %s: %s", what, um_err_name(st));
  }
  if (km_chance(&w->rng, 25)) {
    void *nat = (void *)(uintptr_t)1;
    st = um_event_native(ev, &nat);
    KM_CHECK(w, st == UM_OK || st == UM_ENOTSUP || st == UM_EAGAIN, "um_event_native of %s: %s", what,
             um_err_name(st));
    if (st != UM_OK)
      KM_CHECK(w, nat == (void *)(uintptr_t)1, "um_event_native wrote its out-parameter and answered %s",
               um_err_name(st));
    if (all_host && !*canceled)
      KM_CHECK(w, st == UM_ENOTSUP, "um_event_native of %s, which runs on host memory alone, answered %s", what,
               um_err_name(st));
    if (st == UM_OK) {
      KM_CHECK(w, nat != NULL, "um_event_native of %s gave NULL", what);
      w->n_native_ok++;
#ifdef KM_HAVE_CL_H
      for (int d = 1; d < w->env->ndev; d++) {
        if (w->env->dev[d].bk != KM_OCL)
          continue;
        {
          cl_context ctx = NULL;
          cl_command_type ct = 0;
          cl_int e1 = km_cl_fns.GetEventInfo((cl_event)nat, CL_EVENT_CONTEXT, sizeof(ctx), &ctx, NULL);
          cl_int e2 = km_cl_fns.GetEventInfo((cl_event)nat, CL_EVENT_COMMAND_TYPE, sizeof(ct), &ct, NULL);
          bool known = false;
          KM_CHECK(w, e1 == CL_SUCCESS && e2 == CL_SUCCESS, "clGetEventInfo of the native event of %s: %d %d",
                   what, e1, e2);
          for (int k = 1; k < w->env->ndev; k++)
            known |= ctx == (cl_context)w->env->dev[k].nat.cl_context;
          KM_CHECK(w, known, "the native event of %s belongs to no device's context", what);
          if (nk == KM_N_WRITE)
            KM_CHECK(w, ct == CL_COMMAND_WRITE_BUFFER || ct == CL_COMMAND_WRITE_BUFFER_RECT,
                     "the native event of %s (a copy into device memory) is a command of type 0x%x", what,
                     (unsigned)ct);
          if (nk == KM_N_READ)
            KM_CHECK(w, ct == CL_COMMAND_READ_BUFFER || ct == CL_COMMAND_READ_BUFFER_RECT,
                     "the native event of %s (a copy out of device memory) is a command of type 0x%x", what,
                     (unsigned)ct);
        }
        break;
      }
#endif
      for (size_t k = 0; k + 1 < w->npend; k++)
        KM_CHECK(w, nat != w->pend[k].cl_ev[0] && nat != w->pend[k].cl_ev[1] && nat != w->pend[k].cu_ev,
                 "um_event_native of %s gave the caller's own done event of an earlier bracket (%s)", what,
                 w->pend[k].what);
      for (int b = 0; b < w->nbr; b++)
        KM_CHECK(w, nat != w->br[b].wait || w->br[b].wait == NULL,
                 "um_event_native of %s gave the wait handle of an open bracket", what);
      if (!*canceled)
        p->native = nat;
    }
  }
  if (km_chance(&w->rng, 12)) {
    if (!km_orphan(w, p))
      return false;
  } else if (km_chance(&w->rng, 20)) {
    /* a wait that gives up before the work ends: a few queries */
    uint64_t end = os_now_ms() + 1;
    do {
      st = um_event_query(ev);
    } while (st == UM_EAGAIN && os_now_ms() < end);
    KM_CHECK(w, st == UM_EAGAIN || st == p->want, "um_event_query of %s: %s", what, um_err_name(st));
  }
  *out = p;
  return true;
}

/* ------------------------------------------------------------------------ */
/* Ranges */

static void km_range(km_worker *w, size_t len, size_t *off, size_t *n) {
  switch (km_below(&w->rng, 5)) {
  case 0:
    *n = 1 + km_below(&w->rng, len < 64 ? len : 64);
    break;
  case 1:
    *n = 1 + km_below(&w->rng, len < 4096 ? len : 4096);
    break;
  case 2:
    *n = 1 + km_below(&w->rng, len);
    break;
  case 3:
    *n = len;
    break;
  default:
    *n = len / 2 + 1 + km_below(&w->rng, len - len / 2);
    if (*n > len)
      *n = len;
    break;
  }
  *off = km_below(&w->rng, len - *n + 1);
}

/* A random live view, writable when asked (shared ones too unless
 * no_shared); -1 when none. */
static int km_pick_ex(km_worker *w, bool writable, bool no_shared) {
  for (int tries = 0; tries < 64; tries++) {
    int i = (int)km_below(&w->rng, (size_t)w->nv);
    if (w->v[i].live && (!writable || !w->v[i].ro) && !(no_shared && w->v[i].shared))
      return i;
  }
  return -1;
}

static int km_pick(km_worker *w, bool writable) { return km_pick_ex(w, writable, false); }

/* KM_TOLERATE bits: known defects a run steps around, to look further.
 *   2  a batch is checked as a whole, then issued op by op: another
 *      thread's bracket or map refuses a later op after earlier ones ran
 *      (lenient runs then keep shared buffers out of batches) */
static bool km_tolerate(unsigned bit) { return (km_env_u64("KM_TOLERATE", 0) & bit) != 0; }

static const char *km_vname(km_worker *w, int i) {
  static __thread char buf[8][48];
  static __thread int k;
  km_view *v = &w->v[i];
  char *s = buf[k++ & 7];
  static const char *locs[] = {"HOST", "DEVICE", "PINNED", "UNIFIED"};
  snprintf(s, 48, "v%d(d%d %s%s%s%s)", i, v->dev, v->wrap_mem ? "wrap" : locs[v->loc], v->ro ? " ro" : "",
           v->shared ? " shared" : "", v->taint ? " T" : v->maybe ? " t" : "");
  return s;
}

/* ------------------------------------------------------------------------ */
/* Operations. Each returns false on a failed check. */

static bool km_readback(km_worker *w, int i, size_t off, size_t n, bool blocking);

/* A copy out of view i, [off, off + n), into host memory, checked against
 * the model as it is now (every earlier operation on the view comes
 * first). */
static bool km_d2h(km_worker *w, int i, size_t off, size_t n, bool blocking) {
  km_view *v = &w->v[i];
  uint8_t *dst = km_xmalloc(n), *sent, *expect;
  um_event *ev = (um_event *)(uintptr_t)1;
  bool canceled = false;
  km_want want = km_expect(w, &i, 1, 0, blocking);
  int st;
  km_fill_random(&w->rng, dst, n);
  sent = km_dup(dst, n);
  expect = km_dup(v->model + off, n);
  km_log(w, "d2h %s [%zu,+%zu) %s", km_vname(w, i), off, n, blocking ? "blocking" : "async");
  st = um_copy_to_host(v->b, v->base + off, dst, n, blocking ? NULL : &ev);
  KM_ST(w, st, want.a, want.b, "um_copy_to_host");
  w->n_ops++;
  if (st != UM_OK) {
    w->n_refused++;
    KM_CHECK(w, blocking || ev == (um_event *)(uintptr_t)1, "a refused um_copy_to_host wrote *done");
    KM_SAME(w, dst, sent, n, "a refused um_copy_to_host wrote the host memory");
    free(dst);
    free(sent);
    free(expect);
    return true;
  }
  if (blocking) {
    KM_SAME(w, dst, expect, n, "blocking um_copy_to_host of %s [%zu,+%zu)", km_vname(w, i), off, n);
    free(dst);
    free(sent);
    free(expect);
    return true;
  }
  {
    km_pend *p;
    if (!km_after_issue(w, ev, "d2h", km_on_host(w, v), v->loc == UM_DEVICE ? KM_N_READ : KM_N_ANY, v->taint != 0,
                        1u << i, &p, &canceled)) {
      free(dst);
      free(sent);
      free(expect);
      return false;
    }
    snprintf(p->what, sizeof(p->what), "d2h %s [%zu,+%zu)", km_vname(w, i), off, n);
    p->host = dst;
    p->n = n;
    if (canceled) {
      p->expect = sent;
      free(expect);
    } else {
      p->expect = expect;
      free(sent);
    }
  }
  return true;
}

static bool km_readback(km_worker *w, int i, size_t off, size_t n, bool blocking) {
  return km_d2h(w, i, off, n, blocking);
}

static bool km_op_d2h(km_worker *w) {
  int i = km_pick(w, false);
  size_t off, n;
  if (i < 0)
    return true;
  km_range(w, w->v[i].len, &off, &n);
  return km_d2h(w, i, off, n, km_chance(&w->rng, 30));
}

static bool km_op_h2d(km_worker *w) {
  int i = km_pick(w, !km_chance(&w->rng, 5));
  size_t off, n;
  bool blocking = km_chance(&w->rng, 30), canceled = false;
  uint8_t *src;
  um_event *ev = (um_event *)(uintptr_t)1;
  km_want want;
  km_view *v;
  int st;
  if (i < 0)
    return true;
  v = &w->v[i];
  km_range(w, v->len, &off, &n);
  src = km_xmalloc(n);
  km_fill_random(&w->rng, src, n);
  want = km_expect(w, &i, 1, 1u, blocking);
  km_log(w, "h2d %s [%zu,+%zu) %s", km_vname(w, i), off, n, blocking ? "blocking" : "async");
  st = um_copy_from_host(v->b, v->base + off, src, n, blocking ? NULL : &ev);
  KM_ST(w, st, want.a, want.b, "um_copy_from_host");
  w->n_ops++;
  if (st != UM_OK) {
    w->n_refused++;
    KM_CHECK(w, blocking || ev == (um_event *)(uintptr_t)1, "a refused um_copy_from_host wrote *done");
    free(src);
    return true;
  }
  if (blocking) {
    memcpy(v->model + off, src, n);
    free(src);
    return true;
  }
  {
    km_pend *p;
    if (!km_after_issue(w, ev, "h2d", km_on_host(w, v), v->loc == UM_DEVICE ? KM_N_WRITE : KM_N_ANY,
                        v->taint != 0, 1u << i, &p, &canceled)) {
      free(src);
      return false;
    }
    snprintf(p->what, sizeof(p->what), "h2d %s [%zu,+%zu)", km_vname(w, i), off, n);
    if (!canceled)
      memcpy(v->model + off, src, n);
    p->host = src;
  }
  return true;
}

static bool km_op_copy(km_worker *w) {
  int di = km_pick(w, !km_chance(&w->rng, 4)), si, vs[2];
  size_t doff, soff, n, maxn;
  bool blocking = km_chance(&w->rng, 30), canceled = false, overlap;
  um_event *ev = (um_event *)(uintptr_t)1;
  km_want want;
  km_view *dv, *sv;
  int st, nvs;
  if (di < 0)
    return true;
  si = km_chance(&w->rng, 25) ? di : km_pick(w, false);
  if (si < 0)
    return true;
  dv = &w->v[di];
  sv = &w->v[si];
  maxn = dv->len < sv->len ? dv->len : sv->len;
  km_range(w, maxn, &soff, &n);
  soff = km_below(&w->rng, sv->len - n + 1);
  if (di == si && km_chance(&w->rng, 70) && n < dv->len) {
    /* overlapping ranges of one buffer, forwards or backwards */
    size_t delta = 1 + km_below(&w->rng, n < dv->len - n ? n : dv->len - n);
    if (soff + delta + n <= dv->len && km_chance(&w->rng, 50))
      doff = soff + delta;
    else if (soff >= delta)
      doff = soff - delta;
    else
      doff = soff + delta <= dv->len - n ? soff + delta : 0;
  } else {
    doff = km_below(&w->rng, dv->len - n + 1);
  }
  overlap = di == si && doff < soff + n && soff < doff + n;
  vs[0] = di;
  vs[1] = si;
  nvs = di == si ? 1 : 2;
  want = km_expect(w, vs, nvs, 1u, blocking);
  if (overlap && want.a == UM_OK && want.b == UM_OK)
    want.b = UM_EINVAL; /* the header allows a refusal of an overlapping copy */
  km_log(w, "copy %s [%zu,+%zu) <- %s [%zu] %s%s", km_vname(w, di), doff, n, km_vname(w, si), soff,
         blocking ? "blocking" : "async", overlap ? " overlapping" : "");
  st = um_copy(dv->b, dv->base + doff, sv->b, sv->base + soff, n, blocking ? NULL : &ev);
  KM_ST(w, st, want.a, want.b, "um_copy");
  w->n_ops++;
  if (st != UM_OK) {
    w->n_refused++;
    KM_CHECK(w, blocking || ev == (um_event *)(uintptr_t)1, "a refused um_copy wrote *done");
    return true;
  }
  if (!blocking) {
    km_pend *p;
    if (!km_after_issue(w, ev, "copy", km_on_host(w, dv) && km_on_host(w, sv), KM_N_ANY, km_any_taint(w, vs, nvs),
                        (1u << di) | (1u << si), &p, &canceled))
      return false;
    snprintf(p->what, sizeof(p->what), "copy %s <- %s", km_vname(w, di), km_vname(w, si));
    km_join(w, vs, nvs, !canceled);
  }
  if (!canceled)
    memmove(dv->model + doff, sv->model + soff, n);
  return true;
}

static bool km_op_fill(km_worker *w) {
  int i = km_pick(w, !km_chance(&w->rng, 5)), byte, st;
  size_t off, n;
  bool blocking = km_chance(&w->rng, 30), canceled = false;
  um_event *ev = (um_event *)(uintptr_t)1;
  km_want want;
  km_view *v;
  if (i < 0)
    return true;
  v = &w->v[i];
  km_range(w, v->len, &off, &n);
  switch (km_below(&w->rng, 4)) {
  case 0:
    byte = 256 + (int)km_below(&w->rng, 256); /* (unsigned char)byte */
    break;
  case 1:
    byte = -1 - (int)km_below(&w->rng, 256);
    break;
  default:
    byte = (int)km_below(&w->rng, 256);
    break;
  }
  want = km_expect(w, &i, 1, 1u, blocking);
  km_log(w, "fill %s [%zu,+%zu) = %d %s", km_vname(w, i), off, n, byte, blocking ? "blocking" : "async");
  st = um_fill(v->b, v->base + off, byte, n, blocking ? NULL : &ev);
  KM_ST(w, st, want.a, want.b, "um_fill");
  w->n_ops++;
  if (st != UM_OK) {
    w->n_refused++;
    KM_CHECK(w, blocking || ev == (um_event *)(uintptr_t)1, "a refused um_fill wrote *done");
    return true;
  }
  if (!blocking) {
    km_pend *p;
    if (!km_after_issue(w, ev, "fill", km_on_host(w, v), KM_N_ANY, v->taint != 0, 1u << i, &p, &canceled))
      return false;
    snprintf(p->what, sizeof(p->what), "fill %s [%zu,+%zu)", km_vname(w, i), off, n);
  }
  if (!canceled) {
    memset(v->model + off, (unsigned char)byte, n);
    w->fills_ran++;
  }
  return true;
}

/* ------------------------------------------------------------------------ */
/* Batches */

#define KM_BATCH_MAX 8

typedef struct km_bop {
  int kind; /* 0 host -> buffer, 1 buffer -> host, 2 buffer -> buffer */
  int di, si;
  size_t doff, soff, n, hoff;
} km_bop;


static bool km_op_batch(km_worker *w) {
  um_copy_op ops[KM_BATCH_MAX];
  km_bop d[KM_BATCH_MAX];
  int k = 1 + (int)km_below(&w->rng, KM_BATCH_MAX), vs[2 * KM_BATCH_MAX], nvs = 0, bad = -1, badkind = 0, st;
  uint32_t dstmask = 0, vmask = 0;
  size_t total = 0;
  uint8_t *host, *sent;
  bool blocking = km_chance(&w->rng, 30), canceled = false, all_host = true, null_m = false;
  um_event *ev = (um_event *)(uintptr_t)1;
  km_want want;
  int want_bad = UM_OK;
  memset(ops, 0, sizeof(ops));
  for (int j = 0; j < k; j++) {
    km_bop *o = &d[j];
    bool ns = w->lenient && km_tolerate(2);
    o->kind = (int)km_below(&w->rng, 3);
    o->di = o->si = -1;
    if (o->kind != 1 && (o->di = km_pick_ex(w, true, ns)) < 0)
      return true;
    if (o->kind != 0 && (o->si = km_pick_ex(w, false, ns)) < 0)
      return true;
    if (o->kind == 2 && o->di == o->si) {
      /* one buffer twice in one op: disjoint halves */
      km_view *v = &w->v[o->di];
      size_t half = v->len / 2;
      if (half == 0)
        return true;
      o->n = 1 + km_below(&w->rng, half);
      o->soff = km_below(&w->rng, half - o->n + 1);
      o->doff = half + km_below(&w->rng, v->len - half - o->n + 1);
      if (km_chance(&w->rng, 50)) {
        size_t t = o->soff;
        o->soff = o->doff;
        o->doff = t;
      }
    } else if (o->kind == 2) {
      size_t dl = w->v[o->di].len, sl = w->v[o->si].len, off;
      km_range(w, dl < sl ? dl : sl, &off, &o->n);
      o->doff = km_below(&w->rng, dl - o->n + 1);
      o->soff = km_below(&w->rng, sl - o->n + 1);
    } else {
      int i = o->kind == 0 ? o->di : o->si;
      size_t off;
      km_range(w, w->v[i].len, &off, &o->n);
      if (o->kind == 0)
        o->doff = off;
      else
        o->soff = off;
    }
    o->hoff = total;
    total += o->n;
  }
  host = km_xmalloc(total);
  km_fill_random(&w->rng, host, total); /* sources, and sentinels where copies land */
  sent = km_dup(host, total);
  for (int j = 0; j < k; j++) {
    km_bop *o = &d[j];
    if (o->kind != 1) {
      ops[j].dst = w->v[o->di].b;
      ops[j].dst_off = w->v[o->di].base + o->doff;
      vs[nvs] = o->di;
      dstmask |= 1u << nvs;
      nvs++;
      vmask |= 1u << o->di;
      all_host &= km_on_host(w, &w->v[o->di]);
    } else {
      ops[j].host_dst = host + o->hoff;
    }
    if (o->kind != 0) {
      ops[j].src = w->v[o->si].b;
      ops[j].src_off = w->v[o->si].base + o->soff;
      vs[nvs++] = o->si;
      vmask |= 1u << o->si;
      all_host &= km_on_host(w, &w->v[o->si]);
    } else {
      ops[j].host_src = host + o->hoff;
    }
    ops[j].bytes = o->n;
  }
  if (km_chance(&w->rng, 25)) {
    /* one bad op: the whole batch is refused, nothing issued */
    bad = (int)km_below(&w->rng, (size_t)k);
    badkind = (int)km_below(&w->rng, km_stale != NULL && !w->threaded ? 7 : 6);
    if (km_any_taint(w, vs, nvs))
      blocking = false; /* one reason only */
    switch (badkind) {
    case 0: { /* a range past the end */
      um_copy_op *o = &ops[bad];
      if (o->dst != NULL && km_chance(&w->rng, 50))
        o->dst_off = w->v[d[bad].di].bsize - o->bytes + 1 + km_below(&w->rng, 64);
      else if (o->src != NULL)
        o->src_off = w->v[d[bad].si].bsize - o->bytes + 1 + km_below(&w->rng, 64);
      else
        o->dst_off = w->v[d[bad].di].bsize - o->bytes + 1 + km_below(&w->rng, 64);
      want_bad = UM_ERANGE;
      break;
    }
    case 1:
      ops[bad].bytes = 0;
      want_bad = UM_EINVAL;
      break;
    case 2: /* both a source buffer and host memory */
      if (ops[bad].src == NULL) {
        int pk = km_pick(w, false);
        if (pk < 0) {
          ops[bad].bytes = 0;
          want_bad = UM_EINVAL;
          break;
        }
        ops[bad].src = w->v[pk].b;
      }
      else
        ops[bad].host_src = host;
      want_bad = UM_EINVAL;
      break;
    case 3: /* no destination at all */
      ops[bad].dst = NULL;
      ops[bad].host_dst = NULL;
      want_bad = UM_EINVAL;
      break;
    case 4: /* a read-only destination */
    {
      int ro = -1;
      for (int i = 0; i < w->nv; i++)
        if (w->v[i].ro && w->v[i].live)
          ro = i;
      if (ro < 0 || ops[bad].bytes > w->v[ro].bsize) {
        ops[bad].bytes = 0;
        want_bad = UM_EINVAL;
      } else {
        ops[bad].dst = w->v[ro].b;
        ops[bad].host_dst = NULL;
        ops[bad].dst_off = 0;
        want_bad = UM_ESTATE;
      }
      break;
    }
    case 5: /* a handle of another kind as the source */
      if (w->npend > 0 && w->pend[w->npend - 1].ev != NULL) {
        ops[bad].src = (um_buffer *)w->pend[w->npend - 1].ev;
        ops[bad].host_src = NULL;
        ops[bad].src_off = 0;
        want_bad = UM_EINVAL;
      } else {
        ops[bad].bytes = 0;
        want_bad = UM_EINVAL;
      }
      break;
    default: /* a released buffer */
      if (ops[bad].dst != NULL && km_chance(&w->rng, 50)) {
        ops[bad].dst = km_stale;
        ops[bad].dst_off = 0;
      } else {
        ops[bad].src = km_stale;
        ops[bad].host_src = NULL;
        ops[bad].src_off = 0;
      }
      if (ops[bad].bytes > 4096)
        ops[bad].bytes = 4096;
      want_bad = UM_ESTATE;
      break;
    }
  } else if (km_chance(&w->rng, 3)) {
    null_m = true;
    want_bad = UM_EINVAL;
  }
  if (want_bad != UM_OK) {
    want.a = want.b = want_bad;
    /* which of two reasons comes first is not said: another worker's
     * bracket may refuse a blocking batch before its bad op is seen */
    bool shared = false;
    for (int j = 0; j < nvs; j++)
      shared |= w->v[vs[j]].shared;
    if (w->lenient && (blocking || shared))
      want.b = UM_ESTATE;
  } else
    want = km_expect(w, vs, nvs, dstmask, blocking);
  km_log(w, "batch of %d%s%s %s (bad op %d kind %d)", k, km_any_taint(w, vs, nvs) ? " behind a bracket" : "",
         null_m ? " NULL manager" : "", blocking ? "blocking" : "async", bad, badkind);
  for (int j = 0; j < k; j++)
    km_log(w, "  op %d: kind %d %s [%zu] <- %s [%zu] %zu bytes", j, d[j].kind,
           d[j].di >= 0 ? km_vname(w, d[j].di) : "host", d[j].di >= 0 ? d[j].doff : d[j].hoff,
           d[j].si >= 0 ? km_vname(w, d[j].si) : "host", d[j].si >= 0 ? d[j].soff : d[j].hoff, d[j].n);
  st = um_copy_batch(null_m ? NULL : w->env->m, ops, (size_t)k, blocking ? NULL : &ev);
  KM_ST(w, st, want.a, want.b, "um_copy_batch");
  w->n_batches++;
  if (want_bad != UM_OK)
    w->n_bad_batches++;
  if (st != UM_OK) {
    w->n_refused++;
    KM_CHECK(w, blocking || ev == (um_event *)(uintptr_t)1, "a refused um_copy_batch wrote *done");
    KM_SAME(w, host, sent, total, "a refused um_copy_batch wrote host memory");
    free(host);
    free(sent);
    return true;
  }
  if (!blocking) {
    km_pend *p;
    if (!km_after_issue(w, ev, "batch", all_host, KM_N_ANY, km_any_taint(w, vs, nvs), vmask, &p, &canceled)) {
      free(host);
      free(sent);
      return false;
    }
    snprintf(p->what, sizeof(p->what), "batch of %d", k);
    p->host = host;
    p->n = total;
    if (canceled) {
      p->expect = sent;
      sent = NULL;
    }
    /* every view of the batch may wait for what any waited for (a run
     * completes its copies together); each op's own pair surely does */
    if (!canceled)
      for (int j = 0; j < k; j++)
        if (d[j].kind == 2) {
          int pair[2] = {d[j].di, d[j].si};
          km_join(w, pair, 2, true);
        }
    km_join(w, vs, nvs, false);
  }
  if (!canceled) {
    /* the ops take effect in their order */
    uint8_t *expect = km_dup(host, total);
    for (int j = 0; j < k; j++) {
      km_bop *o = &d[j];
      if (o->kind == 0)
        memcpy(w->v[o->di].model + o->doff, host + o->hoff, o->n);
      else if (o->kind == 1)
        memcpy(expect + o->hoff, w->v[o->si].model + o->soff, o->n);
      else
        memmove(w->v[o->di].model + o->doff, w->v[o->si].model + o->soff, o->n);
    }
    if (blocking) {
      KM_SAME(w, host, expect, total, "blocking um_copy_batch of %d", k);
      free(expect);
      free(host);
    } else {
      w->pend[w->npend - 1].expect = expect;
    }
  } else if (blocking) {
    free(host);
  }
  free(sent);
  return true;
}

/* ------------------------------------------------------------------------ */
/* Brackets */

static bool km_release_view(km_worker *w, int i, int bracket);

static bool km_op_begin(km_worker *w) {
  km_bracket *br;
  km_view *v;
  int i = -1, st;
  um_map_mode mode;
  void *wait = (void *)(uintptr_t)1;
  km_want want = {UM_OK, UM_OK};
  unsigned bit = 0;
  if (!w->brackets || w->nbr >= KM_MAXBR)
    return true;
  for (int tries = 0; tries < 32 && i < 0; tries++) {
    int c = km_pick(w, false);
    bool mine = false;
    if (c < 0 || !w->v[c].bracketable)
      continue;
    for (int b = 0; b < w->nbr; b++)
      mine |= w->br[b].v == c;
    if (!mine)
      i = c;
  }
  if (i < 0)
    return true;
  v = &w->v[i];
  mode = (um_map_mode)km_below(&w->rng, 3); /* READ, WRITE, READ_WRITE */
  if (v->ro && mode != UM_MAP_READ)
    want.a = want.b = UM_ESTATE;
  else if (w->lenient && v->shared)
    want.b = UM_ESTATE; /* another worker's bracket or map on the buffer */
  km_log(w, "begin %s mode %d", km_vname(w, i), (int)mode);
  st = um_access_begin(v->b, mode, &wait);
  KM_ST(w, st, want.a, want.b, "um_access_begin");
  if (st != UM_OK) {
    w->n_refused++;
    KM_CHECK(w, wait == (void *)(uintptr_t)1, "a refused um_access_begin wrote *wait_native");
    return true;
  }
  w->n_brackets++;
  while (w->bits_used & (1u << bit))
    bit++;
  w->bits_used |= 1u << bit;
  br = &w->br[w->nbr++];
  memset(br, 0, sizeof(*br));
  br->v = i;
  br->mode = mode;
  br->wait = wait;
  br->bit = 1u << bit;
  br->before = km_dup(v->model, v->len);
  br->release_inside = w->reallocs && !v->shared && km_chance(&w->rng, 12);
  if (mode != UM_MAP_READ && !br->release_inside && w->env->dev[v->dev].bk != KM_OTHER) {
    km_range(w, v->len, &br->woff, &br->wn);
    br->write = km_xmalloc(br->wn);
    km_fill_random(&w->rng, br->write, br->wn);
    memcpy(v->model + br->woff, br->write, br->wn); /* the caller's write comes before what is issued later */
  }
  v->taint |= br->bit;
  /* the wait handle is what the header says */
  if (wait != NULL && w->env->dev[v->dev].bk == KM_CPU) {
    st = um_event_query((um_event *)wait);
    KM_CHECK(w, st == UM_OK || st == UM_EAGAIN || st == UM_ECANCELED,
             "um_event_query of the wait handle of a cpu bracket: %s", um_err_name(st));
  }
#ifdef KM_HAVE_CL_H
  if (wait != NULL && w->env->dev[v->dev].bk == KM_OCL) {
    cl_context ctx = NULL;
    cl_int err = km_cl_fns.GetEventInfo((cl_event)wait, CL_EVENT_CONTEXT, sizeof(ctx), &ctx, NULL);
    KM_CHECK(w, err == CL_SUCCESS && ctx == (cl_context)w->env->dev[v->dev].nat.cl_context,
             "the wait handle of an OpenCL bracket is no event of the device's context (%d)", err);
  }
#endif
  if (!(w->lenient && v->shared)) {
    void *w2 = (void *)(uintptr_t)1, *p = (void *)(uintptr_t)1;
    st = um_access_begin(v->b, UM_MAP_READ, &w2);
    KM_ST(w, st, UM_ESTATE, UM_ESTATE, "a second um_access_begin of one buffer");
    KM_CHECK(w, w2 == (void *)(uintptr_t)1, "a refused um_access_begin wrote *wait_native");
    if (km_chance(&w->rng, 30)) {
      st = um_map(v->b, UM_MAP_READ, v->base, 1, &p);
      KM_ST(w, st, UM_ESTATE, UM_ESTATE, "um_map of a bracketed buffer");
      KM_CHECK(w, p == (void *)(uintptr_t)1, "a refused um_map wrote *host");
    }
    if (km_chance(&w->rng, 30) && !w->lenient) {
      st = um_device_synchronize(w->env->dev[v->dev].d);
      KM_ST(w, st, UM_ESTATE, UM_ESTATE, "um_device_synchronize of the device of an open bracket");
    }
  }
  return true;
}

/* End the oldest open bracket: the caller's own commands on the buffer
 * first (a read of the view, checked against the model when the bracket
 * began, and the write that the model took then). */
static bool km_end_oldest(km_worker *w) {
  km_bracket br = w->br[0];
  km_view *v = &w->v[br.v];
  km_bk bk = w->env->dev[v->dev].bk;
  int st;
  bool released = false;
  memmove(&w->br[0], &w->br[1], sizeof(w->br[0]) * (size_t)(w->nbr - 1));
  w->nbr--;
  km_log(w, "end %s mode %d%s", km_vname(w, br.v), (int)br.mode, br.release_inside ? " by release" : "");
  if (br.release_inside) {
    if (!km_release_view(w, br.v, (int)br.bit))
      return false;
    released = !v->live || v->b == NULL;
    (void)released;
  } else if (bk == KM_CPU) {
    uint8_t *h = (uint8_t *)um_buffer_host_ptr(v->b);
    KM_CHECK(w, h != NULL, "a buffer of the cpu device has no host view");
    if (br.wait != NULL) {
      st = um_event_wait((um_event *)br.wait);
      KM_CHECK(w, st == UM_OK || st == UM_ECANCELED, "um_event_wait of a cpu bracket's wait handle: %s",
               um_err_name(st));
    }
    KM_SAME(w, h + v->base, br.before, v->len, "the host view of %s in its bracket", km_vname(w, br.v));
    if (br.wn)
      memcpy(h + v->base + br.woff, br.write, br.wn);
    st = um_access_end(v->b, NULL);
    KM_ST(w, st, UM_OK, UM_OK, "um_access_end");
  }
#ifdef KM_HAVE_CL_H
  else if (bk == KM_OCL) {
    um_buffer_native bn;
    cl_command_queue q = (cl_command_queue)w->queue[v->dev];
    cl_event er = NULL, ew = NULL, wl = (cl_event)br.wait;
    cl_int err;
    uint8_t *rbuf = km_xmalloc(v->len);
    km_pend *p;
    st = um_buffer_native_get(v->b, &bn);
    KM_ST(w, st, UM_OK, UM_OK, "um_buffer_native_get");
    KM_CHECK(w, bn.cl_mem != NULL, "an OpenCL DEVICE buffer has no cl_mem");
    if (wl != NULL && strcmp(os_profile(), "pocl-basic") == 0) {
      /* PoCL 3.1's basic device runs a command that waits for a user event
       * (a gate) inside clSetUserEventStatus and deadlocks there on the
       * command's own event lock (docs/design.md says so; PoCL alone does
       * it): wait for a gate on the host instead of in the wait list */
      cl_command_type ct = 0;
      km_cl_fns.GetEventInfo(wl, CL_EVENT_COMMAND_TYPE, sizeof(ct), &ct, NULL);
      if (ct == CL_COMMAND_USER) {
        err = km_cl_fns.WaitForEvents(1, &wl);
        KM_CHECK(w, err == CL_SUCCESS, "clWaitForEvents of a bracket's gate: %d", err);
        wl = NULL;
      }
    }
    err = km_cl_fns.EnqueueReadBuffer(q, (cl_mem)bn.cl_mem, CL_FALSE, bn.offset + v->base, v->len, rbuf,
                                      wl ? 1 : 0, wl ? &wl : NULL, &er);
    KM_CHECK(w, err == CL_SUCCESS, "clEnqueueReadBuffer in a bracket: %d", err);
    if (br.wn) {
      err = km_cl_fns.EnqueueWriteBuffer(q, (cl_mem)bn.cl_mem, CL_FALSE, bn.offset + v->base + br.woff, br.wn,
                                         br.write, 1, &er, &ew);
      KM_CHECK(w, err == CL_SUCCESS, "clEnqueueWriteBuffer in a bracket: %d", err);
    }
    if (km_chance(&w->rng, 15)) {
      KM_CHECK(w, km_cl_fns.Finish(q) == CL_SUCCESS, "clFinish");
      st = um_access_end(v->b, NULL);
    } else {
      st = um_access_end(v->b, ew ? ew : er);
    }
    KM_ST(w, st, UM_OK, UM_OK, "um_access_end (OpenCL)");
    p = km_push(w, NULL, "bracket's own OpenCL commands");
    snprintf(p->what, sizeof(p->what), "OpenCL read in the bracket of %s", km_vname(w, br.v));
    p->host = rbuf;
    p->expect = br.before;
    p->n = v->len;
    p->host2 = br.write;
    p->cl_ev[0] = er;
    p->cl_ev[1] = ew;
    p->native_dev = v->dev;
    br.before = br.write = NULL;
  }
#endif
  else if (bk == KM_CUDA) {
    um_buffer_native bn;
    void *s = w->queue[v->dev], *e = NULL;
    uint8_t *rbuf = km_xmalloc(v->len);
    km_pend *p;
    int r;
    st = um_buffer_native_get(v->b, &bn);
    KM_ST(w, st, UM_OK, UM_OK, "um_buffer_native_get");
    KM_CHECK(w, bn.cu_ptr != 0, "a CUDA DEVICE buffer has no CUdeviceptr");
    KM_CHECK(w, km_cu_fns.CtxSetCurrent(w->env->dev[v->dev].nat.cu_context) == 0, "cuCtxSetCurrent");
    if (br.wait != NULL)
      KM_CHECK(w, (r = km_cu_fns.StreamWaitEvent(s, br.wait, 0)) == 0, "cuStreamWaitEvent: %d", r);
    KM_CHECK(w, (r = km_cu_fns.MemcpyDtoHAsync(rbuf, bn.cu_ptr + bn.offset + v->base, v->len, s)) == 0,
             "cuMemcpyDtoHAsync: %d", r);
    if (br.wn)
      KM_CHECK(w, (r = km_cu_fns.MemcpyHtoDAsync(bn.cu_ptr + bn.offset + v->base + br.woff, br.write, br.wn, s)) == 0,
               "cuMemcpyHtoDAsync: %d", r);
    KM_CHECK(w, km_cu_fns.EventCreate(&e, 0) == 0 && km_cu_fns.EventRecord(e, s) == 0, "cuEventCreate/Record");
    st = um_access_end(v->b, e);
    KM_ST(w, st, UM_OK, UM_OK, "um_access_end (CUDA)");
    p = km_push(w, NULL, "bracket's own CUDA commands");
    snprintf(p->what, sizeof(p->what), "CUDA read in the bracket of %s", km_vname(w, br.v));
    p->host = rbuf;
    p->expect = br.before;
    p->n = v->len;
    p->host2 = br.write;
    p->cu_ev = e;
    p->native_dev = v->dev;
    br.before = br.write = NULL;
  } else {
    st = um_access_end(v->b, NULL);
    KM_ST(w, st, UM_OK, UM_OK, "um_access_end");
  }
  if (v->live && !br.release_inside && br.mode != UM_MAP_READ && (bk == KM_OCL || bk == KM_CUDA))
    KM_CHECK(w, um_buffer_valid(v->b) & UM_VALID_DEVICE,
             "after a bracket of mode %d, um_buffer_valid of %s is 0x%x (no UM_VALID_DEVICE)", (int)br.mode,
             km_vname(w, br.v), um_buffer_valid(v->b));
  if (v->live && !(w->lenient && v->shared)) {
    st = um_access_end(v->b, NULL);
    KM_ST(w, st, UM_ESTATE, UM_ESTATE, "a second um_access_end");
  }
  for (int i = 0; i < w->nv; i++) {
    w->v[i].taint &= ~br.bit;
    w->v[i].maybe &= ~br.bit;
  }
  w->bits_used &= ~br.bit;
  free(br.before);
  free(br.write);
  return true;
}

/* ------------------------------------------------------------------------ */
/* Releases */

/* Release view i (its bracket br_bit open when nonzero), check the stale
 * handle, and allocate it again. */
static bool km_release_view(km_worker *w, int i, int br_bit) {
  km_view *v = &w->v[i];
  um_buffer *b = v->b;
  unsigned other = (v->taint | v->maybe) & ~(unsigned)br_bit;
  km_want want = {UM_OK, UM_OK};
  int st;
  if (v->wrap_mem != NULL && (v->taint & ~(unsigned)br_bit))
    want.a = want.b = UM_ESTATE; /* a wrap's release would wait through another bracket */
  else if (v->wrap_mem != NULL && (other || w->lenient))
    want.b = UM_ESTATE; /* (lenient: through another worker's bracket) */
  km_log(w, "release %s%s", km_vname(w, i), br_bit ? " inside its bracket" : "");
  st = um_release(b);
  KM_ST(w, st, want.a, want.b, "um_release");
  if (br_bit) {
    /* either way the bracket is ended */
    v->taint &= ~(unsigned)br_bit;
    v->maybe &= ~(unsigned)br_bit;
    if (st != UM_OK) {
      /* the header: "the release is refused with UM_ESTATE and changes
       * nothing: the wrap stays live, and a bracket open on it stays open" */
      int st2 = um_access_end(b, NULL);
      KM_ST(w, st2, UM_OK, UM_OK, "um_access_end after a refused wrap release (its bracket stays open)");
    }
  }
  if (st != UM_OK)
    return true; /* the wrap stays live */
  w->n_reallocs++;
  if (v->wrap_mem != NULL) {
    /* the release waited for the operations issued on the wrap */
    for (size_t k = 0; k < w->npend; k++) {
      km_pend *p = &w->pend[k];
      /* (a batch's event waits for its copies on other buffers too: the
       * poison below catches a copy of it that still touches the wrap) */
      if (p->ev != NULL && (p->vmask & (1u << i)) && strncmp(p->what, "batch", 5) != 0) {
        st = um_event_query(p->ev);
        KM_CHECK(w, st != UM_EAGAIN, "%s still pending after the release of the wrap it uses returned", p->what);
      }
    }
    memset(v->wrap_mem, 0xEE, v->bsize); /* the caller may reuse it now */
  }
  v->live = false;
  if (!w->threaded) {
    uint8_t tmp[8] = {0};
    um_event *ev = (um_event *)(uintptr_t)1;
    void *p = (void *)(uintptr_t)1;
    int other_i = -1;
    for (int j = 0; j < w->nv; j++)
      if (j != i && w->v[j].live && !w->v[j].ro && w->v[j].taint == 0 && w->v[j].maybe == 0)
        other_i = j;
    KM_ST(w, um_copy_from_host(b, 0, tmp, 1, NULL), UM_ESTATE, UM_ESTATE, "um_copy_from_host of a released buffer");
    KM_ST(w, um_copy_to_host(b, 0, tmp, 1, &ev), UM_ESTATE, UM_ESTATE, "um_copy_to_host of a released buffer");
    KM_CHECK(w, ev == (um_event *)(uintptr_t)1, "a refused call wrote *done");
    KM_ST(w, um_fill(b, 0, 1, 1, &ev), UM_ESTATE, UM_ESTATE, "um_fill of a released buffer");
    KM_ST(w, um_map(b, UM_MAP_READ, 0, 1, &p), UM_ESTATE, UM_ESTATE, "um_map of a released buffer");
    KM_ST(w, um_access_begin(b, UM_MAP_READ, &p), UM_ESTATE, UM_ESTATE, "um_access_begin of a released buffer");
    KM_CHECK(w, p == (void *)(uintptr_t)1, "a refused call wrote its out-parameter");
    KM_ST(w, um_access_end(b, NULL), UM_ESTATE, UM_ESTATE, "um_access_end of a released buffer");
    KM_ST(w, um_release(b), UM_ESTATE, UM_ESTATE, "um_release twice");
    KM_ST(w, um_buffer_retain(b), UM_ESTATE, UM_ESTATE, "um_buffer_retain of a released buffer");
    KM_CHECK(w, um_buffer_size(b) == 0, "um_buffer_size of a released buffer is %zu", um_buffer_size(b));
    if (other_i >= 0) {
      um_copy_op ops[2];
      km_view *o = &w->v[other_i];
      memset(ops, 0, sizeof(ops));
      KM_ST(w, um_copy(o->b, o->base, b, 0, 1, &ev), UM_ESTATE, UM_ESTATE, "um_copy from a released buffer");
      KM_ST(w, um_copy(b, 0, o->b, o->base, 1, NULL), UM_ESTATE, UM_ESTATE, "um_copy into a released buffer");
      /* a batch whose second op names the released buffer: nothing of it
       * is issued (the first op would write the other view) */
      ops[0].dst = o->b;
      ops[0].dst_off = o->base;
      ops[0].host_src = tmp;
      ops[0].bytes = 1;
      tmp[0] = (uint8_t)(o->model[0] ^ 0x5a);
      ops[1].dst = b;
      ops[1].host_src = tmp;
      ops[1].bytes = 1;
      KM_ST(w, um_copy_batch(w->env->m, ops, 2, km_chance(&w->rng, 50) ? NULL : &ev), UM_ESTATE, UM_ESTATE,
            "um_copy_batch naming a released buffer");
      KM_CHECK(w, ev == (um_event *)(uintptr_t)1, "a refused batch wrote *done");
      if (w->net != NULL) {
        KM_ST(w, um_net_put(w->net->ep, b, 0, w->net->key, w->net->klen, 0, 1, NULL), UM_ESTATE, UM_ESTATE,
              "um_net_put from a released buffer");
        KM_ST(w, um_net_get(w->net->ep, b, 0, w->net->key, w->net->klen, 0, 1, &ev), UM_ESTATE, UM_ESTATE,
              "um_net_get into a released buffer");
      }
    }
    km_stale = b; /* for the batches, until the slot is allocated again */
  }
  if (!w->threaded && km_chance(&w->rng, 50))
    return true; /* allocated again by a later step */
  return km_view_alloc(w, i, km_chance(&w->rng, 50));
}

/* Allocate again a view left released. */
static bool km_op_revive(km_worker *w) {
  for (int i = 0; i < w->nv; i++)
    if (!w->v[i].live) {
      km_log(w, "allocate %s again", km_vname(w, i));
      return km_view_alloc(w, i, km_chance(&w->rng, 50));
    }
  return true;
}

static bool km_op_release(km_worker *w) {
  int i = -1;
  if (!w->reallocs)
    return true;
  for (int tries = 0; tries < 16 && i < 0; tries++) {
    int c = km_pick(w, false);
    bool mine = false;
    if (c < 0 || w->v[c].shared)
      continue;
    for (int b = 0; b < w->nbr; b++)
      mine |= w->br[b].v == c;
    if (!mine)
      i = c;
  }
  if (i < 0)
    return true;
  /* often with work in flight on it */
  if (km_chance(&w->rng, 60)) {
    size_t off, n;
    km_range(w, w->v[i].len, &off, &n);
    if (!km_d2h(w, i, off, n, false))
      return false;
  }
  return km_release_view(w, i, 0);
}

/* ------------------------------------------------------------------------ */
/* Maps */

static bool km_op_map(km_worker *w) {
  int i = km_pick(w, false), st;
  um_map_mode mode = (um_map_mode)km_below(&w->rng, 4);
  size_t off, n;
  void *p = (void *)(uintptr_t)1, *p2 = (void *)(uintptr_t)1;
  km_want want;
  km_view *v;
  if (!w->maps || i < 0)
    return true;
  v = &w->v[i];
  km_range(w, v->len, &off, &n);
  want = km_expect(w, &i, 1, mode != UM_MAP_READ ? 1u : 0u, true);
  km_log(w, "map %s [%zu,+%zu) mode %d", km_vname(w, i), off, n, (int)mode);
  st = um_map(v->b, mode, v->base + off, n, &p);
  KM_ST(w, st, want.a, want.b, "um_map");
  if (st != UM_OK) {
    w->n_refused++;
    KM_CHECK(w, p == (void *)(uintptr_t)1, "a refused um_map wrote *host");
    return true;
  }
  w->n_maps++;
  KM_CHECK(w, p != NULL, "um_map gave NULL");
  if (mode != UM_MAP_WRITE_DISCARD)
    KM_SAME(w, p, v->model + off, n, "um_map mode %d of %s [%zu,+%zu)", (int)mode, km_vname(w, i), off, n);
  if (!(w->lenient && v->shared)) {
    st = um_map(v->b, UM_MAP_READ, v->base, 1, &p2);
    KM_ST(w, st, UM_ESTATE, UM_ESTATE, "um_map of a mapped buffer");
    KM_CHECK(w, p2 == (void *)(uintptr_t)1, "a refused um_map wrote *host");
    st = um_unmap(v->b, (uint8_t *)p + 1);
    KM_ST(w, st, UM_EINVAL, UM_EINVAL, "um_unmap of a pointer um_map did not return");
    if (v->bracketable && km_chance(&w->rng, 30)) {
      p2 = (void *)(uintptr_t)1;
      st = um_access_begin(v->b, UM_MAP_READ, &p2);
      KM_ST(w, st, UM_ESTATE, UM_ESTATE, "um_access_begin of a mapped buffer");
    }
  }
  if (mode == UM_MAP_WRITE_DISCARD) {
    km_fill_random(&w->rng, p, n);
    memcpy(v->model + off, p, n);
  } else if (mode != UM_MAP_READ) {
    size_t o2, n2;
    km_range(w, n, &o2, &n2);
    km_fill_random(&w->rng, (uint8_t *)p + o2, n2);
    memcpy(v->model + off + o2, (uint8_t *)p + o2, n2);
  }
  st = um_unmap(v->b, p);
  KM_ST(w, st, UM_OK, UM_OK, "um_unmap");
  if (!(w->lenient && v->shared)) {
    st = um_unmap(v->b, p);
    KM_ST(w, st, UM_ESTATE, UM_ESTATE, "um_unmap twice");
  }
  return true;
}

/* ------------------------------------------------------------------------ */
/* Streams */

typedef struct km_sctx {
  km_worker *w;
  int i;
  size_t next, end;
  uint64_t last_done, total;
  int calls, stop_at, progress_calls;
  bool bad;
} km_sctx;

static int km_chunk(void *user, um_buffer *chunk, size_t offset, size_t bytes) {
  km_sctx *c = user;
  km_worker *w = c->w;
  km_view *v = &w->v[c->i];
  uint8_t *tmp;
  int st;
  if (c->bad)
    return 99;
  if (offset != c->next || bytes == 0 || offset + bytes > c->end) {
    km_fail(w, __LINE__, "chunk order", "um_stream gave chunk [%zu,+%zu), expected one at %zu (end %zu)", offset,
            bytes, c->next, c->end);
    c->bad = true;
    return 99;
  }
  tmp = km_xmalloc(bytes);
  st = um_copy_to_host(chunk, 0, tmp, bytes, NULL);
  if (st != UM_OK) {
    km_fail(w, __LINE__, "st == UM_OK", "um_copy_to_host of a stream chunk: %s", um_err_name(st));
    c->bad = true;
    free(tmp);
    return 99;
  }
  if (km_first_diff(tmp, v->model + (offset - v->base), bytes) != SIZE_MAX) {
    size_t d = km_first_diff(tmp, v->model + (offset - v->base), bytes);
    km_fail(w, __LINE__, "chunk bytes", "stream chunk [%zu,+%zu) of %s: byte %zu is 0x%02x, the model says 0x%02x",
            offset, bytes, km_vname(w, c->i), d, tmp[d], v->model[offset - v->base + d]);
    c->bad = true;
    free(tmp);
    return 99;
  }
  free(tmp);
  if (km_chance(&w->rng, 40)) {
    /* operations of our own on the chunk, ordered before the next copy
     * into it: a fill whose event goes at once */
    um_event *ev = NULL;
    st = um_fill(chunk, 0, 0x3c, bytes, &ev);
    if (st != UM_OK) {
      km_fail(w, __LINE__, "st == UM_OK", "um_fill of a stream chunk: %s", um_err_name(st));
      c->bad = true;
      return 99;
    }
    um_event_release(ev);
    w->fills_ran++;
  }
  c->next = offset + bytes;
  c->calls++;
  if (c->stop_at && c->calls == c->stop_at)
    return 7;
  return 0;
}

static void km_progress(void *user, uint64_t done_bytes, uint64_t total_bytes) {
  km_sctx *c = user;
  if (c->bad)
    return;
  if (done_bytes <= c->last_done || done_bytes > total_bytes || total_bytes != c->total) {
    km_fail(c->w, __LINE__, "progress", "um_stream progress %llu of %llu after %llu (total %llu)",
            (unsigned long long)done_bytes, (unsigned long long)total_bytes, (unsigned long long)c->last_done,
            (unsigned long long)c->total);
    c->bad = true;
  }
  c->last_done = done_bytes;
  c->progress_calls++;
}

static bool km_op_stream(km_worker *w) {
  int i = km_pick(w, false), d, st;
  size_t off, n, chunk;
  km_sctx c;
  km_want want;
  km_view *v;
  if (!w->streams || i < 0)
    return true;
  v = &w->v[i];
  km_range(w, v->len, &off, &n);
  d = (int)km_below(&w->rng, (size_t)w->env->ndev);
  chunk = 1 + km_below(&w->rng, n < 8192 ? n : (km_chance(&w->rng, 50) ? n : 8192));
  memset(&c, 0, sizeof(c));
  c.w = w;
  c.i = i;
  c.next = v->base + off;
  c.end = v->base + off + n;
  c.total = n;
  if (km_chance(&w->rng, 15))
    c.stop_at = 1 + (int)km_below(&w->rng, 3);
  want = km_expect(w, &i, 1, 0, true);
  km_log(w, "stream %s [%zu,+%zu) on d%d, chunks of %zu%s", km_vname(w, i), off, n, d, chunk,
         c.stop_at ? " (stopped early)" : "");
  st = um_stream(v->b, v->base + off, n, w->env->dev[d].d, chunk, km_chunk, km_progress, &c);
  if (c.bad || w->failed)
    return false;
  if (want.a == UM_OK && c.stop_at && (size_t)c.stop_at <= (n + chunk - 1) / chunk)
    want.a = 7;
  KM_CHECK(w, st == want.a || st == want.b, "um_stream answered %d (%s), expected %d or %d", st, um_err_name(st),
           want.a, want.b);
  w->n_streams++;
  if (st == UM_OK)
    KM_CHECK(w, c.next == c.end && c.last_done == n, "um_stream returned UM_OK after %zu of %zu bytes", c.next - (v->base + off), n);
  return true;
}

/* ------------------------------------------------------------------------ */
/* um_net over a loopback endpoint: the exposed target takes net operations
 * alone, one at a time (puts and gets of one target are not ordered with
 * each other); the local side is any view, ordered with its other work. */

static bool km_op_net(km_worker *w) {
  km_net *N = w->net;
  int i, st;
  bool put = km_chance(&w->rng, 50), blocking = km_chance(&w->rng, 30), canceled = false;
  size_t off, n, toff;
  um_event *ev = (um_event *)(uintptr_t)1;
  km_want want;
  km_view *v;
  if (N == NULL || N->unknown)
    return true;
  if (N->last != NULL) {
    st = um_event_query(N->last);
    if (st == UM_EAGAIN)
      return true;
    N->last = NULL;
  }
  if (!N->exposed) {
    if (km_chance(&w->rng, 50)) {
      /* the old key is refused: nothing written */
      i = km_pick(w, false);
      if (i >= 0 && w->v[i].taint == 0 && w->v[i].maybe == 0 && !w->lenient) {
        km_log(w, "net put with a revoked key from %s", km_vname(w, i));
        st = um_net_put(N->ep, w->v[i].b, w->v[i].base, N->oldkey, N->oldklen, 0, 1, NULL);
        KM_ST(w, st, UM_ESTATE, UM_ESTATE, "um_net_put with the key of an unexposed buffer");
      }
    }
    N->klen = sizeof(N->key);
    st = um_net_expose(N->t, N->key, &N->klen);
    KM_ST(w, st, UM_OK, UM_OK, "um_net_expose again");
    N->exposed = true;
    km_log(w, "net: exposed again");
    return true;
  }
  if (km_chance(&w->rng, 4)) {
    memcpy(N->oldkey, N->key, N->klen);
    N->oldklen = N->klen;
    st = um_net_unexpose(N->t);
    KM_ST(w, st, UM_OK, UM_OK, "um_net_unexpose");
    N->exposed = false;
    km_log(w, "net: unexposed");
    return true;
  }
  i = km_pick(w, !put);
  if (i < 0)
    return true;
  v = &w->v[i];
  km_range(w, v->len < N->tlen ? v->len : N->tlen, &off, &n);
  off = km_below(&w->rng, v->len - n + 1);
  toff = km_below(&w->rng, N->tlen - n + 1);
  want = km_expect(w, &i, 1, put ? 0u : 1u, blocking);
  km_log(w, "net %s %s [%zu,+%zu) target [%zu] %s", put ? "put from" : "get into", km_vname(w, i), off, n, toff,
         blocking ? "blocking" : "async");
  if (put)
    st = um_net_put(N->ep, v->b, v->base + off, N->key, N->klen, toff, n, blocking ? NULL : &ev);
  else
    st = um_net_get(N->ep, v->b, v->base + off, N->key, N->klen, toff, n, blocking ? NULL : &ev);
  KM_ST(w, st, want.a, want.b, put ? "um_net_put" : "um_net_get");
  w->n_nets++;
  if (st != UM_OK) {
    w->n_refused++;
    KM_CHECK(w, blocking || ev == (um_event *)(uintptr_t)1, "a refused net call wrote *done");
    return true;
  }
  if (!blocking) {
    km_pend *p;
    N->last = ev;
    if (!km_after_issue(w, ev, put ? "net put" : "net get", false, KM_N_HOSTONLY, v->taint != 0, 1u << i, &p,
                        &canceled))
      return false;
    snprintf(p->what, sizeof(p->what), "net %s %s [%zu,+%zu) target [%zu]", put ? "put" : "get", km_vname(w, i), off,
             n, toff);
  }
  if (!canceled) {
    if (put)
      memcpy(N->tmodel + toff, v->model + off, n);
    else
      memcpy(v->model + off, N->tmodel + toff, n);
    w->net_ran++;
    if (put)
      w->net_out += n;
    else
      w->net_in += n;
  }
  return true;
}

/* ------------------------------------------------------------------------ */
/* Bad arguments, and handles of the wrong kind: exact codes, nothing
 * written, a detail in um_last_error(). */

static bool km_op_bad(km_worker *w) {
  int i = km_pick(w, true), st;
  km_view *v;
  uint8_t tmp[16];
  um_event *ev = (um_event *)(uintptr_t)1;
  size_t big;
  if (i < 0)
    return true;
  v = &w->v[i];
  big = v->bsize - 3 + km_below(&w->rng, 3);
  km_log(w, "bad arguments on %s", km_vname(w, i));
  memset(tmp, 0x11, sizeof(tmp));
  switch (km_below(&w->rng, 10)) {
  case 0:
    st = um_copy_from_host(v->b, big, tmp, 4, km_chance(&w->rng, 50) ? NULL : &ev);
    KM_ST(w, st, UM_ERANGE, UM_ERANGE, "um_copy_from_host past the end");
    break;
  case 1:
    st = um_copy_to_host(v->b, big, tmp, 4, &ev);
    KM_ST(w, st, UM_ERANGE, UM_ERANGE, "um_copy_to_host past the end");
    break;
  case 2:
    st = um_fill(v->b, 1, 0, v->bsize, &ev);
    KM_ST(w, st, UM_ERANGE, UM_ERANGE, "um_fill one past the end");
    break;
  case 3:
    st = um_copy(v->b, 0, v->b, SIZE_MAX - 2, 4, &ev);
    KM_CHECK(w, st == UM_ERANGE || st == UM_EOVERFLOW, "um_copy from an offset near SIZE_MAX: %s", um_err_name(st));
    KM_CHECK(w, um_last_error()[0] != '\0', "no detail");
    break;
  case 4:
    st = um_copy_from_host(v->b, 0, tmp, 0, &ev);
    KM_ST(w, st, UM_EINVAL, UM_EINVAL, "um_copy_from_host of zero bytes");
    break;
  case 5:
    st = um_copy_to_host(v->b, 0, NULL, 4, &ev);
    KM_ST(w, st, UM_EINVAL, UM_EINVAL, "um_copy_to_host into NULL");
    break;
  case 6:
    /* an event as a buffer, a buffer as an event */
    if (w->npend > 0 && w->pend[w->npend - 1].ev != NULL) {
      um_event *e = w->pend[w->npend - 1].ev;
      st = um_copy_from_host((um_buffer *)e, 0, tmp, 1, NULL);
      KM_ST(w, st, UM_EINVAL, UM_EINVAL, "an event as the buffer of um_copy_from_host");
      st = um_release((um_buffer *)e);
      KM_ST(w, st, UM_EINVAL, UM_EINVAL, "um_release of an event");
      st = um_access_begin((um_buffer *)e, UM_MAP_READ, (void **)&ev);
      KM_ST(w, st, UM_EINVAL, UM_EINVAL, "um_access_begin of an event");
    }
    st = um_event_query((um_event *)v->b);
    KM_ST(w, st, UM_EINVAL, UM_EINVAL, "um_event_query of a buffer");
    st = um_event_release((um_event *)v->b);
    KM_ST(w, st, UM_EINVAL, UM_EINVAL, "um_event_release of a buffer");
    {
      void *nat = NULL;
      st = um_event_native((um_event *)v->b, &nat);
      KM_ST(w, st, UM_EINVAL, UM_EINVAL, "um_event_native of a buffer");
    }
    break;
  case 7:
    st = um_access_begin(v->b, (um_map_mode)7, (void **)&ev);
    KM_ST(w, st, UM_EINVAL, UM_EINVAL, "um_access_begin with an unknown mode");
    break;
  case 8:
    st = um_copy_batch(w->env->m, NULL, 1, &ev);
    KM_ST(w, st, UM_EINVAL, UM_EINVAL, "um_copy_batch of NULL ops");
    break;
  default:
    st = um_map(v->b, (um_map_mode)9, v->base, 1, (void **)&ev);
    KM_ST(w, st, UM_EINVAL, UM_EINVAL, "um_map with an unknown mode");
    break;
  }
  KM_CHECK(w, ev == (um_event *)(uintptr_t)1, "a refused call wrote its out-parameter");
  return true;
}

/* ------------------------------------------------------------------------ */
/* Waiting */

static bool km_op_settle_some(km_worker *w) {
  size_t k = 1 + km_below(&w->rng, 4);
  for (size_t j = 0; j < k && w->npend > 0; j++) {
    size_t i = km_below(&w->rng, w->npend);
    bool gone;
    /* a worker holding a bracket never waits for anything else */
    if (!km_settle(w, i, w->nbr == 0 && km_chance(&w->rng, 70), &gone))
      return false;
  }
  return true;
}

static bool km_op_orphan_some(km_worker *w) {
  for (int tries = 0; tries < 4 && w->npend > 0; tries++) {
    km_pend *p = &w->pend[km_below(&w->rng, w->npend)];
    if (p->ev != NULL) {
      km_log(w, "release early the event of %s", p->what);
      return km_orphan(w, p);
    }
  }
  return true;
}

/* Everything issued has finished, and every byte is the model's. Only
 * with no bracket open. */
static bool km_sync(km_worker *w) {
  int st;
  w->n_syncs++;
  km_log(w, "sync (%zu pending)", w->npend);
  for (size_t i = w->npend; i-- > 0;) {
    bool gone;
    if (i < w->npend && !km_settle(w, i, true, &gone))
      return false;
  }
  for (int d = 0; d < w->env->ndev; d++) {
    uint64_t end = os_now_ms() + 30000;
    do {
      /* other workers' open brackets refuse it, at once */
      st = um_device_synchronize(w->env->dev[d].d);
      if (st == UM_ESTATE && w->threaded)
        os_sleep_ms(1);
    } while (st == UM_ESTATE && w->threaded && os_now_ms() < end);
    KM_ST(w, st, UM_OK, UM_OK, "um_device_synchronize");
  }
  /* orphans and the brackets' own commands */
  while (w->npend > 0) {
    km_pend *p = &w->pend[w->npend - 1];
    KM_CHECK(w, p->ev == NULL, "an event left after the waits");
#ifdef KM_HAVE_CL_H
    if (p->cl_ev[0] != NULL || p->cl_ev[1] != NULL) {
      cl_event last = p->cl_ev[1] ? (cl_event)p->cl_ev[1] : (cl_event)p->cl_ev[0];
      cl_int err = km_cl_fns.WaitForEvents(1, &last);
      KM_CHECK(w, err == CL_SUCCESS, "clWaitForEvents of the bracket's commands: %d", err);
      for (int k = 0; k < 2; k++)
        if (p->cl_ev[k] != NULL)
          km_cl_fns.ReleaseEvent((cl_event)p->cl_ev[k]);
      p->cl_ev[0] = p->cl_ev[1] = NULL;
    }
#endif
    if (p->cu_ev != NULL) {
      KM_CHECK(w, km_cu_fns.EventSynchronize(p->cu_ev) == 0, "cuEventSynchronize");
      km_cu_fns.EventDestroy(p->cu_ev);
      p->cu_ev = NULL;
    }
    if (!km_pend_check(w, p))
      return false;
    w->npend--;
  }
  /* every byte of every view */
  for (int i = 0; i < w->nv; i++) {
    km_view *v = &w->v[i];
    uint8_t *h;
    if (!v->live)
      continue;
    h = km_xmalloc(v->len);
    {
      uint64_t end = os_now_ms() + 30000;
      do {
        st = um_copy_to_host(v->b, v->base, h, v->len, NULL);
        if (st == UM_ESTATE && w->lenient)
          os_sleep_ms(1);
      } while (st == UM_ESTATE && w->lenient && os_now_ms() < end);
    }
    if (st != UM_OK)
      free(h);
    KM_ST(w, st, UM_OK, UM_OK, "um_copy_to_host at a sync");
    if (km_first_diff(h, v->model, v->len) != SIZE_MAX) {
      size_t d = km_first_diff(h, v->model, v->len);
      uint8_t got = h[d];
      free(h);
      KM_CHECK(w, false, "at a sync, byte %zu of %s (of %zu) is 0x%02x, the model says 0x%02x", d, km_vname(w, i),
               v->len, got, v->model[d]);
    }
    free(h);
    if (w->env->dev[v->dev].bk == KM_CPU || v->loc == UM_HOST) {
      uint8_t *hv = um_buffer_host_ptr(v->b);
      KM_CHECK(w, hv != NULL, "%s has no host view", km_vname(w, i));
      KM_SAME(w, hv + v->base, v->model, v->len, "the host view of %s at a sync", km_vname(w, i));
    }
  }
  if (w->net != NULL) {
    KM_SAME(w, um_buffer_host_ptr(w->net->t), w->net->tmodel, w->net->tlen, "the net target at a sync");
    w->net->unknown = false;
    w->net->last = NULL;
  }
  if (!w->threaded) {
    /* each operation was counted by its own kind */
    um_stats s;
    KM_ST(w, um_stats_get(w->env->m, NULL, &s), UM_OK, UM_OK, "um_stats_get");
    KM_CHECK(w, s.fills - w->base.fills == w->fills_ran, "um_stats says %llu fills ran, %lu did",
             (unsigned long long)(s.fills - w->base.fills), w->fills_ran);
    KM_CHECK(w, s.xfer_net - w->base.xfer_net == w->net_ran, "um_stats says %llu net transfers ran, %lu did",
             (unsigned long long)(s.xfer_net - w->base.xfer_net), w->net_ran);
    KM_CHECK(w, s.bytes_net_out - w->base.bytes_net_out == w->net_out, "um_stats says %llu bytes put, %lu were",
             (unsigned long long)(s.bytes_net_out - w->base.bytes_net_out), w->net_out);
    KM_CHECK(w, s.bytes_net_in - w->base.bytes_net_in == w->net_in, "um_stats says %llu bytes got, %lu were",
             (unsigned long long)(s.bytes_net_in - w->base.bytes_net_in), w->net_in);
  }
  return true;
}

/* ------------------------------------------------------------------------ */
/* The loop */

static bool km_step(km_worker *w) {
  unsigned r = (unsigned)km_below(&w->rng, 100);
  bool ok = true;
  if (w->npend > KM_MAXPEND) {
    if (w->nbr > 0)
      return km_end_oldest(w);
    for (int k = 0; k < 8 && w->npend > 0 && ok; k++) {
      bool gone;
      ok = km_settle(w, 0, true, &gone);
    }
    return ok;
  }
  if (w->net != NULL && km_chance(&w->rng, 15))
    ok = km_op_net(w);
  else if (r < 11)
    ok = km_op_h2d(w);
  else if (r < 20)
    ok = km_op_d2h(w);
  else if (r < 34)
    ok = km_op_copy(w);
  else if (r < 41)
    ok = km_op_fill(w);
  else if (r < 52)
    ok = km_op_batch(w);
  else if (r < 59)
    ok = km_op_begin(w);
  else if (r < 66)
    ok = w->nbr > 0 ? km_end_oldest(w) : km_op_copy(w);
  else if (r < 70)
    ok = km_op_map(w);
  else if (r < 72)
    ok = km_op_stream(w);
  else if (r < 80)
    ok = w->net != NULL ? km_op_net(w) : km_op_batch(w);
  else if (r < 83)
    ok = km_chance(&w->rng, 30) ? km_op_revive(w) : km_op_release(w);
  else if (r < 89)
    ok = km_op_settle_some(w);
  else if (r < 91)
    ok = km_op_orphan_some(w);
  else if (r < 94)
    ok = km_op_bad(w);
  else {
    /* a look at some view, as after each step in a checked program */
    int i = km_pick(w, false);
    if (i >= 0) {
      size_t off, n;
      km_range(w, w->v[i].len, &off, &n);
      ok = km_readback(w, i, off, n, w->nbr == 0 ? km_chance(&w->rng, 20) : km_chance(&w->rng, 5));
    }
  }
  if (!ok)
    return false;
  if (w->step % 40 == 39) {
    while (w->nbr > 0 && ok)
      ok = km_end_oldest(w);
    if (ok)
      ok = km_sync(w);
  }
  return ok;
}

/* After a failed check: end the brackets still open, so that the other
 * workers, whose operations may wait for them, finish. */
static void km_abandon(km_worker *w) {
  for (int b = 0; b < w->nbr; b++)
    if (w->v[w->br[b].v].live)
      um_access_end(w->v[w->br[b].v].b, NULL);
  w->nbr = 0;
}

static bool km_run(km_worker *w) {
  bool ok = true;
  for (w->step = 0; w->step < w->steps && ok; w->step++)
    ok = km_step(w);
  while (ok && w->nbr > 0)
    ok = km_end_oldest(w);
  if (ok)
    ok = km_sync(w);
  if (!ok)
    km_abandon(w);
  return ok;
}

static void *km_thread(void *arg) {
  km_worker *w = arg;
  km_run(w);
  atomic_store(&w->finished, 1);
  return NULL;
}

/* A worker on env with steps steps and its seed; the caller adds views. */
static OS_UNUSED km_worker *km_worker_new(km_env *e, int id, long steps, uint64_t seed, bool threaded) {
  km_worker *w = calloc(1, sizeof(*w));
  cr_assert_not_null(w);
  w->env = e;
  w->id = id;
  w->steps = (long)km_env_u64("KM_STEPS", (uint64_t)steps);
  w->seed = km_env_u64("KM_SEED", seed) + (uint64_t)id * 7919u;
  w->rng.s = w->seed * 0x9E3779B97F4A7C15ull + 1;
  w->threaded = threaded;
  w->brackets = w->maps = w->streams = w->cancels = w->reallocs = true;
  cr_assert_eq(um_stats_get(e->m, NULL, &w->base), UM_OK);
  for (int d = 0; d < e->ndev; d++) {
    w->queue[d] = e->dev[d].bk == KM_OCL ? e->dev[d].nat.cl_queue : e->dev[d].nat.cu_stream;
#ifdef KM_HAVE_CL_H
    if (threaded && e->dev[d].bk == KM_OCL) {
      cl_int err = CL_SUCCESS;
      w->queue[d] = km_cl_fns.CreateCommandQueue((cl_context)e->dev[d].nat.cl_context,
                                                 (cl_device_id)e->dev[d].nat.cl_device, 0, &err);
      cr_assert(w->queue[d] != NULL && err == CL_SUCCESS, "clCreateCommandQueue: %d", err);
      w->own_queues = true;
    }
#endif
    if (threaded && e->dev[d].bk == KM_CUDA) {
      cr_assert_eq(km_cu_fns.CtxSetCurrent(e->dev[d].nat.cu_context), 0);
      cr_assert_eq(km_cu_fns.StreamCreate(&w->queue[d], 0), 0);
      w->own_queues = true;
    }
  }
  return w;
}

/* Release the worker's own buffers and free it; its counts go to the log. */
static OS_UNUSED void km_worker_free(km_worker *w) {
  for (int i = 0; i < w->nv; i++) {
    km_view *v = &w->v[i];
    if (v->live && !v->shared)
      cr_assert_eq(um_release(v->b), UM_OK, "um_release at the end: %s", um_last_error());
    free(v->model);
    free(v->wrap_mem);
  }
  for (int d = 0; d < w->env->ndev && w->own_queues; d++) {
#ifdef KM_HAVE_CL_H
    if (w->env->dev[d].bk == KM_OCL)
      km_cl_fns.ReleaseCommandQueue((cl_command_queue)w->queue[d]);
#endif
    if (w->env->dev[d].bk == KM_CUDA)
      km_cu_fns.StreamDestroy(w->queue[d]);
  }
  fprintf(stderr,
          "[kinds_mixed %s] worker %d seed %llu: %ld steps, %lu ops, %lu batches (%lu bad), %lu brackets, %lu "
          "maps, %lu streams, %lu net, %lu cancels, %lu natives, %lu reallocs, %lu orphans, %lu refused, %lu "
          "syncs\n",
          os_profile(), w->id, (unsigned long long)w->seed, w->step, w->n_ops, w->n_batches, w->n_bad_batches,
          w->n_brackets, w->n_maps, w->n_streams, w->n_nets, w->n_cancel_ok, w->n_native_ok, w->n_reallocs,
          w->n_orphans, w->n_refused, w->n_syncs);
  free(w->pend);
  free(w);
}

/* Run the workers, each on a thread of its own, and fail the test on the
 * first failed check, or when they have not finished within timeout_ms
 * (a hang: the last operations of each are in the message). */
static OS_UNUSED void km_run_workers(km_worker **ws, int n, unsigned timeout_ms) {
  pthread_t t[8];
  uint64_t end = os_now_ms() + timeout_ms;
  bool all;
  for (int i = 0; i < n; i++)
    cr_assert_eq(pthread_create(&t[i], NULL, km_thread, ws[i]), 0);
  do {
    all = true;
    for (int i = 0; i < n; i++)
      all &= atomic_load(&ws[i]->finished) != 0;
    if (!all)
      os_sleep_ms(2);
  } while (!all && os_now_ms() < end);
  if (!all) {
    static char msg[16384];
    size_t k = (size_t)snprintf(msg, sizeof(msg), "workers did not finish within %u ms (a hang):\n", timeout_ms);
    for (int i = 0; i < n && k < sizeof(msg); i++) {
      km_worker *w = ws[i];
      k += (size_t)snprintf(msg + k, sizeof(msg) - k, " worker %d (seed %llu) at step %ld%s, last operations:\n",
                            w->id, (unsigned long long)w->seed, w->step, atomic_load(&w->finished) ? " (finished)" : "");
      for (uint64_t j = w->seq > 8 ? w->seq - 8 : 0; j < w->seq && k < sizeof(msg); j++)
        k += (size_t)snprintf(msg + k, sizeof(msg) - k, "    %s\n", w->log[j % KM_LOG]);
    }
    fputs(msg, stderr);
    fflush(stderr);
    if (getenv("KM_GDB") != NULL) {
      /* where every thread is, for the report */
      char cmd[256];
      snprintf(cmd, sizeof(cmd), "gdb -p %d -batch -ex 'thread apply all bt 24' >&2 2>/dev/null", (int)getpid());
      if (system(cmd) != 0)
        fprintf(stderr, "(gdb failed)\n");
    }
    cr_assert_fail("%s", msg);
  }
  for (int i = 0; i < n; i++)
    pthread_join(t[i], NULL);
  for (int i = 0; i < n; i++)
    cr_assert(!ws[i]->failed, "%s", ws[i]->fail);
}

#endif /* KINDS_MIXED_H */
