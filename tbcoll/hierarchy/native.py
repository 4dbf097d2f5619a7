"""The two-level collectives: the host's ranks through shared memory, one rank a host
across the network (or, on tcp, every rank of a host carrying its slice: the rails).

Each step is a call of a Communicator of one level, which checks the ranks' calls, takes its
transport's fast paths and names a failure; a step that fails revokes both levels, so that
no rank waits for a step that cannot come (the host's ranks in a broadcast from a leader
whose network step failed)."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

import numpy as np

from tbcoll.comm.communicator import Communicator
from tbcoll.core.errors import (
    CommError,
    CommRevokedError,
    PeerError,
    PeerLostError,
    PeerTimeoutError,
    revocation_notice,
)
from tbcoll.hierarchy.hosts import Hosts

# An all_reduce of at least this many bytes, on tcp with as many ranks on every host (and a
# length they divide), goes over the rails: a reduce_scatter inside the host, an all_reduce
# of each slice among rank k of every host, an all_gather inside the host; below it, or
# otherwise, through the leaders (docs/hosts.md). 3 namespace hosts x 2 ranks (RESULTS.md):
# rails/leaders 1.03-1.11x at 4-16 KiB, 0.97-1.03x at 32 KiB, 0.58-0.76x at 64 KiB-1 MiB,
# 0.81-1.05x at 4-16 MiB
RAILS_FROM = 64 << 10
_NAMED = re.compile(r"^[a-z_]+ on rank [0-9]+: ")  # how a Communicator names its call
# A failed step's revocation notice names the peers it lost, early (notices are cut short), so
# that the ranks it revokes fail naming them too: tbrun then names those peers, not a rank
# that was only revoked
_LOST = re.compile(r"\((PeerLostError|PeerTimeoutError) of world ranks ([0-9,]+)\)")
_PEER_ERRORS = {kind.__name__: kind for kind in (PeerLostError, PeerTimeoutError)}


def failure_notice(world_rank: int, error: BaseException) -> str:
    """The revocation notice of a step that raised error on world_rank (error's peers are
    world ranks: each level's communicator names them so)."""
    if isinstance(error, CommRevokedError) and (notice := revocation_notice(str(error))):
        return notice  # (passed on as it came: who revoked it)
    what = type(error).__name__
    if isinstance(error, PeerError) and error.peers and what in _PEER_ERRORS:
        what += " of world ranks " + ",".join(map(str, error.peers))
    text = _NAMED.sub("", str(error), count=1)
    return f"rank {world_rank} ({what}) failed a two-level step: {text}"


def _as_raised_here(error: CommError) -> CommError:
    """error less its step's naming; a revocation by a rank whose step lost peers becomes
    the same PeerError, naming them."""
    text = _NAMED.sub("", str(error), count=1)
    if isinstance(error, CommRevokedError) and (lost := _LOST.search(text)):
        peers = tuple(int(p) for p in lost.group(2).split(","))
        return _PEER_ERRORS[lost.group(1)](text, peers)
    return type(error)(text, error.peers) if isinstance(error, PeerError) else type(error)(text)


def _revoking(method: Callable) -> Callable:
    """A step that fails revokes both levels before it raises (a CommError as the step's
    communicator gave it, less its naming: the two-level call's names it). A ValueError or
    TypeError is an argument every rank's step refused alike, before any data moved: the
    group stays usable, as a one-level communicator does."""
    @functools.wraps(method)
    def run(self: TwoLevelNative, *args: Any) -> None:
        try:
            method(self, *args)
        except (ValueError, TypeError):
            raise
        except CommError as error:
            self._failed(error)
            raise _as_raised_here(error) from error
        except BaseException as error:
            self._failed(error)
            raise
    return run


class TwoLevelNative:
    """A two-level group's native collectives, over its levels' communicators."""

    offers = frozenset(("all_reduce", "all_gather", "reduce_scatter", "broadcast", "barrier"))
    direct_all_gather = direct_broadcast = direct_reduce_scatter = None
    takes_mlx = False

    def __init__(self, hosts: Hosts, local: Communicator, leaders: Communicator | None,
                 rail: Communicator | None, failed: Callable[[BaseException], None]) -> None:
        """local: this host's ranks; leaders: one rank a host (None where this rank leads
        none); rail: rank k of every host, where the rails are taken (None: never);
        failed(error): revoke both levels."""
        self._hosts, self._local, self._leaders, self._rail = hosts, local, leaders, rail
        self._failed = failed
        self._identity = hosts.host_major == tuple(range(len(hosts.nodes)))
        self._one_host = len(hosts.by_host) == 1  # (a sub-group): the host's step is all
        self._leads = hosts.local_rank == 0

    def direct_all_reduce(self, x: np.ndarray, op: str, root: int,
                          out: np.ndarray | None) -> np.ndarray | None:
        """The route's one-call path (tbcoll.comm.routes): every step checks its own call, so
        the two-level call need not check it first; None where out is not one block."""
        result = np.empty(x.shape, x.dtype) if out is None else out
        if not result.flags.c_contiguous:
            return None
        self.all_reduce(x, result, op)
        return result

    @_revoking
    def all_reduce(self, send: np.ndarray | None, recv: np.ndarray, op: str) -> None:
        """send and recv of any one shape (recv C-contiguous); send None: in place. (The
        steps' arguments go by position: this is the latency-critical call.)"""
        send = recv if send is None else send
        if self._rail is not None and recv.nbytes >= RAILS_FROM \
                and recv.size % self._local.size == 0:
            mine = self._local.reduce_scatter(send.reshape(-1), op)
            self._rail.all_reduce(mine, op, None, mine)
            self._local.all_gather(mine, None, recv.reshape(-1))
            return
        self._local.all_reduce(send, op, None, recv)
        if not self._one_host:
            if self._leaders is not None:
                self._leaders.all_reduce(recv, op, None, recv)
            self._local.broadcast(recv, 0, None, recv)

    @_revoking
    def all_gather(self, send: np.ndarray, recv: np.ndarray) -> None:
        """Gathered inside the host, then among the leaders host by host (a host's block is
        its ranks' blocks, in rank order), then given to the host's ranks; put in rank order
        where the hosts' ranks are not consecutive."""
        if self._one_host:
            self._local.all_gather(send, out=recv)
            return
        whole = recv if self._identity else np.empty_like(recv)
        block = send.size
        here = self._local.size * block
        if self._leads:
            start = self._hosts.host_start * block
            host_block = whole[start:start + here]
            self._local.all_gather(send, out=host_block)
            if self._hosts.even:
                self._leaders.all_gather(host_block, out=whole)
            else:
                self._leaders.all_gather(host_block, out=whole,
                                         counts=[n * block for n in self._hosts.host_sizes])
        else:
            self._local.all_gather(send, out=np.empty(here, send.dtype))
        self._local.broadcast(whole, root=0, out=whole)
        if not self._identity:
            blocks = whole.reshape(len(self._hosts.nodes), block)
            recv.reshape(-1, block)[list(self._hosts.host_major)] = blocks

    def reduce_scatter(self, send: np.ndarray, recv: np.ndarray, op: str) -> None:
        """An all_reduce of the whole, of which this rank keeps its block."""
        whole = np.array(send, copy=True)
        self.all_reduce(None, whole, op)
        block = recv.size
        recv[:] = whole[self._hosts.rank * block:(self._hosts.rank + 1) * block]

    @_revoking
    def broadcast(self, buf: np.ndarray, root: int) -> None:
        """To the root's leader inside its host, among the leaders, then inside each host."""
        hosts = self._hosts
        on_roots_host = hosts.nodes[root] == hosts.node
        if on_roots_host and hosts.local_index(root) != 0:
            self._local.broadcast(buf, root=hosts.local_index(root), out=buf)
        if self._leaders is not None:
            self._leaders.broadcast(buf, root=hosts.host_of_leader(root), out=buf)
        if not on_roots_host or hosts.local_index(root) == 0:
            self._local.broadcast(buf, root=0, out=buf)

    @_revoking
    def barrier(self) -> None:
        self._local.barrier()
        if self._leaders is not None:
            self._leaders.barrier()
        self._local.barrier()
