"""Byte streams in shared memory: one single-producer, single-consumer ring per direction.

A ring is a head counter (written by the producer), a tail counter (written by the consumer),
each on its own cache line, and `capacity` bytes of data; the counters only grow, and byte k
of the stream lives at data[k % capacity]. Every move of a ring's bytes is C's
(tbcoll/transports/shm/rings.h has the layout and the order of the counters, rings.c the moves),
made through the functions of tbcoll.transports.shm._atomics below: the protocol is written once.

ShmDuplex pairs two rings into the Channel that tbcoll.transports.stream drives.
"""

from __future__ import annotations

from tbcoll.transports.shm.flags import atomics

LINE = 128


class OverwrittenRing(OSError):
    """The producer's counter is not one a producer could have written: the segment was
    overwritten (by a bug, or by another process of this user)."""

    def __init__(self, capacity: int) -> None:
        super().__init__(f"the ring's counters say more bytes are waiting than a ring of "
                         f"{capacity} holds: the shared segment was overwritten")


class Ring:
    CONTROL = 2 * LINE  # head line, tail line
    # what C's reads return where the producer's counter cannot be one (rings.h's
    # RING_OVERWRITTEN, checked at import by tbcoll.transports.shm.native)
    OVERWRITTEN = -3

    def __init__(self, buffer: memoryview, base: int, capacity: int) -> None:
        self.buffer, self.base, self.capacity = buffer, base, capacity  # for the C paths

    def write(self, buffers: list[memoryview]) -> int:
        """Producer: copy as many leading bytes of buffers as fit now; return how many."""
        return atomics.ring_write(self.buffer, self.base, self.capacity, buffers)

    def read_into(self, view: memoryview) -> int:
        """Consumer: copy what has arrived, up to len(view) bytes; return how many."""
        return self._checked(atomics.ring_read(self.buffer, self.base, self.capacity, view))

    # send and receive: the message moves that tbcoll/transports/shm/moves.c makes on the rings (its
    # ring_put_message and ring_take), for tests that drive them alone

    def send(self, header: bytes, payload: object, budget: float) -> int:
        """Producer: write header and payload as room allows, waiting for room at most
        budget seconds at a time; return how many bytes went in."""
        return atomics.ring_send(self.buffer, self.base, self.capacity, header, payload, budget)

    def receive(self, header: bytes, view: object, budget: float) -> int:
        """Consumer: take the next message if its header is this one (the stream engine's:
        context, tag, as many bytes as view holds, call), its payload straight into view (any
        buffer); return the payload bytes that arrived, -1 if no whole header came within
        budget, -2 if the next message is another (left in place)."""
        return self._checked(atomics.ring_recv(self.buffer, self.base, self.capacity, header,
                                               view, budget))

    def readable(self) -> bool:
        return atomics.ring_held(self.buffer, self.base, self.capacity) != 0

    def writable(self) -> bool:
        return atomics.ring_held(self.buffer, self.base, self.capacity) < self.capacity

    def _checked(self, copied: int) -> int:
        if copied == self.OVERWRITTEN:
            raise OverwrittenRing(self.capacity)
        return copied


class ShmDuplex:
    """The stream to one peer: we produce into `outgoing` and consume from `incoming`."""

    def __init__(self, outgoing: Ring, incoming: Ring) -> None:
        self.outgoing, self.incoming = outgoing, incoming

    def sendmsg(self, buffers: list[memoryview]) -> int:
        written = self.outgoing.write(buffers)
        if not written:
            raise BlockingIOError
        return written

    def recv_into(self, view: memoryview) -> int:
        got = self.incoming.read_into(view)
        if not got:
            raise BlockingIOError
        return got

    def close(self) -> None:
        """Nothing to release: the rings' bytes are the segment's (its owner closes it)."""
