/*
 * tbcoll.core._gate.LaneCall: the whole call around a transport's lane (tbcoll/include/lane.h),
 * compiled once, here, in the gate's extension. LaneCall(capsule, *, ndarray, dtypes, ops,
 * empty) takes a transport's "tbcoll.lane.v1" capsule (its lane_capsule()), refusing another
 * version or size of the struct; then
 *   bind(*, gate, codes, names, enabled, max_tag, comm_error, namer) -> the mask it took,
 *   limit(kind[, nbytes]), all_reduce(x, op, out), all_gather(x, out), reduce_scatter(x, op,
 *   out), broadcast(x, root, out), send(x, dst, tag), recv(out, src, tag)
 * are the Communicator's (tbcoll/core/protocols.py's Native.lane contract); direct(kind, x,
 * op, root, out) a transport's direct_* path (its caller holds the communicator and counts
 * the call); admits(kind, x, arg, out) -> bool, the admission predicate (lane_admits) as a
 * bound call asks it, for Python's choice of a route. The module's plain(kind, x, arg, out,
 * size) is the same check of the arguments (arguments_admit) for a direct path with no lane.
 *
 * A call: its arguments checked and admitted (lane_admits: the one place that says whether a
 * call may take the lane), the communicator's call gate taken (gate.h), the engine's lock
 * taken (the struct's take, where the lane has one), ready asked, the transport's work or
 * move done, the call counted and recorded, the lock and the gate given back. None where the
 * call is not this path's (nothing touched): the Python path then runs, and raises where the
 * call is wrong. That Python cost ~0.7 us of a 1.4 us shm 8 B all_reduce; the struct's
 * indirect calls cost ~1 ns each.
 *
 * Includes: Python.h, tbcoll/include/gate.h, lane.h, buffers.h, callbacks.h, wire.h; admits.h
 * (the check of the arguments, admits.c).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#include "../include/buffers.h"   /* positional, every_keyword */
#include "../include/callbacks.h" /* the formats of its calls into Python */
#include "../include/gate.h"
#include "../include/lane.h"
#include "../include/wire.h" /* DTYPES */
#include "admits.h"
#include "one_call.h"

typedef struct {
    PyObject_HEAD
    PyObject *owner;                        /* the transport's lane object (the capsule's
                                               context), held: the struct lives in it */
    tbcoll_lane_v1 *lane;
    PyObject *ndarray, *dtypes, *ops, *empty; /* what calls take, how results are made */
    Py_ssize_t table[LANE_KIND_COUNT];      /* limit(): the largest x the table takes */
    Gate *gate;                             /* bind(): the communicator's; NULL until then */
    int codes[LANE_CODES], enabled;
    long max_tag;                           /* send's and recv's largest tag */
    PyObject *names, *comm_error, *namer;
} LaneCall;

static PyTypeObject *gate_type; /* tbcoll.core._gate.Gate, what bind takes */

/* --- set-up ------------------------------------------------------------------------------- */

static int lane_call_traverse(LaneCall *c, visitproc visit, void *arg)
{
    Py_VISIT(c->owner);
    Py_VISIT(c->ndarray);
    Py_VISIT(c->dtypes);
    Py_VISIT(c->ops);
    Py_VISIT(c->empty);
    Py_VISIT(c->gate);
    Py_VISIT(c->names);
    Py_VISIT(c->comm_error);
    Py_VISIT(c->namer);
    return 0;
}

static int lane_call_clear(LaneCall *c)
{
    c->lane = NULL;
    c->enabled = 0;
    Py_CLEAR(c->owner);
    Py_CLEAR(c->ndarray);
    Py_CLEAR(c->dtypes);
    Py_CLEAR(c->ops);
    Py_CLEAR(c->empty);
    Py_CLEAR(c->gate);
    Py_CLEAR(c->names);
    Py_CLEAR(c->comm_error);
    Py_CLEAR(c->namer);
    return 0;
}

static void lane_call_dealloc(LaneCall *c)
{
    PyObject_GC_UnTrack(c);
    lane_call_clear(c);
    Py_TYPE(c)->tp_free((PyObject *)c);
}

/* The struct in capsule, its version and size this build's: else NULL with an error saying
 * what was found and what to do. */
static tbcoll_lane_v1 *lane_of(PyObject *capsule)
{
    if (!PyCapsule_IsValid(capsule, TBCOLL_LANE_CAPSULE)) {
        const char *name = PyCapsule_CheckExact(capsule) ? PyCapsule_GetName(capsule) : NULL;
        PyErr_Format(PyExc_TypeError, "LaneCall takes a transport lane's \"%s\" capsule "
                     "(its lane_capsule()); got %s%s%s", TBCOLL_LANE_CAPSULE,
                     name ? "a capsule named \"" : Py_TYPE(capsule)->tp_name, name ? name : "",
                     name ? "\"" : "");
        return NULL;
    }
    tbcoll_lane_v1 *lane = PyCapsule_GetPointer(capsule, TBCOLL_LANE_CAPSULE);
    if (lane->version != TBCOLL_LANE_VERSION || lane->size != sizeof(tbcoll_lane_v1)) {
        PyErr_Format(PyExc_ImportError, "a transport's lane offers lane interface version %u "
                     "(%u bytes), but tbcoll.core._gate runs version %d (%zu bytes): the two were "
                     "built from other versions of tbcoll/include/lane.h; reinstall tbcoll "
                     "(make, or pip install -e .)", (unsigned)lane->version,
                     (unsigned)lane->size, TBCOLL_LANE_VERSION, sizeof(tbcoll_lane_v1));
        return NULL;
    }
    if (PyCapsule_GetContext(capsule) == NULL || lane->work == NULL || lane->limits == NULL ||
        lane->ranks < 1 ||
        ((lane->kinds & LANE_MOVES) && lane->move == NULL) ||
        (lane->take == NULL) != (lane->give == NULL)) {
        PyErr_SetString(PyExc_ValueError, "a transport's lane without its object, work, "
                                          "limits, ranks, move or both halves of its lock");
        return NULL;
    }
    return lane;
}

/* LaneCall(capsule, *, ndarray, dtypes, ops, empty): numpy arrays (ndarray) of dtypes (a
 * tuple by code, compared by identity), reductions named in ops (name -> code); new results
 * made by empty(shape, dtype) */
static int lane_call_init(LaneCall *c, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"capsule", "ndarray", "dtypes", "ops", "empty", NULL};
    PyObject *capsule, *ndarray, *dtypes, *ops, *empty;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|$O!O!O!O:LaneCall", keywords, &capsule,
                                     &PyType_Type, &ndarray, &PyTuple_Type, &dtypes,
                                     &PyDict_Type, &ops, &empty))
        return -1;
    if (kwargs == NULL || PyDict_GET_SIZE(kwargs) != 4 || PyTuple_GET_SIZE(dtypes) != DTYPES) {
        PyErr_Format(PyExc_TypeError, "LaneCall(capsule, *, ndarray, dtypes, ops, empty): "
                     "each given, %d dtypes", DTYPES);
        return -1;
    }
    tbcoll_lane_v1 *lane = lane_of(capsule);
    if (lane == NULL)
        return -1;
    lane_call_clear(c);
    c->owner = Py_NewRef((PyObject *)PyCapsule_GetContext(capsule));
    c->lane = lane;
    c->ndarray = Py_NewRef(ndarray);
    c->dtypes = Py_NewRef(dtypes);
    c->ops = Py_NewRef(ops);
    c->empty = Py_NewRef(empty);
    for (int k = 0; k < LANE_KIND_COUNT; k++)
        c->table[k] = PY_SSIZE_T_MAX;
    return 0;
}

/* bind(*, gate, codes, names, enabled, max_tag, comm_error, namer) as the contract says
 * (tbcoll/core/protocols.py): the mask it took, enabled less what the lane lacks. */
static PyObject *lane_call_bind(LaneCall *c, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"gate", "codes", "names", "enabled", "max_tag", "comm_error",
                               "namer", NULL};
    PyObject *gate, *codes, *names, *comm_error, *namer;
    int enabled;
    long max_tag;
    if (!every_keyword("bind", kwargs, keywords) ||
        !PyArg_ParseTupleAndKeywords(args, kwargs, "|$O!O!O!ilOO:bind", keywords, gate_type,
                                     &gate, &PyTuple_Type, &codes, &PyTuple_Type, &names,
                                     &enabled, &max_tag, &comm_error, &namer))
        return NULL;
    if (c->lane == NULL || PyTuple_GET_SIZE(codes) != LANE_CODES ||
        PyTuple_GET_SIZE(names) != LANE_KIND_COUNT) {
        PyErr_SetString(PyExc_ValueError, "bind: a LaneCall made, its codes and names");
        return NULL;
    }
    for (int i = 0; i < LANE_CODES; i++) {
        long code = PyLong_AsLong(PyTuple_GET_ITEM(codes, i));
        if (code == -1 && PyErr_Occurred())
            return NULL;
        c->codes[i] = (int)code;
    }
    Py_XSETREF(c->gate, (Gate *)Py_NewRef(gate));
    Py_XSETREF(c->names, Py_NewRef(names));
    Py_XSETREF(c->comm_error, Py_NewRef(comm_error));
    Py_XSETREF(c->namer, Py_NewRef(namer));
    c->enabled = enabled & (int)c->lane->kinds;
    c->max_tag = max_tag;
    return PyLong_FromLong(c->enabled);
}

/* limit(kind[, nbytes]): with nbytes, the table's largest x of that kind (the lane keeps its
 * own if less); the largest x a bound call of kind takes now, the lane's and the table's
 * (None: every size), which the communicator's route reads when it is made, so that a larger
 * call never enters the lane to be refused (tbcoll.comm.routes) */
static PyObject *lane_call_limit(LaneCall *c, PyObject *args)
{
    int kind;
    Py_ssize_t nbytes = -1;
    if (!PyArg_ParseTuple(args, "i|n:limit", &kind, &nbytes))
        return NULL;
    if (kind < 0 || kind >= LANE_KIND_COUNT || (PyTuple_GET_SIZE(args) > 1 && nbytes < 0)) {
        PyErr_SetString(PyExc_ValueError, "limit: bad kind or bytes");
        return NULL;
    }
    if (nbytes >= 0)
        c->table[kind] = nbytes;
    Py_ssize_t own = c->lane != NULL ? c->lane->limits(c->lane->state, kind) : 0;
    Py_ssize_t most = own < c->table[kind] ? own : c->table[kind];
    if (most == PY_SSIZE_T_MAX)
        Py_RETURN_NONE;
    return PyLong_FromSsize_t(most);
}

/* --- the admission: may this call take the lane? ----------------------------------------- */

/*
 * The admission predicate, the one place that says whether a collective of kind may take
 * the lane (the Communicator's bound call: guarded; a transport's direct path: not): kind
 * among the lane's (and the bound ones), its arguments admitted (arguments_admit), x at most
 * the lane's and the table's largest of kind (limits), or past them where the lane takes it
 * all the same (beyond). 1 admitted (a's views held: admitted_release), 0 not (nothing
 * held), -1 with an exception.
 */
static int lane_admits(LaneCall *c, int kind, PyObject *x, PyObject *op_name, long root,
                       PyObject *out, int guarded, Admitted *a)
{
    tbcoll_lane_v1 *lane = c->lane;
    if (lane == NULL || (guarded && !(c->enabled & (1 << kind))) ||
        !(lane->kinds & (1u << kind)))
        return 0;
    const Arrays arrays = {c->ndarray, c->dtypes, c->ops};
    int admitted = arguments_admit(&arrays, lane->ranks, kind, x, op_name, root, out, a);
    if (admitted <= 0)
        return admitted;
    Py_ssize_t own = lane->limits(lane->state, kind);
    if ((a->xv.len > own || a->xv.len > c->table[kind]) &&
        !(guarded && lane->beyond &&
          lane->beyond(lane->state, kind, &a->xv, a->have_out ? &a->tv : NULL))) {
        admitted_release(a);
        return 0;
    }
    return 1;
}

/* --- the whole call ---------------------------------------------------------------------- */

/* Where a bound call raised comm_error: the communicator's name for it (namer() gives the
 * communicator's namer, None once it is gone, called with the error and `what`, a format of
 * arg), raised as `raise named from error` would; anything else as it was, and the error as it
 * was where the namer gives it back (it saw it: an interrupted call). */
static void named(LaneCall *c, const char *what, PyObject *arg)
{
    if (c->namer == NULL || !PyErr_ExceptionMatches(c->comm_error))
        return;
    PyObject *type, *error, *trace;
    PyErr_Fetch(&type, &error, &trace);
    PyErr_NormalizeException(&type, &error, &trace);
    if (trace != NULL)
        PyException_SetTraceback(error, trace);
    PyObject *name = PyUnicode_FromFormat(what, arg);
    PyObject *namer = name ? PyObject_CallNoArgs(c->namer) : NULL;
    PyObject *renamed = namer && namer != Py_None
                            ? PyObject_CallFunction(namer, CALLBACK_FORMAT(NAMED), error, name)
                            : NULL;
    Py_XDECREF(namer);
    Py_XDECREF(name);
    if (renamed == error) { /* seen, not renamed: raised as it was */
        Py_DECREF(renamed);
        PyErr_Restore(type, error, trace);
        return;
    }
    if (renamed == NULL) {
        if (PyErr_Occurred()) { /* naming failed: that error */
            Py_XDECREF(type);
            Py_XDECREF(error);
        } else {
            PyErr_Restore(type, error, trace);
            return;
        }
    } else {
        PyException_SetContext(renamed, Py_NewRef(error));
        PyException_SetCause(renamed, error); /* (takes error; suppresses the context) */
        PyErr_SetObject((PyObject *)Py_TYPE(renamed), renamed);
        Py_DECREF(renamed);
        Py_XDECREF(type);
    }
    Py_XDECREF(trace);
}

/* Call f() with an error that may be set kept aside: 0, or -1 with f's error (which then
 * replaces the one kept). For the engine's lock, given back on every path. */
static int keeping_error(PyObject *f)
{
    PyObject *type, *error, *trace;
    PyErr_Fetch(&type, &error, &trace);
    PyObject *done = PyObject_CallNoArgs(f);
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

/* Take the engine's lock where the lane has one, without blocking: 1 taken, 0 another
 * thread holds it, -1 with an exception */
static int take_engine(const tbcoll_lane_v1 *lane)
{
    _Static_assert(CALLBACK_NARGS(TAKE) == 1, "take's call passes blocking");
    PyObject *got = PyObject_CallOneArg(lane->take, Py_False);
    if (got == NULL)
        return -1;
    int taken = got == Py_True;
    Py_DECREF(got);
    return taken;
}

/* A new result: empty(shape[:ndim], dtype) (numpy.empty); NULL with an exception */
static PyObject *new_result(PyObject *empty, const Py_ssize_t *shape, int ndim, PyObject *dtype)
{
    PyObject *dims = PyTuple_New(ndim);
    for (int i = 0; dims != NULL && i < ndim; i++) {
        PyObject *d = PyLong_FromSsize_t(shape[i]);
        if (d == NULL)
            Py_CLEAR(dims);
        else
            PyTuple_SET_ITEM(dims, i, d);
    }
    /* (with objects made: no format to read on the hot path) */
    _Static_assert(CALLBACK_NARGS(EMPTY) == 2, "empty's call passes shape and dtype");
    PyObject *made = dims ? PyObject_CallFunctionObjArgs(empty, dims, dtype, NULL) : NULL;
    Py_XDECREF(dims);
    return made;
}

/* A whole call of kind (lane_admits' arguments): the result (out, or a new array), None
 * where the call is not this path's (nothing touched), or NULL with the error, a CommError
 * named as the communicator names it. guarded: the communicator's call, its gate taken;
 * else a transport's direct path, whose caller holds the communicator and counts the call. */
static PyObject *run_call(LaneCall *c, int kind, PyObject *x, PyObject *op_name, long root,
                          PyObject *out, int guarded)
{
    Admitted a;
    int admitted = lane_admits(c, kind, x, op_name, root, out, guarded, &a);
    if (admitted <= 0)
        return admitted < 0 ? NULL : Py_NewRef(Py_None);
    tbcoll_lane_v1 *lane = c->lane;
    PyObject *result = NULL, *target = NULL;
    int slot = -1, taken = 0, idle;
    if (guarded) {
        int reduces = kind == LANE_ALL_REDUCE || kind == LANE_REDUCE_SCATTER;
        slot = gate_enter(c->gate, c->codes[kind], a.dtype, reduces ? a.op : -1, root, a.xv.len,
                          c->codes[LANE_NATIVE], 0);
        if (slot == -2) /* a child of os.fork(): the gate raised, saying why */
            goto done;
        if (slot == -1) /* another thread's call: the Python path says so */
            goto decline;
    }
    if (lane->take == NULL) {
        idle = lane->ready ? lane->ready(lane->state) : 1; /* no engine's lock to take */
    } else {
        taken = take_engine(lane);
        idle = taken < 0 ? -1 : taken ? (lane->ready ? lane->ready(lane->state) : 1) : 0;
        taken = taken > 0;
    }
    if (idle < 0)
        goto done;
    if (!idle)
        goto decline;
    if (out != Py_None) {
        target = Py_NewRef(out);
    } else {
        target = new_result(c->empty, a.shape, a.ndim, a.dtype_obj);
        if (target == NULL ||
            PyObject_GetBuffer(target, &a.tv, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0)
            goto done;
        a.have_out = 1;
    }
    if (lane->work(lane->state, kind, x, &a.xv, target, &a.tv, a.dtype, a.op, (int)root) < 0)
        goto done;
    if (slot >= 0)
        gate_done(c->gate, slot);
    result = Py_NewRef(target);
    goto done;
decline:
    result = Py_NewRef(Py_None);
done:
    if (taken && keeping_error(lane->give) < 0)
        Py_CLEAR(result);
    if (slot >= 0) {
        if (result == NULL)
            named(c, "%U", PyTuple_GET_ITEM(c->names, kind));
        gate_leave(c->gate, slot);
    }
    admitted_release(&a); /* (the views first, as they were taken last) */
    Py_XDECREF(target);
    return result;
}

/*
 * A communicator's bound send(x, peer, tag) -> True, or recv(x, peer, tag) -> x (sending says
 * which), or None where the call is not this path's (nothing touched): a C-contiguous numpy
 * array of a known dtype (writable to receive into), another rank of the group and a tag up
 * to max_tag, the gate taken (gate_enter_move: counted in no collective), the engine's lock
 * taken where the lane has one, the move done, the lock and the gate given back; NULL with
 * the error, a CommError named as the communicator names it.
 */
static PyObject *run_move(LaneCall *c, int sending, PyObject *x, PyObject *peer_obj,
                          PyObject *tag_obj)
{
    tbcoll_lane_v1 *lane = c->lane;
    if (lane == NULL || !(c->enabled & LANE_MOVES) || Py_TYPE(x) != (PyTypeObject *)c->ndarray ||
        !PyLong_CheckExact(peer_obj) || !PyLong_CheckExact(tag_obj))
        Py_RETURN_NONE;
    long peer = PyLong_AsLong(peer_obj), tag = PyLong_AsLong(tag_obj);
    if (PyErr_Occurred()) { /* (out of a long's range: the Python path says what is wrong) */
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    if (peer < 0 || peer >= lane->ranks || peer == lane->rank || tag < 0 || tag > c->max_tag)
        Py_RETURN_NONE;
    PyObject *dtype;
    int code = dtype_code(c->dtypes, x, &dtype);
    if (code == -2)
        return NULL;
    Py_DECREF(dtype); /* (only compared: it lives as long as x) */
    Py_buffer view;
    if (code < 0)
        Py_RETURN_NONE;
    if (PyObject_GetBuffer(x, &view, PyBUF_C_CONTIGUOUS | (sending ? 0 : PyBUF_WRITABLE)) < 0)
        return refused_buffer() ? Py_NewRef(Py_None) : NULL;
    int slot = gate_enter_move(c->gate, c->codes[sending ? LANE_SEND : LANE_RECV], code, peer,
                               tag, view.len);
    if (slot < 0) { /* -1: another thread's call (the Python path says so); -2: forked */
        PyBuffer_Release(&view);
        return slot == -1 ? Py_NewRef(Py_None) : NULL;
    }
    int taken = 0, done = 1; /* (the engine taken by another thread: the Python path's) */
    if (lane->take != NULL) {
        taken = take_engine(lane);
        done = taken < 0 ? -1 : 1;
        taken = taken > 0;
    }
    if (done == 1 && (lane->take == NULL || taken))
        done = lane->move(lane->state, sending, x, &view, peer, tag);
    if (taken && keeping_error(lane->give) < 0)
        done = -1;
    PyBuffer_Release(&view);
    if (done < 0)
        named(c, sending ? "send to rank %S" : "recv from rank %S", peer_obj);
    gate_leave(c->gate, slot);
    return done < 0 ? NULL : Py_NewRef(done == 1 ? Py_None : sending ? Py_True : x);
}

/* --- the methods ------------------------------------------------------------------------- */

/* direct(kind, x, op, root, out): the transport's direct_* path (tbcoll.transports.base),
 * whose caller holds the communicator and counts the call. */
static PyObject *lane_call_direct(LaneCall *c, PyObject *const *args, Py_ssize_t nargs)
{
    long kind, root = -1;
    if (!positional("direct", nargs, 5) || kind_of(args[0], &kind) < 0)
        return NULL;
    if (kind == LANE_BROADCAST && !take_root(args[3], &root))
        Py_RETURN_NONE;
    return run_call(c, (int)kind, args[1], args[2], root, args[4], 0);
}

/* admits(kind, x, arg, out) -> bool: whether the communicator's bound call of kind (arg: op
 * for the reductions, root for broadcast, None for all_gather) may take the lane, as the
 * call itself asks it (lane_admits), its gate and engine aside (which a call finds held or
 * not only as it runs) */
static PyObject *lane_call_admits(LaneCall *c, PyObject *const *args, Py_ssize_t nargs)
{
    long kind, root;
    PyObject *op_name;
    if (!positional("admits", nargs, 4) || kind_of(args[0], &kind) < 0)
        return NULL;
    if (!call_arguments(kind, args[2], &op_name, &root))
        Py_RETURN_FALSE;
    Admitted a;
    int admitted = lane_admits(c, (int)kind, args[1], op_name, root, args[3], 1, &a);
    if (admitted < 0)
        return NULL;
    if (admitted)
        admitted_release(&a);
    return PyBool_FromLong(admitted);
}

/* The communicator's calls (bind), their errors named: all_reduce(x, op, out), all_gather(x,
 * out), reduce_scatter(x, op, out), broadcast(x, root, out). */
static PyObject *lane_call_all_reduce(LaneCall *c, PyObject *const *args, Py_ssize_t nargs)
{
    if (!positional("all_reduce", nargs, 3))
        return NULL;
    return run_call(c, LANE_ALL_REDUCE, args[0], args[1], -1, args[2], 1);
}

static PyObject *lane_call_all_gather(LaneCall *c, PyObject *const *args, Py_ssize_t nargs)
{
    if (!positional("all_gather", nargs, 2))
        return NULL;
    return run_call(c, LANE_ALL_GATHER, args[0], Py_None, -1, args[1], 1);
}

static PyObject *lane_call_reduce_scatter(LaneCall *c, PyObject *const *args, Py_ssize_t nargs)
{
    if (!positional("reduce_scatter", nargs, 3))
        return NULL;
    return run_call(c, LANE_REDUCE_SCATTER, args[0], args[1], -1, args[2], 1);
}

static PyObject *lane_call_broadcast(LaneCall *c, PyObject *const *args, Py_ssize_t nargs)
{
    long root;
    if (!positional("broadcast", nargs, 3))
        return NULL;
    if (!take_root(args[1], &root))
        Py_RETURN_NONE;
    return run_call(c, LANE_BROADCAST, args[0], Py_None, root, args[2], 1);
}

/* send(x, dst, tag) -> True, recv(out, src, tag) -> out: the communicator's (bind), or None */
static PyObject *lane_call_send(LaneCall *c, PyObject *const *args, Py_ssize_t nargs)
{
    if (!positional("send", nargs, 3))
        return NULL;
    return run_move(c, 1, args[0], args[1], args[2]);
}

static PyObject *lane_call_recv(LaneCall *c, PyObject *const *args, Py_ssize_t nargs)
{
    if (!positional("recv", nargs, 3))
        return NULL;
    return run_move(c, 0, args[0], args[1], args[2]);
}

static PyObject *lane_call_get_kinds(LaneCall *c, void *unused)
{
    (void)unused;
    return PyLong_FromUnsignedLong(c->lane ? c->lane->kinds : 0);
}

#define FASTCALL(f) (PyCFunction)(void (*)(void))(f), METH_FASTCALL
#define KEYWORDS(f) (PyCFunction)(void (*)(void))(f), METH_VARARGS | METH_KEYWORDS
static PyMethodDef lane_call_methods[] = {
    {"bind", KEYWORDS(lane_call_bind), "The communicator whose calls take the lane."},
    {"limit", (PyCFunction)lane_call_limit, METH_VARARGS, "The largest x of a kind it takes."},
    {"admits", FASTCALL(lane_call_admits), "Whether a bound call may take the lane."},
    {"direct", FASTCALL(lane_call_direct), "A transport's one-call path."},
    {"all_reduce", FASTCALL(lane_call_all_reduce), "The communicator's all_reduce, or None."},
    {"all_gather", FASTCALL(lane_call_all_gather), "The communicator's all_gather, or None."},
    {"reduce_scatter", FASTCALL(lane_call_reduce_scatter), "The communicator's reduce_scatter."},
    {"broadcast", FASTCALL(lane_call_broadcast), "The communicator's broadcast, or None."},
    {"send", FASTCALL(lane_call_send), "The communicator's send (True), or None."},
    {"recv", FASTCALL(lane_call_recv), "The communicator's recv (out), or None."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef lane_call_getset[] = {
    {"kinds", (getter)lane_call_get_kinds, NULL, "The lane's kinds (a mask, lane.h).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject LaneCallType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tbcoll.core._gate.LaneCall",
    .tp_basicsize = sizeof(LaneCall),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The whole call around a transport's lane (tbcoll/include/lane.h).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)lane_call_init,
    .tp_dealloc = (destructor)lane_call_dealloc,
    .tp_traverse = (traverseproc)lane_call_traverse,
    .tp_clear = (inquiry)lane_call_clear,
    .tp_methods = lane_call_methods,
    .tp_getset = lane_call_getset,
};

#define ONE_CALL_CALLBACKS(X) CALLBACKS_ONE_CALL(X)

int add_lane_call(PyObject *module, PyTypeObject *gate)
{
    gate_type = gate;
    if (PyType_Ready(&LaneCallType) < 0 ||
        PyModule_AddObjectRef(module, "LaneCall", (PyObject *)&LaneCallType) < 0 ||
        PyModule_AddIntConstant(module, "LANE_VERSION", TBCOLL_LANE_VERSION) < 0 ||
        PyModule_AddIntConstant(module, "LANE_SIZE", (long)sizeof(tbcoll_lane_v1)) < 0 ||
        PyModule_AddStringConstant(module, "LANE_CAPSULE", TBCOLL_LANE_CAPSULE) < 0 ||
        add_plain(module) < 0)
        return -1;
    return ADD_CALLBACKS(module, ONE_CALL_CALLBACKS); /* checked at import by tbcoll.core.gate */
}
