"""The whole C call of a bound shm lane, in one process: a shm Lane of one rank over a private
segment (no peer to wait for), its LaneCall bound to a Gate, an 8 B all_reduce timed with out=
and with a new result, min of repeats. An A/B of two builds on a busy host, where 2-rank jobs
cannot resolve a few percent:

    PYTHONPATH=/path/to/other/checkout python benchmarks/lane_micro.py 11   (A)
    python benchmarks/lane_micro.py 11                                     (B)

(The other checkout's extensions built in place: python setup.py build_ext --inplace.)
A build from before the lane interface (tbcoll/include/lane.h) binds its Lane itself.
"""

from __future__ import annotations

import sys
import timeit

import numpy as np

import tbcoll
from tbcoll.core.dtypes import OP_CODES
from tbcoll.core.errors import TbcollError
from tbcoll.core.gate import Gate
from tbcoll.transports.shm import native
from tbcoll.transports.shm.flags import atomics


def bound_all_reduce():
    """A bound lane's all_reduce(x, op, out) over a one-rank segment."""
    layout = native.Layout(1)
    sets = [layout.data + k * layout.set_bytes for k in (0, 1)]
    lane = atomics.Lane(segment=bytearray(layout.total), flags=layout.flags, size=1, rank=0,
                        sets=sets, slot_bytes=native.SLOT, budget=0.01, resume=None,
                        pids=layout.pids)
    signs = dict(single_pass=native.SINGLE_PASS_BYTES, all_reduce=native._ALL_REDUCE,
                 all_gather=native._ALL_GATHER, reduce_scatter=native._REDUCE_SCATTER,
                 broadcast_call=native._broadcast_call)
    if hasattr(lane, "lane_capsule"):  # the lane interface: LaneCall runs the call
        from tbcoll.core.gate import lane_call
        lane.calls(**signs)
        calls = lane_call(lane)
    else:
        lane.calls(ndarray=np.ndarray, dtypes=native._DTYPES, ops=OP_CODES, empty=np.empty,
                   **signs)
        calls = lane
    calls.bind(gate=Gate(4), codes=(0, 1, 2, 3, 9, 10, 6), names=("a", "b", "c", "d"),
               enabled=0b11111, max_tag=7, comm_error=TbcollError, namer=None)
    return calls.all_reduce


def main() -> None:
    repeat, n = int(sys.argv[1]) if len(sys.argv) > 1 else 7, 100_000
    f, x = bound_all_reduce(), np.ones(2, np.float32)
    out = np.empty_like(x)
    assert f(x, "sum", out) is out and out[0] == 1.0
    into = min(timeit.repeat(lambda: f(x, "sum", out), number=n, repeat=repeat)) / n
    made = min(timeit.repeat(lambda: f(x, "sum", None), number=n, repeat=repeat)) / n
    print(f"out= {into * 1e9:.1f} ns, a new result {made * 1e9:.1f} ns ({tbcoll.__file__})")


if __name__ == "__main__":
    main()
