"""Every registered collective's cases, generated from its descriptor (tbcoll.collectives: its
`cases`, each rank's inputs and expected results), with each algorithm this communicator has
and the default choice, on whatever transport the job runs: shm, tcp, mpi and mlx through
tests/library/test_spmd.py, a registered transport and a registered collective through
tests/library/test_extension.py. A new collective is tested here without a line of test code.
A collective registered by a plugin (`-p module`) before collection is in the list.
--case-dtypes (tests/spmd/conftest.py) keeps to the cases of some dtypes (the RDMA lab's VM)."""

import numpy as np
import pytest

from tbcoll.collectives import DESCRIPTORS
from tbcoll.collectives.cases import Case, same

pytestmark = pytest.mark.spmd  # runs inside every rank of a job; see conftest.py


def _runs() -> list:
    return [pytest.param(name, algorithm, id=f"{name}-{algorithm}")
            for name, descriptor in DESCRIPTORS.items()
            for algorithm in ("default", *descriptor.algorithms)]


@pytest.mark.parametrize("name, algorithm", _runs())
def test_cases(comm, name, algorithm, case_dtypes):
    descriptor = DESCRIPTORS[name]
    if algorithm != "default" and algorithm not in comm.algorithms(name):
        pytest.skip(f"the {comm.backend} transport has no {algorithm} {name}")
    chosen = None if algorithm == "default" else algorithm
    ran = 0
    for case in descriptor.cases(comm.rank, comm.size):
        if (case.algorithms is None or algorithm in case.algorithms) and (
                not case_dtypes or _dtype(case) in ("", *case_dtypes)):
            _run(comm, name, chosen, case)
            ran += 1
    assert ran or algorithm == "default" or case_dtypes, f"no case of {name} runs {algorithm}"


def _dtype(case: Case) -> str:
    """The dtype of a case's data: its first array's, among its arguments or result."""
    for value in (*case.args, case.expected):
        value = value[0] if isinstance(value, tuple) else value
        if isinstance(value, (np.ndarray, np.generic)):
            return value.dtype.name
    return ""


def _run(comm, name: str, algorithm: str | None, case: Case) -> None:
    what = f"{name} {case.label} (algorithm {algorithm or 'default'}, rank {comm.rank})"
    if case.raises:
        with pytest.raises(ValueError, match=case.raises):
            comm.collective(name, *case.args, algorithm=algorithm, **case.kwargs)
        return
    inputs = [a.copy() if isinstance(a, np.ndarray) else a for a in case.args]
    got = comm.collective(name, *case.args, algorithm=algorithm, **case.kwargs)
    assert same(got, case.expected), f"{what}: got {got!r}, expected {case.expected!r}"
    if case.returns_out:
        assert (got[0] if isinstance(got, tuple) else got) is case.kwargs["out"], what
    if "out" not in case.kwargs:  # (out= may be x: in place)
        assert all(same(a, b) for a, b in zip(case.args, inputs, strict=True)
                   if isinstance(b, np.ndarray)), f"{what}: the input changed"
