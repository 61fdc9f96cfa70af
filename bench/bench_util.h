/* Timing helpers shared by the benchmarks (each also compiled into the
 * unimem command, so everything here is static inline). */
#ifndef UNIMEM_BENCH_UTIL_H
#define UNIMEM_BENCH_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

/* A benchmark's option "--NAME N", N a count above 0, and its defaults. */
typedef struct bench_count {
  const char *option; /* "--reps" */
  int *value;         /* 0 until given */
  int full, quick;    /* the default, without and with --quick */
  int most;           /* the largest accepted (0: no limit) */
} bench_count;

static inline void bench_count_usage(const char *prog, const bench_count *counts, int n) {
  fprintf(stderr, "usage: %s [--quick]", prog);
  for (int k = 0; k < n; k++)
    if (counts[k].most > 0)
      fprintf(stderr, " [%s N (at most %d)]", counts[k].option, counts[k].most);
    else
      fprintf(stderr, " [%s N]", counts[k].option);
  fprintf(stderr, " [--json FILE]\n");
}

/* --quick and the counts of argv (argv[0] the benchmark's name); every
 * count not given takes its default. 0, or 2 with the usage said. */
static inline int bench_parse_counts(int argc, char **argv, int *quick, const bench_count *counts, int n) {
  for (int i = 1; i < argc; i++) {
    int k = 0;
    while (k < n && strcmp(argv[i], counts[k].option) != 0)
      k++;
    if (!strcmp(argv[i], "--quick")) {
      *quick = 1;
    } else if (k < n && i + 1 < argc && (*counts[k].value = atoi(argv[i + 1])) > 0) {
      i++;
    } else {
      bench_count_usage(argv[0], counts, n);
      return 2;
    }
  }
  for (int k = 0; k < n; k++) {
    if (*counts[k].value == 0)
      *counts[k].value = *quick ? counts[k].quick : counts[k].full;
    if (counts[k].most > 0 && *counts[k].value > counts[k].most) {
      fprintf(stderr, "%s: %s %d: at most %d\n", argv[0], counts[k].option, *counts[k].value, counts[k].most);
      return 2;
    }
  }
  return 0;
}

#endif /* UNIMEM_BENCH_UTIL_H */
