"""Bruck's all_to_all: ceil(log2 p) steps instead of p-1, for small blocks, where each
step's latency costs more than the extra copies (MPICH uses it below a few hundred bytes a
block).

Rank r first rotates its blocks so that slot i holds the block for rank r+i. In step k it
sends every slot whose index has bit k set to rank r+2^k and takes the same slots from rank
r-2^k; after the last step slot i holds the block that rank r-i sent to r. Blocks must be of
one size (all_to_all without counts).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tbcoll.core.protocols import P2P

_TAG = 7


def all_to_all(p2p: P2P, send: Sequence[np.ndarray], recv: Sequence[np.ndarray]) -> None:
    r, p = p2p.rank, p2p.size
    block = send[0].size
    if any(b.size != block for b in (*send, *recv)):
        raise ValueError("Bruck's all_to_all needs blocks of one size (no counts)")
    slots = np.stack([send[(r + i) % p] for i in range(p)])  # slot i: for rank r+i
    bit = 1
    while bit < p and block:
        moving = [i for i in range(p) if i & bit]
        outgoing = np.ascontiguousarray(slots[moving]).reshape(-1)
        incoming = np.empty_like(outgoing)
        p2p.waitall([p2p.irecv(incoming, (r - bit) % p, _TAG),
                     p2p.isend(outgoing, (r + bit) % p, _TAG)])
        slots[moving] = incoming.reshape(len(moving), block)
        bit <<= 1
    for j in range(p):
        np.copyto(recv[j], slots[(r - j) % p])
