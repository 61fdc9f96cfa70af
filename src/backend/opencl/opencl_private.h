/* What the files of backend/opencl/ share: the loaded entry points, the state, and
 * the functions one file defines for the others. */

/* The OpenCL backend: every device of every OpenCL platform.
 *
 * The vendor library (normally the ICD loader, libOpenCL.so.1) is loaded at
 * run time, once per process (base/vendor_lib.c), so that unimem neither
 * links against OpenCL nor needs it installed to run. <CL/cl.h> is included for its types and
 * constants only; every call goes through the `um__ocl` table of entry points.
 *
 * Layout of the state:
 * - one cl_context per platform, holding all of that platform's devices, so
 *   that buffers of one device can be copied to another of the same platform
 *   with clEnqueueCopyBuffer (this backend's "peer access"); only the
 *   platforms UNIMEM_OPENCL_PLATFORM names, where it is set;
 * - one in-order command queue per device (OpenCL queues may be used from
 *   several threads at once), so every operation issued on a device runs in
 *   issue order even without after[] tokens; and a second one for the
 *   caller's own commands (um_device_native_get), so that a caller's kernel
 *   waiting for a gate never holds up unimem's copies;
 * - adopted devices (um_device_adopt_opencl): the caller's context and
 *   queue, retained; the caller's queue is the caller queue, and unimem
 *   makes its own in that context;
 * - no count of the bytes held: the core keeps it (um_device's
 *   limited_bytes), for device_limit_bytes and because OpenCL has no
 *   standard free-memory query.
 *
 * Blocks by location:
 * - UM_DEVICE:  clCreateBuffer(CL_MEM_READ_WRITE); host = NULL;
 *               handle = the cl_mem.
 * - UM_PINNED:  clCreateBuffer(CL_MEM_ALLOC_HOST_PTR), mapped for its whole
 *               life; host = the mapped pointer; handle = the cl_mem.
 * - UM_UNIFIED: clSVMAlloc with fine-grained buffer SVM, where the device has
 *               it; host = handle = the SVM pointer.
 * The core reaches PINNED and UNIFIED blocks through their host pointer, so
 * transfers and map() only ever see DEVICE blocks.
 */
#ifndef UM_BACKEND_OPENCL_PRIVATE_H
#define UM_BACKEND_OPENCL_PRIVATE_H

#define CL_TARGET_OPENCL_VERSION 300

#include <CL/cl.h>
#include <stddef.h>
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "atomic.h"
#include "testhook.h"

/* cl_khr_icd's "no platform installed" answer, from cl_ext.h. */
#ifndef CL_PLATFORM_NOT_FOUND_KHR
#define CL_PLATFORM_NOT_FOUND_KHR -1001
#endif

#define OCL_DEFAULT_LIBRARY "libOpenCL.so.1"
#define OCL_LIBRARY_ENV "UNIMEM_OPENCL_LIBRARY"
/* Only platforms whose CL_PLATFORM_NAME contains this text are opened. */
#define OCL_PLATFORM_ENV "UNIMEM_OPENCL_PLATFORM"
/* um__ocl_settle(): how long after a spinning wait saw a command end a blocking
 * call on a CPU device leaves the driver's threads before it submits. */
#define OCL_SETTLE_NS 5000u

/* ------------------------------------------------------------------------ */
/* Entry points                                                              */

typedef void(CL_CALLBACK *ocl_event_notify_fn)(cl_event event,
                                               cl_int event_command_status,
                                               void *user_data);

/* XX(return type, name, parameter list). Without these the backend cannot
 * work at all: their absence makes open() answer UM_ENODEV. Everything here
 * is OpenCL 1.2 or older. */
#define OCL_REQUIRED_ENTRY_POINTS(XX)                                          \
  XX(cl_int, clGetPlatformIDs, (cl_uint, cl_platform_id *, cl_uint *))         \
  XX(cl_int, clGetPlatformInfo,                                                \
     (cl_platform_id, cl_platform_info, size_t, void *, size_t *))             \
  XX(cl_int, clGetDeviceIDs,                                                   \
     (cl_platform_id, cl_device_type, cl_uint, cl_device_id *, cl_uint *))     \
  XX(cl_int, clGetDeviceInfo,                                                  \
     (cl_device_id, cl_device_info, size_t, void *, size_t *))                 \
  XX(cl_context, clCreateContext,                                              \
     (const cl_context_properties *, cl_uint, const cl_device_id *,            \
      void(CL_CALLBACK *)(const char *, const void *, size_t, void *),         \
      void *, cl_int *))                                                       \
  XX(cl_int, clReleaseContext, (cl_context))                                   \
  XX(cl_int, clReleaseCommandQueue, (cl_command_queue))                        \
  XX(cl_mem, clCreateBuffer,                                                   \
     (cl_context, cl_mem_flags, size_t, void *, cl_int *))                     \
  XX(cl_int, clReleaseMemObject, (cl_mem))                                     \
  XX(cl_int, clEnqueueReadBuffer,                                              \
     (cl_command_queue, cl_mem, cl_bool, size_t, size_t, void *, cl_uint,      \
      const cl_event *, cl_event *))                                           \
  XX(cl_int, clEnqueueWriteBuffer,                                             \
     (cl_command_queue, cl_mem, cl_bool, size_t, size_t, const void *,         \
      cl_uint, const cl_event *, cl_event *))                                  \
  XX(cl_int, clEnqueueCopyBuffer,                                              \
     (cl_command_queue, cl_mem, cl_mem, size_t, size_t, size_t, cl_uint,       \
      const cl_event *, cl_event *))                                           \
  XX(cl_int, clEnqueueFillBuffer,                                              \
     (cl_command_queue, cl_mem, const void *, size_t, size_t, size_t,          \
      cl_uint, const cl_event *, cl_event *))                                  \
  XX(void *, clEnqueueMapBuffer,                                               \
     (cl_command_queue, cl_mem, cl_bool, cl_map_flags, size_t, size_t,         \
      cl_uint, const cl_event *, cl_event *, cl_int *))                        \
  XX(cl_int, clEnqueueUnmapMemObject,                                          \
     (cl_command_queue, cl_mem, void *, cl_uint, const cl_event *,             \
      cl_event *))                                                             \
  XX(cl_int, clEnqueueMigrateMemObjects,                                       \
     (cl_command_queue, cl_uint, const cl_mem *, cl_mem_migration_flags,       \
      cl_uint, const cl_event *, cl_event *))                                  \
  XX(cl_int, clFlush, (cl_command_queue))                                      \
  XX(cl_int, clFinish, (cl_command_queue))                                     \
  XX(cl_int, clWaitForEvents, (cl_uint, const cl_event *))                     \
  XX(cl_int, clGetEventInfo,                                                   \
     (cl_event, cl_event_info, size_t, void *, size_t *))                      \
  XX(cl_int, clRetainEvent, (cl_event))                                        \
  XX(cl_int, clReleaseEvent, (cl_event))                                       \
  XX(cl_int, clSetEventCallback,                                               \
     (cl_event, cl_int, ocl_event_notify_fn, void *))                          \
  XX(cl_int, clEnqueueMarkerWithWaitList,                                      \
     (cl_command_queue, cl_uint, const cl_event *, cl_event *))                \
  XX(cl_event, clCreateUserEvent, (cl_context, cl_int *))                      \
  XX(cl_int, clSetUserEventStatus, (cl_event, cl_int))                         \
  XX(cl_int, clRetainContext, (cl_context))                                    \
  XX(cl_int, clRetainCommandQueue, (cl_command_queue))                         \
  XX(cl_int, clGetContextInfo,                                                 \
     (cl_context, cl_context_info, size_t, void *, size_t *))                  \
  XX(cl_int, clGetCommandQueueInfo,                                            \
     (cl_command_queue, cl_command_queue_info, size_t, void *, size_t *))

/* Entry points that may be missing. Queue creation needs one of the two
 * (the 2.0 call is preferred, the 1.x one is what 1.2 drivers have); the SVM
 * pair only gates UM_UNIFIED; the memory-object pair, imports of the
 * caller's cl_mem (DLPack). */
#define OCL_OPTIONAL_ENTRY_POINTS(XX)                                          \
  XX(cl_command_queue, clCreateCommandQueueWithProperties,                     \
     (cl_context, cl_device_id, const cl_queue_properties *, cl_int *))        \
  XX(cl_command_queue, clCreateCommandQueue,                                   \
     (cl_context, cl_device_id, cl_command_queue_properties, cl_int *))        \
  XX(void *, clSVMAlloc, (cl_context, cl_svm_mem_flags, size_t, cl_uint))      \
  XX(void, clSVMFree, (cl_context, void *))                                    \
  XX(cl_int, clGetMemObjectInfo,                                               \
     (cl_mem, cl_mem_info, size_t, void *, size_t *))                          \
  XX(cl_mem, clCreateSubBuffer,                                                \
     (cl_mem, cl_mem_flags, cl_buffer_create_type, const void *, cl_int *))

/* The loaded library: filled once by um__ocl_lib's load, read-only afterwards. */
typedef struct ocl_api {
#define OCL_ENTRY_MEMBER_(ret, name, params) ret(CL_API_CALL *name) params;
  OCL_REQUIRED_ENTRY_POINTS(OCL_ENTRY_MEMBER_)
  OCL_OPTIONAL_ENTRY_POINTS(OCL_ENTRY_MEMBER_)
#undef OCL_ENTRY_MEMBER_
} ocl_api;

/* ------------------------------------------------------------------------ */
/* State                                                                     */

/* Tokens released on a thread that reports nothing, kept for the device's
 * next walk to release (um__ocl_native_release). */
#define OCL_RELEASE_LATER 1024

/* An in-order queue that transfers go to, and its watch list (watch.c):
 * watched commands of this queue, oldest first, not reported yet; the
 * newest of them with no callback of its own; whether the lazy callback
 * is armed (0 or 1); walks running. Queue 0 is unimem's own; the others
 * are queues of the caller's (um_queue_use, um__ocl_queue_adopt). */
typedef struct ocl_watch {
  struct ocl_device *dev;
  cl_command_queue queue;   /* retained */
  atomic_bool locked;       /* um__ocl_watch_lock() */
  struct transfer_completion *head, *tail, *unarmed;
  int lazy;
  int walking; /* a walk runs (one at a time) */
  int again;   /* a callback fired during it: it goes round again */
  /* Commands put on the list without the order lock (um__ocl_order_begin),
   * and the lock: a watched command is enqueued and listed in one hold. */
  atomic_uint unordered;
  atomic_bool order_held; /* the order lock: only ever tried, never waited for */
  /* Riders (um__xfer.ride): entries are numbered as they are listed (seq,
   * under the lock); a command enqueued after seq was read, once it has
   * completed well, vouches for every entry up to that number (vouched).
   * kicked: the number up to which a kick's marker is queued already. */
  atomic_uint_fast64_t seq;
  atomic_uint_fast64_t vouched;
  atomic_int nriders;
  uint64_t kicked; /* under the lock */
} ocl_watch;

/* unimem's own queue and the caller's queues transfers may go to. */
#define OCL_QUEUES 5

typedef struct ocl_device {
  cl_platform_id platform;
  cl_device_id id;
  cl_context context; /* shared by every device of the platform; not owned */
  cl_command_queue queue;        /* unimem's (watch[0].queue) */
  cl_command_queue caller_queue; /* the caller's (um_device_native) */
  int context_devices; /* devices in context: peers exist when > 1 */
  int fine_grain_svm;  /* UM_UNIFIED can be given */
  int host_memory;     /* a CPU device, or one sharing the host's memory */
  uint64_t total_bytes;     /* reported: global memory, capped by the limit */
  uint64_t limit_bytes;     /* device_limit_bytes, 0 for none */
  uint64_t max_alloc_bytes; /* CL_DEVICE_MAX_MEM_ALLOC_SIZE */
  size_t base_align;        /* CL_DEVICE_MEM_BASE_ADDR_ALIGN, in bytes: where a
                               sub-buffer may start */
  uint32_t spin_ns;         /* wait_spin_ns: blocking calls poll first */
  /* With spin_ns, on a CPU device with driver threads: how long a
   * blocking call leaves the driver after a spinning wait saw a command
   * end (um__ocl_settle), and when one last did (um__spin_clock_ns). */
  uint32_t settle_ns;
  _Atomic uint64_t spun_end_ns;
  /* The driver runs each command inside the call that submits it (PoCL's
   * basic device): calls that submit take submit_lock (below). */
  int runs_inline;
  /* The queues transfers go to: watch[0] unimem's, then the caller's that
   * um__ocl_queue_adopt added (nqueues in all; added under queues_lock,
   * published by nqueues, release). */
  ocl_watch watch[OCL_QUEUES];
  atomic_int nqueues;
  pthread_mutex_t queues_lock;
  /* Events whose last reference was put on a thread that does not report
   * completions, for the next walk to release (um__ocl_native_release);
   * under um__ocl_later_lock. */
  atomic_bool later_locked;
  int nlater;
  cl_event later[OCL_RELEASE_LATER];
  /* Walks that took kept events and release them after their reports: the
   * device is not destroyed before they are done. */
  atomic_int walk_tails;
  char name[128];
} ocl_device;

/* Per-manager state. */
typedef struct ocl_state {
  ocl_device **devices;
  int device_count;
  int device_capacity;
  cl_context *contexts; /* one per platform that has devices */
  int context_count;
} ocl_state;

/* What a watched transfer's completion needs: in the caller's done_space
 * where it gives one, else allocated (and freed when reported). */
typedef struct transfer_completion {
  um__done_fn done;
  void *arg;
  struct ocl_watch *watch;          /* whose watch list it is on */
  cl_event event;                   /* the command's */
  struct transfer_completion *next; /* in the device's watch list */
  cl_int status;                    /* once ended: its execution status (set by
                                       the callback or the walk) */
  unsigned char kind;               /* um__xfer_kind, for the error's text */
  unsigned char allocated;
  unsigned char retained; /* holds a reference of its own on event (the
                             caller does not keep the token until done) */
  unsigned char armed;    /* a callback of its own is registered on event:
                             WATCH_OWN, or WATCH_LAZY (it covers the small
                             commands before it); under um__ocl_watch_lock */
  unsigned char ordered;  /* enqueued and put on the list in one hold of
                             its queue's order lock, with no unordered
                             entry put on the list meanwhile: the entries
                             before it on the list were enqueued before it
                             (set by um__ocl_watch_add) */
  atomic_uchar fired;     /* its callback ran, status is set (set under
                             um__ocl_watch_lock) */
  unsigned char ride;     /* no command (um__xfer.ride): complete once an
                             entry listed after it is known complete */
  unsigned char kick;     /* a kick's marker: completed well, it vouches
                             for the entries numbered up to seq */
  uint64_t seq;           /* its number on the list (ocl_watch.seq); a
                             kick's: the newest entry's when it was queued */
} transfer_completion;

enum { WATCH_OWN = 1, WATCH_LAZY = 2 };

/* Commands that move this much or more, and queue marks (each stands for a
 * run of copies), get a callback of their own: a report that waited for
 * the next callback could come a whole large command late (a double-
 * buffered pipeline would wait for the next buffer's transfer), and a
 * callback is a small part of such a command's time. */
#define WATCH_OWN_BYTES (64u * 1024u)

_Static_assert(sizeof(transfer_completion) <= UM__DONE_SPACE, "a completion fits the core's done_space");

/* after[] lists longer than this take one malloc. */
#define OCL_INLINE_WAIT_LIST 16


/* Shared by this folder's files. Entries of the backend table (load.c) say
 * "(table)": backend.h's um__backend says what each does. */

/* devices.c */
/* Wait for one command: CL_SUCCESS, or why it failed. */
cl_int um__ocl_wait_command_status(cl_event event);
/* Wait for one command and return its execution status as UM_* code. */
int um__ocl_wait_for_command(cl_event event, const char *call);
/* Bracket a submission on dev: under submit_lock where dev runs commands inline. */
void um__ocl_submit_begin(const ocl_device *dev);
void um__ocl_submit_end(const ocl_device *dev);
/* wait_for_command for a blocking call of dev (spinning for wait_spin_ns first). */
int um__ocl_wait_for_own_command(ocl_device *dev, cl_event event, const char *call);
/* Before a spinning blocking call submits: leave a CPU device's threads settle_ns. */
void um__ocl_settle(ocl_device *dev);
/* The platform's OpenCL version, from its CL_PLATFORM_VERSION. */
int um__ocl_platform_version(cl_platform_id platform, int *major, int *minor);
/* Add an opened device, or a context to release at close, to state. */
int um__ocl_append_device(ocl_state *state, ocl_device *dev);
int um__ocl_append_context(ocl_state *state, cl_context context);
/* Release dev's queues and events and free it. */
void um__ocl_destroy_device(ocl_device *dev);
/* Describe one device and give it its queue, and the caller's (caller_queue or a new one). */
int um__ocl_open_device(cl_device_id id, cl_context context, int context_devices, int platform_major,
                    const um_options *opts, cl_command_queue caller_queue, ocl_device **out);
/* (table) Every device of the platforms UNIMEM_OPENCL_PLATFORM names. */
int um__ocl_open(const um_options *opts, void **ctx, int *count);
/* (table) */
int um__ocl_describe(void *ctx, int i, um__bdev_desc *out);
/* (table) */
void um__ocl_close(void *ctx);

/* interop.c */
/* (table) */
void um__ocl_device_native(void *bdev, um_device_native *out);
/* (table) */
void um__ocl_mem_native(void *bdev, const um__mem *mem, um_location loc, um_buffer_native *out);
/* (table) A cl_mem of the caller's (a DLPack import) as a DEVICE block. */
int um__ocl_foreign_wrap(void *bdev, um_location loc, uintptr_t handle, uint64_t offset, size_t bytes, um__mem *out);
/* (table) */
void um__ocl_foreign_release(void *bdev, um__mem *mem);
/* (table) */
void *um__ocl_token_native(void *bdev, void *token);
/* (table) */
int um__ocl_token_adopt(void *bdev, void *native, void **token);
/* (table) A user event with two references: gate_open drops the opener's. */
int um__ocl_gate_new(void *bdev, void **token);
/* (table) */
void um__ocl_gate_open(void *bdev, void *token, int status);
/* (table) */
int um__ocl_caller_marker(void *bdev, void **token);
/* (table) */
int um__ocl_token_query(void *bdev, void *token);
/* (table) */
int um__ocl_token_wait(void *bdev, void *token);
/* (table) The caller's context, device and queue as a device. */
int um__ocl_adopt(const um_options *opts, void **ctx, void *context, void *device, void *queue, um__bdev_desc *out);

/* load.c */
/* The loaded library: filled once by um__ocl_lib's load, read-only afterwards. */
extern ocl_api um__ocl;
/* The OpenCL library, loaded once for the process. */
extern um__vendor_lib um__ocl_lib;
/* The CL_* name of an OpenCL status code. */
const char *um__ocl_error_name(cl_int err);
/* The one place where OpenCL status codes become UM_E* codes (call: for um_last_error()). */
int um__ocl_translate_cl_error(cl_int err, const char *call);

/* memory.c */
/* (table) */
int um__ocl_mem_alloc(void *bdev, um_location loc, size_t bytes, um__mem *out);
/* (table) */
void um__ocl_mem_free(void *bdev, um_location loc, size_t bytes, um__mem *mem);
int um__ocl_mem_carve(void *bdev, um_location loc, const um__mem *seg, size_t off, size_t bytes, um__mem *out);
void um__ocl_mem_uncarve(void *bdev, um_location loc, um__mem *mem);
/* (table) The whole device: OpenCL has no standard free-memory query. */
int um__ocl_memory(void *bdev, uint64_t *free_bytes, uint64_t *total_bytes);
/* (table) */
int um__ocl_synchronize(void *bdev);
/* (table) */
int um__ocl_map(void *bdev, um__mem *mem, um_location loc, size_t off, size_t len, um_map_mode mode, void **host);
/* (table) */
int um__ocl_unmap(void *bdev, um__mem *mem, um_location loc, void *host);
/* (table) Devices that share a context. */
int um__ocl_peer_possible(void *a, void *b);
/* (table) Events of one context may stand in any of its queues' wait lists. */
int um__ocl_tokens_shared(void *a, void *b);
/* (table) Nothing to enable. */
int um__ocl_peer_enable(void *a, void *b);
/* (table) The caller's in-order queue of dev's context and device as a queue transfers may go to. */
int um__ocl_queue_adopt(void *bdev, void *native, int *q);

/* transfers.c */
/* The OpenCL call a transfer kind is enqueued with, for errors. */
const char *um__ocl_transfer_call_name(um__xfer_kind kind);
/* (table) */
int um__ocl_xfer(void *bdev, const um__xfer *x);
/* Free c where it was allocated (not in the caller's done_space). */
void um__ocl_completion_free(transfer_completion *c);
/* (table) */
int um__ocl_xfer_async(void *bdev, const um__xfer *x, void *const *after, int nafter, um__done_fn done, void *arg,
                   void **native);
/* Release the events dev keeps for its next walk. */
void um__ocl_release_later(ocl_device *dev);
/* (table) A token's last reference; kept for the next walk off a reporting thread. */
void um__ocl_native_release(void *bdev, void *native);

/* watch.c */
/* A spin lock of a few dozen instructions at a time: a watch list's
 * (ocl_watch.locked), the kept events' (later_locked). */
void um__ocl_spin_lock(atomic_bool *locked);
void um__ocl_spin_unlock(atomic_bool *locked);
#define um__ocl_watch_lock(w) um__ocl_spin_lock(&(w)->locked)
#define um__ocl_watch_unlock(w) um__ocl_spin_unlock(&(w)->locked)
#define um__ocl_later_lock(dev) um__ocl_spin_lock(&(dev)->later_locked)
#define um__ocl_later_unlock(dev) um__ocl_spin_unlock(&(dev)->later_locked)
/* Set while this thread reports a walk's entries (watch_report). */
extern _Thread_local int um__ocl_reporting;
/* Under later_lock: take the events kept for the next walk into out. */
int um__ocl_take_later_locked(ocl_device *dev, cl_event *out);
/* unimem's last reference on a token's event, and on n of them. */
void um__ocl_release_token(cl_event ev);
void um__ocl_release_events(const cl_event *ev, int n);
/* The order lock of a queue (order_held), only ever tried; order_begin says whether it is held. */
int um__ocl_order_begin(ocl_watch *w, unsigned *unordered0);
void um__ocl_order_end(ocl_watch *w, int held);
/* Put c's command on w's watch list, submit it, and arm a callback where needed. */
void um__ocl_watch_add(ocl_watch *w, transfer_completion *c, int own, int held, unsigned unordered0);
/* After a blocking command of w's queue ended: the commands queued there
 * before it have ended too, and a walk (unless one runs) reports them now,
 * on this thread, instead of at the lazy callback's next run. */
void um__ocl_watch_poll(ocl_watch *w);
/* Riders (um__xfer.ride, watch.c). List c, with no command, after what
 * the caller queued on w's queue so far. */
void um__ocl_watch_ride(ocl_watch *w, transfer_completion *c);
/* The number of w's newest entry: read before a command is enqueued, what
 * um__ocl_watch_vouch is given once it has completed well. */
uint64_t um__ocl_watch_seq(ocl_watch *w);
void um__ocl_watch_vouch(ocl_watch *w, uint64_t upto);
/* queue_kick: every queue of the device with riders gets a marker. */
void um__ocl_queue_kick(void *bdev);
/* queue_mark_now: a kick's marker on one queue, its event the token. */
int um__ocl_queue_mark_now(void *bdev, int queue, void **token);
/* The queue x goes to (its x->queue; unimem's own for one not adopted). */
ocl_watch *um__ocl_watch_of(ocl_device *dev, const um__xfer *x);
/* The wait list of x on w's queue: after[]'s tokens of other queues, then x->wait[]. */
cl_uint um__ocl_build_wait_list(const ocl_watch *w, const um__xfer *x, void *const *after, int nafter, cl_event *list);

#endif
