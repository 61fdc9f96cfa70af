/* The manager: opens the backends, lists their devices (the host CPU is
 * always device 0), owns the descriptors of every buffer, and on destroy
 * reports and frees what the application never released. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"

static const char *const location_names[] = {"host", "device", "pinned", "unified"};

static void destroy_device(um_device *d) {
  for (int l = 0; l < UM_LOCATION_COUNT; l++)
    um__pool_destroy(&d->pools[l]);
  um__staging_free_all(d);
  pthread_mutex_destroy(&d->staging_lock);
  d->magic = 0;
  free(d);
}

/* One more device of m, described by its backend. Every device gives
 * UM_HOST: ordinary pageable host memory, accounted to it (block.c). */
static int add_device(um_manager *m, const um__backend *be, const um__bdev_desc *desc,
                      um_device **out) {
  int n = um__ndevices(m);
  um_device *d;
  if (n == UM__MAX_DEVICES)
    return um__set_error(UM_ENOMEM, "a manager holds at most %d devices", UM__MAX_DEVICES);
  if ((d = calloc(1, sizeof(*d))) == NULL)
    return um__set_error(UM_ENOMEM, "out of memory for a device");
  static atomic_uint_fast64_t serials;
  d->magic = UM__DEVICE_MAGIC;
  d->m = m;
  d->index = n;
  d->serial = um__atomic_add_relaxed(&serials, 1) + 1;
  d->be = be;
  d->bdev = desc->bdev;
  snprintf(d->info.name, sizeof(d->info.name), "%s", desc->name);
  snprintf(d->info.backend, sizeof(d->info.backend), "%s", um__backend_name(be));
  d->info.index = d->index;
  d->info.caps = desc->caps;
  d->info.locations = desc->locations | (1u << UM_HOST);
  d->info.total_bytes = desc->total_bytes;
  d->host_memory = desc->host_memory != 0;
  d->carve_locations = desc->carve_align != 0 ? desc->carve_locations : 0;
  d->carve_align = desc->carve_align;
  d->discard_locations = desc->discard_locations;
  for (int l = 0; l < UM_LOCATION_COUNT; l++)
    um__pool_init(&d->pools[l], d, (um_location)l);
  pthread_mutex_init(&d->staging_lock, NULL);
  m->devices[n] = d;
  atomic_store_explicit(&m->ndevices, n + 1, memory_order_release); /* complete before counted */
  if (out != NULL)
    *out = d;
  return UM_OK;
}

static int describe_and_add(um_manager *m, const um__backend *be, void *ctx, int i) {
  um__bdev_desc desc;
  int st;
  memset(&desc, 0, sizeof(desc)); /* fields a backend does not know stay 0 */
  if ((st = um__backend_describe(be, ctx, i, &desc)) != UM_OK)
    return st;
  return add_device(m, be, &desc, NULL);
}

static int open_backend(um_manager *m, const um__backend *be, bool required) {
  void *ctx = NULL;
  int count = 0, st;
  if (m->nbackends == UM__MAX_BACKENDS)
    return um__set_error(UM_ENOMEM, "too many backends");
  st = um__backend_open(be, &m->opts, &ctx, &count);
  if (st != UM_OK) {
    if (required)
      return st;
    um__log(&m->opts, UM_LOG_INFO, "backend %s skipped: %s (%s)", um__backend_name(be), um_last_error(),
            um_err_name(st));
    return UM_OK;
  }
  m->backends[m->nbackends].be = be;
  m->backends[m->nbackends].ctx = ctx;
  m->nbackends++;
  if (count == 0)
    um__log(&m->opts, UM_LOG_INFO, "backend %s: no devices%s%s", um__backend_name(be),
            um_last_error()[0] ? ": " : "", um_last_error());
  for (int i = 0; i < count; i++) {
    st = describe_and_add(m, be, ctx, i);
    if (st != UM_OK) {
      if (required)
        return st;
      um__log(&m->opts, UM_LOG_WARN, "backend %s: device %d skipped: %s", um__backend_name(be), i,
              um_last_error());
    }
  }
  return UM_OK;
}

static void free_manager(um_manager *m) {
  um__trace_close(m);
  /* An event never released keeps its native token (a cl_event holds its
   * context): released while the devices are still open. */
  if (um__upcall.ops.events_drop_natives != NULL)
    um__upcall.ops.events_drop_natives(m);
  /* Blocks cached by threads go back to the bins, which free them below. */
  um__tcache_manager_gone(m);
  /* Device 0 last: the other devices' UM_HOST blocks are its memory. */
  for (int i = um__ndevices(m) - 1; i >= 0; i--)
    destroy_device(m->devices[i]);
  for (int i = m->nbackends - 1; i >= 0; i--)
    um__backend_close(m->backends[i].be, m->backends[i].ctx);
  um__obs_frames_free(m);
  um__descriptors_free_all(m);
  if (um__upcall.ops.events_free_all != NULL)
    um__upcall.ops.events_free_all(m);
  pthread_mutex_destroy(&m->event_lock);
  pthread_mutex_destroy(&m->registry_lock);
  pthread_mutex_destroy(&m->peer_lock);
  pthread_mutex_destroy(&m->devices_lock);
  pthread_mutex_destroy(&m->trim_lock);
  pthread_mutex_destroy(&m->trimming);
  pthread_cond_destroy(&m->trim_cond);
  pthread_mutex_destroy(&m->tcache_lock);
  pthread_mutex_destroy(&m->bracket_lock);
  um__hist_destroy(m);
  um__obs_destroy(m);
  m->magic = 0;
  free(m);
}

int um__manager_create_ex(const um_options *opts, const um__backend *const *extra, int nextra,
                          um_manager **out) {
  um_manager *m;
  int st;
  if (out == NULL)
    return um__set_error(UM_EINVAL, "um_manager_create: NULL out");
  m = calloc(1, sizeof(*m));
  if (m == NULL)
    return um__set_error(UM_ENOMEM, "out of memory for a manager");
  m->magic = UM__MANAGER_MAGIC;
  if (opts != NULL)
    m->opts = *opts;
  else
    um_options_init(&m->opts);
  um__thread_init();
  m->fork_gen = um__process_generation();
  pthread_mutex_init(&m->event_lock, NULL);
  pthread_mutex_init(&m->registry_lock, NULL);
  pthread_mutex_init(&m->peer_lock, NULL);
  pthread_mutex_init(&m->devices_lock, NULL);
  pthread_mutex_init(&m->trim_lock, NULL);
  pthread_mutex_init(&m->trimming, NULL);
  pthread_cond_init(&m->trim_cond, NULL);
  pthread_mutex_init(&m->tcache_lock, NULL);
  pthread_mutex_init(&m->bracket_lock, NULL);
  if ((st = um__options_check(&m->opts)) != UM_OK) {
    free_manager(m);
    return st;
  }
  um__trace_open(m); /* before any thread cache: recording turns their slots off */
  if ((st = um__obs_create(m)) != UM_OK) {
    free_manager(m);
    return um__set_error(st, "out of memory for a manager");
  }

  /* Device 0 is always the host CPU, whatever the backend list says. */
  if ((st = open_backend(m, um__backends_builtin[0], true)) != UM_OK)
    goto fail;
  for (int i = 1; um__backends_builtin[i] != NULL; i++)
    if (um__backend_selected(&m->opts, um__backend_name(um__backends_builtin[i])))
      if ((st = open_backend(m, um__backends_builtin[i], false)) != UM_OK)
        goto fail;
  for (int i = 0; i < nextra; i++)
    if ((st = open_backend(m, extra[i], true)) != UM_OK)
      goto fail;
  um__clear_error();

  if (m->opts.enable_peer)
    for (int a = 0; a < um__ndevices(m); a++)
      for (int b = 0; b < um__ndevices(m); b++)
        if (a != b && um_peer_possible(m->devices[a], m->devices[b]) == 1)
          (void)um_peer_enable(m->devices[a], m->devices[b]);

  if (um__upcall.ops.engine_start != NULL && (st = um__upcall.ops.engine_start(m)) != UM_OK)
    goto fail;
  if ((st = um__trim_thread_start(m)) != UM_OK) {
    if (um__upcall.ops.engine_stop != NULL)
      um__upcall.ops.engine_stop(m);
    goto fail;
  }
  *out = m;
  return UM_OK;

fail:
  free_manager(m);
  return st;
}

int um_manager_create(const um_options *opts, um_manager **out) {
  return um__manager_create_ex(opts, NULL, 0, out);
}

int um_manager_options(const um_manager *m, um_options *out) {
  if (!um__manager_ok(m) || out == NULL)
    return um__set_error(UM_EINVAL, "um_manager_options: NULL argument or not a manager");
  *out = m->opts;
  return UM_OK;
}

/* One line per leaked buffer: what it is, where it was allocated, and who
 * else still holds it. */
static void report_leak(um_manager *m, um_buffer *b) {
  int holds = atomic_load(&b->holds), tensors = atomic_load(&b->dlpack_tensors);
  char site[256], owners[160];
  if (b->site_file != NULL)
    snprintf(site, sizeof(site), " allocated at %s:%d", b->site_file, b->site_line);
  else
    snprintf(site, sizeof(site), "%s", "");
  if (tensors > 0)
    snprintf(owners, sizeof(owners), "; held by %d DLPack tensor(s) never deleted (their deleters did not run)%s",
             tensors, holds > tensors ? " and by um_buffer_retain" : "");
  else if (holds > 0)
    snprintf(owners, sizeof(owners), "; retained %d more time(s) (um_buffer_retain)", holds);
  else
    owners[0] = '\0';
  um__log(&m->opts, UM_LOG_ERROR, "leak: buffer %p of %zu bytes (%s) on device %d (%s)%s was never released%s%s",
          (void *)b, b->size, location_names[b->loc], b->dev->index, b->dev->info.name, site, owners,
          b->site_file != NULL ? "" : " (define UNIMEM_TRACK_SITES for the allocation site)");
}

/* Report and release the live buffers (only those of um_net_alloc when
 * net_only), counting them into *leaked and *bytes. */
static void release_leaks(um_manager *m, bool net_only, int *leaked, uint64_t *bytes) {
  for (um_buffer *b = m->all_buffers; b != NULL; b = b->all_next) {
    if (atomic_load(&b->state) != UM__BUF_LIVE)
      continue;
    if (net_only && (um__upcall.net.allocated == NULL || !um__upcall.net.allocated(b)))
      continue;
    (*leaked)++;
    *bytes += b->size;
    report_leak(m, b);
    /* Every owner goes: the caller's and those um_buffer_retain added. */
    atomic_store(&b->holds, 0);
    um_release(b);
  }
}

int um_manager_destroy(um_manager *m) {
  int leaked = 0;
  uint64_t leaked_bytes = 0;
  int st;
  if (!um__manager_ok(m))
    return um__set_error(UM_EINVAL, "um_manager_destroy: NULL or not a manager");
  /* A parent's manager in a child process of fork(): its threads are gone
   * and its locks may be held; the child's copy is left as it is. */
  if ((st = um__manager_check_process(m)) != UM_OK)
    return st;
  if (um__upcall.brackets.end_all != NULL)
    um__upcall.brackets.end_all(m); /* brackets left open would never finish */
  if (um__upcall.ops.engine_drain != NULL)
    um__upcall.ops.engine_drain(m);
  if (um__upcall.ops.queues_forget != NULL)
    um__upcall.ops.queues_forget(m);
  /* Buffers of um_net_alloc first, while their net's transport is still
   * there to unmap their memory (leaks like any other). */
  release_leaks(m, true, &leaked, &leaked_bytes);
  /* Before the rest of the leak report: it releases exposed buffers, and a
   * net's staging chunks are blocks of the devices. */
  if (um__upcall.net.manager_destroy != NULL)
    um__upcall.net.manager_destroy(m);
  um__trim_thread_stop(m);
  if (um__upcall.ops.engine_stop != NULL)
    um__upcall.ops.engine_stop(m);

  release_leaks(m, false, &leaked, &leaked_bytes);
  if (leaked)
    um__log(&m->opts, UM_LOG_ERROR, "leak: %d buffer(s), %llu bytes in all, freed by um_manager_destroy",
            leaked, (unsigned long long)leaked_bytes);
  um__quarantine_flush(m);
  free_manager(m);
  if (leaked)
    return um__set_error(UM_ELEAK, "%d buffer(s) (%llu bytes) were never released", leaked,
                         (unsigned long long)leaked_bytes);
  return UM_OK;
}

/* ------------------------------------------------------------------------ */
/* Adopted devices */

/* The backend's slot of m (its per-manager state), made if m did not open
 * the backend; -1 when there is no room. */
static int backend_slot(um_manager *m, const um__backend *be) {
  for (int i = 0; i < m->nbackends; i++)
    if (m->backends[i].be == be)
      return i;
  if (m->nbackends == UM__MAX_BACKENDS)
    return -1;
  m->backends[m->nbackends].be = be;
  m->backends[m->nbackends].ctx = NULL;
  return m->nbackends++;
}

/* Peer access between d and the other devices of its backend that allow
 * it (one OpenCL context), as at create. */
static void enable_peers(um_manager *m, um_device *d) {
  if (!m->opts.enable_peer)
    return;
  for (int i = 0; i < um__ndevices(m); i++) {
    um_device *o = m->devices[i];
    if (o == d)
      continue;
    if (um_peer_possible(d, o) == 1)
      (void)um_peer_enable(d, o);
    if (um_peer_possible(o, d) == 1)
      (void)um_peer_enable(o, d);
  }
}

static int adopt(um_manager *m, const um__backend *be, void *const native[3], um_device **out) {
  um__bdev_desc desc;
  int slot, st;
  memset(&desc, 0, sizeof(desc));
  pthread_mutex_lock(&m->devices_lock);
  if ((slot = backend_slot(m, be)) < 0) {
    pthread_mutex_unlock(&m->devices_lock);
    return um__set_error(UM_ENOMEM, "too many backends");
  }
  st = um__backend_adopt(be, &m->opts, &m->backends[slot].ctx, native[0], native[1], native[2], &desc);
  if (st == UM_OK && (st = add_device(m, be, &desc, out)) == UM_OK)
    enable_peers(m, *out);
  pthread_mutex_unlock(&m->devices_lock);
  return st;
}

int um_device_adopt_opencl(um_manager *m, void *cl_context, void *cl_device, void *cl_queue,
                           um_device **out) {
  if (!um__manager_ok(m) || cl_context == NULL || cl_device == NULL || cl_queue == NULL || out == NULL)
    return um__set_error(UM_EINVAL, "um_device_adopt_opencl: NULL argument or not a manager");
  if (um__process_changed(m))
    return um__manager_check_process(m);
  void *const native[3] = {cl_context, cl_device, cl_queue};
  if (um__backend_adopts_opencl == NULL)
    return um__set_error(UM_ENOTSUP, "um_device_adopt_opencl: unimem was built without OpenCL");
  return adopt(m, um__backend_adopts_opencl, native, out);
}
