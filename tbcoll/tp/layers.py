"""Tensor-parallel layers, named for their data movement (as MLX names them).

- AllToShardedLinear (column parallel): the input is whole on every rank, the output is this
  rank's slice of the features. No communication.
- ShardedToAllLinear (row parallel): the input is this rank's slice of the features, the
  output is whole on every rank: a local matmul, then one all_reduce.
An attention block or an MLP is one of each, so it costs one all_reduce per forward pass.
Weights follow PyTorch/Hugging Face: weight has shape (out_features, in_features). from_full
takes numpy weights and an array module, xp: numpy (the default) or mlx.core, whose arrays
the layer then computes with. Slices need not be equal: by default a rank takes its part of
shard_bounds (as even as the count allows); a model passes its own where features come in
groups (the features of whole attention heads).
"""

from __future__ import annotations

from typing import Any

import numpy as np


class Solo:
    """A communicator of one rank: what a single-process reference model runs with."""

    rank, size = 0, 1

    def all_reduce(self, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        return x

    def all_gather(self, x: np.ndarray, counts: Any = None) -> np.ndarray:
        return x


def split(total: int, size: int) -> list[int]:
    """total items in size parts as even as can be, the larger first (9 in 4: 3, 2, 2, 2)."""
    if size < 1 or total < 0:
        raise ValueError(f"Cannot split {total} items into {size} parts")
    return [total // size + (rank < total % size) for rank in range(size)]


def shard_bounds(total: int, rank: int, size: int) -> slice:
    """This rank's slice of `total` items split as evenly as possible (see split), found
    without listing the other ranks' parts: a plan of millions of ranks stays linear."""
    if size < 1 or total < 0 or not 0 <= rank < size:
        raise ValueError(f"Cannot split {total} items into {size} parts for rank {rank}")
    base, larger = divmod(total, size)  # the first `larger` ranks hold one more
    start = rank * base + min(rank, larger)
    return slice(start, start + base + (rank < larger))


def owner(index: int, total: int, size: int) -> int:
    """The rank whose shard_bounds(total, rank, size) holds item index (0 <= index < total)."""
    base, larger = divmod(total, size)
    if index < larger * (base + 1):
        return index // (base + 1)
    return larger + (index - larger * (base + 1)) // base


def even_bounds(total: int, rank: int, size: int, what: str) -> slice:
    """This rank's slice of `total` items, which must divide evenly (for code that finds an
    item's rank by division, as expert routing does)."""
    if total % size:
        raise ValueError(f"Cannot shard {what} of size {total} across {size} ranks: "
                         f"{total} is not a multiple of {size}.")
    return shard_bounds(total, rank, size)


def as_array(values: np.ndarray, dtype: np.dtype, xp: Any = np) -> Any:
    """values (numpy) as a contiguous array of dtype in the array module xp."""
    values = np.ascontiguousarray(values, dtype)
    return values if xp is np else xp.array(values)


class AllToShardedLinear:
    def __init__(self, weight_t: Any, bias: Any | None) -> None:
        self.weight_t, self.bias = weight_t, bias  # weight_t: (in, this rank's out)

    @classmethod
    def from_full(cls, weight: np.ndarray, bias: np.ndarray | None, comm: Any,
                  dtype: np.dtype = np.float32, xp: Any = np,
                  rows: slice | None = None) -> AllToShardedLinear:
        """rows: this rank's output features (default: its part of shard_bounds)."""
        if rows is None:
            rows = shard_bounds(weight.shape[0], comm.rank, comm.size)
        return cls(as_array(weight[rows].T, dtype, xp),
                   None if bias is None else as_array(bias[rows], dtype, xp))

    def __call__(self, x: Any) -> Any:
        y = x @ self.weight_t
        if self.bias is not None:
            y += self.bias
        return y


class ShardedToAllLinear:
    def __init__(self, weight_t: Any, bias: Any | None, comm: Any) -> None:
        self.weight_t, self.bias, self.comm = weight_t, bias, comm  # weight_t: (my in, out)

    @classmethod
    def from_full(cls, weight: np.ndarray, bias: np.ndarray | None, comm: Any,
                  dtype: np.dtype = np.float32, xp: Any = np,
                  columns: slice | None = None) -> ShardedToAllLinear:
        """columns: this rank's input features (default: its part of shard_bounds)."""
        if columns is None:
            columns = shard_bounds(weight.shape[1], comm.rank, comm.size)
        return cls(as_array(weight[:, columns].T, dtype, xp),
                   None if bias is None else as_array(bias, dtype, xp), comm)

    def __call__(self, x: Any) -> Any:
        partial_sum = x @ self.weight_t
        if isinstance(partial_sum, np.ndarray):  # in place (mlx arrays are immutable)
            # as one row: tcp under TBCOLL_LINK_DELAY_US loses a 2-D array's bytes (its send
            # counts a memoryview's len, rows, as bytes); a 1-D view costs nothing
            flat = partial_sum.reshape(-1)
            y = self.comm.all_reduce(flat, out=flat).reshape(partial_sum.shape)
        else:
            y = self.comm.all_reduce(partial_sum)
        if self.bias is not None:  # added once, after the sum, not on every rank's part
            y += self.bias
        return y
