"""A Communicator's public all_reduce over shm's lane, in one process: a Communicator of two
ranks whose transport is a real ShmNative of one rank (its segment, its lane, its rounds: no
peer to wait for), so that what is timed is the call's own cost, the route, the lane's whole C
call and the rounds, at 8 B, 1 MiB and 16 MiB, with out=, min of repeats. An A/B of two builds
on a busy host, where 2-rank jobs cannot resolve a few percent:

    PYTHONPATH=/path/to/other/checkout python benchmarks/route_micro.py 9   (A)
    python benchmarks/route_micro.py 9                                      (B)

(The other checkout's extensions built in place: python setup.py build_ext --inplace.)
"""

from __future__ import annotations

import os
import sys
import timeit

import numpy as np

import tbcoll
from tbcoll.comm.communicator import Communicator
from tbcoll.transports.shm.native import Layout, ShmNative
from tbcoll.transports.shm.segment import Segment


class OneRankGroup:
    """Rank 0 of 2 for the Communicator and its table; a transport of one rank below it."""

    rank, size, local_rank, tuning, coll, p2p, allocate = 0, 2, 0, "shm", None, None, None
    revocation = None  # (nothing to revoke: no peer)

    def __init__(self) -> None:
        self.segment = Segment.create_unique(f"/tbrm{os.getpid()}_", Layout(1).total)
        self.segment.unlink()  # this process's alone: no name left behind, however it ends
        self.native = ShmNative(self.segment, 0, 1, 30.0, f"/tbrm{os.getpid()}h_")

    def begin_call(self, seq: int, signature: int) -> None:
        pass

    def end_call(self) -> None:
        pass

    def close(self) -> None:
        self.native.close()


def main() -> None:
    repeat = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    group = OneRankGroup()
    comm = Communicator(group, "shm", 0, 0)
    try:
        cells = []
        for nbytes, n in ((8, 100_000), (1 << 20, 300), (16 << 20, 12)):
            x = np.ones(nbytes // 4, np.float32)
            out = np.empty_like(x)
            assert comm.all_reduce(x, out=out) is out and out[0] == 1.0
            best = min(timeit.repeat(lambda x=x, out=out: comm.all_reduce(x, out=out),
                                     number=n, repeat=repeat)) / n
            cells.append(f"{nbytes} B {best * 1e6:.3f} us")
        print(", ".join(cells), f"({tbcoll.__file__})")
    finally:
        comm.close()


if __name__ == "__main__":
    main()
