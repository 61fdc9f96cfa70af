/* Subcommands of the unimem command: each takes its own argv (argv[0] is the
 * subcommand's name) and returns the process exit code: 0 success, 1 a
 * failure while running, 2 bad usage. */
#ifndef UNIMEM_TOOL_H
#define UNIMEM_TOOL_H

#include <stdio.h>

int tool_info(int argc, char **argv);
int tool_bench(int argc, char **argv);
int tool_stats(int argc, char **argv);

/* Help texts, in the sections of a manual page. */
extern const char tool_info_help[];
extern const char tool_bench_help[];
extern const char tool_stats_help[];

/* Write s as a JSON string literal, quotes included. */
void tool_json_string(FILE *f, const char *s);
/* Whether argv[i] asks for help (-h, --help). */
int tool_is_help(const char *arg);

#endif
