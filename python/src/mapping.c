/* unimem.Mapping: one um_map of a Buffer, exported to Python as a
 * memoryview. The mapping ends (um_unmap) at __exit__. Views made from it
 * that outlive the with block make __exit__ raise BufferError (as
 * memoryview.release does): the memory they point into stays the mapped
 * memory, and the mapping ends when the last of them is released. With an
 * exception already leaving the block, that exception goes on instead. */
#include "pyunimem.h"

typedef struct MappingObject {
  PyObject_HEAD
  BufferObject *buf;
  void *ptr;
  size_t len;
  um_map_mode mode;
  Py_ssize_t exports; /* views of the mapping */
  int mapped;         /* um_map's mapping is live */
  int ending;         /* __exit__ ran: unmap once exports reach 0 */
  PyObject *view;     /* the memoryview __enter__ returned */
} MappingObject;

/* um_unmap, then give up the export the mapping holds on its buffer. */
static int mapping_end(MappingObject *self, int raise_errors) {
  BufferObject *buf = self->buf;
  int st;
  if (!self->mapped)
    return UM_OK;
  self->mapped = 0;
  Py_BEGIN_ALLOW_THREADS
  st = um_unmap(buf->b, self->ptr);
  Py_END_ALLOW_THREADS
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
  pyum_buffer_unexport(buf);
  return st;
}

PyObject *pyum_mapping_new(BufferObject *buf, um_map_mode mode, void *ptr, size_t len) {
  MappingObject *self = (MappingObject *)Mapping_Type.tp_alloc(&Mapping_Type, 0);
  if (self == NULL) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    Py_BEGIN_ALLOW_THREADS
    um_unmap(buf->b, ptr);
    Py_END_ALLOW_THREADS
    pyum_buffer_unexport(buf);
    PyErr_Restore(type, value, tb);
    return NULL;
  }
  Py_INCREF(buf);
  self->buf = buf;
  self->ptr = ptr;
  self->len = len;
  self->mode = mode;
  self->mapped = 1;
  return (PyObject *)self;
}

static int Mapping_getbuffer(MappingObject *self, Py_buffer *view, int flags) {
  int readonly = self->mode == UM_MAP_READ;
  view->obj = NULL;
  if (!self->mapped || self->ending) {
    PyErr_SetString(PyExc_BufferError, "unimem.Mapping: the mapping has ended");
    return -1;
  }
  if (readonly && (flags & PyBUF_WRITABLE) == PyBUF_WRITABLE) {
    PyErr_SetString(PyExc_BufferError, "unimem.Mapping: the mapping is read-only (mode 'r')");
    return -1;
  }
  if (PyBuffer_FillInfo(view, (PyObject *)self, self->ptr, (Py_ssize_t)self->len, readonly, flags) < 0)
    return -1;
  self->exports++;
  return 0;
}

static void Mapping_releasebuffer(MappingObject *self, Py_buffer *view) {
  (void)view;
  if (--self->exports == 0 && self->ending)
    mapping_end(self, 0);
}

static PyBufferProcs Mapping_as_buffer = {
    (getbufferproc)Mapping_getbuffer,
    (releasebufferproc)Mapping_releasebuffer,
};

static PyObject *Mapping_enter(MappingObject *self, PyObject *unused) {
  (void)unused;
  if (!self->mapped || self->ending)
    return pyum_raise_msg(UM_ESTATE, "the mapping has ended");
  if (self->view == NULL && (self->view = PyMemoryView_FromObject((PyObject *)self)) == NULL)
    return NULL;
  Py_INCREF(self->view);
  return self->view;
}

/* End the mapping: now, unless views made from it are still alive
 * (BufferError, unless the block is leaving with an exception of its own). */
static PyObject *Mapping_exit(MappingObject *self, PyObject *args) {
  PyObject *view = self->view;
  int leaving_with_error = PyTuple_Check(args) && PyTuple_GET_SIZE(args) > 0 && PyTuple_GET_ITEM(args, 0) != Py_None;
  self->ending = 1;
  self->view = NULL;
  if (view != NULL) {
    PyObject *r = PyObject_CallMethod(view, "release", NULL);
    /* BufferError: someone took a view of the view; it ends later. */
    if (r == NULL && PyErr_ExceptionMatches(PyExc_BufferError))
      PyErr_Clear();
    Py_DECREF(view);
    if (r == NULL && PyErr_Occurred())
      return NULL;
    Py_XDECREF(r);
  }
  if (self->exports == 0) {
    if (mapping_end(self, 1) != UM_OK)
      return NULL;
  } else if (self->mapped && !leaving_with_error) {
    PyErr_SetString(PyExc_BufferError,
                    "unimem.Mapping: views made from the mapping (numpy.frombuffer, a slice, ...) outlive its with "
                    "block: the buffer stays mapped until the last is released (del them before the block ends)");
    return NULL;
  }
  Py_RETURN_FALSE;
}

static PyObject *Mapping_get_ended(MappingObject *self, void *closure) {
  (void)closure;
  return PyBool_FromLong(!self->mapped);
}

static PyObject *Mapping_get_nbytes(MappingObject *self, void *closure) {
  (void)closure;
  return PyLong_FromSize_t(self->len);
}

static PyObject *Mapping_get_buffer(MappingObject *self, void *closure) {
  (void)closure;
  Py_INCREF(self->buf);
  return (PyObject *)self->buf;
}

static int Mapping_traverse(MappingObject *self, visitproc visit, void *arg) {
  Py_VISIT(self->buf);
  Py_VISIT(self->view);
  return 0;
}

/* The memoryview refers back to the mapping: break that cycle. */
static int Mapping_clear(MappingObject *self) {
  Py_CLEAR(self->view);
  return 0;
}

static void Mapping_dealloc(MappingObject *self) {
  PyObject_GC_UnTrack(self);
  Py_CLEAR(self->view);
  mapping_end(self, 0); /* views hold references: none is left */
  Py_CLEAR(self->buf);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef Mapping_methods[] = {
    {"__enter__", (PyCFunction)Mapping_enter, METH_NOARGS,
     PyDoc_STR("A memoryview of the mapped bytes (read-only for mode 'r').")},
    {"__exit__", (PyCFunction)Mapping_exit, METH_VARARGS,
     PyDoc_STR("End the mapping: writes reach the device. BufferError while views made from it live (the mapping "
               "then ends when the last is released).")},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Mapping_getset[] = {
    {"ended", (getter)Mapping_get_ended, NULL, PyDoc_STR("True once the mapping ended (um_unmap ran)."), NULL},
    {"nbytes", (getter)Mapping_get_nbytes, NULL, PyDoc_STR("Mapped length in bytes."), NULL},
    {"buffer", (getter)Mapping_get_buffer, NULL, PyDoc_STR("The mapped Buffer."), NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject Mapping_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "unimem.Mapping",
    .tp_basicsize = sizeof(MappingObject),
    .tp_dealloc = (destructor)Mapping_dealloc,
    .tp_as_buffer = &Mapping_as_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = PyDoc_STR("A host mapping of a Buffer (from Buffer.map): use it in a with statement."),
    .tp_traverse = (traverseproc)Mapping_traverse,
    .tp_clear = (inquiry)Mapping_clear,
    .tp_methods = Mapping_methods,
    .tp_getset = Mapping_getset,
};
