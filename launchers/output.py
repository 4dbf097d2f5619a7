"""Route the ranks' stdout and stderr to the terminal as they arrive, tagged with the rank,
optionally also to files.

A partial line (mlx-lm streaming tokens with end="", tqdm redrawing with "\\r") is shown
after PARTIAL_DELAY under its rank's tag, and its continuation joins it untagged while no
other rank's output comes between. The short wait lets a line written in pieces (Python's
unbuffered print writes the text and the newline apart) arrive whole. A rank's output that
would land inside another rank's open line waits for that line to end, at most PARTIAL_DELAY
after its last piece, and then starts on a new line: whole lines of different ranks are never
mixed within a line. With tags off the bytes pass through at once, under the same rule.
"""

from __future__ import annotations

import errno
import os
import re
import select
import sys
import time
from collections.abc import Callable

from tbcoll.launch.folders import open_own_file, safe_folder

from tbcoll.core.errors import LaunchError

STREAMS = ("out", "err")
PARTIAL_DELAY = 0.05  # seconds a partial line waits for the rest of its line
_TAIL = 4096  # bytes of each rank's stderr kept for tbrun's failure hints
# A line's content and its end: "\n", "\r\n", or "\r" (a redraw of the same line).
_SEGMENT = re.compile(rb"([^\r\n]*)(\r\n|\n|\r|)")

Key = tuple[int, str]  # (rank, "out" or "err")

_active: OutputRouter | None = None  # the router whose lines log() must not land in


def log(message: str) -> None:
    """tbrun's own messages, on its stderr, each on a line of its own."""
    if _active is not None:
        _active.end_line("err")
    try:
        print(f"tbrun: {message}", file=sys.stderr, flush=True)
    except BrokenPipeError:
        pass  # nobody reads tbrun's stderr any more (`tbrun ... 2>&1 | head`)


class _Sink:
    """A terminal stream (tbrun's stdout or stderr) and the rank whose line is open on it."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.owner: Key | None = None  # the key whose last piece did not end its line
        self.last_write = 0.0
        self.closed = False  # its reader went away (`tbrun ... | head -1`), or writes fail
        self.failure = ""  # why writes fail (a full disk: `tbrun ... > /dev/full`), if they do

    def write(self, data: bytes) -> None:
        if self.closed:
            return
        try:
            _write_all(self.fd, data)
        except OSError as e:
            # The supervisor ends the job, as SIGPIPE ends a writer in a shell pipeline (or,
            # where the write failed, as a failure); what is written meanwhile has nowhere
            # to go.
            self.closed = True
            if not isinstance(e, BrokenPipeError):
                self.failure = e.strerror or str(e)


class OutputRouter:
    def __init__(self, nranks: int, tag_output: bool, output_dir: str | None,
                 delay: float = PARTIAL_DELAY,
                 clock: Callable[[], float] = time.monotonic,
                 hide: re.Pattern[bytes] | None = None) -> None:
        """hide: lines a launcher writes of its own (mpiexec's as rank -1, srun's on a rank's
        stderr), kept for stderr_tail, not shown."""
        global _active
        self._tag_output = tag_output
        self._delay = delay
        self._hide = hide
        self._clock = clock
        sys.stdout.flush()
        sys.stderr.flush()
        out, err = sys.stdout.fileno(), sys.stderr.fileno()
        self._sinks = {"out": _Sink(out)}
        # One terminal for both (the usual case): a line is open on it whichever stream
        # opened it.
        self._sinks["err"] = self._sinks["out"] if _same_file(out, err) else _Sink(err)
        self._pending: dict[Key, bytes] = {}
        self._since: dict[Key, float] = {}  # when the oldest pending byte arrived
        self._broken: set[Key] = set()  # keys whose open line tbrun ended for them
        self._held: set[Key] = set()  # pending only a held-back tail ("\r", part of a char)
        self._tails: dict[int, bytes] = {}
        self._files: dict[Key, int] = {}
        if output_dir is not None:
            self._open_files(output_dir, nranks)
        _active = self

    def _open_files(self, folder: str, nranks: int) -> None:
        """DIR/rank-N.out and .err, truncated; never through a link (tbcoll.launch.folders)."""
        path = safe_folder(folder, "--output-dir")
        try:
            for rank in range(nranks):
                for stream in STREAMS:
                    path = os.path.join(folder, f"rank-{rank}.{stream}")
                    self._files[rank, stream] = open_own_file(path)
        except OSError as e:
            for fd in self._files.values():
                os.close(fd)
            why = "a symbolic link" if e.errno == errno.ELOOP else e.strerror
            raise LaunchError(f"--output-dir {folder}: cannot write {path} ({why}); "
                              "give a folder you can write to") from None

    def write(self, rank: int, stream: str, data: bytes) -> None:
        key = (rank, stream)
        if (fd := self._files.get(key)) is not None:
            _write_all(fd, data)
        if stream == "err" or rank < 0:  # a launcher (mpiexec) reports on its stdout too
            self._tails[rank] = (self._tails.get(rank, b"") + data)[-_TAIL:]
        now = self._clock()
        if key in self._held or not self._pending.get(key):
            self._since[key] = now
        self._held.discard(key)
        self._pending[key] = self._pending.get(key, b"") + data
        self._flush(key, now)

    def end(self, rank: int, stream: str) -> None:
        """The stream closed: pass on what is left, and end its line."""
        key = (rank, stream)
        self._flush(key, self._clock(), final=True)

    @property
    def stdout_closed(self) -> bool:
        """tbrun's standard output has no reader any more, or cannot be written: the job
        should end."""
        return self._sinks["out"].closed

    @property
    def stdout_failure(self) -> str:
        """Why writing tbrun's standard output failed ("" where its reader went away)."""
        return self._sinks["out"].failure

    def stderr_tail(self, rank: int) -> str:
        """The last few KB a rank wrote to stderr (for hints in tbrun's failure messages)."""
        return self._tails.get(rank, b"").decode(errors="replace")

    def next_deadline(self) -> float | None:
        """When flush_due has something to show; None while nothing waits."""
        deadlines = []
        for key, data in self._pending.items():
            if not data or key in self._held:
                continue
            at = self._since[key] + self._delay if b"\n" not in data else 0.0
            owner = self._sinks[key[1]].owner
            if owner not in (None, key):
                at = max(at, self._sinks[key[1]].last_write + self._delay)
            deadlines.append(at)
        return min(deadlines, default=None)

    def flush_due(self) -> None:
        now = self._clock()
        for key in [k for k, data in self._pending.items() if data and k not in self._held]:
            self._flush(key, now)

    def end_line(self, stream: str) -> None:
        """Close any rank's open line on this terminal stream (before tbrun writes to it)."""
        sink = self._sinks[stream]
        if sink.owner is not None:
            sink.write(b"\n")
            self._broken.add(sink.owner)
            sink.owner = None

    def close(self) -> None:
        global _active
        for key in list(self._pending):
            self._flush(key, self._clock(), final=True)
        for fd in self._files.values():
            os.close(fd)
        _active = None

    def _flush(self, key: Key, now: float, final: bool = False) -> None:
        data = self._pending.get(key, b"")
        sink = self._sinks[key[1]]
        waited = False
        if data and sink.owner not in (None, key):
            if not final and now < sink.last_write + self._delay:
                return  # another rank's line is still being written: let it finish
            self.end_line(key[1])
            waited = True  # long enough: show what this rank has, partial line included
        if key in self._broken and data.startswith((b"\n", b"\r\n")):
            data = data[data.index(b"\n") + 1:]  # its line was ended for it already
        self._broken.discard(key)
        if final:
            cut = len(data)
        elif key[0] < 0:  # a launcher's own messages: whole lines
            cut = data.rfind(b"\n") + 1
        elif waited or not self._tag_output or now >= self._since[key] + self._delay:
            cut = len(data) - _unfinished_tail(data)
        else:
            cut = data.rfind(b"\n") + 1
        if cut:
            self._emit(key, data[:cut], now)
        self._pending[key] = data[cut:]
        if self._pending[key] and b"\n" not in self._pending[key] and (
                not self._tag_output or now >= self._since[key] + self._delay):
            self._held.add(key)  # only a held-back tail is left: wait for more data
        elif self._pending[key]:
            self._since[key] = now if cut else self._since[key]
        if final and sink.owner == key and self._tag_output:
            self.end_line(key[1])

    def _emit(self, key: Key, text: bytes, now: float) -> None:
        sink = self._sinks[key[1]]
        if self._hide is not None and (key[0] < 0 or key[1] == "err"):
            text = b"".join(line for line in text.splitlines(keepends=True)
                            if not self._hide.search(line))
            if not text:
                return
        if self._tag_output and key[0] >= 0:  # not a launcher's own output (rank -1)
            text = self._tagged(text, prefix=b"[%d] " % key[0], open_line=sink.owner == key)
        sink.write(text)
        sink.owner = None if text.endswith(b"\n") else key
        sink.last_write = now

    @staticmethod
    def _tagged(text: bytes, prefix: bytes, open_line: bool) -> bytes:
        """text with prefix at the start of every line (and after every lone "\\r", which
        redraws the line); none at the start when it continues a line already tagged."""
        out = bytearray()
        at_start = not open_line
        for content, end in _SEGMENT.findall(text):
            if not content and not end:
                continue
            if at_start and content:
                out += prefix
            out += content + end
            if end:
                at_start = True
            elif content:
                at_start = False
        return bytes(out)


def _unfinished_tail(data: bytes) -> int:
    """How many bytes at the end of data to hold back: a "\\r" that may be half of "\\r\\n",
    or the first bytes of a UTF-8 character whose rest has not arrived."""
    if data.endswith(b"\r"):
        return 1
    for back in range(1, min(4, len(data) + 1)):
        byte = data[-back]
        if byte & 0xC0 == 0x80:
            continue  # a continuation byte: look further back for the lead byte
        if byte & 0x80 == 0:
            return 0
        length = 2 if byte & 0xE0 == 0xC0 else 3 if byte & 0xF0 == 0xE0 else 4
        return back if back < length else 0
    return 0


def _same_file(a: int, b: int) -> bool:
    try:
        sa, sb = os.fstat(a), os.fstat(b)
    except OSError:
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def _write_all(fd: int, data: bytes) -> None:
    """Write every byte with os.write.

    Not sys.stdout.buffer: when a signal (tbrun gets SIGCHLD for every rank) interrupts a
    partial write to a pipe, CPython's BufferedWriter can drop the rest of the buffer.
    """
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:  # an inherited non-blocking descriptor: wait until it drains
            select.select([], [fd], [])
