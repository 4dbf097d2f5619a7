"""broadcast: root's x on every rank."""

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
    check_rank,
    flat,
    output,
    result_of,
)
from tbcoll.collectives.bench import Benchmark, count, values


class Broadcast(Collective):
    name = "broadcast"
    algorithms = ("ring", "mesh", "rd", "native")
    rules = [(256 << 10, None, "rd"), (None, None, "ring")]
    bench = Benchmark(  # from rank 0
        "broadcast", lambda p: 1.0, False,
        inputs=lambda r, p, n, d: values(r, count(n, d), d),
        expected=lambda r, p, n, d, op: values(0, count(n, d), d),
        run=lambda comm, x, op, algorithm, out: comm.broadcast(x, root=0, algorithm=algorithm,
                                                               out=out),
        out_shape=lambda count, p: count, in_place="whole",
    )

    def cases(self, rank: int, size: int) -> Iterator[params.Case]:
        """Every dtype, root and count (several MB of float32 from root 0); in place."""
        for dtype in params.dtypes():
            for root in range(size):
                big = [params.BIG_BYTES // dtype.itemsize + 1] if (
                    root == 0 and dtype == np.float32) else []
                for n in [*params.counts(size), *big]:
                    yield params.Case(f"{dtype} root {root} {n}",
                                      (params.values(rank, n, dtype, salt=root), root),
                                      params.values(root, n, dtype, salt=root))
        x = np.full((3, 3), rank, np.int64)
        yield params.Case("in place", (x, size - 1), np.full((3, 3), size - 1, np.int64),
                          {"out": x}, returns_out=True)
        yield params.Case("a root past the ranks", (np.ones(1), size), raises="root")


    def plain(self, x: Any, root: Any, out: Any, size: int) -> bool:
        return (type(x) is np.ndarray and type(root) is int and 0 <= root < size
                and id(dtype := x.dtype) in KNOWN_DTYPES
                and (out is None or (type(out) is np.ndarray and out.dtype is dtype
                                     and out.shape == x.shape and out.flags.carray)))

    def call(self, ctx: Context, x: Any, root: int = 0, algorithm: str | None = None,
             out: Any = None) -> Call:
        array, restore = as_numpy(x)
        check_rank(root, ctx.size, "root")
        out = output(x, out, array.shape, array.dtype)
        return Call(self, x, array, out, None, int(root),
                    ctx.choose(self.name, array.nbytes, algorithm), restore)

    def prepare(self, ctx: Context, call: Call) -> None:
        call.state = result = result_of(call, call.array.shape, call.array.dtype)
        if ctx.rank == call.root and result is not call.array:
            np.copyto(result, call.array)

    def native(self, ctx: Context, call: Call) -> None:
        if call.array.size:
            ctx.native.broadcast(flat(call.state), call.root)

    def algorithm(self, ctx: Context, call: Call, run: Callable) -> None:
        if call.array.size:
            run(ctx.coll, flat(call.state), call.root)


BROADCAST = Broadcast()
