/* Every call from C into Python that passes arguments, declared once: X(name, format, "argument
 * names"), the format as PyObject_CallFunction reads it (one letter per argument, "y#" for
 * bytes) and the names the Python callable's parameters carry, in order. Each extension exports
 * the tables it calls through as its module's CALLBACKS (add_callbacks) and tbcoll.core.callbacks
 * compares them with Python's declaration at import; the Python side checks each callable's
 * parameter names once, where it hands the callable to C. Call sites take their format from
 * here (CALLBACK_FORMAT) and never write one; those that call with objects already made
 * (vectorcall, on the hot path) assert their argument count against it at compile time.
 * Python-facing: included by the lanes and their module files. May include: Python.h. */
#ifndef TBCOLL_CALLBACKS_H
#define TBCOLL_CALLBACKS_H

#include <Python.h>

/* --- one entry per callback: CALLBACK_<NAME>(X) expands to X(name, format, names) ---------- */
/* the whole call around a lane (tbcoll/core/one_call.c, in tbcoll.core._gate): the communicator's
 * namer, results, the engine's lock */
#define CALLBACK_NAMED(X) X("named", "OO", "error what")
#define CALLBACK_EMPTY(X) X("empty", "OO", "shape dtype")
#define CALLBACK_TAKE(X) X("take", "O", "blocking")
/* shm's lane (tbcoll/transports/shm/lane.c, lane_base.c, moves.c) */
#define CALLBACK_BROADCAST_CALL(X) X("broadcast_call", "ii", "dtype root")
#define CALLBACK_RESUME(X) X("resume", "iKK", "stage seq signature")
#define CALLBACK_LOOK(X) X("look", "n", "dest")
#define CALLBACK_ENGINE_SEND(X) X("engine_send", "OOO", "buf peer tag")
#define CALLBACK_ENGINE_RECV(X) X("engine_recv", "OOO", "buf peer tag")
#define CALLBACK_FINISH_PULLED_SEND(X) X("finish_pulled_send", "OOK", "buf dest pull")
#define CALLBACK_SHM_FINISH_SEND(X) X("shm_finish_send", "OOyn", "buf dest header written")
#define CALLBACK_SHM_FINISH_RECV(X) X("shm_finish_recv", "OOyn", "buf source header copied")
#define CALLBACK_FINISH_ANNOUNCEMENT(X)                                                       \
    X("finish_announcement", "OOyy", "buf source header descriptor")
/* tcp's lane (tbcoll/transports/tcp/tcp_lane.c) */
#define CALLBACK_TCP_FINISH(X)                                                                \
    X("tcp_finish", "OOOOOii", "x out blocks header stopped dtype_code op_code")
#define CALLBACK_TCP_FINISH_SEND(X)                                                           \
    X("tcp_finish_send", "Oiy#ni", "buf dest header written error")
#define CALLBACK_TCP_FINISH_RECV(X)                                                           \
    X("tcp_finish_recv", "Oiy#nni", "buf source header copied staged error")
#define CALLBACK_TCP_KEEP(X) X("tcp_keep", "Oiy#", "buf dest header")
/* rdma's mesh lane (tbcoll/transports/rdma/mesh_lane.c) */
#define CALLBACK_MESH_HELD(X) X("mesh_held", "iOOiiKl", "kind src dst dtype op call result")

/* --- the tables, one per extension's part ------------------------------------------------- */
#define CALLBACKS_ONE_CALL(X) CALLBACK_NAMED(X) CALLBACK_EMPTY(X) CALLBACK_TAKE(X)
#define CALLBACKS_SHM(X)                                                                      \
    CALLBACK_BROADCAST_CALL(X) CALLBACK_RESUME(X) CALLBACK_LOOK(X) CALLBACK_ENGINE_SEND(X)    \
    CALLBACK_ENGINE_RECV(X) CALLBACK_FINISH_PULLED_SEND(X) CALLBACK_SHM_FINISH_SEND(X)       \
    CALLBACK_SHM_FINISH_RECV(X) CALLBACK_FINISH_ANNOUNCEMENT(X)
#define CALLBACKS_TCP(X)                                                                      \
    CALLBACK_TCP_FINISH(X) CALLBACK_TCP_FINISH_SEND(X) CALLBACK_TCP_FINISH_RECV(X)           \
    CALLBACK_TCP_KEEP(X)
#define CALLBACKS_RDMA(X) CALLBACK_MESH_HELD(X)

/* --- what a call site reads ------------------------------------------------------------- */
#define CALLBACK_FORMAT_OF(name, format, names) format
/* the format of one callback: PyObject_CallFunction(f, CALLBACK_FORMAT(RESUME), ...) */
#define CALLBACK_FORMAT(entry) CALLBACK_##entry(CALLBACK_FORMAT_OF)
/* the argument count of a callback whose format has one letter per argument (vectorcall's) */
#define CALLBACK_NARGS(entry) ((Py_ssize_t)sizeof(CALLBACK_FORMAT(entry)) - 1)

/* --- the export: CALLBACKS = ((name, format, names), ...) ---------------------------------- */
#define CALLBACK_EXPORT_FORMAT(name, format, names) "(sss)"
#define CALLBACK_EXPORT_ARGS(name, format, names) , name, format, names

/* Adds CALLBACKS, the tables given (e.g. CALLBACKS_ONE_CALL(X) CALLBACKS_SHM(X) in one macro
 * of X), to module: 0, or -1 with an exception. */
#define ADD_CALLBACKS(module, TABLES)                                                         \
    add_callbacks_object((module), Py_BuildValue("(" TABLES(CALLBACK_EXPORT_FORMAT) ")"       \
                                                     TABLES(CALLBACK_EXPORT_ARGS)))

static inline int add_callbacks_object(PyObject *module, PyObject *callbacks)
{
    if (callbacks == NULL)
        return -1;
    if (PyModule_AddObject(module, "CALLBACKS", callbacks) < 0) {
        Py_DECREF(callbacks);
        return -1;
    }
    return 0;
}

#endif /* TBCOLL_CALLBACKS_H */
