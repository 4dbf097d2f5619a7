/* The native mesh call over the COLL queue pairs, its methods, and the _probe test hook. */
#include "fabric.h"

#include <sched.h>
#include <string.h>

#include "../../include/reduce.h" /* reduce_rows, and wire.h's codes */

/*
 * mesh(kind, src, dst, dtype, op, signature, budget) -> 0 done, -1 budget ran out (call
 * again with the same arguments to go on waiting), -2 a peer is lost (see lost()), or
 * k + 1 where rank k made another call (differing_call() says which); verbs_mesh_call's -3: the
 * arguments do not fit (ValueError).
 *
 * One native call over the COLL queue pairs: this rank's block (its call number, its
 * signature, then src) goes to every peer from its own slot of parity seq % 2; the others'
 * blocks arrive in their slots of that parity. MESH_ALL_REDUCE: dst = every block reduced
 * in rank order (every rank gets the same bits); MESH_ALL_GATHER: block k -> dst at k * n.
 * Every header is compared before anyone's data is used.
 */
INTERNAL long verbs_mesh_call(Fabric *f, int kind, const Py_buffer *src, const Py_buffer *dst,
                              int dtype, int op, unsigned long long call, double budget)
{
    long result = 0;
    Py_ssize_t n = src->len;
    int parity = (int)(f->coll_seq & 1);
    if (n > COLL_BYTES || dtype < 0 || dtype >= DTYPES || op < 0 || op >= OPS ||
        (kind == MESH_ALL_REDUCE && (dst->len != n || n % ITEMSIZE[dtype])) ||
        (kind == MESH_ALL_GATHER && dst->len != n * f->size) || f->ndev == 0) {
        PyErr_SetString(PyExc_ValueError, "mesh: bad sizes, dtype or op");
        return -3;
    }
    uint64_t header[2] = {f->coll_seq, call};
    Py_BEGIN_ALLOW_THREADS
    double start = verbs_now(), nap = 0;
    if (f->coll_stage == 0) {
        /* Our slot of this parity was last sent from in call seq-2: wait for those sends to
         * complete (they left long ago; this is a look, within the budget). */
        for (;;) {
            int busy = 0;
            for (int k = 0; k < f->size; k++)
                busy |= f->peer[k].device >= 0 && f->peer[k].coll_sending[parity] > 0 &&
                        !f->peer[k].lost[0];
            if (!busy)
                break;
            verbs_progress(f);
            if (verbs_budget_spent(f, start, budget, &nap)) {
                result = -1;
                break;
            }
        }
        if (result == 0) {
            for (int d = 0; d <= f->ndev; d++) { /* each device's, then (moved) outside */
                char *own = d < f->ndev ? (f->dev[d].coll ? f->dev[d].coll +
                            ((size_t)parity * f->size + f->rank) * COLL_SLOT : NULL)
                            : (char *)verbs_outside_slot(f, parity, f->rank);
                if (!own)
                    continue;
                memcpy(own, header, COLL_HEADER);
                memcpy(own + COLL_HEADER, src->buf, (size_t)n);
            }
            f->own_bytes[parity] = (uint32_t)(COLL_HEADER + n);
            for (int k = 0; k < f->size; k++) {
                Peer *p = &f->peer[k];
                if (p->device < 0 || p->lost[0])
                    continue;
                Device *d = &f->dev[p->device];
                char *own = d->coll + ((size_t)parity * f->size + f->rank) * COLL_SLOT;
                struct ibv_sge sge = {.addr = (uintptr_t)own,
                                      .length = (uint32_t)(COLL_HEADER + n),
                                      .lkey = d->mr->lkey};
                struct ibv_send_wr wr = {.wr_id = WR_ID(k, WR_COLL_SEND, parity),
                                         .sg_list = &sge, .num_sge = 1,
                                         .opcode = IBV_WR_SEND,
                                         .send_flags = IBV_SEND_SIGNALED}, *bad;
                if (ibv_post_send(p->qp[QP_COLL], &wr, &bad))
                    verbs_lose(p, "posting a send failed");
                else
                    p->coll_sending[parity]++;
            }
            f->coll_stage = 1;
        }
    }
    /* wait for every peer's block of this call: its receive completion proves it whole (a
     * moved peer's comes through put(), from Python: where only those are missing, the
     * budget goes back to Python at once) */
    while (result == 0) {
        int missing = 0, lost = 0, moved_missing = 0;
        for (int k = 0; k < f->size; k++) {
            Peer *p = &f->peer[k];
            moved_missing |= p->moved && !p->coll_arrived[parity];
            if (p->device < 0)
                continue;
            lost |= p->lost[0] != 0;
            missing |= !p->coll_arrived[parity];
        }
        if (lost) {
            result = -2;
            break;
        }
        if (!missing && moved_missing) {
            result = -1;
            break;
        }
        if (!missing)
            break;
        verbs_progress(f);
        if (verbs_budget_spent(f, start, budget, &nap)) {
            result = -1;
            break;
        }
    }
    Py_END_ALLOW_THREADS
    if (result != 0)
        return result;
    /* every block is in: compare the calls before anyone's data is used */
    const char *rows[MAX_PEERS];
    for (int k = 0; k < f->size; k++) {
        Peer *p = &f->peer[k];
        if (p->device < 0 && !p->moved) { /* this rank's own block */
            int d0 = 0;
            while (d0 < f->ndev && f->dev[d0].peers == 0)
                d0++;
            rows[k] = d0 < f->ndev ? f->dev[d0].coll + ((size_t)parity * f->size + k) * COLL_SLOT
                                   : verbs_outside_slot(f, parity, k);
            continue;
        }
        const char *slot = p->moved ? verbs_outside_slot(f, parity, k)
                           : f->dev[p->device].coll + ((size_t)parity * f->size + k) * COLL_SLOT;
        uint64_t theirs[2];
        memcpy(theirs, slot, sizeof theirs);
        if (result == 0 && (p->coll_bytes[parity] != COLL_HEADER + n ||
                            theirs[0] != header[0] || theirs[1] != header[1])) {
            result = k + 1;
            f->differs[0] = theirs[0], f->differs[1] = theirs[1];
            f->differs_bytes = (long)p->coll_bytes[parity] - COLL_HEADER;
        }
        rows[k] = slot;
    }
    if (result == 0) {
        if (kind == MESH_ALL_REDUCE) {
            const char *data[MAX_PEERS];
            for (int k = 0; k < f->size; k++)
                data[k] = rows[k] + COLL_HEADER;
            reduce_rows(data, f->size, (char *)dst->buf, n / ITEMSIZE[dtype], dtype, op);
        } else {
            for (int k = 0; k < f->size; k++)
                memcpy((char *)dst->buf + (size_t)k * n, rows[k] + COLL_HEADER, (size_t)n);
        }
    }
    /* Done with this call's slots, also when the calls differ (every rank then raises; the
     * pairs stay in step): repost each receive of this parity for call seq+2. */
    {
        for (int k = 0; k < f->size; k++) {
            Peer *p = &f->peer[k];
            if (p->device < 0 && !p->moved)
                continue;
            p->coll_arrived[parity] = 0;
            if (!p->moved)
                verbs_post_coll_recv(f, k, parity);
        }
        f->coll_seq++;
        f->coll_stage = 0;
    }
    return result;
}

/* mesh(): verbs_mesh_call's result, from Python (tbcoll.transports.rdma.transport) */
INTERNAL PyObject *Fabric_mesh(Fabric *f, PyObject *args)
{
    int kind, dtype, op;
    unsigned long long call;
    double budget;
    Py_buffer src, dst;
    if (!PyArg_ParseTuple(args, "iy*w*iiKd", &kind, &src, &dst, &dtype, &op, &call, &budget))
        return NULL;
    long result = verbs_mesh_call(f, kind, &src, &dst, dtype, op, call, budget);
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    return result == -3 ? NULL : PyLong_FromLong(result);
}

/* differing_call() -> (call number, signature, bytes) of the block whose call differed */
INTERNAL PyObject *Fabric_differing_call(Fabric *f, PyObject *unused)
{
    return Py_BuildValue("(KKl)", (unsigned long long)f->differs[0],
                         (unsigned long long)f->differs[1], f->differs_bytes);
}

/*
 * _probe(iters, flags) -> (seconds, empty polls, seconds waiting for send completions)
 * A test hook for benchmarks/rdma_probe.py, in the manner of perftest's ib_send_lat: 8 B
 * SEND/RECV on the COLL queue pair to the one peer of a 2-rank Fabric, polling the CQ
 * itself, GIL held (nothing else runs). Call it between mesh calls only (no mesh call under
 * way): it consumes and reposts the COLL receives in the order they were posted, an even
 * number per rank, so the parities are as they were afterwards. flags: PROBE_EXCHANGE (both
 * send, then wait: the mesh's pattern; else ping-pong, rank 0 first), PROBE_WAIT_SEND (wait
 * for each send's completion before going on), PROBE_YIELD (sched_yield after an empty poll),
 * PROBE_MESH (verbs_mesh_call in a C loop instead: the mesh without Python's call around it).
 */
enum { PROBE_EXCHANGE = 1, PROBE_WAIT_SEND = 2, PROBE_YIELD = 4, PROBE_MESH = 8 };
#define PROBE_SEND 2 /* its sends' index: apart from the mesh's parities */

/* One look at the CQ for _probe: 1 where it found a completion. Its own sends and the peer's
 * messages are counted (the receive reposted); anything else, such as a mesh send's
 * completion not yet taken when the mesh call returned, goes where verbs_progress() puts it: the
 * mesh's count of its sends stays true, and _probe's (a send window, and no send of its own
 * left in flight) counts only its own. */
static int probe_poll(Fabric *f, Device *d, int k, int *sending, int *arrived)
{
    struct ibv_wc wc;
    if (ibv_poll_cq(d->cq, 1, &wc) <= 0)
        return 0;
    int kind = (int)((wc.wr_id >> 24) & 0xff), index = (int)(wc.wr_id & 0xffffff);
    if (wc.status == IBV_WC_SUCCESS && kind == WR_COLL_SEND && index == PROBE_SEND) {
        (*sending)--;
    } else if (wc.status == IBV_WC_SUCCESS && kind == WR_COLL_RECV) {
        (*arrived)++;
        verbs_post_coll_recv(f, k, index);
    } else {
        verbs_completed(f, &wc);
    }
    return 1;
}

INTERNAL PyObject *Fabric_probe(Fabric *f, PyObject *args)
{
    int iters, flags;
    if (!PyArg_ParseTuple(args, "ii", &iters, &flags))
        return NULL;
    int k = 1 - f->rank;
    if (f->size != 2 || f->coll_stage || (iters % 2 && !(flags & PROBE_MESH)))
        return PyErr_Format(PyExc_ValueError, "_probe: 2 ranks, even iters, between calls");
    Peer *p = &f->peer[k];
    Device *d = &f->dev[p->device];
    char *own = d->coll + (size_t)f->rank * COLL_SLOT;
    long empty = 0;
    double send_wait = 0, start = verbs_now();
    int sending = 0, arrived = 0;
    if (flags & PROBE_MESH) { /* verbs_mesh_call itself in a loop: 8 B of float32, summed */
        float x[2] = {1, 2}, y[2];
        Py_buffer src = {.buf = x, .len = sizeof x}, dst = {.buf = y, .len = sizeof y};
        for (int i = 0; i < iters && !p->lost[0]; i++) {
            long result;
            while ((result = verbs_mesh_call(f, MESH_ALL_REDUCE, &src, &dst, DTYPE_FLOAT32, OP_SUM,
                                       1234, 1.0)) == -1)
                if (verbs_now() - start > 30)
                    verbs_lose(p, "_probe: the peer went silent");
            if (result != 0 && !p->lost[0])
                verbs_lose(p, "_probe: a mesh call failed");
        }
        iters = 0;
    }
    for (int i = 0; i < iters && !p->lost[0]; i++) {
        int first = (flags & PROBE_EXCHANGE) || f->rank == 0;
        for (int step = 0; step < 2; step++) {
            if (step == (first ? 0 : 1)) {
                while (sending >= 2 && !p->lost[0]) { /* the queue pair holds 3 sends */
                    if (!probe_poll(f, d, k, &sending, &arrived)) {
                        empty++;
                        if (flags & PROBE_YIELD) sched_yield();
                    }
                }
                struct ibv_sge sge = {.addr = (uintptr_t)own, .length = COLL_HEADER + 8,
                                      .lkey = d->mr->lkey};
                struct ibv_send_wr wr = {.wr_id = WR_ID(k, WR_COLL_SEND, PROBE_SEND),
                                         .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
                                         .send_flags = IBV_SEND_SIGNALED}, *bad;
                if (ibv_post_send(p->qp[QP_COLL], &wr, &bad)) {
                    verbs_lose(p, "posting a send failed");
                    break;
                }
                sending++;
                double t0 = verbs_now();
                while ((flags & PROBE_WAIT_SEND) && sending > 0 && !p->lost[0]) {
                    if (!probe_poll(f, d, k, &sending, &arrived)) {
                        empty++;
                        if (flags & PROBE_YIELD) sched_yield();
                    }
                }
                send_wait += verbs_now() - t0;
            } else {
                while (arrived <= i && !p->lost[0]) {
                    if (!probe_poll(f, d, k, &sending, &arrived)) {
                        empty++;
                        if (flags & PROBE_YIELD) sched_yield();
                        if (verbs_now() - start > 30) verbs_lose(p, "_probe: the peer went silent");
                    }
                }
            }
        }
    }
    while (sending > 0 && !p->lost[0]) /* leave no send of ours in flight */
        if (!probe_poll(f, d, k, &sending, &arrived) && verbs_now() - start > 30)
            verbs_lose(p, "_probe: a send never completed");
    double took = verbs_now() - start;
    if (p->lost[0])
        return PyErr_Format(PyExc_ConnectionError, "%s", p->lost);
    return Py_BuildValue("(dld)", took, empty, send_wait);
}
