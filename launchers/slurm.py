"""A Slurm allocation as tbrun's hosts: inside salloc or sbatch, tbrun runs on the nodes and
task counts Slurm granted, as mpiexec does, and starts ranks on other nodes through srun.

Slurm describes the allocation in compressed forms: SLURM_JOB_NODELIST `mac[01-04,07],gpu1`
(a hostlist: ranges keep their zero padding, several bracket groups multiply out) and
SLURM_TASKS_PER_NODE `2(x3),1` (2 tasks on each of 3 nodes, then 1). Where scontrol answers,
each node's NodeAddr (the address Slurm itself reaches it at) becomes its address.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Mapping

from tbcoll.core.errors import HostfileError
from tbcoll.core.records import record
from tbcoll.job.topology import MAX_RANKS, Host, Hostfile

_COUNT = re.compile(r"(\d+)(?:\(x(\d+)\))?\Z")
_RANGE = re.compile(r"(\d+)(?:-(\d+))?\Z")
_SCONTROL_TIMEOUT = 10.0


def expand_hostlist(text: str) -> list[str]:
    """Slurm's compressed host list as names, in order: `n[01-03,7],m` -> n01 n02 n03 n7 m."""
    names = []
    for item in _split_top(text.strip(), ","):
        if not item:
            raise HostfileError(f"node list {text!r}: empty name")
        names.extend(_expand_item(item, text))
    return names


def expand_counts(text: str) -> list[int]:
    """SLURM_TASKS_PER_NODE and the like: `2(x3),1` -> [2, 2, 2, 1]."""
    counts = []
    for item in text.split(","):
        found = _COUNT.match(item.strip())
        if not found:
            raise HostfileError(f"task counts {text!r}: {item!r} is not N or N(xM)")
        counts += [int(found.group(1))] * int(found.group(2) or 1)
    return counts


def _split_top(text: str, sep: str) -> list[str]:
    """text split at sep outside brackets."""
    parts, depth, start = [], 0, 0
    for i, c in enumerate(text):
        depth += (c == "[") - (c == "]")
        if c == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    return [*parts, text[start:]]


def _expand_item(item: str, text: str) -> list[str]:
    head, bracket, rest = item.partition("[")
    if not bracket:
        return [item]
    body, closed, tail = rest.partition("]")
    if not closed or not body:
        raise HostfileError(f"node list {text!r}: unmatched or empty brackets in {item!r}")
    numbers = []
    for part in body.split(","):
        found = _RANGE.match(part)
        if not found or (found.group(2) and int(found.group(2)) < int(found.group(1))):
            raise HostfileError(f"node list {text!r}: {part!r} is not N or N-M (N <= M)")
        low, high = found.group(1), found.group(2) or found.group(1)
        if int(high) - int(low) >= MAX_RANKS:
            raise HostfileError(f"node list {text!r}: the range {part!r} is too long")
        numbers += [str(n).zfill(len(low)) for n in range(int(low), int(high) + 1)]
    return [f"{head}{n}{suffix}" for n in numbers for suffix in _expand_item(tail, text)]


@record
class Allocation:
    job_id: str
    nodes: tuple[str, ...]
    tasks_per_node: tuple[int, ...]
    ntasks: int  # SLURM_NTASKS, the default number of ranks
    this_node: str | None  # SLURMD_NODENAME: tbrun runs on this node of it (sbatch)

    def hostfile(self, addresses: Mapping[str, str]) -> Hostfile:
        """The allocation as tbrun's hosts: each node with its tasks as slots, at its address."""
        hosts = tuple(Host(node, slots, (addresses[node],) if node in addresses else ())
                      for node, slots in zip(self.nodes, self.tasks_per_node, strict=True))
        return Hostfile(hosts, f"the Slurm allocation (job {self.job_id})")


def allocation(environ: Mapping[str, str]) -> Allocation | None:
    """The allocation tbrun runs in (salloc, sbatch), or None outside Slurm."""
    if "SLURM_JOB_ID" not in environ or "SLURM_JOB_NODELIST" not in environ:
        return None
    nodes = expand_hostlist(environ["SLURM_JOB_NODELIST"])
    per_node = environ.get("SLURM_TASKS_PER_NODE") or environ.get("SLURM_JOB_CPUS_PER_NODE")
    counts = expand_counts(per_node) if per_node else [1] * len(nodes)
    if len(counts) != len(nodes):
        raise HostfileError(f"Slurm gave {len(nodes)} nodes ({environ['SLURM_JOB_NODELIST']}) "
                            f"but task counts for {len(counts)} ({per_node})")
    ntasks = environ.get("SLURM_NTASKS") or environ.get("SLURM_NPROCS")
    return Allocation(environ["SLURM_JOB_ID"], tuple(nodes), tuple(counts),
                      int(ntasks) if ntasks and ntasks.isdigit() else sum(counts),
                      environ.get("SLURMD_NODENAME"))


def node_addresses(nodes: list[str] | tuple[str, ...]) -> dict[str, str]:
    """Each node's NodeAddr as Slurm's controller knows it ({} where scontrol cannot say)."""
    import shutil  # here: tbrun's start-up outside Slurm does without it (~2 ms)

    scontrol = shutil.which("scontrol")
    if scontrol is None:
        return {}
    try:
        shown = subprocess.run([scontrol, "--oneliner", "show", "node", ",".join(nodes)],
                               capture_output=True, text=True, timeout=_SCONTROL_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    addresses = {}
    for line in shown.stdout.splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        if fields.get("NodeName") and fields.get("NodeAddr"):
            addresses[fields["NodeName"]] = fields["NodeAddr"]
    return addresses
