"""Transports by name. Each opener connects the ranks of a job and returns its world Group,
this rank's local rank and its node's index. Imports are lazy: opening tcp never loads mpi4py
(whose import initialises MPI)."""

from __future__ import annotations

from collections.abc import Callable

from tbcoll.env import LaunchInfo
from tbcoll.transports.base import Group

Opener = Callable[[LaunchInfo | None, str], tuple[Group, int, int]]


def _open_tcp(info: LaunchInfo | None, prefix: str) -> tuple[Group, int, int]:
    from tbcoll.transports.tcp import open_world

    group = open_world(info, prefix)
    return group, (info.local_rank if info else 0), (info.node_rank if info else 0)


def _open_mpi(info: LaunchInfo | None, prefix: str) -> tuple[Group, int, int]:
    from tbcoll.transports.mpi import open_world

    return open_world(info)


def _open_shm(info: LaunchInfo | None, prefix: str) -> tuple[Group, int, int]:
    from tbcoll.transports.shm import open_world

    group = open_world(info, prefix)
    return group, (info.local_rank if info else 0), (info.node_rank if info else 0)


def _open_mlx(info: LaunchInfo | None, prefix: str) -> tuple[Group, int, int]:
    from tbcoll.transports.mlx import open_world

    group = open_world(info, prefix)
    return group, (info.local_rank if info else 0), (info.node_rank if info else 0)


TRANSPORTS: dict[str, Opener] = {"shm": _open_shm, "tcp": _open_tcp, "mpi": _open_mpi,
                                 "mlx": _open_mlx}
