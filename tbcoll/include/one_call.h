/*
 * What every C lane shares (a transport's whole call in one C call; the contract is
 * tbcoll/core/protocols.py's Native.lane): the dtype code of an array, the refusals that
 * hand a call to the Python path, the naming of a bound call's CommError as the communicator
 * names it; the contract's state (OneCall: what calls take, the communicator bound) and its
 * calls(), bind() and limit(), which every lane keeps; and the whole call around the
 * transport's work: one_call_run_any (shm's four kinds, tbcoll/transports/shm/lane.c), one_call_run
 * (all_reduce and all_gather: tcp's, tbcoll/transports/tcp/tcp_lane.c; rdma's mesh,
 * tbcoll/transports/rdma/mesh_lane.c); and a send or recv around the transport's move: one_call_move (shm's,
 * tbcoll/transports/shm/moves.c; tcp's).
 *
 * A new transport's lane: a Python type holding a OneCall, whose calls(), bind(), limit()
 * and collective methods call one_call_calls, one_call_bind, one_call_limit and
 * one_call_run(_any) with its own work (the transport's exchange of x into the target) and,
 * where its engine may hold something that must go first, a ready test.
 */
#ifndef TBCOLL_ONE_CALL_H
#define TBCOLL_ONE_CALL_H

#include <Python.h>
#include <string.h>

#include "buffers.h" /* every_keyword */
#include "callbacks.h" /* the formats of its calls into Python */
#include "gate.h"
#include "wire.h" /* DTYPES */

/* The code of array's dtype among dtypes (a tuple by code, compared by identity, as
 * tbcoll.comm.communicator's KNOWN_DTYPES), or -1; -2 with an exception. *dtype: a new reference. */
static inline int one_call_dtype(PyObject *dtypes, PyObject *array, PyObject **dtype)
{
    static PyObject *name; /* "dtype", interned once (with the GIL held) */
    if (name == NULL && (name = PyUnicode_InternFromString("dtype")) == NULL)
        return -2;
    *dtype = PyObject_GetAttr(array, name);
    if (*dtype == NULL)
        return -2;
    for (int code = 0; code < DTYPES; code++)
        if (PyTuple_GET_ITEM(dtypes, code) == *dtype)
            return code;
    return -1;
}

/* Whether the error set is a refusal of a buffer (numpy's: not C-contiguous, not writable),
 * which makes the call the Python path's: then cleared. */
static inline int one_call_refused(void)
{
    if (!PyErr_ExceptionMatches(PyExc_BufferError) && !PyErr_ExceptionMatches(PyExc_ValueError))
        return 0;
    PyErr_Clear();
    return 1;
}

/* Where a bound call raised comm_error: the communicator's name for it (namer() gives the
 * communicator's namer, None once it is gone, called with the error and `what`, a format of
 * arg), raised as `raise named from error` would; anything else as it was, and the error as it
 * was where the namer gives it back (it saw it: an interrupted call). Returns NULL. */
static inline PyObject *one_call_named(PyObject *namer_ref, PyObject *comm_error,
                                       const char *what, PyObject *arg)
{
    if (namer_ref == NULL || !PyErr_ExceptionMatches(comm_error))
        return NULL;
    PyObject *type, *error, *trace;
    PyErr_Fetch(&type, &error, &trace);
    PyErr_NormalizeException(&type, &error, &trace);
    if (trace != NULL)
        PyException_SetTraceback(error, trace);
    PyObject *name = PyUnicode_FromFormat(what, arg);
    PyObject *namer = name ? PyObject_CallNoArgs(namer_ref) : NULL;
    PyObject *renamed = namer && namer != Py_None
                            ? PyObject_CallFunction(namer, CALLBACK_FORMAT(NAMED), error, name) : NULL;
    Py_XDECREF(namer);
    Py_XDECREF(name);
    if (renamed == error) { /* seen, not renamed: raised as it was */
        Py_DECREF(renamed);
        PyErr_Restore(type, error, trace);
        return NULL;
    }
    if (renamed == NULL) {
        if (PyErr_Occurred()) { /* naming failed: that error */
            Py_XDECREF(type);
            Py_XDECREF(error);
        } else {
            PyErr_Restore(type, error, trace);
            return NULL;
        }
    } else {
        PyException_SetContext(renamed, Py_NewRef(error));
        PyException_SetCause(renamed, error); /* (takes error; suppresses the context) */
        PyErr_SetObject((PyObject *)Py_TYPE(renamed), renamed);
        Py_DECREF(renamed);
        Py_XDECREF(type);
    }
    Py_XDECREF(trace);
    return NULL;
}

/* words[0..count) from list, a list of count signatures (ints): 0, or -1 with an exception */
static inline int one_call_words(PyObject *list, uint64_t *words, Py_ssize_t count)
{
    if (!PyList_Check(list) || PyList_GET_SIZE(list) != count) {
        PyErr_Format(PyExc_ValueError, "expected a list of %zd signatures", count);
        return -1;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        words[i] = (uint64_t)PyLong_AsUnsignedLongLong(PyList_GET_ITEM(list, i));
        if (PyErr_Occurred())
            return -1;
    }
    return 0;
}

/* --- the whole call ---------------------------------------------------------------------- */

/* the contract's kinds (tbcoll.comm.communicator.LANE_ENTRIES' order) and bind's codes: the four kinds',
 * send's, recv's, the native algorithm's */
enum { ONE_CALL_ALL_REDUCE, ONE_CALL_ALL_GATHER, ONE_CALL_REDUCE_SCATTER, ONE_CALL_BROADCAST,
       LANE_KIND_COUNT, ONE_CALL_SEND = LANE_KIND_COUNT, ONE_CALL_RECV, ONE_CALL_NATIVE,
       ONE_CALL_CODES };
#define ONE_CALL_MOVES (1 << LANE_KIND_COUNT) /* bind's bit of send and recv (comm.py _MOVES) */

typedef struct {
    int checks, size;                       /* calls() was called; the group's ranks */
    PyObject *ndarray, *dtypes, *ops, *empty; /* what calls take, how results are made */
    Py_ssize_t largest[LANE_KIND_COUNT];    /* the largest x of each kind taken */
    Gate *gate;                             /* bind(): the communicator's */
    int codes[ONE_CALL_CODES], enabled;
    long max_tag;                           /* send's and recv's largest tag */
    PyObject *names, *comm_error, *namer;
    PyObject *take, *give;                  /* the engine's lock: acquire, release */
} OneCall;

static inline int one_call_traverse(OneCall *c, visitproc visit, void *arg)
{
    Py_VISIT(c->ndarray);
    Py_VISIT(c->dtypes);
    Py_VISIT(c->ops);
    Py_VISIT(c->empty);
    Py_VISIT(c->gate);
    Py_VISIT(c->names);
    Py_VISIT(c->comm_error);
    Py_VISIT(c->namer);
    Py_VISIT(c->take);
    Py_VISIT(c->give);
    return 0;
}

static inline void one_call_clear(OneCall *c)
{
    Py_CLEAR(c->ndarray);
    Py_CLEAR(c->dtypes);
    Py_CLEAR(c->ops);
    Py_CLEAR(c->empty);
    Py_CLEAR(c->gate);
    Py_CLEAR(c->names);
    Py_CLEAR(c->comm_error);
    Py_CLEAR(c->namer);
    Py_CLEAR(c->take);
    Py_CLEAR(c->give);
    c->checks = c->enabled = 0;
}

/* What the calls take: numpy arrays (ndarray) of dtypes (a tuple by code), reductions named
 * in ops (name -> code); results made by empty(shape, dtype); the engine's lock taken with
 * take(False) and given back with give() (NULL: a lane with its own, which does not call
 * one_call_run); each kind's largest x, `largest`. 0, or -1. */
static inline int one_call_calls(OneCall *c, int size, PyObject *ndarray, PyObject *dtypes,
                                 PyObject *ops, PyObject *empty, PyObject *take,
                                 PyObject *give, Py_ssize_t largest)
{
    if (!PyType_Check(ndarray) || !PyTuple_Check(dtypes) || PyTuple_GET_SIZE(dtypes) != DTYPES
        || !PyDict_Check(ops)) {
        PyErr_Format(PyExc_ValueError, "calls: a type, %d dtypes and a dict of ops", DTYPES);
        return -1;
    }
    Py_XSETREF(c->ndarray, Py_NewRef(ndarray));
    Py_XSETREF(c->dtypes, Py_NewRef(dtypes));
    Py_XSETREF(c->ops, Py_NewRef(ops));
    Py_XSETREF(c->empty, Py_NewRef(empty));
    Py_XSETREF(c->take, Py_XNewRef(take));
    Py_XSETREF(c->give, Py_XNewRef(give));
    for (int k = 0; k < LANE_KIND_COUNT; k++)
        c->largest[k] = largest;
    c->size = size;
    c->checks = 1;
    return 0;
}

/* bind(*, gate, codes, names, enabled, max_tag, comm_error, namer) as the contract says, for a
 * lane that has the kinds in `offered` (a mask): the mask it took, or NULL. */
static inline PyObject *one_call_bind(OneCall *c, PyTypeObject *gate_type, PyObject *gate_error,
                                      PyObject *args, PyObject *kwargs, int offered)
{
    static char *keywords[] = {"gate", "codes", "names", "enabled", "max_tag", "comm_error",
                               "namer", NULL};
    PyObject *gate, *codes, *names, *comm_error, *namer;
    int enabled;
    long max_tag;
    if (gate_type == NULL) {
        PyErr_SetObject(PyExc_ImportError, gate_error);
        return NULL;
    }
    if (!every_keyword("bind", kwargs, keywords) ||
        !PyArg_ParseTupleAndKeywords(args, kwargs, "|$O!O!O!ilOO:bind", keywords, gate_type,
                                     &gate, &PyTuple_Type, &codes, &PyTuple_Type, &names,
                                     &enabled, &max_tag, &comm_error, &namer))
        return NULL;
    if (PyTuple_GET_SIZE(codes) != ONE_CALL_CODES || PyTuple_GET_SIZE(names) != LANE_KIND_COUNT) {
        PyErr_SetString(PyExc_ValueError, "bind: bad codes or names");
        return NULL;
    }
    for (int i = 0; i < ONE_CALL_CODES; i++) {
        long code = PyLong_AsLong(PyTuple_GET_ITEM(codes, i));
        if (code == -1 && PyErr_Occurred())
            return NULL;
        c->codes[i] = (int)code;
    }
    Py_XSETREF(c->gate, (Gate *)Py_NewRef(gate));
    Py_XSETREF(c->names, Py_NewRef(names));
    Py_XSETREF(c->comm_error, Py_NewRef(comm_error));
    Py_XSETREF(c->namer, Py_NewRef(namer));
    c->enabled = enabled & offered;
    c->max_tag = max_tag;
    return PyLong_FromLong(c->enabled);
}

/* limit(kind, nbytes): the table's largest x of that kind; the lane keeps its own if less */
static inline PyObject *one_call_limit(OneCall *c, PyObject *args)
{
    int kind;
    Py_ssize_t nbytes;
    if (!PyArg_ParseTuple(args, "in:limit", &kind, &nbytes))
        return NULL;
    if (kind < 0 || kind >= LANE_KIND_COUNT) {
        PyErr_SetString(PyExc_ValueError, "limit: bad kind");
        return NULL;
    }
    if (nbytes < c->largest[kind])
        c->largest[kind] = nbytes;
    Py_RETURN_NONE;
}

/* The transport's part of a taken call: x (its view xv) into target (tv), dtype and op
 * codes (op 0 but for all_reduce and reduce_scatter), root (broadcast's; -1 for the others):
 * 0, or -1 with an exception. Runs with the engine taken. */
typedef int (*OneCallWork)(void *lane, int kind, PyObject *x, const Py_buffer *xv,
                           PyObject *target, const Py_buffer *tv, int dtype, int op, int root);
/* Whether the engine, taken, has nothing that must go first: 1, 0 (the Python path's), or -1
 * with an exception. NULL: always. */
typedef int (*OneCallReady)(void *lane);
/* Whether a guarded call of kind larger than its largest is taken all the same (shm's
 * all_gather and broadcast, each block copied once), given x's view and out's (NULL where
 * the result is new). NULL: never. */
typedef int (*OneCallBeyond)(void *lane, int kind, const Py_buffer *xv, const Py_buffer *out);

/* Call f() with an error that may be set kept aside: 0, or -1 with f's error (which then
 * replaces the one kept). For the engine's lock, given back on every path. */
static inline int one_call_keeping_error(PyObject *f)
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

/* A new result: empty(shape[:ndim], dtype) (numpy.empty); NULL with an exception */
static inline PyObject *one_call_empty(PyObject *empty, const Py_ssize_t *shape, int ndim,
                                       PyObject *dtype)
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

/* The shape of kind's result for x's (view) on size ranks, into shape: its ndim, or -1 where
 * x does not divide (reduce_scatter) */
static inline int one_call_shape(int kind, const Py_buffer *x, Py_ssize_t size,
                                 Py_ssize_t *shape)
{
    int ndim = x->ndim;
    for (int i = 0; i < ndim; i++)
        shape[i] = x->shape[i];
    if (kind == ONE_CALL_ALL_GATHER) {
        if (ndim > 0)
            shape[0] *= size;
        else
            shape[ndim++] = size;
    } else if (kind == ONE_CALL_REDUCE_SCATTER) {
        if (ndim <= 0 || shape[0] % size)
            return -1;
        shape[0] /= size;
    }
    return ndim;
}

/*
 * A whole call of kind (all_reduce and reduce_scatter: x, op_name, out; all_gather: x, out;
 * broadcast: x, root, out): checked (x a numpy array of a known dtype, C-contiguous, not
 * empty, at most the kind's largest or taken beyond it; out None or one of the result's shape
 * and dtype, writable; a root among the ranks), the communicator's gate taken where the call
 * is guarded (the communicator's own, bound; else a transport's direct_* path, whose caller
 * holds the communicator and counts the call), the engine's lock taken where the lane has one
 * (else the Python path's: None), ready asked, the work done, the call counted and recorded,
 * the lock and the gate given back. The result (out, or a new array), None where the call is
 * not this path's (nothing touched), or NULL with the error, a CommError named as the
 * communicator names it.
 */
static inline PyObject *one_call_run_any(OneCall *c, void *lane, int kind, PyObject *x,
                                         PyObject *op_name, long root, PyObject *out,
                                         int guarded, OneCallReady ready, OneCallBeyond beyond,
                                         OneCallWork work)
{
    if (!c->checks || (guarded && !(c->enabled & (1 << kind))) ||
        Py_TYPE(x) != (PyTypeObject *)c->ndarray ||
        (out != Py_None && Py_TYPE(out) != (PyTypeObject *)c->ndarray) ||
        (kind == ONE_CALL_BROADCAST ? root < 0 || root >= c->size : root != -1))
        Py_RETURN_NONE;
    int op = 0;
    if (kind == ONE_CALL_ALL_REDUCE || kind == ONE_CALL_REDUCE_SCATTER) {
        PyObject *code = PyUnicode_CheckExact(op_name) ? PyDict_GetItemWithError(c->ops, op_name)
                                                       : NULL;
        if (code == NULL) {
            if (PyErr_Occurred())
                return NULL;
            Py_RETURN_NONE;
        }
        op = (int)PyLong_AsLong(code);
    }
    PyObject *dtype, *out_dtype = NULL, *result = NULL, *target = NULL;
    int dtype_at = one_call_dtype(c->dtypes, x, &dtype);
    if (dtype_at == -2)
        return NULL;
    if (out != Py_None && one_call_dtype(c->dtypes, out, &out_dtype) == -2) {
        Py_DECREF(dtype);
        return NULL;
    }
    Py_XDECREF(out_dtype); /* (only compared: it lives as long as out) */
    Py_buffer xv, tv;
    Py_ssize_t shape[64];
    int ndim = 0, have_x = 0, have_target = 0, slot = -1, taken = 0, idle;
    if (dtype_at < 0 || (out_dtype != NULL && out_dtype != dtype))
        goto decline;
    /* C-contiguous, with the shape, no format (bfloat16 has none): numpy refuses another */
    if (PyObject_GetBuffer(x, &xv, PyBUF_C_CONTIGUOUS) < 0)
        goto refused;
    have_x = 1;
    if (xv.len == 0 || xv.ndim > 62 || (ndim = one_call_shape(kind, &xv, c->size, shape)) < 0)
        goto decline;
    if (out != Py_None) {
        if (PyObject_GetBuffer(out, &tv, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0)
            goto refused;
        have_target = 1;
        if (tv.ndim != ndim || (ndim && memcmp(tv.shape, shape, ndim * sizeof *shape)))
            goto decline;
    }
    if (xv.len > c->largest[kind] &&
        !(guarded && beyond && beyond(lane, kind, &xv, have_target ? &tv : NULL)))
        goto decline;
    if (guarded) {
        int reduces = kind == ONE_CALL_ALL_REDUCE || kind == ONE_CALL_REDUCE_SCATTER;
        slot = gate_enter(c->gate, c->codes[kind], dtype_at, reduces ? op : -1, root, xv.len,
                          c->codes[ONE_CALL_NATIVE], 0);
        if (slot == -2) /* a child of os.fork(): the gate raised, saying why */
            goto done;
        if (slot == -1) /* another thread's call: the Python path says so */
            goto decline;
    }
    if (c->take == NULL) {
        taken = 0; /* a lane without an engine's lock: nothing to take */
        idle = ready ? ready(lane) : 1;
    } else {
        _Static_assert(CALLBACK_NARGS(TAKE) == 1, "take's call passes blocking");
        PyObject *got = PyObject_CallOneArg(c->take, Py_False);
        if (got == NULL)
            goto done;
        taken = got == Py_True;
        Py_DECREF(got);
        idle = taken ? (ready ? ready(lane) : 1) : 0;
    }
    if (idle < 0)
        goto done;
    if (!idle)
        goto decline;
    if (out != Py_None) {
        target = Py_NewRef(out);
    } else {
        target = one_call_empty(c->empty, shape, ndim, dtype);
        if (target == NULL ||
            PyObject_GetBuffer(target, &tv, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0)
            goto done;
        have_target = 1;
    }
    if (work(lane, kind, x, &xv, target, &tv, dtype_at, op, (int)root) < 0)
        goto done;
    if (slot >= 0)
        gate_done(c->gate, slot);
    result = Py_NewRef(target);
    goto done;
refused:
    if (!one_call_refused())
        goto done;
decline:
    result = Py_NewRef(Py_None);
done:
    if (taken && one_call_keeping_error(c->give) < 0)
        Py_CLEAR(result);
    if (slot >= 0) {
        if (result == NULL)
            one_call_named(c->namer, c->comm_error, "%U", PyTuple_GET_ITEM(c->names, kind));
        gate_leave(c->gate, slot);
    }
    if (have_target)
        PyBuffer_Release(&tv);
    if (have_x)
        PyBuffer_Release(&xv);
    Py_XDECREF(target);
    Py_DECREF(dtype);
    return result;
}

/* The transport's part of a taken send (sending) or recv: x's bytes (xv) to or from peer (a
 * rank of the group, not this one) with tag. 0: moved (C, and the engine where C stopped);
 * 1: declined, nothing touched (something of the engine's must go first: the Python path's);
 * -1 with an exception. Runs with the gate held and the engine taken (where the lane has a
 * lock). */
typedef int (*OneCallMove)(void *lane, int sending, PyObject *x, const Py_buffer *xv, long peer,
                           long tag);

/*
 * A communicator's bound send(x, peer, tag) -> True, or recv(x, peer, tag) -> x (sending says
 * which), or None where the call is not this path's (nothing touched): a C-contiguous numpy
 * array of a known dtype (writable to receive into), another rank of the group (rank: this
 * one's) and a tag up to max_tag, the gate taken (gate_enter_move: counted in no collective),
 * the engine's lock taken where the lane has one, the work done, the lock and the gate given
 * back; NULL with the error, a CommError named as the communicator names it.
 */
static inline PyObject *one_call_move(OneCall *c, void *lane, int rank, int sending, PyObject *x,
                                      PyObject *peer_obj, PyObject *tag_obj, OneCallMove work)
{
    if (!c->checks || !(c->enabled & ONE_CALL_MOVES) || Py_TYPE(x) != (PyTypeObject *)c->ndarray ||
        !PyLong_CheckExact(peer_obj) || !PyLong_CheckExact(tag_obj))
        Py_RETURN_NONE;
    long peer = PyLong_AsLong(peer_obj), tag = PyLong_AsLong(tag_obj);
    if (PyErr_Occurred()) { /* (out of a long's range: the Python path says what is wrong) */
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    if (peer < 0 || peer >= c->size || peer == rank || tag < 0 || tag > c->max_tag)
        Py_RETURN_NONE;
    PyObject *dtype;
    int code = one_call_dtype(c->dtypes, x, &dtype);
    if (code == -2)
        return NULL;
    Py_DECREF(dtype); /* (only compared: it lives as long as x) */
    Py_buffer view;
    if (code < 0)
        Py_RETURN_NONE;
    if (PyObject_GetBuffer(x, &view, PyBUF_C_CONTIGUOUS | (sending ? 0 : PyBUF_WRITABLE)) < 0)
        return one_call_refused() ? Py_NewRef(Py_None) : NULL;
    int slot = gate_enter_move(c->gate, c->codes[sending ? ONE_CALL_SEND : ONE_CALL_RECV], code,
                               peer, tag, view.len);
    if (slot < 0) { /* -1: another thread's call (the Python path says so); -2: forked */
        PyBuffer_Release(&view);
        return slot == -1 ? Py_NewRef(Py_None) : NULL;
    }
    int taken = 0, done = 1; /* (the engine taken by another thread: the Python path's) */
    if (c->take != NULL) {
        _Static_assert(CALLBACK_NARGS(TAKE) == 1, "take's call passes blocking");
        PyObject *got = PyObject_CallOneArg(c->take, Py_False);
        taken = got == Py_True;
        done = got == NULL ? -1 : 1;
        Py_XDECREF(got);
    }
    if (done == 1 && (c->take == NULL || taken))
        done = work(lane, sending, x, &view, peer, tag);
    if (taken && one_call_keeping_error(c->give) < 0)
        done = -1;
    PyBuffer_Release(&view);
    if (done < 0)
        one_call_named(c->namer, c->comm_error, sending ? "send to rank %S" : "recv from rank %S",
                       peer_obj);
    gate_leave(c->gate, slot);
    return done < 0 ? NULL : Py_NewRef(done == 1 ? Py_None : sending ? Py_True : x);
}

/* one_call_run_any for a communicator's bound all_reduce (x, op_name, out) or all_gather
 * (x, out), with no call taken past its largest. */
static inline PyObject *one_call_run(OneCall *c, void *lane, int kind, PyObject *x,
                                     PyObject *op_name, PyObject *out, OneCallReady ready,
                                     OneCallWork work)
{
    return one_call_run_any(c, lane, kind, x, op_name, -1, out, 1, ready, NULL, work);
}

/* For a module with a lane, at its import: tbcoll.core._gate's Gate, its layout checked
 * (gate_import), into *type; where that fails the module still imports, saying why in
 * GATE_ERROR (None otherwise) and *error, which bind() raises. 0, or -1. */
static inline int one_call_import_gate(PyObject *module, PyTypeObject **type, PyObject **error)
{
    *type = gate_import();
    if (*type == NULL) {
        PyObject *kind, *value, *trace;
        PyErr_Fetch(&kind, &value, &trace);
        *error = value ? PyObject_Str(value) : NULL;
        Py_XDECREF(kind);
        Py_XDECREF(value);
        Py_XDECREF(trace);
        if (*error == NULL)
            return -1;
    }
    return PyModule_AddObjectRef(module, "GATE_ERROR", *error ? *error : Py_None);
}

#endif
