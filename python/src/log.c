/* The log and on_oom options of a Manager: unimem calling into Python.
 *
 * unimem logs from any thread, sometimes while it holds its own locks (a
 * driver's completion callback freeing a block, say). Taking the GIL there
 * could deadlock against a Python thread that holds the GIL and waits for
 * that lock, so the hook only queues the message under a private mutex and
 * asks the interpreter to deliver it (Py_AddPendingCall: the main thread
 * runs the delivery at its next bytecode boundary, with the GIL). Calls
 * that log on the caller's own thread (creating and closing a manager)
 * deliver before they return.
 *
 * on_oom must answer at once, so it calls Python synchronously, but only on
 * a thread that is inside Manager.alloc with the GIL released (no unimem
 * lock is held there): allocations unimem makes on its own threads get 0.
 *
 * After the interpreter's atexit handlers ran (pyum_log_shutdown), nothing
 * calls into Python any more: messages go to stderr as without a callback.
 */

#include "pyunimem.h" /* Python.h first, as Python asks */

#include <pthread.h>
#include <stdio.h>
#include <string.h>

/* Messages waiting for delivery per manager beyond this go to stderr: a
 * flood from a busy thread must not grow memory without bound. */
#define LOG_QUEUE_MAX 1024

typedef struct log_msg {
  struct log_msg *next;
  um_log_level level;
  char text[];
} log_msg;

struct log_sink {
  ManagerObject *owner; /* NULL once the manager object is gone */
  log_msg *head, *tail;
  int queued;
  int listed;           /* on the pending list */
  log_sink *next_pending;
};

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static log_sink *pending;       /* sinks with queued messages */
static int delivery_scheduled;  /* a pending call is on its way */
static int python_gone;         /* atexit ran */

static const char *const level_names[] = {"error", "warn", "info", "debug"};

static const char *level_name(um_log_level level) {
  return level_names[(unsigned)level < 4 ? (unsigned)level : 3];
}

static void print_fallback(um_log_level level, const char *msg) {
  fprintf(stderr, "unimem %s: %s\n", level_name(level), msg);
}

log_sink *pyum_sink_new(ManagerObject *owner) {
  log_sink *s = PyMem_RawCalloc(1, sizeof(*s));
  if (s == NULL) {
    PyErr_NoMemory();
    return NULL;
  }
  s->owner = owner;
  return s;
}

/* Take the oldest message of the first pending sink, with the callable and
 * context that should receive it (new references, or NULL). log_lock held. */
static log_msg *pop_locked(PyObject **fn, PyObject **ctx, log_sink *only) {
  log_sink **link = &pending;
  log_sink *s;
  log_msg *m;
  while (*link != NULL && only != NULL && *link != only)
    link = &(*link)->next_pending;
  s = *link;
  if (s == NULL)
    return NULL;
  m = s->head;
  s->head = m->next;
  if (s->head == NULL) {
    s->tail = NULL;
    *link = s->next_pending;
    s->listed = 0;
  }
  s->queued--;
  *fn = s->owner != NULL && !python_gone ? s->owner->log : NULL;
  *ctx = s->owner != NULL && s->owner->log_ctx != NULL ? s->owner->log_ctx : Py_None;
  Py_XINCREF(*fn);
  Py_INCREF(*ctx);
  return m;
}

/* Hand one message to Python (GIL held), keeping whatever exception the
 * caller is propagating. */
static void deliver_one(PyObject *fn, PyObject *ctx, log_msg *m) {
  PyObject *type, *value, *tb, *text, *r;
  if (fn == NULL) {
    print_fallback(m->level, m->text);
    return;
  }
  PyErr_Fetch(&type, &value, &tb);
  text = PyUnicode_DecodeUTF8(m->text, (Py_ssize_t)strlen(m->text), "replace");
  r = text != NULL ? PyObject_CallFunction(fn, "OsO", ctx, level_name(m->level), text) : NULL;
  if (r == NULL)
    PyErr_WriteUnraisable(fn);
  Py_XDECREF(r);
  Py_XDECREF(text);
  PyErr_Restore(type, value, tb);
}

static void deliver(log_sink *only) {
  for (;;) {
    PyObject *fn = NULL, *ctx = NULL;
    log_msg *m;
    pthread_mutex_lock(&log_lock);
    m = pop_locked(&fn, &ctx, only);
    pthread_mutex_unlock(&log_lock);
    if (m == NULL)
      return;
    deliver_one(fn, ctx, m);
    Py_XDECREF(fn);
    Py_DECREF(ctx);
    PyMem_RawFree(m);
  }
}

static int deliver_pending(void *unused) {
  (void)unused;
  pthread_mutex_lock(&log_lock);
  delivery_scheduled = 0;
  pthread_mutex_unlock(&log_lock);
  deliver(NULL);
  return 0;
}

void pyum_sink_flush(log_sink *s) {
  if (s != NULL)
    deliver(s);
}

void pyum_sink_free(log_sink *s) {
  if (s == NULL)
    return;
  deliver(s);
  pthread_mutex_lock(&log_lock);
  s->owner = NULL;
  /* deliver() emptied it; a message that raced in since goes to stderr. */
  while (s->head != NULL) {
    log_msg *m = s->head;
    s->head = m->next;
    print_fallback(m->level, m->text);
    PyMem_RawFree(m);
  }
  if (s->listed) {
    log_sink **link = &pending;
    while (*link != s)
      link = &(*link)->next_pending;
    *link = s->next_pending;
  }
  pthread_mutex_unlock(&log_lock);
  PyMem_RawFree(s);
}

void pyum_log_hook(void *ctx, um_log_level level, const char *msg) {
  log_sink *s = ctx;
  size_t len = strlen(msg);
  log_msg *m = PyMem_RawMalloc(sizeof(*m) + len + 1); /* the raw allocator needs no GIL */
  pthread_mutex_lock(&log_lock);
  if (m == NULL || python_gone || s->queued >= LOG_QUEUE_MAX) {
    pthread_mutex_unlock(&log_lock);
    PyMem_RawFree(m);
    print_fallback(level, msg);
    return;
  }
  m->next = NULL;
  m->level = level;
  memcpy(m->text, msg, len + 1);
  if (s->tail != NULL)
    s->tail->next = m;
  else
    s->head = m;
  s->tail = m;
  s->queued++;
  if (!s->listed) {
    s->next_pending = pending;
    pending = s;
    s->listed = 1;
  }
  /* Needs neither the GIL nor a thread state. */
  if (!delivery_scheduled && Py_AddPendingCall(deliver_pending, NULL) == 0)
    delivery_scheduled = 1;
  pthread_mutex_unlock(&log_lock);
}

void pyum_log_shutdown(void) {
  pthread_mutex_lock(&log_lock);
  python_gone = 1;
  pthread_mutex_unlock(&log_lock);
}

/* ---- on_oom ---------------------------------------------------------------- */

static _Thread_local ManagerObject *oom_thread_mgr;

ManagerObject *pyum_oom_thread_swap(ManagerObject *mgr) {
  ManagerObject *previous = oom_thread_mgr;
  oom_thread_mgr = mgr;
  return previous;
}

int pyum_oom_hook(void *ctx, um_device *d, size_t bytes) {
  ManagerObject *mgr = ctx;
  PyGILState_STATE gil;
  PyObject *fn, *r, *n;
  int retry = 0, gone;
  pthread_mutex_lock(&log_lock);
  gone = python_gone;
  pthread_mutex_unlock(&log_lock);
  if (oom_thread_mgr != mgr || gone)
    return 0;
  gil = PyGILState_Ensure();
  fn = mgr->on_oom;
  if (fn != NULL) {
    PyObject *dev = pyum_manager_device(mgr, d);
    Py_INCREF(fn);
    n = PyLong_FromSize_t(bytes);
    r = n != NULL ? PyObject_CallFunctionObjArgs(fn, mgr->oom_ctx != NULL ? mgr->oom_ctx : Py_None,
                                                 dev != NULL ? dev : Py_None, n, NULL)
                  : NULL;
    if (r != NULL)
      retry = PyObject_IsTrue(r);
    if (r == NULL || retry < 0) {
      PyErr_WriteUnraisable(fn);
      retry = 0;
    }
    Py_XDECREF(r);
    Py_XDECREF(n);
    Py_DECREF(fn);
  }
  PyGILState_Release(gil);
  return retry;
}
