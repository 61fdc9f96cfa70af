/* The guide's basic pattern: allocate, copy in, copy out, release, and
 * read the pool statistics. */
#include <stdio.h>
#include <string.h>

#include "unimem.h"

#define CHECK(call)                                                            \
  do {                                                                         \
    int st_ = (call);                                                          \
    if (st_ != UM_OK) {                                                        \
      fprintf(stderr, "%s failed: %s (%s)\n", #call, um_err_name(st_),        \
              um_last_error());                                                \
      return 1;                                                                \
    }                                                                          \
  } while (0)

int main(void) {
  um_manager *m;
  um_buffer *buf;
  float in[1024], out[1024];
  um_stats s;
  int last = 0;

  for (int i = 0; i < 1024; i++)
    in[i] = (float)i * 0.5f;
  CHECK(um_manager_create(NULL, &m));
  /* The last device is the most interesting one: a GPU or OpenCL device
   * when there is one, else the host. */
  last = um_device_count(m) - 1;
  um_device *dev = um_device_get(m, last);

  for (int round = 0; round < 3; round++) {
    CHECK(um_alloc_array(m, dev, 1024, sizeof(float), UM_DEVICE, 0, &buf));
    CHECK(um_copy_from_host(buf, 0, in, sizeof(in), NULL));
    CHECK(um_copy_to_host(buf, 0, out, sizeof(out), NULL));
    if (memcmp(in, out, sizeof(in)) != 0) {
      fprintf(stderr, "round trip mismatch\n");
      return 1;
    }
    CHECK(um_release(buf)); /* back to the pool: the next round reuses it */
  }
  CHECK(um_stats_get(m, NULL, &s));
  printf("allocations %llu, pool hits %llu, misses %llu, hit rate %.0f%%\n",
         (unsigned long long)s.allocations, (unsigned long long)s.pool_hits,
         (unsigned long long)s.pool_misses, s.hit_rate * 100.0);
  CHECK(um_manager_destroy(m));
  return 0;
}
