"""tbrun --trace FILE: gather every rank's calls from the store when the job ends and write
them as one timeline (tbcoll.trace)."""

from __future__ import annotations

import json
from collections.abc import Callable

from tbcoll.dump_keys import TRACE_KEY
from tbcoll.rendezvous import StoreServer
from tbcoll.trace import merge


def save_trace(store: StoreServer, size: int, path: str, log: Callable[[str], None]) -> None:
    """Write the timeline of the ranks that sent theirs (at exit: a rank killed sends none)."""
    ranks = {}
    for rank in range(size):
        if (text := store.get(TRACE_KEY.format(rank))) is not None:
            try:
                ranks[rank] = json.loads(text)
            except ValueError:
                log(f"--trace: rank {rank} sent a timeline that is not JSON; left out")
    missing = [r for r in range(size) if r not in ranks]
    if not ranks:
        log(f"--trace: no rank sent its calls (did the ranks call tbcoll.init?); {path} not "
            "written")
        return
    with open(path, "w") as f:
        f.write(json.dumps(merge(ranks)))
    events = sum(len(sent["events"]) for sent in ranks.values())
    log(f"--trace: {events} calls of {len(ranks)} ranks in {path}"
        + (f" (none from {', '.join(map(str, missing))})" if missing else "")
        + f"; python -m tbcoll.trace summary {path}")
