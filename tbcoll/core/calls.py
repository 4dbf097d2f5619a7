"""A collective call as every rank can compare it: one 64-bit signature.

Ranks must make the same collective calls in the same order; one that calls all_reduce with
op="max" while the others sum, or with another size, dtype, root or algorithm, would
otherwise get an answer that differs from theirs, or hang. Every transport carries the
signature of the call it serves where it already exchanges something (shm's flag lines, the
header of every message of tcp and of shm's rings, an all-reduce of MPI's beside the call's
own, lanes beside MLX's data), so that a rank meeting another rank's different call raises
a CommError naming both, at that call.

    bits 63..60  collective + 1 (tbcoll.algorithms.COLLECTIVES; never 0: a call is non-zero)
         59..57  algorithm (tbcoll.algorithms.NAMES)
         56..53  dtype + 1 (tbcoll.core.dtypes.DTYPES; 0: no data)
         52..50  op + 1 (tbcoll.core.dtypes.OPS; 0: none)
         49..38  root + 1, modulo 4096 (0: none)
         37..0   bytes of this rank's input, modulo 2**38
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from tbcoll.core.dtypes import DTYPE_CODES, OP_CODES
from tbcoll.core.names import COLLECTIVES, NAMES

_DTYPES = list(DTYPE_CODES)
_OPS = list(OP_CODES)
_BYTES = (1 << 38) - 1
_ROOTS = 1 << 12
NO_CALL = (0, 0)  # (sequence number, signature) of a message that is no collective's


@lru_cache(maxsize=1024)
def signature(collective: str, dtype: np.dtype | None = None, op: str | None = None,
              nbytes: int = 0, root: int = -1, algorithm: str = "native") -> int:
    """The call as one word; equal words are equal calls (up to the bytes and root moduli)."""
    code = -1 if dtype is None else DTYPE_CODES.get(np.dtype(dtype), 14)
    return ((COLLECTIVES.index(collective) + 1) << 60 | NAMES.index(algorithm) << 57
            | (code + 1) << 53 | (0 if op is None else OP_CODES[op] + 1) << 50
            | (root + 1) % _ROOTS << 38 | nbytes & _BYTES)


def render(word: int) -> str:
    """The call a signature stands for, as a user would have written it."""
    collective = COLLECTIVES[(word >> 60) - 1] if 0 < word >> 60 <= len(COLLECTIVES) else "?"
    dtype, op, root = (word >> 53 & 15) - 1, (word >> 50 & 7) - 1, (word >> 38 & _ROOTS - 1) - 1
    algorithm = NAMES[word >> 57 & 7] if (word >> 57 & 7) < len(NAMES) else "?"
    args = []
    if dtype >= 0:
        args.append(f"{_DTYPES[dtype] if dtype < len(_DTYPES) else '?'}, {word & _BYTES} B")
    if op >= 0:
        args.append(f"op={_OPS[op] if op < len(_OPS) else '?'}")
    if root >= 0:
        args.append(f"root={root}")
    args.append(f"algorithm={algorithm}")
    return f"{collective}({', '.join(args)})"


FIELDS = {"collective": (60, 4), "algorithm": (57, 3), "dtype": (53, 4), "op": (50, 3),
          "root": (38, 12), "bytes": (0, 38)}  # name: (lowest bit, bits)


def fields_in(bits: int) -> list[str]:
    """The fields of a signature that these bits touch (e.g. where the ranks' calls differ)."""
    return [name for name, (low, width) in FIELDS.items() if bits >> low & (1 << width) - 1]


MISMATCH_ADVICE = ("every rank must make the same collective calls, with the same sizes, "
                   "dtypes, ops, roots and algorithms, in the same order (TBCOLL_CHECK=1 "
                   "compares shapes too)")


def mismatch(calls: dict[int, tuple[int, int] | int]) -> str:
    """The message for ranks whose calls differ: {rank: (seq, signature) or signature}."""
    parts = []
    for rank in sorted(calls):
        call = calls[rank]
        seq, word = call if isinstance(call, tuple) else (0, call)
        parts.append(f"rank {rank}: {render(word)}" + (f" #{seq}" if seq else ""))
    return f"the ranks' calls do not match ({'; '.join(parts)}); {MISMATCH_ADVICE}"
