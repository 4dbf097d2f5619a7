/* What the shm transport's two C files share: tbcoll/shm/_atomics.c (flags, waits, rings,
 * copies; the module) and tbcoll/shm/lane.c (the collectives' rounds and the one-call lane).
 * tbcoll/shm/native.py checks at import that its layout is this one. */
#ifndef TBCOLL_SHM_H
#define TBCOLL_SHM_H

#include <Python.h>
#include <stdint.h>

#define MAX_RANKS 4096      /* of one shm segment: far past the cores of any host */
/* The layout of a rank's flag line: */
#define LINE 128            /* bytes of a flag line (two cache lines on Apple's cores) */
#define ARRIVE_OFFSET 0     /* the round this rank has arrived at */
#define DONE_OFFSET 8       /* the round whose part of a split all-reduce this rank has done */
#define SIGNATURE_OFFSET 16 /* two signature words, for rounds of each parity */
#define NOGIL_BYTES (32 << 10) /* copies at least this large release the GIL */

/* the kinds of round (lane.c); the first four are also the one-call paths' collectives */
enum { ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, BROADCAST, BARRIER, ALL_REDUCE_SPLIT, KINDS };

/* Wait until the count flags at base, base+stride, ... are all >= target (acquire), for at
 * most budget seconds: 1 when they are, 0 when the budget ran out. Releases the GIL once a
 * short spin has not sufficed. */
int wait_flags(const char *base, Py_ssize_t stride, Py_ssize_t count, uint64_t target,
               double budget);

/* Adds the Lane type (lane.c) to the module. */
int add_lane_type(PyObject *module);

#endif
