"""A pair's failover as a rank tells tbrun (docs/failover.md): the one source of the key and
of the event's fields, for the ranks (tbcoll.transports.tcp) and tbrun (tbcoll.launch.failovers).

Each end of a pair that failed over posts its own event under FAILOVER_KEY; tbrun merges the
events of one pair of hosts (every pair of their ranks that moved, each seen from both ends)
into one line. Times are durations, not clock readings: tbrun places the loss on its own clock
(when the event came, less `ago`), so hosts whose clocks disagree still agree on it.
"""

from __future__ import annotations

import json

from tbcoll.core.records import record

FAILOVER_PREFIX = "tbrun/failover/"
FAILOVER_KEY = FAILOVER_PREFIX + "{}/{}"  # (rank, its n-th event) -> a PathChange (JSON)
# the reason of a planned move back to a preferred path (fail-back) ends so: nothing was lost
FAILED_BACK = "the preferred path answers again"


def moved_back(reason: str) -> bool:
    """Whether a change with this reason was a fail-back, not a loss."""
    return reason.endswith(FAILED_BACK)


@record
class PathChange:
    """One end's failover of a pair: rank's stream to peer left `old` for `new` (each "name
    (address)", e.g. "cable 1 (10.212.1.2)", "management (10.211.0.12)"), sending again
    `replayed` bytes; `seconds` from the failure found to the stream going on over `new`,
    which was `ago` seconds before the event was posted; `reason`: what failed."""

    rank: int
    peer: int
    n: int  # the pair's n-th failover (both ends count alike)
    old: str
    new: str
    reason: str
    replayed: int
    seconds: float
    ago: float = 0.0
    told: bool = False  # this end was told (a peer's ask, a host pair's event), not found it

    def line(self) -> str:
        """The end's own line (its log), as tbrun's but for one pair of ranks."""
        if moved_back(self.reason):
            return (f"rank {self.rank} <-> rank {self.peer}: back to {self.new} from {self.old} "
                    f"({self.reason}), {self.seconds:.1f} s, {self.replayed} bytes sent again")
        return (f"rank {self.rank} <-> rank {self.peer}: {self.old} lost ({self.reason}); now "
                f"over {self.new}, {self.seconds:.1f} s, {self.replayed} bytes sent again")

    def encode(self) -> bytes:
        return json.dumps(self._asdict()).encode()


def parse_change(value: bytes) -> PathChange | None:
    """The PathChange a rank posted; None for what is not one."""
    try:
        fields = json.loads(value)
        return PathChange(**{name: fields[name] for name in PathChange._fields})
    except (ValueError, TypeError, KeyError):
        return None
