/*
 * tcp's Lane: a communicator's small all_reduce as one C call (tbcoll/transports/base.py's
 * Native.lane contract; tcp_native.py makes it), as shm's lane makes its calls
 * (tbcoll/shm/lane.c): check the arguments, take the communicator's call gate
 * (tbcoll/include/gate.h), take the stream engine (its Turns' lock), see in the engine's
 * words (tbcoll/include/engine_words.h) that nothing must go first, number the call
 * (the group's call words, which the engine compares with the peers' messages), exchange one
 * message with every peer and reduce the blocks in rank order (exchange.c), count and record
 * the call. That Python cost about as much as the exchange (np=2, 8 B: ~10 us around a
 * ~12 us exchange on a loaded host). Where the call does not qualify (another array type, a
 * busy communicator or engine, anything held in the engine) it returns None having touched
 * nothing, and the Python path runs; where the exchange stops (another message first, a slow
 * or lost peer) the engine finishes it (finish, called with the engine still taken).
 *
 * Lane(fds, stages, peer_words, context, tag, rank)   the group: its peers' sockets and
 *     staging buffers and where their state words are, in rank order without this rank
 * engine(words, publish, take, give, call)            the engine's words and publish_words,
 *     its lock's acquire and release, and the group's call words [seq, signature]
 * calls(ndarray, dtypes, ops, empty, signatures, spin, budget, largest, finish)
 * bind(gate, codes, names, enabled, max_tag, comm_error, namer), limit(kind, nbytes) and
 *     all_reduce(x, op, out): the contract's, as shm's lane has them.
 *
 * Why plain loads and stores of the words: they are this process's own memory (arrays the
 * engine owns, their buffers held from engine() on, so they can neither move nor be resized),
 * read and written with the GIL held and the engine's lock taken: no door of the engine is
 * open then (each takes that lock), and C calls publish_words and finish only while it holds
 * the lock. The call words are written only by the thread that holds the communicator's
 * gate, here or in the engine's doors.
 *
 * Includes: Python.h, tbcoll/include/buffers.h, engine_words.h, gate.h, one_call.h, wire.h,
 * tcp_lane.h (exchange.h).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#include "../include/buffers.h"
#include "../include/engine_words.h"
#include "../include/gate.h"
#include "../include/one_call.h"
#include "../include/wire.h"
#include "tcp_lane.h"

/* the contract's codes (bind): the four lane kinds' (all_reduce first), send's, recv's, the
 * native algorithm's */
enum { KINDS = 4, CODE_NATIVE = KINDS + 2, CODES = KINDS + 3, ALL_REDUCE = 0 };

static PyTypeObject *GateType; /* tbcoll._gate.Gate; NULL where its import failed: */
static PyObject *gate_error;   /* why (GATE_ERROR) */

typedef struct {
    PyObject_HEAD
    /* the group (Lane()) */
    int peers, rank;
    int fds[MAX_PEERS];
    Py_buffer stages[MAX_PEERS];
    int stages_held;
    Py_ssize_t peer_words[MAX_PEERS]; /* each peer's index among the engine's peers */
    uint32_t context, tag;
    /* the engine (engine()) */
    Py_buffer words, call;
    PyObject *publish, *take, *give;
    /* the calls (calls()) */
    int checks;
    PyObject *ndarray, *dtypes, *ops, *empty, *finish;
    uint64_t signatures[DTYPES][OPS]; /* all_reduce's, less the byte count */
    double spin, budget;
    Py_ssize_t largest; /* the largest x taken: calls()' and limit()'s least */
    /* the communicator (bind()) */
    Gate *gate;
    int codes[CODES], enabled;
    PyObject *name, *comm_error, *namer;
    /* room for the other ranks' blocks: a bytearray never resized (a larger one replaces it),
     * so that what finish makes of it never outlives its memory */
    PyObject *blocks;
} TcpLane;

PyObject *ways_stopped(const struct way *ways, int n)
{
    PyObject *states = PyTuple_New(n);
    for (int i = 0; states != NULL && i < n; i++) {
        const struct way *w = &ways[i];
        PyObject *state = Py_BuildValue("(ninni)", (Py_ssize_t)w->sent, w->send_error,
                                        (Py_ssize_t)w->r.copied, (Py_ssize_t)w->r.staged,
                                        w->r.error);
        if (state == NULL)
            Py_CLEAR(states);
        else
            PyTuple_SET_ITEM(states, i, state);
    }
    return states;
}

static void release_group(TcpLane *self)
{
    release_buffers(self->stages, self->stages_held);
    self->stages_held = 0;
    if (self->words.obj != NULL)
        PyBuffer_Release(&self->words);
    if (self->call.obj != NULL)
        PyBuffer_Release(&self->call);
    self->words.obj = self->call.obj = NULL;
}

static int tcp_lane_traverse(TcpLane *self, visitproc visit, void *arg)
{
    for (int i = 0; i < self->stages_held; i++)
        Py_VISIT(self->stages[i].obj);
    Py_VISIT(self->words.obj);
    Py_VISIT(self->call.obj);
    Py_VISIT(self->publish);
    Py_VISIT(self->take);
    Py_VISIT(self->give);
    Py_VISIT(self->ndarray);
    Py_VISIT(self->dtypes);
    Py_VISIT(self->ops);
    Py_VISIT(self->empty);
    Py_VISIT(self->finish);
    Py_VISIT(self->gate);
    Py_VISIT(self->name);
    Py_VISIT(self->comm_error);
    Py_VISIT(self->namer);
    Py_VISIT(self->blocks);
    return 0;
}

static int tcp_lane_clear(TcpLane *self)
{
    release_group(self);
    Py_CLEAR(self->publish);
    Py_CLEAR(self->take);
    Py_CLEAR(self->give);
    Py_CLEAR(self->ndarray);
    Py_CLEAR(self->dtypes);
    Py_CLEAR(self->ops);
    Py_CLEAR(self->empty);
    Py_CLEAR(self->finish);
    Py_CLEAR(self->gate);
    Py_CLEAR(self->name);
    Py_CLEAR(self->comm_error);
    Py_CLEAR(self->namer);
    Py_CLEAR(self->blocks);
    self->checks = self->enabled = 0;
    return 0;
}

static void tcp_lane_dealloc(TcpLane *self)
{
    PyObject_GC_UnTrack(self);
    tcp_lane_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int tcp_lane_init(TcpLane *self, PyObject *args, PyObject *Py_UNUSED(kwargs))
{
    PyObject *fds, *stages, *peer_words;
    unsigned int context, tag;
    int rank;
    if (!PyArg_ParseTuple(args, "O!O!O!IIi:Lane", &PyTuple_Type, &fds, &PyTuple_Type, &stages,
                          &PyTuple_Type, &peer_words, &context, &tag, &rank))
        return -1;
    Py_ssize_t n = PyTuple_GET_SIZE(fds);
    if (n < 1 || n > MAX_PEERS || PyTuple_GET_SIZE(stages) != n ||
        PyTuple_GET_SIZE(peer_words) != n || rank < 0 || rank > n) {
        PyErr_SetString(PyExc_ValueError, "Lane: 1 to 16 peers, a stage and a word each, and "
                                          "a rank among them");
        return -1;
    }
    tcp_lane_clear(self);
    for (Py_ssize_t i = 0; i < n; i++) {
        self->fds[i] = (int)PyLong_AsLong(PyTuple_GET_ITEM(fds, i));
        self->peer_words[i] = PyLong_AsSsize_t(PyTuple_GET_ITEM(peer_words, i));
    }
    if (PyErr_Occurred())
        return -1;
    BufferRequest wanted[MAX_PEERS];
    for (Py_ssize_t i = 0; i < n; i++)
        wanted[i] = (BufferRequest){PyTuple_GET_ITEM(stages, i), PyBUF_WRITABLE};
    if (take_buffers(wanted, self->stages, (int)n) < 0)
        return -1;
    self->stages_held = (int)n;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (self->stages[i].len < HEADER_BYTES) {
            PyErr_SetString(PyExc_ValueError, "Lane: stages larger than a header");
            return -1;
        }
    }
    self->peers = (int)n;
    self->rank = rank;
    self->context = context;
    self->tag = tag;
    return 0;
}

static PyObject *tcp_lane_engine(TcpLane *self, PyObject *args)
{
    PyObject *words, *publish, *take, *give, *call;
    if (!PyArg_ParseTuple(args, "OOOOO:engine", &words, &publish, &take, &give, &call))
        return NULL;
    if (self->stages_held == 0 || self->words.obj != NULL) {
        PyErr_SetString(PyExc_ValueError, "engine: once, after Lane()");
        return NULL;
    }
    Py_buffer views[2];
    if (take_buffers((BufferRequest[]){{words, PyBUF_WRITABLE}, {call, PyBUF_WRITABLE}}, views,
                     2) < 0)
        return NULL;
    Py_ssize_t most = 0;
    for (int i = 0; i < self->peers; i++)
        most = self->peer_words[i] > most ? self->peer_words[i] : most;
    if (views[0].len < (Py_ssize_t)sizeof(uint64_t) * (PEER_WORDS + (most + 1) * WORDS_PER_PEER)
        || views[1].len != 2 * sizeof(uint64_t)) {
        release_buffers(views, 2);
        PyErr_SetString(PyExc_ValueError, "engine: the words of every peer, and two call words");
        return NULL;
    }
    self->words = views[0];
    self->call = views[1];
    Py_XSETREF(self->publish, Py_NewRef(publish));
    Py_XSETREF(self->take, Py_NewRef(take));
    Py_XSETREF(self->give, Py_NewRef(give));
    Py_RETURN_NONE;
}

static PyObject *tcp_lane_calls(TcpLane *self, PyObject *args)
{
    PyObject *ndarray, *dtypes, *ops, *empty, *signatures, *finish;
    double spin, budget;
    Py_ssize_t largest;
    if (!PyArg_ParseTuple(args, "O!O!O!OO!ddnO:calls", &PyType_Type, &ndarray, &PyTuple_Type,
                          &dtypes, &PyDict_Type, &ops, &empty, &PyList_Type, &signatures, &spin,
                          &budget, &largest, &finish))
        return NULL;
    if (PyTuple_GET_SIZE(dtypes) != DTYPES || PyList_GET_SIZE(signatures) != DTYPES * OPS) {
        PyErr_Format(PyExc_ValueError, "calls: %d dtypes and %d signatures", DTYPES,
                     DTYPES * OPS);
        return NULL;
    }
    for (int i = 0; i < DTYPES * OPS; i++) {
        self->signatures[i / OPS][i % OPS] =
            (uint64_t)PyLong_AsUnsignedLongLong(PyList_GET_ITEM(signatures, i));
        if (PyErr_Occurred())
            return NULL;
    }
    Py_XSETREF(self->ndarray, Py_NewRef(ndarray));
    Py_XSETREF(self->dtypes, Py_NewRef(dtypes));
    Py_XSETREF(self->ops, Py_NewRef(ops));
    Py_XSETREF(self->empty, Py_NewRef(empty));
    Py_XSETREF(self->finish, Py_NewRef(finish));
    self->spin = spin;
    self->budget = budget;
    self->largest = largest;
    self->checks = 1;
    Py_RETURN_NONE;
}

static PyObject *tcp_lane_bind(TcpLane *self, PyObject *args)
{
    PyObject *gate, *codes, *names, *comm_error, *namer;
    int enabled;
    long max_tag;
    if (GateType == NULL) {
        PyErr_SetObject(PyExc_ImportError, gate_error);
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "O!O!O!ilOO:bind", GateType, &gate, &PyTuple_Type, &codes,
                          &PyTuple_Type, &names, &enabled, &max_tag, &comm_error, &namer))
        return NULL;
    if (PyTuple_GET_SIZE(codes) != CODES || PyTuple_GET_SIZE(names) != KINDS) {
        PyErr_SetString(PyExc_ValueError, "bind: bad codes or names");
        return NULL;
    }
    for (int i = 0; i < CODES; i++) {
        long code = PyLong_AsLong(PyTuple_GET_ITEM(codes, i));
        if (code == -1 && PyErr_Occurred())
            return NULL;
        self->codes[i] = (int)code;
    }
    Py_XSETREF(self->gate, (Gate *)Py_NewRef(gate));
    Py_XSETREF(self->name, Py_NewRef(PyTuple_GET_ITEM(names, ALL_REDUCE)));
    Py_XSETREF(self->comm_error, Py_NewRef(comm_error));
    Py_XSETREF(self->namer, Py_NewRef(namer));
    self->enabled = enabled & (1 << ALL_REDUCE); /* the one kind it has */
    return PyLong_FromLong(self->enabled);
}

static PyObject *tcp_lane_limit(TcpLane *self, PyObject *args)
{
    int kind;
    Py_ssize_t nbytes;
    if (!PyArg_ParseTuple(args, "in:limit", &kind, &nbytes))
        return NULL;
    if (kind == ALL_REDUCE && nbytes < self->largest)
        self->largest = nbytes;
    Py_RETURN_NONE;
}

/* Call f(arg) with an error that may be set kept aside: 0, or -1 with f's error (which then
 * replaces the one kept). For the engine's lock, given back on every path. */
static int call_keeping_error(PyObject *f, PyObject *arg)
{
    PyObject *type, *error, *trace;
    PyErr_Fetch(&type, &error, &trace);
    PyObject *done = arg ? PyObject_CallOneArg(f, arg) : PyObject_CallNoArgs(f);
    if (done == NULL) {
        Py_XDECREF(type);
        Py_XDECREF(error);
        Py_XDECREF(trace);
        return -1;
    }
    Py_DECREF(done);
    PyErr_Restore(type, error, trace);
    return 0;
}

/* Whether every peer may send and take this call's message by C's path now: the engine's
 * words published, no thread but this one has shared the engine, no send waits for room,
 * nothing of any peer's is queued, held or half-read; -1 with an exception. */
static int engine_idle(TcpLane *self)
{
    if (engine_words_fresh(self->words.buf, self->publish) < 0)
        return -1;
    if (*((uint64_t *)self->words.buf + ENGINE_WORD) & (SHARED | WRITING))
        return 0;
    for (int i = 0; i < self->peers; i++)
        if (*engine_word(self->words.buf, self->peer_words[i], STATE_WORD) &
            (SEND_HELD | RECV_HELD))
            return 0;
    return 1;
}

/* The exchange and the reduction of a taken call into target (its view tv), from x's view
 * xv: 0, or -1 with an exception. Runs with the engine taken. */
static int exchange_and_reduce(TcpLane *self, PyObject *x, const Py_buffer *xv,
                               PyObject *target, const Py_buffer *tv, int dtype, int op)
{
    size_t len = (size_t)xv->len, need = (size_t)self->peers * len;
    if (self->blocks == NULL || (size_t)PyByteArray_GET_SIZE(self->blocks) < need) {
        PyObject *more = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)need);
        if (more == NULL)
            return -1;
        Py_XSETREF(self->blocks, more);
    }
    char *blocks = PyByteArray_AS_STRING(self->blocks);
    uint64_t *call = self->call.buf; /* the engine's begin_next_call */
    call[0] += 1;
    call[1] = (uint64_t)len | self->signatures[dtype][op];
    unsigned char header[HEADER_BYTES];
    put_big_endian(header + HEADER_CONTEXT, self->context, HEADER_CONTEXT_WIDTH);
    put_big_endian(header + HEADER_TAG, self->tag, HEADER_TAG_WIDTH);
    put_big_endian(header + HEADER_NBYTES, (uint64_t)len, HEADER_NBYTES_WIDTH);
    put_big_endian(header + HEADER_SEQ, call[0], HEADER_SEQ_WIDTH);
    put_big_endian(header + HEADER_CALL, call[1], HEADER_CALL_WIDTH);
    char *stages[MAX_PEERS];
    ptrdiff_t stage_lens[MAX_PEERS];
    for (int i = 0; i < self->peers; i++) {
        stages[i] = self->stages[i].buf;
        stage_lens[i] = self->stages[i].len;
    }
    struct way ways[MAX_PEERS];
    ways_begin(ways, self->peers, self->fds, stages, stage_lens, blocks, len);
    int stopped;
    Py_BEGIN_ALLOW_THREADS
    stopped = exchange_ways(ways, self->peers, (const char *)header, xv->buf, len, self->spin,
                            self->budget);
    Py_END_ALLOW_THREADS
    if (!stopped) {
        if (reduce_in_rank_order(blocks, xv->buf, self->rank, self->peers, tv->buf, len,
                                 dtype, op) < 0) {
            PyErr_NoMemory();
            return -1;
        }
        return 0;
    }
    /* the engine goes on from where C stopped, into the blocks, and reduces */
    PyObject *sent = PyBytes_FromStringAndSize((const char *)header, HEADER_BYTES);
    PyObject *where = ways_stopped(ways, self->peers);
    PyObject *done = sent && where ? PyObject_CallFunction(self->finish, "OOOOOii", x, target,
                                                           self->blocks, sent, where, dtype, op)
                                   : NULL;
    *((uint64_t *)self->words.buf + ENGINE_WORD) |= STALE; /* the engine has moved */
    Py_XDECREF(sent);
    Py_XDECREF(where);
    Py_XDECREF(done);
    return done == NULL ? -1 : 0;
}

/* all_reduce(x, op, out): the communicator's all_reduce (bind), or None (see the top) */
static PyObject *tcp_lane_all_reduce(TcpLane *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (!positional("all_reduce", nargs, 3))
        return NULL;
    PyObject *x = args[0], *op_name = args[1], *out = args[2];
    if (!self->checks || !self->enabled || self->words.obj == NULL ||
        Py_TYPE(x) != (PyTypeObject *)self->ndarray ||
        (out != Py_None && Py_TYPE(out) != (PyTypeObject *)self->ndarray) ||
        !PyUnicode_CheckExact(op_name))
        Py_RETURN_NONE;
    PyObject *code = PyDict_GetItemWithError(self->ops, op_name);
    if (code == NULL) {
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_NONE;
    }
    int op = (int)PyLong_AsLong(code);
    PyObject *dtype, *out_dtype = NULL, *result = NULL, *target = NULL;
    int dtype_at = one_call_dtype(self->dtypes, x, &dtype);
    if (dtype_at == -2)
        return NULL;
    if (out != Py_None && one_call_dtype(self->dtypes, out, &out_dtype) == -2) {
        Py_DECREF(dtype);
        return NULL;
    }
    Py_XDECREF(out_dtype); /* (only compared: it lives as long as out) */
    Py_buffer xv, tv;
    int have_x = 0, have_target = 0, slot = -1, taken = 0;
    if (dtype_at < 0 || (out_dtype != NULL && out_dtype != dtype))
        goto decline;
    /* C-contiguous, with the shape, no format (bfloat16 has none): numpy refuses another */
    if (PyObject_GetBuffer(x, &xv, PyBUF_C_CONTIGUOUS) < 0)
        goto refused;
    have_x = 1;
    if (xv.len == 0 || xv.len > self->largest)
        goto decline;
    if (out != Py_None) {
        if (PyObject_GetBuffer(out, &tv, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0)
            goto refused;
        have_target = 1;
        if (tv.ndim != xv.ndim || (xv.ndim && memcmp(tv.shape, xv.shape,
                                                     xv.ndim * sizeof *xv.shape)))
            goto decline;
    }
    slot = gate_enter(self->gate, self->codes[ALL_REDUCE], dtype_at, op, -1, xv.len,
                      self->codes[CODE_NATIVE], 0);
    if (slot == -2) /* a child of os.fork(): the gate raised, saying why */
        goto done;
    if (slot == -1) /* another thread's call: the Python path says so */
        goto decline;
    PyObject *got = PyObject_CallOneArg(self->take, Py_False);
    if (got == NULL)
        goto done;
    taken = got == Py_True;
    Py_DECREF(got);
    int idle = taken ? engine_idle(self) : 0;
    if (idle < 0)
        goto done;
    if (!idle)
        goto decline;
    if (out != Py_None) {
        target = Py_NewRef(out);
    } else {
        PyObject *shape = PyTuple_New(xv.ndim);
        for (int i = 0; shape != NULL && i < xv.ndim; i++) {
            PyObject *d = PyLong_FromSsize_t(xv.shape[i]);
            if (d == NULL)
                Py_CLEAR(shape);
            else
                PyTuple_SET_ITEM(shape, i, d);
        }
        target = shape ? PyObject_CallFunctionObjArgs(self->empty, shape, dtype, NULL) : NULL;
        Py_XDECREF(shape);
        if (target == NULL ||
            PyObject_GetBuffer(target, &tv, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0)
            goto done;
        have_target = 1;
    }
    if (exchange_and_reduce(self, x, &xv, target, &tv, dtype_at, op) < 0)
        goto done;
    gate_done(self->gate, slot);
    result = Py_NewRef(target);
    goto done;
refused:
    if (!one_call_refused())
        goto done;
decline:
    result = Py_NewRef(Py_None);
done:
    if (taken && call_keeping_error(self->give, NULL) < 0)
        Py_CLEAR(result);
    if (slot >= 0) {
        if (result == NULL)
            one_call_named(self->namer, self->comm_error, "%U", self->name);
        gate_leave(self->gate, slot);
    }
    if (have_target)
        PyBuffer_Release(&tv);
    if (have_x)
        PyBuffer_Release(&xv);
    Py_XDECREF(target);
    Py_DECREF(dtype);
    return result;
}

#define FASTCALL(f) (PyCFunction)(void (*)(void))(f), METH_FASTCALL
static PyMethodDef tcp_lane_methods[] = {
    {"engine", (PyCFunction)tcp_lane_engine, METH_VARARGS, "The stream engine it takes."},
    {"calls", (PyCFunction)tcp_lane_calls, METH_VARARGS, "What its all_reduce takes."},
    {"bind", (PyCFunction)tcp_lane_bind, METH_VARARGS, "The communicator whose calls take it."},
    {"limit", (PyCFunction)tcp_lane_limit, METH_VARARGS, "The largest x a kind's path takes."},
    {"all_reduce", FASTCALL(tcp_lane_all_reduce), "The communicator's all_reduce, or None."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject TcpLaneType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tbcoll.transports._sockets.Lane",
    .tp_basicsize = sizeof(TcpLane),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "One tcp group's small all_reduce in one call.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)tcp_lane_init,
    .tp_dealloc = (destructor)tcp_lane_dealloc,
    .tp_traverse = (traverseproc)tcp_lane_traverse,
    .tp_clear = (inquiry)tcp_lane_clear,
    .tp_methods = tcp_lane_methods,
};

int add_tcp_lane(PyObject *module)
{
    GateType = gate_import();
    if (GateType == NULL) { /* the module still imports, saying why in GATE_ERROR */
        PyObject *type, *error, *trace;
        PyErr_Fetch(&type, &error, &trace);
        gate_error = error ? PyObject_Str(error) : NULL;
        Py_XDECREF(type);
        Py_XDECREF(error);
        Py_XDECREF(trace);
        if (gate_error == NULL)
            return -1;
    }
    if (PyModule_AddObjectRef(module, "GATE_ERROR", gate_error ? gate_error : Py_None) < 0 ||
        PyType_Ready(&TcpLaneType) < 0)
        return -1;
    return PyModule_AddObjectRef(module, "Lane", (PyObject *)&TcpLaneType);
}
