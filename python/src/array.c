/* unimem.ArrayView (Buffer.view): a typed view of a buffer's bytes, with a
 * dtype, shape, strides and offset, as DLPack (__dlpack__ with that dtype
 * and layout) and NumPy (__array_interface__, host-visible memory) take it.
 * A view counts as one of its buffer's exports while it lives: release()
 * is deferred until the view, and what consumers made of it, are gone. */
#include "pyunimem.h"

#include <unimem_dlpack.h>

#define MAX_DIMS 32

typedef struct ArrayObject {
  PyObject_HEAD
  BufferObject *buf;
  PyObject *dtype;          /* numpy.dtype */
  size_t offset;
  int ndim;
  int64_t shape[MAX_DIMS];
  int64_t strides[MAX_DIMS]; /* in elements */
  int contiguous;           /* C order: no strides in the tensor */
  size_t itemsize;
  uint8_t code, bits;
} ArrayObject;

static PyObject *numpy_dtype_fn; /* numpy.dtype, looked up once */

/* dtype as numpy.dtype, with its DLPack code and size; -1 with the error. */
static int parse_dtype(PyObject *o, PyObject **dtype, uint8_t *code, size_t *itemsize) {
  PyObject *dt, *kind = NULL, *size = NULL, *native = NULL, *fields = NULL;
  const char *k;
  int ok = -1;
  if (numpy_dtype_fn == NULL) {
    PyObject *numpy = PyImport_ImportModule("numpy");
    if (numpy == NULL)
      return -1;
    numpy_dtype_fn = PyObject_GetAttrString(numpy, "dtype");
    Py_DECREF(numpy);
    if (numpy_dtype_fn == NULL)
      return -1;
  }
  if ((dt = PyObject_CallOneArg(numpy_dtype_fn, o)) == NULL)
    return -1;
  if ((kind = PyObject_GetAttrString(dt, "kind")) == NULL || (size = PyObject_GetAttrString(dt, "itemsize")) == NULL ||
      (native = PyObject_GetAttrString(dt, "isnative")) == NULL || (fields = PyObject_GetAttrString(dt, "fields")) == NULL ||
      (k = PyUnicode_AsUTF8(kind)) == NULL)
    goto out;
  *itemsize = PyLong_AsSize_t(size);
  if (*itemsize == (size_t)-1 && PyErr_Occurred())
    goto out;
  *code = k[0] == 'i' ? UM_DL_INT : k[0] == 'u' ? UM_DL_UINT : k[0] == 'f' ? UM_DL_FLOAT
          : k[0] == 'c' ? UM_DL_COMPLEX : k[0] == 'b' ? UM_DL_BOOL : 255;
  if (*code == 255 || fields != Py_None || *itemsize == 0 || *itemsize > 32)
    pyum_raise_msg(UM_EINVAL, "view(): dtype of kind '%s' is not a number DLPack carries (int, uint, float, "
                   "complex, bool)", k);
  else if (native != Py_True)
    pyum_raise_msg(UM_EINVAL, "view(): the dtype is not in the machine's byte order");
  else {
    *dtype = dt;
    dt = NULL;
    ok = 0;
  }
out:
  Py_XDECREF(kind);
  Py_XDECREF(size);
  Py_XDECREF(native);
  Py_XDECREF(fields);
  Py_XDECREF(dt);
  return ok;
}

/* A tuple (or an int) of non-negative ints into out[]; the count. */
static int parse_dims(PyObject *o, const char *what, int64_t *out) {
  PyObject *seq;
  Py_ssize_t n;
  if (PyLong_Check(o)) {
    out[0] = PyLong_AsLongLong(o);
    if (out[0] == -1 && PyErr_Occurred())
      return -1;
    if (out[0] < 0) {
      pyum_raise_msg(UM_EINVAL, "view(): %s %lld is negative", what, (long long)out[0]);
      return -1;
    }
    return 1;
  }
  if ((seq = PySequence_Fast(o, "view(): shape and strides are tuples of ints")) == NULL)
    return -1;
  n = PySequence_Fast_GET_SIZE(seq);
  if (n > MAX_DIMS) {
    Py_DECREF(seq);
    pyum_raise_msg(UM_EINVAL, "view(): %zd dimensions (at most %d)", n, MAX_DIMS);
    return -1;
  }
  for (Py_ssize_t i = 0; i < n; i++) {
    out[i] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
    if ((out[i] == -1 && PyErr_Occurred()) || out[i] < 0) {
      Py_DECREF(seq);
      if (!PyErr_Occurred())
        pyum_raise_msg(UM_EINVAL, "view(): %s[%zd] = %lld is negative", what, i, (long long)out[i]);
      return -1;
    }
  }
  Py_DECREF(seq);
  return (int)n;
}

/* The layout fits the buffer: the last element's end within size. */
static int check_extent(ArrayObject *v, size_t size) {
  unsigned __int128 end = v->offset;
  int empty = 0;
  for (int i = 0; i < v->ndim; i++) {
    empty |= v->shape[i] == 0;
    end += (unsigned __int128)(v->shape[i] > 0 ? v->shape[i] - 1 : 0) * (uint64_t)v->strides[i] * v->itemsize;
  }
  if (!empty)
    end += v->itemsize;
  if (v->offset > size || end > size) {
    pyum_raise_msg(UM_ERANGE, "view(): the elements run to byte %llu of a buffer of %zu", (unsigned long long)end, size);
    return -1;
  }
  return 0;
}

PyObject *pyum_buffer_view(BufferObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  static const char *const names[] = {"dtype", "shape", "strides", "offset"};
  PyObject *a[4];
  ArrayObject *v;
  int64_t bstrides[MAX_DIMS];
  int ns = -1;
  if (pyum_parse("view", args, nargs, kwnames, names, 4, 1, a) < 0 || pyum_buffer_check(self) < 0)
    return NULL;
  if ((v = PyObject_New(ArrayObject, pyum_array_type())) == NULL)
    return NULL;
  v->buf = NULL;
  v->dtype = NULL;
  v->offset = 0;
  if ((a[3] != NULL && pyum_size(a[3], "offset", &v->offset) < 0) ||
      parse_dtype(a[0], &v->dtype, &v->code, &v->itemsize) < 0)
    goto fail;
  v->bits = (uint8_t)(v->itemsize * 8);
  if (a[1] == NULL || a[1] == Py_None) {
    size_t rest = v->offset <= self->size ? self->size - v->offset : 0;
    if (rest % v->itemsize != 0) {
      pyum_raise_msg(UM_EINVAL, "view(): %zu bytes after offset %zu are not whole %zu-byte elements: give a shape",
                     rest, v->offset, v->itemsize);
      goto fail;
    }
    v->ndim = 1;
    v->shape[0] = (int64_t)(rest / v->itemsize);
  } else if ((v->ndim = parse_dims(a[1], "shape", v->shape)) < 0)
    goto fail;
  if (a[2] != NULL && a[2] != Py_None && (ns = parse_dims(a[2], "strides", bstrides)) < 0)
    goto fail;
  if (ns >= 0 && ns != v->ndim) {
    pyum_raise_msg(UM_EINVAL, "view(): %d strides for %d dimensions", ns, v->ndim);
    goto fail;
  }
  v->contiguous = 1;
  int64_t step = 1; /* C order's stride of dimension i, in elements */
  for (int i = v->ndim - 1; i >= 0; step *= v->shape[i] > 0 ? v->shape[i] : 1, i--) {
    if (ns < 0 || v->shape[i] <= 1) { /* a dimension of one element or none: its stride says nothing */
      v->strides[i] = step;
      continue;
    }
    if (bstrides[i] % (int64_t)v->itemsize != 0) {
      pyum_raise_msg(UM_EINVAL, "view(): strides[%d] = %lld bytes is not a whole number of %zu-byte elements", i,
                     (long long)bstrides[i], v->itemsize);
      goto fail;
    }
    v->strides[i] = bstrides[i] / (int64_t)v->itemsize;
    v->contiguous &= v->shape[i] <= 1 || v->strides[i] == step;
  }
  if (check_extent(v, self->size) < 0)
    goto fail;
  Py_INCREF(self);
  v->buf = self;
  self->exports++; /* given up at the view's dealloc */
  return (PyObject *)v;
fail:
  Py_DECREF(v);
  return NULL;
}

static void Array_dealloc(ArrayObject *self) {
  if (self->buf != NULL) {
    pyum_buffer_unexport(self->buf);
    Py_DECREF(self->buf);
  }
  Py_XDECREF(self->dtype);
  PyObject_Free(self);
}

static PyObject *Array_dlpack(ArrayObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  static const char *const names[] = {"stream", "max_version", "dl_device", "copy"};
  PyObject *a[4];
  if (nargs > 0)
    return PyErr_Format(PyExc_TypeError, "__dlpack__() takes keyword arguments only (%zd positional given)", nargs);
  if (pyum_parse("__dlpack__", args, nargs, kwnames, names, 4, 0, a) < 0)
    return NULL;
  return pyum_export_typed(self->buf, a, self->offset, self->ndim, self->shape, self->contiguous ? NULL : self->strides,
                           self->code, self->bits, 1);
}

static PyObject *Array_dlpack_device(ArrayObject *self, PyObject *unused) {
  return pyum_buffer_dlpack_device(self->buf, unused);
}

static PyObject *dims_tuple(const int64_t *d, int n, size_t scale) {
  PyObject *t = PyTuple_New(n);
  for (int i = 0; t != NULL && i < n; i++) {
    PyObject *x = PyLong_FromLongLong(d[i] * (int64_t)scale);
    if (x == NULL) {
      Py_CLEAR(t);
      break;
    }
    PyTuple_SET_ITEM(t, i, x);
  }
  return t;
}

static PyObject *Array_get_shape(ArrayObject *self, void *c) {
  (void)c;
  return dims_tuple(self->shape, self->ndim, 1);
}

static PyObject *Array_get_strides(ArrayObject *self, void *c) {
  (void)c;
  return dims_tuple(self->strides, self->ndim, self->itemsize);
}

static PyObject *Array_get_dtype(ArrayObject *self, void *c) {
  (void)c;
  return Py_NewRef(self->dtype);
}

static PyObject *Array_get_offset(ArrayObject *self, void *c) {
  (void)c;
  return PyLong_FromSize_t(self->offset);
}

static PyObject *Array_get_buffer(ArrayObject *self, void *c) {
  (void)c;
  return Py_NewRef((PyObject *)self->buf);
}

static PyObject *Array_get_ndim(ArrayObject *self, void *c) {
  (void)c;
  return PyLong_FromLong(self->ndim);
}

/* NumPy's array interface (v3), for host-visible memory: the data pointer
 * stays valid while the view lives, and numpy keeps the view as its base. */
static PyObject *Array_get_interface(ArrayObject *self, void *c) {
  PyObject *typestr, *shape, *strides, *out;
  (void)c;
  if (pyum_buffer_check(self->buf) < 0)
    return NULL;
  if (self->buf->host == NULL)
    return PyErr_Format(PyExc_AttributeError, "__array_interface__: the buffer's memory is not host-visible "
                        "(use numpy.from_dlpack(view, device='cpu') or copy_to)");
  typestr = PyObject_GetAttrString(self->dtype, "str");
  shape = Array_get_shape(self, NULL);
  strides = self->contiguous ? Py_NewRef(Py_None) : Array_get_strides(self, NULL);
  out = typestr && shape && strides
            ? Py_BuildValue("{s:O,s:O,s:O,s:(NO),s:i}", "shape", shape, "typestr", typestr, "strides", strides, "data",
                            PyLong_FromVoidPtr((char *)self->buf->host + self->offset),
                            self->buf->readonly ? Py_True : Py_False, "version", 3)
            : NULL;
  Py_XDECREF(typestr);
  Py_XDECREF(shape);
  Py_XDECREF(strides);
  return out;
}

static PyObject *Array_repr(ArrayObject *self) {
  PyObject *shape = Array_get_shape(self, NULL), *r;
  if (shape == NULL)
    return NULL;
  r = PyUnicode_FromFormat("<unimem.ArrayView %S %S at offset %zu of %R>", self->dtype, shape, self->offset,
                           (PyObject *)self->buf);
  Py_DECREF(shape);
  return r;
}

static PyMethodDef Array_methods[] = {
    {"__dlpack__", (PyCFunction)(void (*)(void))Array_dlpack, METH_FASTCALL | METH_KEYWORDS,
     PyDoc_STR("__dlpack__($self, *, stream=None, max_version=None, dl_device=None, copy=None)\n--\n\n"
               "The view as a DLPack capsule of its dtype, shape and strides (Buffer.__dlpack__'s keywords).")},
    {"__dlpack_device__", (PyCFunction)Array_dlpack_device, METH_NOARGS,
     PyDoc_STR("__dlpack_device__($self, /)\n--\n\nThe buffer's (device_type, device_id).")},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Array_getset[] = {
    {"buffer", (getter)Array_get_buffer, NULL, PyDoc_STR("The Buffer viewed."), NULL},
    {"dtype", (getter)Array_get_dtype, NULL, PyDoc_STR("The elements' numpy.dtype."), NULL},
    {"shape", (getter)Array_get_shape, NULL, PyDoc_STR("The dimensions, a tuple of ints."), NULL},
    {"strides", (getter)Array_get_strides, NULL, PyDoc_STR("The strides in bytes, a tuple (NumPy's convention)."),
     NULL},
    {"offset", (getter)Array_get_offset, NULL, PyDoc_STR("Bytes from the buffer's start to the first element."), NULL},
    {"ndim", (getter)Array_get_ndim, NULL, PyDoc_STR("The number of dimensions."), NULL},
    {"__array_interface__", (getter)Array_get_interface, NULL,
     PyDoc_STR("NumPy's array interface (host-visible buffers; AttributeError otherwise)."), NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject Array_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "unimem.ArrayView",
    .tp_basicsize = sizeof(ArrayObject),
    .tp_dealloc = (destructor)Array_dealloc,
    .tp_repr = (reprfunc)Array_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = PyDoc_STR("A typed view of a Buffer (Buffer.view): dtype, shape, strides, offset; DLPack and NumPy "
                        "take it as an array of that type. The buffer's release waits for the view to go."),
    .tp_methods = Array_methods,
    .tp_getset = Array_getset,
};

PyTypeObject *pyum_array_type(void) { return &Array_Type; }
