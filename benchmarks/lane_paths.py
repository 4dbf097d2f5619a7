"""An 8 B all_reduce by the default path (a transport's C lane, where it has one) against
`algorithm="native"` (the dispatch's Python around the same native collective), in one job:
rank 0 prints its first step and the median of 300 calls of each, twice, in turns.

    tbrun -np 2 --backend rdma benchmarks/lane_paths.py    # in the RDMA lab: see RESULTS.md
"""

import statistics
import time

import numpy as np

import tbcoll

comm = tbcoll.init()
x = np.ones(2, np.float32)
out = np.empty_like(x)
if comm.rank == 0:
    print("first step:", comm._all_reduce.__self__.first, flush=True)
for algorithm in (None, "native", None, "native"):
    times = []
    for _ in range(300):
        start = time.perf_counter()
        comm.all_reduce(x, algorithm=algorithm, out=out)
        times.append(time.perf_counter() - start)
    if comm.rank == 0:
        print(f"{algorithm or 'default'}: {statistics.median(times) * 1e6:.1f} us", flush=True)
