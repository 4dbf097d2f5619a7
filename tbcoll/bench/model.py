"""The alpha-beta model: a message costs alpha (latency) plus bytes times beta (inverse
bandwidth), and an algorithm is a number of steps and a number of bytes per rank.

    all_reduce  ring:  2(p-1) steps, 2(p-1)/p * n bytes
                mesh:  2 steps,      2(p-1)/p * n bytes (spread over p-1 links at once)
                rd:    ceil(log2 p) steps (+2 to fold when p is no power of two), n per step
    all_gather / reduce_scatter: half of all_reduce's ring and mesh, rd as all_reduce

Fit: the medians of a sweep (one algorithm, one p) give t = a + b*n by least squares on
relative errors; alpha = a / steps and beta = b / (bytes per byte of n). Predict: the time of
a collective for another size, rank count or link, e.g. Thunderbolt 5 RDMA figures:

    python -m tbcoll.bench.model --alpha-us 3 --gbps 8 -np 4 --predict 16K
    python -m tbcoll.bench.model --fit rows.json                  # from tbcoll-bench --json
    python -m tbcoll.bench.model --fit rows.json -np 8 --predict 1M   # fitted, elsewhere
    python -m tbcoll.bench.model plan --help     # decoding tokens/s, TP against PP
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tbcoll.algorithms import FAMILIES

ALGORITHMS = tuple(FAMILIES)  # the families of tbcoll.algorithms this model prices


def cost(collective: str, algorithm: str, p: int) -> tuple[float, float]:
    """(steps, bytes sent per rank per byte of the message) of an algorithm on p ranks."""
    if p <= 1:
        return 0.0, 0.0
    if algorithm == "rd":
        steps = math.ceil(math.log2(p)) + (0 if p & (p - 1) == 0 else 2)
        return float(steps), float(steps)
    half = 1 if collective in ("all_gather", "reduce_scatter") else 2
    if algorithm == "ring":
        return float(half * (p - 1)), half * (p - 1) / p
    if algorithm == "mesh":
        return float(half), half * (p - 1) / p
    raise ValueError(f"no model for algorithm {algorithm!r}; use one of {', '.join(ALGORITHMS)}")


@dataclass(frozen=True)
class Fit:
    alpha: float  # seconds per step
    beta: float  # seconds per byte
    max_error: float  # largest relative error of the fit over the sweep
    points: int

    def describe(self) -> str:
        gbps = 1 / self.beta / 1e9 if self.beta > 0 else math.inf
        return (f"alpha {self.alpha * 1e6:.2f} us, beta {self.beta * 1e9:.4f} ns/B "
                f"({gbps:.2f} GB/s), worst relative error {self.max_error:.0%} over "
                f"{self.points} sizes")


def fit(collective: str, algorithm: str, p: int, sizes: Sequence[float],
        seconds: Sequence[float]) -> Fit:
    n, t = np.asarray(sizes, float), np.asarray(seconds, float)
    if len(n) < 2:
        raise ValueError("a fit needs at least two sizes")
    # minimise sum(((a + b n - t) / t)^2): a linear least-squares problem in (a, b)
    design = np.stack([1 / t, n / t], axis=1)
    (a, b), *_ = np.linalg.lstsq(design, np.ones_like(t), rcond=None)
    steps, per_byte = cost(collective, algorithm, p)
    errors = np.abs((a + b * n - t) / t)
    return Fit(a / steps, b / per_byte, float(errors.max()), len(n))


def predict(collective: str, algorithm: str, p: int, nbytes: float, alpha: float,
            beta: float) -> float:
    steps, per_byte = cost(collective, algorithm, p)
    return steps * alpha + per_byte * nbytes * beta


def fits_from_rows(rows: Sequence[dict]) -> dict[tuple[str, str, int], Fit]:
    """Fit every (collective, algorithm, ranks) of tbcoll-bench's JSON rows (out-of-place)."""
    groups: dict[tuple[str, str, int], list[tuple[int, float]]] = {}
    for row in rows:
        if row["algorithm"] in ALGORITHMS and not row["inplace"]:
            key = (row["collective"], row["algorithm"], row["ranks"])
            groups.setdefault(key, []).append((row["size"], row["time_us"] * 1e-6))
    return {key: fit(*key, *zip(*points, strict=True)) for key, points in groups.items()
            if len(points) >= 2}


def main(argv: Sequence[str] | None = None) -> None:
    import sys

    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["plan"]:
        from tbcoll.bench.planner import main as plan

        plan(argv[1:])
        return
    import click

    from tbcoll.bench.cli import parse_size  # the sizes tbcoll-bench takes: 8, 16K, 4M
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fit", metavar="JSON", help="fit the rows of a tbcoll-bench --json")
    parser.add_argument("--alpha-us", type=float, help="latency per step, microseconds")
    parser.add_argument("--gbps", type=float, help="link bandwidth, GB/s (beta = 1/that)")
    parser.add_argument("-np", type=int, default=4, help="ranks to predict for")
    parser.add_argument("--predict", metavar="SIZE", help="message size to predict (8, 16K, 4M)")
    parser.add_argument("--collective", default="all_reduce")
    args = parser.parse_args(argv)
    try:
        nbytes = parse_size(args.predict) if args.predict else None
    except click.BadParameter as e:  # e.g. "lots" is not a size like 8, 64K, 16M or 1G
        parser.error(f"--predict: {e}")

    def show(collective: str, algorithm: str, alpha: float, beta: float) -> None:
        t = predict(collective, algorithm, args.np, nbytes, alpha, beta)
        print(f"  predicted {collective} {algorithm} np={args.np} {nbytes} B: {t * 1e6:.2f} us "
              f"(algbw {nbytes / t / 1e9 if t else math.inf:.2f} GB/s)")

    if args.fit:
        with open(args.fit) as f:
            for (collective, algorithm, p), result in fits_from_rows(json.load(f)).items():
                print(f"{collective} {algorithm} np={p}: {result.describe()}")
                if nbytes is not None:
                    show(collective, algorithm, result.alpha, result.beta)
        return
    if args.alpha_us is None or args.gbps is None or nbytes is None:
        parser.error("give --fit JSON, or --alpha-us, --gbps and --predict SIZE")
    for algorithm in ALGORITHMS:
        show(args.collective, algorithm, args.alpha_us * 1e-6, 1 / (args.gbps * 1e9))


if __name__ == "__main__":
    main()
