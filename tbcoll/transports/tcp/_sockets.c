/*
 * tbcoll.transports.tcp._sockets: the tcp transport's small-message path in C
 * (tbcoll/transports/tcp/transport.py, tcp_native.py): the module's functions over exchange.c's
 * moves, which do the work without the GIL (see exchange.h for what they do and why no atomics or
 * fences are needed), tcp_lane.c's Lane, a whole small all_reduce in one call, and watch.c's
 * watcher of dead paths (a thread of its own).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <string.h>

#include "../../include/buffers.h"
#include "../../include/callbacks.h" /* ADD_CALLBACKS */
#include "../../include/engine_words.h" /* add_engine_words */
#include "../../include/wire_export.h" /* add_wire; wire.h: HEADER_BYTES, as stream.py packs it */
#include "exchange.h"
#include "tcp_lane.h"
#include "watch.h"

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

/* Whether blocks, mine, rank, out, dtype and op make a reduction: out = the blocks of ranks
 * 0, 1, ... op'ed in rank order (every rank computes the same bits), where blocks holds every
 * other rank's block in rank order and mine is this rank's (out may be mine); dtype and op:
 * wire.h's codes. */
static int reduction_fits(const Py_buffer *blocks, const Py_buffer *mine, long rank,
                          const Py_buffer *out, long dtype, long op)
{
    Py_ssize_t len = mine->len, others = len ? blocks->len / len : 0;
    return dtype >= 0 && dtype < DTYPES && op >= 0 && op < OPS && out->len == len &&
           (len == 0 || (len % ITEMSIZE[dtype] == 0 && others <= MAX_PEERS &&
                         blocks->len == others * len && rank >= 0 && rank <= others));
}

/* The reduction (reduction_fits): 1 when done, 0 when the arguments do not fit, -1 with
 * MemoryError. */
static int reduce_blocks(const Py_buffer *blocks, const Py_buffer *mine, long rank,
                         const Py_buffer *out, long dtype, long op)
{
    if (!reduction_fits(blocks, mine, rank, out, dtype, op))
        return 0;
    Py_ssize_t len = mine->len, others = len ? blocks->len / len : 0;
    if (reduce_in_rank_order(blocks->buf, mine->buf, (int)rank, (int)others, out->buf,
                             (size_t)len, (int)dtype, (int)op) < 0) {
        PyErr_NoMemory();
        return -1;
    }
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
 * with the last three as recv's. Given a reduction, (out, own, rank, dtype, op), it also
 * reduces the blocks and own (this rank's row; None: mine) into out, as reduce does, while the
 * blocks come where out is apart from mine and own, else once everything has moved
 * (exchange.h's exchange_reduce).
 */
static PyObject *exchange(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    int reduces = nargs == 8 && args[7] != Py_None;
    if ((nargs != 7 && nargs != 8) || !PyTuple_Check(args[0]) || !PyTuple_Check(args[4]) ||
        PyTuple_GET_SIZE(args[0]) != PyTuple_GET_SIZE(args[4]) ||
        PyTuple_GET_SIZE(args[0]) > MAX_PEERS ||
        (reduces && (!PyTuple_Check(args[7]) || PyTuple_GET_SIZE(args[7]) != 5))) {
        PyErr_SetString(PyExc_TypeError, "exchange takes 7 or 8 arguments: fds and stages "
                        "tuples of the same length, at most 16, and a reduction (out, own, "
                        "rank, dtype, op) or None");
        return NULL;
    }
    PyObject *const *reduction = reduces ? &PyTuple_GET_ITEM(args[7], 0) : NULL;
    int owned = reduces && reduction[1] != Py_None; /* own apart from mine */
    long rank = reduces ? PyLong_AsLong(reduction[2]) : 0;
    long dtype = reduces ? PyLong_AsLong(reduction[3]) : 0;
    long op = reduces ? PyLong_AsLong(reduction[4]) : 0;
    int n = (int)PyTuple_GET_SIZE(args[0]);
    int fds[MAX_PEERS];
    for (int i = 0; i < n; i++)
        fds[i] = (int)PyLong_AsLong(PyTuple_GET_ITEM(args[0], i));
    double spin = PyFloat_AsDouble(args[5]), budget = PyFloat_AsDouble(args[6]);
    if (PyErr_Occurred())
        return NULL;
    /* read: the expected header and mine; written: the blocks, the stages, the reduction's
     * out; read: its own */
    BufferRequest wanted[3 + MAX_PEERS + 2] = {{args[1], PyBUF_SIMPLE}, {args[2], PyBUF_SIMPLE},
                                                {args[3], PyBUF_WRITABLE}};
    int held = 3;
    for (int i = 0; i < n; i++)
        wanted[held++] = (BufferRequest){PyTuple_GET_ITEM(args[4], i), PyBUF_WRITABLE};
    if (reduces)
        wanted[held++] = (BufferRequest){reduction[0], PyBUF_WRITABLE};
    if (owned)
        wanted[held++] = (BufferRequest){reduction[1], PyBUF_SIMPLE};
    Py_buffer views[3 + MAX_PEERS + 2];
    if (take_buffers(wanted, views, held) < 0)
        return NULL;
    const Py_buffer *expected = &views[0], *mine = &views[1], *blocks = &views[2];
    const Py_buffer *stages = &views[3], *out = reduces ? &views[3 + n] : NULL;
    const Py_buffer *own = owned ? &views[4 + n] : mine;
    int fits = expected->len == HEADER_BYTES && blocks->len == n * mine->len;
    char *stage_at[MAX_PEERS];
    ptrdiff_t stage_lens[MAX_PEERS];
    for (int i = 0; i < n; i++) {
        fits = fits && stages[i].len >= HEADER_BYTES;
        stage_at[i] = stages[i].buf;
        stage_lens[i] = stages[i].len;
    }
    int reducible = !reduces || (own->len == mine->len &&
                                 reduction_fits(blocks, mine, rank, out, dtype, op));
    struct way ways[MAX_PEERS];
    int stopped = 0;
    if (fits && reducible) {
        ways_begin(ways, n, fds, stage_at, stage_lens, blocks->buf, (size_t)mine->len);
        Py_BEGIN_ALLOW_THREADS
        stopped = exchange_reduce(ways, n, expected->buf, mine->buf, (size_t)mine->len, spin,
                                  budget, reduces ? out->buf : NULL, own->buf, (int)rank,
                                  (int)dtype, (int)op);
        Py_END_ALLOW_THREADS
    }
    release_buffers(views, held);
    if (!fits) {
        PyErr_SetString(PyExc_ValueError, "exchange: a 32-byte header, len(fds) blocks of "
                        "len(mine) bytes and stages larger than a header are needed");
        return NULL;
    }
    if (!reducible) {
        reduce_does_not_fit();
        return NULL;
    }
    if (stopped < 0)
        return PyErr_NoMemory();
    if (!stopped)
        Py_RETURN_NONE;
    return ways_stopped(ways, n);
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

/* the calls into Python that the tcp lane makes */
#define TCP_CALLBACKS(X) CALLBACKS_TCP(X)

PyMODINIT_FUNC PyInit__sockets(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m == NULL || PyModule_AddIntConstant(m, "MAX_PEERS", MAX_PEERS) < 0 ||
        add_wire(m) < 0 || /* checked at import by tbcoll.core.wire_check */
        add_engine_words(m) < 0 || add_tcp_lane(m) < 0 || add_watch(m) < 0 ||
        ADD_CALLBACKS(m, TCP_CALLBACKS) < 0) { /* checked at import by tbcoll.core.callbacks */
        Py_XDECREF(m);
        return NULL;
    }
    return m;
}
