"""The failed set: the ranks that tbrun, the job's one failure authority, has declared failed
under `tbrun --keep-going`, with an epoch that counts its declarations.

tbrun declares a rank failed once its process has ended badly (a non-zero status, a signal),
or once it has killed it for good (a rank frozen past --comm-timeout that a peer reported:
SUSPECT), and then publishes the whole set under FAILED and again under FAILED_AT of the new
epoch (so that a rank can wait for the next one). A failed rank never comes back. Every rank's
view of failures, comm.agree and comm.shrink read this set: no rank decides alone.
"""

from __future__ import annotations

from collections.abc import Iterable

FAILED = "tbrun/failed"  # the latest: "epoch\\nrank,rank,..." (world ranks, ascending)
FAILED_AT = "tbrun/failed/{}"  # each epoch's, formatted with the epoch (1, 2, ...)
# a rank that waited past --comm-timeout on peers asks tbrun to look at them: formatted with
# the asking rank; the value is those peers' world ranks, comma-separated, then (after a
# newline) why, where it is not a wait: NO_PATH
SUSPECT = "tbrun/suspect/{}"
# the why of a SUSPECT where every path to those peers failed though they may live (a split):
# tbrun's failure set decides which end is failed (launchers/verdict.py, docs/failures.md)
NO_PATH = "no path left"


def format_failed(epoch: int, ranks: Iterable[int]) -> bytes:
    return f"{epoch}\n{','.join(map(str, sorted(set(ranks))))}".encode()


def parse_failed(value: bytes | None) -> tuple[int, frozenset[int]]:
    """(epoch, failed world ranks) of a FAILED value; (0, {}) before the first declaration."""
    if not value:
        return 0, frozenset()
    epoch, _, ranks = value.decode().partition("\n")
    return int(epoch), frozenset(int(r) for r in ranks.split(",") if r)


def format_ranks(ranks: Iterable[int]) -> bytes:
    return ",".join(map(str, sorted(set(ranks)))).encode()


def format_suspect(ranks: Iterable[int], why: str = "") -> bytes:
    """A SUSPECT value: ranks, and why where it is not a wait past --comm-timeout."""
    return format_ranks(ranks) + (f"\n{why}".encode() if why else b"")


def parse_ranks(value: bytes) -> tuple[int, ...]:
    """The world ranks of a SUSPECT value (or of a list of ranks); what is no rank is left
    out."""
    text = value.decode(errors="replace").partition("\n")[0]
    return tuple(sorted({int(r) for r in text.split(",") if r.isascii() and r.isdigit()}))


def parse_suspect(value: bytes) -> tuple[tuple[int, ...], str]:
    """The world ranks of a SUSPECT value, and why ("" for a wait past --comm-timeout)."""
    return parse_ranks(value), value.decode(errors="replace").partition("\n")[2]
