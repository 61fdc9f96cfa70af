/* A vendor library loaded at run time (OpenCL's ICD loader, libcuda,
 * libucp): unimem neither links against it nor needs it installed. One
 * load per process, kept for the process: vendor libraries keep threads and
 * atexit handlers that do not survive dlclose. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include "base.h"

/* dlsym answers an object pointer; C11 has no conversion from it to a
 * function pointer, POSIX guarantees their representations agree, so the
 * table's slots are filled by copying the representation. */
_Static_assert(sizeof(void *) == sizeof(void (*)(void)), "dlsym results must fit a function pointer");

static void vendor_open(um__vendor_lib *lib) {
  const char *env = lib->env != NULL ? getenv(lib->env) : NULL;
  const char *dl_text = NULL;
  if (env != NULL && env[0] != '\0') {
    snprintf(lib->path, sizeof(lib->path), "%s", env);
    lib->handle = dlopen(lib->path, RTLD_NOW | RTLD_LOCAL);
    dl_text = lib->handle == NULL ? dlerror() : NULL;
  } else {
    for (const char *const *name = lib->names; *name != NULL && lib->handle == NULL; name++) {
      snprintf(lib->path, sizeof(lib->path), "%s", *name);
      lib->handle = dlopen(lib->path, RTLD_NOW | RTLD_LOCAL);
      dl_text = lib->handle == NULL ? dlerror() : NULL;
    }
  }
  if (lib->handle != NULL)
    return;
  if (dl_text == NULL)
    dl_text = "unknown dlopen error";
  /* glibc's text starts with the path already; say it once. */
  if (strstr(dl_text, lib->path) != NULL)
    snprintf(lib->failure, sizeof(lib->failure), "%s (%s names the library to load)", dl_text,
             lib->env);
  else
    snprintf(lib->failure, sizeof(lib->failure), "%s: %s (%s names the library to load)", lib->path,
             dl_text, lib->env);
}

/* Fill the table; 0, or -1 with the first missing required entry named. */
static int vendor_resolve(um__vendor_lib *lib) {
  for (size_t i = 0; i < lib->nentries; i++) {
    const um__vendor_entry *e = &lib->entries[i];
    void *address = dlsym(lib->handle, e->symbol);
    if (address == NULL && e->required) {
      snprintf(lib->failure, sizeof(lib->failure), "entry point %s missing from %s", e->symbol, lib->path);
      return -1;
    }
    if (address != NULL)
      memcpy((char *)lib->table + e->offset, &address, sizeof(address));
  }
  return 0;
}

static void vendor_load(um__vendor_lib *lib) {
  lib->generation = um__process_generation();
  vendor_open(lib);
  if (lib->handle == NULL)
    return;
  if (vendor_resolve(lib) != 0 || (lib->after != NULL && lib->after(lib) != 0)) {
    /* Not the library we need: nothing of it is used, so it may go. */
    memset(lib->table, 0, lib->table_size);
    dlclose(lib->handle);
    lib->handle = NULL;
    return;
  }
  lib->loaded = true;
}

int um__vendor_lib_load(um__vendor_lib *lib, int code) {
  if (!atomic_load_explicit(&lib->done, memory_order_acquire)) {
    pthread_mutex_lock(&lib->lock);
    if (!atomic_load_explicit(&lib->done, memory_order_relaxed)) {
      vendor_load(lib);
      atomic_store_explicit(&lib->done, true, memory_order_release);
    }
    pthread_mutex_unlock(&lib->lock);
  }
  if (!lib->loaded)
    return um__set_error(code, "%s: %s", lib->what, lib->failure);
  /* Vendor libraries do not survive fork() in the child: their threads,
   * sockets and driver state stay the parent's. */
  if (lib->generation != um__process_generation())
    return um__set_error(code,
                         "%s: %s was loaded before fork() (by an ancestor process); it cannot be used in a "
                         "child process: fork before its first use, or exec",
                         lib->what, lib->path);
  return UM_OK;
}
