/* The shm lane's state, and what each of its paths shares (lane_base.c): the Lane struct,
 * which lane.c (the Python type, the collectives' one-call paths), one_copy.c (large
 * all_gather and broadcast, each block copied once) and moves.c (send and recv over the
 * stream engine's rings) work on; a round run to its end, resumed in Python; a CommError
 * named; a dtype's code.
 * May include: Python.h, tbcoll/include/gate.h (gate_now), callbacks.h, lane.h, the pure layer
 * (shm.h, rounds.h).
 */
#ifndef TBCOLL_LANE_BASE_H
#define TBCOLL_LANE_BASE_H

#include <Python.h>
#include <stdint.h>

#include "../../include/callbacks.h" /* the formats of its calls into Python */
#include "../../include/gate.h"    /* gate_now */
#include "../../include/lane.h"    /* the lane interface: its kinds, the struct it offers */
#include "rounds.h" /* Round */
#include "shm.h"    /* INTERNAL, the kinds; wire.h's DTYPES, OPS */

/* DTYPES and OPS (the codes' counts): tbcoll/include/wire.h; ONE_CALL_KINDS: shm.h */
#define BYTES_DTYPE DTYPE_UINT8 /* what a round that only copies calls its data */
_Static_assert(ONE_CALL_KINDS == LANE_KIND_COUNT && (int)ALL_REDUCE == LANE_ALL_REDUCE &&
               (int)ALL_GATHER == LANE_ALL_GATHER &&
               (int)REDUCE_SCATTER == LANE_REDUCE_SCATTER && (int)BROADCAST == LANE_BROADCAST,
               "shm's lane kinds are the lane interface's (tbcoll/include/lane.h)");

typedef struct {
    PyObject_HEAD
    /* the rounds */
    PyObject *segment;         /* the mapped segment (a writable buffer) */
    Py_ssize_t flags, size, rank, sets[2], slot_bytes;
    Py_ssize_t pids_at;        /* where the ranks' pids (int64) are in the segment */
    Py_ssize_t single_pass;    /* the largest all_reduce in one round (calls()) */
    double budget;             /* seconds a wait runs before resume looks at the peers */
    unsigned long long rounds; /* rounds begun and finished (round seq uses set seq % 2) */
    PyObject *resume;          /* resume(stage, seq, signature): wait in Python, or raise */
    /* what it offers tbcoll.core._gate.LaneCall (tbcoll/include/lane.h: lane_capsule()), which
     * runs the whole call around its work; largest: each kind's in a round (calls(),
     * limit()), past which beyond copies blocks once */
    tbcoll_lane_v1 lane;
    Py_ssize_t largest[LANE_KIND_COUNT];
    /* takes(): past one round (largest), the segment's rounds take x of kind up to
     * up_to[kind] bytes (lane_rounds); -1: every size (calls()'s), less where the Python path
     * does better (comm.empty's buffers: tbcoll/transports/shm/native.py) */
    Py_ssize_t up_to[LANE_KIND_COUNT];
    int calls_given;           /* calls() was called */
    /* calls(): how they sign a call */
    /* attach(): a larger all_gather or broadcast copies each block once (one_copy) */
    int attached, everyone_dtype, everyone_op; /* on; int64's code, min's (a verdict round) */
    PyObject *refused;         /* refused(): a copy was refused, CMA is off from now on */
    uint64_t all_reduce_calls[DTYPES][OPS], all_gather_calls[DTYPES],
        reduce_scatter_calls[DTYPES][OPS]; /* signatures less the byte count */
    PyObject *broadcast_call;  /* broadcast_call(dtype, root) -> signature less bytes */
    uint64_t *broadcast_calls; /* [dtype * size + root], 0 where not yet asked */
    /* streams(): the stream engine's rings, its state and its Python paths (tbcoll/transports/
     * shm.py's ShmStream.lend_lane); send NULL until then */
    PyObject *send, *recv;     /* the engine's send(buf, peer, tag), recv(buf, peer, tag) */
    PyObject *finish_send, *finish_recv; /* (buf, peer, header, bytes moved in C) */
    PyObject *finish_pulled_send;  /* (buf, peer, pull): an announced send, not yet answered */
    PyObject *finish_announced;    /* (buf, peer, header, descriptor): a pulled receive */
    Py_buffer words;           /* the engine's words (moves.c), held; obj NULL until then */
    PyObject *publish;         /* publish(): the engine's publish_words, where they are stale */
    uint32_t context_word;     /* the endpoint's context, as its messages' headers carry it */
    Py_ssize_t *stream_at;     /* [2k]: the ring to rank k, [2k + 1]: the ring from it */
    Py_ssize_t stream_capacity;    /* each ring's data bytes */
    Py_ssize_t pull_bytes;     /* payloads this large are pulled (to a peer that pulls) */
    double send_budget, recv_budget; /* seconds a move waits in C before Python takes over */
    PyObject *look;            /* look(peer): the engine's; raises where peer has ended */
    double look_every;         /* seconds between a send's looks at its receiver, per rank */
    double *next_look;         /* [k]: when a send to rank k looks next (gate_now's clock) */
} Lane;

#define PREFAULT_BYTES (4 << 20) /* results this large have their pages touched first */

/* A pid of rank k's, from the segment at base. Each rank stores its own there (release,
 * tbcoll/transports/shm/native.py's publish_pid) before the communicator's first round or message;
 * a pull reads it only after an acquire of that rank's flag or ring head, stored later, so the
 * pid happens-before this load and relaxed suffices (on ARM64 too). */
static inline long pid_of(const Lane *self, const char *base, Py_ssize_t k)
{
    return (long)__atomic_load_n((const int64_t *)(base + self->pids_at) + k, __ATOMIC_RELAXED);
}

/* lane_base.c's: */
/* Run round self->rounds + 1 to its end over the segment at base (run_round), resuming in
 * Python where a wait runs out of budget: ROUND_DONE, or -1 with an exception. */
INTERNAL int lane_round(Lane *self, Round *r, char *base, uint64_t signature);
/* A call of any size (r: the whole of it, src and dst of the sizes a round of its kind takes)
 * cut into the rounds the segment's slots hold, the result's pages touched first where it is
 * large; the only place the cut is made (tbcoll/transports/shm/native.py and one_copy.c call it).
 * all_reduce up to single_pass bytes is one round, larger ones split rounds (each rank
 * reducing its part of a slot); all_gather and broadcast a slot of the block a round (a
 * broadcast in place in dst); reduce_scatter a slot of pieces (one per rank) a round. 0, or
 * -1 with an exception. */
INTERNAL int lane_rounds(Lane *self, Round *r, char *base, uint64_t signature);

#endif
