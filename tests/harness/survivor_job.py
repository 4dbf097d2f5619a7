"""An SPMD job that loses ranks and goes on (tests/library/test_survival.py), under
tbrun --keep-going.

    survivor_job.py SEED DEATHS HOW

Each step is one call of a cycle of collectives (every kind, point-to-point, a split and its
all_reduce), with values that depend on the step and the world ranks, checked on
every rank. DEATHS times a rank drawn from SEED kills itself (HOW: kill, SIGKILL; stop,
SIGSTOP, for tbrun to find frozen) at a step drawn from SEED: right before its call, or from
a timer a few hundred microseconds into it, or inside the recovery (agree or shrink). The
survivors catch RankFailedError or CommRevokedError, revoke, agree, shrink, and redo the
step the slowest of them had not finished. Each rank prints "survived SIZE WORLD_RANKS
FIRST LAST" at the end: the communicator it finished on, and its open descriptors and
resident memory (FDS:MiB) after its first step and at the end.
"""

import os
import random
import signal
import sys
import threading

import numpy as np

import tbcoll

STEPS = 24
WHERE = ("before", "inside", "inside", "agree", "shrink")
SIGNALS = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP}


def plan(seed: int, deaths: int, size: int) -> dict[int, tuple[int, str]]:
    """world rank -> the step from which it dies, and where, the same on every rank: the
    first death before or inside a call, a later one there too or inside the recovery from
    the first (agree or shrink). The first world ranks never die, so that DEATHS
    leave some."""
    draw = random.Random(seed)
    steps = sorted(draw.sample(range(2, STEPS - 1), deaths))
    victims = draw.sample(range(max(1, size - deaths - 1), size), deaths)
    deaths = {}
    for n, (k, victim) in enumerate(zip(steps, victims, strict=True)):
        where = draw.choice(WHERE[:3] if n == 0 else WHERE)
        deaths[victim] = (steps[0] if where in ("agree", "shrink") else k, where)
    return deaths


def die(how: str, delay: float = 0.0) -> threading.Timer | None:
    """Now, or from a timer (returned) delay seconds on."""
    if not delay:
        os.kill(os.getpid(), SIGNALS[how])
        return None
    timer = threading.Timer(delay, die, (how,))
    timer.start()
    return timer


def held() -> str:
    """This process's open descriptors and resident memory (MiB; 0 where there is no /proc)."""
    folder = "/proc/self/fd" if os.path.isdir("/proc/self/fd") else "/dev/fd"
    try:
        with open("/proc/self/statm") as statm:
            resident = int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") >> 20
    except OSError:
        resident = 0
    return f"{len(os.listdir(folder))}:{resident}"


def step(comm, world: tuple[int, ...], k: int) -> None:
    """Call k of the cycle, its result checked."""
    n, me = comm.size, world[comm.rank]
    mine = np.arange(4 * n, dtype=np.float64) + 100 * me + k
    kind = k % 11
    if kind == 0:
        got, want = comm.all_reduce(mine), sum(np.arange(4 * n) + 100 * w + k for w in world)
    elif kind == 1:
        got = comm.all_gather(mine[:3])
        want = np.concatenate([np.arange(3) + 100 * w + k for w in world])
    elif kind == 2:
        got = comm.reduce_scatter(mine, op="max")
        want = (np.arange(4 * n) + 100 * max(world) + k)[4 * comm.rank:4 * comm.rank + 4]
    elif kind == 3:
        got, want = comm.broadcast(mine, root=n - 1), np.arange(4 * n) + 100 * world[-1] + k
    elif kind == 4:
        comm.barrier()
        got = want = 0
    elif kind == 5:
        got = comm.all_to_all(mine)
        want = np.concatenate([np.arange(4 * comm.rank, 4 * comm.rank + 4) + 100 * w + k
                               for w in world])
    elif kind == 6:
        got = comm.gather(mine[:2], root=0)
        want = (np.concatenate([np.arange(2) + 100 * w + k for w in world])
                if comm.rank == 0 else None)
    elif kind == 7:
        got = comm.reduce(mine, op="min", root=n - 1)
        want = np.arange(4 * n) + 100 * min(world) + k if comm.rank == n - 1 else None
    elif kind == 8:  # a ring of point-to-point
        request = comm.isend(mine, (comm.rank + 1) % n, tag=k)
        got = comm.recv(np.empty_like(mine), (comm.rank - 1) % n, tag=k)
        request.wait()
        want = np.arange(4 * n) + 100 * world[(comm.rank - 1) % n] + k
    elif kind == 9:  # a split: evens and odds, each all-reducing
        sub = comm.split(comm.rank % 2)
        try:
            comm.barrier()  # every rank has its sub-communicator (docs/failures.md)
            group = world[comm.rank % 2::2]
            got = sub.all_reduce(np.array([me + k], np.int64))
            want = np.array([sum(group) + k * len(group)])
        except (tbcoll.RankFailedError, tbcoll.CommRevokedError):
            sub.revoke()  # a partner whose barrier ended well waits in sub for this rank
            raise
        finally:
            sub.close()
    else:
        blocks = np.arange(2 * n, dtype=np.float64) + 100 * world[0] + k
        got = comm.scatter(blocks if comm.rank == 0 else None, root=0)
        want = blocks[2 * comm.rank:2 * comm.rank + 2]
    if want is None:
        assert got is None, (k, got)
    else:
        assert np.array_equal(got, want), (k, kind, comm.size, got, want)


def main(seed: int, deaths_in_all: int, how: str) -> None:
    comm = tbcoll.init()
    deaths = plan(seed, deaths_in_all, comm.size)
    world = tuple(range(comm.size))
    me = comm.rank
    k, first, timer = 0, None, None
    while k <= STEPS:  # the last step is a barrier: every death happens before it ends
        at, where = deaths.get(me, (-1, ""))
        if k == at and where == "before":
            die(how)
        elif k == at and where == "inside":
            timer = die(how, random.Random(seed + k).uniform(0, 0.002))
        try:
            if k < STEPS:
                step(comm, world, k)
            elif timer is not None:  # (a death inside a call that ended first comes now)
                timer.join()
            else:
                comm.barrier()
            k += 1
            first = first or held()
        except (tbcoll.RankFailedError, tbcoll.CommRevokedError):
            comm, world, k = recover(comm, me, k, deaths.get(me, (STEPS, "")), how)
            print(f"rank {me}: went on over {comm.size} ranks from step {k}", flush=True)
    for thread in threading.enumerate():  # a shrink's open left to time out holds a socket
        if thread.name == "tbcoll-shrink":
            thread.join()
    print(f"survived {comm.size} {','.join(map(str, world))} {first} {held()}", flush=True)
    comm.close()


def recover(comm, me: int, k: int, death: tuple[int, str], how: str):
    """Revoke, agree, shrink (again while ranks fail meanwhile): the communicator of the
    survivors, their world ranks and the step the slowest had not finished; this rank dies
    inside agree or shrink where its death says so."""
    at, where = death
    while True:
        comm.revoke()
        if k >= at and where == "agree":
            die(how, 0.0005)
        comm.agree(True)
        if k >= at and where == "shrink":
            die(how, 0.0005)
        shrunk = comm.shrink()
        comm.close()
        comm = shrunk
        try:
            world = tuple(int(w) for w in comm.all_gather(np.array([me], np.int64)))
            return comm, world, int(comm.all_reduce(np.array([k]), op="min")[0])
        except (tbcoll.RankFailedError, tbcoll.CommRevokedError):
            continue


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
