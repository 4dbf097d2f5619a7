"""Pulled messages, for a transport that can copy from another rank's memory (shm on Linux).

A large payload does not go through the stream. Its sender announces it (the header with the
context's ANNOUNCE bit, then a descriptor: the payload's address, size and a pull id); the
receiver matches the announcement as it would the message, copies the payload from the
sender's memory (_pull) into the receive (or an unexpected buffer: a rank pulls whatever it
meets at once, so that two ranks announcing to each other cannot deadlock) and answers PULLED
with that id. The send is done only then, so the sender's buffer stays untouched while it is
read. Where the copy is refused (a policy forbids it), the answer asks for the payload, which
follows through the stream (RESENT) into the receive already matched, and neither side
announces to the other again.

Written once, in C: the pull's steps (taking a pull id from the engine's words, the
announcement, the copy, the answer) are tbcoll/shm/moves.c's, which its own moves take and
which this engine calls through the transport's _announcement, _pull and _answer (shm's:
atomics.pull_announcement, pull_payload, pull_answer). What is Python's here is only the
engine's part: matching, unexpected buffers, waiting, the refusal's resend. Without a compiler
nothing pulls (Peer.pulls stays False): every message goes through the stream, the engine's
whole pure-Python path (shm then needs its C extension anyway; tcp never pulls).
"""

from __future__ import annotations

import numpy as np

from tbcoll.core.framing import DESCRIPTOR, RESENT, bytes_of
from tbcoll.transports.stream.peers import Announced, Peer, Recv, Send


class Pulls:
    """The pull protocol's part of StreamTransport (mixed into it): the engine's side of
    announcing, pulling and answering, over the transport's C steps (_announcement, _pull,
    _answer). It calls the engine's _match, _complete, _queue, _enqueue, _finish_message,
    waitall and _lose."""

    def _pull(self, peer: Peer, descriptor: bytes, view: memoryview) -> bool:
        """Copy into view the payload that descriptor (an announcement's) names, from peer's
        memory; False where a policy refuses it, or the transport cannot (the payload is then
        resent through the stream). A peer found gone is lost (_lose)."""
        return False

    def _announcement(self, peer: Peer, buf: np.ndarray, context: int, tag: int,
                      call: tuple[int, int]) -> tuple[bytes, int]:
        """The header and descriptor announcing buf to peer, and its pull id (taken from the
        engine's words, which C's moves take too)."""
        raise NotImplementedError

    def _answer(self, pull: int, refused: bool) -> bytes:
        """The answer to announcement `pull`: pulled, or refused."""
        raise NotImplementedError

    def _announce(self, peer: Peer, buf: np.ndarray, context: int, tag: int,
                  call: tuple[int, int]) -> Send:
        """A send of buf by pull, its announcement still to write (its views)."""
        announcement, pull = self._announcement(peer, buf, context, tag, call)
        request = Send(peer, [memoryview(announcement)], buf)
        peer.announced[pull] = request
        return request

    def _finish_announced(self, peer: Peer, view: memoryview, context: int, tag: int,
                          call: tuple[int, int], descriptor: bytes, arrived: int) -> None:
        """Receive into view the message whose announcement (header, and the first `arrived`
        bytes of its descriptor) a subclass's own path took."""
        request = Recv(peer, view, call, context)
        peer.posted[context, tag].append(request)
        owner = Announced(context, tag, call)
        owner.descriptor[:arrived] = descriptor[:arrived]
        peer.target, peer.target_owner = memoryview(owner.descriptor)[arrived:], owner
        if arrived == DESCRIPTOR.size:
            self._finish_message(peer)
        self.waitall([request])

    def _await_answer(self, peer: Peer, buf: np.ndarray, pull: int) -> None:
        """Wait for the answer to announcement `pull` of buf, which a subclass's own path
        wrote (a refusal resends buf through the stream, as for the engine's own)."""
        request = peer.announced[pull] = Send(peer, [], buf)
        self.waitall([request])

    def _take_announced(self, peer: Peer, announced: Announced) -> None:
        """Match an announced message and pull its payload, or ask for it where the pull is
        refused; answer the sender either way. (One that no receive awaits yet is pulled into
        an unexpected buffer at once: its sender does not wait for the receive.)"""
        descriptor = bytes(announced.descriptor)
        _, nbytes, pull = DESCRIPTOR.unpack(descriptor)
        owner, view = self._match(peer, announced.context, announced.tag, nbytes, announced.call)
        pulled = self._pull(peer, descriptor, view)
        if peer.lost:
            return
        if pulled:
            self._complete(owner)
        else:
            peer.pulls = False
            peer.refused[pull] = owner, view
        self._queue(peer, [memoryview(self._answer(pull, not pulled))])

    def _answered(self, peer: Peer, pull: int, refused: bool) -> None:
        """The receiver of announcement `pull` has pulled it (the send is done), or was
        refused: the payload follows through the stream, and nothing more is announced."""
        request = peer.announced.pop(pull, None)
        if request is None:
            self._lose(peer, f"it answered announcement {pull}, which this rank never made")
            return
        payload, request.pulled = request.pulled, None
        if not refused:
            request.done = True
            return
        peer.pulls = False
        request.views = [memoryview(self._header(RESENT, pull, payload.nbytes, 0, 0)),
                         bytes_of(payload)]
        self._enqueue(peer, request)

