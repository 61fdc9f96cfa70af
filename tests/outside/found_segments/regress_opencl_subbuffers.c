/* REGRESSION (held): each carved OpenCL buffer's cl_mem is a sub-buffer whose CL_MEM_OFFSET respects
 * CL_DEVICE_MEM_BASE_ADDR_ALIGN, is at least the requested size, and no two live buffers overlap inside one
 * parent cl_mem. Arg: location (1, 2, 3; UNIFIED gives SVM pointers, no cl_mem).
 *
 * Build (from /work/main, after `cmake --build build-h`):
 *   gcc -std=c11 -Wall -Wextra -Werror -g -fsanitize=address,undefined -Iinclude tests/outside/found_segments/regress_opencl_subbuffers.c -Lbuild-h -lunimem -lOpenCL -Wl,-rpath,$PWD/build-h -lpthread -o /tmp/regress_opencl_subbuffers
 * Run (from /tmp; binary /tmp/regress_opencl_subbuffers):
 *   POCL_DEVICES=pthread ./regress_opencl_subbuffers 1 (and 2, 3)
 *
 * What it printed on this tree:
 *   base addr align 128 bytes
 *   sub-buffers seen 1515
 *   destroy UM_OK, 0 failures
 *   rc=0
 *   base addr align 128 bytes
 *   sub-buffers seen 1515
 *   destroy UM_OK, 0 failures
 *   rc=0
 *   base addr align 128 bytes
 *   no cl_mem (svm 0x7f0999ccf800)
 *   sub-buffers seen 0
 *   destroy UM_OK, 0 failures
 *   rc=0
 */
#define CL_TARGET_OPENCL_VERSION 200
#include <CL/cl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unimem.h>
static int fails;
static uint64_t rng(uint64_t *s) { *s ^= *s << 13; *s ^= *s >> 7; *s ^= *s << 17; return *s; }
int main(int argc, char **argv) {
  um_options o; um_options_init(&o); o.trim_interval_ms = 0;
  int loc = argc > 1 ? atoi(argv[1]) : UM_DEVICE;
  um_manager *m; if (um_manager_create(&o, &m) || um_device_count(m) < 2) return 77;
  um_device *d = um_device_get(m, 1);
  um_device_native dn; um_device_native_get(d, &dn);
  cl_uint align_bits = 0;
  clGetDeviceInfo((cl_device_id)dn.cl_device, CL_DEVICE_MEM_BASE_ADDR_ALIGN, sizeof align_bits, &align_bits, NULL);
  size_t align = align_bits / 8;
  printf("base addr align %zu bytes\n", align);
  enum { K = 64 };
  um_buffer *b[K] = {0}; size_t n[K]; cl_mem par[K]; size_t off[K];
  uint64_t s = 99; int subs = 0;
  for (int it = 0; it < 3000; it++) {
    int k = (int)(rng(&s) % K);
    if (b[k]) { um_release(b[k]); b[k] = NULL; continue; }
    n[k] = rng(&s) % 3 ? 1 + rng(&s) % 9000 : 1 + rng(&s) % (3u << 20);
    if (um_alloc(m, d, n[k], (um_location)loc, 0, &b[k])) { printf("alloc fail %s\n", um_last_error()); fails++; b[k] = NULL; continue; }
    um_buffer_native bn; um_buffer_native_get(b[k], &bn);
    cl_mem mem = (cl_mem)bn.cl_mem, assoc = NULL; size_t o2 = 0, sz = 0;
    if (!mem) { if (it == 0) printf("no cl_mem (svm %p)\n", bn.svm); par[k] = NULL; off[k] = (size_t)bn.svm; continue; }
    clGetMemObjectInfo(mem, CL_MEM_ASSOCIATED_MEMOBJECT, sizeof assoc, &assoc, NULL);
    clGetMemObjectInfo(mem, CL_MEM_OFFSET, sizeof o2, &o2, NULL);
    clGetMemObjectInfo(mem, CL_MEM_SIZE, sizeof sz, &sz, NULL);
    if (assoc) subs++;
    size_t total = o2 + bn.offset;
    par[k] = assoc ? assoc : mem; off[k] = total;
    if (align && total % align) { printf("MISALIGNED sub-buffer offset %zu (align %zu)\n", total, align); fails++; }
    if (sz - bn.offset < n[k]) { printf("SMALL: cl_mem size %zu offset %zu < %zu\n", sz, bn.offset, n[k]); fails++; }
    for (int j = 0; j < K; j++) if (j != k && b[j] && par[j] == par[k] && par[k] && off[k] < off[j] + n[j] && off[j] < off[k] + n[k]) {
      printf("OVERLAP in parent %p: [%zu,+%zu) and [%zu,+%zu)\n", (void *)par[k], off[k], n[k], off[j], n[j]); fails++; }
    if (bn.host) {
      for (int j = 0; j < K; j++) if (j != k && b[j]) { um_buffer_native bj; um_buffer_native_get(b[j], &bj);
        uint8_t *p = bn.host, *q = bj.host; if (q && p < q + n[j] && q < p + n[k]) { printf("HOST OVERLAP\n"); fails++; } }
    }
  }
  printf("sub-buffers seen %d\n", subs);
  for (int k = 0; k < K; k++) if (b[k]) um_release(b[k]);
  printf("destroy %s, %d failures\n", um_err_name(um_manager_destroy(m)), fails);
  return fails != 0;
}
