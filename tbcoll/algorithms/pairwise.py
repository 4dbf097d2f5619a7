"""Pairwise exchange for all_to_all: p-1 steps; in step k rank r sends its block for rank
r+k and receives the block of rank r-k, so each step every rank sends one message and
receives one, and no rank is swamped (MPICH's choice for long all-to-alls).

Blocks may differ in size (all_to_all with counts); a zero-size block is not sent, which both
ends know from the counts.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tbcoll.core.protocols import P2P

_TAG = 5


def all_to_all(p2p: P2P, send: Sequence[np.ndarray], recv: Sequence[np.ndarray]) -> None:
    """send[j] goes to rank j, recv[i] comes from rank i; this rank's own block is copied."""
    r, p = p2p.rank, p2p.size
    np.copyto(recv[r], send[r])
    for k in range(1, p):
        dst, src = (r + k) % p, (r - k) % p
        requests = []
        if recv[src].size:
            requests.append(p2p.irecv(recv[src], src, _TAG))
        if send[dst].size:
            requests.append(p2p.isend(send[dst], dst, _TAG))
        p2p.waitall(requests)
