/* The network layer's internal contracts (um_net_*).
 *
 * Three parts, each documented where it is declared:
 *  1. The seam the operation layer calls: um__net_xfer_start() moves bytes
 *     between a local buffer and a remote exposed range without blocking
 *     its caller, and reports once through a um__done_fn, the way a
 *     backend's xfer_async does (backend.h).
 *  2. The transport table (um__net_transport): what a one-sided RMA library
 *     gives net.c. UCX is the one implementation (net_ucx.c, loaded at run
 *     time by net_ucx_lib.c); net.c and the core never include its headers.
 *  3. The hooks the core calls: a released buffer stops being exposed, and
 *     a manager destroys the um_net it still has.
 *
 * Layers: API (net.c: handles, blobs, exposures; net_ops.c: um_net_put and
 * um_net_get) -> operations (op.c, through net_ops.c's entries of the path
 * table) -> seam (net.c, staging in staging.c) -> transport
 * (net_ucx.c) -> the RMA library.
 */
#ifndef UNIMEM_NET_H
#define UNIMEM_NET_H

#ifndef UM__SEES_NET
#error "net.h: this folder may not include it (src/README.md)"
#endif

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "unimem.h"

typedef enum {
  UM__NET_PUT = 0, /* local buffer -> remote range */
  UM__NET_GET = 1  /* remote range -> local buffer */
} um__net_dir;

/* Exposure flags carried in a blob: the exposed buffer may only be read
 * (a read-only wrap or file mapping). Checked on the issuing side, like
 * the range. */
#define UM__NET_EXPOSED_READONLY 1u

/* A remote range, as an exposure blob describes it (net.c has parsed the
 * blob and checked its envelope). */
typedef struct um__net_remote {
  uint64_t base;   /* remote address of the exposed range's first byte */
  uint64_t size;   /* exposed bytes */
  unsigned flags;  /* UM__NET_EXPOSED_* */
  uint64_t net_id; /* the exposing net's id: only its endpoints may use it */
  const void *key; /* the transport's key bytes (its part of the blob) */
  size_t key_len;
} um__net_remote;

/* ------------------------------------------------------------------------ */
/* 1. The seam */

typedef struct um__net_xfer {
  um__net_dir dir;
  um_endpoint *ep;       /* an endpoint of the net of buf's manager */
  um_buffer *buf;        /* the local side: any live buffer */
  size_t buf_off;        /* offset in buf */
  um__net_remote remote; /* the remote side */
  size_t remote_off;     /* offset in the remote range */
  size_t bytes;          /* > 0 */
  char *detail;          /* receives the failure's text (may be NULL) */
  size_t detail_cap;
} um__net_xfer;

/* Start moving x->bytes between [buf_off, +bytes) of x->buf and
 * [remote_off, +bytes) of the remote range, without blocking the caller on
 * the network.
 *
 * Preconditions (the caller checked them when the operation was issued):
 * both ranges lie inside their buffers; a PUT does not target a read-only
 * exposure; buf is not released and nothing else writes it (or, for a GET,
 * reads it) until done is called: the operation layer's ordering gives
 * that. *x and the key bytes it points to are only read during the call;
 * x->detail must stay writable until done is called.
 *
 * A buffer with a host view (cpu device, PINNED, UNIFIED, HOST on any
 * device) is moved directly; one without (an OpenCL or CUDA DEVICE buffer)
 * goes through pinned host chunks on the net's staging thread, the device
 * copy of chunk k+1 overlapping the network transfer of chunk k.
 *
 * Returns UM_OK and then calls done(arg, status) exactly once, from any
 * thread: the net's progress or staging thread, or this one before
 * returning. Or returns an error and never calls done: UM_ESTATE (endpoint
 * closed, net destroyed), UM_EBACKEND (the endpoint failed earlier),
 * UM_ENOMEM.
 *
 * status: UM_OK once the data is complete at its destination (a PUT's
 * bytes are in remote memory); UM_ESTATE (the remote range was unexposed
 * before the transfer was admitted: nothing was written); UM_EBACKEND (the
 * peer failed, or a network step made no progress for net_timeout_ms: the
 * endpoint is then unusable); UM_ENOMEM. On failure x->detail receives the
 * text (the transport's own message, e.g. ucs_status_string's) before done
 * is called. A transfer that fails part way may have moved some bytes.
 *
 * done runs on a thread of the net: it must only record the outcome and
 * hand follow-up work to other threads (no net call, no um_release of an
 * exposed buffer, no wait). */
int um__net_xfer_start(const um__net_xfer *x, um__done_fn done, void *arg);

/* ------------------------------------------------------------------------ */
/* 2. The transport table */

/* One transfer between host memory and a remote range. */
typedef struct um__net_rma {
  um__net_dir dir;
  void *local;          /* host memory: the source of a PUT, the
                           destination of a GET */
  size_t bytes;         /* > 0 */
  uint64_t remote_addr; /* remote address of the first byte */
  const void *key;      /* the remote range's transport key */
  size_t key_len;
  char *detail;         /* as um__net_xfer.detail */
  size_t detail_cap;
} um__net_rma;

typedef struct um__net_transport {
  const char *name; /* "ucx" */

  /* Load the library (once per process) and open a network instance: its
   * own worker, a progress thread that sleeps until the network has work
   * for it, so a passive side never has to call anything. Every wait of
   * the transport is bounded by opts->net_timeout_ms. Returns UM_ENOTSUP
   * when the library or one of its entry points is missing (with the
   * reason in um_last_error()), UM_ENOMEM, UM_EBACKEND. */
  int (*open)(const um_options *opts, void **tn);
  /* Close what open made. Every endpoint was disconnected and every
   * exposure revoked before. Allocations left (not given back: a peer's
   * transfer may still write them) are unmapped once the worker is gone,
   * and exposures left by revoke (UM_EBUSY) are released. */
  void (*close)(void *tn);

  /* The instance's address, for a peer's connect: *len in/out, UM_ERANGE
   * (with *len set to the size needed) when the capacity is too small. */
  int (*address)(void *tn, void *buf, size_t *len);
  /* An endpoint to the instance at addr (bytes from a peer's address()).
   * The library's failure detection is asked for where its transports
   * have it; elsewhere a dead peer is found by the timeout. */
  int (*connect)(void *tn, const void *addr, size_t len, void **tep);
  /* Close an endpoint: transfers in flight on it finish or, after
   * net_timeout_ms, fail with UM_EBACKEND; every done is called before
   * this returns, and tep is invalid afterwards. Blocks. */
  void (*disconnect)(void *tep);

  /* Host memory that the library allocates and maps itself (UCX:
   * ucp_mem_map with UCP_MEM_MAP_ALLOCATE), so that its transports reach
   * it directly (shared memory: a segment the peer maps and writes with
   * plain stores). *ta receives the allocation, *host its first byte (at
   * least len bytes, contents unspecified). Every allocation is given back
   * (free) before close. Returns UM_ENOMEM, UM_EBACKEND. */
  int (*alloc)(void *tn, size_t len, void **ta, void **host);
  /* Give back an allocation of this instance; no exposure of it is left. */
  void (*free)(void *tn, void *ta);

  /* Let peers read and write [base, base + len) of host memory: *key
   * receives the bytes a peer needs (owned by *tx, valid until revoke).
   * ta: NULL, or the allocation (alloc) that holds the range, whose own
   * mapping is then used (no second registration; revoke leaves it
   * mapped). Returns UM_ENOMEM (also when the instance's table of
   * exposures is full), UM_EBACKEND. */
  int (*expose)(void *tn, void *base, size_t len, void *ta, void **tx, const void **key, size_t *key_len);
  /* Revoke an exposure: from the return on, no transfer from a peer that
   * was not yet admitted reads or writes the range, and the admitted ones
   * have finished. Returns UM_OK (tx released), or UM_EBUSY when admitted
   * transfers did not finish within net_timeout_ms (a peer stopped or dead
   * mid-transfer): they may still write the range until they end (their
   * issuers are then told the transfer failed), so the memory must not be
   * reused until settled(tx) answers true. Blocks. */
  int (*revoke)(void *tx);
  /* After revoke answered UM_EBUSY: true once no transfer admitted under
   * tx is left (tx is then released), false while one may still move
   * bytes. Does not block. */
  bool (*settled)(void *tx);
  /* Whether key bytes are well formed for this transport: UM_EINVAL when
   * not (a garbled or truncated blob must never reach the library). */
  int (*key_check)(const void *key, size_t key_len);

  /* Start one transfer on an endpoint: the remote side admits it (the
   * range is still exposed) or refuses it (UM_ESTATE, nothing moved),
   * then the data moves and is complete at its destination. Contract of
   * um__net_xfer_start for done, statuses and detail; r and its key are
   * read during the call only. Returns UM_EINVAL (key not made by this
   * transport), UM_ESTATE (the endpoint is closing), UM_EBACKEND (the
   * endpoint failed earlier: the failure's text), UM_ENOMEM. */
  int (*rma)(void *tep, const um__net_rma *r, um__done_fn done, void *arg);

  /* The process's fork() (net.c's handlers call them, under the registry
   * lock): prepare returns once no thread is inside a call of the library
   * that could leave one of its locks held in the child, and holds that
   * until parent (in the parent) or child (in the child) lets go. The
   * child forgets every instance of its parent. */
  void (*fork_prepare)(void);
  void (*fork_parent)(void);
  void (*fork_child)(void);
} um__net_transport;

#ifdef UNIMEM_HAVE_UCX
extern const um__net_transport um__net_ucx;
#endif

/* ------------------------------------------------------------------------ */
/* 3. Hooks for the core, and what net_ops.c needs of net.c */

/* buffer.c, um_release of a buffer that operations or an exposure touched:
 * revoke its exposure, if any, before its block can be reused. Blocks until
 * the peers' admitted transfers finished (at most net_timeout_ms). Returns
 * UM_EBUSY when some may still write b (this revocation or an earlier
 * um_net_unexpose gave up): b->net_held is then set, and its retire hands
 * it to um__net_hold instead of giving the memory back. */
int um__net_buffer_released(um_buffer *b);
/* buffer_state.c, retiring a buffer with net_held set: true when the net keeps
 * it (its memory goes back through um__buffer_retire once no peer's
 * transfer can reach it, or never when its net went first); false when
 * the retire goes on (it settled meanwhile, or the memory is the caller's,
 * a um_wrap_host, which unimem cannot keep). */
bool um__net_hold(um_buffer *b);
/* Give back the held buffers that no peer's transfer can reach any more
 * (cheap when there are none). On a caller's thread: it retires them. */
void um__net_reap(void);
/* Whether b is a buffer of um_net_alloc (its memory is its net's). */
bool um__net_allocated(const um_buffer *b);
/* manager.c, um_manager_destroy after the engine drained, once the
 * buffers of um_net_alloc were released (reported as leaks): destroy the
 * manager's um_net if the application did not (reported through the log),
 * and free the handles of destroyed nets and closed endpoints. */
void um__net_manager_destroy(um_manager *m);

/* The checks of um_net_put / um_net_get before an operation exists, with
 * their codes (unimem.h); *rem receives the parsed key blob (its key
 * points into blob). */
int um__net_transfer_check(um__net_dir dir, um_endpoint *ep, um_buffer *b, size_t off, const void *blob,
                           size_t blob_len, size_t roff, size_t bytes, um__net_remote *rem);
/* An operation's share of an endpoint: the handle stays allocated while
 * an operation issued on it has not completed. */
void um__net_endpoint_ref(um_endpoint *ep);
void um__net_endpoint_unref(um_endpoint *ep);

/* staging.c: the net's staging thread. */
typedef struct um__net_stager um__net_stager;
int um__net_stager_start(um__net_stager **out);
/* Stop after the queued jobs ran (they fail fast once their endpoints are
 * closed). */
void um__net_stager_stop(um__net_stager *s);
/* Queue a transfer of a buffer with no host view (seam contract); rma
 * moves one chunk through the endpoint's transport. */
int um__net_stager_submit(um__net_stager *s, const um__net_xfer *x, um__done_fn done, void *arg);
/* net.c: one chunk through the endpoint's transport (seam contract). */
int um__net_rma_start(um_endpoint *ep, const um__net_rma *r, um__done_fn done, void *arg);

#endif /* UNIMEM_NET_H */
