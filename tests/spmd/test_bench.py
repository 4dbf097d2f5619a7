"""The benchmark harness inside real jobs: every descriptor, tiny sweeps, results checked."""

import numpy as np
import pytest

from tbcoll.bench.descriptors import DESCRIPTORS
from tbcoll.bench.harness import sweep

pytestmark = pytest.mark.spmd  # runs inside every rank of a job; see conftest.py

SIZES = [8, 100, 4096]


@pytest.mark.parametrize("name", list(DESCRIPTORS))
def test_every_row_is_right(comm, name):
    desc = DESCRIPTORS[name]
    if comm.size < desc.min_ranks:
        pytest.skip(f"{name} needs {desc.min_ranks} ranks")
    has_native = desc.chooses and "native" in comm.algorithms(name)
    algorithms = ["default", *(["native"] if has_native else [])]
    for dtype in (np.dtype(np.float32), np.dtype(np.int8)):
        rows = sweep(comm, desc, SIZES, dtype, "max", algorithms, [False, True],
                     iters=2, warmup=1, system="test", repeats=2)
        assert rows and all(r.wrong == 0 for r in rows), [r for r in rows if r.wrong]
        for r in rows:
            assert r.ranks == comm.size and r.min_us <= r.time_us <= r.max_us
            assert r.busbw == pytest.approx(r.algbw * desc.bus_factor(comm.size))


class _Corrupting:
    """A communicator whose all_reduce of 16 floats gets one element wrong on rank 0."""

    def __init__(self, comm):
        self._comm, self.rank, self.size = comm, comm.rank, comm.size

    def all_reduce(self, x, op="sum", algorithm=None, out=None):
        result = self._comm.all_reduce(x, op=op, algorithm=algorithm, out=out)
        if self.rank == 0 and result.size == 16:  # not the harness' own reductions
            result[1] += 1
        return result

    def barrier(self):
        self._comm.barrier()


def test_a_corrupted_result_is_counted(comm):
    corrupting = _Corrupting(comm)
    rows = sweep(corrupting, DESCRIPTORS["all_reduce"], [64], np.dtype(np.float32), "sum",
                 ["default"], [False], iters=3, warmup=0, system="test", repeats=2)
    assert rows[0].count == 16 and rows[0].wrong == 1  # one element of the checked call
