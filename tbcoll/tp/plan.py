"""How a Llama-architecture model splits over N ranks, with no count that must divide.

Whole query heads go to the ranks as evenly as they split (9 heads on 4 ranks: 3, 2, 2, 2).
A rank holds the key/value heads its query heads read (grouped-query attention: query head j
reads key/value head j // (heads / kv_heads)); where the groups straddle ranks, or there are
fewer key/value heads than ranks, a key/value head is held, and computed, on every rank that
needs it. Only the attention output (one column per query head feature) and the MLP's down
projection are summed by all_reduce, and those columns are split without overlap, so the
duplicates add nothing twice. MLP features and the vocabulary of the output head split by
rows as evenly as they can; the logits come back with an all_gather of unequal parts.
Ranks beyond the query heads hold none (their attention adds zero to the all_reduce) and
still hold their MLP and vocabulary rows.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from tbcoll.tp.layers import owner, shard_bounds, split


@dataclass(frozen=True)
class RankPart:
    """What one rank holds of every layer: index ranges of heads, features and vocabulary.
    Where ranks outnumber query heads, the last hold none: their attention adds zero to the
    all_reduce, and they still hold their MLP and vocabulary rows."""

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


def _group(cfg: Any) -> int:
    """Query heads per key/value head (the shape is refused where that is not a whole number)."""
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    if kv_heads < 1 or heads < 1 or heads % kv_heads:
        raise ValueError(f"{heads} query heads do not share {kv_heads} key/value heads evenly")
    return heads // kv_heads


def part(cfg: Any, rank: int, size: int) -> RankPart:
    """Rank's part of a model of this LlamaConfig on size ranks (the others' not computed)."""
    heads = shard_bounds(cfg.num_attention_heads, rank, size)
    return RankPart(rank, heads, kv_heads_read(heads, _group(cfg)),
                    shard_bounds(cfg.intermediate_size, rank, size),
                    shard_bounds(cfg.vocab_size, rank, size))


def plan(cfg: Any, size: int) -> list[RankPart]:
    """Every rank's part of a model of this LlamaConfig on size ranks."""
    return [part(cfg, rank, size) for rank in range(size)]


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


def sharing(cfg: Any, part: RankPart, size: int) -> list[int]:
    """The other ranks that hold one of this rank's key/value heads: those holding a query
    head that reads one, a run of neighbours found by division (no scan of every rank)."""
    if part.kv_heads.start == part.kv_heads.stop:
        return []
    group, heads = _group(cfg), cfg.num_attention_heads
    first = owner(part.kv_heads.start * group, heads, size)
    last = owner(part.kv_heads.stop * group - 1, heads, size)
    return [rank for rank in range(first, last + 1) if rank != part.rank]


def lines(cfg: Any, size: int, itemsize: float = 4) -> Iterator[str]:
    """describe's lines one at a time, each rank's made as it is asked for: the first comes
    at once whatever the size, and all of them take time linear in it."""
    for rank in range(size):
        held = part(cfg, rank, size)
        shared = sharing(cfg, held, size)
        also = (f", shared with rank{'s' * (len(shared) > 1)} {', '.join(map(str, shared))}"
                if shared else "")
        mib = parameters(cfg, held) * itemsize / 2**20
        yield (f"rank {rank}: {_span(held.heads, 'query heads')}, "
               f"{_span(held.kv_heads, 'KV heads')}{also}, "
               f"{_span(held.mlp, 'MLP rows')}, {_span(held.vocab, 'vocabulary rows')}; "
               f"{mib:.0f} MiB")


def describe(cfg: Any, size: int, itemsize: float = 4) -> list[str]:
    """One line per rank: what it holds, and its weights' memory at itemsize bytes each."""
    return list(lines(cfg, size, itemsize))
