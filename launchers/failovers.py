"""tbrun's line for each failover (docs/failover.md): the ranks post each end's PathChange to the
store (tbcoll.job.pathevents), which hands it here at once (StoreServer.divert). The pairs of
ranks between two hosts fail over as one event of that pair of hosts (each of their pairs,
seen from both ends, within WINDOW seconds of the first): one line, loud, since falling from a
cable to the management network (perhaps Wi-Fi) is a slowdown the user must see.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

from tbcoll.job.pathevents import FAILOVER_PREFIX, PathChange, moved_back, parse_change
from tbcoll.job.rendezvous import StoreServer

WINDOW = 1.0  # seconds a host pair's event gathers its pairs of ranks before it is told


class FailoverLines:
    """Gather the ranks' PathChanges by pair of hosts and event; log one line for each."""

    def __init__(self, store: StoreServer, hosts: Iterable[tuple[str, Iterable[int]]],
                 log: Callable[[str], None]) -> None:
        """hosts: each host's name and its ranks (the job's plan)."""
        self._host = {rank: name for name, ranks in hosts for rank in ranks}
        self._log = log
        self._started = time.monotonic()
        self._lock = threading.Lock()
        # event -> the changes heard, each with when its failure began (tbrun's clock)
        self._pending: dict[tuple, list[tuple[PathChange, float]]] = {}
        store.divert(FAILOVER_PREFIX, self._take)

    def _take(self, key: bytes, value: bytes) -> None:
        change = parse_change(value)
        if change is None:
            return
        began = time.monotonic() - change.ago - change.seconds
        event = self._event(change)
        with self._lock:
            first = event not in self._pending
            self._pending.setdefault(event, []).append((change, began))
        if first:
            timer = threading.Timer(WINDOW, self._tell, (event,))
            timer.daemon = True
            timer.start()

    def _event(self, change: PathChange) -> tuple:
        """A pair of hosts and its n-th failover; two ranks of one host (a test's cuts: no
        cable joins them) are a pair of their own."""
        a, b = self._host.get(change.rank, "?"), self._host.get(change.peer, "?")
        if a == b:
            return ("ranks", *sorted((change.rank, change.peer)), change.n)
        return ("hosts", *sorted((a, b)), change.n)

    def _tell(self, event: tuple) -> None:
        with self._lock:
            changes = self._pending.pop(event, None)
        if changes:
            self._log(self.line(event, changes))

    def close(self) -> None:
        """Tell the events still gathering (the job ended within WINDOW of them)."""
        for event in list(self._pending):
            self._tell(event)

    def line(self, event: tuple, changes: list[tuple[PathChange, float]]) -> str:
        """ "rank 0 <-> rank 1: cable 1 (10.212.1.2) lost after 3.1 s of the job; now over
        management (10.211.0.12), 0.4 s (why; bytes sent again)", the paths and why as the end
        that found the failure first saw them."""
        pairs = {tuple(sorted((c.rank, c.peer))) for c, _ in changes}
        # the view of the end that found the failure first (the others were told of it)
        view, began = min(changes, key=lambda change: (change[0].told, change[1]))
        # from the failure found to the last of its streams going on over the new path
        seconds = max(at + c.seconds for c, at in changes) - began
        began -= self._started
        replayed = sum(c.replayed for c, _ in changes)
        low, high = sorted((view.rank, view.peer))
        who = (f"rank {low} <-> rank {high}" if event[0] == "ranks" or len(pairs) == 1
               else f"{event[1]} <-> {event[2]}")
        moved = f"; {len(pairs)} pairs of ranks moved" if len(pairs) > 1 else ""
        if moved_back(view.reason):
            return (f"{who}: back to {view.new} from {view.old} after {max(began, 0.0):.1f} s "
                    f"of the job, {seconds:.1f} s ({view.reason}; {replayed} bytes sent again"
                    f"{moved})")
        return (f"{who}: {view.old} lost after {max(began, 0.0):.1f} s of the job; now over "
                f"{view.new}, {seconds:.1f} s ({view.reason}; {replayed} bytes sent again"
                f"{moved})")
