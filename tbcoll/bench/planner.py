"""Tokens/s of greedy decoding (one sequence) split over N machines: tensor parallel against
pipeline parallel, from the model's shape, each machine's memory bandwidth and the link.

Decoding one token reads every weight once, so a machine's compute time is the bytes it
holds divided by its memory bandwidth. Tensor parallel (tbcoll.tp.llama, mlx-lm's sharding):
each machine reads 1/N of the weights, and each layer all-reduces the hidden state twice, then
the logits are gathered. Pipeline parallel: the token passes through the machines in turn, so
every weight is still read in sequence; each boundary costs one message of the hidden state,
and the chosen token goes back by broadcast.

A message of n bytes costs alpha + n * beta; a small all-reduce costs its algorithm's steps
(tbcoll.bench.model: recursive doubling below a few KB), or a measured time per call
(--allreduce-us, e.g. MLX's all_sum over Thunderbolt RDMA, which costs more than the raw link).

    python -m tbcoll.bench.model plan --config config.json -N 4 --gbps-memory 819 --alpha-us 30
"""

from __future__ import annotations

from dataclasses import dataclass

from tbcoll.bench.model import ALGORITHMS, predict

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "int8": 1, "q4": 0.5625}
# TinyLlama-1.1B's config.json, the default shape
TINYLLAMA = dict(hidden_size=2048, intermediate_size=5632, num_attention_heads=32,
                 num_key_value_heads=4, num_hidden_layers=22, vocab_size=32000)
SHAPE_FLAGS = {"--layers": "num_hidden_layers", "--hidden": "hidden_size",
               "--ffn": "intermediate_size", "--heads": "num_attention_heads",
               "--kv-heads": "num_key_value_heads", "--vocab": "vocab_size"}


@dataclass(frozen=True)
class Shape:
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    layers: int
    vocab: int
    dtype_bytes: float

    def __post_init__(self) -> None:
        counts = {"hidden": self.hidden, "ffn": self.ffn, "heads": self.heads,
                  "kv_heads": self.kv_heads, "layers": self.layers, "vocab": self.vocab}
        if bad := [f"{name} {value!r}" for name, value in counts.items()
                   if not isinstance(value, int) or value < 1]:
            raise ValueError(f"{', '.join(bad)}: each must be a whole number of at least 1")
        if self.heads % self.kv_heads or self.hidden % self.heads:
            raise ValueError(f"kv_heads {self.kv_heads} must divide heads {self.heads}, and "
                             f"heads must divide hidden {self.hidden}")

    @classmethod
    def from_config(cls, config: dict, dtype_bytes: float) -> Shape:
        """From a Hugging Face config.json's fields."""
        return cls(config["hidden_size"], config["intermediate_size"],
                   config["num_attention_heads"],
                   config.get("num_key_value_heads", config["num_attention_heads"]),
                   config["num_hidden_layers"], config["vocab_size"], dtype_bytes)

    @property
    def layer_bytes(self) -> float:
        kv = self.hidden // self.heads * self.kv_heads
        params = 2 * self.hidden * self.hidden + 2 * self.hidden * kv + 3 * self.hidden * self.ffn
        return params * self.dtype_bytes

    @property
    def head_bytes(self) -> float:
        """The output projection, read for every token (the embedding is one row)."""
        return self.vocab * self.hidden * self.dtype_bytes

    @property
    def weight_bytes(self) -> float:
        return self.layers * self.layer_bytes + self.head_bytes


@dataclass(frozen=True)
class Link:
    alpha: float  # seconds per message
    beta: float  # seconds per byte
    allreduce: float | None = None  # seconds per small all-reduce, if measured

    def message(self, nbytes: float) -> float:
        return self.alpha + nbytes * self.beta

    def all_reduce(self, n: int, nbytes: float) -> float:
        if self.allreduce is not None:
            return self.allreduce
        return self._best("all_reduce", n, nbytes)

    def all_gather(self, n: int, nbytes: float) -> float:
        """nbytes: the gathered result."""
        return self._best("all_gather", n, nbytes)

    def _best(self, collective: str, n: int, nbytes: float) -> float:
        """The time of the fastest algorithm the alpha-beta model prices."""
        return min(predict(collective, algorithm, n, nbytes, self.alpha, self.beta)
                   for algorithm in ALGORITHMS)


@dataclass(frozen=True)
class Plan:
    mode: str
    machines: int
    compute: float  # seconds per token
    comm: float

    @property
    def tokens_per_s(self) -> float:
        return 1.0 / (self.compute + self.comm)

    @property
    def comm_share(self) -> float:
        return self.comm / (self.compute + self.comm)


def plan(shape: Shape, machines: int, bandwidth: float, link: Link) -> list[Plan]:
    """bandwidth: each machine's memory bandwidth, bytes/s. TP, then PP (machines > 1)."""
    n = machines
    hidden_bytes = shape.hidden * shape.dtype_bytes
    if n == 1:
        return [Plan("tp", 1, shape.weight_bytes / bandwidth, 0.0)]
    tp_comm = (2 * shape.layers * link.all_reduce(n, hidden_bytes)
               + link.all_gather(n, shape.vocab * 4))  # float32 logits
    pp_comm = (n - 1) * link.message(hidden_bytes) + link.all_reduce(n, 8)  # token: broadcast
    return [Plan("tp", n, shape.weight_bytes / n / bandwidth, tp_comm),
            Plan("pp", n, shape.weight_bytes / bandwidth, pp_comm)]
