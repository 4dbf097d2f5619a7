"""A collective's test parameters: the Case each rank runs and what it must get back.

A descriptor's `cases(rank, size)` yields them; tests/spmd/test_descriptors.py runs every
registered descriptor's cases with each algorithm the communicator has, on whatever transport
the job runs (shm, tcp, mpi, mlx, or a registered one), and compares bit for bit. Inputs are
small integers, so every dtype holds every partial result exactly and the order in which an
algorithm reduces cannot change the answer; any rank can compute any other's.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tbcoll.core.dtypes import DTYPES, OPS

BIG_BYTES = 3 << 20  # "several MB": an all_reduce of it crosses shm's segments
BIG_DTYPES = ("float32", "bfloat16", "int8")
# the span of the values each op gets: products and sums of a few ranks stay exact in int8
_PERIOD = 7877
_RANGES = {"sum": (-4, 4), "prod": (-2, 2), "max": (-100, 100), "min": (-100, 100)}


@dataclass
class Case:
    """One call: comm.collective(name, *args, algorithm=..., **kwargs) on this rank, which must
    return expected (arrays bit for bit, None, or a tuple of them), or raise ValueError
    matching `raises`."""

    label: str
    args: tuple
    expected: Any = None
    kwargs: dict = field(default_factory=dict)
    algorithms: tuple[str, ...] | None = None  # only these (None: every one it has)
    raises: str = ""
    returns_out: bool = False  # the result is kwargs["out"] itself


def values(rank: int, count: int, dtype: Any, op: str = "sum", salt: int = 0) -> np.ndarray:
    """What rank contributes: a fresh copy (a case may write into it)."""
    return _values(rank, count, np.dtype(dtype), op, salt).copy()


def reduction(size: int, count: int, dtype: Any, op: str, salt: int = 0) -> np.ndarray:
    """op over every rank's values, in rank order."""
    return _reduction(size, count, np.dtype(dtype), op, salt).copy()


def counts(size: int) -> list[int]:
    """Element counts worth testing: empty, one, p-1, a prime."""
    return sorted({0, 1, size - 1, 1009})


def dtypes() -> list[np.dtype]:
    return list(DTYPES.values())


def same(got: Any, want: Any) -> bool:
    """got equals want: arrays of one dtype and shape with the same bytes, Nones, tuples."""
    if want is None or got is None:
        return got is want
    if isinstance(want, tuple):
        return (isinstance(got, tuple) and len(got) == len(want)
                and all(same(g, w) for g, w in zip(got, want, strict=True)))
    got, want = np.asarray(got), np.asarray(want)
    return (got.dtype == want.dtype and got.shape == want.shape
            and np.array_equal(_bytes(got), _bytes(want)))


def _bytes(array: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8)


@functools.lru_cache(maxsize=512)  # every algorithm's cases ask for the same arrays
def _values(rank: int, count: int, dtype: np.dtype, op: str, salt: int) -> np.ndarray:
    lo, hi = _RANGES[op]
    if dtype == np.uint8:
        lo, hi = 0, (3 if op == "prod" else hi)
    span = hi - lo + 1
    # one period (a prime, so that no block size of a transport or an algorithm divides it),
    # repeated: several MB cost a copy, not the arithmetic
    period = min(count, _PERIOD)
    mixed = (np.arange(period, dtype=np.int64) * 7919 + rank * 104729 + salt * 13) % _PERIOD
    return _read_only(np.resize((mixed % span + lo).astype(dtype), count))


@functools.lru_cache(maxsize=256)
def _reduction(size: int, count: int, dtype: np.dtype, op: str, salt: int) -> np.ndarray:
    reduce: Callable = OPS[op]
    return _read_only(functools.reduce(reduce, [_values(r, count, dtype, op, salt)
                                                for r in range(size)]))


def _read_only(array: np.ndarray) -> np.ndarray:
    """What the caches keep cannot be changed by mistake (callers get copies)."""
    array.flags.writeable = False
    return array
