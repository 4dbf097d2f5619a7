"""tbrun's start-up against mpirun's: the wall time of `-np 4` of an empty script, in turns, and
the CPU time of each launcher's whole process tree.

    python benchmarks/startup.py [runs] [ranks] [TBRUN...]

TBRUN: the tbrun commands to time (default: this Python's), e.g. a plain install's and an
editable one's, or two commits' (before and after a change), all in the same turns. mpirun is
MPICH's Hydra beside this Python (the mpich wheel), else the one on PATH; its ranks run this
Python, so run the script with the Python of the install you measure. The script does
nothing, so the time is the launcher's, the interpreters' and the teardown's. Set
PYTHONDONTWRITEBYTECODE only if you want every start to compile its modules.
"""

import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent


def run(argv: list[str]) -> tuple[float, float]:
    """The wall time of argv, and the CPU time of its whole process tree (every process in
    it is waited for by its parent, so its time adds up to ours), less sensitive to what else
    runs on the machine."""
    cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime + after.ru_stime - cpu.ru_utime - cpu.ru_stime


def main(runs: int, ranks: int, tbruns: list[str]) -> None:
    mpirun = shutil.which("mpirun", path=str(BIN)) or shutil.which("mpirun")
    if mpirun is None:
        sys.exit("no mpirun beside this Python nor on PATH: pip install mpich")
    with tempfile.TemporaryDirectory() as folder:
        empty = Path(folder, "empty.py")
        empty.write_text("")
        systems = {tbrun: [tbrun, "-np", str(ranks), str(empty)] for tbrun in tbruns}
        systems["mpirun"] = [mpirun, "-n", str(ranks), sys.executable, str(empty)]
        times: dict[str, list[tuple[float, float]]] = {name: [] for name in systems}
        for argv in systems.values():  # warm the caches once
            run(argv)
        for _ in range(runs):
            for name, argv in systems.items():
                times[name].append(run(argv))
    mpi = [statistics.median(t) for t in zip(*times["mpirun"], strict=True)]
    for name, pairs in times.items():
        wall, cpu = zip(*pairs, strict=True)
        low, _, high = statistics.quantiles(wall, n=4)
        print(f"{name}: wall median {statistics.median(wall) * 1e3:.0f} ms (quartiles "
              f"{low * 1e3:.0f}-{high * 1e3:.0f}), {statistics.median(wall) / mpi[0]:.2f}x "
              f"mpirun; CPU {statistics.median(cpu) * 1e3:.0f} ms, "
              f"{statistics.median(cpu) / mpi[1]:.2f}x; {runs} runs")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 15, int(sys.argv[2]) if len(sys.argv) > 2
         else 4, sys.argv[3:] or [str(BIN / "tbrun")])
