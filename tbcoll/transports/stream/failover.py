"""Failover (docs/failover.md): a stream whose channel fails carries on
over a new one, the sender replaying from its kept tail (tbcoll.transports.stream.replay)
what the peer had not received. A part of StreamTransport, as Pulls and Revocation are: it
uses the engine's peers, words and moves.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

from tbcoll.core.errors import NO_PATH_LEFT
from tbcoll.transports.stream.peers import Channel, Peer, Send
from tbcoll.transports.stream.words import RECEIVED_WORD, SENT_WORD


class Failover:
    """The engine's failover: a transport that can connect a pair again gives its peers a
    tail (Peer.tail) and implements _reconnect and _adopt."""

    repair_look = 0.002  # while a stream fails over, a wait looks this often for its channel

    def _reconnect(self, peer: Peer,
                   received: int) -> Callable[[], tuple[Channel, int] | None] | None:
        """Failover: close peer's failed channel and return the work that connects again
        over the next path, telling the peer `received` (this end's RECEIVED count): it
        returns the new channel and the peer's count, or None where no path is left. It runs
        in a thread of its own, touching nothing of the engine's, so that the engine serves
        its other streams meanwhile (two ranks each failing over a pair with the other's
        other peer would otherwise wait for each other). None: failover off."""
        return None

    def _adopt(self, peer: Peer, channel: Channel) -> None:
        """Failover: channel is peer's from now on (a subclass that watches its streams
        follows it; the old one is closed)."""
        peer.channel = channel

    def _took(self, peer: Peer, request: Send, header: bytes, payload: memoryview,
              written: int) -> None:
        """Another path (tcp's C) wrote the first `written` bytes of a message (header,
        payload), request the rest's: peer's tail keeps them, if it has one."""
        if peer.tail is not None and written:
            peer.tail.took(request, [memoryview(header), payload], written)

    def _link_failed(self, peer: Peer, reason: str, cause: OSError | str | None = None) -> bool:
        """peer's channel failed: True where it is to fail over (a tail kept; the next wait
        does it, _repair), else it is lost (reason). cause: the failover's reason where
        reason blames the peer (an end of stream, a reset: that it exited is known only once
        no path answers), an OSError for a failed send."""
        if isinstance(cause, OSError):
            cause = f"send failed: {cause.strerror or cause}"
        if peer.tail is None or peer.lost:
            self._lose(peer, reason)
            return False
        if peer.broken is None:
            peer.broken, peer.broken_at = cause or reason, time.monotonic()
            self._broken.add(peer)
        return True

    def _repair(self) -> None:
        """Start failing over each broken stream (drain it, then _reconnect's work in a
        thread), and finish each whose new channel has come (at every turn of a wait:
        nothing to do costs one test)."""
        if not self._broken:
            return
        for peer in sorted(self._broken, key=lambda p: p.rank):
            if peer.reconnecting is None:
                self._start_fail_over(peer)
        for peer in sorted(self._broken, key=lambda p: p.rank):
            if peer.reconnecting is not None and peer.reconnecting.done():
                self._broken.discard(peer)
                self._finish_fail_over(peer)

    def _start_fail_over(self, peer: Peer) -> None:
        self._pump_in(peer)  # drain: bytes its kernel acknowledged are the peer's count
        work = self._reconnect(peer, self.words[peer.words_at + RECEIVED_WORD])
        peer.reconnecting = future = Future()
        if work is None:
            future.set_result(None)
            return

        def run() -> None:
            try:
                future.set_result(work())
            except Exception as e:  # noqa: BLE001 - the engine's thread names it
                future.set_exception(e)

        threading.Thread(target=run, daemon=True, name=f"failover-{peer.rank}").start()

    def _finish_fail_over(self, peer: Peer) -> None:
        """Carry on over the new channel: send again what the peer has not received, from
        the kept tail; lose the stream where no path is left or the tail no longer holds
        those bytes (docs/failover.md)."""
        reason, at, future = peer.broken, peer.words_at, peer.reconnecting
        peer.broken = peer.reconnecting = None
        error = future.exception()
        found = None if error else future.result()
        if found is None:
            self._lose(peer, f"{reason}; {NO_PATH_LEFT}" + (f" ({error})" if error else ""))
            return
        channel, theirs = found
        sent, rest = self.words[at + SENT_WORD], peer.tail.since(theirs)
        if rest is None:
            channel.close()
            self._lose(peer, f"{reason}; cannot replay: rank {self.names[peer.rank]} received "
                       f"{theirs} bytes, this rank sent {sent} and kept "
                       f"[{peer.tail.start}, {peer.tail.end})")
            return
        peer.generation += 1
        self._adopt(peer, channel)
        self.words[at + SENT_WORD] = theirs
        peer.tail.rewind(theirs)
        if rest:
            peer.sendq.appendleft(Send(peer, [memoryview(rest)]))
        self._failed_over(peer, reason, sent - theirs, time.monotonic() - peer.broken_at)
        self._pump_out(peer)

    def _failed_over(self, peer: Peer, reason: str, replayed: int, seconds: float) -> None:
        """peer's stream goes on over its new channel, replayed bytes sent again, seconds
        after its failure was found: say so (a subclass names the paths, tells tbrun)."""

