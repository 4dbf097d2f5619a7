"""Ranks on another host through ssh (as mpirun's and mlx.launch's ssh launchers): one ssh per
rank running launchers.remote, the job's variables in its set-up line on stdin, never on a
command line."""

from __future__ import annotations

import os

from launchers.config import LaunchConfig
from launchers.hosts import ssh_command
from launchers.starters.base import RankSpec, Starter, wrapped
from launchers.supervisor import RankCommand


def command(spec: RankSpec, cfg: LaunchConfig) -> RankCommand:
    return wrapped(spec, ssh_command(cfg.ssh, spec.host.name, cfg.python, cfg.connect_timeout),
                   os.environ)


STARTER = Starter("ssh", command=command, remote=True)
