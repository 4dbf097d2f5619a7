"""comm.empty's buffers on shm: each rank's buffer of an allocation is a shared-memory segment
of its own that every other rank of the communicator maps, so that a collective can copy
straight from (or to) a peer's buffer, once, with plain loads and stores
(tbcoll.transports.shm.native, _one_copy_round): what Linux's cross-memory attach gives, on any OS,
macOS included.

An allocation is collective: each rank creates its segment (Segment.create_unique, the job's
prefix, 0600), the ranks exchange the names in a round, map the others', agree that everyone
has, and unlink their own name: no name outlives the call, and no descriptor is kept (macOS
allows 256 open files). A rank's buffer is the array returned; its mappings of the peers'
buffers of that allocation are dropped when that array (and every view of it) is collected,
or when the communicator closes; the pages go when the last rank unmaps them.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import numpy as np

from tbcoll.core.errors import TbcollError
from tbcoll.transports.shm.segment import MAX_NAME, Segment

# (allocation, offset) of a buffer in none of them: tbcoll/transports/shm/shm.h's too
# (one_copy.c's), checked at import by tbcoll.transports.shm.native
NOT_IN_HEAP = (-1, 0)
_NAME = MAX_NAME + 1  # bytes per rank in the exchange of names (an empty one: creation failed)


class Heap:
    """One communicator's allocations: this rank's buffers (where they are) and its mappings of
    the peers' buffers, by allocation number (1, 2, ... in the order of the collective calls:
    the same number on every rank)."""

    def __init__(self, rank: int, size: int, prefix: str) -> None:
        self.rank, self.size, self._prefix = rank, size, prefix
        self.used = False  # an allocation was made once (the same on every rank)
        self._count = 0
        self._mine: dict[int, tuple[int, int]] = {}  # number -> (address, bytes) of this rank's
        self._peers: dict[int, list[np.ndarray | None]] = {}  # number -> each rank's buffer

    def allocate(self, nbytes: int, exchange: Callable[[np.ndarray, np.ndarray], None],
                 everyone: Callable[[bool], bool]) -> np.ndarray:
        """This rank's buffer of a new allocation of nbytes per rank (a 1-D uint8 array).
        Collective: exchange(mine, all) gathers every rank's bytes, everyone(ok) is True where
        every rank's ok is."""
        self._count += 1
        self.used = True
        name, error, segment = np.zeros(_NAME, np.uint8), None, None
        try:
            segment = Segment.create_unique(self._prefix, nbytes)
            name[:len(segment.name)] = np.frombuffer(segment.name.encode(), np.uint8)
        except OSError as e:
            error = e
        try:
            names = np.empty((self.size, _NAME), np.uint8)
            exchange(name, names.reshape(-1))
            failed = [r for r in range(self.size) if not names[r, 0]]
            peers: list[np.ndarray | None] = [None] * self.size
            if not failed:
                try:
                    for r in range(self.size):
                        if r != self.rank:
                            peers[r] = _mapped(Segment.attach(_text(names[r]), nbytes))
                except OSError as e:
                    error = e
            if not everyone(error is None) or failed:
                raise TbcollError(
                    f"comm.empty could not share a {nbytes}-byte buffer per rank: "
                    + (f"{error}" if error else "another rank failed")
                    + (f" (ranks that could not make theirs: {failed})" if failed else ""))
        finally:
            if segment is not None:
                segment.unlink()  # everyone has mapped it, or given up
        mine = _mapped(segment)
        number = self._count
        self._mine[number] = (mine.ctypes.data, nbytes)
        self._peers[number] = peers
        weakref.finalize(mine, self._free, number)
        return mine

    def locate(self, array: np.ndarray) -> tuple[int, int]:
        """(allocation, offset) of a contiguous array lying within one of this rank's
        buffers, else NOT_IN_HEAP."""
        if not self._mine:  # (the common case, at no cost: numpy's ctypes.data takes ~1 us)
            return NOT_IN_HEAP
        start = array.ctypes.data
        # (a copy: a collection in this loop, or on another thread, may free an allocation)
        for number, (address, nbytes) in tuple(self._mine.items()):
            if address <= start and start + array.nbytes <= address + nbytes:
                return number, start - address
        return NOT_IN_HEAP

    def peer(self, number: int, rank: int) -> np.ndarray:
        """Rank's buffer of allocation number, as this rank maps it."""
        return self._peers[number][rank]

    def _free(self, number: int) -> None:
        """This rank's buffer was collected: drop the mappings of the others' (their arrays
        hold the only references)."""
        self._mine.pop(number, None)
        self._peers.pop(number, None)

    def close(self) -> None:
        """Drop every mapping of the peers' buffers; this rank's stay while its arrays do."""
        self._mine.clear()
        self._peers.clear()


def _mapped(segment: Segment) -> np.ndarray:
    """The segment's bytes as an array whose base is the mapping (so that every view of it
    keeps it, and through it the mapping, alive); the segment's descriptor is closed already,
    and the mapping goes with the last view."""
    return np.ndarray(segment.size, np.uint8, buffer=segment.buffer)


def _text(name: np.ndarray) -> str:
    return name.tobytes().rstrip(b"\0").decode()
