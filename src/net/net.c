/* Across processes: the um_net_* API, its handles, the blobs,
 * and the seam the operation layer calls (net.h).
 *
 * No UCX here: the transport table (net.h, net_ucx.c) does the network.
 * This file owns what is unimem's: checking arguments and ranges, the
 * blobs' envelope, which buffers are exposed, endpoints' lifetimes. Puts
 * and gets are operations of the path table (net_ops.c), which calls the
 * seam here.
 *
 * Handles. A um_net stays in the registry after um_net_destroy, and a
 * um_endpoint in its net's list after um_endpoint_close, until the manager
 * is destroyed: a stale handle answers UM_ESTATE instead of touching freed
 * memory. Both are reference counted besides (a net by its endpoints, an
 * endpoint by the operations issued on it until they complete).
 *
 * Locks: registry_lock, then a net's lock, then the transport's. The
 * transport calls done callbacks without its lock; the callbacks here take
 * none of these.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "interop.h"
#include "net.h"

#define UM__NET_MAGIC 0x554d4e54u /* "UMNT" */
#define UM__EP_MAGIC 0x554d4550u  /* "UMEP" */

/* Blob envelope: magic, version, kind, total length, checksum (FNV-1a 64
 * over the whole blob with the checksum field zero), all little-endian.
 * Both bodies name the net they belong to (um_net.id): an address blob's
 * starts with it, a key blob's ends its fixed part. */
#define BLOB_MAGIC 0x424e4d55u /* "UMNB" */
#define BLOB_VERSION 2u
#define BLOB_HEAD 24u
#define BLOB_NET_ID 8u         /* an address body's first bytes */
#define BLOB_EXPOSURE_BODY 32u /* base, size, flags, key length, net id */
enum { BLOB_ADDRESS = 1, BLOB_EXPOSURE = 2 };

typedef struct net_exposure {
  struct net_exposure *next;
  um_buffer *buf;
  void *tx; /* the transport's exposure */
  unsigned char *blob;
  size_t blob_len;
} net_exposure;

/* A buffer of um_net_alloc: a foreign wrap (buffer.c) of memory the
 * transport allocated, given back when the buffer's memory is returned. */
typedef struct net_alloc {
  struct net_alloc *next;
  um_net *n;
  void *ta; /* the transport's allocation */
  size_t bytes;
  bool held; /* released, held back (net_stuck): not the application's */
} net_alloc;

/* An exposure whose revocation gave up (the transport's revoke answered
 * UM_EBUSY): transfers admitted before may still write its buffer. The
 * buffer is marked (net_held); once released and retired its memory waits
 * here (at_rest) until the transport says they are through (settled). A
 * record whose net goes first is dropped, and its buffer's memory is
 * never given back: nothing then tells when the peer is done with it. */
typedef struct net_stuck {
  struct net_stuck *next;
  um_net *n;
  void *tx;
  um_buffer *buf; /* NULL once the buffer went back without the net */
  bool at_rest;
} net_stuck;

struct um_net {
  uint32_t magic;
  atomic_int refs; /* the registry's, and one per endpoint handle */
  um_manager *m;
  const um__net_transport *tr;
  void *tn;
  uint64_t id; /* random: names this net (its worker) in its blobs */
  pthread_mutex_t lock; /* guards everything below */
  pthread_cond_t changed; /* an endpoint's starting count dropped */
  bool destroyed;
  um_endpoint *eps;          /* every endpoint made, open or closed */
  net_exposure *exposures;   /* live exposures */
  net_alloc *allocs;         /* buffers of um_net_alloc not given back */
  int nallocs;
  um__net_stager *stager;
  um_net *next; /* registry */
};

struct um_endpoint {
  uint32_t magic;
  atomic_int refs; /* the net's list, and one per operation issued on it */
  um_net *net;
  void *tep;     /* the transport's endpoint; NULL once closed */
  uint64_t peer_id; /* the id of the net it reaches (its address blob's) */
  bool closing;  /* no transfer may start any more */
  int starting;  /* threads inside the transport's rma() on it */
  um_endpoint *next;
};

/* What um_net_put / um_net_get attach to their operation. */
struct um__net_op {
  um__net_xfer x;
  char detail[256];
  unsigned char key[]; /* copy of the blob's transport key */
};

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static um_net *registry;
/* Exposures alive in the process (and exposures being made): a buffer
 * release looks for its exposure only when there is one. */
static atomic_int live_exposures;
/* Records of held memory (net_stuck), under stuck_lock (taken before the
 * transport's lock, never under a net's). */
static pthread_mutex_t stuck_lock = PTHREAD_MUTEX_INITIALIZER;
static net_stuck *stuck_list;
static atomic_int nstuck;
/* The process generation (fork.c) that made the last record: a child of
 * fork() leaves its parent's records alone. */
static atomic_uint stuck_gen;

/* ------------------------------------------------------------------------ */
/* References */

static void net_unref(um_net *n) {
  if (um__atomic_sub_acq_rel(&n->refs, 1) != 1)
    return;
  pthread_mutex_destroy(&n->lock);
  pthread_cond_destroy(&n->changed);
  n->magic = 0;
  free(n);
}

void um__net_endpoint_ref(um_endpoint *ep) { um__atomic_add_relaxed(&ep->refs, 1); }

void um__net_endpoint_unref(um_endpoint *ep) {
  um_net *n = ep->net;
  if (um__atomic_sub_acq_rel(&ep->refs, 1) != 1)
    return;
  ep->magic = 0;
  free(ep);
  net_unref(n);
}

/* A net of a parent process, in a child of fork(): its worker, threads and
 * sockets are the parent's (shared memory and file descriptors reach the
 * parent's peers and its progress thread), and its locks may have been held
 * at the fork. Refused before anything of it is touched but the handle's
 * own fields. */
static int net_check_process(const um_net *n) {
  if (n->m->fork_gen == um__process_generation())
    return UM_OK;
  return um__set_error(UM_ESTATE,
                       "um_net %p was made in another process (before fork()): a child process may "
                       "not use its parent's net, endpoints or exposures",
                       (const void *)n);
}

static int net_check(const um_net *n) {
  if (n == NULL || n->magic != UM__NET_MAGIC)
    return um__set_error(UM_EINVAL, "not a um_net");
  return net_check_process(n);
}

static int ep_check(const um_endpoint *ep) {
  if (ep == NULL || ep->magic != UM__EP_MAGIC)
    return um__set_error(UM_EINVAL, "not a um_endpoint");
  return net_check_process(ep->net);
}

/* fork() (core/thread.c's handlers): the registry lock is held across it,
 * so that no child inherits it locked (um_net_create and a buffer's release
 * take it there), and so is the transport's share (no thread inside the
 * library's calls: net.h); the child forgets its parent's nets and
 * exposures, which it must not touch. */
static const um__net_transport *net_transport(void);

static void net_fork_prepare(void) {
  const um__net_transport *tr = net_transport();
  pthread_mutex_lock(&registry_lock);
  if (tr != NULL)
    tr->fork_prepare();
}

static void net_fork_parent(void) {
  const um__net_transport *tr = net_transport();
  if (tr != NULL)
    tr->fork_parent();
  pthread_mutex_unlock(&registry_lock);
}

static void net_fork_child(void) {
  const um__net_transport *tr = net_transport();
  if (tr != NULL)
    tr->fork_child();
  registry = NULL;
  atomic_store(&live_exposures, 0);
  pthread_mutex_unlock(&registry_lock);
}

static const um__thread_part thread_part = {
    .fork_prepare = net_fork_prepare, .fork_parent = net_fork_parent, .fork_child = net_fork_child};

/* The live net of manager m, or NULL; under registry_lock. */
static um_net *net_of_locked(um_manager *m) {
  for (um_net *n = registry; n != NULL; n = n->next)
    if (n->m == m && !n->destroyed)
      return n;
  return NULL;
}

/* ------------------------------------------------------------------------ */
/* Blobs */

static uint64_t blob_checksum(const unsigned char *b, size_t len) {
  static const unsigned char zero[8];
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < len; i++)
    h = (h ^ (i >= 16 && i < 24 ? zero[i - 16] : b[i])) * 0x100000001b3ull;
  return h;
}

/* Fill the envelope of a blob whose body is in place. */
static void blob_seal(unsigned char *b, size_t len, int kind) {
  um__net_le_put(b, BLOB_MAGIC, 4);
  um__net_le_put(b + 4, BLOB_VERSION, 2);
  um__net_le_put(b + 6, (uint64_t)kind, 2);
  um__net_le_put(b + 8, len, 4);
  um__net_le_put(b + 12, 0, 4);
  um__net_le_put(b + 16, blob_checksum(b, len), 8);
}

/* Check an envelope; *body / *body_len receive the body. */
static int blob_open(const void *blob, size_t len, int kind, const unsigned char **body,
                     size_t *body_len) {
  const unsigned char *b = blob;
  const char *what = kind == BLOB_ADDRESS ? "address" : "key";
  if (len < BLOB_HEAD)
    return um__set_error(UM_EINVAL, "%s blob of %zu bytes is truncated", what, len);
  if (um__net_le_get(b, 4) != BLOB_MAGIC)
    return um__set_error(UM_EINVAL, "not a unimem %s blob (bad magic)", what);
  if (um__net_le_get(b + 4, 2) != BLOB_VERSION)
    return um__set_error(UM_EINVAL, "%s blob of version %u (this library reads %u)", what,
                         (unsigned)um__net_le_get(b + 4, 2), BLOB_VERSION);
  if (um__net_le_get(b + 6, 2) != (uint64_t)kind)
    return um__set_error(UM_EINVAL, "blob is not a %s blob (kind %u)", what, (unsigned)um__net_le_get(b + 6, 2));
  if (um__net_le_get(b + 8, 4) != len)
    return um__set_error(UM_EINVAL, "%s blob says %u bytes, %zu given", what, (unsigned)um__net_le_get(b + 8, 4),
                         len);
  if (um__net_le_get(b + 16, 8) != blob_checksum(b, len))
    return um__set_error(UM_EINVAL, "%s blob is damaged (checksum mismatch)", what);
  *body = b + BLOB_HEAD;
  *body_len = len - BLOB_HEAD;
  return UM_OK;
}

/* Parse a key blob of transport tr into *r (r->key points into blob). */
static int blob_parse_exposure(const um__net_transport *tr, const void *blob, size_t len,
                               um__net_remote *r) {
  const unsigned char *body;
  size_t body_len;
  int st = blob_open(blob, len, BLOB_EXPOSURE, &body, &body_len);
  if (st != UM_OK)
    return st;
  if (body_len < BLOB_EXPOSURE_BODY || um__net_le_get(body + 20, 4) != body_len - BLOB_EXPOSURE_BODY)
    return um__set_error(UM_EINVAL, "key blob's key length does not match its size");
  r->base = um__net_le_get(body, 8);
  r->size = um__net_le_get(body + 8, 8);
  r->flags = (unsigned)um__net_le_get(body + 16, 4);
  r->net_id = um__net_le_get(body + 24, 8);
  r->key = body + BLOB_EXPOSURE_BODY;
  r->key_len = body_len - BLOB_EXPOSURE_BODY;
  if (r->size == 0 || r->base + r->size < r->base || (r->flags & ~UM__NET_EXPOSED_READONLY) != 0)
    return um__set_error(UM_EINVAL, "key blob describes no valid range");
  return tr->key_check(r->key, r->key_len);
}

/* Write blob into the caller's buffer, or answer UM_ERANGE with the size. */
static int blob_copy_out(const unsigned char *blob, size_t blob_len, void *out, size_t *len) {
  if (*len < blob_len) {
    size_t cap = *len;
    *len = blob_len;
    return um__set_error(UM_ERANGE, "blob needs %zu bytes, %zu given", blob_len, cap);
  }
  memcpy(out, blob, blob_len);
  *len = blob_len;
  return UM_OK;
}

static int blob_args_check(const void *blob, const size_t *len, const char *fn) {
  if (len == NULL || (blob == NULL && *len > 0))
    return um__set_error(UM_EINVAL, "%s: NULL argument", fn);
  return UM_OK;
}

/* ------------------------------------------------------------------------ */
/* Nets */

static const um__net_transport *net_transport(void) {
#ifdef UNIMEM_HAVE_UCX
  return &um__net_ucx;
#else
  return NULL;
#endif
}

/* A net's id: random, so that two nets (of two processes, or one after
 * another at one address) never share one; never 0. */
static uint64_t net_new_id(const um_net *n) {
  uint64_t id = 0;
  if (getrandom(&id, sizeof(id), GRND_NONBLOCK) != (ssize_t)sizeof(id)) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    id = ((uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec) ^ ((uint64_t)getpid() << 40) ^
         (uint64_t)(uintptr_t)n;
  }
  return id != 0 ? id : 1;
}

int um_net_create(um_manager *m, um_net **out) {
  const um__net_transport *tr = net_transport();
  um_net *n;
  int st;
  if (!um__manager_ok(m) || out == NULL)
    return um__set_error(UM_EINVAL, "um_net_create: NULL argument or not a manager");
  if (um__process_changed(m))
    return um__manager_check_process(m);
  if (tr == NULL)
    return um__set_error(UM_ENOTSUP, "this unimem was built without UCX (libucx-dev headers were "
                                     "missing or UNIMEM_ENABLE_UCX=OFF)");
  if ((n = calloc(1, sizeof(*n))) == NULL)
    return um__set_error(UM_ENOMEM, "out of memory for a um_net");
  n->magic = UM__NET_MAGIC;
  atomic_init(&n->refs, 1);
  n->m = m;
  n->tr = tr;
  n->id = net_new_id(n);
  pthread_mutex_init(&n->lock, NULL);
  pthread_cond_init(&n->changed, NULL);
  /* Held across the transport's start so that two threads cannot both
   * give m a net. */
  pthread_mutex_lock(&registry_lock);
  if (net_of_locked(m) != NULL)
    st = um__set_error(UM_ESTATE, "manager %p has a um_net already", (void *)m);
  else if ((st = tr->open(&m->opts, &n->tn)) == UM_OK &&
           (st = um__net_stager_start(&n->stager)) != UM_OK)
    tr->close(n->tn);
  if (st != UM_OK) {
    pthread_mutex_unlock(&registry_lock);
    net_unref(n);
    return st;
  }
  n->next = registry;
  registry = n;
  pthread_mutex_unlock(&registry_lock);
  *out = n;
  return UM_OK;
}

int um_net_address(um_net *n, void *blob, size_t *len) {
  size_t raw = 0;
  int st;
  if ((st = net_check(n)) != UM_OK || (st = blob_args_check(blob, len, "um_net_address")) != UM_OK)
    return st;
  pthread_mutex_lock(&n->lock);
  if (n->destroyed) {
    pthread_mutex_unlock(&n->lock);
    return um__set_error(UM_ESTATE, "um_net %p was destroyed", (void *)n);
  }
  st = n->tr->address(n->tn, NULL, &raw); /* UM_ERANGE: the size */
  if (st == UM_ERANGE && *len < BLOB_HEAD + BLOB_NET_ID + raw) {
    size_t cap = *len;
    *len = BLOB_HEAD + BLOB_NET_ID + raw;
    st = um__set_error(UM_ERANGE, "address blob needs %zu bytes, %zu given", *len, cap);
  } else if (st == UM_ERANGE) {
    st = n->tr->address(n->tn, (unsigned char *)blob + BLOB_HEAD + BLOB_NET_ID, &raw);
    if (st == UM_OK) {
      um__net_le_put((unsigned char *)blob + BLOB_HEAD, n->id, 8);
      blob_seal(blob, BLOB_HEAD + BLOB_NET_ID + raw, BLOB_ADDRESS);
      *len = BLOB_HEAD + BLOB_NET_ID + raw;
    }
  }
  pthread_mutex_unlock(&n->lock);
  return st;
}

int um_net_connect(um_net *n, const void *addr, size_t len, um_endpoint **out) {
  const unsigned char *body;
  size_t body_len;
  um_endpoint *ep;
  int st;
  if ((st = net_check(n)) != UM_OK)
    return st;
  if (addr == NULL || out == NULL)
    return um__set_error(UM_EINVAL, "um_net_connect: NULL argument");
  pthread_mutex_lock(&n->lock);
  st = n->destroyed ? um__set_error(UM_ESTATE, "um_net %p was destroyed", (void *)n) : UM_OK;
  pthread_mutex_unlock(&n->lock);
  if (st != UM_OK)
    return st;
  if ((st = blob_open(addr, len, BLOB_ADDRESS, &body, &body_len)) != UM_OK)
    return st;
  if (body_len <= BLOB_NET_ID)
    return um__set_error(UM_EINVAL, "address blob carries no address");
  if ((ep = calloc(1, sizeof(*ep))) == NULL)
    return um__set_error(UM_ENOMEM, "out of memory for an endpoint");
  pthread_mutex_lock(&n->lock);
  if (n->destroyed)
    st = um__set_error(UM_ESTATE, "um_net %p was destroyed", (void *)n);
  else
    st = n->tr->connect(n->tn, body + BLOB_NET_ID, body_len - BLOB_NET_ID, &ep->tep);
  if (st != UM_OK) {
    pthread_mutex_unlock(&n->lock);
    free(ep);
    return st;
  }
  ep->magic = UM__EP_MAGIC;
  atomic_init(&ep->refs, 1);
  ep->net = n;
  ep->peer_id = um__net_le_get(body, 8);
  um__atomic_add_relaxed(&n->refs, 1);
  ep->next = n->eps;
  n->eps = ep;
  pthread_mutex_unlock(&n->lock);
  *out = ep;
  return UM_OK;
}

/* Stop new transfers on ep, wait for those entering the transport, then
 * disconnect (which waits for, or fails, the ones in flight). */
static void ep_shutdown(um_endpoint *ep) {
  um_net *n = ep->net;
  void *tep;
  pthread_mutex_lock(&n->lock);
  ep->closing = true;
  while (ep->starting > 0)
    pthread_cond_wait(&n->changed, &n->lock);
  tep = ep->tep;
  pthread_mutex_unlock(&n->lock);
  n->tr->disconnect(tep);
  pthread_mutex_lock(&n->lock);
  ep->tep = NULL;
  pthread_mutex_unlock(&n->lock);
}

int um_endpoint_close(um_endpoint *ep) {
  int st = ep_check(ep);
  bool open;
  if (st != UM_OK)
    return st;
  pthread_mutex_lock(&ep->net->lock);
  open = !ep->closing && ep->tep != NULL;
  if (open)
    ep->closing = true; /* this thread closes it */
  pthread_mutex_unlock(&ep->net->lock);
  if (!open)
    return um__set_error(UM_ESTATE, "endpoint %p is closed", (void *)ep);
  ep_shutdown(ep);
  return UM_OK;
}

/* ------------------------------------------------------------------------ */
/* Exposures */

static net_exposure *exposure_find_locked(um_net *n, const um_buffer *b) {
  for (net_exposure *x = n->exposures; x != NULL; x = x->next)
    if (x->buf == b)
      return x;
  return NULL;
}

static net_exposure *exposure_unlink_locked(um_net *n, const um_buffer *b) {
  for (net_exposure **p = &n->exposures; *p != NULL; p = &(*p)->next)
    if ((*p)->buf == b) {
      net_exposure *x = *p;
      *p = x->next;
      return x;
    }
  return NULL;
}

static int exposure_revoke(um_net *n, net_exposure *x) {
  int st = n->tr->revoke(x->tx);
  free(x->blob);
  free(x);
  return st;
}

static void stuck_add(um_net *n, void *tx, um_buffer *b);

/* Revoke an exposure that was registered (and counted). When the
 * revocation gives up, the buffer is held (stuck_add). */
static int exposure_end(um_net *n, net_exposure *x) {
  int st = n->tr->revoke(x->tx);
  if (st == UM_EBUSY)
    stuck_add(n, x->tx, x->buf);
  free(x->blob);
  free(x);
  atomic_fetch_sub(&live_exposures, 1);
  return st;
}

/* A new exposure of b (live, with a host view) and its blob. */
static void net_alloc_return(void *ctx);

static int exposure_make(um_net *n, um_buffer *b, net_exposure **out) {
  net_exposure *x = calloc(1, sizeof(*x));
  const void *key;
  size_t key_len;
  void *ta = NULL;
  int st;
  if (x == NULL)
    return um__set_error(UM_ENOMEM, "out of memory for an exposure");
  /* A buffer of this net's um_net_alloc is exposed with its allocation's
   * own mapping. */
  if (um__net_allocated(b) && ((net_alloc *)b->on_return_ctx)->n == n)
    ta = ((net_alloc *)b->on_return_ctx)->ta;
  if ((st = n->tr->expose(n->tn, b->mem.host, b->size, ta, &x->tx, &key, &key_len)) != UM_OK) {
    free(x);
    return st;
  }
  x->blob_len = BLOB_HEAD + BLOB_EXPOSURE_BODY + key_len;
  if ((x->blob = malloc(x->blob_len)) == NULL) {
    (void)exposure_revoke(n, x);
    return um__set_error(UM_ENOMEM, "out of memory for a key blob");
  }
  um__net_le_put(x->blob + BLOB_HEAD, (uint64_t)(uintptr_t)b->mem.host, 8);
  um__net_le_put(x->blob + BLOB_HEAD + 8, b->size, 8);
  um__net_le_put(x->blob + BLOB_HEAD + 16, b->readonly ? UM__NET_EXPOSED_READONLY : 0, 4);
  um__net_le_put(x->blob + BLOB_HEAD + 20, key_len, 4);
  um__net_le_put(x->blob + BLOB_HEAD + 24, n->id, 8);
  memcpy(x->blob + BLOB_HEAD + BLOB_EXPOSURE_BODY, key, key_len);
  blob_seal(x->blob, x->blob_len, BLOB_EXPOSURE);
  x->buf = b;
  *out = x;
  return UM_OK;
}

/* b's manager's live net, locked; NULL when none. */
static um_net *net_of_buffer_lock(const um_buffer *b) {
  um_net *n;
  pthread_mutex_lock(&registry_lock);
  n = net_of_locked(b->m);
  if (n != NULL)
    pthread_mutex_lock(&n->lock);
  pthread_mutex_unlock(&registry_lock);
  return n;
}

static int no_net(const um_buffer *b) {
  return um__set_error(UM_ESTATE, "buffer %p: its manager has no um_net (um_net_create first)", (const void *)b);
}

int um_net_expose(um_buffer *b, void *blob, size_t *len) {
  net_exposure *x;
  um_net *n;
  int st;
  um__net_reap();
  if (b == NULL)
    return um__set_error(UM_EINVAL, "um_net_expose: NULL buffer");
  if ((st = blob_args_check(blob, len, "um_net_expose")) != UM_OK || (st = um__buffer_check_live(b)) != UM_OK)
    return st;
  if (um__process_changed(b->m))
    return um__manager_check_process(b->m);
  if (b->mem.host == NULL)
    return um__set_error(UM_ENOTSUP, "buffer %p has no host view (device memory): expose a PINNED buffer "
                                     "of its device and um_copy between the two",
                         (void *)b);
  if ((n = net_of_buffer_lock(b)) == NULL)
    return no_net(b);
  /* The count, then touched, before the state check, all seq_cst, against
   * um_release's state CAS, then touched load, then count load (in
   * um__net_buffer_released): a release either sees both and looks for
   * the exposure under n->lock, or comes early enough that the check
   * below sees it released. */
  um__bias_leave(b->m); /* tcache.h: the sole thread's release is plain */
  atomic_fetch_add(&live_exposures, 1);
  atomic_store(&b->touched, true);
  if (atomic_load(&b->state) != UM__BUF_LIVE) {
    atomic_fetch_sub(&live_exposures, 1);
    pthread_mutex_unlock(&n->lock);
    return um__set_error(UM_ESTATE, "buffer %p was released", (void *)b);
  }
  x = exposure_find_locked(n, b);
  if (x != NULL) {
    atomic_fetch_sub(&live_exposures, 1); /* counted already */
    st = blob_copy_out(x->blob, x->blob_len, blob, len);
  } else if ((st = exposure_make(n, b, &x)) == UM_OK &&
             (st = blob_copy_out(x->blob, x->blob_len, blob, len)) == UM_OK) {
    x->next = n->exposures;
    n->exposures = x;
  } else {
    if (x != NULL) { /* made, but the blob does not fit: never seen by anyone */
      (void)exposure_revoke(n, x);
      um__set_error(UM_ERANGE, "key blob needs %zu bytes", *len);
    }
    atomic_fetch_sub(&live_exposures, 1);
  }
  pthread_mutex_unlock(&n->lock);
  return st;
}

int um_net_unexpose(um_buffer *b) {
  net_exposure *x;
  um_net *n;
  int st;
  um__net_reap();
  if (b == NULL)
    return um__set_error(UM_EINVAL, "um_net_unexpose: NULL buffer");
  if ((st = um__buffer_check_live(b)) != UM_OK)
    return st;
  if (um__process_changed(b->m))
    return um__manager_check_process(b->m);
  if ((n = net_of_buffer_lock(b)) == NULL)
    return no_net(b);
  x = exposure_unlink_locked(n, b);
  pthread_mutex_unlock(&n->lock);
  if (x == NULL)
    return um__set_error(UM_ESTATE, "buffer %p is not exposed", (void *)b);
  /* Outside the net's lock: revoking waits for peers' admitted transfers. */
  return exposure_end(n, x);
}

int um__net_buffer_released(um_buffer *b) {
  net_exposure *x;
  um_net *n;
  um__net_reap();
  if (atomic_load(&live_exposures) != 0 && (n = net_of_buffer_lock(b)) != NULL) {
    x = exposure_unlink_locked(n, b);
    pthread_mutex_unlock(&n->lock);
    if (x != NULL && exposure_end(n, x) != UM_OK)
      um__log(&b->m->opts, UM_LOG_WARN, "um_release of exposed buffer %p: %s", (void *)b, um_last_error());
  }
  return atomic_load(&b->net_held) ? UM_EBUSY : UM_OK;
}

/* ------------------------------------------------------------------------ */
/* Memory a peer may still write (net_stuck) */

static void stuck_add(um_net *n, void *tx, um_buffer *b) {
  net_stuck *s = calloc(1, sizeof(*s));
  atomic_store(&b->net_held, true);
  if (s == NULL) { /* untracked: held for good (um__net_hold finds no record) */
    um__log(&n->m->opts, UM_LOG_WARN, "net: out of memory for a record: buffer %p is never given back",
            (void *)b);
    return;
  }
  s->n = n;
  s->tx = tx;
  s->buf = b;
  atomic_store(&stuck_gen, um__process_generation());
  pthread_mutex_lock(&stuck_lock);
  s->next = stuck_list;
  stuck_list = s;
  atomic_fetch_add(&nstuck, 1);
  pthread_mutex_unlock(&stuck_lock);
}

static net_stuck *stuck_find_locked(const um_buffer *b) {
  for (net_stuck *s = stuck_list; s != NULL; s = s->next)
    if (s->buf == b)
      return s;
  return NULL;
}

bool um__net_hold(um_buffer *b) {
  bool caller_memory = b->kind == UM__KIND_WRAPPED && b->on_return == NULL;
  net_stuck *s = NULL;
  bool held;
  pthread_mutex_lock(&stuck_lock);
  held = atomic_load(&b->net_held);
  if (held) {
    s = stuck_find_locked(b);
    if (caller_memory) { /* the caller frees it after um_release: not ours to keep */
      if (s != NULL)
        s->buf = NULL;
      atomic_store(&b->net_held, false);
      held = false;
    } else if (s != NULL) {
      s->at_rest = true;
    }
  }
  pthread_mutex_unlock(&stuck_lock);
  if (held && um__net_allocated(b)) {
    net_alloc *a = b->on_return_ctx;
    pthread_mutex_lock(&a->n->lock);
    a->held = true;
    pthread_mutex_unlock(&a->n->lock);
  }
  if (held && s == NULL)
    um__log(&b->m->opts, UM_LOG_WARN,
            "net: released buffer %p of %zu bytes is kept, never reused: a peer's transfer may still write it "
            "and its um_net is gone",
            (void *)b, b->size);
  return held;
}

void um__net_reap(void) {
  net_stuck *done = NULL;
  if (atomic_load(&nstuck) == 0 || atomic_load(&stuck_gen) != um__process_generation())
    return;
  pthread_mutex_lock(&stuck_lock);
  for (net_stuck **p = &stuck_list; *p != NULL;) {
    net_stuck *s = *p;
    if (s->n->m->fork_gen != um__process_generation() || !s->n->tr->settled(s->tx)) {
      p = &s->next;
      continue;
    }
    *p = s->next;
    atomic_fetch_sub(&nstuck, 1);
    if (s->buf != NULL)
      atomic_store(&s->buf->net_held, false);
    s->next = done;
    done = s;
  }
  pthread_mutex_unlock(&stuck_lock);
  while (done != NULL) {
    net_stuck *s = done;
    done = s->next;
    if (s->buf != NULL && s->at_rest)
      um__buffer_retire(s->buf, NULL);
    free(s);
  }
}

/* n goes (its transport with it): its records are dropped, their memory
 * kept for good; the held buffers of um_net_alloc leave n's list (the
 * transport unmaps them once its worker is gone). */
static void stuck_drop(um_net *n) {
  net_stuck *mine = NULL;
  um__net_reap();
  pthread_mutex_lock(&stuck_lock);
  for (net_stuck **p = &stuck_list; *p != NULL;) {
    net_stuck *s = *p;
    if (s->n != n) {
      p = &s->next;
      continue;
    }
    *p = s->next;
    atomic_fetch_sub(&nstuck, 1);
    s->next = mine;
    mine = s;
  }
  pthread_mutex_unlock(&stuck_lock);
  while (mine != NULL) {
    net_stuck *s = mine;
    mine = s->next;
    if (s->buf != NULL)
      um__log(&n->m->opts, UM_LOG_WARN,
              "net: buffer %p of %zu bytes is kept, never reused: a peer's transfer may still write it", (void *)s->buf,
              s->buf->size);
    free(s);
  }
  pthread_mutex_lock(&n->lock);
  for (net_alloc **p = &n->allocs; *p != NULL;) {
    net_alloc *a = *p;
    if (!a->held) {
      p = &a->next;
      continue;
    }
    *p = a->next;
    n->nallocs--;
    free(a);
    um__atomic_sub_acq_rel(&n->refs, 1); /* the registry's reference outlives it */
  }
  pthread_mutex_unlock(&n->lock);
}

/* ------------------------------------------------------------------------ */
/* Memory of the net (um_net_alloc) */

bool um__net_allocated(const um_buffer *b) {
  return b->kind == UM__KIND_WRAPPED && b->on_return == net_alloc_return;
}

/* The buffer's memory goes back (its release, after its operations; or
 * the debug quarantine's, at release): unmapped from the net's transport. */
static void net_alloc_return(void *ctx) {
  net_alloc *a = ctx;
  um_net *n = a->n;
  pthread_mutex_lock(&n->lock);
  for (net_alloc **p = &n->allocs; *p != NULL; p = &(*p)->next)
    if (*p == a) {
      *p = a->next;
      break;
    }
  n->nallocs--;
  pthread_mutex_unlock(&n->lock);
  n->tr->free(n->tn, a->ta);
  free(a);
  net_unref(n);
}

int um_net_alloc(um_net *n, size_t bytes, unsigned flags, um_buffer **out) {
  net_alloc *a;
  um__mem mem;
  void *host = NULL;
  int st;
  if ((st = net_check(n)) != UM_OK)
    return st;
  if (out == NULL)
    return um__set_error(UM_EINVAL, "um_net_alloc: NULL argument");
  if (bytes == 0)
    return um__set_error(UM_EINVAL, "um_net_alloc: zero bytes");
  if (flags & ~(unsigned)(UM_ALLOC_UNPOOLED | UM_ALLOC_ZERO))
    return um__set_error(UM_EINVAL, "um_net_alloc: unknown flags 0x%x", flags);
  /* The transport backs it with host memory (on posix, a shared-memory file
   * that the kernel fills lazily: an overcommit shows up later as SIGBUS),
   * so what exceeds the host's physical memory is refused before it. */
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (bytes > ((size_t)1 << 62) || (pages > 0 && page > 0 && bytes / (size_t)page >= (size_t)pages))
    return um__set_error(UM_ENOMEM, "um_net_alloc: %zu bytes is more than the host's physical memory (%zu bytes)",
                         bytes, pages > 0 && page > 0 ? (size_t)pages * (size_t)page : (size_t)0);
  if ((a = calloc(1, sizeof(*a))) == NULL)
    return um__set_error(UM_ENOMEM, "um_net_alloc: out of memory for a record");
  /* Allocated and counted under the net's lock: um_net_destroy either sees
   * it (UM_EBUSY) or came first (UM_ESTATE here). */
  pthread_mutex_lock(&n->lock);
  if (n->destroyed)
    st = um__set_error(UM_ESTATE, "um_net %p was destroyed", (void *)n);
  else if ((st = n->tr->alloc(n->tn, bytes, &a->ta, &host)) == UM_OK) {
    a->n = n;
    a->bytes = bytes;
    a->next = n->allocs;
    n->allocs = a;
    n->nallocs++;
    um__atomic_add_relaxed(&n->refs, 1);
  }
  pthread_mutex_unlock(&n->lock);
  if (st != UM_OK) {
    free(a);
    return st;
  }
  if ((flags & UM_ALLOC_ZERO) || n->m->opts.scrub)
    memset(host, 0, bytes);
  memset(&mem, 0, sizeof(mem));
  mem.host = host;
  mem.handle = (uintptr_t)host;
  /* Device 0 (the cpu device), UM_HOST: a wrap whose memory goes back
   * through net_alloc_return. */
  if ((st = um__wrap_foreign(n->m, n->m->devices[0], UM_HOST, &mem, bytes, net_alloc_return, a, out)) != UM_OK)
    net_alloc_return(a);
  return st;
}

/* ------------------------------------------------------------------------ */
/* Destroying */

/* Close what n still has open, each reported, then the transport. */
static void net_teardown(um_net *n, const char *who) {
  net_exposure *xs;
  um_endpoint *open[64];
  int nopen;
  do { /* endpoints, a batch at a time (each close blocks) */
    nopen = 0;
    pthread_mutex_lock(&n->lock);
    n->destroyed = true;
    for (um_endpoint *ep = n->eps; ep != NULL && nopen < 64; ep = ep->next)
      if (!ep->closing && ep->tep != NULL) {
        ep->closing = true;
        open[nopen++] = ep;
      }
    pthread_mutex_unlock(&n->lock);
    for (int i = 0; i < nopen; i++) {
      um__log(&n->m->opts, UM_LOG_WARN, "%s: endpoint %p was still open: closed", who, (void *)open[i]);
      ep_shutdown(open[i]);
    }
  } while (nopen > 0);
  /* The staged transfers left fail fast now that no endpoint is open. */
  um__net_stager_stop(n->stager);
  pthread_mutex_lock(&n->lock);
  xs = n->exposures;
  n->exposures = NULL;
  pthread_mutex_unlock(&n->lock);
  while (xs != NULL) {
    net_exposure *x = xs;
    xs = x->next;
    um__log(&n->m->opts, UM_LOG_WARN, "%s: buffer %p of %zu bytes was still exposed: unexposed", who,
            (void *)x->buf, x->buf->size);
    if (exposure_end(n, x) != UM_OK)
      um__log(&n->m->opts, UM_LOG_WARN, "%s: %s", who, um_last_error());
  }
  stuck_drop(n);
  n->tr->close(n->tn);
  n->tn = NULL;
}

int um_net_destroy(um_net *n) {
  int st = net_check(n);
  bool first;
  if (st != UM_OK)
    return st;
  int nallocs = 0;
  size_t alloc_bytes = 0;
  pthread_mutex_lock(&registry_lock);
  first = !n->destroyed;
  if (first) {
    pthread_mutex_lock(&n->lock);
    /* Buffers of um_net_alloc live in the transport's context, which goes
     * with the net: refused while the application still has one. */
    for (net_alloc *a = n->allocs; a != NULL; a = a->next)
      if (!a->held) /* a held one is not the application's any more */
        nallocs++, alloc_bytes += a->bytes;
    if (nallocs == 0)
      n->destroyed = true; /* no new endpoint, exposure, transfer or allocation */
    pthread_mutex_unlock(&n->lock);
  }
  pthread_mutex_unlock(&registry_lock);
  if (!first)
    return um__set_error(UM_ESTATE, "um_net %p was destroyed already", (void *)n);
  if (nallocs > 0)
    return um__set_error(UM_EBUSY,
                         "um_net_destroy: %d buffer(s) of um_net_alloc (%zu bytes) are still live: "
                         "um_release them first",
                         nallocs, alloc_bytes);
  net_teardown(n, "um_net_destroy");
  return UM_OK;
}

void um__net_manager_destroy(um_manager *m) {
  um_net *mine = NULL;
  pthread_mutex_lock(&registry_lock);
  for (um_net **p = &registry; *p != NULL;) {
    um_net *n = *p;
    if (n->m != m) {
      p = &n->next;
      continue;
    }
    *p = n->next;
    n->next = mine;
    mine = n;
  }
  pthread_mutex_unlock(&registry_lock);
  while (mine != NULL) {
    um_net *n = mine;
    mine = n->next;
    if (!n->destroyed) {
      um__log(&m->opts, UM_LOG_WARN, "um_manager_destroy: um_net %p was never destroyed", (void *)n);
      n->destroyed = true;
      net_teardown(n, "um_manager_destroy");
    }
    while (n->eps != NULL) { /* the list's references */
      um_endpoint *ep = n->eps;
      n->eps = ep->next;
      um__net_endpoint_unref(ep);
    }
    net_unref(n);
  }
}

/* ------------------------------------------------------------------------ */
/* The seam (net.h) */

int um__net_rma_start(um_endpoint *ep, const um__net_rma *r, um__done_fn done, void *arg) {
  um_net *n = ep->net;
  void *tep = NULL;
  int st;
  pthread_mutex_lock(&n->lock);
  if (ep->closing || ep->tep == NULL)
    st = um__set_error(UM_ESTATE, "endpoint %p is closed", (void *)ep);
  else
    st = UM_OK, tep = ep->tep, ep->starting++;
  pthread_mutex_unlock(&n->lock);
  if (st != UM_OK)
    return st;
  st = n->tr->rma(tep, r, done, arg);
  pthread_mutex_lock(&n->lock);
  if (--ep->starting == 0 && ep->closing)
    pthread_cond_broadcast(&n->changed);
  pthread_mutex_unlock(&n->lock);
  return st;
}

int um__net_xfer_start(const um__net_xfer *x, um__done_fn done, void *arg) {
  um_net *n = x->ep->net;
  int st;
  if (x->buf->mem.host != NULL) {
    um__net_rma r;
    r.dir = x->dir;
    r.local = (char *)x->buf->mem.host + x->buf_off;
    r.bytes = x->bytes;
    r.remote_addr = x->remote.base + x->remote_off;
    r.key = x->remote.key;
    r.key_len = x->remote.key_len;
    r.detail = x->detail;
    r.detail_cap = x->detail_cap;
    return um__net_rma_start(x->ep, &r, done, arg);
  }
  /* No host view: through pinned chunks, on the staging thread. Checked
   * and queued under the net's lock, so the stager is still there. */
  pthread_mutex_lock(&n->lock);
  if (n->destroyed || x->ep->closing || x->ep->tep == NULL)
    st = um__set_error(UM_ESTATE, "endpoint %p is closed", (void *)x->ep);
  else
    st = um__net_stager_submit(n->stager, x, done, arg);
  pthread_mutex_unlock(&n->lock);
  return st;
}

/* ------------------------------------------------------------------------ */
/* Checks of a transfer (net_ops.c issues it) */

int um__net_transfer_check(um__net_dir dir, um_endpoint *ep, um_buffer *b, size_t off, const void *blob,
                           size_t blob_len, size_t roff, size_t bytes, um__net_remote *rem) {
  int st;
  if (ep == NULL || b == NULL || blob == NULL)
    return um__set_error(UM_EINVAL, "%s: NULL argument", dir == UM__NET_PUT ? "um_net_put" : "um_net_get");
  if ((st = ep_check(ep)) != UM_OK || (st = um__buffer_check_live(b)) != UM_OK)
    return st;
  if (um__process_changed(b->m))
    return um__manager_check_process(b->m);
  if (bytes == 0)
    return um__set_error(UM_EINVAL, "transfer of zero bytes");
  if (b->m != ep->net->m)
    return um__set_error(UM_EINVAL, "buffer %p belongs to another manager than the endpoint", (void *)b);
  /* A closed endpoint answers UM_ESTATE whatever the key says. */
  pthread_mutex_lock(&ep->net->lock);
  st = ep->closing || ep->tep == NULL ? um__set_error(UM_ESTATE, "endpoint %p is closed", (void *)ep) : UM_OK;
  pthread_mutex_unlock(&ep->net->lock);
  if (st != UM_OK)
    return st;
  if ((st = blob_parse_exposure(ep->net->tr, blob, blob_len, rem)) != UM_OK)
    return st;
  /* Another peer's key would name an address of that peer: refused before
   * anything reaches this endpoint's peer. */
  if (rem->net_id != ep->peer_id)
    return um__set_error(UM_EINVAL, "the key blob was exposed by another peer than endpoint %p reaches",
                         (void *)ep);
  if (off > b->size || bytes > b->size - off)
    return um__set_error(UM_ERANGE, "range [%zu, +%zu) outside a buffer of %zu bytes", off, bytes, b->size);
  if (roff > rem->size || bytes > rem->size - roff)
    return um__set_error(UM_ERANGE, "remote range [%zu, +%zu) outside the %" PRIu64 " exposed bytes", roff,
                         bytes, rem->size);
  if (dir == UM__NET_PUT && (rem->flags & UM__NET_EXPOSED_READONLY))
    return um__set_error(UM_ESTATE, "the remote buffer is exposed read-only");
  if (dir == UM__NET_GET && b->readonly)
    return um__set_error(UM_ESTATE, "buffer %p is a read-only wrap", (void *)b);
  return UM_OK;
}

/* ------------------------------------------------------------------------ */
/* What the layers below call up into (mem.h, "Calls up"), and the net's share
 * of a fork (core/thread.c) */

__attribute__((constructor)) static void register_upcalls(void) {
  um__upcall.net = (__typeof__(um__upcall.net)){.buffer_released = um__net_buffer_released,
                                                 .hold = um__net_hold,
                                                 .allocated = um__net_allocated,
                                                 .manager_destroy = um__net_manager_destroy,
                                                 .reap = um__net_reap};
  um__thread_part_add(&thread_part);
}
