"""all_to_all (equal and counted blocks) and the rooted collectives (gather, scatter, reduce)
against numpy, on every rank: each algorithm x dtype, every root, empty and odd sizes."""

import numpy as np
import pytest

import tbcoll
from tbcoll.core.dtypes import DTYPES
from tbcoll.core.names import ALGORITHMS

from .conftest import expected_reduction, rank_input, usable

pytestmark = pytest.mark.spmd  # runs inside every rank of a job; see conftest.py

DTYPE_NAMES = list(DTYPES)


def contribution(rank, rows, dtype, salt=0):
    """Rank `rank`'s rows x 3 array; any rank can compute any other's."""
    return rank_input(rank, rows * 3, np.dtype(DTYPES[dtype]), "max", salt).reshape(rows, 3)


@pytest.mark.parametrize("algorithm", ALGORITHMS["all_to_all"])
class TestAllToAll:
    @pytest.mark.parametrize("dtype", DTYPE_NAMES)
    @pytest.mark.parametrize("rows_per_rank", [0, 1, 5])
    def test_equal_blocks(self, comm, algorithm, dtype, rows_per_rank):
        usable(comm, "all_to_all", algorithm)
        rows = rows_per_rank * comm.size
        got = comm.all_to_all(contribution(comm.rank, rows, dtype), algorithm=algorithm)
        mine = slice(comm.rank * rows_per_rank, (comm.rank + 1) * rows_per_rank)
        want = np.concatenate([contribution(r, rows, dtype)[mine] for r in range(comm.size)])
        assert got.dtype == want.dtype and np.array_equal(got.view(np.uint8), want.view(np.uint8))

    def test_counted_blocks_as_moe_routing_sends_them(self, comm, algorithm):
        """Rank r sends (r + j) % 3 rows to rank j: some blocks empty, sizes unequal."""
        usable(comm, "all_to_all", algorithm)
        if algorithm == "bruck":
            with pytest.raises(ValueError, match="blocks of one size"):
                comm.all_to_all(np.ones(comm.size), [1] * comm.size, algorithm="bruck")
            return
        n, r = comm.size, comm.rank
        counts = [(r + j) % 3 for j in range(n)]
        x = contribution(r, sum(counts), "float32")
        got, received = comm.all_to_all(x, counts, algorithm=algorithm)
        assert received.tolist() == [(i + r) % 3 for i in range(n)]
        want = []
        for i in range(n):
            sent = [(i + j) % 3 for j in range(n)]
            start = sum(sent[:r])
            want.append(contribution(i, sum(sent), "float32")[start:start + sent[r]])
        assert np.array_equal(got, np.concatenate(want))
        # back the way they came, the counts known on both sides (MoE's combine)
        back, returned = comm.all_to_all(got, received, algorithm=algorithm, recv_counts=counts)
        assert np.array_equal(back, x) and returned.tolist() == counts

    def test_out_and_bad_arguments(self, comm, algorithm):
        usable(comm, "all_to_all", algorithm)
        x = np.arange(comm.size * 2, dtype=np.int64)
        out = np.empty_like(x)
        assert comm.all_to_all(x, algorithm=algorithm, out=out) is out
        assert out.tolist() == [2 * comm.rank, 2 * comm.rank + 1] * comm.size
        with pytest.raises(ValueError, match="counts sum to"):
            comm.all_to_all(x, [0] * comm.size)
        if comm.size > 1:
            with pytest.raises(ValueError, match="divisible"):
                comm.all_to_all(np.ones(comm.size + 1))


@pytest.mark.parametrize("algorithm", ALGORITHMS["gather"])  # scatter, reduce: the same
class TestRooted:
    @pytest.mark.parametrize("dtype", DTYPE_NAMES)
    def test_gather_every_root(self, comm, algorithm, dtype):
        usable(comm, "gather", algorithm)
        for root in range(comm.size):
            got = comm.gather(contribution(comm.rank, 2, dtype, root), root, algorithm=algorithm)
            if comm.rank != root:
                assert got is None
                continue
            want = np.concatenate([contribution(r, 2, dtype, root) for r in range(comm.size)])
            assert np.array_equal(got.view(np.uint8), want.view(np.uint8))

    @pytest.mark.parametrize("dtype", DTYPE_NAMES)
    def test_scatter_every_root(self, comm, algorithm, dtype):
        usable(comm, "scatter", algorithm)
        for root in range(comm.size):
            whole = contribution(root, 3 * comm.size, dtype, root)
            got = comm.scatter(whole if comm.rank == root else None, root, algorithm=algorithm)
            want = whole[3 * comm.rank:3 * comm.rank + 3]
            assert got.dtype == want.dtype and got.shape == want.shape
            assert np.array_equal(got.view(np.uint8), want.view(np.uint8))

    @pytest.mark.parametrize("op", ["sum", "prod", "max", "min"])
    @pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int64", "uint8"])
    def test_reduce_every_root(self, comm, algorithm, op, dtype):
        usable(comm, "reduce", algorithm)
        dt = np.dtype(DTYPES[dtype])
        for root in range(comm.size):
            got = comm.reduce(rank_input(comm.rank, 1009, dt, op, root), op, root,
                              algorithm=algorithm)
            if comm.rank == root:
                want = expected_reduction(comm.size, 1009, dt, op, root)
                assert np.array_equal(got.view(np.uint8), want.view(np.uint8))
            else:
                assert got is None

    def test_shapes_out_and_empty(self, comm, algorithm):
        usable(comm, "gather", algorithm)
        root = comm.size - 1
        scalar = comm.gather(np.float64(comm.rank), root, algorithm=algorithm)
        empty = comm.gather(np.zeros((0, 4)), root, algorithm=algorithm)
        out = np.empty(6, np.int32)
        into = comm.reduce(np.arange(6, dtype=np.int32), "max", root, algorithm=algorithm,
                           out=out if comm.rank == root else None)
        part = comm.scatter(np.zeros((0, 2)) if comm.rank == root else None, root,
                            algorithm=algorithm)
        assert part.shape == (0, 2)
        if comm.rank == root:
            assert scalar.tolist() == list(range(comm.size))
            assert empty.shape == (0, 4)
            assert into is out and out.tolist() == list(range(6))
        with pytest.raises(ValueError, match="root"):
            comm.gather(np.ones(1), comm.size)


def test_scatter_returns_mlx_where_root_gave_mlx(comm):
    mx = pytest.importorskip("mlx.core")
    whole = mx.arange(2 * comm.size, dtype=mx.bfloat16) if comm.rank == 0 else None
    got = comm.scatter(whole, 0)
    assert isinstance(got, mx.array) and got.dtype == mx.bfloat16
    assert got.tolist() == [2.0 * comm.rank, 2.0 * comm.rank + 1]


class TestNonBlocking:
    def test_results_equal_the_blocking_calls_interleaved_with_them(self, comm):
        n, r = comm.size, comm.rank
        requests = [comm.iall_reduce(np.full(4, r + 1.0)), comm.iall_gather(np.array([r])),
                    comm.ireduce_scatter(np.ones(2 * n, np.int32)),
                    comm.ibroadcast(np.full(3, r), root=n - 1),
                    comm.iall_to_all(np.arange(n) + 10 * r)]
        assert comm.all_reduce(np.ones(1))[0] == n  # waits for the queued ones, in order
        late = comm.iall_reduce(np.arange(3.0), op="max")
        results = tbcoll.wait_all([*requests, late])
        assert results[0].tolist() == [n * (n + 1) / 2] * 4
        assert results[1].tolist() == list(range(n))
        assert results[2].tolist() == [n, n]
        assert results[3].tolist() == [n - 1] * 3
        assert results[4].tolist() == [10 * i + r for i in range(n)]
        assert results[5].tolist() == [0.0, 1.0, 2.0]
        assert all(request.test() for request in requests)

    def test_counts_out_and_argument_errors_at_the_call(self, comm):
        n, r = comm.size, comm.rank
        out = np.empty(4, np.float64)
        request = comm.iall_reduce(np.ones(4), out=out)
        assert request.wait() is out and (out == n).all()
        counts = [1] * n
        got, received = comm.iall_to_all(np.full(n, r, np.int64), counts).wait()
        assert got.tolist() == list(range(n)) and received.tolist() == counts
        with pytest.raises(ValueError, match="xor"):  # at the call, as for blocking calls
            comm.iall_reduce(np.ones(2), op="xor")
        with pytest.raises(ValueError, match="divisible"):
            comm.ireduce_scatter(np.float64(1.0))  # no axis 0 to split
        assert comm.all_reduce(np.ones(1))[0] == n  # still in step afterwards

    def test_isend_irecv_cross_without_deadlock(self, comm):
        """Every rank posts its receive before its send, then waits for both: the transport
        moves both while either waits."""
        if comm.size == 1:
            pytest.skip("send/recv need another rank")
        r, n = comm.rank, comm.size
        right, left = (r + 1) % n, (r - 1) % n
        big = np.full(1 << 19, r, np.float32)  # more than a socket or ring holds
        got = np.empty_like(big)
        receives = [comm.irecv(got, left, tag=3), comm.irecv(np.empty(2, np.int64), left, tag=4)]
        sends = [comm.isend(np.array([r, -r]), right, tag=4), comm.isend(big, right, tag=3)]
        results = tbcoll.wait_all(receives + sends)
        assert results[0] is got and (got == left).all()
        assert results[1].tolist() == [left, -left] and results[2:] == [None, None]

    def test_test_polls_to_completion_beside_collectives(self, comm):
        if comm.size == 1:
            pytest.skip("send/recv need another rank")
        r, n = comm.rank, comm.size
        right, left = (r + 1) % n, (r - 1) % n
        pending = comm.iall_reduce(np.ones(2))
        receive = comm.irecv(np.empty(3), left)
        comm.send(np.full(3, float(r)), right)
        assert comm.all_reduce(np.ones(1))[0] == n
        while not receive.test():
            pass
        assert receive.wait().tolist() == [float(left)] * 3
        assert pending.wait().tolist() == [n, n]
