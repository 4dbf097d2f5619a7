"""What tbcoll's C extensions were built with, checked against Python's as each is imported.

tbcoll/include/wire.h describes what C and Python must agree on byte for byte: the element
types' and reductions' codes (Python holds their numpy types, tbcoll.dtypes, in that order),
the call signature's fields (tbcoll.calls.FIELDS), and the stream engine's message header,
pulled-message descriptor and contexts (Python packs them with struct,
tbcoll.transports.stream.framing). Each extension exports that description as
WIRE, and _atomics the shm layout's and lane's constants besides (tbcoll/shm/shm.h). An
extension built from other versions of those headers would read other bytes or codes than
Python writes, without a word, so it fails to import instead, naming what differs.
"""

from __future__ import annotations

import struct
from types import ModuleType

from tbcoll.calls import FIELDS
from tbcoll.dtypes import DTYPES, OPS
from tbcoll.transports.stream import framing


class WireMismatch(ImportError):
    """A C extension was built with another wire, or other constants, than this Python's."""


def _layout(fields: tuple[tuple[str, str], ...]) -> tuple[tuple[str, int, int], ...]:
    """(name, offset, bytes) of each big-endian struct field, as wire.h lists them."""
    codes = "".join(code for _, code in fields)
    return tuple((name, struct.calcsize("!" + codes[:k]), struct.calcsize("!" + code))
                 for k, (name, code) in enumerate(fields))


def python_wire() -> dict[str, object]:
    """The wire as this Python writes and reads it, in the shape of an extension's WIRE."""
    return {
        "dtypes": tuple((name, dtype.itemsize) for name, dtype in DTYPES.items()),
        "ops": tuple(OPS),
        "header": _layout(framing.HEADER_FIELDS),
        "descriptor": _layout(framing.DESCRIPTOR_FIELDS),
        "contexts": framing.CONTEXTS,
        "pull_ids": framing.PULL_IDS,
        "call": tuple((name, low, bits) for name, (low, bits) in FIELDS.items()),
        "byte_order": "big",
    }


def _raise_if_differs(module: ModuleType, pairs: dict[str, tuple[object, object]],
                      owner: str) -> None:
    differs = [f"{name}: C {theirs!r}, Python {ours!r}"
               for name, (theirs, ours) in pairs.items() if theirs != ours]
    if differs:
        raise WireMismatch(f"{module.__name__} was built from other versions of tbcoll's C "
                           f"headers than {owner}: {'; '.join(differs)}. Reinstall tbcoll "
                           "(pip install -e . in its checkout)")


def check_wire(module: ModuleType) -> None:
    """Raise WireMismatch, naming each part that differs, unless the extension `module` was
    built with this Python's wire."""
    theirs = getattr(module, "WIRE", None)
    theirs = theirs if isinstance(theirs, dict) else {}
    _raise_if_differs(module, {part: (theirs.get(part), ours)
                               for part, ours in python_wire().items()},
                      "tbcoll.dtypes, tbcoll.calls and tbcoll.transports.stream.framing "
                      "(tbcoll/include/wire.h)")


def check_constants(module: ModuleType, ours: dict[str, object], owner: str) -> None:
    """Raise WireMismatch, naming each that differs, unless module's constants are ours
    (owner: the Python that holds them)."""
    _raise_if_differs(module, {name: (getattr(module, name, None), value)
                               for name, value in ours.items()}, owner)
