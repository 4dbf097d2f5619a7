"""Failover with replay in a tbrun job (docs/failover.md): under TBCOLL_FAULTS every tcp
stream's first connections are cut at seeded bytes, and the job's collectives and send/recv
still give every result bit for bit, each cut named by a line. With the fault injector's
channels (Python: the C lanes are off) the ends of a connection live in two processes, so a
cut ends the far end's direction only when it reads the cut (tbcoll.transports.stream.faults):
the cuts fall early (span 30000 bytes), where the tails hold everything. With `:c` the real
sockets are shut down both ways, which the C lanes meet, anywhere in the first 400 kB."""

import sys

import pytest

from ..conftest import tagged_lines, tbrun

LOOP = """
import numpy as np
import tbcoll

comm = tbcoll.init()
rank, size = comm.rank, comm.size
wrong = []
for n, count in enumerate([1, 3, 1000, 8192, 1, 20000, 5, 65536, 2] * 3):
    x = np.arange(count, dtype=np.float64) * (rank + 1) + n
    total = comm.all_reduce(x)
    expected = np.arange(count, dtype=np.float64) * (size * (size + 1) // 2) + n * size
    if not np.array_equal(total, expected):
        wrong.append(f"all_reduce {n}")
    right, left = (rank + 1) % size, (rank - 1) % size
    got = np.empty(count, np.int64)
    if rank % 2 == 0:
        comm.send(np.full(count, rank * 1000 + n, np.int64), right)
        comm.recv(got, left)
    else:
        comm.recv(got, left)
        comm.send(np.full(count, rank * 1000 + n, np.int64), right)
    if not np.array_equal(got, np.full(count, left * 1000 + n, np.int64)):
        wrong.append(f"recv {n}")
gathered = comm.all_gather(np.array([rank], np.int64))
comm.barrier()
print("wrong:", ", ".join(wrong) or "none", gathered.ravel().tolist())
"""


@pytest.mark.parametrize("size", [2, 3])
def test_a_job_whose_connections_are_cut_gives_right_results(script, size):
    path = script(LOOP)
    p = tbrun("-np", size, "--backend", "tcp",
              "-x", f"TBCOLL_FAULTS={size}:2:30000", path, timeout=90)
    assert p.returncode == 0, p.stderr
    lines = tagged_lines(p.stdout)
    for rank in range(size):
        assert lines[rank] == [f"wrong: none {list(range(size))}"], p.stdout
    assert p.stderr.count("failed over to") >= size, p.stderr


# The C lanes (tbcoll/transports/tcp/tcp_lane.c) run the job's all_reduce (8 B to 1 MiB, the
# exchange), send and recv while the real sockets are cut: counted as
# tests/transports/test_shm_lane.py counts (a call the lane took returns a result)
C_LANES = """
import sys
import numpy as np
import tbcoll

comm = tbcoll.init()
rank, size = comm.rank, comm.size


class Counting:
    def __init__(self, lane):
        self.lane, self.took = lane, {}

    def __getattr__(self, name):
        method = getattr(self.lane, name)
        if name not in ("all_reduce", "send", "recv"):
            return method

        def call(*args):
            result = method(*args)
            if result is not None:
                self.took[name] = self.took.get(name, 0) + 1
            return result
        return call


if comm._routes.lane is None:
    print("no lane")
    sys.exit()
comm._routes.lane = lane = Counting(comm._routes.lane)
comm._bind()
wrong = []
counts = [1, 3, 1000, 8192, 1, 20000, 5, 65536, 2, 131072]
for n in range(40):
    count = counts[n % len(counts)]
    expected = np.arange(count, dtype=np.float64) * (size * (size + 1) // 2) + n * size
    x = np.arange(count, dtype=np.float64) * (rank + 1) + n
    if not np.array_equal(comm.all_reduce(x), expected):
        wrong.append(f"all_reduce {n}")
    comm.all_reduce(x, out=x)  # in place: a tail keeps what went, not the sum
    if not np.array_equal(x, expected):
        wrong.append(f"in place {n}")
    right, left = (rank + 1) % size, (rank - 1) % size
    got = np.empty(count, np.int64)
    if rank % 2 == 0:
        comm.send(np.full(count, rank * 1000 + n, np.int64), right)
        comm.recv(got, left)
    else:
        comm.recv(got, left)
        comm.send(np.full(count, rank * 1000 + n, np.int64), right)
    if not np.array_equal(got, np.full(count, left * 1000 + n, np.int64)):
        wrong.append(f"recv {n}")
    gathered = comm.all_gather(np.full(count % 7 + 1, rank + n, np.int64))
    if not np.array_equal(gathered.ravel(), np.repeat(np.arange(size) + n, count % 7 + 1)):
        wrong.append(f"all_gather {n}")
comm.barrier()
took = lane.took
print("wrong:", ", ".join(wrong) or "none", "lane:",
      min(took.get("all_reduce", 0), 20), min(took.get("send", 0), 10),
      min(took.get("recv", 0), 10))
"""


@pytest.mark.skipif(sys.platform != "linux", reason="SocketCuts relies on Linux resetting "
                    "what comes to a socket shut for reading (BSD acknowledges and drops it)")
@pytest.mark.parametrize("size", [2, 3])
def test_the_c_lanes_meet_real_cuts_and_give_right_results(script, size):
    path = script(C_LANES)
    p = tbrun("-np", size, "--backend", "tcp",
              "-x", f"TBCOLL_FAULTS={size + 4}:3:400000:c", path, timeout=90)
    assert p.returncode == 0, p.stderr
    lines = tagged_lines(p.stdout)
    for rank in range(size):  # every result right, the lanes took most calls
        assert lines[rank] == ["wrong: none lane: 20 10 10"], p.stdout
    assert p.stderr.count("failed over to") >= 2 * size, p.stderr


def test_a_bad_fault_plan_is_named(script):
    path = script("import tbcoll\ntbcoll.init()\n")
    p = tbrun("-np", 2, "--backend", "tcp", "-x", "TBCOLL_FAULTS=soon", path)
    assert p.returncode != 0
    assert "TBCOLL_FAULTS='soon': give seed:cuts:span" in p.stderr


def test_no_failover_sets_the_ranks_contract():
    """tbrun --no-failover gives every rank TBCOLL_FAILOVER=0 (tbcoll.job.env.failover)."""
    p = tbrun("--dry-run", "-np", 2, "--no-failover", sys.executable, "-c", "pass")
    assert p.returncode == 0 and p.stdout.count("TBCOLL_FAILOVER=0") == 2, p.stdout
    p = tbrun("--dry-run", "-np", 2, sys.executable, "-c", "pass")
    assert "TBCOLL_FAILOVER" not in p.stdout
