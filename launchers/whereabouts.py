"""Where every rank was, from the ranks' dumps (tbcoll.observability.dumps): one screen, matched
across ranks by each communicator's call numbers. A pure function of the dumps, tested without
processes (tests/launch/test_whereabouts.py).

    ranks 0, 1, 3: all_reduce #51 float32 4096 B at train.py:14 (for 30.2 s)
    rank 2: barrier #51 at train.py:12 -- rank 2 left the common path

A communicator's ranks count their collective calls alike (#1, #2, ...), so ranks whose call
number is the same but whose calls differ took different branches; a rank outside any call
while the others wait in call #n has not entered it; a rank that did not answer is named, and
so is the line each rank outside a call was at.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tbcoll.launch.diagnose import ranks_phrase

Dump = Mapping[str, Any]


NOT_ASKED = "no dump (exited before it was asked)"


def where(dumps: Mapping[int, Dump], silent: Sequence[int] = (),
          absent: str = NOT_ASKED) -> list[str]:
    """The lines that say where each rank was (none when no rank was in a call). silent:
    ranks that were asked for a dump and did not answer; absent: what a rank without a dump
    that was not silent is said to be."""
    blocks = []
    for members in _communicators(dumps):
        states = {r: _state(dumps.get(r), members) for r in members}
        if any(s is not None and s["call"] for s in states.values()):
            blocks.append((members, _one_communicator(states, silent, absent)))
    if len(blocks) == 1 and blocks[0][0] == tuple(range(len(blocks[0][0]))):
        return blocks[0][1]  # the world alone: no heading
    return [line for members, lines in blocks
            for line in (f"the communicator of {ranks_phrase(members)}:", *lines)]


def _communicators(dumps: Mapping[int, Dump]) -> list[tuple[int, ...]]:
    """Every communicator some dump holds, by its members' world ranks; the world first."""
    seen = {tuple(c["ranks"]) for d in dumps.values() for c in d.get("communicators", ())}
    return sorted(seen, key=lambda members: (-len(members), members))


def _state(dump: Dump | None, members: tuple[int, ...]) -> dict[str, Any] | None:
    """One rank's state in one communicator: its call in progress ("call"), or where it was
    ("site", its main thread's line) and how many calls it had made."""
    if dump is None:
        return None
    for comm in dump.get("communicators", ()):
        if tuple(comm["ranks"]) == members:
            main = next((s for s in dump.get("stacks", ()) if s.get("main")), {})
            return {"call": comm.get("current"), "completed": comm.get("completed", 0),
                    "site": main.get("site", ""), "clock": dump.get("clock", {})}
    return None


def _label(call: Mapping[str, Any]) -> str:
    """all_reduce #51 float32 4096 B op=max at train.py:14"""
    what = call["collective"]
    if call.get("seq") is not None:
        what += f" #{call['seq']}"
    if what.startswith(("send", "recv")) and call.get("peer") is not None:
        what += f" {'to' if what.startswith('send') else 'from'} rank {call['peer']}"
        what += f" tag {call.get('tag', 0)}"
    if call.get("dtype"):
        what += f" {call['dtype']} {call.get('bytes', 0)} B"
    if call.get("op") not in (None, "sum"):
        what += f" op={call['op']}"
    if call.get("root") is not None:
        what += f" root={call['root']}"
    return what + (f" at {call['site']}" if call.get("site") else "")


def _one_communicator(states: Mapping[int, dict[str, Any] | None],
                      silent: Sequence[int], absent: str) -> list[str]:
    groups: dict[str, list[int]] = {}
    calls: dict[int, Mapping[str, Any]] = {}
    for rank, state in states.items():
        if state is None:
            label = "did not answer (frozen, or holding Python's lock?)" if rank in silent \
                else absent
        elif state["call"]:
            calls[rank] = state["call"]
            label = _label(state["call"]) + _how_long(state)
            if state["call"].get("state") == "failed":
                label += " (failed)"
        else:
            label = f"not in a call ({state['completed']} made)"
            if state["site"]:
                label += f", at {state['site']}"
        groups.setdefault(label, []).append(rank)
    lines = [f"  {ranks_phrase(ranks)}: {label}"
             for label, ranks in sorted(groups.items(), key=lambda g: (-len(g[1]), g[1]))]
    return lines + [f"  -- {verdict}" for verdict in _verdicts(states, calls)]


def _how_long(state: Mapping[str, Any]) -> str:
    """How long the rank had been in its call (the one-call paths time nothing)."""
    call, now = state["call"], state["clock"].get("perf")
    if now is None or not call.get("start") or call.get("state") == "failed":
        return ""
    return f" (for {now - call['start']:.1f} s)"


def _signature(call: Mapping[str, Any]) -> tuple:
    return tuple(call.get(k) for k in ("collective", "dtype", "bytes", "op", "root", "peer"))


def _verdicts(states: Mapping[int, dict[str, Any] | None],
              calls: Mapping[int, Mapping[str, Any]]) -> list[str]:
    """What the states say: who left the common path, who has not entered the call."""
    numbered = {r: c for r, c in calls.items() if c.get("seq") is not None}
    if not numbered:
        return []
    latest = max(c["seq"] for c in numbered.values())
    at_latest: dict[tuple, list[int]] = {}
    for rank, call in numbered.items():
        if call["seq"] == latest:
            at_latest.setdefault(_signature(call), []).append(rank)
    verdicts = []
    common = max(at_latest.values(), key=len)
    if len(at_latest) > 1:
        ties = [ranks for ranks in at_latest.values() if len(ranks) == len(common)]
        if len(ties) > 1:
            verdicts.append(f"call #{latest} differs between ranks: "
                            + "; ".join(ranks_phrase(r) for r in ties))
        else:
            strays = sorted(r for ranks in at_latest.values() if ranks is not common
                            for r in ranks)
            verdicts.append(f"{ranks_phrase(strays)} left the common path (the others are in "
                            f"{numbered[common[0]]['collective']} #{latest})")
    name = numbered[common[0]]["collective"]
    behind = sorted(r for r, s in states.items() if s is not None and r not in calls
                    and s["completed"] < latest)
    if behind:
        verdicts.append(f"{ranks_phrase(behind)} did not enter {name} #{latest} "
                        f"({ranks_phrase(sorted(common))} did)")
    earlier = sorted(r for r, c in numbered.items() if c["seq"] < latest)
    if earlier:
        verdicts.append(f"{ranks_phrase(earlier)} still in an earlier call than #{latest}")
    return verdicts
