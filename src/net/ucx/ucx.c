/* The UCX transport of the network layer (net.h's um__net_transport).
 *
 * One instance per um_net: a UCP context and one worker, a progress thread
 * and a control region.
 *
 * Threads. Every UCX call but ucp_worker_signal is made under ucx_net.lock,
 * which also guards all the state below; UCX's callbacks therefore run
 * under it too (they are invoked from ucp_worker_progress or from the call
 * that completes a request). The progress thread drives the worker:
 * progress until idle, ucp_worker_arm, then poll() on the worker's event
 * fd until the network (or a thread that posted work UCX did not finish
 * within its calls: ucp_worker_signal) wakes it, or until the nearest
 * deadline. A passive side thus serves its
 * peers' transfers without calling anything, and burns no CPU idle.
 * Completions are collected under the lock and reported (done()) after it
 * is dropped, because a done callback may take other locks.
 *
 * Revocation. ucp_mem_unmap does not revoke anything on the transports
 * UCX 1.13 offers here: software RMA over active messages (tcp, posix,
 * sysv) writes to whatever address a peer names, and CMA needs no key at
 * all (test_net's revocation tests: a put after ucp_mem_unmap still lands). So every exposure
 * has a 64-bit word in this instance's control region: the high half a
 * generation, the low half the count of admitted transfers. A peer's
 * transfer first adds 1 to the word with a fetching atomic and proceeds
 * only if the generation it read is the one in its key; it subtracts 1
 * once the data's flush completed (then the data is in place at the
 * target, whatever lanes UCX used).
 * Revoking bumps the generation, then waits for the count to drop to 0:
 * from then on no transfer can touch the range. The word is updated with
 * CPU atomics here and by UCX's software or shared-memory atomics, which
 * are CPU atomics too (a NIC's atomics would need the local updates to go
 * through UCX as well).
 *
 * fork(). UCX's memory hooks (libucm) take locks of its registration
 * cache on every unmap in the process, glibc's own included (a thread's
 * exit gives back its stack). A fork while a thread here is inside a UCX
 * call can leave such a lock held in the child by a thread the child does
 * not have: the child's first unmap, or the exit of any thread it starts,
 * then waits forever. So a fork waits (ucx_fork_prepare) until no thread
 * of this process is inside a UCX call of unimem's: it takes
 * instances_lock, held across the UCX calls of open and close, then every
 * instance's lock.
 *
 * Failures. Endpoints ask for peer failure detection
 * (UCP_ERR_HANDLING_MODE_PEER); shared-memory transports cannot give it
 * (ep creation answers UCS_ERR_UNREACHABLE) and get mode NONE, where a dead
 * peer is found by the timeout. Every transfer has a deadline, renewed at
 * each step; one that passes fails the endpoint and force-closes it, which
 * completes its requests with UCS_ERR_CANCELED.
 */
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "net.h"
#include "list.h"
#include "ucx_api.h"

/* Calls of ucp_worker_progress in a row before the progress thread lets
 * go of the lock, so that threads posting transfers get their turn while a
 * large transfer keeps it busy. */
#define UCX_PROGRESS_BURST 64
/* Longest nap of the progress thread while transfers of this instance are
 * in flight, or for UCX_WARM_NS after the network last had work for it.
 * The event fd does not fire when a send queue that was full drains
 * (shared memory: a 1 MiB put fills the 64-entry FIFO), and UCX may have
 * queued sends of its own (a passive side's replies and completions), so a
 * thread asleep until the next event could wait for an unrelated one.
 * Napping instead costs a wake-up per nap while traffic flows, and nothing
 * once it stopped: an idle side sleeps until an event. */
#define UCX_WARM_NAP_NS 50000ull
#define UCX_WARM_NS 20000000ull
/* Exposures one instance can hold at once: one 8-byte word each in the
 * control region (32 KiB). */
#define UCX_SLOTS 4096u
/* Distinct remote keys kept unpacked per endpoint; the least recently used
 * idle one goes when a new one would exceed this. */
#define UCX_RKEYS_PER_EP 64
/* A transfer moves at most this much between two flushes, so that each
 * step's deadline measures progress rather than size, while the flush (one
 * round trip) stays a small part of the step (docs/design.md, Decisions:
 * "Net steps of 16 MiB"). */
#define UCX_STEP_BYTES (16u << 20)
/* Layout of a key: slot, generation, control address, the two packed rkey
 * lengths, then the data rkey and the control-region rkey. */
#define UCX_KEY_HEAD 24u
#define USERS_MASK 0xffffffffull
#define GEN_ONE (1ull << 32)

typedef struct ucx_net ucx_net;
typedef struct ucx_ep ucx_ep;

/* One distinct remote key unpacked on one endpoint ("unpack once per
 * distinct blob"); its identity is the key bytes. */
typedef struct ucx_rkey {
  struct ucx_rkey *next; /* the endpoint's list, most recent first */
  uint64_t hash;
  size_t len;
  unsigned char *bytes;
  ucp_rkey_h data, ctrl;
  uint32_t slot, gen;
  uint64_t ctrl_addr;
  int users; /* transfers in flight using it */
} ucx_rkey;

typedef enum {
  EP_OPEN,         /* transfers may start */
  EP_CLOSING,      /* disconnect asked: waiting for the transfers in flight */
  EP_CLOSE_POSTED, /* ucp_ep_close_nbx in progress */
  EP_CLOSED        /* the UCX endpoint is gone (or abandoned) */
} ep_state;

struct ucx_ep {
  ucx_net *n;
  ucx_ep *next; /* n->eps */
  ucp_ep_h uep;
  bool peer_mode;      /* UCP_ERR_HANDLING_MODE_PEER */
  ep_state state;
  int inflight;        /* transfers started and not reported */
  int failed;          /* UM_OK, or UM_EBACKEND once the endpoint failed */
  bool force_close;    /* failed: close it (the progress loop does) */
  char failure[224];   /* the failure's text */
  uint64_t deadline;   /* of the close, in EP_CLOSING / EP_CLOSE_POSTED */
  void *close_req;     /* ucp_ep_close_nbx's request while it is ours */
  bool zombie;         /* UCX may still hold requests naming it or its
                          transfers: kept until the worker is destroyed */
  ucx_rkey *rkeys;
  int nrkeys;
};

typedef enum {
  RMA_ADMIT,   /* the admission's fetch-add is in flight */
  RMA_MOVE,    /* a data step (and its check) and its flush are in flight */
  RMA_RELEASE, /* the release's fetch-add is to be posted */
  RMA_DONE     /* the release's reply is in flight, or in: report */
} rma_stage;

/* One transfer (um__net_rma) in flight. */
typedef struct ucx_rma {
  struct ucx_rma *prev, *next; /* n->inflight */
  struct ucx_rma *done_next;   /* n->done list */
  ucx_ep *ep;
  ucx_rkey *rk;
  um__net_dir dir;
  char *local;
  size_t bytes, moved;
  uint64_t raddr;
  rma_stage stage;
  uint64_t operand;  /* of the atomic in flight: +1 or -1 */
  uint64_t reply;    /* the admission's, then the release's fetched word */
  uint64_t check_operand; /* 0: a step's check reads the word */
  uint64_t check;    /* the word a step's check fetched */
  bool checking;     /* a check went with the step in flight */
  int status;
  bool finished; /* off the in-flight list, onto n->done */
  bool keep; /* UCX may still name it: freed with the worker, not after done */
  struct ucx_rma *kept_next; /* n->kept */
  char *detail;
  size_t detail_cap;
  uint64_t deadline;
  um__done_fn done;
  void *arg;
} ucx_rma;

typedef struct ucx_exposure {
  ucx_net *n;
  struct ucx_exposure *next; /* n->stuck, once its revocation gave up */
  ucp_mem_h memh;
  bool own_memh; /* mapped for this exposure (else an allocation's) */
  uint32_t slot;
  unsigned char *key;
  size_t key_len;
} ucx_exposure;

struct ucx_net {
  um_options opts;
  uint64_t timeout_ns;
  ucp_context_h ctx;
  ucp_worker_h worker;
  int efd;
  pthread_mutex_t lock;
  pthread_cond_t changed; /* an endpoint's state moved */
  pthread_t progress;
  bool progress_running;
  bool stopping;
  uint64_t warm_until; /* the network had work for this side until then */
  /* control region: one word per exposure slot */
  ucp_mem_h ctrl_memh;
  _Atomic uint64_t *ctrl;
  void *ctrl_rkey;
  size_t ctrl_rkey_len;
  uint32_t free_slots[UCX_SLOTS];
  uint32_t nfree;
  ucx_ep *eps;
  ucx_rma *inflight;
  ucx_rma *done_head, *done_tail;
  ucx_rma *kept;   /* abandoned records (ucx_rma.keep) */
  ucx_ep *zombies; /* disconnected endpoints with abandoned transfers */
  /* Exposures whose revocation gave up (ucx_revoke): their slots stay out
   * of use until the admitted transfers are through (ucx_settled). */
  struct ucx_exposure *stuck;
  struct ucx_alloc_rec *allocs; /* allocations (ucx_alloc) not given back */
  int nallocs;
  ucx_net *inst_next; /* instances */
};

/* Memory UCX allocated and mapped (UCP_MEM_MAP_ALLOCATE). */
typedef struct ucx_alloc_rec {
  struct ucx_alloc_rec *next; /* n->allocs */
  ucp_mem_h memh;
  void *addr;
} ucx_alloc_rec;

static uint64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t fnv1a(const void *p, size_t n) {
  const unsigned char *b = p;
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; i++)
    h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}

/* ------------------------------------------------------------------------ */
/* Completion and failure (all under n->lock) */

static void set_detail(ucx_rma *r, const char *fmt, const char *a, const char *b) {
  if (r->detail != NULL && r->detail_cap > 0)
    snprintf(r->detail, r->detail_cap, fmt, a, b);
}

/* The transfer is over: off the in-flight list, onto the list of those to
 * report once the lock is dropped. */
static void rma_finish(ucx_rma *r, int status) {
  ucx_net *n = r->ep->n;
  r->status = status;
  r->finished = true;
  UM__LIST_UNLINK(n->inflight, r, prev, next);
  r->ep->inflight--;
  if (r->rk != NULL)
    r->rk->users--;
  r->done_next = NULL;
  UM__QUEUE_APPEND(n->done_head, n->done_tail, r, done_next);
}

/* A UCX request failed: the endpoint's own failure explains a cancellation
 * (peer failure, timeout); otherwise UCX's text. */
static void rma_fail(ucx_rma *r, ucs_status_t st, const char *what) {
  if (r->ep->failed != UM_OK)
    set_detail(r, "%s%s", r->ep->failure, "");
  else
    set_detail(r, "UCX %s: %s", what, um__ucx.ucs_status_string(st));
  rma_finish(r, UM_EBACKEND);
}

static void ep_fail(ucx_ep *e, const char *text) {
  if (e->failed != UM_OK)
    return;
  e->failed = UM_EBACKEND;
  snprintf(e->failure, sizeof(e->failure), "%s", text);
  e->force_close = true;
}

/* Peer failure (UCP_ERR_HANDLING_MODE_PEER), called from progress under
 * the lock. UCX wants the endpoint closed with the force flag; the
 * progress loop does it, outside the callback. */
static void ep_error_cb(void *arg, ucp_ep_h uep, ucs_status_t st) {
  ucx_ep *e = arg;
  char text[160];
  (void)uep;
  snprintf(text, sizeof(text), "peer failure: %s", um__ucx.ucs_status_string(st));
  ep_fail(e, text);
}

/* ------------------------------------------------------------------------ */
/* The transfer's steps: admit (fetch-add 1 on the exposure's word), move
 * the data in steps of UCX_STEP_BYTES with a flush after each, then
 * release (add -1) and flush that. A refused admission releases and
 * reports UM_ESTATE. */

static void rma_advance(ucx_rma *r);

/* The admission's reply is in: the range is still exposed under this key's
 * generation (move the data), or it is not (release, report UM_ESTATE). */
static void rma_admitted(ucx_rma *r) {
  if ((r->reply >> 32) == r->rk->gen) {
    r->stage = RMA_MOVE;
    return;
  }
  r->stage = RMA_RELEASE;
  r->status = UM_ESTATE;
  set_detail(r, "%s%s", "the remote range is no longer exposed (unexposed or released)", "");
}

/* The start every request callback of an operation shares: the request
 * is freed; whether the operation goes on (false: it was reported already,
 * its endpoint abandoned, or it failed now, as `what`). */
static bool rma_cb_ok(ucx_rma *r, void *req, ucs_status_t st, const char *what) {
  um__ucx.ucp_request_free(req);
  if (r->keep)
    return false;
  if (st != UCS_OK) {
    rma_fail(r, st, what);
    return false;
  }
  return true;
}

static void admit_cb(void *req, ucs_status_t st, void *user) {
  ucx_rma *r = user;
  if (!rma_cb_ok(r, req, st, "atomic (admission)"))
    return;
  rma_admitted(r);
  rma_advance(r);
}

static void flush_cb(void *req, ucs_status_t st, void *user) {
  ucx_rma *r = user;
  if (rma_cb_ok(r, req, st, r->dir == UM__NET_PUT ? "put" : "get"))
    rma_advance(r);
}

/* A step's check is in (its flush completed): a generation other than the
 * key's means the target started revoking. The rest is not moved; what
 * moved may have landed in part: the transfer fails. */
static void rma_checked(ucx_rma *r) {
  if (!r->checking)
    return;
  r->checking = false;
  if ((uint32_t)(r->check >> 32) == r->rk->gen)
    return;
  r->stage = RMA_RELEASE;
  r->status = UM_ESTATE;
  set_detail(r, "%s%s", "the remote range was unexposed while the transfer moved (part of it may have landed)",
             "");
}

/* The release's reply is in: the word before it. Its generation is the
 * key's (no revocation), or one more (a revocation waiting for this
 * transfer, which was complete before it returned); two or more: the
 * target gave up waiting (ucx_revoke) before the data was all in place,
 * so the transfer is not complete. */
static void rma_released(ucx_rma *r) {
  uint32_t ahead = (uint32_t)(r->reply >> 32) - r->rk->gen;
  if (r->status != UM_OK || ahead < 2)
    return;
  r->status = UM_ESTATE;
  set_detail(r, "%s%s", "the remote range was revoked while the transfer moved: the target stopped waiting for it",
             "");
}

static void release_cb(void *req, ucs_status_t st, void *user) {
  ucx_rma *r = user;
  if (!rma_cb_ok(r, req, st, "atomic (release)"))
    return;
  rma_released(r);
  rma_advance(r);
}

/* A request that needs no callback: freed at once (UCX releases it when it
 * completes); an error is returned. */
static ucs_status_t post_plain(ucs_status_ptr_t p) {
  if (UCS_PTR_IS_ERR(p))
    return UCS_PTR_STATUS(p);
  if (p != NULL)
    um__ucx.ucp_request_free(p);
  return UCS_OK;
}

/* A fetching add of operand to the transfer's slot of the target's
 * control words, completing through cb. */
static ucs_status_ptr_t post_slot_add(ucx_rma *r, uint64_t operand, ucp_send_nbx_callback_t cb) {
  ucp_request_param_t prm;
  memset(&prm, 0, sizeof(prm));
  prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                     UCP_OP_ATTR_FIELD_DATATYPE | UCP_OP_ATTR_FIELD_REPLY_BUFFER;
  prm.cb.send = cb;
  prm.user_data = r;
  prm.datatype = ucp_dt_make_contig(8);
  prm.reply_buffer = &r->reply;
  r->operand = operand;
  return um__ucx.ucp_atomic_op_nbx(r->ep->uep, UCP_ATOMIC_OP_ADD, &r->operand, 1,
                                   r->rk->ctrl_addr + 8ull * r->rk->slot, r->rk->ctrl, &prm);
}

static ucs_status_ptr_t post_admission(ucx_rma *r) { return post_slot_add(r, 1, admit_cb); }

/* Posted only once the data's flush completed: a fence would not do, since
 * UCX may move the data as active messages that the target processes
 * later, and the atomic on another lane (shared memory: the CPU's own
 * atomic on the mapped word) would overtake them. Fetching, so that the
 * transfer learns whether the target gave up on it (rma_released). */
static ucs_status_ptr_t post_release(ucx_rma *r) {
  /* -1: the count is >= 1, so no borrow from the generation */
  return post_slot_add(r, UINT64_MAX, release_cb);
}

/* With every step but the last: a fetching add of 0 that reads the word,
 * complete when the step's flush is (a flush completes the fetching
 * atomics before it), so that a revocation stops a long transfer at the
 * next step instead of waiting for all of it. */
static ucs_status_t post_check(ucx_rma *r) {
  ucp_request_param_t prm;
  memset(&prm, 0, sizeof(prm));
  prm.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE | UCP_OP_ATTR_FIELD_REPLY_BUFFER;
  prm.datatype = ucp_dt_make_contig(8);
  prm.reply_buffer = &r->check;
  r->check_operand = 0;
  r->checking = true;
  return post_plain(um__ucx.ucp_atomic_op_nbx(r->ep->uep, UCP_ATOMIC_OP_ADD, &r->check_operand, 1,
                                              r->rk->ctrl_addr + 8ull * r->rk->slot, r->rk->ctrl,
                                              &prm));
}

static ucs_status_t post_step(ucx_rma *r) {
  ucp_request_param_t prm;
  size_t n = r->bytes - r->moved < UCX_STEP_BYTES ? r->bytes - r->moved : UCX_STEP_BYTES;
  memset(&prm, 0, sizeof(prm));
  ucs_status_ptr_t p =
      r->dir == UM__NET_PUT
          ? um__ucx.ucp_put_nbx(r->ep->uep, r->local + r->moved, n, r->raddr + r->moved,
                                r->rk->data, &prm)
          : um__ucx.ucp_get_nbx(r->ep->uep, r->local + r->moved, n, r->raddr + r->moved,
                                r->rk->data, &prm);
  r->moved += n;
  return post_plain(p);
}

static ucs_status_ptr_t post_flush(ucx_rma *r) {
  ucp_request_param_t prm;
  memset(&prm, 0, sizeof(prm));
  prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  prm.cb.send = flush_cb;
  prm.user_data = r;
  return um__ucx.ucp_ep_flush_nbx(r->ep->uep, &prm);
}

/* Post what comes next; loops while UCX completes it in place. Every
 * posting starts a deadline. Order: admission, then the data in steps
 * (each flushed, each but the last with a check), then the release; a
 * refused admission or a failed check goes straight to the release. */
static void rma_advance(ucx_rma *r) {
  for (;;) {
    ucs_status_ptr_t p;
    ucs_status_t st = UCS_OK;
    const char *what = r->dir == UM__NET_PUT ? "put" : "get";
    r->deadline = mono_ns() + r->ep->n->timeout_ns;
    if (r->stage == RMA_ADMIT) {
      what = "atomic (admission)";
      p = post_admission(r);
      if (p == NULL) { /* completed in place: the reply is there */
        rma_admitted(r);
        continue;
      }
    } else if (r->stage == RMA_DONE) {
      rma_finish(r, r->status);
      return;
    } else {
      if (r->stage == RMA_MOVE)
        rma_checked(r);
      if (r->stage == RMA_MOVE && r->moved == r->bytes)
        r->stage = RMA_RELEASE;
      if (r->stage == RMA_RELEASE) {
        what = "atomic (release)";
        p = post_release(r);
        r->stage = RMA_DONE; /* once its reply is in */
        if (p == NULL) { /* completed in place: the reply is there */
          rma_released(r);
          continue;
        }
      } else {
        st = post_step(r);
        if (st == UCS_OK && r->moved < r->bytes)
          st = post_check(r);
        p = st == UCS_OK ? post_flush(r) : UCS_STATUS_PTR(st);
        if (p == NULL)
          continue;
      }
    }
    if (UCS_PTR_IS_ERR(p))
      rma_fail(r, UCS_PTR_STATUS(p), what);
    return;
  }
}

/* ------------------------------------------------------------------------ */
/* Keys */

static int ucx_key_check(const void *key, size_t len) {
  const unsigned char *k = key;
  uint64_t dlen, clen;
  if (key == NULL || len < UCX_KEY_HEAD)
    return um__set_error(UM_EINVAL, "UCX key of %zu bytes is truncated", len);
  dlen = um__net_le_get(k + 16, 4);
  clen = um__net_le_get(k + 20, 4);
  if (dlen == 0 || clen == 0 || UCX_KEY_HEAD + dlen + clen != len)
    return um__set_error(UM_EINVAL, "UCX key lengths (%" PRIu64 " + %" PRIu64 ") do not add up to %zu",
                         dlen, clen, len);
  if (um__net_le_get(k, 4) >= UCX_SLOTS)
    return um__set_error(UM_EINVAL, "UCX key names slot %" PRIu64 " of %u", um__net_le_get(k, 4), UCX_SLOTS);
  return UM_OK;
}

static void rkey_free(ucx_rkey *k) {
  if (k->data)
    um__ucx.ucp_rkey_destroy(k->data);
  if (k->ctrl)
    um__ucx.ucp_rkey_destroy(k->ctrl);
  free(k->bytes);
  free(k);
}

/* Drop the least recently used idle key when the cache is full. */
static void rkey_evict(ucx_ep *e) {
  ucx_rkey **victim = NULL;
  if (e->nrkeys < UCX_RKEYS_PER_EP)
    return;
  for (ucx_rkey **p = &e->rkeys; *p != NULL; p = &(*p)->next)
    if ((*p)->users == 0)
      victim = p;
  if (victim != NULL) {
    ucx_rkey *k = *victim;
    *victim = k->next;
    rkey_free(k);
    e->nrkeys--;
  }
}

/* The endpoint's unpacked key for these bytes (checked by ucx_key_check),
 * unpacked on first use; moved to the front of the list. */
static int rkey_get(ucx_ep *e, const unsigned char *key, size_t len, ucx_rkey **out) {
  uint64_t h = fnv1a(key, len);
  ucx_rkey *k;
  ucs_status_t st;
  for (ucx_rkey **p = &e->rkeys; (k = *p) != NULL; p = &k->next)
    if (k->hash == h && k->len == len && memcmp(k->bytes, key, len) == 0) {
      *p = k->next;
      k->next = e->rkeys;
      e->rkeys = k;
      *out = k;
      return UM_OK;
    }
  rkey_evict(e);
  k = calloc(1, sizeof(*k));
  if (k == NULL || (k->bytes = malloc(len)) == NULL) {
    free(k);
    return um__set_error(UM_ENOMEM, "out of memory for a remote key");
  }
  memcpy(k->bytes, key, len);
  k->hash = h;
  k->len = len;
  k->slot = (uint32_t)um__net_le_get(key, 4);
  k->gen = (uint32_t)um__net_le_get(key + 4, 4);
  k->ctrl_addr = um__net_le_get(key + 8, 8);
  st = um__ucx.ucp_ep_rkey_unpack(e->uep, key + UCX_KEY_HEAD, &k->data);
  if (st == UCS_OK)
    st = um__ucx.ucp_ep_rkey_unpack(e->uep, key + UCX_KEY_HEAD + um__net_le_get(key + 16, 4), &k->ctrl);
  if (st != UCS_OK) {
    rkey_free(k);
    return um__set_error(UM_EINVAL, "remote key refused by UCX (ucp_ep_rkey_unpack: %s)",
                         um__ucx.ucs_status_string(st));
  }
  k->next = e->rkeys;
  e->rkeys = k;
  e->nrkeys++;
  *out = k;
  return UM_OK;
}

/* ------------------------------------------------------------------------ */
/* Endpoints */

static void ep_closed_cb(void *req, ucs_status_t st, void *user) {
  ucx_ep *e = user;
  (void)st; /* closed either way */
  um__ucx.ucp_request_free(req);
  e->close_req = NULL;
  e->state = EP_CLOSED;
  pthread_cond_broadcast(&e->n->changed); /* ucx_disconnect waits for it */
}

/* Close the UCX endpoint: flushing what is left when it is healthy, by
 * force when it failed or its transfers missed their deadline (the force
 * flag completes every request of it with UCS_ERR_CANCELED). */
static void ep_post_close(ucx_ep *e, bool force) {
  ucp_request_param_t prm;
  ucs_status_ptr_t p;
  memset(&prm, 0, sizeof(prm));
  prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                     (force ? UCP_OP_ATTR_FIELD_FLAGS : 0);
  prm.cb.send = ep_closed_cb;
  prm.user_data = e;
  prm.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  e->state = EP_CLOSE_POSTED;
  e->deadline = mono_ns() + e->n->timeout_ns;
  p = um__ucx.ucp_ep_close_nbx(e->uep, &prm);
  if (!UCS_PTR_IS_PTR(p))
    e->state = EP_CLOSED; /* done in place, or failed: resources released */
  else
    e->close_req = p;
}

/* A close that overran its deadline (a flush towards a dead peer over
 * shared memory, whose queue nobody drains, never ends) is given up: its
 * request is handed back to UCX, which completes it when the worker is
 * destroyed. Destroying the worker while this side still holds the request
 * aborts inside UCX (an assertion that only released requests remain). */
static void ep_abandon_close(ucx_ep *e) {
  um__log(&e->n->opts, UM_LOG_WARN, "net: UCX endpoint %p did not close within the timeout: abandoned",
          (void *)e->uep);
  if (e->close_req != NULL)
    um__ucx.ucp_request_free(e->close_req); /* its callback will not run */
  e->close_req = NULL;
  e->state = EP_CLOSED;
  e->zombie = true; /* UCX may still name it (its error callback's argument) */
}

/* Transfers of a closed endpoint that UCX did not complete (a forced close
 * in error mode NONE leaves a shared-memory endpoint's pending requests to
 * the worker's destruction): reported as failed. Their records and the
 * endpoint stay allocated until the worker is gone, since UCX still names
 * them; their callbacks then do nothing. */
static void ep_abandon_transfers(ucx_ep *e) {
  for (ucx_rma *r = e->n->inflight, *next; r != NULL; r = next) {
    next = r->next;
    if (r->ep != e)
      continue;
    set_detail(r, "%s%s", e->failed != UM_OK ? e->failure : "endpoint closed", "");
    r->keep = true;
    e->zombie = true;
    rma_finish(r, UM_EBACKEND);
  }
}

/* One pass over the endpoints (progress thread, under the lock): force
 * closes of failed ones, closes of disconnecting ones once idle or late,
 * and closes that overran their deadline. Returns the nearest deadline. */
static uint64_t eps_advance(ucx_net *n, uint64_t now) {
  uint64_t next = UINT64_MAX;
  for (ucx_ep *e = n->eps; e != NULL; e = e->next) {
    ep_state before = e->state;
    if (e->force_close && (e->state == EP_OPEN || e->state == EP_CLOSING)) {
      e->force_close = false;
      ep_post_close(e, true);
    } else if (e->state == EP_CLOSING && (e->inflight == 0 || now >= e->deadline)) {
      if (e->inflight > 0) {
        char text[128];
        snprintf(text, sizeof(text), "endpoint closed: transfers made no progress for %" PRIu32 " ms",
                 n->opts.net_timeout_ms);
        ep_fail(e, text);
      }
      e->force_close = false;
      ep_post_close(e, e->inflight > 0 || e->failed != UM_OK);
    } else if (e->state == EP_CLOSE_POSTED && now >= e->deadline) {
      ep_abandon_close(e);
    }
    if (e->state == EP_CLOSED && e->inflight > 0)
      ep_abandon_transfers(e);
    if (e->state != before)
      pthread_cond_broadcast(&n->changed);
    if ((e->state == EP_CLOSING || e->state == EP_CLOSE_POSTED) && e->deadline < next)
      next = e->deadline;
  }
  return next;
}

/* ------------------------------------------------------------------------ */
/* The progress thread */

/* A step that missed its deadline fails its endpoint (force-closed by
 * eps_advance, which cancels its requests). Returns the nearest deadline
 * of the others. */
static uint64_t rmas_expire(ucx_net *n, uint64_t now) {
  uint64_t next = UINT64_MAX;
  for (ucx_rma *r = n->inflight; r != NULL; r = r->next) {
    if (r->ep->failed == UM_OK && now >= r->deadline) {
      char text[192];
      snprintf(text, sizeof(text),
               "no progress for %" PRIu32 " ms (net_timeout_ms): the peer does not answer",
               n->opts.net_timeout_ms);
      ep_fail(r->ep, text);
    } else if (r->deadline < next) {
      next = r->deadline;
    }
  }
  return next;
}

static ucx_rma *take_done(ucx_net *n) {
  ucx_rma *list = n->done_head;
  n->done_head = n->done_tail = NULL;
  return list;
}

/* Report finished transfers; called without the lock. */
static void report_done(ucx_net *n, ucx_rma *list) {
  while (list != NULL) {
    ucx_rma *r = list;
    list = r->done_next;
    r->done(r->arg, r->status);
    if (r->keep) {
      pthread_mutex_lock(&n->lock);
      r->kept_next = n->kept;
      n->kept = r;
      pthread_mutex_unlock(&n->lock);
    } else {
      free(r);
    }
  }
}

/* Sleep until the worker's event fd fires (network activity, or
 * ucp_worker_signal from a thread that posted work) or until deadline,
 * at most max_ns (0: no cap). */
static void wait_events(ucx_net *n, uint64_t deadline, uint64_t max_ns) {
  struct pollfd p = {.fd = n->efd, .events = POLLIN, .revents = 0};
  struct timespec ts, *tsp = NULL;
  uint64_t now = mono_ns(), left = UINT64_MAX;
  if (deadline != UINT64_MAX)
    left = deadline > now ? deadline - now : 0;
  if (max_ns != 0 && max_ns < left)
    left = max_ns;
  if (left != UINT64_MAX) {
    ts.tv_sec = (time_t)(left / 1000000000ull);
    ts.tv_nsec = (long)(left % 1000000000ull);
    tsp = &ts;
  }
  (void)ppoll(&p, 1, tsp, NULL);
}

static void *progress_main(void *arg) {
  ucx_net *n = arg;
  bool arm_failed_logged = false;
  pthread_mutex_lock(&n->lock);
  for (;;) {
    uint64_t now, next, ep_next;
    ucs_status_t armed;
    ucx_rma *done;
    bool busy = false, warm;
    int i;
    for (i = 0; i < UCX_PROGRESS_BURST && (busy = um__ucx.ucp_worker_progress(n->worker) != 0); i++) {
    }
    now = mono_ns();
    if (i > 0 || busy)
      n->warm_until = now + UCX_WARM_NS;
    next = rmas_expire(n, now);
    ep_next = eps_advance(n, now);
    if (ep_next < next)
      next = ep_next;
    done = take_done(n);
    if (n->stopping && done == NULL && n->inflight == NULL)
      break;
    armed = done != NULL || busy ? UCS_ERR_BUSY : um__ucx.ucp_worker_arm(n->worker);
    warm = n->inflight != NULL || now < n->warm_until;
    pthread_mutex_unlock(&n->lock);
    report_done(n, done);
    if (armed != UCS_OK && armed != UCS_ERR_BUSY && !arm_failed_logged) {
      /* Cannot sleep on the fd: poll it with a short timeout instead. */
      um__log(&n->opts, UM_LOG_WARN, "net: ucp_worker_arm: %s", um__ucx.ucs_status_string(armed));
      arm_failed_logged = true;
    }
    if (armed == UCS_OK)
      wait_events(n, next, warm ? UCX_WARM_NAP_NS : 0);
    else if (armed != UCS_ERR_BUSY)
      wait_events(n, next, 1000000ull);
    pthread_mutex_lock(&n->lock);
  }
  pthread_mutex_unlock(&n->lock);
  return NULL;
}

static void wake(ucx_net *n) { (void)um__ucx.ucp_worker_signal(n->worker); }

/* ------------------------------------------------------------------------ */
/* Instance */

static int context_create(ucx_net *n) {
  ucp_config_t *cfg;
  ucp_params_t prm;
  ucp_worker_params_t wprm;
  ucs_status_t st = um__ucx.ucp_config_read(NULL, NULL, &cfg);
  if (st != UCS_OK)
    return um__ucx_error(st, "ucp_config_read");
  memset(&prm, 0, sizeof(prm));
  prm.field_mask = UCP_PARAM_FIELD_FEATURES;
  prm.features = UCP_FEATURE_RMA | UCP_FEATURE_AMO64 | UCP_FEATURE_WAKEUP;
  st = um__ucx.ucp_init_version(UCP_API_MAJOR, UCP_API_MINOR, &prm, cfg, &n->ctx);
  um__ucx.ucp_config_release(cfg);
  if (st != UCS_OK)
    return um__ucx_error(st, "ucp_init");
  /* Serialized: every call but ucp_worker_signal is made under n->lock. */
  memset(&wprm, 0, sizeof(wprm));
  wprm.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wprm.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  st = um__ucx.ucp_worker_create(n->ctx, &wprm, &n->worker);
  if (st == UCS_OK)
    st = um__ucx.ucp_worker_get_efd(n->worker, &n->efd);
  if (st != UCS_OK) {
    int code = um__ucx_error(st, "ucp_worker_create");
    if (n->worker != NULL)
      um__ucx.ucp_worker_destroy(n->worker);
    um__ucx.ucp_cleanup(n->ctx);
    n->worker = NULL;
    n->ctx = NULL;
    return code;
  }
  return UM_OK;
}

/* The control region is allocated by UCX, so that shared-memory transports
 * can reach it directly (their atomics then need no help from this
 * instance's progress thread). */
static int ctrl_create(ucx_net *n) {
  ucp_mem_map_params_t mp;
  ucp_mem_attr_t attr;
  ucs_status_t st;
  memset(&mp, 0, sizeof(mp));
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                  UCP_MEM_MAP_PARAM_FIELD_FLAGS;
  mp.address = NULL;
  mp.length = UCX_SLOTS * sizeof(uint64_t);
  mp.flags = UCP_MEM_MAP_ALLOCATE;
  st = um__ucx.ucp_mem_map(n->ctx, &mp, &n->ctrl_memh);
  if (st != UCS_OK)
    return um__ucx_error(st, "ucp_mem_map (control region)");
  memset(&attr, 0, sizeof(attr));
  attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS;
  st = um__ucx.ucp_mem_query(n->ctrl_memh, &attr);
  if (st == UCS_OK)
    st = um__ucx.ucp_rkey_pack(n->ctx, n->ctrl_memh, &n->ctrl_rkey, &n->ctrl_rkey_len);
  if (st != UCS_OK) {
    int code = um__ucx_error(st, "ucp_rkey_pack (control region)");
    um__ucx.ucp_mem_unmap(n->ctx, n->ctrl_memh);
    return code;
  }
  n->ctrl = attr.address;
  for (uint32_t i = 0; i < UCX_SLOTS; i++) {
    atomic_init(&n->ctrl[i], 0);
    n->free_slots[i] = UCX_SLOTS - 1 - i;
  }
  n->nfree = UCX_SLOTS;
  return UM_OK;
}

static void ctrl_destroy(ucx_net *n) {
  um__ucx.ucp_rkey_buffer_release(n->ctrl_rkey);
  um__ucx.ucp_mem_unmap(n->ctx, n->ctrl_memh);
}

/* Every instance open in this process, under instances_lock, which is held
 * across open's and close's UCX calls too (the header's fork()). */
static pthread_mutex_t instances_lock = PTHREAD_MUTEX_INITIALIZER;
static ucx_net *instances;

/* Under instances_lock. */
static void instance_close(ucx_net *n) {
  if (n->progress_running) {
    pthread_mutex_lock(&n->lock);
    n->stopping = true;
    pthread_mutex_unlock(&n->lock);
    wake(n);
    pthread_join(n->progress, NULL);
  }
  ctrl_destroy(n);
  um__ucx.ucp_worker_destroy(n->worker);
  /* Allocations net.c left (a peer's transfer may still write them): with
   * the worker gone, no active message writes them any more. */
  while (n->allocs != NULL) {
    ucx_alloc_rec *a = n->allocs;
    n->allocs = a->next;
    um__ucx.ucp_mem_unmap(n->ctx, a->memh);
    free(a);
  }
  um__ucx.ucp_cleanup(n->ctx);
  while (n->stuck != NULL) {
    ucx_exposure *x = n->stuck;
    n->stuck = x->next;
    free(x);
  }
  while (n->kept != NULL) {
    ucx_rma *r = n->kept;
    n->kept = r->kept_next;
    free(r);
  }
  while (n->zombies != NULL) {
    ucx_ep *e = n->zombies;
    n->zombies = e->next;
    free(e);
  }
  pthread_mutex_destroy(&n->lock);
  pthread_cond_destroy(&n->changed);
  free(n);
}

static void ucx_close(void *tn) {
  ucx_net *n = tn;
  pthread_mutex_lock(&instances_lock);
  for (ucx_net **p = &instances; *p != NULL; p = &(*p)->inst_next)
    if (*p == n) {
      *p = n->inst_next;
      break;
    }
  instance_close(n);
  pthread_mutex_unlock(&instances_lock);
}

static int ucx_open(const um_options *opts, void **tn) {
  ucx_net *n;
  int st = um__ucx_load();
  if (st != UM_OK)
    return st;
  n = calloc(1, sizeof(*n));
  if (n == NULL)
    return um__set_error(UM_ENOMEM, "out of memory for a UCX instance");
  n->opts = *opts;
  n->timeout_ns = (uint64_t)opts->net_timeout_ms * 1000000ull;
  pthread_mutex_init(&n->lock, NULL);
  pthread_cond_init(&n->changed, NULL);
  pthread_mutex_lock(&instances_lock);
  if ((st = context_create(n)) != UM_OK)
    goto fail;
  if ((st = ctrl_create(n)) != UM_OK) {
    um__ucx.ucp_worker_destroy(n->worker);
    um__ucx.ucp_cleanup(n->ctx);
    goto fail;
  }
  if (pthread_create(&n->progress, NULL, progress_main, n) != 0) {
    st = um__set_error(UM_ENOMEM, "cannot start the network progress thread");
    n->progress_running = false;
    instance_close(n);
    pthread_mutex_unlock(&instances_lock);
    return st;
  }
  n->progress_running = true;
  n->inst_next = instances;
  instances = n;
  pthread_mutex_unlock(&instances_lock);
  *tn = n;
  return UM_OK;

fail:
  pthread_mutex_unlock(&instances_lock);
  pthread_mutex_destroy(&n->lock);
  pthread_cond_destroy(&n->changed);
  free(n);
  return st;
}

static int ucx_address(void *tn, void *buf, size_t *len) {
  ucx_net *n = tn;
  ucp_address_t *a;
  size_t alen;
  ucs_status_t st;
  int ret = UM_OK;
  pthread_mutex_lock(&n->lock);
  st = um__ucx.ucp_worker_get_address(n->worker, &a, &alen);
  if (st != UCS_OK) {
    pthread_mutex_unlock(&n->lock);
    return um__ucx_error(st, "ucp_worker_get_address");
  }
  if (*len < alen)
    ret = um__set_error(UM_ERANGE, "address needs %zu bytes, %zu given", alen, *len);
  else
    memcpy(buf, a, alen);
  *len = alen;
  um__ucx.ucp_worker_release_address(n->worker, a);
  pthread_mutex_unlock(&n->lock);
  return ret;
}

/* ------------------------------------------------------------------------ */
/* Endpoints */

static ucs_status_t ep_create(ucx_ep *e, const void *addr, bool peer_mode) {
  ucp_ep_params_t prm;
  memset(&prm, 0, sizeof(prm));
  prm.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
  prm.address = addr;
  prm.err_mode = peer_mode ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
  if (peer_mode) {
    prm.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLER;
    prm.err_handler.cb = ep_error_cb;
    prm.err_handler.arg = e;
  }
  return um__ucx.ucp_ep_create(e->n->worker, &prm, &e->uep);
}

static int ucx_connect(void *tn, const void *addr, size_t len, void **tep) {
  ucx_net *n = tn;
  ucx_ep *e = calloc(1, sizeof(*e));
  ucs_status_t st;
  (void)len; /* the address encodes its own length; net.c checked the envelope */
  if (e == NULL)
    return um__set_error(UM_ENOMEM, "out of memory for an endpoint");
  e->n = n;
  pthread_mutex_lock(&n->lock);
  e->peer_mode = true;
  st = ep_create(e, addr, true);
  if (st == UCS_ERR_UNREACHABLE) {
    /* No transport between the two with peer failure detection (shared
     * memory): a dead peer will be found by the timeout. */
    e->peer_mode = false;
    st = ep_create(e, addr, false);
    if (st == UCS_OK)
      um__log(&n->opts, UM_LOG_INFO,
              "net: endpoint without peer failure detection (transport has none); "
              "a dead peer is found by net_timeout_ms");
  }
  if (st != UCS_OK) {
    pthread_mutex_unlock(&n->lock);
    free(e);
    return um__ucx_error(st, "ucp_ep_create");
  }
  e->state = EP_OPEN;
  e->next = n->eps;
  n->eps = e;
  pthread_mutex_unlock(&n->lock);
  *tep = e;
  return UM_OK;
}

static void ucx_disconnect(void *tep) {
  ucx_ep *e = tep;
  ucx_net *n = e->n;
  pthread_mutex_lock(&n->lock);
  if (e->state == EP_OPEN) {
    e->state = EP_CLOSING;
    e->deadline = mono_ns() + n->timeout_ns;
  }
  pthread_mutex_unlock(&n->lock);
  wake(n);
  pthread_mutex_lock(&n->lock);
  while (e->state != EP_CLOSED)
    pthread_cond_wait(&n->changed, &n->lock);
  for (ucx_ep **p = &n->eps; *p != NULL; p = &(*p)->next)
    if (*p == e) {
      *p = e->next;
      break;
    }
  while (e->rkeys != NULL) {
    ucx_rkey *k = e->rkeys;
    e->rkeys = k->next;
    rkey_free(k);
  }
  if (e->zombie) {
    e->next = n->zombies;
    n->zombies = e;
    e = NULL;
  }
  pthread_mutex_unlock(&n->lock);
  free(e);
}

/* ------------------------------------------------------------------------ */
/* Allocations */

/* UCX picks where the memory comes from (UCX_MEM_ALLOC_METHODS: by default
 * its memory domains' own allocators first, so a posix or sysv segment that
 * the shared-memory transports hand to a peer to map). */
static int ucx_alloc(void *tn, size_t len, void **ta, void **host) {
  ucx_net *n = tn;
  ucx_alloc_rec *a = calloc(1, sizeof(*a));
  ucp_mem_map_params_t mp;
  ucp_mem_attr_t attr;
  ucs_status_t st;
  if (a == NULL)
    return um__set_error(UM_ENOMEM, "out of memory for an allocation record");
  memset(&mp, 0, sizeof(mp));
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                  UCP_MEM_MAP_PARAM_FIELD_FLAGS;
  mp.address = NULL;
  mp.length = len;
  mp.flags = UCP_MEM_MAP_ALLOCATE;
  memset(&attr, 0, sizeof(attr));
  attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
  pthread_mutex_lock(&n->lock);
  st = um__ucx.ucp_mem_map(n->ctx, &mp, &a->memh);
  if (st != UCS_OK) {
    pthread_mutex_unlock(&n->lock);
    free(a);
    return um__ucx_error(st, "ucp_mem_map (UCP_MEM_MAP_ALLOCATE)");
  }
  st = um__ucx.ucp_mem_query(a->memh, &attr);
  if (st != UCS_OK || attr.address == NULL || attr.length < len) {
    um__ucx.ucp_mem_unmap(n->ctx, a->memh);
    pthread_mutex_unlock(&n->lock);
    free(a);
    return st != UCS_OK ? um__ucx_error(st, "ucp_mem_query")
                        : um__set_error(UM_EBACKEND, "ucp_mem_map allocated %zu bytes, %zu asked",
                                        (size_t)attr.length, len);
  }
  a->addr = attr.address;
  a->next = n->allocs;
  n->allocs = a;
  n->nallocs++;
  pthread_mutex_unlock(&n->lock);
  *ta = a;
  *host = a->addr;
  return UM_OK;
}

static void ucx_free(void *tn, void *ta) {
  ucx_net *n = tn;
  ucx_alloc_rec *a = ta;
  pthread_mutex_lock(&n->lock);
  um__ucx.ucp_mem_unmap(n->ctx, a->memh);
  for (ucx_alloc_rec **p = &n->allocs; *p != NULL; p = &(*p)->next)
    if (*p == a) {
      *p = a->next;
      break;
    }
  n->nallocs--;
  pthread_mutex_unlock(&n->lock);
  free(a);
}

/* ------------------------------------------------------------------------ */
/* Exposures */

static int ucx_expose(void *tn, void *base, size_t len, void *ta, void **tx, const void **key,
                      size_t *key_len) {
  ucx_net *n = tn;
  ucx_exposure *x = calloc(1, sizeof(*x));
  ucp_mem_map_params_t mp;
  void *packed = NULL;
  size_t plen = 0;
  ucs_status_t st;
  uint64_t word;
  if (x == NULL)
    return um__set_error(UM_ENOMEM, "out of memory for an exposure");
  memset(&mp, 0, sizeof(mp));
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  mp.address = base;
  mp.length = len;
  pthread_mutex_lock(&n->lock);
  if (n->nfree == 0) {
    pthread_mutex_unlock(&n->lock);
    free(x);
    return um__set_error(UM_ENOMEM, "%u buffers are exposed already: unexpose some first", UCX_SLOTS);
  }
  x->own_memh = ta == NULL;
  if (x->own_memh)
    st = um__ucx.ucp_mem_map(n->ctx, &mp, &x->memh);
  else /* the allocation's own mapping: its key covers the range */
    x->memh = ((ucx_alloc_rec *)ta)->memh, st = UCS_OK;
  if (st == UCS_OK && (st = um__ucx.ucp_rkey_pack(n->ctx, x->memh, &packed, &plen)) != UCS_OK &&
      x->own_memh)
    um__ucx.ucp_mem_unmap(n->ctx, x->memh);
  if (st != UCS_OK || (x->key = malloc(UCX_KEY_HEAD + plen + n->ctrl_rkey_len)) == NULL) {
    int code = st != UCS_OK ? um__ucx_error(st, "ucp_mem_map / ucp_rkey_pack")
                            : um__set_error(UM_ENOMEM, "out of memory for a key");
    if (st == UCS_OK) {
      um__ucx.ucp_rkey_buffer_release(packed);
      if (x->own_memh)
        um__ucx.ucp_mem_unmap(n->ctx, x->memh);
    }
    pthread_mutex_unlock(&n->lock);
    free(x);
    return code;
  }
  x->n = n;
  x->slot = n->free_slots[--n->nfree];
  word = atomic_fetch_add(&n->ctrl[x->slot], GEN_ONE) + GEN_ONE;
  x->key_len = UCX_KEY_HEAD + plen + n->ctrl_rkey_len;
  um__net_le_put(x->key, x->slot, 4);
  um__net_le_put(x->key + 4, word >> 32, 4);
  um__net_le_put(x->key + 8, (uint64_t)(uintptr_t)n->ctrl, 8);
  um__net_le_put(x->key + 16, plen, 4);
  um__net_le_put(x->key + 20, n->ctrl_rkey_len, 4);
  memcpy(x->key + UCX_KEY_HEAD, packed, plen);
  memcpy(x->key + UCX_KEY_HEAD + plen, n->ctrl_rkey, n->ctrl_rkey_len);
  um__ucx.ucp_rkey_buffer_release(packed);
  pthread_mutex_unlock(&n->lock);
  *tx = x;
  *key = x->key;
  *key_len = x->key_len;
  return UM_OK;
}

/* Wait for the admitted transfers of a slot, up to the timeout. Sleeps
 * between looks (the progress thread serves the peers' releases); on the
 * progress thread itself it drives the worker instead. */
static bool slot_drain(ucx_net *n, uint32_t slot) {
  uint64_t deadline = mono_ns() + n->timeout_ns;
  struct timespec pause = {0, 50000};
  bool self = n->progress_running && pthread_equal(pthread_self(), n->progress);
  while ((atomic_load(&n->ctrl[slot]) & USERS_MASK) != 0) {
    if (mono_ns() >= deadline)
      return false;
    if (self) {
      pthread_mutex_lock(&n->lock);
      (void)um__ucx.ucp_worker_progress(n->worker);
      pthread_mutex_unlock(&n->lock);
    }
    nanosleep(&pause, NULL);
    if (pause.tv_nsec < 2000000)
      pause.tv_nsec *= 2;
  }
  return true;
}

/* The drain timed out: one more generation on the word, unless its count
 * dropped to 0 meanwhile (then it drained after all: true). A transfer
 * still admitted reads that mark at its release and fails
 * (rma_released). */
static bool slot_give_up(ucx_net *n, uint32_t slot) {
  uint64_t w = atomic_load(&n->ctrl[slot]);
  while ((w & USERS_MASK) != 0)
    if (atomic_compare_exchange_weak(&n->ctrl[slot], &w, w + GEN_ONE))
      return false;
  return true;
}

static int ucx_revoke(void *tx) {
  ucx_exposure *x = tx;
  ucx_net *n = x->n;
  bool drained;
  /* From here on every admission reads another generation. */
  atomic_fetch_add(&n->ctrl[x->slot], GEN_ONE);
  drained = slot_drain(n, x->slot) || slot_give_up(n, x->slot);
  pthread_mutex_lock(&n->lock);
  if (x->own_memh) /* an allocation's mapping stays until it is given back */
    um__ucx.ucp_mem_unmap(n->ctx, x->memh);
  x->own_memh = false;
  /* A slot whose count has not dropped stays out of use until it does
   * (ucx_settled): its count would hold a later revocation of it. */
  if (drained)
    n->free_slots[n->nfree++] = x->slot;
  else
    x->next = n->stuck, n->stuck = x;
  pthread_mutex_unlock(&n->lock);
  free(x->key);
  x->key = NULL;
  if (drained) {
    free(x);
    return UM_OK;
  }
  return um__set_error(UM_EBUSY,
                       "unexposed, but remote transfers admitted before did not finish within "
                       "%" PRIu32 " ms (a peer stopped or died mid-transfer?): they may still write it",
                       n->opts.net_timeout_ms);
}

/* An exposure whose revocation gave up: true (and tx released, its slot
 * back in use) once no transfer admitted under it is left. */
static bool ucx_settled(void *tx) {
  ucx_exposure *x = tx;
  ucx_net *n = x->n;
  bool done;
  pthread_mutex_lock(&n->lock);
  done = (atomic_load(&n->ctrl[x->slot]) & USERS_MASK) == 0;
  if (done) {
    for (ucx_exposure **p = &n->stuck; *p != NULL; p = &(*p)->next)
      if (*p == x) {
        *p = x->next;
        break;
      }
    n->free_slots[n->nfree++] = x->slot;
  }
  pthread_mutex_unlock(&n->lock);
  if (done)
    free(x);
  return done;
}

/* ------------------------------------------------------------------------ */
/* Transfers */

static int ucx_rma_start(void *tep, const um__net_rma *q, um__done_fn done, void *arg) {
  ucx_ep *e = tep;
  ucx_net *n = e->n;
  ucx_rma *r, *list;
  bool hand_off;
  int st = ucx_key_check(q->key, q->key_len);
  if (st != UM_OK)
    return st;
  if ((r = calloc(1, sizeof(*r))) == NULL)
    return um__set_error(UM_ENOMEM, "out of memory for a transfer");
  r->ep = e;
  r->dir = q->dir;
  r->local = q->local;
  r->bytes = q->bytes;
  r->raddr = q->remote_addr;
  r->detail = q->detail;
  r->detail_cap = q->detail_cap;
  r->done = done;
  r->arg = arg;
  r->stage = RMA_ADMIT;
  pthread_mutex_lock(&n->lock);
  if (e->failed != UM_OK) /* its UCX endpoint may be closed already */
    st = um__set_error(UM_EBACKEND, "%s", e->failure);
  else if (e->state != EP_OPEN)
    st = um__set_error(UM_ESTATE, "endpoint is closing");
  else
    st = rkey_get(e, q->key, q->key_len, &r->rk);
  if (st != UM_OK) {
    pthread_mutex_unlock(&n->lock);
    free(r);
    return st;
  }
  r->rk->users++;
  e->inflight++;
  r->next = n->inflight;
  if (n->inflight)
    n->inflight->prev = r;
  n->inflight = r;
  rma_advance(r);
  /* Finished already when UCX completed every step inside its calls (shared
   * memory with um_net_alloc memory: the atomics, the copy and the flushes):
   * the progress thread has nothing to take over. Waking it anyway costs
   * each such transfer a context switch and this lock handed back and forth
   * (docs/design.md, Decisions: "um_net wakes its progress thread"). */
  hand_off = !r->finished || e->force_close;
  list = take_done(n);
  pthread_mutex_unlock(&n->lock);
  if (hand_off)
    wake(n);
  report_done(n, list);
  return UM_OK;
}

/* fork() (net.c's handlers, under its registry lock): the header's fork().
 * The child never uses its parent's instances (net.c refuses them there):
 * it forgets them, with their locks let go. */
static void ucx_fork_prepare(void) {
  pthread_mutex_lock(&instances_lock);
  for (ucx_net *n = instances; n != NULL; n = n->inst_next)
    pthread_mutex_lock(&n->lock);
}

static void fork_release(void) {
  for (ucx_net *n = instances; n != NULL; n = n->inst_next)
    pthread_mutex_unlock(&n->lock);
  pthread_mutex_unlock(&instances_lock);
}

static void ucx_fork_parent(void) { fork_release(); }

static void ucx_fork_child(void) {
  fork_release();
  instances = NULL;
}

const um__net_transport um__net_ucx = {
    .name = "ucx",
    /* the instance and its peers */
    .open = ucx_open, .close = ucx_close, .address = ucx_address,
    .connect = ucx_connect, .disconnect = ucx_disconnect,
    /* memory, exposures and their keys */
    .alloc = ucx_alloc, .free = ucx_free,
    .expose = ucx_expose, .revoke = ucx_revoke, .settled = ucx_settled, .key_check = ucx_key_check,
    /* transfers */
    .rma = ucx_rma_start,
    /* the process's fork */
    .fork_prepare = ucx_fork_prepare, .fork_parent = ucx_fork_parent, .fork_child = ucx_fork_child,
};
