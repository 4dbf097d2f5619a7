"""Greedy-decoding speed of a Llama-shaped model: tensor parallel against pipeline parallel.

    python benchmarks/tp_decode.py --ranks 1,2,4 --tokens 16

The driver writes a random checkpoint once (TinyLlama's shape: hidden 2048, 32 heads, 4 KV
heads, FFN 5632, vocabulary 32000, with --layers layers, fixed seed: its weights do not fit
in cache), then runs one job per (np, mode) under tbrun. BLAS threads are fixed so that every
job uses the same cores in total: np=1 gets --cores threads, np=N gets max(1, cores/N).

- tp: every rank holds 1/N of every layer (tbcoll.tp.llama); two all_reduce calls per layer
  per token and one all_gather of the logits.
- pp: rank r holds layers [rL/N, (r+1)L/N); the activation of each token goes from rank to
  rank with send/recv and the chosen token comes back by broadcast: with one sequence there is
  nothing to overlap, so N ranks decode no faster than one.
Each job reports tokens/s, the time per token split into compute and communication, and the
collective calls and bytes per token.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

BIN = Path(sys.executable).parent
SHAPE = dict(hidden_size=2048, intermediate_size=5632, num_attention_heads=32,
             num_key_value_heads=4, vocab_size=32000)
PROMPT = [1, 450, 4996, 17354, 1701, 29916]


class CountingComm:
    """The communicator, with the time, calls and bytes of every collective counted."""

    def __init__(self, comm) -> None:
        self.comm, self.rank, self.size = comm, comm.rank, comm.size
        self.seconds, self.calls, self.bytes = 0.0, 0, 0

    def _timed(self, name, x, *args, **kwargs):
        started = time.perf_counter()
        result = getattr(self.comm, name)(x, *args, **kwargs)
        self.seconds += time.perf_counter() - started
        self.calls += 1
        self.bytes += x.nbytes
        return result

    def all_reduce(self, x, **kwargs):
        return self._timed("all_reduce", x, **kwargs)

    def all_gather(self, x, **kwargs):
        return self._timed("all_gather", x, **kwargs)

    def send(self, x, dst):
        return self._timed("send", x, dst)

    def recv(self, x, src):
        return self._timed("recv", x, src)

    def broadcast(self, x, root=0):
        return self._timed("broadcast", x, root=root)


class PipelineLlama:
    """Layers split across ranks; activations passed on with send/recv."""

    def __init__(self, weights, cfg, comm) -> None:
        from tbcoll.tp.layers import Solo, shard_bounds
        from tbcoll.tp.llama import TensorParallelLlama

        self.comm, self.cfg = comm, cfg
        stage = shard_bounds(cfg.num_hidden_layers, comm.rank, comm.size)
        mine = range(stage.start, stage.stop)
        local = {}  # this stage's layers, renumbered from 0, and the embedding, norm and head
        for key, value in weights.items():
            if key.startswith("model.layers."):
                parts = key.split(".")
                if int(parts[2]) not in mine:
                    continue
                parts[2] = str(int(parts[2]) - mine.start)
                key = ".".join(parts)
            local[key] = value
        self.model = TensorParallelLlama(local, replace(cfg, num_hidden_layers=len(mine)), Solo())

    def generate(self, prompt, steps):
        model, comm, last = self.model, self.comm, self.comm.size - 1
        model.reset()
        tokens, x = [], np.asarray(prompt)
        for _ in range(steps + 1):
            h = model.embed[x] if comm.rank == 0 else None
            if comm.rank > 0:
                h = comm.recv(np.empty((len(x), self.cfg.hidden_size), model.dtype), comm.rank - 1)
            h = model.run_layers(h)
            if comm.rank < last:
                comm.send(h, comm.rank + 1)
            token = np.zeros(1, np.int64)
            if comm.rank == last:
                token[0] = int(np.argmax(model.logits(h)))
            token = comm.broadcast(token, root=last)
            tokens.append(int(token[0]))
            x = token
        return tokens[:steps]


def worker(folder: str, mode: str, steps: int) -> None:
    import tbcoll
    from tbcoll.tp.llama import TensorParallelLlama, load_checkpoint

    cfg, weights = load_checkpoint(folder)
    with tbcoll.init() as world:
        comm = CountingComm(world)
        model = TensorParallelLlama(weights, cfg, comm) if mode == "tp" else \
            PipelineLlama(weights, cfg, comm)
        del weights
        model.generate(PROMPT, 2)  # warm-up
        comm.seconds, comm.calls, comm.bytes = 0.0, 0, 0
        world.barrier()
        started = time.perf_counter()
        tokens = model.generate(PROMPT, steps)
        elapsed = time.perf_counter() - started
        tokens = tokens[0] if mode == "tp" else tokens
        worst = world.all_reduce(np.array([comm.seconds, elapsed]), op="max")
        if world.rank == 0:
            per_token = elapsed / (steps + 1)  # the prompt's pass, then one per token
            print("RESULT " + json.dumps({
                "mode": mode, "ranks": world.size, "tokens": tokens,
                "tokens_per_s": (steps + 1) / elapsed, "ms_per_token": per_token * 1e3,
                "comm_share": float(comm.seconds / elapsed),
                "slowest_comm_share": float(worst[0] / worst[1]),
                "calls_per_token": comm.calls / (steps + 1),
                "bytes_per_token": comm.bytes / (steps + 1)}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", default="1,2,4", metavar="N,N,...",
                        help="numbers of ranks to run, each in tp and (N>1) pp mode; the first "
                             "row is the base of the speed-up column (default: %(default)s)")
    parser.add_argument("--tokens", type=int, default=16,
                        help="tokens to generate after the prompt (default: %(default)s)")
    parser.add_argument("--layers", type=int, default=4,
                        help="transformer layers (TinyLlama has 22; each is ~0.2 GB of float32; "
                             "default: %(default)s)")
    parser.add_argument("--cores", type=int, default=len(os.sched_getaffinity(0))
                        if hasattr(os, "sched_getaffinity") else os.cpu_count(),
                        help="cores shared by every job: BLAS threads per rank = cores/N "
                             "(default: this machine's, %(default)s)")
    parser.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        folder, mode, steps = args.worker
        worker(folder, mode, int(steps))
        return
    ranks = check_options(parser, args)
    from tbcoll.tp.llama import LlamaConfig, write_random_checkpoint

    print(f"# greedy decoding, {args.layers} layers of TinyLlama's shape, float32, "
          f"{args.tokens} tokens after a {len(PROMPT)}-token prompt, {args.cores} cores")
    print("| np | mode | BLAS threads/rank | tokens/s | speed-up | ms/token | comm share "
          "(rank 0 / slowest) | collectives/token | bytes/token | same tokens |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---|", flush=True)
    results = []
    with tempfile.TemporaryDirectory() as folder:
        write_random_checkpoint(Path(folder), LlamaConfig(num_hidden_layers=args.layers,
                                                          **SHAPE), seed=0)
        for np_ in ranks:
            threads = str(max(1, args.cores // np_))
            for mode in ("tp", "pp") if np_ > 1 else ("tp",):
                argv = [str(BIN / "tbrun"), "-np", str(np_), "--no-tag-output",
                        "-x", f"OMP_NUM_THREADS={threads}", "-x", f"OPENBLAS_NUM_THREADS={threads}",
                        "-x", f"MKL_NUM_THREADS={threads}", sys.executable, __file__,
                        "--worker", folder, mode, str(args.tokens)]
                p = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
                line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
                if p.returncode or not line:
                    raise SystemExit(f"np={np_} {mode} failed:\n{p.stdout}\n{p.stderr}")
                results.append(r := {**json.loads(line[0][7:]), "blas_threads": int(threads)})
                print(f"| {r['ranks']} | {r['mode']} | {r['blas_threads']} | "
                      f"{r['tokens_per_s']:.2f} | "
                      f"{r['tokens_per_s'] / results[0]['tokens_per_s']:.2f}x | "
                      f"{r['ms_per_token']:.1f} | "
                      f"{r['comm_share']:.0%} / {r['slowest_comm_share']:.0%} | "
                      f"{r['calls_per_token']:.0f} | {r['bytes_per_token']:.0f} | "
                      f"{r['tokens'] == results[0]['tokens']} |", flush=True)


def check_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[int]:
    """Refuse, before anything runs, what some row could not do; return the rank counts."""
    try:
        ranks = [int(n) for n in args.ranks.split(",")]
    except ValueError:
        parser.error(f"--ranks {args.ranks}: give numbers of ranks like 1,2,4")
    if args.tokens < 1 or args.layers < 1 or args.cores < 1 or min(ranks) < 1:
        parser.error("--ranks, --tokens, --layers and --cores must be positive")
    for n in ranks:  # tp splits any count (tbcoll.tp.plan); pp needs a layer for each stage
        if args.layers < n:
            parser.error(f"--ranks {n}: cannot split layers ({args.layers}) across {n} ranks; "
                         f"give each pipeline stage a layer (e.g. --layers {n})")
    return ranks


if __name__ == "__main__":
    main()
