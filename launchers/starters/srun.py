"""Ranks on other nodes of a Slurm allocation through srun, as mpiexec's Slurm launcher does:
one single-task step per rank running tbcoll.launch.remote (set-up on stdin, as over ssh), so that
Slurm accounts, confines and cleans up the ranks, and no ssh access to the nodes is needed.

--overlap: the steps share the allocation's CPUs with each other and with a step tbrun itself
may run in (`srun tbrun ...`), instead of waiting for CPUs of their own; --unbuffered: a
rank's partial lines reach tbrun at once; --mpi=none: no PMI for a rank of tbcoll's own.
"""

from __future__ import annotations

import os
import re
import shutil

from tbcoll.launch.config import LaunchConfig
from tbcoll.launch.starters.base import WRAPPER_MODULE, RankSpec, Starter, wrapped
from tbcoll.launch.supervisor import RankCommand

from tbcoll.core.errors import LaunchError


def srun_command(node: str, python: str, keep_going: bool = False) -> list[str]:
    """One rank's step; under --keep-going with --no-kill, so that Slurm does not end the
    job's other steps when this one's node fails."""
    srun = shutil.which("srun")
    if srun is None:
        raise LaunchError("--launcher srun needs Slurm's srun on PATH (run tbrun inside salloc "
                          "or sbatch on a Slurm cluster), or use --launcher ssh")
    return [srun, "--nodes=1", "--ntasks=1", f"--nodelist={node}", "--overlap", "--unbuffered",
            "--quiet", "--mpi=none", "--kill-on-bad-exit=0",
            *(["--no-kill"] if keep_going else []), f"--job-name=tbrun-{node}",
            python, "-m", WRAPPER_MODULE]


def command(spec: RankSpec, cfg: LaunchConfig) -> RankCommand:
    return wrapped(spec, srun_command(spec.host.name, cfg.python, cfg.keep_going), os.environ)


# srun's report of the task's end, which tbrun reports itself (and 143 for ranks it stopped)
_OWN_WORDS = re.compile(rb"^srun: error: \S+: task \d+: (Exited with exit code \d+|Killed|"
                        rb"Terminated)\r?\n?$", re.MULTILINE)
STARTER = Starter("srun", command=command, hide=_OWN_WORDS)
