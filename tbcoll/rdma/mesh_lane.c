/* rdma's MeshLane: the world's small mesh all_reduce and all_gather as one C call. */
#include "fabric.h"

#include "../include/buffers.h" /* positional */
#include "../include/one_call.h" /* the mesh lane's call around verbs_mesh_call */

/*
 * MeshLane(fabric): the world communicator's small all_reduce and all_gather as one C call
 * (tbcoll/transports/base.py's Native.lane contract; tbcoll/include/one_call.h does the call
 * around verbs_mesh_call: checks, the call gate, the engine's lock, since the mesh shares the
 * device's completion queue with the stream). Under the RDMA lab's emulation Python costs
 * 50-100x its host cost, and the direct path's Python (the gate, the checks, the signature,
 * the engine's turns, the budget) cost more than the mesh. Where verbs_mesh_call does not finish
 * in its first slice (a late peer, another call, a lost peer), finish(kind, x, target,
 * dtype, op, signature, result) goes on in Python (RdmaNative._mesh_held) with the engine
 * still taken. calls(*, ndarray, dtypes, ops, empty, take, give, largest, all_reduce, all_gather,
 * shared, budget, shared_budget, finish): one_call_calls', each kind's signatures less the
 * byte count (all_reduce's by dtype then op, all_gather's by dtype), the engine's Turns'
 * shared_word, the first slice's budget alone in the engine and once shared (as
 * _mesh_held's), and finish.
 */
typedef struct {
    PyObject_HEAD
    OneCall call;
    Fabric *fabric;
    uint64_t all_reduce[DTYPES][OPS], all_gather[DTYPES];
    Py_buffer shared;        /* Turns.shared_word, held: 1 once threads have shared the engine */
    double budget, shared_budget; /* the first slice alone in the engine, and shared */
    PyObject *finish;
} MeshLane;

static PyTypeObject *GateType; /* tbcoll._gate.Gate; NULL where its import failed: */
static PyObject *gate_error;   /* why (GATE_ERROR) */

INTERNAL int verbs_mesh_lane_import_gate(PyObject *module)
{
    return one_call_import_gate(module, &GateType, &gate_error);
}

static int MeshLane_traverse(MeshLane *self, visitproc visit, void *arg)
{
    Py_VISIT(self->shared.obj);
    Py_VISIT(self->fabric);
    Py_VISIT(self->finish);
    return one_call_traverse(&self->call, visit, arg);
}

static int MeshLane_clear(MeshLane *self)
{
    if (self->shared.obj != NULL)
        PyBuffer_Release(&self->shared);
    self->shared.obj = NULL;
    Py_CLEAR(self->fabric);
    Py_CLEAR(self->finish);
    one_call_clear(&self->call);
    return 0;
}

static void MeshLane_dealloc(MeshLane *self)
{
    PyObject_GC_UnTrack(self);
    MeshLane_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int MeshLane_init(MeshLane *self, PyObject *args, PyObject *Py_UNUSED(kwargs))
{
    PyObject *fabric;
    if (!PyArg_ParseTuple(args, "O!:MeshLane", &FabricType, &fabric))
        return -1;
    MeshLane_clear(self);
    self->fabric = (Fabric *)Py_NewRef(fabric);
    return 0;
}

static PyObject *MeshLane_calls(MeshLane *self, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"ndarray", "dtypes", "ops", "empty", "take", "give", "largest",
                               "all_reduce", "all_gather", "shared", "budget", "shared_budget",
                               "finish", NULL};
    PyObject *ndarray, *dtypes, *ops, *empty, *take, *give, *all_reduce, *all_gather, *shared,
        *finish;
    Py_ssize_t largest;
    double budget, shared_budget;
    if (self->fabric == NULL || self->shared.obj != NULL) {
        PyErr_SetString(PyExc_ValueError, "calls: once, after MeshLane(fabric)");
        return NULL;
    }
    if (!every_keyword("calls", kwargs, keywords) ||
        !PyArg_ParseTupleAndKeywords(args, kwargs, "|$OOOOOOnOOOddO:calls", keywords, &ndarray,
                                     &dtypes, &ops, &empty, &take, &give, &largest, &all_reduce,
                                     &all_gather, &shared, &budget, &shared_budget, &finish) ||
        one_call_words(all_reduce, &self->all_reduce[0][0], DTYPES * OPS) < 0 ||
        one_call_words(all_gather, self->all_gather, DTYPES) < 0 ||
        one_call_calls(&self->call, self->fabric->size, ndarray, dtypes, ops, empty, take, give,
                       largest < COLL_BYTES ? largest : COLL_BYTES) < 0 ||
        PyObject_GetBuffer(shared, &self->shared, PyBUF_SIMPLE) < 0)
        return NULL;
    if (self->shared.len != sizeof(uint64_t)) {
        PyBuffer_Release(&self->shared);
        self->shared.obj = NULL;
        PyErr_SetString(PyExc_ValueError, "calls: the engine's shared word (8 bytes)");
        return NULL;
    }
    Py_XSETREF(self->finish, Py_NewRef(finish));
    self->budget = budget;
    self->shared_budget = shared_budget;
    Py_RETURN_NONE;
}

static PyObject *MeshLane_bind(MeshLane *self, PyObject *args, PyObject *kwargs)
{
    return one_call_bind(&self->call, GateType, gate_error, args, kwargs,
                         (1 << ONE_CALL_ALL_REDUCE) | (1 << ONE_CALL_ALL_GATHER));
}

static PyObject *MeshLane_limit(MeshLane *self, PyObject *args)
{
    return one_call_limit(&self->call, args);
}

/* One mesh call of a taken all_reduce or all_gather (OneCallWork) */
static int mesh_work(void *lane, int kind, PyObject *x, const Py_buffer *xv, PyObject *target,
                     const Py_buffer *tv, int dtype, int op, int root)
{
    MeshLane *self = lane;
    (void)root; /* all_reduce and all_gather: none */
    int reduces = kind == ONE_CALL_ALL_REDUCE, mesh = reduces ? MESH_ALL_REDUCE
                                                              : MESH_ALL_GATHER;
    unsigned long long signature = CALL_BYTES_OF(xv->len) |
                                   (reduces ? self->all_reduce[dtype][op]
                                            : self->all_gather[dtype]);
    if (!reduces)
        dtype = op = 0; /* (the mesh places blocks: no reduction) */
    /* (read with the GIL held, as Turns sets it: plain) */
    double budget = *(const uint64_t *)self->shared.buf ? self->shared_budget : self->budget;
    long result = verbs_mesh_call(self->fabric, mesh, xv, tv, dtype, op, signature, budget);
    if (result == 0)
        return 0;
    if (result == -3)
        return -1;
    PyObject *done = PyObject_CallFunction(self->finish, CALLBACK_FORMAT(MESH_HELD), mesh, x, target, dtype, op,
                                           signature, result);
    Py_XDECREF(done);
    return done == NULL ? -1 : 0;
}

static PyObject *MeshLane_all_reduce(MeshLane *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (!positional("all_reduce", nargs, 3))
        return NULL;
    return one_call_run(&self->call, self, ONE_CALL_ALL_REDUCE, args[0], args[1], args[2],
                        NULL, mesh_work);
}

static PyObject *MeshLane_all_gather(MeshLane *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (!positional("all_gather", nargs, 2))
        return NULL;
    return one_call_run(&self->call, self, ONE_CALL_ALL_GATHER, args[0], Py_None, args[1],
                        NULL, mesh_work);
}

static PyMethodDef MeshLane_methods[] = {
    {"calls", (PyCFunction)(void (*)(void))MeshLane_calls, METH_VARARGS | METH_KEYWORDS, "What its calls take."},
    {"bind", (PyCFunction)(void (*)(void))MeshLane_bind, METH_VARARGS | METH_KEYWORDS, "The communicator whose calls take it."},
    {"limit", (PyCFunction)MeshLane_limit, METH_VARARGS, "The largest x a kind's path takes."},
    {"all_reduce", (PyCFunction)(void (*)(void))MeshLane_all_reduce, METH_FASTCALL,
     "The communicator's all_reduce, or None."},
    {"all_gather", (PyCFunction)(void (*)(void))MeshLane_all_gather, METH_FASTCALL,
     "The communicator's all_gather, or None."},
    {NULL, NULL, 0, NULL},
};

INTERNAL PyTypeObject MeshLaneType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tbcoll.rdma._verbs.MeshLane",
    .tp_basicsize = sizeof(MeshLane),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The world's small mesh all_reduce and all_gather in one call.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)MeshLane_init,
    .tp_dealloc = (destructor)MeshLane_dealloc,
    .tp_traverse = (traverseproc)MeshLane_traverse,
    .tp_clear = (inquiry)MeshLane_clear,
    .tp_methods = MeshLane_methods,
};
