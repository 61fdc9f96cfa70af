/* Criterion, or (UM_POOL_STANDALONE) a plain-program stand-in for the part
 * of it that test_pool_fast.c and test_pool_stress.c use.
 *
 * Criterion cannot start under TSan (its arena collides with the
 * sanitizer's memory layout), and these are the tests whose point is
 * threads. So under TSan the stand-in is used: Test() registers functions
 * that the main() below runs in order in one process, aborting on the
 * first failed assertion; this main() takes the place of Criterion's in
 * the same CTest executable, so no build change is needed. */
#ifndef UNIMEM_POOL_STANDALONE_H
#define UNIMEM_POOL_STANDALONE_H

#if defined(__SANITIZE_THREAD__)
#define UM_POOL_STANDALONE 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define UM_POOL_STANDALONE 1
#endif
#endif

#ifndef UM_POOL_STANDALONE
#include <criterion/criterion.h>
#else
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct sa_test {
  const char *suite, *name;
  void (*fn)(void);
} sa_test;

static sa_test sa_tests[64];
static int sa_count;

static void sa_register(const char *suite, const char *name, void (*fn)(void)) {
  if (sa_count == (int)(sizeof(sa_tests) / sizeof(sa_tests[0]))) {
    fprintf(stderr, "pool_standalone.h: too many tests\n");
    abort();
  }
  sa_tests[sa_count].suite = suite;
  sa_tests[sa_count].name = name;
  sa_tests[sa_count].fn = fn;
  sa_count++;
}

/* Test(suite, name, options...): the options (.timeout) are ignored. */
#define Test(suite, name, ...)                                                 \
  static void suite##_##name(void);                                            \
  __attribute__((constructor)) static void sa_reg_##suite##_##name(void) {     \
    sa_register(#suite, #name, suite##_##name);                                \
  }                                                                            \
  static void suite##_##name(void)

static void sa_fail(const char *file, int line, const char *expr, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 4, 5)));
static void sa_fail(const char *file, int line, const char *expr, const char *fmt, ...) {
  va_list ap;
  fprintf(stderr, "%s:%d: assertion failed: %s:", file, line, expr);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap); /* " " or " message" */
  va_end(ap);
  fputc('\n', stderr);
  abort();
}

#define cr_assert(cond, ...)                                                   \
  do {                                                                         \
    if (!(cond))                                                               \
      sa_fail(__FILE__, __LINE__, #cond, " " __VA_ARGS__);                     \
  } while (0)
#define cr_assert_eq(a, b, ...) cr_assert((a) == (b), __VA_ARGS__)
#define cr_assert_neq(a, b, ...) cr_assert((a) != (b), __VA_ARGS__)
#define cr_assert_lt(a, b, ...) cr_assert((a) < (b), __VA_ARGS__)
#define cr_assert_leq(a, b, ...) cr_assert((a) <= (b), __VA_ARGS__)
#define cr_assert_gt(a, b, ...) cr_assert((a) > (b), __VA_ARGS__)
#define cr_assert_geq(a, b, ...) cr_assert((a) >= (b), __VA_ARGS__)
#define cr_assert_null(p, ...) cr_assert((p) == NULL, __VA_ARGS__)
#define cr_assert_not_null(p, ...) cr_assert((p) != NULL, __VA_ARGS__)
#define cr_assert_float_eq(a, b, eps, ...) cr_assert(fabs((double)(a) - (double)(b)) <= (eps), __VA_ARGS__)

int main(void) {
  for (int i = 0; i < sa_count; i++) {
    sa_tests[i].fn();
    printf("[PASS] %s::%s\n", sa_tests[i].suite, sa_tests[i].name);
  }
  printf("%d tests passed\n", sa_count);
  return 0;
}
#endif

#endif /* UNIMEM_POOL_STANDALONE_H */
