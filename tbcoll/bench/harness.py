"""Time a size sweep of one collective and check its results, on every rank.

As nccl-tests does: after warm-up, each of `repeats` batches starts at a barrier and times
`iters` calls back to back; a batch's time per call is the slowest rank's. A row keeps the
median over the batches, their min and max, and #wrong: how many elements of a checked call
(input laid out afresh, run once more after the timing) differed, over all ranks.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from tbcoll.bench.descriptors import Collective


@dataclass(frozen=True)
class Row:
    collective: str
    size: int  # bytes of the largest buffer of the call
    count: int  # elements of that buffer
    type: str
    redop: str
    algorithm: str
    inplace: bool
    time_us: float  # median, per message (desc.legs)
    min_us: float
    max_us: float
    algbw: float  # GB/s
    busbw: float  # GB/s
    wrong: int
    ranks: int
    system: str

    def as_dict(self) -> dict:
        return asdict(self)


# In place, a reduction feeds on its own result: sum doubles (np=2) the values every call and
# overflows (RuntimeWarning, inf) within a few hundred. The timed calls of an in-place
# reduction therefore start from values it keeps as they are; the checked call gets the
# real input back.
_STABLE = {"sum": 0, "prod": 1}


def _buffers(desc: Collective, comm: Any, nbytes: int, dtype: np.dtype, in_place: bool,
             op: str) -> tuple[np.ndarray, np.ndarray | None, Callable[[], None]]:
    """The input, the out= buffer, and a function that puts the input back in place."""
    data = desc.inputs(comm.rank, comm.size, nbytes, dtype)
    if not in_place:
        out = np.empty(desc.out_shape(data.size, comm.size), dtype)
        return data, out, lambda: None
    if desc.in_place == "block":  # the input is this rank's block of the output
        out = np.empty(data.size * comm.size, dtype)
        x = out[comm.rank * data.size:(comm.rank + 1) * data.size]
        x[:] = data
    elif desc.has_op and op in _STABLE:
        out = x = np.full_like(data, _STABLE[op])
    else:
        out = x = data.copy()
    return x, out, lambda: np.copyto(x, data)


def _wrong(result: Any, expected: np.ndarray) -> int:
    """Elements of result whose bytes differ from expected's (all of them if shapes differ)."""
    got = np.asarray(result).reshape(-1)
    if got.shape != expected.shape or got.dtype != expected.dtype:
        return max(expected.size, 1)
    if not got.size:
        return 0
    differ = got.view(np.uint8).reshape(got.size, -1) != expected.view(np.uint8).reshape(
        expected.size, -1)
    return int(np.count_nonzero(differ.any(axis=1)))


def runs_in_place(desc: Collective, modes: Sequence[bool]) -> list[bool]:
    """The in-place modes a collective really runs (sendrecv and the like have none)."""
    return [m for m in modes if not m or desc.in_place]


def sweep(comm: Any, desc: Collective, sizes: Iterable[int], dtype: np.dtype, op: str,
          algorithms: Sequence[str], in_place_modes: Sequence[bool], iters: int, warmup: int,
          system: str, progress: Callable[[], None] = lambda: None, repeats: int = 5
          ) -> list[Row]:
    rows = []
    for nbytes in sizes:
        for algorithm in algorithms:
            for in_place in runs_in_place(desc, in_place_modes):
                rows.append(_measure(comm, desc, nbytes, dtype, op, algorithm, in_place, iters,
                                     warmup, repeats, system))
                progress()
    return rows


def _measure(comm: Any, desc: Collective, nbytes: int, dtype: np.dtype, op: str,
             algorithm: str, in_place: bool, iters: int, warmup: int, repeats: int,
             system: str) -> Row:
    x, out, refill = _buffers(desc, comm, nbytes, dtype, in_place, op)
    chosen = None if algorithm == "default" else algorithm
    for _ in range(warmup):
        desc.run(comm, x, op, chosen, out)
    per_call = []
    for _ in range(repeats):
        comm.barrier()
        started = time.perf_counter()
        for _ in range(iters):
            desc.run(comm, x, op, chosen, out)
        per_call.append((time.perf_counter() - started) / iters)
    refill()
    wrong = _wrong(desc.run(comm, x, op, chosen, out),
                   desc.expected(comm.rank, comm.size, nbytes, dtype, op))
    slowest = [float(t) for t in comm.all_reduce(np.array(per_call), op="max")]
    wrong = int(comm.all_reduce(np.array([wrong], np.int64))[0])
    slowest = [t / desc.legs for t in slowest]
    median = statistics.median(slowest)
    size = x.nbytes * comm.size if desc.gathers else x.nbytes
    algbw = size / median / 1e9 if median > 0 and size else 0.0
    return Row(desc.name, size, size // dtype.itemsize, str(dtype),
               op if desc.has_op else "none", algorithm, in_place, median * 1e6,
               min(slowest) * 1e6, max(slowest) * 1e6, algbw,
               algbw * desc.bus_factor(comm.size), wrong, comm.size, system)
