/* Benchmark reports: rows of named figures in memory, and their one JSON
 * writer (report.h). */
#include "report.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

void bench_report_init(bench_report *rep, const char *bench) {
  memset(rep, 0, sizeof(*rep));
  snprintf(rep->bench, sizeof(rep->bench), "%s", bench);
}

void bench_report_free(bench_report *rep) {
  free(rep->rows);
  rep->rows = NULL;
  rep->nrows = rep->cap = 0;
}

bool bench_report_has_data(const bench_report *rep) { return rep->facts.ncells > 0 || rep->nrows > 0; }

/* The cell of (group, key), made at the end when it is new; NULL when the
 * row is full. */
static bench_cell *cell_for(bench_row *row, const char *group, const char *key) {
  bench_cell *c;
  for (int i = 0; i < row->ncells; i++)
    if (strcmp(row->cells[i].key, key) == 0 && strcmp(row->cells[i].group, group) == 0)
      return &row->cells[i];
  if (row->ncells == BENCH_MAX_CELLS)
    return NULL;
  c = &row->cells[row->ncells++];
  memset(c, 0, sizeof(*c));
  snprintf(c->key, sizeof(c->key), "%s", key);
  snprintf(c->group, sizeof(c->group), "%s", group);
  return c;
}

static void set_number(bench_row *row, const char *key, bench_kind kind, double v) {
  bench_cell *c;
  if (row == NULL || !isfinite(v) || v < 0 || (c = cell_for(row, "", key)) == NULL)
    return;
  c->kind = kind;
  c->number = v;
}

void bench_set(bench_row *row, const char *key, double v) { set_number(row, key, BENCH_NUMBER, v); }

void bench_set_bool(bench_row *row, const char *key, bool v) { set_number(row, key, BENCH_BOOL, v); }

void bench_set_text_in(bench_row *row, const char *group, const char *key, const char *text) {
  bench_cell *c;
  if (row == NULL || (c = cell_for(row, group, key)) == NULL)
    return;
  c->kind = BENCH_TEXT;
  snprintf(c->text, sizeof(c->text), "%s", text != NULL ? text : "");
}

void bench_set_text(bench_row *row, const char *key, const char *text) { bench_set_text_in(row, "", key, text); }

bench_row *bench_add_row(bench_report *rep, const char *table, const char *name) {
  bench_row *row;
  if (rep->nrows == rep->cap) {
    int cap = rep->cap ? 2 * rep->cap : 16;
    bench_row *grown = realloc(rep->rows, (size_t)cap * sizeof(*grown));
    if (grown == NULL)
      return NULL;
    rep->rows = grown;
    rep->cap = cap;
  }
  row = &rep->rows[rep->nrows++];
  row->ncells = 0;
  bench_set_text(row, "table", table);
  bench_set_text(row, "name", name);
  return row;
}

const bench_cell *bench_cell_of(const bench_row *row, const char *key) {
  for (int i = 0; row != NULL && i < row->ncells; i++)
    if (row->cells[i].group[0] == '\0' && strcmp(row->cells[i].key, key) == 0)
      return &row->cells[i];
  return NULL;
}

double bench_get(const bench_row *row, const char *key) {
  const bench_cell *c = bench_cell_of(row, key);
  return c != NULL && c->kind == BENCH_NUMBER ? c->number : -1;
}

const char *bench_get_text(const bench_row *row, const char *key) {
  const bench_cell *c = bench_cell_of(row, key);
  return c != NULL && c->kind == BENCH_TEXT ? c->text : "";
}

const bench_row *bench_find_row(const bench_report *rep, const char *table, const char *key, const char *value) {
  for (int i = 0; i < rep->nrows; i++)
    if (strcmp(bench_get_text(&rep->rows[i], "table"), table) == 0 &&
        strcmp(bench_get_text(&rep->rows[i], key), value) == 0)
      return &rep->rows[i];
  return NULL;
}

/* ------------------------------------------------------------------------ */
/* JSON                                                                      */

void bench_json_string(FILE *f, const char *s) {
  fputc('"', f);
  for (; s != NULL && *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\')
      fprintf(f, "\\%c", c);
    else if (c < 0x20)
      fprintf(f, "\\u%04x", c);
    else
      fputc(c, f);
  }
  fputc('"', f);
}

/* Whole numbers exactly, large ones to the unit, the others to six
 * significant digits: more than any median here can claim. */
static void json_number(FILE *f, double v) {
  if (v == floor(v) || fabs(v) >= 1e5)
    fprintf(f, "%.0f", v);
  else
    fprintf(f, "%.6g", v);
}

static void json_value(FILE *f, const bench_cell *c) {
  bench_json_string(f, c->key);
  fputc(':', f);
  if (c->kind == BENCH_TEXT)
    bench_json_string(f, c->text);
  else if (c->kind == BENCH_BOOL)
    fputs(c->number != 0 ? "true" : "false", f);
  else
    json_number(f, c->number);
}

/* Whether cell i is the first of its group (the nested object is written
 * there, with every member of the group). */
static bool first_of_group(const bench_row *row, int i) {
  for (int k = 0; k < i; k++)
    if (strcmp(row->cells[k].group, row->cells[i].group) == 0)
      return false;
  return true;
}

static void json_members(FILE *f, const bench_row *row, bool comma_first) {
  bool comma = comma_first;
  for (int i = 0; i < row->ncells; i++) {
    const bench_cell *c = &row->cells[i];
    if (c->group[0] != '\0' && !first_of_group(row, i))
      continue;
    if (comma)
      fputc(',', f);
    comma = true;
    if (c->group[0] == '\0') {
      json_value(f, c);
      continue;
    }
    bench_json_string(f, c->group);
    fputs(":{", f);
    for (int k = i, n = 0; k < row->ncells; k++)
      if (strcmp(row->cells[k].group, c->group) == 0) {
        fputs(n++ ? "," : "", f);
        json_value(f, &row->cells[k]);
      }
    fputc('}', f);
  }
}

void bench_json_object(FILE *f, const bench_row *row) {
  fputc('{', f);
  json_members(f, row, false);
  fputc('}', f);
}

void bench_json_report(FILE *f, const bench_report *rep) {
  fputs("{\"bench\":", f);
  bench_json_string(f, rep->bench);
  json_members(f, &rep->facts, true);
  fputs(",\"rows\":[", f);
  for (int i = 0; i < rep->nrows; i++) {
    fputs(i ? ",\n" : "\n", f);
    bench_json_object(f, &rep->rows[i]);
  }
  fputs("\n]}", f);
}

int bench_save_report(const bench_report *rep, const char *path) {
  FILE *f = fopen(path, "w");
  if (f == NULL) {
    fprintf(stderr, "bench %s: cannot write %s: %s\n", rep->bench, path, strerror(errno));
    return 1;
  }
  bench_json_report(f, rep);
  fputc('\n', f);
  if (fclose(f) != 0) {
    fprintf(stderr, "bench %s: cannot write %s: %s\n", rep->bench, path, strerror(errno));
    return 1;
  }
  return 0;
}

/* ------------------------------------------------------------------------ */

int bench_program_main(int argc, char **argv, const char *bench, bench_entry_fn entry) {
  const char *json = NULL;
  bench_report rep;
  int n = 0, rc;
  /* argv without --json FILE; argv[argc] stays the final NULL */
  for (int i = 0; i < argc; i++) {
    if (i > 0 && strcmp(argv[i], "--json") == 0 && i + 1 < argc)
      json = argv[++i];
    else
      argv[n++] = argv[i];
  }
  argv[n] = NULL;
  bench_report_init(&rep, bench);
  rc = entry(n, argv, &rep);
  if (json != NULL && bench_report_has_data(&rep) && bench_save_report(&rep, json) != 0 && rc == 0)
    rc = 1;
  bench_report_free(&rep);
  return rc;
}

void bench_size_text(char *out, size_t cap, size_t bytes) {
  if (bytes >= (1u << 20) && bytes % (1u << 20) == 0)
    snprintf(out, cap, "%zu MiB", bytes >> 20);
  else if (bytes >= 1024 && bytes % 1024 == 0)
    snprintf(out, cap, "%zu KiB", bytes >> 10);
  else
    snprintf(out, cap, "%zu B", bytes);
}
