/*
 * What each of the shm lane's paths shares (lane_base.h): a round run to its end and resumed
 * in Python (lane_round, over rounds.c's run_round), a call of any size cut into rounds
 * (lane_rounds).
 *
 * Includes: Python.h, lane_base.h (and the pure layer and tbcoll/include's through it).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "lane_base.h"

/* Run round self->rounds + 1 to its end over the segment at base: where a wait runs out of
 * its budget (or the calls differ), resume(stage, seq, signature) waits in Python (which
 * notices dead ranks and the deadline) or raises, and the round goes on. */
int lane_round(Lane *self, Round *r, char *base, uint64_t signature)
{
    uint64_t seq = self->rounds + 1;
    r->base = base;
    r->flags = self->flags;
    r->size = self->size;
    r->rank = self->rank;
    r->slots = self->sets[seq & 1];
    r->slot_bytes = self->slot_bytes;
    int stage = ROUND_WAIT_FREE;
    while ((stage = run_round(r, seq, stage, self->budget, signature)) > 0) {
        self->rounds = seq; /* begun: this round's flags are stored */
        PyObject *done = PyObject_CallFunction(self->resume, CALLBACK_FORMAT(RESUME), stage,
                                               (unsigned long long)seq,
                                               (unsigned long long)signature);
        if (done == NULL)
            return -1;
        Py_DECREF(done);
        if (stage == ROUND_CALLS_DIFFER) /* resume returned: every signature matches after all */
            stage = ROUND_WAIT_ARRIVED;
    }
    if (stage == ROUND_MISFIT) {
        PyErr_SetString(PyExc_ValueError, "buffers do not fit the segment");
        return -1;
    }
    self->rounds = seq; /* ROUND_DONE */
    return ROUND_DONE;
}

/* Touch every page of a large result before the rounds write it (a write of the byte each
 * page holds: the contents stay). A rank that takes page faults inside the rounds, a slot at
 * a time, holds up every rank at each round: a fresh 300 MB result took 1.5-2.7 s that way
 * against 0.1-0.2 s touched first, in parallel on every rank (measured in a VM where
 * first-touch faults are slow). 4096: the smallest page (Apple Silicon's are 16 KiB). */
static void prefault(char *dst, Py_ssize_t len)
{
    if (len < PREFAULT_BYTES)
        return;
    for (Py_ssize_t at = 0; at < len; at += 4096)
        ((volatile char *)dst)[at] = ((volatile char *)dst)[at];
}

int lane_rounds(Lane *self, Round *r, char *base, uint64_t signature)
{
    Py_ssize_t slot = self->slot_bytes, item = ITEMSIZE[r->dtype], step, n, lo;
    if (r->kind == ALL_REDUCE && r->dst_len <= self->single_pass)
        return lane_round(self, r, base, signature);
    prefault(r->dst, r->dst_len);
    switch (r->kind) {
    case ALL_REDUCE: /* split rounds, each rank reducing its part of a slot */
        step = slot / item * item;
        n = r->dst_len;
        break;
    case REDUCE_SCATTER: /* a piece of every rank's block a round */
        step = slot / self->size / item * item;
        n = r->dst_len;
        break;
    default: /* ALL_GATHER, BROADCAST: a slot of the block a round */
        step = slot;
        n = r->kind == ALL_GATHER ? r->src_len : r->dst_len;
    }
    for (lo = 0; lo < n; lo += step) {
        Py_ssize_t piece = n - lo < step ? n - lo : step;
        Round part = *r;
        switch (r->kind) {
        case ALL_REDUCE:
            part = (Round){.src = r->src + lo, .src_len = piece, .dst = r->dst + lo,
                           .dst_len = piece, .kind = ALL_REDUCE_SPLIT, .dtype = r->dtype,
                           .op = r->op};
            break;
        case REDUCE_SCATTER:
            part.src = r->src + lo;
            part.src_len = r->src_len - lo;
            part.dst = r->dst + lo;
            part.dst_len = piece;
            break;
        case ALL_GATHER:
            part.src = r->src + lo;
            part.src_len = piece;
            part.dst = r->dst + lo;
            part.dst_len = r->dst_len - lo;
            break;
        default: /* BROADCAST, in place */
            part.src = part.dst = r->dst + lo;
            part.src_len = part.dst_len = piece;
        }
        if (lane_round(self, &part, base, lo == 0 ? signature : 0) < 0)
            return -1;
    }
    return 0;
}
