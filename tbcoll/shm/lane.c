/*
 * The shm lane's Python type, Lane (tbcoll/shm/native.py), and its one-call collectives.
 *
 * Lane(*, segment, flags, size, rank, sets, slot_bytes, budget, resume, pids) is one
 * communicator's segment: the rounds (round(); the protocol is written once, in rounds.c's
 * run_round), the count of rounds done (`rounds`), and, once calls() told it what to check
 * and how to sign each call, one-call paths for small arrays that do in C what the
 * Communicator and the transport do in Python (the contract's one_call_run_any,
 * tbcoll/include/one_call.h, around this file's segment_work): check the arguments, take the
 * communicator's call gate (tbcoll/include/gate.h: its lock, the call in progress), run the
 * round, count the call and put it in the gate's flight recorder. That Python cost ~0.7 us of
 * a 1.4 us 8 B all_reduce, more than the round; MPICH's whole call takes ~1.1 us. A larger
 * all_gather or broadcast copies each block once (one_copy.c, Linux); send and recv are
 * checked and taken, and moved in C (moves.c). Each path returns None, having touched
 * nothing, where the call does not qualify (another array type or dtype, an empty x, an out
 * of another shape, too large, a busy communicator): the Python path then runs, and raises
 * where the call is wrong.
 *
 * Includes: Python.h, tbcoll/include/buffers.h, one_call.h, lane.h, lane_base.h, moves.h,
 * one_copy.h, cma.h (HAVE_CMA); nothing includes this file's functions but _atomics.c
 * (add_lane_type).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h> /* offsetof */
#include <string.h>
#include <structmember.h> /* T_ULONGLONG */

#include "../include/buffers.h"
#include "../include/one_call.h" /* one_call_import_gate, one_call_words */
#include "cma.h" /* HAVE_CMA */
#include "lane.h"
#include "lane_base.h"
#include "moves.h"
#include "one_copy.h"

static PyTypeObject *GateType; /* tbcoll._gate.Gate; NULL where its import failed: */
static PyObject *gate_error;   /* why (GATE_ERROR: tbcoll.shm.native raises it) */

static int lane_traverse(Lane *self, visitproc visit, void *arg)
{
    Py_VISIT(self->segment);
    Py_VISIT(self->resume);
    Py_VISIT(self->broadcast_call);
    Py_VISIT(self->refused);
    Py_VISIT(self->send);
    Py_VISIT(self->recv);
    Py_VISIT(self->finish_send);
    Py_VISIT(self->finish_recv);
    Py_VISIT(self->finish_pulled_send);
    Py_VISIT(self->finish_announced);
    Py_VISIT(self->look);
    Py_VISIT(self->words.obj);
    Py_VISIT(self->publish);
    return one_call_traverse(&self->call, visit, arg);
}

static int lane_clear(Lane *self)
{
    Py_CLEAR(self->segment);
    Py_CLEAR(self->resume);
    Py_CLEAR(self->broadcast_call);
    Py_CLEAR(self->refused);
    self->attached = 0;
    Py_CLEAR(self->send);
    Py_CLEAR(self->recv);
    Py_CLEAR(self->finish_send);
    Py_CLEAR(self->finish_recv);
    Py_CLEAR(self->finish_pulled_send);
    Py_CLEAR(self->finish_announced);
    Py_CLEAR(self->look);
    lane_release_words(self);
    Py_CLEAR(self->publish);
    PyMem_Free(self->stream_at);
    self->stream_at = NULL;
    PyMem_Free(self->next_look);
    self->next_look = NULL;
    one_call_clear(&self->call);
    return 0;
}

static void lane_dealloc(Lane *self)
{
    PyObject_GC_UnTrack(self);
    lane_clear(self);
    PyMem_Free(self->broadcast_calls);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int lane_init(Lane *self, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"segment", "flags", "size", "rank", "sets", "slot_bytes",
                               "budget", "resume", "pids", NULL};
    PyObject *segment, *resume;
    Py_ssize_t flags, size, rank, set0, set1, slot_bytes, pids;
    double budget;
    if (!every_keyword("Lane", kwargs, keywords) ||
        !PyArg_ParseTupleAndKeywords(args, kwargs, "|$Onnn(nn)ndOn:Lane", keywords, &segment,
                                     &flags, &size, &rank, &set0, &set1, &slot_bytes, &budget,
                                     &resume, &pids))
        return -1;
    Py_buffer view;
    if (PyObject_GetBuffer(segment, &view, PyBUF_WRITABLE) < 0)
        return -1;
    Py_ssize_t len = view.len;
    PyBuffer_Release(&view);
    Py_ssize_t last_set = set0 > set1 ? set0 : set1;
    if (size < 1 || size > MAX_RANKS || rank < 0 || rank >= size || flags < 0 || flags % 8 ||
        flags + size * LINE > len || slot_bytes < 0 || set0 < 0 || set1 < 0 ||
        slot_bytes > (len - last_set) / (size + 1) || /* + a split all_reduce's result area */
        pids < 0 || pids % 8 || pids > len - 8 * size) {
        PyErr_SetString(PyExc_ValueError, "the flags, pids and data sets do not fit the "
                                          "segment");
        return -1;
    }
    lane_clear(self);
    Py_INCREF(segment);
    Py_INCREF(resume);
    self->segment = segment;
    self->resume = resume;
    self->flags = flags;
    self->size = size;
    self->rank = rank;
    self->sets[0] = set0;
    self->sets[1] = set1;
    self->slot_bytes = slot_bytes;
    self->pids_at = pids;
    self->budget = budget;
    self->rounds = 0;
    return 0;
}

/*
 * round(kind, src, src_stride, dst, dst_stride, dtype, op, root, signature)
 * One round of the given kind (run_round), to its end.
 */
static PyObject *lane_round_method(Lane *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (!positional("round", nargs, 9))
        return NULL;
    Round r;
    long kind = PyLong_AsLong(args[0]), dtype = PyLong_AsLong(args[5]),
         op = PyLong_AsLong(args[6]), root = PyLong_AsLong(args[7]);
    r.src_stride = PyLong_AsSsize_t(args[2]);
    r.dst_stride = PyLong_AsSsize_t(args[4]);
    uint64_t signature = (uint64_t)PyLong_AsUnsignedLongLong(args[8]);
    if (PyErr_Occurred())
        return NULL;
    if (self->segment == NULL || kind < 0 || kind >= KINDS || dtype < 0 || dtype >= DTYPES ||
        op < 0 || op >= OPS || root < 0 || root >= self->size) {
        PyErr_SetString(PyExc_ValueError, "bad kind, dtype, op or root");
        return NULL;
    }
    r.kind = (int)kind;
    r.dtype = (int)dtype;
    r.op = (int)op;
    r.root = (int)root;
    Py_buffer views[3]; /* segment, src, dst */
    if (take_buffers((BufferRequest[]){{self->segment, PyBUF_WRITABLE}, {args[1], PyBUF_SIMPLE},
                                       {args[3], PyBUF_WRITABLE}}, views, 3) < 0)
        return NULL;
    r.src = (const char *)views[1].buf;
    r.src_len = views[1].len;
    r.dst = (char *)views[2].buf;
    r.dst_len = views[2].len;
    int stage = lane_round(self, &r, (char *)views[0].buf, signature);
    release_buffers(views, 3);
    if (stage < 0)
        return NULL;
    Py_RETURN_NONE;
}

/*
 * rounds(kind, src, dst, dtype, op, root, signature): a collective of any size in the
 * segment's rounds (lane_rounds: the cut is made there alone), the call's signature in its
 * first round. src and dst: all_reduce's x and result (of one size), all_gather's block and
 * result (size blocks), reduce_scatter's x (size blocks) and block, broadcast's buffer (src
 * and dst the same: in place).
 */
static PyObject *lane_rounds_method(Lane *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (!positional("rounds", nargs, 7))
        return NULL;
    long kind = PyLong_AsLong(args[0]), dtype = PyLong_AsLong(args[3]),
         op = PyLong_AsLong(args[4]), root = PyLong_AsLong(args[5]);
    uint64_t signature = (uint64_t)PyLong_AsUnsignedLongLong(args[6]);
    if (PyErr_Occurred())
        return NULL;
    if (self->segment == NULL || kind < 0 || kind >= ONE_CALL_KINDS || dtype < 0 ||
        dtype >= DTYPES || op < 0 || op >= OPS || root < 0 || root >= self->size) {
        PyErr_SetString(PyExc_ValueError, "bad kind, dtype, op or root");
        return NULL;
    }
    Py_buffer views[3]; /* segment, src, dst */
    if (take_buffers((BufferRequest[]){{self->segment, PyBUF_WRITABLE}, {args[1], PyBUF_SIMPLE},
                                       {args[2], PyBUF_WRITABLE}}, views, 3) < 0)
        return NULL;
    Py_ssize_t src_len = views[1].len, dst_len = views[2].len;
    Round r = {.src = views[1].buf, .src_len = src_len, .dst = views[2].buf,
               .dst_len = dst_len, .kind = (int)kind, .dtype = (int)dtype, .op = (int)op,
               .root = (int)root};
    int fits = dst_len % ITEMSIZE[dtype] == 0;
    switch (kind) {
    case ALL_GATHER:
        r.dst_stride = src_len;
        fits = dst_len == self->size * src_len;
        break;
    case REDUCE_SCATTER:
        r.src_stride = dst_len;
        fits = fits && src_len == self->size * dst_len;
        break;
    case BROADCAST:
        fits = views[1].buf == views[2].buf && src_len == dst_len;
        break;
    default: /* ALL_REDUCE */
        fits = fits && src_len == dst_len;
    }
    int done = fits ? lane_rounds(self, &r, (char *)views[0].buf, signature) : 0;
    release_buffers(views, 3);
    if (!fits) {
        PyErr_SetString(PyExc_ValueError, "rounds: src and dst of other sizes than the kind's");
        return NULL;
    }
    if (done < 0)
        return NULL;
    Py_RETURN_NONE;
}

/*
 * calls(*, single_pass, ndarray, dtypes, ops, empty, all_reduce, all_gather, reduce_scatter,
 *       broadcast_call)
 * What the one-call paths take: numpy arrays (ndarray) of the dtypes (a tuple, by code),
 * reductions named in ops (name -> code), all_reduce up to single_pass bytes and the others
 * up to a slot (until limit() says otherwise); new results from empty(shape, dtype)
 * (one_call_calls). How they sign a call: all_reduce and reduce_scatter's signatures less
 * the byte count, flat lists by dtype then op, all_gather's by dtype, and broadcast's from
 * broadcast_call(dtype, root), asked once each.
 */
static PyObject *lane_calls(Lane *self, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"single_pass", "ndarray", "dtypes", "ops", "empty", "all_reduce",
                               "all_gather", "reduce_scatter", "broadcast_call", NULL};
    Py_ssize_t single_pass;
    PyObject *ndarray, *dtypes, *ops, *empty, *all_reduce, *all_gather, *reduce_scatter,
        *broadcast_call;
    if (!every_keyword("calls", kwargs, keywords) ||
        !PyArg_ParseTupleAndKeywords(args, kwargs, "|$nOOOOOOOO:calls", keywords, &single_pass,
                                     &ndarray, &dtypes, &ops, &empty, &all_reduce, &all_gather,
                                     &reduce_scatter, &broadcast_call) ||
        one_call_words(all_reduce, &self->all_reduce_calls[0][0], DTYPES * OPS) < 0 ||
        one_call_words(all_gather, self->all_gather_calls, DTYPES) < 0 ||
        one_call_words(reduce_scatter, &self->reduce_scatter_calls[0][0], DTYPES * OPS) < 0)
        return NULL;
    uint64_t *broadcast_calls = PyMem_Calloc((size_t)(DTYPES * self->size), sizeof(uint64_t));
    if (broadcast_calls == NULL)
        return PyErr_NoMemory();
    /* (no engine's lock: the segment is this communicator's alone) */
    if (one_call_calls(&self->call, (int)self->size, ndarray, dtypes, ops, empty, NULL, NULL,
                       self->slot_bytes) < 0) {
        PyMem_Free(broadcast_calls);
        return NULL;
    }
    PyMem_Free(self->broadcast_calls);
    self->broadcast_calls = broadcast_calls;
    self->call.largest[ALL_REDUCE] = self->single_pass = single_pass;
    Py_XSETREF(self->broadcast_call, Py_NewRef(broadcast_call));
    Py_RETURN_NONE;
}

/* limit(kind, nbytes): the largest x whose call of that kind takes the one-call path (at
 * most a slot; past it the Python path runs, e.g. a one-copy all_gather) */
static PyObject *lane_limit(Lane *self, PyObject *args)
{
    int kind;
    Py_ssize_t nbytes;
    if (!PyArg_ParseTuple(args, "in:limit", &kind, &nbytes))
        return NULL;
    if (kind < 0 || kind >= ONE_CALL_KINDS || nbytes < 0 || nbytes > self->slot_bytes) {
        PyErr_SetString(PyExc_ValueError, "bad kind, or more bytes than a slot");
        return NULL;
    }
    self->call.largest[kind] = nbytes;
    Py_RETURN_NONE;
}

/*
 * attach(on, everyone, refused): whether a bound all_gather or broadcast of more than its
 * limit() copies each block once (Linux's cross-memory attach: one_copy); everyone, the
 * (dtype, op) codes of int64 and min; refused(), called where a copy was refused on some rank
 * (CMA is then off).
 */
static PyObject *lane_attach(Lane *self, PyObject *args)
{
    int on, dtype, op;
    PyObject *refused;
    if (!PyArg_ParseTuple(args, "p(ii)O:attach", &on, &dtype, &op, &refused))
        return NULL;
    if (dtype < 0 || dtype >= DTYPES || op < 0 || op >= OPS) {
        PyErr_SetString(PyExc_ValueError, "bad dtype or op code");
        return NULL;
    }
    self->attached = on && HAVE_CMA;
    self->everyone_dtype = dtype;
    self->everyone_op = op;
    Py_XSETREF(self->refused, Py_NewRef(refused));
    Py_RETURN_NONE;
}

/*
 * bind(*, gate, codes, names, enabled, max_tag, comm_error, namer)
 * The communicator whose calls take the lane: its call gate (a tbcoll._gate.Gate, taken
 * around each call, counting the collectives and recording them), the gate's codes of the
 * lane's calls (tbcoll.gate: each kind's, in the kinds' order, then send's, recv's and the
 * native algorithm's), each kind's name (for its errors), a mask of the kinds that may take
 * the lane (bit k: kind k; ONE_CALL_MOVES: send and recv, with tags up to max_tag, once
 * streams() was called), and how its errors are named: a comm_error raised in a call is
 * raised again as namer()(error, what) (see named). Returns the mask it took: all of
 * enabled.
 */
static PyObject *lane_bind(Lane *self, PyObject *args, PyObject *kwargs)
{
    /* every kind and the moves: all it has */
    return one_call_bind(&self->call, GateType, gate_error, args, kwargs,
                         ((1 << ONE_CALL_KINDS) - 1) | ONE_CALL_MOVES);
}

/* A bound all_gather or broadcast past its limit copies each block once (one_copy), where
 * attach() says it may and x is not inside the result but as this rank's block of it
 * (all_gather) or the result itself (broadcast) (OneCallBeyond) */
static int copies_once(void *lane, int kind, const Py_buffer *xv, const Py_buffer *out)
{
    Lane *self = lane;
    if (!self->attached || (kind != ALL_GATHER && kind != BROADCAST))
        return 0;
    if (out == NULL)
        return 1;
    const char *x_at = xv->buf, *result = out->buf;
    const char *mine = result + (kind == ALL_GATHER ? self->rank * xv->len : 0);
    return x_at == mine || x_at >= result + out->len || result >= x_at + xv->len;
}

/* A taken call in the segment: one round, or past the kind's limit its blocks copied once
 * (OneCallWork) */
static int segment_work(void *lane, int kind, PyObject *x, const Py_buffer *xv,
                        PyObject *target, const Py_buffer *tv, int dtype, int op, int root)
{
    Lane *self = lane;
    Round r = {.src = xv->buf, .src_len = xv->len, .dst = tv->buf, .dst_len = tv->len,
               .kind = kind, .dtype = BYTES_DTYPE};
    uint64_t signature = CALL_BYTES_OF(xv->len);
    switch (kind) {
    case ALL_REDUCE:
        r.dtype = dtype;
        r.op = op;
        signature |= self->all_reduce_calls[dtype][op];
        break;
    case ALL_GATHER:
        r.dst_stride = xv->len;
        signature |= self->all_gather_calls[dtype];
        break;
    case REDUCE_SCATTER:
        r.src_stride = tv->len;
        r.dtype = dtype;
        r.op = op;
        signature |= self->reduce_scatter_calls[dtype][op];
        break;
    default: { /* BROADCAST */
        uint64_t *call = &self->broadcast_calls[dtype * self->size + root];
        if (*call == 0) {
            PyObject *word = PyObject_CallFunction(self->broadcast_call,
                                                 CALLBACK_FORMAT(BROADCAST_CALL), dtype, root);
            *call = word ? (uint64_t)PyLong_AsUnsignedLongLong(word) : 0;
            Py_XDECREF(word);
            if (PyErr_Occurred())
                return -1;
        }
        r.root = root;
        signature |= *call;
    }
    }
    Py_buffer segment;
    if (PyObject_GetBuffer(self->segment, &segment, PyBUF_WRITABLE) < 0)
        return -1;
    int done = xv->len > self->call.largest[kind]
                   ? one_copy(self, &r, segment.buf, signature)
                   : lane_round(self, &r, (char *)segment.buf, signature);
    PyBuffer_Release(&segment);
    return done < 0 ? -1 : 0;
}

/* The one-call path of a collective of kind (one_call_run_any): guarded, the communicator's
 * call (bind), else the transport's direct_* path. */
static PyObject *one_call(Lane *self, int kind, PyObject *x, PyObject *op_name, long root,
                          PyObject *out, int guarded)
{
    return one_call_run_any(&self->call, self, kind, x, op_name, root, out, guarded, NULL,
                            copies_once, segment_work);
}

static int take_root(PyObject *root, long *value)
{
    if (!PyLong_CheckExact(root)) /* (not a bool: the Python path says what is wrong) */
        return 0;
    *value = PyLong_AsLong(root);
    if (*value == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return 1;
}

/* direct(kind, x, op, root, out): the transport's direct_* path (tbcoll.transports.base),
 * whose caller holds the communicator and counts the call. */
static PyObject *lane_direct(Lane *self, PyObject *const *args, Py_ssize_t nargs)
{
    long kind, root = -1;
    if (!positional("direct", nargs, 5))
        return NULL;
    kind = PyLong_AsLong(args[0]);
    if (kind < 0 || kind >= ONE_CALL_KINDS) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "bad kind");
        return NULL;
    }
    if (kind == BROADCAST && !take_root(args[3], &root))
        Py_RETURN_NONE;
    return one_call(self, (int)kind, args[1], args[2], root, args[4], 0);
}

/* The communicator's calls (bind), their errors named: all_reduce(x, op, out), all_gather(x, out),
 * reduce_scatter(x, op, out), broadcast(x, root, out). */
static PyObject *lane_all_reduce(Lane *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (!positional("all_reduce", nargs, 3))
        return NULL;
    return one_call(self, ALL_REDUCE, args[0], args[1], -1, args[2], 1);
}

static PyObject *lane_all_gather(Lane *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (!positional("all_gather", nargs, 2))
        return NULL;
    return one_call(self, ALL_GATHER, args[0], Py_None, -1, args[1], 1);
}

static PyObject *lane_reduce_scatter(Lane *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (!positional("reduce_scatter", nargs, 3))
        return NULL;
    return one_call(self, REDUCE_SCATTER, args[0], args[1], -1, args[2], 1);
}

static PyObject *lane_broadcast(Lane *self, PyObject *const *args, Py_ssize_t nargs)
{
    long root;
    if (!positional("broadcast", nargs, 3))
        return NULL;
    if (!take_root(args[1], &root))
        Py_RETURN_NONE;
    return one_call(self, BROADCAST, args[0], Py_None, root, args[2], 1);
}

#define FASTCALL(f) (PyCFunction)(void (*)(void))(f), METH_FASTCALL
static PyMethodDef lane_methods[] = {
    {"round", FASTCALL(lane_round_method), "One round of a collective, to its end."},
    {"rounds", FASTCALL(lane_rounds_method), "A collective of any size in rounds."},
    {"calls", (PyCFunction)(void (*)(void))lane_calls, METH_VARARGS | METH_KEYWORDS, "What the one-call paths take."},
    {"limit", (PyCFunction)lane_limit, METH_VARARGS, "The largest x a kind's path takes."},
    {"bind", (PyCFunction)(void (*)(void))lane_bind, METH_VARARGS | METH_KEYWORDS, "The communicator whose calls take it."},
    {"streams", (PyCFunction)(void (*)(void))lane_streams, METH_VARARGS | METH_KEYWORDS, "The stream engine's rings, lent."},
    {"attach", (PyCFunction)lane_attach, METH_VARARGS, "Whether large calls copy once."},
    {"copy_once", (PyCFunction)lane_copy_once, METH_VARARGS, "A one-copy call's rounds."},
    {"direct", FASTCALL(lane_direct), "A transport's one-call path."},
    {"all_reduce", FASTCALL(lane_all_reduce), "The communicator's all_reduce, or None."},
    {"all_gather", FASTCALL(lane_all_gather), "The communicator's all_gather, or None."},
    {"reduce_scatter", FASTCALL(lane_reduce_scatter), "The communicator's reduce_scatter."},
    {"broadcast", FASTCALL(lane_broadcast), "The communicator's broadcast, or None."},
    {"move", (PyCFunction)lane_move, METH_VARARGS, "The stream engine's blocking move."},
    {"send", FASTCALL(lane_send), "The communicator's send (True), or None."},
    {"recv", FASTCALL(lane_recv), "The communicator's recv (out), or None."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef lane_members[] = {
    {"rounds", T_ULONGLONG, offsetof(Lane, rounds), 0, "Rounds begun and finished."},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject LaneType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tbcoll.shm._atomics.Lane",
    .tp_basicsize = sizeof(Lane),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "One communicator's shm segment: its rounds and one-call paths.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)lane_init,
    .tp_dealloc = (destructor)lane_dealloc,
    .tp_traverse = (traverseproc)lane_traverse,
    .tp_clear = (inquiry)lane_clear,
    .tp_methods = lane_methods,
    .tp_members = lane_members,
};

int add_lane_type(PyObject *module)
{
    if (PyType_Ready(&LaneType) < 0 ||
        one_call_import_gate(module, &GateType, &gate_error) < 0)
        return -1;
    Py_INCREF(&LaneType);
    if (PyModule_AddObject(module, "Lane", (PyObject *)&LaneType) < 0) {
        Py_DECREF(&LaneType);
        return -1;
    }
    return 0;
}
