"""What a transport offers the layers above it.

A transport gives each communicator a Group: two point-to-point endpoints with separate
matching spaces (`p2p` for the user's send/recv, `coll` for the algorithms, so that a user's
message can never be taken for a collective's) and, optionally, native collectives.
Ranks in a Group are the communicator's ranks, 0 .. size-1.

Buffers are 1-D C-contiguous numpy arrays. Messages between two ranks with the same tag are
matched in the order they were sent (non-overtaking, as in MPI).

What a new transport provides, and nothing more (docs/extending.md):
1. a module with `open_world(info, prefix) -> (Group, local rank, node index)`, known by name
   (tbcoll/core/backends.py: built in, an entry point of the group tbcoll.transports,
   TBCOLL_TRANSPORT_MODULE, or tbcoll.register_transport);
2. a Group (below): two P2P endpoints, on which every algorithm of tbcoll/algorithms runs;
   `begin_call`/`end_call`, through which ranks whose calls differ fail; `split`; `close`;
3. optionally its `tuning` table in tbcoll/collectives/tuning.py (which algorithm at which size
   and rank count, where it differs from the collectives' default rules);
4. optionally a Native: the collectives it does itself (`offers`) and one-call paths for the
   latency-critical ones (`direct_*`, None where it has none), `takes_mlx` if it takes mlx
   arrays as they are;
5. errors as tbcoll.core.errors' CommError family: PeerLostError/PeerTimeoutError naming the peers,
   so that the Communicator can name the collective and tbrun the rank.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np


class P2P(Protocol):
    rank: int
    size: int
    # True where the ranks' calls are compared only where a message arrives (the stream
    # transports): the rooted algorithms' pure senders then wait for an acknowledgement
    # (tbcoll.algorithms.acks)
    acknowledge: bool

    def isend(self, buf: np.ndarray, peer: int, tag: int) -> object:
        """Start sending buf to peer; buf must not change until the request completes."""

    def irecv(self, buf: np.ndarray, peer: int, tag: int) -> object:
        """Start receiving exactly buf.nbytes bytes from peer into buf."""

    def send(self, buf: np.ndarray, peer: int, tag: int) -> None:
        """isend and waitall in one (a transport may do it in one step)."""

    def recv(self, buf: np.ndarray, peer: int, tag: int) -> None:
        """irecv and waitall in one."""

    def waitall(self, requests: Sequence[object]) -> None:
        """Block until every request has completed; CommError on a lost peer or timeout."""

    def test(self, requests: Sequence[object]) -> bool:
        """Move what can move now, without waiting; True once every request has completed
        (CommError as for waitall)."""


class Native(Protocol):
    """Collectives a transport implements itself (e.g. MPI_Allreduce): those named in
    `offers`, of tbcoll.algorithms.COLLECTIVES; the others run tbcoll's algorithms."""

    offers: frozenset[str]
    # One-call paths the Communicator takes with algorithm "native", each called as
    # path(x, op, root, out) (op None and root -1 where the collective has none; out checked,
    # root in range) -> the result, or None where x does not qualify (the general path then
    # runs); None where the transport has none. x is a numpy array, or an mlx array where
    # takes_mlx (the mlx transport: no copies either way).
    direct_all_reduce: Callable[[Any, str, int, Any], Any] | None
    direct_all_gather: Callable[[Any, None, int, Any], Any] | None
    direct_broadcast: Callable[[Any, None, int, Any], Any] | None
    direct_reduce_scatter: Callable[[Any, str, int, Any], Any] | None
    takes_mlx: bool
    # Optionally `lane`: a C object whose lane_capsule() offers the lane interface
    # (tbcoll/include/lane.h: a versioned struct of the transport's work, move, ready, limits
    # and beyond, in a "tbcoll.lane.v1" capsule), as tbcoll/transports/shm/lane.c,
    # tbcoll/transports/tcp/tcp_lane.c and rdma's MeshLane (tbcoll/transports/rdma/mesh_lane.c)
    # do. The whole call around that work is compiled once, in the gate's extension: the
    # Communicator makes a tbcoll.core._gate.LaneCall of it (tbcoll.core.gate.lane_call; a
    # struct of another version or size is refused), which runs a call in one C call (the
    # checks and the admission, tbcoll/core/admits.h; the communicator's call gate; the
    # engine's lock; the work) or returns None having touched nothing, after which the
    # general path runs the call. LaneCall's:
    # - bind(gate, codes, names, enabled, max_tag, comm_error, namer) -> the mask it took.
    #   gate: the communicator's tbcoll.core._gate.Gate, driven from C through
    #   tbcoll/include/gate.h (enter, done, leave: its lock, count and flight recorder);
    #   codes: the gate's codes of the four kinds (tbcoll.core.names.LANE_KINDS' order), send,
    #   recv and the native algorithm; names: the kinds' names, for errors; enabled: bit k for
    #   kind k, the next bit for send and recv (tags up to max_tag); a comm_error raised in a
    #   call is raised again as namer()(error, name), or as it was where the namer gives it
    #   back (the Communicator passes BaseException: it names its CommErrors and sees an
    #   interrupted call, which revokes it). It returns the bits it takes (enabled, less the
    #   lane's kinds): the Communicator routes those calls to it (tbcoll.comm.routes), no
    #   others.
    # - limit(kind[, nbytes]): with nbytes, the largest x the tuning table takes native for
    #   that kind (the lane may take less, its own limits, never more); returns the largest x
    #   a bound call of that kind takes now (None: every size), which the Communicator's
    #   route reads when it is made, so that no larger call enters the lane to be refused
    #   (tbcoll.comm.routes).
    # - all_reduce(x, op, out), all_gather(x, out), reduce_scatter(x, op, out),
    #   broadcast(x, root, out), send(x, dst, tag), recv(out, src, tag), for the bits taken;
    #   admits(kind, x, arg, out): whether such a bound call may take the lane (the same
    #   predicate the call asks); direct(kind, x, op, root, out): unbound, for direct_*.
    # Whatever the engine must do first or finish (a message held for a peer, a peer late past
    # C's wait) C leaves to the transport's Python, as the stream engine's words say
    # (tbcoll.transports.stream.words: C tests them with one load each).

    def all_reduce(self, send: np.ndarray, recv: np.ndarray, op: str) -> None: ...

    def all_gather(self, send: np.ndarray, recv: np.ndarray) -> None: ...

    def reduce_scatter(self, send: np.ndarray, recv: np.ndarray, op: str) -> None: ...

    def broadcast(self, buf: np.ndarray, root: int) -> None: ...

    def barrier(self) -> None: ...

    # where offered; counts in elements per rank, the root's buffer None elsewhere
    def all_to_all(self, send: np.ndarray, recv: np.ndarray, send_counts: np.ndarray,
                   recv_counts: np.ndarray) -> None: ...

    def gather(self, send: np.ndarray, recv: np.ndarray | None, root: int) -> None: ...

    def scatter(self, send: np.ndarray | None, recv: np.ndarray, root: int) -> None: ...

    def reduce(self, send: np.ndarray, recv: np.ndarray | None, op: str, root: int) -> None: ...


class Group(Protocol):
    tuning: str  # the table of tbcoll.collectives.tuning its algorithm choices follow
    rank: int
    size: int
    local_rank: int
    p2p: P2P
    coll: P2P
    native: Native | None
    # comm.empty's buffers: allocate(nbytes) -> this rank's buffer of a new allocation, a 1-D
    # uint8 array that the collectives may read and write in place (collective; the Group
    # keeps what it maps until the array is collected or the Group closes); None where the
    # transport has none (comm.empty then returns np.empty)
    allocate: Callable[[int], np.ndarray] | None
    # revocation: (word, why), the flag a peer's notice sets, lent to the communicator's call
    # gate so that every call checks it with one load at enter (CommRevokedError at once, on
    # every rank, whatever the call): word is a buffer whose first 8 bytes (aligned) turn
    # nonzero once any rank has revoked this group (stored with release where another process
    # stores it: shm's segment), why() -> the notice's line. None: the transport raises
    # CommRevokedError from its waits only (mpi), or a revocation is local (its peers learn
    # nothing).
    revocation: tuple[Any, Callable[[], str]] | None
    # optional, False where absent: True where the peers of its PeerErrors are the job's world
    # ranks (the stream transports over sockets, whose ranks are the world's), not the
    # group's own (shm), so that the Communicator tells tbrun the right ranks
    world_peers: bool

    # A group that spans two transports (tbcoll.hierarchy: shm inside a host, tcp or rdma
    # between hosts) is a Group like any other, made of groups of each, each run by a
    # Communicator of its own: its p2p and coll route each peer to the group that holds it
    # (a request stays its endpoint's object, and a wait moves both while both have work);
    # its natives are calls of its levels' communicators; split splits each level. It lends
    # no revocation word yet (revocation None): one word that both the host's segment and the
    # network's notices set is the next step's.

    def begin_call(self, seq: int, signature: int) -> None:
        """This rank is about to run a collective: its number on this communicator (1, 2,
        ...) and its tbcoll.core.calls signature. The transport compares it with the other ranks'
        calls where it can, so that a difference fails the call (CommError naming both) rather
        than returning an answer computed with another rank's different call."""

    def end_call(self) -> None:
        """The call begun last has moved its data: raise CommError now if the ranks' calls
        differed (where the transport compares them beside the data, as mpi does)."""

    def revoke(self, notice: str) -> None:
        """This rank's call was interrupted (notice: the line naming the rank and the call):
        fail every wait on this group, here and, where the transport can tell them, on the
        other ranks, whose waits then raise CommRevokedError (within a second) rather than
        time out; returns at once, whatever the peers do."""

    def context_hint(self) -> int:
        """A number this rank offers towards naming a new sub-group (see split)."""

    def split(self, color: int | None, key: int, members: list[int], context: int) -> Group | None:
        """Make the sub-group of this group's ranks `members` (in new rank order), collectively.

        Every rank of this group calls it; color is the index of this rank's color among the
        colors named (small: MPI takes C ints), None for ranks that get no group (they get
        None); `context` is the maximum of all their context_hint() values.
        """

    def describe_links(self) -> list[str]:
        """Lines for Communicator.describe(): what carries each pair of ranks (may be none)."""

    def close(self) -> None: ...
