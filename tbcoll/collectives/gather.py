"""gather: every rank's x concatenated along axis 0, at root; None elsewhere."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from tbcoll.algorithms import tree
from tbcoll.collectives import cases as params
from tbcoll.collectives.base import (
    Call,
    Collective,
    Context,
    as_numpy,
    check_rank,
    flat,
    gathered_shape,
    output,
    result_of,
)
from tbcoll.collectives.bench import Benchmark, count, values
from tbcoll.core.arrays import contiguous_flat, may_overlap


class Gather(Collective):
    name = "gather"
    algorithms = ("tree", "mesh", "native")
    rules = [(None, None, "tree")]  # binomial trees (not measured yet)
    bench = Benchmark(  # to rank 0; nbytes is the gathered result, as for all_gather
        "gather", lambda p: (p - 1) / p, False,
        inputs=lambda r, p, n, d: values(r, count(n, d, p) // p, d),
        expected=lambda r, p, n, d, op: np.concatenate(
            [values(k, count(n, d, p) // p, d) for k in range(p)]) if r == 0
        else np.zeros(0, d),
        run=lambda comm, x, op, algorithm, out: _at_root(
            comm.gather(x, 0, algorithm=algorithm, out=out if comm.rank == 0 else None),
            x.dtype),
        out_shape=lambda count, p: count * p, gathers=True,
    )

    def cases(self, rank: int, size: int) -> Iterator[params.Case]:
        """Every dtype and root; 0-d and empty parts."""
        def part(r: int, dtype: Any, root: int) -> np.ndarray:
            return params.values(r, 6, dtype, "max", root).reshape(2, 3)

        for dtype in params.dtypes():
            for root in range(size):
                want = np.concatenate([part(r, dtype, root) for r in range(size)])
                yield params.Case(f"{dtype} root {root}", (part(rank, dtype, root), root),
                                  want if rank == root else None)
        last = size - 1
        yield params.Case("0-d", (np.float64(rank), last),
                          np.arange(size, dtype=np.float64) if rank == last else None)
        yield params.Case("empty", (np.zeros((0, 4)), last),
                          np.zeros((0, 4)) if rank == last else None)
        yield params.Case("a root past the ranks", (np.ones(1), size), raises="root")


    def call(self, ctx: Context, x: Any, root: int = 0, algorithm: str | None = None,
             out: Any = None) -> Call:
        array, restore = as_numpy(x)
        check_rank(root, ctx.size, "root")
        if ctx.rank == root:
            out = output(x, out, gathered_shape(array, ctx.size), array.dtype)
        return Call(self, x, array, out, None, int(root),
                    ctx.choose(self.name, array.nbytes * ctx.size, algorithm), restore)

    def prepare(self, ctx: Context, call: Call) -> None:
        """The root's result (None elsewhere) and this rank's block."""
        result = None
        if ctx.rank == call.root:
            result = result_of(call, gathered_shape(call.array, ctx.size), call.array.dtype)
        mine = contiguous_flat(call.array)
        if result is not None and may_overlap(mine, result):
            mine = mine.copy()
        if ctx.size == 1:
            flat(result)[:] = mine
        call.state = (result, mine)

    def native(self, ctx: Context, call: Call) -> None:
        result, mine = call.state
        if mine.size:
            ctx.native.gather(mine, None if result is None else flat(result), call.root)

    def algorithm(self, ctx: Context, call: Call, run: Callable) -> None:
        """The trees and the mesh keep blocks in order of rank relative to the root."""
        (result, mine), root = call.state, call.root
        if not mine.size:
            return
        v = (ctx.rank - root) % ctx.size
        blocks = (np.empty(tree.subtree(ctx.size, v) * mine.size, mine.dtype)
                  if result is None or root else flat(result))
        run(ctx.coll, mine, blocks, root)
        if result is not None and root:
            flat(result)[:] = np.roll(blocks.reshape(ctx.size, -1), root, 0).ravel()

    def finish(self, ctx: Context, call: Call) -> Any:
        result, _ = call.state
        return None if result is None else call.restore(result)


def _at_root(result: Any, dtype: np.dtype) -> np.ndarray:
    """A rooted collective's result: None on the other ranks, which expect nothing."""
    return np.zeros(0, dtype) if result is None else result


GATHER = Gather()
