"""The launch contract: the environment tbrun gives every rank.

tbrun builds it with `worker_env()`; a rank reads it with `launch_info()`. No other module
reads or writes these variables.

    TBCOLL_RANK        this process's rank, 0 .. TBCOLL_SIZE-1
    TBCOLL_SIZE        number of ranks in the job
    TBCOLL_LOCAL_RANK  rank among the ranks on this host, 0 .. TBCOLL_LOCAL_SIZE-1
    TBCOLL_LOCAL_SIZE  number of ranks on this host
    TBCOLL_NODE_RANK   index of this host among the job's hosts
    TBCOLL_BACKEND     transport asked for: auto, shm, tcp, mpi, mlx, rdma, or one that
                       joined by name (tbcoll.core.backends: an entry point, or the module below)
    TBCOLL_TRANSPORT_MODULE  a module each rank imports before it opens its backend, which
                       provides the transport TBCOLL_BACKEND names (tbrun --transport-module;
                       set only where given; docs/extending.md)
    TBCOLL_STORE       host:port of the rendezvous store that tbrun serves
    TBCOLL_TOKEN       random per-job secret; every connection proves it knows it (HMAC)
    TBCOLL_HOSTFILE    the resolved topology as JSON text: the hosts that run ranks, each with
                       its ranks, the address the others reach it at and, from the hostfile,
                       its address on the cable to each other host ("links", null: none; a
                       list: its addresses on several cables to it, preferred first):
                       {"hosts": [{"name": "mac1", "ranks": [0, 1], "addr": "10.0.1.1",
                                   "links": [null, "192.168.0.1"]}, ...]}
                       (one host "localhost" with no addr when no hosts were given)
    TBCOLL_TIMEOUT     seconds a wait may last before it raises (default 300)
    TBCOLL_JOB         random id of the job (not a secret); every process of the job inherits
                       it, and tbrun and its janitor kill what still carries it when the job
                       ends (launchers/reaper.py)
    TBCOLL_SHM_NAMES   a private folder (0700) of the job on the rank's host (tbrun's, or for a
                       remote rank its wrapper's, launchers/remote.py) where a rank
                       writes down each shared-memory name before it makes the segment (an
                       empty file of that name, less its '/') and removes the file once the
                       name is unlinked. When the job ends, tbrun (or its janitor, if tbrun was
                       killed; or the remote rank's wrapper when its rank ends) unlinks the
                       names left there: a killed rank's. macOS cannot list
                       shared memory, so without them a killed job's segment would stay until
                       reboot
    TBCOLL_KEEP_GOING  1 (set by tbrun --keep-going): a rank's death does not end the job;
                       tbrun publishes the failed set in the store (tbcoll.job.failures)

Read by the library as well, set by the user:

    TBCOLL_ALGO        force an algorithm: "ring", or per collective "all_reduce=rd,all_gather=mesh"
    TBCOLL_NO_C        1: run as a build without a compiler would, none of tbcoll's C extensions
                       imported (read by tbcoll.core.extensions, below this layer): the
                       engine's Python path for tcp's messages, numpy's reductions, the Python
                       gate; shm and rdma say they need C
    TBCOLL_CHECK       1: before each collective, check across ranks that the calls agree
    TBCOLL_RECORD      calls each communicator's flight recorder keeps (default 512; 0: off;
                       at most 100000)
    TBCOLL_TRACE       1 (set by tbrun --trace): keep every call for the job's timeline
    TBCOLL_TRACE_CHUNK under --trace, calls a rank sends tbrun at a time (default 1024)
    TBCOLL_RDMA_DEVICES  --backend rdma: one RDMA device for every pair ("rxe0"), or MLX's
                       matrix as JSON ([i][j]: the device host i reaches host j by), which
                       tbrun sets from the hostfile's "rdma" entries
    TBCOLL_RDMA_QP     uc (default, as Apple's driver takes) or rc
    TBCOLL_RDMA_GID_INDEX  the GID to use (default: the port's IPv4-mapped one)
    TBCOLL_RDMA_LIBRARY    the verbs library to open (default libibverbs.so.1 / librdma.dylib)
    TBCOLL_FAILOVER    1: tcp carries a failed connection over the pair's next path, replaying
                       what was lost (work in progress, docs/failover.md)
    TBCOLL_FAULTS      seed:cuts:span, for failover's tests: connections cut at seeded bytes

Under mpiexec there is no TBCOLL_RANK; MPI's own variables (PMI_RANK and PMI_SIZE of MPICH's
Hydra, OMPI_COMM_WORLD_RANK of Open MPI, PMIX_RANK) say so, and init() picks the mpi backend.

For scripts written for torchrun the same facts go out as RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT. MASTER_PORT is a free port left for the
script's own use (torch.distributed binds it on rank 0), not the store's port. A user's own
MASTER_ADDR or MASTER_PORT (tbrun -x, --master-addr, --master-port) wins. Under tbrun
--backend mpi every rank gets the same contract too (TBCOLL_BACKEND=mpi): mpiexec gives all
ranks one environment, so launchers/mpirank.py computes each rank's values in the rank, from
MPI's own variables (`torchrun_names_from_mpi`) and the resolved topology, with worker_env().

With --backend mlx, also what mlx.launch gives MLX's own backends (launchers/mlxvars.py), so
that an unmodified MLX script runs.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence

from tbcoll.core.backends import BACKENDS, known
from tbcoll.core.errors import TbcollError
from tbcoll.core.records import record
from tbcoll.job.topology import Layout

DEFAULT_TIMEOUT = 300.0
DEFAULT_RECORD = 512
# ~200 bytes a call kept, in memory and in a dump's JSON: 20 MB a communicator at most, and a
# dump of a few communicators within the store's 64 MB field
MAX_RECORD = 100_000
DEFAULT_TRACE_CHUNK = 1024  # ~100 KB of JSON, ~4 ms of a rank's time to encode
MAX_TRACE_CHUNK = 100_000
_MPI_RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")


@record
class LaunchInfo:
    """What tbrun told this rank about the job."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    node_rank: int
    backend: str
    store: tuple[str, int]
    token: str
    topology: Layout
    timeout: float
    job: str = ""  # TBCOLL_JOB
    segment_names: str = ""  # TBCOLL_SHM_NAMES ("": none, as for ranks on other hosts)
    transport_module: str = ""  # TBCOLL_TRANSPORT_MODULE ("": none)


def among(info: LaunchInfo, ranks: list[int]) -> LaunchInfo:
    """What a job of these world ranks alone would have told this rank (one of them): the
    survivors of a failure, renumbered in order, who meet again to make a communicator of
    their own (tbcoll.comm.survival)."""
    topology = info.topology.among(ranks)
    rank = ranks.index(info.rank)
    node = topology.node_of(rank)
    here = topology.hosts[node].ranks
    return info._replace(rank=rank, size=len(ranks), local_rank=here.index(rank),
                         local_size=len(here), node_rank=node, topology=topology)


def worker_env(info: LaunchInfo, master: tuple[str, int]) -> dict[str, str]:
    """Return the variables that rank `info.rank` is started with (tbcoll's and torchrun's)."""
    return {
        "TBCOLL_RANK": str(info.rank),
        "TBCOLL_SIZE": str(info.size),
        "TBCOLL_LOCAL_RANK": str(info.local_rank),
        "TBCOLL_LOCAL_SIZE": str(info.local_size),
        "TBCOLL_NODE_RANK": str(info.node_rank),
        "TBCOLL_BACKEND": info.backend,
        "TBCOLL_STORE": format_hostport(*info.store),
        "TBCOLL_TOKEN": info.token,
        "TBCOLL_HOSTFILE": info.topology.to_json(),
        "TBCOLL_TIMEOUT": f"{info.timeout:g}",
        "TBCOLL_JOB": info.job,
        **({"TBCOLL_SHM_NAMES": info.segment_names} if info.segment_names else {}),
        **({"TBCOLL_TRANSPORT_MODULE": info.transport_module} if info.transport_module else {}),
        "RANK": str(info.rank),
        "WORLD_SIZE": str(info.size),
        "LOCAL_RANK": str(info.local_rank),
        "LOCAL_WORLD_SIZE": str(info.local_size),
        "MASTER_ADDR": master[0],
        "MASTER_PORT": str(master[1]),
    }


# MPI's own names for (rank, size, local rank, local size): MPICH's Hydra (and Slurm's
# PMI-2), Open MPI
_MPI_NAMES = (("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
              ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
               "OMPI_COMM_WORLD_LOCAL_SIZE"))
TORCHRUN_NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


def torchrun_names_from_mpi(environ: Mapping[str, str]) -> dict[str, str]:
    """RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE from the variables MPI's launcher gave
    this process (those it gave; empty when it is no MPI rank)."""
    for names in _MPI_NAMES:
        if names[0] in environ:
            return {ours: environ[theirs] for ours, theirs in zip(TORCHRUN_NAMES, names,
                                                                  strict=True)
                    if theirs in environ}
    return {}


def launch_info(environ: Mapping[str, str] | None = None) -> LaunchInfo | None:
    """Read the launch contract; None when this process was not started by tbrun."""
    env = os.environ if environ is None else environ
    if "TBCOLL_RANK" not in env:
        return None
    info = LaunchInfo(
        rank=_int(env, "TBCOLL_RANK"),
        size=_int(env, "TBCOLL_SIZE"),
        local_rank=_int(env, "TBCOLL_LOCAL_RANK"),
        local_size=_int(env, "TBCOLL_LOCAL_SIZE"),
        node_rank=_int(env, "TBCOLL_NODE_RANK"),
        backend=_required(env, "TBCOLL_BACKEND"),
        store=parse_hostport(_required(env, "TBCOLL_STORE"), "TBCOLL_STORE"),
        token=_required(env, "TBCOLL_TOKEN"),
        topology=_layout(env, "TBCOLL_HOSTFILE"),
        timeout=comm_timeout(None, env),
        job=env.get("TBCOLL_JOB", ""),
        segment_names=env.get("TBCOLL_SHM_NAMES", ""),
        transport_module=transport_module(env),
    )
    if not 0 <= info.rank < info.size:
        raise TbcollError(f"TBCOLL_RANK={info.rank} is outside 0..{info.size - 1} (TBCOLL_SIZE)")
    if info.backend not in BACKENDS and not info.transport_module and (
            info.backend not in known()):
        raise TbcollError(f"TBCOLL_BACKEND={info.backend!r} is not one of {', '.join(known())} "
                          "(and no TBCOLL_TRANSPORT_MODULE provides it)")
    return info


def transport_module(environ: Mapping[str, str] | None = None) -> str:
    """TBCOLL_TRANSPORT_MODULE: the module that provides a transport by name ("": none)."""
    env = os.environ if environ is None else environ
    return env.get("TBCOLL_TRANSPORT_MODULE", "").strip()


def job_marks(job: str, environ: Mapping[str, str] | None = None) -> tuple[bytes, ...]:
    """The entries of /proc/<pid>/environ that mark a process of job `job` (TBCOLL_JOB) and,
    given a rank's environment, of that rank alone (its TBCOLL_RANK as well): what tbrun, its
    janitor and tbcoll.launch.remote look for to kill what a job left behind. () for no job."""
    if not job:
        return ()
    marks = (f"TBCOLL_JOB={job}".encode(),)
    if environ is not None and "TBCOLL_RANK" in environ:
        marks += (f"TBCOLL_RANK={environ['TBCOLL_RANK']}".encode(),)
    return marks


def rank_marks(environ: Mapping[str, str]) -> tuple[bytes, ...]:
    """job_marks of the rank whose environment this is; () where it has no TBCOLL_JOB."""
    return job_marks(environ.get("TBCOLL_JOB", ""), environ)


def started_by_mpiexec(environ: Mapping[str, str] | None = None) -> bool:
    """True when an MPI launcher started this process (and tbrun did not)."""
    env = os.environ if environ is None else environ
    return any(name in env for name in _MPI_RANK_VARIABLES)


def launcher_world_size(environ: Mapping[str, str] | None = None) -> int:
    """How many processes the launcher that started this one says the job has: MPI's own
    variables (PMI_SIZE, also under srun --mpi=pmi2; Open MPI's), else the tasks of the Slurm
    step (srun); 0 when no launcher says."""
    env = os.environ if environ is None else environ
    for name in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_STEP_NUM_TASKS"):
        if env.get(name, "").isdigit():
            return int(env[name])
    return 0


def unlaunched_slurm_task(environ: Mapping[str, str] | None = None) -> str | None:
    """Why init() must not form a world here: this process is one task of several that a
    plain srun started, with neither tbrun's contract nor MPI's variables (each task would
    be a world of one). None otherwise."""
    env = os.environ if environ is None else environ
    tasks = launcher_world_size(env)
    if "TBCOLL_RANK" in env or started_by_mpiexec(env) or tasks < 2:
        return None
    return (f"this is task {env.get('SLURM_PROCID', '?')} of {tasks} that srun started without "
            "a process manager tbcoll can join, so each task would be a world of one. Use "
            "`srun --mpi=pmi2 ...` (the mpi backend, through MPI's PMI-2), or run tbrun inside "
            "the allocation (salloc/sbatch: `tbrun script.py` takes its nodes and tasks)")


def algorithm_overrides(algorithms: Mapping[str, Sequence[str]],
                        environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """TBCOLL_ALGO as {collective: algorithm}: "ring" applies to every collective that has a
    ring algorithm, "all_reduce=rd" to one. algorithms: each collective's algorithms."""
    env = os.environ if environ is None else environ
    text = env.get("TBCOLL_ALGO", "").strip()
    if not text:
        return {}
    if "=" not in text:
        chosen = {name: text for name, known in algorithms.items() if text in known}
        if not chosen:
            names = sorted({a for known in algorithms.values() for a in known})
            raise TbcollError(f"TBCOLL_ALGO={text!r} is no collective's algorithm; use one of "
                              f"{', '.join(names)}, or COLLECTIVE=ALGORITHM")
        return chosen
    overrides = {}
    for item in text.split(","):
        name, sep, algorithm = item.strip().partition("=")
        if not sep or name not in algorithms:
            raise TbcollError(f"TBCOLL_ALGO={text!r}: {item!r} is not COLLECTIVE=ALGORITHM with "
                              f"COLLECTIVE one of {', '.join(algorithms)}")
        overrides[name] = algorithm
    return overrides


def comm_timeout(info: LaunchInfo | None, environ: Mapping[str, str] | None = None) -> float:
    """TBCOLL_TIMEOUT: from tbrun's contract, else from the environment (e.g. under mpiexec)."""
    if info is not None:
        return info.timeout
    env = os.environ if environ is None else environ
    return _seconds(env.get("TBCOLL_TIMEOUT", str(DEFAULT_TIMEOUT)), "TBCOLL_TIMEOUT")


def _seconds(text: str, name: str) -> float:
    """A positive, finite number of seconds (inf would overflow every deadline)."""
    seconds = _number(text)
    if not (math.isfinite(seconds) and seconds > 0):
        raise TbcollError(f"{name}={text!r}: give a positive, finite number of seconds")
    return seconds


def _number(text: str) -> float:
    """float(text), or NaN (which every bound refuses) where text is not a number."""
    try:
        return float(text)
    except ValueError:
        return math.nan


def check_mode(environ: Mapping[str, str] | None = None) -> bool:
    """TBCOLL_CHECK=1 (or true/yes): verify that every collective call matches across ranks."""
    env = os.environ if environ is None else environ
    return env.get("TBCOLL_CHECK", "").strip().lower() in ("1", "true", "yes", "on")


def record_size(environ: Mapping[str, str] | None = None) -> int:
    """TBCOLL_RECORD: how many calls each communicator remembers (0: the recorder is off),
    at most MAX_RECORD."""
    return _count("TBCOLL_RECORD", DEFAULT_RECORD, 0, MAX_RECORD,
                  "how many calls each communicator remembers (0 turns the recorder off)",
                  environ)


def trace_chunk(environ: Mapping[str, str] | None = None) -> int:
    """TBCOLL_TRACE_CHUNK: under tbrun --trace, how many calls a rank sends tbrun at a time
    (tbcoll.observability.dumps); what it holds of them at most, give or take a chunk."""
    return _count("TBCOLL_TRACE_CHUNK", DEFAULT_TRACE_CHUNK, 1, MAX_TRACE_CHUNK,
                  "how many calls a rank sends at a time under tbrun --trace", environ)


def _count(name: str, default: int, low: int, high: int, what: str,
           environ: Mapping[str, str] | None) -> int:
    """A whole number from low to high in the variable name (default where unset)."""
    env = os.environ if environ is None else environ
    text = env.get(name, "").strip()
    if not text:
        return default
    if not (text.isascii() and text.isdigit() and low <= int(text) <= high):
        raise TbcollError(f"{name}={text!r}: give {what}, a whole number from {low} to "
                          f"{high}")
    return int(text)


def tracing(environ: Mapping[str, str] | None = None) -> bool:
    """TBCOLL_TRACE=1 (set by tbrun --trace): keep every call, with its call site."""
    env = os.environ if environ is None else environ
    return env.get("TBCOLL_TRACE", "") == "1"


def two_levels(environ: Mapping[str, str] | None = None) -> bool:
    """TBCOLL_HIERARCHY=0 (or false/no/off): a tcp or rdma job whose hosts run several ranks
    each connects every pair of ranks over the network, as one level (tbcoll.hierarchy), to
    compare with the two levels."""
    env = os.environ if environ is None else environ
    return env.get("TBCOLL_HIERARCHY", "").strip().lower() not in ("0", "false", "no", "off")

def keep_going(environ: Mapping[str, str] | None = None) -> bool:
    """TBCOLL_KEEP_GOING=1 (tbrun --keep-going): a rank's death does not end the job; tbrun
    declares it failed (tbcoll.job.failures) and the survivors may agree and shrink."""
    env = os.environ if environ is None else environ
    return env.get("TBCOLL_KEEP_GOING", "") == "1"


def shm_cma(environ: Mapping[str, str] | None = None) -> bool:
    """TBCOLL_SHM_CMA=0 (or false/no/off): shm moves large blocks through its segment, two
    copies, instead of reading them from the other ranks' memory (tbcoll.transports.shm.native)."""
    env = os.environ if environ is None else environ
    return env.get("TBCOLL_SHM_CMA", "").strip().lower() not in ("0", "false", "no", "off")


@record
class RdmaSettings:
    """What the rdma backend was told (see the module docstring)."""

    devices: str  # "" (this host's one device), a name, or a JSON matrix
    rc: bool
    gid_index: int  # -1: the IPv4-mapped GID
    library: str | None


def rdma_settings(environ: Mapping[str, str] | None = None) -> RdmaSettings:
    env = os.environ if environ is None else environ
    qp = env.get("TBCOLL_RDMA_QP", "uc").strip().lower() or "uc"
    if qp not in ("uc", "rc"):
        raise TbcollError(f"TBCOLL_RDMA_QP={qp!r}: give uc (unreliable connection, the "
                          "default) or rc (reliable connection)")
    gid = env.get("TBCOLL_RDMA_GID_INDEX", "").strip()
    if gid and not (gid.isascii() and gid.isdigit()):
        raise TbcollError(f"TBCOLL_RDMA_GID_INDEX={gid!r}: give a GID table index (0, 1, ...)")
    return RdmaSettings(env.get("TBCOLL_RDMA_DEVICES", "").strip(), qp == "rc",
                        int(gid) if gid else -1, rdma_library(env))


def rdma_library(environ: Mapping[str, str] | None = None) -> str | None:
    """TBCOLL_RDMA_LIBRARY: the verbs library to open instead of the platform's (tbrun doctor
    looks at the one the rdma backend would open)."""
    env = os.environ if environ is None else environ
    return env.get("TBCOLL_RDMA_LIBRARY", "").strip() or None


def link_delay(environ: Mapping[str, str] | None = None) -> float:
    """TBCOLL_LINK_DELAY_US: the one-way latency of an emulated link, in seconds (0: none):
    the tcp transport lets no message arrive sooner after it was sent
    (tbcoll.transports.tcp.delayed, benchmarks/tp_latency.py)."""
    env = os.environ if environ is None else environ
    text = env.get("TBCOLL_LINK_DELAY_US", "").strip()
    if not text:
        return 0.0
    micros = _number(text)
    if not (math.isfinite(micros) and micros >= 0):
        raise TbcollError(f"TBCOLL_LINK_DELAY_US={text!r}: give a number of microseconds >= 0")
    return micros * 1e-6


def failover(environ: Mapping[str, str] | None = None) -> bool:
    """TBCOLL_FAILOVER=1: tcp carries a failed connection over the pair's next path and
    replays what its peer missed (work in progress, docs/failover.md: the Python path only,
    so the C lanes are off)."""
    env = os.environ if environ is None else environ
    return env.get("TBCOLL_FAILOVER", "").strip() == "1"


def faults(environ: Mapping[str, str] | None = None
           ) -> tuple[int, int, int, tuple[int, int] | None] | None:
    """TBCOLL_FAULTS=seed:cuts:span[:A-B], for failover's tests: the first `cuts` connections
    of each tcp stream are cut at a seeded byte below `span` (tbcoll.transports.stream.faults),
    failover on; with A-B, ranks A and B find no path left once their first connection is
    cut (a split). None: unset."""
    env = os.environ if environ is None else environ
    text = env.get("TBCOLL_FAULTS", "").strip()
    if not text:
        return None
    parts = text.split(":")
    numbers, split = parts[:3], _split_pair(parts[3]) if len(parts) == 4 else None
    if (len(parts) not in (3, 4) or not all(p.strip().isdigit() for p in numbers)
            or int(numbers[2]) < 2 or (len(parts) == 4 and split is None)):
        raise TbcollError(f"TBCOLL_FAULTS={text!r}: give seed:cuts:span, three whole numbers "
                          "(span at least 2), e.g. 7:2:100000, and optionally :A-B, two "
                          "ranks left with no path (7:1:100000:0-1)")
    seed, cuts, span = (int(p) for p in numbers)
    return seed, cuts, span, split


def _split_pair(text: str) -> tuple[int, int] | None:
    """The two different ranks of "A-B", lower first; None where it is not that."""
    a, _, b = text.strip().partition("-")
    if not (a.isdigit() and b.isdigit()) or a == b:
        return None
    return min(int(a), int(b)), max(int(a), int(b))


def segment_prefix(job: str) -> str:
    """The start of every shared-memory name of the job with this TBCOLL_JOB: /tbc-<8 hex>-.

    From the job's cookie so that tbrun can find a dead job's segments without the ranks
    telling it: random, and no secret (unlike the token, which a name would have had to hide
    behind a hash: hashlib's OpenSSL cost tbrun ~2.5 ms at every start). tbrun's ids are hex;
    of one set by hand only letters and digits count (a '/' has no place in the name).
    """
    return f"/tbc-{''.join(c for c in job if c.isascii() and c.isalnum())[:8]}-"


def segment_names(environ: Mapping[str, str] | None = None) -> str:
    """TBCOLL_SHM_NAMES: the folder where this rank writes down the shared-memory names it
    makes ("": nowhere)."""
    env = os.environ if environ is None else environ
    return env.get("TBCOLL_SHM_NAMES", "")


def job_id(environ: Mapping[str, str]) -> str:
    """TBCOLL_JOB of the process whose environment this is ("": none)."""
    return environ.get("TBCOLL_JOB", "")


def segment_record(folder: str, name: str) -> str:
    """The file in folder (TBCOLL_SHM_NAMES) that stands for the segment called name."""
    return os.path.join(folder, name.lstrip("/"))


def placement(info: LaunchInfo | None) -> tuple[int, int]:
    """This rank's local rank and its node's index (0, 0 when running alone)."""
    return (info.local_rank, info.node_rank) if info else (0, 0)


def single_host(info: LaunchInfo) -> bool:
    return info.topology.single_host


def format_hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_hostport(text: str, what: str) -> tuple[str, int]:
    """Split 'host:port' or '[v6addr]:port'."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise TbcollError(f"{what}={text!r} is not host:port")
    return host.strip("[]"), int(port)


def _required(env: Mapping[str, str], name: str) -> str:
    value = env.get(name)
    if not value:
        raise TbcollError(f"{name} is not set; start this script with tbrun (or mpiexec)")
    return value


def _int(env: Mapping[str, str], name: str) -> int:
    value = _required(env, name)
    try:
        return int(value)
    except ValueError:
        raise TbcollError(f"{name}={value!r} is not an integer") from None


def _layout(env: Mapping[str, str], name: str) -> Layout:
    try:
        return Layout.from_json(_required(env, name))
    except ValueError as e:  # (json's errors among them)
        raise TbcollError(f"{name} is not a resolved topology: {e}") from None
