"""tbcoll beside MPI (mpi4py on MPICH) and MLX's own collectives, in one invocation.

    python benchmarks/compare.py -np 2 --collective all_reduce -b 8 -e 16M -f 16 --plot out.png

Each round runs one job per system, in turns (A B A B ...): tbcoll over shm and tcp under
tbrun (every algorithm available; tbcoll-shm-empty: shm's default path on buffers from
comm.empty, tbcoll-shm-empty-out: only the out= buffers from it), tbcoll's mpi transport and
raw mpi4py (MPI_Allreduce / MPI_Allgather) under mpiexec, and MLX's all_sum / all_gather
under `tbrun --backend mlx` (which sets what MLX's own launcher would: ring here; jaccl from
a hostfile with RDMA devices). Not under MLX's launcher itself: on 2 cores it busy-polls,
and the same MLX worker ran 10-35x slower under it (../shared/FACTS.md). Every job runs the
same sweep through tbcoll.bench's harness, which checks every result; inside a job the
algorithms take turns batch by batch. With --interleave the systems launched alike share one
job and take turns batch by batch too (tbcoll-mpi with mpi4py; tbcoll-mlx with mlx): the
fairest comparison on a noisy machine. The report gives, per size, each system's median time
and tbcoll's best time divided by each peer's (below 1: tbcoll is faster), and optionally a
PNG plot of latency and bus bandwidth against size.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from tbcoll.bench.descriptors import DESCRIPTORS

BIN = Path(sys.executable).parent
PEER_OPS = ("sum", "max")  # what the harness needs of a peer: the collective, and max of times
MLX_HAS = ("all_reduce", "all_gather", "barrier")  # the collectives MlxPeer offers


class MpiPeer:
    """mpi4py's buffer collectives with the methods the harness calls."""

    def __init__(self) -> None:
        from mpi4py import MPI

        self._mpi, self._comm = MPI, MPI.COMM_WORLD
        self.rank, self.size = self._comm.Get_rank(), self._comm.Get_size()

    def all_reduce(self, x, op="sum", algorithm=None, out=None):
        out = np.empty_like(x) if out is None else out
        mpi_op = {"sum": self._mpi.SUM, "max": self._mpi.MAX}[op]
        self._comm.Allreduce(self._mpi.IN_PLACE if out is x else x, out, mpi_op)
        return out

    def all_gather(self, x, algorithm=None, out=None):
        out = np.empty(x.size * self.size, x.dtype) if out is None else out
        self._comm.Allgather(x, out)
        return out

    def reduce_scatter(self, x, op="sum", algorithm=None, out=None):
        out = np.empty(x.size // self.size, x.dtype) if out is None else out
        mpi_op = {"sum": self._mpi.SUM, "max": self._mpi.MAX}[op]
        self._comm.Reduce_scatter_block(x, out, mpi_op)
        return out

    def broadcast(self, x, root=0, algorithm=None, out=None):
        out = x.copy() if out is None else out
        if self.rank == root and out is not x:
            out[:] = x
        self._comm.Bcast(out, root)
        return out

    def send(self, x, dst, tag=0):
        self._comm.Send(x, dst, tag)

    def recv(self, out, src, tag=0):
        self._comm.Recv(out, src, tag)
        return out

    def all_to_all(self, x, algorithm=None, out=None):
        out = np.empty_like(x) if out is None else out
        self._comm.Alltoall(x, out)
        return out

    def gather(self, x, root=0, algorithm=None, out=None):
        if self.rank == root and out is None:
            out = np.empty(x.size * self.size, x.dtype)
        self._comm.Gather(x, out if self.rank == root else None, root)
        return out if self.rank == root else None

    def scatter(self, x, root=0, algorithm=None, out=None):
        # mpi4py, as MPI, needs the receive buffer's size on every rank; the harness's out=
        out = np.empty(x.size // self.size, x.dtype) if out is None else out
        self._comm.Scatter(x if self.rank == root else None, out, root)
        return out

    def reduce(self, x, op="sum", root=0, algorithm=None, out=None):
        if self.rank == root and out is None:
            out = np.empty_like(x)
        mpi_op = {"sum": self._mpi.SUM, "max": self._mpi.MAX}[op]
        self._comm.Reduce(x, out if self.rank == root else None, mpi_op, root)
        return out if self.rank == root else None

    def barrier(self):
        self._comm.Barrier()


class MlxPeer:
    """mx.distributed's collectives; each call is evaluated (MLX is lazy) before it returns."""

    def __init__(self) -> None:
        import mlx.core as mx

        self._mx = mx
        # Name the backend tbrun set up: left to choose, MLX may find MPICH's libmpi in this
        # environment and start a singleton MPI job instead.
        backend = "jaccl" if "MLX_IBV_DEVICES" in os.environ else "ring"
        self._group = mx.distributed.init(strict=True, backend=backend)
        self.rank, self.size = self._group.rank(), self._group.size()

    def _run(self, fn, x):
        result = fn(self._mx.array(x), group=self._group)
        self._mx.eval(result)
        return np.array(result)

    def all_reduce(self, x, op="sum", algorithm=None, out=None):
        dist = self._mx.distributed
        return self._run({"sum": dist.all_sum, "max": dist.all_max}[op], x)

    def all_gather(self, x, algorithm=None, out=None):
        return self._run(self._mx.distributed.all_gather, x)

    def barrier(self):
        self._run(self._mx.distributed.all_sum, np.zeros(1, np.float32))


# how each system is launched: (launcher, tbrun's --backend); under --interleave the
# systems that share a launch run in one job, batch by batch in turns
LAUNCH = {"tbcoll-shm": ("tbrun", "shm"), "tbcoll-shm-empty": ("tbrun", "shm"),
          "tbcoll-shm-empty-out": ("tbrun", "shm"), "tbcoll-tcp": ("tbrun", "tcp"),
          "tbcoll-mlx": ("tbrun", "mlx"), "mlx": ("tbrun", "mlx"),
          "tbcoll-mpi": ("mpiexec", None), "mpi4py": ("mpiexec", None)}


def worker(systems: list[str], collective: str, sizes: list[int], iters: int,
           warmup: int) -> None:
    from tbcoll.bench.harness import InSharedBuffers, sweep_interleaved

    desc = DESCRIPTORS[collective]
    contenders = []
    for system in systems:
        if system.startswith("tbcoll"):
            import tbcoll

            comm = tbcoll.init(LAUNCH[system][1] or "mpi")
            algorithms = ["default", *(comm.algorithms(collective) if desc.chooses else ())]
            if "-empty" in system:  # buffers from comm.empty: the default path only
                comm = InSharedBuffers(comm, inputs=not system.endswith("-out"))
                algorithms = ["default"]
        else:
            comm = MpiPeer() if system == "mpi4py" else MlxPeer()
            algorithms = ["native"]
        contenders += [(system, comm, algorithm) for algorithm in algorithms]
    rows = sweep_interleaved(contenders, desc, sizes, np.dtype(np.float32), "sum", [False],
                             iters, warmup)
    if contenders[0][1].rank == 0:
        print("ROWS " + json.dumps([r.as_dict() for r in rows]), flush=True)


def launch(systems: list[str], np_: int, worker_args: list[str]) -> list[dict]:
    me = [__file__, "--worker", ",".join(systems), *worker_args]
    launcher, backend = LAUNCH[systems[0]]
    if launcher == "mpiexec":
        argv = [str(BIN / "mpiexec"), "-n", str(np_), sys.executable, *me]
    else:
        argv = [str(BIN / "tbrun"), "-np", str(np_), "--no-tag-output", "--backend", backend,
                sys.executable, *me]
    env = {k: v for k, v in os.environ.items() if k != "TBCOLL_ALGO"}
    p = subprocess.run(argv, capture_output=True, text=True, timeout=3600, env=env)
    lines = [line for line in p.stdout.splitlines() if line.startswith("ROWS ")]
    if p.returncode or not lines:
        raise SystemExit(f"{', '.join(systems)} failed ({p.returncode}):\n"
                         f"{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return json.loads(lines[0][len("ROWS "):])


def jobs(systems: list[str], interleave: bool) -> list[list[str]]:
    """The jobs of one round: a system each, or with interleave one per launch."""
    if not interleave:
        return [[system] for system in systems]
    by_launch: dict[tuple, list[str]] = {}
    for system in systems:
        by_launch.setdefault(LAUNCH[system], []).append(system)
    return list(by_launch.values())


def summarise(rows: list[dict]) -> dict[tuple[str, int], dict]:
    """Per (system/algorithm, size): the median over rounds of time_us and busbw."""
    groups: dict[tuple[str, int], list[dict]] = defaultdict(list)
    for row in rows:
        if row["wrong"]:
            raise SystemExit(f"{row['system']} {row['algorithm']} gave {row['wrong']} wrong "
                             f"elements at {row['size']} bytes")
        name = row["system"] if row["system"] in ("mpi4py", "mlx") else \
            f"{row['system']} {row['algorithm']}"
        groups[name, row["size"]].append(row)
    return {key: {"time_us": statistics.median(r["time_us"] for r in rs),
                  "busbw": statistics.median(r["busbw"] for r in rs)}
            for key, rs in groups.items()}


def report(summary: dict, collective: str, np_: int) -> str:
    """Per size: the peers, each tbcoll transport's default, tbcoll's best (any transport and
    algorithm), and best / peer."""
    names = {name for name, _ in summary}
    peers = sorted(n for n in names if n in ("mpi4py", "mlx"))
    defaults = sorted(n for n in names if n.endswith(" default"))
    columns = peers + defaults
    lines = [f"# {collective}, float32, np={np_}: median time per call (us); "
             "ratio = tbcoll's best / peer (below 1: tbcoll is faster)",
             "| size | " + " | ".join(columns) + " | tbcoll's best | "
             + " | ".join(f"best / {p}" for p in peers) + " |",
             "|---:|" + "---:|" * (len(columns) + 1 + len(peers))]
    for size in sorted({s for _, s in summary}):
        times = {n: summary[n, size]["time_us"] for n in names if (n, size) in summary}
        ours = {n: t for n, t in times.items() if n.startswith("tbcoll")}
        best = min(ours, key=ours.get)
        cells = [f"{times[n]:.1f}" if n in times else "-" for n in columns]
        ratios = [f"{ours[best] / times[p]:.3g}" if p in times else "-" for p in peers]
        lines.append(f"| {size} | " + " | ".join(cells) + f" | {ours[best]:.1f} ({best}) | "
                     + " | ".join(ratios) + " |")
    return "\n".join(lines)


def plot(summary: dict, collective: str, np_: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (latency, bandwidth) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name in sorted({n for n, _ in summary if n in ("mpi4py", "mlx") or
                        n.endswith(" default")}):
        points = sorted((s, v) for (n, s), v in summary.items() if n == name)
        xs = [s for s, _ in points]
        latency.plot(xs, [v["time_us"] for _, v in points], marker="o", label=name)
        bandwidth.plot(xs, [v["busbw"] for _, v in points], marker="o", label=name)
    for axis, label in ((latency, "time per call (us)"), (bandwidth, "bus bandwidth (GB/s)")):
        axis.set_xscale("log", base=2)
        axis.set_yscale("log")
        axis.set_xlabel("message size (bytes)")
        axis.set_ylabel(label)
        axis.grid(True, which="both", alpha=0.3)
    latency.legend(fontsize=7)
    fig.suptitle(f"{collective}, float32, {np_} ranks")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-np", type=int, default=2)
    parser.add_argument("--collective", choices=list(DESCRIPTORS), default="all_reduce")
    parser.add_argument("-b", "--minbytes", default="8")
    parser.add_argument("-e", "--maxbytes", default="16M")
    parser.add_argument("-f", "--stepfactor", type=float, default=16)
    parser.add_argument("-n", "--iters", type=int, default=20)
    parser.add_argument("-w", "--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--systems", default="tbcoll-shm,tbcoll-tcp,tbcoll-mpi,mpi4py,mlx")
    parser.add_argument("--interleave", action="store_true",
                        help="systems launched alike share one job, taking turns batch by "
                        "batch (tbcoll-mpi with mpi4py, tbcoll-mlx with mlx)")
    parser.add_argument("--plot", type=Path, help="write a PNG of latency and busbw")
    parser.add_argument("--json", type=Path, help="write every row of every round")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--sizes", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker.split(","), args.collective, [int(s) for s in args.sizes.split(",")],
               args.iters, args.warmup)
        return
    from tbcoll.bench.cli import parse_size, sizes

    steps = sizes(parse_size(args.minbytes), parse_size(args.maxbytes), args.stepfactor)
    worker_args = ["--collective", args.collective, "--sizes", ",".join(map(str, steps)),
                   "--iters", str(args.iters), "--warmup", str(args.warmup)]
    systems = args.systems.split(",")
    if args.collective not in MLX_HAS and "mlx" in systems:
        systems.remove("mlx")
        print(f"# mlx left out: MLX has no {args.collective}")
    rows: list[dict] = []
    round_jobs = jobs(systems, args.interleave)
    for round_ in range(args.rounds):
        for job in round_jobs if round_ % 2 == 0 else reversed(round_jobs):
            rows += launch(job, args.np, worker_args)
    summary = summarise(rows)
    print(report(summary, args.collective, args.np))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    if args.plot:
        plot(summary, args.collective, args.np, args.plot)
        print(f"# plot: {args.plot}")


if __name__ == "__main__":
    main()
