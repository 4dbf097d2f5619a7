"""MLX transport: mx.distributed, which on Macs cabled with Thunderbolt 5 is RDMA (jaccl) and
elsewhere MLX's ring backend over TCP. MLX picks the backend from what tbrun (or mlx.launch)
set: MLX_IBV_DEVICES and MLX_JACCL_COORDINATOR for jaccl, MLX_HOSTFILE for ring.

Native collectives are MLX's own: all_sum, all_max, all_min, all_gather and, where the backend
has it, sum_scatter. What MLX lacks, tbcoll builds on top of them: prod (a gather, then a
product in rank order), reduce_scatter for every op, broadcast (a sum of the root's bytes
with zeros: exact), barrier.

Point-to-point, tbcoll's algorithms (algorithm="ring" and so on) and sub-groups from split
go over tbcoll's tcp transport between the same ranks (over the Thunderbolt links where the
hostfile names them), not over mx.distributed.send/recv: MLX's messages carry no tag and
share MLX's channels with its collectives, so a user's message still in flight would be read
by the next all_sum as its data. MLX's ring backend cannot split a group either.

MLX cannot interrupt a wait for a lost peer; a watchdog thread ends this rank with a
CommError on stderr once an operation has waited TBCOLL_TIMEOUT, so tbrun tears the job down.
Nor can a Python signal handler run inside MLX's wait: its exception comes once MLX returns,
from a call that completed, which revokes the world all the same (tbcoll.CommRevokedError);
a peer that then waits in MLX for the revoked rank is ended by its watchdog, which reads the
notice on tcp's connections, within two seconds.

MLX's collectives match the ranks' calls by order alone: all_sum on one rank and all_max on
another, or other sizes, would return each its own wrong answer. So each native collective
carries its call's tbcoll.core.calls signature in lanes beside the data (LANES values of 0 and 1,
one pair per bit, reduced or gathered with it), which show after the call whether every rank
made the same call; if not, every rank raises a CommError saying in which fields the calls
differ. The lanes cost a copy of the data into the collective's buffer.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable

import ml_dtypes
import numpy as np

from tbcoll.core.calls import MISMATCH_ADVICE, fields_in, render, signature
from tbcoll.core.dtypes import reducer
from tbcoll.core.errors import PEER_ENDED, CommError, PeerLostError, TbcollError, revoked
from tbcoll.job.env import LaunchInfo, comm_timeout
from tbcoll.job.rendezvous import report_peer_failure
from tbcoll.transports.tcp import transport as tcp
from tbcoll.transports.tcp.transport import TcpGroup

try:
    import mlx.core as mx
except ImportError as e:  # an optional extra
    raise TbcollError("the mlx backend needs MLX: pip install 'tbcoll[mlx]'") from e

_BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
_DTYPES = {mx.float16, mx.bfloat16, mx.float32, mx.float64, mx.int8, mx.int16, mx.int32,
           mx.int64, mx.uint8}  # tbcoll's dtypes (tbcoll.core.dtypes)
_NATIVE_OPS = {"sum": mx.distributed.all_sum, "max": mx.distributed.all_max,
               "min": mx.distributed.all_min}
_BITS = 64  # of a signature
LANES = 2 * _BITS  # per bit j, lane j holds the bit and lane 64 + j its complement


def _word(lanes: np.ndarray) -> int:
    """The signature whose lanes (one rank's, gathered) these are."""
    return sum(1 << j for j in np.flatnonzero(lanes[:_BITS]).tolist())


def _numpy_dtype(x: mx.array) -> np.dtype:
    return _BFLOAT16 if x.dtype == mx.bfloat16 else np.dtype(str(x.dtype).rpartition(".")[2])


def to_mlx(array: np.ndarray) -> mx.array:
    if array.dtype == _BFLOAT16:
        return mx.array(array.view(np.uint16)).view(mx.bfloat16)
    return mx.array(array)


def from_mlx(array: mx.array, into: np.ndarray) -> None:
    """Copy an evaluated mlx array into a numpy array of the same size and dtype."""
    if array.dtype == mx.bfloat16:
        array = array.view(mx.uint16)
    np.copyto(into.reshape(-1).view(np.uint16 if into.dtype == _BFLOAT16 else into.dtype),
              np.asarray(array).reshape(-1))


class Watchdog:
    """Ends the process when one MLX evaluation has waited longer than the timeout, or
    sooner when tbcoll's own connections beside MLX show a peer gone (MLX cannot interrupt
    its wait, and spins for ever on a lost peer: mlx#4278)."""

    def __init__(self, rank: int, timeout: float,
                 silent_loss: Callable[[], tuple[int, str] | None],
                 revoked: Callable[[], str | None] = lambda: None) -> None:
        self._rank, self._timeout, self._silent_loss = rank, timeout, silent_loss
        self._revoked = revoked  # the world's revocation notice, if one has come
        # (what, since) while an evaluation runs. One attribute, replaced whole: CPython stores
        # and loads an object reference atomically, so the watchdog thread sees either the
        # old tuple or the new one, never a mix; no lock on the latency-critical path.
        self._busy: tuple[str, float] | None = None
        threading.Thread(target=self._watch, name="tbcoll-mlx-watchdog", daemon=True).start()

    def eval(self, what: str, *arrays: mx.array) -> None:
        self._busy = (what, time.monotonic())
        try:
            mx.eval(*arrays)
        except RuntimeError as e:  # a peer's socket failed (ring backend), or MLX refused
            loss = self._lost_peer()
            if loss is None:
                raise CommError(f"{what} failed in MLX: {e}") from e
            raise PeerLostError(f"{what} failed in MLX: {e}; lost rank {loss[0]} ({loss[1]})",
                                (loss[0],)) from e
        finally:
            self._busy = None

    def _lost_peer(self) -> tuple[int, str] | None:
        """A peer tbcoll's connections show gone, looking for up to a second (MLX's own
        socket may notice a dead peer a little before tbcoll's)."""
        deadline = time.monotonic() + 1.0
        while (loss := self._silent_loss()) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        return loss

    def _watch(self) -> None:
        while True:
            time.sleep(min(1.0, self._timeout / 4))
            busy = self._busy
            if busy and time.monotonic() - busy[1] > 1.0 and (loss := self._silent_loss()):
                peer, why = loss
                message = f"{busy[0]} on rank {self._rank}: lost rank {peer} ({why})"
                if not why.startswith(PEER_ENDED):  # a dead link: tcp's streams could fail
                    # over, but MLX's own queue pairs and sockets cannot (docs/failover.md)
                    message += "; MLX's collectives cannot move to another path"
                report_peer_failure(message, (peer,))
                print(f"tbcoll.PeerLostError: {message}; MLX cannot interrupt its wait. "
                      "Exiting.", file=sys.stderr, flush=True)
                os._exit(1)
            if busy and time.monotonic() - busy[1] > 1.0 and (notice := self._revoked()):
                print(f"tbcoll.CommRevokedError: {busy[0]} on rank {self._rank}: "
                      f"{revoked(notice)}; MLX cannot interrupt its wait. Exiting.",
                      file=sys.stderr, flush=True)
                os._exit(1)
            if busy and time.monotonic() - busy[1] > self._timeout:
                print(f"tbcoll.CommError: rank {self._rank}: {busy[0]} has waited more than "
                      f"{self._timeout:g} s (TBCOLL_TIMEOUT) for its peers over MLX, which "
                      "cannot interrupt the wait; a peer is probably gone. Exiting.",
                      file=sys.stderr, flush=True)
                os._exit(1)


class MlxNative:
    """The world's collectives as MLX runs them, and what tbcoll adds on top."""

    takes_mlx = True  # direct_all_reduce and direct_all_gather take mlx arrays unconverted
    offers = frozenset(("all_reduce", "all_gather", "reduce_scatter", "broadcast", "barrier"))
    direct_broadcast = direct_reduce_scatter = None

    def __init__(self, group: mx.distributed.Group, watchdog: Watchdog) -> None:
        self._group, self._eval = group, watchdog.eval
        self._size = group.size()
        self._sum_scatter = True  # until the backend says it has none (ring)
        self.call = 0  # the signature of the call the Communicator began (MlxGroup.begin_call)
        self._lanes: dict[tuple[int, mx.Dtype], mx.array] = {}

    def direct_all_reduce(self, x: object, op: str, root: int, out: object) -> mx.array | None:
        """The Communicator's one-call path for an mlx array: MLX's own collective on it, no
        copy back (None: take the general path, e.g. for numpy arrays or prod)."""
        if not isinstance(x, mx.array) or x.dtype not in _DTYPES or op not in _NATIVE_OPS:
            return None
        return self._reduced(x, op, signature("all_reduce", _numpy_dtype(x), op, x.nbytes),
                             "all_reduce")

    def direct_all_gather(self, x: object, op: None, root: int, out: object) -> mx.array | None:
        if not isinstance(x, mx.array) or x.dtype not in _DTYPES:
            return None
        return self._gathered(x, signature("all_gather", _numpy_dtype(x), None, x.nbytes))

    def all_reduce(self, send: np.ndarray | None, recv: np.ndarray, op: str) -> None:
        x = to_mlx(recv if send is None else send)
        if op in _NATIVE_OPS:
            return from_mlx(self._reduced(x, op, self.call, "all_reduce"), recv)
        # prod: every rank's block, multiplied in rank order as every rank does
        gathered = self._gathered(x[None], self.call)
        blocks = np.empty((self._size, *recv.shape), recv.dtype)
        from_mlx(gathered, blocks)
        np.copyto(recv, blocks[0])
        for block in blocks[1:]:
            reducer(op)(recv, block, out=recv)

    def all_gather(self, send: np.ndarray, recv: np.ndarray) -> None:
        from_mlx(self._gathered(to_mlx(send), self.call), recv)

    def reduce_scatter(self, send: np.ndarray, recv: np.ndarray, op: str) -> None:
        if op == "sum" and self._sum_scatter:
            try:
                return from_mlx(self._scattered(to_mlx(send), self.call), recv)
            except CommError as e:
                if "not supported" not in str(e):
                    raise
                self._sum_scatter = False
        total = np.empty_like(send)
        self.all_reduce(send, total, op)
        rank, block = self._group.rank(), recv.size
        np.copyto(recv, total[rank * block:(rank + 1) * block])

    def broadcast(self, buf: np.ndarray, root: int) -> None:
        raw = buf.view(np.uint8)
        mine = raw if self._group.rank() == root else np.zeros_like(raw)
        # one non-zero term per byte: exact; the lanes carry the root each rank named
        from_mlx(self._reduced(to_mlx(mine), "sum", self.call, "broadcast"), raw)

    def barrier(self) -> None:
        self._reduced(mx.zeros((1,), mx.uint8), "sum", self.call, "barrier")

    # --- the lanes (see the module docstring) ----------------------------------------------

    def _reduced(self, x: mx.array, op: str, call: int, what: str) -> mx.array:
        """x reduced with op over the ranks, after checking that every rank made call. MLX's
        all_max and all_min drop a NaN that numpy's maximum and minimum keep: for floats a
        mask of the NaNs travels too (as 1, or -1 for min, so that any rank's NaN wins)."""
        flat = x.reshape(-1)
        parts = [self._lanes_of(call, x.dtype), flat]
        nans = op != "sum" and mx.issubdtype(x.dtype, mx.floating)
        if nans:
            mask = mx.isnan(flat).astype(x.dtype)
            parts.append(mask if op == "max" else -mask)
        both = _NATIVE_OPS[op](mx.concatenate(parts), group=self._group)
        self._eval(what, both)
        self._check(both[:LANES], op, call, what)
        result = both[LANES:LANES + flat.size]
        if nans:
            result = mx.where(both[LANES + flat.size:] != 0, mx.array(float("nan"), x.dtype),
                              result)
        return result.reshape(x.shape)

    def _gathered(self, x: mx.array, call: int) -> mx.array:
        rows = x.reshape(1) if x.ndim == 0 else x
        both = mx.distributed.all_gather(
            mx.concatenate([self._lanes_of(call, x.dtype), rows.reshape(-1)]), group=self._group)
        self._eval("all_gather", both)
        blocks = both.reshape(self._size, -1)
        lanes = np.asarray(blocks[:, :LANES].astype(mx.int32))
        if (lanes != lanes[self._group.rank()]).any():
            self._differ("all_gather", call, int(np.bitwise_or.reduce(
                [_word(row) ^ call for row in lanes])))
        return blocks[:, LANES:].reshape(self._size * rows.shape[0], *rows.shape[1:])

    def _scattered(self, x: mx.array, call: int) -> mx.array:
        """sum_scatter of x, each rank's block with the lanes in front."""
        blocks = x.reshape(self._size, -1)
        lanes = mx.broadcast_to(self._lanes_of(call, x.dtype), (self._size, LANES))
        both = mx.distributed.sum_scatter(mx.concatenate([lanes, blocks], axis=1).reshape(-1),
                                          group=self._group)
        self._eval("reduce_scatter", both)
        self._check(both[:LANES], "sum", call, "reduce_scatter")
        return both[LANES:].reshape(x.shape[0] // self._size, *x.shape[1:])

    def _lanes_of(self, call: int, dtype: mx.Dtype) -> mx.array:
        lanes = self._lanes.get((call, dtype))
        if lanes is None:
            bits = np.array([call >> j & 1 for j in range(_BITS)], np.int32)
            lanes = mx.array(np.concatenate([bits, 1 - bits])).astype(dtype)
            if len(self._lanes) > 256:
                self._lanes.clear()
            self._lanes[call, dtype] = lanes
        return lanes

    def _check(self, lanes: mx.array, op: str, call: int, what: str) -> None:
        """Reduced lanes agree where every rank's bit was the same: a sum of (p, 0) or (0, p),
        a max or min of one 1 and one 0 per pair."""
        seen = np.asarray(lanes.astype(mx.int32))
        ones, zeros = seen[:_BITS], seen[_BITS:]
        if op == "sum":  # a bit some ranks have: (k, p - k); anything else: mixed-up calls
            same = (ones == self._size) & (zeros == 0) | (ones == 0) & (zeros == self._size)
            clean = (ones >= 0) & (zeros >= 0) & (ones + zeros == self._size)
        else:  # a bit some ranks have: (1, 1) for max, (0, 0) for min
            same = ones + zeros == 1
            clean = same | (ones == zeros) & (ones == (op == "max"))
        if not same.all():
            bits = sum(1 << j for j in np.flatnonzero(~same).tolist())
            self._differ(what, call, bits if clean.all() else 0)

    def _differ(self, what: str, call: int, bits: int) -> None:
        """bits: where the calls differ; 0 where MLX combined different collectives or sizes
        and the lanes say only that they differ."""
        where = (f"in {', '.join(fields_in(bits))}" if bits else
                 "(MLX combined different collectives or sizes)")
        raise CommError(f"the ranks' calls do not match: over MLX, {what} found that they "
                        f"differ {where} (this rank: {render(call)}); {MISMATCH_ADVICE}")


class MlxGroup:
    """The world over MLX: MLX's collectives as natives; point-to-point, tbcoll's algorithms
    and split sub-groups over tbcoll's tcp transport between the same ranks."""

    allocate = None  # comm.empty: plain arrays
    world_peers = True  # its peers are named by tcp's and the watchdog's world ranks

    def __init__(self, tcp: TcpGroup, native: MlxNative, backend: str) -> None:
        self._tcp, self.native = tcp, native
        # Over RDMA MLX's collectives are the fast path; over its ring backend (TCP) tbcoll's
        # own algorithms were faster at every size measured (tbcoll/collectives/tuning.py).
        self.tuning = "mlx" if backend.startswith("jaccl") else "stream"
        self.p2p, self.coll = tcp.p2p, tcp.coll
        self.rank, self.size = tcp.rank, tcp.size
        self.context_hint, self.split = tcp.context_hint, tcp.split  # sub-groups are tcp's
        self.end_call, self.describe_links = tcp.end_call, tcp.describe_links
        # told over tcp: a peer that waits in MLX's C (its collectives) cannot look, and
        # waits on, as MLX has no timeout
        self.revoke, self.revocation = tcp.revoke, tcp.revocation

    def begin_call(self, seq: int, signature: int) -> None:
        self._tcp.begin_call(seq, signature)  # for the algorithms
        self.native.call = signature  # for the lanes of the natives

    def close(self) -> None:
        self._tcp.close()  # MLX keeps its group for the life of the process


def open_world(info: LaunchInfo | None, prefix: str) -> tuple[MlxGroup, int, int]:
    # Named, not "any": MLX left to choose may load an MPI it finds (mpich's, from PyPI).
    backend = ("jaccl" if "MLX_IBV_DEVICES" in os.environ else
               "ring" if "MLX_HOSTFILE" in os.environ else None)
    alone = info is None or info.size == 1
    if not alone and backend is None:
        raise CommError("the mlx backend needs MLX's own variables; start the job with "
                        "`tbrun --backend mlx` (or mlx.launch)")
    group = mx.distributed.init(strict=not alone, backend=backend or "ring")
    if info is not None and group.size() != info.size:
        raise CommError(f"MLX sees a group of {group.size()} ranks but tbrun started "
                        f"{info.size}; start the job with `tbrun --backend mlx`")
    beside, local_rank, node_rank = tcp.open_world(info, prefix)
    watchdog = Watchdog(group.rank(), comm_timeout(info), beside.silent_loss, beside.revoked)
    return MlxGroup(beside, MlxNative(group, watchdog), backend or "ring"), local_rank, node_rank
