"""tbrun --keep-going's side of the store: the one failure authority's (tbcoll.job.failures).

It publishes the failed set (FAILED and FAILED_AT of each epoch), hears the ranks' reports of
frozen peers (SUSPECT: the store hands them here at once, and the supervisor's select loop is
woken through its wake-up pipe) and checks whether a reported peer is really frozen: a rank
that runs tbcoll answers tbrun's requests for dumps from a thread of its own within
milliseconds, whatever its main thread does (tbcoll.observability.dumps), so a peer that
answers nothing within PROBE_WAIT is frozen (stopped, or stuck in C code holding Python's
lock). That works alike for local ranks, wrapped ones (macOS, ssh, srun) and on macOS. A rank
merely slow, or itself waiting on a frozen one (a chain), answers, and is left alone.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

from tbcoll.launch.postmortem import Postmortem

from tbcoll.job.failures import FAILED, FAILED_AT, SUSPECT, format_failed, parse_suspect
from tbcoll.job.rendezvous import StoreServer
from tbcoll.observability.dump_keys import ANSWER_KEY, LISTENING_KEY

PROBE_WAIT = 1.0  # seconds a suspected peer gets to answer before it is found frozen
_SUSPECT_PREFIX = SUSPECT.format("")


class Authority:
    """What the supervisor asks of the store under --keep-going."""

    def __init__(self, store: StoreServer, postmortem: Postmortem) -> None:
        self._store = store
        self._postmortem = postmortem
        self._reports: list[tuple[int, tuple[int, ...], str]] = []
        self._lock = threading.Lock()
        self._wake: Callable[[], None] = lambda: None
        # request n -> (when its answers are due, the peers asked about)
        self._probes: dict[int, tuple[float, tuple[int, ...]]] = {}
        store.divert(_SUSPECT_PREFIX, self._suspect)

    def wake_with(self, fd: int | None) -> None:
        """Write a byte to fd (the supervisor's wake-up pipe) when a report arrives; None:
        no more (the pipe is about to close, and its number may be reused)."""
        def wake() -> None:
            try:
                os.write(fd, b"\0")
            except OSError:  # full: the loop wakes anyway
                pass
        with self._lock:  # a store thread's wake under way ends before the pipe may close
            self._wake = (lambda: None) if fd is None else wake

    def _suspect(self, key: bytes, value: bytes) -> None:
        """A rank's SUSPECT (from a store thread): queue it, kept in the store as well."""
        reporter = key[len(_SUSPECT_PREFIX):].decode(errors="replace")
        if not (reporter.isascii() and reporter.isdigit()):
            return
        self._store.set(key, value)
        with self._lock:
            self._reports.append((int(reporter), *parse_suspect(value)))
            self._wake()

    def reports(self) -> list[tuple[int, tuple[int, ...], str]]:
        """The (reporter, peers, why) reports since the last call (why: "" for a wait past
        --comm-timeout, NO_PATH for a split)."""
        with self._lock:
            reports, self._reports = self._reports, []
        return reports

    def declare(self, epoch: int, ranks: tuple[int, ...]) -> None:
        """Publish the failed set: FAILED first, so that a rank woken by FAILED_AT of the
        epoch reads a FAILED at least as new."""
        value = format_failed(epoch, ranks)
        self._store.set(FAILED, value)
        self._store.set(FAILED_AT.format(epoch), value)

    def probe(self, peers: tuple[int, ...], reason: str) -> None:
        """Ask the ranks for their dumps, to see whether peers answer (due: see due)."""
        n = self._postmortem.request(reason)
        self._probes[n] = (time.monotonic() + PROBE_WAIT, peers)

    @property
    def deadline(self) -> float | None:
        """When the next check is due."""
        return min((due for due, _ in self._probes.values()), default=None)

    def due(self, now: float) -> list[tuple[int, bool, str]]:
        """(peer, frozen, why) for each peer whose check is due (answered early or not)."""
        found = []
        for n, (due, peers) in list(self._probes.items()):
            answered = {p for p in peers if self._store.get(ANSWER_KEY.format(n, p))}
            if now < due and len(answered) < len(peers):
                continue
            del self._probes[n]
            for peer in peers:
                found.append((peer, *self._finding(peer, peer in answered)))
        return found

    def _finding(self, peer: int, answered: bool) -> tuple[bool, str]:
        if answered:
            return False, "it answered tbrun"
        if not self._store.get(LISTENING_KEY.format(peer)):
            return False, ("tbrun cannot tell (it does not answer tbrun's requests: not "
                           "running tbcoll, or before tbcoll.init)")
        return True, f"it answered nothing in {PROBE_WAIT:g} s"
