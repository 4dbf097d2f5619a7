/* take_buffers and release_buffers: the Python buffers a C extension's function works on
 * (tbcoll.shm._atomics and its lane, tbcoll.transports._sockets), taken in one call and let go
 * in one place. A release missed on one of a ladder of error paths leaves the object exported
 * for ever (numpy then refuses to resize the array); taking all or none rules that out. */
#ifndef TBCOLL_BUFFERS_H
#define TBCOLL_BUFFERS_H

#include <Python.h>

/* One buffer wanted: whose, and how (PyBUF_SIMPLE to read, PyBUF_WRITABLE to write). */
typedef struct {
    PyObject *object;
    int flags;
} BufferRequest;

/* The count views taken (a prefix of take_buffers' views), let go last first. */
static inline void release_buffers(Py_buffer *views, int count)
{
    while (count-- > 0)
        PyBuffer_Release(&views[count]);
}

/* views[i] = the buffer of requests[i], in order: 0, or -1 with the first refusal's error
 * set and none held. */
static inline int take_buffers(const BufferRequest *requests, Py_buffer *views, int count)
{
    for (int i = 0; i < count; i++) {
        if (PyObject_GetBuffer(requests[i].object, &views[i], requests[i].flags) < 0) {
            release_buffers(views, i);
            return -1;
        }
    }
    return 0;
}

#endif
