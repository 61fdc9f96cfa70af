/* unimem bench: runs the benchmarks of bench/ (compiled into the command
 * with -DUM_BENCH_NO_MAIN), each of which fills a report in memory
 * (bench/report.h) and prints its own table; merges the reports into one
 * JSON file and hands them to the chart (plot.c). This file only
 * orchestrates. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "tool.h"
#include "unimem.h"

int um_bench_pool_main(int argc, char **argv, bench_report *rep);
int um_bench_transfer_main(int argc, char **argv, bench_report *rep);
int um_bench_kernels_main(int argc, char **argv, bench_report *rep);
int um_bench_loop_main(int argc, char **argv, bench_report *rep);
int um_bench_gemm_main(int argc, char **argv, bench_report *rep);
int um_bench_stream_main(int argc, char **argv, bench_report *rep);
int um_bench_cuda_main(int argc, char **argv, bench_report *rep);
int um_bench_net_main(int argc, char **argv, bench_report *rep);
int um_bench_wait_main(int argc, char **argv, bench_report *rep);
int um_bench_pyloop_main(int argc, char **argv, bench_report *rep);

typedef struct bench_entry {
  const char *name;
  bench_entry_fn run;
  const char *what;
} bench_entry;

static const bench_entry benches[] = {
    {"pool", um_bench_pool_main, "pool hits and allocate+touch against glibc, jemalloc and mimalloc"},
    {"transfer", um_bench_transfer_main, "copies against the raw OpenCL calls and memcpy"},
    {"kernels", um_bench_kernels_main, "a chain of the caller's kernels between unimem copies against raw events"},
    {"loop", um_bench_loop_main, "the caller's loop (allocate, copy in, kernel, copy out, release) against raw OpenCL"},
    {"pyloop", um_bench_pyloop_main, "the caller's loop from Python (bench_loop.py) against raw pyopencl"},
    {"gemm", um_bench_gemm_main, "a three-buffer SGEMM-shaped step of the caller's against the raw kernel launch"},
    {"stream", um_bench_stream_main, "a file larger than the device through um_stream against read()+copy"},
    {"cuda", um_bench_cuda_main, "pool, copies and 4 KiB copies on an NVIDIA GPU against the CUDA driver's calls"},
    {"net", um_bench_net_main, "um_net put/get between two processes against ucx_perftest"},
    {"wait", um_bench_wait_main, "blocking 4 KiB round trip with and without wait_spin_ns, against raw OpenCL and StarPU"},
};
#define NBENCHES (sizeof(benches) / sizeof(benches[0]))

const char tool_bench_help[] =
    "NAME\n"
    "    unimem bench - measure unimem against the allocators and drivers it replaces\n"
    "\n"
    "SYNOPSIS\n"
    "    unimem bench [pool|transfer|kernels|loop|pyloop|gemm|stream|cuda|net|wait|all] [--quick]\n"
    "                 [--json FILE] [--plot FILE]\n"
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
    "    kernels   a chain of small kernels of the caller's own (x = 3x + 1, 4 KiB to\n"
    "              1 MiB) with unimem copies between them, device-local and peer,\n"
    "              against the same chain written with raw OpenCL events: the cost\n"
    "              unimem adds per step (um_access_begin/end and um_copy).\n"
    "    loop      the caller's loop on the first OpenCL device: allocate two buffers,\n"
    "              copy in, one kernel of the caller's own, blocking copy out, check,\n"
    "              release; sizes log-uniform in 1-64 KiB and in 4 KiB-4 MiB, changing\n"
    "              every iteration; raw OpenCL against unimem pooled and unpooled and\n"
    "              against the raw calls on pooled unimem buffers: medians, spreads,\n"
    "              ratios to raw, the pooling gain and where the time goes.\n"
    "              --iters N (per repetition, default 1000), --reps N (default 11).\n"
    "    pyloop    the same loop from Python (bench/bench_loop.py, run with the\n"
    "              interpreter and package this unimem was built with): raw pyopencl\n"
    "              against unimem on the caller's queue (use_queue, unimem.access, no\n"
    "              done event), on unimem's own queues, unpooled, and pyopencl's calls\n"
    "              on pooled unimem buffers (to_pyopencl). --iters N (default 400),\n"
    "              --reps N (default 7). Skipped, saying why, without the package or\n"
    "              pyopencl. UNIMEM_PYTHON, UNIMEM_BENCH_SCRIPT: another interpreter\n"
    "              or script.\n"
    "    gemm      a step shaped like SGEMM on the first OpenCL device: C = A * B\n"
    "              (n = 16 to 128), one kernel of the caller's on three buffers, no\n"
    "              wait list, chained on one queue, then one blocking read of C,\n"
    "              checked; the raw launch against um_access_begin_n/end_n on the\n"
    "              caller's queue and on unimem's own. --steps N, --reps N.\n"
    "    stream    a file several times larger than the device's memory (capped with\n"
    "              device_limit_bytes) through um_stream, against a loop of read()\n"
    "              and blocking copies.\n"
    "    cuda      pool hit against cuMemAlloc/cuMemFree and cuMemAllocAsync (1 KiB to\n"
    "              1 GiB), pinned and pageable host<->device bandwidth against\n"
    "              cuMemcpyHtoD/DtoH, device-local copies, and small 4 KiB copies: 1000\n"
    "              in one um_copy_batch against 1000 cuMemcpyHtoDAsync on one stream, one\n"
    "              with an event against cuMemcpyHtoDAsync + cuEventRecord +\n"
    "              cuEventSynchronize, and a blocking round trip; on the first NVIDIA\n"
    "              GPU (skipped without one). --small: the small copies alone.\n"
    "    net       um_net put and get bandwidth and put latency per size between two\n"
    "              processes of this machine, next to ucx_perftest on the same UCX\n"
    "              transport (UCX_TLS), in alternating rounds: medians and spreads\n"
    "              (skipped without UCX or without ucx_perftest). unimem runs twice:\n"
    "              with buffers of um_alloc and with buffers of um_net_alloc (memory\n"
    "              UCX allocated; --unimem pool|alloc|both picks). --rounds N.\n"
    "              --inflight N: transfers in flight (default 4, from as many buffers\n"
    "              to as many remote ranges; 1 is ucx_perftest's pattern).\n"
    "    wait      a blocking 4 KiB device->host round trip on the first OpenCL device\n"
    "              with um_options.wait_spin_ns 0 and with a spin (--spin-ns NS,\n"
    "              default 50000), against the raw blocking read, the raw read with a\n"
    "              polling wait, and StarPU's blocking acquire where StarPU is\n"
    "              installed; and the CPU seconds per second the process burns idle\n"
    "              and while a thread waits on a long operation, for both settings.\n"
    "              Interleaved rounds (--rounds N). Each round trip starts a busy gap\n"
    "              after the previous one returned, for each gap of --gap-us LIST\n"
    "              (microseconds, default 0,2,5,10,20,50; --quick 0,20): PoCL's round\n"
    "              trip depends on how soon the next read follows a completion.\n"
    "\n"
    "    Each benchmark prints its table on standard output as it finishes. While it\n"
    "    runs, a progress line on standard error says which one is running ([2/3]).\n"
    "    A benchmark that finds nothing to measure (transfer, kernels, loop or\n"
    "    gemm without an OpenCL device) says so and is reported as skipped.\n"
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
    "    --chunk-mib N, --reps N, --device N, --dir DIR; for kernels: --steps N,\n"
    "    --reps N; for loop and pyloop: --iters N, --reps N; for gemm: --steps N, --reps N).\n"
    "\n"
    "ENVIRONMENT\n"
    "    UNIMEM_*       every um_options field, as for any unimem program\n"
    "                   (UNIMEM_BACKENDS=cpu,opencl chooses the backends).\n"
    "    POCL_DEVICES   set to \"pthread pthread\" when unset, so that PoCL offers two\n"
    "                   devices for the device<->device and peer rows.\n"
    "    TMPDIR         where stream writes its temporary file (default /tmp).\n"
    "    UCX_TLS, UCX_NET_DEVICES\n"
    "                   the UCX transport net measures, for um_net and ucx_perftest\n"
    "                   alike (e.g. UCX_TLS=posix,self; UCX_TLS=tcp UCX_NET_DEVICES=lo).\n"
    "\n"
    "EXIT STATUS\n"
    "    0  every benchmark ran, or was skipped for lack of a device;\n"
    "    1  a benchmark failed (a wrong result or an error), or FILE could not be\n"
    "       written;\n"
    "    2  bad usage.\n"
    "\n"
    "EXAMPLES\n"
    "    unimem bench all --quick --json out/bench.json --plot out/bench.svg\n"
    "    unimem bench stream --chunk-mib 8 --file-mib 1024\n";

typedef struct bench_result {
  const bench_entry *b;
  int status; /* exit status of its entry point */
  double seconds;
  bench_report report;
} bench_result;

/* The command line: the benchmark (NULL: all), the outputs, and the
 * options passed on to the benchmark. */
typedef struct bench_args {
  const char *which, *json, *plot;
  bool quick;
  int nextra;
  char **extra;
} bench_args;

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
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

/* Run one benchmark: its name, --quick, the options for it. */
static void run_one(bench_result *r, const bench_args *a) {
  char name[64], *argv[64];
  int argc = 0;
  snprintf(name, sizeof(name), "unimem bench %s", r->b->name);
  argv[argc++] = name;
  if (a->quick)
    argv[argc++] = "--quick";
  for (int i = 0; i < a->nextra && argc < 63; i++)
    argv[argc++] = a->extra[i];
  argv[argc] = NULL;
  bench_report_init(&r->report, r->b->name);
  fflush(stdout);
  r->seconds = now_s();
  r->status = r->b->run(argc, argv, &r->report);
  r->seconds = now_s() - r->seconds;
  fflush(stdout);
}

static const char *status_text(const bench_result *r) {
  if (r->status == 0)
    return "ok";
  if (r->status == BENCH_SKIPPED)
    return "skipped";
  return "failed";
}

/* ------------------------------------------------------------------------ */
/* The merged JSON report                                                    */

static void write_machine(FILE *f) {
  struct utsname u;
  bench_row machine = {.ncells = 0};
  if (uname(&u) != 0)
    snprintf(u.machine, sizeof(u.machine), "unknown");
  bench_set_text(&machine, "arch", u.machine);
  bench_set_text(&machine, "kernel", u.release);
  bench_set(&machine, "cpus", (double)sysconf(_SC_NPROCESSORS_ONLN));
  bench_json_object(f, &machine);
}

static void write_devices(FILE *f) {
  um_manager *m = NULL;
  fputc('[', f);
  if (um_manager_create(NULL, &m) != UM_OK) {
    fputc(']', f);
    return;
  }
  for (int i = 0, n = 0; i < um_device_count(m); i++) {
    um_device_info info;
    bench_row dev = {.ncells = 0};
    if (um_device_info_get(um_device_get(m, i), &info) != UM_OK)
      continue;
    bench_set(&dev, "index", info.index);
    bench_set_text(&dev, "backend", info.backend);
    bench_set_text(&dev, "name", info.name);
    bench_set(&dev, "caps", info.caps);
    bench_set(&dev, "locations", info.locations);
    bench_set(&dev, "total_bytes", (double)info.total_bytes);
    fputs(n++ ? ",\n    " : "\n    ", f);
    bench_json_object(f, &dev);
  }
  fputc(']', f);
  um_manager_destroy(m);
}

static int write_report(const char *path, const bench_result *res, int n, bool quick) {
  FILE *f = fopen(path, "w");
  time_t t = time(NULL);
  char date[64];
  if (f == NULL) {
    fprintf(stderr, "unimem bench: cannot write %s: %s\n", path, strerror(errno));
    return 1;
  }
  strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", gmtime(&t));
  fprintf(f, "{\n  \"tool\": \"unimem bench\",\n  \"version\": \"%s\",\n  \"date\": \"%s\",\n", um_version_string(),
          date);
  fprintf(f, "  \"quick\": %s,\n  \"machine\": ", quick ? "true" : "false");
  write_machine(f);
  fputs(",\n  \"devices\": ", f);
  write_devices(f);
  fputs(",\n  \"benchmarks\": [", f);
  for (int i = 0; i < n; i++) {
    const bench_result *r = &res[i];
    fprintf(f, "%s\n    {\"name\": \"%s\", \"status\": \"%s\", \"exit_status\": %d, \"seconds\": %.3f,\n     \"report\": ",
            i ? "," : "", r->b->name, status_text(r), r->status, r->seconds);
    if (bench_report_has_data(&r->report))
      bench_json_report(f, &r->report);
    else
      fputs("null", f);
    fputc('}', f);
  }
  fputs("\n  ]\n}\n", f);
  if (fclose(f) != 0) {
    fprintf(stderr, "unimem bench: cannot write %s: %s\n", path, strerror(errno));
    return 1;
  }
  return 0;
}

/* ------------------------------------------------------------------------ */
/* The command                                                               */

static int usage_error(const char *fmt, const char *arg) {
  fprintf(stderr, "unimem bench: ");
  fprintf(stderr, fmt, arg);
  fprintf(stderr, "\nusage: unimem bench [pool|transfer|kernels|loop|pyloop|gemm|stream|cuda|net|wait|all] [--quick]\n"
                  "                    [--json FILE] [--plot FILE] (unimem bench --help for more)\n");
  return 2;
}

static bool known_bench(const char *name) {
  for (size_t i = 0; i < NBENCHES; i++)
    if (strcmp(benches[i].name, name) == 0)
      return true;
  return false;
}

/* 0: run; 1: help printed; 2: bad usage (said). a->extra must hold argc
 * entries. */
static int parse_args(int argc, char **argv, bench_args *a) {
  for (int i = 1; i < argc; i++) {
    const char *arg = argv[i];
    if (tool_is_help(arg)) {
      fputs(tool_bench_help, stdout);
      return 1;
    } else if (!strcmp(arg, "--quick")) {
      a->quick = true;
    } else if (!strcmp(arg, "--json") || !strcmp(arg, "--plot")) {
      if (i + 1 >= argc)
        return usage_error("%s needs a file name", arg);
      *(arg[2] == 'j' ? &a->json : &a->plot) = argv[++i];
    } else if (arg[0] != '-' && a->which == NULL) {
      a->which = arg;
    } else {
      a->extra[a->nextra++] = argv[i];
    }
  }
  if (a->which == NULL)
    a->which = "all";
  if (strcmp(a->which, "all") != 0 && !known_bench(a->which))
    return usage_error("unknown benchmark '%s' (pool, transfer, kernels, loop, pyloop, gemm, stream, cuda, net, "
                       "wait or all)",
                       a->which);
  if (strcmp(a->which, "all") == 0 && a->nextra > 0)
    return usage_error("'%s': options for a benchmark need the benchmark named", a->extra[0]);
  if (a->plot != NULL && !tool_chart_path_ok(a->plot))
    return usage_error("--plot %s: the file must end in .svg or .png", a->plot);
  return 0;
}

/* Every benchmark asked for, in turn, with a progress line; the summary.
 * Returns how many ran. */
static int run_benches(const bench_args *a, bench_result *res, bool *failed) {
  int n = 0, tty = isatty(STDERR_FILENO);
  for (size_t i = 0; i < NBENCHES; i++)
    if (!strcmp(a->which, "all") || !strcmp(a->which, benches[i].name))
      res[n++].b = &benches[i];
  for (int i = 0; i < n; i++) {
    bench_result *r = &res[i];
    if (tty)
      fprintf(stderr, "\r\033[K[%d/%d] %s: %s ...\n", i + 1, n, r->b->name, r->b->what);
    else
      fprintf(stderr, "[%d/%d] unimem bench %s ...\n", i + 1, n, r->b->name);
    run_one(r, a);
    if (r->status != 0 && r->status != BENCH_SKIPPED)
      *failed = true;
    printf("\n");
  }
  printf("summary:");
  for (int i = 0; i < n; i++)
    printf("%s %s %s", i ? "," : "", res[i].b->name, status_text(&res[i]));
  printf("\n");
  return n;
}

/* The merged report and the chart, from the reports in memory. */
static bool write_outputs(const bench_args *a, const bench_result *res, int n) {
  const bench_report *reps[NBENCHES];
  struct stat sb;
  bool failed = false;
  if (a->json != NULL) {
    if (write_report(a->json, res, n, a->quick) != 0)
      failed = true;
    else
      printf("full report: %s\n", a->json);
  }
  if (a->plot == NULL)
    return failed;
  for (int i = 0; i < n; i++)
    reps[i] = &res[i].report;
  if (tool_draw_chart(a->plot, reps, n, a->quick) != 0)
    failed = true;
  else if (stat(a->plot, &sb) == 0)
    printf("chart: %s\n", a->plot);
  return failed;
}

int tool_bench(int argc, char **argv) {
  bench_args a = {.extra = calloc((size_t)argc + 1, sizeof(char *))};
  bench_result res[NBENCHES];
  bool failed = false;
  int n, rc;

  if (a.extra == NULL)
    return 1;
  if ((rc = parse_args(argc, argv, &a)) != 0 || (a.json != NULL && prepare_output(a.json) != 0) ||
      (a.plot != NULL && prepare_output(a.plot) != 0)) {
    free(a.extra);
    return rc == 1 ? 0 : rc == 2 ? 2 : 1;
  }
  /* Before anything loads OpenCL: two PoCL devices for the peer rows. */
  setenv("POCL_DEVICES", "pthread pthread", 0);
  memset(res, 0, sizeof(res));
  n = run_benches(&a, res, &failed);
  if (write_outputs(&a, res, n))
    failed = true;
  for (int i = 0; i < n; i++)
    bench_report_free(&res[i].report);
  free(a.extra);
  return failed ? 1 : 0;
}
