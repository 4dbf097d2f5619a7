"""Ring algorithms: bandwidth-optimal, each rank sends to rank+1 and receives from rank-1.

The buffer is cut into p chunks. At ring step s rank r sends chunk (r-s-1) % p and receives
chunk (r-s-2) % p. Steps 0..p-2 reduce what arrives into the local chunk (reduce-scatter:
afterwards rank r holds the full reduction of chunk r); steps p-1..2p-3 pass the reduced
chunks on unchanged (all-gather). all_reduce runs all 2(p-1) steps, reduce_scatter the first
p-1, all_gather the last p-1.

Each chunk travels as segments of SEGMENT_BYTES: a segment is reduced and forwarded as soon as
it has arrived, while the rest of the chunk is still on the wire (pipelining), and the
receives of step s+1 are posted before step s is worked through.
"""

from __future__ import annotations

import numpy as np

from tbcoll.algorithms import acks
from tbcoll.algorithms.layout import chunk_bounds, segments
from tbcoll.core.protocols import P2P

SEGMENT_BYTES = 256 << 10
_TAG = 1


def _run_steps(p2p: P2P, data: np.ndarray, reduce: np.ufunc | None, first: int, last: int) -> None:
    """Run ring steps first..last-1 over data (in place); see the module docstring."""
    p, r = p2p.size, p2p.rank
    right, left = (r + 1) % p, (r - 1) % p
    bounds = chunk_bounds(data.size, p)
    seg = max(1, SEGMENT_BYTES // max(1, data.itemsize))
    pieces = [segments(bounds[c], bounds[c + 1], seg) for c in range(p)]
    widest = max(bounds[c + 1] - bounds[c] for c in range(p))
    # Two staging buffers: step s reduces from one while step s+1 receives into the other.
    staging = [np.empty(widest, data.dtype), np.empty(widest, data.dtype)]

    def post_receives(step: int) -> list:
        chunk = (r - step - 2) % p
        if step < p - 1:  # a reduce step: land beside the local chunk
            base = bounds[chunk]
            into = [staging[step % 2][a - base:b - base] for a, b in pieces[chunk]]
        else:  # a gather step: the value is final, land in place
            into = [data[a:b] for a, b in pieces[chunk]]
        return [p2p.irecv(buf, left, _TAG) for buf in into]

    sends = [p2p.isend(data[a:b], right, _TAG) for a, b in pieces[(r - first - 1) % p]]
    receives = post_receives(first)
    for step in range(first, last):
        upcoming = post_receives(step + 1) if step + 1 < last else []
        chunk = (r - step - 2) % p
        base = bounds[chunk]
        for request, (a, b) in zip(receives, pieces[chunk], strict=True):
            p2p.waitall([request])
            if step < p - 1:
                reduce(data[a:b], staging[step % 2][a - base:b - base], out=data[a:b])
            if step + 1 < last:  # step+1 sends exactly the chunk this step received
                sends.append(p2p.isend(data[a:b], right, _TAG))
        receives = upcoming
    p2p.waitall(sends)


def all_reduce(p2p: P2P, data: np.ndarray, reduce: np.ufunc) -> None:
    _run_steps(p2p, data, reduce, 0, 2 * p2p.size - 2)


def reduce_scatter(p2p: P2P, data: np.ndarray, reduce: np.ufunc) -> None:
    """Afterwards chunk r of data holds the reduction of every rank's chunk r."""
    _run_steps(p2p, data, reduce, 0, p2p.size - 1)


def all_gather(p2p: P2P, data: np.ndarray) -> None:
    """data holds p equal blocks, this rank's own in place; fill in the others."""
    _run_steps(p2p, data, None, p2p.size - 1, 2 * p2p.size - 2)


def broadcast(p2p: P2P, data: np.ndarray, root: int) -> None:
    """A pipelined chain from root: each segment is forwarded as soon as it arrives; the
    root's follower acknowledges (tbcoll.algorithms.acks)."""
    p = p2p.size
    position = (p2p.rank - root) % p
    previous, following = (p2p.rank - 1) % p, (p2p.rank + 1) % p
    seg = max(1, SEGMENT_BYTES // max(1, data.itemsize))
    pieces = [data[a:b] for a, b in segments(0, data.size, seg)]
    receives = [p2p.irecv(piece, previous, _TAG) for piece in pieces] if position else []
    sends = acks.expect(p2p, [following]) if position == 0 and p > 1 else []
    for i, piece in enumerate(pieces):
        if receives:
            p2p.waitall([receives[i]])
        if position < p - 1:
            sends.append(p2p.isend(piece, following, _TAG))
    if position == 1:
        sends += acks.give(p2p, [previous])
    p2p.waitall(sends)
