/* The Fabric's byte stream, as tbcoll.transports.stream's engine drives it: send, recv_into,
 * wait and lost over the STREAM queue pairs (fabric.h: FLOW CONTROL). */
#include "fabric.h"

#include <stdlib.h>
#include <string.h>

static int writable(Peer *p)
{
    return p->credits >= 2 && p->nfree > 0;
}

/* send(peer, buffers) -> bytes taken from the front of buffers (0: no room now). Copies into
 * send buffers and posts them; each message carries the credits we owe the peer. */
INTERNAL PyObject *Fabric_send(Fabric *f, PyObject *args)
{
    int k;
    PyObject *list;
    if (!PyArg_ParseTuple(args, "iO", &k, &list))
        return NULL;
    Peer *p = verbs_peer_arg(f, k);
    if (!p)
        return NULL;
    if (p->lost[0])
        return PyErr_Format(PyExc_ConnectionError, "%s", p->lost);
    PyObject *seq = PySequence_Fast(list, "buffers must be a sequence");
    if (!seq)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), taken = 0;
    Py_ssize_t item = 0, offset = 0;
    Py_buffer view = {0};
    int have = 0;
    verbs_progress(f);
    while (writable(p)) {
        int slot = p->free_slots[p->nfree - 1];
        char *out = p->send_slots + (size_t)slot * STREAM_CHUNK;
        uint32_t fill = STREAM_HEADER;
        while (fill < STREAM_CHUNK && item < n) {
            if (!have) {
                if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, item), &view,
                                       PyBUF_SIMPLE) < 0)
                    goto error;
                have = 1;
            }
            Py_ssize_t take = view.len - offset;
            if (take > STREAM_CHUNK - fill)
                take = STREAM_CHUNK - fill;
            memcpy(out + fill, (char *)view.buf + offset, (size_t)take);
            fill += (uint32_t)take, offset += take, taken += take;
            if (offset == view.len) {
                PyBuffer_Release(&view);
                have = 0, offset = 0, item++;
            }
        }
        if (fill == STREAM_HEADER)
            break;
        uint32_t header[2] = {p->unreturned, 0};
        memcpy(out, header, sizeof header);
        p->unreturned = 0;
        p->nfree--;
        p->credits--;
        if (verbs_post_stream_send(f, k, slot, fill))
            break;
    }
    if (have)
        PyBuffer_Release(&view);
    Py_DECREF(seq);
    return PyLong_FromSsize_t(taken);
error:
    Py_DECREF(seq);
    return NULL;
}

/* recv_into(peer, buffer) -> bytes read of what has arrived (0: nothing yet) */
INTERNAL PyObject *Fabric_recv_into(Fabric *f, PyObject *args)
{
    int k;
    Py_buffer view;
    if (!PyArg_ParseTuple(args, "iw*", &k, &view))
        return NULL;
    Peer *p = verbs_peer_arg(f, k);
    if (!p) {
        PyBuffer_Release(&view);
        return NULL;
    }
    if (!p->fifo_count)
        verbs_progress(f);
    Py_ssize_t got = 0;
    while (got < view.len && p->fifo_count) {
        int index = p->fifo[p->fifo_head];
        uint32_t bytes = p->fifo_bytes[p->fifo_head];
        Py_ssize_t take = bytes - p->read_at;
        if (take > view.len - got)
            take = view.len - got;
        memcpy((char *)view.buf + got, p->recv_chunks + (size_t)index * STREAM_CHUNK +
               STREAM_HEADER + p->read_at, (size_t)take);
        got += take;
        p->read_at += (uint32_t)take;
        if (p->read_at == bytes) { /* read whole: post it again, and owe the peer a credit */
            p->read_at = 0;
            p->fifo_head = (p->fifo_head + 1) % STREAM_RECVS;
            p->fifo_count--;
            p->unreturned++;
            verbs_post_stream_recv(f, k, index);
        }
    }
    verbs_return_credits(f, k);
    PyBuffer_Release(&view);
    if (!got && p->lost[0])
        return PyErr_Format(PyExc_ConnectionError, "%s", p->lost);
    return PyLong_FromSsize_t(got);
}

/* The peers ready now: (rank, readable, writable) for each that has something to read, is
 * lost, or is among `writers` and may send. */
static PyObject *ready_list(Fabric *f, const unsigned char *want_write)
{
    PyObject *out = PyList_New(0);
    for (int k = 0; out && k < f->size; k++) {
        Peer *p = &f->peer[k];
        if (p->device < 0)
            continue;
        int r = p->fifo_count > 0 || p->lost[0] != 0;
        int w = want_write[k] && (writable(p) || p->lost[0]);
        if (r || w) {
            PyObject *t = Py_BuildValue("(iOO)", k, r ? Py_True : Py_False,
                                        w ? Py_True : Py_False);
            if (!t || PyList_Append(out, t) < 0)
                Py_CLEAR(out);
            Py_XDECREF(t);
        }
    }
    return out;
}

/* wait(budget, writers) -> ready list (see ready_list), after at most budget seconds */
INTERNAL PyObject *Fabric_wait(Fabric *f, PyObject *args)
{
    double budget;
    PyObject *writers;
    if (!PyArg_ParseTuple(args, "dO", &budget, &writers))
        return NULL;
    unsigned char *want = calloc((size_t)f->size, 1);
    PyObject *seq = PySequence_Fast(writers, "writers must be a sequence");
    if (!want || !seq) {
        free(want);
        Py_XDECREF(seq);
        return seq ? PyErr_NoMemory() : NULL;
    }
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
        long k = PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, i));
        if (k >= 0 && k < f->size)
            want[k] = 1;
    }
    Py_DECREF(seq);
    PyErr_Clear();
    Py_BEGIN_ALLOW_THREADS
    double start = verbs_now(), nap = 0;
    for (;;) {
        verbs_progress(f);
        int any = 0;
        for (int k = 0; k < f->size && !any; k++) {
            Peer *p = &f->peer[k];
            any = p->device >= 0 && (p->fifo_count || p->lost[0] || (want[k] && writable(p)));
        }
        if (any || verbs_budget_spent(f, start, budget, &nap))
            break;
    }
    Py_END_ALLOW_THREADS
    PyObject *out = ready_list(f, want);
    free(want);
    return out;
}

/* lost(peer) -> why the peer is lost, or None */
INTERNAL PyObject *Fabric_lost(Fabric *f, PyObject *rank)
{
    Peer *p = verbs_peer_of(f, rank);
    if (!p)
        return NULL;
    if (!p->lost[0])
        Py_RETURN_NONE;
    return PyUnicode_FromString(p->lost);
}
