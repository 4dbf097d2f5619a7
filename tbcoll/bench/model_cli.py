"""`python -m tbcoll.bench.model`: the alpha-beta model and the decoding planner from the
command line, one click group (as tbrun's):

    python -m tbcoll.bench.model fit rows.json                  # from tbcoll-bench --json
    python -m tbcoll.bench.model fit rows.json -np 8 --predict 1M   # fitted, elsewhere
    python -m tbcoll.bench.model predict --alpha-us 3 --gbps 8 -np 4 16K   # e.g. TB5 RDMA
    python -m tbcoll.bench.model plan --config config.json -N 4 --gbps-memory 819 --alpha-us 30
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import click

from tbcoll.bench.cli import parse_size  # the sizes tbcoll-bench takes: 8, 16K, 4M
from tbcoll.bench.model import ALGORITHMS, fits_from_rows, predict
from tbcoll.bench.planner import DTYPE_BYTES, SHAPE_FLAGS, TINYLLAMA, Link, Shape, plan

_SETTINGS = {"help_option_names": ["-h", "--help"], "show_default": True}


class _Size(click.ParamType):
    name = "size"

    def convert(self, value, param, ctx):  # noqa: ANN001, ANN201 (click's signature)
        return value if isinstance(value, int) else parse_size(value)


@click.group(context_settings=_SETTINGS)
def main() -> None:
    """The alpha-beta model of tbcoll's algorithms (tbcoll.bench.model) and the decoding
    planner (tbcoll.bench.planner)."""


def _show(collective: str, algorithm: str, ranks: int, nbytes: int, alpha: float,
          beta: float) -> None:
    t = predict(collective, algorithm, ranks, nbytes, alpha, beta)
    click.echo(f"  predicted {collective} {algorithm} np={ranks} {nbytes} B: {t * 1e6:.2f} us "
               f"(algbw {nbytes / t / 1e9 if t else math.inf:.2f} GB/s)")


@main.command()
@click.argument("rows", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("-np", "ranks", type=click.IntRange(1), default=4, help="Ranks to predict for.")
@click.option("--predict", "nbytes", type=_Size(), help="A message size to predict (8, 16K, 4M).")
def fit(rows: Path, ranks: int, nbytes: int | None) -> None:
    """Fit alpha and beta to the rows of a `tbcoll-bench --json`, per algorithm."""
    for (collective, algorithm, p), result in fits_from_rows(json.loads(rows.read_text())).items():
        click.echo(f"{collective} {algorithm} np={p}: {result.describe()}")
        if nbytes is not None:
            _show(collective, algorithm, ranks, nbytes, result.alpha, result.beta)


@main.command("predict")
@click.argument("nbytes", type=_Size())
@click.option("--alpha-us", type=click.FloatRange(0), required=True,
              help="Latency per step, microseconds.")
@click.option("--gbps", type=click.FloatRange(0, min_open=True), required=True,
              help="Link bandwidth, GB/s (beta = 1/that).")
@click.option("-np", "ranks", type=click.IntRange(1), default=4, help="Ranks.")
@click.option("--collective", type=click.Choice(["all_reduce", "all_gather", "reduce_scatter"]),
              default="all_reduce")
def predict_command(nbytes: int, alpha_us: float, gbps: float, ranks: int,
                    collective: str) -> None:
    """The time of each algorithm for a message of NBYTES over a given link."""
    for algorithm in ALGORITHMS:
        _show(collective, algorithm, ranks, nbytes, alpha_us * 1e-6, 1 / (gbps * 1e9))


def _shape_options(command):  # noqa: ANN001, ANN202 (a decorator)
    for flag, field in reversed(SHAPE_FLAGS.items()):
        command = click.option(flag, field, type=click.IntRange(1), help=f"The model's {field}.")(
            command)
    return command


def _config_fields(config: Path) -> dict:
    """A Hugging Face config.json's fields; a usage error naming the file where it cannot be
    read or is not a JSON object."""
    try:
        fields = json.loads(config.read_text())
    except OSError as e:
        raise click.UsageError(f"--config {config}: cannot read it ({e.strerror})") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise click.UsageError(f"--config {config}: not a JSON config ({e})") from None
    if not isinstance(fields, dict):
        raise click.UsageError(f"--config {config}: not a JSON config (an object is needed)")
    return fields


@main.command("plan")
@click.option("--config", type=click.Path(dir_okay=False, path_type=Path),
              help="A Hugging Face config.json (default: TinyLlama-1.1B's shape); the shape "
                   "flags override it.")
@_shape_options
@click.option("--dtype", type=click.Choice(list(DTYPE_BYTES)), default="bfloat16")
@click.option("-N", "--machines", default="1,2,4", metavar="N,N,...")
@click.option("--gbps-memory", type=click.FloatRange(0, min_open=True), required=True,
              help="Each machine's memory bandwidth, GB/s (M3 Ultra: 819).")
@click.option("--alpha-us", type=click.FloatRange(0), required=True,
              help="One-way latency of a message, us.")
@click.option("--gbps-link", type=click.FloatRange(0, min_open=True), default=10.0,
              help="Link bandwidth, GB/s.")
@click.option("--allreduce-us", type=click.FloatRange(0),
              help="Measured time of a small all-reduce, us (else from alpha).")
def plan_command(config: Path | None, dtype: str, machines: str, gbps_memory: float,
                 alpha_us: float, gbps_link: float, allreduce_us: float | None,
                 **shape_flags: int | None) -> None:
    """Decoding tokens/s split over N machines: tensor against pipeline parallel."""
    fields = _config_fields(config) if config else TINYLLAMA
    fields = {**fields, **{field: value for field, value in shape_flags.items()
                           if value is not None}}
    try:
        shape = Shape.from_config(fields, DTYPE_BYTES[dtype])
    except KeyError as e:
        raise click.UsageError(f"{config or 'the shape flags'}: {e} missing") from None
    except ValueError as e:
        raise click.UsageError(f"{config or 'the shape flags'}: {e}") from None
    try:
        counts = [int(n) for n in machines.split(",")]
    except ValueError:
        raise click.BadParameter(f"{machines!r}: give whole numbers, e.g. 1,2,4",
                                 param_hint="-N") from None
    if min(counts) < 1:
        raise click.BadParameter("machines must be positive", param_hint="-N")
    link = Link(alpha_us * 1e-6, 1 / (gbps_link * 1e9),
                None if allreduce_us is None else allreduce_us * 1e-6)
    click.echo(f"# {shape.layers} layers, hidden {shape.hidden}, {dtype}: "
               f"{shape.weight_bytes / 1e9:.2f} GB of weights; {gbps_memory:g} GB/s memory, "
               f"link alpha {alpha_us:g} us, {gbps_link:g} GB/s"
               + (f", all-reduce {allreduce_us:g} us" if allreduce_us else ""))
    click.echo("| machines | mode | tokens/s | speed-up | ms/token | comm share |")
    click.echo("|---:|---|---:|---:|---:|---:|")
    base = None
    for n in counts:
        for p in plan(shape, n, gbps_memory * 1e9, link):
            base = base or p.tokens_per_s
            click.echo(f"| {n} | {p.mode} | {p.tokens_per_s:.1f} | {p.tokens_per_s / base:.2f}x"
                       f" | {(p.compute + p.comm) * 1e3:.2f} | {p.comm_share:.0%} |")
