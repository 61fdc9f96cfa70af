/* unimem.Manager: options, devices, allocation, statistics, close. */
#include "pyunimem.h" /* Python.h first, as Python asks */

#include <limits.h>
#include <stddef.h>
#include <string.h>

/* ---- Options --------------------------------------------------------------- */

typedef enum { OPT_FLAG, OPT_INT, OPT_U32, OPT_U64, OPT_SIZE, OPT_STRING, OPT_LEVEL, OPT_CALLABLE, OPT_OBJECT } opt_kind;

/* Every field of um_options, in order: one keyword of Manager() each. */
#define PYUM_OPTION_FIELDS(XX)                                                 \
  XX(enable_pooling, OPT_FLAG)                                                 \
  XX(max_pool_bytes, OPT_U64)                                                  \
  XX(max_pool_bytes_per_class, OPT_U64)                                        \
  XX(trim_interval_ms, OPT_U32)                                                \
  XX(max_concurrent_transfers, OPT_INT)                                        \
  XX(use_pinned_staging, OPT_INT)                                              \
  XX(staging_chunk_bytes, OPT_SIZE)                                            \
  XX(pinned_pool_bytes, OPT_U64)                                               \
  XX(enable_peer, OPT_FLAG)                                                    \
  XX(trim_on_pressure, OPT_FLAG)                                               \
  XX(scrub, OPT_FLAG)                                                          \
  XX(debug, OPT_FLAG)                                                          \
  XX(huge_pages, OPT_FLAG)                                                     \
  XX(device_limit_bytes, OPT_U64)                                              \
  XX(net_timeout_ms, OPT_U32)                                                  \
  XX(wait_spin_ns, OPT_U32)                                                    \
  XX(backends, OPT_STRING)                                                     \
  XX(log_level, OPT_LEVEL)                                                     \
  XX(log, OPT_CALLABLE)                                                        \
  XX(log_ctx, OPT_OBJECT)                                                      \
  XX(on_oom, OPT_CALLABLE)                                                     \
  XX(oom_ctx, OPT_OBJECT)                                                      \
  XX(segments, OPT_FLAG)                                                       \
  XX(oom_snapshot, OPT_STRING)                                                 \
  XX(backtraces, OPT_FLAG)

/* The list must be um_options field for field: a struct made of the listed
 * fields has the same size and the same offsets, or the build fails. (The
 * Python tests also compare the keywords with the header's struct.) */
struct options_mirror {
#define PYUM_MIRROR_FIELD_(name, kind) __typeof__(((um_options *)0)->name) name;
  PYUM_OPTION_FIELDS(PYUM_MIRROR_FIELD_)
#undef PYUM_MIRROR_FIELD_
};
_Static_assert(sizeof(struct options_mirror) == sizeof(um_options), "PYUM_OPTION_FIELDS misses a um_options field");
#define PYUM_MIRROR_OFFSET_(name, kind)                                                                     \
  _Static_assert(offsetof(struct options_mirror, name) == offsetof(um_options, name),                       \
                 "PYUM_OPTION_FIELDS is out of step with um_options at " #name);
PYUM_OPTION_FIELDS(PYUM_MIRROR_OFFSET_)
#undef PYUM_MIRROR_OFFSET_

typedef struct option_desc {
  const char *name;
  opt_kind kind;
  size_t offset;
} option_desc;

static const option_desc option_table[] = {
#define PYUM_OPTION_ROW_(name, kind) {#name, kind, offsetof(um_options, name)},
    PYUM_OPTION_FIELDS(PYUM_OPTION_ROW_)
#undef PYUM_OPTION_ROW_
};
#define NOPTIONS (sizeof(option_table) / sizeof(option_table[0]))

static const char *const level_names[] = {"error", "warn", "info", "debug"};

/* Where a Python-object option lives in the manager object. */
static PyObject **object_slot(ManagerObject *self, const char *name) {
  if (strcmp(name, "log") == 0)
    return &self->log;
  if (strcmp(name, "log_ctx") == 0)
    return &self->log_ctx;
  if (strcmp(name, "on_oom") == 0)
    return &self->on_oom;
  return &self->oom_ctx;
}

/* A string option: the field at field, of cap bytes. */
static int set_string_option(char *field, size_t cap, PyObject *v, const char *name) {
  Py_ssize_t len;
  const char *s;
  if (!PyUnicode_Check(v)) {
    PyErr_Format(PyExc_TypeError, "%s must be a str, not %.100s", name, Py_TYPE(v)->tp_name);
    return -1;
  }
  if ((s = PyUnicode_AsUTF8AndSize(v, &len)) == NULL)
    return -1;
  if ((size_t)len >= cap || strlen(s) != (size_t)len) {
    pyum_raise_msg(UM_EINVAL, "%s must be shorter than %zu bytes, without NUL characters", name, cap);
    return -1;
  }
  memcpy(field, s, (size_t)len + 1);
  return 0;
}

static int set_level_option(um_options *o, PyObject *v) {
  if (PyUnicode_Check(v)) {
    for (int i = 0; i < 4; i++)
      if (PyUnicode_CompareWithASCIIString(v, level_names[i]) == 0) {
        o->log_level = (um_log_level)i;
        return 0;
      }
  } else if (PyLong_Check(v)) {
    int overflow = 0;
    long n = PyLong_AsLongAndOverflow(v, &overflow);
    if (n == -1 && PyErr_Occurred())
      return -1;
    if (!overflow && n >= UM_LOG_ERROR && n <= UM_LOG_DEBUG) {
      o->log_level = (um_log_level)n;
      return 0;
    }
  } else {
    PyErr_Format(PyExc_TypeError, "log_level must be a str or an int, not %.100s", Py_TYPE(v)->tp_name);
    return -1;
  }
  pyum_raise_msg(UM_EINVAL, "log_level must be 'error', 'warn', 'info', 'debug' or 0..3");
  return -1;
}

static int set_int_option(int *field, PyObject *v, const char *name) {
  int overflow = 0;
  long long n;
  if (!PyLong_Check(v)) {
    PyErr_Format(PyExc_TypeError, "%s must be an int, not %.100s", name, Py_TYPE(v)->tp_name);
    return -1;
  }
  n = PyLong_AsLongLongAndOverflow(v, &overflow);
  if (n == -1 && PyErr_Occurred())
    return -1;
  if (overflow || n < INT_MIN || n > INT_MAX) {
    pyum_raise_msg(UM_EOVERFLOW, "%s does not fit in an int", name);
    return -1;
  }
  *field = (int)n;
  return 0;
}

static int set_unsigned_option(char *field, opt_kind kind, PyObject *v, const char *name) {
  uint64_t n;
  if (!PyLong_Check(v)) {
    PyErr_Format(PyExc_TypeError, "%s must be an int, not %.100s", name, Py_TYPE(v)->tp_name);
    return -1;
  }
  if (pyum_u64(v, name, &n) < 0)
    return -1;
  if ((kind == OPT_U32 && n > UINT32_MAX) || (kind == OPT_SIZE && n > SIZE_MAX)) {
    pyum_raise_msg(UM_EOVERFLOW, "%s does not fit in %s", name, kind == OPT_U32 ? "32 bits" : "size_t");
    return -1;
  }
  if (kind == OPT_U32)
    *(uint32_t *)(void *)field = (uint32_t)n;
  else if (kind == OPT_SIZE)
    *(size_t *)(void *)field = (size_t)n;
  else
    *(uint64_t *)(void *)field = n;
  return 0;
}

static int set_option(ManagerObject *self, um_options *o, const option_desc *d, PyObject *v) {
  char *field = (char *)o + d->offset;
  switch (d->kind) {
  case OPT_FLAG:
    if (!PyLong_Check(v)) {
      PyErr_Format(PyExc_TypeError, "%s must be a bool, not %.100s", d->name, Py_TYPE(v)->tp_name);
      return -1;
    }
    *(int *)(void *)field = PyObject_IsTrue(v);
    return 0;
  case OPT_INT: return set_int_option((int *)(void *)field, v, d->name);
  case OPT_U32:
  case OPT_U64:
  case OPT_SIZE: return set_unsigned_option(field, d->kind, v, d->name);
  case OPT_STRING:
    return d->offset == offsetof(um_options, backends)
               ? set_string_option(o->backends, sizeof(o->backends), v, d->name)
               : set_string_option(o->oom_snapshot, sizeof(o->oom_snapshot), v, d->name);
  case OPT_LEVEL: return set_level_option(o, v);
  case OPT_CALLABLE:
    if (v != Py_None && !PyCallable_Check(v)) {
      PyErr_Format(PyExc_TypeError, "%s must be callable or None, not %.100s", d->name, Py_TYPE(v)->tp_name);
      return -1;
    }
    /* fall through */
  case OPT_OBJECT:
    Py_INCREF(v);
    Py_XSETREF(*object_slot(self, d->name), v);
    return 0;
  }
  return 0;
}

static int parse_options(ManagerObject *self, PyObject *kwds, um_options *o) {
  PyObject *key, *value;
  Py_ssize_t pos = 0;
  um_options_init(o);
  while (kwds != NULL && PyDict_Next(kwds, &pos, &key, &value)) {
    size_t i = 0;
    while (i < NOPTIONS && PyUnicode_CompareWithASCIIString(key, option_table[i].name) != 0)
      i++;
    if (i == NOPTIONS) {
      PyErr_Format(PyExc_TypeError, "Manager() got an unexpected keyword argument '%S'", key);
      return -1;
    }
    if (set_option(self, o, &option_table[i], value) < 0)
      return -1;
  }
  /* None means "no callback", as when the keyword is absent. */
  if (self->log == Py_None)
    Py_CLEAR(self->log);
  if (self->on_oom == Py_None)
    Py_CLEAR(self->on_oom);
  return 0;
}

static PyObject *option_value(ManagerObject *self, const option_desc *d) {
  const char *field = (const char *)&self->opts + d->offset;
  PyObject *obj;
  switch (d->kind) {
  case OPT_FLAG: return PyBool_FromLong(*(const int *)(const void *)field);
  case OPT_INT: return PyLong_FromLong(*(const int *)(const void *)field);
  case OPT_U32: return PyLong_FromUnsignedLong(*(const uint32_t *)(const void *)field);
  case OPT_U64: return PyLong_FromUnsignedLongLong(*(const uint64_t *)(const void *)field);
  case OPT_SIZE: return PyLong_FromSize_t(*(const size_t *)(const void *)field);
  case OPT_STRING: return PyUnicode_DecodeUTF8(field, (Py_ssize_t)strlen(field), "replace");
  case OPT_LEVEL: return PyUnicode_FromString(level_names[(unsigned)self->opts.log_level & 3u]);
  case OPT_CALLABLE:
  case OPT_OBJECT:
    obj = *object_slot(self, d->name);
    obj = obj != NULL ? obj : Py_None;
    Py_INCREF(obj);
    return obj;
  }
  Py_RETURN_NONE;
}

static PyObject *Manager_get_options(ManagerObject *self, void *closure) {
  PyObject *out = PyDict_New();
  (void)closure;
  if (out == NULL)
    return NULL;
  for (size_t i = 0; i < NOPTIONS; i++) {
    PyObject *v = option_value(self, &option_table[i]);
    if (v == NULL || PyDict_SetItemString(out, option_table[i].name, v) < 0) {
      Py_XDECREF(v);
      Py_DECREF(out);
      return NULL;
    }
    Py_DECREF(v);
  }
  return out;
}

PyObject *pyum_option_names(void) {
  PyObject *out = PyTuple_New(NOPTIONS);
  for (size_t i = 0; out != NULL && i < NOPTIONS; i++) {
    PyObject *name = PyUnicode_FromString(option_table[i].name);
    if (name == NULL)
      Py_CLEAR(out);
    else
      PyTuple_SET_ITEM(out, (Py_ssize_t)i, name);
  }
  return out;
}

/* ---- Devices --------------------------------------------------------------- */

static PyObject *device_new(um_device *d) {
  um_device_info info;
  PyObject *dev, *locs;
  Py_ssize_t n = 0;
  int st = um_device_info_get(d, &info);
  if (st != UM_OK)
    return pyum_raise(st);
  if ((locs = PyTuple_New(0)) == NULL)
    return NULL;
  for (int loc = 0; loc < UM_LOCATION_COUNT; loc++) {
    if (!(info.locations & (1u << loc)))
      continue;
    if (_PyTuple_Resize(&locs, n + 1) < 0)
      return NULL;
    PyTuple_SET_ITEM(locs, n++, PyUnicode_FromString(pyum_location_names[loc]));
    if (PyTuple_GET_ITEM(locs, n - 1) == NULL) {
      Py_DECREF(locs);
      return NULL;
    }
  }
  if ((dev = PyStructSequence_New(Device_Type)) == NULL) {
    Py_DECREF(locs);
    return NULL;
  }
  PyStructSequence_SET_ITEM(dev, 0, PyLong_FromLong(info.index));
  PyStructSequence_SET_ITEM(dev, 1, PyUnicode_DecodeUTF8(info.name, (Py_ssize_t)strnlen(info.name, sizeof(info.name)),
                                                         "replace"));
  PyStructSequence_SET_ITEM(dev, 2, PyUnicode_DecodeUTF8(info.backend,
                                                         (Py_ssize_t)strnlen(info.backend, sizeof(info.backend)),
                                                         "replace"));
  PyStructSequence_SET_ITEM(dev, 3, PyLong_FromUnsignedLongLong(info.total_bytes));
  PyStructSequence_SET_ITEM(dev, 4, locs);
  for (Py_ssize_t i = 0; i < 4; i++)
    if (PyStructSequence_GET_ITEM(dev, i) == NULL) {
      Py_DECREF(dev);
      return NULL;
    }
  return dev;
}

static PyObject *devices_new(um_manager *m) {
  int n = um_device_count(m);
  PyObject *out;
  if (n < 0)
    return pyum_raise(n);
  if ((out = PyTuple_New(n)) == NULL)
    return NULL;
  for (int i = 0; i < n; i++) {
    PyObject *dev = device_new(um_device_get(m, i));
    if (dev == NULL) {
      Py_DECREF(out);
      return NULL;
    }
    PyTuple_SET_ITEM(out, i, dev);
  }
  return out;
}

PyObject *pyum_manager_device(ManagerObject *mgr, um_device *d) {
  um_device_info info;
  if (mgr->devices == NULL || um_device_info_get(d, &info) != UM_OK || info.index < 0 ||
      info.index >= PyTuple_GET_SIZE(mgr->devices))
    return NULL;
  return PyTuple_GET_ITEM(mgr->devices, info.index);
}

int pyum_device_index(ManagerObject *mgr, PyObject *o, int *index) {
  Py_ssize_t n = mgr->devices != NULL ? PyTuple_GET_SIZE(mgr->devices) : 0;
  long i;
  int overflow = 0;
  PyObject *device = NULL;
  if (Py_IS_TYPE(o, Device_Type)) {
    device = o;
    o = PyStructSequence_GET_ITEM(o, 0);
  }
  if (!PyLong_Check(o)) {
    PyErr_Format(PyExc_TypeError, "device must be an int or a unimem.Device, not %.100s", Py_TYPE(o)->tp_name);
    return -1;
  }
  i = PyLong_AsLongAndOverflow(o, &overflow);
  if (i == -1 && PyErr_Occurred())
    return -1;
  if (overflow || i < 0 || i >= n) {
    pyum_raise_msg(UM_ENODEV, "no device %ld: the manager has %zd", i, n);
    return -1;
  }
  /* A Device is one of this manager's own (m.devices), not another's of
   * the same index. */
  if (device != NULL && PyTuple_GET_ITEM(mgr->devices, i) != device) {
    pyum_raise_msg(UM_EINVAL, "device %ld is a Device of another manager", i);
    return -1;
  }
  *index = (int)i;
  return 0;
}

static PyObject *Manager_get_devices(ManagerObject *self, void *closure) {
  (void)closure;
  return self->devices != NULL ? PySequence_List(self->devices) : PyList_New(0);
}

/* ---- Life cycle ------------------------------------------------------------ */

int pyum_manager_check(ManagerObject *mgr) {
  if (mgr->closed || mgr->m == NULL) {
    pyum_raise_msg(UM_ESTATE, "the manager is closed");
    return -1;
  }
  return 0;
}

/* Report a failure where no exception can propagate (deallocation, a view
 * released), keeping any exception in flight. */
static void report_unraisable(int st, PyObject *obj) {
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  pyum_raise(st);
  PyErr_WriteUnraisable(obj);
  PyErr_Restore(type, value, tb);
}

int pyum_manager_maybe_destroy(ManagerObject *mgr, int raise_errors) {
  um_manager *m = mgr->m;
  int st;
  if (!mgr->closed || m == NULL || mgr->calls > 0 || mgr->handles > 0)
    return UM_OK;
  mgr->m = NULL;
  Py_BEGIN_ALLOW_THREADS
  st = um_manager_destroy(m);
  Py_END_ALLOW_THREADS
  if (st != UM_OK) {
    if (raise_errors)
      pyum_raise(st);
    else
      report_unraisable(st, (PyObject *)mgr);
  }
  if (mgr->sink != NULL) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    pyum_sink_flush(mgr->sink);
    PyErr_Restore(type, value, tb);
  }
  return st;
}

static PyObject *Manager_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
  ManagerObject *self;
  um_manager *m = NULL;
  um_options o;
  int st;
  if (args != NULL && PyTuple_GET_SIZE(args) > 0)
    return PyErr_Format(PyExc_TypeError, "Manager() takes keyword arguments only (%zd positional given)",
                        PyTuple_GET_SIZE(args));
  if ((self = (ManagerObject *)type->tp_alloc(type, 0)) == NULL)
    return NULL;
  if (parse_options(self, kwds, &o) < 0)
    goto fail;
  if (self->log != NULL) {
    if ((self->sink = pyum_sink_new(self)) == NULL)
      goto fail;
    o.log = pyum_log_hook;
    o.log_ctx = self->sink;
  }
  if (self->on_oom != NULL) {
    o.on_oom = pyum_oom_hook;
    o.oom_ctx = self;
  }
  Py_BEGIN_ALLOW_THREADS
  st = um_manager_create(&o, &m);
  Py_END_ALLOW_THREADS
  if (st != UM_OK) {
    pyum_raise(st);
    goto fail;
  }
  self->m = m;
  um_manager_options(m, &self->opts);
  if ((self->devices = devices_new(m)) == NULL)
    goto fail;
  pyum_sink_flush(self->sink);
  return (PyObject *)self;
fail:
  Py_DECREF(self); /* destroys m, delivers the queued messages */
  return NULL;
}

static int Manager_traverse(ManagerObject *self, visitproc visit, void *arg) {
  Py_VISIT(self->devices);
  Py_VISIT(self->log);
  Py_VISIT(self->log_ctx);
  Py_VISIT(self->on_oom);
  Py_VISIT(self->oom_ctx);
  return 0;
}

/* Breaks the cycles a callback closing over its manager makes. */
static int Manager_clear(ManagerObject *self) {
  Py_CLEAR(self->log);
  Py_CLEAR(self->log_ctx);
  Py_CLEAR(self->on_oom);
  Py_CLEAR(self->oom_ctx);
  return 0;
}

static void Manager_dealloc(ManagerObject *self) {
  PyObject_GC_UnTrack(self);
  if (self->weakrefs != NULL)
    PyObject_ClearWeakRefs((PyObject *)self);
  /* Every Buffer, Event, Mapping and Access holds a reference: none is
   * left, so no access is open, and the orphans' operations (which hold no
   * Buffer here) can be waited for. */
  self->closed = 1;
  pyum_orphans_reap(self, 1);
  pyum_manager_maybe_destroy(self, 0);
  pyum_sink_free(self->sink);
  self->sink = NULL;
  Manager_clear(self);
  Py_CLEAR(self->devices);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Lists holding a new reference to each live event / buffer: close() works
 * on them with the GIL released at times, while the registries change. */
static PyObject *events_snapshot(ManagerObject *self) {
  PyObject *list = PyList_New(0);
  for (EventObject *e = self->events; list != NULL && e != NULL; e = e->next)
    if (PyList_Append(list, (PyObject *)e) < 0)
      Py_CLEAR(list);
  return list;
}

static PyObject *buffers_snapshot(ManagerObject *self) {
  PyObject *list = PyList_New(0);
  for (BufferObject *b = self->buffers; list != NULL && b != NULL; b = b->next)
    if (PyList_Append(list, (PyObject *)b) < 0)
      Py_CLEAR(list);
  return list;
}

PyDoc_STRVAR(close_doc,
"close($self)\n--\n\n"
"Close the manager: wait for pending operations, release every live buffer\n"
"and free the devices' memory. Memory that a live view still points into (a\n"
"numpy array or memoryview of a buffer, a mapping) is freed when the last such\n"
"view is released; the manager's C side is destroyed then. Using the manager\n"
"or its buffers afterwards raises InvalidState. Closing twice does nothing.\n"
"InvalidState, naming the buffer, while an access of one of its buffers is\n"
"open (on any thread): operations queued behind it would wait for an end\n"
"that only its owner can make. End the accesses first; the manager stays open.");

/* InvalidState naming an open access of mgr's buffers; 0 when none is. */
static int refuse_open_access(ManagerObject *self) {
  BufferObject *b = self->buffers;
  PyObject *r;
  const char *text;
  if (self->accesses == 0)
    return 0;
  while (b != NULL && b->accesses == 0)
    b = b->next;
  if ((r = PyObject_Repr(b != NULL ? (PyObject *)b : Py_None)) == NULL || (text = PyUnicode_AsUTF8(r)) == NULL) {
    Py_XDECREF(r);
    return -1;
  }
  pyum_raise_msg(UM_ESTATE, "close(): an access of %s is open (%zd access%s open in all); end %s first "
                 "(its with block, or Access.end())", text, self->accesses, self->accesses == 1 ? "" : "es",
                 self->accesses == 1 ? "it" : "them");
  Py_DECREF(r);
  return -1;
}

static PyObject *Manager_close(ManagerObject *self, PyObject *unused) {
  PyObject *events, *buffers;
  (void)unused;
  if (self->closed)
    Py_RETURN_NONE;
  if (refuse_open_access(self) < 0)
    return NULL;
  events = events_snapshot(self);
  buffers = events != NULL ? buffers_snapshot(self) : NULL;
  if (buffers == NULL) {
    Py_XDECREF(events);
    return NULL;
  }
  self->closed = 1;
  /* Events first: their host memory is let go once their operation ended. */
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(events); i++)
    pyum_event_finish_now((EventObject *)PyList_GET_ITEM(events, i));
  pyum_orphans_reap(self, 1);
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(buffers); i++)
    pyum_buffer_request_release((BufferObject *)PyList_GET_ITEM(buffers, i));
  Py_DECREF(events);
  Py_DECREF(buffers);
  if (pyum_manager_maybe_destroy(self, 1) != UM_OK)
    return NULL;
  Py_RETURN_NONE;
}

static int parse_location(PyObject *o, int *loc) {
  if (!PyUnicode_Check(o)) {
    PyErr_Format(PyExc_TypeError, "location must be a str, not %.100s", Py_TYPE(o)->tp_name);
    return -1;
  }
  for (int i = 0; i < UM_LOCATION_COUNT; i++)
    if (PyUnicode_CompareWithASCIIString(o, pyum_location_names[i]) == 0) {
      *loc = i;
      return 0;
    }
  pyum_raise_msg(UM_EINVAL, "location must be 'host', 'device', 'pinned' or 'unified'");
  return -1;
}

PyDoc_STRVAR(alloc_doc,
"alloc($self, nbytes, device=0, location='device', zero=False, tag=None)\n--\n\n"
"Allocate a Buffer of nbytes on a device (an index into devices, or a Device) at a\n"
"location: 'host', 'device', 'pinned' (page-locked) or 'unified'. zero=True:\n"
"the bytes read as zero. tag: the tag it counts for (None: the innermost\n"
"`with m.tag(name):` of this thread). Pooled: a released buffer's block serves the next\n"
"fitting request. NotSupported when the device has no such location,\n"
"OutOfMemory after the pool released its idle blocks (and on_oom declined).");

static PyObject *Manager_alloc(ManagerObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  static const char *const names[] = {"nbytes", "device", "location", "zero", "tag"};
  PyObject *a[5];
  ManagerObject *previous;
  um_buffer *b = NULL;
  size_t n;
  const char *tag = NULL;
  int dev = 0, loc = UM_DEVICE, zero, st;
  if (pyum_parse("alloc", args, nargs, kwnames, names, 5, 1, a) < 0 || pyum_size(a[0], "nbytes", &n) < 0 ||
      (a[1] != NULL && pyum_device_index(self, a[1], &dev) < 0) || (a[2] != NULL && parse_location(a[2], &loc) < 0) ||
      (zero = pyum_flag(a[3], 0)) < 0 || pyum_manager_check(self) < 0)
    return NULL;
  if (a[4] != NULL && a[4] != Py_None) {
    if (!PyUnicode_Check(a[4]))
      return PyErr_Format(PyExc_TypeError, "tag must be a str, not %.100s", Py_TYPE(a[4])->tp_name);
    if ((tag = PyUnicode_AsUTF8(a[4])) == NULL)
      return NULL;
  }
  pyum_orphans_reap(self, 0); /* their host memory and imports, when done */
  self->calls++;
  previous = pyum_oom_thread_swap(self);
  Py_BEGIN_ALLOW_THREADS
  st = um_alloc_tagged(self->m, um_device_get(self->m, dev), n, (um_location)loc, zero ? UM_ALLOC_ZERO : 0, tag, &b);
  Py_END_ALLOW_THREADS
  pyum_oom_thread_swap(previous);
  if (st != UM_OK)
    pyum_raise(st);
  else if (self->closed) { /* on_oom or another thread closed it meanwhile */
    um_release(b);
    pyum_raise_msg(UM_ESTATE, "the manager was closed while allocating");
    st = UM_ESTATE;
  }
  self->calls--;
  if (st != UM_OK) {
    pyum_manager_maybe_destroy(self, 0);
    return NULL;
  }
  return pyum_buffer_new(self, b);
}

static PyObject *stats_dict(const um_stats *s) {
  PyObject *out = PyDict_New(), *v;
  if (out == NULL)
    return NULL;
#define PYUM_STAT_VALUE_(x) _Generic((x), double: PyFloat_FromDouble, default: PyLong_FromUnsignedLongLong)(x)
#define PYUM_STAT_ITEM_(type, name, desc)                                                                        \
  v = PYUM_STAT_VALUE_(s->name);                                                                                 \
  if (v == NULL || PyDict_SetItemString(out, #name, v) < 0) {                                                    \
    Py_XDECREF(v);                                                                                               \
    Py_DECREF(out);                                                                                              \
    return NULL;                                                                                                 \
  }                                                                                                              \
  Py_DECREF(v);
  UM_STATS_FIELDS(PYUM_STAT_ITEM_)
#undef PYUM_STAT_ITEM_
#undef PYUM_STAT_VALUE_
  return out;
}

PyDoc_STRVAR(stats_doc,
"stats($self, device=None)\n--\n\n"
"A dict of the statistics of one device (an index or a Device), or of all devices\n"
"together: one entry per field of unimem.stats_fields().");

static PyObject *Manager_stats(ManagerObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  static const char *const names[] = {"device"};
  PyObject *a[1];
  um_stats s;
  int dev = -1, st;
  if (pyum_parse("stats", args, nargs, kwnames, names, 1, 0, a) < 0 ||
      (a[0] != NULL && a[0] != Py_None && pyum_device_index(self, a[0], &dev) < 0) || pyum_manager_check(self) < 0)
    return NULL;
  st = um_stats_get(self->m, dev >= 0 ? um_device_get(self->m, dev) : NULL, &s);
  if (st != UM_OK)
    return pyum_raise(st);
  return stats_dict(&s);
}

PyDoc_STRVAR(trim_doc,
"trim($self, keep_bytes=0)\n--\n\n"
"Give idle pool blocks back to their devices, oldest first, until at most\n"
"keep_bytes stay idle in all pools together.");

static PyObject *Manager_trim(ManagerObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  static const char *const names[] = {"keep_bytes"};
  PyObject *a[1];
  uint64_t keep = 0;
  int st;
  if (pyum_parse("trim", args, nargs, kwnames, names, 1, 0, a) < 0 ||
      (a[0] != NULL && pyum_u64(a[0], "keep_bytes", &keep) < 0) || pyum_manager_check(self) < 0)
    return NULL;
  self->calls++;
  Py_BEGIN_ALLOW_THREADS
  st = um_pool_trim(self->m, keep);
  Py_END_ALLOW_THREADS
  if (st != UM_OK)
    pyum_raise(st);
  self->calls--;
  pyum_manager_maybe_destroy(self, 0);
  if (st != UM_OK)
    return NULL;
  Py_RETURN_NONE;
}

static PyObject *Manager_enter(ManagerObject *self, PyObject *unused) {
  (void)unused;
  if (pyum_manager_check(self) < 0)
    return NULL;
  Py_INCREF(self);
  return (PyObject *)self;
}

static PyObject *Manager_exit(ManagerObject *self, PyObject *args) {
  PyObject *r;
  (void)args;
  r = Manager_close(self, NULL);
  if (r == NULL)
    return NULL;
  Py_DECREF(r);
  Py_RETURN_FALSE;
}

static PyObject *Manager_get_closed(ManagerObject *self, void *closure) {
  (void)closure;
  return PyBool_FromLong(self->closed);
}

static PyObject *Manager_repr(ManagerObject *self) {
  return PyUnicode_FromFormat("<unimem.Manager %s, %zd device(s)>", self->closed ? "closed" : "open",
                              self->devices != NULL ? PyTuple_GET_SIZE(self->devices) : (Py_ssize_t)0);
}

static PyMethodDef Manager_methods[] = {
    {"alloc", (PyCFunction)(void (*)(void))Manager_alloc, METH_FASTCALL | METH_KEYWORDS, alloc_doc},
    {"wrap_host", (PyCFunction)(void (*)(void))pyum_manager_wrap_host, METH_FASTCALL | METH_KEYWORDS,
     pyum_wrap_host_doc},
    {"map_file", (PyCFunction)(void (*)(void))pyum_manager_map_file, METH_FASTCALL | METH_KEYWORDS,
     pyum_map_file_doc},
    {"stats", (PyCFunction)(void (*)(void))Manager_stats, METH_FASTCALL | METH_KEYWORDS, stats_doc},
    {"trim", (PyCFunction)(void (*)(void))Manager_trim, METH_FASTCALL | METH_KEYWORDS, trim_doc},
    {"close", (PyCFunction)Manager_close, METH_NOARGS, close_doc},
    {"native", (PyCFunction)(void (*)(void))pyum_manager_native, METH_FASTCALL | METH_KEYWORDS,
     PyDoc_STR("native($self, device=0)\n--\n\nThe native handles of a device, as a dict of ints (None where "
               "they do not apply): backend, cl_platform, cl_device, cl_context (unimem's buffers live in it), "
               "cl_queue (an in-order queue for the caller's own commands), cu_device (-1 when not CUDA), "
               "cu_context, cu_stream. They belong to unimem and stay valid until the manager is closed.")},
    {"use_queue", (PyCFunction)(void (*)(void))pyum_manager_use_queue, METH_FASTCALL | METH_KEYWORDS,
     PyDoc_STR("use_queue($self, device, queue)\n--\n\nRun this thread's copies, fills and accesses of the device's "
               "buffers on queue (um_queue_use): a pyopencl.CommandQueue (in order, of the device's context), or a "
               "CuPy / PyTorch CUDA stream; None goes back to unimem's own queues. Kernels enqueued on the same "
               "queue then need no done event, and no wait_for for device buffers ('device' location): "
               "access().wait_for is empty. Copies of host-visible buffers ('pinned', 'host') run on host "
               "threads, not on the queue: pass wait_for=ac.wait_for (empty when nothing is pending, so it is "
               "always safe). NotSupported for the cpu device or an out-of-order queue; InvalidArgument for a "
               "queue of another context or device, or a Device of another manager.")},
    {"pyopencl_queue", (PyCFunction)(void (*)(void))pyum_manager_pyopencl_queue, METH_FASTCALL | METH_KEYWORDS,
     PyDoc_STR("pyopencl_queue($self, device)\n--\n\nA pyopencl.CommandQueue over the device's queue for the "
               "caller's own commands (in-order; its .context is unimem's context of the device). NotSupported "
               "for a device that is not OpenCL; ImportError without pyopencl.")},
    {"tag_stats", (PyCFunction)(void (*)(void))pyum_manager_tag_stats, METH_FASTCALL | METH_KEYWORDS,
     PyDoc_STR("tag_stats($self, device=None)\n--\n\nEvery tag's statistics (um_tag_stats_get) on a device, or on "
               "all devices: {name: {active_buffers, bytes_in_use, peak_bytes_in_use, allocations, releases, "
               "bytes_h2d, bytes_d2h, bytes_d2d, bytes_peer, bytes_net_out, bytes_net_in}}; '' is the untagged. "
               "Empty before the first tag (with m.tag(name):).")},
    {"snapshot", (PyCFunction)pyum_manager_snapshot, METH_NOARGS,
     PyDoc_STR("snapshot($self)\n--\n\nEvery segment and block of every device now (um_snapshot_take): "
               "{time_ns, segments: [{device, location, address, size, committed, virtual}], blocks: [{device, "
               "location, state ('in_use', 'released', 'idle', 'free'), segment, offset, address, size, capacity, "
               "tag, thread, age_ns, site, frames (return addresses: the backtraces option), wrapped}]}.")},
    {"tag", (PyCFunction)pyum_manager_tag, METH_O,
     PyDoc_STR("tag($self, name)\n--\n\nwith m.tag(name): what this thread allocates, copies, fills, puts and "
               "gets inside counts for tag name (nested: the innermost), in tag_stats(), snapshot() and the "
               "history. From the first tag on, allocations take the pool's locked path.")},
    {"history", (PyCFunction)(void (*)(void))pyum_manager_history, METH_FASTCALL | METH_KEYWORDS,
     PyDoc_STR("history($self, capacity=1048576)\n--\n\nwith m.history() as h: records the manager's events "
               "into a ring of capacity events; afterwards h.events() lists them (dicts), h.dropped counts the "
               "overwritten, h.save(path) writes Chrome trace-event JSON (ui.perfetto.dev, `unimem view`).")},
    {"_tag_push", (PyCFunction)pyum_manager_tag_push, METH_O, PyDoc_STR("_tag_push($self, name)\n--\n\num_tag_push (use: with m.tag(name):).")},
    {"_tag_pop", (PyCFunction)pyum_manager_tag_pop, METH_NOARGS, PyDoc_STR("_tag_pop($self)\n--\n\num_tag_pop.")},
    {"_history_start", (PyCFunction)pyum_manager_history_start, METH_O, PyDoc_STR("_history_start($self, capacity)\n--\n\num_history_start (use: with m.history():).")},
    {"_history_stop", (PyCFunction)pyum_manager_history_stop, METH_NOARGS, PyDoc_STR("_history_stop($self)\n--\n\num_history_stop.")},
    {"_history_events", (PyCFunction)pyum_manager_history_events, METH_NOARGS,
     PyDoc_STR("_history_events($self)\n--\n\n([event dicts], dropped): um_history_get.")},
    {"_history_save", (PyCFunction)pyum_manager_history_save, METH_O, PyDoc_STR("_history_save($self, path)\n--\n\num_history_write.")},
    {"__enter__", (PyCFunction)Manager_enter, METH_NOARGS, PyDoc_STR("The manager itself.")},
    {"__exit__", (PyCFunction)Manager_exit, METH_VARARGS, PyDoc_STR("close()")},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Manager_getset[] = {
    {"devices", (getter)Manager_get_devices, NULL,
     PyDoc_STR("[Device(index, name, backend, total_bytes, locations)]; index 0 is the host CPU."), NULL},
    {"options", (getter)Manager_get_options, NULL,
     PyDoc_STR("The options the manager runs with (defaults, UNIMEM_* environment, keywords), as a dict."),
     NULL},
    {"closed", (getter)Manager_get_closed, NULL, PyDoc_STR("True once close() was called."), NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyDoc_STRVAR(Manager_doc,
"Manager(**options)\n--\n\n"
"Owns devices, pools and the transfer engine. One keyword per field of the C\n"
"um_options (see unimem.OPTION_NAMES); unset ones take their defaults and\n"
"the UNIMEM_<NAME> environment variables. log(log_ctx, level, message) and\n"
"on_oom(oom_ctx, device, nbytes) -> bool take Python callables; log messages\n"
"from unimem's own threads arrive on the main thread, on_oom is asked only\n"
"for allocations made from Python. A context manager: close() on exit.");

PyTypeObject Manager_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "unimem.Manager",
    .tp_basicsize = sizeof(ManagerObject),
    .tp_dealloc = (destructor)Manager_dealloc,
    .tp_repr = (reprfunc)Manager_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = Manager_doc,
    .tp_traverse = (traverseproc)Manager_traverse,
    .tp_clear = (inquiry)Manager_clear,
    .tp_weaklistoffset = offsetof(ManagerObject, weakrefs),
    .tp_methods = Manager_methods,
    .tp_getset = Manager_getset,
    .tp_new = Manager_new,
};
