"""all_reduce with several ranks on each host (issue 48): three namespace hosts of two ranks
(tests/harness/netns.py: each host its own network, /dev/shm and host name, cabled as a full
mesh of veth links), tbcoll over tcp against MPICH (mpi4py, through `tbrun --backend mpi`),
both launched by tbrun from host 0 with the same JSON hostfile ("slots": 2, "links"), in turns
A B A B ...; then an 8 B all_reduce on 3 hosts x 2 ranks against 3 hosts x 1 rank, in turns too.
Needs root; not part of `make test`.

    sudo .venv/bin/python benchmarks/two_level.py [--rounds 5] [-n 50] [--small-iters 2000]

Every call's result is checked by tbcoll-bench (both write into preallocated buffers,
out-of-place). The tables give medians over rounds and ratios (below 1: tbcoll is faster), and
the bytes each system's job put on the cables and on the management network, so that one sees
both crossed the hosts' links. The machine's speed drifts: only turns taken close together
compare.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # the cluster is the test suite's (tests/harness/netns.py)

from tests.harness.netns import Cluster, why_not_available  # noqa: E402

BIN = Path(sys.executable).parent
HOSTS = 3
SWEEP = ("tbcoll", "mpich")
# system -> (tbrun flags, tbcoll-bench algorithm). MPICH sees three nodes (each host its own
# name and /dev/shm): shared memory inside a host, UCX between hosts, kept to TCP as tbcoll's.
SYSTEMS = {
    "tbcoll": (["--backend", "tcp"], "default"),
    "mpich": (["--backend", "mpi", "-x", "UCX_TLS=tcp,self"], "native"),
}


def run(cluster: Cluster, system: str, hosts: Path, sweep: list[str],
        out: Path) -> tuple[list[dict], dict[str, int]]:
    """One job of tbcoll-bench all_reduce: its rows, and the bytes it put on each kind of link
    (cables "tb", the management network "mgmt"), summed over the hosts."""
    flags, algorithm = SYSTEMS[system]
    argv = cluster.exec_argv(0, str(BIN / "tbrun"), "--ssh", cluster.ssh, "--hostfile",
                             str(hosts), *flags, str(BIN / "tbcoll-bench"), "all_reduce",
                             *sweep, "-a", algorithm, "--inplace", "no", "--json", str(out))
    before = link_bytes(cluster)
    p = subprocess.run(argv, capture_output=True, text=True, timeout=1800, cwd=REPO)
    if p.returncode:
        raise SystemExit(f"{system} failed:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    after = link_bytes(cluster)
    rows = json.loads(out.read_text())
    for row in rows:
        if row["wrong"]:
            raise SystemExit(f"{system}: wrong results at {row['size']} B")
    return rows, {kind: after[kind] - before[kind] for kind in after}


def link_bytes(cluster: Cluster) -> dict[str, int]:
    """Bytes received so far on the hosts' cables and management links, all hosts together."""
    total = {"tb": 0, "mgmt": 0}
    for i in range(cluster.size):
        text = subprocess.run(cluster.exec_argv(i, "cat", "/proc/net/dev"), capture_output=True,
                              text=True, check=True, timeout=30).stdout
        for line in text.splitlines()[2:]:
            name, _, numbers = line.partition(":")
            kind = "tb" if name.strip().startswith("tb") else name.strip()
            if kind in total:
                total[kind] += int(numbers.split()[0])
    return total


def sweep_table(times: dict, moved: dict, rounds: int) -> None:
    sizes = sorted({size for _, size in times})
    print(f"# all_reduce float32, {HOSTS} hosts x 2 ranks, median time per call in us over "
          f"{rounds} rounds; ratio = tbcoll / mpich")
    print("| size | tbcoll | mpich | ratio |")
    print("|---:|---:|---:|---:|")
    for size in sizes:
        a, b = (statistics.median(times[s, size]) for s in SWEEP)
        print(f"| {size} | {a:.1f} | {b:.1f} | {a / b:.2f} |")
    for system in SWEEP:
        print(f"# {system}: per job (median) {statistics.median(moved[system, 'tb']) / 1e6:.0f} MB "
              f"on the cables, {statistics.median(moved[system, 'mgmt']) / 1e6:.1f} MB on the "
              "management network")


def rails_against_leaders(rounds: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        cluster = Cluster("tbtl", Path(tmp), HOSTS)
        try:
            cluster.start()
            hosts = cluster.mesh_hostfile(Path(tmp), slots=[2] * HOSTS)
            argv = cluster.exec_argv(0, str(BIN / "tbrun"), "--ssh", cluster.ssh, "--hostfile",
                                     str(hosts), str(BIN / "python"),
                                     str(REPO / "benchmarks" / "two_level_rails.py"), str(rounds))
            p = subprocess.run(argv, capture_output=True, text=True, timeout=1800, cwd=REPO)
            print(p.stdout, p.stderr[-2000:] if p.returncode else "")
        finally:
            cluster.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("-b", default="8")
    parser.add_argument("-e", default="16M")
    parser.add_argument("-f", default="8", help="size factor (8: 8 B, 64 B, ... 16 MiB)")
    parser.add_argument("-n", default="50", help="calls per timed batch of the sweep")
    parser.add_argument("--small-iters", default="2000", help="calls per batch at 8 B")
    parser.add_argument("--rails", action="store_true", help="only tbcoll's all_reduce over "
                        "the rails against through the leaders (benchmarks/two_level_rails.py)")
    args = parser.parse_args()
    if reason := why_not_available():
        raise SystemExit(f"cannot build the cluster: {reason}")
    if args.rails:
        rails_against_leaders(args.rounds)
        return
    sweep = ["-b", args.b, "-e", args.e, "-f", args.f, "-n", args.n, "-r", "5"]
    small = ["-b", "8", "-e", "8", "-n", args.small_iters, "-r", "5"]
    times: dict[tuple[str, int], list[float]] = defaultdict(list)
    moved: dict[tuple[str, str], list[int]] = defaultdict(list)
    latency: dict[str, list[float]] = defaultdict(list)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        cluster = Cluster("tbtl", folder, HOSTS)
        try:
            cluster.start()
            two = cluster.mesh_hostfile(folder, slots=[2] * HOSTS)
            one = cluster.mesh_hostfile(folder, slots=[1] * HOSTS)
            for _ in range(args.rounds):
                for system in SWEEP:  # A B A B ...
                    rows, bytes_ = run(cluster, system, two, sweep, folder / "rows.json")
                    for row in rows:
                        times[system, row["size"]].append(row["time_us"])
                    for kind, count in bytes_.items():
                        moved[system, kind].append(count)
            for _ in range(args.rounds):
                for shape, hosts in (("3x2", two), ("3x1", one)):
                    rows, _ = run(cluster, "tbcoll", hosts, small, folder / "rows.json")
                    latency[shape].append(rows[0]["time_us"])
        finally:
            cluster.stop()
    sweep_table(times, moved, args.rounds)
    a, b = (statistics.median(latency[s]) for s in ("3x2", "3x1"))
    print(f"\n# tbcoll 8 B all_reduce, median over {args.rounds} rounds of {args.small_iters}-call "
          "batches")
    print("| 3 hosts x 2 ranks | 3 hosts x 1 rank | ratio |\n|---:|---:|---:|")
    print(f"| {a:.1f} us | {b:.1f} us | {a / b:.2f} |")


if __name__ == "__main__":
    main()
