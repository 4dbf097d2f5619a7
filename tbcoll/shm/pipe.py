"""Byte streams in shared memory: one single-producer, single-consumer ring per direction.

A ring is a head counter (written by the producer), a tail counter (written by the consumer),
each on its own cache line, and `capacity` bytes of data; the counters only grow, and byte k
of the stream lives at data[k % capacity]. Ordering:
- the producer copies data in, then stores head (release): the consumer that loads head
  (acquire) sees the data;
- the consumer copies data out, then stores tail (release): the producer that loads tail
  (acquire) before reusing that space cannot overwrite bytes still being read.

ShmDuplex pairs two rings into the Channel that tbcoll.transports.stream drives.
"""

from __future__ import annotations

from tbcoll.shm.flags import AtomicFlags, atomics

LINE = 128


class OverwrittenRing(OSError):
    """The producer's counter is not one a producer could have written: the segment was
    overwritten (by a bug, or by another process of this user)."""

    def __init__(self, available: int | None, capacity: int) -> None:
        super().__init__(f"the ring's counters say {'more' if available is None else available}"
                         f" bytes are waiting in a ring of {capacity}: the shared segment was "
                         "overwritten")


class Ring:
    CONTROL = 2 * LINE  # head line, tail line
    # what C's receive returns where the producer's counter cannot be one (rings.h's
    # RING_OVERWRITTEN, checked at import by tbcoll.shm.native)
    OVERWRITTEN = -3

    def __init__(self, buffer: memoryview, flags: AtomicFlags, base: int,
                 capacity: int) -> None:
        self._flags = flags
        self.buffer, self.base, self.capacity = buffer, base, capacity  # for the C paths
        self._head_at, self._tail_at = base, base + LINE
        self._data: memoryview | None = buffer[base + self.CONTROL:base + self.CONTROL + capacity]

    # Each side's own counter lives only in the segment, where C (tbcoll/shm/rings.h) moves it too.

    def write(self, buffers: list[memoryview]) -> int:
        """Producer: copy as many leading bytes of buffers as fit; return how many."""
        head = self._flags.load(self._head_at)
        free = self.capacity - (head - self._flags.load(self._tail_at))
        written = 0
        for buf in buffers:
            take = min(len(buf), free - written)
            self._copy_in(head + written, buf[:take])
            written += take
            if take < len(buf):
                break
        if written:
            self._flags.store(self._head_at, head + written)
        return written

    def read_into(self, view: memoryview) -> int:
        """Consumer: copy what has arrived, up to len(view) bytes; return how many."""
        tail = self._flags.load(self._tail_at)
        available = self._flags.load(self._head_at) - tail
        if not 0 <= available <= self.capacity:
            raise OverwrittenRing(available, self.capacity)
        n = min(available, len(view))
        if n:
            start = tail % self.capacity
            first = min(n, self.capacity - start)
            view[:first] = self._data[start:start + first]
            view[first:n] = self._data[:n - first]
            self._flags.store(self._tail_at, tail + n)
        return n

    def send(self, header: bytes, payload: object, budget: float) -> int:
        """Producer, in C: write header and payload as room allows, waiting for room at most
        budget seconds at a time; return how many bytes went in."""
        return atomics.ring_send(self.buffer, self.base, self.capacity, header, payload, budget)

    def receive(self, header: bytes, view: object, budget: float) -> int:
        """Consumer, in C: take the next message if its header is this one (the stream
        engine's: context, tag, as many bytes as view holds, call), its payload straight into
        view (any buffer); return the payload bytes that arrived, -1 if no whole header came
        within budget, -2 if the next message is another (left in place)."""
        copied = atomics.ring_recv(self.buffer, self.base, self.capacity, header, view, budget)
        if copied == self.OVERWRITTEN:
            raise OverwrittenRing(None, self.capacity)
        return copied

    def readable(self) -> bool:
        return self._flags.load(self._head_at) != self._flags.load(self._tail_at)

    def writable(self) -> bool:
        return self._flags.load(self._head_at) - self._flags.load(self._tail_at) < self.capacity

    def close(self) -> None:
        if self._data is not None:
            self._data.release()
            self._data = None

    def _copy_in(self, position: int, buf: memoryview) -> None:
        start = position % self.capacity
        first = min(len(buf), self.capacity - start)
        self._data[start:start + first] = buf[:first]
        self._data[:len(buf) - first] = buf[first:]


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
        self.outgoing.close()
        self.incoming.close()
