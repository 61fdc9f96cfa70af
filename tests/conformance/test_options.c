/* Options: the defaults, UNIMEM_* environment overrides (values with
 * k/m/g suffixes, booleans, names), bad values ignored with a warning, and
 * invalid options refused by um_manager_create. Criterion runs each test in
 * its own process, so setenv here never reaches another test. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test_util.h"

extern char **environ;

#define MiB (1024ull * 1024ull)
#define GiB (1024ull * MiB)

/* Start from a clean environment: no UNIMEM_* variable from the caller. */
static void clear_unimem_env(void) {
  char names[64][128];
  int n = 0;
  for (char **e = environ; *e != NULL && n < 64; e++)
    if (strncmp(*e, "UNIMEM_", 7) == 0) {
      size_t len = strcspn(*e, "=");
      if (len < sizeof(names[0])) {
        memcpy(names[n], *e, len);
        names[n][len] = '\0';
        n++;
      }
    }
  for (int i = 0; i < n; i++)
    unsetenv(names[i]);
}

TestSuite(options, .init = clear_unimem_env);

Test(options, defaults) {
  um_options o;
  memset(&o, 0xa5, sizeof(o));
  um_options_init(&o);
  cr_assert_eq(o.enable_pooling, 1);
  cr_assert_eq(o.max_pool_bytes, 2 * GiB);
  cr_assert_eq(o.max_pool_bytes_per_class, 1 * GiB);
  cr_assert_eq(o.trim_interval_ms, 300000);
  cr_assert_eq(o.max_concurrent_transfers, 4);
  cr_assert_eq(o.use_pinned_staging, 1);
  cr_assert_eq(o.staging_chunk_bytes, 4 * MiB);
  cr_assert_eq(o.pinned_pool_bytes, 64 * MiB);
  cr_assert_eq(o.enable_peer, 1);
  cr_assert_eq(o.trim_on_pressure, 1);
  cr_assert_eq(o.scrub, 0);
  cr_assert_eq(o.debug, 0);
  cr_assert_eq(o.huge_pages, 1);
  cr_assert_eq(o.device_limit_bytes, 0);
  cr_assert_eq(o.net_timeout_ms, 10000);
  cr_assert_eq(o.wait_spin_ns, 0, "waits sleep at once by default");
  cr_assert_str_eq(o.backends, "");
  cr_assert_eq(o.log_level, UM_LOG_WARN);
  cr_assert_null(o.log);
  cr_assert_null(o.log_ctx);
  cr_assert_null(o.on_oom);
  cr_assert_null(o.oom_ctx);
}

Test(options, env_overrides) {
  um_options o;
  setenv("UNIMEM_MAX_POOL_BYTES", "64m", 1);
  setenv("UNIMEM_MAX_POOL_BYTES_PER_CLASS", "512K", 1);
  setenv("UNIMEM_BACKENDS", "cpu", 1);
  setenv("UNIMEM_ENABLE_POOLING", "0", 1);
  setenv("UNIMEM_TRIM_INTERVAL_MS", "50", 1);
  setenv("UNIMEM_MAX_CONCURRENT_TRANSFERS", "7", 1);
  setenv("UNIMEM_USE_PINNED_STAGING", "off", 1);
  setenv("UNIMEM_STAGING_CHUNK_BYTES", "1mb", 1);
  setenv("UNIMEM_PINNED_POOL_BYTES", "2g", 1);
  setenv("UNIMEM_ENABLE_PEER", "false", 1);
  setenv("UNIMEM_TRIM_ON_PRESSURE", "no", 1);
  setenv("UNIMEM_SCRUB", "yes", 1);
  setenv("UNIMEM_DEBUG", "TRUE", 1);
  setenv("UNIMEM_HUGE_PAGES", "on", 1);
  setenv("UNIMEM_DEVICE_LIMIT_BYTES", "0x1000", 1);
  setenv("UNIMEM_LOG_LEVEL", "debug", 1);
  um_options_init(&o);
  cr_assert_eq(o.max_pool_bytes, 64 * MiB);
  cr_assert_eq(o.max_pool_bytes_per_class, 512 * 1024);
  cr_assert_str_eq(o.backends, "cpu");
  cr_assert_eq(o.enable_pooling, 0);
  cr_assert_eq(o.trim_interval_ms, 50);
  cr_assert_eq(o.max_concurrent_transfers, 7);
  cr_assert_eq(o.use_pinned_staging, 0);
  cr_assert_eq(o.staging_chunk_bytes, 1 * MiB);
  cr_assert_eq(o.pinned_pool_bytes, 2 * GiB);
  cr_assert_eq(o.enable_peer, 0);
  cr_assert_eq(o.trim_on_pressure, 0);
  cr_assert_eq(o.scrub, 1);
  cr_assert_eq(o.debug, 1);
  cr_assert_eq(o.huge_pages, 1);
  cr_assert_eq(o.device_limit_bytes, 4096);
  cr_assert_eq(o.log_level, UM_LOG_DEBUG);
}

Test(options, env_suffixes_and_levels) {
  um_options o;
  setenv("UNIMEM_MAX_POOL_BYTES", "3G", 1);
  setenv("UNIMEM_LOG_LEVEL", "2", 1);
  um_options_init(&o);
  cr_assert_eq(o.max_pool_bytes, 3 * GiB);
  cr_assert_eq(o.log_level, UM_LOG_INFO);
  setenv("UNIMEM_MAX_POOL_BYTES", "1t", 1);
  setenv("UNIMEM_LOG_LEVEL", "Error", 1);
  um_options_init(&o);
  cr_assert_eq(o.max_pool_bytes, 1024 * GiB);
  cr_assert_eq(o.log_level, UM_LOG_ERROR);
  setenv("UNIMEM_MAX_POOL_BYTES", "12345", 1);
  um_options_init(&o);
  cr_assert_eq(o.max_pool_bytes, 12345);
}

/* Run um_options_init with stderr going to a file; return what it wrote. */
static void init_capturing_stderr(um_options *o, char *out, size_t cap) {
  char path[] = "/tmp/unimem-options-XXXXXX";
  int fd = mkstemp(path), saved;
  ssize_t n;
  cr_assert_geq(fd, 0);
  fflush(stderr);
  saved = dup(2);
  cr_assert_geq(saved, 0);
  cr_assert_geq(dup2(fd, 2), 0);
  um_options_init(o);
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  n = pread(fd, out, cap - 1, 0);
  out[n > 0 ? n : 0] = '\0';
  close(fd);
  unlink(path);
}

Test(options, bad_values_ignored) {
  static const struct {
    const char *name, *value;
  } bad[] = {
      {"UNIMEM_MAX_POOL_BYTES", "lots"},
      {"UNIMEM_MAX_POOL_BYTES_PER_CLASS", "-5"},
      {"UNIMEM_ENABLE_POOLING", "maybe"},
      {"UNIMEM_TRIM_INTERVAL_MS", "5g"}, /* more than 32 bits */
      {"UNIMEM_MAX_CONCURRENT_TRANSFERS", "5000"},
      {"UNIMEM_STAGING_CHUNK_BYTES", "4q"},
      {"UNIMEM_PINNED_POOL_BYTES", ""},
      {"UNIMEM_SCRUB", "2"},
      {"UNIMEM_LOG_LEVEL", "loud"},
      {"UNIMEM_DEVICE_LIMIT_BYTES", "99999999999999999999999"},
      {"UNIMEM_WAIT_SPIN_NS", "1000000001"}, /* more than 1 s */
  };
  um_options o, def;
  char err[8192];
  clear_unimem_env();
  um_options_init(&def);
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
    setenv(bad[i].name, bad[i].value, 1);
  init_capturing_stderr(&o, err, sizeof(err));
  cr_assert_eq(memcmp(&o, &def, sizeof(o)), 0, "a bad value changed an option");
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
    cr_assert_not_null(strstr(err, bad[i].name), "no warning for %s in: %s", bad[i].name, err);
  /* a bad value does not stop the good ones */
  setenv("UNIMEM_MAX_POOL_BYTES", "8m", 1);
  init_capturing_stderr(&o, err, sizeof(err));
  cr_assert_eq(o.max_pool_bytes, 8 * MiB);
  cr_assert_eq(o.enable_pooling, 1);
}

/* UNIMEM_WAIT_SPIN_NS: nanoseconds up to 1 s; anything else is ignored
 * with a warning and leaves the default (0, no spinning). */
Test(options, wait_spin_ns_from_env) {
  static const struct {
    const char *value;
    uint32_t want;
  } good[] = {{"0", 0}, {"50000", 50000}, {"1000000000", 1000000000u}, {" 7", 7}};
  static const char *const bad[] = {"1000000001", "4294967296", "99999999999999999999999", "fast",
                                    "-1", "", "1.5", "50us", "2k", "0x10"};
  um_options o;
  char err[1024];
  for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
    setenv("UNIMEM_WAIT_SPIN_NS", good[i].value, 1);
    init_capturing_stderr(&o, err, sizeof(err));
    cr_assert_eq(o.wait_spin_ns, good[i].want, "UNIMEM_WAIT_SPIN_NS=%s gave %u", good[i].value,
                 (unsigned)o.wait_spin_ns);
    cr_assert_str_eq(err, "", "warned for %s: %s", good[i].value, err);
  }
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    setenv("UNIMEM_WAIT_SPIN_NS", bad[i], 1);
    init_capturing_stderr(&o, err, sizeof(err));
    cr_assert_eq(o.wait_spin_ns, 0, "UNIMEM_WAIT_SPIN_NS=\"%s\" gave %u", bad[i], (unsigned)o.wait_spin_ns);
    cr_assert_not_null(strstr(err, "UNIMEM_WAIT_SPIN_NS"), "no warning for \"%s\": %s", bad[i], err);
  }
  /* and a manager made from the environment waits with it */
  {
    um_manager *m;
    um_options got;
    setenv("UNIMEM_WAIT_SPIN_NS", "75000", 1);
    setenv("UNIMEM_BACKENDS", "cpu", 1);
    cr_assert_eq(um_manager_create(NULL, &m), UM_OK, "%s", um_last_error());
    cr_assert_eq(um_manager_options(m, &got), UM_OK);
    cr_assert_eq(got.wait_spin_ns, 75000);
    cr_assert_eq(um_manager_destroy(m), UM_OK);
  }
}

/* A manager created with NULL options takes the environment. */
Test(options, manager_from_env) {
  um_manager *m;
  um_options got;
  um_buffer *b;
  setenv("UNIMEM_BACKENDS", "cpu", 1);
  setenv("UNIMEM_ENABLE_POOLING", "0", 1);
  setenv("UNIMEM_MAX_POOL_BYTES", "64m", 1);
  setenv("UNIMEM_TRIM_INTERVAL_MS", "0", 1);
  cr_assert_eq(um_manager_create(NULL, &m), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_device_count(m), 1);
  cr_assert_eq(um_manager_options(m, &got), UM_OK);
  cr_assert_eq(got.enable_pooling, 0);
  cr_assert_eq(got.max_pool_bytes, 64 * MiB);
  cr_assert_str_eq(got.backends, "cpu");
  cr_assert_eq(um_alloc(m, um_device_get(m, 0), 1000, UM_HOST, 0, &b), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(ut_stats(m, NULL).bytes_pooled, 0, "UNIMEM_ENABLE_POOLING=0 took effect");
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* The manager copies the options: changing the caller's struct later has
 * no effect. */
Test(options, manager_copies_options) {
  um_options o, got;
  um_manager *m;
  um_options_init(&o);
  snprintf(o.backends, sizeof(o.backends), "cpu");
  o.max_pool_bytes = 12345;
  cr_assert_eq(um_manager_create(&o, &m), UM_OK);
  o.max_pool_bytes = 1;
  cr_assert_eq(um_manager_options(m, &got), UM_OK);
  cr_assert_eq(got.max_pool_bytes, 12345);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* An unknown backend name selects nothing; the cpu is always device 0. */
Test(options, unknown_backend_leaves_cpu) {
  um_options o;
  um_manager *m;
  um_device_info info;
  um_options_init(&o);
  snprintf(o.backends, sizeof(o.backends), "nonesuch");
  cr_assert_eq(um_manager_create(&o, &m), UM_OK);
  cr_assert_eq(um_device_count(m), 1);
  cr_assert_eq(um_device_info_get(um_device_get(m, 0), &info), UM_OK);
  cr_assert_str_eq(info.backend, "cpu");
  cr_assert_eq(info.index, 0);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

static void expect_refused(const um_options *o, const char *what) {
  um_manager *m = (um_manager *)(uintptr_t)0x1234;
  cr_assert_eq(um_manager_create(o, &m), UM_EINVAL, "%s accepted", what);
  cr_assert_eq(m, (um_manager *)(uintptr_t)0x1234, "%s: out written on failure", what);
  cr_assert_neq(um_last_error()[0], '\0');
}

Test(options, invalid_options_refused) {
  um_options o;
  ut_options(&o);
  o.max_concurrent_transfers = 0;
  expect_refused(&o, "max_concurrent_transfers=0");
  cr_assert_not_null(strstr(um_last_error(), "max_concurrent_transfers"), "%s", um_last_error());
  ut_options(&o);
  o.max_concurrent_transfers = -1;
  expect_refused(&o, "max_concurrent_transfers=-1");
  ut_options(&o);
  o.max_concurrent_transfers = 1025;
  expect_refused(&o, "max_concurrent_transfers=1025");
  ut_options(&o);
  o.staging_chunk_bytes = 100;
  expect_refused(&o, "staging_chunk_bytes=100");
  ut_options(&o);
  o.log_level = (um_log_level)9;
  expect_refused(&o, "log_level=9");
  ut_options(&o);
  memset(o.backends, 'a', sizeof(o.backends));
  expect_refused(&o, "backends without a NUL");
  ut_options(&o);
  o.wait_spin_ns = 1000000001u;
  expect_refused(&o, "wait_spin_ns=1000000001");
  cr_assert_not_null(strstr(um_last_error(), "wait_spin_ns"), "%s", um_last_error());
  ut_options(&o);
  o.wait_spin_ns = UINT32_MAX;
  expect_refused(&o, "wait_spin_ns=UINT32_MAX");
  /* the limits themselves are fine */
  ut_options(&o);
  o.max_concurrent_transfers = 1;
  o.wait_spin_ns = 1000000000u;
  {
    um_manager *m;
    cr_assert_eq(um_manager_create(&o, &m), UM_OK);
    cr_assert_eq(um_manager_destroy(m), UM_OK);
  }
}
