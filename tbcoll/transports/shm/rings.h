/* --- point-to-point byte rings (tbcoll/transports/shm/pipe.py; their messages: the stream
 * engine's)
 *
 * A ring at `at` in the segment: the producer's head counter (u64), a line further the
 * consumer's tail counter, two lines further `capacity` bytes of data; byte k of the stream
 * lives at data[k % capacity]. The producer copies bytes in, then stores head (release); the
 * consumer loads head (acquire) before copying them out, then stores tail (release); the
 * producer loads tail (acquire) before reusing space. Both counters only grow, and each lives
 * only in the segment: whoever moves a ring's bytes (rings.c, for pipe.py's Ring and moves.c's
 * send and recv) reads its own counter there. The protocol is written here and in rings.c only.
 *
 * Pure C: may include shm.h (and tbcoll/include/wire.h through it) only.
 */
#ifndef TBCOLL_SHM_RINGS_H
#define TBCOLL_SHM_RINGS_H

#include <stddef.h>
#include <stdint.h>

#include "shm.h" /* INTERNAL; wire.h's HEADER_BYTES */

#define RING_LINE 128
#define RING_DATA (2 * RING_LINE) /* the control lines before the data */

/* This side's own counter (the producer's head, the consumer's tail). Only this side stores
 * it, and a communicator's calls never overlap (its call gate, a lock, orders one thread's
 * calls before the next's), so a relaxed load returns the last value stored. */
static inline uint64_t own_counter(const char *word)
{
    return __atomic_load_n((const uint64_t *)word, __ATOMIC_RELAXED);
}

/* The bytes free in the ring now, as its producer sees them: acquire, the consumer has
 * copied out what it freed before its tail says so. */
static inline ptrdiff_t ring_room(const char *ring, ptrdiff_t capacity)
{
    uint64_t tail = __atomic_load_n((const uint64_t *)(ring + RING_LINE), __ATOMIC_ACQUIRE);
    return capacity - (ptrdiff_t)(own_counter(ring) - tail);
}

/* Whether a ring of `capacity` bytes at `at` lies inside a segment of `len` bytes. */
static inline int ring_inside(ptrdiff_t at, ptrdiff_t capacity, ptrdiff_t len)
{
    return at >= 0 && at % 8 == 0 && capacity > 0 && at <= len - RING_DATA - capacity;
}

/* Producer: copy as many of n bytes at `from` as there is room for now, without waiting;
 * returns how many went in (the stream engine's writes, tbcoll/transports/shm/pipe.py). */
INTERNAL ptrdiff_t ring_write(char *ring, ptrdiff_t capacity, const char *from, ptrdiff_t n);

/* Consumer: copy up to n bytes of what has arrived into `to`, without waiting; returns how
 * many, or RING_OVERWRITTEN (below) (the stream engine's reads, tbcoll/transports/shm/pipe.py). */
INTERNAL ptrdiff_t ring_read(char *ring, ptrdiff_t capacity, char *to, ptrdiff_t n);

/* The bytes in the ring now (written, not yet read), as either side sees them: acquire
 * loads, so that a side that then copies sees what the counters say (a poll's test). */
static inline uint64_t ring_held(const char *ring)
{
    return __atomic_load_n((const uint64_t *)ring, __ATOMIC_ACQUIRE) -
           __atomic_load_n((const uint64_t *)(ring + RING_LINE), __ATOMIC_ACQUIRE);
}

/* Producer: copy n bytes at `from` into the ring as room appears, waiting for room at most
 * budget seconds at a time; returns how many went in. Called with the GIL (released to wait). */
INTERNAL ptrdiff_t ring_put(char *ring, ptrdiff_t capacity, const char *from, ptrdiff_t n,
                            double budget);

/* Producer: write a message, header and payload: at once (one store of head, so that the
 * consumer waits for one cache line, not two) where it fits now, else as ring_put does, the
 * payload only once the whole header went in. Returns the bytes that went in. */
INTERNAL ptrdiff_t ring_put_message(char *ring, ptrdiff_t capacity, const char *header,
                                    ptrdiff_t header_len, const char *payload, ptrdiff_t n,
                                    double budget);

/* Consumer: take the next message if its header is `expected` (HEADER_BYTES, whose byte count
 * is len), its payload straight into dst. Returns RING_NONE_YET when no whole header came
 * within budget, RING_ANOTHER_FIRST when the next message is another one (nothing is
 * consumed), RING_OVERWRITTEN when the producer's counter says more bytes wait than the ring
 * holds (the segment was overwritten), else how many payload bytes arrived (len unless the
 * budget ran out while they came). (tbcoll/transports/shm/pipe.py's Ring.OVERWRITTEN is checked
 * against _atomics' RING_OVERWRITTEN at import.) Called with the GIL (released to wait, and to copy
 * NOGIL_BYTES or more). */
enum { RING_NONE_YET = -1, RING_ANOTHER_FIRST = -2, RING_OVERWRITTEN = -3 };
INTERNAL ptrdiff_t ring_take(char *ring, ptrdiff_t capacity, const void *expected, char *dst,
                             ptrdiff_t len, double budget);

#endif
