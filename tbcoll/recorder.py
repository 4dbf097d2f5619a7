"""The flight recorder as plain data: each communicator's last calls, the call it is in now,
and the calls under --trace.

A job that hangs or diverges is explained by where each rank was: which call of which
communicator (matched across ranks by its sequence number), with what, from which line of the
user's code. Each communicator's call gate (tbcoll.gate) keeps its last TBCOLL_RECORD calls
(default 512; 0: none) in a ring of fixed-width records: the sequence number, the collective,
dtype, op, root, bytes, algorithm (codes), and the start and end times. Recording costs a few
stores in C per call, nothing formatted: the 8 B shm all_reduce takes ~1 us and the recorder
must stay within its noise (RESULTS.md). So the latency-critical one-call paths (the shm
lane, Communicator._quickly) time nothing (a clock read costs as much as the rest of the
record); the other paths, and every call under --trace, are timed.

What a rank is doing *now* is the gate's call in progress, with the thread that runs it: the
user's line that made the call is read, when a dump is asked for, from that thread's stack
(by code positions, not by the frames' locals). Recorded calls carry a call site only under
tbrun --trace (TBCOLL_TRACE=1), which keeps every call for the timeline until tbcoll.dumps
sends it to tbrun, a chunk at a time. This module turns the gate's codes into names.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

from tbcoll.algorithms import COLLECTIVES, NAMES
from tbcoll.collectives import KINDS
from tbcoll.dtypes import DTYPES, OPS
from tbcoll.gate import CURRENT, RECORD

_PACKAGE = str(Path(__file__).resolve().parent) + os.sep
_DTYPE_NAMES = tuple(DTYPES)
_OP_NAMES = tuple(OPS)
Entry = tuple  # a gate's record (tbcoll.gate.RECORD)


def named(codes: dict[str, Any]) -> dict[str, Any]:
    """A record's or a call's fields with names for codes: collective for kind, dtype, op and
    algorithm names; None for the codes -1 (none), the bytes -1 (not known), the times 0
    (not timed)."""
    fields = dict(codes)
    fields["collective"] = KINDS[fields.pop("kind")]
    for key, names in (("dtype", _DTYPE_NAMES), ("op", _OP_NAMES), ("algorithm", NAMES)):
        fields[key] = _name(names, fields[key])
    for key in ("root", "peer", "tag", "bytes"):
        if key in fields and fields[key] < 0:
            fields[key] = None
    for key in ("start", "end"):
        if key in fields and not fields[key]:
            fields[key] = None
    return fields


def describe(entry: Entry) -> dict[str, Any]:
    """A recorded call as plain data (for a dump's JSON)."""
    return {**named(dict(zip(RECORD, entry, strict=True))), "state": "done"}


def in_progress(current: tuple, completed: int, site: str) -> dict[str, Any]:
    """A gate's call in progress (tbcoll.gate.CURRENT, less its thread) as plain data: a
    collective has its seq (the next one where it is not counted yet), the others none."""
    fields = named(dict(zip(CURRENT, current, strict=True)))
    del fields["thread"]
    if fields["collective"] in COLLECTIVES:
        fields["seq"] = fields["seq"] or completed + 1
    else:
        fields["seq"] = None
    return {**fields, "site": site, "state": "running"}


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


def trace_rows(taken: list[tuple[tuple[int, ...], list[tuple[Entry, str]]]]
               ) -> tuple[list[list[int]], list[tuple]]:
    """What take_traced() took as (communicators, rows): plain values, cheap to encode (a
    dict a call took twice the time, in the rank, while it runs). Calls not timed are left
    out (the one-call paths'; no call takes them under --trace)."""
    comms = [list(members) for members, _ in taken]
    rows = []
    for index, (_, calls) in enumerate(taken):
        for (seq, kind, dtype, op, root, nbytes, algorithm, start, end), site in calls:
            if start:
                rows.append((index, seq, KINDS[kind], _name(_DTYPE_NAMES, dtype),
                             nbytes if nbytes >= 0 else None, _name(_OP_NAMES, op),
                             root if root >= 0 else None, _name(NAMES, algorithm), start, end,
                             site))
    return comms, rows


def _name(names: tuple[str, ...], code: int) -> str | None:
    return names[code] if code >= 0 else None


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
