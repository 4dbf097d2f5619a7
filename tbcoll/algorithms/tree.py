"""Binomial trees for the rooted collectives: gather, scatter, reduce in ceil(log2 p) steps.

Ranks are renumbered relative to the root, v = (rank - root) mod p. In a gather, at step
mask = 1, 2, 4, ... a rank whose v has that bit set sends everything it has gathered (its
subtree's blocks, in v order) to v - mask and is done; the others receive their child
v + mask's subtree. A scatter runs the same tree from the root down; a reduce combines
instead of concatenating (sum, prod, max and min are commutative, so the order of combining
may follow the tree). The ranks that only send (a gather's or reduce's leaves, a scatter's
root) hear back from the ranks they sent to (tbcoll.algorithms.acks).
"""

from __future__ import annotations

import numpy as np

from tbcoll.algorithms import acks
from tbcoll.core.protocols import P2P

_TAG = 6


def _relative(p2p: P2P, root: int) -> tuple[int, int, int]:
    p = p2p.size
    return (p2p.rank - root) % p, p, root


def _real(v: int, p: int, root: int) -> int:
    return (v + root) % p


def _leaf(v: int, p: int) -> bool:
    """Whether v receives nothing in a gather or reduce: its lowest step (mask 1) would
    need v even and a v + 1 to receive from."""
    return v % 2 == 1 or v + 1 >= p


def gather(p2p: P2P, mine: np.ndarray, blocks: np.ndarray, root: int) -> None:
    """blocks: room for p blocks of mine's size (the root's result, in v order: the caller
    rotates it), or at least this rank's subtree elsewhere."""
    v, p, root = _relative(p2p, root)
    b = mine.size
    blocks[:b] = mine
    mask, given = 1, []
    while mask < p:
        if v & mask:
            have, parent = min(mask, p - v), _real(v - mask, p, root)
            mine_sent = p2p.isend(blocks[:have * b], parent, _TAG)
            p2p.waitall(given + (acks.expect(p2p, [parent]) if _leaf(v, p) else [])
                        + [mine_sent])
            return
        if v + mask < p:
            count, child = min(mask, p - v - mask), _real(v + mask, p, root)
            p2p.waitall([p2p.irecv(blocks[mask * b:(mask + count) * b], child, _TAG)])
            if _leaf(v + mask, p):
                given += acks.give(p2p, [child])
        mask <<= 1
    p2p.waitall(given)


def subtree(p: int, v: int) -> int:
    """How many ranks' blocks v's subtree holds (all p at the root)."""
    return p if v == 0 else min(v & -v, p - v)


def scatter(p2p: P2P, blocks: np.ndarray, block: int, root: int) -> None:
    """At the root blocks holds the p blocks in v order; elsewhere room for this rank's
    subtree. Afterwards blocks[:block] is this rank's."""
    v, p, root = _relative(p2p, root)
    sends = []
    if v == 0:
        mask = 1 << ((p - 1).bit_length() - 1) if p > 1 else 0
        sends += acks.expect(p2p, [_real(1 << k, p, root) for k in range(mask.bit_length())])
    else:
        low = v & -v
        p2p.waitall([p2p.irecv(blocks[:subtree(p, v) * block], _real(v - low, p, root), _TAG)])
        mask = low >> 1
        if v == low:  # a child of the root, which only sends
            sends += acks.give(p2p, [root])
    while mask:
        if v + mask < p:
            count = min(mask, p - v - mask)
            sends.append(p2p.isend(blocks[mask * block:(mask + count) * block],
                                   _real(v + mask, p, root), _TAG))
        mask >>= 1
    p2p.waitall(sends)


def reduce(p2p: P2P, data: np.ndarray, combine: np.ufunc, root: int) -> None:
    """data: this rank's contribution, overwritten; at the root, the reduction."""
    v, p, root = _relative(p2p, root)
    incoming = np.empty_like(data)
    mask, given = 1, []
    while mask < p:
        if v & mask:
            parent = _real(v - mask, p, root)
            mine_sent = p2p.isend(data, parent, _TAG)
            p2p.waitall(given + (acks.expect(p2p, [parent]) if _leaf(v, p) else [])
                        + [mine_sent])
            return
        if v + mask < p:
            child = _real(v + mask, p, root)
            p2p.waitall([p2p.irecv(incoming, child, _TAG)])
            combine(data, incoming, out=data)
            if _leaf(v + mask, p):
                given += acks.give(p2p, [child])
        mask <<= 1
    p2p.waitall(given)
