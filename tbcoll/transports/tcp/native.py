"""tcp's native all_reduce for small messages: every rank sends its block to every other,
then reduces all of them in rank order, so that every rank's result is bit-identical.

At np=2 that is one message each way, as recursive doubling, but without the Communicator's
call description and the algorithm layer. Where tbcoll.transports.tcp._sockets is built, the
whole call is one C call (its Lane, tbcoll/transports/tcp/tcp_lane.c: the Communicator binds it
as Native.lane), as shm's is; where the Lane leaves a call (the engine shared by threads, or
holding something for a peer) the Communicator's one-call path (direct_all_reduce) comes
here, and the exchange and the reduction are still one C call (TcpTransport.exchange). Its
messages carry the call, as every collective's over the stream engine, so that ranks whose
calls differ fail.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from tbcoll.core.callbacks import checked
from tbcoll.core.calls import signature
from tbcoll.core.dtypes import DTYPE_CODES, OP_CODES, reducer
from tbcoll.core.extensions import c_extension
from tbcoll.transports.stream import StreamEndpoint

if TYPE_CHECKING:
    from tbcoll.transports.tcp.transport import TcpTransport

_sockets = c_extension("tbcoll.transports.tcp._sockets")  # None (no compiler): numpy reduces

_TAG = 8  # apart from the algorithms' tags (tbcoll.algorithms)
_KEEP = 1 << 20  # blocks of this size and more share one buffer (_kept_blocks)
# The largest message exchanged whole: the Lane's largest (calls()), and past it, at np=2,
# _halves. One number, so that a rank whose call the Lane took (on time) and one whose call
# it left to Python (late: the peer's message already in the engine) run the same protocol.
_WHOLE = _KEEP
_SHAPES = 64  # calls' plans kept (TcpNative._plan), for this many shapes at most
# all_reduce's signatures less the byte count, by dtype code then op code (the Lane's)
_SIGNATURES = [signature("all_reduce", dtype, op, 0) for dtype in DTYPE_CODES for op in OP_CODES]


def in_halves(size: int, mine: np.ndarray) -> bool:
    """Whether an all_reduce of mine goes in halves (TcpNative._halves): decided by what
    every rank's call agrees on (the size of the group and of x), never by which path took
    it; never for a call the Lane may take (up to _WHOLE)."""
    return size == 2 and mine.nbytes > _WHOLE and mine.size % 2 == 0


class TcpNative:
    """A group's native collectives over its tcp connections (Native of transports.base)."""

    offers = frozenset(("all_reduce",))
    takes_mlx = False
    direct_all_gather = direct_broadcast = direct_reduce_scatter = None

    def __init__(self, transport: TcpTransport, coll: StreamEndpoint, context: int,
                 members: list[int]) -> None:
        """coll: the group's endpoint for collectives, on context; members: world ranks."""
        self._transport, self._coll, self._context = transport, coll, context
        self.rank, self.size = coll.rank, coll.size
        self._peers = tuple(world for rank, world in enumerate(members) if rank != self.rank)
        self._kept = np.empty(0, np.uint8)
        self._plans: dict[tuple[np.dtype, int, str], tuple] = {}  # by dtype, size, op
        # the whole call in C, up to _WHOLE bytes (past them, the blocks are kept here)
        self.lane = transport.lane(self._peers, coll, self.rank, _TAG)
        if self.lane is not None:
            lock = transport.turns.lock
            spin, budget = transport.c_wait()
            self.lane.calls(take=checked("take", lock.acquire), give=lock.release,
                            largest=_WHOLE, signatures=_SIGNATURES,
                            spin=spin, budget=budget, finish=checked("tcp_finish", self._finish))

    def direct_all_reduce(self, x: np.ndarray, op: str, root: int,
                          out: np.ndarray | None) -> np.ndarray | None:
        if not x.flags.c_contiguous:
            return None
        plan = self._plans.get((x.dtype, x.size, op)) or self._plan(x, op)
        call = self._coll.begin_next_call(plan[0])
        out = np.empty_like(x) if out is None else out
        self._exchange(x, out, op, plan, call)
        return out

    def all_reduce(self, send: np.ndarray | None, recv: np.ndarray, op: str) -> None:
        """send None: in place in recv (the Communicator has begun the call)."""
        mine = recv if send is None else send
        self._exchange(mine, recv, op, self._plans.get((mine.dtype, mine.size, op))
                       or self._plan(mine, op), self._coll.call)

    def _finish(self, x: np.ndarray, out: np.ndarray, blocks: bytearray, header: bytes,
                stopped: tuple, dtype_code: int, op_code: int) -> None:
        """The rest of a Lane call whose exchange C stopped (stopped: as _sockets.exchange
        says), with the engine taken by the Lane: the engine goes on from there into blocks
        (the Lane's, which it never resizes), then the reduction into out."""
        mine = x.reshape(-1)
        others = np.frombuffer(blocks, x.dtype, (self.size - 1) * x.size).reshape(self.size - 1,
                                                                                 x.size)
        self._transport.resume_exchange(mine, self._peers, others, self._context, _TAG,
                                        self._coll.call, header, stopped)
        _sockets.reduce(others, mine, self.rank, out, dtype_code, op_code)

    def _plan(self, x: np.ndarray, op: str) -> tuple[int, np.ndarray | None, int, int]:
        """What an all_reduce of x's dtype, size and op needs besides x, kept (working it out
        is ~0.4 us of an 8 B call's ~6): its call's signature, room for the others' blocks
        (None from _KEEP up: those share one buffer) and the C reduction's codes."""
        if len(self._plans) >= _SHAPES:
            self._plans.clear()
        blocks = None if x.nbytes >= _KEEP else np.empty((self.size - 1, x.size), x.dtype)
        plan = self._plans[x.dtype, x.size, op] = (
            signature("all_reduce", x.dtype, op, x.nbytes), blocks, DTYPE_CODES[x.dtype],
            OP_CODES[op])
        return plan

    def _kept_blocks(self, mine: np.ndarray) -> np.ndarray:
        """Room for the other ranks' blocks, kept from call to call (for large ones: fresh
        pages cost more than the copy into them at 16 MB)."""
        nbytes = (self.size - 1) * mine.nbytes
        if self._kept.nbytes < nbytes:
            self._kept = np.empty(nbytes, np.uint8)
        return self._kept[:nbytes].view(mine.dtype).reshape(self.size - 1, mine.size)

    def _exchange(self, mine: np.ndarray, out: np.ndarray, op: str,
                  plan: tuple[int, np.ndarray | None, int, int], call: tuple[int, int]) -> None:
        """out = every rank's mine, op'ed in rank order (both C-contiguous, of one shape), in
        the call begun (call: the endpoint's)."""
        _, blocks, dtype_code, op_code = plan
        if in_halves(self.size, mine) and _sockets:
            self._halves(mine.reshape(-1), out.reshape(-1), dtype_code, op_code, call)
            return
        if blocks is None:
            blocks = self._kept_blocks(mine)
        # the others', in rank order, and where C could, the sum (or op) of all
        with self._transport.turns:
            reduced = self._transport.exchange(mine, self._peers, blocks, self._context, _TAG,
                                               call, (out, None, self.rank, dtype_code, op_code))
        if reduced:
            return
        if _sockets is not None:
            _sockets.reduce(blocks, mine, self.rank, out, dtype_code, op_code)
            return
        mine, out = mine.reshape(-1), out.reshape(-1)
        rows = [*blocks[:self.rank], mine.copy(), *blocks[self.rank:]]  # out may be mine
        reduce = reducer(op)
        reduce(rows[0], rows[1], out=out)
        for row in rows[2:]:
            reduce(out, row, out=out)

    def _halves(self, mine: np.ndarray, out: np.ndarray, dtype_code: int, op_code: int,
                call: tuple[int, int]) -> None:
        """np=2, large messages: each rank reduces half (mine's and the peer's copy of it, in
        rank order, while it comes) and the halves are exchanged: two exchanges of half the
        bytes, and half the reduction on each rank, where one exchange of all of them had
        each rank reduce it all (16 MB: 1.43x as fast; benchmarks/RESULTS.md). Every rank
        ends with the same bits: each half is computed once."""
        half = mine.size // 2
        low, high = slice(0, half), slice(half, None)
        ours, theirs = (low, high) if self.rank == 0 else (high, low)
        block = self._kept_blocks(mine[:half])
        with self._transport.turns:
            if not self._transport.exchange(mine[theirs], self._peers, block, self._context,
                                            _TAG, call, (out[ours], mine[ours], self.rank,
                                                         dtype_code, op_code)):
                _sockets.reduce(block, mine[ours], self.rank, out[ours], dtype_code, op_code)
            self._transport.exchange(out[ours], self._peers, out[theirs].reshape(1, half),
                                     self._context, _TAG, call)
