"""tbcoll on aarch64: the arm64 lab (tests/harness/arm64lab.py), an arm64 Debian root under
qemu-user.

The C extensions are built for aarch64 on the host, by x86-64 cross compilers targeting
aarch64 from the host's Debian (12 or 13: gcc 12 and clang 14, or gcc 14 and clang 19), with
the root's headers and libraries alone: its glibc and Python 3.13 headers (pyconfig.h through
/usr/include/aarch64-linux-gnu), its crt files, libc and libgcc_s. Not the compilers'
defaults: Debian's cross gcc searches the cross toolchain's own glibc
(/usr/aarch64-linux-gnu, libc6-dev-arm64-cross: the host release's glibc) before any sysroot,
so the build gives -nostdinc with each compiler's own include folder and the root's, and -B
and -L the root's libraries; two checks read which headers each compiler took and which
files the linker opened. gcc (aarch64-linux-gnu-gcc) builds each extension that setup.py
lists, and die-with-parent, under -Wall -Werror with the flags of the root's Python (its
sysconfig: what pip would use there); clang (--target=aarch64-linux-gnu) compiles every C
source under -Wall -Werror with -fsyntax-only (its warnings all come from its front end).
What that shows: the sources compile for aarch64 without a warning from either, against the
headers of the root that runs them, and the .so files are aarch64 ELF that import in the
root. What it does not: a native compiler's run in the root (the code the host's cross gcc
generates is what runs below), nor the warnings of the compilers of the other Debian release
or of Apple's clang on a Mac.

That build is then used in the root without pip: a venv there (--system-site-packages: the
root's numpy, ml_dtypes, pytest) whose site-packages names the copied checkout in a .pth,
tbcoll/launch a link to launchers/ (as pyproject.toml's package-dir maps it), and a tbrun
script beside its python. In it the C buffer and lane tests run, and tbrun runs the
collectives on shm and tcp at np 2 and 3, every rank checking every result bit for bit
against numpy's, computed in the root (numpy's aarch64 build). What this shows: tbcoll runs
on aarch64, where the acquire/release builtins become LDAR/STLR. What it cannot: qemu runs
the guest's loads and stores as x86's, which are ordered more strongly than ARM's, so weak
memory ordering is not exercised here (tests/transports/test_tsan.py checks the ordering against
C11's model instead); nor is macOS. qemu-user has no process_vm_readv (ENOSYS): shm's pulls fall
back to its rings there, and the tests that look for a pull accept that fallback (they read
Peer.pulls after the fact).

Where the lab cannot run (not root, no apt-get), these skip and say why; under
TBCOLL_REQUIRE_LABS=1 (make test as root) they fail instead. The root is built by
`make arm64-lab`, once (1-2 minutes); with it present this module takes about a minute.
"""

from __future__ import annotations

import functools
import glob
import os
import re
import runpy
import shlex
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from ..conftest import REPO, run_setup_py, skip_or_fail
from ..harness import arm64lab

pytestmark = pytest.mark.lab  # `make test` runs the emulated labs beside the rest

WERROR = ["-Wall", "-Werror"]
MULTIARCH = "aarch64-linux-gnu"
# the cross compilers, by name: gcc builds, clang compiles (-fsyntax-only)
COMPILERS = {"gcc": [f"{MULTIARCH}-gcc"], "clang": ["clang", f"--target={MULTIARCH}"]}
# the root's CFLAGS that clang is not given: -fno-strict-overflow (some clang releases call it
# "not supported", an error under -Werror), and -g, which -fsyntax-only has no use for
NOT_FOR_CLANG = {"-g", "-fno-strict-overflow"}
EM_AARCH64 = 183  # ELF's e_machine for aarch64
DIE_WITH_PARENT = ("launchers/die_with_parent.c", "launchers/die-with-parent")
# the C buffer tests whole; of the lane's, those that run its C paths and their answers (the
# moves with pulls allowed: qemu-user's process_vm_readv fails and the rings take over, which
# is all that pulls off would run)
IN_ROOT_TESTS = ["tests/transports/test_c_buffers.py",
                 "tests/transports/test_shm_lane.py::"
                 "test_the_lane_gives_the_python_paths_answers",
                 "tests/transports/test_shm_lane.py::"
                 "test_the_lane_moves_small_messages_and_leaves_the_rest_to_the_engine[pulls]"]
TBRUN = """#!{python}
import sys

from tbcoll.launch.command import main

sys.exit(main())
"""

COLLECTIVES = r"""
import functools

import ml_dtypes
import numpy as np
import tbcoll

DTYPES = [np.dtype(t) for t in (np.float16, ml_dtypes.bfloat16, np.float32, np.float64, np.int8,
                                np.int16, np.int32, np.int64, np.uint8)]
# elements a rank: the lane's one-call paths, the segment's rounds or tcp's stream, and past a
# 1 MiB slot (split rounds; pulls, which fall back to the rings under qemu)
SIZES = {"small": (7, DTYPES), "medium": (5000, DTYPES),
         "large": (150_001, [np.dtype(np.float32), np.dtype(ml_dtypes.bfloat16)])}
OPS = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}
# shm's rounds reduce in rank order: any float there is compared with numpy's rank-order
# answer. tcp's algorithms may add in another order: its floats are small integers,
# exact in any order (still compared bit for bit).


def data_of(rank, p, dtype, n, case, op="sum", exact=False):
    rng = np.random.default_rng([rank, p, n, case, dtype.num])
    if dtype.kind in "iu" or exact or op == "prod":
        low = 0 if dtype.kind == "u" else -3
        return rng.integers(low, 4, n).astype(dtype)
    return (rng.standard_normal(n) * 100).astype(dtype)


def check_all(comm):
    # every collective at every size, each rank's result against numpy's: (checked, wrong)
    r, p, backend = comm.rank, comm.size, comm.backend
    data = functools.partial(data_of, exact=backend != "shm")
    results = []

    def check(name, got, want):
        same = got.dtype == want.dtype and got.shape == want.shape and \
            got.tobytes() == want.tobytes()
        results.append(None if same else f"{name}: got {got[:4]}... want {want[:4]}...")

    for size_name, (n, dtypes) in SIZES.items():
        for dtype in dtypes:
            where = f"{size_name} {dtype} np {p}"
            for op, ufunc in OPS.items():
                xs = [data(k, p, dtype, n, 0, op) for k in range(p)]
                check(f"all_reduce {op} {where}", comm.all_reduce(xs[r], op=op),
                      functools.reduce(ufunc, xs))
            xs = [data(k, p, dtype, n, 1) for k in range(p)]
            check(f"all_gather {where}", comm.all_gather(xs[r]), np.concatenate(xs))
            xs = [data(k, p, dtype, n * p, 2) for k in range(p)]
            check(f"reduce_scatter {where}", comm.reduce_scatter(xs[r]),
                  functools.reduce(np.add, xs)[r * n:(r + 1) * n])
            root = p - 1
            xs = [data(k, p, dtype, n, 3) for k in range(p)]
            check(f"broadcast {where}", comm.broadcast(xs[r], root=root), xs[root])
    # point to point around the ring, past the size that shm pulls (the rings under qemu)
    for n in (100, 40_000):
        xs = [data(k, p, np.dtype(np.float64), n, 4) for k in range(p)]
        req = comm.isend(xs[r], (r + 1) % p, tag=n % 1000)
        got = comm.recv(np.empty(n), (r - 1) % p, tag=n % 1000)
        req.wait()
        check(f"send/recv {n} np {p}", got, xs[(r - 1) % p])
    comm.barrier()
    pulls = backend == "shm" and any(comm._group._stream.peer(k).pulls
                                     for k in range(p) if k != r)
    wrong = [line for line in results if line]
    print(f"{backend} np {p} checked {len(results)} wrong {len(wrong)} pulls {pulls}")
    for line in wrong[:20]:
        print(line)


# the job's shm world, then a tcp world of the same ranks (one job: its start under emulation,
# tbrun's and each rank's numpy, costs more than its checks); in each, np 2: ranks 0 and 1
# split off (a segment, or a group over tcp's sockets, of their own)
for backend in ("shm", "tcp"):
    world = tbcoll.init(backend)
    check_all(world)
    pair = world.split(0 if world.rank < 2 else None)
    if pair is not None:
        check_all(pair)
        pair.close()
    world.close()
"""



@pytest.fixture(scope="module")
def lab():
    """A copy of this checkout in the arm64 root, its C extensions cross-built by gcc under
    -Wall -Werror, usable from a venv there; removed afterwards. The build's output and
    seconds are lab.built."""
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
        (folder / "src/tbcoll/launch").symlink_to("../launchers")
        self.built = timed(lambda: gcc_build(folder / "src"))
        # its .pyc files, by the native Python (arm64lab.byte_compile): at the host's speed
        arm64lab.byte_compile(arm64lab.ROOT, [self.src])
        self.venv = f"{self.inside}/venv"
        self.run(["python3", "-m", "venv", "--system-site-packages", "--without-pip",
                  self.venv], timeout=300).check_returncode()
        site = Path(glob.glob(f"{folder}/venv/lib/python3*/site-packages")[0])
        (site / "tbcoll-checkout.pth").write_text(self.src + "\n")
        tbrun = folder / "venv/bin/tbrun"
        tbrun.write_text(TBRUN.format(python=f"{self.venv}/bin/python"))
        tbrun.chmod(0o755)

    def run(self, argv: list[str], timeout: float, env: dict | None = None,
            cwd: str | None = None) -> subprocess.CompletedProcess:
        return arm64lab.run_in_root(argv, timeout, env=env, cwd=cwd or self.src)

    def timed(self, argv: list[str], timeout: float, **kwargs) -> tuple:
        return timed(lambda: self.run(argv, timeout, **kwargs))


def timed(call) -> tuple:
    """call()'s result and its seconds."""
    started = time.monotonic()
    result = call()
    return result, time.monotonic() - started


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


def setup_extensions() -> list:
    """setup.py's ext_modules, from setup.py itself (run with setuptools.setup caught)."""
    return run_setup_py()[1]["ext_modules"]


def root_sysconfig() -> dict:
    """The root's Python's build variables (its _sysconfigdata: a dict literal)."""
    version = arm64lab.python_of(arm64lab.ROOT)
    data = arm64lab.ROOT / f"usr/lib/python{version}/_sysconfigdata__linux_aarch64-linux-gnu.py"
    return runpy.run_path(str(data))["build_time_vars"]


@functools.cache
def own_include_dirs(compiler: str) -> tuple[str, ...]:
    """The compiler's own headers (stddef.h, stdarg.h, arm_neon.h...), wherever its release
    keeps them: gcc and clang both answer -print-file-name=include with their folder, and gcc
    include-fixed where its release has one (else the bare name)."""
    found = []
    for name in ("include", "include-fixed"):
        path = subprocess.run([*COMPILERS[compiler], f"-print-file-name={name}"],
                              capture_output=True, text=True, timeout=60).stdout.strip()
        if os.path.isabs(path) and os.path.isdir(path):
            found.append(path)
    return tuple(found)


def sysroot_include_flags(compiler: str) -> list[str]:
    """Headers from the compiler's own folder and the root alone, in the order a native
    compiler in the root takes them. -nostdinc drops every default folder, whatever the
    compiler's release: among them the cross toolchain's glibc (/usr/aarch64-linux-gnu/include,
    libc6-dev-arm64-cross), which Debian's cross gcc (12 and 14) searches before the sysroot
    even with --sysroot."""
    root = arm64lab.ROOT
    folders = [*own_include_dirs(compiler), f"{root}/usr/include/{MULTIARCH}",
               f"{root}/usr/include"]
    return [f"--sysroot={root}", "-nostdinc",
            *(flag for folder in folders for flag in ("-isystem", folder))]


def sysroot_link_flags() -> list[str]:
    """glibc's start files (-B: crt1.o, crti.o...) and libraries (-L: libc, libgcc_s) from the
    root, before the cross toolchain's (/usr/aarch64-linux-gnu/lib), which gcc's defaults
    search first; libgcc and crtbegin.o stay the compiler's own."""
    libraries = f"{arm64lab.ROOT}/usr/lib/{MULTIARCH}"
    return [f"-B{libraries}/", f"-L{libraries}"]


def compile_flags(compiler: str) -> list[str]:
    """What setuptools would pass the root's compiler for an extension (the root's CFLAGS, the
    user's -Wall -Werror after them, CCSHARED), with the root's headers alone."""
    config = root_sysconfig()
    flags = [*sysroot_include_flags(compiler), *config["CFLAGS"].split(), *WERROR,
             *config["CCSHARED"].split(), f"-I{arm64lab.ROOT}{config['INCLUDEPY']}"]
    return flags if compiler == "gcc" else [f for f in flags if f not in NOT_FOR_CLANG]


def gcc_link(sources: list[str], output: str, shared: bool) -> list[str]:
    """The cross gcc's command that compiles sources and links them into output against the
    root's glibc: a shared object as the root's LDSHARED links an extension, or a program."""
    linking = root_sysconfig()["LDSHARED"].split()[1:] if shared else []
    return [*COMPILERS["gcc"], *compile_flags("gcc"), *sysroot_link_flags(), *sources,
            *linking, "-o", output]


def gcc_commands() -> list[tuple[list[str], str]]:
    """(argv, what it builds) for each extension in setup.py, then die-with-parent: each .so
    beside its first source, as an in-place build puts it (tbcoll.launch is launchers/)."""
    suffix = root_sysconfig()["EXT_SUFFIX"]
    commands = []
    for extension in setup_extensions():
        unhandled = [field for field in ("include_dirs", "define_macros", "library_dirs",
                                         "extra_compile_args", "extra_link_args")
                     if getattr(extension, field)]
        assert not unhandled, f"setup.py's {extension.name} sets {unhandled}: pass them here"
        built = str(Path(extension.sources[0]).with_name(
            extension.name.rpartition(".")[2] + suffix))
        commands.append(([*gcc_link(extension.sources, built, shared=True),
                          *(f"-l{library}" for library in extension.libraries)], built))
    source, program = DIE_WITH_PARENT
    commands.append((gcc_link([source], program, shared=False), program))
    return commands


def gcc_build(src: Path) -> tuple[int, str, list[str]]:
    """Build every extension and die-with-parent in src: (status, output, what was built)."""
    output, built = [], []
    for argv, target in gcc_commands():
        done = subprocess.run(argv, cwd=src, capture_output=True, text=True, timeout=300)
        output.append(f"$ {shlex.join(argv)}\n{done.stdout}{done.stderr}")
        if done.returncode != 0:
            return done.returncode, "".join(output), built
        built.append(target)
    return 0, "".join(output), built


def warnings_in(output: str) -> list[str]:
    """The compiler's diagnostics in output (file:line:column: warning: ...)."""
    return [line for line in output.splitlines()
            if re.search(r":\d+:\d+: (warning|error):", line)]


def machine_of(path: Path) -> int | None:
    """e_machine of a 64-bit little-endian ELF file, else None."""
    head = path.read_bytes()[:20]
    if head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
        return None
    return int.from_bytes(head[18:20], "little")


def needs_root_and_compilers() -> None:
    """The tests that use the root's files but no copy of the checkout: skip (or fail) here
    as the lab fixture would."""
    if arm64lab.why_not_available() or not arm64lab.root_ready():
        skip_or_fail("arm64 lab: no root or no cross compiler (see the other tests here)")


def under(path: str, *folders: str) -> bool:
    """path lies inside one of folders."""
    return any(path.startswith(folder.rstrip("/") + "/") for folder in folders)


@pytest.mark.parametrize("compiler", COMPILERS)
def test_the_sysroot_gives_the_roots_glibc_and_python_headers(compiler):
    """Every header an extension includes comes from the root or the compiler's own folder:
    none from the host's /usr/include, nor the cross toolchain's glibc
    (/usr/aarch64-linux-gnu/include, libc6-dev-arm64-cross), which Debian's cross gcc
    searches before the sysroot; and they are the root's glibc and the root's Python."""
    needs_root_and_compilers()
    probe = "#include <Python.h>\n#include <gnu/libc-version.h>\n"
    p = subprocess.run([*COMPILERS[compiler], *compile_flags(compiler), "-H", "-dM", "-E",
                        "-x", "c", "-"], input=probe, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    headers = [line.lstrip(". ") for line in p.stderr.splitlines() if line.startswith(".")]
    outside = [h for h in headers
               if not under(h, str(arm64lab.ROOT), *own_include_dirs(compiler))]
    assert headers and not outside, outside
    pyconfig = f"{arm64lab.ROOT}/usr/include/{MULTIARCH}/python3"
    assert any(h.startswith(pyconfig) and h.endswith("/pyconfig.h") for h in headers), headers
    macros = dict(re.findall(r"^#define (\w+) (.*)$", p.stdout, re.M))
    version = arm64lab.python_of(arm64lab.ROOT)
    assert f"{macros['PY_MAJOR_VERSION']}.{macros['PY_MINOR_VERSION']}" == version
    assert int(macros["__GLIBC_MINOR__"]) == arm64lab.glibc_minor_of(arm64lab.ROOT)
    assert macros["__aarch64__"] == "1"


def linked_files(trace: str) -> list[str]:
    """The files ld opened, from its -t trace: one path a line, an archive's member as
    "(archive)member" in older binutils; paths normalised (gcc's are full of "..")."""
    found = re.findall(r"^\(?(/[^()\s]+)", trace, re.M)
    return [os.path.normpath(path) for path in found]


@pytest.mark.parametrize("shared", [True, False], ids=["extension", "program"])
def test_the_link_takes_glibc_from_the_root(tmp_path, shared):
    """An extension, or die-with-parent, links the root's start files, libc and libgcc_s, and
    the compiler's own libgcc: none of the cross toolchain's glibc (/usr/aarch64-linux-gnu/lib),
    which Debian's cross gcc searches before the sysroot (the host release's glibc, older than
    the root's on Debian 12: it lacks symbols the root's headers name, e.g. __isoc23_strtol)."""
    needs_root_and_compilers()
    source = tmp_path / "probe.c"
    # _GNU_SOURCE, as Python.h defines it: glibc 2.38's headers then call strtol
    # __isoc23_strtol, which an older libc.so.6 lacks
    source.write_text("#define _GNU_SOURCE\n#include <stdio.h>\n#include <stdlib.h>\n"
                      "int probe(const char *s) { return printf(\"%ld\\n\", strtol(s, 0, 10)); }\n"
                      "int main(int argc, char **argv) { return probe(argv[argc - 1]); }\n")
    argv = [*gcc_link([str(source)], str(tmp_path / "probe"), shared), "-Wl,-t"]
    # gcc's temporary object in tmp_path: every other file is the toolchain's or the root's
    p = subprocess.run(argv, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "TMPDIR": str(tmp_path)})
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    opened = linked_files(p.stdout + p.stderr)
    own = os.path.dirname(subprocess.run([*COMPILERS["gcc"], "-print-libgcc-file-name"],
                                         capture_output=True, text=True).stdout.strip())
    outside = [f for f in opened if not under(f, str(arm64lab.ROOT), own, str(tmp_path))]
    assert opened and not outside, f"{outside}\n{shlex.join(argv)}"
    assert any(f.endswith("/libc.so.6") and under(f, str(arm64lab.ROOT)) for f in opened), opened
    assert machine_of(tmp_path / "probe") == EM_AARCH64


def test_the_c_extensions_build_for_aarch64_with_gcc_under_wall_werror(lab):
    (status, output, built), seconds = lab.built
    assert status == 0, output[-6000:]
    assert not warnings_in(output), "\n".join(warnings_in(output))
    extensions = setup_extensions()
    assert len(built) == len(extensions) + 1, built
    for name in built:
        assert machine_of(lab.folder / "src" / name) == EM_AARCH64, name
    modules = ", ".join(extension.name for extension in extensions)
    p = lab.run([f"{lab.venv}/bin/python", "-c", f"import platform, {modules}; "
                 "print(platform.machine())"], timeout=120)
    assert p.stdout.split() == ["aarch64"], p.stdout + p.stderr
    print(f"gcc cross build for aarch64: {seconds:.1f} s")


def test_the_c_sources_compile_for_aarch64_with_clang_under_wall_werror(lab):
    sources = sorted({source for extension in setup_extensions()
                      for source in extension.sources} | {DIE_WITH_PARENT[0]})
    p, seconds = timed(lambda: subprocess.run(
        [*COMPILERS["clang"], *compile_flags("clang"), "-fsyntax-only", *sources],
        cwd=lab.folder / "src", capture_output=True, text=True, timeout=300))
    output = p.stdout + p.stderr
    assert p.returncode == 0, output[-6000:]
    assert not warnings_in(output), "\n".join(warnings_in(output))
    print(f"clang -fsyntax-only for aarch64: {seconds:.1f} s")


def test_the_c_buffer_and_lane_tests_pass_on_aarch64(lab):
    p, seconds = lab.timed([f"{lab.venv}/bin/python", "-m", "pytest", "-q", "-x",
                            "-p", "no:cacheprovider", *IN_ROOT_TESTS], timeout=900)
    assert p.returncode == 0, (p.stdout + p.stderr)[-6000:]
    assert re.search(r"\b\d+ passed\b", p.stdout) and "skipped" not in p.stdout, p.stdout
    print(f"C buffer and lane tests in the arm64 root: {seconds:.0f} s")


def test_the_collectives_give_numpys_aarch64_answers_bit_for_bit(lab):
    """One job of 3 ranks over shm, then over tcp, each with its ranks 0 and 1 split off as a
    communicator of 2."""
    script = lab.folder / "src" / "collectives.py"
    script.write_text(COLLECTIVES)
    p, seconds = lab.timed([f"{lab.venv}/bin/tbrun", "-np", "3", "--backend", "shm",
                            "--timeout", "500", script.name], timeout=600)
    assert p.returncode == 0, (p.stdout + p.stderr)[-6000:]
    summaries = re.findall(r"^\[(\d+)\] (shm|tcp) np (\d) checked (\d+) wrong (\d+) pulls (\w+)$",
                           p.stdout, re.M)
    ran = sorted((backend, int(rank), int(ranks)) for rank, backend, ranks, *_ in summaries)
    assert ran == [(backend, *pair) for backend in ("shm", "tcp")
                   for pair in ((0, 2), (0, 3), (1, 2), (1, 3), (2, 3))], p.stdout[-6000:]
    for _rank, _backend, _ranks, checked, wrong, pulls in summaries:
        # 9 dtypes small and medium, 2 large: 7 collectives each; 2 sends
        assert int(checked) == (2 * 9 + 2) * 7 + 2 and int(wrong) == 0, p.stdout[-6000:]
        # qemu-user has no process_vm_readv: the first pull fails with ENOSYS and shm's
        # pairs go on through their rings
        assert pulls == "False", p.stdout
    print(f"shm and tcp, np 3 and 2, in the arm64 root: {seconds:.0f} s")
