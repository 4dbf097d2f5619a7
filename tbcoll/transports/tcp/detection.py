"""Failover's detection on tcp (docs/failover.md, "Detection" and "Fail-back"): a part of
TcpTransport, as Failover is of the engine. A dead path is found by C's watcher
(tbcoll/transports/tcp/watch.c: a thread without the GIL) or by a peer's ask through the
store; either shuts the connection down, which every path meets as its end, and says why
(_found) for the failover's message. The higher rank of a pair off its preferred path probes
the earlier ones and moves the pair back when one answers (fail-back).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as NotYet
from types import ModuleType

from tbcoll.core.errors import LINK_DOWN, TbcollError
from tbcoll.job.pathevents import FAILED_BACK
from tbcoll.job.topology import Path
from tbcoll.transports.reconnect import FAIL_BACK, HostEvent, answers, same_path
from tbcoll.transports.stream import Channel, Peer

# With failover on, a wait looks this often (at most) at the job's store for a peer's ask to
# fail over a pair (Reconnector.asked): a store round trip is 25 us here (p99 45 us, over
# loopback), and a peer that failed over waits for this rank, which the issue wants within
# 0.5 s
_ASKS_EVERY = 0.05
_ASKS_RETRY = 5.0  # seconds before a look again where the store did not answer
_ASK_WAIT = 0.5  # seconds a failing stream waits for the store to say whether it was asked
# With failover on, the higher rank of a pair that runs over a path other than its preferred
# one probes the earlier paths this often, from a thread of its own (reconnect.answers: a
# SYN each), and moves the pair back when one answers (a planned failover)
_PROBE_EVERY = 3.0


class Detection:
    """TcpTransport's detection and fail-back; it uses the transport's peers, paths (_paths,
    _in_use), Reconnector (_reconnector) and poller (_poller)."""

    def _detect(self, watcher: ModuleType | None) -> None:
        """Start: watcher, tcp's C extension where built and failover on (None: Python's
        once-a-second look alone, _check_links), watches every connection."""
        self._watcher = watcher if self._reconnector is not None else None
        self._found: dict[int, str] = {}  # peer -> why its connection was found dead
        self._told: dict[int, bool] = {}  # peer -> whether its failover was told, not found
        self._asks_due = 0.0
        self._asker: ThreadPoolExecutor | None = None  # its thread (_asks)
        self._asking: Future | None = None  # _look_for_asks' look in progress
        for peer in self._peers.values():
            self._watch(peer.channel)
        self._failback: set[int] = set()  # peers whose pair moves back (all paths are tried)
        self._closing = threading.Event()
        self._start_probes()

    def _stop_detecting(self) -> None:
        self._closing.set()
        if self._asker is not None:
            self._asker.shutdown(wait=False)
        for peer in self._peers.values():
            self._unwatch(peer.channel)

    def _link_failed(self, peer: Peer, reason: str, cause: OSError | str | None = None) -> bool:
        """As the engine's, with why the path was found dead where it was (the watcher or a
        peer's ask shut the socket down: the engine meets that as the end of the stream).
        A failure this rank found itself fails over the pair of hosts (_fail_hosts)."""
        fresh = peer.broken is None and not peer.lost
        found, told = self._found_dead(peer)
        failing = super()._link_failed(peer, found or reason, None if found else cause)
        if failing and fresh:
            self._told[peer.rank] = told
            if not told:
                self._fail_hosts(peer, peer.broken)
        return failing

    def _found_dead(self, peer: Peer) -> tuple[str | None, bool]:
        """Why peer's connection was found dead by the watcher or a peer's ask (looked at
        once, as it fails: the peer may have closed its end before this rank's wait saw
        its ask), or None; and whether this rank was told (an ask, a host pair's event, a
        move back), not found it."""
        if peer.rank in self._found:
            return self._found.pop(peer.rank), True
        if peer.broken or peer.lost:
            return None, True
        fd = peer.channel.fileno()
        seen = self._watcher.watched(fd) if self._watcher and fd >= 0 else None
        if seen is None:
            asked = self._asked_why(peer)
            return asked, asked is not None
        if seen[0] == "stalled":
            return (f"nothing acknowledged for {seen[1]:.1f} s with {seen[2]} bytes in flight: "
                    f"{LINK_DOWN}"), False
        return f"the connection ended ({os.strerror(seen[1]) if seen[1] else 'closed'})", False

    def _fail_hosts(self, peer: Peer, why: str) -> None:
        """peer's path failed, found here: fail over this rank's other streams to peer's host
        over the same path now, and tell the ranks of both hosts (Reconnector.tell_hosts,
        from the asks' thread: the engine never waits for the store), so that a stream with
        nothing in flight moves now, not when next used (then 1 s more) or at keepalive's
        end (~4 s). A pair of hosts, not of ranks, is what fails over (docs/failover.md)."""
        used = self._in_use.get(peer.rank)
        if used is None or not hasattr(self._reconnector, "tell_hosts"):
            return
        line = self._reconnector.host_line(peer.rank, used, why)
        self._break_over(self._reconnector.node_of(peer.rank), used.kind, used.number, line)
        self._asks().submit(self._tell_hosts, peer.rank, used, why)

    def _tell_hosts(self, peer: int, used: Path, why: str) -> None:
        try:
            self._reconnector.tell_hosts(peer, used, why)
        except TbcollError:
            pass  # the store does not answer: each pair finds the failure itself

    def _break_over(self, node: int | None, kind: str, number: int, line: str) -> None:
        """Shut down this rank's streams to host node over the path (kind, number), saying
        why (line): each engine meets the end and fails over. From the engine's thread or the
        asks' (which changes no state of the engine's: as _take_asks)."""
        for peer in list(self._peers.values()):
            if (peer.broken or peer.lost or peer.rank in self._found
                    or self._reconnector.node_of(peer.rank) != node
                    or not same_path(self._in_use.get(peer.rank), kind, number)):
                continue
            self._found[peer.rank] = line
            try:
                peer.channel.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # it has ended already: the engine meets that

    def _watch(self, channel: Channel) -> None:
        if self._watcher is not None:
            self._watcher.watch(channel.fileno())

    def _unwatch(self, channel: Channel) -> None:
        """Before channel is closed (C's watcher must not meet its number reused)."""
        if self._watcher is not None and channel.fileno() >= 0:
            self._watcher.unwatch(channel.fileno())

    def _look_for_asks(self) -> None:
        """A peer that failed over a pair asks this rank through the store (its own end may
        see nothing): have the asks' thread look (_take_asks), at most every _ASKS_EVERY and
        one look at a time. Runs in the poll, perhaps with the engine released; it never
        waits for the store (unreachable with the management network, a look could take
        its 30 s)."""
        now = time.monotonic()
        if (now < self._asks_due or not hasattr(self._reconnector, "asked")
                or self._asking is not None and not self._asking.done()):
            return
        self._asks_due = now + _ASKS_EVERY
        generations = {p.rank: p.generation for p in list(self._peers.values())
                       if not p.broken and not p.lost}
        self._asking = self._asks().submit(self._take_asks, generations)

    def _take_asks(self, generations: dict[int, int]) -> None:
        """In the asks' thread: for each peer that asked, say why (_found) and shut its
        socket down, which ends the poll (the engine meets its end and fails over too). It
        changes no state of the engine's. A store that does not answer: look again later."""
        events: list[HostEvent] = []
        try:
            asked = self._reconnector.asked(generations, events)
        except TbcollError:
            self._asks_due = time.monotonic() + _ASKS_RETRY
            return
        for event in events:  # a pair of hosts failed over elsewhere: its streams here too
            self._break_over(event.node, event.kind, event.number, event.line)
        for rank, why in asked.items():  # a host pair's event, where both came, says more
            self._found.setdefault(rank, self._asked_line(rank, why))
            try:
                self._peers[rank].channel.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # it has ended already: the engine meets that

    def _asked_why(self, peer: Peer) -> str | None:
        """Why peer asked to fail over the pair, where it did: one look at the store, waited
        for up to _ASK_WAIT (the engine's thread: else the failover says what it saw)."""
        if not hasattr(self._reconnector, "asked_why"):
            return None
        look = self._asks().submit(self._reconnector.asked_why, peer.rank, peer.generation)
        try:
            why = look.result(_ASK_WAIT)
        except (NotYet, TbcollError):
            return None
        return self._asked_line(peer.rank, why) if why else None

    def _asks(self) -> ThreadPoolExecutor:
        """The thread that looks at the store for asks (made at the first look)."""
        if self._asker is None:
            self._asker = ThreadPoolExecutor(1, thread_name_prefix="failover-asks")
        return self._asker

    def _asked_line(self, rank: int, why: str) -> str:
        if why == FAIL_BACK:
            self._failback.add(rank)  # the paths before the one in use are tried as well
            return f"rank {rank}: {FAILED_BACK}"
        return f"rank {rank} {why}"

    def _start_probes(self) -> None:
        """The fail-back's prober, where this rank is the higher of a pair with several
        paths (the one that connects when they fail over)."""
        if self._reconnector is None or not hasattr(self._reconnector, "ask") or not any(
                len(self._paths.get(rank, ())) > 1 for rank in self._peers if rank < self.rank):
            return
        threading.Thread(target=self._probe_paths, daemon=True, name="failover-probe").start()

    def _probe_paths(self) -> None:
        while not self._closing.wait(_PROBE_EVERY):
            for rank in [rank for rank in list(self._peers) if rank < self.rank]:
                self._fail_back_if_answers(rank)

    def _fail_back_if_answers(self, rank: int) -> None:
        """Move the pair with rank back to a path before the one in use where one answers
        (reconnect.answers), at a quiet moment: ask rank through the store, then shut the
        connection down, which both engines meet as its end; the failover that follows
        tries every path, preferred first, and replays as for a failure. It reads the
        engine's state from this thread without its turns: a move at any byte would still be
        right (the replay), quiet only spares a call the stall; and a connection the engine
        replaced meanwhile, shut down, fails over once more."""
        peer, paths = self._peers.get(rank), self._paths.get(rank, ())
        used = self._in_use.get(rank)
        if peer is None or peer.lost or peer.broken or used not in paths or used == paths[0]:
            return
        if not any(answers(path) for path in paths[:paths.index(used)]):
            return
        if peer.sendq or peer.target is not None or peer.start != peer.end:
            return  # not quiet: the next probe
        self._failback.add(rank)  # before the ask: the peer's answer may be its close
        self._found[rank] = FAILED_BACK
        try:
            self._reconnector.ask(None, rank, peer.generation + 1, FAIL_BACK)
        except TbcollError:  # the store does not answer (the management network)
            self._failback.discard(rank)
            self._found.pop(rank, None)
            return
        try:
            peer.channel.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # it has ended already: the engine meets that

    def _sleep_in_poll(self, timeout: float) -> list[tuple[int, int]]:
        """poll() for up to timeout; with failover on, in slices between which a peer's ask
        is looked for (_look_for_asks: its shut-down socket then ends the poll)."""
        if self._reconnector is None:
            return self._poller.poll(1000 * timeout)
        end = time.monotonic() + timeout
        while True:
            ready = self._poller.poll(1000 * min(_ASKS_EVERY, max(0.0, end - time.monotonic())))
            if ready or time.monotonic() >= end:
                return ready
            self._look_for_asks()
