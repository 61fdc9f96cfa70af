/* The same buffer twice in one call, or the same call twice on a buffer:
 * copies of a buffer into itself, batches that name one buffer in several
 * ops, brackets, maps, releases, retains and DLPack exports repeated. Each
 * case asserts what include/unimem.h promises, on every profile. */
#include "outside.h"

#include <unimem_dlpack.h>

#define TW_N 4096u

/* A buffer of the profile's accelerator holding the pattern of seed. */
static um_buffer *tw_buffer(um_manager *m, size_t n, uint32_t seed) {
  um_buffer *b = NULL;
  uint8_t *h = malloc(n);
  cr_assert_not_null(h);
  cr_assert_eq(um_alloc(m, os_device(m), n, os_location(), 0, &b), UM_OK, "%s", um_last_error());
  os_pattern(h, n, seed);
  cr_assert_eq(um_copy_from_host(b, 0, h, n, NULL), UM_OK, "%s", um_last_error());
  free(h);
  return b;
}

static uint8_t *tw_read(um_buffer *b, size_t n) {
  uint8_t *h = malloc(n);
  cr_assert_not_null(h);
  cr_assert_eq(um_copy_to_host(b, 0, h, n, NULL), UM_OK, "%s", um_last_error());
  return h;
}

/* ------------------------------------------------------------------------ */
/* um_copy of a buffer into itself */

/* The same range: nothing changes. */
Test(twice, copy_same_range_onto_itself, .timeout = 60) {
  um_manager *m = os_manager();
  um_buffer *b = tw_buffer(m, TW_N, 1);
  int st = um_copy(b, 0, b, 0, TW_N, NULL);
  uint8_t *h;
  cr_assert(st == UM_OK || st == UM_EINVAL, "um_copy(b, 0, b, 0): %s", um_err_name(st));
  h = tw_read(b, TW_N);
  cr_assert_eq(os_pattern_diff(h, TW_N, 1), SIZE_MAX, "the buffer changed");
  free(h);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* Disjoint halves of one buffer: a plain copy. */
Test(twice, copy_disjoint_halves_of_one_buffer, .timeout = 60) {
  um_manager *m = os_manager();
  um_buffer *b = tw_buffer(m, TW_N, 2);
  uint8_t *want = malloc(TW_N), *h;
  cr_assert_eq(um_copy(b, TW_N / 2, b, 0, TW_N / 2, NULL), UM_OK, "%s", um_last_error());
  os_pattern(want, TW_N, 2);
  memcpy(want + TW_N / 2, want, TW_N / 2);
  h = tw_read(b, TW_N);
  cr_assert_eq(memcmp(h, want, TW_N), 0, "the second half is not the first");
  free(h);
  free(want);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* Overlapping ranges of one buffer. The header says nothing of overlap: a
 * refusal (UM_EINVAL) is fine, and so is memmove's result; anything else
 * (memcpy's undefined behaviour, a corrupted range, a backend error
 * passed on as success) is not. Forwards and backwards. */
static void tw_overlap(size_t dst_off, size_t src_off, size_t bytes) {
  um_manager *m = os_manager();
  um_buffer *b = tw_buffer(m, TW_N, 3);
  uint8_t *want = malloc(TW_N), *h;
  int st = um_copy(b, dst_off, b, src_off, bytes, NULL);
  os_pattern(want, TW_N, 3);
  h = tw_read(b, TW_N);
  if (st == UM_OK) {
    memmove(want + dst_off, want + src_off, bytes);
    cr_assert_eq(memcmp(h, want, TW_N), 0, "overlapping copy %zu <- %zu (%zu bytes) returned UM_OK with "
                 "bytes that are not memmove's (first difference at %zu)", dst_off, src_off, bytes,
                 (size_t)(({ size_t i = 0; while (i < TW_N && h[i] == want[i]) i++; i; })));
  } else {
    cr_assert_eq(st, UM_EINVAL, "overlapping copy: %s (%s)", um_err_name(st), um_last_error());
    cr_assert_eq(os_pattern_diff(h, TW_N, 3), SIZE_MAX, "a refused copy changed the buffer");
  }
  free(h);
  free(want);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

Test(twice, copy_overlapping_forwards, .timeout = 60) { tw_overlap(1, 0, TW_N - 1); }
Test(twice, copy_overlapping_backwards, .timeout = 60) { tw_overlap(0, 1, TW_N - 1); }
Test(twice, copy_overlapping_large, .timeout = 120) {
  /* past one staging chunk, where a chunked copy would read bytes it wrote */
  um_manager *m = os_manager();
  const size_t n = 8u << 20;
  um_buffer *b = tw_buffer(m, n, 4);
  uint8_t *want = malloc(n), *h;
  int st = um_copy(b, 4096, b, 0, n - 4096, NULL);
  os_pattern(want, n, 4);
  h = tw_read(b, n);
  if (st == UM_OK) {
    memmove(want + 4096, want, n - 4096);
    cr_assert_eq(memcmp(h, want, n), 0, "an 8 MiB overlapping copy returned UM_OK with bytes that are not "
                 "memmove's");
  } else {
    cr_assert_eq(st, UM_EINVAL, "overlapping copy: %s (%s)", um_err_name(st), um_last_error());
  }
  free(h);
  free(want);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* ------------------------------------------------------------------------ */
/* um_copy_batch naming one buffer twice */

/* Two ops into the same range of one dst: "Operations on one buffer take
 * effect in the order they were issued", and the batch issues its ops in
 * order, so the second op's bytes are what stays. */
Test(twice, batch_one_dst_twice_last_wins, .timeout = 60) {
  um_manager *m = os_manager();
  um_buffer *b = tw_buffer(m, TW_N, 5);
  uint8_t *a = malloc(TW_N), *c = malloc(TW_N), *h;
  um_copy_op ops[2];
  os_pattern(a, TW_N, 6);
  os_pattern(c, TW_N, 7);
  memset(ops, 0, sizeof(ops));
  ops[0].dst = b;
  ops[0].host_src = a;
  ops[0].bytes = TW_N;
  ops[1] = ops[0];
  ops[1].host_src = c;
  for (int round = 0; round < 50; round++) {
    cr_assert_eq(um_copy_batch(m, ops, 2, NULL), UM_OK, "%s", um_last_error());
    h = tw_read(b, TW_N);
    cr_assert_eq(os_pattern_diff(h, TW_N, 7), SIZE_MAX, "round %d: the first op's bytes won (or a mix)", round);
    free(h);
  }
  free(a);
  free(c);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* A chain inside one batch: op 0 writes b, op 1 copies b to d, op 2 reads
 * d to the host. Each sees the one before. */
Test(twice, batch_chain_through_one_buffer, .timeout = 60) {
  um_manager *m = os_manager();
  um_buffer *b = tw_buffer(m, TW_N, 8), *d = tw_buffer(m, TW_N, 9);
  uint8_t *a = malloc(TW_N), *out = calloc(1, TW_N);
  um_copy_op ops[3];
  os_pattern(a, TW_N, 10);
  memset(ops, 0, sizeof(ops));
  ops[0].dst = b;
  ops[0].host_src = a;
  ops[0].bytes = TW_N;
  ops[1].dst = d;
  ops[1].src = b;
  ops[1].bytes = TW_N;
  ops[2].host_dst = out;
  ops[2].src = d;
  ops[2].bytes = TW_N;
  for (int round = 0; round < 50; round++) {
    memset(out, 0, TW_N);
    cr_assert_eq(um_copy_batch(m, ops, 3, NULL), UM_OK, "%s", um_last_error());
    cr_assert_eq(os_pattern_diff(out, TW_N, 10), SIZE_MAX, "round %d: the chain's end did not see its start",
                 round);
  }
  free(a);
  free(out);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_release(d), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* dst == src in one op, the same range: accepted or refused, the bytes
 * stay. */
Test(twice, batch_dst_is_src, .timeout = 60) {
  um_manager *m = os_manager();
  um_buffer *b = tw_buffer(m, TW_N, 11);
  um_copy_op op;
  uint8_t *h;
  int st;
  memset(&op, 0, sizeof(op));
  op.dst = b;
  op.src = b;
  op.bytes = TW_N;
  st = um_copy_batch(m, &op, 1, NULL);
  cr_assert(st == UM_OK || st == UM_EINVAL, "%s", um_err_name(st));
  h = tw_read(b, TW_N);
  cr_assert_eq(os_pattern_diff(h, TW_N, 11), SIZE_MAX, "the buffer changed");
  free(h);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* "Every op is checked before any is issued": a bad second op leaves the
 * first one's dst untouched. */
Test(twice, batch_bad_second_op_issues_nothing, .timeout = 60) {
  um_manager *m = os_manager();
  um_buffer *b = tw_buffer(m, TW_N, 12);
  uint8_t *a = malloc(TW_N), *h;
  um_copy_op ops[2];
  os_pattern(a, TW_N, 13);
  memset(ops, 0, sizeof(ops));
  ops[0].dst = b;
  ops[0].host_src = a;
  ops[0].bytes = TW_N;
  ops[1] = ops[0];
  ops[1].dst_off = 1; /* past the end */
  cr_assert_eq(um_copy_batch(m, ops, 2, NULL), UM_ERANGE);
  ops[1].dst_off = 0;
  ops[1].src = b; /* both src and host_src */
  cr_assert_eq(um_copy_batch(m, ops, 2, NULL), UM_EINVAL);
  ops[1].src = NULL;
  ops[1].bytes = 0;
  cr_assert_eq(um_copy_batch(m, ops, 2, NULL), UM_EINVAL);
  h = tw_read(b, TW_N);
  cr_assert_eq(os_pattern_diff(h, TW_N, 12), SIZE_MAX, "a refused batch wrote its first op");
  free(h);
  free(a);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* The same batch op with an event: released before and after it ends. */
Test(twice, batch_event_twice, .timeout = 60) {
  um_manager *m = os_manager();
  um_buffer *b = tw_buffer(m, TW_N, 14);
  uint8_t *a = malloc(TW_N);
  um_copy_op op;
  um_event *e = NULL;
  os_pattern(a, TW_N, 15);
  memset(&op, 0, sizeof(op));
  op.dst = b;
  op.host_src = a;
  op.bytes = TW_N;
  cr_assert_eq(um_copy_batch(m, &op, 1, &e), UM_OK);
  cr_assert_eq(um_event_wait(e), UM_OK);
  cr_assert_eq(um_event_wait(e), UM_OK, "a second wait answers the status again");
  cr_assert_eq(um_event_query(e), UM_OK);
  cr_assert_eq(um_event_cancel(e), UM_EBUSY, "cancel of an ended operation");
  cr_assert_eq(um_event_release(e), UM_OK);
  cr_assert_eq(um_event_release(e), UM_ESTATE);
  cr_assert_eq(um_event_wait(e), UM_ESTATE);
  cr_assert_eq(um_event_query(e), UM_ESTATE);
  cr_assert_eq(um_event_cancel(e), UM_ESTATE);
  free(a);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* ------------------------------------------------------------------------ */
/* Brackets, maps, releases twice */

Test(twice, access_begin_twice, .timeout = 60) {
  um_manager *m = os_manager();
  um_buffer *b = tw_buffer(m, TW_N, 16);
  void *w = NULL, *w2 = (void *)1;
  cr_assert_eq(um_access_begin(b, UM_MAP_READ, &w), UM_OK);
  cr_assert_eq(um_access_begin(b, UM_MAP_READ, &w2), UM_ESTATE);
  cr_assert_eq(w2, (void *)1, "out-parameters are written only on success");
  cr_assert_eq(um_access_begin(b, UM_MAP_READ_WRITE, &w2), UM_ESTATE);
  cr_assert_eq(um_access_end(b, NULL), UM_OK);
  cr_assert_eq(um_access_end(b, NULL), UM_ESTATE, "end without a bracket");
  cr_assert_eq(um_access_begin(b, UM_MAP_READ_WRITE, &w), UM_OK, "a bracket again after the end");
  cr_assert_eq(um_access_end(b, NULL), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

Test(twice, access_begin_unknown_mode, .timeout = 60) {
  um_manager *m = os_manager();
  um_buffer *b = tw_buffer(m, TW_N, 17);
  void *w = NULL;
  cr_assert_eq(um_access_begin(b, (um_map_mode)4, &w), UM_EINVAL);
  cr_assert_eq(um_access_begin(b, (um_map_mode)-1, &w), UM_EINVAL);
  cr_assert_eq(um_access_end(b, NULL), UM_ESTATE, "a refused begin opened a bracket");
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* A bracket and a map of one buffer: each refuses the other. */
Test(twice, access_and_map_exclude_each_other, .timeout = 60) {
  um_manager *m = os_manager();
  um_buffer *b = tw_buffer(m, TW_N, 18);
  void *w = NULL, *p = NULL;
  cr_assert_eq(um_map(b, UM_MAP_READ, 0, TW_N, &p), UM_OK);
  cr_assert_eq(um_access_begin(b, UM_MAP_READ, &w), UM_ESTATE, "a bracket on a mapped buffer");
  cr_assert_eq(um_unmap(b, p), UM_OK);
  cr_assert_eq(um_access_begin(b, UM_MAP_READ, &w), UM_OK);
  cr_assert_eq(um_map(b, UM_MAP_READ, 0, TW_N, &p), UM_ESTATE, "a map inside a bracket");
  cr_assert_eq(um_access_end(b, NULL), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

Test(twice, map_twice_unmap_twice, .timeout = 60) {
  um_manager *m = os_manager();
  um_buffer *b = tw_buffer(m, TW_N, 19);
  void *p = NULL, *q = (void *)1;
  cr_assert_eq(um_map(b, UM_MAP_READ, 0, TW_N, &p), UM_OK);
  cr_assert_not_null(p);
  cr_assert_eq(um_map(b, UM_MAP_READ, 0, TW_N, &q), UM_ESTATE);
  cr_assert_eq(q, (void *)1, "out-parameters are written only on success");
  cr_assert_eq(um_map(b, UM_MAP_WRITE, 16, 16, &q), UM_ESTATE);
  cr_assert_eq(um_unmap(b, (char *)p + 1), UM_EINVAL, "not the pointer um_map returned");
  cr_assert_eq(um_unmap(b, p), UM_OK, "the wrong pointer ended the mapping");
  cr_assert_eq(um_unmap(b, p), UM_ESTATE);
  cr_assert_eq(um_unmap(b, NULL), UM_ESTATE);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* A map at an offset returns the view of that offset, and the unmap of a
 * write makes the bytes current. */
Test(twice, map_at_offset_write_then_read, .timeout = 60) {
  um_manager *m = os_manager();
  um_buffer *b = tw_buffer(m, TW_N, 20);
  uint8_t *p = NULL, *h;
  uint8_t *want = malloc(TW_N);
  cr_assert_eq(um_map(b, UM_MAP_READ_WRITE, 100, 50, (void **)&p), UM_OK);
  os_pattern(want, TW_N, 20);
  cr_assert_eq(memcmp(p, want + 100, 50), 0, "the view at offset 100 holds other bytes");
  memset(p, 0xAB, 50);
  cr_assert_eq(um_unmap(b, p), UM_OK);
  memset(want + 100, 0xAB, 50);
  h = tw_read(b, TW_N);
  cr_assert_eq(memcmp(h, want, TW_N), 0, "the write through the mapping did not land at [100, 150)");
  free(h);
  free(want);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* Releasing twice, and every buffer call on the released handle (before
 * any allocation can take its block). */
Test(twice, release_twice_and_use_after, .timeout = 60) {
  um_manager *m = os_manager();
  um_buffer *b = tw_buffer(m, TW_N, 21), *c = tw_buffer(m, TW_N, 22);
  uint8_t h[16];
  void *p = NULL;
  um_event *e = NULL;
  um_buffer_native bn;
  int32_t dt, di;
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_release(b), UM_ESTATE);
  cr_assert_eq(um_buffer_retain(b), UM_ESTATE);
  cr_assert_eq(um_buffer_size(b), 0u);
  cr_assert_null(um_buffer_device(b));
  cr_assert_eq(um_buffer_valid(b), 0u);
  cr_assert_null(um_buffer_host_ptr(b));
  cr_assert_eq(um_copy_from_host(b, 0, h, 16, NULL), UM_ESTATE);
  cr_assert_eq(um_copy_from_host(b, 0, h, 16, &e), UM_ESTATE);
  cr_assert_null(e);
  cr_assert_eq(um_copy_to_host(b, 0, h, 16, NULL), UM_ESTATE);
  cr_assert_eq(um_copy(c, 0, b, 0, 16, NULL), UM_ESTATE);
  cr_assert_eq(um_copy(b, 0, c, 0, 16, NULL), UM_ESTATE);
  cr_assert_eq(um_fill(b, 0, 1, 16, NULL), UM_ESTATE);
  cr_assert_eq(um_map(b, UM_MAP_READ, 0, 16, &p), UM_ESTATE);
  cr_assert_eq(um_unmap(b, p), UM_ESTATE);
  cr_assert_eq(um_access_begin(b, UM_MAP_READ, &p), UM_ESTATE);
  cr_assert_eq(um_access_end(b, NULL), UM_ESTATE);
  cr_assert_eq(um_buffer_native_get(b, &bn), UM_ESTATE);
  cr_assert_eq(um_dlpack_device(b, &dt, &di), UM_ESTATE);
  {
    int64_t shape = 16;
    void *t = NULL;
    cr_assert_eq(um_dlpack_export(b, 0, 1, &shape, NULL, UM_DL_UINT, 8, 1, 0, &t), UM_ESTATE);
  }
  {
    um_copy_op op;
    memset(&op, 0, sizeof(op));
    op.dst = b;
    op.host_src = h;
    op.bytes = 16;
    cr_assert_eq(um_copy_batch(m, &op, 1, NULL), UM_ESTATE);
  }
  cr_assert_eq(um_release(c), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* Retain / release counts: each retain needs one more release; the buffer
 * stays usable until the last one, and the stats count it once. */
Test(twice, retain_release_counts, .timeout = 60) {
  um_manager *m = os_manager();
  um_buffer *b = tw_buffer(m, TW_N, 23);
  um_stats s;
  uint8_t *h;
  cr_assert_eq(um_buffer_retain(b), UM_OK);
  cr_assert_eq(um_buffer_retain(b), UM_OK);
  cr_assert_eq(um_stats_get(m, NULL, &s), UM_OK);
  cr_assert_eq(s.active_buffers, 1u, "retains count as buffers");
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_buffer_size(b), TW_N, "one reference left: the buffer is live");
  h = tw_read(b, TW_N);
  cr_assert_eq(os_pattern_diff(h, TW_N, 23), SIZE_MAX);
  free(h);
  cr_assert_eq(um_stats_get(m, NULL, &s), UM_OK);
  cr_assert_eq(s.active_buffers, 1u);
  cr_assert_eq(s.releases, 0u, "a release of a retained buffer counted as a release");
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_release(b), UM_ESTATE);
  cr_assert_eq(um_stats_get(m, NULL, &s), UM_OK);
  cr_assert_eq(s.active_buffers, 0u);
  cr_assert_eq(s.releases, 1u);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* A retained buffer released with a pending operation behind a bracket:
 * the last release still waits its turn; nothing frees it early. */
Test(twice, retained_release_inside_bracket, .timeout = 60) {
  um_manager *m = os_manager();
  um_buffer *b = tw_buffer(m, TW_N, 24);
  void *w = NULL;
  um_event *e = NULL;
  cr_assert_eq(um_buffer_retain(b), UM_OK);
  cr_assert_eq(um_access_begin(b, UM_MAP_READ_WRITE, &w), UM_OK);
  cr_assert_eq(um_fill(b, 0, 0x5A, TW_N, &e), UM_OK);
  cr_assert_eq(um_release(b), UM_OK, "a retained buffer's first release inside a bracket");
  cr_assert_eq(um_access_end(b, NULL), UM_OK, "the bracket was ended by a release that was not the last");
  cr_assert_eq(um_event_wait(e), UM_OK);
  cr_assert_eq(um_event_release(e), UM_OK);
  {
    uint8_t *h = tw_read(b, TW_N);
    for (size_t i = 0; i < TW_N; i++)
      cr_assert_eq(h[i], 0x5A, "byte %zu", i);
    free(h);
  }
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* ------------------------------------------------------------------------ */
/* DLPack exports twice */

static int tw_host_backed(um_buffer *b) { return um_buffer_host_ptr(b) != NULL; }

Test(twice, dlpack_export_twice, .timeout = 60) {
  um_manager *m = os_manager();
  um_buffer *b = tw_buffer(m, TW_N, 25);
  int64_t shape = TW_N;
  void *t1 = NULL, *t2 = NULL;
  um_stats s;
  int st = um_dlpack_export(b, 0, 1, &shape, NULL, UM_DL_UINT, 8, 1, 0, &t1);
  if (st == UM_ENOTSUP)
    cr_skip_test("no DLPack for this device's buffers");
  cr_assert_eq(st, UM_OK, "%s", um_last_error());
  cr_assert_eq(um_dlpack_export(b, 0, 1, &shape, NULL, UM_DL_UINT, 8, 1, UM_DLPACK_VERSIONED, &t2), UM_OK);
  cr_assert_neq(t1, t2);
  cr_assert_eq(um_release(b), UM_OK, "the caller's reference");
  cr_assert_eq(um_buffer_size(b), TW_N, "two tensors hold the buffer");
  {
    um_dl_managed_tensor *l = t1;
    um_dl_managed_tensor_versioned *v = t2;
    if (tw_host_backed(b)) {
      cr_assert_eq(os_pattern_diff(l->dl_tensor.data, TW_N, 25), SIZE_MAX);
      cr_assert_eq(l->dl_tensor.data, v->dl_tensor.data);
    }
    cr_assert_eq(v->version.major, UM_DL_MAJOR_VERSION);
    cr_assert_eq(v->flags & UM_DL_FLAG_READ_ONLY, 0u);
    cr_assert_not_null(l->deleter);
    cr_assert_not_null(v->deleter);
    l->deleter(l);
    cr_assert_eq(um_buffer_size(b), TW_N, "one tensor still holds the buffer");
    cr_assert_eq(um_stats_get(m, NULL, &s), UM_OK);
    cr_assert_eq(s.active_buffers, 1u);
    v->deleter(v);
  }
  cr_assert_eq(um_stats_get(m, NULL, &s), UM_OK);
  cr_assert_eq(s.active_buffers, 0u, "both deleters ran: nothing is live");
  cr_assert_eq(um_release(b), UM_ESTATE);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* An export while mapped is refused, and so is a legacy export of a
 * read-only wrap; a versioned one carries READ_ONLY. */
Test(twice, dlpack_export_mapped_and_readonly, .timeout = 60) {
  um_manager *m = os_manager();
  um_buffer *b = tw_buffer(m, TW_N, 26), *r = NULL;
  static uint8_t mem[TW_N];
  int64_t shape = 16;
  void *t = NULL, *p = NULL;
  cr_assert_eq(um_map(b, UM_MAP_READ, 0, TW_N, &p), UM_OK);
  cr_assert_eq(um_dlpack_export(b, 0, 1, &shape, NULL, UM_DL_UINT, 8, 1, 0, &t), UM_ESTATE);
  cr_assert_null(t);
  cr_assert_eq(um_unmap(b, p), UM_OK);
  cr_assert_eq(um_wrap_host(m, mem, sizeof(mem), UM_WRAP_READONLY, &r), UM_OK);
  cr_assert_eq(um_dlpack_export(r, 0, 1, &shape, NULL, UM_DL_UINT, 8, 1, 0, &t), UM_ESTATE);
  cr_assert_eq(um_dlpack_export(r, 0, 1, &shape, NULL, UM_DL_UINT, 8, 1, UM_DLPACK_READONLY, &t), UM_EINVAL,
               "READONLY without VERSIONED");
  cr_assert_eq(um_dlpack_export(r, 0, 1, &shape, NULL, UM_DL_UINT, 8, 1, UM_DLPACK_VERSIONED, &t), UM_OK);
  {
    um_dl_managed_tensor_versioned *v = t;
    cr_assert_neq(v->flags & UM_DL_FLAG_READ_ONLY, 0u, "a read-only wrap's tensor must say read-only");
    v->deleter(v);
  }
  cr_assert_eq(um_release(r), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* An exported tensor imported back into the same manager: a second buffer
 * over the same memory; releasing it runs the deleter, which drops the
 * export's reference. */
Test(twice, dlpack_export_then_import_same_manager, .timeout = 60) {
  um_manager *m = os_manager();
  um_buffer *b = NULL, *c = NULL;
  int64_t shape = TW_N;
  void *t = NULL;
  um_stats s;
  cr_assert_eq(um_alloc(m, um_device_get(m, 0), TW_N, UM_HOST, 0, &b), UM_OK);
  os_pattern(um_buffer_host_ptr(b), TW_N, 27);
  cr_assert_eq(um_dlpack_export(b, 0, 1, &shape, NULL, UM_DL_UINT, 8, 1, UM_DLPACK_VERSIONED, &t), UM_OK);
  cr_assert_eq(um_dlpack_import(m, t, UM_DLPACK_VERSIONED, &c), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_buffer_size(c), TW_N);
  cr_assert_eq(um_buffer_host_ptr(c), um_buffer_host_ptr(b), "zero-copy both ways");
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_buffer_size(b), TW_N, "the import's tensor holds b");
  cr_assert_eq(um_release(c), UM_OK);
  cr_assert_eq(um_stats_get(m, NULL, &s), UM_OK);
  cr_assert_eq(s.active_buffers, 0u, "the import's release ran the deleter, which released b");
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* ------------------------------------------------------------------------ */
/* Wraps of the same memory twice */

Test(twice, two_wraps_of_one_range, .timeout = 60) {
  um_manager *m = os_manager();
  static uint8_t mem[TW_N];
  um_buffer *a = NULL, *b = NULL;
  uint8_t h[TW_N];
  cr_assert_eq(um_wrap_host(m, mem, sizeof(mem), 0, &a), UM_OK);
  cr_assert_eq(um_wrap_host(m, mem, sizeof(mem), UM_WRAP_READONLY, &b), UM_OK);
  os_pattern(h, TW_N, 28);
  cr_assert_eq(um_copy_from_host(a, 0, h, TW_N, NULL), UM_OK);
  cr_assert_eq(um_copy_from_host(b, 0, h, TW_N, NULL), UM_ESTATE, "write through a read-only wrap");
  cr_assert_eq(um_fill(b, 0, 0, 1, NULL), UM_ESTATE);
  cr_assert_eq(um_copy(b, 0, a, 0, 1, NULL), UM_ESTATE);
  memset(h, 0, sizeof(h));
  cr_assert_eq(um_copy_to_host(b, 0, h, TW_N, NULL), UM_OK);
  cr_assert_eq(os_pattern_diff(h, TW_N, 28), SIZE_MAX);
  {
    void *p = NULL;
    cr_assert_eq(um_map(b, UM_MAP_WRITE, 0, 16, &p), UM_ESTATE, "a writing map of a read-only wrap");
    cr_assert_eq(um_map(b, UM_MAP_READ_WRITE, 0, 16, &p), UM_ESTATE);
    cr_assert_eq(um_map(b, UM_MAP_WRITE_DISCARD, 0, 16, &p), UM_ESTATE);
    cr_assert_eq(um_access_begin(b, UM_MAP_READ_WRITE, &p), UM_ESTATE);
  }
  cr_assert_eq(um_release(a), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}
