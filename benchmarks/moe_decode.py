"""Mixture-of-experts decoding: experts split across ranks (expert parallel) against experts
split inside (tensor parallel), tbcoll/tp/moe.py under tbrun.

    python benchmarks/moe_decode.py --ranks 1,2,4 --backend shm --rounds 3

A decode step runs a batch of tokens through a stack of MoE layers (x <- x + moe(x)), Mixtral's
shape scaled down (8 experts, top 2, hidden 512, ffn 1792, 4 layers). Expert parallel: each
rank holds 8/p experts whole and batch/p of the tokens, and each layer moves every token's k
rows to their experts' ranks and back (2 all_to_alls with counts, 1 exchange of counts).
Tensor parallel: each rank holds 1/p of every expert and every token; one all_reduce of the
batch per layer. Every job first checks one step against the float64 single-process
reference. Rows alternate the modes (A B A B), medians over --rounds jobs; a markdown table
on stdout with tokens/s, the share of the step spent in tbcoll, and the collectives and bytes
each token costs per layer.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

TBRUN = str(Path(sys.executable).with_name("tbrun"))
SHAPE = {"experts": 8, "hidden": 512, "ffn": 1792, "top_k": 2, "layers": 4}


class Timed:
    """The communicator, with the time spent in its collectives added up."""

    def __init__(self, comm) -> None:
        self._comm, self.rank, self.size, self.seconds = comm, comm.rank, comm.size, 0.0

    def _timed(self, name, *args, **kwargs):
        started = time.perf_counter()
        result = getattr(self._comm, name)(*args, **kwargs)
        self.seconds += time.perf_counter() - started
        return result

    def all_to_all(self, *args, **kwargs):
        return self._timed("all_to_all", *args, **kwargs)

    def all_reduce(self, *args, **kwargs):
        return self._timed("all_reduce", *args, **kwargs)


def worker(mode: str, batch: int, steps: int) -> None:
    import tbcoll
    from tbcoll.tp.moe import ExpertParallelMoE, MoeWeights, TensorParallelMoE, reference_moe

    shape = SHAPE
    weights = [MoeWeights.random(shape["experts"], shape["hidden"], shape["ffn"],
                                 shape["top_k"], seed=layer) for layer in range(shape["layers"])]
    x0 = np.random.default_rng(99).standard_normal((batch, shape["hidden"])) * 0.5
    with tbcoll.init() as world:
        comm = Timed(world)
        kind = ExpertParallelMoE if mode == "ep" else TensorParallelMoE
        layers = [kind(w, comm) for w in weights]
        mine = np.array_split(np.arange(batch), comm.size)[comm.rank] if mode == "ep" else \
            np.arange(batch)

        def step(x: np.ndarray) -> np.ndarray:
            for layer in layers:
                x = x + layer(x)
            return x

        want = x0.copy()
        for w in weights:
            want = want + reference_moe(want, w)
        got = step(x0[mine].astype(np.float32))
        error = float(np.abs(got - want[mine]).max() / np.abs(want).max())
        world.barrier()
        comm.seconds = 0.0
        started = time.perf_counter()
        x = x0[mine].astype(np.float32)
        for _ in range(steps):
            step(x)
        elapsed = time.perf_counter() - started
        slowest = world.all_reduce(np.array([elapsed, comm.seconds, error]), op="max")
        if comm.rank == 0:
            print("RESULT " + json.dumps({"seconds": slowest[0] / steps,
                                          "comm": slowest[1] / steps, "error": slowest[2]}),
                  flush=True)


def per_token(mode: str, p: int) -> tuple[str, int]:
    """Collectives and bytes (float32) each token costs per layer."""
    h, k = SHAPE["hidden"], SHAPE["top_k"]
    if p == 1:
        return "0", 0
    if mode == "ep":  # k rows out (with their expert column) and k rows back, (p-1)/p leave
        return "2 all_to_all + counts", round(4 * k * (2 * h + 1) * (p - 1) / p)
    return "1 all_reduce", 4 * h


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", default="1,2,4")
    parser.add_argument("--backend", default="shm")
    parser.add_argument("--batch", type=int, default=8, help="tokens decoded together")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.batch, args.steps)
        return
    results: dict[tuple[str, int], list[dict]] = {}
    for round_ in range(args.rounds):
        for p in map(int, args.ranks.split(",")):
            modes = ("ep", "tp") if round_ % 2 == 0 else ("tp", "ep")
            for mode in modes:
                done = subprocess.run(
                    [TBRUN, "-np", str(p), "--backend", args.backend, "--no-tag-output",
                     sys.executable, __file__, "--worker", mode, "--batch", str(args.batch),
                     "--steps", str(args.steps)], capture_output=True, text=True, timeout=600)
                lines = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
                if done.returncode or not lines:
                    sys.exit(f"{mode} at np {p} failed:\n{done.stdout[-2000:]}{done.stderr}")
                row = json.loads(lines[0][len("RESULT "):])
                if row["error"] > 1e-3:
                    sys.exit(f"{mode} at np {p}: relative error {row['error']:.1e} against the "
                             "float64 reference")
                results.setdefault((mode, p), []).append(row)
    print("| mode | ranks | tokens/s | in tbcoll | collectives per layer and step | "
          "bytes per token per layer | max rel. error |")
    print("|---|---|---|---|---|---|---|")
    for (mode, p), rows in sorted(results.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        seconds = statistics.median(r["seconds"] for r in rows)
        share = statistics.median(r["comm"] / r["seconds"] for r in rows)
        calls, nbytes = per_token(mode, p)
        print(f"| {mode.upper()} | {p} | {args.batch / seconds:.0f} | {share:.0%} | {calls} | "
              f"{nbytes} | {max(r['error'] for r in rows):.1e} |")


if __name__ == "__main__":
    main()
