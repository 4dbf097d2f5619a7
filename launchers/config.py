"""LaunchConfig: tbrun's flags, checked and frozen before any logic sees them."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence

from tbcoll.core.errors import LaunchError
from tbcoll.core.records import record
from tbcoll.job.topology import Hostfile

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

# Set to 1 when unset and several ranks share a host, as torchrun does for OMP_NUM_THREADS,
# so that N ranks on N cores do not each start N BLAS threads.
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
               "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")


def thread_limits(ranks_on_host: int) -> dict[str, str]:
    """Defaults for THREAD_VARS on a host running this many ranks (none for one rank)."""
    return dict.fromkeys(THREAD_VARS, "1") if ranks_on_host > 1 else {}


@record
class LaunchConfig:
    nprocs: int
    program: tuple[str, ...]  # the argv every rank runs
    backend: str
    tag_output: bool
    output_dir: str | None
    timeout: float | None  # wall-clock limit of the whole job
    grace: float  # seconds between SIGTERM and SIGKILL at teardown
    comm_timeout: float  # TBCOLL_TIMEOUT given to the ranks
    exports: Mapping[str, str]
    store_port: int
    dry_run: bool
    hostfile: Hostfile | None = None  # None: every rank on this machine
    map_by: str = "slot"  # slot: fill each host in turn; node: deal ranks round the hosts
    cwd: str = "."  # working directory of the ranks, on every host
    python: str = "python3"  # runs .py programs, and tbcoll.launch.remote on remote hosts
    ssh: tuple[str, ...] = ("ssh",)
    connect_timeout: float = 10.0  # seconds ssh may take to reach a host
    stdin: str = "0"  # the rank that reads tbrun's standard input, "all" or "none"
    launcher: str = "ssh"  # the starter of ranks on other hosts (tbcoll.launch.starters)
    dump_dir: str | None = None  # where the ranks' dumps go (None: a new temporary folder)
    trace: str | None = None  # where the timeline of every rank's calls goes
    transport_module: str = ""  # TBCOLL_TRANSPORT_MODULE for every rank ("": none)
    keep_going: bool = False  # a rank's failure does not end the job (TBCOLL_KEEP_GOING)


# why --keep-going is refused, by backend
_NO_KEEP_GOING = {
    "mpi": "MPI aborts the whole job when a rank dies, and the PyPI MPICH has no ULFM to "
           "survive it",
    "mlx": "MLX cannot abort a collective, so the survivors would wait on the dead rank "
           "forever",
}


def check_keep_going(backend: str) -> None:
    """LaunchError where --keep-going cannot keep its promise: under mpiexec (--backend mpi)
    and with MLX's collectives."""
    if backend in _NO_KEEP_GOING:
        raise LaunchError(f"--keep-going with --backend {backend}: {_NO_KEEP_GOING[backend]}; "
                          "use --backend shm or tcp (or rdma), or leave out --keep-going")


def resolve_program(program: str, args: Sequence[str], python: str,
                    module: bool) -> tuple[str, ...]:
    """The argv a rank runs: a .py script or a module under `python`, else an executable."""
    if module:
        return (python, "-m", program, *args)
    if program.endswith(".py"):
        if not os.path.isfile(program):
            raise LaunchError(f"script {program!r} not found")
        return (python, os.path.abspath(program), *args)  # ranks may run in another --cwd
    if os.sep in program:
        if not (os.path.isfile(program) and os.access(program, os.X_OK)):
            raise LaunchError(f"program {program!r} not found or not executable")
        return (program, *args)
    # PATH first, then beside the interpreter: console scripts of tbrun's own environment
    # (tbcoll-bench) run even when that environment is not activated.
    import shutil  # here: tbrun's start-up does without it (~2 ms)

    found = shutil.which(program) or shutil.which(program, path=os.path.dirname(python))
    if found is None:
        raise LaunchError(f"program {program!r} not found on PATH")
    return (found, *args)


MASTER_NAMES = ("MASTER_ADDR", "MASTER_PORT")


def master_overrides(exports: Mapping[str, str]) -> dict[str, str]:
    """torchrun's MASTER_ADDR and MASTER_PORT where the user gave them (-x, --master-addr,
    --master-port): they win over tbrun's own choice."""
    return {name: exports[name] for name in MASTER_NAMES if name in exports}


def parse_exports(specs: Sequence[str], environ: Mapping[str, str]) -> dict[str, str]:
    """-x NAME=VALUE sets a variable for every rank; -x NAME passes on tbrun's own value."""
    exports = {}
    for spec in specs:
        name, sep, value = spec.partition("=")
        if not _ENV_NAME.match(name):
            raise LaunchError(f"-x {spec!r}: {name!r} is not a valid variable name")
        if not sep:
            if name not in environ:
                raise LaunchError(f"-x {name}: {name} is not set in tbrun's environment; "
                                  f"use -x {name}=VALUE")
            value = environ[name]
        exports[name] = value
    return exports


def read_hosts(hostfile: str | None, hosts: str | None) -> Hostfile | None:
    """--hostfile FILE or -H a:2,b:2 (not both); None when neither is given."""
    if hostfile and hosts:
        raise LaunchError("give --hostfile or -H, not both")
    if hostfile:
        return Hostfile.from_file(hostfile)
    return Hostfile.from_list(hosts) if hosts else None
