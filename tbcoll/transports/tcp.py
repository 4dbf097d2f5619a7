"""TCP transport: one connection per pair of ranks, driven by the stream engine.

Set-up: every rank listens on its host's addresses (its main one and, from the hostfile's
"links", one per cable to another host) and publishes them in the store, connects to every
lower rank over the cable between their hosts where there is one, and accepts every higher
rank. Each connection runs the HMAC handshake of
tbcoll.auth, then the connecting side names its rank. Messages, matching and progress are
tbcoll.transports.stream's; waiting is poll() on the sockets.
"""

from __future__ import annotations

import ipaddress
import logging
import select
import socket
import struct
import time
from collections.abc import Callable, Iterable

from tbcoll.auth import accept_handshake, connect_handshake
from tbcoll.env import LaunchInfo, format_hostport, parse_hostport
from tbcoll.errors import AuthenticationError, CommError
from tbcoll.rendezvous import Store
from tbcoll.topology import route_source
from tbcoll.transports.stream import Peer, StreamEndpoint, StreamTransport
from tbcoll.wire import recv_exactly

log = logging.getLogger("tbcoll.tcp")

_RANK = struct.Struct("!I")
_SOCKET_BUFFER = 4 << 20
_READ_EVENTS = select.POLLIN | select.POLLHUP | select.POLLERR


class TcpTransport(StreamTransport):
    """Point-to-point messages between world ranks over one TCP connection per pair."""

    def __init__(self, rank: int, size: int, sockets: dict[int, socket.socket],
                 timeout: float) -> None:
        super().__init__(rank, size, sockets, timeout)
        self._by_fd: dict[int, Peer] = {}
        self._poller = select.poll()
        for peer in self._peers.values():
            peer.channel.setblocking(False)
            self._by_fd[peer.channel.fileno()] = peer
            self._poller.register(peer.channel, _READ_EVENTS)

    def _ready(self, timeout: float) -> Iterable[tuple[Peer, bool, bool]]:
        return [(self._by_fd[fd], bool(events & _READ_EVENTS), bool(events & select.POLLOUT))
                for fd, events in self._poller.poll(1000 * timeout)]

    def _write_interest(self, peer: Peer, want: bool) -> None:
        self._poller.modify(peer.channel, _READ_EVENTS | (select.POLLOUT if want else 0))

    def _forget(self, peer: Peer) -> None:
        self._poller.unregister(peer.channel)


def connect_mesh(rank: int, size: int, hosts: list[str], route: Callable[[int], str | None],
                 store: Store, token: str, timeout: float,
                 prefix: str) -> dict[int, socket.socket]:
    """Open one authenticated connection to every other rank (lower ranks: we connect).

    hosts: the addresses to listen on; route(peer): the address of peer to connect to (one
    it listens on), or None for its first.
    """
    listeners = [socket.create_server((host, 0), backlog=max(size, 16)) for host in hosts]
    store.set(f"{prefix}/addr/{rank}", ",".join(
        format_hostport(*listener.getsockname()[:2]) for listener in listeners))
    sockets: dict[int, socket.socket] = {}
    try:
        for peer in range(rank):
            published = store.get(f"{prefix}/addr/{peer}").decode().split(",")
            addresses = [parse_hostport(text, "address") for text in published]
            wanted = route(peer)
            address = next((a for a in addresses if a[0] == wanted), addresses[0])
            try:
                sock = socket.create_connection(address, timeout=timeout)
            except OSError as e:
                raise CommError(f"rank {rank} could not connect to rank {peer} at "
                                f"{format_hostport(*address)}: {e}") from e
            try:
                connect_handshake(sock, token)
            except AuthenticationError as e:
                raise CommError(f"rank {rank} could not connect to rank {peer}: {e}") from e
            sock.sendall(_RANK.pack(rank))
            sockets[peer] = sock
        deadline = time.monotonic() + timeout
        while len(sockets) < size - 1:
            ready, _, _ = select.select(listeners, [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                missing = sorted(set(range(rank + 1, size)) - set(sockets))
                raise CommError(f"rank(s) {missing} did not connect to rank {rank} within "
                                f"{timeout:g} s (TBCOLL_TIMEOUT)")
            sock, address = ready[0].accept()
            peer = _accept_peer(sock, address, token, rank, size, sockets)
            if peer is None:
                sock.close()
            else:
                sockets[peer] = sock
    except BaseException:
        for sock in sockets.values():
            sock.close()
        raise
    finally:
        for listener in listeners:
            listener.close()
    for sock in sockets.values():
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SOCKET_BUFFER)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _SOCKET_BUFFER)
    return sockets


def _accept_peer(sock: socket.socket, address: tuple, token: str, rank: int, size: int,
                 known: dict[int, socket.socket]) -> int | None:
    """Authenticate an incoming connection and return the rank it names (None: refused)."""
    sock.settimeout(10.0)
    try:
        accept_handshake(sock, token)
        (peer,) = _RANK.unpack(recv_exactly(sock, _RANK.size))
    except (AuthenticationError, OSError) as e:
        log.warning("rank %d refused a connection from %s: %s", rank,
                    format_hostport(*address[:2]), e)
        return None
    if not rank < peer < size or peer in known:
        log.warning("rank %d refused a connection claiming to be rank %d", rank, peer)
        return None
    return peer


def listen_hosts(info: LaunchInfo) -> list[str]:
    """The addresses this rank listens on: its host's, and its ends of the host's cables."""
    hosts = info.topology.get("hosts", [])
    if info.node_rank >= len(hosts):
        return ["127.0.0.1"]
    mine = hosts[info.node_rank]
    address = mine.get("addr", "127.0.0.1")
    if len(hosts) > 1 and _is_loopback(address):
        # A host name that resolves to loopback on the host itself (Debian maps its own name
        # to 127.0.1.1): the others could not connect. Use the address that reaches tbrun.
        address = route_source(info.store[0])
    links = [a for a in mine.get("links", []) if a]
    return list(dict.fromkeys([address, *links]))


def _is_loopback(host: str) -> bool:
    try:
        resolved = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][4][0]
    except OSError:
        return False  # create_server will say what is wrong with it
    return ipaddress.ip_address(resolved.split("%")[0]).is_loopback


def peer_route(info: LaunchInfo) -> Callable[[int], str | None]:
    """route(peer): the address to reach peer at, over the cable between the two hosts if the
    hostfile names one (each Thunderbolt cable is its own subnet), else the peer's host's."""
    hosts = info.topology.get("hosts", [])
    node_of = {rank: j for j, host in enumerate(hosts) for rank in host.get("ranks", [])}

    def route(peer: int) -> str | None:
        if peer not in node_of:
            return None
        host = hosts[node_of[peer]]
        links = host.get("links", [])
        if info.node_rank < len(links) and links[info.node_rank]:
            return links[info.node_rank]
        return host.get("addr")

    return route


class TcpGroup:
    """A communicator's view of the TCP transport (it has no native collectives)."""

    native = None
    tuning = "tcp"

    def __init__(self, transport: TcpTransport, context: int, members: list[int],
                 owns_transport: bool) -> None:
        self._transport, self._owns = transport, owns_transport
        self.context, self.members = context, members  # world ranks, in group order
        self.p2p = StreamEndpoint(transport, context, members)
        self.coll = StreamEndpoint(transport, context + 1, members)
        self.rank, self.size = self.p2p.rank, self.p2p.size

    def context_hint(self) -> int:
        return self._transport.next_context

    def describe_links(self) -> list[str]:
        """Which addresses each connection of this group runs between."""
        lines = []
        for rank in self.members:
            peer = self._transport.peer(rank)
            if peer is not None:
                local, remote = peer.channel.getsockname(), peer.channel.getpeername()
                lines.append(f"  to rank {rank}: {format_hostport(*local[:2])} -> "
                             f"{format_hostport(*remote[:2])}")
        return lines

    def split(self, color: int | None, key: int, members: list[int],
              context: int) -> TcpGroup | None:
        # Every member of a new group has next_context <= context, so the pair of contexts
        # (context, context + 1) is new to every pair of ranks that share the group.
        self._transport.next_context = context + 2
        if color is None:
            return None
        return TcpGroup(self._transport, context, [self.members[m] for m in members], False)

    def close(self) -> None:
        if self._owns:
            self._transport.close()


def open_world(info: LaunchInfo | None, prefix: str) -> TcpGroup:
    """Connect every rank of the job (a single rank needs no store and no sockets)."""
    if info is None or info.size == 1:
        return TcpGroup(TcpTransport(0, 1, {}, 0.0), 0, [0], True)
    with Store.from_launch(info) as store:
        sockets = connect_mesh(info.rank, info.size, listen_hosts(info), peer_route(info),
                               store, info.token, info.timeout, prefix)
    transport = TcpTransport(info.rank, info.size, sockets, info.timeout)
    return TcpGroup(transport, 0, list(range(info.size)), True)
