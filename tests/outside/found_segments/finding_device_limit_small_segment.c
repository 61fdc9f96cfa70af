/* FINDING (UNIMEM_SEGMENTS=0 vs 1 differ): under device_limit_bytes = 8 MiB on the OpenCL device, one live 100-byte
 * FIXED: under device_limit_bytes a plain segment is at most a sixteenth of the limit (512 KiB here); both
 * allocations now answer UM_OK (test_segments: small_block_keeps_little_of_a_small_device_limit).
 * DEVICE buffer holds a 2 MiB segment against the limit, so a following 7 MiB allocation fails with UM_ENOMEM
 * (message names 100 bytes in use by 1 buffer, 2097152 reserved, 2097040 idle in one free extent);
 * with UNIMEM_SEGMENTS=0 the same program succeeds. Args: [small bytes] [big bytes]; defaults 100 7340032. Exit 1 = big failed.
 *
 * Build (from /work/main, after `cmake --build build-h`):
 *   gcc -std=c11 -Wall -Wextra -Werror -g -fsanitize=address,undefined -Iinclude tests/outside/found_segments/finding_device_limit_small_segment.c -Lbuild-h -lunimem -Wl,-rpath,$PWD/build-h -lpthread -o /tmp/finding_device_limit_small_segment
 * Run (from /tmp; binary /tmp/finding_device_limit_small_segment):
 *   POCL_DEVICES=pthread ./finding_device_limit_small_segment ; ./finding_device_limit_small_segment 100000 6815744 ; UNIMEM_SEGMENTS=0 ./finding_device_limit_small_segment
 *
 * What it printed on this tree (library at commit 58ad4a5 "um_alloc's UM_ENOMEM explains itself"):
 *   small 100: UM_OK
 *   big 7340032: UM_ENOMEM opencl: 7340032 bytes on pthread-skylake-avx512-AMD EPYC would pass device_limit_bytes (8388608 bytes, 2097152 in use). Asked: 7340032 bytes (UM_DEVICE) on device 1 (pthread-skylake-avx512-AMD EPYC). Held there: 100 bytes in use by 1 buffer(s), 2097152 reserved, 2097040 idle in the pool (1 free extent(s), the largest 2096896 bytes); the device has 6291456 of 8388608 bytes free
 *   rc=1
 *   small 100000: UM_OK
 *   big 6815744: UM_ENOMEM opencl: 6815744 bytes on pthread-skylake-avx512-AMD EPYC would pass device_limit_bytes (8388608 bytes, 2097152 in use). Asked: 6815744 bytes (UM_DEVICE) on device 1 (pthread-skylake-avx512-AMD EPYC). Held there: 100000 bytes in use by 1 buffer(s), 2097152 reserved, 1982464 idle in the pool (1 free extent(s), the largest 1982464 bytes); the device has 6291456 of 8388608 bytes free
 *   rc=1
 *   --- UNIMEM_SEGMENTS=0:
 *   small 100: UM_OK
 *   big 7340032: UM_OK 
 *   rc=0
 *   small 100000: UM_OK
 *   big 6815744: UM_OK 
 *   rc=0
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unimem.h>
int main(int argc, char **argv) {
  um_options o; um_options_init(&o); o.trim_interval_ms = 0; o.device_limit_bytes = 8u << 20;
  size_t small = argc > 2 ? strtoul(argv[1], 0, 0) : 100, big = argc > 2 ? strtoul(argv[2], 0, 0) : 7340032;
  um_manager *m; if (um_manager_create(&o, &m) || um_device_count(m) < 2) return 77;
  um_device *d = um_device_get(m, 1);
  um_buffer *a, *b; int st = um_alloc(m, d, small, UM_DEVICE, 0, &a);
  printf("small %zu: %s\n", small, um_err_name(st));
  st = um_alloc(m, d, big, UM_DEVICE, 0, &b);
  printf("big %zu: %s %s\n", big, um_err_name(st), st ? um_last_error() : "");
  if (!st) um_release(b);
  /* st stays the big allocation's status */
  um_release(a);
  um_manager_destroy(m);
  return st != UM_OK;
}
