"""The transports: tbcoll.backends names them; open_world opens one."""

from __future__ import annotations

from tbcoll.backends import transport
from tbcoll.env import LaunchInfo, transport_module
from tbcoll.transports.base import Group


def open_world(backend: str, info: LaunchInfo | None, prefix: str) -> tuple[Group, int, int]:
    """Connect the job's ranks over backend (a name tbcoll.backends knows, or one that
    TBCOLL_TRANSPORT_MODULE provides): the world Group, this rank's local rank and its node's
    index."""
    module = info.transport_module if info is not None else transport_module()
    return transport(backend, module).open_world(info, prefix)
