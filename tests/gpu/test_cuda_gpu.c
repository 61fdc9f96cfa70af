/* The CUDA backend through the whole library on a real NVIDIA GPU: the
 * checks test_fakecuda_*.c run on the fake driver, against libcuda.so.1
 * (UNIMEM_CUDA_LIBRARY is ignored here). Label "gpu". Where the build has
 * no CUDA backend, the machine no driver, or the driver no GPU, every test
 * skips with the reason the library logged.
 *
 * Run on a GPU machine with scripts/gpu_check.sh, or:
 *   ctest -L gpu --output-on-failure */
#include <stdlib.h>
#include <string.h>

#define UT_SKIP_MAIN /* support/skip_main.c: every test skipped exits 77 */
#include "cuda_api_checks.h"

TestSuite(cuda_gpu, .timeout = 300);

/* A manager over the real driver with opts (cac_options and the test's
 * changes), or a skip saying why there is no GPU to test. */
static um_manager *gpu_manager_with(um_options *o) {
  um_manager *m = NULL;
  int st;
#ifndef UNIMEM_HAVE_CUDA
  cr_skip_test("built without the CUDA backend (cuda.h was not found at configure time; "
               "configure with -DUNIMEM_ENABLE_CUDA=ON and CUDA_HOME set)");
#endif
  cr_assert_eq(unsetenv("UNIMEM_CUDA_LIBRARY"), 0);
  st = um_manager_create(o, &m);
  cr_assert_eq(st, UM_OK, "um_manager_create: %s: %s", um_err_name(st), um_last_error());
  if (cac_cuda_count(m) == 0) {
    char reason[600];
    snprintf(reason, sizeof(reason), "no NVIDIA GPU to test: %s",
             cac_log_find("cuda")[0] ? cac_log_find("cuda") : "the cuda backend reported nothing");
    cr_assert_eq(um_manager_destroy(m), UM_OK);
    cr_skip_test("%s", reason);
  }
  return m;
}

static um_manager *gpu_manager(void) {
  um_options o;
  cac_options(&o, "cpu,cuda");
  return gpu_manager_with(&o);
}

static um_device *gpu(um_manager *m, int n) { return um_device_get(m, cac_cuda_index(m, n)); }

static void gpu_destroy(um_manager *m) {
  int st = um_manager_destroy(m);
  cr_assert_eq(st, UM_OK, "um_manager_destroy: %s: %s", um_err_name(st), um_last_error());
}

Test(cuda_gpu, devices) {
  um_manager *m = gpu_manager();
  for (int i = 0; i < cac_cuda_count(m); i++) {
    um_device_info info = cac_info(gpu(m, i));
    uint64_t free_bytes = 0, total_bytes = 0;
    CAC_OK(um_device_memory(gpu(m, i), &free_bytes, &total_bytes));
    cr_log_info("cuda device %d: %s, %llu of %llu bytes free, caps 0x%x, locations 0x%x", info.index,
                info.name, (unsigned long long)free_bytes, (unsigned long long)total_bytes, info.caps,
                info.locations);
    cac_check_device(gpu(m, i), 0);
  }
  gpu_destroy(m);
}

Test(cuda_gpu, locations) {
  um_manager *m = gpu_manager();
  cac_check_locations(m, gpu(m, 0));
  gpu_destroy(m);
}

Test(cuda_gpu, round_trips_device) {
  um_manager *m = gpu_manager();
  cac_check_round_trips(m, gpu(m, 0), UM_DEVICE, 0);
  cac_check_round_trips(m, gpu(m, 0), UM_DEVICE, 1);
  gpu_destroy(m);
}

Test(cuda_gpu, round_trips_pinned_and_unified) {
  um_manager *m = gpu_manager();
  um_device *d = gpu(m, 0);
  cac_check_round_trips(m, d, UM_PINNED, 0);
  cac_check_round_trips(m, d, UM_PINNED, 1);
  if (cac_info(d).locations & (1u << UM_UNIFIED)) {
    cac_check_round_trips(m, d, UM_UNIFIED, 0);
    cac_check_round_trips(m, d, UM_UNIFIED, 1);
  }
  gpu_destroy(m);
}

Test(cuda_gpu, strategies) {
  um_manager *m = gpu_manager();
  cac_check_strategies(m, gpu(m, 0), 0);
  cac_check_strategies(m, gpu(m, 0), 1);
  gpu_destroy(m);
}

Test(cuda_gpu, ordering) {
  um_manager *m = gpu_manager();
  for (uint64_t seed = 1; seed <= 6; seed++)
    cac_check_ordering(m, gpu(m, 0), seed, 300);
  gpu_destroy(m);
}

Test(cuda_gpu, wrap_pin) {
  um_manager *m = gpu_manager();
  cac_check_wrap_pin(m, gpu(m, 0));
  gpu_destroy(m);
}

Test(cuda_gpu, memory_figures) {
  um_manager *m = gpu_manager();
  cac_check_memory(m, gpu(m, 0), 0);
  gpu_destroy(m);
}

Test(cuda_gpu, device_limit_bytes) {
  um_options o;
  um_manager *m;
  cac_options(&o, "cpu,cuda");
  o.device_limit_bytes = 4 * CAC_MiB;
  m = gpu_manager_with(&o);
  cac_check_limit(m, gpu(m, 0));
  gpu_destroy(m);
}

Test(cuda_gpu, threads) {
  um_manager *m = gpu_manager();
  cac_check_threads(m, gpu(m, 0), 4, 50);
  gpu_destroy(m);
}

Test(cuda_gpu, between_two_gpus) {
  um_manager *m = gpu_manager();
  int n = cac_cuda_count(m);
  if (n < 2) {
    gpu_destroy(m);
    cr_skip_test("one NVIDIA GPU here: copies between two GPUs need two");
  }
  for (int i = 0; i + 1 < n; i++) {
    um_device *a = gpu(m, i), *b = gpu(m, i + 1);
    cac_check_between(m, a, b, um_peer_enabled(b, a) == 1);
    cac_check_between(m, b, a, um_peer_enabled(a, b) == 1);
  }
  gpu_destroy(m);
}

Test(cuda_gpu, staged_between_two_gpus_without_peer) {
  um_options o;
  um_manager *m;
  cac_options(&o, "cpu,cuda");
  o.enable_peer = 0;
  m = gpu_manager_with(&o);
  if (cac_cuda_count(m) < 2) {
    gpu_destroy(m);
    cr_skip_test("one NVIDIA GPU here: copies between two GPUs need two");
  }
  cac_check_between(m, gpu(m, 0), gpu(m, 1), 0);
  gpu_destroy(m);
}

Test(cuda_gpu, stream_ordered_allocation) {
  um_manager *m;
  cr_assert_eq(setenv("UNIMEM_CUDA_ASYNC_ALLOC", "1", 1), 0);
  m = gpu_manager();
  cr_assert_eq(cac_log_count("stream-ordered allocation"), cac_cuda_count(m));
  cr_log_info("%s", cac_log_find("stream-ordered allocation"));
  cac_check_locations(m, gpu(m, 0));
  cac_check_round_trips(m, gpu(m, 0), UM_DEVICE, 1);
  cac_check_strategies(m, gpu(m, 0), 1);
  gpu_destroy(m);
}

Test(cuda_gpu, leaks_are_reported_and_freed) {
  um_manager *m = gpu_manager();
  um_buffer *b = cac_alloc(m, gpu(m, 0), 12345, UM_DEVICE, 0);
  (void)b;
  cr_assert_eq(um_manager_destroy(m), UM_ELEAK);
  cr_assert_eq(cac_log_count("leak: buffer"), 1);
}
