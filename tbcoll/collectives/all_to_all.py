"""all_to_all: block j of x (along axis 0) to rank j; the blocks from ranks 0..size-1 back."""

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
    flat,
    output,
    result_of,
)
from tbcoll.collectives.bench import Benchmark, count, values
from tbcoll.core.arrays import contiguous_flat, may_overlap, same_buffer
from tbcoll.core.calls import signature


class _Counts:
    """all_to_all's counts: rows to each rank, from each rank (None: not known yet), and the
    elements per row."""

    __slots__ = ("send", "recv", "row", "given", "told", "result")

    def __init__(self, send: np.ndarray, recv: np.ndarray | None, row: int, given: bool,
                 told: bool) -> None:
        self.send, self.recv, self.row, self.given, self.told = send, recv, row, given, told
        self.result: np.ndarray | None = None


def _counts(counts: Any, size: int, rows: int | None) -> np.ndarray:
    """all_to_all's counts, checked: one non-negative int per rank, summing to rows (if
    given)."""
    found = np.asarray(counts)
    if found.shape != (size,) or found.dtype.kind not in "iu" or (found < 0).any():
        raise ValueError(f"all_to_all counts must be {size} non-negative ints (rows for each "
                         f"rank); got {counts!r}")
    if rows is not None and int(found.sum()) != rows:
        raise ValueError(f"all_to_all counts sum to {int(found.sum())} but x has {rows} rows")
    return found.astype(np.int64)


def _split(data: np.ndarray, counts: np.ndarray) -> list[np.ndarray]:
    """data cut into consecutive blocks of these sizes."""
    bounds = np.concatenate(([0], np.cumsum(counts)))
    return [data[bounds[j]:bounds[j + 1]] for j in range(len(counts))]


class AllToAll(Collective):
    """Without counts, equal blocks; with counts (rows for each rank), the ranks first tell
    each other their counts, unless every rank passes recv_counts."""

    name = "all_to_all"
    algorithms = ("pairwise", "bruck", "mesh", "native")
    # every block at once where few ranks share the links; past that Bruck's log2(p) steps
    # for small messages (without counts: with counts pairwise runs instead), else one
    # partner per step (not measured yet)
    rules = [(None, 4, "mesh"), (16 << 10, None, "bruck"), (None, None, "pairwise")]
    bench = Benchmark(  # nbytes is each rank's input; 1/p of it goes to each rank
        "all_to_all", lambda p: (p - 1) / p, False,
        inputs=lambda r, p, n, d: values(r, count(n, d, p), d),
        expected=lambda r, p, n, d, op: np.concatenate(
            [np.split(values(k, count(n, d, p), d), p)[r] for k in range(p)]),
        run=lambda comm, x, op, algorithm, out: comm.all_to_all(x, algorithm=algorithm,
                                                                out=out),
        out_shape=lambda count, p: count,
    )

    def cases(self, rank: int, size: int) -> Iterator[params.Case]:
        """Equal blocks of every dtype (empty, one row, five); counted blocks as
        mixture-of-experts routing sends them, and back; into out; bad counts."""
        def rows_of(r: int, rows: int, dtype: Any) -> np.ndarray:
            return params.values(r, rows * 3, dtype, "max").reshape(rows, 3)

        for dtype in params.dtypes():
            for each in (0, 1, 5):
                mine = slice(rank * each, (rank + 1) * each)
                yield params.Case(f"{dtype} {each} rows each", (rows_of(rank, each * size, dtype),),
                                  np.concatenate([rows_of(r, each * size, dtype)[mine]
                                                  for r in range(size)]))
        sent = [[(i + j) % 3 for j in range(size)] for i in range(size)]  # rank i to rank j
        x = rows_of(rank, sum(sent[rank]), np.float32)
        got = np.concatenate([rows_of(i, sum(sent[i]), np.float32)[
            sum(sent[i][:rank]):sum(sent[i][:rank + 1])] for i in range(size)])
        received = np.array([sent[i][rank] for i in range(size)], np.int64)
        counted = ("pairwise", "mesh", "native")
        yield params.Case("counted", (x, sent[rank]), (got, received), algorithms=counted)
        yield params.Case("counted, back", (got, received), (x, np.array(sent[rank], np.int64)),
                          {"recv_counts": sent[rank]}, algorithms=counted)
        yield params.Case("counted with bruck", (x, sent[rank]), algorithms=("bruck",),
                          raises="blocks of one size")
        x = np.arange(size * 2, dtype=np.int64)
        yield params.Case("into out", (x,), np.array([2 * rank, 2 * rank + 1] * size),
                          {"out": np.empty_like(x)}, returns_out=True)
        yield params.Case("counts that do not sum", (x, [0] * size), raises="counts sum to")
        if size > 1:
            yield params.Case("rows that do not divide", (np.ones(size + 1),), raises="divisible")


    def call(self, ctx: Context, x: Any, counts: Any = None, algorithm: str | None = None,
             out: Any = None, recv_counts: Any = None) -> Call:
        array, restore = as_numpy(x)
        size = ctx.size
        if array.ndim == 0:
            raise ValueError("all_to_all needs x with at least one dimension")
        row = int(np.prod(array.shape[1:], dtype=np.int64))
        if counts is None:
            if array.shape[0] % size:
                raise ValueError(f"all_to_all needs x.shape[0] divisible by the communicator "
                                 f"size {size}; got shape {array.shape} (or give counts)")
            send = np.full(size, array.shape[0] // size, np.int64)
        else:
            send = _counts(counts, size, array.shape[0])
        name = ctx.choose(self.name, array.nbytes, algorithm)
        if name == "bruck" and counts is not None:
            if algorithm == "bruck":
                raise ValueError("all_to_all algorithm='bruck' needs blocks of one size; "
                                 "with counts use pairwise, mesh or native")
            name = "pairwise"  # the table's choice for equal blocks
        told = recv_counts is not None
        if told and counts is None:
            raise ValueError("all_to_all's recv_counts go with counts")
        recv = _counts(recv_counts, size, None) if told else None if counts is not None else send
        if counts is None or told:
            out = output(x, out, (int(recv.sum()), *array.shape[1:]), array.dtype)
        return Call(self, x, array, out, None, -1, name, restore,
                    _Counts(send, recv, row, counts is not None, told))

    def signature(self, call: Call) -> int:
        """With counts the ranks' row counts differ: the bytes are left out."""
        return signature(self.name, call.array.dtype, None,
                         0 if call.state.given else call.array.nbytes, -1, call.algorithm)

    def described(self, call: Call) -> np.ndarray:
        return call.array[:0] if call.state.given else call.array

    def alone(self, ctx: Context, call: Call) -> Any:
        counts = call.state
        counts.recv = counts.send
        counts.result = result = result_of(call, call.array.shape, call.array.dtype)
        if not same_buffer(result, call.array):
            np.copyto(result, call.array)
        return self.finish(ctx, call)

    def native(self, ctx: Context, call: Call) -> None:
        self._exchange(ctx, call, lambda send, recv, send_counts, recv_counts:
                       ctx.native.all_to_all(send, recv, send_counts, recv_counts))

    def algorithm(self, ctx: Context, call: Call, run: Callable) -> None:
        self._exchange(ctx, call, lambda send, recv, send_counts, recv_counts:
                       run(ctx.coll, _split(send, send_counts), _split(recv, recv_counts)))

    def _exchange(self, ctx: Context, call: Call, move: Callable) -> None:
        """First, where not told, how many rows each rank sends here (by the same means);
        then the rows."""
        counts, array = call.state, call.array
        if counts.recv is None:
            counts.recv = np.empty(ctx.size, np.int64)
            ones = np.ones(ctx.size, np.int64)
            move(counts.send, counts.recv, ones, ones)
            call.out = output(call.x, call.out, (int(counts.recv.sum()), *array.shape[1:]),
                              array.dtype)
        counts.result = result = result_of(call, (int(counts.recv.sum()), *array.shape[1:]),
                                           array.dtype)
        send = array.copy() if may_overlap(result, array) else array
        move(contiguous_flat(send), flat(result), counts.send * counts.row,
             counts.recv * counts.row)

    def finish(self, ctx: Context, call: Call) -> Any:
        counts = call.state
        result = call.restore(counts.result)
        return (result, counts.recv) if counts.given else result


ALL_TO_ALL = AllToAll()
