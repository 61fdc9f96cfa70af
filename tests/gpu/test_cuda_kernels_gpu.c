/* The caller's own kernels on a real NVIDIA GPU (SPEC §8): the checks of
 * test_fakecuda_kernels.c (cuda_kernel_checks.h) with hand-written PTX
 * JIT-compiled by the driver, against libcuda.so.1 opened by the library
 * and by the test itself (UNIMEM_CUDA_LIBRARY is ignored here). Label
 * "gpu"; every test skips, saying why, where the build has no CUDA
 * backend, the machine no driver, or the driver no GPU; and three checks
 * skip with CUDA_DEVICE_MAX_CONNECTIONS=1, where they deadlock by
 * construction (one_connection).
 *
 * Run on a GPU machine with scripts/gpu_check.sh, or:
 *   ctest -L gpu --output-on-failure */
#include <stdlib.h>
#include <string.h>

#define UT_SKIP_MAIN /* support/skip_main.c: every test skipped exits 77 */
#include "cuda_api_checks.h"

TestSuite(cuda_kernels_gpu, .timeout = 300);

#ifndef UNIMEM_HAVE_CUDA
Test(cuda_kernels_gpu, built_without_cuda) {
  cr_skip_test("built without the CUDA backend (cuda.h was not found at configure time; "
               "configure with -DUNIMEM_ENABLE_CUDA=ON and CUDA_HOME set)");
}
#else
#include "cuda_kernel_checks.h"

/* A manager over the real driver (gates through stream memory operations,
 * or spinning in the backend's kernel), or a skip saying why there is no
 * GPU to test. */
static um_manager *gpu_manager(int gate_kernel) {
  um_options o;
  um_manager *m = NULL;
  int st;
  cac_options(&o, "cpu,cuda");
  cr_assert_eq(unsetenv("UNIMEM_CUDA_LIBRARY"), 0);
  if (gate_kernel)
    cr_assert_eq(setenv("UNIMEM_CUDA_GATE_KERNEL", "1", 1), 0);
  else
    cr_assert_eq(unsetenv("UNIMEM_CUDA_GATE_KERNEL"), 0);
  st = um_manager_create(&o, &m);
  cr_assert_eq(st, UM_OK, "um_manager_create: %s: %s", um_err_name(st), um_last_error());
  if (cac_cuda_count(m) == 0) {
    char reason[600];
    snprintf(reason, sizeof(reason), "no NVIDIA GPU to test: %s",
             cac_log_find("cuda")[0] ? cac_log_find("cuda") : "the cuda backend reported nothing");
    cr_assert_eq(um_manager_destroy(m), UM_OK);
    cr_skip_test("%s", reason);
  }
  ck_load("libcuda.so.1");
  return m;
}

static um_device *gpu(um_manager *m, int n) { return um_device_get(m, cac_cuda_index(m, n)); }

static void run_gpu(int gate_kernel, void (*check)(um_manager *, ck_kdev *)) {
  um_manager *m = gpu_manager(gate_kernel);
  ck_kdev k;
  int st;
  ck_build(&k, gpu(m, 0));
  check(m, &k);
  ck_unbuild(&k);
  st = um_manager_destroy(m);
  cr_assert_eq(st, UM_OK, "um_manager_destroy: %s: %s", um_err_name(st), um_last_error());
}

/* Whether CUDA_DEVICE_MAX_CONNECTIONS=1: every stream of the process on one
 * hardware queue, which runs work in submission order across streams. */
static int one_connection(void) {
  const char *v = getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  char *end;
  long n;
  if (v == NULL)
    return 0;
  n = strtol(v, &end, 10);
  return end != v && *end == '\0' && n == 1;
}

/* Checks that deadlock by construction with one hardware queue, any
 * library's gate alike: skipped, saying why, with one connection only. */
static void skip_with_one_connection(const char *why) {
  if (one_connection())
    cr_skip_test("SKIP with CUDA_DEVICE_MAX_CONNECTIONS=1 (every stream on one hardware queue, run in "
                 "submission order across streams): %s",
                 why);
}

/* Why each deadlocks there (no gate built from device-side waits can avoid
 * the second: docs/guide.md, CUDA notes). */
#define RACING_RELEASE_ONE_QUEUE                                                                                  \
  "the test's own cuStreamWaitValue32 hold is queued before its blocking um_fill and opened after it: the "     \
  "fill waits behind the hold forever"
#define TWO_STREAMS_ONE_QUEUE                                                                                     \
  "b's gate is queued at um_access_begin(b), and the s2 kernel that ends c's bracket, which the gate's opener "  \
  "(the copy b <- c) waits for, is queued after it: it waits behind the gate forever"

static void check_handles(um_manager *m, ck_kdev *k) { ck_check_native_handles(m, k, 0); }

Test(cuda_kernels_gpu, native_handles) { run_gpu(0, check_handles); }
Test(cuda_kernels_gpu, vector_add) { run_gpu(0, ck_check_vector_add); }
Test(cuda_kernels_gpu, wait_is_the_pending_copys_event) { run_gpu(0, ck_check_wait_is_the_copy_event); }
Test(cuda_kernels_gpu, wait_is_a_gate_for_host_thread_work) { run_gpu(0, ck_check_wait_is_a_gate); }
Test(cuda_kernels_gpu, wait_is_a_gate_spinning_in_a_kernel) { run_gpu(1, ck_check_wait_is_a_gate); }
/* Two 64 MiB uploads (about 1.3 ms each over PCIe 5): the test's hold on a
 * stream of its own goes in while the watcher still waits for the first.
 * Meant for CUDA_DEVICE_MAX_CONNECTIONS=1 too (scripts/gpu_check.sh runs
 * it so), where every stream's kernels and waits share one queue. */
static void check_report_past_a_hold(um_manager *m, ck_kdev *k) { ck_check_report_past_a_hold(m, k, (size_t)64 << 20); }
Test(cuda_kernels_gpu, a_report_never_waits_behind_a_hold) { run_gpu(0, check_report_past_a_hold); }
Test(cuda_kernels_gpu, null_done) { run_gpu(0, ck_check_null_done); }
Test(cuda_kernels_gpu, queue_loop) { run_gpu(0, ck_check_queue_loop); }
Test(cuda_kernels_gpu, queue_order) { run_gpu(0, ck_check_queue_order); }
Test(cuda_kernels_gpu, kernel_then_map) { run_gpu(0, ck_check_kernel_then_map); }
Test(cuda_kernels_gpu, kernel_racing_a_release) {
  skip_with_one_connection(RACING_RELEASE_ONE_QUEUE);
  run_gpu(0, ck_check_racing_release);
}
Test(cuda_kernels_gpu, begin_n) { run_gpu(0, ck_check_begin_n); }
Test(cuda_kernels_gpu, release_after) {
  skip_with_one_connection(RACING_RELEASE_ONE_QUEUE);
  run_gpu(0, ck_check_release_after);
}
Test(cuda_kernels_gpu, event_native) { run_gpu(0, ck_check_event_native); }
Test(cuda_kernels_gpu, two_caller_streams) {
  skip_with_one_connection(TWO_STREAMS_ONE_QUEUE);
  run_gpu(0, ck_check_two_caller_streams);
}
Test(cuda_kernels_gpu, two_caller_streams_gate_kernel) {
  skip_with_one_connection(TWO_STREAMS_ONE_QUEUE);
  run_gpu(1, ck_check_two_caller_streams);
}
/* Retain and bad brackets on a GPU: conformance/test_access.c, gpu profile. */

static void check_threads(um_manager *m, ck_kdev *k) { ck_check_threads(m, k, 4, 50); }
Test(cuda_kernels_gpu, threads_at_once) { run_gpu(0, check_threads); }

/* The chain over the first GPU, then between the first two where there
 * are two. */
static void chain(int between) {
  um_manager *m = gpu_manager(0);
  ck_kdev k0, k1;
  ck_chain c;
  int st;
  if (between && cac_cuda_count(m) < 2) {
    cr_assert_eq(um_manager_destroy(m), UM_OK);
    cr_skip_test("one NVIDIA GPU here: the chain between two GPUs needs two");
  }
  ck_build(&k0, gpu(m, 0));
  ck_build(&k1, gpu(m, between ? 1 : 0));
  ck_chain_issue(m, &k0, &k1, &c);
  ck_chain_finish(&c);
  ck_unbuild(&k0);
  ck_unbuild(&k1);
  st = um_manager_destroy(m);
  cr_assert_eq(st, UM_OK, "um_manager_destroy: %s: %s", um_err_name(st), um_last_error());
}

Test(cuda_kernels_gpu, chain_without_waiting) { chain(0); }
Test(cuda_kernels_gpu, chain_between_two_gpus) { chain(1); }
#endif
