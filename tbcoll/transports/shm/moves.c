/*
 * The shm lane's send and recv (moves.h): a point-to-point call that the lane has
 * checked and taken moves here, in C, over the stream engine's rings (tbcoll/transports/
 * shm.py lends them: streams()), where nothing of the engine's must go first; what C cannot
 * do or finish, the engine's Python does (tbcoll/transports/stream/).
 *
 * Includes: Python.h, tbcoll/include/buffers.h, engine_words.h, moves.h (lane_base.h), rings.h,
 * cma.h.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "../../include/buffers.h"
#include "../../include/callbacks.h" /* the engine's parts' arguments */
#include "../../include/engine_words.h"
#include "cma.h"
#include "moves.h"
#include "rings.h"

/*
 * The stream engine's words: tbcoll/include/engine_words.h.
 *
 * Why plain loads and stores: the words are this process's own memory (an array the engine
 * owns, its buffer held here from streams() on, so it can neither move nor be resized), and
 * only the thread that holds the communicator touches them, with the GIL held: C from the
 * gate's taking in tbcoll.core._gate.LaneCall's send or recv (tbcoll/core/one_call.c) to its
 * giving, the engine within its doors, which run only
 * within that thread's calls (C calls them after its move, never between its load of a word
 * and the move that the word allows), and publish_words, which C calls with the gate held
 * and no door open. No other thread or process reads them.
 */

void lane_release_words(Lane *self)
{
    if (self->words.obj != NULL)
        PyBuffer_Release(&self->words);
    self->words.obj = NULL;
}

/*
 * streams(*, context, capacity, send_budget, recv_budget, words, publish, rings, send, recv,
 *         finish_send, finish_recv, finish_pulled_send, finish_announcement, pull_bytes,
 *         look, look_every)
 * Lend the lane the stream engine's rings (tbcoll/transports/shm/transport.py,
 * ShmStream.lend_lane): context, the endpoint's whose messages send and recv move; capacity, each
 * ring's data bytes; budgets, (send, recv) seconds a move waits in C; words, the engine's (a
 * writable buffer of PEER_WORDS + WORDS_PER_PEER uint64 per rank, see above), held from now on, and
 * publish(), the engine's publish_words; rings, by rank, (ring to it, ring from it), None for
 * this rank; moves, the engine's (send, recv, finish_send, finish_recv, finish_pulled_send,
 * finish_announced); pull_bytes, the size from which messages are pulled (the pull's
 * contexts are wire.h's); look(peer), the engine's, which raises where rank peer has ended, called
 * by a send at most every `every` seconds per receiver (look_if_due).
 */
PyObject *lane_streams(Lane *self, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"context", "capacity", "send_budget", "recv_budget", "words",
                               "publish", "rings", "send", "recv", "finish_send", "finish_recv",
                               "finish_pulled_send", "finish_announcement", "pull_bytes",
                               "look", "look_every", NULL};
    PyObject *context, *publish, *rings, *moves[6], *look;
    Py_buffer words;
    Py_ssize_t capacity, pull_bytes;
    double send_budget, recv_budget, look_every;
    if (!every_keyword("streams", kwargs, keywords) ||
        !PyArg_ParseTupleAndKeywords(args, kwargs, "|$O!nddw*OO!OOOOOOnOd:streams", keywords,
                                     &PyLong_Type, &context, &capacity, &send_budget,
                                     &recv_budget, &words, &publish, &PyTuple_Type, &rings,
                                     &moves[0], &moves[1], &moves[2], &moves[3], &moves[4],
                                     &moves[5], &pull_bytes,
                                     &look, &look_every))
        return NULL;
    Py_buffer segment;
    if (PyObject_GetBuffer(self->segment, &segment, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&words);
        return NULL;
    }
    Py_ssize_t len = segment.len;
    PyBuffer_Release(&segment);
    unsigned long word = PyLong_AsUnsignedLong(context);
    if (PyErr_Occurred() || word > UINT32_MAX || PyTuple_GET_SIZE(rings) != self->size ||
        pull_bytes < 1 || capacity < HEADER_BYTES + DESCRIPTOR_BYTES ||
        words.len != (PEER_WORDS + self->size * WORDS_PER_PEER) * (Py_ssize_t)sizeof(uint64_t) ||
        (uintptr_t)words.buf % sizeof(uint64_t) != 0 || !PyCallable_Check(publish) ||
        !PyCallable_Check(look) || !(look_every >= 0))
        goto bad;
    Py_ssize_t *at = PyMem_New(Py_ssize_t, 2 * self->size);
    double *next_look = PyMem_New(double, self->size);
    if (at == NULL || next_look == NULL) {
        PyMem_Free(at);
        PyMem_Free(next_look);
        PyBuffer_Release(&words);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t k = 0; k < self->size; k++)
        next_look[k] = 0.0; /* a first send to each rank looks */
    for (Py_ssize_t k = 0; k < self->size; k++) {
        PyObject *ring = PyTuple_GET_ITEM(rings, k);
        at[2 * k] = at[2 * k + 1] = 0;
        if ((k == self->rank) != (ring == Py_None) ||
            (ring != Py_None && !PyArg_ParseTuple(ring, "nn", &at[2 * k], &at[2 * k + 1])) ||
            (ring != Py_None && !(ring_inside(at[2 * k], capacity, len) &&
                                  ring_inside(at[2 * k + 1], capacity, len)))) {
            PyMem_Free(at);
            PyMem_Free(next_look);
            goto bad;
        }
    }
    PyMem_Free(self->stream_at);
    self->stream_at = at;
    PyMem_Free(self->next_look);
    self->next_look = next_look;
    Py_XSETREF(self->look, Py_NewRef(look));
    self->look_every = look_every;
    lane_release_words(self);
    self->words = words; /* held: the array can neither move nor be resized meanwhile */
    Py_XSETREF(self->publish, Py_NewRef(publish));
    self->context_word = (uint32_t)word;
    Py_XSETREF(self->send, Py_NewRef(moves[0]));
    Py_XSETREF(self->recv, Py_NewRef(moves[1]));
    Py_XSETREF(self->finish_send, Py_NewRef(moves[2]));
    Py_XSETREF(self->finish_recv, Py_NewRef(moves[3]));
    Py_XSETREF(self->finish_pulled_send, Py_NewRef(moves[4]));
    Py_XSETREF(self->finish_announced, Py_NewRef(moves[5]));
    self->stream_capacity = capacity;
    self->pull_bytes = pull_bytes;
    self->send_budget = send_budget;
    self->recv_budget = recv_budget;
    Py_RETURN_NONE;
bad:
    PyBuffer_Release(&words);
    PyErr_Clear();
    PyErr_SetString(PyExc_ValueError, "bad context, pull size, words, publish or rings (too "
                                      "small or outside the segment)");
    return NULL;
}

/* What a move in C did (ring_move, pull_move), and what is left to the engine. Their codes
 * are the module's MOVE_* (the engine's blocking send and recv, tbcoll/transports/shm/transport.py,
 * read them). */
enum {
    ENGINE,         /* nothing: the engine's send or recv does it all */
    MOVED,          /* all of it */
    FINISH,         /* part: finish_send/finish_recv(x, peer, header, moved) */
    ANNOUNCED_SEND, /* announced, not yet answered: finish_pulled_send(x, peer, pull) */
    ANNOUNCED_RECV, /* the announcement (moved bytes of it) taken: finish_announced(...) */
};

/* A message: who, its header's fields, and what C did of it. */
typedef struct {
    Py_ssize_t peer;
    uint32_t context;
    uint64_t tag, seq, call;
    unsigned char header[HEADER_BYTES];         /* the message's own header */
    unsigned char descriptor[DESCRIPTOR_BYTES]; /* a pulled message's, as it came */
    Py_ssize_t moved;
    uint64_t pull;
} Move;

/* A message under pull_bytes, or one to or from a peer that does not pull, through the ring:
 * the header and payload bytes that went (sending), or of the payload that came or as
 * ring_take says (receiving), in m->moved. */
static int ring_move(Lane *self, int sending, const Py_buffer *payload, char *segment, Move *m)
{
    char *ring = segment + self->stream_at[2 * m->peer + !sending];
    Py_ssize_t capacity = self->stream_capacity, whole = payload->len;
    if (sending) {
        m->moved = ring_put_message(ring, capacity, (const char *)m->header, HEADER_BYTES,
                                    payload->buf, payload->len, self->send_budget);
        whole += HEADER_BYTES;
        count_stream(self->words.buf, m->peer, (uint64_t)m->moved, 0);
    } else {
        m->moved = ring_take(ring, capacity, m->header, payload->buf, payload->len,
                             self->recv_budget);
        /* (the header is consumed only where it matched: moved >= 0) */
        count_stream(self->words.buf, m->peer, 0,
                     m->moved >= 0 ? HEADER_BYTES + (uint64_t)m->moved : 0);
    }
    return m->moved == whole ? MOVED : FINISH;
}

/*
 * The pull's steps, written here once: C's own moves (pull_move) and the engine's Python
 * (tbcoll/transports/stream/pulls.py, through the module's pull_announcement, pull_answer
 * and pull_payload below) both take them.
 */

/* The header of a message's announcement: the message's, with ANNOUNCE_BIT, its payload the
 * descriptor (what a receiver expects, too). */
static void put_announcement_header(unsigned char *header, uint32_t context, uint64_t tag,
                                    uint64_t seq, uint64_t call)
{
    put_header(header, context | ANNOUNCE_BIT, tag, DESCRIPTOR_BYTES, seq, call);
}

/* The announcement of payload (len bytes at buf) to peer: its header (the message's, with
 * ANNOUNCE_BIT) and descriptor (address, nbytes, pull id), the pull id taken from the
 * engine's words (peer's NEXT_PULL_WORD, the engine's own next id for it: see "The stream
 * engine's words" above). The pull id. */
static uint64_t put_announcement(void *words, Py_ssize_t peer, unsigned char *header,
                                 unsigned char *descriptor, uint32_t context, uint64_t tag,
                                 uint64_t seq, uint64_t call, const void *buf, Py_ssize_t len)
{
    uint64_t *next = engine_word(words, peer, NEXT_PULL_WORD);
    uint64_t pull = *next;
    *next = (pull + 1) & PULL_IDS;
    put_announcement_header(header, context, tag, seq, call);
    put_big_endian(descriptor + DESCRIPTOR_ADDRESS, (uint64_t)(uintptr_t)buf,
                   DESCRIPTOR_ADDRESS_WIDTH);
    put_big_endian(descriptor + DESCRIPTOR_NBYTES, (uint64_t)len, DESCRIPTOR_NBYTES_WIDTH);
    put_big_endian(descriptor + DESCRIPTOR_PULL, pull, DESCRIPTOR_PULL_WIDTH);
    return pull;
}

/* The receiver's answer to announcement `pull`: pulled, or refused (then the sender resends
 * the payload through the stream, RESENT_CONTEXT, and neither announces again). */
static void put_answer(unsigned char *answer, uint64_t pull, int refused)
{
    put_header(answer, PULLED_CONTEXT, pull, 0, (uint64_t)!!refused, 0);
}

/* Copy the payload that descriptor announces, from process pid, into to[:len]: 0, or the
 * errno that stopped it (cma_move's; EMSGSIZE where the sizes differ). Why the bytes are whole
 * (ARM64 too): tbcoll/transports/shm.py, ShmStream. */
static int pull_payload(long pid, const unsigned char *descriptor, char *to, Py_ssize_t len)
{
    if (big_endian(descriptor + DESCRIPTOR_NBYTES, DESCRIPTOR_NBYTES_WIDTH) != (uint64_t)len)
        return EMSGSIZE;
    return cma_move(pid, big_endian(descriptor + DESCRIPTOR_ADDRESS, DESCRIPTOR_ADDRESS_WIDTH),
                    to, len, 0);
}

/* pull_announcement(words, peer, buf, context, tag, seq, call) -> (announcement, pull): the
 * header and descriptor of buf's announcement to rank peer, its pull id taken from words
 * (the engine's, tbcoll/include/engine_words.h). */
PyObject *pull_announcement(PyObject *Py_UNUSED(module), PyObject *args)
{
    Py_buffer words, buf;
    Py_ssize_t peer;
    unsigned long context;
    unsigned long long tag, seq, call;
    if (!PyArg_ParseTuple(args, "w*ny*kKKK:pull_announcement", &words, &peer, &buf, &context,
                          &tag, &seq, &call))
        return NULL;
    Py_ssize_t need = (PEER_WORDS + (peer + 1) * WORDS_PER_PEER) * (Py_ssize_t)sizeof(uint64_t);
    PyObject *result = NULL;
    if (peer < 0 || words.len < need || (uintptr_t)words.buf % sizeof(uint64_t) ||
        context > UINT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "pull_announcement: the engine's words, one of its "
                                          "ranks, a context");
    } else {
        unsigned char message[HEADER_BYTES + DESCRIPTOR_BYTES];
        uint64_t pull = put_announcement(words.buf, peer, message, message + HEADER_BYTES,
                                         (uint32_t)context, tag, seq, call, buf.buf, buf.len);
        result = Py_BuildValue("(y#K)", (const char *)message, (Py_ssize_t)sizeof(message),
                               (unsigned long long)pull);
    }
    PyBuffer_Release(&words);
    PyBuffer_Release(&buf);
    return result;
}

/* pull_answer(pull, refused) -> the answer's header */
PyObject *pull_answer(PyObject *Py_UNUSED(module), PyObject *args)
{
    unsigned long long pull;
    int refused;
    if (!PyArg_ParseTuple(args, "Kp:pull_answer", &pull, &refused))
        return NULL;
    unsigned char answer[HEADER_BYTES];
    put_answer(answer, pull, refused);
    return PyBytes_FromStringAndSize((const char *)answer, HEADER_BYTES);
}

/* pull_payload(pid, descriptor, view) -> 0, or the errno that stopped the copy */
PyObject *pull_payload_py(PyObject *Py_UNUSED(module), PyObject *args)
{
    long pid;
    Py_buffer descriptor, view;
    if (!PyArg_ParseTuple(args, "ly*w*:pull_payload", &pid, &descriptor, &view))
        return NULL;
    int error = descriptor.len != DESCRIPTOR_BYTES
                    ? EINVAL
                    : pull_payload(pid, descriptor.buf, view.buf, view.len);
    PyBuffer_Release(&descriptor);
    PyBuffer_Release(&view);
    return PyLong_FromLong(error);
}

#if HAVE_CMA
/*
 * A message of pull_bytes or more to or from a peer that pulls, as the engine would move it
 * (tbcoll/transports/stream/): the sender announces it (header with the announce bit, then
 * the descriptor: address, nbytes, pull id) and waits for the answer; the receiver takes the
 * announcement, copies the payload from the sender's memory (cma_move) and answers. C goes
 * only where both ways are idle and, receiving, where the answer fits the ring now; what it
 * does not finish the engine does. Why the payload is whole when read and untouched until
 * then (ARM64 as x86-64): tbcoll/transports/shm/transport.py, ShmStream.
 */
static int pull_move(Lane *self, int sending, const Py_buffer *payload, char *segment, Move *m)
{
    Py_ssize_t peer = m->peer, capacity = self->stream_capacity;
    char *to = segment + self->stream_at[2 * peer], *from = segment + self->stream_at[2 * peer + 1];
    unsigned char announcement[HEADER_BYTES], answer[HEADER_BYTES];
    if (sending) {
        if (ring_room(to, capacity) < HEADER_BYTES + DESCRIPTOR_BYTES)
            return ENGINE;
        m->pull = put_announcement(self->words.buf, peer, announcement, m->descriptor,
                                   m->context, m->tag, m->seq, m->call, payload->buf,
                                   payload->len);
        /* whole, as there is room: release, the payload (written before this call) and the
         * descriptor before the head that publishes them */
        ring_put_message(to, capacity, (const char *)announcement, HEADER_BYTES,
                         (const char *)m->descriptor, DESCRIPTOR_BYTES, self->send_budget);
        put_answer(answer, m->pull, 0);
        char none;
        /* acquire (ring_take): the receiver's copy is done before its answer's head */
        int answered = ring_take(from, capacity, answer, &none, 0, self->recv_budget) == 0;
        count_stream(self->words.buf, peer, HEADER_BYTES + DESCRIPTOR_BYTES,
                     answered ? HEADER_BYTES : 0);
        return answered ? MOVED : ANNOUNCED_SEND;
    }
    put_announcement_header(announcement, m->context, m->tag, m->seq, m->call); /* expected */
    m->moved = ring_take(from, capacity, announcement, (char *)m->descriptor, DESCRIPTOR_BYTES,
                         self->recv_budget);
    if (m->moved < 0)
        return FINISH; /* none yet, another message first, or an overwritten ring */
    count_stream(self->words.buf, peer, 0, HEADER_BYTES + (uint64_t)m->moved);
    if (m->moved < DESCRIPTOR_BYTES || ring_room(to, capacity) < HEADER_BYTES ||
        pull_payload(pid_of(self, segment, peer), m->descriptor, payload->buf,
                     payload->len) != 0)
        return ANNOUNCED_RECV; /* the engine pulls again, and says what a refusal means */
    put_answer(answer, big_endian(m->descriptor + DESCRIPTOR_PULL, DESCRIPTOR_PULL_WIDTH), 0);
    /* release: the copy has returned before the answer's head */
    ring_put_message(to, capacity, (const char *)answer, HEADER_BYTES, NULL, 0,
                     self->send_budget);
    count_stream(self->words.buf, peer, HEADER_BYTES, 0);
    return MOVED;
}
#endif

/* Move m in C where it can (an outcome above, or -1), with the segment's buffer held
 * meanwhile: by pull where pulled, else through the ring. checked: the engine's own caller
 * has seen that nothing of the engine's must go first (its exact test); else the engine's
 * words say whether something may (they are conservative: then the engine moves it all). */
static int move(Lane *self, int sending, int pulled, int checked, const Py_buffer *payload,
                Move *m)
{
    if (pulled && !HAVE_CMA)
        return ENGINE; /* through the ring, in pieces as the receiver reads: the engine's */
    put_header(m->header, m->context, m->tag, payload->len, m->seq, m->call);
    if (!checked) {
        if (engine_words_fresh(self->words.buf, self->publish) < 0)
            return -1;
        uint64_t state = *engine_word(self->words.buf, m->peer, STATE_WORD);
        if (pulled ? (state & (SEND_HELD | RECV_HELD)) || !(state & PULLS)
                   : state & (sending ? SEND_HELD : RECV_HELD))
            return ENGINE;
    }
    Py_buffer segment;
    if (PyObject_GetBuffer(self->segment, &segment, PyBUF_WRITABLE) < 0)
        return -1;
    int outcome =
#if HAVE_CMA
        pulled ? pull_move(self, sending, payload, segment.buf, m) :
#endif
                 ring_move(self, sending, payload, segment.buf, m);
    PyBuffer_Release(&segment);
    return outcome;
}

/* The engine's part of a move (see the outcomes above): its result, or NULL. */
static PyObject *engine_part(Lane *self, int sending, int outcome, PyObject *x,
                             PyObject *peer_obj, PyObject *tag_obj, const Move *m)
{
    PyObject *callable, *args[4] = {x, peer_obj, NULL, NULL};
    Py_ssize_t nargs = 4;
    if (outcome == ENGINE) {
        callable = sending ? self->send : self->recv;
        args[2] = Py_NewRef(tag_obj);
        nargs = 3;
    } else if (outcome == ANNOUNCED_SEND) {
        callable = self->finish_pulled_send;
        args[2] = PyLong_FromUnsignedLongLong(m->pull);
        nargs = 3;
    } else {
        callable = outcome == FINISH ? (sending ? self->finish_send : self->finish_recv)
                                     : self->finish_announced;
        args[2] = PyBytes_FromStringAndSize((const char *)m->header, HEADER_BYTES);
        args[3] = outcome == FINISH
                      ? PyLong_FromSsize_t(m->moved)
                      : PyBytes_FromStringAndSize((const char *)m->descriptor, m->moved);
    }
    /* (vectorcall with the objects made: the table's counts, checked as it compiles) */
    _Static_assert(CALLBACK_NARGS(ENGINE_SEND) == 3 && CALLBACK_NARGS(ENGINE_RECV) == 3 &&
                       CALLBACK_NARGS(FINISH_PULLED_SEND) == 3,
                   "the engine's send, recv and pulled send's finish take three arguments");
    _Static_assert(CALLBACK_NARGS(SHM_FINISH_SEND) == 4 && CALLBACK_NARGS(SHM_FINISH_RECV) == 4 &&
                       CALLBACK_NARGS(FINISH_ANNOUNCEMENT) == 4,
                   "the engine's finishes take four arguments");
    PyObject *result = NULL;
    if (args[2] && (nargs == 3 || args[3]))
        result = PyObject_Vectorcall(callable, args, (size_t)nargs, NULL);
    Py_XDECREF(args[2]);
    Py_XDECREF(args[3]);
    return result;
}

/* Whether the send's receiver, rank peer, is known alive: a ring never says that its reader
 * has ended, and a message that fits it would be written all the same and the send return
 * (tcp's socket says so within a send or two). So a send asks the engine (look, which loses
 * the peer and raises PeerLostError where its process has ended:
 * tbcoll/transports/shm/transport.py) at most every look_every seconds per receiver, which costs a
 * clock read per send. 0, or
 * -1 with that error. */
static int look_if_due(Lane *self, Py_ssize_t peer)
{
    double now = gate_now();
    if (now < self->next_look[peer])
        return 0;
    self->next_look[peer] = now + self->look_every;
    PyObject *done = PyObject_CallFunction(self->look, CALLBACK_FORMAT(LOOK), peer);
    Py_XDECREF(done);
    return done == NULL ? -1 : 0;
}

/* A taken send or recv (the lane's move, tbcoll/include/lane.h): moved here (move)
 * where the engine is idle; else the engine's send or recv moves it, or finishes what C began
 * (a full ring, a late sender, another message first, a pull refused). Declined where the
 * engine's rings were not lent (streams()). */
int move_message(void *lane, int sending, PyObject *x, const Py_buffer *xv, long peer, long tag)
{
    Lane *self = lane;
    if (self->send == NULL)
        return 1;
    if (sending && look_if_due(self, peer) < 0)
        return -1;
    Move m = {.peer = peer, .context = self->context_word, .tag = (uint64_t)tag};
    int outcome = move(self, sending, xv->len >= self->pull_bytes, 0, xv, &m);
    if (outcome < 0)
        return -1;
    if (outcome == MOVED)
        return 0;
    PyObject *peer_obj = PyLong_FromLong(peer), *tag_obj = PyLong_FromLong(tag);
    PyObject *done = peer_obj && tag_obj
                         ? engine_part(self, sending, outcome, x, peer_obj, tag_obj, &m) : NULL;
    Py_XDECREF(peer_obj);
    Py_XDECREF(tag_obj);
    Py_XDECREF(done);
    return done == NULL ? -1 : 0;
}

/*
 * move(sending, buf, peer, context, tag, seq, call, pulled) -> None, or (outcome, header,
 * moved, extra): the stream engine's own blocking send or recv of buf (a buffer; writable to
 * receive into) to or from peer (a rank of this engine's), its message's header made of
 * context, tag, buf's size, seq and call, by pull where pulled, moved in C (move) where it
 * can. The caller (tbcoll/transports/shm/transport.py, ShmStream.send and recv, inside the engine)
 * has checked that nothing of the engine's must go first. None where it all moved; else what is
 * left to the engine, by MOVE_* outcome: MOVE_ENGINE all of it; MOVE_FINISH the rest after
 * moved bytes; MOVE_ANNOUNCED_SEND the answer to pull `extra`; MOVE_ANNOUNCED_RECV the
 * message whose announcement (`extra`: its bytes that came) was taken.
 */
PyObject *lane_move(Lane *self, PyObject *args)
{
    int sending, pulled;
    Py_ssize_t peer;
    unsigned long context;
    unsigned long long tag, seq, call;
    PyObject *buf;
    if (!PyArg_ParseTuple(args, "pOnkKKKp:move", &sending, &buf, &peer, &context, &tag, &seq,
                          &call, &pulled))
        return NULL;
    if (self->words.obj == NULL || peer < 0 || peer >= self->size || peer == self->rank ||
        context > UINT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "move: streams() first, another rank, a context");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(buf, &view, sending ? PyBUF_SIMPLE : PyBUF_WRITABLE) < 0)
        return NULL;
    Move m = {.peer = peer, .context = (uint32_t)context, .tag = tag, .seq = seq, .call = call};
    int outcome = move(self, sending, pulled, 1, &view, &m);
    PyBuffer_Release(&view);
    if (outcome < 0)
        return NULL;
    if (outcome == MOVED)
        Py_RETURN_NONE;
    PyObject *extra = outcome == ANNOUNCED_SEND ? PyLong_FromUnsignedLongLong(m.pull)
                      : outcome == ANNOUNCED_RECV
                          ? PyBytes_FromStringAndSize((const char *)m.descriptor, m.moved)
                          : Py_NewRef(Py_None);
    if (extra == NULL)
        return NULL;
    return Py_BuildValue("(iy#nN)", outcome, (const char *)m.header, (Py_ssize_t)HEADER_BYTES,
                         m.moved, extra);
}

/* The outcomes' codes, as the module's MOVE_*: 0, or -1 */
int add_move_outcomes(PyObject *module)
{
    return PyModule_AddIntConstant(module, "MOVE_ENGINE", ENGINE) < 0 ||
                   PyModule_AddIntConstant(module, "MOVE_FINISH", FINISH) < 0 ||
                   PyModule_AddIntConstant(module, "MOVE_ANNOUNCED_SEND", ANNOUNCED_SEND) < 0 ||
                   PyModule_AddIntConstant(module, "MOVE_ANNOUNCED_RECV", ANNOUNCED_RECV) < 0
               ? -1
               : 0;
}
