/* The device profiles of the conformance tests (profile.h). */
/* A file of the support library, not a test program (test_util_tsan.h). */
#define UT_NO_MAIN
#include "profile.h"

#include "fault_backend.h"

/* PoCL's platform only, whatever else the machine has (opencl_util.h says
 * why). */
#define UT_POCL_PLATFORM "Portable Computing Language"

typedef struct ut_profile_def {
  const char *name;
  const char *backends; /* um_options.backends */
  const char *backend;  /* um_device_info.backend of the profile's devices */
  const char *pocl;     /* POCL_DEVICES, or NULL */
  int min_devices;
  const char *missing;  /* what to install or set when the backend is absent */
} ut_profile_def;

static const ut_profile_def ut_profiles[] = {
    {"cpu", "cpu", "cpu", NULL, 1, ""},
    {"fault", "cpu", "fault", NULL, 1, ""},
    {"fakecuda", "cpu,cuda", "cuda", NULL, 1, "UNIMEM_CUDA_LIBRARY naming the fake driver"},
    {"pocl", "cpu,opencl", "opencl", "pthread", 1, "pocl-opencl-icd"},
    {"pocl2", "cpu,opencl", "opencl", "pthread pthread", 2, "pocl-opencl-icd"},
    {"pocl-basic", "cpu,opencl", "opencl", "basic", 1, "pocl-opencl-icd"},
    {"gpu", "cpu,cuda", "cuda", NULL, 1, "an NVIDIA GPU and its driver"},
};

const char *ut_profile(void) {
  const char *p = getenv("UNIMEM_TEST_PROFILE");
  return p == NULL || p[0] == '\0' ? "cpu" : p;
}

int ut_profile_is(const char *name) { return strcmp(ut_profile(), name) == 0; }

static const ut_profile_def *ut_profile_def_get(void) {
  for (size_t i = 0; i < sizeof(ut_profiles) / sizeof(ut_profiles[0]); i++)
    if (ut_profile_is(ut_profiles[i].name))
      return &ut_profiles[i];
  cr_assert_fail("UNIMEM_TEST_PROFILE=%s: no such profile (profile.h lists them)", ut_profile());
  return NULL;
}

void ut_profile_options(um_options *o) {
  const ut_profile_def *p = ut_profile_def_get();
  ut_options_on(o, p->backends);
  if (p->pocl != NULL) {
    /* Read by PoCL when it loads, inside um_manager_create: every test runs
     * in its own process, so setting them here is early enough. */
    setenv("POCL_DEVICES", p->pocl, 1);
    setenv("UNIMEM_OPENCL_PLATFORM", UT_POCL_PLATFORM, 1);
  }
}

/* The manager's devices of the profile's backend, in manager order. */
static void ut_profile_devices(ut_env *e, const char *backend) {
  for (int i = 0; i < um_device_count(e->m) && e->ndev < UT_PROFILE_MAX_DEVICES; i++) {
    um_device_info info;
    um_device *d = um_device_get(e->m, i);
    cr_assert_eq(um_device_info_get(d, &info), UM_OK);
    if (strcmp(info.backend, backend) == 0)
      e->dev_of[e->ndev++] = d;
  }
  e->dev = e->dev_of[0];
}

ut_env ut_profile_open(const um_options *o) {
  const ut_profile_def *p = ut_profile_def_get();
  ut_env e;
  um_options own;
  int st;
  memset(&e, 0, sizeof(e));
  if (o == NULL) {
    ut_profile_options(&own);
    o = &own;
  }
  if (strcmp(p->name, "fault") == 0) {
    fault_reset();
    st = fault_manager_create(o, &e.m);
  } else {
    st = um_manager_create(o, &e.m);
  }
  cr_assert_eq(st, UM_OK, "profile %s: um_manager_create: %s", p->name, um_last_error());
  ut_profile_devices(&e, p->backend);
  if (e.ndev < p->min_devices) {
    int n = e.ndev;
    um_manager_destroy(e.m);
    cr_skip_test("SKIPPED: profile %s needs %d %s device(s), this machine gives %d (%s)", p->name,
                 p->min_devices, p->backend, n, p->missing);
  }
  return e;
}

void ut_profile_close(ut_env *e) {
  cr_assert_eq(um_manager_destroy(e->m), UM_OK, "um_manager_destroy: %s", um_last_error());
  e->m = NULL;
}

void ut_profile_need_cap(ut_env *e, uint64_t limit) {
  uint64_t total = 0;
  cr_assert_eq(um_device_memory(e->dev, NULL, &total), UM_OK);
  if (total != limit) {
    ut_profile_close(e);
    cr_skip_test("SKIPPED: device_limit_bytes caps OpenCL and CUDA devices only (profile %s: %llu bytes)",
                 ut_profile(), (unsigned long long)total);
  }
}

void ut_profile_only(const char *name) {
  if (!ut_profile_is(name))
    cr_skip_test("SKIPPED: a check of the %s profile alone (this run: %s)", name, ut_profile());
}
