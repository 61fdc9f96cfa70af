/* Model-based randomized test: random programs against a byte-exact
 * shadow model of every buffer and host area, with the statistics
 * invariants checked after every step (tests/model/model.h describes the
 * model; model_run.c the program).
 *
 * Tests: model/cpu (the cpu device alone), model/cpu_discrete (the cpu and
 * the two "discrete" test devices of test_util.h, whose memory has no host
 * view), model/opencl (the cpu and every OpenCL device: run under the
 * POCL_DEVICES the CTest entry sets), and the threaded programs
 * model/threads_cpu and model/threads_opencl.
 *
 * In CI a few fixed seeds run. Environment:
 *   UNIMEM_MODEL_SEED=S      run seed S only (replay, or a soak)
 *   UNIMEM_MODEL_OPS=N       steps per seed (per thread in the threaded tests)
 *   UNIMEM_MODEL_THREADS=T   threads of the threaded tests (default 4)
 *   UNIMEM_MODEL_TRACE=1     print every step
 *   UNIMEM_MODEL_EXPECT_OPENCL=N  fail unless at least N OpenCL devices
 * Each run prints its seed, steps, time and steps per second; a failure
 * prints the seed, thread and step and the line that replays it. */
#include <pthread.h>
#include <signal.h>

#include "model/model.h"
#include "test_util.h"

/* Seeds run in CI, and steps per seed (per thread when threaded). */
static const uint64_t ci_seeds[] = {1, 2, 3};
#define CI_STEPS 700
#define CI_THREAD_STEPS 300

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

typedef enum { CFG_CPU, CFG_DISCRETE, CFG_OPENCL } cfg_kind;

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
}

/* Run every seed (or UNIMEM_MODEL_SEED) of one configuration. */
static void run_config(const char *name, cfg_kind kind, int threads) {
  const char *backends = kind == CFG_OPENCL ? "cpu,opencl" : "cpu";
  uint64_t one = env_u64("UNIMEM_MODEL_SEED", 0);
  bool have_one = getenv("UNIMEM_MODEL_SEED") != NULL;
  uint64_t steps = env_u64("UNIMEM_MODEL_OPS", threads ? CI_THREAD_STEPS : CI_STEPS);
  int nthreads = (int)env_u64("UNIMEM_MODEL_THREADS", 4);
  bool trace = env_u64("UNIMEM_MODEL_TRACE", 0) != 0;
  size_t nseeds = have_one ? 1 : sizeof(ci_seeds) / sizeof(ci_seeds[0]);
  test_thread = pthread_self();
  report_deaths();
  if (getenv("POCL_DEVICES") != NULL)
    snprintf(replay, sizeof(replay), "POCL_DEVICES='%s' tests/test_model --filter model/%s", getenv("POCL_DEVICES"),
             name);
  else
    snprintf(replay, sizeof(replay), "tests/test_model --filter model/%s", name);
  mdl_replay_hint = replay;
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
  }
}

Test(model, cpu) { run_config("cpu", CFG_CPU, 0); }
Test(model, cpu_discrete) { run_config("cpu_discrete", CFG_DISCRETE, 0); }
Test(model, opencl) { run_config("opencl", CFG_OPENCL, 0); }
Test(model, threads_cpu) { run_config("threads_cpu", CFG_CPU, 1); }
Test(model, threads_opencl) { run_config("threads_opencl", CFG_OPENCL, 1); }
