/* Misuse of device and manager handles (SPEC section 5): a device of
 * another manager, an index out of range, NULL for a device or a manager in
 * every call, a handle of another kind where a device is expected; then
 * destroying a manager that still has live buffers, unreleased events,
 * mapped buffers, operations in flight, a thread waiting on one of its
 * events; and fork (SPEC 5, amended: the child uses unimem only through a
 * new manager, the parent's manager goes on working in the parent).
 *
 * Not tested, and not testable: anything done with a manager, or with its
 * devices, buffers and events, after um_manager_destroy returned. The
 * manager's memory is gone; no answer can be promised for it, as for any
 * freed object (free(), fclose()).
 *
 * Each test runs in its own process under a timeout. */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fault_backend.h"
#include "misuse_util.h"

static um_manager *m;
static um_device *cpu, *fdev, *fmap;

static um_manager *fault_manager(void) {
  um_options o;
  um_manager *mm = NULL;
  ut_options(&o);
  o.log = mu_log_fn;
  o.log_ctx = &mu_log_state;
  fault_configure(1, 256u << 20);
  cr_assert_eq(fault_manager_create(&o, &mm), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_device_count(mm), 3);
  return mm;
}

static void setup(void) {
  m = fault_manager();
  cpu = um_device_get(m, 0);
  fdev = um_device_get(m, 1);
  fmap = um_device_get(m, 2);
  mu_log_reset();
}

static void teardown(void) {
  fault_counts c;
  mu_gate_open();
  cr_assert_eq(um_manager_destroy(m), UM_OK, "%s", um_last_error());
  fault_counts_get(&c);
  cr_assert_eq(c.live_blocks, 0);
}

TestSuite(devices, .init = setup, .fini = teardown, .timeout = 60);
TestSuite(managers, .init = setup, .fini = teardown, .timeout = 60);

static int count_chunk(void *user, um_buffer *chunk, size_t off, size_t n) {
  (void)chunk, (void)off, (void)n;
  (*(int *)user)++;
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Devices */

Test(devices, of_another_manager) {
  um_manager *m2 = fault_manager();
  um_buffer *a = NULL, *out = MU_SENTINEL;
  um_stats s, keep;
  int calls = 0;
  memset(&s, 0x3e, sizeof(s));
  keep = s;
  cr_assert_eq(um_alloc(m, cpu, 4096, UM_HOST, 0, &a), UM_OK);
  for (int i = 0; i < 3; i++) {
    um_device *d2 = um_device_get(m2, i), *d1 = um_device_get(m, i);
    um_device_info info;
    cr_assert_eq(um_device_info_get(d2, &info), UM_OK);
    for (int loc = 0; loc < UM_LOCATION_COUNT; loc++) {
      if (!(info.locations & (1u << loc)))
        continue;
      MU_FAILS2(m, m2, UM_EINVAL, um_alloc(m, d2, 64, (um_location)loc, 0, &out));
      MU_FAILS2(m, m2, UM_EINVAL, um_alloc(m, d2, 64, (um_location)loc, UM_ALLOC_UNPOOLED, &out));
      MU_FAILS2(m, m2, UM_EINVAL, um_alloc_array(m, d2, 8, 8, (um_location)loc, 0, &out));
      MU_FAILS2(m, m2, UM_EINVAL, um_alloc_at(m, d2, 64, (um_location)loc, 0, &out, __FILE__, __LINE__));
      MU_FAILS2(m, m2, UM_EINVAL,
                um_alloc_array_at(m, d2, 8, 8, (um_location)loc, 0, &out, __FILE__, __LINE__));
    }
    MU_FAILS2(m, m2, UM_EINVAL, um_stats_get(m, d2, &s));
    MU_FAILS2(m, m2, UM_EINVAL, um_stats_get(m2, d1, &s));
    for (int j = 0; j < 3; j++) {
      um_device *other = um_device_get(m, j);
      MU_FAILS2(m, m2, UM_EINVAL, um_peer_enable(other, d2));
      MU_FAILS2(m, m2, UM_EINVAL, um_peer_enable(d2, other));
      MU_FAILS2(m, m2, UM_EINVAL, um_peer_enabled(other, d2));
      MU_FAILS2(m, m2, UM_EINVAL, um_peer_enabled(d2, other));
      MU_FAILS2(m, m2, UM_EINVAL, um_peer_possible(other, d2));
      MU_FAILS2(m, m2, UM_EINVAL, um_peer_possible(d2, other));
    }
    MU_FAILS2(m, m2, UM_EINVAL, um_stream(a, 0, 4096, d2, 1024, count_chunk, NULL, &calls));
  }
  cr_assert_eq(out, MU_SENTINEL);
  cr_assert_eq(calls, 0);
  cr_assert_arr_eq(&s, &keep, sizeof(s), "a refused um_stats_get wrote its output");
  cr_assert_eq(um_release(a), UM_OK);
  cr_assert_eq(um_manager_destroy(m2), UM_OK);
}

Test(devices, index_out_of_range) {
  const int bad[] = {-1, INT_MIN, 3, 4, 1000, INT_MAX};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
    MU_QUIET(m, cr_assert_null(um_device_get(m, bad[i]), "index %d", bad[i]));
  for (int i = 0; i < 3; i++)
    MU_QUIET(m, cr_assert_null(um_device_get(NULL, i)));
  cr_assert_not_null(um_device_get(m, 2));
}

Test(devices, null_device_everywhere) {
  um_buffer *a = NULL, *out = MU_SENTINEL;
  um_device_info info, keep;
  uint64_t f = 7, t = 7;
  um_stats s;
  int calls = 0;
  memset(&info, 0x3e, sizeof(info));
  keep = info;
  cr_assert_eq(um_alloc(m, cpu, 4096, UM_HOST, 0, &a), UM_OK);
  MU_FAILS(m, UM_EINVAL, um_alloc(m, NULL, 64, UM_HOST, 0, &out));
  MU_FAILS(m, UM_EINVAL, um_alloc_array(m, NULL, 8, 8, UM_DEVICE, 0, &out));
  MU_FAILS(m, UM_EINVAL, um_alloc_at(m, NULL, 64, UM_PINNED, 0, &out, __FILE__, __LINE__));
  MU_FAILS(m, UM_EINVAL, um_alloc_array_at(m, NULL, 8, 8, UM_UNIFIED, 0, &out, __FILE__, __LINE__));
  MU_FAILS(m, UM_EINVAL, um_device_info_get(NULL, &info));
  MU_FAILS(m, UM_EINVAL, um_device_memory(NULL, &f, &t));
  MU_FAILS(m, UM_EINVAL, um_device_synchronize(NULL));
  MU_FAILS(m, UM_EINVAL, um_peer_enable(NULL, fdev));
  MU_FAILS(m, UM_EINVAL, um_peer_enable(fdev, NULL));
  MU_FAILS(m, UM_EINVAL, um_peer_enable(NULL, NULL));
  MU_FAILS(m, UM_EINVAL, um_peer_enabled(NULL, fdev));
  MU_FAILS(m, UM_EINVAL, um_peer_enabled(fdev, NULL));
  MU_FAILS(m, UM_EINVAL, um_peer_possible(NULL, fdev));
  MU_FAILS(m, UM_EINVAL, um_peer_possible(fdev, NULL));
  MU_FAILS(m, UM_EINVAL, um_stream(a, 0, 4096, NULL, 1024, count_chunk, NULL, &calls));
  cr_assert_eq(out, MU_SENTINEL);
  cr_assert_arr_eq(&info, &keep, sizeof(info));
  cr_assert_eq(f, 7);
  cr_assert_eq(t, 7);
  cr_assert_eq(calls, 0);
  /* NULL is a valid device for the statistics: all of them. */
  cr_assert_eq(um_stats_get(m, NULL, &s), UM_OK);
  cr_assert_eq(s.active_buffers, 1);
  cr_assert_eq(um_release(a), UM_OK);
}

/* A buffer or an event handed where a device is expected. A device carries
 * no mark that tells it apart today (src/internal.h, struct um_device), so
 * these calls read the other object as a device: SPEC 5 says every public
 * function checks its arguments and answers with a code, never a crash. */
static void expect_not_a_device(void *p) {
  um_device *x = p;
  um_device_info info, keep;
  uint64_t f = 7, t = 7;
  um_buffer *out = MU_SENTINEL;
  um_stats s;
  memset(&info, 0x3e, sizeof(info));
  keep = info;
  MU_FAILS(m, UM_EINVAL, um_device_info_get(x, &info));
  MU_FAILS(m, UM_EINVAL, um_device_memory(x, &f, &t));
  MU_FAILS(m, UM_EINVAL, um_device_synchronize(x));
  MU_FAILS(m, UM_EINVAL, um_alloc(m, x, 64, UM_HOST, 0, &out));
  MU_FAILS(m, UM_EINVAL, um_stats_get(m, x, &s));
  MU_FAILS(m, UM_EINVAL, um_peer_enable(cpu, x));
  MU_FAILS(m, UM_EINVAL, um_peer_enabled(x, cpu));
  MU_FAILS(m, UM_EINVAL, um_peer_possible(x, cpu));
  cr_assert_arr_eq(&info, &keep, sizeof(info));
  cr_assert_eq(f, 7);
  cr_assert_eq(out, MU_SENTINEL);
}

Test(devices, buffer_handle_as_device) {
  um_buffer *b = NULL;
  cr_assert_eq(um_alloc(m, fdev, 4096, UM_DEVICE, 0, &b), UM_OK);
  expect_not_a_device(b);
  cr_assert_eq(um_release(b), UM_OK);
}

Test(devices, event_handle_as_device) {
  um_buffer *b = NULL;
  um_event *e = NULL;
  cr_assert_eq(um_alloc(m, cpu, 4096, UM_HOST, 0, &b), UM_OK);
  cr_assert_eq(um_fill(b, 0, 1, 64, &e), UM_OK);
  expect_not_a_device(e);
  cr_assert_eq(um_event_wait(e), UM_OK);
  cr_assert_eq(um_event_release(e), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
}

/* ------------------------------------------------------------------------ */
/* Managers: NULL in every call */

Test(managers, null_manager_everywhere) {
  um_options o, keep;
  um_buffer *out = MU_SENTINEL;
  um_copy_op op = {.host_dst = &o, .bytes = 8};
  um_stats s;
  um_event *e = MU_SENTINEL;
  char mem[64];
  um_buffer *b = NULL;
  memset(&o, 0x3e, sizeof(o));
  keep = o;
  cr_assert_eq(um_alloc(m, cpu, 64, UM_HOST, 0, &b), UM_OK);
  op.src = b;
  MU_FAILS(m, UM_EINVAL, um_manager_destroy(NULL));
  MU_FAILS(m, UM_EINVAL, um_manager_options(NULL, &o));
  MU_FAILS(m, UM_EINVAL, um_device_count(NULL));
  MU_QUIET(m, cr_assert_null(um_device_get(NULL, 0)));
  MU_FAILS(m, UM_EINVAL, um_alloc(NULL, cpu, 64, UM_HOST, 0, &out));
  MU_FAILS(m, UM_EINVAL, um_alloc_array(NULL, cpu, 8, 8, UM_HOST, 0, &out));
  MU_FAILS(m, UM_EINVAL, um_alloc_at(NULL, cpu, 64, UM_HOST, 0, &out, __FILE__, __LINE__));
  MU_FAILS(m, UM_EINVAL, um_alloc_array_at(NULL, cpu, 8, 8, UM_HOST, 0, &out, __FILE__, __LINE__));
  MU_FAILS(m, UM_EINVAL, um_wrap_host(NULL, mem, sizeof(mem), 0, &out));
  MU_FAILS(m, UM_EINVAL, um_map_file(NULL, "/etc/hostname", UM_MAP_READ, &out));
  MU_FAILS(m, UM_EINVAL, um_copy_batch(NULL, &op, 1, NULL));
  MU_FAILS(m, UM_EINVAL, um_copy_batch(NULL, &op, 1, &e));
  MU_FAILS(m, UM_EINVAL, um_stats_get(NULL, NULL, &s));
  MU_FAILS(m, UM_EINVAL, um_stats_get(NULL, cpu, &s));
  MU_FAILS(m, UM_EINVAL, um_pool_trim(NULL, 0));
  MU_FAILS(m, UM_EINVAL, um_manager_create(&o, NULL));
  cr_assert_eq(out, MU_SENTINEL);
  cr_assert_eq(e, MU_SENTINEL);
  cr_assert_arr_eq(&o, &keep, sizeof(o));
  cr_assert_eq(um_release(b), UM_OK);
}

/* ------------------------------------------------------------------------ */
/* Destroy with things left behind */

/* Live buffers of every kind: UM_ELEAK, one report line per buffer (its
 * size, device, and allocation site when known) and a summary, and every
 * block is freed all the same. */
Test(managers, destroy_with_live_buffers) {
  um_manager *m2 = fault_manager();
  char path[] = "/tmp/unimem-misuse-XXXXXX";
  unsigned char page[4096];
  unsigned char *mem = mu_malloc(5000);
  um_buffer *b[7];
  fault_counts c;
  int fd = mkstemp(path);
  cr_assert_geq(fd, 0, "mkstemp: %s", strerror(errno));
  memset(page, 1, sizeof(page));
  cr_assert_eq(write(fd, page, sizeof(page)), (ssize_t)sizeof(page));
  close(fd);
  cr_assert_eq(um_alloc(m2, um_device_get(m2, 0), 1000, UM_HOST, 0, &b[0]), UM_OK);
  cr_assert_eq(um_alloc(m2, um_device_get(m2, 1), 2000, UM_DEVICE, 0, &b[1]), UM_OK);
  cr_assert_eq(um_alloc(m2, um_device_get(m2, 2), 3000, UM_DEVICE, UM_ALLOC_UNPOOLED, &b[2]), UM_OK);
  cr_assert_eq(um_alloc(m2, um_device_get(m2, 1), 4000, UM_PINNED, 0, &b[3]), UM_OK);
  cr_assert_eq(um_wrap_host(m2, mem, 5000, 0, &b[4]), UM_OK);
  cr_assert_eq(um_alloc_at(m2, um_device_get(m2, 0), 6000, UM_HOST, 0, &b[5], "misuse_site.c", 4242), UM_OK);
  cr_assert_eq(um_map_file(m2, path, UM_MAP_READ, &b[6]), UM_OK);
  mu_log_reset();
  cr_assert_eq(um_manager_destroy(m2), UM_ELEAK);
  cr_assert_not_null(strstr(um_last_error(), "7 buffer(s)"), "%s", um_last_error());
  cr_assert_eq(mu_log_state.count, 8, "one line per leaked buffer and a summary, got %d", mu_log_state.count);
  cr_assert_eq(mu_log_matching("leak: buffer", NULL), 7);
  cr_assert_eq(mu_log_matching("1000 bytes", "device 0"), 1);
  cr_assert_eq(mu_log_matching("2000 bytes", "device 1"), 1);
  cr_assert_eq(mu_log_matching("3000 bytes", "device 2"), 1);
  cr_assert_eq(mu_log_matching("4000 bytes", "pinned"), 1);
  cr_assert_eq(mu_log_matching("5000 bytes", NULL), 1);
  cr_assert_eq(mu_log_matching("6000 bytes", "misuse_site.c:4242"), 1);
  cr_assert_eq(mu_log_matching("4096 bytes", NULL), 1);
  cr_assert_eq(mu_log_matching("7 buffer(s)", NULL), 1);
  fault_counts_get(&c);
  cr_assert_eq(c.live_blocks, 0, "leaked blocks were not freed");
  cr_assert_eq(c.leaked_at_close, 0, "a backend was closed with blocks still allocated");
  free(mem); /* after destroy: the wrap was released */
  unlink(path);
}

/* Events the caller never released: the manager frees them (nobody can
 * release them once it is gone). No buffer leaked, so UM_OK, and the heap
 * is back where it was before the manager was made. */
static void events_left_behind(int nevents, int release_them) {
  um_manager *m2 = ut_manager();
  um_buffer *b = NULL, *big = NULL;
  um_event **ev = mu_malloc((size_t)nevents * sizeof(*ev));
  um_copy_op op;
  cr_assert_eq(um_alloc(m2, um_device_get(m2, 0), 4096, UM_HOST, 0, &b), UM_OK);
  cr_assert_eq(um_alloc(m2, um_device_get(m2, 0), MU_WORKER_BYTES, UM_HOST, 0, &big), UM_OK);
  for (int i = 0; i < nevents; i++) {
    switch (i % 3) {
    case 0: /* done on this thread */
      cr_assert_eq(um_fill(b, 0, i, 64, &ev[i]), UM_OK);
      break;
    case 1: /* a batch */
      op = (um_copy_op){.dst = b, .dst_off = 64, .src = b, .bytes = 64};
      cr_assert_eq(um_copy_batch(m2, &op, 1, &ev[i]), UM_OK);
      break;
    default: /* on a worker */
      cr_assert_eq(um_fill(big, 0, i, MU_WORKER_BYTES, &ev[i]), UM_OK);
      break;
    }
  }
  if (release_them)
    for (int i = 0; i < nevents; i++)
      cr_assert_eq(um_event_release(ev[i]), UM_OK);
  free(ev);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_release(big), UM_OK);
  cr_assert_eq(um_manager_destroy(m2), UM_OK, "%s", um_last_error());
}

Test(managers, destroy_with_unreleased_events) {
  enum { N = 600 };
  size_t before, after;
  events_left_behind(N, 1); /* first use of everything, for a fair baseline */
  before = mu_heap_in_use();
  events_left_behind(N, 1);
  after = mu_heap_in_use();
  cr_assert_lt(after, before + N * sizeof(um_event) / 4,
               "the heap grew by %zu bytes with every event released", after - before);
  before = mu_heap_in_use();
  events_left_behind(N, 0);
  after = mu_heap_in_use();
  cr_assert_lt(after, before + N * sizeof(um_event) / 4,
               "%d unreleased events (%zu bytes each) outlived their manager: the heap grew by %zu bytes", N,
               sizeof(um_event), after - before);
}

/* Mapped and never unmapped nor released, on each kind of mapping (a
 * pointer, a host shadow, the backend's own map). */
Test(managers, destroy_with_mapped_buffers) {
  um_manager *m2 = fault_manager();
  fault_counts c;
  for (int i = 0; i < 3; i++) {
    um_buffer *b = NULL;
    void *p = NULL;
    cr_assert_eq(um_alloc(m2, um_device_get(m2, i), 4096, UM_DEVICE, 0, &b), UM_OK);
    cr_assert_eq(um_map(b, UM_MAP_READ_WRITE, 0, 4096, &p), UM_OK);
    memset(p, i, 4096);
  }
  mu_log_reset();
  cr_assert_eq(um_manager_destroy(m2), UM_ELEAK);
  cr_assert_eq(mu_log_matching("leak: buffer", NULL), 3);
  fault_counts_get(&c);
  cr_assert_eq(c.live_blocks, 0);
  cr_assert_eq(c.leaked_at_close, 0);
}

/* A thread that opens the gate once the main thread is on its way into
 * um_manager_destroy. The pause only makes it likely that destroy starts
 * while the operations are held; no assertion depends on it. */
static void *open_gate_later(void *arg) {
  struct timespec pause = {0, 100 * 1000 * 1000};
  (void)arg;
  nanosleep(&pause, NULL);
  mu_gate_open();
  return NULL;
}

/* Operations in flight, their buffers and events released: destroy waits
 * for all of them (host memory written by a copy is complete when it
 * returns) and frees everything. */
Test(managers, destroy_with_operations_in_flight) {
  um_manager *m2 = fault_manager();
  const size_t n = 4u << 20;
  unsigned char *src = mu_malloc(n), *out = mu_malloc(n), *out2 = mu_malloc(n);
  um_buffer *h = NULL, *d = NULL, *dm = NULL;
  um_event *e[4];
  um_copy_op op;
  pthread_t opener;
  fault_counts c;
  ut_pattern(src, n, 21);
  memset(out, 0, n);
  memset(out2, 0, n);
  cr_assert_eq(um_alloc(m2, um_device_get(m2, 0), n, UM_HOST, 0, &h), UM_OK);
  cr_assert_eq(um_alloc(m2, um_device_get(m2, 1), n, UM_DEVICE, 0, &d), UM_OK);
  cr_assert_eq(um_alloc(m2, um_device_get(m2, 2), n, UM_DEVICE, 0, &dm), UM_OK);
  cr_assert_eq(um_copy_from_host(h, 0, src, n, NULL), UM_OK);
  mu_gate_close(m2);
  cr_assert_eq(um_copy_to_host(h, 0, out, n, &e[0]), UM_OK); /* held on a worker */
  mu_gate_wait_entered(1);
  cr_assert_eq(um_copy(d, 0, h, 0, n, &e[1]), UM_OK);        /* after it, on the device queue */
  cr_assert_eq(um_copy(dm, 0, d, 0, n, &e[2]), UM_OK);       /* staged, on a worker */
  op = (um_copy_op){.host_dst = out2, .src = dm, .bytes = n};
  cr_assert_eq(um_copy_batch(m2, &op, 1, &e[3]), UM_OK);
  for (int i = 0; i < 4; i++) {
    cr_assert_eq(um_event_query(e[i]), UM_EAGAIN, "operation %d finished while held", i);
    cr_assert_eq(um_event_release(e[i]), UM_OK);
  }
  cr_assert_eq(um_release(h), UM_OK);
  cr_assert_eq(um_release(d), UM_OK);
  cr_assert_eq(um_release(dm), UM_OK);
  cr_assert_eq(pthread_create(&opener, NULL, open_gate_later, NULL), 0);
  cr_assert_eq(um_manager_destroy(m2), UM_OK, "%s", um_last_error());
  cr_assert_arr_eq(out, src, n, "destroy returned before a copy to host memory finished");
  cr_assert_arr_eq(out2, src, n, "destroy returned before the batch finished");
  pthread_join(opener, NULL);
  fault_counts_get(&c);
  cr_assert_eq(c.live_blocks, 0, "blocks of the destroyed manager are still allocated");
  free(src);
  free(out);
  free(out2);
}

/* A thread is inside um_event_wait when another destroys the manager.
 * Contract: destroy waits for every pending operation, so the waiter's
 * call returns that operation's status, and touches no freed memory on the
 * way out. Not contract: the waiter using the event (or anything else of
 * the manager) after destroy returned. */
typedef struct waiter {
  um_event *e;
  int status;
} waiter;

static void *wait_main(void *arg) {
  waiter *w = arg;
  w->status = um_event_wait(w->e);
  return NULL;
}

Test(managers, destroy_while_a_thread_waits) {
  um_manager *m2 = ut_manager();
  um_buffer *b = NULL;
  waiter w = {NULL, 1};
  pthread_t waiting, opener;
  cr_assert_eq(um_alloc(m2, um_device_get(m2, 0), MU_WORKER_BYTES, UM_HOST, 0, &b), UM_OK);
  mu_gate_close(m2);
  cr_assert_eq(um_fill(b, 0, 0x17, MU_WORKER_BYTES, &w.e), UM_OK);
  mu_gate_wait_entered(1);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(pthread_create(&waiting, NULL, wait_main, &w), 0);
  cr_assert_eq(pthread_create(&opener, NULL, open_gate_later, NULL), 0);
  cr_assert_eq(um_manager_destroy(m2), UM_OK, "%s", um_last_error());
  pthread_join(waiting, NULL);
  pthread_join(opener, NULL);
  cr_assert_eq(w.status, UM_OK, "the waiter got %s", um_err_name(w.status));
}

/* ------------------------------------------------------------------------ */
/* Fork (SPEC 5, amended) */

/* What a child does: a manager of its own, a round trip through the cpu
 * and a fault device, and destroy. Exit status: 0 when all went well. */
static int child_work(void) {
  um_options o;
  um_manager *mc = NULL;
  um_buffer *a = NULL, *d = NULL;
  unsigned char src[4096], back[4096];
  ut_options(&o);
  o.log = mu_log_fn;
  o.log_ctx = &mu_log_state;
  o.trim_interval_ms = 5; /* a trim thread too */
  if (fault_manager_create(&o, &mc) != UM_OK)
    return 10;
  ut_pattern(src, sizeof(src), 31);
  if (um_alloc(mc, um_device_get(mc, 0), sizeof(src), UM_HOST, 0, &a) != UM_OK ||
      um_alloc(mc, um_device_get(mc, 1), sizeof(src), UM_DEVICE, 0, &d) != UM_OK)
    return 11;
  if (um_copy_from_host(a, 0, src, sizeof(src), NULL) != UM_OK || um_copy(d, 0, a, 0, sizeof(src), NULL) != UM_OK ||
      um_copy_to_host(d, 0, back, sizeof(back), NULL) != UM_OK)
    return 12;
  if (memcmp(src, back, sizeof(src)) != 0)
    return 13;
  if (um_release(a) != UM_OK || um_release(d) != UM_OK)
    return 14;
  if (um_manager_destroy(mc) != UM_OK)
    return 15;
  return 0;
}

/* Threads of the parent that use its manager while it forks: one makes and
 * ends threads of its own (each with a thread cache), so that the fork can
 * come while any of the library's locks is held. Not under ASan: clang's
 * ASan allocator is not fork-safe (a child of a process that was inside
 * malloc on another thread at the fork blocks in the sanitizer's allocator
 * lock, in any program), so there each fork waits until the parent's other
 * threads (its workers, idle or held, and Criterion's) are asleep: a thread
 * just started is inside the sanitizer's allocator (ut_wait_threads_asleep). */
typedef struct churn {
  um_manager *m;
  atomic_int stop;
} churn;

static void *short_lived(void *arg) {
  churn *c = arg;
  for (int i = 0; i < 50; i++) {
    um_buffer *b = NULL;
    if (um_alloc(c->m, um_device_get(c->m, i % 2), 256 + (size_t)i, i % 2 ? UM_DEVICE : UM_HOST, 0, &b) == UM_OK)
      um_release(b);
  }
  return NULL;
}

static void *churn_main(void *arg) {
  churn *c = arg;
  while (!atomic_load(&c->stop)) {
    pthread_t t;
    if (pthread_create(&t, NULL, short_lived, c) == 0)
      pthread_join(t, NULL);
  }
  return NULL;
}

Test(managers, fork_child_uses_a_new_manager) {
  enum { CHILDREN = 32 };
  um_options o;
  um_manager *timed = NULL;
  um_buffer *b = NULL;
  um_event *e = NULL;
  churn c;
  pthread_t churner;
  unsigned char back[4096];
  const bool churning = !UT_ASAN_ON;
  MU_SKIP_FORK_UNDER_TSAN();
  /* A second parent manager with a trim timer, used by the churn. */
  if (churning) {
    ut_options(&o);
    o.trim_interval_ms = 5;
    cr_assert_eq(fault_manager_create(&o, &timed), UM_OK);
  }
  c.m = timed;
  cr_assert_eq(um_alloc(m, cpu, MU_WORKER_BYTES, UM_HOST, 0, &b), UM_OK);
  mu_gate_close(m);
  cr_assert_eq(um_fill(b, 0, 0x2f, MU_WORKER_BYTES, &e), UM_OK); /* in flight across the forks */
  mu_gate_wait_entered(1);
  atomic_init(&c.stop, 0);
  if (churning)
    cr_assert_eq(pthread_create(&churner, NULL, churn_main, &c), 0);
  for (int i = 0; i < CHILDREN; i++) {
    int status = 0;
    pid_t pid;
    ut_wait_threads_asleep();
    pid = fork();
    cr_assert_geq(pid, 0, "fork: %s", strerror(errno));
    if (pid == 0) {
      alarm(20); /* a hang in the child ends it with SIGALRM */
      _exit(child_work());
    }
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status), "child %d %s %d", i, WIFSIGNALED(status) ? "killed by signal" : "stopped",
              WIFSIGNALED(status) ? WTERMSIG(status) : status);
    cr_assert_eq(WEXITSTATUS(status), 0, "child %d failed at step %d", i, WEXITSTATUS(status));
  }
  atomic_store(&c.stop, 1);
  if (churning)
    pthread_join(churner, NULL);
  /* The parent's manager goes on: the held operation, then new ones. */
  cr_assert_eq(um_event_query(e), UM_EAGAIN);
  mu_gate_open();
  cr_assert_eq(um_event_wait(e), UM_OK);
  cr_assert_eq(um_event_release(e), UM_OK);
  cr_assert_eq(um_copy_to_host(b, 0, back, sizeof(back), NULL), UM_OK);
  cr_assert(ut_all_bytes(back, sizeof(back), 0x2f));
  cr_assert_eq(um_release(b), UM_OK);
  if (churning)
    cr_assert_eq(um_manager_destroy(timed), UM_OK);
  cr_assert_eq(child_work(), 0, "a new manager in the parent after the forks");
}
