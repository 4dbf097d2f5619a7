"""Threads, as docs/api.md advises them (issue 34): a communicator per thread, each split from
one world, and a non-blocking call's progress thread beside the caller's calls on another
communicator. On tcp and mlx the communicators split from one world share its connections
(and on rdma its queue pairs): every thread must get its own messages, whole, on every
backend, small and large (larger than a socket's buffers, so that sends stall while another
thread waits)."""

from __future__ import annotations

import pytest

from ..conftest import tagged_lines, tbrun
from ..transports.test_rdma import lab_tbrun

THREADS = """
import sys, threading
import numpy as np
import tbcoll

SMALL, LARGE = 8, 1 << 20  # int64s: 64 B, and 8 MiB (past the sockets' 4 MiB buffers)
comm = tbcoll.init()
mode, rounds = sys.argv[1], int(sys.argv[2])
subs = [comm.split(0) for _ in range(2)]
failures = []


def expect(n, i, t, rank):
    return np.arange(n, dtype=np.int64) * (rank + 1) + 1000 * i + 100000 * t


def own_communicator(t):
    sub = subs[t]
    right, left = (sub.rank + 1) % sub.size, (sub.rank - 1) % sub.size
    for i in range(rounds):
        n = LARGE if i % 4 == 3 else SMALL
        mine = expect(n, i, t, sub.rank)
        total = sub.all_reduce(mine)
        assert (total == sum(expect(n, i, t, r) for r in range(sub.size))).all(), (t, i)
        got = np.empty_like(mine)
        if sub.rank % 2 == 0:
            sub.send(mine, right, tag=t)
            sub.recv(got, left, tag=t)
        else:
            sub.recv(got, left, tag=t)
            sub.send(mine, right, tag=t)
        assert (got == expect(n, i, t, left)).all(), (t, i, "from", left)


def overlap(t):
    sub = subs[0]
    for i in range(rounds):
        n = LARGE if i % 4 == 3 else SMALL
        request = comm.iall_reduce(expect(n, i, 0, comm.rank))
        small = sub.all_reduce(expect(SMALL, i, 1, sub.rank))
        assert (small == sum(expect(SMALL, i, 1, r) for r in range(sub.size))).all(), i
        total = request.wait()
        assert (total == sum(expect(n, i, 0, r) for r in range(comm.size))).all(), i


def run(work, t):
    try:
        work(t)
    except BaseException as e:
        failures.append(f"thread {t}: {type(e).__name__}: {e}")


# (what runs, in how many threads); "both": split, then overlap, in one job (a job costs
# seconds to start, ~30 s in the RDMA lab's VM)
MODES = {"split": [(own_communicator, 2)], "overlap": [(overlap, 1)]}
MODES["both"] = MODES["split"] + MODES["overlap"]
for work, count in MODES[mode]:
    threads = [threading.Thread(target=run, args=(work, t)) for t in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
print("FAILED" if failures else "OK", *failures, flush=True)
sys.exit(1 if failures else 0)
"""

BACKENDS = ["shm", "tcp", "mpi", "mlx"]


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("backend", BACKENDS)
def test_threads_get_their_own_messages(script, backend, ranks):
    p = tbrun("--backend", backend, "-np", ranks, "--comm-timeout", 60, script(THREADS),
              "both", 12, timeout=150)
    lines = tagged_lines(p.stdout)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert sorted(lines) == list(range(ranks)), p.stdout
    assert all(rank_lines[-1] == "OK" for rank_lines in lines.values()), p.stdout


def test_threads_over_rdma(rdma_lab, script):
    path = script(THREADS)
    path.chmod(0o644)
    p = lab_tbrun(rdma_lab, path, "both", 8, np=2, timeout=400)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert [lines[-1] for lines in tagged_lines(p.stdout).values()] == ["OK", "OK"], p.stdout
