/* unimem.Event: completion of an asynchronous operation. It keeps the
 * operation's Buffer objects and host memory (a Py_buffer export, so a
 * bytearray cannot even be resized) until the operation is seen done; an
 * Event dropped before that waits for the operation in its deallocation. */
#include "pyunimem.h"

static void event_link(EventObject *self) {
  ManagerObject *mgr = self->mgr;
  self->prev = NULL;
  self->next = mgr->events;
  if (mgr->events != NULL)
    mgr->events->prev = self;
  mgr->events = self;
}

static void event_unlink(EventObject *self) {
  ManagerObject *mgr = self->mgr;
  if (self->prev != NULL)
    self->prev->next = self->next;
  else if (mgr->events == self)
    mgr->events = self->next;
  if (self->next != NULL)
    self->next->prev = self->prev;
  self->prev = self->next = NULL;
}

/* Once done and no wait runs: give up the event and what it holds. */
static void event_maybe_free(EventObject *self) {
  um_event *ev = self->ev;
  if (!self->done || self->calls > 0 || ev == NULL)
    return;
  self->ev = NULL;
  um_event_release(ev);
  if (self->host.obj != NULL)
    PyBuffer_Release(&self->host);
  Py_CLEAR(self->buffers[0]);
  Py_CLEAR(self->buffers[1]);
  event_unlink(self);
  self->mgr->handles--;
  pyum_manager_maybe_destroy(self->mgr, 0);
}

/* Wait without the GIL; the status once done. */
static int event_wait(EventObject *self) {
  um_event *ev = self->ev;
  int st;
  if (self->done)
    return self->status;
  self->calls++;
  Py_BEGIN_ALLOW_THREADS
  st = um_event_wait(ev);
  Py_END_ALLOW_THREADS
  self->calls--;
  if (!self->done) {
    self->done = 1;
    self->status = st;
  }
  event_maybe_free(self);
  return self->status;
}

void pyum_event_finish_now(EventObject *self) {
  Py_INCREF(self);
  event_wait(self);
  Py_DECREF(self);
}

PyObject *pyum_event_new(ManagerObject *mgr, um_event *ev, PyObject *buf0, PyObject *buf1, Py_buffer *host) {
  EventObject *self = (EventObject *)Event_Type.tp_alloc(&Event_Type, 0);
  if (self == NULL) {
    /* The operation may be writing into host memory: wait before letting
     * it go. */
    Py_BEGIN_ALLOW_THREADS
    um_event_wait(ev);
    Py_END_ALLOW_THREADS
    um_event_release(ev);
    if (host != NULL && host->obj != NULL)
      PyBuffer_Release(host);
    return NULL;
  }
  Py_INCREF(mgr);
  self->mgr = mgr;
  self->ev = ev;
  Py_XINCREF(buf0);
  Py_XINCREF(buf1);
  self->buffers[0] = buf0;
  self->buffers[1] = buf1;
  if (host != NULL && host->obj != NULL) {
    self->host = *host;
    host->obj = NULL;
  }
  event_link(self);
  mgr->handles++;
  /* Issued while close() ran on another thread: close() no longer sees it. */
  if (mgr->closed)
    event_wait(self);
  return (PyObject *)self;
}

static PyObject *Event_wait(EventObject *self, PyObject *unused) {
  int st;
  (void)unused;
  st = event_wait(self);
  if (st != UM_OK)
    return pyum_raise_msg(st, "the operation failed: %s", um_strerror(st));
  Py_RETURN_NONE;
}

static PyObject *Event_get_done(EventObject *self, void *closure) {
  int st;
  (void)closure;
  if (self->done)
    Py_RETURN_TRUE;
  st = um_event_query(self->ev);
  if (st == UM_EAGAIN)
    Py_RETURN_FALSE;
  self->done = 1;
  self->status = st;
  event_maybe_free(self);
  Py_RETURN_TRUE;
}

static PyObject *Event_repr(EventObject *self) {
  if (!self->done)
    return PyUnicode_FromString("<unimem.Event pending>");
  return PyUnicode_FromFormat("<unimem.Event done, %s>", um_err_name(self->status));
}

static int Event_traverse(EventObject *self, visitproc visit, void *arg) {
  Py_VISIT(self->mgr);
  Py_VISIT(self->buffers[0]);
  Py_VISIT(self->buffers[1]);
  Py_VISIT(self->host.obj);
  return 0;
}

static void Event_dealloc(EventObject *self) {
  PyObject_GC_UnTrack(self);
  if (self->ev != NULL) {
    /* Out of the manager's list first: close() on another thread must not
     * find this object while the wait below runs without the GIL. */
    event_unlink(self);
    if (!self->done)
      event_wait(self);
    else
      event_maybe_free(self);
  }
  Py_CLEAR(self->mgr);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef Event_methods[] = {
    {"wait", (PyCFunction)Event_wait, METH_NOARGS,
     PyDoc_STR("wait($self)\n--\n\nBlock until the operation finished; raise its error if it failed.")},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Event_getset[] = {
    {"done", (getter)Event_get_done, NULL, PyDoc_STR("True once the operation finished (successfully or not)."),
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject Event_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "unimem.Event",
    .tp_basicsize = sizeof(EventObject),
    .tp_dealloc = (destructor)Event_dealloc,
    .tp_repr = (reprfunc)Event_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = PyDoc_STR("Completion of an asynchronous operation (wait=False). It keeps the operation's "
                        "buffers and host objects alive until the operation is done."),
    .tp_traverse = (traverseproc)Event_traverse,
    .tp_methods = Event_methods,
    .tp_getset = Event_getset,
};
