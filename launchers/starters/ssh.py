"""Ranks on another host through ssh (as mpirun's and mlx.launch's ssh launchers): one ssh per
rank running tbcoll.launch.remote, the job's variables in its set-up line on stdin, never on a
command line."""

from __future__ import annotations

import os

from tbcoll.launch.config import LaunchConfig
from tbcoll.launch.hosts import ssh_command
from tbcoll.launch.starters.base import RankSpec, Starter, wrapped
from tbcoll.launch.supervisor import RankCommand


def command(spec: RankSpec, cfg: LaunchConfig) -> RankCommand:
    return wrapped(spec, ssh_command(cfg.ssh, spec.host.name, cfg.python, cfg.connect_timeout),
                   os.environ)


STARTER = Starter("ssh", command=command)
