/*
 * The one-copy calls' rounds (one_copy.h), written once: each block copied once, between the
 * ranks' own buffers, by their mappings of comm.empty allocations
 * (tbcoll/transports/shm/native.py's copies, called back) or by the kernel (cross-memory attach,
 * cma.c); for native.py's _one_copy_round (the Lane's copy_once()) and for the lane's own
 * all_gather and broadcast past its limit (one_copy).
 *
 * Includes: Python.h, tbcoll/include/buffers.h, one_copy.h (lane_base.h), cma.h.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <string.h>

#include "../../include/buffers.h"
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
 * The copy schedule of a one-copy call, written once: the copies that rank makes, in order,
 * for the kernel's (attached_copies, here) and for Python's through the mappings of
 * comm.empty's allocations (tbcoll/shm/native.py, which calls it as copy_plan()). n: the bytes
 * of a rank's block for all_gather, of the whole buffer for broadcast and all_reduce; item:
 * the element's bytes (all_reduce's parts end on an element). A step names the peer, which of
 * its buffers (0: x, or broadcast's one buffer; 1: the result), where in it, where in this
 * rank's result, how many bytes, and whether this rank writes there (else it reads). A step
 * whose peer is this rank is its own part: all_gather's block copied from x into the result,
 * all_reduce's part that this rank reduces. Into steps (room for size of them): how many.
 *   all_gather: every rank's block, the next rank's first (ranks copying at once read
 *     different ranks' memory), from its x, or from its result where from_results;
 *   broadcast: the root writes the first n / size bytes of every other rank's buffer while
 *     each of them reads the rest from the root's, so that every core copies;
 *   all_reduce: rank k owns bytes [k * count / size, (k + 1) * count / size) elements (count
 *     = n / item); this rank reduces its own part, then reads every other part from its
 *     owner's result, the next rank's first.
 */
Py_ssize_t copy_plan(int kind, Py_ssize_t rank, Py_ssize_t size, Py_ssize_t root, Py_ssize_t n,
                     Py_ssize_t item, int from_results, CopyStep *steps)
{
    Py_ssize_t made = 0, head = n / size, count = n / item;
    if (kind == BROADCAST) {
        for (Py_ssize_t k = 0; k < size && rank == root; k++)
            if (k != root)
                steps[made++] = (CopyStep){k, 0, 0, 0, head, 1};
        if (rank != root)
            steps[made++] = (CopyStep){root, 0, head, head, n - head, 0};
        return made;
    }
    for (Py_ssize_t i = 1; i <= size; i++) {
        Py_ssize_t k = (rank + i) % size;
        if (kind == ALL_GATHER) {
            steps[made++] = (CopyStep){k, from_results, from_results ? k * n : 0, k * n, n, 0};
        } else {
            Py_ssize_t lo = k * count / size * item, hi = (k + 1) * count / size * item;
            steps[made++] = (CopyStep){k, 1, lo, lo, hi - lo, 0};
        }
    }
    return made;
}

/*
 * copy_plan(kind, rank, size, root, nbytes, itemsize, from_results) -> steps
 * The schedule above, as a tuple of (peer, buffer, theirs, mine, nbytes, write).
 */
PyObject *copy_plan_py(PyObject *Py_UNUSED(module), PyObject *args)
{
    int kind, from_results;
    Py_ssize_t rank, size, root, n, item;
    if (!PyArg_ParseTuple(args, "innnnnp:copy_plan", &kind, &rank, &size, &root, &n, &item,
                          &from_results))
        return NULL;
    if (!(kind == ALL_GATHER || kind == BROADCAST || kind == ALL_REDUCE) || size < 1 ||
        size > MAX_RANKS || rank < 0 || rank >= size || n < 0 || item < 1 || n % item ||
        (kind == BROADCAST && (root < 0 || root >= size))) {
        PyErr_SetString(PyExc_ValueError, "copy_plan: a one-copy kind, a rank of size (at most "
                                          "MAX_RANKS), a root of it, and whole elements");
        return NULL;
    }
    CopyStep *steps = PyMem_New(CopyStep, size);
    if (steps == NULL)
        return PyErr_NoMemory();
    Py_ssize_t made = copy_plan(kind, rank, size, root, n, item, from_results, steps);
    PyObject *plan = PyTuple_New(made);
    for (Py_ssize_t i = 0; plan != NULL && i < made; i++) {
        CopyStep *s = &steps[i];
        PyObject *step = Py_BuildValue("(nnnnnO)", s->peer, s->buffer, s->theirs, s->mine,
                                       s->nbytes, s->write ? Py_True : Py_False);
        if (step == NULL)
            Py_CLEAR(plan);
        else
            PyTuple_SET_ITEM(plan, i, step);
    }
    PyMem_Free(steps);
    return plan;
}

/*
 * The cross-memory copies of an all_gather or broadcast (copy_plan's steps, made by the
 * kernel): table[k] holds where rank k's buffers are (x and result for all_gather, the result
 * for broadcast: address, then two words of comm.empty's), base the segment (its pids); this
 * rank's own all_gather block is copied from src. 0, or the errno of the first copy refused
 * (the others are not made).
 */
static int attached_copies(Lane *self, int kind, long root, const char *src, char *dst,
                           Py_ssize_t n, const int64_t *table, const char *base)
{
    Py_ssize_t buffers = kind == ALL_GATHER ? 2 : 1;
    CopyStep *steps = PyMem_New(CopyStep, self->size);
    if (steps == NULL)
        return ENOMEM;
    Py_ssize_t made = copy_plan(kind, self->rank, self->size, root, n, 1, 0, steps);
    int error = 0;
    for (Py_ssize_t i = 0; i < made && !error; i++) {
        CopyStep *s = &steps[i];
        char *mine = dst + s->mine;
        if (s->peer != self->rank) {
            uint64_t theirs = (uint64_t)table[3 * (buffers * s->peer + s->buffer)];
            error = cma_move(pid_of(self, base, s->peer), theirs + (uint64_t)s->theirs, mine,
                             s->nbytes, s->write);
        } else if (mine != src) {
            copy_bytes(mine, src, s->nbytes);
        }
    }
    PyMem_Free(steps);
    return error;
}

/*
 * The rounds of a one-copy call, written here alone (native.py's _one_copy_round and the
 * lane's one_copy run them): a round in which the ranks give where their buffers are (where:
 * this rank's rows, (address, allocation, offset) for each of `buffers` buffers, gathered into
 * table); the copies, by mapped() (Python's, between comm.empty buffers that every rank maps:
 * True where it made them, False where the buffers are not mapped alike) or else, where attach,
 * the kernel's cross-memory attach (attached_copies); then a round that tells every rank
 * whether every copy went. 1: done; 0: neither way applied (then no second round: table is the
 * same on every rank, and so is the choice), or a copy was refused on some rank (CMA is then
 * off: refused()); -1 with an exception. Why the bytes are whole where they land (ARM64 as
 * x86-64): native.py, _one_copy_round.
 */
static int copy_rounds(Lane *self, int kind, long root, const char *src, char *dst, Py_ssize_t n,
                       const int64_t *where, Py_ssize_t buffers, int64_t *table, char *base,
                       uint64_t signature, PyObject *mapped, int attach)
{
    Py_ssize_t told = buffers * 3 * (Py_ssize_t)sizeof(int64_t);
    Round tell = {.src = (const char *)where, .src_len = told, .dst = (char *)table,
                  .dst_len = self->size * told, .dst_stride = told, .kind = ALL_GATHER,
                  .dtype = BYTES_DTYPE};
    if (lane_round(self, &tell, base, signature) < 0)
        return -1;
    int error = -1; /* no copy made */
    if (mapped != NULL) {
        PyObject *made = PyObject_CallNoArgs(mapped);
        int copied = made ? PyObject_IsTrue(made) : -1;
        Py_XDECREF(made);
        if (copied < 0)
            return -1;
        if (copied)
            error = 0;
    }
    if (error < 0 && attach)
        error = attached_copies(self, kind, root, src, dst, n, table, base);
    if (error < 0)
        return 0;
    int64_t everyone = !error;
    Round verdict = {.src = (const char *)&everyone, .src_len = 8, .dst = (char *)&everyone,
                     .dst_len = 8, .kind = ALL_REDUCE, .dtype = self->everyone_dtype,
                     .op = self->everyone_op};
    if (lane_round(self, &verdict, base, 0) < 0)
        return -1;
    if (everyone)
        return 1;
    PyObject *off = PyObject_CallNoArgs(self->refused);
    if (off == NULL)
        return -1;
    Py_DECREF(off);
    return 0;
}

/*
 * copy_once(kind, src, dst, root, where, table, signature, mapped, attach) -> done
 * copy_rounds for native.py's _one_copy_round: all_reduce (src, dst; its copies are mapped()'s
 * alone), all_gather (src, dst) or broadcast (dst, in place) of n bytes a block; where: int64
 * rows, one per buffer; table: room for every rank's (size x rows x 3 int64); mapped: a
 * callable or None.
 */
PyObject *lane_copy_once(Lane *self, PyObject *args)
{
    int kind, attach;
    long root;
    unsigned long long signature;
    PyObject *src_obj, *dst_obj, *where_obj, *table_obj, *mapped;
    if (!PyArg_ParseTuple(args, "iOOlOOKOp:copy_once", &kind, &src_obj, &dst_obj, &root,
                          &where_obj, &table_obj, &signature, &mapped, &attach))
        return NULL;
    Py_buffer views[5]; /* src, dst, where, table, segment */
    if (take_buffers((BufferRequest[]){{src_obj, PyBUF_SIMPLE}, {dst_obj, PyBUF_WRITABLE},
                                       {where_obj, PyBUF_SIMPLE}, {table_obj, PyBUF_WRITABLE},
                                       {self->segment, PyBUF_WRITABLE}}, views, 5) < 0)
        return NULL;
    int gather = kind == ALL_GATHER;
    Py_ssize_t n = gather ? views[0].len : views[1].len, row = 3 * (Py_ssize_t)sizeof(int64_t);
    Py_ssize_t buffers = views[2].len / row;
    int fits = (gather || kind == BROADCAST || kind == ALL_REDUCE) && buffers > 0 &&
               views[2].len == buffers * row && views[3].len == self->size * views[2].len &&
               (!attach || (kind != ALL_REDUCE && buffers == (gather ? 2 : 1))) &&
               (gather ? views[1].len == self->size * n : views[0].len == views[1].len) &&
               (kind != BROADCAST || (root >= 0 && root < self->size)) &&
               (mapped == Py_None || PyCallable_Check(mapped));
    int done = fits ? copy_rounds(self, kind, root, views[0].buf, views[1].buf, n,
                                  views[2].buf, buffers, views[3].buf, views[4].buf,
                                  (uint64_t)signature, mapped == Py_None ? NULL : mapped, attach)
                    : 0;
    release_buffers(views, 5);
    if (!fits) {
        PyErr_SetString(PyExc_ValueError, "copy_once: bad kind, root, rows, or buffers of other "
                                          "sizes");
        return NULL;
    }
    if (done < 0)
        return NULL;
    return PyBool_FromLong(done);
}

/*
 * An all_gather or broadcast of r (x, the result, the call's signature) past the lane's
 * limit, each block copied once by the kernel (copy_rounds; none of the buffers is in a
 * comm.empty allocation: attach() is off where this rank's are), root's x copied into its
 * result first for broadcast; where a copy was refused, the segment's rounds (lane_rounds).
 * 0, or -1.
 */
int one_copy(Lane *self, Round *r, char *base, uint64_t signature)
{
    int gather = r->kind == ALL_GATHER;
    Py_ssize_t n = gather ? r->src_len : r->dst_len, buffers = gather ? 2 : 1;
    if (!gather && self->rank == r->root && r->src != r->dst)
        copy_bytes(r->dst, r->src, n);
    const char *from = gather ? r->src : r->dst;
    int64_t where[2][3] = {{(int64_t)(uintptr_t)from, NOT_IN_HEAP_ALLOCATION, NOT_IN_HEAP_OFFSET},
                           {(int64_t)(uintptr_t)r->dst, NOT_IN_HEAP_ALLOCATION,
                            NOT_IN_HEAP_OFFSET}}; /* (address, allocation, offset): shm.h */
    int64_t *table = PyMem_New(int64_t, 3 * buffers * self->size);
    if (table == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    int done = copy_rounds(self, r->kind, r->root, from, r->dst, n, where[gather ? 0 : 1],
                           buffers, table, base, signature, NULL, 1);
    PyMem_Free(table);
    if (done != 0)
        return done < 0 ? -1 : 0;
    Round whole = {.src = from, .src_len = n, .dst = r->dst, .dst_len = r->dst_len,
                   .dst_stride = gather ? n : 0, .kind = r->kind, .dtype = BYTES_DTYPE,
                   .root = r->root};
    return lane_rounds(self, &whole, base, signature);
}
