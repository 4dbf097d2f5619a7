/*
 * tbcoll.transports.mpi._gathered: the mpi transport's small all_reduce in C. Each rank's
 * block (put_call) is its call's signature and then its data; MPI_Allgather brings every
 * rank's, and gathered_reduce checks that the calls agree and reduces the data in rank order,
 * so that every rank gets the same bits (reduce.h).
 *
 * Includes: Python.h, tbcoll/include/buffers.h, reduce.h and wire_export.h (the codes Python
 * checks at import: tbcoll/transports/mpi/transport.py).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "../../include/buffers.h"
#include "../../include/reduce.h" /* reduce_rows */
#include "../../include/wire_export.h" /* add_wire */

#define BATCH 4096 /* rows reduced at once; a larger world goes on from the result */

/*
 * gathered_reduce(src, block, size, header, dst, dtype, op) -> -1, or a rank
 * src holds size blocks of `block` bytes, one per rank in rank order, each the rank's call
 * (`header` bytes, e.g. its tbcoll.core.calls signature) and then its data. When every header
 * equals the first, dst = the data reduced with op in rank order (every rank that does this
 * gets the same bits, with numpy's semantics: see reduce.h) and the result is -1;
 * else the first rank whose header differs, dst untouched. The mpi transport's small all_reduce
 * (an MPI_Allgather of each rank's call and data) ends here.
 */
static PyObject *gathered_reduce(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs)
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
        /* in rank order, BATCH rows at a time (an mpi world may be larger), each batch
         * after the first going on from the result so far */
        const char *rows[BATCH];
        for (Py_ssize_t k = 0; differs < 0 && k < size;) {
            Py_ssize_t count = 0;
            if (k > 0)
                rows[count++] = (const char *)dst->buf;
            while (count < BATCH && k < size)
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
static PyObject *put_call(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs)
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

static PyMethodDef methods[] = {
    {"put_call", (PyCFunction)(void (*)(void))put_call, METH_FASTCALL,
     "Write a call's word and then a buffer's bytes."},
    {"gathered_reduce", (PyCFunction)(void (*)(void))gathered_reduce, METH_FASTCALL,
     "Check gathered calls and reduce the gathered data in rank order."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, .m_name = "_gathered", .m_size = -1,
                                    .m_methods = methods};

PyMODINIT_FUNC PyInit__gathered(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m == NULL || add_wire(m) < 0) {
        Py_XDECREF(m);
        return NULL;
    }
    return m;
}
