"""Fault campaign: how a tbrun job ends when a rank dies, freezes, or tbrun itself is killed.

    python benchmarks/faults.py --backends shm,tcp,mpi,mlx --np 2,4 --faults kill,stop,tbrun

Each trial runs ranks that all_reduce in a loop. The last rank then kills itself (kill:
SIGKILL), stops itself (stop: SIGSTOP, a frozen or suspended machine), or the harness
SIGKILLs tbrun (tbrun). A row gives the seconds from the fault to the end of tbrun, its
status, the rank tbrun's messages name first, and the processes and files left 3 s later
(the ranks and their children; the job's temporary files and shared memory, not the dumps it
keeps on purpose; counted at once when all are gone). --comm-timeout is 3 s, so a frozen rank
is found by the others' timeout. A markdown table goes to stdout.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tbcoll.launch.shmclean import mapped

TBRUN = str(Path(sys.executable).with_name("tbrun"))
SHM = Path("/dev/shm")
JOB = """
import os, signal, sys, time
import numpy as np
import tbcoll
folder, fault = sys.argv[1], sys.argv[2]
comm = tbcoll.init()
child = __import__("subprocess").Popen([sys.executable, "-c", "import time; time.sleep(120)"])
open(os.path.join(folder, f"{comm.rank}.pids"), "w").write(f"{os.getpid()} {child.pid}")
for i in range(10**9):
    comm.all_reduce(np.ones(4))
    if i == 50:
        open(os.path.join(folder, f"{comm.rank}.ready"), "w").close()
    if i == 100 and comm.rank == comm.size - 1 and fault in ("kill", "stop"):
        open(os.path.join(folder, "fault"), "w").write(repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
    time.sleep(0.002)
"""
# what tbrun blames, most telling first: a silent rank, a broken link, a rank that failed
# (not one that failed because of another)
BLAMES = (re.compile(r"tbrun: (rank \d+(?: on \S+)?) did not answer"),
          re.compile(r"tbrun: (ranks [\d, ]+) were killed"),
          re.compile(r"tbrun: the link between (rank .+?) failed"),
          re.compile(r"^tbrun: (rank \d+)(?: on \S+)? \(pid \d+\) (?!.*failing because)",
                     re.MULTILINE),
          re.compile(r"^tbrun: (rank \d+) (?:exited|was killed)", re.MULTILINE))


def blamed(err: str) -> str:
    for pattern in BLAMES:
        if found := pattern.search(err):
            return found.group(1)
    return "-"


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def shared_memory() -> set[str]:
    return {p.name for p in SHM.iterdir()} if SHM.is_dir() else set()


SETTLE = 3.0  # seconds what a job leaves gets to go before it is counted


def held(paths: set[str]) -> set[str]:
    """Those of paths that some process maps or holds open."""
    found = mapped(paths)
    for fds in Path("/proc").glob("[0-9]*/fd"):
        try:
            found.update(paths & {os.readlink(link) for link in fds.iterdir()})
        except OSError:
            continue  # the process ended, or is not ours to read
    return found


def leftovers(folder: Path, temp: Path, before: set[str]) -> tuple[list[int], int]:
    """The ranks' and their children's pids still alive, and how many of the job's temporary
    files and shared-memory names are left (not the dumps it keeps on purpose). A new name that
    a live process maps or holds is another job's (`make test` runs two halves side by side):
    the trial's ranks are gone by then."""
    pids = [int(p) for f in folder.glob("*.pids") for p in f.read_text().split()]
    # the dumps a failed job leaves on purpose, their folder printed (tbcoll.launch.postmortem)
    kept = [f for f in temp.iterdir() if not f.name.startswith("tbrun-dump-")]
    new = {str(SHM / name) for name in shared_memory() - before}
    return [p for p in pids if alive(p)], len(kept) + len(new - held(new))


def trial(backend: str, np_: int, fault: str) -> dict:
    with tempfile.TemporaryDirectory() as work:
        folder, temp = Path(work, "pids"), Path(work, "tmp")
        folder.mkdir()
        temp.mkdir()
        script = Path(work, "job.py")
        script.write_text(JOB)
        before = shared_memory()
        proc = subprocess.Popen(
            [TBRUN, "-np", str(np_), "--backend", backend, "--comm-timeout", "3", "--grace", "1",
             str(script), str(folder), fault], stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "TMPDIR": str(temp)})
        deadline = time.monotonic() + 60
        while len(list(folder.glob("*.ready"))) < np_ and time.monotonic() < deadline:
            time.sleep(0.02)
        if fault == "tbrun":
            started = time.time()
            proc.kill()
        else:
            while not (folder / "fault").exists() and time.monotonic() < deadline:
                time.sleep(0.01)
            started = float((folder / "fault").read_text() or time.time())
        try:
            _, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        ended = time.time()
        settled = time.monotonic() + SETTLE
        left, files = leftovers(folder, temp, before)
        while (left or files) and time.monotonic() < settled:  # no fixed wait when all went
            time.sleep(0.05)
            left, files = leftovers(folder, temp, before)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        named = blamed(err or "")
        return {"backend": backend, "np": np_, "fault": fault, "seconds": ended - started,
                "status": proc.returncode, "named": named, "procs": len(left), "files": files}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default="shm,tcp,mpi,mlx", help="(default: %(default)s)")
    parser.add_argument("--np", default="2,4", help="rank counts (default: %(default)s)")
    parser.add_argument("--faults", default="kill,stop,tbrun",
                        help="kill, stop and/or tbrun (default: %(default)s)")
    args = parser.parse_args()
    print("| backend | np | fault | end after (s) | status | named | procs left | files left |")
    print("|---|---:|---|---:|---:|---|---:|---:|", flush=True)
    for backend in args.backends.split(","):
        for np_ in map(int, args.np.split(",")):
            for fault in args.faults.split(","):
                r = trial(backend, np_, fault)
                print(f"| {r['backend']} | {r['np']} | {r['fault']} | {r['seconds']:.1f} | "
                      f"{r['status']} | {r['named']} | {r['procs']} | {r['files']} |",
                      flush=True)


if __name__ == "__main__":
    main()
