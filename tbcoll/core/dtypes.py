"""The element types and reduction operators that collectives accept."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np

DTYPES: dict[str, np.dtype] = {
    name: np.dtype(t) for name, t in [
        ("float16", np.float16), ("bfloat16", ml_dtypes.bfloat16), ("float32", np.float32),
        ("float64", np.float64), ("int8", np.int8), ("int16", np.int16), ("int32", np.int32),
        ("int64", np.int64), ("uint8", np.uint8),
    ]
}
# Codes by position: the C extensions name dtypes and ops by them (tbcoll/include/wire.h, which
# lists the same names in the same order: tbcoll.core.wire_check compares them at import), and so do
# the TBCOLL_CHECK descriptor and tbcoll.core.calls' signatures.
DTYPE_CODES = {dtype: code for code, dtype in enumerate(DTYPES.values())}

OPS = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}
OP_CODES = {name: code for code, name in enumerate(OPS)}


def check_dtype(dtype: np.dtype) -> np.dtype:
    if dtype not in DTYPE_CODES:
        raise TypeError(f"dtype {dtype} is not supported; use one of {', '.join(DTYPES)}")
    return dtype


def _quiet(ufunc: np.ufunc) -> Callable[..., Any]:
    """ufunc with numpy's floating-point warnings off: inf + -inf is NaN and a float16 sum past
    its range is inf, numpy's answers, which the C reductions give silently (issue 46)."""
    def reduce(*args: Any, **kwargs: Any) -> Any:
        with np.errstate(all="ignore"):
            return ufunc(*args, **kwargs)

    reduce.__name__ = ufunc.__name__
    return reduce


QUIET_OPS = {name: _quiet(ufunc) for name, ufunc in OPS.items()}


def reducer(op: str) -> Callable[..., Any]:
    """op's numpy ufunc, silent (_quiet): called as reduce(acc, incoming, out=acc)."""
    try:
        return QUIET_OPS[op]
    except (KeyError, TypeError):
        raise ValueError(f"op {op!r} is not one of {', '.join(OPS)}") from None
