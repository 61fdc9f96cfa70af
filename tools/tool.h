/* Subcommands of the unimem command: each takes its own argv (argv[0] is the
 * subcommand's name) and returns the process exit code: 0 success, 1 a
 * failure while running, 2 bad usage. */
#ifndef UNIMEM_TOOL_H
#define UNIMEM_TOOL_H

#include <stdbool.h>

#include "report.h"

int tool_info(int argc, char **argv);
int tool_bench(int argc, char **argv);
int tool_stats(int argc, char **argv);
int tool_replay(int argc, char **argv);
int tool_view(int argc, char **argv);

/* Help texts, in the sections of a manual page. */
extern const char tool_info_help[];
extern const char tool_bench_help[];
extern const char tool_stats_help[];
extern const char tool_replay_help[];
extern const char tool_view_help[];

/* Whether argv[i] asks for help (-h, --help). */
int tool_is_help(const char *arg);

/* plot.c: whether path names a chart format (.svg, .png); the chart of the
 * reports reps[0..n) (NULL entries skipped) drawn into path by gnuplot.
 * Without gnuplot, or without figures, a note and no chart: 0. 1 when
 * gnuplot fails. */
bool tool_chart_path_ok(const char *path);
int tool_draw_chart(const char *path, const bench_report *const *reps, int n, bool quick);
/* plot.c: whether prog is an executable on PATH; s as text safe inside a
 * gnuplot double-quoted string (and a tab-separated data line). */
bool tool_in_path(const char *prog);
void tool_plot_text(FILE *f, const char *s);

#endif
