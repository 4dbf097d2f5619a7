"""The collectives: one descriptor each, one file each (tbcoll.collectives.base.Collective says
what a descriptor holds), and the hook that registers more.

A descriptor is what a call of its collective needs of the Communicator's one dispatch
(tbcoll.comm.communicator.Communicator._run); it sees its communicator only through a
Context: rank and size, the transport's native and coll, the algorithm's choice, a nested
call. Its `call` checks
a public call's arguments where the user made it and returns a Call (the input as numpy, where
the result goes, op, root, the algorithm chosen). The dispatch then takes the first that
applies of: a world of one (`alone`), the transport's one-call path (built-ins only), its native
collective (`native`), the algorithm (`algorithm`, given `implementation(name)`), and returns
`finish`'s result. `prepare` makes the buffers the last two need. Nothing else in tbcoll knows
what a collective does with its buffers.

register_collective(descriptor) adds one: `comm.<name>(...)` and `comm.collective(name, ...)`
then run it on every transport, through its algorithms over P2P (natives stay the built-ins'),
recorded by the call gate and the flight recorder and named in the ranks' call-mismatch
errors like any call; tests/spmd runs its cases on every transport. Every rank must register
the same descriptors in the same order (their codes are positions), before it calls them: the
first call of a registered collective on a communicator compares the ranks' registries.
"""

from __future__ import annotations

from importlib.metadata import entry_points

from tbcoll.collectives.all_gather import ALL_GATHER
from tbcoll.collectives.all_reduce import ALL_REDUCE
from tbcoll.collectives.all_to_all import ALL_TO_ALL
from tbcoll.collectives.barrier import BARRIER
from tbcoll.collectives.base import ALGORITHMS, DESCRIPTORS, Collective, register
from tbcoll.collectives.broadcast import BROADCAST
from tbcoll.collectives.gather import GATHER
from tbcoll.collectives.reduce import REDUCE
from tbcoll.collectives.reduce_scatter import REDUCE_SCATTER
from tbcoll.collectives.scatter import SCATTER

ENTRY_POINTS = "tbcoll.collectives"  # installed packages' descriptors (name = module:object)

for _builtin in (ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, BROADCAST, BARRIER, ALL_TO_ALL, GATHER,
                 SCATTER, REDUCE):  # in tbcoll.algorithms.BUILT_IN's order: their codes
    register(_builtin)
ENTRIES = DESCRIPTORS  # (the name the routes and benchmarks/ know them by)

__all__ = ["ALGORITHMS", "ALL_GATHER", "ALL_REDUCE", "ALL_TO_ALL", "BARRIER", "BROADCAST",
           "DESCRIPTORS", "ENTRIES", "GATHER", "REDUCE", "REDUCE_SCATTER", "SCATTER", "Collective",
           "register_collective"]


def register_collective(descriptor: Collective) -> Collective:
    """Add a collective (a tbcoll.collectives.base.Collective instance) to every communicator:
    `comm.<name>(...)` and `comm.collective(name, ...)` run it. Register the same descriptors
    in the same order on every rank (each gets the next code of the calls' signatures), before
    calling any of them; the first call compares the ranks' registries and raises where they
    differ. Registering the same descriptor again changes nothing."""
    if not isinstance(descriptor, Collective):
        raise TypeError(f"register_collective takes a tbcoll.collectives.base.Collective "
                        f"instance, got {type(descriptor).__name__}")
    return register(descriptor)


def _load_entry_points() -> None:
    """The descriptors installed packages name in the entry point group tbcoll.collectives,
    in the order of their names (the same on every rank that has the same packages)."""
    for point in sorted(entry_points(group=ENTRY_POINTS), key=lambda p: p.name):
        register_collective(point.load())


_load_entry_points()
