"""init(): build the world communicator from whatever launched this process."""

from __future__ import annotations

import itertools

from tbcoll.comm.communicator import Communicator
from tbcoll.comm.survival import Lineage
from tbcoll.core.errors import TbcollError
from tbcoll.core.protocols import Group
from tbcoll.hierarchy import group as hierarchy
from tbcoll.job.env import (
    LaunchInfo,
    launch_info,
    single_host,
    started_by_mpiexec,
    two_levels,
    unlaunched_slurm_task,
)
from tbcoll.observability.dumps import start_listening
from tbcoll.transports import open_world
from tbcoll.transports.shm.native import built as shm_built

# backends that move a host's ranks' data through shared memory when some host runs several
# ranks of a job over several hosts (tbcoll.hierarchy; TBCOLL_HIERARCHY=0: one level)
TWO_LEVEL_BACKENDS = ("tcp", "rdma")
_opened = itertools.count()  # store keys of each init() in a process stay apart


def init(backend: str | None = None) -> Communicator:
    """Connect the ranks of this job and return the world communicator.

    backend None: TBCOLL_BACKEND under tbrun (auto: shm when every rank is on one host and
    shm's C extension is built, else tcp, whose pure-Python path runs without a compiler),
    mpi under mpiexec, and a communicator of one rank when the script runs on its own. A
    backend that is not built in joins by name (tbcoll.core.backends: register_transport, an
    entry point, TBCOLL_TRANSPORT_MODULE); an unknown name is a ValueError.
    """
    info = launch_info()
    if (why := unlaunched_slurm_task()) is not None:
        raise TbcollError(why)
    if backend is None:
        backend = info.backend if info else ("mpi" if started_by_mpiexec() else "tcp")
    if backend == "auto":
        one_host = info is None or single_host(info)
        backend = "shm" if one_host and shm_built() else "tcp"
    prefix = f"{backend}/{next(_opened)}"
    group, local_rank, node_rank = open_group(backend, info, prefix)
    world = Communicator(group, backend, local_rank, node_rank,
                         lineage=Lineage(prefix, open_group))
    start_listening(info)  # for tbrun's requests of dumps (tbcoll.observability.dumps)
    return world


def open_group(backend: str, info: LaunchInfo | None, prefix: str) -> tuple[Group, int, int]:
    """The world of the job info describes over backend: of two levels where the job spans
    hosts of several ranks (tbcoll.hierarchy), else the transport's own; also what a shrunk
    communicator's survivors open again (tbcoll.comm.survival)."""
    if backend in TWO_LEVEL_BACKENDS and info is not None and info.topology.shares_hosts \
            and two_levels() and shm_built():
        return hierarchy.open_world(backend, info, prefix)
    return open_world(backend, info, prefix)

