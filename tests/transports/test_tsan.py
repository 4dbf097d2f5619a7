"""The shm transport's ring, flag and round code under ThreadSanitizer
(tests/harness/tsan/shm_race.c).

Memory ordering cannot be shown by running on x86-64 (nor by qemu on it): x86 keeps stores in
order whatever the code asks. ThreadSanitizer checks the code against C11's model instead:
threads sharing one mapping, as ranks share a segment, run the extension's pure-C layer
(setup.py's SHM_PURE_C: rings.c's rings, flags.c's waits, rounds.c's rounds, built without
Python's headers), and a plain access where an atomic one is needed, or a relaxed one where a
release and its acquire must order the data, is a reported race. Each of these mutations was
reported when tried (2026-11-28): ring_fill's head stored relaxed, ring_take's tail stored
relaxed, all_reached's flags loaded relaxed, run_round's ARRIVE flag stored plainly. The canary
(a ring whose head is stored relaxed) shows that the sanitizer reports what it should here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from ..conftest import REPO, run_setup_py, skip_or_fail

HARNESS = REPO / "tests" / "harness" / "tsan" / "shm_race.c"
SHM = REPO / "tbcoll" / "transports" / "shm"
REPORT = "WARNING: ThreadSanitizer"


def compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def pure_c_sources() -> list[str]:
    """The shm extension's pure-C files, as setup.py builds them (SHM_PURE_C)."""
    return [str(REPO / source) for source in run_setup_py()[0]["SHM_PURE_C"]]


@pytest.fixture(scope="module")
def shm_race(tmp_path_factory) -> Path:
    """The harness with the pure-C layer, built with -fsanitize=thread: without Python's
    headers, so that a Python.h there fails the build (the layer must run without Python)."""
    cc = compiler()
    if cc is None:
        skip_or_fail("ThreadSanitizer guard: no C compiler (apt-get install gcc)")
    program = tmp_path_factory.mktemp("tsan") / "shm_race"
    built = subprocess.run([cc, "-fsanitize=thread", "-g", "-O1", "-Wall", "-I", str(SHM),
                            str(HARNESS), *pure_c_sources(), "-o", str(program), "-lpthread"],
                           capture_output=True, text=True, timeout=300)
    if built.returncode != 0:
        if "tsan" in built.stderr.lower() and not program.exists():
            skip_or_fail(f"ThreadSanitizer guard: {cc} cannot link -fsanitize=thread here "
                         f"(apt-get install libtsan2): {built.stderr.strip()[-300:]}")
        pytest.fail(f"the ThreadSanitizer harness did not build:\n{built.stderr}")
    return program


def run(program: Path, *args: str) -> subprocess.CompletedProcess:
    # setarch -R: ThreadSanitizer's fixed shadow layout can clash with a randomised mmap base
    prefix = ["setarch", os.uname().machine, "-R"] if shutil.which("setarch") else []
    env = {**os.environ, "TSAN_OPTIONS": "halt_on_error=1 exitcode=66"}
    return subprocess.run([*prefix, str(program), *args], capture_output=True, text=True,
                          timeout=300, env=env)


@pytest.mark.parametrize("mode", [["rings"], ["rounds", "2"], ["rounds", "3"]],
                         ids=["rings", "rounds-np2", "rounds-np3"])
def test_no_race_in_the_rings_and_rounds_and_their_results_are_right(shm_race, mode):
    p = run(shm_race, *mode)
    assert REPORT not in p.stderr, p.stderr[-4000:]
    assert p.returncode == 0, p.stdout + p.stderr[-4000:]
    assert p.stdout.startswith(mode[0] + ":"), p.stdout


def test_the_canary_race_is_reported(shm_race):
    """A ring whose head is stored relaxed: if this is not reported, the guard sees nothing."""
    p = run(shm_race, "canary")
    assert f"{REPORT}: data race" in p.stderr, p.stdout + p.stderr[-4000:]
    assert p.returncode != 0
