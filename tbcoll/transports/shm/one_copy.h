/* The shm lane's one-copy calls' rounds (one_copy.c), for lane.c.
 * May include: Python.h, lane_base.h. */
#ifndef TBCOLL_SHM_ONE_COPY_H
#define TBCOLL_SHM_ONE_COPY_H

#include <Python.h>
#include <stdint.h>

#include "lane_base.h"

/* One copy of a one-copy call's schedule (copy_plan, one_copy.c): from (or, write, to) the
 * peer's buffer at theirs, to (or from) this rank's result at mine, nbytes of them. */
typedef struct {
    Py_ssize_t peer, buffer, theirs, mine, nbytes;
    int write;
} CopyStep;

/* The copies a rank makes in a one-copy call of kind, in order (see one_copy.c): how many,
 * into steps (room for size). */
INTERNAL Py_ssize_t copy_plan(int kind, Py_ssize_t rank, Py_ssize_t size, Py_ssize_t root,
                              Py_ssize_t n, Py_ssize_t item, int from_results, CopyStep *steps);

/* The module's copy_plan(kind, rank, size, root, nbytes, itemsize, from_results). */
INTERNAL PyObject *copy_plan_py(PyObject *module, PyObject *args);

/* An all_gather or broadcast of r (x, the result, the call's signature) past the lane's
 * limit, each block copied once (see one_copy.c): 0, or -1 with an exception. */
INTERNAL int one_copy(Lane *self, Round *r, char *base, uint64_t signature);

/* The Lane's copy_once(kind, src, dst, root, where, table, signature, mapped, attach) method:
 * whether the call was made. */
INTERNAL PyObject *lane_copy_once(Lane *self, PyObject *args);

#endif
