"""How a job's ranks are started: one module per way, one entry each in STARTERS.

A starter either starts one rank at a time, each a process that tbrun's supervisor watches
(local: a child of tbrun; ssh and srun: tbcoll.launch.remote on another host, its set-up on stdin),
or takes the whole job to another launcher (mpiexec, whose ranks find each other through PMI).
Whichever ran, the supervisor (tbcoll.launch.supervisor) does the rest: output, stdin, fail-fast,
signals, timeouts.
"""

from __future__ import annotations

from tbcoll.launch.config import LaunchConfig
from tbcoll.launch.hosts import HostPlan
from tbcoll.launch.starters import local, mpiexec, srun, ssh
from tbcoll.launch.starters.base import RankSpec, Starter

STARTERS: dict[str, Starter] = {s.name: s for s in (local.STARTER, ssh.STARTER, srun.STARTER,
                                                     mpiexec.STARTER)}
REMOTE = tuple(name for name, s in STARTERS.items() if s.remote)  # for --launcher


def starter_for(cfg: LaunchConfig, host: HostPlan | None = None) -> Starter:
    """The starter of a job (host None) or of one host's ranks: mpiexec for --backend mpi,
    else local on this machine and --launcher (ssh, or srun inside a Slurm allocation)
    elsewhere."""
    if cfg.backend == "mpi":
        return STARTERS["mpiexec"]
    if host is None or host.local:
        return STARTERS["local"]
    return STARTERS[cfg.launcher]


__all__ = ["REMOTE", "STARTERS", "RankSpec", "Starter", "starter_for"]
