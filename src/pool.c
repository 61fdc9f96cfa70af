/* The pool: idle blocks per (device, location), one bin per size class.
 *
 * Invariants (checked by tests/test_pool.c and the stress test):
 * - a block is in at most one bin, and only while its descriptor is IDLE;
 * - bin->idle_bytes is the sum of the capacities in the bin;
 * - the manager's bytes_pooled is the sum over all bins, and never exceeds
 *   max_pool_bytes; a bin never exceeds max_pool_bytes_per_class.
 * Lock order: a bin's lock is never held while another bin's is taken, and
 * never while calling the backend (a device free can be slow). */
#include <errno.h>
#include <string.h>
#include <time.h>

#include "internal.h"

void um__pool_init(um__pool *p, um_device *dev, um_location loc) {
  p->dev = dev;
  p->loc = loc;
  for (int i = 0; i < UM__CLASS_COUNT; i++) {
    pthread_mutex_init(&p->bins[i].lock, NULL);
    p->bins[i].head = p->bins[i].tail = NULL;
    p->bins[i].idle_bytes = 0;
  }
}

static void bin_unlink(um__bin *bin, um_buffer *b) {
  if (b->pool_prev)
    b->pool_prev->pool_next = b->pool_next;
  else
    bin->head = b->pool_next;
  if (b->pool_next)
    b->pool_next->pool_prev = b->pool_prev;
  else
    bin->tail = b->pool_prev;
  b->pool_prev = b->pool_next = NULL;
  bin->idle_bytes -= b->capacity;
}

/* Give an idle block's memory back to its device; the descriptor becomes a
 * husk for reuse. Called with no lock held. */
static void release_block(um_buffer *b, bool trimmed) {
  um_device *d = b->dev;
  um__stat_pooled_sub(d, b->capacity);
  if (trimmed) {
    UM__STAT_ADD(d, trims, 1);
    UM__STAT_ADD(d, bytes_trimmed, b->capacity);
  }
  um__block_free(d, b->loc, b->capacity, &b->mem);
  um__descriptor_put(b->m, b);
}

void um__pool_destroy(um__pool *p) {
  for (int i = 0; i < UM__CLASS_COUNT; i++) {
    um__bin *bin = &p->bins[i];
    while (bin->tail) {
      um_buffer *b = bin->tail;
      bin_unlink(bin, b);
      release_block(b, false);
    }
    pthread_mutex_destroy(&bin->lock);
  }
}

um_buffer *um__pool_take(um__pool *p, int cls) {
  um__bin *bin = &p->bins[cls];
  um_buffer *b;
  pthread_mutex_lock(&bin->lock);
  b = bin->head;
  if (b != NULL)
    bin_unlink(bin, b);
  pthread_mutex_unlock(&bin->lock);
  if (b != NULL)
    um__stat_pooled_sub(p->dev, b->capacity);
  return b;
}

void um__pool_give(um__pool *p, um_buffer *b) {
  um_manager *m = b->m;
  const um_options *o = &m->opts;
  um__bin *bin = &p->bins[b->cls];
  uint64_t cap = b->capacity;

  if (cap > o->max_pool_bytes || cap > o->max_pool_bytes_per_class) {
    um__stat_pooled_add(b->dev, cap); /* release_block subtracts it again */
    release_block(b, false);
    return;
  }
  /* Make room in the manager: oldest idle blocks go first. */
  while (um__atomic_load_relaxed(&m->bytes_pooled) + cap > o->max_pool_bytes) {
    if (um__pool_trim(m, NULL, o->max_pool_bytes - cap) == 0)
      break;
  }
  b->idle_since_ns = um__now_ns();
  atomic_store_explicit(&b->state, UM__BUF_IDLE, memory_order_release);
  pthread_mutex_lock(&bin->lock);
  /* Make room in the class: its oldest blocks go first. */
  while (bin->idle_bytes + cap > o->max_pool_bytes_per_class && bin->tail) {
    um_buffer *old = bin->tail;
    bin_unlink(bin, old);
    pthread_mutex_unlock(&bin->lock);
    release_block(old, true);
    pthread_mutex_lock(&bin->lock);
  }
  b->pool_prev = NULL;
  b->pool_next = bin->head;
  if (bin->head)
    bin->head->pool_prev = b;
  else
    bin->tail = b;
  bin->head = b;
  bin->idle_bytes += cap;
  pthread_mutex_unlock(&bin->lock);
  if (um__stat_pooled_add(b->dev, cap) == 0)
    um__trim_thread_kick(m);
}

/* The oldest idle block in the manager (or one device), unlinked. Scanning
 * every bin's tail is linear in the number of bins, which is fine for a
 * trim (rare, and it frees memory, which costs far more). */
static um_buffer *take_oldest(um_manager *m, um_device *only, uint64_t older_than_ns) {
  for (;;) {
    um__bin *best = NULL;
    uint64_t best_t = UINT64_MAX;
    um_buffer *b;
    for (int di = 0; di < m->ndevices; di++) {
      um_device *d = m->devices[di];
      if (only != NULL && d != only)
        continue;
      for (int l = 0; l < UM_LOCATION_COUNT; l++) {
        for (int c = 0; c < UM__CLASS_COUNT; c++) {
          um__bin *bin = &d->pools[l].bins[c];
          uint64_t t;
          if (bin->tail == NULL) /* racy peek; confirmed under the lock */
            continue;
          pthread_mutex_lock(&bin->lock);
          t = bin->tail ? bin->tail->idle_since_ns : UINT64_MAX;
          pthread_mutex_unlock(&bin->lock);
          if (t < best_t) {
            best_t = t;
            best = bin;
          }
        }
      }
    }
    if (best == NULL || best_t >= older_than_ns)
      return NULL;
    pthread_mutex_lock(&best->lock);
    b = best->tail;
    if (b != NULL && b->idle_since_ns == best_t) {
      bin_unlink(best, b);
      pthread_mutex_unlock(&best->lock);
      return b;
    }
    pthread_mutex_unlock(&best->lock); /* raced with a taker: look again */
  }
}

static uint64_t pooled_of(um_manager *m, um_device *d) {
  return d ? um__atomic_load_relaxed(&d->stats.bytes_pooled)
           : um__atomic_load_relaxed(&m->bytes_pooled);
}

uint64_t um__pool_trim(um_manager *m, um_device *dev, uint64_t keep) {
  uint64_t freed = 0;
  while (pooled_of(m, dev) > keep) {
    um_buffer *b = take_oldest(m, dev, UINT64_MAX);
    if (b == NULL)
      break;
    freed += b->capacity;
    release_block(b, true);
  }
  return freed;
}

uint64_t um__pool_trim_older(um_manager *m, uint64_t cutoff_ns) {
  uint64_t freed = 0;
  um_buffer *b;
  while ((b = take_oldest(m, NULL, cutoff_ns)) != NULL) {
    freed += b->capacity;
    release_block(b, true);
  }
  return freed;
}

void um__pool_largest(um__pool *p, uint64_t *largest) {
  for (int c = UM__CLASS_COUNT - 1; c >= 0; c--) {
    um__bin *bin = &p->bins[c];
    bool any;
    if (bin->head == NULL)
      continue;
    pthread_mutex_lock(&bin->lock);
    any = bin->head != NULL;
    pthread_mutex_unlock(&bin->lock);
    if (any) {
      uint64_t sz = um__class_size(c);
      if (sz > *largest)
        *largest = sz;
      return;
    }
  }
}

int um_pool_trim(um_manager *m, uint64_t keep_bytes) {
  if (m == NULL)
    return um__set_error(UM_EINVAL, "um_pool_trim: manager is NULL");
  um__pool_trim(m, NULL, keep_bytes);
  return UM_OK;
}

/* ------------------------------------------------------------------------ */
/* The trim timer: a thread that frees blocks idle for trim_interval_ms. It
 * sleeps without a deadline while the pool is empty, so an idle process
 * does not wake up for nothing. */

static void *trim_main(void *arg) {
  um_manager *m = arg;
  uint64_t interval_ns = (uint64_t)m->opts.trim_interval_ms * 1000000ull;
  pthread_mutex_lock(&m->trim_lock);
  while (!m->trim_stop) {
    if (um__atomic_load_relaxed(&m->bytes_pooled) == 0) {
      pthread_cond_wait(&m->trim_cond, &m->trim_lock);
      continue;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t wake = (uint64_t)ts.tv_nsec + interval_ns / 2 + 1000000ull;
    ts.tv_sec += (time_t)(wake / 1000000000ull);
    ts.tv_nsec = (long)(wake % 1000000000ull);
    pthread_cond_timedwait(&m->trim_cond, &m->trim_lock, &ts);
    if (m->trim_stop)
      break;
    pthread_mutex_unlock(&m->trim_lock);
    uint64_t now = um__now_ns();
    if (now > interval_ns)
      um__pool_trim_older(m, now - interval_ns);
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
  m->trim_running = true;
  return UM_OK;
}

void um__trim_thread_stop(um_manager *m) {
  if (!m->trim_running)
    return;
  pthread_mutex_lock(&m->trim_lock);
  m->trim_stop = true;
  pthread_cond_signal(&m->trim_cond);
  pthread_mutex_unlock(&m->trim_lock);
  pthread_join(m->trim_thread, NULL);
  m->trim_running = false;
}

/* Wake the timer; called when the pool goes from empty to not empty, so the
 * release path pays for the lock only on that transition. */
void um__trim_thread_kick(um_manager *m) {
  if (!m->trim_running)
    return;
  pthread_mutex_lock(&m->trim_lock);
  pthread_cond_signal(&m->trim_cond);
  pthread_mutex_unlock(&m->trim_lock);
}
