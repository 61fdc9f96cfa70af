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
#include "report.h"
#include "unimem.h"

#define MiB ((size_t)1 << 20)
#define BS_MAX_CHUNKS 4
#define BS_MAX_REPS 31

typedef struct bs_config {
  int quick;
  const char *dir;
  size_t file_bytes;
  uint64_t limit_bytes;
  size_t chunks[BS_MAX_CHUNKS];
  int nchunks;
  int reps;
  int device;  /* -1: first non-host device, else the host */
} bs_config;

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
    if (!strcmp(a, "--dir")) {
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

static um_device *pick_device(um_manager *m, int want) {
  if (want >= 0)
    return um_device_get(m, want);
  return um_device_count(m) > 1 ? um_device_get(m, 1) : um_device_get(m, 0);
}

/* The manager, with the device's memory capped, and the device: 0, or the
 * exit status. */
static int open_device(const bs_config *c, bs_state *s, um_device_info *info) {
  um_options o;
  int st;
  um_options_init(&o);
  o.device_limit_bytes = c->limit_bytes;
  if ((st = um_manager_create(&o, &s->m)) != UM_OK) {
    fprintf(stderr, "bench stream: cannot create a manager: %s (%s)\n", um_strerror(st), um_last_error());
    return 1;
  }
  if ((s->dev = pick_device(s->m, c->device)) == NULL) {
    fprintf(stderr, "bench stream: no device %d\n", c->device);
    return 2;
  }
  um_device_info_get(s->dev, info);
  for (int i = 0; i < c->nchunks; i++) {
    if (info->index > 0 && 2 * (uint64_t)c->chunks[i] > c->limit_bytes) {
      fprintf(stderr, "bench stream: two %zu MiB chunks do not fit a %llu MiB device\n", c->chunks[i] / MiB,
              (unsigned long long)(c->limit_bytes / MiB));
      return 2;
    }
  }
  return 0;
}

/* The file, in a new directory of TMPDIR (or --dir), and the checksum
 * every run must find: 0, or 1. */
static int make_file(const bs_config *c, const bs_state *s, char *dir, size_t dcap, char *path, size_t pcap,
                     uint64_t *expect) {
  const char *tmp = c->dir ? c->dir : getenv("TMPDIR");
  snprintf(dir, dcap, "%s/unimem-bench-stream-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (mkdtemp(dir) == NULL) {
    fprintf(stderr, "bench stream: cannot make a directory in %s: %s\n", tmp && *tmp ? tmp : "/tmp",
            strerror(errno));
    return 1;
  }
  snprintf(path, pcap, "%s/stream.bin", dir);
  if (s->tty) {
    fprintf(stderr, "\r\033[K[0/%d] stream writing a %zu MiB file", s->steps, c->file_bytes / MiB);
    fflush(stderr);
  }
  if (write_file(path, c->file_bytes, expect) != 0) {
    fprintf(stderr, "bench stream: cannot write %s: %s\n", path, strerror(errno));
    unlink(path);
    rmdir(dir);
    return 1;
  }
  return 0;
}

/* One run of one side, checked against the file's checksum: 0, or 1 with
 * a message. */
static int run_side(const bs_config *c, bs_state *s, const char *path, size_t chunk, int naive, uint64_t expect,
                    double *ns) {
  char what[64], text[32];
  int rc;
  bench_size_text(text, sizeof(text), chunk);
  snprintf(what, sizeof(what), "%s %s", text, naive ? "read+copy" : "um_stream");
  s->what = what;
  s->step++;
  rc = naive ? run_naive(s, path, c->file_bytes, chunk, ns) : run_unimem(s, path, chunk, ns);
  if (rc == UM_OK && s->checksum == expect)
    return 0;
  fprintf(stderr, "\nbench stream: %s with %s chunks: %s%s\n", naive ? "read+copy" : "um_stream", text,
          rc != UM_OK ? um_strerror(rc) : "checksum mismatch", rc != UM_OK && !naive ? um_last_error() : "");
  return 1;
}

/* Both sides with chunks of chunk bytes, runs alternating; the medians go
 * into a row of the report. Run 0 of each side warms the pool, the page
 * cache and the driver. 0, or 1 on a failure. */
static int measure_chunk(const bs_config *c, bs_state *s, const char *path, size_t chunk, uint64_t expect,
                         bench_report *rep) {
  double t_um[BS_MAX_REPS], t_naive[BS_MAX_REPS], ns, um_ns, naive_ns, file = (double)c->file_bytes;
  char name[48], text[32];
  bench_row *row;
  for (int r = 0; r <= c->reps; r++) {
    if (run_side(c, s, path, chunk, 0, expect, &ns) != 0)
      return 1;
    if (r > 0)
      t_um[r - 1] = ns;
    if (run_side(c, s, path, chunk, 1, expect, &ns) != 0)
      return 1;
    if (r > 0)
      t_naive[r - 1] = ns;
  }
  um_ns = bench_median(t_um, c->reps);
  naive_ns = bench_median(t_naive, c->reps);
  bench_size_text(text, sizeof(text), chunk);
  snprintf(name, sizeof(name), "%s chunks", text);
  row = bench_add_row(rep, "stream", name);
  bench_set(row, "bytes", file);
  bench_set(row, "chunk_bytes", (double)chunk);
  bench_set(row, "unimem_ns", um_ns);
  bench_set(row, "naive_ns", naive_ns);
  bench_set(row, "unimem_gbps", file / um_ns);
  bench_set(row, "naive_gbps", file / naive_ns);
  bench_set(row, "speedup", naive_ns / um_ns);
  return 0;
}

static void print_results(const bs_config *c, const um_device_info *info, const bench_report *rep, uint64_t peak) {
  char text[32], limit[32];
  bench_size_text(limit, sizeof(limit), c->limit_bytes);
  printf("unimem bench stream%s: a %zu MiB file through device %d \"%s\" (%s)\n", c->quick ? " --quick" : "",
         c->file_bytes / MiB, info->index, info->name, info->backend);
  if (info->index > 0)
    printf("device memory capped at %s (device_limit_bytes): the file is %.0fx the device\n", limit,
           (double)c->file_bytes / (double)c->limit_bytes);
  else
    printf("no device but the host CPU: device_limit_bytes does not apply; this measures the overlap only\n");
  printf("per chunk: bring it to the device, then checksum it through um_map; median of %d runs;\n"
         "GB/s = 1e9 bytes/s; speedup = read+copy time / um_stream time\n\n",
         c->reps);
  printf("%-10s %12s %10s %16s %10s %8s\n", "chunk", "um_stream", "GB/s", "read+copy loop", "GB/s", "speedup");
  for (int k = 0; k < rep->nrows; k++) {
    const bench_row *r = &rep->rows[k];
    bench_size_text(text, sizeof(text), (size_t)bench_get(r, "chunk_bytes"));
    printf("%-10s %10.1f ms %10.2f %13.1f ms %10.2f %7.2fx\n", text, bench_get(r, "unimem_ns") / 1e6,
           bench_get(r, "unimem_gbps"), bench_get(r, "naive_ns") / 1e6, bench_get(r, "naive_gbps"),
           bench_get(r, "speedup"));
  }
  bench_size_text(text, sizeof(text), peak);
  if (info->index > 0)
    printf("\npeak device memory in use: %s of the %s limit; every run's checksum matched the file's\n", text,
           limit);
  else
    printf("\npeak bytes in use on device 0: %s (the mapped file is a buffer of device 0 too); every run's\n"
           "checksum matched the file's\n",
           text);
}

static void record_run(const bs_config *c, const um_device_info *info, uint64_t peak, bench_report *rep) {
  bench_set_bool(&rep->facts, "quick", c->quick);
  bench_set_text(&rep->facts, "device", info->name);
  bench_set_text(&rep->facts, "backend", info->backend);
  bench_set(&rep->facts, "file_bytes", (double)c->file_bytes);
  bench_set(&rep->facts, "limit_bytes", (double)c->limit_bytes);
  bench_set_bool(&rep->facts, "limit_applies", info->index > 0);
  bench_set(&rep->facts, "runs", c->reps);
  bench_set(&rep->facts, "peak_device_bytes", (double)peak);
}

int um_bench_stream_main(int argc, char **argv, bench_report *rep) {
  bs_config c;
  bs_state s;
  um_device_info info;
  um_stats stats;
  char dir[512], path[600];
  uint64_t expect = 0;
  int rc, failed = 0;

  if ((rc = parse_args(argc, argv, &c)) != 0)
    return rc == 1 ? 0 : rc;
  memset(&s, 0, sizeof(s));
  s.tty = isatty(STDERR_FILENO);
  s.steps = c.nchunks * (2 * c.reps + 2);
  if ((rc = open_device(&c, &s, &info)) != 0 || (rc = make_file(&c, &s, dir, sizeof(dir), path, sizeof(path), &expect)) != 0) {
    if (s.m != NULL)
      um_manager_destroy(s.m);
    return rc;
  }
  for (int k = 0; k < c.nchunks && !failed; k++)
    failed = measure_chunk(&c, &s, path, c.chunks[k], expect, rep);
  if (s.tty)
    fprintf(stderr, "\r\033[K");
  um_stats_get(s.m, s.dev, &stats);
  unlink(path);
  rmdir(dir);
  if (!failed) {
    print_results(&c, &info, rep, stats.peak_bytes_in_use);
    record_run(&c, &info, stats.peak_bytes_in_use, rep);
  }
  rc = um_manager_destroy(s.m);
  if (rc != UM_OK) {
    fprintf(stderr, "bench stream: um_manager_destroy: %s\n", um_strerror(rc));
    failed = 1;
  }
  return failed ? 1 : 0;
}

#ifndef UM_BENCH_NO_MAIN
int main(int argc, char **argv) { return bench_program_main(argc, argv, "stream", um_bench_stream_main); }
#endif
