"""Thunderbolt cabling from what macOS reports (tbcoll.launch.cluster.probe): which port of which
host is cabled to which port of another, and the RDMA device and address at each end.

system_profiler SPThunderboltDataType -json lists a bus per port, with the port's
domain_uuid_key, its receptacle number and, under _items, the domain_uuid_key of the
machine at the other end of its cable, and the link's speed (current_speed_key, "Up to 80
Gb/s" on Thunderbolt 5, 40 on Thunderbolt 4); networksetup -listallhardwareports names the
network interface of "Thunderbolt N". MLX's RDMA device for interface enX is rdma_enX.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Port:
    iface: str  # e.g. en2
    uuid: str
    peer_uuid: str | None  # the port at the other end of the cable
    gbps: int | None = None  # the link's speed: 80 or more is Thunderbolt 5, 40 is 3 or 4


def hardware_ports(text: str) -> dict[str, str]:
    """networksetup -listallhardwareports: port name -> device."""
    ports, name = {}, None
    for line in text.splitlines():
        if line.startswith("Hardware Port:"):
            name = line.split(":", 1)[1].strip()
        elif line.startswith("Device:") and name is not None:
            ports[name] = line.split(":", 1)[1].strip()
            name = None
    return ports


def ports(profile: dict, hardware: str) -> list[Port]:
    """The Thunderbolt ports of one host, by interface name."""
    devices = hardware_ports(hardware)
    found = []
    for bus in profile.get("SPThunderboltDataType", []):
        uuid = bus.get("domain_uuid_key")
        receptacle_tag = bus.get("receptacle_1_tag", {})
        receptacle = receptacle_tag.get("receptacle_id_key")
        iface = devices.get(f"Thunderbolt {receptacle}")
        if uuid is None or iface is None:
            continue
        peers = [item["domain_uuid_key"] for item in bus.get("_items", [])
                 if "domain_uuid_key" in item]
        speed = re.search(r"(\d+)\s*Gb/s", receptacle_tag.get("current_speed_key", ""))
        found.append(Port(iface, uuid, peers[0] if peers else None,
                          int(speed.group(1)) if speed else None))
    return sorted(found, key=lambda p: p.iface)


def cables(hosts: list[list[Port]]) -> dict[tuple[int, int], list[tuple[str, str]]]:
    """(i, j) -> for each cable between hosts i and j, (i's interface, j's interface)."""
    where = {port.uuid: (i, port.iface) for i, host in enumerate(hosts) for port in host}
    found: dict[tuple[int, int], list[tuple[str, str]]] = {}
    for i, host in enumerate(hosts):
        for port in host:
            if port.peer_uuid in where:
                j, peer_iface = where[port.peer_uuid]
                if j != i:
                    found.setdefault((i, j), []).append((port.iface, peer_iface))
    return found


def rdma_matrix(n: int, found: dict[tuple[int, int], list[tuple[str, str]]]) -> list[list]:
    """MLX's rdma entries: [i][j] the device (or devices) host i reaches host j by."""
    matrix: list[list] = [[None] * n for _ in range(n)]
    for (i, j), pairs in found.items():
        devices = [f"rdma_{mine}" for mine, _ in pairs]
        matrix[i][j] = devices[0] if len(devices) == 1 else devices
    return matrix


def shape(n: int, found: dict[tuple[int, int], list]) -> str:
    """'full mesh', 'ring', or 'incomplete' for n hosts and their cables."""
    linked = {(i, j) for i, j in found} | {(j, i) for i, j in found}
    if n > 1 and all((i, j) in linked for i in range(n) for j in range(n) if i != j):
        return "full mesh"
    if n > 2 and all(((i, (i + 1) % n) in linked) for i in range(n)):
        return "ring"
    return "incomplete"
