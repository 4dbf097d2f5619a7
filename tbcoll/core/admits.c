/*
 * The module's plain(kind, x, arg, out, size), which asks the check of a call's arguments
 * that every one-call path makes (admits.h's arguments_admit, which tbcoll.core._gate.LaneCall's
 * admission asks too: one_call.c's lane_admits) for a transport's direct path that has no
 * lane (tbcoll.comm.routes' gated); the arguments of a lane's call (its kind, op, root) as Python
 * passes them.
 *
 * Includes: Python.h, tbcoll/include/buffers.h (positional), lane.h (the kinds), wire.h
 * (DTYPES); admits.h.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#include "admits.h"
#include "../include/buffers.h"
#include "../include/lane.h"
#include "../include/wire.h"

/* A kind from Python: 0, or -1 with a ValueError */
int kind_of(PyObject *arg, long *kind)
{
    *kind = PyLong_AsLong(arg);
    if (*kind >= 0 && *kind < LANE_KIND_COUNT)
        return 0;
    if (!PyErr_Occurred())
        PyErr_SetString(PyExc_ValueError, "bad kind");
    return -1;
}

/* A call's (kind, x, arg, out) as lane_admits takes them: op_name and root (arg is op for
 * the reductions, root for broadcast); 0 where arg is no root (not this path's) */
int call_arguments(long kind, PyObject *arg, PyObject **op_name, long *root)
{
    *op_name = Py_None;
    *root = -1;
    if (kind == LANE_BROADCAST)
        return take_root(arg, root);
    if (kind == LANE_ALL_REDUCE || kind == LANE_REDUCE_SCATTER)
        *op_name = arg;
    return 1;
}

/* The arrays the module's plain() takes (arrays()); NULL until then */
static Arrays module_arrays;

/* arrays(ndarray, dtypes, ops): what plain() takes (tbcoll.core.gate gives them at its import) */
static PyObject *arrays_method(PyObject *module, PyObject *args)
{
    PyObject *ndarray, *dtypes, *ops;
    (void)module;
    if (!PyArg_ParseTuple(args, "O!O!O!:arrays", &PyType_Type, &ndarray, &PyTuple_Type, &dtypes,
                          &PyDict_Type, &ops))
        return NULL;
    if (PyTuple_GET_SIZE(dtypes) != DTYPES) {
        PyErr_Format(PyExc_ValueError, "arrays: %d dtypes", DTYPES);
        return NULL;
    }
    Py_XSETREF(module_arrays.ndarray, Py_NewRef(ndarray));
    Py_XSETREF(module_arrays.dtypes, Py_NewRef(dtypes));
    Py_XSETREF(module_arrays.ops, Py_NewRef(ops));
    Py_RETURN_NONE;
}

/* plain(kind, x, arg, out, size) -> bool: whether a call of kind (a lane's kinds: arg op for
 * the reductions, root for broadcast, None for all_gather) on size ranks has arguments a
 * one-call path may take as they are (arguments_admit, the check every lane's call makes),
 * for a transport's direct path that has no lane (tbcoll.comm.routes' gated) */
static PyObject *plain_method(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    long kind, root, size;
    PyObject *op_name;
    (void)module;
    if (!positional("plain", nargs, 5) || kind_of(args[0], &kind) < 0 ||
        ((size = PyLong_AsLong(args[4])) == -1 && PyErr_Occurred()))
        return NULL;
    if (module_arrays.ndarray == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "plain: before arrays()");
        return NULL;
    }
    if (!call_arguments(kind, args[2], &op_name, &root))
        Py_RETURN_FALSE;
    Admitted a;
    int admitted = arguments_admit(&module_arrays, (int)size, (int)kind, args[1], op_name, root,
                                   args[3], &a);
    if (admitted < 0)
        return NULL;
    if (admitted)
        admitted_release(&a);
    return PyBool_FromLong(admitted);
}

static PyMethodDef functions[] = {
    {"arrays", arrays_method, METH_VARARGS, "What plain() takes."},
    {"plain", (PyCFunction)(void (*)(void))plain_method, METH_FASTCALL,
     "Whether a call's arguments may take a one-call path as they are."},
    {NULL, NULL, 0, NULL},
};

int add_plain(PyObject *module)
{
    return PyModule_AddFunctions(module, functions);
}
