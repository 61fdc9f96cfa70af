/* DEFECT: the blocks of a segment do not tile it: between a block and the next there are bytes that no
 * block (in use, idle or free) covers -- the alignment padding of each block is left out of its capacity
 * (a 1-byte buffer at offset 0 has capacity 1, the next block starts at 64 on the host, at 256 on PoCL).
 * Promise (docs/guide.md, "A snapshot"): "Every segment is listed, and every block in it: in use, released
 * (its operations still running), idle in the pool, or a free extent. The blocks of a segment tile it in
 * offset order, so the picture of fragmentation is exact." um_snapshot_block.capacity: "bytes the block spans".
 * Build: clang -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -g -fsanitize=address,undefined -Iinclude
 *   tests/outside/found_observe/defect_snapshot_tiling.c -Lbuild-h -lunimem -Wl,-rpath,$PWD/build-h -lpthread -o /tmp/X
 * Run: UNIMEM_BACKENDS=cpu /tmp/X ; POCL_DEVICES=pthread UNIMEM_BACKENDS=cpu,opencl /tmp/X 1
 * Printed (cpu):
 *   segment 0 (device 0, 1073741824 bytes): block offset 0 capacity 1 (in use), next block at 64: 63 bytes in no block
 *   segment 0 (device 0, 1073741824 bytes): block offset 64 capacity 112 (in use), next block at 192: 16 bytes in no block
 *   segment 0 (device 0, 1073741824 bytes): block offset 1056960 capacity 80 (in use), next block at 1057088: 48 bytes in no block
 *   segment 0: blocks cover 1073741697 of 1073741824 bytes
 *   FAILED
 * Printed (PoCL, argument 1): gaps of 255, 144, 176 bytes, "segment 0: blocks cover 2096577 of 2097152 bytes".
 */
#include <stdio.h>
#include <stdlib.h>
#include <unimem.h>
#define U(x) ((unsigned long long)(x))
static const char *st(int s) { return s == 0 ? "in use" : s == 1 ? "released" : s == 2 ? "idle" : "free"; }
int main(int argc, char **argv) {
  um_manager *m;
  um_manager_create(NULL, &m);
  int d = argc > 1 ? atoi(argv[1]) : 0;
  if (d >= um_device_count(m)) { printf("no device %d\n", d); return 2; }
  um_buffer *b[6];
  size_t sz[6] = {1, 100, 5000, 3000, 1 << 20, 77};
  um_tag_push(m, "t");
  for (int i = 0; i < 6; i++) um_alloc(m, um_device_get(m, d), sz[i], d ? UM_DEVICE : UM_HOST, 0, &b[i]);
  um_release(b[2]); um_release(b[4]);
  um_snapshot *s;
  um_snapshot_take(m, &s);
  int bad = 0;
  for (size_t j = 0; j < s->nsegments; j++) {
    uint64_t covered = 0; um_snapshot_block *prev = NULL;
    for (size_t k = 0; k < s->nblocks; k++) {
      um_snapshot_block *x = &s->blocks[k];
      if (x->segment != (int)j) continue;
      if (!prev && x->offset != 0) { printf("segment %zu: first block at %llu\n", j, U(x->offset)); bad = 1; }
      if (prev && prev->offset + prev->capacity != x->offset) {
        printf("segment %zu (device %d, %llu bytes): block offset %llu capacity %llu (%s), next block at %llu: %lld bytes in no block\n", j,
               s->segments[j].device, U(s->segments[j].size), U(prev->offset), U(prev->capacity), st(prev->state), U(x->offset),
               (long long)(x->offset - prev->offset - prev->capacity));
        bad = 1;
      }
      covered += x->capacity; prev = x;
    }
    if (covered != s->segments[j].size) { printf("segment %zu: blocks cover %llu of %llu bytes\n", j, U(covered), U(s->segments[j].size)); bad = 1; }
  }
  um_snapshot_free(s);
  for (int i = 0; i < 6; i++) if (i != 2 && i != 4) um_release(b[i]);
  um_tag_pop(m);
  um_manager_destroy(m);
  printf(bad ? "FAILED\n" : "ok\n");
  return bad;
}
