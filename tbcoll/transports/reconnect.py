"""Failover's reconnection over the socket mesh (docs/failover.md): a pair of ranks whose
connection failed connects again over its next path, through the job's store (the lower rank
listens and publishes, the higher one connects and proves the job's token, as at set-up), and
the two ends exchange their RECEIVED counts; the asks by which one end tells the other, and a
pair of hosts' events; fail-back's probe of an earlier path.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import select
import socket
import struct
import threading
import time

from tbcoll.core.errors import AuthenticationError, CommError
from tbcoll.core.wire import recv_exactly
from tbcoll.job.auth import HANDSHAKE_TIMEOUT, accept_handshake
from tbcoll.job.env import LaunchInfo, format_hostport, parse_hostport
from tbcoll.job.failures import FAILED, parse_failed
from tbcoll.job.rendezvous import Store
from tbcoll.job.topology import Path
from tbcoll.transports.socket_mesh import (
    RANK_WIRE,
    Route,
    connect_over,
    listen_on_hosts,
    notice_dead_links,
    ways_to,
)

log = logging.getLogger("tbcoll.tcp")

_COUNT = struct.Struct("!Q")
_LOOK_FOR_FAILED = 0.25  # seconds between a failover's looks at tbrun's failed set
# why a rank asks its peer to fail over their pair (Reconnector.ask), as the peer's line says
# it: "rank 1 found the link dead", "rank 1 moves back to the preferred path"
FOUND_DEAD = "found the link dead"
FAIL_BACK = "moves back"  # to the preferred path: pathevents.FAILED_BACK
# A pair of hosts' failovers (docs/failover.md, "Several ranks per host"): a counter of its
# events, and each event under the counter's value (the path's kind and number, who found it,
# why); the host pair's ranks' asks counters are bumped after, so their 50 ms looks see it
HOST_EVENTS = "{prefix}/failover/hosts/{low}-{high}"


@dataclasses.dataclass(frozen=True)
class HostEvent:
    """A path between this rank's host and another (node: its index) failed, found by a
    rank of either: every stream between them over that path fails over (line: why)."""

    node: int
    kind: str
    number: int
    line: str


def same_path(used: Path | None, kind: str, number: int) -> bool:
    """Whether used is the path (kind, number): its identity at both ends alike (the
    addresses differ per end)."""
    return used is not None and (used.kind, used.number) == (kind, number)
# A path earlier than the one in use answers when a connection to a port of the peer's host
# there is refused (or taken) within this: its kernel answered (answers)
_PROBE_TIMEOUT = 1.0
_PROBE_PORT = 1  # tcpmux: nothing listens there; a refusal is the answer


def answers(path: Path) -> bool:
    """Whether path works again (fail-back): a connection from its near end to its far end's
    host answered, refused or not. No handshake, nothing sent: a probe costs a SYN."""
    if path.remote is None:
        return False
    try:
        probe = socket.socket(socket.AF_INET6 if ":" in path.remote else socket.AF_INET)
    except OSError:
        return False
    with probe:
        probe.settimeout(_PROBE_TIMEOUT)
        try:
            if path.local:
                probe.bind((path.local, 0))
            probe.connect((path.remote, _PROBE_PORT))
        except ConnectionRefusedError:
            return True
        except OSError:
            return False
        return True


def exchange_counts(sock: socket.socket, received: int, timeout: float) -> int:
    """Tell the peer how many bytes of the stream this end received; return its count."""
    sock.settimeout(timeout)
    sock.sendall(_COUNT.pack(received))
    (theirs,) = _COUNT.unpack(recv_exactly(sock, _COUNT.size))
    return theirs


class Reconnector:
    """Connects a pair of ranks again after their connection failed, over the paths after
    the one it ran on (route), through the job's store: the lower rank listens on its
    addresses and publishes them under the pair's failover count, the higher one connects
    and proves itself, as at set-up; then the two exchange their RECEIVED counts.
    A pair with no paths (one host; a test's cut) connects again at the same addresses."""

    def __init__(self, info: LaunchInfo, prefix: str, route: Route, hosts: list[str]) -> None:
        self.info, self.prefix, self.route, self.hosts = info, prefix, route, hosts
        self._asks_seen = 0  # asked's counter, as last read
        self._asks: Store | None = None  # asked's own connection (a wait looks every 50 ms)
        self._asks_lock = threading.Lock()  # the poll's thread and the engine's use it
        self._events_seen: dict[int, int] = {}  # host -> its pair's events with this one, read

    def __call__(self, peer: int, generation: int, received: int, used: Path | None,
                 back: bool = False) -> tuple[socket.socket, int] | None:
        """A new connection to peer and peer's count, or None where no path is left: over
        the paths after used, or (back: a planned move, FAIL_BACK) over all of them,
        preferred first."""
        paths = self.route(peer) or ()
        left = paths if back or used not in paths else paths[paths.index(used) + 1:]
        if paths and not left:
            return None
        rank, timeout = self.info.rank, self.info.timeout
        low, high = sorted((rank, peer))
        key = f"{self.prefix}/failover/{low}-{high}/{generation}"
        with Store.from_launch(self.info) as store:
            self.ask(store, peer, generation, FAIL_BACK if back else FOUND_DEAD)
            sock = (self._accept(peer, store, key) if rank < peer else
                    self._connect(peer, store, key, left))
        try:
            theirs = exchange_counts(sock, received, timeout)
        except OSError as e:
            sock.close()
            raise CommError(f"rank {rank}: failing over to rank {peer}, the new connection "
                            f"failed at once ({e.strerror or e})") from e
        sock.settimeout(None)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        notice_dead_links(sock)
        return sock, theirs

    def ask(self, store: Store | None, peer: int, generation: int, why: str) -> None:
        """Ask peer to fail over the pair to its failover count generation, saying why
        (FOUND_DEAD, FAIL_BACK): its waits look every 50 ms (asked), and its engine on
        meeting the pair's end (asked_why)."""
        if store is None:
            with self._asks_lock:
                self.ask(self._store(), peer, generation, why)
            return
        rank = self.info.rank
        store.set(f"{self.prefix}/failover/ask/{peer}/{rank}", f"{generation} {why}")
        store.add(f"{self.prefix}/failover/asks/{peer}", 1)

    def asked(self, generations: dict[int, int],
              events: list[HostEvent] | None = None) -> dict[int, str]:
        """The peers (of generations: peer -> its stream's failovers so far) that have asked
        this rank to fail over a pair since, and why: a rank whose own interface went down
        may see nothing (no keepalive end; no bytes in flight where it only receives), so
        its peer, which does, tells it through the store. One look at a counter, and the
        peers' keys only when it moved; then also the pairs of hosts' events since (added
        to events, where given: tell_hosts)."""
        rank = self.info.rank
        with self._asks_lock:
            store = self._store()
            asks = store.peek(f"{self.prefix}/failover/asks/{rank}")
            if asks is None or int(asks) == self._asks_seen:
                return {}
            self._asks_seen = int(asks)
            if events is not None:
                events += self._host_events(store)
            return {peer: why for peer, generation in generations.items()
                    if (why := self._ask_of(store, peer, generation))}

    def tell_hosts(self, peer: int, path: Path, why: str) -> None:
        """Tell the ranks of this host and peer's that path between the two failed (this
        rank found it failing over the pair with peer): each fails over its streams between
        the hosts over that path at once, not when it next uses them (docs/failover.md)."""
        topology, here = self.info.topology, self.info.node_rank
        there = topology.node_of(peer)
        if there is None or there == here:
            return
        key = self._hosts_key(here, there)
        event = json.dumps([path.kind, path.number, self.info.rank, why])
        with self._asks_lock:
            store = self._store()
            store.set(f"{key}/{store.add(key, 1)}", event)
            for rank in (*topology.hosts[here].ranks, *topology.hosts[there].ranks):
                if rank != self.info.rank:  # after the event: a look that sees this, sees it
                    store.add(f"{self.prefix}/failover/asks/{rank}", 1)

    def host_line(self, peer: int, path: Path, why: str) -> str:
        """Why this rank's other streams to peer's host over path fail over."""
        return self._line_of(self.node_of(peer), self.info.rank, path, why)

    def node_of(self, rank: int) -> int | None:
        return self.info.topology.node_of(rank)

    def _host_events(self, store: Store) -> list[HostEvent]:
        """The events of this host's pairs with the others since the last look, but this
        rank's own; an event counted but not yet set is read at the next look."""
        here, found = self.info.node_rank, []
        for there in range(len(self.info.topology.hosts)):
            count = store.peek(self._hosts_key(here, there)) if there != here else None
            seen = self._events_seen.get(there, 0)
            for n in range(seen + 1, int(count or 0) + 1):
                value = store.peek(f"{self._hosts_key(here, there)}/{n}")
                if value is None:
                    break
                seen = n
                kind, number, rank, why = json.loads(value)
                if rank != self.info.rank:
                    path = Path(kind, number, None, None)
                    found.append(HostEvent(there, kind, number,
                                            self._line_of(there, rank, path, why)))
            self._events_seen[there] = seen
        return found

    def _line_of(self, there: int | None, rank: int, path: Path, why: str) -> str:
        """ "mac1 <-> mac2: cable 1 failed, found by rank 0 (why)" """
        topology = self.info.topology
        low, high = sorted((self.info.node_rank, there if there is not None else -1))
        if low < 0:
            return f"{path.name} failed, found by rank {rank} ({why})"
        return (f"{topology.hosts[low].name} <-> {topology.hosts[high].name}: {path.name} "
                f"failed, found by rank {rank} ({why})")

    def _hosts_key(self, a: int, b: int) -> str:
        low, high = sorted((a, b))
        return HOST_EVENTS.format(prefix=self.prefix, low=low, high=high)

    def asked_why(self, peer: int, generation: int) -> str | None:
        """Why peer asked to fail over the pair past generation, if it did (one look)."""
        with self._asks_lock:
            return self._ask_of(self._store(), peer, generation)

    def _ask_of(self, store: Store, peer: int, generation: int) -> str | None:
        value = store.peek(f"{self.prefix}/failover/ask/{self.info.rank}/{peer}")
        if value is None:
            return None
        asked, _, why = value.decode().partition(" ")
        return (why or FOUND_DEAD) if int(asked) > generation else None

    def _store(self) -> Store:
        """asked's own connection to the store (under _asks_lock)."""
        if self._asks is None:
            self._asks = Store.from_launch(self.info)
        return self._asks

    def _accept(self, peer: int, store: Store, key: str) -> socket.socket:
        listeners = listen_on_hosts(self.info.rank, self.hosts, backlog=4)
        try:
            store.set(key, ",".join(format_hostport(*s.getsockname()[:2]) for s in listeners))
            deadline = time.monotonic() + self.info.timeout
            while (left := deadline - time.monotonic()) > 0:
                ready, _, _ = select.select(listeners, [], [], min(left, _LOOK_FOR_FAILED))
                for listener in ready:
                    sock, _ = listener.accept()
                    if self._proven(sock, peer):
                        return sock
                self._unless_failed(store, peer)
        finally:
            for listener in listeners:
                listener.close()
        raise CommError(f"rank {peer} did not connect to rank {self.info.rank} again within "
                        f"{self.info.timeout:g} s (TBCOLL_TIMEOUT) after their link failed")

    @staticmethod
    def _unless_failed(store: Store, peer: int) -> None:
        """Give up on a peer that tbrun has declared failed (--keep-going: it died; its
        survivors are to learn it now, not after TBCOLL_TIMEOUT)."""
        if peer in parse_failed(store.peek(FAILED))[1]:
            raise CommError(f"rank {peer} failed (tbrun declared it) while the pair failed over")

    def _proven(self, sock: socket.socket, peer: int) -> bool:
        """sock proves the job's token and names peer (else it is closed)."""
        sock.settimeout(HANDSHAKE_TIMEOUT)
        try:
            accept_handshake(sock, self.info.token)
            (named,) = RANK_WIRE.unpack(recv_exactly(sock, RANK_WIRE.size))
        except (AuthenticationError, OSError) as e:
            log.warning("rank %d refused a connection while failing over: %s", self.info.rank, e)
            sock.close()
            return False
        if named != peer:
            sock.close()
            return False
        return True

    def _connect(self, peer: int, store: Store, key: str,
                 left: tuple[Path, ...]) -> socket.socket:
        deadline = time.monotonic() + self.info.timeout
        while (published := store.peek(key)) is None:
            self._unless_failed(store, peer)
            if time.monotonic() > deadline:
                raise CommError(f"rank {peer} did not listen for rank {self.info.rank} again "
                                f"within {self.info.timeout:g} s (TBCOLL_TIMEOUT) after their "
                                f"link failed")
            time.sleep(_LOOK_FOR_FAILED / 5)
        published = published.decode().split(",")
        addresses = [parse_hostport(text, "address") for text in published]
        deadline = time.monotonic() + self.info.timeout
        return connect_over(self.info.rank, peer, ways_to(left, addresses), self.info.token,
                             deadline, {})
