/* The unimem._core extension: types and helpers shared by its files.
 *
 * Object model. Every Python object holds a strong reference to the
 * Manager object it came from, so a Manager object outlives its buffers,
 * events and mappings:
 *
 *   Manager  owns the um_manager; keeps an intrusive list of its live
 *            Buffer and Event objects (borrowed: each unlinks itself).
 *   Buffer   owns one reference to one um_buffer (um_release gives it up).
 *   Event    owns one um_event, plus the Buffer objects and the host memory
 *            (a Py_buffer) its operation reads or writes, until the
 *            operation is seen done. An Event dropped before that leaves
 *            them to an orphan record of the manager (event.c), reaped
 *            once the operation is seen done: no deallocation waits.
 *   Mapping  owns one um_map of a Buffer and exports it to Python.
 *   Access   owns the open brackets (um_access_begin, um_access_begin_n)
 *            of one Buffer or of several.
 *   DLPack   a tensor exported by __dlpack__ holds its Buffer object (a
 *            reference and one export) until the consumer deletes it.
 *
 * A C handle is given up only when nothing can still reach its memory:
 *   - a Buffer's um_release waits for its exports (buffer protocol views,
 *     a live Mapping) and for calls running on it without the GIL; until
 *     then release() only marks it released ("release requested");
 *   - a from_dlpack import's um_release waits for its operations (a
 *     wrap's), so it is also deferred while an Event or orphan of one of
 *     them is pending: that wait could pass through an open access;
 *   - an Event's um_event_release waits for the waits running on it;
 *   - um_manager_destroy waits (after close()) until no Buffer, Event or
 *     orphan holds a handle and no call runs on the manager without the GIL.
 * Dropping an object never waits for an operation: one may be queued behind
 * an access that the dropping thread itself has to end.
 * All of this bookkeeping is changed only with the GIL held.
 */
#ifndef PYUNIMEM_H
#define PYUNIMEM_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <unimem.h>

typedef struct BufferObject BufferObject;
typedef struct EventObject EventObject;
typedef struct log_sink log_sink;
typedef struct event_orphan event_orphan;

typedef struct ManagerObject {
  PyObject_HEAD
  um_manager *m;         /* NULL once destroyed */
  int closed;            /* close() was called: nothing new starts */
  Py_ssize_t calls;      /* calls running on m without the GIL */
  Py_ssize_t handles;    /* Buffers and Events still holding a C handle */
  BufferObject *buffers; /* live Buffer objects (borrowed) */
  EventObject *events;   /* live Event objects (borrowed) */
  event_orphan *orphans; /* payloads of Events dropped while pending */
  Py_ssize_t accesses;   /* open Access objects of its buffers */
  PyObject *devices;     /* tuple of Device */
  log_sink *sink;        /* Python log callback plumbing, or NULL */
  PyObject *log, *log_ctx, *on_oom, *oom_ctx; /* the options' objects */
  um_options opts;       /* the options the manager runs with */
  PyObject *weakrefs;
} ManagerObject;

struct BufferObject {
  PyObject_HEAD
  ManagerObject *mgr;
  um_buffer *b;          /* NULL once um_release was called */
  void *host;            /* zero-copy host view, or NULL */
  size_t size;
  int device;            /* index in the manager */
  int location;          /* um_location */
  Py_ssize_t exports;    /* buffer-protocol views, live mappings, open
                            accesses, DLPack tensors not deleted */
  Py_ssize_t calls;      /* calls running on b without the GIL */
  int release_requested; /* release() (or close()) was called */
  int readonly;          /* a read-only import (from_dlpack): no writable views */
  int wrapped;           /* an import (from_dlpack): um_release waits for its operations */
  Py_ssize_t pending;    /* Events and orphans of its operations not seen done */
  Py_ssize_t accesses;   /* open Access objects (counted in exports too) */
  PyObject *cl_view;     /* to_pyopencl's pyopencl.Buffer, made once, dropped at release */
  Py_buffer source;      /* Manager.wrap_host: the object's memory, held until the wrap's release
                            returned (source.obj NULL: none) */
  BufferObject *prev, *next; /* the manager's list */
  PyObject *weakrefs;
};

struct EventObject {
  PyObject_HEAD
  ManagerObject *mgr;
  um_event *ev;          /* NULL once released */
  int done;              /* completion seen */
  int status;            /* the operation's status, once done */
  Py_ssize_t calls;      /* waits running without the GIL */
  PyObject *buffers[2];  /* Buffer objects of the operation, or NULL */
  Py_buffer host;        /* host memory of the operation (host.obj NULL: none) */
  EventObject *prev, *next; /* the manager's list */
};

extern PyTypeObject Manager_Type;
extern PyTypeObject Buffer_Type;
extern PyTypeObject Event_Type;
extern PyTypeObject Mapping_Type;
extern PyTypeObject *Device_Type;

/* ---- core.c: errors and argument helpers ---------------------------- */

/* Raise the unimem.Error subclass of st with um_last_error() (or the
 * code's text) as message. Returns NULL. */
PyObject *pyum_raise(int st);
/* Raise the subclass of st with a formatted message. Returns NULL. */
PyObject *pyum_raise_msg(int st, const char *fmt, ...);

/* Parse a METH_FASTCALL | METH_KEYWORDS call into out[0..n) by names
 * (n entries; positional arguments fill them in order). The first
 * nrequired must be given. out[i] is borrowed, NULL when absent. */
int pyum_parse(const char *fname, PyObject *const *args, Py_ssize_t nargs,
               PyObject *kwnames, const char *const *names, int n,
               int nrequired, PyObject **out);
/* An int argument as size_t / uint64_t: TypeError for non-ints,
 * InvalidArgument when negative, Overflow when too large. */
int pyum_size(PyObject *o, const char *what, size_t *out);
int pyum_u64(PyObject *o, const char *what, uint64_t *out);
/* Truth of a bool argument (NULL: dflt). -1 with an exception. */
int pyum_flag(PyObject *o, int dflt);

/* Location names: "host", "device", "pinned", "unified". */
extern const char *const pyum_location_names[UM_LOCATION_COUNT];

/* Host memory of an object for a copy: C-contiguous, and writable when
 * writable is set. BufferError naming the problem otherwise. */
int pyum_host_view(PyObject *obj, Py_buffer *view, int writable,
                   const char *fname);

/* ---- core.c: log forwarding ----------------------------------------- */

log_sink *pyum_sink_new(ManagerObject *owner);
/* Deliver queued messages now (GIL held, no unimem lock held). */
void pyum_sink_flush(log_sink *s);
/* The manager is gone: deliver what is queued, then free the sink. */
void pyum_sink_free(log_sink *s);
void pyum_log_hook(void *ctx, um_log_level level, const char *msg);
int pyum_oom_hook(void *ctx, um_device *d, size_t bytes);
/* At exit: messages from now on go to stderr, on_oom answers 0. */
void pyum_log_shutdown(void);
/* Mark this thread as running an allocation of mgr without the GIL
 * (on_oom may call Python on this thread only), or NULL; returns the
 * previous mark. */
ManagerObject *pyum_oom_thread_swap(ManagerObject *mgr);

/* ---- manager.c ------------------------------------------------------ */

/* 0 when new work may start on mgr; InvalidState when closed. */
int pyum_manager_check(ManagerObject *mgr);
/* Destroy the um_manager once close() was called and nothing holds it.
 * Returns its status (an exception is set when raise_errors). */
int pyum_manager_maybe_destroy(ManagerObject *mgr, int raise_errors);
/* The Device of a um_device (borrowed), or NULL. */
PyObject *pyum_manager_device(ManagerObject *mgr, um_device *d);
/* Device index of an int or a Device: TypeError, NoDevice when absent. */
int pyum_device_index(ManagerObject *mgr, PyObject *o, int *index);
/* The keywords of Manager(), in um_options order. */
PyObject *pyum_option_names(void);

/* ---- buffer.c -------------------------------------------------------- */

/* A new Buffer owning b (registered with mgr). Releases b on failure. */
PyObject *pyum_buffer_new(ManagerObject *mgr, um_buffer *b);
/* wrap.c: Manager.wrap_host and Manager.map_file, and their docs. */
PyObject *pyum_manager_wrap_host(ManagerObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
PyObject *pyum_manager_map_file(ManagerObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
extern const char pyum_wrap_host_doc[], pyum_map_file_doc[];
/* 0 when the buffer may be used; InvalidState otherwise. */
int pyum_buffer_check(BufferObject *self);
/* 'r', 'w', 'rw' or 'discard' as a um_map_mode. */
int pyum_parse_map_mode(PyObject *o, um_map_mode *mode);
/* Pins for calls without the GIL and for exports; the unpin that ends
 * the last pin of a released buffer gives its handle up. */
void pyum_buffer_unpin_call(BufferObject *self);
void pyum_buffer_unexport(BufferObject *self);
/* Give the handle up now or as soon as nothing pins it (close()). */
void pyum_buffer_request_release(BufferObject *self);
/* An operation's Event (or orphan) holding self was seen done. */
void pyum_buffer_op_done(BufferObject *self);

/* ---- copy.c ---------------------------------------------------------- */

/* unimem.copy(dst, src, nbytes, dst_offset=0, src_offset=0, wait=True) */
PyObject *pyum_copy(PyObject *mod, PyObject *const *args, Py_ssize_t nargs,
                    PyObject *kwnames);
PyObject *pyum_buffer_copy_from(BufferObject *self, PyObject *const *args,
                                Py_ssize_t nargs, PyObject *kwnames);
PyObject *pyum_buffer_copy_to(BufferObject *self, PyObject *const *args,
                              Py_ssize_t nargs, PyObject *kwnames);
PyObject *pyum_buffer_fill(BufferObject *self, PyObject *const *args,
                           Py_ssize_t nargs, PyObject *kwnames);

/* ---- event.c -------------------------------------------------------- */

/* A new Event over ev, holding the given Buffers and taking over *host
 * (host->obj NULL: none). On failure, waits for ev and releases all. */
PyObject *pyum_event_new(ManagerObject *mgr, um_event *ev, PyObject *buf0,
                         PyObject *buf1, Py_buffer *host);
/* Wait for the event without the GIL and give everything up (close()). */
void pyum_event_finish_now(EventObject *self);
/* Give up the orphans whose operation is done; with wait, wait for each
 * (without the GIL) first: only where no access of mgr can be open. */
void pyum_orphans_reap(ManagerObject *mgr, int wait);

/* ---- mapping.c ------------------------------------------------------ */

/* A Mapping of buf's live um_map (ptr, len), taking over the export that
 * buf counts for it. On failure the mapping is ended (um_unmap). */
PyObject *pyum_mapping_new(BufferObject *buf, um_map_mode mode, void *ptr,
                           size_t len);

/* ---- dlpack.c --------------------------------------------------------- */

PyObject *pyum_buffer_dlpack(BufferObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
PyObject *pyum_buffer_view(BufferObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
PyTypeObject *pyum_array_type(void);
PyObject *pyum_export_typed(BufferObject *self, PyObject *const *a, size_t offset, int ndim, const int64_t *shape,
                            const int64_t *strides, uint8_t code, uint8_t bits, uint16_t lanes);
PyObject *pyum_buffer_dlpack_device(BufferObject *self, PyObject *unused);
/* unimem.from_dlpack(m, obj) */
PyObject *pyum_from_dlpack(PyObject *mod, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);

/* ---- interop.c ------------------------------------------------------- */

PyObject *pyum_manager_native(ManagerObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
/* observe.c: tags, the snapshot, the history. */
PyObject *pyum_manager_tag_push(ManagerObject *self, PyObject *name);
PyObject *pyum_manager_tag_pop(ManagerObject *self, PyObject *unused);
PyObject *pyum_manager_tag_stats(ManagerObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
PyObject *pyum_manager_snapshot(ManagerObject *self, PyObject *unused);
PyObject *pyum_manager_history_start(ManagerObject *self, PyObject *capacity);
PyObject *pyum_manager_history_stop(ManagerObject *self, PyObject *unused);
PyObject *pyum_manager_history_events(ManagerObject *self, PyObject *unused);
PyObject *pyum_manager_history_save(ManagerObject *self, PyObject *path);
/* m.tag(name) and m.history(capacity): instances of the package's context
 * managers (unimem/__init__.py registers them: _set_observe_classes). */
PyObject *pyum_manager_tag(ManagerObject *self, PyObject *name);
PyObject *pyum_manager_history(ManagerObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
PyObject *pyum_set_observe_classes(PyObject *mod, PyObject *args);
PyObject *pyum_manager_use_queue(ManagerObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
PyObject *pyum_manager_pyopencl_queue(ManagerObject *self, PyObject *const *args, Py_ssize_t nargs,
                                      PyObject *kwnames);
PyObject *pyum_buffer_native(BufferObject *self, PyObject *unused);
PyObject *pyum_buffer_to_pyopencl(BufferObject *self, PyObject *unused);
/* A new Access of buf in mode (not begun: its __enter__ begins it). */
PyObject *pyum_access_new(BufferObject *buf, um_map_mode mode);
/* unimem.access(buffers, modes='rw'): an Access over several Buffers. */
PyObject *pyum_access_many(PyObject *mod, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
/* The native event of a pyopencl.Event (int_ptr) or a CuPy / PyTorch CUDA
 * event (ptr / cuda_event); TypeError naming what for anything else. */
int pyum_native_event(PyObject *value, const char *what, void **out);
PyTypeObject *pyum_access_type(void);

#endif /* PYUNIMEM_H */
