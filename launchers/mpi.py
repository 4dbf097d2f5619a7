"""tbrun --backend mpi: hand the job to MPICH's mpiexec (Hydra), the engine for clusters past
a handful of Macs (and under Slurm), so that an unmodified mpi4py program runs.

tbrun keeps its own output handling: Hydra writes each rank's stdout and stderr into a FIFO
of tbrun's (-outfile-pattern, -errfile-pattern), which tbrun tags line by line as for any
job; Hydra's -prepend-rank would tag each write instead, splitting lines. Python programs run
under `python -m mpi4py`, so that a rank that fails aborts the job; Hydra then tears it down
and passes on the status. tbrun adds --timeout and forwards signals to mpiexec.
"""

from __future__ import annotations

import os
import shlex
import shutil
import tempfile
from pathlib import Path

from launchers.config import LaunchConfig, thread_limits
from launchers.hosts import plan_job, ssh_options
from launchers.output import STREAMS, OutputRouter, log
from launchers.supervisor import RankCommand, Supervisor
from tbcoll.errors import LaunchError


def find_mpiexec(python: str) -> str:
    """mpiexec on PATH, else beside the interpreter (the mpich wheel puts it in the venv)."""
    found = shutil.which("mpiexec") or shutil.which("mpiexec", path=str(Path(python).parent))
    if found is None:
        raise LaunchError("--backend mpi needs MPICH's mpiexec, found neither on PATH nor beside "
                          f"{python}; pip install mpich mpi4py (or load your cluster's MPI)")
    return found


def mpiexec_command(cfg: LaunchConfig, mpiexec: str, outputs: str, ssh: str | None,
                    launch_host: str | None) -> list[str]:
    """The mpiexec argv for the job; outputs: Hydra's file pattern with %s for out/err."""
    argv = [mpiexec, "-n", str(cfg.nprocs), "-wdir", cfg.cwd,
            "-outfile-pattern", outputs % "out", "-errfile-pattern", outputs % "err"]
    placement = [0] * cfg.nprocs
    if cfg.hostfile is not None:
        placement = cfg.hostfile.placement(cfg.nprocs, cfg.map_by)
        used = sorted(set(placement))
        node = {host: i for i, host in enumerate(used)}
        argv += ["-hosts", ",".join(cfg.hostfile.hosts[i].name for i in used),
                 "-rankmap", ",".join(str(node[h]) for h in placement)]
        if ssh is not None:
            argv += ["-launcher", "ssh", "-launcher-exec", ssh]
        if launch_host is not None:
            argv += ["-localhost", launch_host]
    limits = thread_limits(max(placement.count(h) for h in set(placement)))
    env = {**{name: os.environ.get(name, value) for name, value in limits.items()},
           **cfg.exports, "PYTHONUNBUFFERED": "1", "TBCOLL_TIMEOUT": f"{cfg.comm_timeout:g}"}
    for name, value in env.items():
        argv += ["-genv", name, value]
    program = list(cfg.program)
    if program[0] == cfg.python:
        # mpi4py's runner: an uncaught exception or a non-zero sys.exit in one rank calls
        # MPI_Abort, so Hydra ends the job at once instead of leaving the others waiting.
        program[1:1] = ["-m", "mpi4py"]
    return [*argv, *program]


def run_mpi(cfg: LaunchConfig) -> int:
    mpiexec = find_mpiexec(cfg.python)
    plan = plan_job(cfg.hostfile, cfg.nprocs, cfg.map_by, route=not cfg.dry_run)
    remote = [h for h in plan.hosts if not h.local]
    launch_host = remote[0].store_host if remote else None
    job_dir = Path(tempfile.mkdtemp(prefix="tbrun-"))  # 0700
    try:
        ssh = None
        if remote:
            ssh = str(job_dir / "ssh")
            options = ssh_options(cfg.connect_timeout)
            Path(ssh).write_text(f"#!/bin/sh\nexec {shlex.join([*cfg.ssh, *options])} \"$@\"\n")
            os.chmod(ssh, 0o700)
        argv = mpiexec_command(cfg, mpiexec, str(job_dir / "%s-%%r"), ssh, launch_host)
        if cfg.dry_run:
            print(shlex.join(argv))
            return 0
        streams, keepalive = {}, []
        for rank in range(cfg.nprocs):
            for stream in STREAMS:
                path = job_dir / f"{stream}-{rank}"
                os.mkfifo(path, 0o600)
                streams[rank, stream] = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
                keepalive.append(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        command = RankCommand(0, argv, dict(os.environ), label="mpiexec", passthrough=True)
        output = OutputRouter(cfg.nprocs, cfg.tag_output, cfg.output_dir)
        supervisor = Supervisor([command], output, timeout=cfg.timeout, grace=cfg.grace,
                                log=log, streams=streams, keepalive=keepalive)
        before = _mpich_segments()
        status = supervisor.run()
        if status:
            _remove_leaked(_mpich_segments() - before)
        return status
    finally:
        shutil.rmtree(job_dir, ignore_errors=True)


def _mpich_segments() -> set[Path]:
    """MPICH's shared-memory files on this host (Linux lists them; macOS cannot)."""
    shm = Path("/dev/shm")
    return set(shm.glob("mpich_shm_*")) if shm.is_dir() else set()


def _remove_leaked(created: set[Path]) -> None:
    """Remove the segments a failed job's ranks left: MPICH unlinks them at MPI_Finalize,
    which an aborted or killed rank never reaches. Only files created during the job that no
    process maps any more go; another job's live segment is mapped by its ranks."""
    if not created:
        return
    mapped = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            text = maps.read_text()
        except OSError:
            continue  # the process ended, or is not ours to read
        mapped.update(path for path in created if str(path) in text)
    for path in created - mapped:
        try:
            path.unlink()
        except OSError as e:
            log(f"could not remove MPICH's shared-memory file {path}: {e}")
