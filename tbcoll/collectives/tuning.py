"""Which algorithm a collective uses when the caller does not say: its descriptor's default
rules (tbcoll.collectives), and a table per transport where it differs.

Each rule list is read top to bottom; a rule (max_bytes, max_ranks, algorithm) applies when
the message is at most max_bytes and the communicator has at most max_ranks ranks (None: no
limit). The size is the largest buffer of the call (the output of all_gather, the input of
reduce_scatter). algorithm= and TBCOLL_ALGO override the table.

Where the numbers come from (benchmarks/RESULTS.md, np 2 and 4 on one 2-core host):
- tcp all_reduce: rd is fastest up to 256 KiB at np=4 (64 KiB: rd 415 us, mesh 825, ring
  968) and ties mesh at np=2; above that mesh wins (16 MiB, np=4: mesh 33 ms, ring 41, rd
  56). Past 4 ranks ring is chosen by the usual alpha-beta reasoning, not yet by a
  measurement: mesh keeps every link busy at once, which only a full mesh of cables serves.
- tcp's native all_reduce (tbcoll.transports.tcp_native: one exchange in C with every peer,
  reduced in C) before them: at np=2 1.1-1.8x faster than rd and mesh from 16 KiB to 4 MiB,
  and since its large messages go in halves (TcpNative._halves) 1.3-1.4x mesh at 16 MiB out of
  place; at np 3 and 4 (2 cores) as fast as rd or faster up to 256 KiB (8 B: 1.1-2.2x, 4 KiB:
  2.5-2.8x). The "stream" table is tcp's without it, for the groups over a
  stream transport that have no such native.
- The other tcp collectives follow all_reduce's thresholds (not measured separately yet):
  the descriptors' defaults (STREAM), as all_to_all's and the rooted ones' (not measured yet).
- mlx over jaccl (RDMA): MLX's own collectives (native). Over MLX's ring backend (TCP) the
  stream table: there tbcoll's rd beat MLX's all_sum 3.6x at 8 B and 1.9x at 256 KiB (np=2,
  RESULTS.md). A sub-group from split has tcp's native and table.
- rdma (measured in the Soft-RoCE VM, benchmarks/RESULTS.md): the C mesh (native) for blocks
  up to its 64 KiB piece, where one message per peer beats any algorithm's rounds; past it
  tcp's table over the rdma stream (rd, then mesh up to 4 ranks, then ring). Barrier:
  the mesh. Sub-groups from split have no natives and follow the stream table.
- mpi: MPICH's own collectives (native) were within 1.0-1.2x of raw mpi4py at every size,
  and faster than tbcoll's algorithms over MPI point-to-point everywhere but 16 MiB at np=2.
"""

from __future__ import annotations

Rule = tuple[int | None, int | None, str]

# each collective's default rules, its descriptor's (tbcoll.collectives: filled as they are
# registered); a transport's table below names only where it differs
DEFAULTS: dict[str, list[Rule]] = {}

STREAM: list[Rule] = [(256 << 10, None, "rd"), (None, 4, "mesh"), (None, None, "ring")]
_NATIVE: list[Rule] = [(None, None, "native")]
_DATA = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "barrier")

# a table per transport group's `tuning` (tbcoll.core.protocols.Group); a transport without
# one ("stream", a registered transport's) follows the descriptors' defaults throughout
TABLES: dict[str, dict[str, list[Rule]]] = {
    "tcp": {"all_reduce": [(None, 2, "native"), (256 << 10, 4, "native"), *STREAM]},
    "stream": {},
    "shm": dict.fromkeys(_DATA, _NATIVE),
    # two levels (tbcoll.hierarchy): the host's shm and the network's step, for the data
    # collectives; the rooted ones and all_to_all run the algorithms over its point-to-point
    "hosts": dict.fromkeys(_DATA, _NATIVE),
    "mlx": dict.fromkeys(_DATA, _NATIVE),
    "mpi": dict.fromkeys((*_DATA, "all_to_all", "gather", "scatter", "reduce"), _NATIVE),
    "rdma": {"all_reduce": [(64 << 10, None, "native"), *STREAM],
             "all_gather": [(64 << 10, None, "native"), *STREAM],
             "barrier": _NATIVE},
}


def rules(backend: str, collective: str) -> list[Rule]:
    """The transport's rules for collective where its table has them, else the default."""
    table = TABLES.get(backend)
    found = None if table is None else table.get(collective)
    return DEFAULTS[collective] if found is None else found


def choose(backend: str, collective: str, nbytes: int, size: int) -> str:
    for max_bytes, max_ranks, algorithm in rules(backend, collective):
        if (max_bytes is None or nbytes <= max_bytes) and (max_ranks is None or size <= max_ranks):
            return algorithm
    raise AssertionError(f"the {backend} rules for {collective} have no catch-all rule")


def fixed(backend: str, collective: str, size: int) -> str | None:
    """The algorithm for every message size at this many ranks, or None where the size
    decides (then `choose` runs at each call)."""
    for max_bytes, max_ranks, algorithm in rules(backend, collective):
        if max_ranks is None or size <= max_ranks:
            return algorithm if max_bytes is None else None
    return None


def native_up_to(backend: str, collective: str, size: int) -> tuple[bool, int | None]:
    """Whether the table takes native for the smallest messages at this many ranks, and up
    to which size (None: every size)."""
    for max_bytes, max_ranks, algorithm in rules(backend, collective):
        if max_ranks is None or size <= max_ranks:
            return algorithm == "native", max_bytes
    return False, None


def describe(backend: str, collective: str) -> str:
    """The rules as a phrase, e.g. 'rd up to 256 KiB, then mesh up to 4 ranks, then ring'."""
    parts = []
    for max_bytes, max_ranks, algorithm in rules(backend, collective):
        limits = [f"up to {_size(max_bytes)}" if max_bytes is not None else "",
                  f"up to {max_ranks} ranks" if max_ranks is not None else ""]
        parts.append(" ".join([algorithm, *filter(None, limits)]))
    return ", then ".join(parts)


def _size(nbytes: int) -> str:
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"
