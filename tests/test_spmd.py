"""Run the SPMD suite of tests/spmd inside real jobs: under tbrun (tcp) and mpiexec (mpi)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO, TBRUN

SPMD = str(REPO / "tests" / "spmd")
MPIEXEC = str(Path(sys.executable).with_name("mpiexec"))
PYTEST = ["-m", "pytest", "-q", "-p", "no:cacheprovider", SPMD]


def run_job(argv, np):
    env = {**os.environ, "TBCOLL_TIMEOUT": "60"}
    p = subprocess.run(argv, capture_output=True, text=True, timeout=280, env=env)
    summaries = re.findall(r"(\d+) passed", p.stdout)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    assert "failed" not in p.stdout and "error" not in p.stdout.lower()
    assert len(summaries) == np and all(int(n) > 100 for n in summaries), p.stdout[-2000:]


@pytest.mark.parametrize("np_", [1, 2, 3, 4])
def test_under_tbrun(np_):
    run_job([TBRUN, "-np", str(np_), "--timeout", "270", *PYTEST, "-p", "no:pytest_mpi"], np_)


@pytest.mark.skipif(not Path(MPIEXEC).exists(), reason="mpiexec not installed (tbcoll[mpi])")
@pytest.mark.parametrize("np_", [1, 2, 3, 4])
def test_under_mpiexec(np_):
    run_job([MPIEXEC, "-n", str(np_), sys.executable, *PYTEST, "--with-mpi"], np_)
