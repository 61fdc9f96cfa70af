/* The unimem command. */
#include <stdio.h>
#include <string.h>

#include "tool.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: unimem <command> [options]\n"
          "\n"
          "commands:\n"
          "  info     devices, the locations each can allocate, memory, capabilities,\n"
          "           and the peer-access matrix\n"
          "  help     this text\n"
          "\n"
          "Environment: UNIMEM_BACKENDS=cpu,opencl,cuda chooses backends;\n"
          "every um_options field has a UNIMEM_<NAME> variable (see README).\n");
}

int main(int argc, char **argv) {
  if (argc < 2 || !strcmp(argv[1], "help") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (!strcmp(argv[1], "info"))
    return tool_info(argc - 1, argv + 1);
  fprintf(stderr, "unimem: unknown command '%s'\n\n", argv[1]);
  usage(stderr);
  return 2;
}
