"""Tensor-parallel layers, named for their data movement (as MLX names them).

- AllToShardedLinear (column parallel): the input is whole on every rank, the output is this
  rank's slice of the features. No communication.
- ShardedToAllLinear (row parallel): the input is this rank's slice of the features, the
  output is whole on every rank: a local matmul, then one all_reduce.
An attention block or an MLP is one of each, so it costs one all_reduce per forward pass.
Weights follow PyTorch/Hugging Face: weight has shape (out_features, in_features). from_full
takes numpy weights and an array module, xp: numpy (the default) or mlx.core, whose arrays
the layer then computes with.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class Solo:
    """A communicator of one rank: what a single-process reference model runs with."""

    rank, size = 0, 1

    def all_reduce(self, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        return x

    def all_gather(self, x: np.ndarray) -> np.ndarray:
        return x


def shard_bounds(total: int, rank: int, size: int, what: str) -> slice:
    """This rank's slice of `total` items, which must divide evenly."""
    if total % size:
        raise ValueError(f"Cannot shard {what} of size {total} across {size} ranks: "
                         f"{total} is not a multiple of {size}.")
    part = total // size
    return slice(rank * part, (rank + 1) * part)


def as_array(values: np.ndarray, dtype: np.dtype, xp: Any = np) -> Any:
    """values (numpy) as a contiguous array of dtype in the array module xp."""
    values = np.ascontiguousarray(values, dtype)
    return values if xp is np else xp.array(values)


class AllToShardedLinear:
    def __init__(self, weight_t: Any, bias: Any | None) -> None:
        self.weight_t, self.bias = weight_t, bias  # weight_t: (in, out/size)

    @classmethod
    def from_full(cls, weight: np.ndarray, bias: np.ndarray | None, comm: Any,
                  dtype: np.dtype = np.float32, xp: Any = np) -> AllToShardedLinear:
        rows = shard_bounds(weight.shape[0], comm.rank, comm.size, "the output")
        return cls(as_array(weight[rows].T, dtype, xp),
                   None if bias is None else as_array(bias[rows], dtype, xp))

    def __call__(self, x: Any) -> Any:
        y = x @ self.weight_t
        if self.bias is not None:
            y += self.bias
        return y


class ShardedToAllLinear:
    def __init__(self, weight_t: Any, bias: Any | None, comm: Any) -> None:
        self.weight_t, self.bias, self.comm = weight_t, bias, comm  # weight_t: (in/size, out)

    @classmethod
    def from_full(cls, weight: np.ndarray, bias: np.ndarray | None, comm: Any,
                  dtype: np.dtype = np.float32, xp: Any = np) -> ShardedToAllLinear:
        columns = shard_bounds(weight.shape[1], comm.rank, comm.size, "the input")
        return cls(as_array(weight[:, columns].T, dtype, xp),
                   None if bias is None else as_array(bias, dtype, xp), comm)

    def __call__(self, x: Any) -> Any:
        partial_sum = x @ self.weight_t
        in_place = isinstance(partial_sum, np.ndarray)  # mlx arrays are immutable
        y = self.comm.all_reduce(partial_sum, out=partial_sum if in_place else None)
        if self.bias is not None:  # added once, after the sum, not on every rank's part
            y += self.bias
        return y
