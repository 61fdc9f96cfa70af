/* The UCX library (libucp.so.0), loaded at run time: its entry points and
 * the one translation of its status codes. Included by the UCX files only
 * (net_ucx_lib.c, net_ucx.c); the rest of unimem never sees a UCX header.
 *
 * <ucp/api/ucp.h> gives the types, constants and inline helpers
 * (ucp_dt_make_contig, UCS_PTR_*); every call goes through um__ucx. */
#ifndef UNIMEM_NET_UCX_LIB_H
#define UNIMEM_NET_UCX_LIB_H

#ifndef UM__SEES_NET_UCX
#error "ucx_api.h: this folder may not include it (src/README.md)"
#endif

#include <ucp/api/ucp.h>

/* XX(return type, name, parameter list). All are needed: a library without
 * one of them is refused (UM_ENOTSUP). ucp_init is an inline wrapper of
 * ucp_init_version in the header, so the latter is what is looked up;
 * ucs_status_string lives in libucs, a dependency of libucp that dlsym
 * searches through libucp's handle. */
#define UCX_ENTRY_POINTS(XX)                                                   \
  XX(ucs_status_t, ucp_config_read, (const char *, const char *, ucp_config_t **)) \
  XX(void, ucp_config_release, (ucp_config_t *))                               \
  XX(ucs_status_t, ucp_init_version,                                           \
     (unsigned, unsigned, const ucp_params_t *, const ucp_config_t *, ucp_context_h *)) \
  XX(void, ucp_cleanup, (ucp_context_h))                                       \
  XX(ucs_status_t, ucp_worker_create,                                          \
     (ucp_context_h, const ucp_worker_params_t *, ucp_worker_h *))             \
  XX(void, ucp_worker_destroy, (ucp_worker_h))                                 \
  XX(ucs_status_t, ucp_worker_get_address, (ucp_worker_h, ucp_address_t **, size_t *)) \
  XX(void, ucp_worker_release_address, (ucp_worker_h, ucp_address_t *))        \
  XX(unsigned, ucp_worker_progress, (ucp_worker_h))                            \
  XX(ucs_status_t, ucp_worker_get_efd, (ucp_worker_h, int *))                  \
  XX(ucs_status_t, ucp_worker_arm, (ucp_worker_h))                             \
  XX(ucs_status_t, ucp_worker_signal, (ucp_worker_h))                          \
  XX(ucs_status_t, ucp_ep_create, (ucp_worker_h, const ucp_ep_params_t *, ucp_ep_h *)) \
  XX(ucs_status_ptr_t, ucp_ep_close_nbx, (ucp_ep_h, const ucp_request_param_t *)) \
  XX(ucs_status_ptr_t, ucp_ep_flush_nbx, (ucp_ep_h, const ucp_request_param_t *)) \
  XX(ucs_status_t, ucp_mem_map, (ucp_context_h, const ucp_mem_map_params_t *, ucp_mem_h *)) \
  XX(ucs_status_t, ucp_mem_unmap, (ucp_context_h, ucp_mem_h))                  \
  XX(ucs_status_t, ucp_mem_query, (const ucp_mem_h, ucp_mem_attr_t *))         \
  XX(ucs_status_t, ucp_rkey_pack, (ucp_context_h, ucp_mem_h, void **, size_t *)) \
  XX(void, ucp_rkey_buffer_release, (void *))                                  \
  XX(ucs_status_t, ucp_ep_rkey_unpack, (ucp_ep_h, const void *, ucp_rkey_h *)) \
  XX(void, ucp_rkey_destroy, (ucp_rkey_h))                                     \
  XX(ucs_status_ptr_t, ucp_put_nbx,                                            \
     (ucp_ep_h, const void *, size_t, uint64_t, ucp_rkey_h, const ucp_request_param_t *)) \
  XX(ucs_status_ptr_t, ucp_get_nbx,                                            \
     (ucp_ep_h, void *, size_t, uint64_t, ucp_rkey_h, const ucp_request_param_t *)) \
  XX(ucs_status_ptr_t, ucp_atomic_op_nbx,                                      \
     (ucp_ep_h, ucp_atomic_op_t, const void *, size_t, uint64_t, ucp_rkey_h,   \
      const ucp_request_param_t *))                                            \
  XX(void, ucp_request_free, (void *))                                         \
  XX(const char *, ucp_get_version_string, (void))                             \
  XX(const char *, ucs_status_string, (ucs_status_t))

/* The loaded library: filled once by um__ucx_load(), read-only afterwards. */
typedef struct um__ucx_lib {
#define UCX_ENTRY_MEMBER_(ret, name, params) ret(*name) params;
  UCX_ENTRY_POINTS(UCX_ENTRY_MEMBER_)
#undef UCX_ENTRY_MEMBER_
} um__ucx_lib;

extern um__ucx_lib um__ucx;

/* Load libucp (UNIMEM_UCX_LIBRARY overrides the path), once per process.
 * Returns UM_OK, or UM_ENOTSUP with the reason in um_last_error(). */
int um__ucx_load(void);

/* The one translation of a UCX status into a UM_E* code, keeping UCX's own
 * text (ucs_status_string) after `what` for um_last_error(). */
int um__ucx_error(ucs_status_t st, const char *what);

#endif /* UNIMEM_NET_UCX_LIB_H */
