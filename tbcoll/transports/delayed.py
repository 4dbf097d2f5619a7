"""Emulated link latency for the tcp transport (TBCOLL_LINK_DELAY_US), for benchmarks that
show what a link's latency does to a job (benchmarks/tp_latency.py); the kernel here has no
netem. A message counts as arrived `delay` seconds after it was sent (or when it arrives, if
later), as over a link of that one-way latency; messages in a row overlap their delays, as
on a wire. Below what this machine's loopback and Python take (~10 us) it changes nothing.

The bytes travel at once; each message is preceded by a stamp (a message of a context no
communicator uses, carrying the sender's time.perf_counter()), and the receiver completes it
only once stamp + delay has passed. Holding messages at the receiver rather than the sender
keeps the emulation right while ranks compute: a held send would leave only at its rank's
next wait. It needs one clock for every rank, as the namespace hosts on one machine have
(CLOCK_MONOTONIC; mach_absolute_time on macOS): it is for emulation, never for real hosts.
A rank waiting for a message that is due spins (yielding its core) rather than sleeps, which
would add poll()'s 30-50 us wake-up. Only a job that sets the variable uses this class:
plain tcp pays nothing for it.
"""

from __future__ import annotations

import bisect
import os
import struct
import time
from collections.abc import Iterable

from tbcoll.calls import NO_CALL
from tbcoll.transports.stream import Peer, _Recv, _Send, _Unexpected
from tbcoll.transports.tcp import TcpTransport

_STAMP_CONTEXT = 0xFFFFFFFF  # contexts count up from 0 in steps of 2 per communicator
_STAMP = struct.Struct("!d")


class _Stamp:
    """The target of a stamp message: where its 8 bytes land."""

    __slots__ = ("data",)

    def __init__(self) -> None:
        self.data = bytearray(_STAMP.size)


class DelayedTcpTransport(TcpTransport):
    def __init__(self, *args, delay: float, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._delay = delay
        self._sent_at: dict[Peer, float] = {}  # the stamp of the message now arriving
        self._due: list[tuple[float, int, _Recv | _Unexpected, Peer]] = []  # sorted by time
        self._arrivals = 0  # ties in _due keep their order

    def _queue(self, peer: Peer, views: list[memoryview]) -> _Send:
        stamp = (self._header(_STAMP_CONTEXT, 0, _STAMP.size, *NO_CALL)
                 + _STAMP.pack(time.perf_counter()))
        return super()._queue(peer, [memoryview(stamp), *views])

    def _begin_message(self, peer: Peer, context: int, tag: int, nbytes: int,
                       call: tuple[int, int]) -> None:
        if context != _STAMP_CONTEXT:
            super()._begin_message(peer, context, tag, nbytes, call)
            return
        owner = _Stamp()
        peer.target, peer.target_owner = memoryview(owner.data), owner

    def _finish_message(self, peer: Peer) -> None:
        owner = peer.target_owner
        peer.target = peer.target_owner = None
        if isinstance(owner, _Stamp):
            (self._sent_at[peer],) = _STAMP.unpack(owner.data)
            return
        self._arrivals += 1
        bisect.insort(self._due, (self._sent_at.pop(peer) + self._delay, self._arrivals, owner,
                                  peer))

    def _lose(self, peer: Peer, reason: str) -> None:
        # What came before the end of the stream arrives (early: its sender is gone anyway).
        for entry in [e for e in self._due if e[3] is peer]:
            self._due.remove(entry)
            self._complete(entry[2])
        super()._lose(peer, reason)

    def _arrive(self) -> float | None:
        """Complete the messages whose time has come; the seconds until the next one's."""
        now = time.perf_counter()
        while self._due and self._due[0][0] <= now:
            self._complete(self._due.pop(0)[2])
        return self._due[0][0] - now if self._due else None

    def _ready(self, timeout: float) -> Iterable[tuple[Peer, bool, bool]]:
        waiting = len(self._due)
        until_next = self._arrive()
        if len(self._due) < waiting:  # some request may be done: let the caller look
            timeout = 0.0
        if until_next is None or timeout <= 0:
            return super()._ready(timeout)
        end = time.perf_counter() + min(timeout, until_next)
        while time.perf_counter() < end:
            if ready := super()._ready(0.0):
                return ready
            os.sched_yield()
        self._arrive()
        return super()._ready(0.0)
