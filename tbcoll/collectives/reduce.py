"""reduce: the elementwise reduction (op) of every rank's x, at root; None elsewhere."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from tbcoll.collectives import cases as params
from tbcoll.collectives.base import (
    Call,
    Collective,
    Context,
    as_numpy,
    check_rank,
    flat,
    output,
    result_of,
)
from tbcoll.collectives.bench import Benchmark, count, reduced, values
from tbcoll.collectives.gather import _at_root
from tbcoll.core.arrays import contiguous_flat, may_overlap
from tbcoll.core.dtypes import DTYPES, OPS, reducer


class Reduce(Collective):
    name = "reduce"
    algorithms = ("tree", "mesh", "native")
    rules = [(None, None, "tree")]  # binomial trees (not measured yet)
    bench = Benchmark(  # to rank 0
        "reduce", lambda p: 1.0, True,
        inputs=lambda r, p, n, d: values(r, count(n, d), d),
        expected=lambda r, p, n, d, op: reduced(p, count(n, d), d, op) if r == 0
        else np.zeros(0, d),
        run=lambda comm, x, op, algorithm, out: _at_root(
            comm.reduce(x, op, 0, algorithm=algorithm, out=out if comm.rank == 0 else None),
            x.dtype),
        out_shape=lambda count, p: count,
    )

    def cases(self, rank: int, size: int) -> Iterator[params.Case]:
        """Four dtypes, every op and root; into out at the root."""
        for name in ("float32", "bfloat16", "int64", "uint8"):
            for op in OPS:
                for root in range(size):
                    want = params.reduction(size, 1009, DTYPES[name], op, root)
                    yield params.Case(f"{name} {op} root {root}",
                                      (params.values(rank, 1009, DTYPES[name], op, root), op,
                                       root), want if rank == root else None)
        last = size - 1
        out = np.empty(6, np.int32) if rank == last else None
        yield params.Case("into out", (np.arange(6, dtype=np.int32), "max", last),
                          np.arange(6, dtype=np.int32) if rank == last else None,
                          {"out": out}, returns_out=rank == last)


    def call(self, ctx: Context, x: Any, op: str = "sum", root: int = 0,
             algorithm: str | None = None, out: Any = None) -> Call:
        array, restore = as_numpy(x)
        if op not in OPS:
            reducer(op)
        check_rank(root, ctx.size, "root")
        if ctx.rank == root:
            out = output(x, out, array.shape, array.dtype)
        return Call(self, x, array, out, op, int(root),
                    ctx.choose(self.name, array.nbytes, algorithm), restore)

    def prepare(self, ctx: Context, call: Call) -> None:
        if ctx.rank == call.root:
            call.state = result = result_of(call, call.array.shape, call.array.dtype)
            if ctx.size == 1 or not call.array.size:
                np.copyto(result, call.array)

    def native(self, ctx: Context, call: Call) -> None:
        if call.array.size:
            send, result = contiguous_flat(call.array), call.state
            if result is not None and may_overlap(send, result):
                send = send.copy()
            ctx.native.reduce(send, None if result is None else flat(result),
                                      call.op, call.root)

    def algorithm(self, ctx: Context, call: Call, run: Callable) -> None:
        if call.array.size:
            data = np.array(call.array, order="C").reshape(-1)  # combined in place
            run(ctx.coll, data, reducer(call.op), call.root)
            if call.state is not None:
                flat(call.state)[:] = data

    def finish(self, ctx: Context, call: Call) -> Any:
        return None if call.state is None else call.restore(call.state)


REDUCE = Reduce()
