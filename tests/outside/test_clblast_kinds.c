/* A real third-party library on unimem memory: CLBlast (Debian's
 * libclblast-dev) runs SAXPY, SCOPY, SSCAL and SGEMM on unimem's DEVICE
 * buffers inside access brackets, on the device's caller queue, while
 * unimem's own copies, fills and batches on the same buffers come before
 * and after (their event objects recycled through bracket, gate, copy,
 * fill, group and run kinds). Every result is checked against a host
 * model; the values are small integers, so float arithmetic is exact on
 * any device (fused or not). OpenCL profiles only (skips on cpu). */
#include "outside.h"

#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <clblast_c.h>

#define CB_N 4096

typedef struct cb {
  um_manager *m;
  um_device *d;
  um_device_native nat;
  um_buffer *x, *y, *z;
  float mx[CB_N], my[CB_N], mz[CB_N];
  uint64_t rng;
} cb;

static unsigned cb_rand(cb *t) {
  t->rng ^= t->rng << 13;
  t->rng ^= t->rng >> 7;
  t->rng ^= t->rng << 17;
  return (unsigned)(t->rng >> 11);
}

static size_t cb_off(um_buffer *b, cl_mem *mem) {
  um_buffer_native n;
  cr_assert_eq(um_buffer_native_get(b, &n), UM_OK);
  cr_assert_not_null(n.cl_mem);
  cr_assert_eq(n.offset % sizeof(float), 0u, "a buffer at byte offset %zu of its cl_mem", n.offset);
  *mem = (cl_mem)n.cl_mem;
  return n.offset / sizeof(float);
}

/* The caller's queue waits for what unimem still has to do on the buffers
 * (PoCL's basic device cannot have a command wait for a user event, a
 * gate: wait for those on the host). */
static void cb_wait(void *const *w, int n, cl_command_queue q) {
  cl_event list[2];
  cl_uint k = 0;
  for (int i = 0; i < n; i++) {
    cl_command_type ct = 0;
    if (w[i] == NULL)
      continue;
    cr_assert_eq(clGetEventInfo((cl_event)w[i], CL_EVENT_COMMAND_TYPE, sizeof(ct), &ct, NULL), CL_SUCCESS);
    if (ct == CL_COMMAND_USER && strcmp(os_profile(), "pocl-basic") == 0)
      cr_assert_eq(clWaitForEvents(1, (cl_event *)&w[i]), CL_SUCCESS);
    else
      list[k++] = (cl_event)w[i];
  }
  if (k > 0)
    cr_assert_eq(clEnqueueBarrierWithWaitList(q, k, list, NULL), CL_SUCCESS);
}

static void cb_check(cb *t, um_buffer *b, const float *model, const char *what, int it) {
  static float h[CB_N];
  cr_assert_eq(um_copy_to_host(b, 0, h, sizeof(h), NULL), UM_OK, "%s", um_last_error());
  for (int i = 0; i < CB_N; i++)
    cr_assert(h[i] == model[i], "iteration %d: %s[%d] is %g, the model says %g", it, what, i, (double)h[i],
              (double)model[i]);
  (void)t;
}

Test(clblast_kinds, blas_in_brackets_among_every_kind, .timeout = 300) {
  static cb t;
  cl_command_queue q;
  int iters = (int)(getenv("CB_ITERS") ? atoi(getenv("CB_ITERS")) : 300);
  memset(&t, 0, sizeof(t));
  t.rng = 88172645463325252ull;
  t.m = os_manager();
  if (um_device_count(t.m) < 2) {
    um_manager_destroy(t.m);
    cr_skip_test("profile %s has no OpenCL device", os_profile());
  }
  t.d = os_device(t.m);
  cr_assert_eq(um_device_native_get(t.d, &t.nat), UM_OK);
  q = (cl_command_queue)t.nat.cl_queue;
  cr_assert_eq(um_alloc(t.m, t.d, sizeof(t.mx), UM_DEVICE, UM_ALLOC_ZERO, &t.x), UM_OK);
  cr_assert_eq(um_alloc(t.m, t.d, sizeof(t.my), UM_DEVICE, UM_ALLOC_ZERO, &t.y), UM_OK);
  cr_assert_eq(um_alloc(t.m, t.d, sizeof(t.mz), UM_DEVICE, UM_ALLOC_ZERO, &t.z), UM_OK);
  for (int it = 0; it < iters; it++) {
    static float src[CB_N], part[CB_N];
    um_event *e1 = NULL, *e2 = NULL, *e3 = NULL;
    void *w[2] = {NULL, NULL};
    cl_mem xm, ym;
    size_t xo, yo;
    cl_event ev = NULL;
    CLBlastStatusCode s = CLBlastSuccess;
    int kind = (int)(cb_rand(&t) % 4);
    /* unimem's work before: an upload of X (async), sometimes a fill of Y
     * and a batch into Y; their events released at once or later */
    for (int i = 0; i < CB_N; i++)
      src[i] = (float)((int)(cb_rand(&t) % 7) - 3);
    cr_assert_eq(um_copy_from_host(t.x, 0, src, sizeof(src), &e1), UM_OK);
    memcpy(t.mx, src, sizeof(src));
    if (cb_rand(&t) % 2) {
      cr_assert_eq(um_event_release(e1), UM_OK); /* src stays valid: it is static, rewritten only below */
      e1 = NULL;
    }
    if (cb_rand(&t) % 3 == 0) {
      cr_assert_eq(um_fill(t.y, 0, 0, sizeof(t.my), &e2), UM_OK);
      memset(t.my, 0, sizeof(t.my));
    }
    if (cb_rand(&t) % 3 == 0) {
      um_copy_op ops[2];
      memset(ops, 0, sizeof(ops));
      ops[0].dst = t.y;
      ops[0].src = t.x;
      ops[0].bytes = 256 * sizeof(float);
      ops[0].dst_off = 1024 * sizeof(float);
      ops[1].dst = t.y;
      ops[1].host_src = t.mx + 100; /* the model is not touched until this is waited for */
      ops[1].bytes = 64 * sizeof(float);
      cr_assert_eq(um_copy_batch(t.m, ops, 2, &e3), UM_OK, "%s", um_last_error());
      memcpy(t.my + 1024, t.mx, 256 * sizeof(float));
      memcpy(t.my, t.mx + 100, 64 * sizeof(float));
    }
    /* the caller's BLAS call on X and Y */
    cr_assert_eq(um_access_begin(t.x, UM_MAP_READ, &w[0]), UM_OK, "%s", um_last_error());
    cr_assert_eq(um_access_begin(t.y, UM_MAP_READ_WRITE, &w[1]), UM_OK, "%s", um_last_error());
    cb_wait(w, 2, q);
    xo = cb_off(t.x, &xm);
    yo = cb_off(t.y, &ym);
    switch (kind) {
    case 0: /* y = 2x + y */
      s = CLBlastSaxpy(CB_N, 2.0f, xm, xo, 1, ym, yo, 1, &q, &ev);
      for (int i = 0; i < CB_N; i++)
        t.my[i] = 2.0f * t.mx[i] + t.my[i];
      break;
    case 1: /* y[0..N/2) = x[N/2..N) */
      s = CLBlastScopy(CB_N / 2, xm, xo + CB_N / 2, 1, ym, yo, 1, &q, &ev);
      memcpy(t.my, t.mx + CB_N / 2, CB_N / 2 * sizeof(float));
      break;
    case 2: /* every other y times -1 */
      s = CLBlastSscal(CB_N / 2, -1.0f, ym, yo, 2, &q, &ev);
      for (int i = 0; i < CB_N; i += 2)
        t.my[i] = -t.my[i];
      break;
    default: { /* C(16x16, at y) = A(x) B(x + 256) + C */
      float c[256];
      s = CLBlastSgemm(CLBlastLayoutRowMajor, CLBlastTransposeNo, CLBlastTransposeNo, 16, 16, 16, 1.0f, xm, xo, 16,
                       xm, xo + 256, 16, 1.0f, ym, yo, 16, &q, &ev);
      for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++) {
          float acc = t.my[i * 16 + j];
          for (int k = 0; k < 16; k++)
            acc += t.mx[i * 16 + k] * t.mx[256 + k * 16 + j];
          c[i * 16 + j] = acc;
        }
      memcpy(t.my, c, sizeof(c));
      break;
    }
    }
    cr_assert_eq(s, CLBlastSuccess, "CLBlast call %d: status %d", kind, (int)s);
    cr_assert_not_null(ev);
    cr_assert_eq(um_access_end(t.y, ev), UM_OK, "%s", um_last_error());
    cr_assert_eq(um_access_end(t.x, ev), UM_OK, "%s", um_last_error());
    cr_assert_eq(clReleaseEvent(ev), CL_SUCCESS);
    /* unimem's work after, on the same buffers: a copy into Z, a partial
     * download, a batch out of Y and X */
    cr_assert_eq(um_copy(t.z, 0, t.y, 0, sizeof(t.my), NULL), UM_OK, "%s", um_last_error());
    memcpy(t.mz, t.my, sizeof(t.my));
    if (cb_rand(&t) % 2) {
      um_copy_op ops[2];
      um_event *eb = NULL;
      memset(ops, 0, sizeof(ops));
      ops[0].src = t.y;
      ops[0].host_dst = part;
      ops[0].bytes = 1000 * sizeof(float);
      ops[1].src = t.x;
      ops[1].src_off = 16;
      ops[1].host_dst = part + 1000;
      ops[1].bytes = 500 * sizeof(float);
      cr_assert_eq(um_copy_batch(t.m, ops, 2, &eb), UM_OK);
      cr_assert_eq(um_event_wait(eb), UM_OK, "%s", um_last_error());
      cr_assert_eq(um_event_release(eb), UM_OK);
      cr_assert_eq(memcmp(part, t.my, 1000 * sizeof(float)), 0, "iteration %d: the batch's copy of Y", it);
      cr_assert_eq(memcmp(part + 1000, t.mx + 4, 500 * sizeof(float)), 0, "iteration %d: the batch's copy of X", it);
    }
    if (e1 != NULL) {
      cr_assert_eq(um_event_wait(e1), UM_OK);
      cr_assert_eq(um_event_release(e1), UM_OK);
    }
    if (e2 != NULL) {
      cr_assert_eq(um_event_wait(e2), UM_OK);
      cr_assert_eq(um_event_release(e2), UM_OK);
    }
    if (e3 != NULL) {
      cr_assert_eq(um_event_wait(e3), UM_OK);
      cr_assert_eq(um_event_release(e3), UM_OK);
    }
    cb_check(&t, t.y, t.my, "Y", it);
    if (it % 8 == 0) {
      cb_check(&t, t.x, t.mx, "X", it);
      cb_check(&t, t.z, t.mz, "Z", it);
    }
  }
  cr_assert_eq(um_release(t.x), UM_OK);
  cr_assert_eq(um_release(t.y), UM_OK);
  cr_assert_eq(um_release(t.z), UM_OK);
  cr_assert_eq(um_manager_destroy(t.m), UM_OK, "%s", um_last_error());
}
