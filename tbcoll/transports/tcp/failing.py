"""tcp's failover (docs/failover.md), a part of TcpTransport: what it keeps of what its C
paths send (the tails), what a failed C send does, how it finds a dead link, closes it and
connects again, and how the new connection takes the old one's place (the fd number C's
lanes and exchanges hold). Which pairs fail over: failing_over."""

from __future__ import annotations

import functools
import os
import select
import socket
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from tbcoll.core.errors import PeerLostError
from tbcoll.job.pathevents import PathChange
from tbcoll.transports.socket_mesh import Route, link_of, path_in_use, send_failure, unanswered
from tbcoll.transports.stream import Channel, Peer, bytes_of
from tbcoll.transports.stream.outq import unacked_bytes
from tbcoll.transports.tcp.moves import path_text, say

READ_EVENTS = select.POLLIN | select.POLLHUP | select.POLLERR


class TcpFailover:
    """TcpTransport's failover methods (it is their only user: they use its poller, its
    maps of fds, links and paths, its reconnector and the engine's words)."""

    _in_c: bool
    _reconnector: Any
    _wrap: Any

    def keep_whole(self, buf: np.ndarray, dest: int, header: bytes) -> None:
        """Keep in dest's tail a message a C lane wrote whole that C did not copy (a large
        one, or a full ring: the Tail asks the kernel and grows), the engine held."""
        self._peers[dest].tail.wrote_whole([memoryview(header), bytes_of(buf)])

    def _keep_whole(self, streams: list[Peer], header: bytes, buf: np.ndarray) -> None:
        """Keep in each of streams' tails a message C wrote whole to it (failover's)."""
        whole = None
        for stream in streams:
            if stream.tail is not None:
                whole = whole or [memoryview(header), bytes_of(buf)]
                stream.tail.wrote_whole(whole)

    def _send_broke(self, peer: Peer, error: int) -> None:
        """A C path's send to peer failed (error: its errno): the stream fails over where
        failover is on (the rest of the message waits for the new connection), else it is
        lost, raised."""
        if not self._link_failed(peer, send_failure(error),
                                 f"send failed: {os.strerror(error)}"):
            raise PeerLostError(f"lost connection to rank {peer.rank} ({peer.lost})",
                                (peer.rank,))

    def _check_links(self, peers: Iterable[Peer]) -> None:
        """Python's look (C's watcher looks every 100 ms where built: _watch)."""
        for peer in peers:
            if why := unanswered(peer.channel):
                self._link_failed(peer, why)

    def _reconnect(self, peer: Peer,
                   received: int) -> Callable[[], tuple[Channel, int] | None] | None:
        """Close the failed connection (so that the peer, if it has not noticed, does); the
        work that connects again over the next path (the Reconnector)."""
        old = peer.channel
        used = self._in_use.get(peer.rank)
        self._leaving[peer.rank] = path_text(used, self.link(peer.rank))
        self._poller.unregister(old)
        del self._by_fd[old.fileno()]
        self._unwatch(old)
        if self._in_c:  # C holds the fd's number: keep it (the new connection takes it over)
            placeholder = socket.socket(old.family, socket.SOCK_STREAM)
            os.dup2(placeholder.fileno(), old.fileno(), inheritable=False)  # closes the old
            placeholder.close()
        else:
            old.close()
        self._found.pop(peer.rank, None)
        if self._reconnector is None:
            return None
        rank, generation = peer.rank, peer.generation + 1
        back = rank in self._failback
        self._failback.discard(rank)

        def again() -> tuple[Channel, int] | None:
            found = (self._reconnector(rank, generation, received, used, back) if back else
                     self._reconnector(rank, generation, received, used))
            if found is None:
                return None
            sock, theirs = found
            return (self._wrap(self.rank, rank, generation, sock) if self._wrap else sock,
                    theirs)

        return again

    def _failed_over(self, peer: Peer, reason: str, replayed: int, seconds: float) -> None:
        """The one place a failover is told: this rank's log line, the flight recorder (its
        dumps and --trace), describe(), and tbrun (which prints one line per pair of hosts:
        tbcoll.launch.failovers)."""
        change = PathChange(self.rank, peer.rank, peer.generation,
                            self._leaving.pop(peer.rank, "?"),
                            path_text(self._in_use.get(peer.rank), self.link(peer.rank)),
                            reason, replayed, round(seconds, 4),
                            told=self._told.pop(peer.rank, False))
        self._moves.setdefault(peer.rank, []).append((time.strftime("%H:%M:%S"), change))
        say(change)

    def _adopt(self, peer: Peer, channel: Channel) -> None:
        """Watch the new connection as the old one was (its sends' interest kept); where C
        holds the old one's fd number (lanes, exchanges), the new one takes it over."""
        if self._in_c:
            os.dup2(channel.fileno(), peer.channel.fileno(), inheritable=False)
            channel.close()
            channel = peer.channel
        channel.setblocking(False)
        peer.channel = channel
        self._watch(channel)
        self._by_fd[channel.fileno()] = peer
        self._poller.register(channel, READ_EVENTS | (select.POLLOUT if peer in self._writing
                                                      else 0))
        self._links[peer.rank] = link_of(channel)
        self._in_use[peer.rank] = path_in_use(getattr(channel, "socket", channel),
                                              self._paths.get(peer.rank, ()))
        if peer.tail is not None and hasattr(channel, "unacked"):
            peer.tail.unacked = channel.unacked
        elif peer.tail is not None:
            peer.tail.unacked = functools.partial(unacked_bytes, channel)

def failing_over(asked: bool | None, faults: bool, route: Route,
                 peers: Iterable[int]) -> frozenset[int]:
    """The peers whose streams fail over (docs/failover.md): every one where TBCOLL_FAILOVER=1
    or TBCOLL_FAULTS asks, none where TBCOLL_FAILOVER=0, else those to which the hostfile
    gives several paths (a single-path pair stays as it was: no tail, lost when it fails)."""
    if asked is False and not faults:
        return frozenset()
    if asked or faults:
        return frozenset(peers)
    return frozenset(peer for peer in peers if len(route(peer) or ()) > 1)
