/* Put/get ping-pong between two processes with um_net (SPEC §10).
 *
 * The parent forks a peer; the two exchange their address and key blobs
 * over a socketpair (any channel the application already has would do:
 * MPI, a file, its own RPC). Each exposes a HOST buffer of um_net_alloc
 * (the memory to expose: UCX allocated it). For each round,
 * the "ping" side puts a pattern into the peer's buffer and tells it so;
 * the "pong" side checks it, gets the ping side's own pattern back from
 * the ping side's buffer, checks that too, and answers. Every byte is
 * checked on both sides.
 *
 * Exits 0 when every round matched, 77 when this unimem has no UCX (the
 * test is then skipped), 1 otherwise. UCX_TLS picks the transport.
 */
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "unimem.h"

#define BYTES (1u << 20)
#define ROUNDS 8
#define WAIT_MS 30000 /* a message from the peer; nothing waits longer */
#define SKIPPED 77

static int fail(const char *who, const char *what, int st) {
  fprintf(stderr, "net_pingpong (%s): %s: %s (%s)\n", who, what, um_err_name(st), um_last_error());
  return st == UM_ENOTSUP ? SKIPPED : 1;
}

/* ------------------------------------------------------------------------ */
/* Blobs over the socket: a 4-byte length, then the bytes; bounded waits. */

static int wait_readable(int fd) {
  struct pollfd p = {.fd = fd, .events = POLLIN, .revents = 0};
  return poll(&p, 1, WAIT_MS) == 1 ? 0 : -1;
}

static int send_blob(int fd, const void *blob, uint32_t len) {
  if (write(fd, &len, sizeof(len)) != (ssize_t)sizeof(len))
    return -1;
  return write(fd, blob, len) == (ssize_t)len ? 0 : -1;
}

static int recv_all(int fd, void *buf, size_t len) {
  for (size_t got = 0; got < len;) {
    ssize_t r;
    if (wait_readable(fd) != 0 || (r = read(fd, (char *)buf + got, len - got)) <= 0)
      return -1;
    got += (size_t)r;
  }
  return 0;
}

static int recv_blob(int fd, void *buf, size_t cap, size_t *len) {
  uint32_t n;
  if (recv_all(fd, &n, sizeof(n)) != 0 || n > cap)
    return -1;
  *len = n;
  return recv_all(fd, buf, n);
}

/* ------------------------------------------------------------------------ */
/* One side */

typedef struct side {
  const char *name;
  int fd;
  um_manager *m;
  um_net *net;
  um_endpoint *ep;
  um_buffer *mine;  /* exposed: the peer puts here and gets from here */
  um_buffer *local; /* what this side puts from and gets into */
  unsigned char peer_key[4096];
  size_t peer_key_len;
} side;

static unsigned char pattern(unsigned seed, size_t i) { return (unsigned char)(seed * 29u + i * 13u + (i >> 10)); }

/* Whether p holds pattern seed, every byte: made in a buffer of our own,
 * then one memcmp over the memory the peer wrote (a race detector then
 * sees one access of the whole range, not a million of one byte each). */
static int matches(const unsigned char *p, unsigned seed) {
  unsigned char *want = malloc(BYTES);
  int same;
  if (want == NULL)
    return 0;
  for (size_t i = 0; i < BYTES; i++)
    want[i] = pattern(seed, i);
  same = memcmp(p, want, BYTES) == 0;
  free(want);
  return same;
}

/* Manager, net, endpoint to the peer, the two buffers, keys exchanged. */
static int side_open(side *s) {
  unsigned char blob[4096], peer[4096];
  size_t len = sizeof(blob), plen;
  int st;
  if ((st = um_manager_create(NULL, &s->m)) != UM_OK)
    return fail(s->name, "um_manager_create", st);
  if ((st = um_net_create(s->m, &s->net)) != UM_OK)
    return fail(s->name, "um_net_create", st);
  if ((st = um_net_address(s->net, blob, &len)) != UM_OK)
    return fail(s->name, "um_net_address", st);
  if (send_blob(s->fd, blob, (uint32_t)len) != 0 || recv_blob(s->fd, peer, sizeof(peer), &plen) != 0)
    return fail(s->name, "address exchange", UM_EBACKEND);
  if ((st = um_net_connect(s->net, peer, plen, &s->ep)) != UM_OK)
    return fail(s->name, "um_net_connect", st);
  /* Buffers that cross the network come from um_net_alloc: memory UCX
   * allocated, which its shared-memory transports let the peer reach with
   * plain loads and stores (a buffer of um_alloc works too, through UCX's
   * slower software RMA there). They are released before um_net_destroy. */
  if ((st = um_net_alloc(s->net, BYTES, UM_ALLOC_ZERO, &s->mine)) != UM_OK ||
      (st = um_net_alloc(s->net, BYTES, UM_ALLOC_ZERO, &s->local)) != UM_OK)
    return fail(s->name, "um_net_alloc", st);
  len = sizeof(blob);
  if ((st = um_net_expose(s->mine, blob, &len)) != UM_OK)
    return fail(s->name, "um_net_expose", st);
  if (send_blob(s->fd, blob, (uint32_t)len) != 0 ||
      recv_blob(s->fd, s->peer_key, sizeof(s->peer_key), &s->peer_key_len) != 0)
    return fail(s->name, "key exchange", UM_EBACKEND);
  return 0;
}

/* Releasing an exposed buffer unexposes it; the peer is done with ours
 * once it said so (the last message of the rounds). Buffers of
 * um_net_alloc go before their net: um_net_destroy answers UM_EBUSY while
 * one is live. */
static int side_close(side *s) {
  int st;
  if ((st = um_endpoint_close(s->ep)) != UM_OK || (st = um_release(s->mine)) != UM_OK ||
      (st = um_release(s->local)) != UM_OK || (st = um_net_destroy(s->net)) != UM_OK ||
      (st = um_manager_destroy(s->m)) != UM_OK)
    return fail(s->name, "teardown", st);
  return 0;
}

/* ping: put pattern r into the peer's buffer, with an event; say so. */
static int ping_round(side *s, unsigned r) {
  unsigned char *p = um_buffer_host_ptr(s->local), msg;
  um_event *done;
  size_t len;
  int st;
  for (size_t i = 0; i < BYTES; i++)
    p[i] = pattern(r, i);
  memcpy(um_buffer_host_ptr(s->mine), p, BYTES); /* the pong side gets this back */
  if ((st = um_net_put(s->ep, s->local, 0, s->peer_key, s->peer_key_len, 0, BYTES, &done)) != UM_OK)
    return fail(s->name, "um_net_put", st);
  st = um_event_wait(done); /* complete: the bytes are in the peer's memory */
  um_event_release(done);
  if (st != UM_OK)
    return fail(s->name, "put completion", st);
  if (send_blob(s->fd, &r, sizeof(r)) != 0 || recv_blob(s->fd, &msg, 1, &len) != 0 || msg != 'k')
    return fail(s->name, "the pong side's answer", UM_EBACKEND);
  return 0;
}

/* pong: the ping side's put is in our buffer; get its copy back too. */
static int pong_round(side *s, unsigned r) {
  unsigned got;
  size_t len;
  int st;
  if (recv_blob(s->fd, &got, sizeof(got), &len) != 0 || got != r)
    return fail(s->name, "the ping side's message", UM_EBACKEND);
  if (!matches(um_buffer_host_ptr(s->mine), r))
    return fail(s->name, "the put's bytes differ", UM_EBACKEND);
  memset(um_buffer_host_ptr(s->local), 0, BYTES);
  if ((st = um_net_get(s->ep, s->local, 0, s->peer_key, s->peer_key_len, 0, BYTES, NULL)) != UM_OK)
    return fail(s->name, "um_net_get", st);
  if (!matches(um_buffer_host_ptr(s->local), r))
    return fail(s->name, "the get's bytes differ", UM_EBACKEND);
  return send_blob(s->fd, "k", 1) == 0 ? 0 : fail(s->name, "answer", UM_EBACKEND);
}

static int run_side(side *s, int ping) {
  int rc = side_open(s);
  for (unsigned r = 1; r <= ROUNDS && rc == 0; r++)
    rc = ping ? ping_round(s, r) : pong_round(s, r);
  if (rc == 0)
    rc = side_close(s);
  if (rc == 0)
    printf("net_pingpong (%s): %d rounds of %u bytes, put and get, every byte checked\n", s->name, ROUNDS,
           BYTES);
  return rc;
}

int main(void) {
  int fds[2], status, rc;
  pid_t peer;
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) {
    perror("socketpair");
    return 1;
  }
  fflush(stdout);
  if ((peer = fork()) < 0) {
    perror("fork");
    return 1;
  }
  if (peer == 0) {
    side pong = {.name = "pong", .fd = fds[1]};
    close(fds[0]);
    exit(run_side(&pong, 0));
  }
  close(fds[1]);
  side ping = {.name = "ping", .fd = fds[0]};
  rc = run_side(&ping, 1);
  close(fds[0]); /* a pong side still waiting sees the end at once */
  if (waitpid(peer, &status, 0) != peer || !WIFEXITED(status))
    return 1;
  if (rc == SKIPPED || WEXITSTATUS(status) == SKIPPED)
    return SKIPPED;
  return rc != 0 || WEXITSTATUS(status) != 0 ? 1 : 0;
}
