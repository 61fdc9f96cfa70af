/* The fake driver's kernels (fake_kernels.c): it cannot run PTX, so a PTX
 * image loaded with cuModuleLoadData is read for its .entry names and
 * parameter lists, and each entry must be one of a small registry of C
 * functions with the same parameters. The same PTX text then runs on a real
 * GPU and here. A kernel runs on its stream's thread, in stream order, over
 * the threads of the x dimension of its grid (blockIdx.x * blockDim.x +
 * threadIdx.x), as the PTX computes its index. */
#ifndef FAKE_KERNELS_H
#define FAKE_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#define FAKE_KERNEL_MAX_PARAMS 4
#define FAKE_KERNEL_MAX_RANGES 3
#define FAKE_MODULE_MAX_ENTRIES 8

/* Memory a kernel touches, for the range and race checks. */
typedef struct fake_range {
  uintptr_t base;
  size_t bytes;
  int write;
} fake_range;

struct fake_kernel;

/* One launch: the parameters' values, copied at cuLaunchKernel as the real
 * driver copies them. */
typedef struct fake_launch {
  const struct fake_kernel *kernel;
  unsigned char args[8 * FAKE_KERNEL_MAX_PARAMS];
  size_t offset[FAKE_KERNEL_MAX_PARAMS];
  size_t threads; /* gridDim.x * blockDim.x */
} fake_launch;

typedef struct fake_kernel {
  const char *name;
  int nparams;
  size_t param_size[FAKE_KERNEL_MAX_PARAMS];
  /* The device memory the launch reads and writes; returns how many. */
  int (*ranges)(const fake_launch *l, fake_range *out);
  /* 0 while the kernel would still be waiting (the gate kernel, which spins
   * on a host word); NULL: always ready. */
  int (*ready)(const fake_launch *l);
  void (*run)(const fake_launch *l);
} fake_kernel;

/* The registry entry of that name, or NULL. */
const fake_kernel *fake_kernel_find(const char *name);

/* The entries of a PTX image (NUL-terminated text), each checked against
 * the registry (known name, same parameter sizes). Returns how many (> 0),
 * or 0 with the reason in why. */
int fake_ptx_entries(const char *image, const fake_kernel **out, int max, char *why, size_t why_len);

/* Copy a launch's parameters from cuLaunchKernel's kernelParams. */
void fake_launch_args(fake_launch *l, void **params);

#endif /* FAKE_KERNELS_H */
