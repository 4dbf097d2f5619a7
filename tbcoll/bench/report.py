"""Rows as the nccl-tests table, as JSON, or as CSV."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence

from tbcoll.bench.harness import Row

_HEADER = (f"{'size':>12} {'count':>12} {'type':>9} {'redop':>6} {'algorithm':>10} "
           f"{'inplace':>7} {'time_us':>10} {'algbw':>8} {'busbw':>8} {'#wrong':>7}")


def table(rows: Sequence[Row]) -> str:
    """nccl-tests' columns; algbw and busbw in GB/s."""
    if not rows:
        return "# no rows"
    first = rows[0]
    lines = [f"# {first.collective} on {first.ranks} ranks, {first.system}", "#" + _HEADER[1:]]
    for r in rows:
        lines.append(f"{r.size:>12} {r.count:>12} {r.type:>9} {r.redop:>6} {r.algorithm:>10} "
                     f"{'yes' if r.inplace else 'no':>7} {r.time_us:>10.2f} {r.algbw:>8.3f} "
                     f"{r.busbw:>8.3f} {r.wrong:>7}")
    wrong = sum(r.wrong for r in rows)
    lines.append(f"# out of bounds values: {wrong} {'OK' if wrong == 0 else 'FAILED'}")
    return "\n".join(lines)


def to_json(rows: Sequence[Row]) -> str:
    return json.dumps([r.as_dict() for r in rows], indent=1)


def to_csv(rows: Sequence[Row]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(Row.__dataclass_fields__))
    writer.writeheader()
    for r in rows:
        writer.writerow(r.as_dict())
    return buf.getvalue()
