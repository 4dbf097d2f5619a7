"""Revocation (tbcoll.CommRevokedError) in the stream engine.

A rank whose call on a communicator was interrupted (a KeyboardInterrupt, a signal handler's
exception) sends each peer a notice (context REVOKED, tag the communicator's first context,
payload the line that names the rank and the call) after whatever it had queued for that
peer, so that the streams stay in step; a thread of its own finishes what cannot go at once.
A rank that reads a notice fails every wait on that communicator's contexts from then on, its
own included.
"""

from __future__ import annotations

import threading
from array import array
from collections.abc import Callable, Iterable

from tbcoll.core.errors import CommError, CommRevokedError, revoked
from tbcoll.core.framing import NOTICE_BYTES, REVOKED
from tbcoll.transports.stream.peers import Recv, Send


class Revocation:
    """The revocation part of StreamTransport (mixed into it): it calls the engine's _header,
    _queue, waitall, _move and _ready, and keeps the notices in its _revoked and each
    communicator's word (revocation) in its _revocation_words."""

    def revoke(self, context: int, members: Iterable[int], notice: str) -> None:
        """Revoke the communicator of contexts (context, context + 1) here and tell members
        (world ranks) with a notice each, queued after what this rank had queued for them:
        what cannot go at once goes from a thread of its own (see the module docstring).
        Called with the turns held."""
        self._revoke(context, notice)
        text = notice.encode()[:NOTICE_BYTES]
        header = self._header(REVOKED, context, len(text), 0, 0)
        notices = []
        for rank in members:
            peer = self._peers.get(rank)
            if rank != self.rank and peer is not None and not peer.lost:
                try:
                    notices.append(self._queue(peer, [memoryview(header), memoryview(text)]))
                except CommError:  # it is gone (a failed rank): the others are told still
                    pass
        if any(not notice.done for notice in notices):
            threading.Thread(target=self._deliver, args=(notices,), daemon=True,
                             name=f"tbcoll-revoke-{self.rank}").start()

    def _deliver(self, notices: list[Send]) -> None:
        """Move the engine until notices have gone (or TBCOLL_TIMEOUT has passed, or their
        peers are gone): the interrupted rank may make no call on this engine again, and a
        peer that waits for the rest of a message of ours, then the notice, would wait."""
        try:
            with self.turns:
                self.waitall(notices)
        except (CommError, OSError, ValueError):  # (gone, or closed meanwhile: nobody to tell)
            pass

    def notice(self, context: int) -> str | None:
        """The revocation notice of the communicator of context, reading what has come (as
        test does: where another thread polls, that thread moves it)."""
        if not self.turns.polling:
            try:
                self._move(self._ready(0.0))
            except (CommError, OSError, ValueError):  # a stream gone: its waits say so
                pass
        return self._revoked.get(context)

    def revocation(self, context: int) -> tuple[array, Callable[[], str]]:
        """The communicator of context's revocation word and its notice (Group.revocation):
        the word turns 1 as this engine reads a peer's notice, or revokes it here."""
        word = self._revocation_words.setdefault(context, array("Q", [0]))
        if context in self._revoked:
            word[0] = 1
        return word, lambda: self._revoked.get(context, "")

    def _revoke(self, context: int, notice: str) -> None:
        """Fail every wait on the communicator of contexts (context, context + 1), and set its
        word, which its gate loads at each call (a plain store: this process's memory, with
        the GIL held; the notice is in _revoked before it)."""
        self._revoked[context] = self._revoked[context + 1] = notice
        if (word := self._revocation_words.get(context)) is not None:
            word[0] = 1

    def _fail_revoked(self, pending: list[Send | Recv]) -> None:
        """Raise where one of pending is of a revoked communicator."""
        for request in pending:
            if (notice := self._revoked.get(request.context)) is not None:
                raise CommRevokedError(revoked(notice))

