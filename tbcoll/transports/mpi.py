"""MPI transport: mpi4py over the MPI it was built for (MPICH from PyPI by default).

Point-to-point goes through Isend/Irecv on raw bytes; the native collectives are MPI's own
(Allreduce, Allgather, Reduce_scatter_block, Bcast, Barrier) with MPI datatypes, and a
user-defined operation for bfloat16, which MPI has no type for. Only buffer (upper-case)
methods are used: nothing is pickled.

Every call is non-blocking (Isend, Iallreduce, ...) and its wait polls Testall, so that
TBCOLL_TIMEOUT bounds it: a frozen or late peer gives a CommError, never an endless wait in
MPI. MPICH's Iallreduce polled costs what its Allreduce does (3-4 us at 8 B, np=2, measured
here), so the bound is free. A rank that dies is normally reported sooner by mpiexec, which
ends the whole job. (Split and communicator set-up stay blocking: MPI has no non-blocking
MPI_Comm_split.)
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

import ml_dtypes
import numpy as np

from tbcoll.arrays import may_overlap, same_buffer
from tbcoll.dtypes import reducer
from tbcoll.env import LaunchInfo, comm_timeout, launcher_world_size
from tbcoll.errors import CommError, TbcollError

try:
    from mpi4py import MPI
except ImportError as e:  # an optional extra
    raise TbcollError("the mpi backend needs mpi4py and an MPI: pip install 'tbcoll[mpi]'") from e

_OPS = {"sum": MPI.SUM, "prod": MPI.PROD, "max": MPI.MAX, "min": MPI.MIN}
_BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
_DATATYPES = {
    np.dtype(np.float16): MPI.Datatype.fromcode("e"), np.dtype(np.float32): MPI.FLOAT,
    np.dtype(np.float64): MPI.DOUBLE, np.dtype(np.int8): MPI.INT8_T,
    np.dtype(np.int16): MPI.INT16_T, np.dtype(np.int32): MPI.INT32_T,
    np.dtype(np.int64): MPI.INT64_T, np.dtype(np.uint8): MPI.UINT8_T,
    _BFLOAT16: MPI.UINT16_T,  # a 2-byte carrier; reductions use _bfloat16_op
}
_SPINS_PER_CHECK = 256


class MpiEndpoint:
    def __init__(self, comm: MPI.Comm, timeout: float) -> None:
        self._comm, self._timeout = comm, timeout
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        # receives in flight: id(request) -> (request, bytes expected, source). MPI takes a
        # shorter message than the buffer without a word: tbcoll checks the count.
        self._receiving: dict[int, tuple[MPI.Request, int, int]] = {}

    def isend(self, buf: np.ndarray, peer: int, tag: int) -> MPI.Request:
        return self._comm.Isend(buf.view(np.uint8), peer, tag)

    def irecv(self, buf: np.ndarray, peer: int, tag: int) -> MPI.Request:
        request = self._comm.Irecv(buf.view(np.uint8), peer, tag)
        self._receiving[id(request)] = (request, buf.nbytes, peer)
        return request

    def send(self, buf: np.ndarray, peer: int, tag: int) -> None:
        self.waitall([self.isend(buf, peer, tag)])

    def recv(self, buf: np.ndarray, peer: int, tag: int) -> None:
        self.waitall([self.irecv(buf, peer, tag)])

    def test(self, requests: Sequence[MPI.Request]) -> bool:
        statuses = [MPI.Status() for _ in requests]
        try:
            if not MPI.Request.Testall(list(requests), statuses):
                return False
        except MPI.Exception as e:
            raise CommError(f"MPI failed in send/recv: {e.Get_error_string()}") from None
        self._check_counts(requests, statuses)
        return True

    def waitall(self, requests: Sequence[MPI.Request]) -> None:
        receiving = any(id(r) in self._receiving for r in requests)
        statuses = [MPI.Status() for _ in requests] if receiving else None  # see _poll
        _wait(requests, self._timeout, "send/recv", statuses)
        if receiving:
            self._check_counts(requests, statuses)

    def _check_counts(self, requests: Sequence[MPI.Request],
                      statuses: list[MPI.Status]) -> None:
        receives = [(i, self._receiving.pop(id(r))) for i, r in enumerate(requests)
                    if id(r) in self._receiving]
        for i, (_, expected, source) in receives:
            got = statuses[i].Get_count(MPI.BYTE)
            if got != expected:
                raise CommError(f"rank {source} sent {got} bytes where rank {self.rank} "
                                f"expected {expected}: send and recv sizes must match")


def _wait(requests: Sequence[MPI.Request], timeout: float, what: str,
          statuses: list[MPI.Status] | None = None) -> None:
    """Poll the requests to completion; CommError once timeout has passed, or for MPI's
    own errors (a message longer than its buffer: MPI_ERR_TRUNCATE)."""
    try:
        _poll(requests, timeout, what, statuses)
    except MPI.Exception as e:
        codes = [e.Get_error_class()]
        if codes[0] == MPI.ERR_IN_STATUS and statuses:  # Testall: each status says its own
            codes = [MPI.Get_error_class(s.Get_error()) for s in statuses]
        if MPI.ERR_TRUNCATE in codes:
            raise CommError(f"a message was longer than the buffer it was received into "
                            f"(MPI_ERR_TRUNCATE, in {what}): send and recv sizes must "
                            "match") from None
        raise CommError(f"MPI failed in {what}: {e.Get_error_string()}") from None


def _poll(requests: Sequence[MPI.Request], timeout: float, what: str,
          statuses: list[MPI.Status] | None) -> None:
    # One request is polled by itself: Testall converts its list on every call, which made
    # a polled Iallreduce ~1 us slower than a blocking Allreduce at 8 B.
    if len(requests) == 1 and statuses is None:
        done = requests[0].Test
    else:
        def done() -> bool:
            return MPI.Request.Testall(requests, statuses)
    deadline = None
    spins = 0
    while not done():
        spins += 1
        if spins % _SPINS_PER_CHECK == 0:
            os.sched_yield()  # let an oversubscribed peer run
            now = time.monotonic()
            deadline = deadline or now + timeout
            if now > deadline:
                raise CommError(f"timed out after {timeout:g} s (TBCOLL_TIMEOUT) waiting "
                                f"for {what}: a rank is late, stopped or gone")


def _bfloat16_op(ufunc: np.ufunc) -> MPI.Op:
    def apply(inbuf: object, inoutbuf: object, datatype: MPI.Datatype) -> None:
        incoming = np.frombuffer(inbuf, _BFLOAT16)
        accumulated = np.frombuffer(inoutbuf, _BFLOAT16)
        ufunc(incoming, accumulated, out=accumulated)

    return MPI.Op.Create(apply, commute=True)


class MpiNative:
    offers = frozenset(("all_reduce", "all_gather", "reduce_scatter", "broadcast", "barrier",
                        "all_to_all", "gather", "scatter", "reduce"))
    takes_mlx = False
    direct_broadcast = direct_reduce_scatter = None

    def __init__(self, comm: MPI.Comm, timeout: float) -> None:
        self._comm, self._timeout = comm, timeout
        self._bfloat16_ops: dict[str, MPI.Op] = {}

    def direct_all_reduce(self, x: np.ndarray, op: str,
                         out: np.ndarray | None) -> np.ndarray | None:
        """The Communicator's one-call path (any size here): straight to MPI_Allreduce."""
        if x.dtype not in _DATATYPES or not x.flags.c_contiguous:
            return None
        if out is None:
            out, send = np.empty_like(x), x
        elif not may_overlap(out, x):
            send = x
        elif same_buffer(out, x):
            send = None
        else:
            return None  # MPI forbids aliased buffers; the general path copies x first
        if x.dtype == _BFLOAT16:  # a 2-byte carrier and an op of its own: all_reduce's
            self.all_reduce(send, out, op)
        else:  # straight to MPI: all_reduce's _spec and _op cost ~0.3 us of a 3 us call
            _wait((self._comm.Iallreduce(MPI.IN_PLACE if send is None else send, out,
                                         _OPS[op]),), self._timeout, "MPI_Allreduce")
        return out

    def direct_all_gather(self, x: np.ndarray, out: np.ndarray | None) -> np.ndarray | None:
        if x.dtype not in _DATATYPES or not x.flags.c_contiguous or (
                out is not None and may_overlap(x, out)):
            return None
        if out is None:
            out = np.empty((self._comm.Get_size() * x.shape[0], *x.shape[1:]) if x.ndim
                           else (self._comm.Get_size(),), x.dtype)
        self.all_gather(x, out)
        return out

    def all_reduce(self, send: np.ndarray | None, recv: np.ndarray, op: str) -> None:
        """send None: in place on recv."""
        self._finish(self._comm.Iallreduce(self._spec(send), self._spec(recv),
                                           self._op(op, recv.dtype)), "MPI_Allreduce")

    def all_gather(self, send: np.ndarray, recv: np.ndarray) -> None:
        self._finish(self._comm.Iallgather(self._spec(send), self._spec(recv)), "MPI_Allgather")

    def reduce_scatter(self, send: np.ndarray, recv: np.ndarray, op: str) -> None:
        self._finish(self._comm.Ireduce_scatter_block(
            self._spec(send), self._spec(recv), self._op(op, recv.dtype)),
            "MPI_Reduce_scatter_block")

    def broadcast(self, buf: np.ndarray, root: int) -> None:
        self._finish(self._comm.Ibcast(self._spec(buf), root), "MPI_Bcast")

    def barrier(self) -> None:
        self._finish(self._comm.Ibarrier(), "MPI_Barrier")

    def all_to_all(self, send: np.ndarray, recv: np.ndarray, send_counts: np.ndarray,
                   recv_counts: np.ndarray) -> None:
        """Counts in elements per rank; MPI_Alltoall where they are all equal."""
        if (send_counts == send_counts[0]).all() and (recv_counts == send_counts[0]).all():
            self._finish(self._comm.Ialltoall(self._spec(send), self._spec(recv)),
                         "MPI_Alltoall")
            return
        self._finish(self._comm.Ialltoallv(self._counted(send, send_counts),
                                           self._counted(recv, recv_counts)), "MPI_Alltoallv")

    def gather(self, send: np.ndarray, recv: np.ndarray | None, root: int) -> None:
        self._finish(self._comm.Igather(self._spec(send), self._spec(recv) if recv is not None
                                        else None, root), "MPI_Gather")

    def scatter(self, send: np.ndarray | None, recv: np.ndarray, root: int) -> None:
        self._finish(self._comm.Iscatter(self._spec(send) if send is not None else None,
                                         self._spec(recv), root), "MPI_Scatter")

    def reduce(self, send: np.ndarray, recv: np.ndarray | None, op: str, root: int) -> None:
        self._finish(self._comm.Ireduce(self._spec(send), self._spec(recv) if recv is not None
                                        else None, self._op(op, send.dtype), root),
                     "MPI_Reduce")

    def _finish(self, request: MPI.Request, what: str) -> None:
        _wait((request,), self._timeout, what)

    def close(self) -> None:
        for op in self._bfloat16_ops.values():
            op.Free()
        self._bfloat16_ops.clear()

    def _counted(self, array: np.ndarray, counts: np.ndarray) -> list:
        """[buffer, counts, displacements, datatype] for the v-collectives."""
        displacements = np.concatenate(([0], np.cumsum(counts)[:-1]))
        buffer = array.view(np.uint16) if array.dtype == _BFLOAT16 else array
        return [buffer, (counts.tolist(), displacements.tolist()), _DATATYPES[array.dtype]]

    def _spec(self, array: np.ndarray | None) -> object:
        if array is None:
            return MPI.IN_PLACE
        if array.dtype.char == "E":  # bfloat16: no buffer format; a 2-byte carrier type
            return [array.view(np.uint16), MPI.UINT16_T]
        return array  # mpi4py reads the MPI datatype from the buffer's format

    def _op(self, op: str, dtype: np.dtype) -> MPI.Op:
        if dtype != _BFLOAT16:
            return _OPS[op]
        if op not in self._bfloat16_ops:
            self._bfloat16_ops[op] = _bfloat16_op(reducer(op))
        return self._bfloat16_ops[op]


class MpiGroup:
    """A communicator's view of MPI: its own MPI communicator for user messages, a duplicate
    for collectives (so that their messages never match each other's)."""

    tuning = "mpi"

    def __init__(self, comm: MPI.Comm, timeout: float) -> None:
        self._comm, self._timeout = comm, timeout
        self._coll_comm = comm.Dup()
        self.p2p = MpiEndpoint(comm, timeout)
        self.coll = MpiEndpoint(self._coll_comm, timeout)
        self.native = MpiNative(self._coll_comm, timeout)
        self.rank, self.size = self.p2p.rank, self.p2p.size

    def context_hint(self) -> int:
        return 0  # MPI names its communicators itself

    def split(self, color: int | None, key: int, members: list[int],
              context: int) -> MpiGroup | None:
        # MPI orders the new ranks by (key, old rank), as Communicator.split does.
        sub = self._comm.Split(MPI.UNDEFINED if color is None else color, key)
        return None if sub == MPI.COMM_NULL else MpiGroup(sub, self._timeout)

    def describe_links(self) -> list[str]:
        return []  # MPI routes the messages itself

    def close(self) -> None:
        if MPI.Is_finalized():
            return
        self.native.close()
        self._coll_comm.Free()
        self._comm.Free()


def open_world(info: LaunchInfo | None) -> tuple[MpiGroup, int, int]:
    world = MPI.COMM_WORLD
    if info is not None and info.size != world.Get_size():
        raise CommError(
            f"the mpi backend needs ranks started by mpiexec, but tbrun started {info.size} "
            f"ranks and MPI sees this one in a job of {world.Get_size()}: run "
            f"`mpiexec -n {info.size} python script.py`, or choose --backend tcp")
    if world.Get_size() == 1 and (expected := launcher_world_size()) > 1:
        raise CommError(
            f"MPI formed a world of one, but the launcher started {expected} processes: this "
            "MPI does not speak the launcher's process manager interface; under Slurm use "
            "`srun --mpi=pmi2` (MPICH from PyPI has no PMIx)")
    local = world.Split_type(MPI.COMM_TYPE_SHARED)
    local_rank = local.Get_rank()
    leader = np.array([world.Get_rank()], np.int64)
    local.Bcast(leader, root=0)  # the lowest world rank on this node names the node
    local.Free()
    leaders = np.empty(world.Get_size(), np.int64)
    world.Allgather(leader, leaders)
    node_rank = int(np.searchsorted(np.unique(leaders), leader[0]))
    return MpiGroup(world.Dup(), comm_timeout(info)), local_rank, node_rank
