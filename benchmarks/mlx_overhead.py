"""What tbcoll adds to a call of MLX's own all_sum: raw `mx.distributed.all_sum` against
`comm.all_reduce(x, algorithm="native")` on the same mlx array, interleaved, best of 5
batches each. With one rank MLX does no communication, so the difference is tbcoll's
per-call cost alone; over jaccl (a few us a call) that is what decides whether the layer is
worth it.

    tbrun -np 1 --backend mlx benchmarks/mlx_overhead.py
    tbrun -np 2 --backend mlx benchmarks/mlx_overhead.py --size 4096
"""

import argparse
import timeit

import mlx.core as mx

import tbcoll

parser = argparse.ArgumentParser()
parser.add_argument("--size", type=int, default=4096, help="bytes of float32")
parser.add_argument("--calls", type=int, default=2000)
args = parser.parse_args()

comm = tbcoll.init()
x = mx.ones(args.size // 4)
systems = {
    "mlx all_sum": lambda: mx.eval(mx.distributed.all_sum(x)),
    "tbcoll all_reduce (native)": lambda: mx.eval(comm.all_reduce(x, algorithm="native")),
}
best = dict.fromkeys(systems, float("inf"))
for round_ in range(4):
    for name, call in systems.items() if round_ % 2 == 0 else reversed(systems.items()):
        comm.barrier()
        seconds = min(timeit.repeat(call, number=args.calls, repeat=5)) / args.calls
        best[name] = min(best[name], seconds * 1e6)
if comm.rank == 0:
    raw = best["mlx all_sum"]
    for name, us in best.items():
        print(f"{name}: {us:.2f} us per call ({us / raw:.2f}x)")
