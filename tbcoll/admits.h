/* The check of a call's arguments (admits.c), for LaneCall (one_call.c) and the module
 * (_gate.c). May include: Python.h. */
#ifndef TBCOLL_ADMITS_H
#define TBCOLL_ADMITS_H

#include <Python.h>

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

/* Let go of what an admitted call holds */
ADMITS_INTERNAL void admitted_release(Admitted *a);
/* The check of a call's arguments (see admits.c): 1 (a's views held), 0, or -1 */
ADMITS_INTERNAL int arguments_admit(const Arrays *arrays, int ranks, int kind, PyObject *x,
                                    PyObject *op_name, long root, PyObject *out, Admitted *a);
/* The code of array's dtype among dtypes, or -1; -2 with an exception (*dtype: new) */
ADMITS_INTERNAL int dtype_code(PyObject *dtypes, PyObject *array, PyObject **dtype);
/* Whether the error set is numpy's refusal of a buffer (then cleared) */
ADMITS_INTERNAL int refused_buffer(void);
/* A root from Python: 1, or 0 where it is none (not an int, out of range) */
ADMITS_INTERNAL int take_root(PyObject *root, long *value);
/* A kind from Python: 0, or -1 with a ValueError */
ADMITS_INTERNAL int kind_of(PyObject *arg, long *kind);
/* A call's arg as op_name or root by its kind: 0 where it is no root */
ADMITS_INTERNAL int call_arguments(long kind, PyObject *arg, PyObject **op_name, long *root);
/* Adds arrays() and plain() to the module: 0, or -1 */
ADMITS_INTERNAL int add_plain(PyObject *module);

#endif
