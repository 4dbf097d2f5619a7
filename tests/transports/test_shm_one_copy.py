"""shm's large all_gather, broadcast and send/recv read (and write) other ranks' memory in one
copy on Linux, and fall back to the segment's rounds or rings, on every rank alike, where that
is refused."""

import os
import sys

import pytest

from ..conftest import tagged_lines, tbrun

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="cross-memory attach is Linux's")

# A job's start: on the rank named by argv[1] every cross-memory copy refused, as a container's
# seccomp policy would refuse it (a filter on the process's threads, made before tbcoll.init
# starts any), then tbcoll.init.
REFUSING = """
import ctypes, errno, os, platform, struct, sys, time
import numpy as np
import tbcoll

def refuse_cross_memory_copies():
    readv, writev = {"x86_64": (310, 311), "aarch64": (270, 271)}[platform.machine()]
    def op(code, jump_true, jump_false, k):
        return struct.pack("HBBI", code, jump_true, jump_false, k)
    code = b"".join([op(0x20, 0, 0, 0),  # load the system call's number
                     op(0x15, 2, 0, readv), op(0x15, 1, 0, writev),  # either: to the last
                     op(0x06, 0, 0, 0x7FFF0000),  # allow
                     op(0x06, 0, 0, 0x00050000 | errno.EPERM)])  # fail with EPERM
    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]
    libc = ctypes.CDLL(None, use_errno=True)
    PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
    program = Program(len(code) // 8, code)
    if (libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 or
            libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(program), 0, 0) != 0):
        raise OSError(ctypes.get_errno(), "seccomp filter refused")

refuse = sys.argv[1] if len(sys.argv) > 1 else ""
if refuse == os.environ["TBCOLL_RANK"]:
    refuse_cross_memory_copies()
comm = tbcoll.init()
"""

# Sizes past all_gather's one-copy threshold (128 KiB) and around a slot (1 MiB): not a
# multiple of the ranks, of a page, or of a slot.
JOB = REFUSING + """
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
    # without the lane (as under TBCOLL_CHECK), native.py's rounds and the lane's copies
    (2, "", {"TBCOLL_CHECK": "1"}, "one copy"), (3, "1", {"TBCOLL_CHECK": "1"}, "rounds"),
])
def test_large_all_gather_and_broadcast(script, np_, refuse, env, path):
    job = script(JOB)
    result = tbrun("-np", np_, "--backend", "shm", sys.executable, job, refuse,
                   env={**os.environ, **env}, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = tagged_lines(result.stdout)
    assert {rank: lines[rank][-1] for rank in range(np_)} == dict.fromkeys(range(np_), path)


# Messages from the pull threshold up, both ranks sending at once, blocking and not.
SEND_RECV_JOB = REFUSING + """
from tbcoll.transports.shm import transport as shm
peer = 1 - comm.rank
for n in (shm.PULL_BYTES // 4, (3 << 20) // 4 + 3):
    def mine(k):
        return np.arange(n, dtype=np.float32) * (k + 1) + 1000 * comm.rank
    def theirs(k):
        return np.arange(n, dtype=np.float32) * (k + 1) + 1000 * peer
    out = np.zeros(n, np.float32)
    if comm.rank == 0:  # one way: the lane's C pull, and where refused the engine's resend
        comm.send(mine(7), peer, tag=5)
    else:
        assert np.array_equal(comm.recv(out, peer, tag=5), theirs(7)), n
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


# Rank 1 started with TBCOLL_SHM_CMA=0 and one core, rank 0 with neither: both must still take
# one protocol for each call (the segment's creator decides for every rank), past 128 KiB
# (the all_gather's one-copy size where the ranks fit the cores) and past a slot (cma).
UNEQUAL_JOB = """
import os, sys
import numpy as np
rank = int(os.environ["TBCOLL_RANK"])
if rank == 1:
    os.environ["TBCOLL_SHM_CMA"] = "0"
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
import tbcoll
comm = tbcoll.init()
for rows in (64 << 10, 512 << 10):  # 256 KiB and 2 MiB of float32 a rank
    x = np.arange(rows, dtype=np.float32) + rank
    got = comm.all_gather(x)
    assert np.array_equal(got, np.concatenate([np.arange(rows, dtype=np.float32) + r
                                               for r in range(comm.size)])), rows
    total = comm.all_reduce(x)
    assert np.array_equal(total, 2 * np.arange(rows, dtype=np.float32) + 1), rows
print("agreed")
"""


def test_ranks_started_with_other_settings_take_one_protocol(script):
    job = script(UNEQUAL_JOB)
    result = tbrun("-np", 2, "--backend", "shm", "--timeout", 60, sys.executable, job,
                   env={**os.environ, "TBCOLL_TIMEOUT": "20"}, timeout=120)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert [lines[-1] for lines in tagged_lines(result.stdout).values()] == ["agreed"] * 2
