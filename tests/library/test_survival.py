"""Surviving lost ranks (docs/failures.md): under tbrun --keep-going the survivors of a
SIGKILL or a SIGSTOP, at seeded points (before a call, inside one, inside the recovery's agree
or shrink), revoke, agree, shrink and go on with every result right (tests/harness/
survivor_job.py checks each); comm.revoke() reaches every rank's pending call; agree and shrink
refuse where they cannot work."""

from __future__ import annotations

import re

import pytest

from ..conftest import REPO, left_behind, tagged_lines, tbcoll_segments, tbrun
from ..harness.survivor_job import plan

JOB = REPO / "tests" / "harness" / "survivor_job.py"
SSH_HERE = REPO / "tests" / "harness" / "ssh_here"
SURVIVED = re.compile(r"survived (\d+) ([\d,]+) (\d+):(\d+) (\d+):(\d+)$")


def survive(np_: int, seed: int, deaths: int, how: str, *flags: str,
            timeout: float = 120) -> dict[int, re.Match]:
    """Run the job under tbrun --keep-going and check it (survived): no segment left."""
    before = tbcoll_segments()
    p = tbrun("--keep-going", "--comm-timeout", "3", "-np", np_, *flags, JOB, seed, deaths,
              how, timeout=timeout)
    survivors = survived(p, np_, seed, deaths)
    assert not left_behind(tbcoll_segments() - before)
    return survivors


def survived(p, np_: int, seed: int, deaths: int) -> dict[int, re.Match]:
    """Check that the job said a rank died (its status and tbrun's lines), that the ranks
    planned to die did and every other went on to the end over the same survivors, with
    descriptors flat; return each survivor's last line."""
    victims = set(plan(seed, deaths, np_))  # (the job's own plan: world rank -> step, where)
    out = p.stdout + p.stderr
    assert p.returncode == 137, out[-4000:]  # SIGKILL: its own, or tbrun's for a frozen rank
    lines = tagged_lines(p.stdout)
    ended = {rank: SURVIVED.search(got[-1]) for rank, got in lines.items() if got}
    survivors = {rank: m for rank, m in ended.items() if m}
    assert set(survivors) == set(range(np_)) - victims, out[-4000:]
    for rank, m in survivors.items():
        size, world, first_fds, _, last_fds, _ = m.groups()
        assert int(size) == np_ - deaths and world == ",".join(map(str, sorted(survivors))), m
        assert int(last_fds) <= int(first_fds) + 1, (rank, m.group(0))
    for victim in victims:
        # (a rank on another host, through its wrapper: "exited with status 137")
        assert re.search(rf"rank {victim}\b.*(killed|frozen|status 137)", out), out[-3000:]
    return survivors


# (np, seed, deaths, how, backend): seeds chosen so that, with the two jobs below, the deaths
# fall before and inside a call of every kind and inside agree and shrink
# (test_the_seeds_cover_every_kind_of_call_and_every_place)
CASES = [
    (4, 20, 2, "kill", "shm"),  # inside a gather, then inside shrink
    (4, 52, 2, "kill", "tcp"),  # inside a broadcast, then inside agree
    (3, 7, 1, "stop", "tcp"),   # frozen inside an all_gather: found past --comm-timeout, killed
    (3, 5, 1, "stop", "shm"),   # frozen inside a scatter
]
EIGHT = (8, 390, 6)  # all_reduce, barrier, all_to_all, reduce, a ring of send/recv, split
TWO_LEVELS = (4, 47, 1)  # world rank 2, a host's leader, inside a reduce_scatter


@pytest.mark.parametrize("np_, seed, deaths, how, backend", CASES)
def test_survivors_go_on_with_every_result_right(np_, seed, deaths, how, backend):
    survive(np_, seed, deaths, how, "--backend", backend)


def test_eight_ranks_shrink_step_by_step_to_two():
    """Six deaths in one job, one after the other and some inside the recovery from the one
    before: descriptors flat, resident memory too, no segment left."""
    for m in survive(*EIGHT, "kill", "--backend", "shm", timeout=180).values():
        first_mib, last_mib = int(m.group(4)), int(m.group(6))
        assert last_mib <= first_mib + 16, m.group(0)


def test_a_hosts_leader_dies_in_a_job_of_two_levels():
    """Two "hosts" of two ranks (loopback addresses through a stand-in for ssh): world rank 2,
    the second host's leader, dies; the survivors' shrunk communicator has two levels again
    (ranks 0 and 1 share a host, rank 3 has one of its own)."""
    assert set(plan(*TWO_LEVELS[1:], TWO_LEVELS[0])) == {2}
    survive(*TWO_LEVELS, "kill", "--backend", "tcp", "--ssh", SSH_HERE,
            "-H", "127.0.0.2:2,127.0.0.3:2")


REVOKE = """
import time, numpy as np, tbcoll
comm = tbcoll.init()
comm.barrier()
if comm.rank == 0:
    time.sleep(0.5)
    comm.revoke()
try:
    started = time.monotonic()
    comm.all_reduce(np.ones(1 << 16))
    print("no error")
except tbcoll.CommRevokedError as e:
    print(f"revoked after {time.monotonic() - started:.2f} s: {e}")
print("agreed", comm.agree(comm.rank != 1), flush=True)
"""


def test_revoke_reaches_every_pending_call_and_agree_ands_the_flags(script):
    p = tbrun("--keep-going", "-np", 3, script(REVOKE), timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    lines = tagged_lines(p.stdout)
    assert set(lines) == {0, 1, 2}
    for rank, got in lines.items():
        assert got[-1] == "agreed False", (rank, got)
        assert "revoked it" in got[0], got
        if rank:  # waiting for rank 0 since ~0.5 s: released within a second of its revoke
            assert float(re.search(r"after ([\d.]+) s", got[0]).group(1)) < 1.5, got[0]


# A chain through another communicator: rank 1 stops; rank 0 waits on it in the parent (a
# recv), rank 2 on rank 0 in their sub-communicator (evens). Rank 0 answers tbrun, so it is
# not failed; once rank 1 is, rank 2's sub-communicator is revoked, not left to time out.
CHAIN = """
import os, signal
import numpy as np
import tbcoll
comm = tbcoll.init()
sub = comm.split(comm.rank % 2)
try:
    if comm.rank == 1:
        os.kill(os.getpid(), signal.SIGSTOP)
    elif comm.rank == 0:
        comm.recv(np.empty(2), 1)
    else:
        sub.all_reduce(np.ones(2))
except (tbcoll.RankFailedError, tbcoll.CommRevokedError) as e:
    print(type(e).__name__, e, flush=True)
comm.revoke()
comm.agree(True)
survivors = comm.shrink()
print("shrunk", survivors.size, survivors.all_reduce(np.array([comm.rank + 1.0])).tolist())
"""


def test_a_wait_on_a_rank_that_waits_on_a_failed_one_elsewhere_is_revoked(script):
    p = tbrun("--keep-going", "--comm-timeout", 2, "-np", 3, "--backend", "tcp",
              script(CHAIN), timeout=60)
    assert p.returncode == 137, p.stdout + p.stderr  # rank 1, killed for good
    lines = tagged_lines(p.stdout)
    assert lines[0][0].startswith("RankFailedError recv from rank 1 on rank 0: world ranks [1]"), \
        lines
    assert lines[2][0].startswith("CommRevokedError all_reduce on rank 1: world ranks [0] did "
                                  "not come while world ranks [1] failed"), lines
    assert lines[0][-1] == lines[2][-1] == "shrunk 2 [4.0]", lines


SHRINK = """
import tbcoll
comm = tbcoll.init()
try:
    comm.shrink()
except tbcoll.TbcollError as e:
    print(e)
"""


@pytest.mark.parametrize("flags, why", [
    ((), "needs a job started by tbrun --keep-going"),
    (("--backend", "mpi"), "has no ULFM"),
])
def test_shrink_says_why_it_cannot(script, flags, why):
    p = tbrun("-np", 2, *flags, script(SHRINK), timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    assert all(why in got[-1] for got in tagged_lines(p.stdout).values()), p.stdout


def test_the_seeds_cover_every_kind_of_call_and_every_place():
    """Between them the jobs above die inside or before a call of each of the job's eleven
    kinds (its step k is kind k % 11) and inside agree and shrink."""
    jobs = [case[:3] for case in CASES] + [EIGHT, TWO_LEVELS]
    deaths = [death for np_, seed, n in jobs for death in plan(seed, n, np_).values()]
    assert {where for _, where in deaths} == {"before", "inside", "agree", "shrink"}
    assert {k % 11 for k, where in deaths if where in ("before", "inside")} == set(range(11))
