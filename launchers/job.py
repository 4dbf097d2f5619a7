"""Run a job: serve the store, build each rank's command and environment, supervise."""

from __future__ import annotations

import json
import os
import shlex

from tbcoll.launch.config import LaunchConfig, master_overrides, thread_limits
from tbcoll.launch.hosts import LOOPBACK, JobPlan, free_port, plan_job
from tbcoll.launch.openfiles import raise_open_files
from tbcoll.launch.output import OutputRouter, log
from tbcoll.launch.scope import UNMADE, JobScope, job_scope
from tbcoll.launch.starters import RankSpec, starter_for
from tbcoll.launch.stdin import standard_input, stdin_ranks
from tbcoll.launch.supervisor import RankCommand, Supervisor

from tbcoll.core.errors import LaunchError
from tbcoll.job.env import LaunchInfo, worker_env

# descriptors tbrun holds a rank, with room: measured on Linux, 2 (its output pipes; tbrun
# held 14 for -np 2, 30 for -np 10), and a wrapped rank (macOS) has its input pipe too
_FILES_PER_RANK = 4
_FILES_SPARE = 64

TYPE_CHECKING = False  # typing's, without importing typing (~2 ms of tbrun's start-up)
if TYPE_CHECKING:
    from tbcoll.launch.authority import Authority
    from tbcoll.launch.mlxvars import MlxVariables


def rank_commands(cfg: LaunchConfig, plan: JobPlan, store_port: int, token: str,
                  master_port: int, mlx: MlxVariables | None, files_dir: str,
                  job: str, segment_names: str) -> list[RankCommand]:
    """One command per rank, in rank order, each from its host's starter; segment_names
    (TBCOLL_SHM_NAMES) goes to the ranks on this host."""
    n = cfg.nprocs
    commands = []
    for node, host in enumerate(plan.hosts):
        starter = starter_for(cfg, host)
        for local_rank, rank in enumerate(host.ranks):
            info = LaunchInfo(rank=rank, size=n, local_rank=local_rank, local_size=len(host.ranks),
                              node_rank=node, backend=cfg.backend,
                              store=(host.store_host, store_port), token=token,
                              topology=plan.topology, timeout=cfg.comm_timeout, job=job,
                              segment_names=segment_names if host.local else "",
                              transport_module=cfg.transport_module)
            env = {**cfg.exports, "PYTHONUNBUFFERED": "1",
                   **worker_env(info, (plan.master_addr, master_port)),
                   **master_overrides(cfg.exports), **(mlx.for_rank(rank) if mlx else {}),
                   **rdma_devices(cfg), **keep_going_env(cfg)}
            spec = RankSpec(rank, host, cfg.program, cfg.cwd, env, thread_limits(len(host.ranks)),
                            mlx.files if mlx else {}, files_dir,
                            rank in stdin_ranks(cfg.stdin, n))
            commands.append(starter.command(spec, cfg))
    return sorted(commands, key=lambda c: c.rank)


def keep_going_env(cfg: LaunchConfig) -> dict[str, str]:
    """TBCOLL_KEEP_GOING=1 under --keep-going (tbcoll.job.env.keep_going reads it)."""
    return {"TBCOLL_KEEP_GOING": "1"} if cfg.keep_going else {}


def rdma_devices(cfg: LaunchConfig) -> dict[str, str]:
    """For --backend rdma, the hostfile's "rdma" matrix as TBCOLL_RDMA_DEVICES (the device
    each host reaches each other host by: tbcoll.transports.rdma.devices), unless the user set
    it."""
    if (cfg.backend != "rdma" or cfg.hostfile is None
            or "TBCOLL_RDMA_DEVICES" in cfg.exports or "TBCOLL_RDMA_DEVICES" in os.environ
            or not any(h.rdma for h in cfg.hostfile.hosts)):
        return {}
    matrix = [[list(d) if isinstance(d, tuple) else d for d in h.rdma] for h in cfg.hostfile.hosts]
    return {"TBCOLL_RDMA_DEVICES": json.dumps(matrix, separators=(",", ":"))}


def mlx_variables(cfg: LaunchConfig, plan: JobPlan) -> MlxVariables | None:
    """What mlx.launch would give the ranks, for --backend mlx (whose module only it imports)."""
    if cfg.backend != "mlx":
        return None
    from tbcoll.launch.mlxvars import job_variables

    return job_variables(cfg, plan)


def dry_run(cfg: LaunchConfig, plan: JobPlan) -> int:
    """Print each rank's command and the variables tbrun would set, and start nothing."""
    commands = rank_commands(cfg, plan, cfg.store_port, UNMADE, 0, mlx_variables(cfg, plan),
                             "<job directory>", UNMADE, UNMADE)
    print("# port 0: a free port is chosen at launch")
    for cmd in commands:
        print(f"{cmd.name}: {shlex.join(cmd.argv)}")
        if cmd.setup is not None:
            print(f"    (on stdin) {cmd.setup.decode().rstrip()}")
            continue
        for name, value in cmd.env.items():
            if os.environ.get(name) != value:
                print(f"    {name}={value}")
    return 0


def check_open_files(limit: int, nprocs: int) -> None:
    """LaunchError where tbrun could run out of descriptors (~_FILES_PER_RANK a rank) under
    the soft limit of open files, which raise_open_files could not raise far enough."""
    needed = _FILES_PER_RANK * nprocs + _FILES_SPARE
    if limit < needed:
        raise LaunchError(f"{nprocs} ranks need about {needed} open files in tbrun, and the "
                          f"limit is {limit} (ulimit -n; its hard limit stops tbrun from "
                          f"raising it): raise it (ulimit -n {needed}, or on macOS "
                          "launchctl limit maxfiles) or start fewer ranks")


def authority_of(cfg: LaunchConfig, scope: JobScope) -> Authority | None:
    """Under --keep-going, the failed set's side of the job's store."""
    if not cfg.keep_going:
        return None
    from tbcoll.launch.authority import Authority  # here: a job without it starts without it

    return Authority(scope.store, scope.postmortem)


def run(cfg: LaunchConfig) -> int:
    """Run the job and return its exit status."""
    job_starter = starter_for(cfg)
    if job_starter.run_job is not None:  # e.g. MPI ranks: mpiexec hands them PMI
        return job_starter.run_job(cfg)
    if cfg.backend == "shm" and cfg.hostfile and len(
            set(cfg.hostfile.placement(cfg.nprocs, cfg.map_by))) > 1:
        raise LaunchError("--backend shm needs every rank on one host; use tcp (or auto, which "
                          "picks it) across hosts")
    if cfg.dry_run:
        return dry_run(cfg, plan_job(cfg.hostfile, cfg.nprocs, cfg.map_by, route=False))
    check_open_files(raise_open_files(), cfg.nprocs)
    plan = plan_job(cfg.hostfile, cfg.nprocs, cfg.map_by)
    with job_scope(plan, cfg.store_port, cfg.nprocs, dump_dir=cfg.dump_dir,
                   trace=cfg.trace) as scope:
        mlx = mlx_variables(cfg, plan)
        files_dir = scope.folder if mlx else ""  # the job's folder is made only if used
        for name, content in (mlx.files if mlx else {}).items():
            with open(os.path.join(files_dir, f"{name}.json"), "w") as f:
                f.write(content)
        commands = rank_commands(cfg, plan, scope.store.port, scope.token, free_port(LOOPBACK),
                                 mlx, files_dir, scope.job, scope.segment_names)
        hide = {starter_for(cfg, host).hide for host in plan.hosts} - {None}
        output = OutputRouter(cfg.nprocs, cfg.tag_output, cfg.output_dir,
                              hide=hide.pop() if hide else None)
        supervisor = Supervisor(commands, output, timeout=cfg.timeout, grace=cfg.grace,
                                log=log, stdin_fd=standard_input(),
                                peer_failure=scope.store.peer_failure,
                                on_spawn=scope.janitor.watch_group, job=scope.job,
                                postmortem=scope.postmortem,
                                authority=authority_of(cfg, scope))
        return supervisor.run(after_spawn=scope.store.start)
