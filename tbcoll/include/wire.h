/*
 * The wire that tbcoll's C extensions share with its Python, described once:
 * - the element types' and reductions' codes (tbcoll/core/dtypes.py holds their numpy types, in
 *   this order; a collective's arrays and reductions are named by these codes to C);
 * - the call signature's fields (tbcoll/core/calls.py's FIELDS; C ORs a call's bytes into a
 *   signature Python made less its bytes, so it must know that field's width);
 * - the stream engine's message header and a pulled message's descriptor, and the contexts
 *   of the engine's own messages: written here alone. Python reads these lists from this file
 *   (tbcoll.core.wire_check.read_wire: keep each X(...) on the lines of its #define, its values
 *   literals or this file's names, two joined by | or +), and tbcoll/core/framing.py packs
 *   what they say; shm's moves.c, rings.c and _atomics.c and tcp's exchange.c write, read or
 *   compare them here.
 * Each extension exports this description as its module's WIRE (add_wire, wire_export.h) and
 * tbcoll.core.wire_check compares it with Python's as the extension is imported: a build of
 * another version of this file fails to import, naming what differs, where it would
 * otherwise read other bytes or codes than Python writes without a word.
 *
 * Pure C (no Python.h): the shm transport's pure layer (tbcoll/transports/shm/rings.c, rounds.c)
 * includes it. May include: the C library only.
 */
#ifndef TBCOLL_WIRE_H
#define TBCOLL_WIRE_H

#include <stddef.h> /* ptrdiff_t */
#include <stdint.h>

/* --- element types: X(code, name in tbcoll.core.dtypes.DTYPES, bytes), in code order --------- */
#define WIRE_DTYPES(X)                                                                      \
    X(DTYPE_FLOAT16, "float16", 2) X(DTYPE_BFLOAT16, "bfloat16", 2)                         \
    X(DTYPE_FLOAT32, "float32", 4) X(DTYPE_FLOAT64, "float64", 8) X(DTYPE_INT8, "int8", 1)  \
    X(DTYPE_INT16, "int16", 2) X(DTYPE_INT32, "int32", 4) X(DTYPE_INT64, "int64", 8)        \
    X(DTYPE_UINT8, "uint8", 1)

/* --- reductions: X(code, name in tbcoll.core.dtypes.OPS), in code order ------------------------
 * */
#define WIRE_OPS(X) X(OP_SUM, "sum") X(OP_PROD, "prod") X(OP_MAX, "max") X(OP_MIN, "min")

#define WIRE_CODE(code, ...) code,
enum { WIRE_DTYPES(WIRE_CODE) DTYPES }; /* DTYPES: how many */
enum { WIRE_OPS(WIRE_CODE) OPS };

#define WIRE_ITEMSIZE(code, name, bytes) bytes,
static const ptrdiff_t ITEMSIZE[DTYPES] = {WIRE_DTYPES(WIRE_ITEMSIZE)};

/* --- the call signature: X(field, name in tbcoll.core.calls.FIELDS, lowest bit, bits), highest
 * first; the fields tile the 64 bits (checked below, and by tbcoll.core.calls at import) --- */
#define WIRE_CALL(X)                                                                        \
    X(CALL_COLLECTIVE, "collective", 58, 6) X(CALL_ALGORITHM, "algorithm", 53, 5)           \
    X(CALL_DTYPE, "dtype", 49, 4) X(CALL_OP, "op", 46, 3) X(CALL_ROOT, "root", 34, 12)      \
    X(CALL_BYTES, "bytes", 0, 34)
/* FIELD: its lowest bit; FIELD_BITS: its width */
#define WIRE_CALL_AT(field, name, low, bits) field = low, field##_BITS = bits,
enum { WIRE_CALL(WIRE_CALL_AT) };
#define WIRE_CALL_SUM(field, name, low, bits) +(bits)
_Static_assert(0 WIRE_CALL(WIRE_CALL_SUM) == 64 && CALL_COLLECTIVE + CALL_COLLECTIVE_BITS == 64
                   && CALL_BYTES == 0, "the call signature's fields tile its 64 bits");
/* The bytes of a call as its signature's field holds them (modulo 2^CALL_BYTES_BITS): what C
 * ORs into a signature made less its bytes */
#define CALL_BYTES_OF(n) ((uint64_t)(n) & ((UINT64_C(1) << CALL_BYTES_BITS) - 1))

/* --- the stream engine's messages: X(field, name in stream.py, offset, bytes), big-endian -
 * A message is its header, then its payload (header.nbytes bytes). */
#define WIRE_HEADER(X)                                                                      \
    X(HEADER_CONTEXT, "context", 0, 4) X(HEADER_TAG, "tag", 4, 4)                           \
    X(HEADER_NBYTES, "nbytes", 8, 8) X(HEADER_SEQ, "seq", 16, 8) X(HEADER_CALL, "call", 24, 8)
#define HEADER_BYTES 32
/* A pulled message's announcement carries this as its payload: where the sender's payload
 * is, how large, and the pull id its answer names. */
#define WIRE_DESCRIPTOR(X)                                                                  \
    X(DESCRIPTOR_ADDRESS, "address", 0, 8) X(DESCRIPTOR_NBYTES, "nbytes", 8, 8)             \
    X(DESCRIPTOR_PULL, "pull", 16, 8)
#define DESCRIPTOR_BYTES 24

/* FIELD: its offset; FIELD_WIDTH: its bytes */
#define WIRE_AT(field, name, at, bytes) field = at, field##_WIDTH = bytes,
enum { WIRE_HEADER(WIRE_AT) };
enum { WIRE_DESCRIPTOR(WIRE_AT) };
_Static_assert(HEADER_CALL + HEADER_CALL_WIDTH == HEADER_BYTES, "the header's fields fill it");
_Static_assert(DESCRIPTOR_PULL + DESCRIPTOR_PULL_WIDTH == DESCRIPTOR_BYTES,
               "the descriptor's fields fill it");

/* Contexts with the top bit set carry the engine's own messages (communicators count from
 * 0): X(name in stream.py's CONTEXTS, value). An announcement is the message's header with
 * ANNOUNCE_BIT added to its context, its payload the descriptor; the answer, PULLED_CONTEXT
 * with the pull id as its tag and seq 0 (pulled) or 1 (refused: send it); then a refused
 * message's payload follows as RESENT_CONTEXT, the pull id as its tag. REVOKED_CONTEXT: a
 * revoked communicator's notice (tag: its first context; payload: the notice), which C leaves
 * to the engine as any message it does not expect. */
#define ANNOUNCE_BIT 0x80000000u
#define PULLED_CONTEXT (ANNOUNCE_BIT | 0x40000000u)
#define RESENT_CONTEXT (PULLED_CONTEXT + 1)
#define REVOKED_CONTEXT (PULLED_CONTEXT + 2)
#define WIRE_CONTEXTS(X)                                                                    \
    X("announce", ANNOUNCE_BIT) X("pulled", PULLED_CONTEXT) X("resent", RESENT_CONTEXT)     \
    X("revoked", REVOKED_CONTEXT)
#define PULL_IDS 0xFFFFFFFFu /* pull ids count modulo 2^32 (an answer's tag holds one) */

/* The n-byte big-endian number at p. */
static inline uint64_t big_endian(const unsigned char *p, int n)
{
    uint64_t value = 0;
    for (int i = 0; i < n; i++)
        value = value << 8 | p[i];
    return value;
}

/* Store value at p as an n-byte big-endian number. */
static inline void put_big_endian(unsigned char *p, uint64_t value, int n)
{
    for (int i = n - 1; i >= 0; i--, value >>= 8)
        p[i] = (unsigned char)value;
}

/* A message's header (stream.py's _HEADER packs the same): a user's message or a
 * collective's (seq and call: its call; 0 for none), an announcement of one, an answer that
 * it was pulled. */
static inline void put_header(unsigned char *header, uint32_t context, uint64_t tag,
                              uint64_t nbytes, uint64_t seq, uint64_t call)
{
    put_big_endian(header + HEADER_CONTEXT, context, HEADER_CONTEXT_WIDTH);
    put_big_endian(header + HEADER_TAG, tag, HEADER_TAG_WIDTH);
    put_big_endian(header + HEADER_NBYTES, nbytes, HEADER_NBYTES_WIDTH);
    put_big_endian(header + HEADER_SEQ, seq, HEADER_SEQ_WIDTH);
    put_big_endian(header + HEADER_CALL, call, HEADER_CALL_WIDTH);
}

#endif /* TBCOLL_WIRE_H */
