"""Mesh (direct) algorithms: every rank talks to every other at once, in one or two steps.

This is the natural shape for a fully cabled Thunderbolt mesh, where each pair of Macs has its
own link: all-reduce is a direct reduce-scatter (rank r sends chunk j to rank j) followed by a
direct all-gather (rank r sends its reduced chunk to everyone).
"""

from __future__ import annotations

import numpy as np

from tbcoll.algorithms import acks
from tbcoll.algorithms.layout import chunk_bounds
from tbcoll.core.protocols import P2P

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
    """The root sends to every rank, which acknowledges (tbcoll.algorithms.acks)."""
    if p2p.rank == root:
        others = _others(p2p)
        p2p.waitall(acks.expect(p2p, others) + [p2p.isend(data, j, _TAG) for j in others])
    else:
        p2p.waitall([p2p.irecv(data, root, _TAG)])
        p2p.waitall(acks.give(p2p, [root]))


def all_to_all(p2p: P2P, send: list[np.ndarray], recv: list[np.ndarray]) -> None:
    """Every block at once: send[j] to rank j, recv[i] from rank i (zero-size ones skipped)."""
    np.copyto(recv[p2p.rank], send[p2p.rank])
    others = _others(p2p)
    requests = [p2p.irecv(recv[j], j, _TAG) for j in others if recv[j].size]
    requests += [p2p.isend(send[j], j, _TAG) for j in others if send[j].size]
    p2p.waitall(requests)


def gather(p2p: P2P, mine: np.ndarray, blocks: np.ndarray, root: int) -> None:
    """The root receives every rank's block straight into blocks, in order of rank relative
    to the root (its own first), as tree.gather leaves them."""
    b, p = mine.size, p2p.size
    if p2p.rank != root:  # a pure sender: the root acknowledges (tbcoll.algorithms.acks)
        p2p.waitall(acks.expect(p2p, [root]) + [p2p.isend(mine, root, _TAG)])
        return
    blocks[:b] = mine
    others = _others(p2p)
    p2p.waitall([p2p.irecv(blocks[(j - root) % p * b:((j - root) % p + 1) * b], j, _TAG)
                 for j in others])
    p2p.waitall(acks.give(p2p, others))


def scatter(p2p: P2P, blocks: np.ndarray, block: int, root: int) -> None:
    """The root sends each rank its block (blocks in order of rank relative to the root, as
    for tree.scatter); afterwards blocks[:block] is this rank's."""
    p = p2p.size
    if p2p.rank != root:
        p2p.waitall([p2p.irecv(blocks[:block], root, _TAG)])
        p2p.waitall(acks.give(p2p, [root]))
        return
    others = _others(p2p)  # the root, a pure sender, hears back (tbcoll.algorithms.acks)
    p2p.waitall(acks.expect(p2p, others)
                + [p2p.isend(blocks[(j - root) % p * block:((j - root) % p + 1) * block], j,
                             _TAG) for j in others])


def reduce(p2p: P2P, data: np.ndarray, combine: np.ufunc, root: int) -> None:
    """Every rank sends its data to the root, which combines them as they land."""
    if p2p.rank != root:  # a pure sender: the root acknowledges (tbcoll.algorithms.acks)
        p2p.waitall(acks.expect(p2p, [root]) + [p2p.isend(data, root, _TAG)])
        return
    others = _others(p2p)
    incoming = np.empty((len(others), data.size), data.dtype)
    receives = [p2p.irecv(incoming[i], j, _TAG) for i, j in enumerate(others)]
    for i, request in enumerate(receives):
        p2p.waitall([request])
        combine(data, incoming[i], out=data)
    p2p.waitall(acks.give(p2p, others))
