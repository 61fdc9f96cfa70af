/* The caller's own device work on unimem memory from Python (SPEC §8):
 * native handles as ints (Manager.native, Buffer.native), pyopencl objects
 * over them (Buffer.to_pyopencl, Manager.pyopencl_queue), and the access
 * bracket as a context manager (Buffer.access, unimem.access over several
 * buffers -> Access).
 *
 * An open Access counts as one export of each of its Buffers: release()
 * and close() wait for it to end, as for a mapping. */
#include "pyunimem.h"

/* An address as an int, or None for NULL. */
static PyObject *address(const void *p) {
  if (p == NULL)
    Py_RETURN_NONE;
  return PyLong_FromVoidPtr((void *)p);
}

static int set_item(PyObject *dict, const char *key, PyObject *value) {
  int rc = value != NULL ? PyDict_SetItemString(dict, key, value) : -1;
  Py_XDECREF(value);
  return rc;
}

PyObject *pyum_manager_native(ManagerObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  static const char *const names[] = {"device"};
  PyObject *a[1], *out;
  um_device_native n;
  int dev = 0, st;
  if (pyum_parse("native", args, nargs, kwnames, names, 1, 0, a) < 0 ||
      (a[0] != NULL && pyum_device_index(self, a[0], &dev) < 0) || pyum_manager_check(self) < 0)
    return NULL;
  if ((st = um_device_native_get(um_device_get(self->m, dev), &n)) != UM_OK)
    return pyum_raise(st);
  if ((out = PyDict_New()) == NULL)
    return NULL;
  if (set_item(out, "backend", PyUnicode_FromString(n.backend)) < 0 ||
      set_item(out, "cl_platform", address(n.cl_platform)) < 0 ||
      set_item(out, "cl_device", address(n.cl_device)) < 0 || set_item(out, "cl_context", address(n.cl_context)) < 0 ||
      set_item(out, "cl_queue", address(n.cl_queue)) < 0 || set_item(out, "cu_device", PyLong_FromLong(n.cu_device)) < 0 ||
      set_item(out, "cu_context", address(n.cu_context)) < 0 || set_item(out, "cu_stream", address(n.cu_stream)) < 0)
    Py_CLEAR(out);
  return out;
}

PyObject *pyum_buffer_native(BufferObject *self, PyObject *unused) {
  um_buffer_native n;
  PyObject *out;
  int st;
  (void)unused;
  if (pyum_buffer_check(self) < 0)
    return NULL;
  if ((st = um_buffer_native_get(self->b, &n)) != UM_OK)
    return pyum_raise(st);
  if ((out = PyDict_New()) == NULL)
    return NULL;
  if (set_item(out, "host", address(n.host)) < 0 || set_item(out, "cl_mem", address(n.cl_mem)) < 0 ||
      set_item(out, "svm", address(n.svm)) < 0 || set_item(out, "cu_ptr", PyLong_FromUnsignedLongLong(n.cu_ptr)) < 0 ||
      set_item(out, "offset", PyLong_FromSize_t(n.offset)) < 0)
    Py_CLEAR(out);
  return out;
}

/* pyopencl.<cls>.from_int_ptr(ptr, retain=True): pyopencl's own reference. */
static PyObject *pyopencl_from(const char *cls, void *ptr) {
  PyObject *mod = PyImport_ImportModule("pyopencl"), *type, *out;
  if (mod == NULL)
    return NULL;
  type = PyObject_GetAttrString(mod, cls);
  Py_DECREF(mod);
  if (type == NULL)
    return NULL;
  out = PyObject_CallMethod(type, "from_int_ptr", "(NO)", PyLong_FromVoidPtr(ptr), Py_True);
  Py_DECREF(type);
  return out;
}

/* A pyopencl memory object's parent (mem_info.ASSOCIATED_MEMOBJECT) with
 * its offset in it (mem_info.OFFSET) in *offset, None when it has none, or
 * NULL with an exception. */
static PyObject *pyopencl_mem_parent(PyObject *buf, Py_ssize_t *offset) {
  PyObject *mod = PyImport_ImportModule("pyopencl"), *info = NULL, *key = NULL, *parent = NULL, *off = NULL;
  if (mod != NULL)
    info = PyObject_GetAttrString(mod, "mem_info");
  if (info != NULL)
    key = PyObject_GetAttrString(info, "ASSOCIATED_MEMOBJECT");
  if (key != NULL)
    parent = PyObject_CallMethod(buf, "get_info", "(O)", key);
  if (parent != NULL && parent != Py_None) {
    Py_DECREF(key);
    key = PyObject_GetAttrString(info, "OFFSET");
    if (key != NULL)
      off = PyObject_CallMethod(buf, "get_info", "(O)", key);
    if (off == NULL || (*offset = PyLong_AsSsize_t(off)) < 0)
      Py_CLEAR(parent);
  }
  Py_XDECREF(off);
  Py_XDECREF(key);
  Py_XDECREF(info);
  Py_XDECREF(mod);
  return parent;
}

/* The pyopencl.Buffer of the buffer's exact bytes, made on the first call
 * and the same object after (a kernel argument in a loop costs a check and
 * a reference); the buffer's release drops it, and a call after that
 * raises. */
static PyObject *make_pyopencl(BufferObject *self);

PyObject *pyum_buffer_to_pyopencl(BufferObject *self, PyObject *unused) {
  (void)unused;
  if (pyum_buffer_check(self) < 0)
    return NULL;
  if (self->cl_view == NULL) {
    /* Making it runs Python code (the import, pyopencl's constructors):
     * another thread may release the buffer or make the view meanwhile. */
    PyObject *made = make_pyopencl(self);
    if (made == NULL)
      return NULL;
    if (pyum_buffer_check(self) < 0) {
      Py_DECREF(made);
      return NULL;
    }
    if (self->cl_view == NULL)
      self->cl_view = made;
    else
      Py_DECREF(made);
  }
  Py_INCREF(self->cl_view);
  return self->cl_view;
}

static PyObject *make_pyopencl(BufferObject *self) {
  um_buffer_native n;
  PyObject *buf, *sub;
  int st;
  if ((st = um_buffer_native_get(self->b, &n)) != UM_OK)
    return pyum_raise(st);
  if (n.cl_mem == NULL)
    return pyum_raise_msg(UM_ENOTSUP, "to_pyopencl(): this '%s' buffer on device %d has no cl_mem",
                          pyum_location_names[self->location], self->device);
  /* The cl_mem itself where it is exactly the buffer, else the buffer's
   * region of it (the block may be larger than the buffer). */
  if ((buf = pyopencl_from("Buffer", n.cl_mem)) == NULL)
    return NULL;
  if (n.offset == 0) {
    PyObject *size = PyObject_GetAttrString(buf, "size");
    Py_ssize_t whole = size != NULL ? PyLong_AsSsize_t(size) : -1;
    Py_XDECREF(size);
    if (whole == (Py_ssize_t)self->size)
      return buf;
    PyErr_Clear();
  }
  /* OpenCL makes no sub-buffer of a sub-buffer, which a block carved from
   * a segment is: the region is then its parent's, at its offset. */
  {
    Py_ssize_t base = 0;
    PyObject *parent = pyopencl_mem_parent(buf, &base);
    if (parent == NULL) {
      Py_DECREF(buf);
      return NULL;
    }
    if (parent != Py_None) {
      Py_DECREF(buf);
      buf = parent;
    } else {
      Py_DECREF(parent);
    }
    sub = PyObject_CallMethod(buf, "get_sub_region", "(nn)", base + (Py_ssize_t)n.offset, (Py_ssize_t)self->size);
  }
  Py_DECREF(buf);
  return sub;
}

/* Manager.use_queue(device, queue): um_queue_use with a pyopencl.CommandQueue
 * (int_ptr), a CuPy / PyTorch CUDA stream (ptr, cuda_stream), or None. */
PyObject *pyum_manager_use_queue(ManagerObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  static const char *const names[] = {"device", "queue"};
  static const char *const attrs[] = {"int_ptr", "cuda_stream", "ptr"};
  PyObject *a[2], *n = NULL;
  void *queue = NULL;
  int dev = 0, st;
  if (pyum_parse("use_queue", args, nargs, kwnames, names, 2, 2, a) < 0 || pyum_device_index(self, a[0], &dev) < 0 ||
      pyum_manager_check(self) < 0)
    return NULL;
  if (a[1] != Py_None) {
    for (int i = 0; !PyLong_Check(a[1]) && n == NULL && i < 3; i++)
      if (PyObject_HasAttrString(a[1], attrs[i]) && (n = PyObject_GetAttrString(a[1], attrs[i])) == NULL)
        return NULL;
    if (n == NULL || !PyLong_Check(n)) {
      Py_XDECREF(n);
      return PyErr_Format(PyExc_TypeError, "use_queue(): queue must be a pyopencl.CommandQueue, a CuPy or PyTorch "
                          "CUDA stream, or None, not %.100s", Py_TYPE(a[1])->tp_name);
    }
    queue = PyLong_AsVoidPtr(n);
    Py_DECREF(n);
    if (queue == NULL && PyErr_Occurred())
      return NULL;
  }
  if ((st = um_queue_use(um_device_get(self->m, dev), queue)) != UM_OK)
    return pyum_raise(st);
  Py_RETURN_NONE;
}

PyObject *pyum_manager_pyopencl_queue(ManagerObject *self, PyObject *const *args, Py_ssize_t nargs,
                                      PyObject *kwnames) {
  static const char *const names[] = {"device"};
  PyObject *a[1];
  um_device_native n;
  int dev = 0, st;
  if (pyum_parse("pyopencl_queue", args, nargs, kwnames, names, 1, 1, a) < 0 ||
      pyum_device_index(self, a[0], &dev) < 0 || pyum_manager_check(self) < 0)
    return NULL;
  if ((st = um_device_native_get(um_device_get(self->m, dev), &n)) != UM_OK)
    return pyum_raise(st);
  if (n.cl_queue == NULL)
    return pyum_raise_msg(UM_ENOTSUP, "pyopencl_queue(): device %d is not an OpenCL device", dev);
  return pyopencl_from("CommandQueue", n.cl_queue);
}

/* ---- Access ---------------------------------------------------------------- */

/* One bracket per Buffer of a list (one Buffer for Buffer.access, several
 * for unimem.access: um_access_begin_n); each entry counts as one export of
 * its Buffer while the access is open, the access as one of the manager's. */
typedef struct AccessObject {
  PyObject_HEAD
  Py_ssize_t n;
  BufferObject **bufs;  /* n references (one_buf for a single Buffer) */
  um_map_mode *modes;   /* n modes (one_mode) */
  um_buffer **handles;  /* their C handles while open (one_handle) */
  int state;            /* 0 not begun, 1 open, 2 ended */
  void *wait;           /* the native wait handle (NULL: nothing to wait for) */
  void *done;           /* the caller's done event, given through .done */
  PyObject *done_obj;   /* the object it came from (kept until the end) */
  BufferObject *one_buf;
  um_map_mode one_mode;
  um_buffer *one_handle;
} AccessObject;

static PyTypeObject Access_Type;

static void access_free_arrays(AccessObject *self) {
  if (self->bufs != &self->one_buf)
    PyMem_Free(self->bufs), PyMem_Free(self->modes), PyMem_Free(self->handles);
  self->bufs = &self->one_buf, self->modes = &self->one_mode, self->handles = &self->one_handle;
}

static AccessObject *access_alloc(Py_ssize_t n) {
  AccessObject *self = PyObject_GC_New(AccessObject, &Access_Type);
  if (self == NULL)
    return NULL;
  self->n = 0;
  self->bufs = &self->one_buf;
  self->modes = &self->one_mode;
  self->handles = &self->one_handle;
  self->state = 0;
  self->wait = self->done = NULL;
  self->done_obj = NULL;
  if (n > 1) {
    self->bufs = PyMem_Calloc((size_t)n, sizeof(*self->bufs));
    self->modes = PyMem_Calloc((size_t)n, sizeof(*self->modes));
    self->handles = PyMem_Calloc((size_t)n, sizeof(*self->handles));
    if (self->bufs == NULL || self->modes == NULL || self->handles == NULL) {
      access_free_arrays(self);
      PyObject_GC_Del(self);
      PyErr_NoMemory();
      return NULL;
    }
  }
  return self;
}

PyObject *pyum_access_new(BufferObject *buf, um_map_mode mode) {
  AccessObject *self = access_alloc(1);
  if (self == NULL)
    return NULL;
  Py_INCREF(buf);
  self->one_buf = buf;
  self->one_mode = mode;
  self->n = 1;
  PyObject_GC_Track(self);
  return (PyObject *)self;
}

/* The modes of unimem.access: one str for every buffer, or one per buffer. */
static int access_modes(AccessObject *self, PyObject *modes) {
  PyObject *seq;
  if (modes == NULL || PyUnicode_Check(modes)) {
    for (Py_ssize_t i = 0; i < self->n; i++)
      if (modes == NULL)
        self->modes[i] = UM_MAP_READ_WRITE;
      else if (pyum_parse_map_mode(modes, &self->modes[i]) < 0)
        return -1;
    return 0;
  }
  if ((seq = PySequence_Fast(modes, "modes must be a str or a sequence of str")) == NULL)
    return -1;
  if (PySequence_Fast_GET_SIZE(seq) != self->n) {
    Py_DECREF(seq);
    pyum_raise_msg(UM_EINVAL, "access(): %zd modes for %zd buffers", PySequence_Fast_GET_SIZE(seq), self->n);
    return -1;
  }
  for (Py_ssize_t i = 0; i < self->n; i++)
    if (pyum_parse_map_mode(PySequence_Fast_GET_ITEM(seq, i), &self->modes[i]) < 0) {
      Py_DECREF(seq);
      return -1;
    }
  Py_DECREF(seq);
  return 0;
}

PyObject *pyum_access_many(PyObject *mod, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  static const char *const names[] = {"buffers", "modes"};
  PyObject *a[2], *seq;
  AccessObject *self;
  Py_ssize_t n;
  (void)mod;
  if (pyum_parse("access", args, nargs, kwnames, names, 2, 1, a) < 0 ||
      (seq = PySequence_Fast(a[0], "buffers must be a sequence of unimem.Buffer")) == NULL)
    return NULL;
  if ((n = PySequence_Fast_GET_SIZE(seq)) == 0) {
    Py_DECREF(seq);
    return pyum_raise_msg(UM_EINVAL, "access(): no buffers");
  }
  if ((self = access_alloc(n)) == NULL) {
    Py_DECREF(seq);
    return NULL;
  }
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *o = PySequence_Fast_GET_ITEM(seq, i);
    if (!PyObject_TypeCheck(o, &Buffer_Type)) {
      PyErr_Format(PyExc_TypeError, "buffers[%zd] is a %.100s, not a unimem.Buffer", i, Py_TYPE(o)->tp_name);
      break;
    }
    Py_INCREF(o);
    self->bufs[self->n++] = (BufferObject *)o;
  }
  Py_DECREF(seq);
  PyObject_GC_Track(self);
  if (PyErr_Occurred() || access_modes(self, a[1]) < 0) {
    Py_DECREF(self);
    return NULL;
  }
  return (PyObject *)self;
}

static int is_cpu(BufferObject *buf) {
  um_device_info info;
  return um_device_info_get(um_buffer_device(buf->b), &info) == UM_OK && strcmp(info.backend, "cpu") == 0;
}

/* Every buffer live and of the first one's manager. */
static int access_check(const AccessObject *self) {
  for (Py_ssize_t i = 0; i < self->n; i++) {
    if (pyum_buffer_check(self->bufs[i]) < 0)
      return -1;
    if (self->bufs[i]->mgr != self->bufs[0]->mgr) {
      pyum_raise_msg(UM_EINVAL, "access(): buffers[%zd] belongs to another Manager than buffers[0]", i);
      return -1;
    }
  }
  return 0;
}

/* The cpu device has no native events: its wait handle is a um_event of
 * unimem's; wait for it here, so Python sees only native handles. */
static void wait_on_cpu(AccessObject *self, void *wait) {
  for (Py_ssize_t i = 0; i < self->n; i++)
    self->bufs[i]->calls++;
  Py_BEGIN_ALLOW_THREADS
  um_event_wait(wait);
  Py_END_ALLOW_THREADS
  for (Py_ssize_t i = 0; i < self->n; i++)
    self->bufs[i]->calls--; /* no unpin: the access's exports hold them */
}

static PyObject *Access_enter(AccessObject *self, PyObject *unused) {
  void *wait = NULL;
  int st;
  (void)unused;
  if (self->state != 0)
    return pyum_raise_msg(UM_ESTATE, "the access was %s already", self->state == 1 ? "begun" : "ended");
  if (access_check(self) < 0)
    return NULL;
  for (Py_ssize_t i = 0; i < self->n; i++)
    self->handles[i] = self->bufs[i]->b;
  st = self->n == 1 ? um_access_begin(self->handles[0], self->modes[0], &wait)
                    : um_access_begin_n(self->handles, self->modes, (size_t)self->n, &wait);
  if (st != UM_OK)
    return pyum_raise(st);
  for (Py_ssize_t i = 0; i < self->n; i++) {
    self->bufs[i]->exports++; /* until the end */
    self->bufs[i]->accesses++;
  }
  self->bufs[0]->mgr->accesses++; /* close() refuses while it is open */
  self->state = 1;
  if (wait != NULL && is_cpu(self->bufs[0])) {
    wait_on_cpu(self, wait);
    wait = NULL;
  }
  self->wait = wait;
  Py_INCREF(self);
  return (PyObject *)self;
}

/* End the brackets behind done (NULL: the caller waited for its commands).
 * The handles are the ones begun: the exports kept the buffers live. */
static int access_end_all(AccessObject *self) {
  int st = um_access_end_n(self->handles, (size_t)self->n, self->done);
  if (st != UM_OK && self->done != NULL) {
    /* A done event unimem cannot take: end the brackets all the same, after
     * waiting for nothing (the caller's error is reported). */
    um_access_end_n(self->handles, (size_t)self->n, NULL);
  }
  return st;
}

/* End the access (see access_end_all); raise_errors 0: report unraisably. */
static int access_end(AccessObject *self, int raise_errors) {
  int st;
  if (self->state != 1)
    return UM_OK;
  self->state = 2;
  self->wait = NULL;
  st = access_end_all(self);
  self->done = NULL;
  Py_CLEAR(self->done_obj);
  self->bufs[0]->mgr->accesses--;
  if (st != UM_OK) {
    if (raise_errors)
      pyum_raise(st);
    else {
      PyObject *t, *v, *tb;
      PyErr_Fetch(&t, &v, &tb);
      pyum_raise(st);
      PyErr_WriteUnraisable((PyObject *)self);
      PyErr_Restore(t, v, tb);
    }
  }
  for (Py_ssize_t i = 0; i < self->n; i++) {
    self->bufs[i]->accesses--;
    pyum_buffer_unexport(self->bufs[i]);
  }
  /* Events dropped inside the access may be done now. */
  pyum_orphans_reap(self->bufs[0]->mgr, 0);
  return st;
}

static PyObject *Access_exit(AccessObject *self, PyObject *args) {
  (void)args;
  if (access_end(self, 1) != UM_OK)
    return NULL;
  Py_RETURN_FALSE;
}

PyDoc_STRVAR(end_doc,
"end($self, done=None)\n--\n\n"
"End the access now (the with block's exit does it otherwise): done, or\n"
"the event set through .done, is the native event of the last command on the\n"
"buffer. Ending twice does nothing.");

static int set_done(AccessObject *self, PyObject *value, void *closure);

static PyObject *Access_end(AccessObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  static const char *const names[] = {"done"};
  PyObject *a[1];
  if (pyum_parse("end", args, nargs, kwnames, names, 1, 0, a) < 0 ||
      (a[0] != NULL && a[0] != Py_None && set_done(self, a[0], NULL) < 0))
    return NULL;
  if (access_end(self, 1) != UM_OK)
    return NULL;
  Py_RETURN_NONE;
}

static PyObject *get_wait_event(AccessObject *self, void *closure) {
  (void)closure;
  return address(self->wait);
}

static PyObject *get_wait_for(AccessObject *self, void *closure) {
  PyObject *list = PyList_New(0), *ev;
  (void)closure;
  if (list == NULL || self->wait == NULL || self->state != 1)
    return list;
  if ((ev = pyopencl_from("Event", self->wait)) == NULL || PyList_Append(list, ev) < 0)
    Py_CLEAR(list);
  Py_XDECREF(ev);
  return list;
}

static PyObject *get_done(AccessObject *self, void *closure) {
  (void)closure;
  if (self->done_obj == NULL)
    Py_RETURN_NONE;
  Py_INCREF(self->done_obj);
  return self->done_obj;
}

/* The native event of a pyopencl.Event (int_ptr) or a CuPy / PyTorch CUDA
 * event (ptr / cuda_event). Plain ints are refused: an address typed by
 * hand would reach the driver, which reads through it. */
int pyum_native_event(PyObject *value, const char *what, void **out) {
  static const char *const attrs[] = {"int_ptr", "ptr", "cuda_event"};
  PyObject *n = NULL;
  for (int i = 0; !PyLong_Check(value) && n == NULL && i < 3; i++)
    if (PyObject_HasAttrString(value, attrs[i]) && (n = PyObject_GetAttrString(value, attrs[i])) == NULL)
      return -1;
  if (n == NULL || !PyLong_Check(n)) {
    Py_XDECREF(n);
    PyErr_Format(PyExc_TypeError, "%s must be a native event object (a pyopencl.Event, a CuPy or PyTorch "
                 "CUDA event) or None, not %.100s", what, Py_TYPE(value)->tp_name);
    return -1;
  }
  *out = PyLong_AsVoidPtr(n);
  Py_DECREF(n);
  return *out == NULL && PyErr_Occurred() ? -1 : 0;
}

static int set_done(AccessObject *self, PyObject *value, void *closure) {
  void *ev = NULL;
  (void)closure;
  if (self->state != 1) {
    pyum_raise_msg(UM_ESTATE, "done can be set only while the access is open");
    return -1;
  }
  if (value != NULL && value != Py_None && pyum_native_event(value, "done", &ev) < 0)
    return -1;
  self->done = ev;
  Py_XINCREF(value != Py_None ? value : NULL);
  Py_XSETREF(self->done_obj, value != Py_None ? value : NULL);
  return 0;
}

static PyObject *get_open(AccessObject *self, void *closure) {
  (void)closure;
  return PyBool_FromLong(self->state == 1);
}

static int Access_traverse(AccessObject *self, visitproc visit, void *arg) {
  for (Py_ssize_t i = 0; i < self->n; i++)
    Py_VISIT(self->bufs[i]);
  Py_VISIT(self->done_obj);
  return 0;
}

static void Access_dealloc(AccessObject *self) {
  PyObject_GC_UnTrack(self);
  access_end(self, 0); /* dropped open: ends as if done were what was set */
  Py_CLEAR(self->done_obj);
  for (Py_ssize_t i = 0; i < self->n; i++)
    Py_CLEAR(self->bufs[i]);
  access_free_arrays(self);
  PyObject_GC_Del(self);
}

static PyMethodDef Access_methods[] = {
    {"__enter__", (PyCFunction)Access_enter, METH_NOARGS,
     PyDoc_STR("Begin the access (um_access_begin, or um_access_begin_n for several buffers): the Access "
               "itself.")},
    {"__exit__", (PyCFunction)Access_exit, METH_VARARGS, PyDoc_STR("end()")},
    {"end", (PyCFunction)(void (*)(void))Access_end, METH_FASTCALL | METH_KEYWORDS, end_doc},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Access_getset[] = {
    {"wait_event", (getter)get_wait_event, NULL,
     PyDoc_STR("The native event (cl_event / CUevent, as an int) the first command on the buffers must wait "
               "for, or None when nothing unimem issued on any of them is pending: one event for all the "
               "buffers of unimem.access()."), NULL},
    {"wait_for", (getter)get_wait_for, NULL,
     PyDoc_STR("wait_event as a list for pyopencl's wait_for= (empty when there is nothing to wait for)."), NULL},
    {"done", (getter)get_done, (setter)set_done,
     PyDoc_STR("The native event of the caller's last command on the buffers: a pyopencl.Event, or a CuPy / "
               "PyTorch CUDA event (an object with int_ptr, ptr or cuda_event); None: the caller waited for its "
               "commands. Read at the end."), NULL},
    {"open", (getter)get_open, NULL, PyDoc_STR("True between the beginning and the end."), NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyDoc_STRVAR(Access_doc,
"The caller's own device work on a Buffer (from Buffer.access(mode)), or on\n"
"several Buffers of one device at once (from unimem.access(buffers, modes)),\n"
"as a context manager around um_access_begin / um_access_end (_n):\n\n"
"    with b.access('rw') as ac:\n"
"        ev = kernel(queue, (n,), None, b.to_pyopencl(), wait_for=ac.wait_for)\n"
"        ac.done = ev\n\n"
"    with unimem.access([a, b, c], ['r', 'r', 'rw']) as ac:  # one wait, one done\n"
"        ac.done = gemm(queue, (n, n), None, a.to_pyopencl(), b.to_pyopencl(),\n"
"                       c.to_pyopencl(), wait_for=ac.wait_for)\n\n"
"A Buffer listed twice gets one bracket in the stronger mode. All or none:\n"
"when one buffer cannot be bracketed, entering raises its error and no\n"
"bracket is open.\n"
"Nothing blocks: the kernel waits for what unimem issued on b before\n"
"(wait_event), and unimem's later operations on b wait for done. On the cpu\n"
"device the beginning waits for those operations itself (wait_event None).\n"
"While it is open, the manager's close() raises InvalidState; dropping an\n"
"Event or releasing a buffer never waits for the operations behind it.");

static PyTypeObject Access_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "unimem.Access",
    .tp_basicsize = sizeof(AccessObject),
    .tp_dealloc = (destructor)Access_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = Access_doc,
    .tp_traverse = (traverseproc)Access_traverse,
    .tp_methods = Access_methods,
    .tp_getset = Access_getset,
};

PyTypeObject *pyum_access_type(void) { return &Access_Type; }
