"""A collective call as every rank can compare it: one 64-bit signature.

Ranks must make the same collective calls in the same order; one that calls all_reduce with
op="max" while the others sum, or with another size, dtype, root or algorithm, would
otherwise get an answer that differs from theirs, or hang. Every transport carries the
signature of the call it serves where it already exchanges something (shm's flag lines, the
header of every message of tcp and of shm's rings, an all-reduce of MPI's beside the call's
own, lanes beside MLX's data), so that a rank meeting another rank's different call raises
a CommError naming both, at that call.

    bits 63..58  collective + 1 (tbcoll.core.names.COLLECTIVES; never 0: a call is non-zero)
         57..53  algorithm (tbcoll.core.names.NAMES)
         52..49  dtype + 1 (tbcoll.core.dtypes.DTYPES; 0: no data, 15: another dtype)
         48..46  op + 1 (tbcoll.core.dtypes.OPS; 0: none)
         45..34  root + 1, modulo 4096 (0: none)
         33..0   bytes of this rank's input, modulo 2**34 (16 GiB)

FIELDS holds these widths, once: the C side reads them from tbcoll/include/wire.h's WIRE_CALL,
which tbcoll.core.wire_check compares with FIELDS as each extension is imported, and every
name that a field numbers (tbcoll.core.names) must fit it, checked here at import (a 33rd
algorithm or a 64th collective would otherwise write into the next field, and nothing would
say so).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from tbcoll.core.dtypes import DTYPE_CODES, OP_CODES
from tbcoll.core.names import COLLECTIVES, NAMES

_DTYPES = list(DTYPE_CODES)
_OPS = list(OP_CODES)
FIELDS = {"collective": (58, 6), "algorithm": (53, 5), "dtype": (49, 4), "op": (46, 3),
          "root": (34, 12), "bytes": (0, 34)}  # name: (lowest bit, bits), highest first
_OTHER_DTYPE = 14  # the dtype code of an array of none of DTYPES' (15 in the field)


class SignatureFieldsFull(ImportError):
    """More names than their field of the call signature holds."""


def check_fits(fields: dict[str, tuple[int, int]], counts: dict[str, int]) -> None:
    """Raise SignatureFieldsFull unless the fields tile the 64 bits and each field holds the
    largest value written into it (counts: a field's name -> its largest value)."""
    at = 64
    for name, (low, width) in fields.items():
        if low + width != at:
            raise SignatureFieldsFull(f"tbcoll.core.calls.FIELDS: {name} ends at bit "
                                      f"{low + width}, not {at}: the fields must tile 64 bits")
        at = low
        if counts.get(name, 0) >= 1 << width:
            raise SignatureFieldsFull(
                f"the call signature's {name} field has {width} bits, too few for "
                f"{counts[name]}: widen it in tbcoll.core.calls.FIELDS and tbcoll/include/wire.h's "
                "WIRE_CALL together (taking bits from root or bytes)")


check_fits(FIELDS, {"collective": len(COLLECTIVES), "algorithm": len(NAMES) - 1,
                    "dtype": max(len(_DTYPES), _OTHER_DTYPE + 1), "op": len(_OPS)})
_LOW = {name: low for name, (low, _) in FIELDS.items()}
_MASK = {name: (1 << width) - 1 for name, (_, width) in FIELDS.items()}
_BYTES = _MASK["bytes"]
_ROOTS = _MASK["root"] + 1
NO_CALL = (0, 0)  # (sequence number, signature) of a message that is no collective's


@lru_cache(maxsize=1024)
def signature(collective: str, dtype: np.dtype | None = None, op: str | None = None,
              nbytes: int = 0, root: int = -1, algorithm: str = "native") -> int:
    """The call as one word; equal words are equal calls (up to the bytes and root moduli)."""
    code = -1 if dtype is None else DTYPE_CODES.get(np.dtype(dtype), _OTHER_DTYPE)
    return ((COLLECTIVES.index(collective) + 1) << _LOW["collective"]
            | NAMES.index(algorithm) << _LOW["algorithm"] | (code + 1) << _LOW["dtype"]
            | (0 if op is None else OP_CODES[op] + 1) << _LOW["op"]
            | (root + 1) % _ROOTS << _LOW["root"] | nbytes & _BYTES)


def _field(word: int, name: str) -> int:
    return word >> _LOW[name] & _MASK[name]


def render(word: int) -> str:
    """The call a signature stands for, as a user would have written it."""
    code = _field(word, "collective")
    collective = COLLECTIVES[code - 1] if 0 < code <= len(COLLECTIVES) else "?"
    dtype, op = _field(word, "dtype") - 1, _field(word, "op") - 1
    root, algorithm = _field(word, "root") - 1, _field(word, "algorithm")
    algorithm = NAMES[algorithm] if algorithm < len(NAMES) else "?"
    args = []
    if dtype >= 0:
        args.append(f"{_dtype_name(dtype)}, {word & _BYTES} B")
    if op >= 0:
        args.append(f"op={_OPS[op] if op < len(_OPS) else '?'}")
    if root >= 0:
        args.append(f"root={root}")
    args.append(f"algorithm={algorithm}")
    return f"{collective}({', '.join(args)})"


def _dtype_name(code: int) -> str:
    if code < len(_DTYPES):
        return str(_DTYPES[code])
    return "a dtype of its own (structured or unnamed)" if code == _OTHER_DTYPE else "?"


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
