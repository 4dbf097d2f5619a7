"""tbrun's standard input, forwarded to the ranks that asked for it (--stdin 0|N|all|none),
as mpirun and torchrun feed rank 0.

Each rank's input pipe is written without blocking from tbrun's one select loop; tbrun stops
reading its own stdin while a rank has more than _HIGH_WATER bytes waiting, so a rank that
reads slowly slows the producer instead of filling tbrun's memory. End of file on tbrun's
stdin closes each rank's input (EOF for the rank); it never ends the job.

A wrapped rank (tbcoll.launch.remote, on another host or on macOS) shares one pipe for its set-up
line, the signals tbrun forwards and its input, so there everything after the set-up line is
framed: a header line "KIND LENGTH\\n" and LENGTH bytes; kinds are "signal" (a signal's
name) and "stdin" (input; length 0 is end of file). The wrapper reads every frame at once, so
that a signal is never stuck behind input, and queues the input for its rank in memory: a
remote rank that never reads a large input holds it there (tbrun's flow control reaches
it only through ssh's buffers).
"""

from __future__ import annotations

import errno
import os
import selectors
import stat
from collections.abc import Callable

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


def selectable(fd: int) -> bool:
    """Whether a selector may watch fd: a pipe, a socket or a terminal. A regular file or
    another device never blocks, and is read each round instead: epoll (Linux) refuses them,
    but macOS's kqueue accepts a regular file and never reports its end (a rank reading
    `tbrun ... < data.txt` to its end would wait forever there) and refuses devices."""
    mode = os.fstat(fd).st_mode
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or os.isatty(fd)


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


class InputForwarder:
    """tbrun's stdin to the ranks' input pipes, driven by the supervisor's select loop (its
    keys: "stdin" for tbrun's stdin, ("input", rank) for a pipe with bytes waiting)."""

    def __init__(self, source: int | None, log: Callable[[str], None]) -> None:
        self.source = source  # tbrun's stdin; None once it ended (or there was none)
        self._log = log
        self.pipes: dict[int, InputPipe] = {}
        self._readers: set[int] = set()  # the ranks that read it
        self._watched: set[int] = set()
        self._unpollable = False

    def add(self, rank: int, fd: int, framed: bool, reads_stdin: bool) -> InputPipe:
        """Take over fd, the write end of rank's stdin (or its wrapper's, framed)."""
        pipe = self.pipes[rank] = InputPipe(fd, framed)
        if reads_stdin:
            self._readers.add(rank)
            if self.source is None:
                pipe.put_eof()  # nothing to forward: the rank reads end of file
        return pipe

    def watch(self, selector: selectors.BaseSelector) -> bool:
        """Watch the pipes with bytes waiting for room, and tbrun's stdin while no rank has
        too much of it waiting (flow control). True when a stdin that select cannot watch (a
        file, /dev/null) was read from and may have more: the loop should not sleep."""
        waiting = {pipe.fd: rank for rank, pipe in self.pipes.items() if pipe.waiting}
        for fd in self._watched - waiting.keys():
            selector.unregister(fd)
        for fd in waiting.keys() - self._watched:
            selector.register(fd, selectors.EVENT_WRITE, ("input", waiting[fd]))
        self._watched = set(waiting)
        if self.source is None:
            return False
        full = any(pipe.full for pipe in self._targets())
        if self._unpollable:
            if not full:
                self._forward(selector)
            return self.source is not None and not full
        registered = self.source in selector.get_map()
        if full and registered:
            selector.unregister(self.source)
        elif not full and not registered:
            if not selectable(self.source):
                self._unpollable = True
                return True
            selector.register(self.source, selectors.EVENT_READ, ("stdin",))
        return False

    def ready(self, selector: selectors.BaseSelector, key: selectors.SelectorKey) -> None:
        if key.data[0] == "stdin":
            self._forward(selector)
        else:
            self.pipes[key.data[1]].flush()

    def rank_exited(self, rank: int) -> None:
        pipe = self.pipes.get(rank)
        if pipe is not None and not pipe.framed:  # a wrapper's pipe is closed by teardown
            pipe.close()

    def stop(self, selector: selectors.BaseSelector) -> None:
        """Every rank has exited: stop forwarding."""
        for fd in self._watched:
            selector.unregister(fd)
        self._watched.clear()
        self._end_source(selector)
        self.close()

    def close(self) -> None:
        for pipe in self.pipes.values():
            pipe.close()

    def _targets(self) -> list[InputPipe]:
        return [self.pipes[rank] for rank in self._readers if not self.pipes[rank].closed]

    def _forward(self, selector: selectors.BaseSelector) -> None:
        try:
            data = os.read(self.source, 1 << 16)
        except BlockingIOError:
            return
        except OSError as e:  # EIO: a terminal that tbrun, in the background, may not read
            self._log(f"cannot read standard input ({e.strerror}; tbrun runs in the "
                      "background of a terminal?): the ranks' input ends here; give it with < "
                      "or a pipe")
            data = b""
        for pipe in self._targets():
            if data:
                pipe.put(data)
            else:
                pipe.put_eof()
        if not data:
            self._end_source(selector)

    def _end_source(self, selector: selectors.BaseSelector) -> None:
        if self.source is not None and self.source in selector.get_map():
            selector.unregister(self.source)
        self.source = None
