/* The foundation tests under ThreadSanitizer.
 *
 * Criterion cannot start under TSan (Criterion issue #274: it maps its
 * process arena with MAP_FIXED at random addresses that collide with the
 * sanitizer's shadow memory, and aborts or crashes before the first test).
 * So when test_util.h sees a TSan build it includes this header instead of
 * <criterion/criterion.h>: the subset of Criterion's macros the foundation
 * tests use, each test run in its own forked process as Criterion does
 * (suite init, test, fini; exit status 0 pass, 77 skip), and a main() that
 * takes Criterion's --filter and ignores its other options (--jobs=1 from
 * CTest). A data race that TSan reports makes the test's process exit with
 * TSan's exit code (66), which counts as a failure.
 *
 * The tests themselves are the same source in every build; nothing here is
 * used outside TSan builds. */
#ifndef UNIMEM_TEST_UTIL_TSAN_H
#define UNIMEM_TEST_UTIL_TSAN_H

#include <fnmatch.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct ut_test_opts {
  int unused_;
  void (*init)(void);
  void (*fini)(void);
  double timeout; /* seconds; 0: none */
  bool disabled;  /* as Criterion's: not run, not counted */
} ut_test_opts;

typedef struct ut_test {
  const char *suite, *name;
  void (*fn)(void);
  const ut_test_opts *opts;
} ut_test;

typedef struct ut_suite {
  const char *name;
  const ut_test_opts *opts;
} ut_suite;

#define UT_MAX_TESTS 256
#define UT_MAX_SUITES 32
#define UT_SKIP_STATUS 77

static ut_test ut_tests[UT_MAX_TESTS];
static int ut_ntests;
static ut_suite ut_suites[UT_MAX_SUITES];
static int ut_nsuites;
static int ut_expect_failed; /* a cr_expect failed in this test */

static __attribute__((unused)) void ut_register_test(const char *suite, const char *name, void (*fn)(void),
                                                     const ut_test_opts *opts) {
  if (ut_ntests == UT_MAX_TESTS) {
    fprintf(stderr, "too many tests for the TSan runner\n");
    abort();
  }
  ut_tests[ut_ntests++] = (ut_test){suite, name, fn, opts};
}

static __attribute__((unused)) void ut_register_suite(const char *name, const ut_test_opts *opts) {
  if (ut_nsuites == UT_MAX_SUITES) {
    fprintf(stderr, "too many suites for the TSan runner\n");
    abort();
  }
  ut_suites[ut_nsuites++] = (ut_suite){name, opts};
}

#define TestSuite(suite, ...)                                                  \
  static const ut_test_opts ut_suite_opts_##suite = {.unused_ = 0, __VA_ARGS__}; \
  __attribute__((constructor)) static void ut_suite_register_##suite(void) {   \
    ut_register_suite(#suite, &ut_suite_opts_##suite);                         \
  }                                                                            \
  typedef int ut_suite_semicolon_##suite

#define Test(suite, name, ...)                                                 \
  static void ut_test_##suite##_##name(void);                                  \
  static const ut_test_opts ut_test_opts_##suite##_##name = {.unused_ = 0, __VA_ARGS__}; \
  __attribute__((constructor)) static void ut_test_register_##suite##_##name(void) { \
    ut_register_test(#suite, #name, ut_test_##suite##_##name,                  \
                     &ut_test_opts_##suite##_##name);                          \
  }                                                                            \
  static void ut_test_##suite##_##name(void)

/* A failed check: print where and why; a fatal one ends the test. */
static __attribute__((unused)) void ut_check_failed(int fatal, const char *file, int line,
                                                    const char *expr, const char *fmt, ...) {
  va_list ap;
  fprintf(stderr, "[----] %s:%d: Assertion Failed: %s\n", file, line, expr);
  if (fmt != NULL && fmt[0] != '\0') {
    fprintf(stderr, "[----]   ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
  }
  fflush(stderr);
  if (fatal)
    exit(1);
  ut_expect_failed = 1;
}

static __attribute__((unused)) void ut_log(const char *level, const char *fmt, ...) {
  va_list ap;
  fprintf(stderr, "[%s] ", level);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
}

#define UT_CHECK_(fatal, cond, expr, ...)                                      \
  do {                                                                         \
    if (!(cond))                                                               \
      ut_check_failed((fatal), __FILE__, __LINE__, (expr), "" __VA_ARGS__);    \
  } while (0)

#define cr_assert(cond, ...) UT_CHECK_(1, (cond), #cond, __VA_ARGS__)
#define cr_expect(cond, ...) UT_CHECK_(0, (cond), #cond, __VA_ARGS__)
#define cr_assert_not(cond, ...) UT_CHECK_(1, !(cond), "!(" #cond ")", __VA_ARGS__)
#define cr_assert_eq(a, b, ...) UT_CHECK_(1, (a) == (b), #a " == " #b, __VA_ARGS__)
#define cr_expect_eq(a, b, ...) UT_CHECK_(0, (a) == (b), #a " == " #b, __VA_ARGS__)
#define cr_assert_neq(a, b, ...) UT_CHECK_(1, (a) != (b), #a " != " #b, __VA_ARGS__)
#define cr_assert_lt(a, b, ...) UT_CHECK_(1, (a) < (b), #a " < " #b, __VA_ARGS__)
#define cr_assert_leq(a, b, ...) UT_CHECK_(1, (a) <= (b), #a " <= " #b, __VA_ARGS__)
#define cr_assert_gt(a, b, ...) UT_CHECK_(1, (a) > (b), #a " > " #b, __VA_ARGS__)
#define cr_assert_geq(a, b, ...) UT_CHECK_(1, (a) >= (b), #a " >= " #b, __VA_ARGS__)
#define cr_assert_null(p, ...) UT_CHECK_(1, (p) == NULL, #p " == NULL", __VA_ARGS__)
#define cr_assert_not_null(p, ...) UT_CHECK_(1, (p) != NULL, #p " != NULL", __VA_ARGS__)
#define cr_assert_float_eq(a, b, eps, ...)                                     \
  UT_CHECK_(1, fabs((double)(a) - (double)(b)) <= (eps), #a " ~= " #b, __VA_ARGS__)
#define cr_assert_str_eq(a, b, ...) UT_CHECK_(1, strcmp((a), (b)) == 0, #a " equals " #b, __VA_ARGS__)
#define cr_assert_arr_eq(a, b, size, ...)                                      \
  UT_CHECK_(1, memcmp((a), (b), (size)) == 0, #a "[0.." #size ") == " #b, __VA_ARGS__)
#define cr_assert_fail(...) ut_check_failed(1, __FILE__, __LINE__, "cr_assert_fail", "" __VA_ARGS__)
#define cr_log_error(...) ut_log("ERR ", __VA_ARGS__)
#define cr_skip_test(...)                                                      \
  do {                                                                         \
    ut_log("SKIP", "" __VA_ARGS__);                                            \
    exit(UT_SKIP_STATUS);                                                      \
  } while (0)

/* The runner: once per test program. The support library's files define
 * UT_NO_MAIN before they include test_util.h (their fatal checks exit, as
 * in a test). */
#ifndef UT_NO_MAIN
static const ut_test_opts *ut_suite_opts(const char *suite) {
  for (int i = 0; i < ut_nsuites; i++)
    if (strcmp(ut_suites[i].name, suite) == 0)
      return ut_suites[i].opts;
  return NULL;
}

/* The child: suite init, test init, the test, test fini, suite fini. */
static void ut_run_child(const ut_test *t) {
  const ut_test_opts *s = ut_suite_opts(t->suite);
  double timeout = t->opts->timeout > 0 ? t->opts->timeout : s != NULL ? s->timeout : 0;
  if (timeout > 0)
    alarm((unsigned)timeout + 1);
  if (s != NULL && s->init)
    s->init();
  if (t->opts->init)
    t->opts->init();
  t->fn();
  if (t->opts->fini)
    t->opts->fini();
  if (s != NULL && s->fini)
    s->fini();
  exit(ut_expect_failed ? 1 : 0);
}

int main(int argc, char **argv) {
  const char *filter = NULL;
  int passed = 0, failed = 0, crashed = 0, skipped = 0, tested = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--filter") == 0 && i + 1 < argc)
      filter = argv[++i];
    else if (strncmp(argv[i], "--filter=", 9) == 0)
      filter = argv[i] + 9;
  }
  for (int i = 0; i < ut_ntests; i++) {
    const ut_test *t = &ut_tests[i];
    char full[256];
    pid_t pid;
    int status;
    snprintf(full, sizeof(full), "%s/%s", t->suite, t->name);
    if ((filter != NULL && fnmatch(filter, full, 0) != 0) || t->opts->disabled)
      continue;
    fflush(stdout);
    fflush(stderr);
    pid = fork();
    if (pid < 0) {
      perror("fork");
      return 1;
    }
    if (pid == 0)
      ut_run_child(t);
    while (waitpid(pid, &status, 0) < 0)
      ;
    if (WIFEXITED(status) && WEXITSTATUS(status) == UT_SKIP_STATUS) {
      skipped++;
      fprintf(stderr, "[SKIP] %s::%s\n", t->suite, t->name);
      continue;
    }
    tested++;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
      passed++;
    } else if (WIFEXITED(status)) {
      failed++;
      fprintf(stderr, "[FAIL] %s::%s (exit status %d)\n", t->suite, t->name, WEXITSTATUS(status));
    } else {
      crashed++;
      fprintf(stderr, "[FAIL] %s::%s: CRASH (signal %d)\n", t->suite, t->name,
              WIFSIGNALED(status) ? WTERMSIG(status) : -1);
    }
  }
  fprintf(stderr, "[====] Synthesis: Tested: %d | Passing: %d | Failing: %d | Crashing: %d (skipped: %d)\n",
          tested, passed, failed, crashed, skipped);
  if (failed + crashed > 0)
    return 1;
  return skipped > 0 && passed == 0 ? UT_SKIP_STATUS : 0; /* every test skipped: CTest says so */
}

#endif /* UT_NO_MAIN */

#endif /* UNIMEM_TEST_UTIL_TSAN_H */
