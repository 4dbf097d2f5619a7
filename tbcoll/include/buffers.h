/* A C extension's function's arguments (tbcoll.transports.shm._atomics and its lane,
 * tbcoll.transports.tcp._sockets): positional, their count; take_buffers and release_buffers, the
 * Python buffers it works on, taken in one call and let go in one place. A release missed on one of
 * a ladder of error paths leaves the object exported for ever (numpy then refuses to resize the
 * array); taking all or none rules that out. */
#ifndef TBCOLL_BUFFERS_H
#define TBCOLL_BUFFERS_H

#include <Python.h>

/* Whether a METH_FASTCALL function got the `want` arguments it takes; else a TypeError naming
 * it. */
static inline int positional(const char *name, Py_ssize_t nargs, Py_ssize_t want)
{
    if (nargs == want)
        return 1;
    PyErr_Format(PyExc_TypeError, "%s takes %zd arguments (%zd given)", name, want, nargs);
    return 0;
}

/* Whether a set-up call's keywords hold every one of its keyword-only arguments (keywords: its
 * list, NULL-terminated, as PyArg_ParseTupleAndKeywords reads it, whose "|$" then refuses
 * positional and unknown ones); else a TypeError naming the first missing. Called before the
 * parse, so that nothing it takes (a buffer) is left held. Set-up calls take keywords only:
 * two arguments of one type swapped by position would go through unseen. */
static inline int every_keyword(const char *name, PyObject *kwargs, char **keywords)
{
    for (int i = 0; keywords[i] != NULL; i++)
        if (kwargs == NULL || !PyDict_Check(kwargs) ||
            PyDict_GetItemString(kwargs, keywords[i]) == NULL) {
            PyErr_Format(PyExc_TypeError, "%s needs its argument %s= (its arguments are all "
                         "keyword-only, and all needed)", name, keywords[i]);
            return 0;
        }
    return 1;
}

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
