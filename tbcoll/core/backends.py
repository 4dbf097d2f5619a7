"""The backends by name. Each transport is the module whose `open_world(info, prefix)` connects
a job's ranks and returns (world Group, local rank, node index); it is imported only when a
job uses it (importing mpi4py starts MPI, and tbrun, which reads the names, imports no
transport at all). "auto" is shm on one host, else tcp.

Beside the built-ins (TRANSPORTS), a transport joins by name in one of three ways:
- an installed package's entry point in the group `tbcoll.transports` (name = "pkg.module"):
  tbrun and every rank see its name without importing it;
- the module named in the launch contract, TBCOLL_TRANSPORT_MODULE (tbrun's
  --transport-module, passed to every rank): imported in each rank before its backend is
  looked up, it provides the backend tbrun was given (--backend NAME), by calling
  register_transport itself or by having open_world;
- register_transport(name, module) in the process, before tbcoll.init(backend=name).
"""

from __future__ import annotations

from importlib import import_module
from types import ModuleType

TRANSPORTS = {"shm": "tbcoll.transports.shm.transport", "tcp": "tbcoll.transports.tcp.transport",
              "mpi": "tbcoll.transports.mpi.transport", "mlx": "tbcoll.transports.mlx.transport",
              "rdma": "tbcoll.transports.rdma.transport"}
BACKENDS = ("auto", *TRANSPORTS)  # the built-in names
ENTRY_POINTS = "tbcoll.transports"
_REGISTERED: dict[str, str | ModuleType] = {}


def register_transport(name: str, module: str | ModuleType) -> None:
    """Make `name` a backend: module (or its import path) has open_world(info, prefix) ->
    (Group, local rank, node index), its Group as tbcoll.core.protocols says. Every rank of
    a job must register it (an entry point or TBCOLL_TRANSPORT_MODULE does that for you)."""
    if not name.isidentifier() or name in BACKENDS:
        raise ValueError(f"transport name {name!r} must be an identifier and not a built-in "
                         f"one ({', '.join(BACKENDS)})")
    if isinstance(module, ModuleType) and not callable(getattr(module, "open_world", None)):
        raise TypeError(f"transport {name!r}: module {module.__name__} has no open_world")
    _REGISTERED[name] = module


def installed() -> dict[str, str]:
    """The transports installed packages name (entry points), by name: their modules' paths
    (importlib.metadata, ~15 ms of tbrun's start, only where a name is not built in)."""
    from importlib.metadata import entry_points

    return {point.name: point.value for point in entry_points(group=ENTRY_POINTS)}


def known() -> tuple[str, ...]:
    """Every backend name this process knows now, without importing a transport."""
    return tuple(dict.fromkeys((*BACKENDS, *installed(), *_REGISTERED)))


def transport(name: str, module: str = "") -> ModuleType:
    """The transport module of backend `name`; module: TBCOLL_TRANSPORT_MODULE ("": none),
    imported first (it may register name, or be the transport itself)."""
    if module:
        try:
            found = import_module(module)
        except ImportError as e:
            raise ValueError(f"TBCOLL_TRANSPORT_MODULE={module!r} cannot be imported ({e}); "
                             "name a module on every rank's sys.path") from e
        if name not in _REGISTERED and name not in TRANSPORTS and name not in installed():
            if not callable(getattr(found, "open_world", None)):
                raise ValueError(f"TBCOLL_TRANSPORT_MODULE={module!r} neither registers a "
                                 f"transport {name!r} (tbcoll.register_transport) nor has "
                                 "open_world")
            return found
    where = _REGISTERED.get(name) or TRANSPORTS.get(name) or installed().get(name)
    if where is None:
        raise ValueError(f"backend {name!r} is not one of {', '.join(known())}; a transport "
                         "of your own: tbcoll.register_transport, an entry point in the group "
                         f"{ENTRY_POINTS}, or TBCOLL_TRANSPORT_MODULE (docs/extending.md)")
    return where if isinstance(where, ModuleType) else import_module(where.partition(":")[0])
