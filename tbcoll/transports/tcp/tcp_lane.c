/*
 * tcp's Lane: a communicator's small all_reduce as one C call (the lane interface,
 * tbcoll/include/lane.h, which tbcoll.core._gate.LaneCall runs; tcp/native.py makes it), as
 * shm's lane makes its calls (tbcoll/transports/shm/lane.c): LaneCall checks the arguments,
 * takes the communicator's call gate (tbcoll/include/gate.h) and the stream engine (its
 * Turns' lock, the struct's take and give) and asks engine_idle (its ready) to see in the
 * engine's words (tbcoll/include/engine_words.h) that nothing must go first; this file's
 * work numbers the call
 * (the group's call words, which the engine compares with the peers' messages), exchange one
 * message with every peer and reduce the blocks in rank order (exchange.c), count and record
 * the call. That Python cost about as much as the exchange (np=2, 8 B: ~10 us around a
 * ~12 us exchange on a loaded host). Where the call does not qualify (another array type, a
 * busy communicator or engine, anything held in the engine) it returns None having touched
 * nothing, and the Python path runs; where the exchange stops (another message first, a slow
 * or lost peer) the engine finishes it (finish, called with the engine still taken).
 *
 * Its send and recv are the communicator's the same way (the struct's move): one
 * sendmsg of the whole message, or the next message read straight into the array, where the
 * engine holds nothing for that peer; else the Python path, or the engine where C stopped.
 *
 * Set-up calls take keywords only (every_keyword, tbcoll/include/buffers.h):
 * Lane(fds, stages, peers, context, tag, rank)        the group: its peers' sockets and
 *     staging buffers and where their state words are, in rank order without this rank
 * engine(words, publish, call, shared)                the engine's words and publish_words,
 *     the group's call words [seq, signature], and Turns.shared_word (1: threads share it)
 * calls(take, give, largest, signatures, spin, budget, finish)   the engine's lock, the
 *     largest x, and the exchange's
 * moves(context, call, finish_send, finish_recv)     the point-to-point endpoint's context
 *     and call words, and the engine's finishers of a send or recv that C began
 * tails(rings, words, keep)                           failover's tails (engine_words.h,
 *     tail_keep), in rank order as the fds, None for a peer whose stream does not fail
 *     over: each message C writes whole to a peer with one is kept there, or by
 *     keep (TcpTransport.keep_whole) where C leaves it to the Tail; what C wrote of one it
 *     did not finish, the engine keeps as it goes on (finish, finish_send)
 * lane_capsule()                                      the lane interface, for LaneCall
 *     (tbcoll/core/one_call.c, in the gate's extension, does the call around the exchange or the
 *     move).
 *
 * Why plain loads and stores of the words: they are this process's own memory (arrays the
 * engine owns, their buffers held from engine() on, so they can neither move nor be resized),
 * read and written with the GIL held and the engine's lock taken: no door of the engine is
 * open then (each takes that lock), and C calls publish_words and finish only while it holds
 * the lock. The call words are written only by the thread that holds the communicator's
 * gate, here or in the engine's doors.
 *
 * Includes: Python.h, tbcoll/include/buffers.h, callbacks.h, engine_words.h, lane.h, wire.h,
 * tcp_lane.h (exchange.h).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <string.h>

#include "../../include/buffers.h"
#include "../../include/callbacks.h" /* the formats of its calls into Python */
#include "../../include/engine_words.h"
#include "../../include/lane.h"
#include "../../include/wire.h"
#include "tcp_lane.h"

typedef struct {
    PyObject_HEAD
    tbcoll_lane_v1 lane; /* what it offers LaneCall (lane_capsule()) */
    Py_ssize_t largest;  /* the largest x its all_reduce takes (calls()) */
    PyObject *take, *give; /* the engine's lock (calls()) */
    /* the group (Lane()) */
    int peers, rank;
    int fds[MAX_PEERS];
    Py_buffer stages[MAX_PEERS];
    int stages_held;
    Py_ssize_t peer_words[MAX_PEERS]; /* each peer's index among the engine's peers */
    uint32_t context, tag;
    /* the engine (engine()) */
    Py_buffer words, seq, shared;
    PyObject *publish;
    /* the exchange (calls()) */
    uint64_t signatures[DTYPES][OPS]; /* all_reduce's, less the byte count */
    double spin, budget;
    PyObject *finish;
    /* send and recv (moves()): the point-to-point endpoint's context and call words, and the
     * engine's finish_send and finish_recv */
    uint32_t p2p_context;
    Py_buffer p2p_call;
    PyObject *finish_send, *finish_recv;
    /* failover's tails (tails()): the rings and words held, tail_of[i] peer i's among them
     * (-1: none), and the Tail's keep */
    Py_buffer rings[MAX_PEERS], tail_words[MAX_PEERS];
    int tails_held, tail_of[MAX_PEERS];
    PyObject *keep;
    /* room for the other ranks' blocks: a bytearray never resized (a larger one replaces it),
     * so that what finish makes of it never outlives its memory */
    PyObject *blocks;
} TcpLane;

static void tcp_lane_offer(TcpLane *self);

PyObject *ways_stopped(const struct way *ways, int n)
{
    PyObject *states = PyTuple_New(n);
    for (int i = 0; states != NULL && i < n; i++) {
        const struct way *w = &ways[i];
        PyObject *state = Py_BuildValue("(ninni)", (Py_ssize_t)w->sent, w->send_error,
                                        (Py_ssize_t)w->r.copied, (Py_ssize_t)w->r.staged,
                                        w->r.error);
        if (state == NULL)
            Py_CLEAR(states);
        else
            PyTuple_SET_ITEM(states, i, state);
    }
    return states;
}

static void release_group(TcpLane *self)
{
    release_buffers(self->stages, self->stages_held);
    self->stages_held = 0;
    if (self->words.obj != NULL)
        PyBuffer_Release(&self->words);
    if (self->seq.obj != NULL)
        PyBuffer_Release(&self->seq);
    if (self->shared.obj != NULL)
        PyBuffer_Release(&self->shared);
    if (self->p2p_call.obj != NULL)
        PyBuffer_Release(&self->p2p_call);
    self->words.obj = self->seq.obj = self->shared.obj = self->p2p_call.obj = NULL;
    release_buffers(self->rings, self->tails_held);
    release_buffers(self->tail_words, self->tails_held);
    self->tails_held = 0;
}

static int tcp_lane_traverse(TcpLane *self, visitproc visit, void *arg)
{
    for (int i = 0; i < self->stages_held; i++)
        Py_VISIT(self->stages[i].obj);
    Py_VISIT(self->words.obj);
    Py_VISIT(self->seq.obj);
    Py_VISIT(self->shared.obj);
    Py_VISIT(self->p2p_call.obj);
    for (int i = 0; i < self->tails_held; i++) {
        Py_VISIT(self->rings[i].obj);
        Py_VISIT(self->tail_words[i].obj);
    }
    Py_VISIT(self->keep);
    Py_VISIT(self->finish_send);
    Py_VISIT(self->finish_recv);
    Py_VISIT(self->publish);
    Py_VISIT(self->finish);
    Py_VISIT(self->blocks);
    Py_VISIT(self->take);
    Py_VISIT(self->give);
    return 0;
}

static int tcp_lane_clear(TcpLane *self)
{
    release_group(self);
    Py_CLEAR(self->publish);
    Py_CLEAR(self->finish);
    Py_CLEAR(self->finish_send);
    Py_CLEAR(self->finish_recv);
    Py_CLEAR(self->keep);
    Py_CLEAR(self->blocks);
    Py_CLEAR(self->take);
    Py_CLEAR(self->give);
    self->lane.take = self->lane.give = NULL;
    self->largest = 0;
    return 0;
}

static void tcp_lane_dealloc(TcpLane *self)
{
    PyObject_GC_UnTrack(self);
    tcp_lane_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int tcp_lane_init(TcpLane *self, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"fds", "stages", "peers", "context", "tag", "rank", NULL};
    PyObject *fds, *stages, *peer_words;
    unsigned int context, tag;
    int rank;
    if (!every_keyword("Lane", kwargs, keywords) ||
        !PyArg_ParseTupleAndKeywords(args, kwargs, "|$O!O!O!IIi:Lane", keywords, &PyTuple_Type,
                                     &fds, &PyTuple_Type, &stages, &PyTuple_Type, &peer_words,
                                     &context, &tag, &rank))
        return -1;
    Py_ssize_t n = PyTuple_GET_SIZE(fds);
    if (n < 1 || n > MAX_PEERS || PyTuple_GET_SIZE(stages) != n ||
        PyTuple_GET_SIZE(peer_words) != n || rank < 0 || rank > n) {
        PyErr_SetString(PyExc_ValueError, "Lane: 1 to 16 peers, a stage and a word each, and "
                                          "a rank among them");
        return -1;
    }
    tcp_lane_clear(self);
    for (Py_ssize_t i = 0; i < n; i++) {
        self->fds[i] = (int)PyLong_AsLong(PyTuple_GET_ITEM(fds, i));
        self->peer_words[i] = PyLong_AsSsize_t(PyTuple_GET_ITEM(peer_words, i));
    }
    if (PyErr_Occurred())
        return -1;
    BufferRequest wanted[MAX_PEERS];
    for (Py_ssize_t i = 0; i < n; i++)
        wanted[i] = (BufferRequest){PyTuple_GET_ITEM(stages, i), PyBUF_WRITABLE};
    if (take_buffers(wanted, self->stages, (int)n) < 0)
        return -1;
    self->stages_held = (int)n;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (self->stages[i].len < HEADER_BYTES) {
            PyErr_SetString(PyExc_ValueError, "Lane: stages larger than a header");
            return -1;
        }
    }
    self->peers = (int)n;
    self->rank = rank;
    self->context = context;
    self->tag = tag;
    return 0;
}

static PyObject *tcp_lane_engine(TcpLane *self, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"words", "publish", "call", "shared", NULL};
    PyObject *words, *publish, *seq, *shared;
    if (!every_keyword("engine", kwargs, keywords) ||
        !PyArg_ParseTupleAndKeywords(args, kwargs, "|$OOOO:engine", keywords, &words, &publish,
                                     &seq, &shared))
        return NULL;
    if (self->stages_held == 0 || self->words.obj != NULL) {
        PyErr_SetString(PyExc_ValueError, "engine: once, after Lane()");
        return NULL;
    }
    Py_buffer views[3];
    if (take_buffers((BufferRequest[]){{words, PyBUF_WRITABLE}, {seq, PyBUF_WRITABLE},
                                       {shared, PyBUF_SIMPLE}}, views, 3) < 0)
        return NULL;
    Py_ssize_t most = 0;
    for (int i = 0; i < self->peers; i++)
        most = self->peer_words[i] > most ? self->peer_words[i] : most;
    if (views[0].len < (Py_ssize_t)sizeof(uint64_t) * (PEER_WORDS + (most + 1) * WORDS_PER_PEER)
        || views[1].len != 2 * sizeof(uint64_t) || views[2].len != sizeof(uint64_t)) {
        release_buffers(views, 3);
        PyErr_SetString(PyExc_ValueError, "engine: the words of every peer, two call words and "
                                          "the shared word");
        return NULL;
    }
    self->words = views[0];
    self->seq = views[1];
    self->shared = views[2];
    Py_XSETREF(self->publish, Py_NewRef(publish));
    Py_RETURN_NONE;
}

static PyObject *tcp_lane_calls(TcpLane *self, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"take", "give", "largest", "signatures", "spin", "budget",
                               "finish", NULL};
    PyObject *take, *give, *signatures, *finish;
    Py_ssize_t largest;
    double spin, budget;
    if (!every_keyword("calls", kwargs, keywords) ||
        !PyArg_ParseTupleAndKeywords(args, kwargs, "|$OOnOddO:calls", keywords, &take, &give,
                                     &largest, &signatures, &spin, &budget, &finish) ||
        lane_words(signatures, &self->signatures[0][0], DTYPES * OPS) < 0)
        return NULL;
    if (self->stages_held == 0 || !PyCallable_Check(take) || !PyCallable_Check(give) ||
        largest < 0) {
        PyErr_SetString(PyExc_ValueError, "calls: after Lane(), the lock's two callables");
        return NULL;
    }
    Py_XSETREF(self->take, Py_NewRef(take));
    Py_XSETREF(self->give, Py_NewRef(give));
    self->largest = largest;
    Py_XSETREF(self->finish, Py_NewRef(finish));
    tcp_lane_offer(self);
    self->spin = spin;
    self->budget = budget;
    Py_RETURN_NONE;
}

/* moves(context, call, finish_send, finish_recv): what send and recv take, the communicator's
 * point-to-point endpoint: its context and call words (two uint64, as the engine reads them
 * for each message's header), and the engine's TcpTransport.finish_send and finish_recv,
 * which go on from where C stopped. Before bind, which then takes send and recv too. */
static PyObject *tcp_lane_moves(TcpLane *self, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"context", "call", "finish_send", "finish_recv", NULL};
    PyObject *call, *finish_send, *finish_recv;
    unsigned int context;
    if (!every_keyword("moves", kwargs, keywords) ||
        !PyArg_ParseTupleAndKeywords(args, kwargs, "|$IOOO:moves", keywords, &context, &call,
                                     &finish_send, &finish_recv))
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(call, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    if (view.len != 2 * sizeof(uint64_t) || self->p2p_call.obj != NULL ||
        !PyCallable_Check(finish_send) || !PyCallable_Check(finish_recv)) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "moves: once, two call words and two callables");
        return NULL;
    }
    self->p2p_call = view; /* held: the array can neither move nor be resized meanwhile */
    self->p2p_context = context;
    Py_XSETREF(self->finish_send, Py_NewRef(finish_send));
    Py_XSETREF(self->finish_recv, Py_NewRef(finish_recv));
    self->lane.kinds |= LANE_MOVES;
    Py_RETURN_NONE;
}

/* tails(rings, words, keep): failover's tail of each peer's stream (see the file's head):
 * the rings and words held from now on (neither moves: replay.Tail reserves its ring once) */
static PyObject *tcp_lane_tails(TcpLane *self, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"rings", "words", "keep", NULL};
    PyObject *rings, *words, *keep;
    if (!every_keyword("tails", kwargs, keywords) ||
        !PyArg_ParseTupleAndKeywords(args, kwargs, "|$O!O!O:tails", keywords, &PyTuple_Type,
                                     &rings, &PyTuple_Type, &words, &keep))
        return NULL;
    int n = self->peers, held = 0;
    if (self->stages_held == 0 || self->tails_held || PyTuple_GET_SIZE(rings) != n ||
        PyTuple_GET_SIZE(words) != n || !PyCallable_Check(keep)) {
        PyErr_SetString(PyExc_ValueError, "tails: once, after Lane(), a ring and words (or "
                                          "None) per peer and a callable");
        return NULL;
    }
    BufferRequest wanted[2 * MAX_PEERS];
    int tail_of[MAX_PEERS];
    for (int i = 0; i < n; i++) {
        tail_of[i] = -1;
        if (PyTuple_GET_ITEM(rings, i) == Py_None)
            continue;
        tail_of[i] = held / 2;
        wanted[held++] = (BufferRequest){PyTuple_GET_ITEM(rings, i), PyBUF_WRITABLE};
        wanted[held++] = (BufferRequest){PyTuple_GET_ITEM(words, i), PyBUF_WRITABLE};
    }
    Py_buffer views[2 * MAX_PEERS];
    if (take_buffers(wanted, views, held) < 0)
        return NULL;
    for (int k = 0; k < held; k += 2) {
        if (views[k + 1].len != TAIL_WORDS * (Py_ssize_t)sizeof(uint64_t) ||
            views[k].len < (Py_ssize_t)((uint64_t *)views[k + 1].buf)[TAIL_SIZE]) {
            release_buffers(views, held);
            PyErr_SetString(PyExc_ValueError, "tails: each tail's three words and its ring");
            return NULL;
        }
    }
    for (int k = 0; k < held; k += 2) {
        self->rings[k / 2] = views[k];
        self->tail_words[k / 2] = views[k + 1];
    }
    memcpy(self->tail_of, tail_of, sizeof tail_of);
    self->tails_held = held / 2;
    Py_XSETREF(self->keep, Py_NewRef(keep));
    Py_RETURN_NONE;
}

/* Keep a message that C wrote whole to peer i (header, then x) in its tail, where failover
 * keeps one: C's copy, or the Tail's (keep) where C leaves it; 0, or -1 with an exception. */
static int keep_sent(TcpLane *self, int i, const unsigned char *header, PyObject *x,
                     const Py_buffer *xv)
{
    int k = self->tails_held ? self->tail_of[i] : -1;
    if (k < 0 || tail_keep(self->rings[k].buf, self->tail_words[k].buf, header, HEADER_BYTES,
                           xv->buf, (size_t)xv->len) == 0)
        return 0;
    PyObject *done = PyObject_CallFunction(self->keep, CALLBACK_FORMAT(TCP_KEEP), x,
                                           (int)self->peer_words[i], (const char *)header,
                                           (Py_ssize_t)HEADER_BYTES);
    Py_XDECREF(done);
    return done == NULL ? -1 : 0;
}

/* Whether C may read the engine's words now: they are lent (engine()), no thread but this
 * one has shared the engine, and they are published (1); 0 where not, -1 with an exception. */
static int words_ready(TcpLane *self)
{
    if (self->words.obj == NULL || *(const uint64_t *)self->shared.buf)
        return 0;
    return engine_words_fresh(self->words.buf, self->publish) < 0 ? -1 : 1;
}

/* Whether every peer may send and take this call's message by C's path now: the words ready,
 * no send waits for room, nothing of any peer's is queued, held or half-read; -1 with an
 * exception. */
static int engine_idle(void *lane)
{
    TcpLane *self = lane;
    int ready = words_ready(self);
    if (ready <= 0)
        return ready;
    if (*((uint64_t *)self->words.buf + ENGINE_WORD) & WRITING)
        return 0;
    for (int i = 0; i < self->peers; i++)
        if (*engine_word(self->words.buf, self->peer_words[i], STATE_WORD) &
            (SEND_HELD | RECV_HELD))
            return 0;
    return 1;
}

/* The bytes a receive read from its socket: the header and the payload copied once the
 * header matched, else what it staged (exchange.h's struct received) */
static uint64_t read_from_socket(const struct received *r)
{
    return r->copied >= 0 ? HEADER_BYTES + (uint64_t)r->copied : (uint64_t)r->staged;
}

/* Count what the ways moved on each peer's stream (the engine's words; the engine is this
 * thread's, taken, see count_stream) */
static void count_ways(TcpLane *self, const struct way *ways)
{
    for (int i = 0; i < self->peers; i++)
        count_stream(self->words.buf, self->peer_words[i], ways[i].sent,
                     read_from_socket(&ways[i].r));
}

/* The exchange and the reduction of a taken call (the lane's work) */
static int exchange_and_reduce(void *lane, int kind, PyObject *x, const Py_buffer *xv,
                               PyObject *target, const Py_buffer *tv, int dtype, int op,
                               int root)
{
    TcpLane *self = lane;
    (void)kind; /* all_reduce, */
    (void)root; /* so none */
    size_t len = (size_t)xv->len, need = (size_t)self->peers * len;
    if (self->blocks == NULL || (size_t)PyByteArray_GET_SIZE(self->blocks) < need) {
        PyObject *more = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)need);
        if (more == NULL)
            return -1;
        Py_XSETREF(self->blocks, more);
    }
    char *blocks = PyByteArray_AS_STRING(self->blocks);
    uint64_t *call = self->seq.buf; /* the engine's begin_next_call */
    call[0] += 1;
    call[1] = CALL_BYTES_OF(len) | self->signatures[dtype][op];
    unsigned char header[HEADER_BYTES];
    put_header(header, self->context, self->tag, (uint64_t)len, call[0], call[1]);
    char *stages[MAX_PEERS];
    ptrdiff_t stage_lens[MAX_PEERS];
    for (int i = 0; i < self->peers; i++) {
        stages[i] = self->stages[i].buf;
        stage_lens[i] = self->stages[i].len;
    }
    struct way ways[MAX_PEERS];
    ways_begin(ways, self->peers, self->fds, stages, stage_lens, blocks, len);
    /* a tail keeps x as sent: where the reduction would overwrite it, it waits for the keep */
    const char *mine = xv->buf, *into = tv->buf;
    int later = self->tails_held && !(into >= mine + len || mine >= into + len);
    int stopped;
    Py_BEGIN_ALLOW_THREADS
    stopped = exchange_reduce(ways, self->peers, (const char *)header, xv->buf, len, self->spin,
                              self->budget, later ? NULL : tv->buf, NULL, self->rank, dtype, op);
    Py_END_ALLOW_THREADS
    count_ways(self, ways);
    if (stopped < 0) {
        PyErr_NoMemory();
        return stopped;
    }
    if (stopped == 0) { /* every message went whole: kept here (stopped: by finish) */
        for (int i = 0; i < self->peers; i++)
            if (keep_sent(self, i, header, x, xv) < 0)
                return -1;
        if (later && reduce_in_rank_order(blocks, xv->buf, self->rank, self->peers, tv->buf,
                                          len, dtype, op) < 0) {
            PyErr_NoMemory();
            return -1;
        }
        return 0;
    }
    /* the engine goes on from where C stopped, into the blocks, and reduces */
    PyObject *sent = PyBytes_FromStringAndSize((const char *)header, HEADER_BYTES);
    PyObject *where = ways_stopped(ways, self->peers);
    PyObject *done = NULL;
    if (sent && where)
        done = PyObject_CallFunction(self->finish, CALLBACK_FORMAT(TCP_FINISH), x, target,
                                     self->blocks, sent, where, dtype, op);
    *((uint64_t *)self->words.buf + ENGINE_WORD) |= STALE; /* the engine has moved */
    Py_XDECREF(sent);
    Py_XDECREF(where);
    Py_XDECREF(done);
    return done == NULL ? -1 : 0;
}

/* A taken send or recv (the lane's move): the whole message (header and payload) written with one
 * sendmsg, or the next message of the peer's stream read straight into x when it is this one,
 * where the engine holds nothing that must go first (its words, as engine_idle reads them, for
 * the one peer and way); what C leaves (no room in the socket, a late peer, another message
 * first, a failed connection) the engine finishes, the engine still taken. */
static int move_message(void *lane, int sending, PyObject *x, const Py_buffer *xv, long peer,
                        long tag)
{
    TcpLane *self = lane;
    int i = peer < self->rank ? (int)peer : (int)peer - 1; /* among the group's other ranks */
    int ready = words_ready(self);
    if (ready <= 0)
        return ready < 0 ? -1 : 1;
    uint64_t state = *engine_word(self->words.buf, self->peer_words[i], STATE_WORD);
    /* (as TcpTransport.isend and recv ask: a receive also waits for no send that wants room) */
    if (sending ? state & SEND_HELD
                : (state & RECV_HELD) || (*((uint64_t *)self->words.buf + ENGINE_WORD) & WRITING))
        return 1;
    const uint64_t *call = self->p2p_call.buf;
    unsigned char header[HEADER_BYTES];
    put_header(header, self->p2p_context, (uint64_t)tag, (uint64_t)xv->len, call[0], call[1]);
    PyObject *done;
    if (sending) {
        /* non-blocking: no wait, so the GIL stays (as _sockets.send) */
        ssize_t sent = send_one(self->fds[i], header, HEADER_BYTES, xv->buf, (size_t)xv->len);
        int error = sent < 0 ? errno : 0;
        count_stream(self->words.buf, self->peer_words[i], sent < 0 ? 0 : (uint64_t)sent, 0);
        if (sent == HEADER_BYTES + xv->len)
            return keep_sent(self, i, header, x, xv);
        done = PyObject_CallFunction(self->finish_send, CALLBACK_FORMAT(TCP_FINISH_SEND), x,
                                     (int)self->peer_words[i], (const char *)header,
                                     (Py_ssize_t)HEADER_BYTES, (Py_ssize_t)(sent < 0 ? 0 : sent),
                                     error);
    } else {
        struct received r;
        Py_BEGIN_ALLOW_THREADS
        r = receive_one(self->fds[i], (const char *)header, xv->buf, xv->len, self->stages[i].buf,
                        self->stages[i].len, self->spin, self->budget);
        Py_END_ALLOW_THREADS
        count_stream(self->words.buf, self->peer_words[i], 0, read_from_socket(&r));
        if (r.copied == xv->len)
            return 0;
        done = PyObject_CallFunction(self->finish_recv, CALLBACK_FORMAT(TCP_FINISH_RECV), x,
                                     (int)self->peer_words[i], (const char *)header,
                                     (Py_ssize_t)HEADER_BYTES, r.copied, r.staged, r.error);
    }
    Py_XDECREF(done);
    return done == NULL ? -1 : 0;
}

/* The largest x of kind the exchange takes (the lane's limits) */
static Py_ssize_t exchange_limit(void *lane, int kind)
{
    const TcpLane *self = lane;
    return kind == LANE_ALL_REDUCE ? self->largest : 0;
}

/* lane_capsule() -> the "tbcoll.lane.v1" capsule of the lane interface, for
 * tbcoll.core._gate.LaneCall: all_reduce, send and recv once moves() was called, under the
 * engine's lock (calls()) */
/* The lane interface it offers, once calls() gave the engine's lock: all_reduce, and send
 * and recv from moves() on (LaneCall reads the kinds at each bind) */
static void tcp_lane_offer(TcpLane *self)
{
    self->lane = (tbcoll_lane_v1){
        .version = TBCOLL_LANE_VERSION, .size = sizeof(tbcoll_lane_v1),
        .kinds = 1u << LANE_ALL_REDUCE | (self->p2p_call.obj ? LANE_MOVES : 0),
        .ranks = self->peers + 1, .rank = self->rank, .state = self,
        .work = exchange_and_reduce, .move = move_message, .ready = engine_idle,
        .limits = exchange_limit, .beyond = NULL, .take = self->take, .give = self->give};
}

static PyObject *tcp_lane_capsule(TcpLane *self, PyObject *unused)
{
    (void)unused;
    if (self->take == NULL || self->words.obj == NULL) {
        PyErr_SetString(PyExc_ValueError, "lane_capsule: after engine() and calls()");
        return NULL;
    }
    return lane_capsule_new(&self->lane, (PyObject *)self);
}

static PyMethodDef tcp_lane_methods[] = {
    {"engine", (PyCFunction)(void (*)(void))tcp_lane_engine, METH_VARARGS | METH_KEYWORDS,
     "The stream engine it takes."},
    {"calls", (PyCFunction)(void (*)(void))tcp_lane_calls, METH_VARARGS | METH_KEYWORDS,
     "What its all_reduce takes."},
    {"moves", (PyCFunction)(void (*)(void))tcp_lane_moves, METH_VARARGS | METH_KEYWORDS,
     "What its send and recv take."},
    {"tails", (PyCFunction)(void (*)(void))tcp_lane_tails, METH_VARARGS | METH_KEYWORDS,
     "Failover's tails, where C keeps what it sends."},
    {"lane_capsule", (PyCFunction)tcp_lane_capsule, METH_NOARGS, "The lane interface (lane.h)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject TcpLaneType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tbcoll.transports.tcp._sockets.Lane",
    .tp_basicsize = sizeof(TcpLane),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "One tcp group's small all_reduce in one call.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)tcp_lane_init,
    .tp_dealloc = (destructor)tcp_lane_dealloc,
    .tp_traverse = (traverseproc)tcp_lane_traverse,
    .tp_clear = (inquiry)tcp_lane_clear,
    .tp_methods = tcp_lane_methods,
};

int add_tcp_lane(PyObject *module)
{
    if (PyType_Ready(&TcpLaneType) < 0)
        return -1;
    return PyModule_AddObjectRef(module, "Lane", (PyObject *)&TcpLaneType);
}
