"""Failover's replay (docs/failover.md): the tail of what a stream sent
that its peer may not have, kept so that a stream moved to a new channel in mid-message
resumes from the byte its peer last received.

Both ends count every byte of a stream each way (the engine's SENT_WORD and RECEIVED_WORD).
After a channel fails, the receiver reads what the dead channel still gives, the two ends
tell each other their RECEIVED counts over the new one, and each sender writes again the
bytes from the peer's count to its own SENT count: a Tail holds them. A byte the peer's
kernel has acknowledged reaches the peer's reads (it drains the dead socket), so a Tail must
keep at least the bytes not yet acknowledged. A small message is copied into a ring as it
is written; only when the ring is full does the Tail ask the channel how many bytes it still
holds (SIOCOUTQ: one system call per ring's worth of bytes, not one per message) and grow to
hold them, up to `most`. A large message (TAIL_LARGE) is not copied while it is written: the Tail
holds its buffers (the sender's, alive until its send completes) and, once it is all
written, copies only its last bytes that the kernel still holds (one SIOCOUTQ per message).

tcp's C lanes keep the same tail (tbcoll/include/engine_words.h, tail_keep): the ring is
reserved once at its bound (mmap: pages are used only as the ring grows into them), so that
C holds it for good, and its start, end and size are three words (TAIL_*, laid out as
engine_words.h lays them, checked at import with the engine's words). C copies a small
message that fits; anything else (a large message, a full ring) it leaves to this class.
"""

from __future__ import annotations

import mmap
from array import array
from collections.abc import Callable

from tbcoll.transports.stream.words import TAIL_END, TAIL_LARGE, TAIL_SIZE, TAIL_START

FIRST = 256 << 10  # a Tail's ring at first
MOST = 16 << 20  # its bound: the kernel's send buffer (tcp asks 4 MiB; Linux doubles it)


class Tail:
    """The last bytes of one direction of a stream: stream offsets [start, end), ring-held."""

    __slots__ = ("ring", "words", "most", "unacked", "short", "held", "held_at", "holder")

    def __init__(self, unacked: Callable[[], int], first: int = FIRST,
                 most: int = MOST) -> None:
        """unacked(): the bytes the channel holds not yet acknowledged by the peer's kernel
        (a channel that cannot tell: a bound past most, so that the ring grows to most)."""
        # the ring's first `size` bytes are in use; C may hold both (see the module's doc)
        self.ring = mmap.mmap(-1, max(most, first), flags=mmap.MAP_PRIVATE)
        self.words = array("Q", [0, 0, 0])
        self.words[TAIL_SIZE] = first
        self.most, self.unacked = most, unacked
        self.short = 0  # bytes not acknowledged that the ring could not hold (most too small)
        # a large message being written: its buffers from stream offset held_at (the ring
        # holds [start, held_at)), and its request
        self.held: Held | None = None
        self.held_at, self.holder = 0, None

    # the ring's stream offsets [start, end) and its size in use: its words
    @property
    def start(self) -> int:
        return self.words[TAIL_START]

    @start.setter
    def start(self, value: int) -> None:
        self.words[TAIL_START] = value

    @property
    def end(self) -> int:
        return self.words[TAIL_END]

    @end.setter
    def end(self, value: int) -> None:
        self.words[TAIL_END] = value

    @property
    def size(self) -> int:
        return self.words[TAIL_SIZE]

    def wrote_whole(self, views: list[memoryview]) -> None:
        """A whole message (views) has just been written by another path (tcp's C)."""
        n = sum(len(v) for v in views)
        if n >= TAIL_LARGE:
            self.held, self.held_at, self.holder = Held(views), self.end, None
            self.end += n
            self._release()
        else:
            self.keep(views, n)

    def took(self, request: object, views: list[memoryview], n: int) -> None:
        """Another path (tcp's C) wrote the first n bytes of a message (views); request: the
        rest's send, which the engine writes (empty: it is all written)."""
        if request.views:
            self.wrote(request, views, n)
        else:
            self.wrote_whole(views)

    def wrote(self, request: object, views: list[memoryview], n: int) -> None:
        """n bytes of request's views (what is left of it) have just been written."""
        if self.holder is request:
            self.end += n
        elif sum(len(v) for v in views) >= TAIL_LARGE:
            self.held, self.held_at, self.holder = Held(views), self.end, request
            self.end += n
        else:
            self.keep(views, n)
            return
        if self.end - self.held_at == len(self.held):
            self._release()

    def _release(self) -> None:
        """The held message is all written: copy into the ring only its last bytes that
        the kernel still holds."""
        held, total = self.held, self.end - self.held_at
        self.held = self.holder = None
        kept = min(self.unacked(), total)
        if kept < total:  # the bytes before are acknowledged: the ring starts again there
            self.start = self.end = self.end - kept
        else:
            self.end = self.held_at
        self.keep(held.views_from(total - kept), kept)

    def keep(self, views: list[memoryview], n: int) -> None:
        """The first n bytes of views have just been written to the channel."""
        if self.end + n - self.start > self.size:
            self._make_room(n)
        for view in views:
            if n <= 0:
                break
            take = min(n, len(view))
            self._put(view[:take] if take < len(view) else view)
            n -= take

    def _make_room(self, n: int) -> None:
        """The ring is full: keep what the kernel still holds, the n bytes just written
        included (the bytes before are acknowledged: their room is free, so that the next
        system call comes a ring's worth of sends later), growing to it, up to most."""
        needed = min(self.unacked(), self.end + n - self.start)
        self.start = max(self.start, min(self.end, self.end + n - needed))
        if needed > self.size and self.size < self.most:
            size = self.size
            while size < needed and size < self.most:
                size *= 2
            self._grow(min(size, self.most))
        self.short = max(0, needed - self.size)

    def _grow(self, size: int) -> None:
        """Use more of the reserved ring (its place stays: C holds it)."""
        kept = self.since(self.start) or b""
        self.words[TAIL_SIZE] = size
        self.start = self.end = self.end - len(kept)
        self._put(memoryview(kept))

    def _put(self, view: memoryview) -> None:
        size = self.size
        if len(view) >= size:
            view, self.end = view[len(view) - size:], self.end + len(view) - size
        at = self.end % size
        first = min(len(view), size - at)
        self.ring[at:at + first] = view[:first]
        self.ring[:len(view) - first] = view[first:]
        self.end += len(view)
        self.start = max(self.start, self.end - size)

    def since(self, offset: int) -> bytes | None:
        """The bytes [offset, end), or None where the ring no longer holds them all."""
        if not self.start <= offset <= self.end:
            return None
        if self.held is not None:
            ring_end = self.held_at
            from_ring = self._ring(offset, ring_end) if offset < ring_end else b""
            skip = max(offset, ring_end) - ring_end
            return from_ring + self.held.between(skip, self.end - ring_end)
        return self._ring(offset, self.end)

    def _ring(self, offset: int, upto: int) -> bytes:
        """The ring's bytes [offset, upto)."""
        size, n = self.size, upto - offset
        at = offset % size
        first = min(n, size - at)
        return bytes(self.ring[at:at + first]) + bytes(self.ring[:n - first])

    def rewind(self, offset: int) -> None:
        """The stream goes on from offset (the peer's count): what follows is sent again (a
        held message's bytes are copied first; what is left of it is held anew)."""
        if self.held is not None:
            held, written = self.held, self.end - self.held_at
            self.held = self.holder = None
            self.end = self.held_at
            self.keep(held.views_from(0), written)
        self.end = offset
        self.start = min(self.start, offset)


class Held:
    """A large message's buffers (header, payload), read in place: no copy."""

    __slots__ = ("views", "size")

    def __init__(self, views: list[memoryview]) -> None:
        self.views, self.size = list(views), sum(len(v) for v in views)

    def __len__(self) -> int:
        return self.size

    def views_from(self, offset: int) -> list[memoryview]:
        """Its bytes from offset on, as views."""
        out = []
        for view in self.views:
            if offset < len(view):
                out.append(view[offset:] if offset else view)
            offset = max(0, offset - len(view))
        return out

    def between(self, offset: int, upto: int) -> bytes:
        """A copy of its bytes [offset, upto)."""
        left, out = upto - offset, []
        for view in self.views_from(offset):
            if left <= 0:
                break
            out.append(bytes(view[:left]))
            left -= len(out[-1])
        return b"".join(out)
