"""scatter: root's x split along axis 0, block r to rank r (the others pass None)."""

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
    output,
    unchanged,
)
from tbcoll.collectives.bench import Benchmark, count, values
from tbcoll.collectives.broadcast import BROADCAST
from tbcoll.core.arrays import contiguous_flat, is_mlx, restorer
from tbcoll.core.calls import signature
from tbcoll.core.dtypes import DTYPE_CODES, DTYPES

_HEADER = 11  # scatter's header: dtype code, ndim, mlx, then up to 8 dimensions


class Scatter(Collective):
    """Root's x split along axis 0; the others pass None and learn the shape and dtype from a
    header the root broadcasts first."""

    name = "scatter"
    algorithms = ("tree", "mesh", "native")
    rules = [(None, None, "tree")]  # binomial trees (not measured yet)
    bench = Benchmark(  # from rank 0; nbytes is the root's whole buffer
        "scatter", lambda p: (p - 1) / p, False,
        inputs=lambda r, p, n, d: values(0, count(n, d, p), d),
        expected=lambda r, p, n, d, op: np.split(values(0, count(n, d, p), d), p)[r],
        run=lambda comm, x, op, algorithm, out: comm.scatter(
            x if comm.rank == 0 else None, 0, algorithm=algorithm, out=out),
        out_shape=lambda count, p: count // p,
    )

    def cases(self, rank: int, size: int) -> Iterator[params.Case]:
        """Every dtype and root (the others pass None); an empty x."""
        for dtype in params.dtypes():
            for root in range(size):
                whole = params.values(root, 9 * size, dtype, "max", root).reshape(3 * size, 3)
                yield params.Case(f"{dtype} root {root}", (whole if rank == root else None, root),
                                  whole[3 * rank:3 * rank + 3])
        last = size - 1
        yield params.Case("empty", (np.zeros((0, 2)) if rank == last else None, last),
                          np.zeros((0, 2)))


    def call(self, ctx: Context, x: Any, root: int = 0, algorithm: str | None = None,
             out: Any = None) -> Call:
        check_rank(root, ctx.size, "root")
        header = np.zeros(_HEADER, np.int64)
        array, restore = None, unchanged
        if ctx.rank == root:
            array, restore = as_numpy(x)
            if array.ndim == 0 or array.shape[0] % ctx.size or array.ndim > _HEADER - 3:
                raise ValueError(f"scatter needs root's x.shape[0] divisible by the "
                                 f"communicator size {ctx.size} (and at most {_HEADER - 3} "
                                 f"dimensions); got shape {array.shape}")
            header[:3] = DTYPE_CODES[array.dtype], array.ndim, is_mlx(x)
            header[3:3 + array.ndim] = (array.shape[0] // ctx.size, *array.shape[1:])
        return Call(self, x, array, out, None, int(root),
                    ctx.choose(self.name, 0, algorithm), restore, header)

    def signature(self, call: Call) -> int:
        """Only the root knows the dtype and size."""
        return signature(self.name, None, None, 0, call.root, call.algorithm)

    def described(self, call: Call) -> None:
        return None

    def prepare(self, ctx: Context, call: Call) -> None:
        """Broadcast the header (by the broadcast's own choice), then make the result."""
        header = call.state
        if ctx.size > 1:
            header = ctx.run(BROADCAST.call(ctx, header, call.root, None, None))
        dtype = list(DTYPES.values())[header[0]]
        shape = tuple(int(d) for d in header[3:3 + header[1]])
        try:
            result = output(None, call.out, shape, dtype)
        except (TypeError, ValueError):
            result = None  # take part; finish says what was wrong
        if result is None:
            result = np.empty(shape, dtype)
        call.restore = restorer(bool(header[2]), dtype)
        call.state = (header, result)
        if ctx.size == 1:
            flat(result)[:] = contiguous_flat(call.array)

    def native(self, ctx: Context, call: Call) -> None:
        _, result = call.state
        if result.size:
            send = contiguous_flat(call.array) if ctx.rank == call.root else None
            ctx.native.scatter(send, flat(result), call.root)

    def algorithm(self, ctx: Context, call: Call, run: Callable) -> None:
        """The algorithms take the root's blocks in order of rank relative to the root."""
        _, result = call.state
        block, root = result.size, call.root
        if not block:
            return
        if ctx.rank == root:
            blocks = contiguous_flat(call.array)
            if root:
                blocks = np.roll(blocks.reshape(ctx.size, -1), -root, 0).ravel()
        else:
            blocks = np.empty(tree.subtree(ctx.size, (ctx.rank - root) % ctx.size) * block,
                              result.dtype)
        run(ctx.coll, blocks, block, root)
        flat(result)[:] = blocks[:block]

    def finish(self, ctx: Context, call: Call) -> Any:
        _, result = call.state
        if call.out is not None and result is not call.out:
            output(None, call.out, result.shape, result.dtype)  # raises, saying what is wrong
        return call.restore(result)


SCATTER = Scatter()
