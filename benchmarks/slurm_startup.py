"""Startup inside Slurm: the wall time to run 4 ranks of an empty script, launchers alternated.

    sudo .venv/bin/python benchmarks/slurm_startup.py --reps 7

Brings up the test suite's Slurm cluster (tests/harness/slurmcluster.py: nodes n0 and n1, each a
network namespace; needs root, slurm-wlm and munge), takes one allocation of 2 nodes x 2
tasks, and inside it times, in turn, each of: srun alone, MPICH's mpiexec alone (Hydra's
Slurm launcher), tbrun (ranks through srun), tbrun --backend mpi, and the same launchers
with a script that opens tbcoll's world (srun --mpi=pmi2 against tbrun). Prints the median
and the range of each, in seconds, as a markdown table.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.harness import netns, slurmcluster  # noqa: E402

BIN = Path(sys.executable).parent
INIT = "import tbcoll; tbcoll.init().close()"


def systems(folder: Path, manager: str) -> dict[str, str]:
    empty = folder / "empty.py"
    empty.write_text("pass\n")
    py, tbrun = sys.executable, BIN / "tbrun"
    return {
        "srun": f"srun -n 4 {py} {empty}",
        "mpiexec": f"{BIN / 'mpiexec'} -n 4 -hosts n0,n1 -launcher slurm -localhost {manager} "
                   f"{py} {empty}",
        "tbrun": f"{tbrun} {empty}",
        "tbrun --backend mpi": f"{tbrun} --backend mpi {empty}",
        "srun --mpi=pmi2, tbcoll.init": f"srun --mpi=pmi2 -n 4 {py} -c '{INIT}'",
        "tbrun, tbcoll.init": f"{tbrun} {py} -c '{INIT}'",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args()
    reason = slurmcluster.why_not_available()
    if reason:
        sys.exit(f"slurm_startup: {reason}")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        hosts = netns.Cluster(f"tbb{os.getpid() % 10000}", folder, 2)
        cluster = slurmcluster.SlurmCluster(hosts, folder)
        try:
            hosts.start(sshd=False)
            cluster.start()
            commands = systems(folder, hosts.address(0))
            # one allocation; inside it each command is timed in turn, round after round
            loop = f"for r in $(seq {args.reps}); do " + "; ".join(
                f"s=$(date +%s%N); {cmd} >/dev/null 2>&1 || echo FAILED {i}; "
                f"echo T {i} $(( $(date +%s%N) - s ))"
                for i, cmd in enumerate(commands.values())) + "; done"
            done = cluster.run("salloc", "-Q", "-N", "2", "-n", "4", "bash", "-c", loop,
                               timeout=60 + 30 * args.reps * len(commands))
        finally:
            cluster.stop()
            hosts.stop()
    if done.returncode != 0:
        sys.exit(f"slurm_startup: salloc failed: {done.stderr.strip()}")
    times: dict[int, list[float]] = {}
    for line in done.stdout.splitlines():
        if line.startswith("FAILED"):
            sys.exit(f"slurm_startup: {list(commands)[int(line.split()[1])]} failed")
        if line.startswith("T "):
            _, i, ns = line.split()
            times.setdefault(int(i), []).append(int(ns) / 1e9)
    print("| launcher (4 ranks, 2 nodes) | median s | min..max s |")
    print("|---|---|---|")
    for i, name in enumerate(commands):
        t = times[i]
        print(f"| {name} | {statistics.median(t):.3f} | {min(t):.3f}..{max(t):.3f} |")


if __name__ == "__main__":
    main()
