"""The Communicator's point-to-point calls: send, recv, isend and irecv.

A blocking send or recv takes its route's first step (tbcoll.comm.routes: a C lane's move, where
one is bound), else the group's p2p endpoint under the call gate, after the queued non-blocking
calls; isend and irecv start on the progress thread (tbcoll.comm.requests). Arguments that need no
conversion and no check (_plain) skip the full checks, which run otherwise and say what is
wrong: these calls are on the small-message path.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from tbcoll.collectives.base import KNOWN_DTYPES, check_rank, flat, output
from tbcoll.comm.ownership import busy
from tbcoll.comm.requests import P2PRequest, Request
from tbcoll.core.arrays import contiguous_flat, is_mlx, to_numpy
from tbcoll.core.errors import CommError, TbcollError
from tbcoll.core.names import KIND_CODES

MAX_TAG = 32767  # the largest tag every MPI must support
_SEND, _RECV = KIND_CODES["send"], KIND_CODES["recv"]


class PointToPoint:
    """The point-to-point part of tbcoll.comm.communicator.Communicator (mixed into it). It uses the
    Communicator's group, gate, progress thread, routes' first steps (_first_send,
    _first_recv), _claimed, _progress_thread, _named and _interrupted."""

    def send(self, x: Any, dst: int, tag: int = 0) -> None:
        """Send x to rank dst; returns once x may be reused."""
        if (first := self._first_send) is not None and first(x, dst, tag) is not None:
            return
        if type(x) is np.ndarray and x.flags.c_contiguous and self._plain(x, dst, tag):
            buf = flat(x)
        else:
            array, _ = to_numpy(x)
            dst, tag = self._check_peer(dst, "dst", tag)
            buf = flat(array) if array.flags.c_contiguous else contiguous_flat(array)
        self._move("send", self._group.p2p.send, buf, dst, tag)

    def recv(self, out_or_like: Any, src: int, tag: int = 0) -> Any:
        """Receive from rank src into a numpy array (filled in place and returned), or, given
        an mlx array, into a new mlx array of its shape and dtype."""
        if (first := self._first_recv) is not None and (
                result := first(out_or_like, src, tag)) is not None:
            return result
        if (type(out_or_like) is np.ndarray and out_or_like.flags.carray
                and self._plain(out_or_like, src, tag)):
            self._move("recv", self._group.p2p.recv, flat(out_or_like), src, tag)
            return out_or_like
        target, restore = self._receive_into(out_or_like, src, tag)
        src, tag = int(src), int(tag)  # (checked there: a numpy int as a plain one below)
        self._move("recv", self._group.p2p.recv, flat(target), src, tag)
        return restore(target)

    def _plain(self, x: np.ndarray, peer: Any, tag: Any) -> bool:
        """send's and recv's arguments need no conversion and no check says more of them (a
        known dtype, another rank of this open communicator, a tag in range): ~0.5 us of a
        small message's ~2 us over shm. Else the full checks run, and say what is wrong."""
        return (id(x.dtype) in KNOWN_DTYPES and type(peer) is int and type(tag) is int
                and 0 <= tag <= MAX_TAG and 0 <= peer < self.size and peer != self.rank
                and not self._closed)

    def isend(self, x: Any, dst: int, tag: int = 0) -> Request:
        """send without waiting; wait() returns None once x may be reused."""
        array, _ = to_numpy(x)
        dst, tag = self._check_peer(dst, "dst", tag)
        buf = contiguous_flat(array)
        return self._claimed("isend", lambda: self._start(
            f"send to rank {dst}", lambda p2p: p2p.isend(buf, dst, tag), lambda: None))

    def irecv(self, out_or_like: Any, src: int, tag: int = 0) -> Request:
        """recv without waiting; wait() returns what recv would (out filled, or a new mlx
        array)."""
        target, restore = self._receive_into(out_or_like, src, tag)
        src, tag = int(src), int(tag)
        return self._claimed("irecv", lambda: self._start(
            f"recv from rank {src}", lambda p2p: p2p.irecv(flat(target), src, tag),
            lambda: restore(target)))

    def _move(self, what: str, move: Callable, buf: np.ndarray, peer: int, tag: int) -> None:
        """A blocking send or recv: this thread's, after the queued non-blocking calls (no
        partial or context manager here: ~1 us of an 8 B message's 2)."""
        gate = self._gate
        if (slot := gate.enter_move(_SEND if what == "send" else _RECV, buf.dtype, peer, tag,
                                    buf.nbytes)) < 0:
            raise busy(self.rank, what, gate)
        try:
            if self._progress is not None:
                self._progress.run(partial(move, buf, peer, tag))
            else:
                move(buf, peer, tag)
        except CommError as e:
            raise self._named(e, f"{what} {'to' if what == 'send' else 'from'} rank {peer}") from e
        except BaseException as e:
            self._interrupted(f"{what} {'to' if what == 'send' else 'from'} rank {peer}", e)
            raise
        finally:
            gate.leave(slot)

    def _start(self, what: str, start: Callable[[Any], Any], finish: Callable[[], Any]
               ) -> Request:
        progress = self._progress_thread(what)
        name = partial(self._named_error, what)
        return progress.start(P2PRequest(what, progress, self._group.p2p, finish, name), start)

    def _named_error(self, what: str, error: Exception) -> Exception:
        """An isend's or irecv's error, named; an interruption of its wait (an exception of a
        signal handler's: the transfer is given up, still posted) revokes (_named)."""
        return self._named(error, what)

    def _receive_into(self, out_or_like: Any, src: int,
                      tag: int) -> tuple[np.ndarray, Callable[[np.ndarray], Any]]:
        """recv's checked arguments: the array to fill, and what turns it into the result."""
        template, restore = to_numpy(out_or_like)
        self._check_peer(src, "src", tag)
        if is_mlx(out_or_like):
            return np.empty(template.shape, template.dtype), restore
        return output(None, template, template.shape, template.dtype), restore

    def _check_peer(self, peer: int, what: str, tag: int) -> tuple[int, int]:
        """peer and tag checked, as plain ints (the transports' C calls take no numpy int)."""
        if isinstance(tag, bool) or not isinstance(tag, (int, np.integer)) or not (
                0 <= tag <= MAX_TAG):
            raise ValueError(f"tag={tag!r} must be an int in 0..{MAX_TAG}")
        check_rank(peer, self.size, what)
        if self._closed:
            raise TbcollError(f"{'send to' if what == 'dst' else 'recv from'} rank {peer} on a "
                              "closed communicator")
        if peer == self.rank:
            raise ValueError(f"{what}={peer} is this rank; send/recv need another rank")
        return int(peer), int(tag)
