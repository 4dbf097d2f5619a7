"""The native mesh with pairs moved off RDMA (docs/failover.md): a pair whose RDMA failed goes
on over tcp, and so do its mesh blocks, while every other pair keeps its queue pairs.

A moved peer's block of each mesh call comes as a message on the pair's stream (now a tcp
connection), context MESH and tag the call's number, and is handed to the C mesh (put), which
reduces every block in rank order as before: every rank gets the same bits, and the ranks
whose pairs did not move see nothing of it.

At the move the two ends may be one call apart: a rank whose block of call n went out over
RDMA before the cable went may have finished call n while its peer, which never got that
block, still waits in it. So at the move each end sends the other its block of the last call
it finished and, where one is under way, of that one too; a receiver takes only the block of
the call it is in (by tag), and an earlier one that it no longer needs stays unread (at most
two per move, 64 KiB each).
"""

from __future__ import annotations

import numpy as np

MESH = 0x7FFF_FFF0  # the blocks' context: far above any communicator's (they count up from 0
# by twos), below the engine's own (top bit set)
TAGS = 1 << 31  # a block's tag: its call's number modulo this


class MovedBlocks:
    """The mesh blocks of the pairs moved off RDMA, over the stream (turns held, as the mesh)."""

    def __init__(self, fabric: object, stream: object) -> None:
        self._fabric, self._stream = fabric, stream
        self._given: dict[int, int] = {}  # moved peer -> the last call whose block went to it
        self._recvs: dict[int, tuple[int, object, np.ndarray]] = {}  # peer -> (call, recv, buf)
        self._sends: list[tuple[object, np.ndarray]] = []  # (send, its buffer) until done

    @property
    def any(self) -> bool:
        return bool(self._given)

    def moved(self, rank: int) -> None:
        """rank's pair has just left RDMA (its queue pairs released): send it the blocks it
        may lack (see the module's docstring)."""
        seq, under_way, _ = self._fabric.mesh_state()
        if seq > 0:
            self._send(rank, seq - 1)
        if under_way:
            self._send(rank, seq)
        self._given[rank] = seq if under_way else seq - 1

    def advance(self) -> None:
        """The call under way: send this rank's block to the moved peers that lack it, take
        theirs as they come (put); moves the stream, waiting a slice where a block is due."""
        seq, under_way, missing = self._fabric.mesh_state()
        if under_way:
            for rank, given in self._given.items():
                if given < seq:
                    self._send(rank, seq)
                    self._given[rank] = seq
            size = len(self._fabric.own_block(seq & 1))  # every block of a call is as large
            for rank in missing:
                if self._recvs.get(rank, (None,))[0] != seq:
                    buf = np.empty(size, np.uint8)
                    self._recvs[rank] = (seq, self._stream.irecv(buf, rank, MESH, seq % TAGS),
                                         buf)
        pending = [request for _, request, _ in self._recvs.values()]
        if not self._stream.test(pending + [request for request, _ in self._sends]) and pending:
            self._stream.wait_a_slice()  # (the C mesh has returned at once: not a spin)
        for rank, (_, request, buf) in list(self._recvs.items()):
            if request.done:
                self._fabric.put(rank, buf)
                del self._recvs[rank]
        self._sends = [(request, buf) for request, buf in self._sends if not request.done]

    def _send(self, rank: int, seq: int) -> None:
        block = np.frombuffer(self._fabric.own_block(seq & 1), np.uint8)
        self._sends.append((self._stream.isend(block, rank, MESH, seq % TAGS), block))
