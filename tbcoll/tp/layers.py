"""Tensor-parallel layers, named for their data movement (as MLX names them).

- AllToShardedLinear (column parallel): the input is whole on every rank, the output is this
  rank's slice of the features. No communication.
- ShardedToAllLinear (row parallel): the input is this rank's slice of the features, the
  output is whole on every rank: a local matmul, then one all_reduce.
An attention block or an MLP is one of each, so it costs one all_reduce per forward pass.
Weights follow PyTorch/Hugging Face: weight has shape (out_features, in_features).
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


class AllToShardedLinear:
    def __init__(self, weight: np.ndarray, bias: np.ndarray | None) -> None:
        self.weight_t = np.ascontiguousarray(weight.T)  # (in, out/size)
        self.bias = bias

    @classmethod
    def from_full(cls, weight: np.ndarray, bias: np.ndarray | None, comm: Any,
                  dtype: np.dtype = np.float32) -> AllToShardedLinear:
        rows = shard_bounds(weight.shape[0], comm.rank, comm.size, "the output")
        return cls(weight[rows].astype(dtype),
                   None if bias is None else bias[rows].astype(dtype))

    def __call__(self, x: np.ndarray) -> np.ndarray:
        y = x @ self.weight_t
        if self.bias is not None:
            y += self.bias
        return y


class ShardedToAllLinear:
    def __init__(self, weight: np.ndarray, bias: np.ndarray | None, comm: Any) -> None:
        self.weight_t = np.ascontiguousarray(weight.T)  # (in/size, out)
        self.bias, self.comm = bias, comm

    @classmethod
    def from_full(cls, weight: np.ndarray, bias: np.ndarray | None, comm: Any,
                  dtype: np.dtype = np.float32) -> ShardedToAllLinear:
        columns = shard_bounds(weight.shape[1], comm.rank, comm.size, "the input")
        return cls(weight[:, columns].astype(dtype),
                   None if bias is None else bias.astype(dtype), comm)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        partial_sum = x @ self.weight_t
        y = self.comm.all_reduce(partial_sum, out=partial_sum)
        if self.bias is not None:  # added once, after the sum, not on every rank's part
            y += self.bias
        return y
