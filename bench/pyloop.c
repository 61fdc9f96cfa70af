/* unimem bench pyloop: the caller's loop from Python (bench/bench_loop.py),
 * run by the unimem command with the interpreter and the package it was
 * built with, its rows read back into the report. The script prints its own
 * table; it hands the rows over in a file (--tsv FILE: one row per line,
 * "table<TAB>name" then key<TAB>value pairs, the facts on a line whose
 * table is "facts").
 *
 * Where things are: UNIMEM_PYTHON (the interpreter), UNIMEM_BENCH_SCRIPT
 * (bench_loop.py) and PYTHONPATH (prepended by the package's build
 * directory) override what the build compiled in (UM_PYLOOP_PYTHON,
 * UM_PYLOOP_SCRIPT, UM_PYLOOP_PATH; an installed command falls back on the
 * script under the data directory, UM_PYLOOP_SCRIPT_INSTALLED). Built without the Python package, or
 * with the script or interpreter missing, the benchmark says so and is
 * skipped. Compiled into the unimem command only (no program of its own). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "report.h"

int um_bench_pyloop_main(int argc, char **argv, bench_report *rep);

#ifndef UM_PYLOOP_PYTHON
#define UM_PYLOOP_PYTHON ""
#endif
#ifndef UM_PYLOOP_SCRIPT
#define UM_PYLOOP_SCRIPT ""
#endif
#ifndef UM_PYLOOP_PATH
#define UM_PYLOOP_PATH ""
#endif
#ifndef UM_PYLOOP_SCRIPT_INSTALLED
#define UM_PYLOOP_SCRIPT_INSTALLED ""
#endif

static const char *setting(const char *env, const char *built) {
  const char *v = getenv(env);
  return v != NULL && *v ? v : built;
}

/* A cell's value: a number where the whole text is one, else text
 * ("True"/"False" become booleans). */
static void set_cell(bench_row *row, const char *key, const char *value) {
  char *end;
  double v;
  if (!strcmp(value, "True") || !strcmp(value, "False")) {
    bench_set_bool(row, key, value[0] == 'T');
    return;
  }
  errno = 0;
  v = strtod(value, &end);
  if (*value && *end == '\0' && errno == 0)
    bench_set(row, key, v);
  else
    bench_set_text(row, key, value);
}

/* One line of the file: facts or a row. 0, or 1 for a malformed line. */
static int read_line(bench_report *rep, char *line) {
  char *save = NULL, *table, *name, *key, *value;
  bench_row *row;
  line[strcspn(line, "\n")] = '\0';
  if (*line == '\0')
    return 0;
  table = strtok_r(line, "\t", &save);
  if (table == NULL)
    return 1;
  if (!strcmp(table, "facts")) {
    row = &rep->facts;
  } else {
    if ((name = strtok_r(NULL, "\t", &save)) == NULL)
      return 1;
    row = bench_add_row(rep, table, name);
  }
  while ((key = strtok_r(NULL, "\t", &save)) != NULL) {
    if ((value = strtok_r(NULL, "\t", &save)) == NULL)
      return 1;
    set_cell(row, key, value);
  }
  return 0;
}

static int read_rows(bench_report *rep, const char *path) {
  char line[8192];
  int bad = 0;
  FILE *f = fopen(path, "r");
  if (f == NULL) {
    fprintf(stderr, "unimem bench pyloop: the script wrote no rows (%s: %s)\n", path, strerror(errno));
    return 1;
  }
  while (fgets(line, sizeof(line), f) != NULL)
    bad |= read_line(rep, line);
  fclose(f);
  if (bad)
    fprintf(stderr, "unimem bench pyloop: malformed rows in %s\n", path);
  return bad;
}

/* The child: PYTHONPATH, then the interpreter on the script. */
static void run_child(const char *python, const char *script, const char *path, char *tsv, int argc, char **argv) {
  char *args[72], env[8192];
  const char *old = getenv("PYTHONPATH");
  int n = 0;
  if (*path) {
    snprintf(env, sizeof(env), "%s%s%s", path, old != NULL && *old ? ":" : "", old != NULL ? old : "");
    setenv("PYTHONPATH", env, 1);
  }
  if (getenv("POCL_DEVICES") == NULL)
    setenv("POCL_DEVICES", "pthread", 1);
  args[n++] = (char *)python;
  args[n++] = (char *)script;
  for (int i = 1; i < argc && n < 68; i++)
    args[n++] = argv[i];
  args[n++] = "--tsv";
  args[n++] = tsv;
  args[n] = NULL;
  execv(python, args);
  fprintf(stderr, "unimem bench pyloop: cannot run %s: %s\n", python, strerror(errno));
  _exit(127);
}

int um_bench_pyloop_main(int argc, char **argv, bench_report *rep) {
  const char *python = setting("UNIMEM_PYTHON", UM_PYLOOP_PYTHON);
  const char *script = setting("UNIMEM_BENCH_SCRIPT", UM_PYLOOP_SCRIPT);
  /* The rows come back through a file of this process's own under TMPDIR
   * (made with O_EXCL, so never another's). */
  const char *tmpdir = setting("TMPDIR", "/tmp");
  char tsv[PATH_MAX];
  int fd, status, rc;
  pid_t pid;
  if (getenv("UNIMEM_BENCH_SCRIPT") == NULL && access(script, R_OK) != 0)
    script = UM_PYLOOP_SCRIPT_INSTALLED; /* an installed command */
  if (!*python || access(python, X_OK) != 0 || !*script || access(script, R_OK) != 0) {
    const char *what = !*python                     ? "this unimem was built without the Python package"
                       : access(python, X_OK) != 0 ? "no interpreter at"
                                                   : "no bench_loop.py at";
    printf("pyloop: SKIPPED: %s %s (set UNIMEM_PYTHON to the interpreter, UNIMEM_BENCH_SCRIPT to "
           "bench/bench_loop.py)\n",
           what, !*python ? "" : access(python, X_OK) != 0 ? python : script);
    return BENCH_SKIPPED;
  }
  fd = -1;
  for (unsigned n = 0; fd < 0 && n < 100; n++) {
    if (snprintf(tsv, sizeof tsv, "%s/unimem-pyloop-rows-%ld-%u", tmpdir, (long)getpid(), n) >= (int)sizeof tsv) {
      fprintf(stderr, "unimem bench pyloop: TMPDIR is too long\n");
      return 1;
    }
    fd = open(tsv, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0 && errno != EEXIST)
      break;
  }
  if (fd < 0) {
    fprintf(stderr, "unimem bench pyloop: cannot make a temporary file: %s\n", strerror(errno));
    return 1;
  }
  close(fd);
  fflush(stdout);
  fflush(stderr);
  if ((pid = fork()) < 0) {
    fprintf(stderr, "unimem bench pyloop: fork: %s\n", strerror(errno));
    unlink(tsv);
    return 1;
  }
  if (pid == 0)
    run_child(python, script, UM_PYLOOP_PATH, tsv, argc, argv);
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
    continue;
  rc = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
  if (rc == 0)
    rc = read_rows(rep, tsv);
  else if (rc != BENCH_SKIPPED && rc != 2)
    rc = 1;
  unlink(tsv);
  return rc;
}
