"""A fault-injecting channel, for failover's tests (docs/failover.md): a connected socket
whose sending direction is cut at byte N, as a pulled cable cuts it.

At the cut the channel has written exactly N bytes to the socket and shuts its writing
down, so the peer reads those N bytes and then the end of the stream (it drains what its
kernel acknowledged, as from a dead socket). The next `drop` bytes the engine writes are
taken and thrown away, as bytes in flight when a cable goes; they count as not acknowledged
(unacked), so the sender keeps them to replay. After that a write fails with EPIPE. Where the
two ends share a Link (one process: a test's threads), the far end's direction ends at the
same instant: this end reads what the far end wrote before the cut, then the end of the
stream, and the far end's later writes are taken and lost as well. Ends in two processes
(TBCOLL_FAULTS in a job) cannot: this end reads on until the far end, failing over, closes,
so the far end's bytes written after the cut still arrive, though possibly after this end
has drained and closed (a replay then finds them gone from a tail that kept only what was
unacknowledged, and the stream is lost, named). A FaultPlan gives each channel its cut,
seeded: the same seed, the same cuts.
"""

from __future__ import annotations

import errno
import random
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from tbcoll.transports.stream.outq import unacked_bytes


class Link:
    """What the two ends of one connection share where both live in one process (a test's
    threads): a cut then ends both directions at one instant, as a pulled cable does. Ends
    in two processes each have their own, and the far end's direction ends only when it
    reads the cut (see CutChannel)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.cut = False
        self.sent: dict[int, int] = {}  # each end's bytes written to its socket


class CutChannel:
    """A socket cut after `cut_at` bytes sent (None: never by this end), `drop` more taken
    and lost (docs above); `link` shared with the far end's channel where there is one."""

    def __init__(self, sock: socket.socket, cut_at: int | None, drop: int = 0,
                 link: Link | None = None, end: int = 0) -> None:
        self.socket, self.cut_at, self.drop = sock, cut_at, drop
        self.link, self.end = link or Link(), end
        self.sent, self.dropped, self.received = 0, 0, 0
        self.readable: int | None = None  # what this end may still read once cut: the far
        # end's bytes written before the cut (None: all the socket gives)

    def sendmsg(self, buffers: list[memoryview]) -> int:
        wanted = sum(len(b) for b in buffers)
        with self.link.lock:
            if self.link.cut:
                return self._lose(wanted)
            room = None if self.cut_at is None else self.cut_at - self.sent
            if room is None or room >= wanted:
                return self._write(buffers)
            written = self._write(_first(buffers, room)) if room else 0
            if written < room:
                return written  # the socket is full before the cut: the engine comes again
            self._cut()
        return written + self._lose(wanted - written, written)

    def _write(self, buffers: list[memoryview]) -> int:
        written = self.socket.sendmsg(buffers)
        self.sent += written
        self.link.sent[self.end] = self.sent
        return written

    def _cut(self) -> None:
        """Both directions end now: the far end reads what went, then the end of the
        stream; this end reads what the far end wrote before now (where it is known)."""
        self.socket.shutdown(socket.SHUT_WR)
        self.link.cut = True
        far = self.link.sent.get(1 - self.end)
        self.readable = None if far is None else far - self.received

    def _lose(self, wanted: int, written: int = 0) -> int:
        """Take up to what is left of drop of wanted bytes, thrown away; EPIPE once none is
        left (where nothing went in this call)."""
        taken = min(wanted, self.drop - self.dropped)
        self.dropped += taken
        if not taken and not written:
            raise BrokenPipeError(errno.EPIPE, "Broken pipe (a cut of the fault injector)")
        return taken

    def recv_into(self, view: memoryview) -> int:
        if self.readable is not None:
            if self.readable <= 0:
                return 0
            view = view[:self.readable]
        got = self.socket.recv_into(view)
        self.received += got
        if self.readable is not None:
            self.readable -= got
        return got

    def unacked(self) -> int:
        """The socket's unacknowledged bytes and those thrown away at the cut."""
        return unacked_bytes(self.socket) + self.dropped

    def __getattr__(self, name: str) -> Any:  # fileno, setblocking, close, getpeername...
        return getattr(self.socket, name)


def _first(buffers: list[memoryview], n: int) -> list[memoryview]:
    """The first n bytes of buffers, as views."""
    out = []
    for buffer in buffers:
        if n <= 0:
            break
        out.append(buffer[:n])
        n -= len(out[-1])
    return out


class FaultPlan:
    """Where each channel of a job is cut: the first `cuts` channels of each stream (its
    set-up's, then each one failover makes) at a seeded byte below `span`, with up to
    `drop` bytes lost; later ones are whole. split: a pair of ranks (lower first) whose
    failover finds no path left (reconnecting)."""

    def __init__(self, seed: int, cuts: int, span: int, drop: int = 4096,
                 split: tuple[int, int] | None = None) -> None:
        self.seed, self.cuts, self.span, self.drop = seed, cuts, span, drop
        self.split = split
        self._links: dict[tuple[int, int, int], Link] = {}  # ends of one process share one
        self._lock = threading.Lock()

    def wrap(self, rank: int, peer: int, generation: int, sock: socket.socket) -> CutChannel:
        """The channel from rank to peer, the generation-th of that stream (0: set-up's)."""
        with self._lock:
            link = self._links.setdefault((min(rank, peer), max(rank, peer), generation), Link())
        end = int(rank > peer)
        if generation >= self.cuts:
            return CutChannel(sock, None, self.drop, link, end)
        chosen = random.Random(f"{self.seed}/{rank}/{peer}/{generation}")
        return CutChannel(sock, chosen.randrange(1, self.span), chosen.randrange(self.drop + 1),
                          link, end)

    def reconnecting(self, reconnect: Callable[..., Any]) -> Callable[..., Any]:
        """reconnect (reconnect.Reconnector's call), but None (no path left) for the split
        pair; its other methods (asked) kept."""
        plan = self

        class Split:
            def __call__(self, peer: int, *args: Any) -> Any:
                if plan.split is not None and plan.split == _pair(reconnect.info.rank, peer):
                    return None
                return reconnect(peer, *args)

            def __getattr__(self, name: str) -> Any:
                return getattr(reconnect, name)

        return Split()


def _pair(a: int, b: int) -> tuple[int, int]:
    return min(a, b), max(a, b)

class SocketCuts:
    """Cuts of the real sockets, which tcp's C lanes meet as a pulled cable's errors (EPIPE,
    the end of the stream, ECONNRESET) where they write and read the fds themselves (a
    CutChannel wraps a socket in Python, which C never calls): TBCOLL_FAULTS=seed:cuts:span:c.

    One thread per transport watches each stream's SENT count; once the stream's generation-th
    connection (the first `cuts`: set-up's, then each one failover makes, its replay included)
    has sent a seeded number of bytes below `span`, it shuts that socket down both ways, as a
    pulled cable ends both directions at once. The peer reads the bytes before, then the end
    of the stream (in a header, a payload or a replay, wherever the count fell); this end reads
    what its kernel took in before the cut, then the end (or ECONNRESET), and its next write
    fails with EPIPE. A byte the peer writes after the cut is answered with a reset (Linux's
    rule for a socket shut for reading), never acknowledged: the peer's tail keeps it, and its
    write or read fails with ECONNRESET or EPIPE (BSD and macOS acknowledge such bytes and
    drop them, which no cable does: there these cuts may lose bytes, named, where a pull
    would not). The thread looks every `look` seconds, so
    the cut falls at the first look past its byte (seeded, not exact: the threads race)."""

    def __init__(self, seed: int, cuts: int, span: int, look: float = 0.0005) -> None:
        self.seed, self.cuts, self.span, self.look = seed, cuts, span, look
        self.made = 0  # cuts made (a test's count)

    def watch(self, transport: Any) -> threading.Thread:
        """Cut transport's (a StreamTransport of real sockets) connections as planned."""
        thread = threading.Thread(target=self._run, args=(transport,), daemon=True,
                                  name="socket-cuts")
        thread.start()
        return thread

    def _cut_at(self, rank: int, peer: int, generation: int) -> int:
        return random.Random(f"{self.seed}/{rank}/{peer}/{generation}/c").randrange(1,
                                                                                  self.span)

    def _run(self, transport: Any) -> None:
        from tbcoll.transports.stream.words import SENT_WORD  # (words: no import cycle)

        began: dict[tuple[int, int], int] = {}  # (peer, generation) -> SENT when first seen
        while transport._peers:
            for peer in list(transport._peers.values()):
                key = (peer.rank, peer.generation)
                if peer.generation >= self.cuts or peer.lost or peer.broken or key in began \
                        and began[key] < 0:
                    continue
                sent = transport.words[peer.words_at + SENT_WORD]
                first = began.setdefault(key, sent)
                if sent - first >= self._cut_at(transport.rank, peer.rank, peer.generation):
                    self._shut(peer)
                    began[key] = -1
            time.sleep(self.look)

    def _shut(self, peer: Any) -> None:
        try:
            peer.channel.shutdown(socket.SHUT_RDWR)
            self.made += 1
        except OSError:
            pass  # closed meanwhile: failing over already
