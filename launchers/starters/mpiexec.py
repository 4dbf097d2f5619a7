"""tbrun --backend mpi: hand the job to MPICH's mpiexec (Hydra), the engine for clusters past
a handful of Macs (and under Slurm), so that an unmodified mpi4py program runs.

tbrun keeps its own output handling: Hydra writes each rank's stdout and stderr into a FIFO
of tbrun's (-outfile-pattern, -errfile-pattern), which tbrun tags line by line as for any
job; Hydra's -prepend-rank would tag each write instead, splitting lines. Every rank runs
under tbcoll.launch.mpirank, which gives it the whole launch contract (from MPI's own variables
and what tbrun wrote for the job: mpiexec gives every rank the same environment) and stdin
for one rank only; Python programs then run under mpi4py's runner, so that a rank that fails
aborts the job, and Hydra tears it down; other programs replace the wrapper. tbrun serves the
rendezvous store (TBCOLL_STORE) as for any job. tbrun names the rank that failed
from MPICH's own words (a rank's "MPI_Abort(..., N) - process R", Hydra's
-print-all-exitcodes) and reports its status as for any job (128+N for signal N). tbrun adds
--timeout and forwards signals to mpiexec; Hydra forwards tbrun's stdin to rank 0.

The variables of the job (-x, the token, ...) go in mpiexec's environment, which Hydra
passes to every rank, never on its command line, where any local user could read them.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
from pathlib import Path

from tbcoll.launch.config import LaunchConfig, master_overrides, thread_limits
from tbcoll.launch.diagnose import describe_exit, ranks_phrase
from tbcoll.launch.hosts import LOOPBACK, JobPlan, free_port, plan_job, ssh_options
from tbcoll.launch.mpirank import LAUNCH, REPORTS, MpiJob
from tbcoll.launch.output import STREAMS, OutputRouter, log
from tbcoll.launch.scope import job_scope
from tbcoll.launch.shmclean import mpich_segments, remove_unmapped
from tbcoll.launch.starters.base import Starter
from tbcoll.launch.supervisor import RankCommand, Supervisor

from tbcoll.core.errors import LaunchError
from tbcoll.job.env import format_hostport


def find_mpiexec(python: str) -> str:
    """mpiexec on PATH, else beside the interpreter (the mpich wheel puts it in the venv)."""
    found = shutil.which("mpiexec") or shutil.which("mpiexec", path=str(Path(python).parent))
    if found is None:
        raise LaunchError("--backend mpi needs MPICH's mpiexec, found neither on PATH nor beside "
                          f"{python}; pip install mpich mpi4py (or load your cluster's MPI)")
    return found


def mpi_job(cfg: LaunchConfig, plan: JobPlan, store_port: int, token: str, job: str) -> MpiJob:
    """What every rank's tbcoll.launch.mpirank needs to give it the launch contract."""
    return MpiJob(size=cfg.nprocs, backend=cfg.backend,
                  stores=tuple(format_hostport(h.store_host, store_port) for h in plan.hosts),
                  token=token, topology=plan.topology, timeout=cfg.comm_timeout, job=job,
                  master=(plan.master_addr, free_port(LOOPBACK)),
                  master_overrides=master_overrides(cfg.exports))


def mpiexec_command(cfg: LaunchConfig, mpiexec: str, outputs: str, reports: str,
                    ssh: str | None, launch_host: str | None,
                    job: MpiJob) -> tuple[list[str], dict[str, str]]:
    """The mpiexec argv for the job, and the variables to add to its environment; outputs:
    Hydra's file pattern with %s for out/err; reports: where failing ranks write their status
    (tbcoll.launch.mpirank)."""
    if cfg.stdin not in ("0", "none"):
        raise LaunchError(f"--stdin {cfg.stdin}: under --backend mpi, mpiexec (Hydra) forwards "
                          "standard input to rank 0 only; use --stdin 0 or --stdin none")
    argv = [mpiexec, "-n", str(cfg.nprocs), "-wdir", cfg.cwd, "-print-all-exitcodes",
            "-outfile-pattern", outputs % "out", "-errfile-pattern", outputs % "err"]
    placement = placement_of(cfg)
    if cfg.hostfile is not None:
        used = sorted(set(cfg.hostfile.placement(cfg.nprocs, cfg.map_by)))
        argv += ["-hosts", ",".join(cfg.hostfile.hosts[i].name for i in used),
                 "-rankmap", ",".join(map(str, placement))]
        if cfg.launcher == "srun":  # inside a Slurm allocation: Hydra starts its proxies
            argv += ["-launcher", "slurm"]
        elif ssh is not None:
            argv += ["-launcher", "ssh", "-launcher-exec", ssh]
        if launch_host is not None:
            argv += ["-localhost", launch_host]
    limits = thread_limits(max(placement.count(h) for h in set(placement)))
    env = {**{name: os.environ.get(name, value) for name, value in limits.items()},
           **cfg.exports, "PYTHONUNBUFFERED": "1", REPORTS: reports, LAUNCH: job.encode()}
    program = list(cfg.program)
    if program[0] == cfg.python:  # mpi4py's runner in the wrapper's own interpreter
        program[1:1] = ["-m", "tbcoll.launch.mpirank", cfg.stdin]
    else:  # the wrapper sets the rank's contract, then execs the program
        program[0:0] = [cfg.python, "-m", "tbcoll.launch.mpirank", "--exec", cfg.stdin]
    return [*argv, *program], env


def run_mpi(cfg: LaunchConfig) -> int:
    mpiexec = find_mpiexec(cfg.python)
    plan = plan_job(cfg.hostfile, cfg.nprocs, cfg.map_by, route=not cfg.dry_run)
    remote = [h for h in plan.hosts if not h.local]
    launch_host = remote[0].store_host if remote else None
    with job_scope(plan, cfg.store_port, cfg.nprocs, dry_run=cfg.dry_run, mpich=True,
                   dump_dir=cfg.dump_dir, trace=cfg.trace) as scope:
        folder = Path(scope.folder)
        ssh = None
        if remote and cfg.launcher == "ssh":
            ssh = str(folder / "ssh")
            options = ssh_options(cfg.connect_timeout)
            Path(ssh).write_text(f"#!/bin/sh\nexec {shlex.join([*cfg.ssh, *options])} \"$@\"\n")
            os.chmod(ssh, 0o700)
        store_port = scope.store.port if scope.store else cfg.store_port
        launch = mpi_job(cfg, plan, store_port, scope.token, scope.job)
        argv, env = mpiexec_command(cfg, mpiexec, str(folder / "%s-%%r"), scope.folder,
                                    ssh, launch_host, launch)
        if cfg.dry_run:
            print(shlex.join(argv))
            for name, value in env.items():
                print(f"    {name}={value}")
            return 0
        streams, keepalive = {}, []
        for rank in range(cfg.nprocs):
            for stream in STREAMS:
                path = folder / f"{stream}-{rank}"
                os.mkfifo(path, 0o600)
                streams[rank, stream] = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
                keepalive.append(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        command = RankCommand(MPIEXEC, argv, {**os.environ, **env}, label="mpiexec",
                              launcher=True, stdin=cfg.stdin == "0")
        output = OutputRouter(cfg.nprocs, cfg.tag_output, cfg.output_dir,
                              hide=re.compile(_HOST_CODES.pattern.encode(), re.MULTILINE))
        supervisor = Supervisor([command], output, timeout=cfg.timeout, grace=cfg.grace,
                                log=log, streams=streams, keepalive=keepalive,
                                on_spawn=scope.janitor.watch_group, job=scope.job,
                                postmortem=scope.postmortem)
        before = mpich_segments()
        status = supervisor.run(after_spawn=scope.store.start)
        local = [rank for host in plan.hosts if host.local for rank in host.ranks]
        if (left := left_early(folder, local)) and not reported(folder):
            status = blame_early_exit(left, killed(folder, local))
        elif status and supervisor.launcher_failed:
            status = explain_failure(status, cfg.nprocs, placement_of(cfg), output,
                                     reported(folder))
        if status:
            remove_unmapped(mpich_segments() - before, log)
        return status

MPIEXEC = -1  # mpiexec's own output: passed on untagged
_ABORT = re.compile(r"application called MPI_Abort\(\w+, (-?\d+)\) - process (\d+)")
_TRACEBACK = "Traceback (most recent call last):"
_EXIT_CODES = "Exit codes:"  # Hydra's -print-all-exitcodes: then "[host] s,s,..." per host
_HOST_CODES = re.compile(r"^(?:.*Exit codes: )?\[[^\]]*\] ([\d,]+)$", re.MULTILINE)


def placement_of(cfg: LaunchConfig) -> list[int]:
    """The host of each rank, as an index into the hosts used (Hydra's -rankmap)."""
    if cfg.hostfile is None:
        return [0] * cfg.nprocs
    placement = cfg.hostfile.placement(cfg.nprocs, cfg.map_by)
    node = {host: i for i, host in enumerate(sorted(set(placement)))}
    return [node[h] for h in placement]


def rank_statuses(placement: list[int], report: str) -> dict[int, int]:
    """Each rank's status (tbrun's convention) from Hydra's -print-all-exitcodes report: raw
    wait statuses, a line per host in the order of -hosts, ranks in order within a host."""
    per_host = [[int(c) for c in codes.split(",")]
                for codes in _HOST_CODES.findall(report[report.rfind(_EXIT_CODES):])]
    statuses = {}
    for rank, host in enumerate(placement):
        local = placement[:rank].count(host)
        if host < len(per_host) and local < len(per_host[host]):
            wait_status = per_host[host][local]
            statuses[rank] = 128 + (wait_status & 0x7F) if wait_status & 0x7F else wait_status >> 8
    return statuses


def reported(job_dir: Path) -> list[tuple[int, int]]:
    """(rank, status) that ranks on this host wrote before aborting (tbcoll.launch.mpirank), the
    first to fail first."""
    reports = []
    for path in sorted(job_dir.glob("failed-*"), key=lambda path: path.stat().st_mtime_ns):
        try:
            reports.append((int(path.name.removeprefix("failed-")), int(path.read_text())))
        except ValueError:
            pass  # killed while writing it
    return reports


def _notes(job_dir: Path, outcome: str) -> list[Path]:
    """The ranks' notes of one outcome (tbcoll.launch.mpirank's report), oldest first."""
    return sorted(job_dir.glob(f"{outcome}-*"), key=lambda path: path.stat().st_mtime_ns)


def _rank_of(path: Path) -> int:
    return int(path.name.rpartition("-")[2])


def killed(job_dir: Path, local: list[int]) -> list[int]:
    """The ranks on this host that wrote no note: mpiexec ended them (or they hang on)."""
    noted = {_rank_of(path) for outcome in ("ended", "left", "failed")
             for path in _notes(job_dir, outcome)}
    return [rank for rank in local if rank not in noted]


def left_early(job_dir: Path, local: list[int]) -> list[int]:
    """The ranks whose program left with os._exit(0) without MPI_Finalize (mpirank's
    note_early_exits), first first, if that ended others: Hydra then kills the rest and
    calls the job a success. Empty where every rank ended by itself (a program may call
    MPI_Finalize, then os._exit)."""
    left = [_rank_of(path) for path in _notes(job_dir, "left")]
    return left if left and killed(job_dir, local) else []


def blame_early_exit(left: list[int], ended: list[int]) -> int:
    """Say which rank ended the job by leaving early; the job's status, 1, is what its peers
    get on the other backends (a CommError)."""
    log(f"rank {left[0]} exited with status 0 (os._exit) without MPI_Finalize while the others "
        f"ran on; mpiexec then killed {ranks_phrase(ended)}")
    return 1


def explain_failure(status: int, nprocs: int, placement: list[int], output: OutputRouter,
                    reports: list[tuple[int, int]] = ()) -> int:
    """Name the rank whose failure ended the job and return its status (tbrun's convention:
    128+N for signal N). A rank's own report (see `reported`) is surest; then MPICH's words:
    the rank that called MPI_Abort (mpi4py's runner does on an exception or a non-zero exit)
    failed first; else a rank that exited non-zero by itself; else a rank killed by a signal
    other than the SIGKILL Hydra ends the rest with."""
    if reports:
        rank, code = reports[0]
        log(f"rank {rank} {describe_exit(code)}; mpiexec stopped the other ranks")
        return code
    for rank in range(nprocs):
        if found := _ABORT.search(output.stderr_tail(rank)):
            code = int(found.group(1)) & 0xFF
            log(f"rank {found.group(2)} {describe_exit(code)} (MPI_Abort); mpiexec stopped the "
                "other ranks")
            return code
    failed = {r: s for r, s in rank_statuses(placement, output.stderr_tail(MPIEXEC)).items() if s}
    first = ([r for r, s in failed.items() if s < 128]  # exited non-zero by themselves
             or [r for r, s in failed.items() if s != 128 + signal.SIGKILL]
             or list(failed))
    if not first:
        # Hydra's teardown can cut the aborting rank's last line and its own report; a rank
        # that printed a Python traceback is then the one whose exception aborted the job
        raised = [r for r in range(nprocs) if _TRACEBACK in output.stderr_tail(r)]
        if len(raised) == 1:
            log(f"rank {raised[0]} {describe_exit(status)} (its Python exception, above); "
                "mpiexec stopped the other ranks")
            return status
        log(f"mpiexec exited with status {status}; MPICH named no rank that failed")
        return status
    rank = first[0]
    if len(first) > 1 and failed[rank] == 128 + signal.SIGKILL:  # Hydra's too
        log(f"ranks {', '.join(map(str, first))} were killed by signal 9 (SIGKILL); MPICH does "
            "not say which was first")
    else:
        log(f"rank {rank} {describe_exit(_returncode(failed[rank]))}; mpiexec stopped the other "
            "ranks")
    return failed[rank]


def _returncode(status: int) -> int:
    """Popen's returncode for a status of tbrun's convention (-N for signal N)."""
    return 128 - status if status > 128 else status


STARTER = Starter("mpiexec", run_job=run_mpi)
