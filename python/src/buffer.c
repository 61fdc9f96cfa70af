/* unimem.Buffer: one um_buffer, its host view through the buffer protocol,
 * release (deferred while views or calls still reach its memory), map. */
#include "pyunimem.h"

static void buffer_link(BufferObject *self) {
  ManagerObject *mgr = self->mgr;
  self->prev = NULL;
  self->next = mgr->buffers;
  if (mgr->buffers != NULL)
    mgr->buffers->prev = self;
  mgr->buffers = self;
  mgr->handles++;
}

static void buffer_unlink(BufferObject *self) {
  ManagerObject *mgr = self->mgr;
  if (self->prev != NULL)
    self->prev->next = self->next;
  else
    mgr->buffers = self->next;
  if (self->next != NULL)
    self->next->prev = self->prev;
  self->prev = self->next = NULL;
  mgr->handles--;
}

PyObject *pyum_buffer_new(ManagerObject *mgr, um_buffer *b) {
  BufferObject *self = (BufferObject *)Buffer_Type.tp_alloc(&Buffer_Type, 0);
  um_device_info info;
  if (self == NULL) {
    um_release(b);
    return NULL;
  }
  Py_INCREF(mgr);
  self->mgr = mgr;
  self->b = b;
  self->host = um_buffer_host_ptr(b);
  self->size = um_buffer_size(b);
  self->location = (int)um_buffer_location(b);
  self->device = um_device_info_get(um_buffer_device(b), &info) == UM_OK ? info.index : 0;
  buffer_link(self);
  return (PyObject *)self;
}

/* The handle was given up (um_release answered st): off the manager's
 * list, which may let a closed manager go. */
static int buffer_handle_gone(BufferObject *self, int st, int raise_errors) {
  int destroyed;
  /* A wrap's release returned only once its operations ended: the wrapped
   * object's memory may go. Refused, the wrap is still live in C: its
   * memory stays held for good. */
  if (st == UM_OK && self->source.obj != NULL)
    PyBuffer_Release(&self->source);
  self->b = NULL;
  self->host = NULL;
  self->release_requested = 1;
  Py_CLEAR(self->cl_view);
  buffer_unlink(self);
  destroyed = pyum_manager_maybe_destroy(self->mgr, raise_errors && st == UM_OK);
  return st != UM_OK ? st : destroyed;
}

/* Give the handle up (nothing pins it any more). */
static int buffer_release_handle(BufferObject *self, int raise_errors) {
  int st;
  self->release_requested = 1;
  st = um_release(self->b);
  if (st != UM_OK) {
    PyObject *type = NULL, *value = NULL, *tb = NULL;
    if (!raise_errors)
      PyErr_Fetch(&type, &value, &tb);
    pyum_raise(st);
    if (!raise_errors) {
      PyErr_WriteUnraisable((PyObject *)self);
      PyErr_Restore(type, value, tb);
    }
  }
  return buffer_handle_gone(self, st, raise_errors);
}

/* Something still reaches the memory, or (an import, whose um_release
 * waits for its operations) an operation of it is pending: that wait could
 * pass through an access the releasing thread has yet to end. */
static int buffer_pinned(const BufferObject *self) {
  return self->exports > 0 || self->calls > 0 || (self->wrapped && self->pending > 0);
}

static void buffer_unpinned(BufferObject *self) {
  if (self->b != NULL && self->release_requested && !buffer_pinned(self))
    buffer_release_handle(self, 0);
}

void pyum_buffer_op_done(BufferObject *self) {
  self->pending--;
  buffer_unpinned(self);
}

void pyum_buffer_unpin_call(BufferObject *self) {
  self->calls--;
  buffer_unpinned(self);
}

void pyum_buffer_unexport(BufferObject *self) {
  self->exports--;
  buffer_unpinned(self);
}

void pyum_buffer_request_release(BufferObject *self) {
  self->release_requested = 1;
  buffer_unpinned(self);
}

int pyum_buffer_check(BufferObject *self) {
  if (self->b == NULL || self->release_requested) {
    pyum_raise_msg(UM_ESTATE, self->mgr->closed ? "the buffer was released (its manager is closed)"
                                                : "the buffer was released");
    return -1;
  }
  return pyum_manager_check(self->mgr);
}

/* ---- Buffer protocol --------------------------------------------------- */

static int Buffer_getbuffer(BufferObject *self, Py_buffer *view, int flags) {
  if (self->b == NULL || self->release_requested) {
    PyErr_SetString(PyExc_BufferError, "unimem.Buffer: the buffer was released");
    view->obj = NULL;
    return -1;
  }
  if (self->host == NULL) {
    PyErr_Format(PyExc_BufferError,
                 "unimem.Buffer: this %zu-byte '%s' buffer on device %d has no host view; "
                 "use copy_to()/copy_from() or map()",
                 self->size, pyum_location_names[self->location], self->device);
    view->obj = NULL;
    return -1;
  }
  if (self->readonly && (flags & PyBUF_WRITABLE) == PyBUF_WRITABLE) {
    PyErr_SetString(PyExc_BufferError, "unimem.Buffer: the buffer is read-only");
    view->obj = NULL;
    return -1;
  }
  if (PyBuffer_FillInfo(view, (PyObject *)self, self->host, (Py_ssize_t)self->size, self->readonly, flags) < 0)
    return -1;
  self->exports++;
  return 0;
}

static void Buffer_releasebuffer(BufferObject *self, Py_buffer *view) {
  (void)view;
  pyum_buffer_unexport(self);
}

static PyBufferProcs Buffer_as_buffer = {
    (getbufferproc)Buffer_getbuffer,
    (releasebufferproc)Buffer_releasebuffer,
};

/* numpy.asarray(b) takes the buffer protocol first; it calls __array__ only
 * where that failed, and would otherwise quietly make an object array. */
static PyObject *Buffer_array(BufferObject *self, PyObject *args, PyObject *kwds) {
  static char *kwlist[] = {"dtype", "copy", NULL};
  PyObject *dtype = Py_None, *copy = Py_None, *view, *numpy, *out = NULL;
  int want_copy;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "|OO:__array__", kwlist, &dtype, &copy) ||
      (want_copy = PyObject_IsTrue(copy)) < 0)
    return NULL;
  if ((view = PyMemoryView_FromObject((PyObject *)self)) == NULL)
    return NULL; /* the BufferError saying why */
  if ((numpy = PyImport_ImportModule("numpy")) != NULL) {
    PyObject *fn = PyObject_GetAttrString(numpy, want_copy ? "array" : "asarray");
    out = fn != NULL ? PyObject_CallFunctionObjArgs(fn, view, dtype, NULL) : NULL;
    Py_XDECREF(fn);
    Py_DECREF(numpy);
  }
  Py_DECREF(view);
  return out;
}

/* ---- Methods -------------------------------------------------------------- */

PyDoc_STRVAR(release_doc,
"release($self)\n--\n\n"
"Give the buffer back to its pool, once the operations pending on it have\n"
"finished. If numpy arrays, memoryviews or a mapping of the buffer are alive,\n"
"its memory stays valid for them and returns to the pool when the last one is\n"
"released. Afterwards the buffer can no longer be used (InvalidState);\n"
"releasing it again does nothing. It never waits for those operations (one may\n"
"be queued behind an open access): inside its own access the buffer goes when\n"
"the access ends, and an import (from_dlpack) goes back to its producer once\n"
"its operations are seen done.");

static PyObject *Buffer_release(BufferObject *self, PyObject *unused) {
  (void)unused;
  if (self->b == NULL || self->release_requested)
    Py_RETURN_NONE;
  self->release_requested = 1;
  if (!buffer_pinned(self) && buffer_release_handle(self, 1) != UM_OK)
    return NULL;
  pyum_orphans_reap(self->mgr, 0); /* finished orphans holding an import let it go now */
  Py_RETURN_NONE;
}

PyDoc_STRVAR(release_after_doc,
"release_after($self, event)\n--\n\n"
"Release the buffer now (as release()), its memory going back to the pool\n"
"only once event -- the native event of the caller's last command on it: a\n"
"pyopencl.Event, or a CuPy / PyTorch CUDA event -- has completed, with no\n"
"wait (PyTorch's record_stream, RMM's stream-ordered free; um_release_after).\n"
"A new buffer allocated meanwhile gets other memory. None: release(). Plain\n"
"ints are refused (TypeError), as for Access.done. InvalidArgument for an\n"
"event of another context, or any event on the cpu device; InvalidState when\n"
"the buffer was released, or when views, a mapping, an open access, a DLPack\n"
"tensor or calls still reach it (release() would wait for those: end them\n"
"first), each with the buffer unchanged. An import (from_dlpack) returns\n"
"once the event completed, its producer having the memory back.");

static PyObject *Buffer_release_after(BufferObject *self, PyObject *const *args, Py_ssize_t nargs,
                                      PyObject *kwnames) {
  static const char *const names[] = {"event"};
  PyObject *a[1];
  void *ev = NULL;
  um_buffer *b;
  int st;
  if (pyum_parse("release_after", args, nargs, kwnames, names, 1, 1, a) < 0)
    return NULL;
  if (a[0] == Py_None)
    return Buffer_release(self, NULL);
  if (pyum_native_event(a[0], "event", &ev) < 0 || pyum_buffer_check(self) < 0)
    return NULL;
  if (buffer_pinned(self))
    return pyum_raise_msg(UM_ESTATE, "release_after(): views, a mapping, an access, a DLPack tensor or calls "
                                     "still reach the buffer: end them first, or use release()");
  b = self->b;
  self->calls++; /* a wrap's release waits for the event */
  Py_BEGIN_ALLOW_THREADS
  st = um_release_after(b, ev);
  Py_END_ALLOW_THREADS
  self->calls--;
  if (st != UM_OK) {
    pyum_raise(st);
    buffer_unpinned(self); /* a release() meanwhile goes now */
    return NULL;
  }
  if (buffer_handle_gone(self, UM_OK, 1) != UM_OK)
    return NULL;
  Py_RETURN_NONE;
}

static PyObject *Buffer_enter(BufferObject *self, PyObject *unused) {
  (void)unused;
  if (pyum_buffer_check(self) < 0)
    return NULL;
  Py_INCREF(self);
  return (PyObject *)self;
}

static PyObject *Buffer_exit(BufferObject *self, PyObject *args) {
  PyObject *r;
  (void)args;
  if ((r = Buffer_release(self, NULL)) == NULL)
    return NULL;
  Py_DECREF(r);
  Py_RETURN_FALSE;
}

int pyum_parse_map_mode(PyObject *o, um_map_mode *mode) {
  static const char *const names[] = {"r", "w", "rw", "discard"};
  static const um_map_mode modes[] = {UM_MAP_READ, UM_MAP_WRITE, UM_MAP_READ_WRITE, UM_MAP_WRITE_DISCARD};
  if (!PyUnicode_Check(o)) {
    PyErr_Format(PyExc_TypeError, "mode must be a str, not %.100s", Py_TYPE(o)->tp_name);
    return -1;
  }
  for (int i = 0; i < 4; i++)
    if (PyUnicode_CompareWithASCIIString(o, names[i]) == 0) {
      *mode = modes[i];
      return 0;
    }
  pyum_raise_msg(UM_EINVAL, "mode must be 'r', 'w', 'rw' or 'discard'");
  return -1;
}

PyDoc_STRVAR(map_doc,
"map($self, mode='rw', offset=0, nbytes=None)\n--\n\n"
"Map [offset, offset + nbytes) (nbytes None: to the end) into host memory, as a Mapping:\n"
"'r' read, 'w' write, 'rw' both, 'discard' write without fetching the old\n"
"contents. Use as `with b.map('rw') as view:` where view is a memoryview\n"
"(read-only for 'r'). Reading modes fetch the device copy first; writes reach\n"
"the device when the mapping ends, when the with block exits. Arrays or views\n"
"made from view that outlive the block make its exit raise BufferError (as\n"
"memoryview.release does); the buffer then stays mapped until the last of them\n"
"is released. One mapping per buffer at a time (InvalidState).");

static PyObject *Buffer_map(BufferObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  static const char *const names[] = {"mode", "offset", "nbytes"};
  PyObject *a[3], *mapping;
  um_map_mode mode = UM_MAP_READ_WRITE;
  size_t off = 0, len = 0;
  void *ptr = NULL;
  int st;
  if (pyum_parse("map", args, nargs, kwnames, names, 3, 0, a) < 0 ||
      (a[0] != NULL && pyum_parse_map_mode(a[0], &mode) < 0) ||
      (a[1] != NULL && pyum_size(a[1], "offset", &off) < 0) ||
      (a[2] != NULL && a[2] != Py_None && pyum_size(a[2], "nbytes", &len) < 0) || pyum_buffer_check(self) < 0)
    return NULL;
  if (a[2] == NULL || a[2] == Py_None) {
    if (off >= self->size)
      return pyum_raise_msg(UM_ERANGE, "map: offset %zu is outside the buffer's %zu bytes", off, self->size);
    len = self->size - off;
  }
  self->calls++;
  Py_BEGIN_ALLOW_THREADS
  st = um_map(self->b, mode, off, len, &ptr);
  Py_END_ALLOW_THREADS
  if (st != UM_OK) {
    pyum_raise(st);
    pyum_buffer_unpin_call(self);
    return NULL;
  }
  self->exports++; /* the mapping's, given up when it ends */
  pyum_buffer_unpin_call(self);
  mapping = pyum_mapping_new(self, mode, ptr, len);
  return mapping;
}

PyDoc_STRVAR(access_doc,
"access($self, mode='rw')\n--\n\n"
"An Access: use it as `with b.access(mode) as ac:` around the caller's own\n"
"device work on the buffer (kernels, native copies), mode as for map(). See\n"
"unimem.Access.");

static PyObject *Buffer_access(BufferObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  static const char *const names[] = {"mode"};
  PyObject *a[1];
  um_map_mode mode = UM_MAP_READ_WRITE;
  if (pyum_parse("access", args, nargs, kwnames, names, 1, 0, a) < 0 ||
      (a[0] != NULL && pyum_parse_map_mode(a[0], &mode) < 0) ||
      pyum_buffer_check(self) < 0)
    return NULL;
  return pyum_access_new(self, mode);
}

/* ---- Attributes and type ----------------------------------------------- */

static PyObject *Buffer_get_size(BufferObject *self, void *closure) {
  (void)closure;
  return PyLong_FromSize_t(self->size);
}

static PyObject *Buffer_get_device(BufferObject *self, void *closure) {
  PyObject *devices = self->mgr->devices;
  (void)closure;
  if (devices == NULL || self->device >= PyTuple_GET_SIZE(devices))
    return PyLong_FromLong(self->device);
  Py_INCREF(PyTuple_GET_ITEM(devices, self->device));
  return PyTuple_GET_ITEM(devices, self->device);
}

static PyObject *Buffer_get_location(BufferObject *self, void *closure) {
  (void)closure;
  return PyUnicode_FromString(pyum_location_names[self->location]);
}

static PyObject *Buffer_get_released(BufferObject *self, void *closure) {
  (void)closure;
  return PyBool_FromLong(self->b == NULL || self->release_requested);
}

static PyObject *Buffer_get_host_view(BufferObject *self, void *closure) {
  (void)closure;
  return PyBool_FromLong(self->host != NULL && !self->release_requested);
}

static PyObject *Buffer_get_manager(BufferObject *self, void *closure) {
  (void)closure;
  Py_INCREF(self->mgr);
  return (PyObject *)self->mgr;
}

static PyObject *Buffer_repr(BufferObject *self) {
  return PyUnicode_FromFormat("<unimem.Buffer %zu bytes, device %d, %s%s>", self->size, self->device,
                              pyum_location_names[self->location],
                              self->b == NULL || self->release_requested ? ", released" : "");
}

static int Buffer_traverse(BufferObject *self, visitproc visit, void *arg) {
  Py_VISIT(self->mgr);
  Py_VISIT(self->cl_view);
  return 0;
}

static void Buffer_dealloc(BufferObject *self) {
  PyObject_GC_UnTrack(self);
  if (self->weakrefs != NULL)
    PyObject_ClearWeakRefs((PyObject *)self);
  /* Views and calls hold references: nothing pins the buffer now. */
  if (self->b != NULL)
    buffer_release_handle(self, 0);
  Py_CLEAR(self->cl_view);
  if (self->source.obj != NULL && (self->mgr == NULL || self->mgr->m == NULL))
    PyBuffer_Release(&self->source); /* the manager, and with it the wrap, is gone */
  Py_CLEAR(self->mgr);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

PyDoc_STRVAR(copy_from_doc,
"copy_from($self, obj, offset=0, wait=True)\n--\n\n"
"Copy all bytes of obj (any C-contiguous object with the buffer protocol)\n"
"into the buffer at offset. OutOfRange when they do not fit. wait=False\n"
"returns an Event at once; obj stays referenced (and its memory exported)\n"
"until the copy is done.");

PyDoc_STRVAR(copy_to_doc,
"copy_to($self, obj, offset=0, wait=True)\n--\n\n"
"Fill obj (a writable, C-contiguous object with the buffer protocol) with the\n"
"buffer's bytes from offset on. OutOfRange when the buffer has fewer. wait=False\n"
"returns an Event at once; obj stays referenced until the copy is done.");

PyDoc_STRVAR(fill_doc,
"fill($self, byte, offset=0, nbytes=None, wait=True)\n--\n\n"
"Set nbytes bytes from offset (nbytes None: to the end) to byte (0..255).\n"
"wait=False returns an Event.");

static PyMethodDef Buffer_methods[] = {
    {"copy_from", (PyCFunction)(void (*)(void))pyum_buffer_copy_from, METH_FASTCALL | METH_KEYWORDS, copy_from_doc},
    {"copy_to", (PyCFunction)(void (*)(void))pyum_buffer_copy_to, METH_FASTCALL | METH_KEYWORDS, copy_to_doc},
    {"fill", (PyCFunction)(void (*)(void))pyum_buffer_fill, METH_FASTCALL | METH_KEYWORDS, fill_doc},
    {"map", (PyCFunction)(void (*)(void))Buffer_map, METH_FASTCALL | METH_KEYWORDS, map_doc},
    {"release", (PyCFunction)Buffer_release, METH_NOARGS, release_doc},
    {"release_after", (PyCFunction)(void (*)(void))Buffer_release_after, METH_FASTCALL | METH_KEYWORDS,
     release_after_doc},
    {"access", (PyCFunction)(void (*)(void))Buffer_access, METH_FASTCALL | METH_KEYWORDS, access_doc},
    {"native", (PyCFunction)pyum_buffer_native, METH_NOARGS,
     PyDoc_STR("native($self)\n--\n\nThe native handles of the buffer's memory, as a dict: host (its host view), "
               "cl_mem, svm, cu_ptr (ints; None / 0 where they do not apply) and offset (of the buffer inside "
               "cl_mem / cu_ptr). Valid while the buffer is live; order device work on them with access().")},
    {"to_pyopencl", (PyCFunction)pyum_buffer_to_pyopencl, METH_NOARGS,
     PyDoc_STR("to_pyopencl($self)\n--\n\nA pyopencl.Buffer over the same cl_mem, in unimem's context, of "
               "exactly the buffer's size (a sub-buffer when the buffer is part of a larger block). Made on the "
               "first call; every later call returns the same object (cheap in a loop: do not release() it). It "
               "aliases the memory only while the buffer lives: keep the Buffer until the kernels are done, and "
               "order them with access(); after release() the call raises InvalidState. NotSupported for a buffer "
               "that is not OpenCL device memory; ImportError without pyopencl.")},
    {"view", (PyCFunction)(void (*)(void))pyum_buffer_view, METH_FASTCALL | METH_KEYWORDS,
     PyDoc_STR("view($self, dtype, shape=None, strides=None, offset=0)\n--\n\n"
               "A typed view (ArrayView) of the bytes from offset: elements of dtype (anything numpy.dtype takes:\n"
               "'float32', numpy.int16, ...) in shape (None: as many as fit, one dimension), strides in bytes\n"
               "(NumPy's convention; None: C order). numpy.from_dlpack(v), torch.from_dlpack(v) and\n"
               "numpy.asarray(v) (host-visible memory) give that array at once, zero-copy. The buffer's\n"
               "release() waits while the view lives. OutOfRange when the elements run past the end.")},
    {"__dlpack__", (PyCFunction)(void (*)(void))pyum_buffer_dlpack, METH_FASTCALL | METH_KEYWORDS,
     PyDoc_STR("__dlpack__($self, *, stream=None, max_version=None, dl_device=None, copy=None)\n--\n\n"
               "The buffer as a DLPack capsule of uint8 (the array API standard's protocol): 'dltensor' "
               "(legacy; NumPy 1.x, PyTorch 1.x) unless max_version >= (1, 0) asks for 'dltensor_versioned'. "
               "Zero-copy unless copy=True, or dl_device=(1, 0) (the host) for device memory and copy is not "
               "False. The tensor holds the buffer until the consumer deletes it: release() and the manager's "
               "close() wait for that. The operations issued on the buffer before have finished when it "
               "returns. stream: None (or -1), any int for CUDA. BufferError when the memory cannot be "
               "exported so.")},
    {"__dlpack_device__", (PyCFunction)pyum_buffer_dlpack_device, METH_NOARGS,
     PyDoc_STR("__dlpack_device__($self)\n--\n\n(device_type, device_id) as DLPack names them: (1, 0) for "
               "host memory (kDLCPU), (2, n) CUDA, (3, n) CUDA host, (4, n) OpenCL (n: the ordinal among the "
               "manager's OpenCL devices), (13, n) CUDA managed.")},
    {"__array__", (PyCFunction)(void (*)(void))Buffer_array, METH_VARARGS | METH_KEYWORDS,
     PyDoc_STR("__array__($self, dtype=None, copy=None)\n--\n\nnumpy.asarray(b): a uint8 view of the host memory (a copy with copy=True); "
               "BufferError for a buffer without host view or released.")},
    {"__enter__", (PyCFunction)Buffer_enter, METH_NOARGS, PyDoc_STR("The buffer itself.")},
    {"__exit__", (PyCFunction)Buffer_exit, METH_VARARGS, PyDoc_STR("release()")},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Buffer_getset[] = {
    {"size", (getter)Buffer_get_size, NULL, PyDoc_STR("Size in bytes."), NULL},
    {"device", (getter)Buffer_get_device, NULL, PyDoc_STR("The Device the buffer lives on."), NULL},
    {"location", (getter)Buffer_get_location, NULL, PyDoc_STR("'host', 'device', 'pinned' or 'unified'."), NULL},
    {"released", (getter)Buffer_get_released, NULL, PyDoc_STR("True once release() was called."), NULL},
    {"has_host_view", (getter)Buffer_get_host_view, NULL,
     PyDoc_STR("True when the memory is host-visible: memoryview(b) and numpy.asarray(b) work, zero-copy."),
     NULL},
    {"manager", (getter)Buffer_get_manager, NULL, PyDoc_STR("The Manager the buffer came from."), NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyDoc_STRVAR(Buffer_doc,
"A block of memory on one device (from Manager.alloc).\n\n"
"Host-visible buffers (has_host_view) support the buffer protocol:\n"
"memoryview(b) and numpy.asarray(b) share its memory (bytes, uint8). Others\n"
"move data with copy_from/copy_to/unimem.copy or map(). A context manager:\n"
"release() on exit.");

PyTypeObject Buffer_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "unimem.Buffer",
    .tp_basicsize = sizeof(BufferObject),
    .tp_dealloc = (destructor)Buffer_dealloc,
    .tp_repr = (reprfunc)Buffer_repr,
    .tp_as_buffer = &Buffer_as_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = Buffer_doc,
    .tp_traverse = (traverseproc)Buffer_traverse,
    .tp_weaklistoffset = offsetof(BufferObject, weakrefs),
    .tp_methods = Buffer_methods,
    .tp_getset = Buffer_getset,
};
