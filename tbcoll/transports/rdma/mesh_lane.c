/* rdma's MeshLane: the world's small mesh all_reduce and all_gather as one C call. */
#include "fabric.h"

#include "../../include/buffers.h"   /* every_keyword */
#include "../../include/callbacks.h" /* the formats of its calls into Python */
#include "../../include/lane.h"      /* the lane interface it offers */
#include "../../include/wire.h"      /* DTYPES, OPS, CALL_BYTES_OF */

/*
 * MeshLane(fabric): the world communicator's small all_reduce and all_gather as one C call
 * (the lane interface, tbcoll/include/lane.h: lane_capsule(), which tbcoll.core._gate.LaneCall
 * runs: checks, the call gate, the engine's lock, since the mesh shares the device's
 * completion queue with the stream, around this file's mesh_work). Under the RDMA lab's
 * emulation Python costs 50-100x its host cost, and the direct path's Python (the gate, the
 * checks, the signature, the engine's turns, the budget) cost more than the mesh. Where
 * verbs_mesh_call does not finish in its first slice (a late peer, another call, a lost
 * peer), finish(kind, x, target, dtype, op, signature, result) goes on in Python
 * (RdmaNative._mesh_held) with the engine still taken. calls(*, take, give, largest,
 * all_reduce, all_gather, shared, budget, shared_budget, finish): the engine's lock, the
 * largest x (at most COLL_BYTES), each kind's signatures less the byte count (all_reduce's
 * by dtype then op, all_gather's by dtype), the engine's Turns' shared_word, the first
 * slice's budget alone in the engine and once shared (as _mesh_held's), and finish.
 */
typedef struct {
    PyObject_HEAD
    tbcoll_lane_v1 lane; /* what it offers LaneCall (lane_capsule()) */
    Py_ssize_t largest;
    PyObject *take, *give; /* the engine's lock */
    Fabric *fabric;
    uint64_t all_reduce[DTYPES][OPS], all_gather[DTYPES];
    Py_buffer shared;        /* Turns.shared_word, held: 1 once threads have shared the engine */
    double budget, shared_budget; /* the first slice alone in the engine, and shared */
    PyObject *finish;
} MeshLane;

static int MeshLane_traverse(MeshLane *self, visitproc visit, void *arg)
{
    Py_VISIT(self->shared.obj);
    Py_VISIT(self->fabric);
    Py_VISIT(self->finish);
    Py_VISIT(self->take);
    Py_VISIT(self->give);
    return 0;
}

static int MeshLane_clear(MeshLane *self)
{
    if (self->shared.obj != NULL)
        PyBuffer_Release(&self->shared);
    self->shared.obj = NULL;
    Py_CLEAR(self->fabric);
    Py_CLEAR(self->finish);
    Py_CLEAR(self->take);
    Py_CLEAR(self->give);
    self->lane.take = self->lane.give = NULL;
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

/* One mesh call of a taken all_reduce or all_gather (the lane's work) */
static int mesh_work(void *lane, int kind, PyObject *x, const Py_buffer *xv, PyObject *target,
                     const Py_buffer *tv, int dtype, int op, int root)
{
    MeshLane *self = lane;
    (void)root; /* all_reduce and all_gather: none */
    int reduces = kind == LANE_ALL_REDUCE, mesh = reduces ? MESH_ALL_REDUCE
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
    PyObject *done = PyObject_CallFunction(self->finish, CALLBACK_FORMAT(MESH_HELD), mesh, x,
                                           target, dtype, op, signature, result);
    Py_XDECREF(done);
    return done == NULL ? -1 : 0;
}

/* The largest x of kind a mesh call takes (the lane's limits) */
static Py_ssize_t mesh_limit(void *lane, int kind)
{
    const MeshLane *self = lane;
    return kind == LANE_ALL_REDUCE || kind == LANE_ALL_GATHER ? self->largest : 0;
}

static PyObject *MeshLane_calls(MeshLane *self, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"take", "give", "largest", "all_reduce", "all_gather", "shared",
                               "budget", "shared_budget", "finish", NULL};
    PyObject *take, *give, *all_reduce, *all_gather, *shared, *finish;
    Py_ssize_t largest;
    double budget, shared_budget;
    if (self->fabric == NULL || self->shared.obj != NULL) {
        PyErr_SetString(PyExc_ValueError, "calls: once, after MeshLane(fabric)");
        return NULL;
    }
    if (!every_keyword("calls", kwargs, keywords) ||
        !PyArg_ParseTupleAndKeywords(args, kwargs, "|$OOnOOOddO:calls", keywords, &take, &give,
                                     &largest, &all_reduce, &all_gather, &shared, &budget,
                                     &shared_budget, &finish) ||
        lane_words(all_reduce, &self->all_reduce[0][0], DTYPES * OPS) < 0 ||
        lane_words(all_gather, self->all_gather, DTYPES) < 0 ||
        PyObject_GetBuffer(shared, &self->shared, PyBUF_SIMPLE) < 0)
        return NULL;
    if (self->shared.len != sizeof(uint64_t) || !PyCallable_Check(take) ||
        !PyCallable_Check(give)) {
        PyBuffer_Release(&self->shared);
        self->shared.obj = NULL;
        PyErr_SetString(PyExc_ValueError, "calls: the engine's shared word (8 bytes) and the "
                                          "lock's two callables");
        return NULL;
    }
    Py_XSETREF(self->take, Py_NewRef(take));
    Py_XSETREF(self->give, Py_NewRef(give));
    Py_XSETREF(self->finish, Py_NewRef(finish));
    self->largest = largest < COLL_BYTES ? largest : COLL_BYTES;
    self->budget = budget;
    self->shared_budget = shared_budget;
    self->lane = (tbcoll_lane_v1){
        .version = TBCOLL_LANE_VERSION, .size = sizeof(tbcoll_lane_v1),
        .kinds = 1u << LANE_ALL_REDUCE | 1u << LANE_ALL_GATHER, .ranks = self->fabric->size,
        .rank = self->fabric->rank, .state = self, .work = mesh_work, .move = NULL,
        .ready = NULL, .limits = mesh_limit, .beyond = NULL, .take = self->take,
        .give = self->give};
    Py_RETURN_NONE;
}

/* lane_capsule() -> the "tbcoll.lane.v1" capsule of the lane interface, for
 * tbcoll.core._gate.LaneCall */
static PyObject *MeshLane_capsule(MeshLane *self, PyObject *unused)
{
    (void)unused;
    if (self->take == NULL) {
        PyErr_SetString(PyExc_ValueError, "lane_capsule: after calls()");
        return NULL;
    }
    return lane_capsule_new(&self->lane, (PyObject *)self);
}

static PyMethodDef MeshLane_methods[] = {
    {"calls", (PyCFunction)(void (*)(void))MeshLane_calls, METH_VARARGS | METH_KEYWORDS,
     "What its calls take."},
    {"lane_capsule", (PyCFunction)MeshLane_capsule, METH_NOARGS, "The lane interface (lane.h)."},
    {NULL, NULL, 0, NULL},
};

INTERNAL PyTypeObject MeshLaneType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tbcoll.transports.rdma._verbs.MeshLane",
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
