/* The shm transport's segment layout and kinds of round: what every C file of
 * tbcoll.transports.shm._atomics shares, and what tbcoll/transports/shm/native.py checks at import
 * (through the module's constants); the wire that shm shares with tcp and rdma (codes, the stream
 * engine's header) is tbcoll/include/wire.h.
 *
 * The extension's files, by layer (each includes only the layers below it; none includes a
 * .c file, and no function calls up a layer):
 *   pure C, no Python.h   shm.h (this), gil.h; flags.c (waits), rings.c (the byte rings),
 *                         cma.c (cross-process copies), rounds.c (the collectives' rounds)
 *   the Lane's state      lane_base.h, lane_base.c (a round resumed in Python, errors, dtypes)
 *   the Lane's work       one_copy.c (large all_gather/broadcast, each block copied once),
 *                         moves.c (send and recv over the stream engine's rings)
 *   the Lane's type       lane.c (the Python type: its set-up and the one-call collectives)
 *   the module            _atomics.c (its Python functions and init)
 * Pure C: may include the C library and tbcoll/include/wire.h only. */
#ifndef TBCOLL_SHM_H
#define TBCOLL_SHM_H

#include <stdint.h>

#include "../../include/wire.h" /* WIRE_CODE, HEADER_BYTES, DESCRIPTOR_BYTES, big_endian */

/* Functions that one file of the extension gives another: hidden, so that they are called
 * directly (not through the PLT, as exported symbols of a shared object are) and no other
 * module sees them. */
#define INTERNAL __attribute__((visibility("hidden")))

#define MAX_RANKS 4096      /* of one shm segment: far past the cores of any host */
/* The layout of a rank's flag line: */
#define LINE 128            /* bytes of a flag line: one cache line on Apple's M-series
                             * cores (128-byte lines), two on x86-64 (64-byte lines), so
                             * that no two ranks' flags share a line on either */
#define ARRIVE_OFFSET 0     /* the round this rank has arrived at */
#define DONE_OFFSET 8       /* the round whose part of a split all-reduce this rank has done */
#define SIGNATURE_OFFSET 16 /* two signature words, for rounds of each parity */
#define NOGIL_BYTES (32 << 10) /* copies at least this large release the GIL */

/* the kinds of round (rounds.c), X(kind, name): the first ONE_CALL_KINDS are also the
 * one-call paths' collectives, in tbcoll.core.names.LANE_KINDS' order (_atomics exports their
 * names as LANE_KINDS, which tbcoll/transports/shm/flags.py checks at import) */
#define SHM_KINDS(X)                                                                        \
    X(ALL_REDUCE, "all_reduce") X(ALL_GATHER, "all_gather")                                 \
    X(REDUCE_SCATTER, "reduce_scatter") X(BROADCAST, "broadcast") X(BARRIER, "barrier")     \
    X(ALL_REDUCE_SPLIT, "all_reduce_split")
enum { SHM_KINDS(WIRE_CODE) KINDS };
#define ONE_CALL_KINDS (BROADCAST + 1)

/* Where a rank's buffer is, as the ranks exchange it before one copy (one_copy.c,
 * tbcoll/transports/shm/native.py's _one_copy_round): int64 words address, allocation, offset; a
 * buffer in none of comm.empty's allocations has NOT_IN_HEAP's (tbcoll/transports/shm/heap.py
 * checks its own against these at import, through _atomics' NOT_IN_HEAP). */
#define NOT_IN_HEAP_ALLOCATION (-1)
#define NOT_IN_HEAP_OFFSET 0

#endif
