/*
 * A communicator's call gate (tbcoll.core.gate): who may call it now, the calls in progress, the
 * count of its collectives and its flight recorder. The type lives in tbcoll/core/_gate.c; this
 * header is its layout and its operations, shared with the C code that makes a whole call
 * itself (tbcoll/transports/shm/lane.c, moves.c), which takes a Gate through bind() and drives it
 * with these functions, never by attribute names. tbcoll.core._gate exports GATE_LAYOUT and the
 * sizes in a capsule (GATE_CAPSULE); an extension that includes this header checks them when it is
 * imported (gate_import), so that two builds of different layouts never meet.
 *
 * Every read and write of a Gate happens with the GIL held, by C code that does not release
 * it in between: that, not atomics, is what makes the lock test-and-set and a record whole
 * (the user's thread, the progress thread and the dump thread all take the GIL first). A
 * free-threaded build (no GIL) is not supported: it would need a mutex here.
 */
#ifndef TBCOLL_GATE_H
#define TBCOLL_GATE_H

#include <Python.h>
#include <stdint.h>

#ifdef Py_GIL_DISABLED
#error "tbcoll's call gate relies on the GIL (tbcoll/gate.h): free-threaded Python is not supported"
#endif

#define GATE_LAYOUT 2   /* raise on any change to the structs below */
#define GATE_DEPTH 8    /* calls in progress at once: nested (scatter's header, split's
                           all_gather) and the progress thread's; far past what tbcoll makes */
#define GATE_CAPSULE "tbcoll.core._gate.LAYOUT"

/* A call, as the flight recorder keeps it (tbcoll.core.gate.RECORD): codes from tbcoll.core.gate's
 * registries (KIND_CODES, DTYPE_CODES, OP_CODES, ALGORITHM_CODES), -1 for none. */
typedef struct {
    int64_t seq;      /* its number among the communicator's collectives; 0: not counted */
    int64_t bytes;    /* its array's bytes; -1: not known */
    double start;     /* time.perf_counter() at its start; 0: not timed */
    double end;       /* at its end; 0: not timed */
    int32_t root;     /* rooted collectives'; -1: none */
    int16_t kind, dtype, op, algorithm;
} GateRecord;

/* A call in progress. */
typedef struct {
    GateRecord call;      /* seq 0 until it is counted; end 0 until it is recorded */
    int32_t peer, tag;    /* send's and recv's; -1 otherwise */
    unsigned long thread; /* threading.get_ident() of the thread that runs it */
    int active;
} GateCall;

typedef struct {
    PyObject_HEAD
    int held;              /* a user thread's call holds the gate (the non-blocking lock) */
    int forked;            /* this process is a child of the one that made the communicator */
    int revoked;           /* the communicator is revoked (an interrupted call, here or on a
                              peer): every call raises at once */
    PyObject *forked_error, *forked_message; /* what a call raises in such a child, or once
                                                revoked (the fork's, where both) */
    uint64_t completed;    /* collectives counted (the last one's seq) */
    int depth;             /* calls[0..depth) hold the calls in progress (and ended ones
                              below an active one) */
    GateCall calls[GATE_DEPTH];
    GateRecord last;       /* the last call recorded (seq 0: none yet) */
    GateRecord *ring;      /* the flight recorder: call seq at ring[seq % ring_size] */
    Py_ssize_t ring_size;  /* 0: none */
    /* The one flag every call loads at enter: nonzero where it must raise. It points at
     * refused_here, which fork() and revoke() set, or, while none has, at the transport's
     * revocation word (watch(): Group.revocation), which a peer's notice sets. */
    const uint64_t *refusal;
    uint64_t refused_here;
    const uint64_t *revoked_word; /* watch()'s word, NULL where none */
    Py_buffer revoked_view;  /* holds the word's memory (the segment, or the engine's array) */
    PyObject *revoked_error, *revoked_why; /* raised as revoked_error(revoked_why()) */
} Gate;

typedef struct {
    int layout;
    size_t gate_size, record_size, call_size;
    PyTypeObject *type;
} GateLayout;

/* time.perf_counter()'s clock, so that a record's times and a dump's clock anchor agree */
static inline double gate_now(void)
{
#if PY_VERSION_HEX >= 0x030D0000
    PyTime_t t;
    (void)PyTime_PerfCounterRaw(&t);
#else
    _PyTime_t t = _PyTime_GetPerfCounter();
#endif
    return (double)t * 1e-9;
}

/* A call in progress on this thread, the gate not taken (a call nested in another, or one the
 * progress thread runs): its slot, to end it with; GATE_DEPTH where all slots are in use (the
 * call then runs unseen and unrecorded: more than tbcoll ever nests). */
static inline int gate_begin(Gate *g, int kind, int dtype, int op, long root, Py_ssize_t bytes,
                             int algorithm, int timed)
{
    if (g->depth >= GATE_DEPTH)
        return GATE_DEPTH;
    int slot = g->depth++;
    GateCall *c = &g->calls[slot];
    c->call = (GateRecord){.seq = 0, .bytes = bytes, .start = timed ? gate_now() : 0.0,
                           .end = 0.0, .root = (int32_t)root, .kind = (int16_t)kind,
                           .dtype = (int16_t)dtype, .op = (int16_t)op,
                           .algorithm = (int16_t)algorithm};
    c->peer = c->tag = -1;
    c->thread = PyThread_get_thread_ident();
    c->active = 1;
    return slot;
}

static inline void gate_end(Gate *g, int slot)
{
    if (slot < 0 || slot >= GATE_DEPTH)
        return;
    g->calls[slot].active = 0;
    while (g->depth > 0 && !g->calls[g->depth - 1].active)
        g->depth--;
}

/* Whether every call must raise: the one flag (refusal), one load per call. Relaxed (a plain
 * load, which the compiler may not tear or cache across calls): it orders nothing itself. A
 * transport's word set by another process (shm's, in the segment) is stored with release after
 * the notice's line, and why() reads that line behind its own acquire load of the line's
 * length (ShmNative.notice_text), so the text is whole on ARM64 as on x86-64; a word seen a
 * call late only raises a call later. The stream engine's word, and refused_here, are this
 * process's, set with the GIL held. */
static inline int gate_refused(const Gate *g)
{
    return __atomic_load_n(g->refusal, __ATOMIC_RELAXED) != 0;
}

/* Point the one flag at refused_here, set: fork() and revoke() */
static inline void gate_refuse_here(Gate *g)
{
    g->refused_here = 1;
    g->refusal = &g->refused_here;
}

/* Revoke the gate from its transport's word: every later call raises revoked_error(why()).
 * 0, or -1 with an exception. */
static inline int gate_take_revocation(Gate *g)
{
    PyObject *message = PyObject_CallNoArgs(g->revoked_why);
    if (message == NULL)
        return -1;
    Py_XSETREF(g->forked_error, Py_NewRef(g->revoked_error));
    Py_XSETREF(g->forked_message, message);
    g->revoked = 1;
    gate_refuse_here(g);
    return 0;
}

/* Take the gate for a user thread's call and begin it: its slot; -1 where another call holds
 * the gate; -2 with the error set in a forked child or on a revoked communicator (here, or on a
 * peer whose notice set the transport's word). */
static inline int gate_enter(Gate *g, int kind, int dtype, int op, long root, Py_ssize_t bytes,
                             int algorithm, int timed)
{
    if (gate_refused(g)) {
        if (!g->forked && !g->revoked && gate_take_revocation(g) < 0)
            return -2;
        PyErr_SetObject(g->forked_error, g->forked_message);
        return -2;
    }
    if (g->held)
        return -1;
    g->held = 1;
    return gate_begin(g, kind, dtype, op, root, bytes, algorithm, timed);
}

/* send's and recv's: peer and tag, no root */
static inline int gate_enter_move(Gate *g, int kind, int dtype, long peer, long tag,
                                  Py_ssize_t bytes)
{
    int slot = gate_enter(g, kind, dtype, -1, -1, bytes, -1, 0);
    if (slot >= 0 && slot < GATE_DEPTH) {
        g->calls[slot].peer = (int32_t)peer;
        g->calls[slot].tag = (int32_t)tag;
    }
    return slot;
}

static inline void gate_leave(Gate *g, int slot)
{
    gate_end(g, slot);
    g->held = 0;
}

/* Count the collective of slot: its seq. */
static inline uint64_t gate_count(Gate *g, int slot)
{
    uint64_t seq = ++g->completed;
    if (slot >= 0 && slot < GATE_DEPTH)
        g->calls[slot].call.seq = (int64_t)seq;
    return seq;
}

/* The counted call of slot has completed: into the flight recorder (with its end time where
 * it was timed). */
static inline void gate_record(Gate *g, int slot)
{
    if (slot < 0 || slot >= GATE_DEPTH)
        return;
    GateRecord r = g->calls[slot].call;
    if (r.start != 0.0)
        r.end = gate_now();
    g->last = r;
    if (g->ring_size > 0 && r.seq > 0)
        g->ring[(uint64_t)r.seq % (uint64_t)g->ring_size] = r;
}

/* A one-call path's collective has completed: counted and recorded. */
static inline void gate_done(Gate *g, int slot)
{
    gate_count(g, slot);
    gate_record(g, slot);
}

/* For an extension that includes this header, at its import: the Gate type of tbcoll.core._gate,
 * its layout checked against this header's; NULL with ImportError where it is missing or was
 * built from another layout (a stale build: rebuild with `make`). */
static inline PyTypeObject *gate_import(void)
{
    PyObject *module = PyImport_ImportModule("tbcoll.core._gate"); /* (then the capsule is found) */
    if (module == NULL)
        return NULL;
    Py_DECREF(module);
    const GateLayout *found = (const GateLayout *)PyCapsule_Import(GATE_CAPSULE, 0);
    if (found == NULL)
        return NULL;
    if (found->layout != GATE_LAYOUT || found->gate_size != sizeof(Gate) ||
        found->record_size != sizeof(GateRecord) || found->call_size != sizeof(GateCall)) {
        PyErr_Format(PyExc_ImportError,
                     "tbcoll.core._gate has gate layout %d (%zu bytes) but this extension was "
                     "built for layout %d (%zu bytes): rebuild tbcoll (make, or pip install "
                     "-e .)", found->layout, found->gate_size, GATE_LAYOUT, sizeof(Gate));
        return NULL;
    }
    return found->type;
}

#endif
