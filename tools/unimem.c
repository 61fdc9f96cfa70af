/* The unimem command: info, bench, stats, replay, view. */
#include <stdio.h>
#include <string.h>

#include "tool.h"
#include "unimem.h"

static const char main_help[] =
    "NAME\n"
    "    unimem - inspect, exercise and measure the unimem memory library\n"
    "\n"
    "SYNOPSIS\n"
    "    unimem info [--verbose]\n"
    "    unimem bench [pool|transfer|kernels|loop|pyloop|gemm|stream|cuda|net|wait|all] [--quick]\n"
    "                 [--json FILE] [--plot FILE]\n"
    "    unimem stats [--device N] [--json FILE] [--history FILE]\n"
    "    unimem replay FILE [--quick] [--json FILE] [--plot FILE]\n"
    "    unimem view FILE [-o PAGE]\n"
    "    unimem help [COMMAND]\n"
    "    unimem --version\n"
    "\n"
    "DESCRIPTION\n"
    "    unimem allocates, pools, moves and inspects memory on the host CPU (device\n"
    "    0), OpenCL devices and NVIDIA GPUs through one C API. This command shows\n"
    "    what it finds on this machine and how it performs here.\n"
    "\n"
    "COMMANDS\n"
    "    info     the devices, the locations each can allocate, memory,\n"
    "             capabilities and the peer-access matrix; --verbose adds each\n"
    "             device's native handles (OpenCL context and queue, CUDA\n"
    "             context and stream) for running kernels of your own.\n"
    "    bench    the benchmarks, with the libraries and drivers unimem replaces\n"
    "             measured side by side; a table, a JSON report and a chart.\n"
    "    stats    a scripted workload, then every statistic unimem keeps, and the\n"
    "             statistics of each tag; --history records it for unimem view.\n"
    "    replay   an allocation trace (UNIMEM_TRACE_FILE records one) through the\n"
    "             pool and glibc, jemalloc and mimalloc: hits, memory reserved\n"
    "             over the replay (a chart with --plot), peak RSS, time per event.\n"
    "    view     a recorded history (um_history_write) as one HTML page: memory\n"
    "             over time by tag, the block map, copy lanes, the largest blocks.\n"
    "    help     this text, or a command's (also: unimem COMMAND --help).\n"
    "\n"
    "ENVIRONMENT\n"
    "    Every um_options field has a UNIMEM_<NAME> variable, read when a manager\n"
    "    is created: UNIMEM_BACKENDS=cpu,opencl,cuda chooses the backends,\n"
    "    UNIMEM_MAX_POOL_BYTES=1g caps the pool, UNIMEM_DEVICE_LIMIT_BYTES=64m caps\n"
    "    each non-host device, UNIMEM_LOG_LEVEL=info explains skipped backends.\n"
    "    Sizes take k, m, g suffixes (powers of 1024). UNIMEM_TRACE_DIR names the\n"
    "    directory of the allocation trace `unimem bench pool` replays; unset, it\n"
    "    is found beside this command (../share/unimem/traces once installed,\n"
    "    ../bench/traces in the build tree).\n"
    "\n"
    "EXIT STATUS\n"
    "    0 success; 1 a failure while running; 2 bad usage. Each command's help\n"
    "    gives the details.\n"
    "\n"
    "SEE ALSO\n"
    "    unimem(1), unimem.h, docs/guide.md\n";

int tool_is_help(const char *arg) { return !strcmp(arg, "--help") || !strcmp(arg, "-h"); }

typedef struct command {
  const char *name;
  int (*run)(int argc, char **argv);
  const char *help;
} command;

static const command commands[] = {
    {"info", tool_info, tool_info_help},
    {"bench", tool_bench, tool_bench_help},
    {"stats", tool_stats, tool_stats_help},
    {"replay", tool_replay, tool_replay_help},
    {"view", tool_view, tool_view_help},
};

static const command *find_command(const char *name) {
  for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
    if (!strcmp(commands[i].name, name))
      return &commands[i];
  return NULL;
}

int main(int argc, char **argv) {
  const command *c;
  if (argc < 2) {
    fputs(main_help, stderr);
    return 2;
  }
  if (tool_is_help(argv[1])) {
    fputs(main_help, stdout);
    return 0;
  }
  if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
    printf("unimem %s\n", um_version_string());
    return 0;
  }
  if (!strcmp(argv[1], "help")) {
    if (argc < 3) {
      fputs(main_help, stdout);
      return 0;
    }
    if ((c = find_command(argv[2])) == NULL) {
      fprintf(stderr, "unimem: no command '%s' (info, bench, stats, replay, view)\n", argv[2]);
      return 2;
    }
    fputs(c->help, stdout);
    return 0;
  }
  if ((c = find_command(argv[1])) == NULL) {
    fprintf(stderr, "unimem: unknown command '%s' (info, bench, stats, replay, view; unimem --help)\n", argv[1]);
    return 2;
  }
  return c->run(argc - 1, argv + 1);
}
