/* unimem stats: a scripted workload, then the statistics table. The table's
 * rows come from UM_STATS_FIELDS, so they are the struct's fields and the
 * JSON's keys, in the same order. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tool.h"
#include "unimem.h"

#define KiB ((size_t)1024)
#define MiB (1024 * KiB)
#define ROUNDS 16
#define BATCH 100

const char tool_stats_help[] =
    "NAME\n"
    "    unimem stats - run a known workload and print unimem's statistics\n"
    "\n"
    "SYNOPSIS\n"
    "    unimem stats [--device N] [--json FILE] [--history FILE]\n"
    "\n"
    "DESCRIPTION\n"
    "    Creates a manager (options from the UNIMEM_* environment), runs the\n"
    "    workload below on every device (or on device N), and prints one row per\n"
    "    um_stats field (the UM_STATS_FIELDS list of unimem.h) with one column per\n"
    "    device and one for all devices together. The figures are taken while the\n"
    "    two buffers of step 2 are still live and the pool still holds its idle\n"
    "    blocks; afterwards everything is released and the manager destroyed.\n"
    "\n"
    "    Workload, per device, in this order:\n"
    "    1. 16 rounds of: allocate 4 KiB, 64 KiB, 1 MiB and 10 MiB (UM_DEVICE),\n"
    "       release all four. Round 1 misses the pool four times, rounds 2-16 hit\n"
    "       it 60 times (hit rate 0.9375 when nothing else ran).\n"
    "    2. Two 1 MiB device buffers A and B: copy 1 MiB host -> A, A -> B,\n"
    "       B -> host, and fill A; all blocking.\n"
    "    3. um_copy_batch of 100 copies of 4 KiB from the host into A.\n"
    "    4. um_map of A (read-write), a write, um_unmap.\n"
    "    5. Where the device offers UM_PINNED: a 1 MiB pinned buffer, released.\n"
    "    6. A 256 KiB UM_ALLOC_UNPOOLED buffer, released (one device allocation\n"
    "       and one device free).\n"
    "    7. um_stream of an 8 MiB host buffer through the device in 1 MiB chunks.\n"
    "    Every copy is checked; a wrong byte makes the command fail. Steps 1, 2, 3\n"
    "    and 7 run under the tags churn, copies, batch and stream (um_tag_push):\n"
    "    a second table gives each tag's statistics over all devices (the buffers\n"
    "    of steps 4-6 count for the untagged).\n"
    "\n"
    "OPTIONS\n"
    "    --device N     run the workload on device N only (0 is the host CPU).\n"
    "    --json FILE    also write the figures as JSON to FILE (\"-\": standard\n"
    "                   output, instead of the table): {\"devices\": [{\"index\",\n"
    "                   \"backend\", \"name\", \"stats\": {...}}], \"all\": {...}}.\n"
    "    --history FILE record the workload (um_history_start) and write the\n"
    "                   history to FILE (um_history_write: Chrome trace-event\n"
    "                   JSON, for ui.perfetto.dev or `unimem view FILE`).\n"
    "    -h, --help     this text.\n"
    "\n"
    "ENVIRONMENT\n"
    "    UNIMEM_*       every um_options field (UNIMEM_BACKENDS=cpu,opencl chooses\n"
    "                   the backends, UNIMEM_ENABLE_POOLING=0 shows the workload\n"
    "                   without the pool).\n"
    "\n"
    "EXIT STATUS\n"
    "    0  the workload ran and its data checked; 1 a step failed (the message says\n"
    "    which, with unimem's error); 2 bad usage.\n";

typedef struct workload {
  um_manager *m;
  um_device *dev;
  unsigned char *host; /* 8 MiB pattern */
  unsigned char *back;
  um_buffer *a, *b;   /* kept live until the figures are taken */
  uint64_t streamed;
} workload;

static int fail_step(const char *step, int st, const um_device *d) {
  um_device_info info;
  um_device_info_get(d, &info);
  fprintf(stderr, "unimem stats: device %d (%s): %s: %s (%s)\n", info.index, info.backend, step, um_err_name(st),
          um_last_error());
  return 1;
}

#define CHECK(step, call)                                                      \
  do {                                                                         \
    int st_ = (call);                                                          \
    if (st_ != UM_OK)                                                          \
      return fail_step(step, st_, w->dev);                                     \
  } while (0)

static int count_chunk(void *user, um_buffer *chunk, size_t offset, size_t bytes) {
  workload *w = user;
  unsigned char first = 0;
  int st = um_copy_to_host(chunk, 0, &first, 1, NULL);
  if (st != UM_OK)
    return st;
  if (first != w->host[offset])
    return UM_EBACKEND;
  w->streamed += bytes;
  return 0;
}

static int run_workload(workload *w) {
  static const size_t sizes[] = {4 * KiB, 64 * KiB, 1 * MiB, 10 * MiB};
  um_device_info info;
  um_copy_op ops[BATCH];
  um_buffer *bufs[4], *tmp = NULL, *src = NULL;
  void *view = NULL;

  um_device_info_get(w->dev, &info);
  /* 1 */
  CHECK("tag", um_tag_push(w->m, "churn"));
  for (int r = 0; r < ROUNDS; r++) {
    for (int i = 0; i < 4; i++)
      CHECK("allocate", um_alloc(w->m, w->dev, sizes[i], UM_DEVICE, 0, &bufs[i]));
    for (int i = 0; i < 4; i++)
      CHECK("release", um_release(bufs[i]));
  }
  CHECK("tag", um_tag_pop(w->m));
  /* 2 */
  CHECK("tag", um_tag_push(w->m, "copies"));
  CHECK("allocate A", um_alloc(w->m, w->dev, MiB, UM_DEVICE, 0, &w->a));
  CHECK("allocate B", um_alloc(w->m, w->dev, MiB, UM_DEVICE, 0, &w->b));
  CHECK("copy host -> A", um_copy_from_host(w->a, 0, w->host, MiB, NULL));
  CHECK("copy A -> B", um_copy(w->b, 0, w->a, 0, MiB, NULL));
  CHECK("copy B -> host", um_copy_to_host(w->b, 0, w->back, MiB, NULL));
  if (memcmp(w->back, w->host, MiB) != 0) {
    fprintf(stderr, "unimem stats: device %d: the data came back wrong\n", info.index);
    return 1;
  }
  CHECK("fill A", um_fill(w->a, 0, 0x5A, MiB, NULL));
  CHECK("tag", um_tag_pop(w->m));
  /* 3 */
  CHECK("tag", um_tag_push(w->m, "batch"));
  memset(ops, 0, sizeof(ops));
  for (int i = 0; i < BATCH; i++) {
    ops[i].dst = w->a;
    ops[i].dst_off = (size_t)i * 4 * KiB % MiB;
    ops[i].host_src = w->host + (size_t)i * 4 * KiB;
    ops[i].bytes = 4 * KiB;
  }
  CHECK("batch of copies", um_copy_batch(w->m, ops, BATCH, NULL));
  CHECK("tag", um_tag_pop(w->m));
  /* 4 */
  CHECK("map A", um_map(w->a, UM_MAP_READ_WRITE, 0, 4 * KiB, &view));
  ((unsigned char *)view)[0] ^= 0xFF;
  CHECK("unmap A", um_unmap(w->a, view));
  /* 5 */
  if (info.locations & (1u << UM_PINNED)) {
    int st = um_alloc(w->m, w->dev, MiB, UM_PINNED, 0, &tmp);
    if (st == UM_OK)
      CHECK("release pinned", um_release(tmp));
    else if (st != UM_ENOMEM) /* a low RLIMIT_MEMLOCK is a fact, not a failure */
      return fail_step("allocate pinned", st, w->dev);
  }
  /* 6 */
  CHECK("allocate unpooled", um_alloc(w->m, w->dev, 256 * KiB, UM_DEVICE, UM_ALLOC_UNPOOLED, &tmp));
  CHECK("release unpooled", um_release(tmp));
  /* 7 */
  CHECK("tag", um_tag_push(w->m, "stream"));
  CHECK("wrap the host buffer", um_wrap_host(w->m, w->host, 8 * MiB, UM_WRAP_READONLY, &src));
  w->streamed = 0;
  {
    int st = um_stream(src, 0, 8 * MiB, w->dev, MiB, count_chunk, NULL, w);
    um_release(src);
    if (st != UM_OK)
      return fail_step("stream", st, w->dev);
  }
  CHECK("tag", um_tag_pop(w->m));
  if (w->streamed != 8 * MiB) {
    fprintf(stderr, "unimem stats: device %d: the stream stopped early\n", info.index);
    return 1;
  }
  return 0;
}

/* ------------------------------------------------------------------------ */

typedef struct column {
  char head[24];
  um_stats s;
} column;

static void print_value_double(double v) { printf(" %14.4f", v); }
static void print_value_uint64_t(uint64_t v) { printf(" %14llu", (unsigned long long)v); }

static void print_table(const column *cols, int ncols, const um_manager *m) {
  (void)m;
  printf("%-22s", "field");
  for (int c = 0; c < ncols; c++)
    printf(" %14s", cols[c].head);
  printf("  %s\n", "meaning");
#define ROW(type, name, desc)                                                  \
  printf("%-22s", #name);                                                      \
  for (int c = 0; c < ncols; c++)                                              \
    print_value_##type(cols[c].s.name);                                        \
  printf("  %s\n", desc);
  UM_STATS_FIELDS(ROW)
#undef ROW
}

/* Every tag's figures over all devices. */
static void print_tags(um_manager *m) {
  um_tag_stats t[16];
  int n = um_tag_stats_get(m, NULL, t, 16);
  if (n <= 0)
    return;
  printf("\n%-12s %8s %12s %12s %8s %8s %12s %12s %12s %12s\n", "tag", "buffers", "in use", "peak", "allocs",
         "releases", "h2d", "d2h", "d2d", "peer");
  for (int i = 0; i < n && i < 16; i++)
    printf("%-12s %8llu %12llu %12llu %8llu %8llu %12llu %12llu %12llu %12llu\n",
           t[i].name[0] ? t[i].name : "(untagged)", (unsigned long long)t[i].active_buffers,
           (unsigned long long)t[i].bytes_in_use, (unsigned long long)t[i].peak_bytes_in_use,
           (unsigned long long)t[i].allocations, (unsigned long long)t[i].releases,
           (unsigned long long)t[i].bytes_h2d, (unsigned long long)t[i].bytes_d2h,
           (unsigned long long)t[i].bytes_d2d, (unsigned long long)t[i].bytes_peer);
}

static int write_json(const char *path, um_manager *m, const column *cols, const int *index, int ncols) {
  FILE *f = strcmp(path, "-") == 0 ? stdout : fopen(path, "w");
  int need;
  char *buf;
  if (f == NULL) {
    perror(path);
    return 1;
  }
  fprintf(f, "{\"devices\":[");
  for (int c = 0; c < ncols; c++) {
    um_device_info info;
    need = um_stats_json(&cols[c].s, NULL, 0);
    buf = need > 0 ? malloc((size_t)need + 1) : NULL;
    if (buf == NULL) {
      if (f != stdout)
        fclose(f);
      return 1;
    }
    um_stats_json(&cols[c].s, buf, (size_t)need + 1);
    if (index[c] < 0) {
      fprintf(f, "],\"all\":%s}\n", buf);
    } else {
      um_device_info_get(um_device_get(m, index[c]), &info);
      fprintf(f, "%s{\"index\":%d,\"backend\":", c ? "," : "", info.index);
      bench_json_string(f, info.backend);
      fprintf(f, ",\"name\":");
      bench_json_string(f, info.name);
      fprintf(f, ",\"stats\":%s}", buf);
    }
    free(buf);
  }
  if (f != stdout && fclose(f) != 0) {
    perror(path);
    return 1;
  }
  return 0;
}

/* 0: run; 1: help printed; 2: bad usage (said). */
static int parse_args(int argc, char **argv, const char **json, int *only, const char **history) {
  for (int i = 1; i < argc; i++) {
    if (tool_is_help(argv[i])) {
      fputs(tool_stats_help, stdout);
      return 1;
    } else if (!strcmp(argv[i], "--json") && i + 1 < argc) {
      *json = argv[++i];
    } else if (!strcmp(argv[i], "--history") && i + 1 < argc) {
      *history = argv[++i];
    } else if (!strcmp(argv[i], "--device") && i + 1 < argc) {
      char *end;
      long v = strtol(argv[++i], &end, 10);
      if (*end != '\0' || v < 0 || v > 1000) {
        fprintf(stderr, "unimem stats: bad device index '%s'\n", argv[i]);
        return 2;
      }
      *only = (int)v;
    } else {
      fprintf(stderr, "unimem stats: unknown or incomplete option '%s'\n"
                      "usage: unimem stats [--device N] [--json FILE] [--history FILE]  (unimem stats --help for more)\n",
              argv[i]);
      return 2;
    }
  }
  return 0;
}

/* The workload on every device (or on device only): 0, or 1. */
static int run_workloads(um_manager *m, workload *ws, int ndev, int only) {
  for (int i = 0; i < ndev; i++) {
    workload *w = &ws[i];
    if (only >= 0 && i != only)
      continue;
    w->m = m;
    w->dev = um_device_get(m, i);
    w->host = malloc(8 * MiB);
    w->back = malloc(MiB);
    if (w->host == NULL || w->back == NULL)
      return 1;
    for (size_t k = 0; k < 8 * MiB; k++)
      w->host[k] = (unsigned char)(k * 7 + k / 4096);
    if (run_workload(w) != 0)
      return 1;
  }
  return 0;
}

static void release_workloads(workload *ws, int ndev) {
  for (int i = 0; ws != NULL && i < ndev; i++) {
    if (ws[i].a)
      um_release(ws[i].a);
    if (ws[i].b)
      um_release(ws[i].b);
    free(ws[i].host);
    free(ws[i].back);
  }
  free(ws);
}

/* One column per device of the workload, then one for all devices
 * (index -1). Returns the number of columns. */
static int take_figures(um_manager *m, int ndev, int only, column *cols, int *index) {
  int ncols = 0;
  for (int i = 0; i < ndev; i++) {
    if (only >= 0 && i != only)
      continue;
    um_stats_get(m, um_device_get(m, i), &cols[ncols].s);
    snprintf(cols[ncols].head, sizeof(cols[0].head), "device %d", i);
    index[ncols++] = i;
  }
  um_stats_get(m, NULL, &cols[ncols].s);
  snprintf(cols[ncols].head, sizeof(cols[0].head), "all");
  index[ncols++] = -1;
  return ncols;
}

static void print_report(um_manager *m, int ndev, int only, const column *cols, int ncols) {
  printf("unimem %s stats after the workload of `unimem stats --help`", um_version_string());
  printf(only >= 0 ? " (device %d only)\n" : "\n", only);
  for (int i = 0; i < ndev; i++) {
    um_device_info info;
    if (only >= 0 && i != only)
      continue;
    um_device_info_get(um_device_get(m, i), &info);
    printf("  device %d: %s (%s)\n", i, info.name, info.backend);
  }
  printf("\n");
  print_table(cols, ncols, m);
  print_tags(m);
}

int tool_stats(int argc, char **argv) {
  const char *json = NULL, *history = NULL;
  int only = -1, ndev, ncols, rc, st;
  workload *ws = NULL;
  column *cols = NULL;
  int *index = NULL;
  um_manager *m = NULL;

  if ((rc = parse_args(argc, argv, &json, &only, &history)) != 0)
    return rc == 1 ? 0 : rc;
  if ((st = um_manager_create(NULL, &m)) != UM_OK) {
    fprintf(stderr, "unimem stats: cannot create a manager: %s (%s)\n", um_strerror(st), um_last_error());
    return 1;
  }
  ndev = um_device_count(m);
  if (only >= ndev) {
    fprintf(stderr, "unimem stats: no device %d (there are %d)\n", only, ndev);
    um_manager_destroy(m);
    return 2;
  }
  if (history != NULL && (st = um_history_start(m, (size_t)1 << 20)) != UM_OK) {
    fprintf(stderr, "unimem stats: um_history_start: %s (%s)\n", um_strerror(st), um_last_error());
    um_manager_destroy(m);
    return 1;
  }
  ws = calloc((size_t)ndev, sizeof(*ws));
  cols = calloc((size_t)ndev + 1, sizeof(*cols));
  index = calloc((size_t)ndev + 1, sizeof(*index));
  rc = ws == NULL || cols == NULL || index == NULL ? 1 : run_workloads(m, ws, ndev, only);
  if (rc == 0) {
    ncols = take_figures(m, ndev, only, cols, index);
    if (json == NULL || strcmp(json, "-") != 0)
      print_report(m, ndev, only, cols, ncols);
    if (json != NULL)
      rc = write_json(json, m, cols, index, ncols);
  }
  release_workloads(ws, ndev);
  if (history != NULL && rc == 0) {
    um_history_stop(m);
    if ((st = um_history_write(m, history)) != UM_OK) {
      fprintf(stderr, "unimem stats: um_history_write: %s (%s)\n", um_strerror(st), um_last_error());
      rc = 1;
    }
  }
  if ((st = um_manager_destroy(m)) != UM_OK) {
    fprintf(stderr, "unimem stats: um_manager_destroy: %s (%s)\n", um_strerror(st), um_last_error());
    rc = 1;
  }
  free(cols);
  free(index);
  return rc;
}
