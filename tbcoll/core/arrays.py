"""numpy and mlx arrays as contiguous numpy buffers, and results back in the caller's kind.

An mlx array is read through its buffer without a copy (np.asarray); bfloat16 has no buffer
format, so it travels as uint16 and is viewed as ml_dtypes.bfloat16. Results for mlx callers
are new mlx arrays: mlx arrays are immutable, so out= is refused for them.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np

from tbcoll.core.dtypes import check_dtype


def _mlx_core() -> Any | None:
    """mlx.core if the caller has imported it (tbcoll never imports mlx by itself)."""
    return sys.modules.get("mlx.core")


def is_mlx(x: object) -> bool:
    mx = _mlx_core()
    return mx is not None and isinstance(x, mx.array)


def _unchanged(result: np.ndarray) -> np.ndarray:
    return result


def to_numpy(x: Any) -> tuple[np.ndarray, Callable[[np.ndarray], Any]]:
    """Return x as a numpy array (no copy where possible) and a function that turns a numpy
    result back into the kind of x."""
    if isinstance(x, (np.ndarray, np.generic)):
        check_dtype(x.dtype)
        return np.asarray(x), _unchanged
    if is_mlx(x):
        mx = _mlx_core()
        if x.dtype == mx.bfloat16:
            array = np.asarray(x.view(mx.uint16)).view(ml_dtypes.bfloat16)
            return array, restorer(True, array.dtype)
        array = np.asarray(x)
        check_dtype(array.dtype)
        return array, mx.array
    raise TypeError(f"expected a numpy or mlx array, got {type(x).__name__}")


def restorer(mlx: bool, dtype: np.dtype) -> Callable[[np.ndarray], Any]:
    """What to_numpy gives with an x of this kind and dtype, for a rank that has none (the
    non-roots of scatter learn both from the root)."""
    if not mlx:
        return _unchanged
    import mlx.core as mx  # the root's x was an mlx array: mlx is installed

    if dtype == ml_dtypes.bfloat16:
        return lambda result: mx.array(result.view(np.uint16)).view(mx.bfloat16)
    return mx.array


def contiguous_flat(array: np.ndarray) -> np.ndarray:
    """A 1-D C-contiguous view of array, copying only if it is not contiguous."""
    return np.ascontiguousarray(array).reshape(-1)


def same_buffer(a: np.ndarray, b: np.ndarray) -> bool:
    """a and b are the same bytes in the same order (the same array, or contiguous views of
    it with the same start and extent)."""
    if a is b:
        return True
    if a.nbytes != b.nbytes or not may_overlap(a, b):  # cheap tests first
        return False
    return (a.flags.c_contiguous and b.flags.c_contiguous
            and a.__array_interface__["data"][0] == b.__array_interface__["data"][0])


def may_overlap(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether a and b may share memory; quick where both own theirs (np.may_share_memory
    alone costs a microsecond, which the latency-critical paths cannot spare)."""
    if a is b:
        return True
    if a.base is None and b.base is None:  # two arrays that own their memory never overlap
        return False
    return bool(np.may_share_memory(a, b))
