"""Communicator: the collective API over a transport's Group.

Each public method checks its arguments where the user called it (ValueError, TypeError),
picks an algorithm (the algorithm= argument, else TBCOLL_ALGO, else tbcoll.tuning's table),
and runs it. A CommError from below is raised again naming the collective and this rank.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from tbcoll import tuning
from tbcoll.algorithms import ALGORITHMS, COLLECTIVES, FAMILIES, function, rd, tree
from tbcoll.arrays import (
    contiguous_flat,
    is_mlx,
    may_overlap,
    restorer,
    same_buffer,
    to_numpy,
)
from tbcoll.calls import signature
from tbcoll.checks import verify_calls_match
from tbcoll.dtypes import DTYPE_CODES, DTYPES, OPS, reducer
from tbcoll.env import algorithm_overrides, check_mode
from tbcoll.errors import CommError, PeerError, TbcollError
from tbcoll.ownership import Guard, entry, track
from tbcoll.rendezvous import report_peer_failure
from tbcoll.requests import P2PRequest, Progress, Request
from tbcoll.transports.base import Group

MAX_TAG = 32767  # the largest tag every MPI must support
_INT64 = 1 << 63


def _plain_out(out: Any, shape: tuple, dtype: np.dtype) -> bool:
    """out is a numpy array a result of this shape and dtype can go into (a quick test; the
    full one, with its error messages, is Communicator._output)."""
    return (type(out) is np.ndarray and out.shape == shape and out.dtype == dtype
            and out.flags.carray)  # C-contiguous, aligned and writeable


def _flat(array: np.ndarray) -> np.ndarray:
    """A 1-D view of a C-contiguous array."""
    return array if array.ndim == 1 else array.reshape(-1)


def _split(flat: np.ndarray, counts: np.ndarray) -> list[np.ndarray]:
    """flat cut into consecutive blocks of these sizes."""
    bounds = np.concatenate(([0], np.cumsum(counts)))
    return [flat[bounds[j]:bounds[j + 1]] for j in range(len(counts))]


_HEADER = 11  # scatter's header: dtype code, ndim, mlx, then up to 8 dimensions


def _body(method: Callable[..., Any]) -> Callable[..., Any]:
    """A public method without its tbcoll.ownership.entry wrapper: what the progress thread
    runs (it neither takes the guard nor waits for itself)."""
    return method.__wrapped__


class _ArgumentsChecked(Exception):  # noqa: N818 (a signal, not an error)
    """A non-blocking call's arguments passed the method's checks (see Communicator._submit)."""


class _Checking(threading.local):
    active = False  # this thread only checks a call's arguments: it moves no data


_checking = _Checking()


class Communicator:
    """A group of ranks that run collectives together. Use tbcoll.init() to get the world."""

    def __init__(self, group: Group, backend: str, local_rank: int, node_rank: int,
                 world_ranks: tuple[int, ...] | None = None) -> None:
        self._group = group
        self.rank, self.size = group.rank, group.size
        self._world_ranks = tuple(range(self.size)) if world_ranks is None else world_ranks
        self.local_rank, self.node_rank = local_rank, node_rank
        self.backend = backend
        self._table = group.tuning  # the tuning table it follows
        self._overrides = algorithm_overrides(ALGORITHMS)
        for collective, algorithm in self._overrides.items():
            self._check_algorithm(collective, algorithm, "TBCOLL_ALGO")
        self._check_calls = check_mode()
        self._guard = Guard()  # see tbcoll.ownership
        self._release = track(self, group)
        self._seq = 0  # collective calls made on this communicator (tbcoll.calls)
        self._closed = False
        self._progress: Progress | None = None  # made by the first non-blocking call
        # A transport may offer one-call paths (Native.direct_*), taken for algorithm
        # "native" (asked for, or the default here) unless per-call checks are on.
        native = None if self._check_calls else group.native
        self._direct = {"all_reduce": native and native.direct_all_reduce,
                        "all_gather": native and native.direct_all_gather,
                        "broadcast": native and native.direct_broadcast,
                        "reduce_scatter": native and native.direct_reduce_scatter}
        # ... and may take mlx arrays there as they are (the mlx transport: no copies).
        self._direct_takes_mlx = group.native is not None and group.native.takes_mlx
        # the paths calls without algorithm= take: where "native" is the default at any size
        self._direct_default = {
            name: path if (self._overrides.get(name) or tuning.choose(
                self._table, name, 0, self.size)) == "native" else None
            for name, path in self._direct.items()}

    # --- collectives ---------------------------------------------------------------------

    @entry(ordered=True)
    def all_reduce(self, x: Any, op: str = "sum", algorithm: str | None = None,
                   out: np.ndarray | None = None) -> Any:
        """Reduce x elementwise over all ranks with op; every rank gets the result."""
        fast = self._direct_path("all_reduce", algorithm) if op in OPS else None
        if fast and type(x) is np.ndarray:  # the latency-critical case: no conversions
            if out is not None and not _plain_out(out, x.shape, x.dtype):
                self._output(x, out, x.shape, x.dtype)  # raises, saying what is wrong
            if _checking.active:  # _run_direct's work, inline: 0.4 us of a 3 us call
                raise _ArgumentsChecked
            try:
                result = fast(x, op, out)
            except CommError as e:
                raise self._named(e, "all_reduce") from e
            if result is not None:
                self._seq += 1
                return result
        if fast and out is None and self._direct_takes_mlx and is_mlx(x):
            result = self._run_direct(fast, "all_reduce", x, op, None)  # no conversion at all
            if result is not None:
                return result
        array, restore = to_numpy(x)
        if fast and array is not x and out is None:  # e.g. an mlx array
            result = self._run_direct(fast, "all_reduce", array, op, None)
            if result is not None:
                return restore(result)
        ufunc = reducer(op)
        result = self._output(x, out, array.shape, array.dtype)
        name = self._choose("all_reduce", array.nbytes, algorithm)
        in_place = same_buffer(result, array)
        if not in_place and may_overlap(result, array):
            array = array.copy()  # out overlaps x some other way: read from a copy
        if self.size == 1 or array.size == 0:
            work = None
        elif name == "native":
            work = partial(self._group.native.all_reduce,
                           None if in_place else contiguous_flat(array), _flat(result), op)
        else:
            work = partial(FAMILIES[name].all_reduce, self._group.coll, _flat(result), ufunc)
        if not in_place and (work is None or name != "native"):
            np.copyto(result, array)  # the algorithms reduce in place, in result
        self._run("all_reduce", work, array, op, algorithm=name)
        return restore(result)

    @entry(ordered=True)
    def all_gather(self, x: Any, algorithm: str | None = None,
                   out: np.ndarray | None = None) -> Any:
        """Concatenate every rank's x along axis 0 (a 0-d x gives shape (size,))."""
        fast = self._direct_path("all_gather", algorithm)
        if fast and type(x) is np.ndarray:
            if out is not None and not _plain_out(out, self._gathered_shape(x), x.dtype):
                self._output(x, out, self._gathered_shape(x), x.dtype)  # raises
            result = self._run_direct(fast, "all_gather", x, out)
            if result is not None:
                return result
        if fast and out is None and self._direct_takes_mlx and is_mlx(x):
            result = self._run_direct(fast, "all_gather", x, None)
            if result is not None:
                return result
        array, restore = to_numpy(x)
        if fast and array is not x and out is None:
            result = self._run_direct(fast, "all_gather", array, None)
            if result is not None:
                return restore(result)
        result = self._output(x, out, self._gathered_shape(array), array.dtype)
        name = self._choose("all_gather", result.nbytes, algorithm)
        flat, mine = _flat(result), contiguous_flat(array)
        if may_overlap(mine, flat):  # e.g. x is this rank's block of out already
            mine = mine.copy()
        if name != "native" or self.size == 1 or mine.size == 0:
            flat[self.rank * mine.size:(self.rank + 1) * mine.size] = mine
        if self.size == 1 or mine.size == 0:
            work = None
        elif name == "native":
            work = partial(self._group.native.all_gather, mine, flat)
        else:
            work = partial(FAMILIES[name].all_gather, self._group.coll, flat)
        self._run("all_gather", work, array, algorithm=name)
        return restore(result)

    @entry(ordered=True)
    def reduce_scatter(self, x: Any, op: str = "sum", algorithm: str | None = None,
                       out: np.ndarray | None = None) -> Any:
        """Reduce x over all ranks and return this rank's block of it along axis 0."""
        fast = self._direct_path("reduce_scatter", algorithm)
        if fast and type(x) is np.ndarray and op in OPS and (
                out is None or _plain_out(out, (x.shape[0] // self.size, *x.shape[1:]) if x.ndim
                                          else (), x.dtype)):
            result = self._run_direct(fast, "reduce_scatter", x, op, out)
            if result is not None:
                return result
        array, restore = to_numpy(x)
        ufunc = reducer(op)
        if array.ndim == 0 or array.shape[0] % self.size:
            raise ValueError(f"reduce_scatter needs x.shape[0] divisible by the communicator "
                             f"size {self.size}; got shape {array.shape}")
        shape = (array.shape[0] // self.size, *array.shape[1:])
        result = self._output(x, out, shape, array.dtype)
        name = self._choose("reduce_scatter", array.nbytes, algorithm)
        if may_overlap(result, array):
            array = array.copy()  # the transports read x while they write out
        scratch = None
        if self.size == 1 or array.size == 0:
            np.copyto(result, array)
            work = None
        elif name == "native":
            work = partial(self._group.native.reduce_scatter, contiguous_flat(array),
                           _flat(result), op)
        else:  # the algorithms reduce the whole buffer in place: give them a copy
            scratch = np.array(array, order="C").reshape(-1)
            work = partial(FAMILIES[name].reduce_scatter, self._group.coll, scratch, ufunc)
        self._run("reduce_scatter", work, array, op, algorithm=name)
        if scratch is not None:
            block = scratch.size // self.size
            _flat(result)[:] = scratch[self.rank * block:(self.rank + 1) * block]
        return restore(result)

    @entry(ordered=True)
    def broadcast(self, x: Any, root: int = 0, algorithm: str | None = None,
                  out: np.ndarray | None = None) -> Any:
        """Return root's x on every rank (x gives the shape and dtype on the others)."""
        fast = self._direct_path("broadcast", algorithm)
        if (fast and type(x) is np.ndarray and type(root) is int and 0 <= root < self.size
                and (out is None or _plain_out(out, x.shape, x.dtype))):
            result = self._run_direct(fast, "broadcast", x, root, out)
            if result is not None:
                return result
        array, restore = to_numpy(x)
        self._check_rank(root, "root")
        result = self._output(x, out, array.shape, array.dtype)
        name = self._choose("broadcast", array.nbytes, algorithm)
        if self.rank == root and result is not array:
            np.copyto(result, array)
        if self.size == 1 or array.size == 0:
            work = None
        elif name == "native":
            work = partial(self._group.native.broadcast, _flat(result), root)
        else:
            work = partial(FAMILIES[name].broadcast, self._group.coll, _flat(result), root)
        self._run("broadcast", work, array, root=root, algorithm=name)
        return restore(result)

    @entry(ordered=True)
    def barrier(self) -> None:
        """Return once every rank has entered the barrier."""
        name = self._choose("barrier", 0, None)
        if self.size == 1:
            work = None
        elif name == "native":
            work = self._group.native.barrier
        else:
            work = partial(rd.barrier, self._group.coll)
        self._run("barrier", work, None, algorithm=name)

    @entry(ordered=True)
    def all_to_all(self, x: Any, counts: Any = None, algorithm: str | None = None,
                   out: np.ndarray | None = None, recv_counts: Any = None) -> Any:
        """Send block j of x (along axis 0) to rank j; return the blocks from ranks 0..size-1
        in order. Without counts x.shape[0] must divide by size. With counts (the rows of x for
        each rank, in order, summing to x.shape[0]: mixture-of-experts routing) blocks may
        differ in size and the result is (rows received, the count from each rank); the ranks
        first tell each other their counts, unless every rank passes recv_counts (the rows it
        will get from each rank, e.g. when sending results back the way they came)."""
        array, restore = to_numpy(x)
        if array.ndim == 0:
            raise ValueError("all_to_all needs x with at least one dimension")
        row = int(np.prod(array.shape[1:], dtype=np.int64))
        if counts is None:
            if array.shape[0] % self.size:
                raise ValueError(f"all_to_all needs x.shape[0] divisible by the communicator "
                                 f"size {self.size}; got shape {array.shape} (or give counts)")
            send_counts = np.full(self.size, array.shape[0] // self.size, np.int64)
        else:
            send_counts = self._counts(counts, array.shape[0])
        name = self._choose("all_to_all", array.nbytes, algorithm)
        if name == "bruck" and counts is not None:
            if algorithm == "bruck":
                raise ValueError("all_to_all algorithm='bruck' needs blocks of one size; "
                                 "with counts use pairwise, mesh or native")
            name = "pairwise"  # the table's choice for equal blocks
        told = recv_counts is not None
        if told:
            if counts is None:
                raise ValueError("all_to_all's recv_counts go with counts")
            recv_counts = self._counts(recv_counts, None)
        else:
            recv_counts = send_counts
        result = None

        def work() -> None:
            nonlocal recv_counts, result
            if counts is not None and not told:  # first, how many rows each rank sends here
                recv_counts = np.empty(self.size, np.int64)
                self._all_to_all_flat(name, send_counts, recv_counts, np.ones(self.size, np.int64),
                                      np.ones(self.size, np.int64))
            shape = (int(recv_counts.sum()), *array.shape[1:])
            result = self._output(x, out, shape, array.dtype)
            send = array.copy() if may_overlap(result, array) else array
            self._all_to_all_flat(name, contiguous_flat(send), _flat(result), send_counts * row,
                                  recv_counts * row)

        # with counts the ranks' row counts differ: the check compares all but them
        described = array if counts is None else array[:0]
        self._run("all_to_all", work, described, algorithm=name)
        return restore(result) if counts is None else (restore(result), recv_counts)

    @entry(ordered=True)
    def gather(self, x: Any, root: int = 0, algorithm: str | None = None,
               out: np.ndarray | None = None) -> Any:
        """Concatenate every rank's x along axis 0 at root (out is used there); others get
        None."""
        array, restore = to_numpy(x)
        self._check_rank(root, "root")
        shape = self._gathered_shape(array)
        result = self._output(x, out, shape, array.dtype) if self.rank == root else None
        name = self._choose("gather", array.nbytes * self.size, algorithm)
        mine = contiguous_flat(array)
        if result is not None and may_overlap(mine, result):
            mine = mine.copy()

        def work() -> None:
            if self.size == 1:
                _flat(result)[:] = mine
            elif name == "native":
                self._group.native.gather(mine, None if result is None else _flat(result), root)
            else:
                v = (self.rank - root) % self.size
                blocks = (np.empty(tree.subtree(self.size, v) * mine.size, mine.dtype)
                          if result is None or root else _flat(result))
                function("gather", name)(self._group.coll, mine, blocks, root)
                if result is not None and root:  # blocks are in order relative to the root
                    _flat(result)[:] = np.roll(blocks.reshape(self.size, -1), root, 0).ravel()

        self._run("gather", work if mine.size else None, array, root=root, algorithm=name)
        return None if result is None else restore(result)

    @entry(ordered=True)
    def scatter(self, x: Any, root: int = 0, algorithm: str | None = None,
                out: np.ndarray | None = None) -> Any:
        """Split root's x along axis 0 into size blocks and give rank j block j; the other
        ranks pass None (their x is not read): root tells them the shape and dtype."""
        self._check_rank(root, "root")
        header = np.zeros(_HEADER, np.int64)
        if self.rank == root:
            array, _ = to_numpy(x)
            if array.ndim == 0 or array.shape[0] % self.size or array.ndim > _HEADER - 3:
                raise ValueError(f"scatter needs root's x.shape[0] divisible by the "
                                 f"communicator size {self.size} (and at most {_HEADER - 3} "
                                 f"dimensions); got shape {array.shape}")
            header[:3] = DTYPE_CODES[array.dtype], array.ndim, is_mlx(x)
            header[3:3 + array.ndim] = (array.shape[0] // self.size, *array.shape[1:])
        name = self._choose("scatter", 0, algorithm)
        result = None

        def work() -> None:
            nonlocal result
            self._broadcast_flat(header, root)
            dtype = list(DTYPES.values())[header[0]]
            shape = tuple(int(d) for d in header[3:3 + header[1]])
            try:
                result = self._output(None, out, shape, dtype)
            except (TypeError, ValueError):
                result = np.empty(shape, dtype)  # take part; the error comes after
            block = result.size
            if self.rank == root:
                send = contiguous_flat(array)
                if root and name != "native":  # the algorithms take blocks relative to root
                    send = np.roll(send.reshape(self.size, -1), -root, 0).ravel()
            if self.size == 1:
                _flat(result)[:] = send
            elif block == 0:
                pass
            elif name == "native":
                self._group.native.scatter(send if self.rank == root else None, _flat(result),
                                           root)
            else:
                v = (self.rank - root) % self.size
                blocks = send if self.rank == root else np.empty(
                    tree.subtree(self.size, v) * block, dtype)
                function("scatter", name)(self._group.coll, blocks, block, root)
                _flat(result)[:] = blocks[:block]

        self._run("scatter", work, None, root=root, algorithm=name)
        if out is not None and result is not out:
            self._output(None, out, result.shape, result.dtype)  # raises, saying what is wrong
        return restorer(bool(header[2]), result.dtype)(result)

    @entry(ordered=True)
    def reduce(self, x: Any, op: str = "sum", root: int = 0, algorithm: str | None = None,
               out: np.ndarray | None = None) -> Any:
        """Reduce x elementwise over all ranks with op; root gets the result (out is used
        there), the others None."""
        array, restore = to_numpy(x)
        ufunc = reducer(op)
        self._check_rank(root, "root")
        result = self._output(x, out, array.shape, array.dtype) if self.rank == root else None
        name = self._choose("reduce", array.nbytes, algorithm)
        if self.size == 1 or array.size == 0:
            work = None
            if result is not None:
                np.copyto(result, array)
        elif name == "native":
            send = contiguous_flat(array)
            if result is not None and may_overlap(send, result):
                send = send.copy()
            work = partial(self._group.native.reduce, send,
                           None if result is None else _flat(result), op, root)
        else:
            data = np.array(array, order="C").reshape(-1)  # the algorithms combine in place

            def work() -> None:
                function("reduce", name)(self._group.coll, data, ufunc, root)
                if result is not None:
                    _flat(result)[:] = data

        self._run("reduce", work, array, op, root=root, algorithm=name)
        return None if result is None else restore(result)

    # --- non-blocking: each returns a tbcoll.Request (tbcoll/requests.py) ------------------

    @entry(ordered=False)
    def iall_reduce(self, x: Any, op: str = "sum", algorithm: str | None = None,
                    out: np.ndarray | None = None) -> Request:
        return self._submit("all_reduce", _body(Communicator.all_reduce), x, op, algorithm, out)

    @entry(ordered=False)
    def iall_gather(self, x: Any, algorithm: str | None = None,
                    out: np.ndarray | None = None) -> Request:
        return self._submit("all_gather", _body(Communicator.all_gather), x, algorithm, out)

    @entry(ordered=False)
    def ireduce_scatter(self, x: Any, op: str = "sum", algorithm: str | None = None,
                        out: np.ndarray | None = None) -> Request:
        return self._submit("reduce_scatter", _body(Communicator.reduce_scatter), x, op,
                            algorithm, out)

    @entry(ordered=False)
    def ibroadcast(self, x: Any, root: int = 0, algorithm: str | None = None,
                   out: np.ndarray | None = None) -> Request:
        return self._submit("broadcast", _body(Communicator.broadcast), x, root, algorithm, out)

    @entry(ordered=False)
    def iall_to_all(self, x: Any, counts: Any = None, algorithm: str | None = None,
                    out: np.ndarray | None = None, recv_counts: Any = None) -> Request:
        return self._submit("all_to_all", _body(Communicator.all_to_all), x, counts, algorithm, out,
                            recv_counts)

    @entry(ordered=False)
    def isend(self, x: Any, dst: int, tag: int = 0) -> Request:
        """send without waiting; wait() returns None once x may be reused."""
        array, _ = to_numpy(x)
        self._check_peer(dst, "dst", tag)
        flat = contiguous_flat(array)
        return self._start(f"send to rank {dst}", lambda p2p: p2p.isend(flat, dst, tag),
                           lambda: None)

    @entry(ordered=False)
    def irecv(self, out_or_like: Any, src: int, tag: int = 0) -> Request:
        """recv without waiting; wait() returns what recv would (out filled, or a new mlx
        array)."""
        target, restore = self._receive_into(out_or_like, src, tag)
        return self._start(f"recv from rank {src}",
                           lambda p2p: p2p.irecv(target.reshape(-1), src, tag),
                           lambda: restore(target))

    def _progress_thread(self, what: str) -> Progress:
        if self._closed:
            raise TbcollError(f"{what} on a closed communicator")
        if self._progress is None:  # from now on blocking calls wait for the queued ones
            self._progress = Progress(f"tbcoll-progress-{self.backend}-{self.rank}")
        return self._progress

    def _submit(self, what: str, method: Callable[..., Any], *args: Any) -> Request:
        """Queue method(*args) on the progress thread, its arguments checked here first: the
        method runs up to where it would move data (bad arguments raise at the call)."""
        progress = self._progress_thread(what)
        _checking.active = True
        try:
            method(self, *args)  # the class's method: no wait for the queue
        except _ArgumentsChecked:
            pass
        finally:
            _checking.active = False
        return progress.submit(what, partial(method, self, *args))

    def _start(self, what: str, start: Callable[[Any], Any], finish: Callable[[], Any]
               ) -> Request:
        progress = self._progress_thread(what)
        name = partial(self._named_error, what)
        return progress.start(P2PRequest(what, progress, self._group.p2p, finish, name), start)

    def _named_error(self, what: str, error: Exception) -> Exception:
        return self._named(error, what) if isinstance(error, CommError) else error

    # --- point to point ------------------------------------------------------------------

    @entry(ordered=True)
    def send(self, x: Any, dst: int, tag: int = 0) -> None:
        """Send x to rank dst; returns once x may be reused."""
        array, _ = to_numpy(x)
        self._check_peer(dst, "dst", tag)
        try:  # (not a context manager: ~1 us of an 8 B message's few)
            self._group.p2p.send(_flat(array) if array.flags.c_contiguous
                                 else contiguous_flat(array), dst, tag)
        except CommError as e:
            raise self._named(e, f"send to rank {dst}") from e

    @entry(ordered=True)
    def recv(self, out_or_like: Any, src: int, tag: int = 0) -> Any:
        """Receive from rank src into a numpy array (filled in place and returned), or, given
        an mlx array, into a new mlx array of its shape and dtype."""
        target, restore = self._receive_into(out_or_like, src, tag)
        try:
            self._group.p2p.recv(_flat(target), src, tag)
        except CommError as e:
            raise self._named(e, f"recv from rank {src}") from e
        return restore(target)

    def _receive_into(self, out_or_like: Any, src: int,
                      tag: int) -> tuple[np.ndarray, Callable[[np.ndarray], Any]]:
        """recv's checked arguments: the array to fill, and what turns it into the result."""
        template, restore = to_numpy(out_or_like)
        self._check_peer(src, "src", tag)

        if is_mlx(out_or_like):
            return np.empty(template.shape, template.dtype), restore
        return self._output(None, template, template.shape, template.dtype), restore

    # --- communicators -------------------------------------------------------------------

    @entry(ordered=True)
    def split(self, color: int | None, key: int = 0) -> Communicator | None:
        """Split into sub-communicators, one per color, ranked by (key, rank); collective.

        Ranks that pass color=None take part but get None back.
        """
        if color is not None and (not isinstance(color, (int, np.integer))
                                  or not 0 <= color < _INT64):
            raise ValueError(f"split color must be an int in 0..2**63-1 or None, got {color!r}")
        if not isinstance(key, (int, np.integer)):
            raise TypeError(f"split key must be an int, got {key!r}")
        if not -_INT64 <= key < _INT64:
            raise ValueError(f"split key must be an int in -2**63..2**63-1, got {key!r}")
        if self._closed:
            raise TbcollError("split on a closed communicator")
        mine = np.array([-1 if color is None else color, key, self._group.context_hint(),
                         self.node_rank], np.int64)
        table = self.all_gather(mine).reshape(self.size, 4)
        members = [] if color is None else sorted(
            (int(table[r, 1]), r) for r in range(self.size) if table[r, 0] == color)
        ranks = [r for _, r in members]
        # the transport gets the color's index among the colors named (MPI takes C ints)
        colors = sorted({int(c) for c in table[:, 0] if c >= 0})
        sub = self._group.split(None if color is None else colors.index(color), key, ranks,
                                int(table[:, 2].max()))
        if sub is None:
            return None
        local_rank = [r for r in ranks if table[r, 3] == self.node_rank].index(self.rank)
        return Communicator(sub, self.backend, local_rank, self.node_rank,
                            tuple(self._world_ranks[r] for r in ranks))

    def algorithms(self, collective: str) -> tuple[str, ...]:
        """The algorithms this communicator can run collective with."""
        return tuple(a for a in ALGORITHMS[collective]
                     if a != "native" or self._has_native(collective))

    def describe(self) -> str:
        """Who this rank is and which algorithm each collective uses at which size."""
        lines = [f"tbcoll communicator: rank {self.rank} of {self.size}, backend {self.backend}, "
                 f"local rank {self.local_rank}, node {self.node_rank}"]
        for collective in COLLECTIVES:
            if collective in self._overrides:
                rule = f"{self._overrides[collective]} (TBCOLL_ALGO)"
            else:
                rule = tuning.describe(self._table, collective)
            lines.append(f"  {collective}: {rule}")
        return "\n".join(lines + self._group.describe_links())

    def close(self) -> None:
        if self._guard.forked:  # a child of os.fork(): the connections are the parent's
            self._closed = True
        if not self._closed:
            if self._progress is not None:
                self._progress.stop()  # what was started finishes first
            self._closed = True
            self._direct = self._direct_default = dict.fromkeys(self._direct)
            self._release()

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Communicator rank {self.rank} of {self.size}, backend {self.backend}>"

    # --- helpers -------------------------------------------------------------------------

    def _choose(self, collective: str, nbytes: int, algorithm: str | None) -> str:
        if self._closed:
            raise TbcollError(f"{collective} on a closed communicator")
        if algorithm is not None:
            self._check_algorithm(collective, algorithm, "algorithm")
            return algorithm
        if collective in self._overrides:
            return self._overrides[collective]
        return tuning.choose(self._table, collective, nbytes, self.size)

    def _gathered_shape(self, array: np.ndarray) -> tuple[int, ...]:
        """all_gather's result: size copies of x along axis 0 (a 0-d x gives (size,))."""
        return (self.size * array.shape[0], *array.shape[1:]) if array.ndim else (self.size,)

    def _direct_path(self, collective: str, algorithm: str | None) -> Callable | None:
        """The transport's one-call path this call may take, if any."""
        if algorithm is None:
            return self._direct_default[collective]
        return self._direct[collective] if algorithm == "native" else None

    def _run_direct(self, path: Callable, collective: str, *args: Any) -> np.ndarray | None:
        if _checking.active:
            raise _ArgumentsChecked
        try:
            result = path(*args)
        except CommError as e:
            raise self._named(e, collective) from e
        if result is not None:
            self._seq += 1
        return result

    def _check_algorithm(self, collective: str, algorithm: str, where: str) -> None:
        allowed = ALGORITHMS[collective]
        if algorithm not in allowed:
            raise ValueError(f"{where}={algorithm!r} is not an algorithm of {collective}; "
                             f"use one of {', '.join(allowed)}")
        if algorithm == "native" and not self._has_native(collective):
            raise ValueError(f"{where}='native': the {self.backend} transport has no native "
                             f"{collective}; use one of {', '.join(allowed[:-1])}")

    def _has_native(self, collective: str) -> bool:
        return self._group.native is not None and collective in self._group.native.offers

    def _counts(self, counts: Any, rows: int | None) -> np.ndarray:
        """all_to_all's counts, checked: one non-negative int per rank, summing to rows (if
        given)."""
        found = np.asarray(counts)
        if found.shape != (self.size,) or found.dtype.kind not in "iu" or (found < 0).any():
            raise ValueError(f"all_to_all counts must be {self.size} non-negative ints (rows "
                             f"for each rank); got {counts!r}")
        if rows is not None and int(found.sum()) != rows:
            raise ValueError(f"all_to_all counts sum to {int(found.sum())} but x has {rows} "
                             "rows")
        return found.astype(np.int64)

    def _all_to_all_flat(self, name: str, send: np.ndarray, recv: np.ndarray,
                         send_counts: np.ndarray, recv_counts: np.ndarray) -> None:
        """all_to_all of 1-D buffers; counts in elements per rank."""
        if self.size == 1:
            recv[:] = send
        elif name == "native":
            self._group.native.all_to_all(send, recv, send_counts, recv_counts)
        else:
            function("all_to_all", name)(self._group.coll, _split(send, send_counts),
                                         _split(recv, recv_counts))

    def _broadcast_flat(self, buf: np.ndarray, root: int) -> None:
        """broadcast of a small 1-D buffer (scatter's header), by the broadcast's own choice."""
        if self.size == 1:
            return
        name = self._choose("broadcast", buf.nbytes, None)
        if name == "native":
            self._group.native.broadcast(buf, root)
        else:
            function("broadcast", name)(self._group.coll, buf, root)

    def _output(self, x: Any, out: np.ndarray | None, shape: tuple, dtype: np.dtype) -> np.ndarray:
        """The array a result goes into: out, checked, or a new one."""
        if out is None:
            return np.empty(shape, dtype)
        if is_mlx(x):
            raise TypeError("out= is not supported for mlx arrays (they are immutable); "
                            "use the returned array")
        if not isinstance(out, np.ndarray):
            raise TypeError(f"out must be a numpy array, got {type(out).__name__}")
        if out.shape != tuple(shape) or out.dtype != dtype:
            raise ValueError(f"out has shape {out.shape} and dtype {out.dtype}; "
                             f"expected shape {tuple(shape)} and dtype {dtype}")
        if not (out.flags.c_contiguous and out.flags.writeable):
            raise ValueError("out must be C-contiguous and writeable")
        return out

    def _check_rank(self, rank: int, what: str) -> None:
        if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not (
                0 <= rank < self.size):
            raise ValueError(f"{what}={rank!r} is not a rank of this communicator "
                             f"(0..{self.size - 1})")

    def _check_peer(self, peer: int, what: str, tag: int) -> None:
        if not isinstance(tag, (int, np.integer)) or not 0 <= tag <= MAX_TAG:
            raise ValueError(f"tag={tag!r} must be an int in 0..{MAX_TAG}")
        self._check_rank(peer, what)
        if self._closed:
            raise TbcollError(f"{'send to' if what == 'dst' else 'recv from'} rank {peer} on a "
                              "closed communicator")
        if peer == self.rank:
            raise ValueError(f"{what}={peer} is this rank; send/recv need another rank")

    def _run(self, collective: str, work: Callable[[], None] | None, array: np.ndarray | None,
             op: str | None = None, root: int = -1, algorithm: str = "native") -> None:
        """Run work() (None: nothing to move) as this collective: tell the transport the call
        (whose signature it compares across ranks), with TBCOLL_CHECK first compare the call
        in full, and name the collective in any CommError."""
        if _checking.active:
            raise _ArgumentsChecked
        self._seq += 1
        try:
            if self.size > 1:
                if self._check_calls:  # (its messages go as part of the call before)
                    verify_calls_match(self._group.coll, collective, array, op, root, algorithm)
                self._group.begin_call(self._seq, signature(
                    collective, None if array is None else array.dtype, op,
                    0 if array is None else array.nbytes, root, algorithm))
            if work is not None:
                work()
            if self.size > 1:
                self._group.end_call()
        except CommError as e:
            raise self._named(e, collective) from e

    def _named(self, error: CommError, what: str) -> CommError:
        """error again, naming the operation and this rank. A failure caused by peers also
        tells tbrun which (in world ranks), so that it names them, not this rank."""
        message = f"{what} on rank {self.rank}: {error}"
        if not isinstance(error, PeerError):
            return CommError(message)
        peers = tuple(self._world_ranks[p] for p in error.peers if 0 <= p < self.size)
        report_peer_failure(message, peers)
        return type(error)(message, peers)
