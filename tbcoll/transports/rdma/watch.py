"""What rdma's waits watch besides the device: whether a peer is gone, or (failover on) a pair
whose RDMA failed is to move to tcp (docs/failover.md)."""

from __future__ import annotations

import time

from tbcoll.core.errors import PEER_ENDED
from tbcoll.transports.tcp.transport import TcpTransport

PORT_LOOK = 0.25  # seconds between looks at the devices' ports (failover on)


class Watch:
    """Whether a peer is gone, seen from the tcp connections beside the queue pairs and from
    the device's own completions (RC's retries exhausted). With failover on (moves), a failed
    RDMA pair or a dead link is not a lost peer but a pair to move to tcp (failures); only a
    side connection its peer closed (it ended) is a loss."""

    def __init__(self, fabric: object, side: TcpTransport, peers: list[int],
                 moves: bool = False) -> None:
        self._fabric, self._side, self._peers, self._moves = fabric, side, peers, moves
        self._moved: set[int] = set()  # pairs on tcp now: their own stream shows the peer
        self._next_port_look = 0.0

    def moved(self, rank: int) -> None:
        self._moved.add(rank)

    def losses(self) -> list[tuple[int, str]]:
        """Every peer found gone: (rank, why), the device's word first."""
        watched = [rank for rank in self._peers if rank not in self._moved]
        found = [] if self._moves else [(rank, why) for rank in watched
                                        if (why := self._fabric.lost(rank))]
        named = {rank for rank, _ in found}
        return found + [(rank, why) for rank, why in self._side.silent_losses()
                        if rank not in named and rank in watched
                        and (not self._moves or why.startswith(PEER_ENDED))]

    def loss(self) -> tuple[int, str] | None:
        losses = self.losses()
        return losses[0] if losses else None

    def failures(self) -> list[tuple[int, str]]:
        """The pairs to move off RDMA (failover on): (rank, why)."""
        if not self._moves:
            return []
        watched = [rank for rank in self._peers if rank not in self._moved]
        found = [(rank, f"RDMA: {why}") for rank in watched if (why := self._fabric.lost(rank))]
        if time.monotonic() >= self._next_port_look:
            self._next_port_look = time.monotonic() + PORT_LOOK
            found += [(rank, f"port 1 of RDMA device {device} is down")
                      for rank, device in self._fabric.down()]
            found += [(rank, why) for rank, why in self._side.silent_losses()
                      if rank in watched and not why.startswith(PEER_ENDED)]
        return found
