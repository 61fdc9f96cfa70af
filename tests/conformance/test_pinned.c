/* PINNED on the cpu is really page-locked (the process's VmLck grows by the
 * block), and when the system refuses to lock more the allocation says so
 * truthfully: UM_ENOMEM, with mlock and RLIMIT_MEMLOCK in um_last_error(),
 * after the pool released its idle pinned blocks and retried once.
 *
 * The refusal is provoked in the test's own process (Criterion forks one
 * per test): drop CAP_IPC_LOCK with capset(2), then lower RLIMIT_MEMLOCK. */
#include <linux/capability.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "bytes.h"

#define KiB ((size_t)1024)
#define MiB ((size_t)1024 * 1024)

static um_manager *make(int trim_on_pressure) {
  um_options o;
  um_manager *m = NULL;
  ut_options(&o);
  o.trim_on_pressure = trim_on_pressure;
  cr_assert_eq(um_manager_create(&o, &m), UM_OK);
  return m;
}

/* Whether this process may lock n more bytes: CAP_IPC_LOCK, or room under
 * RLIMIT_MEMLOCK. */
static int can_lock(size_t n) {
  struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
  struct __user_cap_data_struct data[2];
  struct rlimit rl;
  if (syscall(SYS_capget, &hdr, data) == 0 && (data[0].effective & (1u << CAP_IPC_LOCK)))
    return 1;
  if (getrlimit(RLIMIT_MEMLOCK, &rl) != 0)
    return 0;
  return rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= ut_vmlck() + n;
}

/* Lose CAP_IPC_LOCK (effective, permitted, inheritable) on this thread,
 * which creates the manager's threads afterwards, then lock at most
 * `limit` bytes (skip when the hard limit is already lower). */
static void restrict_locking(rlim_t limit) {
  struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
  struct __user_cap_data_struct data[2];
  struct rlimit rl;
  cr_assert_eq(syscall(SYS_capget, &hdr, data), 0);
  data[0].effective &= ~(1u << CAP_IPC_LOCK);
  data[0].permitted &= ~(1u << CAP_IPC_LOCK);
  data[0].inheritable &= ~(1u << CAP_IPC_LOCK);
  cr_assert_eq(syscall(SYS_capset, &hdr, data), 0, "capset");
  cr_assert_eq(getrlimit(RLIMIT_MEMLOCK, &rl), 0);
  if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < limit)
    cr_skip_test("the hard RLIMIT_MEMLOCK (%llu bytes) is below the %llu bytes this test needs",
                 (unsigned long long)rl.rlim_max, (unsigned long long)limit);
  rl.rlim_cur = rl.rlim_max = limit;
  cr_assert_eq(setrlimit(RLIMIT_MEMLOCK, &rl), 0, "setrlimit");
  cr_assert_eq(syscall(SYS_capget, &hdr, data), 0);
  cr_assert_eq(data[0].effective & (1u << CAP_IPC_LOCK), 0);
}

Test(pinned, pages_are_locked) {
  UT_SKIP_UNLESS_MLOCK_WORKS();
  um_manager *m;
  um_device *cpu;
  um_buffer *b, *u;
  uint64_t base, locked;
  if (!can_lock(3 * MiB))
    cr_skip_test("this process may not lock 3 MiB (no CAP_IPC_LOCK, RLIMIT_MEMLOCK too low)");
  m = make(1);
  cpu = um_device_get(m, 0);
  base = ut_vmlck();
  cr_assert_eq(um_alloc(m, cpu, 1 * MiB, UM_PINNED, 0, &b), UM_OK, "%s", um_last_error());
  locked = ut_vmlck();
  cr_assert_geq(locked, base + 1 * MiB, "VmLck %llu -> %llu after a 1 MiB pinned allocation",
                (unsigned long long)base, (unsigned long long)locked);
  cr_assert_not_null(um_buffer_host_ptr(b));
  cr_assert_eq(um_fill(b, 0, 0x3c, 1 * MiB, NULL), UM_OK);
  cr_assert(ut_all_bytes(um_buffer_host_ptr(b), 1 * MiB, 0x3c));

  /* An idle pooled pinned block stays locked; a trim unlocks it. */
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_geq(ut_vmlck(), base + 1 * MiB);
  cr_assert_eq(um_pool_trim(m, 0), UM_OK);
  cr_assert_eq(ut_vmlck(), base, "a trimmed pinned block is unlocked");

  /* An unpooled one is unlocked on release. */
  cr_assert_eq(um_alloc(m, cpu, 2 * MiB + 5, UM_PINNED, UM_ALLOC_UNPOOLED, &u), UM_OK);
  cr_assert_geq(ut_vmlck(), base + 2 * MiB + 5);
  cr_assert_eq(um_release(u), UM_OK);
  cr_assert_eq(ut_vmlck(), base);

  /* The other locations are not locked. */
  cr_assert_eq(um_alloc(m, cpu, 1 * MiB, UM_HOST, 0, &u), UM_OK);
  cr_assert_eq(ut_vmlck(), base);
  cr_assert_eq(um_release(u), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

Test(pinned, refusal_is_truthful) {
  UT_SKIP_UNLESS_MLOCK_WORKS();
  um_manager *m;
  um_buffer *b = (um_buffer *)(uintptr_t)0x77;
  um_stats s;
  int st;
  restrict_locking(64 * KiB);
  m = make(1);
  st = um_alloc(m, um_device_get(m, 0), 1 * MiB, UM_PINNED, 0, &b);
  cr_assert_eq(st, UM_ENOMEM, "a 1 MiB pinned allocation under a 64 KiB limit: %s", um_err_name(st));
  cr_assert_not_null(strstr(um_last_error(), "mlock"), "%s", um_last_error());
  cr_assert_not_null(strstr(um_last_error(), "RLIMIT_MEMLOCK"), "%s", um_last_error());
  cr_assert_eq(b, (um_buffer *)(uintptr_t)0x77, "out written on failure");
  s = ut_stats(m, NULL);
  cr_assert_eq(s.oom_retries, 1, "the pool was trimmed and the allocation retried once");
  cr_assert_eq(s.allocations, 0);
  cr_assert_eq(s.active_buffers, 0);
  cr_assert_eq(s.bytes_reserved, 0);
  cr_assert_eq(s.device_allocs, 0);
  /* small pinned blocks under the limit still work */
  cr_assert_eq(um_alloc(m, um_device_get(m, 0), 16 * KiB, UM_PINNED, 0, &b), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_release(b), UM_OK);
  /* and the other locations are not affected */
  cr_assert_eq(um_alloc(m, um_device_get(m, 0), 1 * MiB, UM_HOST, 0, &b), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* Without trim_on_pressure, no retry. */
Test(pinned, refusal_without_retry) {
  UT_SKIP_UNLESS_MLOCK_WORKS();
  um_manager *m;
  um_buffer *b;
  restrict_locking(64 * KiB);
  m = make(0);
  cr_assert_eq(um_alloc(m, um_device_get(m, 0), 1 * MiB, UM_PINNED, 0, &b), UM_ENOMEM);
  cr_assert_eq(ut_stats(m, NULL).oom_retries, 0);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* The retry is worth it: idle pinned blocks hold the locked budget; the
 * trim under pressure unlocks them and the retry succeeds. */
Test(pinned, pressure_trim_makes_room) {
  UT_SKIP_UNLESS_MLOCK_WORKS();
  um_manager *m;
  um_device *cpu;
  um_buffer *a, *b;
  um_stats s;
  restrict_locking(ut_vmlck() + 1 * MiB);
  m = make(1);
  cpu = um_device_get(m, 0);
  cr_assert_eq(um_alloc(m, cpu, 600 * KiB, UM_PINNED, 0, &a), UM_OK, "%s", um_last_error()); /* class 640 KiB */
  cr_assert_eq(um_release(a), UM_OK); /* idle, still locked */
  cr_assert_eq(ut_stats(m, NULL).bytes_pooled, 640 * KiB);
  cr_assert_eq(um_alloc(m, cpu, 700 * KiB, UM_PINNED, 0, &b), UM_OK, /* class 768 KiB */
               "pressure trim did not make room: %s", um_last_error());
  s = ut_stats(m, NULL);
  cr_assert_eq(s.oom_retries, 1);
  cr_assert_eq(s.trims, 1);
  cr_assert_eq(s.bytes_trimmed, 640 * KiB);
  cr_assert_eq(s.bytes_pooled, 0);
  cr_assert_eq(s.bytes_reserved, 768 * KiB);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* The application's out-of-memory callback gets the last word. */
Test(pinned, oom_callback_retries) {
  UT_SKIP_UNLESS_MLOCK_WORKS();
  um_options o;
  um_manager *m;
  um_buffer *b;
  restrict_locking(ut_vmlck() + 1 * MiB);
  ut_options(&o);
  o.on_oom = ub_release_oom_victim;
  cr_assert_eq(um_manager_create(&o, &m), UM_OK);
  cr_assert_eq(um_alloc(m, um_device_get(m, 0), 700 * KiB, UM_PINNED, UM_ALLOC_UNPOOLED, &ub_oom_victim), UM_OK);
  cr_assert_eq(um_alloc(m, um_device_get(m, 0), 700 * KiB, UM_PINNED, UM_ALLOC_UNPOOLED, &b), UM_OK,
               "%s", um_last_error());
  cr_assert_eq(ub_oom_calls, 1);
  cr_assert_eq(ut_stats(m, NULL).oom_retries, 2, "one retry after the trim, one after the callback");
  cr_assert_eq(um_release(b), UM_OK);
  /* with nothing left to free, the callback declines */
  cr_assert_eq(um_alloc(m, um_device_get(m, 0), 700 * KiB, UM_PINNED, UM_ALLOC_UNPOOLED, &b), UM_OK);
  cr_assert_eq(um_alloc(m, um_device_get(m, 0), 700 * KiB, UM_PINNED, UM_ALLOC_UNPOOLED, &ub_oom_victim),
               UM_ENOMEM);
  cr_assert_eq(ub_oom_calls, 2);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}
