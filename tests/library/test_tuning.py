"""The default algorithm table picks what the measurements in benchmarks/RESULTS.md favour."""

import pytest

from tbcoll.collectives import ALGORITHMS, tuning


@pytest.mark.parametrize("nbytes, size, tcp, stream", [
    (8, 2, "native", "rd"), (4 << 20, 2, "native", "mesh"), (16 << 20, 2, "native", "mesh"),
    (256 << 10, 4, "native", "rd"), ((256 << 10) + 1, 4, "mesh", "mesh"), (8, 5, "rd", "rd"),
    (16 << 20, 8, "ring", "ring"), (8, 64, "rd", "rd"),
])
def test_tcp_all_reduce(nbytes, size, tcp, stream):
    assert tuning.choose("tcp", "all_reduce", nbytes, size) == tcp
    # the stream transports without tcp's native (rdma's sub-groups, MLX's ring) skip it
    assert tuning.choose("stream", "all_reduce", nbytes, size) == stream


def test_every_table_covers_every_collective_with_a_valid_algorithm():
    """A table names only collectives; the descriptors' default rules fill the rest (a
    transport with no table, as a registered one, follows them throughout)."""
    for backend in (*tuning.TABLES, "a transport with no table"):
        assert set(tuning.TABLES.get(backend, {})) <= set(ALGORITHMS), backend
        for collective in ALGORITHMS:
            for nbytes in (0, 1 << 30):
                for size in (2, 1024):
                    chosen = tuning.choose(backend, collective, nbytes, size)
                    assert chosen in ALGORITHMS[collective]


def test_describe():
    assert tuning.describe("tcp", "broadcast") == "rd up to 256 KiB, then ring"
    assert tuning.describe("mpi", "barrier") == "native"


def test_native_up_to_a_size():
    assert tuning.native_up_to("rdma", "all_reduce", 2) == (True, 64 << 10)
    assert tuning.native_up_to("shm", "all_reduce", 4) == (True, None)
    assert tuning.native_up_to("tcp", "all_reduce", 2) == (True, None)
    assert tuning.native_up_to("tcp", "all_reduce", 3) == (True, 256 << 10)
    assert tuning.native_up_to("tcp", "all_reduce", 5) == (False, 256 << 10)


class _Native:
    takes_mlx = False
    offers = frozenset(("all_reduce", "all_gather"))
    direct_broadcast = direct_reduce_scatter = None

    def __init__(self):
        self.calls = []

    def direct_all_reduce(self, x, op, root, out):
        self.calls.append(x.nbytes)
        return x

    direct_all_gather = direct_all_reduce


class _Group:
    rank, size, tuning, coll, revocation = 0, 4, "rdma", None, None

    def __init__(self):
        self.native = _Native()

    def close(self):
        pass


def test_the_one_call_path_is_taken_up_to_the_tables_native_size_and_no_further():
    """rdma's table takes its C mesh up to 64 KiB: the routes (tbcoll.comm.routes) take the one-call
    path up to that without describing the call; larger calls go to the general path without
    entering it, so that the dispatch chooses by size (measured on all_gather's output, as the
    table does)."""
    import numpy as np

    from tbcoll.comm.communicator import Communicator
    from tbcoll.comm.routes import NAMES

    group = _Group()
    comm = Communicator(group, "rdma", 0, 0)
    general = {name: (lambda *args, name=name: f"general {name}") for name in NAMES}
    routes = comm._routes.bind(None, general)
    reduce, gather = routes["all_reduce"], routes["all_gather"]
    assert (reduce.largest, gather.largest) == (64 << 10, 16 << 10)
    small, large = np.ones(16 << 10, np.float32), np.ones((16 << 10) + 1, np.float32)
    assert reduce.call(small, "sum", None, None) is small
    assert reduce.call(large, "sum", None, None) == "general all_reduce"
    assert reduce.call(small, "sum", "ring", None) == "general all_reduce"  # algorithm= given
    assert gather.call(np.ones(4 << 10, np.float32), None, None, None) is not None  # 64 KiB out
    assert gather.call(small, None, None, None) == "general all_gather"  # 256 KiB out: rd's
    assert group.native.calls == [64 << 10, 16 << 10]  # (never entered past its size)
