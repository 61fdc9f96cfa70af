/* um_net put and get between two processes on this machine, next to
 * ucx_perftest on the same transport in the same run (SPEC §6: put/get of
 * >= 1 MiB at >= 0.9x ucx_perftest).
 *
 *   bench_net [--quick] [--json FILE] [--rounds N] [--unimem pool|alloc|both]
 *             [--inflight N]
 *             (UCX_TLS and UCX_NET_DEVICES pick the transport for both)
 *
 * unimem: a target process exposes a 64 MiB HOST buffer and does nothing
 * more (its progress thread serves the peer); an issuer process measures,
 * per size, twice over (--unimem picks: both by default): with buffers of
 * um_alloc (the pool's HOST memory, column "unimem") and with buffers of
 * um_net_alloc (memory UCX allocated, column "net_alloc"), the target's
 * exposed buffer and the issuer's local ones alike;
 *  - put and get bandwidth: transfers issued with events from four local
 *    buffers, four in flight, total bytes over total time;
 *  - put latency: the median of blocking um_net_put calls, each complete
 *    at the target (admission, data, flush).
 * ucx_perftest: ucp_put_bw, ucp_get and ucp_put_lat between a server and a
 * client process over 127.0.0.1, twice: as it runs by default (its server
 * busy-polls its worker, and its buffers are memory UCX allocated), and
 * with -o (the responder does not progress: a passive target, as
 * unimem's). The ratio is unimem over default ucx_perftest.
 *
 * Rounds alternate (a round of unimem per kind of buffer, every size, then
 * a round of ucx_perftest) so that both see the same load on a shared machine; the
 * table gives medians over rounds and the spread (largest minus smallest,
 * over the median) of unimem's and ucx_perftest's bandwidth.
 *
 * Built as the `unimem bench net` subcommand with -DUM_BENCH_NO_MAIN
 * (entry point um_bench_net_main); skipped (77) without UCX or without
 * ucx_perftest.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_util.h"
#include "net_bootstrap.h"
#include "report.h"
#include "unimem.h"

#define BN_TARGET_BYTES (64u << 20)
#define BN_INFLIGHT 4
/* --inflight: transfers in flight, from as many buffers to as many remote
 * ranges (1: one buffer, one range, ucx_perftest's access pattern). */
static int bn_inflight = BN_INFLIGHT;
#define BN_WAIT_MS 60000
#define BN_MAX_ROUNDS 15
#define BN_PERFTEST_MS 60000
#define BN_PERFTEST_HUNG 124

static const size_t bn_sizes[] = {4096, 65536, 1u << 20, 4u << 20, 16u << 20, 64u << 20};
#define BN_NSIZES (sizeof(bn_sizes) / sizeof(bn_sizes[0]))

/* One round's figures for one size: MiB/s and microseconds. */
typedef struct bn_figures {
  double put_mibs, get_mibs, put_lat_us;
} bn_figures;

/* Every round of one side. */
typedef struct bn_side {
  bn_figures f[BN_MAX_ROUNDS][BN_NSIZES];
} bn_side;

/* unimem's buffers: of um_alloc (the pool), or of um_net_alloc. */
enum { BN_POOL = 0, BN_ALLOC = 1, BN_KINDS = 2 };
static const char *const bn_kind_names[BN_KINDS] = {"pool", "alloc"};

static void bn_die(const char *what, int st) {
  fprintf(stderr, "bench_net: %s: %s (%s)\n", what, um_err_name(st), um_last_error());
  _exit(st == UM_ENOTSUP ? BENCH_SKIPPED : 1);
}

#define BN_CHECK(call)                                                         \
  do {                                                                         \
    int st_ = (call);                                                          \
    if (st_ != UM_OK)                                                          \
      bn_die(#call, st_);                                                      \
  } while (0)

static int bn_iterations(size_t n, int quick) {
  size_t k = (quick ? (32u << 20) : (256u << 20)) / n;
  return k < 8 ? 8 : k > 1000 ? 1000 : (int)k;
}

/* ------------------------------------------------------------------------ */
/* unimem: the two processes */

static void bn_open(um_manager **m, um_net **n) {
  BN_CHECK(um_manager_create(NULL, m));
  BN_CHECK(um_net_create(*m, n));
}

static um_endpoint *bn_connect(um_net *n, int fd) {
  unsigned char mine[4096], theirs[4096];
  size_t len = sizeof(mine), tlen = 0;
  um_endpoint *ep;
  BN_CHECK(um_net_address(n, mine, &len));
  if (nb_send(fd, mine, len) != 0 || nb_recv(fd, theirs, sizeof(theirs), &tlen, BN_WAIT_MS) != 0)
    bn_die("address exchange", UM_EBACKEND);
  BN_CHECK(um_net_connect(n, theirs, tlen, &ep));
  return ep;
}

/* A zeroed HOST buffer of bytes: of the pool, or of um_net_alloc. */
static um_buffer *bn_buffer(um_manager *m, um_net *n, int kind, size_t bytes) {
  um_buffer *b;
  if (kind == BN_ALLOC)
    BN_CHECK(um_net_alloc(n, bytes, UM_ALLOC_ZERO, &b));
  else
    BN_CHECK(um_alloc(m, um_device_get(m, 0), bytes, UM_HOST, UM_ALLOC_ZERO, &b));
  return b;
}

/* The passive side: expose, then wait (calling nothing) for the end. */
static int bn_target(int fd, int kind) {
  unsigned char key[4096], msg;
  size_t len = sizeof(key), mlen;
  um_manager *m;
  um_net *n;
  um_buffer *b;
  um_endpoint *ep;
  bn_open(&m, &n);
  ep = bn_connect(n, fd);
  b = bn_buffer(m, n, kind, BN_TARGET_BYTES);
  BN_CHECK(um_net_expose(b, key, &len));
  if (nb_send(fd, key, len) != 0 || nb_recv(fd, &msg, 1, &mlen, 24 * 3600 * 1000) != 0)
    bn_die("key exchange", UM_EBACKEND);
  BN_CHECK(um_endpoint_close(ep));
  BN_CHECK(um_release(b));
  BN_CHECK(um_net_destroy(n));
  BN_CHECK(um_manager_destroy(m));
  return 0;
}

typedef struct bn_issuer {
  um_endpoint *ep;
  um_buffer *bufs[BN_INFLIGHT];
  unsigned char key[4096];
  size_t klen;
  int quick;
} bn_issuer;

static double bn_put_latency_us(bn_issuer *s, size_t n, int iters) {
  double t[200];
  for (int i = 0; i < iters + 2; i++) { /* two warm-up rounds */
    double t0 = bench_now_ns();
    BN_CHECK(um_net_put(s->ep, s->bufs[0], 0, s->key, s->klen, 0, n, NULL));
    if (i >= 2)
      t[i - 2] = bench_now_ns() - t0;
  }
  return bench_median(t, iters) / 1e3;
}

/* MiB/s of count transfers of n bytes, BN_INFLIGHT at a time from as many
 * buffers (operations on one buffer run one after another), after an
 * untimed warm-up of one transfer per buffer over the same ranges (as
 * ucx_perftest warms up: a first touch of a peer's shared-memory segment
 * maps its pages into this process, a page fault each). */
static double bn_bandwidth_mibs(bn_issuer *s, size_t n, int count, int get) {
  um_event *ev[BN_INFLIGHT] = {NULL};
  double t0;
  for (int k = 0; k < bn_inflight; k++) {
    size_t roff = (size_t)k * n % (BN_TARGET_BYTES - n + 1);
    if (get)
      BN_CHECK(um_net_get(s->ep, s->bufs[k], 0, s->key, s->klen, roff, n, NULL));
    else
      BN_CHECK(um_net_put(s->ep, s->bufs[k], 0, s->key, s->klen, roff, n, NULL));
  }
  t0 = bench_now_ns();
  for (int i = 0; i < count; i++) {
    int k = i % bn_inflight;
    size_t roff = (size_t)k * n % (BN_TARGET_BYTES - n + 1);
    if (ev[k] != NULL) {
      BN_CHECK(um_event_wait(ev[k]));
      um_event_release(ev[k]);
    }
    if (get)
      BN_CHECK(um_net_get(s->ep, s->bufs[k], 0, s->key, s->klen, roff, n, &ev[k]));
    else
      BN_CHECK(um_net_put(s->ep, s->bufs[k], 0, s->key, s->klen, roff, n, &ev[k]));
  }
  for (int k = 0; k < bn_inflight; k++)
    if (ev[k] != NULL) {
      BN_CHECK(um_event_wait(ev[k]));
      um_event_release(ev[k]);
    }
  return (double)n * count / (1024.0 * 1024.0) / ((bench_now_ns() - t0) / 1e9);
}

static void bn_issuer_round(bn_issuer *s, bn_figures *f) {
  for (size_t k = 0; k < BN_NSIZES; k++) {
    int it = bn_iterations(bn_sizes[k], s->quick);
    f[k].put_mibs = bn_bandwidth_mibs(s, bn_sizes[k], it, 0);
    f[k].get_mibs = bn_bandwidth_mibs(s, bn_sizes[k], it, 1);
    f[k].put_lat_us = bn_put_latency_us(s, bn_sizes[k], it < 100 ? it : 100);
  }
}

/* The measuring side: a round per 'r' on cmd, its figures on out. */
static int bn_issuer_main(int fd, int cmd, int out, int quick, int kind) {
  bn_issuer s = {.quick = quick};
  bn_figures f[BN_NSIZES];
  um_manager *m;
  um_net *n;
  char c;
  bn_open(&m, &n);
  s.ep = bn_connect(n, fd);
  if (nb_recv(fd, s.key, sizeof(s.key), &s.klen, BN_WAIT_MS) != 0)
    bn_die("key exchange", UM_EBACKEND);
  for (int k = 0; k < bn_inflight; k++)
    s.bufs[k] = bn_buffer(m, n, kind, BN_TARGET_BYTES);
  while (read(cmd, &c, 1) == 1 && c == 'r') {
    bn_issuer_round(&s, f);
    if (write(out, f, sizeof(f)) != (ssize_t)sizeof(f))
      bn_die("result pipe", UM_EBACKEND);
  }
  (void)nb_send(fd, "q", 1);
  BN_CHECK(um_endpoint_close(s.ep));
  for (int k = 0; k < bn_inflight; k++)
    BN_CHECK(um_release(s.bufs[k]));
  BN_CHECK(um_net_destroy(n));
  BN_CHECK(um_manager_destroy(m));
  return 0;
}

/* The two processes of unimem's side and the issuer's pipes. */
typedef struct bn_procs {
  pid_t target, issuer;
  int cmd, res; /* to the issuer, from it */
  bool failed;  /* the issuer ended early: the target waits for nothing */
} bn_procs;

static int bn_procs_start(bn_procs *p, int quick, int kind) {
  int fds[2], cmd[2], res[2];
  p->failed = false;
  /* Close-on-exec: the ucx_perftest processes started later must not keep
   * the issuer's command pipe open (it ends at EOF). */
  if (nb_pair(fds) != 0 || pipe2(cmd, O_CLOEXEC) != 0 || pipe2(res, O_CLOEXEC) != 0)
    return 1;
  fflush(stdout);
  fflush(stderr);
  if ((p->target = fork()) == 0) {
    close(fds[1]);
    close(cmd[0]);
    close(cmd[1]);
    close(res[0]);
    close(res[1]);
    _exit(bn_target(fds[0], kind));
  }
  if ((p->issuer = fork()) == 0) {
    close(fds[0]);
    close(cmd[1]);
    close(res[0]);
    _exit(bn_issuer_main(fds[1], cmd[0], res[1], quick, kind));
  }
  close(fds[0]);
  close(fds[1]);
  close(cmd[0]);
  close(res[1]);
  p->cmd = cmd[1];
  p->res = res[0];
  return 0;
}

/* One round of unimem's side; 0, or the issuer's exit status when it
 * ended instead (77: no UCX). */
static int bn_procs_round(bn_procs *p, bn_figures *f) {
  size_t want = sizeof(bn_figures) * BN_NSIZES, got = 0;
  ssize_t r;
  int status;
  if (write(p->cmd, "r", 1) != 1)
    return 1;
  while (got < want && (r = read(p->res, (char *)f + got, want - got)) > 0)
    got += (size_t)r;
  if (got == want)
    return 0;
  waitpid(p->issuer, &status, 0);
  p->issuer = -1;
  p->failed = true;
  return WIFEXITED(status) && WEXITSTATUS(status) != 0 ? WEXITSTATUS(status) : 1;
}

static void bn_procs_stop(bn_procs *p) {
  close(p->cmd);
  close(p->res);
  if (p->issuer > 0)
    waitpid(p->issuer, NULL, 0);
  if (p->failed)
    kill(p->target, SIGTERM); /* it would wait for the issuer's end */
  waitpid(p->target, NULL, 0);
}

/* ------------------------------------------------------------------------ */
/* ucx_perftest */

/* The "Final:" line of a client run: 50th percentile latency (us) and
 * overall bandwidth (MB/s, which ucx_perftest means as MiB/s). */
static int bn_parse_final(const char *out, double *p50_us, double *mibs) {
  const char *f = strstr(out, "Final:");
  double it, p50, avg, overall, bw_avg, bw_overall;
  if (f == NULL ||
      sscanf(f, "Final: %lf %lf %lf %lf %lf %lf", &it, &p50, &avg, &overall, &bw_avg, &bw_overall) != 6)
    return -1;
  *p50_us = p50;
  *mibs = bw_overall;
  return 0;
}

static bool bn_readable(int fd, int timeout_ms) {
  struct pollfd p = {.fd = fd, .events = POLLIN, .revents = 0};
  return poll(&p, 1, timeout_ms) == 1;
}

/* One client run against the server listening on port; its output. 127
 * when ucx_perftest is not installed, BN_PERFTEST_HUNG when it printed
 * nothing for BN_PERFTEST_MS (then killed). */
static int bn_perftest_client(const char *port, const char *test, size_t n, int iters, int passive,
                              char *out, size_t cap) {
  char size[32], count[32], warm[32];
  int pfd[2], status;
  size_t got = 0;
  ssize_t r;
  pid_t client;
  snprintf(size, sizeof(size), "%zu", n);
  snprintf(count, sizeof(count), "%d", iters);
  snprintf(warm, sizeof(warm), "%d", iters / 10 + 1);
  if (pipe(pfd) != 0)
    return 1;
  if ((client = fork()) == 0) {
    dup2(pfd[1], 1);
    dup2(pfd[1], 2);
    close(pfd[0]);
    execlp("ucx_perftest", "ucx_perftest", "127.0.0.1", "-p", port, "-t", test, "-s", size, "-n", count,
           "-w", warm, passive ? "-o" : (char *)NULL, (char *)NULL);
    _exit(127);
  }
  close(pfd[1]);
  while (got < cap - 1 && bn_readable(pfd[0], BN_PERFTEST_MS) &&
         (r = read(pfd[0], out + got, cap - 1 - got)) > 0)
    got += (size_t)r;
  out[got] = '\0';
  close(pfd[0]);
  /* Silent that long: a passive responder (-o) on a transport whose RMA
   * needs the responder's progress (tcp) never completes. */
  kill(client, SIGKILL);
  waitpid(client, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : BN_PERFTEST_HUNG;
}

/* A server and one client run of test; 0, -1 when it did not run, 127
 * when ucx_perftest is not installed. */
static int bn_perftest(const char *test, size_t n, int iters, int passive, double *p50_us, double *mibs) {
  static unsigned seq;
  char port[16], out[16384];
  int rc = -1;
  pid_t server;
  snprintf(port, sizeof(port), "%u", 20000u + ((unsigned)getpid() * 31u + seq++ * 7u) % 20000u);
  fflush(stdout); /* a child's exec would lose nothing, a child's exit would flush twice */
  if ((server = fork()) == 0) {
    if (freopen("/dev/null", "w", stdout) == NULL || freopen("/dev/null", "w", stderr) == NULL)
      _exit(127);
    execlp("ucx_perftest", "ucx_perftest", "-p", port, (char *)NULL);
    _exit(127);
  }
  /* The server listens first; the client retries until it does. */
  for (int attempt = 0; attempt < 50 && rc != 0 && rc != 127 && rc != BN_PERFTEST_HUNG; attempt++) {
    usleep(100000);
    rc = bn_perftest_client(port, test, n, iters, passive, out, sizeof(out));
    if (rc == 0 && bn_parse_final(out, p50_us, mibs) != 0)
      rc = -1;
  }
  kill(server, SIGTERM);
  waitpid(server, NULL, 0);
  return rc;
}

/* One round of ucx_perftest, default (f) and passive (fo); 0, 127 when it
 * is not installed, another code when a default run failed. A passive run
 * that cannot complete on this transport (BN_PERFTEST_HUNG once: the rest
 * are not tried) is recorded as not measured (-1). */
static int bn_perftest_round(int quick, bn_figures *f, bn_figures *fo) {
  bool passive = true;
  for (size_t k = 0; k < BN_NSIZES; k++) {
    int it = bn_iterations(bn_sizes[k], quick), lat_it = it < 100 ? it : 100, rc;
    double unused;
    if ((rc = bn_perftest("ucp_put_bw", bn_sizes[k], it, 0, &unused, &f[k].put_mibs)) != 0 ||
        (rc = bn_perftest("ucp_get", bn_sizes[k], it, 0, &unused, &f[k].get_mibs)) != 0 ||
        (rc = bn_perftest("ucp_put_lat", bn_sizes[k], lat_it, 0, &f[k].put_lat_us, &unused)) != 0)
      return rc;
    fo[k].put_mibs = fo[k].get_mibs = fo[k].put_lat_us = -1;
    if (passive && (bn_perftest("ucp_put_bw", bn_sizes[k], it, 1, &unused, &fo[k].put_mibs) != 0 ||
                    bn_perftest("ucp_get", bn_sizes[k], it, 1, &unused, &fo[k].get_mibs) != 0)) {
      fprintf(stderr, "bench_net: ucx_perftest -o (passive responder) does not complete here\n");
      fo[k].put_mibs = fo[k].get_mibs = -1;
      passive = false;
    }
  }
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Figures over rounds */

typedef struct bn_stat {
  double median, spread; /* spread: (max - min) / median */
} bn_stat;

/* field: offset of a double in bn_figures. */
static bn_stat bn_over_rounds(const bn_side *s, int rounds, size_t k, size_t field) {
  double v[BN_MAX_ROUNDS], lo, hi;
  bn_stat st;
  for (int r = 0; r < rounds; r++)
    memcpy(&v[r], (const char *)&s->f[r][k] + field, sizeof(double));
  st.median = bench_median(v, rounds); /* sorts v */
  lo = v[0];
  hi = v[rounds - 1];
  st.spread = st.median > 0 ? (hi - lo) / st.median : -1;
  return st;
}

#define BN_FIELD(name) offsetof(bn_figures, name)

/* Medians over rounds of both kinds of unimem buffer (a kind not measured
 * has -1 everywhere), of ucx_perftest and of its passive run. */
static void bn_row(bench_report *rep, const char *op, size_t k, int rounds, const bn_side *um,
                   const bn_side *ua, const bn_side *pt, const bn_side *po, size_t field) {
  char name[64], size[32];
  bn_stat u = bn_over_rounds(um, rounds, k, field), p = bn_over_rounds(pt, rounds, k, field);
  bn_stat o = bn_over_rounds(po, rounds, k, field), a = bn_over_rounds(ua, rounds, k, field);
  bench_row *row;
  bench_size_text(size, sizeof(size), bn_sizes[k]);
  snprintf(name, sizeof(name), "%s %s", op, size);
  row = bench_add_row(rep, "net", name);
  bench_set_text(row, "op", op);
  bench_set(row, "bytes", (double)bn_sizes[k]);
  bench_set(row, "unimem_mibs", u.median);
  bench_set(row, "perftest_mibs", p.median);
  bench_set(row, "perftest_passive_mibs", o.median);
  bench_set(row, "ratio", p.median > 0 && u.median > 0 ? u.median / p.median : -1);
  bench_set(row, "unimem_alloc_mibs", a.median);
  bench_set(row, "ratio_alloc", p.median > 0 && a.median > 0 ? a.median / p.median : -1);
  bench_set(row, "unimem_alloc_spread", a.spread);
  bench_set(row, "unimem_spread", u.spread);
  bench_set(row, "perftest_spread", p.spread);
  /* Time per transfer, for the chart (ns). */
  bench_set(row, "unimem_ns", u.median > 0 ? bn_sizes[k] / (u.median * 1048576.0) * 1e9 : -1);
  bench_set(row, "unimem_alloc_ns", a.median > 0 ? bn_sizes[k] / (a.median * 1048576.0) * 1e9 : -1);
  bench_set(row, "perftest_ns", p.median > 0 ? bn_sizes[k] / (p.median * 1048576.0) * 1e9 : -1);
  printf("%-4s %8s | %9.1f %9.1f %9.1f %9.1f | %6.2f %7.2f | %6.2f %6.2f %6.2f\n", op, size, u.median,
         a.median, p.median, o.median, p.median > 0 && u.median > 0 ? u.median / p.median : -1,
         p.median > 0 && a.median > 0 ? a.median / p.median : -1, u.spread, a.spread, p.spread);
}

static void bn_latency_row(bench_report *rep, size_t k, int rounds, const bn_side *um, const bn_side *ua,
                           const bn_side *pt) {
  char name[64], size[32];
  bn_stat u = bn_over_rounds(um, rounds, k, BN_FIELD(put_lat_us));
  bn_stat a = bn_over_rounds(ua, rounds, k, BN_FIELD(put_lat_us));
  bn_stat p = bn_over_rounds(pt, rounds, k, BN_FIELD(put_lat_us));
  bench_row *row;
  bench_size_text(size, sizeof(size), bn_sizes[k]);
  snprintf(name, sizeof(name), "put latency %s", size);
  row = bench_add_row(rep, "net_latency", name);
  bench_set(row, "bytes", (double)bn_sizes[k]);
  bench_set(row, "unimem_us", u.median);
  bench_set(row, "unimem_alloc_us", a.median);
  bench_set(row, "perftest_us", p.median);
  bench_set(row, "unimem_ns", u.median * 1e3);
  bench_set(row, "perftest_ns", p.median * 1e3);
  printf("lat  %8s | %9.1f %9.1f %9.1f us\n", size, u.median, a.median, p.median);
}

static void bn_report(bench_report *rep, int rounds, const bn_side *um, const bn_side *ua, const bn_side *pt,
                      const bn_side *po) {
  printf("\num_net vs ucx_perftest (MiB/s, medians of %d rounds; spread = (max - min) / median;\n"
         "unimem: buffers of um_alloc, net_alloc: buffers of um_net_alloc; -1: not measured)\n",
         rounds);
  printf("%-4s %8s | %9s %9s %9s %9s | %6s %7s | %6s %6s %6s\n", "op", "size", "unimem", "net_alloc",
         "perftest", "pt -o", "ratio", "r alloc", "spr um", "spr na", "spr pt");
  for (size_t k = 0; k < BN_NSIZES; k++)
    bn_row(rep, "put", k, rounds, um, ua, pt, po, BN_FIELD(put_mibs));
  for (size_t k = 0; k < BN_NSIZES; k++)
    bn_row(rep, "get", k, rounds, um, ua, pt, po, BN_FIELD(get_mibs));
  printf("\nput latency (unimem, net_alloc, perftest): unimem's is one blocking um_net_put, complete at\n"
         "the target (admission, data, flush); ucx_perftest's is half a put ping-pong (50th percentile)\n");
  for (size_t k = 0; k < BN_NSIZES; k++)
    bn_latency_row(rep, k, rounds, um, ua, pt);
}

/* ------------------------------------------------------------------------ */
/* The benchmark */

/* A side not measured: -1 everywhere. */
static void bn_unmeasured(bn_side *s) {
  for (int r = 0; r < BN_MAX_ROUNDS; r++)
    for (size_t k = 0; k < BN_NSIZES; k++)
      s->f[r][k].put_mibs = s->f[r][k].get_mibs = s->f[r][k].put_lat_us = -1;
}

/* Rounds of every side, alternating; 0, BENCH_SKIPPED or 1. kinds: a bit
 * per kind of unimem buffer measured. */
static int bn_measure(int quick, int rounds, unsigned kinds, bn_side *um[BN_KINDS], bn_side *pt, bn_side *po) {
  bn_procs p[BN_KINDS];
  int rc = 0, started = 0;
  for (int kind = 0; kind < BN_KINDS; kind++) {
    if (!(kinds & (1u << kind))) {
      bn_unmeasured(um[kind]);
      continue;
    }
    if (bn_procs_start(&p[kind], quick, kind) != 0)
      rc = 1;
    else
      started |= 1 << kind;
  }
  for (int r = 0; r < rounds && rc == 0; r++) {
    fprintf(stderr, "bench_net: round %d of %d\n", r + 1, rounds);
    for (int kind = 0; kind < BN_KINDS && rc == 0; kind++)
      if ((started & (1 << kind)) && (rc = bn_procs_round(&p[kind], um[kind]->f[r])) != 0 && rc != BENCH_SKIPPED) {
        fprintf(stderr, "bench_net: the unimem side (%s buffers) failed (%d)\n", bn_kind_names[kind], rc);
        rc = 1;
      }
    if (rc == BENCH_SKIPPED) {
      printf("bench_net: UCX is not available here: skipped\n");
    } else if (rc != 0) {
      /* reported above */
    } else if ((rc = bn_perftest_round(quick, pt->f[r], po->f[r])) == 127) {
      printf("bench_net: ucx_perftest is not installed (Debian: ucx-utils): skipped\n");
      rc = BENCH_SKIPPED;
    } else if (rc != 0) {
      fprintf(stderr, "bench_net: ucx_perftest did not run\n");
      rc = 1;
    }
  }
  /* The later pairs first: their processes inherited the earlier pairs'
   * command pipes, whose issuers end at EOF only once every copy is gone. */
  for (int kind = BN_KINDS - 1; kind >= 0; kind--)
    if (started & (1 << kind))
      bn_procs_stop(&p[kind]);
  return rc;
}

static int bn_args(int argc, char **argv, int *quick, int *rounds, unsigned *kinds) {
  *kinds = (1u << BN_POOL) | (1u << BN_ALLOC);
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--quick") == 0) {
      *quick = 1;
    } else if (strcmp(argv[i], "--unimem") == 0 && i + 1 < argc) {
      const char *k = argv[++i];
      if (strcmp(k, "pool") == 0) {
        *kinds = 1u << BN_POOL;
      } else if (strcmp(k, "alloc") == 0) {
        *kinds = 1u << BN_ALLOC;
      } else if (strcmp(k, "both") != 0) {
        fprintf(stderr, "bench_net: --unimem takes pool, alloc or both\n");
        return 2;
      }
    } else if (strcmp(argv[i], "--inflight") == 0 && i + 1 < argc) {
      bn_inflight = atoi(argv[++i]);
      if (bn_inflight < 1 || bn_inflight > BN_INFLIGHT) {
        fprintf(stderr, "bench_net: --inflight takes 1 to %d\n", BN_INFLIGHT);
        return 2;
      }
    } else if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc) {
      *rounds = atoi(argv[++i]);
      if (*rounds < 1 || *rounds > BN_MAX_ROUNDS) {
        fprintf(stderr, "bench_net: --rounds takes 1 to %d\n", BN_MAX_ROUNDS);
        return 2;
      }
    } else {
      fprintf(stderr, "usage: bench_net [--quick] [--json FILE] [--rounds N] [--unimem pool|alloc|both] "
                      "[--inflight N]\n");
      return 2;
    }
  }
  if (*rounds == 0)
    *rounds = *quick ? 2 : 5;
  return 0;
}

int um_bench_net_main(int argc, char **argv, bench_report *rep) {
  static bn_side um, ua, pt, po;
  bn_side *sides[BN_KINDS] = {&um, &ua};
  const char *tls = getenv("UCX_TLS");
  unsigned kinds;
  int quick = 0, rounds = 0, rc = bn_args(argc, argv, &quick, &rounds, &kinds);
  if (rc != 0)
    return rc;
  if ((rc = bn_measure(quick, rounds, kinds, sides, &pt, &po)) != 0)
    return rc;
  bench_set_bool(&rep->facts, "quick", quick);
  bench_set_text(&rep->facts, "device", "two processes over UCX");
  bench_set_text(&rep->facts, "ucx_tls", tls != NULL ? tls : "(UCX's choice)");
  bench_set(&rep->facts, "rounds", rounds);
  bench_set(&rep->facts, "target_bytes", BN_TARGET_BYTES);
  bench_set(&rep->facts, "inflight", bn_inflight);
  bench_set_text(&rep->facts, "unimem_buffers",
                 kinds == 3u ? "um_alloc and um_net_alloc" : kinds == 1u ? "um_alloc" : "um_net_alloc");
  printf("UCX_TLS=%s, two processes on this machine\n", tls != NULL ? tls : "(UCX's choice)");
  bn_report(rep, rounds, &um, &ua, &pt, &po);
  return 0;
}

#ifndef UM_BENCH_NO_MAIN
int main(int argc, char **argv) { return bench_program_main(argc, argv, "net", um_bench_net_main); }
#endif
