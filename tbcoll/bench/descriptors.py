"""One small descriptor per benchmarked collective, as nccl-tests has.

A descriptor knows: the bus-bandwidth factor (nccl-tests' convention), how to make each
rank's input for a message of `nbytes` (the largest buffer of the call), what every rank
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


def _values(rank: int, count: int, dtype: np.dtype) -> np.ndarray:
    """Rank's data: small integers that vary with position and rank (0..3 for uint8)."""
    values = (np.arange(count, dtype=np.int64) * 7 + rank * 3) % 4
    return (values if dtype == np.uint8 else values - 1).astype(dtype)


def _reduced(size: int, count: int, dtype: np.dtype, op: str) -> np.ndarray:
    out = _values(0, count, dtype)
    for rank in range(1, size):
        out = OPS[op](out, _values(rank, count, dtype))
    return out


@dataclass(frozen=True)
class Collective:
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
    chooses: bool = True  # has algorithms to choose from (tbcoll's registry)


def _count(nbytes: int, dtype: np.dtype, multiple: int = 1) -> int:
    """Elements in a buffer of about nbytes, rounded down to a multiple (at least one)."""
    return max(multiple, nbytes // dtype.itemsize // multiple * multiple)


ALL_REDUCE = Collective(
    "all_reduce", lambda p: 2 * (p - 1) / p, True,
    inputs=lambda r, p, n, d: _values(r, _count(n, d), d),
    expected=lambda r, p, n, d, op: _reduced(p, _count(n, d), d, op),
    run=lambda comm, x, op, algorithm, out: comm.all_reduce(x, op=op, algorithm=algorithm,
                                                            out=out),
    out_shape=lambda count, p: count, in_place="whole",
)

ALL_GATHER = Collective(  # nbytes is the gathered result; each rank sends 1/p of it
    "all_gather", lambda p: (p - 1) / p, False,
    inputs=lambda r, p, n, d: _values(r, _count(n, d, p) // p, d),
    expected=lambda r, p, n, d, op: np.concatenate(
        [_values(k, _count(n, d, p) // p, d) for k in range(p)]),
    run=lambda comm, x, op, algorithm, out: comm.all_gather(x, algorithm=algorithm, out=out),
    out_shape=lambda count, p: count * p, in_place="block", gathers=True,
)

REDUCE_SCATTER = Collective(  # nbytes is each rank's input; each gets back 1/p of it
    "reduce_scatter", lambda p: (p - 1) / p, True,
    inputs=lambda r, p, n, d: _values(r, _count(n, d, p), d),
    expected=lambda r, p, n, d, op: np.split(_reduced(p, _count(n, d, p), d, op), p)[r],
    run=lambda comm, x, op, algorithm, out: comm.reduce_scatter(x, op=op, algorithm=algorithm,
                                                                out=out),
    out_shape=lambda count, p: count // p,
)

BROADCAST = Collective(  # from rank 0
    "broadcast", lambda p: 1.0, False,
    inputs=lambda r, p, n, d: _values(r, _count(n, d), d),
    expected=lambda r, p, n, d, op: _values(0, _count(n, d), d),
    run=lambda comm, x, op, algorithm, out: comm.broadcast(x, root=0, algorithm=algorithm,
                                                           out=out),
    out_shape=lambda count, p: count, in_place="whole",
)


def _ping_pong(comm: Any, x: np.ndarray, op: str, algorithm: str | None,
               out: np.ndarray | None) -> np.ndarray:
    """Rank 0 sends x to rank 1, which sends it back; other ranks wait at no cost."""
    buf = out if out is not None else np.empty_like(x)
    if comm.rank == 0:
        comm.send(x, 1)
        comm.recv(buf, 1)
    elif comm.rank == 1:
        comm.recv(buf, 0)
        comm.send(buf, 0)
    else:
        buf[:] = x
    return buf


SENDRECV = Collective(  # a call is a round trip; rows give one way (legs=2), as OSU does
    "sendrecv", lambda p: 1.0, False,
    inputs=lambda r, p, n, d: _values(0, _count(n, d), d),
    expected=lambda r, p, n, d, op: _values(0, _count(n, d), d),
    run=_ping_pong,
    out_shape=lambda count, p: count, legs=2, min_ranks=2, chooses=False,
)

BARRIER = Collective(
    "barrier", lambda p: 0.0, False,
    inputs=lambda r, p, n, d: np.zeros(0, d),
    expected=lambda r, p, n, d, op: np.zeros(0, d),
    run=lambda comm, x, op, algorithm, out: (comm.barrier(), x)[1],
    out_shape=lambda count, p: 0,
)



def _at_root(result: Any, dtype: np.dtype) -> np.ndarray:
    """A rooted collective's result: None on the other ranks, which expect nothing."""
    return np.zeros(0, dtype) if result is None else result


def _blocks_for(rank: int, p: int, count: int, dtype: np.dtype) -> np.ndarray:
    """What all_to_all gives rank: block `rank` of every rank's input, in rank order."""
    return np.concatenate([np.split(_values(k, count, dtype), p)[rank] for k in range(p)])


ALL_TO_ALL = Collective(  # nbytes is each rank's input; 1/p of it goes to each rank
    "all_to_all", lambda p: (p - 1) / p, False,
    inputs=lambda r, p, n, d: _values(r, _count(n, d, p), d),
    expected=lambda r, p, n, d, op: _blocks_for(r, p, _count(n, d, p), d),
    run=lambda comm, x, op, algorithm, out: comm.all_to_all(x, algorithm=algorithm, out=out),
    out_shape=lambda count, p: count,
)

GATHER = Collective(  # to rank 0; nbytes is the gathered result, as for all_gather
    "gather", lambda p: (p - 1) / p, False,
    inputs=lambda r, p, n, d: _values(r, _count(n, d, p) // p, d),
    expected=lambda r, p, n, d, op: np.concatenate(
        [_values(k, _count(n, d, p) // p, d) for k in range(p)]) if r == 0 else np.zeros(0, d),
    run=lambda comm, x, op, algorithm, out: _at_root(
        comm.gather(x, 0, algorithm=algorithm, out=out if comm.rank == 0 else None), x.dtype),
    out_shape=lambda count, p: count * p, gathers=True,
)

SCATTER = Collective(  # from rank 0; nbytes is the root's whole buffer
    "scatter", lambda p: (p - 1) / p, False,
    inputs=lambda r, p, n, d: _values(0, _count(n, d, p), d),
    expected=lambda r, p, n, d, op: np.split(_values(0, _count(n, d, p), d), p)[r],
    run=lambda comm, x, op, algorithm, out: comm.scatter(
        x if comm.rank == 0 else None, 0, algorithm=algorithm, out=out),
    out_shape=lambda count, p: count // p,
)

REDUCE = Collective(  # to rank 0
    "reduce", lambda p: 1.0, True,
    inputs=lambda r, p, n, d: _values(r, _count(n, d), d),
    expected=lambda r, p, n, d, op: _reduced(p, _count(n, d), d, op) if r == 0
    else np.zeros(0, d),
    run=lambda comm, x, op, algorithm, out: _at_root(
        comm.reduce(x, op, 0, algorithm=algorithm, out=out if comm.rank == 0 else None),
        x.dtype),
    out_shape=lambda count, p: count,
)

DESCRIPTORS = {c.name: c for c in
               (ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, BROADCAST, ALL_TO_ALL, GATHER, SCATTER,
                REDUCE, SENDRECV, BARRIER)}
