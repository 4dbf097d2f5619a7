"""The topology file that MPICH's Hydra leaves in /tmp when a job ends abnormally.

A rank's MPI_Init asks its host's Hydra proxy (hydra_pmi_proxy, the rank's parent) for the
host's hwloc topology; the proxy writes it once to /tmp/hydra_hwloc_xmlfile_XXXXXX (mkstemp in
a fixed directory: TMPDIR is not read) and unlinks it when it ends normally. When mpiexec is
gone first, the proxy finds its connection to mpiexec closed, SIGKILLs its ranks and leaves
through its error path, which skips that unlink (MPICH 5.0.2). mpiexec is gone first on
MPI_Abort (mpi4py's runner calls it when a rank raises or exits non-zero: mpiexec exits at
once, without waiting for its proxies) and when tbrun's janitor kills it. So the rank about to
abort (tbcoll.launch.mpirank), and the janitor before it kills mpiexec, remove the file. It is
found through the proxy's own open descriptor (the proxy never closes the one mkstemp gave
it): never another job's or user's. Linux only (/proc); elsewhere nothing is found.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable

_PROXY = "hydra_pmi_proxy"
_TOPOLOGY = re.compile(r"/tmp/hydra_hwloc_xmlfile_[A-Za-z0-9]{6}")  # " (deleted)" once unlinked

HeldFile = tuple[str, int, int]  # path, device, inode


def held_topologies(pids: Iterable[int]) -> list[HeldFile]:
    """The topology files that those of pids that are Hydra proxies hold open."""
    held = []
    for pid in pids:
        proxy = f"/proc/{pid}"
        try:
            with open(f"{proxy}/comm") as comm:
                if comm.read().strip() != _PROXY:
                    continue
            links = [f"{proxy}/fd/{fd}" for fd in os.listdir(f"{proxy}/fd")]
        except OSError:
            continue  # no /proc (macOS), or the process ended or is not ours to read
        for link in links:
            try:
                target = os.readlink(link)
                if _TOPOLOGY.fullmatch(target):
                    opened = os.stat(link)  # the open file itself
                    held.append((target, opened.st_dev, opened.st_ino))
            except OSError:
                continue  # closed meanwhile
    return held


def remove_topologies(files: Iterable[HeldFile]) -> None:
    """Unlink each file that its path still names, a regular file of this user's; one gone
    already (its proxy ended normally) is passed over. /tmp is sticky: between the check and
    the unlink, only the file's owner, this user, could swap it."""
    for path, device, inode in files:
        try:
            named = os.lstat(path)
            if ((named.st_dev, named.st_ino) == (device, inode) and stat.S_ISREG(named.st_mode)
                    and named.st_uid == os.getuid()):
                os.unlink(path)
        except OSError:
            pass


def remove_proxy_topology() -> None:
    """Unlink the file that this process's parent, a Hydra proxy, holds open. Ranks of the job
    still starting then read the topology from the system instead."""
    remove_topologies(held_topologies([os.getppid()]))
