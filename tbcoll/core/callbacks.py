"""Every call from tbcoll's C into Python, declared on Python's side and checked twice: at import,
against the table each extension was built with, and at set-up, against the callables given.

C calls these callables by position (tbcoll/include/callbacks.h: name, format, argument names),
so two arguments of one type swapped on either side would go through silently. Instead an
extension built from another table fails to import (check_callbacks, as wire_check does for the
wire), and a callable whose parameters are named otherwise than the table says, or in another
order, is refused where it is handed to C (checked), once: the calls themselves cost nothing
more.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from types import ModuleType
from typing import Any

from tbcoll.core.wire_check import WireMismatch

# what each format letter of Py_BuildValue hands the callable
FORMAT_TYPES: dict[str, type] = {"i": int, "l": int, "n": int, "k": int, "K": int,
                                 "y#": bytes, "y": bytes, "O": object}

# name -> (format, argument names): tbcoll/include/callbacks.h's entries, Python's side
CALLBACKS: dict[str, tuple[str, tuple[str, ...]]] = {
    # the whole call around a lane (tbcoll/core/one_call.c, in tbcoll.core._gate)
    "named": ("OO", ("error", "what")),
    "empty": ("OO", ("shape", "dtype")),
    "take": ("O", ("blocking",)),
    # shm's lane and its stream engine (tbcoll/transports/shm/native.py,
    # tbcoll/transports/shm/transport.py)
    "broadcast_call": ("ii", ("dtype", "root")),
    "resume": ("iKK", ("stage", "seq", "signature")),
    "look": ("n", ("dest",)),
    "engine_send": ("OOO", ("buf", "peer", "tag")),
    "engine_recv": ("OOO", ("buf", "peer", "tag")),
    "finish_pulled_send": ("OOK", ("buf", "dest", "pull")),
    "shm_finish_send": ("OOyn", ("buf", "dest", "header", "written")),
    "shm_finish_recv": ("OOyn", ("buf", "source", "header", "copied")),
    "finish_announcement": ("OOyy", ("buf", "source", "header", "descriptor")),
    # tcp's lane (tbcoll/transports/tcp/native.py, tcp.py)
    "tcp_finish": ("OOOOOii", ("x", "out", "blocks", "header", "stopped", "dtype_code",
                               "op_code")),
    "tcp_finish_send": ("Oiy#ni", ("buf", "dest", "header", "written", "error")),
    "tcp_finish_recv": ("Oiy#nni", ("buf", "source", "header", "copied", "staged", "error")),
    "tcp_keep": ("Oiy#", ("buf", "dest", "header")),
    # rdma's mesh lane (tbcoll/transports/rdma/transport.py)
    "mesh_held": ("iOOiiKl", ("kind", "src", "dst", "dtype", "op", "call", "result")),
}


def argument_types(format: str) -> tuple[type, ...]:
    """The Python type of each argument a format passes, in order (ValueError where a letter
    is not one the table uses)."""
    letters = re.findall(r"y#|.", format)
    unknown = [letter for letter in letters if letter not in FORMAT_TYPES]
    if unknown:
        raise ValueError(f"format {format!r} has letters the table does not use: {unknown}")
    return tuple(FORMAT_TYPES[letter] for letter in letters)


def _declared(name: str, format: str, names: tuple[str, ...]) -> list[str]:
    """What is wrong with one entry of Python's declaration by itself (its format's argument
    count against its names')."""
    try:
        count = len(argument_types(format))
    except ValueError as e:
        return [f"{name}: {e}"]
    if count != len(names):
        return [f"{name}: format {format!r} passes {count} arguments, names {names} "
                f"{len(names)}"]
    return []


# which entries each part's C calls through (an extension exports its parts' tables)
PARTS: dict[str, tuple[str, ...]] = {
    "one_call": ("named", "empty", "take"),
    "shm": ("broadcast_call", "resume", "look", "engine_send", "engine_recv",
            "finish_pulled_send", "shm_finish_send", "shm_finish_recv", "finish_announcement"),
    "tcp": ("tcp_finish", "tcp_finish_send", "tcp_finish_recv", "tcp_keep"),
    "rdma": ("mesh_held",),
}


def _differences(theirs: object, ours: dict[str, tuple[str, tuple[str, ...]]]) -> list[str]:
    """Each entry of the C table (theirs: ((name, format, "names"), ...)) that differs from ours,
    or is on one side only, in words naming both sides."""
    try:
        c_side = {name: (format, tuple(names.split())) for name, format, names in theirs}
    except (TypeError, ValueError, AttributeError):
        return [f"no CALLBACKS table of (name, format, names) (C {theirs!r})"]
    differs = []
    for name in sorted(c_side.keys() | ours.keys()):
        c_entry, python_entry = c_side.get(name, "none"), ours.get(name, "none")
        if c_entry != python_entry:
            differs.append(f"{name}: C {c_entry}, Python {python_entry}")
        elif name in ours:
            differs += _declared(name, *ours[name])
    return differs


def check_callbacks(module: ModuleType, parts: tuple[str, ...],
                    declared: dict[str, tuple[str, tuple[str, ...]]] | None = None) -> None:
    """Raise WireMismatch, naming each entry that differs on both sides, unless every call the
    extension `module` makes into Python (its parts') is declared here (declared: CALLBACKS)
    alike: the same names, formats and argument names, none on one side only."""
    declared = CALLBACKS if declared is None else declared
    ours = {name: declared[name] for part in parts for name in PARTS[part] if name in declared}
    differs = _differences(getattr(module, "CALLBACKS", None), ours)
    if differs:
        raise WireMismatch(f"{module.__name__} was built with other calls into Python than "
                           "tbcoll.core.callbacks declares (tbcoll/include/callbacks.h): "
                           f"{'; '.join(differs)}. Reinstall tbcoll (pip install -e . in its "
                           "checkout), or declare the call alike on both sides")


def _parameters(function: Callable[..., Any]) -> list[inspect.Parameter] | None:
    """The parameters function is called with by position (*args last, where it takes them),
    or None where Python cannot say (a builtin without a signature)."""
    try:
        parameters = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):
        return None
    return [p for p in parameters
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)]


def checked(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """function, which C calls as the table's entry `name`: a TypeError where its parameters
    are named otherwise or in another order (a swapped pair would take each other's values),
    or where it needs more arguments than C passes. Once, where it is handed to C."""
    _, names = CALLBACKS[name]
    parameters = _parameters(function)
    if parameters is None:
        return function
    given = tuple(p.name for p in parameters[:len(names)])  # (*args among them: unnamed)
    needs_more = any(p.default is p.empty and p.kind is not p.VAR_POSITIONAL
                     for p in parameters[len(names):])
    if given != names or needs_more:
        what = getattr(function, "__qualname__", repr(function))
        raise TypeError(f"{what} is called from C as {name}{names} (tbcoll/include/"
                        f"callbacks.h), but takes {tuple(p.name for p in parameters)}: name "
                        "its parameters as the table does, in its order (a wrapper taking "
                        "*args: functools.wraps the callable it calls)")
    return function
