"""Does a non-blocking collective overlap with computation? Compute alone, the collective
alone, and the two together (iall_reduce, compute, wait), under tbrun.

    python benchmarks/overlap.py -np 2 --backends shm,tcp,mpi --mbytes 8 --reps 5

Compute is numpy float32 matmuls (which release the GIL), sized to take about as long as the
collective; `overlap` = (compute + collective - together) / min(compute, collective): 1 is
perfect overlap, 0 none. Medians over --reps, the slowest rank's time each; a markdown table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

TBRUN = str(Path(sys.executable).with_name("tbrun"))


def worker(mbytes: float, reps: int) -> None:
    import tbcoll

    comm = tbcoll.init()
    data = np.ones(int(mbytes * 2**20) // 4, np.float32)
    a = np.random.default_rng(comm.rank).standard_normal((512, 512)).astype(np.float32)

    def collective() -> float:
        comm.barrier()
        started = time.perf_counter()
        comm.all_reduce(data)
        return time.perf_counter() - started

    def compute(matmuls: int) -> float:
        comm.barrier()
        started = time.perf_counter()
        for _ in range(matmuls):
            a @ a
        return time.perf_counter() - started

    def together(matmuls: int) -> float:
        comm.barrier()
        started = time.perf_counter()
        request = comm.iall_reduce(data)
        for _ in range(matmuls):
            a @ a
        request.wait()
        return time.perf_counter() - started

    def slowest(seconds: float) -> float:
        return float(comm.all_reduce(np.array([seconds]), op="max")[0])

    collective()  # warm up (and, for tbcoll's progress thread, start it)
    comm.iall_reduce(data).wait()
    one = statistics.median(slowest(compute(1)) for _ in range(3))
    t_comm = statistics.median(slowest(collective()) for _ in range(reps))
    matmuls = max(1, round(t_comm / one))
    t_comp = statistics.median(slowest(compute(matmuls)) for _ in range(reps))
    t_both = statistics.median(slowest(together(matmuls)) for _ in range(reps))
    if comm.rank == 0:
        print("RESULT " + json.dumps({"comm": t_comm, "compute": t_comp, "both": t_both}))
    comm.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-np", type=int, default=2)
    parser.add_argument("--backends", default="shm,tcp,mpi")
    parser.add_argument("--mbytes", type=float, default=8)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.mbytes, args.reps)
        return
    print(f"| backend (np {args.np}, {args.mbytes:g} MB all_reduce) | collective ms | "
          "compute ms | together ms | overlap |")
    print("|---|---|---|---|---|")
    for backend in args.backends.split(","):
        done = subprocess.run([TBRUN, "-np", str(args.np), "--backend", backend,
                               "--no-tag-output", sys.executable, __file__, "--worker",
                               "--mbytes", str(args.mbytes), "--reps", str(args.reps)],
                              capture_output=True, text=True, timeout=600)
        lines = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
        if done.returncode or not lines:
            sys.exit(f"{backend} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
        r = json.loads(lines[0][len("RESULT "):])
        overlap = (r["comm"] + r["compute"] - r["both"]) / min(r["comm"], r["compute"])
        print(f"| {backend} | {1e3 * r['comm']:.2f} | {1e3 * r['compute']:.2f} | "
              f"{1e3 * r['both']:.2f} | {overlap:.2f} |")


if __name__ == "__main__":
    main()
