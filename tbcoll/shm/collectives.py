"""The shm transport's native collectives: one segment per communicator, flags and slots.

    segment = header (pids) | one 128-byte flag line per rank | 2 data sets | pipes
    data set = p slots of SLOT bytes (one per rank) + a result area of SLOT bytes
    pipes = one byte ring per ordered pair of ranks, for point-to-point (tbcoll.shm.pipe)

Every collective is a series of rounds numbered 1, 2, 3, ... on every rank alike; round s
uses data set s % 2. Rank r stores its ARRIVE flag = s (release) once it has finished every
earlier round and put its data for round s in place; a rank that needs the others' data
waits (acquire) until their flags reach s. Before writing into a set, a rank waits until
every flag has reached s - 1: everyone has then finished round s - 2, the last user of that
set. The DONE flag plays the same part for the second phase of a two-phase all_reduce.

Each call's first round also carries a signature of the call (collective, dtype, op, root,
bytes) in every rank's flag line, compared after the wait and before anyone's data is used:
mismatched calls (4 elements against 8, all_reduce against barrier) raise a CommError on
every rank that waited, where they used to return garbage. It costs a store and p loads.

all_reduce of up to SINGLE_PASS_BYTES: one phase; every rank reduces all p slots itself, in
rank order, so every rank gets the same bits (in C: tbcoll.shm.rounds). Larger:
rank r copies in the parts of each chunk the others reduce, reduces its own 1/p (its own part
read from its own buffer) into the result area, flags DONE, and everyone copies it out.
"""

from __future__ import annotations

import os
import time

import numpy as np

from tbcoll.calls import mismatch, signature
from tbcoll.dtypes import OPS
from tbcoll.env import shm_flags
from tbcoll.errors import CommError, PeerLostError, PeerTimeoutError
from tbcoll.shm.flags import AtomicFlags, LockedFlags, atomics, atomics_available
from tbcoll.shm.pipe import LINE, Ring
from tbcoll.shm.segment import Segment

SLOT = 1 << 20
RING = 128 << 10  # bytes of each point-to-point ring
SINGLE_PASS_BYTES = 64 << 10  # measured: single pass wins at 64 KiB for np=4, two phases at 256 KiB
_ARRIVE, _DONE = 0, 8  # byte offsets inside a rank's flag line
_SIGNATURE = 2  # the first of two signature words (8-byte) in a rank's flag line: round s
# uses word _SIGNATURE + s % 2, as the data sets alternate (the C path's SIGNATURE_OFFSET)
WAIT_SLICE = 0.05  # seconds between looks for dead peers and the deadline


_PREFAULT_BYTES = 4 << 20
_PAGE = 4096


def prefault(array: np.ndarray) -> None:
    """Touch every page of a large result before the rounds write it (a write of the value
    each page holds: the contents stay). A rank that takes page faults inside the rounds, a
    megabyte at a time, holds up every rank at each round: a fresh 300 MB result took 1.5-2.7 s
    that way against 0.1-0.2 s touched first, in parallel on every rank (measured here, in a
    VM where first-touch faults are slow)."""
    if array.nbytes >= _PREFAULT_BYTES:
        pages = array.reshape(-1).view(np.uint8)[::_PAGE]
        pages[...] = pages


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


class Layout:
    def __init__(self, size: int) -> None:
        self.pids = LINE
        self.flags = self.pids + _round_up(8 * size, LINE)
        self.data = _round_up(self.flags + size * LINE, 4096)
        self.set_bytes = (size + 1) * SLOT
        self.pipes = self.data + 2 * self.set_bytes
        self.pipe_bytes = Ring.CONTROL + RING
        self.total = self.pipes + size * size * self.pipe_bytes

    def pipe(self, source: int, dest: int, size: int) -> int:
        """Where the ring from rank source to rank dest starts."""
        return self.pipes + (source * size + dest) * self.pipe_bytes


def use_atomics() -> bool:
    """Whether flags are the C module's atomics (else the portable LockedFlags)."""
    return shm_flags() != "python" and atomics_available()


class ShmNative:
    """Native collectives over one mapped segment; every rank of the group calls each.

    Rounds in Python, for any flags; tbcoll.shm.rounds.AtomicShmNative runs them in C."""
    offers = frozenset(("all_reduce", "all_gather", "reduce_scatter", "broadcast", "barrier"))
    takes_mlx = False
    # see AtomicShmNative
    direct_all_reduce = direct_all_gather = direct_broadcast = direct_reduce_scatter = None

    def __init__(self, segment: Segment, rank: int, size: int, timeout: float) -> None:
        self.segment, self.rank, self.size, self._timeout = segment, rank, size, timeout
        self.layout = Layout(size)
        buffer = segment.buffer
        atomic = use_atomics()
        self.flags: AtomicFlags | LockedFlags = (AtomicFlags(buffer) if atomic
                                                 else LockedFlags(buffer, segment.lock_fd))
        if atomic:
            segment.drop_lock()
        self.pids = np.frombuffer(buffer, np.int64, size, self.layout.pids)
        self._lines = np.frombuffer(buffer, np.uint64, size * LINE // 8,
                                    self.layout.flags).reshape(size, LINE // 8)
        self._set_offsets = [self.layout.data + k * self.layout.set_bytes for k in (0, 1)]
        self._raw = [np.frombuffer(buffer, np.uint8, self.layout.set_bytes, offset)
                     for offset in self._set_offsets]
        self._views: dict[tuple[int, np.dtype], tuple[np.ndarray, np.ndarray]] = {}
        self._seq = 0
        if atomic:
            # With more ranks than cores, a waiting rank must give its core away quickly:
            # 50 polls instead of 500 took 8 B all_reduce at np=4 on 2 cores from 35 to 21 us.
            atomics.set_spin(500 if size <= cores() else 50)

    # --- the collectives -----------------------------------------------------------------

    def all_reduce(self, send: np.ndarray | None, recv: np.ndarray, op: str) -> None:
        data = recv if send is None else send
        prefault(recv)
        ufunc = OPS[op]
        single_pass = data.nbytes <= SINGLE_PASS_BYTES
        step = SLOT // data.itemsize
        for lo in range(0, data.size, step):
            hi = min(lo + step, data.size)
            m = hi - lo
            call = signature("all_reduce", data.dtype, op, data.nbytes) if lo == 0 else 0
            s, slots, result = self._begin(data.dtype, call)
            if single_pass:
                slots[self.rank, :m] = data[lo:hi]
                self._arrive(s)
                self._wait_all(_ARRIVE, s)
                self._agree(s, call, range(self.size))
                ufunc.reduce(slots[:, :m], axis=0, out=recv[lo:hi])
                continue
            # Two phases. Rank r reduces slice r of the chunk; its own part of that slice it
            # reads from its own buffer, so only the other slices are copied in.
            a, b = self.rank * m // self.size, (self.rank + 1) * m // self.size
            slots[self.rank, :a] = data[lo:lo + a]
            slots[self.rank, b:m] = data[lo + b:hi]
            self._arrive(s)
            self._wait_all(_ARRIVE, s)
            self._agree(s, call, range(self.size))
            rows = [data[lo + a:lo + b] if k == self.rank else slots[k, a:b]
                    for k in range(self.size)]
            mine = result[a:b]
            ufunc(rows[0], rows[1], out=mine)  # in rank order, as everywhere
            for row in rows[2:]:
                ufunc(mine, row, out=mine)
            self.flags.store(self._flag(self.rank, _DONE), s)
            self._wait_all(_DONE, s)
            recv[lo:hi] = result[:m]

    def all_gather(self, send: np.ndarray, recv: np.ndarray) -> None:
        block = send.size
        gathered = recv.reshape(self.size, block)
        step = SLOT // send.itemsize
        for lo in range(0, block, step):
            hi = min(lo + step, block)
            call = signature("all_gather", send.dtype, None, send.nbytes) if lo == 0 else 0
            s, slots, _ = self._begin(send.dtype, call)
            slots[self.rank, :hi - lo] = send[lo:hi]
            self._arrive(s)
            self._wait_all(_ARRIVE, s)
            self._agree(s, call, range(self.size))
            gathered[:, lo:hi] = slots[:, :hi - lo]

    def reduce_scatter(self, send: np.ndarray, recv: np.ndarray, op: str) -> None:
        """Each round carries a piece of every rank's block: slot k holds rank k's pieces."""
        ufunc = OPS[op]
        block = recv.size
        blocks = send.reshape(self.size, block)
        step = max(1, SLOT // send.itemsize // self.size)
        for lo in range(0, block, step):
            q = min(step, block - lo)
            call = signature("reduce_scatter", send.dtype, op, send.nbytes) if lo == 0 else 0
            s, slots, _ = self._begin(send.dtype, call)
            slots[self.rank, :self.size * q].reshape(self.size, q)[:] = blocks[:, lo:lo + q]
            self._arrive(s)
            self._wait_all(_ARRIVE, s)
            self._agree(s, call, range(self.size))
            mine = slots[:, self.rank * q:(self.rank + 1) * q]
            ufunc.reduce(mine, axis=0, out=recv[lo:lo + q])

    def broadcast(self, buf: np.ndarray, root: int) -> None:
        step = SLOT // buf.itemsize
        for lo in range(0, buf.size, step):
            hi = min(lo + step, buf.size)
            call = signature("broadcast", buf.dtype, None, buf.nbytes, root) if lo == 0 else 0
            s, slots, _ = self._begin(buf.dtype, call)
            if self.rank == root:
                slots[root, :hi - lo] = buf[lo:hi]
            self._arrive(s)
            self._wait_all(_ARRIVE, s)  # every rank: to compare every rank's call
            self._agree(s, call, range(self.size))
            if self.rank != root:
                buf[lo:hi] = slots[root, :hi - lo]

    def barrier(self) -> None:
        call = signature("barrier")
        s, _, _ = self._begin(np.dtype(np.uint8), call)
        self._arrive(s)
        self._wait_all(_ARRIVE, s)
        self._agree(s, call, range(self.size))

    def close(self) -> None:
        self._views.clear()
        self.pids = self._raw = self._lines = None
        self.segment.close()

    # --- rounds and flags ----------------------------------------------------------------

    def _begin(self, dtype: np.dtype, call: int) -> tuple[int, np.ndarray, np.ndarray]:
        """Start the next round: wait until its data set is free and put the call's signature
        (0: not a call's first round) in place; return the round number, the set's slots as
        a (size, n) array of dtype and its result area."""
        self._seq += 1
        s = self._seq
        self._wait_all(_ARRIVE, s - 1)
        # a plain store: _arrive's release (or, with LockedFlags, its unlock) publishes it
        self._lines[self.rank, _SIGNATURE + s % 2] = call
        key = (s % 2, dtype)
        views = self._views.get(key)
        if views is None:
            typed = self._raw[s % 2].view(dtype)
            per_slot = SLOT // dtype.itemsize
            views = (typed[:self.size * per_slot].reshape(self.size, per_slot),
                     typed[self.size * per_slot:])
            self._views[key] = views
        return s, *views

    def _agree(self, s: int, call: int, ranks) -> None:
        """After the wait of round s: raise if a rank's call differs from this one's."""
        if not call:
            return
        words = self._lines[:, _SIGNATURE + s % 2]  # loads after the wait's acquire
        if all(int(words[r]) == call for r in ranks):
            return
        raise CommError(mismatch({r: int(words[r]) for r in {*ranks, self.rank}}))

    def _flag(self, rank: int, word: int) -> int:
        return self.layout.flags + rank * LINE + word

    def _arrive(self, s: int) -> None:
        self.flags.store(self._flag(self.rank, _ARRIVE), s)

    def _wait_all(self, word: int, target: int) -> None:
        self._wait(self._flag(0, word), LINE, self.size, target, range(self.size))

    def _wait(self, offset: int, stride: int, count: int, target: int, ranks) -> None:
        if self.flags.wait_all(offset, stride, count, target, WAIT_SLICE):
            return
        deadline = time.monotonic() + self._timeout - WAIT_SLICE
        while not self.flags.wait_all(offset, stride, count, target, WAIT_SLICE):
            late = [r for i, r in enumerate(ranks)
                    if self.flags.load(offset + i * stride) < target]
            for rank in late:
                pid = int(self.pids[rank])
                if not alive(pid):
                    raise PeerLostError(f"rank {rank} (pid {pid}) died", (rank,))
            if time.monotonic() > deadline:
                raise PeerTimeoutError(f"timed out after {self._timeout:g} s (TBCOLL_TIMEOUT) "
                                       f"waiting for rank(s) {', '.join(map(str, late))}",
                                       tuple(late))


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


def alive(pid: int) -> bool:
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
