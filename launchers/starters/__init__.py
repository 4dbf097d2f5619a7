"""How a job's ranks are started: one module per way, one entry each in STARTERS.

A starter either starts one rank at a time, each a process that tbrun's supervisor watches
(local: a child of tbrun; ssh and srun: tbcoll.launch.remote on another host, its set-up on stdin),
or takes the whole job to another launcher (mpiexec, whose ranks find each other through PMI).
Whichever ran, the supervisor (tbcoll.launch.supervisor) does the rest: output, stdin, fail-fast,
signals, timeouts.

A starter's module is imported when a job first needs it: a job on this machine alone imports
neither ssh's, srun's nor mpiexec's (~1-2 ms of tbrun's start-up).
"""

from __future__ import annotations

from importlib import import_module

from tbcoll.launch.config import LaunchConfig
from tbcoll.launch.hosts import HostPlan
from tbcoll.launch.starters.base import RankSpec, Starter

# name (also its module's) -> whether it starts ranks on other hosts (a choice of --launcher)
STARTERS = {"local": False, "ssh": True, "srun": True, "mpiexec": False}
REMOTE = tuple(name for name, remote in STARTERS.items() if remote)  # for --launcher


def starter(name: str) -> Starter:
    """The starter of that name (a key of STARTERS)."""
    return import_module(f"{__name__}.{name}").STARTER


def starter_for(cfg: LaunchConfig, host: HostPlan | None = None) -> Starter:
    """The starter of a job (host None) or of one host's ranks: mpiexec for --backend mpi,
    else local on this machine and --launcher (ssh, or srun inside a Slurm allocation)
    elsewhere."""
    if cfg.backend == "mpi":
        return starter("mpiexec")
    if host is None or host.local:
        return starter("local")
    return starter(cfg.launcher)


__all__ = ["REMOTE", "STARTERS", "RankSpec", "Starter", "starter", "starter_for"]
