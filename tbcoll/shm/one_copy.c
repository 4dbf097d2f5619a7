/*
 * The shm lane's one-copy all_gather and broadcast (one_copy.h): past the lane's limit, each
 * block copied once, by the kernel (cross-memory attach, cma.c), between the ranks' own
 * buffers, in the rounds that tbcoll/shm/native.py's _one_copy_round runs for it; and the
 * Lane's copies() that native.py's rounds call.
 *
 * Includes: Python.h, tbcoll/include/buffers.h, one_copy.h (lane_base.h), cma.h.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#include "../include/buffers.h"
#include "cma.h"
#include "one_copy.h"

/* Copy n bytes without the GIL. */
static void copy_bytes(char *to, const char *from, Py_ssize_t n)
{
    Py_BEGIN_ALLOW_THREADS
    memcpy(to, from, (size_t)n);
    Py_END_ALLOW_THREADS
}

/*
 * The cross-memory copies of an all_gather or broadcast of n bytes a rank (tbcoll/shm/
 * native.py's _one_copy_round, Attached): table[k] holds where rank k's buffers are (x and
 * result for all_gather, the result for broadcast: address, then two words of comm.empty's),
 * base the segment (its pids). all_gather: every other rank's block from its x, the next
 * rank's first (ranks copying at once read different ranks' memory), and this rank's own into
 * dst; broadcast: the root writes the first 1/p of every other rank's result while each of
 * them reads the rest from the root's, so that every core copies, not the root alone.
 * 0, or the errno of the first copy refused (the others are not made).
 */
static int attached_copies(Lane *self, int kind, long root, const char *src, char *dst,
                           Py_ssize_t n, const int64_t *table, const char *base)
{
    Py_ssize_t size = self->size, rank = self->rank, head = n / size;
    int error = 0;
    if (kind == ALL_GATHER) {
        for (Py_ssize_t i = 1; i <= size; i++) {
            Py_ssize_t k = (rank + i) % size;
            char *block = dst + k * n;
            if (k != rank && !error)
                error = cma_move(pid_of(self, base, k), (uint64_t)table[6 * k], block, n, 0);
            else if (k == rank && block != src)
                copy_bytes(block, src, n);
        }
    } else if (rank == root) {
        for (Py_ssize_t k = 0; k < size && !error; k++)
            if (k != rank)
                error = cma_move(pid_of(self, base, k), (uint64_t)table[3 * k], dst, head, 1);
    } else {
        error = cma_move(pid_of(self, base, root), (uint64_t)table[3 * root] + (uint64_t)head,
                         dst + head, n - head, 0);
    }
    return error;
}

/*
 * copies(kind, src, dst, root, table) -> 0 or an errno: attached_copies, for native.py's
 * _one_copy_round (src: x's bytes, or the result's for broadcast; dst: the result's; table:
 * its int64 array of where every rank's buffers are, size x (2 or 1) x 3).
 */
PyObject *lane_copies(Lane *self, PyObject *args)
{
    int kind;
    long root;
    PyObject *src_obj, *dst_obj, *table_obj;
    if (!PyArg_ParseTuple(args, "iOOlO:copies", &kind, &src_obj, &dst_obj, &root, &table_obj))
        return NULL;
    Py_buffer views[4]; /* src, dst, table, segment */
    if (take_buffers((BufferRequest[]){{src_obj, PyBUF_SIMPLE}, {dst_obj, PyBUF_WRITABLE},
                                       {table_obj, PyBUF_SIMPLE},
                                       {self->segment, PyBUF_SIMPLE}}, views, 4) < 0)
        return NULL;
    int gather = kind == ALL_GATHER;
    Py_ssize_t n = views[0].len;
    int fits = (gather || kind == BROADCAST) &&
               views[2].len == self->size * (gather ? 6 : 3) * (Py_ssize_t)sizeof(int64_t) &&
               (gather ? views[1].len == self->size * n : views[1].len == n) &&
               (gather || (root >= 0 && root < self->size && views[0].buf == views[1].buf));
    int error = fits ? attached_copies(self, kind, root, views[0].buf, views[1].buf, n,
                                       views[2].buf, views[3].buf)
                     : 0;
    release_buffers(views, 4);
    if (!fits) {
        PyErr_SetString(PyExc_ValueError, "bad kind, root, or buffers of other sizes");
        return NULL;
    }
    return PyLong_FromLong(error);
}

/*
 * An all_gather or broadcast of r (x, the result, the call's signature) past the lane's
 * limit, each block copied once, in tbcoll/shm/native.py's rounds for it (_one_copy_round,
 * and its copies: _gather, _spread), so that a rank running those takes part alike: a round
 * in which the ranks give where their buffers are (all_gather: x and result; broadcast: the
 * result, root's x copied there first; none in a comm.empty allocation: attach() is off where
 * this rank's are); the copies (attached_copies); then a round that tells every rank whether
 * every copy went. Where one was refused, CMA goes off (refused()) and the segment's
 * rounds run instead. Why the bytes are whole where they land (ARM64 as x86-64):
 * native.py, _one_copy_round. 0, or -1.
 */
int one_copy(Lane *self, Round *r, char *base, uint64_t signature)
{
    Py_ssize_t size = self->size, rank = self->rank;
    int gather = r->kind == ALL_GATHER;
    Py_ssize_t n = gather ? r->src_len : r->dst_len, buffers = gather ? 2 : 1;
    if (!gather && rank == r->root && r->src != r->dst)
        copy_bytes(r->dst, r->src, n);
    int64_t where[2][3] = {{(int64_t)(uintptr_t)(gather ? r->src : r->dst),
                            NOT_IN_HEAP_ALLOCATION, NOT_IN_HEAP_OFFSET},
                           {(int64_t)(uintptr_t)r->dst, NOT_IN_HEAP_ALLOCATION,
                            NOT_IN_HEAP_OFFSET}}; /* (address, allocation, offset): shm.h */
    int64_t *table = PyMem_New(int64_t, 3 * buffers * size);
    if (table == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t told = buffers * 3 * 8;
    Round tell = {.src = (const char *)where, .src_len = told, .dst = (char *)table,
                  .dst_len = size * told, .dst_stride = told, .kind = ALL_GATHER,
                  .dtype = BYTES_DTYPE};
    if (lane_round(self, &tell, base, signature) < 0) {
        PyMem_Free(table);
        return -1;
    }
    int error = attached_copies(self, r->kind, r->root, gather ? r->src : r->dst, r->dst, n,
                                table, base);
    PyMem_Free(table);
    int64_t everyone = !error;
    Round verdict = {.src = (const char *)&everyone, .src_len = 8, .dst = (char *)&everyone,
                     .dst_len = 8, .kind = ALL_REDUCE, .dtype = self->everyone_dtype,
                     .op = self->everyone_op};
    if (lane_round(self, &verdict, base, 0) < 0)
        return -1;
    if (everyone)
        return 0;
    PyObject *off = PyObject_CallNoArgs(self->refused);
    if (off == NULL)
        return -1;
    Py_DECREF(off);
    Round whole = {.src = gather ? r->src : r->dst, .src_len = n, .dst = r->dst,
                   .dst_len = r->dst_len, .dst_stride = gather ? n : 0, .kind = r->kind,
                   .dtype = BYTES_DTYPE, .root = r->root};
    return lane_rounds(self, &whole, base, signature);
}
