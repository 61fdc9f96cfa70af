/* Access brackets seen from outside: calls that would wait through an open
 * bracket, on any device of the profile. */
#include "outside.h"

typedef struct sync_arg {
  um_device *d;
} sync_arg;

static int call_synchronize(void *p) { return um_device_synchronize(((sync_arg *)p)->d); }

/* um_device_synchronize on a device while a bracket is open on one of its
 * buffers: the bracket's end is the caller's to give, so the wait must not
 * pass through it. */
Test(brackets, synchronize_with_a_bracket_open, .timeout = 60) {
  um_manager *m = os_manager();
  um_device *d = os_device(m);
  um_buffer *b;
  void *wait_native = NULL;
  sync_arg a = {d};
  int st;
  cr_assert_eq(um_alloc(m, d, 4096, os_location(), 0, &b), UM_OK);
  cr_assert_eq(um_access_begin(b, UM_MAP_READ_WRITE, &wait_native), UM_OK);
  st = os_bounded(call_synchronize, &a, 10000, "um_device_synchronize inside a bracket");
  cr_assert(st == UM_OK || st == UM_ESTATE, "um_device_synchronize: %s", um_err_name(st));
  cr_assert_eq(um_access_end(b, NULL), UM_OK);
  cr_assert_eq(um_device_synchronize(d), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}
