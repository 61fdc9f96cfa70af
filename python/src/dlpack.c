/* DLPack in Python (the array API standard's protocol): Buffer.__dlpack__,
 * Buffer.__dlpack_device__ and unimem.from_dlpack.
 *
 * An exported tensor is um_dlpack_export's, with the Python side's own
 * deleter put in front of unimem's: the tensor also holds the Buffer object
 * (a strong reference, counted as one of its exports), so that neither
 * release() nor close() gives the handle up, nor destroys the manager,
 * while a consumer holds the memory. The deleter may run on any thread,
 * with or without the GIL: it takes the GIL for the Python part.
 *
 * Capsules: "dltensor" (legacy, what NumPy 1.x and PyTorch 1.x take) or
 * "dltensor_versioned" (max_version >= (1, 0)); a consumer renames the
 * capsule "used_..." and calls the deleter itself; a capsule never consumed
 * calls it when it dies. */
#include "pyunimem.h"

#include <unimem_dlpack.h>

#define CAPSULE_LEGACY "dltensor"
#define CAPSULE_VERSIONED "dltensor_versioned"
#define CAPSULE_LEGACY_USED "used_dltensor"
#define CAPSULE_VERSIONED_USED "used_dltensor_versioned"

static int interpreter_alive(void) {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsInitialized() && !Py_IsFinalizing();
#else
  return Py_IsInitialized() && !_Py_IsFinalizing();
#endif
}

/* ---- Export ---------------------------------------------------------------- */

typedef struct export_owner {
  void *unimem_ctx;          /* um_dlpack_export's manager_ctx and deleter */
  void (*unimem_delete)(void *self);
  BufferObject *buffer;      /* a reference and one of its exports */
} export_owner;

/* Unimem's part (the buffer's retain, the tensor's block), then ours. */
static void owner_done(export_owner *o, void (*unimem_delete)(void *), void *tensor) {
  BufferObject *buf = o->buffer;
  unimem_delete(tensor);
  free(o);
  if (!interpreter_alive())
    return; /* the Buffer object is left to die with the interpreter */
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  pyum_buffer_unexport(buf);
  Py_DECREF(buf);
  PyErr_Restore(type, value, tb);
  PyGILState_Release(gil);
}

static void delete_legacy(um_dl_managed_tensor *t) {
  export_owner *o = t->manager_ctx;
  t->manager_ctx = o->unimem_ctx;
  t->deleter = (void (*)(um_dl_managed_tensor *))(void (*)(void))o->unimem_delete;
  owner_done(o, o->unimem_delete, t);
}

static void delete_versioned(um_dl_managed_tensor_versioned *t) {
  export_owner *o = t->manager_ctx;
  t->manager_ctx = o->unimem_ctx;
  t->deleter = (void (*)(um_dl_managed_tensor_versioned *))(void (*)(void))o->unimem_delete;
  owner_done(o, o->unimem_delete, t);
}

/* A capsule nobody consumed: its tensor is deleted with it. */
static void capsule_destructor(PyObject *capsule) {
  PyObject *type, *value, *tb;
  const char *name;
  PyErr_Fetch(&type, &value, &tb);
  name = PyCapsule_GetName(capsule);
  if (name != NULL && strcmp(name, CAPSULE_LEGACY) == 0) {
    um_dl_managed_tensor *t = PyCapsule_GetPointer(capsule, name);
    if (t != NULL && t->deleter != NULL)
      t->deleter(t);
  } else if (name != NULL && strcmp(name, CAPSULE_VERSIONED) == 0) {
    um_dl_managed_tensor_versioned *t = PyCapsule_GetPointer(capsule, name);
    if (t != NULL && t->deleter != NULL)
      t->deleter(t);
  }
  PyErr_Clear();
  PyErr_Restore(type, value, tb);
}

/* An export failure as the array API asks (BufferError), with unimem's
 * code and text; a released buffer stays InvalidState like everywhere. */
static PyObject *export_error(int st) {
  if (st == UM_ESTATE && strstr(um_last_error(), "was released") != NULL)
    return pyum_raise(st);
  return PyErr_Format(PyExc_BufferError, "unimem.Buffer.__dlpack__: %s (%s)", um_last_error(), um_err_name(st));
}

/* Wrap the tensor um_dlpack_export made in our deleter and a capsule. */
static PyObject *export_capsule(BufferObject *buf, void *tensor, int versioned) {
  export_owner *o = malloc(sizeof(*o));
  PyObject *capsule;
  if (o == NULL) {
    if (versioned)
      ((um_dl_managed_tensor_versioned *)tensor)->deleter(tensor);
    else
      ((um_dl_managed_tensor *)tensor)->deleter(tensor);
    return PyErr_NoMemory();
  }
  Py_INCREF(buf);
  buf->exports++;
  o->buffer = buf;
  if (versioned) {
    um_dl_managed_tensor_versioned *t = tensor;
    o->unimem_ctx = t->manager_ctx;
    o->unimem_delete = (void (*)(void *))(void (*)(void))t->deleter;
    t->manager_ctx = o;
    t->deleter = delete_versioned;
  } else {
    um_dl_managed_tensor *t = tensor;
    o->unimem_ctx = t->manager_ctx;
    o->unimem_delete = (void (*)(void *))(void (*)(void))t->deleter;
    t->manager_ctx = o;
    t->deleter = delete_legacy;
  }
  capsule = PyCapsule_New(tensor, versioned ? CAPSULE_VERSIONED : CAPSULE_LEGACY, capsule_destructor);
  if (capsule == NULL) {
    if (versioned)
      ((um_dl_managed_tensor_versioned *)tensor)->deleter(tensor);
    else
      ((um_dl_managed_tensor *)tensor)->deleter(tensor);
  }
  return capsule;
}

/* max_version: None (legacy) or a (major, minor) tuple of ints. */
static int parse_max_version(PyObject *o, int *versioned) {
  long major;
  *versioned = 0;
  if (o == NULL || o == Py_None)
    return 0;
  if (!PyTuple_Check(o) || PyTuple_GET_SIZE(o) != 2 || !PyLong_Check(PyTuple_GET_ITEM(o, 0)) ||
      !PyLong_Check(PyTuple_GET_ITEM(o, 1))) {
    PyErr_Format(PyExc_TypeError, "max_version must be None or a (major, minor) tuple of ints, not %.100R", o);
    return -1;
  }
  major = PyLong_AsLong(PyTuple_GET_ITEM(o, 0));
  if (major == -1 && PyErr_Occurred()) {
    if (!PyErr_ExceptionMatches(PyExc_OverflowError))
      return -1;
    PyErr_Clear();
    major = 1; /* a huge major version: ours is the best it can get */
  }
  *versioned = major >= 1;
  return 0;
}

/* dl_device: None or a (device_type, device_id) pair of ints. */
static int parse_dl_device(PyObject *o, int32_t *type, int32_t *id, int *given) {
  long v[2];
  *given = o != NULL && o != Py_None;
  if (!*given)
    return 0;
  if (!PyTuple_Check(o) || PyTuple_GET_SIZE(o) != 2) {
    PyErr_Format(PyExc_TypeError, "dl_device must be None or a (device_type, device_id) tuple, not %.100R", o);
    return -1;
  }
  for (int i = 0; i < 2; i++) {
    PyObject *item = PyTuple_GET_ITEM(o, i);
    int overflow = 0;
    if (!PyLong_Check(item)) {
      PyErr_Format(PyExc_TypeError, "dl_device must hold ints, not %.100s", Py_TYPE(item)->tp_name);
      return -1;
    }
    v[i] = PyLong_AsLongAndOverflow(item, &overflow);
    if (v[i] == -1 && PyErr_Occurred())
      return -1;
    if (overflow || v[i] < INT32_MIN || v[i] > INT32_MAX)
      v[i] = -1; /* no such device: refused below */
  }
  *type = (int32_t)v[0];
  *id = (int32_t)v[1];
  return 0;
}

/* stream: None or an int; on anything but CUDA, None or -1 (the array API:
 * no stream exists there). */
static int check_stream(PyObject *o, int32_t device_type) {
  long v;
  if (o == NULL || o == Py_None)
    return 0;
  if (!PyLong_Check(o) || PyBool_Check(o)) {
    PyErr_Format(PyExc_TypeError, "stream must be None or an int, not %.100s", Py_TYPE(o)->tp_name);
    return -1;
  }
  if (device_type == UM_DL_CUDA || device_type == UM_DL_CUDA_MANAGED)
    return 0; /* unimem waits for the buffer's operations on the host: any stream may read */
  v = PyLong_AsLong(o);
  if (v == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    v = 0;
  }
  if (v != -1) {
    PyErr_Format(PyExc_ValueError, "stream must be None for a tensor on DLPack device type %d", (int)device_type);
    return -1;
  }
  return 0;
}

/* copy=True (or a host dl_device for device memory): a new buffer with the
 * same bytes, on the host (to_host) or where self is. */
static BufferObject *export_copy(BufferObject *self, int to_host) {
  um_manager *m = self->mgr->m;
  um_device *d = um_device_get(m, to_host ? 0 : self->device);
  um_location loc = to_host ? UM_HOST : (um_location)self->location;
  um_buffer *nb = NULL;
  int st;
  self->calls++;
  self->mgr->calls++;
  Py_BEGIN_ALLOW_THREADS
  st = um_alloc(m, d, self->size, loc, 0, &nb);
  if (st == UM_OK && (st = um_copy(nb, 0, self->b, 0, self->size, NULL)) != UM_OK) {
    um_release(nb);
    nb = NULL;
  }
  Py_END_ALLOW_THREADS
  self->mgr->calls--;
  if (st != UM_OK) {
    pyum_raise(st);
    pyum_buffer_unpin_call(self);
    return NULL;
  }
  pyum_buffer_unpin_call(self);
  return (BufferObject *)pyum_buffer_new(self->mgr, nb);
}

/* Which buffer to export: self, or a copy (copy=True, or a host dl_device
 * asked of device memory and copy not False). A new reference. */
static BufferObject *export_source(BufferObject *self, int32_t type, int32_t id, int dl_given, int32_t want_type,
                                   int32_t want_id, int copy, int *copied) {
  int to_host = 0;
  *copied = 0;
  if (dl_given && (want_type != type || want_id != id)) {
    if (want_type != UM_DL_CPU || want_id != 0 || copy == 0) {
      PyErr_Format(PyExc_BufferError,
                   "unimem.Buffer.__dlpack__: the buffer is on DLPack device (%d, %d), not (%d, %d)%s", (int)type,
                   (int)id, (int)want_type, (int)want_id,
                   want_type == UM_DL_CPU && want_id == 0 ? " (copy=False forbids the copy to the host)" : "");
      return NULL;
    }
    to_host = 1;
  }
  if (copy != 1 && !to_host) {
    Py_INCREF(self);
    return self;
  }
  *copied = 1;
  return export_copy(self, to_host);
}

/* __dlpack__ of self's bytes [offset, ...) as ndim dimensions of shape
 * (strides in elements, NULL: C-contiguous) of a dtype: Buffer.__dlpack__
 * (uint8, the whole buffer) and ArrayView.__dlpack__ (array.c). a: the
 * keywords stream, max_version, dl_device, copy (NULL where not given). */
PyObject *pyum_export_typed(BufferObject *self, PyObject *const *a, size_t offset, int ndim, const int64_t *shape,
                            const int64_t *strides, uint8_t code, uint8_t bits, uint16_t lanes) {
  PyObject *capsule;
  BufferObject *src;
  int32_t type, id, want_type = 0, want_id = 0;
  int versioned, dl_given, copy, copied, st;
  void *tensor = NULL;
  if (parse_max_version(a[1], &versioned) < 0 || parse_dl_device(a[2], &want_type, &want_id, &dl_given) < 0 ||
      pyum_buffer_check(self) < 0)
    return NULL;
  copy = a[3] == NULL || a[3] == Py_None ? -1 : PyObject_IsTrue(a[3]);
  if (copy == -1 && PyErr_Occurred())
    return NULL;
  if ((st = um_dlpack_device(self->b, &type, &id)) != UM_OK)
    return export_error(st);
  if (check_stream(a[0], type) < 0 ||
      (src = export_source(self, type, id, dl_given, want_type, want_id, copy, &copied)) == NULL)
    return NULL;
  if (src->readonly && !versioned) {
    Py_DECREF(src);
    return PyErr_Format(PyExc_BufferError, "unimem.Buffer.__dlpack__: the buffer is read-only, which a legacy "
                        "DLPack capsule cannot say; ask for max_version=(1, 0)");
  }
  st = um_dlpack_export(src->b, offset, ndim, shape, strides, code, bits, lanes,
                        (versioned ? UM_DLPACK_VERSIONED : 0) | (copied && versioned ? UM_DLPACK_COPIED : 0), &tensor);
  capsule = st == UM_OK ? export_capsule(src, tensor, versioned) : export_error(st);
  Py_DECREF(src);
  return capsule;
}

PyObject *pyum_buffer_dlpack(BufferObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  static const char *const names[] = {"stream", "max_version", "dl_device", "copy"};
  PyObject *a[4];
  if (nargs > 0)
    return PyErr_Format(PyExc_TypeError, "__dlpack__() takes keyword arguments only (%zd positional given)", nargs);
  if (pyum_parse("__dlpack__", args, nargs, kwnames, names, 4, 0, a) < 0)
    return NULL;
  int64_t shape[1] = {(int64_t)self->size};
  return pyum_export_typed(self, a, 0, 1, shape, NULL, UM_DL_UINT, 8, 1);
}

PyObject *pyum_buffer_dlpack_device(BufferObject *self, PyObject *unused) {
  int32_t type, id;
  int st;
  (void)unused;
  if (pyum_buffer_check(self) < 0)
    return NULL;
  if ((st = um_dlpack_device(self->b, &type, &id)) != UM_OK)
    return export_error(st);
  return Py_BuildValue("(ii)", (int)type, (int)id);
}

/* ---- Import ---------------------------------------------------------------- */

/* obj's capsule: obj itself, or obj.__dlpack__(max_version=(1, 0)), or,
 * for producers that predate max_version (NumPy 1.x, PyTorch 1.x),
 * obj.__dlpack__(). A new reference. */
static PyObject *capsule_of(PyObject *obj) {
  PyObject *method, *capsule, *kwargs, *noargs;
  if (PyCapsule_CheckExact(obj)) {
    Py_INCREF(obj);
    return obj;
  }
  if ((method = PyObject_GetAttrString(obj, "__dlpack__")) == NULL) {
    if (!PyErr_ExceptionMatches(PyExc_AttributeError))
      return NULL;
    PyErr_Clear();
    return PyErr_Format(PyExc_TypeError, "from_dlpack() needs an object with __dlpack__ or a DLPack capsule, "
                        "not %.100s", Py_TYPE(obj)->tp_name);
  }
  kwargs = Py_BuildValue("{s(ii)}", "max_version", UM_DL_MAJOR_VERSION, UM_DL_MINOR_VERSION);
  noargs = PyTuple_New(0);
  capsule = kwargs != NULL && noargs != NULL ? PyObject_Call(method, noargs, kwargs) : NULL;
  Py_XDECREF(kwargs);
  Py_XDECREF(noargs);
  if (capsule == NULL && PyErr_ExceptionMatches(PyExc_TypeError)) {
    PyErr_Clear();
    capsule = PyObject_CallNoArgs(method);
  }
  Py_DECREF(method);
  if (capsule != NULL && !PyCapsule_CheckExact(capsule)) {
    PyErr_Format(PyExc_TypeError, "%.100s.__dlpack__() returned %.100s, not a capsule", Py_TYPE(obj)->tp_name,
                 Py_TYPE(capsule)->tp_name);
    Py_CLEAR(capsule);
  }
  return capsule;
}

PyObject *pyum_from_dlpack(PyObject *mod, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  static const char *const names[] = {"m", "obj"};
  PyObject *a[2], *capsule, *out;
  ManagerObject *mgr;
  const char *name;
  unsigned flags;
  um_buffer *b = NULL;
  void *tensor;
  int st, readonly = 0;
  (void)mod;
  if (pyum_parse("from_dlpack", args, nargs, kwnames, names, 2, 2, a) < 0)
    return NULL;
  if (!PyObject_TypeCheck(a[0], &Manager_Type))
    return PyErr_Format(PyExc_TypeError, "from_dlpack() needs a unimem.Manager first, not %.100s",
                        Py_TYPE(a[0])->tp_name);
  mgr = (ManagerObject *)a[0];
  if (pyum_manager_check(mgr) < 0 || (capsule = capsule_of(a[1])) == NULL)
    return NULL;
  name = PyCapsule_GetName(capsule);
  if (name == NULL || (strcmp(name, CAPSULE_LEGACY) != 0 && strcmp(name, CAPSULE_VERSIONED) != 0)) {
    PyErr_Clear();
    Py_DECREF(capsule);
    return PyErr_Format(PyExc_BufferError, "from_dlpack(): the capsule is named '%s', not '" CAPSULE_LEGACY
                        "' or '" CAPSULE_VERSIONED "' (a capsule can be consumed once)", name ? name : "");
  }
  flags = strcmp(name, CAPSULE_VERSIONED) == 0 ? UM_DLPACK_VERSIONED : 0;
  if ((tensor = PyCapsule_GetPointer(capsule, name)) == NULL) {
    Py_DECREF(capsule);
    return NULL;
  }
  if (flags & UM_DLPACK_VERSIONED)
    readonly = (((um_dl_managed_tensor_versioned *)tensor)->flags & UM_DL_FLAG_READ_ONLY) != 0;
  if ((st = um_dlpack_import(mgr->m, tensor, flags, &b)) != UM_OK) {
    Py_DECREF(capsule);
    return pyum_raise(st);
  }
  /* The buffer owns the tensor now: the capsule must not delete it. */
  PyCapsule_SetName(capsule, flags ? CAPSULE_VERSIONED_USED : CAPSULE_LEGACY_USED);
  Py_DECREF(capsule);
  if ((out = pyum_buffer_new(mgr, b)) != NULL) {
    ((BufferObject *)out)->readonly = readonly;
    ((BufferObject *)out)->wrapped = 1;
  }
  return out;
}
