"""A Llama-architecture decoder run tensor-parallel, with greedy decoding and a KV cache.

RMSNorm, rotary position embeddings (Hugging Face's rotate-half layout), grouped-query
attention and a SwiGLU MLP, loaded from a Hugging Face folder (config.json and
*.safetensors) here, or from a GGUF file (tbcoll.tp.checkpoint). Each rank holds its part of
tbcoll.tp.plan: whole query heads as evenly as they split, the key/value heads they read
(duplicated where ranks share one), its rows of every MLP and of the output head's
vocabulary. Per layer two all_reduce calls, per token one all_gather of the logits (of
unequal parts where the vocabulary does not divide). TensorParallelLlama(weights, cfg,
layers.Solo(), np.float64) is the single-process reference. xp=mlx.core computes with mlx
arrays instead of numpy's.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import MISSING, asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tbcoll.tp.layers import AllToShardedLinear, ShardedToAllLinear, as_array
from tbcoll.tp.plan import RankPart, vocab_counts
from tbcoll.tp.plan import part as rank_part


@dataclass(frozen=True)
class LlamaConfig:
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    num_hidden_layers: int
    vocab_size: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048

    def __post_init__(self) -> None:
        """Refuse a shape no Llama has, in one line, before anything is split or loaded."""
        sizes = ("hidden_size", "intermediate_size", "num_attention_heads",
                 "num_key_value_heads", "num_hidden_layers", "vocab_size",
                 "max_position_embeddings")
        for name in sizes:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} {value!r}: give a whole number, 1 or more")
        heads, kv_heads = self.num_attention_heads, self.num_key_value_heads
        if heads % kv_heads:
            raise ValueError(f"{heads} query heads do not share {kv_heads} key/value heads "
                             f"evenly (num_attention_heads must be a multiple of "
                             f"num_key_value_heads)")
        if self.hidden_size % (2 * heads):
            raise ValueError(f"hidden_size {self.hidden_size} is not {heads} query heads of "
                             f"an even size (rotary embeddings rotate half of each head)")

    @classmethod
    def from_file(cls, path: Path) -> LlamaConfig:
        """The config of a Hugging Face config.json; ValueError naming the file where it is
        not JSON, lacks a size or holds an impossible one."""
        try:
            c = json.loads(Path(path).read_text())
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"{path}: not a JSON config ({e})") from None
        if not isinstance(c, dict):
            raise ValueError(f"{path}: not a JSON config (an object is needed)")
        if c.get("hidden_act", "silu") != "silu":
            raise ValueError(f"{path}: hidden_act {c['hidden_act']!r} is not silu")
        names = cls.__dataclass_fields__
        missing = [n for n, f in names.items() if f.default is MISSING and n not in c]
        if missing:
            raise ValueError(f"{path}: {', '.join(missing)} missing (a Llama config has them)")
        try:
            return cls(**{k: v for k, v in c.items() if k in names})
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


NO_WEIGHTS = ("{folder}: no *.safetensors (the weights) beside config.json; give a folder "
              "with both, or a .gguf file")


def load_checkpoint(folder: Path) -> tuple[LlamaConfig, dict[str, np.ndarray]]:
    from safetensors.numpy import load_file

    folder = Path(folder)
    weights: dict[str, np.ndarray] = {}
    for file in sorted(folder.glob("*.safetensors")):
        weights.update(load_file(str(file)))
    if not weights:
        raise FileNotFoundError(NO_WEIGHTS.format(folder=folder))
    if any(name.endswith(".scales") for name in weights):
        raise ValueError(f"{folder}: a quantized mlx-lm checkpoint (*.scales); give one in "
                         f"float16, bfloat16 or float32, or a GGUF file")
    return LlamaConfig.from_file(folder / "config.json"), weights


def write_random_checkpoint(folder: Path, cfg: LlamaConfig, seed: int = 0) -> None:
    """A checkpoint of random weights in Hugging Face's Llama layout (for tests, benchmarks)."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    h, i, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim

    def matrix(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

    w = {"model.embed_tokens.weight": matrix(cfg.vocab_size, h),
         "model.norm.weight": np.ones(h, np.float32), "lm_head.weight": matrix(cfg.vocab_size, h)}
    for layer in range(cfg.num_hidden_layers):
        p = f"model.layers.{layer}."
        w |= {p + "input_layernorm.weight": np.ones(h, np.float32),
              p + "post_attention_layernorm.weight": np.ones(h, np.float32),
              p + "self_attn.q_proj.weight": matrix(cfg.num_attention_heads * d, h),
              p + "self_attn.k_proj.weight": matrix(cfg.num_key_value_heads * d, h),
              p + "self_attn.v_proj.weight": matrix(cfg.num_key_value_heads * d, h),
              p + "self_attn.o_proj.weight": matrix(h, cfg.num_attention_heads * d),
              p + "mlp.gate_proj.weight": matrix(i, h), p + "mlp.up_proj.weight": matrix(i, h),
              p + "mlp.down_proj.weight": matrix(h, i)}
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(
        {**asdict(cfg), "architectures": ["LlamaForCausalLM"], "hidden_act": "silu"}, indent=1))
    save_file(w, str(folder / "model.safetensors"))


def _rms_norm(x: Any, weight: Any, eps: float) -> Any:
    return x * ((x * x).mean(-1, keepdims=True) + eps) ** -0.5 * weight


def _rotate(x: Any, cos: Any, sin: Any, xp: Any) -> Any:
    half = x.shape[-1] // 2
    rotated = xp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin


def _features(heads: slice, d: int) -> slice:
    """The rows (or columns) of a projection that belong to these heads."""
    return slice(heads.start * d, heads.stop * d)


def _part(w: Mapping, name: str, rows: slice = slice(None),
          columns: slice = slice(None)) -> np.ndarray:
    """w[name][rows, columns], read as such where the checkpoint can (a GGUF file's
    quantized tensors: tbcoll.tp.checkpoint.GGUFWeights.part)."""
    part = getattr(w, "part", None)
    return part(name, rows, columns) if part is not None else w[name][rows, columns]


class _Layer:
    def __init__(self, w: Mapping, p: str, cfg: LlamaConfig, comm: Any, part: RankPart,
                 dtype: np.dtype, xp: Any) -> None:
        d = cfg.head_dim
        self.heads = part.heads.stop - part.heads.start
        self.kv_heads = part.kv_heads.stop - part.kv_heads.start
        self.d, self.eps, self.xp = d, cfg.rms_norm_eps, xp
        group = cfg.num_attention_heads // cfg.num_key_value_heads
        # the key/value head (of this rank's) that each of its query heads reads
        kv_of_head = np.arange(part.heads.start, part.heads.stop) // group - part.kv_heads.start
        self.kv_of_head = kv_of_head if xp is np else xp.array(kv_of_head)
        a, m = p + "self_attn.", p + "mlp."
        q_rows, kv_rows = _features(part.heads, d), _features(part.kv_heads, d)

        def column(name: str, rows: slice) -> AllToShardedLinear:
            return AllToShardedLinear.from_full(_part(w, name + ".weight", rows=rows), None,
                                                comm, dtype, xp, slice(None))

        def row(name: str, columns: slice) -> ShardedToAllLinear:
            return ShardedToAllLinear.from_full(_part(w, name + ".weight", columns=columns),
                                                None, comm, dtype, xp, slice(None))

        self.q, self.k, self.v = (column(a + "q_proj", q_rows), column(a + "k_proj", kv_rows),
                                  column(a + "v_proj", kv_rows))
        self.o = row(a + "o_proj", q_rows)
        self.gate, self.up = column(m + "gate_proj", part.mlp), column(m + "up_proj", part.mlp)
        self.down = row(m + "down_proj", part.mlp)
        self.norm1 = as_array(w[p + "input_layernorm.weight"], dtype, xp)
        self.norm2 = as_array(w[p + "post_attention_layernorm.weight"], dtype, xp)
        self.cache_k = self.cache_v = None  # (kv_heads, positions, d), this rank's heads

    def __call__(self, x: Any, cos: Any, sin: Any) -> Any:
        xp, t = self.xp, x.shape[0]  # tokens of this step (the prompt, then one at a time)
        h = _rms_norm(x, self.norm1, self.eps)
        q = _rotate(self.q(h).reshape(t, self.heads, self.d).transpose(1, 0, 2), cos, sin, xp)
        k = _rotate(self.k(h).reshape(t, self.kv_heads, self.d).transpose(1, 0, 2), cos, sin,
                    xp)
        v = self.v(h).reshape(t, self.kv_heads, self.d).transpose(1, 0, 2)
        self.cache_k = k if self.cache_k is None else xp.concatenate([self.cache_k, k], 1)
        self.cache_v = v if self.cache_v is None else xp.concatenate([self.cache_v, v], 1)
        keys = xp.take(self.cache_k, self.kv_of_head, axis=0)
        values = xp.take(self.cache_v, self.kv_of_head, axis=0)
        scores = q @ keys.transpose(0, 2, 1) * (1.0 / math.sqrt(self.d))
        if t > 1:  # a query at position total-t+i sees keys up to it
            total = keys.shape[1]
            future = np.arange(total)[None, :] > (np.arange(t) + total - t)[:, None]
            scores = xp.where(xp.array(future) if xp is not np else future, -np.inf, scores)
        probs = xp.exp(scores - scores.max(-1, keepdims=True))
        probs = probs / probs.sum(-1, keepdims=True)
        context = (probs @ values).transpose(1, 0, 2).reshape(t, self.heads * self.d)
        x = x + self.o(context)
        h = _rms_norm(x, self.norm2, self.eps)
        gate = self.gate(h)
        return x + self.down(gate / (1.0 + xp.exp(-gate)) * self.up(h))  # silu(gate) * up


class TensorParallelLlama:
    def __init__(self, weights: Mapping[str, np.ndarray], cfg: LlamaConfig, comm: Any,
                 dtype: np.dtype = np.float32, xp: Any = np) -> None:
        self.cfg, self.comm, self.dtype, self.xp = cfg, comm, np.dtype(dtype), xp
        held = rank_part(cfg, comm.rank, comm.size)
        embed = weights["model.embed_tokens.weight"]
        self.embed = as_array(embed, dtype, xp)
        self.norm = as_array(weights["model.norm.weight"], dtype, xp)
        self.layers = [_Layer(weights, f"model.layers.{i}.", cfg, comm, held, dtype, xp)
                       for i in range(cfg.num_hidden_layers)]
        head = weights["lm_head.weight"] if "lm_head.weight" in weights else embed  # tied
        self.head = AllToShardedLinear.from_full(head, None, comm, dtype, xp, held.vocab)
        self.vocab_counts = vocab_counts(cfg, comm.size)
        d = cfg.head_dim
        self.inv_freq = 1.0 / cfg.rope_theta ** (np.arange(0, d, 2) / d)
        self.position = 0

    def reset(self) -> None:
        for layer in self.layers:
            layer.cache_k = layer.cache_v = None
        self.position = 0

    def forward(self, tokens: np.ndarray) -> Any:
        """Logits (vocab,) after the last of these tokens, extending the KV cache."""
        ids = tokens if self.xp is np else self.xp.array(tokens)
        return self.logits(self.run_layers(self.embed[ids]))

    def run_layers(self, x: np.ndarray) -> np.ndarray:
        """The hidden states (tokens, hidden) after every layer, for tokens at the next
        positions; extends the KV cache."""
        t = x.shape[0]
        angles = np.outer(np.arange(self.position, self.position + t), self.inv_freq)
        angles = np.concatenate([angles, angles], axis=-1)
        cos, sin = (as_array(f(angles), self.dtype, self.xp) for f in (np.cos, np.sin))
        for layer in self.layers:
            x = layer(x, cos, sin)
        self.position += t
        return x

    def logits(self, x: np.ndarray) -> np.ndarray:
        """The whole vocabulary's logits after the last hidden state (one all_gather of each
        rank's rows of the vocabulary)."""
        local = self.head(_rms_norm(x[-1:], self.norm, self.cfg.rms_norm_eps))[0]
        return self.comm.all_gather(local, counts=self.vocab_counts)

    def stream(self, prompt: list[int], max_tokens: int, stop: frozenset[int] = frozenset()
               ) -> Iterator[tuple[int, np.ndarray]]:
        """Greedy decoding: each token as it is chosen, with the logits that chose it; ends
        after max_tokens or a stop token (which is yielded). Every rank gets the same logits
        bit for bit, so every rank chooses the same token. ValueError where the prompt and
        max_tokens pass the model's context (positions it never learned)."""
        context = self.cfg.max_position_embeddings
        if len(prompt) + max_tokens > context:
            raise ValueError(f"a prompt of {len(prompt)} tokens and {max_tokens} more pass the "
                             f"model's context of {context} tokens")
        self.reset()
        logits = self.forward(np.asarray(prompt))
        for step in range(max_tokens):
            logits = np.asarray(logits)
            token = int(np.argmax(logits))
            yield token, logits
            if token in stop or step == max_tokens - 1:
                return
            logits = self.forward(np.asarray([token]))

    def generate(self, prompt: list[int], steps: int) -> tuple[list[int], list[np.ndarray]]:
        """Greedy decoding: the tokens after the prompt, and the logits that chose each."""
        tokens, trace = [], []
        for token, logits in self.stream(prompt, steps):
            tokens.append(token)
            trace.append(logits)
        return tokens, trace
