"""The tbrun command line. Every flag can also be given as TBRUN_<NAME> in the environment."""

from __future__ import annotations

import math
import os
import shlex
import sys
from pathlib import Path

import click
from tbcoll.launch import slurm
from tbcoll.launch.config import LaunchConfig, parse_exports, read_hosts, resolve_program
from tbcoll.launch.job import run
from tbcoll.launch.starters import REMOTE

from tbcoll.env import BACKENDS, DEFAULT_TIMEOUT
from tbcoll.env import comm_timeout as tbcoll_comm_timeout
from tbcoll.errors import LaunchError, TbcollError
from tbcoll.topology import MAX_RANKS

USAGE_STATUS = 2
_SETTINGS = {"help_option_names": ["-h", "--help"], "show_default": True}


class Seconds(click.FloatRange):
    """A number of seconds: finite (click's FloatRange takes inf and nan)."""

    name = "seconds"

    def convert(self, value, param, ctx):  # noqa: ANN001, ANN201 (click's signature)
        seconds = super().convert(value, param, ctx)
        if not math.isfinite(seconds):
            self.fail(f"{value!r} is not a finite number of seconds", param, ctx)
        return seconds


def _hosts_options(f):
    f = click.option("-H", "--host", "hosts", metavar="HOST[:N],...",
                     help="Hosts to run on as a list, e.g. -H mac1:2,mac2:2.")(f)
    return click.option("--hostfile", "--machinefile", metavar="FILE",
                        help="Hosts to run on: MPI text (host slots=N) or MLX's JSON "
                             "hostfile.")(f)


def _ssh_options(f):
    f = click.option("--connect-timeout", type=Seconds(min=1), default=10.0,
                     help="Seconds ssh may take to reach a host before the job fails.")(f)
    f = click.option("--ssh", default="ssh", metavar="COMMAND",
                     help="ssh client and its options, e.g. \"ssh -F cluster.conf\"; tbrun "
                          "adds BatchMode=yes (no prompts).")(f)
    return click.option("--python", default=sys.executable, show_default="this Python",
                        help="Interpreter that runs .py scripts and -m modules (the same "
                             "path on every host).")(f)


@click.command(
    context_settings={"allow_interspersed_args": False, **_SETTINGS},
    epilog="Every flag can also come from the environment as TBRUN_<NAME>, e.g. TBRUN_NPROCS=4 "
           "or TBRUN_TIMEOUT=60; a flag on the command line wins.\n\n"
           "Also: `tbrun doctor` checks hosts, links and RDMA; `tbrun hostfile` writes a "
           "hostfile (each has --help).\n\n"
           "Example: tbrun -np 4 examples/hello.py",
)
@click.option("-np", "-n", "--np", "nprocs", type=click.IntRange(1, MAX_RANKS),
              help="Number of ranks to start (with hosts given: all their slots if left out).")
@_hosts_options
@click.option("--map-by", type=click.Choice(["slot", "node"]), default="slot",
              help="slot: fill each host's slots in turn; node: deal ranks round the hosts.")
@click.option("--backend", type=click.Choice(BACKENDS), default="auto",
              help="Transport the ranks use (TBCOLL_BACKEND).")
@click.option("-x", "--export", "--env", "exports", multiple=True, metavar="NAME[=VALUE]",
              help="Export a variable to every rank (NAME alone: tbrun's own value). Repeatable.")
@click.option("--stdin", "stdin", default="0", metavar="RANK|all|none",
              help="Which ranks read tbrun's standard input; the others read /dev/null.")
@click.option("--master-addr", metavar="HOST",
              help="torchrun's MASTER_ADDR for every rank (default: rank 0's host).")
@click.option("--master-port", type=click.IntRange(1, 65535), metavar="PORT",
              help="torchrun's MASTER_PORT for every rank (default: a free port).")
@click.option("--tag-output/--no-tag-output", default=True,
              help="Prefix every line a rank prints with [rank]; a partial line shows after "
                   "50 ms.")
@click.option("--output-dir", type=click.Path(file_okay=False, path_type=Path), metavar="DIR",
              help="Also write each rank's output to DIR/rank-N.out and rank-N.err.")
@click.option("--dump-dir", type=click.Path(file_okay=False, path_type=Path), metavar="DIR",
              help="Where the ranks' dumps go when the job fails or on SIGUSR1 to tbrun "
                   "(default: a new folder in the temporary directory, printed).")
@click.option("--trace", type=click.Path(dir_okay=False, path_type=Path), metavar="FILE",
              help="Write a timeline of every collective of every rank to FILE (Chrome/"
                   "Perfetto JSON); `python -m tbcoll.trace summary FILE` sums it up.")
@click.option("--timeout", type=Seconds(min=0), default=0,
              help="Stop the job after this many seconds (0: never); exit status 124.")
@click.option("--grace", type=Seconds(min=0), default=3.0,
              help="Seconds between SIGTERM and SIGKILL when the job is torn down.")
@click.option("--comm-timeout", type=Seconds(min=0, min_open=True),
              default=DEFAULT_TIMEOUT,
              help="Seconds a rank's collective or store wait may block (TBCOLL_TIMEOUT).")
@click.option("--store-port", type=click.IntRange(0, 65535), default=0,
              help="Port of the rendezvous store (0: any free port).")
@_ssh_options
@click.option("--launcher", type=click.Choice(REMOTE),
              show_default="srun inside a Slurm allocation, else ssh",
              help="How ranks start on other hosts (mpiexec's -launcher).")
@click.option("--cwd", type=click.Path(file_okay=False), metavar="DIR",
              show_default="tbrun's", help="Working directory of the ranks, on every host.")
@click.option("-m", "--module", is_flag=True, help="PROGRAM is a module to run as python -m.")
@click.option("--dry-run", is_flag=True,
              help="Print each rank's command and environment; start nothing.")
@click.argument("program")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def tbrun(nprocs: int | None, hostfile: str | None, hosts: str | None, map_by: str,
          backend: str, exports: tuple[str, ...], stdin: str, master_addr: str | None,
          master_port: int | None, tag_output: bool, output_dir: Path | None,
          dump_dir: Path | None, trace: Path | None, timeout: float, grace: float,
          comm_timeout: float, store_port: int, python: str,
          cwd: str | None, ssh: str, connect_timeout: float, launcher: str | None,
          module: bool, dry_run: bool, program: str, args: tuple[str, ...]) -> int:
    """Start NP ranks of PROGRAM (a .py script, a module with -m, or an executable) and
    supervise them: tagged output, fail-fast teardown, signals forwarded, exit status of the
    first rank to fail.

    Each rank gets the launch contract in its environment: TBCOLL_RANK, TBCOLL_SIZE,
    TBCOLL_LOCAL_RANK, TBCOLL_LOCAL_SIZE, TBCOLL_NODE_RANK, TBCOLL_BACKEND, TBCOLL_STORE,
    TBCOLL_TOKEN, TBCOLL_HOSTFILE, TBCOLL_TIMEOUT, TBCOLL_JOB, and torchrun's RANK, WORLD_SIZE,
    LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT. Also PYTHONUNBUFFERED=1, and
    OMP_NUM_THREADS=1 (and the BLAS equivalents) where unset and several ranks share a host.
    """
    topology = read_hosts(hostfile, hosts)
    granted = slurm.allocation(os.environ) if topology is None else None
    if granted is not None:  # inside salloc or sbatch: the allocation's nodes and tasks
        topology = granted.hostfile(slurm.node_addresses(granted.nodes))
        nprocs = nprocs or granted.ntasks
    launcher = launcher or ("srun" if granted else "ssh")
    if nprocs is None:
        if topology is None:
            raise LaunchError("give the number of ranks with -np N (or hosts with --hostfile or "
                              "-H, whose slots it then defaults to)")
        nprocs = topology.slots
        if nprocs > MAX_RANKS:
            raise LaunchError(f"the hosts have {nprocs} slots; tbrun starts at most {MAX_RANKS} "
                              "ranks: give -np")
    if stdin not in ("all", "none") and not (stdin.isascii() and stdin.isdigit()
                                             and int(stdin) < nprocs):
        raise LaunchError(f"--stdin {stdin}: give a rank (0..{nprocs - 1}), all or none")
    masters = {"MASTER_ADDR": master_addr, "MASTER_PORT": master_port and str(master_port)}
    exported = parse_exports(exports, os.environ)
    if "TBCOLL_TIMEOUT" in exported:  # the contract's variable: tbrun would overwrite it
        comm_timeout = _exported_timeout(exported.pop("TBCOLL_TIMEOUT"), comm_timeout)
    cfg = LaunchConfig(
        nprocs=nprocs,
        program=resolve_program(program, args, python, module),
        backend=backend,
        tag_output=tag_output,
        output_dir=output_dir,
        dump_dir=dump_dir,
        trace=trace,
        timeout=timeout or None,
        grace=grace,
        comm_timeout=comm_timeout,
        # the hostfile's "envs" (MLX's JSON hostfile), then -x, which wins
        exports={**dict(e.split("=", 1) for e in (topology.envs if topology else ())),
                 **exported,
                 **{name: value for name, value in masters.items() if value},
                 **({"TBCOLL_TRACE": "1"} if trace else {})},
        store_port=store_port,
        dry_run=dry_run,
        hostfile=topology,
        map_by=map_by,
        cwd=os.path.abspath(cwd) if cwd else os.getcwd(),
        python=python,
        ssh=tuple(shlex.split(ssh)),
        connect_timeout=connect_timeout,
        stdin=str(int(stdin)) if stdin.isdigit() else stdin,
        launcher=launcher,
    )
    return run(cfg)


def _exported_timeout(value: str, comm_timeout: float) -> float:
    """-x TBCOLL_TIMEOUT=S means --comm-timeout S; both, differing, are refused."""
    seconds = tbcoll_comm_timeout(None, {"TBCOLL_TIMEOUT": value})
    given = click.get_current_context().get_parameter_source("comm_timeout")
    if given is not click.core.ParameterSource.DEFAULT and seconds != comm_timeout:
        raise LaunchError(f"-x TBCOLL_TIMEOUT={value} and --comm-timeout {comm_timeout:g} "
                          "disagree; give one")
    return seconds


@click.command(context_settings=_SETTINGS)
@_hosts_options
@_ssh_options
def doctor(hostfile: str | None, hosts: str | None, python: str, ssh: str,
           connect_timeout: float) -> int:
    """Check this machine, or every host of a hostfile: ssh, same versions, per-cable link
    addresses, RDMA (the verbs library, devices, each port in use ACTIVE with an IPv4-mapped
    GID, every device the hostfile's rdma entries name, one cable per pair), MLX's jaccl where
    the hostfile names RDMA devices, and on macOS the Thunderbolt cables (Thunderbolt 5?),
    rdma_ctl, an IPv4 address on each Thunderbolt interface, bridge0 off, and whether the
    cabling is a full mesh or a ring. Exit status 1 if a check failed."""
    from tbcoll.launch.cluster.doctor import run_doctor  # here: tbrun's start-up skips it

    return run_doctor(read_hosts(hostfile, hosts), shlex.split(ssh), python, connect_timeout)


@click.command("hostfile", context_settings=_SETTINGS)
@click.argument("names", nargs=-1, required=True, metavar="HOST...")
@click.option("--slots", type=click.IntRange(min=1),
              help="Ranks per host (text); default: each host's number of cores.")
@click.option("--json", "as_json", is_flag=True,
              help="MLX's JSON hostfile, with the Thunderbolt cabling where the hosts are Macs.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Write here instead of stdout.")
@_ssh_options
def write_hostfile(names: tuple[str, ...], slots: int | None, as_json: bool, output: Path | None,
                   python: str, ssh: str, connect_timeout: float) -> int:
    """Write a hostfile for HOST...: MPI text (HOST slots=N), or with --json MLX's JSON
    hostfile, each host probed over ssh (as mlx.distributed_config does on Macs)."""
    from tbcoll.launch.cluster.write_hostfile import json_hostfile, text_hostfile

    text = (json_hostfile(names, shlex.split(ssh), python, connect_timeout) if as_json
            else text_hostfile(names, slots, shlex.split(ssh), python, connect_timeout))
    if output is None:
        sys.stdout.write(text)
    else:
        output.write_text(text)
    return 0


_SUBCOMMANDS = {"doctor": doctor, "hostfile": write_hostfile}


def main(argv: list[str] | None = None) -> None:
    """tbrun's command line (tbcoll.launch.command runs it): usage errors are one line and exit
    status 2."""
    argv = sys.argv[1:] if argv is None else argv
    command, name = tbrun, "tbrun"
    if argv and argv[0] in _SUBCOMMANDS:
        command, name, argv = _SUBCOMMANDS[argv[0]], f"tbrun {argv[0]}", argv[1:]
    try:
        status = command.main(argv, prog_name=name, standalone_mode=False,
                              auto_envvar_prefix="TBRUN")
    except click.ClickException as e:
        message = e.format_message().rstrip(".")
        print(f"tbrun: error: {message} (see tbrun --help)", file=sys.stderr)
        sys.exit(USAGE_STATUS)
    except TbcollError as e:  # LaunchError, HostfileError
        print(f"tbrun: error: {e}", file=sys.stderr)
        sys.exit(USAGE_STATUS)
    except click.Abort:
        sys.exit(130)
    sys.exit(status or 0)
