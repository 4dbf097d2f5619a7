"""Where a job's ranks run: which hosts are this machine, how each reaches tbrun's store, and
the ssh command that starts a rank on a remote host."""

from __future__ import annotations

import json
import os
import shlex
import socket
from collections.abc import Mapping, Sequence

from tbcoll.core.errors import LaunchError
from tbcoll.core.records import record
from tbcoll.job.topology import Hostfile, Layout, route_source

LOOPBACK = "127.0.0.1"
_LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


@record
class HostPlan:
    name: str  # as the hostfile gives it: what ssh connects to
    ranks: tuple[int, ...]
    local: bool  # this machine: ranks start as children of tbrun, not through ssh
    store_host: str  # the address of tbrun's store as this host reaches it


@record
class JobPlan:
    hosts: tuple[HostPlan, ...]
    topology: Layout  # TBCOLL_HOSTFILE
    master_addr: str  # MASTER_ADDR: rank 0's host

    @property
    def store_hosts(self) -> list[str]:
        """The addresses the store listens on."""
        return list(dict.fromkeys(h.store_host for h in self.hosts))


def plan_job(hostfile: Hostfile | None, nprocs: int, map_by: str, route: bool = True) -> JobPlan:
    """route False (a dry run): leave the store's address for remote hosts as a placeholder
    instead of looking up the route to them."""
    if hostfile is None:
        return JobPlan((HostPlan("localhost", tuple(range(nprocs)), True, LOOPBACK),),
                       Layout.local(nprocs), LOOPBACK)
    topology = hostfile.layout(nprocs, map_by)
    entries = topology.hosts
    local = [is_this_machine(h.name) for h in entries]
    if not all(local):
        for entry, here in zip(entries, local, strict=True):
            if here and entry.addr in _LOOPBACK_NAMES:
                raise LaunchError(f"{hostfile.source}: host {entry.name!r} is a loopback name, "
                                  "which the other hosts cannot reach; name this machine by an "
                                  "address or host name they can")
    hosts = tuple(
        HostPlan(entry.name, entry.ranks, here,
                 LOOPBACK if here else address_towards(entry.name, entry.addr) if route
                 else f"<address towards {entry.name}>")
        for entry, here in zip(entries, local, strict=True))
    master = LOOPBACK if all(local) else entries[0].addr
    return JobPlan(hosts, topology, master)


def is_this_machine(name: str) -> bool:
    """localhost, this machine's host name, the node Slurm says this is (SLURMD_NODENAME), or
    an address of one of its interfaces (a user@ prefix always means ssh)."""
    if "@" in name:
        return False
    if name in _LOOPBACK_NAMES or name == os.environ.get("SLURMD_NODENAME"):
        return True
    hostname = socket.gethostname()
    if name in (hostname, hostname.split(".")[0]):
        return True
    family = _address_family(name)
    if family is None:
        return False
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        try:
            s.bind((name, 0))  # succeeds only for an address this machine holds
        except OSError:
            return False
    return True


def _address_family(name: str) -> socket.AddressFamily | None:
    """AF_INET or AF_INET6 for an address, None for a name (ipaddress's check, without the
    import: ~0.7 ms of tbrun's start-up)."""
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            socket.inet_pton(family, name)
        except OSError:
            continue
        return family
    return None


def address_towards(*names: str) -> str:
    """This machine's address on the route to the first of names that resolves."""
    errors = []
    for name in dict.fromkeys(n.rpartition("@")[2] for n in names):
        try:
            return route_source(name)
        except OSError as e:
            errors.append(f"{name}: {e.strerror or e}")
    raise LaunchError(f"cannot find a route to host {names[0]!r} ({'; '.join(errors)}); give its "
                      "address in the hostfile")


def free_port(host: str) -> int:
    """A port nothing listens on now (for MASTER_PORT, which the script binds itself)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def ssh_options(connect_timeout: float) -> list[str]:
    """What tbrun adds to every ssh it runs: no prompts, a bounded time to connect."""
    return ["-o", "BatchMode=yes", "-o", f"ConnectTimeout={max(1, round(connect_timeout))}"]


def ssh_command(ssh: Sequence[str], host: str, python: str, connect_timeout: float) -> list[str]:
    """ssh argv that runs tbcoll.launch.remote on host, with a dead host noticed within ~15 s."""
    remote = shlex.join([python, "-m", "tbcoll.launch.remote"])
    return [*ssh, *ssh_options(connect_timeout), "-o", "ServerAliveInterval=5",
            "-o", "ServerAliveCountMax=3", "-T", host, remote]


def remote_setup(argv: Sequence[str], cwd: str, env: Mapping[str, str],
                 defaults: Mapping[str, str], files: Mapping[str, str],
                 stdin: bool = False) -> bytes:
    """The line tbcoll.launch.remote reads: env is set, defaults only where the host has none,
    each of files (variable -> content) is written to a private file the variable names, and
    with stdin the rank reads the input tbrun forwards (else /dev/null)."""
    return json.dumps({"argv": list(argv), "cwd": cwd, "env": dict(env),
                       "defaults": dict(defaults), "files": dict(files),
                       "stdin": stdin}).encode() + b"\n"
