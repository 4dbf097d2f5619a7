"""Would a tensor-parallel prefill gain from comm.empty? (issue 25)

    T=glibc.malloc.mmap_threshold=268435456:glibc.malloc.trim_threshold=1073741824
    TBCOLL_SHM_CMA=0 tbrun -np 2 -x GLIBC_TUNABLES=$T -x OMP_NUM_THREADS=1 \\
        -x OPENBLAS_NUM_THREADS=1 python benchmarks/tp_prefill.py --model llama --tokens 256,1024

One forward pass over many tokens (llama: a prompt, TinyLlama's shape with random weights as
in tp_decode.py; bert: all-MiniLM-L6-v2 over a batch of 128-token sequences), run two ways and
alternated round by round:
- fresh: the layers as they are; each row-parallel layer all-reduces its new matmul result.
- empty: where the message is over 1 MiB (where comm.empty's direct all_reduce starts), each
  row-parallel layer computes its partial sum into one comm.empty buffer that the model reuses
  (np.matmul(out=), a prefix of a buffer as large as the largest message yet) and all-reduces
  it there; the model consumes each result (x + y) before the next layer's call.
Each round also times the all_reduce calls alone, with an untimed barrier before each (so that
waiting for the slower rank's compute is not counted). Every round's output must be bitwise the
same both ways; rank 0 prints one row per size.

GLIBC_TUNABLES pins glibc's malloc thresholds: with the default, adaptive ones, large
temporaries are sometimes fresh mappings, page-faulted on every call, which moved empty/fresh
by up to ~25% either way from job to job (benchmarks/RESULTS.md, section 6).
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from pathlib import Path

import numpy as np

import tbcoll
from tbcoll.tp.layers import ShardedToAllLinear
from tbcoll.transports.shm.native import SLOT

SEQUENCE = 128  # bert: tokens per sequence of the batch


class TimedComm:
    """The communicator as the model sees it, with its all_reduce calls timed; with `alone`,
    after a barrier each."""

    def __init__(self, comm: tbcoll.Communicator) -> None:
        self.comm, self.rank, self.size = comm, comm.rank, comm.size
        self.seconds, self.alone = 0.0, False

    def all_reduce(self, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        if self.alone:
            self.comm.barrier()
        started = time.perf_counter()
        y = self.comm.all_reduce(x, out=out)
        self.seconds += time.perf_counter() - started
        return y

    def all_gather(self, x: np.ndarray, counts: list[int] | None = None) -> np.ndarray:
        return self.comm.all_gather(x, counts=counts)

    def empty(self, shape: int, dtype: np.dtype) -> np.ndarray:
        return self.comm.empty(shape, dtype)


class SharedBuffer:
    """One comm.empty buffer for every row-parallel layer of a model, as large as the largest
    message yet; each call views a prefix of it."""

    def __init__(self, comm: TimedComm) -> None:
        self.comm, self.buffer, self.calls = comm, None, 0

    def view(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        count = math.prod(shape)
        self.calls += 1
        if self.buffer is None or self.buffer.size < count:
            self.buffer = self.comm.empty(count, dtype)  # collective: the same on every rank
        return self.buffer[:count].reshape(shape)


class IntoSharedBuffer:
    """A ShardedToAllLinear whose partial sums over 1 MiB go into the shared buffer."""

    def __init__(self, linear: ShardedToAllLinear, shared: SharedBuffer) -> None:
        self.linear, self.shared = linear, shared

    def __call__(self, x: np.ndarray) -> np.ndarray:
        linear = self.linear
        shape = (*x.shape[:-1], linear.weight_t.shape[1])
        if math.prod(shape) * x.itemsize <= SLOT:
            return linear(x)
        out = self.shared.view(shape, x.dtype)
        np.matmul(x, linear.weight_t, out=out)
        y = linear.comm.all_reduce(out, out=out)
        if linear.bias is not None:
            y += linear.bias
        return y


def llama(comm: TimedComm, layers: int):
    """The model, a function of a token count that runs one forward pass and returns its
    output, the names of each layer's row-parallel layers, and the hidden size."""
    from tp_decode import SHAPE

    from tbcoll.tp import llama as tp_llama

    with tempfile.TemporaryDirectory() as mine:
        name = np.zeros(256, np.uint8)  # rank 0 writes the checkpoint; its folder, to all
        if comm.rank == 0:
            tp_llama.write_random_checkpoint(
                Path(mine), tp_llama.LlamaConfig(num_hidden_layers=layers, **SHAPE))
            name[:len(mine)] = np.frombuffer(mine.encode(), np.uint8)
        folder = comm.comm.broadcast(name).tobytes().rstrip(b"\0").decode()
        cfg, weights = tp_llama.load_checkpoint(Path(folder))
        comm.comm.barrier()  # every rank has read it before rank 0 removes it
    model = tp_llama.TensorParallelLlama(weights, cfg, comm)

    def prefill(tokens: int) -> np.ndarray:
        model.reset()
        return model.forward(np.random.default_rng(tokens).integers(0, cfg.vocab_size, tokens))

    return model, prefill, ("o", "down"), cfg.hidden_size


def bert(comm: TimedComm, layers: int):
    """As llama() (layers: MiniLM's own 6)."""
    from tbcoll.tp.bert import BertConfig, TensorParallelBert, load_weights, minilm_dir

    folder = minilm_dir()
    cfg = BertConfig.from_file(folder / "config.json")
    model = TensorParallelBert(load_weights(folder), cfg, comm)

    def prefill(tokens: int) -> np.ndarray:
        ids = np.random.default_rng(tokens).integers(1000, 30000, (tokens // SEQUENCE, SEQUENCE))
        return model.embed(ids, np.ones_like(ids))

    return model, prefill, ("attn_out", "down"), cfg.hidden


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("llama", "bert"), default="llama")
    parser.add_argument("--tokens", default="256,1024", metavar="N,N,...",
                        help="tokens per forward pass (bert: a multiple of 128; default: "
                             "%(default)s)")
    parser.add_argument("--layers", type=int, default=2,
                        help="llama's layers (bert has its 6; default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=8, help="default: %(default)s")
    args = parser.parse_args()
    sizes = [int(n) for n in args.tokens.split(",")]
    if args.model == "bert" and any(n % SEQUENCE for n in sizes):
        parser.error(f"--tokens: bert takes sequences of {SEQUENCE} tokens")
    with tbcoll.init() as world:
        comm = TimedComm(world)
        model, prefill, row_parallel, hidden = (llama if args.model == "llama" else bert)(
            comm, args.layers)
        shared = SharedBuffer(comm)
        ways = {"fresh": [], "empty": []}  # (layer, attribute, the object it holds that way)
        for layer in model.layers:
            for attribute in row_parallel:
                linear = getattr(layer, attribute)
                ways["fresh"].append((layer, attribute, linear))
                ways["empty"].append((layer, attribute, IntoSharedBuffer(linear, shared)))
        if world.rank == 0:
            print(f"# {args.model}, np={world.size}, {args.rounds} rounds: forward pass ms "
                  "(median [range]), empty/fresh per round, all_reduce ms per pass alone")
            print("| tokens | message MiB | fresh | empty | empty/fresh | all_reduce fresh | "
                  "all_reduce empty | calls into the buffer per pass | same bits |")
            print("|---:|---:|---:|---:|---:|---:|---:|---:|---|", flush=True)
        for tokens in sizes:
            shared.calls = 0
            times = {(way, alone): [] for way in ways for alone in (False, True)}
            same, reference = True, None
            for round_ in range(args.rounds + 1):  # the first warms up
                for alone in (False, True):
                    for way, swaps in ways.items():
                        for layer, attribute, linear in swaps:
                            setattr(layer, attribute, linear)
                        comm.seconds, comm.alone = 0.0, alone
                        world.barrier()
                        started = time.perf_counter()
                        result = np.array(prefill(tokens))
                        spent = [time.perf_counter() - started, comm.seconds]
                        spent = world.all_reduce(np.array(spent), op="max") * 1e3
                        reference = result if reference is None else reference
                        same &= result.tobytes() == reference.tobytes()
                        if round_:
                            times[way, alone].append(spent[1] if alone else spent[0])
            if world.rank == 0:
                passes = 2 * (args.rounds + 1)  # those of the empty way
                print(row(tokens, hidden, times, shared.calls / passes, same), flush=True)


def row(tokens: int, hidden: int, times: dict, calls: float, same: bool) -> str:
    def spread(values: list[float]) -> str:
        return f"{np.median(values):.1f} [{min(values):.1f}-{max(values):.1f}]"

    ratio = np.array(times["empty", False]) / np.array(times["fresh", False])
    message = tokens * hidden * 4 / 2**20  # MiB of float32, the models' dtype
    return (f"| {tokens} | {message:.1f} | {spread(times['fresh', False])} | "
            f"{spread(times['empty', False])} | {np.median(ratio):.3f} "
            f"[{ratio.min():.3f}-{ratio.max():.3f}] | {spread(times['fresh', True])} | "
            f"{spread(times['empty', True])} | {calls:g} | {same} |")


if __name__ == "__main__":
    main()
