"""How tbcoll imports its C extensions: each where it was built, none under TBCOLL_NO_C=1.

Without a compiler at install the extensions are missing and each protocol runs its whole
pure-Python path (the stream engine's moves for tcp, numpy's reductions, the Python call gate);
TBCOLL_NO_C=1 runs that same path where they are built (tests, and a user who suspects C), so
that it stays tested. All or none: a protocol never runs a C part beside a Python twin of
another. (Read here, below the launch contract's reader tbcoll.job.env, as the bottom layer
imports it: see that module's list of variables.)
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType


def c_extension(name: str) -> ModuleType | None:
    """tbcoll's C extension `name` (tbcoll.core._gate, tbcoll.transports.shm._atomics, ...),
    or None where it was not built or TBCOLL_NO_C=1 asks for what a build without a compiler
    runs."""
    if os.environ.get("TBCOLL_NO_C", "").strip() == "1":
        return None
    try:
        return importlib.import_module(name)
    except ImportError as e:
        if e.name != name:  # the extension is there, but something it imports is not
            raise
        return None
