"""The shm transport's native collectives: one segment per communicator, flags and slots, and
every round in one C call (tbcoll/transports/shm/rounds.c, run_round: the protocol is written there
once; this module drives it and checks at import that both sides agree on the layout). The same
C object, the lane, also runs an array's whole call, of any size (the Communicator's checks,
its call gate and flight recorder, the rounds) where the Communicator binds it
(tbcoll.comm.routes); past a slot, once comm.empty has made buffers, the paths here take the
calls instead, and copy those buffers once (_limit_gather says so to the lane: takes()).

    segment = header (pids) | one flag line per rank | one notice line per rank | 2 data
              sets | pipes
    data set = p slots of SLOT bytes (one per rank) + a result area of SLOT bytes
    pipes = one byte ring per ordered pair of ranks, for point-to-point (tbcoll.transports.shm.pipe)

Every collective is a series of rounds numbered 1, 2, 3, ... on every rank alike; round s
uses data set s % 2. Rank r stores its ARRIVE flag = s (release) once it has finished every
earlier round and put its data for round s in place; a rank that needs the others' data
waits (acquire) until their flags reach s. Before writing into a set, a rank waits until
every flag has reached s - 1: everyone has then finished round s - 2, the last user of that
set. Each call's first round carries its tbcoll.core.calls signature in every rank's flag line,
compared after the wait and before anyone's data is used: ranks whose calls differ raise a
CommError on every rank. A message larger than a slot takes one round per slot-sized chunk.

all_reduce of up to SINGLE_PASS_BYTES: one round; every rank reduces all p slots itself, in
rank order, so every rank gets the same bits. Larger, each chunk splits: rank r reduces its
1/p of the chunk into the result area, flags DONE, and everyone copies the result out. Past a
slot, where every rank's x and out lie in comm.empty's buffers, rank r reduces its 1/p
straight from the peers' x into its out and copies the other parts from the peers' outs.

all_gather of blocks past GATHER_ONE_COPY_BYTES (a slot where ranks share cores) and broadcast
of more than a slot move each block with one copy instead of two where they can: the ranks
exchange where their buffers are in a round, each copies the blocks it needs straight from
(or to) the owner's buffer, and a last round tells every rank that every copy is done and
succeeded. Where every rank's buffer lies in the same allocation of comm.empty
(tbcoll.transports.shm.heap), every rank maps the others' and copies with plain loads and stores, on
any OS. Else, on Linux, the copies are the kernel's (cross-memory attach, one_copy.c's
attached_copies; the lane makes such a call's rounds in C too); where a policy forbids such
copies (Yama's ptrace_scope 1 or more between sibling processes, a seccomp filter) the ranks
see it in that last round, take the slot rounds from then on, and say nothing: it is only
slower. TBCOLL_SHM_CMA=0 turns it off.
The copy schedule (who copies which bytes from or to whom, in which order) is written once,
in C (one_copy.c's copy_plan): the kernel's copies follow it there, and the copies through
the mappings here call it (_plan). The rounds around the copies are C's too (copy_once).
There is no pure-Python path: the shm backend needs its C extension (available()).

When a round's wait runs out of its slice (a slow or gone peer), the C call calls back into
this module (_resume), which waits in Python, noticing dead ranks, revocation and the
deadline, and then the round goes on.

A rank whose call was interrupted revokes the communicator (tbcoll.CommRevokedError) by
writing its notice line (post_notice); every wait here and in the stream engine's
(tbcoll.transports.shm.transport) looks at the notice lines once a slice, and raises.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from functools import partial

import numpy as np

from tbcoll.core.callbacks import checked
from tbcoll.core.calls import mismatch, signature
from tbcoll.core.dtypes import DTYPE_CODES, OP_CODES, reducer
from tbcoll.core.errors import (
    PEER_ENDED,
    CommError,
    CommRevokedError,
    PeerLostError,
    PeerTimeoutError,
    TbcollError,
    revoked,
)
from tbcoll.core.gate import LaneCall, lane_call
from tbcoll.core.wire_check import check_constants
from tbcoll.job.env import shm_cma
from tbcoll.transports.shm.flags import AtomicFlags, atomics
from tbcoll.transports.shm.heap import NOT_IN_HEAP, Heap
from tbcoll.transports.shm.pipe import LINE, Ring
from tbcoll.transports.shm.segment import Segment

SLOT = 1 << 20
# all_gather's blocks larger than this go in one copy where every rank has a core: np=2, 256 KiB
# blocks took 37-43 us against 44-50 through the slots, 512 KiB 91-103 against 106-115, while
# 128 KiB tied (24-25 us); the slots' round writes each block into the segment, and its readers
# then fetch lines that another core has just made dirty. With more ranks than cores, only past
# a slot: np=4 on 2 cores, 256 KiB-1 MiB blocks took 1.2-1.8x longer in one copy.
GATHER_ONE_COPY_BYTES = 128 << 10
RING = 128 << 10  # bytes of each point-to-point ring
SINGLE_PASS_BYTES = 64 << 10  # measured: single pass wins at 64 KiB for np=4, split at 256 KiB
# seconds between looks for dead peers and the deadline: a death is seen in ~2 (48 ms at 20,
# 107 at 50: benchmarks/survival.py); a healthy call never waits that long
WAIT_SLICE = 0.02
_ARRIVE, _DONE, _SIGNATURE = 0, 8, 16  # byte offsets inside a rank's flag line
_BYTES = DTYPE_CODES[np.dtype(np.uint8)]  # what a round that only copies calls its data
_NO_BYTES = np.empty(0, np.uint8)
_INT64, _MIN = DTYPE_CODES[np.dtype(np.int64)], OP_CODES["min"]


def _check_layout() -> None:
    """The layout of tbcoll/transports/shm/shm.h is this package's (a build of another version of
    the C files would read other words of the segment, or take a refusal for a count of bytes)."""
    if atomics is not None:
        check_constants(atomics, {
            "LINE": LINE, "ARRIVE_OFFSET": _ARRIVE, "DONE_OFFSET": _DONE,
            "SIGNATURE_OFFSET": _SIGNATURE, "RING_CONTROL": Ring.CONTROL,
            "RING_TAIL_OFFSET": LINE, "RING_OVERWRITTEN": Ring.OVERWRITTEN,
            "NOT_IN_HEAP": NOT_IN_HEAP}, "tbcoll.transports.shm (native.py, pipe.py, heap.py)")


_check_layout()

# The one-call paths' signatures less the byte count, per dtype (and op) code, as the lane
# (tbcoll/transports/shm/lane.c) takes them: computing one in full on each call cost ~0.7 us of a 3
# us 8 B all_reduce.
_ALL_REDUCE = [signature("all_reduce", dtype, op, 0) for dtype in DTYPE_CODES for op in OP_CODES]
_ALL_GATHER = [signature("all_gather", dtype, None, 0) for dtype in DTYPE_CODES]
_REDUCE_SCATTER = [signature("reduce_scatter", dtype, op, 0) for dtype in DTYPE_CODES
                   for op in OP_CODES]
_DTYPES = tuple(DTYPE_CODES)


def _broadcast_call(dtype: int, root: int) -> int:
    return signature("broadcast", _DTYPES[dtype], None, 0, root)


def _bytes(array: np.ndarray) -> np.ndarray:
    """A C-contiguous array's bytes, as a 1-D uint8 view, for the lane's rounds and the
    one-copy paths. (The C module takes arrays of any dtype as they are: it asks for no
    buffer format, which bfloat16 lacks.)"""
    return array.reshape(-1).view(np.uint8)


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


SETTINGS = 0  # the segment's first line: what its creator decided for every rank (settle)


class Layout:
    def __init__(self, size: int) -> None:
        self.pids = LINE
        self.flags = self.pids + _round_up(8 * size, LINE)
        self.notices = self.flags + size * LINE  # (ShmNative.post_notice)
        self.revoked = self.notices + size * LINE  # a word: any rank's notice is posted
        self.data = _round_up(self.revoked + LINE, 4096)
        self.set_bytes = (size + 1) * SLOT
        self.pipes = self.data + 2 * self.set_bytes
        self.pipe_bytes = Ring.CONTROL + RING
        self.total = self.pipes + size * size * self.pipe_bytes

    def pipe(self, source: int, dest: int, size: int) -> int:
        """Where the ring from rank source to rank dest starts."""
        return self.pipes + (source * size + dest) * self.pipe_bytes


def built() -> bool:
    """Whether the shm backend can run here: its C extension, and the C gate it drives."""
    return atomics is not None and LaneCall is not None


def available() -> None:
    """Raise, saying what to do, where the C module was not built."""
    if atomics is None:
        raise TbcollError("the shm backend needs tbcoll's C extension "
                          "(tbcoll.transports.shm._atomics), "
                          "which was not built: install a C compiler (xcode-select --install; "
                          "apt-get install gcc) and reinstall tbcoll, or use --backend tcp")
    if LaneCall is None:  # what runs its lane's calls (tbcoll/core/one_call.c)
        raise TbcollError("the shm backend needs tbcoll's call gate extension "
                          "(tbcoll.core._gate), which was not built: reinstall tbcoll (make), "
                          "or use --backend tcp")


class Mapped:
    """The peers' buffers of a _one_copy_round as this rank maps them (comm.empty's)."""

    def __init__(self, heap: Heap, table: np.ndarray, mapped: list[bool]) -> None:
        self._heap, self._table = heap, table  # per rank, per buffer: address, allocation, offset
        self.mapped = mapped  # per buffer: whether it is in one allocation on every rank

    def view(self, rank: int, buffer: int, offset: int, nbytes: int) -> np.ndarray:
        """nbytes of rank's buffer from offset."""
        allocation, start = self._table[rank, buffer, 1:]
        start += offset
        return self._heap.peer(int(allocation), rank)[start:start + nbytes]

    def copy(self, rank: int, part: np.ndarray, offset: int, write: bool, buffer: int = 0
             ) -> None:
        """From rank's buffer at offset into part, or with write from part to there."""
        theirs = self.view(rank, buffer, offset, part.nbytes)
        if write:
            np.copyto(theirs, part)
        else:
            np.copyto(part, theirs)


class ShmNative:
    """Native collectives over one mapped segment; every rank of the group calls each."""

    offers = frozenset(("all_reduce", "all_gather", "reduce_scatter", "broadcast", "barrier"))
    takes_mlx = False

    def __init__(self, segment: Segment, rank: int, size: int, timeout: float,
                 prefix: str) -> None:
        available()
        if size > atomics.MAX_RANKS:
            raise TbcollError(f"the shm backend runs at most {atomics.MAX_RANKS} ranks on a "
                              f"host; got {size}")
        self.segment, self.rank, self.size, self._timeout = segment, rank, size, timeout
        self.names: list[int] | range = range(size)  # each rank's name in messages (ShmGroup)
        self.layout = Layout(size)
        buffer = segment.buffer
        self.flags = AtomicFlags(buffer)
        self._lines = np.frombuffer(buffer, np.uint64, size * LINE // 8,
                                    self.layout.flags).reshape(size, LINE // 8)
        sets = [self.layout.data + k * self.layout.set_bytes for k in (0, 1)]
        # the rounds, and the one-call paths (direct_*; Communicator's calls, once bound)
        self.lane = atomics.Lane(segment=buffer, flags=self.layout.flags, size=size, rank=rank,
                                 sets=sets, slot_bytes=SLOT, budget=WAIT_SLICE,
                                 resume=checked("resume", self._resume), pids=self.layout.pids)
        self.lane.calls(single_pass=SINGLE_PASS_BYTES, all_reduce=_ALL_REDUCE,
                        all_gather=_ALL_GATHER, reduce_scatter=_REDUCE_SCATTER,
                        broadcast_call=checked("broadcast_call", _broadcast_call))
        self._round = self.lane.round
        direct = lane_call(self.lane).direct  # (unbound: the caller holds the communicator)
        self.direct_all_reduce = partial(direct, atomics.ALL_REDUCE)
        self.direct_all_gather = partial(direct, atomics.ALL_GATHER)
        self.direct_broadcast = partial(direct, atomics.BROADCAST)
        self.direct_reduce_scatter = partial(direct, atomics.REDUCE_SCATTER)
        # blocks past a slot are read from their owners' memory (see the module docstring),
        # as the segment's creator decided for every rank (settle)
        cma, host_cores = (int(word) for word in np.frombuffer(buffer, np.int64, 2, SETTINGS))
        self._cma = bool(cma)
        self.heap = Heap(rank, size, prefix)  # comm.empty's buffers
        self._gather_one_copy = GATHER_ONE_COPY_BYTES if size <= host_cores else SLOT
        self._limit_gather()
        # A wait spins ~1 us (a small message's turnaround) before it yields its core, and
        # with more ranks than cores next to nothing: the peer it waits for may need the core
        # (8 B all_reduce at np=4 on 2 cores: 35 us with 5 us of spin, 21 with 0.5, 9.6
        # with 0.05).
        atomics.set_spin(1e-6 if size <= host_cores else 0.0)

    # --- the collectives -----------------------------------------------------------------

    def all_reduce(self, send: np.ndarray | None, recv: np.ndarray, op: str) -> None:
        """send None: in place on recv. Past SINGLE_PASS_BYTES, split rounds of a slot each;
        past a slot, straight between the ranks' buffers where they are comm.empty's (below,
        its three rounds and numpy's calls cost more than the copy saved: 128 KiB took 44 us
        that way against 26 through the slots, 512 KiB 76 against 90)."""
        src, dst = _bytes(recv if send is None else send), _bytes(recv)
        call = signature("all_reduce", recv.dtype, op, recv.nbytes)
        if recv.nbytes > SLOT and self._one_copy_round(
                atomics.ALL_REDUCE, src, dst, call,
                partial(self._reduce_parts, src, dst, recv.dtype, op, send is None)):
            return
        self.lane.rounds(atomics.ALL_REDUCE, src, dst, DTYPE_CODES[recv.dtype], OP_CODES[op], 0,
                         call)

    def all_gather(self, send: np.ndarray, recv: np.ndarray) -> None:
        """Rank k's block is slot k; each chunk of the blocks goes in place in recv. Past
        GATHER_ONE_COPY_BYTES (a slot with more ranks than cores), each block is copied once:
        from its owner's x, or (where the results are comm.empty's and the x are not) from its
        owner's result, into which the owner copies its own block before the first round."""
        src, dst, block = _bytes(send), _bytes(recv), send.nbytes
        call = signature("all_gather", send.dtype, None, send.nbytes)
        if block > self._gather_one_copy:
            own = dst[self.rank * block:(self.rank + 1) * block]
            if self.heap.locate(dst) != NOT_IN_HEAP:  # the others may read it from there
                np.copyto(own, src)
                src = own  # (no second copy below; the others read it from dst, or src)
            if self._one_copy_round(atomics.ALL_GATHER, src, dst, call,
                                    partial(self._gather, src, dst), mapped_if=any):
                return
        self.lane.rounds(atomics.ALL_GATHER, src, dst, _BYTES, 0, 0, call)

    def _gather(self, src: np.ndarray, dst: np.ndarray, peers: Mapped) -> None:
        """all_gather's copies between comm.empty buffers, by copy_plan: every other rank's
        block from its x (buffer 0) where the x are mapped, else from its result (buffer 1),
        where it is in place."""
        results = peers.mapped[1] and not peers.mapped[0]
        for peer, buffer, theirs, mine, nbytes, _ in self._plan(atomics.ALL_GATHER, src.nbytes,
                                                                from_results=results):
            part = dst[mine:mine + nbytes]
            if peer != self.rank:
                peers.copy(peer, part, theirs, False, buffer)
            elif not np.may_share_memory(part, src):  # (src is mine, or apart from dst)
                np.copyto(part, src)

    def _plan(self, kind: int, nbytes: int, item: int = 1, root: int = -1,
              from_results: bool = False) -> tuple[tuple[int, int, int, int, int, bool], ...]:
        """The copies this rank makes in a one-copy call, in order: (peer, buffer, offset in
        theirs, offset in mine, bytes, write). One schedule for these mapped copies and the
        kernel's (one_copy.c's copy_plan, which both call)."""
        return atomics.copy_plan(kind, self.rank, self.size, root, nbytes, item, from_results)

    def reduce_scatter(self, send: np.ndarray, recv: np.ndarray, op: str) -> None:
        """Each round carries a piece of every rank's block: slot k holds rank k's pieces."""
        self.lane.rounds(atomics.REDUCE_SCATTER, _bytes(send), _bytes(recv),
                         DTYPE_CODES[send.dtype], OP_CODES[op], 0,
                         signature("reduce_scatter", send.dtype, op, send.nbytes))

    def broadcast(self, buf: np.ndarray, root: int) -> None:
        data = _bytes(buf)
        call = signature("broadcast", buf.dtype, None, buf.nbytes, root)
        if buf.nbytes > SLOT and self._one_copy_round(
                atomics.BROADCAST, data, data, call, partial(self._spread, data, root),
                root=root):
            return
        self.lane.rounds(atomics.BROADCAST, data, data, _BYTES, 0, root, call)

    def barrier(self) -> None:
        self._round(atomics.BARRIER, _NO_BYTES, 0, _NO_BYTES, 0, _BYTES, 0, 0,
                    signature("barrier"))

    def _spread(self, data: np.ndarray, root: int, peers: Mapped) -> None:
        """broadcast's copies between comm.empty buffers, by copy_plan: the root writes the
        first 1/p of every other rank's buffer while each of them reads the rest from the
        root's."""
        for peer, _, theirs, mine, nbytes, write in self._plan(atomics.BROADCAST, data.nbytes,
                                                               root=root):
            peers.copy(peer, data[mine:mine + nbytes], theirs, write)

    def _reduce_parts(self, src: np.ndarray, dst: np.ndarray, dtype: np.dtype, op: str,
                      in_place: bool, peers: Mapped) -> None:
        """all_reduce's copies between comm.empty buffers, by copy_plan: this rank reduces its
        part of every rank's x, in rank order (so every rank gets the same bits), straight
        from their buffers into its out; after a round (every part done), it copies the other
        parts from their owners' outs: one copy fewer than the slots' rounds."""
        rank, size = self.rank, self.size
        plan = self._plan(atomics.ALL_REDUCE, dst.nbytes, dtype.itemsize)
        lo, nbytes = next((mine, nbytes) for peer, _, _, mine, nbytes, _ in plan
                          if peer == rank)
        hi = lo + nbytes
        parts = [(src[lo:hi] if k == rank else peers.view(k, 0, lo, nbytes)).view(dtype)
                 for k in range(size)]
        if in_place and rank >= 2:  # out's part is x's, which the first step would overwrite
            parts[rank] = parts[rank].copy()
        ours, ufunc = dst[lo:hi].view(dtype), reducer(op)
        ufunc(parts[0], parts[1], out=ours)
        for part in parts[2:]:
            ufunc(ours, part, out=ours)
        self._everyone(True)  # every part is reduced
        for peer, buffer, theirs, mine, nbytes, _ in plan:
            if peer != rank:
                peers.copy(peer, dst[mine:mine + nbytes], theirs, False, buffer)

    def allocate(self, nbytes: int) -> np.ndarray:
        """This rank's buffer of a new comm.empty allocation (tbcoll.transports.shm.heap);
        collective."""
        def exchange(mine: np.ndarray, everyone: np.ndarray) -> None:
            self._round(atomics.ALL_GATHER, mine, 0, everyone, mine.nbytes, _BYTES, 0, 0,
                        signature("all_gather", np.uint8, None, mine.nbytes))

        buffer = self.heap.allocate(nbytes, exchange, self._everyone)
        self._limit_gather()
        return buffer

    def _limit_gather(self) -> None:
        """all_gather's one-call path ends where its one copy can start (all_gather); past
        that, and past a slot for broadcast, the lane makes the copies itself where they are
        cross-memory copies (one_copy.c's one_copy)."""
        self.lane.limit(atomics.ALL_GATHER,
                        self._gather_one_copy if self._cma or self.heap.used else SLOT)
        self.lane.attach(self._cma and not self.heap.used, (_INT64, _MIN), self._cma_refused)
        # past one round the lane's rounds take every size, but where comm.empty's buffers
        # may be copied once (the Python paths above): there the bound calls stop where those
        # start, and the Communicator's routes, bound again, send larger calls here
        used = self.heap.used
        self.lane.takes(atomics.ALL_REDUCE, SLOT if used else -1)
        self.lane.takes(atomics.ALL_GATHER, self._gather_one_copy if used else -1)
        self.lane.takes(atomics.BROADCAST, SLOT if used else -1)

    def _cma_refused(self) -> None:
        """A cross-memory copy was refused on some rank: the segment's rounds from now on."""
        self._cma = False
        self._limit_gather()

    def _everyone(self, ok: bool) -> bool:
        """A round that tells every rank whether every rank's ok is true."""
        everyone_ok = np.array([1 if ok else 0], np.int64)
        self._round(atomics.ALL_REDUCE, everyone_ok, 0, everyone_ok, 0, _INT64, _MIN, 0, 0)
        return bool(everyone_ok[0])

    def _one_copy_round(self, kind: int, src: np.ndarray, dst: np.ndarray, call: int,
                        copies: Callable[[Mapped], object], root: int = -1,
                        mapped_if: Callable[[list[bool]], bool] = all) -> bool:
        """One copy per block (the lane's copy_once: its rounds are written once, in
        tbcoll/transports/shm/one_copy.c): the ranks gather where each one's buffers are (src and
        dst; broadcast's dst alone, in place) in a round that compares their calls; this rank's
        parts move, then a last round tells every rank whether every copy succeeded. The
        copies are loads and stores through this rank's mappings of the peers' buffers
        (copies(Mapped), with peers.copy and peers.view) where mapped_if(for each buffer,
        whether it lies in the same comm.empty allocation on every rank), else the kernel's
        cross-memory attach (Linux; all_gather and broadcast). False where neither applies
        (no round past the first), or where a cross-memory copy failed (then and from then
        on, CMA is off on this communicator: the caller's slot rounds then overwrite what was
        copied). No round at all where neither can ever apply (no CMA, no allocation yet): the
        same on every rank.

        Why the bytes are whole where they land, on ARM64 as on x86-64: bytes read were
        stored by their owner before its release store of ARRIVE in the first round (or in a
        round the copies make, as all_reduce's once its parts are reduced), which this rank's
        wait acquired before reading (the plain loads of numpy, or process_vm_readv, come
        after it in program order, and an acquire orders every later load and store); bytes
        written are stored before this rank's release store of ARRIVE in the last round (a
        release orders every earlier load and store), which their owner acquires before it
        returns. No rank changes its buffers, nor returns, before the last round, which it
        leaves only once every rank has arrived there, after its copies."""
        heap, attach = self.heap, self._cma and kind != atomics.ALL_REDUCE
        if not (attach or heap.used):
            return False
        buffers = (dst,) if kind == atomics.BROADCAST else (src, dst)
        where = np.array([(atomics.address(b), *heap.locate(b)) for b in buffers], np.int64)
        table = np.empty((self.size, *where.shape), np.int64)

        def mapped() -> bool:
            """The copies through the mappings, where the buffers are mapped alike."""
            alike = [bool(column[0] >= 0 and (column == column[0]).all())
                     for column in table[:, :, 1].T]
            if not mapped_if(alike):
                return False
            copies(Mapped(heap, table, alike))
            return True

        return self.lane.copy_once(kind, src, dst, root, where, table, call,
                                   mapped if heap.used else None, attach)

    def close(self) -> None:
        self._lines = None
        self.heap.close()
        self.segment.close()

    # --- rounds and flags ----------------------------------------------------------------

    def _resume(self, stage: int, seq: int, signature: int) -> None:
        """Where a wait of round seq ran out of its slice (a slow or gone peer), wait in Python,
        which notices dead ranks and the deadline (the stages of tbcoll/transports/shm/rounds.h: the
        set to be free; the others' data; their parts, DONE); where the ranks' calls differ,
        raise."""
        if stage == atomics.ROUND_CALLS_DIFFER:
            self._agree(seq, signature)
        self._wait_all(_DONE if stage == atomics.ROUND_WAIT_DONE else _ARRIVE,
                       seq - 1 if stage == atomics.ROUND_WAIT_FREE else seq)

    def _agree(self, s: int, call: int) -> None:
        """After the wait of round s: raise if a rank's call differs from this one's."""
        words = self._lines[:, (_SIGNATURE + 8 * (s % 2)) // 8]  # loads after the acquire
        if all(int(word) == call for word in words):
            return
        raise CommError(mismatch({r: int(word) for r, word in enumerate(words)}))

    def _flag(self, rank: int, word: int) -> int:
        return self.layout.flags + rank * LINE + word

    # Each rank's pid, an int64 in the segment's second line. A rank stores its own (release)
    # once, before its first round or message, and never again; the lane's pulls and copies
    # load it relaxed (lane_base.h's pid_of: the round's or ring's acquire that let them pull
    # came after it). The slow waits read it at any time, with acquire: 0 there means "not
    # stored yet", which says nothing of that rank's life (see gone).

    def publish_pid(self) -> None:
        """Store this rank's pid where the others look for it (release)."""
        self.flags.store(self.layout.pids + 8 * self.rank, os.getpid())

    def pid_of(self, rank: int) -> int:
        """rank's pid, or 0 where it has not stored it yet (acquire)."""
        return self.flags.load(self.layout.pids + 8 * rank)

    # Each rank's notice line: its length + 1 (int64, 0: none), then the notice (UTF-8), which
    # names the rank and the call that was interrupted. A rank writes its line once, the text
    # with plain stores and then the length with a release store; a reader loads the length
    # with acquire before it reads the text, so that the text it reads is whole (ARM64 too).

    def post_notice(self, notice: str) -> None:
        """Revoke the communicator on every rank: this rank's notice line."""
        at = self.layout.notices + LINE * self.rank
        if self.flags.load(at):
            return
        text = notice.encode()[:LINE - 9]
        self.segment.buffer[at + 8:at + 8 + len(text)] = text
        self.flags.store(at, len(text) + 1)
        self.flags.store(self.layout.revoked, 1)  # release: after the line (see revocation)

    def revocation(self) -> tuple[memoryview, Callable[[], str]]:
        """The segment's revocation word and the first notice posted (Group.revocation): the
        communicator's gate loads the word at each call; post_notice stores it with release
        after the notice's line, and notice_text reads the line behind an acquire load of its
        length, so the line is whole (ARM64 too)."""
        word = memoryview(self.segment.buffer)[self.layout.revoked:self.layout.revoked + 8]
        return word, self.notice_text

    def notice_text(self) -> str:
        """The first rank's notice posted, or "" (acquire, per line)."""
        for rank in range(self.size):
            at = self.layout.notices + LINE * rank
            if length := self.flags.load(at):
                return bytes(self.segment.buffer[at + 8:at + 7 + length]).decode(errors="replace")
        return ""

    def raise_if_revoked(self) -> None:
        """Raise CommRevokedError where a rank has posted a notice (acquire)."""
        if text := self.notice_text():
            raise CommRevokedError(revoked(text))

    def _wait_all(self, word: int, target: int) -> None:
        offset, ranks = self._flag(0, word), range(self.size)
        deadline = time.monotonic() + self._timeout - WAIT_SLICE
        while not self.flags.wait_all(offset, LINE, self.size, target, WAIT_SLICE):
            self.raise_if_revoked()
            late = [r for r in ranks if self.flags.load(offset + r * LINE) < target]
            for rank in late:
                pid = self.pid_of(rank)
                if gone(pid):
                    raise PeerLostError(f"rank {self.names[rank]} (pid {pid}): {PEER_ENDED}",
                                        (rank,))
            if time.monotonic() > deadline:
                raise PeerTimeoutError(f"timed out after {self._timeout:g} s (TBCOLL_TIMEOUT) "
                                       f"waiting for rank(s) {', '.join(map(str, late))}",
                                       tuple(late))


def settle(buffer: memoryview) -> None:
    """A new segment's settings, decided by its creator for every rank (the segment's first
    line): whether blocks move by cross-memory attach (TBCOLL_SHM_CMA) and how many cores the
    ranks have (CPU affinity). Read by each rank for itself, a rank started with another
    TBCOLL_SHM_CMA or affinity would take another protocol than its peers in the same call.
    Plain stores before the segment's name is sent: the store's or the parent communicator's
    message carrying the name orders them before any other rank maps it."""
    np.frombuffer(buffer, np.int64, 2, SETTINGS)[:] = (
        int(bool(atomics.HAVE_CMA) and shm_cma()), cores())


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


def gone(pid: int) -> bool:
    """Whether the rank that published pid has ended (a zombie counts as ended). A pid of 0
    (or less) is one not published yet: not known gone, and never handed to os.kill, where
    0 would signal this process's own group and a negative number another group."""
    return pid > 0 and not _alive(pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a killed rank stays a zombie until its parent reaps it
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return True
