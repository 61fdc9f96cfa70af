/* Lifecycle defects found by review and adversarial testing (issue 10), each
 * pinned by a test that failed before its fix. The races are made certain,
 * not likely, with the test build's hooks (src/testhook.h) and with a test
 * backend whose completions arrive the way a driver's may:
 *
 *   "late" devices: DEVICE blocks with no host view (the test-discrete
 *   backend of test_util.h) plus xfer_async whose completion is delivered
 *   either on a detached thread of the backend's own, which unimem never
 *   joins (an OpenCL driver's callback thread), or inline on the thread of
 *   the next xfer_async call (a driver that runs an earlier command's
 *   callback on the submitting thread, which OpenCL allows). Its callbacks
 *   may re-enter (callbacks_reenter), as OpenCL's do.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>

#include "fault_backend.h"
#include "test_util.h"
#include "testhook.h"

/* ------------------------------------------------------------------------ */
/* The "late" test backend */

typedef enum { LATE_DETACHED = 0, LATE_NEXT_CALL = 1 } late_mode;

static _Atomic int late_delivery = LATE_DETACHED;

typedef struct late_job {
  atomic_int refs; /* the token's and the delivery's */
  um__done_fn done;
  void *arg;
  struct late_job *next;
} late_job;

static pthread_mutex_t late_lock = PTHREAD_MUTEX_INITIALIZER;
static late_job *late_pending; /* LATE_NEXT_CALL: not yet delivered */

static void late_job_put(late_job *j) {
  if (atomic_fetch_sub(&j->refs, 1) == 1)
    free(j);
}

/* Deliver one completion; nothing of ours is touched after done() but the
 * job, which is the backend's own memory. */
static void late_deliver(late_job *j) {
  j->done(j->arg, UM_OK);
  late_job_put(j);
}

static void *late_thread(void *arg) {
  late_deliver(arg);
  return NULL;
}

/* Every pending completion, inline on this thread. */
static void late_flush(void) {
  late_job *list;
  pthread_mutex_lock(&late_lock);
  list = late_pending;
  late_pending = NULL;
  pthread_mutex_unlock(&late_lock);
  while (list != NULL) {
    late_job *next = list->next;
    late_deliver(list);
    list = next;
  }
}

static int late_xfer_async(void *bdev, const um__xfer *x, void *const *after, int nafter,
                           um__done_fn done, void *arg, void **native) {
  late_job *j;
  pthread_t t;
  int st;
  (void)after;
  (void)nafter;
  /* A driver may complete earlier commands here, before this one. */
  if (atomic_load(&late_delivery) == LATE_NEXT_CALL)
    late_flush();
  st = ut_disc_xfer(bdev, x); /* the data moves now; only the report waits */
  if (st != UM_OK)
    return st;
  j = calloc(1, sizeof(*j));
  if (j == NULL)
    return um__set_error(UM_ENOMEM, "late: out of memory");
  atomic_init(&j->refs, 2);
  j->done = done;
  j->arg = arg;
  *native = j;
  if (atomic_load(&late_delivery) == LATE_NEXT_CALL) {
    pthread_mutex_lock(&late_lock);
    j->next = late_pending;
    late_pending = j;
    pthread_mutex_unlock(&late_lock);
    return UM_OK;
  }
  if (pthread_create(&t, NULL, late_thread, j) != 0) {
    free(j);
    return um__set_error(UM_ENOMEM, "late: no thread");
  }
  pthread_detach(t);
  return UM_OK;
}

static void late_native_release(void *bdev, void *native) {
  (void)bdev;
  late_job_put(native);
}

static int late_synchronize(void *bdev) {
  (void)bdev;
  late_flush();
  return UM_OK;
}

static const um__backend late_backend = {
    .name = "late",
    .open = ut_disc_open,
    .describe = ut_disc_describe,
    .close = ut_disc_close,
    .mem_alloc = ut_disc_mem_alloc,
    .mem_free = ut_disc_mem_free,
    .memory = ut_disc_memory,
    .synchronize = late_synchronize,
    .xfer = ut_disc_xfer,
    .xfer_async = late_xfer_async,
    .native_release = late_native_release,
    .callbacks_reenter = 1,
};

static um_manager *late_manager(late_mode mode) {
  um_options o;
  um_manager *m = NULL;
  const um__backend *extra[] = {&late_backend};
  atomic_store(&late_delivery, mode);
  ut_options(&o);
  cr_assert_eq(um__manager_create_ex(&o, extra, 1, &m), UM_OK, "create: %s", um_last_error());
  return m;
}

/* ------------------------------------------------------------------------ */
/* Test hooks */

static pthread_t test_thread;
static atomic_int hook_point = -1;
static atomic_int hook_sleep_ms;
static atomic_bool hook_returned;
static atomic_int hook_calls;
static void (*hook_action)(void *arg);

/* Sleeps (on threads other than the test's) or runs hook_action (on the
 * test's thread) at hook_point. */
static void test_hook(um__test_point point, void *arg) {
  if ((int)point != atomic_load(&hook_point))
    return;
  atomic_fetch_add(&hook_calls, 1);
  if (!pthread_equal(pthread_self(), test_thread)) {
    int ms = atomic_load(&hook_sleep_ms);
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
    atomic_store(&hook_returned, true);
  } else if (hook_action != NULL) {
    void (*action)(void *) = hook_action;
    hook_action = NULL; /* once: the action may call back into unimem */
    action(arg);
  }
}

static void hook_on(um__test_point point, int sleep_ms, void (*action)(void *)) {
  test_thread = pthread_self();
  atomic_store(&hook_sleep_ms, sleep_ms);
  atomic_store(&hook_returned, false);
  atomic_store(&hook_calls, 0);
  hook_action = action;
  atomic_store(&hook_point, (int)point);
  atomic_store(&um__test_hook, test_hook);
}

static void hook_off(void) {
  atomic_store(&um__test_hook, NULL);
  atomic_store(&hook_point, -1);
}

/* ------------------------------------------------------------------------ */
/* 1. Destroy racing a completion on a driver thread */

/* The completing thread, one unimem never joins, is held just before its
 * last touch of the manager; destroy must not return (and free the
 * manager) until that thread is done with it. */
Test(lifecycle, destroy_waits_for_a_driver_threads_last_touch, .timeout = 30) {
  um_manager *m = late_manager(LATE_DETACHED);
  um_buffer *b;
  um_event *e;
  char src[4096];
  memset(src, 7, sizeof(src));
  cr_assert_eq(um_alloc(m, um_device_get(m, 1), sizeof(src), UM_DEVICE, 0, &b), UM_OK);
  hook_on(UM__TP_INFLIGHT_DONE, 300, NULL);
  cr_assert_eq(um_copy_from_host(b, 0, src, sizeof(src), &e), UM_OK);
  cr_assert_eq(um_event_release(e), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  /* Destroy once the driver thread is inside the window, so that destroy
   * does not merely wait for the count (it did before the fix too). */
  for (int i = 0; i < 10000 && atomic_load(&hook_calls) == 0; i++)
    usleep(1000);
  cr_assert_eq(atomic_load(&hook_calls), 1);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
  cr_assert(atomic_load(&hook_returned),
            "um_manager_destroy returned while the driver thread was still inside the manager");
  hook_off();
}

/* ------------------------------------------------------------------------ */
/* 5. No lock of unimem held across the backend's calls */

/* The second copy depends on the first (same buffer, same device queue);
 * the backend delivers the first one's completion inside the second's
 * xfer_async, on the issuing thread. The issuer must hold no lock that the
 * first one's completion takes (it held the first event's lock before). */
Test(lifecycle, completion_inside_a_later_submission, .timeout = 30) {
  um_manager *m = late_manager(LATE_NEXT_CALL);
  um_buffer *b;
  um_event *e1, *e2;
  unsigned char a[8192], c[8192], out[8192];
  memset(a, 1, sizeof(a));
  memset(c, 2, sizeof(c));
  cr_assert_eq(um_alloc(m, um_device_get(m, 1), sizeof(a), UM_DEVICE, 0, &b), UM_OK);
  cr_assert_eq(um_copy_from_host(b, 0, a, sizeof(a), &e1), UM_OK);
  cr_assert_eq(um_event_query(e1), UM_EAGAIN, "the first completion waits for the next call");
  hook_on(UM__TP_NATIVE_START, 0, NULL);
  cr_assert_eq(um_copy_from_host(b, 4096, c, 4096, &e2), UM_OK);
  hook_off();
  cr_assert_eq(atomic_load(&hook_calls), 1, "the second copy was ordered through the queue");
  cr_assert_eq(um_event_query(e1), UM_OK, "delivered inside the second submission");
  late_flush(); /* the driver reports the second one */
  cr_assert_eq(um_event_wait(e2), UM_OK);
  cr_assert_eq(um_copy_to_host(b, 0, out, sizeof(out), NULL), UM_OK);
  cr_assert(ut_all_bytes(out, 4096, 1) && ut_all_bytes(out + 4096, 4096, 2));
  um_event_release(e1);
  um_event_release(e2);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* ------------------------------------------------------------------------ */
/* 4. Stale events */

Test(lifecycle, released_event_answers_estate) {
  um_manager *m = ut_manager();
  um_buffer *b;
  um_event *e;
  char src[64] = {0};
  cr_assert_eq(um_alloc(m, um_device_get(m, 0), 64, UM_HOST, 0, &b), UM_OK);
  cr_assert_eq(um_copy_from_host(b, 0, src, 64, &e), UM_OK);
  cr_assert_eq(um_event_wait(e), UM_OK);
  cr_assert_eq(um_event_release(e), UM_OK);
  cr_assert_eq(um_event_release(e), UM_ESTATE, "double release");
  cr_assert_eq(um_event_wait(e), UM_ESTATE);
  cr_assert_eq(um_event_query(e), UM_ESTATE);
  cr_assert_eq(um_event_cancel(e), UM_ESTATE);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* A batch's event and an event whose operation is still queued, released
 * twice, and one released by another thread while this one waits. */
static void *release_later(void *arg) {
  struct timespec ts = {0, 20 * 1000000L};
  nanosleep(&ts, NULL);
  um_event_release(arg);
  return NULL;
}

Test(lifecycle, stale_batch_and_pending_events) {
  um_manager *m = ut_manager();
  um_buffer *b;
  um_event *g, *e;
  pthread_t t;
  static char big[8u << 20];
  um_copy_op ops[2];
  cr_assert_eq(um_alloc(m, um_device_get(m, 0), sizeof(big), UM_HOST, 0, &b), UM_OK);
  memset(ops, 0, sizeof(ops));
  ops[0].dst = b, ops[0].host_src = big, ops[0].bytes = sizeof(big);
  ops[1].src = b, ops[1].host_dst = big, ops[1].bytes = 4096;
  cr_assert_eq(um_copy_batch(m, ops, 2, &g), UM_OK);
  cr_assert_eq(um_event_release(g), UM_OK);
  cr_assert_eq(um_event_release(g), UM_ESTATE);
  cr_assert_eq(um_copy_from_host(b, 0, big, sizeof(big), &e), UM_OK);
  cr_assert_eq(pthread_create(&t, NULL, release_later, e), 0);
  int st = um_event_wait(e); /* released meanwhile: a misuse, but no freed memory */
  cr_assert(st == UM_OK || st == UM_ESTATE, "wait answered %s", um_err_name(st));
  pthread_join(t, NULL);
  cr_assert_eq(um_event_release(e), UM_ESTATE);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* ------------------------------------------------------------------------ */
/* 2. Releasing a wrap waits for the operations issued on it */

Test(lifecycle, wrap_release_waits_for_its_copies, .timeout = 30) {
  um_manager *m = ut_manager();
  const size_t n = 32u << 20;
  unsigned char *mine = malloc(n), *src = malloc(n);
  um_buffer *w, *s;
  um_event *e;
  cr_assert(mine != NULL && src != NULL);
  memset(mine, 0, n);
  cr_assert_eq(um_alloc(m, um_device_get(m, 0), n, UM_HOST, 0, &s), UM_OK);
  memset(um_buffer_host_ptr(s), 0x5A, n);
  cr_assert_eq(um_wrap_host(m, mine, n, 0, &w), UM_OK);
  /* The copy runs on a worker that is held back before it starts. */
  hook_on(UM__TP_WORKER_RUN, 100, NULL);
  cr_assert_eq(um_copy(w, 0, s, 0, n, &e), UM_OK);
  cr_assert_eq(um_release(w), UM_OK);
  cr_assert_neq(um_event_query(e), UM_EAGAIN, "um_release of a wrap returned with a copy in flight");
  hook_off();
  cr_assert(ut_all_bytes(mine, n, 0x5A));
  memset(mine, 0x11, n); /* the caller's memory is the caller's again */
  cr_assert_eq(um_event_wait(e), UM_OK);
  cr_assert(ut_all_bytes(mine, n, 0x11));
  um_event_release(e);
  cr_assert_eq(um_release(s), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
  free(mine);
  free(src);
}

/* ------------------------------------------------------------------------ */
/* 3. um_map_file on what is not a regular file */

static void no_hang(int sig) {
  (void)sig;
  _exit(99);
}

Test(lifecycle, map_file_refuses_non_regular_files_at_once, .timeout = 30) {
  um_manager *m = ut_manager();
  um_buffer *b = NULL;
  char dir[] = "/tmp/um_lifecycle_XXXXXX", fifo[64], sock[64];
  struct sockaddr_un sa;
  int fd;
  cr_assert_not_null(mkdtemp(dir));
  snprintf(fifo, sizeof(fifo), "%s/fifo", dir);
  snprintf(sock, sizeof(sock), "%s/sock", dir);
  cr_assert_eq(mkfifo(fifo, 0600), 0);
  fd = socket(AF_UNIX, SOCK_STREAM, 0);
  memset(&sa, 0, sizeof(sa));
  sa.sun_family = AF_UNIX;
  snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", sock);
  cr_assert_eq(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
  signal(SIGALRM, no_hang);
  alarm(10); /* a FIFO with no writer used to block open() forever */
  for (int mode = UM_MAP_READ; mode <= UM_MAP_READ_WRITE; mode++) {
    cr_assert_eq(um_map_file(m, fifo, (um_map_mode)mode, &b), UM_EINVAL, "FIFO: %s", um_last_error());
    cr_assert_eq(um_map_file(m, sock, (um_map_mode)mode, &b), UM_EINVAL, "socket");
    cr_assert_eq(um_map_file(m, dir, (um_map_mode)mode, &b), UM_EINVAL, "directory");
    cr_assert_eq(um_map_file(m, "/dev/null", (um_map_mode)mode, &b), UM_EINVAL, "device");
  }
  alarm(0);
  cr_assert_null(b);
  close(fd);
  unlink(sock);
  unlink(fifo);
  rmdir(dir);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* ------------------------------------------------------------------------ */
/* 6. bytes_pooled is never below what the bins hold */

static um_manager *pooled_m;

static void check_pooled_covers(void *arg) {
  um_buffer *b = arg;
  um_stats s;
  cr_assert_eq(um_stats_get(pooled_m, NULL, &s), UM_OK);
  cr_assert_geq(s.bytes_pooled, b->capacity,
                "a block in a bin is not counted in bytes_pooled (%llu)", (unsigned long long)s.bytes_pooled);
}

Test(lifecycle, pooled_count_before_the_block_is_visible) {
  um_buffer *a, *b;
  pooled_m = ut_manager();
  /* Two releases of one class: the second takes the thread cache's slot and
   * sends the first to its bin (pool.c's give path). */
  cr_assert_eq(um_alloc(pooled_m, um_device_get(pooled_m, 0), 1000, UM_HOST, 0, &a), UM_OK);
  cr_assert_eq(um_alloc(pooled_m, um_device_get(pooled_m, 0), 1000, UM_HOST, 0, &b), UM_OK);
  cr_assert_eq(um_release(a), UM_OK);
  hook_on(UM__TP_POOL_PUT, 0, check_pooled_covers);
  cr_assert_eq(um_release(b), UM_OK);
  hook_off();
  cr_assert_null(hook_action, "the block went through a bin");
  cr_assert_eq(um_manager_destroy(pooled_m), UM_OK);
}

/* ------------------------------------------------------------------------ */
/* 7. A buffer released and its descriptor reused, smaller, while a call on
 * the old handle was between its checks and its lock */

static um_manager *reuse_m;
static um_buffer *reuse_old, *reuse_new;

static void release_and_reuse_smaller(void *arg) {
  (void)arg;
  cr_assert_eq(um_release(reuse_old), UM_OK);
  cr_assert_eq(um_alloc(reuse_m, um_device_get(reuse_m, 0), 64, UM_HOST, UM_ALLOC_UNPOOLED, &reuse_new),
               UM_OK);
  cr_assert_eq(reuse_new, reuse_old, "the descriptor is reused (a husk)");
  memset(um_buffer_host_ptr(reuse_new), 0x33, 64);
}

Test(lifecycle, op_on_a_handle_reused_meanwhile_is_refused) {
  static unsigned char src[1u << 20];
  reuse_m = ut_manager();
  cr_assert_eq(um_alloc(reuse_m, um_device_get(reuse_m, 0), sizeof(src), UM_HOST, UM_ALLOC_UNPOOLED,
                        &reuse_old),
               UM_OK);
  hook_on(UM__TP_OP_CHECKED, 0, release_and_reuse_smaller);
  cr_assert_eq(um_copy_from_host(reuse_old, 0, src, sizeof(src), NULL), UM_ESTATE);
  hook_off();
  cr_assert(ut_all_bytes(um_buffer_host_ptr(reuse_new), 64, 0x33), "the new owner's bytes are untouched");
  cr_assert_eq(um_release(reuse_new), UM_OK);
  cr_assert_eq(um_manager_destroy(reuse_m), UM_OK);
}

Test(lifecycle, map_of_a_handle_reused_meanwhile_is_refused) {
  void *p = NULL;
  reuse_m = ut_manager();
  cr_assert_eq(um_alloc(reuse_m, um_device_get(reuse_m, 0), 1u << 20, UM_HOST, UM_ALLOC_UNPOOLED, &reuse_old),
               UM_OK);
  hook_on(UM__TP_MAP_CHECKED, 0, release_and_reuse_smaller);
  cr_assert_eq(um_map(reuse_old, UM_MAP_READ_WRITE, 512u << 10, 4096, &p), UM_ESTATE);
  hook_off();
  cr_assert_null(p);
  cr_assert_eq(um_release(reuse_new), UM_OK);
  cr_assert_eq(um_manager_destroy(reuse_m), UM_OK);
}

/* ------------------------------------------------------------------------ */
/* 8. Page locks nest */

static void *page_aligned(size_t n) {
  void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  cr_assert_neq(p, MAP_FAILED);
  memset(p, 1, n);
  return p;
}

Test(lifecycle, two_pinned_wraps_keep_their_locks) {
  const size_t n = 256u << 10;
  um_manager *m;
  um_buffer *w1, *w2;
  void *p;
  uint64_t base;
  if (!ut_mlock_works())
    cr_skip_test("SKIP: mlock is refused here (RLIMIT_MEMLOCK), so page locks cannot be observed");
  m = ut_manager();
  p = page_aligned(n);
  base = ut_vmlck();
  cr_assert_eq(um_wrap_host(m, p, n, UM_WRAP_PIN, &w1), UM_OK);
  cr_assert_eq(um_wrap_host(m, (char *)p + n / 2, n / 2, UM_WRAP_PIN, &w2), UM_OK);
  cr_assert_eq(ut_vmlck(), base + n);
  cr_assert_eq(um_release(w1), UM_OK);
  cr_assert_eq(ut_vmlck(), base + n / 2, "the second wrap's half stays locked");
  cr_assert_eq(um_release(w2), UM_OK);
  cr_assert_eq(ut_vmlck(), base);
  munmap(p, n);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

Test(lifecycle, callers_own_mlock_survives_a_pinned_wrap) {
  const size_t n = 128u << 10;
  um_manager *m;
  um_buffer *w;
  void *p;
  uint64_t locked;
  if (!ut_mlock_works())
    cr_skip_test("SKIP: mlock is refused here (RLIMIT_MEMLOCK), so page locks cannot be observed");
  m = ut_manager();
  p = page_aligned(2 * n);
  cr_assert_eq(mlock(p, n), 0, "the caller's own lock of the first half");
  locked = ut_vmlck();
  cr_assert_eq(um_wrap_host(m, p, 2 * n, UM_WRAP_PIN, &w), UM_OK);
  cr_assert_eq(ut_vmlck(), locked + n);
  cr_assert_eq(um_release(w), UM_OK);
  cr_assert_eq(ut_vmlck(), locked, "the caller's lock is kept, unimem's is gone");
  munlock(p, n);
  munmap(p, 2 * n);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* ------------------------------------------------------------------------ */
/* 9. on_oom with trim_on_pressure off */

typedef struct oom_ctx {
  um_buffer *victim;
  int calls;
} oom_ctx;

static int release_victim(void *ctx, um_device *d, size_t bytes) {
  oom_ctx *c = ctx;
  (void)d;
  (void)bytes;
  c->calls++;
  if (c->victim == NULL)
    return 0;
  cr_assert_eq(um_release(c->victim), UM_OK);
  c->victim = NULL;
  return 1;
}

Test(lifecycle, on_oom_release_frees_memory_without_trim_on_pressure) {
  const size_t total = 64u << 20, big_bytes = 48u << 20;
  um_options o;
  um_manager *m;
  oom_ctx ctx = {NULL, 0};
  um_buffer *big, *next;
  um_device *d;
  ut_options(&o);
  o.trim_on_pressure = 0;
  o.on_oom = release_victim;
  o.oom_ctx = &ctx;
  fault_configure(1, total);
  fault_reset();
  cr_assert_eq(fault_manager_create(&o, &m), UM_OK, "%s", um_last_error());
  d = um_device_get(m, 1);
  cr_assert(fault_is_device(d));
  /* Three quarters of the device, then as much again: only the callback's
   * release makes room, and its block goes to the pool first. */
  cr_assert_eq(um_alloc(m, d, big_bytes, UM_DEVICE, 0, &big), UM_OK);
  ctx.victim = big;
  cr_assert_eq(um_alloc(m, d, big_bytes, UM_DEVICE, 0, &next), UM_OK, "%s", um_last_error());
  cr_assert_eq(ctx.calls, 1);
  cr_assert_eq(ut_stats(m, d).oom_retries, 1);
  cr_assert_eq(um_release(next), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* ------------------------------------------------------------------------ */
/* 10. fork: the child makes its own manager; the parent's keeps working */

#ifndef UT_TSAN
/* In the child: the parent's manager, buffer and event are refused, never
 * waited on; a new manager works. Returns the number of failed checks. */
static int child_after_fork(um_manager *pm, um_buffer *pb, um_event *pe) {
  int bad = 0;
  um_manager *m2;
  um_buffer *b2, *x = NULL;
  um_event *e2;
  unsigned char in[4096], out[4096];
  bad += um_alloc(pm, um_device_get(pm, 0), 64, UM_HOST, 0, &x) != UM_ESTATE;
  bad += um_event_wait(pe) != UM_ESTATE;
  bad += um_copy_to_host(pb, 0, out, 16, NULL) != UM_ESTATE;
  bad += um_release(pb) != UM_ESTATE;
  bad += um_pool_trim(pm, 0) != UM_ESTATE;
  bad += um_manager_destroy(pm) != UM_ESTATE;
  if (um_manager_create(NULL, &m2) != UM_OK)
    return bad + 100;
  memset(in, 0x6B, sizeof(in));
  bad += um_alloc(m2, um_device_get(m2, 0), sizeof(in), UM_HOST, 0, &b2) != UM_OK;
  bad += um_copy_from_host(b2, 0, in, sizeof(in), &e2) != UM_OK;
  bad += um_event_wait(e2) != UM_OK;
  bad += um_event_release(e2) != UM_OK;
  bad += um_copy_to_host(b2, 0, out, sizeof(out), NULL) != UM_OK;
  bad += memcmp(in, out, sizeof(in)) != 0;
  bad += um_release(b2) != UM_OK;
  bad += um_manager_destroy(m2) != UM_OK;
  return bad;
}
#endif

/* A cpu-only manager, whose copy runs on a worker: no thread of the test's
 * own may be inside malloc at the fork (clang 14's ASan allocator then
 * deadlocks in the child, in any program), and under ASan the copy starts
 * only once every thread of the manager is past its start-up, which
 * allocates (ut_wait_threads_asleep). TSan kills a forked child that
 * starts threads (die_after_fork), so the test skips there. */
Test(lifecycle, fork_child_uses_its_own_manager, .timeout = 60) {
#ifdef UT_TSAN
  cr_skip_test("SKIP: ThreadSanitizer ends a forked child that starts threads (die_after_fork)");
#else
  um_manager *m = ut_manager();
  static unsigned char big[16u << 20], back[16u << 20];
  um_buffer *b;
  um_event *e;
  int status;
  pid_t pid;
  memset(big, 0x2C, sizeof(big));
  cr_assert_eq(um_alloc(m, um_device_get(m, 0), sizeof(big), UM_HOST, 0, &b), UM_OK);
  ut_wait_threads_asleep(); /* under ASan: every thread past its start-up, before the copy */
  cr_assert_eq(um_copy_from_host(b, 0, big, sizeof(big), &e), UM_OK);
  pid = fork();
  cr_assert_neq(pid, -1);
  if (pid == 0)
    _exit(child_after_fork(m, b, e) == 0 ? 0 : 1);
  /* The parent goes on with its manager while the child runs. */
  cr_assert_eq(um_event_wait(e), UM_OK);
  cr_assert_eq(um_event_release(e), UM_OK);
  cr_assert_eq(um_copy_to_host(b, 0, back, sizeof(back), NULL), UM_OK);
  cr_assert_eq(memcmp(big, back, sizeof(big)), 0);
  cr_assert_eq(waitpid(pid, &status, 0), pid);
  cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child's checks failed (status 0x%x)", status);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
#endif
}

/* ------------------------------------------------------------------------ */
/* 11. Smaller items */

/* Debug mode: um_pool_trim gives quarantined blocks back to their device. */
Test(lifecycle, trim_in_debug_mode_frees_quarantined_blocks) {
  um_options o;
  um_manager *m;
  um_buffer *b;
  um_device *d;
  ut_options(&o);
  o.debug = 1;
  fault_configure(1, 64u << 20);
  fault_reset();
  cr_assert_eq(fault_manager_create(&o, &m), UM_OK);
  d = um_device_get(m, 1);
  cr_assert_eq(um_alloc(m, d, 8u << 20, UM_DEVICE, 0, &b), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_gt(fault_device_live_bytes(d), 0, "quarantined, still held");
  cr_assert_eq(um_pool_trim(m, 0), UM_OK);
  cr_assert_eq(fault_device_live_bytes(d), 0, "nothing live, nothing held after a trim");
  cr_assert_eq(um_release(b), UM_ESTATE, "the handle is still quarantined");
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* A pool hit whose zeroing fails is not counted as a hit. */
Test(lifecycle, failed_zeroing_is_not_a_pool_hit) {
  um_options o;
  um_manager *m;
  um_buffer *b, *x;
  um_device *d;
  um_stats before, after;
  ut_options(&o);
  fault_configure(1, 64u << 20);
  fault_reset();
  cr_assert_eq(fault_manager_create(&o, &m), UM_OK);
  d = um_device_get(m, 1);
  /* Two idle blocks of the class: one in this thread's cache slot, one in
   * its bin. The first allocation takes the slot's; the second goes down
   * the slow path to the bin, and its zeroing fails. */
  cr_assert_eq(um_alloc(m, d, 4096, UM_DEVICE, 0, &b), UM_OK);
  cr_assert_eq(um_alloc(m, d, 4096, UM_DEVICE, 0, &x), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_release(x), UM_OK);
  cr_assert_eq(um_alloc(m, d, 4096, UM_DEVICE, 0, &x), UM_OK);
  before = ut_stats(m, d);
  cr_assert_eq(before.bytes_pooled, ut_class(4096), "one block left, in the bin");
  fault_fail_xfer(1, false, UM_EBACKEND, false);
  cr_assert_eq(um_alloc(m, d, 4096, UM_DEVICE, UM_ALLOC_ZERO, &b), UM_EBACKEND);
  fault_disarm();
  after = ut_stats(m, d);
  cr_assert_eq(after.pool_hits, before.pool_hits);
  cr_assert_eq(after.allocations, before.allocations);
  cr_assert_eq(after.active_buffers, 1);
  cr_assert_eq(after.bytes_pooled, ut_class(4096), "the block went back to the pool");
  cr_assert_eq(um_release(x), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}
