"""A collective's benchmark descriptor, as nccl-tests has one (a collective's descriptor holds
its own: tbcoll.collectives; tbcoll.bench.descriptors lists them, with send/recv's).

A benchmark descriptor knows: the bus-bandwidth factor (nccl-tests' convention), how to make
each rank's input for a message of `nbytes` (the largest buffer of the call), what every rank
must get back, and how to run the call on a communicator (tbcoll's, or a peer's adapter with
the same methods). Inputs are small integers, so every dtype and reduction order gives the
exact expected answer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from tbcoll.core.dtypes import OPS


def values(rank: int, count: int, dtype: np.dtype) -> np.ndarray:
    """Rank's data: small integers that vary with position and rank (0..3 for uint8)."""
    small = (np.arange(count, dtype=np.int64) * 7 + rank * 3) % 4
    return (small if dtype == np.uint8 else small - 1).astype(dtype)


def reduced(size: int, count: int, dtype: np.dtype, op: str) -> np.ndarray:
    out = values(0, count, dtype)
    for rank in range(1, size):
        out = OPS[op](out, values(rank, count, dtype))
    return out


@dataclass(frozen=True)
class Benchmark:
    name: str
    bus_factor: Callable[[int], float]  # busbw = algbw * bus_factor(p)
    has_op: bool
    inputs: Callable[[int, int, int, np.dtype], np.ndarray]  # (rank, p, nbytes, dtype)
    expected: Callable[[int, int, int, np.dtype, str], np.ndarray]  # (rank, p, nbytes, ...)
    run: Callable[..., Any]  # (comm, x, op, algorithm, out) -> result
    out_shape: Callable[[int, int], int]  # (input count, p) -> result count
    in_place: str = ""  # "whole": x is out; "block": x is this rank's block of out; "": none
    gathers: bool = False  # the row's size is the gathered result (p times each input)
    legs: int = 1  # one-way messages per call: the row's time is per message
    min_ranks: int = 1
    chooses: bool = True  # has algorithms to choose from (its collective's descriptor)


def count(nbytes: int, dtype: np.dtype, multiple: int = 1) -> int:
    """Elements in a buffer of about nbytes, rounded down to a multiple (at least one)."""
    return max(multiple, nbytes // dtype.itemsize // multiple * multiple)
