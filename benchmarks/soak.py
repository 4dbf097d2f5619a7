"""Soak: many mixed collectives, every result checked, memory and descriptors watched.

    tbrun -np 4 python benchmarks/soak.py --calls 100000

Each rank runs CALLS collectives chosen by a seeded generator that every rank shares
(all_reduce with each op, all_gather, reduce_scatter, broadcast, barrier, send/recv in a
ring; sizes 1 to 64K elements; dtypes float32, float64, int32), checks each result against
what it must be, and samples its RSS and open descriptors after the warm-up and at the end.
Rank 0 prints one line per rank and exits 1 if any result was wrong or RSS grew more than
--rss-growth MB or any descriptor leaked.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path

import numpy as np

import tbcoll

DTYPES = (np.float32, np.float64, np.int32)


def rss_mb() -> float:
    """Resident set size now (Linux /proc), else the peak (macOS getrusage, in bytes)."""
    status = Path("/proc/self/status")
    if status.exists():
        line = next(x for x in status.read_text().splitlines() if x.startswith("VmRSS:"))
        return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def open_fds() -> int:
    folder = "/proc/self/fd" if os.path.isdir("/proc/self/fd") else "/dev/fd"
    return len(os.listdir(folder))


def one_call(comm: tbcoll.Communicator, rng: np.random.Generator) -> bool:
    """Run one collective chosen by rng (the same on every rank); True if its result is
    right."""
    p, r = comm.size, comm.rank
    kind = rng.integers(7)
    n = int(rng.choice([1, 7, 256, 4096, 65536]))
    dtype = DTYPES[rng.integers(len(DTYPES))]
    mine = np.full(n, r + 1, dtype)
    if kind == 0:
        op = ("sum", "max", "min", "prod")[rng.integers(4)]
        want = {"sum": p * (p + 1) / 2, "max": p, "min": 1,
                "prod": float(np.prod(np.arange(1, p + 1)))}[op]
        return bool((comm.all_reduce(mine, op=op) == want).all())
    if kind == 1:
        got = comm.all_gather(mine)
        return bool((got == np.repeat(np.arange(1, p + 1), n).astype(dtype)).all())
    if kind == 2:
        got = comm.reduce_scatter(np.full(n * p, r + 1, dtype))
        return got.shape == (n,) and bool((got == p * (p + 1) / 2).all())
    if kind == 3:
        root = int(rng.integers(p))
        return bool((comm.broadcast(mine, root=root) == root + 1).all())
    if kind == 4:
        comm.barrier()
        return True
    if p == 1:
        return True
    # send/recv round a ring: even ranks send first, odd ranks receive first
    right, left = (r + 1) % p, (r - 1) % p
    got = np.empty(n, dtype)
    if r % 2 == 0:
        comm.send(mine, right)
        comm.recv(got, left)
    else:
        comm.recv(got, left)
        comm.send(mine, right)
    return bool((got == left + 1).all())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=100_000, help="(default: %(default)s)")
    parser.add_argument("--rss-growth", type=float, default=20.0,
                        help="MB of RSS growth allowed after the warm-up (default: %(default)s)")
    args = parser.parse_args()
    with tbcoll.init() as comm:
        rng = np.random.default_rng(1234)  # the same calls on every rank
        warmup = min(2000, args.calls // 10)
        wrong = 0
        for _ in range(warmup):
            wrong += not one_call(comm, rng)
        rss0, fds0, start = rss_mb(), open_fds(), time.monotonic()
        for _ in range(args.calls - warmup):
            wrong += not one_call(comm, rng)
        seconds = time.monotonic() - start
        rss1, fds1 = rss_mb(), open_fds()
        row = np.array([wrong, rss0, rss1, fds0, fds1], np.float64)
        rows = comm.all_gather(row[None]).reshape(comm.size, 5)
        failed = False
        if comm.rank == 0:
            print(f"{args.calls} calls on {comm.size} ranks ({comm.backend}) in {seconds:.0f} s")
            for rank, (bad, a, b, f0, f1) in enumerate(rows):
                print(f"rank {rank}: wrong {bad:.0f}, RSS {a:.1f} -> {b:.1f} MB, "
                      f"descriptors {f0:.0f} -> {f1:.0f}")
                failed |= bad > 0 or b - a > args.rss_growth or f1 > f0
            print("FAILED" if failed else "OK")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
