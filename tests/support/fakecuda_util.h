/* Managers over the fake CUDA driver (tests/backends/fake_cuda/fake_cuda.c) for the
 * test_fakecuda_*.c files.
 *
 * The backend loads its driver once per process, and Criterion runs every
 * test in a process of its own, so each test sets the driver and the
 * fake's FAKE_CUDA_* knobs (read at cuInit) before its first manager.
 * UM_FAKE_CUDA_FULL / UM_FAKE_CUDA_MISSING are the libraries' paths, given
 * by tests/CMakeLists.txt where the CUDA backend is built; elsewhere every
 * test skips, saying so. */
#ifndef UNIMEM_FAKECUDA_UTIL_H
#define UNIMEM_FAKECUDA_UTIL_H

#include <dlfcn.h>

#include "cuda_api_checks.h"

#if defined(UM_FAKE_CUDA_FULL) && defined(UM_FAKE_CUDA_MISSING)
#define FC_HAVE_FAKE 1
#else
/* Built without the CUDA backend: the tests compile and skip. */
#define FC_HAVE_FAKE 0
#define UM_FAKE_CUDA_FULL ""
#define UM_FAKE_CUDA_MISSING ""
#endif

/* The fake's own counters (fake_cuda_count), looked up in the library the
 * backend loaded. */
static long (*fc_count_fn)(const char *what);

static UT_UNUSED long fc_count(const char *what) {
  cr_assert_not_null(fc_count_fn, "the fake driver is not loaded");
  return fc_count_fn(what);
}

/* The fake's fake_cuda_hold_host_waits(on): while on, no
 * cuEventSynchronize returns (a stream's watcher asleep in one stays
 * asleep). Callable from any thread; needs the driver loaded (a manager
 * made). */
static UT_UNUSED void (*fc_host_waits_holder(void))(int) {
  void (*hold)(int) = NULL;
  void *lib = FC_HAVE_FAKE ? dlopen(UM_FAKE_CUDA_FULL, RTLD_NOW | RTLD_NOLOAD) : NULL;
  void *sym;
  cr_assert_not_null(lib, "the fake driver is not loaded");
  sym = dlsym(lib, "fake_cuda_hold_host_waits");
  memcpy(&hold, &sym, sizeof(sym));
  dlclose(lib); /* the backend keeps its own reference */
  cr_assert_not_null(hold, "fake_cuda_hold_host_waits missing");
  return hold;
}

/* Start from a clean slate of knobs, then pick the driver. */
static UT_UNUSED void fc_env(const char *library) {
  static const char *const knobs[] = {
      "FAKE_CUDA_NO_DEVICE",  "FAKE_CUDA_DEVICE_COUNT", "FAKE_CUDA_TOTAL_MEM",
      "FAKE_CUDA_NO_MANAGED", "FAKE_CUDA_STREAM_THREADS", "FAKE_CUDA_OP_DELAY_US",
      "FAKE_CUDA_NO_MEMOPS",  "UNIMEM_CUDA_GATE_KERNEL",
      "FAKE_CUDA_FAIL",       "FAKE_CUDA_FAIL_CODE",     "FAKE_CUDA_DEVICE_FAULT",
      "UNIMEM_CUDA_ASYNC_ALLOC", "FAKE_CUDA_CTX_FLAGS",   "FAKE_CUDA_CONNECTIONS"};
  if (!FC_HAVE_FAKE)
    cr_skip_test("built without the CUDA backend (cuda.h was not found at configure time): "
                 "no fake driver to test against");
  for (size_t i = 0; i < sizeof(knobs) / sizeof(knobs[0]); i++)
    cr_assert_eq(unsetenv(knobs[i]), 0);
  cr_assert_eq(setenv("UNIMEM_CUDA_LIBRARY", library, 1), 0);
}

static UT_UNUSED void fc_set(const char *name, const char *value) {
  cr_assert_eq(setenv(name, value, 1), 0);
}

/* A manager over the fake with the given options (cac_options and the
 * test's changes); looks up the fake's counters once the driver is in. */
static UT_UNUSED um_manager *fc_manager(const um_options *o) {
  um_manager *m = NULL;
  int st = um_manager_create(o, &m);
  cr_assert_eq(st, UM_OK, "um_manager_create: %s: %s", um_err_name(st), um_last_error());
  if (FC_HAVE_FAKE && fc_count_fn == NULL) {
    void *lib = dlopen(UM_FAKE_CUDA_FULL, RTLD_NOW | RTLD_NOLOAD);
    if (lib != NULL) {
      void *sym = dlsym(lib, "fake_cuda_count");
      memcpy(&fc_count_fn, &sym, sizeof(sym));
      dlclose(lib); /* the backend keeps its own reference */
    }
  }
  return m;
}

/* The default fake manager: cpu and the fake's devices, nothing else. */
static UT_UNUSED um_manager *fc_default(void) {
  um_options o;
  cac_options(&o, "cpu,cuda");
  return fc_manager(&o);
}

/* The n-th fake device of m (from 0). */
static UT_UNUSED um_device *fc_dev(um_manager *m, int n) {
  int i = cac_cuda_index(m, n);
  if (i <= 0)
    cac_log_dump();
  cr_assert(i > 0, "no CUDA device %d (the log lines are above)", n);
  return um_device_get(m, i);
}

/* Destroy with the expected status, then everything the backend made in
 * the driver must be gone, no driver call was made from a stream callback,
 * no two operations raced over the same memory, and nothing waited on an
 * event that was never recorded. */
static UT_UNUSED void fc_destroy(um_manager *m, int want) {
  int st = um_manager_destroy(m);
  cr_assert_eq(st, want, "um_manager_destroy: %s: %s", um_err_name(st), um_last_error());
  if (fc_count_fn == NULL)
    return;
  cr_assert_eq(fc_count("allocations"), 0, "driver allocations left");
  cr_assert_eq(fc_count("streams"), 0, "streams left");
  cr_assert_eq(fc_count("events"), 0, "events left");
  cr_assert_eq(fc_count("context_retains"), 0, "primary contexts still retained");
  cr_assert_eq(fc_count("calls_in_callbacks"), 0, "driver calls from stream callbacks");
  cr_assert_eq(fc_count("modules"), 0, "modules still loaded");
  cr_assert_eq(fc_count("races"), 0, "operations of two streams used the same bytes at once");
  cr_assert_eq(fc_count("unrecorded_waits"), 0, "waits on events that were never recorded");
}

#endif /* UNIMEM_FAKECUDA_UTIL_H */
