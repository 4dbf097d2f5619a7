"""From a rank's death to a working communicator of the survivors (issue 49), under
`tbrun --keep-going`, on one host.

    python benchmarks/survival.py [--rounds 5] [-np 4] [--backends shm,tcp]

Each round is a job per backend, in turns: the ranks all_reduce 8 B in a loop until the last
rank writes the time and SIGKILLs itself; every survivor times its RankFailedError (or
CommRevokedError) from that moment (detection: tbrun sees the death, declares it, the
survivors' waits end), then revoke, agree, shrink and a first all_reduce on the shrunk
communicator (recovery). Rank 0 prints both; the table gives medians over rounds (ms). The
cost of the failure checks to a healthy call is benchmarks/before_after.py's A/B (8 B).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TBRUN = Path(sys.executable).parent / "tbrun"


def job(stamp: str) -> None:
    import numpy as np

    import tbcoll

    comm = tbcoll.init()
    x = np.ones(1)
    for _ in range(200):
        comm.all_reduce(x)
    comm.barrier()
    if comm.rank == comm.size - 1:
        Path(stamp).write_text(repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        while True:
            comm.all_reduce(x)
    except (tbcoll.RankFailedError, tbcoll.CommRevokedError):
        detected = time.time()
    comm.revoke()
    comm.agree(True)
    shrunk = comm.shrink()
    shrunk.all_reduce(x)
    recovered = time.time()
    comm.close()
    if shrunk.rank == 0:
        died = float(Path(stamp).read_text())
        print("RESULT " + json.dumps({"detect": detected - died,
                                      "recover": recovered - detected}), flush=True)
    shrunk.close()


def run(backend: str, np: int, folder: str) -> dict[str, float]:
    stamp = os.path.join(folder, f"died-{backend}")
    p = subprocess.run([str(TBRUN), "--keep-going", "--backend", backend, "-np", str(np),
                        sys.executable, __file__, "--job", stamp],
                       capture_output=True, text=True, timeout=120)
    lines = [line for line in p.stdout.splitlines() if "RESULT " in line]
    if not lines:
        raise SystemExit(f"{backend}: no result (status {p.returncode}):\n{p.stdout}\n{p.stderr}")
    return json.loads(lines[0].split("RESULT ", 1)[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("-np", type=int, default=4)
    parser.add_argument("--backends", default="shm,tcp")
    parser.add_argument("--job", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.job:
        return job(args.job)
    backends = args.backends.split(",")
    results: dict[str, list[dict[str, float]]] = {b: [] for b in backends}
    with tempfile.TemporaryDirectory() as folder:
        for _ in range(args.rounds):
            for backend in backends:
                results[backend].append(run(backend, args.np, folder))
    print(f"np {args.np}, {args.rounds} rounds; medians (min-max), ms")
    print(f"{'backend':8} {'detect':>20} {'recover':>20}")
    for backend, rows in results.items():
        cells = []
        for key in ("detect", "recover"):
            values = [1000 * row[key] for row in rows]
            cells.append(f"{statistics.median(values):7.1f} ({min(values):.1f}-{max(values):.1f})")
        print(f"{backend:8} {cells[0]:>20} {cells[1]:>20}")


if __name__ == "__main__":
    main()
