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
#include <sched.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#if defined(__x86_64__) || defined(__i386__)
#define CPU_RELAX() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define CPU_RELAX() __asm__ __volatile__("yield")
#else
#define CPU_RELAX() ((void)0)
#endif

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
/* Spin iterations before yielding: set_spin(0) suits more ranks than cores. */
static int spin_limit = 500;  /* a microsecond or two */

static int wait_flags(const char *base, Py_ssize_t stride, Py_ssize_t count, uint64_t target,
                      double budget)
{
    for (int i = 0; i < spin_limit; i++) {
        if (all_reached(base, stride, count, target))
            return 1;
        CPU_RELAX();
    }
    int done = 0;
    Py_BEGIN_ALLOW_THREADS
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    long nap_ns = 0;
    for (;;) {
        if ((done = all_reached(base, stride, count, target)))
            break;
        clock_gettime(CLOCK_MONOTONIC, &now);
        double waited = (now.tv_sec - start.tv_sec) + 1e-9 * (now.tv_nsec - start.tv_nsec);
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

/* --- element types for the small all-reduce kernel ------------------------------------ */

static float half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, x;
    if (exp == 0) {
        if (man == 0) {
            x = sign;
        } else {  /* subnormal: shift the mantissa up until it is normal */
            int shifts = 0;
            while (!(man & 0x400)) {
                man <<= 1;
                shifts++;
            }
            x = sign | ((uint32_t)(127 - 15 + 1 - shifts) << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 0x1f) {
        x = sign | 0x7f800000 | (man << 13);
    } else {
        x = sign | ((exp - 15 + 127) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &x, 4);
    return f;
}

static uint16_t float_to_half(float f)  /* round to nearest, ties to even, as numpy does */
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000, exp = (x >> 23) & 0xff, man = x & 0x7fffff;
    if (exp == 0xff)
        return (uint16_t)(sign | 0x7c00 | (man ? 0x200 | (man >> 13) : 0));
    int e = (int)exp - 127 + 15;
    if (e >= 0x1f)
        return (uint16_t)(sign | 0x7c00);
    if (e <= 0) {  /* a subnormal half, or zero */
        if (e < -10)
            return (uint16_t)sign;
        man |= 0x800000;
        int shift = 14 - e;
        uint32_t half = man >> shift, rest = man & ((1u << shift) - 1), tie = 1u << (shift - 1);
        if (rest > tie || (rest == tie && (half & 1)))
            half++;
        return (uint16_t)(sign | half);
    }
    uint32_t half = ((uint32_t)e << 10) | (man >> 13), rest = man & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (half & 1)))
        half++;  /* a carry into the exponent is right, up to infinity */
    return (uint16_t)(sign | half);
}

static float bf16_to_float(uint16_t b)
{
    uint32_t x = (uint32_t)b << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

static uint16_t float_to_bf16(float f)  /* round to nearest, ties to even, as ml_dtypes does */
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffff) > 0x7f800000)
        return (uint16_t)((x >> 16) | 0x40);  /* keep NaN a quiet NaN */
    x += 0x7fff + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

/* numpy's semantics: maximum/minimum propagate NaN (the first one); integer sum and product
 * wrap around. On a tie of +0 and -0, numpy's float16 loop keeps a (the _A forms) while its
 * float32/float64 loops and ml_dtypes' bfloat16 give b (the _B forms). */
#define OP_SUM(a, b) ((a) + (b))
#define OP_PROD(a, b) ((a) * (b))
#define OP_MAX_A(a, b) (((a) >= (b) || (a) != (a)) ? (a) : (b))
#define OP_MIN_A(a, b) (((a) <= (b) || (a) != (a)) ? (a) : (b))
#define OP_MAX_B(a, b) (((a) != (a)) ? (a) : ((b) != (b) || (b) >= (a)) ? (b) : (a))
#define OP_MIN_B(a, b) (((a) != (a)) ? (a) : ((b) != (b) || (b) <= (a)) ? (b) : (a))

/* out = slot0 op slot1 op ... in rank order, so every rank computes the same bits; one pass
 * per slot, each a simple loop the compiler can vectorise. */
#define REDUCE(T, ACC, LOAD, STORE, OP)                                                     \
    do {                                                                                    \
        T *o = (T *)out;                                                                    \
        memcpy(o, slots, (size_t)n * sizeof(T));                                            \
        for (Py_ssize_t k = 1; k < size; k++) {                                             \
            const T *in = (const T *)(slots + k * slot_bytes);                              \
            for (Py_ssize_t i = 0; i < n; i++)                                              \
                o[i] = STORE((ACC)OP((ACC)LOAD(o[i]), (ACC)LOAD(in[i])));                   \
        }                                                                                   \
    } while (0)
#define SAME(v) (v)

#define BY_OP(T, ACC, LOAD, STORE, MAX, MIN)                                                \
    switch (op) {                                                                           \
    case 0: REDUCE(T, ACC, LOAD, STORE, OP_SUM); break;                                     \
    case 1: REDUCE(T, ACC, LOAD, STORE, OP_PROD); break;                                    \
    case 2: REDUCE(T, ACC, LOAD, STORE, MAX); break;                                        \
    default: REDUCE(T, ACC, LOAD, STORE, MIN); break;                                       \
    }

/* Reduces 16-bit floats one step at a time with rounding after each, as numpy's loops do. */
#define REDUCE16(TO_F, FROM_F, OP)                                                          \
    do {                                                                                    \
        uint16_t *o = (uint16_t *)out;                                                      \
        memcpy(o, slots, (size_t)n * 2);                                                    \
        for (Py_ssize_t k = 1; k < size; k++) {                                             \
            const uint16_t *in = (const uint16_t *)(slots + k * slot_bytes);                \
            for (Py_ssize_t i = 0; i < n; i++) {                                            \
                float a = TO_F(o[i]), b = TO_F(in[i]);                                      \
                o[i] = FROM_F(OP(a, b));                                                    \
            }                                                                               \
        }                                                                                   \
    } while (0)

#define BY_OP16(TO_F, FROM_F, MAX, MIN)                                                     \
    switch (op) {                                                                           \
    case 0: REDUCE16(TO_F, FROM_F, OP_SUM); break;                                          \
    case 1: REDUCE16(TO_F, FROM_F, OP_PROD); break;                                         \
    case 2: REDUCE16(TO_F, FROM_F, MAX); break;                                             \
    default: REDUCE16(TO_F, FROM_F, MIN); break;                                            \
    }

/* A signed integer type: sum and prod in the unsigned WIDE, max and min as themselves. */
#define BY_INT(T, WIDE)                                                                     \
    do {                                                                                    \
        if (op < 2)                                                                         \
            BY_OP(T, WIDE, SAME, (T), OP_MAX_A, OP_MIN_A)                                   \
        else                                                                                \
            BY_OP(T, T, SAME, SAME, OP_MAX_A, OP_MIN_A)                                     \
    } while (0)

static const Py_ssize_t ITEMSIZE[] = {2, 2, 4, 8, 1, 2, 4, 8, 1};

/* dtype codes follow tbcoll.dtypes.DTYPES; op codes follow tbcoll.dtypes.OPS. */
static void reduce_slots(const char *slots, Py_ssize_t slot_bytes, Py_ssize_t size, char *out,
                         Py_ssize_t n, int dtype, int op)
{
    switch (dtype) {
    case 0: BY_OP16(half_to_float, float_to_half, OP_MAX_A, OP_MIN_A); break;
    case 1: BY_OP16(bf16_to_float, float_to_bf16, OP_MAX_B, OP_MIN_B); break;
    case 2: BY_OP(float, float, SAME, SAME, OP_MAX_B, OP_MIN_B); break;
    case 3: BY_OP(double, double, SAME, SAME, OP_MAX_B, OP_MIN_B); break;
    /* Integers add and multiply in an unsigned type at least as wide as int (no promotion to
     * signed int): wrap-around without undefined behaviour; the low bits are the answer. */
    case 4: BY_INT(int8_t, uint32_t); break;
    case 5: BY_INT(int16_t, uint32_t); break;
    case 6: BY_INT(int32_t, uint32_t); break;
    case 7: BY_INT(int64_t, uint64_t); break;
    default: BY_OP(uint8_t, uint32_t, SAME, (uint8_t), OP_MAX_A, OP_MIN_A); break;
    }
}

/*
 * small_round(segment, flags, line, size, rank, seq, slots, slot_bytes, src, dst,
 *             dtype, op, stage, budget, signature) -> stage
 *
 * One single-pass round of the shm transport (see tbcoll/shm/collectives.py): wait until
 * every rank's ARRIVE flag is >= seq-1 (the data set is free), copy src into this rank's
 * slot, store ARRIVE = seq (release), wait until every flag is >= seq (acquire), then
 * either reduce all slots into dst with op 0..3 (all_reduce), or with op -1 copy every
 * slot into dst one after the other (all_gather: dst holds size times src). stage 1 starts
 * from the beginning, stage 2 resumes at the second wait; the result is 0 when done, else
 * the stage whose wait ran out of budget, or 3 when the ranks' calls differ: each rank puts
 * its call's signature (collective, dtype, op, bytes) in its flag line with its data, and
 * compares everyone's before using anyone's data (see collectives.py, signatures).
 */
#define SIGNATURE_OFFSET 16 /* bytes into a rank's flag line: after ARRIVE and DONE */

static PyObject *small_round(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    /* METH_FASTCALL with plain conversions: this call is on the latency-critical path. */
    if (nargs != 15) {
        PyErr_SetString(PyExc_TypeError, "small_round takes 15 arguments");
        return NULL;
    }
    PyObject *segment_obj = args[0], *src_obj = args[8], *dst_obj = args[9];
    Py_ssize_t flags = PyLong_AsSsize_t(args[1]), line = PyLong_AsSsize_t(args[2]),
               size = PyLong_AsSsize_t(args[3]), rank = PyLong_AsSsize_t(args[4]),
               slots = PyLong_AsSsize_t(args[6]), slot_bytes = PyLong_AsSsize_t(args[7]);
    unsigned long long seq = PyLong_AsUnsignedLongLong(args[5]);
    long dtype = PyLong_AsLong(args[10]), op = PyLong_AsLong(args[11]),
         stage = PyLong_AsLong(args[12]);
    double budget = PyFloat_AsDouble(args[13]);
    uint64_t signature = (uint64_t)PyLong_AsUnsignedLongLong(args[14]);
    if (PyErr_Occurred())
        return NULL;
    if (dtype < 0 || dtype > 8 || op < -1 || op > 3 || size < 1 || rank < 0 || rank >= size ||
        (stage != 1 && stage != 2)) {
        PyErr_SetString(PyExc_ValueError, "bad dtype, op, size, rank or stage");
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
    if (dst.len != (op < 0 ? size : 1) * src.len || src.len > slot_bytes ||
        src.len % ITEMSIZE[dtype] ||
        flags < 0 || flags % 8 || line % 8 || line < SIGNATURE_OFFSET + 16 ||
        flags + size * line > segment.len ||
        slots < 0 || slots + size * slot_bytes > segment.len) {
        PyErr_SetString(PyExc_ValueError, "buffers do not fit the segment");
        goto done;
    }
    char *base = (char *)segment.buf;
    const char *flag_base = base + flags;
    /* Two signature words alternate like the data sets: a rank can be one round ahead, never
     * two (it waits for every flag >= seq-1 first), so round seq's word is not overwritten
     * while a slow rank still reads it. */
    Py_ssize_t signature_at = flags + SIGNATURE_OFFSET + (Py_ssize_t)(seq & 1) * 8;
    if (stage == 1) {
        if (!wait_flags(flag_base, line, size, seq - 1, budget)) {
            result = 1;
            goto done;
        }
        memcpy(base + slots + rank * slot_bytes, src.buf, (size_t)src.len);
        __atomic_store_n((uint64_t *)(base + signature_at + rank * line), signature,
                         __ATOMIC_RELAXED);
        /* release: the slot's bytes and the signature become visible no later than the flag */
        __atomic_store_n((uint64_t *)(base + flags + rank * line), (uint64_t)seq,
                         __ATOMIC_RELEASE);
    }
    if (!wait_flags(flag_base, line, size, seq, budget)) {  /* acquire, inside all_reached */
        result = 2;
        goto done;
    }
    /* after the acquire: every rank's signature for this round is in place */
    for (Py_ssize_t k = 0; k < size; k++) {
        if (__atomic_load_n((uint64_t *)(base + signature_at + k * line), __ATOMIC_RELAXED) !=
            signature) {
            result = 3;
            goto done;
        }
    }
    if (op < 0) {
        for (Py_ssize_t k = 0; k < size; k++)
            memcpy((char *)dst.buf + k * src.len, base + slots + k * slot_bytes, (size_t)src.len);
    } else {
        reduce_slots(base + slots, slot_bytes, size, (char *)dst.buf, src.len / ITEMSIZE[dtype],
                     (int)dtype, (int)op);
    }
    result = 0;
done:
    PyBuffer_Release(&dst);
    PyBuffer_Release(&src);
    PyBuffer_Release(&segment);
    return result < 0 ? NULL : PyLong_FromLong(result);
}

static PyObject *set_spin(PyObject *self, PyObject *args)
{
    int spins;
    if (!PyArg_ParseTuple(args, "i", &spins))
        return NULL;
    spin_limit = spins < 0 ? 0 : spins;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"set_spin", set_spin, METH_VARARGS, "Set how many times a wait polls before yielding."},
    {"load_acquire", load_acquire, METH_VARARGS, "Load the word at offset with acquire order."},
    {"store_release", store_release, METH_VARARGS, "Store value at offset with release order."},
    {"wait_all", wait_all, METH_VARARGS, "Wait until every flag is >= target (or budget)."},
    {"small_round", (PyCFunction)(void (*)(void))small_round, METH_FASTCALL,
     "One single-pass all_reduce or all_gather round."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_atomics", NULL, -1, methods};

PyMODINIT_FUNC PyInit__atomics(void) { return PyModule_Create(&module); }
