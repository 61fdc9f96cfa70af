/* The core's functions, grouped by the file that defines them (as
 * mimalloc's internal.h); the structures are in types.h.
 *
 * Layers, top to bottom, from the call graph; a file calls only files
 * below it, but for three pairs that are one concern in two files
 * (tcache.c <-> pool.c, event.c <-> tcache.c for the event stashes,
 * net.c <-> net_staging.c). docs/design.md draws them, with the path of one
 * allocation and of one copy:
 *
 *   entry      manager.c dlpack.c stream.c
 *   API        buffer.c, then copy.c access.c net_op.c map.c net.c
 *              mapfile.c device.c peer.c stats.c
 *   operations op.c -> the path table (path.c; entries in path.c,
 *              staged.c, access.c, net_op.c, called only through it)
 *              event.c (event objects, the worker engine)
 *   buffers    handle.c (checks, going live, an operation's end, retire)
 *              trim.c (on request, under pressure, the timer)
 *              quarantine.c (debug) -> owner.c (a block back to its owner)
 *   pool       tcache.c/tcache.h (thread caches) <-> pool.c (bins, budget)
 *   blocks     block.c (device blocks, descriptors, staging chunks)
 *   backends   backend.h: backends/cpu.c (pagelock.c), opencl.c, cuda.c;
 *              beside them the net transport table (net.h): net_ucx.c ->
 *              net_ucx_lib.c (dlopen libucp.so.0), net_staging.c
 *   everywhere errors.c options.c fork.c sizeclass.c spin.c atomic.h
 *              list.h, testhook.h (test builds)
 */
#ifndef UNIMEM_INTERNAL_H
#define UNIMEM_INTERNAL_H

#include <string.h>
#include <time.h>

#include "types.h"

/* ------------------------------------------------------------------------ */
/* sizeclass.c: exact up to 8 bytes, then four classes per power of two.
 * Inline (C99 semantics, external definitions in sizeclass.c): they are on
 * every allocation's path. */

inline int um__size_class_of(size_t bytes) {
  int k;
  if (bytes <= 8)
    return bytes == 0 ? 0 : (int)bytes - 1;
  /* bytes in (2^k, 2^(k+1)]: classes 2^k + i * 2^(k-2), i = 1..4. */
  k = 63 - __builtin_clzll((unsigned long long)(bytes - 1));
  return 8 + (k - 3) * 4 + (int)((bytes - 1 - ((size_t)1 << k)) >> (k - 2));
}

inline size_t um__class_size(int cls) {
  int k, i;
  if (cls < 8)
    return (size_t)cls + 1;
  k = (cls - 8) / 4 + 3;
  i = (cls - 8) % 4 + 1;
  return ((size_t)1 << k) + ((size_t)1 << (k - 2)) * (size_t)i;
}

/* ------------------------------------------------------------------------ */
/* Helpers used across the layers */

static inline uint64_t um__now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline bool um__loc_valid(int loc) { return loc >= UM_HOST && loc <= UM_UNIFIED; }

/* The manager's devices now (adoption adds some). */
static inline int um__ndevices(const um_manager *m) {
  return atomic_load_explicit(&((um_manager *)m)->ndevices, memory_order_acquire);
}

/* d is a device handle (not NULL, not a handle of another kind). */
static inline bool um__device_ok(const um_device *d) { return d != NULL && d->magic == UM__DEVICE_MAGIC; }
/* m is a manager handle (not NULL, not a handle of another kind). */
static inline bool um__manager_ok(const um_manager *m) { return m != NULL && m->magic == UM__MANAGER_MAGIC; }

#define UM__STAT_ADD(dev, field, v) um__atomic_add_relaxed(&(dev)->stats.field, (uint64_t)(v))
#define UM__STAT_SUB(dev, field, v) um__atomic_sub_relaxed(&(dev)->stats.field, (uint64_t)(v))

/* A transfer between host memory and [off, off + bytes) of b's block: H2D
 * and FILL write the block (dst), D2H reads it (src). */
static inline void um__xfer_host(um__xfer *x, um__xfer_kind kind, um_buffer *b, size_t off, void *host,
                                 size_t bytes) {
  memset(x, 0, sizeof(*x));
  x->kind = kind;
  x->bytes = bytes;
  x->host = host;
  if (kind == UM__XFER_D2H)
    x->src = &b->mem, x->src_loc = b->loc, x->src_off = off;
  else
    x->dst = &b->mem, x->dst_loc = b->loc, x->dst_off = off;
}

/* errors.c (um__set_error and um__log are declared in backend.h) */
void um__clear_error(void);

/* options.c */
/* The longest wait_spin_ns: a second of spinning is already far past any
 * wait it can shorten (a device round trip is tens of microseconds). */
#define UM__WAIT_SPIN_MAX_NS 1000000000u
int um__options_check(const um_options *o);
bool um__backend_selected(const um_options *o, const char *name);

/* fork.c: moves in every child process of fork(); a manager made under
 * another value belongs to an ancestor process and is refused. */
extern atomic_uint um__fork_generation;
void um__fork_init(void);
int um__manager_check_process(const um_manager *m);
/* Entry points of a function returning int: UM_ESTATE for a manager of
 * another process. One load and one compare. */
#define UM__CHECK_PROCESS(m)                                                                       \
  do {                                                                                             \
    if (__builtin_expect((m)->fork_gen != um__atomic_load_relaxed(&um__fork_generation), 0))       \
      return um__manager_check_process(m);                                                         \
  } while (0)

/* ------------------------------------------------------------------------ */
/* API files' internal entry points */

/* buffer.c: a buffer over memory someone else owns (a DLPack producer's),
 * on device d at loc: mem as d's backend knows such memory (a host view, or
 * a cl_mem / CUdeviceptr handle with host NULL). Never pooled; released
 * like a wrap (its release waits for its operations), and on_return(ctx)
 * runs exactly once when the memory goes back (also at manager destroy for
 * a buffer never released). */
int um__wrap_foreign(um_manager *m, um_device *d, um_location loc, const um__mem *mem, size_t bytes,
                     void (*on_return)(void *ctx), void *ctx, um_buffer **out);

/* manager.c */
int um__manager_create_ex(const um_options *opts, const um__backend *const *extra, int nextra,
                          um_manager **out);

/* ------------------------------------------------------------------------ */
/* Operations */

/* op.c: issue an operation filled in by the caller (kind, buffers, offsets,
 * bytes, the buffers' gen). Orders it after the buffers' earlier
 * operations, plans its path under their locks, starts it. done == NULL:
 * runs to completion and returns its status; else *done is the caller's
 * event. Takes over the caller's reference to op, issued or not. */
int um__op_issue(um_event *op, um_event **done);
/* UM_ESTATE for a blocking call on b inside an open bracket, or whose wait
 * passes through one (it would wait for um_access_end without end), with
 * the reason. */
int um__op_bracket_error(const um_buffer *b);
/* Open brackets (op.c): a bracket takes a slot before it is published
 * (open) and gives it back when it ends (close). Whether a wait for what
 * was issued on b (its lock held) would pass through an open bracket: b's
 * own, or one its operations follow on other buffers, however far back;
 * own_ends: b's own open bracket ends before the wait (a release), only
 * those it follows count. um__op_waits_bracket: the same for one
 * operation. Each costs one relaxed load when no bracket is open. */
void um__bracket_open(um_event *op);
void um__bracket_close(um_event *op);
bool um__buffer_waits_bracket_locked(const um_buffer *b, bool own_ends);
bool um__op_waits_bracket(const um_event *op);
/* op finished with status (on any thread): buffers, waiters, followers. */
void um__op_complete(um_event *op, int status);
/* A group (um_copy_batch): begin it (blocking: no event asked for, so its
 * members refuse to wait for a bracket), issue its copies (checked, every
 * buffer of the group's manager; a copy that cannot be issued any more, its
 * buffer released meanwhile, counts as a failure of the group), end the
 * issuing (done as for um__op_issue). */
um_event *um__op_group_begin(um_manager *m, bool blocking);
void um__op_group_copies(um_event *group, const um_copy_op *ops, size_t n);
int um__op_group_end(um_event *group, um_event **done);
/* A held operation (a bracket): published on its buffers like any other
 * (later operations wait for it) but not started; *dep is the unfinished
 * operation it was ordered after (a reference), or NULL. start_held starts
 * it once after (a reference, consumed; NULL: now) has finished.
 * issue_after: an operation on no buffer (a gate), started once after has
 * finished. token_borrow: dep's token when it runs on d's queue and has
 * one (give it back with um__event_token_put), else NULL. */
int um__op_hold(um_event *op, um_event **dep);
void um__op_start_held(um_event *op, um_event *after);
void um__op_issue_after(um_event *op, um_event *after);
void *um__op_token_borrow(um_event *dep, um_device *d);

/* access.c: take b's open bracket (b's lock held; NULL when none) and end
 * it behind what the caller queued so far (a release); end every bracket
 * left open (manager destroy). */
um_event *um__access_take_locked(um_buffer *b);
void um__access_end_taken(um_event *op);
void um__access_end_all(um_manager *m);

/* path.c: one entry per way an operation runs. Entries are offered an
 * operation in table order (under its buffers' locks); the first whose
 * plan returns true runs it. plan may set op->native_dev (the device whose
 * queue runs it; start_native is then called instead of run). */
struct um__path {
  const char *name;
  bool (*plan)(um_event *op);
  /* Run to completion on the calling thread; the status. */
  int (*run)(um_event *op);
  /* Start on op->native_dev's queue after the transfers of after[] (tokens
   * of the same device), without waiting: backend.h's xfer_async contract.
   * NULL for host-thread paths. */
  int (*start_native)(um_event *op, void *const *after, int nafter, um__done_fn done, void **native);
  /* Count a finished operation's bytes and way in the statistics. */
  void (*account)(const um_event *op);
  /* Queued single-call paths: count n finished transfers of bytes in all
   * on d, the device whose queue ran them, as account counts one (a
   * batch's run, op.c). */
  void (*account_queued)(um_device *d, uint64_t n, uint64_t bytes);
  /* Single backend call paths: the transfer, and the device it runs on. */
  um_device *(*xfer)(const um_event *op, um__xfer *x);
  /* Operations of at most this many bytes run on the issuing thread even
   * when an event was asked for (host work cheaper than a hand-off). */
  size_t inline_bytes;
  /* start_native queues a command on the device's queue (not a join), a
   * transfer of this kind (what xfer fills in). */
  bool queued;
  um__xfer_kind kind;
  /* Start host-side asynchronous work (no device queue) without blocking
   * the calling thread: UM_OK, then done(op, status) exactly once from any
   * thread, possibly before it returns (it then touches neither op nor its
   * attachment afterwards); or a failure (um_last_error() set), and done is
   * never called. A failure's text goes into op->error_text before done.
   * Taken instead of run when not NULL; op.c then starts the operation on
   * the issuing thread, or on a worker once its dependencies finished, and
   * no thread waits for the work itself. */
  int (*start_async)(um_event *op, um__done_fn done);
};
/* A path's account function that counts op->bytes in stats field
 * bytes_field and one transfer in xfer_field, on the device at one end of
 * the copy (src or dst). */
#define UM__PATH_ACCOUNT(name, end, bytes_field, xfer_field)                                      \
  static void name(const um_event *op) {                                                          \
    UM__STAT_ADD(op->end->dev, bytes_field, op->bytes);                                           \
    UM__STAT_ADD(op->end->dev, xfer_field, 1);                                                    \
  }
/* Choose op's path, and with it native_dev and queued_q (the in-order
 * queue of native_dev it goes to, -1 for none). */
void um__path_plan(um_event *op);
bool um__path_runs_inline(const um_event *op);
/* The host side of a copy: its pointer, or the buffer's host view at the
 * offset; NULL when that end has no host view. Inline: every plan asks. */
static inline char *um__path_host_src(const um_event *op) {
  if (op->host_src != NULL)
    return (char *)op->host_src;
  return op->src->mem.host ? (char *)op->src->mem.host + op->src_off : NULL;
}

static inline char *um__path_host_dst(const um_event *op) {
  if (op->host_dst != NULL)
    return op->host_dst;
  return op->dst->mem.host ? (char *)op->dst->mem.host + op->dst_off : NULL;
}

/* (handle.c) Whether d's backend registered b, a UM_WRAP_PIN wrap. */
bool um__wrap_registered(const um_buffer *b, const um_device *d);
/* b's memory is page-locked for device d: a PINNED block of d, or a
 * UM_WRAP_PIN wrap registered with d's backend. A copy between it and d's
 * memory is one direct DMA, with no staging. */
static inline bool um__path_dma_ready(const um_buffer *b, const um_device *d) {
  return b != NULL && ((b->loc == UM_PINNED && b->dev == d) || um__wrap_registered(b, d));
}
extern const um__path um__path_fill_host, um__path_fill_device, um__path_memcpy, um__path_h2d,
    um__path_d2h, um__path_local, um__path_peer;

/* staged.c: the multi-call paths of path.c's table */
extern const um__path um__path_h2d_pipelined, um__path_d2h_pipelined, um__path_staged,
    um__path_overlap;
/* access.c: the caller's bracket and the gate */
extern const um__path um__path_access, um__path_gate;
/* net_op.c: um_net_put and um_net_get (SPEC §10) */
extern const um__path um__path_net_put, um__path_net_get;

/* event.c: event objects */
um_event *um__event_new(um_manager *m, um__op_kind kind);
void um__event_ref(um_event *e);
void um__event_unref(um_event *e);
int um__event_wait_internal(um_event *e);
/* um__event_wait_internal for a caller: on failure, um_last_error() of
 * the calling thread gets the operation's error_text (or the code's
 * meaning when it has none). */
int um__event_wait_result(um_event *e);
/* Drop one owner of e's token (e->native_refs); the last releases it. */
void um__event_token_put(um_event *e, um_device *ndev, void *native);
/* Drop the caller's share of e's token (um_event_release; op.c's
 * keep_native when the release came first). */
void um__event_caller_native_drop(um_event *e);
/* Destroy, before the devices close: the native tokens that events never
 * released still hold for um_event_native go back to their backends. */
void um__events_drop_natives(um_manager *m);
/* Manager destroy: free every event object. */
void um__events_free_all(um_manager *m);
/* A thread's cache goes (thread exit): its stash of event objects back to
 * the manager. */
void um__events_stash_flush(um_manager *m, um__tcache *tc);
/* event.c: the engine. push: a worker will call w->fn(w) (first: ahead of
 * the queue). op_begin / op_done count the operations in flight; drain
 * waits until none is. op_done is the completing thread's last touch of the
 * manager. */
int um__engine_start(um_manager *m);
void um__engine_stop(um_manager *m);
void um__engine_push(um_manager *m, um__work *w, bool first);
void um__engine_op_begin(um_manager *m);
void um__engine_op_done(um_manager *m);
void um__engine_drain(um_manager *m);
/* drain_unless_bracket: as drain, but it stops once a bracket is open
 * (false then); wake_drains: a bracket opened, such drains look again. */
bool um__engine_drain_unless_bracket(um_manager *m);
void um__engine_wake_drains(um_manager *m);

/* ------------------------------------------------------------------------ */
/* Buffers */

/* handle.c */
int um__buffer_check_live(const um_buffer *b);
/* um__buffer_check_live, and b's generation for a check under its lock. */
int um__buffer_check_owner(const um_buffer *b, uint32_t *gen);
/* A descriptor's per-owner state from the last owner's operations,
 * mappings and bracket (coherence, mapping, chain, flags) back to what a
 * new owner starts with. A block in a thread cache's slot is kept this way
 * (tcache.h): a release puts it there with this done, or without (the fast
 * path) only when no operation, mapping or bracket touched it. */
static inline void um__buffer_clean(um_buffer *b) {
  memset(&b->valid, 0, offsetof(um_buffer, access_op) + sizeof(b->access_op) - offsetof(um_buffer, valid));
  b->valid = b->mem.host ? (UM_VALID_HOST | UM_VALID_DEVICE) : UM_VALID_DEVICE;
  b->readonly = false;
  b->pinned_wrap = false;
  atomic_store_explicit(&b->touched, false, memory_order_relaxed);
}

/* A clean descriptor (um__buffer_clean) goes to a new owner: its
 * generation, size and site; mem, dev, loc and kind are set by the caller.
 * Inline: it is on the pool hit's path. holds and dlpack_tensors are reset
 * here too, against a stale handle's retain racing the last release. */
static inline void um__buffer_go_live_clean(um_buffer *b, size_t bytes, const char *file, int line) {
  /* Only the thread making the descriptor live writes gen: no locked add. */
  atomic_store_explicit(&b->gen, atomic_load_explicit(&b->gen, memory_order_relaxed) + 1,
                        memory_order_release);
  b->size = bytes;
  atomic_store_explicit(&b->holds, 0, memory_order_relaxed);
  atomic_store_explicit(&b->dlpack_tensors, 0, memory_order_relaxed);
  b->site_file = file;
  b->site_line = line;
}

/* Reset a descriptor's per-owner state for a new owner, whatever its last
 * owner did with it. */
static inline void um__buffer_init_live(um_buffer *b, size_t bytes, const char *file, int line) {
  um__buffer_clean(b);
  um__buffer_go_live_clean(b, bytes, file, line);
}

/* An operation on b finished (b's lock held): drop it from b's chain;
 * *drop_last says the chain's reference to op must be dropped, *retire
 * that b was released meanwhile and must now be retired (both after the
 * lock is released). */
void um__buffer_op_finish_locked(um_buffer *b, um_event *op, bool *drop_last, bool *retire);
/* Block until every operation issued on b has finished. */
void um__buffer_wait_idle(um_buffer *b);
/* A released buffer with nothing pending: its block goes to this thread's
 * cache (tc, when not NULL and the class has a slot), the quarantine
 * (debug), or its owner. */
void um__buffer_retire(um_buffer *b, um__tcache *tc);
/* UM_WRAP_PIN: register a live wrap with the other backends; whether d's
 * backend registered it (d may DMA from and to it directly). */
void um__wrap_register_devices(um_buffer *b);
/* um__wrap_registered: above, before um__path_dma_ready. */

/* trim.c: move the caches' blocks to the bins, then free idle blocks,
 * oldest first, until at most keep bytes stay idle in the manager (dev ==
 * NULL) or on one device; bytes freed. for_pressure: every idle block of d
 * (the quarantine's too, in debug mode) before an allocation is retried. */
uint64_t um__trim(um_manager *m, um_device *dev, uint64_t keep);
void um__trim_for_pressure(um_device *d);
int um__trim_thread_start(um_manager *m);
void um__trim_thread_stop(um_manager *m);

/* quarantine.c: debug mode keeps released buffers from reuse. Bounds: a
 * buffer leaves after this many later releases, or once the quarantined
 * blocks hold more than this many bytes (the newest always stays). Freed
 * host bytes are overwritten with UM__POISON_BYTE. */
#define UM__QUARANTINE_MAX_BUFFERS 1024u
#define UM__QUARANTINE_MAX_BYTES (64ull << 20)
#define UM__POISON_BYTE 0xDE
void um__quarantine_put(um_buffer *b);
/* Every quarantined buffer to its owner (at destroy). */
void um__quarantine_flush(um_manager *m);
/* Give the device's quarantined blocks back to it, keeping their handles
 * quarantined (pressure, um_pool_trim). */
void um__quarantine_drop_blocks(um_manager *m, um_device *d);

/* owner.c: a released buffer's block goes back to its owner (pool,
 * device, caller, file) and the descriptor to the husks unless pooled;
 * return_borrowed: only what a wrap or a mapped file borrowed (unpin,
 * unmap), at once. */
void um__buffer_to_owner(um_buffer *b);
void um__buffer_return_borrowed(um_buffer *b);

/* ------------------------------------------------------------------------ */
/* Pool (tcache.h declares the thread caches) */

/* pool.c */
void um__pool_init(um__pool *p, um_device *dev, um_location loc);
void um__pool_destroy(um__pool *p);
/* The newest idle block of class cls, or NULL. */
um_buffer *um__pool_take(um__pool *p, int cls);
/* Put b idle in its bin, or free it when the limits say no: put stamps a
 * new idle_key; put_aged keeps b's (a block displaced from a cache slot,
 * counted as trimmed if freed); put_reserved moves a block out of a cache
 * slot with the slot's budget. */
void um__pool_put(um__pool *p, um_buffer *b);
void um__pool_put_aged(um__pool *p, um_buffer *b);
void um__pool_put_reserved(um__pool *p, um_buffer *b);
/* Thread-cache slots: hold budget for one block of class cls (false when
 * a limit says no), give it back. */
bool um__pool_reserve(um__pool *p, int cls);
void um__pool_unreserve(um__pool *p, int cls);
/* Free d's blocks idle since before cutoff_ns (all: UINT64_MAX); free the
 * oldest until at most keep bytes stay idle. Bytes freed. */
uint64_t um__pool_free_idle(um_device *d, uint64_t cutoff_ns);
uint64_t um__pool_free_oldest(um_manager *m, um_device *dev, uint64_t keep);
void um__pool_largest(um__pool *p, uint64_t *largest);
/* The next idle_key, for a block going idle on the calling thread. */
uint64_t um__idle_key_next(um_manager *m);
/* The pool went from empty to not empty: wake the trim timer. */
void um__pool_notify_idle(um_manager *m);

/* ------------------------------------------------------------------------ */
/* Blocks */

/* block.c */
int um__block_alloc(um_device *d, um_location loc, size_t bytes, um__mem *mem);
void um__block_free(um_device *d, um_location loc, size_t bytes, um__mem *mem);
/* Set b's first bytes to zero (UM_ALLOC_ZERO, scrub). */
int um__block_zero(um_buffer *b, size_t bytes);
/* A descriptor for a new block: a husk, or a new one on the registry. */
um_buffer *um__descriptor_get(um_manager *m);
/* b holds no block any more: a husk until the next allocation. */
void um__descriptor_put(um_manager *m, um_buffer *b);
void um__descriptors_free_all(um_manager *m);
/* Pinned staging chunks (staging_chunk_bytes each), kept per device up to
 * pinned_pool_bytes. */
int um__staging_get(um_device *d, um__mem *out);
void um__staging_put(um_device *d, um__mem *mem);
void um__staging_free_all(um_device *d);

/* One staging chunk's transfer in flight, waited for by the thread that
 * started it (staged.c's pipelined copies, net_staging.c's network
 * chunks): the starter sets busy, the transfer's done callback
 * (um__chunk_latch_done, a um__done_fn) clears it and keeps the status. */
typedef struct um__chunk_latch {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  bool busy;
  int status;
} um__chunk_latch;

static inline void um__chunk_latch_init(um__chunk_latch *l) {
  pthread_mutex_init(&l->lock, NULL);
  pthread_cond_init(&l->cond, NULL);
  l->busy = false;
  l->status = UM_OK;
}

static inline void um__chunk_latch_destroy(um__chunk_latch *l) {
  pthread_mutex_destroy(&l->lock);
  pthread_cond_destroy(&l->cond);
}

static inline void um__chunk_latch_done(void *arg, int status) {
  um__chunk_latch *l = arg;
  pthread_mutex_lock(&l->lock);
  l->busy = false;
  l->status = status;
  pthread_cond_signal(&l->cond);
  pthread_mutex_unlock(&l->lock);
}

/* Wait until the transfer (if any) finished; its status, reset to UM_OK
 * for the chunk's next transfer. */
static inline int um__chunk_latch_wait(um__chunk_latch *l) {
  int st;
  pthread_mutex_lock(&l->lock);
  while (l->busy)
    pthread_cond_wait(&l->cond, &l->lock);
  st = l->status;
  l->status = UM_OK;
  pthread_mutex_unlock(&l->lock);
  return st;
}

#endif /* UNIMEM_INTERNAL_H */
