/* Helpers shared by the foundation tests: a deterministic manager setup,
 * exact comparison of every statistics field, a test-only "discrete device"
 * backend (device memory with no host view, moved with memcpy on the
 * handle), the process's locked memory, and a seeded random generator.
 *
 * Everything here is static and marked unused, so each test file takes
 * what it needs without warnings. */
#ifndef UNIMEM_TEST_UTIL_H
#define UNIMEM_TEST_UTIL_H

/* Criterion cannot run under ThreadSanitizer (test_util_tsan.h says why):
 * TSan builds take a stand-in with the same macros. */
#if defined(__SANITIZE_THREAD__)
#define UT_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define UT_TSAN 1
#endif
#endif
#ifdef UT_TSAN
#include "test_util_tsan.h"
#else
#include <criterion/criterion.h>
#endif
#include <dirent.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "unimem.h"

#define UT_UNUSED __attribute__((unused))

/* AddressSanitizer builds (forks there wait for the other threads to
 * sleep: ut_wait_threads_asleep). */
#if defined(__SANITIZE_ADDRESS__)
#define UT_ASAN_ON 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UT_ASAN_ON 1
#endif
#endif
#ifndef UT_ASAN_ON
#define UT_ASAN_ON 0
#endif

/* ------------------------------------------------------------------------ */
/* Forks */

/* Before a fork under AddressSanitizer: wait until every other thread of
 * the process is asleep. Its allocator (clang 14) takes no lock across
 * fork(): a child forked while another thread was inside it (a thread just
 * made, still in the sanitizer's own start-up, allocates) blocks at its
 * first allocation of that size, for good. Elsewhere it returns at once:
 * glibc's malloc is fork-safe, and those builds fork with the threads busy.
 * A thread counts as asleep when /proc shows it in state S on three polls
 * in a row, 1 ms apart; the test fails when some thread stays awake for
 * 10 s. */
static UT_UNUSED void ut_wait_threads_asleep(void) {
  pid_t self;
  int quiet = 0, polls = 0;
  char busy[64] = "";
  if (!UT_ASAN_ON)
    return;
  self = (pid_t)syscall(SYS_gettid);
  while (quiet < 3) {
    DIR *dir = opendir("/proc/self/task");
    struct dirent *e;
    int awake = 0;
    cr_assert_not_null(dir, "/proc/self/task: %s", strerror(errno));
    while ((e = readdir(dir)) != NULL) {
      char path[64], line[512], *close_paren;
      FILE *f;
      if (e->d_name[0] == '.' || atoi(e->d_name) == self)
        continue;
      snprintf(path, sizeof(path), "/proc/self/task/%.20s/stat", e->d_name);
      if ((f = fopen(path, "r")) == NULL)
        continue; /* the thread ended */
      close_paren = fgets(line, sizeof(line), f) != NULL ? strrchr(line, ')') : NULL;
      fclose(f);
      if (close_paren != NULL && close_paren[1] == ' ' && close_paren[2] != 'S') {
        awake++;
        snprintf(busy, sizeof(busy), "thread %.20s in state %c", e->d_name, close_paren[2]);
      }
    }
    closedir(dir);
    quiet = awake == 0 ? quiet + 1 : 0;
    polls++;
    cr_assert_lt(polls, 10000, "the process's threads never all slept: %s", busy);
    if (quiet < 3)
      usleep(1000);
  }
}

/* ------------------------------------------------------------------------ */
/* Options */

/* The options every test starts from (the one copy: tests override what
 * they test): defaults with the given backends, pooling on with limits no
 * test reaches by accident, no trim timer, no scrub, no debug quarantine,
 * whatever the UNIMEM_* environment says, so that every figure moves only
 * by the test's own calls. */
static UT_UNUSED void ut_options_on(um_options *o, const char *backends) {
  um_options_init(o);
  snprintf(o->backends, sizeof(o->backends), "%s", backends);
  o->enable_pooling = 1;
  o->max_pool_bytes = 2ull << 30;
  o->max_pool_bytes_per_class = 1ull << 30;
  o->trim_interval_ms = 0;
  o->trim_on_pressure = 1;
  o->scrub = 0;
  o->debug = 0;
  o->max_concurrent_transfers = 4;
  /* One device block per pooled block, so that bytes_reserved, device_allocs
   * and trims count blocks; UT_SEGMENTS=1 in the environment runs a suite
   * with segments instead (the *_segments tests), and the segment tests
   * turn them on themselves. */
  o->segments = getenv("UT_SEGMENTS") != NULL && strcmp(getenv("UT_SEGMENTS"), "1") == 0;
}

/* ut_options_on with only the cpu backend (device 0). */
static UT_UNUSED void ut_options(um_options *o) { ut_options_on(o, "cpu"); }

/* A cpu-only manager with ut_options. */
static UT_UNUSED um_manager *ut_manager(void) {
  um_options o;
  um_manager *m = NULL;
  ut_options(&o);
  cr_assert_eq(um_manager_create(&o, &m), UM_OK, "um_manager_create: %s", um_last_error());
  cr_assert_not_null(m);
  cr_assert_eq(um_device_count(m), 1);
  return m;
}

static UT_UNUSED um_stats ut_stats(um_manager *m, um_device *d) {
  um_stats s;
  cr_assert_eq(um_stats_get(m, d, &s), UM_OK);
  return s;
}

/* Size class capacity of a pooled request (support/inside.c). */
uint64_t ut_class(size_t bytes);

/* ------------------------------------------------------------------------ */
/* Statistics: compare every field of um_stats, from the same X-macro list
 * the struct comes from, so a field added later is compared too. */

#define UT_STAT_CMP_(type, name, desc)                                         \
  if (got->name != want->name) {                                               \
    cr_log_error("%s: stats." #name " is %.17g, expected %.17g", where,        \
                 (double)got->name, (double)want->name);                       \
    bad++;                                                                     \
  }

static UT_UNUSED int ut_stats_diff(const um_stats *got, const um_stats *want, const char *where) {
  int bad = 0;
  UM_STATS_FIELDS(UT_STAT_CMP_)
  return bad;
}
#undef UT_STAT_CMP_

#define ut_assert_stats_eq(got, want, where)                                   \
  cr_assert_eq(ut_stats_diff((got), (want), (where)), 0,                       \
               "%s: statistics differ (fields listed above)", (where))

/* The manager's statistics (all devices and each device) must equal a
 * snapshot taken earlier: a failed call changed nothing. */
typedef struct ut_snapshot {
  um_stats total;
  um_stats dev[4];
  int ndev;
} ut_snapshot;

static UT_UNUSED ut_snapshot ut_snap(um_manager *m) {
  ut_snapshot s;
  memset(&s, 0, sizeof(s));
  s.total = ut_stats(m, NULL);
  s.ndev = um_device_count(m);
  cr_assert(s.ndev >= 1 && s.ndev <= 4);
  for (int i = 0; i < s.ndev; i++)
    s.dev[i] = ut_stats(m, um_device_get(m, i));
  return s;
}

#define ut_assert_unchanged(m, before)                                         \
  do {                                                                         \
    ut_snapshot after_ = ut_snap(m);                                           \
    char where_[96];                                                           \
    snprintf(where_, sizeof(where_), "%s:%d (total)", __FILE__, __LINE__);     \
    ut_assert_stats_eq(&after_.total, &(before).total, where_);                \
    cr_assert_eq(after_.ndev, (before).ndev);                                  \
    for (int i_ = 0; i_ < after_.ndev; i_++) {                                 \
      snprintf(where_, sizeof(where_), "%s:%d (device %d)", __FILE__,          \
               __LINE__, i_);                                                  \
      ut_assert_stats_eq(&after_.dev[i_], &(before).dev[i_], where_);          \
    }                                                                          \
  } while (0)

/* ------------------------------------------------------------------------ */
/* The "discrete device" test backend (support/inside.c: DEVICE memory only,
 * with no host view, so the core keeps a host shadow and runs transfers on
 * its own threads; two devices with no peer access between them). */

#define UT_DISC_DEVICES 2

/* Blocks allocated and not yet freed, across every manager: 0 after every
 * manager was destroyed. */
extern atomic_long ut_disc_live_blocks;

/* um_manager_create with the discrete test devices after o's backends
 * (support/inside.c). */
int ut_disc_manager_create(const um_options *o, um_manager **out);

/* A manager with the cpu (device 0) and the two discrete test devices
 * (devices 1 and 2). */
static UT_UNUSED um_manager *ut_manager_disc(void) {
  um_options o;
  um_manager *m = NULL;
  ut_options(&o);
  cr_assert_eq(ut_disc_manager_create(&o, &m), UM_OK, "create: %s", um_last_error());
  cr_assert_eq(um_device_count(m), 1 + UT_DISC_DEVICES);
  return m;
}

/* ------------------------------------------------------------------------ */
/* Locked memory of this process (VmLck of /proc/self/status), in bytes. */
static UT_UNUSED uint64_t ut_vmlck(void) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  unsigned long long kb = 0;
  int found = 0;
  cr_assert_not_null(f);
  while (fgets(line, sizeof(line), f))
    if (sscanf(line, "VmLck: %llu kB", &kb) == 1) {
      found = 1;
      break;
    }
  fclose(f);
  cr_assert(found, "no VmLck line in /proc/self/status");
  return (uint64_t)kb * 1024u;
}

/* Whether mlock() really locks pages in this process. Sanitizers
 * (AddressSanitizer, ThreadSanitizer) intercept mlock and make it a no-op
 * that succeeds, so tests about locked memory can only skip there. */
static UT_UNUSED int ut_mlock_works(void) {
  long page = sysconf(_SC_PAGESIZE);
  uint64_t before;
  int works;
  void *p = mmap(NULL, (size_t)page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  cr_assert_neq(p, MAP_FAILED);
  before = ut_vmlck();
  works = mlock(p, (size_t)page) == 0 && ut_vmlck() >= before + (uint64_t)page;
  munlock(p, (size_t)page);
  munmap(p, (size_t)page);
  return works;
}

#define UT_SKIP_UNLESS_MLOCK_WORKS()                                           \
  do {                                                                         \
    if (!ut_mlock_works())                                                     \
      cr_skip_test("mlock() does not lock pages in this build (a sanitizer "   \
                   "intercepts it), or locking one page is not allowed");      \
  } while (0)

/* ------------------------------------------------------------------------ */
/* xorshift64*: fixed seeds give the same sequence on every run. */
static UT_UNUSED uint64_t ut_rand(uint64_t *state) {
  uint64_t x = *state;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  *state = x;
  return x * 0x2545F4914F6CDD1Dull;
}

/* A uniformly spread value in [lo, hi]. */
static UT_UNUSED size_t ut_range(uint64_t *state, size_t lo, size_t hi) {
  return lo + (size_t)(ut_rand(state) % (uint64_t)(hi - lo + 1));
}

/* Deterministic content: byte i of pattern seed. */
static UT_UNUSED void ut_pattern(void *dst, size_t n, uint64_t seed) {
  unsigned char *p = dst;
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < n; i++) {
    if ((i & 7) == 0)
      (void)ut_rand(&s);
    p[i] = (unsigned char)(s >> ((i & 7) * 8));
  }
}

static UT_UNUSED int ut_all_bytes(const void *p, size_t n, unsigned char v) {
  const unsigned char *c = p;
  for (size_t i = 0; i < n; i++)
    if (c[i] != v)
      return 0;
  return 1;
}

#endif /* UNIMEM_TEST_UTIL_H */
