/* The report of one benchmark, kept in memory: facts about the run (the
 * device, the options used) and rows of named figures. A benchmark records
 * what it measures here and prints its own table from these rows; one
 * writer turns the same rows into JSON, both for a benchmark program's
 * --json FILE and for the unimem command, which merges the reports of
 * several benchmarks and plots their rows without reading any text back.
 *
 * A report in JSON:
 *   {"bench":"NAME", facts..., "rows":[
 *   {"table":"TABLE","name":"ROW", cells...},
 *   ...
 *   ]}
 * Cells keep the order in which they were set. Figures are never negative:
 * a negative or non-finite figure means "not measured" and is left out, and
 * bench_get answers -1 for a figure that is not there. */
#ifndef UNIMEM_BENCH_REPORT_H
#define UNIMEM_BENCH_REPORT_H

#include <stdbool.h>
#include <stdio.h>

#define BENCH_KEY_MAX 40
#define BENCH_TEXT_MAX 160
#define BENCH_MAX_CELLS 20

typedef enum { BENCH_NUMBER, BENCH_BOOL, BENCH_TEXT } bench_kind;

typedef struct bench_cell {
  char key[BENCH_KEY_MAX];
  char group[BENCH_KEY_MAX]; /* "": a member of the object itself; else of
                                the nested object of that name */
  bench_kind kind;
  double number;             /* BENCH_NUMBER; BENCH_BOOL: 0 or 1 */
  char text[BENCH_TEXT_MAX]; /* BENCH_TEXT */
} bench_cell;

/* One JSON object: the facts of a report, or one of its rows. A row's
 * first two cells are its "table" and its "name". */
typedef struct bench_row {
  bench_cell cells[BENCH_MAX_CELLS];
  int ncells;
} bench_row;

typedef struct bench_report {
  char bench[BENCH_KEY_MAX]; /* "pool", "transfer", ... */
  bench_row facts;
  bench_row *rows;
  int nrows, cap;
} bench_report;

/* A benchmark's entry point: its arguments (argv[0] its name; --json is
 * not among them) and the report it fills. Returns the exit status: 0
 * measured, 1 a failure, 2 bad usage, BENCH_SKIPPED nothing to measure. */
typedef int (*bench_entry_fn)(int argc, char **argv, bench_report *rep);

#define BENCH_SKIPPED 77

void bench_report_init(bench_report *rep, const char *bench);
void bench_report_free(bench_report *rep);
/* Whether the benchmark recorded anything (a fact or a row). */
bool bench_report_has_data(const bench_report *rep);

/* A new row of table, named name; NULL when out of memory. Every setter
 * below accepts a NULL row and then does nothing. */
bench_row *bench_add_row(bench_report *rep, const char *table, const char *name);

/* Set a cell (replacing one of the same key and group). */
void bench_set(bench_row *row, const char *key, double v);
void bench_set_bool(bench_row *row, const char *key, bool v);
void bench_set_text(bench_row *row, const char *key, const char *text);
/* A text member of the nested object group, e.g. "allocators". */
void bench_set_text_in(bench_row *row, const char *group, const char *key, const char *text);

/* The cell of key (top level), or NULL. */
const bench_cell *bench_cell_of(const bench_row *row, const char *key);
/* The figure of key, or -1 when it is not there. */
double bench_get(const bench_row *row, const char *key);
/* The text of key, or "" when it is not there. */
const char *bench_get_text(const bench_row *row, const char *key);
/* The first row of table whose cell key has the text value, or NULL. */
const bench_row *bench_find_row(const bench_report *rep, const char *table, const char *key, const char *value);

/* JSON: a string literal, quotes included; one object; a whole report
 * (without a final newline, so that it can be embedded). */
void bench_json_string(FILE *f, const char *s);
void bench_json_object(FILE *f, const bench_row *row);
void bench_json_report(FILE *f, const bench_report *rep);
/* The report into a file, with a final newline. 0, or 1 with a message. */
int bench_save_report(const bench_report *rep, const char *path);

/* The main of a benchmark program: takes --json FILE out of the
 * arguments, runs entry, and writes the report into FILE when the
 * benchmark recorded anything. */
int bench_program_main(int argc, char **argv, const char *bench, bench_entry_fn entry);

/* "4 KiB", "64 MiB", "100 B": whole units where the size has them. */
void bench_size_text(char *out, size_t cap, size_t bytes);

#endif /* UNIMEM_BENCH_REPORT_H */
