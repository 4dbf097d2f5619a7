"""The topology file that MPICH's Hydra leaves in /tmp when a rank aborts the job.

A rank's MPI_Init asks its host's Hydra proxy (hydra_pmi_proxy, the rank's parent) for the
host's hwloc topology; the proxy writes it once to /tmp/hydra_hwloc_xmlfile_XXXXXX (mkstemp in
a fixed directory: TMPDIR is not read) and unlinks it when it ends normally. On MPI_Abort
(mpi4py's runner calls it when a rank raises or exits non-zero) mpiexec exits at once, without
waiting for its proxies; each proxy then finds its connection to mpiexec closed, SIGKILLs its
ranks and leaves through its error path, which skips that unlink (MPICH 5.0.2). So the rank
about to abort removes its proxy's file first. The file is found through the proxy's own open
descriptor (the proxy never closes the one mkstemp gave it): never another job's or user's.
Linux only (/proc); elsewhere nothing is found and nothing removed.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

_PROXY = "hydra_pmi_proxy"
_TOPOLOGY = re.compile(r"/tmp/hydra_hwloc_xmlfile_[A-Za-z0-9]{6}")  # " (deleted)" once unlinked


def remove_proxy_topology() -> None:
    """Unlink the hwloc topology file that this process's parent, a Hydra proxy, holds open.
    Ranks of the job still starting then read the topology from the system instead."""
    proxy = Path(f"/proc/{os.getppid()}")
    try:
        if (proxy / "comm").read_text().strip() != _PROXY:
            return
        held = [(link, os.readlink(link)) for link in (proxy / "fd").iterdir()]
    except OSError:
        return  # no /proc (macOS), or the parent ended or is not ours to read
    for link, target in held:
        if not _TOPOLOGY.fullmatch(target):
            continue
        try:
            opened, named = os.stat(link), os.lstat(target)
            if ((opened.st_dev, opened.st_ino) == (named.st_dev, named.st_ino)
                    and stat.S_ISREG(named.st_mode) and named.st_uid == os.getuid()):
                os.unlink(target)  # /tmp is sticky: only its owner (this user) could swap it
        except OSError:
            pass  # gone already: the proxy ended normally
