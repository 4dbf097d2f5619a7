"""Surviving a lost rank: ULFM's revoke, agree and shrink over tbrun's failed set.

Under `tbrun --keep-going` tbrun is the one failure authority (tbcoll.job.failures): it
declares a rank failed once its process ended, or once it killed it frozen, and publishes the
failed set in the store. A rank never decides alone that a peer failed: a PeerError from a
transport (a peer lost, or silent past TBCOLL_TIMEOUT: then this rank asks tbrun to look) waits
until tbrun has declared those peers (DECLARED_WITHIN), then revokes the communicator on every
rank and raises RankFailedError naming the failed ranks (Failures.failed); a revocation that
reaches a rank from a peer becomes the same error. agree and shrink meet in the store: each
survivor posts, waits until every member has posted or is in the failed set, and the first
answer proposed (Store.first) is the one every survivor takes, so that all get the same even
when more ranks fail meanwhile. shrink's survivors then open a new group among themselves, as
init() opened the world (the opener init() lends), and agree that every one of them did.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from tbcoll.core.errors import NO_PATH_LEFT, PeerTimeoutError, TbcollError
from tbcoll.core.protocols import Group
from tbcoll.job.env import LaunchInfo, among, keep_going, launch_info
from tbcoll.job.failures import (
    FAILED,
    NO_PATH,
    SUSPECT,
    format_ranks,
    format_suspect,
    parse_failed,
    parse_ranks,
)
from tbcoll.job.rendezvous import Store

# seconds a rank waits for tbrun to declare the peers it lost (tbrun sees a death at once, and
# looks at a frozen rank within about a second)
DECLARED_WITHIN = 10.0
_POLL = 0.01  # seconds between looks at the store while members have not posted
# backends whose groups cannot be rebuilt over survivors, and why
REFUSED = {
    "mpi": "the MPI from PyPI (MPICH) has no ULFM, and MPI ends the job when a rank dies",
    "mlx": "MLX cannot abort a collective: its peers of a lost rank wait in it for good",
}

# opener(backend, info, prefix) -> (group, local rank, node): how init() opened the world
Opener = Callable[[str, LaunchInfo, str], tuple[Group, int, int]]


class Lineage:
    """A communicator's name in the store (the same on its every rank: the world's prefix,
    then the split or shrink that made it), the opener its shrink uses, and the job's world
    ranks of its transport's world (None: the job's own; a shrunk world's: its survivors),
    which its transport's world_peers name. The counts of its collective calls of these
    kinds name their keys."""

    __slots__ = ("key", "opener", "world", "splits", "agreements", "shrinks")

    def __init__(self, key: str, opener: Opener | None,
                 world: tuple[int, ...] | None = None) -> None:
        self.key, self.opener, self.world = key, opener, world
        self.splits = self.agreements = self.shrinks = 0

    def child(self, what: str, world: tuple[int, ...] | None = None) -> Lineage:
        return Lineage(f"{self.key}/{what}", self.opener, world or self.world)


class Failures:
    """This process's view of tbrun's failed set, through a store connection of its own."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._store: Store | None = None
        self.info = launch_info()

    @property
    def store(self) -> Store:
        with self._lock:
            if self._store is None:
                if self.info is None:
                    raise TbcollError("surviving failures needs a job started by tbrun "
                                      "--keep-going")
                self._store = Store.from_launch(self.info)
            return self._store

    def failed(self) -> frozenset[int]:
        """The world ranks tbrun has declared failed so far."""
        return parse_failed(self.store.peek(FAILED))[1]

    def declared(self, peers: Sequence[int], frozen: bool, members: Sequence[int],
                 why: str = "", before: frozenset[int] = frozenset()) -> frozenset[int] | None:
        """The failed set once it holds every one of peers (world ranks), or any of members
        (world ranks: a peer that waits on a frozen rank answers tbrun and is not declared,
        the frozen one is), or (frozen) any rank it did not hold before (a chain through
        another communicator: a peer waits on a frozen rank of the parent), waiting at most
        DECLARED_WITHIN; None if tbrun declares none (a peer that ended well, a live one).
        frozen: they did not answer in time, or (why: NO_PATH) no path to them is left; tbrun
        is asked to look at them first. before: the failed set when they failed to come."""
        if frozen and self.info is not None:
            self.store.set(SUSPECT.format(self.info.rank), format_suspect(peers, why))
        deadline = time.monotonic() + DECLARED_WITHIN
        while not ((failed := self.failed()) >= set(peers) and peers
                   or not failed.isdisjoint(members) or frozen and failed > before):
            if time.monotonic() > deadline:
                return None
            time.sleep(_POLL)
        return failed

    def posted(self, key: str, members: Sequence[int], timeout: float) -> dict[int, bytes]:
        """What each of members (world ranks) posted under key/<rank>, once each has posted or
        is in the failed set: those that posted. PeerTimeoutError naming the silent ones if
        tbrun does not declare them after timeout (they were asked about)."""
        store, waiting = self.store, list(members)
        values: dict[int, bytes] = {}
        deadline = time.monotonic() + timeout
        while waiting:
            for member in list(waiting):
                if (value := store.peek(f"{key}/{member}")) is not None:
                    values[member] = value
                    waiting.remove(member)
            if waiting and set(waiting) <= self.failed():
                # a post that came before its rank failed counts, and one later need not: the
                # first answer proposed is every survivor's
                values.update((m, v) for m in waiting if (v := store.peek(f"{key}/{m}")))
                break
            if waiting and time.monotonic() > deadline:
                silent = [m for m in waiting if m not in self.failed()]
                if self.declared(silent, True, silent) is None:
                    raise PeerTimeoutError(f"ranks {silent} did not come within {timeout:g} s",
                                           tuple(silent))
                deadline = time.monotonic() + timeout
            elif waiting:
                time.sleep(_POLL)
        return values


_failures: Failures | None = None


def failures() -> Failures:
    global _failures
    if _failures is None:
        _failures = Failures()
    return _failures


def lost(members: Sequence[int], peers: Sequence[int] | None, error: Exception
         ) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The members (world ranks) that tbrun has declared failed, once it has declared peers
    (those a PeerError, error, lost; None for a revocation, which follows a declaration); and,
    where none of them is but peers did not come while ranks outside failed (a chain), those
    ranks. Nothing outside tbrun --keep-going."""
    if not keep_going():
        return (), ()
    view = failures()
    split = NO_PATH_LEFT in str(error)  # a split: tbrun decides which end is failed
    frozen = isinstance(error, PeerTimeoutError) or split
    before = view.failed()
    if peers is None:
        failed = before
    else:
        failed = view.declared(peers, frozen, members, NO_PATH if split else "",
                               before) or frozenset()
    ours = tuple(r for r in members if r in failed)
    return ours, () if ours or not frozen else tuple(sorted(failed - before))


def chain_text(peers: Sequence[int], elsewhere: Sequence[int]) -> str:
    return (f"world ranks {list(peers)} did not come while world ranks {list(elsewhere)} "
            "failed (tbrun declared them); it is revoked: go on over the communicator it was "
            "split from")


def revoke_everywhere(gate: Any, group: Group, kind: type, args: object, notice: str) -> None:
    """Revoke a communicator here (its gate raises kind(*args) at every call) and on every
    rank (its group's notice)."""
    gate.revoke(kind, args)
    try:
        group.revoke(notice)
    except Exception:  # noqa: BLE001 (the peers learn it from the failed set too)
        pass


def declared_text(lost: Sequence[int]) -> str:
    return (f"world ranks {list(lost)} of this communicator failed (tbrun declared them); it is "
            "revoked: agree and shrink to go on over the survivors")


def refused(backend: str, what: str) -> None:
    """TbcollError where backend cannot survive a failure, or the job is not --keep-going."""
    if backend in REFUSED:
        raise TbcollError(f"comm.{what}() is not possible on the {backend} backend: "
                          f"{REFUSED[backend]}; use tcp, shm or rdma")
    if not keep_going():
        raise TbcollError(f"comm.{what}() needs a job started by tbrun --keep-going (without "
                          "it a rank's death ends the job)")


def agree(lineage: Lineage, members: Sequence[int], me: int, flag: bool,
          timeout: float) -> bool:
    """The AND of the flags of members (world ranks; me among them) that are not in the failed
    set, the same on each of them (see the module docstring)."""
    lineage.agreements += 1
    return _agree(f"survive/{lineage.key}/agree{lineage.agreements}", members, me, flag,
                  timeout)


def _agree(key: str, members: Sequence[int], me: int, flag: bool, timeout: float) -> bool:
    view = failures()
    view.store.set(f"{key}/{me}", b"1" if flag else b"0")
    posted = view.posted(key, members, timeout)
    proposal = b"1" if all(v == b"1" for v in posted.values()) else b"0"
    return view.store.first(f"{key}/and", proposal) == b"1"


def shrink(lineage: Lineage, backend: str, members: Sequence[int], me: int,
           timeout: float) -> tuple[Group, int, int, tuple[int, ...], Lineage]:
    """A group of the members (world ranks) not in the failed set, renumbered in members'
    order: (group, local rank, node, its world ranks, its lineage). Tried again where a rank
    fails while it is being made."""
    view = failures()
    lineage.shrinks += 1
    for attempt in range(len(members)):
        key = f"survive/{lineage.key}/shrink{lineage.shrinks}.{attempt}"
        view.store.set(f"{key}/arrived/{me}", b"1")
        view.posted(f"{key}/arrived", members, timeout)
        failed = view.failed()
        proposal = format_ranks(m for m in members if m not in failed)
        chosen = parse_ranks(view.store.first(f"{key}/survivors", proposal))
        survivors = [m for m in members if m in chosen]  # (members' order, not sorted)
        child = lineage.child(f"shrink{lineage.shrinks}.{attempt}", tuple(survivors))
        opening = _Opening(lineage.opener, (backend, among(view.info, survivors), child.key))
        kept = frozenset(survivors)
        opened = opening.result(lambda kept=kept: not view.failed().isdisjoint(kept))
        if _agree(f"{key}/opened", survivors, me, opened is not None, 2 * timeout):
            return (*opened, tuple(survivors), child)
        if opened is not None:
            opened[0].close()
    raise TbcollError(f"shrink: ranks kept failing while the survivors of {list(members)} met")


class _Opening(threading.Thread):
    """The survivors' new group, opened in a thread of its own so that a survivor's failure
    meanwhile is seen at once, not after the open's rendezvous times out (TBCOLL_TIMEOUT): the
    open is then left to end by itself, and what it opens closed."""

    def __init__(self, opener: Opener, args: tuple) -> None:
        super().__init__(name="tbcoll-shrink", daemon=True)
        self._opener, self._args = opener, args
        self._lock = threading.Lock()
        self._opened: tuple[Group, int, int] | None = None
        self._left = False
        self.start()

    def run(self) -> None:
        try:
            opened = self._opener(*self._args)
        except (TbcollError, OSError):  # a rank failed meanwhile: the agreement tells all
            return
        with self._lock:
            if self._left:
                opened[0].close()
            else:
                self._opened = opened

    def result(self, failed: Callable[[], bool]) -> tuple[Group, int, int] | None:
        """The group opened, or None where it could not be or failed() came true first."""
        while self.is_alive() and not failed():
            self.join(5 * _POLL)
        with self._lock:
            self._left = self.is_alive()
            return self._opened
