"""Collectives of unequal parts, built over the equal ones so that every transport has them.

all_gather with counts (MPI's Allgatherv): rank j gives counts[j] rows along axis 0, and every
rank gets the rows of all in rank order. Each part is padded to the largest, gathered with the
communicator's own all_gather (whatever route that takes on this transport), and the padding
cut out again: tensor parallelism's uneven vocabulary splits differ by one row at most, so the
padding costs next to nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from tbcoll.arrays import to_numpy
from tbcoll.collectives import output

if TYPE_CHECKING:
    from tbcoll.comm import Communicator


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


def all_gather(comm: Communicator, x: Any, counts: Any, algorithm: str | None,
               out: Any) -> Any:
    """Every rank's x, counts[j] rows from rank j, concatenated along axis 0."""
    array, restore = to_numpy(x)
    rows = checked_counts(counts, comm.size, comm.rank, array)
    shape = (sum(rows), *array.shape[1:])
    result = output(x, out, shape, array.dtype)
    widest = max(rows)
    if widest == min(rows):  # equal parts: the plain all_gather, into out where given
        return restore(comm.all_gather(array, algorithm=algorithm, out=result))
    padded = np.zeros((widest, *array.shape[1:]), array.dtype)
    padded[:array.shape[0]] = array
    gathered = comm.all_gather(padded, algorithm=algorithm)
    if result is None:
        result = np.empty(shape, array.dtype)
    start = 0
    for rank, count in enumerate(rows):
        result[start:start + count] = gathered[rank * widest:rank * widest + count]
        start += count
    return restore(result)
