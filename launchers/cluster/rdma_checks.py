"""tbrun doctor's RDMA checks, from each host's facts (probe.py, verbs.py): the verbs library
and devices present, each port in use ACTIVE with an IPv4-mapped GID (index 1 on Macs, where
MLX's jaccl looks), every device the hostfile's `rdma` matrix names present on its host, one
cable per pair of hosts, and on Macs Thunderbolt 5 links.

A port is in use when the hostfile names its device for this host; without such a hostfile,
every cabled Thunderbolt port on a Mac and every device elsewhere. Where nothing asks for RDMA
(no `rdma` in the hostfile), a host without it is a skip, not a failure.
"""

from __future__ import annotations

from collections.abc import Sequence

from tbcoll.launch.cluster import thunderbolt
from tbcoll.launch.cluster.check import Check

from tbcoll.job.topology import Host

TB5_GBPS = 80


def rdma_checks(hosts: Sequence[Host], facts: list[dict | str]) -> list[Check]:
    required = any(h.rdma for h in hosts)
    found: list[Check] = []
    for i, (host, fact) in enumerate(zip(hosts, facts, strict=True)):
        if isinstance(fact, dict):
            found += _host(host, fact, named_devices(hosts, i), required)
    found += _double_cables(hosts, facts)
    return found


def named_devices(hosts: Sequence[Host], i: int) -> dict[str, list[str]]:
    """The devices host i's rdma row names -> the hosts each one reaches."""
    named: dict[str, list[str]] = {}
    for j, entry in enumerate(hosts[i].rdma):
        for device in _devices(entry):
            named.setdefault(device, []).append(hosts[j].name)
    return named


def _devices(entry) -> list[str]:
    """An rdma entry: None, a device name, or a list of names (several cables)."""
    if entry is None:
        return []
    return [entry] if isinstance(entry, str) else list(entry)


def _in_use(fact: dict, named: dict[str, list[str]]) -> list[str] | None:
    """The device names in use on this host; None: every device."""
    if named:
        return sorted(named)
    if fact["os"] == "darwin":
        ports = thunderbolt.ports(fact.get("thunderbolt_profile", {}),
                                  fact.get("hardware_ports", ""))
        return [f"rdma_{p.iface}" for p in ports if p.peer_uuid]
    return None


def _host(host: Host, fact: dict, named: dict[str, list[str]], required: bool) -> list[Check]:
    rdma = fact.get("rdma")
    where = host.name
    if rdma is None:
        return [Check("skip", f"rdma on {where}", "skipped: tbcoll there predates the RDMA "
                      "checks (upgrade it to check its devices)")]
    if rdma["library"] is None or not rdma["devices"]:
        return [_none_here(where, fact, rdma, required)]
    devices = {d["name"]: d for d in rdma["devices"]}
    listed = ", ".join(sorted(devices))
    found = [Check("ok", f"rdma on {where}", f"{rdma['library']}: {listed}")]
    wanted = _in_use(fact, named)
    for name in sorted(devices) if wanted is None else wanted:
        if name not in devices:
            peers = ", ".join(named.get(name, [])) or "a cabled port"
            found.append(Check(
                "FAIL", f"rdma {name} on {where}",
                f"not found (named for {peers}); {where} has: {listed}",
                "check the cable to that host (each Thunderbolt cable is its own device, "
                "rdma_enX for interface enX) or write the hostfile anew: tbrun hostfile --json "
                "HOST..."))
            continue
        found += _ports(where, fact["os"], devices[name])
    if fact["os"] == "darwin":
        found += _thunderbolt_speeds(where, fact)
    return found


def _none_here(where: str, fact: dict, rdma: dict, required: bool) -> Check:
    """No verbs library or no device: a failure where the hostfile asks for RDMA."""
    darwin = fact["os"] == "darwin"
    if rdma["library"] is None:
        detail = f"no RDMA: the verbs library does not load ({rdma['error']})"
        fix = ("RDMA over Thunderbolt needs macOS 26.2 or later (librdma.dylib)" if darwin else
               "install rdma-core's library and providers (apt-get install libibverbs1 "
               "ibverbs-providers)")
    else:
        detail = f"no RDMA device ({rdma['error'] or 'none listed'})"
        fix = ("enable RDMA (rdma_ctl enable in macOS Recovery) and cable Thunderbolt 5 ports"
               if darwin else "load the device's driver, or for Soft-RoCE: modprobe rdma_rxe; "
               "rdma link add rxe0 type rxe netdev IFACE")
    if required:
        return Check("FAIL", f"rdma on {where}", detail, fix)
    return Check("skip", f"rdma on {where}", f"{detail}; only --backend rdma and jaccl need it")


def _ports(where: str, os_name: str, device: dict) -> list[Check]:
    name = device["name"]
    if device.get("error") or not device["ports"]:
        return [Check("FAIL", f"rdma {name} on {where}", device.get("error") or "no port",
                      "check the device's driver (ibv_devinfo shows what it reports)")]
    found = []
    for port in device["ports"]:
        what = f"rdma {name} port {port['port']} on {where}"
        iface = port.get("netdev") or f"the interface under {name}"
        if port["state"] not in ("ACTIVE", "ACTIVE_DEFER"):
            fix = (f"check the Thunderbolt cable on {iface} and the Mac at its other end, and "
                   "that RDMA is enabled on both (`rdma_ctl status`; if disabled, run `rdma_ctl "
                   "enable` in macOS Recovery's Terminal and restart)" if os_name == "darwin"
                   else f"bring {iface} up (ip link set {iface} up) and check its link")
            found.append(Check("FAIL", what, f"port {port['state']}", fix))
            continue
        gid = _ipv4_gid(port, os_name)
        if gid is None:
            need = " at GID index 1, where MLX's jaccl looks" if os_name == "darwin" else ""
            fix = (f"sudo ifconfig {iface} inet 192.168.N.M netmask 255.255.255.252 (one /30 "
                   "per cable)" if os_name == "darwin" else f"ip addr add ADDRESS/PREFIX dev "
                   f"{iface}")
            found.append(Check("FAIL", what, f"ACTIVE but no IPv4-mapped GID{need}: {iface} "
                               "has no IPv4 address", f"give {iface} one: {fix}"))
            continue
        mtu = f", MTU {port['active_mtu']}" if port.get("active_mtu") else ""
        found.append(Check("ok", what, f"ACTIVE, GID {gid['index']} {gid['gid']} on {iface}"
                           f"{mtu}"))
    return found


def _ipv4_gid(port: dict, os_name: str) -> dict | None:
    """The port's IPv4-mapped GID: at index 1 on Macs (as jaccl takes it), any index else."""
    for gid in port["gids"]:
        if gid["ipv4"] and (os_name != "darwin" or gid["index"] == 1):
            return gid
    return None


def _thunderbolt_speeds(where: str, fact: dict) -> list[Check]:
    """RDMA over Thunderbolt needs Thunderbolt 5 at both ends and in the cable."""
    found = []
    ports = thunderbolt.ports(fact.get("thunderbolt_profile", {}), fact.get("hardware_ports", ""))
    for port in (p for p in ports if p.peer_uuid and p.gbps is not None):
        what = f"thunderbolt {port.iface} on {where}"
        if port.gbps >= TB5_GBPS:
            found.append(Check("ok", what, f"Thunderbolt 5 link ({port.gbps} Gb/s)"))
        else:
            found.append(Check("FAIL", what, f"{port.gbps} Gb/s: a Thunderbolt 4 (or older) "
                               "link, where RDMA over Thunderbolt needs Thunderbolt 5",
                               "cable Thunderbolt 5 ports of both Macs with a Thunderbolt 5 "
                               "cable (System Information > Thunderbolt shows each port's "
                               "speed)"))
    return found


def _double_cables(hosts: Sequence[Host], facts: list[dict | str]) -> list[Check]:
    """Pairs of hosts joined by more than one cable, from the hostfile or as cabled."""
    pairs: dict[tuple[int, int], set[str]] = {}
    for i, host in enumerate(hosts):
        for j, entry in enumerate(host.rdma):
            if len(_devices(entry)) > 1:
                pairs.setdefault((min(i, j), max(i, j)), set()).add(
                    f"{host.name}: {', '.join(_devices(entry))}")
    if facts and all(isinstance(f, dict) and f["os"] == "darwin" for f in facts):
        cabled = thunderbolt.cables([thunderbolt.ports(f.get("thunderbolt_profile", {}),
                                                       f.get("hardware_ports", ""))
                                     for f in facts])
        for (i, j), cables in cabled.items():
            if len(cables) > 1:
                pairs.setdefault((min(i, j), max(i, j)), set()).add(
                    f"{hosts[i].name}: {', '.join(f'rdma_{mine}' for mine, _ in cables)}")
    return [Check("FAIL", f"cables {hosts[i].name}-{hosts[j].name}",
                  f"more than one cable between them ({'; '.join(sorted(seen))})",
                  "keep one cable per pair of hosts and name one device per pair in the "
                  "hostfile: tbcoll's rdma and MLX's jaccl use one device per pair")
            for (i, j), seen in sorted(pairs.items())]
