/* Internal declarations shared by the core's files.
 *
 * Layers (docs/design.md draws them):
 *   API (buffer.c, transfer.c, device.c, peer.c, stats.c, mapfile.c)
 *     -> manager.c (devices, options, registry of handles)
 *     -> pool.c + sizeclass.c (idle blocks per device and location)
 *     -> event.c (operations, ordering, worker threads)
 *     -> backend table (backend.h; backends/cpu.c, opencl.c, cuda.c)
 */
#ifndef UNIMEM_INTERNAL_H
#define UNIMEM_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "atomic.h"
#include "backend.h"

#define UM__BUFFER_MAGIC 0x554d4246u /* "UMBF" */
#define UM__EVENT_MAGIC 0x554d4556u  /* "UMEV" */
#define UM__MAX_BACKENDS 8

/* ------------------------------------------------------------------------ */
/* Size classes (sizeclass.c): exact up to 8 bytes, then four classes per
 * power of two, so a request never wastes 25% or more of its size. */

#define UM__CLASS_COUNT (8 + 4 * 61) /* enough for every size_t up to 2^63 */

/* Inline (C99 semantics, external definitions in sizeclass.c): they are on
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
/* Statistics counters, one set per device. Gauges move both ways; counters
 * only grow. All relaxed atomics: they are figures, not synchronisation.
 * allocations, releases, pool_hits and bytes_in_use have per-thread shares
 * besides (tcache.h), added on read; live buffers are allocations -
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
} um__counters;

/* ------------------------------------------------------------------------ */
/* Pool (pool.c): per (device, location), one bin per size class. A bin is a
 * doubly linked list of idle blocks: released blocks go to the head and are
 * taken from the head (the most recently used block, still warm in caches
 * and TLBs); trimming takes from the tail (the oldest). */

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
} um__pool;

/* ------------------------------------------------------------------------ */
/* Devices */

struct um_device {
  um_manager *m;
  int index;
  const um__backend *be;
  void *bdev;
  um_device_info info;
  um__pool pools[UM_LOCATION_COUNT];
  um__counters stats;
  bool host_memory; /* um__bdev_desc.host_memory */
  /* Pinned staging chunks for pageable copies (transfer.c). */
  pthread_mutex_t staging_lock;
  um__mem *staging_free[8];
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

typedef enum {
  UM__KIND_POOLED = 0,   /* block returns to the pool on release */
  UM__KIND_UNPOOLED = 1, /* block returns to the device on release */
  UM__KIND_WRAPPED = 2,  /* caller's memory */
  UM__KIND_FILE = 3      /* mmap of a file */
} um__buf_kind;

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
  um__mem mem;
  /* Moves each time the descriptor goes live: an operation checked against
   * one owner's buffer is refused, under the lock, if the descriptor went
   * to another owner meanwhile (event.c's op_check_locked). */
  atomic_uint gen;
  bool readonly;
  bool pinned_wrap;
  /* UM_WRAP_PIN: the range's registrations with backends other than device
   * 0's (buffer.c), NULL when none. Set at wrap, undone at recycle. */
  struct um__wrap_reg *wrap_regs;
  int nwrap_regs;
  /* Set when an operation or a mapping was made on the buffer since it
   * went live: um_release then takes b->lock to wait for or defer behind
   * them. Buffers never touched that way are released without the lock. */
  atomic_bool touched;

  pthread_mutex_t lock; /* guards everything below */
  pthread_cond_t idle_cond; /* signalled when pending drops to 0, and when
                               a mapping stops being busy */
  unsigned valid;       /* UM_VALID_* */
  bool mapped;
  um_map_mode map_mode;
  size_t map_off, map_len;
  void *map_ptr;
  bool map_native;  /* mapping came from backend->map */
  /* um_map / um_unmap is calling the backend with the lock dropped; the
   * mapping is neither made nor ended yet (waiters use idle_cond). */
  bool map_busy;
  void *shadow;     /* host copy of a buffer with no host view */
  um_event *last;   /* last operation issued on the buffer (a reference) */
  unsigned pending; /* operations issued and not yet finished */
  bool release_deferred;

  /* pool links (under the bin's lock) */
  um_buffer *pool_prev, *pool_next;
  uint64_t idle_since_ns;
  /* Order of going idle (pool.c: a bin is sorted on it, newest at the
   * head; trims take the smallest first). A logical clock rather than a
   * time, so that the thread caches' lock-free path can stamp it. */
  uint64_t idle_key;

  um_buffer *all_next; /* manager registry (under registry_lock) */
  um_buffer *husk_next;
  um_buffer *quarantine_next; /* debug quarantine (under registry_lock) */
  const char *site_file;
  int site_line;
};

/* ------------------------------------------------------------------------ */
/* Events and operations (event.c) */

typedef enum {
  UM__OP_COPY = 0, /* covers copy, copy_from_host, copy_to_host */
  UM__OP_FILL = 1,
  UM__OP_GROUP = 2 /* completes when its members do (um_copy_batch) */
} um__op_kind;

typedef enum {
  UM__EV_QUEUED = 0,  /* waiting for earlier operations or a worker */
  UM__EV_RUNNING = 1, /* executing, or handed to a device queue */
  UM__EV_DONE = 2
} um__ev_state;

#define UM__MAX_DEPENDENTS 3

/* Event objects are made in slabs and reused through the manager's free
 * list; they are freed only with the manager, so a stale handle (an event
 * the caller released) is still readable and answers UM_ESTATE. */
#define UM__EVENT_SLAB 64

struct um_event {
  /* Fixed for the object's life. */
  uint32_t magic;
  um_manager *m;
  pthread_mutex_t lock;
  pthread_cond_t cond;
  um_event *free_next; /* manager's free list (m->event_lock) */

  /* Reset for each operation: everything from here on. */
  atomic_int refs;          /* 0: on the free list */
  atomic_bool caller_holds; /* the caller has not released its handle */
  atomic_int state;         /* um__ev_state */
  int status;
  bool canceled;

  /* what to do */
  um__op_kind kind;
  um_buffer *dst, *src;
  size_t dst_off, src_off, bytes;
  uint32_t dst_gen, src_gen; /* the buffers' gen when the API checked them */
  const void *host_src;
  void *host_dst;
  unsigned char value;

  /* ordering: operations that wait for this one */
  atomic_int deps_pending;
  um_event *dependents[UM__MAX_DEPENDENTS];
  int ndependents;
  um_event *group; /* batch this operation belongs to */
  atomic_int group_first_error;

  /* how it runs (transfer.c's um__path), chosen at issue */
  int path;
  bool blocking;

  /* native execution */
  um_device *native_dev;
  /* The backend's token while the operation runs on a device queue (under
   * lock), and its owners: one for the operation, one per issuer that
   * borrowed it for a wait list (event.c's token_borrow). The last owner
   * releases it, so no lock is held across the backend's calls. */
  void *native;
  atomic_int native_refs;
  int native_status;
  /* The backend reported completion inside xfer_async, on the issuing
   * thread (event.c's native_done): the issuer completes the operation once
   * the backend call returned. Touched by that thread only. */
  bool complete_deferred;

  um_event *queue_next; /* worker queue */
  int task;             /* what a worker does with it */
};

typedef struct um__event_slab {
  struct um__event_slab *next;
  um_event ev[UM__EVENT_SLAB];
} um__event_slab;

/* ------------------------------------------------------------------------ */
/* Manager */

typedef struct um__engine {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  um_event *head, *tail;
  pthread_t *threads;
  int nthreads;
  bool stopping;
  atomic_int inflight; /* operations issued and not finished */
  pthread_cond_t drained;
} um__engine;

struct um_manager {
  um_options opts;
  um_device **devices;
  int ndevices;
  struct {
    const um__backend *be;
    void *ctx;
  } backends[UM__MAX_BACKENDS];
  int nbackends;

  um__engine engine;

  /* event objects (event.c): slabs, freed at destroy, and the free list */
  pthread_mutex_t event_lock;
  um_event *event_free;
  um__event_slab *event_slabs;

  /* um__fork_generation when the manager was made: a child process of
   * fork() sees another value and refuses to use the parent's manager. */
  unsigned fork_gen;

  /* registry of every buffer descriptor ever made, for the leak report */
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

  /* peer matrix: peer[a * ndevices + b] != 0 when a may access b */
  unsigned char *peer;
  pthread_mutex_t peer_lock;

  /* thread caches (tcache.h): the list of caches, the pool budget held by
   * bins and slots together (<= max_pool_bytes), and the epoch that asks
   * every owner to give its cached blocks and budget back. */
  pthread_mutex_t tcache_lock;
  struct um__tcache *tcaches;
  atomic_uint_fast64_t pool_claimed;
  atomic_uint flush_epoch;
  /* Highest idle_key given by a slow path; thread caches keep their own
   * clock ahead of it (a Lamport clock: tcache.h). */
  atomic_uint_fast64_t idle_clock;

  /* trim timer */
  pthread_t trim_thread;
  atomic_bool trim_running;
  pthread_mutex_t trim_lock;
  /* Serialises trims (um__pool_trim and the timer's tick): a trim moves the
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
/* Internal functions */

void um__clear_error(void);
/* fork.c: moves in every child process of fork(); a manager made under
 * another value belongs to an ancestor process and is refused. */
extern atomic_uint um__fork_generation;
void um__fork_init(void);
int um__manager_check_process(const um_manager *m);
/* Entry points of a function returning int: UM_ESTATE for a manager of
 * another process. One load and one compare. */
#define UM__CHECK_PROCESS(m)                                                   \
  do {                                                                         \
    if (__builtin_expect((m)->fork_gen != um__atomic_load_relaxed(&um__fork_generation), 0))  \
      return um__manager_check_process(m);                                     \
  } while (0)
uint64_t um__now_ns(void);

/* options.c */
int um__options_check(const um_options *o);
bool um__backend_selected(const um_options *o, const char *name);

/* manager.c */
int um__manager_create_ex(const um_options *opts,
                          const um__backend *const *extra, int nextra,
                          um_manager **out);
um_buffer *um__descriptor_get(um_manager *m);
void um__descriptor_put(um_manager *m, um_buffer *b);

/* pool.c */
void um__pool_init(um__pool *p, um_device *dev, um_location loc);
void um__pool_destroy(um__pool *p);
um_buffer *um__pool_take(um__pool *p, int cls);
/* Keep b idle in the pool, or free it when the limits say no. b->idle_key
 * is set here. */
void um__pool_give(um__pool *p, um_buffer *b);
/* Free idle blocks, oldest first, until at most keep bytes stay idle in the
 * manager (dev == NULL) or on one device. Returns bytes freed. */
uint64_t um__pool_trim(um_manager *m, um_device *dev, uint64_t keep);
/* Free blocks idle since before cutoff_ns. */
uint64_t um__pool_trim_older(um_manager *m, uint64_t cutoff_ns);
void um__pool_largest(um__pool *p, uint64_t *largest);
/* Thread-cache slots (tcache.c): hold budget for one block of class cls
 * (false when a limit says no), give it back, and move a block taken out of
 * a slot, with its budget, into its bin. */
bool um__pool_reserve(um__pool *p, int cls);
void um__pool_unreserve(um__pool *p, int cls);
void um__pool_adopt(um__pool *p, um_buffer *b);
/* Give an idle block that lost its cache slot to a newer one (its
 * idle_key kept): like um__pool_give, and counted as a trim if the limits
 * free it. */
void um__pool_give_idle(um__pool *p, um_buffer *b);
/* The next idle_key, for a block going idle on the calling thread. */
uint64_t um__idle_key_next(um_manager *m);
/* Claim / return bytes of the manager's max_pool_bytes budget. */
bool um__pool_claim(um_manager *m, uint64_t bytes);
void um__pool_unclaim(um_manager *m, uint64_t bytes);
int um__trim_thread_start(um_manager *m);
void um__trim_thread_stop(um_manager *m);
void um__trim_thread_kick(um_manager *m);

/* buffer.c */
int um__block_alloc(um_device *d, um_location loc, size_t bytes, um__mem *mem);
void um__block_free(um_device *d, um_location loc, size_t bytes, um__mem *mem);
/* A released buffer with nothing pending: to the quarantine in debug mode,
 * else um__buffer_recycle_now. */
void um__buffer_recycle(um_buffer *b);
/* Back to the pool (or the device, or the caller) now. */
void um__buffer_recycle_now(um_buffer *b);
int um__buffer_check_live(const um_buffer *b);
/* um__buffer_check_live, and b's generation for a check under its lock. */
int um__buffer_check_owner(const um_buffer *b, uint32_t *gen);
/* Reset a descriptor's per-owner state (size, coherence, mapping, chain,
 * site) for a new owner; mem, dev, loc and kind are set by the caller. */
void um__buffer_init_live(um_buffer *b, size_t bytes, const char *file, int line);
/* One registration of a UM_WRAP_PIN range with a device's backend
 * (cuMemHostRegister for CUDA), made through that device. */
typedef struct um__wrap_reg {
  um_device *dev;
  um__mem mem;
} um__wrap_reg;
/* Whether b is a UM_WRAP_PIN wrap registered with d's backend, so that d
 * may DMA from and to it directly. */
bool um__wrap_registered(const um_buffer *b, const um_device *d);
/* An operation on b finished (b's lock held): drop it from b's chain;
 * *drop_last says the chain's reference to op must be dropped, *recycle
 * that b was released meanwhile and its block must now be recycled (both
 * after the lock is released). */
void um__buffer_op_finish_locked(um_buffer *b, um_event *op, bool *drop_last, bool *recycle);
/* event.c */
int um__engine_start(um_manager *m);
void um__engine_stop(um_manager *m);
void um__engine_drain(um_manager *m);
um_event *um__event_new(um_manager *m, um__op_kind kind);
void um__event_ref(um_event *e);
void um__event_unref(um_event *e);
/* Issue an operation filled in by the caller (dst/src/offsets/bytes).
 * Orders it after the buffers' earlier operations. done == NULL: runs to
 * completion and returns its status. */
int um__op_issue(um_event *op, um_event **done);
void um__op_complete(um_event *op, int status);
/* Manager destroy: free every event object. */
void um__events_free_all(um_manager *m);
int um__event_wait_internal(um_event *e);

/* transfer.c */
/* Run an operation to completion on the calling thread. */
int um__op_run(um_event *op);
/* Choose op's path (strategy) and the device whose native queue would run
 * it (op->native_dev, NULL when it must run on a host thread). */
void um__op_plan(um_event *op);
/* Start a planned native operation on its device's queue without waiting;
 * done reports completion. Returns the backend's status. */
int um__op_start_native(um_event *op, void *const *after, int nafter,
                        um__done_fn done, void **native);
/* Count a finished operation's bytes and strategy in the stats. */
void um__op_account(const um_event *op);
/* Whether op is small enough and host-only, so running it inline on the
 * issuing thread is cheaper than handing it to a worker. */
bool um__op_runs_inline(const um_event *op);
void um__staging_release_all(um_device *d);

/* quarantine.c: debug mode keeps released buffers from reuse. Bounds: a
 * buffer leaves after this many later releases, or once the quarantined
 * blocks hold more than this many bytes (the newest always stays). Freed
 * host bytes are overwritten with UM__POISON_BYTE. */
#define UM__QUARANTINE_MAX_BUFFERS 1024u
#define UM__QUARANTINE_MAX_BYTES (64ull << 20)
#define UM__POISON_BYTE 0xDE
void um__quarantine_put(um_buffer *b);
/* Recycle every quarantined buffer (at destroy). */
void um__quarantine_flush(um_manager *m);
/* Give the device's quarantined blocks back to it, keeping their handles
 * quarantined (an allocation on d failed: before trim and retry). */
void um__quarantine_drop_blocks(um_manager *m, um_device *d);

/* mapfile.c */
void um__file_unmap(um_buffer *b);

/* stats.c */
void um__stat_in_use_add(um_device *d, uint64_t bytes);
void um__stat_in_use_sub(um_device *d, uint64_t bytes);
/* Returns the manager's pooled bytes before the addition. */
uint64_t um__stat_pooled_add(um_device *d, uint64_t bytes);
void um__stat_pooled_sub(um_device *d, uint64_t bytes);

#define UM__STAT_ADD(dev, field, v)                                            \
  um__atomic_add_relaxed(&(dev)->stats.field, (uint64_t)(v))
#define UM__STAT_SUB(dev, field, v)                                            \
  um__atomic_sub_relaxed(&(dev)->stats.field, (uint64_t)(v))

static inline bool um__loc_valid(int loc) {
  return loc >= UM_HOST && loc <= UM_UNIFIED;
}

#endif /* UNIMEM_INTERNAL_H */
