"""all_reduce: every rank gets the elementwise reduction (op) of every rank's x."""

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
    flat,
    output,
    result_of,
    unchanged,
)
from tbcoll.collectives.bench import Benchmark, count, reduced, values
from tbcoll.collectives.tuning import STREAM
from tbcoll.core.arrays import contiguous_flat, may_overlap, same_buffer, to_numpy
from tbcoll.core.dtypes import DTYPES, OPS, reducer


class AllReduce(Collective):
    name = "all_reduce"
    algorithms = ("ring", "mesh", "rd", "native")
    rules = STREAM
    bench = Benchmark(
        "all_reduce", lambda p: 2 * (p - 1) / p, True,
        inputs=lambda r, p, n, d: values(r, count(n, d), d),
        expected=lambda r, p, n, d, op: reduced(p, count(n, d), d, op),
        run=lambda comm, x, op, algorithm, out: comm.all_reduce(x, op=op, algorithm=algorithm,
                                                                out=out),
        out_shape=lambda count, p: count, in_place="whole",
    )

    def cases(self, rank: int, size: int) -> Iterator[params.Case]:
        """Every dtype, op and count; several MB; in place, into out, 2-D, strided, 0-d."""
        for dtype in params.dtypes():
            for op in OPS:
                for n in params.counts(size):
                    yield params.Case(f"{dtype} {op} {n}", (params.values(rank, n, dtype, op),),
                                      params.reduction(size, n, dtype, op), {"op": op})
        for name in params.BIG_DTYPES:
            n = params.BIG_BYTES // DTYPES[name].itemsize + 7
            yield params.Case(f"{name} sum of {n}", (params.values(rank, n, DTYPES[name]),),
                              params.reduction(size, n, DTYPES[name], "sum"))
        want = params.reduction(size, 60, np.float32, "max").reshape(4, 15)
        x = params.values(rank, 60, np.float32, "max").reshape(4, 15)
        yield params.Case("in place", (x,), want, {"op": "max", "out": x}, returns_out=True)
        x = params.values(rank, 60, np.float32, "max").reshape(4, 15)
        yield params.Case("into out", (x,), want, {"op": "max", "out": np.empty((4, 15),
                                                                                  np.float32)},
                          returns_out=True)
        wide = np.zeros((4, 30), np.float32)
        wide[:, ::2] = params.values(rank, 60, np.float32, "max").reshape(4, 15)
        yield params.Case("strided x", (wide[:, ::2],), want, {"op": "max"})
        yield params.Case("0-d", (np.float64(rank + 1),), np.float64(size * (size + 1) / 2))
        yield params.Case("an unknown op", (np.ones(2),), raises="op 'xor' is not one of",
                          kwargs={"op": "xor"})


    def plain(self, x: Any, op: Any, out: Any, size: int) -> bool:
        return (type(x) is np.ndarray and id(dtype := x.dtype) in KNOWN_DTYPES and op in OPS
                and (out is None or (type(out) is np.ndarray and out.dtype is dtype
                                     and out.shape == x.shape and out.flags.carray)))

    def call(self, ctx: Context, x: Any, op: str = "sum", algorithm: str | None = None,
             out: Any = None) -> Call:
        # the latency-critical call: as_numpy, plain_out and _choose's common cases inline
        # (each a function call, 0.1-0.2 us of a 2 us call)
        if type(x) is np.ndarray and id(x.dtype) in KNOWN_DTYPES:
            array, restore = x, unchanged
            if out is not None and not (type(out) is np.ndarray and out.dtype is x.dtype
                                        and out.shape == x.shape and out.flags.carray):
                out = output(x, out, x.shape, x.dtype)
        else:
            array, restore = to_numpy(x)
            out = output(x, out, array.shape, array.dtype)
        if op not in OPS:
            reducer(op)  # raises, naming the ops
        name = (algorithm is None and ctx.fixed[self.name]
                or ctx.choose(self.name, array.nbytes, algorithm))
        return Call(self, x, array, out, op, -1, name, restore)

    def alone(self, ctx: Context, call: Call) -> Any:
        result = call.array.copy() if call.out is None else call.out
        if result is not call.array:
            np.copyto(result, call.array)
        return call.restore(result)

    def prepare(self, ctx: Context, call: Call) -> None:
        """The result, and what native reads (None: the result, in place). The algorithms
        reduce in place in the result, which therefore starts as a copy of x."""
        array = call.array
        result = result_of(call, array.shape, array.dtype)
        in_place = same_buffer(result, array)
        if not in_place and may_overlap(result, array):
            array = array.copy()  # out overlaps x some other way: read from a copy
        if not in_place and (call.algorithm != "native" or ctx.size == 1 or not array.size):
            np.copyto(result, array)
        call.state = (result, None if in_place else contiguous_flat(array))

    def native(self, ctx: Context, call: Call) -> None:
        result, send = call.state
        if result.size:
            ctx.native.all_reduce(send, flat(result), call.op)

    def algorithm(self, ctx: Context, call: Call, run: Callable) -> None:
        result, _ = call.state
        if result.size:
            run(ctx.coll, flat(result), reducer(call.op))

    def finish(self, ctx: Context, call: Call) -> Any:
        return call.restore(call.state[0])


ALL_REDUCE = AllReduce()
