/*
 * What each of the shm lane's paths shares (lane_base.h): a round run to its end and resumed
 * in Python (lane_round, over rounds.c's run_round), a CommError named as the communicator
 * names it, numpy's refusal of a buffer told from an error, a dtype's code.
 *
 * Includes: Python.h, lane_base.h (and the pure layer through it).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "lane_base.h"

PyObject *DTYPE_NAME;

int lane_base_ready(void)
{
    DTYPE_NAME = PyUnicode_InternFromString("dtype");
    return DTYPE_NAME != NULL ? 0 : -1;
}

/* Run round self->rounds + 1 to its end over the segment at base: where a wait runs out of
 * its budget (or the calls differ), resume(stage, seq, signature) waits in Python (which
 * notices dead ranks and the deadline) or raises, and the round goes on. */
int lane_round(Lane *self, Round *r, char *base, uint64_t signature)
{
    uint64_t seq = self->rounds + 1;
    r->base = base;
    r->flags = self->flags;
    r->size = self->size;
    r->rank = self->rank;
    r->slots = self->sets[seq & 1];
    r->slot_bytes = self->slot_bytes;
    int stage = ROUND_WAIT_FREE;
    while ((stage = run_round(r, seq, stage, self->budget, signature)) > 0) {
        self->rounds = seq; /* begun: this round's flags are stored */
        PyObject *done = PyObject_CallFunction(self->resume, "iKK", stage,
                                               (unsigned long long)seq,
                                               (unsigned long long)signature);
        if (done == NULL)
            return -1;
        Py_DECREF(done);
        if (stage == ROUND_CALLS_DIFFER) /* resume returned: every signature matches after all */
            stage = ROUND_WAIT_ARRIVED;
    }
    if (stage == ROUND_MISFIT) {
        PyErr_SetString(PyExc_ValueError, "buffers do not fit the segment");
        return -1;
    }
    self->rounds = seq; /* ROUND_DONE */
    return ROUND_DONE;
}

/* Whether the error raised is numpy refusing a buffer request (then cleared). */
int lane_refused(void)
{
    if (!PyErr_ExceptionMatches(PyExc_BufferError) && !PyErr_ExceptionMatches(PyExc_ValueError))
        return 0;
    PyErr_Clear();
    return 1;
}

/* The dtype code of an array's dtype object (by identity, as tbcoll.comm's KNOWN_DTYPES), or
 * -1; *dtype is a new reference. */
int lane_dtype_code(Lane *self, PyObject *array, PyObject **dtype)
{
    *dtype = PyObject_GetAttr(array, DTYPE_NAME);
    if (*dtype == NULL)
        return -2;
    for (int code = 0; code < DTYPES; code++)
        if (PyTuple_GET_ITEM(self->dtypes, code) == *dtype)
            return code;
    return -1;
}

/* Where a bound call raised a CommError: the communicator's name for it (bind's namer, called
 * with the error and `what`, a format of arg), raised as `raise named from error` would;
 * anything else as it was (also where the communicator is gone). Returns NULL. */
PyObject *lane_named(Lane *self, const char *what, PyObject *arg)
{
    if (self->namer == NULL || !PyErr_ExceptionMatches(self->comm_error))
        return NULL;
    PyObject *type, *error, *trace;
    PyErr_Fetch(&type, &error, &trace);
    PyErr_NormalizeException(&type, &error, &trace);
    if (trace != NULL)
        PyException_SetTraceback(error, trace);
    PyObject *name = PyUnicode_FromFormat(what, arg);
    PyObject *namer = name ? PyObject_CallNoArgs(self->namer) : NULL;
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
