/* Trims: idle memory goes back to the devices. On request (um_pool_trim),
 * under pressure (an allocation failed: buffer.c), and on a timer that
 * frees blocks idle for trim_interval_ms.
 *
 * A trim first moves the thread caches' blocks into the bins (in their
 * order), then frees from the bins (pool.c). Trims are serialised
 * (m->trimming), so that one trim cannot hold a block on its way from a
 * cache to a bin while another believes the pool empty. */
#include <string.h>
#include <time.h>

#include "tcache.h"

uint64_t um__trim(um_manager *m, um_device *dev, uint64_t keep) {
  uint64_t freed = 0;
  pthread_mutex_lock(&m->trimming);
  um__tcache_flush_all(m, dev);
  if (keep == 0) {
    for (int i = 0; i < um__ndevices(m); i++)
      if (dev == NULL || m->devices[i] == dev)
        freed += um__pool_free_idle(m->devices[i], UINT64_MAX);
  } else {
    freed = um__pool_free_oldest(m, dev, keep);
  }
  /* The freed blocks went back to their segments: the segments left
   * wholly free go back to the devices (all of them for keep 0; with a
   * keep, those that do not fit in what it leaves). */
  for (int i = 0; i < um__ndevices(m); i++)
    if (dev == NULL || m->devices[i] == dev)
      for (int l = 0; l < UM_LOCATION_COUNT; l++)
        um__seg_trim(&m->devices[i]->pools[l], keep, UINT64_MAX);
  pthread_mutex_unlock(&m->trimming);
  return freed;
}

void um__trim_for_pressure(um_device *d) {
  if (d->m->opts.debug)
    um__quarantine_drop_blocks(d->m, d);
  um__trim(d->m, d, 0);
}

int um_pool_trim(um_manager *m, uint64_t keep_bytes) {
  if (!um__manager_ok(m))
    return um__set_error(UM_EINVAL, "um_pool_trim: NULL or not a manager");
  if (um__process_changed(m))
    return um__manager_check_process(m);
  if (um__upcall.net.reap != NULL)
    um__upcall.net.reap(); /* blocks that peers can no longer write go back first */
  /* Debug mode: the blocks of quarantined buffers are idle memory too; their
   * handles stay quarantined (quarantine.c). */
  if (m->opts.debug)
    for (int i = 0; i < um__ndevices(m); i++)
      um__quarantine_drop_blocks(m, m->devices[i]);
  um__trim(m, NULL, keep_bytes);
  return UM_OK;
}

/* ------------------------------------------------------------------------ */
/* The trim timer: a thread that frees blocks idle for trim_interval_ms. It
 * sleeps without a deadline while the pool is empty, so an idle process
 * does not wake up for nothing.
 *
 * Thread caches: each tick first moves every cached block into the bins
 * (stamped with the time of the move), so a block idle in a cache is freed
 * between one and one and a half intervals after the tick that moved it.
 * The tick also moves the flush epoch, which makes every owner give back
 * its empty slots' budget at its next call. "Nothing is idle" is then: the
 * bins are empty and no slot was reserved since the tick (a reservation
 * while the timer sleeps wakes it: um__pool_reserve). The one block that
 * can escape a tick is one put into a slot that was already reserved while
 * the tick ran; its owner moves it to the bins (waking the timer) at its
 * next call, when it sees the new epoch. */

/* One tick: the caches' blocks to the bins, then what was idle longer than
 * an interval back to the devices. */
static void tick(um_manager *m, uint64_t interval_ns) {
  uint64_t now;
  pthread_mutex_lock(&m->trimming);
  um__tcache_flush_all(m, NULL);
  now = um__now_ns();
  if (now > interval_ns)
    for (int i = 0; i < um__ndevices(m); i++) {
      um__pool_free_idle(m->devices[i], now - interval_ns);
      for (int l = 0; l < UM_LOCATION_COUNT; l++)
        um__seg_trim(&m->devices[i]->pools[l], 0, now - interval_ns);
    }
  pthread_mutex_unlock(&m->trimming);
}

/* Sleep half an interval (called with trim_lock held). */
static void nap(um_manager *m, uint64_t interval_ns) {
  struct timespec ts;
  uint64_t wake;
  clock_gettime(CLOCK_REALTIME, &ts);
  wake = (uint64_t)ts.tv_nsec + interval_ns / 2 + 1000000ull;
  ts.tv_sec += (time_t)(wake / 1000000000ull);
  ts.tv_nsec = (long)(wake % 1000000000ull);
  pthread_cond_timedwait(&m->trim_cond, &m->trim_lock, &ts);
}

static void *trim_main(void *arg) {
  um_manager *m = arg;
  uint64_t interval_ns = (uint64_t)m->opts.trim_interval_ms * 1000000ull;
  unsigned seen = 0; /* the manager's first value: reservations made before
                       this thread runs must wake it */
  pthread_mutex_lock(&m->trim_lock);
  while (!m->trim_stop) {
    /* seq_cst store then load, against the reserver's increment then load
     * of trim_asleep: one of the two sees the other. */
    atomic_store(&m->trim_asleep, true);
    if (um__atomic_load_relaxed(&m->bytes_pooled) == 0 && um__atomic_load_relaxed(&m->seg_returnable) == 0 &&
        atomic_load(&m->reserve_seq) == seen) {
      pthread_cond_wait(&m->trim_cond, &m->trim_lock);
      atomic_store(&m->trim_asleep, false);
      seen = atomic_load(&m->reserve_seq) - 1u; /* tick at least once */
      continue;
    }
    atomic_store(&m->trim_asleep, false);
    nap(m, interval_ns);
    if (m->trim_stop)
      break;
    pthread_mutex_unlock(&m->trim_lock);
    seen = atomic_load(&m->reserve_seq);
    tick(m, interval_ns);
    pthread_mutex_lock(&m->trim_lock);
  }
  pthread_mutex_unlock(&m->trim_lock);
  return NULL;
}

int um__trim_thread_start(um_manager *m) {
  int rc;
  m->trim_stop = false;
  if (m->opts.trim_interval_ms == 0 || !m->opts.enable_pooling)
    return UM_OK;
  rc = pthread_create(&m->trim_thread, NULL, trim_main, m);
  if (rc != 0)
    return um__set_error(UM_ENOMEM, "cannot start the trim thread: %s", strerror(rc));
  um__atomic_store_release(&m->trim_running, true);
  return UM_OK;
}

void um__trim_thread_stop(um_manager *m) {
  if (!um__atomic_load_acquire(&m->trim_running))
    return;
  pthread_mutex_lock(&m->trim_lock);
  m->trim_stop = true;
  pthread_cond_signal(&m->trim_cond);
  pthread_mutex_unlock(&m->trim_lock);
  pthread_join(m->trim_thread, NULL);
  um__atomic_store_release(&m->trim_running, false);
}
