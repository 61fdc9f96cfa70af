/* The unimem._core module: error classes, argument helpers, module
 * functions and initialisation. */

#include "pyunimem.h" /* Python.h first, as Python asks */

#include <stdarg.h>

/* ---- Errors ------------------------------------------------------------ */

/* The Python class name of each code. A code added to UM_ERRNO_MAP without
 * a name here fails to compile, so the two lists cannot disagree. */
#define PYUM_PYNAME_OK NULL
#define PYUM_PYNAME_EINVAL "InvalidArgument"
#define PYUM_PYNAME_ERANGE "OutOfRange"
#define PYUM_PYNAME_EOVERFLOW "Overflow"
#define PYUM_PYNAME_ENOMEM "OutOfMemory"
#define PYUM_PYNAME_ENODEV "NoDevice"
#define PYUM_PYNAME_ENOTSUP "NotSupported"
#define PYUM_PYNAME_ESTATE "InvalidState"
#define PYUM_PYNAME_EAGAIN "Again"
#define PYUM_PYNAME_ECANCELED "Canceled"
#define PYUM_PYNAME_EBUSY "Busy"
#define PYUM_PYNAME_EBACKEND "BackendError"
#define PYUM_PYNAME_ELEAK "Leak"

static const struct error_desc {
  int code;
  const char *c_name;
  const char *py_name; /* NULL for UM_OK */
  const char *text;
} error_table[] = {
#define PYUM_ERROR_ROW_(name, value, text) {UM_##name, "UM_" #name, PYUM_PYNAME_##name, text},
    UM_ERRNO_MAP(PYUM_ERROR_ROW_)
#undef PYUM_ERROR_ROW_
};
#define NERRORS (sizeof(error_table) / sizeof(error_table[0]))

/* Set by unimem/__init__.py through _set_error_classes. */
static PyObject *error_base;
static PyObject *error_classes[NERRORS];

static PyObject *error_class_of(int st) {
  for (size_t i = 0; i < NERRORS; i++)
    if (error_table[i].code == st && error_classes[i] != NULL)
      return error_classes[i];
  return error_base;
}

static PyObject *raise_text(int st, const char *msg) {
  PyObject *cls = error_class_of(st), *text, *exc;
  if (cls == NULL) {
    PyErr_Format(PyExc_RuntimeError, "%s: %s", um_err_name(st), msg);
    return NULL;
  }
  /* Backend texts may carry any bytes: never fail on them. */
  text = PyUnicode_DecodeUTF8(msg, (Py_ssize_t)strlen(msg), "replace");
  if (text == NULL)
    return NULL;
  exc = PyObject_CallFunction(cls, "isO", st, um_err_name(st), text);
  Py_DECREF(text);
  if (exc != NULL) {
    PyErr_SetObject(cls, exc);
    Py_DECREF(exc);
  }
  return NULL;
}

PyObject *pyum_raise(int st) {
  const char *detail = um_last_error();
  return raise_text(st, detail != NULL && detail[0] != '\0' ? detail : um_strerror(st));
}

PyObject *pyum_raise_msg(int st, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  PyOS_vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  return raise_text(st, msg);
}

/* _errors() -> ((code, c_name, py_name, text), ...) for every error code. */
static PyObject *core_errors(PyObject *mod, PyObject *unused) {
  PyObject *out = PyTuple_New(NERRORS - 1);
  Py_ssize_t k = 0;
  (void)mod, (void)unused;
  if (out == NULL)
    return NULL;
  for (size_t i = 0; i < NERRORS; i++) {
    PyObject *row;
    if (error_table[i].py_name == NULL)
      continue;
    row = Py_BuildValue("(isss)", error_table[i].code, error_table[i].c_name, error_table[i].py_name,
                        error_table[i].text);
    if (row == NULL) {
      Py_DECREF(out);
      return NULL;
    }
    PyTuple_SET_ITEM(out, k++, row);
  }
  return out;
}

/* _set_error_classes(Error, {code: class}) */
static PyObject *core_set_error_classes(PyObject *mod, PyObject *args) {
  PyObject *base, *classes;
  (void)mod;
  if (!PyArg_ParseTuple(args, "OO!:_set_error_classes", &base, &PyDict_Type, &classes))
    return NULL;
  if (!PyType_Check(base) || !PyType_IsSubtype((PyTypeObject *)base, (PyTypeObject *)PyExc_Exception))
    return PyErr_Format(PyExc_TypeError, "_set_error_classes: Error must be an Exception class");
  for (size_t i = 0; i < NERRORS; i++) {
    PyObject *key, *cls;
    if (error_table[i].py_name == NULL)
      continue;
    key = PyLong_FromLong(error_table[i].code);
    if (key == NULL)
      return NULL;
    cls = PyDict_GetItemWithError(classes, key);
    Py_DECREF(key);
    if (cls == NULL && PyErr_Occurred())
      return NULL;
    if (cls == NULL || !PyType_Check(cls) || !PyType_IsSubtype((PyTypeObject *)cls, (PyTypeObject *)base))
      return PyErr_Format(PyExc_TypeError, "_set_error_classes: no Error subclass for %s", error_table[i].c_name);
    Py_INCREF(cls);
    Py_XSETREF(error_classes[i], cls);
  }
  Py_INCREF(base);
  Py_XSETREF(error_base, base);
  Py_RETURN_NONE;
}

/* ---- Arguments ----------------------------------------------------------- */

int pyum_parse(const char *fname, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
               const char *const *names, int n, int nrequired, PyObject **out) {
  Py_ssize_t nkw = kwnames != NULL ? PyTuple_GET_SIZE(kwnames) : 0;
  for (int i = 0; i < n; i++)
    out[i] = NULL;
  if (nargs > n) {
    PyErr_Format(PyExc_TypeError, "%s() takes at most %d arguments (%zd given)", fname, n, nargs);
    return -1;
  }
  for (Py_ssize_t i = 0; i < nargs; i++)
    out[i] = args[i];
  for (Py_ssize_t k = 0; k < nkw; k++) {
    PyObject *key = PyTuple_GET_ITEM(kwnames, k);
    int j = 0;
    while (j < n && PyUnicode_CompareWithASCIIString(key, names[j]) != 0)
      j++;
    if (j == n) {
      PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument '%S'", fname, key);
      return -1;
    }
    if (out[j] != NULL) {
      PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument '%s'", fname, names[j]);
      return -1;
    }
    out[j] = args[nargs + k];
  }
  for (int i = 0; i < nrequired; i++)
    if (out[i] == NULL) {
      PyErr_Format(PyExc_TypeError, "%s() missing required argument '%s'", fname, names[i]);
      return -1;
    }
  return 0;
}

/* An int that did not fit: InvalidArgument when negative, else Overflow. */
static int raise_unfit(PyObject *n, const char *what, const char *ctype) {
  int overflow = 0;
  long long v;
  PyErr_Clear();
  v = PyLong_AsLongLongAndOverflow(n, &overflow);
  if (v == -1 && PyErr_Occurred())
    return -1;
  if (overflow < 0 || (overflow == 0 && v < 0))
    pyum_raise_msg(UM_EINVAL, "%s must not be negative", what);
  else
    pyum_raise_msg(UM_EOVERFLOW, "%s does not fit in %s", what, ctype);
  return -1;
}

static PyObject *index_of(PyObject *o, const char *what) {
  if (!PyIndex_Check(o)) {
    PyErr_Format(PyExc_TypeError, "%s must be an int, not %.100s", what, Py_TYPE(o)->tp_name);
    return NULL;
  }
  return PyNumber_Index(o);
}

int pyum_size(PyObject *o, const char *what, size_t *out) {
  PyObject *n = index_of(o, what);
  size_t v;
  int rc = 0;
  if (n == NULL)
    return -1;
  v = PyLong_AsSize_t(n);
  if (v == (size_t)-1 && PyErr_Occurred())
    rc = PyErr_ExceptionMatches(PyExc_OverflowError) ? raise_unfit(n, what, "size_t") : -1;
  else
    *out = v;
  Py_DECREF(n);
  return rc;
}

int pyum_u64(PyObject *o, const char *what, uint64_t *out) {
  PyObject *n = index_of(o, what);
  unsigned long long v;
  int rc = 0;
  if (n == NULL)
    return -1;
  v = PyLong_AsUnsignedLongLong(n);
  if (v == (unsigned long long)-1 && PyErr_Occurred())
    rc = PyErr_ExceptionMatches(PyExc_OverflowError) ? raise_unfit(n, what, "64 bits") : -1;
  else
    *out = v;
  Py_DECREF(n);
  return rc;
}

int pyum_flag(PyObject *o, int dflt) { return o == NULL ? dflt : PyObject_IsTrue(o); }

const char *const pyum_location_names[UM_LOCATION_COUNT] = {"host", "device", "pinned", "unified"};

int pyum_host_view(PyObject *obj, Py_buffer *view, int writable, const char *fname) {
  if (!PyObject_CheckBuffer(obj)) {
    PyErr_Format(PyExc_TypeError, "%s() needs an object with the buffer protocol (bytes, bytearray, "
                 "memoryview, numpy array...), not %.100s", fname, Py_TYPE(obj)->tp_name);
    return -1;
  }
  /* Strides asked for, so that a non-contiguous array is described (and
   * refused below with a clear message) rather than refused by its type. */
  if (PyObject_GetBuffer(obj, view, PyBUF_STRIDES) < 0)
    return -1;
  if (!PyBuffer_IsContiguous(view, 'C')) {
    PyBuffer_Release(view);
    PyErr_Format(PyExc_BufferError, "%s(): the %.100s is not C-contiguous; copy it into contiguous memory "
                 "first (numpy.ascontiguousarray)", fname, Py_TYPE(obj)->tp_name);
    return -1;
  }
  if (writable && view->readonly) {
    PyBuffer_Release(view);
    PyErr_Format(PyExc_BufferError, "%s(): the destination %.100s is read-only", fname, Py_TYPE(obj)->tp_name);
    return -1;
  }
  return 0;
}

/* ---- Module -------------------------------------------------------------- */

/* stats_fields() -> ((name, description), ...) in UM_STATS_FIELDS order. */
static PyObject *core_stats_fields(PyObject *mod, PyObject *unused) {
  (void)mod, (void)unused;
  return Py_BuildValue("("
#define PYUM_STATS_FMT_(type, name, desc) "(ss)"
                       UM_STATS_FIELDS(PYUM_STATS_FMT_)
#undef PYUM_STATS_FMT_
                       ")"
#define PYUM_STATS_ARG_(type, name, desc) , #name, desc
                       UM_STATS_FIELDS(PYUM_STATS_ARG_)
#undef PYUM_STATS_ARG_
  );
}

/* Called through atexit: from now on no unimem thread calls into Python. */
static PyObject *core_shutdown(PyObject *mod, PyObject *unused) {
  (void)mod, (void)unused;
  pyum_log_shutdown();
  Py_RETURN_NONE;
}

PyDoc_STRVAR(copy_doc,
"copy(dst, src, nbytes, dst_offset=0, src_offset=0, wait=True)\n--\n\n"
"Copy nbytes from src at src_offset to dst at dst_offset. Either side may be a\n"
"Buffer or any object with the buffer protocol (C-contiguous; dst writable),\n"
"but at least one must be a Buffer. Two Buffers may be the same (ranges may\n"
"overlap: memmove semantics). wait=False returns an Event; the objects stay\n"
"referenced until it is done. OutOfRange when a range exceeds its object.");

static PyMethodDef core_methods[] = {
    {"copy", (PyCFunction)(void (*)(void))pyum_copy, METH_FASTCALL | METH_KEYWORDS, copy_doc},
    {"from_dlpack", (PyCFunction)(void (*)(void))pyum_from_dlpack, METH_FASTCALL | METH_KEYWORDS,
     PyDoc_STR("from_dlpack(m, obj)\n--\n\nA Buffer of Manager m over the memory of obj -- anything with "
               "__dlpack__ (a NumPy array, a PyTorch tensor, a unimem Buffer...) or a DLPack capsule -- without "
               "copying: writes through either side are seen by the other. The tensor must be C-contiguous, on "
               "the CPU (also CUDA host memory), a CUDA device of m or an OpenCL device of m (its ordinal among "
               "m's OpenCL devices). obj's memory is held until the Buffer is released (the producer's deleter "
               "runs exactly once then). A read-only tensor gives a read-only Buffer. CUDA tensors: finish the "
               "producer's pending work first (e.g. torch.cuda.synchronize()); unimem runs on streams of its "
               "own. BufferError for a consumed capsule; the unimem.Error of um_dlpack_import (NotSupported, "
               "NoDevice, ...) for a tensor it cannot wrap.")},
    {"access", (PyCFunction)(void (*)(void))pyum_access_many, METH_FASTCALL | METH_KEYWORDS,
     PyDoc_STR("access(buffers, modes='rw')\n--\n\nAn Access over several Buffers of one device "
               "(um_access_begin_n): use it as `with unimem.access([a, b, c], ['r', 'r', 'rw']) as ac:` "
               "around the caller's command on all of them. modes: one mode for every buffer, or a sequence "
               "of one per buffer ('r', 'w', 'rw', 'discard'). ac.wait_for is one event for all of them, "
               "ac.done ends them all. A Buffer listed twice gets one bracket in the stronger mode. Entering "
               "is all or none: InvalidArgument (buffers of two devices or managers), InvalidState "
               "(released, mapped, already in an access) with no bracket open. See unimem.Access.")},
    {"stats_fields", core_stats_fields, METH_NOARGS,
     PyDoc_STR("stats_fields($module, /)\n--\n\n((name, description), ...): the fields of Manager.stats(), in order.")},
    {"_errors", core_errors, METH_NOARGS, PyDoc_STR("The error codes: ((code, c_name, class_name, text), ...).")},
    {"_set_error_classes", core_set_error_classes, METH_VARARGS,
     PyDoc_STR("Register the Error class and its subclasses by code (done by the package).")},
    {"_set_observe_classes", pyum_set_observe_classes, METH_VARARGS,
     PyDoc_STR("Register the context managers of m.tag() and m.history() (done by the package).")},
    {"_shutdown", core_shutdown, METH_NOARGS,
     PyDoc_STR("Stop calling Python from unimem's threads (registered with atexit by the package).")},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef core_module = {
    PyModuleDef_HEAD_INIT, "unimem._core",
    PyDoc_STR("The C part of the unimem package; use the unimem package itself."), -1, core_methods,
    NULL, NULL, NULL, NULL,
};

PyTypeObject *Device_Type;

static PyStructSequence_Field device_fields[] = {
    {"index", "position in the manager; 0 is the host CPU"},
    {"name", "the device's own name"},
    {"backend", "'cpu', 'opencl' or 'cuda'"},
    {"total_bytes", "device memory (host: physical RAM)"},
    {"locations", "the locations it can allocate, as names"},
    {NULL, NULL},
};

static PyStructSequence_Desc device_desc = {
    "unimem.Device", PyDoc_STR("Device(index, name, backend, total_bytes, locations): one device of a Manager."),
    device_fields, 5,
};

static int add_type(PyObject *mod, PyTypeObject *type, const char *name) {
  if (PyType_Ready(type) < 0)
    return -1;
  Py_INCREF(type);
  if (PyModule_AddObject(mod, name, (PyObject *)type) < 0) {
    Py_DECREF(type);
    return -1;
  }
  return 0;
}

PyMODINIT_FUNC PyInit__core(void) {
  PyObject *mod = PyModule_Create(&core_module);
  if (mod == NULL)
    return NULL;
  Device_Type = PyStructSequence_NewType(&device_desc);
  if (Device_Type == NULL || add_type(mod, Device_Type, "Device") < 0 ||
      add_type(mod, &Manager_Type, "Manager") < 0 || add_type(mod, &Buffer_Type, "Buffer") < 0 ||
      add_type(mod, &Event_Type, "Event") < 0 || add_type(mod, &Mapping_Type, "Mapping") < 0 ||
      add_type(mod, pyum_access_type(), "Access") < 0 || add_type(mod, pyum_array_type(), "ArrayView") < 0 ||
      PyModule_AddStringConstant(mod, "__version__", um_version_string()) < 0 ||
      PyModule_AddIntConstant(mod, "version_hex", (long)um_version()) < 0 ||
      PyModule_AddObject(mod, "OPTION_NAMES", pyum_option_names()) < 0) {
    Py_DECREF(mod);
    return NULL;
  }
  return mod;
}
