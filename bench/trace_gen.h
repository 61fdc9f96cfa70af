/* The generators of bench/traces (trace_gen.c): write the trace of one kind
 * (llm, training, dataframe, vectors) to path from its fixed seed. Returns
 * 0, 1 when the file cannot be written, 2 for an unknown kind. */
#ifndef UNIMEM_BENCH_TRACE_GEN_H
#define UNIMEM_BENCH_TRACE_GEN_H

#include <stdbool.h>

int um_trace_gen_write(const char *kind, const char *path);
const char *um_trace_gen_kinds(void);

#endif
