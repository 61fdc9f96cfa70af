/* unimem info: what the machine offers. */
#include <stdio.h>
#include <string.h>

#include "tool.h"
#include "unimem.h"

static const char *const location_names[] = {"host", "device", "pinned", "unified"};

const char tool_info_help[] =
    "NAME\n"
    "    unimem info - the devices unimem finds and what each can do\n"
    "\n"
    "SYNOPSIS\n"
    "    unimem info [--verbose]\n"
    "\n"
    "DESCRIPTION\n"
    "    Creates a manager with the options of the environment and lists every\n"
    "    device it finds, device 0 (the host CPU) first, then each OpenCL and CUDA\n"
    "    device: its backend and name, the locations it can allocate (host,\n"
    "    device, pinned, unified), its memory now (free of total, as the device\n"
    "    reports it), its capabilities (pinned, unified, peer, async), and then\n"
    "    the peer-access matrix: E enabled, p possible but not enabled, - not\n"
    "    possible, * the device itself. A backend that cannot load (no OpenCL ICD\n"
    "    loader, no NVIDIA driver) is skipped; UNIMEM_LOG_LEVEL=info says why.\n"
    "\n"
    "OPTIONS\n"
    "    -v, --verbose  also each device's native handles (um_device_native_get),\n"
    "                   for code that runs its own kernels on unimem buffers:\n"
    "                   OpenCL: the cl_platform_id, cl_device_id, cl_context and\n"
    "                   the in-order cl_command_queue for the caller's commands;\n"
    "                   CUDA: the device ordinal, the CUcontext (primary context)\n"
    "                   and the CUstream for the caller's work; cpu: none. The\n"
    "                   pointers are valid in this process only (they show which\n"
    "                   devices share a context).\n"
    "    -h, --help     this text.\n"
    "\n"
    "ENVIRONMENT\n"
    "    UNIMEM_BACKENDS    comma list of backends to open (cpu,opencl,cuda); empty\n"
    "                       or unset: all. The cpu is always device 0.\n"
    "    UNIMEM_ENABLE_PEER 0 leaves peer access disabled (the matrix shows p).\n"
    "    UNIMEM_DEVICE_LIMIT_BYTES  caps each non-host device's memory (e.g. 64m).\n"
    "    UNIMEM_*           every other um_options field.\n"
    "    UNIMEM_OPENCL_PLATFORM  only OpenCL platforms whose name contains this\n"
    "                       text (e.g. NVIDIA); unset: all.\n"
    "    POCL_DEVICES       (PoCL) e.g. \"pthread pthread\" for two OpenCL devices.\n"
    "\n"
    "EXIT STATUS\n"
    "    0  the devices were listed; 1 no manager could be created; 2 bad usage.\n";

static void print_bytes(uint64_t b) {
  if (b >= (1ull << 30))
    printf("%.1f GiB", (double)b / (double)(1ull << 30));
  else
    printf("%.1f MiB", (double)b / (double)(1ull << 20));
}

/* The native handles of d (um_device_native_get), on one line. */
static void print_native(um_device *d) {
  um_device_native nat;
  if (um_device_native_get(d, &nat) != UM_OK) {
    printf("    native:    unknown (%s)\n", um_last_error());
    return;
  }
  printf("    native:    %s", nat.backend);
  if (strcmp(nat.backend, "opencl") == 0)
    printf(" platform=%p device=%p context=%p queue=%p", nat.cl_platform, nat.cl_device, nat.cl_context,
           nat.cl_queue);
  else if (strcmp(nat.backend, "cuda") == 0)
    printf(" device=%d context=%p stream=%p", nat.cu_device, nat.cu_context, nat.cu_stream);
  else
    printf(" (no native handles)");
  printf("\n");
}

static void print_device(um_device *d, bool verbose) {
  um_device_info info;
  uint64_t free_b = 0, total_b = 0;
  um_device_info_get(d, &info);
  printf("[%d] %-7s %s\n", info.index, info.backend, info.name);
  printf("    locations:");
  for (int l = 0; l < UM_LOCATION_COUNT; l++)
    if (info.locations & (1u << l))
      printf(" %s", location_names[l]);
  printf("\n    memory:    ");
  if (um_device_memory(d, &free_b, &total_b) == UM_OK) {
    print_bytes(free_b);
    printf(" free of ");
    print_bytes(total_b);
  } else {
    printf("unknown (%s)", um_last_error());
  }
  printf("\n    caps:     %s%s%s%s\n", info.caps & UM_CAP_PINNED ? " pinned" : "",
         info.caps & UM_CAP_UNIFIED ? " unified" : "", info.caps & UM_CAP_PEER ? " peer" : "",
         info.caps & UM_CAP_ASYNC ? " async" : "");
  if (verbose)
    print_native(d);
}

static void print_peers(um_manager *m, int n) {
  printf("\npeer access (row reads column):\n     ");
  for (int j = 0; j < n; j++)
    printf("%3d", j);
  printf("\n");
  for (int i = 0; i < n; i++) {
    printf("  %2d ", i);
    for (int j = 0; j < n; j++) {
      um_device *a = um_device_get(m, i), *b = um_device_get(m, j);
      const char *c = i == j ? "*" : um_peer_enabled(a, b) == 1 ? "E" : um_peer_possible(a, b) == 1 ? "p" : "-";
      printf("%3s", c);
    }
    printf("\n");
  }
}

int tool_info(int argc, char **argv) {
  um_manager *m;
  bool verbose = false;
  int st, n;
  for (int i = 1; i < argc; i++) {
    if (tool_is_help(argv[i])) {
      fputs(tool_info_help, stdout);
      return 0;
    }
    if (!strcmp(argv[i], "--verbose") || !strcmp(argv[i], "-v")) {
      verbose = true;
      continue;
    }
    fprintf(stderr, "unimem info: unknown option '%s' (unimem info --help)\n", argv[i]);
    return 2;
  }
  st = um_manager_create(NULL, &m);
  if (st != UM_OK) {
    fprintf(stderr, "unimem: cannot create a manager: %s (%s)\n", um_strerror(st), um_last_error());
    return 1;
  }
  n = um_device_count(m);
  printf("unimem %s: %d device(s)\n\n", um_version_string(), n);
  for (int i = 0; i < n; i++)
    print_device(um_device_get(m, i), verbose);
  print_peers(m, n);
  um_manager_destroy(m);
  return 0;
}
