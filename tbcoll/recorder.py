"""The flight recorder: each communicator's last calls, and where a rank is stuck now.

A job that hangs or diverges is explained by where each rank was: which call of which
communicator (matched across ranks by its sequence number), with what, from which line of the
user's code. Each communicator keeps its last TBCOLL_RECORD calls (default 512; 0: none) in a
ring: the sequence number, the collective, dtype, bytes, op, root, algorithm, and the start and
end times. Recording costs a tuple and a clock read per call, nothing formatted: the 8 B shm
all_reduce takes ~1.4 us and the recorder must stay within its noise (RESULTS.md). So the
latency-critical one-call path (Communicator._quickly) records neither times (a clock read
cost as much as the rest of the record) nor the size (numpy's nbytes, 25 ns); the other
paths, and every call under --trace, record all. The call in progress has its size either
way, read off its frame.

What a rank is doing *now* is not recorded at all: the call in progress is read, when a dump
is asked for, from the stacks of the process's threads (the Communicator's frames hold the
call's arguments), and so is the user's line that made it. Recorded calls carry a call site
only under tbrun --trace (TBCOLL_TRACE=1), which keeps every call for the timeline until
tbcoll.dumps sends it to tbrun, a chunk at a time.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

_PACKAGE = str(Path(__file__).resolve().parent) + os.sep

# (seq, collective (a tbcoll.collectives.Collective), dtype, bytes, op, root, algorithm,
#  start, end): the objects the call already had; perf_counter() times. The one-call path
#  records (seq, collective, dtype, op, root) alone: algorithm "native", no size, no times.
Entry = tuple


def new_ring(size: int) -> list[Entry | None] | None:
    """A communicator's recorder: a plain list (its item assignment is the fastest), entry
    seq at index seq % size; None where the recorder is off."""
    return [None] * size if size else None


def entries(ring: list[Entry | None] | None) -> list[Entry]:
    """The calls a ring holds, oldest first."""
    return sorted((e for e in ring or () if e is not None), key=lambda e: e[0])


# under --trace, the calls of every communicator of this process not yet sent to tbrun, with
# their call sites: (a communicator's world ranks, [(entry, site), ...]); tbcoll.dumps takes
# them out a chunk at a time, as the job runs
_traced: list[tuple[tuple[int, ...], list[tuple[Entry, str]]]] = []
# set when a communicator holds a chunk's worth: tbcoll.dumps's sender wakes up
trace_full = threading.Event()


def new_trace(trace: bool, members: tuple[int, ...]) -> list[tuple[Entry, str]] | None:
    """Where a communicator (members: its world ranks) keeps its calls under --trace until
    they are sent (the communicator calls trace_full.set() once it holds trace_chunk())."""
    if not trace:
        return None
    calls: list[tuple[Entry, str]] = []
    _traced.append((members, calls))
    return calls


def take_traced() -> list[tuple[tuple[int, ...], list[tuple[Entry, str]]]]:
    """The calls every communicator holds now, taken out of it (closed communicators' too);
    calls added meanwhile stay for the next time (a list's slice and its del each run whole
    under the GIL, and the communicator only appends)."""
    taken = []
    for members, calls in list(_traced):
        n = len(calls)
        if n:
            taken.append((members, calls[:n]))
            del calls[:n]
    return taken


# a traced call as tbcoll.dumps sends it and tbcoll.trace reads it: a row of these, with the
# index of its communicator in its chunk's list of them
TRACE_ROW = ("seq", "collective", "dtype", "bytes", "op", "root", "algorithm", "start", "end",
             "site")
_dtype_names: dict[Any, str] = {}


def trace_rows(taken: list[tuple[tuple[int, ...], list[tuple[Entry, str]]]]
               ) -> tuple[list[list[int]], list[tuple]]:
    """What take_traced() took as (communicators, rows): plain values, cheap to encode (a
    dict a call took twice the time, in the rank, while it runs). The one-call path's entries
    are left out: they time nothing (no call takes that path under --trace)."""
    comms = [list(members) for members, _ in taken]
    rows = []
    for index, (_, calls) in enumerate(taken):
        for entry, site in calls:
            if len(entry) != 9:
                continue
            seq, kind, dtype, nbytes, op, root, algorithm, start, end = entry
            name = _dtype_names.get(dtype)
            if name is None:
                name = _dtype_names[dtype] = None if dtype is None else str(dtype)
            rows.append((index, seq, kind.name, name, nbytes, op, rooted(root), algorithm,
                         start, end, site))
    return comms, rows


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
    if len(entry) == 9:
        seq, kind, dtype, nbytes, op, root, algorithm, start, end = entry
    else:  # the one-call path's
        (seq, kind, dtype, op, root), nbytes = entry, None
        algorithm, start, end = "native", None, None
    return {"seq": seq, "collective": kind.name, "dtype": None if dtype is None else str(dtype),
            "bytes": nbytes, "op": op, "root": rooted(root), "algorithm": algorithm,
            "start": start, "end": end, "state": "done"}


def rooted(root: Any) -> int | None:
    """A call's root as a dump says it: None for the calls without one (root -1)."""
    return root if isinstance(root, int) and root >= 0 else None


def frames(frame: FrameType | None) -> Iterator[FrameType]:
    """frame and its callers, innermost first."""
    while frame is not None:
        yield frame
        frame = frame.f_back


def clock_anchor() -> dict[str, float]:
    """perf_counter() and the wall clock read together: turns the recorder's times into
    wall-clock times in a dump or a trace."""
    return {"perf": time.perf_counter(), "wall": time.time()}
