"""What the collectives' own cases (tests/spmd/test_descriptors.py) cannot say: identical bits
on every rank, uneven parts, a barrier that waits, send/recv, split, progress, thousands of
calls back to back, numpy's rounding, overlapping buffers, the C lanes' whole calls."""

import time

import numpy as np
import pytest

from tbcoll.collectives import ALGORITHMS
from tbcoll.core.dtypes import DTYPES, OPS

from .conftest import rank_input, usable

pytestmark = pytest.mark.spmd  # runs inside every rank of a job; see conftest.py

DTYPE_NAMES = list(DTYPES)
BIG_DTYPES = ["float32", "bfloat16", "int8"]


def assert_equal(got, want, what):
    assert got.dtype == want.dtype and got.shape == want.shape, what
    assert np.array_equal(got.view(np.uint8), want.view(np.uint8)), what


@pytest.mark.parametrize("algorithm", ALGORITHMS["all_reduce"])
class TestAllReduce:
    def test_every_rank_gets_identical_bits(self, comm, algorithm):
        usable(comm, "all_reduce", algorithm)
        x = np.random.default_rng(comm.rank).standard_normal(10007).astype(np.float32)
        got = comm.all_reduce(x, algorithm=algorithm)
        everyone = comm.all_gather(got.view(np.int32)).reshape(comm.size, -1)
        assert (everyone == everyone[0]).all()
        reference = sum(np.random.default_rng(r).standard_normal(10007).astype(np.float32)
                        for r in range(comm.size))
        np.testing.assert_allclose(got, reference, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("algorithm", ALGORITHMS["all_gather"])
class TestAllGather:
    @pytest.mark.parametrize("dtype", BIG_DTYPES)
    def test_unequal_parts(self, comm, algorithm, dtype):
        """counts: rank r gives counts[r] rows (Allgatherv), some none, some equal."""
        usable(comm, "all_gather", algorithm)
        dtype = DTYPES[dtype]
        for rows in ([r % 3 for r in range(comm.size)], [5] * comm.size,
                     [9831 - (r > 1) for r in range(comm.size)]):  # 49152 in 5, vocabulary-like
            parts = [rank_input(r, rows[r] * 3, dtype).reshape(rows[r], 3)
                     for r in range(comm.size)]
            got = comm.all_gather(parts[comm.rank], algorithm=algorithm, counts=rows)
            assert_equal(got, np.concatenate(parts), f"rows {rows[:6]}")
            out = np.empty((sum(rows), 3), dtype)
            assert comm.all_gather(parts[comm.rank], algorithm=algorithm, out=out,
                                   counts=np.array(rows)) is out
            assert_equal(out, np.concatenate(parts), f"rows {rows[:6]} into out")
        with pytest.raises(ValueError, match=f"counts say rank {comm.rank} gives"):
            comm.all_gather(np.zeros((7, 3), dtype), algorithm=algorithm,
                            counts=[6] * comm.size)
        with pytest.raises(ValueError, match="all_gather counts must be"):
            comm.all_gather(np.zeros((1, 3), dtype), counts=[1] * (comm.size + 1))


class TestBarrier:
    def test_nobody_leaves_before_the_last_rank_arrives(self, comm):
        """In each round one rank comes 0.1 s late; every rank notes when it entered and left
        (CLOCK_MONOTONIC: one clock for every process of a host), and afterwards they compare:
        a barrier that did nothing would let the others leave before the late one came."""
        for late in range(min(comm.size, 3)):
            if comm.rank == late:
                time.sleep(0.1)
            entered = time.monotonic()
            comm.barrier()
            left = time.monotonic()
            times = comm.all_gather(np.array([entered, left]))
            assert times[1::2].min() >= times[0::2].max(), (late, times)


class TestSendRecv:
    def test_ring_of_messages_and_tags(self, comm):
        if comm.size == 1:
            pytest.skip("needs two ranks")
        right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
        buf = np.empty(1000, np.float64)
        if comm.rank % 2 == 0:
            comm.send(np.arange(1000.0) + comm.rank, right, tag=7)
            comm.send(np.array([comm.rank], np.int16), right, tag=8)
            got = comm.recv(buf, left, tag=7)
            small = comm.recv(np.empty(1, np.int16), left, tag=8)
        else:
            got = comm.recv(buf, left, tag=7)
            small = comm.recv(np.empty(1, np.int16), left, tag=8)
            comm.send(np.arange(1000.0) + comm.rank, right, tag=7)
            comm.send(np.array([comm.rank], np.int16), right, tag=8)
        assert got is buf and np.array_equal(got, np.arange(1000.0) + left)
        assert small[0] == left

    def test_tags_are_matched_not_just_order(self, comm):
        if comm.size == 1:
            pytest.skip("needs two ranks")
        if comm.rank == 0:
            comm.send(np.array([1]), 1, tag=1)
            comm.send(np.array([2]), 1, tag=2)
        elif comm.rank == 1:
            assert comm.recv(np.empty(1, np.int64), 0, tag=2)[0] == 2
            assert comm.recv(np.empty(1, np.int64), 0, tag=1)[0] == 1
        comm.barrier()

    def test_user_messages_never_meet_collectives(self, comm):
        if comm.size == 1:
            pytest.skip("needs two ranks")
        if comm.rank == 0:
            comm.send(np.array([99.0]), 1, tag=0)
        total = comm.all_reduce(np.array([1.0]))
        assert total[0] == comm.size
        if comm.rank == 1:
            assert comm.recv(np.empty(1), 0, tag=0)[0] == 99.0


class TestSplit:
    def test_even_and_odd_groups(self, comm):
        sub = comm.split(comm.rank % 2, key=-comm.rank)  # reversed order inside each group
        members = [r for r in range(comm.size) if r % 2 == comm.rank % 2][::-1]
        assert sub.size == len(members) and sub.rank == members.index(comm.rank)
        total = sub.all_reduce(np.array([comm.rank]))
        assert total[0] == sum(members)
        gathered = sub.all_gather(np.array([comm.rank]))
        assert list(gathered) == members
        sub.close()

    def test_excluded_ranks_and_nested_splits(self, comm):
        sub = comm.split(None if comm.rank == 0 else 0)
        if comm.rank == 0:
            assert sub is None
        else:
            assert sub.size == comm.size - 1 and sub.rank == comm.rank - 1
            inner = sub.split(0, key=0)
            assert inner.all_reduce(np.array([1]))[0] == comm.size - 1
            inner.close()
            sub.close()
        assert comm.all_reduce(np.array([1]))[0] == comm.size  # the parent still works

    def test_many_splits_get_separate_contexts(self, comm):
        subs = [comm.split(0) for _ in range(3)]
        for i, sub in enumerate(subs):
            assert sub.all_reduce(np.array([i]))[0] == i * comm.size
        for sub in subs:
            sub.close()


class TestProgress:
    def test_both_ends_send_more_than_the_sockets_hold(self, comm):
        """Both ranks of each pair send 24 MB before either receives: the transport must keep
        reading while its sends are stalled (MPI calls this pattern unsafe, so tcp only)."""
        if comm.size == 1 or comm.backend == "mpi":
            pytest.skip("needs two ranks of a transport that buffers unexpected messages")
        peer = comm.rank ^ 1
        if peer >= comm.size:
            return
        mine = np.full(6 << 20, comm.rank, np.float32)
        comm.send(mine, peer, tag=3)
        got = comm.recv(np.empty_like(mine), peer, tag=3)
        assert (got == peer).all()


class TestOrdering:
    def test_thousands_back_to_back(self, comm):
        """Varying collectives, sizes and buffers in a tight loop, every result checked: a
        flag seen before its data, or a slot reused too early, shows up as a wrong value."""
        rng = np.random.default_rng(7)  # the same sequence on every rank
        buffers = [np.empty(n, np.float32) for n in (1, 7, 1000, 40_000)]
        p, r = comm.size, comm.rank
        # fewer where a call takes milliseconds: MLX's ring backend with more ranks than
        # cores, and rdma, which is tested in the RDMA lab's emulated VM (3000 took 43 s there)
        for i in range(300 if comm.backend in ("mlx", "rdma") else 3000):
            kind = i % 4
            n = int(rng.choice([1, 5, 513, 4099, 70_000 if i % 50 == 0 else 17]))
            if kind == 0:
                out = comm.all_reduce(np.full(n, r + i, np.float32))
                assert (out == p * i + p * (p - 1) / 2).all(), (i, n)
            elif kind == 1:
                out = comm.all_gather(np.full(n, r * 10 + i % 7, np.int32))
                assert (out.reshape(p, n) == (np.arange(p) * 10 + i % 7)[:, None]).all(), i
            elif kind == 2:
                buf = buffers[i % len(buffers)]
                buf[:] = r + i
                comm.broadcast(buf, root=i % p, out=buf)
                assert (buf == i % p + i).all(), (i, buf.size)
            else:
                block = comm.reduce_scatter(np.full(p * n, r + 1, np.int64), op="max")
                assert block.shape == (n,) and (block == p).all(), (i, n)


@pytest.mark.parametrize("dtype", DTYPE_NAMES)
def test_default_all_reduce_matches_numpy_bit_for_bit(comm, dtype):
    """shm's and tcp's default path for small arrays (a C kernel) against numpy's own ufuncs
    applied in rank order, with values that round: random, subnormal, inf, NaN."""
    if comm.backend not in ("shm", "tcp") or "two levels" in comm.describe():
        pytest.skip("only shm's and tcp's kernel reduce in rank order, so only they can match "
                    "bit for bit (two levels reduce host by host)")
    floating, dtype = dtype.startswith(("float", "bfloat")), DTYPES[dtype]
    rng = np.random.default_rng(1234)  # the same on every rank
    if floating:
        special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 6e-8, 1e-39, 65504.0, 3.0e38])
        with np.errstate(all="ignore"):  # 3e38 and 1e-39 do not fit every type: inf and 0
            inputs = [np.concatenate([rng.standard_normal(991) * 10.0 ** rng.integers(-6, 6, 991),
                                      rng.permutation(special)]).astype(dtype)
                      for _ in range(comm.size)]
    else:
        info = np.iinfo(dtype)
        inputs = [rng.integers(info.min, info.max, 1000, endpoint=True).astype(dtype)
                  for _ in range(comm.size)]
    for op, ufunc in OPS.items():
        want = inputs[0].copy()
        with np.errstate(all="ignore"):
            for other in inputs[1:]:
                want = ufunc(want, other)
            got = comm.all_reduce(inputs[comm.rank].reshape(20, 50), op=op)
        assert got.shape == (20, 50)
        if op in ("max", "min"):  # which zero a tie of +0 and -0 gives is numpy's whim
            assert np.array_equal(got.reshape(-1), want, equal_nan=floating), f"{dtype} {op}"
        else:  # sums and products must round exactly as numpy's do
            assert_equal(got.reshape(-1), want, f"{dtype} {op}")


def test_out_that_overlaps_x(comm):
    """out= may be x under another view, or overlap it: results as if x were copied first."""
    p, r = comm.size, comm.rank
    x = np.arange(12.0) + r
    view = x.reshape(3, 4)
    comm.all_reduce(view, out=x.reshape(3, 4))  # the same bytes, another view: in place
    assert np.array_equal(x, p * np.arange(12.0) + p * (p - 1) / 2)
    out = np.empty(3 * p)
    mine = out[3 * r:3 * r + 3]
    mine[:] = r
    assert np.array_equal(comm.all_gather(mine, out=out), np.repeat(np.arange(p), 3))
    y = np.full(2 * p, r + 1.0)
    block = comm.reduce_scatter(y, out=y[:2])  # out is the start of x
    assert np.array_equal(block, np.full(2, p * (p + 1) / 2))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int64"])
def test_a_lanes_calls_run_whole_in_c(comm, dtype):
    """Where the transport has a C lane (Native.lane: shm's, tcp's all_reduce, rdma's mesh) a
    plain small all_reduce or all_gather, no algorithm named, runs whole in C: no Python below
    the Communicator's method but the engine's words, published after the engine was used
    (sys.setprofile sees every Python call); the answers are numpy's. A peer later than C's
    first wait has Python finish the call: then every rank tries again."""
    import sys

    lanes = [name for name in ("all_reduce", "all_gather")
             if type(getattr(comm, f"_{name}").__self__.first).__name__
             == "builtin_function_or_method"]
    if not lanes:
        pytest.skip(f"no C lane takes all_reduce or all_gather here ({comm.backend})")
    dtype, p, r = DTYPES[dtype], comm.size, comm.rank
    x = np.full((3, 2), r + 1, dtype)
    want = {"all_reduce": np.full((3, 2), p * (p + 1) // 2, dtype),
            "all_gather": np.repeat(np.arange(1, p + 1), 6).reshape(3 * p, 2).astype(dtype)}
    for name in lanes:
        call = getattr(comm, name)
        for _ in range(20):
            ran = []
            sys.setprofile(lambda frame, event, arg, ran=ran: ran.append(frame.f_code.co_name)
                           if event == "call" else None)
            try:
                got = call(x)
            finally:
                sys.setprofile(None)
            assert_equal(got, want[name], name)
            below = set(ran) - {name, "publish_words"}
            if comm.all_reduce(np.array(len(below)), "max", algorithm="rd") == 0:
                break
        else:
            raise AssertionError(f"{name}: the lane never took the whole call ({below} ran)")


def test_a_host_of_several_ranks_keeps_their_messages_off_the_network(comm):
    """Where the job spans hosts and some run several ranks (tbcoll.hierarchy), this rank's
    network connections go to exactly the ranks of other hosts: none to its own host's."""
    import os

    from tbcoll.job.topology import Layout

    layout = Layout.from_json(os.environ.get("TBCOLL_HOSTFILE", '{"hosts": []}'))
    if comm.backend not in ("tcp", "rdma") or not layout.shares_hosts \
            or os.environ.get("TBCOLL_HIERARCHY") == "0":
        pytest.skip("one level here: no host of several ranks in a job over several hosts")
    described = comm.describe()
    assert "two levels" in described
    # "  to rank 2: 127.0.0.1:40000 -> 127.0.0.1:41000"
    linked = {int(line.split()[2].rstrip(":")) for line in described.splitlines() if "->" in line}
    here = next(host.ranks for host in layout.hosts if comm.rank in host.ranks)
    assert linked == set(range(comm.size)) - set(here), described
