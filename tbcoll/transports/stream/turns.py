"""How several threads share one stream engine (tbcoll.transports.stream).

Every communicator that split from one tcp (or rdma) world shares its connections, and so its
engine: the staged bytes, the half-read messages, the queues. A thread per communicator (as
docs/api.md advises), or a progress thread beside the caller's, must therefore take turns in the
engine, and one thread's wait must never stop another thread from sending what a peer waits
for (the peer's answer may be what the first thread waits for: a cycle across ranks).

Turns is the engine's lock, held by whoever moves bytes or changes the engine's state. A wait
never holds it for long:
- where the transport can wait with the engine released (tcp: poll() on the sockets), one
  thread at a time waits for everyone (wait_released) and the others sleep until it has moved
  what came; a thread that needs the waiting thread to watch more (a send stalled on a full
  socket) wakes it (the transport's own wake-up);
- where it cannot (rdma's device, held bytes under TBCOLL_LINK_DELAY_US), waits are cut into
  short slices once a second thread has used the engine, and between slices a thread that
  waits to enter goes first (pass_turn).
A thread alone keeps its C paths' longer waits; `shared` (sticky, set the first time a thread
finds the engine taken) tells the transport to cut the waits it makes in C with the engine held
(tcp: to their 50 us spin).
"""

from __future__ import annotations

import threading
from array import array
from collections.abc import Callable
from typing import Any

from tbcoll.transports.stream.words import ENGINE_WORD, STALE

SHARED_SLICE = 1e-3  # seconds a wait holds a shared engine before others may take a turn


class Turns:
    """The lock of one engine, taken with `with turns:` by every door into it."""

    __slots__ = ("_lock", "_door", "_moved", "shared", "shared_word", "polling", "_sleepers")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # A thread that found the engine taken waits holding the door: the holder, passing its
        # turn, cannot take the engine back before that thread has had it (Lock is not fair).
        self._door = threading.Lock()
        self._moved = threading.Condition(self._lock)
        self.shared = False  # more than one thread has wanted the engine at once
        self.shared_word = array("Q", [0])  # the same, for the C lanes to read (1: shared)
        self.polling = False  # a thread waits for everyone with the engine released
        self._sleepers = 0  # threads waiting for that thread to move what came

    def __enter__(self) -> Turns:
        if not self._lock.acquire(False):
            self.shared = True
            self.shared_word[0] = 1
            with self._door:
                self._lock.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._sleepers:  # what this thread moved may have completed theirs
            self._moved.notify_all()
        self._lock.release()

    @property
    def lock(self) -> threading.Lock:
        """The engine's lock itself, for a C path that takes the engine without a door
        (acquire(False), else it leaves the call to a door) and gives it back with release().
        Whatever that path moves is its own call's, which no thread sleeping here waits for;
        where it has the engine move more, the engine ends with moved()."""
        return self._lock

    def moved(self) -> None:
        """What a door does on leaving, but the release: for the engine run by a C path that
        holds the lock (see lock)."""
        if self._sleepers:
            self._moved.notify_all()

    def pass_turn(self) -> None:
        """Between two slices of a wait that holds the engine: let a thread that waits to
        enter go first (nothing where no other thread ever wanted the engine)."""
        if self.shared:
            self._lock.release()
            with self._door:
                self._lock.acquire()

    def wait_released(self, wait: Callable[[float], Any], timeout: float) -> Any:
        """wait(timeout) with the engine released, if no other thread is waiting so; else sleep
        until that thread has the engine back (to move what came), or timeout, and return None.
        The caller holds the engine before and after."""
        if self.polling:
            self._sleepers += 1
            try:
                self._moved.wait(timeout)
            finally:
                self._sleepers -= 1
            return None
        self.polling = True
        self._lock.release()
        try:
            return wait(timeout)
        finally:
            self._lock.acquire()
            self.polling = False
            if self._sleepers:  # they look again once this thread has moved what came
                self._moved.notify_all()


class Marking(Turns):
    """An engine's Turns that mark its words STALE as each door leaves the engine (with the
    engine still held): a C path has the engine publish them before it tests one
    (tbcoll.transports.stream's publish_words). Publishing at each door's exit instead cost
    ~0.4 us of CPU per door more (shm, np=2, measured under load), on every message that does
    not take a C path (a 2-D array's, a Python collective's)."""

    __slots__ = ("words",)

    def __init__(self, words: Any) -> None:
        super().__init__()
        self.words = words

    def __exit__(self, kind: object, error: object, trace: object) -> None:
        # (Turns.__exit__ written out: it is on every door's path; named arguments: *exc costs
        # more)
        self.words[ENGINE_WORD] = STALE
        if self._sleepers:
            self._moved.notify_all()
        self._lock.release()

    def moved(self) -> None:
        self.words[ENGINE_WORD] = STALE
        Turns.moved(self)
