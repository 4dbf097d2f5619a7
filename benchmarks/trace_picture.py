"""Draw a tbrun --trace timeline as a picture (for the README; Perfetto or chrome://tracing
open the same file interactively): a row per rank, a bar per collective, and in a paler
shade the part of each call spent waiting for the last rank to arrive.

    tbrun -np 4 --trace tp.json examples/tp_forward.py
    python benchmarks/trace_picture.py tp.json benchmarks/trace.png [first_ms last_ms]
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(source: str, target: str, window: tuple[float, float] | None = None) -> None:
    events = [e for e in json.load(open(source))["traceEvents"] if e["ph"] == "X"]
    latest: dict[tuple, float] = defaultdict(float)
    for e in events:
        key = (tuple(e["args"]["ranks"]), e["args"]["seq"])
        latest[key] = max(latest[key], e["ts"])
    colors = {name: f"C{i}" for i, name in enumerate(sorted({e["name"] for e in events}))}
    ranks = sorted({e["pid"] for e in events})
    fig, ax = plt.subplots(figsize=(10, 1 + 0.5 * len(ranks)))
    for e in events:
        start, end = e["ts"] / 1e3, (e["ts"] + e["dur"]) / 1e3
        if window and (end < window[0] or start > window[1]):
            continue
        arrived = latest[(tuple(e["args"]["ranks"]), e["args"]["seq"])] / 1e3
        waited = min(max(arrived - start, 0.0), end - start)
        color = colors[e["name"]]
        ax.broken_barh([(start, waited)], (e["pid"] - 0.4, 0.8), color=color, alpha=0.35)
        ax.broken_barh([(start + waited, end - start - waited)], (e["pid"] - 0.4, 0.8),
                       color=color)
    ax.set_yticks(ranks, [f"rank {r}" for r in ranks])
    ax.invert_yaxis()
    ax.set_xlabel("ms (pale: waiting for the last rank to arrive)")
    if window:
        ax.set_xlim(*window)
    ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=c) for c in colors.values()],
              labels=list(colors), loc="upper right", fontsize="small")
    fig.tight_layout()
    fig.savefig(target, dpi=110)


if __name__ == "__main__":
    window = (float(sys.argv[3]), float(sys.argv[4])) if len(sys.argv) > 4 else None
    main(sys.argv[1], sys.argv[2], window)
