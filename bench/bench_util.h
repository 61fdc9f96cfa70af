/* Timing helpers shared by the benchmarks (each also compiled into the
 * unimem command, so everything here is static inline). */
#ifndef UNIMEM_BENCH_UTIL_H
#define UNIMEM_BENCH_UTIL_H

#include <stdlib.h>
#include <time.h>

/* Monotonic time in nanoseconds. */
static inline double bench_now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static inline int bench_cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Median of v[0..n) (n > 0); sorts v in place. */
static inline double bench_median(double *v, int n) {
  qsort(v, (size_t)n, sizeof(v[0]), bench_cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* The p-quantile of v[0..n) (n > 0, 0 <= p <= 1), interpolating between
 * neighbours; sorts v in place. */
static inline double bench_quantile(double *v, int n, double p) {
  double at = p * (n - 1);
  int lo = (int)at;
  qsort(v, (size_t)n, sizeof(v[0]), bench_cmp_double);
  return lo + 1 < n ? v[lo] + (at - lo) * (v[lo + 1] - v[lo]) : v[n - 1];
}

#endif /* UNIMEM_BENCH_UTIL_H */
