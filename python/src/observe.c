/* Seeing the memory from Python: the Manager's tag_stats(), snapshot()
 * and the primitives that unimem/__init__.py wraps in context managers
 * (m.tag(name), m.history()): _tag_push, _tag_pop, _history_start,
 * _history_stop, _history_events, _history_save. */
#include "pyunimem.h" /* Python.h first, as Python asks */

#include <string.h>

/* d[key] = v, stealing v; -1 with an exception. */
static int put(PyObject *d, const char *key, PyObject *v) {
  int rc;
  if (v == NULL)
    return -1;
  rc = PyDict_SetItemString(d, key, v);
  Py_DECREF(v);
  return rc;
}

static PyObject *str_or_none(const char *s) {
  if (s == NULL)
    Py_RETURN_NONE;
  return PyUnicode_DecodeUTF8(s, (Py_ssize_t)strlen(s), "replace");
}

static PyObject *u64(uint64_t v) { return PyLong_FromUnsignedLongLong(v); }

PyObject *pyum_manager_tag_push(ManagerObject *self, PyObject *name) {
  const char *s;
  int st;
  if (pyum_manager_check(self) < 0)
    return NULL;
  if (!PyUnicode_Check(name))
    return PyErr_Format(PyExc_TypeError, "a tag is a str, not %.100s", Py_TYPE(name)->tp_name);
  if ((s = PyUnicode_AsUTF8(name)) == NULL)
    return NULL;
  if ((st = um_tag_push(self->m, s)) != UM_OK)
    return pyum_raise(st);
  Py_RETURN_NONE;
}

PyObject *pyum_manager_tag_pop(ManagerObject *self, PyObject *unused) {
  int st;
  (void)unused;
  if (pyum_manager_check(self) < 0)
    return NULL;
  if ((st = um_tag_pop(self->m)) != UM_OK)
    return pyum_raise(st);
  Py_RETURN_NONE;
}

static PyObject *tag_dict(const um_tag_stats *t) {
  PyObject *d = PyDict_New();
  if (d == NULL)
    return NULL;
  if (put(d, "name", str_or_none(t->name)) < 0 || put(d, "active_buffers", u64(t->active_buffers)) < 0 ||
      put(d, "bytes_in_use", u64(t->bytes_in_use)) < 0 || put(d, "peak_bytes_in_use", u64(t->peak_bytes_in_use)) < 0 ||
      put(d, "allocations", u64(t->allocations)) < 0 || put(d, "releases", u64(t->releases)) < 0 ||
      put(d, "bytes_h2d", u64(t->bytes_h2d)) < 0 || put(d, "bytes_d2h", u64(t->bytes_d2h)) < 0 ||
      put(d, "bytes_d2d", u64(t->bytes_d2d)) < 0 || put(d, "bytes_peer", u64(t->bytes_peer)) < 0 ||
      put(d, "bytes_net_out", u64(t->bytes_net_out)) < 0 || put(d, "bytes_net_in", u64(t->bytes_net_in)) < 0) {
    Py_DECREF(d);
    return NULL;
  }
  return d;
}

PyObject *pyum_manager_tag_stats(ManagerObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  static const char *const names[] = {"device"};
  PyObject *a[1], *out;
  um_tag_stats *t;
  int dev = -1, n;
  if (pyum_parse("tag_stats", args, nargs, kwnames, names, 1, 0, a) < 0 ||
      (a[0] != NULL && a[0] != Py_None && pyum_device_index(self, a[0], &dev) < 0) || pyum_manager_check(self) < 0)
    return NULL;
  um_device *d = dev >= 0 ? um_device_get(self->m, dev) : NULL;
  if ((n = um_tag_stats_get(self->m, d, NULL, 0)) < 0)
    return pyum_raise(n);
  if ((t = PyMem_Calloc((size_t)n + 1, sizeof(*t))) == NULL)
    return PyErr_NoMemory();
  n = um_tag_stats_get(self->m, d, t, n);
  if (n < 0) {
    PyMem_Free(t);
    return pyum_raise(n);
  }
  if ((out = PyDict_New()) != NULL)
    for (int i = 0; i < n; i++) {
      PyObject *v = tag_dict(&t[i]);
      if (v == NULL || PyDict_SetItemString(out, t[i].name, v) < 0) {
        Py_XDECREF(v);
        Py_CLEAR(out);
        break;
      }
      Py_DECREF(v);
    }
  PyMem_Free(t);
  return out;
}

static const char *const state_names[] = {"in_use", "released", "idle", "free"};

static PyObject *segment_dict(const um_snapshot_segment *g) {
  PyObject *d = PyDict_New();
  if (d == NULL)
    return NULL;
  if (put(d, "device", PyLong_FromLong(g->device)) < 0 ||
      put(d, "location", str_or_none(pyum_location_names[g->loc])) < 0 || put(d, "address", u64(g->address)) < 0 ||
      put(d, "size", u64(g->size)) < 0 || put(d, "committed", u64(g->committed)) < 0 ||
      put(d, "virtual", PyBool_FromLong(g->virtual_memory)) < 0) {
    Py_DECREF(d);
    return NULL;
  }
  return d;
}

static PyObject *block_dict(const um_snapshot_block *b) {
  PyObject *d = PyDict_New(), *site, *frames = PyList_New(b->nframes);
  if (d == NULL || frames == NULL) {
    Py_XDECREF(d);
    Py_XDECREF(frames);
    return NULL;
  }
  for (int k = 0; k < b->nframes; k++) {
    PyObject *a = PyLong_FromVoidPtr(b->frames[k]);
    if (a == NULL) {
      Py_DECREF(d);
      Py_DECREF(frames);
      return NULL;
    }
    PyList_SET_ITEM(frames, k, a);
  }
  if (put(d, "frames", frames) < 0) {
    Py_DECREF(d);
    return NULL;
  }
  if (b->site_file != NULL)
    site = PyUnicode_FromFormat("%s:%d", b->site_file, b->site_line);
  else
    site = Py_NewRef(Py_None);
  if (put(d, "device", PyLong_FromLong(b->device)) < 0 ||
      put(d, "location", str_or_none(pyum_location_names[b->loc])) < 0 ||
      put(d, "state", str_or_none(state_names[b->state])) < 0 || put(d, "segment", PyLong_FromLong(b->segment)) < 0 ||
      put(d, "offset", u64(b->offset)) < 0 || put(d, "address", u64(b->address)) < 0 ||
      put(d, "size", u64(b->size)) < 0 || put(d, "capacity", u64(b->capacity)) < 0 ||
      put(d, "tag", str_or_none(b->tag)) < 0 || put(d, "thread", PyLong_FromUnsignedLong(b->thread)) < 0 ||
      put(d, "age_ns", u64(b->age_ns)) < 0 || put(d, "site", site) < 0 ||
      put(d, "wrapped", PyBool_FromLong(b->wrapped)) < 0) {
    Py_DECREF(d);
    return NULL;
  }
  return d;
}

/* A list of n dicts made by fn from items of size each. */
static PyObject *list_of(const void *items, size_t n, size_t size, PyObject *(*fn)(const void *)) {
  PyObject *l = PyList_New((Py_ssize_t)n);
  for (size_t i = 0; l != NULL && i < n; i++) {
    PyObject *v = fn((const char *)items + i * size);
    if (v == NULL) {
      Py_CLEAR(l);
      break;
    }
    PyList_SET_ITEM(l, (Py_ssize_t)i, v);
  }
  return l;
}

static PyObject *segment_any(const void *p) { return segment_dict(p); }
static PyObject *block_any(const void *p) { return block_dict(p); }

PyObject *pyum_manager_snapshot(ManagerObject *self, PyObject *unused) {
  um_snapshot *s = NULL;
  PyObject *d;
  int st;
  (void)unused;
  if (pyum_manager_check(self) < 0)
    return NULL;
  Py_BEGIN_ALLOW_THREADS
  st = um_snapshot_take(self->m, &s);
  Py_END_ALLOW_THREADS
  if (st != UM_OK)
    return pyum_raise(st);
  d = PyDict_New();
  if (d != NULL && (put(d, "time_ns", u64(s->time_ns)) < 0 ||
                    put(d, "segments", list_of(s->segments, s->nsegments, sizeof(*s->segments), segment_any)) < 0 ||
                    put(d, "blocks", list_of(s->blocks, s->nblocks, sizeof(*s->blocks), block_any)) < 0))
    Py_CLEAR(d);
  um_snapshot_free(s);
  return d;
}

PyObject *pyum_manager_history_start(ManagerObject *self, PyObject *capacity) {
  size_t n;
  int st;
  if (pyum_manager_check(self) < 0 || pyum_size(capacity, "capacity", &n) < 0)
    return NULL;
  if ((st = um_history_start(self->m, n)) != UM_OK)
    return pyum_raise(st);
  Py_RETURN_NONE;
}

PyObject *pyum_manager_history_stop(ManagerObject *self, PyObject *unused) {
  int st;
  (void)unused;
  if (pyum_manager_check(self) < 0)
    return NULL;
  if ((st = um_history_stop(self->m)) != UM_OK)
    return pyum_raise(st);
  Py_RETURN_NONE;
}

static const char *const kind_names[] = {"alloc", "release", "trim",    "copy", "fill",
                                         "bracket", "net_put", "net_get", "map",  "oom"};

static PyObject *event_dict(const void *p) {
  const um_history_event *e = p;
  PyObject *d = PyDict_New(), *site;
  if (d == NULL)
    return NULL;
  if (e->site_file != NULL)
    site = PyUnicode_FromFormat("%s:%d", e->site_file, e->site_line);
  else
    site = Py_NewRef(Py_None);
  const char *how = e->how == UM_HIST_POOL ? "pool" : e->how == UM_HIST_CARVE ? "carve" : "device";
  if (put(d, "kind", str_or_none((unsigned)e->kind < 10 ? kind_names[e->kind] : "?")) < 0 ||
      put(d, "device", PyLong_FromLong(e->device)) < 0 || put(d, "src_device", PyLong_FromLong(e->src_device)) < 0 ||
      put(d, "dst_device", PyLong_FromLong(e->dst_device)) < 0 ||
      put(d, "location", str_or_none(pyum_location_names[e->loc])) < 0 ||
      put(d, "status", PyLong_FromLong(e->status)) < 0 ||
      put(d, "how", str_or_none(e->kind == UM_HIST_ALLOC ? how : NULL)) < 0 ||
      put(d, "thread", PyLong_FromUnsignedLong(e->thread)) < 0 || put(d, "tag", str_or_none(e->tag)) < 0 ||
      put(d, "path", str_or_none(e->path)) < 0 || put(d, "begin_ns", u64(e->begin_ns)) < 0 ||
      put(d, "end_ns", u64(e->end_ns)) < 0 || put(d, "bytes", u64(e->bytes)) < 0 ||
      put(d, "address", u64(e->address)) < 0 || put(d, "in_use", u64(e->in_use)) < 0 || put(d, "site", site) < 0) {
    Py_DECREF(d);
    return NULL;
  }
  return d;
}

PyObject *pyum_manager_history_events(ManagerObject *self, PyObject *unused) {
  um_history_event *ev;
  size_t n, held;
  uint64_t dropped;
  PyObject *out;
  (void)unused;
  if (pyum_manager_check(self) < 0)
    return NULL;
  um_history_get(self->m, NULL, 0, &n, NULL);
  if ((ev = PyMem_Calloc(n + 1, sizeof(*ev))) == NULL)
    return PyErr_NoMemory();
  um_history_get(self->m, ev, n, &held, &dropped); /* it may hold more by now: n of them were copied */
  out = list_of(ev, n < held ? n : held, sizeof(*ev), event_dict);
  PyMem_Free(ev);
  if (out == NULL)
    return NULL;
  return Py_BuildValue("(NK)", out, (unsigned long long)dropped);
}

PyObject *pyum_manager_history_save(ManagerObject *self, PyObject *path) {
  PyObject *bytes;
  int st;
  if (pyum_manager_check(self) < 0)
    return NULL;
  if (!PyUnicode_FSConverter(path, &bytes))
    return NULL;
  Py_BEGIN_ALLOW_THREADS
  st = um_history_write(self->m, PyBytes_AS_STRING(bytes));
  Py_END_ALLOW_THREADS
  Py_DECREF(bytes);
  if (st != UM_OK)
    return pyum_raise(st);
  Py_RETURN_NONE;
}

/* The package's context managers (unimem/__init__.py). */
static PyObject *tag_class, *history_class;

PyObject *pyum_set_observe_classes(PyObject *mod, PyObject *args) {
  PyObject *t, *h;
  (void)mod;
  if (!PyArg_ParseTuple(args, "OO:_set_observe_classes", &t, &h))
    return NULL;
  if (!PyCallable_Check(t) || !PyCallable_Check(h))
    return PyErr_Format(PyExc_TypeError, "_set_observe_classes: two classes");
  Py_XSETREF(tag_class, Py_NewRef(t));
  Py_XSETREF(history_class, Py_NewRef(h));
  Py_RETURN_NONE;
}

PyObject *pyum_manager_tag(ManagerObject *self, PyObject *name) {
  if (tag_class == NULL)
    return PyErr_Format(PyExc_RuntimeError, "unimem._core used without the unimem package");
  if (!PyUnicode_Check(name))
    return PyErr_Format(PyExc_TypeError, "a tag is a str, not %.100s", Py_TYPE(name)->tp_name);
  return PyObject_CallFunctionObjArgs(tag_class, (PyObject *)self, name, NULL);
}

PyObject *pyum_manager_history(ManagerObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  static const char *const names[] = {"capacity"};
  PyObject *a[1], *cap, *r;
  size_t n = (size_t)1 << 20;
  if (pyum_parse("history", args, nargs, kwnames, names, 1, 0, a) < 0 || (a[0] != NULL && pyum_size(a[0], "capacity", &n) < 0))
    return NULL;
  if (history_class == NULL)
    return PyErr_Format(PyExc_RuntimeError, "unimem._core used without the unimem package");
  if ((cap = PyLong_FromSize_t(n)) == NULL)
    return NULL;
  r = PyObject_CallFunctionObjArgs(history_class, (PyObject *)self, cap, NULL);
  Py_DECREF(cap);
  return r;
}
