"""A real Slurm cluster on this machine: a slurmd per network namespace of
tests/harness/netns.py (one node each, n0, n1, ...), slurmctld in the first, and a munged of its
own; everything (config, key, state, logs) in one private folder. Needs root and Debian's
slurm-wlm and munge.

Found while building it: `ip netns exec` mounts a fresh /sys, where slurmd finds no cgroup
and refuses to start, so the daemons enter a namespace's network only (nsenter --net); the
daemons must name this machine's host name as SlurmctldHost; srun --mpi=pmix fails when two
slurmds share /tmp (the PMIx plugin's directory names clash), so only one node runs PMIx.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import netns

DAEMONS = ("/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/munged")
CPUS = 2  # per node, as each slurmd declares it


def why_not_available() -> str | None:
    reason = netns.why_not_available()
    if reason:
        return reason
    for path in DAEMONS:
        if not os.path.exists(path):
            return f"{path} is not installed (apt-get install slurm-wlm munge)"
    for tool in ("srun", "salloc", "sbatch", "squeue", "nsenter"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    return None


@dataclass
class SlurmCluster:
    hosts: netns.Cluster
    folder: Path
    daemons: list[subprocess.Popen] = field(default_factory=list)

    @property
    def nodes(self) -> list[str]:
        return [f"n{i}" for i in range(self.hosts.size)]

    @property
    def env(self) -> dict[str, str]:
        """The environment of a user of the cluster (SLURM_CONF names its configuration)."""
        env = {name: value for name, value in os.environ.items()
               if not name.startswith(("SLURM_", "TBCOLL_", "TBRUN_", "PMI"))}
        return {**env, "SLURM_CONF": str(self.folder / "slurm.conf")}

    def run(self, *argv: str, timeout: float = 90, **kwargs) -> subprocess.CompletedProcess:
        """argv on the first node's network (its login shell, as it were), output as text."""
        return subprocess.run(self._on(0, *argv), capture_output=True, text=True,
                              timeout=timeout, env=kwargs.pop("env", self.env), **kwargs)

    def _on(self, i: int, *argv: str) -> list[str]:
        return ["nsenter", f"--net=/run/netns/{self.hosts.ns(i)}", *argv]

    def start(self) -> SlurmCluster:
        folder = self.folder
        for sub in ("state", "spool", "log"):
            (folder / sub).mkdir(mode=0o700)
        key = folder / "munge.key"
        key.write_bytes(os.urandom(128))
        key.chmod(0o600)
        socket_path = folder / "munge.socket"
        (folder / "slurm.conf").write_text(self._config(socket_path))
        self._daemon(None, "/usr/sbin/munged", "--foreground", "--force",
                     f"--socket={socket_path}", f"--key-file={key}",
                     f"--pid-file={folder / 'munged.pid'}", f"--seed-file={folder / 'seed'}",
                     f"--log-file={folder / 'log' / 'munged.log'}")
        conf = str(folder / "slurm.conf")
        self._daemon(0, "/usr/sbin/slurmctld", "-D", "-c", "-f", conf)
        for i, node in enumerate(self.nodes):
            self._daemon(i, "/usr/sbin/slurmd", "-D", "-N", node, "-f", conf)
        self._wait_idle()
        return self

    def stop(self) -> None:
        for daemon in reversed(self.daemons):
            daemon.terminate()
        for daemon in self.daemons:
            try:
                daemon.wait(timeout=10)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()

    def log(self, name: str) -> str:
        path = self.folder / "log" / name
        return path.read_text(errors="replace")[-3000:] if path.exists() else "(no log)"

    def _daemon(self, host: int | None, *argv: str) -> None:
        argv = self._on(host, *argv) if host is not None else list(argv)
        self.daemons.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL,
                                             stderr=subprocess.STDOUT, env=self.env))

    def _wait_idle(self) -> None:
        deadline = time.monotonic() + 30
        while True:
            shown = self.run("sinfo", "--noheader", "--format=%t %D", timeout=10)
            if shown.returncode == 0 and shown.stdout.split() == ["idle", str(len(self.nodes))]:
                return
            if time.monotonic() > deadline or any(d.poll() is not None for d in self.daemons):
                raise RuntimeError(f"Slurm did not come up (sinfo: {shown.stdout}"
                                   f"{shown.stderr}); slurmctld.log: "
                                   f"{self.log('slurmctld.log')}\nslurmd-n0.log: "
                                   f"{self.log('slurmd-n0.log')}")
            time.sleep(0.2)

    def _config(self, munge_socket: Path) -> str:
        folder = self.folder
        nodes = "".join(f"NodeName={node} NodeAddr={self.hosts.address(i)} CPUs={CPUS} "
                        "State=UNKNOWN\n" for i, node in enumerate(self.nodes))
        return (
            "ClusterName=tbcoll\n"
            f"SlurmctldHost={socket.gethostname()}({self.hosts.address(0)})\n"
            "SlurmUser=root\nSlurmdUser=root\n"
            f"AuthType=auth/munge\nAuthInfo=socket={munge_socket}\nCredType=cred/munge\n"
            f"StateSaveLocation={folder / 'state'}\n"
            f"SlurmdSpoolDir={folder / 'spool'}/%n\n"
            f"SlurmctldPidFile={folder / 'slurmctld.pid'}\n"
            f"SlurmdPidFile={folder / 'slurmd-%n.pid'}\n"
            f"SlurmctldLogFile={folder / 'log' / 'slurmctld.log'}\n"
            f"SlurmdLogFile={folder / 'log' / 'slurmd-%n.log'}\n"
            "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
            "SelectType=select/cons_tres\nSelectTypeParameters=CR_Core\n"
            "MpiDefault=none\nReturnToService=2\nSlurmdParameters=config_overrides\n"
            "JobCompType=jobcomp/none\nAccountingStorageType=accounting_storage/none\n"
            "InactiveLimit=0\nKillWait=2\nMinJobAge=2\n"
            "MailProg=/bin/true\n"
            + nodes +
            "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n"
        )
