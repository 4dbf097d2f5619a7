"""TCP transport: one connection per pair of ranks, driven by the stream engine.

The connections are the socket mesh's (tbcoll.transports.socket_mesh: set-up, authentication,
dead links). Messages, matching and progress are tbcoll.transports.stream's; waiting is poll()
on the sockets. Where the C extension tbcoll.transports.tcp._sockets is built, a message sent with
nothing queued before it goes in one C call, and a blocking receive takes the next message in
one C call when it is the one expected; everything else (and every message under
TBCOLL_LINK_DELAY_US, whose channels hold bytes back) goes through the engine, which goes on
from wherever C left off.
"""

from __future__ import annotations

import functools
import logging
import os
import select
import socket
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from tbcoll.core.callbacks import check_callbacks, checked
from tbcoll.core.calls import NO_CALL
from tbcoll.core.errors import CONNECTION_ENDED, PEER_ENDED, CommError
from tbcoll.core.extensions import c_extension
from tbcoll.core.framing import HEADER
from tbcoll.core.wire_check import check_wire
from tbcoll.job.env import LaunchInfo, failover, faults, link_delay, placement
from tbcoll.job.pathevents import PathChange
from tbcoll.job.rendezvous import Store
from tbcoll.job.topology import Path
from tbcoll.transports.reconnect import Reconnector
from tbcoll.transports.socket_mesh import (
    Route,
    connect_mesh,
    describe_paths,
    gone,
    link_of,
    listen_hosts,
    path_in_use,
    peer_paths,
    send_failure,
)
from tbcoll.transports.stream import (
    Channel,
    Peer,
    Recv,
    Send,
    StreamEndpoint,
    StreamTransport,
    bytes_of,
)
from tbcoll.transports.stream.faults import FaultPlan, SocketCuts
from tbcoll.transports.stream.outq import unacked_bytes
from tbcoll.transports.stream.replay import Tail
from tbcoll.transports.stream.turns import Marking
from tbcoll.transports.stream.words import RECEIVED_WORD, SENT_WORD, check_words
from tbcoll.transports.tcp.delayed import DelayedChannel
from tbcoll.transports.tcp.detection import Detection
from tbcoll.transports.tcp.failing import READ_EVENTS, TcpFailover, failing_over
from tbcoll.transports.tcp.native import TcpNative

log = logging.getLogger("tbcoll.tcp")
# failover's (docs/failover.md): a new connection to peer after generation - 1 failed, this
# end's count sent and the peer's returned, or None where no path is left (socket_mesh's
# Reconnector: peer, generation, received, the path that failed); and a test's wrapper of
# each connection (rank, peer, generation, socket -> channel)
Reconnect = Callable[[int, int, int, "Path | None"], "tuple[socket.socket, int] | None"]
Wrap = Callable[[int, int, int, socket.socket], Channel]

# None where built without a compiler (or TBCOLL_NO_C=1): every message takes the engine's
# Python path
_sockets = c_extension("tbcoll.transports.tcp._sockets")
if _sockets is not None:
    check_wire(_sockets)
    check_words(_sockets)
    check_callbacks(_sockets, ("tcp",))

# A waiting rank looks at its sockets this long before it sleeps in poll(): waking from poll
# costs more than a loopback message takes (8 B all_reduce at np=2: 72 -> 22-39 us). It
# yields its core between looks, so that ranks beyond the cores still run (np=4 on 2 cores:
# 235-279 -> 184-233 us). A rank with sends stalled on a full socket (large messages) sleeps
# at once: it waits for its peer to read, which a look would not hasten.
_SPIN = 50e-6
_C_SLICE = 0.05  # seconds a receive waits in C before the engine (links, deadline) takes over


class TcpTransport(TcpFailover, Detection, StreamTransport):
    """Point-to-point messages between world ranks over one TCP connection per pair."""

    def __init__(self, rank: int, size: int, sockets: dict[int, socket.socket],
                 timeout: float, delay: float = 0.0, route: Route | None = None,
                 reconnect: Reconnect | None = None, wrap: Wrap | None = None,
                 pairs: Iterable[int] | None = None) -> None:
        """delay: TBCOLL_LINK_DELAY_US's emulated latency, in seconds (0: none); route: the
        paths to each peer (socket_mesh.peer_paths), for describe_paths; reconnect: failover
        (docs/failover.md), a new connection to a peer and its count
        (reconnect.Reconnector), None: off; wrap: each connection's channel (a test's
        fault injector, tbcoll.transports.stream.faults); pairs: the peers whose streams
        fail over where reconnect is given (None: every one)."""
        self._reconnector, self._wrap = reconnect, wrap
        channels = {peer: (DelayedChannel(sock, delay) if delay else
                           wrap(rank, peer, 0, sock) if wrap else sock)
                    for peer, sock in sockets.items()}
        super().__init__(rank, size, channels, timeout)
        for peer in self._peers.values() if reconnect is not None else ():
            if pairs is None or peer.rank in pairs:
                peer.tail = Tail(peer.channel.unacked if hasattr(peer.channel, "unacked")
                                 else functools.partial(unacked_bytes, peer.channel))
        self._tailed = any(peer.tail is not None for peer in self._peers.values())
        self.turns = Marking(self.words)  # (before any door is made) for tcp_lane.c's words
        self._holding = [peer for peer in self._peers.values()
                         if isinstance(peer.channel, DelayedChannel)]
        # Held bytes' due times are the engine's state: such waits keep the engine (turns)
        self.waits_released = not self._holding
        self._by_fd: dict[int, Peer] = {}
        self._links: dict[int, str] = {}  # peer -> "this end -> that end", for messages
        # failovers: the path each failing stream leaves, and each peer's moves so far (the
        # wall-clock time of each, for describe)
        self._leaving: dict[int, str] = {}
        self._moves: dict[int, list[tuple[str, PathChange]]] = {}
        self._paths = {peer: (route(peer) or ()) if route else () for peer in sockets}
        # the path each connection runs over, read while it lives (a dead one may not say)
        self._in_use = {peer: path_in_use(sock, self._paths[peer])
                        for peer, sock in sockets.items()}
        self._poller = select.poll()
        for peer in self._peers.values():
            peer.channel.setblocking(False)
            self._by_fd[peer.channel.fileno()] = peer
            self._poller.register(peer.channel, READ_EVENTS)
            self._links[peer.rank] = link_of(peer.channel)
        # A thread whose send stalls while another thread polls for everyone wakes it through
        # this pair, so that its poll() watches that socket for room too
        self._wake, self._woken = socket.socketpair()
        for end in (self._wake, self._woken):
            end.setblocking(False)
        self._poller.register(self._woken, select.POLLIN)
        # C writes and reads the sockets itself (keeping failover's tail where there is one:
        # tail_keep), not a test's wrapped channels
        self._in_c = _sockets is not None and not self._holding and wrap is None
        self._detect(_sockets if reconnect is not None else None)
        # exchange's C arguments by group of peers: (streams, their fds, their stages)
        self._exchanges: dict[tuple[int, ...], tuple[list[Peer], tuple, tuple]] = {}

    def isend(self, buf: np.ndarray, dest: int, context: int, tag: int,
              call: tuple[int, int] = NO_CALL) -> Send:
        """The whole message in one C sendmsg when nothing is queued before it; the engine
        queues what did not fit."""
        peer = self._peers.get(dest)
        if not self._in_c or not self._sends_idle(peer):
            return super().isend(buf, dest, context, tag, call)
        header = self._header(context, tag, buf.nbytes, call[0], call[1])
        try:
            written = _sockets.send(peer.channel.fileno(), header, buf)
        except OSError as e:
            self._send_broke(peer, e.errno)
            written = 0
        self.words[peer.words_at + SENT_WORD] += written  # (the engine's holder: its counts)
        return self._send_rest(peer, header, bytes_of(buf), written)

    def recv(self, buf: np.ndarray, source: int, context: int, tag: int,
             call: tuple[int, int] = NO_CALL) -> None:
        """The next message from source in one C call, straight into buf, when it is this
        one (context, tag, size and call), the engine holds nothing from source for it and
        no send waits for room; else the engine goes on from where C left off (see
        _resumed)."""
        peer = self._peers.get(source)
        if not self._in_c or self._writing or not self._receives_idle(peer, context, tag):
            super().recv(buf, source, context, tag, call)
            return
        header = self._header(context, tag, buf.nbytes, call[0], call[1])
        copied, staged, error = _sockets.recv(peer.channel.fileno(), header, buf, peer.stage,
                                              *self._c_wait())
        self.words[peer.words_at + RECEIVED_WORD] += read_by_c(copied, staged)
        if copied != buf.nbytes:
            self.waitall([self._resumed(peer, buf, context, tag, call, copied, staged, error)])

    def exchange(self, buf: np.ndarray, peers: tuple[int, ...], blocks: np.ndarray,
                 context: int, tag: int, call: tuple[int, int] = NO_CALL,
                 reduction: tuple | None = None) -> bool:
        """Send buf to each of peers and receive from each a message of its size into
        blocks[i]: in one C call while every stream to them is idle, else (or from where C
        stopped) through the engine. reduction: (out, own, rank, dtype code, op code) for C to
        reduce the blocks and own (None: buf) into out as well (see _sockets.exchange); True
        where it did."""
        streams, fds, stages = self._exchanges.get(peers) or self._exchange_args(peers)
        if fds and not self._writing and self._idle(streams, context, tag):
            header = self._header(context, tag, buf.nbytes, call[0], call[1])
            # a tail keeps buf as sent: a reduction that would overwrite it waits for that
            later = (self._tailed and reduction is not None
                     and np.may_share_memory(reduction[0], buf))
            stopped = _sockets.exchange(fds, header, buf, blocks, stages, *self._c_wait(),
                                        None if later else reduction)
            self._count_exchange(streams, len(header) + buf.nbytes, stopped)
            if stopped is None:
                if self._tailed:
                    self._keep_whole(streams, header, buf)
                if later:  # (buf is kept: out may be overwritten now)
                    out, own, rank, dtype_code, op_code = reduction
                    _sockets.reduce(blocks, buf if own is None else own, rank, out, dtype_code,
                                    op_code)
                return reduction is not None
            self._exchange_on(buf, streams, blocks, context, tag, call, header, stopped)
            return False
        sends = [self.isend(buf, rank, context, tag, call) for rank in peers]
        for i, rank in enumerate(peers):
            self.recv(blocks[i], rank, context, tag, call)
        self.waitall(sends)
        return False

    def lane(self, peers: tuple[int, ...], endpoint: StreamEndpoint, rank: int, tag: int) -> Any:
        """A C Lane (tbcoll/transports/tcp/tcp_lane.c) that exchanges endpoint's messages of tag
        with peers (world ranks, in group order, this rank left out: it is the group's rank)
        by itself where nothing in this engine must go first (its words); its calls() are
        the caller's (the engine's lock: turns.lock). None where C does not take them."""
        if not self._in_c or not 0 < len(peers) <= _sockets.MAX_PEERS:
            return None
        streams = [self._live_peer(peer) for peer in peers]
        lane = _sockets.Lane(fds=tuple(s.channel.fileno() for s in streams),
                             stages=tuple(s.stage for s in streams), peers=peers,
                             context=endpoint.context, tag=tag, rank=rank)
        lane.engine(words=self.words, publish=self.publish_words, call=endpoint.call_words,
                    shared=self.turns.shared_word)
        if any(s.tail is not None for s in streams):  # failover's: C keeps what it sends
            lane.tails(rings=tuple(s.tail and s.tail.ring for s in streams),
                       words=tuple(s.tail and s.tail.words for s in streams),
                       keep=checked("tcp_keep", self.keep_whole))
        return lane

    def resume_exchange(self, buf: np.ndarray, peers: tuple[int, ...], blocks: np.ndarray,
                        context: int, tag: int, call: tuple[int, int], header: bytes,
                        stopped: tuple) -> None:
        """Finish an exchange with peers that a C path began and stopped (stopped: as
        _sockets.exchange says), the engine held by that path."""
        streams = (self._exchanges.get(peers) or self._exchange_args(peers))[0]
        try:
            self._exchange_on(buf, streams, blocks, context, tag, call, header, stopped)
        finally:
            self.turns.moved()  # what a door would do on leaving, but the release

    def finish_send(self, buf: np.ndarray, dest: int, header: bytes, written: int,
                    error: int) -> None:
        """The rest of a send to dest that a C path began (written: its bytes that went,
        header first; error: the errno of a failed sendmsg), the engine held by that path."""
        peer = self._peers[dest]
        try:
            if error:
                self._send_broke(peer, error)
            self.waitall([self._send_rest(peer, header, bytes_of(buf), written)])
        finally:
            self.turns.moved()

    def finish_recv(self, buf: np.ndarray, source: int, header: bytes, copied: int, staged: int,
                    error: int) -> None:
        """The rest of a receive from source that a C path began (copied, staged, error: as
        _sockets.recv says), the engine held by that path."""
        context, tag, _, seq, call = self._header_of(header)
        try:
            self.waitall([self._resumed(self._peers[source], buf, context, tag, (seq, call),
                                        copied, staged, error)])
        finally:
            self.turns.moved()

    def c_wait(self) -> tuple[float, float]:
        """How long a C path waits for its peers, spinning and in all, alone in the engine."""
        return _SPIN, _C_SLICE

    def _c_wait(self) -> tuple[float, float]:
        """How long a C path may spin, and wait, for its peers: once another thread has wanted
        the engine, only its spin (C holds the engine while it waits, so another thread waits
        at most that long; the engine's own waits release it)."""
        return (_SPIN, _SPIN) if self.turns.shared else (_SPIN, _C_SLICE)

    def _exchange_on(self, buf: np.ndarray, streams: list[Peer], blocks: np.ndarray,
                     context: int, tag: int, call: tuple[int, int], header: bytes,
                     stopped: tuple[tuple[int, int, int, int, int], ...]) -> None:
        """Finish an exchange from where C stopped (stopped: per peer, what was sent, the
        send's errno, and _sockets.recv's copied, staged, error)."""
        payload, requests = bytes_of(buf), []
        for stream, (sent, failed, *_) in zip(streams, stopped, strict=True):
            if failed:
                self._send_broke(stream, failed)
            requests.append(self._send_rest(stream, header, payload, sent))  # (its tail too)
        for i, (stream, (*_, copied, staged, error)) in enumerate(zip(streams, stopped,
                                                                      strict=True)):
            requests.append(self._resumed(stream, blocks[i], context, tag, call, copied,
                                          staged, error))
        self.waitall([request for request in requests if request is not None])

    def _count_exchange(self, streams: list[Peer], whole: int, stopped: tuple | None) -> None:
        """Count what _sockets.exchange moved on each stream (stopped None: whole messages
        both ways), in the engine's words."""
        words = self.words
        for i, stream in enumerate(streams):
            sent, received = ((whole, whole) if stopped is None else
                              (stopped[i][0], read_by_c(stopped[i][2], stopped[i][3])))
            words[stream.words_at + SENT_WORD] += sent
            words[stream.words_at + RECEIVED_WORD] += received

    def _swap_channel(self, peer: Peer, channel: Channel) -> None:
        """A new connection takes the old one's descriptor number (dup2, which closes the old
        connection): the C Lanes and the exchanges' arguments hold that number, and poll()
        watches it, so all of them follow the new connection as they stand."""
        if not isinstance(channel, socket.socket) or not isinstance(peer.channel, socket.socket):
            raise CommError(f"rank {self.rank}: tcp replaces a connection with a connected "
                            f"socket, not a {type(channel).__name__} (nor one that holds "
                            "bytes back: TBCOLL_LINK_DELAY_US)")
        channel.setblocking(False)
        self._unwatch(peer.channel)
        os.dup2(channel.fileno(), peer.channel.fileno(), inheritable=False)
        channel.close()
        self._watch(peer.channel)
        self._links[peer.rank] = link_of(peer.channel)

    def _exchange_args(self, peers: tuple[int, ...]) -> tuple[list[Peer], tuple | None, tuple]:
        """exchange's streams, and its arguments for C (fds None where C does not take it)."""
        streams = [self._live_peer(rank) for rank in peers]
        in_c = self._in_c and len(streams) <= _sockets.MAX_PEERS
        args = (streams, tuple(s.channel.fileno() for s in streams) if in_c else None,
                tuple(s.stage for s in streams))
        self._exchanges[peers] = args
        return args

    def _idle(self, streams: list[Peer], context: int, tag: int) -> bool:
        """Every one of streams may send and take its next message by C's path (_sends_idle
        and _receives_idle: a stream here is never None, and _receives_idle sees it lost)."""
        for stream in streams:
            if stream.sendq or not self._receives_idle(stream, context, tag):
                return False
        return True

    def _resumed(self, peer: Peer, buf: np.ndarray, context: int, tag: int,
                 call: tuple[int, int], copied: int, staged: int, error: int) -> Recv | None:
        """The engine's receive for what C left of one (copied, staged, error: as
        _sockets.recv says), None if C finished it: another message came first (in the
        staging buffer now, for the engine to parse), or the peer was slow or is gone; the
        engine goes on and says what was wrong if anything was."""
        if copied == buf.nbytes:
            return None
        if staged:
            peer.start, peer.end = 0, staged
            self._parse(peer)
        if error:  # failover's (the stream broken, not lost) where it is on
            if error < 0:
                self._link_failed(peer, f"{PEER_ENDED}: it closed the connection",
                                  CONNECTION_ENDED)
            else:
                self._link_failed(peer, f"receive failed: {os.strerror(error)}")
        if copied >= 0:  # its header and first bytes are in
            return self._rest_of_message(peer, bytes_of(buf), copied, context)
        return self.irecv(buf, peer.rank, context, tag, call)

    def _lose(self, peer: Peer, reason: str) -> None:
        super()._lose(peer, f"{reason}; the link {self.link(peer.rank)}")

    @staticmethod
    def _send_failure(error: OSError) -> str:
        return send_failure(error.errno) if error.errno else f"send failed: {error}"

    def link(self, rank: int) -> str:
        """The addresses of the connection to rank: "this end -> that end"."""
        return self._links.get(rank, "?")

    def describe_path(self, rank: int) -> str:
        """The connection to rank, the path it runs over and the pair's other paths (the
        hostfile's: Layout.paths), for Communicator.describe()."""
        peer = self._peers.get(rank)
        paths = self._paths.get(rank, ())
        moves = "".join(f"; failed over at {when} from {change.old} ({change.reason}), "
                        f"{change.seconds:.1f} s" for when, change in self._moves.get(rank, ()))
        sock = getattr(peer.channel, "socket", peer.channel) if peer is not None else None
        if not paths or not isinstance(sock, socket.socket):
            return self.link(rank) + moves
        return (f"{self.link(rank)}, {describe_paths(sock, paths, self._in_use.get(rank))}"
                + moves)

    def silent_loss(self) -> tuple[int, str] | None:
        """A peer whose connection is gone, found without reading anything, so that another
        thread may ask while this transport's owner waits elsewhere (in MLX): (rank, why)."""
        losses = self.silent_losses()
        return losses[0] if losses else None

    def silent_losses(self) -> list[tuple[int, str]]:
        """Every peer silent_loss would name, in rank order."""
        return [(peer.rank, f"{why}; the link {self.link(peer.rank)}")
                for peer in list(self._peers.values()) if (why := gone(peer.channel))]

    def _ready(self, timeout: float) -> Iterable[tuple[Peer, bool, bool]]:
        return self._ready_or_due(timeout) if self._holding else self._polled(timeout)

    def _polled(self, timeout: float) -> list[tuple[Peer, bool, bool]]:
        ready = self._poller.poll(0)
        if not ready and timeout > 0:
            end = time.perf_counter() + (0 if self._writing else _SPIN)
            while not ready and time.perf_counter() < end:
                os.sched_yield()
                ready = self._poller.poll(0)
            if not ready:
                ready = self._sleep_in_poll(timeout)
        woken = self._woken.fileno()
        if any(fd == woken for fd, _ in ready):
            self._drain_wake()
        return [(self._by_fd[fd], bool(events & READ_EVENTS), bool(events & select.POLLOUT))
                for fd, events in ready if fd != woken]

    def _drain_wake(self) -> None:
        try:
            while self._woken.recv(64):
                pass
        except BlockingIOError:
            pass

    def _ready_or_due(self, timeout: float) -> list[tuple[Peer, bool, bool]]:
        """_ready where channels hold bytes back (DelayedChannel): a held message's due time
        ends the wait too, met by spinning (yielding the core) within a millisecond of it,
        where poll() would add its 30-50 us wake-up."""
        end = time.perf_counter() + timeout
        while True:
            dues = [(peer, peer.channel.due()) for peer in self._holding if not peer.lost]
            due_now = [(peer, True, False) for peer, due in dues if due is not None and due <= 0]
            soonest = min((due for _, due in dues if due is not None), default=None)
            left = end - time.perf_counter()
            if due_now or left <= 0 or soonest is None or soonest >= 1e-3:
                # the sockets, as without held bytes (their spin included), until one is due
                wait = 0.0 if due_now else max(0.0, min(left, soonest or left))
                ready = self._polled(wait)
                if ready or due_now or time.perf_counter() >= end:
                    due = {peer for peer, _, _ in due_now}
                    return due_now + [r for r in ready if r[0] not in due]
                continue
            ready = self._polled(0.0)
            if ready:
                return ready
            os.sched_yield()

    def _write_interest(self, peer: Peer, want: bool) -> None:
        self._poller.modify(peer.channel, READ_EVENTS | (select.POLLOUT if want else 0))
        if self.turns.polling:  # another thread polls, with the old interests: wake it
            try:
                self._wake.send(b"\0")
            except BlockingIOError:
                pass  # it has enough to wake on

    def _forget(self, peer: Peer) -> None:
        try:
            self._poller.unregister(peer.channel)
        except (KeyError, ValueError):
            pass  # a failover closed it already

    def close(self) -> None:
        self._stop_detecting()
        super().close()
        self._wake.close()
        self._woken.close()



class TcpGroup:
    """A communicator's view of the TCP transport; its native collective is the small
    all_reduce of tbcoll.transports.tcp.native."""

    tuning = "tcp"
    allocate = None  # comm.empty: plain arrays
    world_peers = True  # its transport's ranks are the world's

    def __init__(self, transport: TcpTransport, context: int, members: list[int],
                 owns_transport: bool) -> None:
        self._transport, self._owns = transport, owns_transport
        self.context, self.members = context, members  # world ranks, in group order
        self.p2p = StreamEndpoint(transport, context, members)
        self.coll = StreamEndpoint(transport, context + 1, members)
        self.rank, self.size = self.p2p.rank, self.p2p.size
        self.begin_call = self.coll.begin_call  # every message of a call carries it
        self.revocation = transport.revocation(context)
        self.native = TcpNative(transport, self.coll, context + 1, members)
        if self.native.lane is not None:  # the communicator's send and recv too
            self.native.lane.moves(
                context=context, call=self.p2p.call_words,
                finish_send=checked("tcp_finish_send", transport.finish_send),
                finish_recv=checked("tcp_finish_recv", transport.finish_recv))

    def end_call(self) -> None:
        pass  # compared as messages arrive

    def revoke(self, notice: str) -> None:
        with self._transport.turns:
            self._transport.revoke(self.context, self.members, notice)

    def revoked(self) -> str | None:
        """This group's revocation notice, if one has come (read now, without waiting): for a
        thread that watches a wait in another library's C (mlx's watchdog)."""
        with self._transport.turns:
            return self._transport.notice(self.context)

    def context_hint(self) -> int:
        return self._transport.next_context

    def describe_links(self) -> list[str]:
        """Which addresses each connection of this group runs between."""
        return [f"  to rank {rank}: {self._transport.describe_path(rank)}"
                for rank in self.members if self._transport.peer(rank) is not None]

    def silent_loss(self) -> tuple[int, str] | None:
        return self._transport.silent_loss()

    def split(self, color: int | None, key: int, members: list[int],
              context: int) -> TcpGroup | None:
        # Every member of a new group has next_context <= context, so the pair of contexts
        # (context, context + 1) is new to every pair of ranks that share the group.
        self._transport.new_group(context, color is not None)
        if color is None:
            return None
        return TcpGroup(self._transport, context, [self.members[m] for m in members], False)

    def close(self) -> None:
        if self._owns:
            self._transport.close()


def read_by_c(copied: int, staged: int) -> int:
    """The bytes a C receive read from its socket (copied, staged: as _sockets.recv says):
    the header and copied bytes of payload once the header matched, else what it staged."""
    return HEADER.size + copied if copied >= 0 else staged


def open_world(info: LaunchInfo | None, prefix: str) -> tuple[TcpGroup, int, int]:
    """Connect every rank of the job (a single rank needs no store and no sockets)."""
    return (_world(info, prefix), *placement(info))


def _world(info: LaunchInfo | None, prefix: str) -> TcpGroup:
    if info is None or info.size == 1:
        return TcpGroup(TcpTransport(0, 1, {}, 0.0), 0, [0], True)
    return TcpGroup(connect(info, prefix), 0, list(range(info.size)), True)


def connect(info: LaunchInfo, prefix: str, peers: frozenset[int] | None = None) -> TcpTransport:
    """The transport over a connection to each of peers (world ranks; None: every other
    rank), the same relation on every rank; failing over as failing_over says
    (docs/failover.md)."""
    hosts = listen_hosts(info)
    with Store.from_launch(info) as store:
        route = peer_paths(info)
        sockets = connect_mesh(info.rank, info.size, hosts, route,
                               store, info.token, info.timeout, prefix, peers)
    cuts, delay = faults(), link_delay()
    plan = None
    if cuts:
        seed, count, span, split, real = cuts
        plan = SocketCuts(seed, count, span) if real else FaultPlan(seed, count, span,
                                                                     split=split)
    pairs = failing_over(failover(), plan is not None, route, sockets)
    reconnect = Reconnector(info, prefix, route, hosts) if pairs and not delay else None
    if isinstance(plan, FaultPlan) and reconnect is not None and plan.split is not None:
        reconnect = plan.reconnecting(reconnect)
    wrap = plan.wrap if isinstance(plan, FaultPlan) and reconnect else None
    transport = TcpTransport(info.rank, info.size, sockets, info.timeout, delay, route,
                             reconnect, wrap, pairs)
    if isinstance(plan, SocketCuts) and reconnect:
        plan.watch(transport)
    return transport

