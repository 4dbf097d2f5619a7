"""TCP transport: one connection per pair of ranks and a non-blocking progress engine.

Set-up: every rank listens on its host's address and publishes it in the store, connects to
every lower rank and accepts every higher one. Each connection runs the HMAC handshake of
tbcoll.auth, then the connecting side names its rank.

Wire: a message is a 16-byte header (context u32, tag u32, nbytes u64) and its payload.
Receives are matched per (peer, context, tag) in the order messages were sent. A message that
arrives before its receive is posted waits in an 'unexpected' buffer and is copied when the
receive is posted; otherwise its payload is read straight into the destination. Reads go
through a small staging buffer, so one system call can bring several small messages, and large
payloads bypass it (recv_into the caller's array).

There are no threads: progress happens in isend (an eager first write) and in waitall, which
keeps reading every connection while its sends are stalled. Two ranks sending each other
large messages at once therefore cannot deadlock.
"""

from __future__ import annotations

import logging
import select
import socket
import struct
import time
from collections import defaultdict, deque
from collections.abc import Sequence

import numpy as np

from tbcoll.auth import accept_handshake, connect_handshake
from tbcoll.env import LaunchInfo, format_hostport, parse_hostport
from tbcoll.errors import AuthenticationError, CommError
from tbcoll.rendezvous import Store
from tbcoll.wire import recv_exactly

log = logging.getLogger("tbcoll.tcp")

_HEADER = struct.Struct("!IIQ")
_RANK = struct.Struct("!I")
_STAGE = 256 << 10  # staging buffer per connection
_DIRECT = 16 << 10  # a payload remainder this large is read straight into its destination
_SOCKET_BUFFER = 4 << 20
_READ_EVENTS = select.POLLIN | select.POLLHUP | select.POLLERR


class _Send:
    __slots__ = ("peer", "views", "done")

    def __init__(self, peer: _Peer, views: list[memoryview]) -> None:
        self.peer, self.views, self.done = peer, views, False


class _Recv:
    __slots__ = ("peer", "view", "done")

    def __init__(self, peer: _Peer, view: memoryview) -> None:
        self.peer, self.view, self.done = peer, view, False


class _Unexpected:
    """A message that arrived before its receive was posted."""

    __slots__ = ("data", "done", "waiter")

    def __init__(self, nbytes: int) -> None:
        self.data, self.done, self.waiter = bytearray(nbytes), False, None


class _Peer:
    def __init__(self, rank: int, sock: socket.socket) -> None:
        self.rank = rank
        self.sock = sock
        self.sendq: deque[_Send] = deque()
        self.posted: defaultdict[tuple[int, int], deque[_Recv]] = defaultdict(deque)
        self.unexpected: defaultdict[tuple[int, int], deque[_Unexpected]] = defaultdict(deque)
        self.stage = bytearray(_STAGE)
        self.stage_view = memoryview(self.stage)
        self.start = self.end = 0  # unread bytes are stage[start:end]
        self.target: memoryview | None = None  # payload bytes still to arrive
        self.target_owner: _Recv | _Unexpected | None = None
        self.lost: str | None = None


def _bytes_of(buf: np.ndarray) -> memoryview:
    """buf's bytes as a flat memoryview (works for dtypes with no buffer format, e.g. bfloat16)."""
    return memoryview(buf.view(np.uint8))


class TcpTransport:
    """Point-to-point messages between world ranks over one TCP connection per pair."""

    def __init__(self, rank: int, size: int, sockets: dict[int, socket.socket],
                 timeout: float) -> None:
        self.rank, self.size, self.timeout = rank, size, timeout
        self.next_context = 2  # contexts 0 and 1 belong to the world group
        self._peers: dict[int, _Peer] = {}
        self._by_fd: dict[int, _Peer] = {}
        self._writing: set[_Peer] = set()
        self._poller = select.poll()
        for peer_rank, sock in sockets.items():
            sock.setblocking(False)
            peer = _Peer(peer_rank, sock)
            self._peers[peer_rank] = peer
            self._by_fd[sock.fileno()] = peer
            self._poller.register(sock, _READ_EVENTS)

    def close(self) -> None:
        for peer in self._peers.values():
            peer.sock.close()
        self._peers.clear()
        self._by_fd.clear()

    # --- posting -------------------------------------------------------------------------

    def isend(self, buf: np.ndarray, dest: int, context: int, tag: int) -> _Send:
        peer = self._live_peer(dest)
        payload = _bytes_of(buf)
        views = [memoryview(_HEADER.pack(context, tag, payload.nbytes))]
        if payload.nbytes:
            views.append(payload)
        request = _Send(peer, views)
        peer.sendq.append(request)
        if len(peer.sendq) == 1:
            self._pump_out(peer)
        return request

    def irecv(self, buf: np.ndarray, source: int, context: int, tag: int) -> _Recv:
        peer = self._peers.get(source)
        if peer is None:
            raise CommError(f"rank {self.rank} has no connection to rank {source}")
        request = _Recv(peer, _bytes_of(buf))
        early = peer.unexpected.get((context, tag))
        if early:
            message = early.popleft()
            self._check_size(peer, context, tag, len(message.data), request.view.nbytes)
            if message.done:
                request.view[:] = message.data
                request.done = True
            else:
                message.waiter = request
            return request
        if peer.lost:
            raise CommError(f"lost connection to rank {source} ({peer.lost})")
        peer.posted[context, tag].append(request)
        return request

    # --- waiting -------------------------------------------------------------------------

    def waitall(self, requests: Sequence[_Send | _Recv]) -> None:
        deadline = None
        while True:
            for peer in list(self._writing):
                self._pump_out(peer)
            pending = [r for r in requests if not r.done]
            if not pending:
                return
            for request in pending:
                if request.peer.lost:
                    raise CommError(f"lost connection to rank {request.peer.rank} "
                                    f"({request.peer.lost})")
            now = time.monotonic()
            if deadline is None:
                deadline = now + self.timeout
            elif now >= deadline:
                peers = sorted({r.peer.rank for r in pending})
                raise CommError(f"timed out after {self.timeout:g} s (TBCOLL_TIMEOUT) waiting "
                                f"for rank(s) {', '.join(map(str, peers))}")
            for fd, events in self._poller.poll(1000 * min(deadline - now, 1.0)):
                peer = self._by_fd[fd]
                if events & select.POLLOUT:
                    self._pump_out(peer)
                if events & _READ_EVENTS:
                    self._pump_in(peer)

    # --- moving bytes --------------------------------------------------------------------

    def _pump_out(self, peer: _Peer) -> None:
        while peer.sendq:
            request = peer.sendq[0]
            try:
                sent = peer.sock.sendmsg(request.views)
            except BlockingIOError:
                break
            except OSError as e:
                self._lose(peer, f"send failed: {e.strerror or e}")
                raise CommError(f"lost connection to rank {peer.rank} ({peer.lost})") from e
            views = request.views
            while sent:
                if sent >= len(views[0]):
                    sent -= len(views.pop(0))
                else:
                    views[0] = views[0][sent:]
                    sent = 0
            if views:
                break
            request.done = True
            peer.sendq.popleft()
        self._want_write(peer, bool(peer.sendq))

    def _want_write(self, peer: _Peer, want: bool) -> None:
        if want == (peer in self._writing) or peer.lost:
            return
        if want:
            self._writing.add(peer)
        else:
            self._writing.discard(peer)
        self._poller.modify(peer.sock, _READ_EVENTS | (select.POLLOUT if want else 0))

    def _pump_in(self, peer: _Peer) -> None:
        while not peer.lost:
            if peer.target is not None and peer.start == peer.end and len(peer.target) >= _DIRECT:
                got = self._recv_into(peer, peer.target)
                if not got:
                    return
                peer.target = peer.target[got:]
                if not peer.target:
                    self._finish_message(peer)
                continue
            if peer.start == peer.end:
                peer.start = peer.end = 0
            elif peer.end > _STAGE - _HEADER.size:  # only a partial header is left: move it up
                rest = peer.end - peer.start
                peer.stage[:rest] = peer.stage[peer.start:peer.end]
                peer.start, peer.end = 0, rest
            got = self._recv_into(peer, peer.stage_view[peer.end:])
            if not got:
                return
            peer.end += got
            self._parse(peer)

    def _recv_into(self, peer: _Peer, view: memoryview) -> int:
        """Read what the socket has into view; 0 if nothing is ready or the peer is gone."""
        try:
            got = peer.sock.recv_into(view)
        except BlockingIOError:
            return 0
        except OSError as e:
            self._lose(peer, f"receive failed: {e.strerror or e}")
            return 0
        if got == 0:
            self._lose(peer, "it closed the connection: exited or crashed")
        return got

    def _parse(self, peer: _Peer) -> None:
        while peer.start < peer.end:
            if peer.target is not None:
                n = min(peer.end - peer.start, len(peer.target))
                peer.target[:n] = peer.stage_view[peer.start:peer.start + n]
                peer.start += n
                peer.target = peer.target[n:]
                if not peer.target:
                    self._finish_message(peer)
                continue
            if peer.end - peer.start < _HEADER.size:
                return
            context, tag, nbytes = _HEADER.unpack_from(peer.stage, peer.start)
            peer.start += _HEADER.size
            self._begin_message(peer, context, tag, nbytes)

    def _begin_message(self, peer: _Peer, context: int, tag: int, nbytes: int) -> None:
        waiting = peer.posted.get((context, tag))
        if waiting:
            owner: _Recv | _Unexpected = waiting.popleft()
            self._check_size(peer, context, tag, nbytes, owner.view.nbytes)
            view = owner.view
        else:
            owner = _Unexpected(nbytes)
            peer.unexpected[context, tag].append(owner)
            view = memoryview(owner.data)
        peer.target, peer.target_owner = view, owner
        if nbytes == 0:
            self._finish_message(peer)

    def _finish_message(self, peer: _Peer) -> None:
        owner = peer.target_owner
        peer.target = peer.target_owner = None
        owner.done = True
        if isinstance(owner, _Unexpected) and owner.waiter is not None:
            owner.waiter.view[:] = owner.data
            owner.waiter.done = True

    def _check_size(self, peer: _Peer, context: int, tag: int, sent: int, expected: int) -> None:
        if sent != expected:
            raise CommError(f"rank {peer.rank} sent {sent} bytes where rank {self.rank} expected "
                            f"{expected} (context {context}, tag {tag}): the ranks are not "
                            "running the same operation; TBCOLL_CHECK=1 tells which differs")

    def _live_peer(self, rank: int) -> _Peer:
        peer = self._peers.get(rank)
        if peer is None:
            raise CommError(f"rank {self.rank} has no connection to rank {rank}")
        if peer.lost:
            raise CommError(f"lost connection to rank {rank} ({peer.lost})")
        return peer

    def _lose(self, peer: _Peer, reason: str) -> None:
        if peer.lost is None:
            peer.lost = reason
            self._writing.discard(peer)
            self._poller.unregister(peer.sock)


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


class TcpEndpoint:
    """P2P over the transport within one communicator: one context, ranks mapped to world."""

    def __init__(self, transport: TcpTransport, context: int, members: list[int]) -> None:
        self._transport, self._context, self._members = transport, context, members
        self.rank, self.size = members.index(transport.rank), len(members)
        self.waitall = transport.waitall

    def isend(self, buf: np.ndarray, peer: int, tag: int) -> _Send:
        return self._transport.isend(buf, self._members[peer], self._context, tag)

    def irecv(self, buf: np.ndarray, peer: int, tag: int) -> _Recv:
        return self._transport.irecv(buf, self._members[peer], self._context, tag)


class TcpGroup:
    """A communicator's view of the TCP transport (it has no native collectives)."""

    native = None

    def __init__(self, transport: TcpTransport, context: int, members: list[int],
                 owns_transport: bool) -> None:
        self._transport, self._owns = transport, owns_transport
        self.context, self.members = context, members  # world ranks, in group order
        self.p2p = TcpEndpoint(transport, context, members)
        self.coll = TcpEndpoint(transport, context + 1, members)
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
