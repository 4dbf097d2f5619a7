"""Who may call a communicator: one thread at a time, of the process that made it.

A rank's calls pair with the other ranks' in the order the rank makes them. Two threads of
one rank calling the same communicator at once would pair their calls with the other ranks'
in an order nobody chose (all_reduce(a) on one rank adding to all_reduce(b) on another) and,
on shm, tear each other's results: the second thread's call raises at once instead. Use one
communicator per thread (comm.split) or let one thread make the calls; non-blocking calls
(iall_reduce, ...) are the way to overlap. A blocking call made while non-blocking ones are
queued waits for them (tbcoll.comm.requests.Progress), so that the collectives keep their order.

The communicator's call gate (tbcoll.core.gate) is the lock: a call takes it without waiting.
A child made by os.fork() inherits the rank's communicators, but it is not that rank: its
calls raise (the gate's fork()), and neither its close() nor its garbage collector touches
the parent's connections and segments (track).
"""

from __future__ import annotations

import os
import weakref
from typing import Any

from tbcoll.core.errors import TbcollError
from tbcoll.core.names import KINDS
from tbcoll.observability.recorder import LIVE, Watched


def busy(rank: int, what: str, gate: Any) -> TbcollError:
    """The error for a call that finds the communicator's call gate (tbcoll.core.gate) held by
    another thread's call."""
    current = gate.current()
    running = KINDS[current[1]] if current is not None else "a call"
    return TbcollError(
        f"rank {rank}: {what} was called on a communicator that another thread is using "
        f"({running}): calls on one communicator must come from one thread at a time, "
        "since each rank's calls pair with the others' in the order they are made (use "
        "comm.split for a communicator per thread, or the non-blocking calls)")


def track(communicator: Any, group: Any, gate: Any, world_ranks: tuple[int, ...]
          ) -> weakref.finalize:
    """Watch communicator for os.fork() (see _after_fork_in_child), and close its transport
    group when it is collected, unless this is a forked child: a dropped split would
    otherwise keep its shared memory and descriptors (2000 dropped splits, 2000 files: macOS
    allows 256). Calling the result closes the group now, once."""
    LIVE[communicator] = Watched(gate, world_ranks)
    return weakref.finalize(communicator, _release, group, gate)


def _release(group: Any, gate: Any) -> None:
    if not gate.forked:
        gate.unwatch()  # the group's revocation word may be in memory its close unmaps
        group.close()


def _after_fork_in_child() -> None:
    """Every communicator's calls raise in this child (its gate says why)."""
    parent = os.getppid()
    for communicator, watched in list(LIVE.items()):
        watched.gate.fork(TbcollError, (
            f"this communicator belongs to rank {communicator.rank}, process {parent}; a child "
            f"made by os.fork() (this is process {os.getpid()}) cannot take the rank's place "
            "in collectives: compute in the child and hand results back to the parent, or "
            "start the child's own job with tbrun"))


os.register_at_fork(after_in_child=_after_fork_in_child)
