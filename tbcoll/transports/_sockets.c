/*
 * The tcp transport's small-message path in C (tbcoll/transports/tcp.py): a whole message
 * of the stream engine (tbcoll/transports/stream.py: a 32-byte header, then the payload)
 * written with one sendmsg, the next message read straight into the receive's buffer when
 * it is the one expected, and for tcp's native all_reduce (tcp_native.py) one message to and
 * from every peer of a group, both ways at once, and the reduction of the blocks in rank
 * order; all without the engine's Python per message. Whatever else comes
 * (another message first, a peer that is slow or gone) is handed back as it stands: bytes
 * read but not taken lie in the engine's staging buffer, and the engine goes on from there.
 *
 * Nothing here shares memory with another process or thread: the bytes travel through the
 * kernel's socket, which orders them, so no atomics or fences are needed on any CPU (ARM64
 * included). Waiting looks at the socket (a non-blocking recv) and yields the core between
 * looks for `spin` seconds, as the engine's waits do (TcpTransport._polled), then sleeps in
 * poll(); the GIL is released while it waits.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>

#include "../include/buffers.h"
#include "../include/reduce.h"
#include "../include/wire_export.h" /* add_wire; wire.h: HEADER_BYTES, as stream.py packs it */

#ifdef MSG_NOSIGNAL
#define SEND_FLAGS (MSG_DONTWAIT | MSG_NOSIGNAL)
#else /* macOS: Python ignores SIGPIPE, so a closed peer gives EPIPE there too */
#define SEND_FLAGS MSG_DONTWAIT
#endif

/* One non-blocking sendmsg of header and payload: the bytes written, or -1 (errno set). */
static ssize_t send_one(int fd, const void *header, size_t header_len, const void *payload,
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

/*
 * send(fd, header, payload) -> bytes written (0 when the socket has no room now)
 * OSError when the connection failed.
 */
static PyObject *send_message(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (!positional("send", nargs, 3))
        return NULL;
    int fd = (int)PyLong_AsLong(args[0]);
    if (PyErr_Occurred())
        return NULL;
    Py_buffer views[2]; /* header, payload */
    if (take_buffers((BufferRequest[]){{args[1], PyBUF_SIMPLE}, {args[2], PyBUF_SIMPLE}}, views,
                     2) < 0)
        return NULL;
    ssize_t sent = send_one(fd, views[0].buf, views[0].len, views[1].buf, views[1].len);
    int error = errno;
    release_buffers(views, 2);
    if (sent < 0) {
        errno = error;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return PyLong_FromSsize_t(sent);
}

static double seconds_since(const struct timespec *start)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (now.tv_sec - start->tv_sec) + 1e-9 * (now.tv_nsec - start->tv_nsec);
}

#define CLOSED (-1) /* the error of a stream its peer has closed */

/*
 * Read up to n bytes into to, waiting as described above until some come or budget seconds
 * have passed since start. Returns the bytes read, or 0 with *error set to 0 when none came
 * in time, CLOSED at the end of the stream, or the errno of a failed connection. Runs
 * without the GIL.
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

/* A receive's outcome, as recv() below returns it. */
struct received {
    Py_ssize_t copied, staged;
    int error;
};

/* The work of recv() below, without the GIL. */
static struct received receive_one(int fd, const char *expected, char *dst, Py_ssize_t len,
                                   char *stage, Py_ssize_t stage_len, double spin, double budget)
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

/*
 * recv(fd, header, dst, stage, spin, budget) -> (copied, staged, error)
 * Take the next message of the stream if its header is `header` (context, tag, dst's size
 * and call, as the engine packs them), its payload straight into dst. The first read lands
 * in stage (the engine's staging buffer, empty when this is called) and is bounded by this
 * message's length, so that nothing past it is read. copied: the payload bytes in dst (all
 * of them unless budget seconds passed first), -1 if no whole header came in time, -2 if the
 * next message is another one: then stage[:staged] holds what was read of the stream, for
 * the engine to parse. error: 0, CLOSED (-1) if the peer closed the stream, else an errno.
 */
static PyObject *receive_message(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (!positional("recv", nargs, 6))
        return NULL;
    int fd = (int)PyLong_AsLong(args[0]);
    double spin = PyFloat_AsDouble(args[4]), budget = PyFloat_AsDouble(args[5]);
    if (PyErr_Occurred())
        return NULL;
    Py_buffer views[3]; /* expected, dst, stage */
    if (take_buffers((BufferRequest[]){{args[1], PyBUF_SIMPLE}, {args[2], PyBUF_WRITABLE},
                                       {args[3], PyBUF_WRITABLE}}, views, 3) < 0)
        return NULL;
    const Py_buffer *expected = &views[0], *dst = &views[1], *stage = &views[2];
    struct received r = {-1, 0, 0};
    int fits = expected->len == HEADER_BYTES && stage->len >= HEADER_BYTES;
    if (fits) {
        Py_BEGIN_ALLOW_THREADS
        r = receive_one(fd, expected->buf, dst->buf, dst->len, stage->buf, stage->len, spin,
                        budget);
        Py_END_ALLOW_THREADS
    }
    release_buffers(views, 3);
    if (!fits) {
        PyErr_SetString(PyExc_ValueError, "a 32-byte header and a larger stage are needed");
        return NULL;
    }
    return Py_BuildValue("(nni)", r.copied, r.staged, r.error);
}

#define MAX_PEERS 16

/* One peer of an exchange: how far its send and its receive have got. */
struct way {
    int fd;
    size_t sent;         /* bytes of header and payload written */
    int send_error;      /* errno of a failed send */
    struct received r;   /* copied -1 until the header is whole and matches, -2 if not */
    int received;        /* the receive is over: whole, another message, or an error */
    char *stage, *block;
    size_t first;        /* the first read's bound: this message's length, or the stage's */
};

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

/* Read what the socket has now for the way's receive (see recv below for the rules). */
static int receive_some(struct way *w, const char *expected, Py_ssize_t len)
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

/*
 * out = the blocks of ranks 0, 1, ... op'ed in rank order (every rank computes the same
 * bits), where blocks holds every other rank's block in rank order and mine is this rank's
 * (out may be mine). dtype and op: wire.h's codes. 1 when done, 0 when the arguments
 * do not fit, -1 with MemoryError.
 */
static int reduce_blocks(const Py_buffer *blocks, const Py_buffer *mine, long rank,
                         const Py_buffer *out, long dtype, long op)
{
    Py_ssize_t len = mine->len, others = len ? blocks->len / len : 0;
    if (!(dtype >= 0 && dtype < DTYPES && op >= 0 && op < OPS && out->len == len &&
          (len == 0 || (len % ITEMSIZE[dtype] == 0 &&
          others <= MAX_PEERS && blocks->len == others * len && rank >= 0 && rank <= others))))
        return 0;
    if (!len)
        return 1;
    const char *rows[MAX_PEERS + 1];
    const char *own = mine->buf, *o = out->buf, *m = mine->buf;
    char *copy = NULL;
    /* out is written from the first row on: mine must survive that unless it is the first
     * row and out exactly */
    if (o < m + len && m < o + len && !(rank == 0 && o == m)) {
        own = copy = PyMem_Malloc(len);
        if (copy == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        memcpy(copy, mine->buf, len);
    }
    for (Py_ssize_t k = 0; k <= others; k++)
        rows[k] = k == rank ? own : (const char *)blocks->buf + (k < rank ? k : k - 1) * len;
    reduce_rows(rows, others + 1, out->buf, len / ITEMSIZE[dtype], (int)dtype, (int)op);
    PyMem_Free(copy);
    return 1;
}

static void reduce_does_not_fit(void)
{
    PyErr_SetString(PyExc_ValueError, "reduce: blocks of mine's size, one per other rank, an "
                    "out of the same size, known dtype and op codes");
}

/* reduce(blocks, mine, rank, out, dtype, op): reduce_blocks */
static PyObject *reduce(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (!positional("reduce", nargs, 6))
        return NULL;
    long rank = PyLong_AsLong(args[2]), dtype = PyLong_AsLong(args[4]);
    long op = PyLong_AsLong(args[5]);
    if (PyErr_Occurred())
        return NULL;
    Py_buffer views[3]; /* blocks, mine, out */
    if (take_buffers((BufferRequest[]){{args[0], PyBUF_SIMPLE}, {args[1], PyBUF_SIMPLE},
                                       {args[3], PyBUF_WRITABLE}}, views, 3) < 0)
        return NULL;
    int done = reduce_blocks(&views[0], &views[1], rank, &views[2], dtype, op);
    release_buffers(views, 3);
    if (done == 0)
        reduce_does_not_fit();
    if (done <= 0)
        return NULL;
    Py_RETURN_NONE;
}

/*
 * exchange(fds, header, mine, blocks, stages, spin, budget[, reduction]) -> None, or what
 * stopped it
 * Send header and mine to every peer (fds) while receiving each peer's message of the same
 * header into its block (both ways at once, so that large messages cannot deadlock): blocks
 * holds len(fds) blocks of len(mine) bytes, in the order of fds, and stages the peers'
 * staging buffers (see recv). None once everything has moved. Else it stopped (another
 * message first, a failed connection, or budget seconds without progress): a tuple, per
 * peer, of (bytes of header and payload sent, the send's errno or 0, copied, staged, error)
 * with the last three as recv's. Given a reduction, (out, rank, dtype, op), it also reduces the
 * blocks and mine into out once everything has moved, as reduce does (tcp's small all_reduce
 * in one call).
 */
static PyObject *exchange(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    int reduces = nargs == 8 && args[7] != Py_None;
    if ((nargs != 7 && nargs != 8) || !PyTuple_Check(args[0]) || !PyTuple_Check(args[4]) ||
        PyTuple_GET_SIZE(args[0]) != PyTuple_GET_SIZE(args[4]) ||
        PyTuple_GET_SIZE(args[0]) > MAX_PEERS ||
        (reduces && (!PyTuple_Check(args[7]) || PyTuple_GET_SIZE(args[7]) != 4))) {
        PyErr_SetString(PyExc_TypeError, "exchange takes 7 or 8 arguments: fds and stages "
                        "tuples of the same length, at most 16, and a reduction (out, rank, "
                        "dtype, op) or None");
        return NULL;
    }
    PyObject *const *reduction = reduces ? &PyTuple_GET_ITEM(args[7], 0) : NULL;
    long rank = reduces ? PyLong_AsLong(reduction[1]) : 0;
    long dtype = reduces ? PyLong_AsLong(reduction[2]) : 0;
    long op = reduces ? PyLong_AsLong(reduction[3]) : 0;
    int n = (int)PyTuple_GET_SIZE(args[0]);
    struct way ways[MAX_PEERS];
    memset(ways, 0, sizeof ways);
    for (int i = 0; i < n; i++)
        ways[i].fd = (int)PyLong_AsLong(PyTuple_GET_ITEM(args[0], i));
    double spin = PyFloat_AsDouble(args[5]), budget = PyFloat_AsDouble(args[6]);
    if (PyErr_Occurred())
        return NULL;
    /* read: the expected header and mine; written: the blocks, the stages, the reduction's
     * out */
    BufferRequest wanted[3 + MAX_PEERS + 1] = {{args[1], PyBUF_SIMPLE}, {args[2], PyBUF_SIMPLE},
                                                {args[3], PyBUF_WRITABLE}};
    int held = 3;
    for (int i = 0; i < n; i++)
        wanted[held++] = (BufferRequest){PyTuple_GET_ITEM(args[4], i), PyBUF_WRITABLE};
    if (reduces)
        wanted[held++] = (BufferRequest){reduction[0], PyBUF_WRITABLE};
    Py_buffer views[3 + MAX_PEERS + 1];
    if (take_buffers(wanted, views, held) < 0)
        return NULL;
    const Py_buffer *expected = &views[0], *mine = &views[1], *blocks = &views[2];
    const Py_buffer *stages = &views[3], *out = reduces ? &views[3 + n] : NULL;
    int fits = expected->len == HEADER_BYTES && blocks->len == n * mine->len;
    size_t whole = HEADER_BYTES + (size_t)mine->len;
    for (int i = 0; i < n; i++) {
        fits = fits && stages[i].len >= HEADER_BYTES;
        ways[i].r.copied = -1;
        ways[i].stage = stages[i].buf;
        ways[i].block = (char *)blocks->buf + i * mine->len;
        ways[i].first = whole < (size_t)stages[i].len ? whole : (size_t)stages[i].len;
    }
    int stopped = 0;
    if (fits) {
        Py_BEGIN_ALLOW_THREADS
        struct timespec since;  /* the last progress */
        clock_gettime(CLOCK_MONOTONIC, &since);
        for (;;) {
            int moved = 0, pending = 0;
            struct pollfd waits[MAX_PEERS];
            for (int i = 0; i < n; i++) {
                struct way *w = &ways[i];
                moved |= send_some(w, expected->buf, mine->buf, mine->len);
                moved |= receive_some(w, expected->buf, mine->len);
                stopped |= w->send_error || (w->received && w->r.copied != mine->len);
                waits[i].fd = w->fd;
                waits[i].events = (w->sent < whole ? POLLOUT : 0) | (w->received ? 0 : POLLIN);
                pending |= waits[i].events;
            }
            if (stopped || !pending)
                break;
            if (moved) {
                clock_gettime(CLOCK_MONOTONIC, &since);
                continue;
            }
            double waited = seconds_since(&since);
            if (waited >= budget) {
                stopped = 1;
                break;
            }
            if (waited < spin) {
                sched_yield();
                continue;
            }
            poll(waits, n, (int)((budget - waited) * 1000) + 1);  /* EINTR: look again */
        }
        Py_END_ALLOW_THREADS
    }
    int reduced = fits && !stopped && reduces ? reduce_blocks(blocks, mine, rank, out, dtype,
                                                              op) : 1;
    release_buffers(views, held);
    if (reduced <= 0) {
        if (reduced == 0)
            reduce_does_not_fit();
        return NULL;
    }
    if (!fits) {
        PyErr_SetString(PyExc_ValueError, "exchange: a 32-byte header, len(fds) blocks of "
                        "len(mine) bytes and stages larger than a header are needed");
        return NULL;
    }
    if (!stopped)
        Py_RETURN_NONE;
    PyObject *states = PyTuple_New(n);
    for (int i = 0; states != NULL && i < n; i++) {
        struct way *w = &ways[i];
        PyObject *state = Py_BuildValue("(ninni)", (Py_ssize_t)w->sent, w->send_error,
                                        w->r.copied, w->r.staged, w->r.error);
        if (state == NULL)
            Py_CLEAR(states);
        else
            PyTuple_SET_ITEM(states, i, state);
    }
    return states;
}

static PyMethodDef methods[] = {
    {"send", (PyCFunction)(void (*)(void))send_message, METH_FASTCALL,
     "Write a message's header and payload with one non-blocking sendmsg."},
    {"recv", (PyCFunction)(void (*)(void))receive_message, METH_FASTCALL,
     "Read the next message into dst if it is the one expected."},
    {"exchange", (PyCFunction)(void (*)(void))exchange, METH_FASTCALL,
     "Send a message to every peer, then receive the same message from each."},
    {"reduce", (PyCFunction)(void (*)(void))reduce, METH_FASTCALL,
     "Reduce every rank's block in rank order."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_sockets", NULL, -1, methods};

PyMODINIT_FUNC PyInit__sockets(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m == NULL || PyModule_AddIntConstant(m, "MAX_PEERS", MAX_PEERS) < 0 ||
        add_wire(m) < 0) { /* checked at import by tbcoll.wire_check */
        Py_XDECREF(m);
        return NULL;
    }
    return m;
}
