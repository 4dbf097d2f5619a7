"""What failover's tail costs in steady state on tcp with the C lanes: the same checkout with
failover off (A: TBCOLL_FAILOVER=0) and on (B: TBCOLL_FAILOVER=1, no faults), in turns
(A B A B ...), 2 ranks a job, one host.

    python benchmarks/failover_tail.py [--rounds 7] [--sizes 8,16777216]

Each job is before_after.py's (per size, 7 batches of calls after a warm-up, the median
batch's time per `comm.all_reduce(x, out=out)` of float32, and per send/recv leg up to 1 MiB).
Prints, per cell, the medians over rounds and their ratio, the best of each side, and the
median of each turn's ratio (a turn's A and B run back to back: this machine's speed drifts,
a 2-core VM whose neighbours come and go, so only turns close together compare).
Not in `make test`; docs/failover.md keeps the figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

TBRUN = Path(sys.executable).parent / "tbrun"
JOB = Path(__file__).with_name("before_after.py")


def one_job(failover: str, sizes: str) -> dict[str, float]:
    """One job's cells (us per call), failover as TBCOLL_FAILOVER says."""
    done = subprocess.run(
        [str(TBRUN), "-np", "2", "--backend", "tcp", "--no-tag-output",
         "-x", f"TBCOLL_FAILOVER={failover}", sys.executable, str(JOB), "--job", sizes],
        capture_output=True, text=True, timeout=600)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    if not lines:
        sys.exit(f"TBCOLL_FAILOVER={failover} failed:\n{done.stdout[-2000:]}"
                 f"{done.stderr[-2000:]}")
    return json.loads(lines[0][7:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--sizes", default="8,16777216")
    args = parser.parse_args()
    cells: dict[str, dict[str, list[float]]] = {}
    for _ in range(args.rounds):
        for side, failover in (("A", "0"), ("B", "1")):
            for name, value in one_job(failover, args.sizes).items():
                cells.setdefault(name, {}).setdefault(side, []).append(value)
    for name, sides in sorted(cells.items()):
        a, b = statistics.median(sides["A"]), statistics.median(sides["B"])
        ratios = [y / x for x, y in zip(sides["A"], sides["B"], strict=True)]
        print(f"{name:20} off {a:10.2f} us  on {b:10.2f} us  on/off {b / a:5.3f}; best "
              f"{min(sides['A']):.2f} -> {min(sides['B']):.2f} us; median of the turns' "
              f"on/off {statistics.median(ratios):5.3f} "
              f"(each: {' '.join(f'{r:.2f}' for r in ratios)})")


if __name__ == "__main__":
    main()
