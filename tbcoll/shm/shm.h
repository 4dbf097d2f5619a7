/* What the shm transport's C files share: tbcoll/shm/_atomics.c (flags, waits, rings,
 * copies; the module), tbcoll/shm/lane.c (the collectives' rounds and the one-call lane) and
 * tbcoll/shm/moves.c (its send and recv). tbcoll/shm/native.py checks at import that its
 * layout is this one; the wire that shm shares with tcp and rdma (codes, the stream engine's
 * header) is tbcoll/include/wire.h. */
#ifndef TBCOLL_SHM_H
#define TBCOLL_SHM_H

#include <Python.h>
#include <stdint.h>

#include "../include/wire.h" /* HEADER_BYTES, DESCRIPTOR_BYTES, big_endian */

#ifdef __linux__
#define HAVE_CMA 1 /* cma_move below */
#else
#define HAVE_CMA 0 /* macOS: no call reads another process's memory without privileges */
#endif

#define MAX_RANKS 4096      /* of one shm segment: far past the cores of any host */
/* The layout of a rank's flag line: */
#define LINE 128            /* bytes of a flag line: one cache line on Apple's M-series
                             * cores (128-byte lines), two on x86-64 (64-byte lines), so
                             * that no two ranks' flags share a line on either */
#define ARRIVE_OFFSET 0     /* the round this rank has arrived at */
#define DONE_OFFSET 8       /* the round whose part of a split all-reduce this rank has done */
#define SIGNATURE_OFFSET 16 /* two signature words, for rounds of each parity */
#define NOGIL_BYTES (32 << 10) /* copies at least this large release the GIL */

/* the kinds of round (lane.c), X(kind, name): the first ONE_CALL_KINDS are also the one-call
 * paths' collectives, named as tbcoll.collectives names them (tbcoll.comm's LANE_ENTRIES, in
 * this order: _atomics exports their names as LANE_KINDS, which tbcoll.comm checks at
 * import) */
#define SHM_KINDS(X)                                                                        \
    X(ALL_REDUCE, "all_reduce") X(ALL_GATHER, "all_gather")                                 \
    X(REDUCE_SCATTER, "reduce_scatter") X(BROADCAST, "broadcast") X(BARRIER, "barrier")     \
    X(ALL_REDUCE_SPLIT, "all_reduce_split")
enum { SHM_KINDS(WIRE_CODE) KINDS };
#define ONE_CALL_KINDS (BROADCAST + 1)

/* Where a rank's buffer is, as the ranks exchange it before one copy (lane.c's one_copy,
 * tbcoll/shm/native.py's _one_copy_round): int64 words address, allocation, offset; a buffer
 * in none of comm.empty's allocations has NOT_IN_HEAP's (tbcoll/shm/heap.py checks its own
 * against these at import, through _atomics' NOT_IN_HEAP). */
#define NOT_IN_HEAP_ALLOCATION (-1)
#define NOT_IN_HEAP_OFFSET 0

/* Wait until the count flags at base, base+stride, ... are all >= target (acquire), for at
 * most budget seconds: 1 when they are, 0 when the budget ran out. Releases the GIL once a
 * short spin has not sufficed. */
int wait_flags(const char *base, Py_ssize_t stride, Py_ssize_t count, uint64_t target,
               double budget);

/* --- point-to-point byte rings (tbcoll/shm/pipe.py; their messages: the stream engine's)
 *
 * A ring at `at` in the segment: the producer's head counter (u64), a line further the
 * consumer's tail counter, two lines further `capacity` bytes of data; byte k of the stream
 * lives at data[k % capacity]. The producer copies bytes in, then stores head (release); the
 * consumer loads head (acquire) before copying them out, then stores tail (release); the
 * producer loads tail (acquire) before reusing space. Both counters only grow, and each lives
 * only in the segment: whoever moves a ring's bytes (pipe.py, _atomics.c's ring_send and
 * ring_recv, lane.c's send and recv) reads its own counter there.
 */
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
static inline Py_ssize_t ring_room(const char *ring, Py_ssize_t capacity)
{
    uint64_t tail = __atomic_load_n((const uint64_t *)(ring + RING_LINE), __ATOMIC_ACQUIRE);
    return capacity - (Py_ssize_t)(own_counter(ring) - tail);
}

/* Whether a ring of `capacity` bytes at `at` lies inside a segment of `len` bytes. */
static inline int ring_inside(Py_ssize_t at, Py_ssize_t capacity, Py_ssize_t len)
{
    return at >= 0 && at % 8 == 0 && capacity > 0 && at <= len - RING_DATA - capacity;
}

/* Producer: copy n bytes at `from` into the ring as room appears, waiting for room at most
 * budget seconds at a time; returns how many went in. Called with the GIL (released to wait). */
Py_ssize_t ring_put(char *ring, Py_ssize_t capacity, const char *from, Py_ssize_t n,
                    double budget);

/* Producer: write a message, header and payload: at once (one store of head, so that the
 * consumer waits for one cache line, not two) where it fits now, else as ring_put does, the
 * payload only once the whole header went in. Returns the bytes that went in. */
Py_ssize_t ring_put_message(char *ring, Py_ssize_t capacity, const char *header,
                            Py_ssize_t header_len, const char *payload, Py_ssize_t n,
                            double budget);

/* Consumer: take the next message if its header is `expected` (HEADER_BYTES, whose byte count
 * is len), its payload straight into dst. Returns RING_NONE_YET when no whole header came
 * within budget, RING_ANOTHER_FIRST when the next message is another one (nothing is
 * consumed), RING_OVERWRITTEN when the producer's counter says more bytes wait than the ring
 * holds (the segment was overwritten), else how many payload bytes arrived (len unless the
 * budget ran out while they came). (tbcoll/shm/pipe.py's Ring.OVERWRITTEN is checked against
 * _atomics' RING_OVERWRITTEN at import.) */
enum { RING_NONE_YET = -1, RING_ANOTHER_FIRST = -2, RING_OVERWRITTEN = -3 };
Py_ssize_t ring_take(char *ring, Py_ssize_t capacity, const void *expected, char *dst,
                     Py_ssize_t len, double budget);

/* Copy len bytes between `address` in process pid (a rank of the same user on this host) and
 * buffer: from there into buffer, or with write true from buffer to there. Linux's
 * cross-memory attach: one copy, by the kernel, without the GIL. The caller orders it with the
 * other rank's flags or ring counters: bytes read were stored by their owner before the
 * release store that this rank acquired, and bytes written are published by this rank's own
 * release store after the call returns. Returns 0, or the errno that stopped it: EPERM where
 * a policy (Yama's ptrace_scope, a seccomp filter) forbids it, ESRCH where pid is gone,
 * ENOSYS where the platform has no such call (macOS). */
int cma_move(long pid, uint64_t address, char *buffer, Py_ssize_t len, int write);

/* Adds the Lane type (lane.c) to the module. */
int add_lane_type(PyObject *module);

#endif
