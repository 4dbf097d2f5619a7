"""tbrun's standard input reaches rank 0 (or the ranks --stdin names) on every backend, as
with mpirun and torchrun; the other ranks read /dev/null, and end of input is only that."""

import hashlib
import subprocess
import time

import pytest

from ..conftest import TBRUN, tagged_lines, tbrun

# mpi4py's compute-pi demo in miniature: rank 0 reads n, every rank gets it by broadcast.
READ_N = """
import os, sys
import numpy as np
import tbcoll

comm = tbcoll.init()
line = sys.stdin.readline()
n = np.array([int(line) if comm.rank == 0 else 0])
n = comm.broadcast(n, root=0)
rest = sys.stdin.read()  # end of file, not a hang, on every rank
print(f"read {line.strip() or '-'} n {n[0]} rest {len(rest)}")
"""

# (pytest-mpi skips any test with the keyword "mpi" unless --with-mpi: hence the id)
BACKENDS = ["shm", "tcp", "mlx", pytest.param("mpi", id="mpiexec")]


@pytest.mark.parametrize("backend", BACKENDS)
def test_stdin_feeds_rank_0(script, backend):
    p = tbrun("-np", 3, "--backend", backend, script(READ_N), input="100\nmore\n", timeout=90)
    assert p.returncode == 0, p.stdout + p.stderr
    lines = tagged_lines(p.stdout)
    assert lines[0] == ["read 100 n 100 rest 5"]
    assert lines[1] == lines[2] == ["read - n 100 rest 0"]


def test_stdin_all_and_none(script):
    path = script("import os, sys\nprint(repr(sys.stdin.read()))\n")
    p = tbrun("-np", 3, "--stdin", "all", path, input="x\n")
    assert p.returncode == 0, p.stderr
    assert tagged_lines(p.stdout) == {r: ["'x\\n'"] for r in range(3)}
    p = tbrun("-np", 2, "--stdin", "none", path, input="x\n")
    assert tagged_lines(p.stdout) == {r: ["''"] for r in range(2)}
    p = tbrun("-np", 2, "--stdin", "1", path, input="x\n")
    assert tagged_lines(p.stdout) == {0: ["''"], 1: ["'x\\n'"]}


def test_large_input_to_a_slow_reader_arrives_whole(script):
    """More than the pipe and tbrun's high-water mark hold: flow control, nothing lost."""
    path = script("""
        import hashlib, sys, time
        time.sleep(0.5)
        data = sys.stdin.buffer.read()
        print(len(data), hashlib.sha256(data).hexdigest())
    """)
    data = "".join(f"{i:09d}\n" for i in range(400_000))  # 4 MB
    p = tbrun("-np", 2, path, input=data, timeout=60)
    assert p.returncode == 0, p.stderr
    assert tagged_lines(p.stdout)[0] == [f"{len(data)} {hashlib.sha256(data.encode()).hexdigest()}"]


def test_a_rank_that_ignores_stdin_does_not_hold_up_the_job(script):
    p = tbrun("-np", 2, script("print('done')\n"), input="y\n" * 2_000_000, timeout=60)
    assert p.returncode == 0, p.stderr
    assert tagged_lines(p.stdout) == {0: ["done"], 1: ["done"]}


def test_bad_stdin_choice_is_a_usage_error(script):
    p = tbrun("-np", 2, "--stdin", "2", script("pass\n"))
    assert p.returncode == 2
    assert "--stdin 2: give a rank (0..1), all or none" in p.stderr
    p = tbrun("-np", 2, "--backend", "mpi", "--stdin", "all", script("pass\n"))
    assert p.returncode == 2 and "rank 0 only" in p.stderr


def test_an_open_stdin_does_not_keep_a_finished_job(script):
    """The ranks are done while tbrun's stdin (a terminal, a pipe) stays open: tbrun ends at
    once (it used to wait out its 1 s drain for the stdin it still watched)."""
    proc = subprocess.Popen([TBRUN, "-np", "2", str(script("print('done')\n"))],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        lines = [proc.stdout.readline(), proc.stdout.readline()]
        done = time.monotonic()  # both ranks have printed: they are exiting
        assert proc.wait(timeout=30) == 0
        assert time.monotonic() - done < 0.7
    finally:
        proc.stdin.close()
    assert sorted(lines) == ["[0] done\n", "[1] done\n"]


@pytest.mark.parametrize("source", ["file", "device"])
def test_stdin_from_a_file_or_a_device_ends(script, tmp_path, source):
    """`tbrun ... < data.txt`: the ranks read the file to its end and the job ends. macOS's
    kqueue accepts a regular file and never reports its end (the macOS lane's selector does
    the same), so tbrun must read a file (or a device such as /dev/null) without a selector."""
    data = tmp_path / "data.txt"
    data.write_bytes(b"x" * 200_000 + b"\nend\n")
    path = script("import sys\nprint(len(sys.stdin.buffer.read()))\n")
    with open(data if source == "file" else "/dev/null", "rb") as stdin:
        p = subprocess.run([TBRUN, "-np", "2", "--stdin", "all", str(path)], stdin=stdin,
                           capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stdout + p.stderr
    size = str(data.stat().st_size) if source == "file" else "0"
    assert tagged_lines(p.stdout) == {0: [size], 1: [size]}, p.stdout + p.stderr
