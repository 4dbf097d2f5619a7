"""A communicator's call gate: who may call it now, the calls in progress, the count of its
collectives and its flight recorder, in one C object (tbcoll/core/_gate.c; its layout, and the
operations the shm lane uses from C, in tbcoll/include/gate.h).

- The lock: one user thread's call at a time (tbcoll.comm.ownership says why). enter() takes it
  without waiting, or returns -1 where another call holds it; leave() gives it back. In a
  child made by os.fork() every enter raises (fork()), and on a revoked communicator too
  (revoke(): a call interrupted here or on a peer left the ranks out of step).
- The calls in progress: each enter, and each begin (a call nested in another, or one that the
  progress thread runs, the gate not taken), fills a slot with the call's kind, dtype, op,
  root, bytes (peer and tag for send and recv), start time and the thread that runs it; end()
  or leave() frees it. tbcoll.observability.dumps shows the innermost (current()).
- The count: count() numbers a collective (its seq, matched across ranks).
- The flight recorder: record() puts a counted call, with its algorithm and end time, in a
  ring of fixed-width records (RECORD), TBCOLL_RECORD of them; calls() reads them back.

Every field is a code from one registry: KIND_CODES (tbcoll.collectives.base), DTYPE_CODES and
OP_CODES (tbcoll.core.dtypes), ALGORITHM_CODES (tbcoll.algorithms); -1 for none. A call's dtype and
op are given as they are (a numpy dtype, an op's name, or None), and the gate takes their
codes from tbcoll.core.dtypes' tables, handed to it at import: on the latency-critical paths that
costs less than a lookup in Python. Where the C extension is not built (or TBCOLL_NO_C=1),
PyGate does the same in Python: the one Python gate, for the whole no-compiler path. A C lane
drives only the C gate (its bind refuses another), so where the gate is Python's no lane is
bound (C_GATE, Communicator._bind_lane) and shm, whose rounds are C's, is not chosen: C and
Python never share a communicator's gate. tests/library/test_gate.py runs the same tests on
both. describe, in_progress and row turn records and
calls into names, for tbcoll.observability.dumps.

The same extension runs the whole call around a transport's C lane (lane_call: LaneCall,
tbcoll/core/one_call.c), which each transport's extension offers as a versioned struct of
functions (tbcoll/include/lane.h) in a "tbcoll.lane.v1" capsule: the code of a whole call
(its checks and admission, the gate, the engine's lock, the count and the record) is
compiled once, here, and a transport writes only its work.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from time import perf_counter
from typing import Any

import numpy as np

from tbcoll.core.callbacks import check_callbacks
from tbcoll.core.dtypes import DTYPE_CODES, DTYPES, OP_CODES, OPS
from tbcoll.core.extensions import c_extension
from tbcoll.core.names import ALGORITHM_CODES, COLLECTIVES, KINDS, NAMES

# a record, as calls() and last() give it
RECORD = ("seq", "kind", "dtype", "op", "root", "bytes", "algorithm", "start", "end")
# a call in progress, as current() gives it (seq 0 until it is counted; start 0 if untimed)
CURRENT = ("seq", "kind", "dtype", "op", "root", "bytes", "algorithm", "peer", "tag", "start",
           "thread")
NATIVE = ALGORITHM_CODES["native"]
DEPTH = 8  # calls in progress at once (tbcoll/include/gate.h's GATE_DEPTH)
_DTYPE_NAMES, _OP_NAMES = tuple(DTYPES), tuple(OPS)


def named(codes: dict[str, Any]) -> dict[str, Any]:
    """A record's or a call's fields with names for codes: collective for kind, dtype, op and
    algorithm names; None for the codes -1 (none), the bytes -1 (not known), the times 0
    (not timed)."""
    fields = dict(codes)
    fields["collective"] = KINDS[fields.pop("kind")]
    for key, names in (("dtype", _DTYPE_NAMES), ("op", _OP_NAMES), ("algorithm", NAMES)):
        fields[key] = name(names, fields[key])
    for key in ("root", "peer", "tag", "bytes"):
        if key in fields and fields[key] < 0:
            fields[key] = None
    for key in ("start", "end"):
        if key in fields and not fields[key]:
            fields[key] = None
    return fields


def name(names: tuple[str, ...], code: int) -> str | None:
    return names[code] if code >= 0 else None


def describe(record: tuple) -> dict[str, Any]:
    """A recorded call (RECORD) as plain data (for a dump's JSON)."""
    return {**named(dict(zip(RECORD, record, strict=True))), "state": "done"}


def in_progress(current: tuple, completed: int, site: str) -> dict[str, Any]:
    """A call in progress (CURRENT; its thread left out) as plain data, made at site: a
    collective has its seq (the next one, completed + 1, where it is not counted yet), the
    others none."""
    fields = named(dict(zip(CURRENT, current, strict=True)))
    del fields["thread"]
    fields["seq"] = (fields["seq"] or completed + 1) if fields["collective"] in COLLECTIVES \
        else None
    return {**fields, "site": site, "state": "running"}


def row(record: tuple) -> tuple:
    """A recorded call (RECORD) with names for its codes (None for -1), in RECORD's order."""
    seq, kind, dtype, op, root, nbytes, algorithm, start, end = record
    return (seq, KINDS[kind], name(_DTYPE_NAMES, dtype), name(_OP_NAMES, op),
            root if root >= 0 else None, nbytes if nbytes >= 0 else None, name(NAMES, algorithm),
            start, end)



class PyGate:
    """tbcoll.core._gate.Gate in Python, for a build without a compiler; the same methods (see
    tbcoll/core/_gate.c), each run whole under the GIL as the C one's."""

    def __init__(self, record: int) -> None:
        if record < 0:
            raise ValueError("record must be 0 or more calls")
        self.record_size = record
        self._ring: list[tuple | None] = [None] * record
        self._calls: list[list] = []  # CURRENT's fields, then whether it is active
        self._last: tuple | None = None
        self._lock = threading.Lock()
        self._forked: tuple[type, str] | None = None
        self._revoked: tuple[type, str] | None = None
        # watch()'s: the transport's revocation word (as 8-byte words), the error, why()
        self._watched: tuple[memoryview, type, Callable[[], str]] | None = None
        self.completed = 0

    @property
    def held(self) -> bool:
        return self._lock.locked()

    @property
    def forked(self) -> bool:
        return self._forked is not None

    @property
    def revoked(self) -> bool:
        return self._revoked is not None or self._revoked_elsewhere()

    def watch(self, word: Any, error: type, why: Callable[[], str]) -> None:
        if self._watched is not None:
            raise TypeError("watch(word, error class, why callable), once")
        self._watched = (memoryview(word).cast("B").cast("Q"), error, why)

    def unwatch(self) -> None:
        if self._watched is not None:
            self._watched[0].release()
            self._watched = None

    def _revoked_elsewhere(self) -> bool:
        """A peer's notice has set the transport's word (a plain load: the no-compiler
        transports' words are this process's, set with the GIL held)."""
        return self._watched is not None and self._watched[0][0] != 0

    def fork(self, error: type, message: str) -> None:
        self._forked = (error, message)

    def revoke(self, error: type, message: str) -> None:
        self._revoked = self._revoked or (error, message)

    def _refuse(self) -> None:
        """A call raises in a forked child, or on a revoked communicator."""
        if not self._forked and not self._revoked and self._revoked_elsewhere():
            _, error, why = self._watched
            self._revoked = (error, why())
        if refusal := self._forked or self._revoked:
            error, message = refusal
            raise error(*message) if isinstance(message, tuple) else error(message)

    def enter(self, kind: int, dtype: Any, op: str | None, root: int, nbytes: int,
              algorithm: int, timed: int) -> int:
        self._refuse()
        if not self._lock.acquire(False):
            return -1
        return self._begin(kind, dtype, op, root, nbytes, algorithm, timed, -1, -1)

    def enter_move(self, kind: int, dtype: Any, peer: int, tag: int, nbytes: int) -> int:
        self._refuse()
        if not self._lock.acquire(False):
            return -1
        return self._begin(kind, dtype, None, -1, nbytes, -1, 0, peer, tag)

    def begin(self, kind: int, dtype: Any, op: str | None, root: int, nbytes: int,
              algorithm: int) -> int:
        return self._begin(kind, dtype, op, root, nbytes, algorithm, 1, -1, -1)

    def _begin(self, kind: int, dtype: Any, op: str | None, root: int, nbytes: int,
               algorithm: int, timed: int, peer: int, tag: int) -> int:
        if len(self._calls) >= DEPTH:
            return DEPTH
        self._calls.append([0, kind, DTYPE_CODES.get(dtype, -1), OP_CODES.get(op, -1), root,
                            nbytes, algorithm, peer, tag, perf_counter() if timed else 0.0,
                            threading.get_ident(), True])
        return len(self._calls) - 1

    def end(self, slot: int) -> None:
        if 0 <= slot < len(self._calls):
            self._calls[slot][-1] = False
        while self._calls and not self._calls[-1][-1]:
            self._calls.pop()

    def leave(self, slot: int) -> None:
        self.end(slot)
        self._lock.release()

    def count(self, slot: int) -> int:
        self.completed += 1
        if 0 <= slot < len(self._calls):
            self._calls[slot][0] = self.completed
        return self.completed

    def record(self, slot: int) -> None:
        if not 0 <= slot < len(self._calls):
            return
        seq, kind, dtype, op, root, nbytes, algorithm, _, _, start, _, _ = self._calls[slot]
        self._last = (seq, kind, dtype, op, root, nbytes, algorithm, start,
                      perf_counter() if start else 0.0)
        if self.record_size and seq > 0:
            self._ring[seq % self.record_size] = self._last

    def done(self, slot: int) -> None:
        self.count(slot)
        self.record(slot)

    def calls(self) -> list[tuple]:
        return sorted((r for r in self._ring if r is not None), key=lambda r: r[0])

    def last(self) -> tuple | None:
        return self._last

    def current(self) -> tuple | None:
        for call in reversed(self._calls):
            if call[-1]:
                return tuple(call[:-1])
        return None


_DTYPES_BY_CODE = tuple(DTYPE_CODES)
# tbcoll.core._gate.LaneCall, and plain(kind, x, arg, out, size): whether a call of a lane's
# kind (LANE_KINDS' order) has arguments a one-call path takes as they are, the check every
# LaneCall makes (tbcoll/core/admits.h), for a direct path with no lane; None where not built
# (the entries' Collective.plain are then its twin)
LaneCall: Any = None
plain: Any = None
_gate = c_extension("tbcoll.core._gate")
if _gate is None:  # built without a compiler (or TBCOLL_NO_C=1)
    Gate: Any = PyGate
else:
    _gate.codes(tuple(DTYPE_CODES), tuple(OP_CODES))
    _gate.arrays(np.ndarray, _DTYPES_BY_CODE, OP_CODES)
    check_callbacks(_gate, ("one_call",))  # LaneCall's calls into Python
    Gate, LaneCall, plain = _gate.Gate, _gate.LaneCall, _gate.plain
# Whether the communicators' gate is C's: a C lane drives only that one, so where it is
# Python's no lane is bound (Communicator._bind_lane) and C and Python never share a gate.
C_GATE = Gate is not PyGate


def lane_call(lane: Any) -> Any:
    """The whole call around a transport's C lane (lane: its object, whose lane_capsule()
    offers tbcoll/include/lane.h's struct), as tbcoll.core._gate.LaneCall runs it: bind,
    limit, admits, direct and the calls of the Native.lane contract (tbcoll.core.protocols).
    None where there is no lane, or no gate extension to run it. Raises ImportError where the
    lane was built for another version of the interface."""
    if lane is None or LaneCall is None:
        return None
    return LaneCall(lane.lane_capsule(), ndarray=np.ndarray, dtypes=_DTYPES_BY_CODE,
                    ops=OP_CODES, empty=np.empty)
