"""tbrun's start-up against mpirun's: the wall time of `-np 4` of an empty script, in turns.

    python benchmarks/startup.py [runs] [ranks]

Both launchers come from this Python's environment (MPICH's Hydra from the mpich wheel); the
script does nothing, so the time is the launcher's, the interpreters' and the teardown's.
Set PYTHONDONTWRITEBYTECODE only if you want every start to compile its modules.
"""

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent


def wall(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main(runs: int, ranks: int) -> None:
    with tempfile.TemporaryDirectory() as folder:
        empty = Path(folder, "empty.py")
        empty.write_text("")
        systems = {"tbrun": [str(BIN / "tbrun"), "-np", str(ranks), str(empty)],
                   "mpirun": [str(BIN / "mpirun"), "-n", str(ranks), sys.executable,
                              str(empty)]}
        times: dict[str, list[float]] = {name: [] for name in systems}
        for argv in systems.values():  # warm the caches once
            wall(argv)
        for _ in range(runs):
            for name, argv in systems.items():
                times[name].append(wall(argv))
    medians = {name: statistics.median(t) * 1e3 for name, t in times.items()}
    for name, ms in medians.items():
        print(f"{name}: median {ms:.0f} ms over {runs} runs")
    print(f"tbrun / mpirun: {medians['tbrun'] / medians['mpirun']:.2f}x")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 15, int(sys.argv[2]) if len(sys.argv) > 2
         else 4)
