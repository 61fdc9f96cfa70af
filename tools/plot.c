/* The chart of `unimem bench --plot FILE`: one panel per benchmark, one
 * cluster of bars per row of its report, one bar per "*_ns" figure of the
 * row (unimem and what it is compared with), drawn by gnuplot from the
 * reports in memory. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tool.h"
#include "unimem.h"

#define PLOT_MAX_SERIES 6

typedef struct panel {
  const bench_report *rep;
  char series[PLOT_MAX_SERIES][BENCH_KEY_MAX]; /* the "*_ns" keys, in order of appearance */
  int nseries;
} panel;

static const char *extension_of(const char *path) {
  const char *dot = strrchr(path, '.');
  const char *slash = strrchr(path, '/');
  return dot != NULL && (slash == NULL || dot > slash) ? dot + 1 : "";
}

bool tool_chart_path_ok(const char *path) {
  return strcmp(extension_of(path), "svg") == 0 || strcmp(extension_of(path), "png") == 0;
}

bool tool_in_path(const char *prog) {
  const char *path = getenv("PATH");
  char buf[4096];
  while (path && *path) {
    size_t n = strcspn(path, ":");
    if (n > 0 && n + strlen(prog) + 2 < sizeof(buf)) {
      snprintf(buf, sizeof(buf), "%.*s/%s", (int)n, path, prog);
      if (access(buf, X_OK) == 0)
        return true;
    }
    path += n + (path[n] == ':');
  }
  return false;
}

static bool is_time(const bench_cell *c) {
  size_t n = strlen(c->key);
  return c->kind == BENCH_NUMBER && c->group[0] == '\0' && n > 3 && strcmp(c->key + n - 3, "_ns") == 0;
}

/* The series of a panel: every time figure of its rows, up to
 * PLOT_MAX_SERIES. Returns how many. */
static int find_series(panel *p) {
  p->nseries = 0;
  for (int i = 0; i < p->rep->nrows; i++) {
    const bench_row *row = &p->rep->rows[i];
    for (int k = 0; k < row->ncells; k++) {
      bool known = false;
      if (!is_time(&row->cells[k]))
        continue;
      for (int s = 0; s < p->nseries; s++)
        known |= strcmp(p->series[s], row->cells[k].key) == 0;
      if (!known && p->nseries < PLOT_MAX_SERIES)
        snprintf(p->series[p->nseries++], sizeof(p->series[0]), "%s", row->cells[k].key);
    }
  }
  return p->nseries;
}

/* Text safe inside a gnuplot double-quoted string and a tab-separated
 * data line. */
void tool_plot_text(FILE *f, const char *s) {
  for (; s && *s; s++) {
    if (*s == '"' || *s == '\\')
      fputc('\\', f);
    fputc(*s == '\t' || *s == '\n' || *s == '\r' ? ' ' : *s, f);
  }
}

static void write_panel(FILE *g, const panel *p, int idx, bool quick) {
  const char *device = bench_get_text(&p->rep->facts, "device");
  fprintf(g, "$data%d << EOD\n", idx);
  for (int i = 0; i < p->rep->nrows; i++) {
    const bench_row *row = &p->rep->rows[i];
    tool_plot_text(g, bench_get_text(row, "name"));
    for (int s = 0; s < p->nseries; s++) {
      double v = bench_get(row, p->series[s]);
      if (v > 0)
        fprintf(g, "\t%.6g", v);
      else
        fputs("\t?", g);
    }
    fputc('\n', g);
  }
  fputs("EOD\nset title \"", g);
  tool_plot_text(g, p->rep->bench);
  if (device[0] != '\0') {
    fputs(" on ", g);
    tool_plot_text(g, device);
  }
  fprintf(g, "%s: time, lower is better\"\nplot ", quick ? " (--quick)" : "");
  for (int s = 0; s < p->nseries; s++) {
    /* Figures are in ns; the axis is in seconds with SI prefixes. */
    fprintf(g, "%s$data%d using ($%d*1e-9)%s title \"", s ? ", " : "", idx, s + 2, s == 0 ? ":xtic(1)" : "");
    fprintf(g, "%.*s\"", (int)strlen(p->series[s]) - 3, p->series[s]);
  }
  fputc('\n', g);
}

static void write_preamble(FILE *g, const char *path, int width, int npanels, bool quick) {
  if (!strcmp(extension_of(path), "png"))
    fprintf(g, "set terminal pngcairo size %d,%d noenhanced font \"sans,9\" background rgb \"white\"\n", width,
            160 + 460 * npanels);
  else
    fprintf(g, "set terminal svg size %d,%d dynamic noenhanced font \"sans,10\" background rgb \"white\"\n", width,
            160 + 460 * npanels);
  fputs("set output \"", g);
  tool_plot_text(g, path);
  fputs("\"\n", g);
  fputs("set datafile separator \"\\t\"\n"
        "set datafile missing \"?\"\n"
        "set style data histograms\n"
        "set style histogram clustered gap 1\n"
        "set style fill solid 0.85 border -1\n"
        "set boxwidth 0.9\n"
        "set logscale y 10\n"
        "set format y \"%.0s %cs\"\n"
        "set ylabel \"seconds (log scale)\"\n"
        "set grid ytics\n"
        "set key top left horizontal\n"
        "set xtics rotate by 35 right nomirror font \",8\"\n"
        "set yrange [*:*]\n"
        "set lmargin 16\n",
        g);
  fprintf(g, "set multiplot layout %d,1 title \"unimem %s bench%s\"\n", npanels, um_version_string(),
          quick ? " --quick" : "");
}

/* The benchmark's output check made the file: remove it while it is still
 * empty, so that no empty chart is left behind. */
static void remove_if_empty(const char *path) {
  struct stat sb;
  if (stat(path, &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_size == 0)
    unlink(path);
}

/* The panels of the reports that have time figures; the chart's width. */
static int collect_panels(const bench_report *const *reps, int n, panel *panels, int *width) {
  int np = 0;
  *width = 900;
  for (int i = 0; i < n; i++) {
    panels[np].rep = reps[i];
    if (reps[i] == NULL || reps[i]->nrows == 0 || find_series(&panels[np]) == 0)
      continue;
    if (200 + reps[i]->nrows * (panels[np].nseries * 12 + 16) > *width)
      *width = 200 + reps[i]->nrows * (panels[np].nseries * 12 + 16);
    np++;
  }
  if (*width > 2400)
    *width = 2400;
  return np;
}

int tool_draw_chart(const char *path, const bench_report *const *reps, int n, bool quick) {
  panel *panels = calloc((size_t)n + 1, sizeof(*panels));
  int np, width, rc;
  FILE *g;
  if (panels == NULL)
    return 1;
  if ((np = collect_panels(reps, n, panels, &width)) == 0 || !tool_in_path("gnuplot")) {
    if (np == 0)
      fprintf(stderr, "unimem bench: no figures to draw (no benchmark wrote rows); no chart\n");
    else
      fprintf(stderr, "unimem bench: gnuplot is not installed (Debian: gnuplot-nox): no chart; "
                      "the table and the JSON report are complete\n");
    remove_if_empty(path);
    free(panels);
    return 0;
  }
  if ((g = popen("gnuplot", "w")) == NULL) {
    fprintf(stderr, "unimem bench: cannot start gnuplot: %s\n", strerror(errno));
    free(panels);
    return 1;
  }
  write_preamble(g, path, width, np, quick);
  for (int i = 0; i < np; i++)
    write_panel(g, &panels[i], i, quick);
  fputs("unset multiplot\n", g);
  free(panels);
  if ((rc = pclose(g)) != 0) {
    fprintf(stderr, "unimem bench: gnuplot failed (status %d): no chart\n", rc);
    remove_if_empty(path);
    return 1;
  }
  return 0;
}
