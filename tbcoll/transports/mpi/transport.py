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

MPI returns garbage, not an error, when the ranks' calls differ (another count, dtype, op or
root). So every collective carries its tbcoll.core.calls signature: a small all_reduce (the
latency-critical one) is an MPI_Allgather of each rank's signature and data, checked and
reduced here in rank order (which also gives numpy's NaN-propagating max and min, which
MPICH's MPI_MAX is not, and the same bits on every rank); every other call runs an
MPI_Iallreduce of the signatures beside its own and fails, naming each rank's call, when they
differ. Larger max and min of floats use an operation of numpy's for the same reason.

A rank whose call was interrupted (tbcoll.CommRevokedError) sends each peer a notice on the
group's point-to-point communicator, with a tag past every user's (Notices); every wait probes
for one as it checks its deadline, and raises. MPI cannot cancel the collective left behind:
the communicator is not used again.
"""

from __future__ import annotations

import os
import struct
import time
from collections.abc import Callable, Sequence

import ml_dtypes
import numpy as np

from tbcoll.core.arrays import may_overlap, same_buffer
from tbcoll.core.calls import mismatch, signature
from tbcoll.core.dtypes import DTYPE_CODES, OP_CODES, reducer
from tbcoll.core.errors import CommError, CommRevokedError, TbcollError, revoked
from tbcoll.core.extensions import c_extension
from tbcoll.core.wire_check import check_wire
from tbcoll.job.env import LaunchInfo, comm_timeout, launcher_world_size

_gathered = c_extension("tbcoll.transports.mpi._gathered")  # None: MPI's own all_reduce
if _gathered is not None:
    check_wire(_gathered)

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
    _BFLOAT16: MPI.UINT16_T,  # a 2-byte carrier; reductions use numpy's op (_numpy_op)
}
_SPINS_PER_CHECK = 256
_GATHERED_BYTES = 8 << 10  # all_reduce up to this per rank: one MPI_Allgather (see above)
_WORD = struct.Struct("=Q")  # a signature, as it travels before a rank's data (put_call)
_ALL_ONES = (1 << 64) - 1
# a revocation notice's tag: past tbcoll.comm.point_to_point.MAX_TAG (MPI's TAG_UB is larger)
_NOTICE_TAG = 32768


class Notices:
    """A group's revocation notices (see the module docstring), on its point-to-point
    communicator; every wait of the group polls them."""

    def __init__(self, comm: MPI.Comm) -> None:
        self._comm = comm
        self._sent: list[tuple[bytes, MPI.Request]] = []  # (kept until the group goes)
        self.notice: str | None = None

    def send(self, notice: str) -> None:
        """Revoke: tell every other rank, and fail this rank's own waits."""
        self.notice = self.notice or notice
        text = notice.encode()
        rank = self._comm.Get_rank()
        for peer in range(self._comm.Get_size()):
            if peer != rank:
                self._sent.append((text, self._comm.Isend(text, peer, _NOTICE_TAG)))

    def poll(self) -> None:
        """Raise CommRevokedError once a rank has revoked the group."""
        if self.notice is None:
            status = MPI.Status()
            if not self._comm.Iprobe(MPI.ANY_SOURCE, _NOTICE_TAG, status):
                return
            text = bytearray(status.Get_count(MPI.BYTE))
            self._comm.Recv(text, status.Get_source(), _NOTICE_TAG)
            self.notice = text.decode(errors="replace")
        raise CommRevokedError(revoked(self.notice))
_INELIGIBLE = (0, 0, 0, 0)  # a direct_all_reduce plan: take the general path
_NO_BYTES = np.empty(0, np.uint8)


class CallCheck:
    """The ranks' calls compared beside the data: an MPI_Iallreduce (MAX) of each rank's
    signature and its complement, started just before the call's own collective (MPI matches
    a communicator's collectives in the order every rank starts them) and polled with it. The
    calls agree iff both maxima are this rank's own words; when they do not, every rank sees
    it (the maxima are the same everywhere) and all gather each other's signatures to say
    what differs."""

    def __init__(self, comm: MPI.Comm, timeout: float, notices: Notices) -> None:
        self._comm, self._timeout, self._notices = comm, timeout, notices
        self._mine = np.zeros(2, np.uint64)
        self._most = np.zeros(2, np.uint64)
        self._request: MPI.Request | None = None

    def start(self, word: int) -> None:
        if self._request is not None:
            # this rank's previous call failed after its check began: that check still runs,
            # and must not write its maxima over this call's (new buffers; the request keeps
            # the old ones alive, and is kept: see _wait)
            _ABANDONED.append((self._request, self._mine, self._most))
            self._mine, self._most = np.zeros(2, np.uint64), np.zeros(2, np.uint64)
        self._mine[0], self._mine[1] = word, word ^ _ALL_ONES
        self._request = self._comm.Iallreduce(self._mine, self._most, MPI.MAX)

    def poll(self) -> None:
        """During a data wait: raise at once if the check came back showing different calls
        (the data of mismatched calls may never arrive), or once the group is revoked."""
        self._notices.poll()
        if self._request is not None and self._request.Test():
            self._conclude()

    def finish(self) -> None:
        if self._request is not None:
            _wait((self._request,), self._timeout, "the comparison of the ranks' calls",
                  check=self._notices, keep=(self._mine, self._most))
            self._conclude()

    def close(self) -> None:
        """A check still running (its call failed) is kept, with its buffers (see _wait)."""
        if self._request is not None:
            _ABANDONED.append((self._request, self._mine, self._most))

    def _conclude(self) -> None:
        self._request = None
        if self._most.tobytes() != self._mine.tobytes():
            raise CommError(differing_calls(self._comm, int(self._mine[0]), self._timeout))


def differing_calls(comm: MPI.Comm, word: int, timeout: float) -> str:
    """What every rank called, once the ranks know their calls differ (all of them call this)."""
    words, mine = np.empty(comm.Get_size(), np.uint64), np.array([word], np.uint64)
    _wait((comm.Iallgather(mine, words),), timeout, "the exchange of the ranks' calls",
          keep=(mine, words))
    return mismatch({rank: int(w) for rank, w in enumerate(words)})


class MpiEndpoint:
    acknowledge = False  # calls are compared beside the data (CallCheck)

    def __init__(self, comm: MPI.Comm, timeout: float, check: CallCheck | Notices) -> None:
        self._comm, self._timeout, self._check = comm, timeout, check
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
        _wait(requests, self._timeout, "send/recv", statuses, self._check)
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
          statuses: list[MPI.Status] | None = None,
          check: CallCheck | Notices | None = None, keep: object = None) -> None:
    """Poll the requests to completion; CommError once timeout has passed, or for MPI's
    own errors (a message longer than its buffer: MPI_ERR_TRUNCATE), or as soon as the check
    of the call in progress shows that the ranks' calls differ (or the group is revoked).
    keep: what holds the requests' buffers (mpi4py's requests of collectives do not)."""
    try:
        _poll(requests, timeout, what, statuses, check)
    except MPI.Exception as e:
        codes = [e.Get_error_class()]
        if codes[0] == MPI.ERR_IN_STATUS and statuses:  # Testall: each status says its own
            codes = [MPI.Get_error_class(s.Get_error()) for s in statuses]
        if MPI.ERR_TRUNCATE in codes:
            raise CommError(f"a message was longer than the buffer it was received into "
                            f"(MPI_ERR_TRUNCATE, in {what}): send and recv sizes must "
                            "match") from None
        raise CommError(f"MPI failed in {what}: {e.Get_error_string()}") from None
    except BaseException:
        # A wait given up (a timeout, a revocation, the user's interrupt) leaves its requests
        # in MPI, which may still read and write their buffers: kept, with what holds the
        # buffers, for good. Dropped, a collective's buffers were freed while MPI still wrote
        # into them (a segfault in a later wait, once the peers had come).
        _ABANDONED.append((requests, keep))
        raise


_ABANDONED: list[tuple] = []  # (see _wait)


def _poll(requests: Sequence[MPI.Request], timeout: float, what: str,
          statuses: list[MPI.Status] | None, check: CallCheck | Notices | None) -> None:
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
            if check is not None:
                check.poll()
            os.sched_yield()  # let an oversubscribed peer run
            now = time.monotonic()
            deadline = deadline or now + timeout
            if now > deadline:
                raise CommError(f"timed out after {timeout:g} s (TBCOLL_TIMEOUT) waiting "
                                f"for {what}: a rank is late, stopped or gone")


_NUMPY_OPS = ("max", "min")  # of floats, numpy's (see MpiNative._op)


def _typed(array: np.ndarray) -> list:
    """[buffer, MPI datatype] of an array of a dtype tbcoll takes (bfloat16, which has no
    buffer format, travels as its 2-byte carrier)."""
    if array.dtype == _BFLOAT16:
        return [array.view(np.uint16), MPI.UINT16_T]
    return [array, _DATATYPES[array.dtype]]


def _numpy_op(ufunc: np.ufunc, dtype: np.dtype) -> MPI.Op:
    """ufunc as an MPI operation on arrays of dtype (bfloat16 travels as uint16)."""
    def apply(inbuf: object, inoutbuf: object, datatype: MPI.Datatype) -> None:
        incoming = np.frombuffer(inbuf, dtype)
        accumulated = np.frombuffer(inoutbuf, dtype)
        ufunc(incoming, accumulated, out=accumulated)

    return MPI.Op.Create(apply, commute=True)


class MpiNative:
    offers = frozenset(("all_reduce", "all_gather", "reduce_scatter", "broadcast", "barrier",
                        "all_to_all", "gather", "scatter", "reduce"))
    takes_mlx = False
    direct_broadcast = direct_reduce_scatter = None

    def __init__(self, comm: MPI.Comm, timeout: float, check: CallCheck) -> None:
        self._comm, self._timeout, self._check = comm, timeout, check
        self._size = comm.Get_size()
        self._numpy_ops: dict[tuple[str, np.dtype], MPI.Op] = {}
        self._plans: dict[tuple[np.dtype, str, int], tuple[int, int, int, int]] = {}
        self._scratch = (0, _NO_BYTES, _NO_BYTES)  # _gathered_all_reduce's (block, send, all)
        self._stand_ins: list[tuple[np.ndarray, np.ndarray]] = []  # (array, aligned copy): _into

    def direct_all_reduce(self, x: np.ndarray, op: str, root: int,
                          out: np.ndarray | None) -> np.ndarray | None:
        """The Communicator's one-call path (any size here): one MPI_Allgather of the ranks'
        calls and data when small, else MPI_Allreduce beside a CallCheck."""
        plan = self._plans.get((x.dtype, op, x.nbytes))
        if plan is None:
            plan = self._plans[x.dtype, op, x.nbytes] = self._plan(x.dtype, op, x.nbytes)
        flags = x.flags
        if plan is _INELIGIBLE or not (flags.c_contiguous and flags.aligned) or (
                out is not None and not out.flags.aligned):
            return None  # the general path gives MPI aligned copies (MpiNative._into)
        word, block, dtype, code = plan
        if block:
            return self._gathered_all_reduce(x, out, word, block, dtype, code)
        if out is None:
            out, send = np.empty_like(x), x
        elif not may_overlap(out, x):
            send = x
        elif same_buffer(out, x):
            send = None
        else:
            return None  # MPI forbids aliased buffers; the general path copies x first
        self._check.start(word)
        if x.dtype == _BFLOAT16 or op in _NUMPY_OPS and x.dtype.kind == "f":
            self.all_reduce(send, out, op)  # an op of numpy's: all_reduce's _op
        else:  # straight to MPI: all_reduce's _spec and _op cost ~0.3 us of a 3 us call
            _wait((self._comm.Iallreduce(MPI.IN_PLACE if send is None else send, out,
                                         _OPS[op]),), self._timeout, "MPI_Allreduce",
                  check=self._check, keep=(send, out))
        self._check.finish()
        return out

    def _plan(self, dtype: np.dtype, op: str, nbytes: int) -> tuple[int, int, int, int]:
        """How direct_all_reduce runs this (dtype, op, bytes): its signature, its block of the
        gathered path (0: not that path), dtype and op codes; _INELIGIBLE: not at all."""
        if dtype not in _DATATYPES:
            return _INELIGIBLE
        gathered = nbytes <= _GATHERED_BYTES and _gathered is not None
        return (signature("all_reduce", dtype, op, nbytes),
                _WORD.size + nbytes if gathered else 0, DTYPE_CODES[dtype], OP_CODES[op])

    def _gathered_all_reduce(self, x: np.ndarray, out: np.ndarray | None, word: int,
                             block: int, dtype: int, op: int) -> np.ndarray:
        """Each rank's signature and data to every rank in one MPI_Allgather; then, if the
        signatures agree, the data reduced in rank order (tbcoll.transports.mpi._gathered). A block
        is 8 bytes and the data, so every rank's data stays aligned for its dtype."""
        if self._scratch[0] != block:
            self._scratch = (block, np.empty(block, np.uint8),
                             np.empty(self._size * block, np.uint8))
        _, send, gathered = self._scratch
        _gathered.put_call(send, word, x)
        request = self._comm.Iallgather(send, gathered)
        spins = 0
        try:
            while not request.Test():  # _wait's first spins, inline: ~0.5 us of a 3 us call
                spins += 1
                if spins == _SPINS_PER_CHECK:
                    _wait((request,), self._timeout, "MPI_Allgather", check=self._check,
                          keep=self._scratch)
                    break
        except BaseException:
            _ABANDONED.append((request, self._scratch))  # (see _wait)
            raise
        if out is None:
            out = np.empty_like(x)
        if _gathered.gathered_reduce(gathered, block, self._size, _WORD.size, out, dtype, op) >= 0:
            calls = gathered.reshape(self._size, block)[:, :_WORD.size].copy().view(np.uint64)
            raise CommError(mismatch({rank: int(w) for rank, w in enumerate(calls[:, 0])}))
        return out

    def direct_all_gather(self, x: np.ndarray, op: None, root: int,
                          out: np.ndarray | None) -> np.ndarray | None:
        if x.dtype not in _DATATYPES or not x.flags.c_contiguous or (
                out is not None and may_overlap(x, out)):
            return None
        if out is None:
            out = np.empty((self._size * x.shape[0], *x.shape[1:]) if x.ndim
                           else (self._size,), x.dtype)
        self._check.start(signature("all_gather", x.dtype, None, x.nbytes))
        self.all_gather(x, out)
        self._check.finish()
        return out

    def all_reduce(self, send: np.ndarray | None, recv: np.ndarray, op: str) -> None:
        """send None: in place on recv."""
        self._finish(lambda: self._comm.Iallreduce(
            self._spec(send), self._into(recv), self._op(op, recv.dtype)), "MPI_Allreduce")

    def all_gather(self, send: np.ndarray, recv: np.ndarray) -> None:
        self._finish(lambda: self._comm.Iallgather(self._spec(send), self._into(recv)),
                     "MPI_Allgather")

    def reduce_scatter(self, send: np.ndarray, recv: np.ndarray, op: str) -> None:
        self._finish(lambda: self._comm.Ireduce_scatter_block(
            self._spec(send), self._into(recv), self._op(op, recv.dtype)),
            "MPI_Reduce_scatter_block")

    def broadcast(self, buf: np.ndarray, root: int) -> None:
        self._finish(lambda: self._comm.Ibcast(self._into(buf), root), "MPI_Bcast")

    def barrier(self) -> None:
        self._finish(self._comm.Ibarrier, "MPI_Barrier")

    def all_to_all(self, send: np.ndarray, recv: np.ndarray, send_counts: np.ndarray,
                   recv_counts: np.ndarray) -> None:
        """Counts in elements per rank; MPI_Alltoall where they are all equal."""
        if (send_counts == send_counts[0]).all() and (recv_counts == send_counts[0]).all():
            self._finish(lambda: self._comm.Ialltoall(self._spec(send), self._into(recv)),
                         "MPI_Alltoall")
            return
        self._finish(lambda: self._comm.Ialltoallv(
            self._counted(self._spec(send), send_counts),
            self._counted(self._into(recv), recv_counts)), "MPI_Alltoallv")

    def gather(self, send: np.ndarray, recv: np.ndarray | None, root: int) -> None:
        self._finish(lambda: self._comm.Igather(
            self._spec(send), self._into(recv) if recv is not None else None, root),
            "MPI_Gather")

    def scatter(self, send: np.ndarray | None, recv: np.ndarray, root: int) -> None:
        self._finish(lambda: self._comm.Iscatter(
            self._spec(send) if send is not None else None, self._into(recv), root),
            "MPI_Scatter")

    def reduce(self, send: np.ndarray, recv: np.ndarray | None, op: str, root: int) -> None:
        self._finish(lambda: self._comm.Ireduce(
            self._spec(send), self._into(recv) if recv is not None else None,
            self._op(op, send.dtype), root), "MPI_Reduce")

    def _finish(self, start: Callable[[], MPI.Request], what: str) -> None:
        """Start the call and wait for it; then copy what MPI wrote into aligned stand-ins
        (_into) to the caller's arrays."""
        try:
            _wait((start(),), self._timeout, what, check=self._check,
                  keep=(start, list(self._stand_ins)))
            for target, stand_in in self._stand_ins:
                np.copyto(target, stand_in)
        finally:
            self._stand_ins.clear()

    def close(self) -> None:
        for op in self._numpy_ops.values():
            op.Free()
        self._numpy_ops.clear()

    @staticmethod
    def _counted(spec: list, counts: np.ndarray) -> list:
        """[buffer, counts, displacements, datatype] for the v-collectives."""
        displacements = np.concatenate(([0], np.cumsum(counts)[:-1]))
        return [spec[0], (counts.tolist(), displacements.tolist()), spec[1]]

    def _spec(self, array: np.ndarray | None) -> object:
        """[buffer, MPI datatype] of an array MPI reads; an aligned copy where it is not
        aligned (see _into)."""
        if array is None:
            return MPI.IN_PLACE
        if not array.flags.aligned:
            array = array.copy()
        return _typed(array)

    def _into(self, array: np.ndarray) -> list:
        """[buffer, MPI datatype] of an array MPI writes (and may read: in place, broadcast's
        root). MPI's reductions read and write a buffer as its C type, which must be aligned,
        and mpi4py cannot name the type of an unaligned numpy array (its format is '=d', not
        'd'): such an array is replaced by an aligned copy for the call, copied back after."""
        if not array.flags.aligned:
            stand_in = array.copy()
            self._stand_ins.append((array, stand_in))
            array = stand_in
        return _typed(array)

    def _op(self, op: str, dtype: np.dtype) -> MPI.Op:
        """MPI's op, or numpy's where MPI has none (bfloat16) or differs (max and min of
        floats: MPICH's drops a NaN where numpy's keeps it)."""
        if dtype != _BFLOAT16 and (op not in _NUMPY_OPS or dtype.kind != "f"):
            return _OPS[op]
        key = (op, dtype)
        if key not in self._numpy_ops:
            self._numpy_ops[key] = _numpy_op(reducer(op), dtype)
        return self._numpy_ops[key]


class MpiGroup:
    """A communicator's view of MPI: its own MPI communicator for user messages, a duplicate
    for collectives (so that their messages never match each other's)."""

    tuning = "mpi"
    allocate = None  # comm.empty: plain arrays
    revocation = None  # a peer's notice is read in the waits (Notices)

    def __init__(self, comm: MPI.Comm, timeout: float) -> None:
        self._comm, self._timeout = comm, timeout
        self._coll_comm = _made(comm.Dup)
        self._notices = Notices(comm)
        self._check = CallCheck(self._coll_comm, timeout, self._notices)
        self.p2p = MpiEndpoint(comm, timeout, self._notices)
        self.coll = MpiEndpoint(self._coll_comm, timeout, self._check)
        self.native = MpiNative(self._coll_comm, timeout, self._check)
        self.rank, self.size = self.p2p.rank, self.p2p.size

    def begin_call(self, seq: int, signature: int) -> None:
        self._check.start(signature)

    def end_call(self) -> None:
        self._check.finish()

    def revoke(self, notice: str) -> None:
        self._notices.send(notice)

    def context_hint(self) -> int:
        return 0  # MPI names its communicators itself

    def split(self, color: int | None, key: int, members: list[int],
              context: int) -> MpiGroup | None:
        # MPI takes C ints; the new ranks in the order members gives them
        position = members.index(self.rank) if color is not None else 0
        sub = _made(lambda: self._comm.Split(MPI.UNDEFINED if color is None else color,
                                             position))
        return None if sub == MPI.COMM_NULL else MpiGroup(sub, self._timeout)

    def describe_links(self) -> list[str]:
        return []  # MPI routes the messages itself

    def close(self) -> None:
        if MPI.Is_finalized():
            return
        self.native.close()
        self._check.close()
        self._coll_comm.Free()
        self._comm.Free()


def _made(make: Callable[[], MPI.Comm]) -> MPI.Comm:
    """A new MPI communicator; CommError, saying what to do, where MPI has no more (MPICH
    gives a process about 2000, and each tbcoll communicator takes two)."""
    try:
        return make()
    except MPI.Exception as e:
        # MPICH's message is its error stack; the last line says what ran out
        why = e.Get_error_string().strip().splitlines()[-1].rpartition("): ")[2]
        raise CommError(f"MPI could not make another communicator ({why}); close the "
                        "sub-communicators you no longer need (comm.close(), or `with "
                        "comm.split(...) as sub:`); each takes two of MPI's") from None


def open_world(info: LaunchInfo | None, prefix: str) -> tuple[MpiGroup, int, int]:
    """The world of MPI_COMM_WORLD (prefix: unused, MPI names its communicators itself)."""
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
