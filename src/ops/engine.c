/* The engine: the manager's worker threads (max_concurrent_transfers of
 * them) and their queue of work items (um__work): a worker calls the
 * item's function, as libuv's thread pool calls a request's work callback.
 * It also counts the operations in flight, which um_manager_destroy and
 * um_device_synchronize drain. Apart from event.c because it knows nothing
 * of operations or events: only work items, threads and a count.
 */
#include <stdlib.h>

#include "ops.h"
#include "list.h"
#include "testhook.h"

void um__engine_push(um_manager *m, um__work *w, bool first) {
  um__engine *en = &m->engine;
  pthread_mutex_lock(&en->lock);
  w->next = NULL;
  if (first) {
    w->next = en->head;
    en->head = w;
    if (en->tail == NULL)
      en->tail = w;
  } else {
    UM__QUEUE_APPEND(en->head, en->tail, w, next);
  }
  pthread_cond_signal(&en->cond);
  pthread_mutex_unlock(&en->lock);
}

static void *worker_main(void *arg) {
  um_manager *m = arg;
  um__engine *en = &m->engine;
  pthread_mutex_lock(&en->lock);
  for (;;) {
    um__work *w;
    while (en->head == NULL && !en->stopping)
      pthread_cond_wait(&en->cond, &en->lock);
    if (en->head == NULL)
      break; /* stopping and nothing left */
    UM__QUEUE_POP(en->head, en->tail, w, next);
    pthread_mutex_unlock(&en->lock);
    w->fn(w);
    pthread_mutex_lock(&en->lock);
  }
  pthread_mutex_unlock(&en->lock);
  return NULL;
}

int um__engine_start(um_manager *m) {
  um__engine *en = &m->engine;
  int n = m->opts.max_concurrent_transfers;
  pthread_mutex_init(&en->lock, NULL);
  pthread_cond_init(&en->cond, NULL);
  pthread_cond_init(&en->drained, NULL);
  atomic_init(&en->inflight, 0);
  en->head = en->tail = NULL;
  en->stopping = false;
  en->threads = calloc((size_t)n, sizeof(pthread_t));
  if (en->threads == NULL)
    return um__set_error(UM_ENOMEM, "engine: out of memory");
  for (en->nthreads = 0; en->nthreads < n; en->nthreads++) {
    if (pthread_create(&en->threads[en->nthreads], NULL, worker_main, m) != 0) {
      um__engine_stop(m);
      return um__set_error(UM_ENOMEM, "engine: cannot start worker thread");
    }
  }
  return UM_OK;
}

void um__engine_stop(um_manager *m) {
  um__engine *en = &m->engine;
  pthread_mutex_lock(&en->lock);
  en->stopping = true;
  pthread_cond_broadcast(&en->cond);
  pthread_mutex_unlock(&en->lock);
  for (int i = 0; i < en->nthreads; i++)
    pthread_join(en->threads[i], NULL);
  free(en->threads);
  en->threads = NULL;
  en->nthreads = 0;
  pthread_mutex_destroy(&en->lock);
  pthread_cond_destroy(&en->cond);
  pthread_cond_destroy(&en->drained);
}

void um__engine_op_begin(um_manager *m) { um__atomic_add_relaxed(&m->engine.inflight, 1); }

static int engine_idle(void *arg) {
  return um__atomic_load_acquire(&((um__engine *)arg)->inflight) == 0;
}

/* Wait until every operation begun has finished: polling first, as an
 * event's waiter does (wait_spin_ns); the count is read again under the
 * lock either way, which is what um_manager_destroy relies on. */
void um__engine_drain(um_manager *m) {
  um__engine *en = &m->engine;
  um__riders_wait_begin(m); /* a bracket's end riding on a queue is in flight */
  um__spin_until(m->opts.wait_spin_ns, engine_idle, en);
  pthread_mutex_lock(&en->lock);
  while (um__atomic_load_acquire(&en->inflight) != 0)
    pthread_cond_wait(&en->drained, &en->lock);
  pthread_mutex_unlock(&en->lock);
  um__riders_wait_end(m);
}

static int engine_idle_or_bracket(void *arg) {
  um_manager *m = arg;
  return um__atomic_load_acquire(&m->engine.inflight) == 0 || um__atomic_load_relaxed(&m->brackets_open) != 0;
}

/* um__engine_drain for um_device_synchronize: it stops (false) once a
 * bracket is open, which stays in flight until its um_access_end
 * (um__bracket_open wakes it). */
bool um__engine_drain_unless_bracket(um_manager *m) {
  um__engine *en = &m->engine;
  bool drained;
  um__riders_wait_begin(m);
  um__spin_until(m->opts.wait_spin_ns, engine_idle_or_bracket, m);
  pthread_mutex_lock(&en->lock);
  while (um__atomic_load_acquire(&en->inflight) != 0 && um__atomic_load_relaxed(&m->brackets_open) == 0)
    pthread_cond_wait(&en->drained, &en->lock);
  drained = um__atomic_load_acquire(&en->inflight) == 0;
  pthread_mutex_unlock(&en->lock);
  um__riders_wait_end(m);
  return drained;
}

void um__engine_wake_drains(um_manager *m) {
  pthread_mutex_lock(&m->engine.lock);
  pthread_cond_broadcast(&m->engine.drained);
  pthread_mutex_unlock(&m->engine.lock);
}

/* An operation finished: the completing thread's last touch of the
 * manager. um_manager_destroy frees the manager once inflight reads 0 under
 * the engine's lock (um__engine_drain), and a completion may run on a
 * driver's own thread, which nobody joins: so the count leaves 1 only under
 * that lock, and the thread that takes it to 0 is done with the manager
 * once it unlocks. Above 1 no drain can finish, so a CAS suffices. */
void um__engine_op_done(um_manager *m) {
  um__engine *en = &m->engine;
  int n = um__atomic_load_relaxed(&en->inflight);
  while (n > 1)
    if (atomic_compare_exchange_weak_explicit(&en->inflight, &n, n - 1, memory_order_acq_rel,
                                              memory_order_relaxed))
      return;
  pthread_mutex_lock(&en->lock);
  UM__TEST_POINT(UM__TP_INFLIGHT_DONE, m);
  if (um__atomic_sub_acq_rel(&en->inflight, 1) == 1)
    pthread_cond_broadcast(&en->drained);
  pthread_mutex_unlock(&en->lock);
}

/* ------------------------------------------------------------------------ */
/* What the layers below call up into (mem.h, "Calls up") */

__attribute__((constructor)) static void register_upcalls(void) {
  um__upcall.ops.engine_start = um__engine_start;
  um__upcall.ops.engine_stop = um__engine_stop;
  um__upcall.ops.engine_drain = um__engine_drain;
}
