"""The socket mesh: one authenticated TCP connection per pair of ranks, and how a dead one is
noticed. The tcp transport carries its messages over it; rdma and mlx borrow it for their
side connections (set-up, watching peers, point-to-point), so it is a part of its own.

Set-up: every rank listens on its host's addresses (its main one and, from the hostfile's
"links", one per cable to another host) and publishes them in the store, connects to every
lower rank over the first of the paths between their hosts that answers (Layout.paths: the
cables, preferred first, then the management network; one line says so when the first does
not), and accepts every higher rank (of those the caller names: a two-level group,
tbcoll.hierarchy, leaves out the ranks of its own host). Each connection runs the HMAC
handshake of tbcoll.job.auth, then the connecting side names its rank. A link that dies
with nothing failed yet is found by keepalive (idle) or by the kernel's retransmission
counters (data in flight: unanswered).
"""

from __future__ import annotations

import dataclasses
import errno
import ipaddress
import json
import logging
import os
import queue
import select
import socket
import struct
import sys
import threading
import time
import weakref
from collections.abc import Callable

from tbcoll.core.errors import LINK_DOWN, PEER_ENDED, AuthenticationError, CommError
from tbcoll.core.wire import recv_exactly
from tbcoll.job.auth import HANDSHAKE_TIMEOUT, Doorman, accept_handshake, connect_proven
from tbcoll.job.env import LaunchInfo, format_hostport, parse_hostport
from tbcoll.job.failures import FAILED, parse_failed
from tbcoll.job.rendezvous import Store
from tbcoll.job.topology import MANAGEMENT, Path, route_source

log = logging.getLogger("tbcoll.tcp")

_RANK = struct.Struct("!I")
_SOCKET_BUFFER = 4 << 20
_PROBE_EVERY, _PROBES = 1, 3  # keepalive: seconds between probes, unanswered ones to give up
# struct tcp_info (Linux): 8 one-byte fields (retransmits is the third), then u32s of which
# the fifth is tcpi_unacked
_TCP_INFO = struct.Struct("8B5I")
# struct tcp_connection_info (macOS: XNU's bsd/netinet/tcp.h, getsockopt TCP_CONNECTION_INFO,
# 0x106, which CPython does not name): tcpi_state, snd_wscale, rcv_wscale, a pad byte; 13 u32
# (options, flags, rto, maxseg, snd_ssthresh, snd_cwnd, snd_wnd, snd_sbbytes, rcv_wnd,
# rttcur, srtt, rttvar, a word of bit fields); then from offset 56, 8-aligned, 7 u64
# (txpackets, txbytes, txretransmitbytes, rxpackets, rxbytes, rxoutoforderbytes,
# txretransmitpackets): 112 bytes
TCP_CONNECTION_INFO = 0x106
_TCP_CONNECTION_INFO = struct.Struct("=4B13I7Q")
_SND_SBBYTES, _RXPACKETS, _TXRETRANSMITPACKETS = 11, 20, 23
_DEAD_AFTER_RTOS = 3  # consecutive unanswered retransmission timeouts (~3 s) mean no link
# A path that is not the last one must answer a connect within this (a cable answers in
# microseconds; 2 s lets one lost SYN be sent again, at 1 s) before the next path is tried
PATH_ANSWER_TIMEOUT = 2.0
Route = Callable[[int], "tuple[Path, ...] | None"]


def connect_mesh(rank: int, size: int, hosts: list[str], route: Route,
                 store: Store, token: str, timeout: float, prefix: str,
                 peers: frozenset[int] | None = None) -> dict[int, socket.socket]:
    """Open one authenticated connection to every other rank (lower ranks: we connect).

    hosts: the addresses to listen on (the first must bind; a cable's address that does not
    is left out, its path then unused); route(peer): the paths to peer, preferred first
    (peer_paths), or None or () for the first address it listens on; peers: the ranks to
    connect to (None: every other rank), the same relation on every rank (a two-level group
    leaves out its host's own).
    Incoming connections prove themselves in threads of their own, admitted by a
    tbcoll.job.auth.Doorman, so that idle connections from anyone cannot hold up a peer.
    """
    if peers is None:
        peers = frozenset(range(size)) - {rank}
    listeners = _listen(rank, hosts, backlog=max(size, 16))
    store.set(f"{prefix}/addr/{rank}", ",".join(
        format_hostport(*listener.getsockname()[:2]) for listener in listeners))
    deadline = time.monotonic() + timeout
    sockets: dict[int, socket.socket] = {}
    arrivals: queue.SimpleQueue = queue.SimpleQueue()  # (peer or None, socket)
    doorman = Doorman(limit=max(64, 2 * size))  # a job's own never need to wait
    silent: dict[str, str] = {}  # an address that did not answer: why (the next peer there
    # is not made to wait for it again: a host's ranks share its cables)
    try:
        for peer in sorted(p for p in peers if p < rank):
            published = store.get(f"{prefix}/addr/{peer}").decode().split(",")
            addresses = [parse_hostport(text, "address") for text in published]
            sockets[peer] = _connect_over(rank, peer, _ways(route(peer) or (), addresses),
                                          token, deadline, silent)
        while len(sockets) < len(peers):
            while not arrivals.empty():
                peer, sock = arrivals.get()
                if not doorman.done(sock) or peer not in peers or peer in sockets:
                    sock.close()
                else:
                    sockets[peer] = sock
            if len(sockets) == len(peers):
                break
            left = deadline - time.monotonic()
            if left <= 0:
                missing = sorted(peers - set(sockets))
                raise CommError(f"rank(s) {missing} did not connect to rank {rank} within "
                                f"{timeout:g} s (TBCOLL_TIMEOUT)")
            ready, _, _ = select.select(listeners, [], [], min(left, 0.05))
            for listener in ready:
                sock, address = listener.accept()
                if not doorman.admit(sock):
                    continue
                threading.Thread(target=_accept_peer, daemon=True, args=(
                    sock, address, token, rank, size, min(HANDSHAKE_TIMEOUT, left),
                    arrivals)).start()
    except BaseException:
        for sock in sockets.values():
            sock.close()
        raise
    finally:
        for listener in listeners:
            listener.close()
    for sock in sockets.values():
        sock.settimeout(None)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SOCKET_BUFFER)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _SOCKET_BUFFER)
        notice_dead_links(sock)
    return sockets


def notice_dead_links(sock: socket.socket) -> None:
    """Keepalive every second, given up after 3 unanswered probes: a pulled cable (or a peer
    host that froze or lost power) ends a connection with nothing in flight with ETIMEDOUT
    within ~4 s, where TCP alone stays silent. A connection with data in flight is
    TcpTransport._check_links's. (Not TCP_USER_TIMEOUT: measured here, it also ends a
    connection whose peer is alive but slow to read, a zero window.)"""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    idle = getattr(socket, "TCP_KEEPIDLE", getattr(socket, "TCP_KEEPALIVE", None))  # macOS
    for option, value in ((idle, _PROBE_EVERY), (getattr(socket, "TCP_KEEPINTVL", None),
                          _PROBE_EVERY), (getattr(socket, "TCP_KEEPCNT", None), _PROBES)):
        if option is not None:
            sock.setsockopt(socket.IPPROTO_TCP, option, value)


def unanswered(sock: socket.socket) -> str | None:
    """Why the connection is dead though nothing failed yet: data in flight that nothing
    acknowledged through _DEAD_AFTER_RTOS retransmissions in a row (a pulled cable; a live
    peer's kernel acknowledges at once, even while its process reads slowly). Linux tells
    through TCP_INFO, macOS through TCP_CONNECTION_INFO; elsewhere only keepalive and
    TBCOLL_TIMEOUT notice."""
    reader = _LINK_READERS.get(sys.platform)
    return reader(sock) if reader is not None else None


def _unanswered_linux(sock: socket.socket) -> str | None:
    """tcpi_retransmits: the retransmission timeouts in a row, with tcpi_unacked bytes."""
    if not hasattr(socket, "TCP_INFO"):
        return None
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO.size)
    except OSError:
        return None
    fields = _TCP_INFO.unpack_from(info)
    retransmits, unacked = fields[2], fields[12]
    if unacked and retransmits >= _DEAD_AFTER_RTOS:
        return f"{retransmits} retransmissions unanswered: {LINK_DOWN}"
    return None


# socket -> (tcpi_rxpackets, tcpi_txretransmitpackets) when it was first seen with bytes to
# deliver and nothing received since
_QUIET_SINCE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _unanswered_macos(sock: socket.socket) -> str | None:
    """macOS counts no retransmission timeouts in a row: what comes nearest is packets
    retransmitted (tcpi_txretransmitpackets) while the send buffer holds bytes
    (tcpi_snd_sbbytes) and not one packet arrives (tcpi_rxpackets): counted from the first
    look that found it so. Any packet from the peer (an acknowledgement, a window probe's
    answer) starts the count again."""
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, TCP_CONNECTION_INFO,
                               _TCP_CONNECTION_INFO.size)
    except OSError:
        return None
    if len(info) < _TCP_CONNECTION_INFO.size:
        return None
    fields = _TCP_CONNECTION_INFO.unpack_from(info)
    received, retransmitted = fields[_RXPACKETS], fields[_TXRETRANSMITPACKETS]
    mark = _QUIET_SINCE.get(sock)
    if not fields[_SND_SBBYTES]:
        _QUIET_SINCE.pop(sock, None)
        return None
    if mark is None or mark[0] != received:
        _QUIET_SINCE[sock] = (received, retransmitted)
        return None
    count = retransmitted - mark[1]
    if count >= _DEAD_AFTER_RTOS:
        return f"{count} retransmissions unanswered: {LINK_DOWN}"
    return None


_LINK_READERS = {"linux": _unanswered_linux, "darwin": _unanswered_macos}


def gone(sock: socket.socket) -> str | None:
    """Why the connection has ended, looking without reading (MSG_PEEK), or None."""
    try:
        if sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b"":
            return f"{PEER_ENDED}: it closed the connection"
    except BlockingIOError:
        pass
    except OSError as e:
        return f"connection failed: {e.strerror or e}"
    return unanswered(sock)


def send_failure(error: int) -> str:
    """Why a send failed with errno error: the peer's end is gone (it ended), or else."""
    if error in (errno.EPIPE, errno.ECONNRESET):
        return f"{PEER_ENDED}: it closed the connection ({os.strerror(error)})"
    return f"send failed: {os.strerror(error)}"


def link_of(sock: socket.socket) -> str:
    try:
        here, there = sock.getsockname(), sock.getpeername()
    except OSError:
        return "?"
    return f"{format_hostport(*here[:2])} -> {format_hostport(*there[:2])}"


def _listen(rank: int, hosts: list[str], backlog: int) -> list[socket.socket]:
    """A listener on each of hosts: the first (the host's main address) must bind; a cable's
    address that will not (its interface lost it) is left out with a line, so that peers
    take another path."""
    listeners = [socket.create_server((hosts[0], 0), backlog=backlog)]
    for host in hosts[1:]:
        try:
            listeners.append(socket.create_server((host, 0), backlog=backlog))
        except OSError as e:
            log.warning("rank %d cannot listen on its cable address %s (%s): its peers take "
                        "another path", rank, host, os.strerror(e.errno) if e.errno else e)
    return listeners


# One way to try: the path (None: the peer's first address, no path known), and the address
# it listens on there (None: it does not listen on that path)
Way = tuple["Path | None", "tuple[str, int] | None"]


def _ways(paths: tuple[Path, ...], published: list[tuple[str, int]]) -> list[Way]:
    """Where to try to connect, in order: each path whose far end the hostfile gives, at the
    address the peer listens on there. The management path falls back to the peer's first
    address (its main one, which a name in the hostfile may not spell); no paths: that."""
    if not paths:
        return [(None, published[0])]
    ways: list[Way] = []
    for path in paths:
        if path.remote is None:
            continue  # the hostfile gives only this end of that cable
        there = next((a for a in published if a[0] == path.remote), None)
        if there is None and path.kind == MANAGEMENT:
            there = published[0]
        ways.append((path, there))
    return ways or [(None, published[0])]


def _connect_over(rank: int, peer: int, ways: list[Way], token: str, deadline: float,
                  silent: dict[str, str]) -> socket.socket:
    """Connect to peer over the first of ways that answers (each but the last given
    PATH_ANSWER_TIMEOUT to answer, and none that stayed silent for an earlier peer: silent,
    address -> why, which this adds to), prove ourselves (trying again while it is busy) and
    name our rank; one line when it was not the first. A refused token fails at once."""
    failed: list[str] = []
    usable = [n for n, (_, there) in enumerate(ways) if there is not None]
    for n, (path, there) in enumerate(ways):
        if there is None:
            failed.append(f"{_named(path)}: rank {peer} does not listen there")
            continue
        if there[0] in silent and n != usable[-1]:
            failed.append(f"{_named(path, there)} does not answer ({silent[there[0]]})")
            continue
        try:
            sock = _connect(rank, peer, there, token, deadline,
                            None if n == usable[-1] else PATH_ANSWER_TIMEOUT)
        except OSError as e:
            if len(ways) == 1:  # one way: today's message
                raise CommError(f"rank {rank} could not connect to rank {peer} at "
                                f"{format_hostport(*there)}: {e.strerror or e}") from e
            failed.append(f"{_named(path, there)} does not answer ({e.strerror or e})")
            if not isinstance(e, ConnectionRefusedError):  # refused: that host answered
                silent[there[0]] = str(e.strerror or e)
            continue
        if failed:
            log.warning("rank %d <-> rank %d: %s; over %s (%s)", peer, rank, "; ".join(failed),
                        there[0], path.name if path else "its address")
        return sock
    raise CommError(f"rank {rank} could not connect to rank {peer} over any of its "
                    f"{len(ways)} paths: {'; '.join(failed)}")


def _named(path: Path | None, there: tuple[str, int] | None = None) -> str:
    """A path as messages name it: "cable 10.0.1.1" ("cable 2 ..." past the first)."""
    where = there[0] if there else path.remote if path else ""
    if path is None:
        return f"address {where}"
    kind = path.name if path.number > 1 else path.kind
    return f"{kind} {where}"


def _connect(rank: int, peer: int, address: tuple[str, int], token: str,
             deadline: float, answer_within: float | None) -> socket.socket:
    """Connect to peer and prove ourselves (trying again while it is busy); name our rank.
    OSError where address does not answer (within answer_within); CommError for a refusal."""
    where = f"rank {rank} could not connect to rank {peer} at {format_hostport(*address)}"
    try:
        sock = connect_proven(address, token, deadline, answer_within=answer_within)
    except AuthenticationError as e:
        raise CommError(f"{where}: {e}") from e
    try:
        sock.sendall(_RANK.pack(rank))
    except OSError:
        sock.close()
        raise
    return sock


def _accept_peer(sock: socket.socket, address: tuple, token: str, rank: int, size: int,
                 timeout: float, arrivals: queue.SimpleQueue) -> None:
    """Authenticate an incoming connection; put (the rank it names or None, sock)."""
    sock.settimeout(timeout)
    try:
        accept_handshake(sock, token)
        (peer,) = _RANK.unpack(recv_exactly(sock, _RANK.size))
    except (AuthenticationError, OSError) as e:
        log.warning("rank %d refused a connection from %s: %s", rank,
                    format_hostport(*address[:2]), e)
        arrivals.put((None, sock))
        return
    if not rank < peer < size:
        log.warning("rank %d refused a connection claiming to be rank %d", rank, peer)
        arrivals.put((None, sock))
        return
    arrivals.put((peer, sock))


def listen_hosts(info: LaunchInfo) -> list[str]:
    """The addresses this rank listens on: its host's, and its ends of the host's cables
    (Layout.paths), its main address first."""
    topology = info.topology
    hosts = topology.hosts
    if info.node_rank >= len(hosts):
        return ["127.0.0.1"]
    address = hosts[info.node_rank].addr or "127.0.0.1"
    if len(hosts) > 1 and _is_loopback(address):
        # A host name that resolves to loopback on the host itself (Debian maps its own name
        # to 127.0.1.1): the others could not connect. Use the address that reaches tbrun.
        address = route_source(info.store[0])
    cables = [path.local for j in range(len(hosts)) for path in topology.paths(info.node_rank, j)
              if path.kind != MANAGEMENT and path.local]
    return list(dict.fromkeys([address, *cables]))


def _is_loopback(host: str) -> bool:
    try:
        resolved = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][4][0]
    except OSError:
        return False  # create_server will say what is wrong with it
    return ipaddress.ip_address(resolved.split("%")[0]).is_loopback


def peer_paths(info: LaunchInfo) -> Route:
    """route(peer): the paths from this rank's host to peer's, preferred first (Layout.paths:
    the cables between them, each its own subnet, then the management network); None where
    peer's host is unknown or this one."""
    topology = info.topology

    def route(peer: int) -> tuple[Path, ...] | None:
        node = topology.node_of(peer)
        if node is None or info.node_rank >= len(topology.hosts):
            return None
        return topology.paths(info.node_rank, node) or None

    return route


def path_in_use(sock: socket.socket, paths: tuple[Path, ...]) -> Path | None:
    """Which of paths sock runs over: the one whose two ends are the socket's, else the
    one with its far end (the side that connected sees that), else its near end."""
    try:
        here, there = sock.getsockname()[0], sock.getpeername()[0]
    except OSError:
        return None
    for match in ((lambda p: (p.local, p.remote) == (here, there)),
                  (lambda p: p.remote == there), (lambda p: p.local == here)):
        found = next((p for p in paths if match(p)), None)
        if found is not None:
            return found
    return None


def describe_paths(sock: socket.socket, paths: tuple[Path, ...],
                   used: Path | None = None) -> str:
    """The path a connection runs over (used, where its owner knows it) and the pair's others,
    for Communicator.describe(): "over cable 1; other paths: cable 2 (10.0.2.1), management
    (10.0.0.2)"."""
    if not paths:
        return ""
    used = used or path_in_use(sock, paths)
    others = [f"{p.name} ({p.remote or '?'})" for p in paths if p != used]
    return (f"over {used.name if used else 'an address of no path'}"
            + (f"; other paths: {', '.join(others)}" if others else ""))


# --- failover (docs/failover.md) ------------------------------------------------------------------

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
        listeners = _listen(self.info.rank, self.hosts, backlog=4)
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
            (named,) = _RANK.unpack(recv_exactly(sock, _RANK.size))
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
        return _connect_over(self.info.rank, peer, _ways(left, addresses), self.info.token,
                             deadline, {})
