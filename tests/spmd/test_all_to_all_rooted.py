"""all_to_all and the rooted collectives beyond their descriptors' cases (those are
tests/spmd/test_descriptors.py's): an mlx scatter, and the non-blocking calls."""

import numpy as np
import pytest

import tbcoll
from tbcoll.core.dtypes import DTYPES

pytestmark = pytest.mark.spmd  # runs inside every rank of a job; see conftest.py

DTYPE_NAMES = list(DTYPES)


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
