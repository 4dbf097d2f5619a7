/*
 * The check of a call's arguments that every one-call path makes, written once (admits.h):
 * for tbcoll._gate.LaneCall's admission (one_call.c's lane_admits) and for the module's
 * plain(kind, x, arg, out, size), which asks it for a transport's direct path that has no
 * lane (tbcoll.routes' gated); the arguments of a lane's call (its kind, op, root) as Python
 * passes them.
 *
 * Includes: Python.h, tbcoll/include/buffers.h (positional), lane.h (the kinds), wire.h
 * (DTYPES); admits.h.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#include "admits.h"
#include "include/buffers.h"
#include "include/lane.h"
#include "include/wire.h"

/* The code of array's dtype among dtypes (a tuple by code, compared by identity, as
 * tbcoll.collective_base's KNOWN_DTYPES), or -1; -2 with an exception. *dtype: a new
 * reference. */
int dtype_code(PyObject *dtypes, PyObject *array, PyObject **dtype)
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
int refused_buffer(void)
{
    if (!PyErr_ExceptionMatches(PyExc_BufferError) && !PyErr_ExceptionMatches(PyExc_ValueError))
        return 0;
    PyErr_Clear();
    return 1;
}

/* The shape of kind's result for x's (view) on size ranks, into shape: its ndim, or -1 where
 * x does not divide (reduce_scatter) */
static int result_shape(int kind, const Py_buffer *x, Py_ssize_t size, Py_ssize_t *shape)
{
    int ndim = x->ndim;
    for (int i = 0; i < ndim; i++)
        shape[i] = x->shape[i];
    if (kind == LANE_ALL_GATHER) {
        if (ndim > 0)
            shape[0] *= size;
        else
            shape[ndim++] = size;
    } else if (kind == LANE_REDUCE_SCATTER) {
        if (ndim <= 0 || shape[0] % size)
            return -1;
        shape[0] /= size;
    }
    return ndim;
}

void admitted_release(Admitted *a)
{
    if (a->have_out)
        PyBuffer_Release(&a->tv);
    if (a->have_x)
        PyBuffer_Release(&a->xv);
    a->have_out = a->have_x = 0;
    Py_CLEAR(a->dtype_obj);
}

/*
 * The check of a call's arguments, written once: x a numpy array of a known dtype,
 * C-contiguous, not empty; op a known reduction (all_reduce, reduce_scatter); root a rank
 * of the ranks (broadcast; -1 for the others); out None or a writable C-contiguous numpy
 * array of the result's shape and dtype. 1: they are (a's views held: admitted_release), 0
 * not (nothing held), -1 with an exception.
 */
int arguments_admit(const Arrays *arrays, int ranks, int kind, PyObject *x,
                           PyObject *op_name, long root, PyObject *out, Admitted *a)
{
    a->have_x = a->have_out = 0;
    a->dtype_obj = NULL;
    a->op = 0;
    if (Py_TYPE(x) != (PyTypeObject *)arrays->ndarray ||
        (out != Py_None && Py_TYPE(out) != (PyTypeObject *)arrays->ndarray) ||
        (kind == LANE_BROADCAST ? root < 0 || root >= ranks : root != -1))
        return 0;
    if (kind == LANE_ALL_REDUCE || kind == LANE_REDUCE_SCATTER) {
        PyObject *code = PyUnicode_CheckExact(op_name)
                             ? PyDict_GetItemWithError(arrays->ops, op_name) : NULL;
        if (code == NULL)
            return PyErr_Occurred() ? -1 : 0;
        a->op = (int)PyLong_AsLong(code);
    }
    PyObject *out_dtype = NULL;
    if ((a->dtype = dtype_code(arrays->dtypes, x, &a->dtype_obj)) == -2)
        goto failed;
    if (out != Py_None && dtype_code(arrays->dtypes, out, &out_dtype) == -2)
        goto failed;
    Py_XDECREF(out_dtype); /* (only compared: it lives as long as out) */
    if (a->dtype < 0 || (out_dtype != NULL && out_dtype != a->dtype_obj))
        goto declined;
    /* C-contiguous, with the shape, no format (bfloat16 has none): numpy refuses another */
    if (PyObject_GetBuffer(x, &a->xv, PyBUF_C_CONTIGUOUS) < 0)
        goto refused;
    a->have_x = 1;
    if (a->xv.len == 0 || a->xv.ndim > 62 ||
        (a->ndim = result_shape(kind, &a->xv, ranks, a->shape)) < 0)
        goto declined;
    if (out != Py_None) {
        if (PyObject_GetBuffer(out, &a->tv, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0)
            goto refused;
        a->have_out = 1;
        if (a->tv.ndim != a->ndim ||
            (a->ndim && memcmp(a->tv.shape, a->shape, a->ndim * sizeof *a->shape)))
            goto declined;
    }
    return 1;
refused:
    if (refused_buffer())
        goto declined;
failed:
    admitted_release(a);
    return -1;
declined:
    admitted_release(a);
    return 0;
}

int take_root(PyObject *root, long *value)
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

/* arrays(ndarray, dtypes, ops): what plain() takes (tbcoll.gate gives them at its import) */
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
 * for a transport's direct path that has no lane (tbcoll.routes' gated) */
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
