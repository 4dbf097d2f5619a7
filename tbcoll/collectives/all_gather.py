"""all_gather: every rank's x concatenated along axis 0, on every rank (with counts, parts
of different sizes: tbcoll.uneven)."""

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
    gathered_shape,
    output,
    plain_out,
    result_of,
)
from tbcoll.collectives.bench import Benchmark, count, values
from tbcoll.collectives.tuning import STREAM
from tbcoll.core.arrays import contiguous_flat, may_overlap


class AllGather(Collective):
    name = "all_gather"
    algorithms = ("ring", "mesh", "rd", "native")
    rules = STREAM
    bench = Benchmark(  # nbytes is the gathered result; each rank sends 1/p of it
        "all_gather", lambda p: (p - 1) / p, False,
        inputs=lambda r, p, n, d: values(r, count(n, d, p) // p, d),
        expected=lambda r, p, n, d, op: np.concatenate(
            [values(k, count(n, d, p) // p, d) for k in range(p)]),
        run=lambda comm, x, op, algorithm, out: comm.all_gather(x, algorithm=algorithm,
                                                                out=out),
        out_shape=lambda count, p: count * p, in_place="block", gathers=True,
    )

    def cases(self, rank: int, size: int) -> Iterator[params.Case]:
        """Every dtype and count, several MB for one dtype of each width; 2-D, into out, 0-d."""
        for dtype in params.dtypes():
            big = dtype.name in (*params.BIG_DTYPES, "float64")
            for n in [*params.counts(size),
                      *([params.BIG_BYTES // dtype.itemsize // size + 3] if big else [])]:
                yield params.Case(f"{dtype} {n}", (params.values(rank, n, dtype),),
                                  np.concatenate([params.values(r, n, dtype)
                                                  for r in range(size)]))
        x = np.full((2, 3), rank, np.int32)
        want = np.repeat(np.arange(size, dtype=np.int32), 6).reshape(2 * size, 3)
        yield params.Case("2-d", (x,), want)
        yield params.Case("into out", (x,), want, {"out": np.empty((2 * size, 3), np.int32)},
                          returns_out=True)
        yield params.Case("0-d", (np.array(rank * 1.5),), np.arange(size) * 1.5)


    def plain(self, x: Any, arg: Any, out: Any, size: int) -> bool:
        return (type(x) is np.ndarray and id(x.dtype) in KNOWN_DTYPES
                and (out is None or plain_out(out, gathered_shape(x, size), x.dtype)))

    def call(self, ctx: Context, x: Any, algorithm: str | None = None, out: Any = None) -> Call:
        array, restore = as_numpy(x)
        shape = gathered_shape(array, ctx.size)
        out = output(x, out, shape, array.dtype)
        return Call(self, x, array, out, None, -1,
                    ctx.choose(self.name, array.nbytes * ctx.size, algorithm), restore)

    def prepare(self, ctx: Context, call: Call) -> None:
        """The result and this rank's block (in place in the result, but for native, which
        takes it apart)."""
        result = result_of(call, gathered_shape(call.array, ctx.size), call.array.dtype)
        mine = contiguous_flat(call.array)
        if may_overlap(mine, result):  # e.g. x is this rank's block of out already
            mine = mine.copy()
        if call.algorithm != "native" or ctx.size == 1 or not mine.size:
            flat(result)[ctx.rank * mine.size:(ctx.rank + 1) * mine.size] = mine
        call.state = (result, mine)

    def native(self, ctx: Context, call: Call) -> None:
        result, mine = call.state
        if mine.size:
            ctx.native.all_gather(mine, flat(result))

    def algorithm(self, ctx: Context, call: Call, run: Callable) -> None:
        result, mine = call.state
        if mine.size:
            run(ctx.coll, flat(result))

    def finish(self, ctx: Context, call: Call) -> Any:
        return call.restore(call.state[0])


ALL_GATHER = AllGather()
