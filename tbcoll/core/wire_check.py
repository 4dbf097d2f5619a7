"""The wire that C and Python share, read by Python from C's own description, and what
tbcoll's C extensions were built with, checked against it as each is imported.

tbcoll/include/wire.h describes what C and Python must agree on byte for byte: the element
types' and reductions' codes (Python holds their numpy types, tbcoll.core.dtypes, in that order),
the call signature's fields (tbcoll.core.calls.FIELDS, checked against WIRE_CALL), and the
stream engine's message header, pulled-message descriptor and contexts. The framing
is written there once: Python does not keep its own copy but reads wire.h's X-macro lists
here (WIRE_HEADER, WIRE_DESCRIPTOR, WIRE_CONTEXTS, PULL_IDS; read_wire), whether or not a
compiler built the extensions, and tbcoll.core.framing packs with struct what
they say. Each extension exports the description it was compiled with as WIRE, and _atomics
the shm layout's and lane's constants besides (tbcoll/transports/shm/shm.h). An extension built from
another version of those headers than the installed wire.h would read other bytes or codes
than Python writes, without a word, so it fails to import instead, naming what differs.
"""

from __future__ import annotations

import re
from functools import cache
from operator import add, or_
from pathlib import Path
from types import ModuleType

from tbcoll.core.calls import FIELDS
from tbcoll.core.dtypes import DTYPES, OPS

INCLUDE = Path(__file__).resolve().parents[1] / "include"  # the installed C contract
_DEFINE = re.compile(r"^#define\s+(\w+)(\(X\))?[ \t]+((?:.*\\\n)*.*)$", re.MULTILINE)
_ITEM = re.compile(r"X\(([^()]*(?:\([^()]*\)[^()]*)*)\)")
_COMMENT = re.compile(r"/\*.*?\*/", re.DOTALL)
_UNSIGNED = re.compile(r"\b(0[xX][0-9a-fA-F]+|\d+)[uU]\b")


def _value(expression: str, defines: dict[str, str]) -> int:
    """An integer constant of wire.h: a literal, a name it defines, or two of them joined by |
    or + (in parentheses or not). (No ast: this runs at every rank's import.)"""
    text = _UNSIGNED.sub(r"\1", expression).strip()
    while text.startswith("(") and text.endswith(")"):
        text = text[1:-1].strip()
    for sign, join in (("|", or_), ("+", add)):
        left, found, right = text.rpartition(sign)
        if found:
            return join(_value(left, defines), _value(right, defines))
    if text in defines:
        return _value(defines[text], defines)
    try:
        return int(text, 0)
    except ValueError:
        raise WireMismatch(f"tbcoll/include/wire.h: cannot read {expression!r} as a constant "
                           "(literals, its names, | and +)") from None


@cache
def read_wire() -> dict[str, object]:
    """wire.h's framing: header and descriptor as ((name, offset, bytes), ...), contexts as
    {name: value}, pull_ids, read from the installed header (its X-macro lists)."""
    text = _COMMENT.sub(" ", (INCLUDE / "wire.h").read_text())
    lists = {name: body.replace("\\\n", " ") for name, x, body in _DEFINE.findall(text) if x}
    defines = {name: body for name, x, body in _DEFINE.findall(text) if not x}

    def items(macro: str) -> list[list[str]]:
        return [[arg.strip() for arg in item.split(",")] for item in _ITEM.findall(lists[macro])]

    def fields(macro: str) -> tuple[tuple[str, int, int], ...]:
        return tuple((name.strip('"'), int(at), int(width)) for _, name, at, width in items(macro))

    return {
        "header": fields("WIRE_HEADER"),
        "descriptor": fields("WIRE_DESCRIPTOR"),
        "contexts": {name.strip('"'): _value(value, defines)
                     for name, value in items("WIRE_CONTEXTS")},
        "pull_ids": _value(defines["PULL_IDS"], defines),
    }


class WireMismatch(ImportError):
    """A C extension was built with another wire, or other constants, than this Python's."""


def python_wire() -> dict[str, object]:
    """The wire as this Python writes and reads it, in the shape of an extension's WIRE."""
    return {
        "dtypes": tuple((name, dtype.itemsize) for name, dtype in DTYPES.items()),
        "ops": tuple(OPS),
        **read_wire(),
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
                      "tbcoll.core.dtypes, tbcoll.core.calls and the installed "
                      "tbcoll/include/wire.h")


def check_constants(module: ModuleType, ours: dict[str, object], owner: str) -> None:
    """Raise WireMismatch, naming each that differs, unless module's constants are ours
    (owner: the Python that holds them)."""
    _raise_if_differs(module, {name: (getattr(module, name, None), value)
                               for name, value in ours.items()}, owner)
