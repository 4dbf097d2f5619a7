"""Inside a job of several ranks per host (benchmarks/two_level.py --rails runs it in the
namespace cluster): a two-level all_reduce over the rails against through the leaders, in
turns A B A B, medians of the batches' times (rank 0's).

    tbrun ... python benchmarks/two_level_rails.py [ROUNDS] [SIZE,SIZE,...]
"""
import sys
import time

import numpy as np

import tbcoll
import tbcoll.hierarchy.native as two

rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 7
with tbcoll.init() as comm:
    sizes = [int(s) for s in sys.argv[2].split(",")] if len(sys.argv) > 2 else [
        4 << 10, 16 << 10, 32 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20]
    for nbytes in sizes:
        x = np.ones(nbytes // 4, np.float32)
        out = np.empty_like(x)
        reps = max(3, min(200, (32 << 20) // nbytes))
        times = {"rails": [], "leaders": []}
        for _ in range(rounds):
            for name, limit in (("rails", 0), ("leaders", 1 << 62)):
                two.RAILS_FROM = limit
                comm.all_reduce(x, out=out)
                comm.barrier()
                t = time.perf_counter()
                for _ in range(reps):
                    comm.all_reduce(x, out=out)
                times[name].append((time.perf_counter() - t) / reps)
        if comm.rank == 0:
            rails, leaders = np.median(times["rails"]), np.median(times["leaders"])
            print(f"{nbytes:>9} B  rails {rails * 1e6:9.1f} us  leaders {leaders * 1e6:9.1f} us  "
                  f"rails/leaders {rails / leaders:.2f}", flush=True)
