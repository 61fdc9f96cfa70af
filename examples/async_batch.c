/* The guide's transfer patterns: asynchronous copies that keep their order
 * on one buffer, a pinned staging buffer for repeated uploads, and a batch
 * of small copies issued together. Runs on the last device (a GPU or
 * OpenCL device when there is one, else the host). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "unimem.h"

#define CHECK(call)                                                            \
  do {                                                                         \
    int st_ = (call);                                                          \
    if (st_ != UM_OK) {                                                        \
      fprintf(stderr, "%s failed: %s (%s)\n", #call, um_err_name(st_),        \
              um_last_error());                                                \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

enum { N = 1 << 20, SMALL = 4096, BATCH = 64 };

int main(void) {
  um_manager *m;
  um_device *dev;
  um_buffer *data, *pinned, *small;
  um_event *write, *fill, *read, *batch;
  unsigned char *host = malloc(N), *back = malloc(N);
  um_copy_op ops[BATCH];
  static unsigned char tiles[BATCH][SMALL];

  if (host == NULL || back == NULL)
    return 1;
  CHECK(um_manager_create(NULL, &m));
  dev = um_device_get(m, um_device_count(m) - 1);
  CHECK(um_alloc(m, dev, N, UM_DEVICE, 0, &data));

  /* 1. Three asynchronous operations on one buffer: they run in the order
   * issued, without the caller waiting in between. */
  for (size_t i = 0; i < N; i++)
    host[i] = (unsigned char)(i * 13);
  CHECK(um_copy_from_host(data, 0, host, N, &write));
  CHECK(um_fill(data, 0, 0xAB, 4096, &fill));
  CHECK(um_copy_to_host(data, 0, back, N, &read));
  CHECK(um_event_wait(read)); /* the last one done: the others are too */
  memset(host, 0xAB, 4096);
  if (memcmp(host, back, N) != 0) {
    fprintf(stderr, "ordered copies: mismatch\n");
    return 1;
  }
  um_event_release(write);
  um_event_release(fill);
  um_event_release(read);

  /* 2. A pinned buffer of the same device as the source of repeated
   * uploads: one direct DMA per copy, no staging. */
  if (um_alloc(m, dev, N, UM_PINNED, 0, &pinned) == UM_OK) {
    unsigned char *p = um_buffer_host_ptr(pinned);
    for (int round = 0; round < 4; round++) {
      memset(p, round, N);
      CHECK(um_copy(data, 0, pinned, 0, N, NULL));
    }
    CHECK(um_release(pinned));
  } else {
    printf("pinned memory not available here: %s\n", um_last_error());
  }

  /* 3. Many small copies in one batch: issued together, at most
   * max_concurrent_transfers of them on the engine's threads at once. */
  CHECK(um_alloc(m, dev, (size_t)BATCH * SMALL, UM_DEVICE, 0, &small));
  for (int i = 0; i < BATCH; i++) {
    memset(tiles[i], i, SMALL);
    ops[i] = (um_copy_op){.dst = small, .dst_off = (size_t)i * SMALL, .host_src = tiles[i], .bytes = SMALL};
  }
  CHECK(um_copy_batch(m, ops, BATCH, &batch));
  CHECK(um_event_wait(batch));
  um_event_release(batch);
  CHECK(um_copy_to_host(small, 5 * SMALL, back, SMALL, NULL));
  for (int i = 0; i < SMALL; i++)
    if (back[i] != 5) {
      fprintf(stderr, "batch: mismatch\n");
      return 1;
    }

  um_stats s;
  CHECK(um_stats_get(m, dev, &s));
  printf("device %d: %llu bytes host->device, %llu device->host, %llu direct, %llu pipelined copies\n",
         um_device_count(m) - 1, (unsigned long long)s.bytes_h2d, (unsigned long long)s.bytes_d2h,
         (unsigned long long)s.xfer_direct, (unsigned long long)s.xfer_pipelined);
  CHECK(um_release(small));
  CHECK(um_release(data));
  CHECK(um_manager_destroy(m));
  free(host);
  free(back);
  return 0;
}
