/* um_copy_batch on single-queue devices (the "fault-queue" backend: an
 * in-order queue per device, callbacks that may re-enter, as OpenCL's), where
 * a batch's copies go in runs, queued quietly: mixed batches over two devices
 * in every direction against a model, the statistics of a batch, one entry
 * failing when queued and when it runs, a batch behind a canceled
 * operation, and many small batches in bounded memory. */
#include <pthread.h>
#include <sched.h>
#include <time.h>

#include "batch_model.h"
#include "fault_backend.h"
#include "testhook.h"

#define KiB 1024u
#define SEG (4 * KiB)

static um_manager *m;
static um_device *d1, *d2;

static void setup(void) {
  um_options o;
  ut_options(&o);
  o.enable_peer = 1;
  fault_configure(2, 64u << 20);
  fault_reset();
  cr_assert_eq(fault_manager_create_queue(&o, &m), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_device_count(m), 3);
  d1 = um_device_get(m, 1);
  d2 = um_device_get(m, 2);
  cr_assert_eq(um_peer_enabled(d2, d1), 1);
}

static void teardown(void) {
  atomic_store(&um__test_hook, NULL);
  cr_assert_eq(um_manager_destroy(m), UM_OK, "%s", um_last_error());
}

TestSuite(batch, .init = setup, .fini = teardown, .timeout = 120);

static um_buffer *alloc_on(um_device *d, size_t n, um_location loc) {
  um_buffer *b = NULL;
  cr_assert_eq(um_alloc(m, d, n, loc, UM_ALLOC_ZERO, &b), UM_OK, "%s", um_last_error());
  return b;
}

/* Device buffers of both devices, a pinned buffer (a host view: its copies
 * take the host paths, on workers or inline), mixed in one batch. */
static void mixed_batch(uint64_t seed, bool with_event) {
  bm_model *bm = calloc(1, sizeof(*bm));
  uint64_t rng = seed;
  cr_assert_not_null(bm);
  bm->nslots = 5;
  bm->b[0] = alloc_on(d1, BM_SLOT_BYTES, UM_DEVICE);
  bm->b[1] = alloc_on(d1, BM_SLOT_BYTES, UM_DEVICE);
  bm->b[2] = alloc_on(d2, BM_SLOT_BYTES, UM_DEVICE);
  bm->b[3] = alloc_on(d2, BM_SLOT_BYTES, UM_DEVICE);
  bm->b[4] = alloc_on(d1, BM_SLOT_BYTES, UM_PINNED);
  bm_init(bm, seed);
  bm_generate(bm, &rng, 200);
  if (with_event) {
    um_event *e;
    cr_assert_eq(um_copy_batch(m, bm->ops, (size_t)bm->nops, &e), UM_OK, "%s", um_last_error());
    cr_assert_eq(um_event_wait(e), UM_OK, "%s", um_last_error());
    cr_assert_eq(um_event_release(e), UM_OK);
  } else {
    cr_assert_eq(um_copy_batch(m, bm->ops, (size_t)bm->nops, NULL), UM_OK, "%s", um_last_error());
  }
  bm_check(bm, "mixed batch");
  for (int i = 0; i < bm->nslots; i++)
    cr_assert_eq(um_release(bm->b[i]), UM_OK);
  bm_free(bm);
  free(bm);
}

Test(batch, mixed_devices_and_directions) {
  for (uint64_t seed = 1; seed <= 12; seed++)
    mixed_batch(seed, seed % 2 == 0);
}

/* What each copy of a batch counts is what it counts issued alone:
 * host->device and device->host direct, local and peer copies. */
Test(batch, statistics_as_single_copies) {
  um_buffer *a = alloc_on(d1, 64 * KiB, UM_DEVICE), *c = alloc_on(d1, 64 * KiB, UM_DEVICE);
  um_buffer *b = alloc_on(d2, 64 * KiB, UM_DEVICE);
  unsigned char *src = malloc(64 * KiB), *dst = calloc(1, 64 * KiB);
  um_copy_op ops[20];
  um_stats before, after;
  int n = 0;
  ut_pattern(src, 64 * KiB, 7);
  for (int i = 0; i < 8; i++) /* h2d into a, one run */
    ops[n++] = (um_copy_op){.dst = a, .dst_off = (size_t)i * SEG, .host_src = src + (size_t)i * SEG, .bytes = SEG};
  for (int i = 0; i < 4; i++) /* d2h out of a: the same run */
    ops[n++] = (um_copy_op){.host_dst = dst + (size_t)i * SEG, .src = a, .src_off = (size_t)i * SEG, .bytes = SEG};
  for (int i = 0; i < 2; i++) /* local a -> c */
    ops[n++] = (um_copy_op){.dst = c, .dst_off = (size_t)i * SEG, .src = a, .src_off = (size_t)i * SEG, .bytes = SEG};
  for (int i = 0; i < 2; i++) /* peer a -> b: d2's queue, after d1's run */
    ops[n++] = (um_copy_op){.dst = b, .dst_off = (size_t)i * SEG, .src = a, .src_off = (size_t)(i + 4) * SEG, .bytes = SEG};
  for (int i = 0; i < 4; i++) /* h2d into b, behind the peer copies */
    ops[n++] = (um_copy_op){.dst = b, .dst_off = (size_t)(i + 8) * SEG, .host_src = src, .bytes = SEG};
  before = ut_stats(m, NULL);
  cr_assert_eq(um_copy_batch(m, ops, (size_t)n, NULL), UM_OK, "%s", um_last_error());
  after = ut_stats(m, NULL);
  cr_assert_eq(after.bytes_h2d - before.bytes_h2d, 12 * SEG);
  cr_assert_eq(after.bytes_d2h - before.bytes_d2h, 4 * SEG);
  cr_assert_eq(after.bytes_d2d - before.bytes_d2d, 2 * SEG);
  cr_assert_eq(after.bytes_peer - before.bytes_peer, 2 * SEG);
  cr_assert_eq(after.xfer_direct - before.xfer_direct, 16u);
  cr_assert_eq(after.xfer_local - before.xfer_local, 2u);
  cr_assert_eq(after.xfer_peer - before.xfer_peer, 2u);
  cr_assert_eq(after.xfer_staged - before.xfer_staged, 0u);
  cr_assert_arr_eq(dst, src, 4 * SEG);
  cr_assert_eq(um_copy_to_host(b, 0, dst, 2 * SEG, NULL), UM_OK);
  cr_assert_arr_eq(dst, src + 4 * SEG, 2 * SEG);
  cr_assert_eq(um_copy_to_host(c, 0, dst, 2 * SEG, NULL), UM_OK);
  cr_assert_arr_eq(dst, src, 2 * SEG);
  um_release(a), um_release(b), um_release(c);
  free(src), free(dst);
}

/* Six 4 KiB writes into a zeroed buffer in one batch; the fault plan fails
 * the third. The batch answers the planned code with the backend's text,
 * and whether the other five landed says how the failure was reported. */
static void one_entry_fails(bool at_submit) {
  um_buffer *a = alloc_on(d1, 6 * SEG, UM_DEVICE);
  unsigned char *src = malloc(6 * SEG), *got = malloc(6 * SEG);
  um_copy_op ops[6];
  um_stats before, after;
  um_event *e;
  ut_pattern(src, 6 * SEG, 3);
  for (int i = 0; i < 6; i++)
    ops[i] = (um_copy_op){.dst = a, .dst_off = (size_t)i * SEG, .host_src = src + (size_t)i * SEG, .bytes = SEG};
  fault_reset();
  fault_fail_xfer(3, false, UM_EBACKEND, at_submit);
  before = ut_stats(m, NULL);
  cr_assert_eq(um_copy_batch(m, ops, 6, &e), UM_OK);
  cr_assert_eq(um_event_wait(e), UM_EBACKEND);
  /* Refused when queued, the text is the backend's; a failure when run is
   * reported by the queue mark, on the queue's thread. */
  if (at_submit)
    cr_assert(strstr(um_last_error(), "transfer 3 fails by plan") != NULL, "the backend's text: %s",
              um_last_error());
  else
    cr_assert(um_last_error()[0] != '\0');
  cr_assert_eq(um_event_query(e), UM_EBACKEND);
  cr_assert_eq(um_event_release(e), UM_OK);
  after = ut_stats(m, NULL);
  fault_disarm();
  cr_assert_eq(um_copy_to_host(a, 0, got, 6 * SEG, NULL), UM_OK);
  for (int i = 0; i < 6; i++) {
    if (i == 2)
      cr_assert(ut_all_bytes(got + 2 * SEG, SEG, 0), "the failed write wrote");
    else
      cr_assert_arr_eq(got + (size_t)i * SEG, src + (size_t)i * SEG, SEG, "write %d", i);
  }
  /* Refused when queued: the other five ran and count. Failed when run:
   * the queue mark behind the run reports it, as it reports the run. */
  cr_assert_eq(after.bytes_h2d - before.bytes_h2d, at_submit ? 5 * SEG : 0);
  cr_assert_eq(after.xfer_direct - before.xfer_direct, at_submit ? 5u : 0u);
  /* The device works on. */
  cr_assert_eq(um_copy_batch(m, ops, 6, NULL), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_copy_to_host(a, 0, got, 6 * SEG, NULL), UM_OK);
  cr_assert_arr_eq(got, src, 6 * SEG);
  um_release(a);
  free(src), free(got);
}

/* The queue mark that closes a run is refused: the run's copies are on
 * the queue ahead of it, reading the caller's memory, and a blocking batch
 * returns only after they ended (the device's queue is held meanwhile). */
typedef struct held_batch {
  um_copy_op *ops;
  int n;
  int status;
  atomic_int let_go; /* the main thread let the queue go */
  int returned_after;
} held_batch;

static void *blocking_batch(void *arg) {
  held_batch *h = arg;
  h->status = um_copy_batch(m, h->ops, (size_t)h->n, NULL);
  h->returned_after = atomic_load(&h->let_go);
  return NULL;
}

Test(batch, refused_mark_waits_for_the_queued_copies) {
  um_buffer *a = alloc_on(d1, 4 * SEG, UM_DEVICE);
  unsigned char *src = malloc(4 * SEG), *got = malloc(4 * SEG);
  um_copy_op ops[4];
  held_batch h = {ops, 4, -1, 0, -1};
  pthread_t t;
  ut_pattern(src, 4 * SEG, 9);
  for (int i = 0; i < 4; i++)
    ops[i] = (um_copy_op){.dst = a, .dst_off = (size_t)i * SEG, .host_src = src + (size_t)i * SEG, .bytes = SEG};
  cr_assert_eq(fault_hold(d1, true), UM_OK);
  fault_refuse_next_mark();
  cr_assert_eq(pthread_create(&t, NULL, blocking_batch, &h), 0);
  while (!fault_mark_refused()) /* the batch queued its copies, then its mark */
    sched_yield();
  /* Time for a batch that does not wait for its copies to return. */
  nanosleep(&(struct timespec){0, 50 * 1000 * 1000}, NULL);
  atomic_store(&h.let_go, 1);
  cr_assert_eq(fault_hold(d1, false), UM_OK);
  cr_assert_eq(pthread_join(t, NULL), 0);
  cr_assert_eq(h.status, UM_EBACKEND);
  cr_assert_eq(h.returned_after, 1, "the blocking batch returned while its copies were still queued");
  cr_assert_eq(um_copy_to_host(a, 0, got, 4 * SEG, NULL), UM_OK);
  cr_assert_arr_eq(got, src, 4 * SEG, "the queued copies ran");
  um_release(a);
  free(src), free(got);
}

Test(batch, one_entry_refused_when_queued) { one_entry_fails(true); }
Test(batch, one_entry_fails_when_run) { one_entry_fails(false); }

/* A worker gate: the first operation a worker starts waits until opened. */
static pthread_mutex_t gate_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_cond = PTHREAD_COND_INITIALIZER;
static int gate_entered, gate_open;

static void gate_hook(um__test_point point, void *arg) {
  (void)arg;
  if (point != UM__TP_WORKER_RUN)
    return;
  pthread_mutex_lock(&gate_lock);
  if (gate_entered++ == 0) {
    pthread_cond_broadcast(&gate_cond);
    while (!gate_open)
      pthread_cond_wait(&gate_cond, &gate_lock);
  }
  pthread_mutex_unlock(&gate_lock);
}

/* A batch queued behind an operation that gets canceled: a batch itself
 * cannot be canceled (UM_EBUSY, and it runs), the canceled copy never
 * lands, and the batch's entries still follow it in order. */
Test(batch, behind_a_canceled_copy) {
  const size_t big = 512 * KiB; /* a host copy past the inline limit: a worker runs it */
  um_buffer *p = alloc_on(d1, big, UM_PINNED), *a = alloc_on(d1, 2 * SEG, UM_DEVICE);
  unsigned char *first = malloc(big), *victim = malloc(SEG), *got = malloc(2 * SEG);
  um_event *slow, *x, *g;
  um_copy_op ops[2] = {
      {.dst = a, .dst_off = 0, .src = p, .src_off = 0, .bytes = SEG},
      {.dst = a, .dst_off = SEG, .src = p, .src_off = SEG, .bytes = SEG},
  };
  ut_pattern(first, big, 11);
  ut_pattern(victim, SEG, 12);
  gate_entered = gate_open = 0;
  atomic_store(&um__test_hook, gate_hook);
  cr_assert_eq(um_copy_from_host(p, 0, first, big, &slow), UM_OK);
  pthread_mutex_lock(&gate_lock);
  while (gate_entered == 0)
    pthread_cond_wait(&gate_cond, &gate_lock);
  pthread_mutex_unlock(&gate_lock);
  cr_assert_eq(um_copy_from_host(p, 0, victim, SEG, &x), UM_OK); /* queued behind slow */
  cr_assert_eq(um_copy_batch(m, ops, 2, &g), UM_OK);             /* behind x */
  cr_assert_eq(um_event_query(g), UM_EAGAIN);
  cr_assert_eq(um_event_cancel(g), UM_EBUSY);
  cr_assert_eq(um_event_cancel(x), UM_OK);
  pthread_mutex_lock(&gate_lock);
  gate_open = 1;
  pthread_cond_broadcast(&gate_cond);
  pthread_mutex_unlock(&gate_lock);
  cr_assert_eq(um_event_wait(slow), UM_OK);
  cr_assert_eq(um_event_wait(x), UM_ECANCELED);
  cr_assert_eq(um_event_wait(g), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_copy_to_host(a, 0, got, 2 * SEG, NULL), UM_OK);
  cr_assert_arr_eq(got, first, 2 * SEG, "the batch read what the canceled copy would have overwritten");
  um_event_release(slow), um_event_release(x), um_event_release(g);
  um_release(p), um_release(a);
  free(first), free(victim), free(got);
}

/* The manager's event objects: slabs made so far. */
static int event_slabs(void) {
  int n = 0;
  pthread_mutex_lock(&m->event_lock);
  for (um__event_slab *s = m->event_slabs; s != NULL; s = s->next)
    n++;
  pthread_mutex_unlock(&m->event_lock);
  return n;
}

/* Many small batches over two devices, with and without events: event
 * objects come back to be reused (each thread parks fewer than 2 x 32 of
 * them, the rest go back to the manager: event.c), so past a warm-up no
 * more are made; nothing is left in flight, and the statistics count every
 * copy. */
static void small_batches(um_copy_op *ops, int n) {
  for (int i = 0; i < n; i++) {
    if (i % 3 == 0) {
      um_event *e;
      cr_assert_eq(um_copy_batch(m, ops, 4, &e), UM_OK);
      cr_assert_eq(um_event_wait(e), UM_OK);
      cr_assert_eq(um_event_release(e), UM_OK);
    } else {
      cr_assert_eq(um_copy_batch(m, ops, 4, NULL), UM_OK);
    }
  }
}

Test(batch, many_small_batches_bounded) {
  um_buffer *a = alloc_on(d1, 16 * KiB, UM_DEVICE), *b = alloc_on(d2, 16 * KiB, UM_DEVICE);
  unsigned char src[4 * KiB], got[4 * KiB];
  um_copy_op ops[4] = {
      {.dst = a, .dst_off = 0, .host_src = src, .bytes = sizeof(src)},
      {.dst = b, .dst_off = 0, .host_src = src, .bytes = sizeof(src)},
      {.dst = a, .dst_off = 4 * KiB, .src = b, .src_off = 0, .bytes = sizeof(src)},
      {.host_dst = got, .src = a, .src_off = 4 * KiB, .bytes = sizeof(got)},
  };
  /* threads that finish operations and may park objects: the workers, one
   * queue thread per device, this one */
  const int threads = 4 + 2 + 1, bound = threads * 2 * 32 / UM__EVENT_SLAB + 2;
  um_stats before, after;
  int warm;
  ut_pattern(src, sizeof(src), 5);
  small_batches(ops, 3000);
  warm = event_slabs();
  cr_assert_leq(warm, bound, "%d slabs of event objects for 5 at a time", warm);
  before = ut_stats(m, NULL);
  small_batches(ops, 3000);
  cr_assert_eq(um_device_synchronize(d1), UM_OK);
  after = ut_stats(m, NULL);
  /* Bounded, not frozen: which thread parks a finished object in its
   * stash depends on timing (a busy machine leaves more of them parked for
   * a while), but 3000 more batches may not take more than the bound. */
  cr_assert_leq(event_slabs(), bound, "event objects grew from %d slabs to %d (bound %d)", warm, event_slabs(),
                bound);
  cr_assert_eq(atomic_load(&m->engine.inflight), 0);
  cr_assert_eq(after.bytes_h2d - before.bytes_h2d, 3000u * 2 * sizeof(src));
  cr_assert_eq(after.bytes_peer - before.bytes_peer, 3000u * sizeof(src));
  cr_assert_eq(after.bytes_d2h - before.bytes_d2h, 3000u * sizeof(src));
  cr_assert_eq(after.bytes_in_use, before.bytes_in_use);
  cr_assert_arr_eq(got, src, sizeof(src));
  um_release(a), um_release(b);
}
