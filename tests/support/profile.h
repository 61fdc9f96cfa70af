/* The device profile of a conformance test (tests/conformance/): which
 * backend its manager opens and which device the test works on. CTest runs
 * each conformance file once per profile, naming it in UNIMEM_TEST_PROFILE:
 *   cpu         the cpu backend alone (the default)
 *   fault       the cpu and the fault-injecting test backend, no plan armed
 *   fakecuda    the CUDA backend on the fake driver (UNIMEM_CUDA_LIBRARY)
 *   pocl        OpenCL on one PoCL pthread device
 *   pocl2       OpenCL on two PoCL pthread devices in one platform
 *   pocl-basic  OpenCL on PoCL's basic device (commands run on the
 *               submitting thread)
 *   gpu         CUDA on a real GPU
 * A profile this machine cannot open skips the test, saying why. Public API
 * only: profile.c, in unimem_test_support, does what needs the inside. */
#ifndef UNIMEM_TEST_PROFILE_H
#define UNIMEM_TEST_PROFILE_H

#include "test_util.h"

#define UT_PROFILE_MAX_DEVICES 4

typedef struct ut_env {
  um_manager *m;
  um_device *dev;                          /* the profile's device: dev_of[0] */
  um_device *dev_of[UT_PROFILE_MAX_DEVICES]; /* every device of its backend */
  int ndev;
} ut_env;

/* The profile's name ("cpu" when UNIMEM_TEST_PROFILE is unset). */
const char *ut_profile(void);

/* Whether the profile is name. */
int ut_profile_is(const char *name);

/* ut_options with the profile's backends (and the environment its backend
 * reads at um_manager_create set). */
void ut_profile_options(um_options *o);

/* A manager for the profile made with o (NULL: ut_profile_options), and its
 * devices; skips the test when the profile cannot be opened here. */
ut_env ut_profile_open(const um_options *o);

/* Destroys the manager, which must succeed. */
void ut_profile_close(ut_env *e);

/* Skips the test, destroying e's manager, unless um_options.device_limit_bytes
 * caps the profile's device at limit (it caps OpenCL and CUDA devices, not
 * the cpu's nor the fault backend's). */
void ut_profile_need_cap(ut_env *e, uint64_t limit);

/* Skips the test unless the profile is name (for a check that only one
 * backend makes, where the others have their own). */
void ut_profile_only(const char *name);

#endif /* UNIMEM_TEST_PROFILE_H */
