"""The tbrun command line (argparse: tbcoll.launch.arguments). Every flag can also be given as
TBRUN_<NAME> in the environment."""

from __future__ import annotations

import os
import shlex
import sys
from argparse import BooleanOptionalAction, Namespace

from tbcoll.launch import slurm
from tbcoll.launch.arguments import (
    Parser,
    UsageError,
    choice,
    directory,
    file,
    one_of,
    seconds,
    whole,
)
from tbcoll.launch.config import (
    LaunchConfig,
    check_keep_going,
    parse_exports,
    read_hosts,
    resolve_program,
)
from tbcoll.launch.job import run
from tbcoll.launch.starters import REMOTE

from tbcoll.core.backends import BACKENDS, ENTRY_POINTS, known
from tbcoll.core.errors import LaunchError, TbcollError
from tbcoll.job.env import DEFAULT_TIMEOUT, transport_module
from tbcoll.job.env import comm_timeout as tbcoll_comm_timeout
from tbcoll.job.topology import MAX_RANKS

USAGE_STATUS = 2
MAP_BY = ("slot", "node")


def _hosts_options(parser: Parser) -> None:
    parser.add_argument("--hostfile", "--machinefile", metavar="FILE",
                        help="Hosts to run on: MPI text (host slots=N) or MLX's JSON hostfile.")
    parser.add_argument("-H", "--host", dest="hosts", metavar="HOST[:N],...",
                        help="Hosts to run on as a list, e.g. -H mac1:2,mac2:2.")


def _ssh_options(parser: Parser) -> None:
    parser.add_argument("--python", default=sys.executable, metavar="PATH",
                        help="Interpreter that runs .py scripts and -m modules (the same path "
                             "on every host; default: this Python).")
    parser.add_argument("--ssh", default="ssh", metavar="COMMAND",
                        help="ssh client and its options, e.g. \"ssh -F cluster.conf\"; tbrun "
                             "adds BatchMode=yes (no prompts; default: %(default)s).")
    parser.add_argument("--connect-timeout", type=seconds(1), default=10.0, metavar="SECONDS",
                        help="Seconds ssh may take to reach a host before the job fails "
                             "(default: %(default)g).")


def _tbrun_parser() -> Parser:
    parser = Parser("tbrun [OPTIONS] PROGRAM [ARGS]...", _TBRUN_HELP, epilog=_TBRUN_EPILOG)
    parser.add_argument("-np", "-n", "--np", dest="nprocs", type=whole(1, MAX_RANKS),
                        metavar="NP", help=f"Number of ranks to start, 1 to {MAX_RANKS} (with "
                        "hosts given: all their slots if left out).")
    _hosts_options(parser)
    parser.add_argument("--map-by", type=choice(MAP_BY), default="slot",
                        metavar=one_of(MAP_BY), help="slot: fill each host's slots in turn; "
                        "node: deal ranks round the hosts (default: %(default)s).")
    parser.add_argument("--backend", type=_backend, default="auto",
                        metavar=one_of(BACKENDS) + "|NAME",
                        help="Transport the ranks use (TBCOLL_BACKEND; default: %(default)s): "
                             "a built-in one, one an installed package names (entry point "
                             f"group {ENTRY_POINTS}), or one --transport-module provides.")
    parser.add_argument("--transport-module", default=transport_module(), metavar="MODULE",
                        help="A module every rank imports before opening its backend, which "
                             "provides the transport --backend names (TBCOLL_TRANSPORT_MODULE; "
                             "docs/extending.md).")
    parser.add_argument("-x", "--export", "--env", dest="exports", action="append", default=[],
                        metavar="NAME[=VALUE]", help="Export a variable to every rank (NAME "
                        "alone: tbrun's own value). Repeatable.")
    parser.add_argument("--stdin", default="0", metavar="RANK|all|none",
                        help="Which ranks read tbrun's standard input; the others read "
                             "/dev/null (default: %(default)s).")
    parser.add_argument("--master-addr", metavar="HOST",
                        help="torchrun's MASTER_ADDR for every rank (default: rank 0's host).")
    parser.add_argument("--master-port", type=whole(1, 65535), metavar="PORT",
                        help="torchrun's MASTER_PORT for every rank (default: a free port).")
    parser.add_argument("--tag-output", action=BooleanOptionalAction, default=True,
                        help="Prefix every line a rank prints with [rank]; a partial line shows "
                             "after 50 ms (default: --tag-output).")
    parser.add_argument("--output-dir", type=directory, metavar="DIR",
                        help="Also write each rank's output to DIR/rank-N.out and rank-N.err.")
    parser.add_argument("--dump-dir", type=directory, metavar="DIR",
                        help="Where the ranks' dumps go when the job fails or on SIGUSR1 to "
                             "tbrun (default: a new folder in the temporary directory, "
                             "printed).")
    parser.add_argument("--trace", type=file, metavar="FILE",
                        help="Write a timeline of every collective of every rank to FILE "
                             "(Chrome/Perfetto JSON); `python -m tbcoll.observability.trace "
                             "summary FILE` sums it up.")
    parser.add_argument("--timeout", type=seconds(0), default=0.0, metavar="SECONDS",
                        help="Stop the job after this many seconds (0: never); exit status 124 "
                             "(default: %(default)g).")
    parser.add_argument("--grace", type=seconds(0), default=3.0, metavar="SECONDS",
                        help="Seconds between SIGTERM and SIGKILL when the job is torn down "
                             "(default: %(default)g).")
    # default None: -x TBCOLL_TIMEOUT may give it instead (_exported_timeout)
    parser.add_argument("--comm-timeout", type=seconds(0, open_low=True), metavar="SECONDS",
                        help="Seconds a rank's collective or store wait may block "
                             f"(TBCOLL_TIMEOUT; default: {DEFAULT_TIMEOUT:g}).")
    parser.add_argument("--keep-going", action="store_true",
                        help="A rank that fails does not end the job: tbrun declares it failed "
                             "in the store (TBCOLL_KEEP_GOING=1; the survivors may revoke, agree "
                             "and shrink), kills for good a rank reported frozen, and exits "
                             "with the first failure's status at the end (docs/tbrun.md). Not "
                             "with --backend mpi or mlx.")
    parser.add_argument("--no-failover", action="store_true",
                        help="A pair's connection that fails ends the job even where the "
                             "hostfile gives the pair another path (TBCOLL_FAILOVER=0; by "
                             "default tcp fails over to it: docs/failover.md).")
    parser.add_argument("--store-port", type=whole(0, 65535), default=0, metavar="PORT",
                        help="Port of the rendezvous store (0, the default: any free port).")
    _ssh_options(parser)
    parser.add_argument("--launcher", type=choice(REMOTE), metavar=one_of(REMOTE),
                        help="How ranks start on other hosts (mpiexec's -launcher; default: "
                             "srun inside a Slurm allocation, else ssh).")
    parser.add_argument("--cwd", type=directory, metavar="DIR",
                        help="Working directory of the ranks, on every host (default: "
                             "tbrun's).")
    parser.add_argument("-m", "--module", action="store_true",
                        help="PROGRAM is a module to run as python -m.")
    parser.add_argument("--dry-run", action="store_true",
                        help="Print each rank's command and environment; start nothing.")
    parser.add_argument("command", nargs="...", metavar="PROGRAM [ARGS]",
                        help="What every rank runs: everything from the first word that is "
                             "not one of tbrun's flags.")
    return parser


_TBRUN_HELP = """\
Start NP ranks of PROGRAM (a .py script, a module with -m, or an executable) and supervise
them: tagged output, fail-fast teardown (or, with --keep-going, the others go on), signals
forwarded, exit status of the first rank to fail.

Each rank gets the launch contract in its environment: TBCOLL_RANK, TBCOLL_SIZE,
TBCOLL_LOCAL_RANK, TBCOLL_LOCAL_SIZE, TBCOLL_NODE_RANK, TBCOLL_BACKEND, TBCOLL_STORE,
TBCOLL_TOKEN, TBCOLL_HOSTFILE, TBCOLL_TIMEOUT, TBCOLL_JOB (TBCOLL_KEEP_GOING under
--keep-going, TBCOLL_FAILOVER=0 under --no-failover), and torchrun's RANK, WORLD_SIZE,
LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT. Also PYTHONUNBUFFERED=1, and
OMP_NUM_THREADS=1 (and the BLAS equivalents) where unset and several ranks share a host."""

_TBRUN_EPILOG = """\
Every flag can also come from the environment as TBRUN_<NAME>, e.g. TBRUN_NPROCS=4,
TBRUN_TIMEOUT=60, TBRUN_TAG_OUTPUT=0 or TBRUN_EXPORTS="A=1 B"; a flag on the command line
wins.

Also: `tbrun doctor` checks hosts, links and RDMA; `tbrun hostfile` writes a hostfile (each
has --help).

Example: tbrun -np 4 examples/hello.py"""


def tbrun(args: Namespace) -> int:
    """Run the job the command line describes and return its exit status."""
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise UsageError("Missing argument 'PROGRAM'")
    topology = read_hosts(args.hostfile, args.hosts)
    granted = slurm.allocation(os.environ) if topology is None else None
    nprocs = args.nprocs
    if granted is not None:  # inside salloc or sbatch: the allocation's nodes and tasks
        topology = granted.hostfile(slurm.node_addresses(granted.nodes))
        nprocs = nprocs or granted.ntasks
    if nprocs is None:
        if topology is None:
            raise LaunchError("give the number of ranks with -np N (or hosts with --hostfile or "
                              "-H, whose slots it then defaults to)")
        nprocs = topology.slots
        if nprocs > MAX_RANKS:
            raise LaunchError(f"the hosts have {nprocs} slots; tbrun starts at most {MAX_RANKS} "
                              "ranks: give -np")
    stdin = args.stdin
    if stdin not in ("all", "none") and not (stdin.isascii() and stdin.isdigit()
                                             and int(stdin) < nprocs):
        raise LaunchError(f"--stdin {stdin}: give a rank (0..{nprocs - 1}), all or none")
    masters = {"MASTER_ADDR": args.master_addr,
               "MASTER_PORT": args.master_port and str(args.master_port)}
    exported = parse_exports(args.exports, os.environ)
    comm_timeout = DEFAULT_TIMEOUT if args.comm_timeout is None else args.comm_timeout
    if "TBCOLL_TIMEOUT" in exported:  # the contract's variable: tbrun would overwrite it
        comm_timeout = _exported_timeout(exported.pop("TBCOLL_TIMEOUT"), args.comm_timeout)
    if args.backend not in BACKENDS and not args.transport_module and (
            args.backend not in known()):
        raise LaunchError(f"--backend {args.backend}: no such transport (known: "
                          f"{', '.join(known())}); name the module that provides it with "
                          "--transport-module MODULE")
    if args.keep_going:
        check_keep_going(args.backend)
    if args.no_failover and exported.get("TBCOLL_FAILOVER", "0") != "0":
        raise LaunchError(f"--no-failover and -x TBCOLL_FAILOVER={exported['TBCOLL_FAILOVER']} "
                          "disagree; give one of them")
    cfg = LaunchConfig(
        nprocs=nprocs,
        program=resolve_program(command[0], command[1:], args.python, args.module),
        backend=args.backend,
        transport_module=args.transport_module,
        tag_output=args.tag_output,
        output_dir=args.output_dir,
        dump_dir=args.dump_dir,
        trace=args.trace,
        timeout=args.timeout or None,
        grace=args.grace,
        comm_timeout=comm_timeout,
        # the hostfile's "envs" (MLX's JSON hostfile), then -x, which wins
        exports={**dict(e.split("=", 1) for e in (topology.envs if topology else ())),
                 **exported,
                 **{name: value for name, value in masters.items() if value},
                 **({"TBCOLL_TRACE": "1"} if args.trace else {}),
                 **({"TBCOLL_FAILOVER": "0"} if args.no_failover else {})},
        store_port=args.store_port,
        dry_run=args.dry_run,
        hostfile=topology,
        map_by=args.map_by,
        cwd=os.path.abspath(args.cwd) if args.cwd else os.getcwd(),
        python=args.python,
        ssh=tuple(shlex.split(args.ssh)),
        connect_timeout=args.connect_timeout,
        stdin=str(int(stdin)) if stdin.isdigit() else stdin,
        launcher=args.launcher or ("srun" if granted else "ssh"),
        keep_going=args.keep_going,
    )
    return run(cfg)


def _backend(text: str) -> str:
    """A backend's name: a built-in one, or any name a transport may register (checked once
    --transport-module is known, in tbrun())."""
    if text not in BACKENDS and not text.isidentifier():
        return choice(BACKENDS)(text)  # (raises, naming the built-in ones)
    return text


def _exported_timeout(value: str, given: float | None) -> float:
    """-x TBCOLL_TIMEOUT=S means --comm-timeout S; both, differing, are refused (given: the
    --comm-timeout of the command line or TBRUN_COMM_TIMEOUT, else None)."""
    seconds = tbcoll_comm_timeout(None, {"TBCOLL_TIMEOUT": value})
    if given is not None and seconds != given:
        raise LaunchError(f"-x TBCOLL_TIMEOUT={value} and --comm-timeout {given:g} disagree; "
                          "give one")
    return seconds


def _doctor_parser() -> Parser:
    parser = Parser("tbrun doctor [OPTIONS]", """\
Check this machine, or every host of a hostfile: ssh, same versions, per-cable link
addresses, RDMA (the verbs library, devices, each port in use ACTIVE with an IPv4-mapped GID,
every device the hostfile's rdma entries name, one cable per pair), MLX's jaccl where the
hostfile names RDMA devices, and on macOS the Thunderbolt cables (Thunderbolt 5?), rdma_ctl,
an IPv4 address on each Thunderbolt interface, bridge0 off, and whether the cabling is a full
mesh or a ring. Exit status 1 if a check failed.""")
    _hosts_options(parser)
    _ssh_options(parser)
    return parser


def doctor(args: Namespace) -> int:
    from tbcoll.launch.cluster.doctor import run_doctor  # here: tbrun's start-up skips it

    return run_doctor(read_hosts(args.hostfile, args.hosts), shlex.split(args.ssh), args.python,
                      args.connect_timeout)


def _hostfile_parser() -> Parser:
    parser = Parser("tbrun hostfile [OPTIONS] HOST...", """\
Write a hostfile for HOST...: MPI text (HOST slots=N), or with --json MLX's JSON hostfile,
each host probed over ssh (as mlx.distributed_config does on Macs).""")
    parser.add_argument("names", nargs="*", metavar="HOST", help="A host to probe, as ssh "
                        "reaches it.")
    parser.add_argument("--slots", type=whole(1), metavar="N",
                        help="Ranks per host; default: each host's number of cores (text), "
                             "one (--json).")
    parser.add_argument("--json", dest="as_json", action="store_true",
                        help="MLX's JSON hostfile, with the Thunderbolt cabling where the hosts "
                             "are Macs.")
    parser.add_argument("-o", "--output", type=file, metavar="FILE",
                        help="Write here instead of stdout.")
    _ssh_options(parser)
    return parser


def write_hostfile(args: Namespace) -> int:
    from tbcoll.launch.cluster.write_hostfile import json_hostfile, text_hostfile

    if not args.names:
        raise UsageError("Missing argument 'HOST...'")
    ssh = shlex.split(args.ssh)
    text = (json_hostfile(args.names, ssh, args.python, args.connect_timeout, args.slots)
            if args.as_json
            else text_hostfile(args.names, args.slots, ssh, args.python, args.connect_timeout))
    if args.output is None:
        sys.stdout.write(text)
    else:
        with open(args.output, "w") as f:
            f.write(text)
    return 0


# the command's name -> its parser and what runs it
_COMMANDS = {"tbrun": (_tbrun_parser, tbrun), "doctor": (_doctor_parser, doctor),
             "hostfile": (_hostfile_parser, write_hostfile)}


def main(argv: list[str] | None = None) -> None:
    """tbrun's command line (tbcoll.launch.command runs it): usage errors are one line and exit
    status 2."""
    argv = sys.argv[1:] if argv is None else argv
    name = argv[0] if argv and argv[0] in _COMMANDS and argv[0] != "tbrun" else "tbrun"
    make_parser, command = _COMMANDS[name]
    try:
        status = command(make_parser().parse(argv[name != "tbrun":], os.environ))
    except UsageError as e:
        print(f"tbrun: error: {e} (see tbrun --help)", file=sys.stderr)
        sys.exit(USAGE_STATUS)
    except TbcollError as e:  # LaunchError, HostfileError
        print(f"tbrun: error: {e}", file=sys.stderr)
        sys.exit(USAGE_STATUS)
    except KeyboardInterrupt:  # before the supervisor forwards SIGINT to the ranks
        sys.exit(130)
    sys.exit(status or 0)
