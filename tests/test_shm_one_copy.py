"""shm's large all_gather, broadcast and send/recv read (and write) other ranks' memory in one
copy on Linux, and fall back to the segment's rounds or rings, on every rank alike, where that
is refused."""

import os
import sys

import pytest

from .conftest import tagged_lines, tbrun

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="cross-memory attach is Linux's")

# A job's start: tbcoll.init, then on the rank named by argv[1] every cross-memory copy of
# {module} refused, as Yama or seccomp would refuse it.
REFUSING = """
import errno, sys, time
import numpy as np
import tbcoll
from {package} import {module}

refuse = sys.argv[1] if len(sys.argv) > 1 else ""
comm = tbcoll.init()
if refuse == str(comm.rank):
    real = {module}.atomics
    class Refusing:
        def __getattr__(self, name):
            return getattr(real, name)
        def cma_copy(self, *args):
            return errno.EPERM
    {module}.atomics = Refusing()
"""

# Sizes past all_gather's one-copy threshold (128 KiB) and around a slot (1 MiB): not a
# multiple of the ranks, of a page, or of a slot.
JOB = REFUSING.format(package="tbcoll.shm", module="native") + """
shm = comm._group.native
for nbytes in ((256 << 10) + 12, (1 << 20) + 12, 3 * (1 << 20) + 8):
    n = nbytes // 4
    for call in range(2):  # the second call after a refusal takes the rounds from the start
        mine = np.arange(n, dtype=np.float32) + 1000 * comm.rank + call
        got = comm.all_gather(mine)
        want = np.concatenate([np.arange(n, dtype=np.float32) + 1000 * k + call
                               for k in range(comm.size)])
        assert np.array_equal(got, want), (nbytes, call)
        out = np.zeros(n, np.float32)
        for root in range(comm.size):
            x = np.arange(n, dtype=np.float32) * (root + 1) if comm.rank == root else out
            got = comm.broadcast(x, root=root, out=out)
            assert got is out and np.array_equal(out, np.arange(n, dtype=np.float32) * (root + 1))
print("one copy" if shm._cma else "rounds")
"""


@pytest.mark.parametrize(("np_", "refuse", "env", "path"), [
    (2, "", {}, "one copy"), (3, "", {}, "one copy"),
    (3, "1", {}, "rounds"),  # one rank refused: every rank falls back
    (2, "", {"TBCOLL_SHM_CMA": "0"}, "rounds"),
])
def test_large_all_gather_and_broadcast(script, np_, refuse, env, path):
    job = script(JOB)
    result = tbrun("-np", np_, "--backend", "shm", sys.executable, job, refuse,
                   env={**os.environ, **env}, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = tagged_lines(result.stdout)
    assert {rank: lines[rank][-1] for rank in range(np_)} == dict.fromkeys(range(np_), path)


# Messages from the pull threshold up, both ranks sending at once, blocking and not.
SEND_RECV_JOB = REFUSING.format(package="tbcoll.transports", module="shm") + """
peer = 1 - comm.rank
for n in (shm.PULL_BYTES // 4, (3 << 20) // 4 + 3):
    def mine(k):
        return np.arange(n, dtype=np.float32) * (k + 1) + 1000 * comm.rank
    def theirs(k):
        return np.arange(n, dtype=np.float32) * (k + 1) + 1000 * peer
    out = np.zeros(n, np.float32)
    comm.send(mine(0), peer, tag=1)  # both at once, before either receives
    assert np.array_equal(comm.recv(out, peer, tag=1), theirs(0)), n
    # non-overtaking per tag: tags 2, 3, 2, 3 sent, tag 3 received first, each in its order
    outs = [np.zeros(n, np.float32) for _ in range(4)]
    receives = [comm.irecv(outs[k], peer, tag=3) for k in (1, 3)]
    receives += [comm.irecv(outs[k], peer, tag=2) for k in (0, 2)]
    sends = [comm.isend(mine(k), peer, tag=2 + k % 2) for k in range(4)]
    tbcoll.wait_all(receives + sends)
    for k in range(4):
        assert np.array_equal(outs[k], theirs(k)), (n, k)
    # a send is done only once its buffer has been read: changing it then changes nothing
    if comm.rank == 0:
        x = mine(5)
        comm.isend(x, 1, tag=4).wait()
        x[:] = -1
    else:
        time.sleep(0.2)
        assert np.array_equal(comm.recv(out, 0, tag=4), theirs(5)), n
print("pulled" if comm._group._stream.peer(peer).pulls else "ring")
"""


@pytest.mark.parametrize(("refuse", "env", "path"), [
    ("", {}, "pulled"),
    ("1", {}, "ring"),  # refused on one rank: both go on through the ring
    ("", {"TBCOLL_SHM_CMA": "0"}, "ring"),
])
def test_large_send_recv(script, refuse, env, path):
    job = script(SEND_RECV_JOB)
    result = tbrun("-np", 2, "--backend", "shm", "--comm-timeout", 20, sys.executable, job,
                   refuse, env={**os.environ, **env}, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = tagged_lines(result.stdout)
    assert {rank: lines[rank][-1] for rank in range(2)} == dict.fromkeys(range(2), path)
