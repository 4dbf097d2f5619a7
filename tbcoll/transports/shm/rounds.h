/* The shm transport's collective rounds (rounds.c): one protocol, written once, that every
 * shm collective runs over a communicator's segment (flags, slots, signatures), whatever
 * calls it: the Lane's round() and one-call paths (lane.c, lane_base.c), its one-copy
 * rounds (one_copy.c), and tests/harness/tsan/shm_race.c.
 * Pure C: may include shm.h (and tbcoll/include/wire.h through it) only. */
#ifndef TBCOLL_SHM_ROUNDS_H
#define TBCOLL_SHM_ROUNDS_H

#include <stddef.h>
#include <stdint.h>

#include "shm.h" /* INTERNAL, the kinds */

/* One round's buffers and parameters (see run_round). */
typedef struct {
    char *base;                  /* the segment */
    ptrdiff_t flags;             /* where the flag lines start in it */
    ptrdiff_t size, rank;
    ptrdiff_t slots, slot_bytes; /* the round's data set: size slots (+ a result area) */
    const char *src;
    ptrdiff_t src_len, src_stride;
    char *dst;
    ptrdiff_t dst_len, dst_stride;
    int kind, dtype, op, root;
} Round;

/* What run_round returns: 0 when the round is done; else the stage to resume it at, once
 * its caller has waited in Python (which notices dead ranks and the deadline) or raised:
 * ROUND_WAIT_FREE, ROUND_WAIT_ARRIVED and ROUND_WAIT_DONE, whose wait ran out of its budget,
 * or ROUND_CALLS_DIFFER, where a rank's signature differs (resumed at ROUND_WAIT_ARRIVED if
 * they match after all); ROUND_MISFIT where the buffers do not fit the segment. The stages'
 * numbers are what the Lane's resume(stage, seq, signature) gets (tbcoll/transports/shm/native.py,
 * by the names _atomics exports). */
enum {
    ROUND_MISFIT = -1,
    ROUND_DONE = 0,
    ROUND_WAIT_FREE = 1,    /* the start: the wait for the data set to be free */
    ROUND_WAIT_ARRIVED = 2, /* the wait for every rank's ARRIVE flag */
    ROUND_CALLS_DIFFER = 3,
    ROUND_WAIT_DONE = 4,    /* ALL_REDUCE_SPLIT's wait for every rank's DONE flag */
};

/*
 * run_round(round, seq, stage, budget, signature) -> 0 done, a stage to resume, or ROUND_MISFIT
 *
 * One round of the shm transport's collectives: wait until every rank's ARRIVE flag is
 * >= seq-1 (the data set is free), copy this rank's data into its slot, put the call's
 * signature in its flag line, store ARRIVE = seq (release), wait for the flags it needs to
 * reach seq (acquire), compare the signatures, then produce its result:
 *   ALL_REDUCE      src -> slot; dst = all slots reduced with op, in rank order;
 *   ALL_GATHER      src -> slot; slot k -> dst + k * dst_stride (dst.len fits them);
 *   REDUCE_SCATTER  size pieces of dst.len bytes at src + k * src_stride -> slot, one after
 *                   the other, but its own piece, which only this rank reads and reads from
 *                   src (unless dst overlaps it); dst = piece `rank` of every slot reduced, in
 *                   rank order;
 *   BROADCAST       the root: src -> slot (and -> dst if dst is another buffer); the others
 *                   copy the root's slot into dst. Every rank waits for every flag, as in
 *                   the other kinds, to compare every rank's signature: a rank that names
 *                   another root fails the call on every rank (the non-roots arrive before
 *                   they wait, so this costs the root little);
 *   BARRIER         flags only;
 *   ALL_REDUCE_SPLIT  a chunk too large for one rank to reduce alone: rank r owns the
 *                   elements [r*n/size, (r+1)*n/size) of its n; src but its own part ->
 *                   slot; after the wait, the owned part of every slot (its own from src)
 *                   reduced in rank order -> the result area behind the slots, then DONE =
 *                   seq (release: the part is in place before the flag); once every DONE
 *                   flag is seq (acquire), the result area -> dst. The result area of round
 *                   seq is next written in round seq+2, after a wait for every ARRIVE flag
 *                   >= seq+2, stored only by ranks that finished round seq.
 * stage is where to start or resume (the enum above); each rank's signature, a tbcoll.core.calls
 * word, is compared with every other's before anyone's data is used. Called with the GIL;
 * large copies and reductions run without it, and waits release it.
 */
INTERNAL int run_round(const Round *r, uint64_t seq, int stage, double budget,
                       uint64_t signature);

#endif
