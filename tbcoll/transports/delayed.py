"""Emulated link latency for the tcp transport (TBCOLL_LINK_DELAY_US), for benchmarks that
show what a link's latency does to a job (benchmarks/tp_latency.py); the kernel here has no
netem. Every message leaves `delay` seconds after it was sent, as over a link with that much
more one-way latency: messages in a row overlap their delays, as on a wire. A send completes
at once, as into a socket's buffer (the bytes are copied). Messages leave while the rank is
in the message engine (any wait or test), which is where a rank is after a send in the jobs
this is for. Only a job that sets the variable uses this class: plain tcp pays nothing.
"""

from __future__ import annotations

import atexit
import os
import time
from collections import deque
from collections.abc import Iterable

from tbcoll.errors import CommError
from tbcoll.transports.stream import Peer, _Send
from tbcoll.transports.tcp import TcpTransport

_SPIN_BEYOND = 2e-3  # a rank spins this long beyond the delay after its last message left


class DelayedTcpTransport(TcpTransport):
    def __init__(self, *args, delay: float, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._delay = delay
        self._held: deque[tuple[float, Peer, _Send]] = deque()  # departure order
        self._departed = 0.0  # when the last message left
        atexit.register(self._drain)

    def _queue(self, peer: Peer, views: list[memoryview]) -> _Send:
        message = _Send(peer, [memoryview(b"".join(views))])
        self._held.append((time.perf_counter() + self._delay, peer, message))
        sent = _Send(peer, [])
        sent.done = True
        return sent

    def close(self) -> None:
        atexit.unregister(self._drain)
        self._drain()
        super().close()

    def _drain(self) -> None:
        """Let the messages still held leave, as a socket's buffer drains after the last send
        (at close, or at exit for a program that never closes its communicator)."""
        try:
            self.waitall([message for _, _, message in self._held])
        except CommError:
            pass  # a peer gone: nothing more can reach it

    def _depart(self) -> float | None:
        """Hand the messages now due to the stream engine; the seconds until the next is."""
        now = time.perf_counter()
        while self._held and self._held[0][0] <= now:
            _, peer, request = self._held.popleft()
            self._departed = now
            peer.sendq.append(request)
            if len(peer.sendq) == 1:
                self._pump_out(peer)
        return self._held[0][0] - now if self._held else None

    def _ready(self, timeout: float) -> Iterable[tuple[Peer, bool, bool]]:
        # Spin (yielding the core) rather than sleep while a message is due to leave, or may
        # come back for one that left: waking from poll() would add its own 30-50 us.
        give_up = time.perf_counter() + timeout
        while True:
            until_next = self._depart()
            ready = super()._ready(0.0)
            now = time.perf_counter()
            if ready or now >= give_up:
                return ready
            horizon = (now + until_next if until_next is not None
                       else self._departed + self._delay + _SPIN_BEYOND)
            if now >= horizon:
                return super()._ready(give_up - now)
            os.sched_yield()
