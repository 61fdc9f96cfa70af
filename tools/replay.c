/* unimem replay FILE: an allocation trace (a recording of UNIMEM_TRACE_FILE,
 * or one of bench/traces) replayed by `unimem bench pool`'s trace table, and
 * the bytes requested and reserved over the replay drawn by gnuplot with
 * --plot. This file only builds the benchmark's arguments and the chart. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tool.h"
#include "unimem.h"

int um_bench_pool_main(int argc, char **argv, bench_report *rep);

const char tool_replay_help[] =
    "NAME\n"
    "    unimem replay - replay an allocation trace through the pool and the host's allocators\n"
    "\n"
    "SYNOPSIS\n"
    "    unimem replay FILE [--quick] [--json FILE] [--plot FILE]\n"
    "\n"
    "DESCRIPTION\n"
    "    Replays the allocations and releases of FILE, a trace in the replay format\n"
    "    (lines \"a ID BYTES ...\" and \"f ID\"; what UNIMEM_TRACE_FILE records, and\n"
    "    the traces of bench/traces), on the host, from an empty pool with the\n"
    "    default options, and prints:\n"
    "      - the hit rate (allocations served without a device allocation call);\n"
    "      - peak bytes reserved against peak bytes requested, and with the pool\n"
    "        capped at half the peak request;\n"
    "      - both at ten moments of the replay (fractions of the peak request);\n"
    "      - the peak RSS each allocator's replay adds with every page touched\n"
    "        (unimem, glibc, jemalloc, mimalloc; a process each);\n"
    "      - time per event against glibc, jemalloc and mimalloc, every page of\n"
    "        every block written and the calls alone.\n"
    "    It is `unimem bench pool --only trace --trace FILE`.\n"
    "\n"
    "OPTIONS\n"
    "    --quick        one timed replay instead of five.\n"
    "    --json FILE    the report as JSON (the trace rows of `unimem bench pool`).\n"
    "    --plot FILE    draw bytes requested and reserved over the replay into FILE\n"
    "                   (.svg or .png; needs gnuplot, Debian: gnuplot-nox).\n"
    "\n"
    "EXIT STATUS\n"
    "    0 success; 1 the trace cannot be read or a replay failed; 2 bad usage.\n"
    "\n"
    "EXAMPLE\n"
    "    UNIMEM_TRACE_FILE=/tmp/app.%p.txt ./app\n"
    "    unimem replay /tmp/app.1234.txt --plot app.svg\n";

/* s as a gnuplot double-quoted string. */
static void quoted(FILE *g, const char *s) {
  fputc('"', g);
  tool_plot_text(g, s);
  fputc('"', g);
}

/* A new file for the series, made here (O_EXCL: never a file or link that
 * was there) under TMPDIR; its path in out. */
static int series_file(char *out, size_t cap) {
  const char *tmp = getenv("TMPDIR") != NULL && getenv("TMPDIR")[0] != '\0' ? getenv("TMPDIR") : "/tmp";
  for (int k = 0; k < 100; k++) {
    int fd;
    if (snprintf(out, cap, "%s/unimem-replay-series-%ld-%d.txt", tmp, (long)getpid(), k) >= (int)cap)
      return -1;
    if ((fd = open(out, O_CREAT | O_EXCL | O_WRONLY, 0600)) >= 0) {
      close(fd);
      return 0;
    }
    if (errno != EEXIST)
      break;
  }
  fprintf(stderr, "unimem replay: cannot make a file under %s: %s\n", tmp, strerror(errno));
  out[0] = '\0';
  return -1;
}

/* The series file (event, requested, reserved) drawn as two lines. */
static int draw(const char *chart, const char *series, const char *trace) {
  FILE *g;
  int rc;
  bool png = strlen(chart) > 4 && !strcmp(chart + strlen(chart) - 4, ".png");
  if (!tool_in_path("gnuplot")) {
    fprintf(stderr, "unimem replay: gnuplot is not installed (Debian: gnuplot-nox): no chart\n");
    return 0;
  }
  if ((g = popen("gnuplot", "w")) == NULL) {
    fprintf(stderr, "unimem replay: cannot start gnuplot: %s\n", strerror(errno));
    return 1;
  }
  if (png)
    fputs("set terminal pngcairo size 1000,520 noenhanced font \"sans,10\" background rgb \"white\"\n", g);
  else
    fputs("set terminal svg size 1000,520 dynamic noenhanced font \"sans,10\" background rgb \"white\"\n", g);
  fputs("set output ", g);
  quoted(g, chart);
  fputs("\nset title ", g);
  quoted(g, trace);
  fputs(" . \": bytes over the replay, from an empty pool\"\n", g);
  fputs("set xlabel \"event\"\nset ylabel \"MiB\"\nset grid\nset key top left\n"
        "set datafile commentschars \"#\"\n",
        g);
  fputs("plot ", g);
  quoted(g, series);
  fputs(" using 1:($2/1048576) with lines lw 2 title \"requested (live)\", ", g);
  quoted(g, series);
  fputs(" using 1:($3/1048576) with lines lw 2 title \"reserved by unimem\"\n", g);
  if ((rc = pclose(g)) != 0) {
    fprintf(stderr, "unimem replay: gnuplot failed (status %d): no chart\n", rc);
    return 1;
  }
  printf("chart: %s\n", chart);
  return 0;
}

int tool_replay(int argc, char **argv) {
  const char *trace = NULL, *json = NULL, *plot = NULL;
  char series[4096] = "";
  char *args[12];
  int n = 0, rc;
  bool quick = false;
  bench_report rep;
  for (int i = 1; i < argc; i++) {
    if (tool_is_help(argv[i])) {
      fputs(tool_replay_help, stdout);
      return 0;
    } else if (!strcmp(argv[i], "--quick")) {
      quick = true;
    } else if ((!strcmp(argv[i], "--json") || !strcmp(argv[i], "--plot")) && i + 1 < argc) {
      *(argv[i][2] == 'j' ? &json : &plot) = argv[i + 1];
      i++;
    } else if (argv[i][0] != '-' && trace == NULL) {
      trace = argv[i];
    } else {
      fprintf(stderr, "unimem replay: unknown or incomplete argument '%s'\n"
                      "usage: unimem replay FILE [--quick] [--json FILE] [--plot FILE] (unimem replay --help)\n",
              argv[i]);
      return 2;
    }
  }
  if (trace == NULL) {
    fprintf(stderr, "usage: unimem replay FILE [--quick] [--json FILE] [--plot FILE] (unimem replay --help)\n");
    return 2;
  }
  if (access(trace, R_OK) != 0) {
    fprintf(stderr, "unimem replay: cannot read %s: %s\n", trace, strerror(errno));
    return 1;
  }
  if (plot != NULL && !tool_chart_path_ok(plot)) {
    fprintf(stderr, "unimem replay: --plot %s: the chart is .svg or .png\n", plot);
    return 2;
  }
  args[n++] = "pool";
  args[n++] = "--only";
  args[n++] = "trace";
  args[n++] = (char *)"--trace";
  args[n++] = (char *)trace;
  if (quick)
    args[n++] = "--quick";
  if (plot != NULL) {
    /* The benchmark may run this program again (jemalloc's static TLS:
     * bench_pool.c), which comes back here: the file made before is used. */
    const char *made = getenv("UM_REPLAY_SERIES");
    if (made != NULL && getenv("UM_BENCH_POOL_REEXEC") != NULL)
      snprintf(series, sizeof(series), "%s", made);
    else if (series_file(series, sizeof(series)) != 0)
      return 1;
    else
      setenv("UM_REPLAY_SERIES", series, 1);
    args[n++] = "--series";
    args[n++] = series;
  }
  args[n] = NULL;
  bench_report_init(&rep, "pool");
  rc = um_bench_pool_main(n, args, &rep);
  if (rc == 0 && json != NULL && bench_save_report(&rep, json) != 0)
    rc = 1;
  if (rc == 0 && plot != NULL)
    rc = draw(plot, series, trace);
  if (series[0] != '\0')
    unlink(series);
  bench_report_free(&rep);
  return rc;
}
