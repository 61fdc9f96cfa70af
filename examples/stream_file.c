/* The guide's "memory-mapped files for huge datasets": a file larger than
 * the device's memory (capped here with device_limit_bytes) is mapped and
 * streamed through the device in chunks, with progress; each chunk is
 * summed on the host through a mapping of the device buffer. */
#define _POSIX_C_SOURCE 200809L /* mkstemp */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

enum { FILE_BYTES = 24 << 20, LIMIT_BYTES = 8 << 20, CHUNK_BYTES = 3 << 20 };

static int sum_chunk(void *user, um_buffer *chunk, size_t offset, size_t bytes) {
  uint64_t *sum = user;
  void *p;
  int st = um_map(chunk, UM_MAP_READ, 0, bytes, &p);
  (void)offset;
  if (st != UM_OK)
    return st;
  for (size_t i = 0; i < bytes; i++)
    *sum += ((const unsigned char *)p)[i];
  return um_unmap(chunk, p);
}

static void show_progress(void *user, uint64_t done, uint64_t total) {
  (void)user;
  fprintf(stderr, "\rstreamed %3.0f%%", 100.0 * (double)done / (double)total);
  if (done == total)
    fputc('\n', stderr);
}

int main(void) {
  char path[] = "/tmp/unimem-stream-example-XXXXXX";
  unsigned char *block = malloc(1 << 20);
  uint64_t expect = 0, sum = 0;
  um_options o;
  um_manager *m;
  um_buffer *file;
  int fd = mkstemp(path);

  if (fd < 0 || block == NULL)
    return 1;
  for (int i = 0; i < FILE_BYTES / (1 << 20); i++) {
    for (int j = 0; j < 1 << 20; j++) {
      block[j] = (unsigned char)(i + j);
      expect += block[j];
    }
    if (write(fd, block, 1 << 20) != 1 << 20)
      return 1;
  }
  close(fd);

  um_options_init(&o);
  o.device_limit_bytes = LIMIT_BYTES; /* pretend the device is small */
  CHECK(um_manager_create(&o, &m));
  um_device *dev = um_device_get(m, um_device_count(m) - 1);
  CHECK(um_map_file(m, path, UM_MAP_READ, &file));
  CHECK(um_stream(file, 0, um_buffer_size(file), dev, CHUNK_BYTES, sum_chunk, show_progress, &sum));
  printf("%d MiB file through a device capped at %d MiB: sum %s\n", FILE_BYTES >> 20, LIMIT_BYTES >> 20,
         sum == expect ? "matches" : "DIFFERS");
  CHECK(um_release(file));
  CHECK(um_manager_destroy(m));
  unlink(path);
  free(block);
  return sum == expect ? 0 : 1;
}
