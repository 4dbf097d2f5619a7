"""This checkout's calls against another checkout's, in turns (A B A B ...), 2 ranks a job.

    python benchmarks/before_after.py --before /path/to/checkout [--rounds 7]
        [--backends shm,tcp] [--sizes 8,1048576,16777216]

A is the other checkout (its extensions built in place: `python setup.py build_ext
--inplace` there), B this one. Each job is `tbrun -np 2 --backend X` of this file with --job:
per size, 7 batches of calls timed after a warm-up, the median batch's time per call of
`comm.all_reduce(x, out=out)` (float32) and of one send/recv leg (sizes up to 1 MiB). A's ranks
get its directory first on PYTHONPATH; tbrun itself is this checkout's. Prints, per cell, the
medians over rounds and B/A. This machine's speed drifts between runs (a 2-core VM whose
neighbours come and go): only turns taken close together compare.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

TBRUN = Path(sys.executable).parent / "tbrun"


def job(sizes: list[int]) -> None:
    """One side's measurements, printed by rank 0 as a JSON line."""
    import tbcoll

    comm = tbcoll.init()
    out = {}
    for nbytes in sizes:
        out.update(_cells(comm, nbytes))
    if comm.rank == 0:
        print("RESULT " + json.dumps(out), flush=True)


def _cells(comm: object, nbytes: int) -> dict[str, float]:
    """us per all_reduce of nbytes, and per send/recv leg of nbytes up to 1 MiB."""
    import numpy as np

    x = np.ones(max(1, nbytes // 4), np.float32)
    y = np.empty_like(x)
    iters = max(20, min(30000, 3 * 10**7 // max(nbytes, 1)))

    def leg() -> None:
        if comm.rank == 0:
            comm.send(x, 1)
            comm.recv(y, 1)
        else:
            comm.recv(y, 0)
            comm.send(x, 0)

    cells = {f"all_reduce {nbytes}": _timed(comm, iters, lambda: comm.all_reduce(x, out=y))}
    if nbytes <= 1 << 20:
        cells[f"sendrecv {nbytes}"] = _timed(comm, iters, leg) / 2
    return cells


def _timed(comm: object, iters: int, call: object) -> float:
    """The median of 7 batches of iters calls, in us per call, after a warm-up."""
    for _ in range(min(iters, 2000)):
        call()
    times = []
    for _ in range(7):
        comm.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            call()
        times.append((time.perf_counter() - start) / iters * 1e6)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, type=Path)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--backends", default="shm,tcp")
    parser.add_argument("--sizes", default="8,1048576,16777216")
    args = parser.parse_args()
    cells: dict[tuple[str, str], dict[str, list[float]]] = {}
    for _ in range(args.rounds):
        for side in ("A", "B"):
            for backend in args.backends.split(","):
                before = ["env", f"PYTHONPATH={args.before.resolve()}"] if side == "A" else []
                done = subprocess.run(
                    [str(TBRUN), "-np", "2", "--backend", backend, "--no-tag-output", *before,
                     sys.executable, __file__, "--job", args.sizes],
                    capture_output=True, text=True, timeout=600)
                lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
                if not lines:
                    sys.exit(f"{side} {backend} failed:\n{done.stdout[-2000:]}"
                             f"{done.stderr[-2000:]}")
                for name, value in json.loads(lines[0][7:]).items():
                    cells.setdefault((backend, name), {}).setdefault(side, []).append(value)
    for (backend, name), sides in sorted(cells.items()):
        a, b = statistics.median(sides["A"]), statistics.median(sides["B"])
        print(f"{backend:4} {name:20} A {a:10.2f} us  B {b:10.2f} us  B/A {b / a:5.2f}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--job"]:
        job([int(size) for size in sys.argv[2].split(",")])
    else:
        main()
