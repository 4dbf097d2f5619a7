"""Helpers for tests that launch real jobs with tbrun."""

from __future__ import annotations

import compileall
import os
import runpy
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from unittest import mock

import pytest
from tbcoll.launch import shmclean

from tbcoll.job.env import launch_info, started_by_mpiexec

# tests/spmd runs inside the ranks of a job (see tests/spmd/conftest.py); a plain run of the
# suite launches it from tests/library/test_spmd.py instead of collecting it.
collect_ignore = [] if launch_info() or started_by_mpiexec() else ["spmd"]

TBRUN = str(Path(sys.executable).with_name("tbrun"))


def pytest_sessionstart(session: pytest.Session) -> None:
    """Byte-compile tbcoll, tbrun and the tests once, before any job starts. Where
    PYTHONDONTWRITEBYTECODE is set (as in CI's environment) every process the suite starts,
    thousands of tbrun's and ranks, compiled them from source again (0.2 s of a rank's 0.5 s
    start here), and in the RDMA lab's VM, which sees this checkout read-only and runs ~50x
    slower, seconds each. A run inside a job's ranks finds them compiled."""
    if not (launch_info() or started_by_mpiexec()):
        for folder in ("tbcoll", "launchers", "tests", "examples", "benchmarks"):
            compileall.compile_dir(REPO / folder, quiet=1)
# Linux's own rules are in force: not under the macOS lane (tests/harness/maclane), where what
# only Linux has (PR_SET_PDEATHSIG, the subreaper, /proc) is off for tbrun and its ranks
MACOS_LANE = os.environ.get("TBCOLL_MACOS_LANE") == "1"
LINUX_RULES = sys.platform.startswith("linux") and not MACOS_LANE
REPO = Path(__file__).resolve().parent.parent


def run_setup_py() -> tuple[dict, dict]:
    """setup.py run with setuptools.setup caught: (its globals, the arguments it gave setup),
    so that a test takes the C sources from where the build does (ext_modules, SHM_PURE_C)."""
    import setuptools
    caught: dict = {}
    with mock.patch.object(setuptools, "setup", lambda **kwargs: caught.update(kwargs)):
        names = runpy.run_path(str(REPO / "setup.py"))
    return names, caught


def tbrun(*args: str, timeout: float = 60, env: dict | None = None,
          cwd: Path | None = None, input: str | None = None) -> subprocess.CompletedProcess:
    """Run tbrun to completion (bounded by timeout) and capture its output as text; its
    stdin is input, or /dev/null."""
    return subprocess.run([TBRUN, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=cwd, input=input,
                          stdin=subprocess.DEVNULL if input is None else None)


def tagged_lines(text: str) -> dict[int, list[str]]:
    """Group '[rank] line' output by rank."""
    by_rank: dict[int, list[str]] = {}
    for line in text.splitlines():
        if line.startswith("["):
            tag, _, rest = line.partition("] ")
            by_rank.setdefault(int(tag[1:]), []).append(rest)
    return by_rank


def pid_alive(pid: int) -> bool:
    """True if pid runs and is not a zombie waiting for a parent that does not reap."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def labs_required() -> bool:
    """TBCOLL_REQUIRE_LABS=1 (set by `make test` as root with apt-get, so in CI): the labs
    (the RDMA VM, the namespace cluster, the Slurm cluster) must run here, and one that cannot
    is a failure, never a skip."""
    return os.environ.get("TBCOLL_REQUIRE_LABS") == "1"


def skip_or_fail(reason: str) -> None:
    """Skip with reason; fail instead where the labs are required (a skip reads green)."""
    if labs_required():
        pytest.fail(f"{reason} (TBCOLL_REQUIRE_LABS=1: this run must have it)", pytrace=False)
    pytest.skip(reason)


LAB = "rdma_lab"
_labs: list = []  # the session's lab, once booted


@pytest.hookimpl(tryfirst=True)  # before -m selects on the marker added here
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests in the RDMA lab run first, one after another: its VM is emulated, and even
    idle it takes a share of a core from every test after it, so it is stopped after the
    last of them (pytest_runtest_teardown), not at the end of the session. They are marked
    `lab`, as the arm64 root's are (`make test` runs -m lab beside -m 'not lab')."""
    items.sort(key=lambda item: not in_lab(item))
    for item in items:
        if in_lab(item):
            item.add_marker(pytest.mark.lab)


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    if in_lab(item) and (nextitem is None or not in_lab(nextitem)):
        for lab in _labs:
            lab.stop()


def in_lab(item: pytest.Item) -> bool:
    return LAB in getattr(item, "fixturenames", ())


@pytest.fixture(scope="session")
def rdma_lab():
    """The RDMA lab (tests/harness/rdmalab.py), booted once for the session: a VM with
    Soft-RoCE's rxe0 up; lab.run(argv, timeout) runs a command in it."""
    from .harness import rdmalab
    reason = rdmalab.why_not_available()
    if reason:
        skip_or_fail(f"RDMA lab: {reason}")
    lab = rdmalab.Lab()
    try:
        lab.start()
    except rdmalab.LabError as e:
        skip_or_fail(f"RDMA lab: {e}")
    _labs.append(lab)
    yield lab
    lab.stop()


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


# Rank scripts record pids with write_pids: a .pid file appears (by rename) only once it is
# complete, so a test that sees it reads every pid it was meant to hold.
WRITE_PIDS = """
def write_pids(folder, name, *pids):
    import os
    path = os.path.join(folder, str(name))
    with open(path + ".tmp", "w") as f:
        f.write(" ".join(map(str, pids)) + "\\n")
    os.replace(path + ".tmp", path + ".pid")
"""


def read_pids(folder: Path, files: int, timeout: float = 20, pattern: str = "*") -> list[int]:
    """The pids in folder's .pid files (see WRITE_PIDS), once there are `files` of them; of
    those, the ones of the files whose names match pattern."""
    wait_for(lambda: len(list(folder.glob("*.pid"))) == files, timeout,
             f"{files} pid files in {folder}")
    return [int(pid) for path in sorted(folder.glob(f"{pattern}.pid"))
            for pid in path.read_text().split()]


def tbcoll_segments() -> set[Path]:
    """tbcoll's shared memory in /dev/shm (none can be listed on macOS, nor in a rank under the
    macOS lane, where /dev/shm answers stat but not a listing); in a rank, only its job's:
    another job's, of the other session `make test` runs beside this one, is not this one's."""
    job = "".join(c for c in os.environ.get("TBCOLL_JOB", "") if c.isascii() and c.isalnum())
    try:
        return set(Path("/dev/shm").glob(f"tbc-{job[:8]}-*" if job else "tbc-*"))
    except OSError:
        return set()


def mpich_segments() -> set[Path]:
    """MPICH's shared-memory files (it unlinks them at MPI_Finalize; a killed rank does not).
    None under the macOS lane: tbrun cannot list them there (no /dev/shm on a Mac), and what
    a killed MPICH rank leaves stays (docs/transports.md, On a Mac)."""
    shm = Path("/dev/shm")
    return set(shm.glob("mpich_shm_*")) if shm.is_dir() and not MACOS_LANE else set()


def hydra_topology_files() -> set[Path]:
    """The hwloc topology files MPICH's Hydra proxies write to /tmp (a proxy unlinks its own
    when it ends normally; tbcoll.launch.hydratopo removes it when a rank aborts)."""
    return set(Path("/tmp").glob("hydra_hwloc_xmlfile_*"))


def unheld(paths: set[Path]) -> set[Path]:
    """Those of paths that no process holds open (read from /proc by the test itself; all of
    them where there is no /proc, as under the macOS lane)."""
    held = set()
    try:
        processes = list(Path("/proc").glob("[0-9]*/fd"))
    except OSError:
        return paths
    for fds in processes:
        try:
            held.update(os.readlink(link) for link in fds.iterdir())
        except OSError:
            continue  # the process ended, or is not ours to read
    return {path for path in paths if str(path) not in held}


def left_behind(paths: set[Path]) -> set[Path]:
    """Those of paths (shared memory, Hydra's topology files) that no process maps or holds
    open, looked at for up to 5 s: `make test` runs two sessions side by side, and a job of
    the other one may have just made its own, or be ending (its tbrun unlinks what is left)."""
    def unused(paths: set[Path]) -> set[Path]:
        held = {Path(path) for path in shmclean.mapped({str(path) for path in paths})}
        return unheld({path for path in paths if path.exists()} - held)
    left = unused(paths) if paths else set()
    for _ in range(10):
        if not left:
            break
        time.sleep(0.5)
        left = unused(left)
    return left


@pytest.fixture(scope="session", autouse=True)
def no_shared_memory_left_behind():
    """After the whole suite, no job of it may have left a shared-memory name behind: none
    made during the session that no process maps."""
    before = tbcoll_segments()
    yield
    left = left_behind(tbcoll_segments() - before)
    assert not left, f"segments left behind: {sorted(path.name for path in left)}"


@pytest.fixture(scope="session", autouse=True)
def dumps_removed():
    """The dumps that failing jobs leave in the temporary directory for their users (see
    tbcoll.launch.postmortem) are removed after the suite."""
    def dumps() -> set[Path]:
        return set(Path(tempfile.gettempdir()).glob("tbrun-dump-*"))
    before = dumps()
    yield
    for folder in dumps() - before:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def script(tmp_path: Path):
    """Write a rank script into tmp_path and return its path."""
    def write(source: str, name: str = "job.py") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(source))
        return path
    return write


@pytest.fixture
def socket_pair():
    """Two connected non-blocking sockets, for the C extensions' socket calls."""
    a, b = socket.socketpair()
    for sock in (a, b):
        sock.setblocking(False)
    yield a, b
    a.close()
    b.close()
