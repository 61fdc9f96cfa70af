/* Exchanging um_net blobs between processes: a socketpair made before
 * fork(), or a TCP socket on 127.0.0.1, carrying length-prefixed blobs.
 *
 * For the tests and `unimem bench net` (bench_net.c); it lives in bench/ so
 * that the installed tool compiles nothing from tests/. Deliberately not part
 * of unimem's API. Exchanging addresses and keys is the application's job,
 * done over whatever it already has (MPI, PMIx, its own RPC, a file); a
 * socket helper in the library would make unimem own a second network
 * channel, with its own security (a key blob is a capability) and failure
 * semantics, for code that only tests and demos need.
 *
 * Every wait is bounded (timeout_ms): a dead peer never hangs a test.
 * Functions return 0, or -1 with errno set (ETIMEDOUT on a timeout,
 * EMSGSIZE when a blob does not fit, EPIPE when the peer closed). */
#ifndef UNIMEM_NET_BOOTSTRAP_H
#define UNIMEM_NET_BOOTSTRAP_H

#include <stddef.h>
#include <stdint.h>

/* A connected pair of stream sockets, to be split across fork(). */
int nb_pair(int fds[2]);
/* Listen on 127.0.0.1 at an ephemeral port; *port receives it. */
int nb_listen(int *fd, uint16_t *port);
/* Accept one connection on a listening socket. */
int nb_accept(int lfd, int timeout_ms, int *fd);
/* Connect to 127.0.0.1:port, retrying until the listener is up. */
int nb_connect(uint16_t port, int timeout_ms, int *fd);
/* Send one blob: a 4-byte little-endian length, then the bytes. */
int nb_send(int fd, const void *blob, size_t len);
/* Receive one blob into buf[0..cap); *len receives its length. */
int nb_recv(int fd, void *buf, size_t cap, size_t *len, int timeout_ms);

#endif /* UNIMEM_NET_BOOTSTRAP_H */
