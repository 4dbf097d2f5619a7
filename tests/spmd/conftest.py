"""Tests in this folder run inside every rank of a job, all ranks in step (SPMD), on
tbcoll's pytest plugin (tbcoll.testing: the `comm` fixture, the `spmd` marker):

    mpiexec -n 4 python -m pytest tests/spmd        # the mpi backend
    tbrun -np 4 -m pytest tests/spmd                # tbrun's backend (shm here)

A plain `pytest` run does not collect them (tests/conftest.py); tests/library/test_spmd.py
launches both forms, at 1 to 4 ranks.
"""

import functools

import numpy as np
import pytest

from tbcoll.core.dtypes import DTYPES, OPS

# Inputs are small integers, so every dtype holds every partial result exactly and the
# order in which an algorithm reduces cannot change the answer.
_RANGES = {"sum": (-4, 4), "prod": (-2, 2), "max": (-100, 100), "min": (-100, 100)}


def rank_input(rank: int, count: int, dtype: np.dtype, op: str = "sum",
               salt: int = 0) -> np.ndarray:
    """The array rank `rank` contributes; any rank can compute any other's. A fresh copy:
    a test may write into it, and compares a call's input with a second one."""
    return _rank_input(rank, count, np.dtype(dtype), op, salt).copy()


def expected_reduction(size: int, count: int, dtype: np.dtype, op: str, salt: int = 0):
    return _expected_reduction(size, count, np.dtype(dtype), op, salt).copy()


# Kept, as every algorithm's test asks for the same arrays: drawing several MB of int8 or
# bfloat16 takes ~0.1 s a rank, against 0.2 ms for a copy. A few dozen MB at most.
@functools.lru_cache(maxsize=64)
def _rank_input(rank: int, count: int, dtype: np.dtype, op: str, salt: int) -> np.ndarray:
    lo, hi = _RANGES[op]
    if dtype == np.uint8:
        lo, hi = 0, (3 if op == "prod" else hi)
    rng = np.random.default_rng([rank, count, salt, list(DTYPES.values()).index(dtype)])
    return _read_only(rng.integers(lo, hi, size=count, endpoint=True).astype(dtype))


@functools.lru_cache(maxsize=16)
def _expected_reduction(size: int, count: int, dtype: np.dtype, op: str,
                        salt: int) -> np.ndarray:
    inputs = [_rank_input(r, count, dtype, op, salt) for r in range(size)]
    return _read_only(functools.reduce(OPS[op], inputs))


def _read_only(array: np.ndarray) -> np.ndarray:
    """What the caches keep cannot be changed by mistake (callers get copies)."""
    array.flags.writeable = False
    return array


def counts(size: int) -> list[int]:
    """Element counts worth testing: empty, one, p-1, a prime."""
    return sorted({0, 1, size - 1, 1009})


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--case-dtypes", default="", metavar="NAME,...",
                     help="test_descriptors.py: only the cases of these dtypes (and those "
                          "with no data)")


@pytest.fixture
def case_dtypes(request: pytest.FixtureRequest) -> tuple[str, ...]:
    return tuple(filter(None, request.config.getoption("--case-dtypes", "").split(",")))


def usable(comm, collective: str, algorithm: str) -> None:
    """Skip unless this communicator can run collective with algorithm."""
    if algorithm not in comm.algorithms(collective):
        pytest.skip(f"the {comm.backend} transport has no {algorithm} {collective}")


BIG_BYTES = 3 << 20  # "several MB", for a few dtypes: all_reduce of it crosses segments
