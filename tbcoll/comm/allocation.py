"""comm.empty's request, as words the ranks compare: every rank must ask for the same shape and
dtype, and where one does not (or asks for something invalid), every rank says which rank
asked for what, rather than some ranks waiting for a partner that never comes."""

from __future__ import annotations

from typing import Any

import numpy as np

from tbcoll.core.dtypes import DTYPE_CODES

MAX_DIMS = 32
_DTYPES = list(DTYPE_CODES)  # by code
_INVALID = 0


def request(shape: Any, dtype: Any) -> tuple[np.ndarray, tuple[int, ...], np.dtype | None,
                                             Exception | None]:
    """The words describing (shape, dtype), the shape and dtype checked, and the error to
    raise on this rank if they are not valid (then the words say only that)."""
    words = np.zeros(3 + MAX_DIMS, np.int64)
    try:
        dims = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
        if not all(isinstance(d, (int, np.integer)) and d >= 0 for d in dims):
            raise ValueError(f"comm.empty: shape must be non-negative ints, got {shape!r}")
        if len(dims) > MAX_DIMS:
            raise ValueError(f"comm.empty: at most {MAX_DIMS} dimensions, got {len(dims)}")
        kind = np.dtype(dtype)
        if kind not in DTYPE_CODES:
            raise TypeError(f"comm.empty: dtype {kind} is not one tbcoll moves; use one of "
                            f"{', '.join(str(d) for d in _DTYPES)}")
    except (TypeError, ValueError) as e:
        return words, (), None, e
    words[:3] = (1, DTYPE_CODES[kind], len(dims))
    words[3:3 + len(dims)] = dims
    return words, tuple(int(d) for d in dims), kind, None


def disagreement(table: np.ndarray) -> str | None:
    """Where the ranks' requests (a row each) differ: a message naming every rank's."""
    if (table == table[0]).all():
        return None
    asked = ", ".join(f"rank {rank} passed {_described(words)}"
                      for rank, words in enumerate(table))
    return (f"comm.empty is collective: every rank must pass the same shape and dtype, but "
            f"{asked}")


def _described(words: np.ndarray) -> str:
    if words[0] == _INVALID:
        return "an invalid shape or dtype"
    dims = tuple(int(d) for d in words[3:3 + words[2]])
    return f"{dims} {_DTYPES[words[1]]}"
