"""shm's large all_gather and broadcast read (and write) other ranks' memory in one copy on
Linux, and fall back to the segment's rounds, on every rank alike, where that is refused."""

import os
import sys

import pytest

from .conftest import tagged_lines, tbrun

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="cross-memory attach is Linux's")

# Sizes around a slot (1 MiB): not a multiple of the ranks, of a page, or of a slot.
JOB = """
import errno, sys
import numpy as np
import tbcoll
from tbcoll.shm import native

refuse = sys.argv[1] if len(sys.argv) > 1 else ""
comm = tbcoll.init()
if refuse == str(comm.rank):  # as Yama or seccomp would: this rank's copies are refused
    real = native.atomics
    class Refusing:
        def __getattr__(self, name):
            return getattr(real, name)
        def cma_copy(self, *args):
            return errno.EPERM
    native.atomics = Refusing()
shm = comm._group.native
for nbytes in ((1 << 20) + 12, 3 * (1 << 20) + 8):
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
