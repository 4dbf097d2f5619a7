"""The benchmarked calls, one nccl-tests descriptor each (tbcoll.collectives.bench.Benchmark):
each registered collective's own (its descriptor's `bench`), and send/recv's round trip."""

from __future__ import annotations

from typing import Any

import numpy as np

from tbcoll.collectives import DESCRIPTORS as COLLECTIVES
from tbcoll.collectives.bench import Benchmark, count, values

Collective = Benchmark  # (the name the harness and benchmarks/ know it by)


def ping_pong(comm: Any, x: np.ndarray, op: str, algorithm: str | None,
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


SENDRECV = Benchmark(  # a call is a round trip; rows give one way (legs=2), as OSU does
    "sendrecv", lambda p: 1.0, False,
    inputs=lambda r, p, n, d: values(0, count(n, d), d),
    expected=lambda r, p, n, d, op: values(0, count(n, d), d),
    run=ping_pong,
    out_shape=lambda count, p: count, legs=2, min_ranks=2, chooses=False,
)


def descriptors() -> dict[str, Benchmark]:
    """Every benchmarked call by name: the registered collectives' (now), then send/recv."""
    found = {name: d.bench for name, d in COLLECTIVES.items() if d.bench is not None}
    return {**found, SENDRECV.name: SENDRECV}


DESCRIPTORS = descriptors()  # as at import: the built-ins and those registered before
