/* SPEC section 5, bad input: every public function answers a bad argument
 * with its exact code, never a crash, writes no out-parameter, and leaves
 * the manager as it was (every statistics field, in total and per device,
 * identical before and after the call). Suite errors_dev runs on every
 * profile's device (profile.h): allocations, ranges, maps, released
 * buffers and batches on its DEVICE buffers, each location it lacks, HOST
 * memory of it, and (where device_limit_bytes caps it: OpenCL, CUDA) memory
 * pressure. Suite errors, on the cpu profile alone, checks what no device
 * takes part in: codes, NULL managers and handles, wraps, files, events,
 * two managers, the discrete test devices. */
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bytes.h"
#include "profile.h"

/* The manager and device of the running suite: the cpu-only manager and
 * its cpu (errors), or the profile's (errors_dev). */
static um_manager *m;
static um_device *dev;

static void setup_cpu(void) {
  ut_profile_only("cpu");
  m = ut_manager();
  dev = um_device_get(m, 0);
  cr_assert_not_null(dev);
}

static ut_env env;

static void setup_dev(void) {
  env = ut_profile_open(NULL);
  m = env.m;
  dev = env.dev;
}

/* A skipped suite made no manager. */
static void teardown(void) {
  if (m != NULL)
    cr_assert_eq(um_manager_destroy(m), UM_OK, "%s", um_last_error());
  m = NULL;
}

TestSuite(errors, .init = setup_cpu, .fini = teardown);
TestSuite(errors_dev, .init = setup_dev, .fini = teardown);

/* A pointer no call may ever write through: out-parameters keep it on
 * failure. */
#define SENTINEL ((void *)(uintptr_t)0x5e5e5e5eu)

/* The call fails with exactly `code`, sets um_last_error(), and manager mm
 * is unchanged. */
#define FAILS(mm, code, call)                                                  \
  do {                                                                         \
    ut_snapshot before_ = ut_snap(mm);                                         \
    int st_ = (call);                                                          \
    cr_assert_eq(st_, (code), "%s returned %s, expected %s (%s)", #call,       \
                 um_err_name(st_), um_err_name(code), um_last_error());        \
    cr_assert_neq(um_last_error()[0], '\0', "%s: no um_last_error text",       \
                  #call);                                                      \
    ut_assert_unchanged(mm, before_);                                          \
  } while (0)

/* A zeroed HOST buffer on the cpu, so a test can tell that nothing wrote
 * it. */
static um_buffer *alloc_host(size_t n) {
  um_buffer *b = NULL;
  cr_assert_eq(um_alloc(m, dev, n, UM_HOST, UM_ALLOC_ZERO, &b), UM_OK);
  cr_assert(ut_all_bytes(um_buffer_host_ptr(b), n, 0));
  return b;
}

/* Whether b's first n bytes, read back, are all v. */
static int reads_all(um_buffer *b, size_t n, unsigned char v) {
  unsigned char *p = ub_malloc(n);
  int all;
  cr_assert_eq(um_copy_to_host(b, 0, p, n, NULL), UM_OK, "read back: %s", um_last_error());
  all = ut_all_bytes(p, n, v);
  free(p);
  return all;
}

/* A zeroed DEVICE buffer on the suite's device (no host view on most), so
 * a test can tell, reading it back, that nothing wrote it. */
static um_buffer *alloc_zeroed(size_t n) {
  um_buffer *b = NULL;
  cr_assert_eq(um_alloc(m, dev, n, UM_DEVICE, UM_ALLOC_ZERO, &b), UM_OK, "%s", um_last_error());
  cr_assert(reads_all(b, n, 0));
  return b;
}

/* ------------------------------------------------------------------------ */
/* Status codes */

static const struct {
  int code;
  const char *name;
  const char *text;
} codes[] = {
#define CODE_ROW_(name, value, text) {value, "UM_" #name, text},
    UM_ERRNO_MAP(CODE_ROW_)
#undef CODE_ROW_
};

Test(errors, every_code_has_name_and_text) {
  cr_assert_eq(sizeof(codes) / sizeof(codes[0]), 13);
  for (size_t i = 0; i < sizeof(codes) / sizeof(codes[0]); i++) {
    cr_assert_str_eq(um_err_name(codes[i].code), codes[i].name);
    cr_assert_str_eq(um_strerror(codes[i].code), codes[i].text);
    cr_assert_neq(strcmp(um_strerror(codes[i].code), "unknown status"), 0);
    cr_assert(codes[i].code == 0 ? i == 0 : codes[i].code < 0);
    for (size_t j = 0; j < i; j++)
      cr_assert_neq(codes[i].code, codes[j].code, "two codes share a value");
  }
  cr_assert_str_eq(um_err_name(UM_OK), "UM_OK");
  cr_assert_str_eq(um_err_name(UM_EINVAL), "UM_EINVAL");
  cr_assert_str_eq(um_err_name(UM_ELEAK), "UM_ELEAK");
  cr_assert_str_eq(um_strerror(UM_ERANGE), "offset or length outside the buffer");
  cr_assert_eq(UM_OK, 0);
  cr_assert_eq(UM_ELEAK, -12);
}

Test(errors, unknown_code) {
  const int unknown[] = {1, 7, -13, -100, INT_MIN, INT_MAX};
  for (size_t i = 0; i < sizeof(unknown) / sizeof(unknown[0]); i++) {
    cr_assert_str_eq(um_err_name(unknown[i]), "UM_UNKNOWN");
    cr_assert_str_eq(um_strerror(unknown[i]), "unknown status");
  }
}

Test(errors, last_error_set_by_failure) {
  um_buffer *b = SENTINEL;
  cr_assert_eq(um_alloc(m, dev, 0, UM_HOST, 0, &b), UM_EINVAL);
  cr_assert_neq(um_last_error()[0], '\0');
  cr_assert_not_null(strstr(um_last_error(), "zero"), "%s", um_last_error());
  cr_assert_eq(um_alloc_array(m, dev, SIZE_MAX, 2, UM_HOST, 0, &b), UM_EOVERFLOW);
  cr_assert_not_null(strstr(um_last_error(), "overflow"), "%s", um_last_error());
  cr_assert_eq(b, SENTINEL);
}

/* ------------------------------------------------------------------------ */
/* Manager, devices, statistics, pool: NULL arguments */

Test(errors, manager_null) {
  um_options o;
  um_manager *out = SENTINEL;
  ut_options(&o);
  cr_assert_eq(um_manager_create(&o, NULL), UM_EINVAL);
  cr_assert_eq(um_manager_create(NULL, NULL), UM_EINVAL);
  cr_assert_eq(um_manager_destroy(NULL), UM_EINVAL);
  FAILS(m, UM_EINVAL, um_manager_options(NULL, &o));
  FAILS(m, UM_EINVAL, um_manager_options(m, NULL));
  cr_assert_eq(out, SENTINEL);
  um_options_init(NULL); /* no crash */
}

Test(errors, device_null_and_range) {
  um_device_info info;
  uint64_t f = 0, t = 0;
  FAILS(m, UM_EINVAL, um_device_count(NULL));
  cr_assert_null(um_device_get(NULL, 0));
  cr_assert_null(um_device_get(m, -1));
  cr_assert_null(um_device_get(m, 1));
  cr_assert_null(um_device_get(m, INT_MAX));
  FAILS(m, UM_EINVAL, um_device_info_get(NULL, &info));
  FAILS(m, UM_EINVAL, um_device_info_get(dev, NULL));
  FAILS(m, UM_EINVAL, um_device_memory(NULL, &f, &t));
  FAILS(m, UM_EINVAL, um_device_memory(dev, NULL, NULL));
  FAILS(m, UM_EINVAL, um_device_synchronize(NULL));
  /* either figure alone is fine */
  cr_assert_eq(um_device_memory(dev, &f, NULL), UM_OK);
  cr_assert_eq(um_device_memory(dev, NULL, &t), UM_OK);
  cr_assert_gt(t, 0);
}

Test(errors, stats_null) {
  um_stats s;
  char buf[16];
  FAILS(m, UM_EINVAL, um_stats_get(NULL, NULL, &s));
  FAILS(m, UM_EINVAL, um_stats_get(m, dev, NULL));
  FAILS(m, UM_EINVAL, um_stats_get(m, NULL, NULL));
  s = ut_stats(m, NULL);
  FAILS(m, UM_EINVAL, um_stats_json(NULL, buf, sizeof(buf)));
  FAILS(m, UM_EINVAL, um_stats_json(&s, NULL, sizeof(buf)));
  /* NULL with no capacity asks for the length, like snprintf */
  cr_assert_gt(um_stats_json(&s, NULL, 0), 0);
}

Test(errors, pool_trim_null) { FAILS(m, UM_EINVAL, um_pool_trim(NULL, 0)); }

Test(errors, peer_null) {
  FAILS(m, UM_EINVAL, um_peer_enable(NULL, dev));
  FAILS(m, UM_EINVAL, um_peer_enable(dev, NULL));
  FAILS(m, UM_EINVAL, um_peer_enabled(NULL, dev));
  FAILS(m, UM_EINVAL, um_peer_enabled(dev, NULL));
  FAILS(m, UM_EINVAL, um_peer_possible(NULL, NULL));
  cr_assert_eq(um_peer_enable(dev, dev), UM_OK);
  cr_assert_eq(um_peer_enabled(dev, dev), 1);
}

/* ------------------------------------------------------------------------ */
/* Allocation */

Test(errors_dev, alloc_null) {
  um_buffer *b = SENTINEL;
  FAILS(m, UM_EINVAL, um_alloc(NULL, dev, 64, UM_HOST, 0, &b));
  FAILS(m, UM_EINVAL, um_alloc(m, NULL, 64, UM_HOST, 0, &b));
  FAILS(m, UM_EINVAL, um_alloc(m, dev, 64, UM_HOST, 0, NULL));
  FAILS(m, UM_EINVAL, um_alloc_at(m, NULL, 64, UM_HOST, 0, &b, __FILE__, __LINE__));
  FAILS(m, UM_EINVAL, um_alloc_array(NULL, dev, 4, 4, UM_HOST, 0, &b));
  FAILS(m, UM_EINVAL, um_alloc_array(m, NULL, 4, 4, UM_HOST, 0, &b));
  FAILS(m, UM_EINVAL, um_alloc_array(m, dev, 4, 4, UM_HOST, 0, NULL));
  FAILS(m, UM_EINVAL, um_alloc_array_at(m, dev, 4, 4, UM_HOST, 0, NULL, __FILE__, __LINE__));
  cr_assert_eq(b, SENTINEL);
}

Test(errors_dev, alloc_zero_size) {
  um_buffer *b = SENTINEL;
  FAILS(m, UM_EINVAL, um_alloc(m, dev, 0, UM_HOST, 0, &b));
  FAILS(m, UM_EINVAL, um_alloc(m, dev, 0, UM_DEVICE, UM_ALLOC_UNPOOLED, &b));
  FAILS(m, UM_EINVAL, um_alloc_array(m, dev, 0, 8, UM_HOST, 0, &b));
  FAILS(m, UM_EINVAL, um_alloc_array(m, dev, 8, 0, UM_HOST, 0, &b));
  FAILS(m, UM_EINVAL, um_alloc_array(m, dev, 0, 0, UM_HOST, 0, &b));
  cr_assert_eq(b, SENTINEL);
}

Test(errors_dev, alloc_unknown_location) {
  um_buffer *b = SENTINEL;
  FAILS(m, UM_EINVAL, um_alloc(m, dev, 64, (um_location)UM_LOCATION_COUNT, 0, &b));
  FAILS(m, UM_EINVAL, um_alloc(m, dev, 64, (um_location)-1, 0, &b));
  FAILS(m, UM_EINVAL, um_alloc(m, dev, 64, (um_location)1000, 0, &b));
  FAILS(m, UM_EINVAL, um_alloc_array(m, dev, 8, 8, (um_location)4, 0, &b));
  cr_assert_eq(b, SENTINEL);
}

Test(errors_dev, alloc_unknown_flags) {
  um_buffer *b = SENTINEL;
  FAILS(m, UM_EINVAL, um_alloc(m, dev, 64, UM_HOST, 1u << 2, &b));
  FAILS(m, UM_EINVAL, um_alloc(m, dev, 64, UM_HOST, UM_ALLOC_ZERO | (1u << 31), &b));
  FAILS(m, UM_EINVAL, um_alloc_array(m, dev, 8, 8, UM_HOST, 0x10, &b));
  cr_assert_eq(b, SENTINEL);
}

Test(errors_dev, alloc_array_overflow) {
  um_buffer *b = SENTINEL;
  FAILS(m, UM_EOVERFLOW, um_alloc_array(m, dev, SIZE_MAX, 2, UM_HOST, 0, &b));
  FAILS(m, UM_EOVERFLOW, um_alloc_array(m, dev, 2, SIZE_MAX, UM_HOST, 0, &b));
  FAILS(m, UM_EOVERFLOW, um_alloc_array(m, dev, SIZE_MAX / 2 + 1, 2, UM_DEVICE, 0, &b));
  FAILS(m, UM_EOVERFLOW, um_alloc_array(m, dev, (SIZE_MAX >> 16) + 1, (size_t)1 << 16, UM_HOST, 0, &b));
  FAILS(m, UM_EOVERFLOW,
        um_alloc_array_at(m, dev, SIZE_MAX, SIZE_MAX, UM_HOST, 0, &b, __FILE__, __LINE__));
  cr_assert_eq(b, SENTINEL);
  /* the largest product that fits is not an overflow */
  cr_assert_eq(um_alloc_array(m, dev, 1000, 4, UM_HOST, 0, &b), UM_OK);
  cr_assert_eq(um_buffer_size(b), 4000);
  cr_assert_eq(um_release(b), UM_OK);
}

/* More than any device has: refused without touching the pool. */
Test(errors_dev, alloc_impossibly_large) {
  um_buffer *b = SENTINEL;
  FAILS(m, UM_ENOMEM, um_alloc(m, dev, SIZE_MAX, UM_HOST, 0, &b));
  FAILS(m, UM_ENOMEM, um_alloc(m, dev, ((size_t)1 << 62) + 1, UM_DEVICE, 0, &b));
  FAILS(m, UM_ENOMEM, um_alloc_array(m, dev, (size_t)1 << 40, (size_t)1 << 23, UM_HOST, 0, &b));
  cr_assert_eq(b, SENTINEL);
}

/* Every location a device of the profile lacks: UM_ENOTSUP, pooled or not,
 * nothing counted; UNIFIED is offered exactly when the device says it can
 * (UM_CAP_UNIFIED: fine-grained SVM on OpenCL, managed memory on CUDA). */
Test(errors_dev, locations_not_offered) {
  for (int i = 0; i < um_device_count(m); i++) {
    um_device *d = um_device_get(m, i);
    um_device_info info;
    cr_assert_eq(um_device_info_get(d, &info), UM_OK);
    cr_assert_neq(info.locations & (1u << UM_HOST), 0u, "HOST is every device's (SPEC §5)");
    cr_assert_eq(!!(info.locations & (1u << UM_UNIFIED)), !!(info.caps & UM_CAP_UNIFIED), "device %d", i);
    for (int loc = 0; loc < UM_LOCATION_COUNT; loc++) {
      um_buffer *b = SENTINEL;
      if (info.locations & (1u << loc))
        continue;
      FAILS(m, UM_ENOTSUP, um_alloc(m, d, 4096, (um_location)loc, 0, &b));
      FAILS(m, UM_ENOTSUP, um_alloc(m, d, 4096, (um_location)loc, UM_ALLOC_UNPOOLED, &b));
      FAILS(m, UM_ENOTSUP, um_alloc_array(m, d, 16, 16, (um_location)loc, UM_ALLOC_ZERO, &b));
      cr_assert_eq(b, SENTINEL);
    }
  }
}

/* HOST on any device is pageable host memory, with a host view, accounted
 * to that device and not to the cpu (SPEC §5). */
Test(errors_dev, host_location_is_host_memory_of_the_device) {
  um_device *cpu = um_device_get(m, 0);
  um_buffer *b = NULL;
  um_stats before, after, cpu_before, cpu_after;
  unsigned char back[4096];
  before = ut_stats(m, dev);
  cpu_before = ut_stats(m, cpu);
  cr_assert_eq(um_alloc(m, dev, 4096, UM_HOST, 0, &b), UM_OK);
  cr_assert_not_null(um_buffer_host_ptr(b), "a host view");
  cr_assert_eq(um_buffer_device(b), dev);
  memset(um_buffer_host_ptr(b), 0x3C, 4096);
  cr_assert_eq(um_copy_to_host(b, 0, back, sizeof(back), NULL), UM_OK);
  cr_assert(ut_all_bytes(back, sizeof(back), 0x3C));
  after = ut_stats(m, dev);
  cpu_after = ut_stats(m, cpu);
  cr_assert_eq(after.allocations, before.allocations + 1);
  cr_assert_eq(after.bytes_reserved, before.bytes_reserved + ut_class(4096), "accounted to the device");
  if (dev != cpu)
    cr_assert_eq(cpu_after.bytes_reserved, cpu_before.bytes_reserved, "not to the cpu device");
  cr_assert_eq(um_release(b), UM_OK);
}

/* ------------------------------------------------------------------------ */
/* Memory pressure: device_limit_bytes caps the DEVICE memory of OpenCL and
 * CUDA devices (not host memory, nor the cpu's), so these run where the
 * profile's device is one of those, and skip, saying so, elsewhere. */

#define MiB (1024u * 1024u)

static ut_env limited_open(uint64_t limit, int trim_on_pressure, int pooling, um_oom_fn on_oom) {
  um_options o;
  ut_env e;
  ut_profile_options(&o);
  o.device_limit_bytes = limit;
  o.trim_on_pressure = trim_on_pressure;
  o.enable_pooling = pooling;
  o.on_oom = on_oom;
  e = ut_profile_open(&o);
  ut_profile_need_cap(&e, limit);
  return e;
}

/* device_limit_bytes = 8 MiB. A released 4 MiB block idles in the pool;
 * asking for 6 MiB more passes the limit, so the pool releases its idle
 * blocks and the retry succeeds. */
Test(errors_pressure, pressure_releases_pooled_blocks_and_retries) {
  ut_env e = limited_open(8 * MiB, 1, 1, NULL);
  um_buffer *a = NULL, *b = NULL, *c = NULL;
  um_stats s0, s1, s2;
  uint64_t free_bytes = 0, total = 0;
  cr_assert_eq(um_device_memory(e.dev, &free_bytes, &total), UM_OK);
  cr_assert_eq(total, 8 * MiB);
  cr_assert_eq(free_bytes, 8 * MiB);

  a = ub_alloc(e.m, e.dev, 4 * MiB, UM_DEVICE);
  cr_assert_eq(um_release(a), UM_OK);
  s0 = ut_stats(e.m, e.dev);
  cr_assert_eq(s0.bytes_pooled, 4 * MiB, "the block idles in the pool");
  cr_assert_eq(s0.bytes_reserved, 4 * MiB);

  cr_assert_eq(um_alloc(e.m, e.dev, 6 * MiB, UM_DEVICE, 0, &b), UM_OK, "%s", um_last_error());
  s1 = ut_stats(e.m, e.dev);
  cr_assert_eq(s1.oom_retries - s0.oom_retries, 1, "one trim-and-retry");
  cr_assert_eq(s1.trims - s0.trims, 1, "the idle block was trimmed");
  cr_assert_eq(s1.bytes_trimmed - s0.bytes_trimmed, 4 * MiB);
  cr_assert_eq(s1.bytes_pooled, 0);
  cr_assert_eq(s1.device_frees - s0.device_frees, 1);
  cr_assert_eq(s1.bytes_reserved, 6 * MiB);
  cr_assert_eq(um_device_memory(e.dev, &free_bytes, &total), UM_OK);
  cr_assert_eq(free_bytes, 2 * MiB);

  /* With 6 MiB live and nothing idle, 4 MiB more cannot be had. */
  cr_assert_eq(um_alloc(e.m, e.dev, 4 * MiB, UM_DEVICE, 0, &c), UM_ENOMEM);
  cr_assert(strstr(um_last_error(), "device_limit_bytes") != NULL, "last error: %s", um_last_error());
  s2 = ut_stats(e.m, e.dev);
  cr_assert_eq(s2.oom_retries - s1.oom_retries, 1);
  cr_assert_eq(s2.trims, s1.trims, "nothing was idle to trim");
  cr_assert_eq(s2.bytes_reserved, 6 * MiB);
  cr_assert_eq(s2.active_buffers, 1);

  /* The live buffer works, and once released the 4 MiB fits again. */
  {
    unsigned char *p = ub_malloc(6 * MiB), *q;
    ub_pattern(p, 6 * MiB, 1);
    cr_assert_eq(um_copy_from_host(b, 0, p, 6 * MiB, NULL), UM_OK);
    q = ub_read_all(b);
    ub_assert_bytes(q, p, 6 * MiB, "the buffer allocated under pressure");
    free(p);
    free(q);
  }
  cr_assert_eq(um_release(b), UM_OK);
  c = ub_alloc(e.m, e.dev, 4 * MiB, UM_DEVICE);
  cr_assert_eq(um_release(c), UM_OK);
  ut_profile_close(&e);
}

/* trim_on_pressure = 0: the allocation fails at once and the idle block
 * stays pooled. */
Test(errors_pressure, no_trim_without_trim_on_pressure) {
  ut_env e = limited_open(8 * MiB, 0, 1, NULL);
  um_buffer *a = NULL, *b = NULL;
  um_stats s0, s1;
  a = ub_alloc(e.m, e.dev, 4 * MiB, UM_DEVICE);
  cr_assert_eq(um_release(a), UM_OK);
  s0 = ut_stats(e.m, e.dev);
  cr_assert_eq(um_alloc(e.m, e.dev, 6 * MiB, UM_DEVICE, 0, &b), UM_ENOMEM);
  s1 = ut_stats(e.m, e.dev);
  cr_assert_eq(s1.oom_retries, s0.oom_retries);
  cr_assert_eq(s1.bytes_pooled, 4 * MiB);
  /* an explicit trim makes room */
  cr_assert_eq(um_pool_trim(e.m, 0), UM_OK);
  b = ub_alloc(e.m, e.dev, 6 * MiB, UM_DEVICE);
  cr_assert_eq(um_release(b), UM_OK);
  ut_profile_close(&e);
}

/* The application's on_oom callback (bytes.h) frees memory and asks for
 * one more try after the pool's own trim did not help. */
Test(errors_pressure, on_oom_callback_gets_a_last_try) {
  ut_env e = limited_open(8 * MiB, 1, 0, ub_release_oom_victim); /* unpooled: the victim's block goes back */
  um_buffer *b = NULL;
  um_stats s0, s1;
  ub_oom_victim = ub_alloc(e.m, e.dev, 5 * MiB, UM_DEVICE);
  s0 = ut_stats(e.m, e.dev);
  cr_assert_eq(um_alloc(e.m, e.dev, 5 * MiB, UM_DEVICE, 0, &b), UM_OK, "%s", um_last_error());
  s1 = ut_stats(e.m, e.dev);
  cr_assert_eq(ub_oom_calls, 1);
  cr_assert_eq(s1.oom_retries - s0.oom_retries, 2, "the pool's retry and the callback's");
  cr_assert_eq(um_release(b), UM_OK);
  ut_profile_close(&e);
}

/* A device that cannot give a location: found by asking each device what
 * it offers (the discrete test devices give DEVICE memory only). */
Test(errors, alloc_location_not_supported) {
  um_manager *dm = ut_manager_disc();
  int found = 0;
  for (int i = 0; i < um_device_count(dm); i++) {
    um_device *d = um_device_get(dm, i);
    um_device_info info;
    cr_assert_eq(um_device_info_get(d, &info), UM_OK);
    for (int loc = 0; loc < UM_LOCATION_COUNT; loc++) {
      um_buffer *b = SENTINEL;
      if (info.locations & (1u << loc))
        continue;
      found++;
      FAILS(dm, UM_ENOTSUP, um_alloc(dm, d, 4096, (um_location)loc, 0, &b));
      FAILS(dm, UM_ENOTSUP, um_alloc(dm, d, 4096, (um_location)loc, UM_ALLOC_UNPOOLED, &b));
      FAILS(dm, UM_ENOTSUP, um_alloc_array(dm, d, 16, 16, (um_location)loc, UM_ALLOC_ZERO, &b));
      cr_assert_eq(b, SENTINEL);
    }
  }
  /* UM_HOST is every device's (SPEC §5): pageable host memory. */
  cr_assert_eq(found, 2 * UT_DISC_DEVICES, "each discrete device lacks PINNED and UNIFIED");
  /* peer access between devices that cannot have it */
  FAILS(dm, UM_ENOTSUP, um_peer_enable(um_device_get(dm, 0), um_device_get(dm, 1)));
  FAILS(dm, UM_ENOTSUP, um_peer_enable(um_device_get(dm, 1), um_device_get(dm, 2)));
  cr_assert_eq(um_peer_enabled(um_device_get(dm, 1), um_device_get(dm, 2)), 0);
  cr_assert_eq(um_manager_destroy(dm), UM_OK);
  cr_assert_eq(atomic_load(&ut_disc_live_blocks), 0);
}

/* A device of another manager. */
Test(errors, alloc_device_of_other_manager) {
  um_manager *m2 = ut_manager();
  um_device *cpu2 = um_device_get(m2, 0);
  um_buffer *b = SENTINEL;
  um_stats s;
  ut_snapshot before2 = ut_snap(m2);
  FAILS(m, UM_EINVAL, um_alloc(m, cpu2, 64, UM_HOST, 0, &b));
  FAILS(m, UM_EINVAL, um_stats_get(m, cpu2, &s));
  FAILS(m, UM_EINVAL, um_peer_enable(dev, cpu2));
  FAILS(m, UM_EINVAL, um_peer_enabled(cpu2, dev));
  ut_assert_unchanged(m2, before2);
  cr_assert_eq(b, SENTINEL);
  cr_assert_eq(um_manager_destroy(m2), UM_OK);
}

Test(errors, wrap_host_bad) {
  char mem[64];
  um_buffer *b = SENTINEL;
  FAILS(m, UM_EINVAL, um_wrap_host(NULL, mem, sizeof(mem), 0, &b));
  FAILS(m, UM_EINVAL, um_wrap_host(m, NULL, sizeof(mem), 0, &b));
  FAILS(m, UM_EINVAL, um_wrap_host(m, mem, sizeof(mem), 0, NULL));
  FAILS(m, UM_EINVAL, um_wrap_host(m, mem, 0, 0, &b));
  FAILS(m, UM_EINVAL, um_wrap_host(m, mem, sizeof(mem), 1u << 2, &b));
  FAILS(m, UM_EINVAL, um_wrap_host(m, mem, sizeof(mem), UM_WRAP_READONLY | 0x100, &b));
  cr_assert_eq(b, SENTINEL);
}

Test(errors, map_file_bad) {
  um_buffer *b = SENTINEL;
  FAILS(m, UM_EINVAL, um_map_file(NULL, "/etc/hostname", UM_MAP_READ, &b));
  FAILS(m, UM_EINVAL, um_map_file(m, NULL, UM_MAP_READ, &b));
  FAILS(m, UM_EINVAL, um_map_file(m, "/etc/hostname", UM_MAP_READ, NULL));
  FAILS(m, UM_EINVAL, um_map_file(m, "/etc/hostname", (um_map_mode)4, &b));
  FAILS(m, UM_EINVAL, um_map_file(m, "/etc/hostname", (um_map_mode)-1, &b));
  FAILS(m, UM_ENODEV, um_map_file(m, "/nonexistent/unimem/file", UM_MAP_READ, &b));
  FAILS(m, UM_EINVAL, um_map_file(m, "/", UM_MAP_READ, &b)); /* not a regular file */
  cr_assert_eq(b, SENTINEL);
}

/* ------------------------------------------------------------------------ */
/* Release and getters */

Test(errors, release_null) { FAILS(m, UM_EINVAL, um_release(NULL)); }

Test(errors, getters_null) {
  cr_assert_eq(um_buffer_size(NULL), 0);
  cr_assert_null(um_buffer_device(NULL));
  cr_assert_eq(um_buffer_location(NULL), UM_HOST);
  cr_assert_eq(um_buffer_valid(NULL), 0);
  cr_assert_null(um_buffer_host_ptr(NULL));
}

/* ------------------------------------------------------------------------ */
/* Data movement: NULL and zero sizes */

Test(errors_dev, copy_null_and_zero) {
  um_buffer *a = alloc_zeroed(256), *b = alloc_zeroed(256);
  char host[256];
  um_event *e = SENTINEL;
  memset(host, 1, sizeof(host));
  FAILS(m, UM_EINVAL, um_copy_from_host(NULL, 0, host, 16, NULL));
  FAILS(m, UM_EINVAL, um_copy_from_host(a, 0, NULL, 16, NULL));
  FAILS(m, UM_EINVAL, um_copy_from_host(a, 0, host, 0, NULL));
  FAILS(m, UM_EINVAL, um_copy_from_host(a, 0, host, 0, &e));
  FAILS(m, UM_EINVAL, um_copy_to_host(NULL, 0, host, 16, NULL));
  FAILS(m, UM_EINVAL, um_copy_to_host(a, 0, NULL, 16, NULL));
  FAILS(m, UM_EINVAL, um_copy_to_host(a, 0, host, 0, &e));
  FAILS(m, UM_EINVAL, um_copy(NULL, 0, b, 0, 16, NULL));
  FAILS(m, UM_EINVAL, um_copy(a, 0, NULL, 0, 16, NULL));
  FAILS(m, UM_EINVAL, um_copy(a, 0, b, 0, 0, &e));
  FAILS(m, UM_EINVAL, um_fill(NULL, 0, 0, 16, NULL));
  FAILS(m, UM_EINVAL, um_fill(a, 0, 0, 0, &e));
  cr_assert_eq(e, SENTINEL);
  /* a pointer that is not a buffer */
  FAILS(m, UM_EINVAL, um_copy_from_host((um_buffer *)(void *)host, 0, host, 16, NULL));
  cr_assert_eq(um_release(a), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
}

/* ------------------------------------------------------------------------ */
/* Ranges: off + len outside the buffer, including overflowing sums. */

Test(errors_dev, copy_from_host_range) {
  um_buffer *a = alloc_zeroed(100);
  char host[256];
  um_event *e = SENTINEL;
  memset(host, 3, sizeof(host));
  FAILS(m, UM_ERANGE, um_copy_from_host(a, 0, host, 101, NULL));
  FAILS(m, UM_ERANGE, um_copy_from_host(a, 1, host, 100, NULL));
  FAILS(m, UM_ERANGE, um_copy_from_host(a, 100, host, 1, &e));
  FAILS(m, UM_ERANGE, um_copy_from_host(a, 101, host, 1, NULL));
  FAILS(m, UM_ERANGE, um_copy_from_host(a, SIZE_MAX, host, 1, NULL));
  FAILS(m, UM_ERANGE, um_copy_from_host(a, 1, host, SIZE_MAX, NULL));
  FAILS(m, UM_ERANGE, um_copy_from_host(a, SIZE_MAX, host, SIZE_MAX, &e));
  cr_assert_eq(e, SENTINEL);
  cr_assert(reads_all(a, 100, 0), "a failed copy wrote the buffer");
  /* the exact fit is fine */
  cr_assert_eq(um_copy_from_host(a, 99, host, 1, NULL), UM_OK);
  cr_assert_eq(um_copy_from_host(a, 0, host, 100, NULL), UM_OK);
  cr_assert_eq(um_release(a), UM_OK);
}

Test(errors_dev, copy_to_host_range) {
  um_buffer *a = alloc_zeroed(100);
  char host[256];
  memset(host, 0x5a, sizeof(host));
  FAILS(m, UM_ERANGE, um_copy_to_host(a, 0, host, 101, NULL));
  FAILS(m, UM_ERANGE, um_copy_to_host(a, 50, host, 51, NULL));
  FAILS(m, UM_ERANGE, um_copy_to_host(a, SIZE_MAX, host, 1, NULL));
  FAILS(m, UM_ERANGE, um_copy_to_host(a, 2, host, SIZE_MAX - 1, NULL));
  cr_assert(ut_all_bytes(host, sizeof(host), 0x5a), "host memory written by a failed copy");
  cr_assert_eq(um_release(a), UM_OK);
}

Test(errors_dev, copy_range) {
  um_buffer *a = alloc_zeroed(100), *b = alloc_zeroed(200);
  FAILS(m, UM_ERANGE, um_copy(a, 0, b, 0, 101, NULL));  /* dst too small */
  FAILS(m, UM_ERANGE, um_copy(b, 0, a, 0, 101, NULL));  /* src too small */
  FAILS(m, UM_ERANGE, um_copy(b, 150, a, 0, 60, NULL)); /* dst offset */
  FAILS(m, UM_ERANGE, um_copy(b, 0, a, 90, 11, NULL));  /* src offset */
  FAILS(m, UM_ERANGE, um_copy(a, SIZE_MAX, b, 0, 1, NULL));
  FAILS(m, UM_ERANGE, um_copy(a, 0, b, SIZE_MAX, 1, NULL));
  FAILS(m, UM_ERANGE, um_copy(a, 1, b, 1, SIZE_MAX, NULL));
  FAILS(m, UM_ERANGE, um_copy(a, 0, a, 50, 51, NULL)); /* one buffer, both ends */
  cr_assert_eq(um_release(a), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
}

Test(errors_dev, fill_range) {
  um_buffer *a = alloc_zeroed(100);
  um_event *e = SENTINEL;
  FAILS(m, UM_ERANGE, um_fill(a, 0, 0xff, 101, NULL));
  FAILS(m, UM_ERANGE, um_fill(a, 100, 0xff, 1, &e));
  FAILS(m, UM_ERANGE, um_fill(a, SIZE_MAX, 0xff, 1, NULL));
  FAILS(m, UM_ERANGE, um_fill(a, 1, 0xff, SIZE_MAX, NULL));
  cr_assert_eq(e, SENTINEL);
  cr_assert(reads_all(a, 100, 0), "a failed fill wrote the buffer");
  cr_assert_eq(um_release(a), UM_OK);
}

Test(errors_dev, map_bad) {
  um_buffer *a = alloc_zeroed(100);
  void *p = SENTINEL;
  FAILS(m, UM_EINVAL, um_map(NULL, UM_MAP_READ, 0, 10, &p));
  FAILS(m, UM_EINVAL, um_map(a, UM_MAP_READ, 0, 10, NULL));
  FAILS(m, UM_EINVAL, um_map(a, (um_map_mode)4, 0, 10, &p));
  FAILS(m, UM_EINVAL, um_map(a, (um_map_mode)-1, 0, 10, &p));
  FAILS(m, UM_EINVAL, um_map(a, UM_MAP_READ, 0, 0, &p));
  FAILS(m, UM_ERANGE, um_map(a, UM_MAP_READ, 0, 101, &p));
  FAILS(m, UM_ERANGE, um_map(a, UM_MAP_WRITE, 91, 10, &p));
  FAILS(m, UM_ERANGE, um_map(a, UM_MAP_READ, SIZE_MAX, 1, &p));
  FAILS(m, UM_ERANGE, um_map(a, UM_MAP_READ_WRITE, 1, SIZE_MAX, &p));
  cr_assert_eq(p, SENTINEL);
  /* none of them left the buffer mapped */
  cr_assert_eq(um_fill(a, 0, 1, 100, NULL), UM_OK);
  FAILS(m, UM_EINVAL, um_unmap(NULL, p));
  cr_assert_eq(um_release(a), UM_OK);
}

/* ------------------------------------------------------------------------ */
/* Map state */

Test(errors_dev, map_twice_unmap_unmapped_wrong_pointer) {
  um_buffer *a = alloc_zeroed(100);
  void *p = NULL, *q = SENTINEL;
  FAILS(m, UM_ESTATE, um_unmap(a, &p)); /* not mapped: whatever the pointer */
  cr_assert_eq(um_map(a, UM_MAP_READ, 10, 20, &p), UM_OK);
  FAILS(m, UM_ESTATE, um_map(a, UM_MAP_READ, 10, 20, &q));
  FAILS(m, UM_ESTATE, um_map(a, UM_MAP_WRITE, 0, 100, &q));
  cr_assert_eq(q, SENTINEL);
  FAILS(m, UM_EINVAL, um_unmap(a, (char *)p + 1));
  FAILS(m, UM_EINVAL, um_unmap(a, NULL));
  FAILS(m, UM_EINVAL, um_unmap(a, (char *)p - 10)); /* the buffer's start, not the mapping's */
  cr_assert_eq(um_unmap(a, p), UM_OK); /* still mapped after the wrong tries */
  FAILS(m, UM_ESTATE, um_unmap(a, p));
  cr_assert_eq(um_release(a), UM_OK);
}

/* ------------------------------------------------------------------------ */
/* Read-only wraps */

Test(errors, readonly_wrap_refuses_writes) {
  unsigned char mem[128], host[128];
  um_buffer *ro = NULL, *rw = alloc_host(128);
  void *p = SENTINEL;
  um_event *e = SENTINEL;
  memset(mem, 0x11, sizeof(mem));
  memset(host, 0x22, sizeof(host));
  cr_assert_eq(um_wrap_host(m, mem, sizeof(mem), UM_WRAP_READONLY, &ro), UM_OK);
  FAILS(m, UM_ESTATE, um_copy_from_host(ro, 0, host, 16, NULL));
  FAILS(m, UM_ESTATE, um_copy_from_host(ro, 0, host, 16, &e));
  FAILS(m, UM_ESTATE, um_copy(ro, 0, rw, 0, 16, NULL));
  FAILS(m, UM_ESTATE, um_copy(ro, 0, ro, 64, 16, NULL));
  FAILS(m, UM_ESTATE, um_fill(ro, 0, 0, 128, NULL));
  FAILS(m, UM_ESTATE, um_fill(ro, 0, 0, 1, &e));
  FAILS(m, UM_ESTATE, um_map(ro, UM_MAP_WRITE, 0, 128, &p));
  FAILS(m, UM_ESTATE, um_map(ro, UM_MAP_READ_WRITE, 0, 1, &p));
  FAILS(m, UM_ESTATE, um_map(ro, UM_MAP_WRITE_DISCARD, 0, 128, &p));
  cr_assert_eq(p, SENTINEL);
  cr_assert_eq(e, SENTINEL);
  cr_assert(ut_all_bytes(mem, sizeof(mem), 0x11), "a read-only wrap was written");
  /* reading is fine */
  cr_assert_eq(um_map(ro, UM_MAP_READ, 0, 128, &p), UM_OK);
  cr_assert_eq(p, (void *)mem);
  cr_assert_eq(um_unmap(ro, p), UM_OK);
  cr_assert_eq(um_copy(rw, 0, ro, 0, 128, NULL), UM_OK);
  cr_assert(ut_all_bytes(um_buffer_host_ptr(rw), 128, 0x11));
  cr_assert_eq(um_copy_to_host(ro, 0, host, 128, NULL), UM_OK);
  cr_assert(ut_all_bytes(host, 128, 0x11));
  cr_assert_eq(um_release(ro), UM_OK);
  cr_assert_eq(um_release(rw), UM_OK);
}

/* ------------------------------------------------------------------------ */
/* Released buffers: the handle stays readable (until a new allocation
 * reuses it) and answers UM_ESTATE. */

static void check_released(um_buffer *dead, um_buffer *live) {
  char host[64];
  void *p = SENTINEL;
  um_event *e = SENTINEL;
  um_copy_op op;
  memset(host, 7, sizeof(host));
  FAILS(m, UM_ESTATE, um_release(dead));
  FAILS(m, UM_ESTATE, um_copy_from_host(dead, 0, host, 16, NULL));
  FAILS(m, UM_ESTATE, um_copy_from_host(dead, 0, host, 16, &e));
  FAILS(m, UM_ESTATE, um_copy_to_host(dead, 0, host, 16, NULL));
  FAILS(m, UM_ESTATE, um_copy(dead, 0, live, 0, 16, NULL));
  FAILS(m, UM_ESTATE, um_copy(live, 0, dead, 0, 16, NULL));
  FAILS(m, UM_ESTATE, um_fill(dead, 0, 1, 16, NULL));
  FAILS(m, UM_ESTATE, um_map(dead, UM_MAP_READ, 0, 16, &p));
  FAILS(m, UM_ESTATE, um_unmap(dead, host));
  memset(&op, 0, sizeof(op));
  op.dst = dead, op.host_src = host, op.bytes = 16;
  FAILS(m, UM_ESTATE, um_copy_batch(m, &op, 1, NULL));
  memset(&op, 0, sizeof(op));
  op.src = dead, op.dst = live, op.bytes = 16;
  FAILS(m, UM_ESTATE, um_copy_batch(m, &op, 1, &e));
  cr_assert_eq(p, SENTINEL);
  cr_assert_eq(e, SENTINEL);
  cr_assert_eq(um_buffer_size(dead), 0);
  cr_assert_null(um_buffer_device(dead));
  cr_assert_eq(um_buffer_valid(dead), 0);
  cr_assert_null(um_buffer_host_ptr(dead));
}

Test(errors_dev, released_pooled_buffer) {
  um_buffer *dead = alloc_zeroed(64), *live = alloc_zeroed(64);
  cr_assert_eq(um_release(dead), UM_OK);
  check_released(dead, live);
  cr_assert_eq(um_release(live), UM_OK);
}

Test(errors_dev, released_unpooled_buffer) {
  um_buffer *dead = NULL, *live = alloc_zeroed(64);
  cr_assert_eq(um_alloc(m, dev, 64, UM_DEVICE, UM_ALLOC_UNPOOLED, &dead), UM_OK);
  cr_assert_eq(um_release(dead), UM_OK);
  check_released(dead, live);
  cr_assert_eq(um_release(live), UM_OK);
}

Test(errors, released_wrap) {
  char mem[64];
  um_buffer *dead = NULL, *live = alloc_host(64);
  cr_assert_eq(um_wrap_host(m, mem, sizeof(mem), 0, &dead), UM_OK);
  cr_assert_eq(um_release(dead), UM_OK);
  check_released(dead, live);
  cr_assert_eq(um_release(live), UM_OK);
}

/* ------------------------------------------------------------------------ */
/* Two managers */

Test(errors, copy_between_managers) {
  um_manager *m2 = ut_manager();
  um_buffer *a = alloc_host(64), *b = NULL;
  um_copy_op op;
  ut_snapshot before2;
  cr_assert_eq(um_alloc(m2, um_device_get(m2, 0), 64, UM_HOST, 0, &b), UM_OK);
  before2 = ut_snap(m2);
  FAILS(m, UM_EINVAL, um_copy(a, 0, b, 0, 16, NULL));
  FAILS(m, UM_EINVAL, um_copy(b, 0, a, 0, 16, NULL));
  memset(&op, 0, sizeof(op));
  op.dst = a, op.src = b, op.bytes = 16;
  FAILS(m, UM_EINVAL, um_copy_batch(m, &op, 1, NULL));
  op.dst = b, op.src = NULL, op.host_src = "0123456789abcdef";
  FAILS(m, UM_EINVAL, um_copy_batch(m, &op, 1, NULL)); /* buffer of m2 in m's batch */
  ut_assert_unchanged(m2, before2);
  cr_assert_eq(um_release(a), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_manager_destroy(m2), UM_OK);
}

/* ------------------------------------------------------------------------ */
/* Batches: every op is checked before any is issued. */

Test(errors_dev, batch_bad) {
  um_buffer *a = alloc_zeroed(256), *b = alloc_zeroed(256);
  unsigned char src[256], dst[256];
  um_copy_op ops[4];
  um_event *e = SENTINEL;
  memset(src, 0x77, sizeof(src));
  memset(dst, 0x88, sizeof(dst));
  memset(ops, 0, sizeof(ops));
  FAILS(m, UM_EINVAL, um_copy_batch(NULL, ops, 1, NULL));
  FAILS(m, UM_EINVAL, um_copy_batch(m, NULL, 1, NULL));
  FAILS(m, UM_EINVAL, um_copy_batch(m, ops, 0, NULL));
  FAILS(m, UM_EINVAL, um_copy_batch(m, NULL, 0, &e));

#define BAD_OP(code, ...)                                                      \
  do {                                                                         \
    memset(ops, 0, sizeof(ops));                                               \
    /* three good ops first: none of them may run */                           \
    ops[0] = (um_copy_op){.dst = a, .host_src = src, .bytes = 256};            \
    ops[1] = (um_copy_op){.dst = b, .src = a, .bytes = 256};                   \
    ops[2] = (um_copy_op){.host_dst = dst, .src = b, .bytes = 256};            \
    ops[3] = (um_copy_op){__VA_ARGS__};                                        \
    FAILS(m, code, um_copy_batch(m, ops, 4, NULL));                            \
    FAILS(m, code, um_copy_batch(m, ops, 4, &e));                              \
  } while (0)

  BAD_OP(UM_EINVAL, .dst = a, .host_dst = dst, .host_src = src, .bytes = 1); /* two dsts */
  BAD_OP(UM_EINVAL, .dst = a, .src = b, .host_src = src, .bytes = 1);        /* two srcs */
  BAD_OP(UM_EINVAL, .src = b, .bytes = 1);                                   /* no dst */
  BAD_OP(UM_EINVAL, .dst = a, .bytes = 1);                                   /* no src */
  BAD_OP(UM_EINVAL, .host_dst = dst, .host_src = src, .bytes = 1);           /* host to host */
  BAD_OP(UM_EINVAL, .dst = a, .host_src = src, .bytes = 0);                  /* zero bytes */
  BAD_OP(UM_ERANGE, .dst = a, .host_src = src, .bytes = 257);
  BAD_OP(UM_ERANGE, .dst = a, .dst_off = 1, .src = b, .bytes = 256);
  BAD_OP(UM_ERANGE, .dst = a, .src = b, .src_off = 200, .bytes = 57);
  BAD_OP(UM_ERANGE, .dst = a, .dst_off = SIZE_MAX, .host_src = src, .bytes = 1);
  BAD_OP(UM_ERANGE, .host_dst = dst, .src = b, .src_off = 1, .bytes = SIZE_MAX);
  BAD_OP(UM_EINVAL, .dst = (um_buffer *)(void *)src, .host_src = src, .bytes = 1); /* not a buffer */
#undef BAD_OP
  cr_assert_eq(e, SENTINEL);
  cr_assert(reads_all(a, 256, 0), "a failed batch ran its first op");
  cr_assert(reads_all(b, 256, 0), "a failed batch ran its second op");
  cr_assert(ut_all_bytes(dst, sizeof(dst), 0x88), "a failed batch wrote host memory");
  cr_assert_eq(um_release(a), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
}

/* A batch with an op on a read-only wrap or a mapped buffer is refused as a
 * whole. */
Test(errors_dev, batch_state) {
  unsigned char mem[64], src[64], dst[64];
  um_buffer *ro = NULL, *a = alloc_zeroed(64), *b = alloc_zeroed(64);
  um_copy_op ops[2];
  void *p = NULL;
  memset(mem, 1, sizeof(mem));
  memset(src, 2, sizeof(src));
  memset(dst, 3, sizeof(dst));
  cr_assert_eq(um_fill(a, 0, 9, 64, NULL), UM_OK);
  cr_assert_eq(um_wrap_host(m, mem, sizeof(mem), UM_WRAP_READONLY, &ro), UM_OK);
  ops[0] = (um_copy_op){.dst = a, .host_src = src, .bytes = 64};
  ops[1] = (um_copy_op){.dst = ro, .src = b, .bytes = 64};
  FAILS(m, UM_ESTATE, um_copy_batch(m, ops, 2, NULL));
  cr_assert(reads_all(a, 64, 9), "first op of a refused batch ran");

  cr_assert_eq(um_map(b, UM_MAP_READ, 0, 64, &p), UM_OK);
  ops[1] = (um_copy_op){.host_dst = dst, .src = b, .bytes = 64};
  FAILS(m, UM_ESTATE, um_copy_batch(m, ops, 2, NULL));
  cr_assert(reads_all(a, 64, 9), "first op of a refused batch ran");
  cr_assert(ut_all_bytes(dst, 64, 3));
  cr_assert_eq(um_unmap(b, p), UM_OK);
  cr_assert_eq(um_copy_batch(m, ops, 2, NULL), UM_OK);
  cr_assert(reads_all(a, 64, 2));
  cr_assert_eq(um_release(ro), UM_OK);
  cr_assert_eq(um_release(a), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
}

/* ------------------------------------------------------------------------ */
/* Events */

Test(errors, event_null) {
  um_buffer *a = alloc_host(64);
  FAILS(m, UM_EINVAL, um_event_wait(NULL));
  FAILS(m, UM_EINVAL, um_event_query(NULL));
  FAILS(m, UM_EINVAL, um_event_cancel(NULL));
  um_event_release(NULL); /* no crash */
  /* a handle of another kind is not an event */
  FAILS(m, UM_EINVAL, um_event_wait((um_event *)(void *)a));
  FAILS(m, UM_EINVAL, um_event_query((um_event *)(void *)a));
  FAILS(m, UM_EINVAL, um_event_cancel((um_event *)(void *)a));
  um_event_release((um_event *)(void *)a);
  cr_assert_eq(um_buffer_size(a), 64);
  cr_assert_eq(um_release(a), UM_OK);
}
