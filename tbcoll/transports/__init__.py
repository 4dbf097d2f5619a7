"""The transports: tbcoll.core.backends lists them; open_world opens one."""

from __future__ import annotations

from importlib import import_module

from tbcoll.core.backends import TRANSPORTS
from tbcoll.core.protocols import Group
from tbcoll.job.env import LaunchInfo


def open_world(backend: str, info: LaunchInfo | None, prefix: str) -> tuple[Group, int, int]:
    """Connect the job's ranks over backend (one of TRANSPORTS): the world Group, this rank's
    local rank and its node's index."""
    return import_module(TRANSPORTS[backend]).open_world(info, prefix)
