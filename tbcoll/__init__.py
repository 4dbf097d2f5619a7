"""tbcoll: collectives for SPMD jobs started by tbrun, over shared memory, TCP, MPI and MLX."""

from tbcoll.bootstrap import init
from tbcoll.comm import Communicator
from tbcoll.env import LaunchInfo, launch_info
from tbcoll.errors import (
    AuthenticationError,
    CommError,
    HostfileError,
    LaunchError,
    RendezvousError,
    TbcollError,
)
from tbcoll.rendezvous import Store

__version__ = "0.1.0"

__all__ = [
    "AuthenticationError",
    "CommError",
    "Communicator",
    "HostfileError",
    "LaunchError",
    "LaunchInfo",
    "RendezvousError",
    "Store",
    "TbcollError",
    "init",
    "launch_info",
]
