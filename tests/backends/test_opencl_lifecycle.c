/* Lifecycle on OpenCL (issue 10): a completion on PoCL's own callback
 * thread racing um_manager_destroy, and fork() in a process whose manager
 * uses OpenCL. test_lifecycle.c has the same races on a test backend. */
#include <sys/wait.h>

#include "opencl_util.h"

static pthread_t test_thread;
static atomic_bool hook_returned;
static atomic_int hook_calls;

/* Holds the completing thread (PoCL's) 300 ms just before its last touch
 * of the manager. */
static void hold_driver_thread(um__test_point point, void *arg) {
  struct timespec ts = {0, 300 * 1000000L};
  (void)arg;
  if (point != UM__TP_INFLIGHT_DONE || pthread_equal(pthread_self(), test_thread))
    return;
  atomic_fetch_add(&hook_calls, 1);
  nanosleep(&ts, NULL);
  atomic_store(&hook_returned, true);
}

OU_TEST_1_AND_2(opencl_lifecycle, destroy_waits_for_the_driver_thread) {
  ou_env e = ou_open(NULL, 1);
  unsigned char src[4096];
  um_buffer *b;
  um_event *ev;
  memset(src, 3, sizeof(src));
  b = ub_alloc(e.m, e.dev[0], sizeof(src), UM_DEVICE);
  test_thread = pthread_self();
  atomic_store(&um__test_hook, hold_driver_thread);
  cr_assert_eq(um_copy_from_host(b, 0, src, sizeof(src), &ev), UM_OK);
  cr_assert_eq(um_event_release(ev), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  for (int i = 0; i < 10000 && atomic_load(&hook_calls) == 0; i++)
    usleep(1000);
  if (atomic_load(&hook_calls) == 0) {
    /* PoCL's basic device completes on the submitting thread: no driver
     * thread to race with. */
    cr_assert_eq(um_manager_destroy(e.m), UM_OK);
    atomic_store(&um__test_hook, NULL);
    return;
  }
  cr_assert_eq(um_manager_destroy(e.m), UM_OK);
  cr_assert(atomic_load(&hook_returned), "destroy returned while PoCL's thread was inside the manager");
  atomic_store(&um__test_hook, NULL);
}

/* The child of a process whose manager loaded OpenCL: the driver is not
 * usable there, so a new manager has the cpu only, and says why. */
/* AddressSanitizer of clang 14 does not hold its allocator's locks across
 * fork(): a child whose parent had threads allocating (PoCL's, unimem's)
 * can inherit one locked, and the child's new threads then wait forever
 * inside ASan's own free() as they start (seen in CI's ASan stage: the
 * child's um_manager_destroy joining workers stuck in
 * __sanitizer::SizeClassAllocator64::GetFromAllocator). */
#if defined(__SANITIZE_ADDRESS__)
#define LC_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define LC_ASAN 1
#endif
#endif

Test(opencl_lifecycle, fork_child_gets_a_cpu_only_manager, .timeout = 60) {
#ifdef UT_TSAN
  cr_skip_test("SKIP: ThreadSanitizer ends a forked child that starts threads (die_after_fork)");
#elif defined(LC_ASAN)
  cr_skip_test("SKIP: AddressSanitizer (clang 14) can hand a forked child its allocator's lock held by "
               "another thread of the parent, and the child's threads then deadlock inside ASan; "
               "the gcc and clang stages run this test");
#else
  ou_env e;
  um_buffer *b;
  unsigned char src[65536], back[65536];
  int status;
  pid_t pid;
  ou_want_devices(1);
  e = ou_open(NULL, 1);
  ub_pattern(src, sizeof(src), 5);
  b = ub_alloc(e.m, e.dev[0], sizeof(src), UM_DEVICE);
  cr_assert_eq(um_copy_from_host(b, 0, src, sizeof(src), NULL), UM_OK);
  ut_wait_threads_asleep();
  pid = fork();
  cr_assert_neq(pid, -1);
  if (pid == 0) {
    um_options o;
    um_manager *m2;
    int bad = 0;
    ou_options(&o);
    ou_log_text[0] = '\0';
    bad += um_manager_create(&o, &m2) != UM_OK;
    if (bad == 0) {
      bad += um_device_count(m2) != 1;
      bad += strstr(ou_log_text, "fork") == NULL;
      bad += um_manager_destroy(m2) != UM_OK;
    }
    bad += um_copy_to_host(b, 0, back, sizeof(back), NULL) != UM_ESTATE;
    _exit(bad == 0 ? 0 : 1);
  }
  cr_assert_eq(um_copy_to_host(b, 0, back, sizeof(back), NULL), UM_OK);
  ub_assert_bytes(back, src, sizeof(src), "the parent's buffer after the fork");
  cr_assert_eq(waitpid(pid, &status, 0), pid);
  cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status 0x%x", status);
  cr_assert_eq(um_release(b), UM_OK);
  ou_close(&e);
#endif
}

static atomic_int platforms_skipped;

static void count_platform_skips(void *ctx, um_log_level level, const char *msg) {
  (void)ctx, (void)level;
  if (strstr(msg, "skipped: UNIMEM_OPENCL_PLATFORM=\"no such platform\"") != NULL)
    atomic_fetch_add(&platforms_skipped, 1);
}

/* UNIMEM_OPENCL_PLATFORM, read at each um_manager_create: a name no
 * platform has opens no OpenCL device and says which platform it skipped;
 * PoCL's name (as ou_options sets it) opens PoCL's devices, all in one context. */
Test(opencl_lifecycle, platform_chosen_by_name) {
  um_options o;
  um_manager *m;
  ou_env e;
  um_device_native n0, n1;
  ou_want_devices(2);
  ou_options(&o);
  o.log = count_platform_skips;
  setenv("UNIMEM_OPENCL_PLATFORM", "no such platform", 1);
  cr_assert_eq(um_manager_create(&o, &m), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_device_count(m), 1, "the cpu alone");
  cr_assert_eq(um_manager_destroy(m), UM_OK);
  if (atomic_load(&platforms_skipped) == 0)
    cr_skip_test("SKIPPED: no OpenCL platform here (install pocl-opencl-icd)");
  e = ou_open(NULL, 2);
  cr_assert_eq(um_device_native_get(e.dev[0], &n0), UM_OK);
  cr_assert_eq(um_device_native_get(e.dev[e.ndev - 1], &n1), UM_OK);
  cr_assert_eq(n0.cl_context, n1.cl_context, "one platform, one context");
  cr_assert_eq(um_peer_enabled(e.dev[0], e.dev[e.ndev - 1]), 1);
  ou_close(&e);
}
