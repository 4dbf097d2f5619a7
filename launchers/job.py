"""Run a job on this machine: serve the store, build each rank's environment, supervise."""

from __future__ import annotations

import errno
import os
import shlex
import shutil
import socket
import sys
import tempfile
from pathlib import Path

from launchers.config import LaunchConfig
from launchers.output import OutputRouter
from launchers.supervisor import RankCommand, Supervisor
from tbcoll.auth import new_token
from tbcoll.env import LaunchInfo, mlx_ring_env, mlx_ring_hostfile, segment_prefix, worker_env
from tbcoll.errors import LaunchError
from tbcoll.rendezvous import StoreServer

# Set to 1 when unset and several ranks share a host, as torchrun does for OMP_NUM_THREADS,
# so that N ranks on N cores do not each start N BLAS threads.
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
               "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")


def log(message: str) -> None:
    print(f"tbrun: {message}", file=sys.stderr, flush=True)


def rank_commands(cfg: LaunchConfig, store: tuple[str, int], token: str,
                  master: tuple[str, int], mlx_hostfile: str | None = None
                  ) -> list[RankCommand]:
    """One command per rank, all on this host (with MLX's variables if mlx_hostfile)."""
    n = cfg.nprocs
    topology = {"hosts": [{"name": "localhost", "ranks": list(range(n))}]}
    base = dict(os.environ)
    if n > 1:
        for name in THREAD_VARS:
            base.setdefault(name, "1")
    base.update(cfg.exports)
    base["PYTHONUNBUFFERED"] = "1"
    commands = []
    for rank in range(n):
        info = LaunchInfo(rank=rank, size=n, local_rank=rank, local_size=n, node_rank=0,
                          backend=cfg.backend, store=store, token=token, topology=topology,
                          timeout=cfg.comm_timeout)
        env = {**base, **worker_env(info, master)}
        if mlx_hostfile is not None:
            env.update(mlx_ring_env(rank, mlx_hostfile))
        commands.append(RankCommand(rank, cfg.program, env))
    return commands


def dry_run(cfg: LaunchConfig) -> int:
    """Print each rank's command and the variables tbrun would set, and start nothing."""
    commands = rank_commands(cfg, (cfg.store_host, cfg.store_port), "<made at launch>",
                             (cfg.store_host, 0),
                             "<made at launch>" if cfg.backend == "mlx" else None)
    print("# port 0: a free port is chosen at launch")
    for cmd in commands:
        print(f"rank {cmd.rank}: {shlex.join(cmd.argv)}")
        for name, value in cmd.env.items():
            if os.environ.get(name) != value:
                print(f"    {name}={value}")
    return 0


def run_local(cfg: LaunchConfig) -> int:
    """Run the job and return its exit status."""
    if cfg.dry_run:
        return dry_run(cfg)
    if cfg.backend == "mpi":
        # Ranks tbrun started would each be an MPI job of one: an mpi4py program would run
        # N times alone and give wrong answers without a word. Refuse until tbrun hands the
        # job to mpiexec itself.
        raise LaunchError(f"--backend mpi: MPI ranks must be started by mpiexec; run "
                          f"`mpiexec -n {cfg.nprocs} {shlex.join(cfg.program)}` (tbcoll.init() "
                          "picks the mpi backend there by itself)")
    token = new_token()
    try:
        store = StoreServer(token, cfg.store_host, cfg.store_port, log=log)
    except OSError as e:
        reason = "address already in use" if e.errno == errno.EADDRINUSE else e.strerror
        raise LaunchError(
            f"cannot listen on {cfg.store_host}:{cfg.store_port} for the rendezvous store: "
            f"{reason}; choose another --store-port, or 0 for any free port") from e
    job_dir = Path(tempfile.mkdtemp(prefix="tbrun-"))  # 0700: the job's private files
    try:
        mlx_hostfile = None
        if cfg.backend == "mlx":  # what mlx.launch writes for MLX's ring backend
            mlx_hostfile = str(job_dir / "mlx-hostfile.json")
            ports = [(cfg.store_host, _free_port(cfg)) for _ in range(cfg.nprocs)]
            Path(mlx_hostfile).write_text(mlx_ring_hostfile(ports))
        commands = rank_commands(cfg, store.address, token, (cfg.store_host, _free_port(cfg)),
                                 mlx_hostfile)
        output = OutputRouter(cfg.nprocs, cfg.tag_output, cfg.output_dir)
        supervisor = Supervisor(commands, output, timeout=cfg.timeout, grace=cfg.grace, log=log)
        return supervisor.run(after_spawn=store.start)
    finally:
        store.close()
        shutil.rmtree(job_dir, ignore_errors=True)
        remove_segments(token)


def remove_segments(token: str) -> None:
    """Unlink shared-memory names the job left (ranks unlink their own once every rank has
    mapped a segment; this catches a job killed before that). Where the OS cannot list them
    (macOS), nothing is found and nothing is needed beyond the ranks' own unlinking."""
    prefix = segment_prefix(token).lstrip("/")
    for folder, pattern in ((Path("/dev/shm"), f"{prefix}*"),
                            (Path(tempfile.gettempdir()), f"{prefix}*.lock")):
        for path in folder.glob(pattern) if folder.is_dir() else ():
            try:
                path.unlink()
            except OSError as e:
                log(f"could not remove the job's shared-memory file {path}: {e}")


def _free_port(cfg: LaunchConfig) -> int:
    """A port for MASTER_PORT that nothing listens on now (the script binds it itself)."""
    with socket.socket() as s:
        s.bind((cfg.store_host, 0))
        return s.getsockname()[1]
