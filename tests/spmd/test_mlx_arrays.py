"""mlx arrays in, mlx arrays out, with the values numpy would give."""

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")

pytestmark = pytest.mark.spmd  # runs inside every rank of a job; see conftest.py


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int32", "float16"])
def test_collectives_on_mlx_arrays(comm, dtype):
    mlx_dtype = getattr(mx, dtype)
    p = comm.size
    x = mx.array(np.arange(2 * p, dtype=np.float32) + comm.rank).astype(mlx_dtype)
    reduced = comm.all_reduce(x)
    assert isinstance(reduced, mx.array) and reduced.dtype == mlx_dtype
    want = sum(np.arange(2 * p, dtype=np.float32) + r for r in range(p))
    assert np.array_equal(np.array(reduced.astype(mx.float32)), want)
    gathered = comm.all_gather(x)
    assert isinstance(gathered, mx.array) and gathered.shape == (2 * p * p,)
    rows = [r + 1 for r in range(p)]  # unequal parts: rank r gives r + 1 elements
    uneven = comm.all_gather(x[:comm.rank + 1], counts=rows)
    assert isinstance(uneven, mx.array) and uneven.dtype == mlx_dtype
    assert np.array_equal(np.array(uneven.astype(mx.float32)),
                          np.concatenate([np.arange(r + 1) + r for r in range(p)]))
    block = comm.reduce_scatter(x, op="max")
    assert isinstance(block, mx.array) and block.shape == (2,)
    assert np.array_equal(np.array(block.astype(mx.float32)),
                          np.arange(2 * comm.rank, 2 * comm.rank + 2) + p - 1)
    root = comm.broadcast(x, root=p - 1)
    assert np.array_equal(np.array(root.astype(mx.float32)), np.arange(2 * p) + p - 1)
    if p > 1:
        if comm.rank == 0:
            comm.send(x, 1)
        elif comm.rank == 1:
            got = comm.recv(mx.zeros(x.shape, mlx_dtype), 0)
            assert isinstance(got, mx.array) and got.dtype == mlx_dtype
            assert np.array_equal(np.array(got.astype(mx.float32)), np.arange(2 * p))
    comm.barrier()


def test_out_is_refused_for_mlx(comm):
    x = mx.zeros((4,))
    with pytest.raises(TypeError, match="mlx arrays"):
        comm.all_reduce(x, out=np.empty(4, np.float32))
