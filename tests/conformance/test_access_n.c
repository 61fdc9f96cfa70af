/* Brackets over several buffers (um_access_begin_n / um_access_end_n) and
 * the release ordered after an event (um_release_after), on every
 * profile's device (profile.h): a buffer listed more than once gets one
 * bracket in the strongest mode and is ended once; refusals are all or
 * nothing, with the first failing entry's code, and leave every buffer as
 * it was (each can be bracketed again); a buffer released inside an open
 * list is skipped by the end, which ends the others; the one wait handle
 * of a list; end twice; releases racing the calls from another thread.
 * On the cpu profile alone: the handle is a um_event that completes after
 * every pending copy, and release_after refuses any event. With native
 * events and the caller's kernels: backends/test_opencl_kernels.c and
 * cuda_kernel_checks.h. */
#include <pthread.h>

#include "bytes.h"
#include "profile.h"

static um_manager *m;
static um_device *dev;

static void setup(void) {
  ut_env env = ut_profile_open(NULL);
  m = env.m;
  dev = env.dev;
}

/* A skipped suite made no manager. */
static void teardown(void) {
  if (m != NULL)
    cr_assert_eq(um_manager_destroy(m), UM_OK);
  m = NULL;
}

TestSuite(access_n, .init = setup, .fini = teardown);

/* Memory that is no buffer of unimem's. */
static char not_a_buffer[512];

static const um_map_mode R = UM_MAP_READ, W = UM_MAP_WRITE, RW = UM_MAP_READ_WRITE, WD = UM_MAP_WRITE_DISCARD;

/* b has no bracket open and may get one: a bracket opens and ends. */
static void assert_free(um_buffer *b, const char *what) {
  void *wait = NULL;
  cr_assert_eq(um_access_begin(b, UM_MAP_READ_WRITE, &wait), UM_OK, "%s: %s", what, um_last_error());
  cr_assert_eq(um_access_end(b, NULL), UM_OK, "%s: %s", what, um_last_error());
}

/* b is inside a bracket: a second one is refused. */
static void assert_open(um_buffer *b, const char *what) {
  void *wait = NULL;
  cr_assert_eq(um_access_begin(b, UM_MAP_READ, &wait), UM_ESTATE, "%s", what);
}

Test(access_n, three_buffers_one_call) {
  um_buffer *a = ub_alloc(m, dev, 4096, UM_DEVICE), *b = ub_alloc(m, dev, 4096, UM_DEVICE);
  um_buffer *c = ub_alloc(m, dev, 4096, UM_DEVICE);
  um_buffer *list[3] = {a, b, c};
  um_map_mode modes[3] = {R, R, WD};
  void *wait = (void *)1;
  cr_assert_eq(um_access_begin_n(list, modes, 3, &wait), UM_OK, "%s", um_last_error());
  cr_assert_null(wait, "nothing issued on them is pending");
  assert_open(a, "a"), assert_open(b, "b"), assert_open(c, "c");
  cr_assert_eq(um_access_end_n(list, 3, NULL), UM_OK, "%s", um_last_error());
  if (um_buffer_host_ptr(c) == NULL)
    cr_assert_eq(um_buffer_valid(c), UM_VALID_DEVICE, "a writing mode: the device copy is current");
  cr_assert_eq(um_access_end_n(list, 3, NULL), UM_ESTATE, "ended twice");
  cr_assert_eq(um_access_end(a, NULL), UM_ESTATE);
  assert_free(a, "a"), assert_free(b, "b"), assert_free(c, "c");
  um_release(a), um_release(b), um_release(c);
}

/* The same buffer listed twice or three times: one bracket, in the
 * strongest mode, ended once by a list that names it as often or once. */
Test(access_n, the_same_buffer_more_than_once) {
  um_buffer *x = ub_alloc(m, dev, 4096, UM_DEVICE), *y = ub_alloc(m, dev, 4096, UM_DEVICE);
  um_buffer *three[3] = {x, x, x}, *mixed[4] = {x, y, x, y}, *once[2] = {y, x};
  um_map_mode m3[3] = {R, WD, R}, m4[4] = {WD, W, R, R};
  unsigned char ro_mem[64] = {0};
  um_buffer *ro;
  void *wait = NULL;
  cr_assert_eq(um_access_begin_n(three, m3, 3, &wait), UM_OK, "%s", um_last_error());
  assert_open(x, "x");
  cr_assert_eq(um_access_end_n(three, 3, NULL), UM_OK, "ended once, for the three entries");
  if (um_buffer_host_ptr(x) == NULL)
    cr_assert_eq(um_buffer_valid(x), UM_VALID_DEVICE, "READ with WRITE_DISCARD writes");
  assert_free(x, "x");
  cr_assert_eq(um_access_begin_n(mixed, m4, 4, &wait), UM_OK, "%s", um_last_error());
  assert_open(x, "x"), assert_open(y, "y");
  cr_assert_eq(um_access_end_n(once, 2, NULL), UM_OK, "a list naming each once ends them");
  cr_assert_eq(um_access_end_n(mixed, 4, NULL), UM_ESTATE, "ended already");
  assert_free(x, "x"), assert_free(y, "y");
  /* A read-only wrap: READ twice stays READ; READ with WRITE is a writing mode. */
  cr_assert_eq(um_wrap_host(m, ro_mem, sizeof(ro_mem), UM_WRAP_READONLY, &ro), UM_OK);
  um_buffer *ro2[2] = {ro, ro};
  um_map_mode rr[2] = {R, R}, rwr[2] = {R, W};
  cr_assert_eq(um_access_begin_n(ro2, rr, 2, &wait), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_access_end_n(ro2, 2, NULL), UM_OK);
  cr_assert_eq(um_access_begin_n(ro2, rwr, 2, &wait), UM_ESTATE, "the second entry writes");
  assert_free(x, "x");
  cr_assert_eq(um_release(ro), UM_OK);
  um_release(x), um_release(y);
}

/* Refusals: the first failing entry's code, nothing opened, statistics
 * unchanged, every buffer free to be bracketed afterwards. */
Test(access_n, refusals_are_all_or_nothing) {
  um_buffer *x = ub_alloc(m, dev, 4096, UM_DEVICE), *y = ub_alloc(m, dev, 4096, UM_DEVICE);
  um_buffer *busy = ub_alloc(m, dev, 4096, UM_DEVICE), *mapped = ub_alloc(m, dev, 4096, UM_DEVICE);
  um_buffer *gone = ub_alloc(m, dev, 64, UM_DEVICE);
  um_map_mode modes[3] = {RW, R, WD}, bad[3] = {R, (um_map_mode)9, R};
  void *wait = (void *)1, *view = NULL, *busy_wait = NULL;
  ut_snapshot before;
  cr_assert_eq(um_release(gone), UM_OK);
  cr_assert_eq(um_access_begin(busy, UM_MAP_READ, &busy_wait), UM_OK);
  cr_assert_eq(um_map(mapped, UM_MAP_READ, 0, 64, &view), UM_OK);
  before = ut_snap(m);
  struct {
    um_buffer *list[3];
    const um_map_mode *modes;
    int code;
    const char *what;
  } cases[] = {
      {{x, NULL, y}, modes, UM_EINVAL, "a NULL entry"},
      {{x, gone, y}, modes, UM_ESTATE, "a released entry in the middle"},
      {{x, y, busy}, modes, UM_ESTATE, "an entry already in a bracket"},
      {{x, y, mapped}, modes, UM_ESTATE, "a mapped entry"},
      {{x, y, x}, bad, UM_EINVAL, "an unknown mode"},
      {{mapped, NULL, x}, modes, UM_ESTATE, "the first failure is the mapped entry 0"},
      {{NULL, mapped, x}, modes, UM_EINVAL, "the first failure is the NULL entry 0"},
      {{y, x, (um_buffer *)(void *)not_a_buffer}, modes, UM_EINVAL, "not a buffer"},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    cr_assert_eq(um_access_begin_n(cases[i].list, cases[i].modes, 3, &wait), cases[i].code, "%s: %s",
                 cases[i].what, um_last_error());
    cr_assert_eq(wait, (void *)1, "%s: no handle given", cases[i].what);
    assert_free(x, cases[i].what), assert_free(y, cases[i].what);
  }
  um_buffer *ok[2] = {x, y};
  cr_assert_eq(um_access_begin_n(NULL, modes, 2, &wait), UM_EINVAL);
  cr_assert_eq(um_access_begin_n(ok, NULL, 2, &wait), UM_EINVAL);
  cr_assert_eq(um_access_begin_n(ok, modes, 2, NULL), UM_EINVAL);
  cr_assert_eq(um_access_begin_n(ok, modes, 0, &wait), UM_EINVAL);
  cr_assert_eq(um_access_end_n(NULL, 2, NULL), UM_EINVAL);
  cr_assert_eq(um_access_end_n(ok, 0, NULL), UM_EINVAL);
  ut_assert_unchanged(m, before);
  assert_open(busy, "busy: its own bracket is still open");
  cr_assert_eq(um_access_end(busy, NULL), UM_OK);
  cr_assert_eq(um_unmap(mapped, view), UM_OK, "still mapped");
  assert_free(mapped, "mapped");
  um_release(x), um_release(y), um_release(busy), um_release(mapped);
}

/* Buffers of two devices in one list: UM_EINVAL, nothing opened. */
Test(access_n, buffers_of_two_devices) {
  um_device *cpu = um_device_get(m, 0);
  if (cpu == dev)
    cr_skip_test("the profile's device is the cpu device: no second device here");
  um_buffer *x = ub_alloc(m, dev, 4096, UM_DEVICE), *h = ub_alloc(m, cpu, 4096, UM_HOST);
  um_buffer *list[2] = {x, h};
  um_map_mode modes[2] = {R, R};
  void *wait = NULL;
  cr_assert_eq(um_access_begin_n(list, modes, 2, &wait), UM_EINVAL);
  assert_free(x, "x"), assert_free(h, "h");
  um_release(x), um_release(h);
}

/* End: a live entry without a bracket is refused with nothing ended, a
 * done event on a device without native events too. */
Test(access_n, end_checks_everything_first) {
  um_buffer *x = ub_alloc(m, dev, 4096, UM_DEVICE), *y = ub_alloc(m, dev, 4096, UM_DEVICE);
  um_buffer *never = ub_alloc(m, dev, 4096, UM_DEVICE);
  um_buffer *both[2] = {x, y}, *with_never[3] = {x, never, y}, *with_bad[3] = {x, y, NULL};
  um_map_mode modes[2] = {RW, R};
  void *wait = NULL;
  cr_assert_eq(um_access_begin_n(both, modes, 2, &wait), UM_OK);
  cr_assert_eq(um_access_end_n(with_never, 3, NULL), UM_ESTATE, "never bracketed");
  cr_assert_eq(um_access_end_n(with_bad, 3, NULL), UM_EINVAL, "a NULL entry");
  assert_open(x, "x"), assert_open(y, "y");
  if (ut_profile_is("cpu") || ut_profile_is("fault"))
    cr_assert_eq(um_access_end_n(both, 2, (void *)0x1234), UM_EINVAL, "no native events here");
  assert_open(x, "x"), assert_open(y, "y");
  cr_assert_eq(um_access_end_n(both, 2, NULL), UM_OK);
  assert_free(never, "never");
  um_release(x), um_release(y), um_release(never);
}

/* A buffer released inside an open list: the release ended its bracket;
 * the end skips it, ends the others and answers UM_OK; a list of only
 * released buffers answers UM_ESTATE. The released block went back. */
Test(access_n, release_inside) {
  um_buffer *x = ub_alloc(m, dev, 1000, UM_DEVICE), *y = ub_alloc(m, dev, 3000, UM_DEVICE);
  um_buffer *z = ub_alloc(m, dev, 1000, UM_DEVICE), *again;
  um_buffer *list[3] = {x, y, z}, *only_y[2] = {y, y};
  um_map_mode modes[3] = {R, WD, RW};
  void *wait = NULL;
  cr_assert_eq(um_access_begin_n(list, modes, 3, &wait), UM_OK);
  cr_assert_eq(um_release(y), UM_OK);
  cr_assert_eq(um_access_end_n(list, 3, NULL), UM_OK, "%s", um_last_error());
  assert_free(x, "x"), assert_free(z, "z");
  cr_assert_eq(um_access_end_n(list, 3, NULL), UM_ESTATE, "x and z ended already");
  cr_assert_eq(um_access_end_n(only_y, 2, NULL), UM_ESTATE, "every buffer of the list released");
  cr_assert_eq(um_device_synchronize(dev), UM_OK);
  cr_assert_eq(um_alloc(m, dev, 3000, UM_DEVICE, 0, &again), UM_OK);
  cr_assert_eq(again, y, "y's block went back to the pool");
  um_release(again), um_release(x), um_release(z);
}

/* Copies pending on three buffers, held behind a bracket on their source:
 * one handle for the three (on the cpu device a um_event, which completes
 * only once the held copies ran), then the caller's "kernel" (host writes
 * on the cpu device), then a fill issued inside the brackets runs after
 * their end. Every byte checked. */
Test(access_n, one_wait_for_three_pending_copies) {
  const size_t n = 1u << 20;
  unsigned char *src[3];
  um_buffer *b[3], *s = ub_alloc(m, dev, 64, UM_DEVICE);
  um_event *in[3], *held[3], *later;
  um_map_mode modes[3] = {R, RW, WD};
  void *wait = NULL, *swait = NULL;
  int cpu = ut_profile_is("cpu");
  cr_assert_eq(um_fill(s, 0, 0x55, 64, NULL), UM_OK);
  cr_assert_eq(um_access_begin(s, UM_MAP_READ, &swait), UM_OK);
  for (int i = 0; i < 3; i++) {
    b[i] = ub_alloc(m, dev, n, UM_DEVICE);
    src[i] = ub_malloc(n); /* read by the copy as it runs */
    memset(src[i], 0x40 + i, n);
    cr_assert_eq(um_copy_from_host(b[i], 0, src[i], n, &in[i]), UM_OK);
    cr_assert_eq(um_copy(b[i], 0, s, 0, 16, &held[i]), UM_OK, "held behind s's bracket");
  }
  cr_assert_eq(um_access_begin_n(b, modes, 3, &wait), UM_OK, "%s", um_last_error());
  cr_assert_not_null(wait, "the held copies are pending");
  if (cpu)
    cr_assert_eq(um_event_query(wait), UM_EAGAIN, "the handle waits for the held copies");
  cr_assert_eq(um_access_end(s, NULL), UM_OK);
  if (cpu) {
    cr_assert_eq(um_event_wait(wait), UM_OK);
    for (int i = 0; i < 3; i++) {
      cr_assert_eq(um_event_query(held[i]), UM_OK, "the handle completed after held copy %d", i);
      cr_assert(ut_all_bytes(um_buffer_host_ptr(b[i]), 16, 0x55));
      cr_assert(ut_all_bytes((char *)um_buffer_host_ptr(b[i]) + 16, n - 16, (unsigned char)(0x40 + i)));
    }
    memset(um_buffer_host_ptr(b[2]), 0x77, n);
  }
  cr_assert_eq(um_fill(b[0], 0, 0x11, 8, &later), UM_OK);
  cr_assert_eq(um_event_query(later), UM_EAGAIN, "issued inside the bracket: it waits for the end");
  cr_assert_eq(um_access_end_n(b, 3, NULL), UM_OK);
  cr_assert_eq(um_event_wait(later), UM_OK);
  for (int i = 0; i < 3; i++) {
    unsigned char *back = ub_read_all(b[i]);
    if (cpu && i == 2) {
      cr_assert(ut_all_bytes(back, n, 0x77), "the caller's writes");
    } else {
      cr_assert(ut_all_bytes(back, 8, i == 0 ? 0x11 : 0x55), "buffer %d: the fill ran after the end", i);
      cr_assert(ut_all_bytes(back + 8, 8, 0x55), "buffer %d", i);
      cr_assert(ut_all_bytes(back + 16, n - 16, (unsigned char)(0x40 + i)), "buffer %d", i);
    }
    free(back);
    cr_assert_eq(um_event_wait(in[i]), UM_OK);
    cr_assert_eq(um_event_wait(held[i]), UM_OK);
    um_event_release(in[i]);
    um_event_release(held[i]);
    um_release(b[i]);
    free(src[i]);
  }
  um_event_release(later);
  um_release(s);
}

/* um_release_after with no event is um_release; bad input answers exact
 * codes with the buffer still live. On a device without native events any
 * event is refused. */
Test(access_n, release_after_codes) {
  um_buffer *x = ub_alloc(m, dev, 4096, UM_DEVICE), *gone = ub_alloc(m, dev, 64, UM_DEVICE), *again;
  uint64_t active;
  void *view = NULL;
  cr_assert_eq(um_release(gone), UM_OK);
  active = ut_stats(m, NULL).active_buffers;
  cr_assert_eq(um_release_after(NULL, NULL), UM_EINVAL);
  cr_assert_eq(um_release_after(gone, NULL), UM_ESTATE);
  cr_assert_eq(um_release_after(gone, (void *)0x1234), UM_ESTATE);
  cr_assert_eq(um_release_after((um_buffer *)(void *)not_a_buffer, (void *)0x1234), UM_EINVAL);
  if (ut_profile_is("cpu") || ut_profile_is("fault")) {
    cr_assert_eq(um_release_after(x, (void *)0x1234), UM_EINVAL, "no native events here");
    cr_assert_eq(um_buffer_size(x), 4096, "still live");
  }
  cr_assert_eq(um_map(x, UM_MAP_READ, 0, 64, &view), UM_OK);
  cr_assert_eq(um_unmap(x, view), UM_OK);
  cr_assert_eq(um_release_after(x, NULL), UM_OK, "um_release");
  cr_assert_eq(ut_stats(m, NULL).active_buffers, active - 1);
  cr_assert_eq(um_release_after(x, NULL), UM_ESTATE, "released twice");
  cr_assert_eq(um_alloc(m, dev, 4096, UM_DEVICE, 0, &again), UM_OK);
  cr_assert_eq(again, x, "the block went back at once");
  um_release(again);
}

/* ------------------------------------------------------------------------ */
/* Releases from another thread racing the calls */

typedef struct racer {
  um_buffer *b;
  pthread_barrier_t *go;
  int status;
} racer;

static void *release_racer(void *p) {
  racer *r = p;
  pthread_barrier_wait(r->go);
  r->status = um_release(r->b);
  return NULL;
}

/* One round: y released by another thread while this one calls begin_n
 * (begin) or end_n on {x, y, z}. Whatever the order, the outcome is one of
 * the documented ones and x and z are left free. */
static void race_round(int during_begin) {
  um_buffer *x = ub_alloc(m, dev, 256, UM_DEVICE), *y = ub_alloc(m, dev, 256, UM_DEVICE);
  um_buffer *z = ub_alloc(m, dev, 256, UM_DEVICE);
  um_buffer *list[3] = {x, y, z};
  um_map_mode modes[3] = {R, RW, WD};
  pthread_barrier_t go;
  pthread_t t;
  racer r = {y, &go, -1};
  void *wait = NULL;
  int st;
  pthread_barrier_init(&go, NULL, 2);
  if (!during_begin)
    cr_assert_eq(um_access_begin_n(list, modes, 3, &wait), UM_OK);
  cr_assert_eq(pthread_create(&t, NULL, release_racer, &r), 0);
  pthread_barrier_wait(&go);
  st = during_begin ? um_access_begin_n(list, modes, 3, &wait) : um_access_end_n(list, 3, NULL);
  pthread_join(t, NULL);
  cr_assert_eq(r.status, UM_OK, "the release");
  if (during_begin) {
    cr_assert(st == UM_OK || st == UM_ESTATE, "begin_n: %d", st);
    if (st == UM_OK) /* opened before the release, which ended y's */
      cr_assert_eq(um_access_end_n(list, 3, NULL), UM_OK, "%s", um_last_error());
  } else {
    cr_assert_eq(st, UM_OK, "end_n: %s", um_last_error());
  }
  assert_free(x, "x"), assert_free(z, "z");
  pthread_barrier_destroy(&go);
  um_release(x), um_release(z);
}

/* A release racing the list's end: the released buffer is skipped (its
 * release ended its bracket), the others end. Under TSan this once raced
 * the clean of a released descriptor going back to the thread cache, which
 * is now done under the buffer's lock, and end_n answered UM_ESTATE. */
Test(access_n, releases_racing_from_another_thread) {
  for (int i = 0; i < 200; i++) {
    race_round(1);
    race_round(0);
  }
  cr_assert_eq(um_device_synchronize(dev), UM_OK);
  cr_assert_eq(ut_stats(m, NULL).active_buffers, 0);
}

/* ------------------------------------------------------------------------ */
/* More than a handful */

/* Twenty distinct buffers listed twice each (forty entries), each with a
 * copy held behind a bracket on their source: one handle for all (a chain
 * of joins on devices with native events), which on the cpu device
 * completes only once every held copy ran; every buffer ends once. */
Test(access_n, forty_entries_over_twenty_buffers) {
  enum { K = 20 };
  um_buffer *s = ub_alloc(m, dev, 64, UM_DEVICE), *b[K], *list[2 * K];
  um_map_mode modes[2 * K];
  um_event *held[K];
  void *wait = NULL, *swait = NULL;
  cr_assert_eq(um_fill(s, 0, 0x5A, 64, NULL), UM_OK);
  cr_assert_eq(um_access_begin(s, UM_MAP_READ, &swait), UM_OK);
  for (int i = 0; i < K; i++) {
    b[i] = ub_alloc(m, dev, 64, UM_DEVICE);
    cr_assert_eq(um_copy(b[i], 0, s, 0, 64, &held[i]), UM_OK);
    list[i] = list[2 * K - 1 - i] = b[i];
    modes[i] = UM_MAP_READ, modes[2 * K - 1 - i] = i % 2 ? UM_MAP_WRITE : UM_MAP_READ;
  }
  cr_assert_eq(um_access_begin_n(list, modes, 2 * K, &wait), UM_OK, "%s", um_last_error());
  cr_assert_not_null(wait);
  if (ut_profile_is("cpu"))
    cr_assert_eq(um_event_query(wait), UM_EAGAIN);
  cr_assert_eq(um_access_end(s, NULL), UM_OK);
  if (ut_profile_is("cpu")) {
    cr_assert_eq(um_event_wait(wait), UM_OK);
    for (int i = 0; i < K; i++)
      cr_assert_eq(um_event_query(held[i]), UM_OK, "copy %d ran before the handle completed", i);
  }
  for (int i = 0; i < K; i++)
    assert_open(b[i], "in the list");
  cr_assert_eq(um_access_end_n(list, 2 * K, NULL), UM_OK);
  for (int i = 0; i < K; i++) {
    unsigned char *back = ub_read_all(b[i]);
    cr_assert(ut_all_bytes(back, 64, 0x5A), "buffer %d", i);
    free(back);
    assert_free(b[i], "ended");
    cr_assert_eq(um_event_wait(held[i]), UM_OK);
    um_event_release(held[i]);
    um_release(b[i]);
  }
  um_release(s);
}

/* Two threads bracket the same two buffers, listed in opposite orders,
 * over and over: a call either opens both or answers UM_ESTATE (the other
 * holds one) with neither left open by it; nothing deadlocks. */
typedef struct crosser {
  um_buffer *list[2];
  int rounds, opened;
} crosser;

static void *cross(void *p) {
  crosser *c = p;
  um_map_mode modes[2] = {UM_MAP_READ_WRITE, UM_MAP_READ};
  for (int i = 0; i < c->rounds; i++) {
    void *wait = NULL;
    int st = um_access_begin_n(c->list, modes, 2, &wait);
    if (st == UM_OK) {
      c->opened++;
      if (um_access_end_n(c->list, 2, NULL) != UM_OK)
        return (void *)1;
    } else if (st != UM_ESTATE) {
      return (void *)2;
    }
  }
  return NULL;
}

Test(access_n, two_threads_crossing_lists) {
  um_buffer *a = ub_alloc(m, dev, 256, UM_DEVICE), *b = ub_alloc(m, dev, 256, UM_DEVICE);
  /* Few rounds: on CUDA every bracket queues a marker on a lane, and lanes
   * busy at once are made and kept (hundreds of streams in a tight loop). */
  crosser c1 = {{a, b}, 300, 0}, c2 = {{b, a}, 300, 0};
  pthread_t t1, t2;
  void *r1, *r2;
  cr_assert_eq(pthread_create(&t1, NULL, cross, &c1), 0);
  cr_assert_eq(pthread_create(&t2, NULL, cross, &c2), 0);
  pthread_join(t1, &r1);
  pthread_join(t2, &r2);
  cr_assert_null(r1, "thread 1: %p", r1);
  cr_assert_null(r2, "thread 2: %p", r2);
  cr_assert_gt(c1.opened + c2.opened, 0);
  assert_free(a, "a"), assert_free(b, "b");
  cr_assert_eq(um_device_synchronize(dev), UM_OK);
  um_release(a), um_release(b);
}

/* A list left open at destroy, its shared handle made: destroy ends every
 * bracket (and lets the handle go); the buffers are reported leaked. */
Test(access_n, destroy_with_an_open_list) {
  um_buffer *s = ub_alloc(m, dev, 64, UM_DEVICE), *b[3];
  um_map_mode modes[3] = {R, RW, WD};
  um_event *held[3];
  void *wait = NULL, *swait = NULL;
  cr_assert_eq(um_access_begin(s, UM_MAP_READ, &swait), UM_OK);
  for (int i = 0; i < 3; i++) {
    b[i] = ub_alloc(m, dev, 64, UM_DEVICE);
    cr_assert_eq(um_copy(b[i], 0, s, 0, 64, &held[i]), UM_OK);
  }
  cr_assert_eq(um_access_begin_n(b, modes, 3, &wait), UM_OK);
  cr_assert_eq(um_access_end(s, NULL), UM_OK);
  for (int i = 0; i < 3; i++)
    um_event_release(held[i]);
  um_release(s);
  cr_assert_eq(um_manager_destroy(m), UM_ELEAK, "the three buffers leaked");
  m = NULL;
}
