/* The guide's zero-copy patterns: wrap memory the program already has, map
 * a device buffer instead of copying it out and back, and read a file
 * through a HOST buffer over mmap. */
#define _POSIX_C_SOURCE 200809L /* mkstemp */
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

int main(void) {
  um_manager *m;
  um_buffer *wrapped, *dev_buf, *file;
  float samples[4096];
  float *view;
  char path[] = "/tmp/unimem-example-XXXXXX";
  int fd;

  CHECK(um_manager_create(NULL, &m));
  um_device *dev = um_device_get(m, um_device_count(m) - 1);

  /* 1. Wrap: the buffer is the program's own array, no copy. */
  for (int i = 0; i < 4096; i++)
    samples[i] = (float)i;
  CHECK(um_wrap_host(m, samples, sizeof(samples), UM_WRAP_READONLY, &wrapped));
  if (um_buffer_host_ptr(wrapped) != samples)
    return 1;

  /* From the wrap straight to the device. */
  CHECK(um_alloc(m, dev, sizeof(samples), UM_DEVICE, 0, &dev_buf));
  CHECK(um_copy(dev_buf, 0, wrapped, 0, sizeof(samples), NULL));

  /* 2. Map instead of copying out, editing and copying back: the mapping
   * fetches only when the host copy is stale, and the unmap writes back. */
  CHECK(um_map(dev_buf, UM_MAP_READ_WRITE, 0, sizeof(samples), (void **)&view));
  for (int i = 0; i < 4096; i++)
    view[i] *= 2.0f;
  CHECK(um_unmap(dev_buf, view));
  CHECK(um_map(dev_buf, UM_MAP_READ, 0, sizeof(samples), (void **)&view));
  int ok = view[4095] == 8190.0f;
  CHECK(um_unmap(dev_buf, view));
  if (!ok) {
    fprintf(stderr, "map: unexpected value\n");
    return 1;
  }

  /* 3. A file as a buffer: its pages are read when touched. */
  fd = mkstemp(path);
  if (fd < 0 || write(fd, samples, sizeof(samples)) != (ssize_t)sizeof(samples))
    return 1;
  close(fd);
  CHECK(um_map_file(m, path, UM_MAP_READ, &file));
  CHECK(um_copy(dev_buf, 0, file, 0, um_buffer_size(file), NULL));
  printf("wrapped %zu bytes, mapped a %zu-byte file, valid copies of the device buffer: %s%s\n",
         um_buffer_size(wrapped), um_buffer_size(file),
         um_buffer_valid(dev_buf) & UM_VALID_HOST ? "host " : "",
         um_buffer_valid(dev_buf) & UM_VALID_DEVICE ? "device" : "");
  CHECK(um_release(file));
  unlink(path);
  CHECK(um_release(dev_buf));
  CHECK(um_release(wrapped));
  CHECK(um_manager_destroy(m));
  return 0;
}
