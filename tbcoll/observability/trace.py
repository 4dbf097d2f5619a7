"""Timelines of a job's collectives: tbrun --trace FILE writes one, this sums it up.

    tbrun -np 4 --trace run.json python train.py
    python -m tbcoll.observability.trace summary run.json

The file is Chrome's trace format (JSON `traceEvents`), which Perfetto (ui.perfetto.dev) and
chrome://tracing open: a track per rank (a row per communicator), an event per collective with
its bytes, algorithm and the user's line. Each rank times its calls with its own clock; the
clocks are aligned on the calls themselves: a collective's ranks leave it within a message's
latency of each other, so a rank's offset to rank 0 is the median, over their first 4096
common calls on the world communicator, of the difference between their end times (no clock
protocol, and hosts whose clocks disagree by seconds line up to within that latency).

tbrun writes the file from the chunks each rank sent as it ran (tbcoll.observability.dumps), a chunk
in memory at a time (write_trace); the summary reads the whole file.

The summary answers the question a tensor-parallel user asks first: per collective, the time
spent in it, and how much of that was waiting for the slowest rank to arrive (load
imbalance, not communication): for each call, every rank's wait is the latest start among the
ranks minus its own start.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from tbcoll.core.records import record
from tbcoll.observability.recorder import TRACE_ROW

# how many of a rank's first calls on the world communicator its clock offset is measured on
_OFFSET_SAMPLE = 4096
_ARGS = ("seq", "dtype", "bytes", "op", "root", "algorithm", "site", "ranks")
_FAILOVER_ARGS = ("peer", "old", "new", "reason", "replayed", "seconds")
_FAILOVER_ROW = 1 << 20  # the row (tid) of a rank's failovers, below its communicators'

Chunks = Callable[[], Iterable[Mapping[str, Any]]]


@record
class Written:
    calls: int  # events written
    ended: dict[int, bool]  # rank -> its last chunk said so (it exited normally)


class _Survey:
    """What the first pass over a rank's chunks learns."""

    def __init__(self, host: str, clock: Mapping[str, float]) -> None:
        self.host = host
        self.clock = clock  # the first chunk's: perf_counter and the wall clock read together
        self.shift = clock["wall"] - clock["perf"]  # perf_counter times to its wall clock
        self.first = math.inf  # its earliest start, on its wall clock
        self.comms: set[tuple[int, ...]] = set()
        # (communicator size, seq) -> end on its wall clock, of its first calls on
        # communicators whose members are 0, 1, ... (the world's among them)
        self.ends: dict[tuple[int, int], float] = {}
        self.ended = False  # its last chunk said so: it exited normally


def write_trace(ranks: Mapping[int, Chunks], out: TextIO) -> Written:
    """Write one Chrome trace to out from each rank's chunks (what tbcoll.observability.dumps sent:
    host, clock, comms, calls, and last on the final one), holding one chunk in memory at a time: a
    first pass over every rank's chunks finds the clock offsets, the origin and the
    communicators, a second writes the events. ranks: rank -> a function that yields its
    chunks, in order, each time it is called."""
    surveys = {rank: _survey(chunks) for rank, chunks in sorted(ranks.items())}
    comms = sorted({c for s in surveys.values() for c in s.comms},
                   key=lambda members: (-len(members), members))
    offsets = _offsets(surveys, comms[0] if comms else ())
    origin = min((s.first - offsets[r] for r, s in surveys.items()), default=0.0)
    row = {members: i for i, members in enumerate(comms)}
    out.write('{"traceEvents": [')
    separator, calls = "", 0
    for rank, survey in surveys.items():
        meta = [{"ph": "M", "name": "process_name", "pid": rank, "tid": 0,
                 "args": {"name": f"rank {rank} ({survey.host})"}},
                {"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0,
                 "args": {"sort_index": rank}}]
        meta += [{"ph": "M", "name": "thread_name", "pid": rank, "tid": row[members],
                  "args": {"name": _comm_name(members, comms)}}
                 for members in comms if rank in members]
        out.write(separator + json.dumps(meta)[1:-1])
        separator = ", "
        shift = survey.shift - offsets[rank] - origin
        for chunk in ranks[rank]():
            events = [{"ph": "X", "name": e["collective"], "cat": "collective", "pid": rank,
                       "tid": row[tuple(e["ranks"])], "ts": round((e["start"] + shift) * 1e6, 3),
                       "dur": round((e["end"] - e["start"]) * 1e6, 3),
                       "args": {k: e.get(k) for k in _ARGS}}
                      for e in _calls(chunk)]
            if events:
                out.write(separator + json.dumps(events)[1:-1])
                calls += len(events)
            if chunk.get("failovers"):
                out.write(separator + json.dumps(_failovers(rank, chunk, shift))[1:-1])
    other = {"clock offsets to rank 0 (s)": {str(r): o for r, o in offsets.items()}}
    out.write(f'], "displayTimeUnit": "ms", "otherData": {json.dumps(other)}}}')
    return Written(calls, {rank: s.ended for rank, s in surveys.items()})


def _failovers(rank: int, chunk: Mapping[str, Any], shift: float) -> list[dict[str, Any]]:
    """A chunk's failovers: each a span on its rank's row of failovers, from the failure
    found to the stream going on over its new path (the row named with them)."""
    return [{"ph": "M", "name": "thread_name", "pid": rank, "tid": _FAILOVER_ROW,
             "args": {"name": "failovers"}}] + [
        {"ph": "X", "name": f"failover to rank {e['peer']}", "cat": "failover", "pid": rank,
         "tid": _FAILOVER_ROW, "ts": round((e["at"] - e["seconds"] + shift) * 1e6, 3),
         "dur": round(e["seconds"] * 1e6, 3), "args": {k: e.get(k) for k in _FAILOVER_ARGS}}
        for e in chunk["failovers"]]


def _calls(chunk: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """A chunk's calls (rows of TRACE_ROW after their communicator's index), as dicts."""
    comms = chunk["comms"]
    for index, *row in chunk["calls"]:
        yield {**dict(zip(TRACE_ROW, row, strict=True)), "ranks": comms[index]}


def _survey(chunks: Chunks) -> _Survey:
    """The first pass over a rank's chunks (on the rows themselves: no dict per call)."""
    survey = None
    for chunk in chunks():
        if survey is None:
            survey = _Survey(chunk.get("host", "?"), chunk["clock"])
        comms = [tuple(members) for members in chunk["comms"]]
        survey.comms.update(comms)
        ordered = [members == tuple(range(len(members))) for members in comms]
        for index, seq, *_, start, end, _site in chunk["calls"]:
            survey.first = min(survey.first, start + survey.shift)
            if ordered[index] and len(survey.ends) < _OFFSET_SAMPLE:
                survey.ends.setdefault((len(comms[index]), seq), end + survey.shift)
        survey.ended = bool(chunk.get("last"))
    return survey or _Survey("?", {"wall": 0.0, "perf": 0.0})


def _offsets(surveys: Mapping[int, _Survey], world: tuple[int, ...]) -> dict[int, float]:
    """Each rank's clock minus rank 0's: the median, over their first common calls on the
    world communicator, of the difference between their end times."""
    def world_ends(survey: _Survey) -> dict[int, float]:
        return {seq: end for (n, seq), end in survey.ends.items() if n == len(world)}

    reference = world_ends(surveys[world[0]]) if world and world[0] in surveys else {}
    offsets = {}
    for rank, survey in surveys.items():
        mine = world_ends(survey)
        common = [mine[s] - reference[s] for s in mine.keys() & reference.keys()]
        offsets[rank] = statistics.median(common) if common else 0.0
    return offsets


def _comm_name(members: tuple[int, ...], comms: Sequence[tuple[int, ...]]) -> str:
    return "world" if members == comms[0] else "ranks " + ",".join(map(str, members))


def summarize(trace: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per collective: calls, total time (the mean over its ranks of each call's duration,
    summed), waiting (the same of each rank's wait for the last rank to arrive), and the rank
    that arrived last most often. Times in microseconds, as in the trace."""
    calls: dict[tuple, dict[int, tuple[float, float]]] = defaultdict(dict)
    names: dict[tuple, str] = {}
    for e in trace["traceEvents"]:
        if e.get("ph") != "X" or e.get("cat") != "collective":
            continue
        key = (tuple(e["args"]["ranks"]), e["args"]["seq"])
        calls[key][e["pid"]] = (e["ts"], e["dur"])
        names[key] = e["name"]
    rows: dict[str, dict[str, Any]] = {}
    for key, by_rank in calls.items():
        row = rows.setdefault(names[key], {"collective": names[key], "calls": 0, "time_us": 0.0,
                                           "waiting_us": 0.0, "last": Counter()})
        latest = max(start for start, _ in by_rank.values())
        row["calls"] += 1
        row["time_us"] += statistics.fmean(dur for _, dur in by_rank.values())
        row["waiting_us"] += statistics.fmean(latest - start for start, _ in by_rank.values())
        if len(by_rank) > 1:
            row["last"][max(by_rank, key=lambda r: by_rank[r][0])] += 1
    return sorted(rows.values(), key=lambda r: -r["time_us"])


def format_summary(rows: Sequence[Mapping[str, Any]]) -> str:
    lines = [f"{'collective':<16}{'calls':>8}{'time ms':>11}{'waiting ms':>12}{'waiting':>9}"
             f"{'us/call':>10}  last to arrive"]
    for r in rows:
        share = r["waiting_us"] / r["time_us"] if r["time_us"] else 0.0
        last = ", ".join(f"rank {rank} ({n}x)" for rank, n in r["last"].most_common(2))
        lines.append(f"{r['collective']:<16}{r['calls']:>8}{r['time_us'] / 1e3:>11.3f}"
                     f"{r['waiting_us'] / 1e3:>12.3f}{share:>9.0%}"
                     f"{r['time_us'] / r['calls']:>10.1f}  {last}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2 or args[0] != "summary":
        print("usage: python -m tbcoll.observability.trace summary FILE  (FILE: from tbrun "
              "--trace FILE)",
              file=sys.stderr)
        return 2
    try:
        trace = json.loads(Path(args[1]).read_text())
        rows = summarize(trace)
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"{args[1]}: not a trace that tbrun --trace wrote ({e})", file=sys.stderr)
        return 1
    print(format_summary(rows) if rows else f"{args[1]}: no collective calls in the trace")
    return 0


if __name__ == "__main__":
    sys.exit(main())
