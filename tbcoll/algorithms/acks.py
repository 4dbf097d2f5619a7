"""Acknowledgements for the ranks of a rooted collective that would receive nothing.

Transports that compare the ranks' calls where messages arrive (P2P.acknowledge; see
tbcoll.core.calls) never show a rank that only sends a message of another call: a broadcast's
or a scatter's root, a gather's or a reduce's leaves. Each such rank therefore waits for a
zero-byte message from the ranks it sent to, which every one of them sends once its own
part has arrived. Two ranks that each believe they are the root (broadcast(root=rank % 2))
then wait for each other's acknowledgement, meet each other's data instead, and fail at
that call, where they would have returned their own data as the answer. Costs the pure
senders one message's latency; the others pay nothing.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from tbcoll.core.protocols import P2P

_TAG = 7
_NOTHING = np.empty(0, np.uint8)


def expect(p2p: P2P, peers: Iterable[int]) -> list[object]:
    """Post the receives of the acknowledgements from peers (none where not needed)."""
    return [p2p.irecv(_NOTHING, peer, _TAG) for peer in peers] if p2p.acknowledge else []


def give(p2p: P2P, peers: Iterable[int]) -> list[object]:
    """Start the acknowledgements to peers, whose messages to this rank have all arrived."""
    return [p2p.isend(_NOTHING, peer, _TAG) for peer in peers] if p2p.acknowledge else []
