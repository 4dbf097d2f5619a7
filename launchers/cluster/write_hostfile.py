"""tbrun hostfile: write a hostfile for given hosts. MPI text (`host slots=N`) by default;
with --json, MLX's JSON hostfile, each host probed over ssh for the address it was reached
at and, when every host is a Mac, the Thunderbolt cables between them: the RDMA device that
reaches each host ("rdma"), each end's address ("links") and the backend the cabling allows
(jaccl for a full mesh, jaccl-ring for a ring), as mlx.distributed_config does, and each
host's "slots" where --slots is given."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence

from tbcoll.launch.cluster import thunderbolt
from tbcoll.launch.cluster.doctor import gather
from tbcoll.launch.hosts import LOOPBACK, address_towards, is_this_machine

from tbcoll.core.errors import LaunchError
from tbcoll.job.topology import Host


def text_hostfile(names: Sequence[str], slots: int | None, ssh: Sequence[str], python: str,
                  connect_timeout: float) -> str:
    """HOST slots=N lines: N as given, else each host's cores (probed, over ssh if remote)."""
    counts = [slots] * len(names) if slots else [
        fact["cores"] for fact in probe_all(names, ssh, python, connect_timeout)]
    return "".join(f"{name} slots={n}\n" for name, n in zip(names, counts, strict=True))


def json_hostfile(names: Sequence[str], ssh: Sequence[str], python: str,
                  connect_timeout: float, slots: int | None = None) -> str:
    facts = probe_all(names, ssh, python, connect_timeout)
    remote = [name for name in names if not is_this_machine(name)]
    here = address_towards(remote[0]) if remote else LOOPBACK  # a one-machine hostfile
    return hostfile_from_facts(names, facts, here, slots)


def probe_all(names: Sequence[str], ssh: Sequence[str], python: str,
              connect_timeout: float) -> list[dict]:
    facts = gather([Host(name) for name in names], ssh, python, connect_timeout)
    for name, fact in zip(names, facts, strict=True):
        if isinstance(fact, str):
            raise LaunchError(f"cannot probe {name}: {fact} (tbrun doctor says more)")
    return facts


def hostfile_from_facts(names: Sequence[str], facts: list[dict], here: str | None,
                        slots: int | None = None) -> str:
    """The JSON hostfile for hosts with these probed facts; here: this machine's address for
    the others (a host probed without ssh has no "reached_at"); slots: each host's ranks
    (left out: one, as MLX reads it)."""
    entries = []
    for name, fact in zip(names, facts, strict=True):
        address = fact.get("reached_at") or here
        entries.append({"ssh": name, "ips": [address] if address else [],
                        **({"slots": slots} if slots else {})})
    if all(f["os"] == "darwin" for f in facts):
        ports = [thunderbolt.ports(f["thunderbolt_profile"], f["hardware_ports"]) for f in facts]
        cables = thunderbolt.cables(ports)
        rdma = thunderbolt.rdma_matrix(len(names), cables)
        for i, entry in enumerate(entries):
            entry["rdma"] = rdma[i]
            entry["links"] = [_link(facts[i]["ipv4"], cables, i, j) for j in range(len(names))]
        shape = thunderbolt.shape(len(names), cables)
        backend = {"full mesh": "jaccl", "ring": "jaccl-ring"}.get(shape, "ring")
        print(f"tbrun: Thunderbolt cabling: {shape}; backend {backend}", file=sys.stderr)
        return json.dumps({"backend": backend, "hosts": entries}, indent=2) + "\n"
    print("tbrun: Thunderbolt discovery skipped: macOS only; no rdma or links written",
          file=sys.stderr)
    return json.dumps({"hosts": entries}, indent=2) + "\n"


def _link(ipv4: dict[str, str], cables: dict[tuple[int, int], list[tuple[str, str]]], i: int,
          j: int) -> str | list[str] | None:
    """Host i's "links" entry towards host j: its address on the cable between them, or on
    each of several, in the order the lower host found them, so that both ends list the k-th
    cable k-th (Layout.paths pairs them by place; tcp takes the first that answers)."""
    low, high = min(i, j), max(i, j)
    ends = [pair[0] if i == low else pair[1] for pair in cables.get((low, high), ())]
    addresses = [ipv4[iface] for iface in ends if ipv4.get(iface)]
    return None if not addresses else addresses[0] if len(addresses) == 1 else addresses
