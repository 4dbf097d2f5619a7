"""The flight recorder as plain data: each communicator's last calls, the call it is in now,
and the calls under --trace.

A job that hangs or diverges is explained by where each rank was: which call of which
communicator (matched across ranks by its sequence number), with what, from which line of the
user's code. Each communicator's call gate (tbcoll.core.gate) keeps its last TBCOLL_RECORD calls
(default 512; 0: none) in a ring of fixed-width records: the sequence number, the collective,
dtype, op, root, bytes, algorithm (codes), and the start and end times. Recording costs a few
stores in C per call, nothing formatted: the 8 B shm all_reduce takes ~1 us and the recorder
must stay within its noise (RESULTS.md). So the latency-critical one-call paths (the shm
lane, tbcoll.comm.routes.gated) time nothing (a clock read costs as much as the rest of the
record); the other paths, and every call under --trace, are timed.

What a rank is doing *now* is the gate's call in progress, with the thread that runs it: the
user's line that made the call is read, when a dump is asked for, from that thread's stack
(by code positions, not by the frames' locals). Recorded calls carry a call site only under
tbrun --trace (TBCOLL_TRACE=1), which keeps every call for the timeline until
tbcoll.observability.dumps sends it to tbrun, a chunk at a time. tbrun reads TRACE_ROW here: this
module imports nothing of the library's (numpy); tbcoll.core.gate turns the records' codes into
names.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections import deque
from pathlib import Path
from types import FrameType
from typing import Any, NamedTuple


class Watched(NamedTuple):
    """What the dumps and tbcoll.comm.ownership need of a live communicator, handed in by it
    (ownership.track): its call gate and its ranks' world ranks."""

    gate: Any
    world_ranks: tuple[int, ...]


# every communicator of this process, with what it handed in, for the dumps
LIVE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_PACKAGE = str(Path(__file__).resolve().parents[1]) + os.sep  # tbcoll/
Entry = tuple  # a call gate's record (tbcoll.core.gate.RECORD)


# under --trace, the calls of every communicator of this process not yet sent to tbrun, with
# their call sites: (a communicator's world ranks, [(entry, site), ...]); tbcoll.observability.dumps
# takes them out a chunk at a time, as the job runs
_traced: list[tuple[tuple[int, ...], list[tuple[Entry, str]]]] = []
# set when a communicator holds a chunk's worth: tbcoll.observability.dumps's sender wakes up
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


# a pair's failovers (tbcoll.job.pathevents.PathChange's fields, with "at": perf_counter() when
# the stream went on over its new path): the last EVENTS_KEPT for the dumps, and under --trace
# those not yet sent (tbcoll.observability.dumps takes them with the calls)
EVENTS_KEPT = 64
events: deque[dict[str, Any]] = deque(maxlen=EVENTS_KEPT)
_traced_events: list[dict[str, Any]] = []


def note_event(event: dict[str, Any]) -> None:
    """Keep a failover for the dumps, and for the timeline under --trace (where a
    communicator traces: every one does, or none)."""
    events.append(event)
    if _traced:
        _traced_events.append(event)


def take_events() -> list[dict[str, Any]]:
    """The failovers not yet sent under --trace, taken out (as take_traced's calls)."""
    n = len(_traced_events)
    taken = _traced_events[:n]
    del _traced_events[:n]
    return taken


# a traced call as tbcoll.observability.dumps sends it and tbcoll.observability.trace reads it: a
# row of these, with the index of its communicator in its chunk's list of them
TRACE_ROW = ("seq", "collective", "dtype", "bytes", "op", "root", "algorithm", "start", "end",
             "site")


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


def user_site(frame: FrameType | None) -> str:
    """The user's line that made the call a thread is in (frame: its innermost): call_site
    from the innermost frame of tbcoll's (frames inside the call may be other packages')."""
    inner = frame
    while inner is not None and not inner.f_code.co_filename.startswith(_PACKAGE):
        inner = inner.f_back
    return call_site(inner if inner is not None else frame)


def clock_anchor() -> dict[str, float]:
    """perf_counter() and the wall clock read together: turns the recorder's times into
    wall-clock times in a dump or a trace."""
    return {"perf": time.perf_counter(), "wall": time.time()}
