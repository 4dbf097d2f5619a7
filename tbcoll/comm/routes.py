"""One Route per (communicator, collective): what a call may take, chosen once.

A Communicator's public methods are one line each (mpi4py's shape): all_reduce is
`return self._all_reduce(x, op, algorithm, out)`, where _all_reduce is the bound route's call.
A Route holds what the call may take, in the order it is tried: its first step, the
transport's C lane (shm's, tcp's small all_reduce, rdma's mesh: Native.lane,
tbcoll.core.protocols) up to the lane's limit, else the transport's direct path in the call
gate (`gated`) up to the table's; then the general path, where the registry entry checks
and describes the call and Communicator._run runs it: a world of one, the direct path again
(algorithm "native" under the general path's checks), the native collective, or the
algorithm (tbcoll.collectives). Routes are built once, when the communicator is made, and
again on the few events that change them (the first non-blocking call, comm.empty's
allocations, close: Communicator._bind), never per call.

Declining downward once. The route's call (tbcoll.comm._route.Call, in C) takes the first
step only where it may take the call: no algorithm= (nor all_gather's counts=) and x within the
largest size the first step takes, known at bind (the lane's limits: `limit(kind)` says what
a bound call of that kind takes now, None for every size; the table's native size for a
direct path). A call past it goes straight to the general path, never into the lane to be
refused. shm's lane takes every size of every kind (its rounds past one slot:
tbcoll/transports/shm), so a plain shm collective of any size is one C call from Python; tcp's
takes all_reduce up to 1 MiB (tbcoll.transports.tcp.native._WHOLE) and the table's size at
np 3-4.

The one admission test. Whether a call's arguments may take a first step as they are is
asked of one C function (tbcoll/core/admits.c): a lane's LaneCall asks it before each call
(with the lane's limits), and `gated` asks it too (tbcoll.core.gate.plain; the registry
entry's `plain` is its Python twin where C is not built); where it says no, the call goes to
the general path, which checks, converts and raises. The size the route checks first is the
lane's own limits, read at bind (LaneCall.limit(kind)), not a second test.

The same implementation on every rank. A first step that leaves a call (returns None) has
touched nothing, and the general path it leaves to runs the same protocol (shm: the same
rounds, its lane never declines for timing; tcp: the same exchange, whole up to _WHOLE and in
halves past it at np=2, whichever path took it). Sizes decide the route, and every rank's call
agrees on its size: a rank that arrives late takes the same route as one that arrived first.

Non-blocking calls: after the first one, a blocking call must wait for the queued ones
(tbcoll.comm.requests.Progress.run). The lane cannot see that queue, so every route keeps its
first step and runs it through the progress queue (`queued`): the same C call, after the
queued ones, on every rank whatever calls it made before. send and recv take the general path then
(the engine's, whose messages the lane's moves share the wire with).

Nothing here reads the Communicator: it hands Routes what the routes need when it makes them
(its group's table and native collectives, its gate, its namer, weakly) and the general paths
(weakly held: a dropped split is still collected at once, tbcoll.comm.ownership.track).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from functools import partial
from typing import Any

from tbcoll.collectives import ALL_GATHER, ALL_REDUCE, BROADCAST, ENTRIES, REDUCE_SCATTER, tuning
from tbcoll.collectives.base import Collective
from tbcoll.core.callbacks import checked
from tbcoll.core.errors import CommError
from tbcoll.core.extensions import c_extension
from tbcoll.core.gate import C_GATE, NATIVE, lane_call
from tbcoll.core.gate import plain as c_plain
from tbcoll.core.names import KIND_CODES, LANE_KINDS

_route = c_extension("tbcoll.comm._route")  # None: built without a compiler, or TBCOLL_NO_C
Call = None if _route is None else _route.Call

ROUTED = tuple(ENTRIES[name] for name in LANE_KINDS)  # in the order of the C lane's kinds
NAMES = (*(entry.name for entry in ROUTED), "send", "recv")  # the calls that have routes
_SEND, _RECV = KIND_CODES["send"], KIND_CODES["recv"]
_MOVES = 1 << len(ROUTED)  # a lane's bind: send and recv (bit k: ROUTED[k])

# each route's public arguments, by name, in the order its public method and its general path
# take them (C forwards them by position: tests/library/test_routes.py holds both methods to
# these names); those its first step takes, in its order; those that must be None for the
# first step to take the call
ARGUMENTS = {
    "all_reduce": (("x", "op", "algorithm", "out"), ("x", "op", "out"), ("algorithm",)),
    "all_gather": (("x", "algorithm", "out", "counts"), ("x", "out"), ("algorithm", "counts")),
    "reduce_scatter": (("x", "op", "algorithm", "out"), ("x", "op", "out"), ("algorithm",)),
    "broadcast": (("x", "root", "algorithm", "out"), ("x", "root", "out"), ("algorithm",)),
    "send": (("x", "dst", "tag"), ("x", "dst", "tag"), ()),
    "recv": (("out_or_like", "src", "tag"), ("out_or_like", "src", "tag"), ()),
}


class Route:
    """What one collective (or send, or recv) of one communicator may take: its first step
    (None: none) up to `largest` bytes of x (None: every size), the transport's direct path
    (for algorithm "native" on the general path), and `call`, the one callable its public
    method calls."""

    __slots__ = ("name", "first", "largest", "direct", "call")

    def __init__(self, name: str, first: Callable | None, largest: int | None,
                 direct: Callable | None, general: Callable) -> None:
        self.name, self.first, self.largest, self.direct = name, first, largest, direct
        names, picked, nones = ARGUMENTS[name]
        self.call = (Call or PyCall)(first=first, general=general, nargs=len(names),
                                     picks=tuple(names.index(n) for n in picked),
                                     nones=tuple(names.index(n) for n in nones),
                                     largest=-1 if largest is None else largest).run


class PyCall:
    """tbcoll.comm._route.Call's twin, where it is not built: the same fields and run."""

    def __init__(self, *, first: Callable | None, general: Callable, nargs: int,
                 picks: tuple[int, ...], nones: tuple[int, ...], largest: int) -> None:
        self.first, self.largest = first, None if largest < 0 else largest
        self._general, self._picks, self._nones = general, picks, nones

    def run(self, *args: Any) -> Any:
        if self.first is not None and all(args[i] is None for i in self._nones) and (
                self.largest is None
                or getattr(args[0], "nbytes", self.largest + 1) <= self.largest):
            result = self.first(*(args[i] for i in self._picks))
            if result is not None:
                return result
        return self._general(*args)


class Routes:
    """A communicator's routes: what its transport offers it (bound once, here) and the
    Route of each routed call (bind, on each event that changes them)."""

    def __init__(self, *, group: Any, size: int, fixed: dict[str, str | None], gate: Any,
                 named: Callable, checks: bool, traced: bool, max_tag: int) -> None:
        """group: the communicator's (its tuning table and native collectives); fixed: the
        algorithm of each collective where the size does not decide it (Context.fixed);
        named: the communicator's namer (held weakly); checks: TBCOLL_CHECK, which takes no
        one-call path; traced: --trace, whose collectives take the general path (timed)."""
        self._table, self._size, self._fixed, self._gate = group.tuning, size, fixed, gate
        self._named = weakref.WeakMethod(named)
        native = None if checks or size == 1 else group.native
        # the transport's one-call paths (Native.direct_*), for algorithm "native"
        self.direct: dict[str, Callable | None] = {entry.name: None for entry in ROUTED}
        if native is not None:
            self.direct.update(all_reduce=native.direct_all_reduce,
                               all_gather=native.direct_all_gather,
                               broadcast=native.direct_broadcast,
                               reduce_scatter=native.direct_reduce_scatter)
        # the collectives whose first step the table takes, and up to which size (None: every)
        self._quick = {entry: self._native_first(entry) for entry in ROUTED
                       if not traced and self.direct[entry.name] is not None}
        self._quick = {entry: limit for entry, limit in self._quick.items() if limit is not False}
        self.lane, self._lane_kinds, self._lane_moves = self._bind_lane(native, named, max_tag)

    def _native_first(self, entry: Collective) -> int | None | bool:
        """The largest x the table takes native at the smallest sizes (None: every size), or
        False where it does not."""
        name = entry.name
        if (fixed := self._fixed[name]) is not None:  # TBCOLL_ALGO, or the table at every size
            return None if fixed == "native" else False
        native, limit = tuning.native_up_to(self._table, name, self._size)
        if not native:
            return False
        return None if limit is None else limit // (self._size if entry is ALL_GATHER else 1)

    def _bind_lane(self, native: Any, named: Callable, max_tag: int
                   ) -> tuple[Any, frozenset[Collective], bool]:
        """The transport's C lane (Native.lane), bound to this communicator's gate, for the
        collectives whose first step the table takes (up to the table's size, which the lane
        is told: limit()), and send and recv where it moves messages: the lane, the
        collectives it took and whether it took send and recv (its bind says)."""
        lane = getattr(native, "lane", None)
        if lane is None or not C_GATE:  # (a lane drives only C's gate)
            return None, frozenset(), False
        lane = lane_call(lane)  # (its whole call: tbcoll.core._gate.LaneCall)
        served = [k for k, entry in enumerate(ROUTED) if entry in self._quick]
        # (every error goes to the namer, which names a CommError and sees an interruption)
        checked("named", named)  # C calls namer() with (error, what)
        taken = lane.bind(gate=self._gate,
                          codes=(*(entry.code for entry in ROUTED), _SEND, _RECV, NATIVE),
                          names=tuple(entry.name for entry in ROUTED),
                          enabled=sum(1 << k for k in served) | _MOVES, max_tag=max_tag,
                          comm_error=BaseException, namer=self._named)
        for k in served:
            if taken & 1 << k and (limit := self._quick[ROUTED[k]]) is not None:
                lane.limit(k, limit)
        return (lane, frozenset(entry for k, entry in enumerate(ROUTED) if taken & 1 << k),
                bool(taken & _MOVES))

    def bind(self, progress: Any, general: dict[str, Callable]) -> dict[str, Route]:
        """Each routed call's Route now: progress, the communicator's progress thread (None
        until its first non-blocking call); general, each call's general path by name."""
        routes = {}
        for k, entry in enumerate(ROUTED):
            name, first, largest = entry.name, None, None
            if entry in self._lane_kinds:
                first, largest = getattr(self.lane, name), self.lane.limit(k)
            elif entry in self._quick:
                first, largest = gated(self._gate, self._size, self._named, entry,
                                       self.direct[name]), self._quick[entry]
            if first is not None and progress is not None:
                first = queued(self._gate, entry.code, progress, first)
            routes[name] = Route(name, first, largest, self.direct[name], general[name])
        moves = self._lane_moves and progress is None
        for name in ("send", "recv"):
            routes[name] = Route(name, getattr(self.lane, name) if moves else None, None, None,
                                 general[name])
        return routes

    def close(self) -> None:
        """No first step and no direct path from now on: every call takes the general path
        (which refuses a closed communicator's calls)."""
        self.lane, self._lane_kinds, self._lane_moves = None, frozenset(), False
        self.direct = dict.fromkeys(self.direct)
        self._quick = {}


def gated(gate: Any, size: int, named: weakref.WeakMethod, entry: Collective,
          path: Callable) -> Callable:
    """The transport's direct path as a route's first step, first(x, arg, out) (all_gather:
    first(x, out)), as the lane makes it in C: taken only for a plain call (the one
    admission test of the arguments: the lane's, tbcoll.core.gate.plain; entry.plain, its
    Python twin, where C is not built), in the call gate, counted and recorded untimed (a
    clock read cost as much as the rest of its record), no call described (~0.7 us of a 2 us
    call); None where the path declines or the gate is held (the general path then waits, or
    raises)."""
    code, name = entry.code, entry.name
    plain = entry.plain if c_plain is None else partial(c_plain, ROUTED.index(entry))
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
