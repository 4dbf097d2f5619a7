/*
 * The shm lane's Python type, Lane (tbcoll/transports/shm/native.py), and its one-call collectives.
 *
 * Lane(*, segment, flags, size, rank, sets, slot_bytes, budget, resume, pids) is one
 * communicator's segment: the rounds (round(); the protocol is written once, in rounds.c's
 * run_round), the count of rounds done (`rounds`), and, once calls() told it how to sign each
 * call, the lane interface (tbcoll/include/lane.h) that lane_capsule() hands out:
 * tbcoll.core._gate.LaneCall runs an array's whole call, of any size, around this file's
 * segment_work (checks, the communicator's call gate, the round, past one round the rounds,
 * the count and the flight recorder), which Python did in ~0.7 us of a 1.4 us 8 B all_reduce,
 * more than the round (MPICH's whole call takes ~1.1 us), and a 1 MiB one in eight entries
 * into C. A larger all_gather or broadcast copies each block once (one_copy.c, Linux:
 * copies_once, the struct's beyond); send and recv move in C (moves.c's move_message). Once
 * comm.empty's buffers exist, takes() stops the lane where the Python path copies those once,
 * and its limits say so: the communicator's routes send larger calls there without entering
 * the lane.
 *
 * Includes: Python.h, tbcoll/include/buffers.h, lane.h (shm's), lane_base.h
 * (tbcoll/include/lane.h), moves.h, one_copy.h, cma.h (HAVE_CMA); nothing includes this file's
 * functions but _atomics.c (add_lane_type).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h> /* offsetof */
#include <string.h>
#include <structmember.h> /* T_ULONGLONG */

#include "../../include/buffers.h"
#include "cma.h" /* HAVE_CMA */
#include "lane.h"
#include "lane_base.h"
#include "moves.h"
#include "one_copy.h"

static void lane_offer(Lane *self, int size, int rank);

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
    return 0;
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
    lane_offer(self, (int)size, (int)rank);
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
 * calls(*, single_pass, all_reduce, all_gather, reduce_scatter, broadcast_call)
 * What the one-call paths take: all_reduce up to single_pass bytes and the others up to a
 * slot (until limit() says otherwise). How they sign a call: all_reduce and reduce_scatter's
 * signatures less the byte count, flat lists by dtype then op, all_gather's by dtype, and
 * broadcast's from broadcast_call(dtype, root), asked once each.
 */
static PyObject *lane_calls(Lane *self, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"single_pass", "all_reduce", "all_gather", "reduce_scatter",
                               "broadcast_call", NULL};
    Py_ssize_t single_pass;
    PyObject *all_reduce, *all_gather, *reduce_scatter, *broadcast_call;
    if (!every_keyword("calls", kwargs, keywords) ||
        !PyArg_ParseTupleAndKeywords(args, kwargs, "|$nOOOO:calls", keywords, &single_pass,
                                     &all_reduce, &all_gather, &reduce_scatter,
                                     &broadcast_call) ||
        lane_words(all_reduce, &self->all_reduce_calls[0][0], DTYPES * OPS) < 0 ||
        lane_words(all_gather, self->all_gather_calls, DTYPES) < 0 ||
        lane_words(reduce_scatter, &self->reduce_scatter_calls[0][0], DTYPES * OPS) < 0)
        return NULL;
    if (self->segment == NULL || single_pass < 0 || single_pass > self->slot_bytes) {
        PyErr_SetString(PyExc_ValueError, "calls: after Lane(), single_pass up to a slot");
        return NULL;
    }
    uint64_t *broadcast_calls = PyMem_Calloc((size_t)(DTYPES * self->size), sizeof(uint64_t));
    if (broadcast_calls == NULL)
        return PyErr_NoMemory();
    PyMem_Free(self->broadcast_calls);
    self->broadcast_calls = broadcast_calls;
    for (int k = 0; k < LANE_KIND_COUNT; k++)
        self->largest[k] = self->slot_bytes;
    self->largest[ALL_REDUCE] = self->single_pass = single_pass;
    for (int k = 0; k < LANE_KIND_COUNT; k++)
        self->up_to[k] = -1; /* every size, in rounds past one (takes()) */
    Py_XSETREF(self->broadcast_call, Py_NewRef(broadcast_call));
    self->calls_given = 1;
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
    self->largest[kind] = nbytes;
    Py_RETURN_NONE;
}

/* takes(kind, up_to): past one round, the segment's rounds take x of kind up to up_to bytes
 * (-1: every size); larger ones are the Python path's (the lane's limits say so) */
static PyObject *lane_takes(Lane *self, PyObject *args)
{
    int kind;
    Py_ssize_t up_to;
    if (!PyArg_ParseTuple(args, "in:takes", &kind, &up_to))
        return NULL;
    if (kind < 0 || kind >= LANE_KIND_COUNT) {
        PyErr_SetString(PyExc_ValueError, "bad kind");
        return NULL;
    }
    self->up_to[kind] = up_to < 0 ? -1 : up_to;
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

/* A bound all_gather or broadcast past its limit copies each block once (one_copy), where
 * attach() says it may and x is not inside the result but as this rank's block of it
 * (all_gather) or the result itself (broadcast) (the lane's beyond) */
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

/* A call past one round in the segment's rounds (lane_rounds: the same cut as the Python
 * path's): a broadcast in place in the result (the root copies x there first); an x that
 * overlaps the result other than in place read from a copy (later rounds write the result
 * while they read x). 0, or -1 with an exception. */
static int rounds_beyond(Lane *self, Round *r, char *base, uint64_t signature)
{
    const char *x_at = r->src, *result = r->dst;
    const char *mine = result + (r->kind == ALL_GATHER ? self->rank * r->src_len : 0);
    int apart = x_at >= result + r->dst_len || result >= x_at + r->src_len;
    char *copy = NULL;
    if (r->kind == BROADCAST) {
        if (r->root == self->rank && r->src != r->dst)
            memmove(r->dst, r->src, (size_t)r->dst_len);
        r->src = r->dst;
        r->src_len = r->dst_len;
    } else if (!apart && !(x_at == mine && r->kind != REDUCE_SCATTER)) {
        if ((copy = PyMem_Malloc((size_t)r->src_len)) == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        memcpy(copy, r->src, (size_t)r->src_len);
        r->src = copy;
    }
    int done = lane_rounds(self, r, base, signature);
    PyMem_Free(copy);
    return done;
}

/* A taken call in the segment: one round; past the kind's round, its blocks copied once
 * (copies_once) or the segment's rounds (the lane's work) */
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
    int done = xv->len <= self->largest[kind]
                   ? lane_round(self, &r, (char *)segment.buf, signature)
               : copies_once(self, kind, xv, tv)
                   ? one_copy(self, &r, segment.buf, signature)
                   : rounds_beyond(self, &r, (char *)segment.buf, signature);
    PyBuffer_Release(&segment);
    return done < 0 ? -1 : 0;
}

/* The largest x of kind the lane takes (its limits): in its rounds past one, up to takes()'s
 * size (every size: PY_SSIZE_T_MAX), at least a round's; 0 until calls() */
static Py_ssize_t round_limit(void *lane, int kind)
{
    const Lane *self = lane;
    if (!self->calls_given)
        return 0;
    if (self->up_to[kind] < 0)
        return PY_SSIZE_T_MAX;
    return self->up_to[kind] > self->largest[kind] ? self->up_to[kind] : self->largest[kind];
}

/* The lane interface this Lane offers (tbcoll/include/lane.h): every kind, send and recv (once
 * streams() lent the engine's rings; declined before), no engine's lock (the segment is this
 * communicator's alone, and the engine's rings are taken in its doors) */
static void lane_offer(Lane *self, int size, int rank)
{
    self->lane = (tbcoll_lane_v1){
        .version = TBCOLL_LANE_VERSION, .size = sizeof(tbcoll_lane_v1),
        .kinds = ((1u << LANE_KIND_COUNT) - 1) | LANE_MOVES, .ranks = size, .rank = rank,
        .state = self, .work = segment_work, .move = move_message, .ready = NULL,
        .limits = round_limit, .beyond = copies_once, .take = NULL, .give = NULL};
}

/* lane_capsule() -> the "tbcoll.lane.v1" capsule of the lane interface, for
 * tbcoll.core._gate.LaneCall (it keeps this Lane alive) */
static PyObject *lane_capsule(Lane *self, PyObject *unused)
{
    (void)unused;
    if (self->segment == NULL || !self->calls_given) {
        PyErr_SetString(PyExc_ValueError, "lane_capsule: after Lane() and calls()");
        return NULL;
    }
    return lane_capsule_new(&self->lane, (PyObject *)self);
}

#define FASTCALL(f) (PyCFunction)(void (*)(void))(f), METH_FASTCALL
static PyMethodDef lane_methods[] = {
    {"round", FASTCALL(lane_round_method), "One round of a collective, to its end."},
    {"rounds", FASTCALL(lane_rounds_method), "A collective of any size in rounds."},
    {"calls", (PyCFunction)(void (*)(void))lane_calls, METH_VARARGS | METH_KEYWORDS,
     "How the one-call paths sign calls."},
    {"limit", (PyCFunction)lane_limit, METH_VARARGS, "The largest x a kind's round takes."},
    {"takes", (PyCFunction)lane_takes, METH_VARARGS, "The largest x a kind's rounds take."},
    {"lane_capsule", (PyCFunction)lane_capsule, METH_NOARGS, "The lane interface (lane.h)."},
    {"streams", (PyCFunction)(void (*)(void))lane_streams, METH_VARARGS | METH_KEYWORDS,
     "The stream engine's rings, lent."},
    {"attach", (PyCFunction)lane_attach, METH_VARARGS, "Whether large calls copy once."},
    {"copy_once", (PyCFunction)lane_copy_once, METH_VARARGS, "A one-copy call's rounds."},
    {"move", (PyCFunction)lane_move, METH_VARARGS, "The stream engine's blocking move."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef lane_members[] = {
    {"rounds", T_ULONGLONG, offsetof(Lane, rounds), 0, "Rounds begun and finished."},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject LaneType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tbcoll.transports.shm._atomics.Lane",
    .tp_basicsize = sizeof(Lane),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "One communicator's shm segment: its rounds and its lane (lane.h).",
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
    if (PyType_Ready(&LaneType) < 0)
        return -1;
    Py_INCREF(&LaneType);
    if (PyModule_AddObject(module, "Lane", (PyObject *)&LaneType) < 0) {
        Py_DECREF(&LaneType);
        return -1;
    }
    return 0;
}
