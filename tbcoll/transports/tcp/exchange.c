/* tcp's moves in C, without Python: see exchange.h. */
#include "exchange.h"

#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>

#include "../../include/reduce.h"

#ifdef MSG_NOSIGNAL
#define SEND_FLAGS (MSG_DONTWAIT | MSG_NOSIGNAL)
#else /* macOS: Python ignores SIGPIPE, so a closed peer gives EPIPE there too */
#define SEND_FLAGS MSG_DONTWAIT
#endif

ssize_t send_one(int fd, const void *header, size_t header_len, const void *payload,
                 size_t payload_len)
{
    struct iovec parts[2] = {{(void *)header, header_len}, {(void *)payload, payload_len}};
    struct msghdr message = {0};
    message.msg_iov = parts;
    message.msg_iovlen = payload_len ? 2 : 1;
    ssize_t sent;
    do {
        sent = sendmsg(fd, &message, SEND_FLAGS);
    } while (sent < 0 && errno == EINTR);
    if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        return 0;
    return sent;
}

static double seconds_since(const struct timespec *start)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (now.tv_sec - start->tv_sec) + 1e-9 * (now.tv_nsec - start->tv_nsec);
}

/*
 * Read up to n bytes into to, waiting as exchange.h describes until some come or budget
 * seconds have passed since start. Returns the bytes read, or 0 with *error set to 0 when none
 * came in time, CLOSED at the end of the stream, or the errno of a failed connection.
 */
static ssize_t read_some(int fd, char *to, size_t n, const struct timespec *start, double spin,
                         double budget, int *error)
{
    for (;;) {
        ssize_t got = recv(fd, to, n, MSG_DONTWAIT);
        if (got > 0)
            return got;
        *error = got == 0 ? CLOSED : errno;
        if (got == 0)
            return 0;
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return 0;
        *error = 0;
        double waited = seconds_since(start);
        if (waited >= budget)
            return 0;
        if (waited < spin) {
            sched_yield();
            continue;
        }
        struct pollfd one = {fd, POLLIN, 0};
        int ms = (int)((budget - waited) * 1000) + 1;
        if (poll(&one, 1, ms) < 0 && errno != EINTR) {
            *error = errno;
            return 0;
        }
    }
}

struct received receive_one(int fd, const char *expected, char *dst, ptrdiff_t len, char *stage,
                            ptrdiff_t stage_len, double spin, double budget)
{
    struct received r = {-1, 0, 0};
    size_t whole = HEADER_BYTES + (size_t)len;
    size_t first = whole < (size_t)stage_len ? whole : (size_t)stage_len;
    struct timespec start;
    clock_gettime(CLOCK_MONOTONIC, &start);
    while (r.staged < HEADER_BYTES) {
        ssize_t got = read_some(fd, stage + r.staged, first - r.staged, &start, spin, budget,
                                &r.error);
        if (got == 0)
            return r;
        r.staged += got;
    }
    if (memcmp(stage, expected, HEADER_BYTES) != 0) {
        r.copied = -2;
        return r;
    }
    r.copied = r.staged - HEADER_BYTES;
    memcpy(dst, stage + HEADER_BYTES, r.copied);
    r.staged = 0;
    while (r.copied < len) {
        ssize_t got = read_some(fd, dst + r.copied, len - r.copied, &start, spin, budget,
                                &r.error);
        if (got == 0)
            break;
        r.copied += got;
    }
    return r;
}

void ways_begin(struct way *ways, int n, const int *fds, char *const *stages,
                const ptrdiff_t *stage_lens, char *blocks, size_t len)
{
    size_t whole = HEADER_BYTES + len;
    memset(ways, 0, n * sizeof *ways);
    for (int i = 0; i < n; i++) {
        ways[i].fd = fds[i];
        ways[i].r.copied = -1;
        ways[i].stage = stages[i];
        ways[i].block = blocks + i * len;
        ways[i].first = whole < (size_t)stage_lens[i] ? whole : (size_t)stage_lens[i];
    }
}

/* Write what the socket takes now of header and payload from the way's offset. */
static int send_some(struct way *w, const char *header, const char *payload, size_t len)
{
    size_t whole = HEADER_BYTES + len;
    if (w->sent >= whole || w->send_error)
        return 0;
    ssize_t n = w->sent < HEADER_BYTES
        ? send_one(w->fd, header + w->sent, HEADER_BYTES - w->sent, payload, len)
        : send_one(w->fd, payload + (w->sent - HEADER_BYTES), whole - w->sent, NULL, 0);
    if (n < 0)
        w->send_error = errno;
    else
        w->sent += (size_t)n;
    return n > 0;
}

/* Read what the socket has now for the way's receive (see receive_one for the rules). */
static int receive_some(struct way *w, const char *expected, ptrdiff_t len)
{
    if (w->received)
        return 0;
    int header_phase = w->r.copied < 0;
    char *to = header_phase ? w->stage + w->r.staged : w->block + w->r.copied;
    size_t room = header_phase ? w->first - (size_t)w->r.staged : (size_t)(len - w->r.copied);
    ssize_t got = room ? recv(w->fd, to, room, MSG_DONTWAIT) : 0;
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return 0;
    if (got <= 0 && room) {
        w->r.error = got == 0 ? CLOSED : errno;
        w->received = 1;
        return 0;
    }
    if (header_phase) {
        w->r.staged += got;
        if (w->r.staged < HEADER_BYTES)
            return 1;
        if (memcmp(w->stage, expected, HEADER_BYTES) != 0) {
            w->r.copied = -2;
            w->received = 1;
            return 1;
        }
        w->r.copied = w->r.staged - HEADER_BYTES;
        memcpy(w->block, w->stage + HEADER_BYTES, w->r.copied);
        w->r.staged = 0;
    } else {
        w->r.copied += got;
    }
    w->received = w->r.copied == len;
    return 1;
}

/* A reduction made while the blocks arrive (exchange_reduce): out[:done] is reduced; own is
 * this rank's row. */
struct reduction {
    char *out;
    const char *own;
    int rank, dtype, op;
    size_t done;
};

/* Bytes every block holds and out has not, reduced in pieces of at least this many (or the
 * rest): a piece read from the socket a moment ago is still in the cache, and the reduction
 * runs while the peers' bytes keep coming into the socket's buffer. */
#define REDUCE_PIECE (64 << 10)

/* rows[0..others] = each rank's row of len-byte blocks, from byte `at` on, in rank order:
 * own for this rank's, else its block among blocks (every other rank's, in rank order) */
static void rows_in_rank_order(const char **rows, const char *blocks, const char *own,
                               int rank, int others, size_t len, size_t at)
{
    for (int k = 0; k <= others; k++)
        rows[k] = (k == rank ? own : blocks + (k < rank ? k : k - 1) * len) + at;
}

/* Whether n bytes at a and at b share none. */
static int apart(const char *a, const char *b, size_t n)
{
    return a >= b + n || b >= a + n;
}

/* Reduce the bytes that every way's block now holds past red->done, once they make a piece,
 * or once everything has come (all). */
static void reduce_arrived(const struct way *ways, int n, size_t len, struct reduction *red,
                           int all)
{
    size_t ready = len;
    for (int i = 0; i < n; i++) {
        size_t got = ways[i].r.copied > 0 ? (size_t)ways[i].r.copied : 0;
        ready = got < ready ? got : ready;
    }
    ready -= ready % ITEMSIZE[red->dtype];
    if (ready <= red->done || (ready - red->done < REDUCE_PIECE && !(all && ready == len)))
        return;
    const char *rows[MAX_PEERS + 1];
    /* (ways_begin lays the ways' blocks one after another from ways[0].block) */
    rows_in_rank_order(rows, ways[0].block, red->own, red->rank, n, len, red->done);
    reduce_rows(rows, n + 1, red->out + red->done,
                (ptrdiff_t)((ready - red->done) / ITEMSIZE[red->dtype]), red->dtype, red->op);
    red->done = ready;
}

/* Send header and mine[:len] on every way while receiving each way's message of the same
 * header into its block (both ways at once, so that large messages cannot deadlock), and
 * where red is not NULL reduce what has arrived, until everything has moved (0) or it
 * stopped (1: see exchange_reduce). */
static int exchange_ways(struct way *ways, int n, const char *header, const char *mine,
                         size_t len, double spin, double budget, struct reduction *red)
{
    size_t whole = HEADER_BYTES + len;
    struct timespec since; /* the last progress */
    clock_gettime(CLOCK_MONOTONIC, &since);
    for (;;) {
        int moved = 0, pending = 0, stopped = 0;
        struct pollfd waits[MAX_PEERS];
        for (int i = 0; i < n; i++) {
            struct way *w = &ways[i];
            moved |= send_some(w, header, mine, len);
            moved |= receive_some(w, header, (ptrdiff_t)len);
            stopped |= w->send_error || (w->received && w->r.copied != (ptrdiff_t)len);
            waits[i].fd = w->fd;
            waits[i].events = (w->sent < whole ? POLLOUT : 0) | (w->received ? 0 : POLLIN);
            pending |= waits[i].events;
        }
        if (red && !stopped)
            reduce_arrived(ways, n, len, red, !pending);
        if (stopped || !pending)
            return stopped;
        if (moved) {
            clock_gettime(CLOCK_MONOTONIC, &since);
            continue;
        }
        double waited = seconds_since(&since);
        if (waited >= budget)
            return 1;
        if (waited < spin) {
            sched_yield();
            continue;
        }
        poll(waits, n, (int)((budget - waited) * 1000) + 1); /* EINTR: look again */
    }
}

int exchange_reduce(struct way *ways, int n, const char *header, const char *mine, size_t len,
                    double spin, double budget, char *out, const char *own, int rank, int dtype,
                    int op)
{
    own = own ? own : mine;
    /* out apart from what is sent and from own: reduced piece by piece as the blocks come;
     * else once they all have (mine must go out whole to every peer before any of it is
     * overwritten, and own stays whole for the engine should the exchange stop) */
    int early = out && apart(out, mine, len) && apart(out, own, len);
    struct reduction red = {out, own, rank, dtype, op, 0};
    int stopped = exchange_ways(ways, n, header, mine, len, spin, budget, early ? &red : NULL);
    if (stopped || out == NULL || early)
        return stopped;
    return reduce_in_rank_order(ways[0].block, own, rank, n, out, len, dtype, op) < 0 ? -1 : 0;
}

int reduce_in_rank_order(const char *blocks, const char *mine, int rank, int others, char *out,
                         size_t len, int dtype, int op)
{
    if (!len)
        return 0;
    const char *rows[MAX_PEERS + 1];
    const char *own = mine;
    char *copy = NULL;
    /* out is written from the first pass on, which reads rows 0 and 1 at each index before
     * it writes there (reduce.h): mine must survive that unless it is one of those rows and
     * out exactly */
    if (!apart(out, mine, len) && !(rank <= 1 && out == mine)) {
        own = copy = malloc(len);
        if (copy == NULL)
            return -1;
        memcpy(copy, mine, len);
    }
    rows_in_rank_order(rows, blocks, own, rank, others, len, 0);
    reduce_rows(rows, others + 1, out, (ptrdiff_t)(len / ITEMSIZE[dtype]), dtype, op);
    free(copy);
    return 0;
}
