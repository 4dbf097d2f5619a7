"""How a Llama-architecture model splits over N ranks, with no count that must divide.

Whole query heads go to the ranks as evenly as they split (9 heads on 4 ranks: 3, 2, 2, 2).
A rank holds the key/value heads its query heads read (grouped-query attention: query head j
reads key/value head j // (heads / kv_heads)); where the groups straddle ranks, or there are
fewer key/value heads than ranks, a key/value head is held, and computed, on every rank that
needs it. Only the attention output (one column per query head feature) and the MLP's down
projection are summed by all_reduce, and those columns are split without overlap, so the
duplicates add nothing twice. MLP features and the vocabulary of the output head split by
rows as evenly as they can; the logits come back with an all_gather of unequal parts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tbcoll.tp.layers import shard_bounds, split


@dataclass(frozen=True)
class RankPart:
    """What one rank holds of every layer: index ranges of heads, features and vocabulary."""

    rank: int
    heads: slice
    kv_heads: slice
    mlp: slice
    vocab: slice


def kv_heads_read(heads: slice, group: int) -> slice:
    """The key/value heads that query heads [start, stop) read, group query heads to each."""
    if heads.start == heads.stop:
        return slice(heads.start // group, heads.start // group)
    return slice(heads.start // group, (heads.stop - 1) // group + 1)


def plan(cfg: Any, size: int) -> list[RankPart]:
    """Every rank's part of a model of this LlamaConfig on size ranks."""
    if cfg.num_attention_heads % cfg.num_key_value_heads:
        raise ValueError(f"{cfg.num_attention_heads} query heads do not share "
                         f"{cfg.num_key_value_heads} key/value heads evenly")
    group = cfg.num_attention_heads // cfg.num_key_value_heads
    parts = []
    for rank in range(size):
        heads = shard_bounds(cfg.num_attention_heads, rank, size)
        parts.append(RankPart(rank, heads, kv_heads_read(heads, group),
                              shard_bounds(cfg.intermediate_size, rank, size),
                              shard_bounds(cfg.vocab_size, rank, size)))
    return parts


def vocab_counts(cfg: Any, size: int) -> list[int]:
    """The rows of the output head on each rank: the counts of the logits' all_gather."""
    return split(cfg.vocab_size, size)


def _length(s: slice) -> int:
    return s.stop - s.start


def parameters(cfg: Any, part: RankPart) -> int:
    """The weights this rank holds: its slices of every layer, and the whole embedding table
    and norms (replicated: each rank looks its tokens up itself)."""
    h, d = cfg.hidden_size, cfg.head_dim
    q, kv, mlp = _length(part.heads) * d, _length(part.kv_heads) * d, _length(part.mlp)
    per_layer = 2 * h + 2 * q * h + 2 * kv * h + 3 * mlp * h
    return cfg.num_hidden_layers * per_layer + cfg.vocab_size * h + h + _length(part.vocab) * h


def _span(s: slice, what: str) -> str:
    if s.start == s.stop:
        return f"no {what}"
    ids = f"{s.start}" if s.stop - s.start == 1 else f"{s.start}-{s.stop - 1}"
    return f"{what} {ids} ({s.stop - s.start})"


def describe(cfg: Any, size: int, itemsize: float = 4) -> list[str]:
    """One line per rank: what it holds, and its weights' memory at itemsize bytes each."""
    parts = plan(cfg, size)
    lines = []
    for part in parts:
        shared = [p.rank for p in parts if p.rank != part.rank
                  and max(p.kv_heads.start, part.kv_heads.start)
                  < min(p.kv_heads.stop, part.kv_heads.stop)]
        also = (f", shared with rank{'s' * (len(shared) > 1)} {', '.join(map(str, shared))}"
                if shared else "")
        mib = parameters(cfg, part) * itemsize / 2**20
        lines.append(f"rank {part.rank}: {_span(part.heads, 'query heads')}, "
                     f"{_span(part.kv_heads, 'KV heads')}{also}, "
                     f"{_span(part.mlp, 'MLP rows')}, {_span(part.vocab, 'vocabulary rows')}; "
                     f"{mib:.0f} MiB")
    return lines
