"""The fault campaign and the soak (benchmarks/faults.py, benchmarks/soak.py), run small:
the full runs and their table are in benchmarks/RELIABILITY.md."""

import subprocess
import sys

from ..conftest import REPO, tbrun


def test_fault_campaign_rows():
    p = subprocess.run([sys.executable, str(REPO / "benchmarks" / "faults.py"), "--backends",
                        "shm", "--np", "2", "--faults", "kill,tbrun"], capture_output=True,
                       text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stderr
    rows = [line.strip("|").split("|") for line in p.stdout.splitlines()[2:]]
    assert [[c.strip() for c in row[:3]] for row in rows] == [["shm", "2", "kill"],
                                                               ["shm", "2", "tbrun"]]
    kill, killed_tbrun = rows
    assert kill[4].strip() == "137" and kill[5].strip() == "rank 1"
    for row in rows:  # nothing left behind
        assert row[6].strip() == "0" and row[7].strip() == "0", row


def test_soak_checks_every_result():
    p = tbrun("-np", 3, REPO / "benchmarks" / "soak.py", "--calls", 400, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "[0] OK" in p.stdout and "wrong 0" in p.stdout
