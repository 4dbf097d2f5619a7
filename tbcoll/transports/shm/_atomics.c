/*
 * tbcoll.transports.shm._atomics: the shm transport's module, its Python functions and its init.
 *
 * Its functions give Python the pure layer below: atomic loads and stores of a segment's
 * words and waits for its flags (flags.c: the release/acquire argument is there), the byte
 * rings (rings.c) and cross-process copies (cma.c); its init exports the layout Python checks at
 * import, and adds the Lane type (lane.c).
 *
 * Includes: Python.h, tbcoll/include/buffers.h, wire_export.h, engine_words.h (the
 * words' layout), lane.h, rounds.h, and the pure layer (shm.h, flags.h, rings.h, cma.h).
 * The top of the extension: no other file calls a function of this one.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "../../include/buffers.h"
#include "../../include/callbacks.h" /* ADD_CALLBACKS */
#include "../../include/wire_export.h" /* add_wire */
#include "cma.h"
#include "flags.h"
#include "lane.h"
#include "../../include/engine_words.h" /* add_engine_words */
#include "moves.h" /* add_move_outcomes */
#include "one_copy.h" /* copy_plan */
#include "rings.h"
#include "rounds.h" /* the stages */
#include "shm.h"

static int get_word(PyObject *obj, Py_ssize_t offset, Py_buffer *view, uint64_t **word)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_WRITABLE) < 0)
        return -1;
    if (offset < 0 || offset % 8 || offset + 8 > view->len) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_ValueError, "offset %zd is not an aligned word of the buffer", offset);
        return -1;
    }
    *word = (uint64_t *)((char *)view->buf + offset);
    return 0;
}

static PyObject *load_acquire(PyObject *Py_UNUSED(self), PyObject *args)
{
    PyObject *obj;
    Py_ssize_t offset;
    Py_buffer view;
    uint64_t *word;
    if (!PyArg_ParseTuple(args, "On", &obj, &offset) || get_word(obj, offset, &view, &word) < 0)
        return NULL;
    uint64_t value = __atomic_load_n(word, __ATOMIC_ACQUIRE);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLongLong(value);
}

static PyObject *store_release(PyObject *Py_UNUSED(self), PyObject *args)
{
    PyObject *obj;
    Py_ssize_t offset;
    unsigned long long value;
    Py_buffer view;
    uint64_t *word;
    if (!PyArg_ParseTuple(args, "OnK", &obj, &offset, &value) ||
        get_word(obj, offset, &view, &word) < 0)
        return NULL;
    __atomic_store_n(word, (uint64_t)value, __ATOMIC_RELEASE);
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
}

/*
 * wait_all(buffer, offset, stride, count, target, budget_s) -> bool
 * False when the budget ran out, so that the caller can look for dead peers and check its
 * own deadline between slices.
 */
static PyObject *wait_all(PyObject *Py_UNUSED(self), PyObject *args)
{
    PyObject *obj;
    Py_ssize_t offset, stride, count;
    unsigned long long target;
    double budget;
    Py_buffer view;
    uint64_t *first;
    if (!PyArg_ParseTuple(args, "OnnnKd", &obj, &offset, &stride, &count, &target, &budget) ||
        get_word(obj, offset, &view, &first) < 0)
        return NULL;
    int inside = stride % 8 == 0 && count >= 0 &&
                 offset + (count ? (count - 1) * stride + 8 : 0) <= view.len;
    int done = inside && wait_flags((const char *)first, stride, count, target, budget);
    PyBuffer_Release(&view);
    if (!inside) {
        PyErr_SetString(PyExc_ValueError, "flags lie outside the buffer");
        return NULL;
    }
    return PyBool_FromLong(done);
}

static const char RING_OUTSIDE[] = "the ring lies outside the segment";

/* --- point-to-point: the byte rings of tbcoll/transports/shm/pipe.py (rings.h)
 * ----------------------- */

/* The ring at `at` in segment, or NULL (RING_OUTSIDE). */
static char *ring_at(const Py_buffer *segment, Py_ssize_t at, Py_ssize_t capacity)
{
    return ring_inside(at, capacity, segment->len) ? (char *)segment->buf + at : NULL;
}

/* The ring at args[0] (the segment), args[1] (at), args[2] (capacity), with the segment's view
 * taken (released by the caller), or NULL with an exception. */
static char *ring_of(PyObject *const *args, Py_buffer *segment, Py_ssize_t *capacity)
{
    Py_ssize_t at = PyLong_AsSsize_t(args[1]);
    *capacity = PyLong_AsSsize_t(args[2]);
    if (PyErr_Occurred() || PyObject_GetBuffer(args[0], segment, PyBUF_WRITABLE) < 0)
        return NULL;
    char *ring = ring_at(segment, at, *capacity);
    if (ring == NULL) {
        PyBuffer_Release(segment);
        PyErr_SetString(PyExc_ValueError, RING_OUTSIDE);
    }
    return ring;
}

/*
 * ring_write(segment, at, capacity, buffers) -> bytes written
 * The producer copies as many leading bytes of the buffers (a sequence) as there is room for
 * now, without waiting: the stream engine's writes (tbcoll/transports/shm/pipe.py,
 * ShmDuplex.sendmsg).
 */
static PyObject *ring_write_now(PyObject *Py_UNUSED(self), PyObject *const *args,
                                Py_ssize_t nargs)
{
    if (!positional("ring_write", nargs, 4))
        return NULL;
    Py_buffer segment;
    Py_ssize_t capacity, written = 0;
    char *ring = ring_of(args, &segment, &capacity);
    PyObject *buffers = ring ? PySequence_Fast(args[3], "buffers must be a sequence") : NULL;
    for (Py_ssize_t i = 0; buffers != NULL && i < PySequence_Fast_GET_SIZE(buffers); i++) {
        Py_buffer view;
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(buffers, i), &view, PyBUF_SIMPLE) < 0) {
            Py_CLEAR(buffers);
            break;
        }
        Py_ssize_t took = ring_write(ring, capacity, view.buf, view.len);
        PyBuffer_Release(&view);
        written += took;
        if (took < view.len)
            break;
    }
    if (ring)
        PyBuffer_Release(&segment);
    if (buffers == NULL)
        return NULL;
    Py_DECREF(buffers);
    return PyLong_FromSsize_t(written);
}

/*
 * ring_read(segment, at, capacity, view) -> bytes read, or RING_OVERWRITTEN
 * The consumer copies what has arrived, up to len(view) bytes, without waiting: the stream
 * engine's reads (tbcoll/transports/shm/pipe.py, ShmDuplex.recv_into).
 */
static PyObject *ring_read_now(PyObject *Py_UNUSED(self), PyObject *const *args,
                               Py_ssize_t nargs)
{
    if (!positional("ring_read", nargs, 4))
        return NULL;
    Py_buffer segment, view;
    Py_ssize_t capacity;
    char *ring = ring_of(args, &segment, &capacity);
    if (ring == NULL)
        return NULL;
    if (PyObject_GetBuffer(args[3], &view, PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&segment);
        return NULL;
    }
    Py_ssize_t got = ring_read(ring, capacity, view.buf, view.len);
    PyBuffer_Release(&view);
    PyBuffer_Release(&segment);
    return PyLong_FromSsize_t(got);
}

/* ring_held(segment, at, capacity) -> the bytes written and not yet read (rings.h's
 * ring_held): a poll's test, for either side. */
static PyObject *ring_held_now(PyObject *Py_UNUSED(self), PyObject *const *args,
                               Py_ssize_t nargs)
{
    if (!positional("ring_held", nargs, 3))
        return NULL;
    Py_buffer segment;
    Py_ssize_t capacity;
    char *ring = ring_of(args, &segment, &capacity);
    if (ring == NULL)
        return NULL;
    uint64_t held = ring_held(ring);
    PyBuffer_Release(&segment);
    return PyLong_FromUnsignedLongLong(held);
}

/*
 * ring_send(segment, at, capacity, header, payload, budget) -> bytes written
 * The producer writes a message (header, then payload) as room allows, waiting for room at
 * most budget seconds at a time; the caller leaves what did not go in to
 * tbcoll.transports.stream (which reads while it waits: no deadlock when two ranks send each
 * other more than a ring holds).
 */
static PyObject *ring_send(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs)
{
    if (!positional("ring_send", nargs, 6))
        return NULL;
    Py_ssize_t at = PyLong_AsSsize_t(args[1]), capacity = PyLong_AsSsize_t(args[2]);
    double budget = PyFloat_AsDouble(args[5]);
    if (PyErr_Occurred())
        return NULL;
    Py_buffer views[3]; /* segment, header, payload */
    if (take_buffers((BufferRequest[]){{args[0], PyBUF_WRITABLE}, {args[3], PyBUF_SIMPLE},
                                       {args[4], PyBUF_SIMPLE}}, views, 3) < 0)
        return NULL;
    const Py_buffer *header = &views[1], *payload = &views[2];
    char *ring = ring_at(&views[0], at, capacity);
    Py_ssize_t written = ring ? ring_put_message(ring, capacity, header->buf, header->len,
                                                 payload->buf, payload->len, budget) : 0;
    release_buffers(views, 3);
    if (!ring) {
        PyErr_SetString(PyExc_ValueError, RING_OUTSIDE);
        return NULL;
    }
    return PyLong_FromSsize_t(written);
}

/*
 * ring_recv(segment, at, capacity, header, dst, budget) -> copied
 * The consumer takes the next message if its header is `header` (the stream engine's, see
 * tbcoll/transports/stream/: context, tag, payload bytes = dst.len, and the call), copying
 * the payload straight into dst; copied as ring_take says (rings.h).
 */
static PyObject *ring_recv(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs)
{
    if (!positional("ring_recv", nargs, 6))
        return NULL;
    Py_ssize_t at = PyLong_AsSsize_t(args[1]), capacity = PyLong_AsSsize_t(args[2]);
    double budget = PyFloat_AsDouble(args[5]);
    if (PyErr_Occurred())
        return NULL;
    Py_buffer views[3]; /* segment, expected, dst */
    if (take_buffers((BufferRequest[]){{args[0], PyBUF_WRITABLE}, {args[3], PyBUF_SIMPLE},
                                       {args[4], PyBUF_WRITABLE}}, views, 3) < 0)
        return NULL;
    const Py_buffer *expected = &views[1], *dst = &views[2];
    char *ring = ring_at(&views[0], at, capacity);
    int fits = ring && expected->len == HEADER_BYTES && capacity >= HEADER_BYTES &&
               big_endian((const unsigned char *)expected->buf + HEADER_NBYTES,
                          HEADER_NBYTES_WIDTH) == (uint64_t)dst->len;
    Py_ssize_t copied =
        fits ? ring_take(ring, capacity, expected->buf, dst->buf, dst->len, budget) : 0;
    release_buffers(views, 3);
    if (!fits) {
        PyErr_SetString(PyExc_ValueError, ring ? "the header is not a 32-byte header for dst"
                                               : RING_OUTSIDE);
        return NULL;
    }
    return PyLong_FromSsize_t(copied);
}

static PyObject *set_spin(PyObject *Py_UNUSED(self), PyObject *args)
{
    double seconds;
    if (!PyArg_ParseTuple(args, "d", &seconds))
        return NULL;
    set_spin_seconds(seconds);
    Py_RETURN_NONE;
}

/* cma_copy(pid, address, buffer, write) -> 0, or the errno that stopped it: cma_move (cma.h)
 * between buffer and `address` in process pid. */
static PyObject *cma_copy(PyObject *Py_UNUSED(self), PyObject *args)
{
    long pid;
    unsigned long long address;
    Py_buffer buffer;
    int write;
    if (!PyArg_ParseTuple(args, "lKw*p", &pid, &address, &buffer, &write))
        return NULL;
    int error = cma_move(pid, address, buffer.buf, buffer.len, write);
    PyBuffer_Release(&buffer);
    return PyLong_FromLong(error);
}

/* address(buffer) -> where buffer's bytes start in this process: what a pulled message's
 * descriptor gives its receiver (tbcoll/transports/stream/); ~10x cheaper than numpy's
 * ctypes.data. The caller keeps the buffer alive as long as the address is used. */
static PyObject *address(PyObject *Py_UNUSED(self), PyObject *obj)
{
    Py_buffer view;
    if (PyObject_GetBuffer(obj, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    void *start = view.buf;
    PyBuffer_Release(&view);
    return PyLong_FromVoidPtr(start);
}

static PyMethodDef methods[] = {
    {"address", address, METH_O, "Where a buffer's bytes start in this process."},
    {"cma_copy", cma_copy, METH_VARARGS, "Copy bytes from or to another process (Linux)."},
    {"pull_announcement", pull_announcement, METH_VARARGS,
     "A pulled message's announcement, its pull id taken from the engine's words."},
    {"pull_answer", pull_answer, METH_VARARGS, "The answer to a pulled message's announcement."},
    {"pull_payload", pull_payload_py, METH_VARARGS, "Copy an announced payload from its sender."},
    {"copy_plan", copy_plan_py, METH_VARARGS, "The copies a rank makes in a one-copy call."},
    {"set_spin", set_spin, METH_VARARGS, "Set how many seconds a wait spins before yielding."},
    {"load_acquire", load_acquire, METH_VARARGS, "Load the word at offset with acquire order."},
    {"store_release", store_release, METH_VARARGS, "Store value at offset with release order."},
    {"wait_all", wait_all, METH_VARARGS, "Wait until every flag is >= target (or budget)."},
    {"ring_write", (PyCFunction)(void (*)(void))ring_write_now, METH_FASTCALL,
     "Write leading bytes of buffers into a ring as room allows now."},
    {"ring_read", (PyCFunction)(void (*)(void))ring_read_now, METH_FASTCALL,
     "Read what has arrived in a ring, up to a view's length."},
    {"ring_held", (PyCFunction)(void (*)(void))ring_held_now, METH_FASTCALL,
     "The bytes written into a ring and not yet read."},
    {"ring_send", (PyCFunction)(void (*)(void))ring_send, METH_FASTCALL,
     "Write a message into a point-to-point ring as space allows."},
    {"ring_recv", (PyCFunction)(void (*)(void))ring_recv, METH_FASTCALL,
     "Take the next message from a ring if it is the one expected."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, .m_name = "_atomics", .m_size = -1,
                                    .m_methods = methods};

/* LANE_KINDS: the one-call kinds' names, by code (shm.h) */
static PyObject *lane_kinds(void)
{
#define KIND_NAME(kind, name) name,
    static const char *const names[KINDS] = {SHM_KINDS(KIND_NAME)};
#undef KIND_NAME
    PyObject *kinds = PyTuple_New(ONE_CALL_KINDS);
    for (int k = 0; kinds != NULL && k < ONE_CALL_KINDS; k++) {
        PyObject *name = PyUnicode_FromString(names[k]);
        if (name == NULL)
            Py_CLEAR(kinds);
        else
            PyTuple_SET_ITEM(kinds, k, name);
    }
    return kinds;
}

/* the calls into Python that the shm lane makes (checked at import by tbcoll.core.callbacks) */
#define SHM_CALLBACKS(X) CALLBACKS_SHM(X)

PyMODINIT_FUNC PyInit__atomics(void)
{
    PyObject *m = PyModule_Create(&module);
    /* the layout Python shares with this file, checked at import by
     * tbcoll/transports/shm/native.py, the lane's kinds by tbcoll/comm/communicator.py, and the
     * wire (tbcoll/include/wire.h) by tbcoll/transports/shm/flags.py */
    if (m == NULL || PyModule_AddIntConstant(m, "LINE", LINE) < 0 ||
        PyModule_AddIntConstant(m, "ARRIVE_OFFSET", ARRIVE_OFFSET) < 0 ||
        PyModule_AddIntConstant(m, "DONE_OFFSET", DONE_OFFSET) < 0 ||
        PyModule_AddIntConstant(m, "SIGNATURE_OFFSET", SIGNATURE_OFFSET) < 0 ||
        PyModule_AddIntConstant(m, "RING_CONTROL", RING_DATA) < 0 ||
        PyModule_AddIntConstant(m, "RING_TAIL_OFFSET", RING_LINE) < 0 ||
        PyModule_AddIntConstant(m, "RING_OVERWRITTEN", RING_OVERWRITTEN) < 0 ||
        PyModule_AddIntConstant(m, "MAX_RANKS", MAX_RANKS) < 0 ||
        PyModule_AddIntConstant(m, "HAVE_CMA", HAVE_CMA) < 0 ||
        PyModule_AddIntConstant(m, "ALL_REDUCE", ALL_REDUCE) < 0 ||
        PyModule_AddIntConstant(m, "ALL_GATHER", ALL_GATHER) < 0 ||
        PyModule_AddIntConstant(m, "REDUCE_SCATTER", REDUCE_SCATTER) < 0 ||
        PyModule_AddIntConstant(m, "BROADCAST", BROADCAST) < 0 ||
        PyModule_AddIntConstant(m, "BARRIER", BARRIER) < 0 ||
        /* the stages a round is resumed at (rounds.h): what the Lane's resume gets */
        PyModule_AddIntConstant(m, "ROUND_WAIT_FREE", ROUND_WAIT_FREE) < 0 ||
        PyModule_AddIntConstant(m, "ROUND_WAIT_ARRIVED", ROUND_WAIT_ARRIVED) < 0 ||
        PyModule_AddIntConstant(m, "ROUND_CALLS_DIFFER", ROUND_CALLS_DIFFER) < 0 ||
        PyModule_AddIntConstant(m, "ROUND_WAIT_DONE", ROUND_WAIT_DONE) < 0 ||
        PyModule_AddObject(m, "LANE_KINDS", lane_kinds()) < 0 ||
        PyModule_AddObject(m, "NOT_IN_HEAP", Py_BuildValue("(ii)", NOT_IN_HEAP_ALLOCATION,
                                                           NOT_IN_HEAP_OFFSET)) < 0 ||
        add_wire(m) < 0 || add_engine_words(m) < 0 || add_lane_type(m) < 0 ||
        add_move_outcomes(m) < 0 || ADD_CALLBACKS(m, SHM_CALLBACKS) < 0) {
        Py_XDECREF(m);
        return NULL;
    }
    return m;
}
