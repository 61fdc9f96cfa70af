/* The misuse suite on OpenCL devices (PoCL; two devices in one platform
 * with POCL_DEVICES="pthread pthread"): released device buffers and events
 * of operations queued natively, handles reused by the pool, buffers and
 * devices of another manager, destroy with native operations in flight and
 * right after they completed on the driver's callback thread, wraps whose
 * release must wait for a native copy, and fork.
 *
 * Every refused call is checked for its exact code and for leaving the
 * statistics of the manager(s) as they were. Each test runs in its own
 * process under a timeout, and skips, saying why, where there is no
 * OpenCL device. */
#include <errno.h>
#include <sys/wait.h>
#include <unistd.h>

#include "misuse_util.h"
#include "opencl_util.h"

TestSuite(opencl_misuse, .timeout = 120);

static int count_chunk(void *user, um_buffer *chunk, size_t off, size_t n) {
  (void)chunk, (void)off, (void)n;
  (*(int *)user)++;
  return 0;
}

/* Every call on a released buffer of manager mm: UM_ESTATE, getters
 * 0/NULL, nothing written, nothing counted. live is a live buffer of mm. */
static void expect_stale(um_manager *mm, um_buffer *dead, um_buffer *live, um_device *dev) {
  unsigned char host[64], keep[64];
  void *p = MU_SENTINEL;
  um_event *e = MU_SENTINEL;
  um_copy_op ops[2];
  int calls = 0;
  memset(host, 7, sizeof(host));
  memcpy(keep, host, sizeof(host));
  MU_FAILS(mm, UM_ESTATE, um_release(dead));
  MU_FAILS(mm, UM_ESTATE, um_copy_from_host(dead, 0, host, 16, NULL));
  MU_FAILS(mm, UM_ESTATE, um_copy_from_host(dead, 0, host, 16, &e));
  MU_FAILS(mm, UM_ESTATE, um_copy_to_host(dead, 0, host, 16, &e));
  MU_FAILS(mm, UM_ESTATE, um_copy(dead, 0, live, 0, 16, NULL));
  MU_FAILS(mm, UM_ESTATE, um_copy(live, 0, dead, 0, 16, &e));
  MU_FAILS(mm, UM_ESTATE, um_fill(dead, 0, 1, 16, &e));
  for (int mode = UM_MAP_READ; mode <= UM_MAP_WRITE_DISCARD; mode++)
    MU_FAILS(mm, UM_ESTATE, um_map(dead, (um_map_mode)mode, 0, 16, &p));
  MU_FAILS(mm, UM_ESTATE, um_unmap(dead, host));
  ops[0] = (um_copy_op){.dst = live, .host_src = host, .bytes = 16};
  ops[1] = (um_copy_op){.dst = dead, .src = live, .bytes = 16};
  MU_FAILS(mm, UM_ESTATE, um_copy_batch(mm, ops, 2, &e));
  ops[1] = (um_copy_op){.host_dst = host, .src = dead, .bytes = 16};
  MU_FAILS(mm, UM_ESTATE, um_copy_batch(mm, ops, 2, NULL));
  MU_FAILS(mm, UM_ESTATE, um_stream(dead, 0, 16, dev, 8, count_chunk, NULL, &calls));
  MU_QUIET(mm, cr_assert_eq(um_buffer_size(dead), 0));
  MU_QUIET(mm, cr_assert_null(um_buffer_device(dead)));
  MU_QUIET(mm, cr_assert_eq(um_buffer_valid(dead), 0));
  MU_QUIET(mm, cr_assert_null(um_buffer_host_ptr(dead)));
  cr_assert_eq(calls, 0);
  cr_assert_eq(p, MU_SENTINEL);
  cr_assert_eq(e, MU_SENTINEL);
  cr_assert_arr_eq(host, keep, sizeof(host));
}

/* ------------------------------------------------------------------------ */
/* Released buffers and events */

OU_TEST_1_AND_2(opencl_misuse, released_buffers_every_location) {
  ou_env e = ou_open(NULL, 1);
  um_buffer *live = ub_alloc(e.m, um_device_get(e.m, 0), 64, UM_HOST);
  for (int d = 0; d < e.ndev; d++) {
    um_device_info info;
    cr_assert_eq(um_device_info_get(e.dev[d], &info), UM_OK);
    for (int loc = 0; loc < UM_LOCATION_COUNT; loc++) {
      um_buffer *dead;
      if (!(info.locations & (1u << loc)))
        continue;
      dead = ub_alloc(e.m, e.dev[d], 4096, (um_location)loc);
      cr_assert_eq(um_fill(dead, 0, 0x3c, 4096, NULL), UM_OK);
      cr_assert_eq(um_release(dead), UM_OK);
      expect_stale(e.m, dead, live, e.dev[d]);
    }
  }
  cr_assert_eq(um_release(live), UM_OK);
  ou_close(&e);
}

/* Released with a native write still queued: stale at once; the write
 * still lands (read back through a new allocation of the same block). */
OU_TEST_1_AND_2(opencl_misuse, released_with_native_write_queued) {
  const size_t n = 32u << 20;
  ou_env e = ou_open(NULL, 1);
  um_buffer *live = ub_alloc(e.m, um_device_get(e.m, 0), 64, UM_HOST), *dead = ub_alloc(e.m, e.dev[0], n, UM_DEVICE);
  unsigned char *src = ub_malloc(n);
  um_event *ev = NULL;
  ub_pattern(src, n, 5);
  cr_assert_eq(um_copy_from_host(dead, 0, src, n, &ev), UM_OK);
  cr_assert_eq(um_release(dead), UM_OK);
  expect_stale(e.m, dead, live, e.dev[0]);
  cr_assert_eq(um_event_wait(ev), UM_OK);
  cr_assert_eq(um_event_release(ev), UM_OK);
  cr_assert_eq(um_release(live), UM_OK);
  free(src);
  ou_close(&e);
}

/* Events of native operations, released: every call answers UM_ESTATE
 * (SPEC 5, amended), before and after the operation finished. */
OU_TEST_1_AND_2(opencl_misuse, released_native_events) {
  const size_t n = 32u << 20;
  ou_env e = ou_open(NULL, 1);
  um_buffer *b = ub_alloc(e.m, e.dev[0], n, UM_DEVICE);
  unsigned char *src = ub_malloc(n), *back;
  um_event *done = NULL, *queued = NULL;
  ub_pattern(src, n, 6);
  cr_assert_eq(um_fill(b, 0, 0, 4096, &done), UM_OK);
  cr_assert_eq(um_event_wait(done), UM_OK);
  cr_assert_eq(um_event_release(done), UM_OK);
  cr_assert_eq(um_copy_from_host(b, 0, src, n, &queued), UM_OK);
  cr_assert_eq(um_event_release(queued), UM_OK); /* most likely still running */
  for (int i = 0; i < 2; i++) {
    um_event *stale = i ? queued : done;
    MU_FAILS(e.m, UM_ESTATE, um_event_wait(stale));
    MU_FAILS(e.m, UM_ESTATE, um_event_query(stale));
    MU_FAILS(e.m, UM_ESTATE, um_event_cancel(stale));
    MU_FAILS(e.m, UM_ESTATE, um_event_release(stale));
  }
  back = ub_read_all(b);
  ub_assert_bytes(back, src, n, "the write of a released event did not land");
  MU_FAILS(e.m, UM_ESTATE, um_event_wait(queued));
  cr_assert_eq(um_release(b), UM_OK);
  free(src);
  free(back);
  ou_close(&e);
}

/* The pool hands a released device buffer's handle to the next fitting
 * allocation: from then on the old pointer is that buffer (the contract's
 * limit, test_misuse_buffers.c says more); its larger accesses are refused
 * against the new owner's size. */
Test(opencl_misuse, device_handle_reused_smaller) {
  ou_env e;
  um_buffer *a, *b;
  unsigned char host[8192];
  ou_want_devices(1);
  e = ou_open(NULL, 1);
  a = ub_alloc(e.m, e.dev[0], 8192, UM_DEVICE);
  cr_assert_eq(um_release(a), UM_OK);
  cr_assert_eq(um_alloc(e.m, e.dev[0], 8000, UM_DEVICE, UM_ALLOC_ZERO, &b), UM_OK);
  cr_assert_eq(b, a);
  memset(host, 0x77, sizeof(host));
  MU_FAILS(e.m, UM_ERANGE, um_copy_from_host(a, 0, host, 8192, NULL));
  MU_FAILS(e.m, UM_ERANGE, um_fill(a, 0, 0x77, 8192, NULL));
  MU_FAILS(e.m, UM_ERANGE, um_copy_to_host(a, 0, host, 8192, NULL));
  cr_assert_eq(um_copy_to_host(b, 0, host, 8000, NULL), UM_OK);
  cr_assert(ut_all_bytes(host, 8000, 0));
  cr_assert_eq(um_release(b), UM_OK);
  ou_close(&e);
}

/* ------------------------------------------------------------------------ */
/* Two managers over the same OpenCL platform */

OU_TEST_1_AND_2(opencl_misuse, buffers_and_devices_of_another_manager) {
  ou_env a = ou_open(NULL, 1), b = ou_open(NULL, 1);
  um_buffer *ba = ub_alloc(a.m, a.dev[0], 4096, UM_DEVICE), *bb = ub_alloc(b.m, b.dev[b.ndev - 1], 4096, UM_DEVICE);
  um_buffer *out = MU_SENTINEL;
  unsigned char host[4096];
  um_copy_op ops[2];
  um_event *ev = MU_SENTINEL;
  um_stats s;
  int calls = 0;
  memset(host, 0x12, sizeof(host));
  MU_FAILS2(a.m, b.m, UM_EINVAL, um_copy(ba, 0, bb, 0, 4096, NULL));
  MU_FAILS2(a.m, b.m, UM_EINVAL, um_copy(bb, 0, ba, 0, 4096, &ev));
  ops[0] = (um_copy_op){.dst = ba, .host_src = host, .bytes = 4096};
  ops[1] = (um_copy_op){.dst = bb, .src = ba, .bytes = 4096};
  MU_FAILS2(a.m, b.m, UM_EINVAL, um_copy_batch(a.m, ops, 2, &ev));
  MU_FAILS2(a.m, b.m, UM_EINVAL, um_copy_batch(b.m, ops, 2, NULL));
  MU_FAILS2(a.m, b.m, UM_EINVAL, um_stream(ba, 0, 4096, b.dev[0], 1024, count_chunk, NULL, &calls));
  MU_FAILS2(a.m, b.m, UM_EINVAL, um_stream(bb, 0, 4096, a.dev[0], 1024, count_chunk, NULL, &calls));
  for (int i = 0; i < b.ndev; i++) {
    MU_FAILS2(a.m, b.m, UM_EINVAL, um_alloc(a.m, b.dev[i], 64, UM_DEVICE, 0, &out));
    MU_FAILS2(a.m, b.m, UM_EINVAL, um_alloc_array(a.m, b.dev[i], 8, 8, UM_HOST, 0, &out));
    MU_FAILS2(a.m, b.m, UM_EINVAL, um_stats_get(a.m, b.dev[i], &s));
    for (int j = 0; j < a.ndev; j++) {
      MU_FAILS2(a.m, b.m, UM_EINVAL, um_peer_enable(a.dev[j], b.dev[i]));
      MU_FAILS2(a.m, b.m, UM_EINVAL, um_peer_enable(b.dev[i], a.dev[j]));
      MU_FAILS2(a.m, b.m, UM_EINVAL, um_peer_enabled(a.dev[j], b.dev[i]));
      MU_FAILS2(a.m, b.m, UM_EINVAL, um_peer_possible(b.dev[i], a.dev[j]));
    }
  }
  cr_assert_eq(out, MU_SENTINEL);
  cr_assert_eq(ev, MU_SENTINEL);
  cr_assert_eq(calls, 0);
  cr_assert_eq(um_release(ba), UM_OK);
  cr_assert_eq(um_release(bb), UM_OK);
  ou_close(&b);
  ou_close(&a);
}

/* An event of manager A, held in flight, waited on after manager B was
 * destroyed; B's destroy moved none of A's figures. */
OU_TEST_1_AND_2(opencl_misuse, event_outlives_another_manager) {
  const size_t n = 512u * 1024u;
  um_options o;
  ou_env a, b;
  um_buffer *ba, *bb, *hb;
  unsigned char *src = ub_malloc(n), *back;
  um_event *ea = NULL, *eb = NULL;
  ut_snapshot held;
  ou_options(&o);
  o.use_pinned_staging = 2; /* staged on a worker, so the gate can hold it */
  o.staging_chunk_bytes = 16 * 1024;
  a = ou_open(&o, 1);
  b = ou_open(NULL, 1);
  ba = ub_alloc(a.m, a.dev[0], n, UM_DEVICE);
  bb = ub_alloc(b.m, b.dev[0], n, UM_DEVICE);
  hb = ub_alloc(b.m, um_device_get(b.m, 0), n, UM_HOST);
  ub_pattern(src, n, 7);
  ou_gate_install(a.m, 0);
  cr_assert_eq(um_copy_from_host(ba, 0, src, n, &ea), UM_OK);
  ou_gate_wait_entered(1);
  cr_assert_eq(um_copy_from_host(bb, 0, src, n, &eb), UM_OK);
  cr_assert_eq(um_copy(hb, 0, bb, 0, n, NULL), UM_OK);
  cr_assert_eq(um_release(bb), UM_OK);
  cr_assert_eq(um_release(hb), UM_OK);
  cr_assert_eq(um_event_release(eb), UM_OK);
  held = ut_snap(a.m);
  ou_close(&b);
  ut_assert_unchanged(a.m, held);
  cr_assert_eq(um_event_query(ea), UM_EAGAIN);
  ou_gate_open();
  cr_assert_eq(um_event_wait(ea), UM_OK);
  cr_assert_eq(um_event_release(ea), UM_OK);
  back = ub_read_all(ba);
  ub_assert_bytes(back, src, n, "A's copy");
  cr_assert_eq(um_release(ba), UM_OK);
  free(src);
  free(back);
  ou_close(&a);
}

/* ------------------------------------------------------------------------ */
/* Destroy */

/* Native writes, reads into host memory and copies between devices in
 * flight, their buffers and events released: destroy waits for them. */
OU_TEST_1_AND_2(opencl_misuse, destroy_with_native_operations_in_flight) {
  const size_t n = 16u << 20;
  ou_env e = ou_open(NULL, 1);
  um_buffer *x = ub_alloc(e.m, e.dev[0], n, UM_DEVICE), *y = ub_alloc(e.m, e.dev[e.ndev - 1], n, UM_DEVICE);
  unsigned char *src = ub_malloc(n), *out = ub_malloc(n);
  um_event *ev[3];
  ub_pattern(src, n, 8);
  memset(out, 0, n);
  cr_assert_eq(um_copy_from_host(x, 0, src, n, &ev[0]), UM_OK);
  cr_assert_eq(um_copy(y, 0, x, 0, n, &ev[1]), UM_OK);
  cr_assert_eq(um_copy_to_host(y, 0, out, n, &ev[2]), UM_OK);
  for (int i = 0; i < 3; i++)
    cr_assert_eq(um_event_release(ev[i]), UM_OK);
  cr_assert_eq(um_release(x), UM_OK);
  cr_assert_eq(um_release(y), UM_OK);
  ou_close(&e);
  ub_assert_bytes(out, src, n, "destroy returned before the last read finished");
  free(src);
  free(out);
}

/* Leaked, mapped, with operations in flight: UM_ELEAK, every block freed
 * through the driver, no crash. */
OU_TEST_1_AND_2(opencl_misuse, destroy_with_leaked_and_mapped_buffers) {
  const size_t n = 8u << 20;
  ou_env e = ou_open(NULL, 1);
  unsigned char *src = ub_malloc(n);
  um_buffer *w = ub_alloc(e.m, e.dev[0], n, UM_DEVICE), *mp = ub_alloc(e.m, e.dev[e.ndev - 1], 4096, UM_DEVICE);
  um_event *ev = NULL;
  void *p = NULL;
  ub_pattern(src, n, 9);
  cr_assert_eq(um_map(mp, UM_MAP_READ_WRITE, 0, 4096, &p), UM_OK);
  memset(p, 1, 4096);
  cr_assert_eq(um_copy_from_host(w, 0, src, n, &ev), UM_OK);
  cr_assert_eq(um_event_release(ev), UM_OK);
  cr_assert_eq(um_manager_destroy(e.m), UM_ELEAK);
  free(src);
}

/* Destroy right after an operation completed on the driver's callback
 * thread: that thread may still be finishing the operation's bookkeeping
 * (the engine's in-flight count) when the waiter wakes, releases and
 * destroys. Repeated, since the window is short; under ASan a touch of the
 * freed manager aborts. 200 rounds take about 0.2 s on PoCL, whose threads
 * the race is with; ou_open opens PoCL's platform alone (beside NVIDIA's,
 * each round also created and released NVIDIA's context: about 0.75 s,
 * past CTest's timeout in all). */
Test(opencl_misuse, destroy_right_after_a_native_completion) {
  unsigned char src[4096];
  ou_want_devices(1);
  ub_pattern(src, sizeof(src), 10);
  for (int i = 0; i < 200; i++) {
    ou_env e = ou_open(NULL, 1);
    um_buffer *b = ub_alloc(e.m, e.dev[0], sizeof(src), UM_DEVICE);
    um_event *ev = NULL;
    cr_assert_eq(um_copy_from_host(b, 0, src, sizeof(src), &ev), UM_OK);
    cr_assert_eq(um_event_wait(ev), UM_OK);
    cr_assert_eq(um_event_release(ev), UM_OK);
    cr_assert_eq(um_release(b), UM_OK);
    cr_assert_eq(um_manager_destroy(e.m), UM_OK, "round %d: %s", i, um_last_error());
  }
}

/* ------------------------------------------------------------------------ */
/* Wraps: the release waits for native copies on the caller's memory */

static void wrap_release_waits(int into_wrap) {
  const size_t n = 64u << 20;
  ou_env e = ou_open(NULL, 1);
  unsigned char *mem = ub_malloc(n), *pattern = ub_malloc(n), *back;
  um_buffer *d = ub_alloc(e.m, e.dev[0], n, UM_DEVICE), *w = NULL;
  um_event *ev = NULL;
  int st, q;
  bool idle, complete = true;
  ub_pattern(pattern, n, 11);
  if (into_wrap) {
    memset(mem, 0, n);
    cr_assert_eq(um_copy_from_host(d, 0, pattern, n, NULL), UM_OK);
  } else {
    memcpy(mem, pattern, n);
  }
  cr_assert_eq(um_wrap_host(e.m, mem, n, 0, &w), UM_OK);
  if (into_wrap)
    cr_assert_eq(um_copy(w, 0, d, 0, n, &ev), UM_OK);
  else
    cr_assert_eq(um_copy(d, 0, w, 0, n, &ev), UM_OK);
  st = um_release(w);
  q = um_event_query(ev);
  pthread_mutex_lock(&w->lock);
  idle = w->pending == 0;
  pthread_mutex_unlock(&w->lock);
  if (into_wrap)
    complete = memcmp(mem, pattern, n) == 0;
  cr_assert_eq(st, UM_OK);
  cr_assert(idle && q == UM_OK, "um_release of a wrap returned while a native copy %s it was %s",
            into_wrap ? "into" : "out of", um_err_name(q));
  cr_assert(complete, "um_release of a wrap returned before the copy into it was complete");
  memset(mem, 0xee, n);
  free(mem); /* the owner takes it back */
  cr_assert_eq(um_event_wait(ev), UM_OK);
  cr_assert_eq(um_event_release(ev), UM_OK);
  if (!into_wrap) {
    back = ub_read_all(d);
    ub_assert_bytes(back, pattern, n, "the copy read memory the owner had taken back");
    free(back);
  }
  cr_assert_eq(um_release(d), UM_OK);
  free(pattern);
  ou_close(&e);
}

OU_TEST_1_AND_2(opencl_misuse, wrap_release_waits_native_read_into_it) { wrap_release_waits(1); }
OU_TEST_1_AND_2(opencl_misuse, wrap_release_waits_native_write_from_it) { wrap_release_waits(0); }

/* ------------------------------------------------------------------------ */
/* Fork (SPEC 5, amended): a child that made OpenCL work in the parent uses
 * unimem through a new manager, on whatever devices it reports, with no
 * hang and no crash; the parent's manager goes on. */

static int child_round_trips(void) {
  um_options o;
  um_manager *mc = NULL;
  unsigned char src[4096], back[4096];
  ou_options(&o);
  if (um_manager_create(&o, &mc) != UM_OK)
    return 10;
  ub_pattern(src, sizeof(src), 12);
  for (int i = 0; i < um_device_count(mc); i++) {
    um_buffer *b = NULL;
    um_device_info info;
    if (um_device_info_get(um_device_get(mc, i), &info) != UM_OK)
      return 11;
    if (um_alloc(mc, um_device_get(mc, i), sizeof(src), i == 0 ? UM_HOST : UM_DEVICE, 0, &b) != UM_OK)
      return 12;
    memset(back, 0, sizeof(back));
    if (um_copy_from_host(b, 0, src, sizeof(src), NULL) != UM_OK ||
        um_copy_to_host(b, 0, back, sizeof(back), NULL) != UM_OK || memcmp(src, back, sizeof(src)) != 0)
      return 13;
    if (um_release(b) != UM_OK)
      return 14;
  }
  return um_manager_destroy(mc) == UM_OK ? 0 : 15;
}

OU_TEST_1_AND_2(opencl_misuse, fork_child_uses_a_new_manager) {
  ou_env e;
  MU_SKIP_FORK_UNDER_TSAN();
  e = ou_open(NULL, 1);
  const size_t n = 8u << 20;
  um_buffer *b = ub_alloc(e.m, e.dev[0], n, UM_DEVICE);
  unsigned char *src = ub_malloc(n), *back;
  um_event *ev = NULL;
  int status = 0;
  pid_t pid;
  ub_pattern(src, n, 13);
  ut_wait_threads_asleep(); /* under ASan: every thread past its start-up, before the copy */
  cr_assert_eq(um_copy_from_host(b, 0, src, n, &ev), UM_OK); /* in flight across the fork */
  pid = fork();
  cr_assert_geq(pid, 0, "fork: %s", strerror(errno));
  if (pid == 0) {
    alarm(30); /* a hang in the child ends it with SIGALRM */
    _exit(child_round_trips());
  }
  cr_assert_eq(waitpid(pid, &status, 0), pid);
  cr_assert(WIFEXITED(status), "the child %s %d", WIFSIGNALED(status) ? "was killed by signal" : "stopped with",
            WIFSIGNALED(status) ? WTERMSIG(status) : status);
  cr_assert_eq(WEXITSTATUS(status), 0, "the child failed at step %d", WEXITSTATUS(status));
  cr_assert_eq(um_event_wait(ev), UM_OK);
  cr_assert_eq(um_event_release(ev), UM_OK);
  back = ub_read_all(b);
  ub_assert_bytes(back, src, n, "the parent's copy");
  cr_assert_eq(um_release(b), UM_OK);
  free(src);
  free(back);
  ou_close(&e);
}
