"""The macOS lane: `python -m pytest -p tests.harness.maclane <files>` runs those tests under
macOS's rules as far as Linux allows (tests/harness/maclane/rules.py says which, and where they
come from).

Loaded with -p, this plugin acts before any conftest, so before tbcoll is imported: the rules
apply to pytest's own process, and, through a sitecustomize.py that PYTHONPATH puts first, to
every Python it starts (tbrun, the ranks, the wrappers). Its soft limit of open files is
lowered to macOS's default, 256, which children inherit. TBCOLL_SHM_CMA=0 turns off shm's
process_vm_readv, which macOS has not.
"""

from __future__ import annotations

import os
import resource

import pytest

from . import rules

MACOS_OPEN_FILES = 256
SITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "site")

rules.apply(in_rank=False)
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (SITE, os.environ.get("PYTHONPATH")) if p)
os.environ["TBCOLL_SHM_CMA"] = "0"
os.environ["TBCOLL_MACOS_LANE"] = "1"  # for tests that look at what only the lane does
_soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(MACOS_OPEN_FILES, _hard), _hard))


def pytest_report_header(config: pytest.Config) -> str:
    return ("macOS lane: macOS CPython's missing names removed, kqueue's selector, "
            "no PR_SET_PDEATHSIG/subreaper//proc//dev/shm, no process_vm_readv, "
            f"{MACOS_OPEN_FILES} open files")


_mpich_before: set[str] = set()


def pytest_sessionstart(session: pytest.Session) -> None:
    from tbcoll.launch import shmclean  # (after the rules: tbcoll is imported under them)

    _mpich_before.update(shmclean.mpich_segments())


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Unlink the MPICH segments this lane's killed MPI ranks left, as tbrun does elsewhere
    (launchers/shmclean.py): under the lane's rules tbrun cannot find them (no /dev/shm or
    /proc on a Mac, where they stay: docs/transports.md, On a Mac), and CI's machine must not
    keep them."""
    from tbcoll.launch import shmclean

    shmclean.remove_unmapped(shmclean.mpich_segments() - _mpich_before, print)
