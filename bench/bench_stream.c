/* Streaming a file several times larger than a device's memory: um_stream
 * over um_map_file against the loop people write by hand.
 *
 *   bench_stream [--quick] [--json FILE] [--dir DIR] [--file-mib N]
 *                [--limit-mib N] [--chunk-mib N] [--reps N] [--device N]
 *
 * The device's memory is capped with the device_limit_bytes option
 * (default 64 MiB; the file is 512 MiB, eight times more). Both sides do the
 * same work per chunk: bring it into a device buffer, then process it (a
 * checksum of every 64-bit word, read through um_map; the checksums of the
 * whole file must agree with the one computed while writing it, so every
 * run also checks that every byte arrived).
 *  - unimem: um_map_file, then um_stream (two device buffers, the copy of
 *    chunk k+1 overlaps the processing of chunk k);
 *  - naive:  read() a chunk into a malloc buffer, blocking
 *    um_copy_from_host into one device buffer, process, repeat.
 * Runs alternate between the two sides (the machines here are shared) and
 * the table gives medians. The device is the first non-host device (an
 * OpenCL device on PoCL here), else the host CPU, where the limit does not
 * apply and the numbers show the overlap alone.
 *
 * Built as the `unimem bench stream` subcommand with -DUM_BENCH_NO_MAIN
 * (entry point um_bench_stream_main).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "unimem.h"

#define MiB ((size_t)1 << 20)
#define BS_MAX_CHUNKS 4
#define BS_MAX_REPS 31

typedef struct bs_config {
  int quick;
  const char *json;
  const char *dir;
  size_t file_bytes;
  uint64_t limit_bytes;
  size_t chunks[BS_MAX_CHUNKS];
  int nchunks;
  int reps;
  int device;  /* -1: first non-host device, else the host */
} bs_config;

typedef struct bs_row {
  size_t chunk;
  double unimem_ns, naive_ns; /* median time to process the whole file */
} bs_row;

typedef struct bs_state {
  um_manager *m;
  um_device *dev;
  uint64_t checksum;       /* of the chunks processed in this run */
  int step, steps;         /* progress line */
  const char *what;
  int tty;
} bs_state;

/* The file's content: word i of the file is word_at(i). Chunk sizes are
 * whole MiB, so every chunk starts on a word. */
static uint64_t word_at(uint64_t i) { return i * 0x9E3779B97F4A7C15ull ^ (i >> 7); }

/* Order-independent but position-dependent: a word moved to the wrong place
 * changes the sum. */
static uint64_t checksum_words(const uint64_t *w, size_t nwords, uint64_t first) {
  uint64_t s = 0;
  for (size_t i = 0; i < nwords; i++)
    s += w[i] ^ ((first + i) * 0x100000001B3ull);
  return s;
}

static int write_file(const char *path, size_t bytes, uint64_t *sum) {
  size_t words_per = MiB / 8;
  uint64_t *block = malloc(MiB);
  int fd, rc = 0;
  if (block == NULL)
    return -1;
  fd = open(path, O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0600);
  if (fd < 0) {
    free(block);
    return -1;
  }
  *sum = 0;
  for (size_t off = 0; off < bytes && rc == 0; off += MiB) {
    uint64_t first = off / 8;
    for (size_t i = 0; i < words_per; i++)
      block[i] = word_at(first + i);
    *sum += checksum_words(block, words_per, first);
    if (write(fd, block, MiB) != (ssize_t)MiB)
      rc = -1;
  }
  if (close(fd) != 0)
    rc = -1;
  free(block);
  return rc;
}

static void progress_line(bs_state *s, uint64_t done, uint64_t total) {
  if (!s->tty)
    return;
  fprintf(stderr, "\r\033[K[%d/%d] stream %-24s %3d%%", s->step, s->steps, s->what,
          (int)(total ? done * 100 / total : 100));
  fflush(stderr);
}

/* The work done on each chunk by both sides. */
static int process_chunk(bs_state *s, um_buffer *chunk, size_t offset, size_t bytes) {
  void *host = NULL;
  int st = um_map(chunk, UM_MAP_READ, 0, bytes, &host);
  if (st != UM_OK)
    return st;
  s->checksum += checksum_words(host, bytes / 8, offset / 8);
  return um_unmap(chunk, host);
}

static int on_chunk(void *user, um_buffer *chunk, size_t offset, size_t bytes) {
  return process_chunk(user, chunk, offset, bytes);
}

static void on_progress(void *user, uint64_t done, uint64_t total) { progress_line(user, done, total); }

static int run_unimem(bs_state *s, const char *path, size_t chunk, double *ns) {
  um_buffer *file = NULL;
  double t0 = bench_now_ns();
  int st = um_map_file(s->m, path, UM_MAP_READ, &file);
  if (st != UM_OK)
    return st;
  s->checksum = 0;
  st = um_stream(file, 0, um_buffer_size(file), s->dev, chunk, on_chunk, on_progress, s);
  um_release(file);
  *ns = bench_now_ns() - t0;
  return st;
}

static int run_naive(bs_state *s, const char *path, size_t file_bytes, size_t chunk, double *ns) {
  um_buffer *dev = NULL;
  char *host = malloc(chunk);
  double t0 = bench_now_ns();
  int fd = -1, st;
  if (host == NULL)
    return UM_ENOMEM;
  if ((st = um_alloc(s->m, s->dev, chunk, UM_DEVICE, 0, &dev)) != UM_OK)
    goto out;
  if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0) {
    st = UM_ENODEV;
    goto out;
  }
  s->checksum = 0;
  for (size_t off = 0; off < file_bytes && st == UM_OK;) {
    size_t want = file_bytes - off < chunk ? file_bytes - off : chunk, got = 0;
    while (got < want) {
      ssize_t r = read(fd, host + got, want - got);
      if (r <= 0) {
        st = UM_ENODEV;
        break;
      }
      got += (size_t)r;
    }
    if (st != UM_OK)
      break;
    if ((st = um_copy_from_host(dev, 0, host, want, NULL)) != UM_OK)
      break;
    st = process_chunk(s, dev, off, want);
    off += want;
    progress_line(s, off, file_bytes);
  }
out:
  if (fd >= 0)
    close(fd);
  if (dev != NULL)
    um_release(dev);
  free(host);
  *ns = bench_now_ns() - t0;
  return st;
}

static void usage(FILE *f, const char *argv0) {
  fprintf(f,
          "usage: %s [--quick] [--json FILE] [--dir DIR] [--file-mib N] [--limit-mib N]\n"
          "       [--chunk-mib N] [--reps N] [--device N]\n"
          "Streams a file several times larger than the device's memory (capped with\n"
          "device_limit_bytes) through the device with um_stream, against a read()+copy loop.\n",
          argv0);
}

static int parse_size_mib(const char *s, size_t *out) {
  char *end;
  unsigned long v;
  errno = 0;
  v = strtoul(s, &end, 10);
  if (errno != 0 || *end != '\0' || v == 0 || v > (1ul << 20))
    return -1;
  *out = (size_t)v * MiB;
  return 0;
}

/* 0: run; 1: help was printed; 2: bad arguments. */
static int parse_args(int argc, char **argv, bs_config *c) {
  size_t one = 0;
  memset(c, 0, sizeof(*c));
  c->device = -1;
  for (int i = 1; i < argc; i++)
    if (!strcmp(argv[i], "--quick"))
      c->quick = 1;
  c->file_bytes = (c->quick ? 64 : 512) * MiB;
  c->limit_bytes = (c->quick ? 16 : 64) * MiB;
  c->reps = c->quick ? 3 : 5;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *next = i + 1 < argc ? argv[i + 1] : NULL;
    size_t limit;
    if (!strcmp(a, "--quick"))
      continue;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      usage(stdout, argv[0]);
      return 1;
    }
    if (next == NULL)
      goto bad;
    if (!strcmp(a, "--json")) {
      c->json = next;
    } else if (!strcmp(a, "--dir")) {
      c->dir = next;
    } else if (!strcmp(a, "--file-mib")) {
      if (parse_size_mib(next, &c->file_bytes) != 0)
        goto bad;
    } else if (!strcmp(a, "--limit-mib")) {
      if (parse_size_mib(next, &limit) != 0)
        goto bad;
      c->limit_bytes = limit;
    } else if (!strcmp(a, "--chunk-mib")) {
      if (parse_size_mib(next, &one) != 0)
        goto bad;
    } else if (!strcmp(a, "--reps")) {
      c->reps = atoi(next);
      if (c->reps < 1 || c->reps > BS_MAX_REPS)
        goto bad;
    } else if (!strcmp(a, "--device")) {
      c->device = atoi(next);
      if (c->device < 0)
        goto bad;
    } else {
      goto bad;
    }
    i++;
    continue;
  bad:
    fprintf(stderr, "bench stream: bad or incomplete argument '%s'\n", a);
    usage(stderr, argv[0]);
    return 2;
  }
  if (one != 0) {
    c->chunks[c->nchunks++] = one;
  } else {
    c->chunks[c->nchunks++] = 4 * MiB;
    if (!c->quick)
      c->chunks[c->nchunks++] = 16 * MiB;
  }
  return 0;
}

static void mib_text(uint64_t bytes, char *out, size_t cap) {
  if (bytes % MiB == 0)
    snprintf(out, cap, "%llu MiB", (unsigned long long)(bytes / MiB));
  else
    snprintf(out, cap, "%.1f MiB", (double)bytes / (double)MiB);
}

static um_device *pick_device(um_manager *m, int want) {
  if (want >= 0)
    return um_device_get(m, want);
  return um_device_count(m) > 1 ? um_device_get(m, 1) : um_device_get(m, 0);
}

static int write_json(const bs_config *c, const um_device_info *info, const bs_row *rows, int nrows,
                      uint64_t peak) {
  FILE *f = fopen(c->json, "w");
  if (f == NULL) {
    fprintf(stderr, "bench stream: cannot write %s: %s\n", c->json, strerror(errno));
    return 1;
  }
  fprintf(f,
          "{\"bench\":\"stream\",\"quick\":%s,\"device\":\"%s\",\"backend\":\"%s\","
          "\"file_bytes\":%zu,\"limit_bytes\":%llu,\"limit_applies\":%s,\"runs\":%d,"
          "\"peak_device_bytes\":%llu,\"rows\":[",
          c->quick ? "true" : "false", info->name, info->backend, c->file_bytes,
          (unsigned long long)c->limit_bytes, info->index > 0 ? "true" : "false", c->reps,
          (unsigned long long)peak);
  for (int i = 0; i < nrows; i++) {
    char chunk[32];
    mib_text(rows[i].chunk, chunk, sizeof(chunk));
    fprintf(f,
            "%s\n{\"table\":\"stream\",\"name\":\"%s chunks\",\"bytes\":%zu,\"chunk_bytes\":%zu,"
            "\"unimem_ns\":%.0f,\"naive_ns\":%.0f,\"unimem_gbps\":%.3f,\"naive_gbps\":%.3f,"
            "\"speedup\":%.3f}",
            i ? "," : "", chunk, c->file_bytes, rows[i].chunk, rows[i].unimem_ns, rows[i].naive_ns,
            (double)c->file_bytes / rows[i].unimem_ns, (double)c->file_bytes / rows[i].naive_ns,
            rows[i].naive_ns / rows[i].unimem_ns);
  }
  fprintf(f, "\n]}\n");
  return fclose(f) == 0 ? 0 : 1;
}

int um_bench_stream_main(int argc, char **argv) {
  bs_config c;
  bs_state s;
  bs_row rows[BS_MAX_CHUNKS];
  um_options o;
  um_device_info info;
  um_stats stats;
  char dir[512], path[600], text[32], limit_text[32];
  const char *tmp;
  uint64_t expect = 0;
  int rc, failed = 0;

  if ((rc = parse_args(argc, argv, &c)) != 0)
    return rc == 1 ? 0 : rc;
  memset(&s, 0, sizeof(s));
  s.tty = isatty(STDERR_FILENO);
  um_options_init(&o);
  o.device_limit_bytes = c.limit_bytes;
  if ((rc = um_manager_create(&o, &s.m)) != UM_OK) {
    fprintf(stderr, "bench stream: cannot create a manager: %s (%s)\n", um_strerror(rc), um_last_error());
    return 1;
  }
  s.dev = pick_device(s.m, c.device);
  if (s.dev == NULL) {
    fprintf(stderr, "bench stream: no device %d\n", c.device);
    um_manager_destroy(s.m);
    return 2;
  }
  um_device_info_get(s.dev, &info);
  for (int i = 0; i < c.nchunks; i++) {
    if (info.index > 0 && 2 * (uint64_t)c.chunks[i] > c.limit_bytes) {
      fprintf(stderr, "bench stream: two %zu MiB chunks do not fit a %llu MiB device\n", c.chunks[i] / MiB,
              (unsigned long long)(c.limit_bytes / MiB));
      um_manager_destroy(s.m);
      return 2;
    }
  }

  tmp = c.dir ? c.dir : getenv("TMPDIR");
  snprintf(dir, sizeof(dir), "%s/unimem-bench-stream-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (mkdtemp(dir) == NULL) {
    fprintf(stderr, "bench stream: cannot make a directory in %s: %s\n", tmp && *tmp ? tmp : "/tmp",
            strerror(errno));
    um_manager_destroy(s.m);
    return 1;
  }
  snprintf(path, sizeof(path), "%s/stream.bin", dir);
  if (s.tty) {
    fprintf(stderr, "\r\033[K[0/%d] stream writing a %zu MiB file", c.nchunks * (2 * c.reps + 2), c.file_bytes / MiB);
    fflush(stderr);
  }
  if (write_file(path, c.file_bytes, &expect) != 0) {
    fprintf(stderr, "bench stream: cannot write %s: %s\n", path, strerror(errno));
    unlink(path);
    rmdir(dir);
    um_manager_destroy(s.m);
    return 1;
  }

  s.steps = c.nchunks * (2 * c.reps + 2);
  for (int k = 0; k < c.nchunks && !failed; k++) {
    double t_um[BS_MAX_REPS], t_naive[BS_MAX_REPS], ns;
    mib_text(c.chunks[k], text, sizeof(text));
    /* Run 0 of each side warms the pool, the page cache and the driver. */
    for (int r = 0; r <= c.reps && !failed; r++) {
      char what[64];
      snprintf(what, sizeof(what), "%s um_stream", text);
      s.what = what;
      s.step++;
      rc = run_unimem(&s, path, c.chunks[k], &ns);
      if (rc != UM_OK || s.checksum != expect) {
        fprintf(stderr, "\nbench stream: um_stream with %s chunks: %s%s\n", text,
                rc != UM_OK ? um_strerror(rc) : "checksum mismatch", rc != UM_OK ? um_last_error() : "");
        failed = 1;
        break;
      }
      if (r > 0)
        t_um[r - 1] = ns;
      snprintf(what, sizeof(what), "%s read+copy", text);
      s.step++;
      rc = run_naive(&s, path, c.file_bytes, c.chunks[k], &ns);
      if (rc != UM_OK || s.checksum != expect) {
        fprintf(stderr, "\nbench stream: read+copy with %s chunks: %s\n", text,
                rc != UM_OK ? um_strerror(rc) : "checksum mismatch");
        failed = 1;
        break;
      }
      if (r > 0)
        t_naive[r - 1] = ns;
    }
    if (!failed) {
      rows[k].chunk = c.chunks[k];
      rows[k].unimem_ns = bench_median(t_um, c.reps);
      rows[k].naive_ns = bench_median(t_naive, c.reps);
    }
  }
  if (s.tty)
    fprintf(stderr, "\r\033[K");
  um_stats_get(s.m, s.dev, &stats);
  unlink(path);
  rmdir(dir);

  if (!failed) {
    mib_text(c.limit_bytes, limit_text, sizeof(limit_text));
    printf("unimem bench stream%s: a %zu MiB file through device %d \"%s\" (%s)\n", c.quick ? " --quick" : "",
           c.file_bytes / MiB, info.index, info.name, info.backend);
    if (info.index > 0)
      printf("device memory capped at %s (device_limit_bytes): the file is %.0fx the device\n", limit_text,
             (double)c.file_bytes / (double)c.limit_bytes);
    else
      printf("no device but the host CPU: device_limit_bytes does not apply; this measures the overlap only\n");
    printf("per chunk: bring it to the device, then checksum it through um_map; median of %d runs;\n"
           "GB/s = 1e9 bytes/s; speedup = read+copy time / um_stream time\n\n",
           c.reps);
    printf("%-10s %12s %10s %16s %10s %8s\n", "chunk", "um_stream", "GB/s", "read+copy loop", "GB/s", "speedup");
    for (int k = 0; k < c.nchunks; k++) {
      mib_text(rows[k].chunk, text, sizeof(text));
      printf("%-10s %10.1f ms %10.2f %13.1f ms %10.2f %7.2fx\n", text, rows[k].unimem_ns / 1e6,
             (double)c.file_bytes / rows[k].unimem_ns, rows[k].naive_ns / 1e6,
             (double)c.file_bytes / rows[k].naive_ns, rows[k].naive_ns / rows[k].unimem_ns);
    }
    mib_text(stats.peak_bytes_in_use, text, sizeof(text));
    if (info.index > 0)
      printf("\npeak device memory in use: %s of the %s limit; every run's checksum matched the file's\n", text,
             limit_text);
    else
      printf("\npeak bytes in use on device 0: %s (the mapped file is a buffer of device 0 too); every run's\n"
             "checksum matched the file's\n",
             text);
    if (c.json != NULL && write_json(&c, &info, rows, c.nchunks, stats.peak_bytes_in_use) != 0)
      failed = 1;
  }
  rc = um_manager_destroy(s.m);
  if (rc != UM_OK) {
    fprintf(stderr, "bench stream: um_manager_destroy: %s\n", um_strerror(rc));
    failed = 1;
  }
  return failed ? 1 : 0;
}

#ifndef UM_BENCH_NO_MAIN
int main(int argc, char **argv) { return um_bench_stream_main(argc, argv); }
#endif
