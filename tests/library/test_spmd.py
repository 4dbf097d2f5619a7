"""Run the SPMD suite of tests/spmd inside real jobs: under tbrun (shm, tcp and mlx) and
under mpiexec (mpi). Each job runs the whole suite (~450 tests a rank, 10-40 s on 2 cores), so
the sizes are chosen: shm, the default on one host, at 1 to 4 ranks (one, a pair, uneven,
a power of two past the cores); tcp at 2 and 3; mlx at 1 and 2 (its ring backend takes
milliseconds a call past the cores); mpi at 1 and 3. The algorithms are written once over
each transport's messages, so their sizes are shm's; what each transport adds is its own
set-up and the moves under them."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ..conftest import MACOS_LANE, REPO, TBRUN

SPMD = str(REPO / "tests" / "spmd")
MPIEXEC = str(Path(sys.executable).with_name("mpiexec"))
PYTEST = ["-m", "pytest", "-q", "-p", "no:cacheprovider"]


def run_job(argv, np, **env_extra):
    env = {**os.environ, "TBCOLL_TIMEOUT": "60", **env_extra}
    p = subprocess.run(argv, capture_output=True, text=True, timeout=280, env=env)
    summaries = re.findall(r"(\d+) passed", p.stdout)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    assert "failed" not in p.stdout and "error" not in p.stdout.lower()
    # rank 0 reports for every rank (tbcoll.testing): the outcomes were exchanged
    assert len(summaries) == 1 and int(summaries[0]) > 40, p.stdout[-2000:]


def tbrun_pytest(np_, backend, *pytest_args, tests=(SPMD,)):
    return [TBRUN, "-np", str(np_), "--backend", backend, "--timeout", "270", *PYTEST, *tests,
            *pytest_args]


@pytest.mark.parametrize("backend, np_", [("shm", 1), ("shm", 2), ("shm", 3), ("shm", 4),
                                          ("tcp", 2), ("tcp", 3)])
def test_under_tbrun(np_, backend):
    run_job(tbrun_pytest(np_, backend), np_)


def test_under_tbrun_on_two_levels():
    """A job over "hosts" that are this machine (loopback addresses, reached by a stand-in
    for ssh), one of them with two ranks: the two-level group (tbcoll.hierarchy), its hosts
    uneven and their ranks not consecutive (--map-by node: host 0 runs ranks 0 and 2)."""
    ssh = str(REPO / "tests" / "harness" / "ssh_here")
    run_job([TBRUN, "--ssh", ssh, "-H", "127.0.0.2:2,127.0.0.3:1", "--map-by", "node",
             "--timeout", "270", *PYTEST, SPMD], 3)


@pytest.mark.parametrize("backend, np_", [("auto", 2), ("tcp", 3)])
def test_under_tbrun_without_c(np_, backend):
    """What a build without a compiler runs (TBCOLL_NO_C=1): each protocol's whole Python path
    (on one host auto takes tcp: shm's rounds are C's), the suite green on it."""
    run_job(tbrun_pytest(np_, backend), np_, TBCOLL_NO_C="1")


@pytest.mark.parametrize("np_", [1, 2])
def test_under_tbrun_with_mlx(np_):
    pytest.importorskip("mlx.core")
    run_job(tbrun_pytest(np_, "mlx"), np_)


@pytest.mark.skipif(not Path(MPIEXEC).exists(), reason="mpiexec not installed (tbcoll[mpi])")
@pytest.mark.parametrize("np_", [1, 3])
def test_under_mpiexec(np_):
    run_job([MPIEXEC, "-n", str(np_), sys.executable, *PYTEST, SPMD], np_)


# The macOS lane's share (Makefile's MACOS_LANE): the collectives and unaligned buffers of
# tests/spmd, without the thousand back-to-back calls, on shm at 3 ranks (its rounds and its
# two-copy path for large messages, as a Mac has no process_vm_readv) and tcp at 2: ~50 s
# here under the lane, against ~40 s each for the whole of tests/spmd at 3 ranks.
LANE_SUBSET = (f"{SPMD}/test_descriptors.py", f"{SPMD}/test_collectives.py",
               f"{SPMD}/test_unaligned.py")


@pytest.mark.skipif(not MACOS_LANE, reason="the macOS lane's subset (test_under_tbrun runs all)")
@pytest.mark.parametrize("backend, np_", [("shm", 3), ("tcp", 2)])
def test_collectives_under_the_macos_lane(backend, np_):
    run_job(tbrun_pytest(np_, backend, "-k", "not thousands_back_to_back", tests=LANE_SUBSET),
            np_)
