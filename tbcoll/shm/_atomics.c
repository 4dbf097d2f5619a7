/*
 * Atomic flags in shared memory for tbcoll's shm transport.
 *
 * A rank publishes "my data for step N is in place" by a store-release of N to its own
 * 64-bit flag; a reader waits with load-acquire until every flag it needs is >= N. The
 * release orders every earlier store of the writer (the data) before the flag; the acquire
 * orders every later load of the reader after it. That is what makes the data visible
 * before the flag on ARM64 (Apple Silicon), whose weak memory model gives no such order to
 * plain stores; on x86-64 the same builtins compile to plain moves.
 *
 * Waiting spins briefly, then yields the CPU, then sleeps, so that more ranks than cores
 * (tbrun -np 4 on 2 cores) still make progress. The GIL is released while waiting.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <sched.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#ifdef __linux__
#include <sys/uio.h> /* process_vm_readv */
#endif

#include "../include/buffers.h"
#include "../include/cpu_relax.h"
#include "shm.h"

static int get_word(PyObject *obj, Py_ssize_t offset, Py_buffer *view, uint64_t **word)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_WRITABLE) < 0)
        return -1;
    if (offset < 0 || offset % 8 || offset + 8 > view->len) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_ValueError, "offset %zd is not an aligned word of the buffer", offset);
        return -1;
    }
    *word = (uint64_t *)((char *)view->buf + offset);
    return 0;
}

static PyObject *load_acquire(PyObject *self, PyObject *args)
{
    PyObject *obj;
    Py_ssize_t offset;
    Py_buffer view;
    uint64_t *word;
    if (!PyArg_ParseTuple(args, "On", &obj, &offset) || get_word(obj, offset, &view, &word) < 0)
        return NULL;
    uint64_t value = __atomic_load_n(word, __ATOMIC_ACQUIRE);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLongLong(value);
}

static PyObject *store_release(PyObject *self, PyObject *args)
{
    PyObject *obj;
    Py_ssize_t offset;
    unsigned long long value;
    Py_buffer view;
    uint64_t *word;
    if (!PyArg_ParseTuple(args, "OnK", &obj, &offset, &value) ||
        get_word(obj, offset, &view, &word) < 0)
        return NULL;
    __atomic_store_n(word, (uint64_t)value, __ATOMIC_RELEASE);
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
}

static int all_reached(const char *base, Py_ssize_t stride, Py_ssize_t count, uint64_t target)
{
    for (Py_ssize_t i = 0; i < count; i++)
        if (__atomic_load_n((const uint64_t *)(base + i * stride), __ATOMIC_ACQUIRE) < target)
            return 0;
    return 1;
}

/*
 * Wait until the count flags at base, base+stride, ... are all >= target, for at most
 * budget seconds; 1 when they are, 0 when the budget ran out. Spins briefly, then yields
 * the CPU (returns at once if nobody else wants it), then naps: a rank that shares its core
 * with a peer (tbrun -np 4 on 2 cores) must let that peer run. The GIL is released once the
 * first spin has not sufficed.
 */
/* Seconds a wait spins before it yields (set_spin): about a small message's turnaround where
 * every rank has a core, next to none where ranks share cores. Counted in time, not pauses: a
 * pause takes ~10 ns on recent x86 and next to nothing on Apple's cores (ARM64's yield hint).
 * Measured (benchmarks/RESULTS.md, contention): a longer spin costs a job whose cores another
 * job wants (two 8 B ping-pong jobs on 2 cores: 11.6-13.1 us a message after 5 us of spin,
 * 8.4-11.0 after 1 us) and gains nothing alone (8 B all_reduce 1.41-1.42 us either way). */
static double spin_seconds = 1e-6;

static double seconds_since(const struct timespec *start)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (now.tv_sec - start->tv_sec) + 1e-9 * (now.tv_nsec - start->tv_nsec);
}

int wait_flags(const char *base, Py_ssize_t stride, Py_ssize_t count, uint64_t target,
               double budget)
{
    if (all_reached(base, stride, count, target))
        return 1;
    struct timespec start;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (unsigned i = 1;; i++) {  /* the clock is read every 16 looks */
        CPU_RELAX();
        if (all_reached(base, stride, count, target))
            return 1;
        if (!(i & 15) && seconds_since(&start) >= spin_seconds)
            break;
    }
    int done = 0;
    Py_BEGIN_ALLOW_THREADS
    long nap_ns = 0;
    for (;;) {
        if ((done = all_reached(base, stride, count, target)))
            break;
        double waited = seconds_since(&start);
        if (waited >= budget)
            break;
        if (waited < 2e-3) {
            sched_yield();
        } else {  /* a long wait: stop burning the core */
            nap_ns = nap_ns ? (nap_ns * 2 > 1000000 ? 1000000 : nap_ns * 2) : 50000;
            struct timespec nap = {0, nap_ns};
            nanosleep(&nap, NULL);
        }
    }
    Py_END_ALLOW_THREADS
    return done;
}

/*
 * wait_all(buffer, offset, stride, count, target, budget_s) -> bool
 * False when the budget ran out, so that the caller can look for dead peers and check its
 * own deadline between slices.
 */
static PyObject *wait_all(PyObject *self, PyObject *args)
{
    PyObject *obj;
    Py_ssize_t offset, stride, count;
    unsigned long long target;
    double budget;
    Py_buffer view;
    uint64_t *first;
    if (!PyArg_ParseTuple(args, "OnnnKd", &obj, &offset, &stride, &count, &target, &budget) ||
        get_word(obj, offset, &view, &first) < 0)
        return NULL;
    int inside = stride % 8 == 0 && count >= 0 &&
                 offset + (count ? (count - 1) * stride + 8 : 0) <= view.len;
    int done = inside && wait_flags((const char *)first, stride, count, target, budget);
    PyBuffer_Release(&view);
    if (!inside) {
        PyErr_SetString(PyExc_ValueError, "flags lie outside the buffer");
        return NULL;
    }
    return PyBool_FromLong(done);
}

#include "../include/reduce.h" /* reduce_rows */

/*
 * gathered_reduce(src, block, size, header, dst, dtype, op) -> -1, or a rank
 * src holds size blocks of `block` bytes, one per rank in rank order, each the rank's call
 * (`header` bytes, e.g. its tbcoll.calls signature) and then its data. When every header
 * equals the first, dst = the data reduced with op in rank order (every rank that does this
 * gets the same bits, with numpy's semantics: see reduce.h) and the result is -1;
 * else the first rank whose header differs, dst untouched. The mpi transport's small all_reduce
 * (an MPI_Allgather of each rank's call and data) ends here.
 */
static PyObject *gathered_reduce(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (!positional("gathered_reduce", nargs, 7))
        return NULL;
    Py_ssize_t block = PyLong_AsSsize_t(args[1]), size = PyLong_AsSsize_t(args[2]),
               header = PyLong_AsSsize_t(args[3]);
    long dtype = PyLong_AsLong(args[5]), op = PyLong_AsLong(args[6]);
    if (PyErr_Occurred())
        return NULL;
    if (dtype < 0 || dtype >= DTYPES || op < 0 || op >= OPS || size < 1 || header < 0 ||
        block < header) {
        PyErr_SetString(PyExc_ValueError, "bad dtype, op, size, header or block");
        return NULL;
    }
    Py_buffer views[2];
    if (take_buffers((BufferRequest[]){{args[0], PyBUF_SIMPLE}, {args[4], PyBUF_WRITABLE}}, views,
                     2) < 0)
        return NULL;
    const Py_buffer *src = &views[0], *dst = &views[1];
    long differs = -1;
    Py_ssize_t data = block - header;
    if (src->len < size * block || dst->len != data || data % ITEMSIZE[dtype]) {
        PyErr_SetString(PyExc_ValueError, "src does not hold size blocks of dst's bytes");
        differs = -2;
    } else {
        const char *base = (const char *)src->buf;
        for (Py_ssize_t k = 1; k < size && differs < 0; k++)
            if (memcmp(base, base + k * block, (size_t)header) != 0)
                differs = (long)k;
        /* in rank order, MAX_RANKS rows at a time (an mpi world may be larger), each batch
         * after the first going on from the result so far */
        const char *rows[MAX_RANKS];
        for (Py_ssize_t k = 0; differs < 0 && k < size;) {
            Py_ssize_t count = 0;
            if (k > 0)
                rows[count++] = (const char *)dst->buf;
            while (count < MAX_RANKS && k < size)
                rows[count++] = base + header + k++ * block;
            reduce_rows(rows, count, (char *)dst->buf, data / ITEMSIZE[dtype], (int)dtype,
                        (int)op);
        }
    }
    release_buffers(views, 2);
    return differs == -2 ? NULL : PyLong_FromLong(differs);
}

/* put_call(dst, word, src): dst = the 8-byte word (native order), then src's bytes: a
 * rank's block of the mpi transport's small all_reduce, in one call (~0.1 us; numpy's slice
 * assignment took ~0.9 us of a 3 us call). */
static PyObject *put_call(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (!positional("put_call", nargs, 3))
        return NULL;
    uint64_t word = (uint64_t)PyLong_AsUnsignedLongLong(args[1]);
    if (PyErr_Occurred())
        return NULL;
    Py_buffer views[2];
    if (take_buffers((BufferRequest[]){{args[0], PyBUF_WRITABLE}, {args[2], PyBUF_SIMPLE}}, views,
                     2) < 0)
        return NULL;
    const Py_buffer *dst = &views[0], *src = &views[1];
    int fits = dst->len == (Py_ssize_t)sizeof word + src->len;
    if (fits) {
        memcpy(dst->buf, &word, sizeof word);
        memcpy((char *)dst->buf + sizeof word, src->buf, (size_t)src->len);
    }
    release_buffers(views, 2);
    if (!fits) {
        PyErr_SetString(PyExc_ValueError, "dst must hold 8 bytes and src's");
        return NULL;
    }
    Py_RETURN_NONE;
}

/* --- point-to-point: the byte rings of tbcoll/shm/pipe.py (layout and order: shm.h) ---- */

static void ring_copy_in(char *data, Py_ssize_t capacity, uint64_t at, const char *from,
                         Py_ssize_t n)
{
    Py_ssize_t start = (Py_ssize_t)(at % (uint64_t)capacity), first = capacity - start;
    if (first > n)
        first = n;
    memcpy(data + start, from, (size_t)first);
    memcpy(data, from + first, (size_t)(n - first));
}

static void ring_copy_out(const char *data, Py_ssize_t capacity, uint64_t at, char *to,
                          Py_ssize_t n)
{
    Py_ssize_t start = (Py_ssize_t)(at % (uint64_t)capacity), first = capacity - start;
    if (first > n)
        first = n;
    memcpy(to, data + start, (size_t)first);
    memcpy(to + first, data, (size_t)(n - first));
}

/* What a waiting producer or consumer waits for at least: a quarter of the ring (see
 * ring_put), at least a byte, or a ring of fewer than 4 bytes would wait for nothing and spin
 * for ever. */
static Py_ssize_t quarter(Py_ssize_t capacity)
{
    return capacity / 4 > 0 ? capacity / 4 : 1;
}

static const char RING_OUTSIDE[] = "the ring lies outside the segment";

/* The ring at `at` in segment, or NULL (RING_OUTSIDE). */
static char *ring_at(const Py_buffer *segment, Py_ssize_t at, Py_ssize_t capacity)
{
    return ring_inside(at, capacity, segment->len) ? (char *)segment->buf + at : NULL;
}

/* Copy as many of n bytes as there is room for now; returns how many. Safe without the GIL.
 * *head: the ring's head, as this producer last stored it. */
static Py_ssize_t ring_fill(char *ring, Py_ssize_t capacity, uint64_t *head, const char *from,
                            Py_ssize_t n)
{
    Py_ssize_t room = ring_room(ring, capacity), take = n < room ? n : room;
    if (take <= 0)
        return 0;
    ring_copy_in(ring + RING_DATA, capacity, *head, from, take);
    *head += (uint64_t)take;
    __atomic_store_n((uint64_t *)ring, *head, __ATOMIC_RELEASE);  /* the bytes, then head */
    return take;
}

/* Copy n bytes into the ring as room appears, waiting for room at most budget seconds at a
 * time; returns how many went in. Called with the GIL (wait_flags releases it to wait). It
 * waits for a quarter of the ring (or what is left) rather than for any room: copies in
 * pieces of a few bytes, each a cache line bounced between the cores, took 2 MB messages
 * from 4 to 1.8 GB/s. */
Py_ssize_t ring_put(char *ring, Py_ssize_t capacity, const char *from, Py_ssize_t n,
                    double budget)
{
    uint64_t head = own_counter(ring);
    Py_ssize_t done = 0;
    while (done < n) {
        Py_ssize_t want = n - done < quarter(capacity) ? n - done : quarter(capacity);
        if (ring_room(ring, capacity) < want &&
            !wait_flags(ring + RING_LINE, 8, 1, head + (uint64_t)want - (uint64_t)capacity,
                        budget))
            break;
        Py_ssize_t took;
        if (n - done >= NOGIL_BYTES) {
            Py_BEGIN_ALLOW_THREADS
            took = ring_fill(ring, capacity, &head, from + done, n - done);
            Py_END_ALLOW_THREADS
        } else {
            took = ring_fill(ring, capacity, &head, from + done, n - done);
        }
        done += took;
    }
    return done;
}

Py_ssize_t ring_put_message(char *ring, Py_ssize_t capacity, const char *header,
                            Py_ssize_t header_len, const char *payload, Py_ssize_t n,
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
    Py_ssize_t written = ring_put(ring, capacity, header, header_len, budget);
    if (written == header_len)
        written += ring_put(ring, capacity, payload, n, budget);
    return written;
}

/*
 * ring_send(segment, at, capacity, header, payload, budget) -> bytes written
 * The producer writes a message (header, then payload) as room allows, waiting for room at
 * most budget seconds at a time; the caller leaves what did not go in to
 * tbcoll.transports.stream (which reads while it waits: no deadlock when two ranks send each
 * other more than a ring holds).
 */
static PyObject *ring_send(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (!positional("ring_send", nargs, 6))
        return NULL;
    Py_ssize_t at = PyLong_AsSsize_t(args[1]), capacity = PyLong_AsSsize_t(args[2]);
    double budget = PyFloat_AsDouble(args[5]);
    if (PyErr_Occurred())
        return NULL;
    Py_buffer views[3]; /* segment, header, payload */
    if (take_buffers((BufferRequest[]){{args[0], PyBUF_WRITABLE}, {args[3], PyBUF_SIMPLE},
                                       {args[4], PyBUF_SIMPLE}}, views, 3) < 0)
        return NULL;
    const Py_buffer *header = &views[1], *payload = &views[2];
    char *ring = ring_at(&views[0], at, capacity);
    Py_ssize_t written = ring ? ring_put_message(ring, capacity, header->buf, header->len,
                                                 payload->buf, payload->len, budget) : 0;
    release_buffers(views, 3);
    if (!ring) {
        PyErr_SetString(PyExc_ValueError, RING_OUTSIDE);
        return NULL;
    }
    return PyLong_FromSsize_t(written);
}

Py_ssize_t ring_take(char *ring, Py_ssize_t capacity, const void *expected, char *dst,
                     Py_ssize_t len, double budget)
{
    uint64_t tail = own_counter(ring + RING_LINE);
    const char *head_word = ring, *data = ring + RING_DATA;
    uint64_t *tail_word = (uint64_t *)(ring + RING_LINE);
    Py_ssize_t copied = RING_NONE_YET;
    unsigned char header[HEADER_BYTES];
    if (wait_flags(head_word, 8, 1, tail + sizeof header, budget)) {  /* acquire */
        ring_copy_out(data, capacity, tail, (char *)header, sizeof header);
        if (memcmp(header, expected, sizeof header) != 0) {
            copied = RING_ANOTHER_FIRST;
        } else {
            tail += sizeof header;
            copied = 0;
            PyThreadState *saved = len >= NOGIL_BYTES ? PyEval_SaveThread() : NULL;
            while (copied < len) {
                /* acquire: the producer copied the bytes up to head in before storing it */
                uint64_t head = __atomic_load_n((const uint64_t *)head_word, __ATOMIC_ACQUIRE);
                if (head - tail > (uint64_t)capacity) {  /* the peer's counter is not one */
                    copied = RING_OVERWRITTEN;
                    break;
                }
                Py_ssize_t ready = (Py_ssize_t)(head - tail);
                Py_ssize_t want = len - copied < quarter(capacity) ? len - copied
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
                Py_ssize_t take = len - copied < ready ? len - copied : ready;
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

/*
 * ring_recv(segment, at, capacity, header, dst, budget) -> copied
 * The consumer takes the next message if its header is `header` (the stream engine's, see
 * tbcoll/transports/stream.py: context, tag, payload bytes = dst.len, and the call), copying
 * the payload straight into dst; copied as ring_take says (shm.h).
 */
static PyObject *ring_recv(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (!positional("ring_recv", nargs, 6))
        return NULL;
    Py_ssize_t at = PyLong_AsSsize_t(args[1]), capacity = PyLong_AsSsize_t(args[2]);
    double budget = PyFloat_AsDouble(args[5]);
    if (PyErr_Occurred())
        return NULL;
    Py_buffer views[3]; /* segment, expected, dst */
    if (take_buffers((BufferRequest[]){{args[0], PyBUF_WRITABLE}, {args[3], PyBUF_SIMPLE},
                                       {args[4], PyBUF_WRITABLE}}, views, 3) < 0)
        return NULL;
    const Py_buffer *expected = &views[1], *dst = &views[2];
    char *ring = ring_at(&views[0], at, capacity);
    int fits = ring && expected->len == HEADER_BYTES && capacity >= HEADER_BYTES &&
               big_endian((const unsigned char *)expected->buf + HEADER_NBYTES,
                          HEADER_NBYTES_WIDTH) == (uint64_t)dst->len;
    Py_ssize_t copied =
        fits ? ring_take(ring, capacity, expected->buf, dst->buf, dst->len, budget) : 0;
    release_buffers(views, 3);
    if (!fits) {
        PyErr_SetString(PyExc_ValueError, ring ? "the header is not a 32-byte header for dst"
                                               : RING_OUTSIDE);
        return NULL;
    }
    return PyLong_FromSsize_t(copied);
}

static PyObject *set_spin(PyObject *self, PyObject *args)
{
    double seconds;
    if (!PyArg_ParseTuple(args, "d", &seconds))
        return NULL;
    spin_seconds = seconds > 0 ? seconds : 0;
    Py_RETURN_NONE;
}

int cma_move(long pid, uint64_t address, char *buffer, Py_ssize_t len, int write)
{
    int error = ENOSYS;
#if HAVE_CMA
    error = 0;
    Py_ssize_t done = 0;
    Py_BEGIN_ALLOW_THREADS
    while (done < len) {
        struct iovec local = {buffer + done, (size_t)(len - done)};
        struct iovec remote = {(void *)(uintptr_t)(address + (uint64_t)done),
                               (size_t)(len - done)};
        ssize_t moved = write ? process_vm_writev((pid_t)pid, &local, 1, &remote, 1, 0)
                              : process_vm_readv((pid_t)pid, &local, 1, &remote, 1, 0);
        if (moved < 0 && errno == EINTR)
            continue;
        if (moved <= 0) {
            error = moved < 0 ? errno : EFAULT;
            break;
        }
        done += moved;
    }
    Py_END_ALLOW_THREADS
#else
    (void)pid;
    (void)address;
    (void)buffer;
    (void)len;
    (void)write;
#endif
    return error;
}

/* cma_copy(pid, address, buffer, write) -> 0, or the errno that stopped it: cma_move (shm.h)
 * between buffer and `address` in process pid. */
static PyObject *cma_copy(PyObject *self, PyObject *args)
{
    long pid;
    unsigned long long address;
    Py_buffer buffer;
    int write;
    if (!PyArg_ParseTuple(args, "lKw*p", &pid, &address, &buffer, &write))
        return NULL;
    int error = cma_move(pid, address, buffer.buf, buffer.len, write);
    PyBuffer_Release(&buffer);
    return PyLong_FromLong(error);
}

/* address(buffer) -> where buffer's bytes start in this process: what a pulled message's
 * descriptor gives its receiver (tbcoll/transports/stream.py); ~10x cheaper than numpy's
 * ctypes.data. The caller keeps the buffer alive as long as the address is used. */
static PyObject *address(PyObject *self, PyObject *obj)
{
    Py_buffer view;
    if (PyObject_GetBuffer(obj, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    void *start = view.buf;
    PyBuffer_Release(&view);
    return PyLong_FromVoidPtr(start);
}

static PyMethodDef methods[] = {
    {"address", address, METH_O, "Where a buffer's bytes start in this process."},
    {"cma_copy", cma_copy, METH_VARARGS, "Copy bytes from or to another process (Linux)."},
    {"set_spin", set_spin, METH_VARARGS, "Set how many seconds a wait spins before yielding."},
    {"load_acquire", load_acquire, METH_VARARGS, "Load the word at offset with acquire order."},
    {"store_release", store_release, METH_VARARGS, "Store value at offset with release order."},
    {"wait_all", wait_all, METH_VARARGS, "Wait until every flag is >= target (or budget)."},
    {"put_call", (PyCFunction)(void (*)(void))put_call, METH_FASTCALL,
     "Write a call's word and then a buffer's bytes."},
    {"gathered_reduce", (PyCFunction)(void (*)(void))gathered_reduce, METH_FASTCALL,
     "Check gathered calls and reduce the gathered data in rank order."},
    {"ring_send", (PyCFunction)(void (*)(void))ring_send, METH_FASTCALL,
     "Write a message into a point-to-point ring as space allows."},
    {"ring_recv", (PyCFunction)(void (*)(void))ring_recv, METH_FASTCALL,
     "Take the next message from a ring if it is the one expected."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_atomics", NULL, -1, methods};

/* LANE_KINDS: the one-call kinds' names, by code (shm.h) */
static PyObject *lane_kinds(void)
{
#define KIND_NAME(kind, name) name,
    static const char *const names[KINDS] = {SHM_KINDS(KIND_NAME)};
#undef KIND_NAME
    PyObject *kinds = PyTuple_New(ONE_CALL_KINDS);
    for (int k = 0; kinds != NULL && k < ONE_CALL_KINDS; k++) {
        PyObject *name = PyUnicode_FromString(names[k]);
        if (name == NULL)
            Py_CLEAR(kinds);
        else
            PyTuple_SET_ITEM(kinds, k, name);
    }
    return kinds;
}

PyMODINIT_FUNC PyInit__atomics(void)
{
    PyObject *m = PyModule_Create(&module);
    /* the layout Python shares with this file, checked at import by tbcoll/shm/native.py,
     * the lane's kinds by tbcoll/comm.py, and the wire (tbcoll/include/wire.h) by
     * tbcoll/shm/flags.py */
    if (m == NULL || PyModule_AddIntConstant(m, "LINE", LINE) < 0 ||
        PyModule_AddIntConstant(m, "ARRIVE_OFFSET", ARRIVE_OFFSET) < 0 ||
        PyModule_AddIntConstant(m, "DONE_OFFSET", DONE_OFFSET) < 0 ||
        PyModule_AddIntConstant(m, "SIGNATURE_OFFSET", SIGNATURE_OFFSET) < 0 ||
        PyModule_AddIntConstant(m, "RING_CONTROL", RING_DATA) < 0 ||
        PyModule_AddIntConstant(m, "RING_TAIL_OFFSET", RING_LINE) < 0 ||
        PyModule_AddIntConstant(m, "RING_OVERWRITTEN", RING_OVERWRITTEN) < 0 ||
        PyModule_AddIntConstant(m, "MAX_RANKS", MAX_RANKS) < 0 ||
        PyModule_AddIntConstant(m, "HAVE_CMA", HAVE_CMA) < 0 ||
        PyModule_AddIntConstant(m, "ALL_REDUCE", ALL_REDUCE) < 0 ||
        PyModule_AddIntConstant(m, "ALL_GATHER", ALL_GATHER) < 0 ||
        PyModule_AddIntConstant(m, "REDUCE_SCATTER", REDUCE_SCATTER) < 0 ||
        PyModule_AddIntConstant(m, "BROADCAST", BROADCAST) < 0 ||
        PyModule_AddIntConstant(m, "BARRIER", BARRIER) < 0 ||
        PyModule_AddIntConstant(m, "ALL_REDUCE_SPLIT", ALL_REDUCE_SPLIT) < 0 ||
        PyModule_AddObject(m, "LANE_KINDS", lane_kinds()) < 0 ||
        PyModule_AddObject(m, "NOT_IN_HEAP", Py_BuildValue("(ii)", NOT_IN_HEAP_ALLOCATION,
                                                           NOT_IN_HEAP_OFFSET)) < 0 ||
        add_wire(m) < 0 || add_lane_type(m) < 0) {
        Py_XDECREF(m);
        return NULL;
    }
    return m;
}
