/* Loading libucp.so.0 at run time (base/vendor_lib.c, as the backends do):
 * unimem neither links against UCX nor needs it installed; um_net_create
 * answers UM_ENOTSUP where it is missing. */
#include <stddef.h>

#include "net.h"
#include "ucx_api.h"

um__ucx_lib um__ucx;

static const um__vendor_entry ucx_entries[] = {
#define UCX_ENTRY_(ret, name, params) {#name, offsetof(um__ucx_lib, name), true},
    UCX_ENTRY_POINTS(UCX_ENTRY_)
#undef UCX_ENTRY_
};

static const char *const ucx_names[] = {"libucp.so.0", NULL};

static um__vendor_lib ucx_lib =
    UM__VENDOR_LIB_INIT("UCX is not available", "UNIMEM_UCX_LIBRARY", ucx_names, ucx_entries, &um__ucx, NULL);

/* UCX does not survive fork() in the child either: its async thread, its
 * connections' sockets and shared-memory segments stay the parent's, and a
 * child's own worker loses transfers (um__vendor_lib_load refuses). */
int um__ucx_load(void) { return um__vendor_lib_load(&ucx_lib, UM_ENOTSUP); }

int um__ucx_error(ucs_status_t st, const char *what) {
  int code;
  switch (st) {
  case UCS_OK: return UM_OK;
  case UCS_ERR_NO_MEMORY: code = UM_ENOMEM; break;
  case UCS_ERR_UNSUPPORTED: code = UM_ENOTSUP; break;
  case UCS_ERR_INVALID_PARAM:
  case UCS_ERR_INVALID_ADDR: code = UM_EINVAL; break;
  default: code = UM_EBACKEND; break;
  }
  return um__set_error(code, "%s: %s", what, um__ucx.ucs_status_string(st));
}
