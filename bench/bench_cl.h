/* The raw OpenCL side of a benchmark: CL/cl.h where the build has it
 * (BENCH_HAVE_CL then), and the benchmark's table of entry points, loaded
 * at run time from libOpenCL.so.1, the library unimem loads too (no
 * benchmark links OpenCL). Each benchmark is also compiled into the unimem
 * command, so everything here is static.
 *
 *   #define MY_CALLS(XX) XX(clCreateBuffer) XX(clFinish)
 *   BENCH_CL_TABLE(cl, MY_CALLS)                  the table: cl.clFinish(q)
 *   BENCH_CL_LOADER(load_opencl, cl, MY_CALLS)    int load_opencl(why, cap)
 */
#ifndef UNIMEM_BENCH_CL_H
#define UNIMEM_BENCH_CL_H

#if defined(__has_include)
#if __has_include(<CL/cl.h>)
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#define BENCH_HAVE_CL 1
#endif
#endif

#ifdef BENCH_HAVE_CL
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "report.h"
#include "unimem.h"

/* A manager of the cpu and OpenCL backends for benchmark who: 0, or 1
 * with the failure said. */
static inline int bench_cl_manager(const char *who, um_manager **m) {
  um_options o;
  um_options_init(&o);
  snprintf(o.backends, sizeof(o.backends), "cpu,opencl");
  if (um_manager_create(&o, m) == UM_OK)
    return 0;
  fprintf(stderr, "bench %s: cannot create a manager: %s\n", who, um_last_error());
  return 1;
}

/* A manager of the cpu and OpenCL backends and its first OpenCL device
 * (*d, its handles in *nat, its name in name[0..cap)) for benchmark who:
 * 0, BENCH_SKIPPED without an OpenCL device, or 1; said either way. */
static inline int bench_cl_first_device(const char *who, um_manager **m, um_device **d, um_device_native *nat,
                                        char *name, size_t cap) {
  um_device_info info;
  *d = NULL;
  if (bench_cl_manager(who, m) != 0)
    return 1;
  for (int i = 0; i < um_device_count(*m) && *d == NULL; i++)
    if (um_device_native_get(um_device_get(*m, i), nat) == UM_OK && strcmp(nat->backend, "opencl") == 0)
      *d = um_device_get(*m, i);
  if (*d == NULL) {
    fprintf(stderr, "bench %s: no OpenCL device (UNIMEM_LOG_LEVEL=info says why): nothing to measure\n", who);
    return BENCH_SKIPPED;
  }
  um_device_info_get(*d, &info);
  snprintf(name, cap, "%s", info.name);
  return 0;
}

/* The library, or NULL with the reason in why. It stays loaded (drivers
 * keep threads that do not survive dlclose). */
static inline void *bench_cl_library(char *why, size_t cap) {
  void *lib = dlopen("libOpenCL.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL)
    snprintf(why, cap, "%s", dlerror());
  return lib;
}

/* The function pointer at slot (size bytes) = lib's symbol name: 0, or -1
 * with the reason in why. */
static inline int bench_cl_symbol(void *lib, const char *name, void *slot, size_t size, char *why, size_t cap) {
  void *sym = dlsym(lib, name);
  if (sym == NULL || size != sizeof(sym)) {
    snprintf(why, cap, "%s missing", name);
    return -1;
  }
  memcpy(slot, &sym, size);
  return 0;
}

/* What a benchmark that builds its own kernel and runs it on its own
 * buffers calls (bench_loop, bench_gemm). */
#define BENCH_CL_KERNEL_CALLS(XX)                                                                                     \
  XX(clCreateProgramWithSource)                                                                                       \
  XX(clBuildProgram)                                                                                                  \
  XX(clCreateKernel)                                                                                                  \
  XX(clSetKernelArg)                                                                                                  \
  XX(clEnqueueNDRangeKernel)                                                                                          \
  XX(clEnqueueWriteBuffer)                                                                                            \
  XX(clEnqueueReadBuffer)                                                                                             \
  XX(clCreateBuffer)                                                                                                  \
  XX(clFlush)                                                                                                         \
  XX(clReleaseEvent)                                                                                                  \
  XX(clReleaseMemObject)                                                                                              \
  XX(clReleaseKernel)                                                                                                 \
  XX(clReleaseProgram)

#define BENCH_CL_MEMBER_(name) __typeof__(name) *name;
#define BENCH_CL_LOAD_ONE_(name)                                                                                      \
  bench_cl_bad_ = bench_cl_bad_ || bench_cl_symbol(bench_cl_lib_, #name, &bench_cl_table_->name,                      \
                                                   sizeof(bench_cl_table_->name), why, cap) != 0;

/* static struct { a pointer per entry point of LIST } table; */
#define BENCH_CL_TABLE(table, LIST)                                                                                   \
  static struct {                                                                                                     \
    LIST(BENCH_CL_MEMBER_)                                                                                            \
  } table;

/* static int fn(char *why, size_t cap): every entry point of LIST into
 * table; 0, or -1 with the reason in why. */
#define BENCH_CL_LOADER(fn, table, LIST)                                                                              \
  static int fn(char *why, size_t cap) {                                                                              \
    __typeof__(table) *bench_cl_table_ = &(table);                                                                    \
    void *bench_cl_lib_ = bench_cl_library(why, cap);                                                                 \
    int bench_cl_bad_ = bench_cl_lib_ == NULL;                                                                        \
    LIST(BENCH_CL_LOAD_ONE_)                                                                                          \
    return bench_cl_bad_ ? -1 : 0;                                                                                    \
  }
#endif /* BENCH_HAVE_CL */

#endif /* UNIMEM_BENCH_CL_H */
