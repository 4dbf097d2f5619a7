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

    def __init__(self, buffer: memoryview, flags: AtomicFlags, base: int,
                 capacity: int) -> None:
        self._flags, self._capacity = flags, capacity
        self._buffer, self._base = buffer, base  # for the C paths
        self._head_at, self._tail_at = base, base + LINE
        self._data: memoryview | None = buffer[base + self.CONTROL:base + self.CONTROL + capacity]
        self._head = flags.load(self._head_at)  # our own counter, as the producer or consumer
        self._tail = flags.load(self._tail_at)

    def write(self, buffers: list[memoryview]) -> int:
        """Producer: copy as many leading bytes of buffers as fit; return how many."""
        free = self._capacity - (self._head - self._flags.load(self._tail_at))
        written = 0
        for buf in buffers:
            take = min(len(buf), free - written)
            self._copy_in(self._head + written, buf[:take])
            written += take
            if take < len(buf):
                break
        if written:
            self._head += written
            self._flags.store(self._head_at, self._head)
        return written

    def read_into(self, view: memoryview) -> int:
        """Consumer: copy what has arrived, up to len(view) bytes; return how many."""
        available = self._flags.load(self._head_at) - self._tail
        if not 0 <= available <= self._capacity:
            raise OverwrittenRing(available, self._capacity)
        n = min(available, len(view))
        if n:
            start = self._tail % self._capacity
            first = min(n, self._capacity - start)
            view[:first] = self._data[start:start + first]
            view[first:n] = self._data[:n - first]
            self._tail += n
            self._flags.store(self._tail_at, self._tail)
        return n

    def send(self, header: bytes, payload: object, budget: float) -> int:
        """Producer, in C: write header and payload as room allows, waiting for room at most
        budget seconds at a time; return how many bytes went in."""
        head = atomics.ring_send(self._buffer, self._base, self._capacity, self._head, header,
                                 payload, budget)
        written, self._head = head - self._head, head
        return written

    def receive(self, header: bytes, view: object, budget: float) -> int:
        """Consumer, in C: take the next message if its header is this one (the stream
        engine's: context, tag, as many bytes as view holds, call), its payload straight into
        view (any buffer); return the payload bytes that arrived, -1 if no whole header came
        within budget, -2 if the next message is another (left in place)."""
        self._tail, copied = atomics.ring_recv(self._buffer, self._base, self._capacity,
                                               self._tail, header, view, budget)
        if copied == -3:
            raise OverwrittenRing(None, self._capacity)
        return copied

    def readable(self) -> bool:
        return self._flags.load(self._head_at) != self._tail

    def writable(self) -> bool:
        return self._head - self._flags.load(self._tail_at) < self._capacity

    def close(self) -> None:
        if self._data is not None:
            self._data.release()
            self._data = None

    def _copy_in(self, position: int, buf: memoryview) -> None:
        start = position % self._capacity
        first = min(len(buf), self._capacity - start)
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
