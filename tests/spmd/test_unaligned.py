"""Arrays that are not aligned for their dtype (a float64 view of a byte buffer at offset 1)
give the right answer in every collective and in send/recv, small and past the sizes where
a transport changes path, and leave the ranks in step for the next call."""

import numpy as np
import pytest

from .conftest import expected_reduction, rank_input

pytestmark = pytest.mark.spmd  # runs inside every rank of a job; see conftest.py

DTYPE = np.dtype(np.float64)
COUNTS = [8, 1 << 12]  # 64 B and 32 KiB per rank (mpi: the gathered all_reduce, then MPI's)


def unaligned(values: np.ndarray) -> np.ndarray:
    """A copy of values whose data starts one byte past an aligned address."""
    raw = np.zeros(values.nbytes + 1, np.uint8)
    array = raw[1:].view(values.dtype).reshape(values.shape)
    array[...] = values
    assert not array.flags.aligned
    return array


def inputs(rank: int, count: int, salt: int = 0) -> np.ndarray:
    return rank_input(rank, count, DTYPE, "sum", salt)


def assert_same(got, want, what):
    assert got.dtype == want.dtype and got.shape == want.shape, what
    assert np.array_equal(got, want), what


def assert_in_step(comm):
    """The next collective runs, with the right answer (no call left half-started)."""
    got = comm.all_reduce(np.full(3, comm.rank + 1.0))
    assert np.array_equal(got, np.full(3, comm.size * (comm.size + 1) / 2))


@pytest.mark.parametrize("count", COUNTS)
class TestUnaligned:
    def test_all_reduce_in_and_out(self, comm, count):
        want = expected_reduction(comm.size, count, DTYPE, "sum")
        assert_same(comm.all_reduce(unaligned(inputs(comm.rank, count))), want, "input")
        out = unaligned(np.zeros(count))
        assert comm.all_reduce(inputs(comm.rank, count), out=out) is out
        assert_same(out, want, "out")
        x = unaligned(inputs(comm.rank, count))
        assert_same(comm.all_reduce(x, out=x), want, "in place")
        assert_same(comm.iall_reduce(unaligned(inputs(comm.rank, count))).wait(), want, "iall")
        assert_in_step(comm)

    def test_all_gather_reduce_scatter_and_all_to_all(self, comm, count):
        n, rank = comm.size, comm.rank
        got = comm.all_gather(unaligned(inputs(rank, count)))
        assert_same(got, np.concatenate([inputs(r, count) for r in range(n)]), "all_gather")
        block = slice(rank * count, (rank + 1) * count)
        got = comm.reduce_scatter(unaligned(inputs(rank, count * n)))
        assert_same(got, expected_reduction(n, count * n, DTYPE, "sum")[block], "reduce_scatter")
        got = comm.all_to_all(unaligned(inputs(rank, count * n)))
        assert_same(got, np.concatenate([inputs(r, count * n)[block] for r in range(n)]),
                     "all_to_all")
        assert_in_step(comm)

    def test_broadcast_and_the_rooted_collectives(self, comm, count):
        n, rank, root = comm.size, comm.rank, comm.size - 1
        buf = unaligned(inputs(rank, count))
        assert_same(comm.broadcast(buf, root=root), inputs(root, count), "broadcast")
        got = comm.reduce(unaligned(inputs(rank, count)), root=root)
        if rank == root:
            assert_same(got, expected_reduction(n, count, DTYPE, "sum"), "reduce")
        got = comm.gather(unaligned(inputs(rank, count)), root=root)
        if rank == root:
            assert_same(got, np.concatenate([inputs(r, count) for r in range(n)]), "gather")
        whole = inputs(root, count * n)
        got = comm.scatter(unaligned(whole) if rank == root else None, root=root)
        assert_same(got, whole[rank * count:(rank + 1) * count], "scatter")
        assert_in_step(comm)

    def test_send_and_recv(self, comm, count):
        if comm.size == 1:
            pytest.skip("send/recv need two ranks")
        right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
        out = unaligned(np.zeros(count))
        request = comm.irecv(out, left)
        comm.send(unaligned(inputs(comm.rank, count)), right)
        request.wait()
        assert_same(out, inputs(left, count), "recv")
        assert_in_step(comm)
