/* A pair moved off RDMA (docs/failover.md): its queue pairs released, and its device's too
 * once no pair uses it; the mesh takes that peer's blocks from Python (which has them come
 * over the pair's tcp stream) through put(), while the other pairs stay on their queue pairs;
 * and down(), which names the peers whose device's port is no longer active (a cable pulled:
 * UC reports nothing else). Like every Fabric method these run with the engine's turns held
 * (tbcoll.transports.stream.turns), on the thread that also runs the mesh: the outside slots
 * are written and read by one thread at a time, under that lock, so no ordering between
 * threads (ARM64's included) is asked of them beyond the lock's own. */
#include "fabric.h"

#include <stdlib.h>
#include <string.h>

/* The moved peers' slots and this rank's own (2 parities x size slots of COLL_SLOT): plain
 * memory, not registered, made at the first move. */
static char *outside_slot(Fabric *f, int parity, int k)
{
    return f->outside + ((size_t)parity * f->size + k) * COLL_SLOT;
}

INTERNAL const char *verbs_outside_slot(Fabric *f, int parity, int k)
{
    return f->outside ? outside_slot(f, parity, k) : NULL;
}

/* Release device d's verbs objects (no queue pair is left on it). */
static void release_device(Device *d)
{
    if (d->mr)
        V.dereg_mr(d->mr);
    free(d->arena);
    if (d->cq)
        V.destroy_cq(d->cq);
    if (d->pd)
        V.dealloc_pd(d->pd);
    if (d->ctx)
        V.close_device(d->ctx);
    d->mr = NULL, d->arena = d->coll = NULL, d->cq = NULL, d->pd = NULL, d->ctx = NULL;
}

/* Copy what the mesh keeps in device d's arena that it will still need: this rank's blocks of
 * both parities (a peer behind by a call asks for the last one again) and peer k's block of
 * the call under way, where it came already. */
static void save_blocks(Fabric *f, Device *d, int k)
{
    for (int parity = 0; parity < 2; parity++) {
        const char *own = d->coll + ((size_t)parity * f->size + f->rank) * COLL_SLOT;
        memcpy(outside_slot(f, parity, f->rank), own, f->own_bytes[parity]);
        if (f->peer[k].coll_arrived[parity])
            memcpy(outside_slot(f, parity, k),
                   d->coll + ((size_t)parity * f->size + k) * COLL_SLOT,
                   f->peer[k].coll_bytes[parity]);
    }
}

/* move(peer): peer's pair leaves RDMA. Its stream must have been drained first (its
 * receive buffers lie in the arena released here). */
INTERNAL PyObject *Fabric_move(Fabric *f, PyObject *rank)
{
    Peer *p = verbs_peer_of(f, rank);
    if (!p)
        return NULL;
    int k = (int)PyLong_AsLong(rank);
    if (!f->outside && !(f->outside = calloc(2 * (size_t)f->size, COLL_SLOT)))
        return PyErr_NoMemory();
    Device *d = &f->dev[p->device];
    save_blocks(f, d, k);
    for (int q = 0; q < 2; q++)
        if (p->qp[q])
            V.destroy_qp(p->qp[q]);
    p->qp[0] = p->qp[1] = NULL;
    p->device = -1;
    p->moved = 1;
    p->recv_chunks = p->send_slots = NULL;
    p->fifo_count = 0, p->credits = 0, p->nfree = 0;
    p->coll_sending[0] = p->coll_sending[1] = 0;
    if (--d->peers == 0)
        release_device(d);
    Py_RETURN_NONE;
}

/* put(peer, block): moved peer's block (header, then data) for the call its header names */
INTERNAL PyObject *Fabric_put(Fabric *f, PyObject *args)
{
    int k;
    Py_buffer block;
    if (!PyArg_ParseTuple(args, "iy*", &k, &block))
        return NULL;
    uint64_t header[2] = {0, 0};
    int fits = k >= 0 && k < f->size && f->peer[k].moved && f->outside &&
               block.len >= COLL_HEADER && block.len <= COLL_SLOT;
    if (fits) {
        memcpy(header, block.buf, sizeof header);
        int parity = (int)(header[0] & 1);
        memcpy(outside_slot(f, parity, k), block.buf, (size_t)block.len);
        f->peer[k].coll_bytes[parity] = (uint32_t)block.len;
        f->peer[k].coll_arrived[parity] = 1;
    }
    PyBuffer_Release(&block);
    if (!fits)
        return PyErr_Format(PyExc_ValueError, "put: rank %d is not moved, or the block does "
                            "not fit a slot", k);
    Py_RETURN_NONE;
}

/* own_block(parity) -> this rank's last block of that parity (header, then data), once moved */
INTERNAL PyObject *Fabric_own_block(Fabric *f, PyObject *arg)
{
    long parity = PyLong_AsLong(arg);
    if (parity == -1 && PyErr_Occurred())
        return NULL;
    if (!f->outside || (parity != 0 && parity != 1))
        return PyErr_Format(PyExc_ValueError, "own_block: parity 0 or 1, after a move");
    return PyBytes_FromStringAndSize(outside_slot(f, (int)parity, f->rank),
                                     f->own_bytes[parity]);
}

/* mesh_state() -> (calls completed, 1 while one is under way, the moved peers whose block of
 * it has not come) */
INTERNAL PyObject *Fabric_mesh_state(Fabric *f, PyObject *unused)
{
    (void)unused;
    int parity = (int)(f->coll_seq & 1);
    PyObject *missing = PyList_New(0);
    for (int k = 0; missing && k < f->size; k++) {
        if (!f->peer[k].moved || f->peer[k].coll_arrived[parity])
            continue;
        PyObject *r = PyLong_FromLong(k);
        if (!r || PyList_Append(missing, r) < 0)
            Py_CLEAR(missing);
        Py_XDECREF(r);
    }
    return missing ? Py_BuildValue("(KiN)", (unsigned long long)f->coll_seq, f->coll_stage,
                                   missing) : NULL;
}

/* down() -> [(peer, why)]: the peers whose device's port is no longer active */
INTERNAL PyObject *Fabric_down(Fabric *f, PyObject *unused)
{
    (void)unused;
    PyObject *out = PyList_New(0);
    for (int d = 0; out && d < f->ndev; d++) {
        Device *dv = &f->dev[d];
        struct ibv_port_attr port;
        memset(&port, 0, sizeof port);
        if (!dv->ctx || (V.query_port(dv->ctx, PORT, &port) == 0 &&
                         port.state == IBV_PORT_ACTIVE))
            continue;
        for (int k = 0; out && k < f->size; k++) {
            if (f->peer[k].device != d)
                continue;
            PyObject *t = Py_BuildValue("(is)", k, dv->name);
            if (!t || PyList_Append(out, t) < 0)
                Py_CLEAR(out);
            Py_XDECREF(t);
        }
    }
    return out;
}
