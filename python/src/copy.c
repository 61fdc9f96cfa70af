/* Data movement: Buffer.copy_from, Buffer.copy_to, Buffer.fill and
 * unimem.copy. Every argument is converted (which may run Python code:
 * __index__, __bool__) before the buffers' state is checked, and the C call
 * runs without the GIL with the buffers pinned. */
#include "pyunimem.h"

/* One copy: dst/src are Buffers, or NULL for the host side in host. */
typedef struct copy_req {
  BufferObject *dst, *src;
  size_t dst_off, src_off, bytes;
  Py_buffer host; /* host.obj NULL: Buffer to Buffer */
  int wait;
} copy_req;

static void pin(BufferObject *b) {
  if (b != NULL)
    b->calls++;
}

static void unpin(BufferObject *b) {
  if (b != NULL)
    pyum_buffer_unpin_call(b);
}

static void host_release(Py_buffer *host) {
  if (host->obj != NULL)
    PyBuffer_Release(host);
}

/* The host range of a copy must not overlap the buffer's own range: the
 * host side is read or written with memcpy. */
static int check_overlap(const BufferObject *b, size_t off, const void *p, size_t n, const char *fname) {
  uintptr_t a0, h0;
  if (b->host == NULL || off > b->size || n > b->size - off)
    return 0; /* no host view, or the range check fails first */
  a0 = (uintptr_t)b->host + off;
  h0 = (uintptr_t)p;
  if (a0 < h0 + n && h0 < a0 + n) {
    pyum_raise_msg(UM_EINVAL, "%s(): the host object overlaps the buffer's range; copy within a buffer "
                   "with unimem.copy(b, b, ...)", fname);
    return -1;
  }
  return 0;
}

/* Issue the copy (consumes r->host): None once done, or an Event. */
static PyObject *copy_run(copy_req *r) {
  BufferObject *any = r->dst != NULL ? r->dst : r->src;
  char *hostp = r->host.buf;
  PyObject *out;
  um_event *ev = NULL;
  um_event **done = r->wait ? NULL : &ev;
  int st;
  pin(r->dst);
  pin(r->src);
  Py_BEGIN_ALLOW_THREADS
  if (r->src == NULL)
    st = um_copy_from_host(r->dst->b, r->dst_off, hostp + r->src_off, r->bytes, done);
  else if (r->dst == NULL)
    st = um_copy_to_host(r->src->b, r->src_off, hostp + r->dst_off, r->bytes, done);
  else
    st = um_copy(r->dst->b, r->dst_off, r->src->b, r->src_off, r->bytes, done);
  Py_END_ALLOW_THREADS
  if (st != UM_OK) {
    pyum_raise(st);
    out = NULL;
  } else if (r->wait) {
    Py_INCREF(Py_None);
    out = Py_None;
  } else {
    /* Before the unpins: a release or close() that waited for them must
     * find the event counted among the manager's handles. */
    out = pyum_event_new(any->mgr, ev, (PyObject *)r->dst, (PyObject *)r->src, &r->host);
  }
  host_release(&r->host); /* unless the event took it */
  unpin(r->src);
  unpin(r->dst);
  return out;
}

static int check_buffers(copy_req *r) {
  if ((r->dst != NULL && pyum_buffer_check(r->dst) < 0) || (r->src != NULL && pyum_buffer_check(r->src) < 0))
    return -1;
  return 0;
}

/* copy_from(obj, offset=0, wait=True) and copy_to(obj, offset=0, wait=True) */
static PyObject *buffer_host_copy(BufferObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                                  int to_host) {
  static const char *const names[] = {"obj", "offset", "wait"};
  const char *fname = to_host ? "copy_to" : "copy_from";
  PyObject *a[3];
  copy_req r = {0};
  size_t off = 0;
  if (pyum_parse(fname, args, nargs, kwnames, names, 3, 1, a) < 0 ||
      (a[1] != NULL && pyum_size(a[1], "offset", &off) < 0) || (r.wait = pyum_flag(a[2], 1)) < 0 ||
      pyum_buffer_check(self) < 0 || pyum_host_view(a[0], &r.host, to_host, fname) < 0)
    return NULL;
  r.bytes = (size_t)r.host.len;
  if (to_host)
    r.src = self, r.src_off = off;
  else
    r.dst = self, r.dst_off = off;
  if (check_overlap(self, off, r.host.buf, r.bytes, fname) < 0) {
    PyBuffer_Release(&r.host);
    return NULL;
  }
  return copy_run(&r);
}

PyObject *pyum_buffer_copy_from(BufferObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  return buffer_host_copy(self, args, nargs, kwnames, 0);
}

PyObject *pyum_buffer_copy_to(BufferObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  return buffer_host_copy(self, args, nargs, kwnames, 1);
}

/* The host side of unimem.copy: its range checked like a buffer's. */
static int copy_host_side(copy_req *r, PyObject *obj, int is_dst) {
  size_t off = is_dst ? r->dst_off : r->src_off;
  BufferObject *other = is_dst ? r->src : r->dst;
  size_t other_off = is_dst ? r->src_off : r->dst_off;
  if (pyum_host_view(obj, &r->host, is_dst, "copy") < 0)
    return -1;
  if (off > (size_t)r->host.len || r->bytes > (size_t)r->host.len - off) {
    pyum_raise_msg(UM_ERANGE, "copy: range [%zu, +%zu) outside the %zd bytes of the %s %.100s", off, r->bytes,
                   r->host.len, is_dst ? "destination" : "source", Py_TYPE(obj)->tp_name);
    PyBuffer_Release(&r->host);
    return -1;
  }
  if (check_overlap(other, other_off, (char *)r->host.buf + off, r->bytes, "copy") < 0) {
    PyBuffer_Release(&r->host);
    return -1;
  }
  return 0;
}

PyObject *pyum_copy(PyObject *mod, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  static const char *const names[] = {"dst", "src", "nbytes", "dst_offset", "src_offset", "wait"};
  PyObject *a[6];
  copy_req r = {0};
  int dst_is_buf, src_is_buf;
  (void)mod;
  if (pyum_parse("copy", args, nargs, kwnames, names, 6, 3, a) < 0 || pyum_size(a[2], "nbytes", &r.bytes) < 0 ||
      (a[3] != NULL && pyum_size(a[3], "dst_offset", &r.dst_off) < 0) ||
      (a[4] != NULL && pyum_size(a[4], "src_offset", &r.src_off) < 0) || (r.wait = pyum_flag(a[5], 1)) < 0)
    return NULL;
  dst_is_buf = PyObject_TypeCheck(a[0], &Buffer_Type);
  src_is_buf = PyObject_TypeCheck(a[1], &Buffer_Type);
  if (!dst_is_buf && !src_is_buf)
    return PyErr_Format(PyExc_TypeError, "copy(): dst or src must be a unimem.Buffer (got %.100s and %.100s)",
                        Py_TYPE(a[0])->tp_name, Py_TYPE(a[1])->tp_name);
  r.dst = dst_is_buf ? (BufferObject *)a[0] : NULL;
  r.src = src_is_buf ? (BufferObject *)a[1] : NULL;
  if (check_buffers(&r) < 0)
    return NULL;
  if (r.dst != NULL && r.src != NULL && r.dst->mgr != r.src->mgr)
    return pyum_raise_msg(UM_EINVAL, "copy(): the buffers belong to different managers");
  if ((!dst_is_buf && copy_host_side(&r, a[0], 1) < 0) || (!src_is_buf && copy_host_side(&r, a[1], 0) < 0))
    return NULL;
  return copy_run(&r);
}

static int parse_byte(PyObject *o, int *byte) {
  int overflow = 0;
  long v;
  if (!PyLong_Check(o)) {
    PyErr_Format(PyExc_TypeError, "byte must be an int, not %.100s", Py_TYPE(o)->tp_name);
    return -1;
  }
  v = PyLong_AsLongAndOverflow(o, &overflow);
  if (v == -1 && PyErr_Occurred())
    return -1;
  if (overflow || v < 0 || v > 255) {
    pyum_raise_msg(UM_EINVAL, "byte must be in 0..255");
    return -1;
  }
  *byte = (int)v;
  return 0;
}

PyObject *pyum_buffer_fill(BufferObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  static const char *const names[] = {"byte", "offset", "nbytes", "wait"};
  PyObject *a[4];
  size_t off = 0, n = 0;
  int byte, wait, st;
  um_event *ev = NULL;
  PyObject *out;
  if (pyum_parse("fill", args, nargs, kwnames, names, 4, 1, a) < 0 || parse_byte(a[0], &byte) < 0 ||
      (a[1] != NULL && pyum_size(a[1], "offset", &off) < 0) ||
      (a[2] != NULL && a[2] != Py_None && pyum_size(a[2], "nbytes", &n) < 0) || (wait = pyum_flag(a[3], 1)) < 0 ||
      pyum_buffer_check(self) < 0)
    return NULL;
  if (a[2] == NULL || a[2] == Py_None) {
    if (off >= self->size)
      return pyum_raise_msg(UM_ERANGE, "fill: offset %zu is outside the buffer's %zu bytes", off, self->size);
    n = self->size - off;
  }
  self->calls++;
  Py_BEGIN_ALLOW_THREADS
  st = um_fill(self->b, off, byte, n, wait ? NULL : &ev);
  Py_END_ALLOW_THREADS
  if (st != UM_OK) {
    out = pyum_raise(st);
  } else if (wait) {
    Py_INCREF(Py_None);
    out = Py_None;
  } else { /* before the unpin, as in copy_run */
    out = pyum_event_new(self->mgr, ev, (PyObject *)self, NULL, NULL);
  }
  pyum_buffer_unpin_call(self);
  return out;
}
