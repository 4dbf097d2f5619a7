"""Route the ranks' stdout and stderr: whole lines, tagged with the rank, optionally to files."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import BinaryIO

STREAMS = ("out", "err")
_MAX_PARTIAL = 64 << 10  # a line longer than this is passed on in pieces


class OutputRouter:
    """Collects chunks per (rank, stream) and writes complete lines to the terminal and files.

    Lines are kept whole so that the output of several ranks never interleaves mid-line.
    """

    def __init__(self, nranks: int, tag_output: bool, output_dir: Path | None) -> None:
        self._tag_output = tag_output
        self._terminal = {"out": sys.stdout.buffer, "err": sys.stderr.buffer}
        self._partial: dict[tuple[int, str], bytes] = {}
        self._files: dict[tuple[int, str], BinaryIO] = {}
        if output_dir is not None:
            output_dir.mkdir(parents=True, exist_ok=True)
            for rank in range(nranks):
                for stream in STREAMS:
                    self._files[rank, stream] = open(output_dir / f"rank-{rank}.{stream}", "wb")

    def write(self, rank: int, stream: str, data: bytes) -> None:
        if file := self._files.get((rank, stream)):
            file.write(data)
            file.flush()
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
        for file in self._files.values():
            file.close()

    def _emit(self, rank: int, stream: str, lines: bytes) -> None:
        if self._tag_output:
            prefix = b"[%d] " % rank
            lines = b"".join(prefix + line for line in lines.splitlines(keepends=True))
            if not lines.endswith(b"\n"):
                lines += b"\n"
        terminal = self._terminal[stream]
        try:
            terminal.write(lines)
            terminal.flush()
        except (BrokenPipeError, ValueError):
            pass  # our reader went away (e.g. `tbrun ... | head`); keep supervising
