"""The main job: all-MiniLM-L6-v2 sentence embeddings, tensor-parallel over the ranks.

    tbrun -np 4 examples/tp_forward.py          # numpy arrays
    tbrun -np 4 examples/tp_forward.py --mlx    # the same with mlx arrays

Every rank loads the weights and keeps 1/N of every layer (3 of the 12 heads and 384 of the
1536 MLP features at np=4); each of the 6 layers all-reduces twice. Rank 0 prints the
similarity matrix, checks the embeddings against a single-process float64 reference, and
reports the time per forward pass and the share of it spent in all_reduce.
"""

import sys
import time

import numpy as np

import tbcoll
from tbcoll.tp.bert import (
    BertConfig,
    TensorParallelBert,
    load_weights,
    minilm_dir,
    reference_embeddings,
    tokenize,
)

SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "A woman is playing violin.",
    "Two men pushed carts through the woods.",
]
TOLERANCE = 1e-5  # float32 against float64
REPEATS = 10


class TimedComm:
    """The communicator, with the time spent in all_reduce counted."""

    def __init__(self, comm):
        self.comm, self.rank, self.size, self.seconds = comm, comm.rank, comm.size, 0.0

    def all_reduce(self, x, **kwargs):
        if not isinstance(x, np.ndarray):  # mlx is lazy: compute x first, outside the timing
            sys.modules["mlx.core"].eval(x)
        started = time.perf_counter()
        result = self.comm.all_reduce(x, **kwargs)
        self.seconds += time.perf_counter() - started
        return result


def main() -> int:
    xp = np
    if "--mlx" in sys.argv[1:]:
        import mlx.core as xp
    model_dir = minilm_dir()
    cfg = BertConfig.from_file(model_dir / "config.json")
    weights = load_weights(model_dir)
    ids, mask = tokenize(model_dir, SENTENCES)
    with tbcoll.init() as comm:
        timed = TimedComm(comm)
        model = TensorParallelBert(weights, cfg, timed, xp=xp)
        embeddings = model.embed(ids, mask)  # warm-up
        timed.seconds = 0.0
        comm.barrier()
        started = time.perf_counter()
        for _ in range(REPEATS):
            embeddings = np.asarray(model.embed(ids, mask))  # (mlx computes lazily: here)
        per_forward = (time.perf_counter() - started) / REPEATS
        share = timed.seconds / REPEATS / per_forward
        if comm.rank != 0:
            return 0
        print(f"all-MiniLM-L6-v2 on {comm.size} rank(s), backend {comm.backend}, "
              f"{xp.__name__} arrays: {ids.shape[0]} sentences x {ids.shape[1]} tokens")
        print("cosine similarity:")
        for sentence, row in zip(SENTENCES, embeddings @ embeddings.T, strict=True):
            print("  " + " ".join(f"{v:6.3f}" for v in row) + f"  {sentence}")
        error = float(np.abs(embeddings - reference_embeddings(weights, cfg, ids, mask)).max())
        print(f"max abs error against the float64 reference: {error:.2e} "
              f"({'OK' if error < TOLERANCE else 'TOO LARGE'}, tolerance {TOLERANCE:g})")
        print(f"time per forward pass: {per_forward * 1e3:.2f} ms, of which all_reduce "
              f"{share:.0%} ({2 * cfg.layers} calls)")
        return 0 if error < TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main())
