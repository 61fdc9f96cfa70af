/* Every structure of the core, in one place (as mimalloc's types.h): a
 * reader finds what an object holds here, and what each file does with it
 * in its folder's header (src/README.md). Which file owns a field is said beside it. */
#ifndef UNIMEM_TYPES_H
#define UNIMEM_TYPES_H

#ifndef UM__SEES_DEVICE
#error "types.h: this folder may not include it (src/README.md)"
#endif

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "atomic.h"
#include "backend.h"

#define UM__BUFFER_MAGIC 0x554d4246u /* "UMBF" */
#define UM__EVENT_MAGIC 0x554d4556u  /* "UMEV" */
#define UM__DEVICE_MAGIC 0x554d4456u /* "UMDV" */
#define UM__MANAGER_MAGIC 0x554d4d47u /* "UMMG" */
#define UM__MAX_BACKENDS 8
/* Devices of one manager, discovered and adopted (um_device_adopt_opencl):
 * the device array and the peer matrix never move, so readers need no
 * lock. */
#define UM__MAX_DEVICES 64

/* Size classes (sizeclass.c): exact up to 8 bytes, then four classes per
 * power of two, so a request never wastes 25% or more of its size. */
#define UM__CLASS_COUNT (8 + 4 * 61) /* enough for every size_t up to 2^63 */

/* Thread caches (tcache.h): classes with a slot, up to 2^40 bytes (class
 * 156 ends at 1.25 * 2^40); larger requests bypass the cache. 160 classes
 * * 4 locations * 8 bytes is 5 KiB of slots per device and thread. */
#define UM__TCACHE_CLASSES 160
#define UM__TCACHE_GROUP 64 /* slots per bit of a cache's used map */
#define UM__TSLOT_RESERVED ((uintptr_t)1)
/* um_buffer.slot of a block that no thread-cache slot takes. */
#define UM__NO_SLOT UINT32_MAX

/* ------------------------------------------------------------------------ */
/* Statistics counters, one set per device. Gauges move both ways; counters
 * only grow. All relaxed atomics: they are figures, not synchronisation.
 * allocations, releases, pool_hits and bytes_in_use have per-thread shares
 * besides (um__tcounters), added on read; live buffers are allocations -
 * releases. */

typedef struct um__counters {
  atomic_uint_fast64_t bytes_in_use;
  atomic_uint_fast64_t bytes_reserved;
  atomic_uint_fast64_t bytes_pooled;
  atomic_uint_fast64_t peak_bytes_in_use;
  atomic_uint_fast64_t allocations;
  atomic_uint_fast64_t releases;
  atomic_uint_fast64_t pool_hits;
  atomic_uint_fast64_t pool_misses;
  atomic_uint_fast64_t device_allocs;
  atomic_uint_fast64_t device_frees;
  atomic_uint_fast64_t trims;
  atomic_uint_fast64_t bytes_trimmed;
  atomic_uint_fast64_t oom_retries;
  atomic_uint_fast64_t bytes_h2d;
  atomic_uint_fast64_t bytes_d2h;
  atomic_uint_fast64_t bytes_d2d;
  atomic_uint_fast64_t bytes_peer;
  atomic_uint_fast64_t xfer_local;
  atomic_uint_fast64_t xfer_peer;
  atomic_uint_fast64_t xfer_direct;
  atomic_uint_fast64_t xfer_pipelined;
  atomic_uint_fast64_t xfer_staged;
  atomic_uint_fast64_t fills;
  atomic_uint_fast64_t bytes_net_out;
  atomic_uint_fast64_t bytes_net_in;
  atomic_uint_fast64_t xfer_net;
} um__counters;

/* ------------------------------------------------------------------------ */
/* Pool (pool.c): per (device, location), one bin per size class. A bin is a
 * doubly linked list of idle blocks sorted on idle_key, newest at the head:
 * allocations take the head (warm in caches and TLBs), trims the tail. */

typedef struct um__bin {
  pthread_mutex_t lock;
  um_buffer *head;
  um_buffer *tail;
  uint64_t idle_bytes;
  /* Budget held by thread-cache slots of this class (tcache.h): idle_bytes
   * + reserved_bytes <= max_pool_bytes_per_class. */
  uint64_t reserved_bytes;
} um__bin;

typedef struct um__pool {
  um_device *dev;
  um_location loc;
  um__bin bins[UM__CLASS_COUNT];
  /* Bit c set while bins[c] holds a block (changed under the bin's lock):
   * trims and stats find the non-empty bins without touching the others. */
  atomic_uint_fast64_t nonempty[(UM__CLASS_COUNT + 63) / 64];
  /* The segments its blocks are carved from (mem/segment.c), or NULL where
   * blocks are blocks of their own (um_options.segments off, or a device
   * that cannot carve at this location). */
  struct um__segs *segs;
} um__pool;

/* ------------------------------------------------------------------------ */
/* Devices */

struct um_device {
  uint32_t magic; /* a handle of another kind answers UM_EINVAL */
  um_manager *m;
  int index;
  /* Unique in the process: a thread's queues name their device by it
   * (ops/queue.c), so that a stale entry never matches a later device at
   * the same address. */
  uint64_t serial;
  const um__backend *be;
  void *bdev;
  um_device_info info;
  um__pool pools[UM_LOCATION_COUNT];
  um__counters stats;
  bool host_memory; /* um__bdev_desc.host_memory */
  unsigned carve_locations; /* um__bdev_desc.carve_locations */
  size_t carve_align;       /* um__bdev_desc.carve_align */
  unsigned discard_locations; /* um__bdev_desc.discard_locations */
  /* DEVICE and UNIFIED bytes held from an OpenCL or CUDA device now: what
   * um_options.device_limit_bytes caps (block.c), and what OpenCL, which
   * has no free-memory query, would not know (um_device_memory). */
  atomic_uint_fast64_t limited_bytes;
  /* Pinned staging chunks for pageable copies (block.c). */
  pthread_mutex_t staging_lock;
  um__mem staging_free[8];
  int staging_count;
};

/* ------------------------------------------------------------------------ */
/* Buffers. A um_buffer is also the descriptor of its block: the handle and
 * the block travel together through the pool, so releasing then allocating
 * the same size hands back the same handle over the same memory. Handles
 * are never freed before the manager, so a stale handle is still readable
 * and answers UM_ESTATE instead of touching freed memory. */

typedef enum {
  UM__BUF_LIVE = 1,     /* owned by the application */
  UM__BUF_RELEASED = 2, /* released, waiting for its operations to finish */
  UM__BUF_IDLE = 3,     /* in the pool */
  UM__BUF_HUSK = 4      /* no memory: a descriptor waiting to be reused */
} um__buf_state;

/* A manager's bias (tcache.h, "A release without a locked instruction"). */
enum { UM__BIAS_NONE = 0, UM__BIAS_SOLE = 1, UM__BIAS_SHARED = 2 };

/* Where the block goes when the buffer is released (block_return.c). */
typedef enum {
  UM__KIND_POOLED = 0,   /* to the pool */
  UM__KIND_UNPOOLED = 1, /* to the device */
  UM__KIND_WRAPPED = 2,  /* the caller's memory: nothing to give back */
  UM__KIND_FILE = 3      /* mmap of a file: unmapped */
} um__buf_kind;

/* One registration of a UM_WRAP_PIN range with a device's backend
 * (cuMemHostRegister for CUDA), made through that device (buffer.c). */
typedef struct um__wrap_reg {
  um_device *dev;
  um__mem mem;
} um__wrap_reg;

/* A piece of work for the engine's threads (engine.c): the engine calls fn
 * with the item, as libuv's thread pool calls a request's work callback. */
typedef struct um__work {
  void (*fn)(struct um__work *w);
  struct um__work *next;
} um__work;

struct um_buffer {
  uint32_t magic;
  atomic_int state; /* um__buf_state */
  um_manager *m;
  um_device *dev;
  um_location loc;
  um__buf_kind kind;
  size_t size;     /* bytes requested */
  size_t capacity; /* bytes of the block */
  int cls;         /* size class of capacity, -1 when not pooled */
  /* Index of the block's slot in a thread cache (tcache.h), for a pooled
   * block of a class with slots; else UM__NO_SLOT. */
  uint32_t slot;
  um__mem mem;
  /* Moves each time the descriptor goes live: an operation checked against
   * one owner's buffer is refused, under the lock, if the descriptor went
   * to another owner meanwhile (op.c's um__op_check_locked). */
  atomic_uint gen;
  bool readonly;
  bool pinned_wrap;
  uint32_t trace_id; /* its id in the manager's trace (core/trace.c), while live */
  /* UM_WRAP_PIN: the range's registrations with backends other than device
   * 0's (buffer.c), NULL when none. Set at wrap, undone at retire. */
  um__wrap_reg *wrap_regs;
  int nwrap_regs;
  /* A foreign wrap (um__wrap_foreign: a DLPack producer's memory): called
   * once when the memory goes back to its owner (block_return.c), then NULL. */
  void (*on_return)(void *ctx);
  void *on_return_ctx;
  /* Set when an operation or a mapping was made on the buffer since it
   * went live: um_release then takes b->lock to wait for or defer behind
   * them. Buffers never touched that way are released without the lock. */
  atomic_bool touched;
  /* A peer's transfer may still write the memory (net.c: a revocation that
   * gave up): the block is not given back until it cannot. */
  atomic_bool net_held;
  /* Owners beyond the first (um_buffer_retain): um_release drops one of
   * them while there are any. */
  atomic_int holds;
  /* DLPack tensors exported from the buffer and not deleted yet (dlpack.c;
   * each holds one of the holds): the leak report names them. */
  atomic_int dlpack_tensors;

  pthread_mutex_t lock;     /* guards everything below */
  pthread_cond_t idle_cond; /* signalled when pending drops to 0, and when
                               a mapping stops being busy */
  void *shadow;             /* host copy of a buffer with no host view (map.c) */
  /* From valid to access_op: the state of a live buffer's operations,
   * zero when it goes live (um__buffer_init_live clears the range in one
   * go; keep these fields together and zero their initial values). */
  unsigned valid; /* UM_VALID_* */
  bool mapped;
  um_map_mode map_mode;
  size_t map_off, map_len;
  void *map_ptr;
  bool map_native; /* mapping came from backend->map */
  /* um_map / um_unmap is calling the backend with the lock dropped; the
   * mapping is neither made nor ended yet (waiters use idle_cond). */
  bool map_busy;
  um_event *last;   /* last operation issued on the buffer (a reference) */
  unsigned pending; /* operations issued and not yet finished */
  bool release_deferred;
  /* The caller's bracket (access.c): 0 none, 1 being opened, 2 open, with
   * its operation. */
  int access_state;
  um_event *access_op;

  /* pool links (under the bin's lock) */
  um_buffer *pool_prev, *pool_next;
  uint64_t idle_since_ns;
  /* Order of going idle (pool.c: a bin is sorted on it, newest at the
   * head; trims take the smallest first). A logical clock rather than a
   * time, so that the thread caches' lock-free path can stamp it. */
  uint64_t idle_key;

  um_buffer *all_next;        /* manager registry (block.c, registry_lock) */
  um_buffer *husk_next;       /* free descriptors (block.c, registry_lock) */
  um_buffer *quarantine_next; /* debug quarantine (registry_lock) */
  const char *site_file;
  int site_line;
  /* What observing stamps at allocation (core/observe.c): the tag (0: not
   * counted for any), the allocating thread's number, the time, and gen
   * then (the stamp holds while gen has not moved). */
  uint16_t tag;
  uint32_t obs_thread;
  uint32_t obs_gen;
  uint64_t born_ns;
  /* um_options.backtraces: the allocation's return addresses, nframes of
   * them (an array of UM_SNAPSHOT_FRAMES kept for the descriptor's lives,
   * freed at the manager's destroy), or NULL. */
  void **frames;
  int nframes;

  /* A retire handed to the engine by a thread that must not block (a
   * backend's own reporting thread, ops/complete.c). Last: a cold field,
   * kept out of the lines that a pool hit reads and writes (docs/design.md,
   * Decisions: "Pool fields first"). */
  um__work retire_work;
};

/* ------------------------------------------------------------------------ */
/* Events and operations (ops/: event.c the objects, engine.c the workers,
 * op.c and complete.c the life of an operation, path.c how a copy runs) */

typedef enum {
  UM__OP_COPY = 0,   /* covers copy, copy_from_host, copy_to_host */
  UM__OP_FILL = 1,
  UM__OP_GROUP = 2,  /* completes when its members do (um_copy_batch) */
  UM__OP_ACCESS = 3, /* the caller's bracket (access.c) */
  UM__OP_GATE = 4,   /* opens a gate, or stands for one, once an earlier
                        operation finished (access.c) */
  UM__OP_NET = 5,    /* um_net_put (src set) or um_net_get (dst set): the
                        transfer is attached (net_ops.c) */
  UM__OP_RUN = 6     /* a batch's copies queued on one single-queue device
                        (op.c): the last operation of every buffer they
                        touch, done when the queue mark behind them is */
} um__op_kind;

typedef enum {
  UM__EV_QUEUED = 0,  /* waiting for earlier operations or a worker */
  UM__EV_RUNNING = 1, /* executing, or handed to a device queue */
  UM__EV_DONE = 2
} um__ev_state;

typedef struct um__path um__path; /* path.c */

#define UM__MAX_DEPENDENTS 3

/* The parts of an operation that one kind has (um_event's union). */

/* A copy or a fill: where in its buffers, or the caller's host memory. */
typedef struct um__op_copy {
  size_t dst_off, src_off;
  const void *host_src;
  void *host_dst;
  unsigned char value; /* a fill's byte */
} um__op_copy;

/* A bracket (interop/access.c): its mode, the token its wait handle stands
 * on (borrowed from wait_owner, or a gate) and the caller's last command
 * (adopted at um_access_end); the gate operation that opens the gate, or
 * stands for it on devices without native events; its slot (brackets.c);
 * the one wait handle it shares with the other brackets of its
 * um_access_begin_n, or NULL (access.c). */
struct um__access_join;
typedef struct um__op_access {
  um_map_mode mode;
  int slot;
  void *wait;
  um_event *wait_owner;
  um_event *gate;
  void *done;
  struct um__access_join *join;
} um__op_access;

/* A gate operation: the gate it opens on dev (token NULL: none, the
 * operation itself is the wait). */
typedef struct um__op_gate {
  void *token;
  um_device *dev;
} um__op_gate;

/* A network transfer (net/net_ops.c), attached by its issuer, and how to
 * drop it: the operation layer calls drop once, when the operation
 * completes or when the issue refuses it, never later, so an event object
 * going back to the free list holds nothing. */
typedef struct um__op_net {
  void *transfer;
  void (*drop)(um_event *op);
} um__op_net;

/* A group (um_copy_batch, group.c): its open runs, one per single-queue
 * device, while it is being issued, and its members' first failure. */
typedef struct um__op_group {
  struct um__run *runs;
  atomic_int first_error;
} um__op_group;

/* An operation's place in the completion order (complete.c's gate): it is
 * reported done only after prior, an operation it follows on a buffer.
 * While prior is unfinished at the gate, the node is in prior's
 * prior_waiters list. */
typedef struct um__prior {
  um_event *prior; /* a reference, until the gate lets waiter through */
  um_event *waiter;
  struct um__prior *next;
} um__prior;

/* Event objects are made in slabs and reused through the manager's free
 * list; they are freed only with the manager, so a stale handle (an event
 * the caller released) is still readable and answers UM_ESTATE. */
#define UM__EVENT_SLAB 64
/* Room for the text of a failure that happened on another thread than the
 * waiter's (um_last_error() after um_event_wait). */
#define UM__EVENT_TEXT 160

struct um_event {
  /* Fixed for the object's life. */
  uint32_t magic;
  um_manager *m;
  pthread_mutex_t lock;
  pthread_cond_t cond;
  um_event *free_next; /* manager's free list (m->event_lock) */
  /* Threads waiting on cond (under lock): the operation's completion
   * broadcasts only when there are some. Back to 0 before the object is
   * reused (a waiter holds a reference). */
  int cond_waiters;
  /* Why the operation failed, written before it completes by the thread
   * that saw the failure (op.c, or a path's asynchronous start), read by
   * waiters once it is done. Only its first byte is reset for a new
   * operation (um__event_new), so it stays out of the region below. */
  char error_text[UM__EVENT_TEXT];
  /* The backend's room for a native transfer's completion (backend.h:
   * um__xfer.done_space), so that it allocates nothing per operation. */
  void *done_space[UM__DONE_SPACE / sizeof(void *)];
  /* Written before they are read in each operation, so not reset either
   * (the reset writes every cache line it covers, and the object was last
   * written by the thread that completed its previous operation): the
   * first followers (counted by ndependents), the gate's nodes (counted by
   * npriors), the gate's count, status and ready list (set as it closes,
   * complete.c's gate_passes and um__op_complete), and the engine's work item. */
  um_event *dependents[UM__MAX_DEPENDENTS];
  um__prior prior_space[2];
  atomic_int priors_pending;
  int gate_status;
  um_event *gate_next;
  um__work work; /* the engine's queue: start it, or complete it */

  /* Reset for each operation: everything from here on. */
  atomic_int refs;          /* 0: on the free list */
  atomic_bool caller_holds; /* the caller has not released its handle */
  /* A bracket's end that rides on its queue's next command (um__xfer.ride):
   * whoever comes to wait for it kicks the device's riders (core/riders.c).
   * 1 from before the backend lists it, 2 once its start is kept: from
   * then on it may be given a token (ops/tokens.c, um__rider_token). */
  atomic_uchar rides;
  atomic_int state;         /* um__ev_state */
  int status;
  bool canceled;
  /* The backend refused to queue it behind earlier operations: it fails
   * with native_status once they finished (op.c's op_start_after_tokens). */
  bool refused;

  /* what to do: its kind (which member of the union below it uses), the
   * buffers it orders on and how many bytes it moves (0 for a bracket, a
   * gate, a group or a run) */
  um__op_kind kind;
  um_buffer *dst, *src;
  uint32_t dst_gen, src_gen; /* the buffers' gen when the API checked them */
  size_t bytes;
  /* Issued while the manager observed (core/observe.c): the issuing
   * thread's tag (0: none) and when it was issued. */
  uint16_t obs_tag;
  uint64_t obs_t0;

  /* ordering: operations that wait for this one; beyond the array (a
   * batch's run is the last operation of many buffers, each of which may
   * get a follower), a heap array of nmore_dependents, freed at completion */
  atomic_int deps_pending;
  int ndependents; /* of dependents[], above */
  um_event **more_dependents;
  int nmore_dependents;
  um_event *group; /* batch this operation belongs to */

  /* completion order (complete.c's gate): the operations it follows on its
   * buffers that had not finished when it was published, in prior_space
   * (or a run's array); at the gate, how many it still waits for, and its
   * status meanwhile; the later operations waiting at their gates for
   * this one (under lock); a completing thread's list of operations its
   * completions let through (prior_space, priors_pending, gate_status and
   * gate_next are above, not reset) */
  um__prior *priors;
  int npriors;
  um__prior *prior_waiters;

  /* how it runs: its path (path.c), chosen at issue under the buffers'
   * locks, and the device whose queue runs it (NULL: host threads) */
  const um__path *path;
  um_device *native_dev;
  bool blocking;

  /* The backend's token while the operation runs on a device queue (set
   * by tokens.c's keep_native without the lock, taken under lock when it
   * finishes), and its owners: one for the operation, one per issuer that
   * borrowed it for a wait list (held.c's um__op_token_borrow, under lock).
   * The last owner releases it, so no lock is held across the backend's
   * calls. */
  _Atomic(void *) native;
  atomic_int native_refs;
  int native_status;
  /* The backend reported completion inside xfer_async, on the issuing
   * thread (tokens.c's native_done): the issuer completes the operation once
   * the backend call returned. Touched by that thread only. */
  bool complete_deferred;
  /* The token kept for the caller's um_event_native (one of native_refs),
   * until um_event_release: whichever of it and keep_native exchanges it
   * for NULL puts that share. */
  _Atomic(void *) caller_native;
  /* The device whose in-order queue queued_q holds it (stored, release,
   * once queued): a later transfer of that queue needs no token to follow
   * it. queued_q is set by the plan (path.c; -1: no such queue), a run's
   * when it is made (op.c). */
  _Atomic(um_device *) queued_on;
  int queued_q;
  /* No caller event and no wait (a batch member, op.c). */
  bool detached;

  /* The open brackets it waits for (brackets.c): bit k for the
   * bracket of slot k, its own when it is a bracket, inherited from the
   * unfinished operations it follows when it is published, counted while
   * the slot's bracket opened no later than mark_epoch. Written before it
   * is published (under its buffers' locks), then only read. */
  uint64_t bracket_marks;
  uint64_t mark_epoch; /* the manager's bracket_epoch as it was marked */

  /* What only one kind has. Read only where the kind is known: by the
   * kind's own path and issuer, or behind a test of kind. */
  union {
    um__op_copy copy;     /* UM__OP_COPY, UM__OP_FILL */
    um__op_access access; /* UM__OP_ACCESS */
    um__op_gate gate;     /* UM__OP_GATE */
    um__op_net net;       /* UM__OP_NET */
    um__op_group batch;   /* UM__OP_GROUP */
    struct um__run *run;  /* UM__OP_RUN: the run it stands for (group.c) */
  };
};

typedef struct um__event_slab {
  struct um__event_slab *next;
  um_event ev[UM__EVENT_SLAB];
} um__event_slab;

/* ------------------------------------------------------------------------ */
/* Thread caches (tcache.c, tcache.h). */

/* Per-thread, per-device share of the hot counters. Only the owner
 * thread writes them (relaxed load + store: no locked instruction); readers
 * add them to the device's counters. bytes_in_use is a difference (a
 * buffer allocated here and released elsewhere counts + here and - there)
 * stored as uint64_t, read as int64_t. Live buffers are not counted apart:
 * they are allocations - releases (stats.c). */
typedef struct um__tcounters {
  /* Allocations that were not pool hits: a hit counts in pool_hits alone,
   * so the hit costs one counter (allocations = not_hits + pool_hits). */
  atomic_uint_fast64_t not_hits;
  atomic_uint_fast64_t releases;
  atomic_uint_fast64_t pool_hits;
  atomic_uint_fast64_t bytes_in_use;
  /* Highest bytes_in_use of this thread since the device's peak was last
   * brought up to date from here (owner only). */
  int64_t in_use_high;
  bool high_pending; /* in_use_high rose since the peak was last brought up */
} um__tcounters;

typedef struct um__tcache {
  _Atomic(um_manager *) m; /* NULL once the manager is gone */
  int ndevices;
  bool slots_on;  /* pooling on and debug off: the slots are used */
  /* The owner takes from its slots with plain loads and stores inside a
   * section marked by busy, which a thread moving blocks out of the cache
   * (steal set) forces into view with a process-wide barrier (tcache.h,
   * "Taking without a locked instruction"). false where that barrier is not
   * to be had: the owner then takes with a compare-and-swap. */
  bool asym;
  atomic_int busy;  /* owner: inside a take */
  atomic_int steal; /* another thread is moving blocks out (tcache_lock) */
  unsigned epoch; /* the manager's flush_epoch when last seen (owner) */
  uint64_t clock; /* this thread's idle_key clock (owner) */
  um__tcounters *ctr; /* [ndevices] */
  /* This thread's bytes_in_use over all devices, for the manager's peak;
   * kept only when the manager has several devices (else it is ctr[0]'s). */
  atomic_uint_fast64_t in_use_total;
  int64_t in_use_total_high;
  /* New highs of this thread not yet carried into the peaks (owner): the
   * peaks are brought up to date at the thread's next release (when its
   * level turns down), after a run of new highs, and when the thread
   * leaves the manager (tcache.h, um__tcache_count_in). */
  unsigned high_pending;
  int64_t high_grew; /* how far those new highs rose (owner) */
  _Atomic(uintptr_t) *slots; /* [ndevices][UM_LOCATION_COUNT][UM__TCACHE_CLASSES] */
  /* the capacity of the block a slot last held, for the statistics (a
   * large block carved at its size is less than its class: mem.h) */
  _Atomic(size_t) *slot_caps;
  /* Which groups of UM__TCACHE_GROUP slots may be other than 0: bit g of
   * word g / 64 for slots [g * UM__TCACHE_GROUP, (g + 1) * UM__TCACHE_GROUP).
   * Set by the owner before it first reserves a slot of the group, cleared
   * by the owner's own flush (which leaves every slot 0), so that a flush or
   * a statistics read visits only the groups in use, not every slot of
   * every device (tcache.c, for_each_used). */
  _Atomic(uint64_t) *used;
  struct um__tcache *m_prev, *m_next; /* manager's list (m->tcache_lock) */
  struct um__tcache *t_next;          /* thread's list (owner) */
  /* Event objects freed on this thread, reused by it (event.c): moved to
   * and from the manager's list in bunches, one lock per bunch. */
  um_event *ev_free;
  int ev_count;
} um__tcache;

/* ------------------------------------------------------------------------ */
/* Manager */

typedef struct um__engine {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  um__work *head, *tail;
  pthread_t *threads;
  int nthreads;
  bool stopping;
  atomic_int inflight; /* operations issued and not finished */
  pthread_cond_t drained;
} um__engine;

struct um_manager {
  /* First, as in every handle: a handle of another kind passed as a
   * manager is told apart by reading it, in bounds. */
  uint32_t magic;
  um_options opts;
  um_device *devices[UM__MAX_DEVICES];
  /* Grows when a device is adopted: read it with um__ndevices (acquire),
   * the device is complete before it is counted. */
  atomic_int ndevices;
  pthread_mutex_t devices_lock; /* adopting a device */
  struct {
    const um__backend *be;
    void *ctx;
  } backends[UM__MAX_BACKENDS];
  int nbackends;

  um__engine engine;

  /* Open brackets (brackets.c): bit k of brackets_open is set
   * while the bracket of slot k is open; slot_epoch[k] is the value of
   * bracket_epoch (a count of openings) at which it opened; the last slot
   * is shared by the brackets beyond the others, bracket_shared of them. A
   * zero brackets_open (beside bias, on a line um_release reads anyway),
   * read relaxed, is all that the operations pay when no bracket is open. */
  atomic_uint_fast64_t bracket_epoch;
  atomic_uint_fast64_t slot_epoch[64];
  int bracket_shared;          /* under bracket_lock */
  pthread_mutex_t bracket_lock; /* taking and closing slots */
  /* UNIMEM_TRACE_FILE: the recording of allocations and releases
   * (core/trace.c), or NULL. Set at create, before any thread cache. */
  struct um__trace *trace;
  /* Tags, scopes and the history (core/observe.c), made at create. */
  struct um__obs *obs;
  /* The history's ring (core/history.c), NULL before the first start. */
  _Atomic(struct um__hist *) hist;

  /* event objects (event.c): slabs, freed at destroy, and the free list */
  pthread_mutex_t event_lock;
  /* Threads inside um_event_wait: destroy frees the event objects only
   * once they have all left (after its drain has finished their waits). */
  atomic_int event_waiters;
  /* Threads in a wait that a rider may hold up (core/riders.c): a bracket
   * end that rides while there are any kicks its device at once. */
  atomic_int rider_waiters;
  um_event *event_free;
  um__event_slab *event_slabs;

  /* um__fork_generation when the manager was made: a child process of
   * fork() sees another value and refuses to use the parent's manager. */
  unsigned fork_gen;

  /* registry of every buffer descriptor ever made, for the leak report
   * (block.c) */
  pthread_mutex_t registry_lock;
  um_buffer *all_buffers;
  um_buffer *husks;
  /* debug quarantine (quarantine.c), also under registry_lock: released
   * buffers held back from reuse, oldest first */
  um_buffer *quarantine_head, *quarantine_tail;
  uint64_t quarantine_count, quarantine_bytes;

  /* totals across devices for the figures that are not sums */
  atomic_uint_fast64_t bytes_in_use;
  atomic_uint_fast64_t peak_bytes_in_use;
  atomic_uint_fast64_t bytes_pooled;
  /* the segments of every pool (mem/segment.c's published figures): the
   * bytes no block uses (idle memory, counted against max_pool_bytes with
   * the bins'), and of those what a trim could give back (the trim timer
   * sleeps while both this and bytes_pooled are 0) */
  atomic_uint_fast64_t seg_free, seg_returnable;

  /* peer matrix: peer[a * UM__MAX_DEVICES + b] != 0 when a may access b */
  unsigned char peer[UM__MAX_DEVICES * UM__MAX_DEVICES];
  pthread_mutex_t peer_lock;

  /* thread caches (tcache.h): the list of caches, the pool budget held by
   * bins and slots together (<= max_pool_bytes), and the epoch that asks
   * every owner to give its cached blocks and budget back. */
  pthread_mutex_t tcache_lock;
  um__tcache *tcaches;
  atomic_uint_fast64_t pool_claimed;
  atomic_uint flush_epoch;
  /* Not 0 while the manager observes (core/observe.c): the fast paths
   * call its hooks. Beside what they read anyway. */
  atomic_int observing;
  /* The sole thread (tcache.h, "A release without a locked instruction"):
   * bias goes UM__BIAS_NONE -> SOLE (the first cache made for the manager,
   * sole_tc, under tcache_lock) -> SHARED (another thread releases or
   * touches a buffer, or the sole thread leaves), and never back. */
  atomic_int bias;
  atomic_uint_fast64_t brackets_open; /* see bracket_epoch */
  _Atomic(um__tcache *) sole_tc;
  /* Highest idle_key given by a slow path; thread caches keep their own
   * clock ahead of it (a Lamport clock: tcache.h). */
  atomic_uint_fast64_t idle_clock;

  /* trims (trim.c) and the trim timer */
  pthread_t trim_thread;
  atomic_bool trim_running;
  pthread_mutex_t trim_lock;
  /* Serialises trims (um__trim and the timer's tick): a trim moves the
   * caches' blocks to the bins, then frees the bins; another trim between
   * the two could be holding a block on its way to a bin, and a
   * um_pool_trim(m, 0) would return with that block still idle. */
  pthread_mutex_t trimming;
  pthread_cond_t trim_cond;
  bool trim_stop;
  /* The timer sleeps with no deadline while nothing is idle; a thread that
   * reserves a cache slot while it sleeps (reserve_seq moved) wakes it. */
  atomic_bool trim_asleep;
  atomic_uint reserve_seq;
};

/* ------------------------------------------------------------------------ */
/* Handles */

static inline bool um__loc_valid(int loc) { return loc >= UM_HOST && loc <= UM_UNIFIED; }

/* The manager's devices now (adoption adds some). */
static inline int um__ndevices(const um_manager *m) {
  return atomic_load_explicit(&((um_manager *)m)->ndevices, memory_order_acquire);
}

/* d is a device handle (not NULL, not a handle of another kind). */
static inline bool um__device_ok(const um_device *d) { return d != NULL && d->magic == UM__DEVICE_MAGIC; }
/* m is a manager handle (not NULL, not a handle of another kind). */
static inline bool um__manager_ok(const um_manager *m) { return m != NULL && m->magic == UM__MANAGER_MAGIC; }

#endif /* UNIMEM_TYPES_H */
