/* The check of a call's arguments that every one-call path makes, written once, here (inline:
 * on the hot path of each LaneCall, one_call.c), and the module's plain() that asks it for a
 * direct path with no lane (admits.c). May include: Python.h, tbcoll/include/lane.h, wire.h. */
#ifndef TBCOLL_ADMITS_H
#define TBCOLL_ADMITS_H

#include <Python.h>
#include <string.h>

#include "../include/lane.h" /* the kinds */
#include "../include/wire.h" /* DTYPES */

#define ADMITS_INTERNAL __attribute__((visibility("hidden")))

/* An admitted call: its views (released by admitted_release), codes and result's shape */
typedef struct {
    Py_buffer xv, tv;
    int have_x, have_out, dtype, op, ndim;
    PyObject *dtype_obj; /* x's dtype (a new reference) */
    Py_ssize_t shape[64];
} Admitted;

/* What a call's arrays must be: numpy arrays (ndarray) of dtypes (a tuple by code, compared
 * by identity), reductions named in ops (name -> code) */
typedef struct {
    PyObject *ndarray, *dtypes, *ops;
} Arrays;

/* The code of array's dtype among dtypes (a tuple by code, compared by identity, as
 * tbcoll.collectives.base's KNOWN_DTYPES), or -1; -2 with an exception. *dtype: a new
 * reference. */
static inline int dtype_code(PyObject *dtypes, PyObject *array, PyObject **dtype)
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
static inline int refused_buffer(void)
{
    if (!PyErr_ExceptionMatches(PyExc_BufferError) && !PyErr_ExceptionMatches(PyExc_ValueError))
        return 0;
    PyErr_Clear();
    return 1;
}

/* The shape of kind's result for x's (view) on size ranks, into shape: its ndim, or -1 where
 * x does not divide (reduce_scatter) */
static inline int result_shape(int kind, const Py_buffer *x, Py_ssize_t size,
                               Py_ssize_t *shape)
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

static inline void admitted_release(Admitted *a)
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
static inline int arguments_admit(const Arrays *arrays, int ranks, int kind, PyObject *x,
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

/* A root from Python: 1, or 0 where it is none (not an int, out of a long's range) */
static inline int take_root(PyObject *root, long *value)
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
ADMITS_INTERNAL int kind_of(PyObject *arg, long *kind);
/* A call's arg as op_name or root by its kind: 0 where it is no root */
ADMITS_INTERNAL int call_arguments(long kind, PyObject *arg, PyObject **op_name, long *root);
/* Adds arrays() and plain() to the module: 0, or -1 */
ADMITS_INTERNAL int add_plain(PyObject *module);

#endif
