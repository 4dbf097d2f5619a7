"""TCP transport: one connection per pair of ranks, driven by the stream engine.

Set-up: every rank listens on its host's address and publishes it in the store, connects to
every lower rank and accepts every higher one. Each connection runs the HMAC handshake of
tbcoll.auth, then the connecting side names its rank. Messages, matching and progress are
tbcoll.transports.stream's; waiting is poll() on the sockets.
"""

from __future__ import annotations

import logging
import select
import socket
import struct
import time
from collections.abc import Iterable

from tbcoll.auth import accept_handshake, connect_handshake
from tbcoll.env import LaunchInfo, format_hostport, parse_hostport
from tbcoll.errors import AuthenticationError, CommError
from tbcoll.rendezvous import Store
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


def connect_mesh(rank: int, size: int, host: str, store: Store, token: str, timeout: float,
                 prefix: str) -> dict[int, socket.socket]:
    """Open one authenticated connection to every other rank (lower ranks: we connect)."""
    listener = socket.create_server((host, 0), backlog=max(size, 16))
    store.set(f"{prefix}/addr/{rank}", format_hostport(*listener.getsockname()[:2]))
    sockets: dict[int, socket.socket] = {}
    try:
        for peer in range(rank):
            address = parse_hostport(store.get(f"{prefix}/addr/{peer}").decode(), "address")
            sock = socket.create_connection(address, timeout=timeout)
            try:
                connect_handshake(sock, token)
            except AuthenticationError as e:
                raise CommError(f"rank {rank} could not connect to rank {peer}: {e}") from e
            sock.sendall(_RANK.pack(rank))
            sockets[peer] = sock
        deadline = time.monotonic() + timeout
        while len(sockets) < size - 1:
            listener.settimeout(max(0.0, deadline - time.monotonic()))
            try:
                sock, address = listener.accept()
            except TimeoutError:
                missing = sorted(set(range(rank + 1, size)) - set(sockets))
                raise CommError(f"rank(s) {missing} did not connect to rank {rank} within "
                                f"{timeout:g} s (TBCOLL_TIMEOUT)") from None
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


def listen_host(info: LaunchInfo) -> str:
    """The address this rank listens on: its host's entry in the topology, else loopback."""
    hosts = info.topology.get("hosts", [])
    if info.node_rank < len(hosts):
        return hosts[info.node_rank].get("addr", "127.0.0.1")
    return "127.0.0.1"


class TcpGroup:
    """A communicator's view of the TCP transport (it has no native collectives)."""

    native = None

    def __init__(self, transport: TcpTransport, context: int, members: list[int],
                 owns_transport: bool) -> None:
        self._transport, self._owns = transport, owns_transport
        self.context, self.members = context, members  # world ranks, in group order
        self.p2p = StreamEndpoint(transport, context, members)
        self.coll = StreamEndpoint(transport, context + 1, members)
        self.rank, self.size = self.p2p.rank, self.p2p.size

    def context_hint(self) -> int:
        return self._transport.next_context

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
        sockets = connect_mesh(info.rank, info.size, listen_host(info), store, info.token,
                               info.timeout, prefix)
    transport = TcpTransport(info.rank, info.size, sockets, info.timeout)
    return TcpGroup(transport, 0, list(range(info.size)), True)
