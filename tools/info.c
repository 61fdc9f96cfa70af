/* unimem info: what the machine offers. */
#include <stdio.h>
#include <string.h>

#include "tool.h"
#include "unimem.h"

static const char *const location_names[] = {"host", "device", "pinned", "unified"};

static void print_bytes(uint64_t b) {
  if (b >= (1ull << 30))
    printf("%.1f GiB", (double)b / (double)(1ull << 30));
  else
    printf("%.1f MiB", (double)b / (double)(1ull << 20));
}

int tool_info(int argc, char **argv) {
  um_manager *m;
  int st, n;
  if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
    printf("usage: unimem info\n\n"
           "Lists every device unimem finds (device 0 is the host CPU), with its\n"
           "backend, the locations it can allocate, its memory now (free/total),\n"
           "its capabilities, and the peer-access matrix (E: enabled, p: possible,\n"
           "-: not possible, *: same device).\n");
    return 0;
  }
  st = um_manager_create(NULL, &m);
  if (st != UM_OK) {
    fprintf(stderr, "unimem: cannot create a manager: %s (%s)\n", um_strerror(st), um_last_error());
    return 1;
  }
  n = um_device_count(m);
  printf("unimem %s: %d device(s)\n\n", um_version_string(), n);
  for (int i = 0; i < n; i++) {
    um_device *d = um_device_get(m, i);
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
  }
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
  um_manager_destroy(m);
  return 0;
}
