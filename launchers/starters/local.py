"""Ranks on this machine: children of tbrun. On Linux PR_SET_PDEATHSIG ends them with tbrun;
elsewhere (macOS) each runs under tbcoll.launch.remote, which ends it when tbrun's pipe closes."""

from __future__ import annotations

import os
import sys

from tbcoll.launch.config import LaunchConfig
from tbcoll.launch.hosts import remote_setup
from tbcoll.launch.parentdeath import PDEATHSIG
from tbcoll.launch.starters.base import WRAPPER_MODULE, RankSpec, Starter
from tbcoll.launch.supervisor import RankCommand

WRAPPER = (sys.executable, "-m", WRAPPER_MODULE)


def command(spec: RankSpec, cfg: LaunchConfig) -> RankCommand:
    files = {name: os.path.join(spec.files_dir, f"{name}.json") for name in spec.files}
    env = {**spec.defaults, **os.environ, **spec.env, **files}
    if PDEATHSIG:
        return RankCommand(spec.rank, spec.argv, env, spec.cwd, stdin=spec.stdin)
    setup = remote_setup(spec.argv, spec.cwd, {}, {}, {}, spec.stdin)  # env: the wrapper's
    return RankCommand(spec.rank, WRAPPER, env, setup=setup, stdin=spec.stdin,
                       runs=spec.argv[0])


STARTER = Starter("local", command=command)
