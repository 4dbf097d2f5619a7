"""RDMA transport: tbcoll's own, over the ibverbs API (tbcoll/transports/rdma/fabric.h).

Per pair of ranks two queue pairs on the device named for that pair
(tbcoll.transports.rdma.devices): one carries a byte stream that tbcoll.transports.stream's engine
drives (messages, tags, matching, every algorithm of tbcoll/algorithms), the other the native mesh
collectives (small all_reduce and all_gather, barrier: every rank sends its block to every peer, and
reduces all of them in rank order in C).

Set-up: every rank of the group opens its devices and queue pairs, connects one authenticated
tcp connection to every other (tbcoll.transports.socket_mesh.connect_mesh), exchanges its
queue-pair info through the job's authenticated store, brings its queue pairs to RTS and
says so in the store; nobody sends before every rank has (UC drops what arrives early).

The group is every rank of the job (open_world: one rank per host, as on a Mac cluster) or the
hosts' leaders only (open_group, which tbcoll.hierarchy calls where a host runs several ranks):
Apple's driver allows one device context and about 10 queue pairs per device on a host, across
its processes, so only one process per host may hold them.

A dead peer gives no error on UC (nor promptly on RC): the tcp connections beside the queue
pairs carry nothing but show a peer's death (its kernel closes them) or a dead link
(keepalive), and every wait looks at them each WAIT_SLICE, as well as at TBCOLL_TIMEOUT.

With failover on (TBCOLL_FAILOVER=1, docs/failover.md) a pair whose RDMA fails (an error
completion, its device's port down, its side connection's link dead, or the peer asking) is
not lost: its stream is drained, its queue pairs released (and its device's memory once no
pair uses it), and it goes on over a new tcp connection on the pair's paths, which learns what
the peer received (UC says nothing of it); the sender replays the rest from its tail. Its mesh
blocks go over that connection too (tbcoll.transports.rdma.moved); the other pairs stay on
RDMA.
"""

from __future__ import annotations

import os
import select
import socket
import time
from collections.abc import Callable, Iterable

import numpy as np

from tbcoll.core.callbacks import check_callbacks, checked
from tbcoll.core.calls import mismatch, signature
from tbcoll.core.dtypes import DTYPE_CODES, OP_CODES
from tbcoll.core.errors import CommError, PeerLostError, PeerTimeoutError
from tbcoll.core.extensions import c_extension
from tbcoll.core.wire_check import check_wire
from tbcoll.job.env import LaunchInfo, failover, placement, rdma_settings
from tbcoll.job.pathevents import PathChange
from tbcoll.job.rendezvous import Store
from tbcoll.transports.rdma import devices
from tbcoll.transports.rdma.moved import MovedBlocks
from tbcoll.transports.rdma.watch import Watch
from tbcoll.transports.reconnect import Reconnector
from tbcoll.transports.socket_mesh import (
    connect_mesh,
    link_of,
    listen_hosts,
    path_in_use,
    peer_paths,
)
from tbcoll.transports.stream import Peer, StreamEndpoint, StreamTransport
from tbcoll.transports.stream.outq import unacked_bytes
from tbcoll.transports.stream.replay import Tail
from tbcoll.transports.stream.turns import SHARED_SLICE, Turns
from tbcoll.transports.tcp.moves import path_text, say
from tbcoll.transports.tcp.transport import TcpTransport

_verbs = c_extension("tbcoll.transports.rdma._verbs")  # None: built without infiniband/verbs.h
if _verbs is not None:
    check_wire(_verbs)
    check_callbacks(_verbs, ("rdma",))

WAIT_SLICE = 0.05  # seconds a wait stays in C before it looks at the peers and the deadline
LAST_LOOK = 1e-3  # seconds of one more look at a call once a peer is found lost
MOVED_SLICE = 1e-3  # with a pair moved to tcp, a wait on the device looks at its socket this often
ASK_LOOK = 1.0  # seconds between looks in the store for a peer asking this rank to move a pair


class _Channel:
    """The stream to one peer, as the engine wants it (tbcoll.transports.stream.Channel)."""

    def __init__(self, fabric: object, rank: int) -> None:
        self._fabric, self._rank = fabric, rank

    def sendmsg(self, buffers: list[memoryview]) -> int:
        sent = self._fabric.send(self._rank, buffers)  # ConnectionError once lost
        if not sent:
            raise BlockingIOError
        return sent

    def recv_into(self, view: memoryview) -> int:
        got = self._fabric.recv_into(self._rank, view)
        if not got:
            raise BlockingIOError
        return got

    def close(self) -> None:
        pass  # the Fabric goes with the group


class RdmaStream(StreamTransport):
    """The stream engine over the Fabric's stream queue pairs; waiting polls the device (and
    the sockets of the pairs moved to tcp)."""

    def __init__(self, fabric: object, rank: int, size: int, watch: Watch,
                 timeout: float, mover: Mover | None = None,
                 world: list[int] | None = None) -> None:
        """mover: failover (docs/failover.md), a new tcp connection to a peer (its world
        rank) and its count (reconnect.Reconnector), None: off; world: each rank's world
        rank."""
        peers = [k for k in range(size) if k != rank]
        super().__init__(rank, size, {k: _Channel(fabric, k) for k in peers}, timeout)
        self._fabric, self._watch, self._mover = fabric, watch, mover
        self._world = world or list(range(size))
        self._moved: dict[int, str] = {}  # peer -> why its pair left RDMA
        self._left: dict[int, str] = {}  # peer -> the RDMA device its pair is leaving
        self._poller = select.poll()  # the moved pairs' sockets
        self._by_fd: dict[int, int] = {}  # their descriptors -> their ranks
        self._next_ask = 0.0
        self.on_move: Callable[[int], None] = lambda rank: None  # the mesh's (MovedBlocks)
        if mover is not None:
            # What the peer may not have read is in its receive buffers, whose credits have not
            # come back: at most STREAM_RECVS of STREAM_CHUNK (fabric.h: FLOW CONTROL)
            in_flight = _verbs.STREAM_RECVS * _verbs.STREAM_CHUNK
            for peer in self._peers.values():
                peer.tail = Tail(lambda: in_flight)

    def _ready(self, timeout: float) -> Iterable[tuple[Peer, bool, bool]]:
        writers = [peer.rank for peer in self._writing if peer.rank not in self._moved]
        piece = MOVED_SLICE if self._moved else WAIT_SLICE
        end = time.monotonic() + timeout
        while True:
            left = end - time.monotonic()
            ready = self._fabric.wait(max(0.0, min(piece, left)), writers)
            if self._moved:
                ready = ready + self._sockets_ready()
            if ready or timeout <= 0:
                return [(self._peers[k], readable, writable) for k, readable, writable in ready]
            if self._look() or time.monotonic() >= end:
                return []

    def _sockets_ready(self) -> list[tuple[int, bool, bool]]:
        ready = {}
        for fd, events in self._poller.poll(0):
            rank = self._by_fd[fd]
            ready[rank] = (rank, bool(events & ~select.POLLOUT), bool(events & select.POLLOUT))
        return list(ready.values())

    def _write_interest(self, peer: Peer, want: bool) -> None:
        if isinstance(peer.channel, socket.socket):  # moved, and its connection made
            self._poller.modify(peer.channel, select.POLLIN | (select.POLLOUT if want else 0))

    def _forget(self, peer: Peer) -> None:
        if isinstance(peer.channel, socket.socket):
            self._poller.unregister(peer.channel)

    def _check_links(self, peers: Iterable[Peer]) -> None:
        self._look()

    def wait_a_slice(self) -> None:
        """Wait up to MOVED_SLICE for the device or a moved pair's socket, and move what came."""
        self._wait_and_move(MOVED_SLICE)

    @property
    def failing_over(self) -> bool:
        """Whether a pair is moving off RDMA now (broken, its tcp connection not yet made)."""
        return bool(self._broken)

    def look(self) -> tuple[int, str] | None:
        """_look, then the first peer lost (for the mesh's waits)."""
        self._look()
        lost = [(rank, peer.lost) for rank, peer in sorted(self._peers.items()) if peer.lost]
        return lost[0] if lost else None

    def _look(self) -> bool:
        """Lose every peer newly found gone (not only the first: a wait on rank 2 must not
        go on because rank 1, lost before, is still the first gone); with failover on, mark
        broken every pair whose RDMA failed (the next turn of a wait moves it: _repair)."""
        newly = False
        for rank, why in self._watch.losses():
            peer = self._peers.get(rank)
            if peer is not None and not peer.lost:
                self._lose(peer, why)
                newly = True
        for rank, why in self._watch.failures() + self._asked():
            peer = self._peers.get(rank)
            if peer is not None and not peer.lost and not peer.broken:
                self._link_failed(peer, why)
                newly = True
        return newly

    def _asked(self) -> list[tuple[int, str]]:
        """The peers that asked, through the store, to move their pair (a rank whose device
        failed may see what this one does not), once a second."""
        if self._mover is None or time.monotonic() < self._next_ask:
            return []
        self._next_ask = time.monotonic() + ASK_LOOK
        rank_of = {world: k for k, world in enumerate(self._world)}
        asked = self._mover.asked({self._world[p.rank]: p.generation
                                   for p in self._peers.values()
                                   if p.rank not in self._moved and not p.lost})
        return [(rank_of[world], f"rank {world} found the RDMA link dead") for world in asked]

    def _link_failed(self, peer: Peer, reason: str, cause: OSError | str | None = None) -> bool:
        """A pair on tcp already does not move again: its failure loses the peer."""
        if peer.rank in self._moved:
            self._lose(peer, f"{reason} (over tcp, after it left RDMA: {self._moved[peer.rank]})")
            return False
        return super()._link_failed(peer, reason, cause)

    def _reconnect(self, peer: Peer,
                   received: int) -> Callable[[], tuple[socket.socket, int] | None] | None:
        """Move the pair off RDMA (its stream drained): release its queue pairs, and return
        the work that connects over tcp and learns the peer's count."""
        rank, reason = peer.rank, peer.broken
        device, _, kind = self._fabric.describe(rank)
        self._left[rank] = f"RDMA {device} ({kind})"
        self._fabric.move(rank)
        self._watch.moved(rank)
        self._moved[rank] = reason
        self.on_move(rank)  # its blocks queue behind the replay (the stream is broken now)
        if self._mover is None:
            return None
        world, generation = self._world[rank], peer.generation + 1
        return lambda: self._mover(world, generation, received, None)

    def _failed_over(self, peer: Peer, reason: str, replayed: int, seconds: float) -> None:
        """Told as tcp's failovers are (tbcoll.transports.tcp.moves: this rank's line, the
        flight recorder, tbrun's one line per pair of hosts), from RDMA to the tcp path."""
        world = self._world[peer.rank]
        path = path_in_use(peer.channel, self._mover.route(world) or ())
        say(PathChange(self._world[self.rank], world, peer.generation,
                       self._left.pop(peer.rank, "RDMA"),
                       "tcp " + path_text(path, link_of(peer.channel)), reason, replayed,
                       round(seconds, 4)))

    def _adopt(self, peer: Peer, channel: socket.socket) -> None:
        """The pair's stream goes on over tcp; its tail bounded as tcp's (SIOCOUTQ)."""
        channel.setblocking(False)
        peer.channel = channel
        self._by_fd[channel.fileno()] = peer.rank
        self._poller.register(channel, select.POLLIN | (select.POLLOUT if peer in self._writing
                                                        else 0))
        peer.tail.unacked = lambda: unacked_bytes(channel)

    def _finish_fail_over(self, peer: Peer) -> None:
        super()._finish_fail_over(peer)
        peer.tail = None  # the replay is written (or queued first): no second move

    def moved_over(self, rank: int) -> str | None:
        """The tcp connection rank's pair moved to and why, or None while it is on RDMA."""
        if rank not in self._moved:
            return None
        peer = self._peers.get(rank)
        link = link_of(peer.channel) if peer and isinstance(peer.channel, socket.socket) else "?"
        return f"tcp {link} (moved off RDMA: {self._moved[rank]})"


Mover = Callable[[int, int, int, object], tuple[socket.socket, int] | None]


# the mesh lane's signatures less the byte count: all_reduce's by dtype then op, all_gather's
_ALL_REDUCE = [signature("all_reduce", dtype, op, 0) for dtype in DTYPE_CODES for op in OP_CODES]
_ALL_GATHER = [signature("all_gather", dtype, None, 0) for dtype in DTYPE_CODES]


class RdmaNative:
    """The world's mesh collectives in C: every rank sends its block to every other, and each
    reduces (or places) all of them in rank order. Blocks past COLL_BYTES go in pieces."""

    offers = frozenset(("all_reduce", "all_gather", "barrier"))
    takes_mlx = False
    direct_broadcast = direct_reduce_scatter = None

    def __init__(self, fabric: object, rank: int, size: int, stream: RdmaStream,
                 timeout: float, turns: Turns) -> None:
        """turns: the stream's (tbcoll.transports.stream.turns): the mesh and the stream share the
        device's completion queue, which the C code does not guard against two threads."""
        self._fabric, self.rank, self.size = fabric, rank, size
        self._stream, self._timeout, self._turns = stream, timeout, turns
        self._moved = MovedBlocks(fabric, stream)  # the blocks of pairs moved to tcp
        stream.on_move = self._moved.moved
        self._piece = _verbs.COLL_BYTES
        self._empty = np.empty(0, np.uint8)
        # the small all_reduce and all_gather whole in C (the Communicator binds it): its first
        # slice as _mesh_held's, which goes on from where it stopped
        self.lane = _verbs.MeshLane(fabric)
        self.lane.calls(take=checked("take", turns.lock.acquire), give=turns.lock.release,
                        largest=self._piece, all_reduce=_ALL_REDUCE,
                        all_gather=_ALL_GATHER, shared=turns.shared_word, budget=WAIT_SLICE,
                        shared_budget=SHARED_SLICE,
                        finish=checked("mesh_held", self._mesh_held))

    # --- one-call paths (Native.direct_*) ---------------------------------------------------

    def direct_all_reduce(self, x: np.ndarray, op: str, root: int,
                          out: np.ndarray | None) -> np.ndarray | None:
        dtype = DTYPE_CODES.get(x.dtype)
        if dtype is None or x.nbytes > self._piece or not x.flags.c_contiguous:
            return None
        out = np.empty_like(x) if out is None else out
        self._mesh(_verbs.MESH_ALL_REDUCE, x, out, dtype, OP_CODES[op],
                   signature("all_reduce", x.dtype, op, x.nbytes))
        return out

    def direct_all_gather(self, x: np.ndarray, op: None, root: int,
                          out: np.ndarray | None) -> np.ndarray | None:
        if (x.dtype not in DTYPE_CODES or x.nbytes > self._piece
                or not x.flags.c_contiguous):
            return None
        if out is None:
            shape = (self.size * x.shape[0], *x.shape[1:]) if x.ndim else (self.size,)
            out = np.empty(shape, x.dtype)
        self._mesh(_verbs.MESH_ALL_GATHER, x, out, 0, 0,
                   signature("all_gather", x.dtype, None, x.nbytes))
        return out

    # --- the collectives --------------------------------------------------------------------

    def all_reduce(self, send: np.ndarray | None, recv: np.ndarray, op: str) -> None:
        data = (recv if send is None else send).reshape(-1)
        out = recv.reshape(-1)
        dtype, code = DTYPE_CODES[recv.dtype], OP_CODES[op]
        call = signature("all_reduce", recv.dtype, op, recv.nbytes)
        step = max(1, self._piece // recv.itemsize)
        for lo in range(0, max(out.size, 1), step):  # elementwise: piece by piece
            self._mesh(_verbs.MESH_ALL_REDUCE, data[lo:lo + step], out[lo:lo + step], dtype,
                       code, call)

    def all_gather(self, send: np.ndarray, recv: np.ndarray) -> None:
        src, dst = send.reshape(-1).view(np.uint8), recv.reshape(-1).view(np.uint8)
        block = src.nbytes
        call = signature("all_gather", send.dtype, None, block)
        if block <= self._piece:
            self._mesh(_verbs.MESH_ALL_GATHER, src, dst, 0, 0, call)
            return
        blocks = dst.reshape(self.size, block)
        for lo in range(0, block, self._piece):
            piece = src[lo:lo + self._piece]
            gathered = np.empty((self.size, piece.nbytes), np.uint8)
            self._mesh(_verbs.MESH_ALL_GATHER, piece, gathered, 0, 0, call)
            blocks[:, lo:lo + piece.nbytes] = gathered

    def barrier(self) -> None:
        self._mesh(_verbs.MESH_ALL_GATHER, self._empty, self._empty, 0, 0,
                   signature("barrier"))

    def _mesh(self, kind: int, src: np.ndarray, dst: np.ndarray, dtype: int, op: int,
              call: int) -> None:
        """One mesh call, in C slices of WAIT_SLICE between which the peers are watched (and,
        once the stream is shared by threads, slices of SHARED_SLICE between which another
        thread may take its turn)."""
        with self._turns:
            self._mesh_held(kind, src, dst, dtype, op, call)

    def _mesh_held(self, kind: int, src: np.ndarray, dst: np.ndarray, dtype: int, op: int,
                   call: int, result: int | None = None) -> None:
        """_mesh's work, the engine held; result: of a slice run already (the lane's)."""
        deadline = None
        while True:
            if result is None:
                budget = SHARED_SLICE if self._turns.shared else WAIT_SLICE
                result = self._fabric.mesh(kind, src, dst, dtype, op, call, budget)
            if result == 0:
                return
            if result > 0:
                rank = result - 1
                seq, theirs, nbytes = self._fabric.differing_call()
                raise CommError(mismatch({rank: (seq + 1, theirs), self.rank: (seq + 1, call)})
                                if nbytes >= 0 and theirs != call else
                                f"rank {rank} sent {nbytes} bytes for a native collective "
                                f"where rank {self.rank} expected {src.nbytes}: the ranks' "
                                "calls do not match")
            if self._moved.any:
                self._moved.advance()
            if loss := self._stream.look():
                # a peer that finished this call may have left at once: its block came before
                # its connection closed, and this rank's slice may have ended (its budget
                # spent, descheduled) just after it took it in; look once more first
                if self._fabric.mesh(kind, src, dst, dtype, op, call, LAST_LOOK) == 0:
                    return
                raise PeerLostError(f"lost rank {loss[0]} ({loss[1]})", (loss[0],))
            if self._stream.failing_over:
                self._stream.test([])  # moves the pair once its connection has come
                time.sleep(self._stream.repair_look)
            now = time.monotonic()
            deadline = deadline or now + self._timeout
            if now >= deadline:
                peers = tuple(k for k in range(self.size) if k != self.rank)
                raise PeerTimeoutError(f"timed out after {self._timeout:g} s (TBCOLL_TIMEOUT) "
                                       "waiting for the other ranks' blocks of a native "
                                       "collective", peers)
            self._turns.pass_turn()
            result = None


class RdmaGroup:
    """A communicator's view of the rdma transport: the world has the mesh natives; a
    sub-group from split runs tbcoll's algorithms over the same stream (contexts apart)."""

    allocate = None  # comm.empty: plain arrays

    def __init__(self, stream: StreamTransport, context: int, members: list[int],
                 native: RdmaNative | None, owner: _World | None) -> None:
        self._stream, self._owner, self.native = stream, owner, native
        self.tuning = "rdma" if native is not None else "stream"  # sub-groups: no natives
        self.context, self.members = context, members
        self.p2p = StreamEndpoint(stream, context, members)
        self.coll = StreamEndpoint(stream, context + 1, members)
        self.rank, self.size = self.p2p.rank, self.p2p.size
        self.begin_call = self.coll.begin_call  # every message of a call carries it
        self.revocation = stream.revocation(context)

    def end_call(self) -> None:
        pass  # compared as messages arrive, and in the natives' headers

    def revoke(self, notice: str) -> None:
        with self._stream.turns:  # (the natives' waits are the C mesh's: they time out)
            self._stream.revoke(self.context, self.members, notice)

    def context_hint(self) -> int:
        return self._stream.next_context

    def split(self, color: int | None, key: int, members: list[int],
              context: int) -> RdmaGroup | None:
        self._stream.new_group(context, color is not None)  # as TcpGroup.split
        if color is None:
            return None
        return RdmaGroup(self._stream, context, [self.members[m] for m in members], None, None)

    def describe_links(self) -> list[str]:
        if self._owner is None:
            return []
        return [f"  to rank {r}: {self._owner.describe(r)}" for r in self.members
                if r != self._stream.rank]

    def close(self) -> None:
        if self._owner is not None:
            self._owner.close()


class _World:
    """What the world group owns: the Fabric and the tcp connections beside it."""

    def __init__(self, fabric: object | None, side: TcpTransport | None,
                 stream: RdmaStream | None = None) -> None:
        self._fabric, self._side, self._stream = fabric, side, stream

    def describe(self, rank: int) -> str:
        if self._stream is not None and (moved := self._stream.moved_over(rank)):
            return moved
        device, gid, kind = self._fabric.describe(rank)
        return f"RDMA {kind} on {device} (GID index {gid}); watched over tcp " \
               f"{self._side.describe_path(rank)}"

    def close(self) -> None:
        if self._fabric is not None:
            self._fabric.close()
            self._fabric = None
        if self._side is not None:
            self._side.close()
            self._side = None


def open_world(info: LaunchInfo | None, prefix: str) -> tuple[RdmaGroup, int, int]:
    """Connect every rank of the job (a single rank needs no device)."""
    members = list(range(info.size)) if info is not None else [0]
    return open_group(info, prefix, members), *placement(info)


def open_group(info: LaunchInfo | None, prefix: str, members: list[int]) -> RdmaGroup:
    """Connect the world ranks `members` only (tbcoll.hierarchy: the hosts' leaders, one per
    host), called by those ranks alone: the group's ranks are 0..len(members)-1 in members'
    order, its store keys lie under prefix, and only these ranks open device contexts, queue
    pairs and memory regions."""
    me = _position(info, members)
    if len(members) == 1:
        return RdmaGroup(_Alone(me), 0, [0], None, _World(None, None))
    if _verbs is None:
        raise CommError(devices.NOT_BUILT)
    size = len(members)
    fabric = _open_fabric(info, rdma_settings(), members)
    try:
        with Store.from_launch(info) as store:
            world_route = peer_paths(info)

            def route(k: int) -> tuple | None:  # the paths to the group's rank k
                return world_route(members[k])
            sockets = connect_mesh(me, size, listen_hosts(info), route,
                                   store, info.token, info.timeout, prefix)
            side = TcpTransport(me, size, sockets, info.timeout, route=route)
            _connect_queue_pairs(fabric, me, size, store, f"{prefix}/rdma", info.rank)
    except BaseException:
        fabric.close()
        raise
    mover = (Reconnector(info, f"{prefix}/rdma-moves", world_route, listen_hosts(info))
             if failover() else None)
    watch = Watch(fabric, side, [k for k in range(size) if k != me], moves=mover is not None)
    stream = RdmaStream(fabric, me, size, watch, info.timeout, mover, members)
    native = RdmaNative(fabric, me, size, stream, info.timeout, stream.turns)
    return RdmaGroup(stream, 0, list(range(size)), native, _World(fabric, side, stream))


def _position(info: LaunchInfo | None, members: list[int]) -> int:
    """This rank's place in members; ValueError where it is not one of them (a caller's bug:
    every member must call, and no other rank)."""
    rank = info.rank if info is not None else 0
    if rank not in members or len(set(members)) != len(members):
        raise ValueError(f"rank {rank} opened an rdma group of ranks {members}: only its "
                         "members call open_group, each listed once")
    return members.index(rank)


class _Alone(StreamTransport):
    """A world of one: no peers, nothing to wait for."""

    def __init__(self, rank: int) -> None:
        super().__init__(rank, 1, {}, 0.0)

    def _ready(self, timeout: float) -> Iterable[tuple[Peer, bool, bool]]:
        return []


def _spin(info: LaunchInfo) -> float:
    """Seconds a wait spins before it yields: long while the host's ranks have a core each,
    short where they share cores. All of the host's ranks count, not only the group's: beside a
    leader that waits on the device, its host's other ranks run (and wait in shared memory)."""
    local = max(1, info.local_size)
    return 50e-6 if local <= (os.cpu_count() or 1) else 5e-6


def _open_fabric(info: LaunchInfo, settings: object, members: list[int]) -> object:
    """Open this rank's devices and the queue pairs to the other members, each failure as one
    line saying what to do."""
    try:
        present = _verbs.devices(settings.library)
    except _verbs.LibraryError as e:
        raise CommError(f"the rdma backend cannot use the RDMA library: {e}; on Linux install "
                        "rdma-core (apt-get install ibverbs-providers), on macOS it needs "
                        "26.2 or later (librdma.dylib)") from None
    names = devices.devices_per_rank(info, settings, present, members)
    try:
        return _verbs.Fabric(rank=members.index(info.rank), size=len(members), devices=names,
                             rc=settings.rc, gid_index=settings.gid_index,
                             library=settings.library, spin=_spin(info))
    except _verbs.DeviceError as e:
        raise CommError(f"RDMA device {e} does not exist on rank {info.rank}'s host; its "
                        f"devices: {', '.join(present) or 'none'}") from None
    except _verbs.GidError as e:
        raise CommError(devices.no_gid(str(e))) from None
    except _verbs.RegistrationError as e:
        raise CommError(devices.registration_refused(str(e))) from None
    except OSError as e:
        raise CommError(f"rank {info.rank}: {e}") from None


def _connect_queue_pairs(fabric: object, rank: int, size: int, store: Store, prefix: str,
                         world_rank: int) -> None:
    """Exchange queue-pair info through the store, bring every queue pair to RTS, and wait
    until every rank of the group (rank, size: the group's) has: its receives are posted and it
    is ready to receive. world_rank: this rank's in the job, for messages."""
    for peer in range(size):
        if peer != rank:
            store.set(f"{prefix}/{rank}/{peer}", fabric.info(peer))
    for peer in range(size):
        if peer != rank:
            _connect(fabric, world_rank, peer, store.get(f"{prefix}/{peer}/{rank}"))
    store.set(f"{prefix}/ready/{rank}", b"")
    store.wait([f"{prefix}/ready/{r}" for r in range(size)])


def _connect(fabric: object, rank: int, peer: int, their_info: bytes) -> None:
    """Bring the queue pairs to peer to RTS, once: a refused transition is not tried again
    (on a Mac, repeated failed RTR transitions can wedge the port until reboot)."""
    try:
        fabric.connect(peer, their_info)
    except OSError as e:
        raise CommError(devices.transition_refused(rank, fabric.describe(peer), e)) from None
