/* A program linked with the static library carries only the parts of
 * unimem it calls; the parts above core/ register their calls up when
 * they are linked in (src/mem/mem.h, "Calls up"). Built twice:
 *   STATIC_PARTS_CORE  alloc and release only, on two threads: no
 *                      operation layer is linked (static_parts.sh checks
 *                      with nm), and a thread's exit, a trim and the
 *                      destroy still work without it;
 *   otherwise          a copy with an event and a bracket left open at
 *                      release: the operation layer and the brackets are
 *                      linked, and the release ends the bracket. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "unimem.h"

#define CHECK(cond)                                                                                \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      fprintf(stderr, "static_parts: %s failed (line %d): %s\n", #cond, __LINE__, um_last_error()); \
      exitcode = 1;                                                                                \
    }                                                                                              \
  } while (0)

static int exitcode;
static um_manager *m;

static void *alloc_release(void *arg) {
  (void)arg;
  for (int i = 0; i < 1000; i++) {
    um_buffer *b = NULL;
    CHECK(um_alloc(m, um_device_get(m, 0), 1024, UM_HOST, 0, &b) == UM_OK);
    CHECK(um_release(b) == UM_OK);
  }
  return NULL;
}

int main(void) {
  um_options opts;
  um_buffer *b = NULL;
  um_stats s;
  pthread_t t;
  um_options_init(&opts);
  CHECK(um_manager_create(&opts, &m) == UM_OK);
  CHECK(pthread_create(&t, NULL, alloc_release, NULL) == 0);
  CHECK(pthread_join(t, NULL) == 0); /* its cache goes back at its exit */
  alloc_release(NULL);
  CHECK(um_stats_get(m, um_device_get(m, 0), &s) == UM_OK);
  CHECK(s.pool_hits >= 1998); /* all but each thread's first allocation */
#ifndef STATIC_PARTS_CORE
  char data[4096], back[4096];
  um_event *e = NULL;
  void *queue = NULL;
  memset(data, 7, sizeof(data));
  CHECK(um_alloc(m, um_device_get(m, 0), sizeof(data), UM_DEVICE, 0, &b) == UM_OK);
  CHECK(um_copy_from_host(b, 0, data, sizeof(data), &e) == UM_OK);
  CHECK(um_event_wait(e) == UM_OK);
  CHECK(um_event_release(e) == UM_OK);
  CHECK(um_copy_to_host(b, 0, back, sizeof(back), NULL) == UM_OK);
  CHECK(memcmp(data, back, sizeof(data)) == 0);
  CHECK(um_access_begin(b, UM_MAP_READ_WRITE, &queue) == UM_OK);
  /* A blocking copy inside the open bracket is refused, not waited for. */
  CHECK(um_copy_to_host(b, 0, back, sizeof(back), NULL) == UM_ESTATE);
#else
  CHECK(um_alloc(m, um_device_get(m, 0), 4096, UM_HOST, 0, &b) == UM_OK);
#endif
  CHECK(um_release(b) == UM_OK); /* ends the bracket where one is open */
  CHECK(um_pool_trim(m, 0) == UM_OK);
  CHECK(um_manager_destroy(m) == UM_OK);
  if (exitcode == 0)
    printf("static_parts: ok\n");
  return exitcode;
}
