/* Tags against wrong owners, wrong kinds and edges (UM_TAG_NAME_MAX, UM_TAG_DEPTH_MAX, UM_TAGS_MAX),
 * tags on 4 managers from one thread popped out of order, um_buffer_tag of non-live handles.
 * Promises (unimem.h): um_tag_push "Returns UM_OK, UM_EINVAL (NULL, not a manager, empty name or one of
 * UM_TAG_NAME_MAX bytes or more), UM_ENOMEM (UM_TAGS_MAX names in use), UM_EOVERFLOW (UM_TAG_DEPTH_MAX tags
 * open)"; "this thread's allocations ... on m count for tag name"; um_tag_pop "UM_ESTATE when none is open";
 * um_buffer_tag "\"\" when b was allocated outside any tag or before the manager observed, NULL for what is
 * not a live buffer"; um_tag_stats_get "UM_EINVAL for NULL m, a device of another manager, negative cap ...
 * Before the first tag, count is 0"; header: "A handle of another kind (or NULL) where one kind is expected
 * answers UM_EINVAL".
 * Build: clang -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -g -fsanitize=address,undefined -Iinclude
 *   tests/outside/found_observe/regress_tag_owners.c -Lbuild-h -lunimem -Wl,-rpath,$PWD/build-h -lpthread -o /tmp/X
 * Run: POCL_DEVICES=pthread UNIMEM_BACKENDS=cpu /tmp/X ; POCL_DEVICES=pthread UNIMEM_BACKENDS=cpu,opencl /tmp/X
 * Printed (both backends): tags after n63,deep: count 3 / distinct names accepted after 2: 1022, push rc UM_ENOMEM, count 1025 / ok
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unimem.h>
static int bad;
#define CHECK(c, ...) do { if (!(c)) { bad = 1; printf("FAIL %s:%d: ", __FILE__, __LINE__); printf(__VA_ARGS__); printf("\n"); } } while (0)
#define NM 4 /* 5+ managers: defect_tag_five_managers.c */
int main(void) {
  um_manager *a, *b, *ms[NM];
  CHECK(um_manager_create(NULL, &a) == UM_OK, "create a");
  CHECK(um_manager_create(NULL, &b) == UM_OK, "create b");
  um_device *da = um_device_get(a, 0), *db = um_device_get(b, 0);
  int nd = um_device_count(a);
  um_device *dlast = um_device_get(a, nd - 1);
  um_tag_stats ts[8];
  CHECK(um_tag_stats_get(a, NULL, ts, 8) == 0, "count before first tag %d", um_tag_stats_get(a, NULL, ts, 8));
  CHECK(um_tag_stats_get(a, NULL, NULL, 0) == 0, "count before first tag, NULL out");
  /* wrong kinds */
  CHECK(um_tag_push(NULL, "x") == UM_EINVAL, "push NULL");
  CHECK(um_tag_push((um_manager *)da, "x") == UM_EINVAL, "push device as manager");
  CHECK(um_tag_pop(NULL) == UM_EINVAL, "pop NULL -> %d", um_tag_pop(NULL));
  CHECK(um_tag_pop((um_manager *)da) == UM_EINVAL, "pop device as manager -> %d", um_tag_pop((um_manager *)da));
  CHECK(um_tag_push(a, NULL) == UM_EINVAL, "push NULL name");
  CHECK(um_tag_push(a, "") == UM_EINVAL, "push empty");
  char n63[64], n64[65];
  memset(n63, 'x', 63); n63[63] = 0; memset(n64, 'y', 64); n64[64] = 0;
  CHECK(um_tag_push(a, n64) == UM_EINVAL, "push 64-byte name");
  CHECK(um_tag_stats_get(a, NULL, ts, 8) == 0, "failed pushes must not make a observe: %d", um_tag_stats_get(a, NULL, ts, 8));
  CHECK(um_tag_push(a, n63) == UM_OK, "push 63-byte name");
  CHECK(um_scope_push((um_manager *)da) == UM_EINVAL, "scope_push device");
  CHECK(um_scope_pop((um_manager *)da, NULL) == UM_EINVAL, "scope_pop device");
  CHECK(um_history_start((um_manager *)da, 10) == UM_EINVAL, "history_start device");
  um_snapshot *s = NULL;
  CHECK(um_snapshot_take((um_manager *)da, &s) == UM_EINVAL, "snapshot_take device");
  CHECK(um_tag_stats_get((um_manager *)da, NULL, ts, 8) == UM_EINVAL, "tag_stats_get device as manager");
  CHECK(um_tag_stats_get(a, db, ts, 8) == UM_EINVAL, "tag_stats_get device of another manager");
  CHECK(um_tag_stats_get(a, NULL, ts, -1) == UM_EINVAL, "negative cap");
  um_buffer *x, *y;
  CHECK(um_alloc(a, da, 100, UM_HOST, 0, &x) == UM_OK, "alloc");
  CHECK(um_buffer_tag(x) && strcmp(um_buffer_tag(x), n63) == 0, "tag of x '%s'", um_buffer_tag(x));
  /* an alloc on b while a has a tag open: b has no tag for this thread */
  CHECK(um_alloc(b, db, 100, UM_HOST, 0, &y) == UM_OK, "alloc b");
  CHECK(um_buffer_tag(y) && strcmp(um_buffer_tag(y), "") == 0, "tag of y on b '%s'", um_buffer_tag(y) ? um_buffer_tag(y) : "(null)");
  CHECK(um_tag_pop(b) == UM_ESTATE, "pop on b with none open: %d", um_tag_pop(b));
  CHECK(um_release(y) == UM_OK, "release y");
  CHECK(um_alloc_tagged(a, db, 10, UM_HOST, 0, "deep", &y) == UM_EINVAL, "alloc_tagged with device of b");
  CHECK(um_alloc_tagged(a, da, 10, UM_HOST, 0, "", &y) == UM_EINVAL, "alloc_tagged empty tag");
  CHECK(um_alloc_tagged(a, da, 10, UM_HOST, 0, n64, &y) == UM_EINVAL, "alloc_tagged long tag");
  CHECK(um_alloc_tagged(a, da, 0, UM_HOST, 0, "deep", &y) == UM_EINVAL, "alloc_tagged zero bytes");
  /* um_buffer_tag of non-buffers */
  CHECK(um_buffer_tag(NULL) == NULL, "buffer_tag NULL");
  CHECK(um_buffer_tag((um_buffer *)da) == NULL, "buffer_tag of a device");
  CHECK(um_buffer_tag((um_buffer *)a) == NULL, "buffer_tag of a manager");
  CHECK(um_release(x) == UM_OK, "release");
  CHECK(um_buffer_tag(x) == NULL, "buffer_tag of released '%s'", um_buffer_tag(x) ? um_buffer_tag(x) : "(null)");
  CHECK(um_tag_pop(a) == UM_OK, "pop");
  CHECK(um_tag_pop(a) == UM_ESTATE, "pop extra");
  /* depth */
  int i, rc;
  for (i = 0; i < UM_TAG_DEPTH_MAX; i++) { rc = um_tag_push(a, "deep"); if (rc != UM_OK) break; }
  CHECK(i == UM_TAG_DEPTH_MAX, "only %d of %d nested pushes ok (rc %d)", i, UM_TAG_DEPTH_MAX, rc);
  CHECK(um_tag_push(a, "deep") == UM_EOVERFLOW, "push 65th");
  for (i = 0; i < UM_TAG_DEPTH_MAX; i++) CHECK(um_tag_pop(a) == UM_OK, "pop %d", i);
  CHECK(um_tag_pop(a) == UM_ESTATE, "pop past depth");
  /* names: n63 and "deep" used; fill to UM_TAGS_MAX */
  int used = um_tag_stats_get(a, NULL, NULL, 0);
  printf("tags after n63,deep: count %d\n", used);
  int pushed = 0; char nm[32];
  for (i = 0; i < 2000; i++) {
    snprintf(nm, sizeof nm, "n%d", i);
    rc = um_tag_push(a, nm);
    if (rc != UM_OK) break;
    um_tag_pop(a); pushed++;
  }
  int cnt = um_tag_stats_get(a, NULL, NULL, 0);
  printf("distinct names accepted after 2: %d, push rc %s, count %d\n", pushed, um_err_name(rc), cnt);
  CHECK(rc == UM_ENOMEM, "after names run out: %s", um_err_name(rc));
  CHECK(pushed + 2 == UM_TAGS_MAX && cnt == UM_TAGS_MAX + 1, "names accepted %d, count %d", pushed + 2, cnt);
  CHECK(um_tag_push(a, "deep") == UM_OK, "an existing name still pushes when full");
  um_tag_pop(a);
  CHECK(um_alloc_tagged(a, da, 10, UM_HOST, 0, "brand-new", &y) == UM_ENOMEM, "alloc_tagged new name when full");
  /* 6 managers from one thread */
  for (i = 0; i < NM; i++) {
    CHECK(um_manager_create(NULL, &ms[i]) == UM_OK, "create %d", i);
    snprintf(nm, sizeof nm, "mgr%d", i);
    CHECK(um_tag_push(ms[i], nm) == UM_OK, "push mgr%d", i);
    snprintf(nm, sizeof nm, "mgr%d-inner", i);
    CHECK(um_tag_push(ms[i], nm) == UM_OK, "push mgr%d", i);
  }
  um_buffer *bs[NM];
  for (i = NM - 1; i >= 0; i--) { /* pop inner in reverse order */
    CHECK(um_tag_pop(ms[i]) == UM_OK, "pop inner %d", i);
    CHECK(um_alloc(ms[i], um_device_get(ms[i], 0), 64 + i, UM_HOST, 0, &bs[i]) == UM_OK, "alloc %d", i);
  }
  for (i = 0; i < NM; i++) {
    snprintf(nm, sizeof nm, "mgr%d", i);
    const char *t = um_buffer_tag(bs[i]);
    CHECK(t && strcmp(t, nm) == 0, "buffer of manager %d has tag '%s', want '%s'", i, t ? t : "(null)", nm);
    um_tag_stats st[4];
    int c = um_tag_stats_get(ms[i], NULL, st, 4);
    CHECK(c == 3, "manager %d tag count %d", i, c);
    if (c >= 2) CHECK(strcmp(st[1].name, nm) == 0 && st[1].bytes_in_use == (uint64_t)(64 + i) && st[1].active_buffers == 1,
                      "manager %d tag[1] %s in_use %llu", i, st[1].name, (unsigned long long)st[1].bytes_in_use);
  }
  for (i = 0; i < NM; i++) { um_tag_pop(ms[i]); um_release(bs[i]); CHECK(um_manager_destroy(ms[i]) == UM_OK, "destroy %d", i); }
  /* OpenCL device (if any): alloc_tagged on the last device */
  if (nd > 1) {
    CHECK(um_alloc_tagged(a, dlast, 4096, UM_DEVICE, 0, "deep", &y) == UM_OK, "alloc_tagged device");
    CHECK(um_buffer_tag(y) && strcmp(um_buffer_tag(y), "deep") == 0, "dev tag");
    um_release(y);
  }
  CHECK(um_manager_destroy(b) == UM_OK, "destroy b");
  CHECK(um_manager_destroy(a) == UM_OK, "destroy a");
  printf(bad ? "FAILED\n" : "ok\n");
  return bad;
}
