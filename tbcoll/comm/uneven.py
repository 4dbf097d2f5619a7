"""Collectives of unequal parts, built over the equal ones so that every transport has them.

all_gather with counts (MPI's Allgatherv): rank j gives counts[j] rows along axis 0, and every
rank gets the rows of all in rank order. Each part is padded to the largest, gathered with the
communicator's own all_gather (whatever route that takes on this transport), and the padding
cut out again: tensor parallelism's uneven vocabulary splits differ by one row at most, so the
padding costs next to nothing.

Each part starts with a header, the counts its rank was given (8 bytes a rank, in elements of
x's dtype), in the same all_gather, equal parts too: ranks whose counts differ may still agree
on the padded size, and then on every signature, and would cut each other's rows wrongly
(silently, even under TBCOLL_CHECK). Every rank compares the headers it gathered and, where
they differ, raises the same ValueError naming each rank's counts. No round is added to the
call (the chat all-gathers its logits this way every token), only the header's bytes and two
copies, x into its part and the rows out of the parts (np=2 on shm, 96 KiB of logits a rank:
~45 us a call against ~12 for a plain all_gather, on a loaded 2-core host). Ranks whose
largest counts differ gather parts of different sizes, which the all_gather's own signature
check refuses on every rank (a CommError naming the sizes; a note gives this rank's counts).
"""

from __future__ import annotations

import math
import threading
from typing import TYPE_CHECKING, Any

import numpy as np

from tbcoll.collectives.base import output
from tbcoll.core.arrays import to_numpy
from tbcoll.core.errors import CommError

if TYPE_CHECKING:
    from tbcoll.comm.communicator import Communicator

_COUNT = np.dtype(np.int64)  # a count in the header


def checked_counts(counts: Any, size: int, rank: int, array: np.ndarray) -> list[int]:
    """counts as a list of ints, one a rank, non-negative, this rank's matching x."""
    found = np.asarray(counts)
    if found.shape != (size,) or found.dtype.kind not in "iu" or (found < 0).any():
        raise ValueError(f"all_gather counts must be {size} non-negative ints (the rows along "
                         f"axis 0 of each rank's x); got {counts!r}")
    if array.ndim == 0 or array.shape[0] != found[rank]:
        raise ValueError(f"all_gather counts say rank {rank} gives {int(found[rank])} rows, "
                         f"but its x has shape {array.shape}")
    return [int(c) for c in found]


def _header_items(size: int, dtype: np.dtype) -> int:
    """Elements of dtype that hold size counts."""
    return -(-size * _COUNT.itemsize // dtype.itemsize)


class Scratch:
    """A communicator's buffers for its parts and the gathered parts, kept from call to call
    (up to KEEP_BYTES): allocating them anew cost 0.25 ms of a 30 us call (np=2, 2 x 96 KiB
    of logits), the allocator giving the pages back and faulting them in again each time.
    Lent to one call at a time (lock): a second thread's call, which the communicator then
    refuses, must not write into the part that the first one's all_gather is sending."""

    KEEP_BYTES = 16 << 20

    def __init__(self) -> None:
        self._kept = np.empty(0, np.uint8)
        self.lock = threading.Lock()

    def arrays(self, part: int, size: int, dtype: np.dtype, kept: bool
               ) -> tuple[np.ndarray, np.ndarray]:
        """Room for this rank's part and the size parts gathered, part elements of dtype
        each; kept: the lock is this call's, and the room is kept where small enough (it is
        never handed to the caller)."""
        nbytes = (size + 1) * part * dtype.itemsize
        room = self._kept if kept and self._kept.nbytes >= nbytes else np.empty(nbytes,
                                                                                np.uint8)
        if kept and nbytes <= self.KEEP_BYTES:
            self._kept = room
        flat = room[:nbytes].view(dtype)
        return flat[:part], flat[part:]


def _part(array: np.ndarray, rows: list[int], head: int, part: np.ndarray) -> np.ndarray:
    """This rank's part, 1-D in x's dtype: the header (its counts, in head elements), then x's
    rows, then padding up to the widest rank's rows (never read)."""
    header = part[:head].view(np.uint8)
    header[len(rows) * _COUNT.itemsize:] = 0
    header[:len(rows) * _COUNT.itemsize] = np.asarray(rows, _COUNT).view(np.uint8)
    part[head:head + array.size] = array.reshape(-1)
    return part


def _headers(table: np.ndarray, size: int) -> np.ndarray:
    """Every rank's counts (size x size), from the gathered parts (one a row)."""
    head = _header_items(size, table.dtype)
    raw = np.ascontiguousarray(table[:, :head]).view(np.uint8)[:, :size * _COUNT.itemsize]
    return np.ascontiguousarray(raw).view(_COUNT)


def disagreement(headers: np.ndarray) -> str:
    """The message for ranks whose counts differ (the same on every rank)."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for rank, counts in enumerate(headers.tolist()):
        groups.setdefault(tuple(counts), []).append(rank)
    said = "; ".join(f"{_ranks(ranks)} passed counts {list(counts)}"
                     for counts, ranks in groups.items())
    return (f"all_gather counts differ between ranks: {said}; every rank must pass the same "
            "counts (the rows of each rank's x, in rank order)")


def _ranks(ranks: list[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return f"ranks {', '.join(map(str, ranks[:-1]))} and {ranks[-1]}"


def all_gather(comm: Communicator, x: Any, counts: Any, algorithm: str | None,
               out: Any, scratch: Scratch) -> Any:
    """Every rank's x, counts[j] rows from rank j, concatenated along axis 0 (scratch: the
    communicator's)."""
    array, restore = to_numpy(x)
    rows = checked_counts(counts, comm.size, comm.rank, array)
    shape = (sum(rows), *array.shape[1:])
    result = output(x, out, shape, array.dtype)
    widest, head, row = max(rows), _header_items(comm.size, array.dtype), math.prod(shape[1:])
    kept = scratch.lock.acquire(blocking=False)
    try:
        part, gathered = scratch.arrays(head + widest * row, comm.size, array.dtype, kept)
        _part(array, rows, head, part)
        try:
            comm.all_gather(part, algorithm=algorithm, out=gathered)
        except CommError as e:  # (parts of other sizes: the ranks' widest counts differ)
            e.add_note(f"all_gather counts on rank {comm.rank}: {rows} (each part padded to "
                       f"{widest} rows); every rank must pass the same counts")
            raise
        return restore(_cut(gathered.reshape(comm.size, part.size), rows, head, shape,
                            result, comm.rank))
    finally:
        if kept:
            scratch.lock.release()


def _cut(table: np.ndarray, rows: list[int], head: int, shape: tuple[int, ...],
         result: np.ndarray | None, rank: int) -> np.ndarray:
    """The rows of the gathered parts (table: one a row), into result (None: a new array),
    where every rank's header is this rank's; else the ValueError naming them."""
    size = len(rows)
    header_bytes = table.view(np.uint8)[:, :size * _COUNT.itemsize]  # (bits, not floats)
    if not (header_bytes == header_bytes[rank]).all():
        raise ValueError(disagreement(_headers(table, size)))
    if result is None:
        result = np.empty(shape, table.dtype)
    row, start = math.prod(shape[1:]), 0
    for k, count in enumerate(rows):
        result[start:start + count] = table[k, head:head + count * row].reshape(
            count, *shape[1:])
        start += count
    return result
