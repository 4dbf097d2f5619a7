/*
 * The shm transport's collective rounds (rounds.h has the protocol): waits for the ranks'
 * flags, the copies into and out of the slots, the reductions in rank order.
 *
 * Pure C: includes rounds.h, flags.h, gil.h, tbcoll/include/reduce.h and the C library.
 */
#include <stdint.h>
#include <string.h>

#include "../../include/reduce.h" /* reduce_rows, ITEMSIZE */
#include "flags.h"
#include "gil.h"
#include "rounds.h"

/* rank k's elements at slots + k * slot_bytes, reduced with op in rank order */
static void reduce_slots(const char *slots, ptrdiff_t slot_bytes, ptrdiff_t size, char *out,
                         ptrdiff_t n, int dtype, int op)
{
    const char *rows[MAX_RANKS];
    for (ptrdiff_t k = 0; k < size; k++)
        rows[k] = slots + k * slot_bytes;
    reduce_rows(rows, size, out, n, dtype, op);
}

/* Whether `count` pieces of `piece` bytes, `stride` bytes apart, lie inside `len` bytes:
 * the stride no less than the piece (nor negative), and no product that could overflow. */
static int strided_fits(ptrdiff_t stride, ptrdiff_t piece, ptrdiff_t count, ptrdiff_t len)
{
    if (piece < 0 || stride < piece || piece > len)
        return 0;
    return count <= 1 || stride <= (len - piece) / (count - 1);
}

int run_round(const Round *r, uint64_t seq, int stage, double budget, uint64_t signature)
{
    const int kind = r->kind;
    const ptrdiff_t item = ITEMSIZE[r->dtype], size = r->size, rank = r->rank;
    /* bytes of this rank's slot that the round fills, and checks that every copy stays
     * inside its buffer */
    ptrdiff_t piece = kind == REDUCE_SCATTER || (kind == BROADCAST && rank != r->root)
                          ? r->dst_len : r->src_len;
    ptrdiff_t filled = kind == REDUCE_SCATTER ? size * piece : kind == BARRIER ? 0 : piece;
    int fits = filled <= r->slot_bytes && piece % item == 0;
    if (kind == ALL_REDUCE || kind == ALL_REDUCE_SPLIT)
        fits = fits && r->dst_len == piece;
    else if (kind == ALL_GATHER)  /* the strides matter only where they are used */
        fits = fits && strided_fits(r->dst_stride, piece, size, r->dst_len);
    else if (kind == REDUCE_SCATTER)
        fits = fits && strided_fits(r->src_stride, piece, size, r->src_len);
    if (!fits)
        return ROUND_MISFIT;
    char *base = r->base, *mine = base + r->slots + rank * r->slot_bytes, *dst = r->dst;
    const char *flag_base = base + r->flags, *src = r->src;
    const ptrdiff_t line = LINE;
    /* Two signature words alternate like the data sets: a rank can be one round ahead, never
     * two (it waits for every flag >= seq-1 first), so round seq's word is not overwritten
     * while a slow rank still reads it. */
    ptrdiff_t signature_at = r->flags + SIGNATURE_OFFSET + (ptrdiff_t)(seq & 1) * 8;
    /* ALL_REDUCE_SPLIT: the bytes [own_lo, own_hi) of the chunk are this rank's to reduce */
    ptrdiff_t n = piece / item, own_lo = rank * n / size * item,
              own_hi = (rank + 1) * n / size * item;
    /* REDUCE_SCATTER: this rank's own piece, read from src where dst is apart from it (the
     * reduction writes dst first). No flag need order it, on ARM64 either: no other rank
     * reads this piece, nor the part of this rank's slot it no longer fills. */
    const char *own_piece = src + rank * r->src_stride;
    uintptr_t own_at = (uintptr_t)own_piece, dst_at = (uintptr_t)dst;
    int own_from_src = kind == REDUCE_SCATTER && (dst_at + (uintptr_t)piece <= own_at ||
                                                  own_at + (uintptr_t)piece <= dst_at);
    if (kind == ALL_REDUCE_SPLIT && stage == ROUND_WAIT_DONE)
        goto collect;
    if (stage == ROUND_WAIT_FREE) {
        if (!wait_flags(flag_base, line, size, seq - 1, budget))
            return ROUND_WAIT_FREE;
        if (kind == ALL_REDUCE_SPLIT) {  /* all but its own part, which it reads from src */
            struct _ts *saved = filled >= NOGIL_BYTES ? PyEval_SaveThread() : NULL;
            memcpy(mine, src, (size_t)own_lo);
            memcpy(mine + own_hi, src + own_hi, (size_t)(piece - own_hi));
            if (saved)
                PyEval_RestoreThread(saved);
        } else if (kind != BARRIER && (kind != BROADCAST || rank == r->root)) {
            ptrdiff_t pieces = kind == REDUCE_SCATTER ? size : 1;
            struct _ts *saved = filled >= NOGIL_BYTES ? PyEval_SaveThread() : NULL;
            for (ptrdiff_t k = 0; k < pieces; k++)
                if (!(own_from_src && k == rank))
                    memcpy(mine + k * piece, src + k * r->src_stride, (size_t)piece);
            if (saved)
                PyEval_RestoreThread(saved);
        }
        /* relaxed: published by the release store of the flag just below, which every reader
         * acquires first; round seq-2's readers of this word are done (every flag >= seq-1) */
        __atomic_store_n((uint64_t *)(base + signature_at + rank * line), signature,
                         __ATOMIC_RELAXED);
        /* release: the slot's bytes and the signature become visible no later than the flag */
        __atomic_store_n((uint64_t *)(base + r->flags + rank * line), seq, __ATOMIC_RELEASE);
        if (kind == BROADCAST && rank == r->root && dst != src)
            /* the root's own result (out may overlap x). The root's slot stays valid for the
             * readers however far the root runs: its next write to this data set comes two
             * rounds on, after the first wait of round seq+2, which needs every rank's flag
             * >= seq+1, stored only after that rank has copied its result out of round seq. */
            memmove(dst, src, (size_t)(r->dst_len < piece ? r->dst_len : piece));
    }
    /* acquire, inside all_reached: everything the flags' writers stored before is visible */
    if (!wait_flags(flag_base, line, size, seq, budget))
        return ROUND_WAIT_ARRIVED;
    /* relaxed: after the acquire of rank k's flag, which its signature's store preceded */
    for (ptrdiff_t k = 0; k < size; k++)
        if (__atomic_load_n((uint64_t *)(base + signature_at + k * line), __ATOMIC_RELAXED) !=
            signature)
            return ROUND_CALLS_DIFFER;
    const char *all = base + r->slots;
    int copies_out = kind != BARRIER && (kind != BROADCAST || rank != r->root);
    ptrdiff_t moved = !copies_out ? 0 : kind == ALL_GATHER ? size * piece : filled;
    struct _ts *saved = moved >= NOGIL_BYTES ? PyEval_SaveThread() : NULL;
    switch (kind) {
    case ALL_REDUCE:
        reduce_slots(all, r->slot_bytes, size, dst, piece / item, r->dtype, r->op);
        break;
    case ALL_GATHER:
        for (ptrdiff_t k = 0; k < size; k++)
            memcpy(dst + k * r->dst_stride, all + k * r->slot_bytes, (size_t)piece);
        break;
    case REDUCE_SCATTER: {
        const char *rows[MAX_RANKS];
        for (ptrdiff_t k = 0; k < size; k++)
            rows[k] = own_from_src && k == rank ? own_piece
                                                : all + k * r->slot_bytes + rank * piece;
        reduce_rows(rows, size, dst, n, r->dtype, r->op);
        break;
    }
    case BROADCAST:
        if (rank != r->root)
            memcpy(dst, all + r->root * r->slot_bytes, (size_t)piece);
        break;
    case ALL_REDUCE_SPLIT: {
        const char *rows[MAX_RANKS];
        for (ptrdiff_t k = 0; k < size; k++)
            rows[k] = (k == rank ? src : all + k * r->slot_bytes) + own_lo;
        reduce_rows(rows, size, (char *)all + size * r->slot_bytes + own_lo,
                    (own_hi - own_lo) / item, r->dtype, r->op);
        break;
    }
    }
    if (saved)
        PyEval_RestoreThread(saved);
    if (kind != ALL_REDUCE_SPLIT)
        return ROUND_DONE;
    /* release: this rank's part of the result area is in place before its DONE flag */
    __atomic_store_n((uint64_t *)(base + r->flags + rank * line + DONE_OFFSET), seq,
                     __ATOMIC_RELEASE);
collect:
    /* acquire: every part another rank stored before its DONE flag is visible */
    if (!wait_flags(flag_base + DONE_OFFSET, line, size, seq, budget))
        return ROUND_WAIT_DONE;
    struct _ts *copying = piece >= NOGIL_BYTES ? PyEval_SaveThread() : NULL;
    memcpy(dst, base + r->slots + size * r->slot_bytes, (size_t)piece);
    if (copying)
        PyEval_RestoreThread(copying);
    return ROUND_DONE;
}
