"""Fail-fast teardown, exit status, signals and timeouts, checked on real processes."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tbcoll.launch.stdin import frame

from ..conftest import (
    LINUX_RULES,
    TBRUN,
    WRITE_PIDS,
    hydra_topology_files,
    left_behind,
    pid_alive,
    read_pids,
    tagged_lines,
    tbrun,
    wait_for,
)

# Each rank records its pid and a grandchild's pid in PIDDIR (a file that appears whole, by
# rename), then runs the given body; started() counts the ranks that have.
RANK_WITH_CHILD = WRITE_PIDS + """
import glob, os, signal, subprocess, sys, time
piddir, rank = sys.argv[1], int(os.environ["RANK"])
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
write_pids(piddir, rank, os.getpid(), child.pid)
def started():
    return len(glob.glob(os.path.join(piddir, "*.pid")))
{body}
"""


def job_pids(piddir, np):
    return read_pids(piddir, np)


def assert_all_gone(pids):
    wait_for(lambda: not any(map(pid_alive, pids)), 5, f"pids {pids} to end")


def start_job(script, tmp_path, body, *flags, np=3, env=None):
    piddir = tmp_path / "pids"
    piddir.mkdir()
    path = script(RANK_WITH_CHILD.format(body=body))
    proc = subprocess.Popen([TBRUN, "-np", str(np), *flags, str(path), str(piddir)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL, env=env)
    return proc, job_pids(piddir, np)


def finish(proc, timeout=30):
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def test_failing_rank_status_and_teardown_of_everything(script, tmp_path):
    body = """
if rank == 1:
    while started() < 3:
        time.sleep(0.01)
    sys.exit(3)
time.sleep(60)
"""
    started = time.monotonic()
    proc, pids = start_job(script, tmp_path, body, np=3)
    status, _, err = finish(proc)
    assert status == 3
    assert "tbrun: rank 1 (pid" in err and "exited with status 3" in err
    assert "stopping the other 2 ranks" in err
    assert time.monotonic() - started < 20
    assert_all_gone(pids)


def test_rank_killed_by_signal(script):
    path = script("""
        import os, signal, time
        if os.environ["RANK"] == "2":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)
    """)
    p = tbrun("-np", 4, path, timeout=30)
    assert p.returncode == 128 + signal.SIGKILL
    assert "rank 2 (pid" in p.stderr and "was killed by signal 9 (SIGKILL)" in p.stderr


def test_uncaught_exception_ends_the_job(script):
    path = script("""
        import atexit, os, time
        atexit.register(lambda: time.sleep(0.1))  # exit hooks must not hold the job up
        if os.environ["RANK"] == "0":
            raise RuntimeError("boom on rank 0")
        time.sleep(60)
    """)
    p = tbrun("-np", 3, path, timeout=30)
    assert p.returncode == 1
    assert "[0] RuntimeError: boom on rank 0" in p.stderr
    assert "rank 0 (pid" in p.stderr and "exited with status 1" in p.stderr


def test_first_failure_decides_the_status(script):
    path = script("""
        import os, signal, sys, time
        signal.signal(signal.SIGTERM, lambda *a: sys.exit(7))
        if os.environ["RANK"] == "0":
            sys.exit(5)
        time.sleep(60)
    """)
    p = tbrun("-np", 3, path, timeout=30)
    assert p.returncode == 5, p.stderr
    assert p.stderr.count("exited with status") == 1


def test_ranks_that_ignore_sigterm_get_sigkill(script, tmp_path):
    body = """
signal.signal(signal.SIGTERM, signal.SIG_IGN)
if rank == 0:
    while started() < 2:
        time.sleep(0.01)
    sys.exit(1)
time.sleep(60)
"""
    proc, pids = start_job(script, tmp_path, body, "--grace", "0.5", np=2)
    status, _, err = finish(proc)
    assert status == 1
    assert "1 rank still running 0.5 s after SIGTERM; sending SIGKILL" in err
    assert_all_gone(pids)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_to_tbrun_is_forwarded(script, tmp_path, sig):
    body = """
try:
    time.sleep(60)
except KeyboardInterrupt:
    print(f"rank {rank} interrupted")
    sys.exit(0)
"""
    proc, pids = start_job(script, tmp_path, body, np=3)
    proc.send_signal(sig)
    status, out, err = finish(proc)
    assert status == 128 + sig
    assert f"tbrun: got {sig.name}" in err
    if sig == signal.SIGINT:
        assert {r: lines for r, lines in tagged_lines(out).items()} == {
            r: [f"rank {r} interrupted"] for r in range(3)}
    assert_all_gone(pids)


# --timeout counts from tbrun's start, and the ranks must have written their pid files by
# then. A rank tbrun runs directly (Linux) starts one interpreter, then its child's; a wrapped
# rank (macOS, the macOS lane) starts tbcoll.launch.remote's interpreter first: on this
# 2-core machine under load, 0.7-1.0 s to a rank's first line against 1.4-2.4 s wrapped.
JOB_TIMEOUT = "1.5" if LINUX_RULES else "6"


def test_timeout_ends_the_job(script, tmp_path):
    started = time.monotonic()
    proc, pids = start_job(script, tmp_path, "time.sleep(60)", "--timeout", JOB_TIMEOUT, np=2)
    status, _, err = finish(proc)
    assert status == 124
    assert f"job exceeded --timeout {JOB_TIMEOUT} s; stopping 2 ranks" in err
    assert time.monotonic() - started < 15
    assert_all_gone(pids)


def test_a_rank_that_leaves_a_child_behind_does_not_hang_tbrun(script, tmp_path):
    proc, pids = start_job(script, tmp_path, "", np=2)
    status, _, err = finish(proc)
    assert status == 0, err
    assert_all_gone(pids)


# MPICH's shared memory is found by listing /dev/shm (mpich_shm_*) and kept while
# /proc/<pid>/maps shows it mapped (tbcoll.launch.shmclean): a Mac has neither, and what a
# killed MPICH rank leaves there stays (docs/transports.md, On a Mac)
MPICH_SEGMENTS_FOUND = pytest.mark.skipif(
    not LINUX_RULES, reason="MPICH's shared memory is found through /dev/shm and /proc: Linux")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux only")
@pytest.mark.parametrize("backend", [
    "shm", pytest.param("mpi", id="mpiexec", marks=MPICH_SEGMENTS_FOUND)])
def test_a_killed_tbrun_leaves_no_process_and_no_file(script, tmp_path, backend):
    """kill -9 of tbrun: its janitor (tbcoll.launch.janitor) kills every rank's process group,
    what the ranks started included, and removes the job's folder and shared memory."""
    if backend == "mpi":
        pytest.importorskip("mpi4py")
    temp = tmp_path / "tmp"
    temp.mkdir()
    shm = Path("/dev/shm")

    def shared_memory() -> set[Path]:
        return set(shm.iterdir()) if shm.is_dir() else set()

    before, topologies = shared_memory(), hydra_topology_files()
    body = ("import tbcoll, numpy as np\ncomm = tbcoll.init()\ncomm.all_reduce(np.ones(2))\n"
            "open(os.path.join(piddir, f'{rank}.ready'), 'w').close()\ntime.sleep(60)")
    proc, pids = start_job(script, tmp_path, body, "--backend", backend, np=2,
                           env={**os.environ, "TMPDIR": str(temp)})
    wait_for(lambda: len(list((tmp_path / "pids").glob("*.ready"))) == 2, 30,
             "the ranks to have their shared memory")
    os.kill(proc.pid, signal.SIGKILL)
    finish(proc)
    try:
        assert_all_gone(pids)  # the ranks and their children
        wait_for(lambda: not any(temp.iterdir()), 5, "the job's folder to go")
        wait_for(lambda: not left_behind(shared_memory() - before), 5,
                 "the job's shared memory to go")
        wait_for(lambda: not left_behind(hydra_topology_files() - topologies), 5,
                 "Hydra's topology file to go")
    finally:
        for pid in pids:
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)


RANK_THAT_WAITS = WRITE_PIDS + """
import os, sys, time
write_pids(sys.argv[1], os.environ["RANK"], os.getpid())
time.sleep(60)
"""


@pytest.mark.skipif(not LINUX_RULES, reason="PR_SET_PDEATHSIG is Linux only")
def test_ranks_die_with_tbrun_even_when_its_janitor_dies_first(script, tmp_path):
    """kill -9 of tbrun's janitor, then of tbrun: nothing is left to clean up, yet each rank
    ends, by PR_SET_PDEATHSIG (tbcoll.launch.parentdeath)."""
    from tbcoll.launch.reaper import children
    piddir = tmp_path / "pids"
    piddir.mkdir()
    proc = subprocess.Popen([TBRUN, "-np", "2", str(script(RANK_THAT_WAITS)), str(piddir)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL)
    ranks = []
    try:
        ranks = read_pids(piddir, 2)
        janitor = children(proc.pid) - set(ranks)
        assert len(janitor) == 1, (janitor, ranks)
        os.kill(janitor.pop(), signal.SIGKILL)
        os.kill(proc.pid, signal.SIGKILL)
        finish(proc)
        assert_all_gone(ranks)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        kill_leftovers(ranks)


PARENT_OF_ONE = """
import os, subprocess, sys, time
from pathlib import Path
from tbcoll.launch import parentdeath
if sys.argv[1] == "preexec_fn":
    parentdeath.DIE_WITH_PARENT = Path("/no/such/die-with-parent")
argv, hook = parentdeath.tied(["sleep", "60"], os.environ, None)
child = subprocess.Popen(argv, preexec_fn=hook)
print(child.pid, argv[0], flush=True)
time.sleep(60)
"""


@pytest.mark.skipif(not LINUX_RULES, reason="PR_SET_PDEATHSIG is Linux only")
@pytest.mark.parametrize("way", ["die-with-parent", "preexec_fn"])
def test_a_tied_child_dies_with_its_parent(way):
    """Both ways tbrun ties a child to itself: the program built at install, and the
    preexec_fn where it was not built."""
    from tbcoll.launch.parentdeath import DIE_WITH_PARENT
    if way == "die-with-parent" and not os.access(DIE_WITH_PARENT, os.X_OK):
        pytest.skip(f"{DIE_WITH_PARENT} was not built (no C compiler at install?)")
    parent = subprocess.Popen([sys.executable, "-c", PARENT_OF_ONE, way],
                              stdout=subprocess.PIPE, text=True)
    child = None
    try:
        pid, started = parent.stdout.readline().split()
        child = int(pid)
        assert started == (str(DIE_WITH_PARENT) if way == "die-with-parent" else "sleep")
        assert pid_alive(child)
        parent.kill()
        parent.wait()
        assert_all_gone([child])
    finally:
        parent.kill()
        parent.wait()
        kill_leftovers([child] if child else [])


# A rank that leaves four processes outside its process group, each `sleep 1000`: a child in
# a session of its own, a child in a group of its own, a classic double-forked daemon, and a
# child in a session of its own with an empty environment (no TBCOLL_JOB: only its subreaper
# can find it). The rank ends at once ("end") or sleeps ("stay").
RANK_WITH_ESCAPEES = WRITE_PIDS + """
import os, subprocess, sys, time
piddir, rank, then = sys.argv[1], os.environ["RANK"], sys.argv[2]
session = subprocess.Popen(["sleep", "1000"], start_new_session=True)
group = subprocess.Popen(["sleep", "1000"], process_group=0)
bare = subprocess.Popen(["/bin/sleep", "1000"], start_new_session=True, env={})
write_pids(piddir, f"bare-{rank}", bare.pid)
if os.fork() == 0:  # the daemon: fork, setsid, fork again, and the middle one exits
    os.setsid()
    if os.fork() == 0:
        write_pids(piddir, f"daemon-{rank}", os.getpid())
        os.execvp("sleep", ["sleep", "1000"])
    os._exit(0)
os.wait()
deadline = time.monotonic() + 20
while not os.path.exists(os.path.join(piddir, f"daemon-{rank}.pid")):  # it wrote its pid
    assert time.monotonic() < deadline, "the daemon never wrote its pid"
    time.sleep(0.01)
write_pids(piddir, f"rank-{rank}", session.pid, group.pid)
if then == "stay":
    time.sleep(1000)
"""

ESCAPEES_GONE_WITHIN = 5  # seconds


def kill_leftovers(pids):
    for pid in pids:
        if pid_alive(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.skipif(not LINUX_RULES,
                    reason="macOS has no subreaper and no /proc: these processes survive there")
@pytest.mark.parametrize("end", ["normal", "kill -9"])
def test_nothing_a_rank_detached_outlives_the_job(script, tmp_path, end):
    """A session, a process group, a daemon of a rank's own: tbrun is their subreaper and
    kills them when the job ends; after kill -9 of tbrun its janitor finds them by the job's
    cookie (TBCOLL_JOB) in their environment."""
    piddir = tmp_path / "pids"
    piddir.mkdir()
    proc = subprocess.Popen(
        [TBRUN, "-np", "2", str(script(RANK_WITH_ESCAPEES)), str(piddir),
         "end" if end == "normal" else "stay"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    pids = []
    try:
        pids = read_pids(piddir, 6)  # rank-R: session and group children; daemon-R; bare-R
        bare = read_pids(piddir, 6, pattern="bare-*")
        assert len(pids) == 8 and len(bare) == 2
        if end == "kill -9":
            assert all(map(pid_alive, pids))
            os.kill(proc.pid, signal.SIGKILL)
            pids = [pid for pid in pids if pid not in bare]  # nothing can find them then
        ended = time.monotonic()
        status, _, err = finish(proc)
        assert status == (0 if end == "normal" else -signal.SIGKILL), err
        wait_for(lambda: not any(map(pid_alive, pids)), ESCAPEES_GONE_WITHIN,
                 f"the processes the ranks left ({pids}) to end")
        print(f"left-overs gone {time.monotonic() - ended:.3f} s after tbrun ended or was killed")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        kill_leftovers(read_pids(piddir, 6))


@pytest.mark.skipif(not LINUX_RULES, reason="no /proc but on Linux")
def test_the_kernels_list_of_children_is_the_scans():
    from tbcoll.launch.reaper import children, processes
    sleepers = [subprocess.Popen(["sleep", "30"]) for _ in range(2)]
    try:
        scanned = {p.pid for p in processes().values() if p.ppid == os.getpid()}
        listed = children(os.getpid())
        assert listed == scanned and {s.pid for s in sleepers} <= listed
    finally:
        for sleeper in sleepers:
            sleeper.kill()
            sleeper.wait()


@pytest.mark.skipif(not LINUX_RULES, reason="no subreaper but on Linux")
def test_the_subreaper_is_set_alike_by_the_c_module_and_through_ctypes():
    """tbcoll.launch._subreaper (built at install) and the ctypes fallback of
    reaper.set_subreaper: each says what the other set."""
    from tbcoll.launch import reaper
    from tbcoll.launch._subreaper import swap

    before = swap(True)
    try:
        assert reaper._swap_by_ctypes(False) is True
        assert swap(True) is False
        assert reaper._swap_by_ctypes(True) is True
        assert reaper.set_subreaper(False) is True
    finally:
        swap(before)


@pytest.mark.skipif(not LINUX_RULES, reason="no subreaper but on Linux")
def test_tbrun_reaps_the_orphans_it_adopts(script, tmp_path):
    """Short-lived daemons of a rank end as tbrun's children: tbrun reaps them during the
    job, so that no zombie piles up."""
    piddir = tmp_path / "pids"
    piddir.mkdir()
    path = script(WRITE_PIDS + """
import os, sys, time
daemons = []
for _ in range(5):
    reader, writer = os.pipe()
    if os.fork() == 0:  # fork, setsid, fork: the daemon tells its pid and ends
        os.setsid()
        if os.fork() == 0:
            os.write(writer, str(os.getpid()).encode())
            os._exit(0)
        os._exit(0)
    os.close(writer)
    os.wait()
    daemons.append(int(os.read(reader, 32)))
write_pids(sys.argv[1], os.environ["RANK"], *daemons)
time.sleep(1000)
""")
    proc = subprocess.Popen([TBRUN, "-np", "2", str(path), str(piddir)], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        daemons = read_pids(piddir, 2)
        assert len(daemons) == 10
        wait_for(lambda: not any(os.path.exists(f"/proc/{pid}") for pid in daemons), 5,
                 f"tbrun to reap the daemons {daemons}")
        assert proc.poll() is None  # while the job runs
    finally:
        proc.send_signal(signal.SIGTERM)
        finish(proc)


@pytest.mark.skipif(not LINUX_RULES,
                    reason="macOS has no subreaper and no /proc: these processes survive there")
@pytest.mark.parametrize("end", ["normal", "tbrun gone"])
def test_the_rank_wrapper_leaves_nothing_of_its_rank(tmp_path, end):
    """tbcoll.launch.remote (a remote rank's wrapper) is its rank's subreaper: when the rank ends,
    or tbrun goes away, what the rank detached is killed as well."""
    piddir = tmp_path / "pids"
    piddir.mkdir()
    (tmp_path / "rank.py").write_text(RANK_WITH_ESCAPEES)
    wrapper = subprocess.Popen([sys.executable, "-m", "tbcoll.launch.remote"],
                               stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    setup = {"argv": [sys.executable, str(tmp_path / "rank.py"), str(piddir),
                      "end" if end == "normal" else "stay"],
             "cwd": str(tmp_path), "env": {"RANK": "0", "TBCOLL_RANK": "0",
                                           "TBCOLL_JOB": "test-wrapper"}, "defaults": {}}
    pids = []
    try:
        wrapper.stdin.write(json.dumps(setup).encode() + b"\n")
        wrapper.stdin.flush()
        pids = read_pids(piddir, 3)
        if end == "tbrun gone":
            wrapper.stdin.close()  # what a killed tbrun, or a dropped ssh, looks like
        assert wrapper.wait(timeout=20) == (0 if end == "normal" else 128 + signal.SIGKILL)
        wait_for(lambda: not any(map(pid_alive, pids)), ESCAPEES_GONE_WITHIN,
                 f"the processes the rank left ({pids}) to end")
    finally:
        if wrapper.poll() is None:
            wrapper.kill()
            wrapper.wait()
        kill_leftovers(pids)


def start_wrapped(tmp_path, body: str) -> tuple[subprocess.Popen, int]:
    """tbcoll.launch.remote running `body` (which writes its pid to tmp_path/pid) as tbrun runs
    a remote rank, and on macOS a local one; returns the wrapper and the rank's pid."""
    wrapper = subprocess.Popen([sys.executable, "-m", "tbcoll.launch.remote"],
                               stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    setup = {"argv": [sys.executable, "-c", body], "cwd": str(tmp_path), "env": {},
             "defaults": {}, "files": {"MLX_HOSTFILE": "[]"}}
    wrapper.stdin.write(json.dumps(setup).encode() + b"\n")
    wrapper.stdin.flush()
    pidfile = tmp_path / "pid"
    wait_for(pidfile.exists, 20, "the wrapped rank to start")  # written whole, by rename
    return wrapper, int(pidfile.read_text())


RANK = ("import os, signal, sys, time\n"
        "assert open(os.environ['MLX_HOSTFILE']).read() == '[]'\n"
        "signal.signal(signal.SIGTERM, lambda *a: sys.exit(42))\n"
        "open('pid.tmp', 'w').write(str(os.getpid()))\n"
        "os.replace('pid.tmp', 'pid')\n"
        "time.sleep(60)\n")


def test_the_rank_wrapper_passes_signals_and_the_exit_status(tmp_path):
    wrapper, pid = start_wrapped(tmp_path, RANK)
    wrapper.stdin.write(frame("signal", b"TERM"))
    wrapper.stdin.flush()
    assert wrapper.wait(timeout=20) == 42  # the rank's own status, from its SIGTERM handler
    assert not pid_alive(pid)


def test_the_rank_wrapper_kills_the_rank_when_tbrun_is_gone(tmp_path):
    wrapper, pid = start_wrapped(tmp_path, RANK)
    wrapper.stdin.close()  # what a SIGKILLed tbrun (or a dropped ssh connection) looks like
    assert wrapper.wait(timeout=20) == 128 + signal.SIGKILL
    assert not pid_alive(pid)


def test_the_rank_wrapper_names_a_missing_directory(tmp_path):
    wrapper = subprocess.run([sys.executable, "-m", "tbcoll.launch.remote"], capture_output=True,
                             text=True, timeout=30, input=json.dumps(
                                 {"argv": ["true"], "cwd": "/no/such", "env": {},
                                  "defaults": {}}) + "\n")
    assert wrapper.returncode == 2
    assert "working directory /no/such does not exist here" in wrapper.stderr


def test_wrapped_local_ranks_are_torn_down_as_on_macos(tmp_path):
    """Without PR_SET_PDEATHSIG (macOS) local ranks run under tbcoll.launch.remote; here the
    same supervision runs that way on Linux: rank 0 fails, rank 1 ignores SIGTERM, so
    teardown must reach it through the end of its wrapper's stdin."""
    from tbcoll.launch.hosts import remote_setup
    from tbcoll.launch.output import OutputRouter
    from tbcoll.launch.starters.local import WRAPPER as LOCAL_WRAPPER
    from tbcoll.launch.supervisor import RankCommand, Supervisor

    body = ("import os, signal, sys, time\n"
            "open(f'pid{os.environ[\"RANK\"]}', 'w').write(str(os.getpid()))\n"
            "if os.environ['RANK'] == '0':\n    time.sleep(0.5)\n    sys.exit(3)\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(60)\n")
    commands = [RankCommand(rank, LOCAL_WRAPPER, {**os.environ, "RANK": str(rank)},
                            setup=remote_setup([sys.executable, "-c", body], str(tmp_path),
                                               {}, {}, {}))
                for rank in range(2)]
    messages = []
    start = time.monotonic()
    status = Supervisor(commands, OutputRouter(2, True, None), timeout=30, grace=0.5,
                        log=messages.append).run()
    assert status == 3, messages
    assert any("rank 0" in m and "exited with status 3" in m for m in messages)
    assert time.monotonic() - start < 10
    assert not pid_alive(int((tmp_path / "pid1").read_text()))


def test_a_wrapped_rank_reads_tbruns_stdin(tmp_path):
    """Input, signals and the set-up share the wrapper's stdin (framed): the rank reads the
    input and its end, and a signal queued behind input the rank never reads still passes."""
    from tbcoll.launch.hosts import remote_setup
    from tbcoll.launch.output import OutputRouter
    from tbcoll.launch.starters.local import WRAPPER as LOCAL_WRAPPER
    from tbcoll.launch.supervisor import RankCommand, Supervisor

    body = ("import os, sys\n"
            "data = sys.stdin.read()\n"
            "open(f'got{os.environ[\"RANK\"]}', 'w').write(data)\n")
    commands = [RankCommand(rank, LOCAL_WRAPPER, {**os.environ, "RANK": str(rank)},
                            setup=remote_setup([sys.executable, "-c", body], str(tmp_path),
                                               {}, {}, {}, stdin=rank == 0),
                            stdin=rank == 0)
                for rank in range(2)]
    read_end, write_end = os.pipe()
    os.write(write_end, b"line one\nline two\n")
    os.close(write_end)
    status = Supervisor(commands, OutputRouter(2, True, None), timeout=30, grace=0.5,
                        log=print, stdin_fd=read_end).run()
    os.close(read_end)
    assert status == 0
    assert (tmp_path / "got0").read_text() == "line one\nline two\n"
    assert (tmp_path / "got1").read_text() == ""
