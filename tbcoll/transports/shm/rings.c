/*
 * The byte rings of tbcoll/transports/shm/pipe.py and of the stream engine's shm messages: bytes in
 * and out as room and data allow, a message in, the next message out (rings.h has the layout and
 * the order of its counters).
 *
 * Pure C: includes rings.h, flags.h, gil.h and the C library.
 */
#include <stdint.h>
#include <string.h>

#include "flags.h"
#include "gil.h"
#include "rings.h"

static void ring_copy_in(char *data, ptrdiff_t capacity, uint64_t at, const char *from,
                         ptrdiff_t n)
{
    ptrdiff_t start = (ptrdiff_t)(at % (uint64_t)capacity), first = capacity - start;
    if (first > n)
        first = n;
    memcpy(data + start, from, (size_t)first);
    memcpy(data, from + first, (size_t)(n - first));
}

static void ring_copy_out(const char *data, ptrdiff_t capacity, uint64_t at, char *to,
                          ptrdiff_t n)
{
    ptrdiff_t start = (ptrdiff_t)(at % (uint64_t)capacity), first = capacity - start;
    if (first > n)
        first = n;
    memcpy(to, data + start, (size_t)first);
    memcpy(to + first, data, (size_t)(n - first));
}

/* What a waiting producer or consumer waits for at least: a quarter of the ring (see
 * ring_put), at least a byte, or a ring of fewer than 4 bytes would wait for nothing and spin
 * for ever. */
static ptrdiff_t quarter(ptrdiff_t capacity)
{
    return capacity / 4 > 0 ? capacity / 4 : 1;
}

/* Copy as many of n bytes as there is room for now; returns how many. Safe without the GIL.
 * *head: the ring's head, as this producer last stored it. */
static ptrdiff_t ring_fill(char *ring, ptrdiff_t capacity, uint64_t *head, const char *from,
                           ptrdiff_t n)
{
    ptrdiff_t room = ring_room(ring, capacity), take = n < room ? n : room;
    if (take <= 0)
        return 0;
    ring_copy_in(ring + RING_DATA, capacity, *head, from, take);
    *head += (uint64_t)take;
    __atomic_store_n((uint64_t *)ring, *head, __ATOMIC_RELEASE);  /* the bytes, then head */
    return take;
}

ptrdiff_t ring_write(char *ring, ptrdiff_t capacity, const char *from, ptrdiff_t n)
{
    uint64_t head = own_counter(ring);
    return ring_fill(ring, capacity, &head, from, n);
}

ptrdiff_t ring_read(char *ring, ptrdiff_t capacity, char *to, ptrdiff_t n)
{
    uint64_t tail = own_counter(ring + RING_LINE);
    /* acquire: the producer copied the bytes up to head in before storing it */
    uint64_t held = __atomic_load_n((const uint64_t *)ring, __ATOMIC_ACQUIRE) - tail;
    if (held > (uint64_t)capacity) /* the peer's counter is not one a producer could store */
        return RING_OVERWRITTEN;
    ptrdiff_t take = (ptrdiff_t)held < n ? (ptrdiff_t)held : n;
    if (take > 0) {
        ring_copy_out(ring + RING_DATA, capacity, tail, to, take);
        /* release: the bytes are out before the producer may reuse their space */
        __atomic_store_n((uint64_t *)(ring + RING_LINE), tail + (uint64_t)take,
                         __ATOMIC_RELEASE);
    }
    return take;
}

/* Copy n bytes into the ring as room appears, waiting for room at most budget seconds at a
 * time; returns how many went in. Called with the GIL (wait_flags releases it to wait). It
 * waits for a quarter of the ring (or what is left) rather than for any room: copies in
 * pieces of a few bytes, each a cache line bounced between the cores, took 2 MB messages
 * from 4 to 1.8 GB/s. */
ptrdiff_t ring_put(char *ring, ptrdiff_t capacity, const char *from, ptrdiff_t n,
                   double budget)
{
    uint64_t head = own_counter(ring);
    ptrdiff_t done = 0;
    while (done < n) {
        ptrdiff_t want = n - done < quarter(capacity) ? n - done : quarter(capacity);
        if (ring_room(ring, capacity) < want &&
            !wait_flags(ring + RING_LINE, 8, 1, head + (uint64_t)want - (uint64_t)capacity,
                        budget))
            break;
        ptrdiff_t took;
        if (n - done >= NOGIL_BYTES) {
            struct _ts *saved = PyEval_SaveThread();
            took = ring_fill(ring, capacity, &head, from + done, n - done);
            PyEval_RestoreThread(saved);
        } else {
            took = ring_fill(ring, capacity, &head, from + done, n - done);
        }
        done += took;
    }
    return done;
}

ptrdiff_t ring_put_message(char *ring, ptrdiff_t capacity, const char *header,
                           ptrdiff_t header_len, const char *payload, ptrdiff_t n,
                           double budget)
{
    uint64_t head = own_counter(ring);
    if (n < NOGIL_BYTES && ring_room(ring, capacity) >= header_len + n) {
        ring_copy_in(ring + RING_DATA, capacity, head, header, header_len);
        ring_copy_in(ring + RING_DATA, capacity, head + (uint64_t)header_len, payload, n);
        /* release: the bytes, then head */
        __atomic_store_n((uint64_t *)ring, head + (uint64_t)(header_len + n), __ATOMIC_RELEASE);
        return header_len + n;
    }
    ptrdiff_t written = ring_put(ring, capacity, header, header_len, budget);
    if (written == header_len)
        written += ring_put(ring, capacity, payload, n, budget);
    return written;
}

ptrdiff_t ring_take(char *ring, ptrdiff_t capacity, const void *expected, char *dst,
                    ptrdiff_t len, double budget)
{
    uint64_t tail = own_counter(ring + RING_LINE);
    const char *head_word = ring, *data = ring + RING_DATA;
    uint64_t *tail_word = (uint64_t *)(ring + RING_LINE);
    ptrdiff_t copied = RING_NONE_YET;
    unsigned char header[HEADER_BYTES];
    if (wait_flags(head_word, 8, 1, tail + sizeof header, budget)) {  /* acquire */
        ring_copy_out(data, capacity, tail, (char *)header, sizeof header);
        if (memcmp(header, expected, sizeof header) != 0) {
            copied = RING_ANOTHER_FIRST;
        } else {
            tail += sizeof header;
            copied = 0;
            struct _ts *saved = len >= NOGIL_BYTES ? PyEval_SaveThread() : NULL;
            while (copied < len) {
                /* acquire: the producer copied the bytes up to head in before storing it */
                uint64_t head = __atomic_load_n((const uint64_t *)head_word, __ATOMIC_ACQUIRE);
                if (head - tail > (uint64_t)capacity) {  /* the peer's counter is not one */
                    copied = RING_OVERWRITTEN;
                    break;
                }
                ptrdiff_t ready = (ptrdiff_t)(head - tail);
                ptrdiff_t want = len - copied < quarter(capacity) ? len - copied
                                                                  : quarter(capacity);
                if (ready < want) {  /* in large pieces, as ring_put writes them */
                    /* wait_flags releases the GIL itself: take it back around the call */
                    if (saved)
                        PyEval_RestoreThread(saved);
                    int more = wait_flags(head_word, 8, 1, tail + (uint64_t)want, budget);
                    saved = saved ? PyEval_SaveThread() : NULL;
                    if (!more)
                        break;
                    continue;
                }
                ptrdiff_t take = len - copied < ready ? len - copied : ready;
                ring_copy_out(data, capacity, tail, dst + copied, take);
                copied += take;
                tail += (uint64_t)take;
                /* release: the bytes are out before the producer may reuse their space */
                __atomic_store_n(tail_word, tail, __ATOMIC_RELEASE);
            }
            if (saved)
                PyEval_RestoreThread(saved);
            __atomic_store_n(tail_word, tail, __ATOMIC_RELEASE);  /* the header, if no payload */
        }
    }
    return copied;
}
