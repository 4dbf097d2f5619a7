"""Two jobs on one host at once: what an 8 B ping-pong's time does when another job's ranks
want the same cores (the swings of small shm messages on a shared machine).

    python benchmarks/contention.py [--seconds 3] [--rounds 2] [--jobs 2]

In turns (A B A B ...), for tbcoll (shm, under tbrun) and MPICH (mpi4py, under mpiexec): one
job alone, then --jobs identical jobs started together. Every job ping-pongs 8 B between its
two ranks for --seconds and prints its round trips and the median and 90th percentile of
the one-way time (half a round trip); the table gives, per system and setting, the ranges
over jobs and rounds.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

BIN = Path(sys.executable).parent

_RANK_SCRIPT = """
import json, sys, time
import numpy as np
seconds, system = float(sys.argv[1]), sys.argv[2]
if system == "tbcoll":
    import tbcoll
    comm = tbcoll.init()
    rank, send, recv = comm.rank, comm.send, comm.recv
else:
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    rank, send, recv = comm.rank, comm.Send, comm.Recv
x, y, go = np.ones(2, np.float32), np.empty(2, np.float32), np.ones(1, np.int32)
peer, clock, times = 1 - rank, time.perf_counter, []
end = clock() + seconds
while go[0]:
    for _ in range(1000):
        start = clock()
        if rank == 0:
            send(x, peer)
            recv(y, peer)
        else:
            recv(y, peer)
            send(x, peer)
        times.append(clock() - start)
    go[0] = clock() < end  # rank 0's clock decides, for both
    send(go, peer) if rank == 0 else recv(go, peer)
times.sort()
if rank == 0:
    print(json.dumps([len(times), times[len(times) // 2] / 2e-6,
                      times[len(times) * 9 // 10] / 2e-6]))
"""

LAUNCH = {"tbcoll": [str(BIN / "tbrun"), "-np", "2"],
          "mpich": [str(BIN / "mpiexec"), "-n", "2"]}


def jobs(system: str, count: int, seconds: float, script: Path) -> list[list[float]]:
    """Start count jobs of system together; each one's [round trips, median us, p90 us]."""
    command = [*LAUNCH[system], sys.executable, str(script), str(seconds), system]
    running = [subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
               for _ in range(count)]
    results = []
    for job in running:
        out, _ = job.communicate(timeout=seconds + 120)
        if job.returncode:
            raise SystemExit(f"{system} job failed ({job.returncode}): {out}")
        results.append(json.loads(out.strip().removeprefix("[0]").strip()))
    return results


def span(values: list[float], digits: int = 1) -> str:
    low, high = min(values), max(values)
    return f"{low:.{digits}f}" if round(low, digits) == round(high, digits) else (
        f"{low:.{digits}f}-{high:.{digits}f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    settings = [(system, count) for count in (1, args.jobs) for system in LAUNCH]
    found: dict[tuple[str, int], list[list[float]]] = {setting: [] for setting in settings}
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "pingpong.py"
        script.write_text(_RANK_SCRIPT)
        for _ in range(args.rounds):
            for system, count in settings:
                found[system, count] += jobs(system, count, args.seconds, script)
    print(f"# 8 B ping-pong, np=2 per job, {args.seconds:g} s per job, {args.rounds} rounds; "
          "ranges over jobs and rounds")
    print("| system | jobs at once | round trips per second | one way, median us | p90 us |")
    print("|---|---:|---:|---:|---:|")
    for (system, count), results in found.items():
        rates = [trips / args.seconds / 1000 for trips, _, _ in results]
        print(f"| {system} | {count} | {span(rates, 0)}k | {span([r[1] for r in results])} "
              f"| {span([r[2] for r in results])} |")


if __name__ == "__main__":
    main()
