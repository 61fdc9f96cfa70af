/* Model-based randomized test: random programs against a byte-exact
 * shadow model of every buffer and host area, with the statistics
 * invariants checked after every step (tests/reliability/model/model.h describes the
 * model; model_run.c the program).
 *
 * Tests: model/cpu (the cpu device alone), model/cpu_discrete (the cpu and
 * the two "discrete" test devices of test_util.h, whose memory has no host
 * view), model/cpu_fault (the cpu and four devices of the fault-injecting
 * backend, with no fault armed: asynchronous, shadow-mapped and natively
 * mapped device memory), model/opencl (the cpu and every OpenCL device: run under the
 * POCL_DEVICES the CTest entry sets), and the threaded programs
 * model/threads_cpu, model/threads_cpu_fault and model/threads_opencl.
 *
 * In CI a few fixed seeds run. Environment:
 *   UNIMEM_MODEL_SEED=S      run seed S only (replay, or a soak)
 *   UNIMEM_MODEL_OPS=N       steps per seed (per thread in the threaded tests)
 *   UNIMEM_MODEL_THREADS=T   threads of the threaded tests (default 4)
 *   UNIMEM_MODEL_TRACE=1     print every step
 *   UNIMEM_MODEL_EXPECT_OPENCL=N  fail unless at least N OpenCL devices
 *   UNIMEM_MODEL_HANG_S=S    a step that takes longer is a hang: say where,
 *                            and abort (default 120; 0: never)
 * Each run prints its seed, steps, time and steps per second; a failure
 * prints the seed, thread and step and the line that replays it. */
#include <pthread.h>
#include <signal.h>

#include "fault_backend.h"
#include "model/model.h"
#include "test_util.h"

/* Seeds run in CI, and steps per seed (per thread when threaded). The
 * seeds choose the options (model_run.c's pick_options): 14 pools with
 * roomy limits and forces pinned staging in 64 KiB chunks; 4 has the trim
 * timer on; 18 runs with scrub and the debug quarantine on, one worker;
 * 5 keeps a 2 MiB pool; 11 has pooling off and one worker. */
static const uint64_t ci_seeds[] = {14, 4, 18, 5, 11};
#define CI_STEPS 500
#define CI_THREAD_STEPS 200

/* Sanitizer builds run fewer steps per seed, so that each CTest entry
 * stays within about half a minute on two cores (TSan costs 10-15x on the
 * large copies, ASan 3-5x); the seeds stay the same. */
#if defined(UT_TSAN)
#define CI_SLOWDOWN 4
#elif defined(__SANITIZE_ADDRESS__)
#define CI_SLOWDOWN 2
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CI_SLOWDOWN 2
#endif
#endif
#ifndef CI_SLOWDOWN
#define CI_SLOWDOWN 1
#endif

static pthread_t test_thread;
static char replay[256];

void mdl_fail_hook(const char *msg) {
  if (pthread_equal(pthread_self(), test_thread)) {
    cr_assert_fail("%s", msg);
  } else {
    fprintf(stderr, "model: %s\n", msg);
    fflush(stderr);
  }
  abort(); /* a thread of the threaded program, or past a fatal assert */
}

/* ------------------------------------------------------------------------ */
/* Dying without a failed check (a crash, a sanitizer's report) still says
 * where the program was. */

extern void __sanitizer_set_death_callback(void (*callback)(void)) __attribute__((weak));

static void on_fatal_signal(int sig) {
  mdl_progress_print();
  signal(sig, SIG_DFL);
  raise(sig);
}

static void report_deaths(void) {
  static const int sigs[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
  for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++)
    signal(sigs[i], on_fatal_signal);
  if (__sanitizer_set_death_callback != NULL)
    __sanitizer_set_death_callback(mdl_progress_print);
}

/* A hang fails the test with the step it hangs in, rather than running
 * into CTest's timeout with nothing said: no step takes a second normally. */
static atomic_int watchdog_stop;

static void *watchdog_main(void *arg) {
  unsigned limit = (unsigned)(uintptr_t)arg, idle = 0;
  uint64_t last = mdl_progress_ticks();
  while (!atomic_load(&watchdog_stop)) {
    uint64_t now;
    sleep(1);
    now = mdl_progress_ticks();
    if (now != last) {
      last = now;
      idle = 0;
    } else if (++idle >= limit) {
      fprintf(stderr, "model: no step finished for %u s: the program hangs (UNIMEM_MODEL_HANG_S)\n", limit);
      mdl_progress_print();
      abort();
    }
  }
  return NULL;
}

/* ------------------------------------------------------------------------ */
/* Environment */

static uint64_t env_u64(const char *name, uint64_t dflt) {
  const char *v = getenv(name);
  char *end = NULL;
  unsigned long long x;
  if (v == NULL || *v == '\0')
    return dflt;
  x = strtoull(v, &end, 0);
  cr_assert(end != v && *end == '\0', "%s=%s is not a number", name, v);
  return (uint64_t)x;
}

typedef enum { CFG_CPU, CFG_DISCRETE, CFG_FAULT, CFG_OPENCL } cfg_kind;

static int count_opencl(um_manager *m) {
  int n = 0;
  for (int i = 0; i < um_device_count(m); i++) {
    um_device_info info;
    cr_assert_eq(um_device_info_get(um_device_get(m, i), &info), UM_OK);
    n += strcmp(info.backend, "opencl") == 0;
  }
  return n;
}

static um_manager *make_manager(cfg_kind kind, const um_options *o) {
  um_manager *m = NULL;
  if (kind == CFG_DISCRETE) {
    const um__backend *extra[] = {&ut_disc_backend};
    cr_assert_eq(um__manager_create_ex(o, extra, 1, &m), UM_OK, "create: %s", um_last_error());
    cr_assert_eq(um_device_count(m), 1 + UT_DISC_DEVICES);
    return m;
  }
  if (kind == CFG_FAULT) {
    /* two "fault" devices (asynchronous queue, host shadow for maps, peer
     * copies) and two "fault-map" ones (native maps), no fault armed: they
     * check what the core asks of a backend (fault_backend.h) */
    fault_configure(2, 256ull << 20);
    fault_reset();
    cr_assert_eq(fault_manager_create(o, &m), UM_OK, "create: %s", um_last_error());
    cr_assert_eq(um_device_count(m), 5);
    return m;
  }
  cr_assert_eq(um_manager_create(o, &m), UM_OK, "um_manager_create: %s", um_last_error());
  if (kind == CFG_CPU) {
    cr_assert_eq(um_device_count(m), 1);
  } else {
    int n = count_opencl(m);
    uint64_t want = env_u64("UNIMEM_MODEL_EXPECT_OPENCL", 0);
    if (n == 0) {
      um_manager_destroy(m);
      cr_skip_test("SKIPPED: no OpenCL device here (install pocl-opencl-icd)");
    }
    cr_assert_geq((uint64_t)n, want, "%d OpenCL device(s), UNIMEM_MODEL_EXPECT_OPENCL=%llu", n,
                  (unsigned long long)want);
  }
  return m;
}

/* After the manager is gone, the test backends hold no block. */
static void check_backend_blocks(cfg_kind kind) {
  if (kind == CFG_DISCRETE)
    cr_assert_eq(atomic_load(&ut_disc_live_blocks), 0, "%ld discrete blocks outlived the manager",
                 (long)atomic_load(&ut_disc_live_blocks));
  if (kind == CFG_FAULT) {
    fault_counts k;
    fault_counts_get(&k);
    cr_assert(k.live_blocks == 0 && k.leaked_at_close == 0,
              "fault devices: %llu blocks outlived the manager, %llu were live when a backend closed",
              (unsigned long long)k.live_blocks, (unsigned long long)k.leaked_at_close);
  }
}

static void print_result(const char *name, uint64_t seed, const mdl_config *cfg, int ndev,
                         const mdl_result *r) {
  const um_options *o = &cfg->opts;
  fprintf(stderr,
          "model[%s] seed %llu: %llu ops in %.2f s (%.0f ops/s), %llu content checks, cancels %llu ok / %llu busy;"
          " %d devices, pooling %d, pool %llu/%llu, workers %d, staging %d/%zu, scrub %d, debug %d, timer %u ms\n",
          name, (unsigned long long)seed, (unsigned long long)r->steps, r->seconds,
          r->seconds > 0 ? (double)r->steps / r->seconds : 0.0, (unsigned long long)r->checks,
          (unsigned long long)r->cancels_ok, (unsigned long long)r->cancels_busy, ndev, o->enable_pooling,
          (unsigned long long)o->max_pool_bytes, (unsigned long long)o->max_pool_bytes_per_class,
          o->max_concurrent_transfers, o->use_pinned_staging, o->staging_chunk_bytes, o->scrub, o->debug,
          o->trim_interval_ms);
  fprintf(stderr,
          "model[%s] seed %llu: copies local %llu, peer %llu, direct %llu, pipelined %llu, staged %llu; fills %llu;"
          " pool hits %llu misses %llu, trims %llu\n",
          name, (unsigned long long)seed, (unsigned long long)r->final.xfer_local,
          (unsigned long long)r->final.xfer_peer, (unsigned long long)r->final.xfer_direct,
          (unsigned long long)r->final.xfer_pipelined, (unsigned long long)r->final.xfer_staged,
          (unsigned long long)r->final.fills, (unsigned long long)r->final.pool_hits,
          (unsigned long long)r->final.pool_misses, (unsigned long long)r->final.trims);
}

/* Run every seed (or UNIMEM_MODEL_SEED) of one configuration. */
static void run_config(const char *name, cfg_kind kind, int threads) {
  const char *backends = kind == CFG_OPENCL ? "cpu,opencl" : "cpu";
  uint64_t one = env_u64("UNIMEM_MODEL_SEED", 0);
  bool have_one = getenv("UNIMEM_MODEL_SEED") != NULL;
  uint64_t steps = env_u64("UNIMEM_MODEL_OPS", (threads ? CI_THREAD_STEPS : CI_STEPS) / CI_SLOWDOWN);
  int nthreads = (int)env_u64("UNIMEM_MODEL_THREADS", 4);
  bool trace = env_u64("UNIMEM_MODEL_TRACE", 0) != 0;
  size_t nseeds = have_one ? 1 : sizeof(ci_seeds) / sizeof(ci_seeds[0]);
  unsigned hang_s = (unsigned)env_u64("UNIMEM_MODEL_HANG_S", 120);
  pthread_t watchdog;
  test_thread = pthread_self();
  report_deaths();
  if (getenv("POCL_DEVICES") != NULL)
    snprintf(replay, sizeof(replay), "POCL_DEVICES='%s' tests/test_model --filter model/%s", getenv("POCL_DEVICES"),
             name);
  else
    snprintf(replay, sizeof(replay), "tests/test_model --filter model/%s", name);
  mdl_replay_hint = replay;
  atomic_store(&watchdog_stop, 0);
  if (hang_s > 0)
    cr_assert_eq(pthread_create(&watchdog, NULL, watchdog_main, (void *)(uintptr_t)hang_s), 0);
  for (size_t i = 0; i < nseeds; i++) {
    uint64_t seed = have_one ? one : ci_seeds[i];
    mdl_config cfg;
    mdl_result r;
    um_manager *m;
    mdl_config_pick(&cfg, seed, backends, threads != 0);
    m = make_manager(kind, &cfg.opts);
    if (threads)
      r = mdl_run_threads(m, &cfg, seed, steps, nthreads, trace);
    else
      r = mdl_run_single(m, &cfg, seed, steps, trace);
    print_result(name, seed, &cfg, um_device_count(m), &r);
    cr_assert_eq(um_manager_destroy(m), UM_OK, "um_manager_destroy: %s", um_last_error());
    check_backend_blocks(kind);
  }
  atomic_store(&watchdog_stop, 1);
  if (hang_s > 0)
    pthread_join(watchdog, NULL);
}

Test(model, cpu) { run_config("cpu", CFG_CPU, 0); }
Test(model, cpu_discrete) { run_config("cpu_discrete", CFG_DISCRETE, 0); }
Test(model, cpu_fault) { run_config("cpu_fault", CFG_FAULT, 0); }
Test(model, threads_cpu_fault) { run_config("threads_cpu_fault", CFG_FAULT, 1); }
Test(model, opencl) { run_config("opencl", CFG_OPENCL, 0); }
Test(model, threads_cpu) { run_config("threads_cpu", CFG_CPU, 1); }
Test(model, threads_opencl) { run_config("threads_opencl", CFG_OPENCL, 1); }

/* SPEC section 5 (amended): UM_HOST is valid on every device (pageable
 * host memory accounted to that device, with a host view); UM_ENOTSUP is
 * only for PINNED and UNIFIED. The model uses the locations each device
 * reports, so this is checked on its own. */
Test(model, opencl_host_location) {
  um_options o;
  um_manager *m;
  ut_options(&o);
  snprintf(o.backends, sizeof(o.backends), "cpu,opencl");
  m = make_manager(CFG_OPENCL, &o);
  for (int i = 0; i < um_device_count(m); i++) {
    um_device *d = um_device_get(m, i);
    um_device_info info;
    um_buffer *b = NULL;
    unsigned char in[100], out[100];
    int st;
    cr_assert_eq(um_device_info_get(d, &info), UM_OK);
    cr_expect(info.locations & (1u << UM_HOST), "device %d (%s) does not list UM_HOST in its locations", i,
              info.backend);
    st = um_alloc(m, d, sizeof(in), UM_HOST, 0, &b);
    cr_assert_eq(st, UM_OK, "um_alloc(UM_HOST) on device %d (%s): %s (%s)", i, info.backend, um_err_name(st),
                 um_last_error());
    cr_assert_not_null(um_buffer_host_ptr(b), "a UM_HOST buffer of device %d has no host view", i);
    cr_assert_eq(ut_stats(m, d).bytes_in_use, sizeof(in), "a UM_HOST buffer is accounted to its device");
    ut_pattern(in, sizeof(in), (uint64_t)i + 1);
    cr_assert_eq(um_copy_from_host(b, 0, in, sizeof(in), NULL), UM_OK);
    cr_assert_eq(um_copy_to_host(b, 0, out, sizeof(out), NULL), UM_OK);
    cr_assert_arr_eq(out, in, sizeof(in));
    cr_assert_eq(um_release(b), UM_OK);
  }
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}
