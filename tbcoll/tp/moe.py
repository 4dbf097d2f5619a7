"""A mixture-of-experts layer (Mixtral's shape: a router picks the top k of E SwiGLU experts
for each token and mixes their outputs with the softmax of the chosen logits), run two ways:

- expert parallel (ExpertParallelMoE): rank r holds experts [r*E/p, (r+1)*E/p) whole and its
  own share of the tokens. Each token goes to the ranks holding its experts with one
  all_to_all with counts (dispatch: each row with its expert's index in one more column), the
  experts run there, and the results come back with a second (combine, whose counts are
  known): 2 all_to_alls of k x hidden values per token and one exchange of counts per layer;
  each rank computes only the experts it holds.
- tensor parallel (TensorParallelMoE): every rank holds 1/p of every expert (its w1 and w3
  rows, its w2 columns) and every token; each rank runs all k chosen experts on its slice and
  one all_reduce of hidden values per token sums them.

reference_moe is the single-process float64 version both are checked against. Weights:
gate (E, hidden); per expert w1, w3 (ffn, hidden) and w2 (hidden, ffn), as Mixtral stores them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tbcoll.tp.layers import even_bounds, shard_bounds


@dataclass(frozen=True)
class MoeWeights:
    gate: np.ndarray  # (experts, hidden)
    w1: np.ndarray  # (experts, ffn, hidden)
    w3: np.ndarray  # (experts, ffn, hidden)
    w2: np.ndarray  # (experts, hidden, ffn)
    top_k: int

    @classmethod
    def random(cls, experts: int, hidden: int, ffn: int, top_k: int,
               seed: int = 0) -> MoeWeights:
        rng = np.random.default_rng(seed)
        scale = 1 / np.sqrt(hidden)
        return cls(rng.standard_normal((experts, hidden)) * scale,
                   rng.standard_normal((experts, ffn, hidden)) * scale,
                   rng.standard_normal((experts, ffn, hidden)) * scale,
                   rng.standard_normal((experts, hidden, ffn)) / np.sqrt(ffn), top_k)

    @property
    def experts(self) -> int:
        return self.gate.shape[0]


def route(x: np.ndarray, gate: np.ndarray, top_k: int) -> tuple[np.ndarray, np.ndarray]:
    """Each token's top_k experts (tokens, k), in order of logit, and their mixing weights."""
    logits = x @ gate.T
    chosen = np.argsort(-logits, axis=1, kind="stable")[:, :top_k]
    picked = np.take_along_axis(logits, chosen, axis=1)
    weights = np.exp(picked - picked.max(axis=1, keepdims=True))
    return chosen, weights / weights.sum(axis=1, keepdims=True)


def _swiglu(x: np.ndarray, w1: np.ndarray, w3: np.ndarray, w2: np.ndarray) -> np.ndarray:
    up = x @ w1.T
    return (up / (1 + np.exp(-up)) * (x @ w3.T)) @ w2.T


def reference_moe(x: np.ndarray, w: MoeWeights) -> np.ndarray:
    """The layer in one process, in float64."""
    x = x.astype(np.float64)
    chosen, weights = route(x, w.gate, w.top_k)
    y = np.zeros_like(x)
    for t in range(x.shape[0]):
        for e, g in zip(chosen[t], weights[t], strict=True):
            y[t] += g * _swiglu(x[t:t + 1], w.w1[e], w.w3[e], w.w2[e])[0]
    return y


class ExpertParallelMoE:
    """Experts split across ranks; each rank's own tokens travel to their experts and back."""

    def __init__(self, w: MoeWeights, comm: Any, dtype: np.dtype = np.float32) -> None:
        mine = even_bounds(w.experts, comm.rank, comm.size, "the experts")
        self.comm, self.top_k, self.dtype = comm, w.top_k, np.dtype(dtype)
        self.per_rank = mine.stop - mine.start
        self.gate = w.gate.astype(dtype)
        self.w1, self.w3, self.w2 = (a[mine].astype(dtype) for a in (w.w1, w.w3, w.w2))

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """x: this rank's tokens (tokens, hidden); returns their outputs."""
        tokens, hidden = x.shape
        chosen, weights = route(x, self.gate, self.top_k)
        owner = chosen.reshape(-1) // self.per_rank  # (token, slot) pairs, by the rank to go to
        order = np.argsort(owner, kind="stable")
        counts = np.bincount(owner, minlength=self.comm.size)
        # each row carries the index of its expert on the receiving rank in one more column
        # (exact in every float dtype: fewer than 256 experts a rank)
        rows = np.empty((tokens * self.top_k, hidden + 1), x.dtype)
        rows[:, :hidden] = np.repeat(x, self.top_k, axis=0)[order]
        rows[:, hidden] = (chosen.reshape(-1) % self.per_rank)[order]
        arrived, received = self.comm.all_to_all(rows, counts)  # dispatch
        experts = arrived[:, hidden].astype(np.int64)
        done = np.empty((arrived.shape[0], hidden), x.dtype)
        for e in range(self.per_rank):
            here = experts == e
            if here.any():
                done[here] = _swiglu(arrived[here, :hidden], self.w1[e], self.w3[e], self.w2[e])
        back, _ = self.comm.all_to_all(done, received, recv_counts=counts)  # combine
        mixed = np.empty_like(back)
        mixed[order] = back  # the (token, slot) order again
        mixed = mixed.reshape(tokens, self.top_k, hidden) * weights[..., None].astype(x.dtype)
        return mixed.sum(axis=1)


class TensorParallelMoE:
    """Every expert split across ranks; every rank runs every token, one all_reduce sums."""

    def __init__(self, w: MoeWeights, comm: Any, dtype: np.dtype = np.float32) -> None:
        part = shard_bounds(w.w1.shape[1], comm.rank, comm.size)
        self.comm, self.top_k = comm, w.top_k
        self.gate = w.gate.astype(dtype)
        self.w1 = w.w1[:, part].astype(dtype)
        self.w3 = w.w3[:, part].astype(dtype)
        self.w2 = w.w2[:, :, part].astype(dtype)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """x: every token (the same on every rank); returns every token's output."""
        chosen, weights = route(x, self.gate, self.top_k)
        y = np.zeros_like(x)
        for e in np.unique(chosen):
            tokens, slot = np.nonzero(chosen == e)
            g = weights[tokens, slot].astype(x.dtype)[:, None]
            y[tokens] += g * _swiglu(x[tokens], self.w1[e], self.w3[e], self.w2[e])
        return self.comm.all_reduce(y, out=y)
