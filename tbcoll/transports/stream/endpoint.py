"""A communicator's door into the stream engine: P2P within one context, its ranks mapped to
world ranks, and the call (seq, signature) its messages carry."""

from __future__ import annotations

from array import array
from collections.abc import Sequence

import numpy as np

from tbcoll.core.calls import NO_CALL
from tbcoll.transports.stream.engine import StreamTransport
from tbcoll.transports.stream.peers import Recv, Send


class StreamEndpoint:
    """P2P over the transport within one communicator: one context, ranks mapped to world."""

    # pure senders of a rooted collective wait for an acknowledgement (see tbcoll.algorithms):
    # a message's call is compared only where it arrives
    acknowledge = True

    def __init__(self, transport: StreamTransport, context: int, members: list[int]) -> None:
        self._transport, self.context, self._members = transport, context, members
        self._turns = transport.turns  # each method here is a door into the engine
        self.rank, self.size = members.index(transport.rank), len(members)
        # The collective call whose messages follow, [seq, signature] (NO_CALL's words for the
        # user's messages): numbered here by begin_call, or by the one-call paths, in Python
        # (begin_next_call) or in C (tcp's Lane, which is handed these words); the engine
        # compares arriving messages with it
        self.call_words = array("Q", NO_CALL)
        transport._calls[context] = self.call_words

    def begin_call(self, seq: int, signature: int) -> None:
        """The collective call whose messages follow: its number and signature."""
        words = self.call_words
        words[0], words[1] = seq, signature

    @property
    def call(self) -> tuple[int, int]:
        """The call begun last (seq, signature)."""
        words = self.call_words
        return words[0], words[1]

    def begin_next_call(self, signature: int) -> tuple[int, int]:
        """begin_call for the call after the last one begun: a one-call path's (comm.py
        numbers those calls without telling the group); returns it (as .call would). Inline:
        it is on the small all_reduce's path."""
        words = self.call_words
        words[0] += 1
        words[1] = signature
        return words[0], signature

    # (each door reads the call's words itself: the property costs a call more per message)
    def send(self, buf: np.ndarray, peer: int, tag: int) -> None:
        with self._turns:
            call = self.call_words
            self._transport.send(buf, self._members[peer], self.context, tag, (call[0], call[1]))

    def recv(self, buf: np.ndarray, peer: int, tag: int) -> None:
        with self._turns:
            call = self.call_words
            self._transport.recv(buf, self._members[peer], self.context, tag, (call[0], call[1]))

    def isend(self, buf: np.ndarray, peer: int, tag: int) -> Send:
        with self._turns:
            call = self.call_words
            return self._transport.isend(buf, self._members[peer], self.context, tag,
                                         (call[0], call[1]))

    def irecv(self, buf: np.ndarray, peer: int, tag: int) -> Recv:
        with self._turns:
            call = self.call_words
            return self._transport.irecv(buf, self._members[peer], self.context, tag,
                                         (call[0], call[1]))

    def waitall(self, requests: Sequence[Send | Recv]) -> None:
        with self._turns:
            self._transport.waitall(requests)

    def test(self, requests: Sequence[Send | Recv]) -> bool:
        with self._turns:
            return self._transport.test(requests)

