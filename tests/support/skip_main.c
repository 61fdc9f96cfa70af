/* The main of the profiled conformance tests and of the files that define
 * UT_SKIP_MAIN: Criterion's own, except that a file whose every test
 * skipped (a profile or a device this machine does not have, such as a GPU)
 * exits 77, so that CTest reports it skipped, with
 * the first reason, instead of passed. The TSan stand-in for Criterion
 * (test_util_tsan.h) brings its own main, which does the same. */
#define UT_NO_MAIN
#include "test_util.h"

#ifndef UT_TSAN
#include <criterion/hooks.h>
#include <stdio.h>

static size_t tests_run, tests_skipped;
static char skip_reason[640];

ReportHook(POST_TEST)(struct criterion_test_stats *stats) {
  if (stats->test_status == CR_STATUS_SKIPPED && stats->message != NULL && skip_reason[0] == '\0')
    snprintf(skip_reason, sizeof(skip_reason), "%s", stats->message);
}

ReportHook(POST_ALL)(struct criterion_global_stats *stats) {
  tests_run = stats->nb_tests;
  tests_skipped = stats->tests_skipped;
}

int main(int argc, char *argv[]) {
  struct criterion_test_set *tests = criterion_initialize();
  int result = 0;
  if (criterion_handle_args(argc, argv, true))
    result = !criterion_run_all_tests(tests);
  criterion_finalize(tests);
  if (result == 0 && tests_skipped > 0 && tests_skipped == tests_run) {
    printf("SKIP: all %zu tests: %s\n", tests_skipped, skip_reason);
    return 77;
  }
  return result;
}
#endif
