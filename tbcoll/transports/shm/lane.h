/* The shm lane's Python type (lane.c), for the module (_atomics.c): the Lane struct itself is
 * lane_base.h's, which every file of the lane's paths includes.
 * May include: Python.h, shm.h. */
#ifndef TBCOLL_LANE_H
#define TBCOLL_LANE_H

#include <Python.h>

#include "shm.h" /* INTERNAL */

/* Adds the Lane type to the module: 0, or -1 with an exception. */
INTERNAL int add_lane_type(PyObject *module);

#endif
