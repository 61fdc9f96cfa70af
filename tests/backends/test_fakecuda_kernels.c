/* The caller's own kernels on CUDA devices (SPEC §8), on the fake driver:
 * native handles; brackets whose wait is a pending copy's event, a gate
 * (the pending work runs on host threads), or nothing, and brackets ended
 * with NULL; the chain copy -> kernel -> copy -> kernel -> copy back over
 * one and two devices issued without a host wait; a kernel then um_map; a
 * kernel racing a release; brackets over three buffers with one wait
 * (um_access_begin_n); a release ordered after a kernel's event
 * (um_release_after); um_event_native; bad done events; the caller on two
 * streams (no ordering edge of unimem's may deadlock it); gates that spin
 * in a kernel where the driver has no stream memory operations; threads at
 * once. The kernels are the PTX of cuda_kernel_checks.h, which the fake
 * runs through its registry; most checks run twice, with the fake's
 * streams running work inside each call and on threads of their own with
 * slow operations, and the fake counts any two operations that use the
 * same bytes at once (fc_destroy). */
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#define UT_SKIP_MAIN /* support/skip_main.c: every test skipped exits 77 */
#include "fakecuda_util.h"

TestSuite(fakecuda_kernels, .timeout = 240);

#ifndef UNIMEM_HAVE_CUDA
Test(fakecuda_kernels, built_without_cuda) {
  cr_skip_test("built without the CUDA backend (cuda.h was not found at configure time)");
}
#else
#include "cuda_kernel_checks.h"

/* A manager over the fake with devices fake devices; threaded: the fake's
 * streams run on their own threads and each operation takes 200 us more. */
static um_manager *kmanager(int threaded, int devices) {
  um_manager *m;
  fc_env(UM_FAKE_CUDA_FULL);
  if (devices > 1)
    fc_set("FAKE_CUDA_DEVICE_COUNT", devices == 2 ? "2" : "3");
  if (threaded) {
    fc_set("FAKE_CUDA_STREAM_THREADS", "1");
    fc_set("FAKE_CUDA_OP_DELAY_US", "200");
  }
  m = fc_default();
  ck_load(UM_FAKE_CUDA_FULL);
  return m;
}

/* One device, its kernels built: run check, then tear everything down. */
static void run_one(int threaded, void (*check)(um_manager *, ck_kdev *)) {
  um_manager *m = kmanager(threaded, 1);
  ck_kdev k;
  ck_build(&k, fc_dev(m, 0));
  check(m, &k);
  ck_unbuild(&k);
  fc_destroy(m, UM_OK);
}

Test(fakecuda_kernels, native_handles) {
  um_manager *m = kmanager(0, 2);
  ck_kdev k0, k1;
  ck_build(&k0, fc_dev(m, 0));
  ck_check_native_handles(m, &k0, 0);
  ck_build(&k1, fc_dev(m, 1));
  ck_check_native_handles(m, &k1, 1);
  cr_assert_neq(k0.nat.cu_context, k1.nat.cu_context);
  cr_assert_neq(k0.nat.cu_stream, k1.nat.cu_stream);
  /* Per device: h2d, d2h, local and the caller's stream, nothing else
   * before any interop work (the watchers wait on the host alone). */
  cr_assert_eq(fc_count("streams"), 8);
  ck_unbuild(&k0);
  ck_unbuild(&k1);
  fc_destroy(m, UM_OK);
}

Test(fakecuda_kernels, vector_add) { run_one(0, ck_check_vector_add); }
Test(fakecuda_kernels, vector_add_threaded) { run_one(1, ck_check_vector_add); }

/* Every stream on one hardware queue (FAKE_CUDA_CONNECTIONS=1), on threads
 * of their own, each copy 50 ms: the test's hold goes in while the upload
 * stream's watcher still waits for the first of two copies. */
Test(fakecuda_kernels, a_report_never_waits_behind_a_shared_queue) {
  um_manager *m;
  ck_kdev k;
  fc_env(UM_FAKE_CUDA_FULL);
  fc_set("FAKE_CUDA_CONNECTIONS", "1");
  fc_set("FAKE_CUDA_STREAM_THREADS", "1");
  fc_set("FAKE_CUDA_OP_DELAY_US", "50000");
  m = fc_default();
  ck_load(UM_FAKE_CUDA_FULL);
  ck_build(&k, fc_dev(m, 0));
  ck_check_report_past_a_hold(m, &k, 4096);
  ck_unbuild(&k);
  fc_destroy(m, UM_OK);
}

Test(fakecuda_kernels, wait_is_the_pending_copys_event) { run_one(0, ck_check_wait_is_the_copy_event); }
Test(fakecuda_kernels, wait_is_the_pending_copys_event_threaded) { run_one(1, ck_check_wait_is_the_copy_event); }

/* The gate: one stream memory wait of unimem's, one of the test's hold. */
static void check_gate_counted(um_manager *m, ck_kdev *k) {
  long waits = fc_count("wait_values"), kernels = fc_count("kernels_run");
  ck_check_wait_is_a_gate(m, k);
  cr_assert_eq(fc_count("wait_values") - waits, 2);
  cr_assert_eq(fc_count("kernels_run") - kernels, 2);
}

Test(fakecuda_kernels, wait_is_a_gate_for_host_thread_work) { run_one(0, check_gate_counted); }
Test(fakecuda_kernels, wait_is_a_gate_for_host_thread_work_threaded) { run_one(1, check_gate_counted); }

/* UNIMEM_CUDA_GATE_KERNEL=1: the gate spins in the backend's own kernel
 * instead (the test's hold is still a stream memory wait). */
static void check_gate_kernel(um_manager *m, ck_kdev *k) {
  long waits = fc_count("wait_values"), kernels = fc_count("kernels_run");
  ck_check_wait_is_a_gate(m, k);
  cr_assert_eq(fc_count("wait_values") - waits, 1);
  cr_assert_eq(fc_count("kernels_run") - kernels, 3, "two of the test's, the gate kernel");
}

Test(fakecuda_kernels, gate_kernel_when_asked) {
  um_manager *m;
  ck_kdev k;
  fc_env(UM_FAKE_CUDA_FULL);
  fc_set("FAKE_CUDA_STREAM_THREADS", "1");
  fc_set("UNIMEM_CUDA_GATE_KERNEL", "1");
  m = fc_default();
  ck_load(UM_FAKE_CUDA_FULL);
  ck_build(&k, fc_dev(m, 0));
  check_gate_kernel(m, &k);
  cr_assert_eq(cac_log_count("gates spin in a kernel"), 0, "asked for: nothing to report");
  ck_unbuild(&k);
  fc_destroy(m, UM_OK);
}

/* A driver without stream memory operations: gates spin in the kernel,
 * and the log says so once. */
Test(fakecuda_kernels, gate_kernel_without_stream_memory_operations) {
  um_manager *m;
  ck_kdev k;
  long kernels;
  fc_env(UM_FAKE_CUDA_FULL);
  fc_set("FAKE_CUDA_NO_MEMOPS", "1");
  fc_set("FAKE_CUDA_STREAM_THREADS", "1");
  m = fc_default();
  ck_load(UM_FAKE_CUDA_FULL);
  ck_build(&k, fc_dev(m, 0));
  kernels = fc_count("kernels_run");
  ck_check_two_caller_streams(m, &k);
  ck_check_two_caller_streams(m, &k);
  cr_assert_eq(fc_count("kernels_run") - kernels, 6, "per round: two of the test's, one gate kernel");
  cr_assert_eq(fc_count("wait_values"), 0);
  cr_assert_eq(cac_log_count("gates spin in a kernel"), 1);
  ck_unbuild(&k);
  fc_destroy(m, UM_OK);
}

Test(fakecuda_kernels, queue_loop) { run_one(0, ck_check_queue_loop); }
Test(fakecuda_kernels, queue_loop_threaded) { run_one(1, ck_check_queue_loop); }
Test(fakecuda_kernels, queue_order) { run_one(1, ck_check_queue_order); }
Test(fakecuda_kernels, null_done) { run_one(0, ck_check_null_done); }
Test(fakecuda_kernels, null_done_threaded) { run_one(1, ck_check_null_done); }

/* The chain: no host wait in the driver while it is issued, and the two
 * copies between the buffers go peer to peer (two devices) or stay on the
 * device (one). */
static void chain(int threaded, int devices) {
  um_manager *m = kmanager(threaded, devices);
  ck_kdev k0, k1;
  ck_chain c;
  um_stats before, after;
  long waits;
  ck_build(&k0, fc_dev(m, 0));
  ck_build(&k1, fc_dev(m, devices - 1));
  before = ut_stats(m, NULL);
  waits = fc_count("host_waits_here");
  ck_chain_issue(m, &k0, &k1, &c);
  cr_assert_eq(fc_count("host_waits_here"), waits, "issuing the chain waited for the device");
  ck_chain_finish(&c);
  after = ut_stats(m, NULL);
  if (devices > 1)
    cr_assert_eq(CAC_DELTA(after, before, xfer_peer), 2);
  else
    cr_assert_eq(CAC_DELTA(after, before, xfer_local), 2);
  ck_unbuild(&k0);
  ck_unbuild(&k1);
  fc_destroy(m, UM_OK);
}

Test(fakecuda_kernels, chain_one_device_without_waiting) { chain(0, 1); }
Test(fakecuda_kernels, chain_one_device_without_waiting_threaded) { chain(1, 1); }
Test(fakecuda_kernels, chain_two_devices_without_waiting) { chain(0, 2); }
Test(fakecuda_kernels, chain_two_devices_without_waiting_threaded) { chain(1, 2); }

Test(fakecuda_kernels, kernel_then_map) { run_one(0, ck_check_kernel_then_map); }
Test(fakecuda_kernels, kernel_then_map_threaded) { run_one(1, ck_check_kernel_then_map); }

Test(fakecuda_kernels, kernel_racing_a_release) { run_one(0, ck_check_racing_release); }
Test(fakecuda_kernels, kernel_racing_a_release_threaded) { run_one(1, ck_check_racing_release); }
Test(fakecuda_kernels, begin_n) { run_one(0, ck_check_begin_n); }
Test(fakecuda_kernels, begin_n_threaded) { run_one(1, ck_check_begin_n); }
Test(fakecuda_kernels, release_after) { run_one(0, ck_check_release_after); }
Test(fakecuda_kernels, release_after_threaded) { run_one(1, ck_check_release_after); }

Test(fakecuda_kernels, event_native) { run_one(0, ck_check_event_native); }

/* Bad done events: one the driver no longer knows, and handles that are
 * not events. */
static void check_bad_done_events(um_manager *m, ck_kdev *k) {
  CUevent dead;
  CK_CU(ck.cuEventCreate(&dead, CU_EVENT_DISABLE_TIMING));
  CK_CU(ck.cuEventDestroy_v2(dead));
  ck_check_bad_done_events(m, k, dead);
}

Test(fakecuda_kernels, bad_done_events) { run_one(0, check_bad_done_events); }

/* An event recorded on another device's stream is a valid done event:
 * CUDA waits across devices, and the bracket is ordered after it. */
Test(fakecuda_kernels, done_event_of_another_device) {
  um_manager *m = kmanager(1, 2);
  ck_kdev k0, k1;
  um_buffer *x;
  void *wait = NULL;
  CUevent hop;
  int *out;
  ck_build(&k0, fc_dev(m, 0));
  ck_build(&k1, fc_dev(m, 1));
  CK_CU(ck.cuEventCreate(&hop, CU_EVENT_DISABLE_TIMING)); /* k1's context */
  x = ck_vector(m, k0.d, CK_N, ck_iota);
  CAC_OK(um_access_begin(x, UM_MAP_READ_WRITE, &wait));
  CK_CU(ck.cuCtxSetCurrent((CUcontext)k0.nat.cu_context));
  ck_launch_axpb(&k0, ck_stream(&k0), ck_ptr(x), 4, 4, CK_N);
  CK_CU(ck.cuEventRecord(k0.done, ck_stream(&k0)));
  CK_CU(ck.cuCtxSetCurrent((CUcontext)k1.nat.cu_context));
  CK_CU(ck.cuStreamWaitEvent(ck_stream(&k1), k0.done, 0));
  CK_CU(ck.cuEventRecord(hop, ck_stream(&k1)));
  CAC_OK(um_access_end(x, hop));
  out = ck_read(x);
  for (size_t i = 0; i < CK_N; i++)
    cr_assert_eq(out[i], 4 * (int)i + 4, "x[%zu] = %d", i, out[i]);
  free(out);
  CK_CU(ck.cuEventDestroy_v2(hop));
  CAC_OK(um_release(x));
  ck_unbuild(&k0);
  ck_unbuild(&k1);
  fc_destroy(m, UM_OK);
}

Test(fakecuda_kernels, two_caller_streams) { run_one(0, ck_check_two_caller_streams); }
Test(fakecuda_kernels, two_caller_streams_threaded) { run_one(1, ck_check_two_caller_streams); }

/* Gate words and lanes are reused: after the first round, twenty more
 * allocate no page-locked memory, and the lanes never outnumber the
 * interop items of one round (a gate, two captures, two markers). */
Test(fakecuda_kernels, gate_words_and_lanes_are_reused) {
  um_manager *m = kmanager(1, 1);
  ck_kdev k;
  long streams, host_allocs;
  ck_build(&k, fc_dev(m, 0));
  streams = fc_count("streams");
  ck_check_two_caller_streams(m, &k);
  CAC_OK(um_device_synchronize(k.d));
  host_allocs = fc_count("host_allocs");
  for (int r = 0; r < 20; r++) {
    ck_check_two_caller_streams(m, &k);
    CAC_OK(um_device_synchronize(k.d));
  }
  cr_assert_eq(fc_count("host_allocs"), host_allocs, "a gate word was not reused");
  cr_assert_leq(fc_count("streams") - streams, 5, "lanes were not reused");
  ck_unbuild(&k);
  fc_destroy(m, UM_OK);
}

static void check_threads(um_manager *m, ck_kdev *k) { ck_check_threads(m, k, 4, 25); }

Test(fakecuda_kernels, threads_at_once) { run_one(0, check_threads); }

Test(fakecuda_kernels, threads_at_once_threaded) {
  um_manager *m;
  ck_kdev k;
  fc_env(UM_FAKE_CUDA_FULL);
  fc_set("FAKE_CUDA_STREAM_THREADS", "1");
  fc_set("FAKE_CUDA_OP_DELAY_US", "20");
  m = fc_default();
  ck_load(UM_FAKE_CUDA_FULL);
  ck_build(&k, fc_dev(m, 0));
  ck_check_threads(m, &k, 4, 25);
  ck_unbuild(&k);
  fc_destroy(m, UM_OK);
}


/* spin_fill on the caller stream, waiting for a word with x in use, then
 * a fill of x on s2 while it waits. */
static void spin_fill_then_race(ck_kdev *k, CUstream s2, um_buffer *x) {
  static const char spin_ptx[] =
      ".entry spin_fill(.param .u64 x, .param .u64 word, .param .u32 v, .param .u32 n)\n{ ret; }\n";
  CUmodule mod;
  CUfunction spin;
  ck_hold h = ck_hold_new();
  CUdeviceptr p = ck_ptr(x);
  unsigned n = CK_N;
  int v = 5;
  void *params[] = {&p, &h.device, &v, &n};
  CK_CU(ck.cuModuleLoadData(&mod, spin_ptx));
  CK_CU(ck.cuModuleGetFunction(&spin, mod, "spin_fill"));
  CK_CU(ck.cuLaunchKernel(spin, ck_blocks(n), 1, 1, 256, 1, 1, 0, ck_stream(k), params, NULL));
  while (fc_count("kernels_waiting") == 0) /* until it holds x */
    sched_yield();
  ck_launch_fill(k, s2, p, 6, n);
  CK_CU(ck.cuStreamSynchronize(s2));
  ck_hold_open(&h);
  CK_CU(ck.cuStreamSynchronize(ck_stream(k)));
  CK_CU(ck.cuModuleUnload(mod));
  ck_hold_free(&h);
}

/* The fake itself: the misuse it must catch for the tests above to mean
 * anything. */
Test(fakecuda_kernels, the_fake_driver_is_strict) {
  um_manager *m = kmanager(1, 2);
  ck_kdev k0, k1;
  CUevent never, other;
  CUmodule mod;
  CUfunction f;
  CUstream s2;
  um_buffer *x;
  ck_build(&k0, fc_dev(m, 0));
  ck_build(&k1, fc_dev(m, 1));
  CK_CU(ck.cuEventCreate(&other, 0)); /* k1's context */
  CK_CU(ck.cuCtxSetCurrent((CUcontext)k0.nat.cu_context));
  cr_assert_eq(ck.cuEventRecord(other, ck_stream(&k0)), CUDA_ERROR_INVALID_HANDLE, "another context's event");
  CK_CU(ck.cuEventCreate(&never, 0));
  CK_CU(ck.cuStreamWaitEvent(ck_stream(&k0), never, 0));
  cr_assert_eq(fc_count("unrecorded_waits"), 1, "a wait on an event never recorded");
  CK_CU(ck.cuEventDestroy_v2(never));
  cr_assert_eq(ck.cuEventDestroy_v2(never), CUDA_ERROR_INVALID_HANDLE);
  cr_assert_eq(ck.cuEventQuery(never), CUDA_ERROR_INVALID_HANDLE);
  cr_assert_eq(ck.cuModuleLoadData(&mod, ".entry unknown_kernel(.param .u64 x)\n{ ret; }\n"),
               CUDA_ERROR_INVALID_PTX);
  cr_assert_eq(ck.cuModuleLoadData(&mod, ".entry axpb(.param .u64 x, .param .u32 a)\n{ ret; }\n"),
               CUDA_ERROR_INVALID_PTX, "parameters other than the fake kernel's");
  cr_assert_eq(ck.cuModuleGetFunction(&f, k0.module, "nope"), CUDA_ERROR_NOT_FOUND);
  cr_assert_eq(ck.cuLaunchKernel(k1.axpb, 1, 1, 1, 1, 1, 1, 0, ck_stream(&k0), (void *[]){0}, NULL),
               CUDA_ERROR_INVALID_CONTEXT, "a function of another context");
  /* A kernel using x while it waits for a word, and a fill of x on another
   * stream meanwhile: a race. */
  x = cac_alloc(m, k0.d, CK_N * sizeof(int), UM_DEVICE, 0);
  CK_CU(ck.cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
  spin_fill_then_race(&k0, s2, x);
  cr_assert_geq(fc_count("races"), 1);
  /* A kernel over memory that is not the device's faults its stream. */
  ck_launch_fill(&k0, s2, (CUdeviceptr)(uintptr_t)&f, 1, 1);
  cr_assert_eq(ck.cuStreamSynchronize(s2), CUDA_ERROR_ILLEGAL_ADDRESS);
  CK_CU(ck.cuStreamDestroy_v2(s2));
  CK_CU(ck.cuEventDestroy_v2(other));
  CAC_OK(um_release(x));
  ck_unbuild(&k0);
  ck_unbuild(&k1);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}
#endif
