"""The default algorithm table picks what the measurements in benchmarks/RESULTS.md favour."""

import pytest

from tbcoll import tuning
from tbcoll.algorithms import ALGORITHMS


@pytest.mark.parametrize("nbytes, size, expected", [
    (8, 2, "rd"), (256 << 10, 4, "rd"), ((256 << 10) + 1, 4, "mesh"), (16 << 20, 2, "mesh"),
    (16 << 20, 8, "ring"), (8, 64, "rd"),
])
def test_tcp_all_reduce(nbytes, size, expected):
    assert tuning.choose("tcp", "all_reduce", nbytes, size) == expected


def test_every_table_covers_every_collective_with_a_valid_algorithm():
    for backend, table in tuning.TABLES.items():
        assert set(table) == set(ALGORITHMS), backend
        for collective in table:
            for nbytes in (0, 1 << 30):
                for size in (2, 1024):
                    chosen = tuning.choose(backend, collective, nbytes, size)
                    assert chosen in ALGORITHMS[collective]


def test_describe():
    assert tuning.describe("tcp", "broadcast") == "rd up to 256 KiB, then ring"
    assert tuning.describe("mpi", "barrier") == "native"
