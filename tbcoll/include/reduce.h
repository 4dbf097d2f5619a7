/*
 * Reduction kernels with numpy's semantics, shared by tbcoll's C extensions (the shm
 * transport's rounds, the rdma transport's mesh): reduce_rows(rows, size, out, n, dtype, op)
 * reduces rank k's n elements at rows[k], in rank order, into out; dtype and op are wire.h's
 * codes.
 */
#ifndef TBCOLL_REDUCE_H
#define TBCOLL_REDUCE_H
#include <stddef.h> /* ptrdiff_t */
#include <stdint.h>
#include <string.h>

#include "wire.h" /* DTYPE_*, OP_*, ITEMSIZE */

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
#define PLUS(a, b) ((a) + (b))
#define TIMES(a, b) ((a) * (b))
#define MAX_A(a, b) (((a) >= (b) || (a) != (a)) ? (a) : (b))
#define MIN_A(a, b) (((a) <= (b) || (a) != (a)) ? (a) : (b))
#define MAX_B(a, b) (((a) != (a)) ? (a) : ((b) != (b) || (b) >= (a)) ? (b) : (a))
#define MIN_B(a, b) (((a) != (a)) ? (a) : ((b) != (b) || (b) <= (a)) ? (b) : (a))

/* out = slot0 op slot1 op ... in rank order, so every rank computes the same bits; one pass
 * per slot past the second, each a simple loop the compiler can vectorise. The first pass
 * reads two rows (a copy of row 0, then a pass over out, moved out twice: 16 MB of float32
 * took 3.7 ms that way against numpy's 2.4). out may be rows[0] or rows[1]: the first pass
 * reads both at an index before it writes there. */
#define REDUCE(T, ACC, LOAD, STORE, OP)                                                     \
    do {                                                                                    \
        T *o = (T *)out;                                                                    \
        const T *first = (const T *)rows[0], *second = (const T *)rows[size > 1];           \
        if (size == 1) {                                                                    \
            memmove(o, first, (size_t)n * sizeof(T));                                       \
            break;                                                                          \
        }                                                                                   \
        for (ptrdiff_t i = 0; i < n; i++)                                                   \
            o[i] = STORE((ACC)OP((ACC)LOAD(first[i]), (ACC)LOAD(second[i])));               \
        for (ptrdiff_t k = 2; k < size; k++) {                                              \
            const T *in = (const T *)rows[k];                                               \
            for (ptrdiff_t i = 0; i < n; i++)                                               \
                o[i] = STORE((ACC)OP((ACC)LOAD(o[i]), (ACC)LOAD(in[i])));                   \
        }                                                                                   \
    } while (0)
#define SAME(v) (v)

#define BY_OP(T, ACC, LOAD, STORE, MAX, MIN)                                                \
    switch (op) {                                                                           \
    case OP_SUM: REDUCE(T, ACC, LOAD, STORE, PLUS); break;                                  \
    case OP_PROD: REDUCE(T, ACC, LOAD, STORE, TIMES); break;                                \
    case OP_MAX: REDUCE(T, ACC, LOAD, STORE, MAX); break;                                   \
    default: REDUCE(T, ACC, LOAD, STORE, MIN); break; /* OP_MIN */                          \
    }

/* Reduces 16-bit floats one step at a time with rounding after each, as numpy's loops do
 * (the passes as REDUCE's). */
#define REDUCE16(TO_F, FROM_F, OP)                                                          \
    do {                                                                                    \
        uint16_t *o = (uint16_t *)out;                                                      \
        const uint16_t *first = (const uint16_t *)rows[0];                                  \
        if (size == 1) {                                                                    \
            memmove(o, first, (size_t)n * 2);                                               \
            break;                                                                          \
        }                                                                                   \
        for (ptrdiff_t k = 1; k < size; k++) {                                              \
            const uint16_t *a = k == 1 ? first : o, *in = (const uint16_t *)rows[k];        \
            for (ptrdiff_t i = 0; i < n; i++) {                                             \
                float x = TO_F(a[i]), y = TO_F(in[i]);                                      \
                o[i] = FROM_F(OP(x, y));                                                    \
            }                                                                               \
        }                                                                                   \
    } while (0)

#define BY_OP16(TO_F, FROM_F, MAX, MIN)                                                     \
    switch (op) {                                                                           \
    case OP_SUM: REDUCE16(TO_F, FROM_F, PLUS); break;                                       \
    case OP_PROD: REDUCE16(TO_F, FROM_F, TIMES); break;                                     \
    case OP_MAX: REDUCE16(TO_F, FROM_F, MAX); break;                                        \
    default: REDUCE16(TO_F, FROM_F, MIN); break; /* OP_MIN */                               \
    }

/* A signed integer type: sum and prod in the unsigned WIDE, max and min as themselves. */
#define BY_INT(T, WIDE)                                                                     \
    do {                                                                                    \
        if (op <= OP_PROD) /* OP_SUM or OP_PROD, the first codes */                     \
            BY_OP(T, WIDE, SAME, (T), MAX_A, MIN_A)                                         \
        else                                                                                \
            BY_OP(T, T, SAME, SAME, MAX_A, MIN_A)                                           \
    } while (0)

/* out = rows[0] op rows[1] op ... in rank order (rows[k]: rank k's n elements); dtype and op:
 * wire.h's codes. out may be rows[0] or rows[1], and no other row; size >= 1. */
static void reduce_rows(const char *const *rows, ptrdiff_t size, char *out, ptrdiff_t n,
                        int dtype, int op)
{
    switch (dtype) {
    case DTYPE_FLOAT16: BY_OP16(half_to_float, float_to_half, MAX_A, MIN_A); break;
    case DTYPE_BFLOAT16: BY_OP16(bf16_to_float, float_to_bf16, MAX_B, MIN_B); break;
    case DTYPE_FLOAT32: BY_OP(float, float, SAME, SAME, MAX_B, MIN_B); break;
    case DTYPE_FLOAT64: BY_OP(double, double, SAME, SAME, MAX_B, MIN_B); break;
    /* Integers add and multiply in an unsigned type at least as wide as int (no promotion to
     * signed int): wrap-around without undefined behaviour; the low bits are the answer. */
    case DTYPE_INT8: BY_INT(int8_t, uint32_t); break;
    case DTYPE_INT16: BY_INT(int16_t, uint32_t); break;
    case DTYPE_INT32: BY_INT(int32_t, uint32_t); break;
    case DTYPE_INT64: BY_INT(int64_t, uint64_t); break;
    default: BY_OP(uint8_t, uint32_t, SAME, (uint8_t), MAX_A, MIN_A); break; /* UINT8 */
    }
}

#endif /* TBCOLL_REDUCE_H */
