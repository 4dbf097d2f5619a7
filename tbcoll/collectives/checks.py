"""TBCOLL_CHECK=1: before each collective, the ranks compare what they were asked to do.

Every rank contributes a fixed-size descriptor (collective, algorithm, op, dtype, root,
shape) to a
recursive-doubling all-gather; if any two differ, every rank raises the same ValueError that
lists each rank's call. A mismatch that would otherwise hang, or silently reduce the wrong
bytes, becomes an error on every rank.
"""

from __future__ import annotations

import numpy as np

from tbcoll.algorithms import rd
from tbcoll.core.dtypes import DTYPE_CODES, OP_CODES
from tbcoll.core.names import COLLECTIVES, NAMES
from tbcoll.core.protocols import P2P

_COLLECTIVES = COLLECTIVES
_ALGORITHMS = NAMES
_MAX_DIMS = 6
_FIELDS = 6 + _MAX_DIMS  # collective, op, dtype, root, ndim, algorithm, dims...


def _describe(collective: str, array: np.ndarray | None, op: str | None, root: int,
              algorithm: str) -> np.ndarray:
    row = np.full(_FIELDS, -1, np.int64)
    row[0] = _COLLECTIVES.index(collective)
    row[5] = _ALGORITHMS.index(algorithm)
    row[1] = -1 if op is None else OP_CODES[op]
    row[3] = root
    if array is not None:
        row[2] = DTYPE_CODES[array.dtype]
        row[4] = array.ndim
        if array.ndim:  # a 0-d array (a numpy scalar) has no dims
            dims = array.shape[:_MAX_DIMS - 1] + (int(np.prod(array.shape[_MAX_DIMS - 1:])),)
            row[6:6 + len(dims)] = dims
    return row


def _render(row: np.ndarray) -> str:
    collective = _COLLECTIVES[row[0]]
    algorithm = f"algorithm={_ALGORITHMS[row[5]]}"
    if row[2] < 0:
        return f"{collective}({algorithm})"
    dtype = list(DTYPE_CODES)[row[2]]
    shape = ", ".join(str(d) for d in row[6:6 + min(row[4], _MAX_DIMS)])
    args = [f"{dtype}[{shape}]", algorithm]
    if row[1] >= 0:
        args.append(f"op={list(OP_CODES)[row[1]]}")
    if row[3] >= 0:
        args.append(f"root={row[3]}")
    return f"{collective}({', '.join(args)})"


def verify_calls_match(p2p: P2P, collective: str, array: np.ndarray | None, op: str | None,
                       root: int, algorithm: str) -> None:
    rows = np.empty((p2p.size, _FIELDS), np.int64)
    rows[p2p.rank] = _describe(collective, array, op, root, algorithm)
    rd.all_gather(p2p, rows.reshape(-1))
    if (rows == rows[0]).all():
        return
    calls = "; ".join(f"rank {r}: {_render(row)}" for r, row in enumerate(rows))
    raise ValueError(f"TBCOLL_CHECK: the ranks' calls do not match: {calls}")
