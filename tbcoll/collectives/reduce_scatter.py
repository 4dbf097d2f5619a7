"""reduce_scatter: the reduction of every rank's x, block r of it (along axis 0) to rank r."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from tbcoll.collectives import cases as params
from tbcoll.collectives.base import (
    KNOWN_DTYPES,
    Call,
    Collective,
    Context,
    as_numpy,
    flat,
    output,
    plain_out,
    result_of,
)
from tbcoll.collectives.bench import Benchmark, count, reduced, values
from tbcoll.collectives.tuning import STREAM
from tbcoll.core.arrays import contiguous_flat, may_overlap
from tbcoll.core.dtypes import OPS, reducer


class ReduceScatter(Collective):
    name = "reduce_scatter"
    algorithms = ("ring", "mesh", "rd", "native")
    rules = STREAM
    bench = Benchmark(  # nbytes is each rank's input; each gets back 1/p of it
        "reduce_scatter", lambda p: (p - 1) / p, True,
        inputs=lambda r, p, n, d: values(r, count(n, d, p), d),
        expected=lambda r, p, n, d, op: np.split(reduced(p, count(n, d, p), d, op), p)[r],
        run=lambda comm, x, op, algorithm, out: comm.reduce_scatter(x, op=op,
                                                                    algorithm=algorithm, out=out),
        out_shape=lambda count, p: count // p,
    )

    def cases(self, rank: int, size: int) -> Iterator[params.Case]:
        """Every dtype, op and block size; several MB in 2-D into out; an x that does not
        divide."""
        mine = slice(rank, rank + 1)
        for dtype in params.dtypes():
            for op in OPS:
                for block in params.counts(size):
                    want = params.reduction(size, block * size, dtype, op).reshape(size, block)
                    yield params.Case(f"{dtype} {op} {block}",
                                      (params.values(rank, block * size, dtype, op),),
                                      want[mine].reshape(-1), {"op": op})
        rows = (params.BIG_BYTES // 4 // 64) // size * size
        x = params.values(rank, rows * 64, np.float32).reshape(rows, 64)
        want = params.reduction(size, rows * 64, np.float32, "sum").reshape(size, -1, 64)[rank]
        yield params.Case("big 2-d into out", (x,), want,
                          {"out": np.empty((rows // size, 64), np.float32)}, returns_out=True)
        yield params.Case("0-d", (np.float64(1.0),), raises="divisible")


    def plain(self, x: Any, op: Any, out: Any, size: int) -> bool:
        return (type(x) is np.ndarray and id(x.dtype) in KNOWN_DTYPES and op in OPS
                and x.ndim > 0 and not x.shape[0] % size
                and (out is None or plain_out(out, (x.shape[0] // size, *x.shape[1:]),
                                              x.dtype)))

    def call(self, ctx: Context, x: Any, op: str = "sum", algorithm: str | None = None,
             out: Any = None) -> Call:
        array, restore = as_numpy(x)
        if op not in OPS:
            reducer(op)
        if array.ndim == 0 or array.shape[0] % ctx.size:
            raise ValueError(f"reduce_scatter needs x.shape[0] divisible by the communicator "
                             f"size {ctx.size}; got shape {array.shape}")
        out = output(x, out, (array.shape[0] // ctx.size, *array.shape[1:]), array.dtype)
        return Call(self, x, array, out, op, -1, ctx.choose(self.name, array.nbytes, algorithm),
                    restore)

    def prepare(self, ctx: Context, call: Call) -> None:
        """The result, and the input (a copy where out overlaps it: the transports read x
        while they write out)."""
        array = call.array
        result = result_of(call, (array.shape[0] // ctx.size, *array.shape[1:]), array.dtype)
        if may_overlap(result, array):
            array = array.copy()
        if ctx.size == 1:
            np.copyto(result, array)
        call.state = (result, array)

    def native(self, ctx: Context, call: Call) -> None:
        result, array = call.state
        if array.size:
            ctx.native.reduce_scatter(contiguous_flat(array), flat(result), call.op)

    def algorithm(self, ctx: Context, call: Call, run: Callable) -> None:
        result, array = call.state
        if array.size:  # the algorithms reduce the whole buffer in place: a copy
            scratch = np.array(array, order="C").reshape(-1)
            run(ctx.coll, scratch, reducer(call.op))
            block = scratch.size // ctx.size
            flat(result)[:] = scratch[ctx.rank * block:(ctx.rank + 1) * block]

    def finish(self, ctx: Context, call: Call) -> Any:
        return call.restore(call.state[0])


REDUCE_SCATTER = ReduceScatter()
