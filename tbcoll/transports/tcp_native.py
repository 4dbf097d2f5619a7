"""tcp's native all_reduce for small messages: every rank sends its block to every other,
then reduces all of them in rank order, so that every rank's result is bit-identical.

At np=2 that is one message each way, as recursive doubling, but without the Communicator's
call description and the algorithm layer: the Communicator's one-call path
(Native.direct_all_reduce) comes straight here, and where tbcoll.transports._sockets is
built the exchange is one C call (TcpTransport.exchange) and so is the reduction. Its
messages carry the call, as every collective's over the stream engine, so that ranks whose
calls differ fail.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from tbcoll.calls import signature
from tbcoll.dtypes import DTYPE_CODES, OP_CODES, OPS
from tbcoll.transports.stream import StreamEndpoint

if TYPE_CHECKING:
    from tbcoll.transports.tcp import TcpTransport

try:
    from tbcoll.transports import _sockets
except ImportError:  # built without a compiler: numpy reduces
    _sockets = None

_TAG = 8  # apart from the algorithms' tags (tbcoll.algorithms)
_KEEP = 1 << 20  # blocks of this size and more are kept from call to call (_kept_blocks)
_SMALL_SHAPES = 64  # smaller blocks are kept by shape, for this many shapes at most


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
        self._small: dict[tuple[np.dtype, int], np.ndarray] = {}  # blocks under _KEEP, by shape

    def direct_all_reduce(self, x: np.ndarray, op: str, root: int,
                          out: np.ndarray | None) -> np.ndarray | None:
        if not x.flags.c_contiguous:
            return None
        self._coll.begin_next_call(signature("all_reduce", x.dtype, op, x.nbytes))
        out = np.empty_like(x) if out is None else out
        self._exchange(x, out, op)
        return out

    def all_reduce(self, send: np.ndarray | None, recv: np.ndarray, op: str) -> None:
        """send None: in place in recv (the Communicator has begun the call)."""
        self._exchange(recv if send is None else send, recv, op)

    def _kept_blocks(self, mine: np.ndarray) -> np.ndarray:
        """Room for the other ranks' blocks, kept from call to call (for large ones: fresh
        pages cost more than the copy into them at 16 MB)."""
        nbytes = (self.size - 1) * mine.nbytes
        if self._kept.nbytes < nbytes:
            self._kept = np.empty(nbytes, np.uint8)
        return self._kept[:nbytes].view(mine.dtype).reshape(self.size - 1, mine.size)

    def _exchange(self, mine: np.ndarray, out: np.ndarray, op: str) -> None:
        """out = every rank's mine, op'ed in rank order (both C-contiguous, of one shape)."""
        # the others', in rank order
        key = mine.dtype, mine.size
        if (blocks := self._small.get(key)) is None:
            if mine.nbytes >= _KEEP:
                blocks = self._kept_blocks(mine)
            else:
                if len(self._small) >= _SMALL_SHAPES:
                    self._small.clear()
                blocks = self._small[key] = np.empty((self.size - 1, mine.size), mine.dtype)
        self._transport.exchange(mine, self._peers, blocks, self._context, _TAG,
                                 self._coll.call)
        if _sockets is not None:
            _sockets.reduce(blocks, mine, self.rank, out, DTYPE_CODES[mine.dtype], OP_CODES[op])
            return
        mine, out = mine.reshape(-1), out.reshape(-1)
        rows = [*blocks[:self.rank], mine.copy(), *blocks[self.rank:]]  # out may be mine
        reduce = OPS[op]
        reduce(rows[0], rows[1], out=out)
        for row in rows[2:]:
            reduce(out, row, out=out)
