/* Waiting for flags in shared memory: a count flag of each of `count` ranks, stored by its
 * owner with release and waited for here with acquire (flags.c has the argument). Used by
 * the rings (rings.c) and the rounds (rounds.c), and by the module's wait_all.
 * Pure C: may include shm.h only. */
#ifndef TBCOLL_SHM_FLAGS_H
#define TBCOLL_SHM_FLAGS_H

#include <stddef.h>
#include <stdint.h>

#include "shm.h" /* INTERNAL */

/* Wait until the count flags at base, base+stride, ... are all >= target (acquire), for at
 * most budget seconds: 1 when they are, 0 when the budget ran out. Called with the GIL, which
 * it releases once a short spin has not sufficed. */
INTERNAL int wait_flags(const char *base, ptrdiff_t stride, ptrdiff_t count, uint64_t target,
                        double budget);

/* How many seconds a wait spins before it yields (the module's set_spin; 0 or more). */
INTERNAL void set_spin_seconds(double seconds);

#endif
