"""Failover with replay in a tbrun job (docs/failover.md): under TBCOLL_FAULTS every tcp
stream's first connections are cut at seeded bytes, and the job's collectives and send/recv
still give every result bit for bit, each cut named by a line. With the fault injector's
channels (Python: the C lanes are off) the ends of a connection live in two processes, so a
cut ends the far end's direction only when it reads the cut (tbcoll.transports.stream.faults):
the cuts fall early (span 30000 bytes), where the tails hold everything. With `:c` the real
sockets are shut down both ways, which the C lanes meet, anywhere in the first 400 kB."""

import json
import sys

import pytest

from ..conftest import tagged_lines, tbrun

# Every call checked while connections are cut: all_reduce (8 B to 1 MiB, in place too), send
# and recv in a ring, all_gather; the calls tcp's C lanes (tbcoll/transports/tcp/tcp_lane.c)
# took are counted as tests/transports/test_shm_lane.py counts (a call the lane took returns
# a result): none where Python's cuts turn them off
CUT_LOOP = """
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


lane = None
if comm._routes.lane is not None:
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
took = lane.took if lane else {}
print("wrong:", ", ".join(wrong) or "none", "lane:",
      min(took.get("all_reduce", 0), 20), min(took.get("send", 0), 10),
      min(took.get("recv", 0), 10))
"""


@pytest.mark.parametrize("size", [2, 3])
def test_a_job_whose_connections_are_cut_gives_right_results(script, size):
    """Python's cuts (CutChannel): the C lanes are off, the engine meets every cut."""
    p = tbrun("-np", size, "--backend", "tcp",
              "-x", f"TBCOLL_FAULTS={size}:2:30000", script(CUT_LOOP), timeout=90)
    assert p.returncode == 0, p.stderr
    lines = tagged_lines(p.stdout)
    for rank in range(size):
        assert lines[rank] == ["wrong: none lane: 0 0 0"], p.stdout
    assert p.stderr.count("; now over ") >= size, p.stderr


@pytest.mark.skipif(sys.platform != "linux", reason="SocketCuts relies on Linux resetting "
                    "what comes to a socket shut for reading (BSD acknowledges and drops it)")
@pytest.mark.parametrize("size", [2, 3])
def test_the_c_lanes_meet_real_cuts_and_give_right_results(script, size):
    path = script(CUT_LOOP)
    p = tbrun("-np", size, "--backend", "tcp",
              "-x", f"TBCOLL_FAULTS={size + 4}:3:400000:c", path, timeout=90)
    assert p.returncode == 0, p.stderr
    lines = tagged_lines(p.stdout)
    for rank in range(size):  # every result right, the lanes took most calls
        assert lines[rank] == ["wrong: none lane: 20 10 10"], p.stdout
    said = [line for line in p.stderr.splitlines() if " lost after " in line]  # tbrun's
    assert len(said) >= size * (size - 1) // 2, p.stderr
    assert "exited or crashed" not in p.stderr, p.stderr  # a cut is no peer's end


def test_a_bad_fault_plan_is_named(script):
    path = script("import tbcoll\ntbcoll.init()\n")
    p = tbrun("-np", 2, "--backend", "tcp", "-x", "TBCOLL_FAULTS=soon", path)
    assert p.returncode != 0
    assert "TBCOLL_FAULTS='soon': give seed:cuts:span" in p.stderr


def test_no_failover_sets_the_ranks_contract():
    """tbrun --no-failover gives every rank TBCOLL_FAILOVER=0 (tbcoll.job.env.failover)."""
    show = "import os; print('failover', os.environ.get('TBCOLL_FAILOVER'))"
    p = tbrun("-np", 2, "--no-failover", sys.executable, "-c", show)
    assert p.returncode == 0 and p.stdout.count("failover 0") == 2, p.stdout
    p = tbrun("-np", 2, sys.executable, "-c", show)
    assert p.stdout.count("failover None") == 2, p.stdout


# cuts=1: every stream's first connection is cut once, so each pair of ranks fails over once
# (each end posting its own PathChange); the ranks check what the recorder and describe keep
SAID = """
import numpy as np
import tbcoll
from tbcoll.observability.dumps import snapshot

comm = tbcoll.init()
for n in range(12):
    assert np.array_equal(comm.all_reduce(np.full(8192, n, np.float64)), np.full(8192, 3.0 * n))
    comm.all_gather(np.full(4096, comm.rank, np.int64))
kept = snapshot("test")["failovers"]
peers = sorted({e["peer"] for e in kept})
said = [line for line in comm.describe().splitlines() if "failed over at" in line]
print("recorded", peers, all(e["old"] != e["new"] and e["seconds"] >= 0 for e in kept),
      "described", len(said))
"""


def test_each_failover_is_one_line_of_tbrun_and_kept_by_the_recorder(script, tmp_path):
    trace = tmp_path / "run.json"
    p = tbrun("-np", 3, "--backend", "tcp", "--trace", trace, "-x", "TBCOLL_FAULTS=4:1:30000",
              script(SAID), timeout=90)
    assert p.returncode == 0, p.stderr
    for rank, lines in tagged_lines(p.stdout).items():
        others = [r for r in range(3) if r != rank]
        assert lines == [f"recorded {others} True described 2"], p.stdout
    said = [line for line in p.stderr.splitlines() if " lost after " in line]
    for pair in ("rank 0 <-> rank 1", "rank 0 <-> rank 2", "rank 1 <-> rank 2"):
        assert [line for line in said if line.startswith(f"tbrun: {pair}:")].__len__() == 1, \
            p.stderr
    assert len(said) == 3 and all("; now over " in line for line in said), p.stderr
    assert "exited or crashed" not in p.stderr, p.stderr  # a cut is no peer's end
    spans = [e for e in json.loads(trace.read_text())["traceEvents"] if e.get("cat") ==
             "failover"]
    assert {e["pid"] for e in spans} == {0, 1, 2} and all(e["dur"] >= 0 for e in spans), spans


# np 3, --keep-going: a loop of all_reduce until a rank fails (the rank given, if one, dies at
# the 6th); the others shrink and go on
SURVIVE = """
import os
import sys
import numpy as np
import tbcoll

comm = tbcoll.init()
dies = int(sys.argv[1]) if len(sys.argv) > 1 else None
try:
    for n in range(40):
        if n == 5 and comm.rank == dies:
            os._exit(3)
        comm.all_reduce(np.ones(5000))
    print("no failure seen")
except (tbcoll.RankFailedError, tbcoll.CommRevokedError):
    comm.revoke()
    survivors = comm.shrink()
    print("shrunk", survivors.size, survivors.all_reduce(np.array([comm.rank + 1.0])).tolist())
"""


def test_a_split_under_keep_going_fails_the_higher_rank_and_the_others_shrink(script):
    """Ranks 0 and 1 have no path left once their connection is cut (a split): tbrun fails
    the higher (1), the others shrink and go on."""
    p = tbrun("--keep-going", "-np", 3, "--backend", "tcp",
              "-x", "TBCOLL_FAULTS=3:1:30000:0-1", script(SURVIVE), timeout=90)
    assert p.returncode == 137, p.stderr  # the first failure's: rank 1, killed
    lines = tagged_lines(p.stdout)
    assert lines.get(0) == lines.get(2) == ["shrunk 2 [4.0]"] and 1 not in lines, p.stdout
    assert ("rank 0 and rank 1 have no path left between them (a split, --keep-going): rank 1 "
            "is failed") in p.stderr, p.stderr


def test_a_pair_of_hosts_fails_over_as_one_line():
    """Every pair of ranks between two hosts (one per rail), each seen from both ends: one
    line, from the lowest pair's view, the slowest end's seconds, the bytes summed."""
    from tbcoll.launch.failovers import FailoverLines

    from tbcoll.job.pathevents import PathChange

    class Store:
        def divert(self, prefix, sink):
            pass

    said = []
    lines = FailoverLines(Store(), [("mac1", (0, 1)), ("mac2", (2, 3))], said.append)
    told = "mac1 <-> mac2: cable 1 failed, found by rank 0 (the connection ended)"
    for rank, peer, seconds, why in ((0, 2, 0.3, None), (2, 0, 0.4, None), (1, 3, 0.9, told),
                                     (3, 1, 0.25, told)):
        # (1, 3) was told of the failure: though its seconds run from earlier, it is no view
        change = PathChange(rank, peer, 1, "cable 1 (10.212.1.2)", "management (10.211.0.12)",
                            why or "the connection ended", 100, seconds, told=why is not None)
        lines._take(b"", change.encode())
    lines._take(b"", b"not json")
    lines.close()
    assert len(said) == 1, said
    assert said[0].startswith("mac1 <-> mac2: cable 1 (10.212.1.2) lost after "), said
    assert said[0].endswith("; now over management (10.211.0.12), 0.4 s (the connection ended; "
                            "400 bytes sent again; 2 pairs of ranks moved)"), said


def test_a_peer_that_died_ends_its_failovers_once_tbrun_declares_it(script):
    """Rank 2 dies under failover: its peers' reconnects end once tbrun declares it, not
    after --comm-timeout (60 s here)."""
    p = tbrun("--keep-going", "-np", 3, "--backend", "tcp", "--comm-timeout", 60,
              "-x", "TBCOLL_FAILOVER=1", script(SURVIVE), "2", timeout=30)
    assert p.returncode == 3, p.stderr
    lines = tagged_lines(p.stdout)
    assert lines.get(0) == lines.get(1) == ["shrunk 2 [3.0]"], p.stdout + p.stderr
