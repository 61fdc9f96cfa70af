/* Subcommands of the unimem command: each returns the process exit code. */
#ifndef UNIMEM_TOOL_H
#define UNIMEM_TOOL_H
int tool_info(int argc, char **argv);
#endif
