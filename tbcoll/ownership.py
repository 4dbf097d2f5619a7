"""Who may call a communicator: one thread at a time, of the process that made it.

A rank's calls pair with the other ranks' in the order the rank makes them. Two threads of
one rank calling the same communicator at once would pair their calls with the other ranks'
in an order nobody chose (all_reduce(a) on one rank adding to all_reduce(b) on another) and,
on shm, tear each other's results: the second thread's call raises at once instead. Use one
communicator per thread (comm.split) or let one thread make the calls; non-blocking calls
(iall_reduce, ...) are the way to overlap. A blocking call made while non-blocking ones are
queued waits for them (tbcoll.requests.Progress), so that the collectives keep their order.

A child made by os.fork() inherits the rank's communicators, but it is not that rank: its
calls raise, and neither its close() nor its garbage collector touches the parent's
connections and segments (release_when_collected).
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any

from tbcoll.errors import TbcollError


class Guard:
    """Held by the user thread whose call runs (the progress thread never takes it); counts
    the collective calls completed (their tbcoll.calls sequence numbers), so that a
    transport's C lane (tbcoll/shm/lane.c), which takes the guard itself, counts them too."""

    __slots__ = ("lock", "call", "forked", "completed")

    def __init__(self) -> None:
        self.lock: Any = threading.Lock()
        self.call: Any = ""  # what the holder called (a name, or a tbcoll.collectives.Call)
        self.forked = False  # this process is a child of the one that made the communicator
        self.completed = 0  # collective calls completed on the communicator

    def busy(self, rank: int, what: str) -> TbcollError:
        """The error for a call that finds the lock held by another thread."""
        running = getattr(getattr(self.call, "kind", None), "name", self.call)
        return TbcollError(
            f"rank {rank}: {what} was called on a communicator that another thread is using "
            f"({running}): calls on one communicator must come from one thread at a time, "
            "since each rank's calls pair with the others' in the order they are made (use "
            "comm.split for a communicator per thread, or the non-blocking calls)")


class _ForkedLock:
    """A communicator's lock in a child made by os.fork(): every call raises."""

    def __init__(self, rank: int, parent: int) -> None:
        self._rank, self._parent = rank, parent

    def acquire(self, blocking: bool = True) -> bool:
        raise TbcollError(
            f"this communicator belongs to rank {self._rank}, process {self._parent}; a child "
            f"made by os.fork() (this is process {os.getpid()}) cannot take the rank's place "
            "in collectives: compute in the child and hand results back to the parent, or "
            "start the child's own job with tbrun")


_live: weakref.WeakSet = weakref.WeakSet()  # every communicator of this process


def track(communicator: Any, group: Any) -> weakref.finalize:
    """Watch communicator for os.fork() (see _after_fork_in_child), and close its transport
    group when it is collected, unless this is a forked child: a dropped split would
    otherwise keep its shared memory and descriptors (2000 dropped splits, 2000 files: macOS
    allows 256). Calling the result closes the group now, once."""
    _live.add(communicator)
    return weakref.finalize(communicator, _release, group, communicator._guard)


def live_communicators() -> list[Any]:
    """Every communicator of this process not yet collected."""
    return list(_live)


def _release(group: Any, guard: Guard) -> None:
    if not guard.forked:
        group.close()


def _after_fork_in_child() -> None:
    parent = os.getppid()
    for communicator in list(_live):
        communicator._guard.lock = _ForkedLock(communicator.rank, parent)
        communicator._guard.forked = True


os.register_at_fork(after_in_child=_after_fork_in_child)
