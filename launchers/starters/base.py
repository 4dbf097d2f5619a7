"""What every starter shares: the Starter entry and the description of one rank to start."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence

from tbcoll.launch.config import LaunchConfig
from tbcoll.launch.hosts import HostPlan, remote_setup
from tbcoll.launch.supervisor import RankCommand

from tbcoll.core.records import record


@record
class RankSpec:
    """One rank of a job, wherever it is going to run."""

    rank: int
    host: HostPlan
    argv: Sequence[str]
    cwd: str
    env: Mapping[str, str]  # the job's variables for this rank (contract, -x, MLX's)
    defaults: Mapping[str, str]  # set only where the host has none (thread limits)
    files: Mapping[str, str]  # variable -> content of a file it should name (MLX's hostfiles)
    files_dir: str  # where tbrun wrote those files, for ranks on this machine
    stdin: bool  # reads tbrun's standard input

    def setup(self) -> bytes:
        """tbcoll.launch.remote's set-up line for this rank."""
        return remote_setup(self.argv, self.cwd, self.env, self.defaults, self.files,
                            self.stdin)


@record
class Starter:
    name: str
    # starts one rank: the process tbrun supervises for it
    command: Callable[[RankSpec, LaunchConfig], RankCommand] | None = None
    # takes the whole job instead and returns its exit status (mpiexec)
    run_job: Callable[[LaunchConfig], int] | None = None
    hide: re.Pattern[bytes] | None = None  # its own lines on a rank's stderr, not shown


WRAPPER_MODULE = "tbcoll.launch.remote"


def wrapped(spec: RankSpec, argv: Sequence[str], env: Mapping[str, str]) -> RankCommand:
    """The rank run by tbcoll.launch.remote through argv (ssh, srun), its set-up on stdin."""
    return RankCommand(spec.rank, argv, dict(env), host=spec.host.name, setup=spec.setup(),
                       stdin=spec.stdin, runs=spec.argv[0])
