"""comm.empty: buffers in shared memory that shm's large all_gather and broadcast copy straight
between, once, on any OS (with cross-memory attach off as on macOS, and on); a rank with an
ordinary array makes every rank fall back; a mismatched request fails on every rank; dropped
buffers give their mappings back; other transports give plain arrays."""

import os
import sys

import pytest

from ..conftest import left_behind, tagged_lines, tbcoll_segments, tbrun

# Each job starts so: its world, and `mapped` counting the looks at a peer's mapped buffer.
COUNTING = """
import numpy as np
import tbcoll

comm = tbcoll.init()
heap = comm._group.native.heap
mapped = 0
peer = heap.peer
def counted(*args):
    global mapped
    mapped += 1
    return peer(*args)
heap.peer = counted
"""

# Sizes around a slot (1 MiB): not a multiple of the ranks, of a page, or of a slot. Each
# result is checked, and so is the path: copies through the mapped peers' buffers or not.
ONE_COPY_JOB = COUNTING + """

def expect(n, k, call):
    return np.arange(n, dtype=np.float32) + 1000 * k + call

for nbytes in ((1 << 20) + 12, 3 * (1 << 20) + 8):
    n = nbytes // 4
    whole = comm.empty(n + 5, np.float32)
    for call, x in enumerate((comm.empty(n, np.float32), whole[3:3 + n])):  # offset 12 B
        x[:] = expect(n, comm.rank, call)
        want = np.concatenate([expect(n, k, call) for k in range(comm.size)])
        assert np.array_equal(comm.all_gather(x), want), (nbytes, call)
        out = np.zeros(comm.size * n, np.float32)
        assert np.array_equal(comm.all_gather(x, out=out), want), (nbytes, call)
        for root in range(comm.size):
            x[:] = expect(n, root, call) if comm.rank == root else 0
            assert comm.broadcast(x, root=root, out=x) is x
            assert np.array_equal(x, expect(n, root, call)), (nbytes, call, root)
print("mapped" if mapped else "not mapped")

# results from comm.empty, x ordinary (fresh each call), or x in place in the result: each
# block is read from its owner's result
mapped, n = 0, (3 << 20) // 4 + 1
out = comm.empty(comm.size * n, np.float32)
for call in range(2):
    want = np.concatenate([expect(n, k, call) for k in range(comm.size)])
    out[:] = 0
    assert comm.all_gather(expect(n, comm.rank, call), out=out) is out
    assert np.array_equal(out, want), call
    out[:] = 0
    mine = out[comm.rank * n:(comm.rank + 1) * n]
    mine[:] = expect(n, comm.rank, call)
    assert np.array_equal(comm.all_gather(mine, out=out), want), call
print("mapped" if mapped else "not mapped")

# rank 1's x is an ordinary array: every rank takes the other paths, with the same results
mapped, n = 0, (3 << 20) // 4
x = comm.empty(n, np.float32)
if comm.rank == 1:
    x = np.empty(n, np.float32)
x[:] = expect(n, comm.rank, 0)
got = comm.all_gather(x)
assert np.array_equal(got, np.concatenate([expect(n, k, 0) for k in range(comm.size)]))
x[:] = expect(n, 0, 1) if comm.rank == 0 else 0
assert np.array_equal(comm.broadcast(x, root=0, out=x), expect(n, 0, 1))
print("mapped" if mapped else "not mapped")
"""


# all_reduce past a slot, out of place and in place, against the slot rounds on ordinary
# arrays: the same bits.
ALL_REDUCE_PART = """
mapped = 0
rng = np.random.default_rng(comm.rank)
for dtype, n, op in ((np.float32, (1 << 18) + 3, "sum"), (np.float16, 600001, "sum"),
                     (np.float64, 140001, "max"), (np.int32, 300001, "prod")):
    data = (rng.standard_normal(n) * 100).astype(dtype)
    want = comm.all_reduce(data.copy(), op=op)  # ordinary arrays: the slot rounds
    x, out = comm.empty(n, dtype), comm.empty(n, dtype)
    x[:] = data
    assert comm.all_reduce(x, op=op, out=out) is out
    assert out.tobytes() == want.tobytes(), (dtype, op)
    assert x.tobytes() == data.tobytes()
    assert comm.all_reduce(x, op=op, out=x) is x  # in place
    assert x.tobytes() == want.tobytes(), (dtype, op, "in place")
print("mapped" if mapped else "not mapped")
mapped = 0
x = comm.empty(n, dtype)
if comm.rank == 1:  # an ordinary array: every rank takes the slot rounds
    x = np.empty(n, dtype)
x[:] = data
assert comm.all_reduce(x, op=op, out=x).tobytes() == want.tobytes()
print("mapped" if mapped else "not mapped")
"""


# one job a case for both (a job costs seconds to start on a busy machine)
EMPTY_BUFFERS_JOB = ONE_COPY_JOB + ALL_REDUCE_PART


@pytest.mark.parametrize(("np_", "cma"), [(2, "0"), (3, "0"), (3, "1")])
def test_collectives_copy_and_reduce_between_empty_buffers(script, np_, cma):
    job, before = script(EMPTY_BUFFERS_JOB), tbcoll_segments()
    result = tbrun("-np", np_, "--backend", "shm", "--comm-timeout", 30, sys.executable, job,
                   env={**os.environ, "TBCOLL_SHM_CMA": cma}, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = tagged_lines(result.stdout)
    assert {rank: lines[rank] for rank in range(np_)} == dict.fromkeys(
        range(np_), ["mapped", "mapped", "not mapped", "mapped", "not mapped"])
    assert not left_behind(tbcoll_segments() - before)


MISMATCH_JOB = """
import numpy as np
import tbcoll

comm = tbcoll.init()
for shape, dtype in (((4, comm.rank + 1), np.float32),
                     (8, np.complex64 if comm.rank == 1 else np.float32)):
    try:
        comm.empty(shape, dtype)
    except (TypeError, ValueError) as e:
        print(type(e).__name__, e)
x = comm.empty((2, 3), np.int32)  # the ranks still agree afterwards
print(x.shape, x.dtype)
"""


def test_mismatched_requests_fail_on_every_rank(script):
    result = tbrun("-np", 3, "--backend", "shm", "--comm-timeout", 20, sys.executable,
                   script(MISMATCH_JOB), timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = tagged_lines(result.stdout)
    shapes = ("ValueError comm.empty is collective: every rank must pass the same shape and "
              "dtype, but rank 0 passed (4, 1) float32, rank 1 passed (4, 2) float32, rank 2 "
              "passed (4, 3) float32")
    invalid = ("ValueError comm.empty is collective: every rank must pass the same shape and "
               "dtype, but rank 0 passed (8,) float32, rank 1 passed an invalid shape or dtype, "
               "rank 2 passed (8,) float32")
    assert lines[0] == lines[2] == [shapes, invalid, "(2, 3) int32"]
    assert lines[1][0] == shapes and lines[1][2] == "(2, 3) int32"
    assert lines[1][1].startswith("TypeError comm.empty: dtype complex64 is not one")


# rank 1 cannot make its segment (a full /dev/shm): every rank says so, and goes on
NO_ROOM_JOB = """
import numpy as np
import tbcoll
from tbcoll.transports.shm import heap, segment

comm = tbcoll.init()
if comm.rank == 1:
    def full(prefix, size):
        raise segment.SegmentSpaceError("no room (as a full /dev/shm)")
    heap.Segment = type("Full", (segment.Segment,), {"create_unique": staticmethod(full)})
try:
    comm.empty(1 << 20, np.uint8)
except tbcoll.TbcollError as e:
    print(e)
heap.Segment = segment.Segment
print(comm.empty(3, np.uint8).shape)
"""


def test_a_rank_without_room_fails_every_rank(script):
    before = tbcoll_segments()
    result = tbrun("-np", 3, "--backend", "shm", "--comm-timeout", 20, sys.executable,
                   script(NO_ROOM_JOB), timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = tagged_lines(result.stdout)
    for rank in range(3):
        assert lines[rank][0].startswith("comm.empty could not share a 1048576-byte buffer "
                                         "per rank: "), lines[rank]
        assert lines[rank][0].endswith("(ranks that could not make theirs: [1])")
        assert lines[rank][1] == "(3,)"
    assert "no room (as a full /dev/shm)" in lines[1][0]
    assert not left_behind(tbcoll_segments() - before)


RELEASE_JOB = """
import gc
import numpy as np
import tbcoll

comm = tbcoll.init()
world = comm._group.native.segment.name

def mappings():
    with open("/proc/self/maps") as f:
        return sum("/tbc-" in line and world not in line for line in f)

before = mappings()
for _ in range(50):
    x = comm.empty(2 << 20, np.uint8)
    view = x[10:20]
    del x
    assert mappings() == before + comm.size, "a view keeps its buffer"
    view[:] = 1
    del view
gc.collect()
assert mappings() == before, (before, mappings())
kept = comm.empty(1 << 20, np.uint8)
comm.close()
assert mappings() == before + 1, "close drops the peers' buffers, not this rank's"
kept[:] = 7
print("released")
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_dropped_buffers_are_unmapped(script):
    before = tbcoll_segments()
    result = tbrun("-np", 2, "--backend", "shm", "--comm-timeout", 20, sys.executable,
                   script(RELEASE_JOB), timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert tagged_lines(result.stdout) == {0: ["released"], 1: ["released"]}
    assert not left_behind(tbcoll_segments() - before)


PLAIN_JOB = """
import numpy as np
import tbcoll

comm = tbcoll.init()
x = comm.empty((3, 1 << 19), np.float32)
x[:] = comm.rank
assert x.flags.owndata and x.shape == (3, 1 << 19) and x.dtype == np.float32
assert comm.all_gather(x).sum() == sum(range(comm.size)) * x.size
print("plain")
"""


@pytest.mark.parametrize("backend", ["tcp", pytest.param("mpi", id="mpiexec")])
def test_other_transports_give_plain_arrays(script, backend):
    result = tbrun("-np", 2, "--backend", backend, sys.executable, script(PLAIN_JOB),
                   timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert tagged_lines(result.stdout) == {0: ["plain"], 1: ["plain"]}
