"""tbcoll: collectives for SPMD jobs started by tbrun, over shared memory, TCP, MPI and MLX.

The names below load on first use (PEP 562), so that tbrun, which needs only the launch
contract, the store and the errors, starts without importing numpy.
"""

from importlib import import_module

__version__ = "0.1.0"

_HOMES = {
    "init": "tbcoll.bootstrap",
    "Communicator": "tbcoll.comm.communicator",
    "LaunchInfo": "tbcoll.job.env",
    "launch_info": "tbcoll.job.env",
    "Store": "tbcoll.job.rendezvous",
    "Request": "tbcoll.comm.requests",
    "wait_all": "tbcoll.comm.requests",
    "register_collective": "tbcoll.collectives",
    "register_transport": "tbcoll.core.backends",
    **dict.fromkeys(("AuthenticationError", "CommError", "CommRevokedError", "HostfileError",
                     "LaunchError", "PeerError", "PeerLostError", "PeerTimeoutError",
                     "RankFailedError", "RendezvousError", "TbcollError"), "tbcoll.core.errors"),
}
__all__ = sorted(_HOMES)


def __getattr__(name: str) -> object:
    if name not in _HOMES:
        raise AttributeError(f"module 'tbcoll' has no attribute {name!r}")
    value = getattr(import_module(_HOMES[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])
