"""The rendezvous store that tbrun serves for every job (tbcoll.job.rendezvous.StoreServer), on
the address this machine has towards each of the job's hosts."""

from __future__ import annotations

import errno

from tbcoll.launch.hosts import JobPlan
from tbcoll.launch.output import log

from tbcoll.core.errors import LaunchError
from tbcoll.job.env import format_hostport
from tbcoll.job.rendezvous import StoreServer


def serve_store(token: str, plan: JobPlan, port: int, clients: int) -> StoreServer:
    """A store for the job, not yet started (start it once the ranks are forked: its threads
    must not exist when they are)."""
    try:
        return StoreServer(token, plan.store_hosts, port, log=log, clients=clients)
    except OSError as e:
        reason = "address already in use" if e.errno == errno.EADDRINUSE else e.strerror
        where = " and ".join(format_hostport(h, port) for h in plan.store_hosts)
        raise LaunchError(
            f"cannot listen on {where} for the rendezvous store: {reason}; choose another "
            "--store-port, or 0 for any free port"
        ) from e
