/* The gate extension's LaneCall (one_call.c), for its module (_gate.c). May include: Python.h. */
#ifndef TBCOLL_ONE_CALL_H
#define TBCOLL_ONE_CALL_H

#include <Python.h>

/* Adds LaneCall, LANE_VERSION, LANE_SIZE, LANE_CAPSULE and CALLBACKS (the calls into Python
 * a LaneCall makes) to module; gate: the Gate type bind() takes. 0, or -1 with an exception. */
__attribute__((visibility("hidden"))) int add_lane_call(PyObject *module, PyTypeObject *gate);

#endif
