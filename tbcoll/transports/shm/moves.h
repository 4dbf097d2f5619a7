/* The shm lane's send and recv over the stream engine's rings, and the engine's own blocking
 * moves (moves.c), for lane.c (its methods, its lane's move and tp_clear) and _atomics.c (the
 * constants). May include: Python.h, lane_base.h. */
#ifndef TBCOLL_SHM_MOVES_H
#define TBCOLL_SHM_MOVES_H

#include <Python.h>

#include "lane_base.h"

/* The Lane methods streams() and move() (the engine's own) */
INTERNAL PyObject *lane_streams(Lane *self, PyObject *args, PyObject *kwargs);
INTERNAL PyObject *lane_move(Lane *self, PyObject *args);
/* The lane's send and recv, once taken (tbcoll/include/lane.h's move) */
INTERNAL int move_message(void *lane, int sending, PyObject *x, const Py_buffer *xv, long peer,
                          long tag);
/* The pull's steps, for the engine's Python (the module's pull_announcement, pull_answer and
 * pull_payload: see moves.c) */
INTERNAL PyObject *pull_announcement(PyObject *module, PyObject *args);
INTERNAL PyObject *pull_answer(PyObject *module, PyObject *args);
INTERNAL PyObject *pull_payload_py(PyObject *module, PyObject *args);
/* The module's MOVE_* constants (what move() leaves to the engine): 0, or -1 */
INTERNAL int add_move_outcomes(PyObject *module);
/* The release of the engine's words (tp_clear) */
INTERNAL void lane_release_words(Lane *self);

#endif
