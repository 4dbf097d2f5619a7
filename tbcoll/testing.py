"""pytest plugin for SPMD tests: every rank of a job runs the same tests in step.

    tbrun -np 4 python -m pytest tests/            # or: mpiexec -n 4 python -m pytest tests/

    import numpy as np, pytest

    @pytest.mark.spmd(min_size=2)
    def test_sum(comm, shared_tmp_path):
        total = comm.all_reduce(np.ones(3))
        assert (total == comm.size).all()
        if comm.rank == 0:
            (shared_tmp_path / "seen").write_text(str(comm.size))
        comm.barrier()
        assert (shared_tmp_path / "seen").read_text() == str(comm.size)

Installed with tbcoll (a pytest11 entry point); what it offers:
- `comm`: the world (tbcoll.init()), opened once per session, with TBCOLL_CHECK on unless the
  environment says otherwise, so that a rank that left the sequence of collectives (an assert
  failed on it while the others went on) ends the others' collective with an error naming it;
- `@pytest.mark.spmd(min_size=N, max_size=M)`: the world sizes a test needs; outside them it is
  skipped on every rank, saying how to run it;
- `shared_tmp_path`: a directory per test, the same path on every rank (rank 0 makes it; on
  several hosts it is shared only where the file system is);
- one outcome per test: after each test the ranks exchange their results, so a test that failed
  on one rank fails on all, with that rank's error, and every rank's summary and exit status
  agree; only rank 0 prints (`--all-ranks`: every rank);
- under tbrun with a backend other than mpi, pytest-mpi's `mpi` markers cannot be served (their
  tests talk to mpi4py's world, a world of one there): the run stops with what to do instead of
  skipping them all to a green.
Without a launcher (plain pytest) the world is one rank.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from tbcoll.core.errors import CommError
from tbcoll.job.env import (
    launch_info,
    launcher_world_size,
    started_by_mpiexec,
    torchrun_names_from_mpi,
)

_REPORT_BYTES = 4096  # what a rank's failure message may take in the exchange
_FAILED = 1  # the first byte of a rank's row in the exchange
_world = None  # the session's communicator, once a test asked for it
_silenced = False  # this rank's terminal report was removed (not rank 0)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("tbcoll", "tbcoll SPMD tests (tbcoll.testing)")
    group.addoption("--all-ranks", action="store_true",
                    help="Under tbrun or mpiexec, every rank prints its report (default: rank 0).")


def _launched_size() -> int:
    """The size of the job this process is a rank of (1 when run on its own)."""
    info = launch_info()
    if info is not None:
        return info.size
    if started_by_mpiexec():
        return max(1, launcher_world_size())
    return 1


def _rank() -> int:
    info = launch_info()
    if info is not None:
        return info.rank
    return int(torchrun_names_from_mpi(os.environ).get("RANK", 0))


def _no_mpi_world(what: str) -> pytest.UsageError | None:
    """The error for pytest-mpi's tests in a tbrun job whose ranks are no MPI ranks."""
    info = launch_info()
    if info is None or info.size == 1 or info.backend == "mpi":
        return None
    return pytest.UsageError(
        f"{what}: pytest-mpi's tests use mpi4py's world, a world of one under tbrun --backend "
        f"{info.backend}: run them with `tbrun --backend mpi ... python -m pytest --with-mpi`, "
        "or mark them @pytest.mark.spmd and use tbcoll.testing's comm fixture")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    # before pytest-mpi starts MPI in each rank (a singleton MPI that the job's teardown
    # could kill with its shared memory left behind)
    if config.getoption("with_mpi", default=False) and (error := _no_mpi_world("--with-mpi")):
        raise error
    config.addinivalue_line(
        "markers", "spmd(min_size=1, max_size=None): an SPMD test, run by every rank of a job "
        "(tbrun -np N python -m pytest); skipped on every rank outside those world sizes")
    if _launched_size() > 1:
        os.environ.setdefault("TBCOLL_CHECK", "1")


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    global _silenced
    config = session.config
    if _launched_size() > 1 and _rank() != 0 and not config.getoption("all_ranks"):
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:  # rank 0 speaks for all: the outcomes agree
            config.pluginmanager.unregister(reporter)
            _silenced = True


def pytest_collectreport(report: pytest.CollectReport) -> None:
    """A rank that prints nothing still says why it could not collect a module (its outcome
    is not exchanged: the others would only see it leave)."""
    if report.failed and _silenced:
        sys.stderr.write(f"tbcoll.testing: rank {_rank()} could not collect {report.nodeid}:\n"
                         f"{report.longreprtext}\n")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    marked = [item.nodeid for item in items if item.get_closest_marker("mpi")]
    if marked and (error := _no_mpi_world(f"{len(marked)} tests are marked for pytest-mpi "
                                          f"(e.g. {marked[0]})")):
        raise error
    size = _launched_size()
    for item in items:
        marker = item.get_closest_marker("spmd")
        if marker is None:
            continue
        low = marker.kwargs.get("min_size", 1)
        high = marker.kwargs.get("max_size")
        if size < low or (high is not None and size > high):
            needs = f"{low}..{high}" if high is not None else f"at least {low}"
            item.add_marker(pytest.mark.skip(
                reason=f"needs {needs} ranks, the world has {size}: run "
                       f"`tbrun -np {low} python -m pytest`"))


@pytest.fixture(scope="session")
def comm():
    """The world communicator, opened once per session (tbcoll.init())."""
    global _world
    import tbcoll

    if _world is None:
        _world = tbcoll.init()
    yield _world


def pytest_unconfigure(config: pytest.Config) -> None:
    """After every report is printed: the ranks leave together. The first rank to exit with
    failed tests would make tbrun stop the others, cutting rank 0's report short."""
    global _world
    if _world is not None:
        sys.stdout.flush()
        try:
            _world.barrier()
        except CommError:
            pass  # a rank is gone: nothing to wait for
        _world.close()
        _world = None


@pytest.fixture
def shared_tmp_path(comm, tmp_path_factory: pytest.TempPathFactory, request) -> Path:
    """A fresh directory for this test, the same path on every rank."""
    path = np.zeros(_REPORT_BYTES, np.uint8)
    if comm.rank == 0:
        base = tmp_path_factory.getbasetemp()
        made = tempfile.mkdtemp(prefix=f"{request.node.name[:30]}-", dir=base)
        encoded = os.fsencode(made)
        path[:len(encoded)] = np.frombuffer(encoded, np.uint8)
    path = comm.broadcast(path, root=0)
    found = Path(os.fsdecode(path.tobytes().rstrip(b"\0")))
    yield found
    comm.barrier()  # every rank is done with it
    if comm.rank == 0:
        shutil.rmtree(found, ignore_errors=True)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    if call.when != "call" or _world is None or _world.size == 1:
        return report
    failures = _exchange(_world, report)
    if failures:
        report.outcome = "failed"
        report.longrepr = "\n\n".join(failures)
    return report


def _exchange(world, report: pytest.TestReport) -> list[str]:
    """Every rank's failure of this test, each headed by its rank and what went wrong; a
    failure of its own first, then those of ranks that only met another's departure."""
    mine = np.zeros(_REPORT_BYTES, np.uint8)
    if report.failed:
        crash = getattr(report.longrepr, "reprcrash", None)
        headline = crash.message.splitlines()[0] if crash and crash.message else "failed"
        text = f"on rank {world.rank}: {headline}\n{report.longreprtext}"
        encoded = text.encode(errors="replace")[:_REPORT_BYTES - 1]
        mine[0] = _FAILED
        mine[1:1 + len(encoded)] = np.frombuffer(encoded, np.uint8)
    for _ in range(2):  # a rank still in the test's collective answers TBCOLL_CHECK first
        try:
            rows = world.all_gather(mine[None, :])
            break
        except ValueError as e:
            if "TBCOLL_CHECK" not in str(e):
                raise
    else:
        raise RuntimeError("tbcoll.testing: the ranks could not agree on a test's outcome")
    failures = [row[1:].tobytes().rstrip(b"\0").decode(errors="replace")
                for row in rows if row[0] == _FAILED]
    return sorted(failures, key=lambda text: _MISMATCH in text.partition("\n")[0])


_MISMATCH = "TBCOLL_CHECK: the ranks' calls do not match"
