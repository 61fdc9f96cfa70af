/* A program outside the project, built against an installed unimem: it
 * checks that the header and the library agree and that the API works. */
#include <stdio.h>
#include <string.h>

#include <unimem.h>

static int sum_chunk(void *user, um_buffer *chunk, size_t offset, size_t bytes) {
  unsigned char first = 0;
  (void)offset;
  if (um_copy_to_host(chunk, 0, &first, 1, NULL) != UM_OK)
    return UM_EBACKEND;
  *(size_t *)user += bytes + first;
  return 0;
}

int main(void) {
  um_options opts;
  um_manager *m = NULL;
  um_buffer *buf = NULL, *src = NULL;
  unsigned char data[4096], back[4096];
  size_t seen = 0;
  int st;

  if (um_version() != UM_VERSION_HEX || strcmp(um_version_string(), UM_VERSION_STRING) != 0) {
    fprintf(stderr, "consumer: header %s, library %s\n", UM_VERSION_STRING, um_version_string());
    return 1;
  }
  um_options_init(&opts);
  snprintf(opts.backends, sizeof(opts.backends), "cpu");
  if ((st = um_manager_create(&opts, &m)) != UM_OK) {
    fprintf(stderr, "consumer: um_manager_create: %s\n", um_strerror(st));
    return 1;
  }
  for (size_t i = 0; i < sizeof(data); i++)
    data[i] = (unsigned char)i;
  if (um_alloc(m, um_device_get(m, 0), sizeof(data), UM_DEVICE, 0, &buf) != UM_OK ||
      um_copy_from_host(buf, 0, data, sizeof(data), NULL) != UM_OK ||
      um_copy_to_host(buf, 0, back, sizeof(back), NULL) != UM_OK || memcmp(data, back, sizeof(data)) != 0) {
    fprintf(stderr, "consumer: round trip failed: %s\n", um_last_error());
    return 1;
  }
  if (um_wrap_host(m, data, sizeof(data), UM_WRAP_READONLY, &src) != UM_OK ||
      um_stream(src, 0, sizeof(data), um_device_get(m, 0), 1000, sum_chunk, NULL, &seen) != UM_OK ||
      seen != sizeof(data) + 0 + 232 + 208 + 184 + 160) { /* first bytes of chunks 0..4: i mod 256 */
    fprintf(stderr, "consumer: um_stream failed (%zu): %s\n", seen, um_last_error());
    return 1;
  }
  um_release(src);
  um_release(buf);
  if ((st = um_manager_destroy(m)) != UM_OK) {
    fprintf(stderr, "consumer: um_manager_destroy: %s\n", um_strerror(st));
    return 1;
  }
  printf("consumer ok: unimem %s, error text \"%s\"\n", um_version_string(), um_strerror(UM_ERANGE));
  return 0;
}
