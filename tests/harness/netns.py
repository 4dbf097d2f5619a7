"""A cluster of hosts on this machine: one network namespace per host, an sshd in each.

Like Macs on a desk: a management network (a bridge in its own namespace, the "switch"),
which ssh and tbrun's store use, and a full mesh of point-to-point links between the hosts,
each its own /30 subnet, as each Thunderbolt cable is. Needs root, iproute2, util-linux's
unshare and nsenter, and sshd.

Each host is three namespaces, as a machine of its own would be: its network, its mounts (a
private tmpfs on /dev/shm, so that shared memory between two hosts cannot pass unnoticed, and
an /etc/hosts naming every host) and its UTS (host name h0, h1, ...: MPICH tells nodes apart
by it). A holder process per host keeps the three alive (`unshare --mount --uts` inside `ip
netns exec`); whatever runs on host i enters them with nsenter (exec_argv), the sshd too, and
so does all that the sshd starts. The mounts live and die with the holder's namespace: nothing
is mounted on the real machine.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

SSHD = "/usr/sbin/sshd"
SHM_SIZE = "256m"  # each host's /dev/shm; a job's segments here are a few MiB
READY = "ready"  # what a holder prints once its /dev/shm, /etc/hosts and name are in place


def why_not_available() -> str | None:
    """A reason namespaces cannot be made here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "ssh", "ssh-keygen", "unshare", "nsenter"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    if not os.path.exists(SSHD):
        return f"{SSHD} is not installed (apt-get install openssh-server)"
    return None


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


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
    holders: list[subprocess.Popen] = field(default_factory=list)  # one per host, in order
    sshds: list[subprocess.Popen] = field(default_factory=list)
    has_second_cables: bool = False

    def address(self, i: int) -> str:
        """Host i on the management network."""
        return f"10.201.0.{10 + i}"

    def link(self, i: int, j: int) -> str:
        """Host i's address on the cable between hosts i and j."""
        a, b = min(i, j), max(i, j)
        return f"10.202.{a * self.size + b}.{1 if i == a else 2}"

    def second_link(self, i: int, j: int) -> str:
        """Host i's address on the second cable between hosts i and j (add_second_cables)."""
        a, b = min(i, j), max(i, j)
        return f"10.205.{a * self.size + b}.{1 if i == a else 2}"

    def cable(self, i: int, j: int, second: bool = False) -> str:
        """The name of host i's end of the (second) cable to host j: tb<j> (tc<j>)."""
        return f"{'tc' if second else 'tb'}{j}"

    def add_second_cables(self) -> None:
        """A second cable between every pair of hosts (once; each its own /30 subnet), for
        the tests of several paths: mesh_hostfile(cables=2) names them."""
        if self.has_second_cables:
            return
        for i in range(self.size):
            for j in range(i + 1, self.size):
                _run("ip", "link", "add", self.cable(i, j, True), "netns", self.ns(i), "type",
                     "veth", "peer", "name", self.cable(j, i, True), "netns", self.ns(j))
                self._address(self.ns(i), self.cable(i, j, True), f"{self.second_link(i, j)}/30")
                self._address(self.ns(j), self.cable(j, i, True), f"{self.second_link(j, i)}/30")
        self.has_second_cables = True

    def mesh_hostfile(self, folder: Path, slots: list[int] | None = None,
                      cables: int = 1) -> Path:
        """The cluster as a JSON hostfile, with each host's address on each cable ("links":
        a list of two where cables=2, the first cable preferred) and, where given, each
        host's "slots"."""
        def links(i: int, j: int) -> str | list[str] | None:
            if i == j:
                return None
            return self.link(i, j) if cables == 1 else [self.link(i, j), self.second_link(i, j)]

        hosts = [{"ssh": self.address(i), "ips": [self.address(i)],
                  "links": [links(i, j) for j in range(self.size)],
                  **({"slots": slots[i]} if slots else {})}
                 for i in range(self.size)]
        path = folder / ("mesh.json" if slots is None else f"mesh-{'-'.join(map(str, slots))}.json")
        if cables != 1:
            path = path.with_name(f"{cables}-{path.name}")
        path.write_text(json.dumps({"hosts": hosts}))
        return path

    @property
    def ssh(self) -> str:
        return f"ssh -F {self.folder / 'ssh_config'}"

    def ns(self, i: int) -> str:
        return f"{self.prefix}h{i}"

    def hostname(self, i: int) -> str:
        """Host i's own name (its UTS namespace), which every host's /etc/hosts resolves."""
        return f"h{i}"

    def exec_argv(self, i: int, *argv: str) -> list[str]:
        """argv run inside host i (its network, mounts and name), in the caller's directory."""
        return ["nsenter", f"--target={self.holders[i].pid}", "--net", "--mount", "--uts",
                "--wd=.", *argv]

    def pids(self, i: int) -> list[int]:
        """Processes in host i's namespace other than its holder and its sshd."""
        listed = _run("ip", "netns", "pids", self.ns(i)).split()
        ours = {p.pid for p in self.holders[i:i + 1] + self.sshds[i:i + 1]}
        return [int(p) for p in listed if int(p) not in ours]

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
        self._start_holders()
        if sshd:
            self._start_sshds()
        return self

    def stop(self) -> None:
        """Everything left in the hosts (a failed test's ranks too), the holders with their
        mounts, then the namespaces; bounded in time."""
        for sshd in self.sshds:
            sshd.kill()
            sshd.wait(timeout=10)
        for i in range(len(self.holders)):
            for pid in self.pids(i):
                _kill(pid)
        for holder in self.holders:
            holder.kill()
            holder.wait(timeout=10)
        for ns in self.namespaces:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)

    def _start_holders(self) -> None:
        """A process per host that holds its mount and UTS namespaces: a private tmpfs on
        /dev/shm, the cluster's /etc/hosts, its own host name. It sleeps until stop()."""
        hosts = self.folder / "hosts"
        hosts.write_text("127.0.0.1 localhost\n" + "".join(
            f"{self.address(i)} {self.hostname(i)}\n" for i in range(self.size)))
        for i in range(self.size):
            setup = (f"mount -t tmpfs -o mode=1777,size={SHM_SIZE} tbcoll-shm-h{i} /dev/shm && "
                     f"mount --bind {hosts} /etc/hosts && hostname {self.hostname(i)} && "
                     f"echo {READY} && exec sleep infinity")
            self.holders.append(subprocess.Popen(
                ["ip", "netns", "exec", self.ns(i), "unshare", "--mount", "--uts",
                 "--propagation", "private", "sh", "-c", setup],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True))
        for i, holder in enumerate(self.holders):
            ready, _, _ = select.select([holder.stdout], [], [], 20)
            line = holder.stdout.readline().strip() if ready else ""
            if line != READY:
                holder.kill()
                raise RuntimeError(f"host {i}'s mount and UTS namespaces: "
                                   f"{holder.communicate(timeout=10)[1].strip() or 'no answer'}")

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
