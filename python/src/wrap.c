/* Manager.wrap_host: a Buffer over the memory of any contiguous object with
 * the buffer protocol (um_wrap_host), holding the object's export until
 * the wrap's release has returned (which waits for the wrap's operations).
 * Manager.map_file: a file mapped as a host Buffer (um_map_file). */
#include "pyunimem.h"

const char pyum_wrap_host_doc[] =
    "wrap_host($self, obj, readonly=None, pin=False)\n--\n\n"
    "A host Buffer (device 0) over the memory of obj, zero-copy: any C-contiguous\n"
    "object with the buffer protocol (bytearray, numpy array, mmap, memoryview).\n"
    "Writes through unimem (copy_to, fill, writable maps, DLPack) reach obj's\n"
    "memory. readonly=None follows obj (bytes is read-only: writes through unimem\n"
    "raise InvalidState); True makes a writable object read-only to unimem; False\n"
    "asks for a writable export (the object's error when it has none). pin=True\n"
    "page-locks the range while wrapped. The Buffer keeps obj exported (a bytearray\n"
    "cannot be resized meanwhile) until its release has happened: release() of a\n"
    "wrap with operations in flight (an Event not yet seen done) is deferred until\n"
    "they end. InvalidArgument for an empty or non-contiguous object.";

const char pyum_map_file_doc[] =
    "map_file($self, path, mode='r')\n--\n\n"
    "A file mapped as a host Buffer on device 0 (mmap, zero-copy; um_map_file).\n"
    "mode 'r' maps read-only (writes through unimem raise InvalidState, views are\n"
    "read-only); 'rw' and 'w' map shared, so writes reach the file. InvalidArgument\n"
    "for an empty file or anything but a regular file; NoDevice when it cannot be\n"
    "opened. A file truncated by another process while mapped is outside the\n"
    "contract (touching the lost pages raises SIGBUS, as for every user of mmap).";

PyObject *pyum_manager_wrap_host(ManagerObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  static const char *const names[] = {"obj", "readonly", "pin"};
  PyObject *a[3], *out;
  Py_buffer view;
  um_buffer *b = NULL;
  unsigned flags = 0;
  int readonly = -1, pin, st; /* readonly -1: as obj says */
  if (pyum_parse("wrap_host", args, nargs, kwnames, names, 3, 1, a) < 0 ||
      (a[1] != NULL && a[1] != Py_None && (readonly = pyum_flag(a[1], 0)) < 0) || (pin = pyum_flag(a[2], 0)) < 0 ||
      pyum_manager_check(self) < 0)
    return NULL;
  /* A writable export where the object gives one, unless read-only is asked. */
  if (readonly == 1 || PyObject_GetBuffer(a[0], &view, PyBUF_STRIDES | PyBUF_WRITABLE) < 0) {
    if (readonly == 0)
      return NULL; /* writable asked of an object that is not */
    PyErr_Clear();
    if (PyObject_GetBuffer(a[0], &view, PyBUF_STRIDES) < 0)
      return NULL;
  }
  if (!PyBuffer_IsContiguous(&view, 'C')) {
    PyBuffer_Release(&view);
    return pyum_raise_msg(UM_EINVAL, "wrap_host(): obj is not C-contiguous");
  }
  if (view.len == 0) {
    PyBuffer_Release(&view);
    return pyum_raise_msg(UM_EINVAL, "wrap_host(): obj has no bytes");
  }
  if (view.readonly || readonly == 1)
    flags |= UM_WRAP_READONLY;
  if (pin)
    flags |= UM_WRAP_PIN;
  self->calls++;
  Py_BEGIN_ALLOW_THREADS
  st = um_wrap_host(self->m, view.buf, (size_t)view.len, flags, &b);
  Py_END_ALLOW_THREADS
  self->calls--;
  if (st != UM_OK) {
    PyBuffer_Release(&view);
    pyum_raise(st);
    pyum_manager_maybe_destroy(self, 0);
    return NULL;
  }
  if ((out = pyum_buffer_new(self, b)) == NULL) { /* the wrap was released: its memory may go */
    PyBuffer_Release(&view);
    return NULL;
  }
  ((BufferObject *)out)->readonly = (flags & UM_WRAP_READONLY) != 0;
  ((BufferObject *)out)->wrapped = 1;
  ((BufferObject *)out)->source = view;
  return out;
}

PyObject *pyum_manager_map_file(ManagerObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  static const char *const names[] = {"path", "mode"};
  PyObject *a[2], *path = NULL, *out;
  um_map_mode mode = UM_MAP_READ;
  um_buffer *b = NULL;
  int st;
  if (pyum_parse("map_file", args, nargs, kwnames, names, 2, 1, a) < 0 ||
      (a[1] != NULL && pyum_parse_map_mode(a[1], &mode) < 0) || !PyUnicode_FSConverter(a[0], &path))
    return NULL;
  if (pyum_manager_check(self) < 0) {
    Py_DECREF(path);
    return NULL;
  }
  self->calls++;
  Py_BEGIN_ALLOW_THREADS
  st = um_map_file(self->m, PyBytes_AS_STRING(path), mode, &b);
  Py_END_ALLOW_THREADS
  self->calls--;
  Py_DECREF(path);
  if (st != UM_OK) {
    pyum_raise(st);
    pyum_manager_maybe_destroy(self, 0);
    return NULL;
  }
  if ((out = pyum_buffer_new(self, b)) != NULL)
    ((BufferObject *)out)->readonly = mode == UM_MAP_READ;
  return out;
}
