"""Tokens/s of a real LLM (SmolLM2-135M-Instruct, examples/chat.py) by rank count and by
emulated link latency, beside the planner's prediction for 2-4 Macs.

    python benchmarks/chat_decode.py --ranks 1,2,4 --rounds 3
    python benchmarks/chat_decode.py --ranks 2,4 --delays 4 --rounds 3

Each row is one job of examples/chat.py --json (greedy, --tokens tokens of one prompt) under
tbrun; rows run in turns, every row once a round, and the table gives each row's median over
the rounds. Delay 0 uses the shm transport; a delay (TBCOLL_LINK_DELAY_US, the one-way
latency of an emulated cable: 4 us is Thunderbolt 5 RDMA's, 300 us TCP over Thunderbolt's)
uses tcp, whose messages then arrive no sooner than that. Every job's tokens must equal the
first np=1 job's. The planner (tbcoll.bench.planner) prices the same decoding on Macs: the
model in float32 as tbcoll.tp.llama computes it, --gbps-memory per Mac, the delay as alpha
and Thunderbolt 5's ~7 GB/s as bandwidth; on this 2-core machine np=4 puts 2 ranks on a core,
which no Mac cluster does.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
PROMPT = "Tell me a short story about a cat."  # a long answer (France: 8 tokens)
TB5_BYTES_PER_S = 7e9  # TB5 iperf3 53-64 Gb/s (FACTS.md)


def run(np_: int, delay: float, tokens: int) -> dict:
    backend = "tcp" if delay else "shm"
    env = {**os.environ, "TBCOLL_LINK_DELAY_US": str(delay) if delay else ""}
    argv = [str(BIN / "tbrun"), "-np", str(np_), "--backend", backend, "--no-tag-output",
            str(REPO / "examples" / "chat.py"), "--json", "--max-tokens", str(tokens), PROMPT]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
    if p.returncode:
        sys.exit(f"np={np_} delay={delay}: exit {p.returncode}\n{p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def predictions(np_: int, delay: float, gbps_memory: float) -> str:
    """The planner's tokens/s and comm share for np_ Macs joined by links of this delay (one
    Mac where np_ is 1; nothing for several ranks on one host, which no Mac cluster is)."""
    if np_ > 1 and not delay:
        return "-"
    from tbcoll.bench.planner import Link, Shape, plan
    from tbcoll.tp import checkpoint

    cfg = checkpoint.config(checkpoint.smollm2_path())
    shape = Shape.from_config(asdict(cfg), 4)
    link = Link(alpha=delay * 1e-6, beta=1 / TB5_BYTES_PER_S)
    tp = plan(shape, np_, gbps_memory * 1e9, link)[0]
    return f"{tp.tokens_per_s:.0f} ({tp.comm_share:.0%})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", default="1,2,4", help="rank counts (default: %(default)s)")
    parser.add_argument("--delays", default="0",
                        help="one-way link latencies in us, 0: shm (default: %(default)s)")
    parser.add_argument("--tokens", type=int, default=32,
                        help="tokens generated a job (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=3, help="default: %(default)s")
    parser.add_argument("--gbps-memory", type=float, default=819,
                        help="a Mac's memory bandwidth for the planner (default: %(default)s, "
                             "M3 Ultra)")
    args = parser.parse_args()
    try:
        ranks = [int(n) for n in args.ranks.split(",")]
        delays = [float(d) for d in args.delays.split(",")]
    except ValueError:
        parser.error("--ranks and --delays take numbers separated by commas")
    if min(ranks) < 1 or min(delays) < 0 or args.tokens < 2 or args.rounds < 1:
        parser.error("--ranks >= 1, --delays >= 0, --tokens >= 2, --rounds >= 1")
    rows = [(n, d) for n in ranks for d in (delays if n > 1 else [0.0])]
    found: dict[tuple[int, float], list[dict]] = {row: [] for row in rows}
    first = None
    for _ in range(args.rounds):
        for row in rows:
            result = run(*row, args.tokens)
            first = first or result["tokens"]
            if result["tokens"] != first:
                sys.exit(f"np={row[0]} delay={row[1]}: tokens differ from the first job's")
            found[row].append(result)
            print(f"# np={row[0]} delay={row[1]:g} us: {result['tokens_per_s']:.1f} tokens/s, "
                  f"all_reduce {result['all_reduce_share']:.0%}", flush=True)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"\n# SmolLM2-135M-Instruct, float32, {args.tokens} tokens after a "
          f"{len(found[rows[0]][0]['prompt_tokens'])}-token prompt, {cores} cores, median of "
          f"{args.rounds}")
    print("| np | link (one-way) | transport | tokens/s | all_reduce share | load s | "
          f"planner, Macs at {args.gbps_memory:g} GB/s: tokens/s (comm share) |")
    print("|---:|---|---|---:|---:|---:|---:|")
    for (n, d), results in found.items():
        speed = statistics.median(r["tokens_per_s"] for r in results)
        share = statistics.median(r["all_reduce_share"] for r in results)
        load = statistics.median(r["load_s"] for r in results)
        print(f"| {n} | {f'{d:g} us' if d else 'none (one host)'} | {'tcp' if d else 'shm'} | "
              f"{speed:.1f} | {share:.0%} | {load:.1f} | {predictions(n, d, args.gbps_memory)} |")


if __name__ == "__main__":
    main()
