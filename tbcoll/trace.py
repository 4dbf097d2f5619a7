"""Timelines of a job's collectives: tbrun --trace FILE writes one, this sums it up.

    tbrun -np 4 --trace run.json python train.py
    python -m tbcoll.trace summary run.json

The file is Chrome's trace format (JSON `traceEvents`), which Perfetto (ui.perfetto.dev) and
chrome://tracing open: a track per rank (a row per communicator), an event per collective with
its bytes, algorithm and the user's line. Each rank times its calls with its own clock; the
clocks are aligned on the calls themselves: a collective's ranks leave it within a message's
latency of each other, so a rank's offset to rank 0 is the median, over their common calls on
the world communicator, of the difference between their end times (no clock protocol, and
hosts whose clocks disagree by seconds line up to within that latency).

The summary answers the question a tensor-parallel user asks first: per collective, the time
spent in it, and how much of that was waiting for the slowest rank to arrive (load
imbalance, not communication): for each call, every rank's wait is the latest start among the
ranks minus its own start.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def merge(ranks: Mapping[int, Mapping[str, Any]]) -> dict[str, Any]:
    """One Chrome trace from each rank's events (what tbcoll.dumps.send_trace sent)."""
    times = {rank: [(e, *_wall(e, sent["clock"])) for e in sent["events"]]
             for rank, sent in ranks.items()}
    offsets = _offsets(times)
    origin = min((start - offsets[r] for r, events in times.items() for _, start, _ in events),
                 default=0.0)
    comms = sorted({tuple(e["ranks"]) for sent in ranks.values() for e in sent["events"]},
                   key=lambda members: (-len(members), members))
    row = {members: i for i, members in enumerate(comms)}
    out: list[dict[str, Any]] = []
    for rank, sent in sorted(ranks.items()):
        out.append({"ph": "M", "name": "process_name", "pid": rank, "tid": 0,
                    "args": {"name": f"rank {rank} ({sent.get('host', '?')})"}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0,
                    "args": {"sort_index": rank}})
        for members in comms:
            if rank in members:
                out.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": row[members],
                            "args": {"name": _comm_name(members, comms)}})
        for event, start, end in times[rank]:
            args = {k: event.get(k) for k in ("seq", "dtype", "bytes", "op", "root",
                                             "algorithm", "site", "ranks")}
            out.append({"ph": "X", "name": event["collective"], "cat": "collective",
                        "pid": rank, "tid": row[tuple(event["ranks"])],
                        "ts": round((start - offsets[rank] - origin) * 1e6, 3),
                        "dur": round((end - start) * 1e6, 3), "args": args})
    return {"traceEvents": out, "displayTimeUnit": "ms",
            "otherData": {"clock offsets to rank 0 (s)": {str(r): o for r, o in offsets.items()}}}


def _wall(event: Mapping[str, Any], clock: Mapping[str, float]) -> tuple[float, float]:
    """An event's start and end on its rank's wall clock (from its perf_counter times)."""
    shift = clock["wall"] - clock["perf"]
    return event["start"] + shift, event["end"] + shift


def _offsets(times: Mapping[int, list[tuple[dict, float, float]]]) -> dict[int, float]:
    """Each rank's clock minus rank 0's, from their common calls on the world communicator."""
    world = tuple(sorted(times))
    ends = {rank: {e["seq"]: end for e, _, end in events if tuple(e["ranks"]) == world}
            for rank, events in times.items()}
    reference = ends.get(world[0], {}) if world else {}
    offsets = {}
    for rank, mine in ends.items():
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
        if e.get("ph") != "X":
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
        print("usage: python -m tbcoll.trace summary FILE  (FILE: from tbrun --trace FILE)",
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
