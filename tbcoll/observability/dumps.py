"""A rank's dump, and how it reaches tbrun: its communicators' recent calls and the call each
is in now (their call gates, tbcoll.core.gate, as tbcoll.observability.recorder describes them),
with the user's line, and every thread's Python stack.

A rank sends a dump to tbrun's store when a call of its fails (Communicator._named), and when
tbrun asks: on a failure that tears the job down, on --timeout, and on demand (SIGUSR1 to
tbrun). A thread of the rank waits on the store for tbrun's requests, so that a rank answers
whatever its main thread is doing: waiting in a collective (tbcoll's waits release the GIL),
computing, sleeping, or stopped (tbrun sends SIGCONT first). Through the store, dumps of ranks
on other hosts come back the way everything else does, on every backend.
"""

from __future__ import annotations

import atexit
import faulthandler
import json
import os
import signal
import socket
import sys
import threading
import time
import traceback
from types import FrameType
from typing import Any

from tbcoll.core.errors import TbcollError
from tbcoll.core.gate import describe, in_progress, row
from tbcoll.job.env import LaunchInfo, launch_info, trace_chunk, tracing
from tbcoll.job.rendezvous import Store, tell_tbrun
from tbcoll.observability.dump_keys import (
    ANSWER_KEY,
    DUMP_KEY,
    LISTENING_KEY,
    REQUEST_KEY,
    STACKS_SIGNAL,
    TRACE_KEY,
)
from tbcoll.observability.recorder import (
    LIVE,
    Entry,
    call_site,
    clock_anchor,
    events,
    take_events,
    take_traced,
    trace_full,
    user_site,
)

_LISTENER = "tbcoll-dumps"  # the thread that answers tbrun (left out of the dumps)
_SEND_TIMEOUT = 2.0
_TRACE_TIMEOUT = 10.0
_TRACER = "tbcoll-trace"  # the thread that sends the calls under --trace (left out too)
_FLUSH_PERIOD = 1.0  # seconds between sends of the calls under --trace, at most
_LISTEN_PERIOD = 3600.0


def snapshot(reason: str, failed: Any = None, error: str = "") -> dict[str, Any]:
    """This process's dump now. failed: the communicator whose call raised error (its call in
    progress is marked failed)."""
    info = launch_info()
    threads = {t.ident: t for t in threading.enumerate()}
    stacks = sys._current_frames()
    comms = []
    for comm, watched in list(LIVE.items()):
        gate = watched.gate
        entry = {"ranks": list(watched.world_ranks), "rank": comm.rank, "size": comm.size,
                 "backend": comm.backend, "completed": gate.completed,
                 "calls": [describe(e) for e in gate.calls()],
                 "current": _current(gate, stacks)}
        if comm is failed and entry["current"] is not None:
            entry["current"].update(state="failed", error=error)
        comms.append(entry)
    return {"rank": info.rank if info else None, "host": socket.gethostname(),
            "pid": os.getpid(), "reason": reason, "clock": clock_anchor(), "communicators": comms,
            "failovers": list(events),
            "stacks": [{"thread": getattr(threads.get(ident), "name", str(ident)),
                        "main": ident == threading.main_thread().ident,
                        "site": call_site(frame), "frames": _stack(frame)}
                       for ident, frame in stacks.items()
                       if getattr(threads.get(ident), "name", "") not in (_LISTENER, _TRACER)]}


def _stack(frame: FrameType) -> list[str]:
    """A thread's stack, outermost call first, a line each: file:line in function: code
    (without this module's own frames: the dump being made)."""
    while frame is not None and frame.f_code.co_filename == __file__:
        frame = frame.f_back
    return [f"{f.filename}:{f.lineno} in {f.name}" + (f": {f.line}" if f.line else "")
            for f in traceback.extract_stack(frame)]


def _current(gate: Any, stacks: dict[int, FrameType]) -> dict[str, Any] | None:
    """The call a communicator's gate holds in progress, with the user's line that made it,
    read off the stack of the thread that runs it."""
    current = gate.current()
    if current is None:
        return None
    return in_progress(current, gate.completed, user_site(stacks.get(current[-1])))


def send(dump: dict[str, Any], store: Store | None = None) -> None:
    """Give tbrun this rank's dump (through store, or a connection of its own)."""
    tell_tbrun(DUMP_KEY, json.dumps(dump, default=str), _SEND_TIMEOUT, store)


_failure: dict[str, Any] | None = None  # the dump on_failure sent last


def on_failure(comm: Any, world_rank: int, message: str) -> None:
    """A call of comm (this rank's world rank: world_rank) raised: tell tbrun where this rank
    was (outside a tbrun job there is no one to tell, and no stack is read)."""
    global _failure
    if launch_info() is not None:
        _failure = snapshot(f"rank {world_rank} failed: {message}", comm, message)
        send(_failure)


_listening = threading.Lock()


def start_listening(info: LaunchInfo | None) -> None:
    """Answer tbrun's requests for dumps from a thread of this process (once per process),
    and send the trace at exit under --trace. The rank says it listens before init returns:
    a request made from then on is answered."""
    if info is None or not _listening.acquire(blocking=False):
        return
    if tracing():
        _start_tracing(info)
    _stacks_on_signal()
    try:
        store = Store(*info.store, info.token, timeout=_LISTEN_PERIOD)
        store.set(LISTENING_KEY.format(info.rank), "1")
    except TbcollError:
        return
    threading.Thread(target=_listen, args=(store, info.rank), name=_LISTENER,
                     daemon=True).start()


def _stacks_on_signal() -> None:
    """On STACKS_SIGNAL, write every thread's Python stack to stderr from the signal handler
    itself (faulthandler): what tbrun asks of a rank whose dump thread did not answer, stuck
    in C code that holds Python's lock. Not where the program handles that signal itself."""
    try:
        if signal.getsignal(STACKS_SIGNAL) == signal.SIG_DFL:
            faulthandler.register(STACKS_SIGNAL, all_threads=True)
    except (ValueError, OSError, RuntimeError):  # not the main thread; no stderr
        pass


def _listen(store: Store, rank: int) -> None:
    n = 1
    while True:
        asked = time.monotonic()
        try:
            reason = store.get(REQUEST_KEY.format(n)).decode(errors="replace")
        except TbcollError:
            if time.monotonic() - asked < _LISTEN_PERIOD:
                return  # the store went away: the job is over
            continue  # nothing asked within the period: ask again
        dump = snapshot(reason)
        if _failure is None or any(c["current"] for c in dump["communicators"]):
            send(dump, store)  # else the failure's dump says more: where the rank failed
        try:
            store.set(ANSWER_KEY.format(n, rank), "1")
        except TbcollError:
            return
        n += 1


class _TraceSender:
    """Under tbrun --trace: this process's calls, sent to tbrun's store in chunks of
    trace_chunk() calls as the job runs (when a communicator holds a chunk's worth, and every
    FLUSH_PERIOD), from a thread of its own over a connection of its own, and the rest at
    exit (marked last). What a rank holds stays within about a chunk; one killed loses only
    what it had not sent."""

    def __init__(self, info: LaunchInfo) -> None:
        self._rank = info.rank
        self._store = Store(*info.store, info.token, timeout=_TRACE_TIMEOUT,
                            connect_timeout=_TRACE_TIMEOUT)
        self._chunk = trace_chunk()
        self._clock = clock_anchor()  # one for every chunk: tbrun shifts them alike
        self._host = socket.gethostname()
        self._sent = 0
        self._lock = threading.Lock()  # one sender at a time on the connection
        self._done = False
        self._pid = os.getpid()

    def run(self) -> None:
        while not self._done:
            trace_full.wait(_FLUSH_PERIOD)
            trace_full.clear()
            if not self._send(last=False):
                return

    def finish(self) -> None:
        """At exit: the calls not sent yet, the last chunk (not from a forked child: the
        connection is its parent's)."""
        if os.getpid() == self._pid:
            self._send(last=True)

    def _send(self, last: bool) -> bool:
        """Send what the communicators hold; False once there is no more to do (the job or
        this process is over, or the store is gone)."""
        if not self._lock.acquire(timeout=_TRACE_TIMEOUT):
            return False
        try:
            if self._done:
                return False
            self._done = last
            comms, rows = trace_rows(take_traced())
            failovers = take_events()
            for start in range(0, len(rows), self._chunk):
                self._put(comms, rows[start:start + self._chunk], False)
            if failovers or last:
                self._put([], [], last, failovers)
            return not last
        except (OSError, TbcollError):
            self._done = True
            return False
        finally:
            self._lock.release()

    def _put(self, comms: list[list[int]], rows: list[tuple], last: bool,
             failovers: list[dict[str, Any]] | None = None) -> None:
        self._sent += 1
        text = json.dumps({"rank": self._rank, "host": self._host, "clock": self._clock,
                           "comms": comms, "calls": rows, "last": last,
                           "failovers": failovers or []}, default=str)
        self._store.set(TRACE_KEY.format(self._rank, self._sent), text)


def trace_rows(taken: list[tuple[tuple[int, ...], list[tuple[Entry, str]]]]
               ) -> tuple[list[list[int]], list[tuple]]:
    """What take_traced() took as (communicators, rows: their communicator's index, then
    tbcoll.observability.recorder.TRACE_ROW's fields): plain values, cheap to encode (a dict a call
    took twice the time, in the rank, while it runs). Calls not timed are left out (the one-call
    paths'; no call takes them under --trace)."""
    comms = [list(members) for members, _ in taken]
    rows = []
    for index, (_, calls) in enumerate(taken):
        for record, site in calls:
            if record[-2]:  # (its start)
                seq, collective, dtype, op, root, nbytes, algorithm, start, end = row(record)
                rows.append((index, seq, collective, dtype, nbytes, op, root, algorithm, start,
                             end, site))
    return comms, rows


def _start_tracing(info: LaunchInfo) -> None:
    try:
        sender = _TraceSender(info)
    except (OSError, TbcollError):
        return
    atexit.register(sender.finish)
    threading.Thread(target=sender.run, name=_TRACER, daemon=True).start()
