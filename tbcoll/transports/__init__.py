"""The transports: tbcoll.core.backends names them; open_world opens one."""

from __future__ import annotations

from tbcoll.core.backends import transport
from tbcoll.core.protocols import Group
from tbcoll.job.env import LaunchInfo, transport_module


def open_world(backend: str, info: LaunchInfo | None, prefix: str) -> tuple[Group, int, int]:
    """Connect the job's ranks over backend (a name tbcoll.core.backends knows, or one that
    TBCOLL_TRANSPORT_MODULE provides): the world Group, this rank's local rank and its node's
    index."""
    module = info.transport_module if info is not None else transport_module()
    return transport(backend, module).open_world(info, prefix)
