"""The alpha-beta model: a message costs alpha (latency) plus bytes times beta (inverse
bandwidth), and an algorithm is a number of steps and a number of bytes per rank.

    all_reduce  ring:  2(p-1) steps, 2(p-1)/p * n bytes
                mesh:  2 steps,      2(p-1)/p * n bytes (spread over p-1 links at once)
                rd:    ceil(log2 p) steps (+2 to fold when p is no power of two), n per step
    all_gather / reduce_scatter: half of all_reduce's ring and mesh, rd as all_reduce

Fit: the medians of a sweep (one algorithm, one p) give t = a + b*n by least squares on
relative errors; alpha = a / steps and beta = b / (bytes per byte of n). Predict: the time of
a collective for another size, rank count or link, e.g. Thunderbolt 5 RDMA figures:

    python -m tbcoll.bench.model predict --alpha-us 3 --gbps 8 -np 4 16K
    python -m tbcoll.bench.model fit rows.json                  # from tbcoll-bench --json
    python -m tbcoll.bench.model plan --help     # decoding tokens/s, TP against PP
(tbcoll.bench.model_cli: the command line)
"""

from __future__ import annotations

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



if __name__ == "__main__":  # the command line is tbcoll.bench.model_cli's
    from tbcoll.bench.model_cli import main

    main()
