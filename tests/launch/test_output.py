"""Rank output: line-buffered, tagged, stdout and stderr kept apart, optional files."""

import os
import subprocess
import time

import pytest
from tbcoll.launch.output import OutputRouter

from ..conftest import TBRUN, WRITE_PIDS, pid_alive, read_pids, tagged_lines, tbrun, wait_for

TWO_STREAMS = """
import os, sys
r = os.environ["RANK"]
print(f"out {r}")
print(f"err {r}", file=sys.stderr)
sys.stdout.write(f"unfinished {r}")
"""


def test_stdout_and_stderr_tagged_and_apart(script):
    p = tbrun("-np", 3, script(TWO_STREAMS))
    assert p.returncode == 0, p.stderr
    assert tagged_lines(p.stdout) == {r: [f"out {r}", f"unfinished {r}"] for r in range(3)}
    assert tagged_lines(p.stderr) == {r: [f"err {r}"] for r in range(3)}


def test_no_tag_output(script):
    p = tbrun("-np", 2, "--no-tag-output", script(TWO_STREAMS))
    assert p.returncode == 0, p.stderr
    assert sorted(p.stdout.splitlines()) == ["out 0", "out 1", "unfinished 0", "unfinished 1"]
    assert sorted(p.stderr.splitlines()) == ["err 0", "err 1"]


def test_long_lines_of_ranks_never_interleave(script):
    path = script("""
        import os
        r = os.environ["RANK"]
        for _ in range(300):
            print(r * 3000)
    """)
    p = tbrun("-np", 4, path)
    assert p.returncode == 0, p.stderr
    lines = tagged_lines(p.stdout)
    assert {r: len(v) for r, v in lines.items()} == {r: 300 for r in range(4)}
    for rank, rank_lines in lines.items():
        assert set(rank_lines) == {str(rank) * 3000}


def test_output_dir_holds_untagged_files(script, tmp_path):
    out_dir = tmp_path / "logs"
    p = tbrun("-np", 2, "--output-dir", out_dir, script(TWO_STREAMS))
    assert p.returncode == 0, p.stderr
    assert "[0] out 0" in p.stdout  # the terminal still gets the output
    for r in range(2):
        assert (out_dir / f"rank-{r}.out").read_text() == f"out {r}\nunfinished {r}"
        assert (out_dir / f"rank-{r}.err").read_text() == f"err {r}\n"


def test_a_partial_line_shows_long_before_its_end(tmp_path):
    """mlx-lm streams tokens with end=""; each word must show while the line goes on."""
    path = tmp_path / "stream.py"
    path.write_text(
        "import sys, time\n"
        "for word in ['The', ' cat', ' sat']:\n"
        "    print(word, end='', flush=True); time.sleep(0.6)\n"
        "print()\n")
    proc = subprocess.Popen([TBRUN, "-np", "1", str(path)], stdout=subprocess.PIPE,
                            stdin=subprocess.DEVNULL)
    start, seen = time.monotonic(), []
    while chunk := os.read(proc.stdout.fileno(), 1024):
        seen.append((time.monotonic() - start, chunk))
    assert proc.wait(timeout=30) == 0
    text = b"".join(c for _, c in seen)
    assert text == b"[0] The cat sat\n"  # tagged once, continued in place
    first = next(t for t, c in seen if b"The" in c)
    end = next(t for t, c in seen if b"\n" in c)
    assert end - first > 1.0  # "The" arrived while the line was still being written


def test_no_tag_output_passes_bytes_at_once(script):
    path = script("""
        import sys, time
        sys.stdout.write("50%\\r"); sys.stdout.flush()
        sys.stdout.write("100%\\n")
    """)
    p = subprocess.run([TBRUN, "-np", "1", "--no-tag-output", str(path)], capture_output=True,
                       stdin=subprocess.DEVNULL, timeout=30)
    assert p.returncode == 0, p.stderr
    assert p.stdout == b"50%\r100%\n"


CHATTY = WRITE_PIDS + """
import os, sys
write_pids(sys.argv[1], os.environ["RANK"], os.getpid())
while True:
    print("chatter from rank", os.environ["RANK"], flush=True)
"""


@pytest.mark.parametrize("stderr", ["apart", "same pipe"])
def test_a_closed_stdout_ends_the_job_as_sigpipe_would(script, tmp_path, stderr):
    """`tbrun -np 2 chatty.py | head -1` (and `2>&1 | head -1`): once the reader is gone
    the job stops, and tbrun exits with 141 (128+SIGPIPE) as a shell pipeline expects."""
    piddir = tmp_path / "pids"
    piddir.mkdir()
    proc = subprocess.Popen(
        [TBRUN, "-np", "2", str(script(CHATTY)), str(piddir)], stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE if stderr == "apart" else subprocess.STDOUT)
    try:
        pids = read_pids(piddir, 2)
        assert proc.stdout.readline().startswith(b"[")  # head -1: one line, then it leaves
        proc.stdout.close()
        closed = time.monotonic()
        status = proc.wait(timeout=20)
        took = time.monotonic() - closed
        err = proc.stderr.read().decode() if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr:
            proc.stderr.close()
    assert status == 128 + 13, err
    assert took < 5
    if stderr == "apart":
        assert err.splitlines() == ["tbrun: standard output was closed; stopping the job"]
    wait_for(lambda: not any(map(pid_alive, pids)), 5, f"ranks {pids} to end")


def test_a_stdout_that_cannot_be_written_ends_the_job_saying_why(script, tmp_path):
    """`tbrun ... > /dev/full`: the first write fails (a full disk); the job stops with
    status 1 and one line naming the error, not a traceback."""
    piddir = tmp_path / "pids"
    piddir.mkdir()
    with open("/dev/full", "w") as full:
        p = subprocess.run([TBRUN, "-np", "2", str(script(CHATTY)), str(piddir)],
                           stdin=subprocess.DEVNULL, stdout=full, stderr=subprocess.PIPE,
                           text=True, timeout=30)
    assert p.returncode == 1, p.stderr
    assert p.stderr.splitlines() == [
        "tbrun: cannot write the ranks' output to standard output (No space left on "
        "device); stopping the job"], p.stderr
    pids = [int(path.read_text()) for path in piddir.glob("*.pid")]  # (those that started)
    assert pids
    wait_for(lambda: not any(map(pid_alive, pids)), 5, f"ranks {pids} to end")


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def route(steps, tag_output=True):
    """Feed (time, rank, bytes) steps to a router on a fake clock, flushing at each step as
    tbrun's loop does; return what reached stdout."""
    clock = FakeClock()
    router = OutputRouter(2, tag_output, None, delay=0.05, clock=clock)
    for at, rank, data in steps:
        clock.now = at
        router.flush_due()
        if data is not None:
            router.write(rank, "out", data)
    router.close()


def test_router_partial_lines_wait_then_continue_untagged(capfd):
    route([(0.0, 0, b"The"), (0.01, 0, None), (0.06, 0, None), (0.2, 0, b" cat"),
           (0.3, 0, b"\n")])
    assert capfd.readouterr().out == "[0] The cat\n"


def test_router_never_mixes_two_ranks_in_a_line(capfd):
    # rank 0's partial line is shown, rank 1 writes a whole line: it waits for rank 0's
    # line to go on, then starts a line of its own; rank 0's continuation is tagged again.
    route([(0.0, 0, b"The"), (0.06, 0, None), (0.07, 1, b"one line\n"), (0.08, 0, None),
           (0.12, 0, None), (0.2, 0, b" cat\n")])
    assert capfd.readouterr().out == "[0] The\n[1] one line\n[0]  cat\n"


def test_router_a_line_in_pieces_stays_whole(capfd):
    # print() writes the text and the newline apart: within the delay nothing is split
    route([(0.0, 0, b"hello"), (0.001, 1, b"world"), (0.002, 1, b"\n"), (0.003, 0, b"\n")])
    assert capfd.readouterr().out == "[1] world\n[0] hello\n"


def test_router_redraws_with_carriage_returns_keep_the_tag(capfd):
    route([(0.0, 0, b"\r 10%|#"), (0.1, 0, None), (0.2, 0, b"\r 20%|##"), (0.3, 0, None),
           (0.4, 0, b"\n")])
    assert capfd.readouterr().out == "\r[0]  10%|#\r[0]  20%|##\n"


def test_router_holds_back_half_a_character(capfd):
    snowman = "☃".encode()
    route([(0.0, 0, b"a" + snowman[:1]), (0.1, 0, None), (0.2, 0, snowman[1:] + b"\n")])
    assert capfd.readouterr().out == "[0] a☃\n"


@pytest.mark.parametrize("how", ["link", "writable by others", "owned by another user"])
def test_output_dir_follows_no_planted_link(script, tmp_path, how):
    out_dir, victim = tmp_path / "out", tmp_path / "victim.txt"
    out_dir.mkdir(mode=0o700)
    victim.write_text("precious")
    (out_dir / "rank-0.out").symlink_to(victim)
    if how == "writable by others":
        out_dir.chmod(0o777)
    elif how == "owned by another user":
        os.chown(out_dir, 65534, 65534)
    p = tbrun("-np", 1, "--output-dir", out_dir, script(TWO_STREAMS))
    assert p.returncode == 2, p.stderr
    assert p.stderr.startswith(f"tbrun: error: --output-dir {out_dir}")
    assert len(p.stderr.splitlines()) == 1
    assert ("a symbolic link" if how == "link" else how) in p.stderr
    assert victim.read_text() == "precious"
