/*
 * What every C lane shares (a transport's whole call in one C call: tbcoll/shm/lane.c,
 * tbcoll/transports/tcp_lane.c; the contract is tbcoll/transports/base.py's Native.lane):
 * the dtype code of an array, the refusals that hand a call to the Python path, and the
 * naming of a bound call's CommError as the communicator names it.
 */
#ifndef TBCOLL_ONE_CALL_H
#define TBCOLL_ONE_CALL_H

#include <Python.h>

#include "wire.h" /* DTYPES */

/* The code of array's dtype among dtypes (a tuple by code, compared by identity, as
 * tbcoll.comm's KNOWN_DTYPES), or -1; -2 with an exception. *dtype: a new reference. */
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
 * arg), raised as `raise named from error` would; anything else as it was. Returns NULL. */
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
                            ? PyObject_CallFunctionObjArgs(namer, error, name, NULL) : NULL;
    Py_XDECREF(namer);
    Py_XDECREF(name);
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

#endif
