"""Emulated link latency for the tcp transport (TBCOLL_LINK_DELAY_US), for benchmarks that
show what a link's latency does to a job (benchmarks/tp_latency.py); the kernel here has no
netem. A DelayedChannel wraps a connected socket as the stream engine's channel: each message
the engine writes (one message per sendmsg: its header and payload) travels as a frame, the
sender's clock and the message's length, then its bytes; the receiving channel hands a
frame's bytes on only once stamp + delay has passed (bytes arriving later than that pass at
once), as over a link of that one-way latency. Messages in a row overlap their delays, as on
a wire; what arrived before the peer's end is handed on at the end.

Holding bytes at the receiver rather than the sender keeps the emulation right while ranks
compute: a held send would leave only at its rank's next wait. It needs one clock for every
rank, as the namespace hosts on one machine have (CLOCK_MONOTONIC; mach_absolute_time on
macOS): it is for emulation, never for real hosts. Below what this machine's loopback and
Python take (~10 us) it changes nothing. Only a job that sets the variable uses it: plain tcp
pays nothing.
"""

from __future__ import annotations

import socket
import struct
import time
from collections import deque

_FRAME = struct.Struct("!dQ")  # the sender's time.perf_counter(), the message's bytes
_READ = 256 << 10


class DelayedChannel:
    """A socket whose messages arrive `delay` seconds after they were sent (a Channel of
    tbcoll.transports.stream, plus `due` for the transport's waits)."""

    def __init__(self, sock: socket.socket, delay: float) -> None:
        self.socket, self._delay = sock, delay
        self._header = b""  # the rest of the frame header of the message being sent
        self._left = 0  # payload bytes of the message being sent still to go
        self._raw = bytearray()  # read from the socket, not yet parsed into frames
        self._frames: deque[list] = deque()  # [due, bytes still to come, bytes to hand on]
        self._payload = bytearray()  # the frames' payload bytes read, not yet handed on
        self._eof = False
        self._chunk = bytearray(_READ)  # what one read of the socket lands in
        self._chunk_view = memoryview(self._chunk)

    # --- sending: one message per call, as the stream engine writes them -----------------

    def sendmsg(self, buffers: list[memoryview]) -> int:
        """Write the frame header (once per message), then as many payload bytes as fit;
        return how many payload bytes went (the engine calls again with the rest)."""
        if not self._left and not self._header:  # a new message
            self._left = sum(len(b) for b in buffers)
            self._header = _FRAME.pack(time.perf_counter(), self._left)
        head = len(self._header)
        sent = self.socket.sendmsg([self._header, *buffers] if head else buffers)
        if sent < head:
            self._header = self._header[sent:]
            return 0
        self._header = b""
        self._left -= sent - head
        return sent - head

    # --- receiving -----------------------------------------------------------------------

    def recv_into(self, view: memoryview) -> int:
        """Hand on the payload bytes that are due, up to len(view); BlockingIOError if none
        are, 0 once the peer has closed and everything it sent has been handed on."""
        ready = self._releasable(time.perf_counter())
        if not ready:  # (bytes left in the socket meanwhile: the next poll shows them)
            self._read()
            ready = self._releasable(time.perf_counter())
        if not ready:
            if self._eof and not self._payload:
                return 0
            raise BlockingIOError
        n = min(ready, len(view))
        view[:n] = self._payload[:n]
        del self._payload[:n]
        while n:  # consume the frames' accounting
            frame = self._frames[0]
            took = min(n, frame[2])
            frame[2] -= took
            n -= took
            if frame[2] == 0 and frame[1] == 0:
                self._frames.popleft()
        return min(ready, len(view))

    def due(self) -> float | None:
        """Seconds until held bytes are due (0 or less: some are now), None if none are held
        (bytes still in the socket are the poll's to see)."""
        if self._payload:
            return 0.0 if self._eof else self._frames[0][0] - time.perf_counter()
        return None

    def close(self) -> None:
        self.socket.close()

    def _read(self) -> None:
        """Take what the socket has (without blocking) and parse it into frames."""
        while not self._eof:
            try:
                got = self.socket.recv_into(self._chunk)
            except (BlockingIOError, InterruptedError):
                break
            if not got:
                self._eof = True
                break
            self._raw += self._chunk_view[:got]
            if got < _READ:  # it took all there was: the next poll says when more comes
                break
        while self._raw:
            frame = self._frames[-1] if self._frames else None
            if frame is not None and frame[1]:  # that frame's payload is still arriving
                took = min(frame[1], len(self._raw))
                self._payload += self._raw[:took]
                del self._raw[:took]
                frame[1] -= took
                frame[2] += took
                continue
            if len(self._raw) < _FRAME.size:
                break
            stamp, length = _FRAME.unpack_from(self._raw)
            del self._raw[:_FRAME.size]
            self._frames.append([stamp + self._delay, length, 0])  # [due, to come, to hand]

    def _releasable(self, now: float) -> int:
        """Payload bytes that may be handed on now: those of the due frames, in order (all
        of them once the peer has closed)."""
        if self._eof:
            return len(self._payload)
        ready = 0
        for due, _, held in self._frames:
            if due > now:
                break
            ready += held
        return ready

    def __getattr__(self, name: str):  # fileno, setsockopt, getsockname, ...: the socket's
        return getattr(self.socket, name)
