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
counters (data in flight: unanswered). Connecting a pair again after a failure:
tbcoll.transports.reconnect.
"""

from __future__ import annotations

import errno
import ipaddress
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
from tbcoll.job.rendezvous import Store
from tbcoll.job.topology import MANAGEMENT, Path, route_source

log = logging.getLogger("tbcoll.tcp")

RANK_WIRE = struct.Struct("!I")
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
    listeners = listen_on_hosts(rank, hosts, backlog=max(size, 16))
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
            sockets[peer] = connect_over(rank, peer, ways_to(route(peer) or (), addresses),
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


def listen_on_hosts(rank: int, hosts: list[str], backlog: int) -> list[socket.socket]:
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


def ways_to(paths: tuple[Path, ...], published: list[tuple[str, int]]) -> list[Way]:
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


def connect_over(rank: int, peer: int, ways: list[Way], token: str, deadline: float,
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
        sock.sendall(RANK_WIRE.pack(rank))
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
        (peer,) = RANK_WIRE.unpack(recv_exactly(sock, RANK_WIRE.size))
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
