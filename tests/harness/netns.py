"""A cluster of hosts on this machine: one network namespace per host, an sshd in each.

Like Macs on a desk: a management network (a bridge in its own namespace, the "switch"),
which ssh and tbrun's store use, and a full mesh of point-to-point links between the hosts,
each its own /30 subnet, as each Thunderbolt cable is. Needs root, iproute2 and sshd.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

SSHD = "/usr/sbin/sshd"


def why_not_available() -> str | None:
    """A reason namespaces cannot be made here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    if not os.path.exists(SSHD):
        return f"{SSHD} is not installed (apt-get install openssh-server)"
    return None


def _run(*argv: str) -> str:
    p = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {p.stderr.strip()}")
    return p.stdout


@dataclass
class Cluster:
    prefix: str  # namespace names start with it
    folder: Path
    size: int
    namespaces: list[str] = field(default_factory=list)
    sshds: list[subprocess.Popen] = field(default_factory=list)

    def address(self, i: int) -> str:
        """Host i on the management network."""
        return f"10.201.0.{10 + i}"

    def link(self, i: int, j: int) -> str:
        """Host i's address on the cable between hosts i and j."""
        a, b = min(i, j), max(i, j)
        return f"10.202.{a * self.size + b}.{1 if i == a else 2}"

    def mesh_hostfile(self, folder: Path) -> Path:
        """The cluster as a JSON hostfile, with each host's address on each cable ("links")."""
        hosts = [{"ssh": self.address(i), "ips": [self.address(i)],
                  "links": [None if j == i else self.link(i, j) for j in range(self.size)]}
                 for i in range(self.size)]
        path = folder / "mesh.json"
        path.write_text(json.dumps({"hosts": hosts}))
        return path

    @property
    def ssh(self) -> str:
        return f"ssh -F {self.folder / 'ssh_config'}"

    def ns(self, i: int) -> str:
        return f"{self.prefix}h{i}"

    def exec_argv(self, i: int, *argv: str) -> list[str]:
        """argv run inside host i."""
        return ["ip", "netns", "exec", self.ns(i), *argv]

    def pids(self, i: int) -> list[int]:
        """Processes in host i's namespace other than its sshd."""
        listed = _run("ip", "netns", "pids", self.ns(i)).split()
        return [int(p) for p in listed if not self.sshds or int(p) != self.sshds[i].pid]

    def start(self, sshd: bool = True) -> Cluster:
        switch = f"{self.prefix}sw"
        self._add_namespace(switch)
        _run("ip", "-n", switch, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", switch, "link", "set", "br0", "up")
        for i in range(self.size):
            ns = self.ns(i)
            self._add_namespace(ns)
            _run("ip", "link", "add", "mgmt", "netns", ns, "type", "veth", "peer", "name",
                 f"port{i}", "netns", switch)
            _run("ip", "-n", switch, "link", "set", f"port{i}", "master", "br0", "up")
            self._address(ns, "mgmt", f"{self.address(i)}/24")
        for i in range(self.size):
            for j in range(i + 1, self.size):
                _run("ip", "link", "add", f"tb{j}", "netns", self.ns(i), "type", "veth", "peer",
                     "name", f"tb{i}", "netns", self.ns(j))
                self._address(self.ns(i), f"tb{j}", f"{self.link(i, j)}/30")
                self._address(self.ns(j), f"tb{i}", f"{self.link(j, i)}/30")
        if sshd:
            self._start_sshds()
        return self

    def stop(self) -> None:
        for sshd in self.sshds:
            sshd.kill()
            sshd.wait()
        for ns in self.namespaces:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)

    def _add_namespace(self, ns: str) -> None:
        _run("ip", "netns", "add", ns)
        self.namespaces.append(ns)
        _run("ip", "-n", ns, "link", "set", "lo", "up")

    def _address(self, ns: str, dev: str, cidr: str) -> None:
        _run("ip", "-n", ns, "addr", "add", cidr, "dev", dev)
        _run("ip", "-n", ns, "link", "set", dev, "up")

    def _start_sshds(self) -> None:
        """An sshd per host with a throwaway host key, and a client key that every one takes."""
        keys = self.folder
        for name in ("host_key", "client_key"):
            _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(keys / name))
        shutil.copy(keys / "client_key.pub", keys / "authorized_keys")
        (keys / "ssh_config").write_text(
            f"Host *\n  User root\n  IdentityFile {keys / 'client_key'}\n  IdentitiesOnly yes\n"
            "  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n")
        os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege-separation directory
        for i in range(self.size):
            config = keys / f"sshd_config{i}"
            config.write_text(
                f"ListenAddress {self.address(i)}\nHostKey {keys / 'host_key'}\n"
                f"AuthorizedKeysFile {keys / 'authorized_keys'}\nPasswordAuthentication no\n"
                "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
                "PermitRootLogin prohibit-password\nPidFile none\nMaxStartups 100\n"
                f"AcceptEnv none\nSubsystem sftp internal-sftp\n")
            self.sshds.append(subprocess.Popen(
                self.exec_argv(i, SSHD, "-D", "-e", "-f", str(config)),
                stdout=subprocess.DEVNULL, stderr=open(keys / f"sshd{i}.log", "w")))
        deadline = time.monotonic() + 20
        for i in range(self.size):
            while subprocess.run(
                    self.exec_argv(0, *self.ssh.split(), "-o", "BatchMode=yes",
                                   "-o", "ConnectTimeout=2", self.address(i), "true"),
                    capture_output=True, timeout=30).returncode != 0:
                if time.monotonic() > deadline:
                    log = (keys / f"sshd{i}.log").read_text()
                    raise RuntimeError(f"sshd of host {i} does not answer: {log}")
                time.sleep(0.2)
