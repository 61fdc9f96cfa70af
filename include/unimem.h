/* unimem — one way to allocate, pool, move and inspect memory on the host
 * CPU, OpenCL devices and NVIDIA GPUs.
 *
 * Conventions of this header:
 * - Every function that can fail returns int: UM_OK (0) or a negative UM_E*
 *   code. Results come back through out-parameters, which are written only
 *   on success.
 * - Handles (um_manager, um_device, um_buffer, um_event) are opaque. A
 *   um_device belongs to its manager and lives as long as it does; a
 *   um_buffer is owned by the caller from allocation until um_release; a
 *   um_event is owned by the caller until um_event_release. A handle of
 *   another kind (or NULL) where one kind is expected answers UM_EINVAL.
 * - Thread safety: every function may be called from any thread. Operations
 *   on one buffer take effect in the order they were issued.
 * - On failure, um_last_error() returns a thread-local text with the detail
 *   (the backend's own error name where there is one).
 */
#ifndef UNIMEM_H
#define UNIMEM_H

#include <stddef.h>
#include <stdint.h>

#include "unimem_version.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Marks the functions of the API: exported from the shared library (built
 * with hidden visibility otherwise). Empty when UNIMEM_STATIC is defined. */
#if defined(UNIMEM_STATIC)
#define UM_EXTERN
#elif defined(__GNUC__) || defined(__clang__)
#define UM_EXTERN __attribute__((visibility("default")))
#else
#define UM_EXTERN
#endif

/* ------------------------------------------------------------------------ */
/* Status codes                                                              */

/* One list generates the enum, um_strerror() and um_err_name(). */
#define UM_ERRNO_MAP(XX)                                                       \
  XX(OK, 0, "success")                                                         \
  XX(EINVAL, -1, "invalid argument")                                           \
  XX(ERANGE, -2, "offset or length outside the buffer")                        \
  XX(EOVERFLOW, -3, "size computation overflows")                              \
  XX(ENOMEM, -4, "out of memory")                                              \
  XX(ENODEV, -5, "no such device")                                             \
  XX(ENOTSUP, -6, "not supported by this device")                              \
  XX(ESTATE, -7, "operation not allowed in the object's current state")        \
  XX(EAGAIN, -8, "operation still pending")                                    \
  XX(ECANCELED, -9, "operation was canceled")                                  \
  XX(EBUSY, -10, "operation has already started")                              \
  XX(EBACKEND, -11, "backend failure")                                         \
  XX(ELEAK, -12, "buffers were never released")

/* Status codes: UM_OK (0) or a negative UM_E* value. */
typedef enum {
#define UM_ERRNO_ENUM_(name, value, text) UM_##name = (value),
  UM_ERRNO_MAP(UM_ERRNO_ENUM_)
#undef UM_ERRNO_ENUM_
} um_status;

/* Static text for a status code ("invalid argument"); never NULL. */
UM_EXTERN const char *um_strerror(int status);
/* The code's name ("UM_EINVAL"); "UM_UNKNOWN" for codes not in the list. */
UM_EXTERN const char *um_err_name(int status);
/* Thread-local detail of the last failure on this thread ("" when none).
 * Valid until the next unimem call on this thread. */
UM_EXTERN const char *um_last_error(void);

/* Library version, as UM_VERSION_HEX. */
UM_EXTERN unsigned um_version(void);
/* Library version, as "major.minor.patch". */
UM_EXTERN const char *um_version_string(void);

/* ------------------------------------------------------------------------ */
/* Types                                                                     */

/* Opaque handles: a manager (owns everything else), one of its devices, a
 * buffer, the completion of an operation (an event). */
typedef struct um_manager um_manager;
typedef struct um_device um_device;
typedef struct um_buffer um_buffer;
typedef struct um_event um_event;

/* Where a buffer's memory lives. */
typedef enum {
  UM_HOST = 0,    /* ordinary host memory */
  UM_DEVICE = 1,  /* device memory; may have no host view */
  UM_PINNED = 2,  /* page-locked host memory the device can DMA from */
  UM_UNIFIED = 3  /* memory shared by host and device (managed, SVM) */
} um_location;
/* Number of um_location values. */
#define UM_LOCATION_COUNT 4

/* um_alloc flags. */
enum {
  UM_ALLOC_UNPOOLED = 1u << 0, /* take a fresh block; never return it to a pool */
  UM_ALLOC_ZERO = 1u << 1      /* the buffer's bytes read as zero */
};
/* um_wrap_host flags. */
enum {
  UM_WRAP_READONLY = 1u << 0, /* writes through unimem answer UM_ESTATE */
  UM_WRAP_PIN = 1u << 1       /* page-lock the range while wrapped */
};
/* um_buffer_valid bits: which copies hold the current data. */
enum { UM_VALID_HOST = 1u << 0, UM_VALID_DEVICE = 1u << 1 };

/* Access asked of um_map and um_map_file. */
typedef enum {
  UM_MAP_READ = 0,       /* read only */
  UM_MAP_WRITE = 1,      /* write (the current contents are fetched) */
  UM_MAP_READ_WRITE = 2, /* read and write */
  UM_MAP_WRITE_DISCARD = 3 /* the previous contents need not be fetched */
} um_map_mode;

/* Device capability bits (um_device_info.caps). */
enum {
  UM_CAP_PINNED = 1u << 0,  /* UM_PINNED allocations */
  UM_CAP_UNIFIED = 1u << 1, /* UM_UNIFIED allocations */
  UM_CAP_PEER = 1u << 2,    /* peer access to some other device */
  UM_CAP_ASYNC = 1u << 3    /* copies run asynchronously on the device */
};

/* Log levels for um_options.log. */
typedef enum {
  UM_LOG_ERROR = 0,
  UM_LOG_WARN = 1,
  UM_LOG_INFO = 2,
  UM_LOG_DEBUG = 3
} um_log_level;

/* Receives each log message at or below um_options.log_level; ctx is
 * um_options.log_ctx. */
typedef void (*um_log_fn)(void *ctx, um_log_level level, const char *msg);

/* Called when a device allocation failed: after the pool released the
 * device's idle blocks and retried once when um_options.trim_on_pressure is
 * on, at the first failure when it is off. Return nonzero to have unimem
 * retry the allocation once more: the device's idle blocks, including those
 * of buffers the callback released, go back to the device first (whatever
 * trim_on_pressure says). Return 0 to fail with UM_ENOMEM. */
typedef int (*um_oom_fn)(void *ctx, um_device *device, size_t bytes);

/* Configuration. um_options_init() fills the defaults and then applies the
 * UNIMEM_<NAME> environment variables (upper-case field name, e.g.
 * UNIMEM_MAX_POOL_BYTES=1g, UNIMEM_BACKENDS=cpu,opencl). */
typedef struct um_options {
  int enable_pooling;                /* 1: released blocks are kept for reuse */
  uint64_t max_pool_bytes;           /* idle bytes kept in all pools together */
  uint64_t max_pool_bytes_per_class; /* idle bytes kept in one size class */
  uint32_t trim_interval_ms;   /* trim blocks idle this long; 0: no timer */
  int max_concurrent_transfers; /* transfers running at once (>= 1) */
  int use_pinned_staging; /* pageable copies larger than one chunk go through
                             pinned chunks: 0 never; 1 on devices that gain
                             from it (not those whose memory is host memory,
                             e.g. OpenCL CPU devices); 2 always */
  size_t staging_chunk_bytes;  /* size of one pinned staging chunk */
  uint64_t pinned_pool_bytes;  /* pinned memory kept for staging */
  int enable_peer;        /* enable peer access between devices at start */
  int trim_on_pressure;   /* on a failed allocation, trim and retry once */
  int scrub;              /* zero every pooled block handed to a new owner */
  int debug;              /* quarantine released handles, poison freed blocks */
  int huge_pages;         /* madvise(MADV_HUGEPAGE) large host blocks */
  uint64_t device_limit_bytes; /* cap each non-host device's memory (0: none) */
  uint32_t net_timeout_ms; /* um_net: longest a network step may go without
                              progress before its operation fails (>= 1) */
  uint32_t wait_spin_ns;   /* ns a thread waiting for an operation or a
                              device polls (pausing the CPU between polls)
                              before it sleeps: lower latency for blocking
                              calls, CPU burnt while waiting; 0 (default):
                              sleep at once. At most 1000000000 (1 s);
                              UNIMEM_WAIT_SPIN_NS takes plain decimal. Only
                              waiting threads poll, and a CUDA stream's
                              watcher for its next copy after a report;
                              idle past the budget, nothing does */
  char backends[128];     /* comma list: "cpu,opencl,cuda"; "" means all */
  um_log_level log_level; /* messages above this level are dropped */
  um_log_fn log;          /* NULL: messages go to stderr */
  void *log_ctx;          /* passed to log */
  um_oom_fn on_oom; /* optional; see um_oom_fn */
  void *oom_ctx;     /* passed to on_oom */
  int segments;      /* 1: pooled blocks are carved from larger device
                        allocations (segments), split on allocation and
                        merged on release, where the device can carve
                        (sub-buffers, pointers); 0: every pooled block is a
                        device allocation of its own */
  char oom_snapshot[256]; /* "": off; else um_alloc's UM_ENOMEM writes a
                             snapshot there (um_snapshot_write; "%p": the
                             process id) before it returns */
  int backtraces;         /* 1: the manager observes from its creation and
                             records each allocation's native backtrace
                             (um_snapshot_block.frames; about a microsecond
                             an allocation); 0: off */
} um_options;

/* Description of a device. */
typedef struct um_device_info {
  char name[128];      /* the device's own name */
  char backend[16];    /* "cpu", "opencl", "cuda" */
  int index;           /* position in the manager, 0 is the host CPU */
  unsigned caps;       /* UM_CAP_* */
  unsigned locations;  /* bit (1u << loc) for each um_location it can give */
  uint64_t total_bytes; /* device memory (host: physical RAM) */
} um_device_info;

/* Statistics. One list generates the struct, the JSON dump and the table of
 * the `unimem stats` command, so they cannot disagree.
 * XX(type, name, description) */
#define UM_STATS_FIELDS(XX)                                                    \
  XX(uint64_t, active_buffers, "live buffers")                                 \
  XX(uint64_t, bytes_in_use, "requested bytes of live buffers")                \
  XX(uint64_t, bytes_reserved, "bytes held from devices, live and idle")       \
  XX(uint64_t, bytes_pooled, "bytes idle in the pool")                         \
  XX(uint64_t, peak_bytes_in_use, "highest bytes_in_use seen")                 \
  XX(uint64_t, allocations, "successful allocations")                          \
  XX(uint64_t, releases, "buffers released")                                   \
  XX(uint64_t, pool_hits, "pooled allocations served from the pool")           \
  XX(uint64_t, pool_misses, "pooled allocations that needed a new block")      \
  XX(double, hit_rate, "pool_hits / (pool_hits + pool_misses)")                \
  XX(uint64_t, device_allocs, "blocks taken from the device")                  \
  XX(uint64_t, device_frees, "blocks given back to the device")                \
  XX(uint64_t, trims, "idle blocks released by trimming")                      \
  XX(uint64_t, bytes_trimmed, "bytes released by trimming")                    \
  XX(uint64_t, oom_retries, "allocations retried after releasing idle blocks") \
  XX(uint64_t, largest_pooled_block, "largest idle block")                     \
  XX(double, fragmentation, "1 - largest idle block / idle bytes")             \
  XX(uint64_t, bytes_h2d, "bytes copied host to device")                       \
  XX(uint64_t, bytes_d2h, "bytes copied device to host")                       \
  XX(uint64_t, bytes_d2d, "bytes copied within one device")                    \
  XX(uint64_t, bytes_peer, "bytes copied between devices")                     \
  XX(uint64_t, xfer_local, "copies run as device-local copies")                \
  XX(uint64_t, xfer_peer, "copies run over peer access")                       \
  XX(uint64_t, xfer_direct, "copies run as direct DMA or host memcpy")         \
  XX(uint64_t, xfer_pipelined, "copies run through pinned staging chunks")     \
  XX(uint64_t, xfer_staged, "copies staged through host memory")               \
  XX(uint64_t, fills, "fill operations")                                      \
  XX(uint64_t, bytes_net_out, "bytes this process put to peers (um_net_put)")  \
  XX(uint64_t, bytes_net_in, "bytes this process got from peers (um_net_get)") \
  XX(uint64_t, xfer_net, "um_net_put and um_net_get operations completed")      \
  XX(uint64_t, segments, "segments that pooled blocks are carved from")       \
  XX(uint64_t, bytes_segment_free, "free bytes inside segments (in bytes_pooled)") \
  XX(uint64_t, free_extents, "free extents inside segments")                  \
  XX(uint64_t, largest_free_extent, "largest free extent inside a segment")

/* Counters and gauges of one device, or of all devices (um_stats_get); one
 * field per entry of UM_STATS_FIELDS. */
typedef struct um_stats {
#define UM_STATS_MEMBER_(type, name, desc) type name;
  UM_STATS_FIELDS(UM_STATS_MEMBER_)
#undef UM_STATS_MEMBER_
} um_stats;

/* One copy of um_copy_batch: exactly one of src/host_src and exactly one of
 * dst/host_dst is set. */
typedef struct um_copy_op {
  um_buffer *dst;       /* destination buffer, or NULL for host_dst */
  size_t dst_off;       /* offset in dst */
  um_buffer *src;       /* source buffer, or NULL for host_src */
  size_t src_off;       /* offset in src */
  const void *host_src; /* source host memory, or NULL for src */
  void *host_dst;       /* destination host memory, or NULL for dst */
  size_t bytes;         /* bytes to copy (> 0) */
} um_copy_op;

/* ------------------------------------------------------------------------ */
/* Manager                                                                   */

/* Fill *opts with the defaults, then apply UNIMEM_* environment variables.
 * Values that do not parse are ignored with a warning on stderr. */
UM_EXTERN void um_options_init(um_options *opts);

/* Create a manager: discovers the devices of the chosen backends. opts may
 * be NULL (defaults plus environment). A backend that cannot load is
 * skipped with a log line. Returns UM_EINVAL (NULL out or bad option),
 * UM_ENOMEM. */
UM_EXTERN int um_manager_create(const um_options *opts, um_manager **out);

/* End every access bracket still open (as um_release does, behind what the
 * caller queued on the devices' caller queues), wait for every pending
 * operation, report each buffer never released (size, device, allocation
 * site when known) through the log, free everything. The wait includes
 * the caller's done events given to um_access_end: one that never
 * completes (an OpenCL user event never set, a CUevent never recorded
 * past) keeps destroy waiting until it does; complete it, or set it to an
 * error status, first. Returns UM_OK, UM_ELEAK when buffers were leaked
 * (they are freed all the same), UM_EINVAL for NULL or what is not a
 * manager. */
UM_EXTERN int um_manager_destroy(um_manager *m);

/* The options the manager runs with. */
UM_EXTERN int um_manager_options(const um_manager *m, um_options *out);

/* ------------------------------------------------------------------------ */
/* Devices                                                                   */

/* Number of devices (>= 1: index 0 is the host CPU); UM_EINVAL (negative)
 * for NULL or what is not a manager. */
UM_EXTERN int um_device_count(const um_manager *m);
/* Device at index, or NULL when out of range or m is not a manager. */
UM_EXTERN um_device *um_device_get(um_manager *m, int index);
/* Describe d into *out. UM_EINVAL for NULL. */
UM_EXTERN int um_device_info_get(const um_device *d, um_device_info *out);
/* Free and total memory as the device reports them now. */
UM_EXTERN int um_device_memory(um_device *d, uint64_t *free_bytes,
                               uint64_t *total_bytes);
/* Wait until every operation issued on the manager's devices has finished,
 * then for d's own queues. While an access bracket is open (between
 * um_access_begin and um_access_end, on any buffer), the operations that
 * wait for it, on its buffer or through other buffers' operations, cannot
 * finish before its end: when one of them, or the bracket itself, is on a
 * buffer of d, the call answers UM_ESTATE at once, waiting for nothing;
 * otherwise it waits for everything but them (a bracket on another
 * device's buffer does not stop it). Returns UM_OK, UM_EINVAL (not a
 * device), UM_ESTATE, the backend's failure. */
UM_EXTERN int um_device_synchronize(um_device *d);

/* ------------------------------------------------------------------------ */
/* Buffers                                                                   */

/* Allocate bytes on device d at location loc. flags: UM_ALLOC_*. Pooled
 * unless UM_ALLOC_UNPOOLED or pooling is off. Returns UM_EINVAL (NULL,
 * zero size, unknown location or flags, device of another manager),
 * UM_ENOTSUP (the device cannot give loc), UM_ENOMEM (after releasing idle
 * pool blocks and retrying). The caller owns *out until um_release.
 *
 * When out-of-memory shows: CUDA commits a block when it is allocated, so
 * UM_ENOMEM comes from this call. OpenCL drivers commit a buffer only at
 * the first command that uses it, and unimem does not make a round trip
 * to the driver to find out at allocation: this call answers UM_ENOMEM
 * when the DEVICE and UNIFIED bytes unimem holds on the device would pass
 * its memory size (um_device_info.total_bytes) or device_limit_bytes, or
 * when one allocation passes the driver's CL_DEVICE_MAX_MEM_ALLOC_SIZE;
 * memory that the driver still cannot find later (other processes hold
 * it) fails the first operation on the buffer (its status or event:
 * UM_ENOMEM), and a kernel of the caller's fails as OpenCL reports it. */
UM_EXTERN int um_alloc(um_manager *m, um_device *d, size_t bytes,
                       um_location loc, unsigned flags, um_buffer **out);
/* um_alloc of count * elem_size bytes; UM_EOVERFLOW when that overflows. */
UM_EXTERN int um_alloc_array(um_manager *m, um_device *d, size_t count,
                             size_t elem_size, um_location loc, unsigned flags,
                             um_buffer **out);
/* As um_alloc / um_alloc_array, recording the allocation site that the leak
 * report prints. Define UNIMEM_TRACK_SITES before including this header to
 * have um_alloc and um_alloc_array record their callers' sites. */
UM_EXTERN int um_alloc_at(um_manager *m, um_device *d, size_t bytes,
                          um_location loc, unsigned flags, um_buffer **out,
                          const char *file, int line);
UM_EXTERN int um_alloc_array_at(um_manager *m, um_device *d, size_t count,
                                size_t elem_size, um_location loc,
                                unsigned flags, um_buffer **out,
                                const char *file, int line);

/* A HOST buffer over caller memory on device 0, zero-copy: the buffer's
 * host view is host itself. flags: UM_WRAP_*. The caller keeps ownership
 * of the memory and must keep it alive until um_release. UM_EOVERFLOW when
 * host + bytes runs past the end of the address space (pinned or not). */
UM_EXTERN int um_wrap_host(um_manager *m, void *host, size_t bytes,
                           unsigned flags, um_buffer **out);

/* Give the buffer back. Its block returns to the pool when every operation
 * issued on it has finished (at once when none is pending). A wrap
 * (um_wrap_host, um_dlpack_import, um_net_alloc) is the exception: its
 * release waits for the operations issued on it, so that the caller may
 * free the memory as soon as this returns; when that wait would pass
 * through an open access bracket of another buffer (an operation on the
 * wrap follows one that waits for it), the release is refused with
 * UM_ESTATE and changes nothing: the wrap stays live, and a bracket open on
 * it stays open. The wrap's own open bracket is no reason to refuse: the
 * release ends it, as for any buffer. A mapped buffer is unmapped first; whether what was written
 * through the mapping reaches the device copy is unspecified (the block
 * goes back to the pool). The handle is
 * invalid afterwards: using or releasing it again answers UM_ESTATE until
 * its block is handed to a new allocation (with the debug option, until it
 * leaves the quarantine). An exposed buffer is unexposed first (see
 * um_net_unexpose: at most net_timeout_ms); memory that a peer's transfer
 * may still write is held back until it cannot. Returns UM_OK, UM_EINVAL
 * (not a buffer), UM_ESTATE (already released; a wrap whose release would
 * wait through another buffer's open bracket), UM_EBUSY (a wrap of
 * um_wrap_host is released, but a peer's transfer admitted before its
 * revocation did not end within net_timeout_ms and may still write the
 * caller's memory: keep it allocated until that peer's transfers ended).
 * um_release_after (Interop) orders the block's return after a native
 * event of the caller's instead. */
UM_EXTERN int um_release(um_buffer *b);

/* Getters; 0/NULL for NULL or released buffers. */
UM_EXTERN size_t um_buffer_size(const um_buffer *b);
UM_EXTERN um_device *um_buffer_device(const um_buffer *b);
UM_EXTERN um_location um_buffer_location(const um_buffer *b);
UM_EXTERN unsigned um_buffer_valid(const um_buffer *b);
/* Zero-copy host view of the whole buffer, or NULL when none exists (a
 * DEVICE buffer on a discrete device). */
UM_EXTERN void *um_buffer_host_ptr(um_buffer *b);

/* ------------------------------------------------------------------------ */
/* Data movement. done == NULL: the call blocks until the data has moved and
 * returns the operation's status. Such a blocking call (and a blocking
 * um_copy_batch, um_map, um_dlpack_export, um_stream) answers UM_ESTATE at
 * once, issuing nothing, when its wait would pass through an open access
 * bracket: one open on a buffer it uses, or one that an earlier operation
 * on such a buffer waits for, through any number of other buffers'
 * operations (an asynchronous um_copy out of a bracketed X into Y, then a
 * blocking copy of Y). Issue it with an event instead, or end the bracket
 * first. Otherwise the call returns once the
 * operation is issued and *done receives an event the caller must release.
 * Ranges are checked: UM_ERANGE when off + bytes exceeds the buffer.
 * Host memory passed to an asynchronous call must stay valid until its
 * event completes. */

/* Copy bytes from host memory src into dst at dst_off. */
UM_EXTERN int um_copy_from_host(um_buffer *dst, size_t dst_off,
                                const void *src, size_t bytes,
                                um_event **done);
/* Copy bytes of src at src_off into host memory dst. */
UM_EXTERN int um_copy_to_host(um_buffer *src, size_t src_off, void *dst,
                              size_t bytes, um_event **done);
/* Copy bytes from src at src_off to dst at dst_off, on one device or
 * between two (peer access where enabled, else staged through the host). */
UM_EXTERN int um_copy(um_buffer *dst, size_t dst_off, um_buffer *src,
                      size_t src_off, size_t bytes, um_event **done);
/* Issue n copies; at most max_concurrent_transfers run at once. Every op is
 * checked before any is issued. *done (or the blocking return) carries the
 * first failure among them. */
UM_EXTERN int um_copy_batch(um_manager *m, const um_copy_op *ops, size_t n,
                            um_event **done);
/* Set bytes bytes from off to the value (unsigned char)byte. */
UM_EXTERN int um_fill(um_buffer *dst, size_t off, int byte, size_t bytes,
                      um_event **done);

/* Host view of [off, off + len) for the given mode, fetching the device copy
 * first when the mode reads and the host copy is stale; it waits for the
 * operations issued on b before. One mapping per buffer at a time:
 * UM_ESTATE when already mapped, and when b is in an access bracket or its
 * operations wait for one (see Data movement). */
UM_EXTERN int um_map(um_buffer *b, um_map_mode mode, size_t off, size_t len,
                     void **host);
/* End the mapping that returned host; after a writing mode the device copy
 * is made current. UM_ESTATE when not mapped, UM_EINVAL when host is not
 * the pointer um_map returned. */
UM_EXTERN int um_unmap(um_buffer *b, void *host);

/* ------------------------------------------------------------------------ */
/* Events                                                                    */

/* Block until the operation finishes; returns its status (UM_ECANCELED when
 * it was canceled). Unlike the blocking calls, it waits also when the
 * operation waits for an open access bracket (ordered after one, on its
 * buffer or through other buffers' operations): it returns once another
 * thread's um_access_end lets the operation run; on the thread that is to
 * end that bracket it never returns (um_event_query answers UM_EAGAIN
 * without waiting). On a failure um_last_error() of the calling thread has
 * the failure's text, wherever it happened (a worker, a driver thread, the
 * network's thread); um_event_query does the same once the operation is
 * done. The event calls answer UM_EINVAL for what is not an event and
 * UM_ESTATE for an event the caller released. With um_options.wait_spin_ns
 * the thread polls the operation (and, where it runs on a device queue, the
 * device) for up to that long before it sleeps, as blocking copies, fills,
 * maps, batches and um_device_synchronize do too. */
UM_EXTERN int um_event_wait(um_event *e);
/* UM_EAGAIN while pending, else the operation's status. */
UM_EXTERN int um_event_query(um_event *e);
/* Cancel an operation that has not started: UM_OK (it will not run, and
 * from then on um_event_wait and um_event_query answer UM_ECANCELED at
 * once, a wait already under way included; the operations issued after it
 * on its buffers still wait for those issued before it), UM_EBUSY once it
 * started or ended. An operation handed to a device queue has started: on
 * a backend that queues every transfer at once (OpenCL), a copy is never
 * cancelable after its issue returned, whatever it waits for. */
UM_EXTERN int um_event_cancel(um_event *e);
/* Drop the caller's reference. The operation itself goes on. Returns
 * UM_OK, UM_EINVAL (not an event), UM_ESTATE (released already). A released
 * handle answers UM_ESTATE in every event call until unimem reuses its
 * object for a later operation; it never reaches freed memory while the
 * manager lives. Events not released by um_manager_destroy die with it. */
UM_EXTERN int um_event_release(um_event *e);

/* ------------------------------------------------------------------------ */
/* Peers                                                                     */

/* Let device a read and write b's memory directly (and copies between them
 * take the peer path). UM_ENOTSUP when the pair cannot; UM_OK when already
 * enabled or a == b. */
UM_EXTERN int um_peer_enable(um_device *a, um_device *b);
/* 1 when peer access from a to b is enabled (or a == b), 0 otherwise,
 * UM_EINVAL for NULL. */
UM_EXTERN int um_peer_enabled(const um_device *a, const um_device *b);
/* 1 when the pair could be enabled, 0 when not. */
UM_EXTERN int um_peer_possible(const um_device *a, const um_device *b);

/* ------------------------------------------------------------------------ */
/* Pool and statistics                                                       */

/* Statistics of device d, or of all devices together when d is NULL. */
UM_EXTERN int um_stats_get(um_manager *m, um_device *d, um_stats *out);
/* Write stats as one JSON object into buf (NUL-terminated, truncated to
 * cap); returns the length it needed, as snprintf does, or a UM_E* code. */
UM_EXTERN int um_stats_json(const um_stats *s, char *buf, size_t cap);
/* Release idle pool blocks, oldest first, until at most keep_bytes stay
 * idle in all pools together. With segments (um_options.segments), idle
 * blocks go back to their segments, wholly free segments to their devices,
 * and host memory inside free extents to the system; free bytes that share
 * a segment (on the host, a 64 KiB granule) with a live buffer stay held
 * (bytes_segment_free). With the debug option, the blocks of quarantined
 * buffers go back to their devices too (their handles stay quarantined). */
UM_EXTERN int um_pool_trim(um_manager *m, uint64_t keep_bytes);

/* ------------------------------------------------------------------------ */
/* Seeing the memory: tags, scoped statistics, a snapshot, a history         */

/* While a manager observes, every allocation and release goes through the
 * pool's locked path (no thread-cache hit), so that each block knows its
 * tag, its allocating thread and its age. A manager observes from its first
 * tag (um_tag_push, um_alloc_tagged) on, and while a scope is open or a
 * history records (um_history_start). */

#define UM_TAG_NAME_MAX 64 /* bytes of a tag's name, its NUL included */
#define UM_TAGS_MAX 1024   /* distinct tag names of one manager */
#define UM_TAG_DEPTH_MAX 64 /* nested tags of one thread on one manager */

/* From now until the matching um_tag_pop, this thread's allocations, copies,
 * fills and net puts and gets on m count for tag name (the innermost tag of
 * nested ones). name is copied. Returns UM_OK, UM_EINVAL (NULL, not a
 * manager, empty name or one of UM_TAG_NAME_MAX bytes or more), UM_ENOMEM
 * (UM_TAGS_MAX names in use), UM_EOVERFLOW (UM_TAG_DEPTH_MAX tags open). */
UM_EXTERN int um_tag_push(um_manager *m, const char *name);
/* End this thread's innermost tag on m. UM_ESTATE when none is open. */
UM_EXTERN int um_tag_pop(um_manager *m);
/* um_alloc, the buffer counted for tag (NULL: this thread's innermost tag,
 * as um_alloc does), whatever tags are open. Errors as um_alloc's and
 * um_tag_push's. */
UM_EXTERN int um_alloc_tagged(um_manager *m, um_device *d, size_t bytes,
                              um_location loc, unsigned flags,
                              const char *tag, um_buffer **out);
/* The tag b counts for: its name, "" when b was allocated outside any tag
 * or before the manager observed, NULL for what is not a live buffer. The
 * string lives as long as the manager. */
UM_EXTERN const char *um_buffer_tag(const um_buffer *b);

/* What one tag holds and moved (um_tag_stats_get). */
typedef struct um_tag_stats {
  char name[UM_TAG_NAME_MAX]; /* "" for what no tag covers */
  uint64_t active_buffers;    /* live buffers */
  uint64_t bytes_in_use;      /* requested bytes of live buffers */
  uint64_t peak_bytes_in_use; /* highest bytes_in_use seen */
  uint64_t allocations;       /* buffers allocated */
  uint64_t releases;          /* buffers released */
  uint64_t bytes_h2d;         /* copied host to device */
  uint64_t bytes_d2h;         /* copied device to host */
  uint64_t bytes_d2d;         /* copied or filled within one device */
  uint64_t bytes_peer;        /* copied between devices */
  uint64_t bytes_net_out;     /* um_net_put */
  uint64_t bytes_net_in;      /* um_net_get */
} um_tag_stats;

/* Every tag's statistics on device d, or on all devices when d is NULL:
 * the untagged ("") first, then in the order the names were first used.
 * Writes min(cap, count) entries into out (out may be NULL when cap is 0)
 * and returns count, or a UM_E* code (negative): UM_EINVAL for NULL m, a
 * device of another manager, negative cap. Copies count for the device of
 * their destination (a download: its source), puts and gets for their
 * buffer's. Before the first tag, count is 0. */
UM_EXTERN int um_tag_stats_get(um_manager *m, um_device *d, um_tag_stats *out, int cap);

/* What happened inside a scope (um_scope_pop), all devices together. */
typedef struct um_scope_stats {
  uint64_t bytes_in_use_start; /* bytes in use when the scope began */
  uint64_t bytes_in_use_end;   /* and when it ended */
  uint64_t peak_bytes_in_use;  /* the highest in between (nested scopes included) */
  uint64_t allocations;        /* buffers allocated inside */
  uint64_t releases;           /* buffers released inside */
  uint64_t bytes_allocated;    /* requested bytes of the allocations */
} um_scope_stats;

/* Begin a scope of m (all threads), nested in the open one: what is
 * allocated and released from now on is counted for it until um_scope_pop.
 * Returns UM_OK, UM_EINVAL, UM_EOVERFLOW (UM_TAG_DEPTH_MAX scopes open). */
UM_EXTERN int um_scope_push(um_manager *m);
/* End m's innermost scope into *out (may be NULL); its peak counts in the
 * scope around it. UM_ESTATE when none is open. */
UM_EXTERN int um_scope_pop(um_manager *m, um_scope_stats *out);

#define UM_SNAPSHOT_FRAMES 16 /* frames of a block's backtrace, at most */

/* A block's state in a snapshot. */
typedef enum um_block_state {
  UM_BLOCK_IN_USE = 0,   /* a live buffer */
  UM_BLOCK_RELEASED = 1, /* released, its operations still running */
  UM_BLOCK_IDLE = 2,     /* in the pool, waiting for the next allocation */
  UM_BLOCK_FREE = 3      /* a free extent of a segment */
} um_block_state;

/* One block of a snapshot: a buffer's (in use, released, idle) or a free
 * extent of a segment. */
typedef struct um_snapshot_block {
  int device;          /* index */
  um_location loc;     /* the pool's location */
  um_block_state state; /* in use, released, idle or free */
  int segment;         /* index into um_snapshot.segments, -1 for a block of its own */
  uint64_t offset;     /* in its segment (0 without one) */
  uint64_t address;    /* host address where it has one, else the device's
                          (CUDA), else the segment's address plus offset or
                          the backend's handle */
  uint64_t size;       /* bytes requested (idle, free: the capacity) */
  uint64_t capacity;   /* bytes the block spans (in a segment: up to the next block) */
  const char *tag;     /* "" untagged, NULL for idle and free blocks */
  uint32_t thread;     /* allocating thread's number (1, 2, ... in order of
                          their first observed allocation), 0 unknown */
  uint64_t age_ns;     /* since allocated (in use, released) or since idle;
                          0 unknown (allocated before the manager observed) */
  const char *site_file; /* um_alloc_at's site, or NULL */
  int site_line;         /* its line */
  int nframes;           /* entries of frames: the allocation's native
                            backtrace, innermost first, from the caller of
                            unimem on (um_options.backtraces; else 0) */
  void *frames[UM_SNAPSHOT_FRAMES]; /* return addresses */
  int wrapped;         /* 1: um_wrap_host, DLPack import or um_net_alloc memory */
} um_snapshot_block;

/* One segment of a snapshot: device memory its blocks are carved from. */
typedef struct um_snapshot_segment {
  int device;          /* index */
  um_location loc;     /* the pool's location */
  uint64_t address;    /* as a block's */
  uint64_t size;       /* bytes of address space */
  uint64_t committed;  /* bytes backed by memory (virtual segments: the
                          committed granules; plain ones: size) */
  int virtual_memory;  /* 1: pages are committed and given back inside it */
} um_snapshot_segment;

/* Every block and segment of a manager at one moment (um_snapshot_take). */
typedef struct um_snapshot {
  uint64_t time_ns;    /* when it was taken, since the manager was created */
  size_t nblocks;      /* entries of blocks */
  um_snapshot_block *blocks;   /* by device, location, segment, offset */
  size_t nsegments;    /* entries of segments */
  um_snapshot_segment *segments; /* in the pools' order, newest first in each */
} um_snapshot;

/* Every block and segment of every device of m, as they are now. Each
 * segment's blocks and free extents tile it exactly (offsets in order, each
 * block's capacity its whole span, alignment included), even while other
 * threads allocate and release; a block that changes state while the
 * snapshot is taken shows in its state before or after. Free with
 * um_snapshot_free. Returns UM_OK, UM_EINVAL, UM_ENOMEM, UM_ESTATE (a fork
 * child given its parent's manager, as every call of this section). */
UM_EXTERN int um_snapshot_take(um_manager *m, um_snapshot **out);
UM_EXTERN void um_snapshot_free(um_snapshot *s);
/* Write s as JSON to path ("-": stdout): {"time_ns", "segments": [...],
 * "blocks": [...]} with the fields above by name. UM_EINVAL, UM_EBACKEND
 * (the file cannot be written: um_last_error() says why). */
UM_EXTERN int um_snapshot_write(const um_snapshot *s, const char *path);

/* What a history records (um_history_event.kind). */
typedef enum um_history_kind {
  UM_HIST_ALLOC = 0,   /* a buffer went live (how: UM_HIST_POOL, UM_HIST_DEVICE, UM_HIST_CARVE) */
  UM_HIST_RELEASE = 1, /* um_release */
  UM_HIST_TRIM = 2,    /* idle memory went back to the device (bytes) */
  UM_HIST_COPY = 3,    /* a copy, from its issue to its completion */
  UM_HIST_FILL = 4,
  UM_HIST_BRACKET = 5, /* um_access_begin to the end of its bracket */
  UM_HIST_NET_PUT = 6,
  UM_HIST_NET_GET = 7,
  UM_HIST_MAP = 8,     /* um_map */
  UM_HIST_OOM = 9      /* um_alloc answered UM_ENOMEM (bytes: asked) */
} um_history_kind;

#define UM_HIST_POOL 0   /* a hit: an idle block of the pool, no device call */
#define UM_HIST_DEVICE 1 /* a miss that called the device: a new block or segment (or unpooled) */
#define UM_HIST_CARVE 2  /* a miss served from a free extent of a segment the pool holds: no device call
                            (um_stats counts it as a hit) */

/* One recorded event (um_history_get). */
typedef struct um_history_event {
  um_history_kind kind; /* what happened */
  int device;          /* where it counts: an allocation's, a copy's as
                          um_tag_stats counts it */
  int src_device;      /* a copy's source device, -1 for the caller's memory */
  int dst_device;      /* a copy's destination device, -1 for the caller's memory */
  um_location loc;     /* the buffer's location */
  int status;          /* UM_OK, or the operation's failure */
  int how;             /* UM_HIST_POOL, UM_HIST_DEVICE, UM_HIST_CARVE (allocations) */
  uint32_t thread;     /* as um_snapshot_block.thread */
  const char *tag;     /* "" untagged; lives as long as the manager */
  const char *path;    /* a copy's way ("h2d", "d2h", "local", "peer",
                          "pipelined h2d", ...), else NULL */
  uint64_t begin_ns;   /* since the manager's creation: an operation's issue */
  uint64_t end_ns;     /* its completion; an instant's time (= begin_ns) */
  uint64_t bytes;      /* allocated, released, moved, trimmed or asked for */
  uint64_t address;    /* the buffer's, as a snapshot shows it (0: none) */
  uint64_t in_use;     /* allocations, releases: the device's bytes in use after it */
  const char *site_file; /* allocations: um_alloc_at's site, or NULL */
  int site_line;         /* its line */
} um_history_event;

/* Record m's events from now into a ring of capacity events (the oldest
 * are overwritten once it is full; um_history_get says how many). A new
 * start forgets the last recording. Returns UM_OK, UM_EINVAL (capacity 0
 * or more than 2^26), UM_ESTATE (recording already), UM_ENOMEM. */
UM_EXTERN int um_history_start(um_manager *m, size_t capacity);
/* Stop recording; what was recorded stays readable until the next start
 * or the manager's destroy. UM_ESTATE when not recording. */
UM_EXTERN int um_history_stop(um_manager *m);
/* The recorded events, oldest first, into out (min(cap, *count) of them);
 * *count (may be NULL): how many the ring holds, which may be more than
 * cap; *dropped (may be NULL): how many were overwritten. Works while recording. UM_EINVAL for NULL m
 * or NULL out with cap > 0. */
UM_EXTERN int um_history_get(um_manager *m, um_history_event *out, size_t cap,
                             size_t *count, uint64_t *dropped);
/* Write the recording as Chrome trace-event JSON (opens in
 * ui.perfetto.dev and chrome://tracing, and in `unimem view`): a process
 * per device, memory in use as a counter (in all and per tag), copies,
 * fills, brackets and net transfers as slices on a lane per direction,
 * allocations, releases, trims and out-of-memory as instants whose args
 * carry address, size, tag, thread and site. path "-": stdout. UM_EINVAL,
 * UM_ESTATE (nothing was recorded), UM_EBACKEND (cannot write). */
UM_EXTERN int um_history_write(um_manager *m, const char *path);

/* ------------------------------------------------------------------------ */
/* Huge data                                                                 */

/* Map a file as a HOST buffer on device 0 (zero-copy, mmap). mode
 * UM_MAP_READ maps read-only (writes through unimem answer UM_ESTATE);
 * UM_MAP_READ_WRITE / UM_MAP_WRITE map shared, so writes reach the file.
 * Returns UM_EINVAL for an empty file and, at once and without blocking,
 * for anything but a regular file (FIFO, socket, device, directory);
 * UM_ENODEV when it cannot be opened. A file truncated by another process
 * while it is mapped is outside the contract (as for every user of mmap:
 * touching the lost pages raises SIGBUS). */
UM_EXTERN int um_map_file(um_manager *m, const char *path, um_map_mode mode,
                          um_buffer **out);

/* ------------------------------------------------------------------------ */
/* Streaming                                                                 */

/* Called by um_stream once per chunk, in order. chunk is a device buffer of
 * the stream's device whose bytes [0, bytes) hold the source's bytes
 * [offset, offset + bytes); offset counts from the start of the source
 * buffer. The chunk buffer belongs to um_stream: fn may read it, write it
 * and issue operations on it (they are ordered before the next copy into
 * it), but must not release it or use it after returning. Return 0 to go
 * on; any other value stops the stream, and um_stream returns that value. */
typedef int (*um_chunk_fn)(void *user, um_buffer *chunk, size_t offset,
                           size_t bytes);
/* Called after each chunk's um_chunk_fn returned 0: done_bytes of
 * total_bytes are processed. done_bytes grows with each call and the last
 * call has done_bytes == total_bytes. */
typedef void (*um_progress_fn)(void *user, uint64_t done_bytes,
                               uint64_t total_bytes);

/* Process [off, off + bytes) of src (any live buffer, typically a HOST
 * buffer or a file from um_map_file, larger than the device's memory) on
 * device dev, chunk_bytes at a time: two device buffers of
 * min(chunk_bytes, bytes) bytes (UM_DEVICE, from the pool) take turns, and
 * the copy of chunk k+1 runs while fn works on chunk k. The last chunk may
 * be shorter. progress may be NULL; user is passed to both callbacks.
 * Returns when every chunk was processed and every operation on the chunk
 * buffers has finished: UM_OK; UM_EINVAL (NULL src, dev or fn, zero bytes
 * or chunk_bytes, device of another manager); UM_ERANGE (range outside
 * src); UM_ESTATE (src released; src in an access bracket or its
 * operations waiting for one, see Data movement: nothing is issued; a
 * chunk's copy that comes to wait for one, a bracket opened meanwhile, is
 * canceled); UM_ENOMEM / UM_ENOTSUP from allocating
 * the chunk buffers; a copy's failure; or fn's nonzero return. */
UM_EXTERN int um_stream(um_buffer *src, size_t off, size_t bytes,
                        um_device *dev, size_t chunk_bytes, um_chunk_fn fn,
                        um_progress_fn progress, void *user);

/* ------------------------------------------------------------------------ */
/* Interop: the caller's own kernels on unimem memory                       */

/* The native handles of a device. Fields that do not apply are NULL (and
 * cu_device -1). The handles belong to unimem and stay valid until
 * um_manager_destroy: use them, do not release them. */
typedef struct um_device_native {
  char backend[16];  /* "cpu", "opencl", "cuda" */
  void *cl_platform; /* cl_platform_id */
  void *cl_device;   /* cl_device_id */
  void *cl_context;  /* cl_context: unimem's buffers of this device live in it */
  void *cl_queue;    /* an in-order cl_command_queue the caller may use (not
                        the one unimem queues its own copies on; for an
                        adopted device, the caller's own queue) */
  int cu_device;     /* CUdevice ordinal (-1 when not CUDA) */
  void *cu_context;  /* CUcontext (the device's primary context) */
  void *cu_stream;   /* a CUstream the caller may use (not unimem's own) */
} um_device_native;
/* Fill *out with d's native handles. UM_EINVAL (NULL, not a device). */
UM_EXTERN int um_device_native_get(um_device *d, um_device_native *out);

/* The native handles of a buffer's memory; NULL / 0 where they do not
 * apply. Valid while the buffer is live (um_buffer_retain keeps it so). */
typedef struct um_buffer_native {
  void *host;      /* host view, or NULL */
  void *cl_mem;    /* cl_mem holding the buffer (OpenCL DEVICE, PINNED) */
  void *svm;       /* SVM pointer (OpenCL UNIFIED) */
  uint64_t cu_ptr; /* CUdeviceptr (CUDA DEVICE, UNIFIED, PINNED) */
  size_t offset;   /* byte offset of the buffer inside cl_mem / cu_ptr */
} um_buffer_native;
/* Fill *out with b's native handles. UM_EINVAL, UM_ESTATE (released). */
UM_EXTERN int um_buffer_native_get(um_buffer *b, um_buffer_native *out);

/* Bracket the caller's own device work on b (kernels, native copies);
 * several buffers in one call: um_access_begin_n, below.
 *
 * um_access_begin never blocks: *wait_native receives the native event
 * (cl_event on OpenCL, CUevent on CUDA) that the caller's first command on
 * b must wait for (in its wait list; cuStreamWaitEvent), or NULL when
 * nothing issued on b is pending. It belongs to unimem and stays valid
 * until um_access_end. On the cpu device, which has no native events, it
 * is a um_event * instead (wait with um_event_wait; do not release it).
 * Until um_access_end, unimem issues nothing that would race with the
 * caller on b: operations issued on b meanwhile wait for the bracket; um_map
 * of b answers UM_ESTATE, and so does a blocking call on b (a copy, fill or
 * batch without an event: it would wait for um_access_end, which the
 * caller has yet to call). Issue those with an event instead. The same
 * holds for every buffer whose operations wait for the bracket through
 * others (Data movement), and um_device_synchronize of b's device answers
 * UM_ESTATE (um_event_wait does wait: see there).
 *
 * um_access_end takes the native event of the caller's last command on b
 * (NULL when the caller has waited for its commands, or queued them on the
 * thread's queue of um_queue_use, behind which the bracket then ends;
 * always NULL on the cpu device). Later operations on b, and um_map, are ordered after it, without
 * blocking the host. A writing mode (anything but UM_MAP_READ) makes the
 * device copy the current one. An OpenCL event is retained as long as
 * unimem needs it. A CUevent is not reference-counted: it must have been
 * recorded before the call and stay alive during it; unimem captures the
 * work it stands for (cuStreamWaitEvent) before returning, so the caller
 * may destroy or record it again as soon as um_access_end returns. An
 * event of another CUDA device or context is accepted (CUDA waits across
 * devices).
 *
 * Releasing b inside an open bracket ends it: its block returns to the pool
 * only after the commands the caller queued on the device's caller queue
 * (um_device_native's cl_queue / cu_stream) so far; work on other queues
 * must be ended with um_access_end first.
 *
 * Codes: UM_EINVAL (NULL, unknown mode; a done_native that is not an
 * event: on OpenCL, anything clGetEventInfo does not describe as a
 * command's event (a cl_mem, a queue, a context), or an event of another
 * context; on CUDA, a handle the driver does not know as a live CUevent;
 * anything but NULL on the cpu device), UM_ESTATE (released, a bracket already open on b, no bracket
 * open, a read-only wrap in a writing mode, b mapped). */
UM_EXTERN int um_access_begin(um_buffer *b, um_map_mode mode, void **wait_native);
UM_EXTERN int um_access_end(um_buffer *b, void *done_native);

/* Work on the caller's queue (stream-ordered, as RMM and cudaMallocAsync
 * are). From this call on, this thread's copies, fills, batches' copies
 * and access brackets of buffers of d that run on d's queue go to
 * native_queue instead of unimem's own: an in-order cl_command_queue of
 * d's context and device (the cl_queue of um_device_native_get, or one of
 * the caller's), or a CUstream of d's context (the cu_stream there, or the
 * caller's). An upload, the caller's kernel and a download on that queue
 * then need no event between them: um_access_begin hands out NULL as the
 * wait when what was issued on the buffer before is queued there already,
 * um_access_end with a NULL event ends the bracket behind the commands the
 * caller queued there so far, and a download queued behind them waits for
 * nothing else. Per-buffer ordering still holds across queues and threads
 * (an operation on another queue waits for the buffer's earlier ones, as
 * always).
 *
 * On OpenCL such an end queues no command at all: the queue's next command
 * carries it (unimem's own next command there, or a marker queued when
 * something waits for the bracket: another queue's operation, a wait, a
 * poll, a map, a release, um_device_synchronize). The caller need not flush
 * the queue for it. When what was issued on the buffer before is bound for
 * the thread's queue but not queued there yet (it follows work on other
 * queues or host threads), um_access_begin waits for it on the host rather
 * than hand out an event the queue would hold ahead of it forever.
 *
 * The setting is the calling thread's own, one queue per device; NULL goes
 * back to unimem's queues (so CUDA's legacy NULL stream cannot be chosen). Host copies (memcpy between host views) and
 * pipelined staging still run on host threads. An OpenCL queue is retained
 * until um_manager_destroy; a CUstream, which has no reference count, must
 * stay alive while a thread uses it and until the operations unimem queued
 * on it have finished. At most 4 queues of the caller's per device (the
 * same queue again counts once), and a thread sets queues on at most 8
 * devices at once (a device set back to NULL makes room, and so do the
 * devices of a manager the thread destroys; a thread that destroys a
 * manager whose devices another thread still has set should have that
 * thread set them to NULL first). Work the caller
 * queues there that never completes (a user event never set) holds up
 * unimem's work behind it, as any command of that queue. Returns UM_OK,
 * UM_EINVAL (not a device; not a queue of d's context and device),
 * UM_ENOTSUP (the cpu device, which has no queues; an out-of-order
 * queue), UM_ENOMEM (too many queues). */
UM_EXTERN int um_queue_use(um_device *d, void *native_queue);

/* Brackets over several buffers in one call: the caller's command that
 * touches all of them (a kernel reading two buffers and writing a third)
 * waits for one handle and ends all of them with one event.
 *
 * um_access_begin_n opens a bracket on each buffer of bufs[0..n) in the
 * mode modes[i], as um_access_begin does for one, all or none:
 *  - The same buffer may be listed more than once: it gets one bracket, in
 *    the strongest of its modes (UM_MAP_READ with any writing mode, or
 *    UM_MAP_READ_WRITE with any mode: UM_MAP_READ_WRITE; UM_MAP_WRITE with
 *    UM_MAP_WRITE_DISCARD: UM_MAP_WRITE; equal modes stay as they are).
 *  - *wait_native receives one handle for every buffer of the list: NULL
 *    when nothing issued on any of them is pending; the one buffer's own
 *    handle (what um_access_begin would give) when only one of them has
 *    something pending; otherwise one native event (cl_event / CUevent)
 *    that completes once what was issued on each of them before has. On a
 *    device without native events (the cpu device) it is a um_event * that
 *    completes once they all have (wait with um_event_wait; do not release
 *    it). It belongs to unimem and stays valid until the last of the
 *    brackets ends (um_access_end_n, um_access_end of each, or their
 *    releases).
 *  - The entries are checked in order, and the first that fails gives the
 *    code, with nothing opened: UM_EINVAL (NULL bufs, modes or
 *    wait_native, n == 0, a NULL entry or one that is not a buffer, an
 *    unknown mode, a buffer of another device than bufs[0]'s), UM_ESTATE
 *    (released; a bracket already open on it, or being opened by another
 *    thread; mapped; a read-only wrap in a writing mode). A buffer of the
 *    list released by another thread while the call opens the brackets
 *    makes it fail with UM_ESTATE; a failure after the checks (UM_ENOMEM,
 *    the backend's) also fails the call: the brackets already opened then
 *    end as a release would end them (behind what the caller queued on the
 *    device's caller queue), and none is left open.
 *  - um_access_begin is the list of one buffer (with its own order of
 *    checks: a NULL wait_native is found after b's own checks).
 *
 * um_access_end_n ends the brackets of bufs[0..n), each once however many
 * times its buffer is listed, after done_native (as um_access_end: the
 * caller's last command on them, or NULL when the caller has waited for
 * its commands; NULL on the cpu device). done_native is adopted once per
 * buffer whose bracket ends (an OpenCL event is retained for each; a
 * CUevent is captured for each before the call returns). A buffer of the
 * list that was released, its release having ended its bracket (see
 * um_access_begin), is skipped: its bracket ended at the release, behind
 * the caller's queue, and done_native does not apply to it; the others
 * end, and the call answers UM_OK. A released handle that was handed to a
 * new allocation meanwhile is that new buffer, and counts as one without
 * a bracket. Everything is checked before anything ends: UM_EINVAL (NULL
 * bufs, n == 0, an entry that is not a buffer, a done_native that is not
 * an event, as for um_access_end), UM_ESTATE (a live buffer of the list
 * with no bracket open, e.g. ended already; every buffer of the list
 * released), with no bracket ended. um_access_end(b, done) is
 * um_access_end_n(&b, 1, done). */
UM_EXTERN int um_access_begin_n(um_buffer *const *bufs, const um_map_mode *modes, size_t n, void **wait_native);
UM_EXTERN int um_access_end_n(um_buffer *const *bufs, size_t n, void *done_native);

/* Release b once the caller's native event has completed: for memory that
 * the caller's other queues or out-of-order work may still use when it
 * gives the buffer back (PyTorch's record_stream, RMM's stream-ordered
 * free). The handle is released now, exactly as by um_release (invalid
 * afterwards; with owners beyond the first, um_buffer_retain, one owner
 * goes); the block returns to the pool only once native_event has
 * completed, after what was issued on b before, with no host wait: a new
 * allocation meanwhile gets another block. native_event is an OpenCL
 * cl_event of b's device's context (retained as long as unimem needs it)
 * or a CUevent recorded before the call (captured before the call returns,
 * as by um_access_end; the caller may destroy or record it again at once).
 * A bracket open on b ends behind the event (not behind the caller's
 * queue, as a plain release would end it). NULL: um_release(b).
 *
 * A wrap (um_wrap_host, um_dlpack_import, um_net_alloc) is released as
 * um_release releases one: the call returns only once the operations
 * issued on it, and so native_event, have completed, so that the caller
 * may free the memory then (an event that never completes blocks it for
 * good); when that wait would pass through another buffer's open bracket
 * it is refused with UM_ESTATE, nothing changed.
 *
 * Codes: um_release's, and UM_EINVAL (native_event is not an event of b's
 * device, as for um_access_end's done_native; any native_event on a device
 * without native events, the cpu device), UM_ESTATE (b mapped, or a
 * bracket being opened on it by another thread), each with nothing
 * changed: b stays live. */
UM_EXTERN int um_release_after(um_buffer *b, void *native_event);

/* Add the caller's own OpenCL context, device and queue to m as one more
 * device: unimem allocates in that context and orders its copies with the
 * caller's commands through events. Pool, copies, peer copies with the
 * other devices of that context, statistics and the leak report work as on
 * a discovered device. The context and queue are retained (and released at
 * um_manager_destroy); unimem queues its own copies on a queue of its own
 * in that context. Returns UM_EINVAL (NULL, a device not in the context, a
 * queue of another context or device), UM_ENOTSUP (OpenCL unavailable),
 * UM_ENOMEM (too many devices). */
UM_EXTERN int um_device_adopt_opencl(um_manager *m, void *cl_context, void *cl_device,
                                     void *cl_queue, um_device **out);

/* One more owner of b: each um_buffer_retain needs one more um_release
 * before b is released. UM_EINVAL, UM_ESTATE (released). */
UM_EXTERN int um_buffer_retain(um_buffer *b);

/* The native event (cl_event / CUevent) of an operation that runs on a
 * device queue; not retained for the caller (valid until um_event_release).
 * UM_ENOTSUP when it runs on host threads, UM_EAGAIN when it waits for an
 * earlier operation and has not been queued yet, UM_EINVAL, UM_ESTATE. */
UM_EXTERN int um_event_native(um_event *e, void **native);

/* ------------------------------------------------------------------------ */
/* DLPack: unimem memory to and from NumPy, PyTorch, CuPy, JAX...           */
/* The tensors' layout is in unimem_dlpack.h (or any dlpack.h, v0.6 on for  */
/* the legacy tensor, v1.x for the versioned one).                          */

/* Flags of um_dlpack_export / um_dlpack_import. */
enum {
  UM_DLPACK_VERSIONED = 1u << 0, /* a DLManagedTensorVersioned (v1.x); else the
                                    legacy DLManagedTensor */
  UM_DLPACK_READONLY = 1u << 1,  /* export: the tensor says read-only (versioned
                                    only); import: the buffer is a read-only wrap */
  UM_DLPACK_COPIED = 1u << 2     /* export: the tensor says its data is a copy
                                    made for the consumer (versioned only;
                                    unimem itself never copies) */
};

/* Where b's memory is, as DLPack names it (UM_DL_* device type, ordinal):
 * HOST memory on any device, and every buffer of the cpu device -> CPU 0;
 * CUDA: DEVICE -> CUDA, PINNED -> CUDA_HOST, UNIFIED -> CUDA_MANAGED (the
 * CUDA ordinal); OpenCL: DEVICE -> OPENCL (the ordinal among the manager's
 * OpenCL devices), PINNED and UNIFIED (fine-grained SVM) -> CPU 0, being
 * host memory. UM_EINVAL, UM_ESTATE (released), UM_ENOTSUP (a device whose
 * backend gives no native handle for it). */
UM_EXTERN int um_dlpack_device(um_buffer *b, int32_t *device_type, int32_t *device_id);

/* Export [offset, ...) of b as a DLPack tensor, zero-copy: *out is a
 * DLManagedTensorVersioned * (UM_DLPACK_VERSIONED) or a DLManagedTensor *.
 * ndim dimensions of shape (ndim <= 64; shape may be NULL when ndim is 0);
 * strides in elements, NULL for C-contiguous, none negative; elements of
 * dtype_bits * dtype_lanes bits, a whole number of bytes. The data pointer
 * is b's host view + offset for host memory, the CUdeviceptr + offset on
 * CUDA (byte_offset 0), and the cl_mem with byte_offset = b's offset in it
 * + offset on OpenCL. Returns once the operations issued on b before have
 * finished (the consumer reads current data).
 *
 * The tensor holds one reference to b (um_buffer_retain) until its deleter
 * runs: b stays live after the caller's um_release until then. Call the
 * deleter before um_manager_destroy; one never called shows in the leak
 * report (the buffer, "held by N DLPack tensor(s) never deleted"), and
 * destroy frees the buffer's memory, not the tensor's own small block.
 *
 * Codes: UM_EINVAL (NULL, unknown flags, READONLY or COPIED without
 * VERSIONED, ndim < 0 or > 64, a negative dimension or stride, an element
 * size of zero or not a whole number of bytes), UM_ERANGE (offset or the
 * elements past the end of b), UM_EOVERFLOW (the extent overflows),
 * UM_ESTATE (released; mapped; in an access bracket, or its operations
 * wait for one, see Data movement; a read-only wrap as a legacy tensor,
 * which cannot say read-only — versioned tensors of one carry READ_ONLY),
 * UM_ENOTSUP (see um_dlpack_device), UM_ENOMEM. */
UM_EXTERN int um_dlpack_export(um_buffer *b, size_t offset, int ndim, const int64_t *shape,
                               const int64_t *strides, uint8_t dtype_code, uint8_t dtype_bits,
                               uint16_t dtype_lanes, unsigned flags, void **out);

/* Wrap a DLPack tensor (a DLManagedTensorVersioned * with
 * UM_DLPACK_VERSIONED, else a DLManagedTensor *) as a buffer of m over the
 * same memory, without copying: size = elements * element bytes. CPU,
 * CUDA_HOST -> a HOST wrap on device 0; CUDA -> DEVICE, CUDA_MANAGED ->
 * UNIFIED on the CUDA device of that ordinal; OPENCL -> DEVICE on the
 * OpenCL device of that ordinal (data: a cl_mem of its context). A
 * versioned tensor flagged READ_ONLY, or UM_DLPACK_READONLY, makes a
 * read-only wrap. On success the buffer owns the tensor: its deleter runs
 * exactly once, when the buffer is released and its operations have
 * finished (at um_manager_destroy for one never released). On failure the
 * tensor is untouched and still the caller's.
 *
 * Codes: UM_EINVAL (NULL m, tensor or out; unknown flags; NULL data or
 * shape; ndim < 0; a negative dimension; no elements; an element of zero
 * bits; a cl_mem of another context), UM_ENOTSUP (a device type unimem
 * does not serve; strides that are not C-contiguous; elements that are not
 * a whole number of bytes; a versioned tensor of another major version; an
 * OpenCL byte_offset the device cannot start a sub-buffer at), UM_ENODEV
 * (no device of that type and ordinal in m), UM_EOVERFLOW (the size
 * overflows), UM_ERANGE (byte_offset + size past the end of the cl_mem),
 * UM_ENOMEM. */
UM_EXTERN int um_dlpack_import(um_manager *m, void *tensor, unsigned flags, um_buffer **out);

/* ------------------------------------------------------------------------ */
/* Across processes and nodes (UCX)                                          */

/* One-sided put and get between buffers of different processes, over UCX
 * (libucp.so.0, loaded at run time: unimem does not link against it).
 *
 * A process creates a um_net on its manager, hands its address blob to its
 * peers, and connects to theirs (exchanging the blobs is the application's
 * job: a socket, MPI, a file). To let peers reach a buffer it exposes it
 * and hands them the key blob; a peer then puts into or gets from any
 * range of the exposed buffer with no call on the exposing side: a
 * progress thread serves the peers, sleeping while there is nothing to do.
 *
 * Blobs are capabilities. Whoever holds a buffer's key blob can read and
 * write the exposed range until it is unexposed: hand it only to peers
 * trusted with that memory. The blob's header (magic, version, length,
 * checksum) catches damage in transit (UM_EINVAL), not forgery. A key blob
 * names the um_net that exposed it, an address blob the um_net it reaches:
 * a key is used only through an endpoint to the net that made it.
 *
 * Ranges are checked on the issuing side against the exposed size carried
 * in the blob (UM_ERANGE). Unexposing is a revocation that the target
 * enforces: once um_net_unexpose (or um_release of the buffer) returns, no
 * later put or get from any peer touches the memory; they fail with
 * UM_ESTATE. unimem enforces it with an admission count and a generation
 * per exposure, because UCX's own deregistration does not stop a peer on
 * its shared-memory and tcp transports. A put or get in flight when the
 * revocation starts stops at its next 16 MiB step and fails with
 * UM_ESTATE (what it moved may have landed in part); the revocation waits
 * for it at most net_timeout_ms. When it gives up (a peer stopped or died
 * mid-transfer: UM_EBUSY), that transfer may still write the memory until
 * it ends, and its issuer is told it failed: unimem then never gives a
 * released buffer's memory back (to the pool, the device, a DLPack
 * producer, or UCX for um_net_alloc) before the transfer is through; if
 * it never ends, or the um_net is destroyed first, the memory is kept
 * until the process exits (a warning in the log says how much; memory of
 * um_net_alloc goes back to UCX once the net's worker is gone, when no
 * active message can write it any more).
 *
 * Failures: a peer that dies fails the operations in flight to it with
 * UM_EBACKEND and UCX's own message; nothing waits longer than
 * um_options.net_timeout_ms (UNIMEM_NET_TIMEOUT_MS) without progress: an
 * operation that stalls that long fails with UM_EBACKEND, and its endpoint
 * can no longer be used. Where UCX's transports detect peer failure (tcp)
 * it is reported at once; over shared memory (posix, sysv) the timeout
 * finds it. One exception is UCX's own: over tcp, UCX 1.13 can abort the
 * process that a writer was putting into when that writer is killed
 * mid-put (docs/guide.md, "A peer that dies mid-transfer"). UCX's environment (UCX_TLS, UCX_NET_DEVICES, ...) selects the
 * transports.
 *
 * fork(): in a child process, every um_net_* and um_endpoint_* call given a
 * net, endpoint or buffer of the parent's answers UM_ESTATE and touches
 * nothing (the parent's net keeps working). UCX does not survive fork(): a
 * child of a process that had loaded it (any um_net_create before the
 * fork) cannot open a net of its own either (UM_ENOTSUP); fork peers
 * before the first um_net_create. */
typedef struct um_net um_net;
typedef struct um_endpoint um_endpoint;

/* Open the network for manager m: a UCX context and worker, and a progress
 * thread. One um_net per manager at a time. Returns UM_EINVAL (NULL),
 * UM_ESTATE (m has a um_net already, or m is a parent's manager in a child
 * process), UM_ENOTSUP (UCX is not installed, this build has no UCX
 * support, or UCX was loaded before fork() in an ancestor process:
 * um_last_error() says which; the UNIMEM_UCX_LIBRARY environment variable
 * names another libucp),
 * UM_ENOMEM, UM_EBACKEND. The caller owns *out until um_net_destroy. */
UM_EXTERN int um_net_create(um_manager *m, um_net **out);

/* This process's address blob, for peers' um_net_connect. *len in/out:
 * the capacity of blob, then the blob's length. UM_ERANGE when the
 * capacity is too small, with *len set to the length needed (blob may be
 * NULL when *len is 0). Returns UM_EINVAL (NULL n or len), UM_ESTATE (n was
 * destroyed). */
UM_EXTERN int um_net_address(um_net *n, void *blob, size_t *len);

/* An endpoint to the peer whose address blob is addr[0..len). Returns
 * UM_EINVAL (NULL, or a blob that is not an intact address blob),
 * UM_ESTATE (n was destroyed), UM_ENOMEM, UM_EBACKEND. The caller owns
 * *out until um_endpoint_close (or um_net_destroy). */
UM_EXTERN int um_net_connect(um_net *n, const void *addr, size_t len,
                             um_endpoint **out);

/* Expose buffer b to peers: writes the key blob that a peer passes to
 * um_net_put / um_net_get. The range is the whole buffer (um_buffer_size
 * bytes); a read-only buffer (read-only wrap or file) takes gets only.
 * Exposing an exposed buffer gives the same blob again. b must have a host
 * view (any buffer of the cpu device, HOST, PINNED or UNIFIED): an OpenCL
 * or CUDA DEVICE buffer answers UM_ENOTSUP, because the exposing side is
 * passive and nothing there would move a peer's bytes between the network
 * and device memory (docs/design.md says why active messages were not
 * used): expose a PINNED buffer of its device and um_copy between the two.
 * (As the local side of um_net_put / um_net_get a DEVICE buffer works.) *len in/out as for um_net_address
 * (UM_ERANGE leaves b unexposed). Returns UM_EINVAL (NULL), UM_ESTATE (b
 * released, or its manager has no um_net), UM_ENOTSUP, UM_ENOMEM (also:
 * 4096 buffers are exposed already), UM_EBACKEND. The exposure lasts until
 * um_net_unexpose, um_release of b or um_net_destroy. */
UM_EXTERN int um_net_expose(um_buffer *b, void *blob, size_t *len);

/* A HOST buffer of bytes bytes on the manager's host device (device 0)
 * whose memory UCX allocated and mapped for n (ucp_mem_map with
 * UCP_MEM_MAP_ALLOCATE). On shared-memory transports (UCX_TLS=posix or
 * sysv) a peer maps such memory and moves bytes into and out of it with
 * plain loads and stores, while a buffer of um_alloc is reached through
 * UCX's software RMA: allocate the buffers that peers put into or get from
 * with this call. On other transports it is ordinary host memory.
 *
 * Otherwise *out is a buffer like any other of device 0: copies, um_map,
 * um_buffer_host_ptr, statistics (counted like a um_wrap_host: an
 * allocation and bytes_in_use, no bytes_reserved) and the leak report. It
 * is not pooled: um_release gives the memory back to UCX (ucp_mem_unmap)
 * once the buffer's operations finished. um_net_expose of it uses the
 * mapping UCX made at allocation (no second registration).
 *
 * Lifetime: the memory belongs to n's UCX context, so um_net_destroy(n)
 * answers UM_EBUSY, destroying nothing, while a buffer of um_net_alloc of
 * n is live: release them first. um_manager_destroy releases those still
 * live as leaks (reported, UM_ELEAK) before it destroys the net.
 *
 * flags: UM_ALLOC_ZERO (zero-filled); UM_ALLOC_UNPOOLED is accepted and
 * changes nothing. Returns UM_OK; UM_EINVAL (n not a live handle of a net,
 * NULL out, zero bytes, unknown flags); UM_ESTATE (n was destroyed);
 * UM_ENOMEM (also, before UCX is asked, for more bytes than the host's
 * physical memory); UM_EBACKEND (UCX could not allocate; um_last_error() has its
 * text). Over UCX's posix transport the memory is a file in /dev/shm that
 * the kernel fills as it is touched: a size below physical memory but above
 * what /dev/shm can hold is accepted and fails later, on touch, with
 * SIGBUS, as for any shared-memory user (`df /dev/shm` says the room). */
UM_EXTERN int um_net_alloc(um_net *n, size_t bytes, unsigned flags, um_buffer **out);

/* Revoke b's exposure: when this returns, no put or get from any peer
 * reads or writes b any more (later ones fail with UM_ESTATE), and the ones
 * already admitted have finished. Returns UM_OK; UM_EINVAL (NULL);
 * UM_ESTATE (b released or not exposed); UM_EBUSY when transfers admitted
 * before did not finish within net_timeout_ms (a peer stopped or died
 * mid-transfer): b is unexposed all the same, but those transfers may
 * still write b until they end (their issuers are told they failed); b's
 * memory is not reused before they do, even after um_release (see above). */
UM_EXTERN int um_net_unexpose(um_buffer *b);

/* Write bytes of src from src_off into the remote buffer of key blob
 * rkey[0..rkey_len) at dst_off, through ep. Ordered after the operations
 * issued earlier on src (a um_copy_from_host into src before the put is
 * what the put sends). done as for the copies: NULL blocks and returns the
 * status; otherwise *done receives an event. Complete means the bytes are
 * in the remote memory. src may be any live buffer of ep's manager: one
 * without a host view is sent through pinned host chunks. Returns UM_EINVAL
 * (NULL, zero bytes, buffer of another manager, rkey not an intact key
 * blob, or a key that another peer than ep's exposed: refused before
 * anything is sent), UM_ERANGE (src range outside src, or remote range outside the
 * exposed size), UM_ESTATE (src released or mapped, ep closed, remote
 * buffer read-only, or no longer exposed: unexposed before the put was
 * admitted, nothing written, or while it moved, the bytes landed in part
 * or not at all), UM_EBACKEND (peer failure or
 * net_timeout_ms without progress; um_last_error() has UCX's text after a
 * blocking call), UM_ENOMEM. */
UM_EXTERN int um_net_put(um_endpoint *ep, um_buffer *src, size_t src_off,
                         const void *rkey, size_t rkey_len, size_t dst_off,
                         size_t bytes, um_event **done);

/* Read bytes of the remote buffer of key blob rkey[0..rkey_len) from
 * src_off into dst at dst_off, through ep. As um_net_put, mirrored: ordered
 * after the operations issued earlier on dst; UM_ESTATE also for a
 * read-only dst. */
UM_EXTERN int um_net_get(um_endpoint *ep, um_buffer *dst, size_t dst_off,
                         const void *rkey, size_t rkey_len, size_t src_off,
                         size_t bytes, um_event **done);

/* Close ep: operations in flight on it finish first (or fail after
 * net_timeout_ms without progress); operations issued on it that have not
 * started yet fail with UM_ESTATE when they start. Returns UM_OK,
 * UM_EINVAL (not an endpoint), UM_ESTATE (already closed). */
UM_EXTERN int um_endpoint_close(um_endpoint *ep);

/* Close n: every endpoint still open is closed and every buffer still
 * exposed is unexposed, each reported through the log (a warning); then
 * the worker and the progress thread go. Operations not yet started fail
 * with UM_ESTATE. Handles of n and its endpoints answer UM_ESTATE
 * afterwards, until the manager is destroyed. um_manager_destroy destroys a
 * um_net the application did not. Buffers stay valid: an exposed buffer is
 * only unexposed; but a buffer of um_net_alloc lives in n's UCX context,
 * so while one is live nothing is closed and the call answers UM_EBUSY
 * (um_last_error() says how many). Returns UM_OK, UM_EINVAL (not a net),
 * UM_ESTATE (already destroyed), UM_EBUSY. */
UM_EXTERN int um_net_destroy(um_net *n);

#ifdef UNIMEM_TRACK_SITES
#define um_alloc(m, d, bytes, loc, flags, out)                                 \
  um_alloc_at((m), (d), (bytes), (loc), (flags), (out), __FILE__, __LINE__)
#define um_alloc_array(m, d, count, size, loc, flags, out)                     \
  um_alloc_array_at((m), (d), (count), (size), (loc), (flags), (out),          \
                    __FILE__, __LINE__)
#endif

#ifdef __cplusplus
}
#endif
#endif /* UNIMEM_H */
