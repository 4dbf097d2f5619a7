"""tbcoll on aarch64: the arm64 lab (tests/arm64lab.py), an arm64 Debian root under qemu-user.

A copy of this checkout goes into the root; there its C extensions build with -Wall -Werror
under gcc and under clang (TBCOLL_REQUIRE_C=1: a warning fails the build, no extension is
left out), its C buffer and lane tests run, and tbrun runs the collectives on shm and tcp at
np 2 and 3, every rank checking every result bit for bit against numpy's, computed in the
root (numpy's aarch64 build). What this shows: tbcoll builds and runs on aarch64, where the
acquire/release builtins become LDAR/STLR. What it cannot: qemu runs the guest's loads and
stores as x86's, which are ordered more strongly than ARM's, so weak memory ordering is not
exercised here (tests/test_tsan.py checks the ordering against C11's model instead); nor is
macOS. qemu-user has no process_vm_readv (ENOSYS): shm's pulls fall back to its rings there,
and the tests that look for a pull accept that fallback (they read Peer.pulls after the fact).

Where the lab cannot run (not root, no apt-get), these skip and say why; under
TBCOLL_REQUIRE_LABS=1 (make test as root) they fail instead. The root is built by
`make arm64-lab`, once (minutes); with it present this module takes a few minutes.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from . import arm64lab
from .conftest import REPO, skip_or_fail

WERROR = "-Wall -Werror"
EXTENSIONS = ["tbcoll/_gate", "tbcoll/shm/_atomics", "tbcoll/transports/_sockets",
              "tbcoll/rdma/_verbs", "launchers/_subreaper"]
C_SOURCES = ["tbcoll/_gate.c", "tbcoll/shm/_atomics.c", "tbcoll/shm/lane.c",
             "tbcoll/shm/moves.c", "tbcoll/transports/_sockets.c", "tbcoll/rdma/_verbs.c",
             "launchers/_subreaper.c", "launchers/die_with_parent.c"]
# the C buffer tests whole; of the lane's, those that run its C paths and their answers
IN_ROOT_TESTS = ["tests/test_c_buffers.py",
                 "tests/test_shm_lane.py::test_the_lane_gives_the_python_paths_answers",
                 "tests/test_shm_lane.py::"
                 "test_the_lane_moves_small_messages_and_leaves_the_rest_to_the_engine"]

COLLECTIVES = r"""
import functools
import sys

import ml_dtypes
import numpy as np
import tbcoll

comm = tbcoll.init()
r, p = comm.rank, comm.size
backend = sys.argv[1]
DTYPES = [np.dtype(t) for t in (np.float16, ml_dtypes.bfloat16, np.float32, np.float64, np.int8,
                                np.int16, np.int32, np.int64, np.uint8)]
# elements a rank: the lane's one-call paths, the segment's rounds or tcp's stream, and past a
# 1 MiB slot (split rounds; pulls, which fall back to the rings under qemu)
SIZES = {"small": (7, DTYPES), "medium": (5000, DTYPES),
         "large": (150_001, [np.dtype(np.float32), np.dtype(np.float64),
                             np.dtype(ml_dtypes.bfloat16), np.dtype(np.int8)])}
OPS = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}
# shm's rounds reduce in rank order: any float there is compared with numpy's rank-order
# answer. tcp's algorithms may add in another order: its floats are small integers, exact in
# any order (still compared bit for bit).
EXACT = backend != "shm"
checked, wrong = 0, []


def data(rank, dtype, n, case, op="sum"):
    rng = np.random.default_rng([rank, n, case, dtype.num])
    if dtype.kind in "iu" or EXACT or op == "prod":
        low = 0 if dtype.kind == "u" else -3
        return rng.integers(low, 4, n).astype(dtype)
    return (rng.standard_normal(n) * 100).astype(dtype)


def check(name, got, want):
    global checked
    checked += 1
    same = got.dtype == want.dtype and got.shape == want.shape and \
        got.tobytes() == want.tobytes()
    if not same:
        wrong.append(f"{name}: got {got[:4]}... want {want[:4]}...")


for size_name, (n, dtypes) in SIZES.items():
    for dtype in dtypes:
        where = f"{size_name} {dtype}"
        for op, ufunc in OPS.items():
            xs = [data(k, dtype, n, 0, op) for k in range(p)]
            check(f"all_reduce {op} {where}", comm.all_reduce(xs[r], op=op),
                  functools.reduce(ufunc, xs))
        xs = [data(k, dtype, n, 1) for k in range(p)]
        check(f"all_gather {where}", comm.all_gather(xs[r]), np.concatenate(xs))
        xs = [data(k, dtype, n * p, 2) for k in range(p)]
        check(f"reduce_scatter {where}", comm.reduce_scatter(xs[r]),
              functools.reduce(np.add, xs)[r * n:(r + 1) * n])
        root = p - 1
        xs = [data(k, dtype, n, 3) for k in range(p)]
        check(f"broadcast {where}", comm.broadcast(xs[r], root=root), xs[root])

# point to point around the ring, past the size that shm pulls (the rings under qemu)
for n in (100, 40_000):
    xs = [data(k, np.dtype(np.float64), n, 4) for k in range(p)]
    req = comm.isend(xs[r], (r + 1) % p, tag=n % 1000)
    got = comm.recv(np.empty(n), (r - 1) % p, tag=n % 1000)
    req.wait()
    check(f"send/recv {n}", got, xs[(r - 1) % p])
comm.barrier()
pulls = backend == "shm" and any(comm._group._stream.peer(k).pulls for k in range(p) if k != r)
print(f"checked {checked} wrong {len(wrong)} pulls {pulls}")
for line in wrong[:20]:
    print(line)
comm.close()
"""


@pytest.fixture(scope="module")
def lab():
    """A copy of this checkout in the arm64 root, installed (editable) into a venv there with
    its C extensions built by gcc under -Wall -Werror; removed afterwards. The build's output
    and seconds are lab.built."""
    reason = arm64lab.why_not_available()
    if reason:
        skip_or_fail(f"arm64 lab: {reason}")
    if not arm64lab.root_ready():
        skip_or_fail(f"arm64 lab: no root built from this recipe at {arm64lab.ROOT} "
                     f"({arm64lab.INSTALL})")
    with arm64lab.locked(arm64lab.ROOT, exclusive=False):
        folder = Path(tempfile.mkdtemp(prefix="tbcoll-arm64-", dir=arm64lab.ROOT / "tmp"))
        try:
            yield Lab(folder)
        finally:
            arm64lab.remove_tree(folder)


class Lab:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.inside = "/" + str(folder.relative_to(arm64lab.ROOT))  # its path in the root
        self.src = f"{self.inside}/src"
        copy_checkout(folder / "src")
        self.venv = f"{self.inside}/venv"
        self.run(["python3", "-m", "venv", "--system-site-packages", "--without-pip",
                  self.venv], timeout=300).check_returncode()
        # the root's pip, seen through --system-site-packages, as numpy and pytest are
        self.built = self.timed([f"{self.venv}/bin/python", "-m", "pip", "install", "--no-deps",
                                 "--no-build-isolation", "--no-index", "-v", "-e", "."],
                                timeout=900, env=compiler("gcc"))

    def run(self, argv: list[str], timeout: float, env: dict | None = None,
            cwd: str | None = None) -> subprocess.CompletedProcess:
        return arm64lab.run_in_root(argv, timeout, env=env, cwd=cwd or self.src)

    def timed(self, argv: list[str], timeout: float, **kwargs) -> tuple:
        started = time.monotonic()
        p = self.run(argv, timeout, **kwargs)
        return p, time.monotonic() - started


def compiler(cc: str) -> dict:
    return {"CC": cc, "CFLAGS": WERROR, "TBCOLL_REQUIRE_C": "1"}


def copy_checkout(to: Path) -> None:
    """This checkout's files as they are now (tracked and new, not ignored: no .venv, no
    built extensions of the host's) into `to`."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout
    for name in filter(None, listed.split("\0")):
        source = REPO / name
        if source.is_file():
            (to / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, to / name)


def warnings_in(output: str) -> list[str]:
    """The compiler's diagnostics in output (file:line:column: warning: ...)."""
    return [line for line in output.splitlines()
            if re.search(r":\d+:\d+: (warning|error):", line)]


def test_the_c_extensions_build_on_aarch64_with_gcc_under_wall_werror(lab):
    p, seconds = lab.built
    output = p.stdout + p.stderr
    assert p.returncode == 0, output[-6000:]
    assert not warnings_in(output), "\n".join(warnings_in(output))
    for name in EXTENSIONS:
        assert list((lab.folder / "src").glob(f"{name}.cpython-*-aarch64-linux-gnu.so")), name
    assert (lab.folder / "src/launchers/die-with-parent").exists()
    p = lab.run([f"{lab.venv}/bin/python", "-c", "import platform, tbcoll.shm._atomics, "
                 "tbcoll.transports._sockets, tbcoll.rdma._verbs; print(platform.machine())"],
                timeout=120)
    assert p.stdout.split() == ["aarch64"], p.stdout + p.stderr
    print(f"gcc build in the arm64 root: {seconds:.0f} s")


def test_the_c_sources_compile_on_aarch64_with_clang_under_wall_werror(lab):
    """clang -fsyntax-only: the warnings of clang's -Wall all come from its front end, and
    code generation under emulation would add minutes (gcc's build above is the one run)."""
    include = "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()[\"include\"])')"
    # one clang for every file: each start of clang under emulation costs seconds
    check = f"clang -fsyntax-only {WERROR} -I{include} {' '.join(C_SOURCES)}"
    p, seconds = lab.timed(["sh", "-c", check], timeout=600)
    output = p.stdout + p.stderr
    assert p.returncode == 0, output[-6000:]
    assert not warnings_in(output), "\n".join(warnings_in(output))
    print(f"clang -fsyntax-only in the arm64 root: {seconds:.0f} s")


def test_the_c_buffer_and_lane_tests_pass_on_aarch64(lab):
    p, seconds = lab.timed([f"{lab.venv}/bin/python", "-m", "pytest", "-q", "-x",
                            "-p", "no:cacheprovider", *IN_ROOT_TESTS], timeout=900)
    assert p.returncode == 0, (p.stdout + p.stderr)[-6000:]
    assert re.search(r"\b\d+ passed\b", p.stdout) and "skipped" not in p.stdout, p.stdout
    print(f"C buffer and lane tests in the arm64 root: {seconds:.0f} s")


@pytest.mark.parametrize("backend,ranks", [("shm", 2), ("shm", 3), ("tcp", 2), ("tcp", 3)])
def test_the_collectives_give_numpys_aarch64_answers_bit_for_bit(lab, backend, ranks):
    script = lab.folder / "src" / f"collectives_{backend}_{ranks}.py"
    script.write_text(COLLECTIVES)
    p, seconds = lab.timed([f"{lab.venv}/bin/tbrun", "-np", str(ranks), "--backend", backend,
                            "--timeout", "300", script.name, backend], timeout=600)
    assert p.returncode == 0, (p.stdout + p.stderr)[-6000:]
    summaries = re.findall(r"^\[(\d+)\] checked (\d+) wrong (\d+) pulls (\w+)$", p.stdout, re.M)
    assert sorted(int(rank) for rank, *_ in summaries) == list(range(ranks)), p.stdout
    for _rank, checked, wrong, pulls in summaries:
        assert int(checked) == 2 * 9 * 7 + 4 * 7 + 2 and int(wrong) == 0, p.stdout[-6000:]
        # qemu-user has no process_vm_readv: the first pull fails with ENOSYS and shm's
        # pairs go on through their rings
        assert pulls == "False", p.stdout
    print(f"{backend} np {ranks} in the arm64 root: {seconds:.0f} s")
