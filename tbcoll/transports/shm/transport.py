"""Shared-memory transport: everything through one segment per communicator.

Native collectives (the default here) are tbcoll.transports.shm.native's; point-to-point messages,
which the user's send/recv and the ring, mesh and rd algorithms use, are the stream engine's
(tbcoll.transports.stream) over one pair of byte rings per pair of ranks
(tbcoll.transports.shm.pipe). On Linux a message of PULL_BYTES or more is not copied into the ring
and out again: the receiver reads it straight from the sender's buffer (cross-memory attach,
process_vm_readv), as the stream engine's pulled messages. Where a policy refuses that (Yama's
ptrace_scope 1 or more between sibling processes, a container without CAP_SYS_PTRACE under such a
policy, a seccomp filter), the first refused pull is resent through the ring and the pair goes on
with the ring from then on, silently: it is only slower. macOS has no such call: the ring always.
TBCOLL_SHM_CMA=0 turns it off.

A communicator's segment is created by its first rank, mapped by the others and unlinked as
soon as all have mapped it: through the rendezvous store for the world, through the parent
communicator's messages for one made by split.
"""

from __future__ import annotations

import errno
import functools
import os
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from tbcoll.core.callbacks import checked
from tbcoll.core.calls import NO_CALL
from tbcoll.core.errors import PEER_ENDED, CommError, PeerLostError
from tbcoll.core.protocols import P2P
from tbcoll.job.env import LaunchInfo, comm_timeout, placement, segment_prefix, shm_cma, single_host
from tbcoll.job.rendezvous import Store
from tbcoll.transports.shm.flags import atomics
from tbcoll.transports.shm.native import (
    RING,
    WAIT_SLICE,
    Layout,
    ShmNative,
    available,
    gone,
    settle,
)
from tbcoll.transports.shm.pipe import OverwrittenRing, Ring, ShmDuplex
from tbcoll.transports.shm.segment import MAX_NAME, Segment
from tbcoll.transports.stream import Peer, StreamEndpoint, StreamTransport, bytes_of
from tbcoll.transports.stream.turns import Marking
from tbcoll.transports.stream.words import check_words

_SETUP_TAG = 30000
_SPINS = 50  # polls of the rings before a waiting rank starts to yield its core
_YIELD_FOR = 2e-3  # seconds of yielding before it starts to nap
_LONGEST_NAP = 1e-4
_ROOM_WAIT = 2e-3  # how long a blocking send waits in C for room before the engine takes over
# Messages this large (more than the ring holds whole) are pulled from the sender's memory.
# Ping-pong time, pulled / through the ring, in one job taking turns, each rank sending back
# what it has just received (as the benchmarks do, and as data just computed would be):
# 32 KB 1.45-1.58x, 64 KB 1.34-1.52x, 128 KB 0.89-1.05x, 256 KB 0.65x. (A buffer that stays
# in the sender's caches unwritten pulls faster: 64 KB 0.87x.) A message that fits the ring
# whole needs no answer from the receiver.
PULL_BYTES = RING
# A ring never says that its reader has ended: a send looks (ShmStream._look) at most this
# often per receiver, so that one to a rank that has ended fails within it, as tcp's does.
LOOK_EVERY = 0.1


check_words(atomics)


class ShmStream(StreamTransport):
    """The stream engine over shared-memory rings; waiting polls the rings.

    Why a pulled payload is whole when read and untouched until then, on ARM64 as on x86-64:
    the sender wrote its buffer before the release store of the ring's head that publishes
    the announcement, which the receiver's acquire load of that head precedes the read
    (process_vm_readv, in program order after it); the receiver's read has returned before
    its release store of the head that publishes its answer, and the sender's send returns
    (and its buffer may change) only after its acquire load of that head.
    """

    pull_bytes = PULL_BYTES

    def __init__(self, native: ShmNative, timeout: float) -> None:
        rank, size, layout = native.rank, native.size, native.layout
        buffer = native.segment.buffer

        def ring(source: int, dest: int) -> Ring:
            return Ring(buffer, layout.pipe(source, dest, size), layout.pipe_bytes - Ring.CONTROL)

        channels = {peer: ShmDuplex(ring(rank, peer), ring(peer, rank))
                    for peer in range(size) if peer != rank}
        super().__init__(rank, size, channels, timeout)
        self.turns = Marking(self.words)  # before any door is made
        self._native = native
        pulls = bool(atomics.HAVE_CMA) and shm_cma()
        for peer in self._peers.values():
            peer.pulls = pulls
        self._next_look = [0.0] * size  # per rank, when a send to it looks next

    def lend_lane(self, lane: atomics.Lane, endpoint: StreamEndpoint) -> None:
        """Let the communicator's lane (tbcoll/transports/shm/moves.c) move endpoint's messages
        itself where this engine would take its C paths below: it tests the engine's words (see
        tbcoll.transports.stream.words; publish_words where they are STALE) to see
        that nothing must go first, takes next_pull's, and leaves to the engine what it cannot
        (endpoint.send/recv) or did not finish (the _finish_* methods, entered as doors).
        endpoint's ranks are this engine's (one segment per communicator).

        Why plain loads and stores of the words are safe: the words are this process's own
        memory, and only the thread that holds the communicator touches them, with the GIL
        held (the lane's send and recv hold its guard from their check to their last store;
        the engine's doors hold its Turns, and run only within that thread's calls: the
        communicator gives up the lane before another thread may use it, see comm.py's
        _progress_thread; publish_words, which the lane calls, opens no door: it reads what
        only that thread changes, and its caller holds the guard)."""
        rings = tuple(None if rank == self.rank else
                      (peer.channel.outgoing.base, peer.channel.incoming.base)
                      for rank in range(self.size) for peer in [self._peers.get(rank)])
        ring = next(iter(self._peers.values())).channel.outgoing
        self.publish_words()
        lane.streams(
            context=endpoint.context, capacity=ring.capacity, send_budget=_ROOM_WAIT,
            recv_budget=WAIT_SLICE, words=self.words, publish=self.publish_words, rings=rings,
            send=checked("engine_send", endpoint.send),
            recv=checked("engine_recv", endpoint.recv),
            finish_send=checked("shm_finish_send", self._door(self._finish_send)),
            finish_recv=checked("shm_finish_recv", self._door(self._finish_recv)),
            finish_pulled_send=checked("finish_pulled_send", self._door(self._finish_pulled_send)),
            finish_announcement=checked("finish_announcement",
                                        self._door(self._finish_announcement)),
            pull_bytes=PULL_BYTES, look=checked("look", self._door(self._look)),
            look_every=LOOK_EVERY)

    def _door(self, method: Callable[..., None]) -> Callable[..., None]:
        """method, entered as a door into the engine (its Turns, which mark the words STALE)."""
        turns = self.turns

        @functools.wraps(method)  # its signature, which callbacks.checked reads
        def entered(*args: Any) -> None:
            with turns:
                method(*args)
        return entered

    def send(self, buf: np.ndarray, dest: int, context: int, tag: int,
             call: tuple[int, int] = NO_CALL) -> None:
        """The whole message in one C call (the lane's move: its rings and pulls are written
        once, in tbcoll/transports/shm/moves.c) when nothing is queued before it (and, to pull,
        nothing comes from dest first); what C does not finish goes on through the engine, which
        reads while it waits."""
        self._look_if_due(dest)
        peer = self._peers.get(dest)
        pulled = peer is not None and buf.nbytes >= PULL_BYTES and peer.pulls
        if not self._sends_idle(peer) or (pulled and not self._stream_idle(peer)):
            super().send(buf, dest, context, tag, call)
            return
        self._move_in_c(True, buf, dest, context, tag, call, pulled)

    def isend(self, buf: np.ndarray, dest: int, context: int, tag: int,
              call: tuple[int, int] = NO_CALL) -> Any:
        self._look_if_due(dest)
        return super().isend(buf, dest, context, tag, call)

    def _look_if_due(self, dest: int) -> None:
        """_look at dest where a send to it has not looked for LOOK_EVERY seconds (the lane's
        sends keep their own times: tbcoll/transports/shm/moves.c, look_if_due)."""
        now = time.monotonic()
        if 0 <= dest < self.size and now >= self._next_look[dest]:
            self._next_look[dest] = now + LOOK_EVERY
            self._look(dest)

    def _look(self, dest: int) -> None:
        """Raise PeerLostError where rank dest has ended (its pid gone), or was lost before."""
        peer = self._peers.get(dest)
        if peer is None:
            return
        pid = self._native.pid_of(dest)
        if not peer.lost and gone(pid):
            self._lose(peer, f"{PEER_ENDED}: pid {pid} is gone")
        if peer.lost:
            raise self.lost(dest)

    def recv(self, buf: np.ndarray, source: int, context: int, tag: int,
             call: tuple[int, int] = NO_CALL) -> None:
        """The next message from source in one C call, straight into buf (the lane's move),
        when it is this one (context, tag, size and call) and the engine holds nothing from
        source for it (to pull it: and nothing is queued to source before the answer); else
        (another message first, a slow sender) the engine goes on from where C left off, and
        says what was wrong if anything was."""
        peer = self._peers.get(source)
        pulled = peer is not None and buf.nbytes >= PULL_BYTES and peer.pulls
        if not self._receives_idle(peer, context, tag) or (pulled and peer.sendq):
            super().recv(buf, source, context, tag, call)
            return
        self._move_in_c(False, buf, source, context, tag, call, pulled)

    def _move_in_c(self, sending: bool, buf: np.ndarray, rank: int, context: int, tag: int,
                   call: tuple[int, int], pulled: bool) -> None:
        """A blocking move in C, and the engine's part of what it left (the MOVE_* outcomes
        of tbcoll/transports/shm/moves.c)."""
        left = self._native.lane.move(sending, buf, rank, context, tag, *call, pulled)
        if left is None:
            return
        outcome, header, moved, extra = left
        if outcome == atomics.MOVE_FINISH:
            (self._finish_send if sending else self._finish_recv)(buf, rank, header, moved)
        elif outcome == atomics.MOVE_ANNOUNCED_SEND:
            self._finish_pulled_send(buf, rank, extra)
        elif outcome == atomics.MOVE_ANNOUNCED_RECV:
            self._finish_announcement(buf, rank, header, extra)
        elif sending:  # MOVE_ENGINE
            super().send(buf, rank, context, tag, call)
        else:
            super().recv(buf, rank, context, tag, call)

    def _finish_send(self, buf: np.ndarray, dest: int, header: bytes, written: int) -> None:
        """The rest of a message of which a C path wrote `written` bytes (header first)."""
        peer = self._peers[dest]
        self.waitall([self._send_rest(peer, header, bytes_of(buf), written)])

    def _finish_recv(self, buf: np.ndarray, source: int, header: bytes, copied: int) -> None:
        """The rest of a receive into buf that a C path began: `copied` payload bytes came,
        or none (-1: no message yet, -2: another message first, Ring.OVERWRITTEN)."""
        peer = self._peers[source]
        if copied == Ring.OVERWRITTEN:
            raise self._overwritten(peer, OverwrittenRing(peer.channel.incoming.capacity))
        if copied < 0:  # nothing yet, or another message first
            context, tag, _, *call = self._header_of(header)
            super().recv(buf, source, context, tag, tuple(call))
            return
        # its first bytes are in
        self.waitall([self._rest_of_message(peer, bytes_of(buf), copied)])

    def _finish_pulled_send(self, buf: np.ndarray, dest: int, pull: int) -> None:
        """The rest of a pulled send whose announcement (`pull`) a C path wrote: its answer."""
        self._await_answer(self._peers[dest], buf, pull)

    def _finish_announcement(self, buf: np.ndarray, source: int, header: bytes,
                             descriptor: bytes) -> None:
        """The rest of a pulled receive into buf (header: its message's) whose announcement
        (descriptor: the bytes of it that came) a C path took."""
        context, tag, _, *call = self._header_of(header)
        self._finish_announced(self._peers[source], bytes_of(buf), context, tag,
                               tuple(call), descriptor, len(descriptor))

    def _overwritten(self, peer: Peer, error: OSError) -> PeerLostError:
        """Lose peer, whose ring a C receive found overwritten; the error to raise."""
        self._lose(peer, str(error))
        return PeerLostError(f"lost the stream from rank {self.names[peer.rank]} "
                             f"({peer.lost})", (peer.rank,))

    def _announcement(self, peer: Peer, buf: np.ndarray, context: int, tag: int,
                      call: tuple[int, int]) -> tuple[bytes, int]:
        return atomics.pull_announcement(self.words, peer.rank, bytes_of(buf), context, tag,
                                         *call)

    def _answer(self, pull: int, refused: bool) -> bytes:
        return atomics.pull_answer(pull, refused)

    def _pull(self, peer: Peer, descriptor: bytes, view: memoryview) -> bool:
        pid = self._native.pid_of(peer.rank)
        if pid <= 0:  # not published yet (it always is by then): through the ring instead
            return False
        error = atomics.pull_payload(pid, descriptor, view)
        if error == errno.ESRCH:
            self._lose(peer, f"{PEER_ENDED}: pid {pid} is gone")
        return error == 0

    def _ready(self, timeout: float) -> Iterable[tuple[Peer, bool, bool]]:
        started = time.monotonic()
        next_check = started + WAIT_SLICE
        polls, nap = 0, 0.0
        while True:
            ready = []
            for peer in self._peers.values():
                if peer.lost:
                    continue
                readable = peer.channel.incoming.readable()
                writable = peer in self._writing and peer.channel.outgoing.writable()
                if readable or writable:
                    ready.append((peer, readable, writable))
            if ready:
                return ready
            polls += 1
            if polls < _SPINS:
                continue
            if timeout <= 0:  # a look, not a wait (StreamTransport.test)
                return []
            now = time.monotonic()
            if now >= next_check:  # a ring never says that its writer died: ask the OS
                self._native.raise_if_revoked()
                self._lose_dead_peers()
                next_check = now + WAIT_SLICE
                if now - started >= timeout:
                    return []
            if now - started < _YIELD_FOR:
                os.sched_yield()
            else:
                nap = min(_LONGEST_NAP, nap * 2 or 1e-5)
                time.sleep(nap)

    def _lose_dead_peers(self) -> None:
        for peer in self._peers.values():
            pid = self._native.pid_of(peer.rank)
            if not peer.lost and gone(pid):
                self._lose(peer, f"{PEER_ENDED}: pid {pid} is gone")


class _Names:
    """The shared-memory names of one world's communicators: the job's prefix (which tbrun
    cleans up after), then a random part that the creator picks and tells the others (see
    Segment.create_unique); and the split contexts agreed by Group.split's protocol."""

    def __init__(self, prefix: str) -> None:
        self.prefix, self.next_context = prefix, 1


class ShmGroup:
    """A communicator's view of the shm transport."""

    tuning = "shm"

    def __init__(self, segment: Segment, rank: int, members: list[int], names: _Names,
                 timeout: float) -> None:
        self.members, self._names, self._timeout = members, names, timeout
        self.native = ShmNative(segment, rank, len(members), timeout, names.prefix)
        self.allocate = self.native.allocate
        self.revocation = self.native.revocation()
        self.native.publish_pid()  # before any round or message (see ShmNative.pid_of)
        self._stream = ShmStream(self.native, timeout)
        self._stream.names = self.native.names = members  # messages name world ranks
        ranks = list(range(len(members)))
        self.p2p = StreamEndpoint(self._stream, 0, ranks)
        if len(members) > 1:
            self._stream.lend_lane(self.native.lane, self.p2p)
        self.coll = StreamEndpoint(self._stream, 1, ranks)
        self.rank, self.size = rank, len(members)
        # the algorithms' messages carry the call; the native rounds compare their own
        # signatures in the flag lines
        self.begin_call = self.coll.begin_call

    def end_call(self) -> None:
        pass

    def endpoint(self, context: int) -> StreamEndpoint:
        """Point-to-point among this group's ranks in a context of its own (2 and up; 0 and 1
        are p2p's and coll's), whose messages a group built over this one
        (tbcoll.hierarchy) keeps apart from this group's own calls."""
        return StreamEndpoint(self._stream, context, list(range(self.size)))

    def revoke(self, notice: str) -> None:
        self.native.post_notice(notice)  # every rank's waits look at it

    def context_hint(self) -> int:
        return self._names.next_context

    def split(self, color: int | None, key: int, members: list[int],
              context: int) -> ShmGroup | None:
        self._names.next_context = context + 1
        if color is None:
            return None
        world = [self.members[m] for m in members]
        size = Layout(len(members)).total
        segment = _share_segment(self.coll, self.rank, members, self._names.prefix, size)
        return ShmGroup(segment, members.index(self.rank), world, self._names, self._timeout)

    def describe_links(self) -> list[str]:
        return []  # every pair shares this host's memory

    def close(self) -> None:
        self._stream.close()
        self.revocation[0].release()  # (the segment cannot unmap while it is lent)
        self.native.close()


def _share_segment(p2p: P2P, rank: int, members: list[int], prefix: str, size: int) -> Segment:
    """members[0] creates the segment and sends its name; each other member maps it and says
    so; then the name is unlinked. Messages go over the parent communicator's p2p (ranks are
    its ranks)."""
    name = np.zeros(MAX_NAME, np.uint8)
    done = np.empty(0, np.uint8)
    others = members[1:]
    if rank != members[0]:
        p2p.waitall([p2p.irecv(name, members[0], _SETUP_TAG)])
        segment = Segment.attach(name.tobytes().rstrip(b"\0").decode(), size)
        p2p.waitall([p2p.isend(done, members[0], _SETUP_TAG)])
        return segment
    segment = Segment.create_unique(prefix, size)
    settle(segment.buffer)
    try:
        name[:len(segment.name)] = np.frombuffer(segment.name.encode(), np.uint8)
        p2p.waitall([p2p.isend(name, r, _SETUP_TAG) for r in others])
        p2p.waitall([p2p.irecv(done, r, _SETUP_TAG) for r in others])
    finally:
        segment.unlink()
    return segment


def open_world(info: LaunchInfo | None, prefix: str) -> tuple[ShmGroup, int, int]:
    """Map the world's segment; the store tells the others when it exists and rank 0 when
    they have mapped it."""
    if info is not None and not single_host(info):
        hosts = len(info.topology.hosts)
        raise CommError(f"the shm backend needs every rank on one host, but this job spans "
                        f"{hosts} hosts: use --backend tcp")
    members = list(range(info.size)) if info else [0]
    return open_host(info, prefix, members), *placement(info)


def open_host(info: LaunchInfo | None, prefix: str, members: list[int]) -> ShmGroup:
    """The Group of the world ranks `members`, every one on this host (members[0] makes the
    segment): a job's world, or one host's part of a job over several hosts."""
    available()  # before any rank makes a segment: the C module was built
    names = _Names(segment_prefix(info.job) if info and info.job else f"/tbc-p{os.getpid()}-")
    rank = members.index(info.rank if info else 0)
    nbytes = Layout(len(members)).total
    if len(members) == 1:
        segment = Segment.create_unique(names.prefix, nbytes)
        settle(segment.buffer)
        segment.unlink()
    else:
        with Store.from_launch(info) as store:
            if rank == 0:
                segment = Segment.create_unique(names.prefix, nbytes)
                settle(segment.buffer)
                try:
                    store.set(f"{prefix}/created", segment.name)
                    store.wait([f"{prefix}/mapped/{r}" for r in members[1:]])
                finally:
                    segment.unlink()
            else:
                name = store.get(f"{prefix}/created").decode()
                segment = Segment.attach(name, nbytes)
                store.set(f"{prefix}/mapped/{members[rank]}", b"")
    return ShmGroup(segment, rank, members, names, comm_timeout(info))
