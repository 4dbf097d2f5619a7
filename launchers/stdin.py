"""tbrun's standard input, forwarded to the ranks that asked for it (--stdin 0|N|all|none),
as mpirun and torchrun feed rank 0.

Each rank's input pipe is written without blocking from tbrun's one select loop; tbrun stops
reading its own stdin while a rank has more than _HIGH_WATER bytes waiting, so a rank that
reads slowly slows the producer instead of filling tbrun's memory. End of file on tbrun's
stdin closes each rank's input (EOF for the rank); it never ends the job.

A wrapped rank (launchers.remote, on another host or on macOS) shares one pipe for its set-up
line, the signals tbrun forwards and its input, so there everything after the set-up line is
framed: a header line "KIND LENGTH\\n" and LENGTH bytes; kinds are "signal" (a signal's
name) and "stdin" (input; length 0 is end of file).
"""

from __future__ import annotations

import errno
import os

STDIN_CHOICES = ("0", "all", "none")  # or a rank number
_HIGH_WATER = 1 << 20


def stdin_ranks(choice: str, nprocs: int) -> frozenset[int]:
    """The ranks --stdin feeds: one rank's number, all of them, or none."""
    if choice == "none":
        return frozenset()
    if choice == "all":
        return frozenset(range(nprocs))
    return frozenset((int(choice),))


def standard_input() -> int | None:
    """tbrun's stdin, or None when it has none (a closed descriptor 0)."""
    try:
        os.fstat(0)
    except OSError:
        return None
    return 0


def frame(kind: str, payload: bytes) -> bytes:
    return b"%s %d\n" % (kind.encode(), len(payload)) + payload


def read_frames(read):
    """Yield (kind, payload) from read(n) -> bytes (b'' at end of file)."""
    buffer = b""
    while True:
        while b"\n" not in buffer:
            chunk = read(1 << 16)
            if not chunk:
                return
            buffer += chunk
        header, _, buffer = buffer.partition(b"\n")
        kind, _, length = header.decode(errors="replace").partition(" ")
        try:
            length = int(length)
        except ValueError:
            return  # not tbrun talking: treat as the end
        while len(buffer) < length:
            chunk = read(max(1 << 16, length - len(buffer)))
            if not chunk:
                return
            buffer += chunk
        yield kind, buffer[:length]
        buffer = buffer[length:]


class InputPipe:
    """The write end of one rank's stdin (or of its wrapper's control pipe, framed)."""

    def __init__(self, fd: int, framed: bool) -> None:
        self.fd = fd
        self.framed = framed
        self._buffer = bytearray()
        self._eof = False
        os.set_blocking(fd, False)

    @property
    def closed(self) -> bool:
        return self.fd < 0

    @property
    def full(self) -> bool:
        return len(self._buffer) > _HIGH_WATER

    @property
    def waiting(self) -> bool:
        return bool(self._buffer) and not self.closed

    def put(self, data: bytes) -> None:
        """Queue input for the rank."""
        self._queue(frame("stdin", data) if self.framed else data)

    def put_raw(self, data: bytes) -> None:
        """Queue bytes as they are (a wrapper's set-up line)."""
        self._queue(data)

    def put_signal(self, name: str) -> None:
        if self.framed:
            self._queue(frame("signal", name.encode()))

    def put_eof(self) -> None:
        """End the rank's input once what is queued has gone."""
        if self.framed:
            self._queue(frame("stdin", b""))
        else:
            self._eof = True
            self.flush()

    def flush(self) -> None:
        """Write what the pipe takes now."""
        while self._buffer and not self.closed:
            try:
                written = os.write(self.fd, self._buffer)
            except BlockingIOError:
                return
            except OSError as e:  # the rank is gone (EPIPE) or closed its stdin
                if e.errno not in (errno.EPIPE, errno.EBADF):
                    raise
                self.close()
                return
            del self._buffer[:written]
        if self._eof and not self._buffer:
            self.close()

    def close(self) -> None:
        if not self.closed:
            os.close(self.fd)
            self.fd = -1
        self._buffer.clear()

    def _queue(self, data: bytes) -> None:
        if not self.closed:
            self._buffer += data
            self.flush()
