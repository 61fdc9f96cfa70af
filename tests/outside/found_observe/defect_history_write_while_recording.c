/* DEFECT: um_history_write while other threads record (allocations, copies, releases under tags) crashes:
 * ASan heap-buffer-overflow READ in um_history_write (history.c write_events, just past the block that
 * um_history_write itself malloc'ed), or a SEGV in fprintf reading an event's string (seen from
 * regress_history_snapshot_race.c with RACE_WRITE=1). The ring is small and wraps while it is written.
 * Promises (unimem.h): header "Thread safety: every function may be called from any thread";
 * um_history_get "Works while recording"; um_history_write does not say it is refused while recording.
 * Build: clang -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -g -fsanitize=address,undefined -Iinclude
 *   tests/outside/found_observe/defect_history_write_while_recording.c -Lbuild-h -lunimem -Wl,-rpath,$PWD/build-h -lpthread -o /tmp/X
 * Run: POCL_DEVICES=pthread UNIMEM_BACKENDS=cpu,opencl /tmp/X ; UNIMEM_BACKENDS=cpu /tmp/X
 * Printed (cpu,opencl, first run):
 *   ==28681==ERROR: AddressSanitizer: heap-buffer-overflow on address 0x62500003e528 ... READ of size 4 ... thread T0
 *     #0 write_events src/core/history.c:216:37   #1 um_history_write src/core/history.c:285:8   #2 main (this file:44)
 *   0x62500003e528 is located 0 bytes to the right of 9256-byte region allocated by um_history_write (history.c:277)
 * Other variant (regress_history_snapshot_race.c, RACE_WRITE=1): "AddressSanitizer: SEGV on unknown address ...
 *   #0 internal_strlen #1 printf_common #2 fprintf #3 write_events history.c:219:5 #4 um_history_write history.c:285:8".
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unimem.h>
static um_manager *m;
static int stopf, nd;
static void *worker(void *p) {
  unsigned seed = (unsigned)(long)p;
  static char src[8192];
  char nm[16]; snprintf(nm, sizeof nm, "w%ld", (long)p);
  um_tag_push(m, nm);
  while (!__atomic_load_n(&stopf, __ATOMIC_RELAXED)) {
    um_buffer *b;
    int d = rand_r(&seed) % nd;
    if (um_alloc_tagged(m, um_device_get(m, d), 1 + rand_r(&seed) % 8192, d ? UM_DEVICE : UM_HOST, 0, (rand_r(&seed) & 1) ? "direct" : NULL, &b)) continue;
    um_copy_from_host(b, 0, src, 64, NULL);
    um_fill(b, 0, 1, 16, NULL);
    um_release(b);
  }
  um_tag_pop(m);
  return NULL;
}
int main(int argc, char **argv) {
  int rounds = argc > 1 ? atoi(argv[1]) : 400;
  um_manager_create(NULL, &m);
  nd = um_device_count(m);
  pthread_t w[3];
  for (long i = 0; i < 3; i++) pthread_create(&w[i], NULL, worker, (void *)(i + 1));
  int bad = 0, fails = 0;
  for (int r = 0; r < rounds; r++) {
    if (r % 20 == 0) { um_history_stop(m); um_history_start(m, 64 + r % 1000); }
    int rc = um_history_write(m, "/tmp/o/hw.json");
    if (rc != UM_OK) { fails++; if (fails < 3) printf("write %d: %s %s\n", r, um_err_name(rc), um_last_error()); }
  }
  __atomic_store_n(&stopf, 1, __ATOMIC_SEQ_CST);
  for (int i = 0; i < 3; i++) pthread_join(w[i], NULL);
  um_history_stop(m);
  if (fails) bad = 1;
  if (system("python3 -c 'import json,sys; json.load(open(sys.argv[1]))' /tmp/o/hw.json")) { bad = 1; printf("last file not JSON\n"); }
  um_manager_destroy(m);
  printf("%d writes while recording, %d failed\n", rounds, fails);
  printf(bad ? "FAILED\n" : "ok\n");
  return bad;
}
