/*
 * A ThreadSanitizer guard for the shm transport's ring, flag and round code (tbcoll/transports/shm/
 * rings.c's ring_put_message and ring_take, flags.c's wait_flags, rounds.c's run_round: the
 * extension's pure-C layer, which includes no Python.h), built with -fsanitize=thread with
 * those files by tests/transports/test_tsan.py and driven by threads that share one mapping, as
 * ranks share a segment. ThreadSanitizer models C11's memory model, not x86's: a shared word
 * stored or loaded plainly where an atomic access is needed, or a relaxed one where release
 * and acquire must order the data around it, is a reported race here, although x86's strong
 * ordering (and qemu on x86) would never show it go wrong. The data is checked too.
 *
 *   shm_race rings     one producer and one consumer thread over a small ring
 *   shm_race rounds N  N threads as N ranks, every kind of round, many rounds
 *   shm_race canary    a ring whose head is stored relaxed: must be reported (the guard works)
 *
 * Exits 0 when every result is right; 1 (and says which) when one is wrong; ThreadSanitizer
 * exits 66 on a report. No Python runs: the two Python calls the code makes (to release the
 * GIL and take it back: tbcoll/transports/shm/gil.h) are stubs below.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "gil.h"
#include "rings.h"
#include "rounds.h"

/* --- what the code calls of Python's (gil.h), as stubs (no interpreter, no GIL) --------- */

static char no_gil; /* a state to hand back: never read */

struct _ts *PyEval_SaveThread(void)
{
    return (struct _ts *)&no_gil;
}

void PyEval_RestoreThread(struct _ts *state)
{
    (void)state;
}

/* --- a shared mapping, as a segment ----------------------------------------------------- */

static char *map_shared(size_t bytes)
{
    char *base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) {
        perror("shm_race: mmap");
        exit(1);
    }
    return base;
}

static void fail(const char *what, long i)
{
    fprintf(stderr, "shm_race: wrong result: %s (at %ld)\n", what, i);
    exit(1);
}

#define BUDGET 60.0 /* seconds a wait may take: ThreadSanitizer slows everything ~10x */

/* --- rings: ring_put_message and ring_take (layout and order: rings.h) ------------------ */

#define CAPACITY 1024 /* small: messages wrap around and larger ones go in pieces */
#define MESSAGES 2000

static ptrdiff_t message_bytes(long i)
{
    if (i % 500 == 499)
        return NOGIL_BYTES + 4096; /* past the size that copies without the GIL */
    return (i * 37) % (3 * CAPACITY);
}

static unsigned char message_byte(long i, ptrdiff_t k)
{
    return (unsigned char)(i * 31 + k * 7 + 1);
}

/* The stream engine's header (tbcoll/include/wire.h) of message i: its own seq, its bytes. */
static void message_header(long i, unsigned char *header)
{
    memset(header, 0, HEADER_BYTES);
    put_big_endian(header + HEADER_SEQ, (uint64_t)i, HEADER_SEQ_WIDTH);
    put_big_endian(header + HEADER_NBYTES, (uint64_t)message_bytes(i), HEADER_NBYTES_WIDTH);
}

static void *produce(void *ring)
{
    unsigned char header[HEADER_BYTES];
    char *payload = malloc(NOGIL_BYTES + 4096);
    for (long i = 0; i < MESSAGES; i++) {
        ptrdiff_t n = message_bytes(i);
        for (ptrdiff_t k = 0; k < n; k++)
            payload[k] = (char)message_byte(i, k);
        message_header(i, header);
        if (ring_put_message(ring, CAPACITY, (const char *)header, HEADER_BYTES, payload, n,
                             BUDGET) != HEADER_BYTES + n)
            fail("ring_put_message wrote less than the message", i);
    }
    free(payload);
    return NULL;
}

static void *consume(void *ring)
{
    unsigned char header[HEADER_BYTES];
    unsigned char *payload = malloc(NOGIL_BYTES + 4096);
    for (long i = 0; i < MESSAGES; i++) {
        ptrdiff_t n = message_bytes(i);
        message_header(i, header);
        if (ring_take(ring, CAPACITY, header, (char *)payload, n, BUDGET) != n)
            fail("ring_take did not take the next message whole", i);
        for (ptrdiff_t k = 0; k < n; k++)
            if (payload[k] != message_byte(i, k))
                fail("a ring's payload byte", i);
    }
    free(payload);
    return NULL;
}

static void rings(void)
{
    char *ring = map_shared(RING_DATA + CAPACITY);
    pthread_t producer, consumer;
    pthread_create(&producer, NULL, produce, ring);
    pthread_create(&consumer, NULL, consume, ring);
    pthread_join(producer, NULL);
    pthread_join(consumer, NULL);
    printf("rings: %d messages through a %d-byte ring\n", MESSAGES, CAPACITY);
}

/* --- rounds: run_round, every kind, as a segment's ranks run them ----------------------- */

#define SLOT 4096
#define ROUNDS 600
#define INT64 7 /* tbcoll.core.dtypes.DTYPE_CODES */
#define SUM 0   /* tbcoll.core.dtypes.OP_CODES */
#define MOST_RANKS 4

static const int KIND_OF_ROUND[] = {ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, BROADCAST, BARRIER,
                                    ALL_REDUCE_SPLIT};

typedef struct {
    char *base;
    ptrdiff_t size, rank, sets[2];
} Rank;

/* element i of rank k's data in round seq */
static int64_t value(ptrdiff_t k, uint64_t seq, ptrdiff_t i)
{
    return (int64_t)(seq * 1000003u) + (int64_t)k * 7919 + i;
}

static void *run_rank(void *arg)
{
    const Rank *me = arg;
    const ptrdiff_t size = me->size, n = 64; /* elements of a block */
    int64_t src[MOST_RANKS * 64], dst[MOST_RANKS * 64];
    for (uint64_t seq = 1; seq <= ROUNDS; seq++) {
        int kind = KIND_OF_ROUND[seq % (sizeof KIND_OF_ROUND / sizeof *KIND_OF_ROUND)];
        int root = (int)(seq / 7 % (uint64_t)size);
        ptrdiff_t blocks = kind == REDUCE_SCATTER ? size : 1, out = kind == ALL_GATHER ? size : 1;
        for (ptrdiff_t i = 0; i < blocks * n; i++)
            src[i] = value(me->rank, seq, i);
        memset(dst, 0, sizeof dst);
        Round r = {.base = me->base, .flags = 0, .size = size, .rank = me->rank,
                   .slots = me->sets[seq & 1], .slot_bytes = SLOT,
                   .src = (const char *)src, .src_len = blocks * n * 8, .src_stride = n * 8,
                   .dst = (char *)dst, .dst_len = out * n * 8, .dst_stride = n * 8,
                   .kind = kind, .dtype = INT64, .op = SUM, .root = root};
        uint64_t signature = seq * 16 + (uint64_t)kind;
        if (run_round(&r, seq, ROUND_WAIT_FREE, BUDGET, signature) != ROUND_DONE)
            fail("a round did not finish", (long)seq);
        for (ptrdiff_t i = 0; i < out * n; i++) {
            int64_t want = 0;
            if (kind == ALL_REDUCE || kind == ALL_REDUCE_SPLIT || kind == REDUCE_SCATTER) {
                ptrdiff_t at = kind == REDUCE_SCATTER ? me->rank * n + i : i;
                for (ptrdiff_t k = 0; k < size; k++)
                    want += value(k, seq, at);
            } else if (kind == ALL_GATHER) {
                want = value(i / n, seq, i % n);
            } else if (kind == BROADCAST) {
                want = value(root, seq, i);
            }
            if (dst[i] != want)
                fail(kind == ALL_REDUCE ? "all_reduce" : kind == ALL_GATHER ? "all_gather"
                     : kind == REDUCE_SCATTER ? "reduce_scatter" : kind == BROADCAST ? "broadcast"
                     : kind == BARRIER ? "barrier" : "split all_reduce", (long)seq);
        }
    }
    return NULL;
}

static void rounds(ptrdiff_t size)
{
    ptrdiff_t flags_bytes = size * LINE, set_bytes = (size + 1) * SLOT; /* + result area */
    char *base = map_shared((size_t)(flags_bytes + 2 * set_bytes));
    Rank ranks[MOST_RANKS];
    pthread_t threads[MOST_RANKS];
    for (ptrdiff_t k = 0; k < size; k++) {
        ranks[k] = (Rank){base, size, k, {flags_bytes, flags_bytes + set_bytes}};
        pthread_create(&threads[k], NULL, run_rank, &ranks[k]);
    }
    for (ptrdiff_t k = 0; k < size; k++)
        pthread_join(threads[k], NULL);
    printf("rounds: %d rounds of every kind at %td ranks\n", ROUNDS, size);
}

/* --- the canary: a ring with a relaxed head, which ThreadSanitizer must report ---------- */

static void *canary_produce(void *ring)
{
    for (uint64_t i = 1; i <= 100; i++) {
        while (__atomic_load_n((uint64_t *)((char *)ring + RING_LINE), __ATOMIC_ACQUIRE) != i - 1)
            ;
        memcpy((char *)ring + RING_DATA, &i, sizeof i);
        __atomic_store_n((uint64_t *)ring, i, __ATOMIC_RELAXED); /* wrong: must be release */
    }
    return NULL;
}

static void *canary_consume(void *ring)
{
    for (uint64_t i = 1; i <= 100; i++) {
        while (__atomic_load_n((uint64_t *)ring, __ATOMIC_ACQUIRE) != i)
            ;
        uint64_t got;
        memcpy(&got, (char *)ring + RING_DATA, sizeof got);
        if (got != i)
            fail("the canary's word", (long)i);
        __atomic_store_n((uint64_t *)((char *)ring + RING_LINE), i, __ATOMIC_RELEASE);
    }
    return NULL;
}

static void canary(void)
{
    char *ring = map_shared(RING_DATA + 64);
    pthread_t producer, consumer;
    pthread_create(&producer, NULL, canary_produce, ring);
    pthread_create(&consumer, NULL, canary_consume, ring);
    pthread_join(producer, NULL);
    pthread_join(consumer, NULL);
    printf("canary: ran (ThreadSanitizer should have reported its race)\n");
}

int main(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], "rings") == 0) {
        rings();
    } else if (argc >= 3 && strcmp(argv[1], "rounds") == 0 && atoi(argv[2]) >= 2 &&
               atoi(argv[2]) <= MOST_RANKS) {
        rounds(atoi(argv[2]));
    } else if (argc >= 2 && strcmp(argv[1], "canary") == 0) {
        canary();
    } else {
        fprintf(stderr, "usage: shm_race rings | rounds N (2..%d) | canary\n", MOST_RANKS);
        return 2;
    }
    return 0;
}
