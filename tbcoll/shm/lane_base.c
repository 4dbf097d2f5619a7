/*
 * What each of the shm lane's paths shares (lane_base.h): a round run to its end and resumed
 * in Python (lane_round, over rounds.c's run_round), a CommError named as the communicator
 * names it, numpy's refusal of a buffer told from an error, a dtype's code.
 *
 * Includes: Python.h, tbcoll/include/one_call.h, lane_base.h (and the pure layer through it).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "../include/one_call.h"
#include "lane_base.h"

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
    return one_call_refused();
}

/* The dtype code of an array's dtype object (by identity, as tbcoll.comm's KNOWN_DTYPES), or
 * -1; *dtype is a new reference. */
int lane_dtype_code(Lane *self, PyObject *array, PyObject **dtype)
{
    return one_call_dtype(self->call.dtypes, array, dtype);
}

/* Where a bound call raised a CommError: the communicator's name for it (one_call_named).
 * Returns NULL. */
PyObject *lane_named(Lane *self, const char *what, PyObject *arg)
{
    return one_call_named(self->call.namer, self->call.comm_error, what, arg);
}
