"""A lost or silent peer becomes a CommError naming it and the collective, never a hang."""

import _posixshmem
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ..conftest import (
    REPO,
    TBRUN,
    left_behind,
    mpich_segments,
    tagged_lines,
    tbcoll_segments,
    tbrun,
    wait_for,
)

MPIEXEC = str(Path(sys.executable).with_name("mpiexec"))

KILLED_MID_ALL_REDUCE = """
import os, signal, sys, numpy as np, tbcoll
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # outlive tbrun's teardown long enough to report
comm = tbcoll.init()
x = np.ones({count}, np.float32)
try:
    for i in range(1000):
        if comm.rank == 1 and i == 5:
            os.kill(os.getpid(), signal.SIGKILL)
        comm.all_reduce(x, algorithm="{algorithm}")
except tbcoll.CommError as e:
    print("CommError:", e)
    sys.exit(17)
"""


def rank_1_was_named(p, lost: str = "") -> dict[int, str]:
    """A KILLED_MID_ALL_REDUCE job's end: tbrun names rank 1 killed, ranks 0 and 2 each report
    one CommError of their all_reduce, starting with lost, and one at least names rank 1.
    Returns each survivor's line."""
    assert p.returncode == 128 + signal.SIGKILL, p.stdout + p.stderr
    assert "rank 1 (pid" in p.stderr and "killed by signal 9" in p.stderr
    reports = tagged_lines(p.stdout)
    assert sorted(reports) == [0, 2], p.stdout + p.stderr
    for rank in (0, 2):
        (line,) = reports[rank]
        assert line.startswith(f"CommError: all_reduce on rank {rank}: {lost}"), line
    assert any("rank 1" in lines[0] for lines in reports.values()), reports
    return {rank: lines[0] for rank, lines in reports.items()}


@pytest.mark.parametrize("backend, algorithm, lost", [
    ("tcp", "ring", "lost connection to rank"), ("tcp", "mesh", "lost connection to rank"),
    ("tcp", "rd", "lost connection to rank"), ("shm", "native", "rank 1 (pid"),
    ("shm", "ring", "lost connection to rank"),
])
def test_rank_killed_mid_all_reduce(script, backend, algorithm, lost):
    started, before = time.monotonic(), tbcoll_segments()
    p = tbrun("-np", 3, "--grace", "10", "--backend", backend,
              script(KILLED_MID_ALL_REDUCE.format(algorithm=algorithm, count=1 << 20)), timeout=60)
    rank_1_was_named(p, lost)
    assert time.monotonic() - started < 30
    assert not left_behind(tbcoll_segments() - before)


def test_rank_killed_on_two_levels_is_named_by_its_world_rank(script):
    """Hosts that are this machine (tests/harness/ssh_here), --map-by node: host 0 runs ranks
    0 and 2, host 1 ranks 1 and 3 (tbcoll.hierarchy). Rank 2 dies mid-all_reduce: tbrun names
    it; rank 0 (its host's other rank) names it by its world rank (it is 1 in the host's own
    group); a rank that only learns of it from the revocation of a rank whose step lost it
    fails naming rank 2 as well (a PeerError, not a bare revocation), so that tbrun never
    takes it for the rank that failed first; and nothing is left behind."""
    started, before = time.monotonic(), tbcoll_segments()
    p = tbrun("--grace", "10", "--ssh", str(REPO / "tests" / "harness" / "ssh_here"),
              "-H", "127.0.0.2:2,127.0.0.3:2", "--map-by", "node", script("""
        import os, signal, sys, time, numpy as np, tbcoll
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # outlive tbrun's teardown to report
        comm = tbcoll.init()
        x = np.ones(1 << 18, np.float32)
        try:
            for i in range(1000):
                if comm.rank == 2 and i == 5:
                    os.kill(os.getpid(), signal.SIGKILL)
                comm.all_reduce(x)
        except tbcoll.PeerError as e:
            print(type(e).__name__, e.peers, e, flush=True)
            time.sleep(2)  # an early exit would end its connections before its notices are read
            sys.exit(17)
    """), timeout=60)
    assert p.returncode == 128 + signal.SIGKILL, p.stdout + p.stderr
    assert "rank 2 (pid" in p.stderr and "killed by signal 9" in p.stderr
    reports = {rank: lines[0] for rank, lines in tagged_lines(p.stdout).items()}
    assert sorted(reports) == [0, 1, 3], p.stdout + p.stderr
    assert reports[0].startswith("PeerLostError (2,) all_reduce on rank 0: rank 2 (pid"), reports
    for rank in (1, 3):
        assert reports[rank].startswith(f"PeerLostError (2,) all_reduce on rank {rank}: "), reports
    assert time.monotonic() - started < 30
    assert not left_behind(tbcoll_segments() - before)


@pytest.mark.parametrize("backend", ["tcp", "shm"])
def test_silent_peer_times_out(script, backend):
    path = script("""
        import time, numpy as np, tbcoll
        comm = tbcoll.init()
        if comm.rank == 1:
            time.sleep(30)
        try:
            comm.all_reduce(np.ones(4))
        except tbcoll.CommError as e:
            print("CommError:", e)
            raise SystemExit(3)
    """)
    started = time.monotonic()
    p = tbrun("-np", 2, "--comm-timeout", "1", "--backend", backend, path, timeout=60)
    assert p.returncode == 3
    assert "[0] CommError: all_reduce on rank 0: timed out after 1 s (TBCOLL_TIMEOUT) " \
           "waiting for rank(s) 1" in p.stdout
    assert time.monotonic() - started < 20


def test_check_mode_names_every_rank_call(script):
    path = script("""
        import numpy as np, tbcoll
        comm = tbcoll.init()
        try:
            if comm.rank == 2:
                comm.broadcast(np.zeros(5, np.float32), root=1)
            else:
                comm.all_reduce(np.zeros((2, 2 + comm.rank), np.float32), op="max")
        except ValueError as e:
            print(e)
        comm.all_reduce(np.zeros(3))  # the communicator is still usable
    """)
    p = tbrun("-np", 3, "-x", "TBCOLL_CHECK=1", path, timeout=60)
    assert p.returncode == 0, p.stderr
    # the default algorithm of a small message on shm: native (its one-call path)
    expected = ("TBCOLL_CHECK: the ranks' calls do not match: "
                "rank 0: all_reduce(float32[2, 2], algorithm=native, op=max); "
                "rank 1: all_reduce(float32[2, 3], algorithm=native, op=max); "
                "rank 2: broadcast(float32[5], algorithm=native, root=1)")
    assert tagged_lines(p.stdout) == {r: [expected] for r in range(3)}


def test_check_mode_compares_the_algorithm(script):
    """ring on one rank against rd on the other used to wait out the whole timeout."""
    path = script("""
        import numpy as np, tbcoll
        comm = tbcoll.init()
        try:
            comm.all_reduce(np.ones(8), algorithm="ring" if comm.rank else "rd")
        except ValueError as e:
            print(e)
    """)
    p = tbrun("-np", 2, "--backend", "tcp", "--comm-timeout", 30, "-x", "TBCOLL_CHECK=1", path,
              timeout=60)
    assert p.returncode == 0, p.stderr
    expected = ("TBCOLL_CHECK: the ranks' calls do not match: "
                "rank 0: all_reduce(float64[8], algorithm=rd, op=sum); "
                "rank 1: all_reduce(float64[8], algorithm=ring, op=sum)")
    assert tagged_lines(p.stdout) == {r: [expected] for r in range(2)}


@pytest.mark.skipif(not Path(MPIEXEC).exists(), reason="mpiexec not installed (tbcoll[mpi])")
def test_mpiexec_ends_a_job_whose_rank_died(script):
    """Through tbrun --backend mpi: mpiexec ends the job, and tbrun removes the shared memory
    MPICH's killed ranks could not (MPICH unlinks it only at MPI_Finalize)."""
    path = script(KILLED_MID_ALL_REDUCE.format(algorithm="native", count=1 << 20))
    before = mpich_segments()
    started = time.monotonic()
    p = tbrun("--backend", "mpi", "-np", 3, path, timeout=60)
    assert p.returncode != 0
    assert time.monotonic() - started < 30
    assert not left_behind(mpich_segments() - before)


# a rank that makes a segment the way the shm transport does, then is killed (or waits for
# tbrun to be) before it unlinks the name
HOLDS_A_SEGMENT = """
import os, signal, time, tbcoll
from tbcoll.job.env import segment_prefix
from tbcoll.transports.shm.segment import Segment
segment = Segment.create_unique(segment_prefix(tbcoll.launch_info().job), 4096)
print("created", segment.name, flush=True)
if "{dies}" == "rank":
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(60)
"""


def segment_exists(name: str) -> bool:
    """Whether the shared memory called name exists (on any OS: no listing of /dev/shm)."""
    try:
        os.close(_posixshmem.shm_open(name, os.O_RDONLY, mode=0o600))
    except FileNotFoundError:
        return False
    return True


def created_segment(line: str) -> str:
    assert line.startswith("[0] created /tbc-"), line
    return line.split()[-1]


def test_tbrun_removes_a_dead_jobs_segments(script):
    """A rank killed while its segment still had its name (between create and unlink): it had
    written the name down in the job's folder (TBCOLL_SHM_NAMES), where tbrun finds it on
    every OS. Under the macOS lane tbrun cannot list /dev/shm, as on a Mac, where the segment
    stayed until reboot."""
    p = tbrun("-np", 1, script(HOLDS_A_SEGMENT.format(dies="rank")), timeout=30)
    assert p.returncode == 128 + signal.SIGKILL, p.stderr
    name = created_segment(p.stdout.splitlines()[0])
    assert not segment_exists(name)


def test_the_janitor_of_a_killed_tbrun_removes_its_jobs_segments(script, tmp_path):
    """kill -9 of tbrun while a rank holds a segment with its name: the janitor kills the rank
    and unlinks the name the rank wrote down, and removes the folder of names."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    proc = subprocess.Popen([TBRUN, "-np", "1", str(script(HOLDS_A_SEGMENT.format(dies="")))],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL, env={**os.environ, "TMPDIR": str(temp)})
    name = None
    try:
        name = created_segment(proc.stdout.readline())
        assert any(p.name.startswith("tbrun-shm-") for p in temp.iterdir())
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)
        wait_for(lambda: not segment_exists(name), 10, f"the janitor to unlink {name}")
        wait_for(lambda: not any(temp.iterdir()), 10, "the folder of names to go")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        if name and segment_exists(name):
            _posixshmem.shm_unlink(name)


def test_a_remote_ranks_wrapper_removes_its_segments(tmp_path):
    """A rank on another host (tbcoll.launch.remote, as tbrun starts it through ssh) writes
    its names down in its wrapper's folder, and the wrapper unlinks what its killed rank
    left: tbrun's own folder is on another host."""
    rank = tmp_path / "rank.py"
    rank.write_text(textwrap.dedent("""
        import os, signal
        from tbcoll.job.env import job_id, segment_prefix
        from tbcoll.transports.shm.segment import Segment
        segment = Segment.create_unique(segment_prefix(job_id(os.environ)), 4096)
        print("[0] created", segment.name, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """))
    setup = {"argv": [sys.executable, str(rank)], "cwd": str(tmp_path), "defaults": {},
             "env": {"TBCOLL_RANK": "0", "TBCOLL_JOB": f"{os.getpid():08x}feed"}}
    environ = {k: v for k, v in os.environ.items() if k != "TBCOLL_SHM_NAMES"}
    wrapper = subprocess.Popen([sys.executable, "-m", "tbcoll.launch.remote"], env=environ,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    wrapper.stdin.write(json.dumps(setup) + "\n")
    wrapper.stdin.flush()  # and kept open: its end would be tbrun's
    try:
        name = created_segment(wrapper.stdout.readline())
        assert wrapper.wait(timeout=30) == 128 + signal.SIGKILL, wrapper.stderr.read()
    finally:
        if wrapper.poll() is None:
            wrapper.kill()
        wrapper.communicate()
    if segment_exists(name):
        _posixshmem.shm_unlink(name)
        raise AssertionError(f"the wrapper left {name}")


@pytest.mark.parametrize("calls, expected", [
    ("comm.all_reduce(np.ones(4 if comm.rank == 0 else 8, np.float32))",
     "rank 0: all_reduce(float32, 16 B, op=sum, algorithm=native); "
     "rank 1: all_reduce(float32, 32 B, op=sum, algorithm=native)"),
    ("comm.barrier() if comm.rank == 0 else comm.all_reduce(np.ones(4))",
     "rank 0: barrier(algorithm=native); rank 1: all_reduce(float64, 32 B, op=sum"),
    ("comm.all_reduce(np.ones((1 << 18) * (1 + comm.rank), np.float32))",
     "rank 0: all_reduce(float32, 1048576 B, op=sum, algorithm=native); "
     "rank 1: all_reduce(float32, 2097152 B"),
    ("comm.all_gather(np.ones(3 + comm.rank, np.int32))",
     "rank 0: all_gather(int32, 12 B, algorithm=native); rank 1: all_gather(int32, 16 B"),
])
def test_shm_catches_mismatched_calls_without_check_mode(script, calls, expected):
    """Without TBCOLL_CHECK, 4 elements against 8 used to give rank 1 [2,2,2,2,1,1,1,1] and
    all_reduce against barrier completed; each call's signature in the segment catches it."""
    path = script(f"""
        import numpy as np, tbcoll
        comm = tbcoll.init()
        try:
            {calls}
        except tbcoll.CommError as e:
            print(e)
    """)
    p = tbrun("-np", 2, "--backend", "shm", "--comm-timeout", 10, path, timeout=60)
    assert p.returncode == 0, p.stderr
    lines = tagged_lines(p.stdout)
    assert sorted(lines) == [0, 1]  # both ranks raised
    for (line,) in lines.values():
        assert "the ranks' calls do not match" in line and expected in line, line


@pytest.mark.parametrize("backend, scale", [
    ("shm", 1), ("shm", 1 << 15),  # messages of 512 KB-2 MB: pulled from the sender on Linux
    ("tcp", 1), pytest.param("mpi", 1, id="mpiexec")])
def test_mismatched_point_to_point_and_a_closed_communicator(script, backend, scale):
    """A message longer or shorter than its receive is a CommError saying so on every
    backend (MPI took a shorter one silently, and named a longer one only by "See the
    MPI_ERROR field"); the streams stay in step after it; a closed communicator says so."""
    path = script(f"""
        import numpy as np, tbcoll
        comm = tbcoll.init()
        for n in (8, 2):  # longer, then shorter than the receive's 4
            try:
                if comm.rank == 0:
                    comm.send(np.ones(n * {scale}), 1)
                else:
                    comm.recv(np.zeros(4 * {scale}), 0)
            except tbcoll.CommError as e:
                print(e)
        comm.all_reduce(np.ones(2))  # still in step
        comm.close()
        try:
            comm.send(np.ones(2), 1 - comm.rank)
        except tbcoll.TbcollError as e:
            print(e)
    """)
    p = tbrun("-np", 2, "--backend", backend, "--comm-timeout", 10, path, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    lines = tagged_lines(p.stdout)
    assert lines[0] == ["send to rank 1 on a closed communicator"]
    longer, shorter, closed = lines[1]
    assert "recv from rank 0 on rank 1:" in longer and "sizes must match" in longer
    assert f"rank 0 sent {16 * scale} bytes where rank 1 expected {32 * scale}" in shorter
    assert closed == "send to rank 0 on a closed communicator"


SEND_TO_ENDED = """
import sys, time, numpy as np, tbcoll
comm = tbcoll.init()
if comm.rank == 1:
    sys.exit(0)  # ends, status 0, without receiving
time.sleep(0.5)
try:
    comm.send(np.ones(50 << 20, np.uint8), 1)  # past any ring's or socket's room
except tbcoll.CommError as e:
    print(f"{type(e).__name__}: {e}", flush=True)
    sys.exit(3)
"""


@pytest.mark.parametrize("backend", ["shm", "tcp", "mlx", pytest.param("mpi", id="mpiexec")])
def test_a_send_to_a_rank_that_ended_fails_naming_it(script, backend):
    """One behaviour, named (issue 34): a send that cannot be done because its receiver has
    ended, whatever its status, fails with PeerLostError saying so; MPI cannot see a peer end,
    so there the wait ends at TBCOLL_TIMEOUT."""
    p = tbrun("-np", 2, "--backend", backend, "--comm-timeout", 4, script(SEND_TO_ENDED),
              timeout=90)
    (line,) = tagged_lines(p.stdout)[0]
    if backend == "mpi":
        assert line.startswith("CommError: send to rank 1 on rank 0: timed out after 4 s"), line
    else:
        assert line.startswith("PeerLostError: send to rank 1 on rank 0: lost connection to "
                               "rank 1 (it ended (exited or crashed)"), line
    assert p.returncode == 3, p.stderr


SMALL_SENDS_TO_ENDED = """
import sys, time, numpy as np, tbcoll
comm = tbcoll.init()
if comm.rank == 1:
    sys.exit(0)  # ends, status 0, without receiving
time.sleep(0.5)
start = time.monotonic()
while time.monotonic() - start < 3:
    try:
        comm.send(np.ones(1), 1)  # 8 B: room for it in any ring or socket buffer
    except tbcoll.CommError as e:
        print(f"{time.monotonic() - start:.2f} s: {type(e).__name__}: {e}", flush=True)
        sys.exit(3)
    time.sleep(0.01)
print("every send returned", flush=True)
"""


@pytest.mark.parametrize("backend", ["shm", "tcp"])
def test_small_sends_to_a_rank_that_ended_fail_naming_it(script, backend):
    """A message that fits the transport's buffers, sent to a rank that has ended: tcp's socket
    says so within a send or two; shm's ring never does, so a send looks at its receiver's
    process every 0.1 s at most (issue 46: shm's returned, again and again)."""
    p = tbrun("-np", 2, "--backend", backend, "--comm-timeout", 10,
              script(SMALL_SENDS_TO_ENDED), timeout=60)
    (line,) = tagged_lines(p.stdout)[0]
    elapsed, _, error = line.partition(" s: ")
    assert error.startswith("PeerLostError: send to rank 1 on rank 0: lost connection to "
                            "rank 1 (it ended (exited or crashed)"), line
    assert float(elapsed) < 2.0, line  # (3 s of sends otherwise; a look is due every 0.1 s)
    assert p.returncode == 3, p.stderr


# a script's alarm, whose handler raises: an interruption in whatever call it lands
USER_ALARM = """

class Alarm(Exception):
    pass


def ring(*_):
    raise Alarm("the user's alarm")


signal.signal(signal.SIGALRM, ring)
"""

INTERRUPTED = """
import signal, sys, time
import numpy as np
import tbcoll
""" + USER_ALARM + """world = tbcoll.init()
rank = world.rank
for case in ("recv", "all_reduce 8 B", "all_reduce 8 MB"):
    sub = world.split(0)
    big = case.endswith("MB")
    data = np.ones(2 << 20 if big else 2, np.float32)
    call = "recv from rank 1" if case == "recv" else "all_reduce"

    def first():
        if case == "recv":
            return sub.recv(np.empty(2, np.float32), 1) if rank == 0 else sub.send(data, 0)
        return sub.all_reduce(data)

    if rank == 0:  # interrupted while it waits for rank 1
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        try:
            first()
            raise SystemExit(f"{case}: not interrupted")
        except Alarm:  # the user's own exception, from the call
            pass
    else:  # late: its first call pairs with the interrupted one (it may complete, or raise)
        time.sleep(0.8)
        try:
            result = first()
            assert case == "recv" or result[0] == 2, result
        except tbcoll.CommRevokedError:
            pass
    for later in (lambda: sub.recv(np.empty(2, np.float32), 1 - rank), sub.barrier,
                  lambda: sub.all_reduce(data), lambda: sub.iall_reduce(data).wait()):
        started = time.monotonic()
        try:
            later()
            raise SystemExit(f"{case}: a later call on rank {rank} went through")
        except tbcoll.CommRevokedError as e:
            took = time.monotonic() - started
            assert f"rank 0 was interrupted in {call} (Alarm)" in str(e), (case, str(e))
            assert took < 1.0, (case, took, str(e))
    sub.close()
    world.barrier()
    print(case, "REVOKED", flush=True)
assert world.all_reduce(np.full(3, rank + 1.0))[0] == 3  # other communicators go on
print("WORLD OK", flush=True)
"""


@pytest.mark.parametrize("backend", ["shm", "tcp", pytest.param("mpi", id="mpiexec")])
def test_an_interrupted_call_revokes_the_communicator_on_every_rank(script, backend):
    """Issue 46: a signal handler's exception (a KeyboardInterrupt, an alarm) in a wait left
    the ranks' calls out of step: a peer's message landed in the abandoned receive, and later
    calls waited out TBCOLL_TIMEOUT blaming a live peer, mismatched, or returned a result of
    another call. Now the interrupted rank gets its exception and every later call on either
    rank raises CommRevokedError at once, naming rank 0 and its call; the world goes on."""
    p = tbrun("-np", 2, "--backend", backend, "--comm-timeout", 30,
              script(INTERRUPTED), timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    lines = tagged_lines(p.stdout)
    for rank in (0, 1):
        assert lines[rank] == ["recv REVOKED", "all_reduce 8 B REVOKED",
                               "all_reduce 8 MB REVOKED", "WORLD OK"], p.stdout + p.stderr


REVOKED_EVERY_CALL = """
import signal
import time

import numpy as np

import tbcoll
from tbcoll.collectives.barrier import Barrier
""" + USER_ALARM + """tbcoll.register_collective(type("Knock", (Barrier,), {"name": "knock"})())
world = tbcoll.init()
rank, peer = world.rank, 1 - world.rank
small, mib, big = np.ones(2, np.float32), np.ones(1 << 18, np.float32), np.ones(1 << 22, np.float32)
CALLS = {
    "all_reduce 8 B": lambda c: c.all_reduce(small),
    "all_reduce 1 MiB": lambda c: c.all_reduce(mib),
    "all_reduce 16 MiB": lambda c: c.all_reduce(big),
    "all_gather": lambda c: c.all_gather(small),
    "broadcast": lambda c: c.broadcast(small, root=0),
    "reduce_scatter": lambda c: c.reduce_scatter(np.ones(4, np.float32)),
    "barrier": lambda c: c.barrier(),
    "all_to_all": lambda c: c.all_to_all(np.ones(4, np.float32)),
    "gather": lambda c: c.gather(small, root=0),
    "scatter": lambda c: c.scatter(np.ones(4, np.float32) if rank == 0 else None, root=0),
    "reduce": lambda c: c.reduce(small, root=0),
    "send": lambda c: c.send(small, peer),
    "recv": lambda c: c.recv(np.empty(2, np.float32), peer),
    "isend": lambda c: c.isend(small, peer),
    "irecv": lambda c: c.irecv(np.empty(2, np.float32), peer),
    "iall_reduce": lambda c: c.iall_reduce(small),
    "iall_gather": lambda c: c.iall_gather(small),
    "ireduce_scatter": lambda c: c.ireduce_scatter(np.ones(4, np.float32)),
    "ibroadcast": lambda c: c.ibroadcast(small, root=0),
    "iall_to_all": lambda c: c.iall_to_all(np.ones(4, np.float32)),
    "icollective": lambda c: c.icollective("knock"),
    "split": lambda c: c.split(0),
    "empty": lambda c: c.empty(4, np.float32),
    "a registered collective": lambda c: c.knock(),
}
wrong = []
for name, call in CALLS.items():
    sub = world.split(0)
    if rank == 0:  # interrupted in a receive that rank 1 never sends: revokes sub
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        try:
            sub.recv(np.empty(2, np.float32), 1)
            raise SystemExit("not interrupted")
        except Alarm:
            pass
    world.barrier()  # (rank 0's notice reaches rank 1 before this barrier's message)
    started = time.monotonic()
    try:
        call(sub)
        wrong.append(f"{name}: went through")
    except tbcoll.CommRevokedError as e:
        if "rank 0 was interrupted in recv from rank 1 (Alarm)" not in str(e):
            wrong.append(f"{name}: {e}")
        if time.monotonic() - started > 0.5:
            wrong.append(f"{name}: raised after {time.monotonic() - started:.2f} s")
    except Exception as e:  # noqa: BLE001
        wrong.append(f"{name}: {type(e).__name__}: {e}")
    sub.close()
    world.barrier()
print("WRONG" if wrong else "ALL REVOKED", "; ".join(wrong), flush=True)
"""


@pytest.mark.parametrize("backend", ["shm", "tcp"])
def test_every_call_on_every_rank_raises_once_revoked(script, backend):
    """Revocation is one flag that every call checks (the gate's, which a peer's notice sets
    through the transport's word, Group.revocation): after rank 0's interrupted receive,
    each public call, made first on a fresh revoked communicator, raises CommRevokedError at
    once on both ranks. Before, rank 1's send, isend, irecv and iall_reduce went through
    (none of them waits, and only waits read the notice)."""
    p = tbrun("-np", 2, "--backend", backend, "--comm-timeout", 20,
              script(REVOKED_EVERY_CALL), timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    lines = tagged_lines(p.stdout)
    for rank in (0, 1):
        assert lines[rank] == ["ALL REVOKED "], p.stdout + p.stderr


def test_a_peer_waiting_in_mlx_on_a_revoked_world_is_ended_saying_why(script):
    """MLX's collectives wait in C, where no signal handler runs: rank 0's alarm lands once
    MLX returns, and revokes all the same; rank 1, whose next call then waits in MLX for rank
    0 (MLX has no timeout), is ended by its watchdog naming rank 0's interrupted call."""
    path = script("""
        import signal, time
        import numpy as np
        import tbcoll

        class Alarm(Exception):
            pass

        def ring(*_):
            raise Alarm()

        signal.signal(signal.SIGALRM, ring)
        comm = tbcoll.init()
        x = np.ones(2, np.float32)
        if comm.rank == 0:
            signal.setitimer(signal.ITIMER_REAL, 0.3)
            try:
                comm.all_reduce(x, algorithm="native")
            except Alarm:
                print("ALARM", flush=True)
            try:
                comm.all_reduce(x, algorithm="native")
            except tbcoll.CommRevokedError:
                print("REVOKED", flush=True)
            time.sleep(60)
        else:
            time.sleep(0.8)
            assert comm.all_reduce(x, algorithm="native")[0] == 2  # paired with rank 0's
            comm.all_reduce(x, algorithm="native")  # waits in MLX for rank 0
    """)
    started = time.monotonic()
    p = tbrun("-np", 2, "--backend", "mlx", "--comm-timeout", 60, path, timeout=120)
    assert tagged_lines(p.stdout)[0] == ["ALARM", "REVOKED"], p.stdout + p.stderr
    assert "[1] tbcoll.CommRevokedError: all_reduce on rank 1: the communicator is revoked: " \
           "rank 0 was interrupted in all_reduce (Alarm)" in p.stderr, p.stderr
    assert p.returncode == 1 and time.monotonic() - started < 40, p.stderr
