"""The tests run the C this checkout holds. setup.py builds the extensions optional (a user
without a compiler still installs), so a build that fails only warns: a fresh clone then runs
the Python paths, and a checkout built before keeps its last good .so, yesterday's C. Either
would read green."""

from __future__ import annotations

import importlib
import shutil
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# every extension but rdma's, which needs the verbs header, and tbrun's, which is Linux's
NEED_NO_HEADER = ("tbcoll.core._gate", "tbcoll.comm._route", "tbcoll.transports.shm._atomics",
                  "tbcoll.transports.tcp._sockets", "tbcoll.transports.mpi._gathered")
PROGRAMS = ("die_with_parent.c",)  # beside tbrun's extension, a program of its own (setup.py)


def built_in_place() -> list[Path]:
    """The extensions an editable install built into the checkout."""
    return [so for top in ("tbcoll", "launchers") for so in (ROOT / top).rglob("*.so")]


def test_each_extension_built_in_place_is_newer_than_its_folders_sources():
    if not built_in_place():
        pytest.skip("no extension built into this checkout (not an editable install)")
    for so in built_in_place():
        sources = [path for pattern in ("*.c", "*.h") for path in so.parent.glob(pattern)
                   if path.name not in PROGRAMS]
        newest = max(sources, key=lambda path: path.stat().st_mtime)
        assert so.stat().st_mtime >= newest.stat().st_mtime, (
            f"{so.relative_to(ROOT)} is older than {newest.relative_to(ROOT)}: its build "
            f"failed and left the last one; `pip install --no-deps -e .` says why")


def test_every_extension_is_built_where_a_compiler_is():
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        pytest.skip(f"no C compiler ({compiler}): the Python paths are what runs here")
    for name in NEED_NO_HEADER:
        try:
            importlib.import_module(name)
        except ImportError as e:
            pytest.fail(f"{name} is not built though {compiler} is here ({e}): "
                        f"`pip install --no-deps -e .` says why")
