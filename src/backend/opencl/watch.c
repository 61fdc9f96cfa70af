/* The OpenCL watch list: one driver callback reports the completions of
 * many commands of a device; and the wait lists of commands. */
#include "opencl_private.h"

/* ------------------------------------------------------------------------ */
/* The watch list: completions reported with one callback for many commands
 *
 * A callback per command costs its registration on the issuing thread
 * (clSetEventCallback allocates and takes the event's lock) and its
 * dispatch on the driver's thread, about as much again as unimem's own
 * work for a small copy. The device's queue is in order, so the completion
 * of a command says that those before it have completed too. Each watched
 * command goes on the device's list. Large ones (WATCH_OWN_BYTES) get a
 * callback of their own; of the small ones, only one at a time gets a
 * callback, the lazy one, on the newest small command when it is armed.
 * A callback marks its entry fired and walks the list; one walk runs at a
 * time per device (a callback that finds one running leaves its entry to
 * it and asks it to go round again, so no fired entry is missed by a walk
 * that had taken the list before the entry fired). A walk reports:
 *  - every fired entry;
 *  - the small entries before the last fired entry that is ordered (its
 *    place on the list is its place in the queue) and completed well:
 *    complete too, without asking the driver, since the queue ran them
 *    first (a failed command fails the in-order queue's later ones, or
 *    leaves the queue in the state the specification leaves undefined);
 *  - the small entries after it that the driver says have ended, each
 *    with its own status, up to the first still running (the queue runs
 *    them in order: the later ones are left for the next callback).
 * Then it arms the lazy callback again on the newest small entry left, if
 * any. A small command's report may so come later than its completion, by
 * at most the small commands queued while the lazy callback before it was
 * armed (a waiter's wait_spin_ns spin sees the device's own state through
 * token_query).
 *
 * Entries keep their event alive until reported: through the caller's
 * token (um__xfer.token_held: the core's operations keep theirs until
 * done), else with a reference of their own. An entry with a callback is
 * reported only once its callback has run, never by a walk that finds it
 * complete first: the driver may still be about to call the callback, and
 * the report may release the event's last reference. */

/* The watch list's lock (ocl_watch.locked), and the kept events': held
 * for a few dozen instructions at a time (an entry put on the list, the
 * list taken or put back, an entry marked fired), never across a driver
 * call, so a spin; a thread that finds the holder preempted yields its CPU
 * to it. */
void um__ocl_spin_lock(atomic_bool *locked) {
  int spins = 0;
  while (atomic_exchange_explicit(locked, true, memory_order_acquire))
    while (atomic_load_explicit(locked, memory_order_relaxed)) {
      if (++spins < 64)
        um__cpu_pause();
      else
        sched_yield();
    }
}

void um__ocl_spin_unlock(atomic_bool *locked) { atomic_store_explicit(locked, false, memory_order_release); }

/* The entry whose callback this thread is registering: a driver that calls
 * the callback inside clSetEventCallback (the command completed already)
 * marks it fired, and the registering thread walks once the call returned
 * (not inside the driver's call, which may hold the event's lock). */
static _Thread_local transfer_completion *arming;
static _Thread_local int armed_fired;

/* Set while this thread reports a walk's entries (watch_report). */
_Thread_local int um__ocl_reporting;

/* Under um__ocl_later_lock: take the events kept for the next walk into out. */
int um__ocl_take_later_locked(ocl_device *dev, cl_event *out) {
  int n = dev->nlater;
  memcpy(out, dev->later, (size_t)n * sizeof(out[0]));
  dev->nlater = 0;
  return n;
}

/* unimem's last reference on a token's event. */
void um__ocl_release_token(cl_event ev) {
  UM__TEST_POINT(UM__TP_TOKEN_RELEASED, ev);
  um__ocl.clReleaseEvent(ev);
}

void um__ocl_release_events(const cl_event *ev, int n) {
  for (int i = 0; i < n; i++)
    um__ocl_release_token(ev[i]);
}

static void watch_walk_locked(ocl_watch *w);

/* Under um__ocl_watch_lock: become the queue's walker, or leave the walk to the
 * one running (it goes round again). */
static void watch_walk_or_hand_over(ocl_watch *w) {
  if (w->walking) {
    w->again = 1;
    um__ocl_watch_unlock(w);
    return; /* nothing of ours runs after this unlock */
  }
  w->walking = 1;
  watch_walk_locked(w);
}

static void CL_CALLBACK on_watch_fired(cl_event event, cl_int execution_status, void *user_data) {
  transfer_completion *c = user_data;
  ocl_watch *w = c->watch;
  (void)event;
  um__ocl_watch_lock(w);
  c->status = execution_status;
  atomic_store_explicit(&c->fired, 1, memory_order_release);
  if (arming == c) {
    armed_fired = 1;
    um__ocl_watch_unlock(w);
    return;
  }
  watch_walk_or_hand_over(w);
}

/* Register the callback on c's command. Returns 0 when it is armed (the
 * callback reports later), 1 when c is fired already: its callback ran
 * inside the registration, or none could be registered (the command was
 * waited for here: its report cannot be lost). The caller walks then. */
static int watch_arm(ocl_watch *w, transfer_completion *c) {
  cl_int err;
  arming = c;
  armed_fired = 0;
  err = um__ocl.clSetEventCallback(c->event, CL_COMPLETE, on_watch_fired, c);
  arming = NULL;
  if (err != CL_SUCCESS) {
    cl_int st = um__ocl_wait_command_status(c->event);
    um__ocl_watch_lock(w);
    c->status = st;
    atomic_store_explicit(&c->fired, 1, memory_order_release);
    um__ocl_watch_unlock(w);
    return 1;
  }
  return armed_fired;
}

/* Whether c's command has ended (complete, or failed), with its status. */
static int watch_ended(transfer_completion *c) {
  cl_int st = CL_QUEUED;
  if (um__ocl.clGetEventInfo(c->event, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof(st), &st, NULL) != CL_SUCCESS ||
      st > CL_COMPLETE)
    return 0; /* left for the callback armed on it or behind it */
  c->status = st;
  return 1;
}

/* Report the entries of ready, in order. done comes last for each, and
 * after the last nothing of ours runs but a walk's tail, which
 * um__ocl_destroy_device waits for (walk_tails): once it returns, the core may
 * close the backend. */
static void watch_report(transfer_completion *ready) {
  while (ready != NULL) {
    transfer_completion *c = ready;
    um__done_fn done = c->done;
    void *arg = c->arg;
    const char *call = um__ocl_transfer_call_name((um__xfer_kind)c->kind);
    int status = c->status < 0 ? um__ocl_translate_cl_error(c->status, call) : UM_OK;
    ready = c->next; /* the core's space may go with done */
    if (c->retained)
      um__ocl.clReleaseEvent(c->event);
    um__ocl_completion_free(c);
    done(arg, status);
  }
}

/* The last entry of list that fired, is ordered and completed well: the
 * small entries before it have completed. A kick's marker that completed
 * well vouches for the entries numbered up to its vouch. */
static transfer_completion *watch_last_sure(ocl_watch *w, transfer_completion *list) {
  transfer_completion *sure = NULL;
  for (transfer_completion *c = list; c != NULL; c = c->next)
    if (c->armed && atomic_load_explicit(&c->fired, memory_order_acquire) && c->status == CL_COMPLETE) {
      if (c->ordered)
        sure = c;
      if (c->kick)
        um__ocl_watch_vouch(w, c->seq);
    }
  return sure;
}

/* Whether the walk reports c now (with its status set): when it has a
 * callback of its own, once that fired; else when the sure entry after it
 * vouches for it; else when the driver says it ended. The driver is asked
 * until one entry is still running (*running set): the queue runs the
 * later ones after it. */
static int watch_reportable(transfer_completion *c, int before_sure, uint64_t vouched, int *running) {
  if (c->armed)
    return atomic_load_explicit(&c->fired, memory_order_acquire);
  if (before_sure || (!c->kick && c->seq <= vouched)) {
    c->status = CL_COMPLETE;
    return 1;
  }
  if (c->ride) { /* no command to ask about: the later ones wait with it */
    *running = 1;
    return 0;
  }
  if (*running)
    return 0;
  *running = !watch_ended(c);
  return !*running;
}

/* Called with um__ocl_watch_lock held, as the device's walker; returns with it
 * dropped. Takes the reportable entries off the list (the comment above),
 * going round again while callbacks fired meanwhile, arms the lazy
 * callback again on the newest small entry left, then reports. The events
 * kept for it (um__ocl_native_release) it takes at the start and releases
 * after its reports, counted in walk_tails until then: the core may
 * close the backend once the last report returned, and um__ocl_destroy_device
 * waits for such a tail. */
static void watch_walk_locked(ocl_watch *w) {
  ocl_device *dev = w->dev;
  transfer_completion *ready = NULL, **ready_end = &ready;
  cl_event later[OCL_RELEASE_LATER];
  int nlater;
  um__ocl_later_lock(dev);
  nlater = um__ocl_take_later_locked(dev, later);
  um__ocl_later_unlock(dev);
  if (nlater > 0) /* before any report: the device outlives this walk */
    atomic_fetch_add_explicit(&dev->walk_tails, 1, memory_order_relaxed);
  for (;;) {
    transfer_completion *list = w->head, *rest = NULL, *rest_last = NULL, *rest_unarmed = NULL;
    transfer_completion *arm = NULL, *sure;
    uint64_t vouched;
    int fired_lazy = 0, running = 0, before_sure;
    w->again = 0;
    w->head = w->tail = w->unarmed = NULL;
    um__ocl_watch_unlock(w);
    sure = watch_last_sure(w, list);
    before_sure = sure != NULL;
    vouched = atomic_load(&w->vouched);
    while (list != NULL) {
      transfer_completion *c = list;
      list = c->next;
      c->next = NULL;
      if (c == sure)
        before_sure = 0;
      if (watch_reportable(c, before_sure, vouched, &running)) {
        fired_lazy += c->armed == WATCH_LAZY;
        if (c->ride)
          atomic_fetch_sub(&w->nriders, 1);
        *ready_end = c;
        ready_end = &c->next;
        continue;
      }
      if (rest_last != NULL)
        rest_last->next = c;
      else
        rest = c;
      rest_last = c;
      if (!c->armed && !c->ride) /* a rider has no event to arm */
        rest_unarmed = c;
    }
    um__ocl_watch_lock(w);
    if (rest != NULL) { /* older than what was added meanwhile */
      rest_last->next = w->head;
      if (w->head == NULL)
        w->tail = rest_last;
      w->head = rest;
      if (w->unarmed == NULL)
        w->unarmed = rest_unarmed;
    }
    w->lazy -= fired_lazy;
    if (w->again)
      continue;
    if (w->lazy == 0 && w->unarmed != NULL) {
      arm = w->unarmed; /* it covers the small entries before it */
      arm->armed = WATCH_LAZY;
      w->lazy = 1;
      w->unarmed = NULL;
    }
    if (arm != NULL) {
      um__ocl_watch_unlock(w);
      watch_arm(w, arm); /* fired already: it is on the list, marked */
      um__ocl_watch_lock(w);
      if (w->again || atomic_load_explicit(&arm->fired, memory_order_relaxed))
        continue;
    }
    break;
  }
  w->walking = 0;
  um__ocl_watch_unlock(w);
  um__ocl_reporting++;
  watch_report(ready);
  um__ocl_reporting--;
  if (nlater > 0) { /* after the reports, which it would delay */
    um__ocl_release_events(later, nlater);
    atomic_fetch_sub_explicit(&dev->walk_tails, 1, memory_order_release); /* the last touch of dev */
  }
}

/* The order lock of a queue (order_held): a watched command is enqueued
 * and put on the list in one hold of it, so that the list's order is the
 * queue's (the walk relies on it to report the small entries before a
 * completed one unasked). Only ever tried, so no thread ever waits for it: a thread
 * that issues from inside a driver's callback might otherwise wait for a
 * thread that holds it and waits for the driver. A command enqueued
 * without it is not ordered, nor is one whose hold saw such a command put
 * on the list (watch_unordered moved): its place on the list may not be
 * its place in the queue. */
int um__ocl_order_begin(ocl_watch *w, unsigned *unordered0) {
  if (atomic_load_explicit(&w->order_held, memory_order_relaxed) ||
      atomic_exchange_explicit(&w->order_held, true, memory_order_acquire))
    return 0;
  *unordered0 = atomic_load_explicit(&w->unordered, memory_order_relaxed);
  return 1;
}

void um__ocl_order_end(ocl_watch *w, int held) {
  if (held)
    atomic_store_explicit(&w->order_held, false, memory_order_release);
}

/* Under um__ocl_watch_lock: c goes at the end of the list, numbered. */
static void watch_append_locked(ocl_watch *w, transfer_completion *c) {
  if (w->tail != NULL)
    w->tail->next = c;
  else
    w->head = c;
  w->tail = c;
  if (!c->kick) /* a kick's vouches for those before it: no number of its own */
    c->seq = atomic_fetch_add_explicit(&w->seq, 1, memory_order_release) + 1;
}

/* Watch c's command (c->event), enqueued under the order lock when held
 * (with watch_unordered at unordered0 then): put it on the list, drop the
 * order lock, submit it, and register a callback on it when it is large,
 * or small with no lazy callback armed and no walk to arm one. */
void um__ocl_watch_add(ocl_watch *w, transfer_completion *c, int own, int held, unsigned unordered0) {
  int arm = 1;
  um__ocl_watch_lock(w);
  if (held) {
    c->ordered = atomic_load_explicit(&w->unordered, memory_order_relaxed) == unordered0;
  } else {
    c->ordered = 0;
    um__atomic_add_relaxed(&w->unordered, 1);
  }
  watch_append_locked(w, c);
  if (own) {
    c->armed = WATCH_OWN;
  } else if (w->lazy == 0 && !w->walking) {
    c->armed = WATCH_LAZY;
    w->lazy = 1;
    w->unarmed = NULL;
  } else {
    w->unarmed = c;
    arm = 0;
  }
  um__ocl_watch_unlock(w);
  um__ocl_order_end(w, held);
  /* Commands may sit in the queue until flushed; nobody may ever wait on
   * this one, so submit it now. A failing flush leaves the command queued,
   * and its callback still runs when the queue is finished. */
  um__ocl_submit_begin(w->dev);
  um__ocl.clFlush(w->queue);
  um__ocl_submit_end(w->dev);
  if (arm && watch_arm(w, c)) {
    um__ocl_watch_lock(w);
    watch_walk_or_hand_over(w);
  }
}

/* The wait list of x on w's queue: the tokens of after[] that are not that
 * queue's, then x->wait[] (a MARKER's gate or caller's event). Tokens are
 * this backend's cl_events; copy them rather than reinterpret the void *
 * array as a cl_event array. A command of this device's own queue needs no
 * wait-list entry: the queue is in order, and its commands were enqueued
 * before this one. Leaving them out matters: PoCL tracks every wait-list
 * entry as a dependency (docs/design.md, Decisions: "Completions inside the
 * driver's callback"). */
cl_uint um__ocl_build_wait_list(const ocl_watch *w, const um__xfer *x, void *const *after, int nafter,
                               cl_event *list) {
  cl_uint waits = 0;
  for (int i = 0; i < nafter; i++) {
    cl_command_queue queue = NULL;
    cl_event token = (cl_event)after[i];
    if (um__ocl.clGetEventInfo(token, CL_EVENT_COMMAND_QUEUE, sizeof(queue), &queue, NULL) == CL_SUCCESS &&
        queue == w->queue)
      continue;
    list[waits++] = token;
  }
  for (int i = 0; i < 2; i++)
    if (x->wait[i] != NULL)
      list[waits++] = (cl_event)x->wait[i];
  return waits;
}


ocl_watch *um__ocl_watch_of(ocl_device *dev, const um__xfer *x) {
  int q = x->queue;
  if (q <= 0 || q >= atomic_load_explicit(&dev->nqueues, memory_order_acquire))
    return &dev->watch[0];
  return &dev->watch[q];
}

/* After a blocking command: report what it vouches for. A walk running on
 * another thread may have taken the list before the vouch: it goes round
 * again. */
void um__ocl_watch_poll(ocl_watch *w) {
  um__ocl_watch_lock(w);
  if (w->head == NULL || w->walking) {
    if (w->walking)
      w->again = 1;
    um__ocl_watch_unlock(w);
    return;
  }
  w->walking = 1;
  watch_walk_locked(w);
}

/* ------------------------------------------------------------------------ */
/* Riders (um__xfer.ride): a bracket's end that enqueues nothing
 *
 * Its entry has no event. It is listed under the order lock when that can
 * be had, as a command would be, so that an ordered entry after it was
 * enqueued after it; else it counts as unordered, and the entries in
 * flight lose their claim. It is reported with the small entries before a
 * sure one, or once vouched for: a command enqueued after the entry was
 * numbered has completed well (a blocking command of the queue, a kick's
 * marker). Until then the walk asks the driver about nothing after it. */

void um__ocl_watch_ride(ocl_watch *w, transfer_completion *c) {
  unsigned unordered0 = 0;
  int held = um__ocl_order_begin(w, &unordered0);
  um__ocl_watch_lock(w);
  c->ride = 1;
  c->armed = 0;
  c->ordered = held && atomic_load_explicit(&w->unordered, memory_order_relaxed) == unordered0;
  if (!held)
    um__atomic_add_relaxed(&w->unordered, 1);
  watch_append_locked(w, c);
  atomic_fetch_add(&w->nriders, 1); /* before the core looks for waiters (core/riders.c) */
  um__ocl_watch_unlock(w);
  um__ocl_order_end(w, held);
}

uint64_t um__ocl_watch_seq(ocl_watch *w) { return atomic_load(&w->seq); }

void um__ocl_watch_vouch(ocl_watch *w, uint64_t upto) {
  uint64_t v = atomic_load_explicit(&w->vouched, memory_order_relaxed);
  while (v < upto && !atomic_compare_exchange_weak(&w->vouched, &v, upto)) {
  }
}

static void kick_done(void *arg, int status) {
  (void)arg;
  (void)status;
}

/* A marker with a callback of its own, vouching for every entry listed
 * before it; once one is queued for them, a kick adds none, unless a token
 * is asked for (*token: the marker's event, one more reference). Without a
 * token asked for, where none can be queued, the queue is finished here. */
static int watch_kick(ocl_watch *w, cl_event *token) {
  transfer_completion *c;
  cl_event event = NULL;
  unsigned unordered0 = 0;
  uint64_t upto;
  cl_int err = CL_OUT_OF_HOST_MEMORY;
  int held;
  um__ocl_watch_lock(w);
  upto = atomic_load_explicit(&w->seq, memory_order_relaxed);
  if (w->kicked >= upto && token == NULL) {
    um__ocl_watch_unlock(w);
    return UM_OK;
  }
  if (w->kicked < upto)
    w->kicked = upto;
  um__ocl_watch_unlock(w);
  if ((c = calloc(1, sizeof(*c))) != NULL) {
    c->done = kick_done;
    c->watch = w;
    c->kind = (unsigned char)UM__XFER_QUEUE_MARK;
    c->allocated = c->retained = c->kick = 1;
    c->seq = upto;
    atomic_init(&c->fired, 0);
    held = um__ocl_order_begin(w, &unordered0);
    um__ocl_submit_begin(w->dev);
    err = um__ocl.clEnqueueMarkerWithWaitList(w->queue, 0, NULL, &event);
    um__ocl_submit_end(w->dev);
    if (err == CL_SUCCESS) {
      c->event = event;
      if (token != NULL) {
        um__ocl.clRetainEvent(event);
        *token = event;
      }
      um__ocl_watch_add(w, c, 1, held, unordered0);
      return UM_OK;
    }
    um__ocl_order_end(w, held);
    free(c);
  }
  if (token != NULL)
    return um__ocl_translate_cl_error(err, "clEnqueueMarkerWithWaitList");
  if (um__ocl.clFinish(w->queue) == CL_SUCCESS)
    um__ocl_watch_vouch(w, upto);
  um__ocl_watch_poll(w);
  return UM_OK;
}

void um__ocl_queue_kick(void *bdev) {
  ocl_device *dev = bdev;
  int n = atomic_load_explicit(&dev->nqueues, memory_order_acquire);
  for (int q = 0; q < n && q < OCL_QUEUES; q++)
    if (atomic_load(&dev->watch[q].nriders) != 0)
      (void)watch_kick(&dev->watch[q], NULL);
}

int um__ocl_queue_mark_now(void *bdev, int queue, void **token) {
  ocl_device *dev = bdev;
  um__xfer x = {.kind = UM__XFER_QUEUE_MARK, .queue = queue};
  cl_event event = NULL;
  int st = watch_kick(um__ocl_watch_of(dev, &x), &event);
  *token = event;
  return st;
}
