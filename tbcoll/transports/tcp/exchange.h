/*
 * tcp's moves in C, without Python (exchange.c): a whole message of the stream engine (its
 * 32-byte header, then the payload; tbcoll/include/wire.h) written with one sendmsg, the next
 * message read straight into its destination when it is the one expected, one message to and
 * from every peer of a group both ways at once (an exchange), and the reduction of the blocks
 * in rank order. Whatever else comes (another message first, a peer that is slow or gone) is
 * handed back as it stands, for the engine (tbcoll/transports/stream/) to go on from.
 *
 * Nothing here shares memory with another process or thread: the bytes travel through the
 * kernel's socket, which orders them, so no atomics or fences are needed on any CPU (ARM64
 * included). Waiting looks at the socket (a non-blocking recv) and yields the core between
 * looks for `spin` seconds, as the engine's waits do (TcpTransport._polled), then sleeps in
 * poll(). Every function here runs without the GIL.
 *
 * Layers of tbcoll.transports.tcp._sockets: exchange.c (this: pure C), tcp_lane.c (the Lane type:
 * a whole all_reduce in one call), _sockets.c (the module's functions and init).
 */
#ifndef TBCOLL_EXCHANGE_H
#define TBCOLL_EXCHANGE_H

#include <stddef.h>
#include <sys/types.h> /* ssize_t */

#include "../../include/wire.h" /* HEADER_BYTES */

/* hidden: called directly between the module's files, seen by no other module */
#define INTERNAL __attribute__((visibility("hidden")))

#define MAX_PEERS 16 /* of one exchange */
#define CLOSED (-1)  /* the error of a stream its peer has closed */

/* One non-blocking sendmsg of header and payload: the bytes written (0 when the socket has no
 * room now), or -1 (errno set). */
INTERNAL ssize_t send_one(int fd, const void *header, size_t header_len, const void *payload,
                          size_t payload_len);

/* A receive's outcome: copied, the payload bytes in its destination (-1 if no whole header
 * came in time, -2 if the next message is another one: then stage[:staged] holds what was
 * read of the stream, for the engine to parse); error 0, CLOSED, or an errno. */
struct received {
    ptrdiff_t copied, staged;
    int error;
};

/* The next message of fd if its header is `expected`, its payload into dst[:len] (the first
 * read lands in stage, bounded by this message's length), waiting up to budget seconds. */
INTERNAL struct received receive_one(int fd, const char *expected, char *dst, ptrdiff_t len,
                                     char *stage, ptrdiff_t stage_len, double spin,
                                     double budget);

/* One peer of an exchange: how far its send and its receive have got. */
struct way {
    int fd;
    size_t sent;       /* bytes of header and payload written */
    int send_error;    /* errno of a failed send */
    struct received r; /* copied -1 until the header is whole and matches, -2 if not */
    int received;      /* the receive is over: whole, another message, or an error */
    char *stage, *block;
    size_t first;      /* the first read's bound: this message's length, or the stage's */
};

/* ways[i] set up to send to fds[i] and receive its message of len bytes into block i of
 * blocks, through its stage (stages[i], stage_lens[i] >= HEADER_BYTES bytes). */
INTERNAL void ways_begin(struct way *ways, int n, const int *fds, char *const *stages,
                         const ptrdiff_t *stage_lens, char *blocks, size_t len);

/* Send header and mine[:len] on every way while receiving each way's message of the same
 * header into its block (both ways at once, so that large messages cannot deadlock), until
 * everything has moved or it stopped (another message first, a failed connection, or budget
 * seconds without progress; the ways say how far each got). Where out is not NULL, out[:len]
 * = the blocks and own (mine where NULL: this rank's row) op'ed in rank order as
 * reduce_in_rank_order makes it (rank, dtype, op), made while the blocks come where out is
 * apart from mine and own. 0: all moved (and reduced); 1: stopped (out's bytes are then to be
 * made again from the blocks once whole: mine and own are untouched); -1: no memory was left
 * to reduce. */
INTERNAL int exchange_reduce(struct way *ways, int n, const char *header, const char *mine,
                             size_t len, double spin, double budget, char *out, const char *own,
                             int rank, int dtype, int op);

/* out[:len] = the blocks of ranks 0, 1, ..., `others` op'ed in rank order (every rank
 * computes the same bits), where blocks holds every other rank's block in rank order and
 * mine is this rank's (out may be mine, or overlap it). dtype and op: wire.h's codes. 0, or
 * -1 where no memory was left for a copy of mine. */
INTERNAL int reduce_in_rank_order(const char *blocks, const char *mine, int rank, int others,
                                  char *out, size_t len, int dtype, int op);

#endif
