"""Route the ranks' stdout and stderr: whole lines, tagged with the rank, optionally to files."""

from __future__ import annotations

import os
import select
import sys
from pathlib import Path

STREAMS = ("out", "err")
_MAX_PARTIAL = 64 << 10  # a line longer than this is passed on in pieces


def log(message: str) -> None:
    """tbrun's own messages, on its stderr."""
    print(f"tbrun: {message}", file=sys.stderr, flush=True)


class OutputRouter:
    """Collects chunks per (rank, stream) and writes complete lines to the terminal and files.

    Lines are kept whole so that the output of several ranks never interleaves mid-line.
    """

    def __init__(self, nranks: int, tag_output: bool, output_dir: Path | None) -> None:
        self._tag_output = tag_output
        sys.stdout.flush()
        sys.stderr.flush()
        self._terminal = {"out": sys.stdout.fileno(), "err": sys.stderr.fileno()}
        self._partial: dict[tuple[int, str], bytes] = {}
        self._files: dict[tuple[int, str], int] = {}
        if output_dir is not None:
            output_dir.mkdir(parents=True, exist_ok=True)
            for rank in range(nranks):
                for stream in STREAMS:
                    path = output_dir / f"rank-{rank}.{stream}"
                    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
                    self._files[rank, stream] = os.open(path, flags, 0o644)

    def write(self, rank: int, stream: str, data: bytes) -> None:
        if (fd := self._files.get((rank, stream))) is not None:
            _write_all(fd, data)
        buffered = self._partial.pop((rank, stream), b"") + data
        cut = buffered.rfind(b"\n") + 1
        if cut == 0 and len(buffered) > _MAX_PARTIAL:
            cut = len(buffered)
        if cut:
            self._emit(rank, stream, buffered[:cut])
        if cut < len(buffered):
            self._partial[rank, stream] = buffered[cut:]

    def end(self, rank: int, stream: str) -> None:
        """The stream closed: pass on an unfinished last line."""
        if rest := self._partial.pop((rank, stream), b""):
            self._emit(rank, stream, rest + b"\n")

    def close(self) -> None:
        for rank, stream in list(self._partial):
            self.end(rank, stream)
        for fd in self._files.values():
            os.close(fd)

    def _emit(self, rank: int, stream: str, lines: bytes) -> None:
        if self._tag_output:
            prefix = b"[%d] " % rank
            lines = b"".join(prefix + line for line in lines.splitlines(keepends=True))
            if not lines.endswith(b"\n"):
                lines += b"\n"
        try:
            _write_all(self._terminal[stream], lines)
        except BrokenPipeError:
            pass  # our reader went away (e.g. `tbrun ... | head`); keep supervising


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
