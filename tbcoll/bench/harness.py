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
from functools import partial
from typing import Any

import numpy as np

from tbcoll.collectives.bench import Benchmark as Collective


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


class InSharedBuffers:
    """A tbcoll communicator whose calls get buffers from comm.empty (in shared memory on
    shm), as a contender beside the same transport's calls on numpy's buffers; with inputs
    False, only the out= buffers (an input made afresh each call, as a layer's output)."""

    def __init__(self, comm: Any, inputs: bool = True) -> None:
        self.comm, self.inputs = comm, inputs

    def __getattr__(self, name: str) -> Any:
        return getattr(self.comm, name)


def _buffers(desc: Collective, comm: Any, nbytes: int, dtype: np.dtype, in_place: bool,
             op: str) -> tuple[np.ndarray, np.ndarray | None, Callable[[], None]]:
    """The input, the out= buffer, and a function that puts the input back in place."""
    data = desc.inputs(comm.rank, comm.size, nbytes, dtype)
    empty = comm.comm.empty if isinstance(comm, InSharedBuffers) else np.empty
    if not in_place:
        out = empty(desc.out_shape(data.size, comm.size), dtype)
        if empty is np.empty or not comm.inputs:
            return data, out, lambda: None
        x = empty(data.shape, dtype)
        x[...] = data
        return x, out, lambda: np.copyto(x, data)
    if desc.in_place == "block":  # the input is this rank's block of the output
        out = empty(data.size * comm.size, dtype)
        x = out[comm.rank * data.size:(comm.rank + 1) * data.size]
        x[:] = data
    elif desc.has_op and op in _STABLE:
        out = x = empty(data.shape, dtype)
        x[...] = _STABLE[op]
    else:
        out = x = empty(data.shape, dtype)
        x[...] = data
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
    """One system's algorithms, interleaved batch by batch."""
    return sweep_interleaved([(system, comm, algorithm) for algorithm in algorithms], desc,
                             sizes, dtype, op, in_place_modes, iters, warmup, progress, repeats)


Contender = tuple[str, Any, str]  # (system, comm: tbcoll's or a peer's adapter, algorithm)


def sweep_interleaved(contenders: Sequence[Contender], desc: Collective, sizes: Iterable[int],
                      dtype: np.dtype, op: str, in_place_modes: Sequence[bool], iters: int,
                      warmup: int, progress: Callable[[], None] = lambda: None,
                      repeats: int = 5) -> list[Row]:
    """A row per contender, size and in-place mode. At each size the contenders take turns
    batch by batch (A B A B ...), so that the machine's noise falls on all of them alike;
    contenders may be different systems in one job (tbcoll's mpi transport and mpi4py under
    one mpiexec)."""
    rows = []
    for nbytes in sizes:
        for in_place in runs_in_place(desc, in_place_modes):
            for row in _measure(contenders, desc, nbytes, dtype, op, in_place, iters, warmup,
                                repeats):
                rows.append(row)
                progress()
    return rows


def _measure(contenders: Sequence[Contender], desc: Collective, nbytes: int, dtype: np.dtype,
             op: str, in_place: bool, iters: int, warmup: int, repeats: int) -> list[Row]:
    runs = []  # per contender: a call with its buffers, and what _row needs
    for system, comm, algorithm in contenders:
        x, out, refill = _buffers(desc, comm, nbytes, dtype, in_place, op)
        call = partial(desc.run, comm, x, op, None if algorithm == "default" else algorithm,
                       out)
        for _ in range(warmup):
            call()
        runs.append((call, comm, (system, algorithm, x, refill), []))
    for _ in range(repeats):
        for call, comm, _, times in runs:
            comm.barrier()
            started = time.perf_counter()
            for _ in range(iters):
                call()
            times.append((time.perf_counter() - started) / iters)
    return [_row(desc, comm, *about, call, op, nbytes, dtype, in_place, times)
            for call, comm, about, times in runs]


def _row(desc: Collective, comm: Any, system: str, algorithm: str, x: np.ndarray,
         refill: Callable[[], None], call: Callable[[], Any], op: str, nbytes: int,
         dtype: np.dtype, in_place: bool, per_call: list[float]) -> Row:
    """Check one more call of the contender and make its row from its batches' times."""
    refill()
    wrong = _wrong(call(), desc.expected(comm.rank, comm.size, nbytes, dtype, op))
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
