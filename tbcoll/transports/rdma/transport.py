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
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable

import numpy as np

from tbcoll.core.callbacks import check_callbacks, checked
from tbcoll.core.calls import mismatch, signature
from tbcoll.core.dtypes import DTYPE_CODES, OP_CODES
from tbcoll.core.errors import CommError, PeerLostError, PeerTimeoutError
from tbcoll.core.extensions import c_extension
from tbcoll.core.wire_check import check_wire
from tbcoll.job.env import LaunchInfo, placement, rdma_settings
from tbcoll.job.rendezvous import Store
from tbcoll.transports.rdma import devices
from tbcoll.transports.socket_mesh import connect_mesh, listen_hosts, peer_paths
from tbcoll.transports.stream import Peer, StreamEndpoint, StreamTransport
from tbcoll.transports.stream.turns import SHARED_SLICE, Turns
from tbcoll.transports.tcp.transport import TcpTransport

_verbs = c_extension("tbcoll.transports.rdma._verbs")  # None: built without infiniband/verbs.h
if _verbs is not None:
    check_wire(_verbs)
    check_callbacks(_verbs, ("rdma",))

WAIT_SLICE = 0.05  # seconds a wait stays in C before it looks at the peers and the deadline
LAST_LOOK = 1e-3  # seconds of one more look at a call once a peer is found lost


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


class Watch:
    """Whether a peer is gone, seen from the tcp connections beside the queue pairs and from
    the device's own completions (RC's retries exhausted)."""

    def __init__(self, fabric: object, side: TcpTransport, peers: list[int]) -> None:
        self._fabric, self._side, self._peers = fabric, side, peers

    def losses(self) -> list[tuple[int, str]]:
        """Every peer found gone: (rank, why), the device's word first."""
        found = [(rank, why) for rank in self._peers if (why := self._fabric.lost(rank))]
        named = {rank for rank, _ in found}
        return found + [loss for loss in self._side.silent_losses() if loss[0] not in named]

    def loss(self) -> tuple[int, str] | None:
        losses = self.losses()
        return losses[0] if losses else None


class RdmaStream(StreamTransport):
    """The stream engine over the Fabric's stream queue pairs; waiting polls the device."""

    def __init__(self, fabric: object, rank: int, size: int, watch: Watch,
                 timeout: float) -> None:
        peers = [k for k in range(size) if k != rank]
        super().__init__(rank, size, {k: _Channel(fabric, k) for k in peers}, timeout)
        self._fabric, self._watch = fabric, watch

    def _ready(self, timeout: float) -> Iterable[tuple[Peer, bool, bool]]:
        writers = [peer.rank for peer in self._writing]
        end = time.monotonic() + timeout
        while True:
            left = end - time.monotonic()
            ready = self._fabric.wait(max(0.0, min(WAIT_SLICE, left)), writers)
            if ready or timeout <= 0:
                return [(self._peers[k], readable, writable) for k, readable, writable in ready]
            if self._lose_gone() or time.monotonic() >= end:
                return []

    def _check_links(self, peers: Iterable[Peer]) -> None:
        self._lose_gone()

    def _lose_gone(self) -> bool:
        """Lose every peer newly found gone (not only the first: a wait on rank 2 must not
        go on because rank 1, lost before, is still the first gone)."""
        newly = False
        for rank, why in self._watch.losses():
            peer = self._peers.get(rank)
            if peer is not None and not peer.lost:
                self._lose(peer, why)
                newly = True
        return newly


# the mesh lane's signatures less the byte count: all_reduce's by dtype then op, all_gather's
_ALL_REDUCE = [signature("all_reduce", dtype, op, 0) for dtype in DTYPE_CODES for op in OP_CODES]
_ALL_GATHER = [signature("all_gather", dtype, None, 0) for dtype in DTYPE_CODES]


class RdmaNative:
    """The world's mesh collectives in C: every rank sends its block to every other, and each
    reduces (or places) all of them in rank order. Blocks past COLL_BYTES go in pieces."""

    offers = frozenset(("all_reduce", "all_gather", "barrier"))
    takes_mlx = False
    direct_broadcast = direct_reduce_scatter = None

    def __init__(self, fabric: object, rank: int, size: int, watch: Watch,
                 timeout: float, turns: Turns) -> None:
        """turns: the stream's (tbcoll.transports.stream.turns): the mesh and the stream share the
        device's completion queue, which the C code does not guard against two threads."""
        self._fabric, self.rank, self.size = fabric, rank, size
        self._watch, self._timeout, self._turns = watch, timeout, turns
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
            if loss := self._watch.loss():
                # a peer that finished this call may have left at once: its block came before
                # its connection closed, and this rank's slice may have ended (its budget
                # spent, descheduled) just after it took it in; look once more first
                if self._fabric.mesh(kind, src, dst, dtype, op, call, LAST_LOOK) == 0:
                    return
                raise PeerLostError(f"lost rank {loss[0]} ({loss[1]})", (loss[0],))
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

    def __init__(self, fabric: object | None, side: TcpTransport | None) -> None:
        self._fabric, self._side = fabric, side

    def describe(self, rank: int) -> str:
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
    watch = Watch(fabric, side, [k for k in range(size) if k != me])
    stream = RdmaStream(fabric, me, size, watch, info.timeout)
    native = RdmaNative(fabric, me, size, watch, info.timeout, stream.turns)
    return RdmaGroup(stream, 0, list(range(size)), native, _World(fabric, side))


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
