"""The flight recorder's cost per call: the Communicator's own time per all_reduce with the
recorder on and off, over a fake transport whose one-call path returns at once, in batches
taken in turns (off, on, off, on, ...) in one process.

    python benchmarks/recorder_cost.py [batches]
"""

import statistics
import sys
import time

import numpy as np

from tbcoll.comm.communicator import Communicator

CALLS = 20000


class Native:
    takes_mlx = False
    offers = frozenset(("all_reduce",))
    direct_all_gather = direct_broadcast = direct_reduce_scatter = None

    def direct_all_reduce(self, x, op, root, out):
        return out


class Group:
    rank, size, tuning = 0, 2, "shm"
    native, revocation = Native(), None

    def close(self):
        pass


def main(batches: int) -> None:
    on, off = Communicator(Group(), "shm", 0, 0), Communicator(Group(), "shm", 0, 0)
    off._ring = None
    assert on._ring is not None, "TBCOLL_RECORD=0 is set: nothing to compare"
    x = np.ones(2, np.float32)
    out = np.empty_like(x)
    times = {"off": [], "on": []}
    for _ in range(batches):
        for name, comm in (("off", off), ("on", on)):
            start = time.perf_counter()
            for _ in range(CALLS):
                comm.all_reduce(x, out=out)
            times[name].append((time.perf_counter() - start) / CALLS * 1e9)
    for name, values in times.items():
        print(f"recorder {name}: median {statistics.median(values):.0f} ns per call")
    cost = statistics.median(a - b for a, b in zip(times["on"], times["off"], strict=True))
    print(f"the recorder's cost: {cost:.0f} ns per call (median of the pairs)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 31)
