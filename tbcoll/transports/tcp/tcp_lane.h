/* tcp's Lane (tcp_lane.c), for the module (_sockets.c). May include: Python.h, exchange.h. */
#ifndef TBCOLL_TCP_LANE_H
#define TBCOLL_TCP_LANE_H

#include <Python.h>

#include "exchange.h"

/* Where an exchange stopped, for the engine to go on from: per way, (bytes of header and
 * payload sent, the send's errno or 0, copied, staged, error), as _sockets.exchange says. */
INTERNAL PyObject *ways_stopped(const struct way *ways, int n);

/* At import: the Lane type into the module (0, or -1). */
INTERNAL int add_tcp_lane(PyObject *module);

#endif
