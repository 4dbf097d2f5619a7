"""What mlx.launch gives the ranks of each MLX backend, so that an unmodified MLX script runs
under `tbrun --backend mlx`:

- ring: MLX_RANK, and MLX_HOSTFILE, a JSON file listing per rank the "ip:port" it listens on;
- jaccl (RDMA over Thunderbolt, every pair of Macs cabled) and jaccl-ring (cabled as a ring):
  MLX_RANK, MLX_IBV_DEVICES, a JSON file with the matrix of RDMA devices ([i][j] the device
  rank i uses to reach rank j, null on the diagonal), MLX_JACCL_COORDINATOR (ip:port of
  rank 0) and, for the ring variant, MLX_JACCL_RING=1.

Files are given by content; tbrun writes them where each rank runs (tbcoll.launch.remote on a
remote host) and points the variable at the file.
"""

from __future__ import annotations

import json

from tbcoll.launch.config import LaunchConfig
from tbcoll.launch.hosts import LOOPBACK, JobPlan, free_port

from tbcoll.core.errors import LaunchError
from tbcoll.core.records import record
from tbcoll.job.env import format_hostport
from tbcoll.job.topology import Hostfile

MLX_BACKENDS = ("ring", "jaccl", "jaccl-ring")
FIRST_PORT = 32323  # mlx.launch's default --starting-port


@record
class MlxVariables:
    backend: str
    env: dict[str, str]  # the same for every rank
    files: dict[str, str]  # variable -> content of its file

    def for_rank(self, rank: int) -> dict[str, str]:
        return {**self.env, "MLX_RANK": str(rank)}


def choose_backend(hostfile: Hostfile | None) -> str:
    """The hostfile's "backend" if it names an MLX one; else jaccl for a full RDMA mesh,
    jaccl-ring for RDMA cabled as a ring, ring (over TCP) without RDMA devices."""
    if hostfile is None:
        return "ring"
    if hostfile.backend:
        if hostfile.backend not in MLX_BACKENDS:
            raise LaunchError(f"{hostfile.source}: \"backend\": {hostfile.backend!r} is not one "
                              f"of {', '.join(MLX_BACKENDS)}")
        return hostfile.backend
    if not any(h.rdma for h in hostfile.hosts):
        return "ring"
    return "jaccl" if hostfile.is_full_mesh() else "jaccl-ring"


def ring_variables(addresses: list[tuple[str, int]]) -> MlxVariables:
    """MLX's ring backend; addresses: where each rank listens."""
    ring = json.dumps([[format_hostport(host, port)] for host, port in addresses])
    return MlxVariables("ring", {}, {"MLX_HOSTFILE": ring})


def jaccl_variables(hostfile: Hostfile, nprocs: int, backend: str,
                    port: int = FIRST_PORT) -> MlxVariables:
    """MLX's jaccl backends: one rank per host, every needed pair with an RDMA device."""
    hosts = hostfile.hosts
    if nprocs != len(hosts):
        raise LaunchError(f"{hostfile.source}: the {backend} backend runs one rank per host; "
                          f"use -np {len(hosts)}")
    n = len(hosts)
    for i, host in enumerate(hosts):
        if len(host.rdma) != n:
            raise LaunchError(f"{hostfile.source}: host {i} ({host.name!r}) lists no \"rdma\" "
                              f"devices; {backend} needs one entry per host")
        needed = ((i - 1) % n, (i + 1) % n) if backend == "jaccl-ring" else range(n)
        for j in needed:
            if j != i and host.rdma[j] is None:
                raise LaunchError(f"{hostfile.source}: no RDMA device from {host.name!r} to "
                                  f"{hosts[j].name!r} (rdma[{j}] of host {i}), which {backend} "
                                  "needs")
    if not hosts[0].ips:
        raise LaunchError(f"{hostfile.source}: host 0 ({hosts[0].name!r}) needs \"ips\": the "
                          "address every rank reaches the jaccl coordinator at")
    devices = [[list(d) if isinstance(d, tuple) else d for d in h.rdma] for h in hosts]
    env = {"MLX_JACCL_COORDINATOR": format_hostport(hosts[0].ips[0], port)}
    if backend == "jaccl-ring":
        env["MLX_JACCL_RING"] = "1"
    return MlxVariables(backend, env, {"MLX_IBV_DEVICES": json.dumps(devices)})


def job_variables(cfg: LaunchConfig, plan: JobPlan) -> MlxVariables:
    """What mlx.launch would give the ranks of this job (--backend mlx)."""
    backend = choose_backend(cfg.hostfile)
    if backend != "ring":
        return jaccl_variables(cfg.hostfile, cfg.nprocs, backend)
    if cfg.nprocs == 1:  # as mlx.launch: a ring of one has no hostfile
        return MlxVariables("ring", {}, {})
    if len(plan.hosts) == 1:
        return ring_variables([(LOOPBACK, free_port(LOOPBACK)) for _ in range(cfg.nprocs)])
    # as mlx.launch does: each rank's host address, ports counting up from 32323
    address = {rank: host.addr for host in plan.topology.hosts for rank in host.ranks}
    return ring_variables([(address[rank], FIRST_PORT + rank) for rank in range(cfg.nprocs)])
