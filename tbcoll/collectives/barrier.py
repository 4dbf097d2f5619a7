"""barrier: return once every rank has entered it."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from tbcoll.collectives import cases as params
from tbcoll.collectives.base import (
    Call,
    Collective,
    Context,
    unchanged,
)
from tbcoll.collectives.bench import Benchmark


class Barrier(Collective):
    name = "barrier"
    algorithms = ("rd", "native")
    rules = [(None, None, "rd")]
    bench = Benchmark(
        "barrier", lambda p: 0.0, False,
        inputs=lambda r, p, n, d: np.zeros(0, d),
        expected=lambda r, p, n, d, op: np.zeros(0, d),
        run=lambda comm, x, op, algorithm, out: (comm.barrier(), x)[1],
        out_shape=lambda count, p: 0,
    )

    def cases(self, rank: int, size: int) -> Iterator[params.Case]:
        """It returns (that nobody leaves early is tests/spmd/test_collectives.py's)."""
        yield params.Case("returns", ())


    def call(self, ctx: Context, algorithm: str | None = None) -> Call:
        return Call(self, None, None, None, None, -1, ctx.choose(self.name, 0, algorithm),
                    unchanged)

    def finish(self, ctx: Context, call: Call) -> None:
        return None

    def native(self, ctx: Context, call: Call) -> None:
        ctx.native.barrier()

    def algorithm(self, ctx: Context, call: Call, run: Callable) -> None:
        run(ctx.coll)


BARRIER = Barrier()
