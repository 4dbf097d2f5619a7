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
#define HAVE_CMA 1
#else
#define HAVE_CMA 0 /* macOS: no call reads another process's memory without privileges */
#endif

#include "cpu_relax.h"

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

static int wait_flags(const char *base, Py_ssize_t stride, Py_ssize_t count, uint64_t target,
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
    if (stride % 8 || count < 0 || offset + (count ? (count - 1) * stride + 8 : 0) > view.len) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "flags lie outside the buffer");
        return NULL;
    }
    int done = wait_flags((const char *)first, stride, count, target, budget);
    PyBuffer_Release(&view);
    return PyBool_FromLong(done);
}

#include "reduce.h" /* reduce_rows, ITEMSIZE */

#define MAX_RANKS 4096 /* of one shm segment: far past the cores of any host */

/* The same, rank k's elements at slots + k * slot_bytes. */
static void reduce_slots(const char *slots, Py_ssize_t slot_bytes, Py_ssize_t size, char *out,
                         Py_ssize_t n, int dtype, int op)
{
    const char *rows[MAX_RANKS];
    for (Py_ssize_t k = 0; k < size; k++)
        rows[k] = slots + k * slot_bytes;
    reduce_rows(rows, size, out, n, dtype, op);
}

/*
 * shm_round(segment, flags, line, size, rank, seq, slots, slot_bytes, src, src_stride,
 *           dst, dst_stride, kind, dtype, op, root, stage, budget, signature) -> stage
 *
 * One round of the shm transport's collectives (see tbcoll/shm/collectives.py): wait until
 * every rank's ARRIVE flag is >= seq-1 (the data set is free), copy this rank's data into its
 * slot, put the call's signature in its flag line, store ARRIVE = seq (release), wait for the
 * flags it needs to reach seq (acquire), compare the signatures, then produce its result:
 *   ALL_REDUCE      src -> slot; dst = all slots reduced with op, in rank order;
 *   ALL_GATHER      src -> slot; slot k -> dst + k * dst_stride (dst.len fits them);
 *   REDUCE_SCATTER  size pieces of dst.len bytes at src + k * src_stride -> slot, one after
 *                   the other, but its own piece, which only this rank reads and reads from
 *                   src (unless dst overlaps it); dst = piece `rank` of every slot reduced, in
 *                   rank order;
 *   BROADCAST       the root: src -> slot (and -> dst if dst is another buffer); the others
 *                   copy the root's slot into dst. Every rank waits for every flag, as in
 *                   the other kinds, to compare every rank's signature: a rank that names
 *                   another root fails the call on every rank (the non-roots arrive before
 *                   they wait, so this costs the root little);
 *   BARRIER         flags only;
 *   ALL_REDUCE_SPLIT  a chunk too large for one rank to reduce alone: rank r owns the
 *                   elements [r*n/size, (r+1)*n/size) of its n; src but its own part ->
 *                   slot; after the wait, the owned part of every slot (its own from src)
 *                   reduced in rank order -> the result area behind the slots, then DONE =
 *                   seq (release: the part is in place before the flag); once every DONE
 *                   flag is seq (acquire), the result area -> dst. The result area of round
 *                   seq is next written in round seq+2, after a wait for every ARRIVE flag
 *                   >= seq+2, stored only by ranks that finished round seq.
 * stage 1 starts from the beginning, stage 2 resumes at the second wait, stage 4 at the wait
 * for the DONE flags (ALL_REDUCE_SPLIT). The result is 0 when done, else the stage whose wait
 * ran out of budget, or 3 when the ranks' calls differ (each rank's signature, a
 * tbcoll.calls word, is compared with every other's before anyone's data is used). Large
 * copies and reductions run without the GIL.
 */
enum { ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, BROADCAST, BARRIER, ALL_REDUCE_SPLIT, KINDS };

/* Whether `count` pieces of `piece` bytes, `stride` bytes apart, lie inside `len` bytes:
 * the stride no less than the piece (nor negative), and no product that could overflow. */
static int strided_fits(Py_ssize_t stride, Py_ssize_t piece, Py_ssize_t count, Py_ssize_t len)
{
    if (piece < 0 || stride < piece || piece > len)
        return 0;
    return count <= 1 || stride <= (len - piece) / (count - 1);
}
/* The layout of a rank's flag line, which tbcoll/shm/native.py checks at import: */
#define LINE 128            /* bytes of a flag line (two cache lines on Apple's cores) */
#define ARRIVE_OFFSET 0     /* the round this rank has arrived at */
#define DONE_OFFSET 8       /* the round whose part of a split all-reduce this rank has done */
#define SIGNATURE_OFFSET 16 /* two signature words, for rounds of each parity */
#define NOGIL_BYTES (32 << 10) /* copies at least this large release the GIL */

static PyObject *shm_round(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    /* METH_FASTCALL with plain conversions: this call is on the latency-critical path. */
    if (nargs != 19) {
        PyErr_SetString(PyExc_TypeError, "shm_round takes 19 arguments");
        return NULL;
    }
    PyObject *segment_obj = args[0], *src_obj = args[8], *dst_obj = args[10];
    Py_ssize_t flags = PyLong_AsSsize_t(args[1]), line = PyLong_AsSsize_t(args[2]),
               size = PyLong_AsSsize_t(args[3]), rank = PyLong_AsSsize_t(args[4]),
               slots = PyLong_AsSsize_t(args[6]), slot_bytes = PyLong_AsSsize_t(args[7]),
               src_stride = PyLong_AsSsize_t(args[9]), dst_stride = PyLong_AsSsize_t(args[11]);
    unsigned long long seq = PyLong_AsUnsignedLongLong(args[5]);
    long kind = PyLong_AsLong(args[12]), dtype = PyLong_AsLong(args[13]),
         op = PyLong_AsLong(args[14]), root = PyLong_AsLong(args[15]),
         stage = PyLong_AsLong(args[16]);
    double budget = PyFloat_AsDouble(args[17]);
    uint64_t signature = (uint64_t)PyLong_AsUnsignedLongLong(args[18]);
    if (PyErr_Occurred())
        return NULL;
    if (kind < 0 || kind >= KINDS || dtype < 0 || dtype > 8 || op < 0 || op > 3 || size < 1 ||
        size > MAX_RANKS || rank < 0 || rank >= size || root < 0 || root >= size ||
        (stage != 1 && stage != 2 && !(stage == 4 && kind == ALL_REDUCE_SPLIT))) {
        PyErr_SetString(PyExc_ValueError, "bad kind, dtype, op, size, rank, root or stage");
        return NULL;
    }
    Py_buffer segment, src, dst;
    if (PyObject_GetBuffer(segment_obj, &segment, PyBUF_WRITABLE) < 0)
        return NULL;
    if (PyObject_GetBuffer(src_obj, &src, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&segment);
        return NULL;
    }
    if (PyObject_GetBuffer(dst_obj, &dst, PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&src);
        PyBuffer_Release(&segment);
        return NULL;
    }
    int result = -1;
    const Py_ssize_t item = ITEMSIZE[dtype];
    /* bytes of this rank's slot that the round fills, and checks that every copy stays
     * inside its buffer */
    Py_ssize_t piece = kind == REDUCE_SCATTER || (kind == BROADCAST && rank != root) ? dst.len
                                                                                   : src.len;
    Py_ssize_t filled = kind == REDUCE_SCATTER ? size * piece : kind == BARRIER ? 0 : piece;
    int fits = filled <= slot_bytes && piece % item == 0;
    if (kind == ALL_REDUCE || kind == ALL_REDUCE_SPLIT)
        fits = fits && dst.len == piece;
    else if (kind == ALL_GATHER)  /* the strides matter only where they are used */
        fits = fits && strided_fits(dst_stride, piece, size, dst.len);
    else if (kind == REDUCE_SCATTER)
        fits = fits && strided_fits(src_stride, piece, size, src.len);
    Py_ssize_t areas = kind == ALL_REDUCE_SPLIT ? size + 1 : size;  /* + the result area */
    if (!fits || flags < 0 || flags % 8 || line != LINE || flags + size * line > segment.len ||
        slots < 0 || slot_bytes < 0 || slots + areas * slot_bytes > segment.len) {
        PyErr_SetString(PyExc_ValueError, "buffers do not fit the segment");
        goto done;
    }
    char *base = (char *)segment.buf, *mine = base + slots + rank * slot_bytes;
    const char *flag_base = base + flags, *src_bytes = (const char *)src.buf;
    char *dst_bytes = (char *)dst.buf;
    /* Two signature words alternate like the data sets: a rank can be one round ahead, never
     * two (it waits for every flag >= seq-1 first), so round seq's word is not overwritten
     * while a slow rank still reads it. */
    Py_ssize_t signature_at = flags + SIGNATURE_OFFSET + (Py_ssize_t)(seq & 1) * 8;
    /* ALL_REDUCE_SPLIT: the bytes [own_lo, own_hi) of the chunk are this rank's to reduce */
    Py_ssize_t n = piece / item, own_lo = rank * n / size * item,
               own_hi = (rank + 1) * n / size * item;
    /* REDUCE_SCATTER: this rank's own piece, read from src where dst is apart from it (the
     * reduction writes dst first). No flag need order it, on ARM64 either: no other rank
     * reads this piece, nor the part of this rank's slot it no longer fills. */
    const char *own_piece = src_bytes + rank * src_stride;
    uintptr_t own_at = (uintptr_t)own_piece, dst_at = (uintptr_t)dst_bytes;
    int own_from_src = kind == REDUCE_SCATTER &&
                       (dst_at + (uintptr_t)piece <= own_at || own_at + (uintptr_t)piece <= dst_at);
    if (kind == ALL_REDUCE_SPLIT && stage == 4)
        goto collect;
    if (stage == 1) {
        if (!wait_flags(flag_base, line, size, seq - 1, budget)) {
            result = 1;
            goto done;
        }
        if (kind == ALL_REDUCE_SPLIT) {  /* all but its own part, which it reads from src */
            PyThreadState *saved = filled >= NOGIL_BYTES ? PyEval_SaveThread() : NULL;
            memcpy(mine, src_bytes, (size_t)own_lo);
            memcpy(mine + own_hi, src_bytes + own_hi, (size_t)(piece - own_hi));
            if (saved)
                PyEval_RestoreThread(saved);
        } else if (kind != BARRIER && (kind != BROADCAST || rank == root)) {
            Py_ssize_t pieces = kind == REDUCE_SCATTER ? size : 1;
            PyThreadState *saved = filled >= NOGIL_BYTES ? PyEval_SaveThread() : NULL;
            for (Py_ssize_t k = 0; k < pieces; k++)
                if (!(own_from_src && k == rank))
                    memcpy(mine + k * piece, src_bytes + k * src_stride, (size_t)piece);
            if (saved)
                PyEval_RestoreThread(saved);
        }
        __atomic_store_n((uint64_t *)(base + signature_at + rank * line), signature,
                         __ATOMIC_RELAXED);
        /* release: the slot's bytes and the signature become visible no later than the flag */
        __atomic_store_n((uint64_t *)(base + flags + rank * line), (uint64_t)seq,
                         __ATOMIC_RELEASE);
        if (kind == BROADCAST && rank == root && dst.buf != src.buf)
            /* the root's own result (out may overlap x). The root's slot stays valid for the
             * readers however far the root runs: its next write to this data set comes two
             * rounds on, after the first wait of round seq+2, which needs every rank's flag
             * >= seq+1, stored only after that rank has copied its result out of round seq. */
            memmove(dst_bytes, src_bytes, (size_t)(dst.len < piece ? dst.len : piece));
    }
    /* acquire, inside all_reached: everything the flags' writers stored before is visible */
    if (!wait_flags(flag_base, line, size, seq, budget)) {
        result = 2;
        goto done;
    }
    for (Py_ssize_t k = 0; k < size; k++) {
        if (__atomic_load_n((uint64_t *)(base + signature_at + k * line), __ATOMIC_RELAXED) !=
            signature) {
            result = 3;
            goto done;
        }
    }
    const char *all = base + slots;
    int copies_out = kind != BARRIER && (kind != BROADCAST || rank != root);
    Py_ssize_t moved = !copies_out ? 0 : kind == ALL_GATHER ? size * piece : filled;
    PyThreadState *saved = moved >= NOGIL_BYTES ? PyEval_SaveThread() : NULL;
    switch (kind) {
    case ALL_REDUCE:
        reduce_slots(all, slot_bytes, size, dst_bytes, piece / item, (int)dtype, (int)op);
        break;
    case ALL_GATHER:
        for (Py_ssize_t k = 0; k < size; k++)
            memcpy(dst_bytes + k * dst_stride, all + k * slot_bytes, (size_t)piece);
        break;
    case REDUCE_SCATTER: {
        const char *rows[MAX_RANKS];
        for (Py_ssize_t k = 0; k < size; k++)
            rows[k] = own_from_src && k == rank ? own_piece
                                                : all + k * slot_bytes + rank * piece;
        reduce_rows(rows, size, dst_bytes, n, (int)dtype, (int)op);
        break;
    }
    case BROADCAST:
        if (rank != root)
            memcpy(dst_bytes, all + root * slot_bytes, (size_t)piece);
        break;
    case ALL_REDUCE_SPLIT: {
        const char *rows[MAX_RANKS];
        for (Py_ssize_t k = 0; k < size; k++)
            rows[k] = (k == rank ? src_bytes : all + k * slot_bytes) + own_lo;
        reduce_rows(rows, size, (char *)all + size * slot_bytes + own_lo,
                    (own_hi - own_lo) / item, (int)dtype, (int)op);
        break;
    }
    }
    if (saved)
        PyEval_RestoreThread(saved);
    if (kind == ALL_REDUCE_SPLIT) {
        /* release: this rank's part of the result area is in place before its DONE flag */
        __atomic_store_n((uint64_t *)(base + flags + rank * line + DONE_OFFSET), (uint64_t)seq,
                         __ATOMIC_RELEASE);
    collect:
        /* acquire: every part another rank stored before its DONE flag is visible */
        if (!wait_flags(flag_base + DONE_OFFSET, line, size, seq, budget)) {
            result = 4;
            goto done;
        }
        PyThreadState *copying = piece >= NOGIL_BYTES ? PyEval_SaveThread() : NULL;
        memcpy(dst_bytes, base + slots + size * slot_bytes, (size_t)piece);
        if (copying)
            PyEval_RestoreThread(copying);
    }
    result = 0;
done:
    PyBuffer_Release(&dst);
    PyBuffer_Release(&src);
    PyBuffer_Release(&segment);
    return result < 0 ? NULL : PyLong_FromLong(result);
}

/*
 * gathered_reduce(src, block, size, header, dst, dtype, op) -> -1, or a rank
 * src holds size blocks of `block` bytes, one per rank in rank order, each the rank's call
 * (`header` bytes, e.g. its tbcoll.calls signature) and then its data. When every header
 * equals the first, dst = the data reduced with op in rank order (every rank that does this
 * gets the same bits, with numpy's semantics: see reduce_slots) and the result is -1; else
 * the first rank whose header differs, dst untouched. The mpi transport's small all_reduce
 * (an MPI_Allgather of each rank's call and data) ends here.
 */
static PyObject *gathered_reduce(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "gathered_reduce takes 7 arguments");
        return NULL;
    }
    Py_ssize_t block = PyLong_AsSsize_t(args[1]), size = PyLong_AsSsize_t(args[2]),
               header = PyLong_AsSsize_t(args[3]);
    long dtype = PyLong_AsLong(args[5]), op = PyLong_AsLong(args[6]);
    if (PyErr_Occurred())
        return NULL;
    if (dtype < 0 || dtype > 8 || op < 0 || op > 3 || size < 1 || header < 0 || block < header) {
        PyErr_SetString(PyExc_ValueError, "bad dtype, op, size, header or block");
        return NULL;
    }
    Py_buffer src, dst;
    if (PyObject_GetBuffer(args[0], &src, PyBUF_SIMPLE) < 0)
        return NULL;
    if (PyObject_GetBuffer(args[4], &dst, PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&src);
        return NULL;
    }
    long differs = -1;
    Py_ssize_t data = block - header;
    if (src.len < size * block || dst.len != data || data % ITEMSIZE[dtype]) {
        PyErr_SetString(PyExc_ValueError, "src does not hold size blocks of dst's bytes");
        differs = -2;
    } else {
        const char *base = (const char *)src.buf;
        for (Py_ssize_t k = 1; k < size && differs < 0; k++)
            if (memcmp(base, base + k * block, (size_t)header) != 0)
                differs = (long)k;
        if (differs < 0)
            reduce_slots(base + header, block, size, (char *)dst.buf, data / ITEMSIZE[dtype],
                         (int)dtype, (int)op);
    }
    PyBuffer_Release(&dst);
    PyBuffer_Release(&src);
    return differs == -2 ? NULL : PyLong_FromLong(differs);
}

/* put_call(dst, word, src): dst = the 8-byte word (native order), then src's bytes: a
 * rank's block of the mpi transport's small all_reduce, in one call (~0.1 us; numpy's slice
 * assignment took ~0.9 us of a 3 us call). */
static PyObject *put_call(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "put_call takes 3 arguments");
        return NULL;
    }
    uint64_t word = (uint64_t)PyLong_AsUnsignedLongLong(args[1]);
    if (PyErr_Occurred())
        return NULL;
    Py_buffer dst, src;
    if (PyObject_GetBuffer(args[0], &dst, PyBUF_WRITABLE) < 0)
        return NULL;
    if (PyObject_GetBuffer(args[2], &src, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&dst);
        return NULL;
    }
    int fits = dst.len == (Py_ssize_t)sizeof word + src.len;
    if (fits) {
        memcpy(dst.buf, &word, sizeof word);
        memcpy((char *)dst.buf + sizeof word, src.buf, (size_t)src.len);
    }
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    if (!fits) {
        PyErr_SetString(PyExc_ValueError, "dst must hold 8 bytes and src's");
        return NULL;
    }
    Py_RETURN_NONE;
}

/* --- point-to-point: the byte rings of tbcoll/shm/pipe.py -------------------------------
 *
 * A ring at `at` in the segment: the producer's head counter (u64), a line further the
 * consumer's tail counter, two lines further `capacity` bytes of data; byte k of the stream
 * lives at data[k % capacity]. The producer copies bytes in, then stores head (release); the
 * consumer loads head (acquire) before copying them out, then stores tail (release); the
 * producer loads tail (acquire) before reusing space. Both counters only grow.
 */
#define RING_LINE 128
#define RING_DATA (2 * RING_LINE)

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

static int ring_at(PyObject *obj, Py_buffer *view, Py_ssize_t at, Py_ssize_t capacity,
                   char **ring)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_WRITABLE) < 0)
        return -1;
    if (at < 0 || at % 8 || capacity <= 0 || at + RING_DATA + capacity > view->len) {
        PyBuffer_Release(view);
        PyErr_SetString(PyExc_ValueError, "the ring lies outside the segment");
        return -1;
    }
    *ring = (char *)view->buf + at;
    return 0;
}

/* Copy as many of n bytes as there is room for now; returns how many. Safe without the GIL. */
static Py_ssize_t ring_fill(char *ring, Py_ssize_t capacity, uint64_t *head, const char *from,
                            Py_ssize_t n)
{
    uint64_t tail = __atomic_load_n((uint64_t *)(ring + RING_LINE), __ATOMIC_ACQUIRE);
    Py_ssize_t room = capacity - (Py_ssize_t)(*head - tail), take = n < room ? n : room;
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
static Py_ssize_t ring_put(char *ring, Py_ssize_t capacity, uint64_t *head, const char *from,
                           Py_ssize_t n, double budget)
{
    Py_ssize_t done = 0;
    while (done < n) {
        Py_ssize_t want = n - done < quarter(capacity) ? n - done : quarter(capacity);
        uint64_t tail = __atomic_load_n((uint64_t *)(ring + RING_LINE), __ATOMIC_ACQUIRE);
        if (capacity - (Py_ssize_t)(*head - tail) < want &&
            !wait_flags(ring + RING_LINE, 8, 1, *head + (uint64_t)want - (uint64_t)capacity,
                        budget))
            break;
        Py_ssize_t took;
        if (n - done >= NOGIL_BYTES) {
            Py_BEGIN_ALLOW_THREADS
            took = ring_fill(ring, capacity, head, from + done, n - done);
            Py_END_ALLOW_THREADS
        } else {
            took = ring_fill(ring, capacity, head, from + done, n - done);
        }
        done += took;
    }
    return done;
}

/*
 * ring_send(segment, at, capacity, head, header, payload, budget) -> head
 * The producer writes a message (header, then payload) as room allows, waiting for room at
 * most budget seconds at a time; the caller sees from the new head how much went in and
 * leaves the rest to tbcoll.transports.stream (which reads while it waits: no deadlock when
 * two ranks send each other more than a ring holds).
 */
static PyObject *ring_send(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "ring_send takes 7 arguments");
        return NULL;
    }
    Py_ssize_t at = PyLong_AsSsize_t(args[1]), capacity = PyLong_AsSsize_t(args[2]);
    uint64_t head = (uint64_t)PyLong_AsUnsignedLongLong(args[3]);
    double budget = PyFloat_AsDouble(args[6]);
    if (PyErr_Occurred())
        return NULL;
    Py_buffer segment, header, payload;
    char *ring;
    if (ring_at(args[0], &segment, at, capacity, &ring) < 0)
        return NULL;
    if (PyObject_GetBuffer(args[4], &header, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&segment);
        return NULL;
    }
    if (PyObject_GetBuffer(args[5], &payload, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&header);
        PyBuffer_Release(&segment);
        return NULL;
    }
    if (ring_put(ring, capacity, &head, header.buf, header.len, budget) == header.len)
        ring_put(ring, capacity, &head, payload.buf, payload.len, budget);
    PyBuffer_Release(&payload);
    PyBuffer_Release(&header);
    PyBuffer_Release(&segment);
    return PyLong_FromUnsignedLongLong(head);
}

static uint64_t big_endian(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v = v << 8 | p[i];
    return v;
}

/*
 * ring_recv(segment, at, capacity, tail, header, dst, budget) -> (tail, copied)
 * The consumer takes the next message if its header is `header` (the stream engine's, see
 * tbcoll/transports/stream.py: context, tag, payload bytes = dst.len, and the call), copying
 * the payload straight into dst. copied is -1 when no whole header came within budget, -2 when
 * the next message is another one (nothing is consumed: the stream engine takes it and says
 * what differs), -3 when the producer's counter says more bytes are waiting than the ring
 * holds (the segment was overwritten: nothing is copied), else how many payload bytes
 * arrived (all of them unless the budget ran out).
 */
#define HEADER_BYTES 32

static PyObject *ring_recv(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "ring_recv takes 7 arguments");
        return NULL;
    }
    Py_ssize_t at = PyLong_AsSsize_t(args[1]), capacity = PyLong_AsSsize_t(args[2]);
    uint64_t tail = (uint64_t)PyLong_AsUnsignedLongLong(args[3]);
    double budget = PyFloat_AsDouble(args[6]);
    if (PyErr_Occurred())
        return NULL;
    Py_buffer segment, expected, dst;
    char *ring;
    if (ring_at(args[0], &segment, at, capacity, &ring) < 0)
        return NULL;
    if (PyObject_GetBuffer(args[4], &expected, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&segment);
        return NULL;
    }
    if (PyObject_GetBuffer(args[5], &dst, PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&expected);
        PyBuffer_Release(&segment);
        return NULL;
    }
    if (expected.len != HEADER_BYTES || capacity < HEADER_BYTES ||
        big_endian((const unsigned char *)expected.buf + 8, 8) != (uint64_t)dst.len) {
        PyBuffer_Release(&dst);
        PyBuffer_Release(&expected);
        PyBuffer_Release(&segment);
        PyErr_SetString(PyExc_ValueError, "the header is not a 32-byte header for dst");
        return NULL;
    }
    const char *head_word = ring, *data = ring + RING_DATA;
    uint64_t *tail_word = (uint64_t *)(ring + RING_LINE);
    Py_ssize_t copied = -1;
    unsigned char header[HEADER_BYTES];
    if (wait_flags(head_word, 8, 1, tail + sizeof header, budget)) {  /* acquire */
        ring_copy_out(data, capacity, tail, (char *)header, sizeof header);
        if (memcmp(header, expected.buf, sizeof header) != 0) {
            copied = -2;
        } else {
            tail += sizeof header;
            copied = 0;
            PyThreadState *saved = dst.len >= NOGIL_BYTES ? PyEval_SaveThread() : NULL;
            while (copied < dst.len) {
                uint64_t head = __atomic_load_n((const uint64_t *)head_word, __ATOMIC_ACQUIRE);
                if (head - tail > (uint64_t)capacity) {  /* the peer's counter is not one */
                    copied = -3;
                    break;
                }
                Py_ssize_t ready = (Py_ssize_t)(head - tail);
                Py_ssize_t want = dst.len - copied < quarter(capacity) ? dst.len - copied
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
                Py_ssize_t take = dst.len - copied < ready ? dst.len - copied : ready;
                ring_copy_out(data, capacity, tail, (char *)dst.buf + copied, take);
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
    PyBuffer_Release(&dst);
    PyBuffer_Release(&expected);
    PyBuffer_Release(&segment);
    return Py_BuildValue("(Kn)", (unsigned long long)tail, copied);
}

static PyObject *set_spin(PyObject *self, PyObject *args)
{
    double seconds;
    if (!PyArg_ParseTuple(args, "d", &seconds))
        return NULL;
    spin_seconds = seconds > 0 ? seconds : 0;
    Py_RETURN_NONE;
}

/*
 * cma_copy(pid, address, buffer, write) -> 0, or the errno that stopped it
 *
 * Copy len(buffer) bytes between `address` in process `pid` (a rank of the same user on this
 * host) and buffer: from there into buffer, or with write true from buffer to there. Linux's
 * cross-memory attach: one copy, by the kernel, without the GIL. The caller orders it with
 * the other rank's flags (see tbcoll/shm/native.py, _one_copy_round): bytes read were stored by
 * their owner before the release store of a flag that this rank acquired, and bytes written
 * are published by this rank's own release store of a flag after the call returns. EPERM: a
 * policy (Yama's ptrace_scope, a seccomp filter) forbids it; ESRCH: pid is gone; ENOSYS
 * where the platform has no such call.
 */
static PyObject *cma_copy(PyObject *self, PyObject *args)
{
    long pid;
    unsigned long long address;
    Py_buffer buffer;
    int write;
    if (!PyArg_ParseTuple(args, "lKw*p", &pid, &address, &buffer, &write))
        return NULL;
    int error = ENOSYS;
#if HAVE_CMA
    error = 0;
    Py_ssize_t done = 0;
    Py_BEGIN_ALLOW_THREADS
    while (done < buffer.len) {
        struct iovec local = {(char *)buffer.buf + done, (size_t)(buffer.len - done)};
        struct iovec remote = {(void *)(uintptr_t)(address + (unsigned long long)done),
                               (size_t)(buffer.len - done)};
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
    (void)write;
#endif
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
    {"shm_round", (PyCFunction)(void (*)(void))shm_round, METH_FASTCALL,
     "One round of a native shm collective."},
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

PyMODINIT_FUNC PyInit__atomics(void)
{
    PyObject *m = PyModule_Create(&module);
    /* the layout Python shares with this file, checked at import by tbcoll/shm/native.py */
    if (m == NULL || PyModule_AddIntConstant(m, "LINE", LINE) < 0 ||
        PyModule_AddIntConstant(m, "ARRIVE_OFFSET", ARRIVE_OFFSET) < 0 ||
        PyModule_AddIntConstant(m, "DONE_OFFSET", DONE_OFFSET) < 0 ||
        PyModule_AddIntConstant(m, "SIGNATURE_OFFSET", SIGNATURE_OFFSET) < 0 ||
        PyModule_AddIntConstant(m, "RING_CONTROL", RING_DATA) < 0 ||
        PyModule_AddIntConstant(m, "RING_TAIL_OFFSET", RING_LINE) < 0 ||
        PyModule_AddIntConstant(m, "HEADER_BYTES", HEADER_BYTES) < 0 ||
        PyModule_AddIntConstant(m, "MAX_RANKS", MAX_RANKS) < 0 ||
        PyModule_AddIntConstant(m, "HAVE_CMA", HAVE_CMA) < 0 ||
        PyModule_AddIntConstant(m, "ALL_REDUCE", ALL_REDUCE) < 0 ||
        PyModule_AddIntConstant(m, "ALL_GATHER", ALL_GATHER) < 0 ||
        PyModule_AddIntConstant(m, "REDUCE_SCATTER", REDUCE_SCATTER) < 0 ||
        PyModule_AddIntConstant(m, "BROADCAST", BROADCAST) < 0 ||
        PyModule_AddIntConstant(m, "BARRIER", BARRIER) < 0 ||
        PyModule_AddIntConstant(m, "ALL_REDUCE_SPLIT", ALL_REDUCE_SPLIT) < 0) {
        Py_XDECREF(m);
        return NULL;
    }
    return m;
}
