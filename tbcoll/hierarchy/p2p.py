"""Point-to-point over two levels: each peer is reached through the level that holds it."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np

from tbcoll.core.errors import PeerError, PeerTimeoutError
from tbcoll.core.protocols import P2P
from tbcoll.hierarchy.hosts import Hosts

# A wait on both levels at once looks at each in turn (neither can sleep in the other's
# poll): at once, then after naps that grow to this, so that a long wait yields its core
_LONGEST_NAP = 1e-3


class TwoLevelP2P:
    """The P2P of a two-level group: a peer on this host through the host's endpoint (its
    ranks renumbered), another through the network's (the group's own ranks). A request is
    (endpoint, its request, peer): each endpoint waits on its own.

    A wait on one level alone would leave the other's sends unmoved (a ring's step waits for
    a message from this host while its send to the next host still fills a socket, and that
    host waits for it): while either level has requests of this rank unfinished, a wait moves
    both."""

    def __init__(self, hosts: Hosts, world: tuple[int, ...], local: P2P, network: P2P,
                 timeout: float) -> None:
        """world: the world rank of each group rank: errors name peers so (the network's
        already do; the host's name its own ranks)."""
        self.rank, self.size = hosts.rank, len(hosts.nodes)
        self.acknowledge = local.acknowledge or network.acknowledge
        self._timeout, self._local, self._world = timeout, local, world
        self._local_world = tuple(world[r] for r in hosts.here)
        self._routes = [(local, hosts.local_index(r)) if hosts.nodes[r] == hosts.node
                        else (network, r) for r in range(self.size)]
        self._started: dict[P2P, list] = {local: [], network: []}  # what may be unfinished

    def isend(self, buf: np.ndarray, peer: int, tag: int) -> tuple:
        endpoint, index = self._routes[peer]
        request = endpoint.isend(buf, index, tag)
        self._started[endpoint].append(request)
        return endpoint, request, peer

    def irecv(self, buf: np.ndarray, peer: int, tag: int) -> tuple:
        endpoint, index = self._routes[peer]
        request = endpoint.irecv(buf, index, tag)
        self._started[endpoint].append(request)
        return endpoint, request, peer

    def send(self, buf: np.ndarray, peer: int, tag: int) -> None:
        self.waitall([self.isend(buf, peer, tag)])

    def recv(self, buf: np.ndarray, peer: int, tag: int) -> None:
        self.waitall([self.irecv(buf, peer, tag)])

    def waitall(self, requests: Sequence[tuple]) -> None:
        """Where only one level has anything unfinished, its own wait; else both moved in
        turn until requests are done."""
        wanted = _by_endpoint(requests)
        moving = self._unfinished()
        if len(moving) <= 1 and len(wanted) == 1:
            (endpoint, waiting), = wanted.items()
            self._on(endpoint, endpoint.waitall, waiting)
            return
        deadline, nap = time.monotonic() + self._timeout, 0.0
        while True:
            for endpoint, started in moving.items():
                self._on(endpoint, endpoint.test, started)  # moves that level
            if all([self._on(endpoint, endpoint.test, waiting)
                    for endpoint, waiting in wanted.items()]):
                return
            if time.monotonic() > deadline:
                peers = sorted({self._world[peer] for _, request, peer in requests
                                if not getattr(request, "done", False)})
                raise PeerTimeoutError(f"ranks {peers} did not take part "
                                       f"within {self._timeout:g} s (TBCOLL_TIMEOUT)", peers)
            time.sleep(nap)
            nap = min(_LONGEST_NAP, nap * 2 or 20e-6)
            moving = self._unfinished()

    def test(self, requests: Sequence[tuple]) -> bool:
        for endpoint, started in self._unfinished().items():
            self._on(endpoint, endpoint.test, started)
        return all([self._on(endpoint, endpoint.test, waiting)
                    for endpoint, waiting in _by_endpoint(requests).items()])

    def _on(self, endpoint: P2P, method: Callable, requests: list) -> bool | None:
        """method(requests) of one level; the host's failures name world ranks."""
        try:
            return method(requests)
        except PeerError as error:
            if endpoint is not self._local:
                raise
            peers = tuple(self._local_world[p] for p in error.peers)
            raise type(error)(str(error), peers) from error

    def _unfinished(self) -> dict[P2P, list]:
        """Each level's requests of this rank not yet done (the done ones forgotten)."""
        for started in self._started.values():
            started[:] = [r for r in started if not r.done]
        return {endpoint: started for endpoint, started in self._started.items() if started}


def _by_endpoint(requests: Sequence[tuple]) -> dict[P2P, list]:
    found: dict[P2P, list] = {}
    for endpoint, request, _ in requests:
        found.setdefault(endpoint, []).append(request)
    return found
