"""The job's status is the status of the rank that failed first for its own reason, on every
backend, and tbrun's message names that rank: never a rank that only lost its peer."""

import re

import pytest

from ..conftest import LINUX_RULES, hydra_topology_files, left_behind, mpich_segments, tbrun

# Rank 1 fails; the others are in a collective with it and fail on losing it, racing its exit.
ONE_FAILS = """
import sys, time
import numpy as np
import tbcoll

comm = tbcoll.init()
comm.all_reduce(np.ones(4))
if comm.rank == 1:
    sys.exit(3)
comm.all_reduce(np.ones(4))
time.sleep(30)
"""


@pytest.mark.parametrize("backend", ["tcp", "mlx", "shm"])
def test_the_rank_that_failed_first_decides(script, backend):
    path = script(ONE_FAILS)
    for _ in range(3):  # the race went either way from run to run
        p = tbrun("-np", 3, "--backend", backend, path, timeout=60)
        assert p.returncode == 3, p.stderr
        assert re.search(r"tbrun: rank 1 \(pid \d+\) exited with status 3", p.stderr), p.stderr


def test_a_follower_is_named_as_one(script):
    """A rank that lost its peer says so, and the job waits for the rank that failed first."""
    path = script(ONE_FAILS.replace("sys.exit(3)", "import time; time.sleep(0.3); sys.exit(3)"))
    p = tbrun("-np", 2, "--backend", "tcp", path, timeout=60)
    assert p.returncode == 3, p.stderr
    assert "rank 1" in p.stderr and "exited with status 3" in p.stderr


@pytest.mark.parametrize("how, status, words", [
    ("sys.exit(3)", 3, "exited with status 3"),
    ("os.kill(os.getpid(), signal.SIGKILL)", 137, "was killed by signal 9 (SIGKILL)"),
    ("raise ValueError('boom')", 1, "exited with status 1"),
])
def test_mpi_names_the_failed_rank_and_uses_tbruns_statuses(script, how, status, words):
    pytest.importorskip("mpi4py")
    path = script(f"""
        import os, signal, sys, time
        from mpi4py import MPI
        MPI.COMM_WORLD.Barrier()
        if MPI.COMM_WORLD.rank == 2:
            {how}
        time.sleep(30)
    """)
    before, topologies = mpich_segments(), hydra_topology_files()
    p = tbrun("--backend", "mpi", "-np", 3, path, timeout=60)
    assert p.returncode == status, p.stdout + p.stderr
    assert not left_behind(mpich_segments() - before)  # what the killed ranks left, tbrun removed
    left = left_behind(hydra_topology_files() - topologies)  # Hydra's proxy skips it after an abort
    if LINUX_RULES:
        assert not left  # the aborting rank removed it, found through /proc/PID/fd
    else:  # no /proc to find it by, as on a Mac (docs/transports.md, On a Mac): the test removes it
        for path in left:
            path.unlink(missing_ok=True)
    if status == 137:  # Hydra ends the others with SIGKILL too: it may not be told apart
        assert re.search(r"tbrun: (rank 2 was|ranks [\d, ]*2 were) killed by signal 9", p.stderr)
    else:
        assert f"tbrun: rank 2 {words}" in p.stderr
    assert "Exit codes" not in p.stdout + p.stderr  # read by tbrun, not shown


def test_a_python_without_tbcoll_is_named(script, tmp_path):
    bare = tmp_path / "python"  # an interpreter that cannot import tbcoll
    bare.write_text("#!/bin/sh\nexec /usr/bin/env -u PYTHONPATH python3 -I \"$@\"\n")
    bare.chmod(0o755)
    path = script("import tbcoll\n")
    p = tbrun("-np", 2, str(bare), path)
    assert p.returncode == 1
    assert f"{bare} cannot import tbcoll" in p.stderr
    assert "tbrun ... script.py" in p.stderr


@pytest.mark.parametrize("backend", ["shm", "tcp"])
def test_a_frozen_rank_is_named_not_the_ranks_that_waited_for_it(script, backend):
    path = script("""
        import os, signal
        import numpy as np
        import tbcoll

        comm = tbcoll.init()
        comm.all_reduce(np.ones(4))
        if comm.rank == 2:
            os.kill(os.getpid(), signal.SIGSTOP)  # a suspended Mac, a stuck process
        comm.all_reduce(np.ones(4))
    """)
    p = tbrun("-np", 3, "--backend", backend, "--comm-timeout", 2, "--grace", 0.5, path,
              timeout=60)
    assert p.returncode == 1, p.stderr
    assert re.search(r"tbrun: rank 2 did not answer: \d ranks? failed waiting for it or on "
                     r"losing it; it still runs", p.stderr), p.stderr
    assert "failing because of rank" in p.stderr  # the first to time out says so
    assert "did not answer" not in p.stderr.replace("rank 2 did not answer", "")
