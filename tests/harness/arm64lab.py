"""The arm64 lab: an arm64 Debian root run under qemu-user, where tbcoll is built and run.

A Mac is arm64; this machine is x86-64. With qemu-user-static registered in binfmt_misc, an
arm64 Debian userland runs here as if native: tbrun's ranks run there, on the root's Python and
numpy for aarch64. What it shows: the project builds and runs on aarch64 (the acquire/release
builtins become LDAR/STLR). What it cannot: weak memory ordering (qemu runs a guest's loads and
stores as x86's, which are stronger than ARM's), nor macOS. qemu-user has no process_vm_readv
(ENOSYS): shm's pulls fall back to its rings there.

Nothing is installed under emulation (dpkg, apt-get and pip there took ~8 minutes here):
- mmdebstrap --variant=extract unpacks the recipe's packages (Essential ones, python3,
  python3-dev, libibverbs-dev...) with their dependencies into the root, from the host: no
  maintainer script runs, so no dpkg under emulation (its database stays empty; the root is
  a sysroot and a Python, not a system to apt-get into). What those scripts would have done
  and the lab needs is done here: /etc/passwd and /etc/group from base-passwd's masters.
- the host's pip puts numpy, ml_dtypes, pytest and click's wheels for the root's Python
  (cp313, manylinux aarch64) into the root's /usr/local/lib/python3.13/dist-packages.
- one import of them in the root writes the .pyc files that Debian's postinst (py3compile)
  would have (a whole compileall under emulation took over 10 minutes here, under load; each
  later Python start in the root then reads them instead of compiling).
The C extensions are built on the host by cross compilers with this root as their sysroot
(tests/labs/test_arm64.py).

The root is built once and kept outside the checkout, at ROOT (TBCOLL_ARM64_ROOT), with a stamp
naming its recipe; a later run reuses it, and a changed RECIPE builds it again (~1-2 minutes,
most of it downloading).

    ensure_root()                          # build it unless its stamp names this RECIPE
    p = run_in_root(["uname", "-m"], timeout=60)   # "aarch64"; a CompletedProcess

Each command runs in a mount and pid namespace of its own (unshare): proc, sys, a bind of the
host's /dev, a devpts of its own and a tmpfs on ROOT/dev/shm (the host's /dev/shm must not
be seen) are mounted for it, unmounted when it ends (the namespace takes them with it should
the command be killed), and a process it leaves behind dies with the namespace. Nothing
deletes the root while something is mounted under it (remove_tree).

From a shell: `python -m tests.harness.arm64lab --build` (what `make arm64-lab` runs), or
`python -m tests.harness.arm64lab -- uname -m`.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOT = Path(os.environ.get("TBCOLL_ARM64_ROOT", "/var/cache/tbcoll/arm64-root"))
STAMP = ".tbcoll-arm64-root.json"  # in the root, written last: a partial build has none
INSTALL = "as root: `make arm64-lab` installs and builds it"
# the host's packages: the emulator, the root's builder and the cross compilers
HOST_APT = ("qemu-user-static", "binfmt-support", "mmdebstrap", "gcc-aarch64-linux-gnu",
            "clang")
# What the root holds. Change any of it and bump "version": the next run builds it again.
RECIPE = {
    "version": 2,
    "suite": "trixie",
    # unpacked with their dependencies (?essential: an apt pattern, Debian's Essential set);
    # libstdc++6: numpy's wheels link it
    "extract": ["?essential", "python3", "python3-venv", "python3-dev", "libibverbs-dev",
                "libstdc++6"],
    # wheels from PyPI for the root's Python, put there by the host's pip
    "pip": ["numpy", "pytest", "click", "ml_dtypes"],
    # the same Python for x86-64 (the same suite: the same version), unpacked inside the root
    # at NATIVE_PYTHON and never run under emulation: it writes the root's .pyc files
    "native": ["python3"],
}
NATIVE_PYTHON = "opt/tbcoll-native-python"
# the root's Python code, compiled once at build (paths in the root)
PYTHON_FOLDERS = ["/usr/lib/python{version}", "/usr/local/lib/python{version}/dist-packages"]
PATH_IN_ROOT = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Run inside `unshare --mount --pid --fork`: mount what a Debian userland expects, run the
# command chrooted, unmount in reverse order (the /dev bind above all), exit with its status.
MOUNTED_RUN = r"""
root=$1; shift
set -e
mount -t proc proc "$root/proc"
mount -t sysfs sysfs "$root/sys"
mount --bind /dev "$root/dev"
mount -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts "$root/dev/pts"
mount -t tmpfs -o mode=1777,size=2g tmpfs "$root/dev/shm"
set +e
chroot "$root" "$@"
status=$?
for m in dev/shm dev/pts dev sys proc; do umount "$root/$m" || umount -l "$root/$m"; done
exit $status
"""


class Arm64LabError(RuntimeError):
    """The root could not be built or used."""


def why_not_available() -> str | None:
    """A one-line reason the lab cannot run here (and what to install), or None."""
    if not sys.platform.startswith("linux"):
        return "the arm64 lab runs an arm64 Linux userland under qemu-user: Linux hosts only"
    if os.uname().machine == "aarch64":
        return None if os.geteuid() == 0 else "the arm64 lab needs root (mounts, chroot)"
    if os.geteuid() != 0:
        return "the arm64 lab needs root (mmdebstrap, binfmt_misc, mounts and chroot)"
    needs = [("qemu-aarch64-static", "qemu-user-static"), ("update-binfmts", "binfmt-support"),
             ("mmdebstrap", "mmdebstrap"), ("aarch64-linux-gnu-gcc", "gcc-aarch64-linux-gnu"),
             ("clang", "clang"), ("unshare", "util-linux"), ("chroot", "coreutils")]
    for tool, package in needs:
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install {package}; {INSTALL})"
    return binfmt_problem()


def binfmt_problem() -> str | None:
    """Register qemu-aarch64 in binfmt_misc if it is not; a reason it cannot be, or None."""
    folder = Path("/proc/sys/fs/binfmt_misc")
    if not (folder / "register").exists():
        done = subprocess.run(["mount", "-t", "binfmt_misc", "binfmt_misc", str(folder)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            return f"binfmt_misc cannot be mounted: {done.stderr.strip()}"
    entry = folder / "qemu-aarch64"
    if not entry.exists() or not entry.read_text().startswith("enabled"):
        subprocess.run(["update-binfmts", "--enable", "qemu-aarch64"], capture_output=True)
    if not entry.exists() or not entry.read_text().startswith("enabled"):
        return ("qemu-aarch64 is not registered in binfmt_misc (`update-binfmts --enable "
                f"qemu-aarch64`; {INSTALL})")
    return None


def stamp_of(root: Path) -> dict | None:
    try:
        return json.loads((root / STAMP).read_text())
    except (OSError, ValueError):
        return None


def root_ready(root: Path = ROOT) -> bool:
    """The root exists and was built from this RECIPE."""
    return stamp_of(root) == {"recipe": RECIPE}


def apt_mirror() -> str:
    """The Debian mirror apt already uses here (deb822 or one-line sources), else Debian's."""
    sources = Path("/etc/apt/sources.list.d/debian.sources")
    if sources.exists():
        for line in sources.read_text().splitlines():
            if line.startswith("URIs:") and "security" not in line:
                return line.split()[1]
    listed = Path("/etc/apt/sources.list")
    if listed.exists():
        for line in listed.read_text().splitlines():
            fields = line.split()
            if fields[:1] == ["deb"] and "security" not in line:
                return next(f for f in fields[1:] if not f.startswith("["))
    return "http://deb.debian.org/debian"


def mounts_under(path: Path) -> list[str]:
    """The mount points at or below path (from this process's mount table)."""
    prefix = str(path.resolve())
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4].encode().decode("unicode_escape")
            if point == prefix or point.startswith(prefix + "/"):
                found.append(point)
    return found


def remove_tree(path: Path) -> None:
    """Delete path, but never while anything is mounted below it: a bind of /dev there would
    take the host's /dev with it."""
    if not path.exists():
        return
    mounted = mounts_under(path)
    if mounted:
        raise Arm64LabError(f"not deleting {path}: still mounted there: {', '.join(mounted)} "
                            "(unmount them first)")
    shutil.rmtree(path)


@contextlib.contextmanager
def locked(root: Path, exclusive: bool):
    """Builders hold the root's lock alone, users share it: no run sees a half-built root."""
    root.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    fd = os.open(root.parent / f"{root.name}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW,
                 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)


def run_in_root(argv: list[str], timeout: float, root: Path = ROOT, env: dict | None = None,
                cwd: str = "/", log=None) -> subprocess.CompletedProcess:
    """Run argv chrooted in root as root, with the mounts above, and wait for it. Its stdout
    and stderr come back as text (or go to log, a file); past timeout seconds everything it
    started is killed and TimeoutError raised."""
    environment = {"PATH": PATH_IN_ROOT, "HOME": "/root", "LANG": "C.UTF-8", **(env or {})}
    inner = ["/usr/bin/env", "-i", *(f"{k}={v}" for k, v in environment.items()),
             "sh", "-c", 'cd "$0" && exec "$@"', cwd, *argv]
    command = ["unshare", "--mount", "--propagation", "private", "--pid", "--fork",
               "--kill-child", "sh", "-c", MOUNTED_RUN, "mounted-run", str(root), *inner]
    output = {"stdout": log, "stderr": subprocess.STDOUT} if log else \
        {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, text=True,
                               start_new_session=True, **output)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired as e:
        os.killpg(process.pid, signal.SIGKILL)  # unshare: its namespace's processes follow
        stdout, stderr = process.communicate()
        raise TimeoutError(f"{shlex.join(argv)} ran past its {timeout:.0f} s in the arm64 "
                           f"root and was killed; its output:\n{stdout or ''}{stderr or ''}") from e
    return subprocess.CompletedProcess(argv, process.returncode, stdout, stderr)


def checked(argv: list[str], timeout: float, log, **kwargs) -> None:
    """Run argv (on the host, or in the root with root=) and fail naming it if it fails."""
    print(f"arm64lab: {shlex.join(argv)}", file=log, flush=True)
    if "root" in kwargs:
        done = run_in_root(argv, timeout, log=log, **kwargs)
    else:
        done = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, timeout=timeout)
    if done.returncode != 0:
        raise Arm64LabError(f"{shlex.join(argv)} failed ({done.returncode}); see {log.name}")


def build_root(root: Path = ROOT, log=sys.stderr) -> float:
    """Build the root from RECIPE beside root, then put it in root's place; its seconds."""
    started = time.monotonic()
    new = root.with_name(root.name + ".new")
    remove_tree(new)
    extract(new, "arm64", RECIPE["extract"], log)
    complete_extracted(new)
    (new / NATIVE_PYTHON).parent.mkdir(parents=True, exist_ok=True)
    extract(new / NATIVE_PYTHON, "amd64", RECIPE["native"], log)
    install_wheels(new, log)
    version = python_of(new)
    byte_compile(new, [folder.format(version=version) for folder in PYTHON_FOLDERS], log)
    checked(["python3", "-c", f"import {', '.join(RECIPE['pip'])}"], 600, log, root=new)
    (new / STAMP).write_text(json.dumps({"recipe": RECIPE}))
    remove_tree(root)
    new.rename(root)
    return time.monotonic() - started


def extract(into: Path, arch: str, packages: list[str], log) -> None:
    """Unpack RECIPE's suite's packages for arch, with their dependencies, into `into`
    (mmdebstrap --variant=extract: no maintainer script runs)."""
    checked(["mmdebstrap", "--mode=root", "--variant=extract", f"--arch={arch}",
             *(f"--include={name}" for name in packages), RECIPE["suite"], str(into),
             apt_mirror()], 1800, log)


def complete_extracted(root: Path) -> None:
    """What the extracted packages' maintainer scripts would have made that the lab needs: the
    merged-/usr links (base-files ships them in trixie; made here if it did not), and
    /etc/passwd and /etc/group (base-passwd's postinst copies them from its masters)."""
    for name in ("bin", "lib", "sbin"):
        if not (root / name).exists() and not (root / name).is_symlink():
            (root / name).symlink_to(f"usr/{name}")
    for name in ("passwd", "group"):
        if not (root / "etc" / name).exists():
            shutil.copy(root / f"usr/share/base-passwd/{name}.master", root / "etc" / name)


def python_of(root: Path) -> str:
    """The root's Python as "3.13" (/usr/bin/python3 links to python3.13)."""
    return os.readlink(root / "usr/bin/python3").removeprefix("python")


def glibc_minor_of(root: Path) -> int:
    """The 41 of the root's glibc 2.41, read from libc.so.6's banner."""
    found = re.search(rb"release version 2\.(\d+)",
                      (root / "usr/lib/aarch64-linux-gnu/libc.so.6").read_bytes())
    if not found:
        raise Arm64LabError(f"no glibc version in {root}/usr/lib/aarch64-linux-gnu/libc.so.6")
    return int(found.group(1))


def byte_compile(root: Path, folders: list[str], log=None) -> None:
    """Write the .pyc files of folders (paths in root) that the root's Python reads, with the
    native Python of the same version (bytecode is the same on any machine): under emulation
    a compileall of the stdlib and wheels took over 10 minutes here, under load, and each
    Python started in a root without them compiles what it imports."""
    native = root / NATIVE_PYTHON
    libraries = native / "usr/lib/x86_64-linux-gnu"
    # its own loader and glibc (the suite's, maybe newer than the host's); one process
    # (compileall -j starts helpers that would run the binary without its loader)
    python = [str(libraries / "ld-linux-x86-64.so.2"), "--library-path", str(libraries),
              str(native / f"usr/bin/python{python_of(root)}")]
    environment = {"PATH": os.environ.get("PATH", ""), "LANG": "C.UTF-8",
                   "PYTHONHOME": str(native / "usr")}
    # recorded as their paths in the root: -s strips the root, -p puts "/" back
    argv = [*python, "-m", "compileall", "-q", "-s", str(root), "-p", "/",
            *(f"{root}{folder}" for folder in folders)]
    done = subprocess.run(argv, capture_output=True, text=True, env=environment, timeout=900)
    if log:
        print(f"arm64lab: {shlex.join(argv)}\n{done.stdout}{done.stderr}", file=log, end="",
              flush=True)
    if done.returncode != 0:
        raise Arm64LabError(f"byte-compiling {', '.join(folders)} failed ({done.returncode}): "
                            f"{(done.stdout + done.stderr)[-2000:]}")


def install_wheels(root: Path, log) -> None:
    """RECIPE's wheels (and their dependencies) for the root's CPython on aarch64, by the host's
    pip, into a folder on the root Python's sys.path; none compiled (the host's Python is not
    the root's)."""
    version = python_of(root)
    target = root / f"usr/local/lib/python{version}/dist-packages"
    platforms = [f"--platform=manylinux_2_{minor}_aarch64"
                 for minor in range(17, glibc_minor_of(root) + 1)]
    checked([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
             "--no-compile", "--only-binary=:all:", "--target", str(target),
             "--implementation=cp", f"--python-version={version}",
             f"--abi=cp{version.replace('.', '')}", *platforms, *RECIPE["pip"]], 1800, log)


def ensure_root(root: Path = ROOT, log=sys.stderr) -> float:
    """Build the root unless its stamp names this RECIPE; the seconds building took (0: none)."""
    if root_ready(root):
        return 0.0
    with locked(root, exclusive=True):
        if root_ready(root):  # another run built it while this one waited
            return 0.0
        return build_root(root, log)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.harness.arm64lab",
        description=f"Build the arm64 root ({ROOT}) unless it is there, then run one command "
                    "in it, print its output and exit with its status.")
    parser.add_argument("--build", action="store_true",
                        help="build the root (unless its stamp names this recipe) and check it")
    parser.add_argument("--rebuild", action="store_true", help="build the root again anyway")
    parser.add_argument("--timeout", type=float, default=600,
                        help="seconds the command may run (default 600)")
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="the command and its arguments, after --")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not (command or args.build or args.rebuild):
        parser.error("give --build, or a command to run in the root, e.g. -- uname -m")
    reason = why_not_available()
    if reason:
        print(f"arm64lab: cannot run here: {reason}", file=sys.stderr)
        return 2
    try:
        if args.rebuild:
            with locked(ROOT, exclusive=True):
                (ROOT / STAMP).unlink(missing_ok=True)
        seconds = ensure_root()
        built = f"built in {seconds:.0f} s" if seconds else "already built"
        print(f"arm64lab: {ROOT} ({RECIPE['suite']}, recipe {RECIPE['version']}): {built}",
              file=sys.stderr, flush=True)
        if seconds and not command:
            return 0  # the build's last step imported numpy and pytest there
        with locked(ROOT, exclusive=False):
            p = run_in_root(command or ["sh", "-c", "uname -m && python3 -c 'import numpy, "
                                        "pytest; print(numpy.__version__)'"], args.timeout)
    except TimeoutError as e:
        print(f"arm64lab: {e}", file=sys.stderr)
        return 124
    except (Arm64LabError, OSError, subprocess.SubprocessError) as e:
        print(f"arm64lab: {e}", file=sys.stderr)
        return 2
    sys.stdout.write(p.stdout)
    sys.stderr.write(p.stderr)
    return p.returncode


if __name__ == "__main__":
    sys.exit(main())
