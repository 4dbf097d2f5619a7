"""all_reduce across three hosts, each a network namespace with its own sshd
(tests/harness/netns.py), cabled as a full mesh of veth links: tbcoll over tcp (each pair over
its own link), MPICH (through `tbrun --backend mpi`, i.e. mpiexec over ssh) and MLX's ring
backend, all launched by tbrun from host 0, in turns (A B C A B C ...). Needs root.

    sudo python benchmarks/multihost.py -b 8 -e 1M -f 32 --rounds 3

Every call's result is checked by tbcoll.bench; the table gives medians over rounds and
tbcoll's time divided by each peer's (below 1: tbcoll is faster).
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
# system -> (tbrun flags, tbcoll-bench algorithm)
SYSTEMS = {
    "tbcoll-tcp": (["--backend", "tcp"], "default"),
    # When the namespaces shared one hostname and /dev/shm, MPICH (ch4:ucx) took them for one
    # node and moved data through shared memory: a 16 MB all_reduce crossed the veth links
    # with 30 KB. NOLOCAL and UCX over TCP kept it on the network, as between real hosts
    # (then 540 MB crossed them), and are kept for the figures measured so. Each host now has
    # its own name and /dev/shm (tests/harness/netns.py): benchmarks/two_level.py needs neither.
    "mpich": (["--backend", "mpi", "-x", "MPIR_CVAR_NOLOCAL=1", "-x", "UCX_TLS=tcp,self"],
              "native"),
    "mlx-ring": (["--backend", "mlx"], "native"),
}


def run(cluster: Cluster, system: str, hosts: Path, sweep: list[str], out: Path) -> list[dict]:
    flags, algorithm = SYSTEMS[system]
    argv = cluster.exec_argv(0, str(BIN / "tbrun"), "--ssh", cluster.ssh, "--hostfile",
                             str(hosts), *flags, str(BIN / "tbcoll-bench"), "all_reduce",
                             *sweep, "-a", algorithm, "--inplace", "no", "--json", str(out))
    p = subprocess.run(argv, capture_output=True, text=True, timeout=1800, cwd=REPO)
    if p.returncode:
        raise SystemExit(f"{system} failed:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-b", default="8")
    parser.add_argument("-e", default="1M")
    parser.add_argument("-f", default="32")
    parser.add_argument("-n", default="50")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if reason := why_not_available():
        raise SystemExit(f"cannot build the cluster: {reason}")
    sweep = ["-b", args.b, "-e", args.e, "-f", args.f, "-n", args.n, "-r", "5"]
    times: dict[tuple[str, int], list[float]] = defaultdict(list)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        cluster = Cluster("tbcb", folder, HOSTS)
        try:
            cluster.start()
            hosts = cluster.mesh_hostfile(folder)
            for round_ in range(args.rounds):
                order = list(SYSTEMS) if round_ % 2 == 0 else list(reversed(SYSTEMS))
                for system in order:
                    for row in run(cluster, system, hosts, sweep, folder / "rows.json"):
                        if row["wrong"]:
                            raise SystemExit(f"{system}: wrong results at {row['size']} B")
                        times[system, row["size"]].append(row["time_us"])
        finally:
            cluster.stop()
    sizes = sorted({size for _, size in times})
    print(f"# all_reduce float32 over {HOSTS} namespace hosts (1 rank each), median time per "
          f"call in us over {args.rounds} rounds; ratio = tbcoll-tcp / peer")
    print("| size | " + " | ".join(SYSTEMS) + " | / mpich | / mlx-ring |")
    print("|---:|" + "---:|" * (len(SYSTEMS) + 2))
    for size in sizes:
        median = {s: statistics.median(times[s, size]) for s in SYSTEMS}
        ratios = [median["tbcoll-tcp"] / median[peer] for peer in ("mpich", "mlx-ring")]
        print(f"| {size} | " + " | ".join(f"{median[s]:.1f}" for s in SYSTEMS) + " | "
              + " | ".join(f"{r:.2f}" for r in ratios) + " |")


if __name__ == "__main__":
    main()
