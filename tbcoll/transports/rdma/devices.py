"""Which RDMA device carries each pair of ranks, and what to tell the user when set-up fails.

The device for a pair comes from TBCOLL_RDMA_DEVICES: one name for every pair, or MLX's
matrix of the hostfile's "rdma" entries ([i][j]: the device host i reaches host j by; a list
of names for several cables, of which the first is used), which tbrun passes on. Without it,
a host with exactly one device uses that one for every pair.

The pairs are those of the rdma group: every rank of the job where each host runs one, else
the hosts' leaders (tbcoll.hierarchy), one per host, so that a matrix entry is always between
two hosts. Two ranks of one host have no entry: they talk through shared memory.
"""

from __future__ import annotations

import errno
import json
import os
import sys
from pathlib import Path

from tbcoll.core.errors import CommError
from tbcoll.job.env import LaunchInfo, RdmaSettings

NOT_BUILT = ("tbcoll was built without RDMA support: install libibverbs-dev (Linux) / the "
             "macOS 26.2 SDK and reinstall tbcoll")


def devices_per_rank(info: LaunchInfo, settings: RdmaSettings, present: list[str],
                     members: list[int] | None = None) -> list[str | None]:
    """The device this rank reaches each of members (world ranks in the group's order; default
    every rank) by, None for itself; CommError saying what to change where none is named, or a
    name is not one of this host's `present` devices."""
    rank = info.rank
    members = list(range(info.size)) if members is None else members
    text, source = settings.devices, "TBCOLL_RDMA_DEVICES"
    if not text:
        if not present:
            raise CommError(f"rank {rank} found no RDMA device on this host: "
                            f"{_how_to_get_devices()}")
        if len(present) > 1:
            raise CommError(f"rank {rank}'s host has several RDMA devices ({', '.join(present)})"
                            ": name the one for each pair in the hostfile's \"rdma\" entries, or "
                            "one for all with TBCOLL_RDMA_DEVICES")
        text, source = present[0], "the only device on this host"
    if text.startswith("["):
        matrix = _matrix(text)
        mine = info.topology.node_of(rank)
        names: list[str | None] = []
        for r in members:
            if r == rank:
                names.append(None)
                continue
            theirs = info.topology.node_of(r)
            entry = _entry(matrix, mine, theirs)
            if entry is None:
                raise CommError(_no_entry(rank, mine, r, theirs))
            names.append(entry)
        source = "the hostfile's \"rdma\" entries (TBCOLL_RDMA_DEVICES)"
    else:
        names = [None if r == rank else text for r in members]
    for name in dict.fromkeys(n for n in names if n is not None):
        if name not in present:
            there = ", ".join(present) if present else "none"
            raise CommError(f"RDMA device {name!r}, named by {source}, does not exist on rank "
                            f"{rank}'s host; its devices: {there}")
    return names


def _no_entry(rank: int, mine: int | None, peer: int, theirs: int | None) -> str:
    if mine is not None and mine == theirs:
        return (f"ranks {rank} and {peer} share host {mine}, and the hostfile's \"rdma\" "
                "entries name devices between hosts only: ranks of one host talk through shared "
                "memory in the two-level group (which TBCOLL_HIERARCHY=0 turns off), or name "
                "one device for all pairs in TBCOLL_RDMA_DEVICES")
    return (f"the hostfile names no RDMA device from rank {rank}'s host (host {mine}) to rank "
            f"{peer}'s (host {theirs}): the rdma backend needs one for every pair of hosts "
            "(every pair cabled), or one device for all pairs in TBCOLL_RDMA_DEVICES")


def _matrix(text: str) -> list:
    try:
        matrix = json.loads(text)
    except ValueError as e:
        raise CommError(f"TBCOLL_RDMA_DEVICES is neither a device name nor a JSON matrix: {e}"
                        ) from None
    if not isinstance(matrix, list) or not all(isinstance(row, list) for row in matrix):
        raise CommError("TBCOLL_RDMA_DEVICES: a JSON value must be a list of lists (MLX's "
                        "rdma matrix)")
    return matrix


def _entry(matrix: list, i: int | None, j: int | None) -> str | None:
    if i is None or j is None or i >= len(matrix) or j >= len(matrix[i]):
        return None
    entry = matrix[i][j]
    if isinstance(entry, list):
        entry = entry[0] if entry else None
    return entry if isinstance(entry, str) and entry else None


def _how_to_get_devices() -> str:
    if sys.platform == "darwin":
        return ("on macOS 26.2+ enable RDMA once in Recovery (`rdma_ctl enable`) and cable a "
                "Thunderbolt 5 port (`tbrun doctor` checks both)")
    return ("load a driver (an RDMA NIC's, or Soft-RoCE: `modprobe rdma_rxe; rdma link add rxe0 "
            "type rxe netdev eth0`) and check with ibv_devices")


def interface_of(device: str) -> str:
    """The network interface behind an RDMA device, for messages: rdma_enX is enX on Macs;
    on Linux sysfs says; else the device's own name."""
    if device.startswith("rdma_"):
        return device[len("rdma_"):]
    ndevs = Path(f"/sys/class/infiniband/{device}/ports/1/gid_attrs/ndevs")
    try:
        for entry in sorted(ndevs.iterdir()):
            name = entry.read_text().strip()
            if name:
                return name
        net = Path(f"/sys/class/infiniband/{device}/device/net")
        return next(iter(sorted(os.listdir(net))))
    except (OSError, StopIteration):
        return f"the interface of {device}"


def no_gid(device: str) -> str:
    interface = interface_of(device)
    return (f"RDMA device {device} has no IPv4-mapped GID: give {interface} an IPv4 address "
            f"(macOS: System Settings > Network > {interface} > TCP/IP, or `sudo ifconfig "
            f"{interface} inet 10.0.x.y/30`; Linux: `ip addr add ... dev {interface}`), or "
            "name a GID with TBCOLL_RDMA_GID_INDEX")


def registration_refused(text: str) -> str:
    device, nbytes, why = (text.split("|") + ["", ""])[:3]
    size = int(nbytes) / 2**20 if nbytes.isdigit() else 0
    return (f"RDMA device {device} refused to register {size:.1f} MiB of memory ({why}): "
            "Apple's driver allows about 100 memory regions per device, shared by every "
            "process that uses it (MLX's jaccl registers many): end other RDMA jobs on this "
            "host; on Linux raise the locked-memory limit (ulimit -l)")


def transition_refused(rank: int, described: tuple[str, int, str], error: OSError) -> str:
    """A queue pair the device would not bring to RTR or RTS, said once, with the likely fix."""
    device, gid_index, _ = described
    text = f"rank {rank}: {error.strerror or error}"
    if error.errno == errno.EINVAL and "RTR" in text:
        text += (f"; Apple's driver refuses RTR unless the GID (index {gid_index} of {device}) "
                 f"is IPv4-mapped (::ffff:a.b.c.d): give {interface_of(device)} an IPv4 "
                 "address on both hosts, and leave TBCOLL_RDMA_GID_INDEX unset or name such a "
                 "GID (`tbrun doctor` lists each port's)")
    return text + ("; not tried again: on a Mac repeated failed RTR transitions can wedge the "
                   "port until reboot")
