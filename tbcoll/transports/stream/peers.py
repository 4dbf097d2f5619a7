"""What the stream engine holds per peer: its stream (a Channel), its queues of sends, posted
receives and unexpected messages, and the staging buffer its reads go through.

Receives are matched per (peer, context, tag) in the order messages were sent; a message that
arrives before its receive is posted waits in an Unexpected buffer and is copied when the
receive is posted. Transports that reach into the engine by a C path of their own (tcp, shm)
build and resume these requests, so their names are public.
"""

from __future__ import annotations

from collections import defaultdict, deque
from concurrent.futures import Future
from typing import Protocol

import numpy as np

from tbcoll.core.calls import NO_CALL
from tbcoll.core.framing import DESCRIPTOR
from tbcoll.transports.stream.replay import Tail
from tbcoll.transports.stream.words import PEER_WORDS, WORDS_PER_PEER

STAGE = 256 << 10  # staging buffer per stream


class Channel(Protocol):
    def sendmsg(self, buffers: list[memoryview]) -> int:
        """Write some leading bytes of buffers; BlockingIOError if none fit now."""

    def recv_into(self, view: memoryview) -> int:
        """Read what is there into view; BlockingIOError if nothing is, 0 at end of stream."""

    def close(self) -> None: ...


class Send:
    __slots__ = ("peer", "views", "done", "error", "pulled", "context")

    def __init__(self, peer: Peer, views: list[memoryview],
                 pulled: np.ndarray | None = None) -> None:
        # pulled: an announced payload, which the receiver copies; done once it says so
        self.peer, self.views, self.done, self.error = peer, views, False, None
        self.pulled = pulled
        self.context = -1  # a message's (isend sets it): a revoked one fails its wait


class Recv:
    __slots__ = ("peer", "view", "call", "done", "error", "dropped", "context")

    def __init__(self, peer: Peer, view: memoryview, call: tuple[int, int] = NO_CALL,
                 context: int = -1) -> None:
        # error: why it can never complete (a message of another size or call came for it);
        # dropped: that message, read and dropped; the error is raised once it is whole
        self.peer, self.view, self.call, self.done, self.error = peer, view, call, False, None
        self.dropped: Unexpected | None = None
        self.context = context  # -1: not known (a revoked context fails the others' waits)


class Unexpected:
    """A message that arrived before its receive was posted."""

    __slots__ = ("data", "call", "done", "waiter")

    def __init__(self, nbytes: int, call: tuple[int, int] = NO_CALL) -> None:
        self.data, self.call, self.done, self.waiter = bytearray(nbytes), call, False, None


class Notice:
    """A revocation notice being read (see the module docstring)."""

    __slots__ = ("context", "data")

    def __init__(self, context: int, nbytes: int) -> None:
        self.context, self.data = context, bytearray(nbytes)


class Announced:
    """An announced message's descriptor, as it arrives: then it is matched and pulled."""

    __slots__ = ("context", "tag", "call", "descriptor")

    def __init__(self, context: int, tag: int, call: tuple[int, int]) -> None:
        self.context, self.tag, self.call = context, tag, call
        self.descriptor = bytearray(DESCRIPTOR.size)


class Peer:
    # No C code reads these: what a C path needs of them is in the engine's words (see
    # StreamTransport.publish_words), where this peer's next pull id is kept (_next_pull).
    def __init__(self, rank: int, channel: Channel) -> None:
        self.rank = rank
        self.channel = channel
        self.words_at = PEER_WORDS + rank * WORDS_PER_PEER  # its StreamTransport.words
        self.sendq: deque[Send] = deque()
        # by (context, tag); a key is removed with its last entry (publish_words: POSTED)
        self.posted: defaultdict[tuple[int, int], deque[Recv]] = defaultdict(deque)
        self.unexpected: defaultdict[tuple[int, int], deque[Unexpected]] = defaultdict(deque)
        self.stage = bytearray(STAGE)
        self.stage_view = memoryview(self.stage)
        self.start = self.end = 0  # unread bytes are stage[start:end]
        self.target: memoryview | None = None  # payload bytes still to arrive
        self.target_owner: Recv | Unexpected | None = None
        self.lost: str | None = None
        self.pulls = False  # large messages to and from this peer are pulled (see above)
        self.announced: dict[int, Send] = {}  # this rank's announced sends not yet pulled
        self.refused: dict[int, tuple[Recv | Unexpected, memoryview]] = {}  # to be resent
        # failover (docs/failover.md): what was sent, kept to replay (None: failover off);
        # why the channel failed, while a new one is to be found; channels had before it
        self.tail: Tail | None = None
        self.broken: str | None = None
        self.broken_at = 0.0  # when (time.monotonic()) broken was found
        self.reconnecting: Future | None = None  # the new channel being connected
        self.generation = 0


def take_first(held: dict[tuple[int, int], deque], key: tuple[int, int]) -> Recv | Unexpected:
    """Take the first of held[key] (a Peer's posted or unexpected), and the key with it if
    it was the last: a peer holds something exactly when the dict is not empty."""
    queue = held[key]
    first = queue.popleft()
    if not queue:
        del held[key]
    return first


def has_failed(request: Send | Recv) -> bool:
    """request can never complete, and the message that failed it (if any) has been read
    whole: the stream is in step again for what comes next. (A failed receive raises only
    then: after it a rank may call what moves nothing through the stream, as shm's native
    collectives, and the sender of a message longer than the ring would wait forever.)"""
    if not request.error:
        return False
    dropped = getattr(request, "dropped", None)
    return dropped is None or dropped.done

