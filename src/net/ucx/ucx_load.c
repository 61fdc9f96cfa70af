/* Loading libucp.so.0 at run time (the OpenCL and CUDA backends' pattern):
 * unimem neither links against UCX nor needs it installed; um_net_create
 * answers UM_ENOTSUP where it is missing. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "net.h"
#include "ucx_api.h"

#define UCX_DEFAULT_LIBRARY "libucp.so.0"
#define UCX_LIBRARY_ENV "UNIMEM_UCX_LIBRARY"

um__ucx_lib um__ucx;

static struct {
  pthread_once_t once;
  void *library;
  int status;         /* UM_OK or UM_ENOTSUP */
  char failure[384];  /* why, when status != UM_OK */
  unsigned generation; /* um__process_generation() at load */
} ucx_load_state = {PTHREAD_ONCE_INIT, NULL, UM_ENOTSUP, "", 0};

/* dlsym returns an object pointer; POSIX guarantees that it converts to
 * the function pointer it really is. */
_Static_assert(sizeof(void *) == sizeof(void (*)(void)), "dlsym results must fit a function pointer");

static int ucx_symbol(const char *name, void *fn_slot) {
  void *symbol = dlsym(ucx_load_state.library, name);
  if (symbol == NULL)
    return -1;
  memcpy(fn_slot, &symbol, sizeof(symbol));
  return 0;
}

/* Runs once per process. The library stays loaded: UCX keeps threads and
 * memory hooks that do not survive dlclose. */
static void ucx_load_once(void) {
  const char *path = getenv(UCX_LIBRARY_ENV);
  if (path == NULL || path[0] == '\0')
    path = UCX_DEFAULT_LIBRARY;
  ucx_load_state.library = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (ucx_load_state.library == NULL) {
    const char *reason = dlerror();
    snprintf(ucx_load_state.failure, sizeof(ucx_load_state.failure), "%s",
             reason != NULL ? reason : path);
    return;
  }
#define UCX_LOAD_ENTRY_(ret, name, params)                                     \
  if (ucx_symbol(#name, (void *)&um__ucx.name) != 0) {                         \
    snprintf(ucx_load_state.failure, sizeof(ucx_load_state.failure),           \
             "%s missing in %s", #name, path);                                 \
    goto fail;                                                                 \
  }
  UCX_ENTRY_POINTS(UCX_LOAD_ENTRY_)
#undef UCX_LOAD_ENTRY_
  ucx_load_state.generation = um__process_generation();
  ucx_load_state.status = UM_OK;
  return;

fail:
  /* Not the library we need: nothing of it was used, so it may go. */
  memset(&um__ucx, 0, sizeof(um__ucx));
  dlclose(ucx_load_state.library);
  ucx_load_state.library = NULL;
}

int um__ucx_load(void) {
  pthread_once(&ucx_load_state.once, ucx_load_once);
  if (ucx_load_state.status != UM_OK)
    return um__set_error(UM_ENOTSUP, "UCX is not available: %s (set %s to libucp's path)",
                         ucx_load_state.failure, UCX_LIBRARY_ENV);
  /* UCX does not survive fork() in the child: its async thread, its
   * connections' sockets and shared-memory segments stay the parent's, and
   * a child's own worker loses transfers. */
  if (ucx_load_state.generation != um__process_generation())
    return um__set_error(UM_ENOTSUP, "UCX was loaded before fork() (by an ancestor process); it cannot be "
                                     "used in a child process: fork before the first um_net_create, or "
                                     "exec");
  return UM_OK;
}

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
