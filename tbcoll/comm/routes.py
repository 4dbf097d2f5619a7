"""The route of each latency-critical call, chosen once: bind once, call once.

A Communicator's all_reduce, all_gather, reduce_scatter and broadcast (the calls a transport
may make in one step) and its send and recv each have one route, chosen when the communicator
is made and again on the few events that change it (Communicator._bind: the first
non-blocking call, close), never per call. Whether a call may take a one-call path is asked
there, once per transport, of: per-call checks (TBCOLL_CHECK: never), --trace (never for the
collectives: their calls are timed), TBCOLL_ALGO and the tuning table (native, at every size
or up to a size), and the transport's offers: its C lane (Native.lane, tbcoll.core.protocols:
shm's, tcp's small all_reduce, rdma's mesh), which takes the whole call up to the table's
size, else its direct path (behind that size).

The route of a call is its public method: its first step, bound on the communicator
(Communicator._bind puts each of first_steps in _first_<name>; None: none), else the general
path, where the registry entry checks and describes the call and Communicator._run runs it
(tbcoll.collectives). The first step is the C lane's call, or `gated` around the
transport's direct path; where it returns None (a call it does not take: an mlx array, a
strided x, a wrong argument, the communicator busy), or where algorithm= is given, the
general path runs. The method reads its first step from the instance, so that a method a
caller keeps (f = comm.all_reduce) follows the events too. Measured with a C stand-in for
the lane (Python 3.11, per call): main's method, which asked for the lane, 212 ns; this, 190;
a closure put in the instance, 222; a one-line method calling a route object, ~+200. The
first steps hold no reference to the communicator (the lane's namer and `gated`'s are weak),
so a dropped split is still collected at once (tbcoll.comm.ownership.track).

Non-blocking calls: after the first one, a blocking call must wait for the queued ones
(tbcoll.comm.requests.Progress.run). The lane cannot see that queue, so it was dropped then, on that
rank only: its blocking calls took the Python path while the other ranks' took the lane, two
implementations of one collective, correct only as long as native.py's and one_copy.c's one-copy
rounds stay "wire-compatible by construction". Here every route keeps its first step and runs
it through the progress queue instead (queued): the same C call, after the queued ones, on
every rank whatever calls it made before, recorded alike in the flight recorder (untimed,
algorithm native). send and recv take the Python path then (the engine's, whose messages the
lane's moves share the wire with: moves.c is the engine's C part, not a second protocol).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from functools import partial
from typing import Any

from tbcoll.collectives import ALL_GATHER, ALL_REDUCE, BROADCAST, ENTRIES, REDUCE_SCATTER
from tbcoll.collectives.base import Collective
from tbcoll.core.errors import CommError
from tbcoll.core.gate import NATIVE
from tbcoll.core.gate import plain as c_plain
from tbcoll.core.names import LANE_KINDS

ROUTED = tuple(ENTRIES[name] for name in LANE_KINDS)  # in the order of the C lane's kinds


def gated(comm: Any, entry: Collective, path: Callable) -> Callable:
    """The transport's direct path as a route's first step, first(x, arg, out) (all_gather:
    first(x, out)), as the lane makes it in C: taken only for a plain call (the lane's check of
    the arguments, tbcoll.gate.plain; entry.plain where C is not built), in the call gate,
    counted and recorded untimed (a clock read cost as much as the rest of its record), no
    call described (~0.7 us of a 2 us call); None where the path declines or the gate is held
    (the general path then waits, or raises)."""
    gate, code, name, size = comm._gate, entry.code, entry.name, comm.size
    plain = entry.plain if c_plain is None else partial(c_plain, ROUTED.index(entry))
    named = weakref.WeakMethod(comm._named)
    takes_op, takes_root = entry in (ALL_REDUCE, REDUCE_SCATTER), entry is BROADCAST

    def first(x: Any, arg: Any, out: Any) -> Any:
        if not plain(x, arg, out, size):
            return None
        op, root = (arg, -1) if takes_op else (None, arg if takes_root else -1)
        if (slot := gate.enter(code, x.dtype, op, root, x.nbytes, NATIVE, 0)) < 0:
            return None
        try:
            result = path(x, op, root, out)
            if result is not None:
                gate.done(slot)
            return result
        except CommError as e:
            raise named()(e, name) from e
        except BaseException as e:
            if (namer := named()) is not None:
                namer(e, name)  # (an interruption revokes)
            raise
        finally:
            gate.leave(slot)

    if entry is ALL_GATHER:  # (the lane's signature: no op or root)
        return lambda x, out: first(x, None, out)
    return first


def queued(gate: Any, code: int, progress: Any, first: Callable) -> Callable:
    """first, after the calls queued on the progress thread (see the module docstring). The
    call gate is taken while the queue drains, as the general path takes it (so that another
    thread's call meanwhile raises at once, tbcoll.comm.ownership), and handed to first, which
    takes it itself (None, the general path's error, where another thread got it between)."""
    run = progress.run

    def after_the_queue(*args: Any) -> Any:
        if (slot := gate.enter(code, None, None, -1, -1, -1, 0)) < 0:
            return None  # another thread's call: the general path says so
        held = [slot]

        def handed_over() -> Any:
            gate.leave(held.pop())
            return first(*args)

        try:
            return run(handed_over)
        finally:
            if held:
                gate.leave(held[0])

    return after_the_queue


NAMES = (*(entry.name for entry in ROUTED), "send", "recv")  # the calls that have routes


def first_steps(comm: Any) -> dict[str, Callable]:
    """Each routed call's first step on comm now (see the module docstring); absent: none."""
    steps: dict[str, Callable] = {}
    lane, progress = comm._lane, comm._progress
    for entry in ROUTED:
        if entry in comm._lane_kinds:
            first = getattr(lane, entry.name)
        elif (path := comm._quick[entry]) is not None:
            first = gated(comm, entry, path)
        else:
            continue
        steps[entry.name] = first if progress is None else queued(comm._gate, entry.code,
                                                                  progress, first)
    if comm._lane_moves and progress is None:
        steps.update(send=lane.send, recv=lane.recv)
    return steps
