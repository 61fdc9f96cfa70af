/* Options: one table gives every option its default, its environment
 * variable (UNIMEM_ + upper-case name) and how to parse it. */
#include <ctype.h>
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base.h"

/* OPT_TRI: a boolean, or 2 ("always") for a forced mode. */
/* OPT_NS: a duration in ns, 0..UM__WAIT_SPIN_MAX_NS, in plain decimal (the
 * size suffixes k/m/g are binary multiples, which mean nothing for time). */
typedef enum { OPT_BOOL, OPT_TRI, OPT_INT, OPT_U32, OPT_NS, OPT_U64, OPT_SIZE, OPT_STRING, OPT_LEVEL } opt_type;

typedef struct option_desc {
  const char *env;
  opt_type type;
  size_t offset;
  uint64_t def; /* default for numeric options */
} option_desc;

#define OPT(env, type, field, def) {env, type, offsetof(um_options, field), (uint64_t)(def)}
#define MiB (1024ull * 1024ull)
#define GiB (1024ull * MiB)

/* Defaults: the seeds' pool holds up to 4 GB and trims every 5 minutes; we
 * keep the timer and cap the pool at 2 GiB so that a test machine with
 * 24 GiB is never crowded by idle blocks. 4 concurrent transfers keeps two
 * copy engines per direction busy on current GPUs; 4 MiB staging chunks are
 * large enough that per-chunk overhead is small at PCIe 4 speeds. A network
 * step (at most 16 MiB between two flushes) takes a small fraction of the
 * 10 s net timeout on the slowest transport here (docs/design.md,
 * Decisions: "Net steps of 16 MiB"), which still finds a dead peer in
 * seconds.
 * Waits sleep at once by default (wait_spin_ns 0): spinning is the caller's
 * choice of latency over CPU time, as CUDA's cudaDeviceScheduleSpin is. */
static const option_desc option_table[] = {
    OPT("UNIMEM_ENABLE_POOLING", OPT_BOOL, enable_pooling, 1),
    OPT("UNIMEM_MAX_POOL_BYTES", OPT_U64, max_pool_bytes, 2 * GiB),
    OPT("UNIMEM_MAX_POOL_BYTES_PER_CLASS", OPT_U64, max_pool_bytes_per_class, 1 * GiB),
    OPT("UNIMEM_TRIM_INTERVAL_MS", OPT_U32, trim_interval_ms, 300000),
    OPT("UNIMEM_MAX_CONCURRENT_TRANSFERS", OPT_INT, max_concurrent_transfers, 4),
    OPT("UNIMEM_USE_PINNED_STAGING", OPT_TRI, use_pinned_staging, 1),
    OPT("UNIMEM_STAGING_CHUNK_BYTES", OPT_SIZE, staging_chunk_bytes, 4 * MiB),
    OPT("UNIMEM_PINNED_POOL_BYTES", OPT_U64, pinned_pool_bytes, 64 * MiB),
    OPT("UNIMEM_ENABLE_PEER", OPT_BOOL, enable_peer, 1),
    OPT("UNIMEM_TRIM_ON_PRESSURE", OPT_BOOL, trim_on_pressure, 1),
    OPT("UNIMEM_SCRUB", OPT_BOOL, scrub, 0),
    OPT("UNIMEM_DEBUG", OPT_BOOL, debug, 0),
    OPT("UNIMEM_HUGE_PAGES", OPT_BOOL, huge_pages, 1),
    OPT("UNIMEM_DEVICE_LIMIT_BYTES", OPT_U64, device_limit_bytes, 0),
    OPT("UNIMEM_NET_TIMEOUT_MS", OPT_U32, net_timeout_ms, 10000),
    OPT("UNIMEM_WAIT_SPIN_NS", OPT_NS, wait_spin_ns, 0),
    OPT("UNIMEM_BACKENDS", OPT_STRING, backends, sizeof(((um_options *)0)->backends)),
    OPT("UNIMEM_LOG_LEVEL", OPT_LEVEL, log_level, UM_LOG_WARN),
    OPT("UNIMEM_SEGMENTS", OPT_BOOL, segments, 1),
    OPT("UNIMEM_OOM_SNAPSHOT", OPT_STRING, oom_snapshot, sizeof(((um_options *)0)->oom_snapshot)),
    OPT("UNIMEM_BACKTRACES", OPT_BOOL, backtraces, 0),
};

/* "123", "64k", "4m", "2g" (powers of 1024). */
static int parse_u64(const char *s, uint64_t *out) {
  char *end;
  unsigned long long v;
  uint64_t mul = 1;
  while (isspace((unsigned char)*s))
    s++;
  if (*s == '-' || *s == '\0')
    return -1;
  errno = 0;
  v = strtoull(s, &end, 0);
  if (errno != 0 || end == s)
    return -1;
  switch (tolower((unsigned char)*end)) {
  case 'k': mul = 1024ull; end++; break;
  case 'm': mul = MiB; end++; break;
  case 'g': mul = GiB; end++; break;
  case 't': mul = 1024ull * GiB; end++; break;
  default: break;
  }
  if (*end == 'b' || *end == 'B')
    end++;
  if (*end != '\0' || (v != 0 && mul > UINT64_MAX / v))
    return -1;
  *out = (uint64_t)v * mul;
  return 0;
}

static int parse_bool(const char *s, uint64_t *out) {
  if (!strcasecmp(s, "1") || !strcasecmp(s, "true") || !strcasecmp(s, "on") || !strcasecmp(s, "yes")) {
    *out = 1;
    return 0;
  }
  if (!strcasecmp(s, "0") || !strcasecmp(s, "false") || !strcasecmp(s, "off") || !strcasecmp(s, "no")) {
    *out = 0;
    return 0;
  }
  return -1;
}

static int parse_ns(const char *s, uint64_t *out) {
  char *end;
  unsigned long long v;
  while (isspace((unsigned char)*s))
    s++;
  if (!isdigit((unsigned char)*s))
    return -1;
  errno = 0;
  v = strtoull(s, &end, 10);
  if (errno != 0 || *end != '\0' || v > UM__WAIT_SPIN_MAX_NS)
    return -1;
  *out = v;
  return 0;
}

static int parse_level(const char *s, uint64_t *out) {
  static const char *const names[] = {"error", "warn", "info", "debug"};
  for (uint64_t i = 0; i < 4; i++)
    if (!strcasecmp(s, names[i])) {
      *out = i;
      return 0;
    }
  if (parse_u64(s, out) == 0 && *out <= UM_LOG_DEBUG)
    return 0;
  return -1;
}

static void store(um_options *o, const option_desc *d, uint64_t v) {
  char *p = (char *)o + d->offset;
  switch (d->type) {
  case OPT_BOOL:
  case OPT_TRI:
  case OPT_INT: *(int *)p = (int)v; break;
  case OPT_U32:
  case OPT_NS: *(uint32_t *)p = (uint32_t)v; break;
  case OPT_U64: *(uint64_t *)p = v; break;
  case OPT_SIZE: *(size_t *)p = (size_t)v; break;
  case OPT_LEVEL: *(um_log_level *)p = (um_log_level)v; break;
  case OPT_STRING: break;
  }
}

void um_options_init(um_options *o) {
  if (o == NULL)
    return;
  memset(o, 0, sizeof(*o));
  for (size_t i = 0; i < sizeof(option_table) / sizeof(option_table[0]); i++)
    store(o, &option_table[i], option_table[i].def);

  for (size_t i = 0; i < sizeof(option_table) / sizeof(option_table[0]); i++) {
    const option_desc *d = &option_table[i];
    const char *s = getenv(d->env);
    uint64_t v = 0;
    int rc = 0;
    if (s == NULL)
      continue;
    switch (d->type) {
    case OPT_BOOL: rc = parse_bool(s, &v); break;
    case OPT_TRI:
      rc = parse_bool(s, &v);
      if (rc != 0 && (!strcasecmp(s, "2") || !strcasecmp(s, "always"))) {
        v = 2;
        rc = 0;
      }
      break;
    case OPT_LEVEL: rc = parse_level(s, &v); break;
    case OPT_STRING: /* def: the field's size */
      if (strlen(s) >= d->def)
        rc = -1;
      else
        snprintf((char *)o + d->offset, (size_t)d->def, "%s", s);
      break;
    case OPT_INT:
      rc = parse_u64(s, &v);
      if (rc == 0 && v > 1024)
        rc = -1;
      break;
    case OPT_U32:
      rc = parse_u64(s, &v);
      if (rc == 0 && v > UINT32_MAX)
        rc = -1;
      break;
    case OPT_NS: rc = parse_ns(s, &v); break;
    default: rc = parse_u64(s, &v); break;
    }
    if (rc != 0) {
      fprintf(stderr, "unimem warn: ignoring %s=\"%s\": not a valid value\n", d->env, s);
      continue;
    }
    if (d->type != OPT_STRING)
      store(o, d, v);
  }
}

int um__options_check(const um_options *o) {
  if (o->max_concurrent_transfers < 1 || o->max_concurrent_transfers > 1024)
    return um__set_error(UM_EINVAL, "max_concurrent_transfers must be 1..1024 (is %d)",
                         o->max_concurrent_transfers);
  if (o->staging_chunk_bytes < 4096)
    return um__set_error(UM_EINVAL, "staging_chunk_bytes must be at least 4096 (is %zu)",
                         o->staging_chunk_bytes);
  if (o->use_pinned_staging < 0 || o->use_pinned_staging > 2)
    return um__set_error(UM_EINVAL, "use_pinned_staging must be 0, 1 or 2 (is %d)", o->use_pinned_staging);
  if (o->net_timeout_ms < 1)
    return um__set_error(UM_EINVAL, "net_timeout_ms must be at least 1");
  if (o->wait_spin_ns > UM__WAIT_SPIN_MAX_NS)
    return um__set_error(UM_EINVAL, "wait_spin_ns must be at most %u (1 s) (is %u)",
                         (unsigned)UM__WAIT_SPIN_MAX_NS, (unsigned)o->wait_spin_ns);
  if ((unsigned)o->log_level > UM_LOG_DEBUG)
    return um__set_error(UM_EINVAL, "log_level out of range");
  if (memchr(o->backends, '\0', sizeof(o->backends)) == NULL)
    return um__set_error(UM_EINVAL, "backends is not NUL-terminated");
  if (memchr(o->oom_snapshot, '\0', sizeof(o->oom_snapshot)) == NULL)
    return um__set_error(UM_EINVAL, "oom_snapshot is not NUL-terminated");
  return UM_OK;
}

/* Whether name appears in the comma list (an empty list selects all). */
bool um__backend_selected(const um_options *o, const char *name) {
  const char *p = o->backends;
  size_t n = strlen(name);
  if (*p == '\0')
    return true;
  while (*p != '\0') {
    const char *end = strchr(p, ',');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    while (len > 0 && isspace((unsigned char)*p)) {
      p++;
      len--;
    }
    while (len > 0 && isspace((unsigned char)p[len - 1]))
      len--;
    if (len == n && strncasecmp(p, name, n) == 0)
      return true;
    if (end == NULL)
      break;
    p = end + 1;
  }
  return false;
}
