"""What each rank of `tbrun --backend mpi` runs under: `python -m tbcoll.launch.mpirank STDIN
PROGRAM...` for a Python program, `python -m tbcoll.launch.mpirank --exec STDIN PROGRAM...` for
any other, where STDIN is the rank that reads the job's input ("none": no rank).

mpiexec gives every rank the same environment; this wrapper makes it the rank's own launch
contract (tbcoll.job.env.worker_env), as tbrun gives it on every other backend. Its rank and the
job's size come from MPI's own variables (PMI_RANK, PMI_SIZE: torchrun_names_from_mpi); the
rest from what tbrun wrote for the whole job in TBCOLL_MPI_LAUNCH (MpiJob, below; removed from
the rank's environment here): its host, hence its node and local rank, from the resolved
topology, which lists each host's ranks as Hydra places them (-rankmap), and the store's
address as that host reaches tbrun. The token travels in that variable, never on a command
line. Under a plain mpiexec (no TBCOLL_MPI_LAUNCH) the rank gets torchrun's RANK, WORLD_SIZE,
LOCAL_RANK and LOCAL_WORLD_SIZE only.

Every rank but STDIN gets /dev/null as stdin (Hydra leaves their stdin open with nothing ever
arriving, so a read would hang). Then a Python PROGRAM runs with mpi4py's runner, so that an
uncaught exception or a non-zero exit in one rank aborts the job at once (MPI_Abort) instead
of leaving the others waiting; any other program replaces this process (exec), and Hydra
reports its exit. Before a Python rank aborts, a rank on tbrun's host writes its status into
tbrun's job directory (TBCOLL_MPI_REPORTS): Hydra's teardown can cut the rank's last lines and
Hydra's own exit codes, and tbrun must still name the rank. It also removes the topology file
that its host's Hydra proxy would leave in /tmp after the abort (tbcoll.launch.hydratopo).
A rank that ends with os._exit(0) while MPI runs makes Hydra kill the others and call the job
a success: it writes left-RANK first, and every rank whose program ends writes ended-RANK, so
that tbrun can fail the job and name the rank (note_early_exits).
"""

from __future__ import annotations

import json
import os
import stat
import sys
from collections.abc import Mapping
from typing import NoReturn

from tbcoll.launch.hydratopo import remove_proxy_topology

from tbcoll.core.errors import TbcollError
from tbcoll.core.records import record
from tbcoll.job.env import LaunchInfo, parse_hostport, torchrun_names_from_mpi, worker_env
from tbcoll.job.topology import Layout

LAUNCH = "TBCOLL_MPI_LAUNCH"
REPORTS = "TBCOLL_MPI_REPORTS"


@record
class MpiJob:
    """What tbrun tells every rank of an mpi job: the launch contract but for what differs
    per rank, and the store's address per node."""

    size: int
    backend: str
    stores: tuple[str, ...]  # host:port of tbrun's store as each node (topology order) has it
    token: str
    topology: Layout  # TBCOLL_HOSTFILE
    timeout: float
    job: str  # TBCOLL_JOB
    master: tuple[str, int]  # tbrun's MASTER_ADDR and MASTER_PORT
    master_overrides: dict[str, str]  # the user's, which win

    def encode(self) -> str:
        return json.dumps({**self._asdict(), "topology": self.topology.to_json()},
                          separators=(",", ":"))

    @classmethod
    def decode(cls, text: str) -> MpiJob:
        fields = json.loads(text)
        fields["stores"], fields["master"] = tuple(fields["stores"]), tuple(fields["master"])
        fields["topology"] = Layout.from_json(fields["topology"])
        return cls(**fields)

    def rank_env(self, rank: int) -> dict[str, str]:
        """The contract of one rank (its own values where ranks differ)."""
        for node, host in enumerate(self.topology.hosts):
            if rank in host.ranks:
                info = LaunchInfo(rank=rank, size=self.size, local_rank=host.ranks.index(rank),
                                  local_size=len(host.ranks), node_rank=node,
                                  backend=self.backend,
                                  store=parse_hostport(self.stores[node], LAUNCH),
                                  token=self.token, topology=self.topology,
                                  timeout=self.timeout, job=self.job)
                return {**worker_env(info, self.master), **self.master_overrides}
        raise TbcollError(f"rank {rank} is on none of the job's hosts ({LAUNCH})")


def rank_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables this rank gets: the whole contract in a tbrun job, torchrun's names from
    MPI's under a plain mpiexec."""
    names = torchrun_names_from_mpi(environ)
    if LAUNCH not in environ:
        return names
    if not names.get("RANK", "").isdigit():
        raise TbcollError("mpiexec gave this process no rank (PMI_RANK): tbcoll.launch.mpirank "
                          "runs the ranks of tbrun --backend mpi only")
    try:
        job = MpiJob.decode(environ[LAUNCH])
    except (ValueError, KeyError, TypeError) as e:
        raise TbcollError(f"{LAUNCH} is not what tbrun writes ({e})") from None
    rank = int(names["RANK"])
    if names.get("WORLD_SIZE") != str(job.size):
        raise TbcollError(f"MPI says this is rank {rank} of {names.get('WORLD_SIZE', '?')}, "
                          f"but tbrun started {job.size} ranks")
    return job.rank_env(rank)


def main() -> None:
    args = sys.argv[1:]
    execute = args[:1] == ["--exec"]
    if execute:
        args = args[1:]
    stdin_rank, program = args[0], args[1:]
    try:
        names = rank_environment(os.environ)
    except TbcollError as e:
        print(f"tbrun: tbcoll.launch.mpirank: {e}", file=sys.stderr, flush=True)
        sys.exit(2)
    os.environ.pop(LAUNCH, None)  # the token stays in TBCOLL_TOKEN alone
    os.environ.update(names)
    rank = names.get("RANK")
    if rank != stdin_rank:
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
    if execute:
        try:
            os.execvp(program[0], program)
        except OSError as e:
            print(f"tbrun: rank {rank}: cannot run {program[0]}: {e.strerror}", file=sys.stderr,
                  flush=True)
            report_failure(rank, 127)
            sys.exit(127)
    sys.argv[1:] = program
    note_early_exits(rank)
    from mpi4py.run import main as run_with_mpi4py

    try:
        run_with_mpi4py()  # reads sys.argv[1:]: the program and its arguments
    except SystemExit as exc:
        if exc.code not in (None, 0):
            before_abort(rank, exc.code if isinstance(exc.code, int) else 1)
        else:
            report(rank, "ended", "0")
        raise
    except KeyboardInterrupt:
        before_abort(rank, 130)
        raise
    except BaseException:
        before_abort(rank, 1)
        raise
    report(rank, "ended", "0")


def note_early_exits(rank: str | None) -> None:
    """Have os._exit, in this process, first tell tbrun when it ends the rank while MPI is
    initialized and not finalized: with status 0, Hydra would kill the other ranks and call
    the job a success, and nothing else of this process runs to say which rank left
    (left-RANK; tbrun names it); with another status, as before_abort."""
    exit_now, me = os._exit, os.getpid()

    def noted_exit(status: int) -> NoReturn:
        mpi = sys.modules.get("mpi4py.MPI")
        if (os.getpid() == me and mpi is not None and mpi.Is_initialized()
                and not mpi.Is_finalized()):
            if status == 0:
                report(rank, "left", "0")
            else:
                before_abort(rank, status)
        exit_now(status)

    os._exit = noted_exit


def before_abort(rank: str | None, status: int) -> None:
    """The rank failed: mpi4py's runner calls MPI_Abort as it exits (if the program imported
    MPI), and mpiexec exits at once. Report the status to tbrun, and remove the file that
    this host's Hydra proxy would leave in /tmp (tbcoll.launch.hydratopo)."""
    report_failure(rank, status)
    if sys.modules.get("mpi4py.MPI") is not None:
        remove_proxy_topology()


def report_failure(rank: str | None, status: int) -> None:
    """Write `status` to tbrun's job directory as failed-RANK."""
    report(rank, "failed", f"{status & 0xFF}")


def report(rank: str | None, outcome: str, text: str) -> None:
    """Write text to tbrun's job directory as OUTCOME-RANK, if this host has that directory
    and it is this user's alone (on another host the same path could be anybody's)."""
    directory = os.environ.get(REPORTS)
    if not directory or rank is None:
        return
    try:
        info = os.lstat(directory)
        if (not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid()
                or info.st_mode & 0o077):
            return
        fd = os.open(os.path.join(directory, f"{outcome}-{rank}"),
                     os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f"{text}\n")
    except OSError:
        pass  # tbrun falls back on MPICH's words


if __name__ == "__main__":
    main()
