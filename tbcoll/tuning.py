"""Which algorithm a collective uses when the caller does not say: a table per transport.

Each rule list is read top to bottom: (largest message in bytes, or None for any, algorithm).
The size is the largest buffer of the call (the output of all_gather, the input of
reduce_scatter). The thresholds come from benchmarks/RESULTS.md, measured on this project's
machines; TBCOLL_ALGO or algorithm= override them.
"""

from __future__ import annotations

Rules = list[tuple[int | None, str]]

TABLES: dict[str, dict[str, Rules]] = {
    "tcp": {
        "all_reduce": [(16 << 10, "rd"), (None, "ring")],
        "all_gather": [(16 << 10, "rd"), (None, "ring")],
        "reduce_scatter": [(16 << 10, "rd"), (None, "ring")],
        "broadcast": [(64 << 10, "rd"), (None, "ring")],
        "barrier": [(None, "rd")],
    },
    "mpi": {
        "all_reduce": [(None, "native")],
        "all_gather": [(None, "native")],
        "reduce_scatter": [(None, "native")],
        "broadcast": [(None, "native")],
        "barrier": [(None, "native")],
    },
}


def choose(backend: str, collective: str, nbytes: int) -> str:
    for limit, algorithm in TABLES[backend][collective]:
        if limit is None or nbytes <= limit:
            return algorithm
    raise AssertionError(f"the {backend} table for {collective} has no catch-all rule")


def describe(backend: str, collective: str) -> str:
    """The rules as a phrase, e.g. 'rd up to 16 KiB, then ring'."""
    parts = []
    for limit, algorithm in TABLES[backend][collective]:
        parts.append(algorithm if limit is None else f"{algorithm} up to {_size(limit)}")
    return ", then ".join(parts)


def _size(nbytes: int) -> str:
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"
