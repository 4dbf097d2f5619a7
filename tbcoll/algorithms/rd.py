"""Recursive doubling: log2(p) steps, each exchanging with the rank whose number differs in
one bit. Latency-optimal, so the choice for small messages.

When p is not a power of two, with p = 2^k + rem, the first 2*rem ranks fold in pairs before
the exchange (even rank 2i hands its data to 2i+1 and waits) and unfold after it (2i+1 sends
the result back), so that 2^k ranks take part in the doubling.
"""

from __future__ import annotations

import numpy as np

from tbcoll.algorithms import acks
from tbcoll.core.protocols import P2P

_TAG = 3


class _Fold:
    """The ranks taking part in the doubling, numbered 0..2^k-1 ("virtual ranks")."""

    def __init__(self, p2p: P2P) -> None:
        p, r = p2p.size, p2p.rank
        self.pof2 = 1 << (p.bit_length() - 1)
        self.rem = p - self.pof2
        self.folded = r < 2 * self.rem  # this rank belongs to a pair of the fold
        self.sits_out = self.folded and r % 2 == 0
        self.vrank = r // 2 if self.folded else r - self.rem

    def real(self, vrank: int) -> int:
        return 2 * vrank + 1 if vrank < self.rem else vrank + self.rem

    def first_block(self, vrank: int) -> int:
        """The first of the real ranks' blocks that virtual rank vrank holds."""
        return 2 * vrank if vrank < self.rem else vrank + self.rem


def _exchange(p2p: P2P, send: np.ndarray, recv: np.ndarray, peer: int) -> None:
    p2p.waitall([p2p.irecv(recv, peer, _TAG), p2p.isend(send, peer, _TAG)])


def all_reduce(p2p: P2P, data: np.ndarray, reduce: np.ufunc) -> None:
    fold = _Fold(p2p)
    r = p2p.rank
    incoming = np.empty_like(data)
    if fold.folded:
        if fold.sits_out:
            p2p.waitall([p2p.isend(data, r + 1, _TAG)])
            p2p.waitall([p2p.irecv(data, r + 1, _TAG)])
            return
        p2p.waitall([p2p.irecv(incoming, r - 1, _TAG)])
        reduce(data, incoming, out=data)
    mask = 1
    while mask < fold.pof2:
        # Both partners compute a+b from the same two values, so every rank ends bit-identical.
        _exchange(p2p, data, incoming, fold.real(fold.vrank ^ mask))
        reduce(data, incoming, out=data)
        mask <<= 1
    if fold.folded:
        p2p.waitall([p2p.isend(data, r - 1, _TAG)])


def reduce_scatter(p2p: P2P, data: np.ndarray, reduce: np.ufunc) -> None:
    """Afterwards chunk r of data holds the reduction of every rank's chunk r.

    For the small messages rd is chosen for, a full all-reduce costs the same log2(p) steps
    as recursive halving, so that is what runs.
    """
    all_reduce(p2p, data, reduce)


def all_gather(p2p: P2P, data: np.ndarray) -> None:
    """data holds p equal blocks, this rank's own in place; fill in the others.

    Virtual rank v holds a contiguous run of real blocks; a group of 2^j virtual ranks
    aligned to 2^j holds a contiguous run too, so each step swaps one contiguous range.
    """
    fold = _Fold(p2p)
    r = p2p.rank
    block = data.size // p2p.size
    if fold.folded:
        if fold.sits_out:
            p2p.waitall([p2p.isend(data[r * block:(r + 1) * block], r + 1, _TAG)])
            p2p.waitall([p2p.irecv(data, r + 1, _TAG)])
            return
        p2p.waitall([p2p.irecv(data[(r - 1) * block:r * block], r - 1, _TAG)])

    def blocks_of(vlo: int, vhi: int) -> np.ndarray:
        """The data of virtual ranks vlo..vhi-1."""
        first = fold.first_block(vlo)
        end = fold.first_block(vhi) if vhi < fold.pof2 else p2p.size
        return data[first * block:end * block]

    mask = 1
    while mask < fold.pof2:
        mine = fold.vrank & ~(mask - 1)
        theirs = mine ^ mask
        _exchange(p2p, blocks_of(mine, mine + mask), blocks_of(theirs, theirs + mask),
                  fold.real(fold.vrank ^ mask))
        mask <<= 1
    if fold.folded:
        p2p.waitall([p2p.isend(data, r - 1, _TAG)])


def broadcast(p2p: P2P, data: np.ndarray, root: int) -> None:
    """A binomial tree: in round k, every rank that has the data sends it 2^k further; the
    root's children acknowledge (tbcoll.algorithms.acks)."""
    p = p2p.size
    position = (p2p.rank - root) % p
    lowest = position & -position if position else 1 << p.bit_length()
    sends = []
    if position:
        parent = position - lowest
        p2p.waitall([p2p.irecv(data, (parent + root) % p, _TAG)])
        if parent == 0:
            sends += acks.give(p2p, [root])
    bit, children = lowest >> 1, []
    while bit:
        if position + bit < p:
            children.append((position + bit + root) % p)
        bit >>= 1
    if not position:
        sends += acks.expect(p2p, children)
    sends += [p2p.isend(data, child, _TAG) for child in children]
    p2p.waitall(sends)


def barrier(p2p: P2P) -> None:
    """Dissemination barrier: in round k, signal rank r+2^k and hear from rank r-2^k."""
    p, r = p2p.size, p2p.rank
    token = np.empty(0, np.uint8)
    distance = 1
    while distance < p:
        p2p.waitall([p2p.irecv(token, (r - distance) % p, _TAG),
                     p2p.isend(token, (r + distance) % p, _TAG)])
        distance <<= 1
