"""The flight recorder: each communicator's last calls, and where a rank is stuck now.

A job that hangs or diverges is explained by where each rank was: which call of which
communicator (matched across ranks by its sequence number), with what, from which line of the
user's code. Each communicator keeps its last TBCOLL_RECORD calls (default 512; 0: none) in a
ring: the sequence number, the collective, dtype, bytes, op, root, algorithm, and the start and
end times. Recording costs a tuple and a clock read per call, nothing formatted: the 8 B shm
all_reduce takes ~2 us and the recorder must stay within its noise (RESULTS.md). So the
latency-critical one-call path (Communicator._quickly) records its end time only (a second
clock read cost as much as the rest); the other paths, and every call under --trace, record
both.

What a rank is doing *now* is not recorded at all: the call in progress is read, when a dump
is asked for, from the stacks of the process's threads (the Communicator's frames hold the
call's arguments), and so is the user's line that made it. Recorded calls carry a call site
only under tbrun --trace (TBCOLL_TRACE=1), which keeps every call for the timeline.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

_PACKAGE = str(Path(__file__).resolve().parent) + os.sep

# (seq, collective (a tbcoll.collectives.Collective), dtype, bytes, op, root, algorithm,
#  start, end): the objects the call already had; perf_counter() times
Entry = tuple


class Ring(list):
    """The last len(self) calls: entry seq goes to index seq % len(self), so the Communicator
    writes `ring[seq % n] = entry` inline (no method call on the latency-critical path)."""

    def entries(self) -> list[Entry]:
        """The calls held, oldest first."""
        return sorted((e for e in self if e is not None), key=lambda e: e[0])


class TraceRing(Ring):
    """A Ring that also keeps every call, with the user's call site, for tbrun --trace."""

    def __init__(self, size: int, members: tuple[int, ...]) -> None:
        super().__init__([None] * max(size, 1))
        self.every: list[tuple[Entry, str]] = []
        _traced.append((members, self))

    def __setitem__(self, index: Any, entry: Any) -> None:
        super().__setitem__(index, entry)
        self.every.append((entry, call_site(sys._getframe(1))))


_traced: list[tuple[tuple[int, ...], TraceRing]] = []  # (a communicator's world ranks, ring)


def new_ring(size: int, trace: bool, members: tuple[int, ...]) -> Ring | None:
    """A communicator's recorder (members: its ranks in the world), None where it is off."""
    if trace:
        return TraceRing(size, members)
    return Ring([None] * size) if size else None


def traced_rings() -> list[tuple[tuple[int, ...], TraceRing]]:
    """Every communicator's TraceRing this process made, closed ones too."""
    return list(_traced)


def call_site(frame: FrameType | None) -> str:
    """file:line of the first frame outside tbcoll, from frame outwards ("" if none)."""
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame = frame.f_back
    if frame is None:
        return ""
    return f"{_short(frame.f_code.co_filename)}:{frame.f_lineno}"


def _short(path: str) -> str:
    """A path as a user reads it: relative to the working directory where it is inside."""
    try:
        relative = os.path.relpath(path)
    except ValueError:
        return path
    return path if relative.startswith("..") else relative


def describe(entry: Entry) -> dict[str, Any]:
    """A recorded call as plain data (for a dump's JSON)."""
    seq, kind, dtype, nbytes, op, root, algorithm, start, end = entry
    return {"seq": seq, "collective": kind.name, "dtype": None if dtype is None else str(dtype),
            "bytes": int(nbytes), "op": op,
            "root": root if isinstance(root, int) and root >= 0 else None,
            "algorithm": algorithm, "start": start, "end": end, "state": "done"}


def frames(frame: FrameType | None) -> Iterator[FrameType]:
    """frame and its callers, innermost first."""
    while frame is not None:
        yield frame
        frame = frame.f_back


def clock_anchor() -> dict[str, float]:
    """perf_counter() and the wall clock read together: turns the recorder's times into
    wall-clock times in a dump or a trace."""
    return {"perf": time.perf_counter(), "wall": time.time()}
