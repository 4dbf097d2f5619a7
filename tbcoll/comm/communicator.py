"""Communicator: the collective API over a transport's Group.

A call takes one path. The public methods are one line each (mpi4py's shape): all_reduce,
all_gather, reduce_scatter, broadcast, send and recv call their Route (tbcoll.comm.routes: one
per collective, built once and again on the events that change it), which takes the
transport's one-call path (shm's C lane at every size, tcp's up to 1 MiB, a direct path up to
the table's size) where it may take the call, else the general path (_general_<name>); every
other call takes the general path. There its registry entry (tbcoll.collectives) checks the
arguments where the user called (ValueError, TypeError) and describes the call; `_run` then
takes the first of a world of one, the transport's one-call path, its native collective or
the algorithm chosen (algorithm=, else TBCOLL_ALGO, else tbcoll.collectives.tuning's table),
telling the transport the call's signature so that ranks whose calls differ fail
(tbcoll.core.calls). A CommError from below is raised again naming the collective and this
rank. Blocking calls take the communicator for their thread (tbcoll.comm.ownership) and wait
for queued non-blocking ones; a non-blocking call is described at once and queued
(tbcoll.comm.requests). send, recv, isend and irecv are tbcoll.comm.point_to_point's. A
registered collective (tbcoll.register_collective) is `collective(name, ...)`, also
`comm.<name>(...)`: its descriptor's call, then the general path.

A call interrupted once it may have begun (a KeyboardInterrupt, or any exception of a signal
handler: anything but tbcoll's errors and the ValueError and TypeError of bad arguments) cannot
be undone once the peers have moved on, so it revokes the communicator (_interrupted): the
call gate refuses every later call at once with tbcoll.CommRevokedError, and the transport
tells the peers (Group.revoke), whose waits then raise it too; the user's exception goes on.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable
from functools import partial, partialmethod
from typing import Any
from weakref import WeakMethod

import numpy as np

from tbcoll.collectives import (
    ALGORITHMS,
    ALL_GATHER,
    ALL_REDUCE,
    ALL_TO_ALL,
    BARRIER,
    BROADCAST,
    DESCRIPTORS,
    GATHER,
    REDUCE,
    REDUCE_SCATTER,
    SCATTER,
    tuning,
)
from tbcoll.collectives.base import (
    ON_REGISTER,
    Call,
    Context,
    registered_mismatch,
    registry_digest,
)
from tbcoll.collectives.checks import verify_calls_match
from tbcoll.comm import allocation, routes, survival, uneven
from tbcoll.comm.ownership import busy, track
from tbcoll.comm.point_to_point import MAX_TAG, PointToPoint
from tbcoll.comm.requests import Progress, Request
from tbcoll.core.errors import (
    CommError,
    CommRevokedError,
    PeerError,
    RankFailedError,
    TbcollError,
    revoked,
)
from tbcoll.core.gate import Gate
from tbcoll.core.names import ALGORITHM_CODES, BUILT_IN, COLLECTIVES, KIND_CODES
from tbcoll.core.protocols import Group
from tbcoll.job.env import algorithm_overrides, check_mode, record_size, trace_chunk, tracing
from tbcoll.job.rendezvous import report_peer_failure
from tbcoll.observability.dumps import on_failure
from tbcoll.observability.recorder import call_site, new_trace, trace_full

_INT64 = 1 << 63
# what a call raises of its own, never an interruption (see the module docstring)
_OWN_ERRORS = (TbcollError, ValueError, TypeError)


def watch_revocation(gate: Any, group: Group, rank: int) -> None:
    """Lend the gate the transport's revocation word (Group.revocation), so that once a peer's
    notice has set it every call here raises CommRevokedError at enter: the one flag every call
    checks, set here by an interrupted call (gate.revoke) or by a peer's."""
    if group.revocation is not None:
        word, why = group.revocation
        gate.watch(word, CommRevokedError, lambda: f"rank {rank}: {revoked(why())}")


class Communicator(PointToPoint):
    """A group of ranks that run collectives together. Use tbcoll.init() to get the world."""

    # At most MAX_ATTRIBUTES attributes a communicator: CPython (3.11-3.13) shares one key table
    # among a class's instances only up to 30 keys; past it every attribute load on the call
    # path is a dict lookup (a 0.30 us shm all_reduce took 0.33). tests/library/test_comm_args.py
    MAX_ATTRIBUTES = 29

    def __init__(self, group: Group, backend: str, local_rank: int, node_rank: int,
                 world_ranks: tuple[int, ...] | None = None,
                 lineage: survival.Lineage | None = None) -> None:
        self._group = group
        # its name in the store and how its survivors meet again (tbcoll.comm.survival)
        self._lineage = lineage or survival.Lineage(f"unnamed{id(self)}", None)
        self.rank, self.size = group.rank, group.size
        self._world_ranks = tuple(range(self.size)) if world_ranks is None else world_ranks
        self.local_rank, self.node_rank = local_rank, node_rank
        self.backend = backend
        self._overrides = algorithm_overrides(ALGORITHMS)
        # what the registry's entries see of this communicator (tbcoll.collectives.base.Context)
        self._ctx = Context(group, backend, self._run)
        self._ctx.fix(self._overrides)
        self._check_calls = check_mode()
        # the lock, the calls in progress, the count and the flight recorder (tbcoll.core.gate)
        self._gate = Gate(record_size())
        watch_revocation(self._gate, group, self.rank)
        self._release = track(self, group, self._gate, self._world_ranks)
        self._trace = new_trace(tracing(), self._world_ranks)  # every call, under --trace
        self._trace_chunk = trace_chunk() if self._trace is not None else 0
        self._closed = False
        self._progress: Progress | None = None  # made by the first non-blocking call
        self._uneven = uneven.Scratch()  # all_gather with counts: its buffers
        # what each routed call may take (tbcoll.comm.routes): the transport's lane and direct
        # paths, where the table takes them; none under --trace (its calls are timed) or
        # TBCOLL_CHECK (each call is compared first)
        self._routes = routes.Routes(group=group, size=self.size, fixed=self._ctx.fixed,
                                     gate=self._gate, named=self._named,
                                     checks=self._check_calls, traced=tracing(),
                                     max_tag=MAX_TAG)
        self._bind()

    def _bind(self) -> None:
        """Each routed call's Route (tbcoll.comm.routes), whose call its public method makes
        (_all_reduce ...): here, and again after an event that changes them (the first
        non-blocking call, comm.empty's allocations, close). The general paths are held
        weakly: the routes live in the communicator."""
        general = {name: _weakly(getattr(self, f"_general_{name}")) for name in routes.NAMES}
        for name, route in self._routes.bind(self._progress, general).items():
            setattr(self, f"_{name}", route.call)

    # --- collectives: blocking, then non-blocking (each returns a tbcoll.Request) --------

    def all_reduce(self, x: Any, op: str = "sum", algorithm: str | None = None,
                   out: np.ndarray | None = None) -> Any:
        """Reduce x elementwise over all ranks with op; every rank gets the result."""
        return self._all_reduce(x, op, algorithm, out)

    def all_gather(self, x: Any, algorithm: str | None = None,
                   out: np.ndarray | None = None, counts: Any = None) -> Any:
        """Concatenate every rank's x along axis 0 (a 0-d x gives shape (size,)). With counts
        (the rows of each rank's x, in rank order, the same on every rank: MPI's Allgatherv)
        the parts may differ in size."""
        return self._all_gather(x, algorithm, out, counts)

    def reduce_scatter(self, x: Any, op: str = "sum", algorithm: str | None = None,
                       out: np.ndarray | None = None) -> Any:
        """Reduce x over all ranks and return this rank's block of it along axis 0."""
        return self._reduce_scatter(x, op, algorithm, out)

    def broadcast(self, x: Any, root: int = 0, algorithm: str | None = None,
                  out: np.ndarray | None = None) -> Any:
        """Return root's x on every rank (x gives the shape and dtype on the others)."""
        return self._broadcast(x, root, algorithm, out)

    def barrier(self) -> None:
        """Return once every rank has entered the barrier."""
        return self._dispatch(BARRIER.call(self._ctx))

    def all_to_all(self, x: Any, counts: Any = None, algorithm: str | None = None,
                   out: np.ndarray | None = None, recv_counts: Any = None) -> Any:
        """Send block j of x (along axis 0) to rank j; return the blocks from ranks 0..size-1
        in order. Without counts x.shape[0] must divide by size. With counts (the rows of x for
        each rank, in order, summing to x.shape[0]: mixture-of-experts routing) blocks may
        differ in size and the result is (rows received, the count from each rank); the ranks
        first tell each other their counts, unless every rank passes recv_counts (the rows it
        will get from each rank, e.g. when sending results back the way they came)."""
        return self._dispatch(ALL_TO_ALL.call(self._ctx, x, counts, algorithm, out, recv_counts))

    def gather(self, x: Any, root: int = 0, algorithm: str | None = None,
               out: np.ndarray | None = None) -> Any:
        """Concatenate every rank's x along axis 0 at root (out is used there); others get
        None."""
        return self._dispatch(GATHER.call(self._ctx, x, root, algorithm, out))

    def scatter(self, x: Any, root: int = 0, algorithm: str | None = None,
                out: np.ndarray | None = None) -> Any:
        """Split root's x along axis 0 into size blocks and give rank j block j; the other
        ranks pass None (their x is not read): root tells them the shape and dtype."""
        return self._dispatch(SCATTER.call(self._ctx, x, root, algorithm, out))

    def reduce(self, x: Any, op: str = "sum", root: int = 0, algorithm: str | None = None,
               out: np.ndarray | None = None) -> Any:
        """Reduce x elementwise over all ranks with op; root gets the result (out is used
        there), the others None."""
        return self._dispatch(REDUCE.call(self._ctx, x, op, root, algorithm, out))

    def iall_reduce(self, x: Any, op: str = "sum", algorithm: str | None = None,
                    out: np.ndarray | None = None) -> Request:
        return self._submit(ALL_REDUCE.call(self._ctx, x, op, algorithm, out))

    def iall_gather(self, x: Any, algorithm: str | None = None,
                    out: np.ndarray | None = None) -> Request:
        return self._submit(ALL_GATHER.call(self._ctx, x, algorithm, out))

    def ireduce_scatter(self, x: Any, op: str = "sum", algorithm: str | None = None,
                        out: np.ndarray | None = None) -> Request:
        return self._submit(REDUCE_SCATTER.call(self._ctx, x, op, algorithm, out))

    def ibroadcast(self, x: Any, root: int = 0, algorithm: str | None = None,
                   out: np.ndarray | None = None) -> Request:
        return self._submit(BROADCAST.call(self._ctx, x, root, algorithm, out))

    def iall_to_all(self, x: Any, counts: Any = None, algorithm: str | None = None,
                    out: np.ndarray | None = None, recv_counts: Any = None) -> Request:
        return self._submit(ALL_TO_ALL.call(self._ctx, x, counts, algorithm, out, recv_counts))

    def collective(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Run the collective registered as name (tbcoll.register_collective; the built-ins
        too) with its descriptor's arguments; comm.<name>(...) is the same call."""
        return self._dispatch(self._registered_call(name, args, kwargs))

    def icollective(self, name: str, *args: Any, **kwargs: Any) -> Request:
        """collective(name, ...) without blocking: a tbcoll.Request, as iall_reduce's."""
        return self._submit(self._registered_call(name, args, kwargs))

    def _registered_call(self, name: str, args: tuple, kwargs: dict[str, Any]) -> Call:
        """The Call of collective name, checked and described; before this communicator's
        first registered collective, the ranks' registries compared."""
        descriptor = DESCRIPTORS.get(name)
        if descriptor is None:
            raise ValueError(f"no collective is registered as {name!r}; the collectives: "
                             f"{', '.join(DESCRIPTORS)}")
        call = descriptor.call(self._ctx, *args, **kwargs)
        if not self._ctx.agreed and name not in BUILT_IN:
            self._compare_registries()
        return call

    def _compare_registries(self) -> None:
        """Before this communicator's first registered collective: the ranks' registries are
        the same (their codes are positions; see tbcoll.collectives): one all_reduce of two
        numbers, a call of its own, before the registered one's signature is compared."""
        digest = registry_digest()
        both = self._dispatch(ALL_REDUCE.call(self._ctx, np.array([digest, -digest], np.int64),
                                              "max", "rd", None))
        if both[0] != digest or both[1] != -digest:
            raise TbcollError(f"rank {self.rank}: {registered_mismatch()}")
        self._ctx.agreed = True

    # --- the general path of a collective --------------------------------------------------

    def _general_all_reduce(self, x: Any, op: str, algorithm: str | None, out: Any) -> Any:
        return self._dispatch(ALL_REDUCE.call(self._ctx, x, op, algorithm, out))

    def _general_all_gather(self, x: Any, algorithm: str | None, out: Any, counts: Any) -> Any:
        if counts is not None:
            return uneven.all_gather(self, x, counts, algorithm, out, self._uneven)
        return self._dispatch(ALL_GATHER.call(self._ctx, x, algorithm, out))

    def _general_reduce_scatter(self, x: Any, op: str, algorithm: str | None, out: Any) -> Any:
        return self._dispatch(REDUCE_SCATTER.call(self._ctx, x, op, algorithm, out))

    def _general_broadcast(self, x: Any, root: int, algorithm: str | None, out: Any) -> Any:
        return self._dispatch(BROADCAST.call(self._ctx, x, root, algorithm, out))

    # --- the one path of a collective ----------------------------------------------------

    def _dispatch(self, call: Call) -> Any:
        """A blocking call: this thread's, after the queued non-blocking ones."""
        gate = self._gate
        kind, array = call.kind, call.array
        if (slot := gate.enter(kind.code, None if array is None else array.dtype, call.op,
                               call.root, 0 if array is None else array.nbytes,
                               ALGORITHM_CODES[call.algorithm], 1)) < 0:
            raise busy(self.rank, kind.name, gate)
        try:
            if self._progress is not None:
                return self._progress.run(partial(self._run, call))
            return self._run(call)
        finally:
            gate.leave(slot)

    def _run(self, call: Call) -> Any:
        """The first path that applies: a world of one, the transport's one-call path, its
        native collective, the algorithm (see tbcoll.collectives). The call is in progress in
        the gate from here (on the thread that runs it), counted before it moves data,
        recorded once done."""
        kind, gate, array, ctx = call.kind, self._gate, call.array, self._ctx
        slot = gate.begin(kind.code, None if array is None else array.dtype, call.op, call.root,
                          0 if array is None else array.nbytes, ALGORITHM_CODES[call.algorithm])
        try:
            if self.size == 1:
                gate.count(slot)
                result = kind.alone(ctx, call)
                self._record(slot, call)
                return result
            native = call.algorithm == "native"
            if native and (path := self._routes.direct.get(kind.name)) is not None:
                result = (path(call.x, call.op, call.root, call.out) if type(call.x) is np.ndarray
                          else kind.run_direct(ctx, path, call))
                if result is not None:
                    gate.count(slot)
                    self._record(slot, call)
                    return result
            kind.prepare(ctx, call)  # may make calls of its own first (scatter's header)
            seq = gate.count(slot)
            if self._check_calls:
                verify_calls_match(self._group.coll, kind.name, kind.described(call), call.op,
                                   call.root, call.algorithm)
            self._group.begin_call(seq, kind.signature(call))
            if native:
                kind.native(ctx, call)
            else:
                kind.algorithm(ctx, call, kind.implementation(call.algorithm))
            self._group.end_call()
            result = kind.finish(ctx, call)
            self._record(slot, call)
            return result
        except CommError as e:
            raise self._named(e, kind.name) from e
        except BaseException as e:
            self._interrupted(kind.name, e)
            raise
        finally:
            gate.end(slot)

    def _record(self, slot: int, call: Call) -> None:
        """The call of slot, counted, has completed: into the gate's flight recorder, and
        under --trace into the trace with the user's line that made it."""
        self._gate.record(slot)
        if self._trace is not None:
            self._trace.append((self._gate.last(), call_site(sys._getframe(1))))
            if len(self._trace) >= self._trace_chunk:
                trace_full.set()  # tbcoll.observability.dumps sends them

    def _submit(self, call: Call) -> Request:
        """A non-blocking call: checked and described already; queued in its turn."""
        name = call.kind.name
        return self._claimed(name, lambda: self._progress_thread(name).submit(
            name, partial(self._run, call)))

    def _claimed(self, what: str, work: Callable[[], Any], ordered: bool = False) -> Any:
        """work() with the communicator taken for this thread (tbcoll.comm.ownership); ordered:
        after the queued non-blocking calls."""
        gate = self._gate
        if (slot := gate.enter(KIND_CODES[what], None, None, -1, -1, -1, 0)) < 0:
            raise busy(self.rank, what, gate)
        try:
            if ordered and self._progress is not None:
                return self._progress.run(work)
            return work()
        except BaseException as e:
            if ordered:  # (split, empty: collective; isend and irecv only start)
                self._interrupted(what, e)
            raise
        finally:
            gate.leave(slot)

    def _progress_thread(self, what: str) -> Progress:
        if self._closed:
            raise TbcollError(f"{what} on a closed communicator")
        if self._progress is None:  # from now on blocking calls wait for the queued ones
            self._progress = Progress(f"tbcoll-progress-{self.backend}-{self.rank}")
            # a dropped communicator's thread ends when it is collected (the thread holds
            # nothing of it between calls)
            self._stop_progress = weakref.finalize(self, self._progress.stop_soon)
            self._bind()  # (the routes' first steps run after the queue)
        return self._progress

    # --- communicators -------------------------------------------------------------------

    def split(self, color: int | None, key: int = 0) -> Communicator | None:
        """Split into sub-communicators, one per color, ranked by (key, rank); collective.

        Ranks that pass color=None take part but get None back.
        """
        if color is not None and (not isinstance(color, (int, np.integer))
                                  or not 0 <= color < _INT64):
            raise ValueError(f"split color must be an int in 0..2**63-1 or None, got {color!r}")
        if not isinstance(key, (int, np.integer)):
            raise TypeError(f"split key must be an int, got {key!r}")
        if not -_INT64 <= key < _INT64:
            raise ValueError(f"split key must be an int in -2**63..2**63-1, got {key!r}")
        if self._closed:
            raise TbcollError("split on a closed communicator")
        return self._claimed("split", partial(self._split, color, key), ordered=True)

    def _split(self, color: int | None, key: int) -> Communicator | None:
        mine = np.array([-1 if color is None else color, key, self._group.context_hint(),
                         self.node_rank], np.int64)
        table = self._run(ALL_GATHER.call(self._ctx, mine, None, None)).reshape(self.size, 4)
        members = [] if color is None else sorted(
            (int(table[r, 1]), r) for r in range(self.size) if table[r, 0] == color)
        ranks = [r for _, r in members]
        # the transport gets the color's index among the colors named (MPI takes C ints)
        colors = sorted({int(c) for c in table[:, 0] if c >= 0})
        index = None if color is None else colors.index(color)
        try:
            sub = self._group.split(index, key, ranks, int(table[:, 2].max()))
        except CommError as e:
            raise self._named(e, "split") from e
        self._lineage.splits += 1
        if sub is None:
            return None
        local_rank = [r for r in ranks if table[r, 3] == self.node_rank].index(self.rank)
        lineage = self._lineage.child(f"split{self._lineage.splits}.{index}")
        return Communicator(sub, self.backend, local_rank, self.node_rank,
                            tuple(self._world_ranks[r] for r in ranks), lineage)

    # --- surviving failures (tbcoll.comm.survival; ULFM's MPIX_Comm_revoke/agree/shrink) ---

    def revoke(self) -> None:
        """Make every pending and later call on this communicator raise CommRevokedError, here
        and on every other rank (within a second): none is left waiting in a collective that
        can no longer complete. agree and shrink still work on it."""
        notice = f"{self._who()} revoked it"
        self._gate.revoke(CommRevokedError, f"rank {self.rank}: {revoked(notice)}")
        self._group.revoke(notice)

    def agree(self, flag: bool) -> bool:
        """The AND of flag over the ranks that have not failed, the same on each of them even
        if more ranks fail meanwhile (tbrun --keep-going); collective, also on a revoked
        communicator."""
        survival.refused(self.backend, "agree")
        return survival.agree(self._lineage, self._world_ranks, self._world_ranks[self.rank],
                              bool(flag), survival.failures().info.timeout)

    def shrink(self) -> Communicator:
        """A new communicator of the ranks that have not failed (tbrun --keep-going), ranked in
        this one's order, agreed by all of them; collective, also on a revoked communicator.
        This one stays as it is: close it."""
        survival.refused(self.backend, "shrink")
        group, local_rank, node_rank, world, lineage = survival.shrink(
            self._lineage, self.backend, self._world_ranks, self._world_ranks[self.rank],
            survival.failures().info.timeout)
        return Communicator(group, self.backend, local_rank, node_rank, world, lineage)

    def empty(self, shape: int | tuple[int, ...], dtype: Any = np.float64) -> np.ndarray:
        """A new, uninitialised array that collectives read and write in place; collective
        (as MPI_Win_allocate_shared): every rank calls it with the same shape and dtype.

        On shm it lives in shared memory that the other ranks map: an all_gather of an x, or
        into an out=, or a broadcast in place (out= its x), of more than 1 MiB that lies, on
        every rank, in the same allocation copies each block once, straight between the
        ranks' buffers, on any OS (else Linux's cross-memory attach, else two copies through
        the segment); an all_reduce of more than 1 MiB whose x and out are such arrays
        reduces straight from the peers' x, one copy fewer than through the segment. Its
        memory (and this rank's mappings of the others') goes when it and every view of it
        are collected. Other transports, and a world of one, return np.empty."""
        if self._closed:
            raise TbcollError("empty on a closed communicator")
        return self._claimed("empty", partial(self._empty, shape, dtype), ordered=True)

    def _empty(self, shape: Any, dtype: Any) -> np.ndarray:
        words, dims, kind, problem = allocation.request(shape, dtype)
        if self.size > 1:  # every rank learns every rank's request before any raises
            table = self._run(ALL_GATHER.call(self._ctx, words, None, None)).reshape(self.size, -1)
            if problem is None and (message := allocation.disagreement(table)):
                problem = ValueError(message)
        if problem is not None:
            raise problem
        nbytes = int(np.prod(dims)) * kind.itemsize
        if self._group.allocate is None or self.size == 1 or not nbytes:
            return np.empty(dims, kind)
        try:
            buffer = self._group.allocate(nbytes)
        except CommError as e:
            raise self._named(e, "empty") from e
        self._bind()  # (what the lane takes may have changed: tbcoll.shm.native)
        return buffer.view(kind).reshape(dims)

    def algorithms(self, collective: str) -> tuple[str, ...]:
        """The algorithms this communicator can run collective with."""
        return tuple(a for a in ALGORITHMS[collective]
                     if a != "native" or self._ctx.has_native(collective))

    def describe(self) -> str:
        """Who this rank is and which algorithm each collective uses at which size."""
        lines = [f"tbcoll communicator: rank {self.rank} of {self.size}, backend {self.backend}, "
                 f"local rank {self.local_rank}, node {self.node_rank}"]
        for collective in COLLECTIVES:
            if collective in self._overrides:
                rule = f"{self._overrides[collective]} (TBCOLL_ALGO)"
            else:
                rule = tuning.describe(self._group.tuning, collective)
            lines.append(f"  {collective}: {rule}")
        return "\n".join(lines + self._group.describe_links())

    def close(self) -> None:
        if self._gate.forked:  # a child of os.fork(): the connections are the parent's
            self._closed = True
            self._ctx.close()
        if not self._closed:
            if self._progress is not None:
                self._stop_progress.detach()
                self._progress.stop()  # what was started finishes first
            self._closed = True
            self._routes.close()
            self._ctx.close()  # every call goes to its choose, which refuses
            self._bind()
            self._release()

    def _interrupted(self, what: str, error: BaseException) -> None:
        """A call (what) raised error: where it is an interruption (see the module docstring),
        revoke the communicator here (the gate: every later call raises CommRevokedError at
        once) and on the peers (Group.revoke), once. The caller raises error again."""
        if isinstance(error, _OWN_ERRORS) or self._gate.revoked or self._closed:
            return
        notice = f"{self._who()} was interrupted in {what} ({type(error).__name__})"
        self._gate.revoke(CommRevokedError, f"rank {self.rank}: {revoked(notice)}")
        try:
            self._group.revoke(notice)
        except Exception:  # noqa: BLE001 (the user's error is the one to raise; peers time out)
            pass

    def _who(self) -> str:
        world = self._world_ranks[self.rank]
        return f"rank {self.rank}" + (f" (world rank {world})" if world != self.rank else "")

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Communicator rank {self.rank} of {self.size}, backend {self.backend}>"

    def _named(self, error: BaseException, what: str) -> BaseException:
        """error again, naming the operation and this rank. A failure caused by peers also
        tells tbrun which (in world ranks), so that it names them, not this rank. Another
        error comes back as it was, seen (_interrupted); a revocation revokes here too."""
        if not isinstance(error, CommError):
            self._interrupted(what, error)
            return error
        message = f"{what} on rank {self.rank}: {error}"
        on_failure(self, self._world_ranks[self.rank], message)
        if isinstance(error, (PeerError, CommRevokedError)) and \
                (failed := self._failed(error, what, message)) is not None:
            return failed
        if isinstance(error, CommRevokedError):
            self._gate.revoke(CommRevokedError, f"rank {self.rank}: {error}")
            return CommRevokedError(message)
        if not isinstance(error, PeerError):
            return CommError(message)
        peers = self._peers(error)
        report_peer_failure(message, peers)
        return type(error)(message, peers)

    def _peers(self, error: PeerError) -> tuple[int, ...]:
        """error's peers as the job's world ranks."""
        if getattr(self._group, "world_peers", False):  # (tbcoll.core.protocols.Group)
            base = self._lineage.world
            named = (p if base is None else base[p] for p in error.peers
                     if base is None or 0 <= p < len(base))
            return tuple(p for p in named if p in self._world_ranks)
        return tuple(self._world_ranks[p] for p in error.peers if 0 <= p < self.size)

    def _failed(self, error: CommError, what: str, message: str) -> RankFailedError | None:
        """Under tbrun --keep-going: where tbrun declares failed members of this communicator
        (the peers error lost, once it has; or, for a revocation, already), revoke it here and
        on every rank, and the RankFailedError naming them; else None."""
        peers = self._peers(error) if isinstance(error, PeerError) else None
        lost, elsewhere = survival.lost(self._world_ranks, peers, error)
        if elsewhere:  # its peers wait on those, through another communicator: revoked
            text = f"{what} on rank {self.rank}: {survival.chain_text(peers or (), elsewhere)}"
            survival.revoke_everywhere(self._gate, self._group, CommRevokedError, text, text)
            return CommRevokedError(text)
        if not lost:
            return None
        report_peer_failure(message, lost)
        text = f"{what} on rank {self.rank}: {survival.declared_text(lost)}"
        survival.revoke_everywhere(self._gate, self._group, RankFailedError, (text, lost),
                                   f"{self._who()} found world ranks {list(lost)} failed")
        return RankFailedError(text, lost)


def _weakly(method: Callable) -> Callable:
    """method, holding its object weakly (a route's general path: the route lives in it)."""
    ref = WeakMethod(method)

    def general(*args: Any) -> Any:
        return ref()(*args)

    return general


def _add_method(name: str) -> None:
    """comm.<name>(...) for a registered collective: a method of the class, not a __getattr__
    (a class with one loses CPython's specialised attribute loads on every instance: the shm
    8 B all_reduce took 0.36 us, not 0.29), unless the class has that name already."""
    if name not in BUILT_IN and not hasattr(Communicator, name):
        setattr(Communicator, name, partialmethod(Communicator.collective, name))


for _name in DESCRIPTORS:
    _add_method(_name)
ON_REGISTER.append(_add_method)
