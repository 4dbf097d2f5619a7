"""all_reduce latency and bandwidth: tbcoll (tcp and mpi transports, every algorithm) beside
mpi4py's MPI_Allreduce on MPICH, in one invocation.

    python benchmarks/allreduce_compare.py -np 2 --rounds 3

Each round runs one job per backend, one after the other: an mpiexec job that times mpi4py's
Allreduce and tbcoll's mpi backend, and tbrun jobs for tbcoll's shm and tcp backends. Inside
a job the systems take turns batch by batch (A B A B ...), so that the machine's noise falls
on all of them alike. A batch's time is the slowest rank's; the table gives the median over all
batches of all rounds, and each system's ratio to mpi4py.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

BIN = Path(sys.executable).parent
DEFAULT_SIZES = "8,65536,16777216"


def _iterations(nbytes: int) -> int:
    return max(3, min(200, (4 << 20) // max(nbytes, 1)))


def worker(backend: str, sizes: list[int], batches: int) -> None:
    import tbcoll

    comm = tbcoll.init(backend)
    systems = {}
    if backend == "mpi":
        from mpi4py import MPI

        systems["mpi4py Allreduce"] = lambda x, out: MPI.COMM_WORLD.Allreduce(x, out)
    systems[f"tbcoll {backend} default"] = lambda x, out: comm.all_reduce(x, out=out)
    for algorithm in comm.algorithms("all_reduce"):
        systems[f"tbcoll {backend} {algorithm}"] = (
            lambda x, out, a=algorithm: comm.all_reduce(x, algorithm=a, out=out))
    results = []
    for nbytes in sizes:
        x = np.ones(max(1, nbytes // 4), np.float32)
        out = np.empty_like(x)
        n = _iterations(nbytes)
        samples: dict[str, list[float]] = {name: [] for name in systems}
        for name, run in systems.items():  # warm-up, and a check of the result
            for _ in range(3):
                run(x, out)
            if not np.all(out == comm.size):
                raise SystemExit(f"{name} gave a wrong sum at {nbytes} bytes")
        for batch in range(batches):
            order = list(systems) if batch % 2 == 0 else list(reversed(systems))
            for name in order:
                comm.barrier()
                started = time.perf_counter()
                for _ in range(n):
                    systems[name](x, out)
                elapsed = np.array([(time.perf_counter() - started) / n])
                samples[name].append(float(comm.all_reduce(elapsed, op="max")[0]))
        results += [{"system": name, "bytes": x.nbytes, "seconds": s}
                    for name, s in samples.items()]
    if comm.rank == 0:
        print("RESULTS " + json.dumps(results))
    comm.close()


def run_job(backend: str, np_: int, sizes: str, batches: int) -> list[dict]:
    me = [sys.executable, __file__, "--worker", backend, "--sizes", sizes,
          "--batches", str(batches)]
    if backend == "mpi":
        argv = [str(BIN / "mpiexec"), "-n", str(np_), *me]
    else:
        argv = [str(BIN / "tbrun"), "-np", str(np_), "--backend", backend, "--no-tag-output", *me]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=1800,
                       env={**os.environ, "TBCOLL_ALGO": ""})
    lines = [line for line in p.stdout.splitlines() if line.startswith("RESULTS ")]
    if p.returncode or not lines:
        raise SystemExit(f"{backend} job failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return json.loads(lines[0][len("RESULTS "):])


def report(samples: list[dict]) -> str:
    by_key: dict[tuple[int, str], list[float]] = {}
    for row in samples:
        by_key.setdefault((row["bytes"], row["system"]), []).extend(row["seconds"])
    lines = ["| size | system | median time (us) | algbw (GB/s) | time / mpi4py |",
             "|---:|---|---:|---:|---:|"]
    for nbytes in sorted({b for b, _ in by_key}):
        reference = statistics.median(by_key.get((nbytes, "mpi4py Allreduce"), [float("nan")]))
        for (b, system), seconds in sorted(by_key.items()):
            if b != nbytes:
                continue
            median = statistics.median(seconds)
            lines.append(f"| {nbytes} | {system} | {median * 1e6:.1f} | "
                         f"{nbytes / median / 1e9:.3f} | {median / reference:.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-np", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batches", type=int, default=5, help="timed batches per job")
    parser.add_argument("--sizes", default=DEFAULT_SIZES, help="bytes, comma-separated")
    parser.add_argument("--backends", default="mpi,shm,tcp", help="comma-separated; mpi "
                        "includes the mpi4py reference")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, [int(s) for s in args.sizes.split(",")], args.batches)
        return
    samples = []
    backends = args.backends.split(",")
    for round_ in range(args.rounds):
        for backend in backends if round_ % 2 == 0 else reversed(backends):
            samples += run_job(backend, args.np, args.sizes, args.batches)
    print(f"# all_reduce float32 sum, np={args.np}, {args.rounds} rounds x {args.batches} "
          "batches per system")
    print(report(samples))


if __name__ == "__main__":
    main()
