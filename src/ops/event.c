/* Event objects: the object of one operation (um_event), made in slabs,
 * reused through the manager's free list, freed with the manager; its
 * references, waiting on it (a spin, then the condition variable), and the
 * public um_event_* calls. What an operation does and how it is ordered is
 * op.c's and complete.c's; the worker threads are engine.c's. Apart from
 * them because an event outlives its operation: the caller holds, waits on
 * and releases it whatever the operation's state.
 *
 * References on an event: one held by the engine until the operation
 * completes, one by each buffer whose last operation it is, one by the
 * caller when an event was asked for, and one per waiter while it waits.
 */
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h"

/* ------------------------------------------------------------------------ */
/* Event objects: made in slabs, reused through the manager's free list,
 * freed with the manager. A handle the caller released keeps pointing at
 * readable memory that answers UM_ESTATE (until the object serves another
 * operation, as a stale buffer handle does until its block is reused). */

static um_event *event_slab_grow(um_manager *m) {
  um__event_slab *slab = calloc(1, sizeof(*slab));
  if (slab == NULL)
    return NULL;
  for (int i = 0; i < UM__EVENT_SLAB; i++) {
    um_event *e = &slab->ev[i];
    e->magic = UM__EVENT_MAGIC;
    e->m = m;
    pthread_mutex_init(&e->lock, NULL);
    pthread_cond_init(&e->cond, NULL);
    atomic_init(&e->refs, 0);
    atomic_init(&e->caller_holds, false);
    atomic_init(&e->state, UM__EV_DONE);
    if (i > 0)
      slab->ev[i].free_next = &slab->ev[i - 1];
  }
  slab->next = m->event_slabs;
  m->event_slabs = slab;
  /* ev[0] is returned; the rest form the free list (called under the lock,
   * with the list empty). */
  m->event_free = &slab->ev[UM__EVENT_SLAB - 1];
  slab->ev[1].free_next = NULL;
  return &slab->ev[0];
}

/* Per-thread stashes of free event objects (in the thread's cache of the
 * manager, tcache.h) spare the manager's lock on every operation: a thread
 * takes BUNCH objects at once when its stash is empty, and gives BUNCH back
 * when it holds twice that (a driver's callback thread frees what the
 * issuing thread allocates). */
#define BUNCH 32

static um_event *take_bunch(um_manager *m, um__tcache *tc) {
  um_event *e;
  pthread_mutex_lock(&m->event_lock);
  for (int i = 0; i < BUNCH && m->event_free != NULL; i++) {
    e = m->event_free;
    m->event_free = e->free_next;
    e->free_next = tc->ev_free;
    tc->ev_free = e;
    tc->ev_count++;
  }
  e = tc->ev_free != NULL ? NULL : event_slab_grow(m);
  pthread_mutex_unlock(&m->event_lock);
  return e; /* a new slab's first object, or NULL: the stash has some */
}

static void give_bunch(um_manager *m, um__tcache *tc) {
  pthread_mutex_lock(&m->event_lock);
  for (int i = 0; i < BUNCH; i++) {
    um_event *e = tc->ev_free;
    tc->ev_free = e->free_next;
    tc->ev_count--;
    e->free_next = m->event_free;
    m->event_free = e;
  }
  pthread_mutex_unlock(&m->event_lock);
}

/* An object off this thread's stash, or the manager's list. */
static um_event *event_get(um_manager *m) {
  um__tcache *tc = um__tcache_of(m);
  um_event *e;
  if (tc == NULL) {
    pthread_mutex_lock(&m->event_lock);
    if ((e = m->event_free) != NULL)
      m->event_free = e->free_next;
    else
      e = event_slab_grow(m);
    pthread_mutex_unlock(&m->event_lock);
    return e;
  }
  if (tc->ev_free == NULL && (e = take_bunch(m, tc)) != NULL)
    return e;
  if ((e = tc->ev_free) != NULL) {
    tc->ev_free = e->free_next;
    tc->ev_count--;
  }
  return e;
}

static void event_put(um_manager *m, um_event *e) {
  um__tcache *tc = um__tcache_of(m);
  if (tc == NULL) {
    pthread_mutex_lock(&m->event_lock);
    e->free_next = m->event_free;
    m->event_free = e;
    pthread_mutex_unlock(&m->event_lock);
    return;
  }
  e->free_next = tc->ev_free;
  tc->ev_free = e;
  if (++tc->ev_count >= 2 * BUNCH)
    give_bunch(m, tc);
}

void um__events_stash_flush(um_manager *m, um__tcache *tc) {
  while (tc->ev_count >= BUNCH)
    give_bunch(m, tc);
  pthread_mutex_lock(&m->event_lock);
  while (tc->ev_free != NULL) {
    um_event *e = tc->ev_free;
    tc->ev_free = e->free_next;
    e->free_next = m->event_free;
    m->event_free = e;
  }
  tc->ev_count = 0;
  pthread_mutex_unlock(&m->event_lock);
}

um_event *um__event_new(um_manager *m, um__op_kind kind) {
  um_event *e = event_get(m);
  if (e == NULL)
    return NULL;
  e->free_next = NULL;
  e->error_text[0] = '\0';
  memset((char *)e + offsetof(um_event, refs), 0, sizeof(*e) - offsetof(um_event, refs));
  atomic_init(&e->refs, 1);
  atomic_init(&e->caller_holds, false);
  atomic_init(&e->state, UM__EV_QUEUED);
  atomic_init(&e->deps_pending, 0);
  atomic_init(&e->native_refs, 0);
  if (kind == UM__OP_GROUP)
    atomic_init(&e->batch.first_error, UM_OK);
  e->kind = kind;
  if (__builtin_expect(atomic_load_explicit(&m->observing, memory_order_relaxed) != 0, 0)) {
    e->obs_tag = um__obs_tag_now(m);
    e->obs_t0 = um__now_ns();
  }
  return e;
}

void um__event_ref(um_event *e) { um__atomic_add_relaxed(&e->refs, 1); }

/* Take a reference unless the object is on the free list (refs == 0). */
static bool event_ref_if_used(um_event *e) {
  int r = um__atomic_load_relaxed(&e->refs);
  while (r > 0)
    if (atomic_compare_exchange_weak_explicit(&e->refs, &r, r + 1, memory_order_acquire,
                                              memory_order_relaxed))
      return true;
  return false;
}

void um__event_unref(um_event *e) {
  if (um__atomic_sub_acq_rel(&e->refs, 1) != 1)
    return;
  event_put(e->m, e);
}

/* Manager destroy: free every event object; report those the caller never
 * released (their handles die with the manager). Threads still inside
 * um_event_wait (their operations are finished: the drain came first)
 * leave before the objects go. */
void um__events_drop_natives(um_manager *m) {
  while (atomic_load_explicit(&m->event_waiters, memory_order_acquire) != 0)
    sched_yield();
  for (um__event_slab *slab = m->event_slabs; slab != NULL; slab = slab->next)
    for (int i = 0; i < UM__EVENT_SLAB; i++)
      um__event_caller_native_drop(&slab->ev[i]);
}

void um__events_free_all(um_manager *m) {
  int unreleased = 0;
  while (atomic_load_explicit(&m->event_waiters, memory_order_acquire) != 0)
    sched_yield();
  while (m->event_slabs != NULL) {
    um__event_slab *slab = m->event_slabs;
    m->event_slabs = slab->next;
    for (int i = 0; i < UM__EVENT_SLAB; i++) {
      unreleased += atomic_load_explicit(&slab->ev[i].caller_holds, memory_order_relaxed);
      pthread_mutex_destroy(&slab->ev[i].lock);
      pthread_cond_destroy(&slab->ev[i].cond);
    }
    free(slab);
  }
  m->event_free = NULL;
  if (unreleased > 0)
    um__log(&m->opts, UM_LOG_WARN,
            "%d event(s) were never released with um_event_release; their handles are invalid now",
            unreleased);
}

void um__event_token_put(um_event *e, um_device *ndev, void *native) {
  if (um__atomic_sub_acq_rel(&e->native_refs, 1) == 1)
    um__dev_native_release(ndev, native);
}

/* Drop the caller's share of e's token if it is still here: whichever of
 * um_event_release and tokens.c's keep_native takes it from caller_native puts
 * it. */
void um__event_caller_native_drop(um_event *e) {
  void *native = atomic_exchange(&e->caller_native, NULL);
  if (native != NULL)
    um__event_token_put(e, e->native_dev, native);
}

/* A waiter's spin (um_options.wait_spin_ns): it polls the event's state,
 * and every POLLS_PER_QUERY polls the device's own view of the operation's
 * token, where the backend can say (token_query). Where the backend can
 * also report an ended token on the waiter's thread (token_reap: CUDA,
 * whose stream watchers sleep in the driver's blocking wait), the waiter
 * asks that instead, and finishes the operation itself rather than wait
 * for the watcher to wake. */
typedef struct event_spin {
  um_event *e;
  um_device *dev; /* the device of token, or NULL */
  void *token;    /* borrowed: one of e->native_refs */
  unsigned polls;
  bool device_done;
} event_spin;

/* A driver query takes the driver's lock on the event, which the thread
 * completing it also needs: a spin that asked on every poll would slow
 * the completion it waits for. */
#define POLLS_PER_QUERY 16

static int event_spin_poll(void *arg) {
  event_spin *s = arg;
  if (atomic_load_explicit(&s->e->state, memory_order_acquire) == UM__EV_DONE)
    return 1;
  if (s->token != NULL && !s->device_done && ++s->polls % POLLS_PER_QUERY == 0) {
    /* A reap may report the completion right here (the thread completes
     * inline meanwhile); a query only says the device is done. */
    s->device_done = um__dev_token_reap(s->dev, s->token) != 0;
    return atomic_load_explicit(&s->e->state, memory_order_acquire) == UM__EV_DONE;
  }
  return 0;
}

/* Spin before the sleep: true when e is done. A device that has finished
 * the work whose completion the core has not heard of yet (the driver's
 * callback, or the worker it hands the completion to, is on its way) earns
 * the waiter one more budget of polling rather than a sleep. */
static bool event_spin_wait(um_event *e, uint32_t ns) {
  event_spin s = {.e = e};
  bool done;
  pthread_mutex_lock(&e->lock);
  void *native = atomic_load_explicit(&e->native, memory_order_acquire);
  if (atomic_load_explicit(&e->state, memory_order_acquire) != UM__EV_DONE && native != NULL &&
      um__dev_can_query(e->native_dev)) {
    /* Borrowed as an issuer borrows a dependency's (op.c). The borrow may
     * outlive the operation, and its release is a backend call: the spin
     * counts as one more operation in flight, so that no drain (a
     * manager's destroy) finishes and closes the device before it. The
     * operation itself is still counted here (not done), so the count is
     * not 0. */
    um__engine_op_begin(e->m);
    um__atomic_add_relaxed(&e->native_refs, 1);
    s.token = native;
    s.dev = e->native_dev;
  }
  pthread_mutex_unlock(&e->lock);
  done = um__spin_until(ns, event_spin_poll, &s) != 0;
  if (!done && s.device_done)
    done = um__spin_until(ns, event_spin_poll, &s) != 0;
  if (s.token != NULL) {
    um__event_token_put(e, s.dev, s.token);
    um__engine_op_done(e->m);
  }
  return done;
}

/* Wait until e completes, or (canceled_ends: a caller's um_event_wait) until
 * it is canceled: a canceled operation stays in its buffers' chains until
 * what it follows has finished (the operations behind it keep their order),
 * but its caller is answered at once. Internal waits need the real end. */
static int event_wait(um_event *e, bool canceled_ends) {
  int st;
  uint32_t spin_ns;
  /* Done already: the status was written before the state (release), and
   * the completing thread's wake-up on e->cond comes before it drops its
   * reference, so the object cannot be reused under it. */
  if (atomic_load_explicit(&e->state, memory_order_acquire) == UM__EV_DONE)
    return e->status;
  /* What e waits for may be a bracket's end riding on its queue's next
   * command (core/riders.c): counted in, the wait has it carried. */
  um__riders_wait_begin(e->m);
  spin_ns = e->m->opts.wait_spin_ns;
  if (spin_ns != 0 && atomic_load_explicit(&e->state, memory_order_acquire) != UM__EV_DONE)
    event_spin_wait(e, spin_ns);
  pthread_mutex_lock(&e->lock);
  while (atomic_load_explicit(&e->state, memory_order_acquire) != UM__EV_DONE &&
         !(canceled_ends && e->canceled)) {
    e->cond_waiters++; /* the completing thread (or a cancel) wakes only counted waiters */
    pthread_cond_wait(&e->cond, &e->lock);
    e->cond_waiters--;
  }
  st = canceled_ends && e->canceled ? UM_ECANCELED : e->status;
  pthread_mutex_unlock(&e->lock);
  um__riders_wait_end(e->m);
  return st;
}

int um__event_wait_internal(um_event *e) { return event_wait(e, false); }

/* The text of a failed wait's status st. */
static int wait_error(um_event *e, int st) {
  if (st == UM_OK)
    return st;
  if (st == UM_ECANCELED)
    return um__set_error(st, "the operation was canceled");
  /* Written before the operation completed; the wait's lock orders it. */
  if (e->error_text[0] != '\0')
    return um__set_error(st, "%s", e->error_text);
  return um__set_error(st, "the operation failed: %s", um_strerror(st));
}

int um__event_wait_result(um_event *e) { return wait_error(e, um__event_wait_internal(e)); }

/* ------------------------------------------------------------------------ */
/* Public event API */

/* A public call's event: UM_EINVAL when e is not an event at all, UM_ESTATE
 * when the caller already released it (the object may since serve another
 * operation; then the call acts on that one, as a stale buffer handle does). */
static int check_event(const um_event *e) {
  if (e == NULL || e->magic != UM__EVENT_MAGIC)
    return um__set_error(UM_EINVAL, "not an event");
  if (!atomic_load_explicit(&e->caller_holds, memory_order_acquire))
    return um__set_error(UM_ESTATE, "event %p was released", (const void *)e);
  if (um__process_changed(e->m))
    return um__manager_check_process(e->m);
  return UM_OK;
}

/* check_event, then e's lock taken when it answers UM_OK. */
static int lock_event(um_event *e) {
  int st = check_event(e);
  if (st == UM_OK)
    pthread_mutex_lock(&e->lock);
  return st;
}

int um_event_wait(um_event *e) {
  int st = check_event(e);
  if (st != UM_OK)
    return st;
  /* Done, and done well: nothing to wait for and no text to copy, so no
   * reference either (the object is never freed before the manager, and a
   * release racing this wait is the caller's misuse, as for check_event). */
  if (atomic_load_explicit(&e->state, memory_order_acquire) == UM__EV_DONE && e->status == UM_OK)
    return UM_OK;
  /* Hold the object for the wait: another thread may release the handle
   * meanwhile (a misuse, but not one that may reach freed memory). And
   * count this thread in: a destroy on another thread finishes the wait
   * (its drain), then waits for this thread to leave before it frees the
   * object (um__events_wait_waiters). */
  um_manager *m = e->m;
  um__atomic_add_relaxed(&m->event_waiters, 1);
  if (!event_ref_if_used(e)) {
    atomic_fetch_sub_explicit(&m->event_waiters, 1, memory_order_release);
    return um__set_error(UM_ESTATE, "event %p was released", (void *)e);
  }
  st = wait_error(e, event_wait(e, true));
  um__event_unref(e);
  atomic_fetch_sub_explicit(&m->event_waiters, 1, memory_order_release);
  return st;
}

int um_event_query(um_event *e) {
  int st = lock_event(e);
  if (st != UM_OK)
    return st;
  if (e->canceled) /* answered at once, though it may still pass through its chain */
    st = UM_ECANCELED;
  else
    st = atomic_load_explicit(&e->state, memory_order_acquire) != UM__EV_DONE ? UM_EAGAIN : e->status;
  pthread_mutex_unlock(&e->lock);
  if (st == UM_EAGAIN) /* a caller that polls waits too: no rider may hold it up */
    um__riders_kick(e->m);
  if (st == UM_ECANCELED)
    return um__set_error(st, "the operation was canceled");
  if (st != UM_OK && st != UM_EAGAIN)
    return um__set_error(st, "%s", e->error_text[0] != '\0' ? e->error_text : um_strerror(st));
  return st;
}

int um_event_cancel(um_event *e) {
  int st = lock_event(e);
  if (st != UM_OK)
    return st;
  if (e->kind != UM__OP_GROUP && !e->canceled &&
      atomic_load_explicit(&e->state, memory_order_acquire) == UM__EV_QUEUED) {
    e->canceled = true;
    if (e->cond_waiters > 0) /* um_event_wait answers a cancel at once */
      pthread_cond_broadcast(&e->cond);
    st = UM_OK;
  } else {
    st = um__set_error(UM_EBUSY, "operation already started or finished");
  }
  pthread_mutex_unlock(&e->lock);
  return st;
}

int um_event_release(um_event *e) {
  bool held = true;
  if (e == NULL || e->magic != UM__EVENT_MAGIC)
    return um__set_error(UM_EINVAL, "not an event");
  if (um__process_changed(e->m))
    return um__manager_check_process(e->m);
  if (!atomic_compare_exchange_strong_explicit(&e->caller_holds, &held, false, memory_order_acq_rel,
                                               memory_order_acquire))
    return um__set_error(UM_ESTATE, "event %p was released already", (void *)e);
  um__event_caller_native_drop(e); /* the share keep_native (tokens.c) took for um_event_native */
  um__event_unref(e);
  return UM_OK;
}

int um_event_native(um_event *e, void **native) {
  um_device *d;
  void *tok;
  int st = check_event(e);
  if (st != UM_OK)
    return st;
  if (native == NULL)
    return um__set_error(UM_EINVAL, "um_event_native: NULL native");
  tok = atomic_load(&e->caller_native);
  d = e->native_dev;
  if (d == NULL || !um__dev_has_native_events(d))
    return um__set_error(UM_ENOTSUP, "the operation runs on host threads: it has no native event");
  if (tok == NULL) {
    um__riders_kick(e->m); /* what it follows may be a rider (core/riders.c) */
    return um__set_error(UM_EAGAIN, "the operation is not on the device's queue yet");
  }
  *native = um__dev_token_native(d, tok);
  return UM_OK;
}

/* ------------------------------------------------------------------------ */
/* What the layers below call up into (mem.h, "Calls up"), and the event
 * stash's share of a thread's exit (core/thread.c) */

/* A thread's stash of event objects goes back to the manager as it leaves
 * (core/thread.c). */
static const um__thread_part thread_part = {.thread_exit = um__events_stash_flush};

__attribute__((constructor)) static void register_upcalls(void) {
  um__thread_part_add(&thread_part);
  um__upcall.ops.events_drop_natives = um__events_drop_natives;
  um__upcall.ops.events_free_all = um__events_free_all;
}
