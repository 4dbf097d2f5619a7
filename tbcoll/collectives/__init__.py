"""The collectives, one registry entry each (a tbcoll.collectives.base.Collective): what a call
of it needs of the Communicator's one
dispatch (tbcoll.comm.communicator.Communicator._run). An entry sees its communicator only through a
Context: rank and size, the transport's native and coll, the algorithm's choice, a nested call.

An entry's `call` checks a public call's arguments where the user made it and returns a Call
(the input as numpy, where the result goes, op, root, the algorithm chosen). The dispatch then
takes the first that applies of: a world of one (`alone`), the transport's one-call path
(`direct`, named by DIRECT), its native collective (`native`), the registry's algorithm
(`algorithm`), and returns `finish`'s result. `prepare` makes the buffers the last two need.
Nothing else in tbcoll knows what a collective does with its buffers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from tbcoll.algorithms import tree
from tbcoll.collectives.base import (
    KNOWN_DTYPES,
    Call,
    Collective,
    Context,
    as_numpy,
    check_rank,
    flat,
    gathered_shape,
    output,
    plain_out,
    result_of,
    unchanged,
)
from tbcoll.core.arrays import contiguous_flat, is_mlx, may_overlap, restorer, same_buffer, to_numpy
from tbcoll.core.calls import signature
from tbcoll.core.dtypes import DTYPE_CODES, DTYPES, OPS, reducer


class AllReduce(Collective):
    name = "all_reduce"

    def plain(self, x: Any, op: Any, out: Any, size: int) -> bool:
        return (type(x) is np.ndarray and id(dtype := x.dtype) in KNOWN_DTYPES and op in OPS
                and (out is None or (type(out) is np.ndarray and out.dtype is dtype
                                     and out.shape == x.shape and out.flags.carray)))

    def call(self, ctx: Context, x: Any, op: str, algorithm: str | None,
             out: Any) -> Call:
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


class AllGather(Collective):
    name = "all_gather"

    def plain(self, x: Any, arg: Any, out: Any, size: int) -> bool:
        return (type(x) is np.ndarray and id(x.dtype) in KNOWN_DTYPES
                and (out is None or plain_out(out, gathered_shape(x, size), x.dtype)))

    def call(self, ctx: Context, x: Any, algorithm: str | None, out: Any) -> Call:
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


class ReduceScatter(Collective):
    name = "reduce_scatter"

    def plain(self, x: Any, op: Any, out: Any, size: int) -> bool:
        return (type(x) is np.ndarray and id(x.dtype) in KNOWN_DTYPES and op in OPS
                and x.ndim > 0 and not x.shape[0] % size
                and (out is None or plain_out(out, (x.shape[0] // size, *x.shape[1:]),
                                              x.dtype)))

    def call(self, ctx: Context, x: Any, op: str, algorithm: str | None,
             out: Any) -> Call:
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


class Broadcast(Collective):
    name = "broadcast"

    def plain(self, x: Any, root: Any, out: Any, size: int) -> bool:
        return (type(x) is np.ndarray and type(root) is int and 0 <= root < size
                and id(dtype := x.dtype) in KNOWN_DTYPES
                and (out is None or (type(out) is np.ndarray and out.dtype is dtype
                                     and out.shape == x.shape and out.flags.carray)))

    def call(self, ctx: Context, x: Any, root: int, algorithm: str | None,
             out: Any) -> Call:
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


class Barrier(Collective):
    name = "barrier"

    def call(self, ctx: Context) -> Call:
        return Call(self, None, None, None, None, -1, ctx.choose(self.name, 0, None),
                    unchanged)

    def finish(self, ctx: Context, call: Call) -> None:
        return None

    def native(self, ctx: Context, call: Call) -> None:
        ctx.native.barrier()

    def algorithm(self, ctx: Context, call: Call, run: Callable) -> None:
        run(ctx.coll)


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

    def call(self, ctx: Context, x: Any, counts: Any, algorithm: str | None, out: Any,
             recv_counts: Any) -> Call:
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


class Gather(Collective):
    name = "gather"

    def call(self, ctx: Context, x: Any, root: int, algorithm: str | None,
             out: Any) -> Call:
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


_HEADER = 11  # scatter's header: dtype code, ndim, mlx, then up to 8 dimensions


class Scatter(Collective):
    """Root's x split along axis 0; the others pass None and learn the shape and dtype from a
    header the root broadcasts first."""

    name = "scatter"

    def call(self, ctx: Context, x: Any, root: int, algorithm: str | None,
             out: Any) -> Call:
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


class Reduce(Collective):
    name = "reduce"

    def call(self, ctx: Context, x: Any, op: str, root: int, algorithm: str | None,
             out: Any) -> Call:
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


ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER = AllReduce(), AllGather(), ReduceScatter()
BROADCAST, BARRIER, ALL_TO_ALL = Broadcast(), Barrier(), AllToAll()
GATHER, SCATTER, REDUCE = Gather(), Scatter(), Reduce()
ENTRIES = {entry.name: entry for entry in (ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, BROADCAST,
                                           BARRIER, ALL_TO_ALL, GATHER, SCATTER, REDUCE)}
