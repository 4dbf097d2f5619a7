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
 * wait_all(buffer, offset, stride, count, target, budget_s) -> bool
 * Wait until the count words at offset, offset+stride, ... are all >= target, for at most
 * budget_s seconds. Returns False when the budget ran out, so that the caller can look for
 * dead peers and its own deadline between slices.
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
    const char *base = (const char *)first;
    int done = 0;
    for (int i = 0; i < 2000 && !done; i++) {  /* a few microseconds of spinning */
        done = all_reached(base, stride, count, target);
        if (!done)
            CPU_RELAX();
    }
    if (!done) {
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
            if (waited < 50e-6) {
                sched_yield();  /* let a rank that shares our core run */
            } else {
                nap_ns = nap_ns ? (nap_ns * 2 > 1000000 ? 1000000 : nap_ns * 2) : 20000;
                struct timespec nap = {0, nap_ns};
                nanosleep(&nap, NULL);
            }
        }
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&view);
    return PyBool_FromLong(done);
}

static PyMethodDef methods[] = {
    {"load_acquire", load_acquire, METH_VARARGS, "Load the word at offset with acquire order."},
    {"store_release", store_release, METH_VARARGS, "Store value at offset with release order."},
    {"wait_all", wait_all, METH_VARARGS, "Wait until every flag is >= target (or budget)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_atomics", NULL, -1, methods};

PyMODINIT_FUNC PyInit__atomics(void) { return PyModule_Create(&module); }
