"""The stream engine's wire: what a message's bytes are, read from C's description.

A message is a 32-byte header (context u32, tag u32, nbytes u64, seq u64, call u64) and its
payload; a pulled message's announcement carries a descriptor instead (address, nbytes, pull
id). The layout is written once, in tbcoll/include/wire.h's X-macro lists, which C compiles
(tcp's exchange.c, shm's rings and moves) and Python reads (tbcoll.core.wire_check.read_wire, with
or without a compiler): this module packs with struct what they say, and nothing here
restates an offset, a width or a context's value. The framing around them (a header, then
its payload, matched to a receive) is the stream engine's (tbcoll/transports/stream/
engine.py); C's own moves frame the same way and hand the engine whatever they do not finish.
"""

from __future__ import annotations

import struct

import numpy as np

from tbcoll.core.wire_check import WireMismatch, read_wire

_WIRE = read_wire()
_CODES = {4: "I", 8: "Q"}  # big-endian unsigned fields of these widths


def _fields(part: str) -> tuple[tuple[str, str], ...]:
    """wire.h's fields of part as (name, struct code), refused unless they abut in order."""
    fields, at = [], 0
    for name, offset, width in _WIRE[part]:
        if offset != at or width not in _CODES:
            raise WireMismatch(f"tbcoll/include/wire.h: the {part}'s field {name} at {offset} "
                               f"of {width} bytes; expected one of {sorted(_CODES)} bytes at {at}")
        fields.append((name, _CODES[width]))
        at += width
    return tuple(fields)


HEADER_FIELDS = _fields("header")
DESCRIPTOR_FIELDS = _fields("descriptor")  # a pulled message's
HEADER = struct.Struct("!" + "".join(code for _, code in HEADER_FIELDS))
DESCRIPTOR = struct.Struct("!" + "".join(code for _, code in DESCRIPTOR_FIELDS))
# Contexts with the top bit set carry the engine's own messages (communicators count from 0):
CONTEXTS: dict[str, int] = _WIRE["contexts"]
ANNOUNCE = CONTEXTS["announce"]  # | the message's context; payload: its DESCRIPTOR
PULLED = CONTEXTS["pulled"]  # tag: the pull id; seq: 0 pulled, 1 refused (send it)
RESENT = CONTEXTS["resent"]  # tag: the pull id; payload: the message whose pull was refused
REVOKED = CONTEXTS["revoked"]  # tag: a communicator's first context; payload: the notice
NOTICE_BYTES = 1024  # a notice longer than this is cut
PULL_IDS: int = _WIRE["pull_ids"]  # pull ids count modulo 2**32 (an answer's tag holds one)


def bytes_of(buf: np.ndarray) -> memoryview:
    """buf's bytes as a flat memoryview (works for dtypes with no buffer format, e.g. bfloat16)."""
    # flat first: a 2-D view counts rows, not bytes, and a 0-d array has no view of bytes
    return memoryview(buf.reshape(-1).view(np.uint8))
