"""A failover told (docs/failover.md), in one place: the rank's own line, the flight recorder
(its dumps and --trace), and tbrun, which prints one line per pair of hosts and event
(tbcoll.launch.failovers)."""

from __future__ import annotations

import atexit
import logging
import threading
import time

from tbcoll.job.env import launch_info
from tbcoll.job.pathevents import FAILOVER_KEY, PathChange
from tbcoll.job.rendezvous import tell_tbrun
from tbcoll.job.topology import Path
from tbcoll.observability.recorder import note_event

log = logging.getLogger("tbcoll.tcp")


def say(change: PathChange) -> None:
    """Tell change: under tbrun, tbrun says it (one line per pair of hosts: this rank's line
    is logged at INFO only); elsewhere this rank's line is all, a warning."""
    log.log(logging.INFO if launch_info() else logging.WARNING, "%s", change.line())
    note_event({**change._asdict(), "at": time.perf_counter()})
    tell_tbrun_of(change)


def path_text(path: Path | None, link: str) -> str:
    """How a failover names a path: "cable 1 (10.212.1.2)", "management (10.211.0.12)"; a
    pair with no paths of the hostfile's (one host) by its connection's far address."""
    if path is not None:
        return f"{path.name} ({path.remote or '?'})"
    return f"the connection to {link.rpartition(' -> ')[2]}"


def tell_tbrun_of(change: PathChange) -> None:
    """Post change to tbrun's store, from a thread of its own: the engine goes on meanwhile
    (a rank that exits first waits for the post, at most _TELL_WAIT). `ago`: seconds from
    the change to its post."""
    done = time.monotonic()

    def post() -> None:
        late = change._replace(ago=round(time.monotonic() - done, 4))
        tell_tbrun(FAILOVER_KEY.format("{}", f"{change.peer}.{change.n}"), late.encode())

    if not _telling:
        atexit.register(_told)
    thread = threading.Thread(target=post, daemon=True, name="failover-tell")
    _telling[:] = [t for t in _telling if t.is_alive()] + [thread]
    thread.start()


_TELL_WAIT = 2.0
_telling: list[threading.Thread] = []  # tell_tbrun_of's posts


def _told() -> None:
    """At exit: let the posts of failovers end (tbrun's line needs one end's)."""
    end = time.monotonic() + _TELL_WAIT
    for thread in _telling:
        thread.join(max(0.0, end - time.monotonic()))
