/*
 * tbcoll.core._gate.Gate: a communicator's call gate (tbcoll/include/gate.h has its layout and
 * operations; tbcoll/core/gate.py its codes and its Python twin, taken where this is not built).
 * The Communicator drives it through the methods below; C code that makes a whole call
 * (LaneCall, one_call.c, in this extension) through gate.h's functions on the same struct. See
 * gate.h for why the GIL alone keeps it consistent.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "../include/gate.h"
#include "one_call.h" /* LaneCall: the whole call around a transport's lane */

/* tbcoll.core.dtypes' dtypes and ops in the order of their codes (DTYPE_CODES, OP_CODES), as
 * tbcoll.core.gate gives them at its import (codes()): the one registry, not a copy of it */
static PyObject *dtype_table, *op_table;

/* obj's code in table (by identity, else by equality), or -1: None, or not in it */
static int code_of(PyObject *table, PyObject *obj)
{
    if (obj == Py_None || table == NULL)
        return -1;
    Py_ssize_t n = PyTuple_GET_SIZE(table);
    for (Py_ssize_t i = 0; i < n; i++)
        if (PyTuple_GET_ITEM(table, i) == obj)
            return (int)i;
    for (Py_ssize_t i = 0; i < n; i++) {
        int same = PyObject_RichCompareBool(PyTuple_GET_ITEM(table, i), obj, Py_EQ);
        if (same > 0)
            return (int)i;
        if (same < 0)
            PyErr_Clear(); /* (not comparable: not this one) */
    }
    return -1;
}

static int gate_init(Gate *self, PyObject *args, PyObject *kwargs)
{
    Py_ssize_t size;
    static char *keywords[] = {"record", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "n:Gate", keywords, &size))
        return -1;
    if (size < 0) {
        PyErr_SetString(PyExc_ValueError, "record must be 0 or more calls");
        return -1;
    }
    if (self->ring != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "a Gate is made once");
        return -1;
    }
    self->ring = PyMem_Calloc(size ? (size_t)size : 1, sizeof(GateRecord));
    if (self->ring == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    self->ring_size = size;
    self->refusal = &self->refused_here; /* 0: calls go on */
    return 0;
}

static PyObject *gate_unwatch(Gate *self, PyObject *unused);

static void gate_dealloc(Gate *self)
{
    Py_CLEAR(self->forked_error);
    Py_CLEAR(self->forked_message);
    Py_XDECREF(gate_unwatch(self, NULL));
    PyMem_Free(self->ring);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* A call's n arguments into values: ints, but for those at dtype_at (a numpy dtype, or
 * None) and op_at (an op's name, or None), which become their codes; 0 with an error. */
static int arguments(const char *name, PyObject *const *args, Py_ssize_t nargs, Py_ssize_t n,
                     Py_ssize_t dtype_at, Py_ssize_t op_at, long long *values)
{
    if (nargs != n) {
        PyErr_Format(PyExc_TypeError, "%s takes %zd arguments (%zd given)", name, n, nargs);
        return 0;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i == dtype_at || i == op_at) {
            values[i] = code_of(i == dtype_at ? dtype_table : op_table, args[i]);
            continue;
        }
        values[i] = PyLong_AsLongLong(args[i]);
        if (values[i] == -1 && PyErr_Occurred())
            return 0;
    }
    return 1;
}

/* codes(dtypes, ops): the registry's dtypes and ops, in the order of their codes */
static PyObject *gate_codes(PyObject *module, PyObject *args)
{
    PyObject *dtypes, *ops;
    (void)module;
    if (!PyArg_ParseTuple(args, "O!O!:codes", &PyTuple_Type, &dtypes, &PyTuple_Type, &ops))
        return NULL;
    Py_XSETREF(dtype_table, Py_NewRef(dtypes));
    Py_XSETREF(op_table, Py_NewRef(ops));
    Py_RETURN_NONE;
}

/* enter(kind, dtype, op, root, nbytes, algorithm, timed) -> slot, or -1 where another call
 * holds the gate (raises in a forked child). dtype: a numpy dtype or None; op: an op's name
 * or None (their codes are the gate's); the rest ints (codes, -1 for none). */
static PyObject *gate_enter_method(Gate *self, PyObject *const *args, Py_ssize_t nargs)
{
    long long v[7];
    if (!arguments("enter", args, nargs, 7, 1, 2, v))
        return NULL;
    int slot = gate_enter(self, (int)v[0], (int)v[1], (int)v[2], (long)v[3], (Py_ssize_t)v[4],
                          (int)v[5], (int)v[6]);
    return slot == -2 ? NULL : PyLong_FromLong(slot);
}

/* enter_move(kind, dtype, peer, tag, nbytes) -> slot, or -1: send's and recv's enter */
static PyObject *gate_enter_move_method(Gate *self, PyObject *const *args, Py_ssize_t nargs)
{
    long long v[5];
    if (!arguments("enter_move", args, nargs, 5, 1, -1, v))
        return NULL;
    int slot = gate_enter_move(self, (int)v[0], (int)v[1], (long)v[2], (long)v[3],
                               (Py_ssize_t)v[4]);
    return slot == -2 ? NULL : PyLong_FromLong(slot);
}

/* begin(kind, dtype, op, root, nbytes, algorithm) -> slot: a timed call in progress, the gate
 * not taken (arguments as enter's) */
static PyObject *gate_begin_method(Gate *self, PyObject *const *args, Py_ssize_t nargs)
{
    long long v[6];
    if (!arguments("begin", args, nargs, 6, 1, 2, v))
        return NULL;
    return PyLong_FromLong(gate_begin(self, (int)v[0], (int)v[1], (int)v[2], (long)v[3],
                                      (Py_ssize_t)v[4], (int)v[5], 1));
}

static int slot_of(PyObject *arg)
{
    long slot = PyLong_AsLong(arg);
    return slot == -1 && PyErr_Occurred() ? -2 : (int)slot;
}

static PyObject *gate_leave_method(Gate *self, PyObject *arg)
{
    int slot = slot_of(arg);
    if (slot == -2)
        return NULL;
    gate_leave(self, slot);
    Py_RETURN_NONE;
}

static PyObject *gate_end_method(Gate *self, PyObject *arg)
{
    int slot = slot_of(arg);
    if (slot == -2)
        return NULL;
    gate_end(self, slot);
    Py_RETURN_NONE;
}

static PyObject *gate_count_method(Gate *self, PyObject *arg)
{
    int slot = slot_of(arg);
    if (slot == -2)
        return NULL;
    return PyLong_FromUnsignedLongLong(gate_count(self, slot));
}

static PyObject *gate_record_method(Gate *self, PyObject *arg)
{
    int slot = slot_of(arg);
    if (slot == -2)
        return NULL;
    gate_record(self, slot);
    Py_RETURN_NONE;
}

static PyObject *gate_done_method(Gate *self, PyObject *arg)
{
    int slot = slot_of(arg);
    if (slot == -2)
        return NULL;
    gate_done(self, slot);
    Py_RETURN_NONE;
}

/* a record as tbcoll.core.gate.RECORD: (seq, kind, dtype, op, root, bytes, algorithm, start, end)
 * */
static PyObject *record_tuple(const GateRecord *r)
{
    return Py_BuildValue("(LhhhiLhdd)", (long long)r->seq, r->kind, r->dtype, r->op,
                         (int)r->root, (long long)r->bytes, r->algorithm, r->start, r->end);
}

static int by_seq(const void *a, const void *b)
{
    int64_t x = (*(const GateRecord *const *)a)->seq, y = (*(const GateRecord *const *)b)->seq;
    return (x > y) - (x < y);
}

/* calls() -> the recorded calls, oldest first */
static PyObject *gate_calls(Gate *self, PyObject *unused)
{
    (void)unused;
    Py_ssize_t n = 0;
    const GateRecord **held = PyMem_New(const GateRecord *, self->ring_size ? self->ring_size
                                                                            : 1);
    if (held == NULL)
        return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < self->ring_size; i++)
        if (self->ring[i].seq > 0)
            held[n++] = &self->ring[i];
    qsort(held, (size_t)n, sizeof *held, by_seq);
    PyObject *list = PyList_New(n);
    for (Py_ssize_t i = 0; list != NULL && i < n; i++) {
        PyObject *item = record_tuple(held[i]);
        if (item == NULL)
            Py_CLEAR(list);
        else
            PyList_SET_ITEM(list, i, item);
    }
    PyMem_Free(held);
    return list;
}

/* last() -> the last call recorded (a record), or None */
static PyObject *gate_last(Gate *self, PyObject *unused)
{
    (void)unused;
    if (self->last.seq == 0)
        Py_RETURN_NONE;
    return record_tuple(&self->last);
}

/* current() -> the innermost call in progress as tbcoll.core.gate.CURRENT: (seq, kind, dtype, op,
 * root, bytes, algorithm, peer, tag, start, thread), seq 0 where not counted yet; or None */
static PyObject *gate_current(Gate *self, PyObject *unused)
{
    (void)unused;
    for (int slot = self->depth - 1; slot >= 0; slot--) {
        const GateCall *c = &self->calls[slot];
        if (!c->active)
            continue;
        return Py_BuildValue("(LhhhiLhiidk)", (long long)c->call.seq, c->call.kind,
                             c->call.dtype, c->call.op, (int)c->call.root,
                             (long long)c->call.bytes, c->call.algorithm, (int)c->peer,
                             (int)c->tag, c->call.start, c->thread);
    }
    Py_RETURN_NONE;
}

/* fork(error, message): this process is a forked child; every call raises error(message) */
static PyObject *gate_fork(Gate *self, PyObject *args)
{
    PyObject *error, *message;
    if (!PyArg_ParseTuple(args, "OU:fork", &error, &message))
        return NULL;
    if (!PyExceptionClass_Check(error)) {
        PyErr_SetString(PyExc_TypeError, "fork's error must be an exception class");
        return NULL;
    }
    Py_XSETREF(self->forked_error, Py_NewRef(error));
    Py_XSETREF(self->forked_message, Py_NewRef(message));
    self->forked = 1;
    gate_refuse_here(self);
    Py_RETURN_NONE;
}

/* revoke(error, message): every later call raises error(message), or error(*message) where
 * message is a tuple (RankFailedError's message and peers); the first revocation's stays (in
 * a forked child, the fork's) */
static PyObject *gate_revoke(Gate *self, PyObject *args)
{
    PyObject *error, *message;
    if (!PyArg_ParseTuple(args, "OO:revoke", &error, &message))
        return NULL;
    if (!PyExceptionClass_Check(error) || !(PyUnicode_Check(message) || PyTuple_Check(message))) {
        PyErr_SetString(PyExc_TypeError, "revoke(error class, message str or arguments tuple)");
        return NULL;
    }
    if (!self->forked && !self->revoked) {
        Py_XSETREF(self->forked_error, Py_NewRef(error));
        Py_XSETREF(self->forked_message, Py_NewRef(message));
    }
    self->revoked = 1;
    gate_refuse_here(self);
    Py_RETURN_NONE;
}

/* watch(word, error, why): from now on every call raises error(why()) once word's first
 * 8 bytes (aligned) are nonzero: the transport's revocation word (Group.revocation), which a
 * peer's notice sets; once per gate */
static PyObject *gate_watch(Gate *self, PyObject *args)
{
    PyObject *word, *error, *why;
    if (!PyArg_ParseTuple(args, "OOO:watch", &word, &error, &why))
        return NULL;
    if (!PyExceptionClass_Check(error) || !PyCallable_Check(why) || self->revoked_word != NULL) {
        PyErr_SetString(PyExc_TypeError, "watch(word, error class, why callable), once");
        return NULL;
    }
    if (PyObject_GetBuffer(word, &self->revoked_view, PyBUF_SIMPLE) < 0)
        return NULL;
    if (self->revoked_view.len < (Py_ssize_t)sizeof(uint64_t) ||
        (uintptr_t)self->revoked_view.buf % sizeof(uint64_t)) {
        PyBuffer_Release(&self->revoked_view);
        PyErr_SetString(PyExc_ValueError, "watch: the word must be 8 aligned bytes");
        return NULL;
    }
    self->revoked_word = self->revoked_view.buf;
    self->revoked_error = Py_NewRef(error);
    self->revoked_why = Py_NewRef(why);
    if (!self->refused_here)
        self->refusal = self->revoked_word;
    Py_RETURN_NONE;
}

/* unwatch(): give the word's memory back (before the transport unmaps it: Group.close); a
 * revocation already read stays */
static PyObject *gate_unwatch(Gate *self, PyObject *unused)
{
    (void)unused;
    if (self->revoked_word != NULL) {
        self->refusal = &self->refused_here; /* (a revocation read stays: refused_here) */
        self->revoked_word = NULL;
        PyBuffer_Release(&self->revoked_view);
        Py_CLEAR(self->revoked_error);
        Py_CLEAR(self->revoked_why);
    }
    Py_RETURN_NONE;
}

static PyObject *gate_get_completed(Gate *self, void *unused)
{
    (void)unused;
    return PyLong_FromUnsignedLongLong(self->completed);
}

static PyObject *gate_get_forked(Gate *self, void *unused)
{
    (void)unused;
    return PyBool_FromLong(self->forked);
}

static PyObject *gate_get_revoked(Gate *self, void *unused)
{
    (void)unused;
    return PyBool_FromLong(self->revoked || (!self->refused_here && gate_refused(self)));
}

static PyObject *gate_get_held(Gate *self, void *unused)
{
    (void)unused;
    return PyBool_FromLong(self->held);
}

static PyObject *gate_get_record(Gate *self, void *unused)
{
    (void)unused;
    return PyLong_FromSsize_t(self->ring_size);
}

#define FASTCALL(f) (PyCFunction)(void (*)(void))(f), METH_FASTCALL
static PyMethodDef gate_methods[] = {
    {"enter", FASTCALL(gate_enter_method), "Take the gate for a call: its slot, or -1."},
    {"enter_move", FASTCALL(gate_enter_move_method), "enter, for send and recv."},
    {"begin", FASTCALL(gate_begin_method), "A timed call in progress, the gate not taken."},
    {"leave", (PyCFunction)gate_leave_method, METH_O, "End the call and give the gate back."},
    {"end", (PyCFunction)gate_end_method, METH_O, "End a call begun."},
    {"count", (PyCFunction)gate_count_method, METH_O, "Number the call: its seq."},
    {"record", (PyCFunction)gate_record_method, METH_O, "The counted call completed."},
    {"done", (PyCFunction)gate_done_method, METH_O, "count and record."},
    {"calls", (PyCFunction)gate_calls, METH_NOARGS, "The recorded calls, oldest first."},
    {"last", (PyCFunction)gate_last, METH_NOARGS, "The last call recorded, or None."},
    {"current", (PyCFunction)gate_current, METH_NOARGS, "The call in progress, or None."},
    {"fork", (PyCFunction)gate_fork, METH_VARARGS, "In a forked child: calls raise."},
    {"revoke", (PyCFunction)gate_revoke, METH_VARARGS, "Revoked: calls raise."},
    {"watch", (PyCFunction)gate_watch, METH_VARARGS, "A peer's revocation sets this word."},
    {"unwatch", (PyCFunction)gate_unwatch, METH_NOARGS, "Give the watched word back."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef gate_getset[] = {
    {"completed", (getter)gate_get_completed, NULL, "Collectives counted.", NULL},
    {"forked", (getter)gate_get_forked, NULL, "In a forked child.", NULL},
    {"held", (getter)gate_get_held, NULL, "A call holds the gate.", NULL},
    {"revoked", (getter)gate_get_revoked, NULL, "Revoked: every call raises.", NULL},
    {"record_size", (getter)gate_get_record, NULL, "The flight recorder's size.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject GateType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tbcoll.core._gate.Gate",
    .tp_basicsize = sizeof(Gate),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A communicator's call gate: its lock, calls in progress, count and recorder.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)gate_init,
    .tp_dealloc = (destructor)gate_dealloc,
    .tp_methods = gate_methods,
    .tp_getset = gate_getset,
};

static GateLayout layout = {GATE_LAYOUT, sizeof(Gate), sizeof(GateRecord), sizeof(GateCall),
                            &GateType};

static PyMethodDef module_methods[] = {
    {"codes", gate_codes, METH_VARARGS, "The registry's dtypes and ops, by code."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef gate_module = {
    PyModuleDef_HEAD_INIT, "tbcoll.core._gate",
    "A communicator's call gate (include/gate.h), and the whole call around a transport's lane "
    "(LaneCall, include/lane.h).", -1,
    module_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__gate(void)
{
    PyObject *module = PyModule_Create(&gate_module);
    if (module == NULL)
        return NULL;
    PyObject *capsule = PyType_Ready(&GateType) < 0
                            ? NULL : PyCapsule_New(&layout, GATE_CAPSULE, NULL);
    int failed = capsule == NULL || PyModule_AddObjectRef(module, "LAYOUT", capsule) < 0 ||
                 PyModule_AddObjectRef(module, "Gate", (PyObject *)&GateType) < 0 ||
                 PyModule_AddIntConstant(module, "DEPTH", GATE_DEPTH) < 0 ||
                 add_lane_call(module, &GateType) < 0;
    Py_XDECREF(capsule);
    if (failed)
        Py_CLEAR(module);
    return module;
}
