/* The cpu backend: device 0, always present. Every location is host memory,
 * so every block has a host view and the core moves its data with memcpy;
 * xfer() exists for completeness of the contract and for the rare caller
 * that hands it a block by handle.
 *
 * PINNED is page-locked with mlock(): when RLIMIT_MEMLOCK refuses, the
 * allocation fails with UM_ENOMEM and says so (the core then trims idle
 * pinned blocks, which unlocks their pages, and retries once). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include "backend.h"

/* Blocks from 1 MiB up come straight from mmap: they are page-aligned, can
 * take huge pages, and return to the system at once when freed, which is
 * what a pool trim promises. Smaller blocks come from malloc. */
#define CPU_MMAP_THRESHOLD (1u << 20)
#define CPU_HUGE_PAGE (2u << 20)

typedef struct cpu_device {
  const um_options *opts;
  char name[128];
  uint64_t total;
} cpu_device;

static void read_cpu_name(char *out, size_t cap) {
  FILE *f = fopen("/proc/cpuinfo", "r");
  char line[256];
  snprintf(out, cap, "host CPU");
  if (f == NULL)
    return;
  while (fgets(line, sizeof(line), f)) {
    if (strncmp(line, "model name", 10) == 0) {
      char *p = strchr(line, ':');
      if (p) {
        p++;
        while (*p == ' ')
          p++;
        p[strcspn(p, "\n")] = '\0';
        snprintf(out, cap, "%s", p);
      }
      break;
    }
  }
  fclose(f);
}

static int cpu_open(const um_options *opts, void **ctx, int *count) {
  cpu_device *d = calloc(1, sizeof(*d));
  if (d == NULL)
    return um__set_error(UM_ENOMEM, "cpu backend: out of memory");
  d->opts = opts;
  read_cpu_name(d->name, sizeof(d->name));
  d->total = (uint64_t)sysconf(_SC_PHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE);
  *ctx = d;
  *count = 1;
  return UM_OK;
}

static int cpu_describe(void *ctx, int i, um__bdev_desc *out) {
  cpu_device *d = ctx;
  (void)i;
  memset(out, 0, sizeof(*out));
  snprintf(out->name, sizeof(out->name), "%s", d->name);
  out->caps = UM_CAP_PINNED | UM_CAP_UNIFIED | UM_CAP_ASYNC;
  out->locations = (1u << UM_HOST) | (1u << UM_DEVICE) | (1u << UM_PINNED) | (1u << UM_UNIFIED);
  out->carve_locations = (1u << UM_HOST) | (1u << UM_DEVICE) | (1u << UM_UNIFIED);
  out->carve_align = 64; /* a cache line, as aligned_alloc's blocks */
  out->discard_locations = out->carve_locations;
  out->total_bytes = d->total;
  out->bdev = d;
  return UM_OK;
}

static void cpu_close(void *ctx) { free(ctx); }

static size_t round_to_page(size_t bytes) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  return (bytes + page - 1) & ~(page - 1);
}

/* mmap aligned to 2 MiB when huge pages are wanted: transparent huge pages
 * only back 2 MiB-aligned ranges, so we over-map and cut the edges. */
static void *map_anonymous(size_t bytes, bool huge) {
  size_t len = round_to_page(bytes);
  if (huge && len >= CPU_HUGE_PAGE) {
    size_t span = len + CPU_HUGE_PAGE;
    char *raw = um__os_mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    char *aligned;
    if (raw == MAP_FAILED)
      return NULL;
    aligned = (char *)(((uintptr_t)raw + CPU_HUGE_PAGE - 1) & ~(uintptr_t)(CPU_HUGE_PAGE - 1));
    if (aligned > raw)
      um__os_munmap(raw, (size_t)(aligned - raw));
    if (raw + span > aligned + len)
      um__os_munmap(aligned + len, (size_t)(raw + span - (aligned + len)));
#ifdef MADV_HUGEPAGE
    um__os_madvise(aligned, len, MADV_HUGEPAGE);
#endif
    return aligned;
  }
  void *p = um__os_mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? NULL : p;
}

static int cpu_mem_alloc(void *bdev, um_location loc, size_t bytes, um__mem *out) {
  cpu_device *d = bdev;
  void *p;
  if (loc == UM_PINNED) {
    /* Page-locked memory must be whole pages we own: always mmap. */
    p = map_anonymous(bytes, false);
    if (p == NULL)
      return um__set_error(UM_ENOMEM, "cpu: mmap of %zu pinned bytes: %s", bytes, strerror(errno));
    if (um__pagelock_acquire(p, round_to_page(bytes), 1) != UM_OK) {
      struct rlimit rl;
      getrlimit(RLIMIT_MEMLOCK, &rl);
      um__os_munmap(p, round_to_page(bytes));
      return um__set_error(UM_ENOMEM, "cpu: pinning %zu bytes: %s (RLIMIT_MEMLOCK %llu bytes)",
                           bytes, um_last_error(), (unsigned long long)rl.rlim_cur);
    }
  } else if (bytes >= CPU_MMAP_THRESHOLD) {
    p = map_anonymous(bytes, d->opts->huge_pages != 0);
    if (p == NULL)
      return um__set_error(UM_ENOMEM, "cpu: mmap of %zu bytes: %s", bytes, strerror(errno));
  } else {
    /* 64-byte alignment: a cache line, and what vector copies want. */
    p = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    if (p == NULL)
      return um__set_error(UM_ENOMEM, "cpu: out of memory for %zu bytes", bytes);
  }
  out->host = p;
  out->handle = (uintptr_t)p;
  out->priv = NULL;
  return UM_OK;
}

static void cpu_mem_free(void *bdev, um_location loc, size_t bytes, um__mem *mem) {
  (void)bdev;
  if (loc == UM_PINNED) {
    um__pagelock_release(mem->host, round_to_page(bytes));
    um__os_munmap(mem->host, round_to_page(bytes));
  } else if (bytes >= CPU_MMAP_THRESHOLD) {
    um__os_munmap(mem->host, round_to_page(bytes));
  } else {
    free(mem->host);
  }
  mem->host = NULL;
}

/* Host memory of every location but PINNED (whose segments would count
 * page-locked bytes that no block uses against RLIMIT_MEMLOCK) is carved by
 * moving the pointer. */
static int cpu_mem_carve(void *bdev, um_location loc, const um__mem *seg, size_t off, size_t bytes, um__mem *out) {
  (void)bdev;
  (void)bytes;
  if (loc == UM_PINNED)
    return um__set_error(UM_ENOTSUP, "cpu: pinned memory is not carved");
  out->host = (char *)seg->host + off;
  out->handle = (uintptr_t)out->host;
  out->priv = NULL;
  return UM_OK;
}

static void cpu_mem_uncarve(void *bdev, um_location loc, um__mem *mem) {
  (void)bdev;
  (void)loc;
  mem->host = NULL;
  mem->handle = 0;
}

static void cpu_mem_discard(void *bdev, um_location loc, const um__mem *seg, size_t off, size_t len) {
  (void)bdev;
  (void)loc;
  /* Anonymous private memory: the pages go back and fault in as zeros. A
   * refusal leaves them resident, which costs memory and nothing else. */
  (void)um__os_madvise((char *)seg->host + off, len, MADV_DONTNEED);
}

static int cpu_host_register(void *bdev, void *host, size_t bytes, um__mem *out) {
  (void)bdev;
  if (um__pagelock_acquire(host, bytes, 0) != UM_OK)
    return um__set_error(UM_ENOMEM, "cpu: pinning %zu wrapped bytes: %s", bytes, um_last_error());
  out->host = host;
  out->handle = (uintptr_t)host;
  out->priv = (void *)(uintptr_t)bytes;
  return UM_OK;
}

static void cpu_host_unregister(void *bdev, um__mem *mem) {
  (void)bdev;
  um__pagelock_release(mem->host, (size_t)(uintptr_t)mem->priv);
}

static int cpu_memory(void *bdev, uint64_t *free_bytes, uint64_t *total_bytes) {
  cpu_device *d = bdev;
  FILE *f = fopen("/proc/meminfo", "r");
  char line[256];
  uint64_t avail = 0;
  bool found = false;
  if (f != NULL) {
    while (fgets(line, sizeof(line), f)) {
      unsigned long long kb;
      if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) {
        avail = (uint64_t)kb * 1024u;
        found = true;
        break;
      }
    }
    fclose(f);
  }
  if (!found) {
    struct sysinfo si;
    if (sysinfo(&si) != 0)
      return um__set_error(UM_EBACKEND, "cpu: sysinfo: %s", strerror(errno));
    avail = (uint64_t)si.freeram * si.mem_unit;
  }
  *free_bytes = avail;
  *total_bytes = d->total;
  return UM_OK;
}

static int cpu_synchronize(void *bdev) {
  (void)bdev; /* host work is synchronous: nothing is queued here */
  return UM_OK;
}

static int cpu_xfer(void *bdev, const um__xfer *x) {
  (void)bdev;
  switch (x->kind) {
  case UM__XFER_H2D:
    memcpy((char *)x->dst->host + x->dst_off, x->host, x->bytes);
    return UM_OK;
  case UM__XFER_D2H:
    memcpy(x->host, (const char *)x->src->host + x->src_off, x->bytes);
    return UM_OK;
  case UM__XFER_D2D:
    memmove((char *)x->dst->host + x->dst_off, (const char *)x->src->host + x->src_off, x->bytes);
    return UM_OK;
  case UM__XFER_FILL:
    memset((char *)x->dst->host + x->dst_off, x->value, x->bytes);
    return UM_OK;
  case UM__XFER_PEER:
  case UM__XFER_MARKER:
  case UM__XFER_QUEUE_MARK:
    break;
  }
  return um__set_error(UM_ENOTSUP, "cpu: transfer kind %d not supported", (int)x->kind);
}

const um__backend um__backend_cpu = {
    .name = "cpu", .open = cpu_open, .describe = cpu_describe, .close = cpu_close,
    .memory = cpu_memory, .synchronize = cpu_synchronize,
    .mem_alloc = cpu_mem_alloc, .mem_free = cpu_mem_free, .mem_carve = cpu_mem_carve, .mem_uncarve = cpu_mem_uncarve,
    .mem_discard = cpu_mem_discard,
    .host_register = cpu_host_register, .host_unregister = cpu_host_unregister,
    .xfer = cpu_xfer, /* each transfer runs to completion on the calling thread */
};
