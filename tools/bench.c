/* unimem bench: runs the benchmarks of bench/ (compiled into the command
 * with -DUM_BENCH_NO_MAIN), merges their reports into one JSON file and
 * draws them with gnuplot. Each benchmark prints its own table; this file
 * only orchestrates. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "json.h"
#include "tool.h"
#include "unimem.h"

typedef int (*bench_main_fn)(int argc, char **argv);

int um_bench_pool_main(int argc, char **argv);
int um_bench_transfer_main(int argc, char **argv);
int um_bench_stream_main(int argc, char **argv);
int um_bench_cuda_main(int argc, char **argv);

typedef struct bench_entry {
  const char *name;
  bench_main_fn run;
  const char *what;
} bench_entry;

static const bench_entry benches[] = {
    {"pool", um_bench_pool_main, "pool hits and allocate+touch against glibc, jemalloc and mimalloc"},
    {"transfer", um_bench_transfer_main, "copies against the raw OpenCL calls and memcpy"},
    {"stream", um_bench_stream_main, "a file larger than the device through um_stream against read()+copy"},
    {"cuda", um_bench_cuda_main, "pool and copies on an NVIDIA GPU against the CUDA driver's own calls"},
};
#define NBENCHES (sizeof(benches) / sizeof(benches[0]))

/* Exit status a benchmark uses to say "nothing to measure here" (the CTest
 * skip convention). */
#define BENCH_SKIPPED 77

const char tool_bench_help[] =
    "NAME\n"
    "    unimem bench - measure unimem against the allocators and drivers it replaces\n"
    "\n"
    "SYNOPSIS\n"
    "    unimem bench [pool|transfer|stream|cuda|all] [--quick] [--json FILE] [--plot FILE]\n"
    "                 [BENCHMARK OPTIONS]\n"
    "\n"
    "DESCRIPTION\n"
    "    Runs one benchmark, or all of them (the default), on the devices of this\n"
    "    machine, with the programs unimem is compared against measured side by side\n"
    "    in the same run:\n"
    "\n"
    "    pool      allocate + release from the pool, and allocate + touch + release,\n"
    "              against glibc malloc, jemalloc, mimalloc and unpooled unimem; the\n"
    "              seeds' allocation table; two threads against one.\n"
    "    transfer  host<->device (pinned and pageable), device-local, device<->device,\n"
    "              batched small copies, against the raw OpenCL calls and memcpy.\n"
    "    stream    a file several times larger than the device's memory (capped with\n"
    "              device_limit_bytes) through um_stream, against a loop of read()\n"
    "              and blocking copies.\n"
    "    cuda      pool hit against cuMemAlloc/cuMemFree and cuMemAllocAsync, pinned and\n"
    "              pageable host<->device bandwidth against cuMemcpyHtoD/DtoH, and\n"
    "              device-local copies, on the first NVIDIA GPU (skipped without one).\n"
    "\n"
    "    Each benchmark prints its table on standard output as it finishes. While it\n"
    "    runs, a progress line on standard error says which one is running ([2/3]).\n"
    "    A benchmark that finds nothing to measure (transfer without an OpenCL\n"
    "    device) says so and is reported as skipped. Benchmarks absent from the\n"
    "    source tree this command was built from are listed as not built.\n"
    "\n"
    "OPTIONS\n"
    "    --quick        smaller sizes and fewer repetitions: a smoke run for CI that\n"
    "                   finishes in seconds. The figures are noisier.\n"
    "    --json FILE    write one JSON document: the unimem version, the machine, the\n"
    "                   devices, and per benchmark its status, its run time and the\n"
    "                   report it wrote (every row with its medians in ns).\n"
    "    --plot FILE    draw the rows of every report as bar charts (time per\n"
    "                   operation, log scale, one panel per benchmark) into FILE,\n"
    "                   SVG or PNG after its extension (.svg, .png), with gnuplot.\n"
    "                   Without gnuplot in PATH a note says so; the table and the\n"
    "                   JSON report are complete all the same.\n"
    "    -h, --help     this text.\n"
    "\n"
    "    Other options go to the benchmark itself, when one is named; see the header\n"
    "    comment of bench/bench_<name>.c (for stream: --file-mib N, --limit-mib N,\n"
    "    --chunk-mib N, --reps N, --device N, --dir DIR).\n"
    "\n"
    "ENVIRONMENT\n"
    "    UNIMEM_*       every um_options field, as for any unimem program\n"
    "                   (UNIMEM_BACKENDS=cpu,opencl chooses the backends).\n"
    "    POCL_DEVICES   set to \"pthread pthread\" when unset, so that PoCL offers two\n"
    "                   devices for the device<->device rows.\n"
    "    TMPDIR         where stream writes its temporary file (default /tmp).\n"
    "\n"
    "EXIT STATUS\n"
    "    0  every benchmark ran, or was skipped for lack of a device;\n"
    "    1  a benchmark failed (a wrong result or an error), or FILE could not be\n"
    "       written;\n"
    "    2  bad usage, or the benchmark named is not built into this command.\n"
    "\n"
    "EXAMPLES\n"
    "    unimem bench all --quick --json out/bench.json --plot out/bench.svg\n"
    "    unimem bench stream --chunk-mib 8 --file-mib 1024\n";

typedef struct bench_result {
  const bench_entry *b;
  int status;       /* exit status of its main; -1: not built */
  double seconds;
  char *report;     /* the JSON text it wrote, when it parsed */
  json_value *doc;
} bench_result;

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static char *read_whole_file(const char *path) {
  FILE *f = fopen(path, "rb");
  char *text = NULL;
  size_t len = 0, cap = 0;
  if (f == NULL)
    return NULL;
  for (;;) {
    size_t n;
    if (cap - len < 4096) {
      char *grown = realloc(text, cap + 65536);
      if (grown == NULL) {
        free(text);
        fclose(f);
        return NULL;
      }
      text = grown;
      cap += 65536;
    }
    n = fread(text + len, 1, cap - len - 1, f);
    len += n;
    if (n == 0)
      break;
  }
  fclose(f);
  text[len] = '\0';
  return text;
}

static int in_path(const char *prog) {
  const char *path = getenv("PATH");
  char buf[4096];
  while (path && *path) {
    size_t n = strcspn(path, ":");
    if (n > 0 && n + strlen(prog) + 2 < sizeof(buf)) {
      snprintf(buf, sizeof(buf), "%.*s/%s", (int)n, path, prog);
      if (access(buf, X_OK) == 0)
        return 1;
    }
    path += n + (path[n] == ':');
  }
  return 0;
}

static const char *extension_of(const char *path) {
  const char *dot = strrchr(path, '.');
  const char *slash = strrchr(path, '/');
  return dot != NULL && (slash == NULL || dot > slash) ? dot + 1 : "";
}

/* Make the parent directories of path (mkdir -p) and check that path can
 * be written, before minutes of benchmarks rather than after. */
static int prepare_output(const char *path) {
  char dir[4096];
  FILE *f;
  snprintf(dir, sizeof(dir), "%s", path);
  for (char *p = dir + 1; *p; p++) {
    if (*p != '/')
      continue;
    *p = '\0';
    if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
      fprintf(stderr, "unimem bench: cannot make directory %s: %s\n", dir, strerror(errno));
      return 1;
    }
    *p = '/';
  }
  if ((f = fopen(path, "a")) == NULL) {
    fprintf(stderr, "unimem bench: cannot write %s: %s\n", path, strerror(errno));
    return 1;
  }
  fclose(f);
  return 0;
}

static int run_one(bench_result *r, int quick, int nextra, char **extra) {
  char tmpl[512], *argv[64];
  const char *tmp = getenv("TMPDIR");
  int argc = 0, fd;
  char name[64];
  snprintf(name, sizeof(name), "unimem bench %s", r->b->name);
  snprintf(tmpl, sizeof(tmpl), "%s/unimem-bench-%s-XXXXXX", tmp && *tmp ? tmp : "/tmp", r->b->name);
  fd = mkstemp(tmpl);
  if (fd < 0) {
    fprintf(stderr, "unimem bench: cannot make a temporary file in %s: %s\n", tmp && *tmp ? tmp : "/tmp",
            strerror(errno));
    return 1;
  }
  close(fd);
  argv[argc++] = name;
  if (quick)
    argv[argc++] = "--quick";
  argv[argc++] = "--json";
  argv[argc++] = tmpl;
  for (int i = 0; i < nextra && argc < 63; i++)
    argv[argc++] = extra[i];
  argv[argc] = NULL;

  fflush(stdout);
  r->seconds = now_s();
  r->status = r->b->run(argc, argv);
  r->seconds = now_s() - r->seconds;
  fflush(stdout);

  r->report = read_whole_file(tmpl);
  unlink(tmpl);
  if (r->report != NULL && r->report[0] != '\0') {
    char err[160];
    r->doc = json_parse(r->report, err, sizeof(err));
    if (r->doc == NULL) {
      fprintf(stderr, "unimem bench: the %s report is not valid JSON (%s); it is left out\n", r->b->name, err);
      free(r->report);
      r->report = NULL;
    }
  } else {
    free(r->report);
    r->report = NULL;
  }
  return 0;
}

static const char *status_text(const bench_result *r) {
  if (r->status == 0)
    return "ok";
  if (r->status == BENCH_SKIPPED)
    return "skipped";
  return "failed";
}

/* ------------------------------------------------------------------------ */
/* The merged JSON report */

static void write_devices(FILE *f) {
  um_manager *m = NULL;
  if (um_manager_create(NULL, &m) != UM_OK) {
    fprintf(f, "[]");
    return;
  }
  fprintf(f, "[");
  for (int i = 0; i < um_device_count(m); i++) {
    um_device_info info;
    if (um_device_info_get(um_device_get(m, i), &info) != UM_OK)
      continue;
    fprintf(f, "%s\n    {\"index\":%d,\"backend\":", i ? "," : "", info.index);
    tool_json_string(f, info.backend);
    fprintf(f, ",\"name\":");
    tool_json_string(f, info.name);
    fprintf(f, ",\"caps\":%u,\"locations\":%u,\"total_bytes\":%llu}", info.caps, info.locations,
            (unsigned long long)info.total_bytes);
  }
  fprintf(f, "]");
  um_manager_destroy(m);
}

static int write_report(const char *path, const bench_result *res, int n, int quick) {
  FILE *f = fopen(path, "w");
  struct utsname u;
  time_t t = time(NULL);
  char date[64];
  if (f == NULL) {
    fprintf(stderr, "unimem bench: cannot write %s: %s\n", path, strerror(errno));
    return 1;
  }
  strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", gmtime(&t));
  if (uname(&u) != 0)
    snprintf(u.machine, sizeof(u.machine), "unknown");
  fprintf(f, "{\n  \"tool\": \"unimem bench\",\n  \"version\": \"%s\",\n  \"date\": \"%s\",\n",
          um_version_string(), date);
  fprintf(f, "  \"quick\": %s,\n  \"machine\": {\"arch\": ", quick ? "true" : "false");
  tool_json_string(f, u.machine);
  fprintf(f, ", \"kernel\": ");
  tool_json_string(f, u.release);
  fprintf(f, ", \"cpus\": %ld},\n  \"devices\": ", sysconf(_SC_NPROCESSORS_ONLN));
  write_devices(f);
  fprintf(f, ",\n  \"benchmarks\": [");
  for (int i = 0; i < n; i++) {
    const bench_result *r = &res[i];
    fprintf(f, "%s\n    {\"name\": \"%s\", \"status\": \"%s\", \"exit_status\": %d, \"seconds\": %.3f,\n"
               "     \"report\": ",
            i ? "," : "", r->b->name, status_text(r), r->status, r->seconds);
    if (r->report != NULL) {
      /* Valid JSON already: copied as it was, without its final newline. */
      size_t len = strlen(r->report);
      while (len > 0 && (r->report[len - 1] == '\n' || r->report[len - 1] == ' '))
        len--;
      fwrite(r->report, 1, len, f);
    } else {
      fprintf(f, "null");
    }
    fprintf(f, "}");
  }
  fprintf(f, "\n  ]\n}\n");
  if (fclose(f) != 0) {
    fprintf(stderr, "unimem bench: cannot write %s: %s\n", path, strerror(errno));
    return 1;
  }
  return 0;
}

/* ------------------------------------------------------------------------ */
/* The chart: one panel per benchmark, one cluster per row, one bar per
 * "*_ns" figure of the row (unimem and what it is compared with). */

#define PLOT_MAX_SERIES 6

typedef struct panel {
  const bench_result *r;
  const json_value *rows;
  char series[PLOT_MAX_SERIES][48];
  int nseries;
} panel;

static int ends_with_ns(const char *key) {
  size_t n = strlen(key);
  return n > 3 && strcmp(key + n - 3, "_ns") == 0;
}

static int find_panel_series(panel *p) {
  p->nseries = 0;
  for (size_t i = 0; i < p->rows->count; i++) {
    const json_value *row = p->rows->items[i];
    if (row->type != JSON_OBJECT)
      continue;
    for (size_t k = 0; k < row->count; k++) {
      int known = 0;
      if (row->items[k]->type != JSON_NUMBER || !ends_with_ns(row->keys[k]))
        continue;
      for (int s = 0; s < p->nseries; s++)
        known |= strcmp(p->series[s], row->keys[k]) == 0;
      if (!known && p->nseries < PLOT_MAX_SERIES)
        snprintf(p->series[p->nseries++], sizeof(p->series[0]), "%s", row->keys[k]);
    }
  }
  return p->nseries;
}

/* Text safe inside a gnuplot double-quoted string and a tab-separated
 * data line. */
static void plot_text(FILE *f, const char *s) {
  for (; s && *s; s++) {
    if (*s == '"' || *s == '\\')
      fputc('\\', f);
    fputc(*s == '\t' || *s == '\n' || *s == '\r' ? ' ' : *s, f);
  }
}

static void write_panel(FILE *g, const panel *p, int idx, int quick) {
  const char *device = json_get_string(p->r->doc, "device");
  fprintf(g, "$data%d << EOD\n", idx);
  for (size_t i = 0; i < p->rows->count; i++) {
    const json_value *row = p->rows->items[i];
    const char *name = json_get_string(row, "name");
    if (row->type != JSON_OBJECT)
      continue;
    plot_text(g, name ? name : "?");
    for (int s = 0; s < p->nseries; s++) {
      const json_value *v = json_get(row, p->series[s]);
      if (v != NULL && v->type == JSON_NUMBER && v->number > 0)
        fprintf(g, "\t%.6g", v->number);
      else
        fputs("\t?", g);
    }
    fputc('\n', g);
  }
  fputs("EOD\n", g);
  fprintf(g, "set title \"");
  plot_text(g, p->r->b->name);
  if (device != NULL) {
    fputs(" on ", g);
    plot_text(g, device);
  }
  fprintf(g, "%s: time, lower is better\"\n", quick ? " (--quick)" : "");
  fputs("plot ", g);
  for (int s = 0; s < p->nseries; s++) {
    char label[48];
    snprintf(label, sizeof(label), "%.*s", (int)strlen(p->series[s]) - 3, p->series[s]);
    /* Figures are in ns; the axis is in seconds with SI prefixes. */
    fprintf(g, "%s$data%d using ($%d*1e-9)%s title \"", s ? ", " : "", idx, s + 2, s == 0 ? ":xtic(1)" : "");
    plot_text(g, label);
    fputs("\"", g);
  }
  fputc('\n', g);
}

/* prepare_output made the file to check it could: remove it while it is
 * still empty, so that no empty chart is left behind. */
static void remove_if_empty(const char *path) {
  struct stat sb;
  if (stat(path, &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_size == 0)
    unlink(path);
}

static int draw_chart(const char *path, const bench_result *res, int n, int quick) {
  panel panels[NBENCHES];
  int np = 0, width = 900, height, rc;
  const char *ext = extension_of(path);
  FILE *g;
  for (int i = 0; i < n; i++) {
    const json_value *rows = res[i].doc ? json_get(res[i].doc, "rows") : NULL;
    if (rows == NULL || rows->type != JSON_ARRAY || rows->count == 0)
      continue;
    panels[np].r = &res[i];
    panels[np].rows = rows;
    if (find_panel_series(&panels[np]) == 0)
      continue;
    {
      int w = 200 + (int)rows->count * (panels[np].nseries * 12 + 16);
      if (w > width)
        width = w;
    }
    np++;
  }
  if (np == 0) {
    fprintf(stderr, "unimem bench: no figures to draw (no benchmark wrote rows); no chart\n");
    remove_if_empty(path);
    return 0;
  }
  if (!in_path("gnuplot")) {
    fprintf(stderr, "unimem bench: gnuplot is not installed (Debian: gnuplot-nox): no chart; "
                    "the table and the JSON report are complete\n");
    remove_if_empty(path);
    return 0;
  }
  if (width > 2400)
    width = 2400;
  height = 160 + 460 * np;
  g = popen("gnuplot", "w");
  if (g == NULL) {
    fprintf(stderr, "unimem bench: cannot start gnuplot: %s\n", strerror(errno));
    return 1;
  }
  if (!strcmp(ext, "png"))
    fprintf(g, "set terminal pngcairo size %d,%d noenhanced font \"sans,9\" background rgb \"white\"\n", width, height);
  else
    fprintf(g, "set terminal svg size %d,%d dynamic noenhanced font \"sans,10\" background rgb \"white\"\n", width, height);
  fputs("set output \"", g);
  plot_text(g, path);
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
  fprintf(g, "set multiplot layout %d,1 title \"unimem %s bench%s\"\n", np, um_version_string(),
          quick ? " --quick" : "");
  for (int i = 0; i < np; i++) {
    write_panel(g, &panels[i], i, quick);
  }
  fputs("unset multiplot\n", g);
  rc = pclose(g);
  if (rc != 0) {
    fprintf(stderr, "unimem bench: gnuplot failed (status %d): no chart\n", rc);
    remove_if_empty(path);
    return 1;
  }
  return 0;
}

/* ------------------------------------------------------------------------ */

static int usage_error(const char *fmt, const char *arg) {
  fprintf(stderr, "unimem bench: ");
  fprintf(stderr, fmt, arg);
  fprintf(stderr, "\nusage: unimem bench [pool|transfer|stream|cuda|all] [--quick] [--json FILE] [--plot FILE]\n"
                  "       (unimem bench --help for more)\n");
  return 2;
}

int tool_bench(int argc, char **argv) {
  const char *which = NULL, *json = NULL, *plot = NULL;
  char **extra = calloc((size_t)argc + 1, sizeof(char *));
  bench_result res[NBENCHES];
  int quick = 0, nextra = 0, n = 0, failed = 0, rc = 0, tty = isatty(STDERR_FILENO);

  if (extra == NULL)
    return 1;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (tool_is_help(a)) {
      fputs(tool_bench_help, stdout);
      free(extra);
      return 0;
    } else if (!strcmp(a, "--quick")) {
      quick = 1;
    } else if (!strcmp(a, "--json") || !strcmp(a, "--plot")) {
      if (i + 1 >= argc) {
        free(extra);
        return usage_error("%s needs a file name", a);
      }
      *(a[2] == 'j' ? &json : &plot) = argv[++i];
    } else if (a[0] != '-' && which == NULL) {
      which = a;
    } else {
      extra[nextra++] = argv[i];
    }
  }
  if (which == NULL)
    which = "all";
  if (strcmp(which, "all") != 0) {
    int known = 0;
    for (size_t i = 0; i < NBENCHES; i++)
      known |= strcmp(benches[i].name, which) == 0;
    if (!known) {
      free(extra);
      return usage_error("unknown benchmark '%s' (pool, transfer, stream, cuda or all)", which);
    }
  } else if (nextra > 0) {
    rc = usage_error("'%s': options for a benchmark need the benchmark named", extra[0]);
    free(extra);
    return rc;
  }
  if (plot != NULL && strcmp(extension_of(plot), "svg") != 0 && strcmp(extension_of(plot), "png") != 0) {
    free(extra);
    return usage_error("--plot %s: the file must end in .svg or .png", plot);
  }

  if ((json != NULL && prepare_output(json) != 0) || (plot != NULL && prepare_output(plot) != 0)) {
    free(extra);
    return 1;
  }

  /* Before anything loads OpenCL: two PoCL devices for the peer rows. */
  setenv("POCL_DEVICES", "pthread pthread", 0);

  memset(res, 0, sizeof(res));
  for (size_t i = 0; i < NBENCHES; i++)
    if (!strcmp(which, "all") || !strcmp(which, benches[i].name))
      res[n++].b = &benches[i];
  for (int i = 0; i < n; i++) {
    bench_result *r = &res[i];
    if (tty)
      fprintf(stderr, "\r\033[K[%d/%d] %s: %s ...\n", i + 1, n, r->b->name, r->b->what);
    else
      fprintf(stderr, "[%d/%d] unimem bench %s ...\n", i + 1, n, r->b->name);
    if (run_one(r, quick, nextra, extra) != 0)
      r->status = 1;
    if (r->status != 0 && r->status != BENCH_SKIPPED)
      failed = 1;
    printf("\n");
  }

  printf("summary:");
  for (int i = 0; i < n; i++)
    printf("%s %s %s", i ? "," : "", res[i].b->name, status_text(&res[i]));
  printf("\n");
  if (json != NULL) {
    if (write_report(json, res, n, quick) != 0)
      failed = 1;
    else
      printf("full report: %s\n", json);
  }
  if (plot != NULL) {
    struct stat sb;
    if (draw_chart(plot, res, n, quick) != 0)
      failed = 1;
    else if (stat(plot, &sb) == 0)
      printf("chart: %s\n", plot);
  }
  for (int i = 0; i < n; i++) {
    json_free(res[i].doc);
    free(res[i].report);
  }
  free(extra);
  return failed ? 1 : 0;
}
