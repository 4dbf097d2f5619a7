/* The shm lane's send and recv over the stream engine's rings (moves.c), for lane.c (its
 * methods and tp_clear).
 * May include: Python.h, lane_base.h. */
#ifndef TBCOLL_SHM_MOVES_H
#define TBCOLL_SHM_MOVES_H

#include <Python.h>

#include "lane_base.h"

/* The Lane methods streams(), send() and recv() */
INTERNAL PyObject *lane_streams(Lane *self, PyObject *args);
INTERNAL PyObject *lane_send(Lane *self, PyObject *const *args, Py_ssize_t nargs);
INTERNAL PyObject *lane_recv(Lane *self, PyObject *const *args, Py_ssize_t nargs);
/* The release of the engine's words (tp_clear) */
INTERNAL void lane_release_words(Lane *self);

#endif
