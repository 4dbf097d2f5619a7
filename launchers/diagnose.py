"""What tbrun says about a failed job beyond "rank N exited": hints from a rank's status and
last words, and, when ranks failed only because of others, which rank or link it was."""

from __future__ import annotations

import re
import signal
import sys
from collections.abc import Callable, Collection, Mapping, Sequence

SSH_FAILED = 255  # ssh's own status for a connection it could not make or lost
NOT_FOUND = 127  # the shell's status for a command it cannot find
_MISSING_MODULE = re.compile(r"ModuleNotFoundError: No module named '(tbcoll|mpi4py|mlx)\b")


def hint(host: str, status: int, command: str, program: str, stderr_tail: str) -> str:
    """A parenthesised hint for a rank that failed with status (host: "" on this machine;
    command: what ran there; program: the rank's interpreter or program), or ""."""
    if host and status == SSH_FAILED:
        return (f" (ssh's status when it cannot reach {host} or the connection drops: check "
                f"`ssh {host} true`)")
    if host and status == NOT_FOUND:
        return (f" (a command not found on {host}: check that `{command}` runs there, e.g. "
                "the --python path)")
    missing = _MISSING_MODULE.findall(stderr_tail)
    if missing:
        return (f" ({program} cannot import {missing[-1]}: run the script as `tbrun ... "
                f"script.py`, which uses tbrun's own Python ({sys.executable}), or name the "
                "python of the environment where tbcoll is installed)")
    return ""


def describe_exit(returncode: int) -> str:
    """How a process ended, from Popen's returncode (-N: signal N)."""
    if returncode >= 0:
        return f"exited with status {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = "unknown signal"
    return f"was killed by signal {-returncode} ({name})"


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def ranks_phrase(ranks: Sequence[int]) -> str:
    """'rank 2' or 'ranks 1, 3' ("" for none)."""
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}" if ranks else ""


def suspects(followers: Mapping[int, Sequence[int]], alive: Collection[int],
             name: Callable[[int], str],
             broken: Collection[tuple[int, int]] = ()) -> list[str]:
    """Lines naming what the followers (rank -> the ranks it failed because of) failed
    because of, when no rank failed by itself: each link whose ends lost each other, or whose
    one end found the link itself dead (broken: (rank, peer) pairs; a pulled cable, whose
    far end may not notice for seconds), and the ranks most blamed otherwise, that did not
    fail because of others themselves (frozen, or cut off unnoticed)."""
    cut = {frozenset(pair) for pair in broken} | {
        frozenset((a, b)) for a, peers in followers.items() for b in peers
        if a in followers.get(b, ())}
    blamed: dict[int, int] = {}
    for rank, peers in followers.items():
        for peer in peers:
            # a follower's peer may have followed too: 0 <- 1 <- 2
            if peer not in followers and frozenset((rank, peer)) not in cut:
                blamed[peer] = blamed.get(peer, 0) + 1
    lines = [f"the link between {name(a)} and {name(b)} failed (see the ranks' messages for "
             "its addresses)" for a, b in sorted(tuple(sorted(pair)) for pair in cut)]
    if blamed:
        most = max(blamed.values())
        state = {True: "still runs: frozen, stopped, or cut off from them?", False: "had ended"}
        lines += [f"{name(rank)} did not answer: {plural(most, 'rank')} failed waiting for it "
                  f"or on losing it; it {state[rank in alive]}"
                  for rank in sorted(r for r, n in blamed.items() if n == most)]
    return lines
