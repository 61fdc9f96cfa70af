/* um_access_begin_n failing after its checks, made certain with the test
 * build's hook at each bracket's publication (UM__TP_HOLD_CHECKED, once per
 * buffer of the list, in the list's order): a buffer of the list released
 * by another owner while the call opens the brackets makes the call fail
 * with UM_ESTATE, and the brackets it had opened already end as a release
 * would end them: none is left open, every other buffer can be bracketed
 * again, nothing leaks. */
#include "test_util.h"
#include "testhook.h"

static atomic_int holds_seen;
static _Atomic(um_buffer *) release_at_second;

static void on_hold(um__test_point point, void *arg) {
  (void)arg;
  if (point != UM__TP_HOLD_CHECKED || atomic_fetch_add(&holds_seen, 1) != 1)
    return;
  um_buffer *b = atomic_exchange(&release_at_second, NULL);
  if (b != NULL)
    cr_assert_eq(um_release(b), UM_OK, "the release meanwhile");
}

static void assert_free(um_buffer *b) {
  void *wait = NULL;
  cr_assert_eq(um_access_begin(b, UM_MAP_READ_WRITE, &wait), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_access_end(b, NULL), UM_OK);
}

/* y, the second of {x, y, z}, released as its bracket is being published:
 * x's bracket (opened) ends, z's (reserved, not opened) is let go. */
static void released_while_opening(um_manager *m, um_device *d) {
  um_buffer *x, *y, *z;
  um_map_mode modes[3] = {UM_MAP_READ_WRITE, UM_MAP_READ, UM_MAP_WRITE_DISCARD};
  void *wait = (void *)1;
  cr_assert_eq(um_alloc(m, d, 4096, UM_DEVICE, 0, &x), UM_OK);
  cr_assert_eq(um_alloc(m, d, 4096, UM_DEVICE, 0, &y), UM_OK);
  cr_assert_eq(um_alloc(m, d, 4096, UM_DEVICE, 0, &z), UM_OK);
  um_buffer *list[4] = {x, y, x, z};
  um_map_mode modes4[4] = {modes[0], modes[1], UM_MAP_READ, modes[2]};
  atomic_store(&holds_seen, 0);
  atomic_store(&release_at_second, y);
  atomic_store(&um__test_hook, on_hold);
  cr_assert_eq(um_access_begin_n(list, modes4, 4, &wait), UM_ESTATE);
  atomic_store(&um__test_hook, NULL);
  cr_assert_eq(atomic_load(&holds_seen), 2, "x's bracket was published, y's refused, z's never tried");
  cr_assert_eq(wait, (void *)1, "no handle given");
  cr_assert_eq(um_buffer_size(y), 0, "y is released");
  cr_assert_eq(um_access_end(x, NULL), UM_ESTATE, "x's bracket ended with the failure");
  assert_free(x);
  assert_free(z);
  cr_assert_eq(um_device_synchronize(d), UM_OK);
  cr_assert_eq(ut_stats(m, NULL).active_buffers, 2);
  cr_assert_eq(um_release(x), UM_OK);
  cr_assert_eq(um_release(z), UM_OK);
}

Test(access_n_hooks, released_while_opening_cpu) {
  um_manager *m = ut_manager();
  released_while_opening(m, um_device_get(m, 0));
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* On the discrete test devices (no host view, the core's own threads). */
Test(access_n_hooks, released_while_opening_discrete) {
  um_manager *m = ut_manager_disc();
  released_while_opening(m, um_device_get(m, 1));
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}
