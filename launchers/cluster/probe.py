"""What a host has, as JSON on stdout: versions, its RDMA devices (verbs.py), and on macOS
its Thunderbolt ports, their addresses, RDMA and the Thunderbolt Bridge. tbrun doctor and
tbrun hostfile run it on every host (`python -m tbcoll.launch.cluster.probe [ADDRESS...]`,
over ssh for remote ones); each ADDRESS is tried with a TCP connection from this host, to
tell which link addresses it reaches.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import sys
from importlib import metadata

from tbcoll.launch.cluster.verbs import rdma_facts

REACH_PORT = 22  # a refused connection proves the address answers as well as an accepted one
REACH_TIMEOUT = 2.0


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _run(*argv: str) -> str | None:
    """stdout of a command, or None if it cannot run or fails."""
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return p.stdout if p.returncode == 0 else None


def _mlx_backends() -> list[str]:
    """The distributed backends this host's MLX has (jaccl needs macOS 26.2 and RDMA)."""
    try:
        import mlx.core as mx
    except ImportError:
        return []
    return [b for b in ("jaccl", "ring", "mpi") if mx.distributed.is_available(b)]


def reaches(address: str) -> str:
    """'ok' when something at address answers on the network, else why not."""
    try:
        with socket.create_connection((address, REACH_PORT), timeout=REACH_TIMEOUT):
            return "ok"
    except ConnectionRefusedError:
        return "ok"
    except OSError as e:
        return e.strerror or type(e).__name__


def probe(addresses: list[str]) -> dict:
    facts = {"host": socket.gethostname(), "os": sys.platform, "machine": platform.machine(),
             "cores": os.cpu_count() or 1,
             "python": platform.python_version(),
             "packages": {name: _version(name) for name in ("tbcoll", "mlx", "mpi4py", "numpy")},
             "reach": {address: reaches(address) for address in addresses},
             # over ssh: the address this host was reached at (SSH_CONNECTION's third field)
             "reached_at": (os.environ.get("SSH_CONNECTION", "").split()[2:3] or [None])[0]}
    facts["mlx_backends"] = _mlx_backends()
    facts["rdma"] = rdma_facts()
    if sys.platform == "darwin":
        facts["thunderbolt_profile"] = json.loads(
            _run("system_profiler", "SPThunderboltDataType", "-json") or "{}")
        facts["hardware_ports"] = _run("networksetup", "-listallhardwareports") or ""
        facts["rdma_ctl"] = _run("rdma_ctl", "status")
        facts["bridge0"] = _run("ifconfig", "bridge0")
        facts["ipv4"] = {}
        for line in facts["hardware_ports"].splitlines():
            if line.startswith("Device: en"):
                device = line.split(":", 1)[1].strip()
                facts["ipv4"][device] = (_run("ipconfig", "getifaddr", device) or "").strip()
    return facts


if __name__ == "__main__":
    print(json.dumps(probe(sys.argv[1:])))
