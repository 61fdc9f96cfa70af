/* unimem.Event: completion of an asynchronous operation. It keeps the
 * operation's Buffer objects and host memory (a Py_buffer export, so a
 * bytearray cannot even be resized) until the operation is seen done. An
 * Event dropped before that does not wait for the operation, which may be
 * queued behind an access that only the dropping thread can end: its
 * payload goes to an orphan record of the manager, given up once the
 * operation is seen done (at the manager's next operation, an access's
 * end, close() or the Manager object's deallocation). */
#include "pyunimem.h"

/* What a dropped pending Event held. Its Buffers are kept only where their
 * release would wait for the operation (imports); the others are let go at
 * once (their um_release does not wait). The orphan counts among the
 * manager's handles and holds no reference to the Manager object: the
 * Manager's deallocation waits for what is left. */
struct event_orphan {
  event_orphan *next;
  um_event *ev;
  Py_buffer host;       /* host.obj NULL: none */
  PyObject *buffers[2]; /* imports only, or NULL */
};

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

/* Let the operation's Buffer objects go (its Event or orphan is done with
 * them, or no longer needs them pinned). */
static void buffers_let_go(PyObject **buffers) {
  for (int i = 0; i < 2; i++)
    if (buffers[i] != NULL) {
      pyum_buffer_op_done((BufferObject *)buffers[i]);
      Py_CLEAR(buffers[i]);
    }
}

/* Give up a finished operation's handle and what it held. The caller
 * keeps mgr alive. */
static void payload_free(ManagerObject *mgr, um_event *ev, Py_buffer *host, PyObject **buffers) {
  um_event_release(ev); /* never waits: the operation is done */
  mgr->handles--;
  buffers_let_go(buffers);
  if (host->obj != NULL)
    PyBuffer_Release(host);
  pyum_manager_maybe_destroy(mgr, 0);
}

/* Once done and no wait runs: give up the event and what it holds. */
static void event_maybe_free(EventObject *self) {
  um_event *ev = self->ev;
  if (!self->done || self->calls > 0 || ev == NULL)
    return;
  self->ev = NULL;
  event_unlink(self);
  payload_free(self->mgr, ev, &self->host, self->buffers);
}

/* Take over a pending operation's payload (the references in buffers, and
 * *host) as an orphan of mgr; its handle is counted already. 0, or -1
 * (out of memory: nothing taken). */
static int orphan_adopt(ManagerObject *mgr, um_event *ev, PyObject **buffers, Py_buffer *host) {
  event_orphan *o = PyMem_Calloc(1, sizeof(*o));
  if (o == NULL)
    return -1;
  o->ev = ev;
  for (int i = 0; i < 2; i++) {
    BufferObject *b = (BufferObject *)buffers[i];
    if (b != NULL && b->wrapped)
      o->buffers[i] = buffers[i]; /* its release waits for the operation */
    else if (b != NULL) {
      pyum_buffer_op_done(b);
      Py_DECREF(b);
    }
    buffers[i] = NULL;
  }
  if (host != NULL && host->obj != NULL) {
    o->host = *host;
    host->obj = NULL;
  }
  o->next = mgr->orphans;
  mgr->orphans = o;
  return 0;
}

/* The first orphan to give up: a finished one, or with wait the first. */
static event_orphan *orphan_take(ManagerObject *mgr, int wait) {
  event_orphan **pp = &mgr->orphans, *o;
  while ((o = *pp) != NULL && !wait && um_event_query(o->ev) == UM_EAGAIN)
    pp = &o->next;
  if (o != NULL)
    *pp = o->next;
  return o;
}

void pyum_orphans_reap(ManagerObject *mgr, int wait) {
  /* Letting Buffers go may drop the last reference to mgr: hold one,
   * unless mgr is being deallocated (its orphans hold no Buffer then). */
  int hold = Py_REFCNT(mgr) > 0;
  event_orphan *o;
  if (mgr->orphans == NULL)
    return;
  if (hold)
    Py_INCREF(mgr);
  while ((o = orphan_take(mgr, wait)) != NULL) {
    if (wait) {
      Py_BEGIN_ALLOW_THREADS
      um_event_wait(o->ev);
      Py_END_ALLOW_THREADS
    }
    payload_free(mgr, o->ev, &o->host, o->buffers);
    PyMem_Free(o);
  }
  if (hold)
    Py_DECREF(mgr);
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
  EventObject *self;
  PyObject *buffers[2] = {buf0, buf1};
  Py_buffer none = {0};
  pyum_orphans_reap(mgr, 0);
  for (int i = 0; i < 2; i++)
    if (buffers[i] != NULL) {
      Py_INCREF(buffers[i]);
      ((BufferObject *)buffers[i])->pending++;
    }
  mgr->handles++;
  if ((self = (EventObject *)Event_Type.tp_alloc(&Event_Type, 0)) == NULL) {
    /* The operation may be writing into host memory: keep it until the
     * operation is done, as for an Event dropped at once. */
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    if (orphan_adopt(mgr, ev, buffers, host) < 0) {
      /* Not even an orphan fits: the last resort is to wait. */
      Py_BEGIN_ALLOW_THREADS
      um_event_wait(ev);
      Py_END_ALLOW_THREADS
      payload_free(mgr, ev, host != NULL ? host : &none, buffers);
    }
    PyErr_Restore(type, value, tb);
    return NULL;
  }
  Py_INCREF(mgr);
  self->mgr = mgr;
  self->ev = ev;
  self->buffers[0] = buffers[0];
  self->buffers[1] = buffers[1];
  if (host != NULL && host->obj != NULL) {
    self->host = *host;
    host->obj = NULL;
  }
  event_link(self);
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
    int st = self->done ? self->status : um_event_query(self->ev);
    event_unlink(self);
    if (st != UM_EAGAIN) {
      self->done = 1;
      event_maybe_free(self);
    } else if (orphan_adopt(self->mgr, self->ev, self->buffers, &self->host) == 0) {
      self->ev = NULL; /* the orphan's now, with the handle's count */
    } else {
      event_wait(self); /* out of memory even for an orphan: the last resort */
    }
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
                        "buffers and host objects alive until the operation is done, also when dropped "
                        "before: dropping an Event never waits (the operation may be queued behind an "
                        "open access)."),
    .tp_traverse = (traverseproc)Event_traverse,
    .tp_methods = Event_methods,
    .tp_getset = Event_getset,
};
