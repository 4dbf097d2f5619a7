/* The shm lane's one-copy calls' rounds (one_copy.c), for lane.c.
 * May include: Python.h, lane_base.h. */
#ifndef TBCOLL_SHM_ONE_COPY_H
#define TBCOLL_SHM_ONE_COPY_H

#include <Python.h>
#include <stdint.h>

#include "lane_base.h"

/* An all_gather or broadcast of r (x, the result, the call's signature) past the lane's
 * limit, each block copied once (see one_copy.c): 0, or -1 with an exception. */
INTERNAL int one_copy(Lane *self, Round *r, char *base, uint64_t signature);

/* The Lane's copy_once(kind, src, dst, root, where, table, signature, mapped, attach) method:
 * whether the call was made. */
INTERNAL PyObject *lane_copy_once(Lane *self, PyObject *args);

#endif
