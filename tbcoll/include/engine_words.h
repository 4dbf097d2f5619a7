/*
 * The stream engine's words (tbcoll/transports/stream/words.py: WORDS_PER_PEER and the bits below,
 * the same there; each extension that includes this exports them, add_engine_words, and the
 * transport checks them at import, tbcoll.transports.stream.words.check_words): what a C path must
 * know before it moves a message to or from a peer by itself, each word tested with one load.
 * Each of the engine's doors marks them STALE as it leaves
 * (tbcoll.transports.stream.turns.Marking); C, finding them so, has the engine publish them
 * (StreamTransport.publish_words) before it tests one, so that they are true whenever C tests them.
 * C stores only next_pull's, and adds to the byte counts (count_stream) of what it moves itself.
 *
 * Used by shm's send and recv (tbcoll/transports/shm/moves.c) and tcp's whole all_reduce
 * (tbcoll/transports/tcp/tcp_lane.c); each says why its plain loads and stores are safe (the
 * words are the process's own memory, touched with the GIL held by a thread that holds the
 * engine, or the communicator whose engine it alone uses).
 */
#ifndef TBCOLL_ENGINE_WORDS_H
#define TBCOLL_ENGINE_WORDS_H

#include <Python.h>
#include <stdint.h>
#include <string.h>

enum {
    ENGINE_WORD = 0, PEER_WORDS = 1, WORDS_PER_PEER = 4,
    STATE_WORD = 0, NEXT_PULL_WORD = 1, SENT_WORD = 2, RECEIVED_WORD = 3
};
/* the engine word's bits */
#define STALE (1u << 0)   /* the state words may be out of date */
#define WRITING (1u << 1) /* a send waits for room in a socket (tcp: the engine must watch it)
                           (whether threads share the engine is Turns.shared_word's) */
/* a peer's state word's bits */
#define SENDING (1u << 0)    /* a send to the peer is queued */
#define LOST (1u << 1)       /* its stream is lost (or failing over: the engine's) */
#define READING (1u << 2)    /* a message of its is half-read, or its stage holds unread bytes */
#define POSTED (1u << 3)     /* a receive from it is posted (any context and tag) */
#define UNEXPECTED (1u << 4) /* a message of its is held for its receive (likewise) */
#define MISMATCH (1u << 5)   /* the ranks' calls were found to differ */
#define PULLS (1u << 6)      /* large messages to and from it are pulled */
/* what makes a send, and a receive, the engine's: a message before it to go or to be taken,
 * or a reason to fail. POSTED and UNEXPECTED are of any (context, tag), where the engine's
 * own check (_receives_idle) asks only of this message's: a receive that C leaves to the
 * engine for that reason is right (the engine is what C stands in for, and takes its own C
 * path where its exact check allows); it is only slower, and only where a receive of another
 * tag is pending or a message of another tag is held, which a blocking send/recv program
 * leaves only where its messages arrive out of the order it takes them (or a collective of
 * the engine's, context 1, meets a message of its next call early). The common path, a
 * message to or from a peer with nothing held, tests one bit mask
 * (tests/transports/test_shm_lane.py counts which paths ran). */
#define SEND_HELD (SENDING | LOST)
#define RECV_HELD (LOST | READING | POSTED | UNEXPECTED | MISMATCH)

/* peer's word at `which` (STATE_WORD, NEXT_PULL_WORD, SENT_WORD, RECEIVED_WORD) in the words at `words` */
static inline uint64_t *engine_word(void *words, Py_ssize_t peer, int which)
{
    return (uint64_t *)words + PEER_WORDS + peer * WORDS_PER_PEER + which;
}

/* Count bytes that a C path wrote to, and read from, peer's stream (its SENT_WORD and
 * RECEIVED_WORD: every byte the stream carried, header and payload, whichever path moved it;
 * the engine counts its own in Python). Plain adds, no release/acquire: only the thread that
 * holds the engine (its Turns' lock, which a C path keeps while it moves bytes) ever writes
 * them, and they are read in this process only, by a holder of that lock (the lock orders
 * them), so a new connection can resume the stream from the byte its peer last received. */
static inline void count_stream(void *words, Py_ssize_t peer, uint64_t sent, uint64_t received)
{
    *engine_word(words, peer, SENT_WORD) += sent;
    *engine_word(words, peer, RECEIVED_WORD) += received;
}

/* A failover's tail (tbcoll.transports.stream.replay.Tail, which says why it is kept): its
 * ring, reserved once at its bound, and three words, the ring's stream offsets [start, end)
 * and the size of the ring in use. C copies into it a small message that it wrote whole
 * (tail_keep); a large one (TAIL_LARGE and up), or one that does not fit, is the Tail's (Python:
 * it asks the kernel what is unacknowledged, and grows the ring). */
enum { TAIL_START = 0, TAIL_END = 1, TAIL_SIZE = 2, TAIL_WORDS = 3, TAIL_LARGE = 64 << 10 };

/* Copy `size` bytes into the ring at stream offset `at` (wrapping). */
static inline void tail_put(char *ring, uint64_t ring_size, uint64_t at, const void *from,
                            size_t size)
{
    uint64_t place = at % ring_size;
    size_t first = size < ring_size - place ? size : (size_t)(ring_size - place);
    memcpy(ring + place, from, first);
    memcpy(ring, (const char *)from + first, size - first);
}

/* Keep a message just written whole (header, then payload) in the tail: 0 where done, 1 where
 * the Tail must (large, or the ring full: one Python call per ring's worth). Plain loads and
 * stores: the words and ring are touched only by the engine's holder (as count_stream's). */
static inline int tail_keep(char *ring, uint64_t *words, const void *header, size_t header_len,
                            const void *payload, size_t len)
{
    uint64_t n = header_len + len, end = words[TAIL_END];
    if (n >= TAIL_LARGE || end + n - words[TAIL_START] > words[TAIL_SIZE])
        return 1;
    tail_put(ring, words[TAIL_SIZE], end, header, header_len);
    tail_put(ring, words[TAIL_SIZE], end + header_len, payload, len);
    words[TAIL_END] = end + n;
    return 0;
}

/* Have the engine publish its words (publish: StreamTransport.publish_words) where a door has
 * left it since they were: 0, or -1 with an exception. */
static inline int engine_words_fresh(void *words, PyObject *publish)
{
    uint64_t *engine = (uint64_t *)words + ENGINE_WORD;
    if (!(*engine & STALE))
        return 0;
    PyObject *done = PyObject_CallNoArgs(publish);
    if (done == NULL)
        return -1;
    Py_DECREF(done);
    if (*engine & STALE) {
        PyErr_SetString(PyExc_RuntimeError, "the stream engine's publish_words left its words "
                                            "stale (C would read them as true)");
        return -1;
    }
    return 0;
}

/* At import: the words' layout as module constants (0, or -1 with an exception) */
static inline int add_engine_words(PyObject *module)
{
    static const struct {
        const char *name;
        long value;
    } layout[] = {
        {"ENGINE_WORD", ENGINE_WORD}, {"STALE", STALE}, {"WRITING", WRITING},
        {"PEER_WORDS", PEER_WORDS}, {"WORDS_PER_PEER", WORDS_PER_PEER},
        {"STATE_WORD", STATE_WORD}, {"NEXT_PULL_WORD", NEXT_PULL_WORD}, {"SENT_WORD", SENT_WORD},
        {"RECEIVED_WORD", RECEIVED_WORD}, {"SENDING", SENDING},
        {"LOST", LOST}, {"READING", READING}, {"POSTED", POSTED}, {"UNEXPECTED", UNEXPECTED},
        {"MISMATCH", MISMATCH}, {"PULLS", PULLS}, {"TAIL_START", TAIL_START},
        {"TAIL_END", TAIL_END}, {"TAIL_SIZE", TAIL_SIZE}, {"TAIL_WORDS", TAIL_WORDS},
        {"TAIL_LARGE", TAIL_LARGE},
    };
    for (size_t k = 0; k < sizeof layout / sizeof layout[0]; k++)
        if (PyModule_AddIntConstant(module, layout[k].name, layout[k].value) < 0)
            return -1;
    return 0;
}

#endif
