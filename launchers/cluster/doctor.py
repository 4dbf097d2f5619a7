"""tbrun doctor: check what users of Mac clusters trip on, one line per check, each failure
with its fix. Facts come from tbcoll.launch.cluster.probe, run on every host (over ssh for
remote ones).
Checks that need macOS say "skipped: macOS only" elsewhere; none passes without running.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from tbcoll.launch.cluster import thunderbolt
from tbcoll.launch.cluster.check import Check
from tbcoll.launch.cluster.probe import probe
from tbcoll.launch.cluster.rdma_checks import rdma_checks
from tbcoll.launch.hosts import is_this_machine, ssh_options

from tbcoll.job.topology import CABLE, Host, Hostfile, Layout, Path

PACKAGES = ("tbcoll", "mlx", "mpi4py", "numpy")


def gather(hosts: Sequence[Host], ssh: Sequence[str], python: str,
           connect_timeout: float) -> list[dict | str]:
    """Each host's facts, or why they could not be had."""
    layout = Layout.of_hosts(hosts)

    def one(i: int) -> dict | str:
        host = hosts[i]
        addresses = [p.remote for j in range(len(hosts)) for p in _cables(layout, i, j)]
        if is_this_machine(host.name):
            return probe(addresses)
        argv = [*ssh, *ssh_options(connect_timeout), host.name, python, "-m",
                "tbcoll.launch.cluster.probe", *addresses]
        try:
            p = subprocess.run(argv, capture_output=True, text=True, timeout=connect_timeout + 60)
        except subprocess.TimeoutExpired:
            return "no answer within the time limit"
        if p.returncode != 0:
            lines = p.stderr.strip().splitlines()
            return lines[-1] if lines else f"ssh exited with status {p.returncode}"
        try:
            return json.loads(p.stdout)
        except ValueError:
            return f"unexpected answer: {p.stdout[:200]!r}"

    with ThreadPoolExecutor(max_workers=min(16, len(hosts))) as pool:
        return list(pool.map(one, range(len(hosts))))


def checks(hosts: Sequence[Host], facts: list[dict | str], python: str) -> list[Check]:
    found: list[Check] = []
    reached = [(h, f) for h, f in zip(hosts, facts, strict=True) if isinstance(f, dict)]
    for host, fact in zip(hosts, facts, strict=True):
        if isinstance(fact, str):
            found.append(Check("FAIL", f"ssh {host.name}", fact,
                               f"set up key-based login (ssh-copy-id {host.name}); `ssh "
                               f"{host.name} true` must work without a prompt, and {python} "
                               "must have tbcoll installed there"))
        elif not is_this_machine(host.name):
            found.append(Check("ok", f"ssh {host.name}", f"reached {fact['host']}"))
    found += _versions(reached)
    found += _links(hosts, facts)
    found += _paths(hosts)
    for host, fact in reached:
        found += _macos(host, fact)
    found += rdma_checks(hosts, facts)
    if any(h.rdma for h in hosts):
        found += _jaccl(reached)
    found.append(_cabling(hosts, facts))
    found.append(_levels(hosts))
    return found


def _levels(hosts: Sequence[Host]) -> Check:
    """How a job over these hosts moves its data (docs/hosts.md): one level, or shared memory
    inside each host and the network only between hosts."""
    if len(hosts) == 1 or all(h.slots == 1 for h in hosts):
        return Check("ok", "levels", f"one level: {len(hosts)} host(s), "
                     + ("one rank each" if len(hosts) > 1 else "shared memory (shm)"))
    per_host = ", ".join(f"{h.name} ({h.slots})" for h in hosts)
    pairs = sum(a.slots * b.slots for i, a in enumerate(hosts) for b in hosts[i + 1:])
    return Check("ok", "levels", f"two levels: ranks per host {per_host}; each host's ranks "
                 f"move data through its shared memory, only the hosts' traffic crosses the "
                 f"network (tcp: {pairs} connections, one per pair of ranks on different hosts; "
                 f"rdma: queue pairs between the hosts' first ranks only)")


def _version_line(fact: dict) -> str:
    return ", ".join([f"python {fact['python']}", *(
        f"{name} {fact['packages'][name] or 'missing'}" for name in PACKAGES)])


def _versions(reached: list[tuple[Host, dict]]) -> list[Check]:
    if not reached:
        return []
    first_host, first = reached[0]
    differ = [(h, f) for h, f in reached[1:] if _version_line(f) != _version_line(first)]
    if not differ:
        where = "every host" if len(reached) > 1 else first_host.name
        return [Check("ok", "versions", f"{_version_line(first)} on {where}")]
    return [Check("FAIL", f"versions on {h.name}",
                  f"{_version_line(f)}; {first_host.name} has {_version_line(first)}",
                  "install the same Python and packages on every host") for h, f in differ]


def _cables(layout: Layout, i: int, j: int) -> list[Path]:
    """The cables from host i to host j whose far end the hostfile gives."""
    return [p for p in layout.paths(i, j) if p.kind == CABLE and p.remote]


def _paths(hosts: Sequence[Host]) -> list[Check]:
    """Each pair's paths in the order a job tries them (Layout.paths), for pairs with a cable:
    a job falls to the next when one does not answer."""
    layout = Layout.of_hosts(hosts)
    found = []
    for i in range(len(hosts)):
        for j in range(i + 1, len(hosts)):
            paths = layout.paths(i, j)
            if any(p.kind == CABLE for p in paths):
                found.append(Check("ok", f"paths {hosts[i].name} <-> {hosts[j].name}", ", then "
                                   .join(f"{p.name} ({p.local or '?'} - {p.remote or '?'})"
                                         for p in paths)))
    return found


def _links(hosts: Sequence[Host], facts: list[dict | str]) -> list[Check]:
    layout = Layout.of_hosts(hosts)
    found = []
    for i, fact in enumerate(facts):
        if not isinstance(fact, dict):
            continue
        for j in range(len(hosts)):
            cables = _cables(layout, i, j)
            for path in cables:
                found.append(_link(hosts, facts, i, j, path, len(cables) > 1))
    return found


def _link(hosts: Sequence[Host], facts: list[dict | str], i: int, j: int, path: Path,
          numbered: bool) -> Check:
    """Whether host i reaches host j's end of a cable between them (numbered: which)."""
    fact, peer, address = facts[i], hosts[j], path.remote
    result = fact["reach"].get(address, "not tried")
    what = f"link {hosts[i].name} -> {peer.name}" + (f" ({path.name})" if numbered else "")
    if result == "ok":
        return Check("ok", what, f"{address} answers")
    fix = (f"check the cable between them and that {address} is set on {peer.name}'s end of "
           "it (ifconfig)")
    if _silently_blocked(result) and "darwin" in (fact["os"], _os_of(facts[j])):
        fix += f"; {MACOS_BLOCKS}"
    return Check("FAIL", what, f"{address}: {result}", fix)


# What macOS does to a connection between Macs that its privacy or firewall settings block:
# no refusal, only EHOSTUNREACH or a timeout
MACOS_BLOCKS = ("on macOS, Local Network privacy (System Settings > Privacy & Security > Local "
                "Network: allow the terminal or app that runs tbrun and python) or the "
                "Application Firewall (System Settings > Network > Firewall: allow incoming "
                "connections for python, or /usr/libexec/ApplicationFirewall/socketfilterfw "
                "--add $(which python3) --unblockapp $(which python3)) may block it with no "
                "other error")


def _silently_blocked(result: str) -> bool:
    """A failure that a block by macOS's privacy or firewall settings gives: no route to
    the host (EHOSTUNREACH), or a timeout."""
    return result in (os.strerror(errno.EHOSTUNREACH), "timed out", "TimeoutError")


def _os_of(fact: dict | str) -> str | None:
    """The OS a host's probe reported (None: the host was not reached)."""
    return fact.get("os") if isinstance(fact, dict) else None


def _macos(host: Host, fact: dict) -> list[Check]:
    if fact["os"] != "darwin":
        return [Check("skip", f"thunderbolt, rdma_ctl, bridge0 on {host.name}",
                      "skipped: macOS only")]
    found = []
    ports = thunderbolt.ports(fact["thunderbolt_profile"], fact["hardware_ports"])
    cabled = [p for p in ports if p.peer_uuid]
    if cabled:
        found.append(Check("ok", f"thunderbolt on {host.name}",
                           f"{len(cabled)} cable(s): {', '.join(p.iface for p in cabled)}"))
    else:
        found.append(Check("FAIL", f"thunderbolt on {host.name}", "no Thunderbolt cable to "
                           "another Mac", "cable the Macs port to port (Thunderbolt 5 for RDMA)"))
    status = (fact.get("rdma_ctl") or "").strip()
    if "enabled" in status.lower():
        found.append(Check("ok", f"rdma_ctl on {host.name}", status))
    else:
        found.append(Check("FAIL", f"rdma_ctl on {host.name}", status or "not available",
                           "boot into macOS Recovery, run `rdma_ctl enable` in its Terminal, "
                           "restart (needs macOS 26.2 or later)"))
    for port in cabled:
        address = fact["ipv4"].get(port.iface, "")
        if address:
            found.append(Check("ok", f"{port.iface} on {host.name}", f"IPv4 {address}"))
        else:
            found.append(Check("FAIL", f"{port.iface} on {host.name}", "no IPv4 address",
                               f"sudo ifconfig {port.iface} inet 192.168.N.M netmask "
                               "255.255.255.252 (one /30 per cable)"))
    if "status: active" in (fact.get("bridge0") or ""):
        found.append(Check("FAIL", f"bridge0 on {host.name}", "Thunderbolt Bridge is active",
                           "sudo ifconfig bridge0 down (the bridge joins the ports; RDMA and "
                           "per-cable addresses need them apart)"))
    else:
        found.append(Check("ok", f"bridge0 on {host.name}", "not active"))
    return found


def _jaccl(reached: list[tuple[Host, dict]]) -> list[Check]:
    """The hostfile names RDMA devices: MLX on every host must have its jaccl backend."""
    found = []
    for host, fact in reached:
        backends = fact.get("mlx_backends", [])
        if "jaccl" in backends:
            found.append(Check("ok", f"mlx jaccl on {host.name}", "available"))
        else:
            found.append(Check("FAIL", f"mlx jaccl on {host.name}",
                               f"not available (MLX has: {', '.join(backends) or 'no MLX'})",
                               "jaccl needs macOS 26.2 or later with RDMA enabled and a recent "
                               "MLX: pip install -U mlx"))
    return found


def _cabling(hosts: Sequence[Host], facts: list[dict | str]) -> Check:
    n = len(hosts)
    unseen = [h.name for h, f in zip(hosts, facts, strict=True) if isinstance(f, str)]
    if unseen:
        return Check("skip", "cabling", f"skipped: cannot see {', '.join(unseen)} (ssh failed "
                     "above), so neither its cables nor its links can be checked")
    if all(f["os"] == "darwin" for f in facts):
        found = thunderbolt.cables([thunderbolt.ports(f["thunderbolt_profile"],
                                                      f["hardware_ports"]) for f in facts])
        source = "as cabled"
    elif any(h.rdma for h in hosts):
        found = {(i, j): [("", "")] for i, h in enumerate(hosts)
                 for j, dev in enumerate(h.rdma) if dev is not None}
        source = "as the hostfile's rdma entries say"
    else:
        return Check("skip", "cabling", "skipped: macOS only (and the hostfile names no rdma "
                     "devices)")
    shape = thunderbolt.shape(n, found)
    if shape == "incomplete":
        linked = set(found) | {(j, i) for i, j in found}
        missing = [f"{hosts[i].name}-{hosts[j].name}" for i in range(n) for j in range(i + 1, n)
                   if (i, j) not in linked]
        return Check("FAIL", "cabling", f"neither a full mesh nor a ring in hostfile order "
                     f"({source}); no cable: {', '.join(missing)}",
                     "cable every pair (jaccl) or each host to the next (jaccl-ring), or list "
                     "the hosts in the order of the ring")
    return Check("ok", "cabling", f"{shape} ({source})")


def run_doctor(hostfile: Hostfile | None, ssh: Sequence[str], python: str,
               connect_timeout: float) -> int:
    hosts = hostfile.hosts if hostfile else (Host("localhost"),)
    facts = gather(hosts, ssh, python, connect_timeout)
    found = checks(hosts, facts, python)
    for check in found:
        print(check, flush=True)
    failed = sum(c.status == "FAIL" for c in found)
    print(f"{failed} check(s) failed" if failed else "all checks passed", file=sys.stderr)
    return 1 if failed else 0
