"""tbcoll-bench: run inside every rank of a job, e.g.

    tbrun -np 4 tbcoll-bench all_reduce -b 8 -e 64M -f 4 -a all
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import click

import tbcoll
from tbcoll.bench import report
from tbcoll.bench.descriptors import DESCRIPTORS
from tbcoll.bench.harness import runs_in_place, sweep
from tbcoll.core.dtypes import DTYPES, OPS

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """'8', '64K', '16M', '1G' (powers of 1024) as bytes."""
    match = re.fullmatch(r"(\d+)([KMG]?)B?", text.strip().upper())
    if not match:
        raise click.BadParameter(f"{text!r} is not a size like 8, 64K, 16M or 1G")
    return int(match[1]) * _UNITS[match[2]]


def sizes(begin: int, end: int, factor: float) -> list[int]:
    """-b, -b*f, -b*f*f, ... up to -e inclusive, as nccl-tests does."""
    if factor <= 1 or begin <= 0 or end < begin:
        raise click.BadParameter(f"need 0 < -b <= -e and -f > 1; got -b {begin} -e {end} "
                                 f"-f {factor}")
    out, size = [], begin
    while size <= end:
        out.append(size)
        size = max(size + 1, int(size * factor))
    return out


def _progress(rank: int, total: int, label: str):
    """A progress bar on rank 0 for sweeps of more than 4 rows: click's on a terminal, a
    line per row where stderr is a pipe (as under tbrun, which tags lines)."""
    if rank != 0 or total <= 4:
        return lambda: None
    bar = click.progressbar(length=total, label=label, file=sys.stderr) \
        if sys.stderr.isatty() else None
    done = 0

    def step() -> None:
        nonlocal done
        done += 1
        if bar is None:
            print(f"{label}: {done}/{total} rows", file=sys.stderr, flush=True)
        else:
            bar.update(1)
            if done == total:
                bar.render_finish()

    return step


@click.command(context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.argument("collective", type=click.Choice(list(DESCRIPTORS)))
@click.option("-b", "--minbytes", default="8", help="Smallest message.")
@click.option("-e", "--maxbytes", default="64M", help="Largest message.")
@click.option("-f", "--stepfactor", type=float, default=4.0, help="Size multiplier per step.")
@click.option("-n", "--iters", type=click.IntRange(1), default=20,
              help="Calls per timed batch.")
@click.option("-r", "--repeats", type=click.IntRange(1), default=5,
              help="Timed batches; rows give their median, min and max.")
@click.option("-w", "--warmup", type=click.IntRange(0), default=5, help="Untimed iterations.")
@click.option("-d", "--dtype", type=click.Choice(list(DTYPES)), default="float32")
@click.option("-o", "--op", type=click.Choice(list(OPS)), default="sum")
@click.option("-a", "--algorithm", default="default",
              help="default, all, or a comma-separated list (ring,mesh,rd,native).")
@click.option("--inplace", type=click.Choice(["no", "yes", "both"]), default="both",
              help="Out-of-place, in-place, or both (where the collective has in-place).")
@click.option("--backend", default=None, help="tbcoll backend (default: as launched).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the rows as JSON (min and max included).")
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the rows as CSV.")
def main(collective: str, minbytes: str, maxbytes: str, stepfactor: float, iters: int,
         repeats: int, warmup: int, dtype: str, op: str, algorithm: str, inplace: str,
         backend: str | None,
         json_path: Path | None, csv_path: Path | None) -> None:
    """Time COLLECTIVE over a sweep of sizes and check every result (nccl-tests style)."""
    desc = DESCRIPTORS[collective]
    steps = sizes(parse_size(minbytes), parse_size(maxbytes), stepfactor)
    with tbcoll.init(backend) as comm:
        if steps[-1] != parse_size(maxbytes) and comm.rank == 0:
            print(f"tbcoll-bench: -e {maxbytes} is not on the ladder -b {minbytes} x "
                  f"{stepfactor:g}^k; the sweep stops at {steps[-1]} bytes", file=sys.stderr)
        if comm.size < desc.min_ranks:
            raise click.UsageError(f"{collective} needs at least {desc.min_ranks} ranks")
        known = ["default", *comm.algorithms(collective)] if desc.chooses else ["default"]
        algorithms = known if algorithm == "all" else algorithm.split(",")
        for name in algorithms:
            if name not in known:
                raise click.BadParameter(f"{name!r} is not one of {', '.join(known)} "
                                         f"(on the {comm.backend} backend)", param_hint="-a")
        modes = {"no": [False], "yes": [True], "both": [False, True]}[inplace]
        total = len(steps) * len(algorithms) * len(runs_in_place(desc, modes))
        rows = sweep(comm, desc, steps, DTYPES[dtype], op, algorithms, modes, iters, warmup,
                     f"tbcoll {comm.backend}", progress=_progress(comm.rank, total, collective),
                     repeats=repeats)
        if comm.rank == 0:
            click.echo(report.table(rows))
            if json_path:
                json_path.write_text(report.to_json(rows))
            if csv_path:
                csv_path.write_text(report.to_csv(rows))
        if any(r.wrong for r in rows):
            sys.exit(1)
