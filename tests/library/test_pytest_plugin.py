"""tbcoll.testing, the pytest plugin for users' SPMD tests, run as users run it: pytest inside
every rank of a tbrun (or mpiexec) job, on a test file of a user's."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ..conftest import tbrun

MPIEXEC = str(Path(sys.executable).with_name("mpiexec"))

USER_TESTS = """
import numpy as np
import pytest


@pytest.mark.spmd(min_size=2)
def test_sum_and_shared_directory(comm, shared_tmp_path):
    assert (comm.all_reduce(np.ones(3)) == comm.size).all()
    if comm.rank == 0:
        (shared_tmp_path / "from-rank-0").write_text(str(shared_tmp_path))
    comm.barrier()
    assert (shared_tmp_path / "from-rank-0").read_text() == str(shared_tmp_path)


@pytest.mark.spmd(min_size=4)
def test_needs_four(comm):
    assert comm.size >= 4


def test_fails_on_rank_1_only(comm):
    assert comm.rank != 1, "rank 1 disagrees"
    comm.all_reduce(np.ones(2))  # rank 1 left the sequence: TBCOLL_CHECK names it


def test_the_ranks_are_in_step_again(comm):
    assert comm.all_reduce(np.full(2, comm.rank)).tolist() == [comm.size * (comm.size - 1) / 2] * 2
"""

PYTEST_MPI_TESTS = """
import pytest


@pytest.mark.mpi(min_size=2)
def test_needs_an_mpi_world():
    from mpi4py import MPI
    assert MPI.COMM_WORLD.Get_size() >= 2
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "test_user.py"
    path.write_text(textwrap.dedent(text))
    return path


def _pytest(*args: str) -> list[str]:
    return [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args]


@pytest.mark.parametrize("backend", ["shm", "tcp"])
def test_one_report_that_every_rank_agrees_on(tmp_path, backend):
    tests = _write(tmp_path, USER_TESTS)
    done = tbrun("-np", "2", "--backend", backend, *_pytest("-rfs", str(tests)), timeout=120,
                 cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    summaries = re.findall(r"\] (.*) in [\d.]+s", done.stdout)
    assert summaries == ["1 failed, 2 passed, 1 skipped"], done.stdout
    assert "test_fails_on_rank_1_only - on rank 1: AssertionError" in done.stdout
    # rank 0's own failure: its collective met rank 1's exchange of outcomes
    assert "on rank 0: ValueError: TBCOLL_CHECK" in done.stdout
    assert "needs at least 4 ranks, the world has 2" in done.stdout
    assert set(re.findall(r"^\[(\d+)\]", done.stdout, re.MULTILINE)) == {"0"}  # rank 0 speaks
    assert "exited with status 1" in done.stderr


def test_all_ranks_report_when_asked(tmp_path):
    tests = _write(tmp_path, USER_TESTS)
    done = tbrun("-np", "3", *_pytest("--all-ranks", str(tests)), timeout=120, cwd=tmp_path)
    ranks = re.findall(r"\[(\d)\] 1 failed, 2 passed, 1 skipped", done.stdout)
    assert sorted(ranks) == ["0", "1", "2"], done.stdout  # none cut short by the teardown


@pytest.mark.skipif(not Path(MPIEXEC).exists(), reason="mpiexec not installed (tbcoll[mpi])")
def test_same_plugin_under_mpiexec(tmp_path):
    tests = _write(tmp_path, USER_TESTS)
    done = subprocess.run([MPIEXEC, "-n", "2", *_pytest(str(tests))], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)
    assert done.returncode != 0
    assert re.findall(r"(\d+ failed, \d+ passed, \d+ skipped)", done.stdout) == [
        "1 failed, 2 passed, 1 skipped"], done.stdout


def test_pytest_mpi_markers_under_a_tbcoll_backend_stop_the_run(tmp_path):
    tests = _write(tmp_path, PYTEST_MPI_TESTS)
    done = tbrun("-np", "2", "--backend", "shm", *_pytest("--with-mpi", str(tests)),
                 timeout=120, cwd=tmp_path)
    assert done.returncode == 4, done.stdout + done.stderr  # pytest's usage error
    assert "passed" not in done.stdout and "skipped" not in done.stdout
    assert "tbrun --backend mpi" in done.stdout + done.stderr


def test_pytest_mpi_markers_under_backend_mpi_keep_working(tmp_path):
    pytest.importorskip("mpi4py")
    tests = _write(tmp_path, PYTEST_MPI_TESTS)
    done = tbrun("-np", "2", "--backend", "mpi", *_pytest("--with-mpi", str(tests)),
                 timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout


def test_a_rank_that_cannot_collect_still_says_why(tmp_path):
    tests = _write(tmp_path, """
        import os
        if os.environ["TBCOLL_RANK"] == "1":
            raise ImportError("only on rank 1")

        def test_meets(comm):
            comm.barrier()
    """)
    done = tbrun("-np", "2", "--comm-timeout", "20", *_pytest(str(tests)), timeout=120,
                 cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "rank 1 could not collect" in done.stderr and "only on rank 1" in done.stderr
