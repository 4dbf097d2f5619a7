"""Mesh (direct) algorithms: every rank talks to every other at once, in one or two steps.

This is the natural shape for a fully cabled Thunderbolt mesh, where each pair of Macs has its
own link: all-reduce is a direct reduce-scatter (rank r sends chunk j to rank j) followed by a
direct all-gather (rank r sends its reduced chunk to everyone).
"""

from __future__ import annotations

import numpy as np

from tbcoll.algorithms.layout import chunk_bounds
from tbcoll.transports.base import P2P

_TAG = 2


def _others(p2p: P2P) -> list[int]:
    """The other ranks, starting after this one, so that not everyone hits rank 0 first."""
    return [(p2p.rank + k) % p2p.size for k in range(1, p2p.size)]


def reduce_scatter(p2p: P2P, data: np.ndarray, reduce: np.ufunc) -> None:
    """Afterwards chunk r of data holds the reduction of every rank's chunk r."""
    bounds = chunk_bounds(data.size, p2p.size)
    chunk = [data[bounds[j]:bounds[j + 1]] for j in range(p2p.size)]
    mine = chunk[p2p.rank]
    others = _others(p2p)
    incoming = np.empty((len(others), mine.size), data.dtype)
    receives = [p2p.irecv(incoming[i], j, _TAG) for i, j in enumerate(others)]
    sends = [p2p.isend(chunk[j], j, _TAG) for j in others]
    for i, request in enumerate(receives):  # reduce each contribution as it lands
        p2p.waitall([request])
        reduce(mine, incoming[i], out=mine)
    p2p.waitall(sends)


def all_gather(p2p: P2P, data: np.ndarray) -> None:
    """data holds p chunks (chunk_bounds), this rank's own in place; fill in the others."""
    bounds = chunk_bounds(data.size, p2p.size)
    others = _others(p2p)
    requests = [p2p.irecv(data[bounds[j]:bounds[j + 1]], j, _TAG) for j in others]
    mine = data[bounds[p2p.rank]:bounds[p2p.rank + 1]]
    requests += [p2p.isend(mine, j, _TAG) for j in others]
    p2p.waitall(requests)


def all_reduce(p2p: P2P, data: np.ndarray, reduce: np.ufunc) -> None:
    reduce_scatter(p2p, data, reduce)
    all_gather(p2p, data)


def broadcast(p2p: P2P, data: np.ndarray, root: int) -> None:
    if p2p.rank == root:
        p2p.waitall([p2p.isend(data, j, _TAG) for j in _others(p2p)])
    else:
        p2p.waitall([p2p.irecv(data, root, _TAG)])
