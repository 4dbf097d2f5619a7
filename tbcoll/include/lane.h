/*
 * The lane interface, version 1: what a transport's C extension offers so that a whole call
 * (a small collective, a send or a recv) runs in one C call, as NCCL's net plugins offer
 * theirs: one versioned struct of function pointers, found by name.
 *
 * A transport's lane (shm's tbcoll/transports/shm/lane.c, tcp's
 * tbcoll/transports/tcp/tcp_lane.c, rdma's tbcoll/transports/rdma/mesh_lane.c) fills a
 * tbcoll_lane_v1 in its own object and hands it out as a PyCapsule named TBCOLL_LANE_CAPSULE
 * (its lane_capsule() method: lane_capsule_new), whose context is the lane object (LaneCall
 * holds that, and the GC sees it there). tbcoll's gate extension takes the capsule
 * (tbcoll.core._gate.LaneCall, tbcoll/core/one_call.c), refuses another version or size, and runs
 * each call around the struct's functions: the checks of the arguments, the admission (lane_admits
 * there: the kinds, the limits, beyond), the communicator's call gate (gate.h), the engine's lock
 * (take, give), ready, the work or the move, the count and the record, the error named as the
 * communicator names it. A transport writes only its work: nothing of the whole call is compiled
 * into its extension.
 *
 * Every function runs with the GIL held (work and move may release it while they wait).
 * May include: Python.h.
 */
#ifndef TBCOLL_LANE_INTERFACE_H
#define TBCOLL_LANE_INTERFACE_H

#include <Python.h>
#include <stdint.h>

#define TBCOLL_LANE_VERSION 1
#define TBCOLL_LANE_CAPSULE "tbcoll.lane.v1"

/* The kinds of call a lane takes (tbcoll.core.names.LANE_KINDS' order; shm.h's first four), and
 * the gate codes bind() is given: each kind's, send's, recv's, the native algorithm's */
enum { LANE_ALL_REDUCE, LANE_ALL_GATHER, LANE_REDUCE_SCATTER, LANE_BROADCAST, LANE_KIND_COUNT,
       LANE_SEND = LANE_KIND_COUNT, LANE_RECV, LANE_NATIVE, LANE_CODES };
#define LANE_MOVES (1u << LANE_KIND_COUNT) /* `kinds`' bit of send and recv (comm.py _MOVES) */

typedef struct tbcoll_lane_v1 {
    uint32_t version;  /* TBCOLL_LANE_VERSION */
    uint32_t size;     /* sizeof(tbcoll_lane_v1) as the transport was built */
    uint32_t kinds;    /* bit k: kind k; LANE_MOVES: send and recv (read at each bind) */
    int ranks, rank;   /* the group's size, this rank */
    void *state;       /* the transport's lane (a LaneCall holds the object it lives in) */
    /* The transport's part of a taken collective: x (its view xv) into target (tv), dtype
     * and op codes (op 0 but for all_reduce and reduce_scatter), root (broadcast's; -1 for
     * the others). 0, or -1 with an exception. Runs with the gate and the engine taken. */
    int (*work)(void *state, int kind, PyObject *x, const Py_buffer *xv, PyObject *target,
                const Py_buffer *tv, int dtype, int op, int root);
    /* The transport's part of a taken send (sending) or recv: x's bytes to or from peer (a
     * rank of the group, not this one) with tag. 0: moved; 1: declined, nothing touched (the
     * Python path's); -1 with an exception. NULL where kinds lacks LANE_MOVES. */
    int (*move)(void *state, int sending, PyObject *x, const Py_buffer *xv, long peer,
                long tag);
    /* With the engine taken: whether nothing of the engine's must go first (1), 0 (the
     * Python path's), -1 with an exception. NULL: always ready. */
    int (*ready)(void *state);
    /* The largest x (bytes) of kind that work takes, whatever the communicator's table says
     * (which may lower it, never raise it). */
    Py_ssize_t (*limits)(void *state, int kind);
    /* Whether a bound call of kind past its limit is taken all the same (shm's all_gather
     * and broadcast, each block copied once), given x's view and out's (NULL: a new result).
     * NULL: never. */
    int (*beyond)(void *state, int kind, const Py_buffer *xv, const Py_buffer *out);
    /* The engine's lock, where the lane shares an engine with Python: take(False) -> True
     * where taken, give() (borrowed: the lane object holds them). NULL: none to take. */
    PyObject *take, *give;
} tbcoll_lane_v1;

static inline void lane_capsule_release(PyObject *capsule)
{
    Py_XDECREF((PyObject *)PyCapsule_GetContext(capsule));
}

/* The capsule of lane, a struct inside owner (the lane object), which it keeps alive: a new
 * reference, or NULL with an exception. */
static inline PyObject *lane_capsule_new(tbcoll_lane_v1 *lane, PyObject *owner)
{
    PyObject *capsule = PyCapsule_New(lane, TBCOLL_LANE_CAPSULE, lane_capsule_release);
    if (capsule == NULL)
        return NULL;
    if (PyCapsule_SetContext(capsule, Py_NewRef(owner)) < 0) {
        Py_DECREF(owner);
        Py_DECREF(capsule);
        return NULL;
    }
    return capsule;
}

/* words[0..count) from list, a list of count signatures (ints), as a lane's set-up takes
 * its calls' signatures less their bytes: 0, or -1 with an exception */
static inline int lane_words(PyObject *list, uint64_t *words, Py_ssize_t count)
{
    if (!PyList_Check(list) || PyList_GET_SIZE(list) != count) {
        PyErr_Format(PyExc_ValueError, "expected a list of %zd signatures", count);
        return -1;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        words[i] = (uint64_t)PyLong_AsUnsignedLongLong(PyList_GET_ITEM(list, i));
        if (PyErr_Occurred())
            return -1;
    }
    return 0;
}

#endif /* TBCOLL_LANE_INTERFACE_H */
