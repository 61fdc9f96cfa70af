/* The C side of bench/bench_python.py: the same blocking copies the Python
 * benchmark makes through the binding, made directly through the C API,
 * timed here so that no foreign-function call lands inside the loop.
 * Built as a small shared library (libunimem_pybench.so) that the script
 * loads with ctypes; it links the same libunimem as the extension. */
#include <stdio.h>
#include <string.h>

#include <unimem.h>

#include "bench_util.h"

#define PYBENCH_EXPORT __attribute__((visibility("default")))

enum { COPY_TO_DEVICE = 0, COPY_TO_HOST = 1, COPY_ASYNC_WAIT = 2 };

static int one_copy(um_buffer *b, int mode, unsigned char *host, size_t bytes) {
  um_event *ev;
  int st;
  switch (mode) {
  case COPY_TO_DEVICE: return um_copy_from_host(b, 0, host, bytes, NULL);
  case COPY_TO_HOST: return um_copy_to_host(b, 0, host, bytes, NULL);
  default:
    if ((st = um_copy_from_host(b, 0, host, bytes, &ev)) != UM_OK)
      return st;
    st = um_event_wait(ev);
    um_event_release(ev);
    return st;
  }
}

/* Median over reps of the mean time of one copy in a loop of iterations
 * copies of bytes, on a buffer of the given device and location of a
 * manager made with the given backends. Returns a UM_* status. */
PYBENCH_EXPORT int pybench_copy(const char *backends, int device, int location, int mode, size_t bytes,
                                int iterations, int reps, double *median_ns) {
  um_options opts;
  um_manager *m = NULL;
  um_buffer *b = NULL;
  unsigned char *host = NULL;
  double samples[64];
  int st;
  if (reps < 1 || reps > 64 || iterations < 1 || bytes == 0 || median_ns == NULL)
    return UM_EINVAL;
  um_options_init(&opts);
  snprintf(opts.backends, sizeof(opts.backends), "%s", backends);
  if ((st = um_manager_create(&opts, &m)) != UM_OK)
    return st;
  if (device >= um_device_count(m)) {
    st = UM_ENODEV;
    goto done;
  }
  if ((st = um_alloc(m, um_device_get(m, device), bytes, (um_location)location, 0, &b)) != UM_OK)
    goto done;
  if ((host = calloc(1, bytes)) == NULL) {
    st = UM_ENOMEM;
    goto done;
  }
  for (int i = 0; i < iterations / 10 + 1 && st == UM_OK; i++) /* warm up */
    st = one_copy(b, mode, host, bytes);
  for (int r = 0; r < reps && st == UM_OK; r++) {
    double t0 = bench_now_ns();
    for (int i = 0; i < iterations && st == UM_OK; i++)
      st = one_copy(b, mode, host, bytes);
    samples[r] = (bench_now_ns() - t0) / iterations;
  }
  if (st == UM_OK)
    *median_ns = bench_median(samples, reps);
done:
  free(host);
  if (b != NULL)
    um_release(b);
  um_manager_destroy(m);
  return st;
}
